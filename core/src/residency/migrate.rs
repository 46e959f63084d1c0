//! Moving chunk data between the tiers: copy-in (a fault-in for a call),
//! copy-out (an eviction's data leaving HBM), the host slots they use, and
//! the background DRAM→NVMe spill. Every device copy runs on u3m's own
//! stream per device.
//!
//! A copy-out is two steps, `start_copy_out` (the D2H copy is issued) and
//! its completion (the data has landed: the host slot becomes the chunk's
//! copy, the chunk's HBM is unmapped and freed). A dirty chunk is evicted
//! asynchronously: the copy runs on u3m's device-to-host stream (to its
//! DRAM slot, or to a staging buffer of its own for NVMe), an event is
//! recorded after it, and `harvest` completes it once that event is done —
//! never before, so the HBM is reused only after the data left it. The
//! chunk stays mapped and resident meanwhile; a call that needs an
//! allocation's chunk again takes it back (`rescue`); one that needs a VMM
//! handle's chunk waits for the copy (it is read at a VA of u3m's own that
//! must not outlive the chunk's memory, `Outgoing::va`). Only when no event
//! can be had is a copy-out completed at once (a stream synchronisation).

use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use super::evict::Protect;
use super::protocol::{Need, Order};
use super::state::{Host, Kind, MoveKind, Outgoing, StGuard, State};
use super::{Fail, Shard as Residency, E_ALLOC, MAX_DEVICES};

/// Staging buffers a device has in use at most (NVMe copy-ins and
/// copy-outs in flight, `take_staging`): 16 MiB of pinned memory.
const STAGING_MAX: usize = 8;
/// Spare staging buffers a device keeps for reuse.
const STAGING_SPARE: usize = 4;
use crate::acl::{AclError, MemcpyKind};
use crate::engine::runtime::{on_device, CHUNK};
use crate::policy::Place;
use crate::store::StoreError;

/// Copy-ins a host-ordered call issued and waits for without the lock
/// (`fault_in`): the chunks they fill and the events recorded after them
/// (one reference each, the waiter's).
#[derive(Default)]
pub(super) struct Arriving {
    pub chunks: Vec<(u64, u32)>,
    pub evs: Vec<u64>,
}

/// A copy-out issued and not yet complete.
pub(super) struct CopyOut {
    id: u64,
    i: u32,
    /// Where the D2H copy lands: the DRAM slot itself, or the staging
    /// buffer an NVMe slot is written from.
    slot: Host,
    staging: u64,
    stream: u64,
    /// The VA of u3m's own the chunk was mapped at for the copy (a VMM
    /// handle's chunk: `Outgoing::va`), unmapped once the copy is complete.
    scratch: Option<u64>,
}

impl Residency {
    /// u3m's migration stream on `dev` (created on first use, in `dev`'s
    /// context whichever thread asks; every use through `fences` runs there).
    pub(super) fn dev_stream(&self, st: &mut State, dev: u32) -> Result<u64, AclError> {
        if st.dev(dev).stream == 0 {
            st.dev_mut(dev).stream = self.fences.create_stream_on(dev)?;
        }
        Ok(st.dev(dev).stream)
    }

    /// u3m's device-to-host stream on `dev` (as `dev_stream`).
    fn out_stream(&self, st: &mut State, dev: u32) -> Result<u64, AclError> {
        if st.dev(dev).out_stream == 0 {
            st.dev_mut(dev).out_stream = self.fences.create_stream_on(dev)?;
        }
        Ok(st.dev(dev).out_stream)
    }

    /// A pinned 2 MiB staging buffer for one NVMe transfer on `dev` (a
    /// copy-in from it or a copy-out into it, on `dev`'s u3m streams): a
    /// spare one, one whose copy-in completed, else a new one. Never waits:
    /// with `STAGING_MAX` in flight, Busy with `st.wait_for` naming the
    /// oldest of them (the caller waits without the lock and tries again),
    /// where the old single buffer was waited for with the lock held.
    pub(super) fn take_staging(&self, st: &mut State, dev: u32) -> Result<u64, Fail> {
        self.reap_staging(st, dev);
        if let Some(b) = st.dev_mut(dev).staging_free.pop() {
            return Ok(b);
        }
        let d = st.dev(dev);
        let in_use = d.staging_busy.len() + d.outgoing.iter().filter(|o| o.staging != 0).count();
        if in_use >= STAGING_MAX {
            let oldest_in = d.staging_busy.first().map(|b| b.0);
            let oldest_out = d.outgoing.iter().find(|o| o.staging != 0).map(|o| o.ev);
            st.wait_for = oldest_in.or(oldest_out);
            return Err(Fail::Busy);
        }
        Ok(self.rt.malloc_host(CHUNK)? as u64)
    }

    /// Staging buffers whose copy-in completed (or failed: nothing more
    /// runs on that stream) become spare again. Never waits.
    fn reap_staging(&self, st: &mut State, dev: u32) {
        let mut k = 0;
        while k < st.dev(dev).staging_busy.len() {
            let (ev, buf) = st.dev(dev).staging_busy[k];
            if self.rt.event_done(ev).unwrap_or(true) {
                st.dev_mut(dev).staging_busy.remove(k);
                st.unref_event(ev);
                self.give_staging(st, dev, buf);
            } else {
                k += 1;
            }
        }
    }

    /// A staging buffer no transfer uses any more: kept spare (up to
    /// `STAGING_SPARE`) or given back.
    pub(super) fn give_staging(&self, st: &mut State, dev: u32, buf: u64) {
        if buf == 0 {
            return;
        }
        let d = st.dev_mut(dev);
        if d.staging_free.len() < STAGING_SPARE {
            d.staging_free.push(buf);
        } else {
            let _ = self.rt.free_host(buf as *mut u8);
        }
    }

    /// Chunk `i` of `id`, whose copy is on NVMe, read into a staging buffer
    /// of its own for a copy-in. A failed read counts a spill error and
    /// gives the buffer back.
    pub(super) fn stage_from_nvme(
        &self,
        st: &mut State,
        dev: u32,
        id: u64,
        i: u32,
    ) -> Result<u64, Fail> {
        let staging = self.take_staging(st, dev)?;
        let st2 = &mut *st;
        let read = match &st2.backings.get(&id).expect("backing").chunks[i as usize].host {
            Some(Host::Nvme(slot)) => {
                let buf =
                    unsafe { std::slice::from_raw_parts_mut(staging as *mut u8, CHUNK as usize) };
                st2.nvme
                    .as_mut()
                    .map(|n| n.read(slot, buf))
                    .unwrap_or(Err(StoreError::BadSlot))
            }
            _ => Err(StoreError::BadSlot),
        };
        if read.is_err() {
            self.c.spill_errors.fetch_add(1, Relaxed);
            self.give_staging(st, dev, staging);
            return Err(Fail::Acl(E_ALLOC));
        }
        Ok(staging)
    }

    /// Gives every staging buffer of `dev` back to the runtime (its streams
    /// are idle or gone: finalize, a device reset).
    pub(super) fn free_staging(&self, st: &mut State, dev: u32) {
        let d = st.dev_mut(dev);
        let bufs: Vec<u64> = d.staging_free.drain(..).collect();
        let busy: Vec<(u64, u64)> = d.staging_busy.drain(..).collect();
        for (ev, b) in busy {
            st.unref_event(ev);
            let _ = self.rt.free_host(b as *mut u8);
        }
        for b in bufs {
            let _ = self.rt.free_host(b as *mut u8);
        }
    }

    // ------------------------------------------------------------ copy-in

