//! The U3M_* configuration parser (core/src/config.rs, `Config::from_vars`,
//! the entry point `Config::from_env` uses) on synthetic environments. Each
//! input line is one variable: a first byte below 0x80 picks a known name
//! from `VARS` (so values reach every parser), anything else is a raw
//! `NAME=VALUE` line. The parser must accept or name the variable at fault,
//! never panic; what it accepts must be internally consistent.
#![no_main]
use libfuzzer_sys::fuzz_target;
mod checks;

fuzz_target!(|data: &[u8]| checks::config(data));
