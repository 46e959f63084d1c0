//! One statistics record (of an allocation, a 2 MiB chunk or a tensor range)
//! and the heat formula.
//!
//! Every word is `tag:16 | payload:48`, where the tag is the low 16 bits of
//! the record's current epoch (the owner's generation). An update names the
//! tag it expects and is a compare-and-swap that fails when the word carries
//! another tag, so a toucher that looked the record up before a free or a
//! re-use can never add to the next epoch. Starting a new epoch swaps every
//! word to `(new tag, 0)` and returns the old payloads: that is both the final
//! snapshot of the old epoch and the reset, in one atomic step per word.

#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
// loom/ compiles this file against the model checker's atomics (docs/reliability.md)
#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::opclass::{ClassMask, OpClass};

pub(crate) const TAG_SHIFT: u32 = 48;
pub(crate) const PAYLOAD: u64 = (1 << TAG_SHIFT) - 1;
/// Times are stored in ticks of 2^TICK_SHIFT ns (~1.05 ms): the heat window
/// is seconds long, and a hot record then rewrites its time word about once
/// a millisecond instead of at every access (the operator sequence number
/// orders accesses exactly). 48 bits of ticks last 9000 years.
pub const TICK_SHIFT: u32 = 20;
/// Operator-type bits in the `ops` word (after the 12 class bits).
pub const OP_BITS: u32 = 36;
/// Floor of the heat window, so a record touched once a microsecond ago does
/// not read as a million accesses per second.
pub const MIN_WINDOW_NS: u64 = 1_000_000_000;
const MIB: f64 = (1u64 << 20) as f64;

#[inline]
pub(crate) fn tag_of(epoch: u64) -> u64 {
    epoch & 0xffff
}

/// What one access writes into each record it reaches, computed once per touch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hit {
    pub seq: u64,
    /// Ticks + 1 (0 means "never").
    pub t: u64,
    /// seq + 1 for a write, 0 for a read.
    pub wseq: u64,
    /// Class bit | operator-type bit << 12.
    pub ops: u64,
}

impl Hit {
    #[inline]
    pub fn new(seq: u64, ns: u64, write: bool, class: OpClass, op_hash: u64) -> Hit {
        let seq = seq.min(PAYLOAD - 1);
        let opbit = ((op_hash >> 32) * OP_BITS as u64) >> 32;
        Hit {
            seq,
            t: ((ns >> TICK_SHIFT) + 1).min(PAYLOAD),
            wseq: if write { seq + 1 } else { 0 },
            ops: class.bit() as u64 | 1 << (12 + opbit),
        }
    }
}

/// Accesses of one record merged before they are counted: `n` hits, the
/// latest sequence number and time, the earliest time, the latest write,
/// the union of operator bits. Every field of a record is a sum, max, min
/// or union, so counting a merged delta leaves what counting its hits one
/// by one leaves, in any order.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Delta {
    pub n: u64,
    pub seq: u64,
    pub t: u64,
    pub t_first: u64,
    pub wseq: u64,
    pub ops: u64,
}

impl Delta {
    #[inline]
    pub fn of(h: &Hit, n: u64) -> Delta {
        Delta {
            n,
            seq: h.seq,
            t: h.t,
            t_first: h.t,
            wseq: h.wseq,
            ops: h.ops,
        }
    }

    /// Add the hits of another delta (what adding them one by one leaves).
    #[inline]
    pub fn merge_delta(&mut self, d: &Delta) {
        self.n = self.n.saturating_add(d.n);
        self.seq = self.seq.max(d.seq);
        self.t = self.t.max(d.t);
        self.t_first = self.t_first.min(d.t_first);
        self.wseq = self.wseq.max(d.wseq);
        self.ops |= d.ops;
    }

    /// Add one more hit.
    #[inline]
    pub fn merge(&mut self, h: &Hit) {
        self.n = self.n.saturating_add(1);
        self.seq = self.seq.max(h.seq);
        self.t = self.t.max(h.t);
        self.t_first = self.t_first.min(h.t);
        self.wseq = self.wseq.max(h.wseq);
        self.ops |= h.ops;
    }
}

/// Six tagged words; 48 bytes.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Record {
    count: AtomicU64,
    last_seq: AtomicU64,
    last_t: AtomicU64,
    first_t: AtomicU64,
    write_seq: AtomicU64,
    ops: AtomicU64,
}

/// Apply `f` to the payload if the word carries `tag`; false if it does not
/// (the record moved to another epoch: the caller is stale).
#[inline(always)]
fn update(w: &AtomicU64, tag: u64, f: impl Fn(u64) -> u64) -> bool {
    let mut cur = w.load(Relaxed);
    loop {
        if cur >> TAG_SHIFT != tag {
            return false;
        }
        let p = cur & PAYLOAD;
        let np = f(p);
        if np == p {
            return true;
        }
        match w.compare_exchange_weak(cur, tag << TAG_SHIFT | np, Relaxed, Relaxed) {
            Ok(_) => return true,
            Err(x) => cur = x,
        }
    }
}