    /// Makes the listed chunks resident. Chunks of this call are protected
    /// from eviction; the caller's stream (or the host) is ordered after the
    /// copies. On Busy the copies issued so far are recorded as uses of
    /// their chunks, so the retry orders itself after them
    /// (`after_copy_ins`) without anyone waiting with the lock held.
    /// Every chunk made resident is pinned and listed in `reserved` (the
    /// caller unpins them, `unreserve`): while the caller waits for a
    /// copy-out without the lock, other calls cannot evict what it already
    /// brought in.
    ///
    /// `Order::Host` with `arriving`: the copies are not waited for here —
    /// they are recorded as a use of each chunk they fill (as for a
    /// stream-ordered call: no eviction before they land, and any other
    /// call needing the chunk orders itself after them), and `arriving`
    /// gets the chunks and the event (one reference), which the caller
    /// waits for without the lock (`protocol::wait_copy_ins`). Without
    /// `arriving` the host waits here, with the lock held.
    ///
    /// `protect`: the call's chunks as its evictions see them (built here
    /// at the first absent chunk; a caller that retries with the same
    /// `need` passes the same one, None otherwise).
    pub(super) fn fault_in(
        &self,
        st: &mut State,
        need: &[Need],
        dev: u32,
        order: Order,
        reserved: &mut Vec<(u64, u32)>,
        arriving: Option<&mut Arriving>,
        protect: &mut Option<Protect<'static>>,
    ) -> Result<(), Fail> {
        let mut filled: Vec<(u64, u32)> = Vec::new();
        let r = self.fault_in_chunks(st, need, dev, &mut filled, reserved, protect);
        if filled.is_empty() || matches!(r, Err(Fail::Acl(_))) {
            return r; // a failure: prepare synchronises u3m's stream
        }
        let stream = self.dev_stream(st, dev)?;
        let arriving = match (order, &r) {
            (Order::Host, Ok(())) => arriving,
            _ => None,
        };
        match (order, r) {
            (Order::Host, Ok(())) if arriving.is_none() => {
                if let Err(e) = self.rt.sync_stream(stream) {
                    // the copies may not have landed: the host copies stay
                    // the chunks' only ones
                    for &(id, i) in &filled {
                        self.undo_fault_in(st, id, i, reserved);
                    }
                    return Err(e.into());
                }
            }
            (order, r) => {
                let Some(ev) = self.use_event(st, stream) else {
                    if self.rt.sync_stream(stream).is_err() {
                        // the copies may not have landed
                        for &(id, i) in &filled {
                            self.undo_fault_in(st, id, i, reserved);
                        }
                    }
                    return Err(Fail::Acl(E_ALLOC));
                };
                // the copy is a use of each chunk it fills: no eviction
                // before it completes, and other streams' calls order
                // themselves after it (`after_copy_ins`)
                for &(id, i) in &filled {
                    st.set_use(id, i, stream, ev);
                }
                *st.event_refs.entry(ev).or_insert(0) += 1;
                let old = std::mem::replace(&mut st.dev_mut(dev).last_in, ev);
                if old != 0 {
                    st.unref_event(old);
                }
                if let Some(a) = arriving {
                    // the reference taken at creation goes to the caller
                    a.evs.push(ev);
                    a.chunks.extend_from_slice(&filled);
                    return Ok(());
                }
                let rc = match (order, r) {
                    (Order::Stream(s), Ok(())) => self.rt.stream_wait(s, ev),
                    _ => Ok(()),
                };
                st.unref_event(ev);
                rc?;
                r?;
            }
        }
        Ok(())
    }

