//! One replay: a trace through a `Residency` (the library's engine, unchanged)
//! over the simulated runtime, as libu3m.so's hooks would drive it.
//!
//! Per event: `A` → `Residency::malloc` (below U3M_MIN_BYTES: unmanaged, only
//! counted against HBM); `F` → `Residency::free`; `O`, `M`, `S` → the touched
//! ranges, translated from trace addresses to the Tier's VAs, go through
//! `prepare` (fault-in, the caller's stream waits on the copies), the call's
//! cost is queued on its stream, then `finish` (a use event on the stream).
//! The host spends the launch latency per call and never runs more than
//! `queue` calls ahead of the device (a framework's launch queue: when it is
//! full the host waits for the oldest call). Every `tick` of simulated host
//! time the library's background round runs, in the library's order: the
//! policy's tick, DRAM spill, watermarks, and prefetch when the watermarks
//! had nothing to do.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use u3m_core::config::Config;
use u3m_core::engine::runtime::{Runtime, CHUNK};
use u3m_core::engine::Range;
use u3m_core::heat::{Access, AllocKind, HeatTable};
use u3m_core::opclass;
use u3m_core::policy::Placement;
use u3m_core::residency::{Counters, Order, Residency};
use u3m_core::trace::{Body, CopyKind, Event};

/// Most input × output pairs of an operator checked for overlap; a wider
/// one writes nothing whole (src/hooks/op.rs, the same bound).
pub(super) const ALIAS_CHECK_MAX: usize = 4096;

use super::access::W;
use super::accuracy::{Accuracy, Future};
use super::cost::{Costs, Work};
use super::recording::Recording;
use super::simrt::{HostAccess, MapRec, SimCounters, SimRuntime};

/// What every run of a trace shares.
#[derive(Clone, Debug)]
pub struct Setup {
    pub costs: Costs,
    pub dram: u64,
    pub nvme: u64,
    pub min_bytes: u64,
    /// Background period in simulated ns (0: no background work).
    pub tick_ns: u64,
    pub hbm_low: f64,
    pub hbm_high: f64,
    /// Calls the host may run ahead of the device.
    pub queue: usize,
    pub sample_every: u64,
    pub windows: Vec<u64>,
    /// Predictor calibration period and re-warm time, simulated seconds
    /// (U3M_CALIB_S, U3M_WARMUP_S).
    pub calib_s: f64,
    pub warmup_s: f64,
    /// Keep a timeline (`RunOut::observed`): u3m snapshot and u3m report.
    pub observe: bool,
    /// U3M_HOST_MAP: auto (calls larger than HBM run host-mapped), stream
    /// (and read-once streams are host-mapped instead of copied in) or off.
    pub host_map: String,
    /// U3M_LOOK_AHEAD: on or off (belady always runs without it).
    pub look_ahead: String,
    /// U3M_OUT_FIRST: auto, on or off.
    pub out_first: String,
    /// U3M_HANDOFF: on or off.
    pub handoff: String,
    /// `--min-gap-us`: U3M_PLAN_MIN_GAP_US.
    pub min_gap_us: f64,
    /// Issue the trace as tests/apps/acl_replay does (`AclReplay`), not as
    /// the recorded program did.
    pub acl_replay: bool,
    /// The discard what-if (`dead::dead_after`).
    pub discard_dead: bool,
    /// The caching allocator's frees as hints (`dead::frees_after`).
    pub discard_frees: bool,
    /// `--wait-log`: list the host's waits of at least this many ns.
    pub wait_log_ns: Option<u64>,
    /// `--held`: what HBM holds at each `# train step` comment.
    pub held: bool,
    /// `--audit`: what u3m moved in each phase, and which evictions it
    /// paid for again (`audit::phases`).
    pub audit: bool,
    /// `--plan FILE`: the `plan` policy's schedule (schedule.rs).
    pub plan: Option<std::sync::Arc<super::schedule::Plan>>,
    /// `--plan-export FILE`: the plan run's entries written as U3M_PLAN's.
    pub plan_export: Option<PathBuf>,
    /// `--schedule FILE`: U3M_PLAN for every policy's run (not the
    /// baseline's), as in the library.
    pub schedule: Option<PathBuf>,
}

/// What an observed run saw over time (simulated ns throughout).
#[derive(Debug, Default)]
pub struct Observed {
    /// Host time at each trace event (index: event number).
    pub event_ns: Vec<u64>,
    /// Maps and unmaps logged before each trace event began: those of event
    /// k (and the background rounds after it) are `maps[mark[k]..mark[k+1]]`.
    pub map_mark: Vec<usize>,
    /// The Tier's maps and unmaps, in order.
    pub maps: Vec<MapRec>,
    /// Managed VA -> (device, trace address, bytes) of every allocation.
    pub origin: BTreeMap<u64, (u32, u64, u64)>,
    /// Samples after trace events and background rounds, at least
    /// `sample_step_ns` apart (the step doubles, and every other sample
    /// goes, whenever MAX_SAMPLES are reached), and one at the end.
    pub samples: Vec<Sample>,
    pub sample_step_ns: u64,
}

/// Timeline samples kept at most (a few thousand points draw a chart).
const MAX_SAMPLES: usize = 4096;

/// The tiers and the Tier's counters at one moment.
#[derive(Debug, Clone)]
pub struct Sample {
    pub t_ns: u64,
    /// Per device: (HBM in use, DRAM, NVMe) bytes; DRAM and NVMe are
    /// process-wide, reported on every device.
    pub tiers: Vec<(u64, u64, u64)>,
    pub counters: Counters,
}

