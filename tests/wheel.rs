//! The Python wheel: python/build-wheel.sh builds it with maturin (from PyPI,
//! into a build venv cached under ~/.cache/u3m); `pip install` into a fresh
//! venv gives `u3m` on PATH, `python -m u3m run -- ...` and
//! `u3m.preload_path()`, and mlp_train at 1.4x HBM runs under the installed
//! `u3m run` with the result of an unconstrained run. The workload finds the
//! simulator through its own $ORIGIN runpath, nothing the wheel sets.
//! `U3M_SKIP_WHEEL=1` skips this test offline (maturin comes from PyPI).

mod common;
use common::{app, scratch};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn ok(o: Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what} failed ({}):\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `cmd` with the test's U3M_*/ACLSIM_*/LD_PRELOAD removed and PATH = the venv's bin first.
fn clean<'a>(cmd: &'a mut Command, venv: &Path) -> &'a mut Command {
    common::hermetic(cmd);
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.env("PATH", format!("{}:{path}", venv.join("bin").display()))
}

/// The result lines of mlp_train (timings differ between runs).
fn results(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter(|l| {
            l.starts_with("checksum=") || l.starts_with("step=") || l.starts_with("final_loss=")
        })
        .map(|l| l.to_string())
        .collect()
}

#[test]
fn the_installed_wheel_runs_a_workload_under_u3m() {
    if std::env::var("U3M_SKIP_WHEEL").is_ok_and(|v| v == "1") {
        eprintln!(
            "NOTICE: U3M_SKIP_WHEEL=1: the wheel test is skipped (it needs maturin from PyPI)"
        );
        return;
    }
    let dir = scratch("wheel");
    let out = ok(
        Command::new("bash")
            .arg(repo().join("python/build-wheel.sh"))
            .arg(dir.join("dist"))
            .output()
            .unwrap(),
        "python/build-wheel.sh",
    );
    let wheel = PathBuf::from(out.trim());
    assert!(wheel.is_file(), "{out}");

    // a fresh venv; without its own pip (ensurepip takes ~15 s here) the
    // machine's pip installs into it (`pip --python`, pip >= 22.3)
    let venv = dir.join("venv");
    let py = venv.join("bin/python");
    let quick = Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap()
        .success()
        && Command::new("python3")
            .args(["-m", "pip", "--python"])
            .arg(&py)
            .args(["install", "-q", "--no-index", "--no-deps"])
            .arg(&wheel)
            .status()
            .unwrap()
            .success();
    if !quick {
        let _ = std::fs::remove_dir_all(&venv);
        ok(
            Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .output()
                .unwrap(),
            "python3 -m venv",
        );
        ok(
            Command::new(&py)
                .args(["-m", "pip", "install", "-q", "--no-index", "--no-deps"])
                .arg(&wheel)
                .output()
                .unwrap(),
            "pip install",
        );
    }
    // u3m on PATH is the wheel's
    let v = ok(
        clean(&mut Command::new("u3m"), &venv)
            .arg("--version")
            .output()
            .unwrap(),
        "u3m --version",
    );
    assert_eq!(v, format!("u3m {}\n", u3m_core::VERSION));
    let which = ok(
        clean(&mut Command::new("sh"), &venv)
            .args(["-c", "command -v u3m"])
            .output()
            .unwrap(),
        "command -v",
    );
    assert_eq!(Path::new(which.trim()), venv.join("bin/u3m"));
    // preload_path() names the installed library
    let lib = ok(
        Command::new(&py)
            .args(["-c", "import u3m; print(u3m.preload_path())"])
            .output()
            .unwrap(),
        "u3m.preload_path()",
    );
    assert_eq!(Path::new(lib.trim()), venv.join("lib/u3m/libu3m.so"));

    let args = ["--footprint", "120M", "--steps", "2"];
    let big = ok(
        clean(&mut Command::new(app("mlp_train")), &venv)
            .args(args)
            .env("ACLSIM_HBM_BYTES", "2G")
            .output()
            .unwrap(),
        "mlp_train with 2G",
    );
    let expect = results(&big);
    assert!(
        expect.len() == 4 && expect[3].starts_with("checksum="),
        "{big}"
    );
    for (how, mut cmd) in [
        ("u3m run", {
            let mut c = Command::new("u3m");
            c.arg("run");
            c
        }),
        ("python -m u3m run", {
            let mut c = Command::new(&py);
            c.args(["-m", "u3m", "run"]);
            c
        }),
    ] {
        let summary = dir.join(format!("summary-{}.json", how.len()));
        let out = ok(
            clean(&mut cmd, &venv)
                .args(["--", app("mlp_train").to_str().unwrap()])
                .args(args)
                .env("U3M_MODE", "tier")
                .env("U3M_SUMMARY", &summary)
                .env("U3M_SHM_DIR", &dir)
                .env("ACLSIM_HBM_BYTES", "96M")
                .output()
                .unwrap(),
            how,
        );
        assert_eq!(
            results(&out),
            expect,
            "{how}: results differ from the unconstrained run"
        );
        // the library was really loaded, and really moved memory
        let s: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&summary).unwrap_or_else(|e| panic!("{how}: no summary: {e}")),
        )
        .unwrap();
        assert_eq!(s["mode"], "tier", "{how}: {s}");
        assert!(s["tier"]["evictions"].as_u64().unwrap() > 0, "{how}: {s}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
