//! Making room in HBM: physical chunks for fault-ins (evicting on demand),
//! the background watermark round, and room for allocations u3m does not
//! manage. Victims come from the device's kept `VictimOrder` (state.rs):
//! the first `ORDER_TOP` of the policy's order over the evictable resident
//! chunks, built from every candidate every `order_ttl` calls (or when used
//! up) and re-keyed with the chunks calls touched since in between.
//! A build tells a policy that maintains its order (`Placement::order_kept`:
//! the predictive one) only what changed among the candidates since the
//! last build (`walk_victims` into a `Delta`: one pass over the resident
//! chunks, no weights); the policy re-reads those and gives the order from
//! its per-class streams, as far as evictions read it. Between walks a
//! build reads only the chunks marked since the last one
//! (`track_victims`, `VictimOrder::marks`): on RAG the walk was a fifth of
//! u3m's instructions, one walk per eviction of ~10 changed chunks.

use std::borrow::Cow;
use std::sync::atomic::Ordering::Relaxed;

use super::fence::Fenced;
use super::state::{Chunk, Resolver, State};
use super::state::{BUSY_EVENTS, ORDER_TOP};
use super::{Fail, Shard as Residency, E_ALLOC, KEEP_HORIZON};
use crate::config::OutFirst;

/// Asynchronous copy-outs in flight per device before a fault-in waits for
/// the oldest: enough to keep the device-to-host link busy while copy-ins
/// run, few enough that HBM is not drained ahead of need (32 MiB).
pub(super) const COPY_OUT_DEPTH: usize = 16;
/// Usable candidates of the victim order a demand eviction examines for
/// one whose uses are complete (any such one is taken).
const SCAN_NEAR: usize = 64;
/// When those are all busy (in use by queued work), further candidates
/// examined: an idle one is taken if the policy predicts its next use after
/// the look-ahead window and about as far as the first busy one's
/// (`FAR_SHARE`). Belady's rule with a cost: waiting for the busy victim
/// stalls this copy-in (and every call behind it) for the device's queued
/// compute while the link idles; evicting an idle victim MIN would evict
/// before its next use anyway costs no fetch (the two evictions only swap
/// places). In a full-parameter AdamW step the first few hundred of the
/// order are the chunks the optimizer just wrote, all still queued. Busy
/// candidates waiting on an event the scan already met (one call's chunks,
/// one fence round's) count once: one wait frees them all, and the scan
/// goes on past them (with `ORDER_DEEP`; without that count a scan stopped
/// ~1,000 into a busy group of ~1,400 in the 13B AdamW step).
/// Whatever its next use, an idle one is taken past `SCAN_WAIT` busy ones,
/// and whenever u3m's copy-ins on the device have all landed (`link_idle`;
/// while they are in flight the fault-in waits for them, not the busy one):
/// the stall a wait costs is then the link's too, while an extra fetch
/// costs one chunk's link time (13B LoRA at 1.5 x HBM 262.3 -> 251.5 ms
/// per step with the same bytes, AdamW 761.9 -> 756.6, the 32 GiB LoRA
/// step 1630.9 -> 1600.4; `policies.sh` within 1.15 x Belady, simulated).
const SCAN_FAR: usize = 1024;
/// How deep a demand eviction may have the kept order built when its scan
/// runs off the end of the order (`ORDER_TOP` deep) with every candidate
/// busy: once per eviction, the order is built again this deep and the
/// scan goes on past the busy ones (a maintained order reads its tail only
/// as far as the scan goes; the next re-key cuts it back to `ORDER_TOP`).
/// In a full-parameter AdamW step at 1.5 x HBM, the optimizer's first
/// fault-ins meet ~1,400 busy candidates first (the backward's activations
/// and the state the optimizer just wrote, all still queued); the idle ones
/// behind them can go instead of a wait for the device (13B, 8 layers:
/// 836.3 -> 812.3 ms per step, simulated; 4096 deep: 827.5 in `u3m
/// replay`, 818.4 at 8192, no gain past it). Making `ORDER_TOP` itself 4096
/// gave less (832.0) for 42 % more instructions: every re-key weighed it.
const ORDER_DEEP: usize = 8192;
/// How near the front a victim behind busy ones must be: its weighted
/// distance to its next use (`ahead_cost`) at least half the first busy
/// one's. MIN evicts a chunk that close to the front before it is used
/// again anyway (the swap costs no fetch); one further back stays in MIN's
/// HBM until its use, and evicting it costs a fetch (13B LoRA at 1.5 x:
/// +0.23 GiB in per step without this bound, when it was 7/8; at 1/2, with
/// whole writes known, the LoRA step is as fast and `policies.sh`'s rag
/// trace moves 1.005 x Belady's bytes against 1.044; at 1/4, 1.170).
const FAR_SHARE: (u64, u64) = (1, 2);
/// Usable candidates a demand eviction's scan passes (all busy but for the
/// idle ones the rules kept) after which an idle one is taken whatever its
/// next use: a busy group this large means the device runs far behind the
/// host, and waiting for it drains the device's queue while the host,
/// waiting, issues no copy-in; the fetch an idle victim may cost is one
/// chunk's link time. Full-parameter AdamW at 1.5 x HBM (13B, 8 layers):
/// 806.6 -> 760.0 ms per step, the Llama-2-13B LoRA step on a 32 GiB card
/// 1661 -> 1632, 13B LoRA at 1.5 x 268.9 -> 262.3 (`u3m replay`,
/// simulated; the host waited for busy victims 840 ms per 32 GiB step
/// before). The bound is empirical: at 128 AdamW took 754.2 ms and the
/// 8-layer LoRA 278.9, at 192 760.1 and 267.6, at 256 787.6 and 273.5;
/// `policies.sh` stays within 1.15 x Belady at each (taking any idle one
/// past `SCAN_NEAR`: rag 1.426).
const SCAN_WAIT: usize = 160;
/// Behind a busy front that is clean: how many of the `SCAN_NEAR` nearest
/// a dirty idle candidate may stand at and still be taken whatever its next
/// use; further back (up to `SCAN_NEAR`) only if its weighted distance to
/// its next use is at least `DIRTY_SHARE` of the front's, i.e. it is needed
/// no sooner than the front (a dirty chunk's distance is not doubled; one
/// the policy cannot date is not taken). Evicting it costs a copy-out now
/// and a fetch before the front's: MIN would keep it. On RAG (kv_decode, 25
/// requests at 2 x the KV) the best candidate, KV that queued decode work
/// reads, was busy in 105,624 of 106,098 evictions (how many are busy
/// depends on how far the host runs ahead of the device, which moved when
/// reclaim stopped waiting); the idle one taken instead in the first 36 was
/// clean and predicted back at 0.5-1 x the front's weighted distance, past
/// 36 it was dirty and under 0.5 x (3,504 times). Keeping those (the
/// fault-in waits for the front, unlocked): 1545.7 tokens/s against 1436.5,
/// 192.23 / 5.17 GiB in / out against 206.87 / 7.61 (simulated). Behind a
/// dirty front
/// (an optimizer's just-written state) the rule is not applied: applied
/// there too, the Llama-2-13B LoRA step took 1788.0 ms against 1781.4 and
/// policies.sh's ratios moved both ways (adam --recompute 8 layers 1.135 ->
/// 1.106, mlp_train 1.079 -> 1.102). Any dirty one past 36 kept (no share):
/// 13B LoRA 318.2 ms against 315.6; the share from the first (no 36):
/// `u3m replay`'s lora --recompute --flash 1.175 x Belady's bytes.
const DIRTY_NEAR: usize = 16;
const DIRTY_SHARE: (u64, u64) = (1, 2);
/// Complete uses a demand eviction's scan forgets (`forget_done`); past
/// these it still reads them right, and the next scan forgets them.
const DONE_USES: usize = 64;

/// Forgets the uses (chunk, event) a scan found complete. A complete use
/// orders nothing (a copy, a free or an eviction after it waits for
/// nothing), and its event never becomes pending again while the chunk
/// holds a reference to it: the pool re-records an event only once no
/// chunk names it (`State::unref_event`). Kept, the next scan past the
/// chunk asks the runtime again — on the 8-layer LoRA at 1.5 x HBM, 69
/// queries per eviction, nearly all about work long done (each a driver
/// call on a card).
fn forget_done(st: &mut State, done: &[(u64, u32, u64)]) {
    for &(id, i, ev) in done {
        st.forget_use(id, i, ev);
    }
}

