//! The address map: device VA -> owning allocation, lock-free to read.
//!
//! Three levels over the 48-bit VA space:
//! - `top`: one pointer per 1 GiB region (2^18 entries), installed on the
//!   cold path and never removed while the table lives;
//! - a region: 512 chunk slots of 2 MiB, each with an owner word, the
//!   chunk's statistics record (`rec`) and cold metadata;
//! - for a chunk shared by several allocations, a page table of 512 owner
//!   words (4 KiB pages); a page shared by several allocations points to a
//!   block of up to [`MULTI_OWNERS`] owner words.
//!
//! An owner word is `0` (nobody), `gen << 32 | idx << 2 | 0b01` (one
//! allocation), or `pointer | 0b10` (next level). Readers validate every
//! owner against the allocation table (generation and extent), so a stale
//! word can make an access unattributed, never attribute it to the wrong
//! allocation. Page tables and owner blocks are kept for the table's life
//! and reused, so a reader holding an old pointer never reads freed memory.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};

use super::alloc_table::AllocTable;
use super::zeroed::{self, Zeroable};

pub(crate) const REGION_SHIFT: u32 = 30;
pub(crate) const CHUNK_SHIFT: u32 = 21;
pub(crate) const PAGE_SHIFT: u32 = 12;
/// Size of the unit of chunk statistics (and of future residency).
pub const CHUNK: u64 = 1 << CHUNK_SHIFT;
pub(crate) const PAGE: u64 = 1 << PAGE_SHIFT;
/// Addresses at or above this are never attributed.
pub const VA_LIMIT: u64 = 1 << 48;
const TOP: usize = 1 << (48 - REGION_SHIFT);
const SLOTS: usize = 1 << (REGION_SHIFT - CHUNK_SHIFT);
pub(crate) const PAGES: usize = 1 << (CHUNK_SHIFT - PAGE_SHIFT);
/// Allocations that can overlap one 4 KiB page.
pub const MULTI_OWNERS: usize = 16;

const TAG: u64 = 0b11;
const T_ALLOC: u64 = 0b01;
const T_PTR: u64 = 0b10;
/// Largest allocation index an owner word can hold.
pub(crate) const MAX_IDX: u32 = (1 << 30) - 1;

#[inline]
pub(crate) fn owner_word(idx: u32, gen: u32) -> u64 {
    (gen as u64) << 32 | (idx as u64) << 2 | T_ALLOC
}

#[inline]
pub(crate) fn decode(w: u64) -> (u32, u32) {
    (((w >> 2) & MAX_IDX as u64) as u32, (w >> 32) as u32)
}

#[repr(C)]
pub(crate) struct ChunkSlot {
    pub owner: AtomicU64,
    /// 0, or `epoch << 32 | (record index + 1)` of the chunk's statistics.
    pub rec: AtomicU64,
    /// Cold: see [`Meta`].
    pub meta: AtomicU64,
    pages: AtomicPtr<PageTable>,
}

#[repr(C)]
pub(crate) struct Region {
    pub chunks: [ChunkSlot; SLOTS],
}

#[repr(C)]
pub(crate) struct PageTable {
    entries: [AtomicU64; PAGES],
    multi: [AtomicPtr<Multi>; PAGES],
}

#[repr(C)]
pub(crate) struct Multi {
    owners: [AtomicU64; MULTI_OWNERS],
}

// SAFETY: atomics and null atomic pointers only.
unsafe impl Zeroable for Region {}
unsafe impl Zeroable for PageTable {}
unsafe impl Zeroable for Multi {}
unsafe impl Zeroable for AtomicPtr<Region> {}

/// Cold metadata of a chunk slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    /// Bytes of the chunk inside live allocations.
    pub bytes: u32,
    /// Live allocations overlapping the chunk.
    pub owners: u32,
    pub mapped: bool,
    pub pins: u8,
    /// The chunk's page table holds its current owners page by page (kept
    /// while it has one owner too), so a change of one allocation rewrites
    /// only that allocation's pages (`AddrMap::set_owners_span`).
    pub pages: bool,
}

