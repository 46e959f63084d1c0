//! The events of a trace (docs: docs/trace-format.md), as owned values.

use std::fmt;

/// Largest `dev=` index. Device ids are `int32_t` in ACL, and acl_replay rejects
/// larger ones, so the reader does too.
pub const MAX_DEV: u32 = i32::MAX as u32;
/// Largest `flops=`: ACL op attributes are `int64_t` (acl_replay passes flops as one).
pub const MAX_FLOPS: u64 = i64::MAX as u64;
/// Largest `n_in` or `n_out` of an `O` event (the same bound as acl_replay's).
pub const MAX_OP_RANGES: u64 = 1_000_000;

/// `<addr>:<bytes>`: a byte range of device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Range {
    pub addr: u64,
    pub bytes: u64,
}

impl Range {
    pub const fn new(addr: u64, bytes: u64) -> Range {
        Range { addr, bytes }
    }
}

/// Direction of an `M` copy: which sides are device addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CopyKind {
    H2H,
    H2D,
    D2H,
    D2D,
}

impl CopyKind {
    pub const ALL: [CopyKind; 4] = [CopyKind::H2H, CopyKind::H2D, CopyKind::D2H, CopyKind::D2D];

    pub fn as_str(self) -> &'static str {
        match self {
            CopyKind::H2H => "H2H",
            CopyKind::H2D => "H2D",
            CopyKind::D2H => "D2H",
            CopyKind::D2D => "D2D",
        }
    }
    pub fn parse(s: &str) -> Option<CopyKind> {
        CopyKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
    /// The destination is device memory (must lie in a live allocation).
    pub fn dst_on_device(self) -> bool {
        matches!(self, CopyKind::H2D | CopyKind::D2D)
    }
    /// The source is device memory.
    pub fn src_on_device(self) -> bool {
        matches!(self, CopyKind::D2H | CopyKind::D2D)
    }
    /// From ACL's `aclrtMemcpyKind` (0 H2H, 1 H2D, 2 D2H, 3 D2D); other values
    /// (e.g. 4, ACL_MEMCPY_DEFAULT) have no fixed direction.
    pub fn from_acl(kind: i32) -> Option<CopyKind> {
        match kind {
            0 => Some(CopyKind::H2H),
            1 => Some(CopyKind::H2D),
            2 => Some(CopyKind::D2H),
            3 => Some(CopyKind::D2D),
            _ => None,
        }
    }
}

impl fmt::Display for CopyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The fixed fields of an event line.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Body {
    /// `A <addr> <bytes>`: an allocation becomes live.
    Alloc { addr: u64, bytes: u64 },
    /// `F <addr>`: the live allocation starting at `addr` is freed.
    Free { addr: u64 },
    /// `O <op_type> <n_in> <n_out> <range>...`: an operator ran.
    Op {
        op_type: String,
        inputs: Vec<Range>,
        outputs: Vec<Range>,
    },
    /// `M <kind> <dst> <src> <bytes>`: a copy.
    Copy {
        kind: CopyKind,
        dst: u64,
        src: u64,
        bytes: u64,
    },
    /// `S <addr> <bytes>`: a memset of device memory.
    Set { addr: u64, bytes: u64 },
}

impl Body {
    /// The event kind letter.
    pub fn letter(&self) -> char {
        match self {
            Body::Alloc { .. } => 'A',
            Body::Free { .. } => 'F',
            Body::Op { .. } => 'O',
            Body::Copy { .. } => 'M',
            Body::Set { .. } => 'S',
        }
    }
}

/// One event line: fixed fields plus the known optional keys. Unknown keys are
/// not kept (readers ignore them). Defaults: `dev=0`, `stream=0`, no `t`, `flops`, `tag`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Event {
    pub body: Body,
    pub dev: u32,
    pub stream: u32,
    pub t: Option<u64>,
    pub flops: Option<u64>,
    pub tag: Option<String>,
}

impl Event {
    pub fn new(body: Body) -> Event {
        Event {
            body,
            dev: 0,
            stream: 0,
            t: None,
            flops: None,
            tag: None,
        }
    }
    pub fn alloc(addr: u64, bytes: u64) -> Event {
        Event::new(Body::Alloc { addr, bytes })
    }
    pub fn free(addr: u64) -> Event {
        Event::new(Body::Free { addr })
    }
    pub fn op(op_type: &str, inputs: &[Range], outputs: &[Range]) -> Event {
        Event::new(Body::Op {
            op_type: op_type.to_string(),
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
        })
    }
    pub fn copy(kind: CopyKind, dst: u64, src: u64, bytes: u64) -> Event {
        Event::new(Body::Copy {
            kind,
            dst,
            src,
            bytes,
        })
    }
    pub fn set(addr: u64, bytes: u64) -> Event {
        Event::new(Body::Set { addr, bytes })
    }
    pub fn on_dev(mut self, dev: u32) -> Event {
        self.dev = dev;
        self
    }
    pub fn on_stream(mut self, stream: u32) -> Event {
        self.stream = stream;
        self
    }
    pub fn at(mut self, t: u64) -> Event {
        self.t = Some(t);
        self
    }
    pub fn with_flops(mut self, flops: u64) -> Event {
        self.flops = Some(flops);
        self
    }
    pub fn with_tag(mut self, tag: &str) -> Event {
        self.tag = Some(tag.to_string());
        self
    }
}

impl fmt::Display for Event {
    /// The canonical line (without the newline); see [`crate::trace::writer`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        crate::trace::writer::format_event(self, &mut s);
        f.write_str(&s)
    }
}

/// Whether `s` can stand as an `op_type` or `tag` word so that a reader gives it
/// back unchanged: non-empty, no whitespace, no control character, and (for an
/// op type) no `=` (a token with `=` after its first byte reads as `key=value`).
pub fn is_word(s: &str, allow_eq: bool) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && (allow_eq || c != '='))
}

/// Turns arbitrary bytes (an op type from a C caller) into a word that
/// [`is_word`] accepts: invalid UTF-8, whitespace, control characters and `=`
/// become `_`; empty becomes `_`.
pub fn sanitize_word(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() || c == '=' {
                '_'
            } else {
                c
            }
        })
        .collect();
    if out.is_empty() {
        out.push('_');
    }
    out
}
