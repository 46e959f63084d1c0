//! Soak: `soak_app` (tests/apps/soak_app.c) under libu3m.so in tier mode for
//! a configurable time, with a live set of about 2 x HBM (constant eviction)
//! and randomly injected faults — single physical-allocation and
//! aclrtMapMem failures (u3m must absorb them) and single copy failures (the program sees an error on
//! one call and stops vouching for the bytes that call wrote; nothing else
//! may change). Checked:
//!   - 0 corrupted bytes (every byte read back that the program's model
//!     vouches for), and a verified-byte count that shows it read;
//!   - no hang: a progress line at least every 60 s (watchdog), and the run
//!     ends within its time + 120 s;
//!   - flat RSS, sampled every second from /proc: the highest RSS of the
//!     last third of the run is at most 10 % + 32 MiB above the highest
//!     from a sixth to two thirds of it (the first sixth is warm-up: the
//!     DRAM tier and the program's model fill up); only in runs of at
//!     least `RSS_TREND_SECS` (ci/test.sh runs 120 s): in 20 s on an idle
//!     machine the fill is still under way in the last third (seed 1:
//!     500 -> 585-624 MiB in 5 of 6 runs, 60 s and 120 s runs flat);
//!   - no device MMU fault, and every injected fault counted by the
//!     simulator.
//! `U3M_SOAK_SECS` sets the time (default 120 under CI=true, 20 otherwise;
//! docs/reliability.md records a 30-minute run), `U3M_SOAK_SEED` the fault
//! schedule.

mod common;

/// The shortest run whose RSS trend is checked (see above).
const RSS_TREND_SECS: u64 = 60;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|t| t.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// splitmix64
fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e3779b97f4a7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

