//! The runtime calls torch_npu makes beyond the foundation's, driven by
//! tests/apps/torch_surface.c: device settings, stream failure mode, forced
//! stream destruction, device synchronisation with a timeout, a VA
//! reservation before any device is set, compile options, system parameters,
//! the real "not supported" codes, and the libruntime/libprofapi stand-ins
//! reached through libascendcl's dependency tree. (The torch_npu tier,
//! tests/torch_npu.rs, runs them under real torch_npu.)

mod common;
use common::run;

#[test]
fn torch_npu_runtime_surface_behaves_like_cann() {
    let r = run("torch_surface", &[], &[("ACLSIM_DEVICES", "2")]).must_succeed();
    let expect: &[(&str, &str)] = &[
        ("sat_mode_no_device", "107002"), // needs a context
        ("reserve_no_device", "0"),       // a driver-level VA reservation does not
        ("release_no_device", "0"),
        ("sysparam_set_no_device", "0"),      // process-wide
        ("ctx_sysparam_no_device", "107002"), // per context
        ("sat_infnan", "0"),
        ("sat_saturation", "207000"), // ACL_ERROR_RT_FEATURE_NOT_SUPPORT
        ("sat_bad", "100000"),
        ("sat_mode", "1"), // ACL_RT_OVERFLOW_MODE_INFNAN
        ("exec_timeout", "0"),
        ("exec_timeout_v2", "0"),
        ("exec_timeout_v2_actual", "1500000"),
        ("exec_timeout_v2_null", "100000"),
        ("wait_timeout", "0"),
        ("sysparam_value", "1"),
        ("ctx_sysparam_value", "1"), // no override yet: the process value
        ("ctx_sysparam_value2", "0"), // the context's own
        ("sysparam_bad_value", "100000"),
        ("sysparam_bad_opt", "100000"),
        ("compileopt_set", "0"),
        ("compileopt_size", "8"), // "disable" + NUL
        ("compileopt_value", "disable"),
        ("compileopt_small_buffer", "100000"),
        ("compileopt_unset_size", "1"),
        ("aicore_num", "20"), // Ascend910B4
        ("l2_size", "100663296"),
        ("cap_bad_device", "107001"),
        ("peer_0_1", "1"),
        ("peer_0_0", "0"),
        ("enable_peer", "0"),
        ("enable_peer_flags", "100000"),
        ("bare_tgid_is_pid", "1"),
        ("process_report", "107012"), // ACL_ERROR_RT_THREAD_SUBSCRIBE
        ("recent_err_names_call", "1"),
        ("recent_err_again_null", "1"),
        ("binary_load", "207000"),
        ("export_shareable", "207000"),
        ("init_dump", "207000"),
        ("rt_found", "1"),
        ("rt_kernel_launch", "207000"),
        ("msprof_hash_stable", "1"),
        ("failure_mode_null_stream", "100000"),
        ("failure_mode_bad", "100000"),
        ("failure_mode_stop", "0"),
        ("stop_sync", "507053"),            // the fault is reported...
        ("stop_discarded_later_work", "1"), // ...and later work was discarded
        ("stop_sync_after", "0"),
        ("stop_runs_after_sync", "1"),
        ("continue_sync", "507053"),
        ("continue_ran_later_work", "1"),
        ("sync_device_timeout", "507046"), // ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        ("sync_device_timeout_bad", "100000"),
        ("sync_device_wait", "0"),
        ("destroy_force", "0"),
        ("force_discarded_queued", "1"),
        ("destroy_force_again", "107000"),
    ];
    let facts = common::facts(&r.stdout);
    let mut bad = Vec::new();
    for (k, want) in expect {
        match facts.get(*k) {
            Some(v) if v == want => {}
            got => bad.push(format!("{k}: want {want}, got {got:?}")),
        }
    }
    assert!(
        bad.is_empty(),
        "{}\nstdout:\n{}\nstderr:\n{}",
        bad.join("\n"),
        r.stdout,
        r.stderr
    );
    assert_eq!(r.stat_u64(&["mmu_faults"]), 2, "{}", r.stats);
    assert_eq!(r.stat_u64(&["allocs", "malloc"]), 1, "{}", r.stats);
    assert_eq!(r.stat_u64(&["allocs", "phys"]), 1, "{}", r.stats);
    assert_eq!(r.stat_u64(&["allocs", "reserve"]), 2, "{}", r.stats);
}

/// The aclnn operators added for PyTorch training, found by dlsym on
/// libopapi.so as op-plugin finds them, against a double-precision reference
/// (tests/apps/optest_nn.c).
#[test]
fn training_operators_compute_real_results() {
    let r = run("optest_nn", &[], &[]).must_succeed();
    let facts = common::facts(&r.stdout);
    for case in [
        "log_softmax",
        "nll_loss",
        "loss_grad",
        "addmm",
        "foreach",
        "adamw",
        "gelu",
    ] {
        let key = format!("{case}_err");
        let err: f64 = facts
            .get(&key)
            .unwrap_or_else(|| panic!("no {key} in:\n{}\nstderr:\n{}", r.stdout, r.stderr))
            .parse()
            .unwrap();
        assert!(
            err < 1e-5,
            "{case}: max error {err} against the reference\n{}",
            r.stdout
        );
    }
    assert_eq!(
        facts.get("cast_trunc").map(String::as_str),
        Some("2,-2,1000,0"),
        "{}",
        r.stdout
    );
    assert_eq!(
        facts.get("int64_add_exact").map(String::as_str),
        Some("1"),
        "{}",
        r.stdout
    );
    assert!(r.stat_u64(&["ops"]) >= 10, "{}", r.stats);
    assert_eq!(r.stat_u64(&["mmu_faults"]), 0, "{}", r.stats);
}
