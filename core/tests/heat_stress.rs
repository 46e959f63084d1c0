//! Concurrent frees and re-allocations of the same addresses never
//! misattribute an access.
//!
//! Three allocator threads free and re-allocate the same base addresses
//! with a different size each time (the first two bases share a 2 MiB chunk,
//! so that chunk switches between one owner and a page table all the time;
//! the third owns its chunks alone) while eight threads touch and look up
//! addresses in those ranges. Every touch that reports an allocation id
//! must have been counted for exactly that generation: at the end, the final
//! access count `on_free` returned for each generation must equal the number
//! of touches that reported it, and for the chunk-exclusive base the chunk
//! counts closed by each free must equal the chunk hits those touches
//! reported. On top of that, each reported id must contain the touched
//! address (sizes differ per generation, so a wrong generation shows) and
//! must have been live while the touch ran (logical clock around alloc/free
//! and touch).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

use u3m_core::heat::*;
use u3m_core::opclass::{op_hash, OpClass};

const MIB: u64 = 1 << 20;
const B: u64 = 0x1200_0000_0000;
/// Allocator k frees and re-allocates at BASES[k] with SIZES[k][i % n].
const BASES: [u64; 3] = [B, B + MIB + 4096, B + 16 * MIB];
const SIZES: [&[u64]; 3] = [
    &[
        4096,
        3 * 4096 + 64,
        65536 + 512,
        MIB - 4096,
        200_000,
        8192 + 32,
        777,
    ],
    &[3 * MIB, 4096, MIB + 100, 2 * MIB - 4096 - 7, 123_456, 64],
    &[2 * MIB, 6 * MIB - 5000, 4096, 2 * MIB + 1, 700_000],
];
/// BASES[EXCLUSIVE] shares its chunks with nobody.
const EXCLUSIVE: usize = 2;
const CYCLES: usize = 1500;
const TOUCHERS: usize = 8;

#[derive(Default, Clone, Copy)]
struct Life {
    len: u64,
    /// Logical clock just before on_alloc / just after on_free.
    born: u64,
    died: u64,
    final_accesses: u64,
    closed_chunk_accesses: u64,
    k: usize,
}

#[derive(Default, Clone, Copy)]
struct Seen {
    touches: u64,
    /// Chunk hits those touches reported.
    chunks: u64,
    /// Largest offset from the allocation's base seen in a reported touch
    /// or lookup.
    max_off: u64,
    /// Earliest end / latest start of a touch that reported it.
    min_end: u64,
    max_start: u64,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

#[test]
fn concurrent_free_and_realloc_never_misattribute() {
    let t = Arc::new(HeatTable::new(256, 1 << 14));
    let clock = Arc::new(AtomicU64::new(1));
    let seq = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let lives: Arc<Mutex<HashMap<AllocId, Life>>> = Arc::default();
    let start = Barrier::new(TOUCHERS + 3);
    let start = Arc::new(start);
    let t0 = Instant::now();

    let allocators: Vec<_> = (0..3)
        .map(|k| {
            let (t, clock, lives, start) = (t.clone(), clock.clone(), lives.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut rng = 0x9e37_79b9u64 + k as u64;
                for i in 0..CYCLES {
                    let len = SIZES[k][i % SIZES[k].len()];
                    let born = clock.fetch_add(1, SeqCst);
                    let id = t
                        .on_alloc(0, BASES[k], len, AllocKind::Malloc)
                        .expect("alloc");
                    // Let touchers at it for a moment.
                    for _ in 0..(xorshift(&mut rng) % 2000) {
                        std::hint::spin_loop();
                    }
                    if i % 5 == 0 {
                        std::thread::yield_now();
                    }
                    let info = t.on_free(BASES[k]).expect("free");
                    let died = clock.fetch_add(1, SeqCst);
                    assert_eq!((info.id, info.base, info.len), (id, BASES[k], len));
                    let life = Life {
                        len,
                        born,
                        died,
                        final_accesses: info.stats.accesses,
                        closed_chunk_accesses: info.closed_chunk_accesses,
                        k,
                    };
                    assert!(
                        lives.lock().unwrap().insert(id, life).is_none(),
                        "id {id:?} reused"
                    );
                }
            })
        })
        .collect();

    let touchers: Vec<_> = (0..TOUCHERS)
        .map(|n| {
            let (t, clock, seq, stop, start) = (
                t.clone(),
                clock.clone(),
                seq.clone(),
                stop.clone(),
                start.clone(),
            );
            std::thread::spawn(move || {
                start.wait();
                let mut rng = 0x1234_5678_9abc_def1u64 ^ (n as u64) << 40;
                let mut seen: HashMap<AllocId, Seen> = HashMap::new();
                let (mut touches, mut unattributed) = (0u64, 0u64);
                let ops = ["MatMul", "Add", "Softmax", "Cast"];
                while !stop.load(Relaxed) {
                    let r = xorshift(&mut rng);
                    let k = (r % 3) as usize;
                    let max = *SIZES[k].iter().max().unwrap();
                    let off = (r >> 8) % max;
                    // Never across a size any generation can have: a touch
                    // crossing the end of an allocation that is re-allocated
                    // larger meanwhile is rightly split between two
                    // generations, and TouchResult names only the first.
                    let mut len = 1 + (r >> 40) % 4096;
                    for &s in SIZES[k] {
                        if off < s && s < off + len {
                            len = s - off;
                        }
                    }
                    let addr = BASES[k] + off;
                    let op = ops[(r >> 60) as usize % 4];
                    let a = Access {
                        seq: seq.fetch_add(1, Relaxed),
                        ns: t0.elapsed().as_nanos() as u64,
                        class: OpClass::of(op),
                        op_hash: op_hash(op),
                        write: r & 2 != 0,
                    };
                    let before = clock.load(SeqCst);
                    let res = t.touch(addr, len, &a);
                    let after = clock.load(SeqCst);
                    touches += 1;
                    match res.alloc {
                        Some(id) => {
                            let s = seen.entry(id).or_insert(Seen {
                                min_end: u64::MAX,
                                ..Seen::default()
                            });
                            s.touches += 1;
                            s.chunks += res.chunks as u64;
                            s.max_off = s.max_off.max(off);
                            s.min_end = s.min_end.min(after);
                            s.max_start = s.max_start.max(before);
                        }
                        None => {
                            unattributed += 1;
                            assert_eq!(res.chunks, 0);
                        }
                    }
                    if let Some((id, base, len)) = t.lookup(addr) {
                        assert_eq!(base, BASES[k]);
                        assert!(addr - base < len);
                        let s = seen.entry(id).or_insert(Seen {
                            min_end: u64::MAX,
                            ..Seen::default()
                        });
                        s.max_off = s.max_off.max(off);
                    }
                }
                (seen, touches, unattributed)
            })
        })
        .collect();