/// A trace in memory: its events and their line numbers.
pub struct Trace {
    pub name: String,
    pub events: Vec<Event>,
    pub lines: Vec<u64>,
    pub devices: usize,
    /// Its `# free` comments (`dead::frees_after`), read from the file by
    /// the first run that asks: the baseline and each policy share them.
    pub frees: std::sync::OnceLock<Result<super::dead::Frees, String>>,
}

/// What one run measured.
pub struct RunOut {
    pub tier: Counters,
    pub sim: SimCounters,
    /// Chunks the background spill moved from DRAM to NVMe.
    pub spilled: u64,
    pub total_ns: u64,
    pub log: Vec<(u64, u64, u3m_core::policy::Touch)>,
    pub accuracy: Option<Accuracy>,
    /// (simulated seconds, line) of each policy event.
    pub events: Vec<(f64, String)>,
    pub ticks: u64,
    pub peak_hbm: u64,
    /// Chunk arrivals in HBM (first touches included) per allocation tag
    /// (`tag=` of the `A` event; "-" without one).
    pub arrivals_by_tag: BTreeMap<String, u64>,
    /// Bytes the Tier copied in and out per allocation tag (`SimRt::copies`).
    pub copies_by_tag: BTreeMap<String, [u64; 2]>,
    /// The host's waits `Setup::wait_log_ns` asked for.
    pub long_waits: Vec<super::simrt::LongWait>,
    /// What HBM held at each `# train step` comment (`Setup::held`).
    pub held: Vec<super::held::Held>,
    /// What u3m moved in each phase (`Setup::audit`).
    pub audit: Vec<super::audit::Phase>,
    /// The timeline, when `Setup::observe` asked for it.
    pub observed: Option<Observed>,
}

/// A trace allocation: where it lives in the Tier (None: unmanaged).
struct Alloc {
    bytes: u64,
    va: Option<u64>,
    /// acl_replay's order tracker of the allocation
    tr: Tracker,
}

/// acl_replay's cross-stream order (tests/apps/acl_replay.c, `need`,
/// `deps_before`, `touch_after`): per allocation or host buffer, the last
/// writer and the readers since, as (stream slot, the stream's access count).
#[derive(Default, Clone)]
struct Tracker {
    wr: Option<(usize, u64)>,
    rd: Vec<(usize, u64)>,
}

/// One of acl_replay's streams.
struct AStream {
    dev: u32,
    sim: u64,
    /// accesses issued; the count when last synchronised by the host
    seq: u64,
    synced: u64,
    /// per stream slot: its count this stream last waited for
    waited: HashMap<usize, u64>,
}

/// acl_replay's state (`Setup::acl_replay`).
#[derive(Default)]
struct AclReplay {
    streams: Vec<AStream>,
    slot: HashMap<(u32, u32), usize>,
    /// host buffers by trace host address, and the D2H copies into them
    /// whose bytes acl_replay hashes once complete (in trace order)
    host: HashMap<u64, (Tracker, Option<usize>)>,
    pend: VecDeque<u64>,
    events: usize,
}

/// acl_replay's EVENT_BATCH: after this many events it synchronises every
/// stream (and destroys them).
const EVENT_BATCH: usize = 1024;

/// The most background periods one round covers (the library's
/// MAX_PERIODS, core/src/engine/publish.rs).
const MAX_PERIODS: u64 = 1000;

/// How far ahead (tracked calls) the background prefetch looks: the
/// library's PREFETCH_HORIZON (core/src/engine/mod.rs).
const PREFETCH_HORIZON: u64 = 256;

/// Offset added to simulated time for the heat table (its clock starts at 1 s,
/// like a process that has been up a moment).
const HEAT_EPOCH_NS: u64 = 1_000_000_000;

/// What a call costs, once the part of its memory in host-mapped memory is known.
enum Cost {
    Op {
        flops: u64,
        bytes: u64,
    },
    /// A host↔device copy of the program's (true: to the device).
    Link(u64, bool),
    D2d(u64),
    Memset(u64),
}

impl Cost {
    fn work(&self, c: &Costs, h: &HostAccess) -> Work {
        match *self {
            Cost::Op { flops, bytes } => c.op_work(flops, bytes, h),
            Cost::Link(b, to_device) => c.copy_work(b, to_device, h),
            Cost::D2d(b) => c.d2d_work(b, h),
            Cost::Memset(b) => c.memset_work(b, h),
        }
    }
}

/// The library's configuration for a replay: tier mode, the replay's tier
/// sizes and watermarks, policy parameters.
pub fn config(s: &Setup, swap: Option<&PathBuf>) -> Result<Config, String> {
    let mut v: Vec<(String, String)> = vec![
        ("U3M_MODE".into(), "tier".into()),
        // a trace's footprint is what it is: the Tier must never refuse it
        ("U3M_OVERSUB".into(), "64".into()),
        ("U3M_ALLOC_WAIT_MS".into(), "0".into()),
        ("U3M_DRAM_BYTES".into(), s.dram.to_string()),
        ("U3M_MIN_BYTES".into(), s.min_bytes.to_string()),
        ("U3M_LOG".into(), "quiet".into()),
        ("U3M_HBM_LOW".into(), s.hbm_low.to_string()),
        ("U3M_HBM_HIGH".into(), s.hbm_high.to_string()),
        ("U3M_CALIB_S".into(), s.calib_s.to_string()),
        ("U3M_WARMUP_S".into(), s.warmup_s.to_string()),
        ("U3M_HOST_MAP".into(), s.host_map.clone()),
        ("U3M_LOOK_AHEAD".into(), s.look_ahead.clone()),
        ("U3M_OUT_FIRST".into(), s.out_first.clone()),
        ("U3M_HANDOFF".into(), s.handoff.clone()),
        // (U3M_PLAN=auto's planner, for `--schedule auto`)
        (
            "U3M_PLAN_MIN_GAP_US".into(),
            (s.min_gap_us as u64).to_string(),
        ),
        ("U3M_LINK_GBPS".into(), s.costs.link_gbps.to_string()),
    ];
    if let Some(d) = swap {
        v.push(("U3M_SWAP_DIR".into(), d.display().to_string()));
        v.push(("U3M_SWAP_BYTES".into(), s.nvme.to_string()));
    }
    Config::from_vars(v).map_err(|e| e.to_string())
}

