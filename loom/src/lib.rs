//! The sources under test, compiled against loom's atomics (only with
//! `--cfg loom`; see Cargo.toml and ci/loom.sh).
#![cfg(loom)]
#![allow(dead_code, unused_imports, clippy::all)]

#[path = "../../core/src/opclass.rs"]
pub mod opclass;

#[path = "../../core/src/heat/record.rs"]
pub mod record;

pub mod fence_slot;
pub mod seqlock;

#[cfg(test)]
mod fence_slot_loom;
#[cfg(test)]
mod record_loom;
#[cfg(test)]
mod seqlock_loom;
