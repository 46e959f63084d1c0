//! acl_replay (trace -> ACL calls on the simulator) and mt_stress (threads,
//! streams and cross-thread events): determinism, byte-exact data flow, trace
//! validation, error reporting, phantom scale, and stream/event ordering.

mod common;

use common::{run, scratch, Run};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn trace(name: &str) -> String {
    format!("{}/tests/traces/{}", env!("CARGO_MANIFEST_DIR"), name)
}

fn write_trace(dir: &PathBuf, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

/// Checksum, op count and simulated time from the single result line, which
/// must be the last line of stdout and have exactly this shape.
#[derive(Debug, PartialEq)]
struct Replay {
    checksum: String,
    ops: u64,
    sim_ns: u64,
}

fn replay(args: &[&str], env: &[(&str, &str)]) -> (Replay, Run) {
    let r = run("acl_replay", args, env).must_succeed();
    let last = r.stdout.lines().last().unwrap_or("").to_string();
    let toks: Vec<&str> = last.split(' ').collect();
    assert_eq!(toks.len(), 3, "bad result line {last:?}");
    let get = |i: usize, key: &str| {
        toks[i]
            .strip_prefix(key)
            .unwrap_or_else(|| panic!("{key} missing in {last:?}"))
            .to_string()
    };
    let checksum = get(0, "checksum=");
    assert_eq!(checksum.len(), 16, "checksum not 16 hex digits: {last:?}");
    assert!(checksum.chars().all(|c| c.is_ascii_hexdigit()));
    let out = Replay {
        checksum,
        ops: get(1, "ops=").parse().unwrap(),
        sim_ns: get(2, "sim_ns=").parse().unwrap(),
    };
    assert_eq!(
        r.stdout.matches("checksum=").count(),
        1,
        "exactly one result line: {}",
        r.stdout
    );
    (out, r)
}

fn count_ops(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| l.trim_start().starts_with("O "))
        .count() as u64
}

// ---------------------------------------------------------------- good traces

#[test]
fn traces_replay_deterministically() {
    let cases: &[(&str, &[&str], &[(&str, &str)])] = &[
        ("example.trace", &[], &[]),
        ("interior.trace", &[], &[]),
        ("multistream.trace", &[], &[]),
        ("memset.trace", &[], &[]),
        ("multidev.trace", &[], &[("ACLSIM_DEVICES", "2")]),
        // 6 GiB allocation: reading it all back would touch 6 GiB of memory
        ("large.trace", &["--no-verify"], &[]),
    ];
    for (name, extra, env) in cases {
        let path = trace(name);
        let mut args: Vec<&str> = extra.to_vec();
        args.push(&path);
        let (a, r) = replay(&args, env);
        let (b, _) = replay(&args, env);
        assert_eq!(a, b, "{name}: two runs differ");
        assert_eq!(a.ops, count_ops(&path), "{name}: ops");
        assert!(a.sim_ns > 0, "{name}: sim_ns");
        assert_eq!(r.stat_u64(&["mmu_faults"]), 0, "{name}");
        assert_eq!(r.stat_u64(&["ops"]), a.ops, "{name}: simulator op count");
        assert!(
            r.stat_u64(&["copies", "D2H"]) > 0,
            "{name}: no D2H copy seen"
        );
        for d in r.stats["devices"].as_array().unwrap() {
            assert_eq!(
                d["current_bytes"].as_u64(),
                Some(0),
                "{name}: allocation leaked: {d}"
            );
        }
    }
}

