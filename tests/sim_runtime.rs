//! The simulated runtime's core contract, driven by tests/apps/rtcheck.c:
//! error codes for bad input, capacity and 207001, asynchronous streams,
//! event ordering and simulated time, fault injection, MMU faults, phantom mode.

mod common;
use common::{run, Run};

fn facts(r: &Run) -> std::collections::BTreeMap<String, String> {
    common::facts(&r.stdout)
}

fn code(r: &Run, key: &str) -> i64 {
    r.fact(key)
        .unwrap_or_else(|| panic!("no fact {key} in:\n{}\nstderr:\n{}", r.stdout, r.stderr))
        .parse()
        .unwrap()
}

#[test]
fn bad_input_gets_the_real_error_codes() {
    let r = run("rtcheck", &["errors"], &[]).must_succeed();
    let expect: &[(&str, i64)] = &[
        ("malloc_before_init", 100001), // ACL_ERROR_UNINITIALIZE
        ("finalize_before_init", 100001),
        ("init", 0),
        ("init_again", 100002),       // ACL_ERROR_REPEAT_INITIALIZE
        ("malloc_no_device", 107002), // ACL_ERROR_RT_CONTEXT_NULL
        ("get_device_none", 107002),
        ("set_device_out_of_range", 107001), // ACL_ERROR_RT_INVALID_DEVICEID
        ("malloc_null_out", 100000),         // ACL_ERROR_INVALID_PARAM
        ("malloc_size0", 100000),
        ("malloc_bad_policy", 100000),
        ("malloc_absurd", 207001), // ACL_ERROR_RT_MEMORY_ALLOCATION
        ("malloc", 0),
        ("free_null", 100000),
        ("free_interior", 107000), // ACL_ERROR_RT_PARAM_INVALID
        ("free_host_ptr", 107000),
        ("memcpy_count_gt_destmax", 100000),
        ("memcpy_wrong_kind", 107000),
        ("memcpy_bad_kind", 100000),
        ("memcpy_null_dst", 100000),
        ("memcpy_default_kind", 0),
        ("memset_count_gt_max", 100000),
        ("memset_host_ptr", 107000),
        ("free", 0),
        ("free_twice", 107000),
        ("sync_destroyed_stream", 107000),
        ("sync_bogus_stream", 107000),
        ("record_destroyed_event", 107000),
        ("host_func_null", 100000),
        ("reserve_expect_ptr", 100000),
        ("reserve_alignment", 100000),
        ("map_bogus_handle", 107017), // ACL_ERROR_RT_INVALID_HANDLE
        ("free_physical_bogus", 107017),
        ("unmap_not_mapped", 107000),
        ("meminfo_null", 100000),
        ("finalize", 0),
        ("finalize_again", 100037), // ACL_ERROR_REPEAT_FINALIZE
        ("malloc_after_finalize", 100001),
    ];
    let f = facts(&r);
    for (k, v) in expect {
        assert_eq!(
            f.get(*k).map(|s| s.parse::<i64>().unwrap()),
            Some(*v),
            "{k}\nstderr:\n{}",
            r.stderr
        );
    }
    assert!(
        r.stdout.lines().all(|l| !l.starts_with("aclsim:")),
        "the runtime wrote to stdout"
    );
}

#[test]
fn capacity_is_enforced_with_207001_and_meminfo_is_true() {
    let r = run("rtcheck", &["capacity"], &[("ACLSIM_HBM_BYTES", "256M")]).must_succeed();
    assert_eq!(code(&r, "total"), 256 << 20);
    assert_eq!(code(&r, "allocated"), 16);
    assert_eq!(code(&r, "fail_code"), 207001);
    assert_eq!(code(&r, "free_full"), 0);
    assert_eq!(code(&r, "realloc_after_free"), 0);
    // aclrtMalloc(2 MiB) is padded by 32 bytes and so takes two 2 MiB pages
    assert_eq!(code(&r, "malloc_2m_physical"), 4 << 20);
    assert_eq!(r.stat_u64(&["failed_allocs"]), 1);
    assert_eq!(
        r.stat_u64(&["devices", "0", "peak_bytes"]).min(256 << 20),
        256 << 20
    );
}

