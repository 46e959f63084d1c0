//! Real PyTorch + torch_npu, unmodified, on the simulated CANN runtime.
//!
//! `ci/install-torch.sh` provides torch==2.14.0 and torch-npu==2.14.0 in a venv
//! in the cache directory outside the checkout (downloaded once, about 5.5 GB;
//! a failed download fails these tests; `U3M_SKIP_TORCH=1` skips them with a
//! notice). The training loop `tests/torch/train_mlp.py` (MLP, fp32, autograd,
//! torch.optim.AdamW) runs once on the CPU as the reference and then on the
//! simulated NPU in both torch_npu allocator modes; every step's loss must
//! match the CPU's. The NPU runs use the fake CANN install
//! (`target/<profile>/cann`, ASCEND_HOME_PATH) and the harness preload
//! (`torch_harness_preload.so`, a workaround for the CUDA build of torch).
//! See docs/torch-npu.md.

mod common;
#[path = "../src/torch_layout.rs"]
mod torch_layout;
#[path = "common/writes.rs"]
mod writes;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// True (after a notice the harness does not capture) when asked to skip.
fn skipped(test: &str) -> bool {
    if std::env::var("U3M_SKIP_TORCH")
        .map(|v| v == "1")
        .unwrap_or(false)
    {
        let _ = writeln!(
            std::io::stderr(),
            "NOTICE: torch_npu::{test} SKIPPED because U3M_SKIP_TORCH=1 (it needs torch and torch-npu \
             from PyPI, about 5.5 GB once); CI must not set it"
        );
        return true;
    }
    false
}

/// The venv's python, from ci/install-torch.sh (installs on first use).
fn python() -> PathBuf {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PY.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("ci/install-torch.sh"))
            .output()
            .map_err(|e| format!("cannot run bash ci/install-torch.sh: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            return Err(format!(
                "ci/install-torch.sh failed ({}); set U3M_SKIP_TORCH=1 to skip the torch_npu tests offline.\n\
                 stderr:\n{stderr}",
                out.status
            ));
        }
        let lines: Vec<&str> = stdout.lines().collect();
        if lines.len() != 1 || !Path::new(lines[0]).is_file() {
            return Err(format!("install-torch.sh must print only the interpreter path, printed:\n{stdout}"));
        }
        Ok(PathBuf::from(lines[0]))
    })
    .clone()
    .unwrap_or_else(|e| panic!("{e}"))
}

/// One run of the training loop.
struct Loop {
    code: i32,
    stdout: String,
    stderr: String,
    stats: serde_json::Value,
    secs: f64,
}

