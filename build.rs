//! Generates the pool of aclnn execute-phase trampolines: one distinct
//! function per slot (aclnn_tramp::<N>), so each aclnn operator a program
//! looks up gets its own entry point that knows which real function to call.

use std::fmt::Write;

const SLOTS: usize = 1024;

fn main() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("aclnn_tramps.rs");
    let mut s = String::new();
    writeln!(s, "pub const SLOTS: usize = {SLOTS};").unwrap();
    writeln!(s, "pub static TRAMPOLINES: [ExecFn; SLOTS] = [").unwrap();
    for i in 0..SLOTS {
        writeln!(s, "    tramp::<{i}>,").unwrap();
    }
    writeln!(s, "];").unwrap();
    std::fs::write(out, s).unwrap();
    println!("cargo:rerun-if-changed=build.rs");
}
