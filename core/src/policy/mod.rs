//! Placement policies: which resident chunk leaves HBM first, which chunk
//! should come back before it is needed, and — for evaluation — which chunks
//! the policy expects to be touched soon. One interface, two drivers: the
//! tiering engine inside libu3m.so and `u3m replay` call the same objects.
//!
//! Time is logical: `now` is the engine's access counter (one tick per
//! tracked call: operator, copy, memset, collective, graph replay), so the
//! same trace gives the same decisions in both drivers. Keys are chunk keys
//! (`chunk_key`): the device VA of the chunk's first mapping, or a synthetic
//! key for a chunk of a VMM handle that is mapped nowhere.
//!
//! The engine calls a policy with its residency lock held: implementations
//! keep their own state behind an uncontended lock and must never call back
//! into the engine. The library's policies come wrapped in [`Buffered`]
//! (`pending.rs`): accesses are buffered per thread and applied, in clock
//! order, before any decision reads the policy.

mod belady;
mod lru;
mod markov;
mod mode;
pub(crate) mod pending;
mod predictive;
pub(crate) mod predictor;
mod seed_heat;

pub use belady::Belady;
pub use lru::Lru;
pub use markov::Markov;
pub use mode::{Mode as WorkMode, ModeEvent};
pub use pending::Buffered;
pub use predictive::Predictive;
pub use seed_heat::SeedHeat;

/// Heat of the chunk at a device VA (from the engine's heat table).
pub type HeatFn = Box<dyn Fn(u64) -> f64 + Send + Sync>;

/// A resident chunk the engine could evict.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cand {
    pub key: u64,
    /// Logical time of its latest use.
    pub last: u64,
    /// Written since its host copy was made (evicting it costs a copy-out).
    pub dirty: bool,
}

/// Where a policy would like a chunk to live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Hbm,
    Dram,
    Nvme,
}

/// How a call touches a chunk ([`Placement::on_access`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Touch(u8);

impl Touch {
    /// Read only.
    pub const READ: Touch = Touch(0);
    /// Written (its host copy goes stale); maybe read too.
    pub const WRITE: Touch = Touch(1);
    /// Every byte written, none read: the call needs nothing of the
    /// chunk's old contents (the engine skips its copy-in), so a chunk
    /// whose next touch is this one costs no copy-in to evict.
    pub const WHOLE: Touch = Touch(3);

    #[inline]
    pub const fn new(write: bool, whole: bool) -> Touch {
        Touch(write as u8 | (((write & whole) as u8) << 1))
    }

    #[inline]
    pub const fn writes(self) -> bool {
        self.0 & 1 != 0
    }

    #[inline]
    pub const fn whole(self) -> bool {
        self.0 & 2 != 0
    }
}

/// A batch of calls for [`Placement::on_access_batch`]: the `i`th is
/// (now, class, keys, touches), as `on_access` takes them.
pub trait Accesses {
    fn len(&self) -> usize;
    fn get(&self, i: usize) -> (u64, u8, &[u64], &[Touch]);
}

pub trait Placement: Send + Sync {
    /// The name U3M_POLICY and `u3m replay --policy` use.
    fn name(&self) -> &'static str;

    /// A call of operator class `class` (OpClass as u8) touched `keys` at
    /// logical time `now`; `touch[k]` says how it touched `keys[k]`.
    fn on_access(&self, now: u64, class: u8, keys: &[u64], writes: &[Touch]);

    /// [`on_access`](Self::on_access) by a thread that looked up its
    /// `LAST` already (`here`: perthread.rs, this thread's; None: not looked
    /// up): [`Buffered`] finds its buffer through it with no thread-local
    /// look-up of its own. The same call as `on_access` (the default).
    fn on_access_here(
        &self,
        _here: Option<crate::perthread::Here>,
        now: u64,
        class: u8,
        keys: &[u64],
        writes: &[Touch],
    ) {
        self.on_access(now, class, keys, writes)
    }

    /// Calls `on_access` would get one by one, in this order (the
    /// per-thread buffers of [`Buffered`] hand them over so): a policy
    /// with a lock may take it once for all of them. The result must be
    /// exactly that of the calls one by one (the default).
    fn on_access_batch(&self, calls: &dyn Accesses) {
        for i in 0..calls.len() {
            let (now, class, keys, writes) = calls.get(i);
            self.on_access(now, class, keys, writes);
        }
    }