/// Chunk `key` of `dev` if it is still a candidate whose place in an order
/// built at `built_at` is current, with the chunk (`evict_in_order`).
#[inline]
fn usable_in<'s>(
    memo: &mut Resolver,
    st: &'s State,
    key: u64,
    dev: u32,
    built_at: u64,
) -> Option<((u64, u32), &'s Chunk)> {
    let (id, i, b) = memo.resolve_in(st, key)?;
    let c = &b.chunks[i as usize];
    (b.dev == dev && !b.pinned && c.may_leave() && c.last <= built_at).then_some(((id, i), c))
}

/// Pending events past `BUSY_EVENTS` a demand eviction's scan remembers
/// (the last ones met), so as not to ask them again.
const SPILL: usize = 4;
/// Candidates of the victim order a look-ahead prefetch examines.
const AHEAD_SCAN: usize = 8;

/// How far off a chunk next used at `at` is, weighted by what evicting it
/// costs — the measure the predictive order sorts by: a clean chunk's
/// eviction costs one transfer (back in later), a dirty one's two (out now,
/// back in later), so a clean chunk counts twice as far; within the next
/// 64 calls the order matters more than the copy-out and nothing is
/// weighted. The look-ahead brings a chunk in (it will be clean) only for a
/// victim further off by this measure, so demand eviction, taking the
/// furthest first, does not send it straight back.
fn ahead_cost(now: u64, at: u64, dirty: bool) -> u64 {
    let d = at.saturating_sub(now);
    if dirty || d <= 64 {
        d
    } else {
        d.saturating_mul(2)
    }
}
use crate::engine::runtime::CHUNK;
use crate::policy::Cand;

/// The chunks an eviction must not take (the calling operator's own),
/// asked of every candidate a scan meets; built once per call (or per
/// loop of evictions), not per eviction. A scan of a large operator's
/// hundreds of chunks per candidate was most of an eviction's host time
/// (the 8-layer LoRA trace: ~110,000 instructions per eviction). A call's
/// chunk list is sorted (prepare merges it in (backing, index) order) and
/// spans a few backings: a candidate is first matched against those
/// backings and their index ranges (most candidates belong to none), then,
/// in a backing whose listed chunks are not one contiguous range, found by
/// binary search. A list spanning more than `RUNS` backings is searched
/// whole; an unsorted one is scanned.
pub(super) struct Protect<'a> {
    /// Borrowed, or the call's own (kept across a call's retries).
    list: Cow<'a, [(u64, u32)]>,
    sorted: bool,
    /// Per backing of a sorted list: (id, first index, last index, every
    /// index between listed); `nruns > RUNS`: too many to list.
    runs: [(u64, u32, u32, bool); RUNS],
    nruns: usize,
}

/// Backings `Protect` summarises.
const RUNS: usize = 8;

impl<'a> Protect<'a> {
    pub(super) fn new(list: impl Into<Cow<'a, [(u64, u32)]>>) -> Protect<'a> {
        let list = list.into();
        let sorted = list.len() > 8 && list.is_sorted();
        let mut p = Protect {
            list,
            sorted,
            runs: [(0, 0, 0, false); RUNS],
            nruns: 0,
        };
        if !sorted {
            return p;
        }
        let list = &*p.list;
        let mut from = 0;
        while from < list.len() {
            let id = list[from].0;
            let n = list[from..].iter().take_while(|c| c.0 == id).count();
            let (lo, hi) = (list[from].1, list[from + n - 1].1);
            if p.nruns == RUNS {
                p.nruns = RUNS + 1;
                break;
            }
            // sorted: n distinct indices span hi - lo + 1 only if contiguous
            let dense = (hi - lo) as usize + 1 == n
                && list[from..from + n].windows(2).all(|w| w[0] != w[1]);
            p.runs[p.nruns] = (id, lo, hi, dense);
            p.nruns += 1;
            from += n;
        }
        p
    }

    #[inline]
    pub(super) fn contains(&self, c: &(u64, u32)) -> bool {
        if !self.sorted {
            return self.list.contains(c);
        }
        if self.nruns > RUNS {
            return self.list.binary_search(c).is_ok();
        }
        match self.runs[..self.nruns].iter().find(|r| r.0 == c.0) {
            None => false,
            Some(&(_, lo, hi, _)) if c.1 < lo || c.1 > hi => false,
            Some(&(_, _, _, true)) => true,
            Some(_) => self.list.binary_search(c).is_ok(),
        }
    }
}

/// A set of events that may answer "not in it" (a 256-bit filter on a
/// hash of the handle): `has` false means absent, true means perhaps.
#[derive(Default)]
struct EventFilter([u64; 4]);

impl EventFilter {
    #[inline]
    fn bit(ev: u64) -> (usize, u64) {
        // handles are pointers whose low bits are alike: the top bits of
        // a multiplicative hash
        let h = ev.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56;
        ((h >> 6) as usize, 1 << (h & 63))
    }

    #[inline]
    fn add(&mut self, ev: u64) {
        let (w, b) = Self::bit(ev);
        self.0[w] |= b;
    }

    #[inline]
    fn has(&self, ev: u64) -> bool {
        let (w, b) = Self::bit(ev);
        self.0[w] & b != 0
    }
}

impl Residency {
    /// A physical chunk on `dev`, evicting others (never `protect`) when HBM
    /// is full.
    /// `ahead`: chunks the caller still needs after this one (copy-outs for
    /// them may start now, overlapping this chunk's copy-in).
    pub(super) fn alloc_phys(
        &self,
        st: &mut State,
        dev: u32,
        protect: &Protect<'_>,
        ahead: usize,
    ) -> Result<u64, Fail> {
        let r = self.alloc_phys_evicting(st, dev, protect, ahead, false);
        if !matches!(r, Ok((_, 0, _))) {
            self.demand.fetch_add(1, Relaxed);
        }
        r.map(|(h, _, _)| h)
    }

    /// `alloc_phys` for a copy-in on u3m's host-to-device stream (or a
    /// call ordered after it): with U3M_HANDOFF the memory may be a copy-out's
    /// still in flight (`take_outgoing`; true), which that stream waits for.
    pub(super) fn alloc_phys_taking(
        &self,
        st: &mut State,
        dev: u32,
        protect: &Protect<'_>,
        ahead: usize,
    ) -> Result<(u64, bool), Fail> {
        let r = self.alloc_phys_evicting(st, dev, protect, ahead, self.handoff);
        if !matches!(r, Ok((_, 0, false))) {
            self.demand.fetch_add(1, Relaxed);
        }
        r.map(|(h, _, took)| (h, took))
    }

    /// `alloc_phys` with the number of chunks it evicted (or started to).
    /// A landed copy-out frees its chunk (`harvest`, one per chunk wanted:
    /// the copy-in into that HBM is ordered after that copy-out only); while
    /// HBM is full, clean victims are freed at once and dirty ones start
    /// their copy-out, one per chunk the caller still needs (at most
    /// `COPY_OUT_DEPTH` in flight); then the caller waits for the oldest
    /// without the lock (Busy with `wait_for`) and tries again.
    fn alloc_phys_evicting(
        &self,
        st: &mut State,
        dev: u32,
        protect: &Protect<'_>,
        ahead: usize,
        take: bool,
    ) -> Result<(u64, u32, bool), Fail> {
        let mut evicted = 0u32;
        let depth = (ahead + 1).min(COPY_OUT_DEPTH);
        loop {
            self.harvest(st, dev, 1);
            // ask only when HBM visibly has room (a refused request costs
            // the runtime a failed allocation and a log line)
            let room = self
                .rt
                .mem_info()
                .map(|(free, _)| free >= CHUNK)
                .unwrap_or(true);
            if room {
                match self.rt.malloc_physical(dev, CHUNK) {
                    Ok(h) => return Ok((h, evicted, false)),
                    Err(E_ALLOC) => {}
                    Err(e) => return Err(Fail::Acl(e)),
                }
            }
            if take {
                // the oldest copy-out in flight gives its HBM, the device
                // ordering the copy-in after it; else a victim starts one
                if let Some(h) = self.take_outgoing(st, dev) {
                    return Ok((h, evicted, true));
                }
                if self.evict_one(st, dev, protect)? {
                    evicted += 1;
                    continue;
                }
            } else if st.dev(dev).outgoing.len() < depth && self.evict_one(st, dev, protect)? {
                evicted += 1;
                continue;
            }
            match st.dev(dev).outgoing.front() {
                Some(o) => st.wait_for = Some(o.ev),
                None => return Err(Fail::Busy),
            }
            return Err(Fail::Busy);
        }
    }

