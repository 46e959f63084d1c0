//! `u3m doctor` on the simulator's stand-in CANN install
//! (target/release/cann, what its set_env.sh sets), and with each thing it
//! checks broken in turn.

use std::path::PathBuf;
use std::process::{Command, Output};

fn u3m() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_u3m"))
}

/// The fake CANN install next to the binaries (shim/build.rs makes it).
fn cann() -> PathBuf {
    let c = u3m().parent().unwrap().join("cann");
    assert!(
        c.join("set_env.sh").is_file(),
        "{} missing: run `cargo build --release --workspace` first",
        c.display()
    );
    c
}

/// `u3m doctor` with a clean environment plus `env` (what set_env.sh sets
/// when `with_cann`).
fn doctor(with_cann: bool, env: &[(&str, &str)]) -> (i32, String) {
    let mut c = Command::new(u3m());
    c.arg("doctor")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap());
    if with_cann {
        let home = cann();
        c.env("ASCEND_HOME_PATH", &home)
            .env("ASCEND_OPP_PATH", home.join("opp"))
            .env("LD_LIBRARY_PATH", home.join("lib64"));
    }
    c.envs(env.iter().copied());
    let o: Output = c.output().unwrap();
    // the loader's own complaint about a made-up LD_PRELOAD is not ours
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.lines().all(|l| l.starts_with("ERROR: ld.so:")), "{err}");
    (
        o.status.code().unwrap(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

fn line<'a>(out: &'a str, what: &str) -> &'a str {
    out.lines()
        .find(|l| l.get(6..).is_some_and(|r| r.starts_with(what)))
        .unwrap_or_else(|| panic!("no {what} line in:\n{out}"))
}

#[test]
fn a_sound_setup_passes_every_check() {
    let swap = std::env::temp_dir().join(format!("u3m-doctor-swap-{}", std::process::id()));
    std::fs::create_dir_all(&swap).unwrap();
    let (code, out) = doctor(true, &[("U3M_SWAP_DIR", swap.to_str().unwrap())]);
    assert_eq!(code, 0, "{out}");
    let l = line(&out, "libascendcl.so");
    assert!(l.starts_with("ok  "), "{l}");
    assert!(
        l.contains(&format!("{}/lib64/libascendcl.so", cann().display()))
            && l.contains(&format!("CANN 8.0.RC3 in {}", cann().display())),
        "{l}"
    );
    assert!(line(&out, "swap directory").contains(&format!("{} writable", swap.display())));
    assert!(line(&out, "locked memory").contains("RLIMIT_MEMLOCK "));
    assert!(line(&out, "huge pages").contains("transparent huge pages: "));
    assert!(out.ends_with("u3m doctor: all 7 checks ok\n"), "{out}");
    let _ = std::fs::remove_dir_all(&swap);
}

#[test]
fn each_problem_is_named_with_its_fix() {
    // no CANN environment: libascendcl.so is nowhere to be found
    let (code, out) = doctor(false, &[]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "libascendcl.so");
    assert!(l.starts_with("FAIL") && l.contains("not found"), "{l}");
    assert!(out.contains("fix:") && out.contains("set_env.sh"), "{out}");

    for (env, what, needle) in [
        (
            vec![("U3M_SWAP_DIR", "/no/such/dir")],
            "swap directory",
            "/no/such/dir: No such file or directory",
        ),
        (
            vec![("U3M_OVERSUB", "0.5")],
            "U3M_* settings",
            "U3M_OVERSUB: '0.5' is outside 1..64",
        ),
        (
            vec![("LD_PRELOAD", "/opt/libascendcl.so:/opt/libu3m.so")],
            "libu3m.so / LD_PRELOAD",
            "/opt/libascendcl.so comes before libu3m.so",
        ),
    ] {
        let (code, out) = doctor(true, &env);
        assert_eq!(code, 1, "{env:?}: {out}");
        let l = line(&out, what);
        assert!(l.starts_with("FAIL") && l.contains(needle), "{env:?}: {l}");
        assert!(out.contains("u3m doctor: 1 failed"), "{out}");
    }
    // a typo is a warning, not a failure
    let (code, out) = doctor(true, &[("U3M_OVERSUBB", "2")]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "U3M_* settings").starts_with("warn"), "{out}");
}
