//! The heat table: which device bytes are accessed, how often, how recently
//! and by what — per allocation, per 2 MiB chunk and per tensor range.
//!
//! The hooks call the cold path (`on_alloc`, `on_free`, `on_map`,
//! `on_unmap`, `set_pinned`), which takes a mutex and may allocate, and the
//! hot path (`touch`, `lookup`), which uses atomics only: no lock, no
//! allocation, no system call, O(ranges + chunks touched). Readers (`*_info`,
//! `hottest_*`, `live_allocs`, `totals`) are cold. docs/heat.md describes the
//! structure, the generation scheme that keeps concurrent frees and
//! re-allocations from misattributing an access, and the heat formula.

mod addr_map;
mod alloc_table;
mod pool;
mod ranges;
mod record;
mod zeroed;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Mutex, MutexGuard};

use addr_map::{decode, owner_word, AddrMap, ChunkSlot, Meta, Resolved, CHUNK_SHIFT, MAX_IDX, PAGE, PAGE_SHIFT};
use alloc_table::{AllocSlot, AllocTable, LIVE};
use pool::{reuse_delay, IndexPool};
use ranges::{RangeHit, RangeTable};
use record::{Hit, Raw, Record};
use zeroed::Zeroable;

pub use addr_map::{CHUNK, MULTI_OWNERS, VA_LIMIT};
pub use ranges::PROBE;
pub use record::{heat, AccessStats, MIN_WINDOW_NS, OP_BITS, TICK_SHIFT};

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
    fn code(self) -> u64 {
        match self {
            AllocKind::Malloc => 0,
            AllocKind::Reserved => 1,
            AllocKind::HostAlias => 2,
        }
    }
    fn from_code(c: u64) -> AllocKind {
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
    pub const ALL: [PinReason; 4] =
        [PinReason::IpcExported, PinReason::HcclRegistered, PinReason::HostRegistered, PinReason::Opaque];
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
        PinReason::ALL.into_iter().filter(move |r| self.contains(*r))
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
        HeatConfig { max_allocs: 1 << 18, max_ranges: 1 << 18, max_chunks: 1 << 19 }
    }
}

#[repr(C, align(64))]
#[derive(Default)]
struct ChunkRec {
    rec: Record,
    /// Cold: the epoch the record is in (its words carry its low 16 bits).
    epoch: AtomicU64,
}

// SAFETY: atomics only; zero = epoch 0, empty.
unsafe impl Zeroable for ChunkRec {}

/// Hot-path counters, spread over cache lines by thread (stack address).
#[repr(C, align(128))]
#[derive(Default)]
struct Shard {
    touches: AtomicU64,
    unattributed_touches: AtomicU64,
    unattributed_bytes: AtomicU64,
    stale_parts: AtomicU64,
    dropped_ranges: AtomicU64,
}

// SAFETY: atomics only.
unsafe impl Zeroable for Shard {}

const SHARDS: usize = 16;

struct Cold {
    /// Live allocations by base.
    by_base: BTreeMap<u64, u32>,
    alloc_pool: IndexPool,
    chunk_pool: IndexPool,
    regions: Vec<usize>,
    device_bytes: u64,
    host_alias_bytes: u64,
    reserved_bytes: u64,
    mapped_bytes: u64,
    pinned_bytes: u64,
    failed_allocs: u64,
    unknown_frees: u64,
    chunks_tracked: u64,
    chunks_untracked: u64,
}

/// See the module documentation. `Send + Sync`; use through `&self`.
pub struct HeatTable {
    map: AddrMap,
    allocs: AllocTable,
    chunk_recs: Box<[ChunkRec]>,
    ranges: RangeTable,
    shards: Box<[Shard]>,
    cold: Mutex<Cold>,
    config: HeatConfig,
}

/// Owner list entry for the address map: (owner word, base, len).
type Owner = (u64, u64, u64);

#[inline]
fn chunk_base(addr: u64) -> u64 {
    addr & !(CHUNK - 1)
}

/// Bytes of `[a0, a1)` inside `[b0, b1)`.
#[inline]
fn overlap(a0: u64, a1: u64, b0: u64, b1: u64) -> u64 {
    a1.min(b1).saturating_sub(a0.max(b0))
}

