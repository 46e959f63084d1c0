//! Residency state per device (issue 10 part 2): one `Shard` per device,
//! each behind its own lock, owning that device's backings and chunks, its
//! event pool, use fences and per-call scratch. A call on device 1 takes
//! device 1's lock only, so it never waits for device 0's evictions,
//! copy-ins, frees, host-mapping or lost-device handling.
//!
//! Shared by every device (`Parts`): the policy (keys are global VAs; its
//! own lock), the DRAM and NVMe stores (each behind a short leaf lock), the
//! counters, the logical clock, and `routes` (VA -> device, read-mostly: a
//! free, an unmap, or a call whose ranges span devices looks its devices up
//! there). Backing ids are their device modulo `MAX_DEVICES`, so a handle
//! names its device.
//!
//! Lock order: device locks in ascending device order, then `routes`, then
//! a store's lock. No path holds two device locks except the fork handler
//! (`hold_for_fork`: every device, ascending). A call spanning devices (a
//! peer copy) is prepared device by device in ascending order, each device's
//! chunks pinned before the next device is locked: the pins of one device
//! never wait on a device below it, so two such calls cannot wait on each
//! other.

use std::sync::atomic::{
    AtomicU32,
    Ordering::{Acquire, Relaxed, SeqCst},
};

use super::lifecycle::ShardHold;
use super::state::{dev_index, id_of};
use super::{
    protocol, Allocations, Counters, Oversize, Parts, Room, Shard, E_DEVICE_LOST, MAX_DEVICES,
};
use crate::acl::AclError;
use crate::config::Config;
use crate::engine::report::Refusal;
use crate::engine::runtime::Runtime;
use crate::engine::Range;
use crate::perthread::Here;
use crate::policy::{HeatFn, Placement};

use super::Order;

/// A call in progress: the chunks it pinned, per device.
#[derive(Default)]
pub struct Token {
    /// The first device's chunks (the only one for a call on one device).
    pub(super) dev: u32,
    pub(super) tok: protocol::Token,
    /// Other devices' chunks (a call spanning devices).
    pub(super) more: Vec<(u32, protocol::Token)>,
}

impl Token {
    /// Whether it holds no buffer (what `finish_in` leaves when the pool
    /// takes its buffers back, or the call had one chunk: every call's
    /// case): then it can be forgotten, there being nothing to free. The
    /// caller tests its own token in place (`release(self)` copied the
    /// whole token to test the copy, on every call's path).
    #[inline]
    pub fn holds_nothing(&self) -> bool {
        !self.tok.holds_buffers() && self.more.capacity() == 0
    }

    /// Whether the call touches managed memory at all.
    pub fn is_empty(&self) -> bool {
        self.tok.is_empty() && self.more.iter().all(|(_, t)| t.is_empty())
    }
}

/// Every device's residency lock (ascending) and the routing table, held
/// across fork() (`hold_for_fork`).
pub struct ForkHold(
    Vec<Option<ShardHold>>,
    #[allow(dead_code)] // held, not read: released in parent and child
    Option<std::sync::RwLockWriteGuard<'static, std::collections::BTreeMap<u64, (u64, u32)>>>,
);

/// The residency manager (tier mode): one state per device.
pub struct Residency {
    rt: &'static dyn Runtime,
    shards: Box<[Shard; MAX_DEVICES]>,
    /// Backings alive on every device (the states' shared count).
    live: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Devices whose state has held a backing (a bit each): a call on a
    /// device when no other device's state ever held one takes that
    /// device's lock only, with no routing.
    used: AtomicU32,
    /// Devices lost (a bit each).
    lost: AtomicU32,
    /// The policy's `after_call_flag`.
    after_call_flag: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// The states of the devices in `m` (a bit each), ascending.
struct Used<'a> {
    m: u32,
    shards: &'a [Shard],
}

impl<'a> Iterator for Used<'a> {
    type Item = &'a Shard;
    #[inline]
    fn next(&mut self) -> Option<&'a Shard> {
        if self.m == 0 {
            return None;
        }
        let k = self.m.trailing_zeros() as usize;
        self.m &= self.m - 1;
        Some(&self.shards[k])
    }
}

#[inline]
fn bit(dev: u32) -> u32 {
    1 << dev_index(dev)
}

