//! The seed's pool allocator (design.md §1) over an abstract offset space made
//! of segments added over time: DRAM slabs (offsets are host addresses) and
//! NVMe extents (offsets are file offsets) are both carved by it.
//!
//! - Sizes are rounded up to 32 bytes, and every block starts 32-aligned.
//! - Free blocks are indexed by size bucket (< 1 KiB, 1–16 KiB, 16–256 KiB,
//!   ≥ 256 KiB). A request searches its own bucket, then the larger ones, and
//!   inside a bucket takes the free block with the lowest address that fits
//!   (first fit). The block is split; the allocation takes its low end.
//! - A free merges the block with a free neighbour on either side *in the same
//!   segment*, so free blocks are always maximal (never two adjacent ones).
//! - fragmentation = 1 − largest_free / total_free (0 when nothing is free).
//!
//! Every operation is O(log n): blocks live in a BTreeMap by offset, and each
//! bucket is a treap keyed by offset and augmented with its subtree's largest
//! block, so "lowest address with len ≥ need" is one descent. Not a hot path:
//! callers hold a lock around it. Misuse (double free, unknown offset,
//! overlapping segments) is an `Err`, never a panic.

use std::collections::BTreeMap;
use std::fmt;

/// Alignment of every block, and granularity of sizes.
pub const ALIGN: u64 = 32;
/// Upper bounds (exclusive) of the first three size buckets; the fourth holds
/// everything from 256 KiB up.
pub const BUCKET_LIMITS: [u64; 3] = [1 << 10, 16 << 10, 256 << 10];
/// Number of size buckets.
pub const BUCKETS: usize = 4;

/// Bucket of a block or request of `len` bytes.
pub fn bucket_of(len: u64) -> usize {
    BUCKET_LIMITS
        .iter()
        .position(|&lim| len < lim)
        .unwrap_or(BUCKETS - 1)
}

/// Identifies a segment for `remove_segment`; never reused by one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolError {
    /// `free` of an offset that is not the start of a live block.
    UnknownOffset(u64),
    /// `free` of a block that is already free.
    DoubleFree(u64),
    /// A new segment overlaps an existing one.
    Overlap,
    /// A new segment holds no aligned 32-byte block.
    EmptySegment,
    /// No such segment.
    UnknownSegment(SegmentId),
    /// The segment still holds live allocations.
    SegmentInUse(SegmentId),
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::UnknownOffset(o) => write!(f, "free of unknown offset {o:#x}"),
            PoolError::DoubleFree(o) => write!(f, "double free of offset {o:#x}"),
            PoolError::Overlap => write!(f, "segment overlaps an existing segment"),
            PoolError::EmptySegment => write!(f, "segment holds no aligned block"),
            PoolError::UnknownSegment(s) => write!(f, "unknown segment {}", s.0),
            PoolError::SegmentInUse(s) => write!(f, "segment {} holds live allocations", s.0),
        }
    }
}

impl std::error::Error for PoolError {}

/// A snapshot of the pool's occupancy. Byte figures count rounded sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolStats {
    pub segments: u64,
    /// Bytes in all segments (after aligning their ends to 32 bytes).
    pub total: u64,
    pub used: u64,
    pub free: u64,
    pub largest_free: u64,
    /// Free blocks (maximal runs of free bytes within a segment).
    pub free_blocks: u64,
    /// 1 − largest_free / free; 0 when nothing is free.
    pub fragmentation: f64,
    /// Live allocations.
    pub allocs: u64,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    len: u64,
    seg: SegmentId,
    free: bool,
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    base: u64,
    len: u64,
    live: u64,
}

pub struct Pool {
    /// Every block, free or used, by offset; blocks tile each segment.
    blocks: BTreeMap<u64, Block>,
    /// Free blocks of each bucket, for the first-fit search.
    free_by_bucket: [fit::FitTree; BUCKETS],
    segments: BTreeMap<SegmentId, Segment>,
    /// Segment bases → id, for the overlap check.
    seg_by_base: BTreeMap<u64, SegmentId>,
    next_seg: u32,
    total: u64,
    used: u64,
    allocs: u64,
}

