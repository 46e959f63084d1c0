//! Background prefetch: chunks held in DRAM that the policy expects soon
//! come back to HBM ahead of use, on u3m's stream, without evicting.

use std::sync::atomic::Ordering::Relaxed;

use super::state::{Host, MoveKind, State};
use super::Shard as Residency;
use crate::acl::MemcpyKind;
use crate::engine::runtime::CHUNK;

impl Residency {
    /// Background prefetch on `dev`: brings back to HBM chunks held in DRAM
    /// that the policy expects within `horizon` ticks, without evicting
    /// anything, while HBM use stays below `low` × capacity, and at most
    /// `budget` bytes per call (the link's share for one background round).
    /// The copies run on u3m's stream; a call needing a chunk whose copy is
    /// still in flight waits for it (`after_copy_ins`). Returns the chunks
    /// issued. The calling thread's device must be `dev`.
    pub fn prefetch(&self, dev: u32, budget: u64, low: f64, horizon: u64) -> u32 {
        let demand = self.demand.load(Relaxed);
        if self.demand_seen.swap(demand, Relaxed) != demand {
            return 0;
        }
        let Ok((free, total)) = self.rt.mem_info() else {
            return 0;
        };
        if total == 0 {
            return 0;
        }
        let limit = (low * total as f64) as u64;
        let mut used = total.saturating_sub(free);
        if used + CHUNK > limit {
            return 0;
        }
        let Ok(mut st) = self.st.lock() else { return 0 };
        let now = st.clock;
        let mut cands: Vec<(u64, u32, u64)> = Vec::new();
        for (&id, b) in st.backings.iter() {
            if b.dev != dev || b.pinned || b.vas.is_empty() {
                continue;
            }
            for (i, c) in b.chunks.iter().enumerate() {
                if c.phys == 0 && c.pins == 0 && matches!(c.host, Some(Host::Dram(_))) {
                    let key = b.key(id, i as u32);
                    if self.policy.predicts(now, key, horizon) {
                        cands.push((id, i as u32, key));
                    }
                }
            }
        }
        if cands.is_empty() {
            return 0;
        }
        cands.sort_unstable_by_key(|c| c.2);
        let Ok(stream) = self.dev_stream(&mut st, dev) else {
            return 0;
        };
        let mut filled: Vec<(u64, u32)> = Vec::new();
        let mut bytes = 0u64;
        for (id, i, _) in cands {
            if bytes + CHUNK > budget || used + CHUNK > limit {
                break;
            }
            // never evict for a prefetch: a refused allocation ends the round
            let Ok(phys) = self.rt.malloc_physical(dev, CHUNK) else {
                break;
            };
            if !self.dram_copy_in(&mut st, id, i, phys, stream, now) {
                break;
            }
            filled.push((id, i));
            bytes += CHUNK;
            used += CHUNK;
        }
        if !filled.is_empty() {
            match self.use_event(&mut st, stream) {
                Some(ev) => {
                    for &(id, i) in &filled {
                        st.set_use(id, i, stream, ev);
                    }
                    st.unref_event(ev);
                }
                // no event: order everything after the copies the hard way
                None => {
                    let _ = self.rt.sync_stream(stream);
                }
            }
            self.c.prefetches.fetch_add(filled.len() as u64, Relaxed);
            self.c.prefetch_bytes.fetch_add(bytes, Relaxed);
        }
        filled.len() as u32
    }

    /// Issues the copy-in of chunk (id, i) from its DRAM copy into the new
    /// physical chunk `phys` on u3m's `stream` (background and look-ahead
    /// prefetch): mapped at every VA of its backing, resident and clean (its
    /// DRAM copy stays, so evicting it again is free) from now. On failure
    /// `phys` is given back and nothing changed.
    pub(super) fn dram_copy_in(
        &self,
        st: &mut State,
        id: u64,
        i: u32,
        phys: u64,
        stream: u64,
        now: u64,
    ) -> bool {
        let vas = st.backings[&id].vas.clone();
        let src = match &st.chunk(id, i).host {
            Some(Host::Dram(slot)) => slot.ptr as u64,
            _ => 0,
        };
        let mut ok = src != 0 && self.map_chunk(&vas, i, phys).is_ok();
        let mapped = ok;
        if ok {
            ok = self
                .rt
                .memcpy_async(
                    vas[0] + i as u64 * CHUNK,
                    src,
                    CHUNK,
                    MemcpyKind::HOST_TO_DEVICE,
                    stream,
                )
                .is_ok();
        }
        if !ok {
            if mapped {
                for &va in &vas {
                    let _ = self.rt.unmap(va + i as u64 * CHUNK);
                }
            }
            let _ = self.rt.free_physical(phys);
            return false;
        }
        let dev = st.backings[&id].dev;
        st.dev_mut(dev).resident += CHUNK;
        let c = st.chunk_mut(id, i);
        c.phys = phys;
        c.dirty = false;
        c.last = now;
        c.prefetched = true;
        // resident without a call: the kept victim order re-keys it (evict.rs)
        let key = st.backings[&id].key(id, i);
        st.dev_mut(dev).order.note_touched(&[key]);
        st.note_move(id, i, MoveKind::In { demand: false });
        true
    }
}
