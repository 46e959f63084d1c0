//! The pool allocator against a simple model: exact first-fit-by-bucket
//! placement, no overlap, maximal coalescing within segments, stats.

use std::collections::BTreeMap;

use proptest::prelude::*;
use u3m_core::store::pool::{bucket_of, Pool, PoolError, SegmentId, ALIGN, BUCKETS};

const KIB: u64 = 1024;

#[test]
fn alloc_is_aligned_and_rounded() {
    let mut p = Pool::new();
    p.add_segment(0x1003, 4096).unwrap(); // shrinks inward to [0x1020, 0x2000)
    assert_eq!(p.segment(SegmentId(0)), Some((0x1020, 0x2000 - 0x1020)));
    let a = p.alloc(1).unwrap();
    let b = p.alloc(33).unwrap();
    let c = p.alloc(0).unwrap();
    assert_eq!((a, b, c), (0x1020, 0x1040, 0x1080));
    assert_eq!(p.block_len(b), Some(64));
    assert_eq!(p.stats().used, 32 + 64 + 32);
    assert_eq!(p.alloc(u64::MAX), None);
}

#[test]
fn free_coalesces_both_neighbours() {
    let mut p = Pool::new();
    p.add_segment(0, 1024).unwrap();
    let a = p.alloc(256).unwrap();
    let b = p.alloc(256).unwrap();
    let c = p.alloc(256).unwrap();
    p.free(a).unwrap();
    p.free(c).unwrap();
    assert_eq!(
        p.free_blocks().collect::<Vec<_>>(),
        vec![(0, 256), (512, 512)]
    );
    assert!((p.stats().fragmentation - (1.0 - 512.0 / 768.0)).abs() < 1e-12);
    p.free(b).unwrap();
    assert_eq!(p.free_blocks().collect::<Vec<_>>(), vec![(0, 1024)]);
    let s = p.stats();
    assert_eq!(
        (s.free_blocks, s.largest_free, s.fragmentation, s.allocs),
        (1, 1024, 0.0, 0)
    );
}

#[test]
fn adjacent_segments_never_merge() {
    let mut p = Pool::new();
    let s0 = p.add_segment(0, 1024).unwrap();
    let s1 = p.add_segment(1024, 1024).unwrap();
    assert_eq!(p.stats().largest_free, 1024);
    assert_eq!(p.alloc(1025), None, "no block spans the segment boundary");
    let a = p.alloc(1024).unwrap();
    assert_eq!(p.segment_of(a), Some(s0));
    let b = p.alloc(1024).unwrap();
    assert_eq!(p.segment_of(b), Some(s1));
    p.free(a).unwrap();
    p.free(b).unwrap();
    assert_eq!(p.free_blocks().count(), 2);
    assert_eq!(p.remove_segment(s0), Ok((0, 1024)));
    assert_eq!(p.stats().total, 1024);
}

#[test]
fn small_request_prefers_its_bucket_over_a_lower_large_block() {
    let mut p = Pool::new();
    p.add_segment(0, 2048 * KIB).unwrap();
    let big = p.alloc(512 * KIB).unwrap();
    let _b = p.alloc(32).unwrap();
    let c = p.alloc(64).unwrap();
    let _d = p.alloc(32).unwrap();
    p.free(big).unwrap();
    p.free(c).unwrap();
    // Free: [0, 512 KiB) in the top bucket and 64 bytes above it in the
    // smallest; plain address-order first fit would take offset 0.
    assert_eq!(p.alloc(32), Some(512 * KIB + 32));
    // Nothing left in the small bucket that fits 64: the next larger
    // non-empty bucket's lowest block.
    assert_eq!(p.alloc(64), Some(0));
}