fn info_word(dev: u32, kind: AllocKind, pins: u8) -> u64 {
    dev as u64 | kind.code() << 32 | (pins as u64) << 40
}

impl HeatTable {
    /// A table for `max_allocs` live allocations and `max_ranges` tensor
    /// ranges (chunk records: the default). Aborts like `Box::new` if the
    /// tables cannot be reserved; see [`HeatTable::try_with_config`].
    pub fn new(max_allocs: usize, max_ranges: usize) -> HeatTable {
        Self::with_config(HeatConfig { max_allocs, max_ranges, ..HeatConfig::default() })
    }

    pub fn with_config(config: HeatConfig) -> HeatTable {
        match Self::try_with_config(config) {
            Some(t) => t,
            None => std::alloc::handle_alloc_error(std::alloc::Layout::new::<HeatTable>()),
        }
    }

    /// None if memory for the tables cannot be reserved. Untouched parts of
    /// the tables are never committed, so large capacities cost address
    /// space, not memory.
    pub fn try_with_config(config: HeatConfig) -> Option<HeatTable> {
        let max_allocs = config.max_allocs.clamp(1, MAX_IDX as usize / 2);
        let max_chunks = config.max_chunks.clamp(1, u32::MAX as usize / 2);
        let (da, dc) = (reuse_delay(max_allocs), reuse_delay(max_chunks));
        let shards = zeroed::slice::<Shard>(SHARDS)?;
        Some(HeatTable {
            map: AddrMap::new()?,
            allocs: AllocTable::new(max_allocs + da)?,
            chunk_recs: zeroed::slice(max_chunks + dc)?,
            ranges: RangeTable::new(config.max_ranges)?,
            shards,
            cold: Mutex::new(Cold {
                by_base: BTreeMap::new(),
                alloc_pool: IndexPool::new(max_allocs + da, da),
                chunk_pool: IndexPool::new(max_chunks + dc, dc),
                regions: Vec::new(),
                device_bytes: 0,
                host_alias_bytes: 0,
                reserved_bytes: 0,
                mapped_bytes: 0,
                pinned_bytes: 0,
                failed_allocs: 0,
                unknown_frees: 0,
                chunks_tracked: 0,
                chunks_untracked: 0,
            }),
            config: HeatConfig { max_allocs, max_chunks, max_ranges: 0 },
        })
        .map(|mut t| {
            t.config.max_ranges = t.ranges.capacity();
            t
        })
    }

    /// Effective capacities (`max_ranges` rounded up to a power of two).
    pub fn config(&self) -> HeatConfig {
        self.config
    }

