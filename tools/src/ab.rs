//! `u3m ab [options] -- CMD ARGS...`: runs CMD once per arm — the stock
//! runtime without libu3m.so, and under libu3m.so in each mode asked for —
//! and prints one table with the arms side by side: exit status, whether the
//! results match, physical HBM peak and simulated device time (from the
//! simulator's ACLSIM_STATS), bytes moved per tier (simulator copies, and
//! libu3m.so's U3M_SUMMARY), requests served, wall time.
//!
//! Arms run one after the other (fair wall times on a small machine), with
//! stdin closed and stdout/stderr captured to files. An arm whose program
//! fails is a result, not an error: `u3m ab` exits 0 once every arm ran.
//!
//! `--json` prints the same as one object (schema 1; fields only ever added):
//! `schema`, `u3m_version`, `command` (words), `reference` (name of the arm
//! the others are compared with, or null), `arms` (in run order), each with
//! `arm`, `preload` (libu3m.so loaded), `mode` (U3M_MODE or null),
//! `exit_code` (or null), `signal` (or null), `acl_error` (the ACL error code
//! the program reported, or null), `status` (as in the table), `wall_s`,
//! `result` (`reference`, `same`, `differs` or `-`), `results` (the compared
//! `key=value` facts: `checksum`, `request=N checksum`, `final_loss`),
//! `checksum`, `final_loss`, `requests_served` (or null), `hbm_bytes`,
//! `peak_hbm_bytes` (max over devices), `sim_ns`, `h2d_bytes`, `d2h_bytes`,
//! `d2d_bytes`, `mmu_faults` (from the simulator, null without its stats),
//! `tier` (libu3m.so's counters: `faults_in`, `fault_bytes`, `evictions`,
//! `eviction_bytes`, `clean_drops`, `to_dram`, `to_dram_bytes`, `to_nvme`,
//! `to_nvme_bytes`, `from_nvme`, `from_nvme_bytes`, `prefetches`,
//! `prefetch_bytes`; null for stock arms),
//! `last_error` (the last line of stderr of a failed arm, or null),
//! `u3m_messages` (libu3m.so's warnings and errors on stderr, e.g. a
//! configuration error; null for stock arms), and the
//! raw `simulator` (ACLSIM_STATS) and `summary` (U3M_SUMMARY) objects.

use crate::error::CliError;
use crate::human::bytes;
use crate::run::{preload_value, RunArgs};
use crate::table::columns;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use serde_json::{json, Map, Value};
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};
use u3m_core::config::parse_size;

pub const SCHEMA: u64 = 1;

/// Bytes per chunk count in the summary's to_dram / to_nvme / from_nvme.
const CHUNK: u64 = u3m_core::engine::runtime::CHUNK;

/// One way of running the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    /// The stock runtime with a large HBM (--ref-hbm): what the results should be.
    Ref,
    /// The stock runtime: no libu3m.so.
    Stock,
    /// Under libu3m.so with U3M_MODE set to this.
    U3m(&'static str),
}

impl Arm {
    fn parse(s: &str) -> Result<Arm, String> {
        match s.trim() {
            "ref" => Ok(Arm::Ref),
            "stock" => Ok(Arm::Stock),
            m => mode(m).map(Arm::U3m),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arm::Ref => "ref",
            Arm::Stock => "stock",
            Arm::U3m(m) => m,
        }
    }
}

fn mode(s: &str) -> Result<&'static str, String> {
    match s {
        "tier" => Ok("tier"),
        "observe" => Ok("observe"),
        "off" => Ok("off"),
        _ => Err(format!(
            "'{s}' is not an arm (ref, stock, observe, tier, off)"
        )),
    }
}

#[derive(Debug, Clone)]
pub struct AbArgs {
    /// The `u3m run` options (U3M_* for the libu3m.so arms), -e, --lib, the command.
    pub run: RunArgs,
    pub arms: Vec<Arm>,
    /// ACLSIM_HBM_BYTES for every arm but ref.
    pub hbm: Option<String>,
    /// ACLSIM_HBM_BYTES of the ref arm (None: the simulator's preset).
    pub ref_hbm: Option<String>,
    pub json: bool,
    pub keep: Option<PathBuf>,
}