    /// Evicts the first evictable chunk of `dev` in the policy's order (the
    /// device's maintained `VictimOrder`; one sort per many evictions),
    /// with the order built `ORDER_DEEP` deep once when all of it is busy.
    /// Ok(false): nothing can move. Busy: every candidate is still in use
    /// (`st.wait_for` names an event to wait for without the lock).
    pub(super) fn evict_one(
        &self,
        st: &mut State,
        dev: u32,
        protect: &Protect<'_>,
    ) -> Result<bool, Fail> {
        let mut fresh = false;
        let mut deep = false;
        loop {
            if !fresh {
                fresh = self.current_order(st, dev);
            }
            match self.evict_in_order(st, dev, protect, !deep)? {
                Some(true) => return Ok(true),
                // every candidate of the order busy, more behind it
                None => {
                    self.rebuild_order(st, dev, ORDER_DEEP);
                    (fresh, deep) = (true, true);
                }
                // used up: one rebuild (chunks resident since it was built),
                // whole if a fresh one's first ORDER_TOP had none to give;
                // nothing to give is said only by a walk of every chunk (a
                // mark missed must never refuse an allocation)
                _ if fresh && st.dev(dev).order.complete && !st.dev(dev).order.from_marks => {
                    return Ok(false)
                }
                _ => {
                    if fresh && st.dev(dev).order.from_marks {
                        st.dev_mut(dev).order.marks_over = true;
                    }
                    self.rebuild_order(st, dev, if fresh { usize::MAX } else { ORDER_TOP });
                    fresh = true;
                }
            }
        }
    }

    /// Makes `dev`'s kept order current before an eviction: built from
    /// every candidate when `stale`, else re-keyed when chunks were touched
    /// since it was ordered. true: built.
    fn current_order(&self, st: &mut State, dev: u32) -> bool {
        let ttl = self.policy.order_ttl();
        let o = &st.dev(dev).order;
        if o.stale(st.clock, ttl) {
            self.rebuild_order(st, dev, ORDER_TOP);
            return true;
        }
        if st.dev(dev).order.needs_rekey() {
            self.rekey_order(st, dev);
        }
        false
    }

    /// Orders `dev`'s candidates into a new maintained order: the first
    /// `k` of the policy's order (`Placement::order_top`).
    /// A policy that maintains its order (`Placement::order_kept`) is told
    /// what changed since the last build (a `Delta`) instead of
    /// weighing every candidate.
    fn rebuild_order(&self, st: &mut State, dev: u32, k: usize) {
        let o = &mut st.dev_mut(dev).order;
        let (mut cands, mut tail) = (std::mem::take(&mut o.cands), std::mem::take(&mut o.tail));
        let (mut seq, mut cur) = (std::mem::take(&mut o.cur_seq), std::mem::take(&mut o.cur));
        let (mut gone, mut new) = (std::mem::take(&mut o.gone), std::mem::take(&mut o.new));
        let (mut marks, mut read) = (std::mem::take(&mut o.marks), std::mem::take(&mut o.read));
        let (mut ps, mut p) = (std::mem::take(&mut o.prev_seq), std::mem::take(&mut o.prev));
        let mut edits = std::mem::take(&mut o.edits);
        // (the last build's candidates, for the check below: copied only
        // when it runs)
        #[cfg(debug_assertions)]
        let was = st.dev(dev).order.checked.then(|| (ps.clone(), p.clone()));
        // the chunks marked since the last build only, when they tell all
        // (else every chunk: `walk_victims`; in tests both, compared)
        let tracked = track_victims(
            st, dev, &mut marks, &mut read, &mut edits, &mut ps, &mut p, &mut gone, &mut new,
        );
        if !tracked {
            marks.clear();
            let mut d = Delta::new((&ps, &p), &mut seq, &mut cur, &mut gone, &mut new);
            walk_victims(st, dev, &mut d, Some(&mut marks));
            // this build's candidates are the next one's previous ones
            std::mem::swap(&mut ps, &mut seq);
            std::mem::swap(&mut p, &mut cur);
        }
        #[cfg(debug_assertions)]
        if let (true, Some(was)) = (tracked, &was) {
            check_tracked(st, dev, (&was.0, &was.1), &ps, &p, &gone, &new);
        }
        let structure = st.structure;
        let o = &mut st.dev_mut(dev).order;
        (o.marks, o.read, o.edits) = (marks, read, edits);
        o.from_marks = tracked;
        if tracked {
            o.tracked += 1;
        } else {
            (o.marks_over, o.walked) = (false, structure);
            o.walks += 1;
        }
        let (n, now) = (p.len(), st.clock);
        let o = &mut st.dev_mut(dev).order;
        (o.gone, o.new) = (gone, new);
        if o.owner == 0 {
            o.owner = crate::policy::KeptId::new_owner();
        }
        let id = crate::policy::KeptId {
            owner: o.owner,
            dev,
            epoch: o.epoch + 1,
        };
        // which victims go first depends on which direction of the link
        // u3m's copies load (balance.rs; off, the default: the policy is
        // never told, and weighs such chunks as clean)
        if self.out_first != OutFirst::Off {
            let slack = o.balance.out_first(
                self.out_first,
                self.c.fault_bytes.load(Relaxed) + self.c.prefetch_bytes.load(Relaxed),
                self.c.eviction_bytes.load(Relaxed),
            );
            self.policy.set_out_slack(slack);
        }
        let kept = self
            .policy
            .order_kept(id, now, &p, &o.gone, &o.new, k, &mut cands, &mut tail);
        let all = if kept {
            o.epoch += 1;
            cands.len() + tail.len() == n
        } else {
            cands.clear();
            cands.extend_from_slice(&p);
            if self.policy.order_ranked(now, &mut cands, k, &mut tail) {
                cands.len() + tail.len() == n
            } else {
                self.policy.order_top(now, &mut cands, k);
                cands.len() == n
            }
        };
        (o.prev_seq, o.prev) = (ps, p);
        (o.cur_seq, o.cur) = (seq, cur);
        let clock = st.clock;
        let o = &mut st.dev_mut(dev).order;
        o.cands = cands;
        o.tail = tail;
        o.next = 0;
        o.built_at = clock;
        o.full_at = clock;
        o.taken = 0;
        o.complete = all;
        o.touched.clear();
        o.overflow = false;
        o.busy = None;
    }

    /// Re-keys `dev`'s kept order at the current time: the entries it
    /// still holds that are candidates, and the touched chunks that are
    /// candidates now (wherever they stood, or were not in it: made
    /// resident by their call or a prefetch), all ordered again together
    /// (`order_top`: its first `ORDER_TOP` stay). Candidates neither in it
    /// nor touched stay out until it is built again.
    fn rekey_order(&self, st: &mut State, dev: u32) {
        let o = &mut st.dev_mut(dev).order;
        let (mut kept, mut touched, mut tail) = (
            std::mem::take(&mut o.cands),
            std::mem::take(&mut o.touched),
            std::mem::take(&mut o.tail),
        );
        let next = o.next;
        // the unsorted rest is ordered again with the others
        tail.drain_into_from(&*self.policy, &mut kept);
        // (a call's chunks sit together in `touched`, sorted, and often in
        // the order: most keys resolve in the memo's range)
        let mut memo = Resolver::default();
        let mut cand = |key: u64| -> Option<Cand> {
            // (re-keyed at the current time: whenever last used)
            let (_, c) = usable_in(&mut memo, st, key, dev, u64::MAX)?;
            Some(Cand {
                key,
                last: c.last,
                dirty: c.needs_copy_out(),
            })
        };
        touched.sort_unstable();
        touched.dedup();
        let mut w = 0;
        for r in next..kept.len() {
            // a touched one comes from `touched` (no repeats); every entry
            // is ordered again at the current time
            if touched.binary_search(&kept[r].key).is_err() {
                if let Some(c) = cand(kept[r].key) {
                    kept[w] = c;
                    w += 1;
                }
            }
        }
        kept.truncate(w);
        for &key in &touched {
            if let Some(c) = cand(key) {
                kept.push(c);
            }
        }
        if !self
            .policy
            .order_ranked(st.clock, &mut kept, ORDER_TOP, &mut tail)
        {
            self.policy.order_top(st.clock, &mut kept, ORDER_TOP);
        }
        let clock = st.clock;
        let o = &mut st.dev_mut(dev).order;
        // candidates that came without a call (prefetched) are not in it
        o.complete = false;
        o.cands = kept;
        o.tail = tail;
        touched.clear();
        o.touched = touched;
        o.next = 0;
        o.built_at = clock;
        o.taken = 0;
        o.busy = None;
    }

