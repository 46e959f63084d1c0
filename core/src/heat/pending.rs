//! Per-thread buffers of accesses (issue 10 part 2): the operator hot path
//! records, the shared records are written in batches.
//!
//! [`HeatTable::record_ranges`] appends a call's raw ranges (address,
//! length, read or write) and its sequence, time, class and operator hash
//! to the calling thread's buffer and returns. When the buffer is applied
//! they are resolved as [`HeatTable::touch_ranges`] does, but instead of
//! updating the shared allocation, tensor-range and chunk records (~15
//! compare-and-swaps on cache lines every thread writes) the hits are
//! merged into lists: one entry per record, a [`Delta`] (count, latest
//! sequence and time, earliest time, latest write, operator bits), then
//! counted. Every field of a record is a sum, max, min or union, so
//! counting a merged delta later leaves the record exactly as counting the
//! hits one by one.
//!
//! A raw range must resolve against the address map as it was at its
//! call: every change of the map applies the buffers first — `on_free`
//! always, `on_alloc`, `on_map` and `on_unmap` when anything is buffered
//! or a drain is applying (`before_map_change`: two flag reads otherwise).
//!
//! A buffer is applied (resolved, its deltas counted, then emptied) by the
//! engine's applier thread when one is due (a quarter full: the call wakes
//! it, engine/applier.rs), by its thread when it is full, and by every
//! reader of the table before it reads: `on_free` (so the freed allocation's final statistics include
//! every access buffered before the free, and no buffered access is
//! counted for the next allocation at the address — a delta names the
//! allocation's generation and the chunk record's epoch, and counts only
//! while they are current), `alloc_info`, `chunk_info` (the eviction
//! order's heat), `hottest_*`, `live_allocs`, `range_entries`, `totals`
//! (stats, `u3m top`, the shared-memory snapshot). Readers therefore see
//! no lag. A buffer has its own lock, which its thread takes once per call
//! (uncontended unless a reader is applying it); a reader skips a buffer
//! whose `dirty` flag is clear without locking it.

use std::sync::atomic::Ordering::*;

use super::addr_map::{Resolved, CHUNK_SHIFT};
use super::ranges::RangeHit;
use super::record::{Delta, Hit};
use super::{Access, HeatTable};
use crate::engine::Range;
use crate::opclass::OpClass;
use crate::perthread::{self, Bufs};

/// Entries per list; a full list applies the buffer.
const ALLOCS: usize = 16;
const RANGES: usize = 64;
const CHUNKS: usize = 32;
/// Raw calls and their ranges per buffer (recorded as given, resolved when
/// the buffer is applied); a full buffer is applied by its thread.
const RAW_CALLS: usize = 256;
const RAW_RANGES: usize = 2048;
/// Steps a buffer's memo of its last resolved call holds (`apply`).
const MEMO_STEPS: usize = 64;
/// A buffer holding this many raw calls or ranges is *due*: the call wakes
/// the applier thread (engine/applier.rs), which applies every buffer.
const DUE_CALLS: usize = RAW_CALLS / 4;
const DUE_RANGES: usize = RAW_RANGES / 4;

#[derive(Default)]
pub(super) struct Pending {
    touches: u64,
    unattributed_touches: u64,
    unattributed_bytes: u64,
    /// (idx, gen, bytes of its parts, delta)
    allocs: Vec<(u32, u32, u64, Delta)>,
    /// (start, len, idx, gen, delta)
    ranges: Vec<(u64, u64, u32, u32, Delta)>,
    /// (chunk record word `epoch << 32 | index + 1`, idx, gen of the owner
    /// through which it was reached, delta)
    chunks: Vec<(u64, u32, u32, Delta)>,
    /// Raw calls not resolved yet: (seq, ns, class, op_hash, end of its
    /// ranges in `raw_ranges`), in the order the thread made them.
    raw: Vec<(u64, u64, OpClass, u64, u32)>,
    raw_ranges: Vec<Range>,
    /// Lists emptied so far (`apply_deltas`): a memo's entry positions
    /// hold while this is unchanged.
    flushes: u64,
    /// The last resolved call's steps (`apply`), reused while calls repeat.
    memo: Memo,
}

/// The steps of one resolved call; `full`: more steps than its capacity
/// (never grown: resolving allocates nothing), not replayable.
#[derive(Default)]
struct Memo {
    steps: Vec<Step>,
    full: bool,
}

impl Memo {
    #[inline]
    fn note(&mut self, s: Step) {
        if self.steps.len() < self.steps.capacity() {
            self.steps.push(s);
        } else {
            self.full = true;
        }
    }

    fn clear(&mut self) {
        self.steps.clear();
        self.full = false;
    }
}

