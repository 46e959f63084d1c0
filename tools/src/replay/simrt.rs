//! The `Runtime` the Tier drives during a replay: no device, a virtual clock.
//!
//! Time is in simulated nanoseconds. The host has a clock; every stream has
//! one. Work queued on a stream starts at max(stream clock, host clock) and
//! lasts its cost (the simulator's rule, docs/simulator.md); synchronising
//! moves the host clock up to what it waited for. Device memory is a byte
//! count per device against its capacity (`--hbm`); VAs come from a bump
//! allocator and mappings are checked, so an engine bug (a double map, an
//! unmap of nothing) is an error instead of a silent miscount.
//!
//! Host-located physical memory (the simulator's `aclrtMallocPhysical` at a
//! HOST_NUMA location): `malloc_physical_host` makes a handle that lives in
//! host RAM — it never counts against a device's capacity, only against the
//! host limit — and maps like any handle. Device work on it crosses the link:
//! `host_access` measures, for the ranges of a call, the bytes read and
//! written in host-mapped memory, which `Costs::{op,memset,d2d,copy}_ns_split`
//! turn into time exactly as the simulator does (docs/simulator.md).
//!
//! NVMe time: the Tier reads and writes its swap file itself, through a
//! 2 MiB pinned staging buffer (the only 2 MiB host allocation it makes). A
//! host→device copy *from* the staging buffer therefore follows an NVMe read
//! of that many bytes, charged to the host clock before the copy starts; a
//! device→host copy *into* it precedes an NVMe write, charged to the host
//! when the Tier synchronises the stream to read the buffer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use u3m_core::acl::{AclError, MemcpyKind};
use u3m_core::engine::runtime::{Runtime, CHUNK};

use super::cost::{Costs, Work};

const E_ALLOC: AclError = AclError::RT_MEMORY_ALLOCATION;
const E_PARAM: AclError = AclError::RT_PARAM_INVALID;
/// ACL_ERROR_INVALID_PARAM: a size that is not a multiple of 2 MiB.
#[cfg_attr(not(test), allow(dead_code))]
const E_INVALID: AclError = AclError::INVALID_PARAM;
const MEMCPY_H2D: MemcpyKind = MemcpyKind::HOST_TO_DEVICE;
const MEMCPY_D2H: MemcpyKind = MemcpyKind::DEVICE_TO_HOST;
/// First VA handed out (device VAs stay below the heat table's 2^48 limit).
const VA_BASE: u64 = 0x1000_0000_0000;

#[derive(Default)]
struct Dev {
    /// The link's two directions: host→device, device→host.
    link: [LinkCal; 2],
    capacity: u64,
    /// Physical handles plus unmanaged allocations.
    used: u64,
    peak: u64,
}

struct Stream {
    clock: u64,
    /// NVMe write time owed once the host reads the staging buffer.
    nvme_write_ns: u64,
    /// Created by the driver for the program (`program_stream`), not by
    /// the Tier.
    program: bool,
    /// Carried a device-to-host copy (a Tier stream that did is its
    /// copy-out stream).
    d2h: bool,
}

/// What the host waited for (`SimCounters::waits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitFor {
    /// A free slot in the launch queue (the host ran `--queue` calls ahead).
    Queue = 0,
    /// A stream of the program's, or an event recorded on one (the
    /// program's synchronisations; the Tier's waits for a busy victim).
    Program = 1,
    /// The Tier's copy-in stream (copy-ins it waits to land).
    CopyIn = 2,
    /// The Tier's copy-out stream (HBM leaving).
    CopyOut = 3,
}

/// One host wait `--wait-log` lists: the trace line whose call waited,
/// when the wait began and how long it took (simulated ns), and for what.
#[derive(Clone, Copy, Debug)]
pub struct LongWait {
    pub line: u64,
    pub at: u64,
    pub ns: u64,
    pub what: WaitFor,
}

impl WaitFor {
    /// The name `host_waits` and `long_waits` use in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            WaitFor::Queue => "queue",
            WaitFor::Program => "program",
            WaitFor::CopyIn => "copy_in",
            WaitFor::CopyOut => "copy_out",
        }
    }
}

/// Host waits of one kind: how many advanced the host's clock, and by how
/// much in all (simulated ns).
#[derive(Clone, Copy, Debug, Default)]
pub struct Waits {
    pub count: u64,
    pub ns: u64,
}

/// Bytes and time the runtime saw, for the report.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimCounters {
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
    pub nvme_read_bytes: u64,
    pub nvme_write_bytes: u64,
    pub link_ns: u64,
    pub nvme_ns: u64,
    /// Bookkeeping calls that were wrong (a map of a mapped VA, an unmap of
    /// nothing, a free of a mapped or unknown handle, a release of nothing):
    /// the Tier ignores some return codes, so they are counted here.
    pub misuse: u64,
    /// Bytes calls read / wrote in host-mapped memory (over the link).
    pub host_read_bytes: u64,
    pub host_write_bytes: u64,
    /// Peak bytes of host-located physical handles.
    pub host_phys_peak: u64,
    /// Simulated ns the shared link was busy host→device / device→host
    /// (the simulator's `link_h2d_busy_ns`, `link_d2h_busy_ns`; 0 with the
    /// per-stream link).
    pub link_in_busy_ns: u64,
    pub link_out_busy_ns: u64,
    /// The program's own host→device / device→host copy bytes (the trace's
    /// `M` events; `h2d_bytes`, `d2h_bytes` are the Tier's).
    pub program_h2d_bytes: u64,
    pub program_d2h_bytes: u64,
    /// The host's waits, by what it waited for (`WaitFor` as index); the
    /// background round's own waits are not counted (its clock is its own).
    pub waits: [Waits; 4],
}

/// One direction of a device's link: the simulated time already taken, as
/// sorted, disjoint, non-touching busy intervals (the simulator's calendar,
/// shim/src/rt/core.c `link_reserve`).
#[derive(Default)]
struct LinkCal {
    iv: Vec<(u64, u64)>,
    /// Time below it was forgotten (no work can start earlier).
    floor: u64,
}

