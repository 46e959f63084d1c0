//! The seed's predictive placement (docs/prediction.md): per-chunk access
//! models ([`ChunkModel`]) governed by one EMA parameter set per operator
//! class (smoothing, LRU fallback, hit-rate counters), online calibration
//! every `calib_s` seconds, and train ↔ infer mode switches that clear what
//! was learned. Evicts the chunk predicted to be needed furthest in the
//! future; `place` asks for the chunks predicted within the prefetch horizon.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use super::mode::{Mode as WorkMode, ModeDetector, ModeEvent};
use super::predictor::{ChunkModel, Form, FormKind, KeyHash, KeyMap};
use super::{Cand, Place, Placement, Touch};
use crate::opclass::OpClass;
use std::hash::{BuildHasher, Hasher};

const CLASSES: usize = OpClass::COUNT;
/// The seed's smoothing (weight of the old value) and its lowered value.
pub const SMOOTH_HIGH: f32 = 0.9;
pub const SMOOTH_LOW: f32 = 0.7;
/// Hit rate a class must keep.
pub const HIT_TARGET: f64 = 0.85;
/// Predictions a class needs in a period before it is judged.
const MIN_PREDICTIONS: u32 = 20;
/// Default prefetch horizon, ticks: `place` says Hbm for chunks predicted
/// within it (the engine bounds the bytes by the link's bandwidth).
pub const PREFETCH_TICKS: u64 = 32;
const MAX_EVENTS: usize = 1024;
/// Predictions this close to the access are not filed in the calendar.
const NEAR: u64 = 8;
/// Call signatures remembered for the period (the table starts over when
/// full: 64 Ki entries, ~1.5 MB).
const MAX_SIGS: usize = 1 << 16;
/// Models of freed chunks kept for their key's next allocation.
const MAX_FREED: usize = 1 << 16;
/// Distinct distances between repeated calls kept at a time.
const MAX_PERIODS: usize = 4096;
/// Confirmations of the heaviest period after which every weight halves.
const AGE_AFTER: u64 = 4096;
/// Chunks whose eviction weights the kept victim order may recompute per
/// call (`order_ttl`).
const ORDER_BUDGET: u64 = 1024;

#[derive(Clone, Copy)]
struct ClassCal {
    smoothing: f32,
    fallback: bool,
    predicted: u32,
    hits: u32,
}

impl ClassCal {
    const FRESH: ClassCal = ClassCal {
        smoothing: SMOOTH_HIGH,
        fallback: false,
        predicted: 0,
        hits: 0,
    };
}

struct Inner {
    chunks: KeyMap<ChunkModel>,
    cls: [ClassCal; CLASSES],
    mode: ModeDetector,
    calib_s: f64,
    warmup_s: f64,
    /// Latest seconds `tick` reported.
    secs: f64,
    next_calib: f64,
    warm_until: f64,
    prefetch: u64,
    /// EMA of the chunks' cycle lengths: the prior for a chunk seen once.
    typical: f64,
    /// The most frequent verified cycle (Misra-Gries summary of 8): the
    /// workload's step, for chunks too busy or too irregular for a cycle of
    /// their own.
    steps: [(u64, u64); 8],
    /// The workload's period as the calls show it: each call's signature
    /// (class and chunks) with the tick it was last seen, and the distances
    /// between repeats, each counted with weight = the distance (time
    /// covered), exactly (a map of at most `MAX_PERIODS` distances) with
    /// the heaviest kept in `period`. A training step repeats every call
    /// of the step before it, so this knows the step a few calls into the
    /// second step — the chunks' own verified cycles need two more steps.
    sigs: KeyMap<u64>,
    /// Models of freed chunks, by key: memory freed and allocated again at
    /// the same address (a training step's activations) continues its model
    /// instead of starting cold (at most `MAX_FREED`; the table starts over
    /// when full).
    freed: KeyMap<ChunkModel>,
    periods: KeyMap<u64>,
    period: (u64, u64),
    /// What was learned in the mode that is not running (by mode_index).
    stash: [Option<Box<Learned>>; 2],
    events: Vec<String>,
    /// The calendar: (predicted next access, key) of every chunk with a
    /// model that predicts one, as of its latest access (`upcoming`). A
    /// chunk's entry is replaced at each access; entries whose tick passed
    /// are dropped as the clock moves.
    cal: BTreeSet<(u64, u64)>,
    /// The maintained victim orders (`Placement::order_kept`), one per
    /// engine order and device.
    kept: Vec<Kept>,
    /// The latest `Placement::set_out_slack`.
    out_slack: bool,
    /// Chunks freed so far (`on_free`): a maintained order reads every
    /// candidate again after one (its model left for `freed`).
    frees: u64,
}

/// What the policy learned in one mode (train, infer), kept while the other
/// runs.
struct Learned {
    chunks: KeyMap<ChunkModel>,
    freed: KeyMap<ChunkModel>,
    steps: [(u64, u64); 8],
    sigs: KeyMap<u64>,
    periods: KeyMap<u64>,
    period: (u64, u64),
    typical: f64,
    /// The tick the mode ended.
    at: u64,
}

fn mode_index(m: WorkMode) -> usize {
    match m {
        WorkMode::Train => 0,
        WorkMode::Infer => 1,
    }
}

pub struct Predictive {
    inner: Mutex<Inner>,
    /// Chunks modelled (`Inner::chunks.len()` after the latest call), for
    /// `order_ttl` without the lock.
    modelled: AtomicUsize,
    /// `upcoming` was asked: the engine's look-ahead is on (`order_ttl`).
    ahead: AtomicBool,
}

impl Default for Predictive {
    fn default() -> Self {
        Self::new()
    }
}

/// What the policy expects of one chunk.
enum Expect {
    /// Predicted next access (a late one counts as the next tick).
    At(u64),
    /// Predicted next access, a whole write ([`Touch::WHOLE`]): it needs
    /// nothing of the chunk's contents, so evicting the chunk costs no
    /// copy-in (a clean one costs nothing at all).
    Whole(u64),
    /// A model that failed or is switched off: recency stands in
    /// (accessed at `last`).
    Recency(u64),
    /// Seen once (accessed at `last`): no interval yet.
    Unknown(u64),
}

/// Misra-Gries over time: count `v` (a chunk's verified cycle, just
/// confirmed) with weight `v`, so each chunk weighs by the time its cycle
/// covers, not by how often it is touched — a chunk touched at every call
/// (cycle 1) would otherwise outvote every weight chunk touched once per
/// step (on the synth adam trace the "step" stayed 1 for 3/4 of the run).
fn note_step(steps: &mut [(u64, u64); 8], v: u64) {
    let w = v.max(1);
    if let Some(e) = steps.iter_mut().find(|e| e.1 > 0 && e.0 == v) {
        e.1 = e.1.saturating_add(w);
        return;
    }
    if let Some(e) = steps.iter_mut().find(|e| e.1 == 0) {
        *e = (v, w);
        return;
    }
    let d = steps.iter().map(|e| e.1).min().unwrap_or(0).min(w);
    for e in steps.iter_mut() {
        e.1 -= d;
    }
    if w > d {
        if let Some(e) = steps.iter_mut().find(|e| e.1 == 0) {
            *e = (v, w - d);
        }
    }
}

impl Inner {
    fn warming(&self) -> bool {
        self.secs < self.warm_until
    }

    /// The workload's step: the dominant period of repeated calls, else
    /// the dominant verified cycle (0: none yet); either needs eight
    /// confirmations' worth of time.
    fn step(&self) -> u64 {
        step_of(self.period, &self.steps)
    }

    /// Notes the call (class, keys) at `now` among the repeated calls.
    fn note_call(&mut self, now: u64, class: u8, keys: &[u64]) {
        if keys.is_empty() {
            return;
        }
        let mut h = KeyHash.build_hasher();
        h.write_u64(class as u64 + 1);
        for &k in keys {
            let x = h.finish();
            h = KeyHash.build_hasher();
            h.write_u64(x ^ k);
        }
        let sig = h.finish();
        if self.sigs.len() >= MAX_SIGS {
            self.sigs.clear();
        }
        let Some(prev) = self.sigs.insert(sig, now).filter(|&p| p < now) else {
            return;
        };
        let d = now - prev;
        if self.periods.len() >= MAX_PERIODS && !self.periods.contains_key(&d) {
            // too many distinct distances: start over from the heaviest
            self.periods.clear();
            self.period.1 /= 2;
            self.periods.insert(self.period.0, self.period.1);
        }
        let w = self.periods.entry(d).or_insert(0);
        *w = w.saturating_add(d);
        let w = *w;
        if w > self.period.1 || d == self.period.0 {
            self.period = (d, w);
        }
        if self.period.1 >= AGE_AFTER.saturating_mul(self.period.0.max(1)) {
            // age: a new period (the step changed length) can take over
            // within about as many calls as it has
            for v in self.periods.values_mut() {
                *v /= 2;
            }
            self.period.1 /= 2;
        }
    }

    /// Takes back what was learned in a mode that ran until `l.at`, as if
    /// that mode had gone on without a pause: every tick it holds moves by
    /// `now - l.at` (the ring's intervals are relative and stay).
    fn resume(&mut self, l: Learned, now: u64) {
        let shift = now.saturating_sub(l.at);
        self.chunks = l.chunks;
        for c in self.chunks.values_mut() {
            c.last = c.last.saturating_add(shift);
            if c.next != 0 {
                c.next = c.next.saturating_add(shift);
            }
            c.sched = 0;
            c.form = Form::NONE;
        }
        self.freed = l.freed;
        for c in self.freed.values_mut() {
            c.last = c.last.saturating_add(shift);
            if c.next != 0 {
                c.next = c.next.saturating_add(shift);
            }
            c.form = Form::NONE;
        }
        self.sigs = l.sigs;
        for t in self.sigs.values_mut() {
            *t = t.saturating_add(shift);
        }
        self.steps = l.steps;
        self.periods = l.periods;
        self.period = l.period;
        self.typical = l.typical;
    }

    fn push(&mut self, e: String) {
        if self.events.len() < MAX_EVENTS {
            self.events.push(e);
        }
    }

    /// `w`: the window `predicts` asks about (None: for eviction order).
    fn expect(&self, now: u64, key: u64, last_hint: u64, w: Option<u64>) -> Expect {
        let Some(c) = self.chunks.get(&key) else {
            return Expect::Unknown(last_hint);
        };
        let last = c.last.max(last_hint);
        if c.n < 2 {
            return Expect::Unknown(last);
        }
        if self.cls[c.class as usize].fallback {
            return Expect::Recency(last);
        }
        // a chunk without a cycle of its own as long as half the step (busy
        // chunks whose ring shows only a burst, irregular ones) repeats what
        // it did one step ago
        let step = self.step();
        if step > 0 && c.strict_cycle().is_none_or(|cy| cy < step / 2) {
            match c.shift_span_of(now, step) {
                // idle for a whole step: no access expected within the next
                // step — which says nothing about a longer window, and
                // eviction still wants the model's estimate of how far
                (Some(u64::MAX), ..) if w.is_none_or(|w| w >= step) => {}
                (Some(x), _, true) if x != u64::MAX => return Expect::Whole(x),
                (Some(x), ..) => return Expect::At(x),
                (None, ..) => {}
            }
        }
        // a late prediction still stands within its tolerance for eviction;
        // asked about a window, only just late (2 ticks) counts as imminent
        let late = if w.is_some() { 2 } else { u64::MAX };
        match c.prediction() {
            Some((p, _)) if p > now && c.next_whole() => Expect::Whole(p),
            Some((p, _)) if p > now => Expect::At(p),
            Some((p, tol)) if now - p <= (tol as u64).min(late) => Expect::At(now + 1),
            _ => Expect::Recency(last),
        }
    }

    /// Files chunk `k` (just accessed at `now`) in the calendar under its
    /// predicted next access, replacing its previous entry.
    /// Only firm predictions are filed: a verified cycle of the chunk's
    /// own, or the workload's step repeated (`expect`'s first two cases); a
    /// chunk's plain EMA of its latest interval (seen a couple of times, or
    /// irregular) still orders eviction but starts no copy.
    /// Nor are predictions within `NEAR` ticks of the access: the chunk
    /// was just used and is resident, and a look-ahead has asked for that
    /// window already (it asks `next_use` of a chunk that leaves HBM) — a
    /// chunk used at every call then costs no calendar update.
    fn schedule(&mut self, now: u64, k: u64) {
        let Some(c) = self.chunks.get_mut(&k) else {
            return;
        };
        let (period, steps) = (self.period, &self.steps);
        let sc = c.strict_cycle();
        schedule_of(
            c,
            sc,
            &mut self.cal,
            &self.cls,
            || step_of(period, steps),
            now,
            k,
            None,
        );
    }

    fn calibrate(&mut self) {
        let warming = self.warming();
        for c in 0..CLASSES {
            let cal = self.cls[c];
            self.cls[c].predicted = 0;
            self.cls[c].hits = 0;
            if warming || cal.predicted < MIN_PREDICTIONS {
                continue;
            }
            let rate = cal.hits as f64 / cal.predicted as f64;
            let name = OpClass::from_u8(c as u8).map_or("?", |k| k.name());
            let head = format!(
                "predictive: class {name} hit rate {rate:.3} ({}/{} predictions in {} s)",
                cal.hits, cal.predicted, self.calib_s
            );
            if rate < HIT_TARGET {
                if cal.fallback {
                    continue;
                }
                if cal.smoothing > SMOOTH_LOW {
                    self.cls[c].smoothing = SMOOTH_LOW;
                    self.push(format!(
                        "{head} < {HIT_TARGET}; EMA smoothing {SMOOTH_HIGH} -> {SMOOTH_LOW}"
                    ));
                } else {
                    self.cls[c].fallback = true;
                    self.push(format!(
                        "{head} < {HIT_TARGET} at smoothing {SMOOTH_LOW}; class falls back to LRU"
                    ));
                }
            } else if cal.fallback {
                // the model keeps predicting in the background: a class whose
                // pattern settled earns its predictions back
                self.cls[c].fallback = false;
                self.push(format!(
                    "{head} >= {HIT_TARGET} in LRU fallback; predictions back on"
                ));
            }
        }
    }
}

impl Predictive {
    /// With the defaults (U3M_CALIB_S = 600 s, U3M_WARMUP_S = 30 s).
    pub fn new() -> Predictive {
        Predictive::with_params(600.0, 30.0)
    }

    /// Calibration every `calib_s` seconds, `warmup_s` of re-warming after a
    /// mode switch.
    pub fn with_params(calib_s: f64, warmup_s: f64) -> Predictive {
        let calib_s = if calib_s.is_finite() && calib_s > 0.0 {
            calib_s
        } else {
            600.0
        };
        let warmup_s = if warmup_s.is_finite() && warmup_s >= 0.0 {
            warmup_s
        } else {
            30.0
        };
        Predictive {
            inner: Mutex::new(Inner {
                chunks: KeyMap::default(),
                cls: [ClassCal::FRESH; CLASSES],
                mode: ModeDetector::new(),
                calib_s,
                warmup_s,
                secs: 0.0,
                next_calib: calib_s,
                warm_until: 0.0,
                prefetch: PREFETCH_TICKS,
                typical: 0.0,
                steps: [(0, 0); 8],
                sigs: KeyMap::default(),
                freed: KeyMap::default(),
                periods: KeyMap::default(),
                period: (0, 0),
                stash: [None, None],
                events: Vec::new(),
                cal: BTreeSet::new(),
                kept: Vec::new(),
                out_slack: false,
                frees: 0,
            }),
            modelled: AtomicUsize::new(0),
            ahead: AtomicBool::new(false),
        }
    }