/// One step of a resolved call, replayed for the next call with the same
/// ranges (`apply`): what `resolve_call` did, with the positions of the
/// list entries it merged into.
#[derive(Clone, Copy)]
enum Step {
    /// a range of nonzero length (`touches`)
    Touch,
    /// unattributed bytes; `first`: the range's first gap
    Gap { bytes: u64, first: bool },
    /// a part: `p.allocs[a]` (plus `bytes`) and `p.ranges[r]`
    Part {
        a: u32,
        r: u32,
        bytes: u64,
        write: bool,
    },
    /// a chunk of a part: its record word as read (0: none, skipped) and
    /// `p.chunks[e]` when not 0
    Chunk {
        addr: u64,
        rw: u64,
        e: u32,
        write: bool,
    },
}

impl Pending {
    fn with_capacity() -> Pending {
        Pending {
            allocs: Vec::with_capacity(ALLOCS),
            ranges: Vec::with_capacity(RANGES),
            chunks: Vec::with_capacity(CHUNKS),
            raw: Vec::with_capacity(RAW_CALLS),
            raw_ranges: Vec::with_capacity(RAW_RANGES),
            memo: Memo {
                steps: Vec::with_capacity(MEMO_STEPS),
                full: false,
            },
            ..Pending::default()
        }
    }
}

/// One thread's buffer for one table.
type Buf = perthread::Buf<Pending>;

/// The registry of a table's per-thread buffers (`off`: set in a forked
/// child by `after_fork_child` — no buffering, no draining: the parent's
/// threads may have held these locks at fork).
pub(super) type Registry = perthread::Registry<Pending, Scratch>;

/// The drain's scratch space, under the registry's lock: buffers taken out
/// of their threads' (swapped for spare ones), being applied.
#[derive(Default)]
pub(super) struct Scratch {
    taken: Vec<Pending>,
    spare: Vec<Pending>,
}

pub(super) fn registry() -> Registry {
    Registry::new(perthread::SLOT_HEAT, Scratch::default())
}

/// `v.extend_from_slice(ranges)`; an operator's one to four ranges are
/// copied as one block of a size known here (a few moves, not a `memcpy`
/// call) when `v` has room (always on the call path: the buffer is made
/// with room for `RAW_RANGES` and applied before it would overflow).
#[inline(always)]
fn push_ranges(v: &mut Vec<Range>, ranges: &[Range]) {
    #[inline(always)]
    fn block<const N: usize>(v: &mut Vec<Range>, ranges: &[Range]) {
        let (n, b) = (v.len(), <&[Range; N]>::try_from(ranges).expect("N ranges"));
        // SAFETY: `v` has room for `N` more (the caller checked): the `N`
        // elements after its first `n` are written, then counted
        unsafe {
            v.as_mut_ptr().add(n).cast::<[Range; N]>().write(*b);
            v.set_len(n + N);
        }
    }
    if v.capacity() - v.len() < 4 {
        v.extend_from_slice(ranges);
        return;
    }
    match ranges.len() {
        1 => block::<1>(v, ranges),
        2 => block::<2>(v, ranges),
        3 => block::<3>(v, ranges),
        4 => block::<4>(v, ranges),
        _ => v.extend_from_slice(ranges),
    }
}

impl HeatTable {
    /// Count one call's accesses like [`HeatTable::touch_ranges`] (the
    /// same records end up with the same values), buffered in the calling
    /// thread: see the module documentation. Falls back to `touch_ranges`
    /// when the thread's buffers are unavailable (thread exiting).
    #[inline]
    pub fn record_ranges(&self, ranges: &[crate::engine::Range], a: &Access) {
        self.record_ranges_in(ranges, *a, perthread::Here::now())
    }

    /// [`record_ranges`](Self::record_ranges) with the calling thread's
    /// `LAST` looked up already (perthread.rs: `here` is this thread's).
    /// `a` by value: on the buffered path its fields go straight into the
    /// buffer, never through a copy in memory (the unbuffered paths, out of
    /// line, get them in registers; `a.write` is not used, as in
    /// `touch_ranges`).
    #[inline(always)]
    pub(crate) fn record_ranges_in(
        &self,
        ranges: &[crate::engine::Range],
        a: Access,
        here: Option<perthread::Here>,
    ) {
        if self.pending.off.load(Relaxed) {
            self.touch_ranges_now(ranges, a.seq, a.ns, a.class, a.op_hash);
            return;
        }
        // the thread's buffer found with a closure small enough to inline
        // into the look-up's fast path (the append, `record_in`, is one
        // call, not a closure's call nested in the look-up's)
        match self
            .pending
            .mine_in(here, Pending::with_capacity, |b| b as *const Buf)
        {
            // SAFETY: this thread's buffer, which the thread's list holds
            // while the thread lives and the registry (`self.pending`)
            // while `self` does (perthread.rs): used on this thread, in
            // this call
            Some(b) => self.record_in(unsafe { &*b }, ranges, a),
            None => self.touch_ranges_now(ranges, a.seq, a.ns, a.class, a.op_hash),
        }
    }

