//! `u3m completions` and `u3m man`, generated from the clap definitions:
//! they know every command and option, and the man page every variable.

use std::process::Command;

fn u3m(args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_u3m"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

const COMMANDS: &[&str] = &[
    "stat",
    "top",
    "run",
    "ab",
    "plan",
    "replay",
    "synth",
    "doctor",
    "completions",
    "man",
];

#[test]
fn completions_know_every_command_and_option() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (code, out) = u3m(&["completions", shell]);
        assert_eq!(code, 0, "{shell}");
        for c in COMMANDS {
            assert!(out.contains(c), "{shell}: {c} missing");
        }
        assert!(
            out.contains("oversub") && out.contains("swap-dir"),
            "{shell}: run options"
        );
    }
    // the bash script is valid bash and registers itself
    let (_, out) = u3m(&["completions", "bash"]);
    assert!(out.contains("complete -F _u3m"), "{out}");
    let f = std::env::temp_dir().join(format!("u3m-completion-{}.bash", std::process::id()));
    std::fs::write(&f, &out).unwrap();
    let st = Command::new("bash").arg("-n").arg(&f).status().unwrap();
    assert!(st.success(), "bash -n rejects the completion script");
    let _ = std::fs::remove_file(&f);
    let (code, _) = u3m(&["completions", "tcsh"]);
    assert_eq!(code, 2, "an unknown shell is a usage error");
}

#[test]
fn man_page_has_every_command_and_variable() {
    let (code, page) = u3m(&["man"]);
    assert_eq!(code, 0);
    assert!(page.contains(".TH u3m 1 "), "{page}");
    for c in COMMANDS {
        assert!(
            page.contains(&format!("u3m\\-{}", c.replace('-', "\\-"))) || page.contains(c),
            "{c}"
        );
    }
    assert!(page.contains(".SH ENVIRONMENT"));
    for v in u3m_core::config::VARS {
        assert!(
            page.contains(&v.name.replace('-', "\\-")),
            "{} missing",
            v.name
        );
    }
    assert!(page.contains("U3M_SKIP_TORCH"));
    let dir = std::env::temp_dir().join(format!("u3m-man-{}", std::process::id()));
    let (code, _) = u3m(&["man", "--dir", dir.to_str().unwrap()]);
    assert_eq!(code, 0);
    for c in COMMANDS {
        let p = dir.join(format!("u3m-{c}.1"));
        let t = std::fs::read_to_string(&p).unwrap_or_else(|_| panic!("{} missing", p.display()));
        assert!(t.contains(&format!(".TH u3m-{c} 1")), "{}", p.display());
    }
    let run = std::fs::read_to_string(dir.join("u3m-run.1")).unwrap();
    assert!(run.contains("\\-\\-oversub"), "u3m-run.1 lists the options");
    assert!(dir.join("u3m.1").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}