impl Meta {
    pub fn load(cs: &ChunkSlot) -> Meta {
        let v = cs.meta.load(Relaxed);
        Meta {
            bytes: v as u32,
            owners: ((v >> 32) & 0xffff) as u32,
            mapped: v >> 48 & 1 != 0,
            pins: (v >> 52 & 0xf) as u8,
            pages: v >> 56 & 1 != 0,
        }
    }
    pub fn store(self, cs: &ChunkSlot) {
        let v = self.bytes as u64
            | (self.owners.min(0xffff) as u64) << 32
            | (self.mapped as u64) << 48
            | ((self.pins & 0xf) as u64) << 52
            | (self.pages as u64) << 56;
        cs.meta.store(v, Relaxed);
    }
}

pub(crate) enum Resolved {
    /// `addr` lies in live allocation `(idx, gen)` spanning `[base, base+len)`.
    Found {
        idx: u32,
        gen: u32,
        base: u64,
        len: u64,
    },
    /// Nothing owns `addr`; nothing owns anything before this address either.
    Gap(u64),
}

pub(crate) struct AddrMap {
    top: zeroed::ZSlice<AtomicPtr<Region>>,
}

#[inline]
fn end_of(addr: u64, unit: u64) -> u64 {
    (addr | (unit - 1)) + 1
}

#[inline]
fn check(w: u64, addr: u64, end: u64, allocs: &AllocTable) -> Resolved {
    let (idx, gen) = decode(w);
    match allocs.live_extent(idx, gen) {
        Some((base, len)) if addr >= base && addr - base < len => Resolved::Found {
            idx,
            gen,
            base,
            len,
        },
        Some((base, _)) if addr < base => Resolved::Gap(base.min(end)),
        _ => Resolved::Gap(end),
    }
}

impl AddrMap {
    pub fn new() -> Option<AddrMap> {
        Some(AddrMap {
            top: zeroed::slice(TOP)?,
        })
    }

    #[inline]
    pub fn region(&self, addr: u64) -> Option<&Region> {
        let p = self.top.get((addr >> REGION_SHIFT) as usize)?.load(Acquire);
        // SAFETY: regions are installed once, fully initialised (zeroed), and
        // freed only when the map is dropped.
        unsafe { p.as_ref() }
    }

    #[inline]
    pub fn chunk(&self, addr: u64) -> Option<&ChunkSlot> {
        self.region(addr)
            .map(|r| &r.chunks[(addr >> CHUNK_SHIFT) as usize & (SLOTS - 1)])
    }

    /// Hot: who owns `addr`.
    #[inline]
    pub fn resolve(&self, addr: u64, allocs: &AllocTable) -> Resolved {
        if addr >= VA_LIMIT {
            return Resolved::Gap(u64::MAX);
        }
        let Some(cs) = self.chunk(addr) else {
            return Resolved::Gap(end_of(addr, 1 << REGION_SHIFT));
        };
        let chunk_end = end_of(addr, CHUNK);
        let w = cs.owner.load(Acquire);
        match w & TAG {
            T_ALLOC => check(w, addr, chunk_end, allocs),
            T_PTR => {
                // SAFETY: page tables live as long as the map.
                let pt = unsafe { &*((w & !TAG) as *const PageTable) };
                let page_end = end_of(addr, PAGE);
                let e = pt.entries[(addr >> PAGE_SHIFT) as usize & (PAGES - 1)].load(Acquire);
                match e & TAG {
                    T_ALLOC => check(e, addr, page_end, allocs),
                    T_PTR => {
                        // SAFETY: owner blocks live as long as the map.
                        let m = unsafe { &*((e & !TAG) as *const Multi) };
                        let mut next = page_end;
                        for o in &m.owners {
                            let ow = o.load(Acquire);
                            if ow & TAG != T_ALLOC {
                                continue;
                            }
                            match check(ow, addr, page_end, allocs) {
                                f @ Resolved::Found { .. } => return f,
                                Resolved::Gap(n) => next = next.min(n),
                            }
                        }
                        Resolved::Gap(next)
                    }
                    _ => Resolved::Gap(page_end),
                }
            }
            _ => Resolved::Gap(chunk_end),
        }
    }

    // ---- cold path (the caller holds the table's mutex) ----

