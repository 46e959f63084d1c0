//! Heat table: what a touch is attributed to, and the statistics that follow.

use u3m_core::heat::*;
use u3m_core::opclass::{op_hash, OpClass};

const MIB: u64 = 1 << 20;
const CH: u64 = 2 * MIB;
/// A device-looking base, 1 GiB aligned.
const B: u64 = 0x1000_0000_0000;
const SEC: u64 = 1_000_000_000;

fn acc(seq: u64, ns: u64, op: &str, write: bool) -> Access {
    Access {
        seq,
        ns,
        class: OpClass::of(op),
        op_hash: op_hash(op),
        write,
    }
}

fn rd(seq: u64) -> Access {
    acc(seq, seq * 1000, "MatMul", false)
}

#[test]
fn interior_pointers_resolve_to_the_allocation() {
    let t = HeatTable::new(16, 1024);
    let a = t
        .on_alloc(0, B + 3 * CH, 5 * CH + 100, AllocKind::Malloc)
        .unwrap();
    for off in [0, 1, CH - 1, CH, 4 * CH + 99, 5 * CH + 99] {
        assert_eq!(
            t.lookup(B + 3 * CH + off),
            Some((a, B + 3 * CH, 5 * CH + 100)),
            "offset {off}"
        );
    }
    assert_eq!(t.lookup(B + 3 * CH - 1), None);
    assert_eq!(t.lookup(B + 8 * CH + 100), None);
    // A tensor carved out of the middle counts for the allocation, its own
    // range and exactly the chunks it covers.
    let r = t.touch(B + 4 * CH + 10, CH, &rd(1));
    assert_eq!(
        r,
        TouchResult {
            alloc: Some(a),
            chunks: 2,
            unattributed_bytes: 0
        }
    );
    assert_eq!(t.chunk_info(B + 4 * CH).unwrap().stats.accesses, 1);
    assert_eq!(t.chunk_info(B + 5 * CH).unwrap().stats.accesses, 1);
    assert_eq!(t.chunk_info(B + 3 * CH).unwrap().stats.accesses, 0);
    assert_eq!(t.chunk_info(B + 6 * CH).unwrap().stats.accesses, 0);
    assert_eq!(t.alloc_info(a).unwrap().stats.accesses, 1);
    let ranges = t.hottest_ranges(10, 0);
    assert_eq!(ranges.len(), 1);
    assert_eq!(
        (ranges[0].start, ranges[0].len, ranges[0].alloc),
        (B + 4 * CH + 10, CH, a)
    );
}

#[test]
fn a_range_spanning_allocations_is_split_between_owners() {
    let t = HeatTable::new(16, 1024);
    let a = t.on_alloc(0, B, CH + 4096, AllocKind::Malloc).unwrap();
    // A gap of 4 KiB, then b, then nothing.
    let b = t
        .on_alloc(0, B + CH + 8192, 4096, AllocKind::Malloc)
        .unwrap();
    let r = t.touch(
        B + CH - 100,
        100 + 4096 + 4096 + 4096 + 50,
        &acc(7, SEC, "Add", true),
    );
    assert_eq!(r.alloc, Some(a));
    assert_eq!(r.unattributed_bytes, 4096 + 50);
    // a's part covers chunks 0 and 1; b's part chunk 1 again.
    assert_eq!(r.chunks, 3);
    let ia = t.alloc_info(a).unwrap();
    let ib = t.alloc_info(b).unwrap();
    assert_eq!((ia.stats.accesses, ib.stats.accesses), (1, 1));
    assert_eq!(ib.stats.last_write_seq, Some(7));
    let c1 = t.chunk_info(B + CH).unwrap();
    assert_eq!((c1.owners, c1.bytes, c1.stats.accesses), (2, 8192, 2));
    let mut rs: Vec<(u64, u64, AllocId)> = t
        .hottest_ranges(10, 0)
        .iter()
        .map(|r| (r.start, r.len, r.alloc))
        .collect();
    rs.sort();
    assert_eq!(
        rs,
        vec![(B + CH - 100, 100 + 4096, a), (B + CH + 8192, 4096, b)]
    );
    let tot = t.totals();
    assert_eq!(
        (
            tot.touches,
            tot.unattributed_touches,
            tot.unattributed_bytes
        ),
        (1, 1, 4096 + 50)
    );
}

