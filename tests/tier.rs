//! Tier mode on the simulator: programs whose footprint is larger than HBM
//! run to completion under libu3m.so with results identical to a run on a
//! device with enough memory, while the stock run fails with 207001; the
//! simulator sees no MMU fault and never more physical memory than HBM.

mod common;
use common::{run, Run};
use std::path::{Path, PathBuf};

use common::tier;

/// Output lines that are results (simulated timings legitimately differ).
fn results(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| {
            !l.starts_with("sim_")
                && !l.contains("tokens_per_s")
                && !l.contains("sim_ms")
                && !l.starts_with("reserved=")
        })
        .map(|l| l.split(" sim_ns=").next().unwrap())
        .collect()
}

fn assert_clean(r: &Run, hbm: u64, what: &str) {
    assert_eq!(r.code, 0, "{what}: exit\n{}", r.stderr);
    assert_eq!(
        r.stat_u64(&["mmu_faults"]),
        0,
        "{what}: device MMU faults\n{}",
        r.stderr
    );
    for d in r.stats["devices"].as_array().unwrap() {
        assert!(
            d["peak_bytes"].as_u64().unwrap() <= hbm,
            "{what}: physical peak above HBM"
        );
    }
}

fn stock_fails(prog: &str, args: &[&str], env: &[(&str, &str)]) {
    let r = run(prog, args, env);
    assert_eq!(r.code, 2, "stock {prog} should fail:\n{}", r.stdout);
    assert!(r.stderr.contains("207001"), "stock {prog}: {}", r.stderr);
}

const MIB: u64 = 1 << 20;

#[test]
fn mlp_train_at_1_5x_hbm_matches_an_unconstrained_run() {
    let args = ["--footprint", "180M", "--steps", "3"];
    let big = run("mlp_train", &args, &[("ACLSIM_HBM_BYTES", "2G")]).must_succeed();
    stock_fails("mlp_train", &args, &[("ACLSIM_HBM_BYTES", "128M")]);
    let (r, s) = tier("mlp_train", &args, &[("ACLSIM_HBM_BYTES", "128M")]);
    assert_clean(&r, 128 * MIB, "mlp_train");
    assert_eq!(results(&r.stdout), results(&big.stdout));
    assert!(r.fact("checksum").is_some());
    assert!(s["tier"]["evictions"].as_u64().unwrap() > 0, "{s}");
    assert!(s["tier"]["faults_in"].as_u64().unwrap() > 0);
    // the other eviction orders move different chunks, with the same result
    for policy in ["lru", "predictive"] {
        let (r, s) = tier(
            "mlp_train",
            &args,
            &[("ACLSIM_HBM_BYTES", "128M"), ("U3M_POLICY", policy)],
        );
        assert_clean(&r, 128 * MIB, policy);
        assert_eq!(results(&r.stdout), results(&big.stdout), "{policy}");
        assert!(
            s["tier"]["evictions"].as_u64().unwrap() > 0,
            "{policy}: {s}"
        );
    }
}

#[test]
fn kv_decode_serves_2_1x_the_kv_that_fits() {
    // 128 MiB of HBM holds the weights and 2 requests' KV (4 MiB buffers);
    // 2.1 x that is 5 requests
    let fit = run(
        "kv_decode",
        &["--requests", "2", "--max-context", "2048", "--decode", "6"],
        &[("ACLSIM_HBM_BYTES", "128M")],
    );
    assert_eq!(fit.code, 0, "{}", fit.stderr);
    stock_fails(
        "kv_decode",
        &["--requests", "3", "--max-context", "2048", "--decode", "6"],
        &[("ACLSIM_HBM_BYTES", "128M")],
    );
    let args = ["--requests", "5", "--max-context", "2048", "--decode", "6"];
    let big = run("kv_decode", &args, &[("ACLSIM_HBM_BYTES", "2G")]).must_succeed();
    let (r, _) = tier("kv_decode", &args, &[("ACLSIM_HBM_BYTES", "128M")]);
    assert_clean(&r, 128 * MIB, "kv_decode");
    assert_eq!(r.fact("requests_served").as_deref(), Some("5"));
    assert_eq!(
        results(&r.stdout),
        results(&big.stdout),
        "per-request checksums"
    );
}