impl Args for AbArgs {
    fn augment_args(cmd: Command) -> Command {
        RunArgs::augment_args(cmd)
            .mut_arg("mode", |a| {
                a.help("shorthand for --arms stock,MODE (tier, observe or off) [default arms: stock,tier]")
            })
            .mut_arg("dry-run", |a| a.help("print each arm's environment and command instead of running them"))
            .arg(
                Arg::new("arms")
                    .long("arms")
                    .value_name("ARM,...")
                    .value_delimiter(',')
                    .action(ArgAction::Append)
                    .value_parser(|s: &str| Arm::parse(s))
                    .help("arms to run, in order: ref, stock, observe, tier, off [default: stock,tier]"),
            )
            .arg(
                Arg::new("hbm")
                    .long("hbm")
                    .value_name("SIZE")
                    .value_parser(size_arg)
                    .help("simulated HBM per device for every arm but ref (sets ACLSIM_HBM_BYTES), e.g. 256M"),
            )
            .arg(
                Arg::new("ref-hbm")
                    .long("ref-hbm")
                    .value_name("SIZE")
                    .value_parser(size_arg)
                    .help("add a first arm, ref: the stock runtime with this much HBM, whose results the others must match"),
            )
            .arg(Arg::new("json").long("json").action(ArgAction::SetTrue).help("print JSON instead of a table"))
            .arg(
                Arg::new("keep")
                    .long("keep")
                    .value_name("DIR")
                    .value_parser(clap::value_parser!(PathBuf))
                    .help("keep each arm's stdout, stderr, ACLSIM_STATS and U3M_SUMMARY in DIR as <arm>.*"),
            )
            .after_help(
                "Every arm gets its own ACLSIM_STATS and U3M_SUMMARY file unless you set them. \
                 Results (checksum=, request=N ... checksum=, final_loss=) are compared with the first arm that exits 0. \
                 Exits 0 once every arm ran, whatever the arms' exit statuses.",
            )
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

fn size_arg(s: &str) -> Result<String, String> {
    match parse_size(s) {
        Some(b) if b > 0 => Ok(s.to_string()),
        _ => Err(format!("'{s}' is not a size (e.g. 256M, 1G, 268435456)")),
    }
}

impl FromArgMatches for AbArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut run = RunArgs::from_arg_matches(m)?;
        let mode_opt = run
            .env
            .iter()
            .position(|(k, _)| *k == "U3M_MODE")
            .map(|i| run.env.remove(i).1);
        let given: Option<Vec<Arm>> = m.get_many::<Arm>("arms").map(|v| v.copied().collect());
        let usage =
            |msg: String| clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, msg + "\n");
        let mut arms = match (given, mode_opt) {
            (Some(_), Some(_)) => return Err(usage("give --mode or --arms, not both".into())),
            (Some(a), None) => a,
            (None, Some(mo)) => {
                let mo = mo.to_string_lossy().into_owned();
                vec![
                    Arm::Stock,
                    Arm::U3m(mode(&mo).map_err(|e| usage(format!("--mode: {e}")))?),
                ]
            }
            (None, None) => vec![Arm::Stock, Arm::U3m("tier")],
        };
        let ref_hbm = m.get_one::<String>("ref-hbm").cloned();
        if ref_hbm.is_some() && !arms.contains(&Arm::Ref) {
            arms.insert(0, Arm::Ref);
        }
        for (i, a) in arms.iter().enumerate() {
            if arms[..i].contains(a) {
                return Err(usage(format!("--arms: {} given twice", a.name())));
            }
        }
        Ok(AbArgs {
            run,
            arms,
            hbm: m.get_one::<String>("hbm").cloned(),
            ref_hbm,
            json: m.get_flag("json"),
            keep: m.get_one::<PathBuf>("keep").cloned(),
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

// ------------------------------------------------------------------ plan

/// What one arm sets and removes in the inherited environment.
#[derive(Debug, Default)]
struct ArmEnv {
    set: Vec<(String, OsString)>,
    remove: Vec<String>,
}

impl ArmEnv {
    fn set(&mut self, k: &str, v: impl Into<OsString>) {
        self.remove.retain(|r| r != k);
        self.set.retain(|(s, _)| s != k);
        self.set.push((k.to_string(), v.into()));
    }
    fn remove(&mut self, k: &str) {
        self.set.retain(|(s, _)| s != k);
        if !self.remove.iter().any(|r| r == k) {
            self.remove.push(k.to_string());
        }
    }
    /// The value the program will see.
    fn get(&self, k: &str) -> Option<OsString> {
        if self.remove.iter().any(|r| r == k) {
            return None;
        }
        match self.set.iter().rev().find(|(s, _)| s == k) {
            Some((_, v)) => Some(v.clone()),
            None => std::env::var_os(k).filter(|v| !v.is_empty()),
        }
    }
}

/// LD_PRELOAD without any libu3m.so in it.
fn preload_without_u3m(existing: Option<OsString>, lib: &Path) -> Option<OsString> {
    let e = existing?;
    let e = e.to_string_lossy();
    let keep: Vec<&str> = e
        .split([':', ' '])
        .filter(|w| !w.is_empty())
        .filter(|w| {
            Path::new(w) != lib && Path::new(w).file_name() != Some(OsStr::new("libu3m.so"))
        })
        .collect();
    if keep.is_empty() {
        None
    } else {
        Some(keep.join(":").into())
    }
}

/// Where an arm's outputs go.
struct Files {
    stdout: PathBuf,
    stderr: PathBuf,
    /// (path, whether u3m ab chose it). A file the user chose is read only
    /// if this arm wrote it.
    stats: (PathBuf, bool),
    summary: Option<(PathBuf, bool)>,
}

struct Plan {
    arm: Arm,
    env: ArmEnv,
    files: Files,
}

fn plan(a: &AbArgs, lib: &Path, dir: &Path) -> Vec<Plan> {
    let existing = std::env::var_os("LD_PRELOAD");
    a.arms
        .iter()
        .map(|&arm| {
            let name = arm.name();
            let mut env = ArmEnv::default();
            for (k, v) in &a.run.extra {
                env.set(k, v.clone());
            }
            match arm {
                Arm::Ref => match &a.ref_hbm {
                    Some(h) => env.set("ACLSIM_HBM_BYTES", h),
                    None => env.remove("ACLSIM_HBM_BYTES"),
                },
                _ => {
                    if let Some(h) = &a.hbm {
                        env.set("ACLSIM_HBM_BYTES", h);
                    }
                }
            }
            let mut summary = None;
            match arm {
                Arm::Ref | Arm::Stock => match preload_without_u3m(existing.clone(), lib) {
                    Some(p) => env.set("LD_PRELOAD", p),
                    None => env.remove("LD_PRELOAD"),
                },
                Arm::U3m(mode) => {
                    env.set(
                        "LD_PRELOAD",
                        preload_value(lib, preload_without_u3m(existing.clone(), lib)),
                    );
                    for (k, v) in &a.run.env {
                        env.set(k, v.clone());
                    }
                    env.set("U3M_MODE", mode);
                    summary = Some(match env.get("U3M_SUMMARY") {
                        Some(p) => (PathBuf::from(p), false),
                        None => {
                            let p = dir.join(format!("{name}.summary.json"));
                            env.set("U3M_SUMMARY", p.as_os_str());
                            (p, true)
                        }
                    });
                }
            }
            let stats = match env.get("ACLSIM_STATS") {
                Some(p) => (PathBuf::from(p), false),
                None => {
                    let p = dir.join(format!("{name}.stats.json"));
                    env.set("ACLSIM_STATS", p.as_os_str());
                    (p, true)
                }
            };
            let files = Files {
                stdout: dir.join(format!("{name}.stdout")),
                stderr: dir.join(format!("{name}.stderr")),
                stats,
                summary,
            };
            Plan { arm, env, files }
        })
        .collect()
}

// ------------------------------------------------------------------- run

/// What one arm produced.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub wall_s: f64,
    pub stdout: String,
    pub stderr: String,
    pub stats: Option<Value>,
    pub summary: Option<Value>,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.exit_code == Some(0)
    }
}

fn read_json(p: &Path, chosen: bool, since: SystemTime) -> Option<Value> {
    if !chosen {
        // The user's file: only if this arm wrote it (arms run in turn).
        let m = std::fs::metadata(p).ok()?.modified().ok()?;
        if m + Duration::from_millis(10) < since {
            return None;
        }
    }
    serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
}

fn run_arm(p: &Plan, cmd: &[OsString]) -> Result<Outcome, CliError> {
    let (prog, args) = cmd
        .split_first()
        .ok_or_else(|| CliError::Usage("u3m ab: no command given".into()))?;
    let io = |what, err| CliError::Io { what, err };
    let out = std::fs::File::create(&p.files.stdout)
        .map_err(|e| io("creating an arm's stdout file", e))?;
    let err = std::fs::File::create(&p.files.stderr)
        .map_err(|e| io("creating an arm's stderr file", e))?;
    for (path, chosen) in std::iter::once(&p.files.stats).chain(p.files.summary.iter()) {
        if *chosen {
            let _ = std::fs::remove_file(path);
        }
    }
    let mut c = std::process::Command::new(prog);
    c.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    for k in &p.env.remove {
        c.env_remove(k);
    }
    for (k, v) in &p.env.set {
        c.env(k, v);
    }
    let since = SystemTime::now();
    let t0 = Instant::now();
    let status = c
        .spawn()
        .and_then(|mut ch| ch.wait())
        .map_err(|err| CliError::Exec {
            cmd: prog.to_string_lossy().into_owned(),
            err,
        })?;
    let wall_s = t0.elapsed().as_secs_f64();
    let text = |f: &Path| {
        std::fs::read(f)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    Ok(Outcome {
        exit_code: status.code(),
        signal: status.signal(),
        wall_s,
        stdout: text(&p.files.stdout),
        stderr: text(&p.files.stderr),
        stats: read_json(&p.files.stats.0, p.files.stats.1, since),
        summary: p
            .files
            .summary
            .as_ref()
            .and_then(|(s, c)| read_json(s, *c, since)),
    })
}

/// A private scratch directory (mode 0700), removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch, CliError> {
        let base = std::env::temp_dir();
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut last = None;
        for i in 0..16u32 {
            let d = base.join(format!(
                "u3m-ab.{}.{:x}",
                std::process::id(),
                nanos.wrapping_add(i)
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&d) {
                Ok(()) => return Ok(Scratch(d)),
                Err(e) => last = Some(e),
            }
        }
        Err(CliError::Io {
            what: "creating a scratch directory",
            err: last.expect("tried"),
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Ctrl-C goes to the whole foreground group: the program gets it and ends
/// (its handler is reset to the default by exec); u3m ab notes it, lets the
/// program finish, then stops instead of running the remaining arms.
fn catch_sigint() {
    // SAFETY: installs a handler that only stores to an atomic.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

use crate::run::default_lib;

pub fn main(a: AbArgs) -> Result<ExitCode, CliError> {
    if a.run.cmd.is_empty() {
        return Err(CliError::Usage("u3m ab: no command given".into()));
    }
    let lib = match &a.run.lib {
        Some(l) if l.is_relative() => std::env::current_dir()
            .map(|d| d.join(l))
            .unwrap_or_else(|_| l.clone()),
        Some(l) => l.clone(),
        None => default_lib()?,
    };
    let needs_lib = a.arms.iter().any(|x| matches!(x, Arm::U3m(_)));
    if needs_lib && !lib.is_file() {
        return Err(CliError::LibMissing(lib));
    }
    let scratch;
    let dir = match &a.keep {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|err| CliError::Io {
                what: "creating the --keep directory",
                err,
            })?;
            d.clone()
        }
        None => {
            scratch = Scratch::new()?;
            scratch.0.clone()
        }
    };
    let plans = plan(&a, &lib, &dir);
    for p in plans.iter().filter(|p| matches!(p.arm, Arm::U3m(_))) {
        let env = crate::run::effective_u3m_env(
            p.env.set.iter().map(|(k, v)| (k.as_str(), v)),
            &p.env.remove,
        );
        crate::run::check_env(env, &format!("u3m ab ({} arm)", p.arm.name()))?;
    }
    if a.run.dry_run {
        print!("{}", dry_run(&plans, &a.run.cmd));
        return Ok(ExitCode::SUCCESS);
    }
    let progress = std::io::stderr().is_terminal();
    catch_sigint();
    let mut outcomes = Vec::new();
    for (i, p) in plans.iter().enumerate() {
        if progress {
            eprint!("u3m ab: [{}/{}] {} ... ", i + 1, plans.len(), p.arm.name());
        }
        let o = run_arm(p, &a.run.cmd)?;
        if progress {
            eprintln!("{} in {:.1}s", status(&o), o.wall_s);
        }
        if INTERRUPTED.load(Ordering::Relaxed) {
            // Ctrl-C reached the program too; stop here, removing the scratch files.
            eprintln!("u3m: ab interrupted during the {} arm", p.arm.name());
            return Ok(ExitCode::from(130));
        }
        outcomes.push(o);
    }
    let report = Report::new(&a, &plans, outcomes);
    let out = if a.json {
        serde_json::to_string_pretty(&report.json()).expect("JSON of plain values") + "\n"
    } else {
        report.table()
    };
    use std::io::Write;
    let mut so = std::io::stdout().lock();
    // A closed pipe (| head) is not an error worth reporting.
    let _ = so.write_all(out.as_bytes()).and_then(|_| so.flush());
    Ok(ExitCode::SUCCESS)
}

fn dry_run(plans: &[Plan], cmd: &[OsString]) -> String {
    let words: Vec<String> = cmd
        .iter()
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    let mut s = String::new();
    for p in plans {
        let _ = writeln!(s, "# arm {}", p.arm.name());
        for k in &p.env.remove {
            let _ = writeln!(s, "unset {k}");
        }
        for (k, v) in &p.env.set {
            let _ = writeln!(s, "{k}={}", v.to_string_lossy());
        }
        let _ = writeln!(s, "{}", words.join(" "));
    }
    s
}

// ---------------------------------------------------------------- report

/// `key=value` facts of a program's stdout that say what it computed.
pub fn results(stdout: &str) -> Vec<(String, String)> {
    let mut r = Vec::new();
    for line in stdout.lines() {
        let toks: Vec<&str> = line.split_whitespace().collect();
        let request = toks.iter().find(|t| t.starts_with("request="));
        for t in &toks {
            if let Some(v) = t.strip_prefix("checksum=") {
                let k = match request {
                    Some(q) => format!("{q} checksum"),
                    None => "checksum".to_string(),
                };
                r.push((k, v.to_string()));
            } else if let Some(v) = t.strip_prefix("final_loss=") {
                r.push(("final_loss".to_string(), v.to_string()));
            }
        }
    }
    r
}

/// Last value of a `key=value` token on stdout.
fn fact<'a>(stdout: &'a str, key: &str) -> Option<&'a str> {
    let pre = format!("{key}=");
    stdout.lines().rev().find_map(|l| {
        l.split_whitespace()
            .rev()
            .find_map(|t| t.strip_prefix(pre.as_str()))
    })
}

/// The ACL error code a failed program reported: "ACL error 207001" (the
/// workload programs), else a simulator log line ending "-> 207001".
pub fn acl_error(stderr: &str) -> Option<u64> {
    let digits = |s: &str| -> Option<u64> {
        let d: String = s.chars().take_while(char::is_ascii_digit).collect();
        d.parse().ok()
    };
    if let Some(i) = stderr.rfind("ACL error ") {
        if let Some(c) = digits(&stderr[i + "ACL error ".len()..]) {
            return Some(c);
        }
    }
    stderr
        .lines()
        .rev()
        .find_map(|l| l.rsplit_once("-> ").and_then(|(_, c)| digits(c)))
}

fn signal_name(s: i32) -> String {
    let n = match s {
        libc::SIGINT => "SIGINT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGTERM => "SIGTERM",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        _ => return format!("signal {s}"),
    };
    format!("signal {s} ({n})")
}

fn status(o: &Outcome) -> String {
    match (o.exit_code, o.signal) {
        (Some(0), _) => "0".into(),
        (Some(c), _) => match acl_error(&o.stderr) {
            Some(e) => format!("{c} (ACL error {e})"),
            None => format!("{c}"),
        },
        (None, Some(s)) => format!("killed by {}", signal_name(s)),
        (None, None) => "unknown".into(),
    }
}

struct Row {
    arm: Arm,
    out: Outcome,
    status: String,
    result: &'static str,
    results: Vec<(String, String)>,
}

struct Report {
    cmd: Vec<String>,
    hbm: Option<String>,
    ref_hbm: Option<String>,
    reference: Option<usize>,
    rows: Vec<Row>,
}

fn u(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_u64)
}

impl Report {
    fn new(a: &AbArgs, plans: &[Plan], outs: Vec<Outcome>) -> Report {
        let facts: Vec<Vec<(String, String)>> = outs.iter().map(|o| results(&o.stdout)).collect();
        let reference = outs.iter().position(Outcome::ok);
        let rows = plans
            .iter()
            .zip(outs)
            .zip(facts.iter())
            .enumerate()
            .map(|(i, ((p, out), res))| {
                let result = match reference {
                    Some(r) if r == i => "reference",
                    Some(r) if out.ok() && !facts[r].is_empty() => {
                        if *res == facts[r] {
                            "same"
                        } else {
                            "differs"
                        }
                    }
                    _ => "-",
                };
                Row {
                    arm: p.arm,
                    status: status(&out),
                    result,
                    results: res.clone(),
                    out,
                }
            })
            .collect();
        Report {
            cmd: a
                .run
                .cmd
                .iter()
                .map(|w| w.to_string_lossy().into_owned())
                .collect(),
            hbm: a.hbm.clone(),
            ref_hbm: a.ref_hbm.clone(),
            reference,
            rows,
        }
    }

