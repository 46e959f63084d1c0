//! U3M_PLAN=auto: the library plans its own schedule of evictions from the
//! program it watches, where U3M_PLAN=FILE follows one planned offline.
//!
//! A training or serving loop repeats its steps call for call (the same
//! operators on the same caching-allocator blocks). So, per device:
//! 1. *Detect.* Each call that touches managed memory gets a signature (a
//!    hash of its chunks and how it touches them). The step is found when
//!    the last P signatures equal the P before them (P at least
//!    `MIN_PERIOD`, at most `MAX_PERIOD` calls).
//! 2. *Record.* The next P calls are recorded — their chunks and touches —
//!    each checked against its signature one period back (a mismatch: back
//!    to detecting). An event on the call's stream at each end of the
//!    recorded step gives its device time (`Runtime::elapsed_ns`, read by a
//!    later call once the closing event is complete; a runtime that cannot
//!    time events: 1 µs per call).
//! 3. *Plan,* on a thread of its own: the recorded
//!    step as a cycle goes to `planner::plan`, each call taking the step's
//!    mean device time (u3m cannot see one operator's time; the planner's
//!    schedule barely depends on it: BENCHMARKS.md, forty-second sitting),
//!    HBM the device's capacity, the link U3M_LINK_GBPS each way.
//! 4. *Follow.* The plan becomes a `Schedule` that repeats every step from
//!    the recorded one on (`repeat`), installed by the first call of the
//!    third step after the recorded one (a set call: a run plans and
//!    follows the same way every time; that call waits for the planning
//!    thread if it is not done), and `follow_schedule` follows it as a
//!    file's; the first entry the run does not match stops it, as a file's.
//!
//! Only the first device that finds its step plans (the clock the schedule
//! counts is every device's: schedule.rs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::planner::{self, Key, Params, Step};
use super::schedule::{Entry, Schedule};
use super::Followed;
use crate::engine::runtime::{Runtime, CHUNK};
use crate::policy::predictor::KeyMap;
use crate::policy::Touch;

/// The shortest step that is planned (shorter loops fit no useful plan).
const MIN_PERIOD: usize = 4;
/// The longest step looked for, in calls (the signature ring's length is
/// twice that).
const MAX_PERIOD: usize = 1 << 16;
/// The most chunk touches a recorded step may hold (a bound on memory:
/// 24 bytes each).
const MAX_TOUCHES: usize = 1 << 24;

/// What auto planning has done so far (`Residency::auto_plan`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AutoState {
    /// The step found, in calls (0: none yet).
    pub period: u64,
    /// The clock of the recorded step's first call (0: not recorded).
    pub from: u64,
    /// Its device time, µs (0: not timed; the call count when the runtime
    /// cannot time events).
    pub step_us: f64,
    /// Chunk-gaps out per step in the plan (0: not planned yet).
    pub entries: u64,
    /// Why there is no plan, when planning failed.
    pub failed: Option<String>,
    /// The device time of the first step followed, µs (0: not judged yet).
    pub planned_us: f64,
    /// The schedule was dropped: that step took longer than the recorded
    /// one (it is not followed from then on).
    pub dropped: bool,
}

/// Settings of the planner (U3M_PLAN_MIN_GAP_US, U3M_LINK_GBPS).
#[derive(Clone, Copy, Debug)]
pub struct AutoParams {
    pub min_gap_us: f64,
    pub link_gbps: f64,
}

enum Phase {
    Detect,
    Record,
    /// Recorded: waiting for the step's closing event, to time it.
    Timing,
    /// On the planning thread, installed at a set call.
    Planning,
    /// Installed: the first step it runs is timed and judged against the
    /// recorded one.
    Judging,
    /// Judged, or given up: nothing more to do.
    Done,
}

/// One device's detection and recording (behind the device's lock).
pub(super) struct Recorder {
    phase: Phase,
    /// Signatures of the last `2 * MAX_PERIOD` calls, by call count.
    sigs: Vec<u64>,
    /// Calls seen.
    t: usize,
    /// Where each signature was last seen (call count).
    seen: KeyMap<usize>,
    /// The candidate period and how many calls in a row matched it.
    cand: usize,
    run: usize,
    /// Recording: the first call's count, the clocks of the recorded calls,
    /// their touches (call offset, chunk, touch).
    start_t: usize,
    clocks: Vec<u64>,
    touches: Vec<(u32, (u64, u32), Touch)>,
    /// Events at the recorded step's two ends (0: none), and the stream.
    ev: (u64, u64),
    stream: u64,
    /// The recorded step, while it is timed.
    recorded: Option<Recorded>,
    /// The recorded step's first clock and its length in clock ticks.
    from: u64,
    period: u64,
    /// The planning thread.
    planning: Option<std::thread::JoinHandle<Planned>>,
}

