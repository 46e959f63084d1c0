//! Per-thread buffers of a policy's accesses (issue 10 part 2): the
//! operator hot path no longer takes the policy's mutex.
//!
//! [`Buffered`] wraps a [`Placement`]: `on_access` appends the call (logical
//! time, class, keys, writes) to the calling thread's buffer instead of
//! updating the policy's model. The buffered calls reach the wrapped
//! policy, every thread's merged in logical-time order (`now`, the
//! engine's global clock: unique per call, increasing in every thread),
//! before anything reads the model: every other method of the trait —
//! `order`, `order_top`, `order_ttl`, `predicts`, `next_use`, `upcoming`,
//! `place`, `tick`, `drain_events`, `on_free` (so a freed key's accesses
//! count before the free, none after it for the key's next owner) —
//! applies them first. A thread applies them too when its buffer is full
//! (every buffer, in order, not only its own: the policy never sees a
//! thread's later call before another thread's earlier one that was
//! already buffered). So that this is rare, a buffer a quarter full is
//! *due*: in the library the call that makes it due wakes the engine's
//! applier thread (engine/applier.rs), which applies them all off the
//! calls; a buffer three quarters full that it has not reached yet, or any
//! due buffer when there is no applier (`u3m replay`, tests), is applied by
//! the first thread to see it after its call ([`Placement::after_call`],
//! outside the engine's locks; one flag read otherwise). A
//! decision therefore sees exactly the accesses whose
//! `on_access` returned before it, in the order of their clock, as the
//! unbuffered policy would; `u3m replay` (one thread) gives the same
//! decisions byte for byte.
//!
//! Locks, in the order they nest: the registry (held while applying, so
//! two appliers never interleave their calls), the threads' buffers (an
//! owner takes its own once per call, never two; an applier takes every
//! dirty one at once, for a consistent cut: see `apply`), the wrapped
//! policy's own. Nothing here takes a lock
//! of the engine. A decision with nothing buffered anywhere reads one
//! flag (`any`) and locks nothing.
//!
//! Fork: in a child the parent's threads may have held their buffers' or
//! the registry's lock; [`Placement::after_fork_child`] applies what can be
//! locked without waiting and turns buffering off for good (the child's
//! accesses go to the policy at once). A registry held at the fork means
//! an applier was inside the wrapped policy, whose lock may then never be
//! released in the child: that child never calls the policy again (it
//! evicts in recency order and predicts nothing) instead of waiting.

use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, MutexGuard, OnceLock, TryLockError};
use std::thread::Thread;

use super::{Accesses, Cand, HeatFn, Place, Placement, Touch};
use crate::perthread::{self, Bufs};

/// Calls per buffer; a full buffer is applied by the call that finds it
/// full (with the engine's residency lock held).
const CALLS: usize = 256;
/// Keys per buffer; a call with more keys than this goes to the policy at
/// once (after everything buffered).
const KEYS: usize = 2048;
/// A buffer holding this many calls or keys is *due*: with an applier
/// thread ([`Placement::set_applier`]) the call wakes it, which applies the
/// buffers; without one its thread applies them after its call, outside
/// the engine's locks ([`Placement::after_call`]), so a full buffer is rare.
const DUE_CALLS: usize = CALLS / 4;
const DUE_KEYS: usize = KEYS / 4;
/// With an applier thread: a buffer this full that the applier has not
/// taken yet (it is slow or descheduled) is applied by its own thread
/// after its call, as without one.
const OVERDUE_CALLS: usize = CALLS * 3 / 4;
const OVERDUE_KEYS: usize = KEYS * 3 / 4;

/// One thread's buffered calls, in the order it made them (fixed arrays:
/// appending is a bounds check and a copy; the applier swaps the box).
struct Calls {
    /// (now, class, end of its keys in `keys`)
    calls: [(u64, u8, u16); CALLS],
    n: usize,
    keys: [u64; KEYS],
    writes: [Touch; KEYS],
    nk: usize,
}

impl Calls {
    fn boxed() -> Box<Calls> {
        Box::new(Calls {
            calls: [(0, 0, 0); CALLS],
            n: 0,
            keys: [0; KEYS],
            writes: [Touch::READ; KEYS],
            nk: 0,
        })
    }

    #[inline]
    fn fits(&self, n: usize) -> bool {
        self.n < CALLS && self.nk + n <= KEYS
    }

