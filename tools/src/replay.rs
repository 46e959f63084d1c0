//! `u3m replay`: the tiering engine and its policies driven offline over
//! traces, with a cost model instead of a device (docs/replay.md). The same
//! `Residency` and `Placement` objects libu3m.so runs; only the `Runtime` differs.

mod access;
mod accuracy;
mod audit;
mod cost;
mod dead;
pub(crate) mod drive;
pub(crate) mod floor;
mod greedy;
mod held;
mod recording;
mod report;
mod schedule;
pub(crate) mod simrt;

use std::path::PathBuf;
use std::process::ExitCode;

use u3m_core::config::parse_size;
use u3m_core::policy::Placement;
use u3m_core::trace::TraceReader;

use crate::error::CliError;
use accuracy::Future;
use cost::Costs;
use drive::{Setup, Trace};
use report::{PolicyRow, TraceReport};

/// Every policy replay knows, in report order.
pub const POLICIES: &[&str] = &["seed-heat", "lru", "markov", "predictive", "belady"];

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// Trace files (u3m trace format v1).
    #[arg(required = true, value_name = "TRACE")]
    pub traces: Vec<PathBuf>,
    /// Physical HBM per device (4096, 512M, 16G, ...).
    #[arg(long, value_name = "BYTES", value_parser = size)]
    pub hbm: u64,
    /// Pinned DRAM tier size [default: unlimited].
    #[arg(long, value_name = "BYTES", value_parser = size)]
    pub dram: Option<u64>,
    /// NVMe tier size (a swap file in a temporary directory) [default: none].
    #[arg(long, value_name = "BYTES", value_parser = size, default_value = "0")]
    pub nvme: u64,
    /// Policies side by side (seed-heat, lru, markov, predictive, belady; plan, with --plan).
    #[arg(long, value_name = "P,...", value_delimiter = ',', default_values_t = POLICIES.iter().map(|s| s.to_string()).collect::<Vec<_>>())]
    pub policy: Vec<String>,
    /// Prediction windows W, in operator events (logical ticks).
    #[arg(long, value_name = "W,...", value_delimiter = ',', default_values_t = vec![16u64, 64, 256])]
    pub window: Vec<u64>,
    /// Ticks between precision/recall sampling points.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub sample_every: u64,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also print the policies' events (calibrations, mode switches).
    #[arg(long)]
    pub events: bool,
    /// Allocations at least this large are managed (U3M_MIN_BYTES).
    #[arg(long, value_name = "BYTES", value_parser = size, default_value = "2M")]
    pub min_bytes: u64,
    /// U3M_HOST_MAP: auto (a call larger than HBM runs with part of its memory host-mapped, read over the link), probe (auto, and read-once streams are host-mapped instead of copied in while the read-once probe times that faster), stream (auto, and read-once streams always host-mapped while HBM is full) or off (a call larger than HBM stops the replay).
    #[arg(long, value_name = "auto|probe|stream|off", default_value = "auto", value_parser = ["auto", "probe", "stream", "off"])]
    pub host_map: String,
    /// U3M_LOOK_AHEAD (default off, as in the library): on (copy-ins of the chunks predicted within an adaptive window start after each call) or off (demand and background prefetch only); belady (MIN, the demand-paging reference) and plan (the schedule's evictions with demand paging) always run without it.
    #[arg(long, value_name = "on|off", default_value = "off", value_parser = ["on", "off"])]
    pub look_ahead: String,
    /// U3M_OUT_FIRST (default off, as in the library): on (a dirty chunk whose predicted next use writes it whole goes before clean chunks: its copy-out spares a copy-in), auto (on once u3m's copy-ins have outrun its copy-outs by 1 GiB; off for good if the copy-outs then exceed twice the copy-ins over 8 GiB) or off (it weighs as clean). The predictive policy reads it; the others ignore it.
    #[arg(long, value_name = "off|auto|on", default_value = "off", value_parser = ["off", "auto", "on"])]
    pub out_first: String,
    /// U3M_HANDOFF (default off, as in the library): on (a copy-in that finds HBM full takes the memory of a copy-out still in flight, ordered after it on the device; a planned eviction of a chunk still in use is ordered after its uses on the device) or off (the host waits for both).
    #[arg(long, value_name = "on|off", default_value = "off", value_parser = ["on", "off"])]
    pub handoff: String,
    /// Background round period in simulated ms (watermarks, spill, policy tick); 0: none.
    #[arg(long, value_name = "MS", default_value_t = 20.0)]
    pub tick_ms: f64,
    /// Watermarks as fractions of HBM: LOW,HIGH.
    #[arg(long, value_name = "LOW,HIGH", value_delimiter = ',', num_args = 1, default_values_t = vec![0.75, 0.90])]
    pub watermarks: Vec<f64>,
    /// Calls the host may run ahead of the device (the launch queue; --issue recorded only: acl_replay, and so --issue acl-replay, has none).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub queue: usize,
    /// Host-device link, GB/s (ACLSIM_LINK_GBPS).
    #[arg(long, value_name = "GBPS", default_value_t = 25.0)]
    pub link_gbps: f64,
    /// Device memory bandwidth, GB/s (ACLSIM_HBM_GBPS; 910b4).
    #[arg(long, value_name = "GBPS", default_value_t = 800.0)]
    pub hbm_gbps: f64,
    /// Compute rate (ACLSIM_TFLOPS; 910b4).
    #[arg(long, value_name = "T", default_value_t = 280.0)]
    pub tflops: f64,
    /// Launch latency per call, µs (ACLSIM_LAUNCH_US).
    #[arg(long, value_name = "US", default_value_t = 5.0)]
    pub launch_us: f64,
    /// Predictor calibration period, simulated seconds (U3M_CALIB_S).
    #[arg(long, value_name = "S", default_value_t = 600.0)]
    pub calib_s: f64,
    /// Predictor re-warm time after a mode switch, simulated seconds (U3M_WARMUP_S).
    #[arg(long, value_name = "S", default_value_t = 30.0)]
    pub warmup_s: f64,
    /// NVMe read rate, GB/s.
    #[arg(long, value_name = "GBPS", default_value_t = 6.5)]
    pub nvme_read_gbps: f64,
    /// The trace's own host-device copies use pageable host memory (half the link rate, as the simulator charges).
    #[arg(long)]
    pub pageable: bool,
    /// NVMe write rate, GB/s.
    #[arg(long, value_name = "GBPS", default_value_t = 4.5)]
    pub nvme_write_gbps: f64,
    /// The host link (ACLSIM_LINK_MODEL): shared (one full-duplex link per device, shared in simulated time by every transfer) or per-stream (every stream has the whole link).
    #[arg(long, value_name = "shared|per-stream", default_value = "shared", value_parser = ["shared", "per-stream"])]
    pub link_model: String,
    /// When the Tier sees an event completed: device (when the device reaches it in simulated time, as on a real card and as the simulator answers) or simulator (when it is recorded, as the simulator answered before its queries followed its simulated clock); handover or handover-free: as simulator, with HBM handed over in stream order — a copy into or out of a page waits for the page's last use, a call for the copies into its pages (handover: u3m's copy streams in order; handover-free: a stream per copy; a what-if, docs/replay.md).
    #[arg(long, value_name = "device|simulator|handover|handover-free", default_value = "device", value_parser = ["device", "simulator", "handover", "handover-free"])]
    pub event_model: String,
    /// Host time per asynchronous call, µs [default: --launch-us]; the simulator's host clock spends none (0).
    #[arg(long, value_name = "US")]
    pub call_us: Option<f64>,
    /// How the program issued the trace: recorded (as the recorded program: stream-0 copies and memsets are synchronous, the host waits for the device's streams first, at most --queue calls ahead) or acl-replay (as tests/apps/acl_replay re-runs it: everything asynchronous on its stream, stream 0 included; a stream waits on an event for earlier conflicting work of another stream; the host waits only at frees, for the streams that used the allocation, when a D2H copy's host buffer is written again, and every 1024 conflict events).
    #[arg(long, value_name = "recorded|acl-replay", default_value = "recorded", value_parser = ["recorded", "acl-replay"])]
    pub issue: String,
    /// Also print the window floor (docs/replay.md): a lower bound on the simulated time of any schedule of the trace with this HBM and link, for the whole trace and for each `# train step` span.
    #[arg(long)]
    pub floor: bool,
    /// With --floor: the step spans to bound, N or A-B each [default: every step on its own].
    #[arg(long, value_name = "N|A-B,...", value_delimiter = ',')]
    pub floor_steps: Vec<String>,
    /// With --floor: every N-th event is a candidate window boundary [default: the least N that leaves at most 12000 per span].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub floor_stride: Option<u64>,
    /// A what-if: the program calls u3m_discard (docs/api.md) on every chunk right after its last read before a whole write, as a framework whose caching allocator frees the block could; that memory then leaves HBM without a copy-out (docs/replay.md).
    #[arg(long)]
    pub discard_dead: bool,
    /// The program's caching allocator frees blocks as torch_npu reports them to libu3m.so under U3M_TORCH_HINTS=on: a u3m_discard on each block at its '# free ADDR BYTES' comment (`u3m synth --frees`), as `acl_replay --frees` plays it (docs/replay.md).
    #[arg(long)]
    pub discard_frees: bool,
    /// List in the JSON (`long_waits`, per policy) every host wait of at least MS simulated milliseconds: the trace line whose call waited, when, how long, and for what (the program's work, u3m's copy-ins or copy-outs, the launch queue) — where a step's time goes (docs/replay.md).
    #[arg(long, value_name = "MS", value_parser = wait_ms)]
    pub wait_log: Option<f64>,
    /// List in the JSON (`held`, per policy) what u3m holds in HBM at each `# train step N: PHASE` comment (`u3m synth` writes them), as the host issues the phase's first call: bytes per allocation tag, live (the trace reads the chunk again before writing it whole) or dead, clean or dirty (docs/replay.md).
    #[arg(long)]
    pub held: bool,
    /// List in the JSON (`audit`, per policy) what u3m moved in each phase between `# train step` comments, per allocation tag: bytes copied in (on demand, ahead), evicted, copied out, and of the evicted what came back in later and within the phase — with whether the policy, when it evicted the chunk, predicted that use or took the chunk for dead (docs/replay.md).
    #[arg(long)]
    pub audit: bool,
    /// A schedule for the `plan` policy (with --policy ...,plan; one trace): lines 'LINE ADDR [DEV]', each a gap the schedule has the chunk at ADDR out of HBM, after its use on trace line LINE. The policy orders victims as belady with those chunks first and has each evicted once that use is complete — what the schedule costs through the engine's pipeline (bench/plan_schedule.py writes bench/pipeline_bound.py's optimum so; docs/replay.md).
    #[arg(long, value_name = "FILE")]
    pub plan: Option<PathBuf>,
    /// With --plan: write the entries the plan policy followed as a U3M_PLAN file ('CALL ALLOC CHUNK DEV': u3m's call clock, the allocation's ordinal among those u3m manages on the device, the 2 MiB chunk), for libu3m.so or --schedule to follow on the same program.
    #[arg(long, value_name = "FILE")]
    pub plan_export: Option<PathBuf>,
    /// U3M_PLAN, as in the library: every policy's run (not the baseline) follows the schedule FILE ('CALL ALLOC CHUNK [DEV]' per line, e.g. from --plan-export): after each named call its chunks leave HBM as soon as their uses allow; demand evictions stay the policy's; `auto`: the run plans its own, as the library does (docs/replay.md).
    #[arg(long, value_name = "FILE")]
    pub schedule: Option<PathBuf>,
    /// Instead of replaying: run the library's greedy planner (core residency/planner.rs) on step --greedy-step of the trace as a cycle, with --hbm and --link-gbps, and write its schedule to FILE for --policy plan --plan FILE (every step of the cycle's call count from 1 on); what it planned goes to stderr.
    #[arg(long, value_name = "FILE")]
    pub greedy_plan: Option<PathBuf>,
    /// With --greedy-plan: the step planned (from its `# train step K:` comment to the next).
    #[arg(long, value_name = "K", default_value_t = 3)]
    pub greedy_step: u64,
    /// U3M_PLAN_MIN_GAP_US, as in the library (--greedy-plan, --schedule auto): gaps whose next use is less than US µs of device time away stay in HBM.
    #[arg(long, value_name = "US", default_value_t = 30000.0)]
    pub min_gap_us: f64,
    /// With --greedy-plan: which chunk-gap goes first: cost (fewest copies, then longest out) or far (longest out).
    #[arg(long, value_name = "cost|far", default_value = "cost", value_parser = ["cost", "far"])]
    pub greedy_key: String,
    /// With --greedy-plan: every call takes the step's mean device time, as the library plans (it cannot know each call's).
    #[arg(long)]
    pub greedy_uniform: bool,
}

