//! Streaming reader of the text format: one line at a time (traces can be GBs),
//! validating every rule of docs/trace-format.md against the live
//! allocations seen so far. It never panics; the first violation ends the
//! stream with a [`TraceError`] naming the line.
//!
//! Where the page leaves a detail open, the reader agrees with acl_replay (the
//! reference consumer): CRLF line ends are accepted, a line with a NUL byte is
//! not, a leading-whitespace `#` line is a comment, a token is a key=value
//! field when it has `=` after its first byte, a zero-byte `A` occupies its
//! address, a later `dev=` (etc.) overrides an earlier one, and the numeric
//! limits of [`super::event`] apply. A line longer than [`MAX_LINE`] bytes is
//! rejected (a streaming reader needs some bound).

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use super::event::{Body, CopyKind, Event, Range, MAX_DEV, MAX_FLOPS, MAX_OP_RANGES};
use super::live::{InsertError, LiveAlloc, LiveSet};

/// The header line.
pub const HEADER: &str = "# u3m-trace 1";
/// Longest line the reader accepts, in bytes.
pub const MAX_LINE: usize = 256 << 20;

/// Which device range of an event broke the containment rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    OpInput { op: String, index: usize },
    OpOutput { op: String, index: usize },
    CopyDst(CopyKind),
    CopySrc(CopyKind),
    Set,
}

/// What is wrong with a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// Reading the input failed.
    Io(String),
    NotUtf8,
    NulByte,
    LineTooLong,
    /// The input ended before any non-empty line.
    MissingHeader,
    /// The first non-empty line is not exactly [`HEADER`].
    BadHeader {
        found: String,
    },
    UnknownKind {
        found: String,
    },
    MissingField {
        kind: char,
        field: &'static str,
    },
    BadHex {
        field: &'static str,
        found: String,
    },
    BadDecimal {
        field: &'static str,
        found: String,
    },
    BadCopyKind {
        found: String,
    },
    /// An `O` range that is not `<0xaddr>:<bytes>`.
    BadRange {
        found: String,
    },
    /// `n_in` or `n_out` above [`MAX_OP_RANGES`], or not the number of ranges given.
    RangeCount {
        op: String,
        n_in: u64,
        n_out: u64,
        found: usize,
    },
    /// A token after the fixed fields that is not `key=value`.
    UnexpectedField {
        found: String,
    },
    /// A known key whose value is not a decimal number.
    BadKeyValue {
        key: &'static str,
        found: String,
    },
    /// A known key whose value is above its limit.
    KeyOutOfRange {
        key: &'static str,
        value: u64,
        max: u64,
    },
    EmptyTag,
    /// A tag with a control character in it (a `\r` before the line's end,
    /// say): not a word, and not what a writer could give back.
    BadTag {
        found: String,
    },
    /// `A addr bytes` runs past the end of the 64-bit address space.
    Wraps {
        addr: u64,
        bytes: u64,
    },
    /// `A` overlaps a live allocation on the same device.
    Overlaps {
        dev: u32,
        addr: u64,
        bytes: u64,
        live: Range,
    },
    /// `F` of an address where no live allocation starts.
    NotLiveStart {
        dev: u32,
        addr: u64,
    },
    /// A device range of `O`, `M` or `S` not inside one live allocation.
    NotInside {
        dev: u32,
        role: Role,
        range: Range,
    },
}

