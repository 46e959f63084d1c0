//! The per-chunk access model behind the predictive policy (docs/prediction.md).
//!
//! Each chunk keeps its last access tick, a short ring of its latest access
//! intervals and three EMA parameters of its *cycle*: mean length, trend
//! (EMA of the change of the length) and deviation. A chunk touched `m` times
//! per training step at irregular sub-intervals (forward, backward, optimizer)
//! has an interval sequence that repeats every `m` entries; the model finds
//! the smallest such `m` (up to [`MAX_M`]) and predicts the next access as the
//! access that started the same phase one cycle ago plus the cycle length:
//! `next = t[n+1-m] + mean + trend`. With `m = 1` this is the seed's
//! `last + mean interval + trend`. Every update is O(RING) at worst with
//! early exits, and nothing allocates.

use std::hash::{BuildHasher, Hasher};

/// Intervals remembered per chunk.
pub const RING: usize = 48;
/// Longest cycle (in accesses) the model looks for: two cycles must fit.
pub const MAX_M: usize = RING / 2;

/// Where the model stands for one chunk.
#[derive(Clone, Copy, Debug)]
pub struct ChunkModel {
    /// Tick of the latest access.
    pub last: u64,
    /// Accesses seen (saturating).
    pub n: u32,
    /// Ring of intervals (ticks, saturating), newest at `head - 1`.
    iv: [u32; RING],
    /// The sum of the intervals held (`have()` of them): the ring's oldest
    /// access is `last - span`. `shift_span_of` answers from it without a
    /// walk for a chunk used more than `RING` times per step.
    span: u64,
    head: u8,
    /// Accesses per cycle; 0: no prediction yet.
    pub m: u8,
    /// The interval sequence is verified periodic with period `m` (else the
    /// model is the seed's plain EMA over single intervals).
    pub strict: bool,
    /// Accesses off the verified cycle since it was last confirmed.
    outliers: u8,
    /// Class (OpClass as u8) of the latest access: the class the pending
    /// prediction is scored to and whose calibration governs this chunk.
    pub class: u8,
    mean: f32,
    trend: f32,
    dev: f32,
    prev_obs: f32,
    /// Predicted next access (valid when `m > 0`).
    pub next: u64,
    /// Bit k: the k-th newest access (0: the latest) wrote the chunk whole
    /// ([`Touch::WHOLE`](super::Touch)) — the kind of access a phase of the
    /// cycle is, as its tick is: the access predicted is a whole write
    /// when the one that began its phase a cycle ago was.
    wholes: u64,
    /// How far from `next` an access still counts as the predicted one.
    pub tol: u32,
    /// The tick the predictive policy's calendar holds this chunk under
    /// (its predicted next access when last seen; 0: not in the calendar).
    pub sched: u64,
    /// The predictive policy's eviction reading of this model, kept
    /// between evictions ([`Form`]); every update forgets it.
    pub form: Form,
}

/// What the predictive policy's eviction order reads from a model
/// (`Predictive`'s `expect` for eviction) over a span of ticks: the
/// answer does not change while the model is not updated, the workload's
/// step stays `step`, the class's LRU fallback stays `fallback`, and the
/// clock is in [`from`, `until`). The time-invariant part of the weight:
/// the weight at `now` is computed from it in a few operations, where
/// `expect` looked the step shift up in the ring at every eviction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Form {
    pub kind: FormKind,
    /// The predicted tick (`FormKind::At`).
    pub at: u64,
    pub from: u64,
    /// First tick at which the answer may differ (0: none kept).
    pub until: u64,
    pub step: u64,
    pub fallback: bool,
    /// The access predicted (`FormKind::At`) writes the chunk whole: its
    /// old contents are not needed.
    pub whole: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormKind {
    /// Seen once: `Unknown(last)`.
    Unknown,
    /// Recency stands in: `Recency(last)`.
    Recency,
    /// Predicted at `Form::at`, after the clock.
    At,
    /// A late prediction within its tolerance: the next tick.
    Late,
}