impl LinkCal {
    /// Takes `need` ns of free link time from `start` on; returns the end.
    fn reserve(&mut self, start: u64, need: u64) -> u64 {
        if need == 0 {
            return start;
        }
        let start = start.max(self.floor);
        let i = self.iv.partition_point(|&(_, e)| e <= start);
        let (mut t, mut left, mut j) = (start, need, i);
        while left > 0 {
            if j < self.iv.len() && self.iv[j].0 <= t {
                t = self.iv[j].1;
                j += 1;
                continue;
            }
            let gap = if j < self.iv.len() {
                self.iv[j].0 - t
            } else {
                u64::MAX - t
            };
            let take = left.min(gap);
            t += take;
            left -= take;
        }
        let (mut s, mut e, mut i, mut k) = (start, t, i, j);
        if i < self.iv.len() && self.iv[i].0 < s {
            s = self.iv[i].0;
        }
        if i > 0 && self.iv[i - 1].1 == s {
            i -= 1;
            s = self.iv[i].0;
        }
        if k < self.iv.len() && self.iv[k].0 <= e {
            e = self.iv[k].1;
            k += 1;
        }
        self.iv.splice(i..k, [(s, e)]);
        t
    }

    fn prune(&mut self, wm: u64) {
        let n = self.iv.partition_point(|&(_, e)| e <= wm);
        self.iv.drain(..n);
        self.floor = self.floor.max(wm);
    }
}

/// Where a call's bytes in host-mapped memory are (`host_access`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostAccess {
    /// Bytes read and bytes written over the link.
    pub read: u64,
    pub write: u64,
    /// Footprint of those ranges (each byte once): not read from HBM.
    pub footprint: u64,
}

/// One physical handle.
#[derive(Clone, Copy, Debug)]
struct Phys {
    /// `None`: host RAM (malloc_physical_host).
    dev: Option<u32>,
    bytes: u64,
    /// VAs it is mapped at.
    maps: u32,
}

impl State {
    /// The handles mapped over [addr, addr + len) (at least the byte at `addr`).
    fn handles_in(&self, addr: u64, len: u64) -> impl Iterator<Item = u64> + '_ {
        self.mapped
            .range(..addr.saturating_add(len.max(1)))
            .rev()
            .take_while(move |(&va, h)| va + self.phys.get(h).map_or(0, |p| p.bytes) > addr)
            .map(|(_, &h)| h)
    }

    /// The handle mapped at the VA holding `addr`.
    fn handle_at(&self, addr: u64) -> Option<u64> {
        self.handles_in(addr, 1).next()
    }
}

struct State {
    host: u64,
    /// While the background round runs: its own clock (the library's
    /// background thread waits for its copies without holding up the host).
    bg: Option<u64>,
    cur_dev: u32,
    devs: Vec<Dev>,
    next_va: u64,
    reserved: HashMap<u64, u64>,
    next_handle: u64,
    phys: HashMap<u64, Phys>,
    /// VA -> handle, one entry per map call (ordered: host_access looks up
    /// the mapping that holds an address).
    mapped: BTreeMap<u64, u64>,
    /// Host RAM for host handles: limit, in use.
    #[cfg_attr(not(test), allow(dead_code))]
    host_limit: u64,
    host_used: u64,
    /// Mappings of host handles now (none: host_access has nothing to find).
    host_maps: u64,
    streams: Vec<Stream>,
    events: Vec<u64>,
    /// The stream each event was last recorded on (0: never).
    event_stream: Vec<u64>,
    host_mem: HashMap<usize, usize>,
    staging: HashSet<u64>,
    /// VA -> how many times a chunk was mapped there (arrivals in HBM)
    arrivals: HashMap<u64, u32>,
    /// device VA -> bytes the Tier copied into it and out of it
    copies: HashMap<u64, [u64; 2]>,
    /// Every map and unmap with the caller's clock, when asked for
    /// (`log_maps`: u3m snapshot and u3m report); paused while the driver
    /// frees an allocation (those unmaps are not evictions).
    maps: Option<Vec<MapRec>>,
    maps_paused: bool,
    /// Hand-over model: handle -> when the device work that last used it
    /// (an operator, a copy) ends; freed handles' times per device, the
    /// earliest taken by the next handle allocated there.
    ready: HashMap<u64, u64>,
    freed_ready: Vec<std::collections::BinaryHeap<std::cmp::Reverse<u64>>>,
    c: SimCounters,
    /// `--wait-log`: waits at least this long (ns) are listed (None: off),
    /// the trace line being replayed, and the list.
    wait_log: Option<u64>,
    line: u64,
    long_waits: Vec<LongWait>,
}

/// One map (a chunk arrives in HBM) or unmap (it leaves) of the Tier's.
#[derive(Debug, Clone, Copy)]
pub struct MapRec {
    pub t_ns: u64,
    #[allow(dead_code)] // the VA says which device; kept for debugging
    pub dev: u32,
    pub va: u64,
    pub bytes: u64,
    pub map: bool,
}

pub struct SimRuntime {
    costs: Costs,
    st: Mutex<State>,
}

/// Nanoseconds to move `bytes` at `gbps` (10^9 B/s = 1 B/ns).
pub fn ns_at(bytes: u64, gbps: f64) -> u64 {
    if gbps <= 0.0 {
        0
    } else {
        (bytes as f64 / gbps).ceil() as u64
    }
}

impl State {
    /// `SimRuntime::host_access` with the state locked.
    fn host_access(&mut self, ranges: &[(u64, u64, u8)]) -> HostAccess {
        let st = self;
        let mut a = HostAccess::default();
        if st.host_maps == 0 {
            return a;
        }
        for &(va, len, write) in ranges {
            let end = va.saturating_add(len);
            let mut p = va;
            while p < end {
                let Some((&mva, &h)) = st.mapped.range(..=p).next_back() else {
                    break;
                };
                let Some(ph) = st.phys.get(&h) else { break };
                let mend = mva + ph.bytes;
                if mend <= p {
                    break; // not mapped here: the Tier's call would fault
                }
                let n = mend.min(end) - p;
                if ph.dev.is_none() {
                    if write != 1 {
                        a.read += n;
                    }
                    if write != 0 {
                        a.write += n;
                    }
                    a.footprint += n;
                }
                p += n;
            }
        }
        st.c.host_read_bytes += a.read;
        st.c.host_write_bytes += a.write;
        a
    }