    /// Install the region holding `addr`: Some(true) if it was installed now,
    /// Some(false) if it existed, None if out of range or out of memory.
    pub fn ensure_region(&self, addr: u64) -> Option<bool> {
        let slot = self.top.get((addr >> REGION_SHIFT) as usize)?;
        if !slot.load(Acquire).is_null() {
            return Some(false);
        }
        let b = zeroed::boxed::<Region>()?;
        slot.store(Box::into_raw(b), Release);
        Some(true)
    }

    /// Make sure `cs` has a page table, and the pages listed have owner
    /// blocks, so that a later `set_owners` cannot fail.
    pub fn reserve_pages(&self, cs: &ChunkSlot, multi_pages: &[usize]) -> bool {
        let mut pt = cs.pages.load(Acquire);
        if pt.is_null() {
            match zeroed::boxed::<PageTable>() {
                Some(b) => {
                    pt = Box::into_raw(b);
                    cs.pages.store(pt, Release);
                }
                None => return false,
            }
        }
        // SAFETY: just checked or installed; lives as long as the map.
        let pt = unsafe { &*pt };
        for &p in multi_pages {
            if pt.multi[p].load(Acquire).is_null() {
                match zeroed::boxed::<Multi>() {
                    Some(b) => pt.multi[p].store(Box::into_raw(b), Release),
                    None => return false,
                }
            }
        }
        true
    }

    /// Publish the owners of chunk slot `cs` (starting at `chunk_base`):
    /// `owners` are `(owner word, base, len)` of every live allocation
    /// overlapping the chunk, in address order. With two or more, the page
    /// level is rewritten page by page so that no owner that stays is ever
    /// missing from a published entry. The caller reserved the memory
    /// (`reserve_pages`) and checked `MULTI_OWNERS`.
    /// Returns whether the page table now holds the owners (two or more).
    pub fn set_owners(&self, cs: &ChunkSlot, chunk_base: u64, owners: &[(u64, u64, u64)]) -> bool {
        match owners {
            [] => {
                cs.owner.store(0, Release);
                false
            }
            [(w, _, _)] => {
                cs.owner.store(*w, Release);
                false
            }
            _ => {
                let pt_ptr = cs.pages.load(Acquire);
                // SAFETY: reserved by the caller; lives as long as the map.
                let Some(pt) = (unsafe { pt_ptr.as_ref() }) else {
                    return false;
                };
                write_pages(pt, chunk_base, owners, 0, PAGES);
                cs.owner.store(pt_ptr as u64 | T_PTR, Release);
                true
            }
        }
    }

    /// [`set_owners`](Self::set_owners) after a change of owners on pages
    /// `[p0, p1)` only, for a chunk whose page table holds its owners on
    /// every other page (`Meta::pages`): rewrites those pages (`owners`:
    /// every live allocation overlapping them, in address order), then
    /// publishes the page table (`total` owners >= 2) or `single`, the
    /// chunk's one owner word (0: none). false if there is no page table.
    pub fn set_owners_span(
        &self,
        cs: &ChunkSlot,
        chunk_base: u64,
        owners: &[(u64, u64, u64)],
        (p0, p1): (usize, usize),
        total: u32,
        single: u64,
    ) -> bool {
        let pt_ptr = cs.pages.load(Acquire);
        // SAFETY: reserved by the caller; lives as long as the map.
        let Some(pt) = (unsafe { pt_ptr.as_ref() }) else {
            return false;
        };
        write_pages(pt, chunk_base, owners, p0, p1.min(PAGES));
        if total >= 2 {
            cs.owner.store(pt_ptr as u64 | T_PTR, Release);
        } else {
            cs.owner.store(single, Release);
        }
        true
    }