    /// The candidates of `dev` (`collect_victims`) in the policy's order,
    /// (at least) the first `k` of it (`Placement::order_top`) left in
    /// `cands`; true when every candidate is there.
    fn victims_top_into(&self, st: &State, dev: u32, cands: &mut Vec<Cand>, k: usize) -> bool {
        self.collect_victims(st, dev, &[], cands);
        let n = cands.len();
        self.policy.order_top(st.clock, cands, k);
        cands.len() == n
    }

    /// One eviction from the maintained order: Some(true) evicted,
    /// Some(false) no candidate left in it, Err(Busy) all in use; with
    /// `deepen`, None when all of it is busy and it is not `ORDER_DEEP`
    /// deep while there are candidates behind it (build it deeper and ask
    /// again).
    fn evict_in_order(
        &self,
        st: &mut State,
        dev: u32,
        protect: &Protect<'_>,
        deepen: bool,
    ) -> Result<Option<bool>, Fail> {
        let built_at = st.dev(dev).order.built_at;
        // still a candidate, and its place in the order is current
        // (nothing below changes `vas` or `backings` before the scan ends)
        let mut memo = Resolver::default();
        let mut usable = |st: &State, key: u64| -> Option<(u64, u32)> {
            usable_in(&mut memo, st, key, dev, built_at).map(|(p, _)| p)
        };
        // Prefer a chunk whose uses are complete among the first
        // `SCAN_NEAR` usable (any of them); past those, up to `SCAN_FAR`,
        // one that is idle and predicted needed only after the look-ahead
        // window (Belady's rule with a cost: see `SCAN_FAR`); else wait for
        // the first busy one, or for the busy one last used earliest when
        // that is a fence round older (`earliest`). Chunks used by the
        // same call share an event: an event seen pending is not asked
        // again in this scan.
        let now = st.clock;
        let window = now.saturating_add(st.dev(dev).ahead.depth);
        let mut pending = [0u64; BUSY_EVENTS];
        let mut npend = 0usize;
        // pending events met once `pending` is full, not asked again in
        // this scan either: a deep scan meets one call's chunks spread among
        // others', and asking one event a thousand times at one host time is
        // what a program spinning on it does (the simulator then lets the
        // host's time pass to the event, as a card's would while it spins;
        // `u3m replay` does not, and the two parted on the 8-layer LoRA)
        let mut spill = [0u64; SPILL];
        let mut nspill = 0usize;
        // a filter of `pending`: a completed use (most of a scan's) is
        // told from them without reading it
        let mut pmask = EventFilter::default();
        let mut first_busy = None;
        // the busy candidate whose last use is oldest, (last, chunk): the
        // device runs a stream's work in order, so its use most likely
        // completes first. Waiting for the first busy one instead (the
        // policy's best victim) can wait for much newer work: in a full-
        // parameter AdamW step that is the optimizer's first update, queued
        // behind the whole backward, while the activations the backward
        // reads one by one go idle behind it and the link stays idle (13B,
        // 1.5 x HBM: the host waited 61 ms of a 109 ms backward). Only when
        // the earliest one's weighted distance to its next use is at least
        // `DIRTY_SHARE` of the first's: one needed much sooner would come
        // back (`policies.sh`'s adam --recompute, 4 layers: 1.147 -> 1.162 x
        // Belady's bytes without that bound). (Also only when the first was
        // last used a fence round later, once: with whole writes known that
        // bound cost the 13B LoRA step at 1.5 x 278.5 against 268.9 ms,
        // simulated — every wait for newer work drains the device's queue,
        // and the host, waiting, issues no copy-in meanwhile.)
        let mut earliest: Option<(u64, (u64, u32))> = None;
        // the first busy one's weighted distance to its next use (None: the
        // policy cannot date it), asked once per scan
        let mut front: Option<Option<u64>> = None;
        let front_cost = |st: &State, (bi, bc): (u64, u32)| -> Option<u64> {
            let b = st.chunk(bi, bc);
            let bkey = st.backings[&bi].key(bi, bc);
            self.policy
                .next_use(now, bkey)
                .map(|v| ahead_cost(now, v, b.needs_copy_out()))
        };
        let mut seen = 0;
        // u3m's copy-ins on `dev` all complete (`link_idle`), asked once
        let mut link_idle: Option<bool> = None;
        // the scan stopped at an idle candidate, needed after the look-ahead
        // window, that it would take with u3m's copy-ins landed (then
        // `link_idle` was asked: they are in flight)
        let mut idle_left = false;
        let mut k = st.dev(dev).order.next;
        let own = st.dev(dev).stream;
        // the busy run the last scan of this order found, if it still is
        if let Some(b) = st.dev(dev).order.busy {
            if b.end > k && self.all_pending(st, dev, &b.events[..b.n]) {
                if let Some(f) = usable(st, b.first) {
                    (k, seen, first_busy, pending, npend) = (b.end, b.seen, Some(f), b.events, b.n);
                    pending[..npend].iter().for_each(|&ev| pmask.add(ev));
                    // the run's earliest, not its first: the scan no longer
                    // meets the run's older work (the 8-layer LoRA at 1.5 x
                    // HBM under a scratch victim order, every chunk busy as
                    // the backward began: a 45 ms wait for work 26 calls
                    // old, with work 256 calls old still queued in the run;
                    // the 32 GiB LoRA step 1227.0 -> 1195.6 ms, simulated).
                    // Taken only while still in use: a wait for a done
                    // event would find the run again, and loop.
                    let e = usable(st, b.earliest)
                        .filter(|&(ei, ec)| {
                            st.chunk(ei, ec)
                                .uses
                                .iter()
                                .any(|u| !self.rt.event_done(u.1).unwrap_or(true))
                        })
                        .unwrap_or(f);
                    earliest = [f, e]
                        .into_iter()
                        .map(|c| (st.chunk(c.0, c.1).last, c))
                        .min_by_key(|x| x.0);
                }
            }
        }
        // the run from `next` is still all busy (each on a recorded event,
        // none protected): where it ends is worth keeping
        let mut run = true;
        let (mut run_end, mut run_seen, mut run_earliest) = (k, seen, earliest);
        // usable entries counted against `SCAN_FAR`: busy ones waiting on
        // an event already met in this scan count once (a call's chunks, a
        // fence round's: one wait frees them all), so the scan reaches past
        // a large busy group; a resumed busy run counts one per event
        let mut far = npend;
        // the earliest copy-in on the device's own stream found pending in
        // this scan (its place in `State::in_order`): every later one is
        // pending too, unasked (the 8-layer LoRA's scans met ~40 pending
        // copy-ins each, nearly all the queries they made)
        let mut in_pending = u64::MAX;
        // uses the scan found complete, forgotten after it (`forget_done`)
        let mut done = [(0u64, 0u32, 0u64); DONE_USES];
        let mut ndone = 0usize;
        // the scan reached the end of the order (not SCAN_FAR, not a take)
        let mut ended = false;
        let taken = loop {
            if far >= SCAN_FAR {
                break None;
            }
            if !st.dev_mut(dev).order.has(k, &*self.policy) {
                ended = true;
                break None;
            }
            let key = st.dev(dev).order.cands[k].key;
            // (the chunk read once: each `st.chunk` is a map lookup, and a
            // scan passes ~100 busy candidates per eviction on the LoRA)
            let Some(((id, i), c)) = usable_in(&mut memo, st, key, dev, built_at) else {
                if k == st.dev(dev).order.next {
                    st.dev_mut(dev).order.next += 1; // gone for good
                }
                k += 1;
                if run {
                    run_end = k;
                }
                continue;
            };
            k += 1;
            if protect.contains(&(id, i)) {
                run = false;
                continue;
            }
            let mut idle = true;
            let mut shared = false;
            for &(s, ev) in &c.uses {
                let known = pmask.has(ev) && pending[..npend].contains(&ev);
                let own_in = s == own && s != 0;
                if known
                    || spill[..nspill.min(SPILL)].contains(&ev)
                    || (own_in
                        && in_pending != u64::MAX
                        && st.copy_in_place(dev, ev).is_some_and(|p| p > in_pending))
                    || !match self.rt.event_done(ev) {
                        Ok(true) => {
                            if ndone < DONE_USES {
                                done[ndone] = (id, i, ev);
                                ndone += 1;
                            }
                            true
                        }
                        Ok(false) => {
                            if let Some(p) = own_in.then(|| st.copy_in_place(dev, ev)).flatten() {
                                in_pending = in_pending.min(p);
                            }
                            false
                        }
                        Err(_) => true,
                    }
                {
                    if known {
                        shared = true;
                    } else if npend < pending.len() {
                        pending[npend] = ev;
                        npend += 1;
                        pmask.add(ev);
                    } else {
                        run = false;
                        if !spill[..nspill.min(SPILL)].contains(&ev) {
                            spill[nspill % SPILL] = ev;
                            nspill += 1;
                        }
                    }
                    idle = false;
                    break;
                }
            }
            seen += 1;
            if idle || !shared {
                far += 1;
            }
            if !idle {
                first_busy.get_or_insert((id, i));
                let last = c.last;
                if earliest.is_none_or(|(e, _)| last < e) {
                    earliest = Some((last, (id, i)));
                }
                if run {
                    (run_end, run_seen, run_earliest) = (k, seen, earliest);
                }
                continue;
            }
            let dirty = c.needs_copy_out();
            if dirty
                && seen > DIRTY_NEAR
                && seen <= SCAN_NEAR
                && first_busy.is_some_and(|(bi, bc)| !st.chunk(bi, bc).needs_copy_out())
            {
                // a dirty idle chunk deep behind busy ones: taken only if
                // not much nearer its next use than the front (DIRTY_SHARE)
                let front =
                    *front.get_or_insert_with(|| front_cost(st, first_busy.unwrap_or((id, i))));
                // (a front the policy cannot date gives no measure: taken)
                if let Some(front) = front {
                    match self.policy.next_use(now, key) {
                        Some(v)
                            if ahead_cost(now, v, true) as u128 * DIRTY_SHARE.1 as u128
                                >= front as u128 * DIRTY_SHARE.0 as u128 => {}
                        _ => break None,
                    }
                }
            }
            if seen > SCAN_NEAR {
                // an idle chunk behind busy ones: taken only if its next
                // use is after the window and, weighted by what evicting it
                // costs, at least FAR_SHARE of the first busy one's — near
                // the front of the order, where MIN evicts a chunk before
                // its next use anyway; the order is by that weighted
                // distance, so once an idle one falls short, the rest do
                // (`SCAN_WAIT` deep behind busy ones, any idle one goes)
                let front =
                    *front.get_or_insert_with(|| front_cost(st, first_busy.unwrap_or((id, i))));
                let Some(front) = front else { break None };
                let next = self.policy.next_use(now, key);
                match next {
                    Some(v)
                        if v > window
                            && ahead_cost(now, v, dirty) as u128 * FAR_SHARE.1 as u128
                                >= front as u128 * FAR_SHARE.0 as u128 => {}
                    _ if seen >= SCAN_WAIT => {}
                    // u3m's copy-ins all landed: a wait would leave the
                    // link idle until the device reaches the busy victim
                    _ if *link_idle.get_or_insert_with(|| self.link_idle(st, dev)) => {}
                    _ => {
                        // taken once they land, unless the look-ahead would
                        // fetch it right back (`policies.sh`'s adam
                        // --recompute: 1.157 x Belady's bytes without that
                        // bound, 1.029 with it, 1.136 waiting for the busy
                        // one as before)
                        idle_left = next.is_some_and(|v| v > window);
                        break None;
                    }
                }
            }
            break Some((id, i));
        };
        self.keep_busy_run(
            st,
            dev,
            (run_end, run_seen),
            first_busy,
            run_earliest.map(|e| e.1),
            &pending[..npend],
        );
        forget_done(st, &done[..ndone]);
        if let Some((id, i)) = taken {
            self.evict(st, id, i)?;
            st.dev_mut(dev).order.taken += 1;
            return Ok(Some(true));
        }
        // every entry busy (or protected) to the order's end, and more
        // candidates behind it: build it deeper before waiting
        if deepen && ended && first_busy.is_some() && !st.dev(dev).order.complete && k < ORDER_DEEP
        {
            return Ok(None);
        }
        // A first busy one the policy expects written whole before any read
        // (dead data: an activation or a freed block the allocator hands
        // out again; `next_use` says u64::MAX) has no distance to weigh the
        // earliest against: by the share rule the fault-in always waited
        // for it, i.e. for the newest work, draining the device's queue
        // while the host issued nothing. The earliest's wait is the
        // shortest; a fetch it may cost is one chunk's link time (the
        // Llama-2-13B LoRA step on a 32 GiB card 1415.5 -> 1227.0 ms, the
        // 8-layer LoRA at 1.5 x HBM with the allocator's frees as hints
        // 272.3 -> 230.9, simulated; BENCHMARKS.md, twenty-sixth sitting).
        // (the first's next use is asked once: u64::MAX is dead, None
        // gives no measure, either way the earliest goes)
        let earliest_goes = |st: &State, (fi, fc): (u64, u32), e: (u64, u32)| -> bool {
            let fkey = st.backings[&fi].key(fi, fc);
            match self.policy.next_use(now, fkey) {
                Some(u64::MAX) | None => true,
                Some(v) => front_cost(st, e).is_some_and(|c| {
                    let f = ahead_cost(now, v, st.chunk(fi, fc).needs_copy_out());
                    c as u128 * DIRTY_SHARE.1 as u128 >= f as u128 * DIRTY_SHARE.0 as u128
                }),
            }
        };
        let target = match (first_busy, earliest) {
            (Some((fi, fc)), Some((last, e)))
                if st.chunk(fi, fc).last > last && earliest_goes(st, (fi, fc), e) =>
            {
                Some(e)
            }
            _ => first_busy,
        };
        let Some((id, i)) = target else {
            return Ok(Some(false));
        };
        if idle_left {
            // u3m's copy-ins are in flight and the scan stopped at an idle
            // victim it takes once they land (`link_idle`): wait for them,
            // not for the busy one. That one was used 0-25 calls ago, so
            // waiting for it drains the device's queue (~8 ms in the 13B
            // LoRA at 1.5 x HBM, 13 times a step) and the link idles once
            // the copy-ins have landed: 251.5 -> 244.9 ms per step, the
            // 4-layer LoRA 160.6 -> 148.1, at 1.3 x HBM 197.4 -> 170.5,
            // the 32 GiB LoRA step 1600.4 -> 1569.8 (`u3m replay`,
            // simulated; AdamW 756.6 as before).
            st.wait_for = Some(st.dev(dev).last_in);
            return Err(Fail::Busy);
        }
        // Every candidate is still in use. Never wait for the device while
        // holding the lock: a stream may be blocked on work the host has yet
        // to issue (an HCCL peer), and issuing it needs this lock. The caller
        // drops the lock and waits (Busy).
        let pending = st
            .chunk(id, i)
            .uses
            .iter()
            .find(|u| !self.rt.event_done(u.1).unwrap_or(true))
            .map(|u| u.1);
        if pending.is_none() && !protect.contains(&(id, i)) {
            // idle after all: its work completed since the scan asked, or
            // the scan took it for busy by its stream's order
            // (`in_pending`). It goes now; a wait for nothing would only
            // find it again.
            self.evict(st, id, i)?;
            st.dev_mut(dev).order.taken += 1;
            return Ok(Some(true));
        }
        st.wait_for = pending.or_else(|| st.chunk(id, i).uses.first().map(|u| u.1));
        Err(Fail::Busy)
    }