fn wait_ms(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "'{s}' is not a duration in milliseconds (0 or more, e.g. 5 or 0.5)"
        )),
    }
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).ok_or_else(|| format!("'{s}' is not a byte size (e.g. 4096, 512M, 16G)"))
}

pub fn main(a: ReplayArgs) -> Result<ExitCode, CliError> {
    let setup = setup(&a)?;
    if a.greedy_plan.is_some() {
        return greedy::run(&a, &setup.costs);
    }
    let mut reports = Vec::new();
    crate::progress::start("u3m replay");
    for path in &a.traces {
        crate::progress::stage(format!("reading {}", path.display()));
        let trace = match load(path) {
            Ok(t) => t,
            Err(e) => {
                // like acl_replay: a malformed trace is exit status 3
                crate::progress::clear();
                eprintln!("u3m replay: {e}");
                return Ok(ExitCode::from(3));
            }
        };
        match replay_trace(&trace, &setup, a.hbm, &a.policy) {
            Ok(mut r) => {
                if a.floor {
                    crate::progress::stage(format!("{}, window floor", trace.name));
                    r.floor = Some(floor_report(&trace, path, &setup, &a)?);
                }
                reports.push(r)
            }
            Err(e) => {
                crate::progress::clear();
                eprintln!("u3m replay: {e}");
                return Ok(ExitCode::from(1));
            }
        }
    }
    crate::progress::clear();
    let out = if a.json {
        report::json(&setup, a.hbm, &reports)
    } else {
        report::text(&setup, a.hbm, &reports, a.events)
    };
    use std::io::Write;
    std::io::stdout()
        .write_all(out.as_bytes())
        .map_err(|err| CliError::Io {
            what: "writing the report",
            err,
        })?;
    Ok(ExitCode::SUCCESS)
}

