//! The engine the interposer drives: what was allocated, what was touched,
//! reported live, and — in tier mode — the residency manager around every
//! call. Plain Rust with no exports: `libu3m.so`'s hooks decode each call's
//! C arguments into a `Call` (`call.rs`) and make one `Engine::run` with the
//! real function (`run.rs`: device work; `detour.rs`: calls the engine may
//! own — allocation, VMM — or only observes). This module holds the
//! observation (heat table, stats segment, trace) and the background round.
//!
//! Hot-path methods (`op`, `copy`, `memset`, `collective`, `count_call`) use
//! atomics only: the heat table's lock-free `touch`, relaxed counters in the
//! stats segment, the trace recorder's lock-free queue. Allocation-side methods
//! are cold and may lock.

mod applier;
pub mod call;
mod detour;
mod failure;
mod ids;
mod publish;
pub mod report;
mod run;
pub mod runtime;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use crate::acl::MemcpyKind;
use crate::config::{Config, LogLevel};
use crate::heat::{Access, AllocKind, HeatTable};
use crate::monitor::Monitor;
use crate::opclass::{self, OpClass};
pub use crate::perthread::Here;
use crate::shm::{mono_ns, EventKind, SegmentConfig, StatsSegment, MAX_DEVICES};
use crate::trace::event::Range as TraceRange;
use crate::trace::recorder::{Rec, Recorder, RecorderConfig};

pub use crate::heat::PinReason;
use crate::residency;
pub use crate::residency::{ForkHold, Order, Residency, Token};
pub use call::{Api, Call, Launch, LaunchKind, Memcpy, Out, Queue};
use ids::SmallIds;
pub use runtime::Runtime;

/// Background prefetch per 20 ms round: 25 GB/s (PCIe 4.0 x16 in practice,
/// design.md §2) × 20 ms.
const PREFETCH_BYTES_PER_TICK: u64 = 500_000_000;

/// Ranges a launch keeps in fixed arrays (the trace, kernel blobs); a wider
/// one spills to the heap: no range is ever cut.
pub const MAX_OP_RANGES: usize = 64;

/// A device range an operation touches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Range {
    pub addr: u64,
    pub len: u64,
    pub write: bool,
    /// A write of every byte of the range, none read first (a copy's or a
    /// memset's destination, an operator's out-of-place output): a chunk
    /// it covers needs no copy-in when no other range of the call touches
    /// it (residency's `push_chunks`). Only the call's own knowledge, never
    /// a prediction. Implies `write`.
    pub whole: bool,
}

impl Range {
    pub const ZERO: Range = Range {
        addr: 0,
        len: 0,
        write: false,
        whole: false,
    };
}

/// The device ranges of a copy (at most two: the source read, the
/// destination written), by the one copy-direction rule
/// (`MemcpyKind::sides`). `dspan`/`sspan`: the bytes each side spans (a
/// pitched 2-D copy spans more than it moves).
pub fn copy_ranges(
    kind: MemcpyKind,
    dst: u64,
    dspan: u64,
    src: u64,
    sspan: u64,
) -> ([Range; 2], usize) {
    let (d, s) = kind.sides();
    let mut r = [Range::ZERO; 2];
    let mut n = 0;
    if s.maybe_device() {
        r[n] = Range {
            addr: src,
            len: sspan,
            write: false,
            whole: false,
        };
        n += 1;
    }
    if d.maybe_device() {
        r[n] = Range {
            addr: dst,
            len: dspan,
            write: true,
            whole: false,
        };
        n += 1;
    }
    (r, n)
}

/// Which call allocated device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocApi {
    Malloc,
    MallocAlign32,
    MallocCached,
    MallocWithCfg,
    MallocPhysical,
}

// stats-segment tiers and copy kinds
const TIER_HBM: usize = 0;

/// Per physical handle: device, size, and where it is mapped.
struct Handle {
    dev: u32,
    size: u64,
    maps: Vec<u64>,
    exported: bool,
}

pub struct Engine {
    cfg: Config,
    heat: HeatTable,
    seg: Option<StatsSegment>,
    rec: Option<Recorder>,
    seq: AtomicU64,
    streams: SmallIds,
    pid: u32,
    /// mono_ns() when the engine started (policy ticks count from it).
    started_ns: u64,
    aclnn_launches: AtomicU64,
    tensors: AtomicU64,
    /// cold-path bookkeeping
    handles: Mutex<HashMap<u64, Handle>>,
    mappings: Mutex<HashMap<u64, (u64, u64)>>, // va -> (len, handle)
    host: Mutex<HashMap<u64, u64>>,            // pinned host / registered: addr -> len
    graphs: Mutex<Graphs>,
    /// streams currently capturing: the hot path checks this atomic only
    capturing: AtomicU64,
    /// Card failures: (device, allocations lost, bytes lost, allocations
    /// still readable from DRAM/NVMe), for the summary.
    lost: Mutex<Vec<(u32, u64, u64, u64)>>,
    /// Swap failures already reported (the tier counts them).
    spill_errors_seen: AtomicU64,
    monitors: Vec<Mutex<Monitor>>,
    capacity: [AtomicU64; MAX_DEVICES],
    publisher: publish::Publisher,
    /// The thread that applies the calls' deferred work (tier mode).
    applier: applier::Applier,
    residency: Option<Residency>,
    /// The device runtime (libu3m.so: the real functions), for u3m's own
    /// queries; None for engines that only observe (benchmarks).
    rt: Option<&'static dyn Runtime>,
    /// bytes of live allocations u3m does not manage, per device
    unmanaged: [AtomicU64; MAX_DEVICES],
    /// what the operator has been told, and the stall account
    ops: report::Operator,
    /// fail-closed state after an internal error (failure.rs)
    failure: failure::Failure,
}

#[derive(Default)]
struct Graphs {
    /// streams being captured -> ranges touched so far
    capturing: HashMap<u64, Vec<Range>>,
    /// captured graphs -> the ranges a replay touches
    models: HashMap<u64, Vec<Range>>,
}

/// Subtracts, stopping at zero even when two updates race.
fn sat_sub(a: &AtomicU64, v: u64) {
    let _ = a.fetch_update(Relaxed, Relaxed, |x| Some(x.saturating_sub(v)));
}

/// CLOCK_MONOTONIC_COARSE in ns: access times are kept in ~1 ms ticks by
/// the heat table, so the precise clock (26 ns here) would be wasted.
#[inline]
fn coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec into a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn dev_index(dev: i32) -> usize {
    if dev < 0 {
        0
    } else {
        (dev as usize).min(MAX_DEVICES - 1)
    }
}

/// Class and refcount identity of an operator name (names from C are ASCII).
#[inline]
fn classify(name: &[u8]) -> (OpClass, u64) {
    opclass::classify_bytes(name)
}

/// `classify` of a constant name, computed once (a copy or memset names
/// the same operator on every call; classification is a pure function).
macro_rules! classified {
    ($name:literal) => {{
        static C: std::sync::OnceLock<(OpClass, u64)> = std::sync::OnceLock::new();
        *C.get_or_init(|| classify($name))
    }};
}

