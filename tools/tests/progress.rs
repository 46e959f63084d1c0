//! Long commands show progress on a terminal and nothing extra in a pipe;
//! `synth` ends with a one-line result.

use std::process::Command;

fn u3m() -> &'static str {
    env!("CARGO_BIN_EXE_u3m")
}

fn synth(path: &std::path::Path) -> std::process::Output {
    Command::new(u3m())
        .args([
            "synth",
            "--model",
            "llama2-7b",
            "--workload",
            "adam",
            "--scale",
            "64",
            "--layers",
            "4",
            "-o",
        ])
        .arg(path)
        .output()
        .unwrap()
}

#[test]
fn piped_synth_says_one_line_and_replay_nothing_extra() {
    let t = std::env::temp_dir().join(format!("u3m-progress-{}.trace", std::process::id()));
    let o = synth(&t);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.stdout.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("u3m synth: wrote {} (", t.display()))
            && err.contains(" events, ")
            && err.contains(" operators, "),
        "{err}"
    );
    assert!(!err.contains('\r'), "progress in a pipe");
    let o = Command::new(u3m())
        .arg("replay")
        .arg(&t)
        .args(["--hbm", "1G"])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = std::fs::remove_file(&t);
}

/// Under a pseudo-terminal (script(1), from util-linux) replay redraws one
/// line per stage and clears it before the report.
#[test]
fn replay_on_a_terminal_shows_each_stage() {
    let t = std::env::temp_dir().join(format!("u3m-progress-tty-{}.trace", std::process::id()));
    assert!(synth(&t).status.success());
    let cmd = format!("{} replay {} --hbm 1G", u3m(), t.display());
    let o = Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .output()
        .expect("script(1) (util-linux) is needed");
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    for stage in ["reading ", "baseline (1/", "predictive (", "belady ("] {
        assert!(
            out.contains(&format!("\r\x1b[Ku3m replay: /")) || stage == "reading ",
            "{out:?}"
        );
        assert!(out.contains(stage), "{stage} missing: {out:?}");
    }
    // the line is cleared: after the last redraw nothing of it remains
    let last = out.rfind("\r\x1b[K").unwrap();
    assert!(
        !out[last..].contains("u3m replay:"),
        "not cleared: {:?}",
        &out[last..]
    );
    assert!(
        out[last..].contains("belady"),
        "the report follows: {:?}",
        &out[last..]
    );
    let _ = std::fs::remove_file(&t);
}