/// Why an observed replay did not run: the trace is malformed (exit 3, as
/// acl_replay), or the engine could not run it (exit 1).
pub enum ObserveError {
    Trace(String),
    Engine(String),
    Usage(CliError),
}

/// One replay of one trace with a timeline (`drive::Observed`), for `u3m
/// snapshot` and `u3m report`: `args` are `u3m replay`'s options (its
/// defaults apply); the first `--policy` runs.
pub fn observed(args: &[String]) -> Result<Observation, ObserveError> {
    #[derive(clap::Parser)]
    struct P {
        #[command(flatten)]
        a: ReplayArgs,
    }
    let a = <P as clap::Parser>::try_parse_from(
        std::iter::once("replay".to_string()).chain(args.iter().cloned()),
    )
    .map_err(|e| ObserveError::Usage(CliError::Usage(e.to_string())))?
    .a;
    let mut s = setup(&a).map_err(ObserveError::Usage)?;
    s.observe = true;
    let trace = load(&a.traces[0]).map_err(ObserveError::Trace)?;
    let name = a
        .policy
        .first()
        .cloned()
        .unwrap_or_else(|| "predictive".into());
    // the unlimited-HBM run: the baseline time (stall = the difference) and
    // Belady's future
    let mut bs = s.clone();
    bs.observe = false;
    let base = drive::run(
        &trace,
        &bs,
        drive::UNLIMITED,
        Box::new(u3m_core::policy::Lru::new()),
        None,
        None,
    )
    .map_err(ObserveError::Engine)?;
    let (p, arm) = make_policy(&name, &s, &base.log).map_err(ObserveError::Engine)?;
    let out = drive::run(&trace, &s, a.hbm, p, None, arm.as_ref()).map_err(ObserveError::Engine)?;
    Ok(Observation {
        trace,
        out,
        baseline_ns: base.total_ns,
        policy: name,
        setup: s,
        hbm: a.hbm,
    })
}