impl Engine {
    /// Starts the engine: stats segment, trace recorder, publisher thread.
    /// An error (e.g. the segment cannot be created) is returned as text; the
    /// caller falls back to pass-through.
    pub fn new(
        cfg: Config,
        hook_names: &[&str],
        rt: Option<&'static dyn Runtime>,
    ) -> Result<Engine, String> {
        let residency = match (cfg.mode, rt) {
            (crate::config::Mode::Tier, Some(rt)) => Some(Residency::new(rt, &cfg)?),
            (crate::config::Mode::Tier, None) => return Err("tier mode needs a runtime".into()),
            _ => None,
        };
        let class_names: Vec<&str> = OpClass::ALL.iter().map(|c| c.name()).collect();
        let summary = cfg.summary();
        let mut sc = SegmentConfig::new(&summary, hook_names, &class_names);
        sc.dir = cfg.shm_dir.clone();
        let seg = match StatsSegment::create(&sc) {
            Ok(s) => Some(s),
            Err(e) => {
                if cfg.log >= LogLevel::Warn {
                    eprintln!(
                        "u3m: stats segment unavailable in {}: {e} (continuing without it)",
                        cfg.shm_dir.display()
                    );
                }
                None
            }
        };
        let rec = match &cfg.trace {
            Some(p) => {
                let rc = RecorderConfig {
                    lossless: cfg.trace_lossless,
                    ..RecorderConfig::default()
                };
                match Recorder::start_with(p, rc) {
                    Ok(r) => Some(r),
                    Err(e) => return Err(format!("U3M_TRACE={}: {e}", p.display())),
                }
            }
            None => None,
        };
        let heat = HeatTable::new(cfg.max_allocs, cfg.max_ranges);
        let e = Engine {
            heat,
            seg,
            rec,
            seq: AtomicU64::new(0),
            streams: SmallIds::new(),
            pid: std::process::id(),
            started_ns: mono_ns(),
            aclnn_launches: AtomicU64::new(0),
            tensors: AtomicU64::new(0),
            handles: Mutex::new(HashMap::new()),
            mappings: Mutex::new(HashMap::new()),
            host: Mutex::new(HashMap::new()),
            graphs: Mutex::new(Graphs::default()),
            capturing: AtomicU64::new(0),
            lost: Mutex::new(Vec::new()),
            spill_errors_seen: AtomicU64::new(0),
            monitors: (0..MAX_DEVICES)
                .map(|_| Mutex::new(Monitor::default()))
                .collect(),
            capacity: [const { AtomicU64::new(0) }; MAX_DEVICES],
            publisher: publish::Publisher::default(),
            applier: applier::Applier::default(),
            residency,
            rt,
            unmanaged: [const { AtomicU64::new(0) }; MAX_DEVICES],
            ops: report::Operator::default(),
            failure: failure::Failure::from_env(),
            cfg,
        };
        Ok(e)
    }