impl Loop {
    fn losses(&self) -> Vec<f64> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with("step="))
            .map(|l| {
                let v = l
                    .split_whitespace()
                    .find_map(|t| t.strip_prefix("loss="))
                    .expect("loss= on a step line");
                v.parse().expect("a number")
            })
            .collect()
    }
    fn stat(&self, path: &[&str]) -> u64 {
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
    fn must_succeed(&self, what: &str) {
        assert_eq!(
            self.code, 0,
            "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        );
    }
}

const STEPS: &str = "12";

/// Runs `script` (under tests/torch) with `args`, on the simulated NPU.
fn run_script(script: &str, args: &[&str], env: &[(&str, &str)]) -> Loop {
    run_py(Some(script), args, true, env, &[])
}

/// Runs train_mlp.py. `npu`: on the simulator (fake CANN install, harness
/// preload; an operator without a real kernel fails, it never produces
/// noise); otherwise plain CPU PyTorch without torch_npu. `preload`: extra
/// objects for LD_PRELOAD (libu3m.so).
fn run_loop(npu: bool, env: &[(&str, &str)], preload: &[&Path]) -> Loop {
    run_py(None, &["--steps", STEPS], npu, env, preload)
}

fn run_py(
    script: Option<&str>,
    args: &[&str],
    npu: bool,
    env: &[(&str, &str)],
    preload: &[&Path],
) -> Loop {
    let target = common::target_dir();
    let dir = common::scratch("torch");
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let stats = dir.join(format!("stats-{n}.json"));
    let _ = std::fs::remove_file(&stats);
    let mut cmd = Command::new(python());
    cmd.arg(
        repo()
            .join("tests/torch")
            .join(script.unwrap_or("train_mlp.py")),
    )
    .args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("ACLSIM_")
            || k.starts_with("U3M_")
            || k.starts_with("ASCEND_")
            || k.starts_with("PYTORCH_NPU")
            || k == "LD_PRELOAD"
            || k == "LD_LIBRARY_PATH"
        {
            cmd.env_remove(k);
        }
    }
    cmd.env("PYTHONDONTWRITEBYTECODE", "1");
    if npu {
        let home = target.join("cann");
        assert!(
            home.join("lib64/libascendcl.so").exists(),
            "fake CANN tree missing: {}",
            home.display()
        );
        let harness = target.join("torch_harness_preload.so");
        assert!(
            harness.exists(),
            "harness preload missing: {}",
            harness.display()
        );
        let mut pre = vec![harness.display().to_string()];
        pre.extend(preload.iter().map(|p| p.display().to_string()));
        if script.is_none() {
            cmd.arg("--device").arg("npu");
        }
        cmd.env("ASCEND_HOME_PATH", &home)
            .env("ASCEND_TOOLKIT_HOME", &home)
            .env("ASCEND_OPP_PATH", home.join("opp"))
            .env("LD_LIBRARY_PATH", home.join("lib64"))
            .env("LD_PRELOAD", pre.join(" "))
            .env("ACLSIM_STATS", &stats);
    } else {
        // the reference: PyTorch alone (torch_npu not even loaded)
        cmd.arg("--device")
            .arg("cpu")
            .env("TORCH_DEVICE_BACKEND_AUTOLOAD", "0");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run python: {e}"));
    let secs = t0.elapsed().as_secs_f64();
    let stats_v = std::fs::read_to_string(&stats)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(serde_json::Value::Null);
    let _ = std::fs::remove_file(&stats);
    let l = Loop {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        stats: stats_v,
        secs,
    };
    eprintln!(
        "{} ({}, {env:?}{}): exit {} in {:.1} s, losses {:?}",
        script.unwrap_or("train_mlp.py"),
        if npu { "npu" } else { "cpu" },
        if preload.is_empty() {
            ""
        } else {
            ", preloaded"
        },
        l.code,
        l.secs,
        l.losses()
    );
    l
}

/// The CPU reference, run once per test process.
fn cpu_losses() -> Vec<f64> {
    static CPU: OnceLock<Vec<f64>> = OnceLock::new();
    CPU.get_or_init(|| {
        let l = run_loop(false, &[], &[]);
        l.must_succeed("the CPU reference run");
        let v = l.losses();
        assert_eq!(
            v.len(),
            STEPS.parse::<usize>().unwrap(),
            "CPU run printed {} losses:\n{}",
            v.len(),
            l.stdout
        );
        v
    })
    .clone()
}

/// Every step's loss within rtol 1e-4 of the CPU's, and the loop learned.
fn assert_matches_cpu(npu: &Loop) {
    let cpu = cpu_losses();
    let got = npu.losses();
    assert_eq!(
        got.len(),
        cpu.len(),
        "NPU run printed {} losses, CPU {}:\nstdout:\n{}\nstderr:\n{}",
        got.len(),
        cpu.len(),
        npu.stdout,
        npu.stderr
    );
    for (i, (a, b)) in got.iter().zip(&cpu).enumerate() {
        let rel = (a - b).abs() / b.abs().max(1e-12);
        assert!(
            rel <= 1e-4,
            "step {i}: NPU loss {a} vs CPU {b} (relative difference {rel:.2e} > 1e-4)"
        );
    }
    assert!(
        cpu[cpu.len() - 1] < cpu[0] - 0.1,
        "the loop does not learn: losses {cpu:?}"
    );
}

/// What every healthy NPU run shows in the simulator's statistics.
fn assert_healthy(l: &Loop) {
    assert!(l.stat(&["ops"]) > 100, "too few operators ran: {}", l.stats);
    assert_eq!(l.stat(&["mmu_faults"]), 0, "device MMU faults: {}", l.stats);
    assert_eq!(
        l.stat(&["failed_allocs"]),
        0,
        "failed allocations: {}",
        l.stats
    );
    // batches go up through pinned memory (aclrtMallocHost + aclrtMemcpyAsync),
    // losses and weights come back
    assert!(
        l.stat(&["allocs", "host"]) >= 1,
        "no pinned host memory: {}",
        l.stats
    );
    assert!(
        l.stat(&["copies", "H2D"]) > 0 && l.stat(&["copies", "D2H"]) > 0,
        "no copies: {}",
        l.stats
    );
    assert_eq!(
        l.stat(&["devices", "0", "current_bytes"]),
        0,
        "device memory left allocated at exit: {}",
        l.stats
    );
    assert!(
        !l.stderr.contains(" refused ("),
        "an operator was refused:\n{}",
        l.stderr
    );
}

#[test]
fn default_allocator_matches_cpu() {
    if skipped("default_allocator_matches_cpu") {
        return;
    }
    let l = run_loop(true, &[], &[]);
    l.must_succeed("the NPU run (default caching allocator)");
    assert_matches_cpu(&l);
    assert_healthy(&l);
    // the caching allocator's blocks: aclrtMallocAlign32, a 2 MiB small-pool
    // block and a 20 MiB large-pool block at least; no VMM
    assert!(
        l.stat(&["allocs", "malloc"]) >= 2,
        "no caching-allocator blocks: {}",
        l.stats
    );
    assert!(
        l.stat(&["allocs", "malloc_bytes"]) >= 22 << 20,
        "blocks smaller than 2 + 20 MiB: {}",
        l.stats
    );
    assert_eq!(
        l.stat(&["allocs", "map"]),
        0,
        "VMM used without expandable segments: {}",
        l.stats
    );
}

#[test]
fn expandable_segments_match_cpu() {
    if skipped("expandable_segments_match_cpu") {
        return;
    }
    let l = run_loop(
        true,
        &[("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")],
        &[],
    );
    l.must_succeed("the NPU run (expandable segments)");
    assert_matches_cpu(&l);
    assert_healthy(&l);
    // segments are VMM reservations backed by mapped 2 MiB / 20 MiB handles;
    // nothing comes from aclrtMalloc*
    assert_eq!(
        l.stat(&["allocs", "malloc"]),
        0,
        "aclrtMalloc* used with expandable segments: {}",
        l.stats
    );
    assert!(
        l.stat(&["allocs", "reserve"]) >= 2,
        "no segment reservations: {}",
        l.stats
    );
    let (phys, bytes, maps) = (
        l.stat(&["allocs", "phys"]),
        l.stat(&["allocs", "phys_bytes"]),
        l.stat(&["allocs", "map"]),
    );
    assert!(
        phys >= 2 && maps >= phys,
        "handles {phys}, maps {maps}: {}",
        l.stats
    );
    assert!(
        bytes >= 22 << 20 && bytes % (2 << 20) == 0,
        "physical bytes {bytes}: {}",
        l.stats
    );
}

#[test]
fn over_capacity_raises_torch_npu_out_of_memory() {
    if skipped("over_capacity_raises_torch_npu_out_of_memory") {
        return;
    }
    // the loop needs 24 MiB of device memory (2 + 2 + 20 MiB); give it 4 MiB
    for conf in ["", "expandable_segments:True"] {
        let mut env = vec![("ACLSIM_HBM_BYTES", "4M")];
        if !conf.is_empty() {
            env.push(("PYTORCH_NPU_ALLOC_CONF", conf));
        }
        let l = run_loop(true, &env, &[]);
        assert_ne!(
            l.code, 0,
            "[{conf}] the run succeeded in 4 MiB:\n{}",
            l.stdout
        );
        assert!(
            l.stderr.contains("NPU out of memory"),
            "[{conf}] no torch_npu OOM error:\n{}",
            l.stderr
        );
        assert!(
            l.stderr.contains("OutOfMemoryError"),
            "[{conf}] not torch.OutOfMemoryError:\n{}",
            l.stderr
        );
        assert!(
            l.stat(&["failed_allocs"]) >= 1,
            "[{conf}] the simulator refused nothing: {}",
            l.stats
        );
        assert_eq!(l.stat(&["devices", "0", "hbm_bytes"]), 4 << 20);
    }
}

/// tests/torch/op_check.py (every operator against the CPU, with its
/// ACLSIM_OPS_LOG), run once per test process.
fn op_check() -> &'static (Loop, String) {
    static R: OnceLock<(Loop, String)> = OnceLock::new();
    R.get_or_init(|| {
        let log = common::scratch("torch-opcheck").join("ops.txt");
        let _ = std::fs::remove_file(&log);
        let l = log.display().to_string();
        let r = run_script("op_check.py", &[], &[("ACLSIM_OPS_LOG", l.as_str())]);
        let ops = std::fs::read_to_string(&log).unwrap_or_default();
        (r, ops)
    })
}