    /// u3m's copy-ins on `dev` all complete: the link's host-to-device
    /// direction idles unless another is issued.
    fn link_idle(&self, st: &State, dev: u32) -> bool {
        let ev = st.dev(dev).last_in;
        ev == 0 || self.rt.event_done(ev).unwrap_or(true)
    }

    /// Whether every event of `events` (uses of `dev`'s chunks) is still
    /// pending. Copy-ins on the device's own stream complete in the order
    /// they were recorded: only the earliest of them is asked.
    fn all_pending(&self, st: &State, dev: u32, events: &[u64]) -> bool {
        let mut earliest: Option<(u64, u64)> = None;
        for &ev in events {
            match st.copy_in_place(dev, ev) {
                Some(p) => {
                    if earliest.is_none_or(|(e, _)| p < e) {
                        earliest = Some((p, ev));
                    }
                }
                None => {
                    if self.rt.event_done(ev).unwrap_or(true) {
                        return false;
                    }
                }
            }
        }
        earliest.is_none_or(|(_, ev)| !self.rt.event_done(ev).unwrap_or(true))
    }

    /// Keeps the busy run `evict_in_order` found at the front of `dev`'s
    /// order (up to `end`, with `seen` usable entries, all busy on
    /// `events`), for the next scan of the same order to start after it.
    fn keep_busy_run(
        &self,
        st: &mut State,
        dev: u32,
        (end, seen): (usize, usize),
        first: Option<(u64, u32)>,
        earliest: Option<(u64, u32)>,
        events: &[u64],
    ) {
        let o = &st.dev(dev).order;
        let busy = match first {
            Some((id, i)) if end > o.next && !events.is_empty() => {
                let mut ev = [0u64; BUSY_EVENTS];
                ev[..events.len()].copy_from_slice(events);
                let (ei, ec) = earliest.unwrap_or((id, i));
                Some(super::state::BusyFront {
                    end,
                    seen,
                    first: st.backings[&id].key(id, i),
                    earliest: st.backings[&ei].key(ei, ec),
                    events: ev,
                    n: events.len(),
                })
            }
            _ => None,
        };
        st.dev_mut(dev).order.busy = busy;
    }