impl Form {
    /// None kept.
    pub const NONE: Form = Form {
        kind: FormKind::Unknown,
        at: 0,
        from: 0,
        until: 0,
        step: 0,
        fallback: false,
        whole: false,
    };

    #[inline]
    pub fn holds(&self, now: u64, step: u64, fallback: bool) -> bool {
        now < self.until && now >= self.from && self.step == step && self.fallback == fallback
    }
}

impl ChunkModel {
    pub fn new(now: u64, class: u8, whole: bool) -> ChunkModel {
        ChunkModel {
            last: now,
            n: 1,
            iv: [0; RING],
            span: 0,
            head: 0,
            m: 0,
            strict: false,
            outliers: 0,
            class,
            mean: 0.0,
            trend: 0.0,
            dev: 0.0,
            prev_obs: 0.0,
            next: 0,
            wholes: whole as u64,
            tol: 0,
            sched: 0,
            form: Form::NONE,
        }
    }

    /// The k-th newest interval (k = 0: the latest).
    #[inline]
    fn iv(&self, k: usize) -> u32 {
        // head < RING and k < RING: one conditional subtraction, not a
        // division by 48, on the walks of `update` and `shift_span_of`
        let i = self.head as usize + RING - 1 - k;
        self.iv[if i >= RING { i - RING } else { i }]
    }

    /// Intervals held.
    #[inline]
    fn have(&self) -> usize {
        (self.n.saturating_sub(1) as usize).min(RING)
    }

    /// The cycle length the model predicts with (0: none yet).
    pub fn cycle(&self) -> f32 {
        if self.m > 0 {
            self.mean
        } else {
            0.0
        }
    }

    /// Step shift: the chunk's next access if it repeats what it did one
    /// `step` ago — the first access in the ring after `now - step`, plus
    /// `step`. None when the ring does not reach back a whole step (the
    /// chunk is used more than RING times per step) or holds no such access,
    /// and when the chunk's one access in the last step came after it was
    /// idle for over a step and a half: it did not repeat with the step
    /// (its own interval predicts it). In a training run's first step the
    /// step found is a layer's period; the optimizer state just updated
    /// (idle since start-up) was expected back a layer later instead of a
    /// step, and the state the pass had yet to reach was evicted before it
    /// (`u3m synth --workload adam --recompute --layers 4` at 1.5 x:
    /// 1.231 x Belady's bytes, 1.124 without the shift there).
    #[cfg(test)]
    pub fn shift_next(&self, now: u64, step: u64) -> Option<u64> {
        self.shift_span(now, step).0
    }

    /// Whether the k-th newest access (0: the latest) wrote the chunk
    /// whole (false beyond what is remembered).
    #[inline]
    pub fn whole_at(&self, k: usize) -> bool {
        k < 64 && self.wholes >> k & 1 != 0
    }

    /// Whether the access `prediction` names is a whole write: the access
    /// that began its phase one cycle ago was.
    #[inline]
    pub fn next_whole(&self) -> bool {
        self.m > 0 && self.whole_at(self.m as usize - 1)
    }

    /// Whether the step shift's prediction, repeating the k-th newest
    /// access, is a whole write: that access was one, and the latest was
    /// not. A chunk written whole and not read since, predicted written
    /// whole again, would hold data no one reads — work a program does not
    /// do: the step before, this address held other data (full-parameter
    /// AdamW's second step: its gradients lie where the first step's
    /// attention scratch did, and the optimizer reads them at once; taken
    /// for dead, 0.523 GiB were evicted and copied back in within that
    /// optimizer; steps 2-3 took 756.6 ms without this rule, 750.9 with
    /// it, simulated; BENCHMARKS.md, thirtieth sitting). The access is
    /// then a dated use. The chunk's own cycle (`next_whole`) is this data's
    /// history and is not corrected (corrected too, the 8-layer LoRA's
    /// steady step over the HBM band took 218.5 ms against 215.7).
    #[inline]
    fn shift_whole(&self, k: usize) -> bool {
        self.whole_at(k) && !self.whole_at(0)
    }

