//! Making room in HBM: physical chunks for fault-ins (evicting on demand),
//! the background watermark round, and room for allocations u3m does not
//! manage. Victims come from `victims`, the policy's order over the
//! evictable resident chunks of a device — built by sorting every call
//! today; the one place a maintained order would replace.

use std::sync::atomic::Ordering::Relaxed;

use super::state::State;
use super::{Fail, Residency, E_ALLOC, KEEP_HORIZON};

/// Asynchronous copy-outs in flight per device before a fault-in waits for
/// the oldest: enough to keep the device-to-host link busy while copy-ins
/// run, few enough that HBM is not drained ahead of need (32 MiB).
pub(super) const COPY_OUT_DEPTH: usize = 16;
use crate::engine::runtime::CHUNK;
use crate::policy::Cand;

impl Residency {
    /// A physical chunk on `dev`, evicting others (never `protect`) when HBM
    /// is full.
    /// `ahead`: chunks the caller still needs after this one (copy-outs for
    /// them may start now, overlapping this chunk's copy-in).
    pub(super) fn alloc_phys(
        &self,
        st: &mut State,
        dev: u32,
        protect: &[(u64, u32)],
        ahead: usize,
    ) -> Result<u64, Fail> {
        let r = self.alloc_phys_evicting(st, dev, protect, ahead);
        if !matches!(r, Ok((_, 0))) {
            self.demand.fetch_add(1, Relaxed);
        }
        r.map(|(h, _)| h)
    }

    /// `alloc_phys` with the number of chunks it evicted (or started to).
    /// A landed copy-out frees its chunk (`harvest`, one per chunk wanted:
    /// the copy-in into that HBM is ordered after that copy-out only); while
    /// HBM is full, clean victims are freed at once and dirty ones start
    /// their copy-out, one per chunk the caller still needs (at most
    /// `COPY_OUT_DEPTH` in flight); then the caller waits for the oldest
    /// without the lock (Busy with `wait_for`) and tries again.
    fn alloc_phys_evicting(
        &self,
        st: &mut State,
        dev: u32,
        protect: &[(u64, u32)],
        ahead: usize,
    ) -> Result<(u64, u32), Fail> {
        let mut evicted = 0u32;
        let depth = (ahead + 1).min(COPY_OUT_DEPTH);
        loop {
            self.harvest(st, dev, 1);
            // ask only when HBM visibly has room (a refused request costs
            // the runtime a failed allocation and a log line)
            let room = self
                .rt
                .mem_info()
                .map(|(free, _)| free >= CHUNK)
                .unwrap_or(true);
            if room {
                match self.rt.malloc_physical(dev, CHUNK) {
                    Ok(h) => return Ok((h, evicted)),
                    Err(E_ALLOC) => {}
                    Err(e) => return Err(Fail::Acl(e)),
                }
            }
            if st.dev(dev).outgoing.len() < depth && self.evict_one(st, dev, protect)? {
                evicted += 1;
                continue;
            }
            match st.dev(dev).outgoing.front() {
                Some(o) => st.wait_for = Some(o.ev),
                None => return Err(Fail::Busy),
            }
            return Err(Fail::Busy);
        }
    }

    /// Evicts the first evictable chunk of `dev` in the policy's order.
    /// Ok(false): nothing can move. Busy: every candidate is still in use
    /// (`st.wait_for` names an event to wait for without the lock).
    pub(super) fn evict_one(
        &self,
        st: &mut State,
        dev: u32,
        protect: &[(u64, u32)],
    ) -> Result<bool, Fail> {
        let ordered = self.victims(st, dev, protect);
        if ordered.is_empty() {
            return Ok(false);
        }
        let cands: Vec<(u64, u64, u32)> = ordered
            .iter()
            .take(64)
            .filter_map(|c| st.resolve(c.key).map(|(id, i)| (c.last, id, i)))
            .collect();
        if cands.is_empty() {
            return Ok(false);
        }
        // prefer a chunk whose uses are complete; else wait for the oldest
        let mut pick = None;
        for &(_, id, i) in cands.iter() {
            if st
                .chunk(id, i)
                .uses
                .iter()
                .all(|&(_, ev)| self.rt.event_done(ev).unwrap_or(true))
            {
                pick = Some((id, i));
                break;
            }
        }
        let (id, i) = match pick {
            Some(p) => p,
            None => {
                // Every candidate is still in use. Never wait for the device
                // while holding the lock: a stream may be blocked on work the
                // host has yet to issue (an HCCL peer), and issuing it needs
                // this lock. The caller drops the lock and waits (Busy).
                let (_, id, i) = cands[0];
                let uses = &st.chunk(id, i).uses;
                st.wait_for = uses
                    .iter()
                    .find(|u| !self.rt.event_done(u.1).unwrap_or(true))
                    .or(uses.first())
                    .map(|u| u.1);
                return Err(Fail::Busy);
            }
        };
        self.evict(st, id, i)?;
        Ok(true)
    }

