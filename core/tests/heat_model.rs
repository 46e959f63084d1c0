//! Sequential operations on the heat table against a simple model: a
//! BTreeMap of live allocations, per-chunk occupancies and per-range counts.

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;
use u3m_core::heat::*;
use u3m_core::opclass::OpClass;

const CH: u64 = 2 << 20;
const B: u64 = 0x2000_0000_0000 - 2 * CH; // straddles a 1 GiB region boundary

/// Candidate bases: dense small ones (several per page and per chunk) and
/// sparse large ones (spanning chunks).
fn base_of(i: u8) -> u64 {
    let i = i as u64 % 56;
    if i < 48 {
        B + i * 1536
    } else {
        B + 3 * CH + (i - 48) * (CH / 2 + 4096)
    }
}

const SIZES: [u64; 9] = [
    64,
    700,
    1536,
    4096,
    5000,
    100_000,
    CH - 4096,
    CH + 1,
    3 * CH,
];
const LENS: [u64; 7] = [1, 100, 4096, 10_000, CH, 3 * CH, 5 * CH];

#[derive(Clone, Debug)]
enum Op {
    Alloc { at: u8, size: u8, host: bool },
    Free { pick: u8, exact: bool },
    Touch { at: u16, len: u8, write: bool },
    Lookup { at: u16 },
    Pin { at: u16, len: u8, reason: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<u8>(), 0..SIZES.len() as u8, prop::bool::weighted(0.2))
            .prop_map(|(at, size, host)| Op::Alloc { at, size, host }),
        2 => (any::<u8>(), prop::bool::weighted(0.9)).prop_map(|(pick, exact)| Op::Free { pick, exact }),
        5 => (any::<u16>(), 0..LENS.len() as u8, any::<bool>()).prop_map(|(at, len, write)| Op::Touch { at, len, write }),
        1 => any::<u16>().prop_map(|at| Op::Lookup { at }),
        1 => (any::<u16>(), 0..LENS.len() as u8, 0..4u8).prop_map(|(at, len, reason)| Op::Pin { at, len, reason }),
    ]
}

/// Touch/lookup addresses: anywhere in the 7 chunks the bases can reach,
/// at 512-byte steps plus a small odd offset.
fn addr_of(at: u16) -> u64 {
    B + (at as u64 % 28672) * 512 + (at as u64 % 7)
}

#[derive(Clone, Copy, Debug)]
struct MAlloc {
    len: u64,
    id: AllocId,
    accesses: u64,
    pins: u8,
    host: bool,
}

#[derive(Default)]
struct Model {
    allocs: BTreeMap<u64, MAlloc>,
    /// Chunk base -> (accesses this occupancy, pins).
    chunks: HashMap<u64, (u64, u8)>,
    ranges: HashMap<(u64, u64, AllocId), u64>,
    ids: HashSet<AllocId>,
}

fn chunks_of(s: u64, e: u64) -> impl Iterator<Item = u64> {
    let first = s & !(CH - 1);
    (0..)
        .map(move |k| first + k * CH)
        .take_while(move |&c| c < e)
}

