//! Train ↔ infer mode detection (the seed's mode switch, with its thrash
//! guard). The signal is the MatMul vs Attention share over windows of 10
//! such operators, plus the share of attention that is decode attention
//! (training never decodes; serving mostly does). Within a training step the
//! share alternates (attention layers, then MLP matmuls), so windows are
//! smoothed (EMA), compared against a reference taken when the mode was
//! established, and a change must persist before it counts. A change is a
//! switch only when it changes the mode the shares describe (infer: decode
//! attention is more than 30 % of attention). After a change the reference
//! is re-established once the shares are steady, so one real change switches
//! exactly once.

/// Operators (MatMul or Attention) per window.
pub const WINDOW: u32 = 10;
/// A change of either share above this is a switch (the seed's 30 %).
pub const THRESHOLD: f64 = 0.30;
/// EMA weight of the newest window.
const ALPHA: f64 = 0.3;
/// Windows a change must persist.
const PERSIST: u32 = 4;
/// Windows averaged into a new reference.
const ESTABLISH: u32 = 8;
/// ... once neither smoothed share moved more than this over them.
const STEADY: f64 = 0.1;
/// At most this many switches within GUARD_S seconds; the next locks.
const GUARD_N: usize = 2;
const GUARD_S: f64 = 60.0;

/// Largest minus smallest of `v` (0 when empty).
fn spread(v: impl Iterator<Item = f64>) -> f64 {
    let (lo, hi) = v.fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(x), h.max(x)));
    if lo > hi {
        0.0
    } else {
        hi - lo
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Train,
    Infer,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Train => "train",
            Mode::Infer => "infer",
        }
    }
}

/// What the detector decided after a window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ModeEvent {
    /// Mode changed: (attention share, decode share) at the reference and now.
    Switch {
        from: Mode,
        to: Mode,
        tick: u64,
        before: (f64, f64),
        after: (f64, f64),
    },
    /// A third switch within GUARD_S seconds: the mode stays `mode` for good.
    Locked { mode: Mode, tick: u64, secs: f64 },
}

impl ModeEvent {
    /// The stats-ring line.
    pub fn text(&self, warmup_s: f64) -> String {
        match *self {
            ModeEvent::Switch { from, to, tick, before, after } => format!(
                "predictive: mode {} -> {} at tick {tick} (attention share {:.2} -> {:.2}, decode share of attention {:.2} -> {:.2}); re-warming {warmup_s} s",
                from.name(),
                to.name(),
                before.0,
                after.0,
                before.1,
                after.1
            ),
            ModeEvent::Locked { mode, tick, secs } => format!(
                "predictive: mode locked to {} at tick {tick} (switch {} within {GUARD_S} s at {secs:.1} s refused; thrash guard)",
                mode.name(),
                GUARD_N + 1
            ),
        }
    }
}

pub struct ModeDetector {
    mm: u32,
    attn: u32,
    dec: u32,
    /// Smoothed attention share and decode share of attention (None: no
    /// attention seen yet).
    s_attn: Option<f64>,
    s_dec: Option<f64>,
    reference: Option<(f64, Option<f64>)>,
    /// Windows seen while establishing, and the latest smoothed shares.
    est_n: u32,
    hist: [(f64, Option<f64>); ESTABLISH as usize],
    persist: u32,
    pub mode: Mode,
    /// Seconds of the latest switches (newest last).
    recent: [f64; GUARD_N],
    switches: usize,
    pub locked: bool,
}

impl Default for ModeDetector {
    fn default() -> Self {
        Self::new()
    }
}

impl ModeDetector {
    /// Switches so far (only ever grows).
    pub fn switches(&self) -> usize {
        self.switches
    }

    pub fn new() -> ModeDetector {
        ModeDetector {
            mm: 0,
            attn: 0,
            dec: 0,
            s_attn: None,
            s_dec: None,
            reference: None,
            est_n: 0,
            hist: [(0.0, None); ESTABLISH as usize],
            persist: 0,
            mode: Mode::Train,
            recent: [f64::NEG_INFINITY; GUARD_N],
            switches: 0,
            locked: false,
        }
    }

