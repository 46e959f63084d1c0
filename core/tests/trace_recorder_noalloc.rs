//! `Recorder::record` never allocates: counted by a global allocator that
//! watches the recording thread only (the writer thread allocates freely).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use u3m_core::trace::{CopyKind, Range, Rec, Recorder, RecorderConfig};

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
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if WATCHED.with(Cell::get) {
            ALLOCS.with(|c| c.set(c.get() + 1));
        }
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn record_does_not_allocate() {
    let path = std::env::temp_dir().join(format!("u3m-noalloc-{}.trace", std::process::id()));
    for lossless in [false, true] {
        let rec = Recorder::start_with(
            &path,
            RecorderConfig {
                capacity: 64,
                lossless,
                report: false,
                ..Default::default()
            },
        )
        .unwrap();
        let ranges: Vec<Range> = (0..40).map(|i| Range::new(0x1000 + i * 16, 16)).collect();
        WATCHED.with(|w| w.set(true));
        for i in 0..20_000u64 {
            let a = 0x1000;
            match i % 9 {
                0 => rec.record(
                    0,
                    0,
                    Rec::Alloc {
                        addr: a,
                        bytes: 4096,
                    },
                ),
                1 => rec.record(
                    0,
                    1,
                    Rec::Op {
                        op_type: b"MatMul",
                        inputs: &ranges[..3],
                        outputs: &ranges[3..4],
                        flops: Some(5),
                    },
                ),
                2 => rec.record(
                    0,
                    1,
                    Rec::Op {
                        op_type: b"ConcatD",
                        inputs: &ranges[..39],
                        outputs: &ranges[39..],
                        flops: None,
                    },
                ),
                3 => rec.record(
                    0,
                    2,
                    Rec::Copy {
                        kind: CopyKind::H2D,
                        dst: a,
                        src: 0x7f00,
                        bytes: 64,
                    },
                ),
                4 => rec.record(
                    0,
                    2,
                    Rec::CopyAuto {
                        dst: 0x7f00,
                        src: a,
                        bytes: 64,
                    },
                ),
                5 => rec.record(0, 2, Rec::Set { addr: a, bytes: 64 }),
                6 => rec.record_tagged(
                    0,
                    0,
                    Some("kv"),
                    Rec::Map {
                        addr: 0x100_0000,
                        bytes: 0x20_0000,
                    },
                ),
                7 => rec.record(0, 0, Rec::Unmap { addr: 0x100_0000 }),
                _ => rec.record(0, 0, Rec::Free { addr: a }),
            }
        }
        WATCHED.with(|w| w.set(false));
        let st = rec.stop();
        assert_eq!(
            ALLOCS.with(Cell::get),
            0,
            "allocations on the recording thread (lossless={lossless})"
        );
        if lossless {
            assert_eq!(st.dropped, 0);
        }
        assert!(st.written + st.dropped >= 20_000 - 10_000, "{st:?}");
    }
}
