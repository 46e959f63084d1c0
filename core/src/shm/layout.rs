//! The stats segment's binary layout, version 1: one `#[repr(C)]` struct per
//! section, fixed offsets, compile-time size checks. This file is the ABI
//! between `libu3m.so` (writer) and `u3m stat`/`top` (readers) of possibly
//! different builds; docs/stats.md mirrors it. Rules: never move or resize a
//! field within a major version; new fields take reserved space (reading as
//! zero from older writers) and bump `LAYOUT_MINOR`; anything else bumps
//! `LAYOUT_MAJOR`, which readers refuse.
//!
//! Every field another party may write concurrently is an atomic, so readers
//! (in this process in tests, or another process) never race on plain memory.
//! Fields written once before `magic` is published (Release) are plain.

use std::mem::size_of;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// "U3MSTATS" read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"U3MSTATS");
/// Incompatible layout changes bump this; readers refuse other majors.
/// 2: a hook's calls are `Calls` plus every thread row's (`ThreadCalls`).
pub const LAYOUT_MAJOR: u32 = 2;
/// Additive changes (reserved space put to use) bump this.
/// 1: `DeviceGauges::discards` (offset 664).
pub const LAYOUT_MINOR: u32 = 1;

pub const MAX_DEVICES: usize = 16;
pub const MAX_HOOKS: usize = 256;
pub const HOOK_NAME_LEN: usize = 48;
pub const MAX_CLASSES: usize = 32;
pub const CLASS_NAME_LEN: usize = 32;
pub const HOT_CAPACITY: usize = 64;
/// Power of two: a sequence number maps to slot `seq & (EVENT_CAPACITY-1)`.
pub const EVENT_CAPACITY: usize = 4096;
pub const EVENT_TEXT_LEN: usize = 80;
pub const CONFIG_TEXT_LEN: usize = 4032;
pub const VERSION_LEN: usize = 32;
/// Rows of per-thread call counts (`ThreadCalls`).
pub const THREAD_ROWS: usize = 64;

/// Tiers, in the order of every per-tier array.
pub const TIER_HBM: usize = 0;
pub const TIER_DRAM: usize = 1;
pub const TIER_NVME: usize = 2;
pub const TIERS: usize = 3;
pub const TIER_NAMES: [&str; TIERS] = ["hbm", "dram", "nvme"];

/// Copy kinds, in the order of every per-kind array (ACL's aclrtMemcpyKind order).
pub const COPY_H2H: usize = 0;
pub const COPY_H2D: usize = 1;
pub const COPY_D2H: usize = 2;
pub const COPY_D2D: usize = 3;
pub const COPY_KINDS: usize = 4;
pub const COPY_NAMES: [&str; COPY_KINDS] = ["h2h", "h2d", "d2h", "d2d"];

/// Writer life cycle, in `Header::state`.
pub const STATE_RUNNING: u32 = 1;
pub const STATE_EXITING: u32 = 2;

/// Header: identity, geometry and the few process-wide counters.
/// Offsets are part of the ABI (docs/stats.md); `header_field_offsets` tests them.
#[repr(C)]
pub struct Header {
    /// 0: `MAGIC`, stored last (Release) once everything else is initialised.
    pub magic: AtomicU64,
    /// 8
    pub layout_major: u32,
    /// 12
    pub layout_minor: u32,
    /// 16: size of the whole file in bytes.
    pub total_size: u64,
    /// 24
    pub header_size: u32,
    /// 28
    pub pid: u32,
    /// 32: process start time in clock ticks since boot (/proc/<pid>/stat field
    /// 22); a reader compares it with the live process to detect pid reuse.
    pub start_ticks: u64,
    /// 40: wall-clock time at creation (ns since the Unix epoch).
    pub start_unix_ns: u64,
    /// 48: CLOCK_MONOTONIC at creation; event times use the same clock.
    pub start_mono_ns: u64,
    /// 56: STATE_* (a reader shows "exiting" while the writer tears down).
    pub state: AtomicU32,
    /// 60: number of names in the hook-name table.
    pub n_hook_names: u32,
    /// 64: u3m version of the writer, NUL-padded.
    pub version: [u8; VERSION_LEN],
    /// 96..116: geometry, equal to the constants above for this major.
    pub max_devices: u32,
    pub max_hooks: u32,
    pub hot_capacity: u32,
    pub event_capacity: u32,
    pub event_record_size: u32,
    /// 116: number of names in the class-name table.
    pub n_class_names: u32,
    /// 120 (2.0): rows of per-thread call counts, `THREAD_ROWS`.
    pub thread_rows: u32,
    pub _reserved0: u32,
    /// 128: next event sequence number (writers fetch_add it); own cache line
    /// because every event touches it.
    pub event_head: AtomicU64,
    pub _pad_head: [u64; 7],
    /// 192: events a writer gave up on (its slot was being rewritten).
    pub events_dropped: AtomicU64,
    /// 200: calls counted for hook ids >= MAX_HOOKS.
    pub calls_overflow: AtomicU64,
    /// 208: number of times the hot table was published.
    pub hot_publishes: AtomicU64,
    /// 216: hot-table publications skipped because another was in progress.
    pub hot_skipped: AtomicU64,
    /// 224 (1.1): inode of the writer's pid namespace (/proc/self/ns/pid), 0
    /// if unknown. A reader in another namespace cannot check the pid.
    pub pid_ns: u64,
    pub _reserved1: [u64; 3],
    /// 256 (1.1): who the process is in a job and where it runs, from its
    /// environment at creation (`LABEL_NAMES`, `label_sources`); NUL-padded
    /// UTF-8, empty when unset.
    pub labels: [[u8; LABEL_LEN]; LABELS],
    pub _reserved: [u64; 416],
}