    /// The caller's clock moves to at least `t`; a host's wait that moved
    /// it counts as waiting for `what`.
    fn wait_until(&mut self, t: u64, what: WaitFor) {
        let bg = self.bg.is_some();
        let c = self.caller();
        if t > *c {
            let d = t - *c;
            *c = t;
            if !bg {
                let w = &mut self.c.waits[what as usize];
                w.count += 1;
                w.ns += d;
                if self.wait_log.is_some_and(|min| d >= min) {
                    self.long_waits.push(LongWait {
                        line: self.line,
                        at: t - d,
                        ns: d,
                        what,
                    });
                }
            }
        }
    }

    /// What waiting for stream `s` (1-based) is waiting for.
    fn wait_kind(&self, s: u64) -> WaitFor {
        match self.streams.get((s as usize).wrapping_sub(1)) {
            Some(x) if x.program => WaitFor::Program,
            Some(x) if x.d2h => WaitFor::CopyOut,
            Some(_) => WaitFor::CopyIn,
            None => WaitFor::Program,
        }
    }

    /// The clock of whoever is calling: the host, or the background thread.
    fn caller(&mut self) -> &mut u64 {
        match &mut self.bg {
            Some(t) => t,
            None => &mut self.host,
        }
    }
}

impl SimRuntime {
    /// `devices` devices of `capacity` bytes each.
    pub fn new(costs: Costs, devices: usize, capacity: u64) -> SimRuntime {
        SimRuntime {
            costs,
            st: Mutex::new(State {
                host: 0,
                bg: None,
                cur_dev: 0,
                devs: (0..devices.max(1))
                    .map(|_| Dev {
                        capacity,
                        ..Dev::default()
                    })
                    .collect(),
                next_va: VA_BASE,
                reserved: HashMap::new(),
                next_handle: 1,
                phys: HashMap::new(),
                mapped: BTreeMap::new(),
                host_limit: u64::MAX,
                host_used: 0,
                host_maps: 0,
                streams: Vec::new(),
                events: Vec::new(),
                event_stream: Vec::new(),
                host_mem: HashMap::new(),
                staging: HashSet::new(),
                arrivals: HashMap::new(),
                copies: HashMap::new(),
                maps: None,
                maps_paused: false,
                ready: HashMap::new(),
                freed_ready: (0..devices.max(1)).map(|_| Default::default()).collect(),
                c: SimCounters::default(),
                wait_log: None,
                line: 0,
                long_waits: Vec::new(),
            }),
        }
    }

