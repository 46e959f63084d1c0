//! The reader side, used by `u3m stat` and `u3m top`: finds segments, maps
//! them read-only, checks the ABI, tells live writers from dead ones, takes
//! snapshots and tails the event ring without ever taking a lock.

use super::layout::*;
use super::{load_bytes, mono_ns, name_from, proc_start, HotEntry, FILE_PREFIX};
use crate::monitor::Level;
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering::*};

/// Why a segment file cannot be read.
#[derive(Debug)]
pub enum OpenError {
    Io(io::Error),
    /// Shorter than this layout needs (being created, or not ours).
    TooSmall {
        size: u64,
        need: u64,
    },
    /// Magic not yet published: the writer is still initialising.
    NotReady,
    /// Not a u3m stats segment.
    BadMagic(u64),
    /// Written by a u3m with another major layout.
    Version {
        major: u32,
        minor: u32,
    },
    /// Geometry fields disagree with this layout version.
    Geometry(&'static str),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Io(e) => write!(f, "{e}"),
            OpenError::TooSmall { size, need } => write!(f, "file is {size} bytes, a layout-{LAYOUT_MAJOR} segment needs {need}"),
            OpenError::NotReady => write!(f, "segment is still being initialised"),
            OpenError::BadMagic(m) => write!(f, "not a u3m stats segment (magic {m:#018x})"),
            OpenError::Version { major, minor } => write!(
                f,
                "segment layout {major}.{minor} is not readable by this u3m (reads layout {LAYOUT_MAJOR}.x); use the u3m that matches the library"
            ),
            OpenError::Geometry(what) => write!(f, "segment geometry mismatch: {what}"),
        }
    }
}

impl std::error::Error for OpenError {}

/// Whether the writer of a segment still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    /// Gone; the reason is printed when the file is cleaned up.
    Dead(&'static str),
}

/// Every `u3m.<pid>` file in `dir`, sorted by pid.
pub fn list(dir: &Path) -> io::Result<Vec<(u32, PathBuf)>> {
    let mut out = Vec::new();
    for ent in fs::read_dir(dir)? {
        let ent = ent?;
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(pid) = name
            .strip_prefix(FILE_PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == 0 || !ent.file_type().map(|t| t.is_file()).unwrap_or(false) {
            continue;
        }
        out.push((pid, ent.path()));
    }
    out.sort();
    Ok(out)
}

/// Path of the segment of `pid` in `dir`.
pub fn path_of(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{FILE_PREFIX}{pid}"))
}

/// Liveness of process `pid` that recorded `start_ticks` (0: unknown) when it
/// created its segment.
pub fn liveness(pid: u32, start_ticks: u64) -> Liveness {
    if pid == 0 || pid > i32::MAX as u32 {
        return Liveness::Dead("invalid pid");
    }
    // SAFETY: signal 0 only checks existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return Liveness::Dead("process no longer exists");
    }
    match proc_start(pid) {
        Some((_, b'Z')) | Some((_, b'X')) => Liveness::Dead("process has exited (zombie)"),
        Some((ticks, _)) if start_ticks != 0 && ticks != start_ticks => {
            Liveness::Dead("pid now belongs to another process")
        }
        // No /proc (or unreadable): kill() said it exists.
        _ => Liveness::Alive,
    }
}

/// A segment mapped read-only.
pub struct SegmentReader {
    seg: NonNull<Segment>,
    path: PathBuf,
}

// SAFETY: read-only mapping accessed through atomics and immutable fields.
unsafe impl Send for SegmentReader {}
unsafe impl Sync for SegmentReader {}