/// Labels in the header (1.1), in slot order. The values come from the
/// writer's environment (`label_sources`): torchrun's rank variables and the
/// Kubernetes downward-API variables conventionally set in a pod spec.
pub const LABELS: usize = 8;
pub const LABEL_LEN: usize = 64;
pub const LABEL_NAMES: [&str; LABELS] = [
    "node",
    "rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "run_id",
    "pod",
    "namespace",
];
pub const LABEL_NODE: usize = 0;
pub const LABEL_RANK: usize = 1;
pub const LABEL_LOCAL_RANK: usize = 2;
pub const LABEL_WORLD_SIZE: usize = 3;

/// Environment variables each label is read from, first set and non-empty
/// wins; `node` falls back to the host name.
pub fn label_sources(i: usize) -> &'static [&'static str] {
    const SRC: [&[&str]; LABELS] = [
        &["NODE_NAME"],
        &["RANK"],
        &["LOCAL_RANK"],
        &["WORLD_SIZE"],
        &["LOCAL_WORLD_SIZE"],
        &["TORCHELASTIC_RUN_ID"],
        &["POD_NAME"],
        &["POD_NAMESPACE"],
    ];
    SRC.get(i).copied().unwrap_or(&[])
}

/// Upper bounds (seconds) of the fault-in stall histogram's buckets; the last
/// bucket (index STALL_BOUNDS.len()) is +Inf.
pub const STALL_BOUNDS: [f64; 15] = [
    10e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3,
    500e-3, 1.0,
];
pub const STALL_BUCKETS: usize = STALL_BOUNDS.len() + 1;

/// Bucket of a stall of `ns` nanoseconds (le: a value on a bound counts in it).
pub fn stall_bucket(ns: u64) -> usize {
    let s = ns as f64 / 1e9;
    STALL_BOUNDS
        .iter()
        .position(|&b| s <= b)
        .unwrap_or(STALL_BOUNDS.len())
}

/// Configuration text ("KEY=VALUE" lines), guarded by a seqlock so the library
/// may rewrite it (e.g. falling back to pass-through) while readers look.
#[repr(C)]
pub struct ConfigArea {
    /// Even: stable; odd: being written.
    pub seq: AtomicU64,
    pub len: AtomicU64,
    pub _reserved: [u64; 6],
    pub text: [AtomicU64; CONFIG_TEXT_LEN / 8],
}

/// Names written once at creation: hook i counts into `Calls[i]`; class bit i
/// of a hot entry's mask is `class_names[i]`. NUL-padded UTF-8.
#[repr(C)]
pub struct NameTables {
    pub hook_names: [[u8; HOOK_NAME_LEN]; MAX_HOOKS],
    pub class_names: [[u8; CLASS_NAME_LEN]; MAX_CLASSES],
    pub _reserved: [u8; 3072],
}