    /// Starts the background thread that publishes the hottest ranges. Called
    /// by the library once the engine has its final ('static) address.
    pub fn start_background(&'static self) {
        if let Some(t) = &self.residency {
            // eviction asks the heat table; the engine now has its final address
            t.set_heat_fn(Box::new(move |va| {
                self.heat
                    .chunk_info(va)
                    .map(|c| c.heat(coarse_ns()))
                    .unwrap_or(0.0)
            }));
        }
        if self.seg.is_some() || self.residency.is_some() {
            self.publisher.start(self);
        }
        self.applier.start(self);
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn heat(&self) -> &HeatTable {
        &self.heat
    }

    // ---- process lifecycle ----

    pub fn runtime_finalize(&self) {
        if let Some(r) = &self.rec {
            r.flush();
        }
    }

    /// At exit, in the process that started the engine.
    pub fn shutdown(&self) {
        if std::process::id() != self.pid {
            return;
        }
        self.publisher.stop();
        self.applier.stop();
        self.note_spill_errors();
        if let Some(why) = self.residency.as_ref().and_then(|t| t.schedule_stopped()) {
            // (U3M_PLAN=auto's is expected: a program's loop ends)
            let auto = self
                .residency
                .as_ref()
                .is_some_and(|t| t.auto_plan().is_some());
            if self.cfg.log >= if auto { LogLevel::Info } else { LogLevel::Warn } {
                eprintln!("u3m: {why}");
            }
        }
        if let Some(p) = self.residency.as_ref().and_then(|t| t.auto_plan()) {
            match &p.failed {
                Some(why) if self.cfg.log >= LogLevel::Warn => {
                    eprintln!("u3m: U3M_PLAN=auto: no schedule: {why}")
                }
                None if self.cfg.log >= LogLevel::Info => eprintln!(
                    "u3m: U3M_PLAN=auto: step of {} calls, recorded from call {} ({:.1} ms of device time), {} chunk-gaps out a step; a step under it: {}",
                    p.period,
                    p.from,
                    p.step_us / 1e3,
                    p.entries,
                    match (p.planned_us > 0.0, p.dropped) {
                        (false, _) => "not timed".to_string(),
                        (true, false) => format!("{:.1} ms, kept", p.planned_us / 1e3),
                        (true, true) => format!("{:.1} ms, dropped", p.planned_us / 1e3),
                    }
                ),
                _ => {}
            }
        }
        if self.cfg.log >= LogLevel::Info {
            eprintln!("u3m: {}", self.exit_summary());
        }
        if let Some(r) = &self.rec {
            r.stop();
        }
        if let Some(p) = &self.cfg.summary {
            if let Err(e) = std::fs::write(p, self.summary_json()) {
                eprintln!("u3m: cannot write U3M_SUMMARY={}: {e}", p.display());
            }
        }
        if let Some(t) = &self.residency {
            t.shutdown();
        }
        if let Some(s) = &self.seg {
            s.remove();
        }
    }

    /// In a forked child: the parent's threads are gone and its segment and
    /// trace file are not ours; make sure nothing here touches them again.
    pub fn forget_after_fork(&self) {
        if let Some(r) = &self.rec {
            r.forget_after_fork();
        }
        self.publisher.forget_after_fork();
        self.applier.forget_after_fork();
    }

    /// Whether a forked child keeps this engine: in tier mode with managed
    /// memory the child's view of that memory (the runtime's fork-copied
    /// state plus u3m's DRAM copies) only makes sense through it.
    pub fn kept_after_fork(&self) -> bool {
        self.residency.as_ref().is_some_and(|r| r.active())
    }

    /// fork's prepare step (see `kept_after_fork`).
    pub fn hold_for_fork(&'static self) -> Option<ForkHold> {
        self.residency.as_ref()?.hold_for_fork()
    }

    /// In the forked child that keeps this engine: the parent's threads,
    /// trace and stats segment are not the child's (its counting goes to a
    /// private copy); the residency state is made usable here, or, where it
    /// cannot be, the engine fails closed with one line saying why.
    pub fn continue_in_child(&self, hold: Option<ForkHold>) {
        self.forget_after_fork();
        if let Some(s) = &self.seg {
            s.privatize_after_fork();
        }
        // the parent's threads may have held their heat buffers' locks
        self.heat.after_fork_child();
        let Some(r) = &self.residency else { return };
        // and their policy buffers' (policy/pending.rs)
        r.policy().after_fork_child();
        self.set_forked_child();
        if let Err(why) = r.after_fork_child(hold) {
            self.fail_closed(&format!("forked child: {why}"));
        }
    }

    // ---- counters ----

    #[inline]
    pub fn count_call(&self, hook: u16) {
        if let Some(s) = &self.seg {
            s.count_call(hook as usize);
        }
    }

    /// A row of hook call counts in the stats segment for the calling
    /// thread alone, until it gives it back (`ThreadCalls::give_back`);
    /// None without a segment or when every row is held.
    pub fn take_thread_calls(&self) -> Option<&crate::shm::ThreadCalls> {
        self.seg.as_ref()?.take_thread_calls()
    }

    /// [`count_call`](Self::count_call) in the calling thread's row (`row`:
    /// [`take_thread_calls`](Self::take_thread_calls) on this thread, not
    /// given back), or in the shared counts when it has none.
    #[inline]
    pub fn count_call_in(&self, row: Option<&crate::shm::ThreadCalls>, hook: u16) {
        if let Some(s) = &self.seg {
            s.count_call_in(row, hook as usize);
        }
    }

    pub fn tensor_created(&self) {
        self.tensors.fetch_add(1, Relaxed);
    }

    #[inline]
    fn stream_id(&self, stream: u64) -> u32 {
        self.streams.get(stream)
    }

    // ---- allocation (cold path) ----

    pub fn capacity(&self, dev: i32) -> u64 {
        self.capacity[dev_index(dev)].load(Relaxed)
    }

    /// Physical HBM capacity as the runtime reports it (aclrtGetMemInfo).
    pub fn mem_info(&self, dev: i32, _free: u64, total: u64) {
        let d = dev_index(dev);
        self.capacity[d].store(total, Relaxed);
        if let Some(s) = &self.seg {
            s.device(d).capacity[TIER_HBM].store(total, Relaxed);
        }
    }

    fn gauge_alloc(&self, dev: i32, bytes: u64, sign: i64) {
        let d = dev_index(dev);
        let Some(s) = &self.seg else { return };
        let g = s.device(d);
        // in tier mode HBM use is physical residency, set by tier_tick
        let hbm = self.residency.is_none();
        if sign > 0 {
            g.allocs_live.fetch_add(1, Relaxed);
            g.allocs_total.fetch_add(1, Relaxed);
            g.bytes_live.fetch_add(bytes, Relaxed);
            g.bytes_total.fetch_add(bytes, Relaxed);
            if hbm {
                let used = g.used[TIER_HBM].fetch_add(bytes, Relaxed) + bytes;
                g.peak[TIER_HBM].fetch_max(used, Relaxed);
            }
        } else {
            sat_sub(&g.allocs_live, 1);
            g.frees_total.fetch_add(1, Relaxed);
            sat_sub(&g.bytes_live, bytes);
            if hbm {
                sat_sub(&g.used[TIER_HBM], bytes);
            }
        }
        if hbm {
            self.observe_monitor(d);
        }
    }

    fn observe_monitor(&self, d: usize) {
        let Some(s) = &self.seg else { return };
        let cap = self.capacity[d].load(Relaxed);
        if cap == 0 {
            return;
        }
        let used = s.device(d).used[TIER_HBM].load(Relaxed);
        self.observe_monitor_used(d, used, cap);
    }

    fn observe_monitor_used(&self, d: usize, used: u64, cap: u64) {
        self.observe_monitor_with(d, |m, now| m.observe(now, used, cap));
    }

    /// Feeds device `d`'s monitor and raises what it says as an event.
    fn observe_monitor_with(
        &self,
        d: usize,
        f: impl FnOnce(&mut Monitor, u64) -> Option<crate::monitor::Transition>,
    ) {
        let Some(s) = &self.seg else { return };
        let Ok(mut m) = self.monitors[d].lock() else {
            return;
        };
        let now = mono_ns();
        if let Some(t) = f(&mut m, now) {
            let text = t.text();
            match t {
                crate::monitor::Transition::Level { to, used, .. } => s.event_value(
                    EventKind::Monitor,
                    d as u32,
                    0,
                    used,
                    to as u64,
                    text.as_str(),
                ),
                crate::monitor::Transition::OomPredicted { seconds, used, .. } => s.event_value(
                    EventKind::OomPredicted,
                    d as u32,
                    0,
                    used,
                    (seconds * 1000.0) as u64,
                    text.as_str(),
                ),
            }
        }
        s.publish_monitor(d, &m.status());
    }

    pub fn alloc(&self, dev: i32, ptr: u64, size: u64, api: AllocApi) {
        self.say_started(dev);
        self.heat
            .on_alloc(dev.max(0) as u32, ptr, size, AllocKind::Malloc);
        if !self
            .residency
            .as_ref()
            .map(|t| t.is_managed(ptr))
            .unwrap_or(false)
        {
            self.unmanaged[dev_index(dev)].fetch_add(size, Relaxed);
        }
        let _ = api;
        self.gauge_alloc(dev, size, 1);
        if let Some(s) = &self.seg {
            s.event_value(EventKind::Alloc, dev_index(dev) as u32, ptr, size, 0, "");
        }
        if let Some(r) = &self.rec {
            r.record(
                dev.max(0) as u32,
                0,
                Rec::Alloc {
                    addr: ptr,
                    bytes: size,
                },
            );
        }
    }

    /// At U3M_LOG=info, the start line, once: at the first allocation,
    /// when the device's HBM is known.
    fn say_started(&self, dev: i32) {
        if self.cfg.log < LogLevel::Info || !self.ops.first_start() {
            return;
        }
        let hbm = match &self.residency {
            Some(t) => t.runtime().mem_info().ok().map(|x| x.1),
            None => Some(self.capacity(dev)).filter(|&c| c > 0),
        };
        let (dram, nvme) = self
            .residency
            .as_ref()
            .map(|t| t.limits())
            .unwrap_or((0, 0));
        eprintln!("u3m: {}", report::start_line(&self.cfg, hbm, dram, nvme));
    }

    pub fn alloc_failed(&self, dev: i32, size: u64, code: i32, _api: AllocApi) {
        let d = dev_index(dev);
        if let Some(s) = &self.seg {
            s.device(d).alloc_failures.fetch_add(1, Relaxed);
            s.event_value(EventKind::AllocFailed, d as u32, 0, size, code as u64, "");
        }
    }

    /// Before the real free: the allocation is forgotten (heat, gauges) and
    /// the trace shows F before the runtime can hand the address to another
    /// thread — afterwards, a re-allocation could be recorded first.
    /// Returns whether u3m's residency manager serves `ptr` (then it, not
    /// the runtime, frees it).
    pub fn free(&self, ptr: u64) -> bool {
        let managed = self
            .residency
            .as_ref()
            .map(|t| t.is_managed(ptr))
            .unwrap_or(false);
        if let Some(info) = self.heat.on_free(ptr) {
            if let Some(r) = &self.rec {
                r.record(info.dev, 0, Rec::Free { addr: ptr });
            }
            if !managed {
                sat_sub(&self.unmanaged[dev_index(info.dev as i32)], info.len);
            }
            self.gauge_alloc(info.dev as i32, info.len, -1);
            if let Some(s) = &self.seg {
                s.event_value(EventKind::Free, info.dev, ptr, info.len, 0, "");
            }
        }
        managed
    }

    pub fn host_alloc(&self, ptr: u64, size: u64) {
        if let Ok(mut h) = self.host.lock() {
            h.insert(ptr, size);
        }
    }

    pub fn host_free(&self, ptr: u64) {
        if let Ok(mut h) = self.host.lock() {
            h.remove(&ptr);
        }
    }

    /// A host range registered for device access: its device alias is memory
    /// u3m must never move.
    pub fn host_register(&self, dev: i32, host: u64, size: u64, alias: u64) {
        if let Ok(mut h) = self.host.lock() {
            h.insert(host, size);
        }
        if self
            .heat
            .on_alloc(dev.max(0) as u32, alias, size, AllocKind::HostAlias)
            .is_some()
        {
            self.heat.set_pinned(alias, size, PinReason::HostRegistered);
        }
        self.note_pinned(dev_index(dev), size);
    }

    pub fn host_unregister(&self, host: u64) {
        if let Ok(mut h) = self.host.lock() {
            h.remove(&host);
        }
        // V2 aliases live at the host address itself; V1 aliases are freed
        // with the registration, by address equality when they coincide
        self.heat.on_free(host);
    }

    fn note_pinned(&self, d: usize, bytes: u64) {
        if let Some(s) = &self.seg {
            s.device(d).pinned_bytes.fetch_add(bytes, Relaxed);
        }
    }

    pub fn pin(&self, addr: u64, len: u64, reason: PinReason) {
        if self.heat.set_pinned(addr, len, reason) {
            let d = self
                .heat
                .lookup(addr)
                .map(|(id, _, _)| self.heat.alloc_info(id).map(|i| i.dev).unwrap_or(0))
                .unwrap_or(0);
            self.note_pinned(d as usize, len);
        }
    }

    // ---- virtual memory (cold path) ----

    pub fn reserve(&self, dev: i32, va: u64, size: u64) {
        // the reservation is the "allocation" interior pointers resolve to;
        // its bytes count only as they are mapped
        self.heat
            .on_alloc(dev.max(0) as u32, va, size, AllocKind::Reserved);
    }

    pub fn release(&self, va: u64) {
        self.heat.on_free(va);
    }

    pub fn phys_alloc(&self, dev: i32, handle: u64, size: u64) {
        if let Ok(mut h) = self.handles.lock() {
            h.insert(
                handle,
                Handle {
                    dev: dev.max(0) as u32,
                    size,
                    maps: Vec::new(),
                    exported: false,
                },
            );
        }
        self.gauge_alloc(dev, size, 1);
    }

    pub fn phys_free(&self, handle: u64) {
        let gone = self.handles.lock().ok().and_then(|mut h| h.remove(&handle));
        if let Some(h) = gone {
            self.gauge_alloc(h.dev as i32, h.size, -1);
        }
    }

    pub fn map(&self, va: u64, size: u64, handle: u64) {
        let mut pinned = false;
        let mut dev = 0;
        if let Ok(mut h) = self.handles.lock() {
            if let Some(hd) = h.get_mut(&handle) {
                hd.maps.push(va);
                pinned = hd.exported;
                dev = hd.dev;
            }
        }
        if let Ok(mut m) = self.mappings.lock() {
            m.insert(va, (size, handle));
        }
        self.heat.on_map(va, size);
        if pinned {
            self.heat.set_pinned(va, size, PinReason::IpcExported);
        }
        if let Some(r) = &self.rec {
            r.record(
                dev,
                0,
                Rec::Map {
                    addr: va,
                    bytes: size,
                },
            );
        }
    }

    /// Before the real unmap (trace ordering, as for frees).
    pub fn unmap_begin(&self, va: u64) {
        if let Some(r) = &self.rec {
            let handle = self
                .mappings
                .lock()
                .ok()
                .and_then(|m| m.get(&va).map(|x| x.1));
            if let Some(h) = handle {
                let dev = self
                    .handles
                    .lock()
                    .ok()
                    .and_then(|hs| hs.get(&h).map(|x| x.dev))
                    .unwrap_or(0);
                r.record(dev, 0, Rec::Unmap { addr: va });
            }
        }
    }

    pub fn unmap(&self, va: u64) {
        let gone = self.mappings.lock().ok().and_then(|mut m| m.remove(&va));
        if let Some((len, handle)) = gone {
            self.heat.on_unmap(va, len);
            if let Ok(mut h) = self.handles.lock() {
                if let Some(hd) = h.get_mut(&handle) {
                    hd.maps.retain(|&v| v != va);
                }
            }
        }
    }

    /// A handle exported for IPC: another process maps the same physical
    /// memory, so it must stay where it is.
    pub fn phys_exported(&self, handle: u64) {
        let mut maps = Vec::new();
        let mut bytes = (0u32, 0u64);
        if let Ok(mut h) = self.handles.lock() {
            if let Some(hd) = h.get_mut(&handle) {
                hd.exported = true;
                maps = hd.maps.clone();
                bytes = (hd.dev, hd.size);
            }
        }
        for va in maps {
            self.heat.set_pinned(va, bytes.1, PinReason::IpcExported);
        }
        self.note_pinned(bytes.0 as usize, bytes.1);
    }

    pub fn phys_imported(&self, dev: i32, handle: u64) {
        if let Ok(mut h) = self.handles.lock() {
            // imported memory belongs to another process: never move it
            h.insert(
                handle,
                Handle {
                    dev: dev.max(0) as u32,
                    size: 0,
                    maps: Vec::new(),
                    exported: true,
                },
            );
        }
    }

    // ---- accesses (hot path) ----

    #[inline]
    fn access(&self, name: &[u8], write: bool, seq: u64, ns: u64) -> Access {
        let (class, op_hash) = classify(name);
        Access {
            seq,
            ns,
            class,
            op_hash,
            write,
        }
    }

    fn touch_all(&self, name: &[u8], ranges: &[Range]) {
        let (class, h) = classify(name);
        self.touch_classified(class, h, ranges);
    }

    /// `touch_all` for a name classified already (`classify(name)`).
    #[inline]
    fn touch_classified(&self, class: OpClass, h: u64, ranges: &[Range]) {
        self.touch_here(class, h, ranges, Here::now())
    }

    /// `touch_classified` with the calling thread's `LAST` looked up
    /// already (`here`, perthread.rs).
    fn touch_here(&self, class: OpClass, h: u64, ranges: &[Range], here: Option<Here>) {
        self.touch_here_inline(class, h, ranges, here)
    }

    /// `touch_here` inlined into an operator launch's path (`op_here`).
    #[inline(always)]
    fn touch_here_inline(&self, class: OpClass, h: u64, ranges: &[Range], here: Option<Here>) {
        let seq = self.seq.fetch_add(1, Relaxed) + 1;
        let ns = coarse_ns();
        // every range at once, merged into this thread's buffer of accesses
        // (heat/pending.rs): applied in batches and before any reader
        self.heat.record_ranges_in(
            ranges,
            Access {
                seq,
                ns,
                class,
                op_hash: h,
                write: false,
            },
            here,
        );
        self.note_capture(ranges);
    }

    /// An operator launch (aclop, aclnn, model execution).
    pub fn op(&self, dev: i32, stream: u64, name: &[u8], ranges: &[Range], flops: Option<u64>) {
        self.op_classified(dev, stream, name, classify(name), ranges, flops);
    }

    /// [`op`](Self::op) for a name the hook classified: `named` is
    /// `classify(name)` (the name is not classified again).
    pub fn op_classified(
        &self,
        dev: i32,
        stream: u64,
        name: &[u8],
        named: (OpClass, u64),
        ranges: &[Range],
        flops: Option<u64>,
    ) {
        self.op_here(dev, stream, name, named, ranges, flops, Here::now(), None)
    }

    /// [`op_classified`](Self::op_classified) with the calling thread's
    /// `LAST` looked up already (`here`, perthread.rs), counted in its row
    /// of the stats segment (`row`, `run_in`) when it holds one.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn op_here(
        &self,
        dev: i32,
        stream: u64,
        name: &[u8],
        named: (OpClass, u64),
        ranges: &[Range],
        flops: Option<u64>,
        here: Option<Here>,
        row: Option<&crate::shm::ThreadCalls>,
    ) {
        self.touch_here_inline(named.0, named.1, ranges, here);
        if self.cfg.debug_panic_at_op != 0 && self.seq.load(Relaxed) >= self.cfg.debug_panic_at_op {
            panic!("U3M_DEBUG_PANIC_AT_OP reached");
        }
        let d = dev_index(dev);
        if let Some(s) = &self.seg {
            s.count_op_in(row, d);
        }
        // the trace recorder, when there is one (a call, not inlined: a
        // test here first costs less than the call when there is none)
        if self.rec.is_some() {
            self.record_op(d, stream, name, ranges, flops);
        }
    }

