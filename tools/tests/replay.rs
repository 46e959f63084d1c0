//! `u3m replay` on hand-built traces (tests/traces/replay/*.trace) whose
//! right answers are known: what each policy must do, and that Belady's MIN
//! is never beaten.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

const MIB2: u64 = 2 << 20;

fn trace(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/traces/replay")
        .join(format!("{name}.trace"));
    p.to_str().unwrap().to_string()
}

fn u3m(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_u3m"))
        .arg("replay")
        .args(args)
        .output()
        .expect("run u3m")
}

/// `u3m replay --json ARGS`: the single trace's report.
fn replay(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let o = u3m(&a);
    assert!(
        o.status.success(),
        "u3m replay {args:?}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("--json prints JSON");
    v["traces"][0].clone()
}

fn policy<'a>(t: &'a Value, name: &str) -> &'a Value {
    t["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == name)
        .unwrap_or_else(|| panic!("no row for {name}: {t:#}"))
}

/// The row of a policy this build may lack (markov, predictive and belady
/// come with the predictive-policy work): None, after checking the replayer
/// said why, when it is unavailable.
fn optional<'a>(t: &'a Value, name: &str) -> Option<&'a Value> {
    if let Some(p) = t["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == name)
    {
        return Some(p);
    }
    let u = t["unavailable"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["policy"] == name)
        .unwrap_or_else(|| panic!("{name} neither ran nor is unavailable: {t:#}"));
    assert!(
        u["reason"].as_str().unwrap().contains("not in this build"),
        "{u}"
    );
    None
}

fn fault_in(p: &Value) -> u64 {
    p["fault_in_bytes"]["total"].as_u64().unwrap()
}

/// Everything copied into HBM: on demand and ahead of use (the look-ahead
/// prefetch turns copy-ins into prefetches; MIN bounds their sum).
fn copied_in(p: &Value) -> u64 {
    fault_in(p) + p["prefetch_bytes"].as_u64().unwrap()
}

/// Exact figures need the textbook setting: no background evictions
/// (--tick-ms 0) and a host that issues a call only once the previous one
/// ran (--queue 1), so every resident chunk is idle when eviction picks.
const EXACT: &[&str] = &["--tick-ms", "0", "--queue", "1"];

#[test]
fn strict_loop_lru_faults_on_every_access_belady_keeps_three() {
    // 6 buffers of one chunk read in a strict loop, 10 rounds, HBM 4 chunks.
    let mut a = vec![
        trace("loop").leak() as &str,
        "--hbm",
        "8M",
        "--policy",
        "lru,belady",
    ];
    a.extend_from_slice(EXACT);
    let t = replay(&a);
    assert_eq!(t["ticks"], 60);
    let lru = policy(&t, "lru");
    // every access after the first round misses: 54 copy-ins (the first
    // round's are fresh memory: mapped, nothing to copy)
    assert_eq!(lru["arrivals_by_tag"]["loop"], 60);
    assert_eq!(fault_in(lru), 54 * MIB2);
    // the first eviction of each buffer writes it back (fresh memory has no
    // host copy); afterwards they are clean and dropped without a copy
    assert_eq!(lru["writeback_bytes"]["total"], 6 * MIB2);
    assert_eq!(lru["clean_drops"], 56 - 6);
    // the same bytes by the tag of the allocation they belong to
    assert_eq!(lru["copies_by_tag"]["loop"]["in"], 54 * MIB2);
    assert_eq!(lru["copies_by_tag"]["loop"]["out"], 6 * MIB2);
    // MIN by hand (M = miss), rounds 1..10:
    //   MMMMMM ...MM. ..MM.. .MM... MM...M M...MM ...MM. ..MM.. .MM... MM...M
    // 27 misses, 6 of them cold: 21 copy-ins.
    let Some(b) = optional(&t, "belady") else {
        return;
    };
    assert_eq!(b["arrivals_by_tag"]["loop"], 27);
    assert_eq!(fault_in(b), 21 * MIB2);
    assert_eq!(b["moved_vs_belady"].as_f64(), Some(1.0));
    assert!(lru["moved_vs_belady"].as_f64().unwrap() > 2.0);
    // LRU stalls longer than MIN, both longer than unlimited HBM
    assert!(lru["stall_ns"].as_u64() > b["stall_ns"].as_u64());
    assert!(b["stall_ns"].as_u64().unwrap() > 0);
    assert_eq!(
        lru["total_ns"].as_u64().unwrap(),
        t["baseline_ns"].as_u64().unwrap() + lru["stall_ns"].as_u64().unwrap()
    );
}

#[test]
fn scan_larger_than_hbm() {
    // 12 chunks written once, then read twice in order; HBM 4 chunks, of
    // which the 4 KiB unmanaged buffer takes one: 3 chunks for the scan
    let mut a = vec![
        trace("scan").leak() as &str,
        "--hbm",
        "8M",
        "--policy",
        "lru,belady",
    ];
    a.extend_from_slice(EXACT);
    let t = replay(&a);
    let lru = policy(&t, "lru");
    // LRU: every read of both passes misses
    assert_eq!(fault_in(lru), 24 * MIB2);
    // each chunk is dirty once (written by the first pass) and copied out once
    assert_eq!(lru["writeback_bytes"]["total"], 12 * MIB2);
    // all of it the scan's: the unmanaged buffer never moves
    let tags = lru["copies_by_tag"].as_object().unwrap();
    assert_eq!(tags.len(), 1, "{tags:?}");
    assert_eq!(lru["copies_by_tag"]["scan"]["in"], 24 * MIB2);
    assert_eq!(lru["copies_by_tag"]["scan"]["out"], 12 * MIB2);
    // MIN by hand (M = miss), write pass then two read passes:
    //   MMMMMMMMMMMM ..MMMMMMMMM. .MMMMMMMMM..
    // 30 misses of which 12 are the fresh write pass: 18 copy-ins
    let Some(b) = optional(&t, "belady") else {
        return;
    };
    assert_eq!(fault_in(b), 18 * MIB2);
    assert!(b["writeback_bytes"]["total"].as_u64() <= lru["writeback_bytes"]["total"].as_u64());
}

