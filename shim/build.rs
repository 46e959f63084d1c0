//! Builds the simulated CANN runtime (C) and the ACL workload programs with the
//! system C compiler, into fixed paths under `target/<profile>/`:
//!   lib<name>.so          one per directory of shim/src (rt -> libascendcl.so)
//!   acl-apps/<program>    one per tests/apps/<program>.c
//! The satellite libraries link against libascendcl.so (NEEDED + $ORIGIN
//! runpath), as on a real install; the programs find all of them through an
//! $ORIGIN/.. runpath, so nothing needs LD_LIBRARY_PATH.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (library file, source directory under shim/src, extra libraries it links)
const LIBS: &[(&str, &str, &[&str])] = &[
    // rt* kernel launch and the Msprof* reporting interface: NEEDED by
    // libascendcl.so, as on CANN, so that torch_npu's imports resolve
    ("libruntime.so", "runtime", &[]),
    ("libprofapi.so", "profapi", &[]),
    ("libascendcl.so", "rt", &["runtime", "profapi"]),
    ("libnnopbase.so", "nnopbase", &["ascendcl"]),
    ("libopapi.so", "opapi", &["nnopbase", "ascendcl"]),
    ("libhccl.so", "hccl", &["ascendcl"]),
    ("libacl_op_compiler.so", "op_compiler", &["ascendcl"]),
    ("libge_runner.so", "stubs/ge_runner", &[]),
    ("libgraph.so", "stubs/graph", &[]),
    ("libacl_tdt_channel.so", "stubs/acl_tdt_channel", &[]),
];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().to_path_buf();
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    // OUT_DIR = target/<profile>/build/aclsim-<hash>/out
    let target = out_dir.ancestors().nth(3).unwrap().to_path_buf();
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let include = manifest.join("include");
    let src = manifest.join("src");
    let profile_opt = if env::var("PROFILE").as_deref() == Ok("release") {
        "-O2"
    } else {
        "-O1"
    };

    println!("cargo:rustc-env=ACLSIM_TARGET_DIR={}", target.display());
    println!(
        "cargo:rerun-if-changed={}",
        manifest.join("include").display()
    );
    println!("cargo:rerun-if-changed={}", src.display());
    println!(
        "cargo:rerun-if-changed={}",
        root.join("tests/apps").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        root.join("tests/torch").display()
    );
    println!("cargo:rerun-if-env-changed=CXX");
    println!("cargo:rerun-if-env-changed=CC");

    let common: Vec<String> = vec![
        profile_opt.into(),
        "-g".into(),
        "-std=gnu11".into(),
        "-Wall".into(),
        "-Wextra".into(),
        "-Wno-unused-parameter".into(),
        "-Werror=implicit-function-declaration".into(),
        "-pthread".into(),
        format!("-I{}", include.display()),
        format!("-I{}", src.display()),
    ];

    for (lib, dir, deps) in LIBS {
        let sources = c_files(&src.join(dir));
        if sources.is_empty() {
            panic!("no C sources in {}", src.join(dir).display());
        }
        let out = target.join(lib);
        let mut cmd = Command::new(&cc);
        cmd.args(&common)
            .args(["-shared", "-fPIC", "-fvisibility=hidden"])
            .arg(format!("-Wl,-soname,{lib}"))
            .args(&sources)
            .arg("-o")
            .arg(&out)
            .arg(format!("-L{}", target.display()))
            .arg("-Wl,-rpath,$ORIGIN")
            // a library's calls to its own exports bind locally, so an
            // interposer sees each application call exactly once
            .arg("-Wl,-Bsymbolic-functions")
            .arg("-Wl,--no-undefined");
        // NEEDED even when no symbol is used (libascendcl -> libruntime,
        // libprofapi: the real dependency tree that torch_npu relies on)
        cmd.arg("-Wl,--no-as-needed");
        for d in *deps {
            cmd.arg(format!("-l{d}"));
        }
        cmd.arg("-Wl,--as-needed");
        cmd.args(["-lm", "-ldl"]);
        run(cmd, lib);
    }

    build_torch_harness(&root, &target);
    make_cann_home(&target);

    let apps_src = root.join("tests/apps");
    let apps_out = target.join("acl-apps");
    fs::create_dir_all(&apps_out).unwrap();
    let common_c: Vec<PathBuf> = c_files(&apps_src.join("common"));
    for app in c_files(&apps_src) {
        let name = app.file_stem().unwrap().to_string_lossy().to_string();
        let out = apps_out.join(&name);
        let mut cmd = Command::new(&cc);
        cmd.args(&common)
            .arg(format!("-I{}", apps_src.display()))
            .arg(&app)
            .args(&common_c)
            .arg("-o")
            .arg(&out)
            .arg(format!("-L{}", target.display()))
            .arg("-Wl,-rpath,$ORIGIN/..")
            .arg("-Wl,--enable-new-dtags");
        // dlsym_app reaches every ACL function through dlopen + dlsym, the way
        // torch_npu does: it must not link the runtime at all.
        if !name.starts_with("dlsym") {
            cmd.args([
                "-lhccl",
                "-lopapi",
                "-lnnopbase",
                "-lacl_op_compiler",
                "-lascendcl",
            ]);
        }
        cmd.args(["-lm", "-ldl"]);
        run(cmd, &name);
    }
}

