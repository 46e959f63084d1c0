//! Use fences: how u3m knows a call's work on a program stream is over
//! without an event per call.
//!
//! A stream runs its work in order. So after a call, `finish` does not
//! record an event: the chunks it used name the stream's *open fence* — an
//! event created but not yet recorded, shared by every call on that stream
//! since the fence opened. Only when someone needs to know (an eviction
//! asks whether the chunk is idle, a free waits for it, the unlocked wait of
//! a busy `prepare`) is the fence recorded on its stream — it completes
//! after all earlier work there, so after every call that named it — and
//! from then on it is an ordinary event; the stream's next call opens a new
//! fence. The first query of a round records it; one record per stream per
//! round however many calls and chunks it covers.
//!
//! `Fenced` wraps the runtime the manager talks to: `event_done`,
//! `sync_event` and `stream_wait` on an open fence record it first, so the
//! modules that evict, free and move chunks go on reading `uses` as events.
//! An unrecorded event must never be queried as is: a runtime may report it
//! complete. Being the one wrapper every allocation of the manager goes
//! through, it also keeps HBM for an allocation u3m does not manage while
//! that allocation is retried (`keep_free`, `evict::Room`).
//!
//! The default stream (0) is not fenced: `finish` records an event per
//! call there, as before, because "stream 0" names a different stream in
//! every context and the record may happen on another thread.
//!
//! Streams that refuse a record: a stream about to be captured has its open
//! fence recorded before capture begins (`before_capture`); after that its
//! calls are ordered by the host and name no fence. If a record fails anyway
//! (a stream destroyed by the program, which must have synchronised it
//! first; a device lost), the stream is synchronised instead, and if that
//! fails too the fence counts as complete, as a failed query does today.
//!
//! Lock order: the residency state, then the fence list; the runtime is
//! called with the fence list held (a record must not race a finish that
//! takes the fence).
//!
//! The join without the list's lock (issue 10: every `finish` took it, two
//! atomic read-modify-writes on a line every thread of the device shares).
//! An open fence also sits in one of a few `Slot`s when one is free: its
//! stream and event, and a `state` word (OPEN bit, a generation, the calls
//! that named it). A call joins it with one compare-and-swap of `state`
//! that adds a call only if the word is unchanged since the call read it
//! OPEN with that stream and event; `settle` takes the fence out of OPEN
//! with a read-modify-write of the same word (under the list's lock) before
//! it records. Both write one word, so they are totally ordered:
//! - the join's CAS first: the settle's RMW reads it (or a later join), so
//!   the join (after the call's launch: `finish` runs after the real call)
//!   happens before the record — the fence completes after the call's work;
//! - the settle first: the word has changed, the join's CAS fails and the
//!   call takes the locked path, where the fence is no longer open (a new
//!   one opens, as before).
//!
//! A slot is reused for a later fence only after a settle cleared OPEN, and
//! `open` writes the new stream and event (release) before the new state
//! (release, next generation). A joiner that read a state of generation g
//! and then a stream or event of a later generation (acquire) therefore
//! happens after that settle, so its CAS reads the changed word and fails;
//! one that read generation g's state reads at least generation g's stream
//! and event. So a successful join names the fence the state it read was
//! for. (The generation has 31 bits: a joiner stalled between its two reads
//! of one slot for 2^31 settles and re-opens of that slot could be fooled;
//! each is a runtime record under the list's lock. Model-checked in
//! loom/src/fence_slot.rs.) The reference a joined
//! fence's event holds is the one taken when it opened: it is dropped only
//! after a settle put it on the closed list and a later `finish` took it
//! there, which a successful join precedes (the shard's lock, held by both
//! `finish` calls, orders the naming use before the drop). Calls whose fence
//! is not in a slot (all slots taken), and every call while fences wait on
//! the closed list (`closed_any`), take the list's lock as before.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Mutex;

use crate::acl::{AclError, MemcpyKind};
use crate::engine::runtime::{on_default_context, on_device, Runtime};

