//! A backing's life: aclrtMalloc-family allocations (VA reserved by u3m,
//! chunks backed on demand), u3m's own physical handles for
//! aclrtMallocPhysical and their mappings, export (a handle made real and
//! pinned), frees, and a device reset. Each entry returns None when the
//! memory is not u3m's (the caller passes the call through).

use std::sync::atomic::Ordering::Relaxed;

use super::evict::Protect;
use super::migrate::Arriving;
use super::state::{handle_of, id_of, Backing, Host, Kind, StGuard, State};
use super::{Fail, Order, Shard as Residency, E_ALLOC, E_DEVICE_LOST};

/// What one pass of `materialize`'s copies found once they had landed.
enum Pass {
    /// No call used a chunk meanwhile: `real` holds the backing's data.
    Current,
    /// A call used a chunk meanwhile: copy again.
    Disturbed,
    /// The backing was freed, made real or its device lost meanwhile.
    Gone,
    Failed(AclError),
}

/// Waits (without the lock) an export makes for room or its copy-in before
/// it gives up (E_ALLOC).
const EXPORT_TRIES: u32 = 256;
use crate::acl::{AclError, MemcpyKind};
use crate::engine::report::{Limit, Refusal};
use crate::engine::runtime::{on_device, CHUNK};

/// Attempts at one aclrtMapMem u3m makes for itself. A failed map leaves
/// nothing mapped, and the runtime's failures here are transient (a driver
/// hiccup, an injected fault): retrying a few times absorbs one, as a
/// refused physical allocation is absorbed by evicting, while a map that
/// keeps failing still fails the call instead of looping.
const MAP_TRIES: u32 = 3;

/// Pins of a chunk resident at fork, in the child: never evicted there
/// (uses add and remove their own pins around it).
pub(super) const FORK_PINNED: u32 = 1 << 30;

/// The residency lock held across fork() (`hold_for_fork`).
pub struct ShardHold(
    super::state::StGuard<'static>,
    /// The use-fence list (taken second: the lock order), so no thread is
    /// recording a fence at the fork.
    super::fence::ListHold,
);

fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// The bytes an aclrtMalloc-family allocation of `size` owns: the runtime
/// documents rounding up to 32 bytes and, for the padded calls (aclrtMalloc,
/// aclrtMallocCached, aclrtMallocWithCfg; not aclrtMallocAlign32), 32 more
/// bytes the program may write. A managed allocation owns the same room, so
/// a write into the padding stays in its own chunks, never the neighbour's.
pub fn malloc_room(size: u64, padded: bool) -> u64 {
    round_up(size, 32) + if padded { 32 } else { 0 }
}

/// An aclrtMemMallocPolicy the runtime accepts: its low byte is one of the
/// eight page policies (ACL_MEM_MALLOC_HUGE_FIRST .. HUGE1G_ONLY_P2P = 7);
/// the higher bits are flags (ACL_MEM_TYPE_*, ACL_MEM_ACCESS_*). Any other
/// value is the runtime's to refuse (100000), so u3m never serves it.
pub fn malloc_policy_known(policy: i32) -> bool {
    (policy as u32 & 0xff) <= 7
}

impl Residency {
    /// `ptr` is the start of a managed aclrtMalloc allocation.
    pub fn is_managed(&self, ptr: u64) -> bool {
        self.st
            .lock()
            .map(|st| {
                st.vas
                    .get(&ptr)
                    .map(|&(id, _)| {
                        matches!(st.backings.get(&id).map(|b| &b.kind), Some(Kind::Malloc))
                    })
                    .unwrap_or(false)
            })
            .unwrap_or(false)
    }

    /// `ptr` was a managed allocation just freed (the free hook's note comes
    /// after the free): remembered in a small ring.
    pub fn was_managed(&self, ptr: u64) -> bool {
        self.st
            .lock()
            .map(|st| st.recently_freed.contains(&ptr))
            .unwrap_or(false)
    }

    pub fn is_handle(&self, h: u64) -> bool {
        id_of(h)
            .map(|id| {
                self.st
                    .lock()
                    .map(|st| st.backings.contains_key(&id))
                    .unwrap_or(false)
            })
            .unwrap_or(false)
    }

    /// What aclrtGetMemInfo(HBM) reports in tier mode, from the runtime's
    /// (free, total): the virtual capacity and the matching free figure.
    pub fn mem_info(&self, dev: u32, free: u64, total: u64) -> (u64, u64) {
        let Ok(st) = self.st.lock() else {
            return (free, total);
        };
        let d = st.dev(dev);
        let vtotal = (total as f64 * self.oversub) as u64;
        let unmanaged = total.saturating_sub(free).saturating_sub(d.resident);
        let vfree = vtotal
            .saturating_sub(unmanaged)
            .saturating_sub(d.managed_virtual);
        (vfree, vtotal)
    }

    // ------------------------------------------------------------- malloc

    /// aclrtMalloc family: Some(result) when u3m manages the allocation, None
    /// to pass it through. The allocation owns exactly `size` bytes.
    pub fn malloc(
        &self,
        dev: u32,
        size: u64,
        free: u64,
        total: u64,
    ) -> Option<Result<u64, AclError>> {
        self.malloc_with_room(dev, size, size, free, total)
    }

    /// `malloc` of `size` bytes that owns `room` bytes (`malloc_room`: the
    /// documented padding). The VA covers the room; the virtual capacity is
    /// charged for `size` rounded to chunks, as before the padding was
    /// given, so a program sized to the capacity still fits: a padding
    /// chunk gets memory only if the program writes there.
    /// Whether `malloc_with_room` serves an allocation of `size` bytes
    /// (smaller ones, and absurd ones, are the runtime's own).
    pub fn manages_size(&self, size: u64) -> bool {
        size >= self.min_bytes && size <= 1u64 << 46
    }