/// The operators the simulator provides for torch_npu, one by one against the
/// CPU, including dtypes, broadcasting, in-place and strided cases the
/// training loop does not reach, gradients, the fused npu_* operators, and
/// refusals (tests/torch/op_check.py).
#[test]
fn operators_match_cpu() {
    if skipped("operators_match_cpu") {
        return;
    }
    let (l, _) = op_check();
    let failed: Vec<&str> = l
        .stdout
        .lines()
        .filter(|s| s.starts_with("case=") && s.ends_with("ok=0"))
        .collect();
    assert!(
        failed.is_empty() && l.code == 0,
        "operators differ from the CPU:\n{}\nstderr:\n{}",
        failed.join("\n"),
        l.stderr
    );
    let cases: usize = common::facts(&l.stdout)
        .get("cases")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(cases >= 300, "op_check ran {cases} cases:\n{}", l.stdout);
    assert_eq!(l.stat(&["mmu_faults"]), 0, "device MMU faults: {}", l.stats);
    // the refusals refused, each with its one line naming the operator
    for case in [
        "refuse_fusion_pse",
        "refuse_fusion_prefix_mode",
        "refuse_int64_matmul",
        "refuse_bool_mask_index",
    ] {
        assert!(
            l.stdout.contains(&format!("case={case} refused=1")),
            "{case} did not refuse:\n{}",
            l.stdout
        );
    }
    assert!(
        l.stderr.contains("operator MatMul refused")
            || l.stderr.contains("operator BatchMatMul refused")
    );
    assert!(l.stderr.contains(
        "operator NonZero refused (no simulated kernel for this operator): inputs bool[6,5]"
    ));
}

/// Every operator op_check.py launches (every aclnn entry point of the
/// simulator, through op-plugin), under libu3m.so in observe mode: each byte
/// the simulator may write (ACLSIM_WRITES_LOG) lies in a range u3m marks
/// written for that launch (its operator roles, core/src/roles; a read-only
/// tensor the operator writes would be dirty memory dropped as clean in tier
/// mode). The task queue is off so launches and their trace events keep one
/// order.
#[test]
fn operator_roles_cover_what_the_simulator_writes() {
    if skipped("operator_roles_cover_what_the_simulator_writes") {
        return;
    }
    let u3m = common::libu3m();
    let dir = common::scratch("torch-roles");
    let trace = dir.join("run.u3mt");
    let log = dir.join("writes.txt");
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_file(&log);
    let (tr, lg) = (trace.display().to_string(), log.display().to_string());
    let l = run_py(
        Some("op_check.py"),
        &[],
        true,
        &[
            ("U3M_MODE", "observe"),
            ("U3M_TRACE", tr.as_str()),
            ("U3M_TRACE_LOSSLESS", "1"),
            ("ACLSIM_WRITES_LOG", lg.as_str()),
            ("TASK_QUEUE_ENABLE", "0"),
        ],
        &[u3m.as_path()],
    );
    assert!(
        l.code == 0,
        "op_check under libu3m.so failed:\n{}",
        l.stderr
    );
    let t = std::fs::read_to_string(&trace).unwrap_or_else(|e| panic!("no trace at {tr}: {e}"));
    let w = std::fs::read_to_string(&log).unwrap_or_default();
    let apis: std::collections::BTreeSet<&str> = w
        .lines()
        .filter_map(|x| x.split_whitespace().next())
        .collect();
    match writes::check(&t, &w) {
        Ok(n) => {
            eprintln!("{n} launches of {} aclnn operators checked", apis.len());
            assert!(
                n > 300 && apis.len() > 150,
                "{n} launches, {} operators",
                apis.len()
            );
        }
        Err(bad) => panic!(
            "{} launches write memory u3m marks read-only:\n{}",
            bad.len(),
            bad[..bad.len().min(40)].join("\n")
        ),
    }
}

/// The C programs whose results tests/sim_ops.rs checks against references,
/// for what op_check cannot reach: entry points torch_npu 2.14 calls only in
/// compatibility modes (V1 foreach with a device scalar when V2 is missing,
/// GELU V2 under TORCH_NPU_USE_COMPATIBLE_IMPL) and operator types only aclop
/// programs name (mlp_train's, the aliases).
const C_CHECKED: &[(&str, &[&str])] = &[
    ("optest_llm", &["gelu"]),
    ("optest_llm", &["foreach_v1"]),
    ("optest_aclop", &["aliases"]),
    ("optest_aclop", &["adam", "16"]),
    ("optest_aclop", &["relugrad", "16"]),
    ("optest_aclop", &["reducesum", "3x4", "1"]),
];

