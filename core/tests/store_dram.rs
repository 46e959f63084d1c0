//! The DRAM store over an mmap-backed stand-in for aclrtMallocHost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use u3m_core::store::dram::{DramSlot, DramStore, HostAllocator};
use u3m_core::store::StoreError;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

#[derive(Default)]
struct HostState {
    live: HashMap<usize, usize>,
    allocs: u64,
    frees: u64,
    /// Refuse requests above this many bytes (pinned memory is short).
    refuse_above: Option<usize>,
}

#[derive(Clone, Default)]
struct MmapHost(Arc<Mutex<HostState>>);

impl HostAllocator for MmapHost {
    fn alloc(&self, bytes: usize) -> Result<*mut u8, i32> {
        let mut s = self.0.lock().unwrap();
        if s.refuse_above.is_some_and(|m| bytes > m) {
            return Err(207001);
        }
        // SAFETY: anonymous private mapping, no preconditions.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(-12);
        }
        s.live.insert(p as usize, bytes);
        s.allocs += 1;
        Ok(p as *mut u8)
    }

    fn free(&self, ptr: *mut u8, bytes: usize) {
        let mut s = self.0.lock().unwrap();
        assert_eq!(
            s.live.remove(&(ptr as usize)),
            Some(bytes),
            "free of a region not handed out"
        );
        s.frees += 1;
        // SAFETY: the region came from mmap above with this length.
        unsafe { libc::munmap(ptr as *mut libc::c_void, bytes) };
    }
}

impl MmapHost {
    fn live_bytes(&self) -> usize {
        self.0.lock().unwrap().live.values().sum()
    }
    fn live_slabs(&self) -> usize {
        self.0.lock().unwrap().live.len()
    }
}

fn fill(slot: &DramSlot, tag: u8) {
    // SAFETY: the slot is live and only this test touches it.
    unsafe { slot.as_mut_slice() }
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = tag ^ (i as u8));
}

fn intact(slot: &DramSlot, tag: u8) -> bool {
    // SAFETY: the slot is live.
    unsafe { slot.as_slice() }
        .iter()
        .enumerate()
        .all(|(i, &b)| b == tag ^ (i as u8))
}

#[test]
fn grows_by_slabs_and_slots_do_not_overlap() {
    let host = MmapHost::default();
    let mut t = DramStore::new(4 * MIB, MIB, host.clone());
    assert_eq!(
        (t.capacity(), host.live_slabs()),
        (0, 0),
        "nothing until the first alloc"
    );
    let slots: Vec<DramSlot> = (0..16).map(|_| t.alloc(64 * KIB).unwrap()).collect();
    assert_eq!((t.capacity(), host.live_slabs()), (MIB, 1));
    let more = t.alloc(64 * KIB).unwrap();
    assert_eq!((t.capacity(), host.live_slabs()), (2 * MIB, 2));
    for (i, s) in slots.iter().chain([&more]).enumerate() {
        assert_eq!(s.ptr as usize % 32, 0);
        fill(s, i as u8);
    }
    for (i, s) in slots.iter().chain([&more]).enumerate() {
        assert!(intact(s, i as u8), "slot {i} overwritten by a neighbour");
    }
    assert_eq!(t.used(), 17 * 64 * KIB);
    assert!((t.fill_fraction() - (17.0 * 64.0 / 4096.0)).abs() < 1e-12);
    let st = t.stats();
    assert_eq!(
        (st.allocs, st.segments, st.grows, st.limit),
        (17, 2, 2, 4 * MIB)
    );
}

#[test]
fn full_at_the_limit_never_beyond() {
    let host = MmapHost::default();
    let mut t = DramStore::new(3 * MIB, 2 * MIB, host.clone());
    assert_eq!(t.alloc(3 * MIB + 1), Err(StoreError::Full));
    let mut n = 0;
    loop {
        match t.alloc(256 * KIB) {
            Ok(_) => n += 1,
            Err(e) => {
                assert_eq!(e, StoreError::Full);
                break;
            }
        }
    }
    assert_eq!(n, 12, "3 MiB of 256 KiB slots");
    assert_eq!(t.capacity(), 3 * MIB, "second slab clipped to the limit");
    assert!(host.live_bytes() as u64 <= 3 * MIB);
    assert_eq!(t.fill_fraction(), 1.0);
}

#[test]
fn big_request_gets_its_own_slab() {
    let host = MmapHost::default();
    let mut t = DramStore::new(64 * MIB, MIB, host.clone());
    let s = t.alloc(5 * MIB).unwrap();
    assert_eq!(t.capacity(), 5 * MIB);
    fill(&s, 7);
    assert!(intact(&s, 7));
    t.free(s).unwrap();
}