    fn lock(&self) -> MutexGuard<'_, Cold> {
        // A panic while holding the lock cannot leave the hot structures
        // inconsistent in a way readers trust; carry on.
        self.cold.lock().unwrap_or_else(|e| e.into_inner())
    }

    // =====================================================================
    // Hot path
    // =====================================================================

    #[inline]
    fn shard(&self) -> &Shard {
        // Threads run on different stacks: the stack address spreads them
        // over the shards without a thread-local.
        let probe = 0u8;
        let sp = &probe as *const u8 as usize as u64;
        let i = ((sp >> 16).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize;
        &self.shards[i & (SHARDS - 1)]
    }

    /// Count one access of `[addr, addr+len)`: each part inside a live
    /// allocation is counted for that allocation, for its tensor range and
    /// for every 2 MiB chunk it covers; the rest is unattributed.
    #[inline]
    pub fn touch(&self, addr: u64, len: u64, a: &Access) -> TouchResult {
        let shard = self.shard();
        shard.touches.fetch_add(1, Relaxed);
        let mut res = TouchResult::default();
        if len == 0 {
            return res;
        }
        let end = addr.saturating_add(len);
        let hit = Hit::new(a.seq, a.ns, a.write, a.class, a.op_hash);
        let mut cur = addr;
        while cur < end {
            match self.map.resolve(cur, &self.allocs) {
                Resolved::Gap(next) => {
                    let n = next.min(end);
                    res.unattributed_bytes += n - cur;
                    cur = n;
                }
                Resolved::Found { idx, gen, base, len } => {
                    let pend = end.min(base + len);
                    self.attribute(idx, gen, cur, pend, &hit, &mut res, shard);
                    cur = pend;
                }
            }
        }
        if res.unattributed_bytes != 0 {
            shard.unattributed_touches.fetch_add(1, Relaxed);
            shard.unattributed_bytes.fetch_add(res.unattributed_bytes, Relaxed);
        }
        res
    }

    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn attribute(&self, idx: u32, gen: u32, p0: u64, p1: u64, hit: &Hit, res: &mut TouchResult, shard: &Shard) {
        let Some(slot) = self.allocs.slot(idx) else {
            return;
        };
        if !slot.rec.hit(gen as u64, hit) {
            // Freed since we resolved it: the access belongs to nobody we track.
            res.unattributed_bytes += p1 - p0;
            shard.stale_parts.fetch_add(1, Relaxed);
            return;
        }
        if res.alloc.is_none() {
            res.alloc = Some(AllocId(idx, gen));
        }
        if let RangeHit::Dropped = self.ranges.hit(p0, p1 - p0, idx, gen, hit, &self.allocs) {
            shard.dropped_ranges.fetch_add(1, Relaxed);
        }
        let live = (gen as u64) << 32 | LIVE;
        let mut c = p0 >> CHUNK_SHIFT;
        let last = (p1 - 1) >> CHUNK_SHIFT;
        while c <= last {
            if let Some(cs) = self.map.chunk(c << CHUNK_SHIFT) {
                let rw = cs.rec.load(Acquire);
                // The owner still live after reading `rec` means `rec` is the
                // record of an occupancy of this chunk that includes it.
                if rw != 0 && slot.state.load(Acquire) == live {
                    let ri = (rw as u32).wrapping_sub(1) as usize;
                    if let Some(r) = self.chunk_recs.get(ri) {
                        if r.rec.hit(rw >> 32, hit) {
                            res.chunks += 1;
                        }
                    }
                }
            }
            c += 1;
        }
    }

    /// The live allocation containing `addr` (interior pointers included).
    #[inline]
    pub fn lookup(&self, addr: u64) -> Option<(AllocId, u64, u64)> {
        match self.map.resolve(addr, &self.allocs) {
            Resolved::Found { idx, gen, base, len } => Some((AllocId(idx, gen), base, len)),
            Resolved::Gap(_) => None,
        }
    }

    // =====================================================================
    // Cold path
    // =====================================================================

    /// Live allocations overlapping `[start, end)`, in address order, as
    /// (index, base, len).
    fn owners_in(&self, c: &Cold, start: u64, end: u64) -> Vec<(u32, u64, u64)> {
        let mut v = Vec::new();
        if let Some((&b, &i)) = c.by_base.range(..start).next_back() {
            let l = self.slot(i).len.load(Relaxed);
            if b + l > start {
                v.push((i, b, l));
            }
        }
        for (&b, &i) in c.by_base.range(start..end) {
            v.push((i, b, self.slot(i).len.load(Relaxed)));
        }
        v
    }

    fn slot(&self, idx: u32) -> &AllocSlot {
        // Cold-path indices come from the pool, always in range.
        self.allocs.slot(idx).expect("allocation index in range")
    }

    fn owner_list(&self, c: &Cold, chunk: u64) -> Vec<Owner> {
        self.owners_in(c, chunk, chunk + CHUNK)
            .into_iter()
            .map(|(i, b, l)| (owner_word(i, self.slot(i).gen()), b, l))
            .collect()
    }

    /// Republish the owners of the chunk at `chunk` after a change.
    fn refresh_chunk(&self, c: &Cold, cs: &ChunkSlot, chunk: u64) {
        let owners = self.owner_list(c, chunk);
        self.map.set_owners(cs, chunk, &owners);
    }

    /// Record in place for `cs`, taking one from the pool if it has none.
    fn ensure_chunk_rec(&self, c: &mut Cold, cs: &ChunkSlot) {
        if cs.rec.load(Relaxed) != 0 {
            return;
        }
        // The pool holds max_chunks + the reuse delay; the limit is max_chunks.
        let room = (c.chunks_tracked as usize) < self.config.max_chunks;
        match if room { c.chunk_pool.take() } else { None } {
            Some(ri) => {
                let e = self.chunk_recs[ri as usize].epoch.load(Relaxed) & 0xffff_ffff;
                cs.rec.store(e << 32 | (ri as u64 + 1), Release);
                c.chunks_tracked += 1;
            }
            None => c.chunks_untracked += 1,
        }
    }

    /// Close the chunk's record (its counts end with this occupancy);
    /// returns its final access count.
    fn release_chunk_rec(&self, c: &mut Cold, cs: &ChunkSlot) -> u64 {
        let rw = cs.rec.swap(0, AcqRel);
        if rw == 0 {
            return 0;
        }
        let ri = (rw as u32 - 1) as usize;
        let r = &self.chunk_recs[ri];
        let e = r.epoch.load(Relaxed);
        let fin = r.rec.swap_epoch(e, e + 1);
        r.epoch.store((e + 1) & 0xffff_ffff, Relaxed);
        c.chunk_pool.give(ri as u32);
        c.chunks_tracked -= 1;
        fin.0[0]
    }

    /// Register a new allocation `[base, base+len)` on device `dev`. None if
    /// it overlaps a live allocation, the table is full, the range is empty
    /// or beyond [`VA_LIMIT`], more than [`MULTI_OWNERS`] allocations would
    /// share a 4 KiB page, or memory for the map runs out (all counted in
    /// `totals().failed_allocs`).
    pub fn on_alloc(&self, dev: u32, base: u64, len: u64, kind: AllocKind) -> Option<AllocId> {
        let mut c = self.lock();
        let id = self.try_alloc(&mut c, dev, base, len, kind);
        if id.is_none() {
            c.failed_allocs += 1;
        }
        id
    }

    fn try_alloc(&self, c: &mut Cold, dev: u32, base: u64, len: u64, kind: AllocKind) -> Option<AllocId> {
        let end = base.checked_add(len)?;
        if len == 0 || end > VA_LIMIT {
            return None;
        }
        if !self.owners_in(c, base, end).is_empty() {
            return None;
        }
        // Everything that can fail happens before anything is published.
        let (first_chunk, last_chunk) = (chunk_base(base), chunk_base(end - 1));
        let mut r = first_chunk >> 30;
        while r <= (end - 1) >> 30 {
            if self.map.ensure_region(r << 30)? {
                c.regions.push(r as usize);
            }
            r += 1;
        }
        // Only the first and last chunk (and page) can be shared.
        for chunk in [first_chunk, last_chunk] {
            let others = self.owners_in(c, chunk, chunk + CHUNK);
            if others.is_empty() {
                continue;
            }
            let mut multi = Vec::new();
            for page in [base & !(PAGE - 1), (end - 1) & !(PAGE - 1)] {
                if chunk_base(page) != chunk {
                    continue;
                }
                let n = self.owners_in(c, page, page + PAGE).len();
                if n + 1 > MULTI_OWNERS {
                    return None;
                }
                if n > 0 {
                    multi.push(((page - chunk) >> PAGE_SHIFT) as usize);
                }
            }
            let cs = self.map.chunk(chunk)?;
            if !self.map.reserve_pages(cs, &multi) {
                return None;
            }
        }
        if c.by_base.len() >= self.config.max_allocs {
            return None;
        }
        let idx = c.alloc_pool.take()?;
        let slot = self.slot(idx);
        let pins = if kind == AllocKind::HostAlias { PinReason::HostRegistered.bit() } else { 0 };
        let gen = slot.open(base, len, info_word(dev, kind, pins));
        c.by_base.insert(base, idx);
        let w = owner_word(idx, gen);
        let mut chunk = first_chunk;
        loop {
            let cs = self.map.chunk(chunk).expect("region installed above");
            let part = overlap(base, end, chunk, chunk + CHUNK);
            let mut m = Meta::load(cs);
            m.owners += 1;
            m.bytes += part as u32;
            if kind != AllocKind::Reserved {
                m.mapped = true;
            }
            m.pins |= pins;
            if m.pins != 0 {
                // Newly pinned chunks count whole; already pinned ones grow.
                c.pinned_bytes += if Meta::load(cs).pins == 0 { m.bytes as u64 } else { part };
            }
            m.store(cs);
            if part == CHUNK {
                self.map.set_owners(cs, chunk, &[(w, base, len)]);
            } else {
                self.refresh_chunk(c, cs, chunk);
            }
            if kind != AllocKind::Reserved {
                self.ensure_chunk_rec(c, cs);
            }
            if chunk == last_chunk {
                break;
            }
            chunk += CHUNK;
        }
        match kind {
            AllocKind::Malloc => c.device_bytes += len,
            AllocKind::Reserved => c.reserved_bytes += len,
            AllocKind::HostAlias => c.host_alias_bytes += len,
        }
        Some(AllocId(idx, gen))
    }

    /// Unregister the allocation based at `base` (exactly); returns its final
    /// statistics. Its chunks lose it as owner (a chunk left empty ends its
    /// occupancy: record closed, mapped and pin marks cleared); its ranges go
    /// stale at once and are reused later.
    pub fn on_free(&self, base: u64) -> Option<AllocInfo> {
        let mut c = self.lock();
        let Some(idx) = c.by_base.remove(&base) else {
            c.unknown_frees += 1;
            return None;
        };
        let slot = self.slot(idx);
        let len = slot.len.load(Relaxed);
        let info = slot.info.load(Relaxed);
        let mapped = slot.mapped.load(Relaxed);
        // Dead first: from here no reader resolves to it; then unpublish;
        // then close the record, which rejects touches still in flight.
        let gen = slot.kill();
        let end = base + len;
        let mut closed = 0;
        let mut chunk = chunk_base(base);
        while chunk < end {
            if let Some(cs) = self.map.chunk(chunk) {
                let part = overlap(base, end, chunk, chunk + CHUNK);
                let mut m = Meta::load(cs);
                m.owners = m.owners.saturating_sub(1);
                m.bytes = m.bytes.saturating_sub(part as u32);
                if m.pins != 0 {
                    c.pinned_bytes = c.pinned_bytes.saturating_sub(part);
                }
                if m.owners == 0 {
                    cs.owner.store(0, Release);
                    closed += self.release_chunk_rec(&mut c, cs);
                    Meta::default().store(cs);
                } else {
                    m.store(cs);
                    self.refresh_chunk(&c, cs, chunk);
                }
            }
            chunk += CHUNK;
        }
        let raw = slot.rec.swap_epoch(gen as u64, gen.wrapping_add(1) as u64);
        let kind = AllocKind::from_code(info >> 32 & 0xff);
        match kind {
            AllocKind::Malloc => c.device_bytes -= len,
            AllocKind::Reserved => {
                c.reserved_bytes -= len;
                c.mapped_bytes = c.mapped_bytes.saturating_sub(mapped);
            }
            AllocKind::HostAlias => c.host_alias_bytes -= len,
        }
        c.alloc_pool.give(idx);
        let mut fin = self.make_info(AllocId(idx, gen), base, len, info, mapped, raw);
        fin.closed_chunk_accesses = closed;
        Some(fin)
    }

    fn make_info(&self, id: AllocId, base: u64, len: u64, info: u64, mapped: u64, raw: Raw) -> AllocInfo {
        let kind = AllocKind::from_code(info >> 32 & 0xff);
        AllocInfo {
            id,
            dev: info as u32,
            base,
            len,
            kind,
            pinned: PinMask((info >> 40) as u8),
            mapped_bytes: if kind == AllocKind::Reserved { mapped } else { len },
            stats: raw.stats(),
            closed_chunk_accesses: 0,
        }
    }

    /// Apply `f(chunk slot, chunk base, bytes of the chunk in [s,e) ∩ alloc)`
    /// to every chunk of every live allocation of a `kinds` kind overlapping
    /// `[s, e)`; `g(slot)` once per allocation first. Returns whether any
    /// allocation overlapped.
    fn for_chunks_in(
        &self,
        c: &mut Cold,
        s: u64,
        e: u64,
        reserved_only: bool,
        mut g: impl FnMut(&AllocSlot),
        mut f: impl FnMut(&Self, &mut Cold, &ChunkSlot, &AllocSlot, u64),
    ) -> bool {
        let mut any = false;
        for (idx, b, l) in self.owners_in(c, s, e) {
            let slot = self.slot(idx);
            if reserved_only && slot.info.load(Relaxed) >> 32 & 0xff != AllocKind::Reserved.code() {
                continue;
            }
            any = true;
            g(slot);
            let (s0, e0) = (s.max(b), e.min(b + l));
            let mut chunk = chunk_base(s0);
            while chunk < e0 {
                if let Some(cs) = self.map.chunk(chunk) {
                    // Whole chunk ∩ allocation: the unit that is mapped or pinned.
                    let part = overlap(b, b + l, chunk, chunk + CHUNK);
                    f(self, c, cs, slot, part);
                }
                chunk += CHUNK;
            }
        }
        any
    }

    /// Chunks of reservations in `[va, va+len)` are now backed. Returns
    /// whether the range fell in a live reservation.
    pub fn on_map(&self, va: u64, len: u64) -> bool {
        let mut c = self.lock();
        let end = va.saturating_add(len);
        self.for_chunks_in(&mut c, va, end, true, |_| {}, |t, c, cs, slot, part| {
            let mut m = Meta::load(cs);
            if !m.mapped {
                m.mapped = true;
                m.store(cs);
                slot.mapped.fetch_add(part, Relaxed);
                c.mapped_bytes += part;
            }
            t.ensure_chunk_rec(c, cs);
        })
    }

    /// Chunks of reservations in `[va, va+len)` are no longer backed (their
    /// statistics stay).
    pub fn on_unmap(&self, va: u64, len: u64) -> bool {
        let mut c = self.lock();
        let end = va.saturating_add(len);
        self.for_chunks_in(&mut c, va, end, true, |_| {}, |_, c, cs, slot, part| {
            let mut m = Meta::load(cs);
            if m.mapped {
                m.mapped = false;
                m.store(cs);
                slot.mapped.fetch_sub(part.min(slot.mapped.load(Relaxed)), Relaxed);
                c.mapped_bytes = c.mapped_bytes.saturating_sub(part);
            }
        })
    }

    /// Mark `[base, base+len)` never-move for `reason`: every live allocation
    /// overlapping it, and every chunk of those allocations the range
    /// touches. Marks last as long as the allocation (chunk marks: as long as
    /// the chunk stays occupied). Returns whether anything was marked.
    pub fn set_pinned(&self, base: u64, len: u64, reason: PinReason) -> bool {
        let mut c = self.lock();
        let end = base.saturating_add(len.max(1));
        let bit = reason.bit();
        self.for_chunks_in(
            &mut c,
            base,
            end,
            false,
            |slot| {
                slot.info.fetch_or((bit as u64) << 40, Relaxed);
            },
            |_, c, cs, _, _| {
                let mut m = Meta::load(cs);
                if m.pins == 0 {
                    c.pinned_bytes += m.bytes as u64;
                }
                m.pins |= bit;
                m.store(cs);
            },
        )
    }

    // =====================================================================
    // Readers
    // =====================================================================

    /// Current statistics of a live allocation.
    pub fn alloc_info(&self, id: AllocId) -> Option<AllocInfo> {
        let slot = self.allocs.slot(id.0)?;
        let (base, len) = self.allocs.live_extent(id.0, id.1)?;
        let info = slot.info.load(Relaxed);
        let mapped = slot.mapped.load(Relaxed);
        let raw = slot.rec.read(id.1 as u64);
        if !self.allocs.is_live(id.0, id.1) {
            return None;
        }
        Some(self.make_info(id, base, len, info, mapped, raw))
    }

    /// The chunk containing `addr`, if a live allocation overlaps it.
    pub fn chunk_info(&self, addr: u64) -> Option<ChunkInfo> {
        let chunk = chunk_base(addr);
        let cs = self.map.chunk(chunk)?;
        self.read_chunk(cs, chunk)
    }

    fn read_chunk(&self, cs: &ChunkSlot, chunk: u64) -> Option<ChunkInfo> {
        let m = Meta::load(cs);
        if m.owners == 0 {
            return None;
        }
        let rw = cs.rec.load(Acquire);
        let stats = if rw == 0 {
            AccessStats::default()
        } else {
            self.chunk_recs[(rw as u32 - 1) as usize].rec.read(rw >> 32).stats()
        };
        let w = cs.owner.load(Acquire);
        let alloc = if m.owners == 1 && w & 0b11 == 0b01 {
            let (i, g) = decode(w);
            Some(AllocId(i, g))
        } else {
            None
        };
        Some(ChunkInfo {
            addr: chunk,
            bytes: m.bytes as u64,
            owners: m.owners,
            alloc,
            mapped: m.mapped,
            pinned: PinMask(m.pins),
            tracked: rw != 0,
            stats,
        })
    }

    /// The `n` hottest chunks at `now_ns` (chunks never accessed are left out).
    pub fn hottest_chunks(&self, n: usize, now_ns: u64) -> Vec<ChunkInfo> {
        // Scan without the lock, so that allocations never wait for a reader.
        let regions = self.lock().regions.clone();
        let mut v: Vec<(f64, ChunkInfo)> = Vec::new();
        for (rbase, region) in self.map.regions(&regions) {
            for (i, cs) in region.chunks.iter().enumerate() {
                if cs.rec.load(Relaxed) == 0 {
                    continue;
                }
                if let Some(ci) = self.read_chunk(cs, rbase + ((i as u64) << CHUNK_SHIFT)) {
                    if ci.stats.accesses > 0 {
                        v.push((ci.heat(now_ns), ci));
                    }
                }
            }
        }
        top_n(v, n)
    }

    /// The `n` hottest tensor ranges of live allocations at `now_ns`.
    pub fn hottest_ranges(&self, n: usize, now_ns: u64) -> Vec<RangeInfo> {
        let v = self
            .ranges
            .read_live(&self.allocs)
            .into_iter()
            .map(|r| {
                let ri = RangeInfo { start: r.start, len: r.len, alloc: AllocId(r.idx, r.gen), stats: r.raw.stats() };
                (ri.heat(now_ns), ri)
            })
            .collect();
        top_n(v, n)
    }

    /// Every live allocation, by address.
    pub fn live_allocs(&self) -> Vec<AllocInfo> {
        let c = self.lock();
        c.by_base
            .iter()
            .filter_map(|(_, &i)| {
                let slot = self.slot(i);
                self.alloc_info(AllocId(i, slot.gen()))
            })
            .collect()
    }

    /// Range entries in use (a full scan of the range table).
    pub fn range_entries(&self) -> usize {
        self.ranges.count_live(&self.allocs)
    }

    /// Table-wide figures.
    pub fn totals(&self) -> HeatTotals {
        let c = self.lock();
        let mut t = HeatTotals {
            live_allocs: c.by_base.len() as u64,
            device_bytes: c.device_bytes,
            host_alias_bytes: c.host_alias_bytes,
            reserved_bytes: c.reserved_bytes,
            mapped_bytes: c.mapped_bytes,
            pinned_bytes: c.pinned_bytes,
            failed_allocs: c.failed_allocs,
            unknown_frees: c.unknown_frees,
            chunks_tracked: c.chunks_tracked,
            chunks_untracked: c.chunks_untracked,
            alloc_slots_used: c.alloc_pool.high_water() as u64,
            chunk_records_used: c.chunk_pool.high_water() as u64,
            ..HeatTotals::default()
        };
        for s in self.shards.iter() {
            t.touches += s.touches.load(Relaxed);
            t.unattributed_touches += s.unattributed_touches.load(Relaxed);
            t.unattributed_bytes += s.unattributed_bytes.load(Relaxed);
            t.stale_parts += s.stale_parts.load(Relaxed);
            t.dropped_ranges += s.dropped_ranges.load(Relaxed);
        }
        t
    }
}

