//! Readers: statistics of one allocation or chunk, the hottest chunks and
//! ranges, the live allocations, table-wide totals. They may allocate and
//! never hold the mutex while scanning the big tables.

use std::sync::atomic::Ordering::*;

use super::addr_map::{decode, ChunkSlot, Meta, CHUNK_SHIFT};
use super::{
    chunk_base, AccessStats, AllocId, AllocInfo, ChunkInfo, HeatTable, HeatTotals, PinMask,
    RangeInfo,
};

impl HeatTable {
    /// Current statistics of a live allocation.
    pub fn alloc_info(&self, id: AllocId) -> Option<AllocInfo> {
        self.drain();
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
        self.drain();
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
            self.chunk_recs[(rw as u32 - 1) as usize]
                .rec
                .read(rw >> 32)
                .stats()
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
        self.drain();
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
        self.drain();
        let v = self
            .ranges
            .read_live(&self.allocs)
            .into_iter()
            .map(|r| {
                let ri = RangeInfo {
                    start: r.start,
                    len: r.len,
                    alloc: AllocId(r.idx, r.gen),
                    stats: r.raw.stats(),
                };
                (ri.heat(now_ns), ri)
            })
            .collect();
        top_n(v, n)
    }

    /// Every live allocation, by address.
    pub fn live_allocs(&self) -> Vec<AllocInfo> {
        self.drain();
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
        self.drain();
        self.ranges.count_live(&self.allocs)
    }

    /// Table-wide figures.
    pub fn totals(&self) -> HeatTotals {
        self.drain();
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

/// The `n` hottest of `v`, hottest first (equal heat: by address). Only
/// the first `n` are sorted: the rest is partitioned off around the n-th
/// in linear time. The publisher asks for 64 of every chunk ever accessed
/// once per round; sorting all of them was 14 % of the instructions of a
/// 3-step 32 GiB Llama-2-13B run under libu3m.so (2.09 G of 14.67 G).
fn top_n<T: Copy + HasAddr>(mut v: Vec<(f64, T)>, n: usize) -> Vec<T> {
    let hotter = |a: &(f64, T), b: &(f64, T)| b.0.total_cmp(&a.0).then(a.1.addr().cmp(&b.1.addr()));
    if n == 0 {
        return Vec::new();
    }
    if n < v.len() {
        v.select_nth_unstable_by(n - 1, hotter);
        v.truncate(n);
    }
    v.sort_by(hotter);
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

    /// An address and the heat it was given (compared whole: two items
    /// equal in both are indistinguishable to a reader).
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Item(u64, u64, u64);
    impl HasAddr for Item {
        fn addr(&self) -> (u64, u64) {
            (self.0, self.1)
        }
    }

    /// The partial selection gives what sorting everything and keeping the
    /// first n gave (the code before it), for every n and with ties in heat
    /// and address, zeros, infinities and NaNs. Fails if the selection
    /// keeps a wrong element, or leaves the kept ones out of order.
    #[test]
    fn top_n_is_the_first_n_of_a_full_sort() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let heats = [
            0.0,
            -0.0,
            1.0,
            2.5,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for round in 0..300 {
            let len = (rnd() % 200) as usize;
            let v: Vec<(f64, Item)> = (0..len)
                .map(|_| {
                    let h = if round % 2 == 0 {
                        heats[(rnd() % heats.len() as u64) as usize]
                    } else {
                        (rnd() % 1000) as f64 / 7.0
                    };
                    (h, Item(rnd() % 64, rnd() % 4, h.to_bits()))
                })
                .collect();
            let mut full = v.clone();
            full.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.addr().cmp(&b.1.addr())));
            for n in [
                0,
                1,
                2,
                len / 2,
                len.saturating_sub(1),
                len,
                len + 5,
                usize::MAX,
            ] {
                let want: Vec<Item> = full.iter().take(n).map(|e| e.1).collect();
                assert_eq!(top_n(v.clone(), n), want, "round {round}, len {len}, n {n}");
            }
        }
    }
}