#[test]
fn shrink_returns_only_empty_slabs() {
    let host = MmapHost::default();
    let mut t = DramStore::new(8 * MIB, MIB, host.clone());
    let a: Vec<DramSlot> = (0..4).map(|_| t.alloc(256 * KIB).unwrap()).collect();
    let b: Vec<DramSlot> = (0..4).map(|_| t.alloc(256 * KIB).unwrap()).collect();
    let c = t.alloc(256 * KIB).unwrap();
    assert_eq!(host.live_slabs(), 3);
    fill(&c, 9);
    for s in b {
        t.free(s).unwrap();
    }
    assert_eq!(t.shrink(), MIB, "only the second slab is empty");
    assert_eq!((host.live_slabs(), t.capacity()), (2, 2 * MIB));
    assert!(intact(&c, 9), "live slot survives a shrink");
    for s in a {
        t.free(s).unwrap();
    }
    t.free(c).unwrap();
    assert_eq!(t.shrink(), 2 * MIB);
    assert_eq!((host.live_slabs(), t.capacity(), t.used()), (0, 0, 0));
    let st = t.stats();
    assert_eq!((st.grows, st.releases, st.segments), (3, 3, 0));
    // It grows again after shrinking to nothing.
    let d = t.alloc(100).unwrap();
    assert_eq!(host.live_slabs(), 1);
    t.free(d).unwrap();
}

#[test]
fn bad_frees_are_errors() {
    let mut t = DramStore::new(4 * MIB, MIB, MmapHost::default());
    let s = t.alloc(1000).unwrap();
    let copy = DramSlot {
        ptr: s.ptr,
        len: s.len,
    };
    let inner = DramSlot {
        ptr: s.ptr.wrapping_add(32),
        len: 32,
    };
    let foreign = DramSlot {
        ptr: 0x1000 as *mut u8,
        len: 32,
    };
    assert_eq!(t.free(inner), Err(StoreError::BadSlot));
    assert_eq!(t.free(foreign), Err(StoreError::BadSlot));
    t.free(s).unwrap();
    assert_eq!(t.free(copy), Err(StoreError::BadSlot));
    assert_eq!(t.used(), 0);
}

#[test]
fn short_pinned_memory_halves_the_slab() {
    let host = MmapHost::default();
    host.0.lock().unwrap().refuse_above = Some(600 * KIB as usize);
    let mut t = DramStore::new(64 * MIB, 4 * MIB, host.clone());
    let s = t.alloc(100 * KIB).unwrap();
    // 4 MiB, 2 MiB and 1 MiB refused; 512 KiB taken.
    assert_eq!(t.capacity(), 512 * KIB);
    assert_eq!(t.stats().grow_failures, 3);
    assert_eq!(t.alloc(700 * KIB), Err(StoreError::HostAlloc(207001)));
    t.free(s).unwrap();
}

#[test]
fn fragmentation_in_stats() {
    let mut t = DramStore::new(4 * MIB, MIB, MmapHost::default());
    let slots: Vec<DramSlot> = (0..8).map(|_| t.alloc(128 * KIB).unwrap()).collect();
    let mut kept = Vec::new();
    for (i, s) in slots.into_iter().enumerate() {
        if i % 2 == 0 {
            t.free(s).unwrap();
        } else {
            kept.push(s);
        }
    }
    let st = t.stats();
    // Four separate 128 KiB holes: largest / total free = 1/4.
    assert_eq!(
        (st.free_blocks, st.largest_free, st.free),
        (4, 128 * KIB, 512 * KIB)
    );
    assert!((st.fragmentation - 0.75).abs() < 1e-12);
}

#[test]
fn drop_returns_every_slab_and_boxed_allocator_works() {
    let host = MmapHost::default();
    {
        let mut t: DramStore = DramStore::new(8 * MIB, MIB, Box::new(host.clone()));
        let _a = t.alloc(900 * KIB).unwrap();
        let _b = t.alloc(900 * KIB).unwrap();
        assert_eq!(host.live_slabs(), 2);
    }
    assert_eq!(host.live_slabs(), 0);
    let s = host.0.lock().unwrap();
    assert_eq!((s.allocs, s.frees), (2, 2));
}

#[test]
fn store_and_slots_are_send() {
    fn send<T: Send>() {}
    send::<DramStore>();
    send::<DramStore<MmapHost>>();
    send::<DramSlot>();
}

/// Figures for the report: `cargo test --release -p u3m-core --test store_dram
/// -- --ignored --nocapture`.
#[test]
#[ignore]
fn dram_timing() {
    use std::time::Instant;
    let mut t = DramStore::new(8 << 30, 256 * MIB, MmapHost::default());
    // Eviction-shaped: 2 MiB chunks, 2000 live, random frees and re-allocs.
    let mut live: Vec<DramSlot> = (0..2000).map(|_| t.alloc(2 * MIB).unwrap()).collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let (mut ta, mut tf, n) = (0u128, 0u128, 200_000u32);
    for _ in 0..n {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let s = live.swap_remove(rng as usize % live.len());
        let t0 = Instant::now();
        t.free(s).unwrap();
        tf += t0.elapsed().as_nanos();
        let t0 = Instant::now();
        live.push(t.alloc(2 * MIB).unwrap());
        ta += t0.elapsed().as_nanos();
    }
    println!(
        "dram 2 MiB slots, 2000 live in 16 slabs: alloc {:.0} ns, free {:.0} ns; fragmentation {:.3}",
        ta as f64 / n as f64,
        tf as f64 / n as f64,
        t.stats().fragmentation
    );
}