fn on_dev(f: &mut fmt::Formatter<'_>, dev: u32) -> fmt::Result {
    if dev != 0 {
        write!(f, " on device {dev}")?;
    }
    Ok(())
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ErrorKind::*;
        match self {
            Io(e) => write!(f, "read error: {e}"),
            NotUtf8 => write!(f, "not UTF-8 text"),
            NulByte => write!(f, "NUL byte in line"),
            LineTooLong => write!(f, "line longer than {MAX_LINE} bytes"),
            MissingHeader => write!(f, "missing the header '{HEADER}' (no non-empty line)"),
            BadHeader { found } => {
                write!(
                    f,
                    "expected the header '{HEADER}' as the first non-empty line, found '{found}'"
                )
            }
            UnknownKind { found } => {
                write!(f, "unknown event kind '{found}': expected A, F, O, M or S")
            }
            MissingField { kind, field } => write!(f, "{kind}: missing {field}"),
            BadHex { field, found } => write!(
                f,
                "bad {field} '{found}': expected hexadecimal with a 0x prefix"
            ),
            BadDecimal { field, found } => {
                write!(f, "bad {field} '{found}': expected a decimal number")
            }
            BadCopyKind { found } => write!(
                f,
                "M: unknown copy kind '{found}': expected H2D, D2H, D2D or H2H"
            ),
            BadRange { found } => write!(f, "bad range '{found}': expected <0xaddr>:<bytes>"),
            RangeCount {
                op,
                n_in,
                n_out,
                found,
            } => {
                write!(
                    f,
                    "O {op}: n_in={n_in} n_out={n_out} but {found} range(s) follow"
                )?;
                if *n_in > MAX_OP_RANGES || *n_out > MAX_OP_RANGES {
                    write!(f, " (at most {MAX_OP_RANGES} of each)")?;
                }
                Ok(())
            }
            UnexpectedField { found } => {
                write!(f, "unexpected field '{found}' (expected key=value)")
            }
            BadKeyValue { key, found } => {
                write!(f, "bad value in '{key}={found}': expected a decimal number")
            }
            KeyOutOfRange { key, value, max } => {
                write!(f, "{key}={value} out of range (at most {max})")
            }
            EmptyTag => write!(f, "empty tag= (expected a word)"),
            BadTag { found } => {
                write!(f, "tag={found:?} has a control character (expected a word)")
            }
            Wraps { addr, bytes } => write!(
                f,
                "A {addr:#x} {bytes}: range wraps around the address space"
            ),
            Overlaps {
                dev,
                addr,
                bytes,
                live,
            } => {
                write!(
                    f,
                    "A {addr:#x} {bytes}: overlaps the live allocation {:#x} {}",
                    live.addr, live.bytes
                )?;
                on_dev(f, *dev)
            }
            NotLiveStart { dev, addr } => {
                write!(f, "F {addr:#x}: not the start of a live allocation")?;
                on_dev(f, *dev)
            }
            NotInside { dev, role, range } => {
                match role {
                    Role::OpInput { op, index } => write!(f, "O {op}: input {index}")?,
                    Role::OpOutput { op, index } => write!(f, "O {op}: output {index}")?,
                    Role::CopyDst(k) => write!(f, "M {k}: destination")?,
                    Role::CopySrc(k) => write!(f, "M {k}: source")?,
                    Role::Set => write!(f, "S")?,
                }
                write!(
                    f,
                    " {:#x}:{} is not inside one live allocation",
                    range.addr, range.bytes
                )?;
                on_dev(f, *dev)
            }
        }
    }
}

/// A rejected trace: where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    /// The name the reader was given (usually the path).
    pub file: String,
    /// 1-based line number.
    pub line: u64,
    pub kind: ErrorKind,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.kind)
    }
}

impl std::error::Error for TraceError {}

/// Shortens a token quoted in a message (a hostile line can be huge).
fn quote(s: &str) -> String {
    const MAX: usize = 60;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn is_kv(tok: &str) -> bool {
    tok.find('=').is_some_and(|i| i > 0)
}

fn parse_hex(s: &str) -> Option<u64> {
    let digits = s.strip_prefix("0x")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let digits = digits.trim_start_matches('0');
    if digits.len() > 16 {
        return None;
    }
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, 16).ok()
}

fn parse_dec(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = s.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    digits.parse::<u64>().ok()
}

/// Validity-checks one parsed event against `live` and applies it (A makes an
/// allocation live, F ends one). Shared with the recorder's repair pass.
pub(crate) fn apply(live: &mut LiveSet, ev: &Event) -> Result<(), ErrorKind> {
    let dev = ev.dev;
    let inside = |role: Role, r: Range| -> Result<LiveAlloc, ErrorKind> {
        live.resolve_range(dev, r).ok_or(ErrorKind::NotInside {
            dev,
            role,
            range: r,
        })
    };
    match &ev.body {
        Body::Alloc { .. } | Body::Free { .. } => {}
        Body::Op {
            op_type,
            inputs,
            outputs,
        } => {
            for (index, r) in inputs.iter().enumerate() {
                inside(
                    Role::OpInput {
                        op: quote(op_type),
                        index,
                    },
                    *r,
                )?;
            }
            for (index, r) in outputs.iter().enumerate() {
                inside(
                    Role::OpOutput {
                        op: quote(op_type),
                        index,
                    },
                    *r,
                )?;
            }
        }
        Body::Copy {
            kind,
            dst,
            src,
            bytes,
        } => {
            if kind.dst_on_device() {
                inside(Role::CopyDst(*kind), Range::new(*dst, *bytes))?;
            }
            if kind.src_on_device() {
                inside(Role::CopySrc(*kind), Range::new(*src, *bytes))?;
            }
        }
        Body::Set { addr, bytes } => {
            inside(Role::Set, Range::new(*addr, *bytes))?;
        }
    }
    match ev.body {
        Body::Alloc { addr, bytes } => match live.insert(dev, addr, bytes) {
            Ok(_) => Ok(()),
            Err(InsertError::Wraps) => Err(ErrorKind::Wraps { addr, bytes }),
            Err(InsertError::Overlaps(a)) => Err(ErrorKind::Overlaps {
                dev,
                addr,
                bytes,
                live: Range::new(a.addr, a.bytes),
            }),
        },
        Body::Free { addr } => live
            .remove(dev, addr)
            .map(|_| ())
            .ok_or(ErrorKind::NotLiveStart { dev, addr }),
        _ => Ok(()),
    }
}

