//! `u3m ab` end to end on the simulator: mlp_train at 1.5 × a small HBM fails
//! with 207001 on the stock runtime and completes under libu3m.so (tier) with
//! the checksum of an unconstrained run; the JSON carries the documented
//! fields; arms that fail or die are results, not errors of `u3m ab`.

mod common;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;
/// A 4-layer MLP of hidden width 1620 plans 102420480 bytes: 1.48 × 66 MiB
/// (the largest such footprint under u3m's default 1.5 × virtual capacity;
/// each Adam update touches 48 MiB, which fits).
const HBM: &str = "66M";
const MLP: &[&str] = &["--hidden", "1620", "--batch", "16", "--steps", "2"];

fn u3m() -> PathBuf {
    let p = common::target_dir().join("u3m");
    assert!(
        p.exists(),
        "{} missing: run `cargo build --release --workspace` first",
        p.display()
    );
    p
}

/// `u3m ab` with a hermetic environment; libu3m.so's segments go to a
/// private directory.
fn ab(name: &str, args: &[&str]) -> Output {
    let shm = common::scratch(&format!("ab-{name}-shm"));
    let mut c = Command::new(u3m());
    c.arg("ab")
        .arg("-e")
        .arg(format!("U3M_SHM_DIR={}", shm.display()))
        .args(args);
    common::hermetic(&mut c);
    let out = c.output().unwrap();
    assert_eq!(
        std::fs::read_dir(&shm).unwrap().count(),
        0,
        "a stats segment was left in {}",
        shm.display()
    );
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn app(p: &str) -> String {
    common::app(p).to_str().unwrap().to_string()
}

/// Every field the JSON documents (tools/src/ab.rs), per arm.
const ARM_FIELDS: &[&str] = &[
    "arm",
    "preload",
    "mode",
    "exit_code",
    "signal",
    "acl_error",
    "status",
    "wall_s",
    "result",
    "results",
    "checksum",
    "final_loss",
    "requests_served",
    "hbm_bytes",
    "peak_hbm_bytes",
    "sim_ns",
    "h2d_bytes",
    "d2h_bytes",
    "d2d_bytes",
    "mmu_faults",
    "tier",
    "last_error",
    "simulator",
    "summary",
];

#[test]
fn mlp_train_at_1_5x_hbm_fails_stock_and_matches_under_tier() {
    let reference = common::run("mlp_train", MLP, &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    let fp: u64 = reference.fact("footprint_bytes").unwrap().parse().unwrap();
    let x = fp as f64 / (66 * MIB) as f64;
    assert!((1.45..=1.5).contains(&x), "footprint {fp} is {x:.3} x HBM");

    let mut args = vec!["--json", "--hbm", HBM, "--ref-hbm", "1G", "--"];
    let prog = app("mlp_train");
    args.push(&prog);
    args.extend_from_slice(MLP);
    let out = ab("mlp", &args);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));

    assert_eq!(v["schema"], 1);
    assert_eq!(v["command"][0], prog.as_str());
    assert_eq!(v["reference"], "ref");
    let arms = v["arms"].as_array().unwrap();
    let names: Vec<&str> = arms.iter().map(|a| a["arm"].as_str().unwrap()).collect();
    assert_eq!(names, ["ref", "stock", "tier"]);
    for a in arms {
        for f in ARM_FIELDS {
            assert!(a.get(*f).is_some(), "arm {} lacks {f}: {a}", a["arm"]);
        }
        assert_eq!(a["mmu_faults"], 0, "{}", a["arm"]);
    }
    let (r, stock, tier) = (&arms[0], &arms[1], &arms[2]);

    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["result"], "reference");
    assert_eq!(
        r["checksum"].as_str(),
        reference.fact("checksum").as_deref()
    );
    assert_eq!(r["hbm_bytes"], 1u64 << 30);

    assert_eq!(stock["exit_code"], 2, "{stock}");
    assert_eq!(stock["acl_error"], 207001);
    assert!(
        stock["status"].as_str().unwrap().contains("207001"),
        "{}",
        stock["status"]
    );
    assert_eq!(stock["result"], "-");
    assert_eq!(stock["preload"], false);
    assert!(stock["tier"].is_null() && stock["summary"].is_null());
    assert!(stock["last_error"]
        .as_str()
        .unwrap()
        .contains("ACL error 207001"));

    assert_eq!(tier["exit_code"], 0, "{tier}");
    assert_eq!(tier["result"], "same");
    assert_eq!(tier["mode"], "tier");
    assert_eq!(
        tier["checksum"].as_str(),
        reference.fact("checksum").as_deref(),
        "checksum of an unconstrained run"
    );
    assert_eq!(
        tier["final_loss"].as_str(),
        reference.fact("final_loss").as_deref()
    );
    assert_eq!(tier["results"], r["results"]);
    assert_eq!(tier["hbm_bytes"], 66 * MIB);
    assert!(tier["peak_hbm_bytes"].as_u64().unwrap() <= 66 * MIB);
    assert!(tier["sim_ns"].as_u64().unwrap() > 0);
    assert!(
        tier["h2d_bytes"].as_u64().unwrap() > r["h2d_bytes"].as_u64().unwrap(),
        "fault-in copies"
    );
    let t = &tier["tier"];
    assert!(
        t["evictions"].as_u64().unwrap() > 0 && t["faults_in"].as_u64().unwrap() > 0,
        "{t}"
    );
    assert_eq!(
        t["to_dram_bytes"].as_u64().unwrap(),
        t["to_dram"].as_u64().unwrap() * 2 * MIB
    );
    assert_eq!(tier["summary"]["mode"], "tier");
    assert!(tier["last_error"].is_null());
    assert!(
        tier["requests_served"].is_null(),
        "mlp_train serves no requests"
    );
}