/// Gauges and counters of one device (1 KiB). Updated with relaxed atomics:
/// each value is exact on its own, a snapshot of several is not a transaction.
#[repr(C)]
pub struct DeviceGauges {
    /// Non-zero once the writer touched this device.
    pub present: AtomicU64,
    /// Bytes resident per tier.
    pub used: [AtomicU64; TIERS],
    /// Physical capacity (hbm) or configured limit (dram, nvme) per tier.
    pub capacity: [AtomicU64; TIERS],
    /// High-water mark of `used` per tier.
    pub peak: [AtomicU64; TIERS],
    /// Capacity the process is told it has (oversubscription), 0 if not set.
    pub virtual_capacity: AtomicU64,
    pub allocs_live: AtomicU64,
    pub allocs_total: AtomicU64,
    pub frees_total: AtomicU64,
    pub alloc_failures: AtomicU64,
    /// Bytes of live device allocations (as the application sees them).
    pub bytes_live: AtomicU64,
    pub bytes_total: AtomicU64,
    /// Operator launches (aclop, aclnn), raw kernel launches, graph replays.
    /// (2.0) `ops` is the share of threads without a row: the launches are
    /// it plus every `ThreadCalls` row's `ops` of the device.
    pub ops: AtomicU64,
    pub kernels: AtomicU64,
    pub graph_launches: AtomicU64,
    pub copy_calls: [AtomicU64; COPY_KINDS],
    pub copy_bytes: [AtomicU64; COPY_KINDS],
    pub memsets: AtomicU64,
    pub memset_bytes: AtomicU64,
    pub collectives: AtomicU64,
    pub collective_bytes: AtomicU64,
    /// Chunks moved into / out of each tier, and their bytes.
    pub migrations_in: [AtomicU64; TIERS],
    pub migrations_out: [AtomicU64; TIERS],
    pub migration_bytes_in: [AtomicU64; TIERS],
    pub migration_bytes_out: [AtomicU64; TIERS],
    pub faults_in: AtomicU64,
    pub fault_bytes: AtomicU64,
    pub evictions: AtomicU64,
    pub eviction_bytes: AtomicU64,
    /// Bytes marked never-move (IPC handles, HCCL-registered, host aliases).
    pub pinned_bytes: AtomicU64,
    /// Monitor state: level (0 ok, 1 warning, 2 critical), predicted ms to
    /// OOM (u64::MAX: none), HBM use in parts per million of capacity, growth
    /// in bytes/s (i64 bits), CLOCK_MONOTONIC of the last update.
    pub monitor_level: AtomicU64,
    pub monitor_oom_ms: AtomicU64,
    pub monitor_use_ppm: AtomicU64,
    pub monitor_growth_bps: AtomicU64,
    pub monitor_updated_ns: AtomicU64,
    /// 432 (1.1): chunks the background prefetch brought back ahead of use,
    /// and their bytes; prefetched chunks a call then used (hits) and chunks
    /// a call had to wait for (misses: demand fault-ins).
    pub prefetches: AtomicU64,
    pub prefetch_bytes: AtomicU64,
    pub prefetch_hits: AtomicU64,
    pub prefetch_misses: AtomicU64,
    /// 464 (1.1): calls that waited for fault-ins, the total wait (ns), and
    /// how many waited up to each STALL_BOUNDS bound (non-cumulative).
    pub stall_count: AtomicU64,
    pub stall_ns: AtomicU64,
    pub stall_buckets: [AtomicU64; STALL_BUCKETS],
    /// 608 (1.2): calls refused before launch because their memory cannot
    /// all be accessible at once (issue 11).
    pub refused_oversize: AtomicU64,
    /// 616 (1.2): bytes of managed memory host-mapped on this device now
    /// (pinned host memory at its device addresses, read over the link);
    /// chunks that became host-mapped, the bytes copied into their host
    /// handles, and host-mapped chunks brought back into HBM.
    pub host_mapped: AtomicU64,
    pub host_maps: AtomicU64,
    pub host_map_bytes: AtomicU64,
    pub host_unmaps: AtomicU64,
    /// 648 (1.3): U3M_HOST_MAP=stream: chunks of read-once streams
    /// host-mapped instead of copied in, and reads of such chunks served in
    /// place instead of by a copy-in (docs/tiering.md).
    pub stream_maps: AtomicU64,
    pub stream_reads: AtomicU64,
    /// 664 (2.1): chunks a discard hint (`u3m_discard`, torch_npu's freed
    /// blocks under U3M_TORCH_HINTS=on) marked as holding no data, so that
    /// they leave HBM without a copy-out.
    pub discards: AtomicU64,
    pub _reserved: [u64; 44],
}

/// Call counts per hook id, of threads without a row of their own
/// (`ThreadCalls`). A hook's calls are this count plus every row's.
#[repr(C)]
pub struct Calls {
    pub count: [AtomicU64; MAX_HOOKS],
}