    /// One victim for a look-ahead prefetch of a chunk predicted at tick
    /// `t` (`ahead`), by Belady's rule on predictions: among the first
    /// candidates of the maintained order, the first whose predicted next
    /// use is later than `t` and than `beyond` (the end of the look-ahead
    /// window: a chunk needed inside the window would only come back,
    /// where demand paging — MIN — would have kept it and evicted a chunk
    /// used in between) — a dirty one (its eviction costs a copy-out too)
    /// only if over twice as far from now. A candidate the policy cannot
    /// date, one in use (pinned, or a use not yet complete: never waited
    /// for) and one in `protect` are skipped. Some(dirty) evicted (a dirty
    /// one's copy-out started), None: no victim qualifies.
    pub(super) fn evict_ahead(
        &self,
        st: &mut State,
        dev: u32,
        t: u64,
        beyond: u64,
        protect: &Protect<'_>,
    ) -> Option<bool> {
        self.current_order(st, dev);
        let now = st.clock;
        let built_at = st.dev(dev).order.built_at;
        let mut seen = 0;
        let mut k = st.dev(dev).order.next;
        while seen < AHEAD_SCAN && st.dev_mut(dev).order.has(k, &*self.policy) {
            let key = st.dev(dev).order.cands[k].key;
            k += 1;
            let Some((id, i)) = st.resolve(key) else {
                continue;
            };
            let b = &st.backings[&id];
            let c = &b.chunks[i as usize];
            if b.dev != dev
                || b.pinned
                || !c.in_hbm()
                || c.pins != 0
                || c.out_ev != 0
                || c.last > built_at
                || protect.contains(&(id, i))
            {
                continue;
            }
            seen += 1;
            let dirty = c.needs_copy_out();
            if dirty {
                // a dirty victim costs a copy-out, and its HBM is free only
                // once that lands: the look-ahead takes clean ones only (on
                // kv_decode at 2 x the KV that fits, dirty victims made
                // 130 GB of copy-outs and doubled the decode step)
                continue;
            }
            let later = self
                .policy
                .next_use(now, key)
                .is_some_and(|v| ahead_cost(now, v, dirty) > ahead_cost(now, t.max(beyond), false));
            if !later
                || !c
                    .uses
                    .iter()
                    .all(|&(_, ev)| self.rt.event_done(ev).unwrap_or(true))
            {
                continue;
            }
            if self.evict(st, id, i).is_err() {
                return None;
            }
            st.dev_mut(dev).order.taken += 1;
            self.c.ahead_evictions.fetch_add(1, Relaxed);
            return Some(dirty);
        }
        None
    }

    /// Resident chunks of `dev` that may leave HBM (not pinned, not in a
    /// call, not leaving, not in `protect`), unordered, into `cands`
    /// (cleared first; its capacity is reused).
    fn collect_victims(&self, st: &State, dev: u32, protect: &[(u64, u32)], cands: &mut Vec<Cand>) {
        cands.clear();
        for (&id, b) in st.backings.iter() {
            if b.dev != dev || b.pinned {
                continue;
            }
            for (i, c) in b.chunks.iter().enumerate() {
                if c.may_leave() && !protect.contains(&(id, i as u32)) {
                    cands.push(Cand {
                        key: b.key(id, i as u32),
                        last: c.last,
                        dirty: c.needs_copy_out(),
                    });
                }
            }
        }
    }

    /// Background watermark work for `dev`: when HBM use is above `high` ×
    /// capacity, evict in the policy's order until it is at or below `low` ×
    /// capacity, stopping at the first chunk the policy expects within
    /// `KEEP_HORIZON` calls. Returns the chunks evicted.
    /// HBM use counts everything on the device (managed chunks and memory
    /// u3m does not manage), as the runtime reports it for `dev`.
    pub fn enforce_watermarks(&self, dev: u32, low: f64, high: f64) -> u32 {
        let Ok((free, total)) = self.rt.mem_info() else {
            return 0;
        };
        if total == 0 || (total.saturating_sub(free) as f64) <= high * total as f64 {
            return 0;
        }
        let Ok(mut st) = self.st.lock() else { return 0 };
        self.harvest(&mut st, dev, usize::MAX);
        let target = (total.saturating_sub(free) as f64 - low * total as f64).max(0.0) as u64;
        // one ordering per round; a chunk the policy expects within the
        // horizon ends the round: evicting it would only bring it back (the
        // headroom is a wish, demand eviction still makes room when needed)
        // (the first of the order: those the target needs and as many
        // again for busy ones skipped; the whole order in a second pass if
        // they run out first)
        let now = st.clock;
        let want = (target / CHUNK) as usize * 2 + 64;
        let mut ordered = Vec::new();
        let all = self.victims_top_into(&st, dev, &mut ordered, want);
        let mut n = 0u32;
        let (mut k, mut whole) = (0, all);
        loop {
            if k == ordered.len() {
                if whole {
                    break;
                }
                self.victims_top_into(&st, dev, &mut ordered, usize::MAX);
                (k, whole) = (0, true);
                continue;
            }
            let c = ordered[k];
            k += 1;
            if (n as u64) * CHUNK >= target || self.policy.predicts(now, c.key, KEEP_HORIZON) {
                break;
            }
            let Some((id, i)) = st.resolve(c.key) else {
                continue;
            };
            let ch = st.chunk(id, i);
            // busy chunks are skipped: the background never waits
            if !ch.in_hbm()
                || ch.pins != 0
                || ch.out_ev != 0
                || !ch
                    .uses
                    .iter()
                    .all(|&(_, ev)| self.rt.event_done(ev).unwrap_or(true))
            {
                continue;
            }
            if self.evict(&mut st, id, i).is_err() {
                break;
            }
            n += 1;
        }
        n
    }

    /// Evicts chunks of `dev` in the policy's order until `bytes` are on
    /// their way out (or nothing more can go): the bytes evicted.
    fn evict_bytes(&self, st: &mut State, dev: u32, bytes: u64) -> u64 {
        let mut freed = 0;
        let none = Protect::new(&[]);
        while freed < bytes {
            match self.evict_one(st, dev, &none) {
                Ok(true) => freed += CHUNK,
                _ => break,
            }
        }
        freed
    }