/// Highest-heat first; ties by address for a stable order.
fn top_n<T: Copy + HasAddr>(mut v: Vec<(f64, T)>, n: usize) -> Vec<T> {
    v.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.addr().cmp(&b.1.addr())));
    v.truncate(n);
    v.into_iter().map(|(_, x)| x).collect()
}

trait HasAddr {
    fn addr(&self) -> (u64, u64);
}
impl HasAddr for ChunkInfo {
    fn addr(&self) -> (u64, u64) {
        (self.addr, 0)
    }
}
impl HasAddr for RangeInfo {
    fn addr(&self) -> (u64, u64) {
        (self.start, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const B: u64 = 0x1000_0000_0000;

    fn acc(seq: u64) -> Access {
        Access { seq, ns: seq * 1000, class: OpClass::MatMul, op_hash: 7 << 32, write: false }
    }

    #[test]
    fn sizes() {
        assert_eq!(std::mem::size_of::<AllocSlot>(), 128);
        assert_eq!(std::mem::size_of::<ChunkRec>(), 64);
        assert_eq!(std::mem::size_of::<Shard>(), 128);
        fn send_sync<T: Send + Sync>() {}
        send_sync::<HeatTable>();
    }

    #[test]
    fn page_granular_owners() {
        let t = HeatTable::new(64, 1024);
        // Three allocations in one chunk, two of them sharing a page.
        let a = t.on_alloc(0, B, 4096, AllocKind::Malloc).unwrap();
        let b = t.on_alloc(0, B + 8192, 512, AllocKind::Malloc).unwrap();
        let c = t.on_alloc(0, B + 8192 + 1024, 512, AllocKind::Malloc).unwrap();
        assert_eq!(t.lookup(B + 100).unwrap().0, a);
        assert_eq!(t.lookup(B + 4096), None);
        assert_eq!(t.lookup(B + 8192 + 511).unwrap().0, b);
        assert_eq!(t.lookup(B + 8192 + 512), None);
        assert_eq!(t.lookup(B + 8192 + 1024).unwrap().0, c);
        let ci = t.chunk_info(B).unwrap();
        assert_eq!((ci.owners, ci.bytes, ci.alloc), (3, 4096 + 1024, None));
        t.on_free(B + 8192).unwrap();
        assert_eq!(t.lookup(B + 8192), None);
        assert_eq!(t.lookup(B + 8192 + 1024).unwrap().0, c);
        t.on_free(B).unwrap();
        // Down to one owner: the chunk word names it directly again.
        assert_eq!(t.chunk_info(B).unwrap().alloc, Some(c));
        assert_eq!(t.lookup(B + 8192 + 1024).unwrap().0, c);
        t.on_free(B + 8192 + 1024).unwrap();
        assert!(t.chunk_info(B).is_none());
    }

    #[test]
    fn too_many_owners_in_a_page_is_refused() {
        let t = HeatTable::new(64, 1024);
        for i in 0..MULTI_OWNERS as u64 {
            assert!(t.on_alloc(0, B + i * 64, 64, AllocKind::Malloc).is_some(), "{i}");
        }
        assert!(t.on_alloc(0, B + 16 * 64, 64, AllocKind::Malloc).is_none());
        assert_eq!(t.totals().failed_allocs, 1);
        for i in 0..MULTI_OWNERS as u64 {
            assert_eq!(t.lookup(B + i * 64 + 63).unwrap().1, B + i * 64);
        }
    }

    #[test]
    fn touch_crossing_regions() {
        let t = HeatTable::new(8, 1024);
        let a = t.on_alloc(0, B + GIB - 2 * MIB, 4 * MIB, AllocKind::Malloc).unwrap();
        let r = t.touch(B + GIB - MIB, 2 * MIB, &acc(1));
        assert_eq!(r, TouchResult { alloc: Some(a), chunks: 2, unattributed_bytes: 0 });
        // A range far beyond anything mapped is cheap and unattributed.
        let r = t.touch(0x7fff_0000_0000, 4 * GIB, &acc(2));
        assert_eq!(r, TouchResult { alloc: None, chunks: 0, unattributed_bytes: 4 * GIB });
        let r = t.touch(u64::MAX - 10, 100, &acc(3));
        assert_eq!(r.unattributed_bytes, 10);
    }
}
