//! The ACL workload programs on the simulated runtime: mlp_train (aclop
//! training), dlsym_app (the same model through dlopen + dlsym), kv_decode
//! (aclnn attention over growing KV caches). They must compute real, repeatable
//! results, fail the way the runtime fails when memory runs out, and run huge
//! footprints cheaply in phantom mode.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Run;

/// The "step=<i> loss=<f>" lines, in order, as (step, loss text).
fn loss_lines(r: &Run) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    for line in r.stdout.lines() {
        let mut step = None;
        let mut loss = None;
        for tok in line.split_whitespace() {
            if let Some(s) = tok.strip_prefix("step=") {
                step = s.parse::<usize>().ok();
            } else if let Some(l) = tok.strip_prefix("loss=") {
                loss = Some(l.to_string());
            }
        }
        if let (Some(s), Some(l)) = (step, loss) {
            v.push((s, l));
        }
    }
    v
}

fn losses(r: &Run) -> Vec<f64> {
    loss_lines(r)
        .iter()
        .map(|(_, l)| {
            l.parse::<f64>()
                .unwrap_or_else(|_| panic!("bad loss '{l}' in:\n{}", r.stdout))
        })
        .collect()
}

fn fact_u64(r: &Run, key: &str) -> u64 {
    r.fact(key)
        .unwrap_or_else(|| panic!("no {key}= in output:\n{}", r.stdout))
        .parse()
        .unwrap_or_else(|e| panic!("{key}= is not an integer ({e}):\n{}", r.stdout))
}

/// The per-request "request=<r> ... checksum=<hex>" facts, in order.
fn request_checksums(r: &Run) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    for line in r.stdout.lines() {
        let facts = common::facts(line);
        if let (Some(req), Some(sum)) = (facts.get("request"), facts.get("checksum")) {
            v.push((req.parse().unwrap(), sum.clone()));
        }
    }
    v
}

fn check_stats_sane(r: &Run) {
    assert!(r.stat_u64(&["ops"]) > 0, "no ops counted: {}", r.stats);
    assert!(
        r.stat_u64(&["copy_bytes", "H2D"]) > 0,
        "no H2D bytes counted: {}",
        r.stats
    );
    assert!(
        r.stat_u64(&["copy_bytes", "D2H"]) > 0,
        "no D2H bytes counted: {}",
        r.stats
    );
    assert!(
        r.stat_u64(&["sim_ns"]) > 0,
        "no simulated time: {}",
        r.stats
    );
    let dev = &r.stats["devices"][0];
    let peak = dev["peak_bytes"].as_u64().expect("devices[0].peak_bytes");
    let hbm = dev["hbm_bytes"].as_u64().expect("devices[0].hbm_bytes");
    assert!(
        peak > 0 && peak <= hbm,
        "peak {peak} not in (0, hbm {hbm}]: {}",
        r.stats
    );
    assert_eq!(
        dev["current_bytes"].as_u64(),
        Some(0),
        "program leaked device memory: {}",
        r.stats
    );
    assert_eq!(
        r.stat_u64(&["mmu_faults"]),
        0,
        "MMU faults: {}\n{}",
        r.stats,
        r.stderr
    );
}

#[test]
fn mlp_train_learns_and_is_deterministic() {
    let a = common::run("mlp_train", &[], &[]).must_succeed();
    let l = losses(&a);
    assert_eq!(l.len(), 20, "expected 20 steps:\n{}", a.stdout);
    assert!(
        l.iter().all(|x| x.is_finite() && *x > 0.0),
        "non-finite loss:\n{}",
        a.stdout
    );
    let (first, last) = (l[0], *l.last().unwrap());
    assert!(
        last < 0.5 * first,
        "loss did not fall enough: {first} -> {last}\n{}",
        a.stdout
    );
    let final_loss: f64 = a.fact("final_loss").unwrap().parse().unwrap();
    assert_eq!(final_loss, last);
    let sum = a.fact("checksum").expect("checksum");
    assert!(
        sum.len() == 16 && u64::from_str_radix(&sum, 16).is_ok(),
        "bad checksum '{sum}'"
    );
    // the footprint plan matches what the program allocated and, within 1%
    // (the runtime's rounding), what the runtime accounted at its peak
    let fp = fact_u64(&a, "footprint_bytes");
    assert_eq!(fact_u64(&a, "allocated_bytes"), fp, "{}", a.stdout);
    let peak = a.stats["devices"][0]["peak_bytes"].as_u64().unwrap();
    assert!(
        peak >= fp && peak <= fp + fp / 100,
        "peak {peak} vs planned {fp}:\n{}",
        a.stdout
    );
    check_stats_sane(&a);
    assert_eq!(a.stats["phantom"].as_bool(), Some(false));

    let b = common::run("mlp_train", &[], &[]).must_succeed();
    assert_eq!(a.stdout, b.stdout, "two runs differ");

    // the checksum covers the weights: another seed trains other weights
    let c = common::run("mlp_train", &["--seed", "5", "--steps", "2"], &[]).must_succeed();
    assert_ne!(c.fact("checksum"), a.fact("checksum"));
    assert_ne!(losses(&c)[0], l[0]);
}

