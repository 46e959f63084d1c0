//! The shared-memory stats segment `/dev/shm/u3m.<pid>`: the one wire format
//! between `libu3m.so` (the writer, `StatsSegment`) and the `u3m` CLI (the
//! readers, `SegmentReader`). Layout and versioning rules: `layout.rs` and
//! docs/stats.md.
//!
//! The writer never blocks and never allocates after creation: counters are
//! relaxed atomics, events go into a lossy ring of seqlocked records, the hot
//! table and the configuration text are seqlocked blocks whose writer skips
//! (and counts) a publication rather than wait.

pub mod layout;
pub mod reader;
pub mod writer;

pub use layout::{EventKind, ThreadCalls, HOT_CAPACITY, MAX_DEVICES, MAX_HOOKS, NO_DEVICE};
pub use reader::{Event, EventCursor, Liveness, OpenError, SegmentReader, Snapshot, Tail};
pub use writer::{SegmentConfig, StatsSegment};

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Environment variable that moves the segments out of /dev/shm (tests).
pub const DIR_ENV: &str = "U3M_SHM_DIR";
/// File name prefix: `u3m.<pid>`.
pub const FILE_PREFIX: &str = "u3m.";

/// Where segments live: `$U3M_SHM_DIR` if set and non-empty, else /dev/shm.
pub fn default_dir() -> PathBuf {
    match std::env::var_os(DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from("/dev/shm"),
    }
}

/// (key, value) pairs of a configuration text: `KEY=VALUE` items separated
/// by newlines or spaces. A word without `=` continues the previous value (a
/// path with a space in it).
pub fn config_pairs(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for word in text.split_whitespace() {
        match word.split_once('=') {
            Some((k, v))
                if !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
            {
                out.push((k.to_string(), v.to_string()))
            }
            _ => {
                if let Some(last) = out.last_mut() {
                    last.1.push(' ');
                    last.1.push_str(word);
                }
            }
        }
    }
    out
}

/// One entry of the hot table, as the writer publishes it and readers see it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HotEntry {
    pub addr: u64,
    pub len: u64,
    pub device: u32,
    pub accesses: u64,
    pub heat: f64,
    /// Bit i: operator class i (names in the segment's class table).
    pub class_mask: u64,
    /// CLOCK_MONOTONIC ns of the last access, 0 if unknown.
    pub last_ns: u64,
}

/// CLOCK_MONOTONIC in ns (vDSO, no syscall on the usual platforms).
pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Wall clock in ns since the Unix epoch.
pub fn unix_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; clock ids are constants the kernel knows.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22),
/// with its state letter. Reads into a stack buffer: callable where
/// allocation is unwelcome (segment creation).
pub fn proc_start(pid: u32) -> Option<(u64, u8)> {
    use std::io::Read;
    let mut path = ShortText::new();
    let _ = fmt::Write::write_fmt(&mut path, format_args!("/proc/{pid}/stat"));
    let mut f = std::fs::File::open(path.as_str()).ok()?;
    let mut buf = [0u8; 1024];
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(_) => return None,
        }
    }
    parse_proc_stat(&buf[..n])
}

/// Inode of the calling process's pid namespace (`/proc/self/ns/pid`), 0 if
/// unknown. Readers in another namespace (a node exporter with hostPID
/// reading a pod's segment) cannot check the writer's pid.
pub fn own_pid_ns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// The labels of this process (`layout::LABEL_NAMES` order) from its
/// environment: torchrun's rank variables, the Kubernetes downward-API
/// variables, and the node (NODE_NAME, else the host name).
pub fn labels_from_env(get: &dyn Fn(&str) -> Option<String>) -> [String; layout::LABELS] {
    let mut out: [String; layout::LABELS] = Default::default();
    for (i, v) in out.iter_mut().enumerate() {
        if let Some(x) = layout::label_sources(i)
            .iter()
            .filter_map(|k| get(k))
            .find(|x| !x.is_empty())
        {
            *v = x;
        }
    }
    if out[layout::LABEL_NODE].is_empty() {
        out[layout::LABEL_NODE] = host_name();
    }
    out
}

/// The host name (uname nodename), empty if unknown.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: valid buffer and length; gethostname NUL-terminates on success
    // (the last byte stays 0 either way).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return String::new();
    }
    name_from(&buf)
}

/// (starttime, state) from the text of /proc/<pid>/stat. The command name
/// (field 2) may contain spaces and parentheses, so fields are counted from
/// the last ')'.
pub(crate) fn parse_proc_stat(s: &[u8]) -> Option<(u64, u8)> {
    let close = s.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&s[close + 1..]).ok()?;
    let mut it = rest.split_ascii_whitespace();
    let state = it.next()?.as_bytes().first().copied()?; // field 3
                                                         // field 22 is the 20th after field 2 (the state is the 1st).
    let start = it.nth(18)?.parse().ok()?;
    Some((start, state))
}

