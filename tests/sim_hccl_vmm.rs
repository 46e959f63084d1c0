//! The HCCL stand-in (libhccl.so) and the VMM surface of the simulated runtime:
//! data-parallel training over two simulated devices, collective semantics,
//! faults and bad input, and a torch_npu-style expandable-segments allocator
//! plus the VMM misuse codes.

mod common;

use common::{run, Run};
use std::time::{Duration, Instant};

const TWO: (&str, &str) = ("ACLSIM_DEVICES", "2");

fn fact_i64(r: &Run, key: &str) -> i64 {
    r.fact(key)
        .unwrap_or_else(|| {
            panic!(
                "no fact {key} in output:\n{}\nstderr:\n{}",
                r.stdout, r.stderr
            )
        })
        .parse()
        .unwrap_or_else(|e| panic!("fact {key} is not an integer: {e}"))
}

fn fact_str(r: &Run, key: &str) -> String {
    r.fact(key).unwrap_or_else(|| {
        panic!(
            "no fact {key} in output:\n{}\nstderr:\n{}",
            r.stdout, r.stderr
        )
    })
}

/// Every `step=<i> loss=<f>` line, in order.
fn losses(r: &Run) -> Vec<f64> {
    let mut v = Vec::new();
    for line in r.stdout.lines().filter(|l| l.starts_with("step=")) {
        let mut step = None;
        let mut loss = None;
        for tok in line.split_whitespace() {
            if let Some(x) = tok.strip_prefix("step=") {
                step = x.parse::<usize>().ok();
            } else if let Some(x) = tok.strip_prefix("loss=") {
                loss = x.parse::<f64>().ok();
            }
        }
        assert_eq!(step, Some(v.len()), "steps out of order in:\n{}", r.stdout);
        v.push(loss.unwrap_or_else(|| panic!("bad loss line {line:?}")));
    }
    v
}

/// The simulated clock of every stream of `dev` other than its default stream.
fn stream_clocks(r: &Run, dev: u64) -> Vec<u64> {
    r.stats["streams"]
        .as_array()
        .expect("streams in stats")
        .iter()
        .filter(|s| s["device"].as_u64() == Some(dev) && s["id"].as_u64() != Some(0))
        .map(|s| s["sim_ns"].as_u64().unwrap())
        .collect()
}

// ---------------------------------------------------------------- training

#[test]
fn allreduce_app_trains_on_two_devices_with_identical_replicas() {
    let a = run("allreduce_app", &[], &[TWO]).must_succeed();
    let l = losses(&a);
    assert_eq!(l.len(), 20, "default is 20 steps:\n{}", a.stdout);
    assert!(l.iter().all(|x| x.is_finite() && *x > 0.0), "losses {l:?}");
    assert!(l[19] < l[0] * 0.25, "loss did not fall enough: {l:?}");
    let falls = l.windows(2).filter(|w| w[1] < w[0]).count();
    assert!(falls >= 17, "loss should fall almost every step: {l:?}");
    assert_eq!(fact_i64(&a, "replicas_identical"), 1);
    assert_eq!(fact_i64(&a, "devices"), 2);
    let sum = fact_str(&a, "checksum");
    assert_eq!(sum.len(), 16, "checksum is 16 hex digits: {sum}");

    // two all-reduces (gradients, loss) per step on each of the 2 ranks
    assert_eq!(a.stat_u64(&["hccl_ops"]), 20 * 2 * 2);
    assert!(
        a.stat_u64(&["ops"]) >= 20 * 2 * 15,
        "operators ran on both devices"
    );
    assert_eq!(a.stat_u64(&["mmu_faults"]), 0);
    for d in 0..2 {
        assert!(
            a.stats["devices"][d]["peak_bytes"].as_u64().unwrap() > 0,
            "device {d} held memory"
        );
    }
    // The program ends with a collective on each device's stream: both
    // streams finish at the same simulated time.
    let (c0, c1) = (stream_clocks(&a, 0), stream_clocks(&a, 1));
    assert_eq!(c0.len(), 1);
    assert_eq!(c0, c1, "collectives end together on every rank");
    assert!(c0[0] > 0);

    // Reproducible to the bit.
    let b = run("allreduce_app", &[], &[TWO]).must_succeed();
    assert_eq!(fact_str(&b, "checksum"), sum);
    assert_eq!(b.stdout, a.stdout);

    // The result depends on the optimiser, the width and the number of replicas.
    let sgd = run("allreduce_app", &["--opt", "sgd"], &[TWO]).must_succeed();
    let ls = losses(&sgd);
    assert!(ls[19] < ls[0], "sgd loss falls: {ls:?}");
    assert_eq!(fact_i64(&sgd, "replicas_identical"), 1);
    assert_ne!(fact_str(&sgd, "checksum"), sum);
    let four = run(
        "allreduce_app",
        &["--devices", "4", "--steps", "5"],
        &[("ACLSIM_DEVICES", "4")],
    )
    .must_succeed();
    assert_eq!(fact_i64(&four, "replicas_identical"), 1);
    assert_eq!(four.stat_u64(&["hccl_ops"]), 5 * 2 * 4);
}

