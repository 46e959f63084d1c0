//! Read-once streams mapped from host instead of copied (issue 11 bullet 2,
//! U3M_HOST_MAP=stream; docs/tiering.md). Under libu3m.so on the simulator:
//! serving over weights 2 × HBM (every decode step reads every weight once)
//! has chunks host-mapped instead of copied in, with the unconstrained
//! checksum, no MMU fault and fewer bytes copied in; a full-parameter
//! training loop (weights written every step) never triggers the rule;
//! kv_decode and 8 threads under eviction keep every byte; with
//! U3M_HOST_MAP=probe the device's timing decides, and the switches between
//! mapping and copies keep every byte too.

mod common;
use common::{run, Run};

const MIB: u64 = 1 << 20;

fn assert_clean(r: &Run, hbm: u64, what: &str) {
    assert_eq!(r.code, 0, "{what}: exit\n{}", r.stderr);
    assert_eq!(r.stat_u64(&["mmu_faults"]), 0, "{what}: {}", r.stderr);
    for d in r.stats["devices"].as_array().unwrap() {
        assert!(
            d["peak_bytes"].as_u64().unwrap() <= hbm,
            "{what}: physical peak above HBM"
        );
    }
}

/// `prog` under libu3m.so in tier mode on `hbm` of HBM; the exit summary
/// line on stderr (U3M_LOG=info).
fn tier(args: &[&str], hbm: &str, host_map: &str, prog: &str) -> (Run, serde_json::Value) {
    common::tier(
        prog,
        args,
        &[
            ("ACLSIM_HBM_BYTES", hbm),
            ("U3M_OVERSUB", "8"),
            ("U3M_HOST_MAP", host_map),
            ("U3M_LOG", "info"),
        ],
    )
}