#[test]
fn small_allocations_share_a_chunk_but_not_their_counts() {
    let t = HeatTable::new(64, 1024);
    let ids: Vec<AllocId> = (0..8)
        .map(|i| {
            t.on_alloc(0, B + i * 8192 + 512, 1000, AllocKind::Malloc)
                .unwrap()
        })
        .collect();
    for (i, id) in ids.iter().enumerate() {
        for k in 0..=i as u64 {
            let r = t.touch(B + i as u64 * 8192 + 600, 10, &rd(k));
            assert_eq!(r.alloc, Some(*id));
            assert_eq!(r.chunks, 1);
        }
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(t.alloc_info(*id).unwrap().stats.accesses, i as u64 + 1);
    }
    let c = t.chunk_info(B).unwrap();
    assert_eq!(
        (c.owners, c.bytes, c.stats.accesses, c.alloc),
        (8, 8000, 36, None)
    );
    // Free one in the middle: the chunk keeps its history, the neighbour
    // keeps its own counts, the freed range stops resolving.
    let fin = t.on_free(B + 3 * 8192 + 512).unwrap();
    assert_eq!(fin.stats.accesses, 4);
    assert_eq!(t.lookup(B + 3 * 8192 + 600), None);
    assert_eq!(
        t.touch(B + 3 * 8192 + 600, 10, &rd(99)).unattributed_bytes,
        10
    );
    assert_eq!(t.alloc_info(ids[3]), None);
    assert_eq!(t.alloc_info(ids[4]).unwrap().stats.accesses, 5);
    let c = t.chunk_info(B).unwrap();
    assert_eq!((c.owners, c.bytes, c.stats.accesses), (7, 7000, 36));
    // Free the rest: the chunk's occupancy ends and its record closes.
    for i in (0..8).filter(|&i| i != 3) {
        t.on_free(B + i * 8192 + 512).unwrap();
    }
    assert!(t.chunk_info(B).is_none());
    let n = t.on_alloc(0, B + 512, 1000, AllocKind::Malloc).unwrap();
    assert_ne!(
        n, ids[0],
        "a new allocation at the same address is a new id"
    );
    let c = t.chunk_info(B).unwrap();
    assert_eq!(c.stats.accesses, 0, "a new occupancy starts from zero");
    assert_eq!(t.alloc_info(n).unwrap().stats.accesses, 0);
}

#[test]
fn reservation_with_mapped_sub_ranges() {
    let t = HeatTable::new(16, 1024);
    let r = t.on_alloc(1, B, 8 * CH, AllocKind::Reserved).unwrap();
    let tot = t.totals();
    assert_eq!(
        (tot.reserved_bytes, tot.mapped_bytes, tot.device_bytes),
        (8 * CH, 0, 0)
    );
    assert!(t.on_map(B + 2 * CH, 2 * CH));
    assert!(t.on_map(B + 6 * CH, CH));
    assert!(!t.on_map(B + 100 * CH, CH), "outside any reservation");
    assert_eq!(t.totals().mapped_bytes, 3 * CH);
    assert_eq!(t.alloc_info(r).unwrap().mapped_bytes, 3 * CH);
    assert!(t.chunk_info(B + 2 * CH).unwrap().mapped);
    assert!(!t.chunk_info(B + 4 * CH).unwrap().mapped);
    // Tensors carved from the segment: attributed to the reservation; mapped
    // chunks keep chunk statistics, unmapped ones have none.
    let res = t.touch(B + 2 * CH + 4096, 3 * CH, &rd(1));
    assert_eq!(
        res,
        TouchResult {
            alloc: Some(r),
            chunks: 2,
            unattributed_bytes: 0
        }
    );
    assert!(!t.chunk_info(B + 4 * CH).unwrap().tracked);
    // Unmap keeps the chunk's history (eviction must not forget heat).
    assert!(t.on_unmap(B + 2 * CH, CH));
    let c = t.chunk_info(B + 2 * CH).unwrap();
    assert!(!c.mapped && c.tracked);
    assert_eq!(c.stats.accesses, 1);
    assert_eq!(t.totals().mapped_bytes, 2 * CH);
    t.on_map(B + 2 * CH, CH);
    assert_eq!(t.chunk_info(B + 2 * CH).unwrap().stats.accesses, 1);
    let fin = t.on_free(B).unwrap();
    assert_eq!(
        (fin.kind, fin.dev, fin.mapped_bytes, fin.stats.accesses),
        (AllocKind::Reserved, 1, 3 * CH, 1)
    );
    let tot = t.totals();
    assert_eq!(
        (tot.reserved_bytes, tot.mapped_bytes, tot.chunks_tracked),
        (0, 0, 0)
    );
}

