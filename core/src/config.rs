//! U3M_* configuration, read once at start-up from the environment. One table
//! (`VARS`) names every variable with its type, valid range, default and
//! meaning: the library's parser, `u3m run`/`u3m ab` validation, `u3m run
//! --help`, the README's variable table and the man page all come from it.
//!
//! The parser is a pure function of a list of (name, value) pairs
//! (`parse`), so it is unit-tested and fuzzed without touching the process
//! environment. It reports every problem, not just the first: an invalid value
//! of a known variable is an error (the library then refuses to start tier
//! mode unless `U3M_ON_CONFIG_ERROR=passthrough`); an unknown `U3M_*` name is a
//! warning with the closest known name, and is ignored.

use std::fmt;
use std::path::PathBuf;

/// What libu3m.so does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward every call untouched; no stats segment.
    Off,
    /// See and report everything, move nothing (bit-for-bit transparent).
    Observe,
    /// Observe, and tier device memory (HBM / DRAM / NVMe).
    Tier,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Observe => "observe",
            Mode::Tier => "tier",
        }
    }
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;
const PIB: u64 = 1 << 50;

/// The type and valid range of a variable's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// One of these words.
    Choice(&'static [&'static str]),
    /// 0 or 1.
    Flag,
    /// A file or directory path; empty means what `VarSpec::empty` says.
    Path,
    /// A byte size (4096, 512M, 2G) within [min, max]; `VarSpec::zero` may
    /// give 0 a meaning of its own.
    Size { min: u64, max: u64 },
    /// A whole number within [min, max].
    Count { min: u64, max: u64 },
    /// Milliseconds within [min, max].
    Millis { min: u64, max: u64 },
    /// A decimal number within [min, max].
    Number { min: f64, max: f64 },
}

/// One documented variable.
pub struct VarSpec {
    pub name: &'static str,
    pub kind: Kind,
    pub default: &'static str,
    /// What an empty value means (None: empty is an error).
    pub empty: Option<&'static str>,
    /// What 0 means when it lies outside the range (None: no such meaning).
    pub zero: Option<&'static str>,
    pub doc: &'static str,
}

impl VarSpec {
    /// The valid values, in words: "off | observe | tier", "2M..64G or 0 (...)".
    pub fn range_text(&self) -> String {
        let mut s = match self.kind {
            Kind::Choice(c) => c.join(" | "),
            Kind::Flag => "0 | 1".into(),
            Kind::Path => "path".into(),
            Kind::Size { min, max } => format!("{}..{}", size_text(min), size_text(max)),
            Kind::Count { min, max } => format!("{min}..{max}"),
            Kind::Millis { min, max } => format!("{min}..{max} ms"),
            Kind::Number { min, max } => format!("{min}..{max}"),
        };
        if let Some(z) = self.zero {
            s.push_str(&format!(", or 0: {z}"));
        }
        if let Some(e) = self.empty {
            s.push_str(&format!(" (empty: {e})"));
        }
        s
    }

    /// Placeholder for this value in usage text.
    pub fn value_name(&self) -> &'static str {
        match self.kind {
            Kind::Choice(_) if self.name == "U3M_MODE" => "MODE",
            Kind::Choice(_) if self.name == "U3M_LOG" => "LEVEL",
            Kind::Choice(_) if self.name == "U3M_POLICY" => "NAME",
            Kind::Choice(_) => "WORD",
            Kind::Flag => "0|1",
            Kind::Path if self.name.ends_with("_DIR") => "DIR",
            Kind::Path => "PATH",
            Kind::Size { .. } if self.name == "U3M_SSD_RATE" => "BYTES_PER_S",
            Kind::Size { .. } => "BYTES",
            Kind::Count { .. } if self.name.starts_with("U3M_MAX_") => "COUNT",
            Kind::Count { .. } if self.name.ends_with("_US") => "MICROSECONDS",
            Kind::Count { .. } => "N",
            Kind::Millis { .. } => "MS",
            Kind::Number { .. } if self.name.starts_with("U3M_HBM_") => "FRACTION",
            Kind::Number { .. } if self.name == "U3M_OVERSUB" => "RATIO",
            Kind::Number { .. } if self.name == "U3M_LINK_GBPS" => "GBPS",
            Kind::Number { .. } => "SECONDS",
        }
    }
}

/// A size in the shortest binary unit that is exact: 2M, 64G, 4096.
pub fn size_text(b: u64) -> String {
    for (unit, m) in [("P", PIB), ("T", TIB), ("G", GIB), ("M", MIB), ("K", KIB)] {
        if b >= m && b % m == 0 {
            return format!("{}{unit}", b / m);
        }
    }
    b.to_string()
}

/// Longest wait the library may be asked to make for room (U3M_ALLOC_WAIT_MS).
pub const MAX_ALLOC_WAIT_MS: u64 = 600_000;

