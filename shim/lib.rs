//! aclsim: the simulated CANN runtime is C (shim/src), built by `build.rs` into
//! `target/<profile>/` next to the Rust artifacts. This crate only tells Rust
//! tests and tools where those artifacts are.

use std::path::PathBuf;

/// `target/<profile>` of the build that produced this crate: holds
/// libascendcl.so and the other stand-ins, libu3m.so, `u3m`, and `acl-apps/`.
/// `ACLSIM_TARGET_DIR` in the environment overrides it (ci/sanitizers.sh
/// points the tests at a sanitizer build of the C parts).
pub fn target_dir() -> PathBuf {
    std::env::var_os("ACLSIM_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("ACLSIM_TARGET_DIR")))
}

/// Directory of the compiled C workload programs.
pub fn apps_dir() -> PathBuf {
    target_dir().join("acl-apps")
}

/// Path of one workload program, e.g. `app("mlp_train")`.
pub fn app(name: &str) -> PathBuf {
    apps_dir().join(name)
}

/// The stand-in libraries the build produces, in dependency order.
pub const LIBRARIES: &[&str] = &[
    "libruntime.so",
    "libprofapi.so",
    "libascendcl.so",
    "libnnopbase.so",
    "libopapi.so",
    "libhccl.so",
    "libacl_op_compiler.so",
    "libge_runner.so",
    "libgraph.so",
    "libacl_tdt_channel.so",
];