#[test]
fn data_parallel_training_matches_one_device_on_the_whole_batch() {
    // Averaging the shard gradients over 2 replicas (16 rows each) is the
    // gradient of the whole 32-row batch: the loss curves agree up to float
    // summation order. Fails if the all-reduce drops or double-counts a rank.
    let dp = run("allreduce_app", &["--steps", "12"], &[TWO]).must_succeed();
    let one = run(
        "allreduce_app",
        &["--devices", "1", "--batch", "32", "--steps", "12"],
        &[],
    )
    .must_succeed();
    let (a, b) = (losses(&dp), losses(&one));
    assert_eq!(a.len(), 12);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-3 * y.abs() + 1e-6,
            "step {i}: 2 devices {x}, 1 device {y}"
        );
    }
}

#[test]
fn allreduce_app_needs_the_devices_it_asks_for() {
    // one simulated device, two requested: aclrtSetDevice(1) fails -> exit 2
    let r = run("allreduce_app", &["--steps", "2"], &[]);
    assert_eq!(r.code, 2, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("aclrtSetDevice"), "{}", r.stderr);
}

#[test]
fn allreduce_app_completes_in_phantom_mode() {
    let r = run(
        "allreduce_app",
        &["--steps", "3", "--dim", "256"],
        &[TWO, ("ACLSIM_PHANTOM", "1")],
    )
    .must_succeed();
    assert_eq!(r.stats["phantom"].as_bool(), Some(true));
    assert_eq!(r.stat_u64(&["hccl_ops"]), 3 * 2 * 2);
    assert_eq!(r.stat_u64(&["mmu_faults"]), 0);
    assert_eq!(losses(&r).len(), 3);
    let (c0, c1) = (stream_clocks(&r, 0), stream_clocks(&r, 1));
    assert_eq!(c0, c1, "phantom mode keeps the rendezvous timing");
    assert!(c0[0] > 0);
}

// ------------------------------------------------------------ collectives

#[test]
fn hccl_collectives_compute_the_right_results() {
    let r = run("hccltest_cases", &["--case", "ops"], &[TWO]).must_succeed();
    for k in [
        "ok_allreduce",
        "ok_allgather",
        "ok_reducescatter",
        "ok_broadcast",
    ] {
        assert_eq!(fact_i64(&r, k), 1, "{k}:\n{}", r.stderr);
    }
    assert_eq!(fact_i64(&r, "rank_size"), 2);
    assert_eq!(fact_i64(&r, "rank_of_comm1"), 1);
    // 5 types x 4 ops x {out of place, in place} + 2 gathers + 2 scatters + 1 broadcast
    assert_eq!(fact_i64(&r, "collectives"), 45);
    assert_eq!(r.stat_u64(&["hccl_ops"]), 45 * 2, "count 0 queues nothing");
}

#[test]
fn hccl_works_with_one_host_thread_per_device() {
    let r = run("hccltest_cases", &["--case", "threads"], &[TWO]).must_succeed();
    assert_eq!(fact_i64(&r, "ok_threads"), 1);
    assert_eq!(r.stat_u64(&["hccl_ops"]), 50 * 2);
}