#[test]
fn table_shows_arms_side_by_side() {
    let prog = app("mlp_train");
    let out = ab(
        "table",
        &[
            "--arms",
            "stock,observe,tier",
            "--",
            &prog,
            "--hidden",
            "64",
            "--batch",
            "4",
            "--steps",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let t = text(&out.stdout);
    let row = |label: &str| -> Vec<String> {
        let l = t
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no row {label}:\n{t}"));
        l[label.len()..]
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(String::from)
            .collect()
    };
    let lines: Vec<&str> = t.lines().collect();
    let header = lines[lines
        .iter()
        .position(|l| l.starts_with("exit status"))
        .expect(&t)
        - 1];
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["stock", "observe", "tier"],
        "{t}"
    );
    assert_eq!(row("exit status"), ["0", "0", "0"], "{t}");
    assert_eq!(row("result"), ["reference", "same", "same"], "{t}");
    let ck = row("checksum");
    assert!(ck.iter().all(|c| c == &ck[0] && c.len() == 16), "{t}");
    assert_eq!(
        row("faults-in (to HBM)")[0],
        "-",
        "no u3m counters for the stock arm:\n{t}"
    );
    assert_eq!(row("MMU faults (simulator)"), ["0", "0", "0"]);
    assert!(row("device time (simulated)")
        .iter()
        .all(|c| c.ends_with(" ms")));
    assert!(t.contains("libu3m.so, U3M_MODE=observe"), "{t}");
}

#[test]
fn failures_of_the_program_are_results_not_errors() {
    // killed by a signal, and a program that prints different results per arm
    let out = ab(
        "signal",
        &[
            "--json",
            "--arms",
            "stock,observe",
            "--",
            "sh",
            "-c",
            "kill -9 $$",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for a in v["arms"].as_array().unwrap() {
        assert_eq!(a["signal"], 9, "{a}");
        assert!(a["exit_code"].is_null());
        assert_eq!(a["status"], "killed by signal 9 (SIGKILL)");
        assert_eq!(a["result"], "-");
    }
    assert!(v["reference"].is_null());
    let out = ab(
        "differs",
        &[
            "--json",
            "--mode",
            "observe",
            "--",
            "sh",
            "-c",
            r#"echo "checksum=${LD_PRELOAD:+u3m}stock""#,
        ],
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["arms"][0]["checksum"], "stock");
    assert_eq!(v["arms"][1]["checksum"], "u3mstock");
    assert_eq!(v["arms"][1]["result"], "differs");
    assert!(v["arms"][0]["simulator"].is_null(), "no simulator in sh");
}

#[test]
fn files_the_user_names_are_used_and_read_per_arm() {
    let dir = common::scratch("ab-user-files");
    let stats = dir.join("stats.json");
    let _ = std::fs::remove_file(&stats);
    let prog = app("mlp_train");
    let e = format!("ACLSIM_STATS={}", stats.display());
    let out = ab(
        "user",
        &[
            "--json", "--mode", "observe", "-e", &e, "--", &prog, "--hidden", "64", "--steps", "1",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for a in v["arms"].as_array().unwrap() {
        assert!(a["simulator"]["ops"].as_u64().unwrap() > 0, "{a}");
        assert_eq!(
            a["result"],
            if a["arm"] == "stock" {
                "reference"
            } else {
                "same"
            }
        );
    }
    assert!(stats.exists(), "the user's stats file is theirs to keep");
}

#[test]
fn usage_errors_and_missing_pieces() {
    let code = |args: &[&str]| ab("usage", args);
    for bad in [
        &["--arms", "stock,bogus", "--", "true"][..],
        &["--mode", "tier", "--arms", "stock", "true"],
        &[],
    ] {
        let out = code(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
        assert!(out.stdout.is_empty());
    }
    let out = code(&["--lib", "/nonexistent/libu3m.so", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("libu3m.so not found at /nonexistent/libu3m.so"),
        "{}",
        text(&out.stderr)
    );
    // The stock arm alone needs no libu3m.so.
    let out = code(&[
        "--arms",
        "stock",
        "--lib",
        "/nonexistent/libu3m.so",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = code(&["--", "/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        text(&out.stderr).contains("cannot run '/nonexistent/program'"),
        "{}",
        text(&out.stderr)
    );
    let out = code(&[
        "--dry-run",
        "--hbm",
        "64M",
        "--oversub",
        "3",
        "--",
        "prog",
        "a",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let t = text(&out.stdout);
    let tier = &t[t.find("# arm tier").expect(&t)..];
    let stock = &t[..t.find("# arm tier").unwrap()];
    assert!(
        stock.contains("ACLSIM_HBM_BYTES=64M")
            && !stock.contains("U3M_OVERSUB")
            && !stock.contains("libu3m"),
        "{t}"
    );
    assert!(
        tier.contains("U3M_MODE=tier\n")
            && tier.contains("U3M_OVERSUB=3\n")
            && tier.contains("libu3m.so"),
        "{t}"
    );
    assert!(t.ends_with("prog a\n"), "{t}");
}

/// Issue 14: `u3m ab` hid libu3m.so's configuration line, so u3m looked
/// broken. Invalid values stop `u3m ab` before any arm runs (exit 2, every
/// reason); what the library finds at start-up shows in the table and JSON.
#[test]
fn configuration_errors_are_shown_not_hidden() {
    let out = ab(
        "config-bad",
        &[
            "--oversub",
            "0.5",
            "-e",
            "U3M_OVERSUBB=2",
            "--",
            &app("mlp_train"),
            "--steps",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    for n in [
        "u3m ab (tier arm): invalid settings, nothing was started:",
        "U3M_OVERSUB: '0.5' is outside 1..64",
        "U3M_OVERSUBB: unknown variable (did you mean U3M_OVERSUB?)",
    ] {
        assert!(err.contains(n), "{n} missing:\n{err}");
    }
    let out = ab(
        "config-start",
        &[
            "--hbm",
            "256M",
            "--swap-dir",
            "/no/such/dir",
            "--",
            &app("mlp_train"),
            "--steps",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("u3m warnings/errors"), "{table}");
    assert!(
        table.contains("tier (libu3m.so):")
            && table.contains("cannot start: U3M_SWAP_DIR=/no/such/dir"),
        "{table}"
    );
    assert!(table.contains("(ACL error 100000)"), "{table}");
}