/// Every aclnn entry point libopapi.so exports (nm -D) and every operator type
/// with a simulated kernel (libascendcl's table) ran in an op_check case that
/// matched the CPU or in one of the C programs above (checked by
/// tests/sim_ops.rs); the configurations the simulator does not compute are
/// refused (op_check's refusal cases, sim_ops.rs). Nothing is exported that
/// nothing checks.
#[test]
fn every_simulator_operator_computes_or_refuses() {
    if skipped("every_simulator_operator_computes_or_refuses") {
        return;
    }
    let (l, ops) = op_check();
    assert!(l.code == 0, "op_check failed:\n{}", l.stdout);
    let mut all_ops = ops.clone();
    for (prog, args) in C_CHECKED {
        let log = common::scratch("torch-walk").join(format!("{prog}-{}.txt", args[0]));
        let lg = log.display().to_string();
        let r = common::run(prog, args, &[("ACLSIM_OPS_LOG", lg.as_str())]);
        assert_eq!(r.code, 0, "{prog} {args:?}:\n{}", r.stderr);
        all_ops += &std::fs::read_to_string(&log).unwrap_or_default();
    }
    let ran_api: std::collections::BTreeSet<&str> = all_ops
        .lines()
        .filter_map(|x| x.split_whitespace().next())
        .collect();
    let ran_kernel: std::collections::BTreeSet<&str> = all_ops
        .lines()
        .filter_map(|x| x.split_whitespace().nth(1))
        .collect();
    let nm = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(common::target_dir().join("libopapi.so"))
        .output()
        .expect("nm");
    let syms = String::from_utf8_lossy(&nm.stdout);
    let exported: Vec<&str> = syms
        .lines()
        .filter_map(|x| x.split_whitespace().nth(2))
        .filter(|n| n.starts_with("aclnn") && !n.ends_with("GetWorkspaceSize"))
        .collect();
    assert!(
        exported.len() > 200,
        "nm found {} aclnn entries",
        exported.len()
    );
    let unchecked: Vec<&&str> = exported.iter().filter(|a| !ran_api.contains(**a)).collect();
    assert!(
        unchecked.is_empty(),
        "exported but checked by nothing: {unchecked:?}"
    );
    let facts = common::facts(&l.stdout);
    let kernels: Vec<&str> = facts
        .get("kernels")
        .map(|v| v.split(',').collect())
        .unwrap_or_default();
    assert!(kernels.len() > 130, "kernel table: {kernels:?}");
    let unchecked: Vec<&&str> = kernels
        .iter()
        .filter(|k| !ran_kernel.contains(**k))
        .collect();
    assert!(
        unchecked.is_empty(),
        "kernels checked by nothing: {unchecked:?}"
    );
    let by_torch: std::collections::BTreeSet<&str> = ops
        .lines()
        .filter_map(|x| x.split_whitespace().next())
        .collect();
    eprintln!(
        "{} aclnn entry points ({} checked through op_check against the CPU), {} kernels",
        exported.len(),
        exported.iter().filter(|a| by_torch.contains(*a)).count(),
        kernels.len()
    );
}

/// The same loop under LD_PRELOAD=libu3m.so in observe mode: bit-identical
/// losses to the plain NPU run, a trace of the run that the simulator's
/// replayer accepts, and u3m saw torch_npu's allocations, operators (found by
/// name through op-plugin's dlsym) and copies.
#[test]
fn observe_mode_under_libu3m_matches_and_traces() {
    if skipped("observe_mode_under_libu3m_matches_and_traces") {
        return;
    }
    let u3m = common::libu3m();
    assert!(u3m.exists(), "{} missing", u3m.display());
    let plain = run_loop(true, &[], &[]);
    plain.must_succeed("the plain NPU run");
    let trace = common::scratch("torch-u3m").join("run.u3mt");
    let _ = std::fs::remove_file(&trace);
    let tr = trace.display().to_string();
    let l = run_loop(
        true,
        &[("U3M_MODE", "observe"), ("U3M_TRACE", tr.as_str())],
        &[u3m.as_path()],
    );
    l.must_succeed("the NPU run under libu3m.so (observe)");
    assert_eq!(
        l.losses(),
        plain.losses(),
        "observe mode changed the losses"
    );
    assert_matches_cpu(&l);
    assert_healthy(&l);
    let text = std::fs::read_to_string(&trace).unwrap_or_else(|e| panic!("no trace at {tr}: {e}"));
    assert!(
        text.starts_with("# u3m-trace 1"),
        "not a u3m trace:\n{}",
        &text[..text.len().min(200)]
    );
    let count = |p: &str| text.lines().filter(|l| l.starts_with(p)).count();
    assert!(count("A ") >= 2, "no allocations traced");
    assert!(count("O ") > 100, "only {} operators traced", count("O "));
    assert!(
        count("M H2D ") > 0 && count("M D2H ") > 0,
        "copies missing from the trace"
    );
    // aclnn operators reached through op-plugin's dlsym lookups are seen
    assert!(
        text.lines()
            .any(|l| l.starts_with("O ") && (l.contains("Addmm") || l.contains("MatMul"))),
        "no matrix product traced"
    );
    let r = common::run("acl_replay", &[tr.as_str(), "--no-verify"], &[]);
    assert_eq!(r.code, 0, "acl_replay rejects the trace:\n{}", r.stderr);
}