    /// Resident chunks of `dev` that may leave HBM (not pinned, not in a
    /// call, not in `protect`), in the policy's eviction order.
    fn victims(&self, st: &State, dev: u32, protect: &[(u64, u32)]) -> Vec<Cand> {
        let mut cands: Vec<Cand> = Vec::new();
        for (&id, b) in st.backings.iter() {
            if b.dev != dev || b.pinned {
                continue;
            }
            for (i, c) in b.chunks.iter().enumerate() {
                if c.in_hbm()
                    && c.pins == 0
                    && c.out_ev == 0
                    && !protect.contains(&(id, i as u32))
                {
                    cands.push(Cand {
                        key: b.key(id, i as u32),
                        last: c.last,
                        dirty: c.needs_copy_out(),
                    });
                }
            }
        }
        self.policy.order(st.clock, &mut cands);
        cands
    }

    /// Background watermark work for `dev`: when HBM use is above `high` ×
    /// capacity, evict in the policy's order until it is at or below `low` ×
    /// capacity, stopping at the first chunk the policy expects within
    /// `KEEP_HORIZON` calls. Returns the chunks evicted.
    /// HBM use counts everything on the device (managed chunks and memory
    /// u3m does not manage), as the runtime reports it; the calling thread's
    /// device must be `dev`.
    pub fn enforce_watermarks(&self, dev: u32, low: f64, high: f64) -> u32 {
        let Ok((free, total)) = self.rt.mem_info() else {
            return 0;
        };
        if total == 0 || (total.saturating_sub(free) as f64) <= high * total as f64 {
            return 0;
        }
        let Ok(mut st) = self.st.lock() else { return 0 };
        self.harvest(&mut st, dev, usize::MAX);
        let target = (total.saturating_sub(free) as f64 - low * total as f64).max(0.0) as u64;
        // one ordering per round; a chunk the policy expects within the
        // horizon ends the round: evicting it would only bring it back (the
        // headroom is a wish, demand eviction still makes room when needed)
        let now = st.clock;
        let ordered = self.victims(&st, dev, &[]);
        let mut n = 0u32;
        for c in ordered {
            if (n as u64) * CHUNK >= target || self.policy.predicts(now, c.key, KEEP_HORIZON) {
                break;
            }
            let Some((id, i)) = st.resolve(c.key) else {
                continue;
            };
            let ch = st.chunk(id, i);
            // busy chunks are skipped: the background never waits
            if !ch.in_hbm()
                || ch.pins != 0
                || ch.out_ev != 0
                || !ch
                    .uses
                    .iter()
                    .all(|&(_, ev)| self.rt.event_done(ev).unwrap_or(true))
            {
                continue;
            }
            if self.evict(&mut st, id, i).is_err() {
                break;
            }
            n += 1;
        }
        n
    }

    /// An allocation u3m does not manage failed for lack of HBM: evict
    /// managed chunks of `dev` to make room for `bytes`. true if any moved.
    pub fn make_room(&self, dev: u32, bytes: u64) -> bool {
        let Ok(mut st) = self.st.lock() else {
            return false;
        };
        let mut freed = 0;
        while freed < bytes {
            match self.evict_one(&mut st, dev, &[]) {
                Ok(true) => freed += CHUNK,
                _ => break,
            }
        }
        // the caller retries its allocation at once: copy-outs land first
        self.settle_outgoing(&mut st, dev);
        freed > 0
    }
}