    /// `touch_ranges` of an access given by its fields (out of line: the
    /// unbuffered paths; in registers, so the buffered path never stores
    /// an `Access` for them). `write` is not used by `touch_ranges`.
    #[cold]
    #[inline(never)]
    fn touch_ranges_now(&self, ranges: &[Range], seq: u64, ns: u64, class: OpClass, h: u64) {
        self.touch_ranges(ranges, &unbuffered(seq, ns, class, h));
    }

    /// `resolve_call` of a call wider than a buffer (out of line, as
    /// `touch_ranges_now`).
    #[cold]
    #[inline(never)]
    fn resolve_call_now(
        &self,
        p: &mut Pending,
        ranges: &[Range],
        seq: u64,
        ns: u64,
        class: OpClass,
        h: u64,
    ) {
        let a = unbuffered(seq, ns, class, h);
        self.resolve_call(p, ranges, &a, &mut Memo::default());
    }

    /// Appends the call's raw ranges to the thread's buffer (resolved when
    /// it is applied: `apply`); a buffer that cannot take them is applied
    /// first, a call with more ranges than a buffer holds resolved at once.
    #[inline(always)]
    fn record_in(&self, buf: &Buf, ranges: &[Range], a: Access) {
        let mut p = buf.lock();
        if p.raw.len() == RAW_CALLS || p.raw_ranges.len() + ranges.len() > RAW_RANGES {
            self.apply(&mut p);
        }
        if ranges.len() > RAW_RANGES {
            self.resolve_call_now(&mut p, ranges, a.seq, a.ns, a.class, a.op_hash);
        } else {
            push_ranges(&mut p.raw_ranges, ranges);
            let end = p.raw_ranges.len() as u32;
            p.raw.push((a.seq, a.ns, a.class, a.op_hash, end));
        }
        // only this thread sets it, under the buffer's lock (a drain clears
        // it under the same lock): `any` is set once per drain, when the
        // buffer goes from taken to holding something. While `any` is set,
        // a map change applies the buffers first (SeqCst: see
        // `before_map_change`).
        if !buf.dirty.load(Relaxed) {
            buf.dirty.store(true, Release);
            self.deferred.any.store(true, SeqCst);
        }
        if (p.raw.len() >= DUE_CALLS || p.raw_ranges.len() >= DUE_RANGES)
            && !self.deferred.woke.load(Relaxed)
        {
            self.deferred.wake();
        }
    }

    /// Resolves one call's ranges against the address map as it is now
    /// (the map as it was at the call: every change of it applies the
    /// buffers first) and merges the hits into `p`'s lists.
    /// `memo` receives its steps (see [`Step`]).
    fn resolve_call(&self, p: &mut Pending, ranges: &[Range], a: &Access, memo: &mut Memo) {
        let hits = [
            Hit::new(a.seq, a.ns, false, a.class, a.op_hash),
            Hit::new(a.seq, a.ns, true, a.class, a.op_hash),
        ];
        let mut owner: Option<(u32, u32, u64, u64)> = None;
        for r in ranges {
            if r.len == 0 {
                continue;
            }
            p.touches += 1;
            memo.note(Step::Touch);
            let end = r.addr.saturating_add(r.len);
            let mut cur = r.addr;
            let mut marked = false;
            while cur < end {
                let found = match owner {
                    Some((idx, gen, base, len)) if cur >= base && cur < base + len => {
                        Resolved::Found {
                            idx,
                            gen,
                            base,
                            len,
                        }
                    }
                    _ => self.map.resolve(cur, &self.allocs),
                };
                match found {
                    Resolved::Gap(next) => {
                        let n = next.min(end);
                        p.unattributed_bytes += n - cur;
                        memo.note(Step::Gap {
                            bytes: n - cur,
                            first: !marked,
                        });
                        if !marked {
                            marked = true;
                            p.unattributed_touches += 1;
                        }
                        cur = n;
                    }
                    Resolved::Found {
                        idx,
                        gen,
                        base,
                        len,
                    } => {
                        owner = Some((idx, gen, base, len));
                        let pend = end.min(base + len);
                        self.buffer_part(
                            p,
                            idx,
                            gen,
                            cur,
                            pend,
                            &hits[r.write as usize],
                            r.write,
                            memo,
                        );
                        cur = pend;
                    }
                }
            }
        }
    }

