//! Canonical writer: single spaces, lowercase hex with `0x`, decimal sizes, the
//! optional keys in the fixed order `dev stream t flops tag` with the defaults
//! (`dev=0`, `stream=0`, absent `t`/`flops`/`tag`) omitted. What it writes the
//! reader reads back as the same [`Event`] (for op types and tags that are
//! words: see [`super::event::is_word`]).

use std::fmt::Write as _;
use std::io::{self, Write};

use super::event::{Body, Event, Range};
use super::reader::HEADER;

fn range(out: &mut String, r: &Range) {
    let _ = write!(out, " {:#x}:{}", r.addr, r.bytes);
}

/// Appends the canonical line of `ev` to `out` (no newline).
pub fn format_event(ev: &Event, out: &mut String) {
    match &ev.body {
        Body::Alloc { addr, bytes } => {
            let _ = write!(out, "A {addr:#x} {bytes}");
        }
        Body::Free { addr } => {
            let _ = write!(out, "F {addr:#x}");
        }
        Body::Op {
            op_type,
            inputs,
            outputs,
        } => {
            let _ = write!(out, "O {op_type} {} {}", inputs.len(), outputs.len());
            for r in inputs.iter().chain(outputs) {
                range(out, r);
            }
        }
        Body::Copy {
            kind,
            dst,
            src,
            bytes,
        } => {
            let _ = write!(out, "M {kind} {dst:#x} {src:#x} {bytes}");
        }
        Body::Set { addr, bytes } => {
            let _ = write!(out, "S {addr:#x} {bytes}");
        }
    }
    if ev.dev != 0 {
        let _ = write!(out, " dev={}", ev.dev);
    }
    if ev.stream != 0 {
        let _ = write!(out, " stream={}", ev.stream);
    }
    if let Some(t) = ev.t {
        let _ = write!(out, " t={t}");
    }
    if let Some(f) = ev.flops {
        let _ = write!(out, " flops={f}");
    }
    if let Some(tag) = &ev.tag {
        let _ = write!(out, " tag={tag}");
    }
}

/// The canonical line of `ev` (no newline).
pub fn event_line(ev: &Event) -> String {
    let mut s = String::new();
    format_event(ev, &mut s);
    s
}

/// Writes a trace: the header on creation, then one line per event or comment.
pub struct TraceWriter<W: Write> {
    out: W,
    line: String,
}

impl<W: Write> TraceWriter<W> {
    /// Writes the header line.
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(HEADER.as_bytes())?;
        out.write_all(b"\n")?;
        Ok(TraceWriter {
            out,
            line: String::with_capacity(256),
        })
    }

    pub fn event(&mut self, ev: &Event) -> io::Result<()> {
        self.line.clear();
        format_event(ev, &mut self.line);
        self.line.push('\n');
        self.out.write_all(self.line.as_bytes())
    }

    /// Writes `# text` (newlines in `text` become spaces so it stays one comment).
    pub fn comment(&mut self, text: &str) -> io::Result<()> {
        self.line.clear();
        self.line.push_str("# ");
        self.line.extend(
            text.chars()
                .map(|c| if c == '\n' || c == '\r' { ' ' } else { c }),
        );
        self.line.push('\n');
        self.out.write_all(self.line.as_bytes())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn get_ref(&self) -> &W {
        &self.out
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Writes a whole trace (header and events) to a string.
pub fn write_string(events: &[Event]) -> String {
    let mut s = String::from(HEADER);
    s.push('\n');
    for ev in events {
        format_event(ev, &mut s);
        s.push('\n');
    }
    s
}
