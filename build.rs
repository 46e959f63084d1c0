//! Generates the pool of aclnn execute-phase trampolines: one distinct
//! function per slot (aclnn_tramp::<N>), so each aclnn operator a program
//! looks up gets its own entry point that knows which real function to call;
//! likewise for the GetWorkspaceSize phases (aclnn_gws_tramp::<N>).

use std::fmt::Write;

const SLOTS: usize = 1024;
const GWS_SLOTS: usize = 512;

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

    // the GetWorkspaceSize trampolines (aclnn_bind::gws_tramp::<N>), one per
    // operator whose prototype u3m knows
    let out =
        std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("aclnn_gws_tramps.rs");
    let mut s = String::new();
    writeln!(s, "pub const GWS_SLOTS: usize = {GWS_SLOTS};").unwrap();
    writeln!(s, "pub static GWS_TRAMPOLINES: [GwsFn; GWS_SLOTS] = [").unwrap();
    for i in 0..GWS_SLOTS {
        writeln!(s, "    gws_tramp::<{i}>,").unwrap();
    }
    writeln!(s, "];").unwrap();
    std::fs::write(out, s).unwrap();
    println!("cargo:rerun-if-changed=build.rs");
}
