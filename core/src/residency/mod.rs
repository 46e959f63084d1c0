//! Residency at the same address (tier mode): managed device memory is a set
//! of 2 MiB chunks that live in HBM (mapped at their VA), in pinned DRAM or
//! in an NVMe swap file, and are brought back before anything touches them.
//!
//! A *backing* is what the program allocated: an aclrtMalloc-family
//! allocation (u3m reserves the VA itself and keeps it mapped for its whole
//! life) or a physical handle u3m handed out for aclrtMallocPhysical (mapped
//! wherever the program maps it). Each chunk of a backing is in one of:
//!   unbacked     never touched: no memory anywhere (reads as fresh memory)
//!   resident     a physical 2 MiB handle, mapped at every VA of the backing;
//!                maybe with a clean host copy (`host`, `dirty == false`)
//!   host         only in DRAM or NVMe (`host`)
//!   host-mapped  a pinned host physical handle mapped at every VA of the
//!                backing (`on_host`): reached over the link (`hostmap`)
//! Invariants: a chunk is never unmapped while a call that may touch it is in
//! flight (`pins` during the call, `uses`: per-stream events that complete
//! after it — a stream's shared use fence, recorded when someone asks
//! (`fence`) — all complete before eviction); a chunk a call needs is never evicted
//! for that call; pinned backings (IPC-exported) never move.
//!
//! The manager is split along its seams:
//! - `shards`: one state per device (`Shard`), each behind its own lock,
//!   and what routes a call, a free or a handle to its device's state;
//! - `state`: chunks, backings, per-device data, the stores, event pool;
//! - `lifecycle`: malloc/free, VMM handles, map/unmap, export;
//! - `protocol`: a call's `prepare`/`finish`, ordering with events;
//! - `fence`: use fences, one lazily recorded event per stream and round;
//! - `migrate`: copy-in (fault-in) and copy-out, host slots, DRAM→NVMe spill;
//! - `evict`: victim choice, demand and watermark eviction;
//! - `hostmap`: calls larger than HBM: refused, or run with host-mapped chunks;
//! - `prefetch`: background copy-ins the policy predicts;
//! - `planned`: evictions an outside schedule names (`u3m replay --plan`,
//!   U3M_PLAN);
//! - `schedule`: U3M_PLAN's file, by call;
//! - `planner`: a schedule computed from one step (a greedy link-budget
//!   planner; pure: U3M_PLAN=auto and `u3m replay --greedy-plan` run it);
//! - `autoplan`: U3M_PLAN=auto: the step found, recorded and planned by u3m;
//! - `lost`: a device that disappeared, reads served from host copies;
//! - `counters`: what moved.
//!
//! Each device's state is behind its own mutex (`shards`: a call on one
//! device never waits for another device's residency work); what they share
//! — the policy, the DRAM/NVMe stores, counters, clock, VA routing — has its
//! own short locks or atomics. This is the slow path of tier mode; the heat
//! table stays lock-free. A device's lock is still held across its own
//! synchronous copies and stream synchronisations (issue 10 part 2's second
//! half: not done).

mod ahead;
mod autoplan;
mod balance;
mod counters;
mod evict;
mod fence;
mod hostmap;
mod lifecycle;
mod lost;
mod migrate;
mod planned;
pub mod planner;
mod prefetch;
mod probe;
mod protocol;
mod schedule;
mod shards;
mod state;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

use crate::acl::AclError;
use crate::config::{Config, OutFirst};
use crate::engine::report::Refusal;
use crate::engine::runtime::{Runtime, CHUNK};
use crate::policy::Placement;
use crate::store::dram::{DramStore, HostAllocator};
use crate::store::nvme::NvmeStore;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;

pub use autoplan::{AutoParams, AutoState};
pub use counters::Counters;
pub use evict::Room;
pub use hostmap::Oversize;
pub use lifecycle::{malloc_policy_known, malloc_room};
pub use lost::Allocations;
pub use protocol::Order;
pub use schedule::{id_of, ordinal_of, Schedule};
pub use shards::{ForkHold, Residency, Token};
use state::State;
pub use state::{Move, MoveKind};