impl Recorder {
    pub(super) fn new() -> Recorder {
        Recorder {
            phase: Phase::Detect,
            sigs: vec![0; 2 * MAX_PERIOD],
            t: 0,
            seen: KeyMap::default(),
            cand: 0,
            run: 0,
            start_t: 0,
            clocks: Vec::new(),
            touches: Vec::new(),
            ev: (0, 0),
            stream: 0,
            recorded: None,
            from: 0,
            period: 0,
            planning: None,
        }
    }

    /// Done with detecting: its memory goes.
    fn forget(&mut self) {
        self.sigs = Vec::new();
        self.seen = KeyMap::default();
    }
}

/// U3M_PLAN=auto's state, shared by every device (`Followed::auto`).
pub(super) struct Auto {
    pub(super) params: AutoParams,
    pub(super) state: Mutex<AutoState>,
    /// Set by the first device to record a step: the others stop looking.
    claimed: AtomicBool,
}

impl Auto {
    pub(super) fn new(params: AutoParams) -> Auto {
        Auto {
            params,
            state: Mutex::new(AutoState::default()),
            claimed: AtomicBool::new(false),
        }
    }
}

/// A call's signature: its chunks and how it touches each.
fn signature(chunks: &[(u64, u32)], touches: &[Touch]) -> u64 {
    // (a multiply-rotate mix per chunk: collisions only cost a failed
    // detection, which the recording's checks catch)
    let mix = |h: u64, x: u64| (h ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    let mut h = mix(0, chunks.len() as u64);
    for (&(id, i), t) in chunks.iter().zip(touches) {
        let how = t.writes() as u64 | (t.whole() as u64) << 1;
        h = mix(h, id);
        h = mix(h, (i as u64) << 2 | how);
    }
    h
}

/// A call just queued at `clock` on device `dev` of `cap` chunks of HBM
/// (`finish`, the device's lock held): detection, recording, timing; the
/// plan starts on its thread once the recorded step is timed (by the end
/// of the step after it), and is installed in `f` by the first call of the
/// third step after the recorded one — a set call, so that a run is the
/// same run every time (that call waits for the planning thread if it has
/// not finished).
pub(super) fn note_call(
    rec: &mut Recorder,
    f: &Arc<Followed>,
    rt: &dyn Runtime,
    (dev, cap, clock): (u32, u64, u64),
    (chunks, touches): (&[(u64, u32)], &[Touch]),
    stream: Option<u64>,
) {
    let Some(auto) = &f.auto else { return };
    match rec.phase {
        Phase::Done => return,
        Phase::Timing => {
            let b = rec.ev.1;
            // (the recorded step has run by the next step's end)
            let due = clock >= rec.from + 2 * rec.period;
            if b != 0 && !due && rt.event_done(b) == Ok(false) {
                return;
            }
            if b != 0 && due {
                let _ = rt.sync_event(b);
            }
            let Some(mut r) = rec.recorded.take() else {
                rec.phase = Phase::Done;
                return;
            };
            let n = r.clocks.len();
            r.step_us = match rec.ev {
                (a @ 1.., b @ 1..) => rt.elapsed_ns(a, b).ok().filter(|&ns| ns > 0),
                _ => None,
            }
            .map_or(n as f64, |ns| ns as f64 / 1e3);
            if let Ok(mut s) = auto.state.lock() {
                s.step_us = r.step_us;
            }
            let params = auto.params;
            let (from, period) = (rec.from, rec.period);
            let run = move || plan(r, dev, cap, from, period, params);
            rec.phase = Phase::Planning;
            match std::thread::Builder::new()
                .name("u3m-plan".into())
                .spawn(run)
            {
                Ok(h) => rec.planning = Some(h),
                Err(_) => {
                    // no thread: no plan (the run goes on as without one)
                    rec.phase = Phase::Done;
                    if let Ok(mut s) = auto.state.lock() {
                        s.failed = Some("no thread to plan on".into());
                    }
                }
            }
            return;
        }
        Phase::Planning => {
            if clock < rec.from + 3 * rec.period {
                return;
            }
            rec.phase = Phase::Done;
            rec.from = clock;
            rec.ev = (0, 0);
            let planned = match rec.planning.take().map(|h| h.join()) {
                Some(Ok(p)) => p,
                _ => Err("the planning thread failed".into()),
            };
            let mut s = auto.state.lock().unwrap_or_else(|p| p.into_inner());
            match planned {
                Ok(sched) => {
                    s.entries = sched.by_dev.iter().map(|v| v.len() as u64).sum();
                    let _ = f.plan.set(sched);
                    rec.phase = Phase::Judging;
                }
                Err(e) => s.failed = Some(e),
            }
            return;
        }
        Phase::Judging => {
            // the first step under the schedule, from `rec.from` (the
            // install), judged by the end of the next
            // (`NONE`: a mark that could not be made)
            const NONE: u64 = u64::MAX;
            let at = |k: u64| rec.from + k * rec.period;
            let marked = |ev: u64| if ev == 0 { NONE } else { ev };
            if rec.ev.0 == 0 {
                rec.ev.0 = marked(mark(rt, stream.unwrap_or(0)));
            } else if rec.ev.1 == 0 && clock >= at(1) {
                rec.ev.1 = marked(mark(rt, stream.unwrap_or(0)));
            } else if rec.ev.1 != 0 && clock >= at(2) {
                rec.phase = Phase::Done;
                let (a, b) = rec.ev;
                let planned = match a != NONE && b != NONE && rt.sync_event(b).is_ok() {
                    true => rt.elapsed_ns(a, b).ok(),
                    false => None,
                };
                let mut s = auto.state.lock().unwrap_or_else(|p| p.into_inner());
                let Some(ns) = planned else { return };
                s.planned_us = ns as f64 / 1e3;
                if s.planned_us > s.step_us {
                    // the schedule made it slower: not followed from here
                    s.dropped = true;
                    let why = format!(
                        "U3M_PLAN=auto: a step under the schedule took {:.1} ms of device time, the recorded one {:.1} ms without it: dropped at call {clock}",
                        s.planned_us / 1e3,
                        s.step_us / 1e3
                    );
                    if !f.off.swap(true, Relaxed) {
                        if let Ok(mut w) = f.stopped.lock() {
                            *w = Some(why);
                        }
                    }
                }
            }
            return;
        }
        Phase::Detect | Phase::Record => {}
    }
    if matches!(rec.phase, Phase::Detect) && auto.claimed.load(Relaxed) {
        // another device found the step first: it plans, this one stops
        // looking
        rec.phase = Phase::Done;
        rec.forget();
        return;
    }
    let sig = signature(chunks, touches);
    let t = rec.t;
    rec.t += 1;
    let ring = rec.sigs.len();
    let back = |rec: &Recorder, p: usize| (p > 0 && t >= p).then(|| rec.sigs[(t - p) % ring]);
    if matches!(rec.phase, Phase::Detect) {
        if back(rec, rec.cand) == Some(sig) {
            rec.run += 1;
        } else {
            // the distance to this signature's last call is the new guess
            rec.cand = match rec.seen.get(&sig) {
                Some(&q) if t - q <= MAX_PERIOD => t - q,
                _ => 0,
            };
            rec.run = (rec.cand > 0) as usize;
        }
        if rec.cand >= MIN_PERIOD && rec.run >= rec.cand && !auto.claimed.swap(true, Relaxed) {
            // a whole period matched: record the next one
            rec.phase = Phase::Record;
            rec.start_t = t + 1;
            rec.stream = stream.unwrap_or(0);
            rec.ev.0 = mark(rt, rec.stream);
            if let Ok(mut s) = auto.state.lock() {
                s.period = rec.cand as u64;
            }
        }
    } else if back(rec, rec.cand) != Some(sig) {
        // not the step after all: look again
        rec.phase = Phase::Detect;
        rec.run = 0;
        rec.clocks.clear();
        rec.touches.clear();
        auto.claimed.store(false, Relaxed);
    } else {
        let off = (t - rec.start_t) as u32;
        rec.clocks.push(clock);
        for (&c, &w) in chunks.iter().zip(touches) {
            rec.touches.push((off, c, w));
        }
        if rec.touches.len() > MAX_TOUCHES {
            // too large to plan: given up, for good
            rec.phase = Phase::Done;
            rec.forget();
            rec.clocks = Vec::new();
            rec.touches = Vec::new();
            if let Ok(mut s) = auto.state.lock() {
                s.failed = Some(format!("the step touches more than {MAX_TOUCHES} chunks"));
            }
            return;
        }
        if rec.clocks.len() == rec.cand {
            rec.ev.1 = mark(rt, rec.stream);
            rec.phase = Phase::Timing;
            // (the clock counts every device's calls: one step of it)
            rec.from = rec.clocks[0];
            rec.period = clock - rec.from + 1;
            if let Ok(mut s) = auto.state.lock() {
                s.from = rec.from;
            }
            rec.recorded = Some(Recorded {
                clocks: std::mem::take(&mut rec.clocks),
                touches: std::mem::take(&mut rec.touches),
                step_us: 0.0,
            });
            rec.forget();
            return;
        }
    }
    rec.sigs[t % ring] = sig;
    rec.seen.insert(sig, t);
}

/// An event recorded now on `stream` (0: none could be).
fn mark(rt: &dyn Runtime, stream: u64) -> u64 {
    // (two events for the run: not returned to the runtime)
    let Ok(ev) = rt.create_event() else { return 0 };
    match rt.record_event(ev, stream) {
        Ok(()) => ev,
        Err(_) => 0,
    }
}

/// A recorded step, to plan: each call's clock and touches, and the step's
/// device time (µs; 1 per call when it could not be timed).
pub(super) struct Recorded {
    clocks: Vec<u64>,
    touches: Vec<(u32, (u64, u32), Touch)>,
    step_us: f64,
}

/// What the planning thread hands back.
type Planned = Result<Schedule, String>;

/// The planning thread: the recorded step `r` of device `dev` (`cap`
/// chunks of HBM), whose first call is at clock `from` and which lasts
/// `period` ticks, as a schedule repeating every step from it on.
fn plan(r: Recorded, dev: u32, cap: u64, from: u64, period: u64, p: AutoParams) -> Planned {
    plan_step(&r, cap, &p).map(|entries| {
        let mut by_dev = vec![Vec::new(); dev as usize + 1];
        by_dev[dev as usize] = entries;
        Schedule {
            name: format!("auto (planned on calls {from}..{})", from + period),
            by_dev,
            repeat: Some((from, period)),
        }
    })
}

/// The schedule's entries for the recorded step (uniform device times).
fn plan_step(r: &Recorded, cap: u64, p: &AutoParams) -> Result<Vec<Entry>, String> {
    let n = r.clocks.len();
    let step_us = r.step_us;
    let mut keys: HashMap<(u64, u32), u32> = HashMap::new();
    let mut names: Vec<(u64, u32)> = Vec::new();
    let mut touches = Vec::with_capacity(r.touches.len());
    for &(off, c, w) in &r.touches {
        let k = *keys.entry(c).or_insert_with(|| {
            names.push(c);
            names.len() as u32 - 1
        });
        touches.push((off, k, w));
    }
    touches.sort_unstable_by_key(|&(off, k, _)| (off, k));
    touches.dedup_by_key(|&mut (off, k, _)| (off, k));
    let step = Step {
        calls: n as u32,
        touches,
        keys: names.len() as u32,
        dev_us: vec![step_us / n as f64; n],
    };
    let params = Params {
        cap_chunks: cap,
        link_chunks_per_us: p.link_gbps * 1e3 / CHUNK as f64,
        min_gap_us: p.min_gap_us,
        key: Key::Cost,
    };
    let plan = planner::plan(&step, &params)?;
    let mut out: Vec<Entry> = plan
        .out
        .iter()
        .enumerate()
        .map(|(line, &(call, key))| {
            let (id, chunk) = names[key as usize];
            Entry {
                clock: r.clocks[call as usize],
                id,
                chunk,
                line: line as u64 + 1,
            }
        })
        .collect();
    out.sort_by_key(|e| e.clock);
    Ok(out)
}