    /// One part `[p0, p1)` of allocation `(idx, gen)`: its allocation, its
    /// tensor range, every chunk it covers (what `attribute` counts).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn buffer_part(
        &self,
        p: &mut Pending,
        idx: u32,
        gen: u32,
        p0: u64,
        p1: u64,
        h: &Hit,
        write: bool,
        memo: &mut Memo,
    ) {
        let a = match p.allocs.iter().position(|e| e.0 == idx && e.1 == gen) {
            Some(i) => {
                let e = &mut p.allocs[i];
                e.2 += p1 - p0;
                e.3.merge(h);
                i
            }
            None => {
                if p.allocs.len() == ALLOCS {
                    self.apply_deltas(p);
                }
                p.allocs.push((idx, gen, p1 - p0, Delta::of(h, 1)));
                p.allocs.len() - 1
            }
        };
        let len = p1 - p0;
        let r = match p
            .ranges
            .iter()
            .position(|e| e.0 == p0 && e.1 == len && e.2 == idx && e.3 == gen)
        {
            Some(i) => {
                p.ranges[i].4.merge(h);
                i
            }
            None => {
                if p.ranges.len() == RANGES {
                    self.apply_deltas(p);
                }
                p.ranges.push((p0, len, idx, gen, Delta::of(h, 1)));
                p.ranges.len() - 1
            }
        };
        memo.note(Step::Part {
            a: a as u32,
            r: r as u32,
            bytes: len,
            write,
        });
        for c in p0 >> CHUNK_SHIFT..=(p1 - 1) >> CHUNK_SHIFT {
            let addr = c << CHUNK_SHIFT;
            // The owner still live when the delta is applied (after this
            // read) means `rw` is the record of an occupancy that includes it.
            let rw = match self.map.chunk(addr) {
                Some(cs) => cs.rec.load(Acquire),
                None => 0,
            };
            if rw == 0 {
                memo.note(Step::Chunk {
                    addr,
                    rw,
                    e: 0,
                    write,
                });
                continue;
            }
            let e = match p
                .chunks
                .iter()
                .position(|e| e.0 == rw && e.1 == idx && e.2 == gen)
            {
                Some(i) => {
                    p.chunks[i].3.merge(h);
                    i
                }
                None => {
                    if p.chunks.len() == CHUNKS {
                        self.apply_deltas(p);
                    }
                    p.chunks.push((rw, idx, gen, Delta::of(h, 1)));
                    p.chunks.len() - 1
                }
            };
            memo.note(Step::Chunk {
                addr,
                rw,
                e: e as u32,
                write,
            });
        }
    }

    /// Whether `memo` (the steps of the previous call, which had the same
    /// ranges) holds for another call: what `resolve_call` would do —
    /// the same map (every change of it applies the buffers first), so the
    /// same parts, the same list entries (all present: the previous call
    /// found or added them, and no list was emptied since) — unless a
    /// chunk's record word changed since.
    fn memo_holds(&self, memo: &[Step]) -> bool {
        memo.iter().all(|s| match *s {
            Step::Chunk { addr, rw, .. } => {
                let now = match self.map.chunk(addr) {
                    Some(cs) => cs.rec.load(Acquire),
                    None => 0,
                };
                now == rw
            }
            _ => true,
        })
    }

    /// Counts `n` calls whose steps are `memo` (each checked by
    /// `memo_holds`), their read and write hits merged in `run`: what
    /// replaying the steps once per call leaves (a merged delta counts as
    /// its hits one by one).
    fn replay(p: &mut Pending, memo: &[Step], run: &[Delta; 2], n: u64) {
        for s in memo {
            match *s {
                Step::Touch => p.touches += n,
                Step::Gap { bytes, first } => {
                    p.unattributed_bytes += bytes * n;
                    p.unattributed_touches += first as u64 * n;
                }
                Step::Part { a, r, bytes, write } => {
                    let d = &run[write as usize];
                    let e = &mut p.allocs[a as usize];
                    e.2 += bytes * n;
                    e.3.merge_delta(d);
                    p.ranges[r as usize].4.merge_delta(d);
                }
                Step::Chunk { rw, e, write, .. } => {
                    if rw != 0 {
                        p.chunks[e as usize].3.merge_delta(&run[write as usize]);
                    }
                }
            }
        }
    }

    /// Count everything `p` holds and empty it: its raw calls resolved
    /// (in the order they were made), then every delta counted.
    fn apply(&self, p: &mut Pending) {
        if !p.raw.is_empty() {
            let mut raw = std::mem::take(&mut p.raw);
            let rr = std::mem::take(&mut p.raw_ranges);
            let mut memo = std::mem::take(&mut p.memo);
            memo.clear();
            // the memo's call (its ranges), while its steps are valid
            let mut last: Option<(usize, usize)> = None;
            // calls after it with the same ranges, not counted yet: how
            // many, their read and write hits merged
            let mut n = 0;
            let mut run = [Delta::default(); 2];
            let mut start = 0;
            for &(seq, ns, class, op_hash, end) in &raw {
                let end = end as usize;
                let ranges = &rr[start..end];
                let same = last.is_some_and(|(s, e)| rr[s..e] == *ranges);
                let a = Access {
                    seq,
                    ns,
                    class,
                    op_hash,
                    write: false,
                };
                if same && self.memo_holds(&memo.steps) {
                    let hits = [
                        Hit::new(a.seq, a.ns, false, a.class, a.op_hash),
                        Hit::new(a.seq, a.ns, true, a.class, a.op_hash),
                    ];
                    for w in 0..2 {
                        if n == 0 {
                            run[w] = Delta::of(&hits[w], 1);
                        } else {
                            run[w].merge(&hits[w]);
                        }
                    }
                    n += 1;
                } else {
                    if n != 0 {
                        Self::replay(p, &memo.steps, &run, n);
                        n = 0;
                    }
                    memo.clear();
                    let flushes = p.flushes;
                    self.resolve_call(p, ranges, &a, &mut memo);
                    // a list emptied while resolving: earlier positions
                    // are gone
                    last = (p.flushes == flushes && !memo.full).then_some((start, end));
                }
                start = end;
            }
            if n != 0 {
                Self::replay(p, &memo.steps, &run, n);
            }
            memo.clear();
            p.memo = memo;
            raw.clear();
            p.raw = raw;
            p.raw_ranges = rr;
            p.raw_ranges.clear();
        }
        self.apply_deltas(p);
    }

    /// Count the deltas `p` holds and empty its lists.
    fn apply_deltas(&self, p: &mut Pending) {
        p.flushes = p.flushes.wrapping_add(1);
        let shard = self.shard();
        let mut stale = 0;
        let mut unatt_touches = std::mem::take(&mut p.unattributed_touches);
        let mut unatt_bytes = std::mem::take(&mut p.unattributed_bytes);
        for (idx, gen, bytes, d) in p.allocs.drain(..) {
            let ok = match self.allocs.slot(idx) {
                Some(slot) => slot.rec.add(gen as u64, &d),
                None => continue,
            };
            if !ok {
                // freed since it was resolved: these parts belong to nobody
                // (one unattributed touch per part: an upper bound when a
                // range had a gap too)
                unatt_bytes += bytes;
                unatt_touches += d.n;
                stale += d.n;
            }
        }
        let mut dropped = 0;
        for (start, len, idx, gen, d) in p.ranges.drain(..) {
            if !self.allocs.is_live(idx, gen) {
                continue;
            }
            if let RangeHit::Dropped = self.ranges.hit(start, len, idx, gen, &d, &self.allocs) {
                dropped += d.n;
            }
        }
        for (rw, idx, gen, d) in p.chunks.drain(..) {
            if !self.allocs.is_live(idx, gen) {
                continue;
            }
            let ri = (rw as u32).wrapping_sub(1) as usize;
            if let Some(r) = self.chunk_recs.get(ri) {
                r.rec.add(rw >> 32, &d);
            }
        }
        let touches = std::mem::take(&mut p.touches);
        if touches != 0 {
            shard.touches.fetch_add(touches, Relaxed);
        }
        if unatt_touches != 0 {
            shard.unattributed_touches.fetch_add(unatt_touches, Relaxed);
        }
        if unatt_bytes != 0 {
            shard.unattributed_bytes.fetch_add(unatt_bytes, Relaxed);
        }
        if stale != 0 {
            shard.stale_parts.fetch_add(stale, Relaxed);
        }
        if dropped != 0 {
            shard.dropped_ranges.fetch_add(dropped, Relaxed);
        }
    }

    /// In a forked child that keeps this table: the threads that owned the
    /// other buffers do not exist here and may have held their locks (or
    /// the registry's) at the fork, so locking them could wait for ever.
    /// Applies what can be locked without waiting (a buffer held at the
    /// fork was mid-call: its contents are dropped, at most the calls since
    /// its last application), then turns buffering off for good: the child
    /// counts every call at once (`touch_ranges`) and readers drain nothing.
    pub fn after_fork_child(&self) {
        if self.pending.off.swap(true, AcqRel) {
            return;
        }
        // this thread's own buffer is free (it is not inside a call), even
        // when the registry is held
        self.pending.this_thread(|b| {
            if let Some(mut p) = b.try_lock() {
                self.apply(&mut p);
            }
        });
        let Ok(r) = self.pending.try_lock() else {
            return;
        };
        for b in r.bufs.iter() {
            if let Some(mut p) = b.try_lock() {
                self.apply(&mut p);
            }
        }
    }

    /// Apply every thread's buffer (readers call this first). Buffers of
    /// threads that have exited are dropped once applied. A dirty buffer is
    /// swapped for an empty one under its lock and applied after (its
    /// thread waits for a swap, not for the resolution), with the
    /// registry's lock held throughout, so a reader or a map change that
    /// drains after this sees everything applied.
    pub(super) fn drain(&self) {
        if self.pending.off.load(Acquire) {
            return;
        }
        let mut r = self.pending.lock();
        let d = &self.deferred;
        // nothing taken since the last drain began (a buffer that takes a
        // call then sets `any`): no flag written (a free drains always)
        let take = d.any.load(SeqCst);
        if take {
            // set before `any` is cleared, cleared once all is applied: a
            // map change that finds `any` clear sees this set until then
            d.applying.store(true, SeqCst);
            d.any.store(false, SeqCst);
            d.woke.store(false, Relaxed);
        }
        let Bufs {
            bufs,
            s: Scratch { taken, spare },
        } = &mut *r;
        bufs.retain(|b| {
            if take && b.dirty.load(Acquire) {
                let fresh = spare.pop().unwrap_or_else(Pending::with_capacity);
                let mut p = b.lock();
                taken.push(std::mem::replace(&mut *p, fresh));
                b.dirty.store(false, Relaxed);
            }
            // only the registry holds it once its thread has exited
            !Buf::orphaned(b)
        });
        for mut p in taken.drain(..) {
            self.apply(&mut p);
            spare.push(p);
        }
        if take {
            d.applying.store(false, Release);
        }
    }

    /// Before the address map changes (an allocation, a VMM map or unmap;
    /// a free drains always): the raw calls buffered so far are resolved
    /// against the map they were made under. Nothing to do (two flag reads)
    /// when nothing is buffered and no drain is applying.
    #[inline]
    pub(super) fn before_map_change(&self) {
        if self.deferred.any.load(SeqCst) || self.deferred.applying.load(SeqCst) {
            self.drain();
        }
    }

    /// The engine's applier thread (engine/applier.rs), woken when a buffer
    /// is due.
    pub fn set_applier(&self, t: std::thread::Thread) {
        let _ = self.deferred.thread.set(t);
    }

    /// On the applier thread, woken: every buffer applied.
    pub fn apply_deferred(&self) {
        if self.deferred.woke.load(Relaxed) {
            self.drain();
        }
    }
}

