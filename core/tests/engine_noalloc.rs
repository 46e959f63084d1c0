//! Observe mode's whole per-call path — `Engine::run` for copies, memsets,
//! launches, collectives, kernels, small batches — never allocates, counted
//! by a global allocator watching the calling thread. (The heat table alone:
//! heat_noalloc.rs.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use u3m_core::acl::MemcpyKind;
use u3m_core::config::Config;
use u3m_core::engine::{AllocApi, Api, Call, Engine, Launch, LaunchKind, Memcpy, Queue, Range};
use u3m_core::opclass::OpClass;

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

const MIB: u64 = 1 << 20;
const B: u64 = 0x1000_0000_0000;

fn watched(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    WATCHED.with(|w| w.set(true));
    f();
    WATCHED.with(|w| w.set(false));
    ALLOCS.with(Cell::get) - before
}

#[test]
fn observe_mode_calls_do_not_allocate() {
    let dir = std::env::temp_dir().join(format!("u3m-engine-noalloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = Config::from_vars([
        ("U3M_MODE".to_string(), "observe".to_string()),
        ("U3M_SHM_DIR".to_string(), dir.display().to_string()),
    ])
    .unwrap();
    let e = Engine::new(cfg, &["aclrtMemcpy"], None).unwrap();
    e.alloc(0, B, 64 * MIB, AllocApi::Malloc);
    e.alloc(0, B + 64 * MIB, 64 * MIB, AllocApi::Malloc);
    let host = vec![0u8; 4096];
    let ranges = [
        Range {
            addr: B,
            len: MIB,
            write: false,
            whole: false,
        },
        Range {
            addr: B + 2 * MIB,
            len: 4096,
            write: false,
            whole: false,
        },
        Range {
            addr: B + 64 * MIB,
            len: 3 * MIB,
            write: true,
            whole: false,
        },
    ];
    let blob: Vec<u8> = [B + 100, 0, B + 64 * MIB + 8]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let copies = [
        Memcpy::linear(MemcpyKind::HOST_TO_DEVICE, B, host.as_ptr() as u64, 4096),
        Memcpy::linear(MemcpyKind::DEVICE_TO_DEVICE, B + 64 * MIB, B, MIB),
    ];
    let calls = [
        Call::Copy {
            copy: copies[0],
            q: Queue::on(0x5000),
        },
        Call::Copy {
            copy: copies[1],
            q: Queue::SYNC,
        },
        Call::Copy {
            copy: Memcpy::pitched(MemcpyKind::DEVICE_TO_HOST, 0x7000, 512, B, 1024, 256, 16),
            q: Queue::SYNC,
        },
        Call::CopyBatch {
            copies: &copies,
            q: Queue::on(0x5000),
        },
        Call::Memset {
            addr: B + 5 * MIB,
            bytes: 3 * MIB,
            q: Queue::SYNC,
        },
        Call::Launch(Launch {
            kind: LaunchKind::Aclop,
            name: Some(b"MatMulV2"),
            class: OpClass::MatMul,
            op_hash: None,
            ranges: &ranges,
            resident: None,
            flops: Some(1 << 30),
            q: Queue::on(0x5000),
            api: Api::Acl,
        }),
        Call::Launch(Launch {
            kind: LaunchKind::Aclnn,
            name: Some(b"aclnnAdd"),
            class: OpClass::Elementwise,
            op_hash: None,
            ranges: &ranges,
            resident: None,
            flops: None,
            q: Queue::on(0x6000),
            api: Api::Aclnn,
        }),
        Call::Collective {
            name: b"HcclAllReduce",
            ranges: &ranges[1..],
            q: Queue::on(0x5000),
        },
        Call::Kernel {
            blob: &blob,
            q: Queue::on(0x5000),
            api: Api::Acl,
        },
    ];
    // first touches may grow the heat table's range table: warm up once
    for c in &calls {
        assert_eq!(e.run(0, c, &mut || 0), 0);
    }
    for c in &calls {
        let n = watched(|| {
            for _ in 0..100 {
                assert_eq!(e.run(0, c, &mut || 0), 0);
            }
        });
        assert_eq!(n, 0, "{c:?} allocated");
    }
    e.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
