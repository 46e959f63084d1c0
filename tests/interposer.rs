//! libu3m.so in observe mode, in front of the simulated runtime: exports match
//! the hook table, lookups through library handles end at u3m's wrappers while
//! everything else resolves as without u3m, every workload program behaves
//! bit-for-bit the same with and without LD_PRELOAD, a forked child starts
//! clean, and bad configuration falls back to pass-through.

mod common;
use common::{libu3m, run, Run};
use std::collections::BTreeSet;
use std::path::Path;

/// Runs a program under libu3m.so (observe mode, segments in a private dir).
fn run_u3m(prog: &str, args: &[&str], env: &[(&str, &str)]) -> (Run, std::path::PathBuf) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = common::scratch(&format!("shm-{prog}-{n}"));
    let lib = libu3m();
    let mut e: Vec<(&str, &str)> = vec![
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("U3M_SHM_DIR", dir.to_str().unwrap()),
    ];
    if !env.iter().any(|(k, _)| *k == "U3M_MODE") {
        e.push(("U3M_MODE", "observe"));
    }
    e.extend_from_slice(env);
    (run(prog, args, &e), dir)
}

fn table_names() -> BTreeSet<String> {
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/hooks/table.rs"))
            .unwrap();
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("fn "))
        .map(|l| l.split('(').next().unwrap().trim().to_string())
        .collect()
}

#[test]
fn exports_match_the_hook_table() {
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(libu3m())
        .output()
        .expect("nm");
    assert!(out.status.success());
    let exported: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && (f[1] == "T" || f[1] == "W"))
                .then(|| f[2].split('@').next().unwrap().to_string())
        })
        .collect();
    let table = table_names();
    assert!(table.len() >= 80, "hook table has {} entries", table.len());
    let missing: Vec<_> = table.difference(&exported).collect();
    assert!(missing.is_empty(), "hooks not exported: {missing:?}");
    let mut allowed = table.clone();
    allowed.insert("dlsym".into());
    allowed.insert("dlvsym".into());
    allowed.insert("dlclose".into());
    // u3m's own C API (src/api.rs, docs/api.md)
    allowed.insert("u3m_discard".into());
    let extra: Vec<_> = exported.difference(&allowed).collect();
    assert!(
        extra.is_empty(),
        "exported but not in the hook table: {extra:?}"
    );
}

#[test]
fn handle_lookups_end_at_u3m_and_the_rest_resolves_as_without_it() {
    let plain = run("dlsym_loader", &[], &[]).must_succeed();
    let (hooked, _) = run_u3m("dlsym_loader", &[], &[]);
    let hooked = hooked.must_succeed();
    let f = |r: &Run, k: &str| {
        r.fact(k)
            .unwrap_or_else(|| panic!("{k} missing:\n{}", r.stdout))
    };
    // torch_npu's ways of loading functions end at u3m's wrappers
    for k in [
        "handle_aclrtMallocAlign32",
        "handle_aclrtFree",
        "opapi_aclnnAdd",
        // the build phase of an operator whose prototype u3m knows
        // (src/hooks/aclnn_bind.rs)
        "opapi_aclnnAddGetWorkspaceSize",
        "opapi_aclCreateTensor",
    ] {
        assert_eq!(f(&hooked, k), "libu3m.so", "{k}");
        assert_ne!(f(&plain, k), "libu3m.so", "{k}");
    }
    assert_eq!(f(&plain, "handle_aclrtMallocAlign32"), "libascendcl.so");
    assert_eq!(f(&plain, "opapi_aclnnAdd"), "libopapi.so");
    assert_eq!(f(&plain, "opapi_aclnnAddGetWorkspaceSize"), "libopapi.so");
    assert_eq!(f(&plain, "opapi_aclCreateTensor"), "libnnopbase.so");
    // RTLD_NEXT is resolved relative to the real caller (here the program:
    // the next definition after it is u3m's own export, as for any preloaded
    // library) — not relative to u3m, which would find nothing here
    assert_eq!(f(&hooked, "next_aclrtMalloc"), "libu3m.so");
    assert_eq!(f(&plain, "next_aclrtMalloc"), "null");
    // everything else: exactly as without u3m
    for k in [
        "default_aclrtMalloc",
        "next_printf",
        "handle_missing",
        "default_missing",
        "handle_not_acl",
        "dlvsym_next_printf",
    ] {
        assert_eq!(f(&hooked, k), f(&plain, k), "{k}");
    }
    assert_eq!(f(&hooked, "next_printf"), "libc.so.6");
    assert_eq!(f(&hooked, "handle_missing"), "null");
    assert_eq!(f(&hooked, "stable"), "1");
    // and the wrappers work
    for k in ["init", "setdev", "malloc", "free", "free_again"] {
        assert_eq!(f(&hooked, k), f(&plain, k), "{k}");
    }
}