    /// An allocation u3m does not manage failed for lack of HBM: evict
    /// managed chunks of `dev` to make room for `bytes`, kept for the
    /// caller's retry (`Room`). None if nothing moved.
    pub fn make_room(&self, dev: u32, bytes: u64) -> Option<Room> {
        let Ok(mut st) = self.st.lock() else {
            return None;
        };
        // kept from here: the copy-outs that land while this waits without
        // the lock, and the room between the return and the caller's
        // retry, are not taken by other threads' fault-ins (they evict
        // instead)
        let room = Room::keep(self.fences, bytes);
        let mut freed = self.evict_bytes(&mut st, dev, bytes);
        // the caller retries its allocation at once: the copy-outs land
        // first, waited for without the lock (u3m's device-to-host stream
        // holds only copies) and completed with it retaken (`harvest`)
        let (mut st, waited) = self.wait_unlocked(st, dev, false);
        if waited {
            // what the device still lacks (the eviction gave less than
            // asked, or a room kept for another caller) is evicted again and
            // settled with the lock held, so the room is there when the
            // caller retries
            let more = self.evict_bytes(&mut st, dev, self.fences.kept_short());
            if more > 0 {
                freed += more;
                self.settle_outgoing(&mut st, dev);
            }
        }
        (freed > 0).then_some(room)
    }
}

/// HBM that `make_room` freed, kept for its caller (`Fenced::keep_free`) until
/// dropped: after the caller's retry of its allocation.
#[must_use = "the room is given back when dropped: keep it across the retry"]
pub struct Room {
    fences: &'static Fenced,
    bytes: u64,
}

impl Room {
    fn keep(fences: &'static Fenced, bytes: u64) -> Room {
        fences.keep_free(bytes);
        Room { fences, bytes }
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        self.fences.unkeep(self.bytes);
    }
}

/// `collect_victims` without `protect`, in the same walk, into `d`: each
/// candidate with its place in the walk of every chunk of `dev`'s
/// backings (pinned ones too). While no backing comes or goes, a chunk
/// keeps its place, so two builds' candidates compare in this one pass.
/// With `marks`, each backing's place is kept (`Backing::place`) and the
/// chunks pinned or leaving HBM are marked (`VictimOrder::marks`): the
/// next build can read those and the chunks marked since instead.
fn walk_victims(st: &State, dev: u32, d: &mut Delta, mut marks: Option<&mut Vec<u64>>) {
    let mut at = 0u32;
    for (&id, b) in st.backings.iter() {
        if b.dev != dev {
            continue;
        }
        if marks.is_some() {
            b.place.set(at);
        }
        for (i, c) in b.chunks.iter().enumerate() {
            let busy = c.pins != 0 || c.out_ev != 0;
            if busy {
                if let Some(m) = marks.as_deref_mut() {
                    m.push(b.key(id, i as u32));
                }
            } else if !b.pinned && c.in_hbm() {
                let x = Cand {
                    key: b.key(id, i as u32),
                    last: c.last,
                    dirty: c.needs_copy_out(),
                };
                d.push(at.wrapping_add(i as u32), x);
            }
        }
        at = at.wrapping_add(b.chunks.len() as u32);
    }
    d.finish();
}

/// `walk_victims`' result, from the chunks marked since the last build
/// (`marks`): the last build's candidates `(ps, p)` edited in place, each
/// marked chunk read again at its place (`Backing::place`), the rest as
/// they were (copying them all into a new list cost RAG ~3,000
/// instructions a build, for ~10 marks).
/// False (nothing written) when the marks cannot tell: they overflowed, a
/// backing came, went or was remapped since the last walk
/// (`State::structure`), or a mark names no chunk of `dev` with a place.
/// On true `marks` holds the chunks still pinned or leaving HBM (they
/// change again unmarked when unpinned or gone).
#[allow(clippy::too_many_arguments)]
fn track_victims(
    st: &State,
    dev: u32,
    marks: &mut Vec<u64>,
    at: &mut Vec<Marked>,
    edits: &mut Vec<Edit>,
    ps: &mut Vec<u32>,
    p: &mut Vec<Cand>,
    gone: &mut Vec<u64>,
    new: &mut Vec<Cand>,
) -> bool {
    let o = &st.dev(dev).order;
    if o.marks_over || o.walked != st.structure {
        return false;
    }
    marks.sort_unstable();
    marks.dedup();
    at.clear();
    let mut memo = Resolver::default();
    for &key in marks.iter() {
        let Some((_, i, b)) = memo.resolve_in(st, key) else {
            return false;
        };
        if b.dev != dev || b.place.get() == u32::MAX {
            return false;
        }
        let c = &b.chunks[i as usize];
        let x = (!b.pinned && c.may_leave()).then_some(Cand {
            key,
            last: c.last,
            dirty: c.needs_copy_out(),
        });
        let busy = c.pins != 0 || c.out_ev != 0;
        at.push((b.place.get().wrapping_add(i), key, x, busy));
    }
    at.sort_unstable_by_key(|a| a.0);
    gone.clear();
    new.clear();
    edits.clear();
    let mut j = 0;
    for &(s, _, x, _) in at.iter() {
        j += ps[j..].partition_point(|&q| q < s);
        let was = (j < ps.len() && ps[j] == s).then(|| p[j]);
        match (was, x) {
            (Some(w), Some(x)) => {
                if w != x {
                    if w.key != x.key {
                        gone.push(w.key);
                    }
                    new.push(x);
                    p[j] = x;
                }
            }
            (Some(w), None) => {
                gone.push(w.key);
                edits.push((j, None));
            }
            (None, Some(x)) => {
                new.push(x);
                edits.push((j, Some((s, x))));
            }
            (None, None) => {}
        }
        j += was.is_some() as usize;
    }
    apply_edits(ps, p, edits);
    // still pinned or leaving HBM: read again at the next build
    marks.clear();
    marks.extend(at.iter().filter(|a| a.3).map(|a| a.1));
    true
}

/// A change to the last build's candidates at an index of theirs, in
/// index order: the entry there removed (`None`), or one put before it.
pub(super) type Edit = (usize, Option<(u32, Cand)>);

/// Applies `edits` to `(ps, p)` in place: only the runs between them whose
/// place shifts move, each once (those moving down first, lowest first,
/// then those moving up, highest first: neither overwrites one not yet
/// moved).
pub(super) fn apply_edits(ps: &mut Vec<u32>, p: &mut Vec<Cand>, edits: &[Edit]) {
    if edits.is_empty() {
        return;
    }
    let n = ps.len();
    let ins = edits.iter().filter(|e| e.1.is_some()).count();
    let m = n + ins - (edits.len() - ins);
    let hole = Cand {
        key: 0,
        last: 0,
        dirty: false,
    };
    if m > n {
        ps.resize(m, 0);
        p.resize(m, hole);
    }
    let mut mv = |a: usize, b: usize, d: isize| {
        if a < b && d != 0 {
            let to = (a as isize + d) as usize;
            ps.copy_within(a..b, to);
            p.copy_within(a..b, to);
        }
    };
    // the run before each edit shifts by the edits before it
    let (mut d, mut a) = (0isize, 0);
    for &(j, e) in edits {
        if d < 0 {
            mv(a, j, d);
        }
        (d, a) = if e.is_none() {
            (d - 1, j + 1)
        } else {
            (d + 1, j)
        };
    }
    if d < 0 {
        mv(a, n, d);
    }
    let mut b = n;
    for &(j, e) in edits.iter().rev() {
        let a = if e.is_none() { j + 1 } else { j };
        if d > 0 {
            mv(a, b, d);
        }
        d += if e.is_none() { 1 } else { -1 };
        b = j;
    }
    debug_assert_eq!(d, 0);
    for &(j, e) in edits {
        match e {
            None => d -= 1,
            Some((s, x)) => {
                let q = (j as isize + d) as usize;
                (ps[q], p[q]) = (s, x);
                d += 1;
            }
        }
    }
    ps.truncate(m);
    p.truncate(m);
}

/// A marked chunk as `track_victims` read it: its place, key, standing as
/// a candidate, and whether it is pinned or leaving HBM.
pub(super) type Marked = (u32, u64, Option<Cand>, bool);

/// Tests' check of `track_victims`: a walk of every chunk gives the same
/// candidates, and the same changes from the last build's.
#[cfg(debug_assertions)]
fn check_tracked(
    st: &State,
    dev: u32,
    prev: (&[u32], &[Cand]),
    seq: &[u32],
    cur: &[Cand],
    gone: &[u64],
    new: &[Cand],
) {
    let (mut ws, mut wc, mut wg, mut wn) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut d = Delta::new(prev, &mut ws, &mut wc, &mut wg, &mut wn);
    walk_victims(st, dev, &mut d, None);
    assert_eq!(
        (&ws[..], &wc[..]),
        (seq, cur),
        "tracked candidates of device {dev}"
    );
    let (mut g, mut n) = (gone.to_vec(), new.to_vec());
    g.sort_unstable();
    n.sort_unstable_by_key(|c| c.key);
    wg.sort_unstable();
    wn.sort_unstable_by_key(|c| c.key);
    assert_eq!((wg, wn), (g, n), "tracked changes of device {dev}");
}

/// The candidates a walk gives (in walk order, `walk_victims`) into
/// `(cs, c)`, and what changed from the previous ones `(ps, p)`, as they
/// come: keys no longer there (`gone`) and candidates new or changed
/// (`new`; their key may be in `gone` too: gone first, then new). Where
/// backings came or went the places shift: more is reported as changed,
/// never less.
struct Delta<'a> {
    ps: &'a [u32],
    p: &'a [Cand],
    i: usize,
    cs: &'a mut Vec<u32>,
    c: &'a mut Vec<Cand>,
    gone: &'a mut Vec<u64>,
    new: &'a mut Vec<Cand>,
}