/// One thread's call counts per hook id and operator launches per device
/// (2.0): a row is held by one live thread of the writer at a time, which
/// alone writes its counts (a load and a store, no read-modify-write on a
/// line every calling thread shares). A thread that exits gives its row
/// back with its counts in it; the next thread to take it counts on from
/// there, so the rows' sums stay the calls made. Readers add every row,
/// held or not, to `Calls` and to each device's `ops`.
#[repr(C)]
pub struct ThreadCalls {
    /// 0: free; 1: held by a thread (taken with a compare-and-swap,
    /// Acquire, given back with a Release store: the next holder's counts
    /// start from the last one's).
    pub held: AtomicU64,
    pub _reserved: [u64; 7],
    /// 64: operator launches per device (`DeviceGauges::ops`' share).
    pub ops: [AtomicU64; MAX_DEVICES],
    /// 192: calls per hook id (`Calls::count`'s share).
    pub count: [AtomicU64; MAX_HOOKS],
}

/// One row of the hot table (64 bytes).
#[repr(C)]
pub struct HotSlot {
    pub addr: AtomicU64,
    pub len: AtomicU64,
    pub device: AtomicU64,
    pub accesses: AtomicU64,
    /// f64 bits.
    pub heat: AtomicU64,
    pub class_mask: AtomicU64,
    /// CLOCK_MONOTONIC of the last access, 0 if unknown.
    pub last_ns: AtomicU64,
    pub _reserved: u64,
}

/// The N hottest ranges, replaced as a whole under a seqlock.
#[repr(C)]
pub struct HotTable {
    /// Even: stable; odd: being published.
    pub seq: AtomicU64,
    pub count: AtomicU64,
    /// CLOCK_MONOTONIC of the last publication.
    pub published_ns: AtomicU64,
    pub _reserved: [u64; 5],
    pub entries: [HotSlot; HOT_CAPACITY],
    pub _reserved_tail: [u8; 1984],
}

/// One event record (128 bytes). `stamp` is the record's seqlock: 0 never
/// written, `2*seq+1` while sequence `seq` is being written, `2*seq+2` once
/// it is complete.
#[repr(C)]
pub struct EventSlot {
    pub stamp: AtomicU64,
    /// CLOCK_MONOTONIC ns.
    pub time_ns: AtomicU64,
    /// kind (bits 0..16) | device (16..32, 0xffff: none) | text length (32..48).
    pub meta: AtomicU64,
    pub addr: AtomicU64,
    pub len: AtomicU64,
    /// Kind-specific number (docs/stats.md).
    pub value: AtomicU64,
    /// Short UTF-8 text, little-endian packed.
    pub text: [AtomicU64; EVENT_TEXT_LEN / 8],
}

/// The whole file.
#[repr(C)]
pub struct Segment {
    pub header: Header,
    pub config: ConfigArea,
    pub names: NameTables,
    pub devices: [DeviceGauges; MAX_DEVICES],
    pub calls: Calls,
    pub hot: HotTable,
    pub events: [EventSlot; EVENT_CAPACITY],
    pub threads: [ThreadCalls; THREAD_ROWS],
}

pub const OFF_HEADER: usize = 0;
pub const OFF_CONFIG: usize = OFF_HEADER + size_of::<Header>();
pub const OFF_NAMES: usize = OFF_CONFIG + size_of::<ConfigArea>();
pub const OFF_DEVICES: usize = OFF_NAMES + size_of::<NameTables>();
pub const OFF_CALLS: usize = OFF_DEVICES + MAX_DEVICES * size_of::<DeviceGauges>();
pub const OFF_HOT: usize = OFF_CALLS + size_of::<Calls>();
pub const OFF_EVENTS: usize = OFF_HOT + size_of::<HotTable>();
pub const OFF_THREADS: usize = OFF_EVENTS + EVENT_CAPACITY * size_of::<EventSlot>();
pub const SEGMENT_SIZE: usize = OFF_THREADS + THREAD_ROWS * size_of::<ThreadCalls>();