#[test]
fn hot_set_stays_resident_under_every_policy() {
    let t = replay(&[&trace("hotcold"), "--hbm", "12M"]);
    assert!(t["policies"].as_array().unwrap().len() >= 2, "{t:#}");
    for p in t["policies"].as_array().unwrap() {
        // two hot chunks, each arrives once; the cold sweep misses
        assert_eq!(p["arrivals_by_tag"]["hot"], 2, "{}: {p:#}", p["policy"]);
        assert!(
            p["arrivals_by_tag"]["cold"].as_u64().unwrap() > 20,
            "{}",
            p["policy"]
        );
    }
}

#[test]
fn train_to_infer_switch_is_reported_once_by_predictive() {
    let t = replay(&[
        &trace("switch"),
        "--hbm",
        "16M",
        "--policy",
        "predictive,lru",
    ]);
    let Some(p) = optional(&t, "predictive") else {
        return;
    };
    let switches: Vec<&str> = p["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .filter(|e| e.contains("mode ") && e.contains(" -> "))
        .collect();
    assert_eq!(switches.len(), 1, "{:#}", p["events"]);
    assert!(switches[0].contains("train -> infer"), "{}", switches[0]);
}

#[test]
fn belady_is_never_beaten() {
    for (name, hbm) in [
        ("loop", "8M"),
        ("scan", "8M"),
        ("hotcold", "12M"),
        ("switch", "16M"),
    ] {
        // the textbook setting, where MIN is a theorem, and the defaults
        // (background evictions, a host running ahead), where it need not
        // be (docs/replay.md) but holds on these traces
        for extra in [EXACT, &[][..]] {
            let mut a = vec![trace(name).leak() as &str, "--hbm", hbm];
            a.extend_from_slice(extra);
            let t = replay(&a);
            for p in t["policies"].as_array().unwrap() {
                assert_eq!(p["runtime_misuse"], 0, "{name}: {}", p["policy"]);
            }
            let Some(b) = optional(&t, "belady") else {
                continue;
            };
            let best = copied_in(b);
            for p in t["policies"].as_array().unwrap() {
                // In the defaults MIN is not a theorem: a host running ahead
                // and background evictions decide with stale information,
                // and predictive's kept victim order (rebuilt every 4 calls,
                // issue 10 part 2) beat belady's per-eviction order on
                // `loop` (58 vs 78 MiB in). There belady must still beat
                // the recency baseline.
                let exact = extra == EXACT;
                let rival = p["policy"] == "lru" || exact;
                assert!(
                    !rival || copied_in(p) >= best,
                    "{name} {extra:?}: {} copies in {} bytes < belady's {best}",
                    p["policy"],
                    copied_in(p)
                );
            }
        }
    }
}

#[test]
fn every_policy_is_available() {
    // seed-heat, lru, markov, predictive and belady are all in u3m_core:
    // none may be skipped (the `optional` rows above are then never None)
    let t = replay(&[&trace("loop"), "--hbm", "8M"]);
    assert_eq!(
        t["unavailable"].as_array().unwrap().len(),
        0,
        "{}",
        t["unavailable"]
    );
    let names: Vec<&str> = t["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["seed-heat", "lru", "markov", "predictive", "belady"]
    );
}

#[test]
fn malformed_trace_is_a_line_numbered_error_with_status_3() {
    let o = u3m(&[&trace("malformed"), "--hbm", "8M"]);
    assert_eq!(o.status.code(), Some(3));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains(
            "malformed.trace:4: O Relu: input 0 0x90000000:4096 is not inside one live allocation"
        ),
        "{e}"
    );
    assert!(o.stdout.is_empty());
}

