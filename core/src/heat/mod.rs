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
mod cold;
mod pending;
mod pool;
mod ranges;
mod readers;
mod record;
mod types;
mod zeroed;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Mutex, MutexGuard};

use addr_map::{AddrMap, Resolved, CHUNK_SHIFT, MAX_IDX};
use alloc_table::{AllocTable, LIVE};
use pool::{reuse_delay, IndexPool};
use ranges::{RangeHit, RangeTable};
use record::{Delta, Hit, Record};
use zeroed::Zeroable;

pub use addr_map::{CHUNK, MULTI_OWNERS, VA_LIMIT};
pub use ranges::PROBE;
pub use record::{heat, AccessStats, MIN_WINDOW_NS, OP_BITS, TICK_SHIFT};
pub use types::*;

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
    chunk_recs: zeroed::ZSlice<ChunkRec>,
    ranges: RangeTable,
    shards: zeroed::ZSlice<Shard>,
    cold: Mutex<Cold>,
    config: HeatConfig,
    /// Per-thread buffers of accesses (`record_ranges`).
    pending: pending::Registry,
    deferred: pending::Deferred,
}

/// Parts of ranges [`HeatTable::touch_ranges`] counts at once.
const BATCH: usize = 8;

/// `touch_ranges`' pending parts, all of one allocation.
struct Batch {
    /// The access read and written.
    hits: [Hit; 2],
    /// The allocation of the parts: (idx, gen, base, len).
    owner: Option<(u32, u32, u64, u64)>,
    /// (start, end, write, index of the range).
    parts: [(u64, u64, bool, usize); BATCH],
    n: usize,
    /// The last range found with unattributed bytes (ranges are marked in
    /// order: one count per range, as one `touch` per range counts).
    marked: Option<usize>,
    unattributed_touches: u64,
}

impl Batch {
    fn mark(&mut self, range: usize) {
        if self.marked != Some(range) {
            self.marked = Some(range);
            self.unattributed_touches += 1;
        }
    }
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
        Self::with_config(HeatConfig {
            max_allocs,
            max_ranges,
            ..HeatConfig::default()
        })
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
            config: HeatConfig {
                max_allocs,
                max_chunks,
                max_ranges: 0,
            },
            pending: pending::registry(),
            deferred: pending::Deferred::default(),
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