// The ABI, checked at compile time (docs/stats.md has the same figures).
const _: () = {
    assert!(size_of::<Header>() == 4096);
    assert!(size_of::<ConfigArea>() == 4096);
    assert!(size_of::<NameTables>() == 16384);
    assert!(size_of::<DeviceGauges>() == 1024);
    assert!(size_of::<Calls>() == 2048);
    assert!(size_of::<HotSlot>() == 64);
    assert!(size_of::<HotTable>() == 6144);
    assert!(size_of::<EventSlot>() == 128);
    assert!(size_of::<ThreadCalls>() == 2240);
    assert!(OFF_CONFIG == 4096);
    assert!(OFF_NAMES == 8192);
    assert!(OFF_DEVICES == 24576);
    assert!(OFF_CALLS == 40960);
    assert!(OFF_HOT == 43008);
    assert!(OFF_EVENTS == 49152);
    assert!(OFF_THREADS == 573440);
    assert!(SEGMENT_SIZE == 716800);
    assert!(size_of::<Segment>() == SEGMENT_SIZE);
    assert!(EVENT_CAPACITY.is_power_of_two());
    assert!(CONFIG_TEXT_LEN & 7 == 0 && EVENT_TEXT_LEN & 7 == 0);
};

/// What an event record says happened. Numbers are ABI; readers print unknown
/// ones as `kind#N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum EventKind {
    /// Segment created: value = pid, text = mode.
    Start = 1,
    /// Device allocation: addr, len; value = 1 if managed by u3m.
    Alloc = 2,
    /// Device free: addr, len (0 if unknown).
    Free = 3,
    /// A chunk moved between tiers: addr, len; value = from_tier << 8 | to_tier.
    Migrate = 4,
    /// A chunk was brought back to HBM before an access: addr, len; value = from tier.
    FaultIn = 5,
    /// A chunk left HBM: addr, len; value = to tier.
    Evict = 6,
    /// Monitor level change: value = new level (0 ok, 1 warning, 2 critical),
    /// len = bytes used; text e.g. "hbm 86.0% warning".
    Monitor = 7,
    /// Time to OOM fell below the monitor's horizon: value = predicted ms.
    OomPredicted = 8,
    /// u3m changed mode (e.g. fell back to pass-through): text says why.
    ModeSwitch = 9,
    /// A U3M_* variable was unknown or had a bad value: text names it.
    ConfigError = 10,
    /// An allocation failed: len; value = the runtime's error code.
    AllocFailed = 11,
    /// A device disappeared: device; text says what was lost.
    DeviceLost = 12,
    /// A runtime or I/O error u3m handled: value = error code; text says where.
    Error = 13,
    /// Anything else worth a line: text.
    Info = 14,
    /// Writer is exiting.
    Exit = 15,
    /// The placement policy changed how it predicts (calibration, a
    /// train/infer switch, the thrash guard, recalibrated thresholds): text.
    Policy = 16,
}

impl EventKind {
    pub const ALL: [EventKind; 16] = [
        EventKind::Start,
        EventKind::Alloc,
        EventKind::Free,
        EventKind::Migrate,
        EventKind::FaultIn,
        EventKind::Evict,
        EventKind::Monitor,
        EventKind::OomPredicted,
        EventKind::ModeSwitch,
        EventKind::ConfigError,
        EventKind::AllocFailed,
        EventKind::DeviceLost,
        EventKind::Error,
        EventKind::Info,
        EventKind::Exit,
        EventKind::Policy,
    ];

    pub fn from_u16(v: u16) -> Option<EventKind> {
        EventKind::ALL.iter().copied().find(|k| *k as u16 == v)
    }

    /// Name used by the table and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Start => "start",
            EventKind::Alloc => "alloc",
            EventKind::Free => "free",
            EventKind::Migrate => "migrate",
            EventKind::FaultIn => "fault-in",
            EventKind::Evict => "evict",
            EventKind::Monitor => "monitor",
            EventKind::OomPredicted => "oom-predicted",
            EventKind::ModeSwitch => "mode-switch",
            EventKind::ConfigError => "config-error",
            EventKind::AllocFailed => "alloc-failed",
            EventKind::DeviceLost => "device-lost",
            EventKind::Error => "error",
            EventKind::Info => "info",
            EventKind::Exit => "exit",
            EventKind::Policy => "policy",
        }
    }
}

/// Device argument of an event that concerns no device (any id >= this is
/// recorded as none).
pub const NO_DEVICE: u32 = 0xffff;
/// The same in a record's `meta` field.
pub(crate) const NO_DEVICE_WIRE: u16 = 0xffff;

pub(crate) fn pack_meta(kind: u16, device: u16, text_len: u16) -> u64 {
    kind as u64 | (device as u64) << 16 | (text_len as u64) << 32
}

pub(crate) fn unpack_meta(meta: u64) -> (u16, u16, u16) {
    (meta as u16, (meta >> 16) as u16, (meta >> 32) as u16)
}