#[test]
fn json_carries_every_figure_and_the_text_table_agrees() {
    let t = replay(&[
        &trace("loop"),
        "--hbm",
        "8M",
        "--policy",
        "lru",
        "--window",
        "4,32",
        "--sample-every",
        "8",
    ]);
    let p = policy(&t, "lru");
    for k in [
        "fault_in_bytes",
        "writeback_bytes",
        "clean_drops",
        "stall_ns",
        "total_ns",
        "moved_bytes",
        "prediction",
        "events",
    ] {
        assert!(!p[k].is_null(), "{k} missing: {p:#}");
    }
    let pr = p["prediction"].as_array().unwrap();
    assert_eq!(pr.len(), 2);
    assert_eq!(pr[0]["window"], 4);
    // LRU's implicit prediction on a strict loop of period 6: what was used
    // in the last W ticks. W = 4 names 4 chunks, the next 4 ticks touch the
    // other two and two of those: precision 1/2, recall 1/2.
    assert_eq!(pr[0]["precision"].as_f64(), Some(0.5));
    assert_eq!(pr[0]["recall"].as_f64(), Some(0.5));
    // W = 32 >= the period: all 6 predicted at each of the 7 samples (ticks
    // 8..56), all accessed but at tick 56, where only 4 ticks remain
    assert_eq!(p["samples"], 7);
    assert_eq!(pr[1]["predicted_bytes"].as_u64(), Some(42 * MIB2));
    assert_eq!(pr[1]["hit_bytes"].as_u64(), Some(40 * MIB2));
    assert_eq!(pr[1]["recall"].as_f64(), Some(1.0));
    let o = u3m(&[&trace("loop"), "--hbm", "8M", "--policy", "lru"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("policy") && text.contains("lru") && text.contains("108.0 MiB"),
        "{text}"
    );
}

#[test]
fn bad_arguments_are_usage_errors() {
    assert_eq!(
        u3m(&[&trace("loop"), "--hbm", "8M", "--policy", "fifo"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        u3m(&[&trace("loop"), "--hbm", "lots"]).status.code(),
        Some(2)
    );
    assert_eq!(u3m(&[&trace("loop")]).status.code(), Some(2));
    assert_eq!(
        u3m(&["/nonexistent.trace", "--hbm", "8M"]).status.code(),
        Some(3)
    );
}

/// `--look-ahead on` with belady (or plan) in the policies: said on stderr,
/// since those run with demand paging only; the others still get it.
#[test]
fn the_look_ahead_says_which_policies_it_skips() {
    let o = u3m(&[
        &trace("loop"),
        "--hbm",
        "8M",
        "--policy",
        "lru,belady",
        "--look-ahead",
        "on",
    ]);
    assert!(o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("--look-ahead on does not apply to belady"),
        "{e}"
    );
    let o = u3m(&[
        &trace("loop"),
        "--hbm",
        "8M",
        "--policy",
        "lru",
        "--look-ahead",
        "on",
    ]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("does not apply"));
}

#[test]
fn nvme_tier_takes_what_dram_cannot() {
    // DRAM of 4 MiB (2 chunks), NVMe beside it: the scan's evictions must
    // go to NVMe and come back from it, with NVMe time on the clock
    let mut a = vec![
        trace("scan").leak() as &str,
        "--hbm",
        "8M",
        "--dram",
        "4M",
        "--nvme",
        "64M",
        "--policy",
        "lru",
    ];
    a.extend_from_slice(EXACT);
    let t = replay(&a);
    let p = policy(&t, "lru");
    assert!(p["writeback_bytes"]["nvme"].as_u64().unwrap() > 0, "{p:#}");
    assert!(p["fault_in_bytes"]["nvme"].as_u64().unwrap() > 0, "{p:#}");
    assert_eq!(fault_in(p), 24 * MIB2);
    let dram_only = policy(
        &replay(&{
            let mut a = vec![
                trace("scan").leak() as &str,
                "--hbm",
                "8M",
                "--policy",
                "lru",
            ];
            a.extend_from_slice(EXACT);
            a
        }),
        "lru",
    )
    .clone();
    assert!(
        p["total_ns"].as_u64() > dram_only["total_ns"].as_u64(),
        "NVMe must cost time"
    );
}

/// A program of the simulator (built by `cargo build --release --workspace`,
/// next to the u3m binary) with a clean environment.
fn sim_program(name: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_u3m"));
    let dir = bin.parent().unwrap();
    let prog = dir.join("acl-apps").join(name);
    assert!(
        prog.exists(),
        "{} missing: build the workspace first (cargo build --release --workspace)",
        prog.display()
    );
    let scratch =
        std::env::temp_dir().join(format!("u3m-replay-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let stats = scratch.join(format!("stats-{}.json", env.len()));
    let mut cmd = Command::new(&prog);
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("ACLSIM_") || k.starts_with("U3M_") || k == "LD_PRELOAD" {
            cmd.env_remove(k);
        }
    }
    cmd.env("ACLSIM_STATS", &stats).env("U3M_SHM_DIR", &scratch);
    for (k, v) in env {
        let v = v
            .replace("@LIB", dir.join("libu3m.so").to_str().unwrap())
            .replace("@DIR", scratch.to_str().unwrap());
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{name}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    s
}

#[test]
fn a_recorded_workload_replays_in_the_simulators_time() {
    // mlp_train recorded in observe mode; the replay's unlimited-HBM time
    // against the simulator's own clock for the same run (the program copies
    // from malloc'd memory: --pageable)
    let args = ["--hidden", "1620", "--batch", "16", "--steps", "2"];
    let trace =
        std::env::temp_dir().join(format!("u3m-replay-test-{}-mlp.trace", std::process::id()));
    let t = trace.to_str().unwrap();
    let observed = sim_program(
        "mlp_train",
        &args,
        &[
            ("LD_PRELOAD", "@LIB"),
            ("U3M_MODE", "observe"),
            ("U3M_TRACE", t),
            ("U3M_TRACE_LOSSLESS", "1"),
        ],
    );
    let sim_ns = observed["sim_ns"].as_f64().unwrap();
    let r = replay(&[t, "--hbm", "32G", "--pageable", "--policy", "lru"]);
    let t0 = r["baseline_ns"].as_f64().unwrap();
    assert!(
        (t0 / sim_ns - 1.0).abs() < 0.15,
        "replay {t0} ns vs simulator {sim_ns} ns"
    );
    // the same program tiered by libu3m.so in 66 MiB of HBM against the
    // replay of its trace: the same engine, so the same traffic, give or
    // take the background round's cadence (the library's is 20 ms of wall
    // time, many rounds per simulated ms: --tick-ms 0.5 is like for like)
    let summary = trace.with_extension("summary.json");
    let tiered = sim_program(
        "mlp_train",
        &args,
        &[
            ("LD_PRELOAD", "@LIB"),
            ("U3M_MODE", "tier"),
            ("U3M_POLICY", "lru"),
            ("U3M_SUMMARY", summary.to_str().unwrap()),
            ("ACLSIM_HBM_BYTES", "66M"),
        ],
    );
    let lib: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let r = replay(&[
        t,
        "--hbm",
        "66M",
        "--pageable",
        "--policy",
        "lru",
        "--tick-ms",
        "0.5",
    ]);
    let p = policy(&r, "lru");
    let (lib_in, rep_in) = (
        lib["tier"]["fault_bytes"].as_f64().unwrap(),
        fault_in(p) as f64,
    );
    let (lib_ns, rep_ns) = (
        tiered["sim_ns"].as_f64().unwrap(),
        p["total_ns"].as_f64().unwrap(),
    );
    assert!(
        lib_in > 0.0 && (rep_in / lib_in - 1.0).abs() < 0.25,
        "copied in: replay {rep_in} vs library {lib_in}"
    );
    assert!(
        (rep_ns / lib_ns - 1.0).abs() < 0.25,
        "time: replay {rep_ns} vs library {lib_ns}"
    );
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_file(&summary);
}

/// An optimizer step larger than HBM (issue 11): with host mapping (the
/// default) every policy replays it, part of its memory host-mapped and
/// read over the link; with --host-map off the replay stops at it.
#[test]
fn an_operator_larger_than_hbm_replays_host_mapped() {
    let t = replay(&[&trace("oversize_op"), "--hbm", "20M"]);
    for p in t["policies"].as_array().unwrap() {
        let name = p["policy"].as_str().unwrap();
        assert!(p["host_map"]["maps"].as_u64().unwrap() > 0, "{name}: {p:#}");
        assert!(
            p["runtime"]["host_mapped_read_bytes"].as_u64().unwrap() > 0,
            "{name}"
        );
        assert_eq!(p["runtime_misuse"], 0, "{name}");
        assert!(p["peak_hbm_bytes"].as_u64().unwrap() <= 20 << 20, "{name}");
    }
    let o = u3m(&[&trace("oversize_op"), "--hbm", "20M", "--host-map", "off"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("oversize_op.trace:16: ApplyAdamW: the Tier could not make its memory accessible (error 207001"),
        "{err}"
    );
}

/// Read-once streams (issue 11 bullet 2): serving over weights 2 x HBM
/// (tests/oversize_data/rag_small.trace, 62 MiB on 32 MiB) with
/// `--host-map stream` maps weight chunks instead of copying them in and
/// reads them in place: fewer bytes copied in than `auto`, which maps
/// nothing; no runtime misuse, HBM never exceeded.
#[test]
fn read_once_streams_are_host_mapped_with_host_map_stream() {
    let t =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/oversize_data/rag_small.trace");
    let t = t.to_str().unwrap();
    let run = |hm: &str| {
        let r = replay(&[
            t,
            "--hbm",
            "32M",
            "--policy",
            "predictive",
            "--host-map",
            hm,
        ]);
        policy(&r, "predictive").clone()
    };
    let (a, s) = (run("auto"), run("stream"));
    assert_eq!(a["host_map"]["stream_maps"], 0, "{a:#}");
    assert_eq!(a["host_map"]["maps"], 0, "{a:#}");
    assert!(s["host_map"]["stream_maps"].as_u64().unwrap() > 0, "{s:#}");
    assert!(s["host_map"]["stream_reads"].as_u64().unwrap() > 0, "{s:#}");
    assert!(s["runtime"]["host_mapped_read_bytes"].as_u64().unwrap() > 0);
    assert_eq!(s["runtime"]["host_mapped_write_bytes"], 0);
    assert!(
        s["runtime"]["h2d_bytes"].as_u64().unwrap() < a["runtime"]["h2d_bytes"].as_u64().unwrap(),
        "{s:#}\n{a:#}"
    );
    for p in [&a, &s] {
        assert_eq!(p["runtime_misuse"], 0);
        assert!(p["peak_hbm_bytes"].as_u64().unwrap() <= 32 << 20);
    }
}

/// A call that waits for more than 2000 copy-outs of other chunks (a 5 GiB
/// memset on 6 GiB of HBM evicting 4 GiB of dirty data, 2048 chunks) runs:
/// the Tier's retry cap grows with the call's size. With a fixed cap of 2000
/// it was refused with 207001 midway — the 1 B-parameter fused-optimizer
/// trace stopped at its first 4 GiB memset (BENCHMARKS.md, issue 11).
#[test]
fn a_call_waiting_for_thousands_of_copy_outs_is_not_refused() {
    let t = replay(&[
        &trace("big_evict"),
        "--hbm",
        "6G",
        "--policy",
        "lru,predictive",
    ]);
    for p in t["policies"].as_array().unwrap() {
        let name = p["policy"].as_str().unwrap();
        assert!(p["evictions"].as_u64().unwrap() >= 2048, "{name}: {p:#}");
        assert!(p["peak_hbm_bytes"].as_u64().unwrap() <= 6 << 30, "{name}");
        assert_eq!(p["runtime_misuse"], 0, "{name}");
    }
}

/// Issue 10's proof: predictive moves at most 1.15 × the bytes Belady's MIN
/// moves on a recorded program trace. mlp_train as bench/policies.sh runs it
/// (full-parameter Adam, 6 steps, 392 MiB of managed memory) recorded in
/// observe mode, replayed on 2/3 of its footprint (1.5 ×): 1.100 with the
/// victim order rebuilt every 2 calls while few chunks are modelled; 1.165
/// when it was kept for 4 calls (the optimizer state just updated, the
/// furthest-needed chunk, stayed out of the kept order and the state the
/// next step needs first was evicted instead).
#[test]
fn predictive_moves_at_most_1_15_x_belady_on_mlp_train() {
    let args = ["--footprint", "384M", "--hidden", "1023", "--steps", "6"];
    let Some(ratio) = recorded_vs_belady("mlp_train", &args, 300 << 20) else {
        return;
    };
    assert!(
        ratio <= 1.15,
        "predictive moves {ratio:.3} x Belady's bytes"
    );
}

/// `--issue acl-replay` orders streams as acl_replay does: an operator on
/// stream 2 that reads what stream 1's wrote waits for it (an event), one on
/// stream 3 that shares only an input does not; as recorded, the three
/// streams run side by side. Each operator is 1 ms (280 GFLOP at 280 TFLOPS).
#[test]
fn acl_replay_issue_waits_for_conflicting_streams() {
    let dir = std::env::temp_dir().join(format!("u3m-replay-issue.{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("conflict.trace");
    std::fs::write(
        &path,
        "# u3m-trace 1\n\
         A 0x10000000 4194304\nA 0x20000000 4194304\nA 0x30000000 4194304\nA 0x40000000 4194304\n\
         O MatMul 1 1 0x10000000:4194304 0x20000000:4194304 flops=280000000000 stream=1\n\
         O MatMul 1 1 0x20000000:4194304 0x30000000:4194304 flops=280000000000 stream=2\n\
         O MatMul 1 1 0x10000000:4194304 0x40000000:4194304 flops=280000000000 stream=3\n\
         F 0x20000000\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let total = |issue: &str| {
        let t = replay(&[
            p,
            "--hbm",
            "64M",
            "--policy",
            "lru",
            "--call-us",
            "0",
            "--issue",
            issue,
        ]);
        policy(&t, "lru")["total_ns"].as_u64().unwrap()
    };
    let (rec, acl) = (total("recorded"), total("acl-replay"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!((1_000_000..1_100_000).contains(&rec), "recorded: {rec} ns");
    assert!(
        (2_000_000..2_100_000).contains(&acl),
        "acl-replay: {acl} ns"
    );
}

/// Predictive's bytes moved ÷ Belady's on a simulator program recorded in
/// observe mode and replayed at 2/3 of its footprint (issue 10's proof, as
/// bench/policies.sh measures it); checks the footprint is over `min_foot`.
fn recorded_vs_belady(name: &str, args: &[&str], min_foot: u64) -> Option<f64> {
    // tests run in parallel and may record the same program
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let trace = std::env::temp_dir().join(format!(
        "u3m-replay-test-{}-{name}-{}-belady.trace",
        std::process::id(),
        RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let t = trace.to_str().unwrap();
    sim_program(
        name,
        args,
        &[
            ("LD_PRELOAD", "@LIB"),
            ("U3M_MODE", "observe"),
            ("U3M_TRACE", t),
            ("ACLSIM_HBM_BYTES", "16G"),
        ],
    );
    let ratio = trace_vs_belady(name, t, &["--pageable"], min_foot);
    let _ = std::fs::remove_file(&trace);
    ratio
}

/// Predictive's bytes moved ÷ Belady's on trace `t` replayed at 2/3 of its
/// footprint with `extra` replay arguments (None when the build has no
/// predictive policy); checks the footprint is over `min_foot`.
fn trace_vs_belady(name: &str, t: &str, extra: &[&str], min_foot: u64) -> Option<f64> {
    let probe = replay(&[&[t, "--hbm", "1T", "--policy", "lru"], extra].concat());
    let foot = probe["footprint_bytes"].as_u64().unwrap();
    assert!(foot > min_foot, "{name}: footprint {foot}");
    let hbm = (foot * 2 / 3 / MIB2 * MIB2).to_string();
    let r = replay(&[&[t, "--hbm", &hbm, "--policy", "predictive,belady"], extra].concat());
    let p = optional(&r, "predictive")?;
    let b = policy(&r, "belady");
    let moved = |p: &Value| fault_in(p) + p["writeback_bytes"]["total"].as_u64().unwrap();
    assert!(moved(b) > 0, "{name}: Belady moves nothing at {hbm}: {b:#}");
    let ratio = p["moved_vs_belady"].as_f64().unwrap();
    assert!(
        (ratio - moved(p) as f64 / moved(b) as f64).abs() < 1e-6,
        "{name}: moved_vs_belady {ratio} vs {} / {}",
        moved(p),
        moved(b)
    );
    eprintln!(
        "{name}: predictive {} / Belady {} bytes = {ratio:.3} at --hbm {hbm}",
        moved(p),
        moved(b)
    );
    Some(ratio)
}

/// Small programs (tens to a few hundred chunks): the kept victim order is
/// built at every call, so the chunk a call just finished with — the one
/// needed furthest off — is in it. Kept 2 calls, oversize_app (five 16 MiB
/// buffers copied in, one operator over all, each copied back once)
/// evicted the buffers still to be read back instead of the one just read:
/// 1.429 x Belady's bytes (1.000 now), and mlp_train at 128 MiB 1.185
/// (1.093 now).
#[test]
fn predictive_moves_at_most_1_15_x_belady_on_small_recorded_programs() {
    let cases: [(&str, &[&str], u64); 2] = [
        ("oversize_app", &[], 64 << 20),
        (
            "mlp_train",
            &["--footprint", "128M", "--hidden", "1023", "--steps", "6"],
            96 << 20,
        ),
    ];
    for (name, args, min_foot) in cases {
        let Some(ratio) = recorded_vs_belady(name, args, min_foot) else {
            return;
        };
        assert!(
            ratio <= 1.15,
            "{name}: predictive moves {ratio:.3} x Belady's bytes"
        );
    }
}

/// A small training run's first step: with 4 layers the period of repeated
/// calls found first is a layer's, and the step shift expected the
/// optimizer state just updated (idle since start-up) back a layer later;
/// the state the pass had yet to reach was evicted before it (1.231 x
/// Belady's bytes; 1.124 now that a chunk idle for over a step and a half
/// does not take the step's shift).
#[test]
fn predictive_moves_at_most_1_15_x_belady_on_a_small_recompute_run() {
    let args = [
        "--model",
        "llama2-7b",
        "--workload",
        "adam",
        "--recompute",
        "--scale",
        "8",
        "--layers",
        "4",
        "--steps",
        "6",
    ];
    let Some(ratio) = synth_vs_belady("adam --recompute, 4 layers", &args, 256 << 20) else {
        return;
    };
    assert!(
        ratio <= 1.15,
        "predictive moves {ratio:.3} x Belady's bytes"
    );
}

/// Issue 10 part 3: the 13B-shaped full-parameter AdamW step (8 layers, seq
/// 1024 x batch 2) at 1.5 x HBM, predictive, per step from 1- and 3-step
/// synth traces. Its links carry nothing while forward and backward compute
/// (about 195 of the unconstrained step's 282.5 simulated ms); the rest of
/// the step is the optimizer's copies. The copy-in direction may idle for
/// at most 0.8 x the unconstrained step: 196.9 ms with demand eviction
/// taking an idle victim near the busy front of the order (evict.rs
/// `SCAN_FAR`), 244.8 ms when every copy-in whose 64 nearest victims were
/// in use by queued optimizer work waited for that work (998.5 ms per
/// step, 950.6 ms with that change; 848.5 ms and 159.5 ms idle with the
/// predictor's idle-chunk rule too, copy-ins 689 ms at 16.04 GiB).
#[test]
fn adam_13b_copy_ins_idle_only_while_forward_and_backward_compute() {
    let dir = std::env::temp_dir().join(format!("u3m-replay-test-{}-adam13b", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |steps: u32| -> (f64, f64, f64) {
        let t = dir.join(format!("adam-s{steps}.trace"));
        let t = t.to_str().unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_u3m"))
            .args([
                "synth",
                "--model",
                "llama2-13b",
                "--layers",
                "8",
                "--seq",
                "1024",
            ])
            .args([
                "--batch",
                "2",
                "--workload",
                "adam",
                "--steps",
                &steps.to_string(),
                "-o",
                t,
            ])
            .output()
            .expect("run u3m synth");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r = replay(&[t, "--hbm", "31330M", "--policy", "predictive"]);
        let p = policy(&r, "predictive");
        let f = |v: &Value| v.as_f64().unwrap();
        (
            f(&p["total_ns"]),
            f(&p["runtime"]["link_h2d_busy_ns"]),
            f(&r["baseline_ns"]),
        )
    };
    let (a, b) = (run(1), run(3));
    let _ = std::fs::remove_dir_all(&dir);
    let step = (b.0 - a.0) / 2.0;
    let h2d = (b.1 - a.1) / 2.0;
    let unconstrained = (b.2 - a.2) / 2.0;
    // the copy-ins alone take 646 ms of link time per step (15.05 GiB, once
    // outputs written whole skip their copy-in; 687 ms at 16.00 GiB
    // before): well under that the trace or the replay changed
    assert!(unconstrained > 250e6 && h2d > 600e6, "{a:?} {b:?}");
    assert!(
        step - h2d <= 0.8 * unconstrained,
        "per step {:.1} ms, copy-ins {:.1} ms: the copy-in link idles {:.1} ms > 0.8 x the unconstrained {:.1} ms",
        step / 1e6,
        h2d / 1e6,
        (step - h2d) / 1e6,
        unconstrained / 1e6
    );
}

/// A `u3m synth` trace made with `args` into a file of its own (`name`):
/// its path, for the caller to remove.
fn synth_trace(name: &str, args: &[&str]) -> String {
    let trace = std::env::temp_dir().join(format!(
        "u3m-replay-test-{}-{}.trace",
        std::process::id(),
        name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
    ));
    let t = trace.to_str().unwrap().to_string();
    let o = Command::new(env!("CARGO_BIN_EXE_u3m"))
        .arg("synth")
        .args(args)
        .args(["-o", &t])
        .output()
        .expect("run u3m synth");
    assert!(
        o.status.success(),
        "u3m synth: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    t
}

/// `u3m replay` arguments: `trace` at `hbm` under predictive, issued as
/// acl_replay issues it, with no host time per call.
fn predictive_acl_replay<'a>(trace: &'a str, hbm: &'a str) -> [&'a str; 9] {
    [
        trace,
        "--hbm",
        hbm,
        "--policy",
        "predictive",
        "--issue",
        "acl-replay",
        "--call-us",
        "0",
    ]
}

/// A two-step `u3m synth` LoRA trace small enough for a test (into a file of
/// its own, named by `name`; the caller removes it) and its footprint.
fn small_lora(name: &str) -> (String, u64) {
    let t = synth_trace(
        name,
        &[
            "--model",
            "llama2-7b",
            "--workload",
            "lora",
            "--scale",
            "4",
            "--steps",
            "2",
        ],
    );
    let foot = replay(&[&t, "--hbm", "1T", "--policy", "lru"])["footprint_bytes"]
        .as_u64()
        .unwrap();
    (t, foot)
}

/// Predictive's bytes ÷ Belady's on a `u3m synth` trace made with `args`
/// (into a file of its own), replayed at 2/3 of its footprint.
fn synth_vs_belady(name: &str, args: &[&str], min_foot: u64) -> Option<f64> {
    let t = synth_trace(name, args);
    let ratio = trace_vs_belady(name, &t, &[], min_foot);
    let _ = std::fs::remove_file(&t);
    ratio
}

/// LoRA with recomputation and flash attention (policies.sh's
/// lora_recompute_flash): 1.157 x Belady's bytes when demand eviction took
/// any idle victim among the 64 nearest behind a busy front (the victim
/// depended on how far the replayed host ran ahead of the device: 1.117
/// while reclaim still waited), 1.139 when a dirty one past the 36th behind
/// a clean busy front is kept unless needed no sooner than the front
/// (evict.rs `DIRTY_NEAR`); 1.163 once operators' whole writes skip their
/// copy-in (Belady gains more from them), 1.137 with `DIRTY_NEAR` 16.
#[test]
fn predictive_moves_at_most_1_15_x_belady_on_lora_with_recompute_and_flash() {
    let args = [
        "--model",
        "llama2-7b",
        "--workload",
        "lora",
        "--recompute",
        "--flash",
        "--scale",
        "4",
        "--steps",
        "6",
    ];
    let Some(ratio) = synth_vs_belady("lora --recompute --flash", &args, 768 << 20) else {
        return;
    };
    assert!(
        ratio <= 1.15,
        "predictive moves {ratio:.3} x Belady's bytes"
    );
}

/// `--floor` on a report: the floor object of its single trace.
fn floor_of(t: &Value) -> &Value {
    t.get("floor")
        .unwrap_or_else(|| panic!("--floor --json prints a floor: {t:#}"))
}

/// The window floor (docs/replay.md) is a lower bound: no policy's replay
/// of the same trace on the same HBM beats it, and with HBM for the whole
/// footprint it is the calls' own time (nothing need cross the link).
fn check_floor_bounds(path: &str, hbm: u64, footprint: u64) {
    let h = hbm.to_string();
    let t = replay(&[path, "--hbm", &h, "--floor"]);
    let f = floor_of(&t);
    let (ns, compute) = (f["ns"].as_u64().unwrap(), f["compute_ns"].as_u64().unwrap());
    assert!(compute <= ns, "{path} at {h}: {f:#}");
    assert!(compute <= t["baseline_ns"].as_u64().unwrap());
    for p in t["policies"].as_array().unwrap() {
        let total = p["total_ns"].as_u64().unwrap();
        assert!(
            ns <= total,
            "{path} at {h} bytes: the window floor {ns} ns exceeds {}'s replay {total} ns",
            p["policy"]
        );
    }
    // the windows partition the trace and add up to the floor
    let w = f["windows"].as_array().unwrap();
    let sum: u64 = w
        .iter()
        .map(|w| {
            w["compute_ns"]
                .as_u64()
                .unwrap()
                .max(w["link_ns"].as_u64().unwrap())
        })
        .sum();
    assert_eq!(sum, ns);
    assert_eq!(w[0]["start"], 0);
    assert_eq!(w[w.len() - 1]["end"], t["events"]);
    if hbm >= footprint {
        assert_eq!(
            ns, compute,
            "{path}: HBM for the whole footprint, yet a link term: {f:#}"
        );
    }
}

#[test]
fn the_window_floor_is_never_beaten_by_a_replay() {
    for (name, hbms) in [
        ("scan", &[4u64 << 20, 16 << 20, 64 << 20][..]),
        ("oversize_op", &[4 << 20, 16 << 20, 64 << 20]),
        ("loop", &[4 << 20, 16 << 20]),
        ("hotcold", &[8 << 20, 64 << 20]),
    ] {
        let foot = replay(&[&trace(name), "--hbm", "1G", "--policy", "lru"])["footprint_bytes"]
            .as_u64()
            .unwrap();
        for &h in hbms {
            check_floor_bounds(&trace(name), h, foot);
        }
    }
    // a small AdamW run of `u3m synth`: the floor of each step is reported
    let path = std::env::temp_dir().join(format!("u3m-floor-test-{}.trace", std::process::id()));
    let p = path.to_str().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_u3m"))
        .args([
            "synth",
            "--model",
            "llama2-7b",
            "--workload",
            "adam",
            "--scale",
            "8",
        ])
        .args(["--layers", "2", "--steps", "3", "--seq", "256", "-o", p])
        .output()
        .expect("run u3m synth");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let foot = replay(&[p, "--hbm", "1G", "--policy", "lru"])["footprint_bytes"]
        .as_u64()
        .unwrap();
    for k in [3, 5, 7, 12] {
        check_floor_bounds(p, foot * k / 10, foot);
    }
    let t = replay(&[
        p,
        "--hbm",
        &(foot * 3 / 10).to_string(),
        "--floor",
        "--floor-steps",
        "1-2,0",
    ]);
    let f = floor_of(&t);
    assert!(
        f["ns"].as_u64().unwrap() > f["compute_ns"].as_u64().unwrap(),
        "{f:#}"
    );
    let steps = f["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(
        (&steps[0]["step"], &steps[0]["last_step"]),
        (&1.into(), &2.into())
    );
    assert_eq!(steps[1]["step"], 0);
    // a span's floor is at most the whole trace's
    for s in steps {
        assert!(s["ns"].as_u64().unwrap() <= f["ns"].as_u64().unwrap());
        assert!(s["start"].as_u64().unwrap() < s["end"].as_u64().unwrap());
    }
    // the text report says it after the table; without --floor, neither does
    let h = (foot * 3 / 10).to_string();
    let text =
        String::from_utf8(u3m(&[p, "--hbm", &h, "--policy", "lru", "--floor"]).stdout).unwrap();
    assert!(
        text.contains("  window floor: ") && text.contains("window floor of step 2 "),
        "{text}"
    );
    let plain = replay(&[p, "--hbm", &h, "--policy", "lru"]);
    assert!(plain.get("floor").is_none());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn host_waits_say_what_the_host_waited_for() {
    let waits = |hbm: &str| {
        let t = replay(&[&trace("loop"), "--hbm", hbm, "--policy", "lru"]);
        let p = policy(&t, "lru").clone();
        let w = p["runtime"]["host_waits"].clone();
        let n = |k: &str, f: &str| w[k][f].as_u64().unwrap_or_else(|| panic!("{k}.{f}: {w:#}"));
        let all: u64 = ["queue", "program", "copy_in", "copy_out"]
            .iter()
            .map(|k| n(k, "ns"))
            .sum();
        assert!(
            all <= p["total_ns"].as_u64().unwrap(),
            "waits {all} ns > the run: {p:#}"
        );
        (
            n("copy_in", "count"),
            n("copy_out", "count"),
            n("copy_in", "ns"),
        )
    };
    // 6 buffers over 4 chunks of HBM: LRU fetches on every access after the
    // first round, and the first eviction of each never-copied buffer is a
    // copy-out; the host waits for both
    let (ins, outs, in_ns) = waits("8M");
    assert!(
        ins > 0 && outs > 0 && in_ns > 0,
        "in {ins} ({in_ns} ns), out {outs}"
    );
    // everything fits: nothing moves, nothing is waited for on u3m's streams
    assert_eq!(waits("64M"), (0, 0, 0));
}

/// `--wait-log MS` lists the host's waits of at least MS simulated ms. At
/// 0 it lists every wait: per kind the list's count and time are
/// `host_waits`', each wait names a trace line that holds an event, and
/// they come in time order. Above every wait it lists none, and listing
/// changes nothing the replay does (the same total time).
#[test]
fn the_wait_log_lists_the_waits_the_counters_count() {
    let (t, foot) = &small_lora("waitlog");
    let hbm = (foot * 2 / 3 / MIB2 * MIB2).to_string();
    let args = predictive_acl_replay(t, &hbm);
    let all = replay(&[&args[..], &["--wait-log", "0"]].concat());
    let none = replay(&[&args[..], &["--wait-log", "1e9"]].concat());
    let text = std::fs::read_to_string(t).unwrap();
    let _ = std::fs::remove_file(t);
    let lines: Vec<&str> = text.lines().collect();
    let p = policy(&all, "predictive");
    let waits = p["long_waits"].as_array().unwrap();
    assert!(waits.len() > 10, "{} waits listed", waits.len());
    let mut at = 0;
    for w in waits {
        let line = w["line"].as_u64().unwrap() as usize;
        let l = lines.get(line.wrapping_sub(1)).copied().unwrap_or("#");
        assert!(!l.is_empty() && !l.starts_with('#'), "line {line}: {l:?}");
        let a = w["at_ns"].as_u64().unwrap();
        assert!(a >= at, "{w} before {at}");
        at = a;
    }
    for kind in ["queue", "program", "copy_in", "copy_out"] {
        let of: Vec<&Value> = waits.iter().filter(|w| w["for"] == kind).collect();
        let ns: u64 = of.iter().map(|w| w["ns"].as_u64().unwrap()).sum();
        let c = &p["runtime"]["host_waits"][kind];
        assert_eq!(of.len() as u64, c["count"].as_u64().unwrap(), "{kind}");
        assert_eq!(ns, c["ns"].as_u64().unwrap(), "{kind}");
    }
    let q = policy(&none, "predictive");
    assert_eq!(q["long_waits"].as_array().unwrap().len(), 0);
    assert_eq!(q["total_ns"], p["total_ns"]);
    assert_eq!(q["runtime"]["host_waits"], p["runtime"]["host_waits"]);
}

/// The small LoRA trace at 2/3 of its footprint replayed by predictive with
/// `flag` and without it: (with, without, HBM bytes, the trace's `# train
/// step` comments as (line, text after "# train step ")).
fn small_lora_with(name: &str, flag: &str) -> (Value, Value, u64, Vec<(u64, String)>) {
    let (t, foot) = &small_lora(name);
    let hbm = foot * 2 / 3 / MIB2 * MIB2;
    let hs = hbm.to_string();
    let args = predictive_acl_replay(t, &hs);
    let with = replay(&[&args[..], &[flag]].concat());
    let without = replay(&args);
    let text = std::fs::read_to_string(t).unwrap();
    let _ = std::fs::remove_file(t);
    let marks = text
        .lines()
        .enumerate()
        .filter_map(|(n, l)| Some((n as u64 + 1, l.strip_prefix("# train step ")?.to_string())))
        .collect();
    (with, without, hbm, marks)
}

/// `--audit` lists, per phase between `# train step` comments and per
/// allocation tag, what u3m moved, and of its evictions what came back in:
/// its sums are the run's counters (every eviction, copy-out and copy-in is
/// in it once), every copy-in undoes an eviction listed before it, and the
/// list changes nothing about the run.
#[test]
fn audit_lists_each_phases_moves_and_the_evictions_undone() {
    let (with, without, _, marks) = small_lora_with("audit", "--audit");
    let p = policy(&with, "predictive");
    let audit = p["audit"].as_array().unwrap();
    assert_eq!(audit.len(), marks.len() + 1, "start, then one per comment");
    assert_eq!(audit[0]["label"].as_str(), Some("start"));
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap();
    let mut sum = std::collections::BTreeMap::<&str, u64>::new();
    let mut to = 0;
    for (k, a) in audit.iter().enumerate() {
        if k > 0 {
            let (line, label) = &marks[k - 1];
            assert_eq!(a["line"].as_u64(), Some(*line));
            assert_eq!(a["label"].as_str(), Some(&*format!("train step {label}")));
        }
        assert_eq!(n(a, "from_tick"), to, "phases follow each other");
        to = n(a, "to_tick");
        assert!(to >= n(a, "from_tick"));
        for m in a["by_tag"].as_object().unwrap().values() {
            assert!(
                n(m, "out_dirty") <= n(m, "out") && n(m, "back") <= n(m, "out"),
                "{a}"
            );
            assert!(
                n(m, "back_in_phase_foreseen") + n(m, "back_in_phase_taken_for_dead")
                    <= n(m, "back_in_phase")
                    && n(m, "back_in_phase") <= n(m, "back"),
                "{a}"
            );
            for key in [
                "in_demand",
                "in_prefetch",
                "out",
                "out_dirty",
                "back",
                "back_in_phase",
            ] {
                *sum.entry(key).or_default() += n(m, key);
            }
        }
    }
    let chunk = 2u64 << 20;
    assert_eq!(sum["out"], n(p, "evictions") * chunk);
    assert_eq!(sum["out"] - sum["out_dirty"], n(p, "clean_drops") * chunk);
    assert_eq!(sum["out_dirty"], n(&p["writeback_bytes"], "total"));
    assert_eq!(sum["in_demand"], n(&p["fault_in_bytes"], "total"));
    assert_eq!(sum["in_prefetch"], n(p, "prefetch_bytes"));
    // a chunk comes back only from where an eviction put it
    assert!(sum["in_demand"] > 0, "HBM at 2/3 of the footprint: {p}");
    assert_eq!(sum["back"], sum["in_demand"] + sum["in_prefetch"]);
    assert!(sum["back_in_phase"] < sum["back"]);
    let q = policy(&without, "predictive");
    assert_eq!(q["audit"].as_array().unwrap().len(), 0);
    assert_eq!(q["total_ns"], p["total_ns"]);
    assert_eq!(q["runtime"]["host_waits"], p["runtime"]["host_waits"]);
    assert_eq!(q["moved_bytes"], p["moved_bytes"]);
}

/// `--held` lists what u3m holds in HBM at each `# train step` comment, by
/// tag, split by the trace's future: a LoRA step's frozen weights are live
/// at every phase, its activations mostly dead as the forward begins (it
/// writes them whole before reading them) and live as the backward begins; the
/// list changes nothing about the run.
#[test]
fn held_lists_what_hbm_holds_as_each_phase_begins() {
    let (with, without, hbm, marks) = small_lora_with("held", "--held");
    let p = policy(&with, "predictive");
    let held = p["held"].as_array().unwrap();
    assert_eq!(held.len(), marks.len(), "{held:?}");
    let gib = |v: &Value| v.as_u64().unwrap() as f64 / (1u64 << 30) as f64;
    for (h, (line, label)) in held.iter().zip(&marks) {
        assert_eq!(h["line"].as_u64(), Some(*line));
        assert_eq!(h["label"].as_str(), Some(&*format!("train step {label}")));
        let tags = h["by_tag"].as_object().unwrap();
        let n = |b: &Value, k: &str| b[k].as_u64().unwrap();
        let sum: u64 = tags
            .values()
            .map(|b| {
                let (live, dead) = (
                    n(b, "live_clean") + n(b, "live_dirty"),
                    n(b, "dead_clean") + n(b, "dead_dirty"),
                );
                assert!(
                    n(b, "dead_foreseen") <= dead && n(b, "live_taken_for_dead") <= live,
                    "{h}"
                );
                live + dead
            })
            .sum();
        assert_eq!(sum, h["resident_bytes"].as_u64().unwrap(), "{h}");
        assert!(sum <= hbm, "{h}");
        if label.starts_with("0: forward") {
            continue; // nothing allocated by u3m's count yet, or just so
        }
        assert!(sum >= hbm / 2, "HBM is full by then: {h}");
        if label.ends_with(": optimizer") {
            continue; // (in the last step nothing is read after it: all dead)
        }
        let w = &tags["weight"];
        assert!(gib(&w["live_clean"]) + gib(&w["live_dirty"]) > 0.1, "{h}");
        assert_eq!(w["dead_clean"].as_u64(), Some(0), "frozen weights: {h}");
        assert_eq!(w["dead_dirty"].as_u64(), Some(0), "frozen weights: {h}");
        let a = &tags["act"];
        let live = a["live_clean"].as_u64().unwrap() + a["live_dirty"].as_u64().unwrap();
        let dead = a["dead_clean"].as_u64().unwrap() + a["dead_dirty"].as_u64().unwrap();
        if label.ends_with(": forward") {
            // (live: chunks the forward writes only in part, their other
            // tensors' bytes still needed)
            assert!(dead > 9 * live, "activations as the forward begins: {h}");
        } else if label.ends_with(": backward") {
            assert!(live > 0, "activations as the backward begins: {h}");
        }
    }
    let q = policy(&without, "predictive");
    assert_eq!(q["held"].as_array().unwrap().len(), 0);
    assert_eq!(q["total_ns"], p["total_ns"]);
    assert_eq!(q["runtime"]["host_waits"], p["runtime"]["host_waits"]);
}