#[test]
fn misuse_is_an_error() {
    let mut p = Pool::new();
    let s = p.add_segment(4096, 4096).unwrap();
    let a = p.alloc(100).unwrap();
    let b = p.alloc(100).unwrap();
    assert_eq!(p.free(a + 32), Err(PoolError::UnknownOffset(a + 32)));
    assert_eq!(p.free(1), Err(PoolError::UnknownOffset(1)));
    assert_eq!(p.remove_segment(s), Err(PoolError::SegmentInUse(s)));
    assert!(!p.can_remove_segment(s));
    p.free(b).unwrap();
    // b merged with the free tail: its offset is the start of a free block.
    assert_eq!(p.free(b), Err(PoolError::DoubleFree(b)));
    p.free(a).unwrap();
    // a's block merged into nothing before it: it heads the free block now.
    assert_eq!(p.free(a), Err(PoolError::DoubleFree(a)));
    assert_eq!(p.add_segment(8000, 100), Err(PoolError::Overlap));
    assert_eq!(p.add_segment(0, 4200), Err(PoolError::Overlap));
    assert_eq!(p.add_segment(100_001, 20), Err(PoolError::EmptySegment));
    assert!(p.add_segment(0, 4096).is_ok(), "touching below is fine");
    assert!(p.can_remove_segment(s));
    assert_eq!(p.remove_segment(s), Ok((4096, 4096)));
    assert_eq!(p.remove_segment(s), Err(PoolError::UnknownSegment(s)));
    assert_eq!(p.stats().segments, 1);
}

/// The model: segments and live blocks; free blocks are derived as the
/// maximal gaps, which is what a perfectly coalescing pool must hold.
#[derive(Default)]
struct Model {
    segs: BTreeMap<SegmentId, (u64, u64)>,
    live: BTreeMap<u64, (u64, SegmentId)>,
    next_base: u64,
}

impl Model {
    fn gaps(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for (&id, &(base, len)) in &self.segs {
            let mut cur = base;
            for (&o, &(l, _)) in self.live.range(base..base + len) {
                if o > cur {
                    out.push((cur, o - cur));
                }
                cur = o + l;
                let _ = id;
            }
            if base + len > cur {
                out.push((cur, base + len - cur));
            }
        }
        out.sort();
        out
    }

    /// Where the seed's policy must place a request of `need` bytes.
    fn expected(&self, need: u64) -> Option<u64> {
        let gaps = self.gaps();
        (bucket_of(need)..BUCKETS).find_map(|b| {
            gaps.iter()
                .filter(|&&(_, l)| bucket_of(l) == b && l >= need)
                .map(|&(o, _)| o)
                .min()
        })
    }