/// Every U3M_* variable libu3m.so understands.
pub const VARS: &[VarSpec] = &[
    VarSpec { name: "U3M_MODE", kind: Kind::Choice(&["off", "observe", "tier"]), default: "tier", empty: None, zero: None,
        doc: "off: forward every call untouched; observe: see and report everything, move nothing; tier: observe and move cold device memory to DRAM / NVMe" },
    VarSpec { name: "U3M_TRACE", kind: Kind::Path, default: "", empty: Some("no trace"), zero: None,
        doc: "record the run to this trace file (u3m trace format v1)" },
    VarSpec { name: "U3M_TRACE_LOSSLESS", kind: Kind::Flag, default: "0", empty: None, zero: None,
        doc: "1: the trace recorder never drops events (producers wait)" },
    VarSpec { name: "U3M_SUMMARY", kind: Kind::Path, default: "", empty: Some("no summary file"), zero: None,
        doc: "write a JSON summary of the run (tier traffic, counters) to this file at exit" },
    VarSpec { name: "U3M_SHM_DIR", kind: Kind::Path, default: "/dev/shm", empty: Some("/dev/shm"), zero: None,
        doc: "directory of the stats segments (u3m.<pid>)" },
    VarSpec { name: "U3M_LOG", kind: Kind::Choice(&["quiet", "warn", "info", "debug"]), default: "warn", empty: None, zero: None,
        doc: "stderr verbosity: quiet (nothing), warn (problems), info (a start line and an exit summary), debug (also rate-limited per-migration lines)" },
    VarSpec { name: "U3M_ON_CONFIG_ERROR", kind: Kind::Choice(&["fail", "passthrough"]), default: "fail", empty: None, zero: None,
        doc: "an invalid U3M_* value in tier mode: fail (aclInit returns an error, nothing runs untiered) or passthrough (run without u3m)" },
    VarSpec { name: "U3M_HOT_INTERVAL_MS", kind: Kind::Millis { min: 10, max: 3_600_000 }, default: "500", empty: None, zero: None,
        doc: "how often the hottest ranges are published to the stats segment" },
    VarSpec { name: "U3M_MAX_ALLOCS", kind: Kind::Count { min: 1024, max: 1 << 26 }, default: "1048576", empty: None, zero: None,
        doc: "capacity of the heat table's allocation table" },
    VarSpec { name: "U3M_MAX_RANGES", kind: Kind::Count { min: 1024, max: 1 << 26 }, default: "262144", empty: None, zero: None,
        doc: "capacity of the heat table's tensor-range table" },
    VarSpec { name: "U3M_MIN_BYTES", kind: Kind::Size { min: 4 * KIB, max: 64 * GIB }, default: "2M", empty: None, zero: None,
        doc: "tier mode: allocations at least this large are managed (moved between tiers)" },
    VarSpec { name: "U3M_DRAM_BYTES", kind: Kind::Size { min: 2 * MIB, max: PIB }, default: "0", empty: None, zero: Some("half of physical RAM"),
        doc: "tier mode: pinned host DRAM tier size" },
    VarSpec { name: "U3M_SWAP_DIR", kind: Kind::Path, default: "", empty: Some("no NVMe tier"), zero: None,
        doc: "tier mode: directory for NVMe swap files" },
    VarSpec { name: "U3M_SWAP_BYTES", kind: Kind::Size { min: 2 * MIB, max: PIB }, default: "0", empty: None, zero: Some("90% of the swap directory's free space, less 1 GiB"),
        doc: "tier mode: NVMe tier size (needs U3M_SWAP_DIR)" },
    VarSpec { name: "U3M_HBM_LOW", kind: Kind::Number { min: 0.05, max: 1.0 }, default: "0.75", empty: None, zero: None,
        doc: "tier mode: low watermark (fraction of HBM) background eviction stops at" },
    VarSpec { name: "U3M_HBM_HIGH", kind: Kind::Number { min: 0.05, max: 1.0 }, default: "0.90", empty: None, zero: None,
        doc: "tier mode: high watermark (fraction of HBM) background eviction starts at" },
    VarSpec { name: "U3M_SSD_RATE", kind: Kind::Size { min: MIB, max: TIB }, default: "1G", empty: None, zero: None,
        doc: "tier mode: emergency spill rate limit from DRAM to NVMe, bytes/s" },
    VarSpec { name: "U3M_ALLOC_WAIT_MS", kind: Kind::Millis { min: 0, max: MAX_ALLOC_WAIT_MS }, default: "1000", empty: None, zero: None,
        doc: "tier mode: how long a new allocation waits for room when every tier is full, and how long an allocation u3m does not manage, refused for lack of HBM, goes on having managed chunks evicted for it" },
    VarSpec { name: "U3M_OVERSUB", kind: Kind::Number { min: 1.0, max: 64.0 }, default: "1.5", empty: None, zero: None,
        doc: "tier mode: virtual HBM capacity as a multiple of physical (allocations beyond it fail with 207001)" },
    VarSpec { name: "U3M_HOST_MAP", kind: Kind::Choice(&["auto", "probe", "stream", "off"]), default: "auto", empty: None, zero: None,
        doc: "tier mode: auto: a call whose memory exceeds HBM runs with part of it in pinned host memory mapped at its device addresses (read over the link); probe: auto, and chunks a call only reads that form a read-once stream (read repeatedly, never written, not expected back before HBM turns over) are host-mapped instead of copied in while HBM is full, whenever the device times a window of calls with mapping faster than one with copies (docs/tiering.md, the read-once probe); stream: auto, always mapping read-once streams; off: a call larger than HBM fails with 207001" },
    VarSpec { name: "U3M_LOOK_AHEAD", kind: Kind::Choice(&["on", "off"]), default: "off", empty: None, zero: None,
        doc: "tier mode: on: after each call, copy-ins of the chunks the policy predicts within an adaptive window start on u3m's stream (evicting only clean victims predicted later; it backs off to probing while under 75 % of its prefetches are used); off: chunks come back on demand and by the background prefetch only (the default: the look-ahead has not shortened a measured step yet, BENCHMARKS.md)" },
    VarSpec { name: "U3M_OUT_FIRST", kind: Kind::Choice(&["off", "auto", "on"]), default: "off", empty: None, zero: None,
        doc: "tier mode: on: a dirty chunk whose predicted next use writes it whole (its copy-out is all evicting it costs) goes before clean chunks (whose copy-ins would come back), spending the device-to-host direction of the link to spare the host-to-device one: shorter steps where copy-ins load the link, more bytes moved in all; auto: on once u3m's copy-ins have outrun its copy-outs by 1 GiB, off again for good if the copy-outs then come to more than twice the copy-ins over 8 GiB; off: it weighs as a clean chunk does (the default: fewest bytes; docs/tiering.md)" },
    VarSpec { name: "U3M_HANDOFF", kind: Kind::Choice(&["on", "off"]), default: "off", empty: None, zero: None,
        doc: "tier mode: on: a copy-in that finds HBM full takes the memory of the oldest copy-out still in flight, ordered after that copy on the device, instead of the host waiting for it to land; and an eviction an outside schedule names (u3m replay --plan) of a chunk still in use is ordered after its uses on the device instead of waiting for them; both stop for good once the program queues work that waits for its host (a host function or callback, a value or notify wait: docs/tiering.md); off: the host waits (the default: it pays only under a plan, BENCHMARKS.md)" },
    VarSpec { name: "U3M_PLAN", kind: Kind::Path, default: "", empty: Some("no schedule"), zero: None,
        doc: "tier mode: a schedule of evictions to follow, 'CALL ALLOC CHUNK [DEV]' per line (after u3m's CALL-th call that touches managed memory, chunk CHUNK of the ALLOC-th allocation u3m manages on device DEV leaves HBM as soon as its uses allow; u3m replay --plan-export writes one from a planner's trace-keyed plan); auto: u3m finds the program's step, records one and plans the schedule itself (pays with U3M_HANDOFF=on); the first entry the run does not match stops it, named at exit (docs/tiering.md)" },
    VarSpec { name: "U3M_PLAN_MIN_GAP_US", kind: Kind::Count { min: 0, max: 3_600_000_000 }, default: "30000", empty: None, zero: Some("no gap kept"),
        doc: "tier mode, U3M_PLAN=auto: the planner keeps in HBM every chunk whose next use comes less than this much device time (µs) after its last: a host running that far ahead of the device would find it still on its way out (docs/tiering.md)" },
    VarSpec { name: "U3M_LINK_GBPS", kind: Kind::Number { min: 0.1, max: 10000.0 }, default: "25", empty: None, zero: None,
        doc: "tier mode, U3M_PLAN=auto: the host link's rate each way, GB/s, as the planner counts it" },
    VarSpec { name: "U3M_TORCH_HINTS", kind: Kind::Choice(&["on", "off"]), default: "off", empty: None, zero: None,
        doc: "tier mode: on: in a process running torch_npu of a version whose allocator layout u3m knows (2.14.0), every block its caching allocator frees is a u3m_discard hint (the freed bytes are dead until written again), so chunks holding only freed blocks leave HBM without a copy-out: fewer bytes moved, but not always a shorter step (docs/torch-npu.md); other versions and programs are left alone; off: no hints (the default)" },
    VarSpec { name: "U3M_POLICY", kind: Kind::Choice(crate::policy::LIBRARY_POLICIES), default: "predictive", empty: None, zero: None,
        doc: "placement policy: predictive (furthest predicted next use first, prefetch of the predicted next) | seed-heat (coldest by the seed's heat first) | lru" },
    VarSpec { name: "U3M_CALIB_S", kind: Kind::Number { min: 0.001, max: 604_800.0 }, default: "600", empty: None, zero: None,
        doc: "predictor calibration period, seconds" },
    VarSpec { name: "U3M_WARMUP_S", kind: Kind::Number { min: 0.0, max: 86_400.0 }, default: "30", empty: None, zero: None,
        doc: "predictor re-warm time after a mode switch, seconds" },
    VarSpec { name: "U3M_DEBUG_PANIC_AT_OP", kind: Kind::Count { min: 1, max: u64::MAX }, default: "0", empty: None, zero: Some("never"),
        doc: "testing aid: the engine panics at this operator launch (proves a panic falls back to pass-through)" },
];

