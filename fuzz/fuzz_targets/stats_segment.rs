//! The stats-segment reader (core/src/shm/reader.rs) on forged segment
//! files: what `u3m stat`/`top` do with a file in the segment directory that
//! any local user could have written. The input is either a whole file (first
//! byte 0xff: the rest, truncated or not) or a list of patches applied to a
//! real segment written by the library's own writer (each patch: 3 bytes of
//! little-endian offset, 1 byte of length, the bytes). Opening must succeed
//! or fail with an `OpenError`; a reader that opened must read the snapshot,
//! configuration, hot table and event tail without panicking or hanging.
#![no_main]
use libfuzzer_sys::fuzz_target;
mod checks;

fuzz_target!(|data: &[u8]| checks::stats_segment(data));