impl Default for Pool {
    fn default() -> Self {
        Pool::new()
    }
}

/// `x` rounded up to `ALIGN`; None on overflow.
pub fn align_up(x: u64) -> Option<u64> {
    x.checked_add(ALIGN - 1).map(|v| v & !(ALIGN - 1))
}

impl Pool {
    pub fn new() -> Pool {
        Pool {
            blocks: BTreeMap::new(),
            free_by_bucket: Default::default(),
            segments: BTreeMap::new(),
            seg_by_base: BTreeMap::new(),
            next_seg: 0,
            total: 0,
            used: 0,
            allocs: 0,
        }
    }

    /// Adds `[base, base + len)` to the pool, shrunk inward to 32-byte
    /// boundaries. Segments may touch but never overlap, and blocks never
    /// merge across a segment boundary (each segment is released on its own).
    pub fn add_segment(&mut self, base: u64, len: u64) -> Result<SegmentId, PoolError> {
        let start = align_up(base).ok_or(PoolError::EmptySegment)?;
        let end = base.checked_add(len).ok_or(PoolError::Overlap)? & !(ALIGN - 1);
        if end <= start {
            return Err(PoolError::EmptySegment);
        }
        if let Some((_, id)) = self.seg_by_base.range(..end).next_back() {
            let s = self.segments[id];
            if s.base + s.len > start {
                return Err(PoolError::Overlap);
            }
        }
        let id = SegmentId(self.next_seg);
        self.next_seg = self.next_seg.checked_add(1).ok_or(PoolError::Overlap)?;
        let len = end - start;
        self.segments.insert(
            id,
            Segment {
                base: start,
                len,
                live: 0,
            },
        );
        self.seg_by_base.insert(start, id);
        self.blocks.insert(
            start,
            Block {
                len,
                seg: id,
                free: true,
            },
        );
        self.free_by_bucket[bucket_of(len)].insert(start, len);
        self.total += len;
        Ok(id)
    }

    /// The aligned `(base, len)` of a segment.
    pub fn segment(&self, id: SegmentId) -> Option<(u64, u64)> {
        self.segments.get(&id).map(|s| (s.base, s.len))
    }

