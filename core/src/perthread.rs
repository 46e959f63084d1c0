//! Per-thread buffers registered with their owner (issue 10 part 2): what
//! the heat table (`heat/pending.rs`) and the buffered policy
//! (`policy/pending.rs`) share.
//!
//! An owner (a heat table, a policy wrapper) has a [`Registry`]: an id
//! (from one counter, never reused), the list of every thread's
//! [`Buf`] for it, and an `off` flag (a forked child: the owner stops
//! buffering). A thread finds its buffer for an owner with
//! [`Registry::mine`], which creates and registers it on the thread's first
//! call. The thread-local side holds one `Arc` of each of the thread's
//! buffers (`MINE`, dropped when the thread exits) and, per kind of owner
//! ([`SLOT_HEAT`], [`SLOT_POLICY`]), the (id, buffer) of the last one used
//! (`LAST`: a const thread-local with no destructor, so the hot path's
//! lookup checks no lazy state). A `LAST` entry is valid while `MINE`
//! holds its buffer: `Mine::drop` clears every entry first, and `MINE`
//! lets go of a buffer only once its registry has (its owner was dropped,
//! and its id, never reused, is then never looked up again).
//!
//! A registry keeps a buffer until only the registry holds it (its thread
//! has exited): [`Buf::orphaned`]. What a buffer holds and when it is
//! applied is the owner's business; the registry's lock also guards the
//! owner's scratch space (`S`), so an owner applying under it has both.

use std::any::Any;
use std::cell::{Cell, RefCell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard, TryLockResult};

/// Ids of registries (a thread's buffers are found by their registry's id).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// `LAST` slot of heat tables.
pub(crate) const SLOT_HEAT: usize = 0;
/// `LAST` slot of buffered policies.
pub(crate) const SLOT_POLICY: usize = 1;
/// `LAST` slot of [`PerThread`] values (the publisher's calls in progress).
pub(crate) const SLOT_VALUE: usize = 2;
const SLOTS: usize = 3;

/// One thread's buffer for one owner.
///
/// Its lock is a spin lock of one word: taken with one compare-and-swap,
/// released with a plain release store. A `std::sync::Mutex` releases
/// with a swap (it must see whether to wake a sleeper): a second atomic
/// read-modify-write, ~8 ns uncontended on the machine of BENCHMARKS.md
/// (fast3), on every call of the owner's thread. Contention is rare and
/// short: the owner holds its buffer for one call's append, an applier
/// for one copy or apply; a waiter spins briefly, then yields its CPU (the
/// holder may be descheduled), and never sleeps, so there is no wake-up
/// to miss. The guard releases on unwinding too (a panic never leaves a
/// buffer locked: the data is plain and kept consistent at every step).
pub(crate) struct Buf<T> {
    /// The owner's flag that `p` holds something (set and cleared under
    /// the lock; read without it to skip a clean buffer).
    pub(crate) dirty: AtomicBool,
    /// 1 while locked.
    held: std::sync::atomic::AtomicU32,
    p: UnsafeCell<T>,
}

// SAFETY: `p` is reached only through a `BufGuard`, and a guard exists
// only while `held` is 1 and was set by that guard's `lock`/`try_lock`
// (acquire on taking, release on dropping): one thread at a time.
unsafe impl<T: Send> Sync for Buf<T> {}
unsafe impl<T: Send> Send for Buf<T> {}

/// A locked [`Buf`].
pub(crate) struct BufGuard<'a, T> {
    b: &'a Buf<T>,
}

impl<T> std::ops::Deref for BufGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock (see `Buf`)
        unsafe { &*self.b.p.get() }
    }
}

impl<T> std::ops::DerefMut for BufGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock (see `Buf`)
        unsafe { &mut *self.b.p.get() }
    }
}

impl<T> Drop for BufGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.b.held.store(0, Release);
    }
}