/// Parses the tokens of one event line (syntax only; no live-allocation check).
pub(crate) fn parse_event(line: &str) -> Result<Option<Event>, ErrorKind> {
    let toks: Vec<&str> = line.split([' ', '\t']).filter(|t| !t.is_empty()).collect();
    let Some(first) = toks.first() else {
        return Ok(None);
    };
    if first.starts_with('#') {
        return Ok(None);
    }
    let kind = match *first {
        "A" | "F" | "O" | "M" | "S" => first.as_bytes()[0] as char,
        other => {
            return Err(ErrorKind::UnknownKind {
                found: quote(other),
            })
        }
    };
    let mut i = 1;
    // A fixed field: present and not key=value.
    let mut field = |name: &'static str| -> Result<&str, ErrorKind> {
        match toks.get(i) {
            Some(t) if !is_kv(t) => {
                i += 1;
                Ok(t)
            }
            _ => Err(ErrorKind::MissingField { kind, field: name }),
        }
    };
    let hex = |name: &'static str, t: &str| {
        parse_hex(t).ok_or(ErrorKind::BadHex {
            field: name,
            found: quote(t),
        })
    };
    let dec = |name: &'static str, t: &str| {
        parse_dec(t).ok_or(ErrorKind::BadDecimal {
            field: name,
            found: quote(t),
        })
    };

    let body = match kind {
        'A' => {
            let addr = hex("address", field("address")?)?;
            let bytes = dec("size", field("size")?)?;
            Body::Alloc { addr, bytes }
        }
        'F' => Body::Free {
            addr: hex("address", field("address")?)?,
        },
        'S' => {
            let addr = hex("address", field("address")?)?;
            let bytes = dec("size", field("size")?)?;
            Body::Set { addr, bytes }
        }
        'M' => {
            let k = field("copy kind")?;
            let kind =
                CopyKind::parse(k).ok_or_else(|| ErrorKind::BadCopyKind { found: quote(k) })?;
            let dst = hex("destination address", field("destination address")?)?;
            let src = hex("source address", field("source address")?)?;
            let bytes = dec("size", field("size")?)?;
            Body::Copy {
                kind,
                dst,
                src,
                bytes,
            }
        }
        _ => {
            let op_type = field("op_type")?.to_string();
            let n_in = dec("n_in", field("n_in")?)?;
            let n_out = dec("n_out", field("n_out")?)?;
            let first = i;
            while i < toks.len() && !is_kv(toks[i]) {
                i += 1;
            }
            let found = i - first;
            if n_in > MAX_OP_RANGES || n_out > MAX_OP_RANGES || found as u64 != n_in + n_out {
                return Err(ErrorKind::RangeCount {
                    op: quote(&op_type),
                    n_in,
                    n_out,
                    found,
                });
            }
            let mut ranges = Vec::with_capacity(found);
            for t in &toks[first..i] {
                let bad = || ErrorKind::BadRange { found: quote(t) };
                let (a, b) = t.split_once(':').ok_or_else(bad)?;
                let addr = parse_hex(a).ok_or_else(bad)?;
                let bytes = parse_dec(b).ok_or_else(bad)?;
                ranges.push(Range { addr, bytes });
            }
            let outputs = ranges.split_off(n_in as usize);
            Body::Op {
                op_type,
                inputs: ranges,
                outputs,
            }
        }
    };
    let mut ev = Event::new(body);
    for t in &toks[i..] {
        let Some((key, value)) = t.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            return Err(ErrorKind::UnexpectedField { found: quote(t) });
        };
        let num = |key: &'static str, max: u64| -> Result<u64, ErrorKind> {
            let v = parse_dec(value).ok_or_else(|| ErrorKind::BadKeyValue {
                key,
                found: quote(value),
            })?;
            if v > max {
                return Err(ErrorKind::KeyOutOfRange { key, value: v, max });
            }
            Ok(v)
        };
        match key {
            "dev" => ev.dev = num("dev", MAX_DEV as u64)? as u32,
            "stream" => ev.stream = num("stream", u32::MAX as u64)? as u32,
            "t" => ev.t = Some(num("t", u64::MAX)?),
            "flops" => ev.flops = Some(num("flops", MAX_FLOPS)?),
            "tag" => {
                if value.is_empty() {
                    return Err(ErrorKind::EmptyTag);
                }
                if value.chars().any(char::is_control) {
                    return Err(ErrorKind::BadTag {
                        found: quote(value),
                    });
                }
                ev.tag = Some(value.to_string());
            }
            _ => {} // unknown keys are ignored
        }
    }
    Ok(Some(ev))
}