    /// `fault_in`'s chunk loop; `filled` gets the chunks a copy-in was
    /// issued for.
    fn fault_in_chunks(
        &self,
        st: &mut State,
        need: &[Need],
        dev: u32,
        filled: &mut Vec<(u64, u32)>,
        reserved: &mut Vec<(u64, u32)>,
        protect: &mut Option<Protect<'static>>,
    ) -> Result<(), Fail> {
        // whether an absent (or host-mapped) chunk was met yet
        let mut met = false;
        // absent chunks after the current one (copy-outs for them may start)
        let mut ahead = 0usize;
        for (k, &(id, i, whole)) in need.iter().enumerate() {
            let Some(b) = st.backings.get(&id) else {
                continue;
            };
            // a VMM handle's chunk whose copy-out has landed (below: the
            // call waits for one in flight): completed now, its memory
            // given back, and the chunk faulted back in below (the device's
            // copy-outs land in order: `harvest` reaches this one)
            let out = b.chunks[i as usize].out_ev;
            if out != 0
                && (!matches!(b.kind, Kind::Malloc) || b.chunks[i as usize].phys == 0)
                && self.rt.event_done(out).unwrap_or(false)
            {
                let bdev = b.dev;
                self.harvest(st, bdev, usize::MAX);
            }
            let Some(b) = st.backings.get(&id) else {
                continue;
            };
            let c = &b.chunks[i as usize];
            if c.unfilled && !whole {
                // mapped for another call that writes it whole: its memory
                // holds nothing of it. That call in flight: wait for it;
                // else (it waits unlocked for other work) the chunk goes
                // back to its host copy and is faulted in from there
                if c.pins != 0 {
                    st.wait_for = None;
                    return Err(Fail::Busy);
                }
                debug_assert!(c.out_ev == 0, "an unfilled chunk never leaves (evict)");
                st.chunk_mut(id, i).unfilled = false;
                self.unfilled_back(st, id, i);
            }
            let Some(b) = st.backings.get(&id) else {
                continue;
            };
            let c = &b.chunks[i as usize];
            if c.phys != 0 {
                if c.on_host {
                    // host-mapped: back into HBM (hostmap.rs); the HBM it
                    // takes must never come from this call's own chunks
                    let bdev = b.dev;
                    met = true;
                    let p = protect.get_or_insert_with(|| protect_of(need));
                    self.unmap_from_host(st, bdev, id, i, whole, p)?;
                } else if c.out_ev != 0 {
                    if matches!(b.kind, Kind::Malloc) {
                        // its copy-out is in flight: it stays (pipe)
                        self.rescue(st, id, i);
                    } else {
                        // a VMM handle's copy-out reads the chunk at a VA of
                        // u3m's own until it lands: the chunk's memory must
                        // not move or go before (a host-mapping move or an
                        // export would not know of that VA) — the call waits
                        // for it, unlocked, and faults the chunk back in
                        st.wait_for = Some(c.out_ev);
                        return Err(Fail::Busy);
                    }
                }
                continue;
            }
            if c.out_ev != 0 {
                // its HBM went to a copy-in while its copy-out is in flight
                // (`take_outgoing`): the call waits for the copy, unlocked,
                // and faults the chunk back in
                st.wait_for = Some(c.out_ev);
                return Err(Fail::Busy);
            }
            if !met {
                met = true;
                ahead = need[k + 1..]
                    .iter()
                    .filter(|n| {
                        st.backings
                            .get(&n.0)
                            .map(|b| b.chunks[n.1 as usize].phys == 0)
                            .unwrap_or(false)
                    })
                    .count();
            } else {
                ahead = ahead.saturating_sub(1);
            }
            let bdev = b.dev;
            if st.stall_from.is_none() {
                st.stall_from = Some(crate::shm::mono_ns());
            }
            let p = protect.get_or_insert_with(|| protect_of(need));
            let (phys, took) = self.alloc_phys_taking(st, bdev, p, ahead)?;
            let vas = st.backings[&id].vas.clone();
            if let Err(e) = self.map_chunk(&vas, i, phys) {
                self.free_phys(st, bdev, phys);
                return Err(e.into());
            }
            st.dev_mut(bdev).resident += CHUNK;
            let target = vas.first().map(|va| va + i as u64 * CHUNK);
            st.mark(id, i);
            let c = st.chunk_mut(id, i);
            c.phys = phys;
            c.prefetched = false;
            c.pins += 1;
            reserved.push((id, i));
            self.c.faults_in.fetch_add(1, Relaxed);
            if took {
                // whatever fills it (a copy-in, the call itself) comes after
                // the copy-out still reading this HBM: the call waits for
                // u3m's stream, which waits for that copy
                filled.push((id, i));
            }
            if whole && c.host.is_some() {
                // overwritten entirely: no copy-in; the host copy stays the
                // chunk's contents until the call succeeds (`finish` drops
                // it then, or puts the chunk back if the call fails)
                self.c.overwrites.fetch_add(1, Relaxed);
                c.dirty = true;
                c.unfilled = true;
                continue;
            }
            let Some(target) = target else {
                // a VMM handle mapped nowhere: its data stays in the host copy
                // until it is mapped; resident now only to satisfy export
                c.dirty = c.host.is_none();
                continue;
            };
            let stream = match self.dev_stream(st, dev) {
                Ok(s) => s,
                Err(e) => {
                    self.undo_fault_in(st, id, i, reserved);
                    return Err(e.into());
                }
            };
            let c = st.chunk_mut(id, i);
            match &c.host {
                None => {
                    // fresh memory: nothing to copy
                    c.dirty = true;
                    self.c.first_touches.fetch_add(1, Relaxed);
                    // U3M_HANDOFF: taken HBM holds the bytes of the chunk
                    // whose copy-out reads it, where a first touch reads
                    // fresh memory (the runtime's; zeros on the simulator).
                    // A call that writes it whole overwrites them (if it
                    // fails, the chunk goes back to no memory: `unfilled`);
                    // else u3m zeroes it on its stream, after that copy-out
                    // and before the call (`filled`).
                    if took && whole {
                        c.unfilled = true;
                    } else if took {
                        if let Err(e) = self.rt.memset_async(target, CHUNK, 0, stream) {
                            self.undo_fault_in(st, id, i, reserved);
                            return Err(e.into());
                        }
                        self.c.zeroed.fetch_add(1, Relaxed);
                    }
                }
                Some(Host::Dram(slot)) => {
                    let src = slot.ptr as u64;
                    if let Err(e) =
                        self.rt
                            .memcpy_async(target, src, CHUNK, MemcpyKind::HOST_TO_DEVICE, stream)
                    {
                        self.undo_fault_in(st, id, i, reserved);
                        return Err(e.into());
                    }
                    let c = st.chunk_mut(id, i);
                    c.dirty = false;
                    if !took {
                        filled.push((id, i));
                    }
                    st.note_move(id, i, MoveKind::In { demand: true });
                    self.c.fault_bytes.fetch_add(CHUNK, Relaxed);
                }
                Some(Host::Nvme(_)) => {
                    // a staging buffer of this copy's own: no wait for an
                    // earlier copy-in still reading a shared one
                    let staging = match self.stage_from_nvme(st, dev, id, i) {
                        Ok(s) => s,
                        Err(e) => {
                            self.undo_fault_in(st, id, i, reserved);
                            return Err(e);
                        }
                    };
                    if let Err(e) = self.rt.memcpy_async(
                        target,
                        staging,
                        CHUNK,
                        MemcpyKind::HOST_TO_DEVICE,
                        stream,
                    ) {
                        self.give_staging(st, dev, staging);
                        self.undo_fault_in(st, id, i, reserved);
                        return Err(e.into());
                    }
                    // the buffer is spare again once the copy has read it
                    match self.use_event(st, stream) {
                        Some(ev) => st.dev_mut(dev).staging_busy.push((ev, staging)),
                        None => {
                            // no event to know when (a failing runtime)
                            let _ = self.rt.sync_stream(stream);
                            self.give_staging(st, dev, staging);
                        }
                    }
                    st.chunk_mut(id, i).dirty = false;
                    if !took {
                        filled.push((id, i));
                    }
                    st.note_move(id, i, MoveKind::In { demand: true });
                    self.c.from_nvme.fetch_add(1, Relaxed);
                    self.c.fault_bytes.fetch_add(CHUNK, Relaxed);
                }
            }
        }
        Ok(())
    }

    // ----------------------------------------------------------- copy-out

    /// Moves one resident chunk out of HBM: a clean one (a current host copy
    /// exists) is unmapped and freed now; a dirty one is copied out
    /// asynchronously (freed by a later `harvest`), at once only when no
    /// event can tell when it lands.
    pub(super) fn evict(&self, st: &mut State, id: u64, i: u32) -> Result<(), Fail> {
        // Neither path orders itself after the program's work: a dropped
        // chunk's HBM goes to the next chunk at once, and the copy-out runs
        // on u3m's stream reading the chunk now. So a chunk still in use is
        // refused (Busy, its use named to wait for) rather than copied out
        // before an operator's writes land or handed over under a running
        // read. Every caller asks first; this keeps a new one honest.
        if let Some(&(_, ev)) = st
            .chunk(id, i)
            .uses
            .iter()
            .find(|&&(_, ev)| !self.rt.event_done(ev).unwrap_or(true))
        {
            // (nor a chunk mapped unfilled: it leaves only by a drop, below
            // or through `fault_in` — never with a copy-out in flight)
            if !self.may_order_after_program()
                || !matches!(st.backings[&id].kind, Kind::Malloc)
                || st.chunk(id, i).unfilled
            {
                st.wait_for = Some(ev);
                return Err(Fail::Busy);
            }
            // U3M_HANDOFF: u3m's device-to-host stream waits for the uses on
            // the device; the copy-out (or, clean, a mark) follows there
            return self.evict_ordered(st, id, i);
        }
        // (the policy's prediction now, for a tool's move log)
        let next = st
            .moves
            .is_some()
            .then(|| self.policy.next_use(st.clock, st.backings[&id].key(id, i)));
        if !st.chunk(id, i).needs_copy_out() {
            if let Some(next) = next {
                st.note_move(id, i, MoveKind::Out { dirty: false, next });
            }
            self.c.clean_drops.fetch_add(1, Relaxed);
            self.release_chunk(st, id, i);
            return Ok(());
        }
        let out = self.start_copy_out(st, id, i)?;
        if let Some(next) = next {
            st.note_move(id, i, MoveKind::Out { dirty: true, next });
        }
        self.queue_copy_out(st, id, i, out)
    }

    /// A copy-out started (`start_copy_out`) becomes chunk (id, i)'s
    /// `Outgoing`, its HBM freed when it lands (`harvest`) — or, with no
    /// event to know when that is, waited for now.
    fn queue_copy_out(&self, st: &mut State, id: u64, i: u32, out: CopyOut) -> Result<(), Fail> {
        let Some(ev) = self.use_event(st, out.stream) else {
            self.complete_copy_out(st, out)?;
            self.c.eviction_bytes.fetch_add(CHUNK, Relaxed);
            self.release_chunk(st, id, i);
            return Ok(());
        };
        let dev = st.backings[&id].dev;
        st.chunk_mut(id, i).out_ev = ev;
        st.mark(id, i);
        st.dev_mut(dev).outgoing.push_back(Outgoing {
            id,
            i,
            slot: Some(out.slot),
            ev,
            staging: out.staging,
            va: out.scratch.unwrap_or(0),
            taken: 0,
            taken_va: 0,
        });
        Ok(())
    }