    /// An operator event in the trace: read ranges are inputs, written ones
    /// outputs.
    fn record_op(&self, d: usize, stream: u64, name: &[u8], ranges: &[Range], flops: Option<u64>) {
        let Some(rec) = &self.rec else { return };
        if ranges.len() > MAX_OP_RANGES {
            // a wide launch (a foreach operator): every range is recorded,
            // at the price of an allocation (the common case below has none)
            let t = |r: &Range| TraceRange {
                addr: r.addr,
                bytes: r.len,
            };
            let ins: Vec<TraceRange> = ranges.iter().filter(|r| !r.write).map(t).collect();
            let outs: Vec<TraceRange> = ranges.iter().filter(|r| r.write).map(t).collect();
            let op = Rec::Op {
                op_type: name,
                inputs: &ins,
                outputs: &outs,
                flops,
            };
            rec.record(d as u32, self.stream_id(stream), op);
            return;
        }
        let mut ins = [TraceRange::default(); MAX_OP_RANGES];
        let mut outs = [TraceRange::default(); MAX_OP_RANGES];
        let (mut ni, mut no) = (0, 0);
        for r in ranges {
            let t = TraceRange {
                addr: r.addr,
                bytes: r.len,
            };
            if r.write {
                outs[no] = t;
                no += 1;
            } else {
                ins[ni] = t;
                ni += 1;
            }
        }
        rec.record(
            d as u32,
            self.stream_id(stream),
            Rec::Op {
                op_type: name,
                inputs: &ins[..ni],
                outputs: &outs[..no],
                flops,
            },
        );
    }

