//! Residency at the same address: managed device memory is a set of 2 MiB
//! chunks that live in HBM (mapped at their VA), in pinned DRAM or in an NVMe
//! swap file, and are brought back before anything touches them.
//!
//! A *backing* is what the program allocated: an aclrtMalloc-family
//! allocation (u3m reserves the VA itself and keeps it mapped for its whole
//! life) or a physical handle u3m handed out for aclrtMallocPhysical (mapped
//! wherever the program maps it). Each chunk of a backing is in one of:
//!   unbacked     never touched: no memory anywhere (reads as fresh memory)
//!   resident     a physical 2 MiB handle, mapped at every VA of the backing;
//!                maybe with a clean host copy (`host`, `dirty == false`)
//!   host         only in DRAM or NVMe (`host`)
//! Invariants: a chunk is never unmapped while a call that may touch it is in
//! flight (`pins` during the call, `uses`: per-stream events recorded after
//! it, all complete before eviction); a chunk a call needs is never evicted
//! for that call; pinned backings (IPC-exported) never move.
//! All state is behind one mutex: this is the slow path of tier mode; the
//! heat table stays lock-free.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use super::runtime::{Runtime, CHUNK, MEMCPY_D2D, MEMCPY_D2H, MEMCPY_H2D};
use super::Range;
use crate::config::Config;
use crate::policy::{Cand, HeatFn, Place, Placement};
use crate::shm::layout::{stall_bucket, STALL_BUCKETS};
use crate::tier::dram::{DramSlot, DramTier, HostAllocator};
use crate::tier::nvme::{NvmeSlot, NvmeTier};
use crate::tier::TierError;

pub const MAX_DEVICES: usize = 16;
/// How far ahead (tracked calls) the background prefetch looks: it brings
/// back what the policy expects within this many calls.
pub const BACKGROUND_HORIZON: u64 = 256;
/// Background eviction leaves every chunk the policy expects within this
/// many calls (about a training step of a mid-sized model): under a cyclic
/// working set larger than HBM such a chunk would come straight back, and the
/// headroom would only shrink the cache. Demand eviction still makes room.
pub const KEEP_HORIZON: u64 = 4096;
const E_ALLOC: i32 = 207001; // ACL_ERROR_RT_MEMORY_ALLOCATION
const E_PARAM: i32 = 107000;
/// ACL_ERROR_RT_DEVICE_TASK_ABORT: what the runtime returns for a device
/// that has gone away.
pub const E_DEVICE_LOST: i32 = 107022;
/// Internal: nothing can move right now because other calls hold what is
/// resident; the caller drops the lock and tries again.
const E_BUSY: i32 = -1;

enum Host {
    Dram(DramSlot),
    Nvme(NvmeSlot),
}

#[derive(Default)]
struct Chunk {
    /// Physical handle while resident (0: not in HBM).
    phys: u64,
    /// A host copy: the only copy when not resident; a clean copy when
    /// resident and not dirty.
    host: Option<Host>,
    dirty: bool,
    /// Calls in progress that need it.
    pins: u32,
    /// (stream, event) recorded after the latest use on each stream.
    uses: Vec<(u64, u64)>,
    /// LRU clock of the latest use.
    last: u64,
    /// Its only current copy was in the HBM of a device that disappeared.
    lost: bool,
    /// Brought back by the background prefetch and not used since.
    prefetched: bool,
}

enum Kind {
    /// aclrtMalloc family: VA reserved by u3m, mapped at `va` for life.
    Malloc,
    /// A handle u3m handed out for aclrtMallocPhysical.
    Vmm,
}

struct Backing {
    dev: u32,
    kind: Kind,
    size: u64,
    chunks: Vec<Chunk>,
    /// VAs the backing is mapped at (Malloc: exactly its own).
    vas: Vec<u64>,
    pinned: bool,
    /// A real physical handle of the backing's whole size that replaced its
    /// chunks (a multi-chunk VMM handle exported for IPC): mapped whole,
    /// never moves; 0 otherwise.
    real: u64,
}

struct Dev {
    /// u3m's own stream for migrations (0: not created yet).
    stream: u64,
    /// A 2 MiB pinned staging buffer for NVMe transfers.
    staging: u64,
    /// A 2 MiB VA for copying out chunks of unmapped VMM handles.
    scratch_va: u64,
    resident: u64,
    managed_virtual: u64,
    capacity: u64,
    /// The device disappeared (card failure): its HBM is gone, nothing on it
    /// is called again; chunks with a current host copy stay readable.
    lost: bool,
}

impl Dev {
    const fn new() -> Dev {
        Dev {
            stream: 0,
            staging: 0,
            scratch_va: 0,
            resident: 0,
            managed_virtual: 0,
            capacity: 0,
            lost: false,
        }
    }
}

struct State {
    backings: HashMap<u64, Backing>,
    next_id: u64,
    /// VA start -> (backing id, bytes) for every mapped backing.
    vas: BTreeMap<u64, (u64, u64)>,
    devs: [Dev; MAX_DEVICES],
    dram: DramTier<Box<dyn HostAllocator>>,
    nvme: Option<NvmeTier>,
    /// event -> number of chunk uses referring to it; free events
    event_refs: HashMap<u64, u32>,
    free_events: Vec<u64>,
    clock: u64,
    recently_freed: std::collections::VecDeque<u64>,
    /// Host slots no longer needed that an issued copy-in may still be
    /// reading: given back only after u3m's streams are synchronised.
    pending_free: Vec<Host>,
    /// An event an eviction must see complete (waited for without the lock).
    wait_for: Option<u64>,
    /// CLOCK_MONOTONIC when the current call's first absent chunk was met
    /// (its fault-in stall starts there); taken by `prepare`.
    stall_from: Option<u64>,
}

/// Figures for the stats segment and tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct TierCounters {
    pub faults_in: u64,
    pub fault_bytes: u64,
    pub evictions: u64,
    pub eviction_bytes: u64,
    pub clean_drops: u64,
    pub to_dram: u64,
    pub to_nvme: u64,
    pub from_nvme: u64,
    /// Chunks the background spill moved from DRAM to NVMe (part of to_nvme).
    pub spilled: u64,
    pub overwrites: u64,
    pub spill_errors: u64,
    /// Chunks brought back ahead of use by the background prefetch.
    pub prefetches: u64,
    pub prefetch_bytes: u64,
    /// Prefetched chunks a call then used while still resident.
    pub prefetch_hits: u64,
    /// Calls that waited for fault-ins, their total wait (ns) and its
    /// histogram (shm::layout::STALL_BOUNDS buckets).
    pub stall_count: u64,
    pub stall_ns: u64,
    pub stall_buckets: [u64; STALL_BUCKETS],
}

pub struct Tier {
    rt: &'static dyn Runtime,
    policy: Box<dyn Placement>,
    /// bytes/s the background spill from DRAM to NVMe may write (U3M_SSD_RATE)
    ssd_rate: u64,
    st: Mutex<State>,
    min_bytes: u64,
    oversub: f64,
    dram_limit: u64,
    nvme_limit: u64,
    alloc_wait_ms: u64,
    /// Backings alive: the hot path skips everything when 0.
    live: AtomicU64,
    pub faults_in: AtomicU64,
    pub fault_bytes: AtomicU64,
    pub evictions: AtomicU64,
    pub eviction_bytes: AtomicU64,
    pub clean_drops: AtomicU64,
    pub to_dram: AtomicU64,
    pub to_nvme: AtomicU64,
    pub from_nvme: AtomicU64,
    pub spilled: AtomicU64,
    pub overwrites: AtomicU64,
    pub spill_errors: AtomicU64,
    pub prefetches: AtomicU64,
    pub prefetch_bytes: AtomicU64,
    pub prefetch_hits: AtomicU64,
    pub stall_count: AtomicU64,
    pub stall_ns: AtomicU64,
    pub stall_buckets: [AtomicU64; STALL_BUCKETS],
    /// Foreground evictions and busy retries so far, and the figure the
    /// last prefetch round saw: prefetch runs only after a round without
    /// demand (else it competes with calls for the same free chunks).
    demand: AtomicU64,
    demand_seen: AtomicU64,
    /// Some device has been lost (the hot paths' cheap check).
    lost_any: AtomicBool,
    /// The figures of the last allocation `malloc` refused (for one line).
    refusal: Mutex<Option<super::report::Refusal>>,
}

/// Host memory for the DRAM tier through the runtime (aclrtMallocHost).
struct RtHost(&'static dyn Runtime);
impl HostAllocator for RtHost {
    fn alloc(&self, bytes: usize) -> Result<*mut u8, i32> {
        self.0.malloc_host(bytes as u64)
    }
    fn free(&self, ptr: *mut u8, _bytes: usize) {
        self.0.free_host(ptr);
    }
}

/// A call in progress: the chunks it pinned.
#[derive(Default)]
pub struct Token {
    chunks: Vec<(u64, u32)>,
    writes: Vec<bool>,
}

/// How the caller's stream must be ordered after fault-ins.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The call is queued on this stream: it waits on u3m's copy event.
    Stream(u64),
    /// The call is synchronous, or its stream is being captured: the host
    /// waits for the copies before the call (no work added to the stream).
    Host,
}

fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Tier {
    /// `rt` lives for the process (libu3m leaks it); the policy is U3M_POLICY's.
    pub fn new(rt: &'static dyn Runtime, cfg: &Config) -> Result<Tier, String> {
        let policy = crate::policy::by_config(cfg)
            .ok_or_else(|| format!("U3M_POLICY: unknown policy '{}'", cfg.policy))?;
        Tier::with_policy(rt, cfg, policy)
    }

    /// With a policy object of the caller's (`u3m replay` passes policies
    /// that need the trace's future).
    pub fn with_policy(
        rt: &'static dyn Runtime,
        cfg: &Config,
        policy: Box<dyn Placement>,
    ) -> Result<Tier, String> {
        let dram_limit = if cfg.dram_bytes == 0 {
            physical_ram() / 2
        } else {
            cfg.dram_bytes
        };
        let dram = DramTier::new(
            dram_limit,
            256 << 20,
            Box::new(RtHost(rt)) as Box<dyn HostAllocator>,
        );
        // U3M_SWAP_DIR alone: sized from the file system's free space
        let nvme_bytes = cfg.nvme_bytes()?;
        let nvme = match &cfg.swap_dir {
            Some(d) if nvme_bytes > 0 => Some(
                NvmeTier::new(d, nvme_bytes, 256 << 20)
                    .map_err(|e| format!("U3M_SWAP_DIR: {e}"))?,
            ),
            _ => None,
        };
        let nvme_limit = if nvme.is_some() { nvme_bytes } else { 0 };
        Ok(Tier {
            rt,
            policy,
            ssd_rate: cfg.ssd_rate.max(1),
            st: Mutex::new(State {
                backings: HashMap::new(),
                next_id: 1,
                vas: BTreeMap::new(),
                devs: [const { Dev::new() }; MAX_DEVICES],
                dram,
                nvme,
                event_refs: HashMap::new(),
                free_events: Vec::new(),
                clock: 0,
                recently_freed: std::collections::VecDeque::new(),
                pending_free: Vec::new(),
                wait_for: None,
                stall_from: None,
            }),
            min_bytes: cfg.min_bytes.max(1),
            oversub: cfg.oversub,
            dram_limit,
            nvme_limit,
            alloc_wait_ms: cfg.alloc_wait_ms,
            live: AtomicU64::new(0),
            faults_in: AtomicU64::new(0),
            fault_bytes: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            eviction_bytes: AtomicU64::new(0),
            clean_drops: AtomicU64::new(0),
            to_dram: AtomicU64::new(0),
            to_nvme: AtomicU64::new(0),
            from_nvme: AtomicU64::new(0),
            spilled: AtomicU64::new(0),
            overwrites: AtomicU64::new(0),
            spill_errors: AtomicU64::new(0),
            prefetches: AtomicU64::new(0),
            prefetch_bytes: AtomicU64::new(0),
            prefetch_hits: AtomicU64::new(0),
            stall_count: AtomicU64::new(0),
            stall_ns: AtomicU64::new(0),
            stall_buckets: Default::default(),
            demand: AtomicU64::new(0),
            demand_seen: AtomicU64::new(0),
            lost_any: AtomicBool::new(false),
            refusal: Mutex::new(None),
        })
    }

    /// Where eviction asks a chunk's heat (set once the engine is in place).
    pub fn set_heat_fn(&self, f: HeatFn) {
        self.policy.set_heat_fn(f);
    }

    pub fn policy(&self) -> &dyn Placement {
        &*self.policy
    }

    /// The engine's logical clock (one tick per tracked call).
    pub fn now(&self) -> u64 {
        self.st.lock().map(|st| st.clock).unwrap_or(0)
    }

    pub fn counters(&self) -> TierCounters {
        TierCounters {
            faults_in: self.faults_in.load(Relaxed),
            fault_bytes: self.fault_bytes.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            eviction_bytes: self.eviction_bytes.load(Relaxed),
            clean_drops: self.clean_drops.load(Relaxed),
            to_dram: self.to_dram.load(Relaxed),
            to_nvme: self.to_nvme.load(Relaxed),
            from_nvme: self.from_nvme.load(Relaxed),
            spilled: self.spilled.load(Relaxed),
            overwrites: self.overwrites.load(Relaxed),
            spill_errors: self.spill_errors.load(Relaxed),
            prefetches: self.prefetches.load(Relaxed),
            prefetch_bytes: self.prefetch_bytes.load(Relaxed),
            prefetch_hits: self.prefetch_hits.load(Relaxed),
            stall_count: self.stall_count.load(Relaxed),
            stall_ns: self.stall_ns.load(Relaxed),
            stall_buckets: std::array::from_fn(|i| self.stall_buckets[i].load(Relaxed)),
        }
    }

    /// Bytes per tier on `dev`: (hbm resident, dram, nvme) — DRAM and NVMe
    /// are process-wide.
    pub fn usage(&self, dev: usize) -> (u64, u64, u64) {
        let Ok(st) = self.st.lock() else {
            return (0, 0, 0);
        };
        let nv = st.nvme.as_ref().map(|n| n.used()).unwrap_or(0);
        (
            st.devs[dev.min(MAX_DEVICES - 1)].resident,
            st.dram.used(),
            nv,
        )
    }

    /// Managed memory that is not resident in HBM, over all devices: what
    /// the host tiers must be able to hold (the monitor's host figure).
    pub fn host_demand(&self) -> u64 {
        self.st
            .lock()
            .map(|st| {
                st.devs
                    .iter()
                    .map(|d| d.managed_virtual.saturating_sub(d.resident))
                    .sum()
            })
            .unwrap_or(0)
    }

    pub fn limits(&self) -> (u64, u64) {
        (self.dram_limit, self.nvme_limit)
    }

    /// `ptr` is the start of a managed aclrtMalloc allocation.
    pub fn is_managed(&self, ptr: u64) -> bool {
        self.st
            .lock()
            .map(|st| {
                st.vas
                    .get(&ptr)
                    .map(|&(id, _)| {
                        matches!(st.backings.get(&id).map(|b| &b.kind), Some(Kind::Malloc))
                    })
                    .unwrap_or(false)
            })
            .unwrap_or(false)
    }

    /// `ptr` was a managed allocation just freed (the free hook's note comes
    /// after the free): remembered in a small ring.
    pub fn was_managed(&self, ptr: u64) -> bool {
        self.st
            .lock()
            .map(|st| st.recently_freed.contains(&ptr))
            .unwrap_or(false)
    }

    #[inline]
    pub fn active(&self) -> bool {
        self.live.load(Relaxed) != 0
    }

    pub fn set_capacity(&self, dev: u32, total: u64) {
        if let Ok(mut st) = self.st.lock() {
            st.devs[(dev as usize).min(MAX_DEVICES - 1)].capacity = total;
        }
    }

    pub fn capacity(&self, dev: u32) -> u64 {
        self.st
            .lock()
            .map(|st| st.devs[(dev as usize).min(MAX_DEVICES - 1)].capacity)
            .unwrap_or(0)
    }

    /// What aclrtGetMemInfo(HBM) reports in tier mode, from the runtime's
    /// (free, total): the virtual capacity and the matching free figure.
    pub fn mem_info(&self, dev: u32, free: u64, total: u64) -> (u64, u64) {
        let Ok(st) = self.st.lock() else {
            return (free, total);
        };
        let d = &st.devs[(dev as usize).min(MAX_DEVICES - 1)];
        let vtotal = (total as f64 * self.oversub) as u64;
        let unmanaged = total.saturating_sub(free).saturating_sub(d.resident);
        let vfree = vtotal
            .saturating_sub(unmanaged)
            .saturating_sub(d.managed_virtual);
        (vfree, vtotal)
    }

    // ---------------------------------------------------------------- alloc

    /// aclrtMalloc family: Some(result) when u3m manages the allocation
    /// (then *ptr is set on success), None to pass it through.
    pub fn malloc(&self, dev: u32, size: u64, free: u64, total: u64) -> Option<Result<u64, i32>> {
        if size < self.min_bytes || size > (1u64 << 46) {
            return None;
        }
        let vlen = round_up(size, CHUNK);
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_millis(self.alloc_wait_ms);
        loop {
            let mut st = self.st.lock().ok()?;
            let d = (dev as usize).min(MAX_DEVICES - 1);
            if st.devs[d].capacity == 0 {
                st.devs[d].capacity = total;
            }
            let dv = &st.devs[d];
            let vtotal = (dv.capacity as f64 * self.oversub) as u64;
            let unmanaged = total.saturating_sub(free).saturating_sub(dv.resident);
            // what cannot be resident must fit the host tiers: every host
            // byte holds managed data (part of some device's excess, or a
            // clean copy that can be dropped), so compare the excesses of
            // all devices with the tiers' limits, not with what is free now
            let others: u64 = st
                .devs
                .iter()
                .enumerate()
                .filter(|&(k, o)| k != d && o.capacity != 0)
                .map(|(_, o)| o.managed_virtual.saturating_sub(o.capacity))
                .sum();
            let fits_virtual = dv.managed_virtual + vlen + unmanaged <= vtotal;
            let fits_tiers = (dv.managed_virtual + vlen)
                .saturating_sub(dv.capacity.saturating_sub(unmanaged))
                + others
                <= self.dram_limit + self.nvme_limit;
            if fits_virtual && fits_tiers {
                let va = match self.rt.reserve(vlen) {
                    Ok(v) => v,
                    Err(e) => return Some(Err(e)),
                };
                let id = st.next_id;
                st.next_id += 1;
                let n = (vlen / CHUNK) as usize;
                st.backings.insert(
                    id,
                    Backing {
                        dev,
                        kind: Kind::Malloc,
                        size: vlen,
                        chunks: (0..n).map(|_| Chunk::default()).collect(),
                        vas: vec![va],
                        pinned: false,
                        real: 0,
                    },
                );
                st.vas.insert(va, (id, vlen));
                st.devs[d].managed_virtual += vlen;
                self.live.fetch_add(1, Relaxed);
                return Some(Ok(va));
            }
            let refusal = super::report::Refusal {
                dev,
                size: vlen,
                limit: if fits_virtual {
                    super::report::Limit::HostTiers
                } else {
                    super::report::Limit::Virtual
                },
                virtual_used: dv.managed_virtual + unmanaged,
                virtual_total: vtotal,
                hbm: dv.capacity,
                oversub: self.oversub,
                host_need: (dv.managed_virtual + vlen)
                    .saturating_sub(dv.capacity.saturating_sub(unmanaged))
                    + others,
                host_limit: self.dram_limit + self.nvme_limit,
                waited_ms: self.alloc_wait_ms,
            };
            drop(st);
            if std::time::Instant::now() >= deadline {
                if let Ok(mut r) = self.refusal.lock() {
                    *r = Some(refusal);
                }
                return Some(Err(E_ALLOC));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The figures of the allocation `malloc` last refused, once.
    pub fn take_refusal(&self) -> Option<super::report::Refusal> {
        self.refusal.lock().ok()?.take()
    }

    /// aclrtFree: Some(result) for a managed allocation, None otherwise.
    pub fn free(&self, ptr: u64) -> Option<i32> {
        let mut st = self.st.lock().ok()?;
        let (id, _) = *st.vas.get(&ptr)?;
        if !matches!(st.backings.get(&id)?.kind, Kind::Malloc) {
            return None;
        }
        st.vas.remove(&ptr);
        let b = st.backings.remove(&id)?;
        self.release_backing(&mut st, b, true);
        st.recently_freed.push_back(ptr);
        if st.recently_freed.len() > 64 {
            st.recently_freed.pop_front();
        }
        self.live.fetch_sub(1, Relaxed);
        Some(0)
    }

    /// Gives back every chunk's memory (and, for Malloc, the VA).
    fn release_backing(&self, st: &mut State, mut b: Backing, release_va: bool) {
        let d = (b.dev as usize).min(MAX_DEVICES - 1);
        if !b.vas.is_empty() {
            for i in 0..b.chunks.len() as u32 {
                self.policy.on_free(chunk_key(&b, 0, i));
            }
        }
        // copies of ours that may still read or write these chunks
        if st.devs[d].stream != 0 {
            self.rt.sync_stream(st.devs[d].stream);
        }
        for (i, c) in b.chunks.iter_mut().enumerate() {
            if c.phys != 0 {
                for &va in &b.vas {
                    self.rt.unmap(va + i as u64 * CHUNK);
                }
                self.rt.free_physical(c.phys);
                st.devs[d].resident -= CHUNK;
                c.phys = 0;
            }
            if let Some(h) = c.host.take() {
                free_host(st, h);
            }
            for (_, ev) in c.uses.drain(..) {
                unref_event(st, ev);
            }
        }
        if b.real != 0 {
            self.rt.free_physical(b.real);
            st.devs[d].resident = st.devs[d].resident.saturating_sub(b.size);
            b.real = 0;
        }
        self.reclaim(st);
        if release_va {
            if let Kind::Malloc = b.kind {
                self.rt.release(b.vas[0]);
            }
        }
        st.devs[d].managed_virtual = st.devs[d].managed_virtual.saturating_sub(b.size);
    }

    // ------------------------------------------------------------------ VMM

    /// aclrtMallocPhysical: Some(handle) when u3m hands out its own handle.
    pub fn malloc_physical(
        &self,
        dev: u32,
        size: u64,
        shareable: bool,
    ) -> Option<Result<u64, i32>> {
        if shareable || size < self.min_bytes || size % CHUNK != 0 {
            return None;
        }
        let mut st = self.st.lock().ok()?;
        let d = (dev as usize).min(MAX_DEVICES - 1);
        let dv = &st.devs[d];
        if dv.capacity != 0
            && dv.managed_virtual + size > (dv.capacity as f64 * self.oversub) as u64
        {
            return Some(Err(E_ALLOC));
        }
        let id = st.next_id;
        st.next_id += 1;
        st.backings.insert(
            id,
            Backing {
                dev,
                kind: Kind::Vmm,
                size,
                chunks: (0..size / CHUNK).map(|_| Chunk::default()).collect(),
                vas: Vec::new(),
                pinned: false,
                real: 0,
            },
        );
        st.devs[d].managed_virtual += size;
        self.live.fetch_add(1, Relaxed);
        Some(Ok(handle_of(id)))
    }

    pub fn is_handle(&self, h: u64) -> bool {
        id_of(h)
            .map(|id| {
                self.st
                    .lock()
                    .map(|st| st.backings.contains_key(&id))
                    .unwrap_or(false)
            })
            .unwrap_or(false)
    }

    pub fn free_physical(&self, h: u64) -> Option<i32> {
        let id = id_of(h)?;
        let mut st = self.st.lock().ok()?;
        let b = st.backings.get(&id)?;
        if !b.vas.is_empty() {
            return Some(207002); // ACL_ERROR_RT_MEMORY_FREE: still mapped
        }
        let b = st.backings.remove(&id)?;
        self.release_backing(&mut st, b, false);
        self.live.fetch_sub(1, Relaxed);
        Some(0)
    }

    pub fn map(&self, va: u64, size: u64, offset: u64, h: u64) -> Option<i32> {
        let id = id_of(h)?;
        let mut st = self.st.lock().ok()?;
        let b = st.backings.get(&id)?;
        if offset != 0 || size != b.size {
            return Some(100000); // as the runtime: whole handles at offset 0
        }
        if st
            .vas
            .range(..va + size)
            .next_back()
            .map(|(&s, &(_, l))| s + l > va)
            .unwrap_or(false)
        {
            return Some(E_PARAM);
        }
        if b.real != 0 {
            let rc = self.rt.map(va, size, b.real);
            if rc == 0 {
                st.backings.get_mut(&id)?.vas.push(va);
                st.vas.insert(va, (id, size));
            }
            return Some(rc);
        }
        let phys: Vec<(usize, u64)> = b
            .chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.phys != 0)
            .map(|(i, c)| (i, c.phys))
            .collect();
        for (i, p) in phys {
            let rc = self.rt.map(va + i as u64 * CHUNK, CHUNK, p);
            if rc != 0 {
                return Some(rc);
            }
        }
        st.backings.get_mut(&id)?.vas.push(va);
        st.vas.insert(va, (id, size));
        Some(0)
    }

    pub fn unmap(&self, va: u64) -> Option<i32> {
        let mut st = self.st.lock().ok()?;
        let (id, _) = *st.vas.get(&va)?;
        let b = st.backings.get(&id)?;
        if !matches!(b.kind, Kind::Vmm) {
            return None;
        }
        // like the runtime's unmap, this does not wait for the device
        if b.real != 0 {
            let rc = self.rt.unmap(va);
            if rc != 0 {
                return Some(rc);
            }
        }
        for (i, c) in b.chunks.iter().enumerate() {
            if c.phys != 0 {
                self.rt.unmap(va + i as u64 * CHUNK);
            }
        }
        st.vas.remove(&va);
        st.backings.get_mut(&id)?.vas.retain(|&v| v != va);
        Some(0)
    }

    /// An exported handle must be real. A managed handle of one chunk is
    /// made resident and its chunk exported; a larger one is replaced by a
    /// real handle of its whole size holding the same data, mapped wherever
    /// the handle is mapped. Either way the backing is pinned for good.
    /// Returns the real handle to export.
    pub fn export(&self, h: u64) -> Option<Result<u64, i32>> {
        let id = id_of(h)?;
        // in-flight work may still use the chunks that a multi-chunk handle
        // is about to have unmapped: wait for it without the lock (it may
        // need the host)
        let uses: Vec<u64> = {
            let st = self.st.lock().ok()?;
            let b = st.backings.get(&id)?;
            if b.real != 0 {
                return Some(Ok(b.real));
            }
            if b.chunks.len() == 1 {
                Vec::new()
            } else {
                b.chunks
                    .iter()
                    .flat_map(|c| c.uses.iter().map(|u| u.1))
                    .collect()
            }
        };
        for ev in uses {
            self.rt.sync_event(ev);
        }
        let mut st = self.st.lock().ok()?;
        let b = st.backings.get(&id)?;
        let dev = b.dev;
        if st.devs[(dev as usize).min(MAX_DEVICES - 1)].lost {
            return Some(Err(E_DEVICE_LOST));
        }
        if b.chunks.len() == 1 {
            if let Err(e) = self.fault_in(&mut st, &[(id, 0, false)], dev, Order::Host) {
                return Some(Err(if e == E_BUSY { E_ALLOC } else { e }));
            }
            let b = st.backings.get_mut(&id)?;
            b.pinned = true;
            return Some(Ok(b.chunks[0].phys));
        }
        Some(self.materialize(&mut st, id))
    }

    /// Replaces backing `id`'s chunks by one real handle with their data.
    fn materialize(&self, st: &mut State, id: u64) -> Result<u64, i32> {
        let (dev, size) = (st.backings[&id].dev, st.backings[&id].size);
        let protect: Vec<(u64, u32)> = (0..st.backings[&id].chunks.len() as u32)
            .map(|i| (id, i))
            .collect();
        // room for the whole handle: evict other chunks (never this one's)
        let real = loop {
            match self.rt.malloc_physical(dev, size) {
                Ok(h) => break h,
                Err(E_ALLOC) => {}
                Err(e) => return Err(e),
            }
            match self.evict_one(st, dev, &protect) {
                Ok(true) => {}
                Ok(false) | Err(E_BUSY) => return Err(E_ALLOC),
                Err(e) => return Err(e),
            }
        };
        let fail = |st: &mut State, va: u64, rc: i32| {
            if va != 0 {
                self.rt.unmap(va);
                self.rt.release(va);
            }
            self.rt.free_physical(real);
            let d = (dev as usize).min(MAX_DEVICES - 1);
            if st.devs[d].stream != 0 {
                self.rt.sync_stream(st.devs[d].stream);
            }
            Err(rc)
        };
        let va = match self.rt.reserve(size) {
            Ok(v) => v,
            Err(e) => return fail(st, 0, e),
        };
        let rc = self.rt.map(va, size, real);
        if rc != 0 {
            self.rt.release(va);
            self.rt.free_physical(real);
            return Err(rc);
        }
        let stream = match self.dev_stream(st, dev) {
            Ok(s) => s,
            Err(e) => return fail(st, va, e),
        };
        let staging = match self.staging(st, dev) {
            Ok(s) => s,
            Err(e) => return fail(st, va, e),
        };
        // the data, chunk by chunk, from wherever it is
        for i in 0..st.backings[&id].chunks.len() as u32 {
            let off = i as u64 * CHUNK;
            let (phys, mapped_at) = {
                let b = &st.backings[&id];
                (b.chunks[i as usize].phys, b.vas.first().map(|v| v + off))
            };
            let rc = if phys != 0 {
                let src = match mapped_at {
                    Some(s) => s,
                    None => match self.scratch_map(st, dev, id, i) {
                        Ok(s) => s,
                        Err(e) => return fail(st, va, e),
                    },
                };
                let rc = self
                    .rt
                    .memcpy_async(va + off, src, CHUNK, MEMCPY_D2D, stream);
                if mapped_at.is_none() {
                    // the scratch VA is reused for the next chunk
                    self.rt.sync_stream(stream);
                    self.rt.unmap(src);
                }
                rc
            } else {
                let st2 = &mut *st;
                match &st2.backings[&id].chunks[i as usize].host {
                    None => 0, // never written
                    Some(Host::Dram(slot)) => {
                        self.rt
                            .memcpy_async(va + off, slot.ptr as u64, CHUNK, MEMCPY_H2D, stream)
                    }
                    Some(Host::Nvme(slot)) => {
                        self.rt.sync_stream(stream); // the staging buffer is free
                        let buf = unsafe {
                            std::slice::from_raw_parts_mut(staging as *mut u8, CHUNK as usize)
                        };
                        if st2
                            .nvme
                            .as_mut()
                            .map(|n| n.read(slot, buf))
                            .unwrap_or(Err(TierError::BadSlot))
                            .is_err()
                        {
                            self.spill_errors.fetch_add(1, Relaxed);
                            E_ALLOC
                        } else {
                            self.rt
                                .memcpy_async(va + off, staging, CHUNK, MEMCPY_H2D, stream)
                        }
                    }
                }
            };
            if rc != 0 {
                return fail(st, va, rc);
            }
        }
        let rc = self.rt.sync_stream(stream);
        if rc != 0 {
            return fail(st, va, rc);
        }
        self.rt.unmap(va);
        self.rt.release(va);
        // swap the chunks for the real handle at every VA it is mapped at
        let d = (dev as usize).min(MAX_DEVICES - 1);
        let vas = st.backings[&id].vas.clone();
        let mut freed = Vec::new();
        {
            let b = st.backings.get_mut(&id).expect("backing");
            for (i, c) in b.chunks.iter_mut().enumerate() {
                if c.phys != 0 {
                    for &v in &vas {
                        self.rt.unmap(v + i as u64 * CHUNK);
                    }
                    self.rt.free_physical(c.phys);
                    c.phys = 0;
                    st.devs[d].resident -= CHUNK;
                }
                if let Some(h) = c.host.take() {
                    freed.push(h);
                }
                c.dirty = false;
            }
        }
        for h in freed {
            free_host(st, h);
        }
        let evs: Vec<u64> = st
            .backings
            .get_mut(&id)
            .expect("backing")
            .chunks
            .iter_mut()
            .flat_map(|c| c.uses.drain(..).map(|u| u.1).collect::<Vec<_>>())
            .collect();
        for ev in evs {
            unref_event(st, ev);
        }
        for &v in &vas {
            let rc = self.rt.map(v, size, real);
            if rc != 0 {
                // the data is only in `real` now: keep it as the backing's
                // memory and report the mapping failure
                let b = st.backings.get_mut(&id).expect("backing");
                b.real = real;
                b.pinned = true;
                st.devs[d].resident += size;
                return Err(rc);
            }
        }
        let b = st.backings.get_mut(&id).expect("backing");
        b.real = real;
        b.pinned = true;
        st.devs[d].resident += size;
        Ok(real)
    }

    // -------------------------------------------------------------- access

    /// Before a call touching `ranges`: every chunk they cover is resident
    /// and pinned. `overwrite`: write ranges replace whole chunks' contents
    /// (copies, memsets), so those chunks need no copy-in.
    /// `class`: the operator class of the call (OpClass as u8), for the policy.
    pub fn prepare(
        &self,
        dev: u32,
        class: u8,
        ranges: &[Range],
        overwrite: bool,
        order: Order,
    ) -> Result<Token, i32> {
        let mut st = self.st.lock().map_err(|_| E_ALLOC)?;
        let mut need: Vec<(u64, u32, bool)> = Vec::new();
        let mut tok = Token::default();
        for r in ranges {
            if r.len == 0 {
                continue;
            }
            let end = r.addr.saturating_add(r.len);
            for (&start, &(id, len)) in st.vas.range(..end).rev() {
                if start + len <= r.addr {
                    break;
                }
                if st.backings.get(&id).map(|b| b.real != 0).unwrap_or(false) {
                    continue; // a real handle: always in HBM
                }
                let lo = r.addr.max(start) - start;
                let hi = end.min(start + len) - start;
                for i in lo / CHUNK..hi.div_ceil(CHUNK) {
                    let cs = i * CHUNK;
                    let whole = overwrite && r.write && lo <= cs && hi >= cs + CHUNK;
                    match need.iter_mut().find(|n| n.0 == id && n.1 == i as u32) {
                        Some(n) => n.2 &= whole,
                        None => need.push((id, i as u32, whole)),
                    }
                    if let Some(k) = tok.chunks.iter().position(|&c| c == (id, i as u32)) {
                        tok.writes[k] |= r.write;
                    } else {
                        tok.chunks.push((id, i as u32));
                        tok.writes.push(r.write);
                    }
                }
            }
        }
        if need.is_empty() {
            return Ok(tok);
        }
        // nothing runs on a lost device (checked only once one is lost)
        if self.lost_any.load(Relaxed)
            && (st.devs[(dev as usize).min(MAX_DEVICES - 1)].lost
                || need.iter().any(|n| {
                    st.backings
                        .get(&n.0)
                        .map(|b| st.devs[(b.dev as usize).min(MAX_DEVICES - 1)].lost)
                        .unwrap_or(false)
                }))
        {
            return Err(E_DEVICE_LOST);
        }
        // a call that needs more chunks than the device holds can never run
        let cap = st.devs[(dev as usize).min(MAX_DEVICES - 1)].capacity;
        if cap != 0 && tok.chunks.len() as u64 * CHUNK > cap {
            return Err(E_ALLOC);
        }
        // other threads' calls pin what they use only briefly, but they need
        // this lock to unpin: on E_BUSY let them run, then try again
        let mut tries = 0;
        // when this call met its first absent chunk (fault_in notes it in
        // the state; taken before the lock is dropped for a retry)
        st.stall_from = None;
        let mut stall_from = None;
        loop {
            let r = self.fault_in(&mut st, &need, dev, order);
            stall_from = stall_from.or(st.stall_from.take());
            match r {
                Ok(()) => {
                    if let Err(e) = self.after_copy_ins(&mut st, &need, order) {
                        return Err(e);
                    }
                    break;
                }
                Err(E_BUSY) if tries < 2000 => {
                    self.demand.fetch_add(1, Relaxed);
                    // copy-ins already issued for this call complete before
                    // the lock is dropped: the retry sees them as resident
                    // and issues no wait for them
                    let d = (dev as usize).min(MAX_DEVICES - 1);
                    if st.devs[d].stream != 0 {
                        self.rt.sync_stream(st.devs[d].stream);
                    }
                    let wait = st.wait_for.take();
                    drop(st);
                    match wait {
                        // the oldest use of the coldest chunk: wait for it unlocked
                        Some(ev) => {
                            self.rt.sync_event(ev);
                        }
                        None => std::thread::sleep(std::time::Duration::from_micros(500)),
                    }
                    st = self.st.lock().map_err(|_| E_ALLOC)?;
                    tries += 1;
                }
                Err(e) => {
                    // copy-ins issued before the failure must not outlive
                    // the chunks they write (nothing else orders them)
                    let d = (dev as usize).min(MAX_DEVICES - 1);
                    if st.devs[d].stream != 0 {
                        self.rt.sync_stream(st.devs[d].stream);
                    }
                    return Err(if e == E_BUSY { E_ALLOC } else { e });
                }
            }
        }
        // from the first absent chunk to all resident: the call's fault-in
        // stall (no clock read when nothing was absent)
        if let Some(t0) = stall_from {
            let ns = crate::shm::mono_ns().saturating_sub(t0);
            self.stall_count.fetch_add(1, Relaxed);
            self.stall_ns.fetch_add(ns, Relaxed);
            self.stall_buckets[stall_bucket(ns)].fetch_add(1, Relaxed);
        }
        st.clock += 1;
        let clock = st.clock;
        let mut keys = Vec::with_capacity(tok.chunks.len());
        let mut hits = 0;
        for &(id, i) in &tok.chunks {
            if let Some(b) = st.backings.get_mut(&id) {
                keys.push(chunk_key(b, id, i));
                if let Some(c) = b.chunks.get_mut(i as usize) {
                    c.pins += 1;
                    c.last = clock;
                    hits += std::mem::take(&mut c.prefetched) as u64;
                }
            }
        }
        if hits != 0 {
            self.prefetch_hits.fetch_add(hits, Relaxed);
        }
        if keys.len() == tok.writes.len() {
            self.policy.on_access(clock, class, &keys, &tok.writes);
        }
        Ok(tok)
    }

    /// After the call: unpin; on success note the use on `stream` (an event
    /// recorded after the call) and the writes (host copies go stale).
    pub fn finish(&self, tok: Token, stream: Option<u64>, ok: bool) {
        if tok.chunks.is_empty() {
            return;
        }
        let Ok(mut st) = self.st.lock() else { return };
        let ev = match (ok, stream) {
            (true, Some(s)) => self.use_event(&mut st, s),
            _ => None,
        };
        for (k, &(id, i)) in tok.chunks.iter().enumerate() {
            let mut stale = None;
            let mut old = None;
            if let Some(c) = st
                .backings
                .get_mut(&id)
                .and_then(|b| b.chunks.get_mut(i as usize))
            {
                c.pins = c.pins.saturating_sub(1);
                if ok && tok.writes[k] {
                    c.dirty = true;
                    stale = c.host.take();
                }
                if let (Some(e), Some(s)) = (ev, stream) {
                    if let Some(u) = c.uses.iter_mut().find(|u| u.0 == s) {
                        old = Some(u.1);
                        u.1 = e;
                    } else {
                        c.uses.push((s, e));
                    }
                }
            }
            if let Some(h) = stale {
                st.pending_free.push(h);
            }
            if let Some(e) = ev {
                *st.event_refs.entry(e).or_insert(0) += 1;
            }
            if let Some(o) = old {
                unref_event(&mut st, o);
            }
        }
        if let Some(e) = ev {
            // the reference taken at creation
            unref_event(&mut st, e);
        }
    }

    /// An event recorded on `stream` now. Pooled events are reused only
    /// once complete: re-recording a pending event would let a stream that
    /// waits on its older record run ahead when the newer one completes.
    fn use_event(&self, st: &mut State, stream: u64) -> Option<u64> {
        let mut ev = None;
        let mut k = 0;
        while k < st.free_events.len() {
            if self.rt.event_done(st.free_events[k]).unwrap_or(false) {
                ev = Some(st.free_events.swap_remove(k));
                break;
            }
            k += 1;
            if k >= 8 {
                break; // the oldest are first: no need to scan a long tail
            }
        }
        let ev = match ev {
            Some(e) => e,
            None => self.rt.create_event().ok()?,
        };
        if self.rt.record_event(ev, stream) != 0 {
            st.free_events.push(ev);
            return None;
        }
        st.event_refs.insert(ev, 1);
        Some(ev)
    }

    fn dev_stream(&self, st: &mut State, dev: u32) -> Result<u64, i32> {
        let d = (dev as usize).min(MAX_DEVICES - 1);
        if st.devs[d].stream == 0 {
            st.devs[d].stream = self.rt.create_stream()?;
        }
        Ok(st.devs[d].stream)
    }

    fn staging(&self, st: &mut State, dev: u32) -> Result<u64, i32> {
        let d = (dev as usize).min(MAX_DEVICES - 1);
        if st.devs[d].staging == 0 {
            st.devs[d].staging = self.rt.malloc_host(CHUNK)? as u64;
        }
        Ok(st.devs[d].staging)
    }

    /// Makes the listed chunks resident. Chunks of this call are protected
    /// from eviction; the caller's stream (or the host) is ordered after the
    /// copies.
    fn fault_in(
        &self,
        st: &mut State,
        need: &[(u64, u32, bool)],
        dev: u32,
        order: Order,
    ) -> Result<(), i32> {
        let protect: Vec<(u64, u32)> = need.iter().map(|n| (n.0, n.1)).collect();
        let mut copied = false;
        let mut filled: Vec<(u64, u32)> = Vec::new();
        for &(id, i, whole) in need {
            let Some(b) = st.backings.get(&id) else {
                continue;
            };
            let c = &b.chunks[i as usize];
            if c.phys != 0 {
                continue;
            }
            let bdev = b.dev;
            if st.stall_from.is_none() {
                st.stall_from = Some(crate::shm::mono_ns());
            }
            let phys = self.alloc_phys(st, bdev, &protect)?;
            let d = (bdev as usize).min(MAX_DEVICES - 1);
            st.devs[d].resident += CHUNK;
            let vas = st.backings[&id].vas.clone();
            for &va in &vas {
                let rc = self.rt.map(va + i as u64 * CHUNK, CHUNK, phys);
                if rc != 0 {
                    return Err(rc);
                }
            }
            let target = vas.first().map(|va| va + i as u64 * CHUNK);
            let b = st.backings.get_mut(&id).expect("backing");
            let c = &mut b.chunks[i as usize];
            c.phys = phys;
            c.prefetched = false;
            self.faults_in.fetch_add(1, Relaxed);
            if whole && c.host.is_some() {
                // overwritten entirely: the old contents are not needed
                self.overwrites.fetch_add(1, Relaxed);
                let h = c.host.take();
                c.dirty = true;
                if let Some(h) = h {
                    st.pending_free.push(h);
                }
                continue;
            }
            let Some(target) = target else {
                // a VMM handle mapped nowhere: its data stays in the host copy
                // until it is mapped; resident now only to satisfy export
                c.dirty = c.host.is_none();
                continue;
            };
            let stream = self.dev_stream(st, dev)?;
            let c = &mut st.backings.get_mut(&id).expect("backing").chunks[i as usize];
            match &c.host {
                None => c.dirty = true, // fresh memory: nothing to copy
                Some(Host::Dram(slot)) => {
                    let rc =
                        self.rt
                            .memcpy_async(target, slot.ptr as u64, CHUNK, MEMCPY_H2D, stream);
                    if rc != 0 {
                        return Err(rc);
                    }
                    c.dirty = false;
                    copied = true;
                    filled.push((id, i));
                    self.fault_bytes.fetch_add(CHUNK, Relaxed);
                }
                Some(Host::Nvme(_)) => {
                    let staging = self.staging(st, dev)?;
                    // the staging buffer may still feed an earlier copy-in
                    self.rt.sync_stream(stream);
                    let c = &mut st.backings.get_mut(&id).expect("backing").chunks[i as usize];
                    let Some(Host::Nvme(slot)) = &c.host else {
                        unreachable!()
                    };
                    let buf = unsafe {
                        std::slice::from_raw_parts_mut(staging as *mut u8, CHUNK as usize)
                    };
                    let r = st
                        .nvme
                        .as_mut()
                        .map(|n| n.read(slot, buf))
                        .unwrap_or(Err(TierError::BadSlot));
                    if r.is_err() {
                        self.spill_errors.fetch_add(1, Relaxed);
                        return Err(E_ALLOC);
                    }
                    let rc = self
                        .rt
                        .memcpy_async(target, staging, CHUNK, MEMCPY_H2D, stream);
                    if rc != 0 {
                        return Err(rc);
                    }
                    let c = &mut st.backings.get_mut(&id).expect("backing").chunks[i as usize];
                    c.dirty = false;
                    copied = true;
                    filled.push((id, i));
                    self.from_nvme.fetch_add(1, Relaxed);
                    self.fault_bytes.fetch_add(CHUNK, Relaxed);
                }
            }
        }
        if copied {
            let stream = self.dev_stream(st, dev)?;
            match order {
                Order::Host => {
                    let rc = self.rt.sync_stream(stream);
                    if rc != 0 {
                        return Err(rc);
                    }
                }
                Order::Stream(s) => {
                    let Some(ev) = self.use_event(st, stream) else {
                        return Err(E_ALLOC);
                    };
                    // the copy is a use of each chunk it fills: no eviction
                    // before it completes, and other streams' calls order
                    // themselves after it (`after_copy_ins`)
                    for &(id, i) in &filled {
                        set_use(st, id, i, stream, ev);
                    }
                    let rc = self.rt.stream_wait(s, ev);
                    unref_event(st, ev);
                    if rc != 0 {
                        return Err(rc);
                    }
                }
            }
        }
        Ok(())
    }

    /// Orders the caller after copy-ins still in flight for chunks it needs
    /// that were already resident (issued by another call or the prefetch).
    fn after_copy_ins(
        &self,
        st: &mut State,
        need: &[(u64, u32, bool)],
        order: Order,
    ) -> Result<(), i32> {
        let mut evs: Vec<u64> = Vec::new();
        let mut done: Vec<(u64, u32, u64)> = Vec::new();
        for &(id, i, _) in need {
            let Some(b) = st.backings.get(&id) else {
                continue;
            };
            let own = st.devs[(b.dev as usize).min(MAX_DEVICES - 1)].stream;
            if own == 0 {
                continue;
            }
            for &(s, ev) in &b.chunks[i as usize].uses {
                if s != own || evs.contains(&ev) {
                    continue;
                }
                if self.rt.event_done(ev).unwrap_or(true) {
                    done.push((id, i, ev));
                } else {
                    evs.push(ev);
                }
            }
        }
        // a completed copy-in orders nothing any more: forget it, so later
        // calls on the chunk do not query the runtime for it again
        for (id, i, ev) in done {
            if let Some(c) = st
                .backings
                .get_mut(&id)
                .and_then(|b| b.chunks.get_mut(i as usize))
            {
                c.uses.retain(|u| u.1 != ev);
            }
            unref_event(st, ev);
        }
        for ev in evs {
            let rc = match order {
                Order::Stream(s) => self.rt.stream_wait(s, ev),
                // u3m's stream holds only copies: waiting for it with the
                // lock held cannot depend on work the host has yet to issue
                Order::Host => self.rt.sync_event(ev),
            };
            if rc != 0 {
                return Err(rc);
            }
        }
        Ok(())
    }

    /// Background prefetch on `dev`: brings back to HBM chunks held in DRAM
    /// that the policy expects within `horizon` ticks, without evicting
    /// anything, while HBM use stays below `low` × capacity, and at most
    /// `budget` bytes per call (the link's share for one background round).
    /// The copies run on u3m's stream; a call needing a chunk whose copy is
    /// still in flight waits for it (`after_copy_ins`). Returns the chunks
    /// issued. The calling thread's device must be `dev`.
    pub fn prefetch(&self, dev: u32, budget: u64, low: f64, horizon: u64) -> u32 {
        let demand = self.demand.load(Relaxed);
        if self.demand_seen.swap(demand, Relaxed) != demand {
            return 0;
        }
        let Ok((free, total)) = self.rt.mem_info() else {
            return 0;
        };
        if total == 0 {
            return 0;
        }
        let limit = (low * total as f64) as u64;
        let mut used = total.saturating_sub(free);
        if used + CHUNK > limit {
            return 0;
        }
        let Ok(mut st) = self.st.lock() else { return 0 };
        let now = st.clock;
        let mut cands: Vec<(u64, u32, u64)> = Vec::new();
        for (&id, b) in st.backings.iter() {
            if b.dev != dev || b.pinned || b.vas.is_empty() {
                continue;
            }
            for (i, c) in b.chunks.iter().enumerate() {
                if c.phys == 0 && c.pins == 0 && matches!(c.host, Some(Host::Dram(_))) {
                    let key = chunk_key(b, id, i as u32);
                    if self.policy.predicts(now, key, horizon) {
                        cands.push((id, i as u32, key));
                    }
                }
            }
        }
        if cands.is_empty() {
            return 0;
        }
        cands.sort_unstable_by_key(|c| c.2);
        let Ok(stream) = self.dev_stream(&mut st, dev) else {
            return 0;
        };
        let mut filled: Vec<(u64, u32)> = Vec::new();
        let mut bytes = 0u64;
        for (id, i, _) in cands {
            if bytes + CHUNK > budget || used + CHUNK > limit {
                break;
            }
            // never evict for a prefetch: a refused allocation ends the round
            let Ok(phys) = self.rt.malloc_physical(dev, CHUNK) else {
                break;
            };
            let vas = st.backings[&id].vas.clone();
            let mut ok = true;
            let mut mapped = Vec::new();
            for &va in &vas {
                if self.rt.map(va + i as u64 * CHUNK, CHUNK, phys) != 0 {
                    ok = false;
                    break;
                }
                mapped.push(va);
            }
            let src = match &st.backings[&id].chunks[i as usize].host {
                Some(Host::Dram(slot)) => slot.ptr as u64,
                _ => 0,
            };
            if ok && src != 0 {
                ok =
                    self.rt
                        .memcpy_async(vas[0] + i as u64 * CHUNK, src, CHUNK, MEMCPY_H2D, stream)
                        == 0;
            }
            if !ok {
                for va in mapped {
                    self.rt.unmap(va + i as u64 * CHUNK);
                }
                self.rt.free_physical(phys);
                break;
            }
            let d = (dev as usize).min(MAX_DEVICES - 1);
            st.devs[d].resident += CHUNK;
            let c = &mut st.backings.get_mut(&id).expect("backing").chunks[i as usize];
            c.phys = phys;
            c.dirty = false; // the DRAM copy stays: evicting it again is free
            c.last = now;
            c.prefetched = true;
            filled.push((id, i));
            bytes += CHUNK;
            used += CHUNK;
        }
        if !filled.is_empty() {
            match self.use_event(&mut st, stream) {
                Some(ev) => {
                    for &(id, i) in &filled {
                        set_use(&mut st, id, i, stream, ev);
                    }
                    unref_event(&mut st, ev);
                }
                // no event: order everything after the copies the hard way
                None => {
                    self.rt.sync_stream(stream);
                }
            }
            self.prefetches.fetch_add(filled.len() as u64, Relaxed);
            self.prefetch_bytes.fetch_add(bytes, Relaxed);
        }
        filled.len() as u32
    }

    /// A physical chunk on `dev`, evicting others (never `protect`) when HBM
    /// is full.
    fn alloc_phys(&self, st: &mut State, dev: u32, protect: &[(u64, u32)]) -> Result<u64, i32> {
        let r = self.alloc_phys_evicting(st, dev, protect);
        if !matches!(r, Ok((_, 0))) {
            self.demand.fetch_add(1, Relaxed);
        }
        r.map(|(h, _)| h)
    }

    /// `alloc_phys` with the number of chunks it evicted.
    fn alloc_phys_evicting(
        &self,
        st: &mut State,
        dev: u32,
        protect: &[(u64, u32)],
    ) -> Result<(u64, u32), i32> {
        let mut evicted = 0u32;
        // evict before asking when HBM is visibly full (a refused request
        // costs the runtime a failed allocation and a log line)
        while let Ok((free, _)) = self.rt.mem_info() {
            if free >= CHUNK || !self.evict_one(st, dev, protect)? {
                break;
            }
            evicted += 1;
        }
        loop {
            match self.rt.malloc_physical(dev, CHUNK) {
                Ok(h) => return Ok((h, evicted)),
                Err(E_ALLOC) => {}
                Err(e) => return Err(e),
            }
            if !self.evict_one(st, dev, protect)? {
                return Err(E_BUSY);
            }
            evicted += 1;
        }
    }

    /// Evicts the least recently used evictable chunk of `dev`. Ok(false):
    /// nothing can move.
    fn evict_one(&self, st: &mut State, dev: u32, protect: &[(u64, u32)]) -> Result<bool, i32> {
        let ordered = self.candidates(st, dev, protect);
        if ordered.is_empty() {
            return Ok(false);
        }
        let cands: Vec<(u64, u64, u32)> = ordered
            .iter()
            .take(64)
            .filter_map(|c| resolve(st, c.key).map(|(id, i)| (c.last, id, i)))
            .collect();
        if cands.is_empty() {
            return Ok(false);
        }
        // prefer a chunk whose uses are complete; else wait for the oldest
        let mut pick = None;
        for &(_, id, i) in cands.iter() {
            let c = &st.backings[&id].chunks[i as usize];
            if c.uses
                .iter()
                .all(|&(_, ev)| self.rt.event_done(ev).unwrap_or(true))
            {
                pick = Some((id, i));
                break;
            }
        }
        let (id, i) = match pick {
            Some(p) => p,
            None => {
                // Every candidate is still in use. Never wait for the device
                // while holding the lock: a stream may be blocked on work the
                // host has yet to issue (an HCCL peer), and issuing it needs
                // this lock. The caller drops the lock and waits (E_BUSY).
                let (_, id, i) = cands[0];
                let uses = &st.backings[&id].chunks[i as usize].uses;
                st.wait_for = uses
                    .iter()
                    .find(|u| !self.rt.event_done(u.1).unwrap_or(true))
                    .or(uses.first())
                    .map(|u| u.1);
                return Err(E_BUSY);
            }
        };
        self.evict(st, id, i)?;
        Ok(true)
    }

    /// Resident chunks of `dev` that may leave HBM (not pinned, not in a
    /// call, not in `protect`), in the policy's eviction order.
    fn candidates(&self, st: &State, dev: u32, protect: &[(u64, u32)]) -> Vec<Cand> {
        let mut cands: Vec<Cand> = Vec::new();
        for (&id, b) in st.backings.iter() {
            if b.dev != dev || b.pinned {
                continue;
            }
            for (i, c) in b.chunks.iter().enumerate() {
                if c.phys != 0 && c.pins == 0 && !protect.contains(&(id, i as u32)) {
                    cands.push(Cand {
                        key: chunk_key(b, id, i as u32),
                        last: c.last,
                        dirty: c.dirty || c.host.is_none(),
                    });
                }
            }
        }
        self.policy.order(st.clock, &mut cands);
        cands
    }

    /// Moves one resident chunk out of HBM (copying it out unless a clean
    /// host copy exists), then unmaps and frees its physical memory.
    fn evict(&self, st: &mut State, id: u64, i: u32) -> Result<(), i32> {
        let (dev, vas) = {
            let b = &st.backings[&id];
            (b.dev, b.vas.clone())
        };
        let c = &st.backings[&id].chunks[i as usize];
        let needs_copy = c.dirty || c.host.is_none();
        if needs_copy {
            let stream = self.dev_stream(st, dev)?;
            // where the data can be read from on the device
            let src = match vas.first() {
                Some(va) => va + i as u64 * CHUNK,
                None => self.scratch_map(st, dev, id, i)?,
            };
            let slot = self.host_slot(st, id, i)?;
            match slot {
                Host::Dram(s) => {
                    let rc = self
                        .rt
                        .memcpy_async(s.ptr as u64, src, CHUNK, MEMCPY_D2H, stream);
                    let rc = if rc == 0 {
                        self.rt.sync_stream(stream)
                    } else {
                        rc
                    };
                    if rc != 0 {
                        free_host(st, Host::Dram(s));
                        return Err(rc);
                    }
                    self.to_dram.fetch_add(1, Relaxed);
                    st.backings.get_mut(&id).expect("backing").chunks[i as usize].host =
                        Some(Host::Dram(s));
                }
                Host::Nvme(s) => {
                    let staging = self.staging(st, dev)?;
                    let rc = self
                        .rt
                        .memcpy_async(staging, src, CHUNK, MEMCPY_D2H, stream);
                    let rc = if rc == 0 {
                        self.rt.sync_stream(stream)
                    } else {
                        rc
                    };
                    if rc != 0 {
                        free_host(st, Host::Nvme(s));
                        return Err(rc);
                    }
                    let buf =
                        unsafe { std::slice::from_raw_parts(staging as *const u8, CHUNK as usize) };
                    let w = st
                        .nvme
                        .as_mut()
                        .map(|n| n.write(&s, buf))
                        .unwrap_or(Err(TierError::BadSlot));
                    match w {
                        Ok(()) => {
                            self.to_nvme.fetch_add(1, Relaxed);
                            st.backings.get_mut(&id).expect("backing").chunks[i as usize].host =
                                Some(Host::Nvme(s));
                        }
                        Err(_) => {
                            // disk full or I/O error: keep the data in DRAM
                            self.spill_errors.fetch_add(1, Relaxed);
                            if let Some(n) = st.nvme.as_mut() {
                                let _ = n.free(s);
                            }
                            let ds = st.dram.alloc(CHUNK).map_err(|_| E_ALLOC)?;
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    staging as *const u8,
                                    ds.ptr,
                                    CHUNK as usize,
                                )
                            };
                            self.to_dram.fetch_add(1, Relaxed);
                            st.backings.get_mut(&id).expect("backing").chunks[i as usize].host =
                                Some(Host::Dram(ds));
                        }
                    }
                }
            }
            if vas.is_empty() {
                self.rt.unmap(src);
            }
            self.eviction_bytes.fetch_add(CHUNK, Relaxed);
        } else {
            self.clean_drops.fetch_add(1, Relaxed);
        }
        let b = st.backings.get_mut(&id).expect("backing");
        let c = &mut b.chunks[i as usize];
        for &va in &vas {
            self.rt.unmap(va + i as u64 * CHUNK);
        }
        self.rt.free_physical(c.phys);
        c.phys = 0;
        c.dirty = false;
        let uses: Vec<u64> = c.uses.drain(..).map(|u| u.1).collect();
        for ev in uses {
            unref_event(st, ev);
        }
        let d = (dev as usize).min(MAX_DEVICES - 1);
        st.devs[d].resident -= CHUNK;
        self.evictions.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Gives back deferred host slots once no issued copy can read them.
    fn reclaim(&self, st: &mut State) {
        if st.pending_free.is_empty() {
            return;
        }
        for d in 0..MAX_DEVICES {
            if st.devs[d].stream != 0 {
                self.rt.sync_stream(st.devs[d].stream);
            }
        }
        for h in std::mem::take(&mut st.pending_free) {
            free_host(st, h);
        }
    }

    /// Maps a chunk of an unmapped VMM handle at the device's scratch VA.
    fn scratch_map(&self, st: &mut State, dev: u32, id: u64, i: u32) -> Result<u64, i32> {
        let d = (dev as usize).min(MAX_DEVICES - 1);
        if st.devs[d].scratch_va == 0 {
            st.devs[d].scratch_va = self.rt.reserve(CHUNK)?;
        }
        let va = st.devs[d].scratch_va;
        let rc = self
            .rt
            .map(va, CHUNK, st.backings[&id].chunks[i as usize].phys);
        if rc != 0 {
            return Err(rc);
        }
        Ok(va)
    }

    /// A host slot for chunk (id, i): its existing (stale) one, else NVMe if
    /// the policy places it there, else DRAM below 95 % full, else NVMe,
    /// else DRAM anyway.
    fn host_slot(&self, st: &mut State, id: u64, i: u32) -> Result<Host, i32> {
        if let Some(h) = st.backings.get_mut(&id).expect("backing").chunks[i as usize]
            .host
            .take()
        {
            return Ok(h);
        }
        self.reclaim(st);
        // a chunk the policy places on NVMe (seed-heat: below the DRAM
        // threshold; markov: predicted cold) bypasses DRAM
        let key = chunk_key(&st.backings[&id], id, i);
        if self.policy.place(st.clock, key) == Some(Place::Nvme) {
            if let Some(n) = st.nvme.as_mut() {
                if let Ok(s) = n.alloc(CHUNK) {
                    return Ok(Host::Nvme(s));
                }
            }
        }
        let dram_ok = st.dram.used() + CHUNK <= (self.dram_limit as f64 * 0.95) as u64;
        if dram_ok {
            if let Ok(s) = st.dram.alloc(CHUNK) {
                return Ok(Host::Dram(s));
            }
        }
        if let Some(n) = st.nvme.as_mut() {
            match n.alloc(CHUNK) {
                Ok(s) => return Ok(Host::Nvme(s)),
                Err(_) => self.spill_errors.fetch_add(1, Relaxed),
            };
        }
        if let Ok(s) = st.dram.alloc(CHUNK) {
            return Ok(Host::Dram(s));
        }
        // full: the clean copies of resident chunks make room
        if self.drop_duplicates(st, 64 * CHUNK) > 0 {
            if let Ok(s) = st.dram.alloc(CHUNK) {
                return Ok(Host::Dram(s));
            }
        }
        Err(E_ALLOC)
    }

    /// Gives back up to `bytes` of DRAM held as clean copies of resident
    /// chunks (they become dirty: their next eviction copies out). Returns
    /// the bytes freed.
    fn drop_duplicates(&self, st: &mut State, bytes: u64) -> u64 {
        let mut dropped = Vec::new();
        let mut freed = 0u64;
        'outer: for b in st.backings.values_mut() {
            for c in b.chunks.iter_mut() {
                if freed >= bytes {
                    break 'outer;
                }
                if c.phys != 0 && !c.dirty && matches!(c.host, Some(Host::Dram(_))) {
                    if let Some(h) = c.host.take() {
                        dropped.push(h);
                        c.dirty = true;
                        freed += CHUNK;
                    }
                }
            }
        }
        if dropped.is_empty() {
            return 0;
        }
        // a queued copy-in may still read these slots: freed after a sync
        st.pending_free.extend(dropped);
        self.reclaim(st);
        freed
    }

    /// Background watermark work for `dev`: when HBM use is above `high` ×
    /// capacity, evict in the policy's order until it is at or below `low` ×
    /// capacity, stopping at the first chunk the policy expects within
    /// `KEEP_HORIZON` calls. Returns the chunks evicted.
    /// HBM use counts everything on the device (managed chunks and memory
    /// u3m does not manage), as the runtime reports it; the calling thread's
    /// device must be `dev`.
    pub fn enforce_watermarks(&self, dev: u32, low: f64, high: f64) -> u32 {
        let Ok((free, total)) = self.rt.mem_info() else {
            return 0;
        };
        if total == 0 || (total.saturating_sub(free) as f64) <= high * total as f64 {
            return 0;
        }
        let Ok(mut st) = self.st.lock() else { return 0 };
        let target = (total.saturating_sub(free) as f64 - low * total as f64).max(0.0) as u64;
        // one ordering per round; a chunk the policy expects within the
        // horizon ends the round: evicting it would only bring it back (the
        // headroom is a wish, demand eviction still makes room when needed)
        let now = st.clock;
        let ordered = self.candidates(&st, dev, &[]);
        let mut n = 0u32;
        for c in ordered {
            if (n as u64) * CHUNK >= target || self.policy.predicts(now, c.key, KEEP_HORIZON) {
                break;
            }
            let Some((id, i)) = resolve(&st, c.key) else {
                continue;
            };
            let ch = &st.backings[&id].chunks[i as usize];
            // busy chunks are skipped: the background never waits
            if ch.phys == 0
                || ch.pins != 0
                || !ch
                    .uses
                    .iter()
                    .all(|&(_, ev)| self.rt.event_done(ev).unwrap_or(true))
            {
                continue;
            }
            if self.evict(&mut st, id, i).is_err() {
                break;
            }
            n += 1;
        }
        n
    }

    /// An allocation u3m does not manage failed for lack of HBM: evict
    /// managed chunks of `dev` to make room for `bytes`. Ok(true) if any moved.
    pub fn make_room(&self, dev: u32, bytes: u64) -> bool {
        let Ok(mut st) = self.st.lock() else {
            return false;
        };
        let mut freed = 0;
        while freed < bytes {
            match self.evict_one(&mut st, dev, &[]) {
                Ok(true) => freed += CHUNK,
                _ => break,
            }
        }
        freed > 0
    }

    /// Makes every managed chunk of [addr, addr+len) resident and pins the
    /// backings for good (exported memory must stay where it is).
    pub fn pin_range(&self, dev: u32, addr: u64, len: u64) -> Result<(), i32> {
        if !self.active() {
            return Ok(());
        }
        let tok = self.prepare(
            dev,
            crate::opclass::OpClass::Other as u8,
            &[Range {
                addr,
                len,
                write: false,
            }],
            false,
            Order::Host,
        )?;
        if let Ok(mut st) = self.st.lock() {
            for &(id, _) in &tok.chunks {
                if let Some(b) = st.backings.get_mut(&id) {
                    b.pinned = true;
                }
            }
        }
        self.finish(tok, None, true);
        Ok(())
    }

    /// aclrtResetDevice: the runtime released everything on `dev`; forget
    /// those backings without calling it (their memory is already gone).
    pub fn forget_device(&self, dev: u32) {
        let Ok(mut st) = self.st.lock() else { return };
        let ids: Vec<u64> = st
            .backings
            .iter()
            .filter(|(_, b)| b.dev == dev)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            if let Some(mut b) = st.backings.remove(&id) {
                for va in &b.vas {
                    st.vas.remove(va);
                }
                for c in b.chunks.iter_mut() {
                    if let Some(h) = c.host.take() {
                        free_host(&mut st, h);
                    }
                    c.uses.clear();
                }
                self.live.fetch_sub(1, Relaxed);
            }
        }
        let d = (dev as usize).min(MAX_DEVICES - 1);
        st.devs[d] = Dev::new();
    }

    /// Background spill, the seed's emergency path: while DRAM is above 95 %
    /// of its limit, chunks that live only in DRAM (least recently used
    /// first) move to NVMe, at most `ssd_rate` × `dt_s` bytes per call.
    /// Returns the chunks moved.
    pub fn spill_dram(&self, dt_s: f64) -> u32 {
        let Ok(mut st) = self.st.lock() else { return 0 };
        if st.nvme.is_none() || (st.dram.used() as f64) <= 0.95 * self.dram_limit as f64 {
            return 0;
        }
        let budget = (self.ssd_rate as f64 * dt_s).max(CHUNK as f64) as u64;
        let mut cands: Vec<(u64, u64, u32)> = Vec::new();
        for (&id, b) in st.backings.iter() {
            for (i, c) in b.chunks.iter().enumerate() {
                if c.phys == 0 && c.pins == 0 && matches!(c.host, Some(Host::Dram(_))) {
                    cands.push((c.last, id, i as u32));
                }
            }
        }
        cands.sort_unstable();
        let (mut moved, mut bytes) = (0u32, 0u64);
        for (_, id, i) in cands {
            if bytes >= budget || (st.dram.used() as f64) <= 0.90 * self.dram_limit as f64 {
                break;
            }
            let Some(Host::Dram(ds)) = st
                .backings
                .get_mut(&id)
                .and_then(|b| b.chunks[i as usize].host.take())
            else {
                continue;
            };
            let slot = st.nvme.as_mut().map(|n| n.alloc(CHUNK));
            let ok = match slot {
                Some(Ok(ns)) => {
                    let src =
                        unsafe { std::slice::from_raw_parts(ds.ptr as *const u8, CHUNK as usize) };
                    match st.nvme.as_mut().map(|n| n.write(&ns, src)) {
                        Some(Ok(())) => {
                            st.backings.get_mut(&id).expect("backing").chunks[i as usize].host =
                                Some(Host::Nvme(ns));
                            true
                        }
                        _ => {
                            if let Some(n) = st.nvme.as_mut() {
                                let _ = n.free(ns);
                            }
                            false
                        }
                    }
                }
                _ => false,
            };
            if ok {
                let _ = st.dram.free(ds);
                self.to_nvme.fetch_add(1, Relaxed);
                self.spilled.fetch_add(1, Relaxed);
                moved += 1;
                bytes += CHUNK;
            } else {
                // disk full or I/O error: the data stays in DRAM
                self.spill_errors.fetch_add(1, Relaxed);
                st.backings.get_mut(&id).expect("backing").chunks[i as usize].host =
                    Some(Host::Dram(ds));
                break;
            }
        }
        moved
    }

    /// At exit: the swap file's private directory goes (the file itself was
    /// unlinked when opened).
    pub fn shutdown(&self) {
        if let Ok(mut st) = self.st.lock() {
            drop(st.nvme.take());
        }
    }

    /// The policy's periodic work (`secs` since the engine started) and its
    /// events since the last call.
    pub fn tick_policy(&self, secs: f64) -> Vec<String> {
        let frac = self.st.lock().map(|st| {
            let (r, c) = st
                .devs
                .iter()
                .fold((0u64, 0u64), |(r, c), d| (r + d.resident, c + d.capacity));
            if c == 0 {
                0.0
            } else {
                r as f64 / c as f64
            }
        });
        self.policy.tick(secs, frac.unwrap_or(0.0));
        let mut ev = Vec::new();
        self.policy.drain_events(&mut ev);
        ev
    }

    /// Card failure: `dev` disappeared with its HBM. Chunks whose current
    /// data was only there are lost; chunks with a current copy in DRAM or
    /// on NVMe stay readable through `read_lost`. Returns (lost, readable)
    /// managed allocations as (device VA or handle, bytes), or None when the
    /// device was already known lost. Nothing on `dev` is called again.
    pub fn device_lost(&self, dev: u32) -> Option<(Vec<(u64, u64)>, Vec<(u64, u64)>)> {
        let mut st = self.st.lock().ok()?;
        let d = (dev as usize).min(MAX_DEVICES - 1);
        if st.devs[d].lost {
            return None;
        }
        st.devs[d].lost = true;
        self.lost_any.store(true, Relaxed);
        st.devs[d].resident = 0;
        let (mut lost, mut kept) = (Vec::new(), Vec::new());
        let mut ids: Vec<u64> = st
            .backings
            .iter()
            .filter(|(_, b)| b.dev == dev)
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            let st2 = &mut *st;
            let b = st2.backings.get_mut(&id).expect("backing");
            let mut any_lost = false;
            for c in b.chunks.iter_mut() {
                if c.phys != 0 {
                    if c.dirty || c.host.is_none() {
                        c.lost = true;
                        any_lost = true;
                        // a stale host copy must never be served as current
                        if let Some(h) = c.host.take() {
                            st2.pending_free.push(h);
                        }
                    }
                    c.phys = 0; // gone with the device: never freed or unmapped
                    c.dirty = false;
                }
                c.uses.clear();
                c.pins = 0;
            }
            let b = &st.backings[&id];
            let name = b.vas.first().copied().unwrap_or(handle_of(id));
            if any_lost {
                lost.push((name, b.size));
            } else {
                kept.push((name, b.size));
            }
        }
        // host slots of lost chunks: nothing of ours runs on the lost device
        for h in std::mem::take(&mut st.pending_free) {
            free_host(&mut st, h);
        }
        Some((lost, kept))
    }

    /// A device-to-host read of `len` bytes at device address `src` into
    /// `dst` for a device that has disappeared: served from the host copies.
    /// None: `src` is not managed memory of a lost device (the caller does
    /// the real copy). Some(E_DEVICE_LOST): part of the range was lost.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes.
    pub unsafe fn read_lost(&self, src: u64, dst: *mut u8, len: u64) -> Option<i32> {
        let mut st = self.st.lock().ok()?;
        let (&start, &(id, size)) = st.vas.range(..=src).next_back()?;
        if src >= start + size {
            return None;
        }
        let b = st.backings.get(&id)?;
        if !st.devs[(b.dev as usize).min(MAX_DEVICES - 1)].lost {
            return None;
        }
        if dst.is_null() || src + len > start + size {
            return Some(E_DEVICE_LOST);
        }
        let off = src - start;
        let mut done = 0u64;
        while done < len {
            let at = off + done;
            let i = (at / CHUNK) as usize;
            let within = at % CHUNK;
            let n = (CHUNK - within).min(len - done);
            let out = std::slice::from_raw_parts_mut(dst.add(done as usize), n as usize);
            let st2 = &mut *st;
            let c = &st2.backings[&id].chunks[i];
            if c.lost {
                return Some(E_DEVICE_LOST);
            }
            match &c.host {
                None => out.fill(0), // never written: fresh memory reads as zeros
                Some(Host::Dram(slot)) => std::ptr::copy_nonoverlapping(
                    slot.ptr.add(within as usize),
                    out.as_mut_ptr(),
                    n as usize,
                ),
                Some(Host::Nvme(slot)) => {
                    let r = st2
                        .nvme
                        .as_mut()
                        .map(|nv| nv.read_at(slot, within, out))
                        .unwrap_or(Err(TierError::BadSlot));
                    if r.is_err() {
                        self.spill_errors.fetch_add(1, Relaxed);
                        return Some(E_DEVICE_LOST);
                    }
                }
            }
            done += n;
        }
        Some(0)
    }

    /// Whether any device has been lost (the copy hooks' fast check).
    pub fn any_lost(&self) -> bool {
        self.lost_any.load(Relaxed)
    }

    /// Devices with managed memory (for the background thread).
    pub fn devices(&self) -> Vec<u32> {
        let Ok(st) = self.st.lock() else {
            return Vec::new();
        };
        let mut v: Vec<u32> = st
            .backings
            .values()
            .map(|b| b.dev)
            .filter(|&d| !st.devs[(d as usize).min(MAX_DEVICES - 1)].lost)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    pub fn runtime(&self) -> &'static dyn Runtime {
        self.rt
    }
}