impl Residency {
    /// `rt` lives for the process (libu3m leaks it); the policy is U3M_POLICY's.
    pub fn new(rt: &'static dyn Runtime, cfg: &Config) -> Result<Residency, String> {
        let policy = crate::policy::by_config(cfg)
            .ok_or_else(|| format!("U3M_POLICY: unknown policy '{}'", cfg.policy))?;
        Residency::with_policy(rt, cfg, policy)
    }

    /// With a policy object of the caller's (`u3m replay` passes policies
    /// that need the trace's future).
    pub fn with_policy(
        rt: &'static dyn Runtime,
        cfg: &Config,
        policy: Box<dyn Placement>,
    ) -> Result<Residency, String> {
        let after_call_flag = policy.after_call_flag();
        let parts = Parts::new(rt, cfg, policy)?;
        let shards: Vec<Shard> = (0..MAX_DEVICES as u32)
            .map(|s| Shard::new(rt, cfg, &parts, s))
            .collect();
        let Ok(shards) = shards.into_boxed_slice().try_into() else {
            unreachable!("one state per device")
        };
        Ok(Residency {
            rt,
            shards,
            live: parts.live.clone(),
            used: AtomicU32::new(0),
            lost: AtomicU32::new(0),
            after_call_flag,
        })
    }

    /// The program queued, or is about to queue, device work that waits for
    /// its host: a host function or callback, a value or notify wait. From
    /// now on no eviction orders u3m's streams after program work
    /// (U3M_HANDOFF: `Shard::may_order_after_program`, migrate.rs). Called
    /// by the hook before the work is queued.
    pub fn program_waits_on_host(&self) {
        // (one flag, shared by every device's state)
        let flag = &self.shards[0].host_waits;
        if flag.load(SeqCst) {
            return;
        }
        flag.store(true, SeqCst);
        // An ordered eviction checks the flag and queues its stream's waits
        // (recording a stream's open use fence) under its device's lock:
        // passing through every lock here, one at a time, lets one in
        // progress end before the caller queues its work, so none waits
        // for that work.
        for s in self.used_shards() {
            drop(s.st.lock());
        }
    }

    /// Whether the program queued work that waits for its host
    /// (`program_waits_on_host`; U3M_SUMMARY's `tier.host_waits`).
    pub fn host_waits(&self) -> bool {
        self.shards[0].host_waits.load(SeqCst)
    }

    /// The policy's `after_call` after a call (engine `resident`), not
    /// called while the policy's flag for it is clear (`after_call_flag`:
    /// it would do nothing).
    #[inline]
    pub fn after_call(&self) {
        if self
            .after_call_flag
            .as_ref()
            .is_none_or(|f| f.load(Relaxed))
        {
            self.policy().after_call();
        }
    }

    #[inline]
    fn shard(&self, dev: u32) -> &Shard {
        &self.shards[dev_index(dev)]
    }

