//! Calls larger than HBM. The invariant: no call runs on device memory u3m
//! has not made accessible. A call whose chunks cannot all be resident at
//! once is refused in `prepare`, before anything is queued or moved, with
//! 207001; the engine says so in one line naming the call.

use std::sync::atomic::Ordering::Relaxed;

use super::evict::Protect;
use super::probe::{Arm, Step, WINDOW};
use super::protocol::Need;
use super::state::{Host, MoveKind, Moved, State};
use super::{Fail, Shard as Residency, E_ALLOC};
use crate::acl::{AclError, MemcpyKind};
use crate::config::ReadOnce;
use crate::engine::runtime::CHUNK;
use crate::policy::Cand;
use crate::policy::Touch;

/// A call refused because its memory cannot all be accessible at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oversize {
    pub dev: u32,
    /// Bytes of managed memory the call touches on `dev` (whole chunks).
    pub need: u64,
    /// The device's HBM, and what managed memory can hold of it now
    /// (free plus what is resident: memory u3m does not manage stays).
    pub hbm: u64,
    pub room: u64,
    /// Host mapping was tried and failed with this error (None: it is off).
    pub host_map_failed: Option<AclError>,
}

impl Residency {
    /// Whether the chunks a call touches on `dev` can be resident together.
    /// Asks the runtime (`dev`'s HBM, whichever device the thread is on);
    /// on an error the fault-in decides as before.
    pub(super) fn check_fits(
        &self,
        st: &State,
        dev: u32,
        chunks: &[(u64, u32)],
    ) -> Result<(), Oversize> {
        let need = chunks
            .iter()
            .filter(|c| st.backings.get(&c.0).map(|b| b.dev) == Some(dev))
            .count() as u64
            * CHUNK;
        let Ok((free, hbm)) = self.rt.mem_info() else {
            return Ok(());
        };
        let room = free.saturating_add(st.dev(dev).resident);
        if need <= room {
            return Ok(());
        }
        Err(Oversize {
            dev,
            need,
            hbm,
            room,
            host_map_failed: None,
        })
    }

    /// Counts a refused call and keeps its figures for the engine.
    pub(super) fn refuse_oversize(&self, o: Oversize) {
        self.c.refused_oversize.fetch_add(1, Relaxed);
        if let Ok(mut g) = self.oversize.lock() {
            *g = Some(o);
        }
    }

    /// The figures of the call `prepare` last refused as too large, once.
    pub fn take_oversize(&self) -> Option<Oversize> {
        self.oversize.lock().ok()?.take()
    }
}

// ------------------------------------------------------------ host mapping
//
// A host-mapped chunk keeps its data in a HOST_NUMA physical handle mapped
// at every VA of its backing (`Chunk::on_host`, the handle in `phys`): the
// device reads and writes it over the link. A call whose chunks exceed what
// HBM can hold maps the chunks the policy would evict first (already mapped
// ones before any other) and faults the rest into HBM. Moving a chunk out of
// HBM is a remap and one device copy into the handle; back into HBM (the next
// call that fits, `fault_in`) is a remap and a copy. No host pointer exists
// for the handle: the old memory is mapped at a scratch VA of u3m's for the
// copy to read (`move_chunk`). No copy is waited for with the lock held: the
// chunk's VAs map its new memory at once, the copy is a use of the chunk on
// u3m's stream (every call, eviction or move of it orders itself after it,
// as after a copy-in), and the old memory is given back once it landed
// (`Dev::moves`, `reap_moves`).

/// Chunks of headroom a host-mapped call leaves in HBM (allocations u3m does
/// not manage may take a little meanwhile).
const HEADROOM: u64 = 2;

/// Spare scratch VAs a device keeps for moves (`take_move_va`).
const MOVE_VAS_SPARE: usize = 8;