    /// Allocates `len` bytes (rounded up to 32; 0 counts as 32) and returns
    /// the block's offset, or None when no free block is large enough.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let need = align_up(len.max(1))?;
        let (off, blen, b) = (bucket_of(need)..BUCKETS).find_map(|b| {
            self.free_by_bucket[b]
                .first_fit(need)
                .map(|(o, l)| (o, l, b))
        })?;
        let blk = self.blocks.get_mut(&off)?;
        let seg = blk.seg;
        blk.len = need;
        blk.free = false;
        if blen > need {
            // The remainder keeps the block's place among the free blocks.
            let rest = blen - need;
            self.blocks.insert(
                off + need,
                Block {
                    len: rest,
                    seg,
                    free: true,
                },
            );
            self.rekey_free(off, blen, off + need, rest);
        } else {
            self.free_by_bucket[b].remove(off);
        }
        if let Some(s) = self.segments.get_mut(&seg) {
            s.live += 1;
        }
        self.used += need;
        self.allocs += 1;
        Some(off)
    }

    /// Size (rounded) of the live block at `off`.
    pub fn block_len(&self, off: u64) -> Option<u64> {
        self.blocks.get(&off).filter(|b| !b.free).map(|b| b.len)
    }

    /// The segment holding the live block at `off`.
    pub fn segment_of(&self, off: u64) -> Option<SegmentId> {
        self.blocks.get(&off).filter(|b| !b.free).map(|b| b.seg)
    }

    /// Frees the block at `off`, merging it with free neighbours in its
    /// segment. Returns the block's (rounded) size.
    pub fn free(&mut self, off: u64) -> Result<u64, PoolError> {
        let blk = match self.blocks.get(&off) {
            None => return Err(PoolError::UnknownOffset(off)),
            Some(b) if b.free => return Err(PoolError::DoubleFree(off)),
            Some(b) => *b,
        };
        let next = self
            .blocks
            .range(off + blk.len..)
            .next()
            .and_then(|(&o, n)| {
                (o == off + blk.len && n.free && n.seg == blk.seg).then_some((o, n.len))
            });
        let prev = self.blocks.range(..off).next_back().and_then(|(&o, p)| {
            (o + p.len == off && p.free && p.seg == blk.seg).then_some((o, p.len))
        });
        let nlen = next.map_or(0, |n| n.1);
        if let Some((noff, _)) = next {
            self.blocks.remove(&noff);
        }
        match (prev, next) {
            (Some((poff, plen)), _) => {
                if let Some((noff, nlen)) = next {
                    self.free_by_bucket[bucket_of(nlen)].remove(noff);
                }
                let len = plen + blk.len + nlen;
                self.blocks.remove(&off);
                if let Some(p) = self.blocks.get_mut(&poff) {
                    p.len = len;
                }
                self.rekey_free(poff, plen, poff, len);
            }
            (None, Some((noff, nlen))) => {
                let len = blk.len + nlen;
                self.blocks.insert(
                    off,
                    Block {
                        len,
                        seg: blk.seg,
                        free: true,
                    },
                );
                self.rekey_free(noff, nlen, off, len);
            }
            (None, None) => {
                self.blocks.insert(
                    off,
                    Block {
                        len: blk.len,
                        seg: blk.seg,
                        free: true,
                    },
                );
                self.free_by_bucket[bucket_of(blk.len)].insert(off, blk.len);
            }
        }
        if let Some(s) = self.segments.get_mut(&blk.seg) {
            s.live -= 1;
        }
        self.used -= blk.len;
        self.allocs -= 1;
        Ok(blk.len)
    }

    /// Moves a free block's index entry from (`old`, `old_len`) to (`new`,
    /// `new_len`). No other free block may lie between `old` and `new`, so
    /// within one bucket the entry keeps its place in the tree.
    fn rekey_free(&mut self, old: u64, old_len: u64, new: u64, new_len: u64) {
        let (bo, bn) = (bucket_of(old_len), bucket_of(new_len));
        if bo == bn && self.free_by_bucket[bo].replace(old, new, new_len) {
            return;
        }
        self.free_by_bucket[bo].remove(old);
        self.free_by_bucket[bn].insert(new, new_len);
    }

    /// True when the segment exists and holds no live allocation.
    pub fn can_remove_segment(&self, id: SegmentId) -> bool {
        self.segments.get(&id).is_some_and(|s| s.live == 0)
    }

    /// Segments that hold no live allocation, in id order.
    pub fn free_segments(&self) -> Vec<SegmentId> {
        self.segments
            .iter()
            .filter(|(_, s)| s.live == 0)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Removes an entirely free segment; returns its aligned `(base, len)`.
    pub fn remove_segment(&mut self, id: SegmentId) -> Result<(u64, u64), PoolError> {
        let s = *self
            .segments
            .get(&id)
            .ok_or(PoolError::UnknownSegment(id))?;
        if s.live != 0 {
            return Err(PoolError::SegmentInUse(id));
        }
        // With no live block, coalescing has left one free block spanning it.
        debug_assert!(self
            .blocks
            .get(&s.base)
            .is_some_and(|b| b.free && b.len == s.len));
        self.free_by_bucket[bucket_of(s.len)].remove(s.base);
        self.blocks.remove(&s.base);
        self.segments.remove(&id);
        self.seg_by_base.remove(&s.base);
        self.total -= s.len;
        Ok((s.base, s.len))
    }

    /// Free blocks as `(offset, len)`, by offset.
    pub fn free_blocks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.blocks
            .iter()
            .filter(|(_, b)| b.free)
            .map(|(&o, b)| (o, b.len))
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn stats(&self) -> PoolStats {
        let free = self.total - self.used;
        let largest_free = self
            .free_by_bucket
            .iter()
            .map(|t| t.max_len())
            .max()
            .unwrap_or(0);
        PoolStats {
            segments: self.segments.len() as u64,
            total: self.total,
            used: self.used,
            free,
            largest_free,
            free_blocks: self.free_by_bucket.iter().map(|t| t.len() as u64).sum(),
            fragmentation: if free == 0 {
                0.0
            } else {
                1.0 - largest_free as f64 / free as f64
            },
            allocs: self.allocs,
        }
    }
}

