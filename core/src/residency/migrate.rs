//! Moving chunk data between the tiers: copy-in (a fault-in for a call),
//! copy-out (an eviction's data leaving HBM), the host slots they use, and
//! the background DRAM→NVMe spill. Every device copy runs on u3m's own
//! stream per device.
//!
//! A copy-out is two steps, `start_copy_out` (the D2H copy is issued) and
//! `complete_copy_out` (the data has landed: the host slot becomes the
//! chunk's copy, an NVMe slot is written). Today eviction completes at once
//! (a stream synchronisation); an asynchronous eviction completes later,
//! once the copy's event is done, and reuses the chunk's HBM only then.

use std::sync::atomic::Ordering::Relaxed;

use super::protocol::{Need, Order};
use super::state::{Host, State};
use super::{Fail, Residency, E_ALLOC, MAX_DEVICES};
use crate::acl::{AclError, MemcpyKind};
use crate::engine::runtime::CHUNK;
use crate::policy::Place;
use crate::store::StoreError;

/// A copy-out issued and not yet complete.
pub(super) struct CopyOut {
    id: u64,
    i: u32,
    /// Where the D2H copy lands: the DRAM slot itself, or the staging
    /// buffer an NVMe slot is written from.
    slot: Host,
    staging: u64,
    stream: u64,
    /// The scratch VA the chunk was mapped at for the copy (an unmapped VMM
    /// handle's chunk), unmapped once the copy is complete.
    scratch: Option<u64>,
}

impl Residency {
    /// u3m's migration stream on `dev` (created on first use).
    pub(super) fn dev_stream(&self, st: &mut State, dev: u32) -> Result<u64, AclError> {
        if st.dev(dev).stream == 0 {
            st.dev_mut(dev).stream = self.rt.create_stream()?;
        }
        Ok(st.dev(dev).stream)
    }

    /// The 2 MiB pinned staging buffer for NVMe transfers on `dev`.
    pub(super) fn staging(&self, st: &mut State, dev: u32) -> Result<u64, AclError> {
        if st.dev(dev).staging == 0 {
            st.dev_mut(dev).staging = self.rt.malloc_host(CHUNK)? as u64;
        }
        Ok(st.dev(dev).staging)
    }

    /// Maps a chunk of an unmapped VMM handle at the device's scratch VA.
    pub(super) fn scratch_map(
        &self,
        st: &mut State,
        dev: u32,
        id: u64,
        i: u32,
    ) -> Result<u64, AclError> {
        if st.dev(dev).scratch_va == 0 {
            st.dev_mut(dev).scratch_va = self.rt.reserve(CHUNK)?;
        }
        let va = st.dev(dev).scratch_va;
        self.rt.map(va, CHUNK, st.chunk(id, i).phys)?;
        Ok(va)
    }

    // ------------------------------------------------------------ copy-in

