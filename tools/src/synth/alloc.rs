//! A caching allocator in the manner of torch's (c10 CUDACachingAllocator):
//! the program's tensors are blocks carved out of a few large device
//! segments, so the trace's `A` events are segments and every operator range
//! is an interior pointer. Freed blocks go back to a pool, merge with free
//! neighbours and are handed out again best-fit; segments are never released
//! (torch releases them only on `empty_cache` or an out-of-memory retry).
//!
//! torch's constants: sizes round up to 512 B; requests up to 1 MiB come
//! from 2 MiB segments (the small pool), requests up to 10 MiB from 20 MiB
//! segments, larger ones get a segment of their own rounded up to 2 MiB (the
//! large pool); a block is split when the rest is at least 512 B (small pool)
//! or more than 1 MiB (large pool).

use std::collections::{BTreeMap, BTreeSet};

use super::Component;

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const LARGE_BUFFER: u64 = 20 << 20;
const ROUND_LARGE: u64 = 2 << 20;
/// First segment address (arbitrary, 2 MiB aligned, like a device VA).
pub const BASE: u64 = 0x1000_0000_0000;

/// A live tensor: its bytes as the program asked for them, at an interior
/// address of some segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    pub addr: u64,
    pub bytes: u64,
    pub comp: Component,
}

impl Tensor {
    pub fn range(&self) -> u3m_core::trace::Range {
        u3m_core::trace::Range::new(self.addr, self.bytes)
    }
    /// Bytes [off, off + len) of the tensor (a view).
    pub fn slice(&self, off: u64, len: u64) -> u3m_core::trace::Range {
        debug_assert!(
            off + len <= self.bytes,
            "slice {off}+{len} of {}",
            self.bytes
        );
        u3m_core::trace::Range::new(self.addr + off, len)
    }
}

#[derive(Clone, Copy, Debug)]
struct Block {
    size: u64,
    free: bool,
    /// Requested bytes of the tensor in it (0 when free).
    used: u64,
    comp: Component,
}

/// A new segment: the `A` event the allocator asks the caller to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub addr: u64,
    pub bytes: u64,
    pub comp: Component,
}

#[derive(Default)]
pub struct Caching {
    /// Every block by address (segments are contiguous runs of blocks).
    blocks: BTreeMap<u64, Block>,
    /// Segment start -> size.
    segments: BTreeMap<u64, u64>,
    /// Free blocks per pool, ordered (size, addr): best fit is the first ≥ size.
    free_small: BTreeSet<(u64, u64)>,
    free_large: BTreeSet<(u64, u64)>,
    next: u64,
    pub reserved: u64,
    pub live: [u64; Component::COUNT],
    pub peak: [u64; Component::COUNT],
    pub live_total: u64,
    pub peak_total: u64,
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

impl Caching {
    pub fn new() -> Caching {
        Caching {
            next: BASE,
            ..Caching::default()
        }
    }

    fn pool(&mut self, small: bool) -> &mut BTreeSet<(u64, u64)> {
        if small {
            &mut self.free_small
        } else {
            &mut self.free_large
        }
    }

    fn segment_of(&self, addr: u64) -> (u64, u64) {
        let (&s, &n) = self
            .segments
            .range(..=addr)
            .next_back()
            .expect("block inside a segment");
        (s, n)
    }

    /// Allocates a tensor of `bytes`; returns it and, when a segment had to
    /// be created, that segment.
    pub fn alloc(&mut self, bytes: u64, comp: Component) -> (Tensor, Option<Segment>) {
        let size = round_up(bytes.max(1), MIN_BLOCK);
        let small = size <= SMALL_SIZE;
        let mut seg = None;
        let found = self.pool(small).range((size, 0)..).next().copied();
        let (bsize, addr) = match found {
            Some(k) => {
                self.pool(small).remove(&k);
                k
            }
            None => {
                let n = if small {
                    SMALL_BUFFER
                } else if size < MIN_LARGE_ALLOC {
                    LARGE_BUFFER
                } else {
                    round_up(size, ROUND_LARGE)
                };
                let a = self.next;
                self.next += n;
                self.segments.insert(a, n);
                self.reserved += n;
                seg = Some(Segment {
                    addr: a,
                    bytes: n,
                    comp,
                });
                (n, a)
            }
        };
        let rest = bsize - size;
        let split = if small {
            rest >= MIN_BLOCK
        } else {
            rest > SMALL_SIZE
        };
        let used_size = if split {
            self.blocks.insert(
                addr + size,
                Block {
                    size: rest,
                    free: true,
                    used: 0,
                    comp,
                },
            );
            self.pool(small).insert((rest, addr + size));
            size
        } else {
            bsize
        };
        self.blocks.insert(
            addr,
            Block {
                size: used_size,
                free: false,
                used: bytes,
                comp,
            },
        );
        let c = comp as usize;
        self.live[c] += bytes;
        self.peak[c] = self.peak[c].max(self.live[c]);
        self.live_total += bytes;
        self.peak_total = self.peak_total.max(self.live_total);
        (Tensor { addr, bytes, comp }, seg)
    }