    /// Appends a call (the caller checked `fits`).
    #[inline(always)]
    fn push(&mut self, now: u64, class: u8, keys: &[u64], writes: &[Touch]) {
        let (a, b) = (self.nk, self.nk + keys.len());
        if let ([key], [write]) = (keys, writes) {
            // one key (the common call: one chunk): no loop
            self.keys[a] = *key;
            self.writes[a] = *write;
            self.nk = a + 1;
            self.calls[self.n] = (now, class, (a + 1) as u16);
            self.n += 1;
            return;
        }
        // an operator's few keys: element by element (a memcpy call each
        // costs more)
        for ((k, w), (&key, &write)) in self.keys[a..b]
            .iter_mut()
            .zip(self.writes[a..b].iter_mut())
            .zip(keys.iter().zip(writes))
        {
            *k = key;
            *w = write;
        }
        self.nk = b;
        self.calls[self.n] = (now, class, b as u16);
        self.n += 1;
    }

    /// The `i`th call's keys and writes.
    fn call(&self, i: usize) -> (u64, u8, &[u64], &[Touch]) {
        let (now, class, end) = self.calls[i];
        let start = if i == 0 { 0 } else { self.calls[i - 1].2 };
        let r = start as usize..end as usize;
        (now, class, &self.keys[r.clone()], &self.writes[r])
    }

    fn clear(&mut self) {
        self.n = 0;
        self.nk = 0;
    }
}

/// One thread's calls, in the order it made them.
impl Accesses for Calls {
    fn len(&self) -> usize {
        self.n
    }

    fn get(&self, i: usize) -> (u64, u8, &[u64], &[Touch]) {
        self.call(i)
    }
}

/// Several threads' calls in clock order: `order` is (now, list in
/// `taken`, call in the list), sorted.
struct Merged<'a> {
    taken: &'a [Box<Calls>],
    order: &'a [(u64, u32, u32)],
}

impl Accesses for Merged<'_> {
    fn len(&self) -> usize {
        self.order.len()
    }

    fn get(&self, i: usize) -> (u64, u8, &[u64], &[Touch]) {
        let (_, l, c) = self.order[i];
        self.taken[l as usize].call(c as usize)
    }
}

/// One thread's buffer for one wrapper (`dirty`: set under its lock when
/// it holds something; cleared when taken).
type Buf = perthread::Buf<Box<Calls>>;

/// The applier's scratch space, under the registry's lock.
#[derive(Default)]
struct Scratch {
    /// Contents taken out of the buffers, being applied.
    taken: Vec<Box<Calls>>,
    /// Emptied `Calls` to swap into the buffers (no allocation per apply).
    spare: Vec<Box<Calls>>,
    /// (now, list in `taken`, call in the list): the merge order.
    order: Vec<(u64, u32, u32)>,
    /// The merge's next call in each list of `taken` (`merge_order`).
    heads: Vec<usize>,
}

/// The registry of the buffers (`perthread`: a thread's buffer is found
/// through the per-thread cache of the last one used, `LAST`) and the
/// applier's scratch space; its `off` is set in a forked child: no
/// buffering, nothing to apply.
type Registry = perthread::Registry<Box<Calls>, Scratch>;

/// A policy whose accesses are buffered per thread: see the module
/// documentation.
pub struct Buffered {
    inner: Box<dyn Placement>,
    reg: Registry,
    /// Set when a buffer went from empty to holding something; cleared by
    /// the applier (under the registry's lock) before it looks at them.
    any: AtomicBool,
    /// Set by an applier while it applies (under the registry's lock,
    /// before it clears `any`; cleared once the policy has every call it
    /// took): a decision that finds `any` clear but this set waits for the
    /// registry, so it never reads the policy while calls it must see are
    /// taken out of their buffers but not yet applied.
    applying: AtomicBool,
    /// Set when a buffer holds `DUE_*` calls or keys (`OVERDUE_*` with an
    /// applier thread): its thread applies them after its call; cleared by
    /// the applier with `any`. (Shared: the residency reads it before
    /// calling `after_call`, `after_call_flag`.)
    due: Arc<AtomicBool>,
    /// The applier thread, when there is one (`set_applier`; `woke`: it was
    /// woken for what is buffered, cleared with `any`). `applier_on` is
    /// cleared when it is gone (`set_applier_gone`).
    applier: OnceLock<Thread>,
    applier_on: AtomicBool,
    woke: AtomicBool,
    /// Set in a forked child when an applier held the registry at the
    /// fork: it was inside the wrapped policy, whose own lock may then be
    /// held for ever here, so the child never calls it (recency order, no
    /// predictions: see `ready`).
    cut_off: AtomicBool,
}