#[test]
fn streams_are_asynchronous_and_races_are_visible() {
    let r = run("rtcheck", &["race"], &[]).must_succeed();
    assert_eq!(code(&r, "query_while_busy"), 1); // ACL_STREAM_STATUS_NOT_READY
    assert_eq!(
        code(&r, "unsynchronised_read"),
        0,
        "a read without synchronising must see the old data"
    );
    assert_eq!(code(&r, "query_after_sync"), 0);
    assert_eq!(code(&r, "synchronised_read"), 0x5a);
}

#[test]
fn events_order_streams_and_carry_simulated_time() {
    let r = run(
        "rtcheck",
        &["events"],
        &[("ACLSIM_HBM_GBPS", "800"), ("ACLSIM_LAUNCH_US", "5")],
    )
    .must_succeed();
    assert_eq!(code(&r, "event_status_before"), 0); // NOT_READY
    assert_eq!(
        code(&r, "ordered_value"),
        5,
        "stream B ran before the event it waited on"
    );
    assert_eq!(code(&r, "event_status_after"), 1); // COMPLETE
    let us: f64 = r.fact("elapsed_sim_us").unwrap().parse().unwrap();
    // 8 MiB memset at 800 GB/s (10.486 us) + 5 us launch latency
    assert!((us - 15.486).abs() < 0.01, "elapsed {us} us");
    assert_eq!(code(&r, "elapsed_unrecorded"), 507006);
    let streams = r.stats["streams"].as_array().unwrap();
    assert!(streams.len() >= 3);
    assert!(r.stat_u64(&["sim_ns"]) > 0);
    assert_eq!(r.stat_u64(&["memsets"]), 1);
    assert_eq!(r.stat_u64(&["copy_bytes", "D2D"]), 8 << 20);
    // answered by the simulated clock only: nothing waited a second
    assert_eq!(r.stat_u64(&["query_giveups"]), 0);
    assert_eq!(r.stat_u64(&["wait_parks"]), 0);
}

/// The two answers that depend on real time are counted, so a benchmark
/// can tell a figure that may not reproduce (`bench/engine_v2.sh` and
/// `bench/tiering.sh` warn): a query that waited a second for a device
/// making no progress (NOT_READY), and a stream wait parked after a second.
#[test]
fn answers_given_by_real_time_are_counted() {
    let r = run("rtcheck", &["realtime"], &[]).must_succeed();
    assert_eq!(code(&r, "query_while_stuck"), 0); // NOT_READY
    assert_eq!(code(&r, "query_after_sync"), 1); // COMPLETE
    assert_eq!(r.stat_u64(&["query_giveups"]), 1, "{}", r.stats);
    assert_eq!(r.stat_u64(&["wait_parks"]), 1, "{}", r.stats);
}

#[test]
fn injected_faults_return_the_real_codes() {
    let r = run(
        "rtcheck",
        &["faults"],
        &[(
            "ACLSIM_FAULTS",
            "malloc:2,copy:1,memset:2,phys:2,map:1,host:1",
        )],
    )
    .must_succeed();
    let want: &[(&str, i64)] = &[
        ("malloc1", 0),
        ("malloc2", 207001),
        ("host1", 207001),
        ("copy1", 507052),
        ("copy2", 0),
        ("memset1", 0),
        ("memset2", 507052),
        ("phys1", 0),
        ("phys2", 207001),
        ("map1", 507899),
        ("sync", 0),
    ];
    for (k, v) in want {
        assert_eq!(code(&r, k), *v, "{k}");
    }
    assert_eq!(r.stat_u64(&["injected_faults"]), 6);
    // onward rules: the 2nd and every later malloc fails
    let r = run("rtcheck", &["faults"], &[("ACLSIM_FAULTS", "malloc:1+")]).must_succeed();
    assert_eq!(code(&r, "malloc1"), 207001);
    assert_eq!(code(&r, "malloc2"), 207001);
    // without rules nothing fails
    let r = run("rtcheck", &["faults"], &[]).must_succeed();
    assert!(facts(&r).values().all(|v| v == "0"), "{}", r.stdout);
}