/// How a counter is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Count,
}

/// One device counter: its dotted JSON path (`"hbm.used"` is
/// `devices[i].hbm.used`), unit, and where it lives. This list drives the
/// JSON, the docs check and the readers' snapshots: add a counter here and it
/// appears everywhere.
pub struct DeviceField {
    pub key: &'static str,
    pub unit: Unit,
    pub help: &'static str,
    pub get: fn(&DeviceGauges) -> &AtomicU64,
}

macro_rules! fields {
    ($( $key:literal, $unit:ident, $help:literal, |$g:ident| $e:expr; )*) => {
        &[ $( DeviceField { key: $key, unit: Unit::$unit, help: $help, get: |$g: &DeviceGauges| &$e }, )* ]
    };
}

pub static DEVICE_FIELDS: &[DeviceField] = fields![
    "hbm.used", Bytes, "bytes resident in HBM", |g| g.used[TIER_HBM];
    "hbm.capacity", Bytes, "physical HBM capacity", |g| g.capacity[TIER_HBM];
    "hbm.peak", Bytes, "high-water mark of hbm.used", |g| g.peak[TIER_HBM];
    "hbm.virtual_capacity", Bytes, "capacity reported to the process (oversubscription), 0 if unset", |g| g.virtual_capacity;
    "dram.used", Bytes, "bytes held in pinned host DRAM", |g| g.used[TIER_DRAM];
    "dram.capacity", Bytes, "DRAM tier limit (U3M_DRAM_BYTES)", |g| g.capacity[TIER_DRAM];
    "dram.peak", Bytes, "high-water mark of dram.used", |g| g.peak[TIER_DRAM];
    "nvme.used", Bytes, "bytes held in the NVMe swap files", |g| g.used[TIER_NVME];
    "nvme.capacity", Bytes, "NVMe tier limit (U3M_SWAP_BYTES)", |g| g.capacity[TIER_NVME];
    "nvme.peak", Bytes, "high-water mark of nvme.used", |g| g.peak[TIER_NVME];
    "allocs.live", Count, "live device allocations", |g| g.allocs_live;
    "allocs.total", Count, "device allocations made", |g| g.allocs_total;
    "allocs.frees", Count, "device frees", |g| g.frees_total;
    "allocs.failed", Count, "device allocations that failed", |g| g.alloc_failures;
    "allocs.bytes_live", Bytes, "bytes of live device allocations", |g| g.bytes_live;
    "allocs.bytes_total", Bytes, "bytes ever allocated", |g| g.bytes_total;
    "launches.ops", Count, "operator launches (aclop, aclnn)", |g| g.ops;
    "launches.kernels", Count, "raw kernel launches", |g| g.kernels;
    "launches.graphs", Count, "captured-graph and model executions", |g| g.graph_launches;
    "copies.h2h.calls", Count, "host-to-host copies", |g| g.copy_calls[COPY_H2H];
    "copies.h2h.bytes", Bytes, "bytes copied host to host", |g| g.copy_bytes[COPY_H2H];
    "copies.h2d.calls", Count, "host-to-device copies", |g| g.copy_calls[COPY_H2D];
    "copies.h2d.bytes", Bytes, "bytes copied host to device", |g| g.copy_bytes[COPY_H2D];
    "copies.d2h.calls", Count, "device-to-host copies", |g| g.copy_calls[COPY_D2H];
    "copies.d2h.bytes", Bytes, "bytes copied device to host", |g| g.copy_bytes[COPY_D2H];
    "copies.d2d.calls", Count, "device-to-device copies", |g| g.copy_calls[COPY_D2D];
    "copies.d2d.bytes", Bytes, "bytes copied device to device", |g| g.copy_bytes[COPY_D2D];
    "memsets.calls", Count, "memsets", |g| g.memsets;
    "memsets.bytes", Bytes, "bytes set", |g| g.memset_bytes;
    "collectives.calls", Count, "HCCL collectives", |g| g.collectives;
    "collectives.bytes", Bytes, "bytes of collective buffers", |g| g.collective_bytes;
    "migrations.hbm.in", Count, "chunks moved into HBM", |g| g.migrations_in[TIER_HBM];
    "migrations.hbm.out", Count, "chunks moved out of HBM", |g| g.migrations_out[TIER_HBM];
    "migrations.hbm.bytes_in", Bytes, "bytes moved into HBM", |g| g.migration_bytes_in[TIER_HBM];
    "migrations.hbm.bytes_out", Bytes, "bytes moved out of HBM", |g| g.migration_bytes_out[TIER_HBM];
    "migrations.dram.in", Count, "chunks moved into DRAM", |g| g.migrations_in[TIER_DRAM];
    "migrations.dram.out", Count, "chunks moved out of DRAM", |g| g.migrations_out[TIER_DRAM];
    "migrations.dram.bytes_in", Bytes, "bytes moved into DRAM", |g| g.migration_bytes_in[TIER_DRAM];
    "migrations.dram.bytes_out", Bytes, "bytes moved out of DRAM", |g| g.migration_bytes_out[TIER_DRAM];
    "migrations.nvme.in", Count, "chunks moved onto NVMe", |g| g.migrations_in[TIER_NVME];
    "migrations.nvme.out", Count, "chunks moved off NVMe", |g| g.migrations_out[TIER_NVME];
    "migrations.nvme.bytes_in", Bytes, "bytes moved onto NVMe", |g| g.migration_bytes_in[TIER_NVME];
    "migrations.nvme.bytes_out", Bytes, "bytes moved off NVMe", |g| g.migration_bytes_out[TIER_NVME];
    "faults_in.count", Count, "chunks faulted back into HBM before an access", |g| g.faults_in;
    "faults_in.bytes", Bytes, "bytes faulted in", |g| g.fault_bytes;
    "evictions.count", Count, "chunks evicted from HBM", |g| g.evictions;
    "evictions.bytes", Bytes, "bytes evicted", |g| g.eviction_bytes;
    "pinned_bytes", Bytes, "bytes marked never-move", |g| g.pinned_bytes;
    "prefetch.chunks", Count, "chunks the background prefetch brought back ahead of use", |g| g.prefetches;
    "prefetch.bytes", Bytes, "bytes the background prefetch brought back", |g| g.prefetch_bytes;
    "prefetch.hits", Count, "prefetched chunks a call used before they left HBM", |g| g.prefetch_hits;
    "prefetch.misses", Count, "chunks a call had to wait for (demand fault-ins)", |g| g.prefetch_misses;
    "stall.count", Count, "calls that waited for fault-ins", |g| g.stall_count;
    "stall.ns", Count, "total time calls waited for fault-ins (ns)", |g| g.stall_ns;
    "refused_oversize", Count, "calls refused before launch: their memory cannot all be accessible at once", |g| g.refused_oversize;
    "hostmap.bytes", Bytes, "managed memory host-mapped now (pinned host memory at its device addresses)", |g| g.host_mapped;
    "hostmap.maps", Count, "chunks that became host-mapped for calls larger than HBM", |g| g.host_maps;
    "hostmap.map_bytes", Bytes, "bytes copied into host-mapped chunks", |g| g.host_map_bytes;
    "hostmap.unmaps", Count, "host-mapped chunks brought back into HBM", |g| g.host_unmaps;
    "hostmap.stream_maps", Count, "read-once chunks host-mapped instead of copied in (U3M_HOST_MAP=probe or stream)", |g| g.stream_maps;
    "hostmap.stream_reads", Count, "reads of read-once chunks served in place instead of by a copy-in", |g| g.stream_reads;
    "discards", Count, "chunks a discard hint marked as holding no data (they leave HBM without a copy-out)", |g| g.discards;
];