    /// Returns a tensor's block to its pool, merged with free neighbours in
    /// the same segment.
    pub fn free(&mut self, t: Tensor) {
        let b = *self.blocks.get(&t.addr).expect("free of a live tensor");
        assert!(
            !b.free && b.used == t.bytes,
            "double free or wrong tensor at {:#x}",
            t.addr
        );
        let c = b.comp as usize;
        self.live[c] -= b.used;
        self.live_total -= b.used;
        let (seg, seg_size) = self.segment_of(t.addr);
        let small = seg_size == SMALL_BUFFER;
        let (mut start, mut size) = (t.addr, b.size);
        // Previous neighbour (same segment).
        if start > seg {
            if let Some((&pa, &pb)) = self.blocks.range(..start).next_back() {
                if pb.free && pa >= seg {
                    self.pool(small).remove(&(pb.size, pa));
                    self.blocks.remove(&start);
                    start = pa;
                    size += pb.size;
                }
            }
        }
        let end = start + size;
        if end < seg + seg_size {
            if let Some(&nb) = self.blocks.get(&end) {
                if nb.free {
                    self.pool(small).remove(&(nb.size, end));
                    self.blocks.remove(&end);
                    size += nb.size;
                }
            }
        }
        self.blocks.insert(
            start,
            Block {
                size,
                free: true,
                used: 0,
                comp: b.comp,
            },
        );
        self.pool(small).insert((size, start));
    }

    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    /// Device bytes the segments take on the simulator when allocated by
    /// `aclrtMalloc` (as acl_replay does): round to 32 B plus 32 B of pad,
    /// then 2 MiB pages above 1 MiB, so a 20 MiB segment takes 22 MiB
    /// (docs/simulator.md). torch_npu allocates with aclrtMallocAlign32 (no pad).
    pub fn device_bytes(&self) -> u64 {
        self.segments
            .values()
            .map(|&n| {
                let padded = round_up(n, 32) + 32;
                round_up(
                    padded,
                    if padded > SMALL_SIZE {
                        ROUND_LARGE
                    } else {
                        4096
                    },
                )
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Component::Workspace as W;

    #[test]
    fn small_and_large_pools_and_reuse() {
        let mut c = Caching::new();
        let (a, s) = c.alloc(100, W);
        let s = s.unwrap();
        assert_eq!((s.addr, s.bytes, a.addr), (BASE, 2 << 20, BASE));
        let (b, s2) = c.alloc(1000, W);
        assert!(s2.is_none());
        assert_eq!(b.addr, BASE + 512, "100 B rounds to one 512 B block");
        // 3 MiB: a 20 MiB segment, split.
        let (l, s3) = c.alloc(3 << 20, W);
        assert_eq!(s3.unwrap().bytes, 20 << 20);
        let (l2, s4) = c.alloc(3 << 20, W);
        assert!(s4.is_none());
        assert_eq!(l2.addr, l.addr + (3 << 20));
        // 12 MiB fits the 14 MiB left of that segment (as in torch); 15 MiB + 1
        // does not: its own segment, rounded up to 2 MiB.
        let (big, s5) = c.alloc(12 << 20, W);
        assert!(s5.is_none());
        assert_eq!(big.addr, l.addr + (6 << 20));
        c.free(big);
        let (_, s5) = c.alloc((15 << 20) + 1, W);
        assert_eq!(s5.unwrap().bytes, 16 << 20);
        // Freed blocks merge and are reused best-fit.
        c.free(l);
        c.free(l2);
        let (l3, s6) = c.alloc(5 << 20, W);
        assert!(s6.is_none());
        assert_eq!(l3.addr, l.addr);
        c.free(a);
        let (a2, _) = c.alloc(200, W);
        assert_eq!(a2.addr, BASE);
        assert_eq!(c.segments(), 3);
        assert_eq!(c.reserved, (2 + 20 + 16) << 20);
    }
}
