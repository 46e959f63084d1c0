//! The u3m access trace (text form, version 1: docs/trace-format.md;
//! this crate's side of it: docs/trace.md).
//!
//! - [`event`]: the events as owned values;
//! - [`reader`]: a streaming, validating reader (never panics; errors name the line);
//! - [`writer`]: the canonical writer (round-trips with the reader);
//! - [`recorder`]: what `libu3m.so` records with when `U3M_TRACE` is set (a
//!   lock-free queue drained by a writer thread);
//! - [`repair`]: the writer thread's VMM-to-allocation mapping and validity repair;
//! - [`live`]: live allocations per device (the validity rules' state);
//! - [`normalize`]: an address-free view for comparing recordings.

pub mod event;
pub mod live;
pub mod normalize;
pub mod reader;
pub mod recorder;
pub mod repair;
pub mod writer;

pub use event::{Body, CopyKind, Event, Range};
pub use reader::{read_file, read_str, ErrorKind, TraceError, TraceReader, HEADER};
pub use recorder::{Rec, Recorder, RecorderConfig, RecorderStats};
pub use writer::{event_line, format_event, write_string, TraceWriter};