pub const MAX_DEVICES: usize = 16;
/// How far ahead (tracked calls) the background prefetch looks: it brings
/// back what the policy expects within this many calls.
pub const BACKGROUND_HORIZON: u64 = 256;
/// Background eviction leaves every chunk the policy expects within this
/// many calls (about a training step of a mid-sized model): under a cyclic
/// working set larger than HBM such a chunk would come straight back, and the
/// headroom would only shrink the cache. Demand eviction still makes room.
pub const KEEP_HORIZON: u64 = 4096;

const E_ALLOC: AclError = AclError::RT_MEMORY_ALLOCATION;
/// What the runtime returns for a device that has gone away.
pub const E_DEVICE_LOST: AclError = AclError::RT_DEVICE_TASK_ABORT;

/// Why residency work stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fail {
    /// Nothing can move right now because other calls hold what is
    /// resident; the caller drops the lock and tries again.
    Busy,
    Acl(AclError),
}

impl From<AclError> for Fail {
    fn from(e: AclError) -> Fail {
        Fail::Acl(e)
    }
}

impl Fail {
    /// What the program sees: residency that cannot be had is an
    /// allocation failure.
    fn acl(self) -> AclError {
        match self {
            Fail::Busy => E_ALLOC,
            Fail::Acl(e) => e,
        }
    }
}

/// One device's residency manager: its backings and chunks, behind its own
/// lock (`st`), so a call on another device never waits for this one's
/// work. What every device shares — the policy, the DRAM and NVMe stores,
/// the counters, the logical clock and the VA routing — is in `Parts`;
/// `shards::Residency` holds one per device and routes each call.
pub struct Shard {
    /// The device this state is for (its index).
    shard: u32,
    /// The runtime, with use fences recorded lazily: `fences` (`fence`).
    rt: &'static dyn Runtime,
    fences: &'static fence::Fenced,
    policy: Arc<dyn Placement>,
    /// `policy` when it is the per-thread buffering wrapper (the usual
    /// case: `Placement::as_buffered`), called without the vtable.
    buffered: BufferedRef,
    /// bytes/s the background spill from DRAM to NVMe may write (U3M_SSD_RATE)
    ssd_rate: u64,
    st: state::StLock,
    min_bytes: u64,
    oversub: f64,
    dram_limit: u64,
    nvme_limit: u64,
    alloc_wait_ms: u64,
    /// U3M_HOST_MAP=auto: calls larger than HBM run with host-mapped chunks.
    host_map: bool,
    /// Backings alive on every device: the hot path skips everything when 0.
    live: Arc<AtomicU64>,
    c: Arc<counters::Live>,
    /// Foreground evictions and busy retries so far, and the figure the
    /// last prefetch round saw: prefetch runs only after a round without
    /// demand (else it competes with calls for the same free chunks).
    demand: AtomicU64,
    demand_seen: AtomicU64,
    /// Some device has been lost (the hot paths' cheap check).
    lost_any: AtomicBool,
    /// The figures of the last allocation `malloc` refused (for one line).
    refusal: Mutex<Option<Refusal>>,
    /// The figures of the last call refused as larger than what can be
    /// made accessible (for the engine's one line, which names the call).
    oversize: Mutex<Option<Oversize>>,
    /// What U3M_HOST_MAP does with read-once streams (`hostmap::map_streams`,
    /// `probe`).
    read_once: crate::config::ReadOnce,
    /// The look-ahead prefetch is off (`set_look_ahead`).
    ahead_off: AtomicBool,
    /// U3M_OUT_FIRST (balance.rs).
    out_first: OutFirst,
    /// U3M_HANDOFF (migrate.rs `take_outgoing`).
    handoff: bool,
    /// U3M_PLAN (schedule.rs), while it is followed (`Followed`).
    schedule: Option<Arc<Followed>>,
    /// Lowest start and highest end of every VA range ever entered in
    /// `State::vas` (never shrinks): a call whose ranges all lie outside
    /// touches nothing u3m manages, and `prepare` skips the lock
    /// (protocol.rs `note_va`).
    va_lo: AtomicU64,
    va_hi: AtomicU64,
    /// The logical clock every device's calls tick (one per tracked call).
    clock: Arc<AtomicU64>,
    /// VA start -> (bytes, device) of every device's `State::vas` entries:
    /// where a free, an unmap or a call spanning devices goes (a leaf lock,
    /// written under the device's lock).
    routes: Arc<RwLock<BTreeMap<u64, (u64, u32)>>>,
    /// Per device: managed virtual bytes beyond its HBM capacity, published
    /// by its state for the other devices' malloc (the host tiers hold the
    /// excess of all devices).
    excess: Arc<[AtomicU64; MAX_DEVICES]>,
    /// Set for good once some device's managed memory reached half its HBM
    /// or a chunk was evicted (`whole_writes_matter`).
    crowded: Arc<AtomicBool>,
    /// Set for good once the program queued work that waits for its host
    /// (`program_waits_on_host`): U3M_HANDOFF's ordered evictions stop.
    host_waits: Arc<AtomicBool>,
}