    /// `shift_next` and the first tick after `now` at which its answer may
    /// change (u64::MAX: never while the model is not updated). The answer
    /// depends on the clock only through which of the ring's access ticks
    /// lie after `now - step`: it holds until `now - step` reaches the
    /// oldest of those the walk read.
    #[cfg(test)]
    pub fn shift_span(&self, now: u64, step: u64) -> (Option<u64>, u64) {
        let (r, until, _) = self.shift_span_of(now, step);
        (r, until)
    }

    /// `shift_span`, and whether the access it predicts writes the chunk
    /// whole (`shift_whole`).
    pub fn shift_span_of(&self, now: u64, step: u64) -> (Option<u64>, u64, bool) {
        if step == 0 {
            return (None, u64::MAX, false);
        }
        if now < step {
            return (None, step, false);
        }
        let from = now - step;
        if self.last <= from {
            // nothing in the last step: nothing expected within the next
            return (Some(u64::MAX), u64::MAX, false);
        }
        let have = self.have();
        // the ring's ticks, newest first: last, last - iv(0), ...; the
        // oldest is `last - span` (intervals are at least 1 and sum to at
        // most `last`, so no subtraction below saturates)
        let oldest = self.last.saturating_sub(self.span);
        if oldest > from || have == 0 {
            // the ring ends inside the last step: covered only if it holds
            // the chunk's first access (all it did is known); the same
            // answer until `now - step` reaches the ring's oldest access.
            // Known: `best` is the second-oldest access here, not the
            // oldest, so in a run's second step an activation is predicted
            // at its backward read rather than its forward write. Repeating
            // the oldest, as the doc above says, measured worse on issue
            // 10's shapes (BENCHMARKS.md, twentieth sitting): kept until
            // eviction weighs the dead dirty chunks it exposes differently.
            let until = oldest.saturating_add(step);
            let best = (have > 0).then(|| oldest + self.iv(have - 1) as u64);
            return if self.n as usize == have + 1 {
                let whole = best.is_some() && self.shift_whole(have - 1);
                (best.map(|b| b + step), until, whole)
            } else {
                (None, until, false)
            };
        }
        // k: the newest access after `from` whose predecessor is not (the
        // k-th newest, 0: the latest); found from whichever end of the
        // ring is nearer, by the ticks' share of the span (both walks find
        // the same k: the ticks strictly increase)
        let (mut k, mut best);
        if (self.last - from) <= self.span / 2 {
            (k, best) = (0, self.last);
            let mut t = self.last - self.iv(0) as u64;
            while t > from {
                k += 1;
                best = t;
                t -= self.iv(k) as u64;
            }
        } else {
            (k, best) = (have - 1, oldest + self.iv(have - 1) as u64);
            while best <= from {
                k -= 1;
                best += self.iv(k) as u64;
            }
        }
        // `best` stays the first access after `now - step` until that
        // reaches it
        let until = best.saturating_add(step);
        if k == 0 && self.iv(0) as u64 > step + step / 2 {
            // touched once in the last step, after being idle for over a
            // step and a half: the step does not describe it
            return (None, until, false);
        }
        (Some(best + step), until, self.shift_whole(k))
    }

    /// The verified cycle length, ticks.
    pub fn strict_cycle(&self) -> Option<u64> {
        (self.strict && self.m > 0).then(|| round_f32(self.mean))
    }

    /// The predicted next access and its tolerance, when there is a model.
    #[inline]
    pub fn prediction(&self) -> Option<(u64, u32)> {
        (self.m > 0).then_some((self.next, self.tol))
    }