impl Residency {
    /// Serves `over` bytes of a call from host-mapped chunks. Returns the
    /// chunks of `need` that are host-mapped now (the rest must be resident).
    /// Busy: chunks it must move are still in use (`st.wait_for`).
    pub(super) fn map_to_host(
        &self,
        st: &mut State,
        dev: u32,
        need: &[Need],
        over: u64,
    ) -> Result<Vec<(u64, u32)>, Fail> {
        // HBM whose move to a host handle has landed is free now
        self.reap_moves(st, dev);
        let want = (over.div_ceil(CHUNK) + HEADROOM) as usize;
        // candidates: the call's chunks u3m may move, mapped ones first, then
        // in the policy's eviction order (the furthest next use first)
        let mut mapped: Vec<(u64, u32)> = Vec::new();
        let mut cands: Vec<Cand> = Vec::new();
        for &(id, i, _) in need {
            let Some(b) = st.backings.get(&id) else {
                continue;
            };
            if b.dev != dev || b.pinned || b.real() != 0 || b.vas.is_empty() {
                continue;
            }
            let c = &b.chunks[i as usize];
            if c.on_host {
                mapped.push((id, i));
            } else {
                cands.push(Cand {
                    key: b.key(id, i),
                    last: c.last,
                    dirty: c.needs_copy_out(),
                });
            }
        }
        mapped.truncate(want);
        self.policy.order(st.clock, &mut cands);
        let mut busy = None;
        // chunks filled from their host copy (a copy on u3m's stream each)
        let mut fills: Vec<(u64, u32)> = Vec::new();
        for cand in cands {
            if mapped.len() >= want {
                break;
            }
            let Some((id, i)) = st.resolve(cand.key) else {
                continue;
            };
            let whole = need.iter().any(|n| (n.0, n.1) == (id, i) && n.2);
            let c = st.chunk(id, i);
            if c.out_ev != 0 {
                // its copy-out is in flight (evict.rs): HBM it still holds
                // is freed when that lands; wait for it rather than move it
                busy = busy.or(Some(c.out_ev));
                continue;
            }
            if c.phys == 0 {
                match self.map_absent(st, dev, id, i, whole) {
                    Ok(true) => fills.push((id, i)),
                    Ok(false) => {}
                    Err(e) => {
                        // the fills queued so far still order every call
                        if !fills.is_empty() {
                            let stream = self.dev_stream(st, dev)?;
                            self.fills_are_uses(st, stream, &fills)?;
                        }
                        return Err(e);
                    }
                }
            } else {
                // in HBM: only once nothing else uses it
                let pending = c
                    .uses
                    .iter()
                    .find(|u| !self.rt.event_done(u.1).unwrap_or(true))
                    .map(|u| u.1);
                if c.pins != 0 || pending.is_some() {
                    busy = busy.or(pending);
                    continue;
                }
                self.map_resident(st, dev, id, i, whole)?;
            }
            mapped.push((id, i));
        }
        // the fills are uses of their chunks on u3m's stream: the call (and
        // any other) orders itself after them (`after_copy_ins`,
        // `wait_copy_ins`), never the host with the lock held
        if !fills.is_empty() {
            let stream = self.dev_stream(st, dev)?;
            self.fills_are_uses(st, stream, &fills)?;
        }
        self.reclaim(st);
        // HBM the moves give back is free only once their copies landed:
        // the caller waits for the newest without the lock, and the retry
        // finds these chunks host-mapped and their HBM free (`reap_moves`)
        let leaving = st
            .dev(dev)
            .moves
            .iter()
            .rev()
            .find(|m| !m.host)
            .map(|m| m.ev);
        if let Some(ev) = leaving {
            st.wait_for = Some(ev);
            return Err(Fail::Busy);
        }
        if mapped.len() < want {
            if busy.is_some() {
                st.wait_for = busy;
                return Err(Fail::Busy);
            }
            return Err(Fail::Acl(E_ALLOC));
        }
        Ok(mapped)
    }

