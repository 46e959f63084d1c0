//! The trace reader (core/src/trace/reader.rs) on arbitrary bytes: it must
//! return events or a `TraceError` naming the line, never panic or hang;
//! and whatever it accepts must survive a write/read round trip unchanged
//! (the writer's text is a trace the reader takes back as the same events).
#![no_main]
use libfuzzer_sys::fuzz_target;
mod checks;

fuzz_target!(|data: &[u8]| checks::trace_reader(data));