#[test]
fn dlsym_app_matches_mlp_train() {
    let args = ["--steps", "4", "--layers", "3", "--hidden", "96"];
    let d = common::run("dlsym_app", &args, &[]).must_succeed();
    let m = common::run("mlp_train", &args, &[]).must_succeed();
    let dl = loss_lines(&d);
    assert_eq!(dl.len(), 4, "{}", d.stdout);
    assert_eq!(
        dl,
        loss_lines(&m),
        "dlsym_app:\n{}\nmlp_train:\n{}",
        d.stdout,
        m.stdout
    );
    // same updates, bit for bit, so the same final weights
    assert_eq!(d.fact("checksum"), m.fact("checksum"));
    // the real work was done: ops ran and a step changed the loss
    assert!(d.stat_u64(&["ops"]) > 0);
    assert_eq!(
        d.stat_u64(&["ops"]),
        m.stat_u64(&["ops"]),
        "both launch the same operators"
    );
    let l = losses(&d);
    assert!(l[3] < l[0], "{}", d.stdout);
    check_stats_sane(&d);
}

#[test]
fn dlsym_app_names_a_missing_symbol() {
    // A libopapi.so without any aclnn symbol, found first through LD_LIBRARY_PATH
    // (searched before the program's RUNPATH).
    let dir = common::scratch("dlsym-missing");
    let src = dir.join("empty.c");
    std::fs::write(&src, "int aclsim_test_placeholder(void) { return 0; }\n").unwrap();
    let lib = dir.join("libopapi.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("run the C compiler");
    assert!(st.success(), "cannot build the stub library");
    let r = common::run(
        "dlsym_app",
        &["--steps", "1"],
        &[("LD_LIBRARY_PATH", dir.to_str().unwrap())],
    );
    assert_eq!(r.code, 2, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("aclCreateTensor"),
        "stderr does not name the symbol:\n{}",
        r.stderr
    );
    assert!(loss_lines(&r).is_empty());
}

#[test]
fn kv_decode_serves_every_request_repeatably() {
    let args = [
        "--requests",
        "3",
        "--layers",
        "3",
        "--heads",
        "4",
        "--head-dim",
        "32",
        "--prompt",
        "8",
        "--decode",
        "6",
    ];
    let a = common::run("kv_decode", &args, &[]).must_succeed();
    assert_eq!(fact_u64(&a, "requests_served"), 3, "{}", a.stdout);
    assert_eq!(fact_u64(&a, "tokens"), 18);
    let sums = request_checksums(&a);
    assert_eq!(
        sums.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "{}",
        a.stdout
    );
    // requests have different prompts, so different caches
    assert_ne!(sums[0].1, sums[1].1);
    assert_ne!(sums[1].1, sums[2].1);
    let tps: f64 = a.fact("sim_tokens_per_s").unwrap().parse().unwrap();
    assert!(tps.is_finite() && tps > 0.0, "sim_tokens_per_s={tps}");
    check_stats_sane(&a);
    assert!(
        a.stat_u64(&["copy_bytes", "D2D"]) > 0,
        "KV appends are D2D copies: {}",
        a.stats
    );

    let b = common::run("kv_decode", &args, &[]).must_succeed();
    assert_eq!(request_checksums(&b), sums, "checksums differ across runs");

    // one more decode step changes every request's result
    let mut more = args.to_vec();
    let n = more.len();
    more[n - 1] = "7";
    let c = common::run("kv_decode", &more, &[]).must_succeed();
    let csums = request_checksums(&c);
    for (x, y) in csums.iter().zip(&sums) {
        assert_ne!(x.1, y.1, "request {} ignored the extra step", x.0);
    }
}

#[test]
fn footprint_over_capacity_fails_with_207001() {
    let env = [("ACLSIM_HBM_BYTES", "256M")];
    let over = common::run("mlp_train", &["--footprint", "384M", "--steps", "1"], &env);
    assert_eq!(
        over.code, 2,
        "stdout:\n{}\nstderr:\n{}",
        over.stdout, over.stderr
    );
    assert!(over.stderr.contains("207001"), "stderr:\n{}", over.stderr);
    assert!(
        fact_u64(&over, "footprint_bytes") >= 384 << 20,
        "{}",
        over.stdout
    );
    assert!(loss_lines(&over).is_empty());

    let under = common::run(
        "mlp_train",
        &["--footprint", "96M", "--steps", "1", "--batch", "16"],
        &env,
    )
    .must_succeed();
    let fp = fact_u64(&under, "footprint_bytes");
    assert!(
        fp >= 96 << 20 && fp < 128 << 20,
        "footprint {fp}:\n{}",
        under.stdout
    );
    let peak = under.stats["devices"][0]["peak_bytes"].as_u64().unwrap();
    assert!(
        peak >= fp,
        "runtime peak {peak} below the planned footprint {fp}"
    );
    assert_eq!(losses(&under).len(), 1);

    // kv_decode sizes its caches from a multiple of the device capacity
    let env = [("ACLSIM_HBM_BYTES", "64M")];
    let kv_args = [
        "--layers",
        "2",
        "--heads",
        "2",
        "--head-dim",
        "32",
        "--prompt",
        "4",
        "--decode",
        "2",
    ];
    let mut a = kv_args.to_vec();
    a.extend(["--footprint-x", "1.5"]);
    let over = common::run("kv_decode", &a, &env);
    assert_eq!(
        over.code, 2,
        "stdout:\n{}\nstderr:\n{}",
        over.stdout, over.stderr
    );
    assert!(over.stderr.contains("207001"), "stderr:\n{}", over.stderr);
    assert!(fact_u64(&over, "footprint_bytes") >= 96 << 20);
    let mut a = kv_args.to_vec();
    a.extend(["--footprint-x", "0.5"]);
    let under = common::run("kv_decode", &a, &env).must_succeed();
    let reqs = fact_u64(&under, "requests");
    assert!(
        reqs > 1 && fact_u64(&under, "requests_served") == reqs,
        "{}",
        under.stdout
    );
}

/// Runs a program, returning its output, exit code and peak resident set
/// (KiB, from wait4's rusage of exactly that child).
fn run_with_peak_rss(
    prog: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (i32, String, String, u64, Duration) {
    let mut cmd = Command::new(common::app(prog));
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    common::hermetic(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("spawn");
    let pid = child.id() as libc::pid_t;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let eh = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).ok();
        s
    });
    let mut stdout = String::new();
    out.read_to_string(&mut stdout).ok();
    let stderr = eh.join().unwrap();
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(rc, pid, "wait4 failed");
    let elapsed = t0.elapsed();
    std::mem::forget(child); // already reaped
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    (code, stdout, stderr, ru.ru_maxrss as u64, elapsed)
}