impl SegmentReader {
    /// Maps `path` read-only and checks magic, layout version and geometry.
    pub fn open(path: &Path) -> Result<SegmentReader, OpenError> {
        let f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(OpenError::Io)?;
        let size = f.metadata().map_err(OpenError::Io)?.len();
        if size < std::mem::size_of::<Header>() as u64 {
            return Err(if size == 0 {
                OpenError::NotReady
            } else {
                OpenError::TooSmall {
                    size,
                    need: SEGMENT_SIZE as u64,
                }
            });
        }
        // Map the header first: a future major may be smaller or larger.
        let hdr_len = std::mem::size_of::<Header>();
        let (magic, major, minor, total) = {
            // SAFETY: read-only shared mapping of an open file of >= hdr_len bytes.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    hdr_len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(OpenError::Io(io::Error::last_os_error()));
            }
            // SAFETY: p maps a whole Header.
            let h = unsafe { &*(p as *const Header) };
            let magic = h.magic.load(Acquire);
            let r = (magic, h.layout_major, h.layout_minor, h.total_size);
            // SAFETY: mapped above with this length.
            unsafe { libc::munmap(p, hdr_len) };
            r
        };
        if magic == 0 {
            return Err(OpenError::NotReady);
        }
        if magic != MAGIC {
            return Err(OpenError::BadMagic(magic));
        }
        if major != LAYOUT_MAJOR {
            return Err(OpenError::Version { major, minor });
        }
        if total < SEGMENT_SIZE as u64 || size < total {
            return Err(OpenError::TooSmall {
                size,
                need: total.max(SEGMENT_SIZE as u64),
            });
        }
        // SAFETY: as above; the file holds at least SEGMENT_SIZE bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SEGMENT_SIZE,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(OpenError::Io(io::Error::last_os_error()));
        }
        // SAFETY: non-null mapping.
        let r = SegmentReader {
            seg: unsafe { NonNull::new_unchecked(p.cast()) },
            path: path.to_path_buf(),
        };
        let h = &r.seg().header;
        if h.max_devices as usize != MAX_DEVICES
            || h.max_hooks as usize != MAX_HOOKS
            || h.hot_capacity as usize != HOT_CAPACITY
            || h.event_capacity as usize != EVENT_CAPACITY
            || h.event_record_size as usize != std::mem::size_of::<EventSlot>()
            || h.thread_rows as usize != THREAD_ROWS
        {
            return Err(OpenError::Geometry("array sizes differ from this layout"));
        }
        Ok(r)
    }

    fn seg(&self) -> &Segment {
        // SAFETY: mapped for the lifetime of self. Fields written after the
        // magic are atomics; the rest were written before it (Acquire above).
        unsafe { self.seg.as_ref() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn pid(&self) -> u32 {
        self.seg().header.pid
    }

    pub fn liveness(&self) -> Liveness {
        let h = &self.seg().header;
        if self.foreign_pid_ns() {
            // the pid means another process here: nothing to check it by
            return Liveness::Alive;
        }
        liveness(h.pid, h.start_ticks)
    }

    /// The writer recorded a pid namespace other than ours (1.1+): its pid
    /// cannot be checked from here, and the file is never removed as stale.
    pub fn foreign_pid_ns(&self) -> bool {
        let ns = self.seg().header.pid_ns;
        ns != 0 && {
            let own = super::own_pid_ns();
            own != 0 && own != ns
        }
    }

    /// Configuration text, consistent (seqlock), or None if the writer kept
    /// rewriting it.
    pub fn config(&self) -> Option<String> {
        let c = &self.seg().config;
        for _ in 0..1000 {
            let s1 = c.seq.load(Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let len = c.len.load(Relaxed) as usize;
            let bytes = load_bytes(&c.text, len.min(CONFIG_TEXT_LEN));
            fence(Acquire);
            if c.seq.load(Relaxed) == s1 {
                return Some(String::from_utf8_lossy(&bytes).into_owned());
            }
        }
        None
    }

    /// Hot table, consistent (seqlock): entries and publication time.
    pub fn hot(&self) -> Option<(Vec<HotEntry>, u64)> {
        let t = &self.seg().hot;
        for _ in 0..1000 {
            let s1 = t.seq.load(Acquire);
            if s1 & 1 == 1 {
                std::thread::yield_now();
                continue;
            }
            let n = (t.count.load(Relaxed) as usize).min(HOT_CAPACITY);
            let v: Vec<HotEntry> = t.entries[..n]
                .iter()
                .map(|s| HotEntry {
                    addr: s.addr.load(Relaxed),
                    len: s.len.load(Relaxed),
                    device: s.device.load(Relaxed) as u32,
                    accesses: s.accesses.load(Relaxed),
                    heat: f64::from_bits(s.heat.load(Relaxed)),
                    class_mask: s.class_mask.load(Relaxed),
                    last_ns: s.last_ns.load(Relaxed),
                })
                .collect();
            let at = t.published_ns.load(Relaxed);
            fence(Acquire);
            if t.seq.load(Relaxed) == s1 {
                return Some((v, at));
            }
        }
        None
    }

    /// Everything but the events, read now.
    pub fn snapshot(&self) -> Snapshot {
        let seg = self.seg();
        let h = &seg.header;
        let hook_names: Vec<String> = seg.names.hook_names
            [..(h.n_hook_names as usize).min(MAX_HOOKS)]
            .iter()
            .map(|n| name_from(n))
            .collect();
        let class_names: Vec<String> = seg.names.class_names
            [..(h.n_class_names as usize).min(MAX_CLASSES)]
            .iter()
            .map(|n| name_from(n))
            .collect();
        let mut calls = Vec::new();
        for (id, c) in seg.calls.count.iter().enumerate() {
            // the shared count and every thread row's (layout.rs `ThreadCalls`)
            let count = seg.threads.iter().fold(c.load(Relaxed), |n, r| {
                n.wrapping_add(r.count[id].load(Relaxed))
            });
            let name = hook_names.get(id).cloned();
            if count != 0 || name.is_some() {
                calls.push(CallCount {
                    id,
                    name: name.unwrap_or_else(|| format!("hook#{id}")),
                    count,
                });
            }
        }
        let mut devices = Vec::new();
        let ops = field_index("launches.ops");
        for (i, g) in seg.devices.iter().enumerate() {
            let mut values: Vec<u64> = DEVICE_FIELDS
                .iter()
                .map(|f| (f.get)(g).load(Relaxed))
                .collect();
            // the shared count and every thread row's (layout.rs `ThreadCalls`)
            for r in &seg.threads {
                values[ops] = values[ops].wrapping_add(r.ops[i].load(Relaxed));
            }
            if g.present.load(Relaxed) == 0 && values.iter().all(|&v| v == 0) {
                continue;
            }
            devices.push(DeviceSnapshot {
                index: i,
                values,
                monitor: MonitorSnapshot::load(g),
                stall_buckets: std::array::from_fn(|b| g.stall_buckets[b].load(Relaxed)),
            });
        }
        let (hot, hot_published_ns) = self.hot().unwrap_or_default();
        Snapshot {
            pid: h.pid,
            labels: std::array::from_fn(|i| name_from(&h.labels[i])),
            foreign_pid_ns: self.foreign_pid_ns(),
            layout: (h.layout_major, h.layout_minor),
            writer_version: name_from(&h.version),
            start_unix_ns: h.start_unix_ns,
            start_mono_ns: h.start_mono_ns,
            exiting: h.state.load(Relaxed) == STATE_EXITING,
            config: self.config().unwrap_or_default(),
            devices,
            calls,
            calls_overflow: h.calls_overflow.load(Relaxed),
            class_names,
            hot,
            hot_published_ns,
            hot_publishes: h.hot_publishes.load(Relaxed),
            event_head: h.event_head.load(Acquire),
            events_dropped: h.events_dropped.load(Relaxed),
            taken_mono_ns: mono_ns(),
        }
    }

    /// Next event sequence number the writer will assign.
    pub fn event_head(&self) -> u64 {
        self.seg().header.event_head.load(Acquire)
    }

    /// Time (CLOCK_MONOTONIC) of the newest complete event among the last
    /// few, 0 if none is readable.
    pub fn newest_event_ns(&self) -> u64 {
        let seg = self.seg();
        let head = seg.header.event_head.load(Acquire);
        (head.saturating_sub(8)..head)
            .rev()
            .find_map(
                |q| match read_slot(&seg.events[(q as usize) & (EVENT_CAPACITY - 1)], q) {
                    SlotRead::Ok(e) => Some(e.time_ns),
                    _ => None,
                },
            )
            .unwrap_or(0)
    }

    /// Events from `cursor.next` up to the writer's head, at most `max` (the
    /// newest ones when there are more; the rest count in `Tail::skipped`).
    /// Records overwritten before they were read, or abandoned by their
    /// writer, are counted in `Tail::lost`. A
    /// record still being written stops the tail there; if the same one is
    /// still unfinished at the next call it is counted lost and skipped, so
    /// a stalled writer never stalls the reader.
    pub fn tail(&self, cursor: &mut EventCursor, max: usize) -> Tail {
        let seg = self.seg();
        let head = seg.header.event_head.load(Acquire);
        let mut tail = Tail::default();
        let cap = EVENT_CAPACITY as u64;
        let mut q = cursor.next;
        if q > head {
            // Cursor from another segment incarnation: start over.
            q = head.saturating_sub(max as u64);
        }
        // What the ring no longer holds is lost (overrun); beyond `max`, skipped.
        let oldest = head.saturating_sub(cap);
        if q < oldest {
            tail.lost += oldest - q;
            q = oldest;
        }
        if head - q > max as u64 {
            tail.skipped += head - max as u64 - q;
            q = head - max as u64;
        }
        while q < head {
            let slot = &seg.events[(q as usize) & (EVENT_CAPACITY - 1)];
            match read_slot(slot, q) {
                SlotRead::Ok(e) => tail.events.push(e),
                SlotRead::Newer => tail.lost += 1,
                SlotRead::Pending => {
                    if cursor.stuck_at == Some(q) {
                        tail.lost += 1;
                    } else {
                        cursor.stuck_at = Some(q);
                        break;
                    }
                }
            }
            q += 1;
        }
        if q == head || cursor.stuck_at.is_some_and(|s| s < q) {
            cursor.stuck_at = None;
        }
        cursor.next = q;
        tail
    }
}

impl Drop for SegmentReader {
    fn drop(&mut self) {
        // SAFETY: mapped in open with this length.
        unsafe { libc::munmap(self.seg.as_ptr().cast(), SEGMENT_SIZE) };
    }
}

enum SlotRead {
    Ok(Event),
    /// Overwritten by a later record (or torn by one during the read).
    Newer,
    /// Not written yet, being written, or abandoned by its writer.
    Pending,
}

/// Seqlock read of one record (the reader half of the pattern in writer.rs).
fn read_slot(slot: &EventSlot, q: u64) -> SlotRead {
    // a forged segment's head can be anything: a sequence whose stamp does
    // not fit 64 bits was never written (found by fuzzing: fuzz/)
    let Some(want) = q.checked_mul(2).and_then(|w| w.checked_add(2)) else {
        return SlotRead::Pending;
    };
    let s1 = slot.stamp.load(Acquire);
    if s1 != want {
        return if s1 > want {
            SlotRead::Newer
        } else {
            SlotRead::Pending
        };
    }
    let time_ns = slot.time_ns.load(Relaxed);
    let meta = slot.meta.load(Relaxed);
    let addr = slot.addr.load(Relaxed);
    let len = slot.len.load(Relaxed);
    let value = slot.value.load(Relaxed);
    let (kind, device, tlen) = unpack_meta(meta);
    let text = load_bytes(&slot.text, (tlen as usize).min(EVENT_TEXT_LEN));
    fence(Acquire);
    if slot.stamp.load(Relaxed) != s1 {
        return SlotRead::Newer;
    }
    SlotRead::Ok(Event {
        seq: q,
        time_ns,
        kind,
        device: if device == NO_DEVICE_WIRE {
            None
        } else {
            Some(device)
        },
        addr,
        len,
        value,
        text: String::from_utf8_lossy(&text).into_owned(),
    })
}

/// Where a reader is in a segment's event ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCursor {
    /// Next sequence number to read.
    pub next: u64,
    /// A record found unfinished at the last call.
    pub stuck_at: Option<u64>,
}

impl EventCursor {
    pub fn from(seq: u64) -> Self {
        EventCursor {
            next: seq,
            stuck_at: None,
        }
    }
}

/// Result of one `tail` call.
#[derive(Debug, Default)]
pub struct Tail {
    pub events: Vec<Event>,
    /// Records missed: overwritten before they were read (overrun), or
    /// dropped or abandoned by their writer.
    pub lost: u64,
    /// Older records left unread because more than `max` were available.
    pub skipped: u64,
}

/// One event record as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub seq: u64,
    /// CLOCK_MONOTONIC ns.
    pub time_ns: u64,
    pub kind: u16,
    pub device: Option<u16>,
    pub addr: u64,
    pub len: u64,
    pub value: u64,
    pub text: String,
}