    fn describe(&self, arm: Arm) -> String {
        let hbm = |s: &Option<String>, none: &str| match s {
            Some(h) => format!(
                "HBM {} (ACLSIM_HBM_BYTES={h})",
                bytes(parse_size(h).unwrap_or(0))
            ),
            None => none.to_string(),
        };
        match arm {
            Arm::Ref => format!(
                "stock runtime, {}; the reference",
                hbm(&self.ref_hbm, "the preset's HBM")
            ),
            Arm::Stock => format!(
                "stock runtime (no libu3m.so), {}",
                hbm(&self.hbm, "HBM as configured")
            ),
            Arm::U3m(m) => format!(
                "libu3m.so, U3M_MODE={m}, {}",
                hbm(&self.hbm, "HBM as configured")
            ),
        }
    }

    pub fn table(&self) -> String {
        let mut s = format!("u3m ab: {}\n", self.cmd.join(" "));
        let arms: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| vec![r.arm.name().to_string(), self.describe(r.arm)])
            .collect();
        s.push_str(&columns(&arms, "  "));
        s.push('\n');
        let dash = || "-".to_string();
        let sim = |r: &Row, f: &dyn Fn(&Value) -> Option<String>| {
            r.out.stats.as_ref().and_then(f).unwrap_or_else(dash)
        };
        let tier = |r: &Row, f: &dyn Fn(&Value) -> Option<String>| {
            r.out
                .summary
                .as_ref()
                .and_then(|v| v.get("tier"))
                .and_then(f)
                .unwrap_or_else(dash)
        };
        let count_bytes = |n: Option<u64>, b: Option<u64>| Some(format!("{} ({})", n?, bytes(b?)));
        let chunks = |n: Option<u64>| n.map(|n| format!("{n} ({})", bytes(n * CHUNK)));
        type Cell<'a> = Box<dyn Fn(&Row) -> String + 'a>;
        let lines: Vec<(&str, Cell)> = vec![
            ("exit status", Box::new(|r: &Row| r.status.clone())),
            ("result", Box::new(|r: &Row| r.result.to_string())),
            (
                "checksum",
                Box::new(|r: &Row| {
                    let n = r
                        .results
                        .iter()
                        .filter(|(k, _)| k.ends_with("checksum"))
                        .count();
                    match fact(&r.out.stdout, "checksum") {
                        Some(c) if n == 1 => c.to_string(),
                        _ if n > 1 => format!("{n} checksums"),
                        _ => dash(),
                    }
                }),
            ),
            (
                "final loss",
                Box::new(|r: &Row| {
                    fact(&r.out.stdout, "final_loss")
                        .map(str::to_string)
                        .unwrap_or_else(dash)
                }),
            ),
            (
                "requests served",
                Box::new(|r: &Row| {
                    fact(&r.out.stdout, "requests_served")
                        .map(str::to_string)
                        .unwrap_or_else(dash)
                }),
            ),
            (
                "HBM (physical)",
                Box::new(move |r: &Row| sim(r, &|v| Some(bytes(max_dev(v, "hbm_bytes")?)))),
            ),
            (
                "peak HBM (physical)",
                Box::new(move |r: &Row| sim(r, &|v| Some(bytes(max_dev(v, "peak_bytes")?)))),
            ),
            (
                "device time (simulated)",
                Box::new(move |r: &Row| {
                    sim(r, &|v| {
                        Some(format!("{:.1} ms", u(v, &["sim_ns"])? as f64 / 1e6))
                    })
                }),
            ),
            (
                "H2D copied",
                Box::new(move |r: &Row| sim(r, &|v| Some(bytes(u(v, &["copy_bytes", "H2D"])?)))),
            ),
            (
                "D2H copied",
                Box::new(move |r: &Row| sim(r, &|v| Some(bytes(u(v, &["copy_bytes", "D2H"])?)))),
            ),
            (
                "faults-in (to HBM)",
                Box::new(move |r: &Row| {
                    tier(r, &|t| {
                        count_bytes(u(t, &["faults_in"]), u(t, &["fault_bytes"]))
                    })
                }),
            ),
            (
                "evictions (from HBM)",
                Box::new(move |r: &Row| {
                    tier(r, &|t| {
                        let e = count_bytes(u(t, &["evictions"]), u(t, &["eviction_bytes"]))?;
                        Some(match u(t, &["clean_drops"]) {
                            Some(c) if c > 0 => format!("{e}, {c} clean"),
                            _ => e,
                        })
                    })
                }),
            ),
            (
                "to DRAM",
                Box::new(move |r: &Row| tier(r, &|t| chunks(u(t, &["to_dram"])))),
            ),
            (
                "to NVMe",
                Box::new(move |r: &Row| tier(r, &|t| chunks(u(t, &["to_nvme"])))),
            ),
            (
                "from NVMe",
                Box::new(move |r: &Row| tier(r, &|t| chunks(u(t, &["from_nvme"])))),
            ),
            (
                "prefetched (to HBM)",
                Box::new(move |r: &Row| {
                    tier(r, &|t| {
                        count_bytes(u(t, &["prefetches"]), u(t, &["prefetch_bytes"]))
                    })
                }),
            ),
            (
                "MMU faults (simulator)",
                Box::new(move |r: &Row| sim(r, &|v| Some(u(v, &["mmu_faults"])?.to_string()))),
            ),
            (
                "u3m warnings/errors",
                Box::new(|r: &Row| match (r.arm, u3m_messages(&r.out.stderr).len()) {
                    (Arm::U3m(_), 0) => "0".to_string(),
                    (Arm::U3m(_), n) => format!("{n} (below)"),
                    _ => dash(),
                }),
            ),
            (
                "wall time",
                Box::new(|r: &Row| format!("{:.2} s", r.out.wall_s)),
            ),
        ];
        let mut rows = vec![std::iter::once(String::new())
            .chain(self.rows.iter().map(|r| r.arm.name().into()))
            .collect()];
        for (label, cell) in &lines {
            rows.push(
                std::iter::once(label.to_string())
                    .chain(self.rows.iter().map(cell))
                    .collect(),
            );
        }
        s.push_str(&columns(&rows, ""));
        let failed: Vec<Vec<String>> = self
            .rows
            .iter()
            .filter_map(|r| Some(vec![format!("{}:", r.arm.name()), last_error(&r.out)?]))
            .collect();
        if !failed.is_empty() {
            s.push('\n');
            s.push_str(&columns(&failed, ""));
        }
        let said: Vec<Vec<String>> = self
            .rows
            .iter()
            .flat_map(|r| {
                u3m_messages(&r.out.stderr)
                    .into_iter()
                    .take(5)
                    .map(move |m| vec![format!("{} (libu3m.so):", r.arm.name()), m])
            })
            .collect();
        if !said.is_empty() {
            s.push('\n');
            s.push_str(&columns(&said, ""));
        }
        s
    }