    /// The copies that filled `fills` (queued on u3m's `stream`) become a
    /// use of each: no call runs on them, and no move or eviction takes
    /// them, before they land. Without an event, waited for here (the
    /// only wait left, with the lock held: a runtime refusing events).
    fn fills_are_uses(
        &self,
        st: &mut State,
        stream: u64,
        fills: &[(u64, u32)],
    ) -> Result<(), AclError> {
        match self.use_event(st, stream) {
            Some(ev) => {
                for &(id, i) in fills {
                    st.set_use(id, i, stream, ev);
                }
                st.unref_event(ev);
                Ok(())
            }
            None => self.rt.sync_stream(stream),
        }
    }

    /// A 2 MiB VA of u3m's on `dev` to map a moving chunk's memory at.
    pub(super) fn take_move_va(&self, st: &mut State, dev: u32) -> Result<u64, AclError> {
        match st.dev_mut(dev).move_vas.pop() {
            Some(va) => Ok(va),
            None => self.rt.reserve(CHUNK),
        }
    }

    /// A scratch VA no copy reads any more (unmapped): kept spare, a few.
    pub(super) fn give_move_va(&self, st: &mut State, dev: u32, va: u64) {
        let spare = &mut st.dev_mut(dev).move_vas;
        if spare.len() < MOVE_VAS_SPARE {
            spare.push(va);
        } else {
            let _ = self.rt.release(va);
        }
    }

    /// Moves chunk (id, i) from physical `old` to `new`: `new` replaces
    /// `old` at every VA of the chunk now and, with `copy`, a copy from
    /// `old` (mapped at a scratch VA for it) into `new` is queued on u3m's
    /// stream and becomes a use of the chunk; `old` is given back once it
    /// landed (`Dev::moves`, `reap_moves`), or at once without a copy
    /// (`old_host`: it is a host handle, counted in `host_mapped`; else
    /// HBM, in `resident`). Nothing waits with the lock held (unless the
    /// runtime refuses an event). The caller has checked that no call uses
    /// the chunk (no pin, no use in flight) and updates the chunk itself;
    /// on failure nothing changed and `new` is the caller's to free.
    #[allow(clippy::too_many_arguments)]
    fn move_chunk(
        &self,
        st: &mut State,
        dev: u32,
        id: u64,
        i: u32,
        old: u64,
        new: u64,
        copy: bool,
        old_host: bool,
    ) -> Result<(), AclError> {
        let off = i as u64 * CHUNK;
        let first = st.backings[&id].vas.first().map(|v| v + off);
        let mut scratch = [0u64; 2];
        // unmaps and gives back the scratch VAs mapped so far
        let drop_scratch = |st: &mut State, scratch: &[u64; 2]| {
            for &va in scratch.iter().filter(|&&va| va != 0) {
                let _ = self.rt.unmap(va);
                self.give_move_va(st, dev, va);
            }
        };
        let mut stream = 0;
        if copy {
            stream = self.dev_stream(st, dev)?;
            // the old memory at a VA of its own: the copy's source
            let va = self.take_move_va(st, dev)?;
            if let Err(e) = self.map_retrying(va, CHUNK, old) {
                self.give_move_va(st, dev, va);
                return Err(e);
            }
            scratch[0] = va;
        }
        if let Err(e) = self.remap(st, id, i, old, new) {
            drop_scratch(st, &scratch);
            return Err(e);
        }
        if copy {
            let dst = match first {
                Some(d) => Ok(d),
                // mapped nowhere (a VMM handle): the new memory at a VA too
                None => self.take_move_va(st, dev).and_then(|va| {
                    let r = self.map_retrying(va, CHUNK, new);
                    if r.is_err() {
                        self.give_move_va(st, dev, va);
                    }
                    r.map(|()| va)
                }),
            };
            let r = dst.and_then(|dst| {
                if first.is_none() {
                    scratch[1] = dst;
                }
                self.rt
                    .memcpy_async(dst, scratch[0], CHUNK, MemcpyKind::DEVICE_TO_DEVICE, stream)
            });
            if let Err(e) = r {
                // `old` back at the chunk's VAs, holding its data
                let _ = self.remap(st, id, i, new, old);
                drop_scratch(st, &scratch);
                return Err(e);
            }
            match self.use_event(st, stream) {
                Some(ev) => {
                    st.set_use(id, i, stream, ev);
                    // the event's first reference is the entry's
                    st.dev_mut(dev).moves.push(Moved {
                        ev,
                        vas: scratch,
                        old,
                        host: old_host,
                    });
                    return Ok(());
                }
                // no event to know when: the old wait, lock held
                None => {
                    let _ = self.rt.sync_stream(stream);
                }
            }
        }
        self.release_moved(
            st,
            dev,
            Moved {
                ev: 0,
                vas: scratch,
                old,
                host: old_host,
            },
        );
        Ok(())
    }