    /// The chunk's memory was freed (its key may be reused).
    fn on_free(&self, _key: u64) {}

    /// Orders eviction candidates in place: the first leaves HBM first.
    fn order(&self, now: u64, cands: &mut [Cand]);

    /// For how many logical ticks an order from `order` stays good enough
    /// to take victims from (the residency manager keeps one order per
    /// device and rebuilds it after this many calls). An exact policy whose
    /// order changes with every tick (Belady on the future) says 0: its
    /// order is rebuilt for every eviction.
    fn order_ttl(&self) -> u64 {
        4
    }

    /// Whether the policy expects `key` to be accessed within the next `w`
    /// logical ticks after `now` (prefetch; precision and recall).
    fn predicts(&self, now: u64, key: u64, w: u64) -> bool;

    /// The predicted logical tick of `key`'s next access after `now` (None:
    /// the policy does not know). The look-ahead prefetch compares these
    /// (Belady's rule on predictions): it evicts for a chunk only a victim
    /// predicted later. Policies without a model of *when* say None.
    fn next_use(&self, _now: u64, _key: u64) -> Option<u64> {
        None
    }

    /// An outside schedule has `key` out of HBM from its latest use on
    /// (that use the last before a gap): `Residency::evict_planned` evicts
    /// it once the use is complete (residency/planned.rs; `u3m replay
    /// --policy plan`).
    fn plan_out(&self, _key: u64) -> bool {
        false
    }

    /// Appends to `out` the chunks predicted to be accessed in the ticks
    /// (`now`, `now + d`], as (predicted tick, key), in any order. Cost:
    /// O(log n + chunks due), never a scan of every chunk. Policies without
    /// a model of *when* append nothing (the look-ahead then does nothing).
    /// A policy may leave out chunks predicted within a few ticks of their
    /// latest access (resident then; the look-ahead asks `next_use` of every
    /// chunk that leaves HBM inside its window).
    fn upcoming(&self, _now: u64, _d: u64, _out: &mut Vec<(u64, u64)>) {}

    /// Where the policy would place `key` now (None: no opinion, the engine
    /// decides by pressure). Drives the background prefetch and the choice
    /// between DRAM and NVMe for an evicted chunk.
    fn place(&self, _now: u64, _key: u64) -> Option<Place> {
        None
    }

    /// Periodic work with wall-clock seconds since the engine started
    /// (recalibration); `resident_fraction` = managed HBM bytes in use /
    /// managed HBM bytes available, for policies that steer by it.
    fn tick(&self, _secs: f64, _resident_fraction: f64) {}

    /// Takes the policy's events since the last call (calibration changes,
    /// mode switches), one line of text each; the engine writes them to the
    /// stats ring, `u3m replay` prints them with --events.
    fn drain_events(&self, _out: &mut Vec<String>) {}

    /// Where eviction can ask the heat of a chunk (set once the engine's
    /// heat table is in place); policies that do not use heat ignore it.
    fn set_heat_fn(&self, _f: HeatFn) {}

    /// The device-to-host direction of the link has lately carried less of
    /// u3m's copies than the host-to-device one (the engine says so before
    /// it orders victims). A copy-out then costs less than the copy-in a
    /// clean victim's return takes, so a dirty chunk whose next use writes
    /// it whole (its copy-out is all evicting it costs) may go before the
    /// clean chunks that would come back.
    fn set_out_slack(&self, _slack: bool) {}

    /// `order` for a caller that takes victims from the front only: leaves
    /// in `cands` the first `min(k, len)` candidates of `order`'s result,
    /// exactly as `order` places them (a policy may leave more, or all:
    /// the default sorts everything). The engine's kept victim order takes
    /// a few dozen victims from each build, so a policy with a total order
    /// can select the first `k` in O(n) instead of sorting every resident
    /// chunk (`Predictive` does).
    fn order_top(&self, now: u64, cands: &mut Vec<Cand>, _k: usize) {
        self.order(now, cands)
    }