/// A fence is recorded by the call that makes it cover this many calls, even
/// if nobody asked: how far behind a chunk's real last use its fence may
/// complete (an eviction waits for at most this many later calls on the
/// stream), and the only record on the calls' own thread when nothing evicts.
pub(super) const FENCE_CALLS: u32 = 32;

/// Slots for open fences that calls join without the list's lock (see the
/// module doc): a few streams per device, with room to spare so that a
/// stream's home slot (`home_slot`) is mostly free when its fence opens.
const SLOTS: usize = 16;
/// `Slot::state`: the fence is open (joinable).
const OPEN: u64 = 1 << 63;
/// `Slot::state`: the generation, bits 32..63 (a new fence in the slot).
const GEN_ONE: u64 = 1 << 32;
const GEN_MASK: u64 = !OPEN & !(GEN_ONE - 1);
/// `Slot::state`: the calls that named the fence, low 32 bits.
const CALLS_MASK: u64 = GEN_ONE - 1;

/// The slot a fence of `stream` takes if it is free, else the next free one
/// after it (in a ring): calls join the fences of a few streams reading
/// mostly one slot each, not every slot before theirs.
#[inline(always)]
fn home_slot(stream: u64) -> usize {
    const _: () = assert!(SLOTS.is_power_of_two());
    (stream.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOTS.trailing_zeros())) as usize
}

#[derive(Default)]
struct Slot {
    stream: AtomicU64,
    event: AtomicU64,
    state: AtomicU64,
}

/// An open fence, in the list (and maybe in a slot).
struct Open {
    stream: u64,
    event: u64,
    /// Calls that named it when it has no slot (the slot's count otherwise).
    calls: u32,
    /// The stream's device.
    dev: Option<u32>,
    /// Its slot, if it has one.
    slot: Option<usize>,
}

#[derive(Default)]
pub(super) struct List {
    /// Every open (unrecorded) fence.
    open: Vec<Open>,
    /// Fences recorded (or settled) since the manager last looked: each
    /// still holds the reference taken when it opened.
    closed: Vec<u64>,
    /// Fences whose record and stream synchronisation both failed: complete
    /// for every query (their stream is gone).
    dead: Vec<u64>,
}

/// u3m's own streams (copy-in and copy-out, per device) the wrapper knows:
/// two per device.
const OWN_STREAMS: usize = 2 * super::MAX_DEVICES;