    /// Host RAM available to host handles (the simulator's ACLSIM_HOST_BYTES;
    /// unlimited unless set).
    // The host-handle calls below wait for the engine's Runtime method
    // (issue 11: host-mapped residency); until then only the tests call them.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn with_host_limit(self, bytes: u64) -> SimRuntime {
        self.lock().host_limit = bytes;
        self
    }

    /// A 2 MiB-granular physical allocation in host RAM (aclrtMallocPhysical
    /// at ACL_MEM_LOCATION_TYPE_HOST_NUMA): not device capacity. The engine's
    /// Runtime will get the same method; free_physical, map and unmap take
    /// its handles like any other.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn malloc_physical_host(&self, bytes: u64) -> Result<u64, AclError> {
        let mut st = self.lock();
        if bytes == 0 || bytes % CHUNK != 0 {
            return Err(E_INVALID);
        }
        if st.host_used + bytes > st.host_limit {
            return Err(E_ALLOC);
        }
        st.host_used += bytes;
        st.c.host_phys_peak = st.c.host_phys_peak.max(st.host_used);
        let h = st.next_handle;
        st.next_handle += 1;
        st.phys.insert(
            h,
            Phys {
                dev: None,
                bytes,
                maps: 0,
            },
        );
        Ok(h)
    }

    /// Bytes in host RAM held by host handles now.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn host_phys_bytes(&self) -> u64 {
        self.lock().host_used
    }

    /// The host-mapped part of one call's ranges (VA, bytes, write: 0 read,
    /// 1 written, 2 read and written in place), measured where the memory is
    /// mapped now — call it after the Tier prepared the call, and charge the
    /// call with a `*_ns_split` cost. Counted in the counters.
    pub fn host_access(&self, ranges: &[(u64, u64, u8)]) -> HostAccess {
        self.lock().host_access(ranges)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device the next Tier call acts on (the driver is one thread).
    pub fn select(&self, dev: u32) {
        self.lock().cur_dev = dev;
    }

    pub fn host_ns(&self) -> u64 {
        self.lock().host
    }

    /// Calls until `end_background` are the background thread's, starting
    /// now (host time).
    pub fn begin_background(&self) {
        let mut st = self.lock();
        st.bg = Some(st.host);
    }

    pub fn end_background(&self) {
        self.lock().bg = None;
    }

    /// The host waits until `t` (a queue slot frees up).
    pub fn host_at_least(&self, t: u64) {
        let mut st = self.lock();
        if st.bg.is_none() {
            st.wait_until(t, WaitFor::Queue);
        } else {
            st.host = st.host.max(t);
        }
    }

    /// The host spends `ns` (issuing a call).
    pub fn host_spend(&self, ns: u64) {
        self.lock().host += ns;
    }

    /// A stream of the program's (not the Tier's).
    pub fn program_stream(&self) -> u64 {
        let s = self.create_stream().unwrap_or(0);
        if let Some(x) = self.lock().streams.get_mut((s as usize).wrapping_sub(1)) {
            x.program = true;
        }
        s
    }

    /// Queues `cost` ns of device work on `stream`; returns its end time.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn launch(&self, stream: u64, cost: u64) -> u64 {
        let mut st = self.lock();
        let host = st.host;
        let s = &mut st.streams[(stream - 1) as usize];
        s.clock = s.clock.max(host) + cost;
        s.clock
    }

    /// Takes link time for `w` on the current device from `start`; returns
    /// the work's duration (`Work::per_stream` with the per-stream link).
    fn work_ns(&self, st: &mut State, start: u64, w: &Work) -> u64 {
        if !self.costs.shared_link || w.link_in + w.link_out == 0 {
            return w.per_stream;
        }
        let g = self.costs.link_gbps;
        let end = [(0, w.link_in), (1, w.link_out)]
            .into_iter()
            .map(|(dir, b)| self.reserve_link(st, dir, start, ns_at(b, g)))
            .max()
            .unwrap_or(start);
        w.base.max(end - start) + w.launch
    }

    /// `need` ns of direction `dir` (0 in, 1 out) of the current device's link.
    fn reserve_link(&self, st: &mut State, dir: usize, start: u64, need: u64) -> u64 {
        if need == 0 {
            return start;
        }
        let dev = st.cur_dev as usize;
        if st.devs[dev].link[dir].iv.len() > 4096 {
            // no work starts before the host or any stream's clock
            let wm = st.streams.iter().map(|s| s.clock).fold(st.host, u64::min);
            st.devs[dev].link[dir].prune(wm);
        }
        match dir {
            0 => st.c.link_in_busy_ns += need,
            _ => st.c.link_out_busy_ns += need,
        }
        st.devs[dev].link[dir].reserve(start, need)
    }

    /// Hand-over model: when the HBM handles under `spans` are ready (the
    /// Tier answers every event as complete, so it may not order a call
    /// after a copy-in into them: the call waits for it here); 0 otherwise.
    pub fn gate(&self, spans: &[(u64, u64, u8)]) -> u64 {
        if self.costs.handover == 0 {
            return 0;
        }
        let st = self.lock();
        spans
            .iter()
            .flat_map(|&(addr, len, _)| st.handles_in(addr, len))
            .filter_map(|h| st.ready.get(&h).copied())
            .max()
            .unwrap_or(0)
    }

    /// Queues `w` on `stream` (the current device's), starting no earlier
    /// than `not_before`; returns its end time.
    pub fn launch_work_after(&self, stream: u64, w: &Work, not_before: u64) -> u64 {
        let mut st = self.lock();
        let st = &mut *st;
        let start = st.streams[(stream - 1) as usize]
            .clock
            .max(st.host)
            .max(not_before);
        let end = start + self.work_ns(st, start, w);
        st.streams[(stream - 1) as usize].clock = end;
        end
    }

    /// Hand-over model: the device work on `spans` ends at `end`; the HBM
    /// handles mapped there are not free before then.
    pub fn note_use(&self, spans: &[(u64, u64, u8)], end: u64) {
        if self.costs.handover == 0 {
            return;
        }
        let mut st = self.lock();
        let st = &mut *st;
        for &(addr, len, _) in spans {
            let hs: Vec<u64> = st.handles_in(addr, len).collect();
            for h in hs {
                let r = st.ready.entry(h).or_insert(0);
                *r = (*r).max(end);
            }
        }
    }

    /// Counts a copy of the program's.
    pub fn program_copy(&self, bytes: u64, to_device: bool) {
        let mut st = self.lock();
        match to_device {
            true => st.c.program_h2d_bytes += bytes,
            false => st.c.program_d2h_bytes += bytes,
        }
    }

    /// Runs `w` synchronously from the host's time; returns its duration.
    pub fn sync_work(&self, w: &Work) -> u64 {
        let mut st = self.lock();
        let st = &mut *st;
        let start = st.host;
        self.work_ns(st, start, w)
    }

    /// Memory the Tier does not manage (small allocations) counts against
    /// the device's capacity; `bytes` may exceed what is free (the program's
    /// allocation would have failed: the driver makes room first).
    pub fn unmanaged(&self, dev: u32, bytes: u64, add: bool) {
        let mut st = self.lock();
        let d = &mut st.devs[dev as usize];
        if add {
            d.used += bytes;
            d.peak = d.peak.max(d.used);
        } else {
            d.used = d.used.saturating_sub(bytes);
        }
    }

    /// Every stream drained and the host caught up: the run's total time.
    pub fn finish(&self) -> u64 {
        let mut st = self.lock();
        let end = st
            .streams
            .iter()
            .map(|s| s.clock + s.nvme_write_ns)
            .max()
            .unwrap_or(0)
            .max(st.host);
        st.host = end;
        end
    }

    pub fn counters(&self) -> SimCounters {
        self.lock().c
    }

    /// Lists every host wait of at least `min_ns` from now on (`--wait-log`).
    pub fn set_wait_log(&self, min_ns: u64) {
        self.lock().wait_log = Some(min_ns);
    }

    /// The trace line whose call the host is replaying (for `--wait-log`).
    pub fn set_line(&self, line: u64) {
        self.lock().line = line;
    }

    /// The waits `set_wait_log` listed, in the order they happened.
    pub fn long_waits(&self) -> Vec<LongWait> {
        self.lock().long_waits.clone()
    }

    /// How many times each VA had a chunk mapped at it.
    pub fn arrivals(&self) -> HashMap<u64, u32> {
        self.lock().arrivals.clone()
    }

    /// Device VA -> [bytes copied in, bytes copied out] by the Tier. A copy
    /// counts at the device VA it names: the chunk's own for a `malloc`
    /// allocation; a VMM handle's chunk is copied out at a VA of u3m's own.
    pub fn copies(&self) -> HashMap<u64, [u64; 2]> {
        self.lock().copies.clone()
    }

    /// Start logging maps and unmaps (`take_maps`).
    pub fn log_maps(&self) {
        self.lock().maps = Some(Vec::new());
    }

    /// Unmaps while paused are not logged (an allocation being freed).
    pub fn pause_maps(&self, paused: bool) {
        self.lock().maps_paused = paused;
    }

    /// Maps and unmaps logged so far.
    pub fn maps_logged(&self) -> usize {
        self.lock().maps.as_ref().map_or(0, Vec::len)
    }

    pub fn take_maps(&self) -> Vec<MapRec> {
        self.lock().maps.take().unwrap_or_default()
    }

    /// Bytes of HBM in use on `dev` now.
    pub fn used(&self, dev: u32) -> u64 {
        self.lock()
            .devs
            .get(dev as usize)
            .map(|d| d.used)
            .unwrap_or(0)
    }

    pub fn peak(&self, dev: u32) -> u64 {
        self.lock()
            .devs
            .get(dev as usize)
            .map(|d| d.peak)
            .unwrap_or(0)
    }
}

impl Runtime for SimRuntime {
    // the hand-over models gate every copy and call by its pages' last use
    fn orders_pages(&self) -> bool {
        self.costs.handover != 0
    }

    fn malloc_physical_host(&self, _dev: u32, bytes: u64) -> Result<u64, AclError> {
        SimRuntime::malloc_physical_host(self, bytes)
    }

    fn set_device(&self, dev: u32) -> Result<(), AclError> {
        let mut st = self.lock();
        if dev as usize >= st.devs.len() {
            return Err(E_PARAM);
        }
        st.cur_dev = dev;
        Ok(())
    }