    /// Whether u3m's streams may wait on the device for the program's work
    /// (U3M_HANDOFF's ordered evictions, and the copy-ins ordered after
    /// them by `take_outgoing`). u3m waits for its own streams with a
    /// device's lock held in places (`settle_outgoing`, a synchronous
    /// fault-in, freeing taken memory): such a wait then waits for program
    /// work too, which must not need this host. It does not as long as the
    /// program has queued nothing that waits for the host — a host function
    /// or callback (it may call the runtime, which u3m hooks), a value or
    /// notify wait (another thread's later write or record releases it):
    /// the hooks of those set `host_waits` (`program_waits_on_host`) before
    /// the work is queued, and from then on evictions of chunks in use wait
    /// for the uses on the host, without the lock, as without U3M_HANDOFF.
    /// (An event wait orders after the record already made, never a later
    /// one: no host dependency.)
    #[inline]
    pub(super) fn may_order_after_program(&self) -> bool {
        self.handoff && !self.host_waits.load(SeqCst)
    }

    /// `evict` of a chunk still in use (U3M_HANDOFF): u3m's device-to-host
    /// stream waits for its pending uses, then copies it out (dirty) or
    /// records a mark (clean) — an `Outgoing` either way, its HBM freed
    /// when that lands or taken before (`take_outgoing`).
    fn evict_ordered(&self, st: &mut State, id: u64, i: u32) -> Result<(), Fail> {
        let dev = st.backings[&id].dev;
        let out = self.out_stream(st, dev)?;
        let pending: Vec<u64> = st
            .chunk(id, i)
            .uses
            .iter()
            .map(|u| u.1)
            .filter(|&ev| !self.rt.event_done(ev).unwrap_or(true))
            .collect();
        for &ev in &pending {
            self.rt.stream_wait(out, ev)?;
        }
        if st.chunk(id, i).needs_copy_out() {
            let o = self.start_copy_out(st, id, i)?;
            self.queue_copy_out(st, id, i, o)?;
        } else {
            // clean: its host copy is current; the mark says when the uses
            // are done with its HBM
            let Some(ev) = self.use_event(st, out) else {
                st.wait_for = pending.first().copied();
                return Err(Fail::Busy);
            };
            self.c.clean_drops.fetch_add(1, Relaxed);
            st.chunk_mut(id, i).out_ev = ev;
            st.mark(id, i);
            st.dev_mut(dev).outgoing.push_back(Outgoing {
                id,
                i,
                slot: None,
                ev,
                staging: 0,
                va: 0,
                taken: 0,
                taken_va: 0,
            });
        }
        self.c.ordered_outs.fetch_add(1, Relaxed);
        Ok(())
    }

    /// U3M_HANDOFF: the HBM of the oldest copy-out of `dev` still in flight
    /// (an allocation's chunk landing in DRAM), for a copy-in — instead of
    /// the host waiting for it to land. u3m's host-to-device stream waits
    /// for that copy-out on the device, so whatever the copy-ins issued
    /// after this write lands after it has read the chunk. The chunk leaves
    /// HBM now (not resident, no rescue: a call that needs it waits for the
    /// copy and faults it back in), still mapped at its VA for the copy
    /// (`Outgoing::taken_va`, dropped when the copy is complete:
    /// `drop_taken_va`). None: nothing to take.
    pub(super) fn take_outgoing(&self, st: &mut State, dev: u32) -> Option<u64> {
        let ok = |o: &Outgoing| {
            o.taken == 0
                && o.staging == 0
                && o.va == 0
                && st
                    .backings
                    .get(&o.id)
                    .filter(|b| matches!(b.kind, Kind::Malloc))
                    .and_then(|b| b.chunks.get(o.i as usize))
                    .is_some_and(|c| c.out_ev == o.ev && c.phys != 0)
        };
        let k = st.dev(dev).outgoing.iter().position(ok)?;
        let (id, i, ev) = {
            let o = &st.dev(dev).outgoing[k];
            (o.id, o.i, o.ev)
        };
        let stream = self.dev_stream(st, dev).ok()?;
        self.rt.stream_wait(stream, ev).ok()?;
        st.mark(id, i);
        let va = st.backings[&id].vas[0] + i as u64 * CHUNK;
        let c = st.chunk_mut(id, i);
        let phys = std::mem::take(&mut c.phys);
        st.dev_mut(dev).resident -= CHUNK;
        let o = &mut st.dev_mut(dev).outgoing[k];
        o.taken = phys;
        o.taken_va = va;
        self.c.handoffs.fetch_add(1, Relaxed);
        Some(phys)
    }

    /// A taken copy-out's chunk (`take_outgoing`) after its copy landed
    /// (its HBM is another chunk's, its old mapping already dropped:
    /// `drop_taken_va`): as `release_chunk`, without freeing anything.
    fn release_taken(&self, st: &mut State, id: u64, i: u32) {
        let dev = st.backings[&id].dev;
        let c = st.chunk_mut(id, i);
        c.dirty = false;
        c.discarded = false;
        self.left_hbm(st, dev, id, i);
    }

    /// Completes copy-outs of `dev` whose events are done, oldest first,
    /// until `limit` of them freed HBM: the slot becomes the chunk's host
    /// copy and the chunk's HBM is unmapped and freed (one whose HBM a
    /// copy-in took, `take_outgoing`, frees none and does not count: a
    /// caller that wants one chunk of HBM would otherwise give up behind
    /// it). Never waits. A copy-out whose chunk was
    /// taken back (`rescue`) or freed meanwhile only gives its slot back.
    pub(super) fn harvest(&self, st: &mut State, dev: u32, limit: usize) {
        let mut last = None;
        let mut freed = 0;
        while let Some(o) = st.dev(dev).outgoing.front() {
            if freed >= limit {
                break;
            }
            let ev = o.ev;
            // an error (the device is gone): nothing more lands
            let failed = match self.rt.event_done(ev) {
                Ok(true) => false,
                Ok(false) => break,
                Err(_) => true,
            };
            let mut o = st.dev_mut(dev).outgoing.pop_front().expect("front");
            // the copy no longer reads the chunk: its VA goes before the
            // chunk's memory may (`release_chunk`)
            self.drop_copy_va(st, dev, Some(o.va));
            self.drop_taken_va(&mut o, false);
            let current = st
                .backings
                .get(&o.id)
                .and_then(|b| b.chunks.get(o.i as usize))
                .map(|c| c.out_ev == ev && (c.phys != 0 || o.taken != 0))
                .unwrap_or(false);
            if let Some(c) = st
                .backings
                .get_mut(&o.id)
                .and_then(|b| b.chunks.get_mut(o.i as usize))
                .filter(|c| c.out_ev == ev)
            {
                c.out_ev = 0;
            }
            st.mark(o.id, o.i);
            let clean = o.slot.is_none();
            let landed = match o.slot {
                // a clean chunk's host copy is current: nothing lands
                None => current,
                Some(slot) if current && !failed => match self.land(st, dev, slot, o.staging) {
                    Some(host) => {
                        st.chunk_mut(o.id, o.i).host = Some(host);
                        true
                    }
                    None => false,
                },
                Some(slot) => {
                    st.free_host(slot);
                    self.give_staging(st, dev, o.staging);
                    false
                }
            };
            if landed {
                if !clean {
                    self.c.eviction_bytes.fetch_add(CHUNK, Relaxed);
                }
                if o.taken != 0 {
                    // (its HBM is another chunk's: nothing freed)
                    self.release_taken(st, o.id, o.i);
                } else {
                    self.release_chunk(st, o.id, o.i);
                    freed += 1;
                }
                if let Some(prev) = last.replace(ev) {
                    st.unref_event(prev);
                }
            } else {
                // (a copy-out with nowhere to land keeps the chunk in HBM,
                // dirty: its data is there — unless its HBM was taken: then
                // its data is gone, and said so rather than read as zeros)
                if current && o.taken != 0 {
                    self.taken_lost(st, o.id, o.i);
                }
                st.unref_event(ev);
            }
        }
        // The HBM just freed may take a copy-in on u3m's other stream at
        // once; on a device whose event status runs ahead of its clock (the
        // simulator) that copy must still start after the copy-out ended.
        // (Not where the runtime orders it by its memory: under `u3m
        // replay`'s hand-over models the wait would hold every later
        // copy-in, and the calls waiting for them, behind this copy-out.)
        if let Some(ev) = last {
            let stream = st.dev(dev).stream;
            if stream != 0 && !self.rt.orders_pages() {
                let _ = self.rt.stream_wait(stream, ev);
            }
            st.unref_event(ev);
        }
    }