impl Record {
    /// Count one access in epoch `tag`; false (and nothing counted) if the
    /// record is no longer in that epoch. Only the access count decides: once
    /// it is in, the other fields follow (or are dropped with the epoch).
    #[inline]
    pub fn hit(&self, epoch: u64, h: &Hit) -> bool {
        self.hit_n(epoch, h, 1)
    }

    /// `n` accesses at once (`n` >= 1), all described by `h`: what `n`
    /// calls of [`Record::hit`] leave, with one update of each word.
    #[inline]
    pub fn hit_n(&self, epoch: u64, h: &Hit, n: u64) -> bool {
        self.add(epoch, &Delta::of(h, n))
    }

    /// Count a [`Delta`] (accesses merged by a thread's buffer) in epoch
    /// `tag`: what the `d.n` hits it merges leave, with one update of each
    /// word; false (nothing counted) if the record left that epoch.
    #[inline]
    pub fn add(&self, epoch: u64, d: &Delta) -> bool {
        let tag = tag_of(epoch);
        let n = d.n;
        if !update(&self.count, tag, |p| p.saturating_add(n).min(PAYLOAD)) {
            return false;
        }
        update(&self.last_seq, tag, |p| p.max(d.seq));
        update(&self.last_t, tag, |p| p.max(d.t));
        update(&self.first_t, tag, |p| {
            if p == 0 || d.t_first < p {
                d.t_first
            } else {
                p
            }
        });
        if d.wseq != 0 {
            update(&self.write_seq, tag, |p| p.max(d.wseq));
        }
        update(&self.ops, tag, |p| p | d.ops);
        true
    }

    fn words(&self) -> [&AtomicU64; 6] {
        [
            &self.count,
            &self.last_seq,
            &self.last_t,
            &self.first_t,
            &self.write_seq,
            &self.ops,
        ]
    }

    /// End epoch `old` and start `new`: every word becomes `(tag(new), 0)`;
    /// returns what epoch `old` had accumulated (words already in another
    /// epoch contribute nothing).
    pub fn swap_epoch(&self, old: u64, new: u64) -> Raw {
        let (old, new) = (tag_of(old), tag_of(new));
        let mut v = [0u64; 6];
        for (w, out) in self.words().into_iter().zip(v.iter_mut()) {
            let prev = w.swap(new << TAG_SHIFT, Relaxed);
            if prev >> TAG_SHIFT == old {
                *out = prev & PAYLOAD;
            }
        }
        Raw(v)
    }

    /// Current values of epoch `epoch` (a racy but per-word exact read).
    pub fn read(&self, epoch: u64) -> Raw {
        let tag = tag_of(epoch);
        let mut v = [0u64; 6];
        for (w, out) in self.words().into_iter().zip(v.iter_mut()) {
            let x = w.load(Relaxed);
            if x >> TAG_SHIFT == tag {
                *out = x & PAYLOAD;
            }
        }
        Raw(v)
    }
}

/// Payloads of a record, in field order.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Raw(pub [u64; 6]);

impl Raw {
    /// Combine two partial records of the same thing (duplicate range entries).
    pub fn merge(&self, o: &Raw) -> Raw {
        let (a, b) = (self.0, o.0);
        let min_nz = |x: u64, y: u64| match (x, y) {
            (0, y) => y,
            (x, 0) => x,
            (x, y) => x.min(y),
        };
        Raw([
            (a[0] + b[0]).min(PAYLOAD),
            a[1].max(b[1]),
            a[2].max(b[2]),
            min_nz(a[3], b[3]),
            a[4].max(b[4]),
            a[5] | b[5],
        ])
    }

    /// Decode, converting ticks back to ns (rounded down to a tick).
    pub fn stats(&self) -> AccessStats {
        let [count, last_seq, last_t, first_t, wseq, ops] = self.0;
        let ns = |t: u64| if t == 0 { 0 } else { (t - 1) << TICK_SHIFT };
        let op_bits = ops >> 12;
        AccessStats {
            accesses: count,
            last_seq: if count == 0 { 0 } else { last_seq },
            last_ns: ns(last_t),
            first_ns: ns(first_t),
            last_write_seq: if wseq == 0 { None } else { Some(wseq - 1) },
            classes: ClassMask((ops & 0xfff) as u16),
            op_bits,
            refcount: op_bits.count_ones(),
        }
    }
}

