//! Micro benchmark of the hot path without any runtime around it:
//! `HeatTable::touch` / `lookup` and the engine's `op`, `copy`, `memset`,
//! `alloc` + `free`, as the hooks call them. Not a test: run it with
//!
//!     cargo run --release -p u3m-core --example touch_bench -- [--iters N] [--threads T] [--case a,b]
//!
//! (bench/hooks.sh runs it natively for ns and under callgrind for
//! instructions). One line per case on stdout:
//!
//!     case=<name> threads=<T> iters=<N> ranges=<r> wall_ns=<per iter> cpu_ns=<per iter>
//!
//! wall = elapsed per iteration, mean over threads; cpu = the thread's own
//! CPU time per iteration (CLOCK_THREAD_CPUTIME_ID), mean over threads. The
//! measured run goes through `measure` (never inlined; the warm-up does not),
//! so callgrind's `--toggle-collect='*touch_bench::measure'` counts exactly
//! the measured iterations: run one case per callgrind run.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Barrier;
use std::time::Instant;

use u3m_core::config::Config;
use u3m_core::engine::{AllocApi, Engine, Range};
use u3m_core::heat::{Access, HeatTable};
use u3m_core::opclass;

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;
/// Device-like addresses, one 1 GiB window per thread.
const BASE: u64 = 0x1000_0000_0000;
const RANGE: u64 = 64 * KIB;
const POOL: u64 = 32 * MIB;

/// Per-thread fixture: a 32 MiB "caching allocator block" carved into 64 KiB
/// tensors (interior pointers), as torch_npu's allocator hands them out.
struct Fx<'a> {
    heat: &'a HeatTable,
    eng: &'a Engine,
    base: u64,
    hash: u64,
    class: opclass::OpClass,
    ranges: [Range; 16],
    /// For the floor case: six words updated the way a touch updates the
    /// count and sequence words of its three records.
    words: [AtomicU64; 6],
}

fn thread_base(t: usize) -> u64 {
    BASE + (t as u64) * (1 << 30)
}

#[inline(never)]
fn case_touch_1chunk(f: &Fx, n: u64) {
    // 16 distinct 64 KiB tensors in the first chunk, one operator each
    for i in 0..n {
        let a = Access {
            seq: i + 1,
            ns: i * 1000,
            class: f.class,
            op_hash: f.hash,
            write: i & 1 == 0,
        };
        black_box(f.heat.touch(f.base + (i & 15) * RANGE, RANGE, &a));
    }
}

#[inline(never)]
fn case_touch_2chunk(f: &Fx, n: u64) {
    // a 64 KiB tensor straddling the first chunk boundary
    for i in 0..n {
        let a = Access {
            seq: i + 1,
            ns: i * 1000,
            class: f.class,
            op_hash: f.hash,
            write: false,
        };
        black_box(f.heat.touch(f.base + 2 * MIB - RANGE / 2, RANGE, &a));
    }
}

#[inline(never)]
fn case_touch_host(f: &Fx, n: u64) {
    // a host pointer: resolves to nothing, counted as unattributed
    for i in 0..n {
        let a = Access {
            seq: i + 1,
            ns: i * 1000,
            class: f.class,
            op_hash: f.hash,
            write: false,
        };
        black_box(f.heat.touch(0x7f00_0000_0000 + (i & 15) * 4096, 4096, &a));
    }
}

/// What a one-chunk touch cannot go below: its six compare-and-swaps (count
/// and sequence number of the allocation, range and chunk records), alone.
#[inline(never)]
fn case_cas6_floor(f: &Fx, n: u64) {
    for i in 0..n {
        for w in black_box(&f.words) {
            let mut cur = w.load(Relaxed);
            while let Err(x) = w.compare_exchange_weak(cur, cur.max(i) + 1, Relaxed, Relaxed) {
                cur = x;
            }
        }
    }
}

#[inline(never)]
fn case_lookup(f: &Fx, n: u64) {
    for i in 0..n {
        black_box(f.heat.lookup(f.base + (i & 255) * 4096 + 8));
    }
}

fn engine_op(f: &Fx, n: u64, k: usize) {
    for _ in 0..n {
        f.eng.op(0, 0x1234, b"ConcatD", &f.ranges[..k], None);
    }
}

#[inline(never)]
fn case_op_1(f: &Fx, n: u64) {
    engine_op(f, n, 1)
}

#[inline(never)]
fn case_op_4(f: &Fx, n: u64) {
    engine_op(f, n, 4)
}

#[inline(never)]
fn case_op_16(f: &Fx, n: u64) {
    engine_op(f, n, 16)
}

#[inline(never)]
fn case_copy_d2d(f: &Fx, n: u64) {
    // aclrtMemcpyAsync device -> device, 256 B (ACL_MEMCPY_DEVICE_TO_DEVICE = 3)
    for _ in 0..n {
        f.eng
            .copy(0, 0x1234, 3, f.base + 20 * MIB, 256, f.base, 256, 256);
    }
}

#[inline(never)]
fn case_copy_h2d(f: &Fx, n: u64) {
    // ACL_MEMCPY_HOST_TO_DEVICE = 1: only the device side is an access
    for _ in 0..n {
        f.eng.copy(
            0,
            0x1234,
            1,
            f.base + 20 * MIB,
            256,
            0x7f00_0000_0000,
            256,
            256,
        );
    }
}

#[inline(never)]
fn case_memset(f: &Fx, n: u64) {
    for _ in 0..n {
        f.eng.memset(0, 0x1234, f.base + 20 * MIB, 256);
    }
}

fn alloc_free(f: &Fx, n: u64, at: u64, len: u64) {
    for _ in 0..n {
        f.eng.alloc(0, at, len, AllocApi::Malloc);
        f.eng.free(at);
    }
}