fn free_host(st: &mut State, h: Host) {
    match h {
        Host::Dram(s) => {
            let _ = st.dram.free(s);
        }
        Host::Nvme(s) => {
            if let Some(n) = st.nvme.as_mut() {
                let _ = n.free(s);
            }
        }
    }
}

/// Makes `ev` (recorded on `stream`) the latest use of chunk (id, i) on
/// that stream, taking a reference and dropping the one of the event it
/// replaces.
fn set_use(st: &mut State, id: u64, i: u32, stream: u64, ev: u64) {
    let mut old = None;
    if let Some(c) = st
        .backings
        .get_mut(&id)
        .and_then(|b| b.chunks.get_mut(i as usize))
    {
        match c.uses.iter_mut().find(|u| u.0 == stream) {
            Some(u) => {
                if u.1 == ev {
                    return;
                }
                old = Some(u.1);
                u.1 = ev;
            }
            None => c.uses.push((stream, ev)),
        }
    } else {
        return;
    }
    *st.event_refs.entry(ev).or_insert(0) += 1;
    if let Some(o) = old {
        unref_event(st, o);
    }
}

fn unref_event(st: &mut State, ev: u64) {
    if let Some(r) = st.event_refs.get_mut(&ev) {
        *r -= 1;
        if *r == 0 {
            st.event_refs.remove(&ev);
            st.free_events.push(ev);
        }
    }
}