    pub fn json(&self) -> Value {
        let arms: Vec<Value> = self.rows.iter().map(arm_json).collect();
        json!({
            "schema": SCHEMA,
            "u3m_version": u3m_core::VERSION,
            "command": self.cmd,
            "reference": self.reference.map(|i| self.rows[i].arm.name()),
            "arms": arms,
        })
    }
}

/// Largest value of a per-device field of the simulator's stats.
fn max_dev(v: &Value, field: &str) -> Option<u64> {
    v.get("devices")?
        .as_array()?
        .iter()
        .filter_map(|d| d.get(field)?.as_u64())
        .max()
}

/// What libu3m.so said on stderr that is not routine: its warnings and
/// errors (configuration errors among them), without the `u3m: ` prefix;
/// the info start line and summary and debug lines are left out.
pub fn u3m_messages(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("u3m: "))
        .filter(|m| {
            !["start: ", "summary: ", "debug: "]
                .iter()
                .any(|p| m.starts_with(p))
        })
        .map(str::to_string)
        .collect()
}

/// The last line of stderr of an arm that did not exit 0.
fn last_error(o: &Outcome) -> Option<String> {
    if o.ok() {
        return None;
    }
    o.stderr
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

fn arm_json(r: &Row) -> Value {
    let o = &r.out;
    let st = o.stats.as_ref();
    let sim = |path: &[&str]| st.and_then(|v| u(v, path));
    let tier = o.summary.as_ref().and_then(|s| s.get("tier")).map(|t| {
        let mut m = Map::new();
        for k in [
            "faults_in",
            "fault_bytes",
            "evictions",
            "eviction_bytes",
            "clean_drops",
            "to_dram",
            "to_nvme",
            "from_nvme",
            "prefetches",
            "prefetch_bytes",
        ] {
            m.insert(k.into(), json!(u(t, &[k])));
        }
        for k in ["to_dram", "to_nvme", "from_nvme"] {
            m.insert(format!("{k}_bytes"), json!(u(t, &[k]).map(|n| n * CHUNK)));
        }
        Value::Object(m)
    });
    let results: Map<String, Value> = r
        .results
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    json!({
        "arm": r.arm.name(),
        "preload": matches!(r.arm, Arm::U3m(_)),
        "mode": match r.arm { Arm::U3m(m) => Some(m), _ => None },
        "exit_code": o.exit_code,
        "signal": o.signal,
        "acl_error": if o.ok() { None } else { acl_error(&o.stderr) },
        "status": r.status,
        "wall_s": (o.wall_s * 1000.0).round() / 1000.0,
        "result": r.result,
        "results": results,
        "checksum": fact(&o.stdout, "checksum"),
        "final_loss": fact(&o.stdout, "final_loss"),
        "requests_served": fact(&o.stdout, "requests_served").and_then(|v| v.parse::<u64>().ok()),
        "hbm_bytes": st.and_then(|v| max_dev(v, "hbm_bytes")),
        "peak_hbm_bytes": st.and_then(|v| max_dev(v, "peak_bytes")),
        "sim_ns": sim(&["sim_ns"]),
        "h2d_bytes": sim(&["copy_bytes", "H2D"]),
        "d2h_bytes": sim(&["copy_bytes", "D2H"]),
        "d2d_bytes": sim(&["copy_bytes", "D2D"]),
        "mmu_faults": sim(&["mmu_faults"]),
        "tier": tier,
        "last_error": last_error(o),
        "u3m_messages": if matches!(r.arm, Arm::U3m(_)) { json!(u3m_messages(&o.stderr)) } else { Value::Null },
        "simulator": o.stats,
        "summary": o.summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct T {
        #[command(flatten)]
        ab: AbArgs,
    }

    fn parse(args: &[&str]) -> Result<AbArgs, clap::Error> {
        T::try_parse_from(std::iter::once("u3m").chain(args.iter().copied())).map(|t| t.ab)
    }

    #[test]
    fn arms_from_mode_arms_and_ref_hbm() {
        let a = parse(&["--", "prog", "--mode", "x"]).unwrap();
        assert_eq!(a.arms, vec![Arm::Stock, Arm::U3m("tier")]);
        assert_eq!(a.run.cmd, vec!["prog", "--mode", "x"]);
        assert!(a.run.env.is_empty());
        let a = parse(&["--mode", "observe", "--oversub", "3", "prog"]).unwrap();
        assert_eq!(a.arms, vec![Arm::Stock, Arm::U3m("observe")]);
        assert_eq!(
            a.run.env.len(),
            1,
            "U3M_MODE is the arm's, not an option for every arm"
        );
        let a = parse(&[
            "--arms",
            "stock,observe,tier",
            "--ref-hbm",
            "1G",
            "--hbm",
            "64M",
            "prog",
        ])
        .unwrap();
        assert_eq!(
            a.arms,
            vec![Arm::Ref, Arm::Stock, Arm::U3m("observe"), Arm::U3m("tier")]
        );
        assert_eq!(a.hbm.as_deref(), Some("64M"));
        for bad in [
            &["--mode", "tier", "--arms", "stock", "prog"][..],
            &["--arms", "stock,bogus", "prog"],
            &["--arms", "tier,tier", "prog"],
            &["--mode", "fast", "prog"],
            &["--hbm", "lots", "prog"],
            &[],
        ] {
            assert_eq!(parse(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn environments_per_arm() {
        let a = parse(&[
            "--arms",
            "ref,stock,tier",
            "--hbm",
            "64M",
            "--oversub",
            "3",
            "-e",
            "X=1",
            "prog",
        ])
        .unwrap();
        let lib = Path::new("/l/libu3m.so");
        let p = plan(&a, lib, Path::new("/d"));
        let get = |i: usize, k: &str| p[i].env.get(k).map(|v| v.to_string_lossy().into_owned());
        assert_eq!(get(0, "ACLSIM_HBM_BYTES"), None, "ref runs with the preset");
        assert_eq!(get(1, "ACLSIM_HBM_BYTES").as_deref(), Some("64M"));
        assert_eq!(get(2, "ACLSIM_HBM_BYTES").as_deref(), Some("64M"));
        for i in 0..3 {
            assert_eq!(get(i, "X").as_deref(), Some("1"));
            assert_eq!(
                get(i, "ACLSIM_STATS"),
                Some(format!("/d/{}.stats.json", a.arms[i].name()))
            );
        }
        assert!(!matches!(get(1, "LD_PRELOAD"), Some(v) if v.contains("libu3m")));
        assert_eq!(
            get(1, "U3M_OVERSUB"),
            None,
            "options are for the libu3m.so arms"
        );
        assert!(get(2, "LD_PRELOAD").unwrap().starts_with("/l/libu3m.so"));
        assert_eq!(get(2, "U3M_MODE").as_deref(), Some("tier"));
        assert_eq!(get(2, "U3M_OVERSUB").as_deref(), Some("3"));
        assert_eq!(
            get(2, "U3M_SUMMARY").as_deref(),
            Some("/d/tier.summary.json")
        );
        // A file the user names is used as is.
        let a = parse(&["-e", "ACLSIM_STATS=/mine.json", "prog"]).unwrap();
        let p = plan(&a, lib, Path::new("/d"));
        assert_eq!(p[0].files.stats, (PathBuf::from("/mine.json"), false));
    }

    #[test]
    fn preload_loses_only_libu3m() {
        let lib = Path::new("/l/libu3m.so");
        assert_eq!(preload_without_u3m(None, lib), None);
        assert_eq!(preload_without_u3m(Some("/l/libu3m.so".into()), lib), None);
        assert_eq!(
            preload_without_u3m(Some("/x/libu3m.so:/a.so /b.so".into()), lib),
            Some("/a.so:/b.so".into())
        );
    }

    #[test]
    fn libu3m_warnings_and_errors_are_picked_from_stderr() {
        let err = "u3m: start: u3m 0.1.0, tier mode\nprog: hello\nu3m: U3M_OVERSUB: '0.5' is outside 1..64 (configuration error)\nu3m: debug: evict\nu3m: summary: moved 0 B\n";
        assert_eq!(
            u3m_messages(err),
            vec!["U3M_OVERSUB: '0.5' is outside 1..64 (configuration error)".to_string()]
        );
        assert!(u3m_messages("prog: u3m: not ours\n").is_empty());
    }

    #[test]
    fn facts_and_errors_from_program_output() {
        let out = "step=1 loss=2\nfinal_loss=0.5\nchecksum=abc\nrequest=0 decoded=3 checksum=11\nrequests_served=1\n";
        assert_eq!(
            results(out),
            vec![
                ("final_loss".to_string(), "0.5".to_string()),
                ("checksum".into(), "abc".into()),
                ("request=0 checksum".into(), "11".into())
            ]
        );
        assert_eq!(fact(out, "requests_served"), Some("1"));
        assert_eq!(
            acl_error("x: ACL error 207001 at y.c:3: call\n"),
            Some(207001)
        );
        assert_eq!(
            acl_error("aclsim: aclrtMalloc(4) on device 0: out of memory -> 207001\n"),
            Some(207001)
        );
        assert_eq!(acl_error("segfault\n"), None);
    }

    fn outcome(code: i32, stdout: &str) -> Outcome {
        Outcome {
            exit_code: Some(code),
            stdout: stdout.into(),
            ..Default::default()
        }
    }

    #[test]
    fn results_compare_with_the_first_arm_that_succeeded() {
        let a = parse(&["--arms", "stock,observe,tier,off", "prog"]).unwrap();
        let p = plan(&a, Path::new("/l/libu3m.so"), Path::new("/d"));
        let outs = vec![
            Outcome {
                exit_code: Some(2),
                stderr: "p: ACL error 207001 at x\n".into(),
                ..Default::default()
            },
            outcome(0, "checksum=aa\n"),
            outcome(0, "checksum=aa\n"),
            outcome(0, "checksum=ab\n"),
        ];
        let r = Report::new(&a, &p, outs);
        let got: Vec<&str> = r.rows.iter().map(|r| r.result).collect();
        assert_eq!(got, ["-", "reference", "same", "differs"]);
        assert_eq!(r.rows[0].status, "2 (ACL error 207001)");
        let t = r.table();
        assert!(t.contains("stock:  p: ACL error 207001 at x"), "{t}");
        let j = r.json();
        assert_eq!(j["reference"], "observe");
        assert_eq!(j["arms"][0]["acl_error"], 207001);
        assert_eq!(j["arms"][3]["result"], "differs");
    }
}