/// U3M_* variables of the scripts, tests and benchmarks (not of the
/// library, which ignores them silently): (name, meaning).
pub const TOOL_VARS: &[(&str, &str)] = &[
    ("U3M_SKIP_TORCH", "1: skip the torch_npu tier of the tests (offline; it needs a 5.5 GB venv from PyPI)"),
    ("U3M_SKIP_ABI", "1: skip the ABI conformance tests (offline; they need the torch-npu wheel from PyPI)"),
    ("U3M_SKIP_PROMETHEUS", "1: skip the exporter test's real Prometheus (and its install)"),
    ("U3M_SKIP_BROWSER", "1: skip the HTML report's headless-Chromium test (and its install)"),
    ("U3M_SKIP_WHEEL", "1: skip building and installing the Python wheel"),
    ("U3M_SKIP_DEPLOY_SCHEMA", "1: skip the DaemonSet schema check (it needs kubernetes-validate from PyPI)"),
    ("U3M_SKIP_LOOM", "1: ci/test.sh skips the loom models (loom/)"),
    ("U3M_SKIP_FUZZ", "1: ci/test.sh skips the bounded fuzz run (fuzz/)"),
    ("U3M_SKIP_SANITIZERS", "1: ci/test.sh skips the ASan/UBSan run of the simulator and programs"),
    ("U3M_ASAN_FULL", "1: ci/sanitizers.sh also runs the whole tier suite (docs/reliability.md)"),
    ("U3M_ASAN_REAL_CC", "internal to ci/sanitizers.sh (the compiler its wrapper calls)"),
    ("U3M_ASAN_TARGET_DIR", "ci/sanitizers.sh: target directory of the sanitizer build"),
    ("U3M_FUZZ_SECS", "ci/fuzz.sh: seconds per target (default 25)"),
    ("U3M_FUZZ_TARGETS", "ci/fuzz.sh: which targets to run"),
    ("U3M_FUZZ_TARGET_DIR", "ci/fuzz.sh: target directory of the fuzz build"),
    ("U3M_FUZZ_UNGUARDED", "internal to ci/fuzz.sh (run without the known-crash guards)"),
    ("U3M_LOOM_TARGET_DIR", "ci/loom.sh: target directory of the loom build"),
    ("U3M_DIFFTEST_SEEDS", "differential tester: sequences to run (default 16)"),
    ("U3M_DIFFTEST_CALLS", "differential tester: calls per sequence (default 120)"),
    ("U3M_DIFFTEST_SEED", "differential tester: first seed, or `random`"),
    ("U3M_DIFFTEST_ALL", "differential tester: 1 generates the open findings' calls too"),
    ("U3M_DIFFTEST_FINDINGS", "differential tester: e.g. 1,4 — generate those open findings' calls"),
    ("U3M_DIFFTEST_KEEP", "differential tester: keep every script and both outputs in this directory"),
    ("U3M_SOAK_SECS", "soak test duration in seconds (120 under CI=true, 20 otherwise)"),
    ("U3M_SOAK_SEED", "soak test seed"),
    ("U3M_CACHE", "cache directory of the ci scripts (default ~/.cache/u3m): torch venv, CANN headers"),
    ("U3M_TEST_THREADS", "ci/test.sh: test threads per test binary (default 2)"),
    (
        "U3M_UPDATE_DOCS",
        "1: the doc-table tests rewrite the generated tables in README.md and docs/stats.md instead of failing",
    ),
    ("U3M_TEST_CRASH_TRACE", "internal to the trace-recorder crash test"),
    ("U3M_EVAL_TRACE", "developer test: evaluate the predictor on this trace (with U3M_EVAL_SPT, U3M_EVAL_FROM, U3M_EVAL_TO, U3M_EVAL_CAP)"),
    ("U3M_EVAL_SPT", "see U3M_EVAL_TRACE"),
    ("U3M_EVAL_FROM", "see U3M_EVAL_TRACE"),
    ("U3M_EVAL_TO", "see U3M_EVAL_TRACE"),
    ("U3M_EVAL_CAP", "see U3M_EVAL_TRACE"),
];