/// u3m's handles for aclrtMallocPhysical: odd values with a tag, so they can
/// never be mistaken for a runtime pointer.
const HANDLE_TAG: u64 = 0x0075_3300_0000_0001;
fn handle_of(id: u64) -> u64 {
    HANDLE_TAG | (id << 1)
}
fn id_of(h: u64) -> Option<u64> {
    if h & 0xffff_0000_0000_0001 == HANDLE_TAG & 0xffff_0000_0000_0001
        && h & 0x0000_ff00_0000_0000 == HANDLE_TAG & 0x0000_ff00_0000_0000
    {
        Some((h & 0x0000_00ff_ffff_fffe) >> 1)
    } else {
        None
    }
}

/// Chunk (backing id, index) of a policy key (`chunk_key`'s inverse).
fn resolve(st: &State, key: u64) -> Option<(u64, u32)> {
    if key & (1 << 63) != 0 {
        let id = (key & !(1 << 63)) >> 24;
        let i = (key & 0xff_ffff) as u32;
        return st
            .backings
            .get(&id)
            .filter(|b| (i as usize) < b.chunks.len() && b.vas.is_empty())
            .map(|_| (id, i));
    }
    let (&start, &(id, len)) = st.vas.range(..=key).next_back()?;
    if key >= start + len {
        return None;
    }
    let b = st.backings.get(&id)?;
    // keys name a chunk by its backing's first VA
    if b.vas.first() != Some(&start) {
        return None;
    }
    Some((id, ((key - start) / CHUNK) as u32))
}

/// The policy's name for chunk `i` of backing `id`: the device VA of its
/// first mapping, else (a VMM handle mapped nowhere) a key above every VA.
fn chunk_key(b: &Backing, id: u64, i: u32) -> u64 {
    match b.vas.first() {
        Some(va) => va + i as u64 * CHUNK,
        None => (1 << 63) | (id << 24) | i as u64,
    }
}

fn physical_ram() -> u64 {
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if pages > 0 && size > 0 {
        pages as u64 * size as u64
    } else {
        8 << 30
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_are_recognisable() {
        for id in [1u64, 2, 1000, (1 << 38) - 1] {
            assert_eq!(id_of(handle_of(id)), Some(id));
        }
        assert_eq!(id_of(0x5555_0000_1000), None);
        assert_eq!(id_of(0x1000_0000_0000), None);
    }
}