#[test]
fn heat_formula_against_hand_computed_values() {
    let t = HeatTable::new(16, 1024);
    let a = t.on_alloc(0, B, 4 * MIB, AllocKind::Malloc).unwrap();
    // 30 accesses of one 1 MiB tensor, 0.1 s apart from t0 ≈ 10 s, by three
    // operator types. Times are kept in ticks of 2^TICK_SHIFT ns; t0 and the
    // steps are whole ticks so that the figures are exact.
    let tick = 1u64 << TICK_SHIFT;
    let t0 = (10 * SEC / tick) * tick;
    let step = (SEC / 10 / tick) * tick;
    let ops = ["MatMul", "Add", "Softmax"];
    for i in 0..30u64 {
        t.touch(
            B + MIB,
            MIB,
            &acc(i, t0 + i * step, ops[i as usize % 3], false),
        );
    }
    let now = t0 + 6 * SEC; // window = 6 s since the first access
    let want_range = (30.0 / 6.0) * (4f64).log2() / 1.0; // = 10
    let r = &t.hottest_ranges(1, now)[0];
    assert_eq!(r.stats.refcount, 3);
    assert!((r.heat(now) - want_range).abs() < 1e-9, "{}", r.heat(now));
    // The allocation: same counts over 4 MiB.
    let ai = t.alloc_info(a).unwrap();
    assert!((ai.heat(now) - want_range / 4.0).abs() < 1e-9);
    // The chunk: 2 MiB.
    let ci = t.chunk_info(B).unwrap();
    assert!((ci.heat(now) - want_range / 2.0).abs() < 1e-9);
    assert_eq!(ci.stats.first_ns, t0);
    assert_eq!(ci.stats.last_ns, t0 + 29 * step);
    assert_eq!(ci.stats.last_seq, 29);
    // A time between ticks reads back rounded down.
    t.touch(B, 1, &acc(30, t0 + 29 * step + tick / 2, "Add", false));
    assert_eq!(t.chunk_info(B).unwrap().stats.last_ns, t0 + 29 * step);
    // The untouched second chunk has no heat and is not among the hottest.
    assert_eq!(t.chunk_info(B + CH).unwrap().heat(now), 0.0);
    assert_eq!(t.hottest_chunks(10, now).len(), 1);
    // Just after the first access the window is the 1 s floor.
    let h = heat(30, 3, MIB, 10 * SEC, 10 * SEC + 1);
    assert!((h - 60.0).abs() < 1e-9);
}

#[test]
fn hottest_orders_by_heat() {
    let t = HeatTable::new(16, 1024);
    t.on_alloc(0, B, 8 * CH, AllocKind::Malloc).unwrap();
    // Chunk k gets k+1 accesses.
    let mut seq = 0;
    for k in 0..8u64 {
        for _ in 0..=k {
            seq += 1;
            t.touch(B + k * CH, 4096, &rd(seq));
        }
    }
    let hot = t.hottest_chunks(3, 10 * SEC);
    let addrs: Vec<u64> = hot.iter().map(|c| c.addr).collect();
    assert_eq!(addrs, vec![B + 7 * CH, B + 6 * CH, B + 5 * CH]);
    let hr = t.hottest_ranges(2, 10 * SEC);
    assert_eq!(
        hr.iter().map(|r| r.stats.accesses).collect::<Vec<_>>(),
        vec![8, 7]
    );
}