    pub fn collective(&self, dev: i32, stream: u64, name: &[u8], ranges: &[Range]) {
        self.touch_all(name, ranges);
        let d = dev_index(dev);
        if let Some(s) = &self.seg {
            let g = s.device(d);
            g.collectives.fetch_add(1, Relaxed);
            g.collective_bytes
                .fetch_add(ranges.iter().map(|r| r.len).sum(), Relaxed);
        }
        self.record_op(d, stream, name, ranges, None);
    }

    /// A copy; `kind` is the aclrtMemcpyKind the program passed.
    #[allow(clippy::too_many_arguments)]
    pub fn copy(
        &self,
        dev: i32,
        stream: u64,
        kind: i32,
        dst: u64,
        dspan: u64,
        src: u64,
        sspan: u64,
        bytes: u64,
    ) {
        let kind = MemcpyKind(kind);
        let ck = kind.direction();
        let (rs, n) = copy_ranges(kind, dst, dspan, src, sspan);
        if n > 0 {
            let (class, h) = classified!(b"Memcpy");
            self.touch_classified(class, h, &rs[..n]);
        }
        let d = dev_index(dev);
        let ki = ck.map(|k| k as usize).unwrap_or(3).min(3);
        if let Some(s) = &self.seg {
            let g = s.device(d);
            g.copy_calls[ki].fetch_add(1, Relaxed);
            g.copy_bytes[ki].fetch_add(bytes, Relaxed);
        }
        if let Some(rec) = &self.rec {
            let sid = self.stream_id(stream);
            match ck {
                Some(k) => rec.record(
                    d as u32,
                    sid,
                    Rec::Copy {
                        kind: k,
                        dst,
                        src,
                        bytes,
                    },
                ),
                None => rec.record(d as u32, sid, Rec::CopyAuto { dst, src, bytes }),
            }
        }
    }

    /// A copy, observed (heat, stats, trace).
    #[inline]
    fn observe_copy(&self, dev: i32, stream: u64, c: &Memcpy) {
        self.copy(
            dev, stream, c.kind.0, c.dst, c.dspan, c.src, c.sspan, c.bytes,
        );
    }

    pub fn memset(&self, dev: i32, stream: u64, addr: u64, bytes: u64) {
        let (class, h) = classified!(b"Memset");
        self.touch_classified(
            class,
            h,
            &[Range {
                addr,
                len: bytes,
                write: true,
                whole: false,
            }],
        );
        let d = dev_index(dev);
        if let Some(s) = &self.seg {
            let g = s.device(d);
            g.memsets.fetch_add(1, Relaxed);
            g.memset_bytes.fetch_add(bytes, Relaxed);
        }
        if let Some(rec) = &self.rec {
            rec.record(d as u32, self.stream_id(stream), Rec::Set { addr, bytes });
        }
    }

