//! `u3m snapshot`: a trace of mlp_train recorded under libu3m.so becomes a
//! PyTorch memory snapshot; PyTorch's own `torch.cuda._memory_viz` (the torch
//! venv of ci/install-torch.sh; `U3M_SKIP_TORCH=1` skips that part) reads it,
//! builds the trace plot and the segment plot, and its event counts match the
//! trace (allocations, frees) and the engine's replay (evictions as
//! `segment_unmap`, fault-ins as `segment_map`). A live process gives a
//! snapshot of its allocations from the stats segment.

mod common;
use common::{app, libu3m, scratch, target_dir};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn u3m() -> PathBuf {
    target_dir().join("u3m")
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The torch venv's python, or None with U3M_SKIP_TORCH=1.
fn torch_python() -> Option<PathBuf> {
    if std::env::var("U3M_SKIP_TORCH").is_ok_and(|v| v == "1") {
        eprintln!("NOTICE: the torch.cuda._memory_viz checks are skipped (U3M_SKIP_TORCH=1)");
        return None;
    }
    static PY: OnceLock<PathBuf> = OnceLock::new();
    Some(
        PY.get_or_init(|| {
            let out = Command::new("bash")
                .arg(repo().join("ci/install-torch.sh"))
                .output()
                .expect("run ci/install-torch.sh");
            assert!(
                out.status.success(),
                "ci/install-torch.sh failed; U3M_SKIP_TORCH=1 skips the torch checks:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        })
        .clone(),
    )
}

/// What torch.cuda._memory_viz made of a snapshot (tests/snapshot/check_snapshot.py).
fn memory_viz(py: &Path, pickle: &Path) -> serde_json::Value {
    let out = Command::new(py)
        .arg(repo().join("tests/snapshot/check_snapshot.py"))
        .arg(pickle)
        .env("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "_memory_viz failed on {}:\n{}",
        pickle.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `u3m snapshot ARGS`: the counts it reports on stderr, by action.
fn snapshot(args: &[&str]) -> BTreeMap<String, u64> {
    let out = Command::new(u3m())
        .arg("snapshot")
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "u3m snapshot {args:?}: {err}");
    let line = err
        .lines()
        .find_map(|l| l.split("trace entries: ").nth(1))
        .unwrap_or_else(|| panic!("{err}"));
    line.split(", ")
        .filter_map(|p| p.split_once(' '))
        .map(|(n, k)| (k.to_string(), n.parse().unwrap()))
        .collect()
}

fn clean_env(c: &mut Command) -> &mut Command {
    common::hermetic(c)
}

#[test]
fn a_recorded_trace_becomes_a_snapshot_pytorch_reads_with_the_engines_evictions() {
    let dir = scratch("snapshot-trace");
    let trace = dir.join("mlp.trace");
    let out = clean_env(&mut Command::new(app("mlp_train")))
        .args(["--footprint", "120M", "--steps", "2"])
        .env("LD_PRELOAD", libu3m())
        .env("U3M_SHM_DIR", &dir)
        .env("U3M_TRACE", &trace)
        .env("U3M_TRACE_LOSSLESS", "1")
        .env("ACLSIM_HBM_BYTES", "2G")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let allocs = text.lines().filter(|l| l.starts_with("A ")).count() as u64;
    let frees = text.lines().filter(|l| l.starts_with("F ")).count() as u64;
    assert!(allocs > 10 && frees == allocs, "{allocs} A, {frees} F");

    // what the engine does with this trace at 96 MiB of HBM
    let rep = Command::new(u3m())
        .args(["replay", "--json", "--hbm", "96M", "--policy", "predictive"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        rep.status.success(),
        "{}",
        String::from_utf8_lossy(&rep.stderr)
    );
    let rep: serde_json::Value = serde_json::from_slice(&rep.stdout).unwrap();
    let p = &rep["traces"][0]["policies"][0];
    let (evictions, faults) = (
        p["evictions"].as_u64().unwrap(),
        p["faults_in"].as_u64().unwrap(),
    );
    assert!(evictions > 0, "{p}");

    let pressed = dir.join("pressed.pickle");
    let c = snapshot(&[
        "--trace",
        trace.to_str().unwrap(),
        "--hbm",
        "96M",
        "-o",
        pressed.to_str().unwrap(),
    ]);
    for k in ["alloc", "segment_alloc"] {
        assert_eq!(c[k], allocs, "{k}: {c:?}");
    }
    for k in ["free_requested", "free_completed", "segment_free"] {
        assert_eq!(c[k], frees, "{k}: {c:?}");
    }
    assert_eq!(
        c["segment_unmap"], evictions,
        "one unmap per eviction: {c:?}"
    );
    assert_eq!(c["segment_map"], faults, "one map per chunk arrival: {c:?}");
    // with HBM to spare nothing leaves it
    let roomy = dir.join("roomy.pickle");
    let c0 = snapshot(&[
        "--trace",
        trace.to_str().unwrap(),
        "-o",
        roomy.to_str().unwrap(),
    ]);
    assert_eq!(c0.get("segment_unmap"), None, "{c0:?}");
    assert!(
        c0["segment_map"] > 0 && c0["segment_map"] < c["segment_map"],
        "{c0:?}"
    );

    let Some(py) = torch_python() else {
        return;
    };
    let v = memory_viz(&py, &pressed);
    let total: u64 = c.values().sum();
    for (k, n) in &c {
        assert_eq!(v["actions"][k].as_u64(), Some(*n), "{k}: {v}");
    }
    assert_eq!(v["trace_plot"]["viz_kind"], "Active Memory Timeline");
    assert_eq!(v["segment_plot"]["viz_kind"], "Allocator State History");
    for plot in ["trace_plot", "segment_plot"] {
        assert_eq!(v[plot]["same_snapshot"], true, "{plot}: {v}");
    }
    assert_eq!(v["trace_entries"], serde_json::json!([total]), "{v}");
    assert_eq!(v["cudaMalloc_lines"].as_u64(), Some(allocs));
    assert_eq!(v["segments"], serde_json::json!([]), "everything was freed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_live_process_gives_its_allocations() {
    let dir = scratch("snapshot-live");
    let mut child = clean_env(&mut Command::new(app("mlp_train")))
        .args(["--footprint", "180M", "--steps", "40"])
        .env("LD_PRELOAD", libu3m())
        .env("U3M_SHM_DIR", &dir)
        .env("U3M_MODE", "tier")
        .env("ACLSIM_HBM_BYTES", "128M")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let seg = dir.join(format!("u3m.{pid}"));
    let t0 = Instant::now();
    let pickle = dir.join("live.pickle");
    // wait until the model is allocated (the first step's launches)
    let c = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no segment at {}",
            seg.display()
        );
        std::thread::sleep(Duration::from_millis(200));
        if !seg.exists() {
            continue;
        }
        let c = snapshot(&[
            "-p",
            &pid.to_string(),
            "--dir",
            dir.to_str().unwrap(),
            "-o",
            pickle.to_str().unwrap(),
        ]);
        if c.get("alloc").copied().unwrap_or(0) >= 40 {
            break c;
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        c.get("segment_map"),
        None,
        "no residency events live: {c:?}"
    );
    assert_eq!(c["alloc"], c["segment_alloc"]);
    if let Some(py) = torch_python() {
        let v = memory_viz(&py, &pickle);
        let live = v["segments"].as_array().unwrap();
        // what was allocated and not freed is a segment with its one block
        let freed = c.get("segment_free").copied().unwrap_or(0);
        assert_eq!(live.len() as u64, c["alloc"] - freed, "{v}");
        assert!(live
            .iter()
            .all(|s| s["blocks"] == 1 && s["total_size"].as_u64().unwrap() > 0));
        assert_eq!(v["trace_plot"]["same_snapshot"], true);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