impl<T> Buf<T> {
    fn new(t: T) -> Buf<T> {
        Buf {
            dirty: AtomicBool::new(false),
            held: std::sync::atomic::AtomicU32::new(0),
            p: UnsafeCell::new(t),
        }
    }

    /// The buffer, locked (waits, spinning then yielding, while another
    /// thread holds it).
    #[inline]
    pub(crate) fn lock(&self) -> BufGuard<'_, T> {
        if self.held.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
            self.lock_contended();
        }
        BufGuard { b: self }
    }

    #[inline(never)]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            if self.held.load(Relaxed) == 0
                && self
                    .held
                    .compare_exchange_weak(0, 1, Acquire, Relaxed)
                    .is_ok()
            {
                return;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The buffer if it can be locked without waiting.
    pub(crate) fn try_lock(&self) -> Option<BufGuard<'_, T>> {
        self.held
            .compare_exchange(0, 1, Acquire, Relaxed)
            .ok()
            .map(|_| BufGuard { b: self })
    }

    /// Only the registry holds it: its thread has exited.
    #[inline]
    pub(crate) fn orphaned(b: &Arc<Buf<T>>) -> bool {
        Arc::strong_count(b) <= 1
    }
}

/// What the registry's lock guards: every thread's buffer, and the owner's
/// scratch space.
pub(crate) struct Bufs<T, S> {
    pub(crate) bufs: Vec<Arc<Buf<T>>>,
    pub(crate) s: S,
}

/// The registry of an owner's per-thread buffers: see the module
/// documentation.
pub(crate) struct Registry<T, S = ()> {
    id: u64,
    slot: usize,
    reg: Mutex<Bufs<T, S>>,
    /// Set in a forked child: no buffering, nothing to apply (what that
    /// means is the owner's; the registry only keeps the flag).
    pub(crate) off: AtomicBool,
}

type Entry = (u64, Arc<dyn Any + Send + Sync>);

struct Mine(RefCell<Vec<Entry>>);

impl Drop for Mine {
    fn drop(&mut self) {
        let _ = LAST.try_with(|l| {
            for e in l {
                e.set((0, std::ptr::null()));
            }
        });
    }
}

thread_local! {
    /// This thread's buffers: (registry id, buffer).
    static MINE: Mine = const { Mine(RefCell::new(Vec::new())) };
    /// Per slot, (registry id, its buffer in `MINE`) of the last lookup.
    static LAST: [Cell<(u64, *const ())>; SLOTS] =
        const { [const { Cell::new((0, std::ptr::null())) }; SLOTS] };
}

/// The calling thread's `LAST`, looked up once and handed down a call's
/// path (each look-up of a thread-local in this shared library is a call of
/// `__tls_get_addr`, ~11 Ir): valid on its thread for the thread's life
/// (`LAST` is const, with no destructor), and not `Send` (a raw pointer).
/// The glue keeps its thread's in its own per-thread state and hands it to
/// `Engine::run_in` (`engine::Here`).
/// (Never null, and transparent: `Option<Here>` is one word, None all
/// zeros, so the glue's zero-initialised per-thread block holds one.)
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Here(std::ptr::NonNull<[Cell<(u64, *const ())>; SLOTS]>);

impl Here {
    /// The calling thread's (None: its thread-locals are unavailable).
    #[inline]
    pub fn now() -> Option<Here> {
        LAST.try_with(|l| Here(std::ptr::NonNull::from(l))).ok()
    }

    /// Slot `slot` (< SLOTS: a registry's, checked when it was made).
    #[inline]
    fn get(self, slot: usize) -> (u64, *const ()) {
        debug_assert!(slot < SLOTS);
        // SAFETY: the calling thread's `LAST` (`Here` is not `Send`), alive
        // as long as the thread; `slot` is in bounds (`Registry::new`
        // asserts it of every registry's slot)
        unsafe { self.0.as_ref().get_unchecked(slot).get() }
    }
}