    /// A kernel launched with `ranges` found in its argument blob
    /// (`kernel_ranges`): accesses, read and written.
    pub fn kernel_args(&self, dev: i32, _stream: u64, ranges: &[Range]) {
        if let Some(s) = &self.seg {
            s.device(dev_index(dev)).kernels.fetch_add(1, Relaxed);
        }
        if !ranges.is_empty() {
            let (class, h) = classified!(b"Kernel");
            self.touch_classified(class, h, ranges);
        }
    }

    /// The device ranges a kernel's argument blob points into (pointer-sized
    /// slots inside live allocations), for residency before the launch:
    /// Some(n) in `out[..n]`, or None when there are more than `out` holds,
    /// then every one of them in `wide` (none may be left out: the kernel
    /// would run on memory not made resident).
    pub fn kernel_ranges(
        &self,
        blob: &[u8],
        out: &mut [Range; MAX_OP_RANGES],
        wide: &mut Vec<Range>,
    ) -> Option<usize> {
        let mut n = 0;
        for w in blob.chunks_exact(8) {
            let v = u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            if v == 0 {
                continue;
            }
            if let Some((_, base, len)) = self.heat.lookup(v) {
                let r = Range {
                    addr: v,
                    len: base + len - v,
                    write: true,
                    whole: false,
                };
                if n < MAX_OP_RANGES {
                    out[n] = r;
                } else {
                    if n == MAX_OP_RANGES {
                        wide.extend_from_slice(&out[..]);
                    }
                    wide.push(r);
                }
                n += 1;
            }
        }
        (n <= MAX_OP_RANGES).then_some(n)
    }

    pub fn ipc_imported(&self) {
        if let Some(s) = &self.seg {
            s.event(
                EventKind::Info,
                crate::shm::NO_DEVICE,
                0,
                0,
                "IPC memory imported (never moved)",
            );
        }
    }

    /// aclrtResetDevice: the runtime dropped everything on `dev`.
    pub fn device_reset(&self, dev: i32) {
        if let Some(t) = &self.residency {
            t.forget_device(dev.max(0) as u32);
        }
        if let Some(s) = &self.seg {
            s.event(EventKind::Info, dev_index(dev) as u32, 0, 0, "device reset");
        }
    }

    /// The NVMe store was full or failed since the last look: the data stayed
    /// in DRAM. One `error` event per look that found new failures; one line
    /// on stderr the first time.
    fn note_spill_errors(&self) {
        let Some(t) = &self.residency else { return };
        let errs = t.spill_errors();
        let seen = self.spill_errors_seen.swap(errs, Relaxed);
        if errs <= seen {
            return;
        }
        let text = format!(
            "NVMe swap full or failing: {} chunk(s) kept in DRAM",
            errs - seen
        );
        if let Some(s) = &self.seg {
            s.event(EventKind::Error, crate::shm::NO_DEVICE, 0, 0, &text);
        }
        if seen == 0 && self.cfg.log >= LogLevel::Warn {
            eprintln!("u3m: {text} (U3M_SWAP_DIR / U3M_SWAP_BYTES); nothing is lost");
        }
    }

    /// A call on `dev` failed with ACL_ERROR_RT_DEVICE_TASK_ABORT: the card
    /// is gone. Tier mode keeps what it holds in DRAM/NVMe readable; the
    /// stats say which allocations were lost (one event each, then a
    /// summary line).
    pub fn device_lost(&self, dev: i32) {
        let Some(t) = &self.residency else { return };
        let Some((lost, kept)) = t.device_lost(dev.max(0) as u32) else {
            return;
        };
        let d = dev_index(dev) as u32;
        let bytes: u64 = lost.iter().map(|l| l.1).sum();
        if let Some(s) = &self.seg {
            for &(addr, len) in lost.iter().take(256) {
                s.event(
                    EventKind::DeviceLost,
                    d,
                    addr,
                    len,
                    "allocation lost with the device",
                );
            }
            let text = format!("device {dev} lost: {} managed allocations lost ({bytes} bytes), {} readable from DRAM/NVMe", lost.len(), kept.len());
            s.event(EventKind::DeviceLost, d, 0, bytes, &text);
        }
        if self.cfg.log >= LogLevel::Warn {
            eprintln!("u3m: device {dev} lost: {} managed allocations lost ({bytes} bytes), {} still readable from DRAM/NVMe", lost.len(), kept.len());
        }
        if let Ok(mut l) = self.lost.lock() {
            l.push((
                dev.max(0) as u32,
                lost.len() as u64,
                bytes,
                kept.len() as u64,
            ));
        }
    }

    /// A launch whose arguments u3m cannot read at all.
    pub fn opaque_launch(&self, dev: i32, _stream: u64) {
        if let Some(s) = &self.seg {
            s.device(dev_index(dev)).kernels.fetch_add(1, Relaxed);
        }
        crate::engine::publish::warn_opaque(self);
    }

    // ---- graphs (cold path) ----

    pub fn capture_begin(&self, stream: u64) {
        if let Ok(mut g) = self.graphs.lock() {
            if g.capturing.insert(stream, Vec::new()).is_none() {
                self.capturing.fetch_add(1, Relaxed);
            }
        }
    }

    pub fn capture_end(&self, stream: u64, model: u64) {
        if let Ok(mut g) = self.graphs.lock() {
            if let Some(rs) = g.capturing.remove(&stream) {
                self.capturing.fetch_sub(1, Relaxed);
                if model != 0 {
                    g.models.insert(model, rs);
                }
            }
        }
    }

    /// While any stream captures, accesses are remembered for the graph.
    /// Outside capture (the common case) this is one relaxed load.
    #[inline(always)]
    fn note_capture(&self, ranges: &[Range]) {
        if self.capturing.load(Relaxed) != 0 {
            self.note_captured(ranges);
        }
    }

    #[cold]
    #[inline(never)]
    fn note_captured(&self, ranges: &[Range]) {
        if let Ok(mut g) = self.graphs.lock() {
            for v in g.capturing.values_mut() {
                if v.len() < 1 << 16 {
                    v.extend_from_slice(ranges);
                }
            }
        }
    }

    pub fn graph_replay(&self, dev: i32, _stream: u64, model: u64) {
        let ranges = self
            .graphs
            .lock()
            .ok()
            .and_then(|g| g.models.get(&model).cloned())
            .unwrap_or_default();
        let seq = self.seq.fetch_add(1, Relaxed) + 1;
        let ns = mono_ns();
        for r in &ranges {
            self.heat.touch(
                r.addr,
                r.len,
                &self.access(b"GraphReplay", r.write, seq, ns),
            );
        }
        if let Some(s) = &self.seg {
            s.device(dev_index(dev))
                .graph_launches
                .fetch_add(1, Relaxed);
        }
    }