/// Reads events from a trace, validating as it goes. An `Iterator` of
/// `Result<Event, TraceError>` that ends after the first error.
pub struct TraceReader<R> {
    input: R,
    name: String,
    line: u64,
    header: bool,
    done: bool,
    buf: Vec<u8>,
    live: LiveSet,
}

impl TraceReader<BufReader<File>> {
    /// Opens `path` (errors name it as `path:line:`).
    pub fn open(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref();
        let f = File::open(path)?;
        Ok(TraceReader::new(
            BufReader::with_capacity(1 << 16, f),
            path.display().to_string(),
        ))
    }
}

impl<R: BufRead> TraceReader<R> {
    /// `name` is what errors call the input (`name:line: what`).
    pub fn new(input: R, name: impl Into<String>) -> Self {
        TraceReader {
            input,
            name: name.into(),
            line: 0,
            header: false,
            done: false,
            buf: Vec::new(),
            live: LiveSet::new(),
        }
    }

    /// The line number of the last line read (the line of the last event returned).
    pub fn line(&self) -> u64 {
        self.line
    }

    /// The allocations live after the events returned so far.
    pub fn live(&self) -> &LiveSet {
        &self.live
    }

    fn fail(&mut self, line: u64, kind: ErrorKind) -> Option<Result<Event, TraceError>> {
        self.done = true;
        Some(Err(TraceError {
            file: self.name.clone(),
            line,
            kind,
        }))
    }

    /// Reads the next line into `self.buf` without its line end; false at EOF.
    fn read_line(&mut self) -> Result<bool, ErrorKind> {
        self.buf.clear();
        let limit = MAX_LINE as u64 + 2; // room for "\r\n"
        let n = (&mut self.input)
            .take(limit)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| ErrorKind::Io(e.to_string()))?;
        if n == 0 {
            return Ok(false);
        }
        self.line += 1;
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        } else if n as u64 == limit {
            return Err(ErrorKind::LineTooLong);
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        if self.buf.len() > MAX_LINE {
            return Err(ErrorKind::LineTooLong);
        }
        Ok(true)
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<Event, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        loop {
            match self.read_line() {
                Ok(true) => {}
                Ok(false) => {
                    self.done = true;
                    if !self.header {
                        let line = self.line.max(1);
                        return self.fail(line, ErrorKind::MissingHeader);
                    }
                    return None;
                }
                Err(kind) => {
                    let line = self.line.max(1);
                    return self.fail(line, kind);
                }
            }
            let line = self.line;
            if self.buf.contains(&0) {
                return self.fail(line, ErrorKind::NulByte);
            }
            let text = match std::str::from_utf8(&self.buf) {
                Ok(t) => t,
                Err(_) => return self.fail(line, ErrorKind::NotUtf8),
            };
            if !self.header {
                if text.bytes().all(|b| b == b' ' || b == b'\t') {
                    continue;
                }
                if text != HEADER {
                    let found = quote(text);
                    return self.fail(line, ErrorKind::BadHeader { found });
                }
                self.header = true;
                continue;
            }
            let ev = match parse_event(text) {
                Ok(Some(ev)) => ev,
                Ok(None) => continue,
                Err(kind) => return self.fail(line, kind),
            };
            if let Err(kind) = apply(&mut self.live, &ev) {
                return self.fail(line, kind);
            }
            return Some(Ok(ev));
        }
    }
}

/// Reads and validates a whole trace file into memory (small traces, tests).
pub fn read_file(path: impl AsRef<Path>) -> Result<Vec<Event>, TraceError> {
    let path = path.as_ref();
    let r = TraceReader::open(path).map_err(|e| TraceError {
        file: path.display().to_string(),
        line: 0,
        kind: ErrorKind::Io(e.to_string()),
    })?;
    r.collect()
}

/// Reads and validates a trace held in a string.
pub fn read_str(text: &str, name: &str) -> Result<Vec<Event>, TraceError> {
    TraceReader::new(text.as_bytes(), name).collect()
}

/// Validates a trace without keeping its events; returns how many there were.
pub fn validate(input: impl BufRead, name: &str) -> Result<u64, TraceError> {
    let mut n = 0;
    for ev in TraceReader::new(input, name) {
        ev?;
        n += 1;
    }
    Ok(n)
}