impl<T: Send + 'static, S> Registry<T, S> {
    /// A registry whose owners of one kind share `LAST` slot `slot`.
    pub(crate) fn new(slot: usize, s: S) -> Registry<T, S> {
        assert!(slot < SLOTS);
        Registry {
            id: NEXT_ID.fetch_add(1, Relaxed),
            slot,
            reg: Mutex::new(Bufs {
                bufs: Vec::new(),
                s,
            }),
            off: AtomicBool::new(false),
        }
    }

    /// The registry's buffers, locked (poison ignored: see `Buf::lock`).
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, Bufs<T, S>> {
        self.reg.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn try_lock(&self) -> TryLockResult<MutexGuard<'_, Bufs<T, S>>> {
        self.reg.try_lock()
    }

    /// The registry's lock itself (tests hold it as a thread at a fork would).
    #[cfg(test)]
    pub(crate) fn mutex(&self) -> &Mutex<Bufs<T, S>> {
        &self.reg
    }

    /// `f` on the calling thread's buffer, created (`make`) and registered
    /// on its first call. None, with `f` not called, when the thread's
    /// buffers are unavailable (the thread is exiting, or its list is
    /// borrowed by a call further up its stack). (The owners call
    /// `mine_in` with the `Here` their callers looked up; tests use this.)
    #[cfg(test)]
    pub(crate) fn mine<R>(
        &self,
        make: impl FnOnce() -> T,
        f: impl FnOnce(&Buf<T>) -> R,
    ) -> Option<R> {
        self.mine_in(Here::now(), make, f)
    }

    /// [`mine`](Self::mine) with the calling thread's `LAST` looked up
    /// already (`here`: [`Here::now`] on this thread). Always inlined: its
    /// fast path is a compare (the slow path is out of line).
    #[inline(always)]
    pub(crate) fn mine_in<R>(
        &self,
        here: Option<Here>,
        make: impl FnOnce() -> T,
        f: impl FnOnce(&Buf<T>) -> R,
    ) -> Option<R> {
        if let Some(h) = here {
            let (i, p) = h.get(self.slot);
            if i == self.id {
                // SAFETY: `LAST` names a `Buf<T>` that `MINE` holds (see
                // the module documentation); ids are never reused and this
                // registry registers only `Buf<T>`s under its id
                return Some(f(unsafe { &*(p as *const Buf<T>) }));
            }
        }
        self.mine_slow(make, f)
    }

    #[inline(never)]
    fn mine_slow<R>(&self, make: impl FnOnce() -> T, f: impl FnOnce(&Buf<T>) -> R) -> Option<R> {
        let (id, slot) = (self.id, self.slot);
        let note = |b: &Buf<T>| {
            let _ = LAST.try_with(|l| l[slot].set((id, b as *const Buf<T> as *const ())));
        };
        MINE.try_with(|m| {
            {
                let v = m.0.try_borrow().ok()?;
                if let Some((_, b)) = v.iter().find(|(i, _)| *i == id) {
                    let b = b.downcast_ref::<Buf<T>>()?;
                    note(b);
                    return Some(f(b));
                }
            }
            let buf = Arc::new(Buf::new(make()));
            {
                let mut v = m.0.try_borrow_mut().ok()?;
                // buffers of registries dropped since (only this thread holds them)
                v.retain(|(_, b)| Arc::strong_count(b) > 1);
                self.lock().bufs.push(buf.clone());
                v.push((id, buf.clone()));
            }
            note(&buf);
            Some(f(&buf))
        })
        .ok()
        .flatten()
    }

    /// `f` on the calling thread's buffer if it has one (never created).
    pub(crate) fn this_thread<R>(&self, f: impl FnOnce(&Buf<T>) -> R) -> Option<R> {
        MINE.try_with(|m| {
            let v = m.0.try_borrow().ok()?;
            let (_, b) = v.iter().find(|(i, _)| *i == self.id)?;
            Some(f(b.downcast_ref::<Buf<T>>()?))
        })
        .ok()
        .flatten()
    }

    /// The calling thread's buffer (tests).
    #[cfg(test)]
    pub(crate) fn mine_arc(&self) -> Option<Arc<Buf<T>>> {
        let me = self.this_thread(|b| b as *const Buf<T>)?;
        self.lock()
            .bufs
            .iter()
            .find(|b| std::ptr::eq(Arc::as_ptr(b), me))
            .cloned()
    }
}