    /// `order_top` with the sorting left to the taker: the candidates
    /// `order_top(k)` would leave go to `cands` (the first few, in order)
    /// and `tail` (the rest, each ranking after all of those, unordered,
    /// with its weight under [`rank_cmp`]); [`RankTail::take_next`] gives
    /// the rest in order as the taker reaches it. The kept victim order
    /// takes a few victims per build (RAG: one), where sorting all of up
    /// to `k` candidates cost more than a chunk's copy. false: the policy
    /// ranks by no such weight; nothing was done (use `order_top`).
    fn order_ranked(
        &self,
        _now: u64,
        _cands: &mut Vec<Cand>,
        _k: usize,
        _tail: &mut RankTail,
    ) -> bool {
        false
    }

    /// `order_ranked` over every candidate of one device, from an order
    /// the policy maintains instead of weighing every candidate: `all` is
    /// every candidate now; `gone` (keys) and `new` (added or changed
    /// `last` or `dirty`) what changed since the build `kept.epoch - 1` of
    /// the same order (`kept.owner`, `kept.dev`). A policy that did not see
    /// that build orders `all`. Gives what `order_ranked(now, all, k)`
    /// gives: the first segment in `cands`, the rest from `tail` (a
    /// [`KeptCursor`] read back through [`Placement::order_kept_next`]).
    /// false: not maintained here (use `order_ranked`).
    #[allow(clippy::too_many_arguments)]
    fn order_kept(
        &self,
        _kept: KeptId,
        _now: u64,
        _all: &[Cand],
        _gone: &[u64],
        _new: &[Cand],
        _k: usize,
        _cands: &mut Vec<Cand>,
        _tail: &mut RankTail,
    ) -> bool {
        false
    }

    /// The next at least `n` candidates (or the rest) of the order
    /// `order_kept` started in `cur`, appended to `out` in order. Valid
    /// until the next `order_kept` of the same order.
    fn order_kept_next(&self, _cur: &mut KeptCursor, _n: usize, _out: &mut Vec<Cand>) {}

    /// In a forked child (the engine's `continue_in_child`): the parent's
    /// other threads do not exist here and may have held locks of the
    /// policy's; a policy that buffers per thread ([`Buffered`]) stops
    /// buffering and never waits for them.
    fn after_fork_child(&self) {}

    /// After a call, on the calling thread, with none of the engine's
    /// locks held (engine `resident`): deferred work of the call's
    /// thread ([`Buffered`] applies its buffers when they are due). Cheap
    /// when there is nothing to do: it runs on every call.
    fn after_call(&self) {}