/// Access statistics of one record (allocation, chunk or tensor range).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AccessStats {
    /// Number of accesses (touches that reached this record).
    pub accesses: u64,
    /// Operator sequence number of the latest access (0 if none).
    pub last_seq: u64,
    /// Time of the latest access, ns on the caller's monotonic clock,
    /// rounded down to a multiple of 2^TICK_SHIFT ns (0 if none).
    pub last_ns: u64,
    /// Time of the first access of this epoch (rounded down likewise): the
    /// start of the heat window.
    pub first_ns: u64,
    /// Sequence number of the latest write, if any.
    pub last_write_seq: Option<u64>,
    /// Operator classes that touched it.
    pub classes: ClassMask,
    /// The hashed operator-type bitmap ([`OP_BITS`] bits): bit
    /// `hash(op type) mod 36` is set for every type that touched it.
    pub op_bits: u64,
    /// Distinct operator types referencing it, as the popcount of `op_bits`:
    /// exact while types do not collide, a lower bound otherwise, at most 36.
    pub refcount: u32,
}

impl AccessStats {
    /// The seed's heat of a record of `bytes` bytes at time `now_ns`.
    pub fn heat(&self, bytes: u64, now_ns: u64) -> f64 {
        heat(self.accesses, self.refcount, bytes, self.first_ns, now_ns)
    }

    /// Linear-counting estimate of distinct operator types from the bitmap
    /// (corrects `refcount` for collisions; saturates when the map is full).
    pub fn refcount_estimate(&self) -> f64 {
        let m = OP_BITS as f64;
        let zero = m - self.refcount as f64;
        if zero <= 0.0 {
            return m * m.ln();
        }
        -m * (zero / m).ln()
    }
}

/// `heat = (accesses / window_s) * log2(1 + refcount) / size_MiB`, with
/// `window_s = max(now - first access, 1 s)` and `size_MiB = bytes / 2^20`.
/// Zero for a record never accessed or of no size.
pub fn heat(accesses: u64, refcount: u32, bytes: u64, first_ns: u64, now_ns: u64) -> f64 {
    if accesses == 0 || bytes == 0 {
        return 0.0;
    }
    let window_s = now_ns.saturating_sub(first_ns).max(MIN_WINDOW_NS) as f64 / 1e9;
    (accesses as f64 / window_s) * (1.0 + refcount as f64).log2() / (bytes as f64 / MIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(seq: u64, t: u64, write: bool) -> Hit {
        Hit::new(
            seq,
            t << TICK_SHIFT,
            write,
            OpClass::MatMul,
            0x1234_5678_9abc_def0,
        )
    }

    #[test]
    fn counts_only_in_its_epoch() {
        let r = Record::default();
        assert!(r.hit(0, &hit(5, 10, false)));
        assert!(r.hit(0, &hit(3, 20, true)));
        assert!(
            !r.hit(1, &hit(9, 30, false)),
            "wrong epoch must be rejected"
        );
        let s = r.read(0).stats();
        assert_eq!(s.accesses, 2);
        assert_eq!(s.last_seq, 5);
        assert_eq!(s.last_ns, 20 << TICK_SHIFT);
        assert_eq!(s.first_ns, 10 << TICK_SHIFT);
        assert_eq!(s.last_write_seq, Some(3));
        assert!(s.classes.contains(OpClass::MatMul));
        assert_eq!(s.refcount, 1);
        // Closing epoch 0 returns its totals and rejects further epoch-0 hits.
        let fin = r.swap_epoch(0, 1).stats();
        assert_eq!(fin.accesses, 2);
        assert!(!r.hit(0, &hit(6, 40, false)));
        assert_eq!(r.read(1).stats().accesses, 0);
        assert!(r.hit(1, &hit(7, 50, false)));
        assert_eq!(r.read(1).stats().accesses, 1);
        assert_eq!(r.read(0).stats().accesses, 0);
    }

    #[test]
    fn tags_wrap_at_16_bits() {
        let r = Record::default();
        r.swap_epoch(0, 0x1_0005);
        assert!(r.hit(0x1_0005, &hit(1, 1, false)));
        assert!(
            r.hit(5, &hit(2, 2, false)),
            "epochs equal mod 2^16 share a tag"
        );
        assert_eq!(r.read(5).stats().accesses, 2);
    }

    #[test]
    fn heat_formula_by_hand() {
        // 100 accesses over 10 s, 3 operator types, 4 MiB:
        // 10/s * log2(4) / 4 = 5.
        let h = heat(100, 3, 4 << 20, 1_000_000_000, 11_000_000_000);
        assert!((h - 5.0).abs() < 1e-12, "{h}");
        // The window never drops below one second: 8 accesses, 1 type, 1 MiB,
        // 0.25 s after the first access = 8 * 1 / 1.
        let h = heat(8, 1, 1 << 20, 0, 250_000_000);
        assert!((h - 8.0).abs() < 1e-12, "{h}");
        assert_eq!(heat(0, 5, 1 << 20, 0, 1), 0.0);
        assert_eq!(heat(5, 5, 0, 0, 1), 0.0);
    }

    #[test]
    fn refcount_estimate_corrects_collisions() {
        let mut s = AccessStats {
            refcount: 0,
            ..Default::default()
        };
        assert_eq!(s.refcount_estimate(), 0.0);
        s.refcount = 18;
        let e = s.refcount_estimate();
        assert!(e > 18.0 && e < 30.0, "{e}");
    }
}