/// An observed replay and what it ran with.
pub struct Observation {
    pub trace: Trace,
    pub out: drive::RunOut,
    /// Total simulated time of the same trace with unlimited HBM.
    pub baseline_ns: u64,
    pub policy: String,
    pub setup: Setup,
    pub hbm: u64,
}

/// The replay options of `u3m snapshot` and `u3m report`.
pub struct ObserveOpts<'a> {
    pub trace: &'a std::path::Path,
    /// None: unlimited HBM.
    pub hbm: Option<&'a str>,
    pub dram: Option<&'a str>,
    pub nvme: Option<&'a str>,
    pub policy: &'a str,
}

/// `observed` for a subcommand: a malformed trace is reported as `u3m
/// TOOL: FILE:LINE: what` with exit status 3, an engine failure with 1
/// (the `Err` of the inner result).
pub fn observe_for(tool: &str, o: &ObserveOpts) -> Result<Result<Observation, ExitCode>, CliError> {
    let mut args = vec![
        o.trace.display().to_string(),
        "--policy".into(),
        o.policy.to_string(),
        "--hbm".into(),
        o.hbm
            .map_or_else(|| drive::UNLIMITED.to_string(), str::to_string),
    ];
    for (k, v) in [("--dram", o.dram), ("--nvme", o.nvme)] {
        if let Some(v) = v {
            args.push(k.into());
            args.push(v.to_string());
        }
    }
    match observed(&args) {
        Ok(x) => Ok(Ok(x)),
        Err(ObserveError::Usage(e)) => Err(e),
        Err(ObserveError::Trace(e)) => {
            eprintln!("u3m {tool}: {e}");
            Ok(Err(ExitCode::from(3)))
        }
        Err(ObserveError::Engine(e)) => {
            eprintln!("u3m {tool}: {e}");
            Ok(Err(ExitCode::from(1)))
        }
    }
}

