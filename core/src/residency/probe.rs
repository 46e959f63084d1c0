//! The read-once probe (issue 11 bullet 2, `U3M_HOST_MAP=probe`): whether
//! mapping read-once streams beats copying them is measured, not guessed.
//!
//! A host-mapped chunk costs no copy-in and evicts nothing, but its reads
//! cross the link inside the operator that makes them, on the program's
//! stream; a copy-in runs on u3m's stream beside the device's other work.
//! So mapping wins only where the compute a step could hide copies under is
//! smaller than the link time mapping saves — u3m cannot see compute time,
//! but the device can time a stretch of calls. While read-once candidates
//! exist, the probe runs a window of calls with mapping and one with
//! copies, each after a settling stretch (the switch's own moves), times
//! both by events on the program's stream (aclrtEventElapsedTime), and
//! keeps the faster for a hold that grows while the verdict repeats.
//! Mapping must win by `MARGIN`, twice in a row (the second probe in the
//! other order), to be chosen. A runtime that cannot time events leaves it
//! on copies.
//!
//! Not the default: on the simulator the best case (decode over weights
//! 2 × HBM) gains ~2 % from mapping while a probe's window of the losing arm
//! and its switches cost 2–6 % where copies win (BENCHMARKS.md, "The
//! read-once probe").
//!
//! This module is the pure state machine; `hostmap.rs` records and reads
//! the events it asks for.

/// What `map_streams` does with read-once candidates now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    /// Copy them in (the plain path; candidates are only counted).
    Copy,
    /// Map them at their device addresses and read them over the link.
    Map,
}

/// Calls per measured window, and before it for the switch to settle.
pub const WINDOW: u64 = 2048;
pub const SETTLE: u64 = 512;
/// Candidates a window of copies must meet before a probe is worth its cost.
pub const MIN_SEEN: u64 = 16;
/// Mapping must be this much faster per call to be chosen.
pub const MARGIN: f64 = 0.03;
/// Windows a verdict is kept before probing again: from `HOLD_MIN`,
/// ×4 while the verdict repeats, up to `HOLD_MAX` (a probe of the losing
/// arm costs its window: a run of 1,000 LoRA steps probes 5 times).
pub const HOLD_MIN: u64 = 4;
pub const HOLD_MAX: u64 = 256;

/// What the caller must do at this call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// Record a mark (an event on the calling stream) before this call:
    /// the start of a measured window.
    Start,
    /// Record the end mark of the measured window of this arm.
    End(Arm),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Running `arm` as the verdict for `left` more calls (counting
    /// candidates when it is `Copy`).
    Hold { left: u64 },
    /// Running `arm` unmeasured for `left` calls, then measuring it.
    Settle { left: u64, first: bool },
    /// Measuring `arm` for `left` more calls since the start mark.
    Measure { left: u64, first: bool },
    /// Both windows marked; waiting for the device to time them.
    Verdict,
    /// The runtime cannot time events: copies for good.
    Off,
}

pub struct Probe {
    pub arm: Arm,
    phase: Phase,
    /// Candidates counted in the current hold of copies.
    seen: u64,
    hold: u64,
    /// ns per call of each arm in the probe under way.
    copy_ns: Option<f64>,
    map_ns: Option<f64>,
    /// Which arm a probe starts with (alternates, so neither always
    /// follows the other's moves).
    map_first: bool,
    /// The last verdict.
    last: Option<Arm>,
    /// A verdict for mapping awaits its confirmation.
    confirming: bool,
    /// Verdicts given (counters).
    pub probes: u64,
    pub map_verdicts: u64,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            arm: Arm::Copy,
            phase: Phase::Hold { left: WINDOW },
            seen: 0,
            hold: HOLD_MIN,
            copy_ns: None,
            map_ns: None,
            map_first: true,
            last: None,
            confirming: false,
            probes: 0,
            map_verdicts: 0,
        }
    }
}