    pub fn malloc_with_room(
        &self,
        dev: u32,
        size: u64,
        room: u64,
        free: u64,
        total: u64,
    ) -> Option<Result<u64, AclError>> {
        if !self.manages_size(size) {
            return None;
        }
        let vlen = round_up(room.max(size), CHUNK);
        let charge = round_up(size, CHUNK);
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_millis(self.alloc_wait_ms);
        loop {
            let mut st = self.st.lock().ok()?;
            if st.dev(dev).capacity == 0 {
                st.dev_mut(dev).capacity = total;
            }
            let d = super::state::dev_index(dev);
            let dv = &st.devs[d];
            let vtotal = (dv.capacity as f64 * self.oversub) as u64;
            let unmanaged = total.saturating_sub(free).saturating_sub(dv.resident);
            // what cannot be resident must fit the host tiers: every host
            // byte holds managed data (part of some device's excess, or a
            // clean copy that can be dropped), so compare the excesses of
            // all devices with the tiers' limits, not with what is free now
            // (the other devices' figures as their states published them)
            let others: u64 = self
                .excess
                .iter()
                .enumerate()
                .filter(|&(k, _)| k != d)
                .map(|(_, o)| o.load(Relaxed))
                .sum();
            let fits_virtual = dv.managed_virtual + charge + unmanaged <= vtotal;
            let fits_tiers = (dv.managed_virtual + charge)
                .saturating_sub(dv.capacity.saturating_sub(unmanaged))
                + others
                <= self.dram_limit + self.nvme_limit;
            if fits_virtual && fits_tiers {
                let va = match self.rt.reserve(vlen) {
                    Ok(v) => v,
                    Err(e) => return Some(Err(e)),
                };
                let id = st.next_id;
                st.next_id += super::MAX_DEVICES as u64;
                let mut b = Backing::new(dev, Kind::Malloc, vlen, vec![va]);
                b.charged = charge;
                st.backings.insert(id, b);
                st.structure += 1;
                st.vas.insert(va, (id, vlen));
                self.route(va, vlen);
                self.note_va(va, vlen);
                st.dev_mut(dev).managed_virtual += charge;
                self.publish(&st);
                self.live.fetch_add(1, Relaxed);
                return Some(Ok(va));
            }
            let refusal = Refusal {
                dev,
                size: charge,
                limit: if fits_virtual {
                    Limit::HostTiers
                } else {
                    Limit::Virtual
                },
                virtual_used: dv.managed_virtual + unmanaged,
                virtual_total: vtotal,
                hbm: dv.capacity,
                oversub: self.oversub,
                host_need: (dv.managed_virtual + charge)
                    .saturating_sub(dv.capacity.saturating_sub(unmanaged))
                    + others,
                host_limit: self.dram_limit + self.nvme_limit,
                waited_ms: self.alloc_wait_ms,
            };
            drop(st);
            if std::time::Instant::now() >= deadline {
                if let Ok(mut r) = self.refusal.lock() {
                    *r = Some(refusal);
                }
                return Some(Err(E_ALLOC));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// aclrtFree: Some(result) for a managed allocation, None otherwise.
    pub fn free(&self, ptr: u64) -> Option<Result<(), AclError>> {
        let mut st = self.st.lock().ok()?;
        let (id, _) = *st.vas.get(&ptr)?;
        if !matches!(st.backings.get(&id)?.kind, Kind::Malloc) {
            return None;
        }
        st.vas.remove(&ptr);
        self.unroute(ptr);
        let b = st.backings.remove(&id)?;
        st.structure += 1;
        // out of every map: no call, eviction or prefetch finds it any more,
        // so u3m's copies that may still touch it are waited for unlocked
        let (mut st, settled) = self.wait_copies_of(st, id, &b);
        self.release_backing(&mut st, id, b, true, settled);
        st.recently_freed.push_back(ptr);
        if st.recently_freed.len() > 64 {
            st.recently_freed.pop_front();
        }
        self.live.fetch_sub(1, Relaxed);
        Some(Ok(()))
    }

    /// The program promises not to read `[va, va + bytes)` before writing
    /// it again (a framework's caching allocator freed the block that held
    /// it): every chunk wholly inside the range that is in HBM, holds data
    /// only there (written since its last copy-out) and is in no call in
    /// progress nor leaving HBM becomes free to evict without a copy-out.
    /// It keeps its contents until evicted and reads as fresh memory after;
    /// its queued uses still complete first (eviction waits for them as for
    /// any chunk). Chunks only partly inside, or with a host copy, are left
    /// as they are. Some(chunks discarded) for managed memory, None
    /// otherwise.
    pub fn discard(&self, va: u64, bytes: u64) -> Option<u64> {
        let mut st = self.st.lock().ok()?;
        let (&start, &(id, size)) = st.vas.range(..=va).next_back()?;
        if va >= start + size {
            return None;
        }
        let end = va.saturating_add(bytes).min(start + size);
        let dev = st.backings.get(&id)?.dev;
        // chunks wholly inside [va, end): a backing's last chunk ends at
        // its size (its padding past the allocation is the program's too)
        let first = (va - start).div_ceil(CHUNK);
        let last = if end == start + size {
            size.div_ceil(CHUNK)
        } else {
            (end - start) / CHUNK
        };
        let mut keys = Vec::new();
        for i in first..last {
            let i = i as u32;
            let c = st.chunk_mut(id, i);
            if !c.in_hbm()
                || c.pins != 0
                || c.out_ev != 0
                || c.unfilled
                || c.host.is_some()
                || !c.needs_copy_out()
            {
                continue;
            }
            c.dirty = false;
            c.discarded = true;
            keys.push(st.backings[&id].key(id, i));
        }
        self.c.discards.fetch_add(keys.len() as u64, Relaxed);
        // the victim order weighs them again (clean now)
        st.dev_mut(dev).order.note_touched(&keys);
        Some(keys.len() as u64)
    }

    /// A backing taken out of the state (`b`, no longer in `backings` nor
    /// `vas`: nobody maps, evicts or copies into it any more): waits without
    /// the lock for u3m's copies that may still read or write its chunks or
    /// its deferred host slots — everything issued so far on u3m's stream
    /// of its device (an event recorded there now) and the copy-outs of its
    /// chunks in flight — and retakes the lock. Returns the guard and the
    /// host slots of its device that were deferred (`pending_free`) when the
    /// event was recorded (the copies that could read them have completed:
    /// free to give back), or None when nothing could be waited for that
    /// way (no event: `release_backing` then settles with the lock held).
    fn wait_copies_of<'a>(
        &'a self,
        mut st: StGuard<'a>,
        id: u64,
        b: &Backing,
    ) -> (StGuard<'a>, Option<Vec<Host>>) {
        let dev = b.dev;
        let stream = st.dev(dev).stream;
        let mut evs: Vec<u64> = Vec::new();
        if stream != 0 {
            // recorded on its own device (the runtime refuses another's)
            match on_device(self.rt, dev, || self.use_event(&mut st, stream)).flatten() {
                Some(ev) => evs.push(ev),
                None => return (st, None),
            }
        }
        // every copy-out of its chunks still listed, including one whose
        // chunk was taken back meanwhile (`rescue` clears the chunk's
        // `out_ev`, not the copy)
        let outs: Vec<u64> = st
            .dev(dev)
            .outgoing
            .iter()
            .filter(|o| o.id == id)
            .map(|o| o.ev)
            .collect();
        for ev in outs {
            if !evs.contains(&ev) && st.event_refs.contains_key(&ev) {
                *st.event_refs.entry(ev).or_insert(0) += 1;
                evs.push(ev);
            }
        }
        // the deferred slots of this device that the copies before the
        // event may read: given back after it (others wait for a reclaim)
        let mut slots = Vec::new();
        if stream != 0 {
            let mut k = 0;
            while k < st.pending_free.len() {
                if st.pending_free[k].0 == dev {
                    slots.push(st.pending_free.swap_remove(k).1);
                } else {
                    k += 1;
                }
            }
            // those behind an earlier fence: the new event comes after it
            let mut k = 0;
            while k < st.fenced_free.len() {
                if st.fenced_free[k].1 == dev {
                    let (fev, _, h) = st.fenced_free.swap_remove(k);
                    st.unref_event(fev);
                    slots.push(h);
                } else {
                    k += 1;
                }
            }
        }
        if evs.is_empty() {
            return (st, Some(slots));
        }
        (self.sync_unlocked(st, Some(dev), evs), Some(slots))
    }

    /// Gives back every chunk's memory (and, for Malloc, the VA).
    /// `settled`: u3m's copies that may touch the backing were waited for
    /// (`wait_copies_of`), and these deferred host slots are free to give
    /// back; None: wait for them here (lock held).
    fn release_backing(
        &self,
        st: &mut State,
        id: u64,
        mut b: Backing,
        release_va: bool,
        settled: Option<Vec<Host>>,
    ) {
        if !b.vas.is_empty() {
            for i in 0..b.chunks.len() as u32 {
                self.policy.on_free(b.key(0, i));
            }
        }
        let waited = settled.is_some();
        match settled {
            Some(slots) => {
                for h in slots {
                    st.free_host(h);
                }
                // (copy-outs of its chunks give their slots back when their
                // device's calls harvest them: the backing is gone)
            }
            None => {
                // copies of ours that may still read or write these chunks
                self.settle_outgoing(st, b.dev);
                let stream = st.dev(b.dev).stream;
                if stream != 0 {
                    self.sync_on_device(b.dev, stream);
                }
            }
        }
        // (its copy-outs were waited for above: their VAs go, no wait)
        self.drop_copy_vas_of(st, b.dev, id);
        for (i, c) in b.chunks.iter_mut().enumerate() {
            if c.phys != 0 {
                for &va in &b.vas {
                    let _ = self.rt.unmap(va + i as u64 * CHUNK);
                }
                self.free_phys(st, b.dev, c.phys);
                if std::mem::take(&mut c.on_host) {
                    st.dev_mut(b.dev).host_mapped -= CHUNK;
                } else {
                    st.dev_mut(b.dev).resident -= CHUNK;
                }
                c.phys = 0;
            }
            if let Some(h) = c.host.take() {
                st.free_host(h);
            }
            for (_, ev) in c.uses.drain(..) {
                st.unref_event(ev);
            }
        }
        let real = st.take_real(&mut b);
        if real != 0 {
            let _ = self.rt.free_physical(real);
            let d = st.dev_mut(b.dev);
            d.resident = d.resident.saturating_sub(b.size);
        }
        if !waited {
            self.reclaim(st);
        }
        // moves between HBM and host handles whose copies have landed give
        // their old memory back (those of this backing's chunks among them:
        // u3m's stream was waited for above)
        self.reap_moves(st, b.dev);
        if release_va {
            if let Kind::Malloc = b.kind {
                let _ = self.rt.release(b.vas[0]);
            }
        }
        let d = st.dev_mut(b.dev);
        d.managed_virtual = d.managed_virtual.saturating_sub(b.charged);
        self.publish(st);
    }

    // --------------------------------------------------------------- fork

    /// fork's prepare step: the residency lock, held across the fork so
    /// the child's copy of the state is consistent and its lock free.
    pub fn hold_for_fork(&'static self) -> Option<ShardHold> {
        let st = self.st.lock().ok()?;
        Some(ShardHold(st, self.fences.hold()))
    }

    /// In a forked child that keeps the parent's memory (the runtime's
    /// state is fork-copied too): the parent's streams, use events and
    /// in-flight copies do not exist here, so u3m's streams and events are
    /// made anew, lazily; chunks resident at the fork stay resident. The NVMe swap file is shared with the parent: the
    /// child never writes it (its spills stay in DRAM), and Err when a chunk
    /// of the child's copy of the state lives there (the parent may reuse
    /// that slot), for the caller to fail closed.
    pub fn after_fork_child(&self, hold: Option<ShardHold>) -> Result<(), String> {
        let mut st = match hold {
            Some(ShardHold(g, fences)) => {
                // the fence list as the fork found it: no other thread was
                // inside it; reset through the held guard
                self.fences.forget_held(fences);
                g
            }
            None => self
                .st
                .lock()
                .map_err(|_| "the residency state is unusable".to_string())?,
        };
        self.fences.forget_kept();
        // the parent's moves: their copies and old memory are the parent's
        for d in 0..st.devs.len() {
            self.forget_moves(&mut st, d as u32);
        }
        for d in st.devs.iter_mut() {
            d.stream = 0;
            // the device-to-host stream is the parent's too
            d.out_stream = 0;
            // and the event after its latest copy-ins (`link_idle`)
            d.last_in = 0;
            // the parent's copy-ins from them do not run here
            let busy: Vec<(u64, u64)> = d.staging_busy.drain(..).collect();
            d.staging_free.extend(busy.into_iter().map(|b| b.1));
        }
        // the parent's copy-outs in flight never land in the child: their
        // chunks stay resident as they were (their HBM is still mapped); the
        // DRAM slot is not reused (the parent's copy may still write it);
        // an NVMe copy-out's staging buffer is free here
        for d in 0..st.devs.len() {
            for o in std::mem::take(&mut st.devs[d].outgoing) {
                let (id, i, ev) = (o.id, o.i, o.ev);
                if o.staging != 0 {
                    st.devs[d].staging_free.push(o.staging);
                }
                if let Some(c) = st
                    .backings
                    .get_mut(&id)
                    .and_then(|b| b.chunks.get_mut(i as usize))
                    .filter(|c| c.out_ev == ev)
                {
                    c.out_ev = 0;
                }
            }
        }
        let mut in_nvme = 0u64;
        st.structure += 1;
        for b in st.backings.values_mut() {
            for c in b.chunks.iter_mut() {
                c.uses.clear();
                // device memory is shared with the parent (the physical
                // pages are the same): a chunk resident at the fork is the
                // parent's too, so the child never evicts it — freeing its
                // page would let the child's next chunk overwrite the
                // parent's data. The child's fault-ins use free HBM only.
                c.pins = if c.phys != 0 { FORK_PINNED } else { 0 };
                if matches!(c.host, Some(Host::Nvme(_))) {
                    in_nvme += 1;
                }
            }
        }
        st.event_refs.clear();
        st.in_order.clear();
        st.free_events.clear();
        st.closed_fences.clear();
        self.fences.forget();
        st.wait_for = None;
        for (_, h) in std::mem::take(&mut st.pending_free) {
            st.free_host(h);
        }
        for (_, _, h) in std::mem::take(&mut st.fenced_free) {
            st.free_host(h);
        }
        // the parent's file: neither written nor given back here
        std::mem::forget(st.nvme.take());
        if in_nvme > 0 {
            return Err(format!(
                "{in_nvme} managed chunk(s) of the parent are in the NVMe swap file, which the parent keeps using"
            ));
        }
        Ok(())
    }

    /// A synchronous copy between host memory and one managed allocation,
    /// in a forked child (whose HBM is the parent's: it cannot evict what was
    /// resident at the fork). Chunks that are not resident are read from and
    /// written to u3m's DRAM copy — the copy a later fault-in brings back —
    /// and resident ones through the runtime on u3m's stream, so the child's
    /// reads of the parent's evicted buffers and its writes to buffers of its
    /// own need no HBM. None: not such a copy (the normal path runs).
    ///
    /// # Safety
    /// `host` is the program's host pointer of the copy, valid for `len`
    /// bytes of reads (`to_device`) or writes (otherwise) during the call.
    pub unsafe fn child_copy(
        &self,
        dev_addr: u64,
        host: *mut u8,
        len: u64,
        to_device: bool,
    ) -> Option<Result<(), AclError>> {
        if host.is_null() || len == 0 {
            return None;
        }
        let mut st = self.st.lock().ok()?;
        let (&start, &(id, size)) = st.vas.range(..=dev_addr).next_back()?;
        if dev_addr + len > start + size {
            return None;
        }
        let dev = st.backings.get(&id)?.dev;
        if st.dev(dev).lost {
            return None;
        }
        let off = dev_addr - start;
        let mut done = 0u64;
        while done < len {
            let at = off + done;
            let i = (at / CHUNK) as u32;
            let within = at % CHUNK;
            let n = (CHUNK - within).min(len - done);
            let h = host.add(done as usize);
            if st.chunk(id, i).phys != 0 {
                // resident (the parent's page, or one the child faulted in)
                let stream = match self.dev_stream(&mut st, dev) {
                    Ok(s) => s,
                    Err(e) => return Some(Err(e)),
                };
                let (dst, src, kind) = if to_device {
                    (dev_addr + done, h as u64, MemcpyKind::HOST_TO_DEVICE)
                } else {
                    (h as u64, dev_addr + done, MemcpyKind::DEVICE_TO_HOST)
                };
                let r = self
                    .rt
                    .memcpy_async(dst, src, n, kind, stream)
                    .and_then(|()| self.rt.sync_stream(stream));
                if let Err(e) = r {
                    return Some(Err(e));
                }
                if to_device {
                    st.chunk_mut(id, i).dirty = true;
                    st.mark(id, i);
                }
            } else {
                let slot = match &st.chunk(id, i).host {
                    Some(Host::Dram(slot)) => Some(slot.ptr),
                    Some(Host::Nvme(_)) => return Some(Err(E_ALLOC)),
                    None => None,
                };
                match (slot, to_device) {
                    (Some(p), true) => {
                        std::ptr::copy_nonoverlapping(h, p.add(within as usize), n as usize)
                    }
                    (Some(p), false) => {
                        std::ptr::copy_nonoverlapping(p.add(within as usize), h, n as usize)
                    }
                    // never written: fresh memory reads as zeros
                    (None, false) => std::ptr::write_bytes(h, 0, n as usize),
                    (None, true) => {
                        let Ok(slot) = st.dram.alloc(CHUNK) else {
                            return Some(Err(E_ALLOC));
                        };
                        std::ptr::write_bytes(slot.ptr, 0, CHUNK as usize);
                        std::ptr::copy_nonoverlapping(h, slot.ptr.add(within as usize), n as usize);
                        st.chunk_mut(id, i).host = Some(Host::Dram(slot));
                        st.mark(id, i);
                    }
                }
            }
            done += n;
        }
        Some(Ok(()))
    }

    /// Test hook (LIBU3M_TEST_PANIC_AT): panics with the lock held, as an
    /// internal error in the middle of a residency operation would (the
    /// lock is poisoned afterwards).
    pub fn panic_under_lock(&self, why: &str) {
        let _st = self.st.lock();
        panic!("{why}: injected panic in the residency manager");
    }

    // --------------------------------------------------------- u3m's maps

    /// Maps `len` bytes of `phys` at `va` for u3m itself, retrying a failure
    /// (`MAP_TRIES`).
    pub(super) fn map_retrying(&self, va: u64, len: u64, phys: u64) -> Result<(), AclError> {
        let mut tries = 1;
        loop {
            match self.rt.map(va, len, phys) {
                Ok(()) => return Ok(()),
                Err(e) if tries >= MAP_TRIES => return Err(e),
                Err(_) => tries += 1,
            }
        }
    }

    /// Maps chunk `i` of a backing (physical chunk `phys`) at each of its
    /// `vas`; on failure the ones already mapped are unmapped again, so the
    /// caller only has `phys` to give back.
    pub(super) fn map_chunk(&self, vas: &[u64], i: u32, phys: u64) -> Result<(), AclError> {
        let off = i as u64 * CHUNK;
        for (k, &va) in vas.iter().enumerate() {
            if let Err(e) = self.map_retrying(va + off, CHUNK, phys) {
                for &done in &vas[..k] {
                    let _ = self.rt.unmap(done + off);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    // ----------------------------------------------------------------- VMM

    /// aclrtMallocPhysical: Some(handle) when u3m hands out its own handle.
    #[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than rust-version 1.75
    pub fn malloc_physical(
        &self,
        dev: u32,
        size: u64,
        shareable: bool,
    ) -> Option<Result<u64, AclError>> {
        if shareable || size < self.min_bytes || size % CHUNK != 0 {
            return None;
        }
        let mut st = self.st.lock().ok()?;
        let dv = st.dev(dev);
        if dv.capacity != 0
            && dv.managed_virtual + size > (dv.capacity as f64 * self.oversub) as u64
        {
            return Some(Err(E_ALLOC));
        }
        let id = st.next_id;
        st.next_id += super::MAX_DEVICES as u64;
        st.backings
            .insert(id, Backing::new(dev, Kind::Vmm, size, Vec::new()));
        st.structure += 1;
        st.dev_mut(dev).managed_virtual += size;
        self.publish(&st);
        self.live.fetch_add(1, Relaxed);
        Some(Ok(handle_of(id)))
    }

    /// aclrtFreePhysical of u3m's handle (None: not u3m's).
    pub fn free_physical(&self, h: u64) -> Option<Result<(), AclError>> {
        let id = id_of(h)?;
        let mut st = self.st.lock().ok()?;
        let b = st.backings.get(&id)?;
        if !b.vas.is_empty() {
            return Some(Err(AclError::RT_MEMORY_FREE)); // still mapped
        }
        let b = st.backings.remove(&id)?;
        st.structure += 1;
        // out of the state: its copies are waited for unlocked (as free)
        let (mut st, settled) = self.wait_copies_of(st, id, &b);
        self.release_backing(&mut st, id, b, false, settled);
        self.live.fetch_sub(1, Relaxed);
        Some(Ok(()))
    }

    /// aclrtMapMem of u3m's handle (None: not u3m's).
    pub fn map(&self, va: u64, size: u64, offset: u64, h: u64) -> Option<Result<(), AclError>> {
        let id = id_of(h)?;
        let mut st = self.st.lock().ok()?;
        let b = st.backings.get(&id)?;
        if offset != 0 || size != b.size {
            // as the runtime: whole handles at offset 0
            return Some(Err(AclError::INVALID_PARAM));
        }
        if st
            .vas
            .range(..va + size)
            .next_back()
            .map(|(&s, &(_, l))| s + l > va)
            .unwrap_or(false)
        {
            return Some(Err(AclError::RT_PARAM_INVALID));
        }
        if b.real() != 0 {
            let rc = self.map_retrying(va, size, b.real());
            if rc.is_ok() {
                st.backings.get_mut(&id)?.vas.push(va);
                st.structure += 1;
                st.vas.insert(va, (id, size));
                self.route(va, size);
                self.note_va(va, size);
            }
            return Some(rc);
        }
        let phys: Vec<(usize, u64)> = b
            .chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.phys != 0)
            .map(|(i, c)| (i, c.phys))
            .collect();
        for (k, &(i, p)) in phys.iter().enumerate() {
            if let Err(e) = self.map_retrying(va + i as u64 * CHUNK, CHUNK, p) {
                for &(j, _) in &phys[..k] {
                    let _ = self.rt.unmap(va + j as u64 * CHUNK);
                }
                return Some(Err(e));
            }
        }
        st.backings.get_mut(&id)?.vas.push(va);
        st.structure += 1;
        st.vas.insert(va, (id, size));
        self.route(va, size);
        self.note_va(va, size);
        Some(Ok(()))
    }

    /// aclrtUnmapMem of a mapping of u3m's handle (None: not one).
    pub fn unmap(&self, va: u64) -> Option<Result<(), AclError>> {
        let mut st = self.st.lock().ok()?;
        let (id, _) = *st.vas.get(&va)?;
        let b = st.backings.get(&id)?;
        if !matches!(b.kind, Kind::Vmm) {
            return None;
        }
        // like the runtime's unmap, this does not wait for the device
        if b.real() != 0 {
            if let Err(e) = self.rt.unmap(va) {
                return Some(Err(e));
            }
        }
        for (i, c) in b.chunks.iter().enumerate() {
            if c.phys != 0 {
                let _ = self.rt.unmap(va + i as u64 * CHUNK);
            }
        }
        st.vas.remove(&va);
        self.unroute(va);
        st.backings.get_mut(&id)?.vas.retain(|&v| v != va);
        st.structure += 1;
        Some(Ok(()))
    }

    /// An exported handle must be real. A managed handle of one chunk is
    /// made resident and its chunk exported; a larger one is replaced by a
    /// real handle of its whole size holding the same data, mapped wherever
    /// the handle is mapped. Either way the backing is pinned for good.
    /// Returns the real handle to export (None: not u3m's handle).
    pub fn export(&self, h: u64) -> Option<Result<u64, AclError>> {
        let id = id_of(h)?;
        // in-flight work may still use the chunks that a multi-chunk handle
        // is about to have unmapped: wait for it without the lock (it may
        // need the host)
        let uses: Vec<u64> = {
            let st = self.st.lock().ok()?;
            let b = st.backings.get(&id)?;
            if b.real() != 0 {
                return Some(Ok(b.real()));
            }
            if b.chunks.len() == 1 {
                Vec::new()
            } else {
                b.chunks
                    .iter()
                    .flat_map(|c| c.uses.iter().map(|u| u.1))
                    .collect()
            }
        };
        for ev in uses {
            let _ = self.rt.sync_event(ev);
        }
        let mut st = self.st.lock().ok()?;
        let b = st.backings.get(&id)?;
        let dev = b.dev;
        if st.dev(dev).lost {
            return Some(Err(E_DEVICE_LOST));
        }
        if b.chunks.len() == 1 {
            // room may wait for copy-outs in flight (or what else a Busy
            // names): waited for without the lock, then retry; the copy-in
            // too (`wait_copy_ins`, the chunk pinned meanwhile)
            let need = [(id, 0, false)];
            let mut held = Vec::new();
            let mut arriving = Arriving::default();
            let mut tries = 0;
            let r = loop {
                let r = self.fault_in(
                    &mut st,
                    &need,
                    dev,
                    Order::Host,
                    &mut held,
                    Some(&mut arriving),
                    &mut None,
                );
                if r != Err(Fail::Busy) || tries >= EXPORT_TRIES {
                    break r;
                }
                let waited;
                (st, waited) = self.wait_unlocked(st, dev, true);
                if !waited {
                    break r;
                }
                tries += 1;
                // (the handle may have been freed meanwhile)
                if !st.backings.contains_key(&id) {
                    self.unreserve(&mut st, &mut held);
                    return None;
                }
            };
            let r = match r {
                Ok(()) => {
                    let mut t0 = None;
                    let mut rounds = 0;
                    loop {
                        let w;
                        (st, w) = self.wait_copy_ins(st, &need, &mut arriving, &mut held, &mut t0);
                        match w {
                            Ok(false) if rounds < EXPORT_TRIES => rounds += 1,
                            Ok(_) => break Ok(()),
                            Err(e) => break Err(Fail::Acl(e)),
                        }
                    }
                }
                Err(e) => Err(e),
            };
            self.unreserve(&mut st, &mut held);
            if let Err(e) = r {
                return Some(Err(e.acl()));
            }
            st.structure += 1;
            let b = st.backings.get_mut(&id)?;
            b.pinned = true;
            return Some(Ok(b.chunks[0].phys));
        }
        // room for the whole handle: evict other chunks (never this one's);
        // a copy-out started frees its HBM once it lands, waited for
        // without the lock
        let (size, n) = (b.size, b.chunks.len() as u32);
        let protect: Vec<(u64, u32)> = (0..n).map(|i| (id, i)).collect();
        let protect = Protect::new(&protect);
        let mut tries = 0;
        let real = loop {
            match self.rt.malloc_physical(dev, size) {
                Ok(h) => break h,
                Err(E_ALLOC) => {}
                Err(e) => return Some(Err(e)),
            }
            let named = match self.evict_one(&mut st, dev, &protect) {
                Ok(true) => false,
                Err(Fail::Busy) if tries < EXPORT_TRIES => true,
                Ok(false) | Err(Fail::Busy) => return Some(Err(E_ALLOC)),
                Err(Fail::Acl(e)) => return Some(Err(e)),
            };
            let waited;
            (st, waited) = self.wait_unlocked(st, dev, named);
            if named && !waited {
                return Some(Err(E_ALLOC));
            }
            tries += 1;
            // the handle may have been freed or exported meanwhile
            let b = st.backings.get(&id)?;
            if b.real() != 0 {
                return Some(Ok(b.real()));
            }
        };
        self.materialize(st, id, real)
    }

    /// Replaces backing `id`'s chunks by the real handle `real` (of the
    /// backing's size) with their data (None: the handle was freed
    /// meanwhile). The copies into `real` are waited for without the lock:
    /// first the calls that may still write a chunk (pinned between their
    /// prepare and finish, or a use in flight) are waited for unlocked;
    /// then every chunk's data is copied from wherever it is into `real`
    /// (mapped at a VA of its own) with each chunk pinned (no eviction,
    /// move or spill takes it) and its last use noted, an event recorded
    /// after the copies and waited for unlocked; with the lock retaken, a
    /// chunk a call used meanwhile (`last` moved: its write may have come
    /// after the copy read it) makes the copies start again. Only once they
    /// are current are the chunks swapped for `real`, lock held. A handle
    /// freed meanwhile gives `real` back; one another export made real
    /// meanwhile returns that handle. After `EXPORT_TRIES` passes that a
    /// call disturbed, the copies are waited for with the lock held.
    fn materialize<'a>(
        &'a self,
        mut st: StGuard<'a>,
        id: u64,
        real: u64,
    ) -> Option<Result<u64, AclError>> {
        let (dev, size) = {
            let b = st.backings.get(&id)?;
            (b.dev, b.size)
        };
        let va = match self.rt.reserve(size) {
            Ok(v) => v,
            Err(e) => {
                let _ = self.rt.free_physical(real);
                return Some(Err(e));
            }
        };
        if let Err(e) = self.map_retrying(va, size, real) {
            let _ = self.rt.release(va);
            let _ = self.rt.free_physical(real);
            return Some(Err(e));
        }
        // `real` and its VA given back: nothing of ours reads them any more
        let give_up = || {
            let _ = self.rt.unmap(va);
            let _ = self.rt.release(va);
            let _ = self.rt.free_physical(real);
        };
        let mut tries = 0;
        loop {
            // freed, or made real by another export, while unlocked
            let Some(b) = st.backings.get(&id) else {
                give_up();
                return None;
            };
            if b.real() != 0 {
                let r = b.real();
                give_up();
                return Some(Ok(r));
            }
            if st.dev(dev).lost {
                give_up();
                return Some(Err(E_DEVICE_LOST));
            }
            let locked = tries >= EXPORT_TRIES;
            if !locked {
                // a call that may still write a chunk: waited for unlocked
                let mut pinned = false;
                let mut evs: Vec<u64> = Vec::new();
                for c in &b.chunks {
                    pinned |= c.pins != 0;
                    // (and a copy-out still reading it: its memory goes
                    // when the handle becomes real, `swap_in_real`)
                    let out = (c.out_ev != 0).then_some(c.out_ev);
                    for ev in c.uses.iter().map(|u| u.1).chain(out) {
                        if !evs.contains(&ev) && !self.rt.event_done(ev).unwrap_or(true) {
                            evs.push(ev);
                        }
                    }
                }
                if pinned || !evs.is_empty() {
                    tries += 1;
                    if evs.is_empty() {
                        drop(st);
                        std::thread::sleep(std::time::Duration::from_micros(500));
                        st = match self.st.lock() {
                            Ok(g) => g,
                            Err(p) => p.into_inner(),
                        };
                    } else {
                        evs.retain(|ev| st.event_refs.contains_key(ev));
                        for &ev in &evs {
                            *st.event_refs.entry(ev).or_insert(0) += 1;
                        }
                        st = self.sync_unlocked(st, Some(dev), evs);
                    }
                    continue;
                }
            }
            let r;
            (r, st) = self.materialize_pass(st, id, dev, va, locked);
            match r {
                Pass::Gone => continue, // freed: the top of the loop says so
                Pass::Failed(e) => {
                    give_up();
                    return Some(Err(e));
                }
                Pass::Disturbed => {
                    tries += 1;
                    continue;
                }
                Pass::Current => break,
            }
        }
        let _ = self.rt.unmap(va);
        let _ = self.rt.release(va);
        Some(self.swap_in_real(&mut st, id, dev, size, real))
    }

    /// One pass of `materialize`'s copies into `real` (mapped at `va`), all
    /// chunks, waited for without the lock (with it held: `locked`).
    /// Returns the guard (retaken) and what the pass found.
    fn materialize_pass<'a>(
        &'a self,
        mut st: StGuard<'a>,
        id: u64,
        dev: u32,
        va: u64,
        locked: bool,
    ) -> (Pass, StGuard<'a>) {
        let stream = match self.dev_stream(&mut st, dev) {
            Ok(s) => s,
            Err(e) => return (Pass::Failed(e), st),
        };
        let n = st.backings[&id].chunks.len() as u32;
        // what each chunk's last use and memory were when its copy was issued
        let mut snap: Vec<(u64, u64)> = Vec::with_capacity(n as usize);
        // held by this pass: pinned chunks, scratch VAs, staging buffers
        let mut pinned: Vec<(u64, u32)> = Vec::new();
        let mut scratch: Vec<u64> = Vec::new();
        let mut bufs: Vec<u64> = Vec::new();
        let mut i = 0;
        let mut err = None;
        while i < n && err.is_none() {
            let off = i as u64 * CHUNK;
            let (phys, last, mapped_at) = {
                let b = &st.backings[&id];
                let c = &b.chunks[i as usize];
                (c.phys, c.last, b.vas.first().map(|v| v + off))
            };
            let r: Result<(), Fail> = if phys != 0 {
                let src = match mapped_at {
                    Some(s) => Ok(s),
                    // an unmapped VMM handle's chunk: at a VA of its own
                    None => self
                        .take_move_va(&mut st, dev)
                        .map_err(Fail::Acl)
                        .and_then(|s| match self.map_retrying(s, CHUNK, phys) {
                            Ok(()) => {
                                scratch.push(s);
                                Ok(s)
                            }
                            Err(e) => {
                                self.give_move_va(&mut st, dev, s);
                                Err(Fail::Acl(e))
                            }
                        }),
                };
                src.and_then(|src| {
                    self.rt
                        .memcpy_async(va + off, src, CHUNK, MemcpyKind::DEVICE_TO_DEVICE, stream)
                        .map_err(Fail::Acl)
                })
            } else {
                match &st.backings[&id].chunks[i as usize].host {
                    None => Ok(()), // never written
                    Some(Host::Dram(slot)) => self
                        .rt
                        .memcpy_async(
                            va + off,
                            slot.ptr as u64,
                            CHUNK,
                            MemcpyKind::HOST_TO_DEVICE,
                            stream,
                        )
                        .map_err(Fail::Acl),
                    Some(Host::Nvme(_)) => match self.stage_from_nvme(&mut st, dev, id, i) {
                        Ok(buf) => {
                            bufs.push(buf);
                            self.rt
                                .memcpy_async(
                                    va + off,
                                    buf,
                                    CHUNK,
                                    MemcpyKind::HOST_TO_DEVICE,
                                    stream,
                                )
                                .map_err(Fail::Acl)
                        }
                        Err(f) => Err(f),
                    },
                }
            };
            match r {
                Ok(()) => {
                    snap.push((last, phys));
                    let c = st.chunk_mut(id, i);
                    c.pins += 1;
                    pinned.push((id, i));
                    i += 1;
                }
                // every staging buffer in flight (ours among them): the
                // copies so far are waited for, then the pass goes on
                Err(Fail::Busy) if !bufs.is_empty() || st.wait_for.is_some() => {
                    let named = st.wait_for.take();
                    let w;
                    (st, w) = self.wait_copies(st, dev, stream, named, locked);
                    if let Err(e) = w {
                        err = Some(e);
                    }
                    for b in bufs.drain(..) {
                        self.give_staging(&mut st, dev, b);
                    }
                    if !st.backings.contains_key(&id) {
                        break;
                    }
                }
                Err(f) => err = Some(f.acl()),
            }
        }
        if err.is_none() && st.backings.contains_key(&id) {
            let w;
            (st, w) = self.wait_copies(st, dev, stream, None, locked);
            if let Err(e) = w {
                err = Some(e);
            }
        } else if err.is_some() {
            // what was issued must land before its sources may go
            (st, _) = self.wait_copies(st, dev, stream, None, locked);
        }
        self.unreserve(&mut st, &mut pinned);
        for s in scratch {
            let _ = self.rt.unmap(s);
            self.give_move_va(&mut st, dev, s);
        }
        for b in bufs {
            self.give_staging(&mut st, dev, b);
        }
        if let Some(e) = err {
            return (Pass::Failed(e), st);
        }
        let Some(b) = st.backings.get(&id) else {
            return (Pass::Gone, st);
        };
        if b.real() != 0 || st.dev(dev).lost {
            return (Pass::Gone, st);
        }
        // a call used a chunk meanwhile: its write may have come after the
        // copy read the chunk
        let same = b
            .chunks
            .iter()
            .zip(&snap)
            .all(|(c, &(last, phys))| c.last == last && c.phys == phys);
        (if same { Pass::Current } else { Pass::Disturbed }, st)
    }

    /// Waits for the copies `materialize` queued on u3m's `stream` (an
    /// event recorded after them) and for `named` (another transfer's
    /// event, a staging buffer's), without the lock — with it held when
    /// `locked` or when no event can be had. The result is the copies'.
    fn wait_copies<'a>(
        &'a self,
        mut st: StGuard<'a>,
        dev: u32,
        stream: u64,
        named: Option<u64>,
        locked: bool,
    ) -> (StGuard<'a>, Result<(), AclError>) {
        let ev = if locked {
            None
        } else {
            self.use_event(&mut st, stream)
        };
        let Some(ev) = ev else {
            let r = self.rt.sync_stream(stream);
            return (st, r);
        };
        let mut evs = vec![ev];
        if let Some(n) = named.filter(|n| st.event_refs.contains_key(n)) {
            *st.event_refs.entry(n).or_insert(0) += 1;
            evs.push(n);
        }
        drop(st);
        let mut r = Ok(());
        for (k, &e) in evs.iter().enumerate() {
            let w = on_device(self.rt, dev, || self.rt.sync_event(e))
                .unwrap_or_else(|| self.rt.sync_event(e));
            if k == 0 {
                r = w;
            }
        }
        let mut st = match self.st.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        for e in evs {
            st.unref_event(e);
        }
        (st, r)
    }

    /// Swaps backing `id`'s chunks for `real` (holding their data now) at
    /// every VA it is mapped at, lock held; the backing is pinned for good.
    fn swap_in_real(
        &self,
        st: &mut State,
        id: u64,
        dev: u32,
        size: u64,
        real: u64,
    ) -> Result<u64, AclError> {
        // (`materialize` waited for its copy-outs unlocked; with the lock
        // held only after EXPORT_TRIES disturbed passes)
        self.drop_copy_vas_of(st, dev, id);
        // swap the chunks for the real handle at every VA it is mapped at
        let vas = st.backings[&id].vas.clone();
        let mut freed = Vec::new();
        let mut unresident = 0;
        let mut unhosted = 0;
        let mut hbm = Vec::new();
        {
            let b = st.backings.get_mut(&id).expect("backing");
            for (i, c) in b.chunks.iter_mut().enumerate() {
                if c.phys != 0 {
                    for &v in &vas {
                        let _ = self.rt.unmap(v + i as u64 * CHUNK);
                    }
                    hbm.push(std::mem::take(&mut c.phys));
                    if std::mem::take(&mut c.on_host) {
                        unhosted += CHUNK;
                    } else {
                        unresident += CHUNK;
                    }
                }
                if let Some(h) = c.host.take() {
                    freed.push(h);
                }
                c.dirty = false;
            }
        }
        for phys in hbm {
            self.free_phys(st, dev, phys);
        }
        st.dev_mut(dev).resident -= unresident;
        st.dev_mut(dev).host_mapped -= unhosted;
        for h in freed {
            st.free_host(h);
        }
        let evs: Vec<u64> = st
            .backings
            .get_mut(&id)
            .expect("backing")
            .chunks
            .iter_mut()
            .flat_map(|c| c.uses.drain(..).map(|u| u.1).collect::<Vec<_>>())
            .collect();
        for ev in evs {
            st.unref_event(ev);
        }
        let mapped = vas.iter().try_for_each(|&v| self.rt.map(v, size, real));
        // even when a mapping failed the data is only in `real` now: keep it
        // as the backing's memory (and report the failure)
        st.set_real(id, real);
        let b = st.backings.get_mut(&id).expect("backing");
        b.pinned = true;
        st.dev_mut(dev).resident += size;
        mapped.map(|()| real)
    }

    /// A call that failed in `prepare` after issuing copy-ins on u3m's
    /// `stream` of `dev` into the chunks it made resident (`reserved`,
    /// pinned): those copies become a use of each such chunk (no other
    /// call runs on one, no eviction takes it, before they land) and are
    /// waited for without the lock, the pins kept meanwhile; with the lock
    /// held only when no event can be had. Returns the guard, retaken.
    pub(super) fn settle_failed_copy_ins<'a>(
        &'a self,
        mut st: StGuard<'a>,
        dev: u32,
        stream: u64,
        reserved: &[(u64, u32)],
    ) -> StGuard<'a> {
        match self.use_event(&mut st, stream) {
            Some(ev) => {
                for &(id, i) in reserved {
                    st.set_use(id, i, stream, ev);
                }
                // (the event's first reference: dropped after the wait)
                self.sync_unlocked(st, Some(dev), vec![ev])
            }
            None => {
                let _ = self.rt.sync_stream(stream);
                st
            }
        }
    }