    /// `place` says Hbm for chunks predicted within `ticks`.
    pub fn set_prefetch_horizon(&self, ticks: u64) {
        if let Ok(mut g) = self.inner.lock() {
            g.prefetch = ticks;
        }
    }

    /// (smoothing, in LRU fallback) of a class, for tests and reports.
    pub fn class_state(&self, class: u8) -> Option<(f32, bool)> {
        let g = self.inner.lock().ok()?;
        g.cls.get(class as usize).map(|c| (c.smoothing, c.fallback))
    }

    /// The current mode's name and whether the thrash guard locked it.
    pub fn mode(&self) -> Option<(&'static str, bool)> {
        let g = self.inner.lock().ok()?;
        Some((g.mode.mode.name(), g.mode.locked))
    }
}

/// The workload's step (`Inner::step`) from its period and step tallies.
fn step_of(period: (u64, u64), steps: &[(u64, u64); 8]) -> u64 {
    let (p, w) = period;
    if p > 0 && w >= 8 * p {
        return p;
    }
    steps
        .iter()
        .max_by_key(|e| e.1)
        .filter(|e| e.1 >= 8 * e.0.max(1))
        .map_or(0, |e| e.0)
}

/// `ChunkModel::shift_span_of`'s answer: the prediction, the end of its
/// span, whether it is a whole write.
type Shift = (Option<u64>, u64, bool);

/// `expect`'s prediction for chunk `c`, just accessed at `now`, when it is
/// a firm one (see `Inner::schedule`); `step`: the workload's step, asked
/// only when needed; `sc`: `c.strict_cycle()` (the access path has it
/// already: one rounding of the cycle per access, not two); `shift`: the
/// step shift's answer when read already (`shift_of`, the access path).
fn firm_next_of(
    c: &ChunkModel,
    sc: Option<u64>,
    cls: &[ClassCal; CLASSES],
    step: impl FnOnce() -> u64,
    now: u64,
    shift: Option<Shift>,
) -> Option<u64> {
    debug_assert_eq!(sc, c.strict_cycle());
    if c.n < 3 || cls[c.class as usize].fallback {
        return None;
    }
    let step = step();
    if step > 0 && sc.is_none_or(|cy| cy < step / 2) {
        match shift.unwrap_or_else(|| c.shift_span_of(now, step)) {
            // a whole write next: nothing to copy in ahead of it
            (Some(x), _, false) if x != u64::MAX => return (x > now).then_some(x),
            (Some(_), ..) => return None,
            (None, ..) => {}
        }
    }
    match c.prediction() {
        Some((p, _)) if c.strict && p > now && !c.next_whole() => Some(p),
        _ => None,
    }
}

/// `Inner::schedule` for chunk `c` (key `k`) already looked up: the
/// access path files the chunk it just updated without a second and third
/// look-up of its key.
#[allow(clippy::too_many_arguments)]
fn schedule_of(
    c: &mut ChunkModel,
    sc: Option<u64>,
    cal: &mut BTreeSet<(u64, u64)>,
    cls: &[ClassCal; CLASSES],
    step: impl FnOnce() -> u64,
    now: u64,
    k: u64,
    shift: Option<Shift>,
) {
    let at = firm_next_of(c, sc, cls, step, now, shift)
        .filter(|&t| t > now.saturating_add(NEAR))
        .unwrap_or(0);
    let old = std::mem::replace(&mut c.sched, at);
    if old == at {
        return;
    }
    if old != 0 {
        cal.remove(&(old, k));
    }
    if at != 0 {
        cal.insert((at, k));
    }
}

impl Inner {
    /// One call into the model (`Predictive::on_access` with the lock
    /// held).
    fn access(&mut self, now: u64, class: u8, keys: &[u64], touch: &[Touch]) {
        let g = self;
        let class = class.min(CLASSES as u8 - 1);
        match g.mode.on_op(class, now, g.secs) {
            Some(e @ ModeEvent::Switch { from, to, .. }) => {
                // a new mode: what was learned describes the old one; it
                // is put aside for when that mode returns (training after a
                // serving burst), and what the new mode left, if it ran
                // before, comes back
                let old = Learned {
                    chunks: std::mem::take(&mut g.chunks),
                    freed: std::mem::take(&mut g.freed),
                    steps: std::mem::take(&mut g.steps),
                    sigs: std::mem::take(&mut g.sigs),
                    periods: std::mem::take(&mut g.periods),
                    period: std::mem::take(&mut g.period),
                    typical: std::mem::take(&mut g.typical),
                    at: now,
                };
                g.cal.clear();
                g.stash[mode_index(from)] = Some(Box::new(old));
                if let Some(l) = g.stash[mode_index(to)].take() {
                    g.resume(*l, now);
                }
                g.cls = [ClassCal::FRESH; CLASSES];
                g.warm_until = g.secs + g.warmup_s;
                let t = e.text(g.warmup_s);
                g.push(t);
            }
            Some(e @ ModeEvent::Locked { .. }) => {
                let t = e.text(g.warmup_s);
                g.push(t);
            }
            None => {}
        }
        g.note_call(now, class, keys);
        let s = g.cls[class as usize].smoothing;
        let count = !g.warming();
        for (j, &k) in keys.iter().enumerate() {
            let whole = touch.get(j).is_some_and(|t| t.whole());
            match g.chunks.get_mut(&k) {
                Some(c) => {
                    if let Some((pc, hit)) = c.update(now, class, s, whole) {
                        if count {
                            let cal = &mut g.cls[pc as usize];
                            cal.predicted += 1;
                            cal.hits += hit as u32;
                        }
                    }
                    let sc = c.strict_cycle();
                    let cyc = c.cycle() as f64;
                    if cyc > 0.0 {
                        g.typical = if g.typical == 0.0 {
                            cyc
                        } else {
                            0.99 * g.typical + 0.01 * cyc
                        };
                    }
                    if let Some(v) = sc {
                        note_step(&mut g.steps, v);
                    }
                    // its form read now, the step shift's answer shared with
                    // the calendar: the eviction order reads most chunks
                    // just accessed (RAG: ~9 a build), where the form held
                    let step = step_of(g.period, &g.steps);
                    let fb = g.cls[c.class as usize].fallback;
                    let shift = Inner::shift_of(now, c, sc, step, fb);
                    c.form = Inner::form_from(now, c, step, fb, shift);
                    // filed now, as `schedule` would (after the step noted)
                    schedule_of(c, sc, &mut g.cal, &g.cls, || step, now, k, shift);
                }
                None => {
                    // memory allocated again where a chunk was freed
                    // resumes that chunk's model
                    let c = match g.freed.remove(&k) {
                        Some(mut c) => {
                            c.update(now, class, s, whole);
                            c
                        }
                        None => ChunkModel::new(now, class, whole),
                    };
                    g.chunks.insert(k, c);
                    g.schedule(now, k);
                }
            }
        }
        // predictions that came due leave the calendar
        while let Some(&(t, k)) = g.cal.first() {
            if t > now {
                break;
            }
            g.cal.pop_first();
            if let Some(c) = g.chunks.get_mut(&k).filter(|c| c.sched == t) {
                c.sched = 0;
            }
        }
    }
}

impl Placement for Predictive {
    fn name(&self) -> &'static str {
        "predictive"
    }

    fn on_access(&self, now: u64, class: u8, keys: &[u64], touch: &[Touch]) {
        let Ok(mut g) = self.inner.lock() else { return };
        g.access(now, class, keys, touch);
        self.modelled.store(g.chunks.len(), Relaxed);
    }

    /// The buffered calls under one lock of the model (not one per call:
    /// issue 10, two atomic read-modify-writes per call fewer); each call
    /// is applied exactly as `on_access` applies it, in the same order.
    /// `modelled` is stored once at the end: its only reader, `order_ttl`,
    /// reaches the model through `Buffered`, which applies every buffered
    /// call first, so it never sees a value from inside a batch.
    fn on_access_batch(&self, calls: &dyn super::Accesses) {
        let n = calls.len();
        if n == 0 {
            return;
        }
        let Ok(mut g) = self.inner.lock() else { return };
        for i in 0..n {
            let (now, class, keys, touch) = calls.get(i);
            g.access(now, class, keys, touch);
        }
        self.modelled.store(g.chunks.len(), Relaxed);
    }

    fn on_free(&self, key: u64) {
        if let Ok(mut g) = self.inner.lock() {
            g.frees += 1;
            if let Some(mut c) = g.chunks.remove(&key) {
                if c.sched != 0 {
                    g.cal.remove(&(c.sched, key));
                    c.sched = 0;
                }
                if g.freed.len() >= MAX_FREED {
                    g.freed.clear();
                }
                g.freed.insert(key, c);
            }
        }
    }

    fn next_use(&self, now: u64, key: u64) -> Option<u64> {
        let g = self.inner.lock().ok()?;
        match g.expect(now, key, 0, None) {
            Expect::At(p) if p != u64::MAX => Some(p),
            // the next access needs none of its contents: as if never used
            Expect::Whole(_) => Some(u64::MAX),
            _ => None,
        }
    }

    fn upcoming(&self, now: u64, d: u64, out: &mut Vec<(u64, u64)>) {
        if !self.ahead.load(Relaxed) {
            self.ahead.store(true, Relaxed);
        }
        let Ok(g) = self.inner.lock() else { return };
        let end = now.saturating_add(d);
        if end <= now {
            return;
        }
        out.extend(
            g.cal
                .range((now + 1, 0)..(end.saturating_add(1), 0))
                .copied(),
        );
    }

    fn order(&self, now: u64, cands: &mut [Cand]) {
        let Ok(mut g) = self.inner.lock() else {
            return super::lru_order(cands);
        };
        let step = g.step();
        let mut v: Vec<(u64, Cand)> = cands
            .iter()
            .map(|c| (g.order_weight_kept(now, step, c), *c))
            .collect();
        drop(g);
        // furthest (cost-weighted) first; among equals a clean chunk, then LRU
        v.sort_unstable_by(|a, b| {
            b.0.cmp(&a.0)
                .then(a.1.dirty.cmp(&b.1.dirty))
                .then(a.1.last.cmp(&b.1.last))
                .then(a.1.key.cmp(&b.1.key))
        });
        for (slot, (_, c)) in cands.iter_mut().zip(v) {
            *slot = c;
        }
    }

    fn predicts(&self, now: u64, key: u64, w: u64) -> bool {
        let Ok(g) = self.inner.lock() else {
            return false;
        };
        if !g.chunks.contains_key(&key) {
            return false;
        }
        match g.expect(now, key, 0, Some(w)) {
            Expect::At(p) | Expect::Whole(p) => p <= now.saturating_add(w),
            Expect::Recency(last) => now.saturating_sub(last) < w,
            // seen once: expected back after a typical cycle
            Expect::Unknown(last) if g.typical > 0.0 => {
                let p = last.saturating_add(g.typical.round() as u64);
                p > now && p <= now.saturating_add(w)
            }
            Expect::Unknown(last) => now.saturating_sub(last) < w,
        }
    }

    fn place(&self, now: u64, key: u64) -> Option<Place> {
        let g = self.inner.lock().ok()?;
        if !g.chunks.contains_key(&key) {
            return None;
        }
        // (a whole write next needs no copy-in: Whole is no reason)
        match g.expect(now, key, 0, Some(g.prefetch)) {
            Expect::At(p) if p <= now.saturating_add(g.prefetch) => Some(Place::Hbm),
            _ => None,
        }
    }

    fn tick(&self, secs: f64, _resident_fraction: f64) {
        let Ok(mut g) = self.inner.lock() else { return };
        if !secs.is_finite() {
            return;
        }
        g.secs = secs;
        if secs >= g.next_calib {
            g.calibrate();
            let p = g.calib_s;
            g.next_calib = ((secs / p).floor() + 1.0) * p;
        }
    }

    fn drain_events(&self, out: &mut Vec<String>) {
        if let Ok(mut g) = self.inner.lock() {
            out.append(&mut g.events);
        }
    }

    /// Calls the engine's kept victim order lasts before it is built again
    /// from every candidate: ⌈chunks modelled / `ORDER_BUDGET`⌉, at most the
    /// engine's 4, so a rebuild costs about `ORDER_BUDGET` weights per call
    /// at most — 1 (a fresh order at every call) up to 1024 chunks.
    /// Between rebuilds the kept order lacks the chunks calls touched since
    /// (re-keyed in only after 32 evictions, which a small trace's calls
    /// seldom reach): a training loop's optimizer state just updated — the
    /// chunk needed furthest off, Belady's victim — stays out, and the order
    /// gives the state updated a few calls earlier, which the next step's
    /// optimizer needs first (mlp_train at 1.5 x: 86 evictions per step
    /// against Belady's 76 at 4 calls; 76 at 1); a program that reads back
    /// each buffer once (oversize_app) evicts the buffers still to be read
    /// instead of the one just read (1.429 x Belady's bytes at 2 calls,
    /// 1.000 at 1). At least 2 while the look-ahead asks for `upcoming`
    /// chunks: it takes its victims from the order's first 8, and a fresh
    /// order puts the chunks still in use there (the residency test
    /// `look_ahead_turns_cyclic_fault_ins_into_prefetches`: 7 demand faults
    /// with the look-ahead at 1 call, 6 at 2).
    /// (The ttl stays as it was, decisions with it: a rebuild by
    /// `order_kept` no longer weighs every candidate, only those changed
    /// since the last and those whose reading's span ended.)
    fn order_ttl(&self) -> u64 {
        let n = self.modelled.load(Relaxed) as u64;
        let floor = if self.ahead.load(Relaxed) { 2 } else { 1 };
        n.div_ceil(ORDER_BUDGET).clamp(floor, 4)
    }

    fn order_top(&self, now: u64, cands: &mut Vec<Cand>, k: usize) {
        let Ok(mut g) = self.inner.lock() else {
            return super::lru_order(cands);
        };
        let step = g.step();
        let mut v: Vec<(u64, Cand)> = cands
            .iter()
            .map(|c| (g.order_weight_kept(now, step, c), *c))
            .collect();
        drop(g);
        if k < v.len() {
            // the first k in O(n), then only those sorted
            v.select_nth_unstable_by(k, order_cmp);
            v.truncate(k);
        }
        v.sort_unstable_by(order_cmp);
        cands.clear();
        cands.extend(v.into_iter().map(|(_, c)| c));
    }

    fn order_ranked(
        &self,
        now: u64,
        cands: &mut Vec<Cand>,
        k: usize,
        tail: &mut super::RankTail,
    ) -> bool {
        let Ok(mut g) = self.inner.lock() else {
            return false;
        };
        let step = g.step();
        let v = tail.fill();
        v.extend(
            cands
                .iter()
                .map(|c| (g.order_weight_kept(now, step, c), *c)),
        );
        drop(g);
        tail.start(k, cands);
        true
    }

    fn order_kept(
        &self,
        id: super::KeptId,
        now: u64,
        all: &[Cand],
        gone: &[u64],
        new: &[Cand],
        k: usize,
        cands: &mut Vec<Cand>,
        tail: &mut super::RankTail,
    ) -> bool {
        let Ok(mut g) = self.inner.lock() else {
            return false;
        };
        let g = &mut *g;
        let step = g.step();
        let fb = g.cls.map(|c| c.fallback);
        let (switches, frees, typical) = (g.mode.switches(), g.frees, g.typical);
        let out_slack = g.out_slack;
        let Inner {
            chunks, cls, kept, ..
        } = g;
        let i = match kept
            .iter()
            .position(|x| x.owner == id.owner && x.dev == id.dev)
        {
            Some(i) => i,
            None => {
                if kept.len() >= KEPT_MAX {
                    kept.remove(0);
                }
                kept.push(Kept::new(id.owner, id.dev));
                kept.len() - 1
            }
        };
        let kp = &mut kept[i];
        let follows = kp.live
            && kp.epoch.checked_add(1) == Some(id.epoch)
            && (kp.step, kp.fb, kp.switches, kp.frees) == (step, fb, switches, frees);
        let mut whole = !follows;
        if follows {
            for &key in gone {
                kp.remove(key);
            }
            for c in new {
                let r = kept_read(chunks, cls, now, step, c);
                kp.put(c, r);
            }
            // readings whose span ended are read again
            let mut due = std::mem::take(&mut kp.due);
            due.clear();
            kp.due(now, &mut due);
            for &key in &due {
                if let Some(e) = kp.ents.get(&key) {
                    let c = Cand {
                        key,
                        last: e.last,
                        dirty: e.dirty,
                    };
                    let r = kept_read(chunks, cls, now, step, &c);
                    kp.put(&c, r);
                }
            }
            kp.due = due;
            kp.deltas += 1;
            // (a cheap check that it holds the candidates: else whole)
            whole = kp.ents.len() != all.len();
        }
        if whole {
            kp.wholes += 1;
            kp.clear();
            for c in all {
                let r = kept_read(chunks, cls, now, step, c);
                kp.put(c, r);
            }
        }
        kp.flush();
        (kp.live, kp.epoch) = (true, id.epoch);
        (kp.step, kp.fb, kp.switches, kp.frees) = (step, fb, switches, frees);
        let mut cur = super::KeptCursor {
            id,
            now,
            typical,
            left: k.min(kp.ents.len()),
            pos: [(0, 0); 8],
            started: 0,
            out_slack,
        };
        cands.clear();
        kp.next(&mut cur, KEPT_FIRST, cands);
        tail.start_kept(cur);
        true
    }

    fn set_out_slack(&self, slack: bool) {
        if let Ok(mut g) = self.inner.lock() {
            g.out_slack = slack;
        }
    }

    fn order_kept_next(&self, cur: &mut super::KeptCursor, n: usize, out: &mut Vec<Cand>) {
        let Ok(mut g) = self.inner.lock() else {
            return;
        };
        if let Some(kp) = g.kept.iter_mut().find(|x| {
            x.live && x.owner == cur.id.owner && x.dev == cur.id.dev && x.epoch == cur.id.epoch
        }) {
            kp.next(cur, n, out);
        }
    }
}