#[test]
fn malformed_fault_spec_is_named() {
    let r = run(
        "rtcheck",
        &["faults"],
        &[("ACLSIM_FAULTS", "malloc:2,bogus:1")],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("ACLSIM_FAULTS") && r.stderr.contains("bogus:1"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("100000"));
    let r = run("rtcheck", &["faults"], &[("ACLSIM_HBM_BYTES", "lots")]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("ACLSIM_HBM_BYTES='lots'"), "{}", r.stderr);
}

#[test]
fn a_lost_device_fails_its_calls_and_spares_the_others() {
    let r = run(
        "rtcheck",
        &["lose"],
        &[("ACLSIM_DEVICES", "2"), ("ACLSIM_FAULTS", "lose:1@3")],
    )
    .must_succeed();
    assert_eq!(code(&r, "dev1_copy1"), 0);
    assert_eq!(code(&r, "dev1_copy2"), 0);
    for k in [
        "dev1_copy3",
        "dev1_copy4",
        "dev1_malloc_after",
        "dev1_sync_after",
        "dev1_set_after",
    ] {
        assert_eq!(code(&r, k), 107022, "{k}"); // ACL_ERROR_RT_DEVICE_TASK_ABORT
    }
    assert_eq!(code(&r, "dev0_copy"), 0);
    assert_eq!(code(&r, "dev0_value"), 3);
    assert_eq!(r.stats["devices"][1]["lost"], serde_json::Value::Bool(true));
    assert_eq!(
        r.stats["devices"][0]["lost"],
        serde_json::Value::Bool(false)
    );
}

#[test]
fn touching_freed_memory_is_an_mmu_fault() {
    let r = run("rtcheck", &["mmu"], &[]).must_succeed();
    assert_eq!(code(&r, "async_enqueue"), 0);
    assert_eq!(code(&r, "sync_reports"), 507053); // ACL_ERROR_RT_DEVICE_MEM_ERROR
    assert_eq!(code(&r, "sync_cleared"), 0);
    assert_eq!(code(&r, "sync_copy"), 507053);
    assert_eq!(r.stat_u64(&["mmu_faults"]), 2);
    assert_eq!(r.stat_u64(&["devices", "0", "mmu_faults"]), 2);
    assert!(
        r.stderr.contains("device MMU fault") && r.stderr.contains("0x"),
        "{}",
        r.stderr
    );
}

#[test]
fn phantom_mode_holds_20_gib_with_a_small_rss() {
    let r = run("rtcheck", &["phantom"], &[("ACLSIM_PHANTOM", "1")]).must_succeed();
    assert!(code(&r, "used") >= 20 << 30);
    assert_eq!(r.stat_u64(&["copy_bytes", "H2D"]), 20 << 30);
    // 20 GiB over a 25 GB/s link is about 0.86 s of simulated time
    let ns = r.stat_u64(&["sim_ns"]);
    assert!(ns > 800_000_000 && ns < 1_000_000_000, "sim_ns {ns}");
    assert!(r.stats["phantom"].as_bool().unwrap());
}

#[test]
fn phantom_rss_stays_small() {
    let r = run("rtcheck", &["phantom"], &[("ACLSIM_PHANTOM", "1")]).must_succeed();
    let kb = code(&r, "peak_rss_kb");
    assert!(
        kb > 0 && kb < 256 * 1024,
        "peak RSS {kb} KiB for a 20 GiB phantom footprint"
    );
}