    for a in allocators {
        a.join().unwrap();
    }
    stop.store(true, Relaxed);
    let mut seen: HashMap<AllocId, Seen> = HashMap::new();
    let (mut touches, mut unattributed) = (0, 0);
    for h in touchers {
        let (s, n, u) = h.join().unwrap();
        touches += n;
        unattributed += u;
        for (id, x) in s {
            let e = seen.entry(id).or_insert(Seen {
                min_end: u64::MAX,
                ..Seen::default()
            });
            e.touches += x.touches;
            e.chunks += x.chunks;
            e.max_off = e.max_off.max(x.max_off);
            e.min_end = e.min_end.min(x.min_end);
            e.max_start = e.max_start.max(x.max_start);
        }
    }

    let lives = lives.lock().unwrap();
    assert_eq!(lives.len(), 3 * CYCLES);
    let mut attributed = 0;
    for (id, life) in lives.iter() {
        let s = seen.get(id).copied().unwrap_or(Seen {
            min_end: u64::MAX,
            ..Seen::default()
        });
        assert_eq!(
            s.touches, life.final_accesses,
            "{id:?}: touches reported for it vs accesses it ended with"
        );
        if life.k == EXCLUSIVE {
            assert_eq!(
                s.chunks, life.closed_chunk_accesses,
                "{id:?}: chunk hits reported for it vs its chunks' final counts"
            );
        }
        if s.touches > 0 || s.max_off > 0 {
            assert!(
                s.max_off < life.len,
                "{id:?}: offset {} outside its {} bytes",
                s.max_off,
                life.len
            );
        }
        if s.touches > 0 {
            assert!(
                s.min_end >= life.born,
                "{id:?}: a touch ended before it was allocated"
            );
            assert!(
                s.max_start <= life.died,
                "{id:?}: a touch started after it was freed"
            );
        }
        attributed += s.touches;
    }
    for id in seen.keys() {
        assert!(
            lives.contains_key(id),
            "{id:?} reported but never allocated"
        );
    }
    let tot = t.totals();
    assert_eq!(tot.live_allocs, 0);
    assert_eq!(tot.touches, touches);
    assert_eq!(attributed + unattributed, touches);
    assert!(
        attributed > 1000,
        "too few attributed touches ({attributed}) to mean anything"
    );
    assert!(t.hottest_ranges(10, 0).is_empty() && t.hottest_chunks(10, 0).is_empty());
    eprintln!(
        "heat stress: {} generations, {touches} touches, {attributed} attributed, {} stale parts rejected, {:.2} s",
        lives.len(),
        tot.stale_parts,
        t0.elapsed().as_secs_f64()
    );
}

/// Chunk and range records follow the same rule: after the churn above has
/// been through them, a new occupancy of the same addresses starts from
/// zero and counts exactly its own touches.
#[test]
fn records_restart_clean_after_churn() {
    let t = Arc::new(HeatTable::new(64, 1024));
    let stop = Arc::new(AtomicBool::new(false));
    let touchers: Vec<_> = (0..4)
        .map(|n| {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    let a = Access {
                        seq: i,
                        ns: i,
                        class: OpClass::MatMul,
                        op_hash: n,
                        write: false,
                    };
                    t.touch(B + (i % 4) * 4096, 4096, &a);
                    i += 1;
                }
            })
        })
        .collect();
    for _ in 0..2000 {
        t.on_alloc(0, B, 16384, AllocKind::Malloc).unwrap();
        t.on_free(B).unwrap();
    }
    stop.store(true, Relaxed);
    for h in touchers {
        h.join().unwrap();
    }
    // Quiet now: a fresh allocation must show exactly what we do to it.
    let id = t.on_alloc(0, B, 16384, AllocKind::Malloc).unwrap();
    assert_eq!(t.chunk_info(B).unwrap().stats.accesses, 0);
    assert_eq!(t.alloc_info(id).unwrap().stats.accesses, 0);
    assert!(t.hottest_ranges(10, 0).is_empty());
    let a = Access {
        seq: 1,
        ns: 1,
        class: OpClass::Layout,
        op_hash: 1,
        write: true,
    };
    t.touch(B + 4096, 4096, &a);
    assert_eq!(t.chunk_info(B).unwrap().stats.accesses, 1);
    let r = t.hottest_ranges(10, 0);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].start, r[0].len, r[0].stats.accesses),
        (B + 4096, 4096, 1)
    );
}