    pub fn graph_destroy(&self, model: u64) {
        if let Ok(mut g) = self.graphs.lock() {
            g.models.remove(&model);
        }
    }

    // ---- tier mode ----

    /// A hook is about to queue device work that waits for the host (a
    /// host function or callback, a value or notify wait): tier mode stops
    /// ordering its own streams after program work for good
    /// (`Residency::program_waits_on_host`).
    pub fn program_waits_on_host(&self) {
        if let Some(r) = &self.residency {
            r.program_waits_on_host();
        }
    }

    pub fn residency(&self) -> Option<&Residency> {
        self.residency.as_ref()
    }

    /// Whether a launch's outputs are worth marking written whole
    /// (`Residency::whole_writes_matter`): never in observe mode, nor in
    /// tier mode while managed memory is under half of every device's HBM
    /// and nothing was evicted.
    #[inline]
    pub fn whole_writes_matter(&self) -> bool {
        self.residency
            .as_ref()
            .is_some_and(|r| r.whole_writes_matter())
    }

    /// One line (at most one a second) when tier mode refused an
    /// allocation: the numbers and the variable to change.
    fn say_refused(&self, r: &Residency) {
        let Some(r) = r.take_refusal() else { return };
        if let Some(line) = self.ops.refused(mono_ns(), &r) {
            if let Some(s) = &self.seg {
                s.event_value(EventKind::Error, r.dev, 0, r.size, 207001, &line);
            }
            if self.cfg.log >= LogLevel::Warn {
                eprintln!("u3m: {line}");
            }
        }
    }

    /// One line when a call was refused because its memory cannot all be
    /// accessible at once: the call, the bytes it needs and HBM.
    pub(super) fn say_oversize(&self, what: &[u8], o: &residency::Oversize) {
        let line = report::oversize_line(&String::from_utf8_lossy(what), o);
        if let Some(s) = &self.seg {
            s.event_value(EventKind::Error, o.dev, 0, o.need, 207001, &line);
        }
        if self.cfg.log >= LogLevel::Warn {
            eprintln!("u3m: {line}");
        }
    }

    /// `stream` is capturing a graph (the common answer, no capture at
    /// all, is one load inline in the caller).
    #[inline]
    pub(crate) fn is_capturing(&self, stream: u64) -> bool {
        self.capturing.load(Relaxed) != 0 && self.is_capturing_now(stream)
    }

    #[inline(never)]
    fn is_capturing_now(&self, stream: u64) -> bool {
        self.graphs
            .lock()
            .map(|g| g.capturing.contains_key(&stream))
            .unwrap_or(false)
    }

    /// The ranges a captured graph touches (for residency before replay).
    pub fn graph_ranges(&self, model: u64) -> Vec<Range> {
        self.graphs
            .lock()
            .ok()
            .and_then(|g| g.models.get(&model).cloned())
            .unwrap_or_default()
    }

    /// What moved lately, at most every 250 ms: one `migrate` event (what
    /// `u3m top` lists live) and, at U3M_LOG=debug, one line.
    fn report_activity(&self, c: &residency::Counters) {
        let now = mono_ns();
        let Some((f, dt)) = self.ops.activity(now, c) else {
            return;
        };
        let text = format!("{} in {} ms", f.text(), dt / 1_000_000);
        if let Some(s) = &self.seg {
            let chunks: u64 = f.chunks_in[TIER_HBM] + f.chunks_out[TIER_HBM];
            let bytes = f.bytes_in(TIER_HBM) + f.bytes_out(TIER_HBM);
            s.event_value(
                EventKind::Migrate,
                crate::shm::NO_DEVICE,
                0,
                bytes,
                chunks,
                &text,
            );
        }
        if self.cfg.log >= LogLevel::Debug {
            let at = now.saturating_sub(self.started_ns) as f64 / 1e9;
            eprintln!("u3m: debug: +{at:.3}s {text}");
        }
    }

    /// One round of background tier work; called by the publisher thread.
    /// `at_s`: the round's time on the runtime's clock when that is not wall
    /// time (publish.rs); None: wall seconds since the engine started.
    /// `periods`: the 20 ms periods the round covers (the DRAM spill and
    /// prefetch budgets are per period).
    pub(crate) fn tier_tick(&self, at_s: Option<f64>, periods: u64) {
        let Some(t) = &self.residency else { return };
        let secs = at_s.unwrap_or_else(|| mono_ns().saturating_sub(self.started_ns) as f64 / 1e9);
        let stall = self.ops.stall_share(mono_ns());
        for line in t.tick_policy(secs) {
            if let Some(s) = &self.seg {
                s.event(EventKind::Policy, crate::shm::NO_DEVICE, 0, 0, &line);
            }
        }
        self.note_spill_errors();
        let c = t.counters();
        self.report_activity(&c);
        let (dram_limit, nvme_limit) = t.limits();
        // DRAM above 95 %: spill to NVMe at U3M_SSD_RATE (a period is 20 ms)
        t.spill_dram(0.02 * periods as f64);
        // the program evicting on demand since the last round: no watermark
        // eviction on top (it would compete with the program for the link
        // and evict what the program is filling HBM with; BENCHMARKS.md)
        let quiet = self.publisher.quiet(t.demand_count());
        for dev in t.devices() {
            if t.runtime().set_device(dev).is_err() {
                continue;
            }
            let evicted = if quiet {
                t.enforce_watermarks(dev, self.cfg.hbm_low, self.cfg.hbm_high)
            } else {
                0
            };
            if evicted == 0 {
                // room below the low watermark: bring back what the policy
                // expects soon, within the link's share of this round
                t.prefetch(
                    dev,
                    PREFETCH_BYTES_PER_TICK.saturating_mul(periods),
                    self.cfg.hbm_low,
                    residency::BACKGROUND_HORIZON,
                );
            }
            let Some(s) = &self.seg else { continue };
            let Ok((free, total)) = t.runtime().mem_info() else {
                continue;
            };
            let d = (dev as usize).min(MAX_DEVICES - 1);
            let g = s.device(d);
            // physical truth from the runtime: managed chunks and the rest
            let used_hbm = total.saturating_sub(free);
            g.used[TIER_HBM].store(used_hbm, Relaxed);
            g.peak[TIER_HBM].fetch_max(used_hbm, Relaxed);
            g.capacity[TIER_HBM].store(total, Relaxed);
            let (_, dram, nvme) = t.usage(d);
            g.used[1].store(dram, Relaxed);
            g.peak[1].fetch_max(dram, Relaxed);
            g.used[2].store(nvme, Relaxed);
            g.host_mapped.store(t.host_mapped(dev), Relaxed);
            g.peak[2].fetch_max(nvme, Relaxed);
            g.capacity[1].store(dram_limit, Relaxed);
            g.capacity[2].store(nvme_limit, Relaxed);
            g.virtual_capacity
                .store((total as f64 * self.cfg.oversub) as u64, Relaxed);
            // DRAM/NVMe and the traffic counters are process-wide: shown once
            if d == 0 {
                g.faults_in.store(c.faults_in, Relaxed);
                g.fault_bytes.store(c.fault_bytes, Relaxed);
                g.evictions.store(c.evictions, Relaxed);
                g.eviction_bytes.store(c.eviction_bytes, Relaxed);
                report::publish_flows(g, &report::Flows::of(&c));
                g.prefetches.store(c.prefetches, Relaxed);
                g.prefetch_bytes.store(c.prefetch_bytes, Relaxed);
                g.prefetch_hits.store(c.prefetch_hits, Relaxed);
                g.prefetch_misses.store(c.faults_in, Relaxed);
                g.stall_count.store(c.stall_count, Relaxed);
                g.stall_ns.store(c.stall_ns, Relaxed);
                g.refused_oversize.store(c.refused_oversize, Relaxed);
                g.host_maps.store(c.host_maps, Relaxed);
                g.host_map_bytes.store(c.host_map_bytes, Relaxed);
                g.host_unmaps.store(c.host_unmaps, Relaxed);
                g.stream_maps.store(c.stream_maps, Relaxed);
                g.stream_reads.store(c.stream_reads, Relaxed);
                g.discards.store(c.discards, Relaxed);
                for (b, v) in g.stall_buckets.iter().zip(c.stall_buckets) {
                    b.store(v, Relaxed);
                }
            }
            self.capacity[d].store(total, Relaxed);
            // a full HBM is the normal state here: the level is about what
            // can run out (monitor.rs)
            let (vfree, vtotal) = t.mem_info(dev, free, total);
            let p = crate::monitor::Pressure {
                used: vtotal.saturating_sub(vfree),
                capacity: vtotal,
                host_used: t.host_demand(),
                host_capacity: dram_limit + nvme_limit,
                stall,
            };
            self.observe_monitor_with(d, |m, now| m.observe_pressure(now, &p));
        }
    }