impl Buffered {
    pub fn new(inner: Box<dyn Placement>) -> Buffered {
        Buffered {
            inner,
            reg: Registry::new(perthread::SLOT_POLICY, Scratch::default()),
            any: AtomicBool::new(false),
            applying: AtomicBool::new(false),
            due: Arc::new(AtomicBool::new(false)),
            applier: OnceLock::new(),
            applier_on: AtomicBool::new(false),
            woke: AtomicBool::new(false),
            cut_off: AtomicBool::new(false),
        }
    }

    /// The wrapped policy.
    pub fn inner(&self) -> &dyn Placement {
        &*self.inner
    }

    fn registry(&self) -> MutexGuard<'_, Bufs<Box<Calls>, Scratch>> {
        self.reg.lock()
    }

    /// Everything buffered, into the policy (before any read of it).
    #[inline]
    fn flush(&self) {
        // in a forked child the registry may be held for ever
        // (SeqCst: `apply` sets `applying` before it clears `any`, so a
        // clear `any` read here is seen with `applying` set until the apply
        // is done)
        if (self.any.load(SeqCst) || self.applying.load(SeqCst)) && !self.reg.off.load(Acquire) {
            let mut r = self.registry();
            self.apply(&mut r);
        }
    }

    /// Takes every buffer's calls and gives them to the policy in `now`
    /// order (with the registry's lock held: `r`). Buffers of threads that
    /// have exited are dropped once taken.
    fn apply(&self, r: &mut Bufs<Box<Calls>, Scratch>) {
        if self.reg.off.load(Acquire) {
            return;
        }
        // a buffer filled after this is seen by the next apply (its owner
        // sets `any` after pushing)
        self.applying.store(true, SeqCst);
        self.any.store(false, SeqCst);
        self.due.store(false, Relaxed);
        self.woke.store(false, Relaxed);
        let Bufs {
            bufs,
            s:
                Scratch {
                    taken,
                    spare,
                    order,
                    heads,
                },
        } = r;
        // Every buffer locked at once, then the dirty ones taken: a cut
        // with no call in flight, so what is taken is, for calls whose
        // clock reading and `on_access` one lock orders (the shard lock),
        // every call up to some clock and none after — a call taken later
        // never has an earlier clock than one applied now. (Taking them one
        // by one, a thread's later call could be taken with its buffer
        // while another thread's earlier one went to a buffer already
        // taken. Locking only the buffers found dirty is not a cut either:
        // a clean one passed over can take a call before a later call of
        // another thread reaches a dirty one not yet locked. A clean
        // buffer's lock is one compare-and-swap per apply.)
        // (the guards of up to HELD_ON_STACK threads' buffers on the stack:
        // no heap allocation per apply)
        {
            const HELD_ON_STACK: usize = 32;
            type Held<'a> = (&'a Buf, perthread::BufGuard<'a, Box<Calls>>);
            let mut on_stack: [Option<Held<'_>>; HELD_ON_STACK] = [const { None }; HELD_ON_STACK];
            let mut on_heap: Vec<Held<'_>> = Vec::new();
            if bufs.len() > HELD_ON_STACK {
                on_heap.reserve_exact(bufs.len());
                on_heap.extend(bufs.iter().map(|b| (&**b, b.lock())));
            } else {
                for (h, b) in on_stack.iter_mut().zip(bufs.iter()) {
                    *h = Some((&**b, b.lock()));
                }
            }
            let held = on_stack.iter_mut().filter_map(Option::take).chain(on_heap);
            for (b, mut p) in held {
                if b.dirty.load(Relaxed) {
                    let fresh = spare.pop().unwrap_or_else(Calls::boxed);
                    taken.push(std::mem::replace(&mut *p, fresh));
                    b.dirty.store(false, Relaxed);
                }
            }
        }
        // only the registry holds it: its thread has exited
        bufs.retain(|b| !Buf::orphaned(b));
        // to the policy in one batch (one lock of its model, not one per
        // call), in the order the calls were given one by one before
        match taken.len() {
            0 => {}
            1 => self.inner.on_access_batch(&*taken[0]),
            _ => {
                merge_order(taken, order, heads);
                self.inner.on_access_batch(&Merged {
                    taken: taken.as_slice(),
                    order: order.as_slice(),
                });
            }
        }
        for mut c in taken.drain(..) {
            c.clear();
            spare.push(c);
        }
        self.applying.store(false, Release);
    }

    /// Appends the call to `buf` (the caller checked that it fits an empty
    /// one): applies every buffer first when it does not fit this one.
    /// Inlined into `on_access`'s look-up: one call less per access
    /// (BENCHMARKS.md ninth sitting, `glue10`).
    #[inline(always)]
    fn push(&self, buf: &Buf, now: u64, class: u8, keys: &[u64], writes: &[Touch]) {
        let mut p = buf.lock();
        if !p.fits(keys.len()) {
            drop(p);
            p = self.make_room(buf);
        }
        p.push(now, class, keys, writes);
        // only this thread sets it, under the buffer's lock (the applier
        // clears it under the same lock): no read-modify-write needed
        if !buf.dirty.load(Relaxed) {
            buf.dirty.store(true, Release);
            self.any.store(true, SeqCst);
        }
        if p.n >= DUE_CALLS || p.nk >= DUE_KEYS {
            self.note_due(p.n, p.nk);
        }
    }

    /// `push` into a full buffer: every thread's calls before this one go
    /// first; the buffer locked again (out of line: rare).
    #[cold]
    #[inline(never)]
    fn make_room<'b>(&self, buf: &'b Buf) -> perthread::BufGuard<'b, Box<Calls>> {
        {
            let mut r = self.registry();
            self.apply(&mut r);
        }
        buf.lock()
    }

    /// A buffer holds `n` calls and `nk` keys, at least `DUE_*`: the
    /// applier thread woken (once until it applies), or with none (or
    /// when it lags to `OVERDUE_*`) this thread applies after its call.
    #[inline(never)]
    fn note_due(&self, n: usize, nk: usize) {
        if self.applier_on.load(Relaxed) {
            if !self.woke.load(Relaxed) {
                self.woke.store(true, Relaxed);
                if let Some(t) = self.applier.get() {
                    t.unpark();
                }
            }
            if n < OVERDUE_CALLS && nk < OVERDUE_KEYS {
                return;
            }
        }
        if !self.due.load(Relaxed) {
            self.due.store(true, Relaxed);
        }
    }

    /// The wrapped policy for a decision, everything buffered applied
    /// first; None in a forked child that must not call it (`cut_off`).
    #[inline]
    fn ready(&self) -> Option<&dyn Placement> {
        self.flush();
        if self.cut_off.load(Relaxed) {
            None
        } else {
            Some(&*self.inner)
        }
    }

    /// The call straight to the policy, after everything buffered.
    #[cold]
    #[inline(never)]
    fn direct(&self, now: u64, class: u8, keys: &[u64], writes: &[Touch]) {
        if self.reg.off.load(Acquire) {
            if self.cut_off.load(Relaxed) {
                return;
            }
            return self.inner.on_access(now, class, keys, writes);
        }
        let mut r = self.registry();
        self.apply(&mut r);
        self.inner.on_access(now, class, keys, writes);
    }
}

