//! u3m-core: everything of u3m that is plain, testable Rust with no `extern "C"`
//! exports — the engine the interposer drives (`libu3m.so`, in `src/`) and the
//! code the `u3m` CLI shares with it (the stats segment's layout, the trace
//! format). Exports that interpose live only in the cdylib, so linking this
//! crate into a test or a tool never interposes anything.

pub mod acl;
pub mod config;
pub mod engine;
pub mod heat;
pub mod monitor;
pub mod opclass;
mod perthread;
pub mod plan;
pub mod policy;
pub mod residency;
pub mod roles;
pub mod shm;
pub mod store;
pub mod trace;

/// Version of u3m, reported by the CLI and written into the stats segment.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The tests' deterministic random numbers: xorshift64 from `seed`, each
/// call a value below `m` (0 for m = 0).
#[cfg(test)]
pub(crate) fn test_rng(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed;
    move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m.max(1)
    }
}