/// Tier mode: with HBM below the loop's footprint, the stock run fails with
/// torch_npu's out-of-memory error while the run under libu3m.so completes
/// with the same losses, in both allocator modes.
#[test]
fn tier_mode_runs_the_loop_below_its_footprint() {
    if skipped("tier_mode_runs_the_loop_below_its_footprint") {
        return;
    }
    let u3m = common::libu3m();
    let plain = run_loop(true, &[], &[]);
    plain.must_succeed("the plain NPU run");
    for conf in ["", "expandable_segments:True"] {
        let mut env = vec![("ACLSIM_HBM_BYTES", "16M")];
        if !conf.is_empty() {
            env.push(("PYTORCH_NPU_ALLOC_CONF", conf));
        }
        let stock = run_loop(true, &env, &[]);
        assert_ne!(
            stock.code, 0,
            "{conf}: the stock run should not fit in 16 MiB"
        );
        assert!(
            stock.stderr.contains("out of memory"),
            "{conf}: {}",
            stock.stderr
        );
        env.push(("U3M_MODE", "tier"));
        env.push(("U3M_OVERSUB", "3"));
        let l = run_loop(true, &env, &[u3m.as_path()]);
        l.must_succeed(&format!("{conf}: the tier run under libu3m.so"));
        assert_eq!(
            l.losses(),
            plain.losses(),
            "{conf}: tier mode changed the losses"
        );
        assert_eq!(l.stat(&["mmu_faults"]), 0, "{conf}: device MMU faults");
    }
}

// ------------------------------------------------------------ LLM workloads
//
// tests/torch/llm.py: a Llama (RMS norm, rotary embedding, grouped-query
// attention through SDPA, SwiGLU) and a GPT-2 (layer norm, tanh GELU,
// learned positions) from transformers, random initialisation. One process
// runs both models on the CPU (the reference) and on the simulated NPU:
// greedy generation from the initial weights, 5 AdamW steps, greedy
// generation again (dynamic and static KV cache), sampling; and the same
// training under bf16 autocast.

/// Results of llm.py keyed by everything on the line before the result
/// ("model=llama device=npu run=f32" -> losses; "... when=trained
/// cache=static" -> tokens).
struct LlmOut {
    run: Loop,
    ops: String,
}

impl LlmOut {
    fn losses(&self, model: &str, device: &str, run: &str) -> Vec<f64> {
        let prefix = format!("model={model} device={device} run={run} step=");
        self.run
            .stdout
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .map(|l| l.rsplit("loss=").next().unwrap().parse().expect("a loss"))
            .collect()
    }
    /// The value of `key=` on the line that starts with `prefix`.
    fn value(&self, prefix: &str, key: &str) -> String {
        let line = self
            .run
            .stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| {
                panic!(
                    "no line '{prefix}...' in:\n{}\nstderr:\n{}",
                    self.run.stdout, self.run.stderr
                )
            });
        line.split_whitespace()
            .find_map(|t| t.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in '{line}'"))
            .to_string()
    }
    /// Launches of `api` whose element types match `types` (ACLSIM_OPS_LOG lines).
    fn launched(&self, api: &str, types: &str) -> bool {
        self.ops
            .lines()
            .any(|l| l.starts_with(&format!("{api} ")) && l.contains(types))
    }
}

/// Runs llm.py on the simulator (the CPU reference in the same process when
/// `args` asks for it) with ACLSIM_OPS_LOG.
fn run_llm(args: &[&str], env: &[(&str, &str)], preload: &[&Path]) -> LlmOut {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let log = common::scratch("torch-llm").join(format!("ops-{n}.txt"));
    let _ = std::fs::remove_file(&log);
    let l = log.display().to_string();
    let mut e: Vec<(&str, &str)> = vec![("ACLSIM_OPS_LOG", l.as_str())];
    e.extend_from_slice(env);
    let run = run_py(Some("llm.py"), args, true, &e, preload);
    let ops = std::fs::read_to_string(&log).unwrap_or_default();
    LlmOut { run, ops }
}

/// Every model, CPU and NPU, f32 (with generation and sampling) and bf16:
/// run once per test process.
fn llm_reference() -> &'static LlmOut {
    static R: OnceLock<LlmOut> = OnceLock::new();
    R.get_or_init(|| {
        let r = run_llm(
            &[
                "--models",
                "llama,gpt2",
                "--devices",
                "cpu,npu",
                "--runs",
                "f32,bf16",
                "--caches",
                "dynamic,static",
                "--sample",
            ],
            &[],
            &[],
        );
        r.run
            .must_succeed("llm.py on the CPU and the simulated NPU");
        r
    })
}

/// 5 losses per run, each within `rtol` of the CPU's; the model learns; the
/// first step's gradient norm of every parameter within `grad_rtol`.
fn assert_losses_match(r: &LlmOut, model: &str, run: &str, rtol: f64, grad_rtol: f64) {
    let cpu = r.losses(model, "cpu", run);
    let npu = r.losses(model, "npu", run);
    assert_eq!(cpu.len(), 5, "{model}/{run}: CPU printed {cpu:?}");
    assert_eq!(
        npu.len(),
        5,
        "{model}/{run}: NPU printed {npu:?}\nstderr:\n{}",
        r.run.stderr
    );
    let mut worst = 0f64;
    for (i, (a, b)) in npu.iter().zip(&cpu).enumerate() {
        let rel = (a - b).abs() / b.abs();
        worst = worst.max(rel);
        assert!(
            rel <= rtol,
            "{model}/{run} step {i}: NPU loss {a} vs CPU {b} (relative difference {rel:.2e} > {rtol:e})"
        );
    }
    assert!(
        cpu[4] < cpu[0] - 0.5,
        "{model}/{run}: the model does not learn: {cpu:?}"
    );
    // the first step's gradient of every parameter, one by one
    let norms = |d: &str| -> Vec<f64> {
        r.value(
            &format!("model={model} device={d} run={run} grad_norms="),
            "grad_norms",
        )
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect()
    };
    let (gc, gn) = (norms("cpu"), norms("npu"));
    assert!(
        gc.len() > 10 && gc.len() == gn.len(),
        "{model}/{run}: gradient norms {gc:?} vs {gn:?}"
    );
    let mut gworst = 0f64;
    for (i, (a, b)) in gn.iter().zip(&gc).enumerate() {
        let rel = (a - b).abs() / b.abs().max(1e-6);
        gworst = gworst.max(rel);
        assert!(
            rel <= grad_rtol,
            "{model}/{run}: gradient of parameter {i}: NPU norm {a} vs CPU {b} ({rel:.2e} > {grad_rtol:e})"
        );
    }
    eprintln!(
        "{model}/{run}: NPU losses {npu:?}; largest relative difference to the CPU: loss {worst:.2e}, \
         gradient norm {gworst:.2e} ({} parameters)",
        gc.len()
    );
}