    /// One tracked call of class `class` at `tick`; `secs` is the latest
    /// known wall (or simulated) time. O(1), no allocation.
    pub fn on_op(&mut self, class: u8, tick: u64, secs: f64) -> Option<ModeEvent> {
        match class {
            0 => self.mm += 1,
            1 => self.attn += 1,
            2 => {
                self.attn += 1;
                self.dec += 1
            }
            _ => return None,
        }
        if self.mm + self.attn < WINDOW {
            return None;
        }
        let a = self.attn as f64 / WINDOW as f64;
        // a window without attention decodes nothing: its decode share is 0
        let d = Some(if self.attn > 0 {
            self.dec as f64 / self.attn as f64
        } else {
            0.0
        });
        self.mm = 0;
        self.attn = 0;
        self.dec = 0;
        let ema = |s: Option<f64>, x: f64| Some(s.map_or(x, |s| (1.0 - ALPHA) * s + ALPHA * x));
        self.s_attn = ema(self.s_attn, a);
        if let Some(d) = d {
            self.s_dec = ema(self.s_dec, d);
        }

        let Some((ra, rd)) = self.reference else {
            // establishing: the reference is the mean of the smoothed shares
            // over ESTABLISH windows once they have stopped moving (a
            // reference taken mid-transition, e.g. while decode requests
            // ramp up after prefill, would make one change switch twice)
            let k = (self.est_n as usize) % ESTABLISH as usize;
            self.hist[k] = (self.s_attn.unwrap_or(a), self.s_dec);
            self.est_n += 1;
            if self.est_n < ESTABLISH {
                return None;
            }
            let steady = spread(self.hist.iter().map(|h| h.0)) <= STEADY
                && spread(self.hist.iter().filter_map(|h| h.1)) <= STEADY;
            if !steady && self.est_n < ESTABLISH * 8 {
                return None;
            }
            let n = ESTABLISH as f64;
            let ra = self.hist.iter().map(|h| h.0).sum::<f64>() / n;
            let (dn, dsum) = self
                .hist
                .iter()
                .filter_map(|h| h.1)
                .fold((0u32, 0.0), |(n, s), d| (n + 1, s + d));
            let rd = (dn > 0).then(|| dsum / dn as f64);
            self.reference = Some((ra, rd));
            self.s_attn = Some(ra);
            self.s_dec = rd;
            if self.switches == 0 && !self.locked {
                self.mode = if rd.unwrap_or(0.0) > 0.5 {
                    Mode::Infer
                } else {
                    Mode::Train
                };
            }
            self.persist = 0;
            return None;
        };
        let sa = self.s_attn.unwrap_or(ra);
        let sd = self.s_dec;
        let changed = (sa - ra).abs() > THRESHOLD
            || match (sd, rd) {
                (Some(s), Some(r)) => (s - r).abs() > THRESHOLD,
                // decode attention appearing where there was none
                (Some(s), None) => s > THRESHOLD,
                _ => false,
            };
        if !changed {
            self.persist = 0;
            return None;
        }
        self.persist += 1;
        if self.persist < PERSIST || self.locked {
            return None;
        }
        self.persist = 0;
        // the mode the shares now describe: serving when decode attention
        // (incremental attention, KV-cache writes) is a real part of the
        // attention; a change that keeps the mode (prefill to decode, a new
        // sequence length) only moves the reference
        let to = if sd.unwrap_or(0.0) > THRESHOLD {
            Mode::Infer
        } else {
            Mode::Train
        };
        if to == self.mode {
            self.reference = None;
            self.est_n = 0;
            return None;
        }
        if self.recent.iter().filter(|&&t| t > secs - GUARD_S).count() >= GUARD_N {
            self.locked = true;
            return Some(ModeEvent::Locked {
                mode: self.mode,
                tick,
                secs,
            });
        }
        self.recent.rotate_left(1);
        self.recent[GUARD_N - 1] = secs;
        self.switches += 1;
        let from = self.mode;
        self.mode = to;
        self.reference = None;
        self.est_n = 0;
        Some(ModeEvent::Switch {
            from,
            to: self.mode,
            tick,
            before: (ra, rd.unwrap_or(0.0)),
            after: (sa, sd.unwrap_or(0.0)),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A training step of `layers` layers: forward q,k,v,o matmuls +
    /// attention + 3 MLP matmuls with norms and adds between; backward twice
    /// the matmuls and an attention grad; then optimizer ops.
    pub(crate) fn train_step(layers: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for _ in 0..layers {
            v.extend([3, 0, 0, 0, 1, 0, 4, 3, 0, 5, 0, 0, 4]);
        }
        for _ in 0..layers {
            v.extend([0, 0, 0, 0, 0, 0, 5, 4, 0, 0, 1, 0, 0, 0, 0, 3]);
        }
        v.extend([8; 6]);
        v
    }

    /// A decode step: per layer q,k,v matmuls, decode attention, o and MLP.
    pub(crate) fn decode_step(layers: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for _ in 0..layers {
            v.extend([3, 0, 0, 0, 2, 0, 4, 3, 0, 5, 0, 0, 4]);
        }
        v
    }

    fn run(d: &mut ModeDetector, ops: &[u8], tick: &mut u64, secs: f64, out: &mut Vec<ModeEvent>) {
        for &c in ops {
            *tick += 1;
            if let Some(e) = d.on_op(c, *tick, secs) {
                out.push(e);
            }
        }
    }

    #[test]
    fn steady_training_never_switches() {
        let mut d = ModeDetector::new();
        let (mut t, mut ev) = (0, Vec::new());
        for s in 0..50 {
            run(&mut d, &train_step(4 + s % 3), &mut t, s as f64, &mut ev);
        }
        assert!(ev.is_empty(), "{ev:?}");
        assert_eq!(d.mode, Mode::Train);
    }

    #[test]
    fn train_then_infer_switches_exactly_once() {
        let mut d = ModeDetector::new();
        let (mut t, mut ev) = (0, Vec::new());
        for s in 0..30 {
            run(&mut d, &train_step(4), &mut t, s as f64, &mut ev);
        }
        assert!(ev.is_empty());
        for s in 0..300 {
            run(
                &mut d,
                &decode_step(4),
                &mut t,
                30.0 + s as f64 * 0.1,
                &mut ev,
            );
        }
        assert_eq!(ev.len(), 1, "{ev:?}");
        match ev[0] {
            ModeEvent::Switch {
                from: Mode::Train,
                to: Mode::Infer,
                after,
                ..
            } => assert!(after.1 > 0.3),
            e => panic!("{e:?}"),
        }
        assert!(ev[0]
            .text(30.0)
            .starts_with("predictive: mode train -> infer at tick "));
        assert_eq!(d.mode, Mode::Infer);
    }

    #[test]
    fn thrash_guard_locks_after_two_switches_in_a_minute() {
        let mut d = ModeDetector::new();
        let (mut t, mut ev) = (0, Vec::new());
        let mut secs = 0.0;
        for phase in 0..8 {
            for _ in 0..20 {
                let ops = if phase % 2 == 0 {
                    train_step(4)
                } else {
                    decode_step(8)
                };
                run(&mut d, &ops, &mut t, secs, &mut ev);
                secs += 0.25;
            }
        }
        let switches = ev
            .iter()
            .filter(|e| matches!(e, ModeEvent::Switch { .. }))
            .count();
        let locks = ev
            .iter()
            .filter(|e| matches!(e, ModeEvent::Locked { .. }))
            .count();
        assert_eq!((switches, locks), (2, 1), "{ev:?}");
        assert!(matches!(
            ev[2],
            ModeEvent::Locked {
                mode: Mode::Train,
                ..
            }
        ));
        assert!(d.locked);
    }

    #[test]
    fn switches_spread_over_minutes_are_not_locked() {
        let mut d = ModeDetector::new();
        let (mut t, mut ev) = (0, Vec::new());
        let mut secs = 0.0;
        for phase in 0..5 {
            for _ in 0..20 {
                let ops = if phase % 2 == 0 {
                    train_step(4)
                } else {
                    decode_step(8)
                };
                run(&mut d, &ops, &mut t, secs, &mut ev);
                secs += 2.0;
            }
        }
        assert_eq!(ev.len(), 4, "{ev:?}");
        assert!(ev.iter().all(|e| matches!(e, ModeEvent::Switch { .. })));
        assert!(!d.locked);
    }

    #[test]
    fn prefill_then_decode_then_training_switches_twice() {
        // serving as u3m synth writes it: per layer a KV-cache write (decode
        // class) and a prefill attention per request, then decode steps
        let prefill: Vec<u8> = (0..4)
            .flat_map(|_| [3, 0, 0, 0, 2, 1, 0, 4, 3, 0, 5, 0, 0, 4])
            .collect();
        let mut d = ModeDetector::new();
        let (mut t, mut ev) = (0, Vec::new());
        let mut secs = 0.0;
        for _ in 0..30 {
            run(&mut d, &train_step(4), &mut t, secs, &mut ev);
            secs += 1.0;
        }
        for _ in 0..8 {
            run(&mut d, &prefill, &mut t, secs, &mut ev);
            secs += 0.2;
        }
        for _ in 0..100 {
            run(&mut d, &decode_step(4), &mut t, secs, &mut ev);
            secs += 0.1;
        }
        for _ in 0..30 {
            run(&mut d, &train_step(4), &mut t, secs, &mut ev);
            secs += 1.0;
        }
        let modes: Vec<(Mode, Mode)> = ev
            .iter()
            .map(|e| match *e {
                ModeEvent::Switch { from, to, .. } => (from, to),
                e => panic!("{e:?}"),
            })
            .collect();
        assert_eq!(
            modes,
            vec![(Mode::Train, Mode::Infer), (Mode::Infer, Mode::Train)],
            "{ev:?}"
        );
    }
}