impl Event {
    pub fn kind(&self) -> Option<EventKind> {
        EventKind::from_u16(self.kind)
    }
    /// `alloc`, `migrate`, ... or `kind#N` for kinds newer than this reader.
    pub fn kind_name(&self) -> String {
        match self.kind() {
            Some(k) => k.name().to_string(),
            None => format!("kind#{}", self.kind),
        }
    }
}

/// Call count of one hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallCount {
    pub id: usize,
    pub name: String,
    pub count: u64,
}

/// Monitor state of one device as published by the writer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MonitorSnapshot {
    pub level: Level,
    pub seconds_to_oom: Option<f64>,
    pub use_fraction: f64,
    pub growth_bps: i64,
    pub updated_ns: u64,
}

impl MonitorSnapshot {
    fn load(g: &DeviceGauges) -> Self {
        let ms = g.monitor_oom_ms.load(Relaxed);
        MonitorSnapshot {
            level: Level::from_u64(g.monitor_level.load(Relaxed)),
            seconds_to_oom: if ms == u64::MAX {
                None
            } else {
                Some(ms as f64 / 1000.0)
            },
            use_fraction: g.monitor_use_ppm.load(Relaxed) as f64 / 1e6,
            growth_bps: g.monitor_growth_bps.load(Relaxed) as i64,
            updated_ns: g.monitor_updated_ns.load(Relaxed),
        }
    }
}