    // ---- hot path (atomics only) ----

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
                Resolved::Found {
                    idx,
                    gen,
                    base,
                    len,
                } => {
                    let pend = end.min(base + len);
                    self.attribute(idx, gen, cur, pend, &hit, &mut res, shard);
                    cur = pend;
                }
            }
        }
        if res.unattributed_bytes != 0 {
            shard.unattributed_touches.fetch_add(1, Relaxed);
            shard
                .unattributed_bytes
                .fetch_add(res.unattributed_bytes, Relaxed);
        }
        res
    }

    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn attribute(
        &self,
        idx: u32,
        gen: u32,
        p0: u64,
        p1: u64,
        hit: &Hit,
        res: &mut TouchResult,
        shard: &Shard,
    ) {
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
        if let RangeHit::Dropped =
            self.ranges
                .hit(p0, p1 - p0, idx, gen, &Delta::of(hit, 1), &self.allocs)
        {
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

    /// [`HeatTable::touch`] of every range of one call (each with its own
    /// `write`; `a.write` is not used), with the same result as touching
    /// them one after the other, but cheaper when ranges share an
    /// allocation and a chunk, as an operator's do: an allocation found
    /// for one range is not looked up again for the next range inside it,
    /// and its record, and a chunk's, count those ranges in one update
    /// (the counts are added at once; every other field is a max, min or
    /// union, the same whatever the order). Returns the sum of the touches'
    /// results (`alloc`: the first attributed).
    pub fn touch_ranges(&self, ranges: &[crate::engine::Range], a: &Access) -> TouchResult {
        if let [r] = ranges {
            // nothing to share: the plain touch is cheaper than a batch
            return match r.len {
                0 => TouchResult::default(),
                _ => self.touch(
                    r.addr,
                    r.len,
                    &Access {
                        write: r.write,
                        ..*a
                    },
                ),
            };
        }
        let shard = self.shard();
        let mut res = TouchResult::default();
        let mut b = Batch {
            hits: [
                Hit::new(a.seq, a.ns, false, a.class, a.op_hash),
                Hit::new(a.seq, a.ns, true, a.class, a.op_hash),
            ],
            owner: None,
            parts: [(0, 0, false, 0); BATCH],
            n: 0,
            marked: None,
            unattributed_touches: 0,
        };
        let mut touches = 0;
        for (ri, r) in ranges.iter().enumerate() {
            if r.len == 0 {
                continue;
            }
            touches += 1;
            let end = r.addr.saturating_add(r.len);
            let mut cur = r.addr;
            while cur < end {
                // the allocation of the previous part, if it holds `cur`
                let found = match b.owner {
                    Some((idx, gen, base, len)) if cur >= base && cur < base + len => {
                        Resolved::Found {
                            idx,
                            gen,
                            base,
                            len,
                        }
                    }
                    _ => self.map.resolve(cur, &self.allocs),
                };
                match found {
                    Resolved::Gap(next) => {
                        // counted in range order: what is pending goes first
                        self.flush(&mut b, &mut res, shard);
                        let n = next.min(end);
                        res.unattributed_bytes += n - cur;
                        b.mark(ri);
                        cur = n;
                    }
                    Resolved::Found {
                        idx,
                        gen,
                        base,
                        len,
                    } => {
                        let same = matches!(b.owner, Some((i, g, ..)) if (i, g) == (idx, gen));
                        if !same || b.n == BATCH {
                            self.flush(&mut b, &mut res, shard);
                        }
                        b.owner = Some((idx, gen, base, len));
                        let pend = end.min(base + len);
                        b.parts[b.n] = (cur, pend, r.write, ri);
                        b.n += 1;
                        cur = pend;
                    }
                }
            }
        }
        self.flush(&mut b, &mut res, shard);
        shard.touches.fetch_add(touches, Relaxed);
        if b.unattributed_touches != 0 {
            shard
                .unattributed_touches
                .fetch_add(b.unattributed_touches, Relaxed);
        }
        if res.unattributed_bytes != 0 {
            shard
                .unattributed_bytes
                .fetch_add(res.unattributed_bytes, Relaxed);
        }
        res
    }

    /// Counts the parts `b` holds (all of one allocation): its record once
    /// for all of them, then each part's tensor range, then each chunk
    /// once per run of parts that reach it one after the other — what
    /// [`HeatTable::attribute`] does part by part.
    fn flush(&self, b: &mut Batch, res: &mut TouchResult, shard: &Shard) {
        let n = std::mem::take(&mut b.n);
        let Some((idx, gen, _, _)) = b.owner else {
            return;
        };
        if n == 0 {
            return;
        }
        let write = b.parts[..n].iter().any(|p| p.2);
        let ok = self.allocs.slot(idx).map(|slot| {
            (
                slot,
                slot.rec
                    .hit_n(gen as u64, &b.hits[write as usize], n as u64),
            )
        });
        let slot = match ok {
            Some((slot, true)) => slot,
            Some((_, false)) => {
                // freed since it was resolved: these parts belong to nobody
                for j in 0..n {
                    let (p0, p1, _, ri) = b.parts[j];
                    res.unattributed_bytes += p1 - p0;
                    shard.stale_parts.fetch_add(1, Relaxed);
                    b.mark(ri);
                }
                b.owner = None;
                return;
            }
            None => return,
        };
        let b = &*b;
        let parts = &b.parts[..n];
        if res.alloc.is_none() {
            res.alloc = Some(AllocId(idx, gen));
        }
        for &(p0, p1, w, _) in parts {
            let h = &b.hits[w as usize];
            if let RangeHit::Dropped =
                self.ranges
                    .hit(p0, p1 - p0, idx, gen, &Delta::of(h, 1), &self.allocs)
            {
                shard.dropped_ranges.fetch_add(1, Relaxed);
            }
        }
        let live = (gen as u64) << 32 | LIVE;
        // a run: chunk, parts reaching it, any of them writes
        let mut run: Option<(u64, u64, bool)> = None;
        for &(p0, p1, w, _) in parts {
            for c in p0 >> CHUNK_SHIFT..=(p1 - 1) >> CHUNK_SHIFT {
                match &mut run {
                    Some((rc, k, rw)) if *rc == c => {
                        *k += 1;
                        *rw |= w;
                    }
                    _ => {
                        if let Some(r) = run.replace((c, 1, w)) {
                            self.hit_chunk(slot, live, r, b, res);
                        }
                    }
                }
            }
        }
        if let Some(r) = run {
            self.hit_chunk(slot, live, r, b, res);
        }
    }

    /// `k` accesses of chunk `c` by a live allocation (`live`: its slot's
    /// state word), as `attribute` counts one.
    #[inline]
    fn hit_chunk(
        &self,
        slot: &alloc_table::AllocSlot,
        live: u64,
        (c, k, w): (u64, u64, bool),
        b: &Batch,
        res: &mut TouchResult,
    ) {
        if let Some(cs) = self.map.chunk(c << CHUNK_SHIFT) {
            let rw = cs.rec.load(Acquire);
            // The owner still live after reading `rec` means `rec` is the
            // record of an occupancy of this chunk that includes it.
            if rw != 0 && slot.state.load(Acquire) == live {
                let ri = (rw as u32).wrapping_sub(1) as usize;
                if let Some(r) = self.chunk_recs.get(ri) {
                    if r.rec.hit_n(rw >> 32, &b.hits[w as usize], k) {
                        res.chunks += k as u32;
                    }
                }
            }
        }
    }

    /// The live allocation containing `addr` (interior pointers included).
    #[inline]
    pub fn lookup(&self, addr: u64) -> Option<(AllocId, u64, u64)> {
        match self.map.resolve(addr, &self.allocs) {
            Resolved::Found {
                idx,
                gen,
                base,
                len,
            } => Some((AllocId(idx, gen), base, len)),
            Resolved::Gap(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::alloc_table::AllocSlot;
    use super::*;
    use crate::opclass::OpClass;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const B: u64 = 0x1000_0000_0000;

    /// A xorshift generator, `rnd(n)` in 0..n: the batched-path tests'
    /// random calls, the same every run.
    pub(super) fn xorshift() -> impl FnMut(u64) -> u64 {
        crate::test_rng(0x2545_f491_4f6c_dd1d)
    }

    /// One random call's 1–20 ranges over small allocations sharing a
    /// chunk, one over three chunks, one over a region boundary and a gap:
    /// empty, one page, 40 KiB or up to 5 MiB long, a third of them written.
    pub(super) fn random_call(rnd: &mut impl FnMut(u64) -> u64) -> Vec<crate::engine::Range> {
        let bases = [
            B,
            B + 64 * 1024,
            B + 5 * 64 * 1024,
            B + 4 * MIB,
            B + GIB - 2 * MIB,
            B + 3 * MIB,
        ];
        let n = 1 + rnd(20) as usize;
        (0..n)
            .map(|_| {
                let base = bases[rnd(bases.len() as u64) as usize];
                let off = rnd(8) * 16 * 1024;
                let len = match rnd(4) {
                    0 => 0,
                    1 => 4096,
                    2 => 40 * 1024,
                    _ => rnd(5 * MIB) + 1,
                };
                crate::engine::Range {
                    addr: base + off,
                    len,
                    write: rnd(3) == 0,
                    whole: false,
                }
            })
            .collect()
    }

    fn acc(seq: u64) -> Access {
        Access {
            seq,
            ns: seq * 1000,
            class: OpClass::MatMul,
            op_hash: 7 << 32,
            write: false,
        }
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
        let c = t
            .on_alloc(0, B + 8192 + 1024, 512, AllocKind::Malloc)
            .unwrap();
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
            assert!(
                t.on_alloc(0, B + i * 64, 64, AllocKind::Malloc).is_some(),
                "{i}"
            );
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
        let a = t
            .on_alloc(0, B + GIB - 2 * MIB, 4 * MIB, AllocKind::Malloc)
            .unwrap();
        let r = t.touch(B + GIB - MIB, 2 * MIB, &acc(1));
        assert_eq!(
            r,
            TouchResult {
                alloc: Some(a),
                chunks: 2,
                unattributed_bytes: 0
            }
        );
        // A range far beyond anything mapped is cheap and unattributed.
        let r = t.touch(0x7fff_0000_0000, 4 * GIB, &acc(2));
        assert_eq!(
            r,
            TouchResult {
                alloc: None,
                chunks: 0,
                unattributed_bytes: 4 * GIB
            }
        );
        let r = t.touch(u64::MAX - 10, 100, &acc(3));
        assert_eq!(r.unattributed_bytes, 10);
    }

    /// `touch_ranges` leaves every record, counter and result exactly as
    /// touching its ranges one by one does: ranges sharing an allocation
    /// and a chunk, ranges over several chunks and allocations, gaps, more
    /// parts than a batch holds, reads and writes mixed.
    #[test]
    fn touch_ranges_is_touch_one_by_one() {
        let mk = || {
            let t = HeatTable::new(64, 4096);
            // small allocations sharing a chunk, one over three chunks,
            // one over a region boundary, and a gap between them
            for i in 0..6u64 {
                t.on_alloc(0, B + i * 64 * 1024, 48 * 1024, AllocKind::Malloc)
                    .unwrap();
            }
            t.on_alloc(0, B + 4 * MIB, 6 * MIB, AllocKind::Malloc)
                .unwrap();
            t.on_alloc(0, B + GIB - 2 * MIB, 4 * MIB, AllocKind::Malloc)
                .unwrap();
            t
        };
        let (one, all) = (mk(), mk());
        let mut rnd = xorshift();
        for call in 0..400u64 {
            let rs = random_call(&mut rnd);
            let a = acc(call + 1);
            let mut want = TouchResult::default();
            for r in &rs {
                if r.len > 0 {
                    let t = one.touch(
                        r.addr,
                        r.len,
                        &Access {
                            write: r.write,
                            ..a
                        },
                    );
                    want.alloc = want.alloc.or(t.alloc);
                    want.chunks += t.chunks;
                    want.unattributed_bytes += t.unattributed_bytes;
                }
            }
            assert_eq!(all.touch_ranges(&rs, &a), want, "call {call}: {rs:?}");
        }
        assert_eq!(one.live_allocs(), all.live_allocs());
        let mut c = B;
        while c < B + 2 * GIB {
            assert_eq!(one.chunk_info(c), all.chunk_info(c), "chunk {c:#x}");
            c += CHUNK;
        }
        let ranges = |t: &HeatTable| {
            let mut v = t.hottest_ranges(usize::MAX, 0);
            v.sort_by_key(|r| (r.start, r.len));
            v
        };
        assert_eq!(ranges(&one), ranges(&all));
        assert!(ranges(&all).len() > 20);
        let (t1, t2) = (one.totals(), all.totals());
        assert_eq!(t1, t2);
        assert!(t2.unattributed_touches > 0 && t2.touches > 1000);
    }

    /// Allocations and frees of small buffers next to live ones rewrite
    /// only their own pages (`Meta::pages`): every address still resolves
    /// to the allocation that holds it, through chunks going from none to
    /// one to many owners and back.
    #[test]
    fn small_allocs_and_frees_keep_every_page_right() {
        let t = HeatTable::new(256, 1024);
        let mut live: BTreeMap<u64, (u64, AllocId)> = BTreeMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for op in 0..600 {
            if live.is_empty() || rnd(5) < 3 {
                let base = B + rnd(3 * 2048) * 1024;
                let len = match rnd(4) {
                    0 => 256 + rnd(4096),
                    1 => (1 + rnd(16)) * 4096,
                    2 => 64 * 1024,
                    _ => rnd(3 * MIB) + 1,
                };
                let free = live
                    .range(..base + len)
                    .next_back()
                    .map(|(&b, &(l, _))| b + l <= base)
                    .unwrap_or(true);
                if let (true, Some(id)) = (free, t.on_alloc(0, base, len, AllocKind::Malloc)) {
                    live.insert(base, (len, id));
                }
            } else {
                let k = rnd(live.len() as u64) as usize;
                let base = *live.keys().nth(k).unwrap();
                live.remove(&base);
                t.on_free(base).unwrap();
            }
            let mut a = B;
            while a < B + 7 * MIB {
                let want = live
                    .range(..=a)
                    .next_back()
                    .filter(|(&b, &(l, _))| a < b + l)
                    .map(|(&b, &(l, id))| (id, b, l));
                assert_eq!(t.lookup(a), want, "op {op}: {a:#x}");
                a += 1024 + rnd(2048);
            }
        }
    }
}