/// The weight of a clean chunk whose next access writes it whole, plus
/// its distance (`Inner::weigh`): above any distance a copy is weighed by.
const FREE: u64 = 1 << 62;

/// Candidates a maintained order's build gives at first (the rest as the
/// engine's scan reaches them, 32, 64, ... at a time): on RAG (kv_decode,
/// 25 requests at 2 x the KV) the scans of 75 % of the builds read at most
/// 16, of 91 % at most 32 (each costs a few hundred instructions).
const KEPT_FIRST: usize = 16;

/// A maintained order's `cal` is rebuilt from its live readings when it
/// holds this many entries per candidate.
const CAL_SLACK: usize = 4;

/// Maintained orders a policy keeps at most (one per engine order and
/// device); the oldest goes first.
const KEPT_MAX: usize = 64;

/// The streams of a maintained order. Within each, the order of its
/// entries' weights does not change as time passes (the weights do), so
/// the order at any `now` is a merge of the streams' fronts.
/// `At`, clean (or dirty with a whole write next, weighed as clean): by
/// the predicted tick, read from the top.
const S_AT_CLEAN: usize = 0;
/// `At`, dirty: likewise (its weight is not doubled).
const S_AT_DIRTY: usize = 1;
/// Late within tolerance: weight 1 at every tick.
const S_LATE: usize = 2;
/// Recency: by last use, read from the bottom (oldest weighs most).
const S_REC: usize = 3;
/// Seen once: by last use. Its weight is the larger of one falling with
/// `last` (its age, discounted) and one rising with it (a typical cycle
/// from it), so the heaviest are at the two ends: read from both
/// (position 4 the bottom, 5 the top).
const S_UNK: usize = 4;
/// `At`, a whole write, clean: free to evict (`Expect::Whole`), by the
/// predicted tick, read from the top (position 6).
const S_FREE: usize = 5;
/// `At`, a whole write, dirty: weighed as clean, or free to evict while
/// the link's device-to-host direction has slack (`set_out_slack`), by the
/// predicted tick either way, read from the top (position 7).
const S_AT_DW: usize = 6;

/// An entry of a stream: the stream's key (predicted tick or last use),
/// chunk key, the engine's `last`, dirty; ordered as the tuple of the four
/// (by `pk`: a key is in a stream once).
#[derive(Clone, Copy)]
struct KEnt {
    ord: u64,
    key: u64,
    last: u64,
    dirty: bool,
    /// Its slot in the stream's `gone`, which says whether it was removed
    /// (it stays in its place until the next merge or compaction).
    slot: u32,
}

impl KEnt {
    fn new(ord: u64, key: u64, last: u64, dirty: bool) -> KEnt {
        KEnt {
            ord,
            key,
            last,
            dirty,
            slot: 0,
        }
    }

    #[cfg(test)]
    fn tup(&self) -> (u64, u64, u64, bool) {
        (self.ord, self.key, self.last, self.dirty)
    }

    /// (ord, key): orders a stream as `tup` does, a key being in a stream
    /// once (removed entries aside, which are skipped).
    #[inline]
    fn pk(&self) -> u128 {
        pk(self.ord, self.key)
    }
}

#[inline]
fn pk(ord: u64, key: u64) -> u128 {
    (ord as u128) << 64 | key as u128
}

/// Sorts `a` by `pk` (distinct), `tmp` its scratch: by radix over the
/// bits in which they differ, 8 at a time, when that takes few passes (a
/// build's insertions: ticks and chunk addresses spanning ~24 bits; a
/// comparison sort took ~230 instructions an entry), else by comparison.
fn sort_pk(a: &mut Vec<KEnt>, tmp: &mut Vec<KEnt>) {
    let n = a.len();
    if n < RADIX_MIN {
        a.sort_unstable_by_key(KEnt::pk);
        return;
    }
    let (o, k) = (a[0].ord, a[0].key);
    let (mut xo, mut xk) = (0, 0);
    for e in a.iter() {
        xo |= e.ord ^ o;
        xk |= e.key ^ k;
    }
    // (key or ord, its lowest bit that differs, digits): least
    // significant first, the key's digits then the tick's
    let digits = |x: u64| match x {
        0 => 0,
        x => (64 - x.leading_zeros() - x.trailing_zeros()).div_ceil(8),
    };
    let fields = [
        (true, xk.trailing_zeros(), digits(xk)),
        (false, xo.trailing_zeros(), digits(xo)),
    ];
    if fields[0].2 + fields[1].2 > RADIX_PASSES {
        a.sort_unstable_by_key(KEnt::pk);
        return;
    }
    if tmp.len() < n {
        tmp.resize(n, a[0]);
    }
    let mut cnt = [0usize; 256];
    for (is_key, low, digits) in fields {
        for d in 0..digits {
            let shift = low + 8 * d;
            let digit = |e: &KEnt| ((if is_key { e.key } else { e.ord } >> shift) & 0xff) as usize;
            cnt.fill(0);
            for e in a.iter() {
                cnt[digit(e)] += 1;
            }
            let mut at = 0;
            for c in cnt.iter_mut() {
                (*c, at) = (at, at + *c);
            }
            for e in a.iter() {
                let c = &mut cnt[digit(e)];
                tmp[*c] = *e;
                *c += 1;
            }
            std::mem::swap(a, tmp);
            a.truncate(n);
        }
    }
}

/// `Stream::flush` inserts in place when the entries above the lowest
/// insertion number at least this many per insertion, else merges.
const SMALL_MERGE: usize = 8;

/// Insertions below which `sort_pk` sorts by comparison.
const RADIX_MIN: usize = 64;
/// Radix passes above which `sort_pk` sorts by comparison.
const RADIX_PASSES: u32 = 5;

/// One stream of a maintained order: its entries in the order a
/// `BTreeSet` of their tuples gives, for a fraction of the instructions.
/// A build removes and inserts thousands of candidates (AdamW 8 layers:
/// ~2,500 of each, most of them chunks gone from HBM and back) anywhere in
/// their stream, at ~500 instructions each in a tree; here a removal marks
/// its entry dead by the slot its insertion gave (a binary search for it
/// cost ~200 instructions on the 32 GiB step's ~2,200 removals a build),
/// insertions wait in `add`, and `flush` sorts them and merges them in
/// once per build (linear in the stream's part above the lowest insertion).
#[derive(Default)]
struct Stream {
    /// Sorted by `pk`, dead entries included (the live ones' `pk` unique).
    v: Vec<KEnt>,
    /// Dead entries in `v` and `add`.
    dead: usize,
    /// Inserted since the last `flush`, unsorted.
    add: Vec<KEnt>,
    tmp: Vec<KEnt>,
    /// Per slot: its entry was removed. A slot is free again once its
    /// entry has left `v` and `add`.
    gone: Vec<bool>,
    free: Vec<u32>,
}

impl Stream {
    fn clear(&mut self) {
        self.v.clear();
        self.add.clear();
        self.dead = 0;
        self.gone.clear();
        self.free.clear();
    }

    /// Inserts `e`; its slot, for `remove`.
    fn insert(&mut self, mut e: KEnt) -> u32 {
        e.slot = match self.free.pop() {
            Some(x) => {
                self.gone[x as usize] = false;
                x
            }
            None => {
                self.gone.push(false);
                (self.gone.len() - 1) as u32
            }
        };
        self.add.push(e);
        e.slot
    }

    #[cfg(test)]
    fn dead(&self, e: &KEnt) -> bool {
        self.gone[e.slot as usize]
    }

    /// Removes the live entry `insert` gave `slot`.
    fn remove(&mut self, slot: u32) {
        self.gone[slot as usize] = true;
        self.dead += 1;
        // dead at the top go at once: a victim is taken from the top of
        // the streams read from there, whose dead entries every later read
        // skips again until the stream is compacted
        if self.v.last().is_some_and(|x| x.slot == slot) {
            while let Some(x) = self.v.pop_if(|x| self.gone[x.slot as usize]) {
                self.free.push(x.slot);
                self.dead -= 1;
            }
        }
    }

    /// Merges the insertions in; compacts when half the entries are dead.
    fn flush(&mut self) {
        // removed since inserted (rare: read again within a build)
        let (gone, free, dead) = (&self.gone, &mut self.free, &mut self.dead);
        self.add.retain(|x| {
            let g = gone[x.slot as usize];
            if g {
                free.push(x.slot);
                *dead -= 1;
            }
            !g
        });
        if !self.add.is_empty() {
            sort_pk(&mut self.add, &mut self.tmp);
            let low = self.add[0].pk();
            let p = self.v.partition_point(|x| x.pk() < low);
            if self.add.len() * SMALL_MERGE <= self.v.len() - p {
                self.insert_in_place(p);
                return self.compact();
            }
            let (v, add, tmp, gone) = (&mut self.v, &self.add, &mut self.tmp, &self.gone);
            // the merged part goes to tmp, then back after the entries
            // below it, or tmp takes them and becomes v: whichever copies less
            let swap = p < v.len() - p + add.len();
            tmp.clear();
            if swap {
                tmp.extend_from_slice(&v[..p]);
            }
            let mut j = 0;
            for x in &v[p..] {
                if gone[x.slot as usize] {
                    self.free.push(x.slot);
                    self.dead -= 1;
                    continue;
                }
                while j < add.len() && add[j].pk() < x.pk() {
                    tmp.push(add[j]);
                    j += 1;
                }
                tmp.push(*x);
            }
            tmp.extend_from_slice(&add[j..]);
            if swap {
                std::mem::swap(v, tmp);
            } else {
                v.truncate(p);
                v.extend_from_slice(tmp);
            }
            self.add.clear();
        }
        self.compact();
    }

    fn compact(&mut self) {
        if self.dead * 2 > self.v.len() {
            let (gone, free) = (&self.gone, &mut self.free);
            self.v.retain(|x| {
                let g = gone[x.slot as usize];
                if g {
                    free.push(x.slot);
                }
                !g
            });
            self.dead = 0;
        }
    }

    /// `flush`'s merge for a few insertions (sorted, the lowest's place
    /// `p`): from the top down, each run of entries between two insertions
    /// moved up once, by a block copy, dead ones with it. RAG builds its
    /// order at almost every eviction with ~3.5 insertions a stream, where
    /// the merge read and copied the ~85 entries above the lowest one by
    /// one at ~17 instructions each.
    fn insert_in_place(&mut self, p: usize) {
        let (v, add) = (&mut self.v, &mut self.add);
        let old = v.len();
        // (grown by the insertions themselves: any m entries would do)
        v.extend_from_slice(add);
        let mut end = old;
        for (j, e) in add.iter().enumerate().rev() {
            let k = e.pk();
            let at = p + v[p..end].partition_point(|x| x.pk() <= k);
            v.copy_within(at..end, at + j + 1);
            v[at + j] = *e;
            end = at;
        }
        add.clear();
    }

    /// The flushed entries with (ord, key) above `after` and below
    /// `before` (each: no bound if `None`), dead ones included.
    fn span(&self, after: Option<(u64, u64)>, before: Option<(u64, u64)>) -> &[KEnt] {
        let v = &self.v;
        let a = after.map_or(0, |p| v.partition_point(|x| x.pk() <= pk(p.0, p.1)));
        let b = before.map_or(v.len(), |p| v.partition_point(|x| x.pk() < pk(p.0, p.1)));
        &v[a..b.max(a)]
    }
}

/// Where a candidate stands in a maintained order.
struct KPlace {
    s: u8,
    /// Its entry's slot in stream `s`.
    slot: u32,
    last: u64,
    dirty: bool,
    /// Its reading holds before this tick (u64::MAX: for good).
    until: u64,
}

/// One maintained victim order: every candidate of one engine order's
/// device, in streams keyed so that time does not move them
/// (`Placement::order_kept`). A candidate is read again when the engine
/// says it changed (`last`, `dirty`), when its reading's span ends (`cal`),
/// and all of them when the step, a class's fallback or the models
/// (a mode switch, a free) changed.
struct Kept {
    owner: u64,
    dev: u32,
    epoch: u64,
    live: bool,
    ents: KeyMap<KPlace>,
    sets: [Stream; 7],
    /// (end of the reading's span, key), a min-heap: an entry stays after
    /// its key is read again or leaves (stale: `until` no longer matches),
    /// is skipped when it comes due and goes when the heap is rebuilt
    /// (`CAL_SLACK`); a tree cost ~500 instructions an insertion or removal.
    cal: BinaryHeap<Reverse<(u64, u64)>>,
    due: Vec<u64>,
    grp: Vec<Cand>,
    step: u64,
    fb: [bool; CLASSES],
    switches: usize,
    frees: u64,
    /// Builds from every candidate, and from the changes only.
    wholes: u64,
    deltas: u64,
}