fn assert_generation_matches(r: &LlmOut, model: &str) {
    for when in ["init", "trained"] {
        for cache in ["dynamic", "static"] {
            let key =
                |d: &str| format!("model={model} device={d} run=f32 when={when} cache={cache} ");
            let (cpu, npu) = (
                r.value(&key("cpu"), "tokens"),
                r.value(&key("npu"), "tokens"),
            );
            assert_eq!(cpu.split(',').count(), 16, "{model}: {cpu}");
            assert_eq!(
                npu, cpu,
                "{model}: greedy tokens ({when} weights, {cache} KV cache) differ from the CPU's"
            );
        }
    }
    // the sampling path (top-k, top-p, temperature, multinomial): every
    // sampled token is one of the 4 most likely of a CPU copy of the model
    assert_eq!(
        r.value(
            &format!("model={model} device=npu run=f32 sample "),
            "in_top4"
        ),
        "1",
        "{model}: a sampled token outside the top 4"
    );
}

fn assert_no_refusal(r: &LlmOut) {
    assert!(
        !r.run.stderr.contains(" refused ("),
        "an operator was refused:\n{}",
        r.run.stderr
    );
    assert_eq!(
        r.run.stat(&["mmu_faults"]),
        0,
        "device MMU faults: {}",
        r.run.stats
    );
}

#[test]
fn llm_llama_trains_and_generates_like_cpu() {
    if skipped("llm_llama_trains_and_generates_like_cpu") {
        return;
    }
    let r = llm_reference();
    assert_losses_match(r, "llama", "f32", 1e-3, 1e-4);
    assert_generation_matches(r, "llama");
    assert_no_refusal(r);
    // what ran is the real thing: flash attention both ways (grouped-query:
    // 4 query heads over 2 key/value heads), the embedding and its gradient,
    // SiLU and its gradient, KV-cache writes, the sampler
    for (api, types) in [
        ("aclnnFlashAttentionScore", "float32*3"),
        ("aclnnFlashAttentionScoreGrad", "float32*4"),
        ("aclnnEmbedding", "float32,int64->float32"),
        ("aclnnEmbeddingDenseBackward", "float32,int64->float32"),
        ("aclnnSilu", "float32->float32"),
        ("aclnnSiluBackward", "float32*2->float32"),
        ("aclnnInplaceIndexCopy", "float32,int64,float32->float32"),
        ("aclnnMultinomial", "float32->int64"),
        ("aclnnForeachNorm", "float32"),
    ] {
        assert!(
            r.launched(api, types),
            "{api} ({types}) never ran:\n{}",
            r.ops
        );
    }
}

#[test]
fn llm_gpt2_trains_and_generates_like_cpu() {
    if skipped("llm_gpt2_trains_and_generates_like_cpu") {
        return;
    }
    let r = llm_reference();
    assert_losses_match(r, "gpt2", "f32", 1e-3, 1e-4);
    assert_generation_matches(r, "gpt2");
    assert_no_refusal(r);
    for (api, types) in [
        ("aclnnLayerNorm", "float32*3->float32*3"),
        ("aclnnLayerNormBackward", "float32*5->float32*3"),
        ("aclnnTanh", "float32->float32"),
        ("aclnnTanhBackward", "float32*2->float32"),
        ("aclnnAddmm", "float32*3->float32"),
    ] {
        assert!(
            r.launched(api, types),
            "{api} ({types}) never ran:\n{}",
            r.ops
        );
    }
}

#[test]
fn llm_bf16_autocast_training_matches_cpu() {
    if skipped("llm_bf16_autocast_training_matches_cpu") {
        return;
    }
    let r = llm_reference();
    // CPU and NPU autocast cast different operators to bfloat16 (PyTorch's
    // CPU list vs torch_npu's CUDA-like list), so results differ by bf16
    // rounding (2^-8 = 3.9e-3 relative per rounding), not by the operators:
    // observed losses <= 1.6e-4, gradient norms <= 1.5e-3 apart
    for model in ["llama", "gpt2"] {
        assert_losses_match(r, model, "bf16", 1e-3, 1e-2);
    }
    assert_no_refusal(r);
    // the matrix products and the attention really ran in bfloat16
    for (api, types) in [
        ("aclnnMatmul", "bfloat16*2->bfloat16"),
        ("aclnnFlashAttentionScore", "bfloat16*3"),
        ("aclnnFlashAttentionScoreGrad", "bfloat16*4"),
    ] {
        assert!(
            r.launched(api, types),
            "{api} ({types}) never ran:\n{}",
            r.ops
        );
    }
}