    /// An access at `now` by `class`, with EMA smoothing `s` (weight of the
    /// old value). Returns the outcome of the prediction this access settles:
    /// (class it was made for, hit).
    /// `whole`: the access wrote the chunk whole.
    pub fn update(&mut self, now: u64, class: u8, s: f32, whole: bool) -> Option<(u8, bool)> {
        self.form = Form::NONE;
        if now <= self.last {
            // the same access again: whole only if every part of it is
            self.class = class;
            self.wholes &= !1 | whole as u64;
            return None;
        }
        let d = (now - self.last).min(u32::MAX as u64) as u32;
        let scored = self
            .prediction()
            .map(|(p, tol)| (self.class, now.abs_diff(p) <= tol as u64));
        if self.have() == RING {
            // the oldest interval leaves the ring
            self.span -= self.iv[self.head as usize] as u64;
        }
        self.iv[self.head as usize] = d;
        self.span += d as u64;
        self.wholes = self.wholes << 1 | whole as u64;
        // (head < RING: a wrap, not a division by 48)
        self.head = if self.head as usize + 1 == RING {
            0
        } else {
            self.head + 1
        };
        self.last = now;
        self.n = self.n.saturating_add(1);
        self.class = class;

        // the smallest m whose last m intervals repeat the m before them
        // exactly, else the smallest that does within a tolerance (jitter)
        let have = self.have();
        let (mut found, mut cycle) = (0usize, 0u64);
        let mut sum: u64 = 0;
        for m in 1..=(have / 2).min(MAX_M) {
            sum += self.iv(m - 1) as u64;
            // each interval may differ from its match by 1/16 of their size
            let (mut exact, mut close) = (true, true);
            for k in 0..m {
                let (a, b) = (self.iv(k) as u64, self.iv(k + m) as u64);
                exact &= a == b;
                if a.abs_diff(b) > ((a + b) / 32).max(2) {
                    close = false;
                    break;
                }
            }
            if close && exact {
                (found, cycle) = (m, sum);
                break;
            }
            if close && found == 0 {
                (found, cycle) = (m, sum);
            }
        }
        if found == 0 && self.strict && (self.outliers as usize) < 2 * self.m as usize {
            // an access off the verified cycle: keep the cycle (one late
            // access should not unlearn a training loop) until the ring has
            // had time to show a new one
            self.outliers += 1;
        } else {
            let (m, obs) = if found > 0 {
                (found, cycle as f32)
            } else {
                (1, d as f32)
            };
            let regime_change = found > 0
                && (!self.strict || self.m as usize != m || (obs - self.mean).abs() > obs / 8.0);
            // a single interval far off the plain EMA (a burst at start-up,
            // then a once-per-step use) restarts it too
            let jump = found == 0 && !self.strict && self.m > 0 && obs > 8.0 * self.mean.max(1.0);
            if self.m == 0 || regime_change || (found == 0 && self.strict) || jump {
                self.mean = obs;
                self.trend = 0.0;
                self.dev = 0.0;
            } else {
                let a = 1.0 - s;
                self.trend = s * self.trend + a * (obs - self.prev_obs);
                self.dev = s * self.dev + a * (obs - self.mean).abs();
                self.mean = s * self.mean + a * obs;
            }
            self.prev_obs = obs;
            self.m = m as u8;
            self.strict = found > 0;
            self.outliers = 0;
        }
        let m = self.m as usize;
        // the access that began the next access's phase one cycle ago
        let back: u64 = (0..m - 1).map(|k| self.iv(k) as u64).sum();
        let base = self.last.saturating_sub(back) as f64;
        let next = base + (self.mean + self.trend).max(1.0) as f64;
        self.next = round_f64(next).max(self.last + 1);
        let tol = (self.mean / 16.0).max(2.0 * self.dev).max(2.0);
        self.tol = tol.min(u32::MAX as f32) as u32;
        scored
    }
}