#[inline(never)]
fn case_alloc_free_small(f: &Fx, n: u64) {
    // 64 KiB in a chunk that holds another live allocation (the common case
    // for small tensors: the chunk has a page table)
    alloc_free(f, n, f.base + POOL + 64 * KIB, 64 * KIB)
}

#[inline(never)]
fn case_alloc_free_large(f: &Fx, n: u64) {
    // 8 MiB, 2 MiB-aligned: owns its four chunks alone
    alloc_free(f, n, f.base + POOL + 4 * MIB, 8 * MIB)
}

type CaseFn = fn(&Fx, u64);

/// The one function callgrind collects in (see the header).
#[inline(never)]
fn measure(fun: CaseFn, f: &Fx, n: u64) {
    fun(f, n);
    black_box(());
}

/// (name, function, attributed ranges per iteration)
const CASES: &[(&str, CaseFn, u32)] = &[
    ("touch_1chunk", case_touch_1chunk, 1),
    ("touch_2chunk", case_touch_2chunk, 1),
    ("touch_host", case_touch_host, 0),
    ("cas6_floor", case_cas6_floor, 0),
    ("lookup", case_lookup, 0),
    ("op_1", case_op_1, 1),
    ("op_4", case_op_4, 4),
    ("op_16", case_op_16, 16),
    ("copy_h2d", case_copy_h2d, 1),
    ("copy_d2d", case_copy_d2d, 2),
    ("memset", case_memset, 1),
    ("alloc_free_small", case_alloc_free_small, 0),
    ("alloc_free_large", case_alloc_free_large, 0),
];

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn main() {
    let mut iters: u64 = 200_000;
    let mut threads: usize = 1;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |what: &str| {
            args.next()
                .unwrap_or_else(|| die(&format!("{what} needs a value")))
        };
        match a.as_str() {
            "--iters" => {
                iters = val("--iters")
                    .parse()
                    .unwrap_or_else(|_| die("--iters: not a number"))
            }
            "--threads" => {
                threads = val("--threads")
                    .parse()
                    .unwrap_or_else(|_| die("--threads: not a number"))
            }
            "--case" => only = Some(val("--case")),
            "--list" => {
                for c in CASES {
                    println!("{}", c.0);
                }
                return;
            }
            _ => die("usage: touch_bench [--iters N] [--threads T] [--case a,b] [--list]"),
        }
    }
    if threads == 0 || threads > 64 || iters == 0 {
        die("--threads must be 1..64, --iters >= 1");
    }

    // Observe mode (nothing moves; tier mode needs a runtime), stats segment
    // in a private directory.
    let dir = std::env::temp_dir().join(format!("u3m-touch-bench.{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| die(&format!("{}: {e}", dir.display())));
    let vars = [
        ("U3M_SHM_DIR", dir.display().to_string()),
        ("U3M_MODE", "observe".to_string()),
    ];
    let cfg = Config::from_vars(vars.into_iter().map(|(k, v)| (k.to_string(), v)))
        .unwrap_or_else(|e| die(&format!("config: {e:?}")));
    let eng = Engine::new(cfg, &["aclrtMalloc"], None).unwrap_or_else(|e| die(&e));
    // The capacity, as aclrtGetMemInfo reports it at start-up: arms the HBM
    // monitor, which then runs on every alloc and free (as under torch_npu).
    eng.mem_info(0, 32 << 30, 32 << 30);
    let (class, hash) = opclass::classify("ConcatD");
    // Each thread: a live 32 MiB pool, and a live 4 KiB neighbour in the
    // chunk after it (so that alloc_free_small lands in a shared chunk).
    for t in 0..threads {
        let b = thread_base(t);
        eng.alloc(0, b, POOL, AllocApi::Malloc);
        eng.alloc(0, b + POOL, 4 * KIB, AllocApi::Malloc);
    }

    for &(name, fun, ranges) in CASES {
        if let Some(o) = &only {
            if !o.split(',').any(|x| x == name || x == "all") {
                continue;
            }
        }
        let barrier = Barrier::new(threads);
        let results: Vec<(f64, f64)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let (eng, barrier) = (&eng, &barrier);
                    s.spawn(move || {
                        let base = thread_base(t);
                        let mut rs = [Range::ZERO; 16];
                        for (i, r) in rs.iter_mut().enumerate() {
                            *r = Range {
                                addr: base + i as u64 * RANGE,
                                len: RANGE,
                                write: i == 15,
                                whole: false,
                            };
                        }
                        let words = [const { AtomicU64::new(0) }; 6];
                        let f = Fx {
                            heat: eng.heat(),
                            eng,
                            base,
                            hash,
                            class,
                            ranges: rs,
                            words,
                        };
                        fun(&f, (iters / 10).max(1)); // warm-up: first-touch entries, caches
                        barrier.wait();
                        let (w0, c0) = (Instant::now(), thread_cpu_ns());
                        measure(fun, &f, iters);
                        let cpu = (thread_cpu_ns() - c0) as f64;
                        let wall = w0.elapsed().as_nanos() as f64;
                        (wall / iters as f64, cpu / iters as f64)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("bench thread"))
                .collect()
        });
        let n = results.len() as f64;
        let wall = results.iter().map(|r| r.0).sum::<f64>() / n;
        let cpu = results.iter().map(|r| r.1).sum::<f64>() / n;
        println!("case={name} threads={threads} iters={iters} ranges={ranges} wall_ns={wall:.1} cpu_ns={cpu:.1}");
    }
    eng.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

fn die(msg: &str) -> ! {
    eprintln!("touch_bench: {msg}");
    std::process::exit(3);
}