/// The baseline's HBM: as good as unlimited.
pub const UNLIMITED: u64 = 1 << 60;

/// Replays `trace` with HBM `hbm` bytes per device (`UNLIMITED`: the
/// baseline) and `policy`. `future`: the baseline's access log, for
/// precision/recall.
pub fn run(
    trace: &Trace,
    s: &Setup,
    hbm: u64,
    policy: Box<dyn Placement>,
    future: Option<&Future>,
    plan: Option<&super::schedule::Armer>,
) -> Result<RunOut, String> {
    // the Tier keeps a &'static runtime (libu3m.so's lives for the process);
    // one small leak per run
    let rt: &'static SimRuntime = Box::leak(Box::new(SimRuntime::new(s.costs, trace.devices, hbm)));
    if let Some(min) = s.wait_log_ns {
        rt.set_wait_log(min);
    }
    let swap = if s.nvme > 0 && hbm != UNLIMITED {
        let d = std::env::temp_dir().join(format!(
            "u3m-replay.{}.{}",
            std::process::id(),
            rt as *const _ as usize
        ));
        std::fs::create_dir_all(&d)
            .map_err(|e| format!("NVMe swap directory {}: {e}", d.display()))?;
        Some(d)
    } else {
        None
    };
    let r = run_in(
        trace,
        s,
        rt,
        swap.as_ref(),
        policy,
        future,
        hbm == UNLIMITED,
        plan,
    );
    if let Some(d) = swap {
        let _ = std::fs::remove_dir_all(d);
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn run_in(
    trace: &Trace,
    s: &Setup,
    rt: &'static SimRuntime,
    swap: Option<&PathBuf>,
    policy: Box<dyn Placement>,
    future: Option<&Future>,
    baseline: bool,
    plan: Option<&super::schedule::Armer>,
) -> Result<RunOut, String> {
    let mut cfg = config(s, swap)?;
    // (the baseline is the trace's truth: no schedule)
    if !baseline {
        cfg.plan = s.schedule.clone();
    }
    if s.observe {
        rt.log_maps();
    }
    let (rec, log) = Recording::new(policy);
    let tier = Residency::with_policy(rt, &cfg, Box::new(rec))?;
    // belady is MIN, the demand-paging optimum the others' bytes are
    // measured against: no look-ahead prefetch (it can only add bytes)
    // (plan: the schedule's evictions and demand paging, as belady's)
    if matches!(tier.policy().name(), "belady" | "plan") {
        tier.set_look_ahead(false);
    }
    let heat = Arc::new(HeatTable::new(cfg.max_allocs, cfg.max_ranges));
    let clock = Arc::new(AtomicU64::new(HEAT_EPOCH_NS));
    {
        let (heat, clock) = (heat.clone(), clock.clone());
        tier.set_heat_fn(Box::new(move |va| {
            heat.chunk_info(va)
                .map(|c| c.heat(clock.load(Relaxed)))
                .unwrap_or(0.0)
        }));
    }
    let mut d = Driver {
        trace,
        s,
        rt,
        tier: &tier,
        heat: &heat,
        clock: &clock,
        allocs: (0..trace.devices).map(|_| BTreeMap::new()).collect(),
        live: BTreeMap::new(),
        streams: HashMap::new(),
        queue: VecDeque::new(),
        next_bg: s.tick_ns,
        demand_seen: 0,
        seq: 0,
        spilled: 0,
        events: Vec::new(),
        accuracy: future.map(|_| Accuracy::new(s.sample_every, &s.windows)),
        future,
        last_tick: 0,
        tags: BTreeMap::new(),
        observed: s.observe.then(Observed::default),
        ar: AclReplay::default(),
        every_whole: baseline,
        held: Vec::new(),
        audit: Vec::new(),
        plan,
    };
    let r = d.replay();
    if let Some(why) = tier.schedule_stopped() {
        // (as the library says it at exit; the counters are in the JSON)
        eprintln!("u3m replay: {}: {why}", tier.policy().name());
    }
    d.sample();
    let held = std::mem::take(&mut d.held);
    let audit = if s.audit {
        d.close_audit_phase();
        let tags = &d.tags;
        super::audit::phases(&d.audit, tier.now(), |k| tag_at(tags, k).to_string())
    } else {
        Vec::new()
    };
    let (spilled, events, accuracy) = (d.spilled, std::mem::take(&mut d.events), d.accuracy.take());
    let tags = std::mem::take(&mut d.tags);
    let mut observed = d.observed.take();
    drop(d);
    let tag_of = |va: u64| tag_at(&tags, va).to_string();
    let mut arrivals_by_tag = BTreeMap::new();
    for (va, n) in rt.arrivals() {
        *arrivals_by_tag.entry(tag_of(va)).or_insert(0) += n as u64;
    }
    let mut copies_by_tag: BTreeMap<String, [u64; 2]> = BTreeMap::new();
    for (va, [i, o]) in rt.copies() {
        let e = copies_by_tag.entry(tag_of(va)).or_default();
        e[0] += i;
        e[1] += o;
    }
    let total_ns = rt.finish();
    if let Some(o) = observed.as_mut() {
        o.maps = rt.take_maps();
    }
    tier.shutdown();
    let out = RunOut {
        tier: tier.counters(),
        sim: rt.counters(),
        spilled,
        total_ns,
        log: std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner())),
        accuracy,
        events,
        ticks: tier.now(),
        peak_hbm: (0..trace.devices as u32)
            .map(|d| rt.peak(d))
            .max()
            .unwrap_or(0),
        arrivals_by_tag,
        copies_by_tag,
        long_waits: rt.long_waits(),
        held,
        audit,
        observed,
    };
    drop(tier);
    r.map(|()| out)
}