/// The replay setup the options describe.
fn setup(a: &ReplayArgs) -> Result<Setup, CliError> {
    if a.watermarks.len() != 2
        || !(0.0..=1.0).contains(&a.watermarks[0])
        || a.watermarks[0] > a.watermarks[1]
        || a.watermarks[1] > 1.0
    {
        return Err(CliError::Usage(format!(
            "--watermarks {:?}: want LOW,HIGH with 0 <= LOW <= HIGH <= 1",
            a.watermarks
        )));
    }
    for p in &a.policy {
        if p == "plan" && a.plan.is_none() {
            return Err(CliError::Usage(
                "--policy plan: the plan policy follows a schedule: give it with --plan FILE"
                    .into(),
            ));
        }
        if !POLICIES.contains(&p.as_str()) && p != "plan" {
            return Err(CliError::Usage(format!(
                "--policy: unknown policy '{p}' (known: {}; plan, with --plan)",
                POLICIES.join(", ")
            )));
        }
    }
    // (not an error: the look-ahead still runs for the other policies)
    let demand: Vec<&str> = a
        .policy
        .iter()
        .map(|p| p.as_str())
        .filter(|p| matches!(*p, "belady" | "plan"))
        .collect();
    if a.look_ahead == "on" && !demand.is_empty() {
        eprintln!(
            "u3m replay: note: --look-ahead on does not apply to {}: it runs with demand paging only",
            demand.join(" and ")
        );
    }
    let plan = match &a.plan {
        None => None,
        Some(_) if !a.policy.iter().any(|p| p == "plan") => {
            return Err(CliError::Usage(
                "--plan FILE: the schedule is for the plan policy: add plan to --policy (e.g. --policy belady,plan)".into(),
            ))
        }
        Some(_) if a.traces.len() > 1 => {
            return Err(CliError::Usage(
                "--plan FILE: a schedule names one trace's lines: give one trace".into(),
            ))
        }
        Some(f) => Some(std::sync::Arc::new(
            schedule::Plan::load(f).map_err(CliError::Usage)?,
        )),
    };
    if a.plan_export.is_some() && a.plan.is_none() {
        return Err(CliError::Usage(
            "--plan-export FILE: it writes the plan policy's schedule: give it with --plan FILE and --policy plan".into(),
        ));
    }
    if let Some(f) = a.schedule.as_ref().filter(|f| f.to_str() != Some("auto")) {
        // read now: a bad file is a usage error, not a failed run
        u3m_core::residency::Schedule::load(f).map_err(CliError::Usage)?;
    }
    if a.hbm < (2 << 20) {
        return Err(CliError::Usage(format!(
            "--hbm {}: at least one 2 MiB chunk",
            a.hbm
        )));
    }
    Ok(Setup {
        costs: Costs {
            link_gbps: a.link_gbps,
            hbm_gbps: a.hbm_gbps,
            tflops: a.tflops,
            launch_us: a.launch_us,
            nvme_read_gbps: a.nvme_read_gbps,
            nvme_write_gbps: a.nvme_write_gbps,
            pageable: a.pageable,
            shared_link: a.link_model == "shared",
            events_at_record: a.event_model != "device",
            handover: match a.event_model.as_str() {
                "handover" => 1,
                "handover-free" => 2,
                _ => 0,
            },
            call_us: a.call_us.unwrap_or(a.launch_us),
        },
        dram: a.dram.unwrap_or(1 << 40),
        nvme: a.nvme,
        min_bytes: a.min_bytes,
        tick_ns: (a.tick_ms.max(0.0) * 1e6) as u64,
        hbm_low: a.watermarks[0],
        hbm_high: a.watermarks[1],
        queue: a.queue.max(1),
        sample_every: a.sample_every,
        windows: a.window.clone(),
        calib_s: a.calib_s,
        warmup_s: a.warmup_s,
        observe: false,
        host_map: a.host_map.clone(),
        look_ahead: a.look_ahead.clone(),
        out_first: a.out_first.clone(),
        handoff: a.handoff.clone(),
        min_gap_us: a.min_gap_us,
        acl_replay: a.issue == "acl-replay",
        discard_dead: a.discard_dead,
        discard_frees: a.discard_frees,
        wait_log_ns: a.wait_log.map(|ms| (ms * 1e6) as u64),
        held: a.held,
        audit: a.audit,
        plan,
        plan_export: a.plan_export.clone(),
        schedule: a.schedule.clone(),
    })
}