/// One value per thread and owner, with no lock: the thread's own value
/// (`mine`) and every thread's (`each`). For values only their thread
/// writes and others only read — a count kept with a load and a store
/// instead of a read-modify-write on a line every thread shares (the
/// publisher's calls in progress, engine/publish.rs). Found through the
/// same `LAST` and `MINE` as a [`Registry`]'s buffers (slot `SLOT_VALUE`),
/// so it lives as long as its thread (then only the owner holds it:
/// `each` drops it once `done` says its value is finished with).
pub(crate) struct PerThread<T> {
    id: u64,
    all: Mutex<Vec<Arc<T>>>,
}

impl<T: Send + Sync + 'static> Default for PerThread<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + Sync + 'static> PerThread<T> {
    pub(crate) fn new() -> PerThread<T> {
        PerThread {
            id: NEXT_ID.fetch_add(1, Relaxed),
            all: Mutex::new(Vec::new()),
        }
    }

    /// `f` on the calling thread's value, created (`make`) and registered
    /// on its first call. None, with `f` not called, when the thread's
    /// values are unavailable (it is exiting, or its list is borrowed by a
    /// call further up its stack).
    #[inline]
    pub(crate) fn mine<R>(&self, make: impl FnOnce() -> T, f: impl FnOnce(&T) -> R) -> Option<R> {
        let id = self.id;
        if let Ok((i, p)) = LAST.try_with(|l| l[SLOT_VALUE].get()) {
            if i == id {
                // SAFETY: as in `Registry::mine`: `LAST` names a `T` that
                // `MINE` holds, registered under this never-reused id
                return Some(f(unsafe { &*(p as *const T) }));
            }
        }
        self.mine_slow(make, f)
    }

    /// [`mine`](Self::mine) with the calling thread's `LAST` looked up
    /// already (`here`: [`Here::now`] on this thread; None: looked up here).
    #[inline]
    pub(crate) fn mine_in<R>(
        &self,
        here: Option<Here>,
        make: impl FnOnce() -> T,
        f: impl FnOnce(&T) -> R,
    ) -> Option<R> {
        let Some(h) = here else {
            return self.mine(make, f);
        };
        let (i, p) = h.get(SLOT_VALUE);
        if i == self.id {
            // SAFETY: as in `mine`
            return Some(f(unsafe { &*(p as *const T) }));
        }
        self.mine_slow(make, f)
    }

    #[inline(never)]
    fn mine_slow<R>(&self, make: impl FnOnce() -> T, f: impl FnOnce(&T) -> R) -> Option<R> {
        let id = self.id;
        let note = |v: &T| {
            let _ = LAST.try_with(|l| l[SLOT_VALUE].set((id, v as *const T as *const ())));
        };
        MINE.try_with(|m| {
            {
                let v = m.0.try_borrow().ok()?;
                if let Some((_, b)) = v.iter().find(|(i, _)| *i == id) {
                    let b = b.downcast_ref::<T>()?;
                    note(b);
                    return Some(f(b));
                }
            }
            let val = Arc::new(make());
            {
                let mut v = m.0.try_borrow_mut().ok()?;
                v.retain(|(_, b)| Arc::strong_count(b) > 1);
                self.all
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(val.clone());
                v.push((id, val.clone()));
            }
            note(&val);
            Some(f(&val))
        })
        .ok()
        .flatten()
    }