    /// Gives back a move's old memory and scratch VAs (its copy landed).
    fn release_moved(&self, st: &mut State, dev: u32, m: Moved) {
        for &va in m.vas.iter().filter(|&&va| va != 0) {
            let _ = self.rt.unmap(va);
            self.give_move_va(st, dev, va);
        }
        self.free_phys(st, dev, m.old);
        let d = st.dev_mut(dev);
        if m.host {
            d.host_mapped -= CHUNK;
        } else {
            d.resident -= CHUNK;
        }
        if m.ev != 0 {
            st.unref_event(m.ev);
        }
    }

    /// Gives back the old memory of `dev`'s moves whose copy landed. Never
    /// waits.
    pub(super) fn reap_moves(&self, st: &mut State, dev: u32) {
        let mut k = 0;
        while k < st.dev(dev).moves.len() {
            if self.rt.event_done(st.dev(dev).moves[k].ev).unwrap_or(true) {
                let m = st.dev_mut(dev).moves.swap_remove(k);
                self.release_moved(st, dev, m);
            } else {
                k += 1;
            }
        }
    }

    /// Every move of `dev` given back: its copies are complete (u3m's
    /// streams synchronised: finalize).
    pub(super) fn release_moves(&self, st: &mut State, dev: u32) {
        for m in std::mem::take(&mut st.dev_mut(dev).moves) {
            self.release_moved(st, dev, m);
        }
    }

    /// `dev`'s moves forgotten without the runtime (its memory is gone, or
    /// the parent's: a device reset, a forked child).
    pub(super) fn forget_moves(&self, st: &mut State, dev: u32) {
        for m in std::mem::take(&mut st.dev_mut(dev).moves) {
            let d = st.dev_mut(dev);
            if m.host {
                d.host_mapped = d.host_mapped.saturating_sub(CHUNK);
            } else {
                d.resident = d.resident.saturating_sub(CHUNK);
            }
            st.unref_event(m.ev);
        }
    }

