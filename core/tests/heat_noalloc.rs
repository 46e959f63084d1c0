//! The hot path (`touch`, `lookup`, operator classification) never
//! allocates — counted by a global allocator watching the calling thread —
//! and what it costs, printed (not asserted; run with `--release
//! --nocapture` for meaningful figures).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::time::Instant;

use u3m_core::heat::*;
use u3m_core::opclass::{classify, op_hash, OpClass};

struct Counting;

thread_local! {
    static WATCHED: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if WATCHED.with(Cell::get) {
            ALLOCS.with(|c| c.set(c.get() + 1));
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if WATCHED.with(Cell::get) {
            ALLOCS.with(|c| c.set(c.get() + 1));
        }
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if WATCHED.with(Cell::get) {
            ALLOCS.with(|c| c.set(c.get() + 1));
        }
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

const CH: u64 = 2 << 20;
const B: u64 = 0x1000_0000_0000;

fn watched<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = ALLOCS.with(Cell::get);
    WATCHED.with(|w| w.set(true));
    let r = f();
    WATCHED.with(|w| w.set(false));
    (r, ALLOCS.with(Cell::get) - before)
}

fn table() -> HeatTable {
    let t = HeatTable::new(1024, 1 << 16);
    t.on_alloc(0, B, 64 * CH, AllocKind::Malloc).unwrap();
    // A chunk shared by small allocations, some sharing a page.
    for i in 0..6 {
        t.on_alloc(0, B + 64 * CH + i * 1536, 1000, AllocKind::Malloc)
            .unwrap();
    }
    t.on_alloc(0, B + 80 * CH, 16 * CH, AllocKind::Reserved)
        .unwrap();
    t.on_map(B + 80 * CH, 4 * CH);
    t
}

#[test]
fn hot_path_does_not_allocate() {
    let t = table();
    let names = [
        "MatMulV2",
        "aclnnInplaceAdd",
        "aclnnSomethingUnknown",
        "aclnnFlashAttentionScoreGradV3",
    ];
    let (_, n) = watched(|| {
        for i in 0..20_000u64 {
            let (class, h) = classify(names[i as usize % 4]);
            let a = Access {
                seq: i,
                ns: i * 100,
                class,
                op_hash: h,
                write: i % 3 == 0,
            };
            // New and repeated ranges, interior pointers, multi-chunk ranges,
            // shared chunks, reservation chunks, host pointers.
            black_box(t.touch(B + (i % 700) * 4096, 4096 + (i % 5) * 100, &a));
            black_box(t.touch(B + 10 * CH - 100, 3 * CH, &a));
            black_box(t.touch(B + 64 * CH + (i % 6) * 1536 + 10, 900, &a));
            black_box(t.touch(B + 80 * CH + (i % 40) * 65536, 65536, &a));
            black_box(t.touch(0x7ffd_0000_0000 + i * 64, 64, &a));
            black_box(t.lookup(B + 64 * CH + (i % 9) * 1000));
            black_box(OpClass::of(names[i as usize % 4]));
        }
    });
    assert_eq!(n, 0, "the hot path allocated");
    assert!(t.totals().touches >= 100_000);
}

/// The buffered hot path (`record_ranges`, heat/pending.rs) allocates its
/// thread's buffer on the first call only: never again, whether the calls
/// merge into it or overflow it (applied when full, capacity kept).
#[test]
fn buffered_hot_path_allocates_once_per_thread() {
    use u3m_core::engine::Range;
    let t = table();
    let r = |addr, len, write| Range {
        addr,
        len,
        write,
        whole: false,
    };
    let a = |i: u64| Access {
        seq: i + 1,
        ns: i * 100,
        class: OpClass::of("MatMulV2"),
        op_hash: op_hash("MatMulV2"),
        write: false,
    };
    t.record_ranges(&[r(B, 4096, false), r(B + 8192, 4096, true)], &a(0));
    let (_, n) = watched(|| {
        for i in 0..20_000u64 {
            // mostly new ranges: the buffer overflows and is applied often
            let rs = [
                r(B + (i % 700) * 4096, 4096 + (i % 5) * 100, i % 3 == 0),
                r(B + 10 * CH - 100, 3 * CH, false),
                r(B + 64 * CH + (i % 6) * 1536 + 10, 900, true),
                r(B + 80 * CH + (i % 40) * 65536, 65536, false),
                r(0x7ffd_0000_0000 + i * 64, 64, false),
            ];
            t.record_ranges(&rs, &a(i + 1));
        }
    });
    assert_eq!(n, 0, "the buffered hot path allocated");
    assert!(t.totals().touches >= 100_000);
}

/// ns per call of `f`, best of three runs (the machine is shared).
fn per_op(n: u64, f: impl FnMut(u64)) -> f64 {
    let mut f = f;
    (0..3)
        .map(|_| {
            let start = Instant::now();
            for i in 0..n {
                f(i);
            }
            start.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::MAX, f64::min)
}

#[test]
fn touch_cost() {
    let t = table();
    let mh = op_hash("MatMul");
    let acc = |i: u64| Access {
        seq: i,
        ns: i * 50,
        class: OpClass::MatMul,
        op_hash: mh,
        write: false,
    };
    let n = 200_000;
    // Warm the ranges first so that the figure is the steady state.
    for i in 0..1000 {
        t.touch(B + (i % 256) * 65536, 65536, &acc(i));
    }
    let same_range = per_op(n, |i| {
        black_box(t.touch(B + (i % 256) * 65536, 65536, &acc(i)));
    });
    // An operator with four tensors in the same segment: one seq and time
    // for four touches (the common case under a caching allocator).
    let op4 = per_op(n, |i| {
        let a = Access {
            seq: i / 4,
            ns: (i / 4) * 5000,
            class: OpClass::MatMul,
            op_hash: mh,
            write: i % 4 == 3,
        };
        black_box(t.touch(B + (i % 256) * 65536, 65536, &a));
    });
    let three_chunks = per_op(n, |i| {
        black_box(t.touch(B + (i % 16) * 4 * CH + 4096, 2 * CH, &acc(i)));
    });
    let shared_chunk = per_op(n, |i| {
        black_box(t.touch(B + 64 * CH + (i % 6) * 1536, 1000, &acc(i)));
    });
    let host = per_op(n, |i| {
        black_box(t.touch(0x7ffd_0000_0000 + (i % 4096) * 64, 64, &acc(i)));
    });
    let lookup = per_op(n, |i| {
        black_box(t.lookup(B + (i % 4096) * 4096));
    });
    eprintln!(
        "heat touch cost (ns/call): 1-chunk range {same_range:.1}, same in 4-tensor ops {op4:.1}, \
         2-chunk range {three_chunks:.1}, \
         shared chunk {shared_chunk:.1}, host pointer {host:.1}, lookup {lookup:.1}"
    );
    // Two threads on disjoint ranges and on the same range.
    for (label, stride) in [("disjoint", 1u64), ("same", 0u64)] {
        let start = Instant::now();
        std::thread::scope(|s| {
            for k in 0..2u64 {
                let t = &t;
                s.spawn(move || {
                    for i in 0..n {
                        black_box(t.touch(B + (k * stride * 8 + (i % 8)) * 65536, 65536, &acc(i)));
                    }
                });
            }
        });
        let ns = start.elapsed().as_nanos() as f64 / n as f64;
        eprintln!("heat touch cost, 2 threads, {label} ranges: {ns:.1} ns per touch per thread");
    }
}