/// `x.round() as u64` without libm's `roundf` call (the access path
/// rounds a cycle a few times per chunk access): the truncation, plus one
/// when the fraction is at least a half — exact, as `x - trunc(x)` is;
/// negative and NaN give 0, past `u64::MAX` gives `u64::MAX`, as the cast.
#[inline]
fn round_f32(x: f32) -> u64 {
    let t = x as u64;
    t.saturating_add((x - t as f32 >= 0.5) as u64)
}

/// `round_f32` for an `f64`.
#[inline]
fn round_f64(x: f64) -> u64 {
    let t = x as u64;
    t.saturating_add((x - t as f64 >= 0.5) as u64)
}

/// Multiplicative hashing for chunk keys: keys are 2 MiB-aligned VAs whose
/// low 21 bits are zero, which the identity hash would pile into few buckets.
#[derive(Clone, Copy, Default)]
pub struct KeyHash;

pub struct KeyHasher(u64);

impl BuildHasher for KeyHash {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8)) ^ b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

/// A chunk-keyed map that allocates only when a new key is first seen (or
/// the table grows).
pub type KeyMap<V> = std::collections::HashMap<u64, V, KeyHash>;

#[cfg(test)]
mod tests {
    use super::*;

    impl ChunkModel {
        /// The walk `shift_span_of` replaced (newest first, every time),
        /// kept to check it against.
        fn shift_span_ref(&self, now: u64, step: u64) -> (Option<u64>, u64, bool) {
            if step == 0 {
                return (None, u64::MAX, false);
            }
            if now < step {
                return (None, step, false);
            }
            let from = now - step;
            let mut t = self.last;
            let mut best: Option<u64> = None;
            if t <= from {
                // nothing in the last step: nothing expected within the next
                return (Some(u64::MAX), u64::MAX, false);
            }
            for k in 0..self.have() {
                best = Some(t);
                let iv = self.iv(k) as u64;
                t = t.saturating_sub(iv);
                if t <= from {
                    // `t` stays at or before `now - step`; the answer holds
                    // until that reaches the access before it (`best`)
                    let until = best.map_or(u64::MAX, |b| b.saturating_add(step));
                    if k == 0 && iv > step + step / 2 {
                        // touched once in the last step, after being idle for
                        // over a step and a half: the step does not describe it
                        return (None, until, false);
                    }
                    return (best.map(|b| b + step), until, self.shift_whole(k));
                }
            }
            // the ring ends inside the last step: covered only if it holds the
            // chunk's first access (all it did is known); the same answer until
            // `now - step` reaches the ring's oldest access (`t`).
            // Known: `best` is the second-oldest access here, not the oldest
            // (`t`), so in a run's second step an activation is predicted at
            // its backward read rather than its forward write. Repeating the
            // oldest, as the doc above says, measured worse on issue 10's
            // shapes (BENCHMARKS.md, twentieth sitting): kept until eviction
            // weighs the dead dirty chunks it exposes differently.
            let until = t.saturating_add(step);
            if self.n as usize == self.have() + 1 {
                let whole = best.is_some() && self.shift_whole(self.have() - 1);
                (best.map(|b| b + step), until, whole)
            } else {
                (None, until, false)
            }
        }
    }