    /// Maps `handle` at every VA of chunk (id, i); undone on failure.
    fn map_at_vas(&self, st: &State, id: u64, i: u32, handle: u64) -> Result<(), AclError> {
        let vas = &st.backings[&id].vas;
        for (k, &va) in vas.iter().enumerate() {
            if let Err(e) = self.rt.map(va + i as u64 * CHUNK, CHUNK, handle) {
                for &v in &vas[..k] {
                    let _ = self.rt.unmap(v + i as u64 * CHUNK);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// A chunk in no device memory (its data in DRAM, NVMe, or none yet)
    /// becomes host-mapped: a host handle at its VAs, filled from the host
    /// copy by one copy on u3m's stream (`whole`: the call overwrites it).
    /// Returns whether a fill copy was queued: the caller makes it a use
    /// of the chunk (`fills_are_uses`), nobody waits for it here. An NVMe
    /// copy goes through a staging buffer of its own (`take_staging`; Busy
    /// when the device's are all in flight, `st.wait_for` naming one).
    fn map_absent(
        &self,
        st: &mut State,
        dev: u32,
        id: u64,
        i: u32,
        whole: bool,
    ) -> Result<bool, Fail> {
        let target = st.backings[&id].vas[0] + i as u64 * CHUNK;
        let stream = self.dev_stream(st, dev)?;
        // (the host address, the staging buffer it is when from NVMe)
        let src = match &st.chunk(id, i).host {
            _ if whole => None,
            None => None,
            Some(Host::Dram(slot)) => Some((slot.ptr as u64, 0)),
            Some(Host::Nvme(_)) => {
                let staging = self.stage_from_nvme(st, dev, id, i)?;
                self.c.from_nvme.fetch_add(1, Relaxed);
                Some((staging, staging))
            }
        };
        let staging = src.map_or(0, |s| s.1);
        let h = match self.rt.malloc_physical_host(dev, CHUNK) {
            Ok(h) => h,
            Err(e) => {
                self.give_staging(st, dev, staging);
                return Err(e.into());
            }
        };
        if let Err(e) = self.map_at_vas(st, id, i, h) {
            let _ = self.rt.free_physical(h);
            self.give_staging(st, dev, staging);
            return Err(e.into());
        }
        if let Some((src, _)) = src {
            let r = self
                .rt
                .memcpy_async(target, src, CHUNK, MemcpyKind::HOST_TO_DEVICE, stream);
            if let Err(e) = r {
                for &va in &st.backings[&id].vas {
                    let _ = self.rt.unmap(va + i as u64 * CHUNK);
                }
                let _ = self.rt.free_physical(h);
                self.give_staging(st, dev, staging);
                return Err(e.into());
            }
            if staging != 0 {
                // spare again once the copy has read it (`reap_staging`)
                match self.use_event(st, stream) {
                    Some(ev) => st.dev_mut(dev).staging_busy.push((ev, staging)),
                    None => {
                        // no event to know when (a failing runtime)
                        let _ = self.rt.sync_stream(stream);
                        self.give_staging(st, dev, staging);
                    }
                }
            }
            self.c.host_map_bytes.fetch_add(CHUNK, Relaxed);
        }
        st.mark(id, i);
        let c = st.chunk_mut(id, i);
        // the host copy stays, current while no call writes the chunk (a
        // write drops it: `finish`): brought back into HBM unwritten — a
        // read-once stream, the probe switching to copies — the chunk is
        // clean and its next eviction copies nothing out
        // overwritten whole: not filled, its host copy kept until the call
        // succeeds (as `fault_in`'s)
        c.unfilled = whole && c.host.is_some();
        c.phys = h;
        c.on_host = true;
        c.dirty = c.host.is_none() || c.unfilled;
        c.prefetched = false;
        st.dev_mut(dev).host_mapped += CHUNK;
        self.c.host_maps.fetch_add(1, Relaxed);
        Ok(src.is_some())
    }

    /// A chunk in HBM (no call using it) becomes host-mapped: a host handle
    /// replaces HBM at its VAs, and one device copy from the HBM into it is
    /// queued (`move_chunk`: the HBM is given back once it landed).
    fn map_resident(
        &self,
        st: &mut State,
        dev: u32,
        id: u64,
        i: u32,
        whole: bool,
    ) -> Result<(), AclError> {
        let h = self.rt.malloc_physical_host(dev, CHUNK)?;
        // (its uses have all completed: the caller checked)
        let uses: Vec<u64> = st.chunk_mut(id, i).uses.drain(..).map(|u| u.1).collect();
        for ev in uses {
            st.unref_event(ev);
        }
        let hbm = st.chunk(id, i).phys;
        // the HBM stays counted in `resident` until it is given back
        // the HBM is the chunk's only copy: moved even when the call
        // overwrites it whole, since a call that fails writes nothing
        let _ = whole;
        if let Err(e) = self.move_chunk(st, dev, id, i, hbm, h, true, false) {
            let _ = self.rt.free_physical(h);
            return Err(e);
        }
        self.c.host_map_bytes.fetch_add(CHUNK, Relaxed);
        st.mark(id, i);
        let c = st.chunk_mut(id, i);
        c.phys = h;
        c.on_host = true;
        c.dirty = true;
        let old = c.host.take();
        if let Some(o) = old {
            st.pending_free.push((dev, o));
        }
        st.dev_mut(dev).host_mapped += CHUNK;
        self.c.host_maps.fetch_add(1, Relaxed);
        Ok(())
    }

    /// A host-mapped chunk comes back into HBM for a call (from `fault_in`):
    /// a new HBM chunk replaces the handle at its VAs, and a copy from the
    /// handle into it is queued (`move_chunk`): a use of the chunk, which
    /// the call orders itself after as after a copy-in (`after_copy_ins`,
    /// `wait_copy_ins`, without the lock); the handle is given back once
    /// it landed.
    pub(super) fn unmap_from_host(
        &self,
        st: &mut State,
        dev: u32,
        id: u64,
        i: u32,
        whole: bool,
        protect: &Protect<'_>,
    ) -> Result<(), Fail> {
        {
            // a call in flight may be reading it where it is mapped now
            let c = st.chunk(id, i);
            if c.pins != 0 {
                return Err(Fail::Busy);
            }
            if let Some(u) = c
                .uses
                .iter()
                .find(|u| !self.rt.event_done(u.1).unwrap_or(true))
            {
                st.wait_for = Some(u.1);
                return Err(Fail::Busy);
            }
        }
        self.reap_moves(st, dev);
        let phys = self.alloc_phys(st, dev, protect, 0)?;
        // (its uses have all completed: checked above)
        let uses: Vec<u64> = st.chunk_mut(id, i).uses.drain(..).map(|u| u.1).collect();
        for ev in uses {
            st.unref_event(ev);
        }
        let h = st.chunk(id, i).phys;
        // the handle stays counted in `host_mapped` until it is given back
        // the handle is the chunk's only copy: moved even when the call
        // overwrites it whole, since a call that fails writes nothing
        let _ = whole;
        if let Err(e) = self.move_chunk(st, dev, id, i, h, phys, true, true) {
            let _ = self.rt.free_physical(phys);
            return Err(Fail::Acl(e));
        }
        self.c.fault_bytes.fetch_add(CHUNK, Relaxed);
        st.note_move(id, i, MoveKind::In { demand: true });
        st.mark(id, i);
        let c = st.chunk_mut(id, i);
        c.phys = phys;
        c.on_host = false;
        st.dev_mut(dev).resident += CHUNK;
        self.c.host_unmaps.fetch_add(1, Relaxed);
        self.c.faults_in.fetch_add(1, Relaxed);
        Ok(())
    }

    /// At every VA of chunk (id, i): `from` unmapped, `to` mapped. A map
    /// that fails (twice) puts `from` back everywhere: the chunk is never
    /// left unmapped.
    fn remap(&self, st: &State, id: u64, i: u32, from: u64, to: u64) -> Result<(), AclError> {
        let vas = &st.backings[&id].vas;
        let map = |at: u64, h: u64| {
            self.rt
                .map(at, CHUNK, h)
                .or_else(|_| self.rt.map(at, CHUNK, h))
        };
        for (k, &va) in vas.iter().enumerate() {
            let at = va + i as u64 * CHUNK;
            let _ = self.rt.unmap(at);
            if let Err(e) = map(at, to) {
                let _ = map(at, from);
                for &v in &vas[..k] {
                    let _ = self.rt.unmap(v + i as u64 * CHUNK);
                    let _ = map(v + i as u64 * CHUNK, from);
                }
                return Err(e);
            }
        }
        Ok(())
    }
}

// ------------------------------------------------- read-once streams
//
// U3M_HOST_MAP=stream (always) and probe (while the read-once probe, probe.rs,
// times it faster). A chunk a call only reads is a read-once stream when
// (1) since it was last written it was read again at least `STREAM_READS`
// times after more chunks than HBM holds had been touched (passes; reads
// closer together, by other tensors sharing the chunk, do not count),
// (2) more chunks were touched since its previous use than HBM holds
// (copied in, it would be evicted again before its next use), and (3) the
// policy does not expect it back sooner, within W = the calls that touch as
// many chunks as HBM holds at the rate since its previous use
// (`!predicts(now, key, W)`). Such a chunk is host-mapped instead of copied
// in (the device reads it over the link): the copy-in and the eviction it
// needs go, and the HBM stays with chunks that are reused. An absent chunk
// is mapped only while HBM is full (copying into free HBM evicts nothing).
// A host-mapped chunk a call only reads stays mapped while (1) and (3)
// hold, whatever its distance: later passes read it in place (a weight read
// in the forward and again soon in the backward would otherwise be copied
// back, and written back when evicted). A chunk that is written, or that
// the policy expects back sooner, is copied back into HBM by the fault-in.

/// Passes (read-only reuses farther apart than HBM holds) since the last
/// write before a chunk counts as a stream: weights of full-parameter
/// training are read at most twice per step (forward, backward) between
/// the optimizer's writes and never qualify; frozen or served weights are
/// read every pass.
pub(super) const STREAM_READS: u8 = 3;

/// Logical ticks past the call being prepared at which the policy is asked
/// for the chunk's next use: the prediction of this very access (early or
/// late by a few ticks) must not count as "expected back soon".
const PAST_THIS_CALL: u64 = 8;

/// Host copies freed by fills (128 MiB) before `map_streams` synchronises
/// u3m's streams to give them back.
const RECLAIM_BATCH: usize = 64;

impl Residency {
    /// The chunks of `need` (`writes[k]`: the call writes `need[k]`) served
    /// host-mapped as read-once streams, sorted, and how many of them were
    /// host-mapped already (reads in place). Chunks newly mapped get their
    /// fill copy ordered before the call (a use on u3m's stream, which
    /// `after_copy_ins` orders the caller after). A failure to map leaves
    /// the rest to the fault-in (copies).
    pub(super) fn map_streams(
        &self,
        st: &mut State,
        dev: u32,
        need: &[Need],
        writes: &[Touch],
        map: bool,
    ) -> Result<(Vec<(u64, u32)>, u64), Fail> {
        let mut out: Vec<(u64, u32)> = Vec::new();
        // candidates: read-only, not in HBM, read often since last written
        let mut cands: Vec<usize> = Vec::new();
        let mut absent = 0u64;
        for (k, &(id, i, whole)) in need.iter().enumerate() {
            let Some(b) = st.backings.get(&id) else {
                continue;
            };
            let c = &b.chunks[i as usize];
            if c.in_hbm() || c.out_ev != 0 {
                continue;
            }
            absent += !c.on_host as u64;
            if whole
                || writes.get(k).is_none_or(|t| t.writes())
                || c.ro_uses < STREAM_READS
                || b.dev != dev
                || b.pinned
                || b.real() != 0
                || b.vas.is_empty()
                || (c.phys == 0 && c.host.is_none())
            {
                continue;
            }
            cands.push(k);
        }
        if cands.is_empty() {
            return Ok((out, 0));
        }
        let Ok((free, total)) = self.rt.mem_info() else {
            return Ok((out, 0));
        };
        let hbm_chunks = total / CHUNK;
        // copying into free HBM evicts nothing
        let full = free < (absent + HEADROOM) * CHUNK;
        let (now, touches) = (st.clock, st.touches);
        let mut fresh: Vec<(u64, u32)> = Vec::new();
        let mut reads = 0;
        let mut seen = 0;
        for k in cands {
            let (id, i, _) = need[k];
            let c = st.chunk(id, i);
            let on_host = c.on_host;
            if !on_host && !full {
                continue;
            }
            // an absent chunk: only if its reuse distance now exceeds HBM
            // (a host-mapped one read again sooner — a weight read in the
            // forward and soon after in the backward — is still read in
            // place: a copy back would be written back when evicted)
            let dist = touches.saturating_sub(c.last_touches).max(1);
            if !on_host && dist <= hbm_chunks {
                continue;
            }
            let calls = now.saturating_sub(c.last).max(1);
            let w = (calls as u128 * hbm_chunks as u128 / dist as u128).max(1) as u64;
            let key = st.backings[&id].key(id, i);
            // the access being prepared is the one the policy predicted
            // (it has not been told of it yet): ask about the window after it
            if self.policy.predicts(now + PAST_THIS_CALL, key, w) {
                continue;
            }
            if !map {
                // the probe's copies: count what would be mapped; chunks
                // host-mapped by its last window of mapping come back
                seen += !on_host as u64;
                continue;
            }
            if on_host {
                reads += 1;
            } else {
                let named = st.wait_for;
                match self.map_absent(st, dev, id, i, false) {
                    Ok(_) => {
                        self.c.stream_maps.fetch_add(1, Relaxed);
                        fresh.push((id, i));
                    }
                    // no host handle (host memory limit, a failed map or
                    // copy, every staging buffer in flight): this chunk and
                    // the rest are copied in
                    Err(_) => {
                        st.wait_for = named;
                        break;
                    }
                }
            }
            out.push((id, i));
        }
        if seen != 0 {
            st.probe.probe.saw(seen);
            st.probe.dev.get_or_insert(dev);
        }
        if !fresh.is_empty() {
            // the fill copies are uses of their chunks on u3m's stream: no
            // call runs on them before they land (after_copy_ins), and a
            // failed event falls back to waiting here
            let stream = self.dev_stream(st, dev)?;
            self.fills_are_uses(st, stream, &fresh)?;
            // the fills' DRAM copies wait in pending_free for u3m's streams
            // to be synchronised; give them back in batches, not at the
            // next DRAM shortage (they count as DRAM in use meanwhile)
            if st.pending_free.len() >= RECLAIM_BATCH {
                self.reclaim(st);
            }
        }
        out.sort_unstable();
        Ok((out, reads))
    }
}

impl Residency {
    /// The read-once probe's part of a call on `dev` queued on a stream
    /// (U3M_HOST_MAP=probe): counts the call, records the marks the probe
    /// asks for on the call's stream, and hands it the device's timing of
    /// windows whose marks have completed. Synchronous calls do not count
    /// (a mark needs a stream).
    pub(super) fn probe_tick(&self, st: &mut State, dev: u32, stream: u64) {
        if st.probe.dev != Some(dev) {
            return;
        }
        match st.probe.probe.tick() {
            Step::Nothing => {}
            Step::Start => {
                if let Some(old) = st.probe.open.take() {
                    st.unref_event(old);
                }
                st.probe.open = self.use_event(st, stream);
                if st.probe.open.is_none() {
                    // no mark: the window cannot be timed; copies for good
                    let arm = st.probe.probe.arm;
                    st.probe.probe.timed(arm, None, WINDOW);
                }
            }
            Step::End(arm) => match (st.probe.open.take(), self.use_event(st, stream)) {
                (Some(a), Some(b)) => st.probe.pending.push((a, b, arm)),
                (a, b) => {
                    for ev in [a, b].into_iter().flatten() {
                        st.unref_event(ev);
                    }
                    st.probe.probe.timed(arm, None, WINDOW);
                }
            },
        }
        // a window is timed once the device has passed its end mark
        if st.probe.pending.is_empty() || st.clock % 16 != 0 {
            return;
        }
        let mut k = 0;
        while k < st.probe.pending.len() {
            let (a, b, arm) = st.probe.pending[k];
            match self.rt.event_done(b) {
                Ok(false) => k += 1,
                done => {
                    let ns = done.ok().and_then(|_| self.rt.elapsed_ns(a, b).ok());
                    st.probe.pending.swap_remove(k);
                    st.unref_event(a);
                    st.unref_event(b);
                    st.probe.probe.timed(arm, ns, WINDOW);
                    let p = &st.probe.probe;
                    if !p.waiting() {
                        self.c.probe_verdicts.store(p.probes, Relaxed);
                        self.c.probe_maps.store(p.map_verdicts, Relaxed);
                    }
                }
            }
        }
    }

    /// Whether read-once streams are mapped now (`map_streams`' `map`).
    pub(super) fn read_once_maps(&self, st: &State) -> bool {
        match self.read_once {
            ReadOnce::Always => true,
            ReadOnce::Probe => st.probe.probe.arm == Arm::Map,
            ReadOnce::Off => false,
        }
    }
}