/// The calls of `taken` in `(now, list, call)` order, into `order`: what
/// sorting every call's `(now, list, call)` gives (the keys are unique),
/// merged instead of sorted. Each thread's calls are in the order of its
/// clock readings, so each list is sorted already and the calls of the
/// others go between them in runs (a thread makes many calls in a row):
/// the list that holds the least next call gives every call up to the
/// next call of another list in one run. A list found out of order (a
/// caller's own clock: tests, a replay) is sorted as a whole instead.
/// `heads`: scratch, the next call of each list. (Each run costs a scan
/// of the lists: past `MERGE_LISTS` of them, sorted.)
fn merge_order(taken: &[Box<Calls>], order: &mut Vec<(u64, u32, u32)>, heads: &mut Vec<usize>) {
    if taken.len() > MERGE_LISTS {
        return sort_order(taken, order);
    }
    order.clear();
    heads.clear();
    heads.resize(taken.len(), 0);
    let next = |l: usize, h: usize| taken[l].calls[h].0;
    loop {
        // the least next call (`best`) and the least of the other lists'
        // (`second`), both as (now, list): ties go to the lower list
        let (mut best, mut second): (Option<(u64, usize)>, Option<(u64, usize)>) = (None, None);
        for (l, &h) in heads.iter().enumerate() {
            if h == taken[l].n {
                continue;
            }
            let k = (next(l, h), l);
            if best.is_none_or(|b| k < b) {
                second = best;
                best = Some(k);
            } else if second.is_none_or(|s| k < s) {
                second = Some(k);
            }
        }
        let Some((_, l)) = best else { break };
        let c = &taken[l];
        let mut h = heads[l];
        while h < c.n {
            let now = c.calls[h].0;
            if second.is_some_and(|s| (now, l) > s) {
                break;
            }
            if h > 0 && now < c.calls[h - 1].0 {
                return sort_order(taken, order);
            }
            order.push((now, l as u32, h as u32));
            h += 1;
        }
        heads[l] = h;
    }
}

