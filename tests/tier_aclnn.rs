//! aclnn launches under libu3m.so in tier mode whose tensors touch no memory
//! (tests/apps/optest_llm.c `empty_launch`): torch_npu launches operators on
//! empty tensors (`zero_` of an empty gradient in a transformer's backward),
//! and the stock runtime accepts them. The operator is reached through
//! dlopen + dlsym, as op-plugin does.

mod common;
use common::{libu3m, run};

/// `empty_launch MIB` on a 16 MiB device, stock or under libu3m.so.
fn empty_launch(live_mib: &str, u3m: bool) -> (i32, String, String) {
    let dir = common::scratch(&format!("tier-aclnn-{live_mib}-{u3m}"));
    let lib = libu3m();
    let mut env: Vec<(&str, &str)> = vec![("ACLSIM_HBM_BYTES", "16M")];
    if u3m {
        env.extend([
            ("LD_PRELOAD", lib.to_str().unwrap()),
            ("U3M_SHM_DIR", dir.to_str().unwrap()),
            ("U3M_MODE", "tier"),
            ("U3M_OVERSUB", "3"),
        ]);
    }
    let r = run("optest_llm", &["empty_launch", live_mib], &env);
    let rc = r.fact("empty_zero").unwrap_or_default();
    (r.code, rc, r.stderr)
}

#[test]
fn empty_tensor_launch_succeeds_when_the_live_tensors_fit() {
    // 8 MiB of live tensors on a 16 MiB device: stock and under libu3m.so
    let (code, rc, err) = empty_launch("8", false);
    assert_eq!((code, rc.as_str()), (0, "0"), "{err}");
    let (code, rc, err) = empty_launch("8", true);
    assert_eq!((code, rc.as_str()), (0, "0"), "under libu3m.so: {err}");
}

// u3m once took a launch whose tensors are all empty (no range) for a
// task-queue launch and made every live tensor resident: 207001
#[test]
fn empty_tensor_launch_succeeds_with_more_live_tensors_than_hbm() {
    let (code, rc, err) = empty_launch("32", true);
    assert_eq!((code, rc.as_str()), (0, "0"), "under libu3m.so: {err}");
}

/// `wide_launch N 200` on a 256 MiB device under libu3m.so: one foreach
/// launch over N + N tensors of 2 MiB (all fitting in HBM at once) after
/// 200 MiB of other data pushed them out.
fn wide_launch(n: &str) -> (i32, String, String, u64) {
    let dir = common::scratch(&format!("tier-aclnn-wide-{n}"));
    let lib = libu3m();
    let env: Vec<(&str, &str)> = vec![
        ("ACLSIM_HBM_BYTES", "256M"),
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("U3M_SHM_DIR", dir.to_str().unwrap()),
        ("U3M_MODE", "tier"),
        ("U3M_OVERSUB", "3"),
    ];
    let r = run("optest_llm", &["wide_launch", n, "200"], &env);
    let facts = format!(
        "launch={} sync={} wrong={}",
        r.fact("launch").unwrap_or_default(),
        r.fact("sync").unwrap_or_default(),
        r.fact("wrong").unwrap_or_default()
    );
    let mmu = r.stats["mmu_faults"].as_u64().unwrap_or(u64::MAX);
    (r.code, facts, r.stderr, mmu)
}

#[test]
fn a_launch_with_48_tensors_is_made_resident() {
    // 24 inputs + 24 outputs (op-plugin's lists hold up to 48 each)
    let (code, facts, err, mmu) = wide_launch("24");
    assert_eq!(
        (code, facts.as_str(), mmu),
        (0, "launch=0 sync=0 wrong=0", 0),
        "{err}"
    );
}

#[test]
fn a_launch_with_80_tensors_is_made_resident() {
    let (code, facts, err, mmu) = wide_launch("40");
    assert_eq!(
        (code, facts.as_str(), mmu),
        (0, "launch=0 sync=0 wrong=0", 0),
        "{err}"
    );
}