    /// The rounding without libm gives `round() as u64` for every float:
    /// halves, values around 2^23 / 2^52 and 2^64, negatives, NaN and
    /// infinities, and random bit patterns.
    #[test]
    fn rounding_is_rounds() {
        let mut f32s: Vec<f32> = vec![
            0.0,
            -0.0,
            0.5,
            1.5,
            2.5,
            0.49999997,
            -0.5,
            -3.7,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            8388607.5,
            8388608.0,
            16777217.0,
            1.8446744e19,
            3.0e38,
            f32::MIN_POSITIVE,
            f32::EPSILON,
        ];
        let mut f64s: Vec<f64> = vec![
            0.0,
            -0.0,
            0.5,
            1.5,
            2.5,
            0.49999999999999994,
            -0.5,
            f64::NAN,
            f64::INFINITY,
            4503599627370495.5,
            4503599627370496.0,
            9007199254740993.0,
            1.8446744073709552e19,
            1e300,
            f64::MIN_POSITIVE,
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..1_000_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f32s.push(f32::from_bits(x as u32));
            f64s.push(f64::from_bits(x));
            // and ordinary cycle lengths, with fractions
            f32s.push((x % 10_000_000) as f32 / 8.0);
            f64s.push((x % (1 << 50)) as f64 / 16.0);
        }
        for v in f32s {
            assert_eq!(round_f32(v), v.round() as u64, "{v:e}");
        }
        for v in f64s {
            assert_eq!(round_f64(v), v.round() as u64, "{v:e}");
        }
    }