/// The torch_npu layout libu3m.so's discard hints call through
/// (src/torch_layout.rs) is the wheel's: a probe compiled with the torch
/// and torch_npu wheels' own headers (tests/torch/hint_probe.cpp) reports
/// the vtable slot of `attachAllocatorTraceTracker`, `TraceEntry`'s
/// offsets, `FREE_COMPLETED` and the size of the tracker; run in torch_npu
/// on the simulator, the allocator's dynamic type, the exported allocator
/// symbol and the version. Needs g++ with C++20 (the wheels' headers ask
/// for it).
#[test]
fn torch_hint_layout_is_the_wheels() {
    if skipped("torch_hint_layout_is_the_wheels") {
        return;
    }
    let py = python();
    let out = common::output_ok(
        Command::new(&py)
            .args([
                "-c",
                "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))",
            ])
            .env("TORCH_DEVICE_BACKEND_AUTOLOAD", "0"),
    );
    let sp = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let probe = common::scratch("torch-hint-probe").join("hint_probe.so");
    let inc = |p: &str| format!("-I{}", sp.join(p).display());
    let lib = |p: &str| sp.join(p).display().to_string();
    // g++ with C++20, as the wheels' headers ask
    common::output_ok(
        Command::new("g++")
            .args([
                "-std=c++20",
                "-O1",
                "-shared",
                "-fPIC",
                "-D_GLIBCXX_USE_CXX11_ABI=1",
            ])
            .args([
                inc("torch/include"),
                inc("torch/include/torch/csrc/api/include"),
                inc("torch_npu/include"),
                inc("torch_npu/include/third_party/acl/inc"),
            ])
            .arg(repo().join("tests/torch/hint_probe.cpp"))
            .arg("-o")
            .arg(&probe)
            .args([
                format!("-L{}", lib("torch_npu/lib")),
                "-ltorch_npu".into(),
                format!("-L{}", lib("torch/lib")),
                "-lc10".into(),
                format!("-Wl,-rpath,{}:{}", lib("torch_npu/lib"), lib("torch/lib")),
            ]),
    );
    let probe_s = probe.display().to_string();
    let r = run_script(
        "hint_probe.py",
        &[
            probe_s.as_str(),
            torch_layout::ALLOCATOR_SYMBOL.to_str().unwrap(),
        ],
        &[],
    );
    r.must_succeed("hint_probe.py");
    let got: std::collections::HashMap<&str, &str> =
        r.stdout.lines().filter_map(|l| l.split_once('=')).collect();
    let num = |k: &str| -> i64 {
        got.get(k)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} missing:\n{}", r.stdout))
    };
    let version = got.get("version").copied().unwrap_or("");
    let row = torch_layout::KNOWN
        .iter()
        .find(|l| l.version == version)
        .unwrap_or_else(|| panic!("torch_npu {version} has no row in src/torch_layout.rs"));
    assert_eq!(got.get("class").copied(), Some(row.class), "{}", r.stdout);
    assert_eq!(num("attach_slot"), row.attach_slot as i64, "{}", r.stdout);
    assert_eq!(num("action"), row.action as i64);
    assert_eq!(num("addr"), row.addr as i64);
    assert_eq!(num("size"), row.size as i64);
    assert_eq!(num("free_completed"), row.free_completed as i64);
    assert_eq!(num("std_function"), torch_layout::STD_FUNCTION_BYTES as i64);
    assert_eq!(num("pointer"), 8);
    assert_eq!(
        num("exported"),
        1,
        "{:?} not exported",
        torch_layout::ALLOCATOR_SYMBOL
    );
}

// LLM workloads under libu3m.so in tier mode, with HBM below the footprint.

/// Both models on the NPU: generation from the initial weights, 5 AdamW
/// steps, generation (dynamic and static KV cache) and sampling.
const LLM_TIER_ARGS: &[&str] = &[
    "--models",
    "llama,gpt2",
    "--devices",
    "npu",
    "--runs",
    "f32",
    "--caches",
    "dynamic,static",
    "--sample",
];

/// The tier workload on a device large enough for it: its results and its
/// footprint (the simulator's physical peak).
fn llm_plain() -> &'static LlmOut {
    static R: OnceLock<LlmOut> = OnceLock::new();
    R.get_or_init(|| {
        let r = run_llm(LLM_TIER_ARGS, &[], &[]);
        r.run.must_succeed("the LLM workload on the simulated NPU");
        r
    })
}

/// The result lines (losses, gradient norms, tokens) of a run.
fn llm_results(r: &LlmOut) -> Vec<&str> {
    r.run
        .stdout
        .lines()
        .filter(|l| l.starts_with("model="))
        .collect()
}

/// HBM = footprint / `ratio`: the stock runtime fails with torch_npu's
/// out-of-memory error for both models; under libu3m.so (tier mode) the
/// workload completes with bit-identical losses, gradients and tokens,
/// evicting to DRAM, never above HBM and without an MMU fault. Returns the
/// tier run's U3M_SUMMARY `tier` counters.
fn llm_tier_case(ratio: f64, task_queue: bool, env: &[(&str, &str)]) -> serde_json::Value {
    let hbm = llm_hbm(ratio);
    let hbm_s = hbm.to_string();
    let stock = run_llm(
        &[LLM_TIER_ARGS, &["--expect-oom"]].concat(),
        &[("ACLSIM_HBM_BYTES", hbm_s.as_str())],
        &[],
    );
    stock
        .run
        .must_succeed("the stock run (expecting out-of-memory errors)");
    for model in ["llama", "gpt2"] {
        let line = format!("model={model} device=npu run=f32 oom=1");
        assert!(
            stock.run.stdout.contains(&line) && stock.run.stdout.contains("NPU out of memory"),
            "{ratio}x: the stock runtime did not run out of memory for {model} in {hbm} bytes:\n{}",
            stock.run.stdout
        );
    }
    assert!(
        stock.run.stat(&["failed_allocs"]) >= 2,
        "{}",
        stock.run.stats
    );
    llm_tier_run(ratio, task_queue, env)
}

/// HBM = the LLM workload's footprint (the simulator's physical peak) /
/// `ratio`.
fn llm_hbm(ratio: f64) -> u64 {
    let plain = llm_plain();
    let footprint = plain.run.stat(&["devices", "0", "peak_bytes"]);
    assert!(
        footprint >= 20 << 20,
        "footprint {footprint}: {}",
        plain.run.stats
    );
    (footprint as f64 / ratio) as u64
}