#[test]
fn class_bitmask_and_refcount() {
    let t = HeatTable::new(16, 1024);
    let a = t.on_alloc(0, B, CH, AllocKind::Malloc).unwrap();
    let names = [
        "aclnnMatmul",
        "MatMulV2",
        "aclnnInplaceAdd",
        "Add",
        "aclnnFlashAttentionScore",
        "Memcpy",
    ];
    for (i, n) in names.iter().enumerate() {
        t.touch(B, 64, &acc(i as u64, 0, n, false));
    }
    let s = t.alloc_info(a).unwrap().stats;
    let classes: Vec<OpClass> = s.classes.iter().collect();
    assert_eq!(
        classes,
        vec![
            OpClass::MatMul,
            OpClass::AttentionPrefill,
            OpClass::Elementwise,
            OpClass::Layout
        ]
    );
    // aclnnInplaceAdd and Add are one type; aclnnMatmul and MatMulV2 are two.
    let distinct = [
        op_hash("Matmul"),
        op_hash("MatMulV2"),
        op_hash("Add"),
        op_hash("FlashAttentionScore"),
        op_hash("Memcpy"),
    ];
    let bits: std::collections::BTreeSet<u64> = distinct
        .iter()
        .map(|h| ((h >> 32) * OP_BITS as u64) >> 32)
        .collect();
    assert_eq!(
        s.refcount as usize,
        bits.len(),
        "popcount of the hashed bitmap"
    );
    assert!(s.refcount >= 4 && s.refcount <= 5);
    // Repeating a type does not raise it.
    t.touch(B, 64, &acc(9, 0, "Add", false));
    assert_eq!(t.alloc_info(a).unwrap().stats.refcount, s.refcount);
}

#[test]
fn pinned_marks() {
    let t = HeatTable::new(16, 1024);
    let a = t.on_alloc(0, B, 4 * CH, AllocKind::Malloc).unwrap();
    let h = t
        .on_alloc(0, B + 8 * CH, 4096, AllocKind::HostAlias)
        .unwrap();
    // Host aliases are pinned from the start.
    assert!(t
        .alloc_info(h)
        .unwrap()
        .pinned
        .contains(PinReason::HostRegistered));
    assert_eq!(t.totals().pinned_bytes, 4096);
    assert_eq!(t.totals().host_alias_bytes, 4096);
    // HCCL registers part of a's second chunk: that chunk (whole) is pinned.
    assert!(t.set_pinned(B + CH + 100, 10, PinReason::HcclRegistered));
    assert!(t
        .alloc_info(a)
        .unwrap()
        .pinned
        .contains(PinReason::HcclRegistered));
    assert!(t
        .chunk_info(B + CH)
        .unwrap()
        .pinned
        .contains(PinReason::HcclRegistered));
    assert!(!t.chunk_info(B).unwrap().pinned.is_pinned());
    assert_eq!(t.totals().pinned_bytes, 4096 + CH);
    assert!(t.set_pinned(B, 4 * CH, PinReason::IpcExported));
    assert_eq!(t.totals().pinned_bytes, 4096 + 4 * CH);
    let p = t.alloc_info(a).unwrap().pinned;
    assert_eq!(
        p.iter().collect::<Vec<_>>(),
        vec![PinReason::IpcExported, PinReason::HcclRegistered]
    );
    assert!(
        !t.set_pinned(B + 100 * CH, 10, PinReason::Opaque),
        "nothing there"
    );
    t.on_free(B).unwrap();
    assert_eq!(t.totals().pinned_bytes, 4096);
    // A new allocation at the same place starts unpinned.
    let a2 = t.on_alloc(0, B, CH, AllocKind::Malloc).unwrap();
    assert!(!t.alloc_info(a2).unwrap().pinned.is_pinned());
    assert!(!t.chunk_info(B).unwrap().pinned.is_pinned());
    t.on_free(B + 8 * CH).unwrap();
    assert_eq!(t.totals().pinned_bytes, 0);
}

