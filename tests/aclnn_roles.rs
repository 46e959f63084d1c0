//! u3m's aclnn operator roles (core/src/roles: which tensors an operator
//! writes) against what the simulator writes, on the C programs that reach
//! aclnn operators through dlsym (as op-plugin does) or the four operators
//! libu3m.so exports (optest_llm's gelu, foreach_v1 and attention call
//! libopapi through the PLT: u3m does not see them). Every operator the simulator implements
//! is checked through torch_npu in tests/torch_npu.rs
//! (`operator_roles_cover_what_the_simulator_writes`).

mod common;
#[path = "common/writes.rs"]
mod writes;

use common::{libu3m, run};

/// Runs `prog args` under libu3m.so in observe mode with a trace and the
/// simulator's write log; the launches checked.
fn checked(prog: &str, args: &[&str]) -> usize {
    let name = format!("roles-{prog}-{}", args[0]);
    let dir = common::scratch(&name);
    let trace = dir.join("trace.txt");
    let log = dir.join("writes.txt");
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_file(&log);
    let lib = libu3m();
    let env: Vec<(&str, &str)> = vec![
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("U3M_SHM_DIR", dir.to_str().unwrap()),
        ("U3M_MODE", "observe"),
        ("U3M_TRACE", trace.to_str().unwrap()),
        ("U3M_TRACE_LOSSLESS", "1"),
        ("ACLSIM_WRITES_LOG", log.to_str().unwrap()),
    ];
    let r = run(prog, args, &env);
    assert_eq!(r.code, 0, "{prog} {args:?}: {}", r.stderr);
    let t = std::fs::read_to_string(&trace).expect("trace");
    let w = std::fs::read_to_string(&log).expect("writes log");
    match writes::check(&t, &w) {
        Ok(n) => n,
        Err(bad) => panic!("{prog} {args:?}:\n{}", bad.join("\n")),
    }
}

#[test]
fn what_aclnn_operators_write_is_marked_written() {
    let mut n = 0;
    for (prog, args) in [
        // optest_nn takes no arguments (the label names its scratch dir)
        ("optest_nn", &["all"][..]),
        ("optest_aclnn", &["add"][..]),
        ("optest_aclnn", &["mul"][..]),
        ("optest_aclnn", &["inplace"][..]),
        ("optest_aclnn", &["matmul_t", "5", "6", "3"][..]),
        ("optest_aclnn", &["bmm", "2", "3", "4", "5"][..]),
        ("optest_aclnn", &["softmax", "3", "7", "1"][..]),
        ("optest_llm", &["wide_launch", "24", "0"][..]),
    ] {
        n += checked(prog, args);
    }
    assert!(n >= 20, "only {n} launches checked");
}

/// A view into a large buffer (a KV-cache append writes one slot) is an
/// access to its own bytes, not to its whole storage: the trace shows the
/// view's extent (u3m once took every tensor's whole storage footprint, so a
/// one-slot append dirtied, and copied back out, the whole cache).
#[test]
fn a_view_is_its_extent_not_its_storage() {
    let dir = common::scratch("roles-view");
    let trace = dir.join("trace.txt");
    let _ = std::fs::remove_file(&trace);
    let lib = libu3m();
    let env: Vec<(&str, &str)> = vec![
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("U3M_SHM_DIR", dir.to_str().unwrap()),
        ("U3M_MODE", "observe"),
        ("U3M_TRACE", trace.to_str().unwrap()),
        ("U3M_TRACE_LOSSLESS", "1"),
    ];
    // 1 MiB (262144 floats) at 10 MiB (element 2621440) of 16 MiB
    let r = run("optest_llm", &["view_write", "2621440", "262144"], &env);
    assert_eq!(
        (r.code, r.fact("view_rc").as_deref()),
        (0, Some("0")),
        "{}",
        r.stderr
    );
    let base = u64::from_str_radix(&r.fact("base").unwrap(), 16).unwrap();
    let t = std::fs::read_to_string(&trace).expect("trace");
    let op = t
        .lines()
        .find(|l| l.starts_with("O aclnnInplaceZero "))
        .unwrap_or_else(|| panic!("no aclnnInplaceZero in the trace:\n{t}"));
    let want = format!("{:#x}:{}", base + (10 << 20), 1 << 20);
    assert!(op.contains(&want), "{op}: expected the view {want}");
}