/// `--floor`: the window floor of the whole trace and of its step spans.
fn floor_report(
    trace: &Trace,
    path: &std::path::Path,
    s: &Setup,
    a: &ReplayArgs,
) -> Result<report::FloorReport, CliError> {
    let text = std::fs::read_to_string(path).map_err(|err| CliError::Io {
        what: "re-reading the trace for its step comments",
        err,
    })?;
    let steps = floor::steps(&text, trace);
    let marks = floor::step_marks(&text, trace);
    let p = floor::Prepared::new(trace, &s.costs, s.acl_replay);
    let stride = a.floor_stride.map(|n| n as usize);
    let whole = p.floor(a.hbm, 0..trace.events.len(), stride, &marks);
    let mut groups: Vec<(u64, u64)> = Vec::new();
    if a.floor_steps.is_empty() {
        groups.extend(steps.iter().map(|(n, _)| (*n, *n)));
    }
    for g in &a.floor_steps {
        let parsed = match g.split_once('-') {
            Some((x, y)) => x.trim().parse().ok().zip(y.trim().parse().ok()),
            None => g.trim().parse().ok().map(|n| (n, n)),
        };
        match parsed {
            Some((x, y)) if x <= y => groups.push((x, y)),
            _ => {
                return Err(CliError::Usage(format!(
                    "--floor-steps {g}: want N or A-B with A <= B"
                )))
            }
        }
    }
    let mut out = Vec::new();
    for (first, last) in groups {
        let find = |n: u64| steps.iter().find(|(k, _)| *k == n).map(|(_, r)| r.clone());
        let (Some(x), Some(y)) = (find(first), find(last)) else {
            eprintln!(
                "u3m replay: --floor: {} has no `# train step` span for step {first}-{last}",
                trace.name
            );
            continue;
        };
        let span = x.start..y.end;
        out.push(report::StepFloor {
            first,
            last,
            floor: p.floor(a.hbm, span.clone(), stride, &marks),
            span,
        });
    }
    Ok(report::FloorReport { whole, steps: out })
}

/// Reads and validates a whole trace (errors are `file:line: what`).
pub fn load(path: &PathBuf) -> Result<Trace, String> {
    let name = path.display().to_string();
    let mut r = TraceReader::open(path).map_err(|e| format!("{name}: {e}"))?;
    let (mut events, mut lines) = (Vec::new(), Vec::new());
    let mut devices = 1usize;
    while let Some(ev) = r.next() {
        let ev = ev.map_err(|e| e.to_string())?;
        devices = devices.max(ev.dev as usize + 1);
        events.push(ev);
        lines.push(r.line());
    }
    if devices > u3m_core::residency::MAX_DEVICES {
        return Err(format!(
            "{name}: {devices} devices; the engine handles at most {}",
            u3m_core::residency::MAX_DEVICES
        ));
    }
    Ok(Trace {
        name,
        events,
        lines,
        devices,
        frees: Default::default(),
    })
}

/// A policy by name, built as the library builds U3M_POLICY's (with the
/// configuration's parameters); Belady and plan get the baseline's access
/// log, plan its driver side too (`schedule::Armer`).
fn make_policy(
    name: &str,
    s: &Setup,
    log: &[(u64, u64, u3m_core::policy::Touch)],
) -> Result<(Box<dyn Placement>, Option<schedule::Armer>), String> {
    if name == "plan" {
        let plan = s.plan.clone().ok_or("the plan policy needs --plan FILE")?;
        let (p, arm) = schedule::policy(plan, log.to_vec());
        return Ok((Box::new(p), Some(arm)));
    }
    make_plain_policy(name, s, log).map(|p| (p, None))
}

fn make_plain_policy(
    name: &str,
    s: &Setup,
    log: &[(u64, u64, u3m_core::policy::Touch)],
) -> Result<Box<dyn Placement>, String> {
    if name == "belady" {
        return Ok(Box::new(u3m_core::policy::Belady::with_touches(
            log.to_vec(),
        )));
    }
    let mut cfg = drive::config(s, None)?;
    cfg.policy = name.to_string();
    u3m_core::policy::by_config(&cfg).ok_or_else(|| format!("not in this build's u3m_core::policy yet ({name} arrives with the predictive-policy work)"))
}

/// Whether two runs' access logs name the same chunks at the same ticks,
/// reading and writing alike. Whether a write was known to be whole may
/// differ: the baseline is told every one, a run only once its Tier says
/// they matter (`Residency::whole_writes_matter`), as libu3m.so's hooks.
fn same_accesses(
    a: &[(u64, u64, u3m_core::policy::Touch)],
    b: &[(u64, u64, u3m_core::policy::Touch)],
) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.0 == y.0 && x.1 == y.1 && x.2.writes() == y.2.writes())
}