#[test]
fn tier_mode_under_eviction_pressure_and_injected_faults_loses_nothing() {
    let secs: u64 = std::env::var("U3M_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if std::env::var_os("CI").is_some() {
            120
        } else {
            20
        });
    let seed: u64 = std::env::var("U3M_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    // the fault schedule: one-off failures spread over the run (about 30
    // physical allocations, 180 maps and 6 copies a second go through the
    // simulator; maps are placed within the first 100 a second so that a
    // slow machine still reaches some)
    let mut s = seed;
    let mut rules = Vec::new();
    // (the simulator takes at most 64 rules)
    let n_phys = (4 + secs / 10).min(22);
    let n_map = (4 + secs / 10).min(22);
    let n_copy = (2 + secs / 30).min(20);
    for _ in 0..n_phys {
        rules.push(format!("phys:{}", 10 + next(&mut s) % (25 * secs)));
    }
    for _ in 0..n_map {
        rules.push(format!("map:{}", 10 + next(&mut s) % (100 * secs)));
    }
    for _ in 0..n_copy {
        rules.push(format!("copy:{}", 50 + next(&mut s) % (5 * secs)));
    }
    let faults = rules.join(",");

    let dir = common::scratch("soak");
    let stats = dir.join("stats.json");
    let summary = dir.join("summary.json");
    let mut cmd = Command::new(common::app("soak_app"));
    cmd.args([
        "--seconds",
        &secs.to_string(),
        "--buffers",
        "12",
        "--max-bytes",
        "16M",
        "--seed",
        &seed.to_string(),
    ]);
    common::hermetic(&mut cmd);
    cmd.env("LD_PRELOAD", common::libu3m())
        .env("U3M_MODE", "tier")
        .env("U3M_SHM_DIR", &dir)
        .env("U3M_SUMMARY", &summary)
        .env("U3M_OVERSUB", "4")
        .env("U3M_DRAM_BYTES", "256M")
        .env("ACLSIM_HBM_BYTES", "64M")
        .env("ACLSIM_STATS", &stats)
        .env("ACLSIM_FAULTS", &faults)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("stderr")).unwrap(),
        ));
    eprintln!("soak: {secs} s, seed {seed}, ACLSIM_FAULTS={faults}");
    let mut child = cmd.spawn().expect("soak_app");
    let pid = child.id();
    let (tx, rx) = mpsc::channel::<String>();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let t0 = Instant::now();
    let mut last_progress = Instant::now();
    let mut lines: Vec<String> = Vec::new();
    let mut rss: Vec<(f64, u64)> = Vec::new();
    let status = loop {
        while let Ok(l) = rx.try_recv() {
            last_progress = Instant::now();
            lines.push(l);
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if let Some(k) = rss_kib(pid) {
            rss.push((t0.elapsed().as_secs_f64(), k));
        }
        let hung = last_progress.elapsed() > Duration::from_secs(60);
        let late = t0.elapsed() > Duration::from_secs(secs + 120);
        if hung || late {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "soak_app {} (watchdog): last output {:?}\nstderr:\n{}",
                if hung {
                    "stopped making progress"
                } else {
                    "ran past its time"
                },
                lines.last(),
                std::fs::read_to_string(dir.join("stderr")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(1000));
    };
    // the reader thread ends with the pipe
    std::thread::sleep(Duration::from_millis(100));
    lines.extend(rx.try_iter());
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    let last = lines.last().cloned().unwrap_or_default();
    let f =
        |k: &str| field(&last, k).unwrap_or_else(|| panic!("{k} missing in {last:?}\n{stderr}"));
    let st: serde_json::Value = std::fs::read_to_string(&stats)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let sum: serde_json::Value = std::fs::read_to_string(&summary)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let injected = st["injected_faults"].as_u64().unwrap_or(0);
    // the simulator logs each injected fault; the map ones must fire too
    let map_faults = stderr.matches("injected fault: map call").count();
    let evictions = sum["tier"]["evictions"].as_u64().unwrap_or(0);
    // the highest RSS sampled in [a, b) sixths of the run
    let sixths = |a: usize, b: usize| -> u64 {
        let dur = secs as f64;
        rss.iter()
            .filter(|(t, _)| *t >= dur * a as f64 / 6.0 && *t < dur * b as f64 / 6.0)
            .map(|&(_, k)| k)
            .max()
            .unwrap_or(0)
    };
    // RSS swings by ~150 MiB with the program's random buffer sizes (a
    // 120-s run: 460-617 MiB, no trend): the reference is the peak over
    // half the run after a sixth of warm-up, the last third must stay
    // within its bound (a 40-s reference once peaked at 501 MiB and the
    // last third at 618 under load 8)
    let (mid, end) = (sixths(1, 4), sixths(4, 6));
    eprintln!(
        "soak: {} s, {} ops, {} bytes verified, {} corrupted, {} call errors; {injected} faults injected ({map_faults} map, of {} maps); \
         {evictions} evictions; RSS max {} MiB from 1/6 to 2/3 of the run, {} MiB in the last third ({} samples)",
        f("t"),
        f("ops"),
        f("verified_bytes"),
        f("corrupted_bytes"),
        f("errors"),
        st["allocs"]["map"],
        mid / 1024,
        end / 1024,
        rss.len()
    );
    assert!(status.success(), "soak_app exit {status}\n{stderr}");
    assert_eq!(f("corrupted_bytes"), 0, "{stderr}");
    assert!(f("verified_bytes") > 0 && f("ops") > 0);
    assert!(evictions > 0, "no eviction pressure: {sum}");
    assert_eq!(st["mmu_faults"].as_u64(), Some(0), "device MMU faults");
    assert!(injected > 0, "no fault fired: {st}");
    assert!(map_faults > 0, "no map fault fired: {st}");
    // a copy failure fails the call it hits (or the synchronisation after
    // it); an absorbed physical-allocation or map failure fails nothing
    assert!(
        f("errors") <= 2 * n_copy,
        "{} call errors for {n_copy} copy faults:\n{stderr}",
        f("errors")
    );
    assert!(mid > 0 && end > 0, "RSS not sampled: {rss:?}");
    if secs < RSS_TREND_SECS {
        eprintln!(
            "soak: {secs} s is too short for the RSS trend (>= {RSS_TREND_SECS} s): not checked"
        );
        return;
    }
    assert!(
        end <= mid + mid / 10 + 32 * MIB / 1024,
        "RSS grows: {} MiB -> {} MiB",
        mid / 1024,
        end / 1024
    );
}