#[test]
fn hccl_collective_on_missing_memory_is_an_mmu_fault_on_every_rank() {
    let r = run("hccltest_cases", &["--case", "fault"], &[TWO]).must_succeed();
    // The rank whose buffer is gone sees the MMU fault (507053); its peer the
    // collective's remote failure (507057); nobody's buffers are written.
    assert_eq!(fact_i64(&r, "freed_sync1"), 507053, "{}", r.stderr);
    assert_eq!(fact_i64(&r, "freed_sync0"), 507057);
    assert_eq!(fact_i64(&r, "freed_rank0_untouched"), 1);
    assert_eq!(fact_i64(&r, "unmapped_sync0"), 507053);
    assert_eq!(fact_i64(&r, "unmapped_sync1"), 507057);
    assert_eq!(fact_i64(&r, "unmapped_rank1_untouched"), 1);
    assert_eq!(
        fact_i64(&r, "partial_sync0"),
        507053,
        "a range running off its mapping faults"
    );
    assert_eq!(fact_i64(&r, "partial_sync1"), 507057);
    assert_eq!(
        fact_i64(&r, "after_ok"),
        1,
        "the group keeps working after a fault"
    );
    assert_eq!(r.stat_u64(&["mmu_faults"]), 3);
    assert!(
        r.stderr.contains("MMU fault") && r.stderr.contains("HcclAllReduce"),
        "{}",
        r.stderr
    );
}

#[test]
fn hccl_bad_input_gets_hccl_codes() {
    let r = run("hccltest_cases", &["--case", "badinput"], &[TWO]).must_succeed();
    // HCCL_E_PARA 1, HCCL_E_PTR 2, HCCL_E_INTERNAL 4, HCCL_E_NOT_SUPPORT 5
    let want: &[(&str, i64)] = &[
        ("null_comm", 2),
        ("null_send", 2),
        ("null_recv", 2),
        ("null_stream", 2),
        ("count0_null_bufs", 0),
        ("bad_dtype", 5),
        ("bad_dtype_255", 5),
        ("bad_op", 5),
        ("sum_fp8", 5),
        ("prod_int16", 5),
        ("huge_count", 1),
        ("bcast_root_oob", 1),
        ("bcast_null_buf", 2),
        ("ag_null_recv", 2),
        ("rs_bad_op", 5),
        ("stream_other_device", 1),
        ("stream_other_device2", 1),
        ("ranksize_null_out", 2),
        ("ranksize_null_comm", 2),
        ("rankid_null_out", 2),
        ("initall_ndev0", 1),
        ("initall_null_devices", 2),
        ("initall_null_comms", 2),
        ("initall_duplicate", 1),
        ("initall_bad_device", 4),
        ("destroy_null", 2),
        ("destroyed_comm", 1),
        ("destroy_twice", 1),
        ("sync0", 0),
        ("sync1", 0),
    ];
    for (k, v) in want {
        assert_eq!(fact_i64(&r, k), *v, "{k}");
    }
    assert_eq!(r.stat_u64(&["hccl_ops"]), 0, "no bad call queued anything");
    assert!(
        !r.stdout.lines().any(|l| l.starts_with("aclsim:")),
        "library wrote to stdout"
    );
}

#[test]
fn hccl_missing_peer_times_out_instead_of_hanging() {
    let t = Instant::now();
    let r = run(
        "hccltest_cases",
        &["--case", "timeout"],
        &[TWO, ("ACLSIM_HCCL_TIMEOUT", "0.5")],
    )
    .must_succeed();
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(fact_i64(&r, "sync0"), 107020, "ACL_ERROR_RT_TASK_TIMEOUT");
    assert!(r.stderr.contains("HCCL_E_TIMEOUT"), "{}", r.stderr);
    assert!(r.stderr.contains("rank(s) 1 never arrived"), "{}", r.stderr);
}

#[test]
fn hccl_peer_losing_its_device_fails_the_collective_promptly() {
    let t = Instant::now();
    let r = run(
        "hccltest_cases",
        &["--case", "lost"],
        &[TWO, ("ACLSIM_FAULTS", "lose:1@1")],
    )
    .must_succeed();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "no 60 s timeout wait: {:?}",
        t.elapsed()
    );
    assert_eq!(fact_i64(&r, "call0"), 0);
    assert_eq!(
        fact_i64(&r, "call1"),
        15,
        "HCCL_E_RUNTIME on the lost device"
    );
    assert_eq!(
        fact_i64(&r, "sync0"),
        507057,
        "ACL_ERROR_RT_SUSPECT_REMOTE_ERROR"
    );
    assert_eq!(r.stats["devices"][1]["lost"].as_bool(), Some(true));
}