/// The torch_npu test tier's preload (tests/torch/harness_preload.cpp): a
/// workaround for the CUDA build of torch, never part of libu3m.so. See
/// docs/torch-npu.md.
fn build_torch_harness(root: &Path, target: &Path) {
    let src = root.join("tests/torch/harness_preload.cpp");
    if !src.exists() {
        return;
    }
    let cxx = env::var("CXX").unwrap_or_else(|_| "c++".into());
    let mut cmd = Command::new(&cxx);
    cmd.args([
        "-O2",
        "-g",
        "-std=gnu++17",
        "-Wall",
        "-Wextra",
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
    ])
    .arg(&src)
    .arg("-o")
    .arg(target.join("torch_harness_preload.so"))
    .arg("-ldl");
    run(cmd, "torch_harness_preload.so");
}

/// A minimal CANN install tree for torch_npu (`target/<profile>/cann`, used as
/// ASCEND_HOME_PATH): lib64/ holds links to the stand-in libraries (what
/// CANN's set_env.sh puts on LD_LIBRARY_PATH), the runtime/, compiler/ and
/// opp/ directories torch_npu checks for, the version file its
/// get_cann_version() reads, and a set_env.sh.
fn make_cann_home(target: &Path) {
    let home = target.join("cann");
    for d in ["lib64", "runtime", "compiler", "opp/vendors"] {
        fs::create_dir_all(home.join(d)).unwrap();
    }
    for (lib, _, _) in LIBS {
        let link = home.join("lib64").join(lib);
        let dest = PathBuf::from("../..").join(lib);
        if fs::read_link(&link).ok().as_deref() != Some(dest.as_path()) {
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(&dest, &link).unwrap();
        }
    }
    for sub in ["runtime", "compiler"] {
        let link = home.join(sub).join("lib64");
        if fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink("../lib64", &link).unwrap();
        }
    }
    // The version the simulated install reports (a CANN that predates
    // aclsysGetCANNVersion, which the simulator does not provide).
    let version = "8.0.RC3";
    let write = |rel: &str, text: String| {
        let p = home.join(rel);
        if fs::read_to_string(&p).ok().as_deref() != Some(text.as_str()) {
            fs::write(&p, text).unwrap();
        }
    };
    write(
        "ascend_toolkit_install.info",
        format!("package_name=Ascend-cann-toolkit\nversion={version}\ninnerversion=aclsim\narch=x86_64\nos=linux\npath={}\n",
            home.display()),
    );
    for sub in ["runtime", "compiler", "opp"] {
        write(
            &format!("{sub}/version.info"),
            format!("Version={version}\n"),
        );
    }
    write("opp/vendors/config.ini", "load_priority=\n".into());
    write(
        "set_env.sh",
        "# aclsim's stand-in for CANN's set_env.sh: source it to use the simulated runtime\n\
         _aclsim_home=$(cd \"$(dirname \"${BASH_SOURCE[0]:-$0}\")\" && pwd)\n\
         export ASCEND_HOME_PATH=\"$_aclsim_home\"\n\
         export ASCEND_TOOLKIT_HOME=\"$_aclsim_home\"\n\
         export ASCEND_OPP_PATH=\"$_aclsim_home/opp\"\n\
         export LD_LIBRARY_PATH=\"$_aclsim_home/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\"\n\
         unset _aclsim_home\n"
            .into(),
    );
}

fn c_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().map(|x| x == "c").unwrap_or(false))
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

fn run(mut cmd: Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler for {what}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        panic!("building {what} failed:\n{cmd:?}\n{stderr}");
    }
    for line in stderr.lines().filter(|l| l.contains("warning")) {
        println!("cargo:warning={what}: {line}");
    }
}