    /// Waits for every copy-out of `dev` and completes them (the lock is
    /// held: u3m's device-to-host stream holds only copies, so the wait
    /// cannot depend on work the host has yet to issue). For the paths that
    /// free or replace memory, not for calls.
    pub(super) fn settle_outgoing(&self, st: &mut State, dev: u32) {
        if st.dev(dev).outgoing.is_empty() {
            return;
        }
        // copy-outs that have all landed (finalize synchronised the stream
        // before taking the lock) need no wait with the lock held
        let landed = st
            .dev(dev)
            .outgoing
            .iter()
            .all(|o| self.rt.event_done(o.ev).unwrap_or(false));
        if !landed {
            let s = st.dev(dev).out_stream;
            let _ = self.rt.sync_stream(s);
        }
        self.harvest(st, dev, usize::MAX);
        // what did not complete (a failing device) gives its slots back
        while let Some(mut o) = st.dev_mut(dev).outgoing.pop_front() {
            self.drop_copy_va(st, dev, Some(o.va));
            self.drop_taken_va(&mut o, false);
            if o.taken != 0
                && st
                    .backings
                    .get(&o.id)
                    .and_then(|b| b.chunks.get(o.i as usize))
                    .is_some_and(|c| c.out_ev == o.ev)
            {
                self.taken_lost(st, o.id, o.i);
            }
            if let Some(c) = st
                .backings
                .get_mut(&o.id)
                .and_then(|b| b.chunks.get_mut(o.i as usize))
                .filter(|c| c.out_ev == o.ev)
            {
                c.out_ev = 0;
            }
            st.mark(o.id, o.i);
            if let Some(slot) = o.slot {
                st.free_host(slot);
            }
            self.give_staging(st, dev, o.staging);
            st.unref_event(o.ev);
        }
    }