/// The stream, stream key and span end of candidate `c` at `now`, from
/// its model's kept [`Form`] (`order_weight_kept`'s reading).
fn kept_read(
    chunks: &mut KeyMap<ChunkModel>,
    cls: &[ClassCal; CLASSES],
    now: u64,
    step: u64,
    c: &Cand,
) -> (usize, u64, u64) {
    let Some(m) = chunks.get_mut(&c.key) else {
        return (S_UNK, c.last, u64::MAX);
    };
    let fb = cls[m.class as usize].fallback;
    if !m.form.holds(now, step, fb) {
        m.form = Inner::form(now, m, step, fb);
    }
    let last = m.last.max(c.last);
    let until = m.form.until;
    match m.form.kind {
        FormKind::Unknown => (S_UNK, last, until),
        FormKind::Recency => (S_REC, last, until),
        FormKind::At if m.form.whole && !c.dirty => (S_FREE, m.form.at, until),
        // a dirty one whose next access writes it whole costs its copy-out
        // only, as a clean one costs its copy-in (`weigh`)
        FormKind::At if m.form.whole => (S_AT_DW, m.form.at, until),
        FormKind::At if c.dirty => (S_AT_DIRTY, m.form.at, until),
        FormKind::At => (S_AT_CLEAN, m.form.at, until),
        FormKind::Late => (S_LATE, 0, until),
    }
}

impl Kept {
    fn new(owner: u64, dev: u32) -> Kept {
        Kept {
            owner,
            dev,
            epoch: 0,
            live: false,
            ents: KeyMap::default(),
            sets: Default::default(),
            cal: BinaryHeap::new(),
            due: Vec::new(),
            grp: Vec::new(),
            step: 0,
            fb: [false; CLASSES],
            switches: 0,
            frees: 0,
            wholes: 0,
            deltas: 0,
        }
    }

    fn clear(&mut self) {
        self.ents.clear();
        for s in &mut self.sets {
            s.clear();
        }
        self.cal.clear();
    }

    /// Ends a build's changes: the streams are read (`next`) flushed.
    fn flush(&mut self) {
        for s in &mut self.sets {
            s.flush();
        }
    }

    fn remove(&mut self, key: u64) {
        if let Some(e) = self.ents.remove(&key) {
            self.sets[e.s as usize].remove(e.slot);
        }
    }

    /// The keys whose reading's span ended by `now` into `due`, in the
    /// order of (end, key), each once.
    fn due(&mut self, now: u64, due: &mut Vec<u64>) {
        while let Some(&Reverse((until, key))) = self.cal.peek() {
            if until > now {
                break;
            }
            self.cal.pop();
            // (an entry pushed twice for one reading comes out twice in a row)
            if due.last() != Some(&key) && self.ents.get(&key).is_some_and(|e| e.until == until) {
                due.push(key);
            }
        }
    }

    /// Places candidate `c` by its reading, in place of any it had (one
    /// look-up of `ents` for the two).
    fn put(&mut self, c: &Cand, (s, ord, until): (usize, u64, u64)) {
        let slot = self.sets[s].insert(KEnt::new(ord, c.key, c.last, c.dirty));
        let e = KPlace {
            s: s as u8,
            slot,
            last: c.last,
            dirty: c.dirty,
            until,
        };
        if let Some(old) = self.ents.insert(c.key, e) {
            self.sets[old.s as usize].remove(old.slot);
        }
        if until != u64::MAX {
            if self.cal.len() >= CAL_SLACK * (self.ents.len() + 64) {
                // mostly stale: the live readings only (this one among them)
                let mut v = std::mem::take(&mut self.cal).into_vec();
                v.clear();
                v.extend(
                    self.ents
                        .iter()
                        .filter(|e| e.1.until != u64::MAX)
                        .map(|(&k, e)| Reverse((e.until, k))),
                );
                self.cal = BinaryHeap::from(v);
            } else {
                self.cal.push(Reverse((until, c.key)));
            }
        }
    }

    /// The weight `order_weight` gives an entry of stream `s` at `now`.
    #[inline]
    fn weight(s: usize, e: &KEnt, now: u64, typical: f64, slack: bool) -> u64 {
        let (x, dirty) = match s {
            S_AT_CLEAN => (Expect::At(e.ord), false),
            S_AT_DW => (Expect::Whole(e.ord), true),
            S_AT_DIRTY => (Expect::At(e.ord), true),
            S_LATE => (Expect::At(now + 1), e.dirty),
            S_REC => (Expect::Recency(e.ord), e.dirty),
            S_FREE => (Expect::Whole(e.ord), false),
            _ => (Expect::Unknown(e.ord), e.dirty),
        };
        Inner::weigh(now, x, dirty, typical, slack)
    }

    /// Appends the next at least `n` candidates (whole groups of equal
    /// weight, at most `cur.left`) of the order at `cur.now` to `out`:
    /// the heaviest of the streams' fronts, each group of equal weight
    /// sorted by [`rank_cmp`]'s ties (clean first, then `last`, then key).
    fn next(&mut self, cur: &mut super::KeptCursor, n: usize, out: &mut Vec<Cand>) {
        // after the last given out (ascending), before it (descending)
        let at = |i: usize| (cur.started & (1 << i) != 0).then_some(cur.pos[i]);
        let (now, typ, slack) = (cur.now, cur.typical, cur.out_slack);
        let [a0, a1, a2, a3, a4, a5, a6] = &self.sets;
        // per position, the part of its stream still to read: from the top
        // (descending) but positions 2, 3 and 4; the two ends of the
        // seen-once stream (4 from the bottom, 5 from the top) share one
        // part and never cross: their bounds are distinct entries, the
        // bottom's below the top's
        let v: [&[KEnt]; 8] = [
            a0.span(None, at(0)),
            a1.span(None, at(1)),
            a2.span(at(2), None),
            a3.span(at(3), None),
            a4.span(at(4), at(5)),
            &[],
            a5.span(None, at(6)),
            a6.span(None, at(7)),
        ];
        let mut r: [(usize, usize); 8] = v.map(|s| (0, s.len()));
        let g: [&[bool]; 8] = [a0, a1, a2, a3, a4, a4, a5, a6].map(|x| &x.gone[..]);
        const UP: u32 = 0b0001_1100;
        let stream = |i: usize| match i {
            5 => S_UNK,
            6 => S_FREE,
            7 => S_AT_DW,
            i => i,
        };
        // each position's front (where `has` has its bit) and its weight
        let (mut h, mut w, mut has) = ([KEnt::new(0, 0, 0, false); 8], [0u64; 8], 0u32);
        // (indexed, not 8 iterator types matched on: a candidate took ~330
        // instructions so)
        macro_rules! pull {
            ($i:expr) => {{
                let i: usize = $i;
                let j = if i == 5 { 4 } else { i };
                let (s, g, (lo, hi)) = (v[j], g[j], &mut r[j]);
                has &= !(1 << i);
                while *lo < *hi {
                    let e = if UP & (1 << i) != 0 {
                        *lo += 1;
                        s[*lo - 1]
                    } else {
                        *hi -= 1;
                        s[*hi]
                    };
                    if !g[e.slot as usize] {
                        (h[i], w[i]) = (e, Self::weight(stream(i), &e, now, typ, slack));
                        has |= 1 << i;
                        break;
                    }
                }
            }};
        }
        // position i's front as a candidate, the cursor past it there
        macro_rules! take {
            ($i:expr) => {{
                let i: usize = $i;
                let e = h[i];
                cur.pos[i] = (e.ord, e.key);
                cur.started |= 1 << i;
                pull!(i);
                Cand {
                    key: e.key,
                    last: e.last,
                    dirty: e.dirty,
                }
            }};
        }
        for i in 0..8 {
            pull!(i);
        }
        let grp = &mut self.grp;
        let mut got = 0;
        while got < n && cur.left > 0 && has != 0 {
            // the heaviest front, the first of equals (over the fronts
            // there are: a few of the eight)
            let mut f = has.trailing_zeros() as usize;
            let mut top = w[f];
            let mut m = has & (has - 1);
            while m != 0 {
                let i = m.trailing_zeros() as usize;
                m &= m - 1;
                if w[i] > top {
                    (f, top) = (i, w[i]);
                }
            }
            let c = take!(f);
            // almost always a group of one (RAG: all but 0.1 %)
            let mut m = has >> f << f;
            let mut one = true;
            while m != 0 {
                let i = m.trailing_zeros() as usize;
                m &= m - 1;
                one &= w[i] != top;
            }
            if one {
                out.push(c);
                cur.left -= 1;
                got += 1;
                continue;
            }
            grp.clear();
            grp.push(c);
            for i in f..8 {
                while has & (1 << i) != 0 && w[i] == top {
                    grp.push(take!(i));
                }
            }
            // (stable: a group comes in a few runs, mostly descending ones
            // from the streams read from the top, which it takes as they are)
            grp.sort_by_key(|c| (c.dirty, c.last, c.key));
            let t = grp.len().min(cur.left);
            out.extend_from_slice(&grp[..t]);
            cur.left -= t;
            got += t;
        }
    }
}

/// `order`'s comparison (`order_top`): the shared ranking order.
use super::rank_cmp as order_cmp;

impl Inner {
    /// `expect(now, key, _, None)` of model `c` as a [`Form`]: the same
    /// answer (its `last` taken with the caller's hint when read) and the
    /// span of ticks over which it holds — until the step shift's answer
    /// may change (`ChunkModel::shift_span`), a prediction comes due (`At`
    /// becomes `Late`) or passes its tolerance (`Late` becomes `Recency`).
    /// `step` is `self.step()`, `fallback` the class's.
    fn form(now: u64, c: &ChunkModel, step: u64, fallback: bool) -> Form {
        let shift = Self::shift_of(now, c, c.strict_cycle(), step, fallback);
        Self::form_from(now, c, step, fallback, shift)
    }

    /// The step shift's answer (`ChunkModel::shift_span_of`) when `form`
    /// reads it, `sc` being `c.strict_cycle()`.
    fn shift_of(
        now: u64,
        c: &ChunkModel,
        sc: Option<u64>,
        step: u64,
        fallback: bool,
    ) -> Option<Shift> {
        let read = c.n >= 2 && !fallback && step > 0 && sc.is_none_or(|cy| cy < step / 2);
        read.then(|| c.shift_span_of(now, step))
    }

    /// `form` from the step shift's answer `shift_of` gave.
    fn form_from(
        now: u64,
        c: &ChunkModel,
        step: u64,
        fallback: bool,
        shift: Option<Shift>,
    ) -> Form {
        let mut f = Form {
            kind: FormKind::Unknown,
            at: 0,
            from: now,
            until: u64::MAX,
            step,
            fallback,
            whole: false,
        };
        if c.n < 2 {
            return f;
        }
        f.kind = FormKind::Recency;
        if fallback {
            return f;
        }
        if let Some((r, until, whole)) = shift {
            f.until = until;
            match r {
                // for eviction, idle for a whole step reads the model on
                Some(u64::MAX) | None => {}
                Some(x) => {
                    (f.kind, f.at, f.whole) = (FormKind::At, x, whole);
                    return f;
                }
            }
        }
        match c.prediction() {
            Some((p, _)) if p > now => {
                (f.kind, f.at, f.whole) = (FormKind::At, p, c.next_whole());
                f.until = f.until.min(p);
            }
            Some((p, tol)) if now - p <= tol as u64 => {
                f.kind = FormKind::Late;
                f.until = f.until.min(p.saturating_add(tol as u64).saturating_add(1));
            }
            _ => {}
        }
        f
    }

    /// `order_weight` from the chunk's kept [`Form`], read again only when
    /// it no longer holds (the model was updated, the step or the class's
    /// fallback changed, or the clock left its span). The same weight:
    /// the test `kept_weights_are_the_weights` compares the two over random
    /// accesses, frees, mode switches and clocks.
    fn order_weight_kept(&mut self, now: u64, step: u64, c: &Cand) -> u64 {
        let Inner {
            chunks,
            cls,
            typical,
            out_slack,
            ..
        } = self;
        let Some(m) = chunks.get_mut(&c.key) else {
            return Self::weigh(now, Expect::Unknown(c.last), c.dirty, *typical, *out_slack);
        };
        let fb = cls[m.class as usize].fallback;
        if !m.form.holds(now, step, fb) {
            m.form = Self::form(now, m, step, fb);
        }
        let last = m.last.max(c.last);
        let e = match m.form.kind {
            FormKind::Unknown => Expect::Unknown(last),
            FormKind::Recency => Expect::Recency(last),
            FormKind::At if m.form.whole => Expect::Whole(m.form.at),
            FormKind::At => Expect::At(m.form.at),
            FormKind::Late => Expect::At(now + 1),
        };
        Self::weigh(now, e, c.dirty, *typical, *out_slack)
    }

    /// The cost-weighted distance `order` sorts a candidate by (`order_top`;
    /// the same measure, kept equal to it by the test
    /// `order_top_is_the_prefix_of_order`). The eviction order computes it
    /// from kept forms (`order_weight_kept`); this reads the model afresh.
    #[cfg(test)]
    fn order_weight(&self, now: u64, c: &Cand) -> u64 {
        Self::weigh(
            now,
            self.expect(now, c.key, c.last, None),
            c.dirty,
            self.typical,
            self.out_slack,
        )
    }