    /// aclrtResetDevice: the runtime released everything on `dev`; forget
    /// those backings without calling it (their memory is already gone).
    pub fn forget_device(&self, dev: u32) {
        let Ok(mut st) = self.st.lock() else { return };
        self.forget_backings(&mut st, Some(dev));
        // copy-outs in flight give their DRAM slots back
        self.settle_outgoing(&mut st, dev);
        // (moves' old memory went with the device)
        self.forget_moves(&mut st, dev);
        // (its staging buffers are forgotten with it, as the runtime's
        // objects are)
        *st.dev_mut(dev) = super::state::Dev::new();
        self.publish(&st);
    }

    /// Forgets the backings on `dev` (every device: None) without calling
    /// the runtime: their device memory is gone; host copies are given back.
    fn forget_backings(&self, st: &mut State, dev: Option<u32>) {
        let ids: Vec<u64> = st
            .backings
            .iter()
            .filter(|(_, b)| dev.map_or(true, |d| b.dev == d))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            if let Some(mut b) = st.backings.remove(&id) {
                st.structure += 1;
                for va in &b.vas {
                    st.vas.remove(va);
                    self.unroute(*va);
                }
                for c in b.chunks.iter_mut() {
                    if let Some(h) = c.host.take() {
                        st.free_host(h);
                    }
                    c.uses.clear();
                }
                self.live.fetch_sub(1, Relaxed);
            }
        }
    }

    /// Synchronises u3m's `stream` of device `dev` from any thread: the
    /// runtime refuses a stream of another device than the caller's, so the
    /// caller's device is switched to `dev` for it and restored after.
    pub(super) fn sync_on_device(&self, dev: u32, stream: u64) {
        let _ = on_device(self.rt, dev, || self.rt.sync_stream(stream));
    }

    /// Before aclFinalize: the runtime is about to release everything the
    /// process holds, and the program may unload it and load it again. u3m
    /// waits for its own copies, forgets every managed allocation and handle
    /// and every runtime object it made (streams, use events, scratch VAs),
    /// and gives its pinned DRAM and staging buffers back while the runtime
    /// can still take them: a later aclInit starts from nothing, as the
    /// runtime does.
    pub fn finalize(&self) {
        // u3m's own streams are synchronised first, without the lock (no
        // lock across a wait, issue 10 part 2), each on its own device (the
        // runtime refuses another device's stream). Work queued between
        // this wait and the lock below (a program still calling while it
        // finalises) is waited for by `settle_outgoing` with the lock held,
        // as before: correct, only not lock-free.
        let streams: Vec<(u32, [u64; 2])> = {
            let Ok(st) = self.st.lock() else { return };
            (0..st.devs.len())
                .filter(|&d| !st.devs[d].lost)
                .map(|d| (d as u32, [st.devs[d].stream, st.devs[d].out_stream]))
                .filter(|(_, s)| s != &[0, 0])
                .collect()
        };
        for (d, ss) in streams {
            let _ = on_device(self.rt, d, || {
                for s in ss.into_iter().filter(|&s| s != 0) {
                    let _ = self.rt.sync_stream(s);
                }
            });
        }
        let Ok(mut st) = self.st.lock() else { return };
        self.forget_backings(&mut st, None);
        for d in 0..st.devs.len() {
            // copy-outs in flight give their DRAM slots back
            self.settle_outgoing(&mut st, d as u32);
            // moves' copies are complete (the streams were synchronised)
            if st.devs[d].lost {
                self.forget_moves(&mut st, d as u32);
            } else {
                self.release_moves(&mut st, d as u32);
            }
        }
        for (_, h) in std::mem::take(&mut st.pending_free) {
            st.free_host(h);
        }
        for (_, _, h) in std::mem::take(&mut st.fenced_free) {
            st.free_host(h);
        }
        for d in 0..st.devs.len() {
            let staging = st.devs[d].staging;
            if staging != 0 {
                let _ = self.rt.free_host(staging as *mut u8);
            }
            self.free_staging(&mut st, d as u32);
            st.devs[d] = super::state::Dev::new();
        }
        st.event_refs.clear();
        st.in_order.clear();
        st.free_events.clear();
        st.closed_fences.clear();
        self.fences.forget();
        st.wait_for = None;
        st.recently_freed.clear();
        self.publish(&st);
        st.dram.shrink();
    }
}
