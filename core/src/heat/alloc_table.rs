//! The allocation table: a fixed array of slots, one per live allocation,
//! recycled through the quarantined [`IndexPool`](super::pool::IndexPool).
//!
//! A slot's `state` is `generation << 32 | LIVE`. Freeing bumps the
//! generation, so an `AllocId(index, generation)` names one allocation for
//! ever; the slot's statistics record is tagged with the same generation.
//! `base` and `len` are written only while the slot is dead, and read by the
//! hot path under a seqlock check of `state`.

use std::sync::atomic::{fence, AtomicU64, Ordering::*};

use super::record::Record;
use super::zeroed::{self, Zeroable};

pub(crate) const LIVE: u64 = 1;

#[repr(C, align(64))]
pub(crate) struct AllocSlot {
    pub state: AtomicU64,
    pub base: AtomicU64,
    pub len: AtomicU64,
    pub rec: Record,
    /// Cold: `dev | kind << 32 | pins << 40`.
    pub info: AtomicU64,
    /// Cold: bytes of a reservation currently mapped.
    pub mapped: AtomicU64,
}

// SAFETY: atomics only; zero = dead slot of generation 0 with an empty record.
unsafe impl Zeroable for AllocSlot {}

pub(crate) struct AllocTable {
    slots: zeroed::ZSlice<AllocSlot>,
}

impl AllocTable {
    pub fn new(n: usize) -> Option<AllocTable> {
        Some(AllocTable {
            slots: zeroed::slice(n)?,
        })
    }

    #[inline]
    pub fn slot(&self, idx: u32) -> Option<&AllocSlot> {
        self.slots.get(idx as usize)
    }

    /// Hot: the extent of allocation `(idx, gen)` if it is live, read
    /// consistently with its generation.
    #[inline]
    pub fn live_extent(&self, idx: u32, gen: u32) -> Option<(u64, u64)> {
        let s = self.slot(idx)?;
        let want = (gen as u64) << 32 | LIVE;
        if s.state.load(Acquire) != want {
            return None;
        }
        let base = s.base.load(Relaxed);
        let len = s.len.load(Relaxed);
        fence(Acquire);
        if s.state.load(Relaxed) != want {
            return None;
        }
        Some((base, len))
    }

    #[inline]
    pub fn is_live(&self, idx: u32, gen: u32) -> bool {
        self.slot(idx)
            .is_some_and(|s| s.state.load(Acquire) == (gen as u64) << 32 | LIVE)
    }
}

impl AllocSlot {
    /// Cold: current generation.
    pub fn gen(&self) -> u32 {
        (self.state.load(Relaxed) >> 32) as u32
    }

    /// Cold: make a dead slot live as a new allocation; returns its generation.
    pub fn open(&self, base: u64, len: u64, info: u64) -> u32 {
        let gen = self.gen();
        // Seqlock writer: the extent changes only while the slot is dead, and
        // this fence orders the earlier "dead" store before the new extent
        // for any hot reader that sees the new extent.
        fence(Release);
        self.base.store(base, Relaxed);
        self.len.store(len, Relaxed);
        self.info.store(info, Relaxed);
        self.mapped.store(0, Relaxed);
        self.state.store((gen as u64) << 32 | LIVE, Release);
        gen
    }

    /// Cold: mark dead under the next generation (the record is closed by
    /// the caller once the address map no longer points here).
    pub fn kill(&self) -> u32 {
        let gen = self.gen();
        self.state
            .store((gen.wrapping_add(1) as u64) << 32, Release);
        gen
    }
}