/// The table's flags for its buffers' deferred work.
#[derive(Default)]
pub(super) struct Deferred {
    /// Set when a buffer took a call since the last drain began.
    any: std::sync::atomic::AtomicBool,
    /// Set while a drain applies what it took (see `drain`).
    applying: std::sync::atomic::AtomicBool,
    /// The applier was woken since the last drain began.
    woke: std::sync::atomic::AtomicBool,
    thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Deferred {
    #[inline(never)]
    fn wake(&self) {
        self.woke.store(true, Relaxed);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

/// The `Access` of an unbuffered path (`touch_ranges_now`,
/// `resolve_call_now`) from its fields: `write` unused there (each range
/// carries its own).
#[inline(always)]
fn unbuffered(seq: u64, ns: u64, class: OpClass, op_hash: u64) -> Access {
    Access {
        seq,
        ns,
        class,
        op_hash,
        write: false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{AllocKind, CHUNK};
    use super::*;
    use crate::engine::Range;
    use crate::opclass::OpClass;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const B: u64 = 0x1000_0000_0000;

    fn acc(seq: u64) -> Access {
        Access {
            seq,
            ns: seq * 3_000_000,
            class: if seq % 3 == 0 {
                OpClass::MatMul
            } else {
                OpClass::Elementwise
            },
            op_hash: (seq % 5) << 33,
            write: false,
        }
    }

    fn table() -> HeatTable {
        let t = HeatTable::new(64, 4096);
        for i in 0..6u64 {
            t.on_alloc(0, B + i * 64 * 1024, 48 * 1024, AllocKind::Malloc)
                .unwrap();
        }
        t.on_alloc(0, B + 4 * MIB, 6 * MIB, AllocKind::Malloc)
            .unwrap();
        t.on_alloc(0, B + GIB - 2 * MIB, 4 * MIB, AllocKind::Malloc)
            .unwrap();
        t
    }

    fn same(one: &HeatTable, all: &HeatTable, at: &str) {
        assert_eq!(one.live_allocs(), all.live_allocs(), "{at}");
        let mut c = B;
        while c < B + 2 * GIB {
            assert_eq!(one.chunk_info(c), all.chunk_info(c), "{at}: chunk {c:#x}");
            c += CHUNK;
        }
        let ranges = |t: &HeatTable| {
            let mut v = t.hottest_ranges(usize::MAX, 0);
            v.sort_by_key(|r| (r.start, r.len));
            v
        };
        assert_eq!(ranges(one), ranges(all), "{at}");
        assert_eq!(one.totals(), all.totals(), "{at}");
    }

    /// Buffered calls leave every record and counter as `touch_ranges`
    /// does: more distinct records than a buffer holds (applied when full),
    /// readers in the middle, and frees and re-allocations at the same
    /// address between calls — the freed allocation's final statistics
    /// include its buffered accesses, the next allocation there none of
    /// them. Fails if `on_free` or a reader does not apply the buffers.
    #[test]
    fn record_ranges_is_touch_ranges() {
        let (one, all) = (table(), table());
        let mut rnd = super::super::tests::xorshift();
        for call in 0..600u64 {
            let rs = super::super::tests::random_call(&mut rnd);
            let a = acc(call + 1);
            one.touch_ranges(&rs, &a);
            all.record_ranges(&rs, &a);
            if call % 37 == 36 {
                // free and re-allocate one of the small allocations
                let base = B + rnd(6) * 64 * 1024;
                let (f1, f2) = (one.on_free(base), all.on_free(base));
                assert!(f1.as_ref().unwrap().stats.accesses > 0);
                assert_eq!(f1, f2, "call {call}: free {base:#x}");
                let len = 16 * 1024 * (1 + rnd(3));
                one.on_alloc(0, base, len, AllocKind::Malloc).unwrap();
                all.on_alloc(0, base, len, AllocKind::Malloc).unwrap();
            }
            if call % 151 == 150 {
                same(&one, &all, &format!("call {call}"));
            }
        }
        same(&one, &all, "end");
        assert!(all.totals().touches > 1000);
    }

    /// A call repeating the previous call's ranges is replayed from the
    /// memo of its steps (`apply`): runs of identical calls (different
    /// sequence numbers, times, operators), small ones (the memo holds
    /// them) and large ones (it does not), with gaps, parts of several
    /// chunks, writes, frees and re-allocations and readers between them,
    /// leave every record and counter as `touch_ranges` does. Fails if a
    /// replay counts a step differently (checked: the write hit replaced by
    /// the read hit, a gap's bytes dropped, the memo kept across a list
    /// emptied while resolving).
    #[test]
    fn repeated_calls_are_touch_ranges() {
        let (one, all) = (table(), table());
        let mut rnd = super::super::tests::xorshift();
        let mut seq = 0;
        for call in 0..400u64 {
            let mut rs = super::super::tests::random_call(&mut rnd);
            if call % 2 == 0 {
                rs.truncate(1 + rnd(3) as usize);
            }
            for _ in 0..1 + rnd(6) {
                seq += 1;
                one.touch_ranges(&rs, &acc(seq));
                all.record_ranges(&rs, &acc(seq));
            }
            if call % 29 == 28 {
                let base = B + rnd(6) * 64 * 1024;
                let (f1, f2) = (one.on_free(base), all.on_free(base));
                assert_eq!(f1, f2, "call {call}: free {base:#x}");
                let len = 16 * 1024 * (1 + rnd(3));
                one.on_alloc(0, base, len, AllocKind::Malloc).unwrap();
                all.on_alloc(0, base, len, AllocKind::Malloc).unwrap();
            }
            if call % 97 == 96 {
                same(&one, &all, &format!("call {call}"));
            }
        }
        same(&one, &all, "end");
        assert!(all.totals().unattributed_touches > 0);
    }

    /// Raw ranges resolve against the address map of their call: a range
    /// in a gap stays unattributed when an allocation later covers the
    /// gap, and a range of a freed allocation counts for it, not for the
    /// next allocation at its address. Fails if `on_alloc` does not apply
    /// the buffers first (the gap's range is counted for the new
    /// allocation) or `on_free` does not (the free's statistics lack it
    /// and the re-allocation gets it).
    #[test]
    fn a_raw_range_resolves_against_the_map_of_its_call() {
        let (one, all) = (table(), table());
        let call = |rs: &[Range], seq: u64| {
            one.touch_ranges(rs, &acc(seq));
            all.record_ranges(rs, &acc(seq));
        };
        let gap = B + 2 * MIB;
        call(
            &[Range {
                addr: gap,
                len: 4096,
                write: true,
                whole: false,
            }],
            1,
        );
        one.on_alloc(0, gap, MIB, AllocKind::Malloc).unwrap();
        all.on_alloc(0, gap, MIB, AllocKind::Malloc).unwrap();
        call(
            &[Range {
                addr: B,
                len: 8192,
                write: false,
                whole: false,
            }],
            2,
        );
        let (f1, f2) = (one.on_free(B), all.on_free(B));
        assert_eq!(f1.as_ref().unwrap().stats.accesses, 1);
        assert_eq!(f1, f2, "the free's statistics");
        one.on_alloc(0, B, 32 * 1024, AllocKind::Malloc).unwrap();
        all.on_alloc(0, B, 32 * 1024, AllocKind::Malloc).unwrap();
        call(
            &[Range {
                addr: gap + 4096,
                len: 4096,
                write: false,
                whole: false,
            }],
            3,
        );
        same(&one, &all, "after the allocations");
        assert_eq!(all.totals().unattributed_touches, 1);
    }

    /// A forked child whose parent had a thread inside a call (its buffer
    /// locked) and another inside a reader (the registry locked): the
    /// child's readers and calls must not wait for them. Without
    /// `after_fork_child` the reader below blocks for ever (the test fails
    /// on its timeout).
    #[test]
    fn a_forked_child_never_waits_for_the_parents_threads() {
        use std::sync::mpsc;
        use std::time::Duration;
        let t: &'static HeatTable = Box::leak(Box::new(HeatTable::new(64, 4096)));
        let id = t.on_alloc(0, B, 8 * MIB, AllocKind::Malloc).unwrap();
        let r = [Range {
            addr: B,
            len: 4096,
            write: false,
            whole: false,
        }];
        t.record_ranges(&r, &acc(1)); // this thread's buffer: applied in the child
                                      // another thread's buffer, with one call in it, then held locked
                                      // (as by a thread inside a call when the process forked)
        let (held_tx, held_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            t.record_ranges(&r, &acc(2));
            let b = t.pending.mine_arc().unwrap();
            let _g = b.lock();
            // and the registry, as by a reader
            let _r = t.pending.lock();
            held_tx.send(()).unwrap();
            let _ = release_rx.recv();
        });
        held_rx.recv().unwrap();
        t.after_fork_child();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            t.record_ranges(&r, &acc(3)); // counted at once in the child
            tx.send(t.alloc_info(id).map(|i| i.stats.accesses)).unwrap();
        });
        let got = rx.recv_timeout(Duration::from_secs(10));
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        // this thread's call (its buffer was free) and the child's call
        // count; the held buffer's call is dropped
        assert_eq!(got, Ok(Some(2)));
    }

    /// Threads buffer calls on shared allocations and exit; a reader sees
    /// every access of every thread (exited threads' buffers included),
    /// and the free returns them all.
    #[test]
    fn threads_buffers_are_read_and_freed() {
        let t = std::sync::Arc::new(HeatTable::new(64, 4096));
        let id = t.on_alloc(0, B, 8 * MIB, AllocKind::Malloc).unwrap();
        let calls = 2000u64;
        let hs: Vec<_> = (0..4u64)
            .map(|k| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for i in 0..calls {
                        let rs = [
                            Range {
                                addr: B + (i % 4) * MIB,
                                len: 4096,
                                write: false,
                                whole: false,
                            },
                            Range {
                                addr: B + 6 * MIB,
                                len: 3 * MIB,
                                write: k == 0,
                                whole: false,
                            },
                        ];
                        t.record_ranges(&rs, &acc(1 + k * calls + i));
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let info = t.alloc_info(id).unwrap();
        assert_eq!(info.stats.accesses, 4 * calls * 2);
        assert_eq!(info.stats.last_seq, 4 * calls);
        assert_eq!(t.chunk_info(B + 7 * MIB).unwrap().stats.accesses, 4 * calls);
        assert_eq!(t.totals().touches, 4 * calls * 2);
        // the exited threads' buffers were applied and dropped
        assert!(t.pending.lock().bufs.is_empty());
        // more calls from this thread, then the free
        t.record_ranges(
            &[Range {
                addr: B,
                len: 1,
                write: true,
                whole: false,
            }],
            &acc(10 * calls),
        );
        let fin = t.on_free(B).unwrap();
        assert_eq!(fin.stats.accesses, 4 * calls * 2 + 1);
        assert_eq!(fin.stats.last_seq, 10 * calls);
    }
}
