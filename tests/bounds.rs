//! bench/min_bounds.py's byte bounds hold: its copy-out sweep agrees with
//! brute force on tiny traces, and no schedule `u3m replay` runs (the
//! engine's policies and Belady's MIN, through the replay's whole pipeline)
//! moves fewer bytes in either direction than the bounds say any schedule
//! must. BENCHMARKS.md uses these bounds to say how far each step's bytes
//! are from the least any schedule moves; a bound above a real schedule
//! would make that claim wrong.

mod common;

use common::{output_ok, scratch, small_13b_trace, target_dir};
use std::path::PathBuf;
use std::process::Command;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/min_bounds.py")
}

#[test]
fn the_copy_out_bound_is_never_above_the_fewest_and_the_greedy_never_below() {
    let out = Command::new("python3")
        .arg(script())
        .arg("--selftest")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("bound <= fewest <= greedy"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// (copy-in, copy-out) bytes u3m moved under each policy, as the replay
/// runs the library's pipeline on the simulator's cost model.
fn replay(trace: &str, hbm: &str) -> Vec<(String, u64, u64)> {
    let out = output_ok(
        Command::new(target_dir().join("u3m"))
            .args(["replay", trace, "--hbm", hbm, "--json"])
            .args(["--policy", "predictive,lru,belady"])
            .args(["--link-model", "shared", "--call-us", "0"])
            .args(["--issue", "acl-replay"]),
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    j["traces"][0]["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let rt = &p["runtime"];
            (
                p["policy"].as_str().unwrap().to_string(),
                rt["h2d_bytes"].as_u64().unwrap(),
                rt["d2h_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn bounds(trace: &str, hbm: &str) -> serde_json::Value {
    let out = output_ok(
        Command::new("python3")
            .arg(script())
            .args(["--json", hbm, trace]),
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    j["traces"][0].clone()
}

#[test]
fn no_schedule_the_replay_runs_moves_fewer_bytes_than_the_bounds() {
    let dir = scratch("bounds");
    for workload in ["lora", "adam"] {
        let (trace, hbm) = small_13b_trace(&dir, workload);
        let b = bounds(&trace, &hbm);
        let g = |k: &str| b[k].as_u64().unwrap();
        let (in_demand, in_bypass, out_bound, out_greedy) = (
            g("in_demand"),
            g("in_bypass"),
            g("out_bound"),
            g("out_greedy"),
        );
        assert!(in_bypass <= in_demand && out_bound <= out_greedy, "{b}");
        // the bounds say something: both directions must move data here
        assert!(
            in_bypass > 0 && out_bound > 0,
            "{workload}: trivial bounds {b}"
        );
        let runs = replay(&trace, &hbm);
        assert_eq!(runs.len(), 3);
        for (policy, h2d, d2h) in runs {
            assert!(
                h2d >= in_bypass && d2h >= out_bound,
                "{workload}, {policy}: in {h2d} / out {d2h} bytes, below the bounds {b}"
            );
        }
    }
}