/// A treap of free blocks keyed by offset, each node also holding the largest
/// block in its subtree, so the lowest-offset block of at least `need` bytes
/// is found in one root-to-leaf descent.
mod fit {
    const NIL: u32 = u32::MAX;

    #[derive(Clone, Copy)]
    struct Node {
        key: u64,
        len: u64,
        max: u64,
        prio: u32,
        l: u32,
        r: u32,
    }

    pub struct FitTree {
        nodes: Vec<Node>,
        spare: Vec<u32>,
        root: u32,
        count: usize,
        rng: u32,
    }

    impl Default for FitTree {
        fn default() -> Self {
            FitTree {
                nodes: Vec::new(),
                spare: Vec::new(),
                root: NIL,
                count: 0,
                rng: 0x9e37_79b9,
            }
        }
    }

    impl FitTree {
        pub fn len(&self) -> usize {
            self.count
        }

        pub fn max_len(&self) -> u64 {
            self.max_of(self.root)
        }

        fn max_of(&self, t: u32) -> u64 {
            if t == NIL {
                0
            } else {
                self.nodes[t as usize].max
            }
        }

        fn fix(&mut self, t: u32) {
            let n = self.nodes[t as usize];
            self.nodes[t as usize].max = n.len.max(self.max_of(n.l)).max(self.max_of(n.r));
        }

        /// (keys < key, keys ≥ key)
        fn split(&mut self, t: u32, key: u64) -> (u32, u32) {
            if t == NIL {
                return (NIL, NIL);
            }
            let n = self.nodes[t as usize];
            if n.key < key {
                let (a, b) = self.split(n.r, key);
                self.nodes[t as usize].r = a;
                self.fix(t);
                (t, b)
            } else {
                let (a, b) = self.split(n.l, key);
                self.nodes[t as usize].l = b;
                self.fix(t);
                (a, t)
            }
        }

        /// Every key of `a` is below every key of `b`.
        fn merge(&mut self, a: u32, b: u32) -> u32 {
            if a == NIL {
                return b;
            }
            if b == NIL {
                return a;
            }
            if self.nodes[a as usize].prio > self.nodes[b as usize].prio {
                let r = self.nodes[a as usize].r;
                let m = self.merge(r, b);
                self.nodes[a as usize].r = m;
                self.fix(a);
                a
            } else {
                let l = self.nodes[b as usize].l;
                let m = self.merge(a, l);
                self.nodes[b as usize].l = m;
                self.fix(b);
                b
            }
        }

        fn next_prio(&mut self) -> u32 {
            // xorshift32: treap priorities need only be well spread.
            let mut x = self.rng;
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            self.rng = x;
            x
        }

        pub fn insert(&mut self, key: u64, len: u64) {
            let node = Node {
                key,
                len,
                max: len,
                prio: self.next_prio(),
                l: NIL,
                r: NIL,
            };
            let idx = match self.spare.pop() {
                Some(i) => {
                    self.nodes[i as usize] = node;
                    i
                }
                None => {
                    self.nodes.push(node);
                    (self.nodes.len() - 1) as u32
                }
            };
            self.root = self.insert_at(self.root, idx);
            self.count += 1;
        }