impl<'a> Delta<'a> {
    fn new(
        (ps, p): (&'a [u32], &'a [Cand]),
        cs: &'a mut Vec<u32>,
        c: &'a mut Vec<Cand>,
        gone: &'a mut Vec<u64>,
        new: &'a mut Vec<Cand>,
    ) -> Delta<'a> {
        cs.clear();
        c.clear();
        gone.clear();
        new.clear();
        Delta {
            ps,
            p,
            i: 0,
            cs,
            c,
            gone,
            new,
        }
    }

    /// The next candidate `x` of the walk, at place `s`.
    #[inline]
    fn push(&mut self, s: u32, x: Cand) {
        let (ps, p) = (self.ps, self.p);
        let mut i = self.i;
        while i < ps.len() && ps[i] < s {
            self.gone.push(p[i].key);
            i += 1;
        }
        if i < ps.len() && ps[i] == s {
            if p[i] != x {
                if p[i].key != x.key {
                    self.gone.push(p[i].key);
                }
                self.new.push(x);
            }
            i += 1;
        } else {
            self.new.push(x);
        }
        self.i = i;
        self.cs.push(s);
        self.c.push(x);
    }

    fn finish(&mut self) {
        let rest = &self.p[self.i.min(self.p.len())..];
        self.gone.extend(rest.iter().map(|x| x.key));
        self.i = self.p.len();
    }
}

#[cfg(test)]
mod delta_tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Applying a `Delta`'s report (gone first, then new) to the
    /// previous candidates gives the current ones, whether chunks changed
    /// in place or backings came and went (places shifted, keys moved);
    /// with nothing changed it reports nothing.
    #[test]
    fn the_delta_takes_the_previous_candidates_to_the_current() {
        let mut rnd = crate::test_rng(0x853c_49e6_748f_ea9bu64);
        let (mut gone, mut new) = (Vec::new(), Vec::new());
        // per chunk key: (a candidate, last, dirty)
        let mut props: BTreeMap<u64, (bool, u64, bool)> = BTreeMap::new();
        let mut walk: Vec<(u64, u32)> = (0..8).map(|b| (b * 100, 1 + rnd(8) as u32)).collect();
        let snap = |walk: &[(u64, u32)], props: &mut BTreeMap<u64, (bool, u64, bool)>| {
            let (mut s, mut c) = (Vec::new(), Vec::new());
            let mut at = 0u32;
            for &(base, n) in walk {
                for i in 0..n {
                    let key = base + i as u64;
                    let &mut (cand, last, dirty) = props.entry(key).or_insert((true, 0, false));
                    if cand {
                        s.push(at + i);
                        c.push(Cand { key, last, dirty });
                    }
                }
                at += n;
            }
            (s, c)
        };
        let (mut changed, mut quiet) = (0usize, 0usize);
        let (mut ps, mut p) = snap(&walk, &mut props);
        for round in 0..3000u64 {
            match round % 4 {
                // a backing comes or goes: the later ones shift
                0 if walk.len() > 1 && rnd(2) == 0 => {
                    walk.remove(rnd(walk.len() as u64) as usize);
                }
                0 => {
                    let at = rnd(walk.len() as u64 + 1) as usize;
                    walk.insert(at, (10_000 + round * 10, 1 + rnd(8) as u32));
                }
                // chunks change: candidacy, last, dirty
                1 | 2 => {
                    for v in props.values_mut() {
                        match rnd(12) {
                            0 => v.0 = !v.0,
                            1 => v.1 += 1,
                            2 => v.2 = !v.2,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
            let (want_s, want_c) = snap(&walk, &mut props);
            let (mut cs, mut c) = (vec![7], vec![]);
            let mut d = Delta::new((&ps, &p), &mut cs, &mut c, &mut gone, &mut new);
            for (&s, &x) in want_s.iter().zip(&want_c) {
                d.push(s, x);
            }
            d.finish();
            assert_eq!(
                (&cs, &c),
                (&want_s, &want_c),
                "round {round}: the candidates"
            );
            if round % 4 == 3 {
                assert!(
                    gone.is_empty() && new.is_empty(),
                    "round {round}: nothing changed"
                );
                quiet += 1;
            } else {
                changed += (gone.len() + new.len() > 0) as usize;
            }
            let mut m: BTreeMap<u64, Cand> = p.iter().map(|c| (c.key, *c)).collect();
            for k in &gone {
                m.remove(k);
            }
            for c in &new {
                m.insert(c.key, *c);
            }
            let want: BTreeMap<u64, Cand> = c.iter().map(|c| (c.key, *c)).collect();
            assert_eq!(m, want, "round {round}");
            (ps, p) = (cs, c);
        }
        assert!(changed > 1500 && quiet == 750, "{changed} {quiet}");
    }
}

#[cfg(test)]
mod protect_tests {
    use super::{EventFilter, Protect};

    /// The event filter never calls an added event absent, and calls most
    /// others absent (pointer-like handles, 64 B apart, as 32 pending ones
    /// against the rest).
    #[test]
    fn the_event_filter_keeps_every_event_added() {
        let mut rnd = crate::test_rng(0x853c_49e6_748f_ea9b);
        let mut absent = 0;
        for _ in 0..200 {
            let mut f = EventFilter::default();
            let evs: Vec<u64> = (0..32)
                .map(|_| 0x5555_0000_0000 + rnd(1 << 20) * 64)
                .collect();
            evs.iter().for_each(|&e| f.add(e));
            assert!(evs.iter().all(|&e| f.has(e)));
            absent += (0..100)
                .filter(|_| !f.has(0x5555_0000_0000 + rnd(1 << 20) * 64))
                .count();
        }
        assert!(
            absent > 200 * 100 * 3 / 4,
            "{absent} of 20000 called absent"
        );
    }

    /// `Protect` answers as a scan of its list: sorted lists of every
    /// length (the binary search from 9 on), unsorted and duplicated ones
    /// (the scan), members and non-members on both sides of each.
    #[test]
    fn protect_answers_as_a_scan() {
        let mut rnd = crate::test_rng(0x2545_f491_4f6c_dd1d);
        for n in 0..300usize {
            // few backings or many (past `RUNS`), runs dense or sparse,
            // sorted with or without repeats, or unsorted
            let ids = [2, 6, 12][n % 3];
            let span = [8, 40][n / 3 % 2];
            let mut list: Vec<(u64, u32)> = (0..n).map(|_| (rnd(ids), rnd(span) as u32)).collect();
            let sorted = rnd(3) != 0;
            if sorted {
                list.sort_unstable();
                if rnd(2) == 0 {
                    list.dedup();
                }
            }
            let p = Protect::new(&list);
            assert_eq!(p.sorted, list.len() > 8 && list.is_sorted());
            for _ in 0..200 {
                let q = (rnd(ids + 1), rnd(span + 2) as u32);
                assert_eq!(p.contains(&q), list.contains(&q), "{q:?} in {list:?}");
            }
            for q in &list {
                assert!(p.contains(q));
            }
        }
    }
}