    /// The flag `after_call` reads first when it has nothing to do while
    /// the flag is clear ([`Buffered`]'s due flag): the caller may then
    /// skip the call, a dynamic call on every call's path (same result).
    /// None: `after_call` is called after every call.
    fn after_call_flag(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicBool>> {
        None
    }

    /// This policy as the per-thread buffering wrapper ([`Buffered`]),
    /// when it is one: the residency then calls its `on_access_here`
    /// directly (inlined on every call's path), not through the vtable.
    fn as_buffered(&self) -> Option<&pending::Buffered> {
        None
    }

    /// The engine's applier thread (engine/applier.rs), woken with
    /// `unpark` when deferred work is due ([`Buffered`]: its buffers);
    /// the work is then done by [`Placement::apply_deferred`] on that
    /// thread, not by the calls.
    fn set_applier(&self, _t: std::thread::Thread) {}

    /// The applier thread stopped (it panicked): the calls do their
    /// deferred work themselves again.
    fn set_applier_gone(&self) {}

    /// On the applier thread, woken: the deferred work that is due.
    fn apply_deferred(&self) {}
}

/// The policies U3M_POLICY accepts for the library (belady needs the future
/// and exists only in `u3m replay`).
pub const LIBRARY_POLICIES: &[&str] = &["seed-heat", "lru", "predictive"];

/// A policy by name, for the library's U3M_POLICY (with default
/// parameters; belady needs its log: [`Belady::new`]).
pub fn by_name(name: &str) -> Option<Box<dyn Placement>> {
    match name {
        "lru" => Some(Box::new(Lru::new())),
        "seed-heat" => Some(Box::new(SeedHeat::new())),
        "predictive" => Some(Box::new(Predictive::new())),
        "markov" => Some(Box::new(Markov::new())),
        _ => None,
    }
}

/// The policy U3M_POLICY names, with the configuration's parameters (the
/// watermarks for seed-heat; U3M_CALIB_S and U3M_WARMUP_S for predictive).
///
/// A policy that learns from accesses comes wrapped in [`Buffered`]: the
/// operator hot path appends to a per-thread buffer instead of taking the
/// policy's mutex; every decision applies what is buffered first, so the
/// decisions are those of the unwrapped policy. Seed-heat ignores
/// accesses and is not wrapped.
pub fn by_config(cfg: &crate::config::Config) -> Option<Box<dyn Placement>> {
    let p: Box<dyn Placement> = match cfg.policy.as_str() {
        "seed-heat" => {
            return Some(Box::new(SeedHeat::with(
                cfg.hbm_low,
                cfg.hbm_high,
                seed_heat::RECAL_S,
            )))
        }
        "predictive" => Box::new(Predictive::with_params(cfg.calib_s, cfg.warmup_s)),
        other => by_name(other)?,
    };
    Some(Box::new(Buffered::new(p)))
}

/// Least recently used first (ties: the lower key).
/// The order of weighted candidates a ranking policy leaves HBM in
/// (`Predictive::order_top`, [`RankTail`]): furthest (cost-weighted)
/// first; among equals a clean chunk, then LRU, then the key — a total
/// order, so the first k of a selection are the first k of the sort.
pub fn rank_cmp(a: &(u64, Cand), b: &(u64, Cand)) -> std::cmp::Ordering {
    b.0.cmp(&a.0)
        .then(a.1.dirty.cmp(&b.1.dirty))
        .then(a.1.last.cmp(&b.1.last))
        .then(a.1.key.cmp(&b.1.key))
}

/// The first segment [`RankTail::take_next`] sorts; each next one is twice
/// the last, so taking all of `n` costs about two sorts of `n`.
pub(crate) const FIRST_SEG: usize = 32;

/// Names one maintained order ([`Placement::order_kept`]): the engine's
/// kept order `owner` (unique per process) for device `dev`, at its
/// `epoch`-th build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeptId {
    pub owner: u64,
    pub dev: u32,
    pub epoch: u64,
}

impl KeptId {
    /// A fresh owner for a new kept order.
    pub fn new_owner() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Where the reading of a maintained order stands
/// ([`Placement::order_kept_next`]): the policy's own positions, the
/// build's clock, and how many candidates are still to come.
#[derive(Clone, Copy, Debug)]
pub struct KeptCursor {
    pub id: KeptId,
    pub now: u64,
    pub typical: f64,
    /// Candidates not yet given out (at most the build's `k`).
    pub left: usize,
    /// Per stream of the policy: the last position given out (0: none).
    pub pos: [(u64, u64); 8],
    pub started: u8,
    /// The build's `Placement::set_out_slack`, for the whole order.
    pub out_slack: bool,
}

/// The unsorted rest of a ranked order ([`Placement::order_ranked`]):
/// candidates with their weights, each ranking after every one already
/// given out, sorted a segment at a time when reached. Since [`rank_cmp`]
/// is total, the segments given out in turn are exactly the sorted order.
/// Or the rest of a maintained order ([`Placement::order_kept`]), read
/// from the policy a segment at a time.
pub struct RankTail {
    v: Vec<(u64, Cand)>,
    seg: usize,
    kept: Option<KeptCursor>,
}

impl RankTail {
    pub const fn new() -> RankTail {
        RankTail {
            v: Vec::new(),
            seg: FIRST_SEG,
            kept: None,
        }
    }

    /// Starts over as the rest of a maintained order read through `cur`.
    pub fn start_kept(&mut self, cur: KeptCursor) {
        self.v.clear();
        self.seg = FIRST_SEG;
        self.kept = Some(cur);
    }