impl Probe {
    /// One tracked call of the probed device is about to run.
    pub fn tick(&mut self) -> Step {
        match self.phase {
            Phase::Hold { left } if left > 1 => {
                self.phase = Phase::Hold { left: left - 1 };
                Step::Nothing
            }
            Phase::Hold { .. } => {
                // a hold of copies with no candidates: nothing to probe
                if self.arm == Arm::Copy && self.seen < MIN_SEEN {
                    self.seen = 0;
                    self.phase = Phase::Hold { left: WINDOW };
                    return Step::Nothing;
                }
                self.seen = 0;
                self.copy_ns = None;
                self.map_ns = None;
                self.arm = if self.map_first { Arm::Map } else { Arm::Copy };
                self.map_first = !self.map_first;
                self.phase = Phase::Settle {
                    left: SETTLE,
                    first: true,
                };
                Step::Nothing
            }
            Phase::Settle { left, first } if left > 1 => {
                self.phase = Phase::Settle {
                    left: left - 1,
                    first,
                };
                Step::Nothing
            }
            Phase::Settle { first, .. } => {
                self.phase = Phase::Measure {
                    left: WINDOW,
                    first,
                };
                Step::Start
            }
            Phase::Measure { left, first } if left > 1 => {
                self.phase = Phase::Measure {
                    left: left - 1,
                    first,
                };
                Step::Nothing
            }
            Phase::Measure { first, .. } => {
                // the end mark of this window; the other arm next, or wait
                let measured = self.arm;
                if first {
                    self.arm = other(self.arm);
                    self.phase = Phase::Settle {
                        left: SETTLE,
                        first: false,
                    };
                } else {
                    // copies until the device has timed both
                    self.arm = Arm::Copy;
                    self.phase = Phase::Verdict;
                }
                Step::End(measured)
            }
            Phase::Verdict | Phase::Off => Step::Nothing,
        }
    }

    /// A candidate `map_streams` would have mapped under `Map`.
    pub fn saw(&mut self, n: u64) {
        self.seen += n;
    }

    /// Whether a measured window's timing is awaited.
    pub fn waiting(&self) -> bool {
        self.phase == Phase::Verdict
    }

    /// The device's time for the measured window of `arm` over `calls`
    /// calls (from its two marks), or None: the runtime cannot time events.
    pub fn timed(&mut self, arm: Arm, ns: Option<u64>, calls: u64) {
        let Some(ns) = ns else {
            self.arm = Arm::Copy;
            self.phase = Phase::Off;
            return;
        };
        let per = ns as f64 / calls.max(1) as f64;
        match arm {
            Arm::Copy => self.copy_ns = Some(per),
            Arm::Map => self.map_ns = Some(per),
        }
        if let (Phase::Verdict, Some(c), Some(m)) = (self.phase, self.copy_ns, self.map_ns) {
            let arm = if m < c * (1.0 - MARGIN) {
                Arm::Map
            } else {
                Arm::Copy
            };
            self.probes += 1;
            self.map_verdicts += (arm == Arm::Map) as u64;
            // a switch to mapping is confirmed by a second probe in the
            // other order first (a window's timing drifts with the run:
            // contexts grow, phases of a step fall differently)
            if arm == Arm::Map && self.last != Some(Arm::Map) && !self.confirming {
                self.confirming = true;
                self.arm = Arm::Copy;
                self.seen = MIN_SEEN;
                self.phase = Phase::Hold { left: 1 };
                return;
            }
            self.confirming = false;
            // the same verdict again: hold it longer
            self.hold = if arm == self.verdict_before() {
                (self.hold * 4).min(HOLD_MAX)
            } else {
                HOLD_MIN
            };
            self.last = Some(arm);
            self.arm = arm;
            self.phase = Phase::Hold {
                left: self.hold * WINDOW,
            };
        }
    }

    fn verdict_before(&self) -> Arm {
        self.last.unwrap_or(Arm::Copy)
    }
}

/// The probe and the marks it asked for (a field of `State`).
#[derive(Default)]
pub struct Marks {
    pub probe: Probe,
    /// The device probed: the first whose calls met candidates (marks on
    /// one device's streams time one device).
    pub dev: Option<u32>,
    /// The start mark of the window being measured (an event holding a
    /// reference of its own).
    pub open: Option<u64>,
    /// Measured windows whose end mark the device has not reached yet:
    /// (start event, end event, arm).
    pub pending: Vec<(u64, u64, Arm)>,
}