fn replay_trace(
    trace: &Trace,
    s: &Setup,
    hbm: u64,
    policies: &[String],
) -> Result<TraceReport, String> {
    let steps = policies.len() + 1;
    crate::progress::stage(format!("{}, baseline (1/{steps})", trace.name));
    let base = drive::run(
        trace,
        s,
        drive::UNLIMITED,
        Box::new(u3m_core::policy::Lru::new()),
        None,
        None,
    )?;
    let future = Future::new(&base.log);
    let mut rows = Vec::new();
    let mut unavailable = Vec::new();
    for (i, name) in policies.iter().enumerate() {
        crate::progress::stage(format!("{}, {name} ({}/{steps})", trace.name, i + 2));
        let (p, arm) = match make_policy(name, s, &base.log) {
            Ok(p) => p,
            Err(why) => {
                unavailable.push((name.clone(), why));
                continue;
            }
        };
        if let (Some(a), Some(_)) = (arm.as_ref(), s.plan_export.as_ref()) {
            a.start_export();
        }
        let out = drive::run(trace, s, hbm, p, Some(&future), arm.as_ref())?;
        if let (Some(a), Some(f)) = (arm.as_ref(), s.plan_export.as_ref()) {
            std::fs::write(f, a.export_text(&trace.name))
                .map_err(|e| format!("--plan-export {}: {e}", f.display()))?;
        }
        if !same_accesses(&out.log, &base.log) {
            return Err(format!(
                "{}: policy {name}: the engine's logical clock diverged from the baseline run ({} vs {} accesses) — precision/recall and belady would be wrong",
                trace.name,
                out.log.len(),
                base.log.len()
            ));
        }
        rows.push(PolicyRow::new(name, &out, base.total_ns));
    }
    Ok(TraceReport::new(trace, &base, rows, unavailable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use u3m_core::trace::{Event, Range as R8};

    const MIB: u64 = 1 << 20;
    const A: u64 = 0x1000_0000;
    const B: u64 = 0x2000_0000;

    fn setup_for(hbm: &str) -> Setup {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: ReplayArgs,
        }
        let p = <P as clap::Parser>::try_parse_from(["replay", "--hbm", hbm, "unused"]).unwrap();
        setup(&p.a).unwrap()
    }

    /// A trace of `events`, one per line, on one device.
    fn hand(events: Vec<Event>) -> Trace {
        Trace {
            name: "hand".into(),
            lines: (1..=events.len() as u64).collect(),
            events,
            devices: 1,
            frees: Default::default(),
        }
    }

    /// Whether each logged access was known to write its chunk whole.
    fn wholes(log: &[(u64, u64, u3m_core::policy::Touch)]) -> Vec<bool> {
        log.iter().map(|e| e.2.whole()).collect()
    }

    /// As libu3m.so's aclop hook, a run tells the policy an operator's whole
    /// writes only once the Tier says they matter (half the HBM allocated);
    /// the unlimited-HBM baseline, Belady's future, is told every one. The
    /// two logs still agree on every access.
    #[test]
    fn operators_whole_writes_reach_the_policy_once_the_tier_says_they_matter() {
        let events = vec![
            Event::alloc(A, 2 * MIB),
            // 1 of 4 chunks allocated: the gate is shut
            Event::op("Fill", &[], &[R8::new(A, 2 * MIB)]),
            Event::alloc(B, 4 * MIB),
            // 3 of 4: open
            Event::op("Fill", &[], &[R8::new(B, 4 * MIB)]),
            Event::op("Fill", &[], &[R8::new(A, 2 * MIB)]),
        ];
        let trace = hand(events);
        let s = setup_for("8M");
        let lru = || Box::new(u3m_core::policy::Lru::new());
        let run = drive::run(&trace, &s, 8 * MIB, lru(), None, None).unwrap();
        let base = drive::run(&trace, &s, drive::UNLIMITED, lru(), None, None).unwrap();
        assert_eq!(wholes(&run.log), [false, true, true, true]);
        assert_eq!(wholes(&base.log), [true; 4]);
        assert!(same_accesses(&run.log, &base.log));
        let mut other = base.log.clone();
        other[1].2 = u3m_core::policy::Touch::new(false, false);
        assert!(!same_accesses(&other, &base.log), "a read for a write");
        assert!(!same_accesses(&base.log[1..], &base.log), "an access fewer");
    }

    /// `--plan`: the plan policy evicts what the schedule names once its
    /// last use is complete, and takes its victims where Belady would not;
    /// a schedule the trace does not match is refused with the entry named,
    /// not followed in part.
    #[test]
    fn the_plan_policy_follows_its_schedule_and_refuses_one_that_does_not_fit() {
        const C: u64 = 0x3000_0000;
        let events = vec![
            Event::alloc(A, 2 * MIB),
            Event::alloc(B, 2 * MIB),
            Event::alloc(C, 2 * MIB),
            Event::op("Fill", &[], &[R8::new(A, 2 * MIB)]),
            Event::op("Fill", &[], &[R8::new(B, 2 * MIB)]),
            Event::op("Fill", &[], &[R8::new(C, 2 * MIB)]),
            Event::op("Use", &[R8::new(B, 2 * MIB), R8::new(C, 2 * MIB)], &[]),
            Event::op("Use", &[R8::new(A, 2 * MIB)], &[]),
            Event::op("Use", &[R8::new(C, 2 * MIB)], &[]),
        ];
        let trace = hand(events);
        let base_setup = setup_for("4M");
        let lru = Box::new(u3m_core::policy::Lru::new());
        let base = drive::run(&trace, &base_setup, drive::UNLIMITED, lru, None, None).unwrap();
        let run = |plan: &str| {
            let mut s = setup_for("4M");
            s.plan = Some(std::sync::Arc::new(schedule::Plan::parse("p", plan)?));
            let (p, arm) = make_policy("plan", &s, &base.log)?;
            drive::run(&trace, &s, 4 * MIB, p, None, arm.as_ref())
        };
        // Belady: A for C's room (used again at 8, B at 7), B for A's (never
        // used again, C at 9)
        let belady = {
            let s = setup_for("4M");
            let (p, _) = make_policy("belady", &s, &base.log).unwrap();
            drive::run(&trace, &s, 4 * MIB, p, None, None).unwrap()
        };
        assert_eq!((belady.tier.evictions, belady.tier.planned_outs), (2, 0));
        // the same victims planned: A leaves once its fill is done (before
        // C asks), B is the victim for A; entries past the end are ignored
        let same = run("4 0x10000000\n7 0x20000000\n99 0x10000000\n").unwrap();
        assert_eq!(
            (same.tier.evictions, same.tier.planned_outs),
            (2, 1),
            "{:?}",
            same.tier
        );
        // C planned out after line 7: the victim for A although used at 9,
        // so it comes back, for one eviction more
        let other = run("4 0x10000000\n7 0x30000000\n").unwrap();
        assert_eq!(other.tier.evictions, 3, "{:?}", other.tier);
        assert_eq!(other.tier.faults_in, same.tier.faults_in + 1);
        for (plan, says) in [
            ("2 0x10000000", "p:1: the chunk at"),
            (
                "4 0x40000000",
                "p:1: 0x40000000 (device 0) is in no allocation live at hand:4",
            ),
            (
                "4 0x10000000\n0 0x10000000",
                "p:2: trace line 0 holds no event of hand",
            ),
            ("4", "p:1: expected 'LINE ADDR [DEV]'"),
        ] {
            let e = run(plan).err().unwrap_or_default();
            assert!(e.starts_with(says), "{plan}: {e}");
        }
    }

    /// `--discard-frees` reads the trace's `# free` comments once: the
    /// baseline and every policy share them (the file may be gone by the
    /// second run), and the hints reach the Tier (fewer copy-outs).
    #[test]
    fn the_free_hints_are_read_once_for_every_run() {
        let path =
            std::env::temp_dir().join(format!("u3m-frees-once-{}.trace", std::process::id()));
        // X written whole, then freed by the program (a hint, not an F);
        // Y takes the HBM and X's chunk is written whole again
        std::fs::write(
            &path,
            "# u3m-trace 1\n\
             A 0x10000000 2097152\n\
             A 0x20000000 2097152\n\
             S 0x10000000 2097152\n\
             # free 0x10000000 2097152\n\
             S 0x20000000 2097152\n\
             S 0x10000000 2097152\n",
        )
        .unwrap();
        let trace = load(&path).unwrap();
        let mut s = setup_for("2M");
        s.discard_frees = true;
        let lru = || Box::new(u3m_core::policy::Lru::new());
        let first = drive::run(&trace, &s, 2 * MIB, lru(), None, None).unwrap();
        std::fs::remove_file(&path).unwrap();
        let again = drive::run(&trace, &s, 2 * MIB, lru(), None, None).unwrap();
        assert_eq!(first.tier.eviction_bytes, again.tier.eviction_bytes);
        s.discard_frees = false;
        let unhinted = drive::run(&trace, &s, 2 * MIB, lru(), None, None).unwrap();
        assert!(
            first.tier.eviction_bytes < unhinted.tier.eviction_bytes,
            "{} vs {}",
            first.tier.eviction_bytes,
            unhinted.tier.eviction_bytes
        );
    }
}