    /// The weight of a candidate (`dirty`) the policy expects as `e`.
    #[inline]
    fn weigh(now: u64, e: Expect, dirty: bool, typical: f64, slack: bool) -> u64 {
        let (at, modelled, dirty) = match e {
            // nothing to copy in or out: before every chunk that costs a
            // copy, the one used latest first (its HBM is free longest);
            // and a dirty one while copy-outs cost less than copy-ins (the
            // device-to-host direction has slack): its copy-out takes what
            // would idle, where a clean victim's copy-in would come back on
            // the busier direction
            Expect::Whole(p) if !dirty || slack => {
                return FREE.saturating_add(p.saturating_sub(now))
            }
            // its copy-out is all evicting it costs, as a clean chunk's
            // copy-in: weighed as clean
            Expect::Whole(p) => (p, true, false),
            Expect::At(p) => (p, true, dirty),
            // time since the last use stands for the time to the next
            Expect::Recency(last) => (now.saturating_add(now.saturating_sub(last)), false, dirty),
            // a chunk seen once is expected to behave like a typical one
            // (a scan's chunks then leave before a loop's), or by its age —
            // discounted to 3/4: a guess from one access yields to a model's
            // estimate of about the same distance. In a training run's first
            // optimizer pass, the state just updated (a model: back in a
            // step) and the state not yet reached (seen once, at start-up:
            // due within the pass) are about as old; undiscounted, the
            // state due next was evicted as often as the state just updated
            // (adam --recompute at 1.5 x: 1.200 x Belady's bytes, 1.137
            // with the discount).
            Expect::Unknown(last) => (
                now.saturating_add(now.saturating_sub(last) / 4 * 3)
                    .max(last.saturating_add(typical as u64)),
                false,
                dirty,
            ),
        };
        // what evicting it costs: a clean chunk one transfer (back in
        // later), a dirty one two (out now, back in later) — so a clean
        // chunk whose next use the model knows goes first unless a dirty
        // one is needed over twice as late (guesses, and uses within the
        // next 64 calls, where the order matters more than the copy-out,
        // are not weighted)
        let dist = at.saturating_sub(now);
        if dirty || !modelled || dist <= 64 {
            dist
        } else {
            dist.saturating_mul(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::mode::tests::{decode_step, train_step};
    use super::super::Lru;
    use super::*;

    const MB2: u64 = 2 << 20;

    fn events(p: &Predictive) -> Vec<String> {
        let mut v = Vec::new();
        p.drain_events(&mut v);
        v
    }

    /// (precision, recall) of `p.predicts(t, k, w)` against the future of
    /// `log` (tick, key) sampled every `every` ticks from `from`.
    fn score(
        p: &dyn Placement,
        log: &[(u64, u64)],
        keys: &[u64],
        from: u64,
        every: u64,
        w: u64,
    ) -> (f64, f64) {
        // the policy sees accesses up to t, then is asked about (t, t+w]
        let (mut tp, mut fp, mut fn_) = (0u64, 0u64, 0u64);
        let end = log.last().map_or(0, |e| e.0);
        let mut i = 0;
        let mut t = from;
        while t + w <= end {
            while i < log.len() && log[i].0 <= t {
                p.on_access(log[i].0, 0, &[log[i].1], &[Touch::READ]);
                i += 1;
            }
            for &k in keys {
                let pred = p.predicts(t, k, w);
                let real = log[i..]
                    .iter()
                    .take_while(|e| e.0 <= t + w)
                    .any(|e| e.1 == k);
                match (pred, real) {
                    (true, true) => tp += 1,
                    (true, false) => fp += 1,
                    (false, true) => fn_ += 1,
                    _ => {}
                }
            }
            t += every;
        }
        (
            tp as f64 / (tp + fp).max(1) as f64,
            tp as f64 / (tp + fn_).max(1) as f64,
        )
    }

    /// A training loop: `n` tensors of one chunk each, every one read in the
    /// forward pass, again in the backward pass (reverse order) and updated
    /// by the optimizer; one tick per access.
    fn training_log(n: u64, steps: u64) -> Vec<(u64, u64)> {
        let mut log = Vec::new();
        let mut t = 0;
        for _ in 0..steps {
            for k in 0..n {
                t += 1;
                log.push((t, k * MB2));
            }
            for k in (0..n).rev() {
                t += 1;
                log.push((t, k * MB2));
            }
            for k in 0..n {
                t += 1;
                log.push((t, k * MB2));
            }
        }
        log
    }

    #[test]
    fn strict_loop_is_predicted_exactly() {
        let p = Predictive::new();
        let n = 50;
        let log: Vec<(u64, u64)> = (0..20 * n).map(|i| (i + 1, (i % n) * MB2)).collect();
        let keys: Vec<u64> = (0..n).map(|k| k * MB2).collect();
        let (pr, rc) = score(&p, &log, &keys, 4 * n, 7, 10);
        assert!(pr == 1.0 && rc == 1.0, "precision {pr} recall {rc}");
        // eviction: the chunk just used is needed furthest away
        let mut c: Vec<Cand> = keys[..5]
            .iter()
            .map(|&k| Cand {
                key: k,
                last: 0,
                dirty: false,
            })
            .collect();
        let now = 20 * n; // key 49 was last; key 0 is next
        p.order(now, &mut c);
        assert_eq!(
            c.iter().map(|c| c.key / MB2).collect::<Vec<_>>(),
            vec![4, 3, 2, 1, 0]
        );
    }

    #[test]
    fn training_steps_with_three_uses_per_step() {
        let n = 40;
        let log = training_log(n, 12);
        let keys: Vec<u64> = (0..n).map(|k| k * MB2).collect();
        for w in [5, 30, 100] {
            let p2 = Predictive::new();
            let (pr, rc) = score(&p2, &log, &keys, 4 * 3 * n, 11, w);
            assert!(
                pr >= 0.99 && rc >= 0.99,
                "w {w}: precision {pr} recall {rc}"
            );
            if w < 79 {
                let (lp, lr) = score(&Lru::new(), &log, &keys, 4 * 3 * n, 11, w);
                assert!(
                    lp < 0.9 * pr || lr < 0.9 * rc,
                    "w {w}: lru {lp} {lr} is not worse"
                );
            }
        }
    }

    #[test]
    fn a_scan_is_predicted_by_recency_only() {
        let p = Predictive::new();
        for i in 0..1000u64 {
            p.on_access(i + 1, 9, &[i * MB2], &[Touch::READ]);
        }
        let predicted = (0..1000u64)
            .filter(|&i| p.predicts(1000, i * MB2, 50))
            .count();
        // only recency stands for keys seen once: the last 50
        assert_eq!(predicted, 50);
        let mut c: Vec<Cand> = (0..10u64)
            .map(|i| Cand {
                key: i * 100 * MB2,
                last: i * 100 + 1,
                dirty: false,
            })
            .collect();
        p.order(1000, &mut c);
        assert_eq!(c[0].key, 0, "the oldest of a scan leaves first");
    }

    #[test]
    fn hot_chunks_stay_cold_chunks_leave() {
        let p = Predictive::new();
        // keys 0..4 every 10 ticks; keys 100.. once each
        let mut t = 0;
        for r in 0..100u64 {
            for k in 0..4u64 {
                t += 1;
                p.on_access(t, 0, &[k * MB2], &[Touch::READ]);
            }
            for j in 0..6u64 {
                t += 1;
                p.on_access(t, 4, &[(100 + r * 6 + j) * MB2], &[Touch::WRITE]);
            }
        }
        let mut c: Vec<Cand> = (0..4u64)
            .map(|k| Cand {
                key: k * MB2,
                last: t - 9 + k,
                dirty: false,
            })
            .collect();
        c.extend((0..4u64).map(|j| Cand {
            key: (100 + 99 * 6 + j) * MB2,
            last: t - 5 + j,
            dirty: true,
        }));
        p.order(t, &mut c);
        assert!(c[..4].iter().all(|c| c.key >= 100 * MB2), "{c:?}");
        assert!((0..4u64).all(|k| p.predicts(t, k * MB2, 10)));
        assert_eq!(p.place(t, 0), Some(Place::Hbm));
    }

    #[test]
    fn train_to_infer_switch_clears_and_rewarms() {
        let p = Predictive::with_params(1.0, 5.0);
        let mut t = 0;
        let mut secs = 0.0;
        let weights: Vec<u64> = (0..8).map(|k| k * MB2).collect();
        for _ in 0..30 {
            for c in train_step(4) {
                t += 1;
                p.on_access(
                    t,
                    c,
                    &weights[(t % 8) as usize..(t % 8) as usize + 1],
                    &[Touch::READ],
                );
            }
            secs += 0.5;
            p.tick(secs, 0.5);
        }
        assert!(events(&p).iter().all(|e| !e.contains("mode")));
        for _ in 0..200 {
            for c in decode_step(4) {
                t += 1;
                p.on_access(
                    t,
                    c,
                    &weights[(t % 8) as usize..(t % 8) as usize + 1],
                    &[Touch::READ],
                );
            }
            secs += 0.05;
            p.tick(secs, 0.5);
        }
        let ev = events(&p);
        let modes: Vec<&String> = ev.iter().filter(|e| e.contains("mode")).collect();
        assert_eq!(modes.len(), 1, "{ev:?}");
        assert!(
            modes[0].starts_with("predictive: mode train -> infer at tick")
                && modes[0].contains("re-warming 5 s")
        );
        assert_eq!(p.mode(), Some(("infer", false)));
    }

    #[test]
    fn training_after_serving_resumes_what_it_learned() {
        // training: 8 chunks in turn plus 4 optimizer chunks updated once per
        // step (its last 4 calls); serving: other chunks; then training
        // again. Right when the switch back is seen, the optimizer chunks
        // are due within a step, as before the serving burst.
        let p = Predictive::with_params(600.0, 5.0);
        let (mut t, mut secs) = (0u64, 0.0);
        let weights: Vec<u64> = (0..8).map(|k| k * MB2).collect();
        let opt: Vec<u64> = (0..4).map(|k| (50 + k) * MB2).collect();
        let step = train_step(4);
        let n = step.len() as u64;
        let train = |p: &Predictive, t: &mut u64| {
            for (i, &c) in step.iter().enumerate() {
                *t += 1;
                let k = if i + 4 >= step.len() {
                    opt[i + 4 - step.len()]
                } else {
                    weights[*t as usize % 8]
                };
                p.on_access(*t, c, &[k], &[Touch::WRITE]);
            }
        };
        for _ in 0..20 {
            train(&p, &mut t);
            secs += 0.5;
            p.tick(secs, 0.5);
        }
        assert_eq!(p.next_use(t, opt[0]), Some(t - 3 + n));
        for _ in 0..200 {
            for c in decode_step(4) {
                t += 1;
                p.on_access(t, c, &[(100 + t % 8) * MB2], &[Touch::READ]);
            }
            secs += 0.05;
            p.tick(secs, 0.5);
        }
        assert_eq!(p.mode(), Some(("infer", false)));
        // training again, call by call until the switch is seen
        let mut seen = None;
        'outer: for _ in 0..10 {
            for (i, &c) in step.iter().enumerate() {
                t += 1;
                let k = if i + 4 >= step.len() {
                    opt[i + 4 - step.len()]
                } else {
                    weights[t as usize % 8]
                };
                p.on_access(t, c, &[k], &[Touch::WRITE]);
                if p.mode() == Some(("train", false)) {
                    seen = Some(i);
                    break 'outer;
                }
            }
        }
        let i = seen.expect("switch back to train");
        assert!(i + 4 < step.len(), "seen at call {i} of {n}");
        let due = p.next_use(t, opt[0]);
        assert!(
            due.is_some_and(|d| d > t && d <= t + n),
            "optimizer chunk due {due:?} at {t} (step {n})"
        );
    }

    #[test]
    fn alternating_modes_lock_after_two_switches_in_a_minute() {
        let p = Predictive::with_params(600.0, 1.0);
        let (mut t, mut secs) = (0u64, 0.0);
        for phase in 0..6 {
            for _ in 0..20 {
                let ops = if phase % 2 == 0 {
                    train_step(4)
                } else {
                    decode_step(8)
                };
                for c in ops {
                    t += 1;
                    p.on_access(t, c, &[(t % 16) * MB2], &[Touch::READ]);
                }
                secs += 0.5;
                p.tick(secs, 0.5);
            }
        }
        let ev = events(&p);
        let switches = ev
            .iter()
            .filter(|e| e.starts_with("predictive: mode ") && e.contains(" -> "))
            .count();
        let locks: Vec<&String> = ev
            .iter()
            .filter(|e| e.starts_with("predictive: mode locked"))
            .collect();
        assert_eq!((switches, locks.len()), (2, 1), "{ev:?}");
        assert!(locks[0].contains("thrash guard"));
        assert_eq!(p.mode(), Some(("train", true)));
    }

    #[test]
    fn calibration_lowers_smoothing_then_falls_back_to_lru() {
        let p = Predictive::with_params(1.0, 30.0);
        // class 11 (other): one chunk at pseudo-random intervals; class 0: a strict loop
        let mut t = 0u64;
        let mut x = 12345u64;
        let mut secs = 0.0;
        let mut ev = Vec::new();
        for period in 0..4 {
            for _ in 0..200 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                p.on_access(t + 1 + (x >> 58), 11, &[7 * MB2], &[Touch::WRITE]);
                t += 100;
                p.on_access(t, 0, &[100 * MB2], &[Touch::READ]);
            }
            secs += 1.0;
            p.tick(secs, 0.5);
            p.drain_events(&mut ev);
            match period {
                0 => assert_eq!(p.class_state(11), Some((SMOOTH_LOW, false)), "{ev:?}"),
                _ => assert_eq!(p.class_state(11), Some((SMOOTH_LOW, true)), "{ev:?}"),
            }
            assert_eq!(p.class_state(0), Some((SMOOTH_HIGH, false)), "{ev:?}");
        }
        assert_eq!(ev.len(), 2, "{ev:?}");
        assert!(
            ev[0].starts_with("predictive: class other hit rate")
                && ev[0].contains("smoothing 0.9 -> 0.7"),
            "{ev:?}"
        );
        assert!(ev[1].contains("falls back to LRU"), "{ev:?}");
        // in fallback the class predicts by recency
        assert!(p.predicts(t, 7 * MB2, 100) && !p.predicts(t, 7 * MB2, 30));
    }

    #[test]
    fn calibration_waits_for_its_period() {
        let p = Predictive::with_params(10.0, 30.0);
        let mut x = 1u64;
        for t in 1..500u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            p.on_access(t * 8 + (x >> 61), 11, &[MB2], &[Touch::WRITE]);
        }
        p.tick(9.9, 0.5);
        assert_eq!(p.class_state(11), Some((SMOOTH_HIGH, false)));
        p.tick(10.0, 0.5);
        assert_eq!(p.class_state(11), Some((SMOOTH_LOW, false)));
    }

    #[test]
    fn decode_loop_over_a_growing_kv_cache() {
        let p = Predictive::new();
        // each decode step: per layer three matmul calls on the layer's
        // weights, one attention call over the layer's KV chunks, two more
        // matmuls; every 16 steps each layer's KV grows by a chunk
        let layers = 4u64;
        let mut log = Vec::new();
        let mut t = 0;
        let mut steps = Vec::new();
        for step in 0..200u64 {
            steps.push(t);
            let n = 2 + step / 16;
            for l in 0..layers {
                for _ in 0..3 {
                    t += 1;
                    log.push((t, (1000 + l) * MB2));
                }
                t += 1;
                for k in 0..n {
                    log.push((t, (l * 100 + k) * MB2));
                }
                for _ in 0..2 {
                    t += 1;
                    log.push((t, (1000 + l) * MB2));
                }
            }
        }
        let mut keys: Vec<u64> = (0..layers)
            .flat_map(|l| (0..2 + 200 / 16).map(move |k| (l * 100 + k) * MB2))
            .collect();
        keys.extend((0..layers).map(|l| (1000 + l) * MB2));
        let (pr, rc) = score(&p, &log, &keys, 200, 5, 12);
        assert!(pr >= 0.95 && rc >= 0.9, "precision {pr} recall {rc}");
    }

    /// Demand faults of a cache of `cap` chunks evicting in `p`'s order,
    /// and the accuracy of `p.predicts` sampled along the way.
    fn simulate(p: &dyn Placement, log: &[(u64, u8, u64)], cap: usize) -> u64 {
        let mut res: Vec<Cand> = Vec::new();
        let mut faults = 0;
        for &(t, class, k) in log {
            if let Some(c) = res.iter_mut().find(|c| c.key == k) {
                c.last = t;
            } else {
                faults += 1;
                if res.len() == cap {
                    p.order(t - 1, &mut res);
                    res.remove(0);
                }
                res.push(Cand {
                    key: k,
                    last: t,
                    dirty: false,
                });
            }
            p.on_access(t, class, &[k], &[Touch::READ]);
        }
        faults
    }

    /// A mixed trace: `train` training steps over `n` weight chunks
    /// (forward, backward in reverse, optimizer), then `decode` decode steps
    /// over `n / 2` weight chunks and a KV chunk per layer.
    fn mixed_log(n: u64, train: u64, decode: u64) -> Vec<(u64, u8, u64)> {
        let mut log = Vec::new();
        let mut t = 0;
        for _ in 0..train {
            for k in 0..n {
                t += 1;
                log.push((t, if k % 8 == 4 { 1 } else { 0 }, k * MB2));
            }
            for k in (0..n).rev() {
                t += 1;
                log.push((t, if k % 8 == 4 { 1 } else { 0 }, k * MB2));
            }
            for k in 0..n {
                t += 1;
                log.push((t, 8, k * MB2));
            }
        }
        for _ in 0..decode {
            for k in 0..n / 2 {
                t += 1;
                log.push((t, 0, k * MB2));
                if k % 4 == 3 {
                    t += 1;
                    log.push((t, 2, (500 + k) * MB2));
                }
            }
        }
        log
    }