/// The policy of a `Shard` as [`Buffered`](crate::policy::pending::Buffered),
/// if it is one: a pointer into the `Arc` the same shard holds (`policy`),
/// so it lives as long as the shard, and is never moved (an `Arc`'s
/// contents do not move).
struct BufferedRef(Option<std::ptr::NonNull<crate::policy::pending::Buffered>>);

// SAFETY: a shared reference to a `Buffered` (Sync: a `Placement`), held
// alongside the `Arc` that owns it
unsafe impl Send for BufferedRef {}
unsafe impl Sync for BufferedRef {}

impl BufferedRef {
    fn of(policy: &Arc<dyn Placement>) -> BufferedRef {
        BufferedRef(policy.as_buffered().map(std::ptr::NonNull::from))
    }

    #[inline(always)]
    fn get(&self) -> Option<&crate::policy::pending::Buffered> {
        // SAFETY: see the type: the shard's own `policy` keeps it alive
        self.0.map(|p| unsafe { p.as_ref() })
    }
}

/// What every device's `Shard` shares.
#[derive(Clone)]
pub(super) struct Parts {
    policy: Arc<dyn Placement>,
    dram: state::Shared<DramStore<Box<dyn HostAllocator>>>,
    nvme: Option<state::Shared<NvmeStore>>,
    live: Arc<AtomicU64>,
    c: Arc<counters::Live>,
    clock: Arc<AtomicU64>,
    routes: Arc<RwLock<BTreeMap<u64, (u64, u32)>>>,
    excess: Arc<[AtomicU64; MAX_DEVICES]>,
    crowded: Arc<AtomicBool>,
    host_waits: Arc<AtomicBool>,
    schedule: Option<Arc<Followed>>,
    dram_limit: u64,
    nvme_limit: u64,
}

/// U3M_PLAN's schedule and how following it went (every device's).
pub(super) struct Followed {
    /// A file's, read at start; U3M_PLAN=auto's, once planned.
    plan: std::sync::OnceLock<Schedule>,
    /// U3M_PLAN=auto (autoplan.rs).
    auto: Option<autoplan::Auto>,
    /// Set for good by the first entry the run did not match.
    off: AtomicBool,
    /// Why it stopped, for the engine's line at exit.
    stopped: Mutex<Option<String>>,
}