/// One run of the LLM workload under libu3m.so in tier mode with HBM at
/// footprint / `ratio` (extra `env`), checked as `llm_tier_case` says; its
/// `tier` counters.
fn llm_tier_run(ratio: f64, task_queue: bool, extra: &[(&str, &str)]) -> serde_json::Value {
    let plain = llm_plain();
    let footprint = plain.run.stat(&["devices", "0", "peak_bytes"]);
    let hbm = llm_hbm(ratio);
    let hbm_s = hbm.to_string();
    let tag = extra
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let dir = common::scratch(&format!("torch-llm-tier-{ratio}-{task_queue}-{tag}"));
    let summary = dir.join("summary.json");
    let _ = std::fs::remove_file(&summary);
    let (sum_s, dir_s) = (summary.display().to_string(), dir.display().to_string());
    let mut env = vec![
        ("ACLSIM_HBM_BYTES", hbm_s.as_str()),
        ("U3M_MODE", "tier"),
        // torch_npu's caching allocator asks for 20 MiB blocks: report room
        ("U3M_OVERSUB", "3"),
        ("U3M_SUMMARY", sum_s.as_str()),
        ("U3M_SHM_DIR", dir_s.as_str()),
    ];
    if !task_queue {
        // torch_npu launches on the Python thread (a documented torch_npu switch)
        env.push(("TASK_QUEUE_ENABLE", "0"));
    }
    env.extend_from_slice(extra);
    let u3m = common::libu3m();
    let l = run_llm(LLM_TIER_ARGS, &env, &[u3m.as_path()]);
    l.run.must_succeed(&format!(
        "{ratio}x {tag}: the LLM workload under libu3m.so (tier mode)"
    ));
    assert_eq!(
        llm_results(&l),
        llm_results(plain),
        "{ratio}x {tag}: tier mode changed the results"
    );
    assert_eq!(
        l.run.stat(&["mmu_faults"]),
        0,
        "{ratio}x {tag}: device MMU faults"
    );
    let peak = l.run.stat(&["devices", "0", "peak_bytes"]);
    assert!(
        peak <= hbm,
        "{ratio}x {tag}: physical peak {peak} above HBM {hbm}"
    );
    let s: serde_json::Value = std::fs::read_to_string(&summary)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_else(|| panic!("{ratio}x {tag}: no U3M_SUMMARY at {sum_s}"));
    let t = s["tier"].clone();
    let ev = t["evictions"].as_u64().unwrap_or(0);
    assert!(ev > 0, "{ratio}x {tag}: no evictions: {s}");
    eprintln!(
        "{ratio}x {tag}: footprint {footprint} B, HBM {hbm} B, physical peak {peak} B; {ev} evictions ({} B, {} clean drops), {} faults-in ({} B), {} discards",
        t["eviction_bytes"], t["clean_drops"], t["faults_in"], t["fault_bytes"], t["discards"]
    );
    t
}

fn counter(t: &serde_json::Value, k: &str) -> u64 {
    t[k].as_u64()
        .unwrap_or_else(|| panic!("tier counter {k} missing: {t}"))
}

/// With U3M_TORCH_HINTS=on (src/torch_hints.rs) torch_npu's freed blocks
/// are discard hints: the same results with fewer bytes copied out than
/// without (the default), in both allocator modes.
fn assert_hints_save_copy_outs(ratio: f64, env: &[(&str, &str)]) {
    let on = llm_tier_case(ratio, false, &[env, &[("U3M_TORCH_HINTS", "on")]].concat());
    let off = llm_tier_run(ratio, false, env);
    assert_eq!(counter(&off, "discards"), 0, "hints off: {off}");
    assert!(counter(&on, "discards") > 0, "no hints taken: {on}");
    let (b_on, b_off) = (
        counter(&on, "eviction_bytes"),
        counter(&off, "eviction_bytes"),
    );
    assert!(
        b_on < b_off && counter(&on, "clean_drops") > counter(&off, "clean_drops"),
        "{ratio}x: with hints {b_on} B copied out, without {b_off} B:\non {on}\noff {off}"
    );
}

#[test]
fn llm_tier_mode_at_one_and_a_half_times_hbm() {
    if skipped("llm_tier_mode_at_one_and_a_half_times_hbm") {
        return;
    }
    assert_hints_save_copy_outs(1.5, &[]);
}

/// The same with expandable segments (u3m's own physical handles under
/// torch_npu's reserved ranges).
#[test]
fn llm_tier_mode_with_expandable_segments() {
    if skipped("llm_tier_mode_with_expandable_segments") {
        return;
    }
    assert_hints_save_copy_outs(
        1.5,
        &[("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")],
    );
}

#[test]
fn llm_tier_mode_at_twice_hbm() {
    if skipped("llm_tier_mode_at_twice_hbm") {
        return;
    }
    let t = llm_tier_case(2.0, false, &[("U3M_TORCH_HINTS", "on")]);
    assert!(counter(&t, "discards") > 0, "no hints taken: {t}");
}

/// The same with torch_npu's default task queue (launches on the queue
/// thread, many GetWorkspaceSize calls ahead).
#[test]
// u3m binds each executor's tensors at GetWorkspaceSize (on the submitting
// thread), so a launch on the queue thread needs only its own tensors
// resident (it once made every live tensor resident: 207001)
fn llm_tier_mode_with_the_task_queue() {
    if skipped("llm_tier_mode_with_the_task_queue") {
        return;
    }
    let t = llm_tier_case(1.5, true, &[]);
    assert_eq!(
        counter(&t, "discards"),
        0,
        "hints without U3M_TORCH_HINTS=on: {t}"
    );
}