    fn seg_of(&self, off: u64) -> SegmentId {
        *self
            .segs
            .iter()
            .find(|(_, &(b, l))| off >= b && off < b + l)
            .unwrap()
            .0
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    Free(usize),
    FreeBogus(u64),
    AddSegment { len: u64, gap: u64, misalign: u64 },
    RemoveSegment(usize),
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..1100,
        1000u64..20_000,
        15_000u64..300_000,
        200_000u64..1_500_000,
        Just(2 << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => size().prop_map(Op::Alloc),
        5 => any::<usize>().prop_map(Op::Free),
        1 => any::<u64>().prop_map(Op::FreeBogus),
        1 => (prop_oneof![64u64..4096, 100_000u64..5_000_000], prop_oneof![Just(0u64), 1u64..10_000], 0u64..40)
            .prop_map(|(len, gap, misalign)| Op::AddSegment { len, gap, misalign }),
        1 => any::<usize>().prop_map(Op::RemoveSegment),
    ]
}

fn check(p: &Pool, m: &Model) -> Result<(), TestCaseError> {
    let gaps = m.gaps();
    prop_assert_eq!(p.free_blocks().collect::<Vec<_>>(), gaps.clone());
    let s = p.stats();
    let total: u64 = m.segs.values().map(|s| s.1).sum();
    let used: u64 = m.live.values().map(|l| l.0).sum();
    let largest = gaps.iter().map(|g| g.1).max().unwrap_or(0);
    prop_assert_eq!(s.segments, m.segs.len() as u64);
    prop_assert_eq!(s.total, total);
    prop_assert_eq!(s.used, used);
    prop_assert_eq!(s.free, total - used);
    prop_assert_eq!(s.allocs, m.live.len() as u64);
    prop_assert_eq!(s.free_blocks, gaps.len() as u64);
    prop_assert_eq!(s.largest_free, largest);
    let frag = if total == used {
        0.0
    } else {
        1.0 - largest as f64 / (total - used) as f64
    };
    prop_assert!((s.fragmentation - frag).abs() < 1e-12);
    // No overlap, each block inside its segment.
    let mut end = 0;
    for (&o, &(l, seg)) in &m.live {
        prop_assert!(o >= end, "overlap at {:#x}", o);
        let (b, sl) = m.segs[&seg];
        prop_assert!(o >= b && o + l <= b + sl);
        prop_assert_eq!(p.block_len(o), Some(l));
        end = o + l;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_model(ops in prop::collection::vec(op(), 1..250)) {
        let mut p = Pool::new();
        let mut m = Model::default();
        for op in ops {
            match op {
                Op::Alloc(len) => {
                    let need = len.max(1).div_ceil(ALIGN) * ALIGN;
                    let got = p.alloc(len);
                    prop_assert_eq!(got, m.expected(need), "alloc({})", len);
                    if let Some(o) = got {
                        prop_assert_eq!(o % ALIGN, 0);
                        let seg = m.seg_of(o);
                        prop_assert_eq!(p.segment_of(o), Some(seg));
                        m.live.insert(o, (need, seg));
                    }
                }
                Op::Free(i) => {
                    if m.live.is_empty() { continue; }
                    let o = *m.live.keys().nth(i % m.live.len()).unwrap();
                    let (l, _) = m.live.remove(&o).unwrap();
                    prop_assert_eq!(p.free(o), Ok(l));
                    prop_assert!(p.free(o).is_err(), "second free must fail");
                }
                Op::FreeBogus(o) => {
                    if m.live.contains_key(&o) { continue; }
                    prop_assert!(p.free(o).is_err());
                }
                Op::AddSegment { len, gap, misalign } => {
                    let base = m.next_base + gap + misalign;
                    let id = p.add_segment(base, len).unwrap();
                    let start = base.div_ceil(ALIGN) * ALIGN;
                    let end = (base + len) / ALIGN * ALIGN;
                    prop_assert_eq!(p.segment(id), Some((start, end - start)));
                    m.segs.insert(id, (start, end - start));
                    m.next_base = base + len;
                }
                Op::RemoveSegment(i) => {
                    if m.segs.is_empty() { continue; }
                    let id = *m.segs.keys().nth(i % m.segs.len()).unwrap();
                    let busy = m.live.values().any(|&(_, s)| s == id);
                    prop_assert_eq!(p.can_remove_segment(id), !busy);
                    let r = p.remove_segment(id);
                    if busy {
                        prop_assert_eq!(r, Err(PoolError::SegmentInUse(id)));
                    } else {
                        prop_assert_eq!(r, Ok(m.segs.remove(&id).unwrap()));
                    }
                }
            }
            check(&p, &m)?;
        }
    }
}

/// Figures for the report: `cargo test --release -p u3m-core --test store_pool
/// -- --ignored --nocapture`.
#[test]
#[ignore]
fn pool_timing() {
    use std::time::Instant;
    let mut p = Pool::new();
    for i in 0..64u64 {
        p.add_segment(i << 31, 1 << 30).unwrap();
    }
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Mixed sizes across all buckets; fill to 50k live blocks, then a
    // steady state of random free + alloc.
    let mut live: Vec<u64> = Vec::new();
    let (mut t_alloc, mut t_free, mut na, mut nf) = (0u128, 0u128, 0u64, 0u64);
    for i in 0..1_050_000u64 {
        if i >= 50_000 {
            let j = (next() as usize) % live.len();
            let o = live.swap_remove(j);
            let t = Instant::now();
            p.free(o).unwrap();
            t_free += t.elapsed().as_nanos();
            nf += 1;
        }
        let r = next();
        let len = match r % 4 {
            0 => r % 1024,
            1 => r % (16 << 10),
            2 => r % (256 << 10),
            _ => 2 << 20,
        };
        let t = Instant::now();
        let o = p.alloc(len);
        t_alloc += t.elapsed().as_nanos();
        na += 1;
        live.push(o.expect("64 GiB holds 50k blocks"));
    }
    let s = p.stats();
    println!(
        "pool: {} allocs {:.0} ns/op, {} frees {:.0} ns/op; live {} free_blocks {} fragmentation {:.3}",
        na,
        t_alloc as f64 / na as f64,
        nf,
        t_free as f64 / nf as f64,
        s.allocs,
        s.free_blocks,
        s.fragmentation
    );
}