    /// The states that ever held a backing, ascending.
    #[inline]
    fn used_shards(&self) -> Used<'_> {
        Used {
            m: self.used.load(Relaxed),
            shards: &self.shards[..],
        }
    }

    /// Whether `va` may be managed memory: inside the VA span some
    /// device's state ever entered (a cheap filter before `routes`).
    #[inline]
    fn may_own(&self, va: u64) -> bool {
        self.used_shards()
            .any(|s| va >= s.va_lo.load(Acquire) && va < s.va_hi.load(Acquire))
    }

    /// The device whose memory `va` is in (`routes`).
    fn owner(&self, va: u64) -> Option<&Shard> {
        if !self.may_own(va) {
            return None;
        }
        let r = self.shards[0].routes.read().ok()?;
        let (&start, &(len, dev)) = r.range(..=va).next_back()?;
        (va < start + len).then(|| self.shard(dev))
    }

    /// The device whose memory starts at `va` (`routes`).
    fn owner_at(&self, va: u64) -> Option<&Shard> {
        if !self.may_own(va) {
            return None;
        }
        let dev = self.shards[0].routes.read().ok()?.get(&va)?.1;
        Some(self.shard(dev))
    }

    /// The state of u3m's handle `h` (its backing id names the device).
    fn handle_owner(&self, h: u64) -> Option<&Shard> {
        id_of(h).map(|id| &self.shards[(id % MAX_DEVICES as u64) as usize])
    }

    /// `dev`'s state may hold backings from now on.
    #[inline]
    fn note_used(&self, dev: u32) {
        if self.used.load(Relaxed) & bit(dev) == 0 {
            self.used.fetch_or(bit(dev), Relaxed);
        }
    }

    #[cfg(test)]
    pub(super) fn shard_of(&self, dev: u32) -> &Shard {
        self.shard(dev)
    }

    // ------------------------------------------------------------ calls

    /// Before a call touching `ranges`: every chunk they cover is resident
    /// and pinned. `overwrite`: write ranges replace whole chunks' contents
    /// (copies, memsets), so those chunks need no copy-in.
    /// `class`: the operator class of the call (OpClass as u8), for the policy.
    pub fn prepare(
        &self,
        dev: u32,
        class: u8,
        ranges: &[Range],
        overwrite: bool,
        order: Order,
    ) -> Result<Token, AclError> {
        let mut tok = Token::default();
        self.prepare_timed(&mut tok, dev, class, ranges, overwrite, order, None)
            .0
            .map(|()| tok)
    }

    /// [`prepare`](Self::prepare) into the caller's `tok` (empty on entry;
    /// filled in place: see `Shard::prepare_timed`), and how long the call
    /// stalled in it (ns). On an error `tok` is left empty. `here`: the
    /// calling thread's `LAST` if looked up already (perthread.rs).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_timed(
        &self,
        tok: &mut Token,
        dev: u32,
        class: u8,
        ranges: &[Range],
        overwrite: bool,
        order: Order,
        here: Option<Here>,
    ) -> (Result<(), AclError>, Option<u64>) {
        tok.dev = dev;
        if self.used.load(Relaxed) & !bit(dev) == 0 {
            // no other device ever had managed memory: this device's lock only
            return self.shard(dev).prepare_timed(
                &mut tok.tok,
                dev,
                class,
                ranges,
                overwrite,
                order,
                here,
            );
        }
        self.prepare_spanning(tok, dev, class, ranges, overwrite, order, here)
    }

    /// `prepare` once several devices have managed memory: the devices the
    /// ranges touch (`routes`), each prepared in ascending order.
    #[allow(clippy::too_many_arguments)]
    fn prepare_spanning(
        &self,
        out: &mut Token,
        dev: u32,
        class: u8,
        ranges: &[Range],
        overwrite: bool,
        order: Order,
        here: Option<Here>,
    ) -> (Result<(), AclError>, Option<u64>) {
        let mut mask = 0u32;
        if let Ok(r) = self.shards[0].routes.read() {
            for rg in ranges {
                if rg.len == 0 {
                    continue;
                }
                let end = rg.addr.saturating_add(rg.len);
                for (&start, &(len, d)) in r.range(..end).rev() {
                    if start + len <= rg.addr {
                        break;
                    }
                    mask |= bit(d);
                }
            }
        }
        if mask == 0 {
            return (Ok(()), None);
        }
        // nothing runs on a lost device
        if self.lost.load(Relaxed) & bit(dev) != 0 {
            return (Err(E_DEVICE_LOST), None);
        }
        let mut stall: Option<u64> = None;
        let mut first = true;
        for s in 0..MAX_DEVICES as u32 {
            if mask & (1 << s) == 0 {
                continue;
            }
            // the caller's device: copy-ins run on u3m's stream of the
            // calling device (as with one state), which that device's state
            // keeps (`Dev::stream` of the caller in each state)
            let shard = &self.shards[s as usize];
            let (r, t) = if first {
                out.dev = s;
                shard.prepare_timed(&mut out.tok, dev, class, ranges, overwrite, order, here)
            } else {
                let mut tok = protocol::Token::default();
                let r = shard.prepare_timed(&mut tok, dev, class, ranges, overwrite, order, here);
                if r.0.is_ok() {
                    out.more.push((s, tok));
                }
                r
            };
            first = false;
            if let Some(t) = t {
                stall = Some(stall.unwrap_or(0) + t);
            }
            if let Err(e) = r {
                // the devices prepared so far give their pins back (the
                // failed one pinned nothing: its token is empty)
                self.finish_in(out, None, false);
                return (Err(e), stall);
            }
        }
        (Ok(()), stall)
    }

    /// After the call: unpin; on success note the use on `stream` and the
    /// writes (see `Shard::finish`).
    pub fn finish(&self, mut tok: Token, stream: Option<u64>, ok: bool) {
        self.finish_in(&mut tok, stream, ok);
    }

    /// [`finish`](Self::finish) of the caller's token, in place (left empty).
    #[inline]
    pub fn finish_in(&self, tok: &mut Token, stream: Option<u64>, ok: bool) {
        self.shard(tok.dev).finish_in(&mut tok.tok, stream, ok);
        if !tok.more.is_empty() {
            self.finish_more(tok, stream, ok);
        }
    }

    /// `finish_in` of the pins on other devices' shards (a call touching
    /// more than one device: rare, out of line).
    #[inline(never)]
    fn finish_more(&self, tok: &mut Token, stream: Option<u64>, ok: bool) {
        for (s, mut t) in tok.more.drain(..) {
            self.shard(s).finish_in(&mut t, stream, ok);
        }
    }

    /// After a `make_room` that found every candidate still in use: waits,
    /// without any lock, for the use the eviction named. false: there was
    /// nothing to wait for.
    pub fn wait_busy(&self) -> bool {
        let mut any = false;
        for s in self.used_shards() {
            any |= s.wait_busy();
        }
        any
    }

    /// Makes every managed chunk of [addr, addr+len) resident and pins the
    /// backings for good (exported memory must stay where it is).
    pub fn pin_range(&self, dev: u32, addr: u64, len: u64) -> Result<(), AclError> {
        if !self.active() {
            return Ok(());
        }
        match self.owner(addr) {
            // the caller's device, as a call spanning devices passes it
            Some(s) if s.shard != dev_index(dev) as u32 => s.pin_range(dev, addr, len),
            _ => self.shard(dev).pin_range(dev, addr, len),
        }
    }

    /// Before capture begins on `stream`: the fence its earlier calls named
    /// is recorded now, on every device's state.
    pub fn before_capture(&self, stream: u64) {
        for s in self.used_shards() {
            s.before_capture(stream);
        }
    }

    // ------------------------------------------------------ allocations

    /// `ptr` is the start of a managed aclrtMalloc allocation.
    pub fn is_managed(&self, ptr: u64) -> bool {
        self.owner_at(ptr)
            .map(|s| s.is_managed(ptr))
            .unwrap_or(false)
    }

    /// `ptr` was a managed allocation just freed (remembered in a small ring).
    pub fn was_managed(&self, ptr: u64) -> bool {
        self.used_shards().any(|s| s.was_managed(ptr))
    }

    pub fn is_handle(&self, h: u64) -> bool {
        self.handle_owner(h)
            .map(|s| s.is_handle(h))
            .unwrap_or(false)
    }

    /// What aclrtGetMemInfo(HBM) reports in tier mode (`Shard::mem_info`).
    pub fn mem_info(&self, dev: u32, free: u64, total: u64) -> (u64, u64) {
        self.shard(dev).mem_info(dev, free, total)
    }

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

    /// `malloc` of `size` bytes that owns `room` bytes (`Shard::malloc_with_room`).
    /// Whether an allocation of `size` bytes on `dev` is u3m's to serve: a
    /// caller that is told no need not ask the runtime for free memory.
    pub fn manages_size(&self, dev: u32, size: u64) -> bool {
        self.shard(dev).manages_size(size)
    }

    pub fn malloc_with_room(
        &self,
        dev: u32,
        size: u64,
        room: u64,
        free: u64,
        total: u64,
    ) -> Option<Result<u64, AclError>> {
        // before the VA exists: a call naming it routes to this device
        self.note_used(dev);
        self.shard(dev)
            .malloc_with_room(dev, size, room, free, total)
    }

    /// aclrtFree: Some(result) for a managed allocation, None otherwise; on
    /// the allocation's device's state, whichever device calls.
    pub fn free(&self, ptr: u64) -> Option<Result<(), AclError>> {
        self.owner_at(ptr)?.free(ptr)
    }

    /// See `Residency::discard` (on the allocation's device's state).
    pub fn discard(&self, va: u64, bytes: u64) -> Option<u64> {
        self.owner(va)?.discard(va, bytes)
    }

    /// `u3m replay --policy plan`, after each call: `keys` leave HBM in the
    /// schedule from now; the noted chunks whose uses are complete are
    /// evicted (planned.rs).
    pub fn evict_planned(&self, keys: &[u64]) {
        for s in self.used_shards() {
            s.evict_planned(keys);
        }
    }

    /// aclrtMallocPhysical: Some(handle) when u3m hands out its own handle.
    pub fn malloc_physical(
        &self,
        dev: u32,
        size: u64,
        shareable: bool,
    ) -> Option<Result<u64, AclError>> {
        self.note_used(dev);
        self.shard(dev).malloc_physical(dev, size, shareable)
    }

    /// aclrtFreePhysical of u3m's handle (None: not u3m's).
    pub fn free_physical(&self, h: u64) -> Option<Result<(), AclError>> {
        self.handle_owner(h)?.free_physical(h)
    }

    /// aclrtMapMem of u3m's handle (None: not u3m's).
    pub fn map(&self, va: u64, size: u64, offset: u64, h: u64) -> Option<Result<(), AclError>> {
        self.handle_owner(h)?.map(va, size, offset, h)
    }

    /// aclrtUnmapMem of a mapping of u3m's handle (None: not one).
    pub fn unmap(&self, va: u64) -> Option<Result<(), AclError>> {
        self.owner_at(va)?.unmap(va)
    }

    /// An exported handle must be real (`Shard::export`).
    pub fn export(&self, h: u64) -> Option<Result<u64, AclError>> {
        self.handle_owner(h)?.export(h)
    }

    /// A synchronous copy between host memory and one managed allocation
    /// in a forked child (`Shard::child_copy`), on the allocation's device.
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
        self.owner(dev_addr)?
            .child_copy(dev_addr, host, len, to_device)
    }

    /// A device-to-host read from a lost device's managed memory
    /// (`Shard::read_lost`), on the memory's device.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes.
    pub unsafe fn read_lost(
        &self,
        src: u64,
        dst: *mut u8,
        len: u64,
    ) -> Option<Result<(), AclError>> {
        if !self.any_lost() {
            return None;
        }
        self.owner(src)?.read_lost(src, dst, len)
    }

    // ------------------------------------------------ devices, lifecycle

    /// fork's prepare step: every device's residency lock (ascending) and
    /// the routing table, held across the fork so the child's copy of the
    /// state is consistent and its locks free.
    pub fn hold_for_fork(&'static self) -> Option<ForkHold> {
        let holds = self.shards.iter().map(|s| s.hold_for_fork()).collect();
        let routes = self.shards[0].routes.write().ok();
        Some(ForkHold(holds, routes))
    }

    /// In a forked child (`Shard::after_fork_child`), for every device.
    pub fn after_fork_child(&self, hold: Option<ForkHold>) -> Result<(), String> {
        let (mut holds, routes) = match hold {
            Some(ForkHold(h, r)) => (h, r),
            None => (Vec::new(), None),
        };
        drop(routes);
        let mut res = Ok(());
        for (k, s) in self.shards.iter().enumerate() {
            let h = holds.get_mut(k).and_then(|h| h.take());
            let r = s.after_fork_child(h);
            if res.is_ok() {
                res = r;
            }
        }
        res
    }

    /// Test hook (LIBU3M_TEST_PANIC_AT): panics with device 0's lock held.
    pub fn panic_under_lock(&self, why: &str) {
        self.shards[0].panic_under_lock(why)
    }

    /// aclrtResetDevice: forget `dev`'s backings (`Shard::forget_device`),
    /// and the streams of `dev` other devices' states made for calls on
    /// `dev` that spanned them.
    pub fn forget_device(&self, dev: u32) {
        for s in self.shards.iter() {
            s.forget_device(dev);
        }
    }

    /// Before aclFinalize (`Shard::finalize`), device by device.
    pub fn finalize(&self) {
        for s in self.shards.iter() {
            s.finalize();
        }
    }

    /// Whether any device has been lost (the copy path's fast check).
    #[inline]
    pub fn any_lost(&self) -> bool {
        self.lost.load(Relaxed) != 0
    }

    /// Whether the hooks should work out which outputs a call writes whole
    /// (for aclop launches that costs two getter calls per output). It
    /// saves a copy-in only for a chunk with contents out of HBM, which
    /// only an eviction (or a lost device) makes; but the policy also
    /// learns from it (the predictor models which uses write a chunk
    /// whole), and what it learns in the first step decides the second's
    /// victims. So: from the moment some device's managed memory reaches
    /// half its HBM, or a chunk is evicted (set for good), or a device is
    /// lost. A program that stays well inside HBM never pays for it, and
    /// `Range::whole` false is always safe (at worst a copy-in is made).
    #[inline]
    pub fn whole_writes_matter(&self) -> bool {
        self.shards[0].crowded.load(Relaxed) || self.any_lost()
    }

    /// Card failure: `dev` disappeared (`Shard::device_lost`).
    /// Every state learns it (a call on `dev` spanning another device's
    /// memory is refused there too).
    pub fn device_lost(&self, dev: u32) -> Option<(Allocations, Allocations)> {
        self.lost.fetch_or(bit(dev), Relaxed);
        let r = self.shard(dev).device_lost(dev);
        for s in self
            .shards
            .iter()
            .filter(|s| s.shard != dev_index(dev) as u32)
        {
            let _ = s.device_lost(dev);
        }
        r
    }

    pub fn set_capacity(&self, dev: u32, total: u64) {
        self.shard(dev).set_capacity(dev, total)
    }

    pub fn capacity(&self, dev: u32) -> u64 {
        self.shard(dev).capacity(dev)
    }

    /// Devices with managed memory that are not lost (for the background
    /// thread).
    pub fn devices(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.used_shards().flat_map(|s| s.devices()).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    // ------------------------------------------------------- background

    /// Background eviction on `dev` (`Shard::enforce_watermarks`).
    pub fn enforce_watermarks(&self, dev: u32, low: f64, high: f64) -> u32 {
        self.shard(dev).enforce_watermarks(dev, low, high)
    }

    /// Evict managed chunks of `dev` to make room for `bytes`, kept for
    /// the caller until the `Room` is dropped (`Shard::make_room`).
    pub fn make_room(&self, dev: u32, bytes: u64) -> Option<Room> {
        self.shard(dev).make_room(dev, bytes)
    }

    /// Background prefetch on `dev` (`Shard::prefetch`).
    pub fn prefetch(&self, dev: u32, budget: u64, low: f64, horizon: u64) -> u32 {
        self.shard(dev).prefetch(dev, budget, low, horizon)
    }

    /// DRAM -> NVMe spill (`Shard::spill_dram`), device by device.
    pub fn spill_dram(&self, dt_s: f64) -> u32 {
        // U3M_SSD_RATE is the process's: each device's state gets its share
        let n = self.used.load(Relaxed).count_ones().max(1);
        self.used_shards()
            .map(|s| s.spill_dram(dt_s / n as f64))
            .sum()
    }

    /// Turns the look-ahead prefetch on or off (on by default).
    pub fn set_look_ahead(&self, on: bool) {
        for s in self.shards.iter() {
            s.set_look_ahead(on);
        }
    }

    /// The look-ahead depth of `dev` now, ticks.
    pub fn look_ahead_depth(&self, dev: u32) -> u64 {
        self.shard(dev).look_ahead_depth(dev)
    }

    /// The policy's periodic work (`secs` since the engine started) and its
    /// events since the last call.
    pub fn tick_policy(&self, secs: f64) -> Vec<String> {
        // every device with a capacity counts, as with one state
        let (mut r, mut c) = (0u64, 0u64);
        for s in self.shards.iter() {
            if let Ok(st) = s.st.lock() {
                let d = st.dev(s.shard);
                r += d.resident;
                c += d.capacity;
            }
        }
        let frac = if c == 0 { 0.0 } else { r as f64 / c as f64 };
        let policy = self.policy();
        policy.tick(secs, frac);
        let mut ev = Vec::new();
        policy.drain_events(&mut ev);
        ev
    }

    /// At exit: the swap file's private directory goes.
    pub fn shutdown(&self) {
        for s in self.shards.iter() {
            s.shutdown();
        }
    }

    // ------------------------------------------------------------ figures

    /// Where eviction asks a chunk's heat (set once the engine is in place).
    pub fn set_heat_fn(&self, f: HeatFn) {
        self.policy().set_heat_fn(f);
    }

    pub fn policy(&self) -> &dyn Placement {
        &*self.shards[0].policy
    }

    pub fn runtime(&self) -> &'static dyn Runtime {
        self.rt
    }

    /// The engine's logical clock (one tick per tracked call, every device).
    pub fn now(&self) -> u64 {
        self.shards[0].clock.load(Relaxed)
    }

    pub fn counters(&self) -> Counters {
        self.shards[0].c.snapshot()
    }

    /// NVMe writes and reads that failed so far (the data stayed in DRAM).
    pub fn spill_errors(&self) -> u64 {
        self.shards[0].c.spill_errors.load(Relaxed)
    }

    /// Bytes per tier on `dev`: (hbm resident, dram, nvme) — DRAM and NVMe
    /// are process-wide.
    pub fn usage(&self, dev: usize) -> (u64, u64, u64) {
        self.shard(dev as u32).usage(dev)
    }

    /// Every managed chunk of `dev` in HBM now (`Shard::resident_chunks`).
    pub fn resident_chunks(&self, dev: u32, out: &mut Vec<(u64, bool)>) {
        self.shard(dev).resident_chunks(dev, out)
    }

    /// Keeps (or stops keeping) a log of the chunks copied in and evicted,
    /// every device (`Shard::set_move_log`; tools only).
    pub fn set_move_log(&self, on: bool) {
        for s in self.shards.iter() {
            s.set_move_log(on);
        }
    }

    /// The moves logged since the last call, every device, each device's
    /// in order (`Shard::take_moves`).
    pub fn take_moves(&self, out: &mut Vec<super::Move>) {
        for s in self.shards.iter() {
            s.take_moves(out);
        }
    }

    /// Whether some managed chunk resident on `dev` may yet leave HBM
    /// (`Shard::may_move`).
    pub fn may_move(&self, dev: u32) -> bool {
        self.shard(dev).may_move(dev)
    }

    /// Bytes of managed memory of `dev` host-mapped now.
    pub fn host_mapped(&self, dev: u32) -> u64 {
        self.shard(dev).host_mapped(dev)
    }

    /// Foreground evictions and busy retries so far, every device.
    pub fn demand_count(&self) -> u64 {
        self.used_shards().map(|s| s.demand_count()).sum()
    }

    /// Managed memory that is not resident in HBM, over all devices.
    pub fn host_demand(&self) -> u64 {
        self.used_shards().map(|s| s.host_demand()).sum()
    }

    /// U3M_PLAN: why the schedule stopped being followed (the first entry
    /// the run did not match), if it did.
    pub fn schedule_stopped(&self) -> Option<String> {
        let f = self.shards[0].schedule.as_ref()?;
        f.stopped.lock().ok()?.clone()
    }

    /// U3M_PLAN=auto: what its planning has done so far (None: not auto).
    pub fn auto_plan(&self) -> Option<super::autoplan::AutoState> {
        let f = self.shards[0].schedule.as_ref()?;
        f.auto.as_ref()?.state.lock().ok().map(|s| s.clone())
    }

    /// The chunk a policy key names, in U3M_PLAN's terms: (device, the
    /// allocation's ordinal among the device's managed ones, chunk index)
    /// (`u3m replay --plan-export`). None: no live chunk.
    pub fn schedule_ordinal(&self, key: u64) -> Option<(u32, u64, u32)> {
        self.used_shards().find_map(|s| {
            let st = s.st.lock().ok()?;
            let (id, i) = st.resolve(key)?;
            let (dev, alloc) = super::schedule::ordinal_of(id);
            Some((dev, alloc, i))
        })
    }

    /// The figures of the allocation `malloc` last refused, once.
    pub fn take_refusal(&self) -> Option<Refusal> {
        self.used_shards().find_map(|s| s.take_refusal())
    }

    /// The figures of the call `prepare` last refused as too large, once.
    pub fn take_oversize(&self) -> Option<Oversize> {
        self.used_shards().find_map(|s| s.take_oversize())
    }

    /// The DRAM and NVMe tiers' byte limits.
    pub fn limits(&self) -> (u64, u64) {
        (self.shards[0].dram_limit, self.shards[0].nvme_limit)
    }

    /// Whether any managed memory exists (the hot path's cheap check).
    #[inline]
    pub fn active(&self) -> bool {
        self.live.load(Relaxed) != 0
    }
}