    /// Makes the listed chunks resident. Chunks of this call are protected
    /// from eviction; the caller's stream (or the host) is ordered after the
    /// copies.
    pub(super) fn fault_in(
        &self,
        st: &mut State,
        need: &[Need],
        dev: u32,
        order: Order,
    ) -> Result<(), Fail> {
        let protect: Vec<(u64, u32)> = need.iter().map(|n| (n.0, n.1)).collect();
        let mut copied = false;
        let mut filled: Vec<(u64, u32)> = Vec::new();
        for &(id, i, whole) in need {
            let Some(b) = st.backings.get(&id) else {
                continue;
            };
            if b.chunks[i as usize].phys != 0 {
                if b.chunks[i as usize].on_host {
                    // host-mapped: back into HBM (hostmap.rs)
                    let bdev = b.dev;
                    self.unmap_from_host(st, bdev, id, i, whole, &protect)?;
                }
                continue;
            }
            let bdev = b.dev;
            if st.stall_from.is_none() {
                st.stall_from = Some(crate::shm::mono_ns());
            }
            let phys = self.alloc_phys(st, bdev, &protect)?;
            st.dev_mut(bdev).resident += CHUNK;
            let vas = st.backings[&id].vas.clone();
            for &va in &vas {
                self.rt.map(va + i as u64 * CHUNK, CHUNK, phys)?;
            }
            let target = vas.first().map(|va| va + i as u64 * CHUNK);
            let c = st.chunk_mut(id, i);
            c.phys = phys;
            c.prefetched = false;
            self.c.faults_in.fetch_add(1, Relaxed);
            if whole && c.host.is_some() {
                // overwritten entirely: the old contents are not needed
                self.c.overwrites.fetch_add(1, Relaxed);
                let h = c.host.take();
                c.dirty = true;
                if let Some(h) = h {
                    st.pending_free.push(h);
                }
                continue;
            }
            let Some(target) = target else {
                // a VMM handle mapped nowhere: its data stays in the host copy
                // until it is mapped; resident now only to satisfy export
                c.dirty = c.host.is_none();
                continue;
            };
            let stream = self.dev_stream(st, dev)?;
            let c = st.chunk_mut(id, i);
            match &c.host {
                None => {
                    // fresh memory: nothing to copy
                    c.dirty = true;
                    self.c.first_touches.fetch_add(1, Relaxed);
                }
                Some(Host::Dram(slot)) => {
                    self.rt.memcpy_async(
                        target,
                        slot.ptr as u64,
                        CHUNK,
                        MemcpyKind::HOST_TO_DEVICE,
                        stream,
                    )?;
                    c.dirty = false;
                    copied = true;
                    filled.push((id, i));
                    self.c.fault_bytes.fetch_add(CHUNK, Relaxed);
                }
                Some(Host::Nvme(_)) => {
                    let staging = self.staging(st, dev)?;
                    // the staging buffer may still feed an earlier copy-in
                    let _ = self.rt.sync_stream(stream);
                    let st2 = &mut *st;
                    let Some(Host::Nvme(slot)) =
                        &st2.backings.get(&id).expect("backing").chunks[i as usize].host
                    else {
                        unreachable!()
                    };
                    let buf = unsafe {
                        std::slice::from_raw_parts_mut(staging as *mut u8, CHUNK as usize)
                    };
                    let r = st2
                        .nvme
                        .as_mut()
                        .map(|n| n.read(slot, buf))
                        .unwrap_or(Err(StoreError::BadSlot));
                    if r.is_err() {
                        self.c.spill_errors.fetch_add(1, Relaxed);
                        return Err(Fail::Acl(E_ALLOC));
                    }
                    self.rt.memcpy_async(
                        target,
                        staging,
                        CHUNK,
                        MemcpyKind::HOST_TO_DEVICE,
                        stream,
                    )?;
                    st.chunk_mut(id, i).dirty = false;
                    copied = true;
                    filled.push((id, i));
                    self.c.from_nvme.fetch_add(1, Relaxed);
                    self.c.fault_bytes.fetch_add(CHUNK, Relaxed);
                }
            }
        }
        if copied {
            let stream = self.dev_stream(st, dev)?;
            match order {
                Order::Host => self.rt.sync_stream(stream)?,
                Order::Stream(s) => {
                    let Some(ev) = self.use_event(st, stream) else {
                        return Err(Fail::Acl(E_ALLOC));
                    };
                    // the copy is a use of each chunk it fills: no eviction
                    // before it completes, and other streams' calls order
                    // themselves after it (`after_copy_ins`)
                    for &(id, i) in &filled {
                        st.set_use(id, i, stream, ev);
                    }
                    let rc = self.rt.stream_wait(s, ev);
                    st.unref_event(ev);
                    rc?;
                }
            }
        }
        Ok(())
    }

    // ----------------------------------------------------------- copy-out

    /// Moves one resident chunk out of HBM (copying it out unless a clean
    /// host copy exists), then unmaps and frees its physical memory.
    pub(super) fn evict(&self, st: &mut State, id: u64, i: u32) -> Result<(), AclError> {
        if st.chunk(id, i).needs_copy_out() {
            let out = self.start_copy_out(st, id, i)?;
            self.complete_copy_out(st, out)?;
            self.c.eviction_bytes.fetch_add(CHUNK, Relaxed);
        } else {
            self.c.clean_drops.fetch_add(1, Relaxed);
        }
        self.release_chunk(st, id, i);
        Ok(())
    }

