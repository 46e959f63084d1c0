//! Contexts and device references on the simulator (tests/apps/ctx_switch.c):
//! the runtime's context contract, and u3m's device switches leaving a
//! thread's own context and CANN's device reference counts as they were.

mod common;
use common::{run, tier, Run};

/// Device references left at exit, per device (ACLSIM_STATS `device_refs`).
fn device_refs(r: &Run) -> Vec<u64> {
    r.stats["device_refs"]
        .as_array()
        .unwrap_or_else(|| panic!("no device_refs in {}", r.stats))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn the_simulator_keeps_contexts_per_thread_and_counts_device_references() {
    let r = run("ctx_switch", &["sim"], &[("ACLSIM_DEVICES", "2")]).must_succeed();
    let want = [
        ("refs_after_two_sets", "2"),
        ("create_context", "0"),
        ("created_is_current", "1"),
        ("created_device", "1"),
        ("create_takes_no_ref", "1"),
        ("copy_on_ctx_stream", "0"),
        ("sync_ctx_stream", "0"),
        ("copy_on_ctx_default_stream", "0"),
        ("sync_ctx_default_stream", "0"),
        ("set_default_ctx", "0"),
        ("default_ctx_device", "0"),
        // a stream of device 1's context from device 0: refused
        ("ctx_stream_from_device0", "107003"),
        ("set_own_ctx", "0"),
        ("set_device_leaves_ctx", "1"),
        ("refs_dev1", "1"),
        ("destroy_default_ctx", "100000"),
        ("destroy_ctx", "0"),
        ("get_ctx_after_destroy", "107002"),
        ("other_thread_malloc_after_destroy", "107002"),
        // the context's streams went with it
        ("ctx_stream_after_destroy", "107000"),
        ("set_destroyed_ctx", "100000"),
        ("destroy_twice", "100000"),
        ("refs_dev1_after_reset", "0"),
        ("refs_dev0_after_one_reset", "2"),
        ("refs_dev0_after_three_resets", "0"),
        ("reset_extra", "0"),
        ("refs_dev0_never_negative", "0"),
    ];
    for (k, v) in want {
        assert_eq!(r.fact(k).as_deref(), Some(v), "{k}\n{}", r.stdout);
    }
    let refs = device_refs(&r);
    assert_eq!(refs, [0, 0]);
}

/// A thread on device 1 in a context of its own makes u3m bring device-0
/// buffers back on device 0's stream (peer copies of evicted buffers): after
/// every copy its context is still its own, and the device references are
/// the program's (one aclrtSetDevice per device; none left at exit), not
/// one more per switch u3m made. u3m's own streams on device 1 are not
/// created in the thread's context: they survive its aclrtDestroyContext.
#[test]
fn u3m_device_switches_keep_the_callers_context_and_take_no_device_reference() {
    let env = [
        ("ACLSIM_DEVICES", "2"),
        ("ACLSIM_HBM_BYTES", "64M"),
        ("U3M_OVERSUB", "3"),
    ];
    let (r, s) = tier("ctx_switch", &["cross"], &env);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let fact = |k: &str| {
        r.fact(k)
            .unwrap_or_else(|| panic!("no {k} in\n{}", r.stdout))
    };
    // the copies crossed devices through u3m: device 0's buffers were evicted
    assert!(s["tier"]["evictions"].as_u64().unwrap() > 0, "{s}");
    assert!(s["tier"]["faults_in"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(fact("verified"), "24");
    assert_eq!(fact("ctx_lost"), "0", "{}", r.stderr);
    assert_eq!(fact("stream_ok"), "24");
    assert_eq!(fact("main_device"), "0");
    assert_eq!(fact("in_ctx_verified"), "16");
    assert_eq!(fact("after_destroy_verified"), "16", "{}", r.stderr);
    assert!(
        !r.stderr.contains("destroyed with it"),
        "u3m's streams were made in the program's context:\n{}",
        r.stderr
    );
    assert_eq!(
        (fact("refs_dev0"), fact("refs_dev1")),
        ("1".into(), "1".into())
    );
    let refs = device_refs(&r);
    assert_eq!(refs, [0, 0], "device references left at exit");
}

/// A thread whose only context is one it made on device 1 (no
/// aclrtSetDevice): u3m's calls on it are device 1's (aclrtCreateContext
/// is hooked for the thread's device), so its memory is tiered on device 1
/// and reads back intact. u3m itself takes one reference on device 1 for
/// the process's life: the device's default context, where its own streams
/// live (the program never set the device, so u3m could not learn it).
#[test]
fn a_thread_on_a_context_it_made_is_tiered_on_that_contexts_device() {
    let env = [
        ("ACLSIM_DEVICES", "2"),
        ("ACLSIM_HBM_BYTES", "64M"),
        ("U3M_OVERSUB", "3"),
    ];
    let (r, s) = tier("ctx_switch", &["created"], &env);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.fact("created_verified").as_deref(), Some("16"));
    assert!(s["tier"]["evictions"].as_u64().unwrap() > 0, "{s}");
    let peak = |d: usize| r.stat_u64(&["devices", &d.to_string(), "peak_bytes"]);
    assert_eq!(peak(0), 0, "nothing on device 0");
    assert!(
        peak(1) > 0 && peak(1) <= 64 << 20,
        "device 1's peak {}",
        peak(1)
    );
    let refs = device_refs(&r);
    assert_eq!(refs, [0, 1], "u3m's one reference on device 1");
}

/// aclrtResetDevice drops one reference: the device and its memory stay
/// while another is held (CANN releases at zero). A second thread's
/// aclrtSetDevice + aclrtResetDevice must not make u3m forget device 0's
/// managed memory that the main thread, still holding the device, then
/// reads back — including the buffers u3m had moved to the host.
#[test]
fn a_threads_reset_with_the_device_still_held_loses_nothing() {
    let env = [("ACLSIM_HBM_BYTES", "64M"), ("U3M_OVERSUB", "4")];
    let (r, s) = tier("ctx_switch", &["shared"], &env);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(s["tier"]["evictions"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(r.fact("other_reset").as_deref(), Some("0"));
    assert_eq!(r.fact("refs_after_other_reset").as_deref(), Some("1"));
    assert_eq!(
        r.fact("shared_verified").as_deref(),
        Some("24"),
        "{}",
        r.stderr
    );
}

/// aclrtResetDeviceForce drops every reference to the device at once, and
/// the device's memory with them: the simulator releases it (the program's
/// second fill fits again; an old buffer no longer reads back), and u3m
/// forgets the chunks it managed there. Before u3m hooked the call it still
/// counted the old buffers (free_after_force 64 MiB of 256), read one old
/// buffer from its host copy, and refused the second fill (207001).
#[test]
fn a_forced_reset_releases_the_device_for_the_runtime_and_for_u3m() {
    fn check(r: &Run) {
        assert_eq!(r.fact("refs_after_force").as_deref(), Some("0"));
        let total = r.fact("total").unwrap();
        assert_eq!(
            r.fact("free_after_force"),
            Some(total),
            "{}\n{}",
            r.stdout,
            r.stderr
        );
        let old = r.fact("old_read").unwrap();
        assert!(
            old.split(',').all(|e| e != "0"),
            "an old buffer read back after the forced reset: {old}"
        );
        assert_eq!(
            r.fact("force_verified").as_deref(),
            Some("24"),
            "{}",
            r.stderr
        );
    }
    // stock: 24 x 8 MiB fit in 256 MiB only if the reset released the first 24
    let r = run("ctx_switch", &["force"], &[("ACLSIM_HBM_BYTES", "256M")]).must_succeed();
    check(&r);
    let env = [("ACLSIM_HBM_BYTES", "64M"), ("U3M_OVERSUB", "4")];
    let (r, s) = tier("ctx_switch", &["force"], &env);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(s["tier"]["evictions"].as_u64().unwrap() > 0, "{s}");
    check(&r);
}

/// u3m's own reference on a device (taken for its default context while
/// the program's thread was on a context it made) goes with the program's
/// last aclrtResetDevice: otherwise the runtime keeps the device, and the
/// memory u3m forgets at that reset stays allocated. Before, the runtime
/// still counted 1 reference after the reset and the program's next fill was
/// refused (207001: 0 B of HBM left to managed memory).
#[test]
fn u3ms_own_device_reference_goes_with_the_programs_last_reset() {
    let env = [
        ("ACLSIM_DEVICES", "2"),
        ("ACLSIM_HBM_BYTES", "64M"),
        ("U3M_OVERSUB", "4"),
    ];
    let (r, s) = tier("ctx_switch", &["reown"], &env);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(s["tier"]["evictions"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(r.fact("refs_after_reset").as_deref(), Some("0"));
    assert_eq!(
        r.fact("reown_verified").as_deref(),
        Some("32"),
        "{}",
        r.stderr
    );
}