    fn current_device(&self) -> Option<u32> {
        Some(self.lock().cur_dev)
    }

    fn malloc_physical(&self, dev: u32, bytes: u64) -> Result<u64, AclError> {
        let mut st = self.lock();
        let Some(d) = st.devs.get_mut(dev as usize) else {
            return Err(E_PARAM);
        };
        if d.used + bytes > d.capacity {
            return Err(E_ALLOC);
        }
        d.used += bytes;
        d.peak = d.peak.max(d.used);
        let h = st.next_handle;
        st.next_handle += 1;
        if self.costs.handover != 0 {
            if let Some(std::cmp::Reverse(t)) = st.freed_ready[dev as usize].pop() {
                st.ready.insert(h, t);
            }
        }
        st.phys.insert(
            h,
            Phys {
                dev: Some(dev),
                bytes,
                maps: 0,
            },
        );
        Ok(h)
    }

    fn free_physical(&self, handle: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        match st.phys.get(&handle) {
            Some(p) if p.maps == 0 => {}
            _ => {
                // unknown, or still mapped
                st.c.misuse += 1;
                return Err(E_PARAM);
            }
        }
        let Some(p) = st.phys.remove(&handle) else {
            return Err(E_PARAM);
        };
        if let (Some(t), Some(dev)) = (st.ready.remove(&handle), p.dev) {
            st.freed_ready[dev as usize].push(std::cmp::Reverse(t));
        }
        match p.dev {
            Some(dev) => st.devs[dev as usize].used -= p.bytes,
            None => st.host_used -= p.bytes,
        }
        Ok(())
    }

    fn reserve(&self, bytes: u64) -> Result<u64, AclError> {
        let mut st = self.lock();
        let va = st.next_va;
        let len = bytes.div_ceil(CHUNK).max(1) * CHUNK;
        if va + len >= u3m_core::heat::VA_LIMIT {
            return Err(E_ALLOC);
        }
        st.next_va += len;
        st.reserved.insert(va, len);
        Ok(va)
    }

    fn release(&self, va: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        if st.reserved.remove(&va).is_some() {
            return Ok(());
        }
        st.c.misuse += 1;
        Err(E_PARAM)
    }

    fn map(&self, va: u64, _bytes: u64, handle: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        if !st.phys.contains_key(&handle) || st.mapped.contains_key(&va) {
            st.c.misuse += 1;
            return Err(E_PARAM);
        }
        st.mapped.insert(va, handle);
        let in_hbm = st.phys.get(&handle).is_some_and(|p| p.dev.is_some());
        if in_hbm {
            *st.arrivals.entry(va).or_insert(0) += 1;
            // only HBM arrivals are logged: a host handle mapped at a
            // device VA does not occupy HBM
            let (t_ns, p) = (*st.caller(), &st.phys[&handle]);
            let (dev, bytes) = (p.dev.unwrap_or(0), p.bytes);
            if let Some(m) = st.maps.as_mut() {
                m.push(MapRec {
                    t_ns,
                    dev,
                    va,
                    bytes,
                    map: true,
                });
            }
        } else {
            st.host_maps += 1;
        }
        if let Some(p) = st.phys.get_mut(&handle) {
            p.maps += 1;
        }
        Ok(())
    }

    fn unmap(&self, va: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        let Some(h) = st.mapped.remove(&va) else {
            st.c.misuse += 1;
            return Err(E_PARAM);
        };
        let (t_ns, paused) = (*st.caller(), st.maps_paused);
        let hbm = st.phys.get(&h).and_then(|p| p.dev.map(|d| (d, p.bytes)));
        if let (Some(m), false, Some((dev, bytes))) = (st.maps.as_mut(), paused, hbm) {
            m.push(MapRec {
                t_ns,
                dev,
                va,
                bytes,
                map: false,
            });
        }
        if let Some(p) = st.phys.get_mut(&h) {
            p.maps -= 1;
            if p.dev.is_none() {
                st.host_maps -= 1;
            }
        }
        Ok(())
    }

    fn create_stream(&self) -> Result<u64, AclError> {
        let mut st = self.lock();
        st.streams.push(Stream {
            clock: 0,
            nvme_write_ns: 0,
            program: false,
            d2h: false,
        });
        Ok(st.streams.len() as u64)
    }

    /// Costed as a copy within HBM of the same bytes (the replay carries
    /// no data).
    fn memset_async(&self, dst: u64, bytes: u64, _value: u8, stream: u64) -> Result<(), AclError> {
        self.memcpy_async(dst, dst, bytes, MemcpyKind::DEVICE_TO_DEVICE, stream)
    }

    fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        kind: MemcpyKind,
        stream: u64,
    ) -> Result<(), AclError> {
        let mut st = self.lock();
        let st = &mut *st;
        if stream == 0 || stream as usize > st.streams.len() {
            return Err(E_PARAM);
        }
        if kind == MEMCPY_D2H {
            st.streams[(stream - 1) as usize].d2h = true;
        }
        let link = ns_at(bytes, self.costs.link_gbps);
        if kind == MEMCPY_H2D && st.staging.contains(&src) {
            // the Tier has just read these bytes from its swap file
            let r = ns_at(bytes, self.costs.nvme_read_gbps);
            *st.caller() += r;
            st.c.nvme_read_bytes += bytes;
            st.c.nvme_ns += r;
        }
        let host = *st.caller();
        // hand-over: the device side's HBM page is free only once the work
        // that last used it (its former chunk's operators, copy-out) ended
        let page = match (self.costs.handover, kind) {
            (0, _) => None,
            (_, MEMCPY_H2D) => st.handle_at(dst),
            (_, MEMCPY_D2H) => st.handle_at(src),
            _ => None,
        };
        let gate = page.and_then(|h| st.ready.get(&h).copied()).unwrap_or(0);
        let start = match self.costs.handover {
            2 => host.max(gate),
            _ => st.streams[(stream - 1) as usize].clock.max(host).max(gate),
        };
        let end = if self.costs.shared_link {
            // as the simulator charges it: the copy's own bytes in its
            // direction, and a device side in host memory (a host handle:
            // host mapping) over the link again; D2D at HBM rate
            // (the counters keep the program's calls' host-mapped bytes)
            let kept = (st.c.host_read_bytes, st.c.host_write_bytes);
            let h = match kind {
                MEMCPY_H2D => st.host_access(&[(dst, bytes, 1)]),
                MEMCPY_D2H => st.host_access(&[(src, bytes, 0)]),
                _ => st.host_access(&[(src, bytes, 0), (dst, bytes, 1)]),
            };
            (st.c.host_read_bytes, st.c.host_write_bytes) = kept;
            let (base, to, from) = match kind {
                MEMCPY_H2D => (link, bytes, 0),
                MEMCPY_D2H => (link, 0, bytes),
                _ => (self.costs.d2d_ns(bytes), 0, 0),
            };
            let w = Work {
                base,
                launch: 0,
                link_in: to + h.read,
                link_out: from + h.write,
                per_stream: base,
            };
            start + self.work_ns(st, start, &w)
        } else {
            start + link
        };
        if let Some(h) = page {
            let r = st.ready.entry(h).or_insert(0);
            *r = (*r).max(end);
        }
        let s = &mut st.streams[(stream - 1) as usize];
        s.clock = s.clock.max(end);
        if kind == MEMCPY_D2H && st.staging.contains(&dst) {
            let w = ns_at(bytes, self.costs.nvme_write_gbps);
            s.nvme_write_ns += w;
            st.c.nvme_write_bytes += bytes;
            st.c.nvme_ns += w;
        }
        match kind {
            MEMCPY_H2D => {
                st.c.h2d_bytes += bytes;
                st.copies.entry(dst).or_default()[0] += bytes;
            }
            MEMCPY_D2H => {
                st.c.d2h_bytes += bytes;
                st.copies.entry(src).or_default()[1] += bytes;
            }
            _ => {}
        }
        st.c.link_ns += link;
        Ok(())
    }

    fn sync_stream(&self, stream: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        let st = &mut *st;
        let Some(s) = st.streams.get_mut((stream as usize).wrapping_sub(1)) else {
            return Err(E_PARAM);
        };
        // the caller then reads the staging buffer and writes it to the swap file
        let done = s.clock + std::mem::take(&mut s.nvme_write_ns);
        let what = st.wait_kind(stream);
        st.wait_until(done, what);
        Ok(())
    }

    fn create_event(&self) -> Result<u64, AclError> {
        let mut st = self.lock();
        st.events.push(0);
        st.event_stream.push(0);
        Ok(st.events.len() as u64)
    }

    fn record_event(&self, event: u64, stream: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        let Some(&Stream { clock, .. }) = st.streams.get((stream as usize).wrapping_sub(1)) else {
            return Err(E_PARAM);
        };
        let k = (event as usize).wrapping_sub(1);
        match st.events.get_mut(k) {
            Some(e) => {
                *e = clock;
                st.event_stream[k] = stream;
                Ok(())
            }
            None => Err(E_PARAM),
        }
    }

    fn event_done(&self, event: u64) -> Result<bool, AclError> {
        let mut st = self.lock();
        let now = *st.caller();
        let at_record = self.costs.events_at_record;
        st.events
            .get((event as usize).wrapping_sub(1))
            .map(|&t| at_record || t <= now)
            .ok_or(E_PARAM)
    }

    fn sync_event(&self, event: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        let Some(&t) = st.events.get((event as usize).wrapping_sub(1)) else {
            return Err(E_PARAM);
        };
        let what = st.wait_kind(st.event_stream[event as usize - 1]);
        st.wait_until(t, what);
        Ok(())
    }

    fn elapsed_ns(&self, start: u64, end: u64) -> Result<u64, AclError> {
        let st = self.lock();
        let t = |e: u64| st.events.get((e as usize).wrapping_sub(1)).copied();
        match (t(start), t(end)) {
            (Some(a), Some(b)) => Ok(b.saturating_sub(a)),
            _ => Err(E_PARAM),
        }
    }

    fn stream_wait(&self, stream: u64, event: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        let Some(&t) = st.events.get((event as usize).wrapping_sub(1)) else {
            return Err(E_PARAM);
        };
        match st.streams.get_mut((stream as usize).wrapping_sub(1)) {
            Some(s) => {
                s.clock = s.clock.max(t);
                Ok(())
            }
            None => Err(E_PARAM),
        }
    }

    /// Real, lazily committed memory: the Tier's DRAM slabs (256 MiB) cost
    /// nothing until touched, and the replayer never copies data into them.
    fn malloc_host(&self, bytes: u64) -> Result<*mut u8, AclError> {
        let len = bytes.max(1) as usize;
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(E_ALLOC);
        }
        let mut st = self.lock();
        st.host_mem.insert(p as usize, len);
        if bytes == CHUNK {
            st.staging.insert(p as u64);
        }
        Ok(p as *mut u8)
    }

    fn free_host(&self, ptr: *mut u8) -> Result<(), AclError> {
        let mut st = self.lock();
        let Some(len) = st.host_mem.remove(&(ptr as usize)) else {
            return Err(E_PARAM);
        };
        st.staging.remove(&(ptr as u64));
        unsafe { libc::munmap(ptr as *mut libc::c_void, len) };
        Ok(())
    }

    fn mem_info(&self) -> Result<(u64, u64), AclError> {
        let st = self.lock();
        let d = &st.devs[st.cur_dev as usize];
        Ok((d.capacity.saturating_sub(d.used), d.capacity))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> SimRuntime {
        SimRuntime::new(Costs::default(), 1, 4 * CHUNK)
    }

    #[test]
    fn capacity_is_enforced_and_mappings_checked() {
        let r = rt();
        let hs: Vec<u64> = (0..4)
            .map(|_| r.malloc_physical(0, CHUNK).unwrap())
            .collect();
        assert_eq!(r.malloc_physical(0, CHUNK), Err(E_ALLOC));
        assert_eq!(r.mem_info(), Ok((0, 4 * CHUNK)));
        let va = r.reserve(3 * CHUNK).unwrap();
        assert_eq!(va % CHUNK, 0);
        assert_eq!(r.reserve(1).unwrap(), va + 3 * CHUNK);
        assert_eq!(r.map(va, CHUNK, hs[0]), Ok(()));
        assert!(r.map(va, CHUNK, hs[1]).is_err(), "double map");
        assert_eq!(r.unmap(va), Ok(()));
        assert!(r.unmap(va).is_err(), "unmap of nothing");
        assert_eq!(r.free_physical(hs[0]), Ok(()));
        assert_eq!(r.counters().misuse, 2);
        assert_eq!(r.mem_info(), Ok((CHUNK, 4 * CHUNK)));
    }

    #[test]
    fn copies_and_events_follow_the_clocks() {
        let c = Costs::default();
        let r = SimRuntime::new(c, 1, 4 * CHUNK);
        let s = r.create_stream().unwrap();
        let t = r.program_stream();
        assert_eq!(r.memcpy_async(0, 0, 25_000, MEMCPY_H2D, s), Ok(())); // 1000 ns at 25 GB/s
        let e = r.create_event().unwrap();
        r.record_event(e, s).unwrap();
        assert_eq!(r.event_done(e), Ok(false));
        r.stream_wait(t, e).unwrap();
        assert_eq!(r.launch(t, 10), 1010);
        r.sync_event(e).unwrap();
        assert_eq!(r.host_ns(), 1000);
        assert_eq!(r.event_done(e), Ok(true));
        assert_eq!(r.finish(), 1010);
    }

    #[test]
    fn host_waits_are_counted_by_what_the_host_waited_for() {
        let r = SimRuntime::new(Costs::default(), 1, 4 * CHUNK);
        let (inn, out, prog) = (
            r.create_stream().unwrap(),
            r.create_stream().unwrap(),
            r.program_stream(),
        );
        let ns = |w: WaitFor| r.counters().waits[w as usize];
        // the program's work, waited for through an event on its stream
        assert_eq!(r.launch(prog, 3_000), 3_000);
        let e = r.create_event().unwrap();
        r.record_event(e, prog).unwrap();
        r.sync_event(e).unwrap();
        assert_eq!(
            (ns(WaitFor::Program).count, ns(WaitFor::Program).ns),
            (1, 3_000)
        );
        // a copy-out (25,000 B: 1,000 ns at 25 GB/s), waited for by stream
        r.memcpy_async(0, 0, 25_000, MEMCPY_D2H, out).unwrap();
        r.sync_stream(out).unwrap();
        assert_eq!(
            (ns(WaitFor::CopyOut).count, ns(WaitFor::CopyOut).ns),
            (1, 1_000)
        );
        // a copy-in, by event; then the same event again: no time passes,
        // no wait is counted
        r.memcpy_async(0, 0, 50_000, MEMCPY_H2D, inn).unwrap();
        let f = r.create_event().unwrap();
        r.record_event(f, inn).unwrap();
        r.sync_event(f).unwrap();
        r.sync_event(f).unwrap();
        assert_eq!(
            (ns(WaitFor::CopyIn).count, ns(WaitFor::CopyIn).ns),
            (1, 2_000)
        );
        assert_eq!(
            ns(WaitFor::CopyOut).count,
            1,
            "a copy-in stream is not a copy-out one"
        );
        // a full launch queue
        r.host_at_least(r.host_ns() + 500);
        assert_eq!((ns(WaitFor::Queue).count, ns(WaitFor::Queue).ns), (1, 500));
        // the background round waits on its own clock: not the host's wait
        r.memcpy_async(0, 0, 25_000, MEMCPY_D2H, out).unwrap();
        r.begin_background();
        r.sync_stream(out).unwrap();
        r.end_background();
        assert_eq!(ns(WaitFor::CopyOut).count, 1);
        let total: u64 = r.counters().waits.iter().map(|w| w.ns).sum();
        assert_eq!(total, r.host_ns(), "the host did nothing but wait");
    }

    #[test]
    fn host_handles_live_outside_hbm_and_their_bytes_cross_the_link() {
        let r = rt().with_host_limit(8 * CHUNK);
        let d = r.malloc_physical(0, CHUNK).unwrap();
        let h = r.malloc_physical_host(4 * CHUNK).unwrap();
        assert_eq!(r.malloc_physical_host(CHUNK + 1), Err(E_INVALID));
        assert_eq!(
            r.malloc_physical_host(5 * CHUNK),
            Err(E_ALLOC),
            "host limit"
        );
        // HBM still has room for 3 more chunks: the host handle took none
        assert_eq!(r.mem_info(), Ok((3 * CHUNK, 4 * CHUNK)));
        assert_eq!(r.host_phys_bytes(), 4 * CHUNK);
        let va = r.reserve(5 * CHUNK).unwrap();
        assert_eq!(r.map(va, CHUNK, d), Ok(()));
        assert_eq!(r.map(va + CHUNK, 4 * CHUNK, h), Ok(()));
        // an operator reading the first two chunks, updating the third in
        // place, writing one chunk-sized output at the end
        let a = r.host_access(&[
            (va, 2 * CHUNK, 0),
            (va + 2 * CHUNK, CHUNK, 2),
            (va + 4 * CHUNK, CHUNK, 1),
        ]);
        assert_eq!(
            a,
            HostAccess {
                read: CHUNK + CHUNK,
                write: CHUNK + CHUNK,
                footprint: 3 * CHUNK
            }
        );
        assert_eq!(r.counters().host_read_bytes, 2 * CHUNK);
        // a VA not mapped is not host memory (the call would fault)
        assert_eq!(
            r.host_access(&[(va + 5 * CHUNK, CHUNK, 0)]),
            HostAccess::default()
        );
        assert!(r.free_physical(h).is_err(), "mapped");
        assert_eq!(r.unmap(va + CHUNK), Ok(()));
        assert_eq!(r.free_physical(h), Ok(()));
        assert_eq!(r.host_phys_bytes(), 0);
        assert_eq!(r.counters().host_phys_peak, 4 * CHUNK);
        assert_eq!(
            r.arrivals().get(&(va + CHUNK)),
            None,
            "a host mapping is no arrival in HBM"
        );
        assert_eq!(r.mem_info(), Ok((3 * CHUNK, 4 * CHUNK)));
    }

    #[test]
    fn the_link_is_shared_per_direction_and_full_duplex() {
        let one = ns_at(25_000_000, 25.0); // 1 ms
        let r = rt();
        let (a, b, c) = (
            r.create_stream().unwrap(),
            r.create_stream().unwrap(),
            r.create_stream().unwrap(),
        );
        r.memcpy_async(0, 0, 25_000_000, MEMCPY_H2D, a).unwrap();
        r.memcpy_async(0, 0, 25_000_000, MEMCPY_H2D, b).unwrap();
        r.memcpy_async(0, 0, 25_000_000, MEMCPY_D2H, c).unwrap();
        // the second copy in waits for the first; the copy out runs beside them
        assert_eq!(r.finish(), 2 * one);
        let k = r.counters();
        assert_eq!((k.link_in_busy_ns, k.link_out_busy_ns), (2 * one, one));
        // an operator reading 25 MB of host-mapped memory on a fourth stream
        // shares the H2D direction too: it fills the time after both copies
        let op = Costs::default().op_work(
            0,
            25_000_000,
            &HostAccess {
                read: 25_000_000,
                write: 0,
                footprint: 25_000_000,
            },
        );
        let p = r.program_stream();
        assert_eq!(r.launch_work_after(p, &op, 0), 3 * one + op.launch);
        // the per-stream model: every stream has the whole link
        let old = SimRuntime::new(
            Costs {
                shared_link: false,
                ..Costs::default()
            },
            1,
            4 * CHUNK,
        );
        let (a, b) = (old.create_stream().unwrap(), old.create_stream().unwrap());
        old.memcpy_async(0, 0, 25_000_000, MEMCPY_H2D, a).unwrap();
        old.memcpy_async(0, 0, 25_000_000, MEMCPY_H2D, b).unwrap();
        assert_eq!(old.finish(), one);
        assert_eq!(old.counters().link_in_busy_ns, 0);
    }

    #[test]
    fn the_link_calendar_fills_gaps_and_merges() {
        let mut c = LinkCal::default();
        assert_eq!(c.reserve(100, 50), 150);
        assert_eq!(c.reserve(300, 50), 350);
        // from 0: 100 free before the first interval, 150 between: 120 more
        // ends inside the gap
        assert_eq!(c.reserve(0, 120), 170);
        assert_eq!(c.iv, vec![(0, 170), (300, 350)]);
        // exactly filling the rest of the gap merges everything
        assert_eq!(c.reserve(0, 130), 300);
        assert_eq!(c.iv, vec![(0, 350)]);
        c.prune(400);
        assert!(c.iv.is_empty());
        assert_eq!(c.reserve(10, 5), 405, "nothing starts below the floor");
    }

    #[test]
    fn events_complete_at_record_in_the_simulator_model() {
        for (at_record, done) in [(false, false), (true, true)] {
            let r = SimRuntime::new(
                Costs {
                    events_at_record: at_record,
                    handover: 0,
                    ..Costs::default()
                },
                1,
                4 * CHUNK,
            );
            let s = r.create_stream().unwrap();
            r.memcpy_async(0, 0, 25_000, MEMCPY_H2D, s).unwrap();
            let e = r.create_event().unwrap();
            r.record_event(e, s).unwrap();
            assert_eq!(r.event_done(e), Ok(done));
            r.sync_event(e).unwrap();
            assert_eq!(r.host_ns(), 1000, "a wait still takes simulated time");
        }
    }

    #[test]
    fn the_handover_model_orders_a_page_after_its_last_use() {
        let copy = ns_at(CHUNK, Costs::default().link_gbps);
        const USE: u64 = 1_000_000;
        // (model, a copy into the page ends after the use, the copy behind
        // it on the same stream waits too)
        for (handover, gated, fifo) in [(0, false, false), (1, true, true), (2, true, false)] {
            let r = SimRuntime::new(
                Costs {
                    events_at_record: true,
                    handover,
                    ..Costs::default()
                },
                1,
                2 * CHUNK,
            );
            let (app, h2d) = (r.create_stream().unwrap(), r.create_stream().unwrap());
            let va = r.reserve(3 * CHUNK).unwrap();
            let (v, x, y) = (va, va + CHUNK, va + 2 * CHUNK);
            let p = r.malloc_physical(0, CHUNK).unwrap();
            let free = r.malloc_physical(0, CHUNK).unwrap();
            r.map(v, CHUNK, p).unwrap();
            r.map(y, CHUNK, free).unwrap();
            // queued work reads V for 1 ms; the host stays at 0
            let w = Work {
                base: USE,
                per_stream: USE,
                ..Work::default()
            };
            let on_v = [(v, CHUNK, 0u8)];
            let end = r.launch_work_after(app, &w, r.gate(&on_v));
            r.note_use(&on_v, end);
            assert_eq!(end, USE);
            // V leaves at once (the Tier saw its event complete); its page
            // goes to X
            r.unmap(v).unwrap();
            r.free_physical(p).unwrap();
            let p2 = r.malloc_physical(0, CHUNK).unwrap();
            r.map(x, CHUNK, p2).unwrap();
            r.memcpy_async(x, 0, CHUNK, MEMCPY_H2D, h2d).unwrap();
            r.memcpy_async(y, 0, CHUNK, MEMCPY_H2D, h2d).unwrap();
            let (gx, gy) = (r.gate(&[(x, CHUNK, 0)]), r.gate(&[(y, CHUNK, 0)]));
            match (gated, fifo) {
                (false, _) => assert_eq!((gx, gy), (0, 0), "no gate without the model"),
                (true, true) => assert_eq!((gx, gy), (USE + copy, USE + 2 * copy)),
                (true, false) => assert_eq!((gx, gy), (USE + copy, copy)),
            }
            // a call on X waits for X's copy-in under the model
            let on_x = [(x, CHUNK, 0u8)];
            let end = r.launch_work_after(app, &w, r.gate(&on_x));
            assert_eq!(end, if gated { USE + copy + USE } else { 2 * USE });
            r.note_use(&on_x, end);
        }
    }

    #[test]
    fn staging_copies_charge_nvme_time_to_the_host() {
        let r = rt();
        let s = r.create_stream().unwrap();
        let staging = r.malloc_host(CHUNK).unwrap() as u64;
        r.memcpy_async(0x1000, staging, CHUNK, MEMCPY_H2D, s)
            .unwrap();
        let read = ns_at(CHUNK, Costs::default().nvme_read_gbps);
        assert_eq!(r.host_ns(), read);
        r.memcpy_async(staging, 0x1000, CHUNK, MEMCPY_D2H, s)
            .unwrap();
        r.sync_stream(s).unwrap();
        let link = ns_at(CHUNK, Costs::default().link_gbps);
        assert_eq!(
            r.host_ns(),
            read + 2 * link + ns_at(CHUNK, Costs::default().nvme_write_gbps)
        );
        assert_eq!(r.free_host(staging as *mut u8), Ok(()));
    }
}