/// Host memory for the DRAM store through the runtime (aclrtMallocHost).
struct RtHost(&'static dyn Runtime);
impl HostAllocator for RtHost {
    fn alloc(&self, bytes: usize) -> Result<*mut u8, i32> {
        self.0.malloc_host(bytes as u64).map_err(AclError::raw)
    }
    fn free(&self, ptr: *mut u8, _bytes: usize) {
        let _ = self.0.free_host(ptr);
    }
}

impl Parts {
    /// The shared parts under `cfg`, with `policy`.
    pub(super) fn new(
        rt: &'static dyn Runtime,
        cfg: &Config,
        policy: Box<dyn Placement>,
    ) -> Result<Parts, String> {
        let dram_limit = if cfg.dram_bytes == 0 {
            physical_ram() / 2
        } else {
            cfg.dram_bytes
        };
        let dram = DramStore::new(
            dram_limit,
            256 << 20,
            Box::new(RtHost(rt)) as Box<dyn HostAllocator>,
        );
        // U3M_SWAP_DIR alone: sized from the file system's free space
        let nvme_bytes = cfg.nvme_bytes()?;
        let nvme = match &cfg.swap_dir {
            Some(d) if nvme_bytes > 0 => Some(
                NvmeStore::new(d, nvme_bytes, 256 << 20)
                    .map_err(|e| format!("U3M_SWAP_DIR: {e}"))?,
            ),
            _ => None,
        };
        let nvme_limit = if nvme.is_some() { nvme_bytes } else { 0 };
        let schedule = match &cfg.plan {
            Some(p) => {
                let (plan, auto) = match p.to_str() {
                    Some("auto") => (
                        std::sync::OnceLock::new(),
                        Some(autoplan::Auto::new(autoplan::AutoParams {
                            min_gap_us: cfg.plan_min_gap_us,
                            link_gbps: cfg.link_gbps,
                        })),
                    ),
                    _ => (std::sync::OnceLock::from(Schedule::load(p)?), None),
                };
                Some(Arc::new(Followed {
                    plan,
                    auto,
                    off: AtomicBool::new(false),
                    stopped: Mutex::new(None),
                }))
            }
            None => None,
        };
        Ok(Parts {
            policy: Arc::from(policy),
            dram: state::Shared::new(dram),
            nvme: nvme.map(state::Shared::new),
            live: Arc::new(AtomicU64::new(0)),
            c: Arc::new(counters::Live::default()),
            clock: Arc::new(AtomicU64::new(0)),
            routes: Arc::new(RwLock::new(BTreeMap::new())),
            excess: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
            crowded: Arc::new(AtomicBool::new(false)),
            host_waits: Arc::new(AtomicBool::new(false)),
            schedule,
            dram_limit,
            nvme_limit,
        })
    }
}

impl Shard {
    /// Device `shard`'s manager over the shared `parts`.
    pub(super) fn new(rt: &'static dyn Runtime, cfg: &Config, parts: &Parts, shard: u32) -> Shard {
        // one small object per manager (a process has one; tests and the
        // replayer a few), leaked so the manager's modules keep a
        // `&'static dyn Runtime`
        let fences: &'static fence::Fenced = Box::leak(Box::new(fence::Fenced::new(rt, shard)));
        // backing ids of this state are `shard` modulo MAX_DEVICES (never 0)
        let first_id = MAX_DEVICES as u64 + shard as u64;
        Shard {
            shard,
            rt: fences,
            fences,
            policy: parts.policy.clone(),
            buffered: BufferedRef::of(&parts.policy),
            ssd_rate: cfg.ssd_rate.max(1),
            st: state::StLock::new(State::new(parts.dram.clone(), parts.nvme.clone(), first_id)),
            min_bytes: cfg.min_bytes.max(1),
            oversub: cfg.oversub,
            dram_limit: parts.dram_limit,
            nvme_limit: parts.nvme_limit,
            alloc_wait_ms: cfg.alloc_wait_ms,
            host_map: cfg.host_map,
            live: parts.live.clone(),
            c: parts.c.clone(),
            demand: AtomicU64::new(0),
            demand_seen: AtomicU64::new(0),
            lost_any: AtomicBool::new(false),
            refusal: Mutex::new(None),
            oversize: Mutex::new(None),
            read_once: cfg.read_once,
            ahead_off: AtomicBool::new(!cfg.look_ahead),
            out_first: cfg.out_first,
            handoff: cfg.handoff,
            schedule: parts.schedule.clone(),
            va_lo: AtomicU64::new(u64::MAX),
            va_hi: AtomicU64::new(0),
            clock: parts.clock.clone(),
            routes: parts.routes.clone(),
            excess: parts.excess.clone(),
            crowded: parts.crowded.clone(),
            host_waits: parts.host_waits.clone(),
        }
    }

    /// Enters `[va, va+len)` of this device in the routing table (with the
    /// state's lock held, beside `State::vas`).
    fn route(&self, va: u64, len: u64) {
        if let Ok(mut r) = self.routes.write() {
            r.insert(va, (len, self.shard));
        }
    }

    /// Removes the routing entry at `va` (beside `State::vas`).
    fn unroute(&self, va: u64) {
        if let Ok(mut r) = self.routes.write() {
            r.remove(&va);
        }
    }

    /// Publishes this device's excess over its HBM (`excess`), after its
    /// managed virtual bytes or capacity changed.
    fn publish(&self, st: &State) {
        let d = st.dev(self.shard);
        if d.capacity != 0 && d.managed_virtual >= d.capacity / 2 {
            self.crowd();
        }
        self.excess[state::dev_index(self.shard)].store(
            if d.capacity == 0 {
                0
            } else {
                d.managed_virtual.saturating_sub(d.capacity)
            },
            Relaxed,
        );
    }

    /// Marks the process as one whose calls' whole writes matter from now
    /// on (`Residency::whole_writes_matter`); a store only the first time.
    fn crowd(&self) {
        if !self.crowded.load(Relaxed) {
            self.crowded.store(true, Relaxed);
        }
    }

    /// Before capture begins on `stream`: the fence its earlier calls named
    /// is recorded now (a capturing stream records into the graph).
    pub fn before_capture(&self, stream: u64) {
        self.fences.close_stream(stream);
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

    /// Appends to `out` every managed chunk of `dev` in HBM now, as (the
    /// device VA of its backing's first mapping + its offset, whether
    /// evicting it needs a copy-out). For tools (`u3m replay --held`):
    /// it scans every backing of the device with the lock held.
    pub fn resident_chunks(&self, dev: u32, out: &mut Vec<(u64, bool)>) {
        let Ok(st) = self.st.lock() else {
            return;
        };
        for b in st.backings.values() {
            let Some(&va) = b.vas.first() else { continue };
            if b.dev != dev {
                continue;
            }
            for (i, c) in b.chunks.iter().enumerate() {
                if c.in_hbm() {
                    out.push((va + i as u64 * CHUNK, c.needs_copy_out()));
                }
            }
        }
    }

    /// Starts (`on`) or stops keeping a log of every chunk copied in or
    /// evicted (`State::moves`; stopping drops what is logged). For tools
    /// (`u3m replay --audit`): while on, each eviction also asks the policy
    /// for the chunk's next use.
    pub fn set_move_log(&self, on: bool) {
        if let Ok(mut st) = self.st.lock() {
            st.moves = on.then(|| st.moves.take().unwrap_or_default());
        }
    }

    /// Appends the moves logged since the last call to `out`.
    pub fn take_moves(&self, out: &mut Vec<Move>) {
        if let Ok(mut st) = self.st.lock() {
            if let Some(m) = st.moves.as_mut() {
                out.append(m);
            }
        }
    }

    /// Whether some managed chunk resident on `dev` may yet leave HBM: one
    /// in a call in flight will, once the call ends; exported memory and,
    /// in a forked child, what was resident at the fork never will. Scans
    /// the device's backings: for the rare caller that found no room.
    pub fn may_move(&self, dev: u32) -> bool {
        let Ok(st) = self.st.lock() else {
            return false;
        };
        st.backings.values().any(|b| {
            b.dev == dev
                && !b.pinned
                && b.real() == 0
                && b.chunks
                    .iter()
                    .any(|c| c.phys != 0 && c.pins < lifecycle::FORK_PINNED)
        })
    }

    /// Bytes of managed memory of `dev` host-mapped now.
    pub fn host_mapped(&self, dev: u32) -> u64 {
        self.st
            .lock()
            .map(|st| st.dev(dev).host_mapped)
            .unwrap_or(0)
    }

    /// Foreground evictions and busy retries so far: a background round
    /// that sees this move since the last one leaves the watermarks alone
    /// (the program is making room on demand; engine `tier_tick`, replay).
    pub fn demand_count(&self) -> u64 {
        self.demand.load(Relaxed)
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

    /// The figures of the allocation `malloc` last refused, once.
    pub fn take_refusal(&self) -> Option<Refusal> {
        self.refusal.lock().ok()?.take()
    }

    /// Whether any managed memory exists (any device).
    #[inline]
    fn active(&self) -> bool {
        self.live.load(Relaxed) != 0
    }

    pub fn set_capacity(&self, dev: u32, total: u64) {
        if let Ok(mut st) = self.st.lock() {
            st.dev_mut(dev).capacity = total;
            self.publish(&st);
        }
    }

    pub fn capacity(&self, dev: u32) -> u64 {
        self.st.lock().map(|st| st.dev(dev).capacity).unwrap_or(0)
    }

    /// Devices with managed memory that are not lost (for the background
    /// thread).
    pub fn devices(&self) -> Vec<u32> {
        let Ok(st) = self.st.lock() else {
            return Vec::new();
        };
        let mut v: Vec<u32> = st
            .backings
            .values()
            .map(|b| b.dev)
            .filter(|&d| !st.dev(d).lost)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// At exit: the swap file's private directory goes (the file itself was
    /// unlinked when opened).
    pub fn shutdown(&self) {
        if let Ok(mut st) = self.st.lock() {
            drop(st.nvme.take());
        }
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