    /// Appends the next segment, in order, to `out`, from the policy `p`
    /// for a maintained order (`take_next` otherwise).
    pub fn take_next_from(&mut self, p: &dyn Placement, out: &mut Vec<Cand>) {
        let seg = self.seg;
        match &mut self.kept {
            Some(cur) => {
                let (before, left) = (out.len(), cur.left);
                p.order_kept_next(cur, seg, out);
                self.seg = seg.saturating_mul(2);
                if out.len() == before && cur.left == left {
                    // the policy gave nothing: no more to come
                    cur.left = 0;
                }
            }
            None => self.take_next(out),
        }
    }

    /// `drain_into` for either kind of rest (`p`: the policy of a
    /// maintained order).
    pub fn drain_into_from(&mut self, p: &dyn Placement, out: &mut Vec<Cand>) {
        match &mut self.kept {
            Some(cur) => {
                if cur.left > 0 {
                    p.order_kept_next(cur, usize::MAX, out);
                }
                self.kept = None;
            }
            None => self.drain_into(out),
        }
    }

    /// Starts over from `v` (weighted candidates, any order), keeping its
    /// first `k` under [`rank_cmp`]; the first segment goes to `out`
    /// (cleared).
    pub fn start(&mut self, k: usize, out: &mut Vec<Cand>) {
        self.kept = None;
        if k < self.v.len() {
            self.v.select_nth_unstable_by(k, rank_cmp);
            self.v.truncate(k);
        }
        self.seg = FIRST_SEG;
        out.clear();
        self.take_next(out);
    }

    /// Where `start` takes its candidates from: cleared, to be filled.
    pub fn fill(&mut self) -> &mut Vec<(u64, Cand)> {
        self.kept = None;
        self.v.clear();
        &mut self.v
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        match &self.kept {
            Some(cur) => cur.left,
            None => self.v.len(),
        }
    }

    /// Appends the next best segment, in order, to `out`.
    pub fn take_next(&mut self, out: &mut Vec<Cand>) {
        let n = self.seg.min(self.v.len());
        if n < self.v.len() {
            self.v.select_nth_unstable_by(n, rank_cmp);
        }
        self.v[..n].sort_unstable_by(rank_cmp);
        out.extend(self.v.drain(..n).map(|(_, c)| c));
        self.seg = n.saturating_mul(2).max(FIRST_SEG);
    }

    /// Moves every candidate left to `out`, unordered (to be ordered again).
    pub fn drain_into(&mut self, out: &mut Vec<Cand>) {
        out.extend(self.v.drain(..).map(|(_, c)| c));
    }
}

impl Default for RankTail {
    fn default() -> RankTail {
        RankTail::new()
    }
}

pub(crate) fn lru_order(cands: &mut [Cand]) {
    cands.sort_unstable_by(|a, b| a.last.cmp(&b.last).then(a.key.cmp(&b.key)));
}

#[cfg(test)]
mod rank_tests {
    use super::*;

    /// Segments given out in turn are the sort, for every k and with many
    /// ties (equal weights, equal `last`, dirty and clean).
    #[test]
    fn a_rank_tail_gives_the_sorted_order_a_segment_at_a_time() {
        let mut rnd = crate::test_rng(0x9e37_79b9_7f4a_7c15u64);
        for n in [0usize, 1, 31, 32, 33, 100, 1000] {
            let v: Vec<(u64, Cand)> = (0..n)
                .map(|i| {
                    let c = Cand {
                        key: i as u64,
                        last: rnd(20),
                        dirty: rnd(2) == 0,
                    };
                    (rnd(8), c)
                })
                .collect();
            let mut sorted = v.clone();
            sorted.sort_unstable_by(rank_cmp);
            for k in [1usize, 5, 32, 64, 500, 2000] {
                let mut t = RankTail::new();
                t.fill().extend_from_slice(&v);
                let mut out = vec![Cand {
                    key: 99,
                    last: 0,
                    dirty: false,
                }];
                t.start(k, &mut out);
                assert!(out.len() <= 32, "n {n} k {k}: the first segment only");
                while !t.is_empty() {
                    t.take_next(&mut out);
                }
                let want: Vec<Cand> = sorted.iter().take(k).map(|e| e.1).collect();
                assert_eq!(out, want, "n {n} k {k}");
            }
        }
    }
}