/// Index of a field in `DEVICE_FIELDS` (panics on an unknown key: keys are
/// compile-time literals at every call site and tests cover them).
pub fn field_index(key: &str) -> usize {
    DEVICE_FIELDS
        .iter()
        .position(|f| f.key == key)
        .unwrap_or_else(|| panic!("unknown device field {key}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::addr_of;

    fn off<T, F>(base: *const T, f: *const F) -> usize {
        f as usize - base as usize
    }

    #[test]
    fn header_field_offsets() {
        let b = std::mem::MaybeUninit::<Header>::uninit();
        let p = b.as_ptr();
        unsafe {
            assert_eq!(off(p, addr_of!((*p).magic)), 0);
            assert_eq!(off(p, addr_of!((*p).layout_major)), 8);
            assert_eq!(off(p, addr_of!((*p).layout_minor)), 12);
            assert_eq!(off(p, addr_of!((*p).total_size)), 16);
            assert_eq!(off(p, addr_of!((*p).header_size)), 24);
            assert_eq!(off(p, addr_of!((*p).pid)), 28);
            assert_eq!(off(p, addr_of!((*p).start_ticks)), 32);
            assert_eq!(off(p, addr_of!((*p).start_unix_ns)), 40);
            assert_eq!(off(p, addr_of!((*p).start_mono_ns)), 48);
            assert_eq!(off(p, addr_of!((*p).state)), 56);
            assert_eq!(off(p, addr_of!((*p).n_hook_names)), 60);
            assert_eq!(off(p, addr_of!((*p).version)), 64);
            assert_eq!(off(p, addr_of!((*p).max_devices)), 96);
            assert_eq!(off(p, addr_of!((*p).event_record_size)), 112);
            assert_eq!(off(p, addr_of!((*p).n_class_names)), 116);
            assert_eq!(off(p, addr_of!((*p).thread_rows)), 120);
            assert_eq!(off(p, addr_of!((*p).event_head)), 128);
            assert_eq!(off(p, addr_of!((*p).events_dropped)), 192);
            assert_eq!(off(p, addr_of!((*p).calls_overflow)), 200);
            assert_eq!(off(p, addr_of!((*p).hot_publishes)), 208);
            assert_eq!(off(p, addr_of!((*p).hot_skipped)), 216);
            assert_eq!(off(p, addr_of!((*p).pid_ns)), 224);
            assert_eq!(off(p, addr_of!((*p).labels)), 256);
            assert_eq!(off(p, addr_of!((*p)._reserved)), 768);
        }
    }

    #[test]
    fn device_field_offsets() {
        let b = std::mem::MaybeUninit::<DeviceGauges>::uninit();
        let p = b.as_ptr();
        unsafe {
            assert_eq!(off(p, addr_of!((*p).used)), 8);
            assert_eq!(off(p, addr_of!((*p).virtual_capacity)), 80);
            assert_eq!(off(p, addr_of!((*p).ops)), 136);
            assert_eq!(off(p, addr_of!((*p).copy_calls)), 160);
            assert_eq!(off(p, addr_of!((*p).copy_bytes)), 192);
            assert_eq!(off(p, addr_of!((*p).memsets)), 224);
            assert_eq!(off(p, addr_of!((*p).migrations_in)), 256);
            assert_eq!(off(p, addr_of!((*p).faults_in)), 352);
            assert_eq!(off(p, addr_of!((*p).pinned_bytes)), 384);
            assert_eq!(off(p, addr_of!((*p).monitor_level)), 392);
            assert_eq!(off(p, addr_of!((*p).monitor_updated_ns)), 424);
            assert_eq!(off(p, addr_of!((*p).prefetches)), 432);
            assert_eq!(off(p, addr_of!((*p).prefetch_misses)), 456);
            assert_eq!(off(p, addr_of!((*p).stall_count)), 464);
            assert_eq!(off(p, addr_of!((*p).stall_ns)), 472);
            assert_eq!(off(p, addr_of!((*p).stall_buckets)), 480);
            assert_eq!(off(p, addr_of!((*p).refused_oversize)), 608);
            assert_eq!(off(p, addr_of!((*p).host_mapped)), 616);
            assert_eq!(off(p, addr_of!((*p).host_unmaps)), 640);
            assert_eq!(off(p, addr_of!((*p).stream_maps)), 648);
            assert_eq!(off(p, addr_of!((*p).stream_reads)), 656);
            assert_eq!(off(p, addr_of!((*p).discards)), 664);
            assert_eq!(off(p, addr_of!((*p)._reserved)), 672);
        }
    }

    #[test]
    fn field_keys_are_unique_and_resolvable() {
        let mut keys: Vec<&str> = DEVICE_FIELDS.iter().map(|f| f.key).collect();
        keys.sort_unstable();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n, "duplicate device field key");
        assert_eq!(field_index("discards"), DEVICE_FIELDS.len() - 1);
    }

    #[test]
    fn stall_buckets_are_le() {
        assert_eq!(stall_bucket(0), 0);
        assert_eq!(stall_bucket(10_000), 0);
        assert_eq!(stall_bucket(10_001), 1);
        assert_eq!(stall_bucket(1_000_000), 5);
        assert_eq!(stall_bucket(1_000_000_000), 14);
        assert_eq!(stall_bucket(u64::MAX), STALL_BUCKETS - 1);
    }

    #[test]
    fn event_kinds_roundtrip() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_u16(k as u16), Some(k));
        }
        assert_eq!(EventKind::from_u16(0), None);
        assert_eq!(EventKind::from_u16(999), None);
        assert_eq!(
            unpack_meta(pack_meta(7, NO_DEVICE_WIRE, 80)),
            (7, NO_DEVICE_WIRE, 80)
        );
    }
}