/// A trace whose live set is `n` allocations of `mib` MiB, touched in turn.
fn ring_trace(dir: &Path, n: u64, mib: u64) -> PathBuf {
    let mut t = String::from("# u3m-trace 1\n");
    let sz = mib << 20;
    let a = |i: u64| 0x1000_0000u64 + i * sz;
    for i in 0..n {
        t += &format!(
            "A {:#x} {sz}\nM H2D {:#x} 0x7f0000000000 {sz}\n",
            a(i),
            a(i)
        );
    }
    for _ in 0..3 {
        for i in 0..n {
            t += &format!(
                "O Mix 2 1 {:#x}:{sz} {:#x}:65536 {:#x}:{} flops=1000000\n",
                a(i),
                a((i + 5) % n) + 4096,
                a((i + 1) % n),
                1 << 20
            );
        }
    }
    for i in 0..n {
        t += &format!("F {:#x}\n", a(i));
    }
    let p = dir.join(format!("ring-{n}x{mib}.trace"));
    std::fs::write(&p, t).unwrap();
    p
}

#[test]
fn replay_at_2x_hbm_with_dram_capped_uses_nvme_and_matches() {
    let dir = common::scratch("tier-replay");
    let trace = ring_trace(&dir, 16, 8); // 128 MiB live on a 64 MiB device
    let swap = dir.join("swap");
    std::fs::create_dir_all(&swap).unwrap();
    let t = trace.to_str().unwrap();
    let big = run("acl_replay", &[t], &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    stock_fails("acl_replay", &[t], &[("ACLSIM_HBM_BYTES", "64M")]);
    let (r, s) = tier(
        "acl_replay",
        &[t],
        &[
            ("ACLSIM_HBM_BYTES", "64M"),
            ("U3M_OVERSUB", "3"),
            ("U3M_DRAM_BYTES", "32M"),
            ("U3M_SWAP_DIR", swap.to_str().unwrap()),
            ("U3M_SWAP_BYTES", "256M"),
        ],
    );
    assert_clean(&r, 64 * MIB, "acl_replay");
    assert_eq!(r.fact("checksum"), big.fact("checksum"));
    assert!(
        s["tier"]["to_nvme"].as_u64().unwrap() > 0,
        "NVMe not used: {s}"
    );
    assert!(s["tier"]["from_nvme"].as_u64().unwrap() > 0, "{s}");
    assert!(
        s["tier"]["clean_drops"].as_u64().unwrap() > 0,
        "clean chunks should be dropped without a copy: {s}"
    );
    // the swap file was private and unlinked; its directory is gone at exit
    assert_eq!(
        std::fs::read_dir(&swap).unwrap().count(),
        0,
        "swap dir left behind"
    );
}

#[test]
fn expandable_segments_and_two_device_allreduce_match() {
    let big = run("vmm_app", &[], &[("ACLSIM_HBM_BYTES", "2G")]).must_succeed();
    stock_fails("vmm_app", &[], &[("ACLSIM_HBM_BYTES", "32M")]);
    let (r, s) = tier(
        "vmm_app",
        &[],
        &[("ACLSIM_HBM_BYTES", "32M"), ("U3M_OVERSUB", "3")],
    );
    assert_clean(&r, 32 * MIB, "vmm_app");
    assert_eq!(r.fact("checksum"), big.fact("checksum"));
    assert!(s["tier"]["evictions"].as_u64().unwrap() > 0, "{s}");

    let args = ["--steps", "3", "--dim", "1024"];
    let big = run(
        "allreduce_app",
        &args,
        &[("ACLSIM_DEVICES", "2"), ("ACLSIM_HBM_BYTES", "2G")],
    )
    .must_succeed();
    stock_fails(
        "allreduce_app",
        &args,
        &[("ACLSIM_DEVICES", "2"), ("ACLSIM_HBM_BYTES", "26M")],
    );
    let (r, _) = tier(
        "allreduce_app",
        &args,
        &[
            ("ACLSIM_DEVICES", "2"),
            ("ACLSIM_HBM_BYTES", "26M"),
            ("U3M_OVERSUB", "3"),
        ],
    );
    assert_clean(&r, 26 * MIB, "allreduce_app");
    assert_eq!(results(&r.stdout), results(&big.stdout));
    assert_eq!(r.fact("replicas_identical").as_deref(), Some("1"));
}

#[test]
fn mt_stress_under_constant_eviction_pressure_loses_nothing() {
    mt_stress_loses_nothing(&[]);
}

/// mt_stress (8 threads) on 48 MiB of HBM with `env`: every byte verified,
/// evictions all along. Returns the summary.
fn mt_stress_loses_nothing(env: &[(&str, &str)]) -> serde_json::Value {
    let mut e = vec![("ACLSIM_HBM_BYTES", "48M"), ("U3M_OVERSUB", "4")];
    e.extend_from_slice(env);
    let (r, s) = tier("mt_stress", &["--iters", "120", "--max-bytes", "8M"], &e);
    assert_clean(&r, 48 * MIB, "mt_stress");
    assert_eq!(
        r.fact("corrupted_bytes").as_deref(),
        Some("0"),
        "{}",
        r.stdout
    );
    assert!(r.fact("verified_bytes").unwrap().parse::<u64>().unwrap() > 0);
    assert!(
        s["tier"]["evictions"].as_u64().unwrap() > 0,
        "no pressure: {s}"
    );
    s
}

/// U3M_HANDOFF=on in the library: copy-ins take the HBM of copy-outs still
/// in flight, ordered after them on the device (core residency/migrate.rs
/// `take_outgoing`). Training and eight threads under constant eviction
/// keep every byte, and the hand-off did run.
#[test]
fn the_handoff_keeps_every_byte_in_training_and_under_threads() {
    let args = ["--footprint", "180M", "--steps", "3"];
    let big = run("mlp_train", &args, &[("ACLSIM_HBM_BYTES", "2G")]).must_succeed();
    let (r, s) = tier(
        "mlp_train",
        &args,
        &[("ACLSIM_HBM_BYTES", "128M"), ("U3M_HANDOFF", "on")],
    );
    assert_clean(&r, 128 * MIB, "mlp_train");
    assert_eq!(results(&r.stdout), results(&big.stdout));
    assert!(s["tier"]["handoffs"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(s["tier"]["host_waits"], false, "{s}");
    let s = mt_stress_loses_nothing(&[("U3M_HANDOFF", "on")]);
    assert!(s["tier"]["handoffs"].as_u64().unwrap() > 0, "{s}");
    // a program that queues a host function: the hook tells the engine
    // before queuing it (no eviction is then ordered after program work)
    let (r, s) = tier("rtcheck", &["race"], &[("U3M_HANDOFF", "on")]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(s["tier"]["host_waits"], true, "{s}");
}

/// acl_replay (not phantom: every byte of every allocation read back and
/// hashed) of a 13B-shaped LoRA trace at 1.4 × HBM: with the hand-off, and
/// with the hand-off following the pipeline bound's LP schedule exported by
/// `u3m replay --plan-export` (U3M_PLAN, ordered evictions), the checksum
/// is the unconstrained run's. It caught a first touch handed HBM whose
/// copy-out was still reading it: the rest of the chunk held another
/// allocation's bytes (core residency/migrate.rs `fault_in_chunks`).
/// `acl_replay --sums` lines of a run's stderr: a hash per 2 MiB of every
/// allocation read back, so that a difference names its chunks.
fn sums(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.starts_with("sum alloc="))
        .map(String::from)
        .collect()
}

/// The unconstrained run of trace `t` (1 GiB of HBM, no u3m) and its sums.
fn unconstrained_sums(t: &str) -> (Run, Vec<String>) {
    let reference = run("acl_replay", &[t, "--sums"], &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    let want = sums(&reference.stderr);
    assert!(want.len() > 100, "{}", reference.stderr);
    (reference, want)
}

/// Every chunk of run `r` reads back as in the unconstrained run (`want`).
fn assert_same_sums(r: &Run, want: &[String], what: &str) {
    let got = sums(&r.stderr);
    let differ: Vec<&String> = got.iter().filter(|l| !want.contains(l)).collect();
    assert!(
        differ.is_empty() && got.len() == want.len(),
        "{what}: chunks that differ from the unconstrained run: {differ:?}"
    );
}

#[test]
fn acl_replay_keeps_every_byte_with_the_handoff_and_a_schedule() {
    let dir = common::scratch("handoff-replay");
    let (t, _) = common::small_13b_trace_steps(&dir, "lora", &["--scale", "4"], 5);
    let plan = dir.join("lp.plan");
    let sched = dir.join("lib.sched");
    common::plan_schedule(&["150M", &t], &plan);
    common::output_ok(
        std::process::Command::new(common::target_dir().join("u3m"))
            .args([
                "replay",
                &t,
                "--hbm",
                "150M",
                "--policy",
                "plan",
                "--handoff",
                "on",
            ])
            .args(["--event-model", "device", "--issue", "acl-replay", "--plan"])
            .arg(&plan)
            .arg("--plan-export")
            .arg(&sched),
    );
    let (reference, want) = unconstrained_sums(&t);
    let sched = sched.to_str().unwrap();
    for env in [
        &[("U3M_HANDOFF", "on")][..],
        &[("U3M_HANDOFF", "on"), ("U3M_PLAN", sched)][..],
    ] {
        let mut e = vec![("ACLSIM_HBM_BYTES", "150M"), ("U3M_OVERSUB", "2")];
        e.extend_from_slice(env);
        let (r, s) = tier("acl_replay", &[&t, "--sums"], &e);
        let r = r.must_succeed();
        assert_same_sums(&r, &want, &format!("{env:?}"));
        assert_eq!(
            r.fact("checksum"),
            reference.fact("checksum"),
            "{env:?}: {s}"
        );
        assert!(s["tier"]["handoffs"].as_u64().unwrap() > 0, "{env:?}: {s}");
        if env.len() > 1 {
            assert!(s["tier"]["schedule_entries"].as_u64().unwrap() > 100, "{s}");
            assert!(s["tier"]["ordered_outs"].as_u64().unwrap() > 0, "{s}");
        }
    }
}

/// U3M_PLAN=auto: libu3m.so finds the step of a 9-step LoRA, records one,
/// plans and follows its own schedule (with the hand-off), and every chunk
/// of every allocation reads back as in the unconstrained run.
#[test]
fn acl_replay_keeps_every_byte_when_u3m_plans_its_own_schedule() {
    let dir = common::scratch("auto-plan");
    let (t, _) = common::small_13b_trace_steps(&dir, "lora", &["--scale", "4"], 9);
    let (reference, want) = unconstrained_sums(&t);
    let e = [
        ("ACLSIM_HBM_BYTES", "150M"),
        ("U3M_OVERSUB", "2"),
        ("U3M_HANDOFF", "on"),
        ("U3M_PLAN", "auto"),
        ("U3M_PLAN_MIN_GAP_US", "4000"),
        ("U3M_LOG", "info"),
    ];
    let (r, s) = tier("acl_replay", &[&t, "--sums"], &e);
    let r = r.must_succeed();
    assert_same_sums(&r, &want, "U3M_PLAN=auto");
    assert_eq!(r.fact("checksum"), reference.fact("checksum"), "{s}");
    let line = r
        .stderr
        .lines()
        .find(|l| l.contains("U3M_PLAN=auto: step of"))
        .unwrap_or_else(|| panic!("no plan line: {}", r.stderr));
    let per_step: u64 = line
        .split(" chunk-gaps")
        .next()
        .and_then(|h| h.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(per_step > 10 && line.contains(", kept"), "{line}");
    // followed for the steps after its install (the sixth of nine on);
    // the calls after the loop (the read-back) leave it, named
    let followed = s["tier"]["schedule_entries"].as_u64().unwrap();
    assert!(followed >= 3 * per_step, "{followed} entries: {line}: {s}");
    assert!(
        s["tier"]["schedule_stops"].as_u64() <= Some(1),
        "{}",
        r.stderr
    );
}

#[test]
fn meminfo_reports_the_virtual_capacity() {
    let (r, _) = tier(
        "rtcheck",
        &["capacity"],
        &[("ACLSIM_HBM_BYTES", "256M"), ("U3M_OVERSUB", "1.5")],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.fact("total").unwrap().parse::<u64>().unwrap(), 384 * MIB);
    // 16 MiB allocations now succeed up to the virtual capacity
    assert_eq!(r.fact("allocated").unwrap().parse::<u64>().unwrap(), 24);
    assert_eq!(r.fact("fail_code").as_deref(), Some("207001"));
}

#[test]
fn a_failing_physical_allocation_during_fault_in_is_absorbed() {
    // every 7th physical allocation fails: u3m evicts and retries; nothing lost
    let args = ["--footprint", "180M", "--steps", "2"];
    let big = run("mlp_train", &args, &[("ACLSIM_HBM_BYTES", "2G")]).must_succeed();
    for rule in ["phys:7", "phys:40", "phys:41"] {
        let (r, _) = tier(
            "mlp_train",
            &args,
            &[("ACLSIM_HBM_BYTES", "128M"), ("ACLSIM_FAULTS", rule)],
        );
        assert_clean(&r, 128 * MIB, rule);
        assert_eq!(results(&r.stdout), results(&big.stdout), "{rule}");
    }
}

#[test]
fn a_failing_copy_surfaces_as_the_runtime_error() {
    // a migration copy fails: the call that needed it returns the copy error
    // (507052) to the program, which reports it; nothing crashes
    let (r, _) = tier(
        "mlp_train",
        &["--footprint", "180M", "--steps", "2"],
        &[("ACLSIM_HBM_BYTES", "128M"), ("ACLSIM_FAULTS", "copy:30+")],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("ACL error 507052"), "{}", r.stderr);
    assert_eq!(r.stat_u64(&["mmu_faults"]), 0);
}

#[test]
fn a_full_swap_keeps_the_data_in_dram() {
    let dir = common::scratch("tier-fullswap");
    // 96 MiB live on 48 MiB of HBM; 64 MiB of DRAM (95 % before NVMe) and
    // 4 MiB of swap cannot take the excess without the swap filling up
    let trace = ring_trace(&dir, 12, 8);
    let swap = dir.join("swap");
    std::fs::create_dir_all(&swap).unwrap();
    let t = trace.to_str().unwrap();
    let big = run("acl_replay", &[t], &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    let (r, s) = tier(
        "acl_replay",
        &[t],
        &[
            ("ACLSIM_HBM_BYTES", "48M"),
            ("U3M_OVERSUB", "3"),
            ("U3M_DRAM_BYTES", "64M"),
            ("U3M_SWAP_DIR", swap.to_str().unwrap()),
            ("U3M_SWAP_BYTES", "4M"),
        ],
    );
    assert_clean(&r, 48 * MIB, "acl_replay");
    assert_eq!(r.fact("checksum"), big.fact("checksum"));
    assert!(
        s["tier"]["spill_errors"].as_u64().unwrap() > 0,
        "the swap filled up: {s}"
    );
    assert!(
        r.stderr.contains("u3m: NVMe swap full or failing"),
        "reported:\n{}",
        r.stderr
    );
}

#[test]
fn background_prefetch_brings_evicted_chunks_back_before_use() {
    // B (80 MiB) is written, A (80 MiB) pushes 16 or more of B's chunks to DRAM, A is
    // freed: while the program idles, the background thread has room below
    // the low watermark and brings B back, so reading B faults nothing in
    let args = [
        "--scenario",
        "prefetch",
        "--bytes",
        "80M",
        "--idle-ms",
        "300",
    ];
    let env = [("ACLSIM_HBM_BYTES", "128M"), ("U3M_POLICY", "lru")];
    let (r, s) = tier("tier_probe", &args, &env);
    assert_clean(&r, 128 * MIB, "prefetch");
    assert_eq!(r.fact("b_ok").as_deref(), Some("1"));
    let t = &s["tier"];
    let evicted = t["evictions"].as_u64().unwrap();
    assert!(evicted >= 16, "A pushes at least 16 of B's chunks out: {s}");
    assert_eq!(
        t["prefetches"].as_u64().unwrap(),
        evicted,
        "every evicted chunk of B comes back: {s}"
    );
    // 40 + 40 first touches; B's read needed none
    assert_eq!(t["faults_in"].as_u64().unwrap(), 80, "{s}");
    // without the idle time the same read faults B's chunks in on demand
    let (r, s) = tier(
        "tier_probe",
        &["--scenario", "prefetch", "--bytes", "80M", "--idle-ms", "0"],
        &env,
    );
    assert_clean(&r, 128 * MIB, "no idle");
    assert_eq!(r.fact("b_ok").as_deref(), Some("1"));
    assert_eq!(
        s["tier"]["faults_in"].as_u64().unwrap(),
        80 + s["tier"]["evictions"].as_u64().unwrap() - s["tier"]["prefetches"].as_u64().unwrap(),
        "{s}"
    );
}

#[test]
fn a_lost_device_keeps_what_dram_holds_readable() {
    // 6 x 30 MiB on device 1 of 128 MiB: the first buffer lives in DRAM when
    // the card disappears (injected at its 200th work item); the others had
    // chunks only in HBM. Device 0 carries on.
    let args = [
        "--scenario",
        "lose",
        "--buffers",
        "6",
        "--bytes",
        "30M",
        "--touches",
        "400",
    ];
    // lru: the eviction order (oldest buffer first) is then known
    let env = [
        ("ACLSIM_DEVICES", "2"),
        ("ACLSIM_HBM_BYTES", "128M"),
        ("ACLSIM_FAULTS", "lose:1@200"),
        ("U3M_POLICY", "lru"),
    ];
    let stock = run(
        "tier_probe",
        &args,
        &[
            ("ACLSIM_DEVICES", "2"),
            ("ACLSIM_HBM_BYTES", "1G"),
            ("ACLSIM_FAULTS", "lose:1@200"),
        ],
    );
    assert_eq!(stock.code, 0, "{}", stock.stderr);
    assert_eq!(
        stock.fact("readable").as_deref(),
        Some("0"),
        "stock: nothing survives the card\n{}",
        stock.stdout
    );
    let (r, s) = tier("tier_probe", &args, &env);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stat_u64(&["mmu_faults"]), 0);
    assert!(
        r.stdout.contains("buf=0 rc=0 ok=1"),
        "the DRAM-held buffer reads back intact:\n{}",
        r.stdout
    );
    assert_eq!(r.fact("dev0_ok").as_deref(), Some("1"));
    for i in 1..6 {
        assert!(
            r.stdout.contains(&format!("buf={i} rc=107022 ok=0")),
            "buffer {i}: the runtime's error\n{}",
            r.stdout
        );
    }
    let lost = &s["lost_devices"][0];
    assert_eq!(lost["device"], 1, "{s}");
    assert_eq!(lost["allocations_lost"], 5, "{s}");
    assert_eq!(lost["allocations_readable"], 1, "{s}");
    assert!(
        r.stderr
            .contains("u3m: device 1 lost: 5 managed allocations lost"),
        "{}",
        r.stderr
    );
}

#[test]
fn an_operator_the_runtime_refuses_leaves_an_output_it_would_write_whole_as_it_was() {
    // A (24 MiB) is evicted by pressure, then an operator the simulator
    // refuses names all of A as a contiguous output: u3m maps A without its
    // copy-in (the op would overwrite it), and must put A back to its host
    // copy when the call fails — the program reads what it wrote, as stock
    let args = ["--scenario", "refused", "--bytes", "24M"];
    let stock = run("tier_probe", &args, &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    assert_eq!(stock.fact("a_ok").as_deref(), Some("1"), "{}", stock.stdout);
    assert_ne!(
        stock.fact("op_rc").as_deref(),
        Some("0"),
        "the op is refused"
    );
    let (r, s) = tier("tier_probe", &args, &[("ACLSIM_HBM_BYTES", "64M")]);
    assert_clean(&r, 64 * MIB, "refused");
    assert_eq!(
        r.fact("op_rc"),
        stock.fact("op_rc"),
        "the runtime's own answer"
    );
    assert_eq!(r.fact("sync_rc"), stock.fact("sync_rc"));
    assert_eq!(r.fact("a_ok").as_deref(), Some("1"), "{}", r.stdout);
    // A was left out of HBM and skipped its copy-in for the refused call
    let t = &s["tier"];
    assert!(t["overwrites"].as_u64().unwrap() >= 1, "{s}");
}

#[test]
fn an_exported_vmm_handle_becomes_real_and_stays_in_hbm() {
    // a 20 MiB u3m handle (10 chunks) exported for IPC is replaced by a real
    // 20 MiB handle with the same data; later pressure evicts other memory
    // only (the handle's oldest chunks would go first otherwise), and the
    // handle still maps and reads back at a second VA
    let args = ["--scenario", "export", "--bytes", "30M"];
    let stock = run("tier_probe", &args, &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    let (r, s) = tier("tier_probe", &args, &[("ACLSIM_HBM_BYTES", "64M")]);
    assert_clean(&r, 64 * MIB, "export");
    assert_eq!(
        r.fact("export_rc"),
        stock.fact("export_rc"),
        "the runtime's own answer to the export"
    );
    assert_eq!(r.fact("h_ok").as_deref(), Some("1"));
    assert_eq!(r.fact("remap_ok").as_deref(), Some("1"));
    let t = &s["tier"];
    // 30 chunks of other memory + the 10-chunk real handle on 32 chunks of
    // HBM: at least 8 evictions (more when the background round runs first)
    assert!(t["evictions"].as_u64().unwrap() >= 8, "{s}");
    // 10 + 15 + 15 first touches: nothing of the handle came back after export
    assert_eq!(t["faults_in"].as_u64().unwrap(), 40, "{s}");
}

#[test]
fn a_captured_graph_replays_under_pressure() {
    // a D2D copy chain captured once (part of it out of HBM while captured:
    // u3m may add no work to a capturing stream — the simulator refuses
    // events there) and replayed 3 times, each after new input and a
    // pressure write that pushes the chain out of HBM
    let args = ["--bytes", "12M", "--pressure", "40M", "--rounds", "3"];
    let big = run("graph_app", &args, &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    assert_eq!(
        big.fact("captured_not_run").as_deref(),
        Some("1"),
        "capture records, it does not run"
    );
    assert_eq!(big.fact("rounds_ok").as_deref(), Some("3"));
    stock_fails("graph_app", &args, &[("ACLSIM_HBM_BYTES", "64M")]);
    let (r, s) = tier("graph_app", &args, &[("ACLSIM_HBM_BYTES", "64M")]);
    assert_clean(&r, 64 * MIB, "graph_app");
    // the simulator refuses (and names) events on a capturing stream
    assert!(
        !r.stderr.contains("capturing stream"),
        "u3m added work to the capturing stream:\n{}",
        r.stderr
    );
    assert_eq!(results(&r.stdout), results(&big.stdout));
    assert!(s["tier"]["evictions"].as_u64().unwrap() >= 60, "{s}");
}

/// Issue 14: an allocation beyond U3M_OVERSUB x HBM failed with 207001 and
/// no word about the cap. Now one line with the numbers and the variable.
#[test]
fn an_allocation_beyond_the_virtual_capacity_says_why_once() {
    let (r, s) = tier(
        "mlp_train",
        &["--footprint", "300M", "--batch", "16", "--steps", "1"],
        &[("ACLSIM_HBM_BYTES", "130M"), ("U3M_ALLOC_WAIT_MS", "0")],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("ACL error 207001"), "{}", r.stderr);
    let lines: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("refused (207001)"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(
        lines[0].starts_with("u3m: allocation of ")
            && lines[0].contains("of the virtual capacity 195.0 MiB (1.5 × HBM 130.0 MiB) is in use; raise U3M_OVERSUB"),
        "{}",
        lines[0]
    );
    assert!(s.is_object(), "the summary is still written");
}

/// Issue 14: U3M_SWAP_DIR without U3M_SWAP_BYTES gave no NVMe tier at all.
/// Now the tier is sized from the file system's free space (90 %, less 1 GiB).
#[test]
fn swap_dir_alone_enables_an_nvme_tier_sized_from_free_space() {
    let swap = common::scratch("tier-swap-alone");
    let (r, s) = tier(
        "mlp_train",
        &["--steps", "1"],
        &[
            ("ACLSIM_HBM_BYTES", "256M"),
            ("U3M_SWAP_DIR", swap.to_str().unwrap()),
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let free = u3m_free_bytes(&swap);
    let want = (free / 10 * 9).saturating_sub(1 << 30) / (2 << 20) * (2 << 20);
    let got = s["tier"]["nvme_limit"].as_u64().unwrap();
    assert!(
        want > 0,
        "test machine has too little free space in {}",
        swap.display()
    );
    // free space moves a little between the two looks
    assert!(
        got.abs_diff(want) <= 64 << 20,
        "nvme_limit {got}, expected about {want}"
    );
}

fn u3m_free_bytes(dir: &Path) -> u64 {
    let c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail as u64 * st.f_frsize as u64
}

/// An operator's out-of-place output written whole (a contiguous ND
/// description, no input overlapping it) skips the copy-in of the chunks it
/// covers; an in-place update (output = input) and an output covering only
/// part of a chunk keep theirs. Stale HBM bytes left in a chunk the
/// operator did not write, or read by it, would change the checksum.
#[test]
fn whole_outputs_skip_their_copy_in_and_in_place_ones_do_not() {
    let dir = common::scratch("tier-whole");
    let (n, sz) = (16u64, 8u64 << 20); // 128 MiB live on a 64 MiB device
    let a = |i: u64| 0x1000_0000u64 + (i % n) * sz;
    let mut t = String::from("# u3m-trace 1\n");
    for i in 0..n {
        t += &format!(
            "A {:#x} {sz}\nM H2D {:#x} 0x7f0000000000 {sz}\n",
            a(i),
            a(i)
        );
    }
    for i in 0..n {
        // out of place, the whole buffer
        t += &format!("O Gen 1 1 {:#x}:65536 {:#x}:{sz}\n", a(i + 5) + 4096, a(i));
    }
    for i in 0..n {
        // in place: the output is its input
        t += &format!("O Inc 1 1 {:#x}:{sz} {:#x}:{sz}\n", a(i), a(i));
    }
    for i in 0..n {
        // out of place, inside the chunks it touches
        t += &format!(
            "O Part 1 1 {:#x}:65536 {:#x}:{}\n",
            a(i + 3),
            a(i) + 4096,
            3 << 20
        );
    }
    for i in 0..n {
        t += &format!("F {:#x}\n", a(i));
    }
    let p = dir.join("whole.trace");
    std::fs::write(&p, t).unwrap();
    let p = p.to_str().unwrap();
    let big = run("acl_replay", &[p], &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    let (r, s) = tier(
        "acl_replay",
        &[p],
        &[("ACLSIM_HBM_BYTES", "64M"), ("U3M_OVERSUB", "3")],
    );
    assert_clean(&r, 64 * MIB, "acl_replay");
    assert_eq!(r.fact("checksum"), big.fact("checksum"));
    // the Gen round's outputs: evicted buffers written whole, not copied in
    let over = s["tier"]["overwrites"].as_u64().unwrap();
    assert!(over >= 8 * (sz / (2 * MIB)) / 2, "{s}");
}