    /// The exit summary line (U3M_LOG=info).
    fn exit_summary(&self) -> String {
        let c = self
            .residency
            .as_ref()
            .map(|t| t.counters())
            .unwrap_or_default();
        let peak = |tier: usize| {
            self.seg
                .as_ref()
                .map(|s| {
                    (0..MAX_DEVICES)
                        .map(|d| s.device(d).peak[tier].load(Relaxed))
                        .max()
                        .unwrap_or(0)
                })
                .unwrap_or(0)
        };
        let figures = report::RunFigures {
            wall_ns: mono_ns().saturating_sub(self.started_ns),
            stall_ns: self.ops.stall_ns.load(Relaxed),
            peak_hbm: peak(TIER_HBM),
            hbm: self
                .capacity
                .iter()
                .map(|c| c.load(Relaxed))
                .max()
                .unwrap_or(0),
            refusals: self.ops.refusals.load(Relaxed),
            ops: self.seq.load(Relaxed),
        };
        report::exit_summary(self.cfg.mode, &c, &figures)
    }

    /// The run's summary (U3M_SUMMARY): what moved between tiers and what
    /// was seen. Hand-written JSON: u3m-core has no serde.
    pub fn summary_json(&self) -> String {
        let (aclnn, tensors) = self.counters();
        let t = self
            .residency
            .as_ref()
            .map(|t| t.counters())
            .unwrap_or_default();
        let (dram_limit, nvme_limit) = self
            .residency
            .as_ref()
            .map(|t| t.limits())
            .unwrap_or((0, 0));
        let host_waits = self.residency.as_ref().is_some_and(|t| t.host_waits());
        let totals = self.heat.totals();
        format!(
            concat!(
                "{{\n  \"schema\": 1,\n  \"mode\": \"{}\",\n  \"pid\": {},\n",
                "  \"ops\": {},\n  \"aclnn_launches\": {},\n  \"tensors\": {},\n",
                "  \"heat\": {{\"live_allocs\": {}, \"touches\": {}}},\n",
                "  \"tier\": {{\"faults_in\": {}, \"first_touches\": {}, \"fault_bytes\": {}, \"evictions\": {}, \"eviction_bytes\": {}, ",
                "\"clean_drops\": {}, \"discards\": {}, \"to_dram\": {}, \"to_nvme\": {}, \"from_nvme\": {}, \"overwrites\": {}, ",
                "\"spill_errors\": {}, \"prefetches\": {}, \"prefetch_bytes\": {}, \"refused_oversize\": {}, \"host_maps\": {}, \"host_map_bytes\": {}, \"host_unmaps\": {}, \"stream_maps\": {}, \"stream_reads\": {}, \"probe_verdicts\": {}, \"probe_maps\": {}, \"prefetch_hits\": {}, \"rescued\": {}, \"ahead_prefetches\": {}, \"ahead_evictions\": {}, \"ahead_full\": {}, \"ahead_depth\": {}, \"prefetch_wasted\": {}, \"ahead_probes\": {}, \"handoffs\": {}, \"zeroed\": {}, \"ordered_outs\": {}, \"host_waits\": {}, \"schedule_entries\": {}, \"schedule_stops\": {}, \"dram_limit\": {}, \"nvme_limit\": {}}},\n  \"lost_devices\": [{}]\n}}\n"
            ),
            self.cfg.mode.name(),
            self.pid,
            self.seq.load(Relaxed),
            aclnn,
            tensors,
            totals.live_allocs,
            totals.touches,
            t.faults_in,
            t.first_touches,
            t.fault_bytes,
            t.evictions,
            t.eviction_bytes,
            t.clean_drops,
            t.discards,
            t.to_dram,
            t.to_nvme,
            t.from_nvme,
            t.overwrites,
            t.spill_errors,
            t.prefetches,
            t.prefetch_bytes,
            t.refused_oversize,
            t.host_maps,
            t.host_map_bytes,
            t.host_unmaps,
            t.stream_maps,
            t.stream_reads,
            t.probe_verdicts,
            t.probe_maps,
            t.prefetch_hits,
            t.rescued,
            t.ahead_prefetches,
            t.ahead_evictions,
            t.ahead_full,
            t.ahead_depth,
            t.prefetch_wasted,
            t.ahead_probes,
            t.handoffs,
            t.zeroed,
            t.ordered_outs,
            host_waits,
            t.schedule_entries,
            t.schedule_stops,
            dram_limit,
            nvme_limit,
            self.lost
                .lock()
                .map(|l| l
                    .iter()
                    .map(|&(d, n, b, k)| format!("{{\"device\": {d}, \"allocations_lost\": {n}, \"bytes_lost\": {b}, \"allocations_readable\": {k}}}"))
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default(),
        )
    }

    // ---- introspection for tests and the CLI ----

    pub fn segment(&self) -> Option<&StatsSegment> {
        self.seg.as_ref()
    }

    pub fn recorder(&self) -> Option<&Recorder> {
        self.rec.as_ref()
    }

    pub fn counters(&self) -> (u64, u64) {
        (
            self.aclnn_launches.load(Relaxed),
            self.tensors.load(Relaxed),
        )
    }
}