pub fn spec(name: &str) -> Option<&'static VarSpec> {
    VARS.iter().find(|v| v.name == name)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Quiet,
    Warn,
    Info,
    Debug,
}

/// Read-once streams under U3M_HOST_MAP (residency/hostmap.rs, probe.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOnce {
    /// Copied in like any chunk (auto, off).
    Off,
    /// Host-mapped while the read-once probe times mapping faster (probe).
    Probe,
    /// Always host-mapped (stream).
    Always,
}

/// U3M_OUT_FIRST (residency/balance.rs): whether a dirty chunk whose next
/// use writes it whole goes before clean chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutFirst {
    /// Once u3m's copy-ins have outrun its copy-outs.
    Auto,
    On,
    /// Never (the default).
    Off,
}

/// The parsed configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub mode: Mode,
    pub trace: Option<PathBuf>,
    pub trace_lossless: bool,
    pub summary: Option<PathBuf>,
    pub shm_dir: PathBuf,
    pub log: LogLevel,
    /// U3M_ON_CONFIG_ERROR=passthrough.
    pub passthrough_on_error: bool,
    pub hot_interval_ms: u64,
    pub max_allocs: usize,
    pub max_ranges: usize,
    pub min_bytes: u64,
    pub dram_bytes: u64,
    pub swap_dir: Option<PathBuf>,
    /// 0: size the NVMe tier from the swap directory's free space.
    pub swap_bytes: u64,
    pub hbm_low: f64,
    pub hbm_high: f64,
    pub ssd_rate: u64,
    pub alloc_wait_ms: u64,
    pub oversub: f64,
    /// U3M_HOST_MAP=auto, probe or stream: calls larger than HBM run with
    /// host-mapped chunks.
    pub host_map: bool,
    pub policy: String,
    pub calib_s: f64,
    pub warmup_s: f64,
    pub debug_panic_at_op: u64,
    /// What U3M_HOST_MAP does with read-once streams (residency/hostmap.rs).
    pub read_once: ReadOnce,
    /// U3M_LOOK_AHEAD=on: the look-ahead prefetch (residency/ahead.rs).
    pub look_ahead: bool,
    /// U3M_OUT_FIRST (residency/balance.rs).
    pub out_first: OutFirst,
    /// U3M_HANDOFF: a copy-in may take the HBM of a dirty victim whose
    /// copy-out is still in flight, ordered after it on the device
    /// (residency/migrate.rs `take_outgoing`).
    pub handoff: bool,
    /// U3M_PLAN: a schedule of evictions (residency/schedule.rs), or
    /// "auto": planned by u3m (residency/autoplan.rs).
    pub plan: Option<PathBuf>,
    /// U3M_PLAN_MIN_GAP_US, U3M_LINK_GBPS: U3M_PLAN=auto's planner.
    pub plan_min_gap_us: f64,
    pub link_gbps: f64,
    /// U3M_TORCH_HINTS=on: torch_npu's freed blocks become discard hints
    /// (src/torch_hints.rs in libu3m.so).
    pub torch_hints: bool,
    /// (name, value) of every known U3M_* variable that was set, for the
    /// stats segment's configuration text.
    pub set: Vec<(String, String)>,
}

/// A configuration error: the variable and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub var: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.var, self.reason)
    }
}

/// A U3M_* name u3m does not know (a typo, or a newer u3m's variable).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unknown {
    pub name: String,
    /// The closest known name, when one is close.
    pub suggestion: Option<&'static str>,
}

impl fmt::Display for Unknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: unknown variable, ignored", self.name)?;
        if let Some(s) = self.suggestion {
            write!(f, " (did you mean {s}?)")?;
        }
        Ok(())
    }
}

/// Everything `parse` found: the configuration (defaults in place of
/// invalid values), every invalid value, every unknown name.
#[derive(Clone, Debug)]
pub struct Parsed {
    pub config: Config,
    pub errors: Vec<ConfigError>,
    pub unknown: Vec<Unknown>,
}

impl Parsed {
    /// What the library does about the errors: fail (refuse tier mode) unless
    /// the valid part of the configuration says observe/off or passthrough.
    pub fn must_fail(&self) -> bool {
        if self.errors.is_empty() {
            return false;
        }
        let mode_bad = self.errors.iter().any(|e| e.var == "U3M_MODE");
        let on_err_bad = self.errors.iter().any(|e| e.var == "U3M_ON_CONFIG_ERROR");
        let wants_tier = mode_bad || self.config.mode == Mode::Tier;
        wants_tier && (on_err_bad || !self.config.passthrough_on_error)
    }
}

/// Parses a byte size: 4096, 64K, 2M, 1.5G, 1T, 1P (binary units; KiB/MiB/...
/// and a trailing B accepted). Whole numbers are exact up to u64::MAX.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Ok(v) = s.parse::<u64>() {
        return Some(v);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    let mul = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches('B')
        .trim_end_matches('I')
    {
        "" => 1.0,
        "K" => KIB as f64,
        "M" => MIB as f64,
        "G" => GIB as f64,
        "T" => TIB as f64,
        "P" => PIB as f64,
        _ => return None,
    };
    let b = v * mul;
    if b >= u64::MAX as f64 {
        None
    } else {
        Some(b as u64)
    }
}

/// A checked value of one variable.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Word(&'static str),
    Flag(bool),
    Path(Option<PathBuf>),
    Int(u64),
    Num(f64),
}