/// The tag of the managed VA range holding `va` ("-": none or untagged).
fn tag_at(tags: &BTreeMap<u64, (u64, String)>, va: u64) -> &str {
    tags.range(..=va)
        .next_back()
        .filter(|(&s, (len, _))| va < s + len)
        .map_or("-", |(_, (_, t))| t.as_str())
}

struct Driver<'a> {
    trace: &'a Trace,
    s: &'a Setup,
    rt: &'static SimRuntime,
    tier: &'a Residency,
    heat: &'a HeatTable,
    clock: &'a AtomicU64,
    /// per device: trace address -> allocation
    allocs: Vec<BTreeMap<u64, Alloc>>,
    /// managed VA -> bytes, for precision/recall
    live: BTreeMap<u64, u64>,
    /// (device, trace stream) -> simulated stream
    streams: HashMap<(u32, u32), u64>,
    /// end times of the calls in the launch queue
    queue: VecDeque<u64>,
    next_bg: u64,
    /// the Tier's demand count at the last background round
    demand_seen: u64,
    seq: u64,
    spilled: u64,
    events: Vec<(f64, String)>,
    accuracy: Option<Accuracy>,
    future: Option<&'a Future>,
    last_tick: u64,
    /// every managed VA range ever handed out -> (bytes, tag)
    tags: BTreeMap<u64, (u64, String)>,
    observed: Option<Observed>,
    ar: AclReplay,
    /// Every operator's whole writes told, gate or not (the unlimited-HBM
    /// baseline: Belady's future is the trace's truth).
    every_whole: bool,
    /// `Setup::held`'s snapshots so far.
    held: Vec<super::held::Held>,
    /// `Setup::audit`: the phases so far, the last one running.
    audit: Vec<super::audit::Logged>,
    /// The `plan` policy's driver side: arms each event's entries.
    plan: Option<&'a super::schedule::Armer>,
}