/// Counters of one device; `values[i]` belongs to `DEVICE_FIELDS[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSnapshot {
    pub index: usize,
    pub values: Vec<u64>,
    pub monitor: MonitorSnapshot,
    /// Fault-in stall histogram (1.1): calls per `STALL_BOUNDS` bucket, not
    /// cumulative; all zero from 1.0 writers.
    pub stall_buckets: [u64; STALL_BUCKETS],
}

impl DeviceSnapshot {
    /// Value of the field with dotted key `key` (see DEVICE_FIELDS).
    pub fn get(&self, key: &str) -> u64 {
        self.values[field_index(key)]
    }
}

/// One read of a segment (everything but the events).
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub pid: u32,
    /// Header labels in `LABEL_NAMES` order (1.1; empty from 1.0 writers).
    pub labels: [String; LABELS],
    /// The writer runs in another pid namespace (its pid is not ours).
    pub foreign_pid_ns: bool,
    pub layout: (u32, u32),
    pub writer_version: String,
    pub start_unix_ns: u64,
    pub start_mono_ns: u64,
    pub exiting: bool,
    pub config: String,
    pub devices: Vec<DeviceSnapshot>,
    /// Named hooks (all of them) and unnamed ones that were called.
    pub calls: Vec<CallCount>,
    pub calls_overflow: u64,
    pub class_names: Vec<String>,
    pub hot: Vec<HotEntry>,
    pub hot_published_ns: u64,
    pub hot_publishes: u64,
    pub event_head: u64,
    pub events_dropped: u64,
    /// CLOCK_MONOTONIC when taken (for rates and ages).
    pub taken_mono_ns: u64,
}

