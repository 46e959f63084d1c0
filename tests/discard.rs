//! u3m_discard (docs/api.md): a program that says a buffer's contents are
//! dead lets u3m drop it from HBM without a copy-out; every byte the
//! program writes afterwards reads back as written, and without libu3m.so
//! the hint is simply absent.

mod common;
use common::{run, tier};

const ARGS: [&str; 2] = ["--bytes", "32M"];
/// Room for one of the two buffers (and the runtime's own): the second
/// one's fill evicts the first.
const HBM: (&str, &str) = ("ACLSIM_HBM_BYTES", "48M");

/// A 2-step, 2-layer 13B-shaped LoRA trace at scale 4 (226 MiB footprint),
/// with `extra` synth options: its path.
fn lora_trace(dir: &std::path::Path, extra: &[&str]) -> String {
    common::small_13b_trace_with(dir, "lora", &[&["--scale", "4"], extra].concat()).0
}

fn copied_out(s: &serde_json::Value) -> u64 {
    s["tier"]["eviction_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("{s}"))
}

#[test]
fn a_discarded_buffer_leaves_hbm_without_a_copy_out() {
    let (keep, ks) = tier("discard_app", &ARGS, &[HBM]);
    let kept = keep.must_succeed();
    let mut args = ARGS.to_vec();
    args.push("--discard");
    let (drop, ds) = tier("discard_app", &args, &[HBM]);
    let dropped = drop.must_succeed();
    for r in [&kept, &dropped] {
        assert_eq!(r.fact("api").as_deref(), Some("present"), "{}", r.stdout);
        assert_eq!(r.fact("x_ok").as_deref(), Some("1"), "{}", r.stdout);
        assert_eq!(r.fact("y_ok").as_deref(), Some("1"), "{}", r.stdout);
    }
    assert_eq!(dropped.fact("discard_rc").as_deref(), Some("0"));
    assert_eq!(dropped.fact("null_rc").as_deref(), Some("100000"));
    // without the hint X's 32 MiB are copied out when Y needs HBM
    assert!(copied_out(&ks) >= 16 << 20, "{ks}");
    // with it, none of X's chunks is (Y's may be, when X comes back)
    assert!(
        copied_out(&ds) + (16 << 20) <= copied_out(&ks),
        "with the hint {} bytes copied out, without {}",
        copied_out(&ds),
        copied_out(&ks)
    );
    assert!(ds["tier"]["clean_drops"].as_u64().unwrap() >= 8, "{ds}");
}

#[test]
fn in_observe_mode_the_hint_is_taken_and_changes_nothing() {
    let lib = common::libu3m();
    let mut args = ARGS.to_vec();
    args.push("--discard");
    let env = [
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("U3M_MODE", "observe"),
        ("ACLSIM_HBM_BYTES", "1G"),
    ];
    let r = run("discard_app", &args, &env).must_succeed();
    assert_eq!(r.fact("api").as_deref(), Some("present"), "{}", r.stdout);
    assert_eq!(r.fact("discard_rc").as_deref(), Some("0"));
    assert_eq!(r.fact("x_ok").as_deref(), Some("1"));
    assert_eq!(r.fact("y_ok").as_deref(), Some("1"));
}

#[test]
fn without_libu3m_the_hint_is_absent_and_nothing_changes() {
    let mut args = ARGS.to_vec();
    args.push("--discard");
    let r = run("discard_app", &args, &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    assert_eq!(r.fact("api").as_deref(), Some("absent"), "{}", r.stdout);
    assert_eq!(r.fact("discard_rc"), None);
    assert_eq!(r.fact("x_ok").as_deref(), Some("1"));
    assert_eq!(r.fact("y_ok").as_deref(), Some("1"));
}

/// acl_replay --discard plays a framework that frees its blocks: hints
/// where the trace shows a chunk dead. The computed result is the
/// unconstrained run's, and fewer bytes leave HBM by copy-out.
#[test]
fn acl_replay_with_discard_hints_computes_the_same_and_copies_out_less() {
    let dir = common::scratch("discard-replay");
    let t = lora_trace(&dir, &[]);
    let t = t.as_str();
    let reference = run("acl_replay", &[t], &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    // the 226 MiB footprint on 150 MiB of HBM
    let env = [("ACLSIM_HBM_BYTES", "150M"), ("U3M_OVERSUB", "2")];
    let (plain, ps) = tier("acl_replay", &[t], &env);
    let (hinted, hs) = tier("acl_replay", &[t, "--discard"], &env);
    let (plain, hinted) = (plain.must_succeed(), hinted.must_succeed());
    assert_eq!(plain.fact("checksum"), reference.fact("checksum"));
    assert_eq!(hinted.fact("checksum"), reference.fact("checksum"));
    assert_eq!(hinted.fact("discard").as_deref(), Some("present"));
    let hints: u64 = hinted.fact("hints").unwrap().parse().unwrap();
    assert!(hints > 0, "{}", hinted.stdout);
    assert!(
        copied_out(&hs) < copied_out(&ps),
        "copied out with hints {}, without {}",
        copied_out(&hs),
        copied_out(&ps)
    );
    // without libu3m.so the option finds no API and changes nothing
    let stock = run(
        "acl_replay",
        &[t, "--discard"],
        &[("ACLSIM_HBM_BYTES", "1G")],
    );
    let stock = stock.must_succeed();
    assert_eq!(stock.fact("discard").as_deref(), Some("absent"));
    assert_eq!(stock.fact("checksum"), reference.fact("checksum"));
}

/// acl_replay --frees plays torch_npu under libu3m.so: the caching
/// allocator's frees (`u3m synth --frees`) are the hints. The computed
/// result is the unconstrained run's, fewer bytes leave HBM by copy-out,
/// and a `# free` comment that names no live memory is an error naming
/// the line, never a hint somewhere else.
#[test]
fn acl_replay_with_the_allocators_frees_computes_the_same_and_copies_out_less() {
    let dir = common::scratch("discard-frees");
    let (plain_t, frees_t) = (lora_trace(&dir, &[]), lora_trace(&dir, &["--frees"]));
    let (plain_t, frees_t) = (plain_t.as_str(), frees_t.as_str());
    // the same events: only comments differ
    let events = |p: &str| -> Vec<String> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(String::from)
            .collect()
    };
    assert_eq!(events(plain_t), events(frees_t));
    let frees_in_trace = std::fs::read_to_string(frees_t)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("# free "))
        .count();
    assert!(frees_in_trace > 100, "{frees_in_trace} frees");
    // what the program reads back (the losses' D2H copies; --no-verify: the
    // final read-back of whole segments would also hash freed, dead bytes).
    // An S event fills with its line number, so the reference replays the
    // same file.
    let reference = run(
        "acl_replay",
        &[frees_t, "--no-verify"],
        &[("ACLSIM_HBM_BYTES", "1G")],
    )
    .must_succeed();
    let env = [("ACLSIM_HBM_BYTES", "150M"), ("U3M_OVERSUB", "2")];
    let (plain, ps) = tier("acl_replay", &[frees_t, "--no-verify"], &env);
    let (hinted, hs) = tier("acl_replay", &[frees_t, "--no-verify", "--frees"], &env);
    let (plain, hinted) = (plain.must_succeed(), hinted.must_succeed());
    assert_eq!(plain.fact("checksum"), reference.fact("checksum"));
    assert_eq!(hinted.fact("checksum"), reference.fact("checksum"));
    assert_eq!(hinted.fact("frees").as_deref(), Some("present"));
    let hints: usize = hinted.fact("hints").unwrap().parse().unwrap();
    assert_eq!(hints, frees_in_trace, "{}", hinted.stdout);
    assert!(hs["tier"]["discards"].as_u64().unwrap_or(0) > 0, "{hs}");
    assert!(
        copied_out(&hs) < copied_out(&ps),
        "copied out with the frees as hints {}, without {}",
        copied_out(&hs),
        copied_out(&ps)
    );
    // a free of memory the trace never allocated: refused before anything runs
    let bad = dir.join("bad.trace");
    std::fs::write(
        &bad,
        "# u3m-trace 1\nA 0x100000 4194304\n# free 0x900000 4096\n",
    )
    .unwrap();
    let bad = bad.to_str().unwrap();
    let r = run("acl_replay", &[bad, "--frees"], &[]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr.contains(":3:") && r.stderr.contains("# free"),
        "{}",
        r.stderr
    );
    // without --frees it is a comment
    run("acl_replay", &[bad], &[]).must_succeed();
}

/// `u3m stat` shows the hints as they arrive: the stats segment's
/// `discards` (docs/stats.md), read while discard_app holds after its work.
/// X's 32 MiB are in HBM and dirty when the hint comes: 16 chunks.
#[test]
fn u3m_stat_shows_the_discards_while_the_program_runs() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = common::scratch("discard-stat");
    for e in std::fs::read_dir(&dir).unwrap() {
        let _ = std::fs::remove_file(e.unwrap().path());
    }
    let lib = common::libu3m();
    let mut child = common::hermetic(&mut Command::new(common::app("discard_app")))
        .args(["--bytes", "32M", "--discard", "--hold-ms", "60000"])
        .envs([
            ("LD_PRELOAD", lib.to_str().unwrap()),
            ("U3M_MODE", "tier"),
            ("U3M_SHM_DIR", dir.to_str().unwrap()),
            HBM,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // the hold begins after y_ok
    let lines: Vec<String> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .take_while(|l| !l.starts_with("y_ok="))
        .collect();
    assert!(lines.contains(&"discard_rc=0".to_string()), "{lines:?}");
    let stat = || {
        let out = common::output_ok(Command::new(common::target_dir().join("u3m")).args([
            "stat",
            "--json",
            "--dir",
            dir.to_str().unwrap(),
        ]));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["processes"][0]["devices"][0]["discards"].as_u64()
    };
    // published by the next background round
    let t0 = std::time::Instant::now();
    let mut seen = stat();
    while seen != Some(16) && t0.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(50));
        seen = stat();
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(seen, Some(16), "u3m stat's discards on device 0");
}
