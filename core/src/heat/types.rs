//! The table's public value types: identities, kinds, accesses and what the
//! readers return.

use super::record::AccessStats;
use crate::opclass::OpClass;

/// One allocation for ever: slot index and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocId(pub u32 /* index */, pub u32 /* generation */);

/// What kind of device address range an allocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocKind {
    /// aclrtMalloc & co: backed from the start.
    Malloc,
    /// A VMM VA reservation (aclrtReserveMemAddress): backed where mapped.
    Reserved,
    /// The device alias of host memory (aclrtHostRegister): pinned.
    HostAlias,
}

impl AllocKind {
    pub(crate) fn code(self) -> u64 {
        match self {
            AllocKind::Malloc => 0,
            AllocKind::Reserved => 1,
            AllocKind::HostAlias => 2,
        }
    }
    pub(crate) fn from_code(c: u64) -> AllocKind {
        match c {
            1 => AllocKind::Reserved,
            2 => AllocKind::HostAlias,
            _ => AllocKind::Malloc,
        }
    }
}

/// Why memory must never move.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PinReason {
    /// Exported through an IPC / shareable handle.
    IpcExported = 0,
    /// Registered with HCCL (peers may access it directly).
    HcclRegistered = 1,
    /// Device alias of registered host memory.
    HostRegistered = 2,
    /// Used by something u3m cannot see (opaque kernel arguments, captured graphs).
    Opaque = 3,
}

impl PinReason {
    pub const ALL: [PinReason; 4] = [
        PinReason::IpcExported,
        PinReason::HcclRegistered,
        PinReason::HostRegistered,
        PinReason::Opaque,
    ];
    pub const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of pin reasons (empty = movable).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PinMask(pub u8);

impl PinMask {
    pub fn contains(self, r: PinReason) -> bool {
        self.0 & r.bit() != 0
    }
    pub fn is_pinned(self) -> bool {
        self.0 != 0
    }
    pub fn iter(self) -> impl Iterator<Item = PinReason> {
        PinReason::ALL
            .into_iter()
            .filter(move |r| self.contains(*r))
    }
}

/// One access, as the hooks describe it.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    /// Operator sequence number (global, increasing).
    pub seq: u64,
    /// Monotonic time, ns.
    pub ns: u64,
    pub class: OpClass,
    /// `opclass::op_hash` of the operator type name.
    pub op_hash: u64,
    pub write: bool,
}

/// What a touch reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TouchResult {
    /// Owner of the first attributed part (None: nothing attributed).
    pub alloc: Option<AllocId>,
    /// Chunk records counted.
    pub chunks: u32,
    /// Bytes of the range that no live allocation owns (host pointers,
    /// unknown device pointers, gaps, or an owner freed during the touch).
    pub unattributed_bytes: u64,
}

/// An allocation and its statistics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllocInfo {
    pub id: AllocId,
    pub dev: u32,
    pub base: u64,
    pub len: u64,
    pub kind: AllocKind,
    pub pinned: PinMask,
    /// Reservations: bytes currently mapped. Others: `len`.
    pub mapped_bytes: u64,
    pub stats: AccessStats,
    /// From `on_free` only: accesses counted in the chunks whose occupancy
    /// ended with this free (the chunks it was the last owner of). For an
    /// allocation that owned its chunks alone, these are its chunk counts.
    pub closed_chunk_accesses: u64,
}

impl AllocInfo {
    /// Heat over the whole allocation (`len` bytes).
    pub fn heat(&self, now_ns: u64) -> f64 {
        self.stats.heat(self.len, now_ns)
    }
}

/// A 2 MiB chunk and its statistics (since it last became occupied).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkInfo {
    /// Chunk base address (2 MiB aligned).
    pub addr: u64,
    /// Bytes of the chunk inside live allocations.
    pub bytes: u64,
    /// Live allocations overlapping it.
    pub owners: u32,
    /// The owner, when there is exactly one.
    pub alloc: Option<AllocId>,
    /// Backed by physical memory (always, outside reservations).
    pub mapped: bool,
    pub pinned: PinMask,
    /// Has a statistics record (false: the chunk pool was full, or a
    /// reservation chunk never mapped).
    pub tracked: bool,
    pub stats: AccessStats,
}

impl ChunkInfo {
    pub fn heat(&self, now_ns: u64) -> f64 {
        self.stats.heat(self.bytes, now_ns)
    }
}

/// A tensor range (exact `(start, len)` an operator, copy or memset used,
/// clipped to its allocation) and its statistics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RangeInfo {
    pub start: u64,
    pub len: u64,
    pub alloc: AllocId,
    pub stats: AccessStats,
}

impl RangeInfo {
    pub fn heat(&self, now_ns: u64) -> f64 {
        self.stats.heat(self.len, now_ns)
    }
}

/// Table-wide figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeatTotals {
    pub live_allocs: u64,
    /// Bytes of live `Malloc` allocations.
    pub device_bytes: u64,
    /// Bytes of live `HostAlias` allocations.
    pub host_alias_bytes: u64,
    /// Bytes of live VA reservations.
    pub reserved_bytes: u64,
    /// Bytes of reservations currently mapped.
    pub mapped_bytes: u64,
    /// Bytes of live allocations in chunks marked never-move.
    pub pinned_bytes: u64,
    pub touches: u64,
    /// Touches with at least one unattributed byte.
    pub unattributed_touches: u64,
    pub unattributed_bytes: u64,
    /// Parts of touches whose owner was freed between lookup and count.
    pub stale_parts: u64,
    /// Range accesses not recorded because the range table had no room.
    pub dropped_ranges: u64,
    /// `on_alloc` refusals: overlap, full table, bad range, too many
    /// allocations in one page, out of memory.
    pub failed_allocs: u64,
    /// `on_free` of an address that is not a live allocation's base.
    pub unknown_frees: u64,
    /// Chunks with a statistics record now.
    pub chunks_tracked: u64,
    /// Times a chunk could not get a record (chunk pool full).
    pub chunks_untracked: u64,
    /// Allocation slots and chunk records ever used (their memory is
    /// committed): high-water marks against the capacities.
    pub alloc_slots_used: u64,
    pub chunk_records_used: u64,
}

/// Capacities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeatConfig {
    /// Live allocations (each costs 128 B of table while in use).
    pub max_allocs: usize,
    /// Range entries (72 B each; rounded up to a power of two).
    pub max_ranges: usize,
    /// Chunks with statistics at once (64 B each): 2 MiB of VA each.
    pub max_chunks: usize,
}

impl Default for HeatConfig {
    fn default() -> Self {
        HeatConfig {
            max_allocs: 1 << 18,
            max_ranges: 1 << 18,
            max_chunks: 1 << 19,
        }
    }
}