const MERGE_LISTS: usize = 16;

/// `merge_order` by sorting every call's `(now, list, call)`.
#[cold]
fn sort_order(taken: &[Box<Calls>], order: &mut Vec<(u64, u32, u32)>) {
    order.clear();
    for (l, c) in taken.iter().enumerate() {
        for (i, &(now, _, _)) in c.calls[..c.n].iter().enumerate() {
            order.push((now, l as u32, i as u32));
        }
    }
    // unique (list, call): the same order however sorted
    order.sort_unstable();
}

/// [`perthread::Here::now`] out of line: inline, the compiler calls
/// `__tls_get_addr` on every call of `on_access_here`, `here` given or not,
/// and then picks (as in engine/run.rs).
#[cold]
#[inline(never)]
fn here_now() -> Option<perthread::Here> {
    perthread::Here::now()
}

impl Buffered {
    /// [`Placement::on_access_here`], inlined where the residency calls it
    /// directly (`Placement::as_buffered`: one call and its frame less on
    /// every call's path).
    #[inline(always)]
    pub(crate) fn access_here(
        &self,
        here: Option<perthread::Here>,
        now: u64,
        class: u8,
        keys: &[u64],
        writes: &[Touch],
    ) {
        if keys.len() > KEYS || keys.len() != writes.len() || self.reg.off.load(Relaxed) {
            return self.direct(now, class, keys, writes);
        }
        // the caller's `here`, else looked up now (`mine_in` with None
        // would take the slow path)
        let here = match here {
            Some(h) => Some(h),
            None => here_now(),
        };
        // the thread's buffer found with a closure small enough to inline
        // into the look-up's fast path, the push after it (as the heat
        // table's `record_ranges_in`): the push's arguments are not
        // gathered for the look-up's slow path on every call
        match self.reg.mine_in(here, Calls::boxed, |b| b as *const Buf) {
            // SAFETY: this thread's buffer, which the thread's list holds
            // while the thread lives and the registry (`self.reg`) while
            // `self` does (perthread.rs): used on this thread, in this call
            Some(b) => self.push(unsafe { &*b }, now, class, keys, writes),
            // thread exiting: no buffer
            None => self.direct(now, class, keys, writes),
        }
    }
}

impl Placement for Buffered {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn on_access(&self, now: u64, class: u8, keys: &[u64], writes: &[Touch]) {
        self.on_access_here(None, now, class, keys, writes)
    }

    fn on_access_here(
        &self,
        here: Option<perthread::Here>,
        now: u64,
        class: u8,
        keys: &[u64],
        writes: &[Touch],
    ) {
        self.access_here(here, now, class, keys, writes)
    }

    fn on_free(&self, key: u64) {
        if let Some(p) = self.ready() {
            p.on_free(key)
        }
    }

    fn order(&self, now: u64, cands: &mut [Cand]) {
        match self.ready() {
            Some(p) => p.order(now, cands),
            None => super::lru_order(cands),
        }
    }

    fn order_ttl(&self) -> u64 {
        self.ready().map_or(4, |p| p.order_ttl())
    }

    fn predicts(&self, now: u64, key: u64, w: u64) -> bool {
        self.ready().is_some_and(|p| p.predicts(now, key, w))
    }

    fn next_use(&self, now: u64, key: u64) -> Option<u64> {
        self.ready()?.next_use(now, key)
    }

    fn upcoming(&self, now: u64, d: u64, out: &mut Vec<(u64, u64)>) {
        if let Some(p) = self.ready() {
            p.upcoming(now, d, out)
        }
    }

    fn place(&self, now: u64, key: u64) -> Option<Place> {
        self.ready()?.place(now, key)
    }

    fn tick(&self, secs: f64, resident_fraction: f64) {
        if let Some(p) = self.ready() {
            p.tick(secs, resident_fraction)
        }
    }