    /// How many values are kept (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.all.lock().unwrap().len()
    }

    /// `f` on every thread's value; an exited thread's is dropped once
    /// `done(value)` (nothing more to read from it).
    pub(crate) fn each(&self, done: impl Fn(&T) -> bool, mut f: impl FnMut(&T)) {
        let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|v| {
            f(v);
            Arc::strong_count(v) > 1 || !done(v)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffer lock excludes: threads add to a plain counter under it
    /// (`lock`, and `try_lock` when it succeeds) and none of the additions
    /// is lost; `try_lock` fails while it is held; a panic while holding it
    /// releases it. Fails if the lock does not exclude (lost updates) or
    /// is not released on unwinding (the last lock waits for ever).
    #[test]
    fn the_buffer_lock_excludes() {
        let b: Arc<Buf<(u64, u64)>> = Arc::new(Buf::new((0, 0)));
        let hs: Vec<_> = (0..4)
            .map(|k| {
                let b = b.clone();
                std::thread::spawn(move || {
                    let mut tried = 0;
                    for i in 0..20_000u64 {
                        if k % 2 == 1 && i % 3 == 0 {
                            if let Some(mut g) = b.try_lock() {
                                // a read-modify-write in two steps, with a
                                // chance for another thread to interleave
                                let v = g.0;
                                std::hint::spin_loop();
                                g.0 = v + 1;
                                tried += 1;
                            }
                        } else {
                            let mut g = b.lock();
                            let v = g.0;
                            if i % 97 == 0 {
                                std::thread::yield_now();
                            }
                            g.0 = v + 1;
                            g.1 += 1;
                        }
                    }
                    tried
                })
            })
            .collect();
        let tried: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        let g = b.lock();
        assert_eq!(g.0, g.1 + tried, "lost updates");
        assert!(b.try_lock().is_none(), "try_lock while held");
        drop(g);
        let b2 = b.clone();
        let r = std::thread::spawn(move || {
            let _g = b2.lock();
            panic!("while holding the buffer");
        })
        .join();
        assert!(r.is_err());
        assert!(b.try_lock().is_some(), "released on unwinding");
    }

    /// Each thread gets its own buffer per registry, found again on its
    /// next call (through `LAST` and, for two registries of one slot in
    /// turn, through `MINE`); an exited thread's buffer is orphaned; a
    /// dropped registry's buffers leave the thread's list.
    #[test]
    fn one_buffer_per_thread_and_registry() {
        let a: Arc<Registry<u32>> = Arc::new(Registry::new(SLOT_HEAT, ()));
        let b: Registry<u32> = Registry::new(SLOT_HEAT, ());
        let p: Registry<Vec<u8>> = Registry::new(SLOT_POLICY, ());
        for k in 0..10u32 {
            a.mine(|| 0, |x| *x.lock() += 1).unwrap();
            b.mine(|| 100, |x| *x.lock() += k).unwrap();
            p.mine(Vec::new, |x| x.lock().push(k as u8)).unwrap();
        }
        assert_eq!(*a.mine_arc().unwrap().lock(), 10);
        assert_eq!(*b.mine_arc().unwrap().lock(), 145);
        assert_eq!(p.mine_arc().unwrap().lock().len(), 10);
        let a2 = a.clone();
        std::thread::spawn(move || {
            a2.mine(|| 7, |x| *x.lock() += 1).unwrap();
            assert_eq!(*a2.mine_arc().unwrap().lock(), 8);
        })
        .join()
        .unwrap();
        {
            let g = a.lock();
            assert_eq!(g.bufs.len(), 2);
            // the spawned thread's: only the registry holds it now (its
            // thread-local destructors ran before the join returned)
            assert_eq!(g.bufs.iter().filter(|b| Buf::orphaned(b)).count(), 1);
        }
        drop(b);
        let c: Registry<u32> = Registry::new(SLOT_HEAT, ());
        c.mine(|| 0, |_| ()).unwrap();
        // b's buffer left MINE when c registered its own
        assert_eq!(MINE.with(|m| m.0.borrow().len()), 3);
    }
}