/// Checks one raw value against its variable's kind and range.
fn check(v: &VarSpec, raw: &str) -> Result<Value, String> {
    let t = raw.trim();
    if t.is_empty() {
        return match (v.kind, v.empty) {
            (Kind::Path, Some(_)) => Ok(Value::Path(None)),
            _ => Err(format!(
                "empty value (expected {}; unset the variable for the default, {})",
                v.range_text(),
                if v.default.is_empty() {
                    "none"
                } else {
                    v.default
                }
            )),
        };
    }
    let zero_ok = |n: u64| n == 0 && v.zero.is_some();
    match v.kind {
        Kind::Choice(words) => words
            .iter()
            .find(|w| **w == t)
            .map(|w| Value::Word(w))
            .ok_or_else(|| format!("'{raw}' is not one of {}", words.join(", "))),
        Kind::Flag => match t {
            "0" => Ok(Value::Flag(false)),
            "1" => Ok(Value::Flag(true)),
            _ => Err(format!("'{raw}' is not 0 or 1")),
        },
        Kind::Path => {
            if raw.contains('\0') {
                Err("a path cannot contain NUL".into())
            } else {
                Ok(Value::Path(Some(PathBuf::from(raw))))
            }
        }
        Kind::Size { min, max } => {
            let n = parse_size(t)
                .ok_or_else(|| format!("'{raw}' is not a byte size (e.g. 4096, 512M, 2G)"))?;
            if zero_ok(n) || (min..=max).contains(&n) {
                Ok(Value::Int(n))
            } else {
                Err(format!("'{raw}' is outside {}", v.range_text()))
            }
        }
        Kind::Count { min, max } | Kind::Millis { min, max } => {
            let n: u64 = t
                .parse()
                .map_err(|_| format!("'{raw}' is not a whole number"))?;
            if zero_ok(n) || (min..=max).contains(&n) {
                Ok(Value::Int(n))
            } else {
                Err(format!("'{raw}' is outside {}", v.range_text()))
            }
        }
        Kind::Number { min, max } => match t.parse::<f64>() {
            Ok(x) if x.is_finite() && x >= min && x <= max => Ok(Value::Num(x)),
            Ok(_) => Err(format!("'{raw}' is outside {}", v.range_text())),
            Err(_) => Err(format!("'{raw}' is not a number")),
        },
    }
}

/// Levenshtein distance (names are short ASCII).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The known name closest to `name`, if within a third of its length.
pub fn closest(name: &str) -> Option<&'static str> {
    let (d, best) = VARS
        .iter()
        .map(|v| (distance(name, v.name), v.name))
        .min()?;
    (d <= (name.len() / 3).max(2)).then_some(best)
}

/// Parses (name, value) pairs; names not starting with U3M_ are ignored.
pub fn parse<I: IntoIterator<Item = (String, String)>>(vars: I) -> Parsed {
    let mut set: Vec<(String, String)> = Vec::new();
    let mut unknown = Vec::new();
    for (k, v) in vars {
        if !k.starts_with("U3M_") {
            continue;
        }
        if spec(&k).is_some() {
            // the last value of a name wins, as in an environment
            match set.iter_mut().find(|(n, _)| *n == k) {
                Some(e) => e.1 = v,
                None => set.push((k, v)),
            }
        } else if !TOOL_VARS.iter().any(|(n, _)| *n == k) {
            unknown.push(Unknown {
                suggestion: closest(&k),
                name: k,
            });
        }
    }
    set.sort();
    unknown.sort_by(|a, b| a.name.cmp(&b.name));
    let mut errors = Vec::new();
    // Each variable's checked value, or its default when unset or invalid.
    let mut values: Vec<Value> = Vec::with_capacity(VARS.len());
    for v in VARS {
        let raw = set
            .iter()
            .find(|(k, _)| k == v.name)
            .map(|(_, x)| x.as_str());
        let checked = match raw {
            Some(r) => check(v, r).map_err(|reason| ConfigError {
                var: v.name.to_string(),
                reason,
            }),
            None => Ok(check(v, v.default).expect("defaults are valid")),
        };
        values.push(checked.unwrap_or_else(|e| {
            errors.push(e);
            check(v, v.default).expect("defaults are valid")
        }));
    }
    let get = |name: &str| -> &Value {
        let i = VARS.iter().position(|v| v.name == name).expect("known");
        &values[i]
    };
    let word = |n: &str| match get(n) {
        Value::Word(w) => *w,
        _ => unreachable!("{n} is a choice"),
    };
    let int = |n: &str| match get(n) {
        Value::Int(i) => *i,
        _ => unreachable!("{n} is a number"),
    };
    let num = |n: &str| match get(n) {
        Value::Num(x) => *x,
        _ => unreachable!("{n} is a number"),
    };
    let path = |n: &str| match get(n) {
        Value::Path(p) => p.clone(),
        _ => unreachable!("{n} is a path"),
    };
    let mode = match word("U3M_MODE") {
        "off" => Mode::Off,
        "observe" => Mode::Observe,
        _ => Mode::Tier,
    };
    let log = match word("U3M_LOG") {
        "quiet" => LogLevel::Quiet,
        "info" => LogLevel::Info,
        "debug" => LogLevel::Debug,
        _ => LogLevel::Warn,
    };
    let mut hbm_low = num("U3M_HBM_LOW");
    let mut hbm_high = num("U3M_HBM_HIGH");
    if hbm_low > hbm_high {
        errors.push(ConfigError {
            var: "U3M_HBM_LOW".into(),
            reason: format!("{hbm_low} is above U3M_HBM_HIGH ({hbm_high})"),
        });
        hbm_low = 0.75;
        hbm_high = 0.90;
    }
    let swap_dir = path("U3M_SWAP_DIR");
    let mut swap_bytes = int("U3M_SWAP_BYTES");
    if swap_dir.is_none() && swap_bytes != 0 {
        errors.push(ConfigError {
            var: "U3M_SWAP_BYTES".into(),
            reason: "set without U3M_SWAP_DIR (the NVMe tier needs a directory)".into(),
        });
        swap_bytes = 0;
    }
    errors.sort_by(|a, b| a.var.cmp(&b.var));
    let config = Config {
        mode,
        trace: path("U3M_TRACE"),
        trace_lossless: matches!(get("U3M_TRACE_LOSSLESS"), Value::Flag(true)),
        summary: path("U3M_SUMMARY"),
        shm_dir: path("U3M_SHM_DIR").unwrap_or_else(|| PathBuf::from("/dev/shm")),
        log,
        passthrough_on_error: word("U3M_ON_CONFIG_ERROR") == "passthrough",
        hot_interval_ms: int("U3M_HOT_INTERVAL_MS"),
        max_allocs: int("U3M_MAX_ALLOCS") as usize,
        max_ranges: int("U3M_MAX_RANGES") as usize,
        min_bytes: int("U3M_MIN_BYTES"),
        dram_bytes: int("U3M_DRAM_BYTES"),
        swap_dir,
        swap_bytes,
        hbm_low,
        hbm_high,
        ssd_rate: int("U3M_SSD_RATE"),
        alloc_wait_ms: int("U3M_ALLOC_WAIT_MS"),
        oversub: num("U3M_OVERSUB"),
        host_map: word("U3M_HOST_MAP") != "off",
        read_once: match word("U3M_HOST_MAP") {
            "probe" => ReadOnce::Probe,
            "stream" => ReadOnce::Always,
            _ => ReadOnce::Off,
        },
        look_ahead: word("U3M_LOOK_AHEAD") == "on",
        out_first: match word("U3M_OUT_FIRST") {
            "on" => OutFirst::On,
            "auto" => OutFirst::Auto,
            _ => OutFirst::Off,
        },
        handoff: word("U3M_HANDOFF") == "on",
        plan: path("U3M_PLAN"),
        plan_min_gap_us: int("U3M_PLAN_MIN_GAP_US") as f64,
        link_gbps: num("U3M_LINK_GBPS"),
        torch_hints: word("U3M_TORCH_HINTS") == "on",
        policy: word("U3M_POLICY").to_string(),
        calib_s: num("U3M_CALIB_S"),
        warmup_s: num("U3M_WARMUP_S"),
        debug_panic_at_op: int("U3M_DEBUG_PANIC_AT_OP"),
        set,
    };
    Parsed {
        config,
        errors,
        unknown,
    }
}

