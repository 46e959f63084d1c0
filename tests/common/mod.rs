//! Shared helpers for the integration tests: run a workload program on the
//! simulated runtime (optionally under LD_PRELOAD=libu3m.so) and read what it
//! printed and the simulator's statistics.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(unused_imports)]
pub use aclsim::{app, apps_dir, target_dir};

/// What one run of a program produced.
#[derive(Debug, Clone)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// ACLSIM_STATS JSON written at exit (Null if the program wrote none).
    pub stats: serde_json::Value,
}

impl Run {
    /// Value of the last `key=value` or `key: value` fact on stdout.
    pub fn fact(&self, key: &str) -> Option<String> {
        facts(&self.stdout).remove(key)
    }
    pub fn must_succeed(self) -> Self {
        assert_eq!(
            self.code, 0,
            "program failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }
    pub fn stat_u64(&self, path: &[&str]) -> u64 {
        let mut v = &self.stats;
        for p in path {
            v = match p.parse::<usize>() {
                Ok(i) => &v[i],
                Err(_) => &v[*p],
            };
        }
        v.as_u64()
            .unwrap_or_else(|| panic!("stats {path:?} missing in {}", self.stats))
    }
}

/// Every `key=value` token and `key: value` line on stdout; later ones win.
pub fn facts(stdout: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for line in stdout.lines() {
        if let Some((k, v)) = line.split_once(": ") {
            if !k.contains(' ') {
                m.insert(k.trim().to_string(), v.trim().to_string());
                continue;
            }
        }
        for tok in line.split_whitespace() {
            if let Some((k, v)) = tok.split_once('=') {
                m.insert(k.to_string(), v.to_string());
            }
        }
    }
    m
}

/// A unique scratch directory for one test (removed by the OS's tmp cleaning;
/// tests keep their files small).
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("u3m-test-{}-{}", name, std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `program args...` with `env` on the simulator; collects output and the
/// statistics file. ACLSIM_* variables from the caller's environment are
/// removed so tests are hermetic.
pub fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    run_path(&app(program), args, env)
}

/// Removes the caller's ACLSIM_*, U3M_* and LD_PRELOAD from `c`'s
/// environment, so a test runs the same whatever the shell set.
pub fn hermetic(c: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("ACLSIM_") || k.starts_with("U3M_") || k == "LD_PRELOAD" {
            c.env_remove(k);
        }
    }
    c
}

pub fn run_path(path: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = scratch("run");
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let stats = dir.join(format!("stats-{n}.json"));
    let _ = std::fs::remove_file(&stats);
    let mut cmd = Command::new(path);
    hermetic(cmd.args(args));
    cmd.env("ACLSIM_STATS", &stats);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    let stats_v = std::fs::read_to_string(&stats)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(serde_json::Value::Null);
    let _ = std::fs::remove_file(&stats);
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        stats: stats_v,
    }
}

/// Path of libu3m.so built alongside the simulator.
pub fn libu3m() -> PathBuf {
    target_dir().join("libu3m.so")
}

/// Runs `prog` under libu3m.so in tier mode with a private segment dir and a
/// summary file; returns the run and the parsed U3M_SUMMARY (Null if none).
pub fn tier(prog: &str, args: &[&str], env: &[(&str, &str)]) -> (Run, serde_json::Value) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = scratch(&format!("tier-{prog}-{n}"));
    let summary = dir.join("summary.json");
    let lib = libu3m();
    let mut e: Vec<(&str, &str)> = vec![
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("U3M_SHM_DIR", dir.to_str().unwrap()),
        ("U3M_MODE", "tier"),
        ("U3M_SUMMARY", summary.to_str().unwrap()),
    ];
    e.extend_from_slice(env);
    let r = run(prog, args, &e);
    let s = std::fs::read_to_string(&summary)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(serde_json::Value::Null);
    (r, s)
}

/// `python3 bench/plan_schedule.py ARGS... OUT` (the pipeline bound's LP
/// schedule; needs scipy), its output; panics if it failed.
#[allow(dead_code)] // (not every test binary plans)
pub fn plan_schedule(args: &[&str], out: &Path) -> std::process::Output {
    output_ok(
        Command::new("python3")
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/plan_schedule.py"))
            .args(args)
            .arg(out),
    )
}

/// Runs `cmd` and returns its output; panics with its stderr if it failed.
pub fn output_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A `u3m synth` trace of `shape` with `steps` training steps, written to
/// `dir/name`, and its HBM: footprint / 1.5 in whole MiB, plus one
/// (bench/engine_v2.sh's rule). Both as strings for command lines.
pub fn synth_trace(dir: &Path, name: &str, shape: &[&str], steps: u32) -> (String, String) {
    let u3m = target_dir().join("u3m");
    let trace = dir.join(name);
    let sizes = output_ok(Command::new(&u3m).arg("synth").args(shape).arg("--sizes"));
    let sizes: serde_json::Value = serde_json::from_slice(&sizes.stdout).unwrap();
    let footprint = sizes["trace"]["reserved_bytes"].as_u64().unwrap();
    let hbm = (footprint as f64 / 1.5) as u64 / (1 << 20) * (1 << 20) + (1 << 20);
    output_ok(Command::new(&u3m).arg("synth").args(shape).args([
        "--steps",
        &steps.to_string(),
        "-o",
        trace.to_str().unwrap(),
    ]));
    (trace.to_str().unwrap().to_string(), hbm.to_string())
}

/// A 2-step 13B-shaped trace of 2 layers, seq 512 × batch 1, of `workload`
/// (`dir/WORKLOAD.trace`), and its HBM (`synth_trace`).
pub fn small_13b_trace(dir: &Path, workload: &str) -> (String, String) {
    small_13b_trace_with(dir, workload, &[])
}

/// `small_13b_trace` with more synth options (`extra`), written to
/// `dir/WORKLOAD-EXTRA.trace`.
pub fn small_13b_trace_with(dir: &Path, workload: &str, extra: &[&str]) -> (String, String) {
    small_13b_trace_steps(dir, workload, extra, 2)
}

/// `small_13b_trace_with` of `steps` steps, written to
/// `dir/WORKLOAD-EXTRA.trace` (2 steps) or `dir/WORKLOAD-EXTRA-STEPS.trace`.
pub fn small_13b_trace_steps(
    dir: &Path,
    workload: &str,
    extra: &[&str],
    steps: u32,
) -> (String, String) {
    let mut shape = vec![
        "--model",
        "llama2-13b",
        "--layers",
        "2",
        "--seq",
        "512",
        "--batch",
        "1",
        "--workload",
        workload,
    ];
    shape.extend_from_slice(extra);
    let mut name = [&[workload], extra].concat().join("").replace('-', "");
    if steps != 2 {
        name = format!("{name}-{steps}");
    }
    synth_trace(dir, &format!("{name}.trace"), &shape, steps)
}
