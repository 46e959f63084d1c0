//! `Engine::run` end to end on the fake runtime: the sequence each call
//! family gets (served allocations, retry with room, a lost device's reads,
//! residency failures in the call's own error codes).

use std::cell::Cell;

use super::*;
use crate::acl::AclError;
use crate::residency::fake::Fake;
use crate::test_alloc::{unwatched, watched};

const MIB: u64 = 1 << 20;
const CHUNK: u64 = runtime::CHUNK;

struct Shm(std::path::PathBuf);
impl Drop for Shm {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tier-mode engine on a fake device of `hbm_chunks` chunks.
fn engine(name: &str, hbm_chunks: u64) -> (Engine, &'static Fake, Shm) {
    engine_with(name, hbm_chunks, &[])
}

/// `engine` with `more` settings (they override the defaults).
fn engine_with(name: &str, hbm_chunks: u64, more: &[(&str, &str)]) -> (Engine, &'static Fake, Shm) {
    let dir = std::env::temp_dir().join(format!("u3m-engine-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let vars = [
        ("U3M_MODE", "tier"),
        ("U3M_POLICY", "lru"),
        ("U3M_ALLOC_WAIT_MS", "0"),
        ("U3M_MIN_BYTES", "1M"),
        ("U3M_OVERSUB", "16"),
        ("U3M_DRAM_BYTES", "256M"),
        ("U3M_LOG", "quiet"),
    ];
    let mut v: Vec<(String, String)> = vars
        .iter()
        .filter(|(k, _)| !more.iter().any(|m| m.0 == *k))
        .chain(more)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.push(("U3M_SHM_DIR".into(), dir.display().to_string()));
    let cfg = Config::from_vars(v).unwrap();
    let f = Fake::leak(1, hbm_chunks * CHUNK);
    let e = Engine::new(cfg, &["aclrtMalloc"], Some(f)).unwrap();
    (e, f, Shm(dir))
}

fn malloc(e: &Engine, size: u64) -> u64 {
    let mut p = 0u64;
    let call = Call::Malloc {
        api: AllocApi::Malloc,
        policy: 0,
        size,
        out: unsafe { Out::new(&mut p) },
    };
    let rc = e.run(0, &call, &mut || {
        panic!("a managed allocation never reaches the runtime")
    });
    assert_eq!(rc, 0);
    p
}

/// A synchronous host-to-device copy the fake runs.
fn write(e: &Engine, f: &Fake, va: u64, data: &[u8]) -> i32 {
    let call = Call::Copy {
        copy: Memcpy::linear(
            crate::acl::MemcpyKind::HOST_TO_DEVICE,
            va,
            data.as_ptr() as u64,
            data.len() as u64,
        ),
        q: Queue::SYNC,
    };
    e.run(0, &call, &mut || AclError::raw_of(&f.app_write(va, data)))
}

#[test]
fn managed_allocations_are_served_and_observed() {
    let (e, f, _d) = engine("malloc", 4);
    let va = malloc(&e, 3 * MIB);
    assert!(e.residency().unwrap().is_managed(va));
    assert!(
        e.heat().lookup(va + MIB).is_some(),
        "observed as an allocation"
    );
    assert_eq!(write(&e, f, va, &[7u8; 4096]), 0);
    // freed by the manager: the runtime's free is not called
    let rc = e.run(0, &Call::Free { ptr: va }, &mut || {
        panic!("not the runtime's")
    });
    assert_eq!(rc, 0);
    assert!(e.heat().lookup(va).is_none());
    assert_eq!(f.held().0, 0);
}

/// A 4 KiB allocation u3m does not manage, run by the engine, the runtime
/// granting it when `grant(try, free HBM)` says so (tries count from 1):
/// what the program gets back, and the tries made.
fn unmanaged_malloc(e: &Engine, f: &Fake, grant: impl Fn(u32, u64) -> bool) -> (i32, u32) {
    let tries = Cell::new(0);
    let mut p = 0u64;
    let call = Call::Malloc {
        api: AllocApi::Malloc,
        policy: 0,
        size: 4096,
        out: unsafe { Out::new(&mut p) },
    };
    let rc = e.run(0, &call, &mut || {
        tries.set(tries.get() + 1);
        let (free, _) = f.mem_info().unwrap();
        if grant(tries.get(), free) {
            0
        } else {
            AclError::RT_MEMORY_ALLOCATION.raw()
        }
    });
    (rc, tries.get())
}

#[test]
fn an_unmanaged_allocation_refused_for_room_is_retried_after_eviction() {
    let (e, f, _d) = engine("retry", 2);
    let va = malloc(&e, 2 * CHUNK);
    assert_eq!(write(&e, f, va, &vec![1u8; 2 * CHUNK as usize]), 0);
    // a small allocation the runtime makes: refused while managed chunks
    // fill HBM, granted once the engine has evicted
    let (rc, tries) = unmanaged_malloc(&e, f, |_, free| free >= CHUNK);
    assert_eq!(rc, 0);
    assert_eq!(tries, 2, "tried, room made, tried again");
    assert!(e.residency().unwrap().counters().evictions >= 1);
    assert!(f.seen().faults.is_empty() && f.seen().misuse.is_empty());
}

/// An allocation u3m does not manage whose room other threads keep taking
/// (here: the runtime refuses the first six tries whatever is free) goes
/// on having room made for it while managed chunks can move, within
/// `U3M_ALLOC_WAIT_MS` (mt_stress at 8 threads on 48 MiB lost four rounds
/// once in 60 runs under load); once nothing managed can move it gets the
/// runtime's refusal at once, not after the wait. Fails with a fixed four
/// rounds, or if the refusal waits.
#[test]
fn an_unmanaged_allocation_goes_on_having_room_made_while_chunks_can_move() {
    let (e, f, _d) = engine_with("retry-more", 16, &[("U3M_ALLOC_WAIT_MS", "60000")]);
    // every round evicts the allocation's size and a chunk: 2 chunks
    let va = malloc(&e, 16 * CHUNK);
    assert_eq!(write(&e, f, va, &vec![3u8; 16 * CHUNK as usize]), 0);
    let (rc, tries) = unmanaged_malloc(&e, f, |k, free| k > 6 && free >= CHUNK);
    assert_eq!(rc, 0, "granted on the seventh try");
    assert_eq!(tries, 7);
    // nothing left to move: refused without waiting the minute
    let t0 = std::time::Instant::now();
    let (rc, tries) = unmanaged_malloc(&e, f, |_, _| false);
    assert_eq!(rc, AclError::RT_MEMORY_ALLOCATION.raw());
    assert!(tries <= 8, "{tries} tries");
    assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(e.residency().unwrap().usage(0).0, 0, "everything moved out");
    assert!(f.seen().faults.is_empty() && f.seen().misuse.is_empty());
}

/// A two-chunk physical handle of u3m's (a plain aclrtMallocPhysical in
/// tier mode) mapped at a VA the fake reserved: (handle, va).
fn mapped_handle(e: &Engine, f: &Fake) -> (u64, u64) {
    let mut h = 0u64;
    let call = Call::MallocPhysical {
        device: 0,
        size: 2 * CHUNK,
        shareable: false,
        plain: true,
        out: unsafe { Out::new(&mut h) },
    };
    assert_eq!(e.run(0, &call, &mut || panic!("u3m's own handle")), 0);
    let va = f.reserve(2 * CHUNK).unwrap();
    let map = Call::Map {
        va,
        size: 2 * CHUNK,
        offset: 0,
        handle: h,
        flags: 0,
    };
    assert_eq!(e.run(0, &map, &mut || panic!("mapped by the manager")), 0);
    (h, va)
}

/// Exported memory never moves: an unmanaged allocation refused while only
/// exported chunks are resident gets the refusal at once, not after
/// `U3M_ALLOC_WAIT_MS` (it waited the whole minute while anything managed
/// was resident).
#[test]
fn an_unmanaged_allocation_does_not_wait_for_exported_memory_to_move() {
    let (e, f, _d) = engine_with("retry-pinned", 4, &[("U3M_ALLOC_WAIT_MS", "60000")]);
    let (h, va) = mapped_handle(&e, f);
    assert_eq!(write(&e, f, va, &vec![5u8; 2 * CHUNK as usize]), 0);
    let pass = Cell::new(h);
    let exp = Call::ExportHandle {
        handle: h,
        pass: &pass,
    };
    assert_eq!(e.run(0, &exp, &mut || 0), 0);
    assert!(
        e.residency().unwrap().usage(0).0 >= 2 * CHUNK,
        "exported and resident"
    );
    let t0 = std::time::Instant::now();
    let (rc, tries) = unmanaged_malloc(&e, f, |_, _| false);
    assert_eq!(rc, AclError::RT_MEMORY_ALLOCATION.raw());
    assert!(tries <= 8, "{tries} tries");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "waited {:?} for memory that never moves",
        t0.elapsed()
    );
    // and while a movable chunk is resident too, it still makes room
    let other = malloc(&e, CHUNK);
    assert_eq!(write(&e, f, other, &[7u8; 64]), 0);
    let (rc, tries) = unmanaged_malloc(&e, f, |k, free| k > 1 && free >= CHUNK);
    assert_eq!((rc, tries), (0, 2), "room made by moving the managed chunk");
    assert!(f.seen().faults.is_empty() && f.seen().misuse.is_empty());
}

#[test]
fn a_synchronous_read_from_a_lost_device_is_served_from_dram() {
    let (e, f, _d) = engine("lost", 1);
    let x = malloc(&e, CHUNK);
    let y = malloc(&e, CHUNK);
    let px: Vec<u8> = (0..CHUNK).map(|i| (i % 251) as u8).collect();
    assert_eq!(write(&e, f, x, &px), 0);
    assert_eq!(write(&e, f, y, &[9u8; 64]), 0); // x to DRAM
    f.lose();
    let mut out = vec![0u8; 4096];
    let call = Call::Copy {
        copy: Memcpy::linear(
            crate::acl::MemcpyKind::DEVICE_TO_HOST,
            out.as_mut_ptr() as u64,
            x + 8192,
            4096,
        ),
        q: Queue::SYNC,
    };
    // the card answers with ACL_ERROR_RT_DEVICE_TASK_ABORT: the engine
    // learns the device is gone and serves the read from DRAM
    let rc = e.run(0, &call, &mut || AclError::RT_DEVICE_TASK_ABORT.raw());
    assert_eq!(rc, 0);
    assert_eq!(&out[..], &px[8192..8192 + 4096]);
    // y's only copy was in HBM: lost, and said so
    let call = Call::Copy {
        copy: Memcpy::linear(
            crate::acl::MemcpyKind::DEVICE_TO_HOST,
            out.as_mut_ptr() as u64,
            y,
            64,
        ),
        q: Queue::SYNC,
    };
    let rc = e.run(0, &call, &mut || {
        panic!("a known-lost device is not called")
    });
    assert_eq!(rc, AclError::RT_DEVICE_TASK_ABORT.raw());
}

#[test]
fn a_residency_failure_is_returned_in_the_calls_own_codes() {
    let (e, _f, _d) = engine("codes", 1);
    let va = malloc(&e, 2 * CHUNK); // two chunks on a one-chunk device
    let rs = [Range {
        addr: va,
        len: 2 * CHUNK,
        write: true,
        whole: false,
    }];
    let coll = Call::Collective {
        name: b"HcclAllReduce",
        ranges: &rs,
        q: Queue::on(0x5000),
    };
    assert_eq!(e.run(0, &coll, &mut || panic!("not called")), 3); // HCCL_E_MEMORY
    let op = Call::Launch(Launch {
        kind: LaunchKind::Aclop,
        name: Some(b"Add"),
        class: OpClass::Elementwise,
        op_hash: None,
        ranges: &rs,
        resident: None,
        flops: None,
        q: Queue::on(0x5000),
        api: Api::Acl,
    });
    assert_eq!(
        e.run(0, &op, &mut || panic!("not called")),
        AclError::RT_MEMORY_ALLOCATION.raw()
    );
}

#[test]
fn a_vmm_handle_of_u3ms_is_mapped_by_the_manager() {
    let (e, f, _d) = engine("vmm", 4);
    let (h, va) = mapped_handle(&e, f);
    assert_eq!(write(&e, f, va + CHUNK, &[5u8; 100]), 0);
    // a handle exported: the real call receives the real handle
    let pass = Cell::new(h);
    let exp = Call::ExportHandle {
        handle: h,
        pass: &pass,
    };
    assert_eq!(e.run(0, &exp, &mut || 0), 0);
    assert_ne!(pass.get(), h);
    assert_eq!(
        e.run(0, &Call::Unmap { va }, &mut || panic!("manager's")),
        0
    );
    assert_eq!(
        e.run(0, &Call::FreePhysical { handle: h }, &mut || panic!(
            "manager's"
        )),
        0
    );
    assert!(f.seen().faults.is_empty() && f.seen().misuse.is_empty());
}

#[test]
fn a_kernel_with_more_than_64_pointer_arguments_gets_every_one_resident() {
    // 70 allocations pushed out to DRAM by 70 more, then one kernel whose
    // argument blob points at the first 70: each must be resident for it
    // (u3m once scanned at most 64 pointers and launched on the rest unmapped)
    let (e, f, _d) = engine("wide-kernel", 72);
    let first: Vec<u64> = (0..70).map(|_| malloc(&e, CHUNK)).collect();
    for &va in &first {
        assert_eq!(write(&e, f, va, &[1u8; 64]), 0);
    }
    for _ in 0..70 {
        let va = malloc(&e, CHUNK);
        assert_eq!(write(&e, f, va, &[2u8; 64]), 0);
    }
    let blob: Vec<u8> = first.iter().flat_map(|va| va.to_ne_bytes()).collect();
    let call = Call::Kernel {
        blob: &blob,
        q: Queue::SYNC,
        api: Api::Acl,
    };
    let rc = e.run(0, &call, &mut || {
        // the kernel touches every argument
        for &va in &first {
            if let Err(err) = f.app_write(va, &[3u8; 8]) {
                return err.raw();
            }
        }
        0
    });
    assert_eq!(rc, 0, "a kernel argument was not resident");
    assert!(f.seen().faults.is_empty(), "{:?}", f.seen().faults);
}

/// A launch whose hook classified the name (`op_hash: Some`) leaves the
/// same heat as one the engine classifies itself: the hook's class and hash
/// are the name's (the heat records' class and operator bits).
#[test]
fn a_name_classified_by_the_hook_leaves_the_heat_the_engine_would() {
    let name: &[u8] = b"MatMulV2";
    let (class, hash) = opclass::classify_bytes(name);
    assert_ne!(class, OpClass::Other, "a name with a class of its own");
    let heat_after = |op_hash: Option<u64>, tag: &str| {
        let (e, _f, _d) = engine(tag, 4);
        let va = malloc(&e, 3 * MIB);
        let rs = [
            Range {
                addr: va,
                len: 64 << 10,
                write: false,
                whole: false,
            },
            Range {
                addr: va + MIB,
                len: 64 << 10,
                write: true,
                whole: false,
            },
        ];
        let op = Call::Launch(Launch {
            kind: LaunchKind::Aclop,
            name: Some(name),
            class,
            op_hash,
            ranges: &rs,
            resident: None,
            flops: None,
            q: Queue::on(0x5000),
            api: Api::Acl,
        });
        assert_eq!(e.run(0, &op, &mut || 0), 0);
        let id = e.heat().lookup(va).unwrap().0;
        let s = e.heat().alloc_info(id).unwrap().stats;
        (s.accesses, s.classes, s.op_bits, s.last_write_seq)
    };
    let engine_classified = heat_after(None, "classify-engine");
    assert!(engine_classified.0 > 0, "{engine_classified:?}");
    assert_eq!(heat_after(Some(hash), "classify-hook"), engine_classified);
    // a hash that is not the name's shows (the comparison can fail)
    assert_ne!(
        heat_after(Some(opclass::classify_bytes(b"Add").1), "classify-other"),
        engine_classified
    );
}

/// The counters after N calls from M threads, as the stats segment's
/// reader (`u3m stat`) and the residency snapshot show them: every hooked
/// call counted once, every operator launch once on its device, every
/// managed chunk it touched accounted for once per call (the policy's
/// clock), nothing pinned or in progress afterwards. Fails when a thread's
/// count is lost or counted twice (per-thread counting, BENCHMARKS.md
/// `fast4`).
#[test]
fn counters_after_calls_from_threads_are_exact() {
    const M: usize = 6;
    const N: usize = 400;
    let (e, _f, d) = engine("threads", 64);
    let e: &'static Engine = Box::leak(Box::new(e));
    let vas: Vec<u64> = (0..4).map(|_| malloc(e, 3 * MIB)).collect();
    let clock0 = e.residency().unwrap().now();
    let hs: Vec<_> = (0..M)
        .map(|k| {
            let vas = vas.clone();
            std::thread::spawn(move || {
                // half the threads count in rows of their own (the glue's
                // threads: guard.rs), half in the shared counts
                let row = if k % 2 == 0 {
                    Some(e.take_thread_calls().expect("a free row"))
                } else {
                    None
                };
                for i in 0..N {
                    let rs: Vec<Range> = vas
                        .iter()
                        .enumerate()
                        .map(|(j, &va)| Range {
                            addr: va + ((i + k) as u64 % 3) * MIB,
                            len: 64 << 10,
                            write: j == 3,
                            whole: false,
                        })
                        .collect();
                    // a row's thread launches as the aclop hook does: the
                    // name classified already (its launches go `op_here`)
                    let named = classify(b"Add");
                    let op = Call::Launch(Launch {
                        kind: LaunchKind::Aclop,
                        name: Some(b"Add"),
                        class: if row.is_some() {
                            named.0
                        } else {
                            OpClass::Other
                        },
                        op_hash: row.map(|_| named.1),
                        ranges: &rs,
                        resident: None,
                        flops: None,
                        q: Queue::on(0x5000 + k as u64),
                        api: Api::Acl,
                    });
                    // the hook's count, then the engine call (hooks/mod.rs)
                    e.count_call_in(row, 0);
                    // and the thread's `Here` kept, as the glue hands it down
                    let here = row.and_then(|_| Here::now());
                    assert_eq!(e.run_in(0, &op, row, here, &mut || 0), 0);
                }
                if let Some(row) = row {
                    row.give_back();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let calls = (M * N) as u64;
    let path = std::fs::read_dir(&d.0)
        .unwrap()
        .map(|f| f.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("u3m."))
        .expect("the stats segment");
    let s = crate::shm::SegmentReader::open(&path).unwrap().snapshot();
    let counted: Vec<(&str, u64)> = s.calls.iter().map(|c| (c.name.as_str(), c.count)).collect();
    assert_eq!(counted, vec![("aclrtMalloc", calls)], "hooked calls");
    assert_eq!(s.devices[0].get("launches.ops"), calls, "operator launches");
    // one tick of the residency clock per call that touched managed memory
    assert_eq!(
        e.residency().unwrap().now() - clock0,
        calls,
        "residency clock"
    );
    // the heat table saw every call's four ranges
    let touched: u64 = vas
        .iter()
        .map(|&va| {
            let id = e.heat().lookup(va).unwrap().0;
            e.heat().alloc_info(id).unwrap().stats.accesses
        })
        .sum();
    assert_eq!(touched, 4 * calls, "heat accesses");
}

/// The fake runtime with its own work unwatched: what it allocates to keep
/// its books is not u3m's.
struct Unwatched(&'static Fake);

impl Runtime for Unwatched {
    fn set_device(&self, dev: u32) -> Result<(), AclError> {
        unwatched(|| self.0.set_device(dev))
    }
    fn current_device(&self) -> Option<u32> {
        unwatched(|| self.0.current_device())
    }
    fn current_context(&self) -> Option<u64> {
        unwatched(|| self.0.current_context())
    }
    fn set_context(&self, ctx: u64) -> Result<(), AclError> {
        unwatched(|| self.0.set_context(ctx))
    }
    fn malloc_physical(&self, dev: u32, bytes: u64) -> Result<u64, AclError> {
        unwatched(|| self.0.malloc_physical(dev, bytes))
    }
    fn free_physical(&self, handle: u64) -> Result<(), AclError> {
        unwatched(|| self.0.free_physical(handle))
    }
    fn malloc_physical_host(&self, dev: u32, bytes: u64) -> Result<u64, AclError> {
        unwatched(|| self.0.malloc_physical_host(dev, bytes))
    }
    fn reserve(&self, bytes: u64) -> Result<u64, AclError> {
        unwatched(|| self.0.reserve(bytes))
    }
    fn release(&self, va: u64) -> Result<(), AclError> {
        unwatched(|| self.0.release(va))
    }
    fn map(&self, va: u64, bytes: u64, handle: u64) -> Result<(), AclError> {
        unwatched(|| self.0.map(va, bytes, handle))
    }
    fn unmap(&self, va: u64) -> Result<(), AclError> {
        unwatched(|| self.0.unmap(va))
    }
    fn create_stream(&self) -> Result<u64, AclError> {
        unwatched(|| self.0.create_stream())
    }
    fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        kind: crate::acl::MemcpyKind,
        stream: u64,
    ) -> Result<(), AclError> {
        unwatched(|| self.0.memcpy_async(dst, src, bytes, kind, stream))
    }
    fn memset_async(&self, dst: u64, bytes: u64, value: u8, stream: u64) -> Result<(), AclError> {
        unwatched(|| self.0.memset_async(dst, bytes, value, stream))
    }
    fn sync_stream(&self, stream: u64) -> Result<(), AclError> {
        unwatched(|| self.0.sync_stream(stream))
    }
    fn create_event(&self) -> Result<u64, AclError> {
        unwatched(|| self.0.create_event())
    }
    fn record_event(&self, event: u64, stream: u64) -> Result<(), AclError> {
        unwatched(|| self.0.record_event(event, stream))
    }
    fn event_done(&self, event: u64) -> Result<bool, AclError> {
        unwatched(|| self.0.event_done(event))
    }
    fn sync_event(&self, event: u64) -> Result<(), AclError> {
        unwatched(|| self.0.sync_event(event))
    }
    fn stream_wait(&self, stream: u64, event: u64) -> Result<(), AclError> {
        unwatched(|| self.0.stream_wait(stream, event))
    }
    fn elapsed_ns(&self, start: u64, end: u64) -> Result<u64, AclError> {
        unwatched(|| self.0.elapsed_ns(start, end))
    }
    fn malloc_host(&self, bytes: u64) -> Result<*mut u8, AclError> {
        unwatched(|| self.0.malloc_host(bytes))
    }
    fn free_host(&self, ptr: *mut u8) -> Result<(), AclError> {
        unwatched(|| self.0.free_host(ptr))
    }
    fn mem_info(&self) -> Result<(u64, u64), AclError> {
        unwatched(|| self.0.mem_info())
    }
}

/// Issue 10 part 2: tier mode's calls with nothing to move — copies,
/// memsets, operator launches, collectives on managed memory all resident —
/// make no heap allocation on the calling thread, with the library's
/// policy, in steady state (after each call's first run, which may grow a
/// table). Without the applier thread (`applier`: false) the calling thread
/// applies its own heat and policy buffers when they fill, so that path is
/// covered too.
fn tier_calls_with_nothing_to_move_do_not_allocate(applier: bool) {
    let dir = std::env::temp_dir().join(format!(
        "u3m-engine-noalloc-tier-{}-{applier}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let _d = Shm(dir.clone());
    let cfg = Config::from_vars([
        ("U3M_MODE".to_string(), "tier".to_string()),
        ("U3M_POLICY".to_string(), "predictive".to_string()),
        ("U3M_LOG".to_string(), "quiet".to_string()),
        ("U3M_SHM_DIR".to_string(), dir.display().to_string()),
    ])
    .unwrap();
    let f = Fake::leak(1, 64 * CHUNK);
    let rt: &'static Unwatched = Box::leak(Box::new(Unwatched(f)));
    let e: &'static Engine = Box::leak(Box::new(
        Engine::new(cfg, &["aclopExecuteV2"], Some(rt)).unwrap(),
    ));
    if applier {
        e.start_background();
    }
    let a = malloc(e, 4 * CHUNK);
    let b = malloc(e, 4 * CHUNK);
    assert!(e.residency().unwrap().is_managed(a) && e.residency().unwrap().is_managed(b));
    let host = vec![5u8; 4096];
    let mut back = vec![0u8; 4096];
    let s = f.app_stream();
    let ranges = [
        Range {
            addr: a,
            len: MIB,
            write: false,
            whole: false,
        },
        Range {
            addr: a + CHUNK + 4096,
            len: CHUNK,
            write: false,
            whole: false,
        },
        Range {
            addr: b,
            len: 3 * MIB,
            write: true,
            whole: false,
        },
        Range {
            addr: b + 3 * CHUNK,
            len: 4096,
            write: true,
            whole: false,
        },
    ];
    let copies = [
        Memcpy::linear(
            crate::acl::MemcpyKind::HOST_TO_DEVICE,
            a + 2 * CHUNK,
            host.as_ptr() as u64,
            4096,
        ),
        Memcpy::linear(crate::acl::MemcpyKind::DEVICE_TO_DEVICE, b + CHUNK, a, MIB),
    ];
    let blob: Vec<u8> = [a + 100, 0, b + CHUNK + 8]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let calls = [
        Call::Copy {
            copy: copies[0],
            q: Queue::on(s),
        },
        Call::Kernel {
            blob: &blob,
            q: Queue::on(s),
            api: Api::Acl,
        },
        Call::Memset {
            addr: a + 3 * CHUNK,
            bytes: 4096,
            q: Queue::SYNC,
        },
        Call::Copy {
            copy: Memcpy::linear(
                crate::acl::MemcpyKind::DEVICE_TO_HOST,
                back.as_mut_ptr() as u64,
                a + 2 * CHUNK,
                4096,
            ),
            q: Queue::SYNC,
        },
        Call::CopyBatch {
            copies: &copies,
            q: Queue::on(s),
        },
        Call::Memset {
            addr: b + 2 * CHUNK,
            bytes: 3 * MIB,
            q: Queue::on(s),
        },
        Call::Launch(Launch {
            kind: LaunchKind::Aclop,
            name: Some(b"MatMulV2"),
            class: OpClass::MatMul,
            op_hash: None,
            ranges: &ranges,
            resident: None,
            flops: Some(1 << 30),
            q: Queue::on(s),
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
            q: Queue::on(s),
            api: Api::Aclnn,
        }),
        Call::Collective {
            name: b"HcclAllReduce",
            ranges: &ranges[2..],
            q: Queue::on(s),
        },
    ];
    // every chunk resident (the fake's HBM holds them all). The calls
    // repeat as a step: the first steps grow the tables the model keeps
    // (bounded), then a step allocates nothing
    let step = || {
        for c in &calls {
            assert_eq!(e.run(0, c, &mut || 0), 0, "{c:?}");
        }
    };
    for _ in 0..100 {
        step();
    }
    let moved = |f: &Fake| {
        let s = f.seen();
        (s.h2d_bytes, s.d2h_bytes)
    };
    let before = moved(f);
    let n = watched(|| {
        for _ in 0..300 {
            step();
        }
    });
    assert_eq!(
        n,
        0,
        "{n} allocations in 300 steps of {} calls",
        calls.len()
    );
    assert_eq!(moved(f), before, "nothing was to move");
    let c = e.residency().unwrap().counters();
    assert_eq!(c.evictions, 0);
    e.shutdown();
}

#[test]
fn tier_calls_with_nothing_to_move_do_not_allocate_with_the_applier() {
    tier_calls_with_nothing_to_move_do_not_allocate(true);
}

#[test]
fn tier_calls_with_nothing_to_move_do_not_allocate_on_their_own_thread() {
    tier_calls_with_nothing_to_move_do_not_allocate(false);
}

/// A batch copy makes every copy's memory resident before the runtime runs
/// it, whether its ranges are gathered on the stack (up to 16 copies) or in
/// a Vec (more): each batch writes an evicted chunk, and the fake faults a
/// write to memory not mapped in HBM.
#[test]
fn a_batch_copy_makes_every_copy_resident_on_the_stack_or_not() {
    for n in [3usize, 20] {
        let (e, f, _d) = engine(&format!("batch{n}"), 2);
        let x = malloc(&e, CHUNK);
        let y = malloc(&e, CHUNK);
        let z = malloc(&e, CHUNK);
        for (va, v) in [(x, 1u8), (y, 2), (z, 3)] {
            assert_eq!(write(&e, f, va, &[v; 4096]), 0); // x leaves HBM for z
        }
        let data: Vec<Vec<u8>> = (0..n).map(|k| vec![10 + k as u8; 4096]).collect();
        // the last copy goes to x: its range is the batch's last
        let copies: Vec<Memcpy> = (0..n)
            .map(|k| {
                let dst = if k + 1 == n { x } else { y } + 8192 * k as u64;
                Memcpy::linear(
                    crate::acl::MemcpyKind::HOST_TO_DEVICE,
                    dst,
                    data[k].as_ptr() as u64,
                    4096,
                )
            })
            .collect();
        let call = Call::CopyBatch {
            copies: &copies,
            q: Queue::SYNC,
        };
        let rc = e.run(0, &call, &mut || {
            for (c, d) in copies.iter().zip(&data) {
                let rc = AclError::raw_of(&f.app_write(c.dst, d));
                if rc != 0 {
                    return rc;
                }
            }
            0
        });
        assert_eq!(rc, 0, "{n} copies");
        assert!(
            f.seen().faults.is_empty(),
            "{n} copies: {:?}",
            f.seen().faults
        );
        let last = x + 8192 * (n as u64 - 1);
        assert_eq!(f.app_read(last, 4096).unwrap(), data[n - 1], "{n} copies");
    }
}