/// Free space to leave on the swap file system when U3M_SWAP_BYTES is 0.
pub const SWAP_MARGIN_BYTES: u64 = GIB;

/// The NVMe tier's size when U3M_SWAP_BYTES is 0: 90 % of the free space,
/// less `SWAP_MARGIN_BYTES`, in whole 2 MiB chunks (0 when that leaves none).
pub fn swap_bytes_from_free(free: u64) -> u64 {
    let b = (free / 10 * 9).saturating_sub(SWAP_MARGIN_BYTES);
    b / (2 * MIB) * (2 * MIB)
}

/// Bytes free for an unprivileged user on the file system holding `dir`.
pub fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated path and a zeroed out-struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

impl Config {
    /// The NVMe tier's size: 0 without U3M_SWAP_DIR, U3M_SWAP_BYTES when set,
    /// else `swap_bytes_from_free` of the directory's file system.
    pub fn nvme_bytes(&self) -> Result<u64, String> {
        let Some(dir) = &self.swap_dir else {
            return Ok(0);
        };
        if self.swap_bytes > 0 {
            return Ok(self.swap_bytes);
        }
        let free = free_bytes(dir).map_err(|e| format!("U3M_SWAP_DIR={}: {e}", dir.display()))?;
        match swap_bytes_from_free(free) {
            0 => Err(format!(
                "U3M_SWAP_DIR={}: {} free, nothing left for an NVMe tier after the {} margin; free space or set U3M_SWAP_BYTES",
                dir.display(),
                size_text(free),
                size_text(SWAP_MARGIN_BYTES)
            )),
            b => Ok(b),
        }
    }

    /// Defaults, as if no variable were set.
    pub fn defaults() -> Config {
        parse(std::iter::empty::<(String, String)>()).config
    }

    /// The process environment as (name, value) pairs of U3M_* variables
    /// (non-UTF-8 values read as an invalid value, not skipped).
    pub fn env_vars() -> Vec<(String, String)> {
        std::env::vars_os()
            .filter_map(|(k, v)| {
                let k = k.into_string().ok()?;
                k.starts_with("U3M_")
                    .then(|| (k, v.into_string().unwrap_or_else(|_| "\u{fffd}".into())))
            })
            .collect()
    }