/// `u3m synth --model llama2-7b --workload rag --scale 8 --layers 8
/// --requests 2 --context 64 --decode-tokens 8`: 62 MiB, 60 MiB of it
/// weights, replayed by acl_replay with data on 32 MiB of HBM.
#[test]
fn serving_over_weights_2x_hbm_maps_the_weight_stream_instead_of_copying() {
    let t = format!(
        "{}/tests/oversize_data/rag_small.trace",
        env!("CARGO_MANIFEST_DIR")
    );
    let reference = run("acl_replay", &[&t], &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    let want = reference.fact("checksum");
    assert!(want.is_some(), "{}", reference.stdout);
    let (copies, sc) = tier(&[&t], "32M", "auto", "acl_replay");
    assert_clean(&copies, 32 * MIB, "auto");
    assert_eq!(copies.fact("checksum"), want);
    let (mapped, sm) = tier(&[&t], "32M", "stream", "acl_replay");
    assert_clean(&mapped, 32 * MIB, "stream");
    assert_eq!(mapped.fact("checksum"), want, "{}", mapped.stderr);
    let (c, m) = (&sc["tier"], &sm["tier"]);
    // the copies-only arm never maps; the stream arm maps weight chunks
    // and reads them in place on later passes
    assert_eq!(c["stream_maps"].as_u64(), Some(0), "{sc}");
    assert_eq!(c["host_maps"].as_u64(), Some(0), "{sc}");
    assert!(m["stream_maps"].as_u64().unwrap() > 0, "{sm}");
    assert!(m["stream_reads"].as_u64().unwrap() > 0, "{sm}");
    assert!(m["host_maps"].as_u64() >= m["stream_maps"].as_u64());
    assert!(mapped.stat_u64(&["host_mapped", "read_bytes", "op"]) > 0);
    assert_eq!(mapped.stat_u64(&["host_mapped", "write_bytes", "op"]), 0);
    // what it saves: copies into HBM (the bytes the device now reads over
    // the link instead)
    let (cf, mf) = (
        c["fault_bytes"].as_u64().unwrap(),
        m["fault_bytes"].as_u64().unwrap(),
    );
    assert!(mf < cf, "fault_bytes: stream {mf} vs copies {cf}");
    assert!(
        mapped
            .stderr
            .contains("read-once streams mapped instead of copied"),
        "{}",
        mapped.stderr
    );
}

/// Full-parameter training at 1.4 × HBM: every weight is written by the
/// optimizer each step and read twice in between (forward, backward), so
/// nothing is a read-once stream — same results, nothing mapped.
#[test]
fn a_training_loop_never_triggers_the_stream_rule() {
    let args = ["--footprint", "180M", "--steps", "3"];
    let big = run("mlp_train", &args, &[("ACLSIM_HBM_BYTES", "2G")]).must_succeed();
    let (r, s) = tier(&args, "128M", "stream", "mlp_train");
    assert_clean(&r, 128 * MIB, "mlp_train");
    assert_eq!(r.fact("checksum"), big.fact("checksum"));
    assert_eq!(r.fact("final_loss"), big.fact("final_loss"));
    let t = &s["tier"];
    assert!(t["evictions"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(t["stream_maps"].as_u64(), Some(0), "{s}");
    assert_eq!(t["stream_reads"].as_u64(), Some(0), "{s}");
    assert_eq!(t["host_maps"].as_u64(), Some(0), "{s}");
}

/// The synthesized AdamW trace (per-tensor optimizer) on 40 MiB of HBM
/// (every operator fits): the stream rule stays off.
#[test]
fn a_synthesized_adam_trace_never_triggers_the_stream_rule() {
    let t = format!(
        "{}/tests/oversize_data/adam_small.trace",
        env!("CARGO_MANIFEST_DIR")
    );
    let reference = run("acl_replay", &[&t], &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    let (r, s) = tier(&[&t], "40M", "stream", "acl_replay");
    assert_clean(&r, 40 * MIB, "adam");
    assert_eq!(r.fact("checksum"), reference.fact("checksum"));
    let t = &s["tier"];
    assert!(t["evictions"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(t["stream_maps"].as_u64(), Some(0), "{s}");
    assert_eq!(t["host_maps"].as_u64(), Some(0), "{s}");
}

fn results(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| !l.starts_with("sim_") && !l.contains("tokens_per_s"))
        .map(|l| l.split(" sim_ns=").next().unwrap())
        .collect()
}

/// kv_decode with real data, 5 requests on 128 MiB (2.1 × the KV that
/// fits), 24 decode steps: the weights and the KV of past tokens are read
/// every step and written never (past tokens) — mapped; every request's
/// checksum equals the unconstrained run's.
#[test]
fn kv_decode_maps_what_every_step_only_reads_with_the_same_results() {
    let args = ["--requests", "5", "--max-context", "2048", "--decode", "24"];
    let big = run("kv_decode", &args, &[("ACLSIM_HBM_BYTES", "2G")]).must_succeed();
    let (r, s) = tier(&args, "128M", "stream", "kv_decode");
    assert_clean(&r, 128 * MIB, "kv_decode");
    assert_eq!(r.fact("requests_served").as_deref(), Some("5"));
    assert_eq!(
        results(&r.stdout),
        results(&big.stdout),
        "per-request checksums"
    );
    let t = &s["tier"];
    assert!(t["stream_maps"].as_u64().unwrap() > 0, "{s}");
    assert!(t["stream_reads"].as_u64().unwrap() > 0, "{s}");
}

/// 8 threads under constant eviction with the stream rule on (it fires on
/// buffers the threads re-read): no byte corrupted, no MMU fault.
#[test]
fn mt_stress_with_the_stream_rule_loses_nothing() {
    let (r, s) = tier(
        &["--iters", "120", "--max-bytes", "8M"],
        "48M",
        "stream",
        "mt_stress",
    );
    assert_clean(&r, 48 * MIB, "mt_stress");
    assert_eq!(
        r.fact("corrupted_bytes").as_deref(),
        Some("0"),
        "{}",
        r.stdout
    );
    assert!(r.fact("verified_bytes").unwrap().parse::<u64>().unwrap() > 0);
    assert!(s["tier"]["evictions"].as_u64().unwrap() > 0, "{s}");
}

/// U3M_HOST_MAP=probe with real data: serving over weights 2 × HBM long
/// enough for the read-once probe to time a window of mapping against one
/// of copies twice (21,368 calls; `u3m synth --model llama2-7b --workload
/// rag --scale 8 --layers 8 --requests 2 --context 64 --decode-tokens 160`,
/// 62 MiB on 32 MiB). The device (the simulator's event clock) times
/// mapping faster, the probe adopts it; chunks move between host-mapped
/// and HBM at every switch — and the checksum is the unconstrained one.
#[test]
fn the_read_once_probe_adopts_mapping_where_the_device_times_it_faster() {
    let dir = common::scratch("probe");
    let t = dir.join("rag160.trace");
    let t = t.to_str().unwrap();
    let o = std::process::Command::new(common::target_dir().join("u3m"))
        .args([
            "synth",
            "--model",
            "llama2-7b",
            "--workload",
            "rag",
            "--scale",
            "8",
            "--layers",
            "8",
            "--requests",
            "2",
            "--context",
            "64",
            "--decode-tokens",
            "160",
            "-o",
            t,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reference = run("acl_replay", &[t], &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    let want = reference.fact("checksum");
    assert!(want.is_some(), "{}", reference.stdout);
    let (copies, sc) = tier(&[t], "32M", "auto", "acl_replay");
    assert_clean(&copies, 32 * MIB, "auto");
    assert_eq!(copies.fact("checksum"), want);
    let (probed, sp) = tier(&[t], "32M", "probe", "acl_replay");
    assert_clean(&probed, 32 * MIB, "probe");
    assert_eq!(probed.fact("checksum"), want, "{}", probed.stderr);
    let p = &sp["tier"];
    assert_eq!(sc["tier"]["stream_maps"].as_u64(), Some(0), "{sc}");
    assert!(p["probe_verdicts"].as_u64().unwrap() >= 2, "{sp}");
    assert!(p["probe_maps"].as_u64().unwrap() >= 2, "{sp}");
    assert!(p["stream_maps"].as_u64().unwrap() > 0, "{sp}");
    // the probe's windows of copies brought mapped chunks back
    assert!(p["host_unmaps"].as_u64().unwrap() > 0, "{sp}");
    let sim = |r: &Run| r.stat_u64(&["sim_ns"]);
    assert!(
        sim(&probed) < sim(&copies),
        "simulated time: probe {} ns vs copies {} ns",
        sim(&probed),
        sim(&copies)
    );
    assert!(
        probed
            .stderr
            .contains("read-once probe: mapping timed faster in"),
        "{}",
        probed.stderr
    );
}