    #[test]
    fn eviction_near_belady_ahead_of_lru_and_markov() {
        for (name, log, cap) in [
            ("training", mixed_log(40, 30, 0), 30),
            ("decode", mixed_log(40, 0, 200), 20),
            ("mixed", mixed_log(40, 20, 300), 24),
        ] {
            let plain: Vec<(u64, u64)> = log.iter().map(|e| (e.0, e.2)).collect();
            let opt = simulate(&super::super::Belady::new(plain), &log, cap);
            let pred = simulate(&Predictive::new(), &log, cap);
            let lru = simulate(&Lru::new(), &log, cap);
            let mk = simulate(&super::super::Markov::new(), &log, cap);
            eprintln!("{name}: faults belady {opt} predictive {pred} lru {lru} markov {mk}");
            assert!(
                opt <= pred && pred as f64 <= 1.25 * opt as f64,
                "{name}: predictive {pred} vs belady {opt}"
            );
            assert!(
                pred < lru && pred < mk,
                "{name}: predictive {pred} lru {lru} markov {mk}"
            );
        }
    }

    #[test]
    fn mixed_trace_precision_and_recall() {
        let log = mixed_log(40, 20, 300);
        let plain: Vec<(u64, u64)> = log.iter().map(|e| (e.0, e.2)).collect();
        let mut keys: Vec<u64> = (0..40).map(|k| k * MB2).collect();
        keys.extend((0..20).filter(|k| k % 4 == 3).map(|k| (500 + k) * MB2));
        for w in [10u64, 50, 200] {
            let mut r = Vec::new();
            for p in [
                &Predictive::new() as &dyn Placement,
                &Lru::new(),
                &super::super::Markov::new(),
            ] {
                // feed with classes, score like the replayer: every live chunk at sampling points
                let (mut tp, mut fp, mut fn_) = (0u64, 0u64, 0u64);
                let mut i = 0;
                let end = log.last().map_or(0, |e| e.0);
                let mut t = 400;
                while t + w <= end {
                    while i < log.len() && log[i].0 <= t {
                        p.on_access(log[i].0, log[i].1, &[log[i].2], &[Touch::READ]);
                        i += 1;
                    }
                    for &k in &keys {
                        let pred = p.predicts(t, k, w);
                        let real = plain[i..]
                            .iter()
                            .take_while(|e| e.0 <= t + w)
                            .any(|e| e.1 == k);
                        match (pred, real) {
                            (true, true) => tp += 1,
                            (true, false) => fp += 1,
                            (false, true) => fn_ += 1,
                            _ => {}
                        }
                    }
                    t += 13;
                }
                r.push((
                    p.name(),
                    tp as f64 / (tp + fp).max(1) as f64,
                    tp as f64 / (tp + fn_).max(1) as f64,
                ));
            }
            eprintln!("w {w}: {r:?}");
            let (_, pr, rc) = r[0];
            assert!(pr >= 0.95 && rc >= 0.9, "w {w}: {r:?}");
        }
    }

    #[test]
    fn order_of_30k_candidates_is_by_predicted_next_use() {
        let p = Predictive::new();
        let n = 30_000u64;
        // chunk k is touched every n ticks at phase k: next use of k is k + 2n
        for round in 0..2 {
            for k in 0..n {
                p.on_access(round * n + k + 1, 0, &[k * MB2], &[Touch::WRITE]);
            }
        }
        let mut c: Vec<Cand> = (0..n)
            .map(|k| Cand {
                key: k * MB2,
                last: n + k + 1,
                dirty: true,
            })
            .collect();
        let t0 = std::time::Instant::now();
        p.order(2 * n, &mut c);
        eprintln!("order of {n}: {:?}", t0.elapsed());
        assert!(
            c.windows(2).all(|w| w[0].key > w[1].key),
            "furthest next use first"
        );
    }

    #[test]
    fn busy_chunks_repeat_the_last_step() {
        // a workload step of 300 ticks: 40 weight chunks once per step keep
        // the step visible; chunk B is touched 30 times per step at
        // irregular offsets (a longer cycle than the model verifies: 24)
        let offs: Vec<u64> = (0..30u64).map(|i| 5 + i * 9 + (i * i) % 7).collect();
        let mut log = Vec::new();
        for step in 0..12u64 {
            let base = step * 300;
            for k in 0..40u64 {
                log.push((base + 1 + k * 7, k * MB2));
            }
            for &o in &offs {
                log.push((base + o, 999 * MB2));
            }
        }
        log.sort_unstable();
        log.dedup_by_key(|e| e.0);
        let keys = [999 * MB2];
        let (pr, rc) = score(&Predictive::new(), &log, &keys, 4 * 300, 3, 4);
        let (lp, lr) = score(&Lru::new(), &log, &keys, 4 * 300, 3, 4);
        assert!(
            pr >= 0.95 && rc >= 0.95,
            "predictive {pr} {rc} (lru {lp} {lr})"
        );
    }

    #[test]
    fn the_step_is_known_one_step_in() {
        // 40 weight chunks loaded at start-up, then used once per step of
        // 300 calls; a hot chunk is touched by every call (a verified cycle
        // of 1 tick, the most frequent one). Half-way through the second
        // step, a weight chunk not yet used in it is due where it was one
        // step ago plus the step.
        let p = Predictive::new();
        let hot = 999 * MB2;
        for k in 0..40u64 {
            p.on_access(k + 1, 0, &[k * MB2, hot], &[Touch::READ; 2]);
        }
        let mut t = 100u64;
        let mut last_of = [0u64; 40];
        while t < 100 + 300 + 150 {
            let o = (t - 100) % 300;
            if o % 7 == 1 && o / 7 < 40 {
                let k = o / 7;
                p.on_access(t, 0, &[k * MB2, hot], &[Touch::READ; 2]);
                last_of[k as usize] = t;
            } else {
                p.on_access(t, 1, &[hot], &[Touch::READ]);
            }
            t += 1;
        }
        let now = t - 1;
        // chunk 30: used at 100 + 211 in step 0, not yet in step 1
        assert_eq!(last_of[30], 100 + 211);
        assert_eq!(p.next_use(now, 30 * MB2), Some(100 + 211 + 300));
        // and the eviction order puts it after chunk 10 (already used in
        // step 1, next due in step 2)
        let mut c = vec![
            Cand {
                key: 30 * MB2,
                last: last_of[30],
                dirty: true,
            },
            Cand {
                key: 10 * MB2,
                last: last_of[10],
                dirty: true,
            },
        ];
        p.order(now, &mut c);
        assert_eq!(c[0].key, 10 * MB2);
    }

    #[test]
    fn a_chunk_freed_and_allocated_again_keeps_its_model() {
        // an activation chunk used every 100 ticks, freed after each use
        // and allocated again at the same address
        let p = Predictive::new();
        let k = 7 * MB2;
        for i in 1..=6u64 {
            p.on_access(i * 100, 0, &[k], &[Touch::WRITE]);
            p.on_free(k);
        }
        // the free leaves nothing due
        let mut up = Vec::new();
        p.upcoming(600, 200, &mut up);
        assert!(up.is_empty(), "{up:?}");
        p.on_access(700, 0, &[k], &[Touch::WRITE]);
        assert_eq!(p.next_use(700, k), Some(800));
    }

    /// Development aid: precision/recall and faults of predictive, lru and
    /// markov (and belady's faults) on a trace file, chunks at VA
    /// granularity. `U3M_EVAL_TRACE=t.trace cargo test --release -p u3m-core
    /// eval_trace -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn eval_trace() {
        use crate::trace::{read_file, Body};
        use std::collections::HashMap;
        let Ok(path) = std::env::var("U3M_EVAL_TRACE") else {
            return;
        };
        let events = read_file(&path).expect("trace");
        // (tick, class, keys) per call; frees as (tick, keys)
        let mut calls: Vec<(u64, u8, Vec<u64>)> = Vec::new();
        let mut frees: Vec<(u64, Vec<u64>)> = Vec::new();
        let mut sizes: HashMap<u64, u64> = HashMap::new();
        let chunks = |a: u64, b: u64| -> Vec<u64> {
            if b == 0 {
                vec![]
            } else {
                (a / MB2..(a + b).div_ceil(MB2)).map(|c| c * MB2).collect()
            }
        };
        for e in &events {
            let t = calls.len() as u64 + 1;
            match &e.body {
                Body::Alloc { addr, bytes } => {
                    sizes.insert(*addr, *bytes);
                }
                Body::Free { addr } => {
                    let b = sizes.remove(addr).unwrap_or(0);
                    frees.push((t, chunks(*addr, b)));
                }
                Body::Op {
                    op_type,
                    inputs,
                    outputs,
                } => {
                    let mut k: Vec<u64> = inputs
                        .iter()
                        .chain(outputs)
                        .flat_map(|r| chunks(r.addr, r.bytes))
                        .collect();
                    k.sort_unstable();
                    k.dedup();
                    calls.push((t, OpClass::of(op_type) as u8, k));
                }
                Body::Copy {
                    kind,
                    dst,
                    src,
                    bytes,
                } => {
                    let mut k = Vec::new();
                    if kind.dst_on_device() {
                        k.extend(chunks(*dst, *bytes));
                    }
                    if kind.src_on_device() {
                        k.extend(chunks(*src, *bytes));
                    }
                    k.sort_unstable();
                    k.dedup();
                    calls.push((t, 9, k));
                }
                Body::Set { addr, bytes } => calls.push((t, 9, chunks(*addr, *bytes))),
            }
        }
        let mut uses: HashMap<u64, Vec<u64>> = HashMap::new();
        for (t, _, ks) in &calls {
            for &k in ks {
                uses.entry(k).or_default().push(*t);
            }
        }
        let end = calls.len() as u64;
        let secs_per_tick: f64 = std::env::var("U3M_EVAL_SPT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.001);
        eprintln!("{path}: {} calls, {} chunks", end, uses.len());
        for w in [10u64, 100, 1000] {
            let mut line = format!("W={w}:");
            let pols: Vec<Box<dyn Placement>> = vec![
                Box::new(Predictive::with_params(60.0, 5.0)),
                Box::new(Lru::new()),
                Box::new(super::super::Markov::new()),
            ];
            for p in &pols {
                let (mut tp, mut fp, mut fnn) = (0u64, 0u64, 0u64);
                let mut live: std::collections::BTreeSet<u64> = Default::default();
                let (mut i, mut f) = (0usize, 0usize);
                let every = (end / 400).max(1);
                let envu = |n: &str, d: u64| {
                    std::env::var(n)
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(d)
                };
                let (from, to) = (envu("U3M_EVAL_FROM", 0), envu("U3M_EVAL_TO", u64::MAX));
                let mut t = every;
                while t + w <= end {
                    if t < from || t > to {
                        while i < calls.len() && calls[i].0 <= t {
                            while f < frees.len() && frees[f].0 <= calls[i].0 {
                                for k in &frees[f].1 {
                                    p.on_free(*k);
                                    live.remove(k);
                                }
                                f += 1;
                            }
                            let (ct, cl, ks) = &calls[i];
                            p.on_access(*ct, *cl, ks, &vec![Touch::READ; ks.len()]);
                            live.extend(ks.iter().copied());
                            if ct % 100 == 0 {
                                p.tick(*ct as f64 * secs_per_tick, 0.5);
                            }
                            i += 1;
                        }
                        t += every;
                        continue;
                    }
                    while i < calls.len() && calls[i].0 <= t {
                        while f < frees.len() && frees[f].0 <= calls[i].0 {
                            for k in &frees[f].1 {
                                p.on_free(*k);
                                live.remove(k);
                            }
                            f += 1;
                        }
                        let (ct, cl, ks) = &calls[i];
                        p.on_access(*ct, *cl, ks, &vec![Touch::READ; ks.len()]);
                        live.extend(ks.iter().copied());
                        if ct % 100 == 0 {
                            p.tick(*ct as f64 * secs_per_tick, 0.5);
                        }
                        i += 1;
                    }
                    for &k in &live {
                        let v = &uses[&k];
                        let j = v.partition_point(|&x| x <= t);
                        let real = v.get(j).is_some_and(|&x| x <= t + w);
                        match (p.predicts(t, k, w), real) {
                            (true, true) => tp += 1,
                            (true, false) => fp += 1,
                            (false, true) => fnn += 1,
                            _ => {}
                        }
                    }
                    t += every;
                }
                line += &format!(
                    "  {} P {:.3} R {:.3}",
                    p.name(),
                    tp as f64 / (tp + fp).max(1) as f64,
                    tp as f64 / (tp + fnn).max(1) as f64
                );
                if w == 10 {
                    let mut ev = Vec::new();
                    p.drain_events(&mut ev);
                    for e in ev {
                        eprintln!("  event: {e}");
                    }
                }
            }
            eprintln!("{line}");
        }
        // faults at a capacity of a fraction of the chunks
        let flat: Vec<(u64, u8, u64)> = calls
            .iter()
            .flat_map(|(t, c, ks)| ks.iter().map(move |&k| (*t, *c, k)))
            .collect();
        let plain: Vec<(u64, u64)> = flat.iter().map(|e| (e.0, e.2)).collect();
        let cap = std::env::var("U3M_EVAL_CAP")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(uses.len() * 2 / 3);
        let sim = |p: &dyn Placement| -> u64 {
            let mut res: Vec<Cand> = Vec::new();
            let mut faults = 0;
            let mut k0 = 0;
            while k0 < calls.len() {
                let (t, cl, ks) = &calls[k0];
                for &k in ks {
                    if let Some(c) = res.iter_mut().find(|c| c.key == k) {
                        c.last = *t;
                        continue;
                    }
                    faults += 1;
                    if res.len() >= cap {
                        p.order(t - 1, &mut res);
                        if let Some(pos) = res.iter().position(|c| !ks.contains(&c.key)) {
                            res.remove(pos);
                        }
                    }
                    res.push(Cand {
                        key: k,
                        last: *t,
                        dirty: false,
                    });
                }
                p.on_access(*t, *cl, ks, &vec![Touch::READ; ks.len()]);
                k0 += 1;
            }
            faults
        };
        eprintln!(
            "faults at {cap} of {} chunks: belady {} predictive {} lru {} markov {}",
            uses.len(),
            sim(&super::super::Belady::new(plain)),
            sim(&Predictive::new()),
            sim(&Lru::new()),
            sim(&super::super::Markov::new())
        );
    }
}

#[cfg(test)]
mod when_tests {
    use super::*;

    const MB2: u64 = 2 << 20;

    /// A cycle of 12 chunks: the calendar names exactly the chunks due in a
    /// window, at the ticks they come, and `next_use` agrees.
    #[test]
    fn upcoming_names_the_chunks_due_in_the_window() {
        let p = Predictive::new();
        let n = 12u64;
        let mut t = 0;
        for _ in 0..6 {
            for k in 0..n {
                t += 1;
                p.on_access(t, OpClass::Layout as u8, &[k * MB2], &[Touch::READ]);
            }
        }
        // t = 72: chunk k is next used at 72 + k + 1
        let mut up = Vec::new();
        p.upcoming(t, 4, &mut up);
        up.sort_unstable();
        assert_eq!(up, (0..4).map(|k| (t + k + 1, k * MB2)).collect::<Vec<_>>());
        assert_eq!(p.next_use(t, 5 * MB2), Some(t + 6));
        // the window moves on: nothing twice, nothing past due
        up.clear();
        p.upcoming(t + 4, 3, &mut up);
        up.sort_unstable();
        assert_eq!(up, (4..7).map(|k| (t + k + 1, k * MB2)).collect::<Vec<_>>());
        // a freed chunk leaves the calendar
        p.on_free(5 * MB2);
        up.clear();
        p.upcoming(t, 12, &mut up);
        assert_eq!(up.len(), 11);
        assert!(!up.iter().any(|e| e.1 == 5 * MB2));
    }