        /// Inserts node `idx` into subtree `t` in one descent: it goes where
        /// its priority puts it, splitting only the subtree it displaces.
        fn insert_at(&mut self, t: u32, idx: u32) -> u32 {
            if t == NIL {
                return idx;
            }
            let (key, prio) = (self.nodes[idx as usize].key, self.nodes[idx as usize].prio);
            let n = self.nodes[t as usize];
            if prio > n.prio {
                let (a, b) = self.split(t, key);
                self.nodes[idx as usize].l = a;
                self.nodes[idx as usize].r = b;
                self.fix(idx);
                return idx;
            }
            if key < n.key {
                let l = self.insert_at(n.l, idx);
                self.nodes[t as usize].l = l;
            } else {
                let r = self.insert_at(n.r, idx);
                self.nodes[t as usize].r = r;
            }
            self.fix(t);
            t
        }

        pub fn remove(&mut self, key: u64) -> Option<u64> {
            let (root, gone) = self.remove_at(self.root, key);
            self.root = root;
            let m = gone?;
            self.spare.push(m);
            self.count -= 1;
            Some(self.nodes[m as usize].len)
        }

        /// Removes `key` from subtree `t`: (new subtree, removed node).
        fn remove_at(&mut self, t: u32, key: u64) -> (u32, Option<u32>) {
            if t == NIL {
                return (NIL, None);
            }
            let n = self.nodes[t as usize];
            if key == n.key {
                return (self.merge(n.l, n.r), Some(t));
            }
            let gone = if key < n.key {
                let (l, g) = self.remove_at(n.l, key);
                self.nodes[t as usize].l = l;
                g
            } else {
                let (r, g) = self.remove_at(n.r, key);
                self.nodes[t as usize].r = r;
                g
            };
            if gone.is_some() {
                self.fix(t);
            }
            (t, gone)
        }

        /// Gives the node keyed `old` the key `new` and length `len`, in
        /// place: the caller guarantees no other key lies between the two.
        pub fn replace(&mut self, old: u64, new: u64, len: u64) -> bool {
            self.replace_in(self.root, old, new, len)
        }

        fn replace_in(&mut self, t: u32, old: u64, new: u64, len: u64) -> bool {
            if t == NIL {
                return false;
            }
            let n = self.nodes[t as usize];
            let found = if old < n.key {
                self.replace_in(n.l, old, new, len)
            } else if old > n.key {
                self.replace_in(n.r, old, new, len)
            } else {
                let m = &mut self.nodes[t as usize];
                m.key = new;
                m.len = len;
                true
            };
            if found {
                self.fix(t);
            }
            found
        }

        /// The lowest key whose block holds at least `need` bytes.
        pub fn first_fit(&self, need: u64) -> Option<(u64, u64)> {
            let mut t = self.root;
            if self.max_of(t) < need {
                return None;
            }
            loop {
                let n = self.nodes[t as usize];
                if self.max_of(n.l) >= need {
                    t = n.l;
                } else if n.len >= need {
                    return Some((n.key, n.len));
                } else {
                    t = n.r;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        assert_eq!(bucket_of(32), 0);
        assert_eq!(bucket_of(1023), 0);
        assert_eq!(bucket_of(1024), 1);
        assert_eq!(bucket_of(16 << 10), 2);
        assert_eq!(bucket_of((256 << 10) - 1), 2);
        assert_eq!(bucket_of(256 << 10), 3);
    }

    #[test]
    fn fit_tree_first_fit_is_lowest_address() {
        let mut t = fit::FitTree::default();
        for (k, l) in [(500, 10), (100, 5), (300, 50), (700, 50), (200, 20)] {
            t.insert(k, l);
        }
        assert_eq!(t.first_fit(20), Some((200, 20)));
        assert_eq!(t.first_fit(21), Some((300, 50)));
        assert_eq!(t.first_fit(51), None);
        assert_eq!(t.remove(300), Some(50));
        assert_eq!(t.first_fit(21), Some((700, 50)));
        assert_eq!(t.remove(300), None);
        assert_eq!(t.len(), 4);
        assert_eq!(t.max_len(), 50);
    }
}