/// The programs, with arguments that keep each run short.
fn programs(trace: &str) -> Vec<(&'static str, Vec<String>, Vec<(&'static str, &'static str)>)> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        ("mlp_train", s(&["--steps", "5"]), vec![]),
        (
            "kv_decode",
            s(&["--requests", "2", "--decode", "4"]),
            vec![],
        ),
        ("dlsym_app", s(&[]), vec![]),
        ("vmm_app", s(&[]), vec![]),
        (
            "allreduce_app",
            s(&["--steps", "4"]),
            vec![("ACLSIM_DEVICES", "2")],
        ),
        ("acl_replay", vec![trace.to_string()], vec![]),
        ("mt_stress", s(&["--iters", "200"]), vec![]),
        ("rtcheck", s(&["errors"]), vec![]),
        (
            "rtcheck",
            s(&["capacity"]),
            vec![("ACLSIM_HBM_BYTES", "256M")],
        ),
        ("rtcheck", s(&["race"]), vec![]),
        ("rtcheck", s(&["events"]), vec![]),
        (
            "rtcheck",
            s(&["faults"]),
            vec![(
                "ACLSIM_FAULTS",
                "malloc:2,copy:1,memset:2,phys:2,map:1,host:1",
            )],
        ),
        (
            "rtcheck",
            s(&["lose"]),
            vec![("ACLSIM_DEVICES", "2"), ("ACLSIM_FAULTS", "lose:1@3")],
        ),
        ("rtcheck", s(&["mmu"]), vec![]),
        ("optest_aclnn", s(&["add"]), vec![]),
        ("optest_aclnn", s(&["inplace"]), vec![]),
        ("optest_aclnn", s(&["errors"]), vec![]),
        ("optest_aclop", s(&["errors"]), vec![]),
        ("optest_aclop", s(&["flops", "2800000000000"]), vec![]),
    ]
}

/// Simulator statistics that depend on thread interleaving (mt_stress runs
/// 8 racing threads; its simulated per-stream clocks vary run to run).
fn comparable_stats(prog: &str, v: &serde_json::Value) -> serde_json::Value {
    let mut v = v.clone();
    if prog == "mt_stress" {
        v["sim_ns"] = serde_json::Value::Null;
        v["host_sim_ns"] = serde_json::Value::Null;
        v["streams"] = serde_json::Value::Null;
        v["devices"][0]["peak_bytes"] = serde_json::Value::Null;
    }
    v
}

#[test]
fn observe_mode_is_bit_for_bit_transparent() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/traces/multistream.trace");
    for (prog, args, env) in programs(trace.to_str().unwrap()) {
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let plain = run(prog, &args, &env);
        let (hooked, _) = run_u3m(prog, &args, &env);
        let what = format!("{prog} {args:?}");
        assert_eq!(
            plain.code, hooked.code,
            "{what}: exit status\n{}",
            hooked.stderr
        );
        assert_eq!(plain.stdout, hooked.stdout, "{what}: stdout differs");
        assert!(!plain.stats.is_null(), "{what}: no simulator stats");
        assert_eq!(
            comparable_stats(prog, &plain.stats),
            comparable_stats(prog, &hooked.stats),
            "{what}: simulator statistics differ"
        );
        assert!(
            !hooked.stderr.contains("u3m: "),
            "{what}: u3m complained:\n{}",
            hooked.stderr
        );
    }
}