    /// `settle_outgoing` without the lock across the wait: waits for the
    /// copy-outs of `dev` in flight now (u3m's device-to-host stream holds
    /// only copies: the wait needs nothing of the host) — or, `named`, for
    /// what a Busy named instead (`st.wait_for`: a copy-out, a fence of
    /// deferred slots, a staging buffer's copy-in, a use), as `prepare`
    /// does — each event held by a reference meanwhile so it is not
    /// pooled and recorded again; then retakes the lock and completes what
    /// landed (`harvest`; a chunk taken back or freed meanwhile only gives
    /// its slot back). Returns the guard, and false when there was nothing
    /// to wait for.
    pub(super) fn wait_unlocked<'a>(
        &'a self,
        mut st: StGuard<'a>,
        dev: u32,
        named: bool,
    ) -> (StGuard<'a>, bool) {
        // (not named: what a Busy named stays for `wait_busy`)
        let wait = if named { st.wait_for.take() } else { None };
        let mut evs: Vec<u64> = match wait {
            Some(ev) => vec![ev],
            None => st.dev(dev).outgoing.iter().map(|o| o.ev).collect(),
        };
        evs.retain(|ev| st.event_refs.contains_key(ev));
        if evs.is_empty() {
            return (st, false);
        }
        for &ev in &evs {
            *st.event_refs.entry(ev).or_insert(0) += 1;
        }
        let mut st = self.sync_unlocked(st, None, evs);
        self.harvest(&mut st, dev, usize::MAX);
        (st, true)
    }

    /// Waits for `evs` — each holding a reference taken under the lock, so
    /// none goes back to the pool and is recorded again meanwhile — with
    /// the lock dropped (on device `on` when given: switched to it for the
    /// wait, or waited for from here if the switch fails), then retakes the
    /// lock and drops the references.
    pub(super) fn sync_unlocked<'a>(
        &'a self,
        st: StGuard<'a>,
        on: Option<u32>,
        evs: Vec<u64>,
    ) -> StGuard<'a> {
        drop(st);
        for &ev in &evs {
            let switched = on.and_then(|d| on_device(self.rt, d, || self.rt.sync_event(ev)));
            if switched.is_none() {
                let _ = self.rt.sync_event(ev);
            }
        }
        let mut st = match self.st.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        for ev in evs {
            st.unref_event(ev);
        }
        st
    }

    /// Unpins the chunks `fault_in` reserved.
    pub(super) fn unreserve(&self, st: &mut State, reserved: &mut Vec<(u64, u32)>) {
        self.unpin_reserved(st, reserved, false);
    }

    /// A call's reservations dropped because it fails before it runs: a
    /// chunk mapped unfilled for it (`Chunk::unfilled`) and now unpinned
    /// goes back at once, as a failed call's does (`unfilled_back`).
    pub(super) fn release_reserved(&self, st: &mut State, reserved: &mut Vec<(u64, u32)>) {
        self.unpin_reserved(st, reserved, true);
    }

    /// `unreserve`, and with `give_back` `release_reserved`.
    #[inline(always)]
    fn unpin_reserved(&self, st: &mut State, reserved: &mut Vec<(u64, u32)>, give_back: bool) {
        for (id, i) in reserved.drain(..) {
            let mut back = false;
            if let Some(c) = st
                .backings
                .get_mut(&id)
                .and_then(|b| b.chunks.get_mut(i as usize))
            {
                c.pins = c.pins.saturating_sub(1);
                back = give_back && c.pins == 0 && c.unfilled;
                if back {
                    c.unfilled = false;
                }
            }
            st.mark(id, i);
            if back {
                self.unfilled_back(st, id, i);
            }
        }
    }

    /// Whether `ev` marks one of u3m's copy-outs (it completes without any
    /// work of the host's).
    pub(super) fn is_copy_out(&self, st: &State, ev: u64) -> bool {
        st.devs
            .iter()
            .any(|d| d.outgoing.iter().any(|o| o.ev == ev))
    }

    /// A call needs chunk (id, i) while its copy-out is in flight: it stays
    /// in HBM (still dirty); the copy's slot is given back when it lands.
    #[inline]
    pub(super) fn rescue(&self, st: &mut State, id: u64, i: u32) {
        st.chunk_mut(id, i).out_ev = 0;
        st.mark(id, i);
        self.c.rescued.fetch_add(1, Relaxed);
    }

    /// Unmaps a copy-out's own VA (`Outgoing::va`; None or 0: none) and
    /// keeps it spare. Only once nothing reads it: its copy is complete, or
    /// never issued.
    pub(super) fn drop_copy_va(&self, st: &mut State, dev: u32, va: Option<u64>) {
        if let Some(va) = va.filter(|&v| v != 0) {
            let _ = self.rt.unmap(va);
            self.give_move_va(st, dev, va);
        }
    }

    /// Before backing `id`'s chunk memory goes (a free, an export): its
    /// copy-outs, which read its chunks at VAs of u3m's own, are complete
    /// (waited for here, with the lock held, only if the caller's unlocked
    /// wait could not be done) and their VAs unmapped. Their slots are
    /// given back when they are harvested (the chunks have no memory then).
    pub(super) fn drop_copy_vas_of(&self, st: &mut State, dev: u32, id: u64) {
        let outs: Vec<(u64, u64)> = st
            .dev_mut(dev)
            .outgoing
            .iter_mut()
            .filter(|o| o.id == id && o.va != 0)
            .map(|o| (o.ev, std::mem::take(&mut o.va)))
            .collect();
        for (ev, va) in outs {
            if !self.rt.event_done(ev).unwrap_or(true) {
                let _ = self.rt.sync_event(ev);
            }
            self.drop_copy_va(st, dev, Some(va));
        }
        // chunks whose HBM a copy-in took (`take_outgoing`) are still mapped
        // at the allocation's VA for their copies: unmapped once those are
        // complete (normally waited for already, `wait_copies_of`), before
        // the VA goes
        for o in st.dev_mut(dev).outgoing.iter_mut().filter(|o| o.id == id) {
            self.drop_taken_va(o, true);
        }
    }

    /// Drops a taken copy-out's old mapping of its HBM
    /// (`Outgoing::taken_va`, if still there) once the copy no longer reads
    /// it. `wait`: the copy may still run, and is waited for first (lock
    /// held: see `free_phys`); else it has completed or will not run.
    fn drop_taken_va(&self, o: &mut Outgoing, wait: bool) {
        let va = std::mem::take(&mut o.taken_va);
        if va != 0 {
            if wait && !self.rt.event_done(o.ev).unwrap_or(true) {
                let _ = self.rt.sync_event(o.ev);
            }
            let _ = self.rt.unmap(va);
        }
    }

    /// Issues the copy of chunk (id, i) to a host slot on u3m's stream.
    fn start_copy_out(&self, st: &mut State, id: u64, i: u32) -> Result<CopyOut, Fail> {
        let (dev, first) = {
            let b = &st.backings[&id];
            (b.dev, b.vas.first().copied())
        };
        // where the data can be read from on the device: an allocation's
        // VA stays mapped until the copy lands (freeing it settles first);
        // a VMM handle's VAs are the program's to unmap at any time, so its
        // chunk is read at a VA of u3m's own, one per copy in flight
        let (src, scratch) = match (first, &st.backings[&id].kind) {
            (Some(va), Kind::Malloc) => (va + i as u64 * CHUNK, None),
            _ => {
                let va = self.take_move_va(st, dev)?;
                if let Err(e) = self.map_retrying(va, CHUNK, st.chunk(id, i).phys) {
                    self.give_move_va(st, dev, va);
                    return Err(e.into());
                }
                (va, Some(va))
            }
        };
        let slot = match self.host_slot(st, id, i) {
            Ok(s) => s,
            Err(e) => {
                self.drop_copy_va(st, dev, scratch);
                return Err(e);
            }
        };
        let (dst, staging) = match &slot {
            Host::Dram(s) => (s.ptr as u64, 0),
            // a buffer of this copy's own, written out to the slot when the
            // copy has landed (`land`)
            Host::Nvme(_) => match self.take_staging(st, dev) {
                Ok(staging) => (staging, staging),
                Err(e) => {
                    st.free_host(slot);
                    self.drop_copy_va(st, dev, scratch);
                    return Err(e);
                }
            },
        };
        let stream = match self.out_stream(st, dev) {
            Ok(s) => s,
            Err(e) => {
                st.free_host(slot);
                self.give_staging(st, dev, staging);
                self.drop_copy_va(st, dev, scratch);
                return Err(e.into());
            }
        };
        if let Err(e) = self
            .rt
            .memcpy_async(dst, src, CHUNK, MemcpyKind::DEVICE_TO_HOST, stream)
        {
            st.free_host(slot);
            self.give_staging(st, dev, staging);
            self.drop_copy_va(st, dev, scratch);
            return Err(e.into());
        }
        Ok(CopyOut {
            id,
            i,
            slot,
            staging,
            stream,
            scratch,
        })
    }

    /// Waits for an issued copy-out and makes its slot the chunk's host copy
    /// (`land`). With the lock held: only when no event can tell when it
    /// lands (a failing runtime).
    fn complete_copy_out(&self, st: &mut State, out: CopyOut) -> Result<(), AclError> {
        let CopyOut {
            id,
            i,
            slot,
            staging,
            stream,
            scratch,
        } = out;
        let dev = st.backings[&id].dev;
        if let Err(e) = self.rt.sync_stream(stream) {
            st.free_host(slot);
            self.give_staging(st, dev, staging);
            return Err(e);
        }
        let landed = self.land(st, dev, slot, staging);
        self.drop_copy_va(st, dev, scratch);
        st.mark(id, i);
        st.chunk_mut(id, i).host = Some(landed.ok_or(E_ALLOC)?);
        Ok(())
    }

    /// A copy-out that landed in `slot` (an NVMe slot: in the staging
    /// buffer `staging`, written out to the slot now, the buffer spare
    /// again): the host copy it makes, or None when it has nowhere to go
    /// (the NVMe write failed and DRAM is full: the data stays in HBM).
    fn land(&self, st: &mut State, dev: u32, slot: Host, staging: u64) -> Option<Host> {
        let host = match slot {
            Host::Dram(s) => {
                self.c.to_dram.fetch_add(1, Relaxed);
                Some(Host::Dram(s))
            }
            Host::Nvme(s) => {
                let buf =
                    unsafe { std::slice::from_raw_parts(staging as *const u8, CHUNK as usize) };
                let w = st
                    .nvme
                    .as_mut()
                    .map(|n| n.write(&s, buf))
                    .unwrap_or(Err(StoreError::BadSlot));
                match w {
                    Ok(()) => {
                        self.c.to_nvme.fetch_add(1, Relaxed);
                        Some(Host::Nvme(s))
                    }
                    Err(_) => {
                        // disk full or I/O error: keep the data in DRAM
                        self.c.spill_errors.fetch_add(1, Relaxed);
                        if let Some(n) = st.nvme.as_mut() {
                            let _ = n.free(s);
                        }
                        st.dram.alloc(CHUNK).ok().map(|ds| {
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    staging as *const u8,
                                    ds.ptr,
                                    CHUNK as usize,
                                )
                            };
                            self.c.to_dram.fetch_add(1, Relaxed);
                            Host::Dram(ds)
                        })
                    }
                }
            }
        };
        self.give_staging(st, dev, staging);
        host
    }

    /// Chunk (id, i) out of HBM: unmapped at every VA, its physical memory
    /// freed, no longer counted resident; its host copy (if any) is now its
    /// only one. Returns its device.
    fn drop_hbm(&self, st: &mut State, id: u64, i: u32) -> u32 {
        let dev = self.unmap_and_free(st, id, i);
        st.dev_mut(dev).resident -= CHUNK;
        dev
    }

    /// Chunk (id, i)'s memory unmapped at every VA and freed; not dirty
    /// (its host copy, if any, is its only one). Returns its device.
    fn unmap_and_free(&self, st: &mut State, id: u64, i: u32) -> u32 {
        let (dev, vas) = {
            let b = &st.backings[&id];
            (b.dev, b.vas.clone())
        };
        for &va in &vas {
            let _ = self.rt.unmap(va + i as u64 * CHUNK);
        }
        st.mark(id, i);
        let phys = std::mem::take(&mut st.chunk_mut(id, i).phys);
        self.free_phys(st, dev, phys);
        let c = st.chunk_mut(id, i);
        c.dirty = false;
        c.discarded = false;
        c.unfilled = false;
        dev
    }

    /// Frees a chunk's memory `phys` of `dev` — once no copy-out reads it
    /// at its former chunk's VA (U3M_HANDOFF: `take_outgoing` gave it on
    /// while that copy was in flight): the copy is waited for, the lock
    /// held (normally complete already: the program's own work on the chunk
    /// now holding `phys` came after it), and that mapping goes first.
    /// Every path that gives a chunk's HBM back goes through here.
    pub(super) fn free_phys(&self, st: &mut State, dev: u32, phys: u64) {
        let outgoing = &mut st.dev_mut(dev).outgoing;
        if let Some(o) = outgoing.iter_mut().find(|o| phys != 0 && o.taken == phys) {
            self.drop_taken_va(o, true);
        }
        let _ = self.rt.free_physical(phys);
    }

    /// A chunk mapped unfilled for a call that failed (`Chunk::unfilled`):
    /// its memory, which holds nothing of it, is given back and its host
    /// copy is again its only copy, as before the call — or, with none (a
    /// first touch given a copy-out's HBM: `fault_in_chunks`), it has no
    /// memory anywhere again and reads as fresh memory.
    pub(super) fn unfilled_back(&self, st: &mut State, id: u64, i: u32) {
        let c = st.chunk(id, i);
        if c.phys == 0 {
            return;
        }
        if c.on_host {
            let dev = self.unmap_and_free(st, id, i);
            st.chunk_mut(id, i).on_host = false;
            st.dev_mut(dev).host_mapped -= CHUNK;
        } else {
            self.drop_hbm(st, id, i);
        }
        let uses: Vec<u64> = st.chunk_mut(id, i).uses.drain(..).map(|u| u.1).collect();
        for ev in uses {
            st.unref_event(ev);
        }
    }

    /// A copy-in that could not be issued: chunk (id, i) goes back to where
    /// it was — out of HBM, its host copy the only one, unpinned — so no
    /// call reads the fresh HBM it was given as if it held the chunk's data
    /// (the soak test read zeros there after an injected copy failure).
    pub(super) fn undo_fault_in(
        &self,
        st: &mut State,
        id: u64,
        i: u32,
        reserved: &mut Vec<(u64, u32)>,
    ) {
        self.drop_hbm(st, id, i);
        let c = st.chunk_mut(id, i);
        c.pins = c.pins.saturating_sub(1);
        if let Some(k) = reserved.iter().rposition(|&r| r == (id, i)) {
            reserved.remove(k);
        }
    }

    /// The chunk leaves HBM: unmapped at every VA, its physical memory freed,
    /// its uses forgotten (all complete: eviction waited for them).
    fn release_chunk(&self, st: &mut State, id: u64, i: u32) {
        let dev = self.drop_hbm(st, id, i);
        self.left_hbm(st, dev, id, i);
    }

    /// A taken copy-out's chunk whose copy did not land (a failing
    /// device): its only data was in the HBM now another chunk's. Marked
    /// lost (`read_lost` refuses it) and never served as fresh memory.
    fn taken_lost(&self, st: &mut State, id: u64, i: u32) {
        let c = st.chunk_mut(id, i);
        c.out_ev = 0;
        c.lost = true;
        c.dirty = false;
        st.mark(id, i);
    }

    /// What a chunk's leaving HBM settles: its uses forgotten (all
    /// complete: eviction waited for them), the counters, the look-ahead's
    /// books.
    fn left_hbm(&self, st: &mut State, dev: u32, id: u64, i: u32) {
        let c = st.chunk_mut(id, i);
        let wasted = std::mem::take(&mut c.prefetched);
        let uses: Vec<u64> = c.uses.drain(..).map(|u| u.1).collect();
        for ev in uses {
            st.unref_event(ev);
        }
        self.c.evictions.fetch_add(1, Relaxed);
        self.crowd();
        if wasted {
            self.c.prefetch_wasted.fetch_add(1, Relaxed);
            self.ahead_wasted(st, dev);
        }
        let key = st.backings[&id].key(id, i);
        self.ahead_note_left(st, dev, key);
    }

    // --------------------------------------------------------- host slots

    /// A host slot for chunk (id, i): its existing (stale) one, else NVMe if
    /// the policy places it there, else DRAM below 95 % full, else NVMe,
    /// else DRAM anyway.
    /// DRAM short with deferred DRAM slots still behind a fence (u3m's
    /// copies that may read them not done yet) that would make the room:
    /// Busy with `st.wait_for` naming the fence — the caller waits for it
    /// without the lock and tries again (where `reclaim_wait` synchronised
    /// u3m's stream with the lock held).
    fn host_slot(&self, st: &mut State, id: u64, i: u32) -> Result<Host, Fail> {
        st.mark(id, i);
        if let Some(h) = st.chunk_mut(id, i).host.take() {
            return Ok(h);
        }
        // deferred slots whose copies completed go back (never waits)
        self.reclaim(st);
        // a chunk the policy places on NVMe (seed-heat: below the DRAM
        // threshold; markov: predicted cold) bypasses DRAM
        let key = st.backings[&id].key(id, i);
        if self.policy.place(st.clock, key) == Some(Place::Nvme) {
            if let Some(n) = st.nvme.as_mut() {
                if let Ok(s) = n.alloc(CHUNK) {
                    return Ok(Host::Nvme(s));
                }
            }
        }
        let limit = (self.dram_limit as f64 * 0.95) as u64;
        let dram_ok = st.dram.used() + CHUNK <= limit;
        if !dram_ok {
            // worth a wait only if the fenced DRAM slots make the room (else
            // NVMe, or DRAM anyway, below)
            let fenced = st
                .fenced_free
                .iter()
                .filter(|f| matches!(f.2, Host::Dram(_)))
                .count() as u64;
            if st.dram.used().saturating_sub(fenced * CHUNK) + CHUNK <= limit
                && self.wait_fenced(st)
            {
                return Err(Fail::Busy);
            }
        }
        if dram_ok {
            if let Ok(s) = st.dram.alloc(CHUNK) {
                return Ok(Host::Dram(s));
            }
        }
        if let Some(n) = st.nvme.as_mut() {
            match n.alloc(CHUNK) {
                Ok(s) => return Ok(Host::Nvme(s)),
                Err(_) => self.c.spill_errors.fetch_add(1, Relaxed),
            };
        }
        if let Ok(s) = st.dram.alloc(CHUNK) {
            return Ok(Host::Dram(s));
        }
        // full: the clean copies of resident chunks make room (given back
        // at once if u3m's stream is idle, else behind a fence: then wait)
        if self.drop_duplicates(st, 64 * CHUNK) > 0 {
            if let Ok(s) = st.dram.alloc(CHUNK) {
                return Ok(Host::Dram(s));
            }
            if self.wait_fenced(st) {
                return Err(Fail::Busy);
            }
        }
        Err(Fail::Acl(E_ALLOC))
    }

    /// Names the oldest fence deferred host slots (DRAM ones first) wait
    /// behind in `st.wait_for` (for the caller to wait for without the lock); false
    /// when none is pending.
    fn wait_fenced(&self, st: &mut State) -> bool {
        let ev = st
            .fenced_free
            .iter()
            .find(|f| matches!(f.2, Host::Dram(_)))
            .or(st.fenced_free.first())
            .map(|f| f.0);
        if ev.is_some() {
            st.wait_for = ev;
        }
        ev.is_some()
    }

    /// Gives back up to `bytes` of DRAM held as clean copies of resident
    /// chunks (they become dirty: their next eviction copies out). Returns
    /// the bytes freed.
    fn drop_duplicates(&self, st: &mut State, bytes: u64) -> u64 {
        let mut dropped = Vec::new();
        let mut freed = 0u64;
        'outer: for b in st.backings.values_mut() {
            for c in b.chunks.iter_mut() {
                if freed >= bytes {
                    break 'outer;
                }
                if c.phys != 0 && !c.dirty && matches!(c.host, Some(Host::Dram(_))) {
                    if let Some(h) = c.host.take() {
                        dropped.push((b.dev, h));
                        c.dirty = true;
                        freed += CHUNK;
                    }
                }
            }
        }
        if dropped.is_empty() {
            return 0;
        }
        // resident chunks dirty again, anywhere: the victim orders walk
        st.structure += 1;
        // a queued copy-in may still read these slots: given back behind a
        // fence on u3m's stream (now if it is idle; never waits)
        st.pending_free.extend(dropped);
        self.reclaim(st);
        freed
    }

    /// Gives back deferred host slots once no issued copy can read them,
    /// never waiting (the device's lock is held): a slot is read only by
    /// copy-ins on its chunk's device's u3m stream, so each device's slots
    /// are put behind an event recorded on that stream now (`Fenced`
    /// records on a stream's own device whichever thread asks) and given
    /// back — now if the stream is idle, else by a later reclaim that finds
    /// the event complete (`fenced_free`). Without an event, `reclaim_wait`.
    pub(super) fn reclaim(&self, st: &mut State) {
        if !st.fenced_free.is_empty() {
            self.free_fenced(st);
        }
        if st.pending_free.is_empty() {
            return;
        }
        // each round takes the first entry's device's slots out of the list
        while let Some(&(d, _)) = st.pending_free.first() {
            let stream = st.devs.get(d as usize).map(|x| x.stream).unwrap_or(0);
            if stream == 0 {
                // u3m never copied in on this device
                let (_, h) = st.pending_free.swap_remove(0);
                st.free_host(h);
                continue;
            }
            let Some(ev) = self.use_event(st, stream) else {
                return self.reclaim_wait(st);
            };
            // the event's creation reference goes to the first entry
            let mut refs = 0u32;
            let mut j = 0;
            while j < st.pending_free.len() {
                if st.pending_free[j].0 == d {
                    let (_, h) = st.pending_free.swap_remove(j);
                    st.fenced_free.push((ev, d, h));
                    refs += 1;
                } else {
                    j += 1;
                }
            }
            if let Some(r) = st.event_refs.get_mut(&ev) {
                *r += refs.saturating_sub(1);
            }
        }
        self.free_fenced(st);
    }

    /// Gives back the fenced slots whose event is complete (or failed:
    /// nothing more runs on that stream).
    fn free_fenced(&self, st: &mut State) {
        let mut known: Option<(u64, bool)> = None;
        let mut k = 0;
        while k < st.fenced_free.len() {
            let ev = st.fenced_free[k].0;
            let done = match known {
                Some((e, d)) if e == ev => d,
                _ => {
                    let d = self.rt.event_done(ev).unwrap_or(true);
                    known = Some((ev, d));
                    d
                }
            };
            if done {
                let (ev, _, h) = st.fenced_free.swap_remove(k);
                st.free_host(h);
                st.unref_event(ev);
            } else {
                k += 1;
            }
        }
    }

    /// `reclaim` when the DRAM is needed now: the calling thread's device's
    /// u3m stream is synchronised (with the lock held) and its deferred
    /// slots, fenced or not, given back; other devices' wait.
    pub(super) fn reclaim_wait(&self, st: &mut State) {
        for (ev, d, h) in std::mem::take(&mut st.fenced_free) {
            st.unref_event(ev);
            st.pending_free.push((d, h));
        }
        if st.pending_free.is_empty() {
            return;
        }
        // None: a runtime that cannot say (the replayer) has no contexts
        let cur = self.rt.current_device();
        let mut idle = [false; MAX_DEVICES];
        for (d, ok) in idle.iter_mut().enumerate() {
            let stream = st.devs[d].stream;
            if stream == 0 {
                *ok = true; // u3m never copied in on this device
            } else if cur.is_none_or(|c| c as usize == d) {
                let _ = self.rt.sync_stream(stream);
                *ok = true;
            }
        }
        let mut k = 0;
        while k < st.pending_free.len() {
            let d = st.pending_free[k].0 as usize;
            if idle.get(d).copied().unwrap_or(true) {
                let (_, h) = st.pending_free.swap_remove(k);
                st.free_host(h);
            } else {
                k += 1;
            }
        }
    }

    // -------------------------------------------------------------- spill

    /// Background spill, the seed's emergency path: while DRAM is above 95 %
    /// of its limit, chunks that live only in DRAM (least recently used
    /// first) move to NVMe, at most `ssd_rate` × `dt_s` bytes per call.
    /// Returns the chunks moved.
    pub fn spill_dram(&self, dt_s: f64) -> u32 {
        let Ok(mut st) = self.st.lock() else { return 0 };
        if st.nvme.is_none() || (st.dram.used() as f64) <= 0.95 * self.dram_limit as f64 {
            return 0;
        }
        let budget = (self.ssd_rate as f64 * dt_s).max(CHUNK as f64) as u64;
        let mut cands: Vec<(u64, u64, u32)> = Vec::new();
        for (&id, b) in st.backings.iter() {
            for (i, c) in b.chunks.iter().enumerate() {
                if c.phys == 0 && c.pins == 0 && matches!(c.host, Some(Host::Dram(_))) {
                    cands.push((c.last, id, i as u32));
                }
            }
        }
        cands.sort_unstable();
        let (mut moved, mut bytes) = (0u32, 0u64);
        for (_, id, i) in cands {
            if bytes >= budget || (st.dram.used() as f64) <= 0.90 * self.dram_limit as f64 {
                break;
            }
            let Some(Host::Dram(ds)) = st
                .backings
                .get_mut(&id)
                .and_then(|b| b.chunks[i as usize].host.take())
            else {
                continue;
            };
            let slot = st.nvme.as_mut().map(|n| n.alloc(CHUNK));
            let ok = match slot {
                Some(Ok(ns)) => {
                    let src =
                        unsafe { std::slice::from_raw_parts(ds.ptr as *const u8, CHUNK as usize) };
                    match st.nvme.as_mut().map(|n| n.write(&ns, src)) {
                        Some(Ok(())) => {
                            st.chunk_mut(id, i).host = Some(Host::Nvme(ns));
                            st.mark(id, i);
                            true
                        }
                        _ => {
                            if let Some(n) = st.nvme.as_mut() {
                                let _ = n.free(ns);
                            }
                            false
                        }
                    }
                }
                _ => false,
            };
            if ok {
                let _ = st.dram.free(ds);
                self.c.to_nvme.fetch_add(1, Relaxed);
                self.c.spilled.fetch_add(1, Relaxed);
                moved += 1;
                bytes += CHUNK;
            } else {
                // disk full or I/O error: the data stays in DRAM
                self.c.spill_errors.fetch_add(1, Relaxed);
                st.chunk_mut(id, i).host = Some(Host::Dram(ds));
                st.mark(id, i);
                break;
            }
        }
        moved
    }
}

/// The chunks of a call's `need` list, which its evictions must not take
/// (`fault_in_chunks`: built at its first absent chunk, so a call that
/// finds everything resident allocates nothing).
fn protect_of(need: &[Need]) -> Protect<'static> {
    Protect::new(need.iter().map(|n| (n.0, n.1)).collect::<Vec<_>>())
}