    fn drain_events(&self, out: &mut Vec<String>) {
        if let Some(p) = self.ready() {
            p.drain_events(out)
        }
    }

    fn set_heat_fn(&self, f: HeatFn) {
        if !self.cut_off.load(Relaxed) {
            self.inner.set_heat_fn(f)
        }
    }

    fn set_out_slack(&self, slack: bool) {
        if let Some(p) = self.ready() {
            p.set_out_slack(slack)
        }
    }

    fn order_top(&self, now: u64, cands: &mut Vec<Cand>, k: usize) {
        match self.ready() {
            Some(p) => p.order_top(now, cands, k),
            None => super::lru_order(cands),
        }
    }

    fn order_ranked(
        &self,
        now: u64,
        cands: &mut Vec<Cand>,
        k: usize,
        tail: &mut super::RankTail,
    ) -> bool {
        match self.ready() {
            Some(p) => p.order_ranked(now, cands, k, tail),
            None => false,
        }
    }

    fn order_kept(
        &self,
        kept: super::KeptId,
        now: u64,
        all: &[Cand],
        gone: &[u64],
        new: &[Cand],
        k: usize,
        cands: &mut Vec<Cand>,
        tail: &mut super::RankTail,
    ) -> bool {
        match self.ready() {
            Some(p) => p.order_kept(kept, now, all, gone, new, k, cands, tail),
            None => false,
        }
    }

    fn order_kept_next(&self, cur: &mut super::KeptCursor, n: usize, out: &mut Vec<Cand>) {
        if let Some(p) = self.ready() {
            p.order_kept_next(cur, n, out)
        }
    }

    /// A buffer is due: every buffer into the policy now, while the
    /// engine holds no lock (else: one flag read). When another thread is
    /// applying already, nothing (it takes this thread's calls too).
    #[inline]
    fn after_call(&self) {
        if self.due.load(Relaxed) && !self.reg.off.load(Relaxed) {
            let mut r = match self.reg.try_lock() {
                Ok(r) => r,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            self.apply(&mut r);
        }
    }

    fn after_call_flag(&self) -> Option<Arc<AtomicBool>> {
        Some(self.due.clone())
    }

    fn as_buffered(&self) -> Option<&Buffered> {
        Some(self)
    }

    fn set_applier(&self, t: Thread) {
        if self.applier.set(t).is_ok() {
            self.applier_on.store(true, Release);
        }
    }

    fn set_applier_gone(&self) {
        self.applier_on.store(false, Release);
    }

    /// Woken by a due buffer: every buffer into the policy (waiting for the
    /// registry if a decision or a call is applying: then there is little
    /// or nothing left).
    fn apply_deferred(&self) {
        if self.woke.load(Relaxed) && !self.reg.off.load(Acquire) {
            let mut r = self.registry();
            self.apply(&mut r);
        }
    }

    fn after_fork_child(&self) {
        self.applier_on.store(false, Relaxed);
        if self.reg.off.swap(true, AcqRel) {
            return;
        }
        // the thread that forked is not inside a call: its own buffer is
        // free even when the registry is held; the others are taken if
        // they can be (a buffer held at the fork was mid-call: dropped)
        let mut taken: Vec<Box<Calls>> = Vec::new();
        self.reg.this_thread(|b| {
            if let Some(mut p) = b.try_lock() {
                taken.push(std::mem::replace(&mut *p, Calls::boxed()));
            }
        });
        match self.reg.try_lock() {
            Ok(r) => {
                for b in r.bufs.iter() {
                    if let Some(mut p) = b.try_lock() {
                        if p.n != 0 {
                            taken.push(std::mem::replace(&mut *p, Calls::boxed()));
                        }
                    }
                }
            }
            Err(_) => {
                // an applier (a thread after its call, or the monitor's
                // tick) was inside the wrapped policy at the fork: its lock
                // may be held for ever here. The child decides without it
                // (recency order, no predictions) rather than wait.
                self.cut_off.store(true, Release);
                return;
            }
        }
        let mut order: Vec<(u64, usize, usize)> = Vec::new();
        for (l, c) in taken.iter().enumerate() {
            for (i, &(now, _, _)) in c.calls[..c.n].iter().enumerate() {
                order.push((now, l, i));
            }
        }
        order.sort_unstable();
        for (_, l, i) in order {
            let (now, class, keys, writes) = taken[l].call(i);
            self.inner.on_access(now, class, keys, writes);
        }
        self.inner.after_fork_child();
    }
}

#[cfg(test)]
mod tests;