#[test]
fn hccl_injected_fault_fails_the_call_only() {
    let r = run(
        "hccltest_cases",
        &["--case", "inject"],
        &[TWO, ("ACLSIM_FAULTS", "coll:1")],
    )
    .must_succeed();
    assert_eq!(fact_i64(&r, "first"), 15, "HCCL_E_RUNTIME");
    assert_eq!(fact_i64(&r, "second_ok"), 1);
    assert_eq!(r.stat_u64(&["injected_faults"]), 1);
    assert_eq!(r.stat_u64(&["hccl_ops"]), 2);
}

#[test]
fn hccl_ranks_that_disagree_fail_together() {
    let r = run("hccltest_cases", &["--case", "mismatch"], &[TWO]).must_succeed();
    assert_eq!(fact_i64(&r, "sync0"), 107000);
    assert_eq!(fact_i64(&r, "sync1"), 107000);
    assert!(r.stderr.contains("differs between ranks"), "{}", r.stderr);
}

#[test]
fn hccl_collective_ends_at_the_same_simulated_time_on_every_rank() {
    let r = run("hccltest_cases", &["--case", "timing"], &[TWO]).must_succeed();
    let (b0, a0) = (fact_i64(&r, "t0_before"), fact_i64(&r, "t0_after"));
    let (b1, a1) = (fact_i64(&r, "t1_before"), fact_i64(&r, "t1_after"));
    assert!(
        b0 > 300_000,
        "device 0 was busy with a 256 MiB memset first ({b0} ns)"
    );
    assert!(b1 < 1_000, "device 1 was idle ({b1} ns)");
    // ring all-reduce of 4 MiB over 2 ranks at 25 GB/s, plus 5 us launch
    let cost = (2.0 * 0.5 * (4u64 << 20) as f64 / 25e9 * 1e9) as i64 + 5_000;
    assert!(
        (a0 - a1).abs() <= 1,
        "both ranks finish together: {a0} vs {a1}"
    );
    assert!(
        (a0 - (b0 + cost)).abs() <= 64,
        "finish = slowest start + cost: {a0} vs {} + {cost}",
        b0
    );
}

// -------------------------------------------------------------------- VMM

#[test]
fn vmm_app_expandable_segments_reproduce() {
    let a = run("vmm_app", &[], &[]).must_succeed();
    assert_eq!(fact_i64(&a, "granularity"), 2 << 20);
    assert_eq!(
        fact_i64(&a, "fresh_zero"),
        1,
        "fresh physical memory reads as zeros"
    );
    assert_eq!(
        fact_i64(&a, "remap_preserves"),
        1,
        "a remapped handle keeps its contents"
    );
    assert_eq!(fact_i64(&a, "memory_restored"), 1);
    assert!(fact_i64(&a, "spans") > 0, "some tensors span two handles");
    assert!(fact_i64(&a, "large_peak_segments") >= 2);
    assert!(fact_i64(&a, "small_peak_segments") >= 2);
    assert!(
        fact_i64(&a, "shrinks") > 6,
        "pools also shrink when full, not only per step"
    );
    let peak = fact_i64(&a, "mapped_peak") as u64;
    assert!(peak >= 40 << 20, "mapped_peak {peak}");
    let dev = &a.stats["devices"][0];
    assert!(
        dev["peak_bytes"].as_u64().unwrap() >= peak,
        "physical peak covers the mapped peak"
    );
    assert_eq!(
        dev["current_bytes"].as_u64(),
        Some(0),
        "everything was freed"
    );
    assert_eq!(a.stat_u64(&["mmu_faults"]), 0);
    assert_eq!(a.stat_u64(&["ops"]), 3 * 24 * 4);

    let b = run("vmm_app", &[], &[]).must_succeed();
    assert_eq!(fact_str(&b, "checksum"), fact_str(&a, "checksum"));
    assert_eq!(b.stdout, a.stdout);
    let c = run(
        "vmm_app",
        &["--tensors", "10", "--segments", "2", "--steps", "2"],
        &[],
    )
    .must_succeed();
    assert_ne!(fact_str(&c, "checksum"), fact_str(&a, "checksum"));
    assert!(fact_i64(&c, "large_peak_segments") <= 2);
}

