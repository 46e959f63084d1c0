//! A model of the stats segment's event ring: the slot protocol of
//! `StatsSegment::event_at` (core/src/shm/writer.rs) and `read_slot`
//! (core/src/shm/reader.rs), statement for statement, with the slot cut to
//! three data words and the ring to two slots. The real slots live in a
//! mmap'd `#[repr(C)]` segment whose layout is checked at compile time, where
//! loom's atomics cannot stand in; keep this file in step with those two
//! functions. Two variants differ from the shipped code on purpose:
//! `RelaxedCas` makes the lapping writer's compare-and-swap Relaxed (what
//! writer.rs did before this model found the inconsistent record it allows),
//! and `NoRecheck` drops the reader's second look at the stamp, to show that
//! the checker finds the torn read the seqlock exists to prevent. (Dropping
//! only the reader's acquire fence is not caught: loom does not let a relaxed
//! load see a value older than one an earlier load in the same thread saw
//! through another location's store, so that reordering is outside what it
//! explores.)
use loom::sync::atomic::{fence, AtomicU64, Ordering::*};

pub const CAP: usize = 2;

#[derive(Default)]
pub struct Slot {
    pub stamp: AtomicU64,
    pub time_ns: AtomicU64,
    pub addr: AtomicU64,
    pub text: AtomicU64,
}

pub struct Ring {
    pub variant: Variant,
    pub head: AtomicU64,
    pub dropped: AtomicU64,
    pub slots: [Slot; CAP],
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Variant {
    AsShipped,
    RelaxedCas,
    NoRecheck,
}

/// What a record of sequence `seq` holds (so a reader can tell a torn one).
pub fn payload(seq: u64) -> [u64; 3] {
    [1000 + seq, 0xA000 + 7 * seq, 0x5EED ^ seq]
}

#[derive(Debug, PartialEq, Eq)]
pub enum SlotRead {
    Ok([u64; 3]),
    Newer,
    Pending,
}

impl Ring {
    pub fn new(variant: Variant) -> Ring {
        Ring {
            variant,
            head: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            slots: Default::default(),
        }
    }

    fn cas_order(&self) -> loom::sync::atomic::Ordering {
        if self.variant == Variant::RelaxedCas {
            Relaxed
        } else {
            Acquire
        }
    }

    /// writer.rs, `event_at`.
    pub fn write(&self) {
        let seq = self.head.fetch_add(1, Relaxed);
        let slot = &self.slots[(seq as usize) & (CAP - 1)];
        let writing = 2 * seq + 1;
        let cur = slot.stamp.load(Relaxed);
        if cur & 1 == 1
            || cur >= writing
            || slot
                .stamp
                .compare_exchange(cur, writing, self.cas_order(), Relaxed)
                .is_err()
        {
            self.dropped.fetch_add(1, Relaxed);
            return;
        }
        fence(Release);
        let [t, a, x] = payload(seq);
        slot.time_ns.store(t, Relaxed);
        slot.addr.store(a, Relaxed);
        slot.text.store(x, Relaxed);
        slot.stamp.store(writing + 1, Release);
    }

    /// reader.rs, `read_slot`.
    pub fn read(&self, q: u64) -> SlotRead {
        let slot = &self.slots[(q as usize) & (CAP - 1)];
        let want = 2 * q + 2;
        let s1 = slot.stamp.load(Acquire);
        if s1 != want {
            return if s1 > want {
                SlotRead::Newer
            } else {
                SlotRead::Pending
            };
        }
        let t = slot.time_ns.load(Relaxed);
        let a = slot.addr.load(Relaxed);
        let x = slot.text.load(Relaxed);
        fence(Acquire);
        if self.variant != Variant::NoRecheck && slot.stamp.load(Relaxed) != s1 {
            return SlotRead::Newer;
        }
        SlotRead::Ok([t, a, x])
    }
}
