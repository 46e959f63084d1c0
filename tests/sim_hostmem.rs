//! Host-located physical memory (aclrtMallocPhysical at ACL_MEM_LOCATION_TYPE_HOST_NUMA,
//! mapped with aclrtMapMem at device addresses) and managed memory
//! (aclrtMemAllocManaged and its advise/prefetch/attribute calls) on the
//! simulated runtime: data, the link-bandwidth cost model, statistics, capacity
//! and every error code. Program: tests/apps/hostmem_app.c.

mod common;

use common::{run, Run};

const MIB: u64 = 1 << 20;

fn fact_u64(r: &Run, key: &str) -> u64 {
    r.fact(key)
        .unwrap_or_else(|| panic!("no fact {key} in:\n{}\nstderr:\n{}", r.stdout, r.stderr))
        .parse()
        .unwrap_or_else(|e| panic!("fact {key} is not an integer: {e}"))
}

fn fact_i64(r: &Run, key: &str) -> i64 {
    r.fact(key)
        .unwrap_or_else(|| panic!("no fact {key} in:\n{}\nstderr:\n{}", r.stdout, r.stderr))
        .parse()
        .unwrap_or_else(|e| panic!("fact {key} is not an integer: {e}"))
}

fn case(name: &str, env: &[(&str, &str)]) -> Run {
    run("hostmem_app", &["--case", name], env).must_succeed()
}

/// `bytes` at `gbps` (10^9 B/s), in ns, less the simulator's rounding to whole ns.
fn link_ns(bytes: u64, gbps: f64) -> f64 {
    (bytes as f64 / gbps).floor()
}