    /// Installed regions' slots, for readers and for drop.
    pub fn regions<'a>(
        &'a self,
        indices: &'a [usize],
    ) -> impl Iterator<Item = (u64, &'a Region)> + 'a {
        indices.iter().filter_map(move |&i| {
            // SAFETY: as in `region`.
            unsafe { self.top[i].load(Acquire).as_ref() }.map(|r| ((i as u64) << REGION_SHIFT, r))
        })
    }

    /// Free every region, page table and owner block. Only from Drop.
    fn release_all(&mut self) {
        for slot in self.top.iter() {
            let r = slot.swap(ptr::null_mut(), AcqRel);
            if r.is_null() {
                continue;
            }
            // SAFETY: created by Box::into_raw in ensure_region; no reader
            // remains (we have &mut self).
            let r = unsafe { Box::from_raw(r) };
            for cs in r.chunks.iter() {
                let pt = cs.pages.swap(ptr::null_mut(), AcqRel);
                if pt.is_null() {
                    continue;
                }
                // SAFETY: created by Box::into_raw in reserve_pages.
                let pt = unsafe { Box::from_raw(pt) };
                for m in pt.multi.iter() {
                    let m = m.swap(ptr::null_mut(), AcqRel);
                    if !m.is_null() {
                        // SAFETY: created by Box::into_raw in reserve_pages.
                        drop(unsafe { Box::from_raw(m) });
                    }
                }
            }
        }
    }
}

impl Drop for AddrMap {
    fn drop(&mut self) {
        self.release_all();
    }
}

/// Set page `p` to exactly the owners in `list` (at most MULTI_OWNERS).
/// Pages `[from, to)` of `pt` (the chunk at `chunk_base`) rewritten for
/// `owners` (every live allocation overlapping them, in address order), in
/// ascending order; a run of pages with the same owner set (it only changes
/// where an owner starts or ends) is computed once: with 0 or 1 owner the
/// run is plain stores.
fn write_pages(
    pt: &PageTable,
    chunk_base: u64,
    owners: &[(u64, u64, u64)],
    from: usize,
    to: usize,
) {
    let page_of = |a: u64| ((a - chunk_base) >> PAGE_SHIFT) as usize;
    let mut list = [0u64; MULTI_OWNERS];
    let mut k = 0; // first owner that can overlap page p
    let mut p = from;
    while p < to {
        let (ps, pe) = (
            chunk_base + (p as u64) * PAGE,
            chunk_base + (p as u64 + 1) * PAGE,
        );
        while k < owners.len() && owners[k].1 + owners[k].2 <= ps {
            k += 1;
        }
        let mut n = 0;
        let mut run_end = to;
        for &(w, b, l) in &owners[k..] {
            if b >= pe {
                // the next owner's first page starts a new run
                run_end = run_end.min(page_of(b));
                break;
            }
            if b + l > ps {
                if n < MULTI_OWNERS {
                    list[n] = w;
                    n += 1;
                }
                // the page after this owner's last one starts a new run
                run_end = run_end.min(page_of((b + l - 1).min(chunk_base + CHUNK - 1)) + 1);
            }
        }
        let run_end = run_end.max(p + 1);
        if n <= 1 {
            let w = if n == 1 { list[0] } else { 0 };
            for e in &pt.entries[p..run_end] {
                e.store(w, Release);
            }
            p = run_end;
        } else {
            write_page(pt, p, &list[..n]);
            p += 1;
        }
    }
}

