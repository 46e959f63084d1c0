//! deploy/exporter-daemonset.yaml: the exporter's DaemonSet. Schema-checked
//! with `kubernetes-validate --strict` (PyPI; it bundles the Kubernetes JSON
//! schemas and works offline once installed into a venv cached under
//! ~/.cache/u3m; `U3M_SKIP_DEPLOY_SCHEMA=1` skips that part offline), plus a
//! structural check of what the exporter needs: hostPID, the host's /dev/shm,
//! the port the exporter listens on by default, a command the CLI accepts.

mod common;
use common::target_dir;
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const VALIDATOR: &str = "kubernetes-validate==1.37.0";

/// The validator's executable, installed on first use.
fn validator() -> Option<PathBuf> {
    if std::env::var("U3M_SKIP_DEPLOY_SCHEMA").is_ok_and(|v| v == "1") {
        eprintln!("NOTICE: U3M_SKIP_DEPLOY_SCHEMA=1: the Kubernetes schema check is skipped");
        return None;
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into());
    let venv = std::env::var_os("U3M_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cache/u3m"))
        .join("k8s-validate-venv");
    let exe = venv.join("bin/kubernetes-validate");
    if !exe.is_file() {
        // no pip of its own (ensurepip is slow): the machine's pip installs into it
        let pip_into = |venv_pip: bool| {
            let _ = std::fs::remove_dir_all(&venv);
            let mut v = Command::new("python3");
            v.args(["-m", "venv"]);
            if !venv_pip {
                v.arg("--without-pip");
            }
            v.arg(&venv).status().unwrap().success()
                && if venv_pip {
                    Command::new(venv.join("bin/pip"))
                        .args(["install", "-q", VALIDATOR])
                        .status()
                        .unwrap()
                        .success()
                } else {
                    Command::new("python3")
                        .args(["-m", "pip", "--python"])
                        .arg(venv.join("bin/python"))
                        .args(["install", "-q", VALIDATOR])
                        .status()
                        .unwrap()
                        .success()
                }
        };
        assert!(
            pip_into(false) || pip_into(true),
            "cannot install {VALIDATOR} (offline? U3M_SKIP_DEPLOY_SCHEMA=1 skips this check)"
        );
    }
    Some(exe)
}

#[test]
fn daemonset_passes_the_kubernetes_schema_and_has_what_the_exporter_needs() {
    let path = repo().join("deploy/exporter-daemonset.yaml");
    let y = std::fs::read_to_string(&path).unwrap();
    // structural: what the exporter needs from the pod
    for want in [
        "kind: DaemonSet",
        "hostPID: true",
        "mountPath: /dev/shm",
        "path: /dev/shm",
        "containerPort: 19420",
        "add: [\"DAC_READ_SEARCH\"]",
    ] {
        assert!(y.contains(want), "{want} missing from {}", path.display());
    }
    // the port is the exporter's default
    let help = Command::new(target_dir().join("u3m"))
        .args(["exporter", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("[default: 0.0.0.0:19420]"), "{help}");
    // the container's command is one the CLI accepts (clap reports a bad
    // one with status 2 before listening; a good one is stopped at once
    // with a port that cannot be bound)
    let line = y
        .lines()
        .find(|l| l.trim_start().starts_with("command:"))
        .unwrap();
    let args: Vec<String> = line
        .split('[')
        .nth(1)
        .unwrap()
        .trim_end_matches(']')
        .split(',')
        .map(|a| a.trim().trim_matches('"').to_string())
        .collect();
    assert_eq!(args[..2], ["u3m", "exporter"]);
    let mut a = args[2..].to_vec();
    let i = a.iter().position(|x| x == "--listen").unwrap();
    a[i + 1] = "256.0.0.1:1".into(); // not an address: clap refuses it, so parse the rest without it
    let o = Command::new(target_dir().join("u3m"))
        .arg("exporter")
        .args(&args[2..i + 2])
        .arg("--help")
        .output()
        .unwrap();
    assert!(o.status.success());
    let o = Command::new(target_dir().join("u3m"))
        .arg("exporter")
        .args(&a)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--listen"),
        "only the address was wrong: {err}"
    );

    let Some(v) = validator() else {
        return;
    };
    let out = Command::new(&v)
        .args(["--strict", "-k", "1.30.0"])
        .arg(&path)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("passed for resource daemonset/u3m-exporter"),
        "{text}"
    );
    assert!(
        text.contains("passed for resource service/u3m-exporter"),
        "{text}"
    );
    // and the validator does reject a broken manifest
    let bad = std::env::temp_dir().join(format!("u3m-bad-ds-{}.yaml", std::process::id()));
    std::fs::write(&bad, y.replace("hostPID: true", "hostPid: true")).unwrap();
    let out = Command::new(&v)
        .args(["--strict", "-k", "1.30.0"])
        .arg(&bad)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&bad);
    assert!(
        !out.status.success(),
        "a misspelt field passed the strict schema"
    );
}
