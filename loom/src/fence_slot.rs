//! A model of the use fences' slots (core/src/residency/fence.rs): `open`
//! filling a free slot, the lock-free join of `join_slot`, and `settle`
//! taking the fence out of OPEN before it records, statement for statement,
//! with one slot and the fence list's lock as a loom Mutex. The runtime is
//! one counter: the calls launched on stream 1 (the runtime orders a launch
//! and a record on one stream by itself: an atomic here), which a record
//! reads. Keep in step with fence.rs. Two variants differ from the shipped
//! code on purpose: `NoOpenCheck` joins a slot whatever its OPEN bit, and
//! `Relaxed` makes the join's compare-and-swap and settle's clear Relaxed;
//! the tests show the checker finds what each would allow.
use loom::sync::atomic::{AtomicU64, Ordering::*};
use loom::sync::Mutex;

pub const OPEN: u64 = 1 << 63;
pub const GEN_ONE: u64 = 1 << 32;
pub const GEN_MASK: u64 = !OPEN & !(GEN_ONE - 1);
pub const CALLS_MASK: u64 = GEN_ONE - 1;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Variant {
    AsShipped,
    NoOpenCheck,
    Relaxed,
}

pub struct Fences {
    pub variant: Variant,
    /// The open fences (stream, event), under the list's lock.
    pub list: Mutex<Vec<(u64, u64)>>,
    pub stream: AtomicU64,
    pub event: AtomicU64,
    pub state: AtomicU64,
    /// Calls launched on stream 1.
    pub launched: AtomicU64,
}

impl Fences {
    pub fn new(variant: Variant) -> Fences {
        Fences {
            variant,
            list: Mutex::new(Vec::new()),
            stream: AtomicU64::new(0),
            event: AtomicU64::new(0),
            state: AtomicU64::new(0),
            launched: AtomicU64::new(0),
        }
    }

    /// `Fenced::open`: the slot if free, stream and event before the state.
    pub fn open(&self, stream: u64, ev: u64) {
        let mut l = self.list.lock().unwrap();
        if self.state.load(Relaxed) & OPEN == 0 {
            let gen = self.state.load(Relaxed).wrapping_add(GEN_ONE) & GEN_MASK;
            self.stream.store(stream, Release);
            self.event.store(ev, Release);
            self.state.store(OPEN | gen | 1, Release);
        }
        l.push((stream, ev));
    }

    /// `Fenced::join_slot`: the event joined, if any.
    pub fn join(&self, stream: u64) -> Option<u64> {
        let s = self.state.load(Acquire);
        let open = self.variant == Variant::NoOpenCheck || s & OPEN != 0;
        if !open || self.stream.load(Acquire) != stream {
            return None;
        }
        let ev = self.event.load(Acquire);
        if s & CALLS_MASK == CALLS_MASK {
            return None;
        }
        let (ok, fail) = match self.variant {
            Variant::Relaxed => (Relaxed, Relaxed),
            _ => (AcqRel, Relaxed),
        };
        self.state
            .compare_exchange(s, s + 1, ok, fail)
            .ok()
            .map(|_| ev)
    }

    /// `Fenced::settle` of `ev`: out of OPEN, then recorded; returns what
    /// the record found launched on its stream (None: `ev` was not open).
    pub fn settle(&self, ev: u64) -> Option<u64> {
        let mut l = self.list.lock().unwrap();
        let k = l.iter().position(|f| f.1 == ev)?;
        l.swap_remove(k);
        let order = match self.variant {
            Variant::Relaxed => Relaxed,
            _ => AcqRel,
        };
        self.state.fetch_and(!OPEN, order);
        Some(self.launched.load(Relaxed))
    }
}