/// A short string in a fixed stack buffer (the size of an event's text), for
/// formatting on paths that must not allocate. Longer writes are truncated at
/// a character boundary.
#[derive(Clone, Copy)]
pub struct ShortText {
    buf: [u8; layout::EVENT_TEXT_LEN],
    len: usize,
}

impl ShortText {
    pub const fn new() -> Self {
        ShortText {
            buf: [0; layout::EVENT_TEXT_LEN],
            len: 0,
        }
    }
    pub fn as_str(&self) -> &str {
        // Only whole characters are ever copied in.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl Default for ShortText {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Write for ShortText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - self.len;
        let take = floor_char_boundary(s, room);
        self.buf[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}

impl fmt::Debug for ShortText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::ops::Deref for ShortText {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

/// Largest prefix length <= max that ends on a char boundary.
pub(crate) fn floor_char_boundary(s: &str, max: usize) -> usize {
    if s.len() <= max {
        return s.len();
    }
    let mut i = max;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Packs bytes little-endian into atomic words (relaxed stores; the caller's
/// seqlock orders them). Words past the text are zeroed.
pub(crate) fn store_bytes(words: &[AtomicU64], bytes: &[u8]) {
    for (i, w) in words.iter().enumerate() {
        let mut b = [0u8; 8];
        let start = i * 8;
        if start < bytes.len() {
            let end = (start + 8).min(bytes.len());
            b[..end - start].copy_from_slice(&bytes[start..end]);
        }
        w.store(u64::from_le_bytes(b), Relaxed);
    }
}

/// The first `len` bytes of `words` (relaxed loads).
pub(crate) fn load_bytes(words: &[AtomicU64], len: usize) -> Vec<u8> {
    let len = len.min(words.len() * 8);
    let mut out = Vec::with_capacity(len);
    for w in words {
        if out.len() >= len {
            break;
        }
        let b = w.load(Relaxed).to_le_bytes();
        let take = (len - out.len()).min(8);
        out.extend_from_slice(&b[..take]);
    }
    out
}

/// A NUL-padded name field as text (invalid UTF-8 replaced).
pub(crate) fn name_from(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unit_tests {
    use super::*;
    use std::fmt::Write;

    #[test]
    fn short_text_truncates_on_char_boundary() {
        let mut t = ShortText::new();
        for _ in 0..30 {
            write!(t, "é€").unwrap(); // 2 + 3 bytes
        }
        assert!(t.len() <= layout::EVENT_TEXT_LEN);
        assert_eq!(t.len(), 80); // 16 × 5 bytes fit exactly
        let mut t = ShortText::new();
        write!(t, "{}", "a".repeat(79)).unwrap();
        write!(t, "€").unwrap();
        assert_eq!(t.len(), 79);
    }

    #[test]
    fn config_text_in_lines_or_words() {
        let p = |t: &str| {
            config_pairs(t)
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            p("U3M_MODE=observe\nU3M_MIN_BYTES=2M\n"),
            ["U3M_MODE=observe", "U3M_MIN_BYTES=2M"]
        );
        assert_eq!(
            p("mode=observe U3M_TRACE=/tmp/my trace.u3mt U3M_LOG=info"),
            [
                "mode=observe",
                "U3M_TRACE=/tmp/my trace.u3mt",
                "U3M_LOG=info"
            ]
        );
        assert_eq!(p("stray words first"), Vec::<String>::new());
        assert_eq!(p("K=a=b"), ["K=a=b"]);
    }

    #[test]
    fn bytes_roundtrip_through_words() {
        let words: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(u64::MAX)).collect();
        store_bytes(&words, b"hello, world!");
        assert_eq!(load_bytes(&words, 13), b"hello, world!");
        assert_eq!(words[2].load(Relaxed), 0, "tail words are cleared");
        assert_eq!(load_bytes(&words, 1000).len(), 32);
    }

    #[test]
    fn proc_stat_parsing_survives_odd_command_names() {
        let line = b"4242 (a b) c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        assert_eq!(parse_proc_stat(line), Some((987654, b'S')));
        assert_eq!(parse_proc_stat(b"garbage"), None);
        let me = proc_start(std::process::id()).expect("own /proc entry");
        assert!(me.0 > 0);
        // the start time names the process; the state letter is a snapshot
        // of the main thread (R or S as the test harness runs: CI saw both)
        assert_eq!(
            proc_start(std::process::id()).map(|p| p.0),
            Some(me.0),
            "stable"
        );
    }
}