#[test]
fn overlaps_bad_ranges_and_unknown_frees_are_reported_not_fatal() {
    let t = HeatTable::new(4, 1024);
    t.on_alloc(0, B, CH, AllocKind::Malloc).unwrap();
    assert_eq!(t.on_alloc(0, B + CH - 1, 10, AllocKind::Malloc), None);
    assert_eq!(t.on_alloc(0, B - 10, 11, AllocKind::Malloc), None);
    assert_eq!(t.on_alloc(0, B + 5, 0, AllocKind::Malloc), None);
    assert_eq!(t.on_alloc(0, VA_LIMIT - 10, 20, AllocKind::Malloc), None);
    assert_eq!(t.on_alloc(0, u64::MAX - 1, 20, AllocKind::Malloc), None);
    assert!(
        t.on_alloc(0, B - 10, 10, AllocKind::Malloc).is_some(),
        "adjacent is fine"
    );
    assert_eq!(t.on_free(B + 1), None, "frees are by exact base");
    let tot = t.totals();
    assert_eq!(
        (tot.failed_allocs, tot.unknown_frees, tot.live_allocs),
        (5, 1, 2)
    );
}

#[test]
fn table_capacities() {
    // 4 live allocations fit, a fifth does not; freeing makes room (the
    // quarantine lends the slots, it never reduces the capacity).
    let t = HeatTable::with_config(HeatConfig {
        max_allocs: 4,
        max_ranges: 32,
        max_chunks: 2,
    });
    let ids: Vec<AllocId> = (0..4)
        .map(|i| {
            t.on_alloc(0, B + i * 4 * CH, CH, AllocKind::Malloc)
                .unwrap()
        })
        .collect();
    assert_eq!(t.on_alloc(0, B + 100 * CH, CH, AllocKind::Malloc), None);
    // Only two chunks have records; the others are counted as untracked.
    let tot = t.totals();
    assert_eq!((tot.chunks_tracked, tot.chunks_untracked), (2, 2));
    let r = t.touch(B + 3 * 4 * CH, 10, &rd(1));
    assert_eq!((r.alloc, r.chunks), (Some(ids[3]), 0));
    for round in 0..20u64 {
        t.on_free(B + (round % 4) * 4 * CH).unwrap();
        assert!(
            t.on_alloc(0, B + (round % 4) * 4 * CH, CH, AllocKind::Malloc)
                .is_some(),
            "round {round}"
        );
    }
    // The range table (32 entries, 32 probes) drops what does not fit.
    for i in 0..40u64 {
        t.touch(B + i * 64, 64, &rd(i));
    }
    let tot = t.totals();
    assert_eq!(tot.dropped_ranges, 8);
    assert_eq!(t.range_entries(), 32);
}

#[test]
fn ranges_of_freed_allocations_are_reused() {
    let t = HeatTable::new(8, 32);
    for round in 0..10u64 {
        t.on_alloc(0, B, CH, AllocKind::Malloc).unwrap();
        for i in 0..20u64 {
            t.touch(B + i * 64, 64 + round, &rd(i));
        }
        assert_eq!(t.range_entries(), 20);
        let fin = t.on_free(B).unwrap();
        assert_eq!(fin.stats.accesses, 20);
        assert_eq!(t.range_entries(), 0, "stale at once");
    }
    assert_eq!(t.totals().dropped_ranges, 0);
}

#[test]
fn zero_length_and_host_pointers_are_cheap_no_ops() {
    let t = HeatTable::new(8, 32);
    let a = t.on_alloc(0, B, CH, AllocKind::Malloc).unwrap();
    assert_eq!(t.touch(B, 0, &rd(1)), TouchResult::default());
    let r = t.touch(0x7ffd_1234_5000, 4096, &rd(2));
    assert_eq!(
        r,
        TouchResult {
            alloc: None,
            chunks: 0,
            unattributed_bytes: 4096
        }
    );
    assert_eq!(t.alloc_info(a).unwrap().stats.accesses, 0);
    assert_eq!(t.totals().touches, 2);
}