#[test]
fn a_forked_child_starts_clean_with_its_own_segment() {
    let copy = common::scratch("fork-app-seg-copy").join("parent.seg");
    let (r, dir) = run_u3m(
        "fork_app",
        &[],
        &[("FORK_APP_SEG_COPY", copy.to_str().unwrap())],
    );
    let r = r.must_succeed();
    assert_eq!(
        r.fact("parent_segment_before").as_deref(),
        Some("1"),
        "{}",
        r.stderr
    );
    assert_eq!(r.fact("child_malloc_host").as_deref(), Some("0"));
    assert_eq!(
        r.fact("child_segment").as_deref(),
        Some("1"),
        "the child has its own segment"
    );
    assert_eq!(r.fact("child_sees_parent_segment").as_deref(), Some("1"));
    assert_eq!(r.fact("child_exit").as_deref(), Some("0"));
    assert_eq!(
        r.fact("child_segment_after_exit").as_deref(),
        Some("0"),
        "the child removed its segment"
    );
    assert_eq!(
        r.fact("parent_segment_after").as_deref(),
        Some("1"),
        "the child's exit left the parent's segment"
    );
    // and the parent removed its own at exit
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "segments left behind: {left:?}");
    // the child's 41 aclrtMallocHost calls were counted in its own segment:
    // the parent, which made none, shows none (the forking thread's row of
    // counts is in the parent's segment, still mapped shared in the child)
    assert_eq!(r.fact("parent_segment_copied").as_deref(), Some("1"));
    let snap = u3m_core::shm::SegmentReader::open(&copy)
        .expect("the parent's segment")
        .snapshot();
    let count = |name: &str| {
        snap.calls
            .iter()
            .find(|c| c.name == name)
            .map_or(0, |c| c.count)
    };
    assert!(count("aclrtMalloc") >= 1, "{:?}", snap.calls);
    assert_eq!(count("aclrtMallocHost"), 0, "{:?}", snap.calls);
}

/// Issue 14: a mistyped or invalid setting turned u3m off silently and an
/// oversubscribed job died later with 207001. Now: an invalid value in tier
/// mode makes aclInit fail (100000) with one error line, unless
/// U3M_ON_CONFIG_ERROR=passthrough; observe mode (nothing to protect) falls
/// back to pass-through; an unknown name is one warning and is ignored.
#[test]
fn configuration_errors_fail_tier_mode_and_pass_through_otherwise() {
    let plain = run("mlp_train", &["--steps", "3"], &[]).must_succeed();
    let once = |r: &Run, what: &str| {
        assert_eq!(
            r.stderr.matches("u3m: ").count(),
            1,
            "{what}: reported once:\n{}",
            r.stderr
        );
    };
    // tier mode (the default, or the mode that was mistyped): fail closed
    for env in [
        vec![("U3M_MODE", "fast")],
        vec![("U3M_MODE", "tier"), ("U3M_MIN_BYTES", "lots")],
        vec![("U3M_MODE", "tier"), ("U3M_OVERSUB", "0.5")],
        vec![("U3M_MODE", "tier"), ("U3M_DRAM_BYTES", "2")],
    ] {
        let (r, dir) = run_u3m("mlp_train", &["--steps", "3"], &env);
        let what = format!("{env:?}");
        assert_ne!(r.code, 0, "{what}: ran untiered\n{}", r.stdout);
        assert!(
            r.stderr.contains("ACL error 100000"),
            "{what}: {}",
            r.stderr
        );
        let line = r
            .stderr
            .lines()
            .find(|l| l.starts_with("u3m: "))
            .unwrap_or("");
        assert!(
            line.starts_with(&format!(
                "u3m: configuration error: {}: ",
                env.last().unwrap().0
            )) && line.contains("aclInit returns ACL_ERROR_INVALID_PARAM (100000)")
                && line.contains("U3M_ON_CONFIG_ERROR=passthrough"),
            "{what}: {line}"
        );
        once(&r, &what);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "{what}: no segment"
        );
    }
    // a setting found unusable at start-up counts the same
    let (r, _) = run_u3m(
        "mlp_train",
        &["--steps", "3"],
        &[("U3M_MODE", "tier"), ("U3M_SWAP_DIR", "/no/such/dir")],
    );
    assert!(
        r.code != 0 && r.stderr.contains("ACL error 100000"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("u3m: cannot start: U3M_SWAP_DIR=/no/such/dir: ")
            && r.stderr
                .contains("aclInit returns ACL_ERROR_INVALID_PARAM (100000)"),
        "{}",
        r.stderr
    );
    once(&r, "swap dir");
    // passthrough asked for, or observe mode: the run goes on without u3m
    for env in [
        vec![
            ("U3M_MODE", "tier"),
            ("U3M_MIN_BYTES", "lots"),
            ("U3M_ON_CONFIG_ERROR", "passthrough"),
        ],
        vec![("U3M_MODE", "observe"), ("U3M_MIN_BYTES", "lots")],
    ] {
        let (r, dir) = run_u3m("mlp_train", &["--steps", "3"], &env);
        let what = format!("{env:?}");
        assert_eq!(r.code, 0, "{what}: {}", r.stderr);
        assert_eq!(r.stdout, plain.stdout, "{what}: output changed");
        assert!(
            r.stderr
                .contains("u3m: configuration error: U3M_MIN_BYTES: 'lots'")
                && r.stderr.contains("running as pass-through"),
            "{what}: {}",
            r.stderr
        );
        once(&r, &what);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "{what}: no segment"
        );
    }
    // an unknown name: one warning with the closest known name, ignored
    let (r, _) = run_u3m("mlp_train", &["--steps", "3"], &[("U3M_MOED", "tier")]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, plain.stdout);
    assert!(
        r.stderr
            .contains("u3m: warning: U3M_MOED: unknown variable, ignored (did you mean U3M_MODE?)"),
        "{}",
        r.stderr
    );
    once(&r, "U3M_MOED");
}