#[test]
fn phantom_mode_runs_a_20gib_footprint_cheaply() {
    let dir = common::scratch("phantom");
    let stats = dir.join("stats.json");
    let stats_s = stats.to_str().unwrap().to_string();
    let env = [
        ("ACLSIM_HBM_BYTES", "32G"),
        ("ACLSIM_PHANTOM", "1"),
        ("ACLSIM_STATS", stats_s.as_str()),
    ];
    let (code, stdout, stderr, rss_kib, took) =
        run_with_peak_rss("mlp_train", &["--footprint", "20G", "--steps", "2"], &env);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let facts = common::facts(&stdout);
    let fp: u64 = facts["footprint_bytes"].parse().unwrap();
    assert!(fp >= 20 << 30 && fp < 21 << 30, "footprint {fp}");
    assert_eq!(stdout.matches("step=").count(), 2, "{stdout}");
    assert!(
        rss_kib < 1 << 20,
        "peak RSS {rss_kib} KiB for a 20 GiB phantom footprint"
    );
    assert!(took < Duration::from_secs(20), "phantom run took {took:?}");
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats written")).unwrap();
    let _ = std::fs::remove_file(&stats);
    assert_eq!(st["phantom"].as_bool(), Some(true));
    let peak = st["devices"][0]["peak_bytes"].as_u64().unwrap();
    assert!(
        peak >= fp && peak <= st["devices"][0]["hbm_bytes"].as_u64().unwrap(),
        "{st}"
    );
    assert!(
        st["ops"].as_u64().unwrap() > 0 && st["sim_ns"].as_u64().unwrap() > 0,
        "{st}"
    );
    // timed as if computed: two steps over 20 GiB of Adam state at 800 GB/s
    // take at least 2 * 20 GiB / 800 GB/s of simulated time
    let min_ns = 2.0 * (20u64 << 30) as f64 / 800e9 * 1e9;
    assert!(
        st["sim_ns"].as_u64().unwrap() as f64 >= min_ns,
        "sim_ns {} < {min_ns}",
        st["sim_ns"]
    );
}