fn codes(r: &Run, expected: &[(&str, i64)]) {
    let mut wrong = Vec::new();
    for (k, want) in expected {
        let got = fact_i64(r, k);
        if got != *want {
            wrong.push(format!("{k}: got {got}, want {want}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{}\nstdout:\n{}\nstderr:\n{}",
        wrong.join("\n"),
        r.stdout,
        r.stderr
    );
}

// ---------------------------------------------------------------- data

#[test]
fn operator_writes_a_host_handle_and_d2h_reads_the_reference() {
    let r = case("roundtrip", &[]);
    assert_eq!(fact_u64(&r, "roundtrip_mismatches"), 0, "{}", r.stdout);
    assert_eq!(
        fact_u64(&r, "remap_mismatches"),
        0,
        "handle keeps its data across remap"
    );
    assert_eq!(r.stat_u64(&["allocs", "phys_host"]), 1);
    assert_eq!(r.stat_u64(&["allocs", "phys_host_bytes"]), 4 * MIB);
    assert_eq!(r.stat_u64(&["host_mapped", "phys_peak_bytes"]), 4 * MIB);
    assert_eq!(
        r.stat_u64(&["host_mapped", "phys_bytes"]),
        0,
        "freed at the end"
    );
    assert_eq!(r.stat_u64(&["host_mapped", "mapped_peak_bytes"]), 4 * MIB);
    // Add wrote its 2 MiB output over the link; its inputs were in HBM
    assert_eq!(r.stat_u64(&["host_mapped", "write_bytes", "op"]), 2 * MIB);
    assert_eq!(r.stat_u64(&["host_mapped", "read_bytes", "op"]), 0);
    // HBM holds only the two aclrtMalloc(2 MiB) inputs (4 MiB pages each)
    assert_eq!(r.stat_u64(&["devices", "0", "peak_bytes"]), 8 * MIB);
    assert_eq!(r.stat_u64(&["mmu_faults"]), 0);
}

#[test]
fn operands_half_in_hbm_half_in_host_memory_compute_the_all_hbm_result() {
    let r = case("mixed", &[]);
    assert_eq!(fact_u64(&r, "mixed_equal"), 1, "{}", r.stdout);
    assert_eq!(r.fact("hbm_checksum"), r.fact("mixed_checksum"));
    // MatMul read w (512 KiB) from host memory, Add wrote out (256 KiB) there
    assert_eq!(r.stat_u64(&["host_mapped", "read_bytes", "op"]), 512 * 1024);
    assert_eq!(
        r.stat_u64(&["host_mapped", "write_bytes", "op"]),
        256 * 1024
    );
}

#[test]
fn apply_adam_updates_host_memory_in_place_like_hbm_and_moves_each_byte_once() {
    let r = case("adam", &[]);
    assert_eq!(fact_u64(&r, "adam_equal"), 1, "{}", r.stdout);
    let p = fact_u64(&r, "adam_params");
    // two steps; var, m, v read and written once each per step (the outputs
    // that repeat the in-place inputs are not counted twice)
    assert_eq!(
        r.stat_u64(&["host_mapped", "read_bytes", "op"]),
        2 * 3 * p * 4
    );
    assert_eq!(
        r.stat_u64(&["host_mapped", "write_bytes", "op"]),
        2 * 3 * p * 4
    );
    let step = fact_u64(&r, "adam_host_step_ns") as f64;
    // the link is full duplex (simulator.md): 3 p f32 read host->device while
    // 3 p are written back device->host
    let floor = link_ns(3 * p * 4, 25.0);
    assert!(step >= floor, "one step {step} ns < link floor {floor} ns");
    assert!(
        step < floor * 1.1,
        "one step {step} ns: more than the link floor {floor} + launch"
    );
}

#[test]
fn allreduce_on_host_mapped_buffers_of_two_devices() {
    let r = case("collective", &[("ACLSIM_DEVICES", "2")]);
    assert_eq!(fact_u64(&r, "allreduce_mismatches"), 0, "{}", r.stdout);
    // each rank reads its send buffer and writes its receive buffer (the same 2 MiB)
    assert_eq!(
        r.stat_u64(&["host_mapped", "read_bytes", "collective"]),
        4 * MIB
    );
    assert_eq!(
        r.stat_u64(&["host_mapped", "write_bytes", "collective"]),
        4 * MIB
    );
    assert_eq!(r.stat_u64(&["hccl_ops"]), 2);
}

// ---------------------------------------------------------------- cost

#[test]
fn device_work_on_host_memory_is_charged_at_link_bandwidth() {
    let at = |gbps: &str| case("cost", &[("ACLSIM_LINK_GBPS", gbps)]);
    let r25 = at("25");
    let r50 = at("50");
    let b = fact_u64(&r25, "operand_bytes");
    let ns = |r: &Run, k: &str| fact_u64(r, k) as f64;
    // Add over three host-mapped operands reads 2 b and writes b over the
    // link; full duplex: the busier direction, k = 2 b, sets the time
    let k = 2 * b;
    for (r, gbps) in [(&r25, 25.0), (&r50, 50.0)] {
        let host = ns(r, "host_add_ns");
        assert!(
            host >= link_ns(k, gbps),
            "Add over {k} host bytes took {host} ns < k/link at {gbps} GB/s"
        );
        assert!(
            host <= link_ns(k, gbps) + 5_000.0 + 1.0,
            "only the link and the launch: {host}"
        );
        let copy = ns(r, "host_to_hbm_copy_ns");
        assert!(
            copy >= link_ns(b, gbps),
            "D2D copy out of host memory {copy} ns"
        );
        let set = ns(r, "host_memset_ns");
        assert!(set >= link_ns(b, gbps), "memset of host memory {set} ns");
    }
    // the link, not HBM, decides: twice the bandwidth, half the time
    let ratio = ns(&r25, "host_add_ns") / ns(&r50, "host_add_ns");
    assert!((ratio - 2.0).abs() < 0.02, "25 vs 50 GB/s ratio {ratio}");
    // the same Add in HBM runs at HBM bandwidth (800 GB/s on the 910b4 preset)
    let hbm = ns(&r25, "hbm_add_ns");
    assert!(hbm < ns(&r25, "host_add_ns") / 15.0, "HBM Add {hbm} ns");
    assert!(ns(&r25, "hbm_to_hbm_copy_ns") < ns(&r25, "host_to_hbm_copy_ns") / 20.0);
    // statistics per class of work
    assert_eq!(r25.stat_u64(&["host_mapped", "read_bytes", "op"]), 2 * b);
    assert_eq!(r25.stat_u64(&["host_mapped", "write_bytes", "op"]), b);
    assert_eq!(r25.stat_u64(&["host_mapped", "read_bytes", "copy"]), b);
    assert_eq!(r25.stat_u64(&["host_mapped", "write_bytes", "memset"]), b);
}

#[test]
fn phantom_mode_costs_host_memory_the_same() {
    let real = case("cost", &[]);
    let phantom = case("cost", &[("ACLSIM_PHANTOM", "1")]);
    for k in [
        "host_add_ns",
        "hbm_add_ns",
        "host_to_hbm_copy_ns",
        "host_memset_ns",
    ] {
        assert_eq!(real.fact(k), phantom.fact(k), "{k}");
    }
    assert_eq!(
        real.stat_u64(&["host_mapped", "read_bytes", "op"]),
        phantom.stat_u64(&["host_mapped", "read_bytes", "op"])
    );
}

// ---------------------------------------------------------------- capacity

#[test]
fn host_handles_do_not_take_hbm() {
    let r = case("capacity", &[("ACLSIM_HBM_BYTES", "64M")]);
    let total = fact_u64(&r, "hbm_total");
    assert_eq!(total, 64 * MIB);
    assert_eq!(
        fact_u64(&r, "host_handle_bytes"),
        4 * total,
        "host handles of 4x HBM"
    );
    assert_eq!(
        fact_u64(&r, "hbm_free_with_host_handles"),
        total,
        "{}",
        r.stdout
    );
    assert_eq!(
        fact_i64(&r, "hbm_alloc_all_rc"),
        0,
        "all of HBM is still allocatable"
    );
    assert_eq!(fact_u64(&r, "hbm_free_after_alloc"), 0);
    assert_eq!(fact_u64(&r, "last_byte"), 0x5a);
    assert_eq!(r.stat_u64(&["host_mapped", "phys_peak_bytes"]), 4 * total);
    assert_eq!(r.stat_u64(&["devices", "0", "peak_bytes"]), total);
}

#[test]
fn host_handles_are_bounded_by_aclsim_host_bytes() {
    let r = run(
        "hostmem_app",
        &["--case", "capacity"],
        &[("ACLSIM_HBM_BYTES", "64M"), ("ACLSIM_HOST_BYTES", "128M")],
    );
    assert_eq!(
        r.code, 2,
        "256 MiB of host handles under a 128 MiB limit:\n{}\n{}",
        r.stdout, r.stderr
    );
    assert!(r.stderr.contains("ACL error 207001"), "{}", r.stderr);
    assert!(
        r.stderr.contains("ACLSIM_HOST_BYTES"),
        "the message names the limit:\n{}",
        r.stderr
    );
    assert_eq!(r.stat_u64(&["failed_allocs"]), 1);
    assert_eq!(r.stat_u64(&["host_mapped", "limit_bytes"]), 128 * MIB);

    let bad = run(
        "hostmem_app",
        &["--case", "roundtrip"],
        &[("ACLSIM_HOST_BYTES", "lots")],
    );
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr.contains("ACLSIM_HOST_BYTES") && bad.stderr.contains("ACL error 100000"),
        "{}",
        bad.stderr
    );

    let inj = run(
        "hostmem_app",
        &["--case", "roundtrip"],
        &[("ACLSIM_FAULTS", "phys:1")],
    );
    assert_eq!(inj.code, 2);
    assert!(
        inj.stderr.contains("ACL error 207001"),
        "an injected phys fault hits host handles too:\n{}",
        inj.stderr
    );
}

// ---------------------------------------------------------------- errors and faults

#[test]
fn host_handle_misuse_gets_the_pinned_codes() {
    let r = case("errors", &[]);
    assert_eq!(fact_u64(&r, "granularity"), 2 * MIB);
    codes(
        &r,
        &[
            ("granularity_rc", 0),
            ("bad_location_unregistered", 100000),
            ("bad_location_3", 100000),
            ("bad_numa_node", 107000),
            ("hbm_attr_on_host", 107000),
            ("huge1g_on_host", 107000),
            ("unsupported_attr", 100000),
            ("ddr_attr_on_device", 100000),
            ("size_not_multiple", 100000),
            ("size_zero", 100000),
            ("host_location", 0),
            ("map", 0),
            ("double_map_same_va", 107000),
            ("map_same_handle_twice", 0),
            ("map_unaligned", 107008),
            ("map_size_mismatch", 100000),
            ("free_while_mapped", 207002),
            ("release_while_mapped", 107000),
            ("unmap_nothing", 107000),
            ("unmap_interior", 107000),
            ("unmap", 0),
            ("unmap_again", 107000),
            ("unmap_second", 0),
            ("free", 0),
            ("map_freed_handle", 107017),
            ("free_again", 107017),
            ("free_h2", 0),
            ("release", 0),
            ("no_context", 107002),
        ],
    );
}

#[test]
fn unmapped_memory_next_to_a_host_mapped_range_still_faults() {
    let r = case("fault", &[]);
    codes(
        &r,
        &[
            ("inside_sync", 0),
            ("straddle_sync", 507053),
            ("beyond_sync", 507053),
            ("memset_beyond", 507053),
            ("memset_inside", 0),
        ],
    );
    assert_eq!(r.stat_u64(&["mmu_faults"]), 3);
    assert!(
        r.stderr
            .contains("aclopExecuteV2(Add) wrote unmapped device memory"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("aclopExecuteV2(Add) read unmapped device memory"),
        "{}",
        r.stderr
    );
}

// ---------------------------------------------------------------- managed memory

#[test]
fn managed_memory_round_trips_with_prefetch_and_advise() {
    let r = case("managed", &[]);
    let f = |k: &str| fact_i64(&r, k);
    assert_eq!(
        r.fact("managed_ptr").as_deref(),
        Some("0x90000000000"),
        "the documented UVM range"
    );
    // preferred location host: type ACL_MEM_LOCATIONTYPE_HOST (2), id -1
    assert_eq!((f("pref_type"), f("pref")), (2, -1));
    let page_bytes = 8 * MIB;
    let link = link_ns(page_bytes, 25.0);
    // prefetch to the device moves 8 MiB at link bandwidth, ordered on the stream
    assert!(
        (f("prefetch_to_device_ns") as f64 - link).abs() < 2.0,
        "{}",
        r.stdout
    );
    assert_eq!((f("last_prefetch_type"), f("last_prefetch")), (1, 0));
    assert_eq!(
        f("device_result_mismatches"),
        0,
        "device reads what the host wrote"
    );
    assert_eq!(
        f("resident_add_ns"),
        f("hbm_add_ns"),
        "resident pages cost HBM time"
    );
    assert!((f("prefetch_to_host_ns") as f64 - link).abs() < 2.0);
    assert_eq!(
        f("host_read_mismatches"),
        0,
        "host reads what the device wrote"
    );
    assert_eq!(f("prefetch_again_ns"), 0, "nothing to move");
    // pages on the host touched by the device: migrated first
    assert!(
        (f("migrating_add_ns") - f("hbm_add_ns")) as f64 >= link - 2.0,
        "{}",
        r.stdout
    );
    // accessed-by: read in place over the link (both operands: 16 MiB)
    assert_eq!(r.fact("accessed_by").as_deref(), Some("0,-2,-2"));
    assert!(
        f("remote_add_ns") as f64 >= link_ns(16 * MIB, 25.0),
        "{}",
        r.stdout
    );
    assert_eq!(f("remote_result_mismatches"), 0);
    assert_eq!((f("read_mostly"), f("read_mostly_after_unset")), (1, 0));
    assert_eq!(r.fact("attrs").as_deref(), Some("2,0"));
    assert_eq!(f("batch_last_prefetch"), 1);
    assert_eq!(f("copy_roundtrip_equal"), 1);
    assert_eq!(
        f("use_after_free_sync"),
        507053,
        "freed managed memory faults"
    );
    // statistics
    assert_eq!(r.stat_u64(&["allocs", "managed"]), 2);
    assert_eq!(
        r.stat_u64(&["allocs", "managed_bytes"]),
        16 * MIB - 1,
        "as requested"
    );
    assert_eq!(
        r.stat_u64(&["managed", "peak_bytes"]),
        16 * MIB,
        "rounded to 2 MiB"
    );
    assert_eq!(r.stat_u64(&["managed", "bytes"]), 0);
    assert_eq!(r.stat_u64(&["managed", "prefetches"]), 4);
    // to device, to host, nothing, then the batch moves r (8 MiB; m is already there)
    assert_eq!(r.stat_u64(&["managed", "prefetch_bytes"]), 24 * MIB);
    assert_eq!(r.stat_u64(&["managed", "migrated_bytes"]), 8 * MIB);
    assert_eq!(r.stat_u64(&["managed", "remote_bytes"]), 16 * MIB);
    assert_eq!(r.stat_u64(&["managed", "device_resident_bytes"]), 0);
    assert_eq!(
        r.stat_u64(&["managed", "device_resident_peak_bytes"]),
        16 * MIB
    );
    // managed memory is not HBM
    assert_eq!(r.stat_u64(&["devices", "0", "peak_bytes"]), 10 * MIB);
}

#[test]
fn managed_memory_misuse_gets_the_pinned_codes() {
    let r = case("managed_errors", &[]);
    codes(
        &r,
        &[
            ("alloc_null", 100000),
            ("alloc_flag0", 100000),
            ("alloc_size0", 107000),
            ("alloc_too_big", 207001),
            ("advise_null", 100000),
            ("advise_size0", 100000),
            ("advise_bad_type", 107000),
            ("advise_bad_device", 107000),
            ("advise_bad_location", 107000),
            ("advise_unaligned_size", 107000),
            ("advise_device_memory", 107000),
            ("advise_past_end", 107000),
            ("prefer_host_when_on_device", 107000),
            ("prefer_device_when_on_device", 0),
            ("prefetch_null", 100000),
            ("prefetch_size0", 100000),
            ("prefetch_flags", 100000),
            ("prefetch_bad_location", 107000),
            ("prefetch_bad_device", 107000),
            ("prefetch_unaligned_size", 107000),
            ("prefetch_device_memory", 107000),
            ("prefetch_bad_stream", 107000),
            ("getattr_null_data", 100000),
            ("getattr_bad_attr", 107000),
            ("getattr_bad_size", 107000),
            ("getattr_device_memory", 107000),
            ("batch_idx0", 107000),
            ("free_interior", 107000),
            ("free", 0),
            ("free_again", 107000),
            ("advise_freed", 107000),
            ("alloc_no_context", 107002),
        ],
    );
}