impl Driver<'_> {
    fn replay(&mut self) -> Result<(), String> {
        let n = self.trace.events.len();
        let dead = self
            .s
            .discard_dead
            .then(|| super::dead::dead_after(self.trace));
        let frees = (self.s.discard_frees)
            .then(|| {
                self.trace
                    .frees
                    .get_or_init(|| super::dead::frees_after(self.trace))
                    .as_ref()
                    .map_err(String::clone)
            })
            .transpose()?;
        if let Some(a) = self.plan {
            // every entry on an event's line (lines ascending); past the
            // last event, ignored (the trace cut short, as bench/phases.py
            // replays it)
            let end = self.trace.lines.last().copied().unwrap_or(0);
            if let Some((&tl, v)) = a
                .plan
                .by_line
                .iter()
                .filter(|(&tl, _)| tl <= end && self.trace.lines.binary_search(&tl).is_err())
                .min_by_key(|(_, v)| v[0].0)
            {
                return Err(format!(
                    "{}:{}: trace line {tl} holds no event of {}",
                    a.plan.name, v[0].0, self.trace.name
                ));
            }
        }
        let next_use = self.s.held.then(|| super::held::NextUse::new(self.trace));
        let marks = if self.s.held || self.s.audit {
            super::held::marks(self.trace)?
        } else {
            Vec::new()
        };
        if self.s.audit {
            self.tier.set_move_log(true);
            self.audit_phase(0, "start".to_string());
        }
        let mut marks = marks.into_iter().peekable();
        for (k, ev) in self.trace.events.iter().enumerate() {
            while let Some((_, line, label)) = marks.next_if(|m| m.0 == k) {
                if self.s.audit {
                    self.audit_phase(line, label.clone());
                }
                if let Some(n) = next_use.as_ref() {
                    self.snapshot(n, k, line, label);
                }
            }
            crate::progress::tick(k, n);
            if self.s.wait_log_ns.is_some() {
                self.rt.set_line(self.trace.lines[k]);
            }
            if let Some(o) = self.observed.as_mut() {
                o.event_ns.push(self.rt.host_ns());
                o.map_mark.push(self.rt.maps_logged());
            }
            let mut armed = Vec::new();
            let mut ordinals = Vec::new();
            if let Some(a) = self.plan {
                let export = a.exporting();
                for &(n, dev, addr) in a
                    .plan
                    .by_line
                    .get(&self.trace.lines[k])
                    .map_or(&[][..], |v| &v[..])
                {
                    let va = self.chunk_key(dev, addr).ok_or_else(|| {
                        format!(
                            "{}:{n}: {addr:#x} (device {dev}) is in no allocation live at {}:{}",
                            a.plan.name, self.trace.name, self.trace.lines[k]
                        )
                    })?;
                    a.arm(n, va);
                    armed.push(va);
                    if export {
                        ordinals.push(self.tier.schedule_ordinal(va));
                    }
                }
            }
            self.event(ev)
                .map_err(|e| format!("{}:{}: {e}", self.trace.name, self.trace.lines[k]))?;
            if let Some(a) = self.plan {
                a.after_event();
                if !ordinals.is_empty() {
                    a.exported(self.tier.now(), &ordinals);
                }
                self.tier.evict_planned(&armed);
            }
            for &(dev, addr) in dead.as_ref().map_or(&[][..], |d| &d[k][..]) {
                if let Some(va) = self.translate(dev, addr) {
                    self.tier.discard(va, CHUNK);
                }
            }
            for &(addr, bytes) in frees.as_ref().map_or(&[][..], |f| &f[k][..]) {
                if let Some(va) = self.translate(0, addr) {
                    self.tier.discard(va, bytes);
                }
            }
            self.sample_thin();
            self.background();
        }
        if let Some((n, va)) = self.plan.and_then(|a| a.stray()) {
            return Err(format!(
                "{}:{n}: the chunk at {va:#x} (managed VA) is not touched by the event on the entry's line",
                self.plan.map_or("", |a| a.plan.name.as_str())
            ));
        }
        Ok(())
    }

    /// `--audit`: the moves logged so far go to the running phase, and the
    /// phase at `line` begins.
    fn audit_phase(&mut self, line: u64, label: String) {
        self.close_audit_phase();
        self.audit.push((line, label, self.tier.now(), Vec::new()));
    }

    /// `--audit`: the moves logged so far go to the running phase.
    fn close_audit_phase(&mut self) {
        if let Some(p) = self.audit.last_mut() {
            self.tier.take_moves(&mut p.3);
        }
    }

    /// `--held` at event `k` (before it): every chunk u3m holds in HBM, by
    /// tag, live or dead from `k` on, clean or dirty.
    fn snapshot(&mut self, next: &super::held::NextUse, k: usize, line: u64, label: String) {
        let mut h = super::held::Held {
            line,
            label,
            host_ns: self.rt.host_ns(),
            ..Default::default()
        };
        let mut chunks = Vec::new();
        let now = self.tier.now();
        for dev in 0..self.trace.devices as u32 {
            chunks.clear();
            self.tier.resident_chunks(dev, &mut chunks);
            // managed VA -> (its trace address, bytes)
            let by_va: BTreeMap<u64, (u64, u64)> = self.allocs[dev as usize]
                .iter()
                .filter_map(|(&addr, a)| a.va.map(|va| (va, (addr, a.bytes.max(1)))))
                .collect();
            for &(va, dirty) in &chunks {
                let tag = tag_at(&self.tags, va);
                // a chunk of no allocation the trace still has counts live
                let live = by_va
                    .range(..=va)
                    .next_back()
                    .filter(|(&v, &(_, len))| va < v + len)
                    .map_or(true, |(&v, &(addr, _))| {
                        next.live_from(dev, addr + (va - v), k)
                    });
                // (a chunk's policy key is its VA at its backing's first
                // mapping, which a trace allocation's is)
                let foreseen = self.tier.policy().next_use(now, va) == Some(u64::MAX);
                h.add(tag, live, dirty, foreseen, CHUNK);
            }
        }
        self.held.push(h);
    }

    /// The Tier's VA for a trace range (None: unmanaged memory).
    fn translate(&self, dev: u32, addr: u64) -> Option<u64> {
        self.managed_at(dev, addr).map(|(va, off)| va + off)
    }

    /// The policy's key of the chunk holding trace address `addr`: its
    /// managed VA, chunks counted from the allocation's start.
    fn chunk_key(&self, dev: u32, addr: u64) -> Option<u64> {
        self.managed_at(dev, addr)
            .map(|(va, off)| va + off / CHUNK * CHUNK)
    }

    /// The managed VA of the live allocation holding trace address `addr`,
    /// and `addr`'s offset in it.
    fn managed_at(&self, dev: u32, addr: u64) -> Option<(u64, u64)> {
        let (&start, a) = self.allocs.get(dev as usize)?.range(..=addr).next_back()?;
        a.va.filter(|_| addr - start < a.bytes.max(1))
            .map(|va| (va, addr - start))
    }

    fn stream(&mut self, dev: u32, stream: u32) -> u64 {
        let rt = self.rt;
        *self
            .streams
            .entry((dev, stream))
            .or_insert_with(|| rt.program_stream())
    }

    fn event(&mut self, ev: &Event) -> Result<(), String> {
        let dev = ev.dev;
        self.rt.select(dev);
        match &ev.body {
            Body::Alloc { addr, bytes } => self.alloc(dev, *addr, *bytes, ev.tag.as_deref()),
            Body::Free { addr } => {
                if self.s.acl_replay {
                    // the writer waited for earlier readers, so these cover every user
                    let tr = self.allocs[dev as usize]
                        .get(addr)
                        .map(|a| a.tr.clone())
                        .unwrap_or_default();
                    for s in tr.wr.iter().chain(tr.rd.iter()).map(|x| x.0) {
                        self.ar_sync(s);
                    }
                    self.rt.select(dev);
                }
                let a = self.allocs[dev as usize]
                    .remove(addr)
                    .ok_or("free of an unknown allocation")?;
                match a.va {
                    Some(va) => {
                        self.heat.on_free(va);
                        self.live.remove(&va);
                        self.rt.pause_maps(true);
                        let freed = self.tier.free(va);
                        self.rt.pause_maps(false);
                        if freed != Some(Ok(())) {
                            return Err(format!("the Tier did not free its allocation at {va:#x}"));
                        }
                    }
                    None => self.rt.unmanaged(dev, a.bytes, false),
                }
                Ok(())
            }
            Body::Op { op_type, .. } => {
                // (write, written whole): `access::ranges`' rule; libu3m.so's
                // aclop hook works out whole writes only once the Tier says
                // they matter, and the policy learns what it is told
                let whole = self.every_whole || self.tier.whole_writes_matter();
                let ranges: Vec<(u64, u64, bool, bool)> = super::access::ranges(&ev.body)
                    .into_iter()
                    .map(|(a, b, f)| (a, b, f & W != 0, f == W && whole))
                    .collect();
                let touched: u64 = ranges.iter().map(|r| r.1).sum();
                let cost = Cost::Op {
                    flops: ev.flops.unwrap_or(0),
                    bytes: touched,
                };
                self.call(ev, op_type, &ranges, false, cost)
            }
            Body::Copy {
                kind,
                dst,
                src,
                bytes,
            } => {
                let (ranges, cost) = match kind {
                    CopyKind::H2D => (vec![(*dst, *bytes, true, true)], Cost::Link(*bytes, true)),
                    CopyKind::D2H => (
                        vec![(*src, *bytes, false, false)],
                        Cost::Link(*bytes, false),
                    ),
                    CopyKind::D2D => (
                        vec![(*src, *bytes, false, false), (*dst, *bytes, true, true)],
                        Cost::D2d(*bytes),
                    ),
                    CopyKind::H2H => return Ok(()), // no device involved
                };
                self.call(ev, "Memcpy", &ranges, true, cost)
            }
            Body::Set { addr, bytes } => self.call(
                ev,
                "Memset",
                &[(*addr, *bytes, true, true)],
                true,
                Cost::Memset(*bytes),
            ),
        }
    }

    fn alloc(&mut self, dev: u32, addr: u64, bytes: u64, tag: Option<&str>) -> Result<(), String> {
        let (free, total) = self.rt.mem_info().unwrap_or((0, 0));
        let va = match self.tier.malloc(dev, bytes, free, total) {
            Some(Ok(va)) => {
                self.heat.on_alloc(dev, va, bytes, AllocKind::Malloc);
                self.live.insert(va, bytes);
                self.tags.insert(va, (bytes.max(1), tag.unwrap_or("-").to_string()));
                if let Some(o) = self.observed.as_mut() {
                    o.origin.insert(va, (dev, addr, bytes));
                }
                Some(va)
            }
            Some(Err(e)) => {
                return Err(format!(
                    "the Tier refused an allocation of {bytes} bytes (error {}): the footprint exceeds what HBM × 64 and the DRAM/NVMe tiers can hold",
                    e.raw()
                ))
            }
            None => {
                // as the library: an unmanaged allocation that does not fit
                // makes room by evicting managed chunks, kept for it across
                // the allocation
                let _room = (free < bytes)
                    .then(|| self.tier.make_room(dev, bytes - free))
                    .flatten();
                self.rt.unmanaged(dev, bytes, true);
                None
            }
        };
        self.allocs[dev as usize].insert(
            addr,
            Alloc {
                bytes,
                va,
                tr: Tracker::default(),
            },
        );
        Ok(())
    }

    /// One call: fault-in, its cost, its use. A copy or memset on stream 0
    /// is synchronous (that is how the recorder writes aclrtMemcpy and
    /// aclrtMemset: no stream): the host first waits for the device's
    /// streams (a program reads results only after synchronising), then
    /// spends the call's whole cost, as the simulator charges a blocking
    /// copy; the Tier orders it by the host (`Order::Host`), as the library
    /// does for synchronous calls. Everything else is queued on its stream.
    fn call(
        &mut self,
        ev: &Event,
        name: &str,
        ranges: &[(u64, u64, bool, bool)],
        overwrite: bool,
        cost: Cost,
    ) -> Result<(), String> {
        let dev = ev.dev;
        let sync = !self.s.acl_replay && ev.stream == 0 && !matches!(ev.body, Body::Op { .. });
        let stream = self.stream(dev, ev.stream);
        if self.s.acl_replay {
            // acl_replay: no launch queue; the stream first waits for
            // conflicting work of other streams
            self.ar_before(ev);
            self.rt.select(dev);
        } else if sync {
            for (&(d, _), &s) in &self.streams {
                if d == dev {
                    let _ = self.rt.sync_stream(s);
                }
            }
        } else if self.queue.len() >= self.s.queue.max(1) {
            // a full launch queue: the host waits for the oldest call
            if let Some(t) = self.queue.pop_front() {
                self.rt.host_at_least(t);
            }
        }
        let mut managed = Vec::with_capacity(ranges.len());
        for &(addr, len, write, whole) in ranges {
            if let Some(va) = self.translate(dev, addr) {
                managed.push(Range {
                    addr: va,
                    len,
                    write,
                    whole,
                });
            }
        }
        let (class, op_hash) = opclass::classify(name);
        let now = self.rt.host_ns();
        self.clock.store(HEAT_EPOCH_NS + now, Relaxed);
        self.seq += 1;
        for r in &managed {
            if r.len > 0 {
                let a = Access {
                    seq: self.seq,
                    ns: HEAT_EPOCH_NS + now,
                    class,
                    op_hash,
                    write: r.write,
                };
                self.heat.touch(r.addr, r.len, &a);
            }
        }
        let tok = if managed.is_empty() {
            None
        } else {
            let order = if sync {
                Order::Host
            } else {
                Order::Stream(stream)
            };
            let tok = self
                .tier
                .prepare(dev, class as u8, &managed, overwrite, order)
                .map_err(|e| format!("{name}: the Tier could not make its memory accessible (error {}; a call larger than HBM with --host-map off?)", e.raw()))?;
            Some(tok)
        };
        // where the Tier left the memory decides the cost: bytes it keeps in
        // host-mapped memory cross the link (the simulator's rule)
        let spans: Vec<(u64, u64, u8)> = managed
            .iter()
            .map(|r| (r.addr, r.len, r.write as u8))
            .collect();
        if let Cost::Link(b, to_device) = &cost {
            self.rt.program_copy(*b, *to_device);
        }
        let work = cost.work(&self.s.costs, &self.rt.host_access(&spans));
        let gate = self.rt.gate(&spans);
        if sync {
            self.rt.host_at_least(gate);
            let ns = self.rt.sync_work(&work);
            self.rt.note_use(&spans, self.rt.host_ns() + ns);
            self.rt.host_spend(ns.max(self.s.costs.launch_ns()));
        } else {
            let end = self.rt.launch_work_after(stream, &work, gate);
            self.rt.note_use(&spans, end);
            self.rt.host_spend(self.s.costs.call_ns());
            if !self.s.acl_replay {
                self.queue.push_back(end);
            }
        }
        if self.s.acl_replay {
            self.ar_after(ev);
        }
        if let Some(tok) = tok {
            self.tier
                .finish(tok, if sync { None } else { Some(stream) }, true);
            if let (Some(acc), Some(f)) = (self.accuracy.as_mut(), self.future) {
                let now = self.tier.now();
                if now != self.last_tick {
                    self.last_tick = now;
                    acc.maybe_sample(now, self.tier.policy(), &self.live, f);
                }
            }
        }
        Ok(())
    }

    /// acl_replay's stream slot of (dev, trace stream), created on first use.
    fn ar_slot(&mut self, dev: u32, stream: u32) -> usize {
        if let Some(&k) = self.ar.slot.get(&(dev, stream)) {
            return k;
        }
        let sim = self.stream(dev, stream);
        let k = self.ar.streams.len();
        self.ar.streams.push(AStream {
            dev,
            sim,
            seq: 0,
            synced: 0,
            waited: HashMap::new(),
        });
        self.ar.slot.insert((dev, stream), k);
        k
    }

    /// `sync_stream`: the host waits for stream slot `a`.
    fn ar_sync(&mut self, a: usize) {
        let s = &mut self.ar.streams[a];
        if s.synced == s.seq {
            return;
        }
        s.synced = s.seq;
        let (dev, sim) = (s.dev, s.sim);
        self.rt.select(dev);
        let _ = self.rt.sync_stream(sim);
    }

    /// `sync_all`: the host waits for every stream; the events are destroyed.
    fn ar_sync_all(&mut self) {
        for a in 0..self.ar.streams.len() {
            let s = &mut self.ar.streams[a];
            s.synced = s.seq;
            let (dev, sim) = (s.dev, s.sim);
            self.rt.select(dev);
            let _ = self.rt.sync_stream(sim);
        }
        self.ar.events = 0;
    }

    /// `need`: stream b must not run its next work before a's up to count k.
    fn ar_need(&mut self, b: usize, a: (usize, u64)) {
        let (a, k) = a;
        if a == b
            || self.ar.streams[a].synced >= k
            || self.ar.streams[b].waited.get(&a).copied().unwrap_or(0) >= k
        {
            return;
        }
        if self.ar.streams[a].dev != self.ar.streams[b].dev {
            self.ar_sync(a); // cross-device: order through the host
            return;
        }
        if self.ar.events >= EVENT_BATCH {
            self.ar_sync_all();
            return;
        }
        self.ar.events += 1;
        let (sa, sb, dev) = (
            self.ar.streams[a].sim,
            self.ar.streams[b].sim,
            self.ar.streams[b].dev,
        );
        self.rt.select(dev);
        if let Ok(e) = self.rt.create_event() {
            let _ = self.rt.record_event(e, sa);
            let _ = self.rt.stream_wait(sb, e);
        }
        let seq = self.ar.streams[a].seq;
        self.ar.streams[b].waited.insert(a, seq);
    }

    /// The trackers an event touches, as (allocation start or host address,
    /// on the host?, write), repeats merged (a write wins), in acl_replay's
    /// order.
    fn ar_accesses(&self, ev: &Event) -> Vec<(u64, bool, bool)> {
        let dev = ev.dev as usize;
        let alloc = |addr: u64| {
            self.allocs[dev]
                .range(..=addr)
                .next_back()
                .map(|(&s, _)| s)
                .unwrap_or(addr)
        };
        let mut v: Vec<(u64, bool, bool)> = Vec::new();
        let mut add =
            |k: u64, host: bool, w: bool| match v.iter_mut().find(|x| x.0 == k && x.1 == host) {
                Some(x) => x.2 |= w,
                None => v.push((k, host, w)),
            };
        match &ev.body {
            Body::Op {
                inputs, outputs, ..
            } => {
                for r in inputs {
                    add(alloc(r.addr), false, false);
                }
                for r in outputs {
                    add(alloc(r.addr), false, true);
                }
            }
            Body::Copy { kind, dst, src, .. } => {
                match kind {
                    CopyKind::H2D | CopyKind::D2D => add(alloc(*dst), false, true),
                    _ => add(*dst, true, true),
                }
                match kind {
                    CopyKind::D2H | CopyKind::D2D => add(alloc(*src), false, false),
                    _ => add(*src, true, false),
                }
            }
            Body::Set { addr, .. } => add(alloc(*addr), false, true),
            _ => {}
        }
        v
    }

    fn ar_tracker(&mut self, dev: u32, k: u64, host: bool) -> Option<&mut Tracker> {
        if host {
            Some(&mut self.ar.host.entry(k).or_default().0)
        } else {
            self.allocs[dev as usize].get_mut(&k).map(|a| &mut a.tr)
        }
    }

    /// Before a call: a D2H copy's host buffer is hashed first (the host
    /// waits for the D2H copies pending up to its own), then `deps_before`.
    fn ar_before(&mut self, ev: &Event) {
        let b = self.ar_slot(ev.dev, ev.stream);
        if let Body::Copy {
            kind: CopyKind::D2H,
            dst,
            ..
        } = &ev.body
        {
            if self.ar.host.get(dst).is_some_and(|h| h.1.is_some()) {
                while let Some(h) = self.ar.pend.pop_front() {
                    let s = self.ar.host.get_mut(&h).and_then(|x| x.1.take());
                    if let Some(s) = s {
                        self.ar_sync(s);
                    }
                    if h == *dst {
                        break;
                    }
                }
            }
        }
        for (k, host, write) in self.ar_accesses(ev) {
            let Some(t) = self.ar_tracker(ev.dev, k, host) else {
                continue;
            };
            let mut deps: Vec<(usize, u64)> = t.wr.into_iter().collect();
            if write {
                deps.extend(t.rd.iter().copied());
            }
            for d in deps {
                self.ar_need(b, d);
            }
        }
    }

    /// After a call: `touch_after`, and a D2H copy's host buffer pending.
    fn ar_after(&mut self, ev: &Event) {
        let b = self.ar_slot(ev.dev, ev.stream);
        self.ar.streams[b].seq += 1;
        let k = self.ar.streams[b].seq;
        for (a, host, write) in self.ar_accesses(ev) {
            let Some(t) = self.ar_tracker(ev.dev, a, host) else {
                continue;
            };
            if write {
                t.wr = Some((b, k));
                t.rd.clear();
            } else {
                match t.rd.iter_mut().find(|x| x.0 == b) {
                    Some(x) => x.1 = k,
                    None => t.rd.push((b, k)),
                }
            }
        }
        if let Body::Copy {
            kind: CopyKind::D2H,
            dst,
            ..
        } = &ev.body
        {
            self.ar.host.entry(*dst).or_default().1 = Some(b);
            self.ar.pend.push_back(*dst);
        }
    }

    /// A timeline sample if the last is at least the step old.
    fn sample_thin(&mut self) {
        let Some(o) = self.observed.as_mut() else {
            return;
        };
        let now = self.rt.host_ns();
        if o.samples
            .last()
            .is_some_and(|s| now < s.t_ns + o.sample_step_ns.max(1))
        {
            return;
        }
        if o.samples.len() >= MAX_SAMPLES {
            let mut i = 0;
            o.samples.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            o.sample_step_ns = (o.sample_step_ns * 2).max(1000);
        }
        self.sample();
    }

    /// A timeline sample now (observed runs only).
    fn sample(&mut self) {
        let Some(o) = self.observed.as_mut() else {
            return;
        };
        let tiers = (0..self.trace.devices)
            .map(|d| {
                let (_, dram, nvme) = self.tier.usage(d);
                (self.rt.used(d as u32), dram, nvme)
            })
            .collect();
        o.samples.push(Sample {
            t_ns: self.rt.host_ns(),
            tiers,
            counters: self.tier.counters(),
        });
    }

    /// The library's background thread (core/src/engine/publish.rs): a round
    /// every `tick_ns` of host time, checked after every event. The periods
    /// that passed since the last check are one round (a host that waited
    /// through several gets one, covering them all: DRAM spill and prefetch
    /// budget for all the periods, the watermarks once), as the library's.
    fn background(&mut self) {
        let tick = self.s.tick_ns;
        let h = self.rt.host_ns();
        if tick == 0 || h < self.next_bg {
            return;
        }
        let periods = ((h - self.next_bg) / tick + 1).min(MAX_PERIODS);
        let at = self.next_bg + (periods - 1) * tick;
        let secs = at as f64 / 1e9;
        self.rt.begin_background();
        for line in self.tier.tick_policy(secs) {
            self.events.push((secs, line));
        }
        self.spilled += self.tier.spill_dram((periods * tick) as f64 / 1e9) as u64;
        // as the library: no watermark eviction while the program is making
        // room on demand
        let demand = self.tier.demand_count();
        let quiet = std::mem::replace(&mut self.demand_seen, demand) == demand;
        for dev in self.tier.devices() {
            if self.rt.set_device(dev).is_ok()
                && (!quiet
                    || self
                        .tier
                        .enforce_watermarks(dev, self.s.hbm_low, self.s.hbm_high)
                        == 0)
            {
                // as the library: room below the low watermark brings back
                // what the policy expects soon, within the link's share of
                // the periods
                let budget = (self.s.costs.link_gbps * (periods * tick) as f64) as u64;
                self.tier
                    .prefetch(dev, budget, self.s.hbm_low, PREFETCH_HORIZON);
            }
        }
        self.rt.end_background();
        self.sample();
        // a longer stall than MAX_PERIODS: the rest is skipped
        self.next_bg = (at + tick).max((h / tick + 1) * tick);
    }
}