    /// A chunk predicted to be written whole next needs none of its
    /// contents: clean, it leaves before every chunk whose eviction costs a
    /// copy; dirty, its copy-out is all it costs, as a clean chunk's fetch
    /// (weighed as clean, or first while copy-outs are the cheaper
    /// direction). Nothing is fetched ahead of such an access.
    #[test]
    fn a_chunk_written_whole_next_costs_no_fetch() {
        let p = Predictive::new();
        let (a, b, c) = (MB2, 2 * MB2, 3 * MB2);
        let l = OpClass::Layout as u8;
        for s in 0..5u64 {
            // b written whole at 800, c read at 850, a read at 900
            p.on_access(s * 1000 + 800, l, &[b], &[Touch::WHOLE]);
            p.on_access(s * 1000 + 850, l, &[c], &[Touch::READ]);
            p.on_access(s * 1000 + 900, l, &[a], &[Touch::READ]);
        }
        let now = 5700;
        let cand = |key, dirty| Cand {
            key,
            last: now - 800,
            dirty,
        };
        let order = |cs: &[Cand]| {
            let mut v = cs.to_vec();
            p.order(now, &mut v);
            v.iter().map(|c| c.key).collect::<Vec<_>>()
        };
        // clean: b goes first although it is needed soonest
        assert_eq!(
            order(&[cand(a, false), cand(b, false), cand(c, false)]),
            [b, a, c]
        );
        // dirty: b (100 ticks off, weighed as clean: 200) before c (150)
        assert_eq!(
            order(&[cand(a, false), cand(b, true), cand(c, true)]),
            [a, b, c]
        );
        // while copy-outs are cheaper than copy-ins (U3M_OUT_FIRST), the
        // dirty one goes first too: its copy-out is all it costs
        p.set_out_slack(true);
        assert_eq!(
            order(&[cand(a, false), cand(b, true), cand(c, true)]),
            [b, a, c]
        );
        p.set_out_slack(false);
        assert_eq!(p.next_use(now, b), Some(u64::MAX));
        assert_eq!(p.next_use(now, a), Some(5900));
        assert_eq!(p.place(5790, b), None);
        assert_eq!(p.place(5890, a), Some(Place::Hbm));
        let mut up = Vec::new();
        p.upcoming(now, 300, &mut up);
        up.sort_unstable();
        assert_eq!(up, [(5850, c), (5900, a)]);
    }

    #[test]
    fn order_top_is_the_prefix_of_order() {
        // loops of several periods (predicted), chunks seen once (typical
        // cycle), irregular ones, clean and dirty, some never seen
        let p = Predictive::new();
        let mut rnd = crate::test_rng(0x2545_f491_4f6c_dd1du64);
        let n = 600u64;
        let mut last = vec![0u64; n as usize];
        for t in 1..=4000u64 {
            let k = match t % 4 {
                0 => (t / 4) % 200,                   // period 800
                1 => 200 + (t / 4) % 150,             // period 600
                2 if t < 1200 => 350 + (t / 4) % 100, // seen, then idle
                _ => 450 + rnd(140),                  // irregular
            };
            p.on_access(
                t,
                (k % 3) as u8,
                &[k * MB2],
                &[Touch::new(k % 2 == 0, false)],
            );
            last[k as usize] = t;
        }
        for now in [4000u64, 4070, 4500] {
            let all: Vec<Cand> = (0..n)
                .map(|k| Cand {
                    key: k * MB2,
                    last: last[k as usize],
                    dirty: rnd(3) == 0,
                })
                .collect();
            let mut full = all.clone();
            p.order(now, &mut full);
            let mut lru = all.clone();
            super::super::lru_order(&mut lru);
            assert_ne!(full, lru, "the model orders, not recency alone");
            for k in [1usize, 7, 64, 599, 600, 1000] {
                let mut top = all.clone();
                p.order_top(now, &mut top, k);
                assert_eq!(top.len(), k.min(all.len()));
                assert_eq!(top[..], full[..top.len()], "now {now}, k {k}");
                // the same order given a segment at a time (the kept
                // victim order's lazily sorted tail)
                let (mut ranked, mut tail) = (all.clone(), crate::policy::RankTail::new());
                assert!(p.order_ranked(now, &mut ranked, k, &mut tail));
                assert!(
                    ranked.len() < top.len() || tail.is_empty(),
                    "k {k}: sorted lazily"
                );
                while !tail.is_empty() {
                    tail.take_next(&mut ranked);
                }
                assert_eq!(ranked, top, "now {now}, k {k}: ranked");
            }
        }
    }

    /// The kept victim order is built at every call while few chunks are
    /// modelled, and lasts up to the engine's 4 calls as their number grows
    /// (the cost of a rebuild); at least 2 once the look-ahead asks for
    /// upcoming chunks.
    #[test]
    fn order_ttl_grows_with_the_chunks_modelled() {
        let p = Predictive::new();
        assert_eq!(p.order_ttl(), 1);
        let keys: Vec<u64> = (0..5000).map(|k| k * MB2).collect();
        p.on_access(1, 0, &keys[..1000], &[Touch::READ; 1000]);
        assert_eq!(p.order_ttl(), 1);
        p.on_access(2, 0, &keys[..2000], &[Touch::READ; 2000]);
        assert_eq!(p.order_ttl(), 2);
        p.on_access(3, 0, &keys[..2500], &[Touch::READ; 2500]);
        assert_eq!(p.order_ttl(), 3);
        p.on_access(4, 0, &keys, &[Touch::READ; 5000]);
        assert_eq!(p.order_ttl(), 4);
        for &k in &keys[100..] {
            p.on_free(k);
        }
        p.on_access(5, 0, &keys[..1], &[Touch::READ]);
        assert_eq!(p.order_ttl(), 1, "freed chunks are not modelled");
        let mut up = Vec::new();
        p.upcoming(5, 16, &mut up);
        assert_eq!(p.order_ttl(), 2, "the look-ahead is on");
        p.on_access(6, 0, &keys, &[Touch::READ; 5000]);
        assert_eq!(p.order_ttl(), 4);
    }

    /// A chunk seen once yields to a modelled one about as far off: the
    /// optimizer state just updated (seen at start-up and now: back in a
    /// step, 3400 ticks) leaves before the state seen once at start-up
    /// (its age 3699 ticks, discounted to 2772), which the pass reaches next.
    #[test]
    fn a_guess_from_one_access_yields_to_a_model() {
        let p = Predictive::new();
        let (updated, due) = (7 * MB2, 9 * MB2);
        p.on_access(1, 8, &[due], &[Touch::WRITE]);
        p.on_access(100, 8, &[updated], &[Touch::WRITE]);
        p.on_access(3600, 8, &[updated], &[Touch::WRITE]);
        assert_eq!(p.next_use(3700, updated), Some(7100));
        let cand = |key, last| Cand {
            key,
            last,
            dirty: true,
        };
        let mut v = vec![cand(due, 1), cand(updated, 3600)];
        p.order(3700, &mut v);
        assert_eq!(v[0].key, updated, "{v:?}");
        let mut top = vec![cand(due, 1), cand(updated, 3600)];
        p.order_top(3700, &mut top, 1);
        assert_eq!(top[0].key, updated);
    }

    /// The chunks call `i` of an `n`-call step touches at tick `t` in the
    /// random runs below: a step-periodic chunk per call slot, loops of other
    /// periods, sometimes an irregular or a once-in-a-while one, and the
    /// optimizer state in the step's last calls (unsorted).
    /// Each key's touch for call `i` of a step: by its step position
    /// mostly (a phase of the cycle that writes whole does so again), at
    /// random otherwise.
    fn random_touches(keys: &[u64], i: u64, rnd: &mut impl FnMut(u64) -> u64) -> Vec<Touch> {
        keys.iter()
            .map(|&k| match rnd(8) {
                0 => Touch::READ,
                1 => Touch::WHOLE,
                _ if (k / MB2 + i) % 3 == 0 => Touch::WHOLE,
                _ => Touch::new((k / MB2 + i) % 3 == 1, false),
            })
            .collect()
    }

    fn random_step_keys(i: u64, n: u64, t: u64, rnd: &mut impl FnMut(u64) -> u64) -> Vec<u64> {
        let mut keys = vec![(i % 40) * MB2, (40 + (t / 3) % 30) * MB2];
        match rnd(6) {
            0 => keys.push((70 + rnd(60)) * MB2), // irregular
            1 => keys.push((130 + t % 30) * MB2), // once in a while
            _ => {}
        }
        if i + 6 >= n {
            keys.push((150 + i % 6) * MB2); // optimizer state
        }
        keys
    }