/// `optest_aclop wide 80 200` on a 256 MiB device under libu3m.so: one
/// aclopExecuteV2 over 80 inputs of 2 MiB (160 MiB, all fitting in HBM at
/// once) after 200 MiB of other data pushed them out. u3m once kept 64
/// buffers per launch and dropped the rest: a device MMU fault.
#[test]
fn an_aclop_launch_with_80_inputs_is_made_resident() {
    let dir = common::scratch("tier-aclop-wide");
    let lib = libu3m();
    let env: Vec<(&str, &str)> = vec![
        ("ACLSIM_HBM_BYTES", "256M"),
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("U3M_SHM_DIR", dir.to_str().unwrap()),
        ("U3M_MODE", "tier"),
        ("U3M_OVERSUB", "3"),
    ];
    let r = run("optest_aclop", &["wide", "80", "200"], &env);
    let facts = format!(
        "launch={} sync={}",
        r.fact("launch").unwrap_or_default(),
        r.fact("sync").unwrap_or_default()
    );
    let mmu = r.stats["mmu_faults"].as_u64().unwrap_or(u64::MAX);
    assert_eq!(
        (r.code, facts.as_str(), mmu),
        (0, "launch=0 sync=0", 0),
        "{}",
        r.stderr
    );
}

/// `queued_launch MIB` on a 16 MiB device under libu3m.so: an operator whose
/// executor is built on one thread and launched on another (torch_npu's task
/// queue). u3m once made every live tensor resident for such a launch
/// (207001 once they exceed HBM); it now binds the tensors to the executor.
fn queued_launch(live_mib: &str) -> (i32, String, String) {
    let dir = common::scratch(&format!("tier-aclnn-queued-{live_mib}"));
    let lib = libu3m();
    let env: Vec<(&str, &str)> = vec![
        ("ACLSIM_HBM_BYTES", "16M"),
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("U3M_SHM_DIR", dir.to_str().unwrap()),
        ("U3M_MODE", "tier"),
        ("U3M_OVERSUB", "3"),
    ];
    let r = run("optest_llm", &["queued_launch", live_mib], &env);
    let facts = format!(
        "queued={} sync={} wrong={}",
        r.fact("queued").unwrap_or_default(),
        r.fact("sync").unwrap_or_default(),
        r.fact("wrong").unwrap_or_default()
    );
    (r.code, facts, r.stderr)
}

#[test]
fn a_launch_on_another_thread_than_its_build_is_made_resident() {
    for mib in ["8", "32"] {
        let (code, facts, err) = queued_launch(mib);
        assert_eq!(
            (code, facts.as_str()),
            (0, "queued=0 sync=0 wrong=0"),
            "{mib} MiB live: {err}"
        );
    }
}

/// `out_write MODE` (tests/apps/optest_llm.c): aclnnAbs into eight 8 MiB
/// outputs holding a pattern, with 128 MiB live; stock on a 1 GiB device
/// and under libu3m.so on a 64 MiB one. Returns the facts, the hash of
/// every output byte, and the chunks faulted in without their copy-in.
fn out_write(mode: &str) -> (String, String, String, u64) {
    let stock = run(
        "optest_llm",
        &["out_write", mode],
        &[("ACLSIM_HBM_BYTES", "1G")],
    );
    assert_eq!(stock.code, 0, "stock: {}", stock.stderr);
    let (r, s) = common::tier(
        "optest_llm",
        &["out_write", mode],
        &[("ACLSIM_HBM_BYTES", "64M"), ("U3M_OVERSUB", "3")],
    );
    assert_eq!(r.code, 0, "under libu3m.so: {}", r.stderr);
    let facts = format!(
        "launch={} sync={}",
        r.fact("launch").unwrap_or_default(),
        r.fact("sync").unwrap_or_default()
    );
    let over = s["tier"]["overwrites"].as_u64().unwrap_or(u64::MAX);
    let want = stock.fact("hash").unwrap_or_default();
    (facts, r.fact("hash").unwrap_or_default(), want, over)
}

// An aclnn operator's out-of-place output, contiguous and overlapping no
// input, is written whole: its evicted chunks are mapped without their
// copy-in (main 94683cd copied them in: overwrites 0). A strided output
// (every other float) is not: the floats between keep their bytes. With
// every aclnn output taken as whole (the contiguity check dropped), the
// strided run skips 18 copy-ins and its hash differs from stock.
#[test]
fn an_aclnn_output_written_whole_skips_its_copy_in_and_a_strided_one_does_not() {
    let (facts, hash, stock, over) = out_write("contig");
    assert_eq!(facts, "launch=0 sync=0");
    assert_eq!(hash, stock, "contiguous outputs differ from stock");
    assert!(over >= 8, "only {over} copy-ins skipped");
    let (facts, hash, stock, over) = out_write("strided");
    assert_eq!(facts, "launch=0 sync=0");
    assert_eq!(hash, stock, "strided outputs differ from stock");
    assert_eq!(over, 0, "a strided output skipped its copy-in");
}
