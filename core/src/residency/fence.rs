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
//! complete.
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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Mutex;

use crate::acl::{AclError, MemcpyKind};
use crate::engine::runtime::{on_default_context, on_device, Runtime};

/// A fence is recorded by the call that makes it cover this many calls, even
/// if nobody asked: how far behind a chunk's real last use its fence may
/// complete (an eviction waits for at most this many later calls on the
/// stream), and the only record on the calls' own thread when nothing evicts.
pub(super) const FENCE_CALLS: u32 = 32;

#[derive(Default)]
pub(super) struct List {
    /// (stream, event, calls that named it, the stream's device) of every
    /// open (unrecorded) fence.
    open: Vec<(u64, u64, u32, Option<u32>)>,
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
    /// u3m's own streams, each `stream << 8 | device` (0: a free slot).
    /// A stream is usable only from its device's context, and u3m's work on
    /// a device's chunks may be asked for by a thread of another device (a
    /// peer copy, an eviction for it): each use switches to the stream's
    /// device and back (`own_device`).
    own: [AtomicU64; OWN_STREAMS],
}

impl Fenced {
    pub fn new(rt: &'static dyn Runtime) -> Fenced {
        Fenced {
            rt,
            list: Mutex::new(List::default()),
            any: AtomicBool::new(false),
            own: std::array::from_fn(|_| AtomicU64::new(0)),
        }
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
        self.lock().open.iter().find(|f| f.0 == stream).map(|f| f.1)
    }

    /// Opens `ev` (created, never recorded, or complete) as `stream`'s
    /// fence, named by one call so far.
    pub fn open(&self, stream: u64, ev: u64) {
        let mut l = self.lock();
        debug_assert!(l.open.iter().all(|f| f.0 != stream));
        // the device current at the call is the stream's: a record from
        // another device's thread is refused, so `settle` records it there
        let dev = self.rt.current_device();
        l.open.push((stream, ev, 1, dev));
        self.any.store(true, Release);
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
        let mut l = self.lock();
        if !l.closed.is_empty() {
            out.append(&mut l.closed);
            self.update_any(&l);
        }
        let f = l.open.iter_mut().find(|f| f.0 == stream)?;
        f.2 += 1;
        Some((f.1, f.2 >= FENCE_CALLS))
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
        self.any.store(false, Release);
        self.forget_own();
    }

    /// Forgets every fence (the runtime's objects are gone: a forked child,
    /// aclFinalize); the state's references went with its event table.
    pub fn forget(&self) {
        let mut l = self.lock();
        *l = List::default();
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
        let Some(k) = l.open.iter().position(|f| f.1 == ev) else {
            return true;
        };
        let (stream, _, _, dev) = l.open.swap_remove(k);
        l.closed.push(ev);
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
        self.rt.mem_info()
    }
}