fn other(a: Arm) -> Arm {
    match a {
        Arm::Copy => Arm::Map,
        Arm::Map => Arm::Copy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the probe through `calls` calls; the device answers each
    /// measured window with `per_call(arm)` ns per call.
    fn run(
        p: &mut Probe,
        calls: u64,
        seen_per_call: u64,
        per_call: impl Fn(Arm) -> u64,
    ) -> Vec<Arm> {
        let mut arms = Vec::new();
        for _ in 0..calls {
            match p.tick() {
                Step::End(arm) => p.timed(arm, Some(per_call(arm) * WINDOW), WINDOW),
                Step::Start | Step::Nothing => {}
            }
            if p.arm == Arm::Copy {
                p.saw(seen_per_call);
            }
            arms.push(p.arm);
        }
        arms
    }

    #[test]
    fn no_candidates_never_probe() {
        let mut p = Probe::default();
        let arms = run(&mut p, 20 * WINDOW, 0, |_| 100);
        assert!(arms.iter().all(|&a| a == Arm::Copy));
        assert_eq!(p.probes, 0);
    }

    #[test]
    fn mapping_is_kept_only_where_it_is_faster() {
        // faster by 10 %: chosen, and held longer as the verdict repeats
        let mut p = Probe::default();
        let arms = run(&mut p, 200 * WINDOW, 1, |a| {
            if a == Arm::Map {
                90
            } else {
                100
            }
        });
        assert!(
            p.probes >= 2 && p.map_verdicts == p.probes,
            "{} {}",
            p.probes,
            p.map_verdicts
        );
        let mapped = arms.iter().filter(|&&a| a == Arm::Map).count() as f64 / arms.len() as f64;
        assert!(mapped > 0.85, "mapped {mapped}");
        // slower by 20 %: copies, mapping only while probing
        let mut p = Probe::default();
        let arms = run(&mut p, 200 * WINDOW, 1, |a| {
            if a == Arm::Map {
                120
            } else {
                100
            }
        });
        assert!(p.probes >= 2 && p.map_verdicts == 0);
        let mapped = arms.iter().filter(|&&a| a == Arm::Map).count() as f64 / arms.len() as f64;
        assert!(mapped < 0.10, "mapped {mapped}");
        // within the margin: copies (mapping must pay for its risk)
        let mut p = Probe::default();
        run(
            &mut p,
            50 * WINDOW,
            1,
            |a| if a == Arm::Map { 99 } else { 100 },
        );
        assert_eq!(p.map_verdicts, 0);
    }

    #[test]
    fn a_runtime_that_cannot_time_keeps_copying() {
        let mut p = Probe::default();
        for _ in 0..10 * WINDOW {
            if let Step::End(arm) = p.tick() {
                p.timed(arm, None, WINDOW);
            }
            p.saw(1);
        }
        assert_eq!(p.arm, Arm::Copy);
        assert_eq!(p.phase, Phase::Off);
    }

    #[test]
    fn the_verdict_waits_for_both_timings() {
        let mut p = Probe::default();
        let mut ends = Vec::new();
        for _ in 0..WINDOW + 2 * (SETTLE + WINDOW) + 10 {
            if let Step::End(arm) = p.tick() {
                ends.push(arm);
            }
            p.saw(1);
        }
        assert_eq!(ends, vec![Arm::Map, Arm::Copy]);
        assert!(p.waiting() && p.arm == Arm::Copy);
        p.timed(Arm::Copy, Some(100 * WINDOW), WINDOW);
        assert!(p.waiting());
        p.timed(Arm::Map, Some(50 * WINDOW), WINDOW);
        // mapping won: confirmed by a second probe before it is adopted
        assert!(!p.waiting() && p.arm == Arm::Copy && p.probes == 1);
        let mut ends = Vec::new();
        for _ in 0..2 * (SETTLE + WINDOW) + 10 {
            if let Step::End(arm) = p.tick() {
                ends.push(arm);
            }
        }
        assert_eq!(ends, vec![Arm::Copy, Arm::Map], "the other order");
        p.timed(Arm::Copy, Some(100 * WINDOW), WINDOW);
        p.timed(Arm::Map, Some(50 * WINDOW), WINDOW);
        assert!(p.arm == Arm::Map && p.probes == 2 && p.map_verdicts == 2);
    }
}

#[cfg(test)]
mod confirm_tests {
    use super::*;

    #[test]
    fn one_lucky_window_for_mapping_is_not_enough() {
        // the first probe times mapping faster, the confirmation does not
        let mut p = Probe::default();
        let mut n = 0;
        for _ in 0..40 * WINDOW {
            if let Step::End(arm) = p.tick() {
                n += 1;
                let ns = match (arm, n) {
                    (Arm::Map, 1) => 50,
                    (Arm::Map, _) => 120,
                    (Arm::Copy, _) => 100,
                };
                p.timed(arm, Some(ns * WINDOW), WINDOW);
            }
            if p.arm == Arm::Copy {
                p.saw(1);
            }
        }
        assert!(
            p.probes >= 2 && p.map_verdicts == 1,
            "{} {}",
            p.probes,
            p.map_verdicts
        );
        assert_eq!(p.arm, Arm::Copy);
    }
}