    /// The eviction order's kept forms (`order_weight_kept`) give exactly
    /// the weights read afresh from the models (`order_weight`, `expect`),
    /// and the ranked order's first k is the full weigh-and-sort's, over
    /// seeded random runs: training steps (a step found, shifts), decode
    /// rounds (a mode switch and back: models stashed and resumed), loops,
    /// irregular and once-seen chunks, frees and re-allocations, idle gaps
    /// that carry predictions past due and past their tolerance, and
    /// calibration that switches classes to LRU fallback and back. Checks
    /// fall between accesses at clocks that move on without one, so kept
    /// forms are read again at later ticks; a form kept past an update, a
    /// step or fallback change, or its span fails here.
    #[test]
    fn kept_weights_are_the_weights() {
        use super::super::mode::tests::{decode_step, train_step};
        let (mut reused, mut checked) = (0u64, 0u64);
        let mut kinds = [0u64; 4];
        // forms predicting a whole write, of clean and dirty candidates
        let mut wholes = [0u64; 2];
        for seed in 1..=6u64 {
            let p = Predictive::with_params(0.5, 0.2);
            let mut rnd = crate::test_rng(
                0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d),
            );
            let nkeys = 160u64;
            let (mut t, mut secs) = (0u64, 0.0f64);
            let mut check = |p: &Predictive, now: u64, rnd: &mut dyn FnMut(u64) -> u64| {
                let mut cands: Vec<Cand> = Vec::new();
                for k in 0..nkeys + 8 {
                    if rnd(4) == 0 {
                        continue;
                    }
                    let last = match rnd(4) {
                        0 => 0,
                        1 => now.saturating_sub(rnd(400)),
                        _ => now.saturating_sub(rnd(40_000)),
                    };
                    let dirty = rnd(2) == 0;
                    cands.push(Cand {
                        key: k * MB2,
                        last,
                        dirty,
                    });
                }
                let mut fresh: Vec<(u64, Cand)> = Vec::new();
                {
                    let mut g = p.inner.lock().unwrap();
                    let step = g.step();
                    for c in &cands {
                        if let Some(m) = g.chunks.get(&c.key) {
                            let fb = g.cls[m.class as usize].fallback;
                            if m.form.holds(now, step, fb) {
                                // kept since a build or the access: as if read now
                                reused += 1;
                                let f = Inner::form(now, m, step, fb);
                                let q = |f: &Form| (f.kind, f.at, f.whole, f.until);
                                assert_eq!(q(&m.form), q(&f), "seed {seed} now {now} {c:?}");
                            }
                        }
                        let kept = g.order_weight_kept(now, step, c);
                        let want = g.order_weight(now, c);
                        assert_eq!(kept, want, "seed {seed} now {now} {c:?}");
                        if let Some(m) = g.chunks.get(&c.key) {
                            kinds[m.form.kind as usize] += 1;
                            wholes[c.dirty as usize] += m.form.whole as u64;
                        }
                        checked += 1;
                        fresh.push((want, *c));
                    }
                }
                fresh.sort_unstable_by(crate::policy::rank_cmp);
                let k = [1usize, 5, 40, 1000][rnd(4) as usize];
                let (mut ranked, mut tail) = (cands.clone(), crate::policy::RankTail::new());
                assert!(p.order_ranked(now, &mut ranked, k, &mut tail));
                while !tail.is_empty() {
                    tail.take_next(&mut ranked);
                }
                let want: Vec<Cand> = fresh.iter().take(k).map(|e| e.1).collect();
                assert_eq!(ranked, want, "seed {seed} now {now} k {k}");
            };
            for phase in 0..14u64 {
                let ops = match phase % 7 {
                    // inference bursts switch the mode and back
                    3 | 4 => decode_step(4).repeat(30),
                    _ => train_step(4).repeat(3),
                };
                let n = ops.len() as u64;
                for (i, &cl) in ops.iter().enumerate() {
                    t += 1;
                    let i = i as u64;
                    let mut keys = random_step_keys(i, n, t, &mut rnd);
                    keys.sort_unstable();
                    keys.dedup();
                    let writes = random_touches(&keys, i, &mut rnd);
                    p.on_access(t, cl, &keys, &writes);
                    if rnd(25) == 0 {
                        p.on_free(rnd(nkeys + 8) * MB2);
                    }
                    if rnd(9) == 0 {
                        check(&p, t, &mut rnd);
                    }
                    if rnd(60) == 0 {
                        // the clock moves on without the policy hearing of
                        // it (engine calls on other devices): checks at
                        // later ticks, then the next access after the gap
                        for _ in 0..3 {
                            t += rnd(120);
                            check(&p, t, &mut rnd);
                        }
                    }
                    secs += 0.004;
                    p.tick(secs, 0.5);
                }
            }
        }
        eprintln!(
            "checked {checked}, kept forms reused {reused}, kinds {kinds:?}, whole {wholes:?}"
        );
        assert!(
            wholes.iter().all(|&n| n > 500),
            "whole writes predicted, clean and dirty: {wholes:?}"
        );
        assert!(checked > 50_000, "{checked}");
        assert!(
            reused > checked / 4,
            "forms are kept: {reused} of {checked}"
        );
        assert!(
            kinds.iter().all(|&n| n > 500),
            "every kind of form: {kinds:?}"
        );
    }

    /// A stream reads exactly as the `BTreeSet` of its tuples it stands
    /// for: seeded random insertions and removals (many ties on the stream
    /// key, a tuple removed and inserted again, removals before and after
    /// a flush), then reads from random cursor positions ascending,
    /// descending and from both ends, as `Kept::next` reads them. Builds
    /// of both kinds: many insertions (merged, radix-sorted) and a few
    /// (put in place); removals at the top (dead entries there dropped).
    #[test]
    fn a_stream_reads_as_a_btreeset() {
        use std::collections::BTreeMap;
        use std::ops::Bound::{Excluded, Unbounded};
        type T = (u64, u64, u64, bool);
        let items = |it: &mut dyn Iterator<Item = &KEnt>| -> Vec<T> { it.map(KEnt::tup).collect() };
        let (mut reads, mut merged) = (0u64, 0u64);
        let (mut in_place, mut at_top) = (0u64, 0u64);
        for seed in 1..=8u64 {
            let mut rnd = crate::test_rng(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(seed) | 1);
            let (mut st, mut model) = (Stream::default(), BTreeSet::<T>::new());
            // the engine's chunks: at most one entry each (and its slot)
            let mut at: BTreeMap<u64, (T, u32)> = BTreeMap::new();
            let spread = [4u64, 64, 1 << 20][seed as usize % 3];
            for round in 0..300 {
                // now and then a build re-reading many (a radix sort), or
                // a few (in place)
                let ops = match round % 16 {
                    5 => 100 + rnd(400),
                    2 | 9 | 13 => 1 + rnd(4),
                    _ => rnd(40),
                };
                for _ in 0..ops {
                    let key = rnd(200) << (seed % 4 * 7);
                    if let Some((t, slot)) = at.remove(&key) {
                        at_top += st.v.last().is_some_and(|x| (x.ord, x.key) == (t.0, t.1)) as u64;
                        st.remove(slot);
                        assert!(model.remove(&t));
                    }
                    if rnd(5) > 0 {
                        // a new last use or tick: mostly late, now and then anywhere
                        let ord = if rnd(3) > 0 {
                            round * 8 + rnd(8)
                        } else {
                            rnd(round * 8 + 8)
                        };
                        let t = (ord % spread, key, rnd(3), rnd(2) == 0);
                        let slot = st.insert(KEnt::new(t.0, t.1, t.2, t.3));
                        model.insert(t);
                        at.insert(key, (t, slot));
                    }
                }
                merged += st.add.len() as u64;
                if let Some(low) = st.add.iter().map(KEnt::pk).min() {
                    let p = st.v.partition_point(|x| x.pk() < low);
                    in_place += (st.add.len() * SMALL_MERGE <= st.v.len() - p) as u64;
                }
                st.flush();
                assert!(st.v.last().is_none_or(|x| !st.dead(x)));
                let live = |e: &&KEnt| !st.dead(e);
                // each slot held by one entry or free (and then gone)
                let mut held = vec![false; st.gone.len()];
                for x in &st.v {
                    assert!(!std::mem::replace(&mut held[x.slot as usize], true));
                }
                assert!(st
                    .free
                    .iter()
                    .all(|&f| st.gone[f as usize] && !held[f as usize]));
                assert_eq!(st.free.len() + st.v.len(), st.gone.len());
                let all: Vec<T> = model.iter().copied().collect();
                assert_eq!(
                    items(&mut st.span(None, None).iter().filter(live)),
                    all,
                    "seed {seed} round {round}"
                );
                assert!(st.dead * 2 <= st.v.len());
                // a cursor position: one given out, or any
                let pos = |rnd: &mut dyn FnMut(u64) -> u64| match all.len() {
                    n if n > 0 && rnd(4) > 0 => {
                        let t = all[rnd(n as u64) as usize];
                        Some((t.0, t.1))
                    }
                    _ => (rnd(2) == 0).then(|| (rnd(round * 8 + 9) % spread, rnd(201))),
                };
                for _ in 0..4 {
                    let (a, b) = (pos(&mut rnd), pos(&mut rnd));
                    let lo = a.map_or(Unbounded, |p| Excluded((p.0, p.1, u64::MAX, true)));
                    let hi = b.map_or(Unbounded, |p| Excluded((p.0, p.1, 0, false)));
                    let up: Vec<T> = model.range((lo, Unbounded)).copied().collect();
                    assert_eq!(items(&mut st.span(a, None).iter().filter(live)), up);
                    let down: Vec<T> = model.range((Unbounded, hi)).rev().copied().collect();
                    assert_eq!(items(&mut st.span(None, b).iter().rev().filter(live)), down);
                    if a.is_some_and(|a| b.is_some_and(|b| a >= b)) {
                        continue; // (a BTreeSet range would panic)
                    }
                    // both ends, in a random interleaving
                    let (mut m, mut s) = (model.range((lo, hi)), st.span(a, b).iter().filter(live));
                    loop {
                        let (x, y) = if rnd(2) == 0 {
                            (m.next(), s.next())
                        } else {
                            (m.next_back(), s.next_back())
                        };
                        assert_eq!(x.copied(), y.map(KEnt::tup), "seed {seed} round {round}");
                        reads += 1;
                        if x.is_none() {
                            break;
                        }
                    }
                }
            }
        }
        eprintln!("reads {reads} merged {merged} in place {in_place} at the top {at_top}");
        assert!(reads > 100_000 && merged > 10_000, "{reads} {merged}");
        assert!(in_place > 300 && at_top > 300, "{in_place} {at_top}");
    }

    /// `sort_pk` sorts as the comparison sort, entries whole, over sizes
    /// on either side of `RADIX_MIN` and keys and ticks differing in few
    /// bits (radix), at an offset (chunk addresses), or in many (not).
    #[test]
    fn sort_pk_is_the_comparison_sort() {
        let mut rnd = crate::test_rng(0x5851_f42d_4c95_7f2d);
        let (mut tmp, mut radix) = (Vec::new(), 0);
        for i in 0..400u64 {
            let n = rnd(if i % 2 == 0 { 100 } else { 3000 });
            let (kb, ob) = (1 + rnd(64) as u32, 1 + rnd(40) as u32);
            let (ks, os) = (rnd(30) as u32, rnd(4) as u32);
            let m = |b: u32| if b >= 64 { u64::MAX } else { (1 << b) - 1 };
            let (k0, o0) = (rnd(1 << 40), rnd(1 << 20));
            let mut keys: Vec<u64> = (0..n)
                .map(|_| k0.wrapping_add((rnd(u64::MAX) & m(kb)) << ks))
                .collect();
            keys.sort_unstable();
            keys.dedup();
            let mut a: Vec<KEnt> = keys
                .iter()
                .map(|&key| {
                    KEnt::new(
                        o0 + ((rnd(u64::MAX) & m(ob)) << os),
                        key,
                        rnd(9),
                        rnd(2) == 0,
                    )
                })
                .collect();
            for j in (1..a.len()).rev() {
                a.swap(j, rnd(j as u64 + 1) as usize);
            }
            let mut want = a.clone();
            want.sort_unstable_by_key(KEnt::tup);
            sort_pk(&mut a, &mut tmp);
            let got: Vec<_> = a.iter().map(KEnt::tup).collect();
            let want: Vec<_> = want.iter().map(KEnt::tup).collect();
            assert_eq!(
                got, want,
                "{i}: n {n} key bits {kb} << {ks}, ord bits {ob} << {os}"
            );
            radix +=
                (a.len() >= RADIX_MIN && kb.div_ceil(8) + ob.div_ceil(8) <= RADIX_PASSES) as u32;
        }
        assert!(radix > 30, "{radix}");
    }

    /// A maintained order's calendar gives the keys whose reading's span
    /// ended as the `BTreeSet` of (end, key) it stands for: seeded random
    /// readings (ends often repeated or already passed), removals and
    /// re-reads of the keys due, few keys so that stale entries pile up
    /// and the heap is rebuilt many times.
    #[test]
    fn a_kept_calendar_reads_as_a_btreeset() {
        use std::collections::BTreeMap;
        let mut rebuilt = 0u64;
        for seed in 1..=6u64 {
            let mut rnd = crate::test_rng(0x2545_f491_4f6c_dd1du64.wrapping_mul(seed) | 1);
            let mut kp = Kept::new(0, 0);
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            let read = |kp: &mut Kept,
                        model: &mut BTreeMap<u64, u64>,
                        rnd: &mut dyn FnMut(u64) -> u64,
                        key: u64,
                        now: u64| {
                model.remove(&key);
                let until = match rnd(5) {
                    0 => u64::MAX,
                    1 => now.saturating_sub(rnd(3)),
                    2 => now + 1000 + rnd(1 << 20),
                    _ => now + rnd(30),
                };
                let c = Cand {
                    key,
                    last: now,
                    dirty: false,
                };
                let s = rnd(7) as usize;
                kp.put(&c, (s, rnd(1000), until));
                if until != u64::MAX {
                    model.insert(key, until);
                }
            };
            let mut due = Vec::new();
            for now in 1..4000u64 {
                let before = kp.cal.len();
                for _ in 0..rnd(12) {
                    let key = rnd(24);
                    if rnd(5) == 0 {
                        kp.remove(key);
                        model.remove(&key);
                    } else {
                        read(&mut kp, &mut model, &mut rnd, key, now);
                    }
                }
                rebuilt += (kp.cal.len() < before) as u64;
                due.clear();
                kp.due(now, &mut due);
                let want: BTreeSet<(u64, u64)> = model
                    .iter()
                    .filter(|e| *e.1 <= now)
                    .map(|(&k, &u)| (u, k))
                    .collect();
                let want: Vec<u64> = want.iter().map(|e| e.1).collect();
                assert_eq!(due, want, "seed {seed} now {now}");
                for &key in &due {
                    read(&mut kp, &mut model, &mut rnd, key, now);
                }
                kp.flush();
            }
        }
        assert!(rebuilt > 50, "{rebuilt}");
    }

    /// The maintained order (`order_kept`, read on with `order_kept_next`
    /// in random segments) gives exactly what a full weigh-and-sort of
    /// every candidate gives, over seeded random runs that change the
    /// candidates between builds as the engine does (a touched candidate's
    /// `last` moves to the call's tick; chunks come, go and change dirty),
    /// with training steps and decode bursts (mode switches), frees,
    /// calibration, idle gaps (readings whose span ends), skipped builds
    /// and two engine orders on one policy.
    #[test]
    fn a_maintained_order_is_the_full_sort() {
        use super::super::mode::tests::{decode_step, train_step};
        use super::super::{KeptId, RankTail};
        use std::collections::BTreeMap;
        let mut read = 0u64;
        let mut counts = [0u64; 2];
        for seed in 1..=6u64 {
            let p = Predictive::with_params(0.5, 0.2);
            let mut rnd = crate::test_rng(
                0x2545_f491_4f6c_dd1du64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            );
            let nkeys = 160u64;
            // two engine orders (devices) sharing the policy, keys apart
            let owners = [KeptId::new_owner(), KeptId::new_owner()];
            let mut cands: [BTreeMap<u64, Cand>; 2] = Default::default();
            let mut prev: [BTreeMap<u64, Cand>; 2] = Default::default();
            let mut epoch = [0u64; 2];
            let (mut t, mut secs) = (0u64, 0.0f64);
            let mut check = |p: &Predictive,
                             now: u64,
                             d: usize,
                             cands: &BTreeMap<u64, Cand>,
                             prev: &mut BTreeMap<u64, Cand>,
                             epoch: &mut u64,
                             rnd: &mut dyn FnMut(u64) -> u64| {
                // either side of U3M_OUT_FIRST: dirty chunks written whole
                // next weigh as clean or go first (their own stream)
                p.set_out_slack(rnd(2) == 0);
                let all: Vec<Cand> = cands.values().copied().collect();
                let gone: Vec<u64> = prev
                    .keys()
                    .filter(|k| !cands.contains_key(k))
                    .copied()
                    .collect();
                let new: Vec<Cand> = all
                    .iter()
                    .filter(|c| prev.get(&c.key) != Some(c))
                    .copied()
                    .collect();
                // now and then a build the policy did not see (it reads all)
                *epoch += 1 + (rnd(40) == 0) as u64;
                let id = KeptId {
                    owner: owners[d],
                    dev: d as u32,
                    epoch: *epoch,
                };
                let mut want: Vec<(u64, Cand)> = {
                    let g = p.inner.lock().unwrap();
                    all.iter().map(|c| (g.order_weight(now, c), *c)).collect()
                };
                want.sort_unstable_by(crate::policy::rank_cmp);
                let k = [1usize, 5, 40, 1000, usize::MAX][rnd(5) as usize];
                let want: Vec<Cand> = want.iter().take(k).map(|e| e.1).collect();
                let (mut got, mut tail) = (vec![all[0]; 3], RankTail::new());
                assert!(p.order_kept(id, now, &all, &gone, &new, k, &mut got, &mut tail));
                assert_eq!(
                    got.len() + tail.len(),
                    want.len(),
                    "seed {seed} now {now} k {k}"
                );
                while !tail.is_empty() {
                    if rnd(3) == 0 {
                        tail.take_next_from(p, &mut got);
                    } else {
                        let before = got.len();
                        let mut cur = tail.kept.unwrap();
                        p.order_kept_next(&mut cur, 1 + rnd(20) as usize, &mut got);
                        assert!(got.len() > before);
                        tail.kept = Some(cur);
                    }
                }
                assert_eq!(got, want, "seed {seed} now {now} k {k} dev {d}");
                read += got.len() as u64;
                {
                    let g = p.inner.lock().unwrap();
                    let kp = g.kept.iter().find(|x| x.owner == owners[d]).unwrap();
                    counts[0] = counts[0].max(kp.wholes);
                    counts[1] = counts[1].max(kp.deltas);
                }
                *prev = cands.clone();
            };
            for phase in 0..14u64 {
                let ops = match phase % 7 {
                    3 | 4 => decode_step(4).repeat(30),
                    _ => train_step(4).repeat(3),
                };
                let n = ops.len() as u64;
                for (i, &cl) in ops.iter().enumerate() {
                    t += 1;
                    let i = i as u64;
                    let d = rnd(2) as usize;
                    let base = d as u64 * 1000 * MB2;
                    let mut keys = random_step_keys(i, n, t, &mut rnd);
                    for k in keys.iter_mut() {
                        *k += base;
                    }
                    keys.sort_unstable();
                    keys.dedup();
                    let writes = random_touches(&keys, i, &mut rnd);
                    p.on_access(t, cl, &keys, &writes);
                    // the engine: a touched chunk is a candidate again after
                    // its call, last at the call's tick (or leaves HBM)
                    for (k, &key) in keys.iter().enumerate() {
                        if rnd(8) == 0 {
                            cands[d].remove(&key);
                        } else {
                            let dirty =
                                writes[k].writes() || cands[d].get(&key).is_some_and(|c| c.dirty);
                            cands[d].insert(
                                key,
                                Cand {
                                    key,
                                    last: t,
                                    dirty,
                                },
                            );
                        }
                    }
                    if rnd(4) == 0 {
                        // an eviction, a copy-out landing (clean now), a
                        // chunk made resident without a call
                        let key = base + rnd(nkeys + 8) * MB2;
                        match rnd(3) {
                            0 => {
                                cands[d].remove(&key);
                            }
                            1 => {
                                if let Some(c) = cands[d].get_mut(&key) {
                                    c.dirty = false;
                                }
                            }
                            _ => {
                                cands[d].entry(key).or_insert(Cand {
                                    key,
                                    last: 0,
                                    dirty: false,
                                });
                            }
                        }
                    }
                    if rnd(40) == 0 {
                        let key = base + rnd(nkeys + 8) * MB2;
                        p.on_free(key);
                        cands[d].remove(&key);
                    }
                    for d in 0..2 {
                        if !cands[d].is_empty() && rnd(4) == 0 {
                            check(&p, t, d, &cands[d], &mut prev[d], &mut epoch[d], &mut rnd);
                        }
                    }
                    if rnd(60) == 0 {
                        // idle gaps: readings pass their span
                        for _ in 0..3 {
                            t += rnd(120);
                            for d in 0..2 {
                                if !cands[d].is_empty() {
                                    check(
                                        &p,
                                        t,
                                        d,
                                        &cands[d],
                                        &mut prev[d],
                                        &mut epoch[d],
                                        &mut rnd,
                                    );
                                }
                            }
                        }
                    }
                    secs += 0.004;
                    p.tick(secs, 0.5);
                }
            }
        }
        eprintln!("candidates read {read}; one order's builds whole / from changes {counts:?}");
        assert!(read > 100_000, "{read}");
        assert!(counts[1] > 4 * counts[0], "built from changes: {counts:?}");
    }
}