    /// From the process environment; the first invalid value is the error.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_vars(Config::env_vars())
    }

    /// From (name, value) pairs; names not starting with U3M_ and unknown
    /// U3M_* names are ignored; the first invalid value is the error.
    pub fn from_vars<I: IntoIterator<Item = (String, String)>>(
        vars: I,
    ) -> Result<Config, ConfigError> {
        let p = parse(vars);
        match p.errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(p.config),
        }
    }

    /// One line per set variable, plus the mode: the stats segment's text.
    pub fn summary(&self) -> String {
        let mut s = format!("mode={}", self.mode.name());
        for (k, v) in &self.set {
            if k != "U3M_MODE" {
                s.push(' ');
                s.push_str(k);
                s.push('=');
                s.push_str(v);
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    fn parsed(pairs: &[(&str, &str)]) -> Parsed {
        parse(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    fn err_of(var: &str, val: &str) -> ConfigError {
        cfg(&[(var, val)]).expect_err(&format!("{var}={val:?} must be refused"))
    }

    #[test]
    fn defaults_are_tier() {
        let c = Config::defaults();
        assert_eq!(c.mode, Mode::Tier);
        assert_eq!(c.min_bytes, 2 << 20);
        assert_eq!(c.hbm_high, 0.90);
        assert!(c.trace.is_none());
        assert!(!c.passthrough_on_error);
        assert_eq!(c.swap_bytes, 0);
    }

    #[test]
    fn every_default_and_range_is_consistent() {
        for v in VARS {
            assert!(v.name.starts_with("U3M_"), "{}", v.name);
            assert!(
                check(v, v.default).is_ok(),
                "{} default {}",
                v.name,
                v.default
            );
            assert!(!v.doc.is_empty() && !v.range_text().is_empty());
            assert_eq!(
                v.empty.is_some(),
                matches!(v.kind, Kind::Path),
                "{}",
                v.name
            );
            match v.kind {
                Kind::Size { min, max } | Kind::Count { min, max } | Kind::Millis { min, max } => {
                    assert!(min <= max);
                    if max < u64::MAX {
                        let over = (max + 1).to_string();
                        assert!(check(v, &over).is_err(), "{} accepts {over}", v.name);
                    }
                    if min > 1 {
                        let under = (min - 1).to_string();
                        assert!(check(v, &under).is_err(), "{} accepts {under}", v.name);
                    }
                }
                Kind::Number { min, max } => {
                    assert!(
                        check(v, &format!("{}", max * 1.01 + 0.01)).is_err(),
                        "{}",
                        v.name
                    );
                    assert!(check(v, &format!("{}", min - 0.01)).is_err(), "{}", v.name);
                }
                _ => {}
            }
        }
        let mut names: Vec<&str> = VARS.iter().map(|v| v.name).collect();
        names.extend(TOOL_VARS.iter().map(|t| t.0));
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a name is listed twice");
    }

    #[test]
    fn unknown_names_warn_with_the_closest_and_are_ignored() {
        let p = parsed(&[("U3M_OVERSUBB", "2"), ("U3M_MOED", "tier")]);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(
            p.unknown,
            vec![
                Unknown {
                    name: "U3M_MOED".into(),
                    suggestion: Some("U3M_MODE")
                },
                Unknown {
                    name: "U3M_OVERSUBB".into(),
                    suggestion: Some("U3M_OVERSUB")
                },
            ]
        );
        assert_eq!(
            p.unknown[1].to_string(),
            "U3M_OVERSUBB: unknown variable, ignored (did you mean U3M_OVERSUB?)"
        );
        assert_eq!(p.config.oversub, 1.5, "the typo does not set anything");
        assert_eq!(closest("U3M_SOMETHING_ELSE_ENTIRELY"), None);
        // the scripts' variables are known, not typos
        assert!(parsed(&[("U3M_SKIP_TORCH", "1"), ("U3M_CACHE", "/c")])
            .unknown
            .is_empty());
    }

    #[test]
    fn bad_values_are_named() {
        assert_eq!(err_of("U3M_MODE", "fast").var, "U3M_MODE");
        assert_eq!(
            err_of("U3M_MODE", "tierx").reason,
            "'tierx' is not one of off, observe, tier"
        );
        assert_eq!(err_of("U3M_LOG", "chatty").var, "U3M_LOG");
        assert_eq!(err_of("U3M_MIN_BYTES", "lots").var, "U3M_MIN_BYTES");
        assert_eq!(err_of("U3M_HBM_LOW", "0.95").var, "U3M_HBM_LOW");
        assert_eq!(err_of("U3M_OVERSUB", "-1").var, "U3M_OVERSUB");
        assert_eq!(
            err_of("U3M_OVERSUB", "0.5").reason,
            "'0.5' is outside 1..64"
        );
        assert_eq!(err_of("U3M_OVERSUB", "abc").reason, "'abc' is not a number");
        assert_eq!(
            err_of("U3M_TRACE_LOSSLESS", "yes").var,
            "U3M_TRACE_LOSSLESS"
        );
        let e = err_of("U3M_POLICY", "belady");
        assert!(
            e.reason.contains("not one of seed-heat, lru, predictive"),
            "{e}"
        );
        assert_eq!(err_of("U3M_CALIB_S", "0").var, "U3M_CALIB_S");
        assert_eq!(err_of("U3M_WARMUP_S", "-1").var, "U3M_WARMUP_S");
        assert_eq!(err_of("U3M_OVERSUB", "NaN").var, "U3M_OVERSUB");
        assert_eq!(err_of("U3M_OVERSUB", "inf").var, "U3M_OVERSUB");
        assert_eq!(
            err_of("U3M_ON_CONFIG_ERROR", "ignore").var,
            "U3M_ON_CONFIG_ERROR"
        );
    }

    /// Issue 13 finding 6: settings that hung or meant nothing.
    #[test]
    fn settings_that_hang_or_mean_nothing_are_refused() {
        let e = err_of("U3M_ALLOC_WAIT_MS", "18446744073709551615");
        assert_eq!(e.reason, "'18446744073709551615' is outside 0..600000 ms");
        assert!(cfg(&[("U3M_ALLOC_WAIT_MS", "600000")]).is_ok());
        assert!(cfg(&[("U3M_ALLOC_WAIT_MS", "600001")]).is_err());
        let e = err_of("U3M_DRAM_BYTES", "2");
        assert_eq!(
            e.reason,
            "'2' is outside 2M..1P, or 0: half of physical RAM"
        );
        assert_eq!(cfg(&[("U3M_DRAM_BYTES", "0")]).unwrap().dram_bytes, 0);
        assert_eq!(
            err_of("U3M_MIN_BYTES", "18446744073709551615").var,
            "U3M_MIN_BYTES"
        );
        assert_eq!(err_of("U3M_MIN_BYTES", "16E").var, "U3M_MIN_BYTES");
        assert_eq!(err_of("U3M_SSD_RATE", "0").reason, "'0' is outside 1M..1T");
        assert_eq!(
            err_of("U3M_HOT_INTERVAL_MS", "0").reason,
            "'0' is outside 10..3600000 ms"
        );
        assert_eq!(err_of("U3M_MAX_ALLOCS", "0").var, "U3M_MAX_ALLOCS");
        assert_eq!(err_of("U3M_HBM_HIGH", "0").var, "U3M_HBM_HIGH");
        assert_eq!(err_of("U3M_SWAP_BYTES", "1").var, "U3M_SWAP_BYTES");
        let e = err_of("U3M_SWAP_BYTES", "1G");
        assert!(e.reason.contains("without U3M_SWAP_DIR"), "{e}");
        let c = cfg(&[("U3M_SWAP_DIR", "/s"), ("U3M_SWAP_BYTES", "1G")]).unwrap();
        assert_eq!(c.swap_bytes, 1 << 30);
    }

    /// Empty values: an error everywhere except the paths, where empty
    /// has a documented meaning (it used to pass for U3M_TRACE_LOSSLESS only).
    #[test]
    fn empty_values_are_errors_except_for_paths() {
        for v in VARS {
            let r = cfg(&[(v.name, "")]);
            match v.kind {
                Kind::Path => assert!(r.is_ok(), "{}: {r:?}", v.name),
                _ => {
                    let e = r.expect_err(v.name);
                    assert!(e.reason.starts_with("empty value"), "{e}");
                }
            }
            assert!(
                cfg(&[(v.name, "  ")]).is_ok() == matches!(v.kind, Kind::Path),
                "{}",
                v.name
            );
        }
        let c = cfg(&[("U3M_TRACE", ""), ("U3M_SHM_DIR", "")]).unwrap();
        assert_eq!((c.trace, c.shm_dir), (None, PathBuf::from("/dev/shm")));
    }

    #[test]
    fn every_problem_is_reported_not_just_the_first() {
        let p = parsed(&[
            ("U3M_MODE", "tierx"),
            ("U3M_OVERSUB", "0.5"),
            ("U3M_LOG", "chatty"),
        ]);
        let vars: Vec<&str> = p.errors.iter().map(|e| e.var.as_str()).collect();
        assert_eq!(vars, vec!["U3M_LOG", "U3M_MODE", "U3M_OVERSUB"]);
        assert_eq!(
            p.config.oversub, 1.5,
            "defaults stand in for invalid values"
        );
    }

    #[test]
    fn an_error_fails_tier_mode_unless_passthrough_is_asked_for() {
        assert!(!parsed(&[]).must_fail());
        assert!(
            !parsed(&[("U3M_OVERSUBB", "2")]).must_fail(),
            "unknown names only warn"
        );
        assert!(parsed(&[("U3M_OVERSUB", "0.5")]).must_fail());
        assert!(
            parsed(&[("U3M_MODE", "tierx")]).must_fail(),
            "the mode wanted is unknown"
        );
        assert!(!parsed(&[("U3M_MODE", "observe"), ("U3M_OVERSUB", "x")]).must_fail());
        assert!(
            !parsed(&[("U3M_OVERSUB", "x"), ("U3M_ON_CONFIG_ERROR", "passthrough")]).must_fail()
        );
        assert!(parsed(&[("U3M_OVERSUB", "x"), ("U3M_ON_CONFIG_ERROR", "pass")]).must_fail());
    }

    #[test]
    fn predictive_takes_its_periods() {
        let c = cfg(&[
            ("U3M_POLICY", "predictive"),
            ("U3M_CALIB_S", "2.5"),
            ("U3M_WARMUP_S", "0"),
        ])
        .unwrap();
        assert_eq!(
            (c.policy.as_str(), c.calib_s, c.warmup_s),
            ("predictive", 2.5, 0.0)
        );
        let d = Config::defaults();
        assert_eq!((d.calib_s, d.warmup_s), (600.0, 30.0));
        assert_eq!(
            crate::policy::by_config(&c).map(|p| p.name()),
            Some("predictive")
        );
    }

    #[test]
    fn other_variables_are_ignored() {
        assert!(cfg(&[("PATH", "/bin"), ("ACLSIM_HBM_BYTES", "1G")]).is_ok());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("64KiB"), Some(64 << 10));
        assert_eq!(parse_size("1P"), Some(1 << 50));
        assert_eq!(parse_size("18446744073709551615"), Some(u64::MAX));
        assert_eq!(
            parse_size("9007199254740993"),
            Some(9007199254740993),
            "exact"
        );
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("16384P"), None);
        assert_eq!(size_text(2 << 20), "2M");
        assert_eq!(size_text(3 << 29), "1536M");
        assert_eq!(size_text(1000), "1000");
    }

    #[test]
    fn swap_size_from_free_space_leaves_the_margin() {
        assert_eq!(swap_bytes_from_free(0), 0);
        assert_eq!(swap_bytes_from_free(1 << 30), 0, "1 GiB free: nothing");
        let b = swap_bytes_from_free(100 << 30);
        assert_eq!(b, (90u64 << 30) - (1 << 30));
        assert_eq!(b % (2 << 20), 0);
    }

    #[test]
    fn swap_dir_alone_sizes_the_nvme_tier_from_free_space() {
        let dir = std::env::temp_dir();
        let c = cfg(&[("U3M_SWAP_DIR", dir.to_str().unwrap())]).unwrap();
        let free = free_bytes(&dir).unwrap();
        match c.nvme_bytes() {
            Ok(b) => assert_eq!(b, swap_bytes_from_free(free)),
            Err(e) => assert!(
                swap_bytes_from_free(free) == 0 && e.contains("nothing left"),
                "{e}"
            ),
        }
        let c = cfg(&[("U3M_SWAP_DIR", "/tmp"), ("U3M_SWAP_BYTES", "4M")]).unwrap();
        assert_eq!(c.nvme_bytes(), Ok(4 << 20));
        assert_eq!(Config::defaults().nvme_bytes(), Ok(0));
        let c = cfg(&[("U3M_SWAP_DIR", "/no/such/dir")]).unwrap();
        assert!(c
            .nvme_bytes()
            .unwrap_err()
            .starts_with("U3M_SWAP_DIR=/no/such/dir: "));
    }

    #[test]
    fn summary_lists_set_variables() {
        let c = cfg(&[("U3M_MODE", "observe"), ("U3M_TRACE", "/tmp/t")]).unwrap();
        assert_eq!(c.summary(), "mode=observe U3M_TRACE=/tmp/t");
        assert_eq!(cfg(&[]).unwrap().summary(), "mode=tier");
        let c = cfg(&[("U3M_OVERSUB", "2"), ("U3M_OVERSUB", "3")]).unwrap();
        assert_eq!(c.oversub, 3.0, "the last value wins");
    }

    proptest::proptest! {
        /// The parser takes anything: never panics, and a value it accepts
        /// lies in its variable's range.
        #[test]
        fn parse_never_panics(i in 0..VARS.len(), raw in ".{0,24}", junk in "U3M_[A-Z_]{0,12}") {
            let v = &VARS[i];
            let p = parse([(v.name.to_string(), raw.clone()), (junk, raw.clone())]);
            if !p.errors.iter().any(|e| e.var == v.name) {
                proptest::prop_assert!(check(v, &raw).is_ok());
            }
        }
    }
}