#[test]
fn multi_device_trace_uses_both_devices() {
    let (_, r) = replay(&[&trace("multidev.trace")], &[("ACLSIM_DEVICES", "2")]);
    let devs = r.stats["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2);
    for d in devs {
        assert!(
            d["peak_bytes"].as_u64().unwrap() >= 2 << 20,
            "device unused: {d}"
        );
    }
    // without a second device the trace cannot run: ACL error naming the first
    // dev=1 line, raised while setting up, before any event ran
    let r = run("acl_replay", &[&trace("multidev.trace")], &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("acl_replay: trace line 4: ACL error"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("in aclrtSetDevice"), "{}", r.stderr);
    assert_eq!(
        r.stats["devices"][0]["peak_bytes"].as_u64(),
        Some(0),
        "{}",
        r.stats
    );
}

#[test]
fn device_option_offsets_devices() {
    let (on0, _) = replay(&[&trace("example.trace")], &[("ACLSIM_DEVICES", "2")]);
    let (on1, r) = replay(
        &["--device", "1", &trace("example.trace")],
        &[("ACLSIM_DEVICES", "2")],
    );
    assert_eq!(on0.checksum, on1.checksum);
    let devs = r.stats["devices"].as_array().unwrap();
    assert_eq!(
        devs[0]["peak_bytes"].as_u64(),
        Some(0),
        "device 0 used: {}",
        r.stats
    );
    assert!(devs[1]["peak_bytes"].as_u64().unwrap() > 0);
}

// ------------------------------------------------------------ byte-exact flow

const MASK: u64 = u64::MAX;

fn fnv(mut h: u64, b: &[u8]) -> u64 {
    for &x in b {
        h = (h ^ x as u64).wrapping_mul(0x100000001b3);
    }
    h
}

/// acl_replay's documented H2D source fill: splitmix64 words seeded by the host address.
fn host_fill(addr: u64, n: usize) -> Vec<u8> {
    let mut st = addr;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        st = st.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = st;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9) & MASK;
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// Copies of all four kinds, memsets (value = low byte of the line number) and
/// cross-stream order (streams 0, 1, 2 hand data to each other through device
/// and host buffers), checked against a host model of the bytes: the checksum
/// is exactly FNV over the D2H bytes, then over the read-back before the free.
#[test]
fn checksum_is_exact_for_copies_and_memsets() {
    let dir = scratch("replay-exact");
    let t = write_trace(
        &dir,
        "exact.trace",
        "# u3m-trace 1\n\
         A 0x1000 8192\n\
         M H2D 0x1000 0x5000 8192\n\
         S 0x1100 300\n\
         M D2D 0x1800 0x1000 512 stream=1\n\
         M D2H 0x9000 0x1700 1024\n\
         S 0x1000 16 stream=1\n\
         M H2H 0xa000 0x9000 1024 stream=2\n\
         M H2D 0x2c00 0xa000 1024 stream=1\n\
         F 0x1000\n",
    );
    let mut a = host_fill(0x5000, 8192);
    a[0x100..0x100 + 300].fill(4); // line 4
    let head: Vec<u8> = a[0..0x200].to_vec();
    a[0x800..0xa00].copy_from_slice(&head);
    let d2h: Vec<u8> = a[0x700..0xb00].to_vec();
    a[0..16].fill(7); // line 7
    a[0x1c00..0x2000].copy_from_slice(&d2h); // D2H -> H2H -> H2D round trip
    let h_d2h = fnv(0xcbf29ce484222325, &d2h);
    let h_all = fnv(h_d2h, &a);

    let (v, _) = replay(&[&t], &[]);
    assert_eq!(v.checksum, format!("{h_all:016x}"));
    assert_eq!(v.ops, 0);
    let (nv, _) = replay(&["--no-verify", &t], &[]);
    assert_eq!(nv.checksum, format!("{h_d2h:016x}"));
}

#[test]
fn checksum_follows_byte_flow() {
    let dir = scratch("replay-flow");
    let base = std::fs::read_to_string(trace("example.trace")).unwrap();
    let (orig, _) = replay(&[&trace("example.trace")], &[]);

    // one op input range one byte shorter: the op's output differs
    let shorter = base.replace(
        "O MatMul 2 1 0x10000000:4194304",
        "O MatMul 2 1 0x10000000:4194303",
    );
    assert_ne!(shorter, base);
    let (c1, _) = replay(&[&write_trace(&dir, "shorter.trace", &shorter)], &[]);
    assert_ne!(c1.checksum, orig.checksum, "op input range change not seen");

    // other host source for the H2D: different bytes flow in
    let src = base.replace("0x7f0000001000", "0x7f0000002000");
    let (c2, _) = replay(&[&write_trace(&dir, "src.trace", &src)], &[]);
    assert_ne!(c2.checksum, orig.checksum, "H2D source change not seen");

    // another op type hashes differently
    let op = base.replace("O MatMul", "O BatchNorm");
    let (c3, _) = replay(&[&write_trace(&dir, "op.trace", &op)], &[]);
    assert_ne!(c3.checksum, orig.checksum, "op type change not seen");

    // informational and unknown keys change nothing; comments and blank lines are ignored
    let keys = base.replace("tag=act", "tag=kv t=123 color=blue x=") + "\n\n# trailing comment\n";
    let (c4, _) = replay(&[&write_trace(&dir, "keys.trace", &keys)], &[]);
    assert_eq!(c4, orig, "unknown keys must be ignored");

    // without verification only the (here absent) D2H bytes count: the checksum is the empty one
    let (nv, _) = replay(&["--no-verify", &trace("example.trace")], &[]);
    assert_eq!(nv.checksum, format!("{:016x}", 0xcbf29ce484222325u64));
}

/// Stream ordering: the multi-stream trace and the same trace on one stream
/// must move the same bytes (replay without cross-stream events gives varying
/// checksums here), and independent chains must overlap in simulated time.
#[test]
fn multistream_orders_like_one_stream_and_overlaps() {
    let dir = scratch("replay-streams");
    let text = std::fs::read_to_string(trace("multistream.trace")).unwrap();
    let single: String = text
        .lines()
        .map(|l| {
            l.split_whitespace()
                .filter(|t| !t.starts_with("stream="))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    assert_ne!(single, text);
    let one = write_trace(&dir, "one.trace", &single);
    let (s1, _) = replay(&[&one], &[]);
    for _ in 0..3 {
        let (m, r) = replay(&[&trace("multistream.trace")], &[]);
        assert_eq!(
            m.checksum, s1.checksum,
            "multi-stream replay moved different bytes"
        );
        let busy = r.stats["streams"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["sim_ns"].as_u64().unwrap() > 0)
            .count();
        assert!(busy >= 3, "expected 3 busy streams: {}", r.stats);
        assert!(
            m.sim_ns < s1.sim_ns,
            "no overlap: multi {} vs single {}",
            m.sim_ns,
            s1.sim_ns
        );
    }
}

// ------------------------------------------------------------------ bad input

/// Each malformed trace: exit 3, "acl_replay: FILE:LINE: ..." naming the bad
/// line, and nothing executed (no result line, no device use).
#[test]
fn malformed_traces_exit_3_before_running() {
    let dir = scratch("replay-bad");
    let ok = "# u3m-trace 1\nA 0x10000 1048576\nM H2D 0x10000 0x7f00 4096\nO Op 1 1 0x10000:4096 0x11000:4096\n";
    // (name, text, bad line, fragment of the message)
    let cases: Vec<(&str, String, usize, &str)> = vec![
        (
            "header",
            "# u3m-trace 2\nA 0x10000 4096\n".into(),
            1,
            "header",
        ),
        (
            "header-late",
            "\n\nA 0x10000 4096\n# u3m-trace 1\n".into(),
            3,
            "header",
        ),
        (
            "header-space",
            "# u3m-trace 1 \nA 0x10000 4096\n".into(),
            1,
            "header",
        ),
        ("empty", "".into(), 1, "header"),
        (
            "kind",
            format!("{ok}X 0x10000 16\n"),
            5,
            "unknown event kind 'X'",
        ),
        (
            "kind-lower",
            format!("{ok}a 0x20000 16\n"),
            5,
            "unknown event kind",
        ),
        (
            "hex-noprefix",
            format!("{ok}A 20000 4096\n"),
            5,
            "bad address '20000'",
        ),
        ("hex-digit", format!("{ok}S 0x1000g 16\n"), 5, "bad address"),
        (
            "hex-range",
            format!("{ok}O Op 1 1 0x10000:16 0xZZ:16\n"),
            5,
            "bad range address",
        ),
        (
            "size-alpha",
            format!("{ok}A 0x200000 12k\n"),
            5,
            "bad size '12k'",
        ),
        ("size-neg", format!("{ok}S 0x10000 -1\n"), 5, "bad size"),
        (
            "size-range",
            format!("{ok}O Op 1 1 0x10000:abc 0x11000:16\n"),
            5,
            "bad range size",
        ),
        (
            "size-copy",
            format!("{ok}M D2D 0x10000 0x11000 1e3\n"),
            5,
            "bad size",
        ),
        (
            "overlap",
            format!("{ok}A 0x80000 1048576\n"),
            5,
            "overlaps the live allocation 0x10000",
        ),
        ("overlap-same", format!("{ok}A 0x10000 16\n"), 5, "overlaps"),
        (
            "free-unknown",
            format!("{ok}F 0x90000000\n"),
            5,
            "no live allocation starts there",
        ),
        (
            "free-interior",
            format!("{ok}F 0x10010\n"),
            5,
            "no live allocation starts there",
        ),
        (
            "free-twice",
            format!("{ok}F 0x10000\nF 0x10000\n"),
            6,
            "no live allocation starts there",
        ),
        (
            "range-op",
            format!("{ok}O Op 1 1 0x10000:16 0x10ff00:512\n"),
            5,
            "not inside one live allocation",
        ),
        (
            "range-memset",
            format!("{ok}S 0x10000 1048577\n"),
            5,
            "not inside one live allocation",
        ),
        (
            "range-copy",
            format!("{ok}M D2H 0x7f00 0x8000 16\n"),
            5,
            "not inside one live allocation",
        ),
        (
            "range-freed",
            format!("{ok}F 0x10000\nS 0x10000 16\n"),
            6,
            "not inside one live allocation",
        ),
        (
            "range-otherdev",
            format!("{ok}S 0x10000 16 dev=1\n"),
            5,
            "not inside one live allocation on device 1",
        ),
        (
            "count-few",
            format!("{ok}O Op 2 1 0x10000:16 0x11000:16\n"),
            5,
            "n_in=2 n_out=1 but 2 ranges follow",
        ),
        (
            "count-many",
            format!("{ok}O Op 1 1 0x10000:16 0x11000:16 0x12000:16\n"),
            5,
            "but 3 ranges follow",
        ),
        (
            "count-bad",
            format!("{ok}O Op x 1 0x10000:16\n"),
            5,
            "bad n_in",
        ),
        ("missing", format!("{ok}A 0x200000\n"), 5, "missing size"),
        ("missing-op", format!("{ok}O\n"), 5, "missing op_type"),
        (
            "copy-kind",
            format!("{ok}M D2X 0x10000 0x11000 16\n"),
            5,
            "unknown copy kind 'D2X'",
        ),
        (
            "extra-field",
            format!("{ok}F 0x10000 junk\n"),
            5,
            "unexpected field 'junk'",
        ),
        (
            "bad-dev",
            format!("{ok}S 0x10000 16 dev=one\n"),
            5,
            "bad value in 'dev=one'",
        ),
    ];
    for (name, text, line, frag) in &cases {
        let path = write_trace(&dir, &format!("{name}.trace"), text);
        let r = run("acl_replay", &[&path], &[]);
        assert_eq!(r.code, 3, "{name}: code {} stderr {}", r.code, r.stderr);
        let prefix = format!("acl_replay: {path}:{line}: ");
        assert!(
            r.stderr.starts_with(&prefix),
            "{name}: expected '{prefix}...' got {:?}",
            r.stderr
        );
        assert!(
            r.stderr.contains(frag),
            "{name}: expected {frag:?} in {:?}",
            r.stderr
        );
        assert!(r.stdout.is_empty(), "{name}: printed {:?}", r.stdout);
        // nothing ran: the runtime was never even initialised
        if !r.stats.is_null() {
            assert_eq!(r.stat_u64(&["ops"]), 0, "{name}");
            assert_eq!(r.stat_u64(&["copies", "H2D"]), 0, "{name}");
            for d in r.stats["devices"].as_array().unwrap() {
                assert_eq!(d["peak_bytes"].as_u64(), Some(0), "{name}: {d}");
            }
        }
    }
    // usage errors
    assert_eq!(run("acl_replay", &[], &[]).code, 3);
    assert_eq!(
        run("acl_replay", &["--bogus", &trace("example.trace")], &[]).code,
        3
    );
    assert_eq!(
        run(
            "acl_replay",
            &[&dir.join("missing.trace").to_string_lossy()],
            &[]
        )
        .code,
        3
    );
}

#[test]
fn allocation_beyond_hbm_exits_2_naming_line() {
    let dir = scratch("replay-oom");
    let t = write_trace(
        &dir,
        "oom.trace",
        "# u3m-trace 1\nA 0x1000000 33554432\nS 0x1000000 4096\n# the next one does not fit in 64 MiB\nA 0x8000000 67108864\nS 0x8000000 16\n",
    );
    let r = run("acl_replay", &[&t], &[("ACLSIM_HBM_BYTES", "64M")]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("acl_replay: trace line 5: ACL error 207001 in aclrtMalloc"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.is_empty());
    assert_eq!(r.stat_u64(&["failed_allocs"]), 1);
    // the same trace fits with more memory
    replay(&[&t], &[("ACLSIM_HBM_BYTES", "128M")]);
}

#[test]
fn phantom_20gib_live_set_is_quick() {
    let dir = scratch("replay-phantom");
    const G: u64 = 1 << 30;
    let base = 0x1000_0000_0000u64;
    let mut t = String::from("# u3m-trace 1\n");
    for i in 0..10 {
        t += &format!("A {:#x} {} tag=weight\n", base + i * 4 * G, 2 * G);
    }
    for i in 0..10 {
        let a = base + i * 4 * G;
        t += &format!(
            "M H2D {:#x} {:#x} {}\n",
            a,
            0x7f00_0000_0000u64 + i * 2 * G,
            2 * G
        );
        t += &format!(
            "O Layer{i} 1 1 {:#x}:{} {:#x}:{} flops=1000000000000 stream={}\n",
            a,
            2 * G,
            a + G,
            G,
            i % 2
        );
    }
    for i in 0..10 {
        t += &format!("F {:#x}\n", base + i * 4 * G);
    }
    let path = write_trace(&dir, "phantom.trace", &t);
    let start = Instant::now();
    let (out, r) = replay(&["--no-verify", &path], &[("ACLSIM_PHANTOM", "1")]);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "phantom replay took {:?}",
        start.elapsed()
    );
    assert_eq!(out.ops, 10);
    assert_eq!(r.stats["phantom"].as_bool(), Some(true));
    let peak = r.stats["devices"][0]["peak_bytes"].as_u64().unwrap();
    assert!(peak >= 20 * G, "peak {peak}");
    assert_eq!(r.stat_u64(&["copy_bytes", "H2D"]), 20 * G);
    // 20 GiB copied in and read by ops: at least 20 GiB at HBM speed (800 GB/s)
    assert!(out.sim_ns > 20 * G / 800, "sim_ns {}", out.sim_ns);
    // phantom still enforces capacity: with 15 GiB the 8th 2 GiB allocation (line 9) fails
    let r = run(
        "acl_replay",
        &["--no-verify", &path],
        &[("ACLSIM_PHANTOM", "1"), ("ACLSIM_HBM_BYTES", "15G")],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.stderr
            .contains("acl_replay: trace line 9: ACL error 207001 in aclrtMalloc"),
        "{}",
        r.stderr
    );
}

// ------------------------------------------------------------------ mt_stress

fn streams_busy(r: &Run) -> usize {
    r.stats["streams"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["sim_ns"].as_u64().unwrap_or(0) > 0)
        .count()
}

#[test]
fn mt_stress_8_threads_clean() {
    let r = run("mt_stress", &["--threads", "8", "--iters", "200"], &[]).must_succeed();
    assert_eq!(r.fact("threads").as_deref(), Some("8"));
    assert_eq!(
        r.fact("corrupted_bytes").as_deref(),
        Some("0"),
        "{}",
        r.stderr
    );
    let verified: u64 = r.fact("verified_bytes").unwrap().parse().unwrap();
    assert!(verified > 1_000_000, "verified only {verified}");
    assert_eq!(r.stat_u64(&["mmu_faults"]), 0);
    assert!(r.stat_u64(&["ops"]) > 100);
    assert!(r.stat_u64(&["memsets"]) > 0);
    assert!(r.stat_u64(&["copies", "D2D"]) > 0);
    assert!(streams_busy(&r) >= 8, "streams: {}", r.stats["streams"]);
    // deterministic per seed despite the threads
    let r2 = run("mt_stress", &["--threads", "8", "--iters", "200"], &[]).must_succeed();
    assert_eq!(r2.fact("verified_bytes"), r.fact("verified_bytes"));
}

/// Proves the verifier can fail: without the cross-thread aclrtStreamWaitEvent
/// the consumer's read races the producer's write and corruption is reported.
#[test]
fn mt_stress_without_wait_is_caught() {
    let r = run(
        "mt_stress",
        &["--threads", "8", "--iters", "200", "--max-bytes", "1M"],
        &[("MT_STRESS_SKIP_WAIT", "1")],
    );
    assert_eq!(r.code, 1, "stdout {} stderr {}", r.stdout, r.stderr);
    let bad: u64 = r.fact("corrupted_bytes").unwrap().parse().unwrap();
    assert!(bad > 0);
    assert!(r.stderr.contains("expected 0x"), "{}", r.stderr);
}