    /// Issues the copy of chunk (id, i) to a host slot on u3m's stream.
    fn start_copy_out(&self, st: &mut State, id: u64, i: u32) -> Result<CopyOut, AclError> {
        let (dev, first) = {
            let b = &st.backings[&id];
            (b.dev, b.vas.first().copied())
        };
        let stream = self.dev_stream(st, dev)?;
        // where the data can be read from on the device
        let (src, scratch) = match first {
            Some(va) => (va + i as u64 * CHUNK, None),
            None => {
                let va = self.scratch_map(st, dev, id, i)?;
                (va, Some(va))
            }
        };
        let slot = self.host_slot(st, id, i)?;
        let (dst, staging) = match &slot {
            Host::Dram(s) => (s.ptr as u64, 0),
            Host::Nvme(_) => {
                let staging = self.staging(st, dev)?;
                (staging, staging)
            }
        };
        if let Err(e) = self
            .rt
            .memcpy_async(dst, src, CHUNK, MemcpyKind::DEVICE_TO_HOST, stream)
        {
            st.free_host(slot);
            return Err(e);
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
    /// (an NVMe slot is written from the staging buffer; a failing write
    /// keeps the data in DRAM).
    fn complete_copy_out(&self, st: &mut State, out: CopyOut) -> Result<(), AclError> {
        let CopyOut {
            id,
            i,
            slot,
            staging,
            stream,
            scratch,
        } = out;
        if let Err(e) = self.rt.sync_stream(stream) {
            st.free_host(slot);
            return Err(e);
        }
        let host = match slot {
            Host::Dram(s) => {
                self.c.to_dram.fetch_add(1, Relaxed);
                Host::Dram(s)
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
                        Host::Nvme(s)
                    }
                    Err(_) => {
                        // disk full or I/O error: keep the data in DRAM
                        self.c.spill_errors.fetch_add(1, Relaxed);
                        if let Some(n) = st.nvme.as_mut() {
                            let _ = n.free(s);
                        }
                        let ds = st.dram.alloc(CHUNK).map_err(|_| E_ALLOC)?;
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                staging as *const u8,
                                ds.ptr,
                                CHUNK as usize,
                            )
                        };
                        self.c.to_dram.fetch_add(1, Relaxed);
                        Host::Dram(ds)
                    }
                }
            }
        };
        st.chunk_mut(id, i).host = Some(host);
        if let Some(va) = scratch {
            let _ = self.rt.unmap(va);
        }
        Ok(())
    }

    /// The chunk leaves HBM: unmapped at every VA, its physical memory freed,
    /// its uses forgotten (all complete: eviction waited for them).
    fn release_chunk(&self, st: &mut State, id: u64, i: u32) {
        let (dev, vas) = {
            let b = &st.backings[&id];
            (b.dev, b.vas.clone())
        };
        for &va in &vas {
            let _ = self.rt.unmap(va + i as u64 * CHUNK);
        }
        let c = st.chunk_mut(id, i);
        let _ = self.rt.free_physical(c.phys);
        c.phys = 0;
        c.dirty = false;
        let uses: Vec<u64> = c.uses.drain(..).map(|u| u.1).collect();
        for ev in uses {
            st.unref_event(ev);
        }
        st.dev_mut(dev).resident -= CHUNK;
        self.c.evictions.fetch_add(1, Relaxed);
    }

    // --------------------------------------------------------- host slots

    /// A host slot for chunk (id, i): its existing (stale) one, else NVMe if
    /// the policy places it there, else DRAM below 95 % full, else NVMe,
    /// else DRAM anyway.
    fn host_slot(&self, st: &mut State, id: u64, i: u32) -> Result<Host, AclError> {
        if let Some(h) = st.chunk_mut(id, i).host.take() {
            return Ok(h);
        }
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
        let dram_ok = st.dram.used() + CHUNK <= (self.dram_limit as f64 * 0.95) as u64;
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
        // full: the clean copies of resident chunks make room
        if self.drop_duplicates(st, 64 * CHUNK) > 0 {
            if let Ok(s) = st.dram.alloc(CHUNK) {
                return Ok(Host::Dram(s));
            }
        }
        Err(E_ALLOC)
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
                        dropped.push(h);
                        c.dirty = true;
                        freed += CHUNK;
                    }
                }
            }
        }
        if dropped.is_empty() {
            return 0;
        }
        // a queued copy-in may still read these slots: freed after a sync
        st.pending_free.extend(dropped);
        self.reclaim(st);
        freed
    }

    /// Gives back deferred host slots once no issued copy can read them.
    pub(super) fn reclaim(&self, st: &mut State) {
        if st.pending_free.is_empty() {
            return;
        }
        for d in 0..MAX_DEVICES {
            if st.devs[d].stream != 0 {
                let _ = self.rt.sync_stream(st.devs[d].stream);
            }
        }
        for h in std::mem::take(&mut st.pending_free) {
            st.free_host(h);
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
                break;
            }
        }
        moved
    }
}