impl Model {
    fn overlapping(&self, s: u64, e: u64) -> Vec<(u64, MAlloc)> {
        self.allocs
            .iter()
            .filter(|(&b, a)| b < e && b + a.len > s)
            .map(|(&b, a)| (b, *a))
            .collect()
    }
    fn chunk_bytes(&self, c: u64) -> u64 {
        self.overlapping(c, c + CH)
            .iter()
            .map(|(b, a)| (b + a.len).min(c + CH) - b.max(&c))
            .sum()
    }
    fn owners(&self, c: u64) -> u32 {
        self.overlapping(c, c + CH).len() as u32
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let t = HeatTable::with_config(HeatConfig {
        max_allocs: 64,
        max_ranges: 4096,
        max_chunks: 64,
    });
    let mut m = Model::default();
    for (seq, op) in ops.into_iter().enumerate() {
        let seq = seq as u64;
        match op {
            Op::Alloc { at, size, host } => {
                let (base, len) = (base_of(at), SIZES[size as usize]);
                let kind = if host {
                    AllocKind::HostAlias
                } else {
                    AllocKind::Malloc
                };
                let got = t.on_alloc(0, base, len, kind);
                if !m.overlapping(base, base + len).is_empty() {
                    prop_assert_eq!(got, None);
                    continue;
                }
                let id = got.expect("free range must be accepted");
                prop_assert!(m.ids.insert(id), "id {:?} handed out twice", id);
                let pins = if host {
                    PinReason::HostRegistered.bit()
                } else {
                    0
                };
                m.allocs.insert(
                    base,
                    MAlloc {
                        len,
                        id,
                        accesses: 0,
                        pins,
                        host,
                    },
                );
                for c in chunks_of(base, base + len) {
                    m.chunks.entry(c).or_insert((0, 0)).1 |= pins;
                }
            }
            Op::Free { pick, exact } => {
                let live: Vec<u64> = m.allocs.keys().copied().collect();
                if live.is_empty() {
                    prop_assert_eq!(t.on_free(B + 1), None);
                    continue;
                }
                let base = live[pick as usize % live.len()];
                if !exact {
                    prop_assert_eq!(t.on_free(base + 1), None);
                    continue;
                }
                let a = m.allocs.remove(&base).unwrap();
                let info = t.on_free(base).expect("live allocation");
                prop_assert_eq!((info.id, info.base, info.len), (a.id, base, a.len));
                prop_assert_eq!(info.stats.accesses, a.accesses);
                for c in chunks_of(base, base + a.len) {
                    if m.owners(c) == 0 {
                        m.chunks.remove(&c);
                    }
                }
                m.ranges.retain(|k, _| k.2 != a.id);
            }
            Op::Touch { at, len, write } => {
                let (addr, len) = (addr_of(at), LENS[len as usize]);
                let access = Access {
                    seq,
                    ns: seq * 1000,
                    class: OpClass::Reduction,
                    op_hash: seq,
                    write,
                };
                let r = t.touch(addr, len, &access);
                let parts = m.overlapping(addr, addr + len);
                let mut want = TouchResult {
                    alloc: parts.first().map(|p| p.1.id),
                    ..Default::default()
                };
                let mut covered = 0;
                for (b, a) in &parts {
                    let (s, e) = (addr.max(*b), (addr + len).min(b + a.len));
                    covered += e - s;
                    m.allocs.get_mut(b).unwrap().accesses += 1;
                    *m.ranges.entry((s, e - s, a.id)).or_default() += 1;
                    for c in chunks_of(s, e) {
                        want.chunks += 1;
                        m.chunks.get_mut(&c).expect("occupied chunk").0 += 1;
                    }
                }
                want.unattributed_bytes = len - covered;
                prop_assert_eq!(r, want);
            }
            Op::Lookup { at } => {
                let addr = addr_of(at);
                let want = m
                    .overlapping(addr, addr + 1)
                    .first()
                    .map(|(b, a)| (a.id, *b, a.len));
                prop_assert_eq!(t.lookup(addr), want);
            }
            Op::Pin { at, len, reason } => {
                let (addr, len) = (addr_of(at), LENS[len as usize]);
                let reason = PinReason::ALL[reason as usize];
                let parts = m.overlapping(addr, addr + len);
                prop_assert_eq!(t.set_pinned(addr, len, reason), !parts.is_empty());
                for (b, a) in parts {
                    m.allocs.get_mut(&b).unwrap().pins |= reason.bit();
                    for c in chunks_of(addr.max(b), (addr + len).min(b + a.len)) {
                        m.chunks.get_mut(&c).unwrap().1 |= reason.bit();
                    }
                }
            }
        }
        // Whole-table checks after every operation.
        let tot = t.totals();
        prop_assert_eq!(tot.live_allocs, m.allocs.len() as u64);
        let dev: u64 = m.allocs.values().filter(|a| !a.host).map(|a| a.len).sum();
        let host: u64 = m.allocs.values().filter(|a| a.host).map(|a| a.len).sum();
        prop_assert_eq!((tot.device_bytes, tot.host_alias_bytes), (dev, host));
        let pinned: u64 = m
            .chunks
            .iter()
            .filter(|(_, v)| v.1 != 0)
            .map(|(c, _)| m.chunk_bytes(*c))
            .sum();
        prop_assert_eq!(tot.pinned_bytes, pinned);
        prop_assert_eq!(tot.chunks_tracked, m.chunks.len() as u64);
    }
    // Final state in detail.
    for (&b, a) in &m.allocs {
        let i = t.alloc_info(a.id).expect("live");
        prop_assert_eq!(
            (i.base, i.len, i.stats.accesses, i.pinned.0),
            (b, a.len, a.accesses, a.pins)
        );
    }
    for (&c, &(acc, pins)) in &m.chunks {
        let ci = t.chunk_info(c).expect("occupied chunk");
        prop_assert_eq!(
            (ci.stats.accesses, ci.pinned.0, ci.owners, ci.bytes),
            (acc, pins, m.owners(c), m.chunk_bytes(c)),
            "chunk {:#x}",
            c
        );
    }
    let mut got: Vec<((u64, u64, AllocId), u64)> = t
        .hottest_ranges(usize::MAX, 0)
        .iter()
        .map(|r| ((r.start, r.len, r.alloc), r.stats.accesses))
        .collect();
    let mut want: Vec<((u64, u64, AllocId), u64)> = m.ranges.into_iter().collect();
    got.sort();
    want.sort();
    prop_assert_eq!(got, want);
    prop_assert_eq!(t.totals().dropped_ranges, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn heat_table_matches_model(ops in prop::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}