impl Snapshot {
    /// The label named `name` (`LABEL_NAMES`), "" if unset or unknown.
    pub fn label(&self, name: &str) -> &str {
        LABEL_NAMES
            .iter()
            .position(|n| *n == name)
            .map_or("", |i| self.labels[i].as_str())
    }

    /// CLOCK_MONOTONIC of the writer's latest sign of life: its last hot-table
    /// publication (every U3M_HOT_INTERVAL_MS while it runs), monitor update
    /// or event; its start if none.
    pub fn last_update_mono_ns(&self, newest_event_ns: u64) -> u64 {
        self.devices
            .iter()
            .map(|d| d.monitor.updated_ns)
            .chain([self.hot_published_ns, newest_event_ns, self.start_mono_ns])
            .max()
            .unwrap_or(0)
    }

    /// Names of the classes in `mask` (`class#N` for unnamed bits).
    pub fn class_list(&self, mask: u64) -> Vec<String> {
        (0..64)
            .filter(|b| mask & (1u64 << b) != 0)
            .map(|b| {
                self.class_names
                    .get(b)
                    .cloned()
                    .unwrap_or_else(|| format!("class#{b}"))
            })
            .collect()
    }

    /// (key, value) pairs of the configuration text (`shm::config_pairs`).
    pub fn config_pairs(&self) -> Vec<(String, String)> {
        super::config_pairs(&self.config)
    }
}