fn write_page(pt: &PageTable, p: usize, list: &[u64]) {
    let entry = &pt.entries[p];
    match list {
        [] => entry.store(0, Release),
        [w] => entry.store(*w, Release),
        _ => {
            let mp = pt.multi[p].load(Acquire);
            // SAFETY: reserved by the caller; lives as long as the map.
            let Some(m) = (unsafe { mp.as_ref() }) else {
                return;
            };
            let published = entry.load(Relaxed) == mp as u64 | T_PTR;
            if published {
                // Readers are scanning this block: keep staying owners in
                // place, clear leavers, then fill holes with newcomers.
                for o in &m.owners {
                    let w = o.load(Relaxed);
                    if w != 0 && !list.contains(&w) {
                        o.store(0, Release);
                    }
                }
                for &w in list {
                    if m.owners.iter().any(|o| o.load(Relaxed) == w) {
                        continue;
                    }
                    if let Some(o) = m.owners.iter().find(|o| o.load(Relaxed) == 0) {
                        o.store(w, Release);
                    }
                }
            } else {
                for (i, o) in m.owners.iter().enumerate() {
                    o.store(list.get(i).copied().unwrap_or(0), Relaxed);
                }
                entry.store(mp as u64 | T_PTR, Release);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `set_owners` by definition, one page at a time (the run-based
    /// rewrite must leave every page exactly as this does).
    fn set_owners_ref(pt: &PageTable, chunk_base: u64, owners: &[(u64, u64, u64)]) {
        let mut list: Vec<u64> = Vec::with_capacity(MULTI_OWNERS);
        let mut k = 0;
        for p in 0..PAGES {
            let (ps, pe) = (
                chunk_base + (p as u64) * PAGE,
                chunk_base + (p as u64 + 1) * PAGE,
            );
            while k < owners.len() && owners[k].1 + owners[k].2 <= ps {
                k += 1;
            }
            list.clear();
            for &(w, b, l) in &owners[k..] {
                if b >= pe {
                    break;
                }
                if b + l > ps {
                    list.push(w);
                }
            }
            write_page(pt, p, &list);
        }
    }

    fn snapshot(pt: &PageTable) -> Vec<(u64, Vec<u64>)> {
        (0..PAGES)
            .map(|p| {
                let e = pt.entries[p].load(Relaxed);
                let m = pt.multi[p].load(Relaxed);
                let mv = if m.is_null() {
                    vec![]
                } else {
                    unsafe { &*m }
                        .owners
                        .iter()
                        .map(|o| o.load(Relaxed))
                        .collect()
                };
                (if e & TAG == T_PTR { 1 } else { e }, mv)
            })
            .collect()
    }

    #[test]
    fn run_based_rewrite_equals_page_by_page() {
        // random owner sets (some crossing the chunk's ends, boundaries
        // aligned or not, pages shared by several) over junk page contents
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let cb: u64 = 0x1000_0000_0000;
        for round in 0..500 {
            let map_a = AddrMap::new().unwrap();
            let map_b = AddrMap::new().unwrap();
            map_a.ensure_region(cb).unwrap();
            map_b.ensure_region(cb).unwrap();
            let (ca, cbs) = (map_a.chunk(cb).unwrap(), map_b.chunk(cb).unwrap());
            let all: Vec<usize> = (0..PAGES).collect();
            assert!(map_a.reserve_pages(ca, &all) && map_b.reserve_pages(cbs, &all));
            let mut owners = vec![];
            let mut a = cb - if rnd(2) == 0 { rnd(3 * PAGE) } else { 0 };
            let mut id = 1u64;
            while a < cb + CHUNK {
                a += match rnd(4) {
                    0 => 0,
                    1 => rnd(512) * 8,
                    2 => rnd(8) * PAGE,
                    _ => rnd(64) * PAGE + rnd(PAGE),
                };
                let len = match rnd(4) {
                    0 => 256 + rnd(1024),
                    1 => rnd(4) * PAGE + 256,
                    2 => rnd(100) * PAGE + rnd(PAGE) + 1,
                    _ => rnd(2 * CHUNK) + 1,
                };
                if a >= cb + CHUNK {
                    break;
                }
                owners.push((id << 32 | 1, a, len));
                id += 1;
                a += len;
            }
            // sizes >= 256: a page never holds more than MULTI_OWNERS
            for p in 0..PAGES {
                let j = if rnd(3) == 0 {
                    (rnd(50) + 1) << 32 | 1
                } else {
                    0
                };
                unsafe { &*ca.pages.load(Relaxed) }.entries[p].store(j, Relaxed);
                unsafe { &*cbs.pages.load(Relaxed) }.entries[p].store(j, Relaxed);
            }
            let pa = unsafe { &*ca.pages.load(Relaxed) };
            let pb = unsafe { &*cbs.pages.load(Relaxed) };
            let inchunk: Vec<_> = owners
                .iter()
                .copied()
                .filter(|&(_, b, l)| b < cb + CHUNK && b + l > cb)
                .collect();
            set_owners_ref(pa, cb, &inchunk);
            if inchunk.len() >= 2 {
                map_b.set_owners(cbs, cb, &inchunk);
            } else {
                set_owners_ref(pb, cb, &inchunk);
            }
            assert_eq!(snapshot(pa), snapshot(pb), "round {round}: {inchunk:x?}");
        }
    }
}