#[test]
fn vmm_app_completes_in_phantom_mode() {
    let real = run("vmm_app", &["--steps", "2"], &[]).must_succeed();
    let r = run("vmm_app", &["--steps", "2"], &[("ACLSIM_PHANTOM", "1")]).must_succeed();
    assert_eq!(r.stats["phantom"].as_bool(), Some(true));
    // Same allocation pattern, same checks against the mappings, no data.
    assert_eq!(fact_str(&r, "mapped_peak"), fact_str(&real, "mapped_peak"));
    assert_eq!(
        fact_str(&r, "handles_allocated"),
        fact_str(&real, "handles_allocated")
    );
    assert_eq!(r.stat_u64(&["mmu_faults"]), 0);
    assert_eq!(r.stat_u64(&["ops"]), real.stat_u64(&["ops"]));
}

#[test]
fn vmm_misuse_gets_the_runtime_codes() {
    let r = run("vmmtest_errors", &[], &[]).must_succeed();
    // 100000 ACL_ERROR_INVALID_PARAM, 107000 RT_PARAM_INVALID, 107008 RT_ADDR_UNALIGNED,
    // 107017 RT_INVALID_HANDLE, 207001 RT_MEMORY_ALLOCATION, 207002 RT_MEMORY_FREE
    let want: &[(&str, i64)] = &[
        ("phys_not_multiple", 100000),
        ("phys_size0", 100000),
        ("phys_flags", 100000),
        ("phys_null_prop", 100000),
        ("map_unaligned_va", 107008),
        ("map_size_not_multiple", 107008),
        ("map_size_beyond_handle", 100000),
        ("map_outside_reservation", 107000),
        ("map_runs_off_reservation", 107000),
        ("map_host_pointer", 107000),
        ("map_bad_handle", 107017),
        ("map_ok", 0),
        ("map_over_mapped", 107000),
        ("map_ok2", 0),
        ("map_overlap_tail", 107000),
        ("unmap_not_start", 107000),
        ("unmap_interior_byte", 107000),
        ("unmap_unmapped", 107000),
        ("free_mapped", 207002),
        ("release_live", 107000),
        ("release_interior", 107000),
        ("unmap_ok", 0),
        ("unmap_twice", 107000),
        ("free_ok", 0),
        ("free_twice", 107017),
        ("release_still_live", 107000),
        ("unmap_ok2", 0),
        ("free_ok2", 0),
        ("release_ok", 0),
        ("release_twice", 107000),
        ("phys_over_capacity", 207001),
        ("reserve_probe", 0),
        ("release_probe", 0),
        ("reserve_alignment", 100000),
        ("reserve_expect_ptr", 100000),
    ];
    for (k, v) in want {
        assert_eq!(fact_i64(&r, k), *v, "{k}\nstderr:\n{}", r.stderr);
    }
    assert_eq!(r.stats["devices"][0]["current_bytes"].as_u64(), Some(0));
}

#[test]
fn vmm_physical_memory_is_bounded_by_capacity() {
    let r = run(
        "vmmtest_errors",
        &["--case", "fill"],
        &[("ACLSIM_HBM_BYTES", "64M")],
    )
    .must_succeed();
    assert_eq!(fact_i64(&r, "total"), 64 << 20);
    assert_eq!(
        fact_i64(&r, "filled"),
        32,
        "64 MiB holds 32 handles of 2 MiB"
    );
    assert_eq!(fact_i64(&r, "fail"), 207001);
    assert_eq!(fact_i64(&r, "free_when_full"), 0);
    assert_eq!(fact_i64(&r, "after_free"), 0);
    assert!(r.stat_u64(&["failed_allocs"]) >= 1);
}

#[test]
fn vmm_injected_physical_allocation_failure() {
    let r = run(
        "vmmtest_errors",
        &["--case", "faults"],
        &[("ACLSIM_FAULTS", "phys:2")],
    )
    .must_succeed();
    assert_eq!(fact_i64(&r, "phys1"), 0);
    assert_eq!(fact_i64(&r, "phys2"), 207001);
    assert_eq!(fact_i64(&r, "phys3"), 0);
    assert_eq!(r.stat_u64(&["injected_faults"]), 1);
    let clean = run("vmmtest_errors", &["--case", "faults"], &[]).must_succeed();
    assert_eq!(fact_i64(&clean, "phys2"), 0, "no rule, no failure");
}