    /// `shift_span_of` (the ring's span, a walk from the nearer end) gives
    /// the newest-first walk's answer for every model and clock: random
    /// access gaps from 1 tick to past `u32::MAX` (clamped in the ring),
    /// rings not yet full and wrapped many times, steps shorter and longer
    /// than the ring's span, clocks before, at and after the last access.
    #[test]
    fn shift_span_answers_as_the_walk_did() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n.max(1)
        };
        let mut checked = 0u64;
        for _ in 0..400 {
            let scale = [3, 40, 2_000, 300_000][rnd(4) as usize];
            let mut t = rnd(1 << 40);
            let mut c = ChunkModel::new(t, 0, rnd(2) == 0);
            for _ in 0..rnd(200) {
                t += 1 + match rnd(50) {
                    0 => u32::MAX as u64 + rnd(1 << 33),
                    1..=4 => rnd(scale * 40),
                    _ => rnd(scale),
                };
                c.update(t, 0, 0.9, rnd(3) == 0);
                for _ in 0..4 {
                    let step = match rnd(6) {
                        0 => 0,
                        1 => 1 + rnd(4),
                        _ => 1 + rnd(scale * 60),
                    };
                    let now = match rnd(4) {
                        0 => rnd(step + 2),
                        1 => t,
                        _ => t + rnd(step.saturating_mul(3).max(2)),
                    };
                    assert_eq!(
                        c.shift_span_of(now, step),
                        c.shift_span_ref(now, step),
                        "now {now} step {step} model {c:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 100_000, "{checked}");
    }

    fn feed(ticks: &[u64]) -> ChunkModel {
        let mut c = ChunkModel::new(ticks[0], 0, false);
        for &t in &ticks[1..] {
            c.update(t, 0, 0.9, false);
        }
        c
    }

    #[test]
    fn strict_loop_predicts_last_plus_period() {
        let ticks: Vec<u64> = (0..10).map(|i| 5 + i * 100).collect();
        let c = feed(&ticks);
        assert_eq!((c.m, c.strict), (1, true));
        assert_eq!(c.next, 905 + 100);
    }

    #[test]
    fn three_accesses_per_step_find_the_cycle() {
        // forward at +10, backward at +700, optimizer at +950, step 1000
        let mut ticks = Vec::new();
        for s in 0..5u64 {
            for o in [10, 700, 950] {
                ticks.push(s * 1000 + o);
            }
        }
        let mut c = feed(&ticks);
        assert_eq!((c.m, c.strict), (3, true));
        assert_eq!(c.next, 5010, "the next forward");
        let hit = c.update(5010, 0, 0.9, false);
        assert_eq!(hit, Some((0, true)));
        assert_eq!(c.next, 5700, "then the backward");
    }

    /// The kind of access predicted is the kind its phase was a cycle ago:
    /// the forward's whole write, then the backward's and the optimizer's
    /// reads — by the chunk's own cycle and by the step shift alike.
    #[test]
    fn the_access_predicted_is_a_whole_write_where_its_phase_was() {
        let mut c = ChunkModel::new(10, 0, true);
        for s in 0..5u64 {
            for (o, whole) in [(10, true), (700, false), (950, false)] {
                if s * 1000 + o > 10 {
                    c.update(s * 1000 + o, 0, 0.9, whole);
                }
            }
        }
        assert_eq!((c.m, c.next), (3, 5010));
        assert!(c.next_whole(), "the next forward writes it whole");
        assert_eq!(c.shift_span_of(4990, 1000).0, Some(5010));
        assert!(c.shift_span_of(4990, 1000).2);
        c.update(5010, 0, 0.9, true);
        assert_eq!(c.next, 5700);
        assert!(!c.next_whole(), "the backward reads it");
        assert_eq!(c.shift_span_of(5020, 1000), (Some(5700), 5700, false));
        c.update(5700, 0, 0.9, false);
        assert!(!c.next_whole(), "the optimizer reads it");
        // the same access again (a second range of one call): whole only
        // if every part of it is
        c.update(5950, 0, 0.9, false);
        c.update(6010, 0, 0.9, true);
        c.update(6010, 0, 0.9, false);
        assert!(!c.whole_at(0) && c.whole_at(3));
    }

    /// The step shift does not take data written whole and unread since
    /// for dead: the step before, the address held other data. Step 0's
    /// scratch (written whole at 1,960, read at 1,970), step 1's gradient
    /// written whole at 2,900 and read by the optimizer at 2,955.
    #[test]
    fn a_whole_write_is_not_predicted_onto_data_unread_since_its_write() {
        let mut c = ChunkModel::new(1100, 0, true);
        c.update(1150, 0, 0.9, false);
        c.update(1960, 0, 0.9, true);
        c.update(1970, 0, 0.9, false);
        c.update(2900, 0, 0.9, true);
        // a step ago (from 1,950) the address was written whole at 1,960;
        // the gradient is not read yet: a use at 2,960, not a whole write
        assert_eq!(c.shift_span_of(2950, 1000), (Some(2960), 2960, false));
        assert_eq!(c.shift_span_ref(2950, 1000), (Some(2960), 2960, false));
        // once read, the shift's whole write stands
        c.update(2955, 0, 0.9, false);
        assert_eq!(c.shift_span_of(2956, 1000), (Some(2960), 2960, true));
        // the same for a ring that holds the chunk's first access (the
        // run's second step): written whole twice, unread between
        let mut c = ChunkModel::new(1960, 0, true);
        c.update(1970, 0, 0.9, true);
        c.update(2900, 0, 0.9, true);
        assert_eq!(c.shift_span_of(2950, 1000).2, false);
        c.update(2955, 0, 0.9, false);
        assert!(c.shift_span_of(2956, 1000).2);
    }

    #[test]
    fn jitter_stays_within_tolerance() {
        let mut c = ChunkModel::new(0, 0, false);
        let mut t = 0u64;
        let mut hits = 0;
        for i in 0..200u64 {
            t += 500 + (i * 7919 % 21) - 10;
            if let Some((_, true)) = c.update(t, 0, 0.9, false) {
                hits += 1;
            }
        }
        assert!(hits > 190, "{hits}");
    }

    #[test]
    fn period_change_is_followed_within_two_cycles() {
        let mut ticks: Vec<u64> = (0..10).map(|i| i * 100).collect();
        let t0 = *ticks.last().unwrap();
        ticks.extend((1..4).map(|i| t0 + i * 300));
        let c = feed(&ticks);
        assert_eq!(c.next, t0 + 4 * 300);
    }

    #[test]
    fn one_late_access_does_not_unlearn_the_loop() {
        let mut ticks: Vec<u64> = (0..10).map(|i| i * 100).collect();
        ticks.push(950); // 50 early
        let mut c = feed(&ticks);
        assert_eq!(c.next, 1050);
        for t in [1050, 1150, 1250] {
            assert_eq!(c.update(t, 0, 0.9, false), Some((0, true)), "at {t}");
        }
    }

    #[test]
    fn a_burst_then_a_long_interval_restarts_the_plain_ema() {
        // initialised twice at start-up (one tick apart), then updated once
        // per step: the next use is a whole interval away, not the EMA's
        // 0.9 x 1 + 0.1 x 2866 = 288 ticks
        let c = feed(&[7, 8, 2874]);
        assert!(!c.strict);
        assert_eq!(c.next, 2874 + 2866);
    }

    /// The step shift repeats what a chunk did one step ago; a chunk
    /// touched once in the last step after being idle since start-up (the
    /// optimizer state in a training run's first step, when the step found
    /// is a layer's period) did not repeat with it.
    #[test]
    fn a_chunk_idle_for_steps_does_not_repeat_with_the_step() {
        // every 50 ticks: next one step on
        let c = feed(&[400, 450, 500]);
        assert_eq!(c.shift_next(500, 50), Some(550));
        // a step and a half idle at most: still on the step
        let c = feed(&[425, 500]);
        assert_eq!(c.shift_next(500, 50), Some(550));
        // idle from 10 to 500 (nearly ten steps): no shift; its own
        // interval predicts it
        let c = feed(&[10, 500]);
        assert_eq!(c.shift_next(500, 50), None);
        assert_eq!(c.prediction().map(|p| p.0), Some(990));
        // several accesses in the last step after a long idle: the pattern
        // of the last step stands
        let c = feed(&[10, 470, 500]);
        assert_eq!(c.shift_next(500, 50), Some(520));
    }

    /// `shift_span`'s answer is `shift_next`'s at every tick of its span,
    /// for models of every shape (fewer accesses than the ring holds and
    /// more, bursts, long idles) and steps; and the span is not longer
    /// than that: at its end the answer differs in most cases (a span one
    /// tick too long fails the first part).
    #[test]
    fn a_shift_span_holds_the_answer_until_it_may_change() {
        let mut rnd = crate::test_rng(0x51_7cc1_b727_220au64);
        let (mut spans, mut changed) = (0u64, 0u64);
        for _ in 0..300 {
            let n = 1 + rnd(70);
            let mut t = 1 + rnd(50);
            let mut ticks = vec![t];
            for _ in 1..n {
                t += match rnd(5) {
                    0 => 1 + rnd(200),
                    _ => 1 + rnd(6),
                };
                ticks.push(t);
            }
            let c = feed(&ticks);
            for step in [0u64, 1, 7, 40, 90, 300] {
                let end = t + 2 * step + 10;
                let mut now = 0;
                while now <= end {
                    let (r, until) = c.shift_span(now, step);
                    assert!(until > now, "step {step} now {now}");
                    assert_eq!(r, c.shift_next(now, step));
                    for u in now..until.min(end + 1) {
                        assert_eq!(
                            c.shift_next(u, step),
                            r,
                            "{ticks:?} step {step} from {now} at {u} (span to {until})"
                        );
                    }
                    spans += 1;
                    if until <= end {
                        changed += (c.shift_next(until, step) != r) as u64;
                    }
                    now += 1 + rnd(3);
                }
            }
        }
        assert!(
            changed * 10 > spans,
            "spans end where the answer changes: {changed} of {spans}"
        );
    }

    #[test]
    fn key_hash_spreads_aligned_keys() {
        let b = KeyHash;
        let mut buckets = [0u32; 64];
        for i in 0..6400u64 {
            let mut h = b.build_hasher();
            h.write_u64(0x1240_0000_0000 + i * (2 << 20));
            buckets[(h.finish() >> 58) as usize] += 1;
        }
        assert!(buckets.iter().all(|&n| n > 50 && n < 150), "{buckets:?}");
    }
}