/// The fence list's guard, held across a fork.
pub struct ListHold(std::sync::MutexGuard<'static, List>);

/// The runtime with lazily recorded use fences (see the module doc).
pub(super) struct Fenced {
    rt: &'static dyn Runtime,
    list: Mutex<List>,
    /// Some fence is open or dead (queries skip the list otherwise).
    any: AtomicBool,
    /// The closed list holds something (set and cleared under the lock):
    /// the next `finish` takes the lock to drop their references.
    closed_any: AtomicBool,
    /// Open fences joinable without the lock (see the module doc).
    slots: [Slot; SLOTS],
    /// u3m's own streams, each `stream << 8 | device` (0: a free slot).
    /// A stream is usable only from its device's context, and u3m's work on
    /// a device's chunks may be asked for by a thread of another device (a
    /// peer copy, an eviction for it): each use switches to the stream's
    /// device and back (`own_device`).
    own: [AtomicU64; OWN_STREAMS],
    /// HBM kept for a caller outside u3m (`keep_free`): bytes the device's free
    /// memory must keep for it, which this wrapper's `mem_info` does not
    /// report free and its `malloc_physical` does not take.
    kept: AtomicU64,
    /// The device whose state this wrapper serves: its `mem_info` is that
    /// device's, whichever device the calling thread is on (a peer copy
    /// faults in another device's chunks).
    dev: u32,
}

impl Fenced {
    pub fn new(rt: &'static dyn Runtime, dev: u32) -> Fenced {
        Fenced {
            dev,
            rt,
            list: Mutex::new(List::default()),
            any: AtomicBool::new(false),
            closed_any: AtomicBool::new(false),
            slots: std::array::from_fn(|_| Slot::default()),
            own: std::array::from_fn(|_| AtomicU64::new(0)),
            kept: AtomicU64::new(0),
        }
    }

    /// Keeps `bytes` of the device's free HBM for a caller outside u3m: an
    /// allocation the runtime refused, retried once `make_room` evicted
    /// for it. Until `unkeep`, u3m's own allocations (fault-ins, prefetch,
    /// the look-ahead, the program's physical handles) leave them free and
    /// evict instead: other threads ran while `make_room` waited without
    /// the lock, and between its return and the retry (the 207001 that
    /// `tests/hostmap_stream.rs`'s mt_stress saw once in six CI runs).
    pub fn keep_free(&self, bytes: u64) {
        self.kept.fetch_add(bytes, AcqRel);
    }

    /// Gives back what `keep_free` kept.
    pub fn unkeep(&self, bytes: u64) {
        let _ = self
            .kept
            .fetch_update(AcqRel, Acquire, |h| Some(h.saturating_sub(bytes)));
    }

    /// In a forked child: the rooms kept by the parent's threads, which
    /// the child does not have (no `Room` of the child gives them back).
    pub fn forget_kept(&self) {
        self.kept.store(0, Release);
    }

    /// How many bytes the device's free HBM lacks of what is kept.
    pub fn kept_short(&self) -> u64 {
        let kept = self.kept.load(Acquire);
        if kept == 0 {
            return 0;
        }
        let free = self.dev_mem_info().map(|(f, _)| f).unwrap_or(0);
        kept.saturating_sub(free)
    }

    /// The free and total HBM of this wrapper's device. The runtime answers
    /// for the calling thread's device: another device's is asked from it
    /// (`on_device`, which switches back; a runtime that cannot say which
    /// device is current is asked as it is).
    fn dev_mem_info(&self) -> Result<(u64, u64), AclError> {
        on_device(self.rt, self.dev, || self.rt.mem_info())
            .unwrap_or(Err(AclError::RT_PARAM_INVALID))
    }

    /// A new stream of u3m's own on `dev`, created in `dev`'s default
    /// context whatever the calling thread's device and context (a context
    /// the program made takes its streams with it when destroyed), and used
    /// on `dev` by every later copy, record and synchronisation through this
    /// wrapper.
    pub fn create_stream_on(&self, dev: u32) -> Result<u64, AclError> {
        let s = on_default_context(self.rt, dev, || self.rt.create_stream())
            .unwrap_or(Err(AclError::RT_STREAM_CONTEXT))?;
        let word = s << 8 | dev as u64;
        if s >> 56 == 0 {
            for slot in &self.own {
                if slot.compare_exchange(0, word, AcqRel, Relaxed).is_ok() {
                    return Ok(s);
                }
            }
        }
        // no room to remember it (never: two per device), or a handle too
        // wide: usable from `dev`'s threads only, as before
        Ok(s)
    }

    /// Forgets u3m's own streams (their runtime objects are gone).
    fn forget_own(&self) {
        for slot in &self.own {
            slot.store(0, Relaxed);
        }
    }

    /// The device of `stream` if it is one of u3m's own.
    #[inline]
    fn own_device(&self, stream: u64) -> Option<u32> {
        if stream == 0 || stream >> 56 != 0 {
            return None;
        }
        // slots fill in order and empty only all together: the first free
        // one ends the search
        for slot in &self.own {
            match slot.load(Acquire) {
                0 => return None,
                w if w >> 8 == stream => return Some((w & 0xff) as u32),
                _ => {}
            }
        }
        None
    }

    /// Runs `f` (a use of `stream`) in the stream's own device's context if
    /// it is one of u3m's own streams (switching only when the caller's
    /// device differs, and back after).
    #[inline]
    fn on_stream<T>(
        &self,
        stream: u64,
        f: impl FnOnce() -> Result<T, AclError>,
    ) -> Result<T, AclError> {
        match self.own_device(stream) {
            Some(d) => on_device(self.rt, d, f).unwrap_or(Err(AclError::RT_STREAM_CONTEXT)),
            None => f(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, List> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open fence of `stream`, if any.
    #[inline]
    pub fn open_fence(&self, stream: u64) -> Option<u64> {
        if !self.any.load(Acquire) {
            return None;
        }
        self.lock()
            .open
            .iter()
            .find(|f| f.stream == stream)
            .map(|f| f.event)
    }

    /// Opens `ev` (created, never recorded, or complete) as `stream`'s
    /// fence, named by one call so far.
    pub fn open(&self, stream: u64, ev: u64) {
        let mut l = self.lock();
        debug_assert!(l.open.iter().all(|f| f.stream != stream));
        // the device current at the call is the stream's: a record from
        // another device's thread is refused, so `settle` records it there
        let dev = self.rt.current_device();
        // a free slot (not OPEN: its fence was settled, under this lock):
        // stream and event first, then the state that makes them current
        // (the first from the stream's home slot on, where its calls look
        // first: `join_slot`)
        let home = home_slot(stream);
        let slot = (0..SLOTS)
            .map(|j| (home + j) % SLOTS)
            .find(|&k| self.slots[k].state.load(Relaxed) & OPEN == 0);
        if let Some(k) = slot {
            let sl = &self.slots[k];
            let gen = sl.state.load(Relaxed).wrapping_add(GEN_ONE) & GEN_MASK;
            sl.stream.store(stream, Release);
            sl.event.store(ev, Release);
            sl.state.store(OPEN | gen | 1, Release);
        }
        l.open.push(Open {
            stream,
            event: ev,
            calls: 1,
            dev,
            slot,
        });
        self.any.store(true, Release);
    }

    /// The call's join of `stream`'s fence without the list's lock: the
    /// fence's event and the calls that named it now, if a slot holds an
    /// open fence of `stream` and nothing changed it meanwhile (see the
    /// module doc); None: ask the list.
    /// (At most one slot is OPEN for a stream — `open` runs only for a
    /// stream with no open fence, and `settle` clears OPEN before the
    /// stream can open another — so the order the slots are read in
    /// changes nothing but how many are read: from the stream's home slot
    /// on, where `open` put its fence if that slot was free.)
    #[inline]
    fn join_slot(&self, stream: u64) -> Option<(u64, u32)> {
        let home = home_slot(stream);
        for j in 0..SLOTS {
            let sl = &self.slots[(home + j) % SLOTS];
            let s = sl.state.load(Acquire);
            if s & OPEN == 0 || sl.stream.load(Acquire) != stream {
                continue;
            }
            let ev = sl.event.load(Acquire);
            let n = s & CALLS_MASK;
            if n == CALLS_MASK {
                return None;
            }
            return match sl.state.compare_exchange(s, s + 1, AcqRel, Relaxed) {
                Ok(_) => Some((ev, n as u32 + 1)),
                // settled (or joined) meanwhile: the list decides
                Err(_) => None,
            };
        }
        None
    }

    /// What every call's `finish` asks, under one lock of the list every
    /// call shares (was two round trips): the fences recorded since the
    /// last call, into `out` (the caller drops the reference each took when
    /// it opened); and the open fence a call on `stream` names, if any:
    /// (the fence, whether it has now covered `FENCE_CALLS` calls and
    /// should be recorded).
    #[inline]
    pub fn take_closed_and_join(&self, stream: u64, out: &mut Vec<u64>) -> Option<(u64, bool)> {
        if !self.any.load(Acquire) {
            return None;
        }
        // nothing closed to hand over: the stream's fence joined in its
        // slot, without the lock (a closed fence set `closed_any` under the
        // lock before its settle returned; one closed after this read is
        // taken by a later call)
        if !self.closed_any.load(Acquire) {
            if let Some((ev, n)) = self.join_slot(stream) {
                return Some((ev, n >= FENCE_CALLS));
            }
        }
        let mut l = self.lock();
        if !l.closed.is_empty() {
            out.append(&mut l.closed);
            self.closed_any.store(false, Relaxed);
            self.update_any(&l);
        }
        let f = l.open.iter_mut().find(|f| f.stream == stream)?;
        let n = match f.slot {
            // open, so in its slot (settle clears both under this lock);
            // a join without the lock may race this one: one RMW each
            Some(k) => {
                let s = self.slots[k].state.fetch_update(AcqRel, Relaxed, |s| {
                    Some(if s & CALLS_MASK == CALLS_MASK {
                        s
                    } else {
                        s + 1
                    })
                });
                let s = s.unwrap_or_else(|s| s);
                ((s & CALLS_MASK) + 1).min(CALLS_MASK) as u32
            }
            None => {
                f.calls = f.calls.saturating_add(1);
                f.calls
            }
        };
        Some((f.event, n >= FENCE_CALLS))
    }

    fn update_any(&self, l: &List) {
        self.any.store(
            !l.open.is_empty() || !l.dead.is_empty() || !l.closed.is_empty(),
            Release,
        );
    }

    /// Records `stream`'s open fence now (before capture begins on it).
    pub fn close_stream(&self, stream: u64) {
        if let Some(ev) = self.open_fence(stream) {
            self.settle(ev);
        }
    }

    /// The list, held across a fork (`ForkHold`): no thread is recording a
    /// fence then, so the child's copy of the lock is free.
    pub fn hold(&'static self) -> ListHold {
        ListHold(self.lock())
    }

    /// In the forked child: every fence forgotten through the guard held
    /// across the fork (locking again could wait for a thread the child
    /// does not have).
    pub fn forget_held(&self, h: ListHold) {
        let ListHold(mut l) = h;
        *l = List::default();
        self.forget_slots();
        self.any.store(false, Release);
        self.forget_own();
    }

    /// Every slot out of OPEN (their fences are forgotten; the generation
    /// stays, so a join that read one fails).
    fn forget_slots(&self) {
        self.closed_any.store(false, Relaxed);
        for sl in &self.slots {
            sl.state.fetch_and(!OPEN, AcqRel);
        }
    }

    /// Forgets every fence (the runtime's objects are gone: a forked child,
    /// aclFinalize); the state's references went with its event table.
    pub fn forget(&self) {
        let mut l = self.lock();
        *l = List::default();
        self.forget_slots();
        self.any.store(false, Release);
        self.forget_own();
    }

    /// Records `ev` on `stream`; when the runtime refuses a stream of
    /// another device than the caller's, on the stream's own device `dev`
    /// (the caller's device is restored after).
    fn record_on(&self, ev: u64, stream: u64, dev: Option<u32>) -> bool {
        let record = || self.rt.record_event(ev, stream).is_ok();
        match dev {
            Some(d) => on_device(self.rt, d, record).unwrap_or(false),
            None => record(),
        }
    }

    /// If `ev` is an open fence, records it on its stream (see the module
    /// doc for a record that fails). Returns false when `ev` is dead.
    fn settle(&self, ev: u64) -> bool {
        if !self.any.load(Acquire) {
            return true;
        }
        let mut l = self.lock();
        if l.dead.contains(&ev) {
            return false;
        }
        let Some(k) = l.open.iter().position(|f| f.event == ev) else {
            return true;
        };
        let Open {
            stream, dev, slot, ..
        } = l.open.swap_remove(k);
        if let Some(k) = slot {
            // no join after this: one made before it is read here (the
            // same word), so it happens before the record below
            self.slots[k].state.fetch_and(!OPEN, AcqRel);
        }
        l.closed.push(ev);
        self.closed_any.store(true, Release);
        let ok = self.record_on(ev, stream, dev) || {
            // recorded nothing: the stream's work done is what the
            // fence stood for
            let synced = self.rt.sync_stream(stream).is_ok();
            if !synced {
                l.dead.push(ev);
            }
            synced
        };
        if !ok {
            return false;
        }
        // an event that was never recorded reports complete: fine here,
        // the stream was synchronised
        true
    }
}

impl Runtime for Fenced {
    fn set_device(&self, dev: u32) -> Result<(), AclError> {
        self.rt.set_device(dev)
    }
    fn current_device(&self) -> Option<u32> {
        self.rt.current_device()
    }
    fn current_context(&self) -> Option<u64> {
        self.rt.current_context()
    }
    fn set_context(&self, ctx: u64) -> Result<(), AclError> {
        self.rt.set_context(ctx)
    }
    fn malloc_physical(&self, dev: u32, bytes: u64) -> Result<u64, AclError> {
        let kept = self.kept.load(Acquire);
        if kept > 0 {
            // what a full device answers: the callers evict and try again
            let (free, _) = self.dev_mem_info()?;
            if free < kept.saturating_add(bytes) {
                return Err(AclError::RT_MEMORY_ALLOCATION);
            }
        }
        self.rt.malloc_physical(dev, bytes)
    }
    fn free_physical(&self, handle: u64) -> Result<(), AclError> {
        self.rt.free_physical(handle)
    }
    fn malloc_physical_host(&self, dev: u32, bytes: u64) -> Result<u64, AclError> {
        self.rt.malloc_physical_host(dev, bytes)
    }
    fn reserve(&self, bytes: u64) -> Result<u64, AclError> {
        self.rt.reserve(bytes)
    }
    fn release(&self, va: u64) -> Result<(), AclError> {
        self.rt.release(va)
    }
    fn map(&self, va: u64, bytes: u64, handle: u64) -> Result<(), AclError> {
        self.rt.map(va, bytes, handle)
    }
    fn unmap(&self, va: u64) -> Result<(), AclError> {
        self.rt.unmap(va)
    }
    fn create_stream(&self) -> Result<u64, AclError> {
        self.rt.create_stream()
    }
    fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        kind: MemcpyKind,
        stream: u64,
    ) -> Result<(), AclError> {
        self.on_stream(stream, || {
            self.rt.memcpy_async(dst, src, bytes, kind, stream)
        })
    }
    fn memset_async(&self, dst: u64, bytes: u64, value: u8, stream: u64) -> Result<(), AclError> {
        self.on_stream(stream, || self.rt.memset_async(dst, bytes, value, stream))
    }
    fn sync_stream(&self, stream: u64) -> Result<(), AclError> {
        self.on_stream(stream, || self.rt.sync_stream(stream))
    }
    fn create_event(&self) -> Result<u64, AclError> {
        self.rt.create_event()
    }
    fn record_event(&self, event: u64, stream: u64) -> Result<(), AclError> {
        self.on_stream(stream, || self.rt.record_event(event, stream))
    }
    fn event_done(&self, event: u64) -> Result<bool, AclError> {
        if !self.settle(event) {
            return Err(AclError::RT_PARAM_INVALID);
        }
        self.rt.event_done(event)
    }
    fn sync_event(&self, event: u64) -> Result<(), AclError> {
        if !self.settle(event) {
            return Err(AclError::RT_PARAM_INVALID);
        }
        self.rt.sync_event(event)
    }
    fn stream_wait(&self, stream: u64, event: u64) -> Result<(), AclError> {
        if !self.settle(event) {
            return Err(AclError::RT_PARAM_INVALID);
        }
        self.on_stream(stream, || self.rt.stream_wait(stream, event))
    }
    fn orders_pages(&self) -> bool {
        self.rt.orders_pages()
    }
    fn elapsed_ns(&self, start: u64, end: u64) -> Result<u64, AclError> {
        if !self.settle(start) || !self.settle(end) {
            return Err(AclError::RT_PARAM_INVALID);
        }
        self.rt.elapsed_ns(start, end)
    }
    fn malloc_host(&self, bytes: u64) -> Result<*mut u8, AclError> {
        self.rt.malloc_host(bytes)
    }
    fn free_host(&self, ptr: *mut u8) -> Result<(), AclError> {
        self.rt.free_host(ptr)
    }
    fn mem_info(&self) -> Result<(u64, u64), AclError> {
        let (free, total) = self.dev_mem_info()?;
        Ok((free.saturating_sub(self.kept.load(Acquire)), total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicU32;

    /// A runtime of launches and records only: an event's record notes how
    /// many calls its stream had launched by then.
    #[derive(Default)]
    struct Launches {
        launched: [AtomicU64; 3],
        next_event: AtomicU64,
        /// event -> (stream, calls launched on it when recorded)
        records: Mutex<HashMap<u64, (u64, u64)>>,
    }

    fn unused<T>() -> Result<T, AclError> {
        Err(AclError::RT_PARAM_INVALID)
    }

    impl Runtime for Launches {
        fn set_device(&self, _dev: u32) -> Result<(), AclError> {
            Ok(())
        }
        fn malloc_physical(&self, _dev: u32, _bytes: u64) -> Result<u64, AclError> {
            unused()
        }
        fn free_physical(&self, _handle: u64) -> Result<(), AclError> {
            unused()
        }
        fn malloc_physical_host(&self, _dev: u32, _bytes: u64) -> Result<u64, AclError> {
            unused()
        }
        fn reserve(&self, _bytes: u64) -> Result<u64, AclError> {
            unused()
        }
        fn release(&self, _va: u64) -> Result<(), AclError> {
            unused()
        }
        fn map(&self, _va: u64, _bytes: u64, _handle: u64) -> Result<(), AclError> {
            unused()
        }
        fn unmap(&self, _va: u64) -> Result<(), AclError> {
            unused()
        }
        fn create_stream(&self) -> Result<u64, AclError> {
            unused()
        }
        fn memcpy_async(
            &self,
            _dst: u64,
            _src: u64,
            _bytes: u64,
            _kind: MemcpyKind,
            _stream: u64,
        ) -> Result<(), AclError> {
            unused()
        }
        fn memset_async(&self, _: u64, _: u64, _: u8, _: u64) -> Result<(), AclError> {
            unused()
        }
        fn sync_stream(&self, _stream: u64) -> Result<(), AclError> {
            Ok(())
        }
        fn create_event(&self) -> Result<u64, AclError> {
            Ok(self.next_event.fetch_add(1, Relaxed) + 1)
        }
        fn record_event(&self, event: u64, stream: u64) -> Result<(), AclError> {
            let n = self.launched[stream as usize].load(SeqCst);
            let old = self.records.lock().unwrap().insert(event, (stream, n));
            assert!(old.is_none(), "fence {event} recorded twice");
            Ok(())
        }
        fn event_done(&self, event: u64) -> Result<bool, AclError> {
            Ok(self.records.lock().unwrap().contains_key(&event))
        }
        fn sync_event(&self, _event: u64) -> Result<(), AclError> {
            Ok(())
        }
        fn stream_wait(&self, _stream: u64, _event: u64) -> Result<(), AclError> {
            Ok(())
        }
        fn malloc_host(&self, _bytes: u64) -> Result<*mut u8, AclError> {
            unused()
        }
        fn free_host(&self, _ptr: *mut u8) -> Result<(), AclError> {
            unused()
        }
        fn mem_info(&self) -> Result<(u64, u64), AclError> {
            unused()
        }
    }

    /// Calls on two streams launch, then join their stream's fence (or open
    /// one), as `finish` does under the device's lock, while another thread
    /// settles the fences they name as evictions and waits do (no lock but
    /// the list's): every fence a call named is recorded after that call's
    /// launch, never before, whether the call joined it in its slot or
    /// through the list, and the fences cycle through the slots (more
    /// fences than slots, each settled by a query or by its 32nd call).
    #[test]
    fn a_fence_a_call_names_is_recorded_after_its_launch() {
        let rt: &'static Launches = Box::leak(Box::default());
        let f: &'static Fenced = Box::leak(Box::new(Fenced::new(rt, 0)));
        let shard = Mutex::new(());
        let stop = AtomicBool::new(false);
        let latest = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
        let opened = AtomicU32::new(0);
        // fences the settler found recorded (by itself or by a 32nd call);
        // the calls go on until it has seen enough (a loaded machine may
        // not run it at first)
        let settled = AtomicU64::new(0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let named: Vec<(u64, u64, u64)> = std::thread::scope(|sc| {
            let settler = sc.spawn(|| {
                while !stop.load(Relaxed) {
                    for l in &latest[1..] {
                        let ev = l.load(Acquire);
                        if ev != 0 && f.event_done(ev) == Ok(true) {
                            settled.fetch_add(1, Relaxed);
                        }
                    }
                    std::thread::yield_now();
                }
            });
            let callers: Vec<_> = (1..=2u64)
                .map(|stream| {
                    let (shard, latest, opened, settled) = (&shard, &latest, &opened, &settled);
                    sc.spawn(move || {
                        let mut named = Vec::new();
                        let mut closed = Vec::new();
                        let mut i = 0u32;
                        while i < 20_000
                            || (settled.load(Relaxed) < 1_000
                                && std::time::Instant::now() < deadline)
                        {
                            i += 1;
                            if i % 64 == 0 {
                                std::thread::yield_now();
                            }
                            // the call's launch, then its finish
                            let p = rt.launched[stream as usize].fetch_add(1, SeqCst) + 1;
                            let _st = shard.lock().unwrap();
                            let ev = match f.take_closed_and_join(stream, &mut closed) {
                                Some((ev, full)) => {
                                    if full {
                                        f.close_stream(stream);
                                    }
                                    ev
                                }
                                None => {
                                    let ev = rt.create_event().unwrap();
                                    f.open(stream, ev);
                                    opened.fetch_add(1, Relaxed);
                                    ev
                                }
                            };
                            closed.clear();
                            latest[stream as usize].store(ev, Release);
                            named.push((ev, stream, p));
                        }
                        named
                    })
                })
                .collect();
            let named = callers
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect();
            stop.store(true, Relaxed);
            settler.join().unwrap();
            named
        });
        let settled = settled.load(Relaxed);
        assert!(
            settled >= 1_000,
            "the settler saw {settled} fences recorded"
        );
        // the fences still open, recorded now
        for s in 1..=2 {
            f.close_stream(s);
        }
        let opened = opened.load(Relaxed);
        assert!(
            opened as usize > 2 * SLOTS,
            "{opened} fences: the slots were not reused"
        );
        let records = rt.records.lock().unwrap();
        for &(ev, stream, p) in &named {
            let Some(&(s, n)) = records.get(&ev) else {
                panic!("fence {ev} named by a call was never recorded");
            };
            assert_eq!(s, stream, "fence {ev} recorded on another stream");
            assert!(
                n >= p,
                "fence {ev} recorded after {n} launches on stream {stream}, \
                 but a call named it after its launch {p}"
            );
        }
    }

    /// Every fence in a slot is joined there, without the list's lock,
    /// whatever its stream's home slot: streams sharing a home take the
    /// free slots after it and their calls find them; a fence opened with
    /// every slot taken is joined through the list.
    #[test]
    fn streams_sharing_a_home_slot_are_each_joined_in_their_slot() {
        let rt: &'static Launches = Box::leak(Box::default());
        let f: &'static Fenced = Box::leak(Box::new(Fenced::new(rt, 0)));
        // half the slots' worth of streams with one home, the rest with the
        // home after it (so those find it taken too)
        let h0 = home_slot(1);
        let mut streams: Vec<u64> = (1..)
            .filter(|&s| home_slot(s) == h0)
            .take(SLOTS / 2)
            .collect();
        streams.extend(
            (1..)
                .filter(|&s| home_slot(s) == (h0 + 1) % SLOTS)
                .take(SLOTS - SLOTS / 2),
        );
        let evs: Vec<u64> = streams
            .iter()
            .map(|&s| {
                let ev = rt.create_event().unwrap();
                f.open(s, ev);
                ev
            })
            .collect();
        for n in 2..4 {
            for (k, &s) in streams.iter().enumerate() {
                assert_eq!(f.join_slot(s), Some((evs[k], n)), "stream {s}");
            }
        }
        let extra = (1..).find(|s| !streams.contains(s)).unwrap();
        let ev = rt.create_event().unwrap();
        f.open(extra, ev);
        assert_eq!(f.join_slot(extra), None);
        assert_eq!(
            f.take_closed_and_join(extra, &mut Vec::new()),
            Some((ev, false))
        );
    }
}