#[test]
fn a_panic_in_the_engine_falls_back_to_pass_through() {
    let plain = run("mlp_train", &["--steps", "4"], &[]).must_succeed();
    let (r, _) = run_u3m(
        "mlp_train",
        &["--steps", "4"],
        &[("U3M_DEBUG_PANIC_AT_OP", "25")],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, plain.stdout);
    assert_eq!(r.stats, plain.stats);
    assert!(
        r.stderr.contains("u3m: disabled: internal error"),
        "{}",
        r.stderr
    );
}

/// Peak RSS in KiB of `prog args` (phantom, hermetic environment plus `env`),
/// from wait4: only this child's figure, whatever other tests run meanwhile.
// the child is reaped by wait4, which std's Child does not know
#[allow(clippy::zombie_processes)]
fn max_rss_kib(prog: &str, args: &[&str], env: &[(&str, &str)]) -> i64 {
    use std::os::unix::process::ExitStatusExt;
    let mut cmd = std::process::Command::new(common::app(prog));
    cmd.args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    common::hermetic(&mut cmd);
    cmd.env("ACLSIM_PHANTOM", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn");
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    assert_eq!(r, child.id() as i32, "wait4");
    let st = std::process::ExitStatus::from_raw(status);
    assert!(st.success(), "{prog} under {env:?}: {st}");
    ru.ru_maxrss
}

/// Start-up costs neither time nor memory for the heat table's capacity: its
/// tables (128 MiB of allocation slots, 32 MiB of chunk records by default)
/// are reserved, not written. Fails if start-up commits them again (as it
/// did while `alloc_zeroed` of cache-line aligned slots wrote every byte:
/// peak RSS 168 MiB against 2.4 MiB without u3m, ~0.2 s of page faults).
#[test]
fn start_up_commits_no_table_memory() {
    let args = ["--steps", "2"];
    let base = max_rss_kib("mlp_train", &args, &[]);
    let dir = common::scratch("rss");
    let lib = libu3m();
    for mode in ["observe", "tier"] {
        let rss = max_rss_kib(
            "mlp_train",
            &args,
            &[
                ("LD_PRELOAD", lib.to_str().unwrap()),
                ("U3M_SHM_DIR", dir.to_str().unwrap()),
                ("U3M_MODE", mode),
            ],
        );
        assert!(
            rss - base < 32 << 10,
            "{mode}: peak RSS {rss} KiB under libu3m.so, {base} KiB without"
        );
    }
}
