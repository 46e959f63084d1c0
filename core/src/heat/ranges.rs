//! Tensor ranges: a fixed-capacity open-addressing table keyed by
//! `(start, len, owning allocation)`, inserted into and updated lock-free on
//! the hot path.
//!
//! Entry words:
//! - `tag = epoch:16 << 48 | owner index << 2 | state` (EMPTY, BUSY, LIVE);
//! - `start:48 | owner generation low 16 bits << 48`;
//! - `len:48 | owner generation high 16 bits << 48`;
//! - the statistics record, tagged with the entry's epoch.
//!
//! An entry whose owner is no longer live is stale: readers skip it and an
//! insertion may claim it (CAS on `tag`, bumping the epoch, which also closes
//! the old record), so freeing an allocation costs nothing here. Lookups
//! stop at the first EMPTY entry (entries never become EMPTY again) or after
//! [`PROBE`] entries; a key not found with no claimable entry in reach is
//! dropped and counted. Two first touches of the same range racing can
//! create two entries; readers merge them.

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicU64, Ordering::*};

use super::alloc_table::AllocTable;
use super::record::{Delta, Raw, Record, PAYLOAD};
use super::zeroed::{self, Zeroable};

/// Longest probe sequence.
pub const PROBE: usize = 32;

const EMPTY: u64 = 0;
const BUSY: u64 = 1;
const LIVE: u64 = 2;

#[repr(C)]
struct Entry {
    tag: AtomicU64,
    start: AtomicU64,
    len: AtomicU64,
    rec: Record,
}

// SAFETY: atomics only; zero = EMPTY in epoch 0.
unsafe impl Zeroable for Entry {}

pub(crate) enum RangeHit {
    Counted,
    /// The owner was freed meanwhile; nothing counted.
    Stale,
    /// No room within the probe window; nothing counted.
    Dropped,
}

pub(crate) struct RangeTable {
    entries: zeroed::ZSlice<Entry>,
    mask: usize,
}

#[inline]
fn hash(start: u64, len: u64, idx: u32) -> usize {
    let mut x = start ^ len.rotate_left(29) ^ (idx as u64).rotate_left(47);
    x ^= x >> 31;
    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    x as usize
}

#[inline]
fn owner_of(tag: u64) -> u32 {
    ((tag >> 2) & 0x3fff_ffff) as u32
}

/// One live range as read by a reader.
pub(crate) struct RangeRead {
    pub start: u64,
    pub len: u64,
    pub idx: u32,
    pub gen: u32,
    pub raw: Raw,
}

impl RangeTable {
    /// `cap` is rounded up to a power of two (at least PROBE).
    pub fn new(cap: usize) -> Option<RangeTable> {
        let n = cap.max(PROBE).checked_next_power_of_two()?;
        Some(RangeTable {
            entries: zeroed::slice(n)?,
            mask: n - 1,
        })
    }

    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// Hot: count one access of `[start, start+len)` inside allocation
    /// `(idx, gen)` (a part of a touch that resolved to that owner).
    #[inline]
    pub fn hit(
        &self,
        start: u64,
        len: u64,
        idx: u32,
        gen: u32,
        h: &Delta,
        allocs: &AllocTable,
    ) -> RangeHit {
        let ks = start & PAYLOAD | (gen as u64 & 0xffff) << 48;
        let kl = len.min(PAYLOAD) | (gen as u64 >> 16) << 48;
        let home = hash(start, len, idx);
        for _attempt in 0..2 {
            let mut claim: Option<(usize, u64)> = None;
            for i in 0..PROBE {
                let pos = home.wrapping_add(i) & self.mask;
                let e = &self.entries[pos];
                let t1 = e.tag.load(Acquire);
                match t1 & 3 {
                    EMPTY => {
                        claim.get_or_insert((pos, t1));
                        break;
                    }
                    LIVE => {
                        let s = e.start.load(Relaxed);
                        let l = e.len.load(Relaxed);
                        fence(Acquire);
                        if e.tag.load(Relaxed) != t1 {
                            continue;
                        }
                        if s == ks && l == kl && owner_of(t1) == idx {
                            return if e.rec.add(t1 >> 48, h) {
                                RangeHit::Counted
                            } else {
                                RangeHit::Stale
                            };
                        }
                        if claim.is_none() {
                            let og = (s >> 48 | (l >> 48) << 16) as u32;
                            if !allocs.is_live(owner_of(t1), og) {
                                claim = Some((pos, t1));
                            }
                        }
                    }
                    _ => {} // BUSY: being filled by another thread
                }
            }
            let Some((pos, t1)) = claim else {
                return RangeHit::Dropped;
            };
            let e = &self.entries[pos];
            let old = t1 >> 48;
            let epoch = (old + 1) & 0xffff;
            let base = epoch << 48 | (idx as u64 & 0x3fff_ffff) << 2;
            if e.tag
                .compare_exchange(t1, base | BUSY, Acquire, Relaxed)
                .is_err()
            {
                continue; // someone else took it: look again
            }
            // Seqlock writer: readers that see the new key see the BUSY tag.
            fence(Release);
            e.start.store(ks, Relaxed);
            e.len.store(kl, Relaxed);
            e.rec.swap_epoch(old, epoch);
            e.tag.store(base | LIVE, Release);
            return if e.rec.add(epoch, h) {
                RangeHit::Counted
            } else {
                RangeHit::Stale
            };
        }
        RangeHit::Dropped
    }

    /// Cold: every live range whose owner is live, duplicates merged.
    pub fn read_live(&self, allocs: &AllocTable) -> Vec<RangeRead> {
        let mut out: Vec<RangeRead> = Vec::new();
        let mut seen: HashMap<(u64, u64, u32, u32), usize> = HashMap::new();
        for e in self.entries.iter() {
            let t1 = e.tag.load(Acquire);
            if t1 & 3 != LIVE {
                continue;
            }
            let s = e.start.load(Relaxed);
            let l = e.len.load(Relaxed);
            fence(Acquire);
            if e.tag.load(Relaxed) != t1 {
                continue;
            }
            let (idx, gen) = (owner_of(t1), (s >> 48 | (l >> 48) << 16) as u32);
            if !allocs.is_live(idx, gen) {
                continue;
            }
            let raw = e.rec.read(t1 >> 48);
            let key = (s & PAYLOAD, l & PAYLOAD, idx, gen);
            match seen.get(&key) {
                Some(&i) => out[i].raw = out[i].raw.merge(&raw),
                None => {
                    seen.insert(key, out.len());
                    out.push(RangeRead {
                        start: key.0,
                        len: key.1,
                        idx,
                        gen,
                        raw,
                    });
                }
            }
        }
        out
    }

    /// Cold: entries in use (live owner) — for totals.
    pub fn count_live(&self, allocs: &AllocTable) -> usize {
        self.entries
            .iter()
            .filter(|e| {
                let t = e.tag.load(Acquire);
                if t & 3 != LIVE {
                    return false;
                }
                let (s, l) = (e.start.load(Relaxed), e.len.load(Relaxed));
                allocs.is_live(owner_of(t), (s >> 48 | (l >> 48) << 16) as u32)
            })
            .count()
    }
}
