//! A fake device runtime for the residency manager's unit tests. It keeps
//! real bytes per physical handle and per pinned host buffer, maps VAs the
//! way the VMM API does, runs streams in order, and checks what the real
//! device would: work that touches device memory not mapped *when it runs*
//! is a recorded MMU fault (and the stream's error), a host pointer u3m does
//! not own is a fault, and bookkeeping misuse (a double map, an unmap of
//! nothing, a free of a mapped handle, a release with mappings left) is
//! recorded. Streams are lazy by default: queued work runs only when someone
//! synchronises (a stream, an event, a stream waiting on another's event) or
//! the test calls `drain` — so an eviction that does not wait for a pending
//! use, or a call not ordered after its copy-in, is caught. `eager` runs
//! work as soon as it is queued instead.

use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use crate::acl::{AclError, MemcpyKind};
use crate::engine::runtime::{Runtime, CHUNK};

const VA_BASE: u64 = 0x1000_0000_0000;
const HOST_ALIGN: usize = 4096;

/// Test work on device memory: reads and writes declared ranges.
pub type Kernel = Box<dyn FnOnce(&mut Mem<'_>) + Send>;

enum Op {
    Copy {
        dst: u64,
        src: u64,
        bytes: u64,
        kind: MemcpyKind,
    },
    /// Wait until `stream` has run `pos` operations.
    Wait { stream: u64, pos: u64 },
    Launch {
        what: &'static str,
        ranges: Vec<(u64, u64)>,
        f: Kernel,
    },
}

struct Phys {
    dev: u32,
    data: Vec<u8>,
    maps: u32,
    /// In host memory (malloc_physical_host): not counted in the device's use.
    host: bool,
}

#[derive(Default)]
struct Stream {
    /// The device current when it was created: as the real runtime, the
    /// fake refuses work on it queued or waited for from another device.
    dev: u32,
    queue: VecDeque<Op>,
    /// Operations queued / run so far.
    queued: u64,
    run: u64,
    /// The first error of work that ran on it (reported by the next sync).
    error: Option<AclError>,
}

/// What the fake saw, for assertions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub h2d: u64,
    pub d2h: u64,
    pub d2d: u64,
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
    /// MMU faults and unknown host pointers, described.
    pub faults: Vec<String>,
    /// Bookkeeping misuse, described.
    pub misuse: Vec<String>,
    /// Host physical handles live now (malloc_physical_host).
    pub host_handles: u64,
    /// Event records per stream.
    pub records: BTreeMap<u64, u64>,
    /// Host waits (stream or event synchronisations) asked with a
    /// residency lock held by the calling thread, by runtime call — what
    /// issue 10 part 2's "no lock held across a synchronisation" has left.
    pub locked_waits: BTreeMap<&'static str, u64>,
    /// The most residency locks a thread held while it waited (more than
    /// one: a wait under two devices' locks).
    pub max_locks_at_wait: u32,
    /// Queries answered "not complete", per event: asking one event over
    /// and over is what a program spinning on it does (the simulator lets
    /// the host's time pass then).
    pub pending_answers: BTreeMap<u64, u64>,
    /// Queries answered "complete", per stream the event was recorded on.
    pub done_answers: BTreeMap<u64, u64>,
    /// `stream_wait` calls, per stream made to wait.
    pub stream_waits: BTreeMap<u64, u64>,
}

struct State {
    /// `Runtime::orders_pages`'s answer (`set_orders_pages`).
    orders_pages: bool,
    cur_dev: u32,
    /// Each thread has its own current device (as the real runtime's
    /// per-thread context), when set: thread -> device (unset: 0).
    per_thread: Option<HashMap<std::thread::ThreadId, u32>>,
    capacity: Vec<u64>,
    used: Vec<u64>,
    next_va: u64,
    reserved: BTreeMap<u64, u64>,
    next_handle: u64,
    phys: HashMap<u64, Phys>,
    /// va -> (bytes, handle)
    maps: BTreeMap<u64, (u64, u64)>,
    streams: HashMap<u64, Stream>,
    next_stream: u64,
    /// event -> (stream, position) of its latest record
    events: HashMap<u64, Option<(u64, u64)>>,
    next_event: u64,
    /// pinned host buffers: ptr -> bytes
    host: BTreeMap<usize, usize>,
    eager: bool,
    lost: bool,
    seen: Seen,
    /// Host-to-device `memcpy_async` calls still to fail (`fail_h2d`).
    fail_h2d: u32,
    /// Host-to-device copies let through before `fail_h2d` applies.
    pass_h2d: u32,
    /// Contexts made by `create_context`: context -> device. A thread's
    /// current context is in `thread_ctx`, else it is its device's default
    /// context (`DEFAULT_CTX | device`).
    contexts: HashMap<u64, u32>,
    thread_ctx: HashMap<std::thread::ThreadId, u64>,
}

/// The fake's default context of device d is `DEFAULT_CTX | d`.
const DEFAULT_CTX: u64 = 0xc0_0000;

pub struct Fake {
    st: Mutex<State>,
    /// A gate that holds u3m's host-to-device copies to one device inside
    /// the runtime (`hold_copy_ins`): (device, open, copies held so far).
    gate: Mutex<Option<(u32, bool, u32)>>,
    gate_cv: std::sync::Condvar,
    /// A gate that holds host waits (sync_stream, sync_event) inside the
    /// runtime (`hold_waits`): (waits still to hold, open, waits held).
    wait_gate: Mutex<Option<(u32, bool, u32)>>,
    wait_gate_cv: std::sync::Condvar,
}

/// Device memory as a kernel sees it: only through mappings, only inside the
/// ranges it declared.
pub struct Mem<'a> {
    st: &'a mut State,
    ranges: &'a [(u64, u64)],
    what: &'static str,
    faulted: bool,
}

impl Mem<'_> {
    fn check(&self, va: u64, len: u64) {
        assert!(
            self.ranges
                .iter()
                .any(|&(a, n)| va >= a && va + len <= a + n),
            "{}: kernel touched {va:#x}+{len} outside its declared ranges",
            self.what
        );
    }

    pub fn read(&mut self, va: u64, len: u64) -> Vec<u8> {
        self.check(va, len);
        let mut out = vec![0u8; len as usize];
        if !self.st.dev_read(va, &mut out, self.what) {
            self.faulted = true;
        }
        out
    }

    pub fn write(&mut self, va: u64, data: &[u8]) {
        self.check(va, data.len() as u64);
        if !self.st.dev_write(va, data, self.what) {
            self.faulted = true;
        }
    }
}

impl State {
    /// Notes a host wait (`what`) the calling thread asks for.
    fn note_wait(&mut self, what: &'static str) {
        let held = super::state::locks_held();
        if held > 0 {
            *self.seen.locked_waits.entry(what).or_insert(0) += 1;
            self.seen.max_locks_at_wait = self.seen.max_locks_at_wait.max(held);
        }
    }

    /// The calling thread's current device.
    fn cur(&self) -> u32 {
        match &self.per_thread {
            Some(m) => m.get(&std::thread::current().id()).copied().unwrap_or(0),
            None => self.cur_dev,
        }
    }

    /// The mapped pieces of [va, va+len): (handle, offset, bytes), or the
    /// first unmapped address.
    fn pieces(&self, va: u64, len: u64) -> Result<Vec<(u64, u64, u64)>, u64> {
        let mut out = Vec::new();
        let mut a = va;
        let end = va + len;
        while a < end {
            let Some((&m, &(n, h))) = self.maps.range(..=a).next_back() else {
                return Err(a);
            };
            if a >= m + n {
                return Err(a);
            }
            let k = (m + n).min(end) - a;
            out.push((h, a - m, k));
            a += k;
        }
        Ok(out)
    }

    fn fault(&mut self, what: &str, va: u64, len: u64, at: u64) {
        self.seen.faults.push(format!(
            "device MMU fault: {what} touched unmapped {at:#x} (range {va:#x}+{len})"
        ));
    }

    fn dev_read(&mut self, va: u64, out: &mut [u8], what: &str) -> bool {
        match self.pieces(va, out.len() as u64) {
            Ok(ps) => {
                let mut o = 0usize;
                for (h, off, k) in ps {
                    let p = &self.phys[&h];
                    out[o..o + k as usize]
                        .copy_from_slice(&p.data[off as usize..(off + k) as usize]);
                    o += k as usize;
                }
                true
            }
            Err(at) => {
                self.fault(what, va, out.len() as u64, at);
                false
            }
        }
    }

    fn dev_write(&mut self, va: u64, data: &[u8], what: &str) -> bool {
        match self.pieces(va, data.len() as u64) {
            Ok(ps) => {
                let mut o = 0usize;
                for (h, off, k) in ps {
                    let p = self.phys.get_mut(&h).expect("mapped handle");
                    p.data[off as usize..(off + k) as usize]
                        .copy_from_slice(&data[o..o + k as usize]);
                    o += k as usize;
                }
                true
            }
            Err(at) => {
                self.fault(what, va, data.len() as u64, at);
                false
            }
        }
    }

    /// Whether [p, p+len) lies in one pinned host buffer.
    fn host_ok(&self, p: u64, len: u64) -> bool {
        self.host
            .range(..=p as usize)
            .next_back()
            .map(|(&b, &n)| p + len <= (b + n) as u64)
            .unwrap_or(false)
    }

    fn misuse(&mut self, what: String) -> AclError {
        self.seen.misuse.push(what);
        AclError::RT_PARAM_INVALID
    }

    fn exec(&mut self, op: Op) -> Result<(), AclError> {
        match op {
            Op::Copy {
                dst,
                src,
                bytes,
                kind,
            } => {
                let mut buf = vec![0u8; bytes as usize];
                let ok = match kind {
                    MemcpyKind::HOST_TO_DEVICE => {
                        if !self.host_ok(src, bytes) {
                            self.seen
                                .faults
                                .push(format!("H2D from unknown host memory {src:#x}+{bytes}"));
                            false
                        } else {
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    src as *const u8,
                                    buf.as_mut_ptr(),
                                    bytes as usize,
                                )
                            };
                            self.dev_write(dst, &buf, "H2D copy")
                        }
                    }
                    MemcpyKind::DEVICE_TO_HOST => {
                        if !self.host_ok(dst, bytes) {
                            self.seen
                                .faults
                                .push(format!("D2H into unknown host memory {dst:#x}+{bytes}"));
                            false
                        } else if self.dev_read(src, &mut buf, "D2H copy") {
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    buf.as_ptr(),
                                    dst as *mut u8,
                                    bytes as usize,
                                )
                            };
                            true
                        } else {
                            false
                        }
                    }
                    MemcpyKind::DEVICE_TO_DEVICE => {
                        self.dev_read(src, &mut buf, "D2D copy")
                            && self.dev_write(dst, &buf, "D2D copy")
                    }
                    k => {
                        self.seen.faults.push(format!("copy of kind {}", k.0));
                        false
                    }
                };
                if ok {
                    Ok(())
                } else {
                    Err(AclError::RT_DEVICE_MEM_ERROR)
                }
            }
            Op::Wait { stream, pos } => self.run(stream, pos).map(|_| ()),
            Op::Launch { what, ranges, f } => {
                for &(va, len) in &ranges {
                    if let Err(at) = self.pieces(va, len) {
                        self.fault(what, va, len, at);
                        return Err(AclError::RT_DEVICE_MEM_ERROR);
                    }
                }
                let mut m = Mem {
                    st: self,
                    ranges: &ranges,
                    what,
                    faulted: false,
                };
                f(&mut m);
                if m.faulted {
                    Err(AclError::RT_DEVICE_MEM_ERROR)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Runs `stream` until it has run `upto` operations (u64::MAX: all).
    fn run(&mut self, stream: u64, upto: u64) -> Result<(), AclError> {
        loop {
            let Some(s) = self.streams.get_mut(&stream) else {
                return Err(AclError::RT_PARAM_INVALID);
            };
            if s.run >= upto {
                break;
            }
            let Some(op) = s.queue.pop_front() else {
                break;
            };
            let r = self.exec(op);
            let s = self.streams.get_mut(&stream).expect("stream");
            s.run += 1;
            if let Err(e) = r {
                s.error.get_or_insert(e);
            }
        }
        match self.streams[&stream].error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// ACL_ERROR_RT_STREAM_CONTEXT for a stream of another device than the
    /// calling thread's (the runtime's check; a misuse u3m must not make).
    fn context(&mut self, stream: u64, what: &str) -> Result<(), AclError> {
        match self.streams.get(&stream).map(|s| s.dev) {
            Some(d) if d != self.cur() => {
                let cur = self.cur();
                self.misuse(format!(
                    "{what} on stream {stream:#x} of device {d} while the current device is {cur}"
                ));
                Err(AclError::RT_STREAM_CONTEXT)
            }
            _ => Ok(()),
        }
    }

    fn queue(&mut self, stream: u64, op: Op) -> Result<(), AclError> {
        if self.lost {
            return Err(AclError::RT_DEVICE_TASK_ABORT);
        }
        let Some(s) = self.streams.get_mut(&stream) else {
            return Err(self.misuse(format!("work queued on unknown stream {stream:#x}")));
        };
        s.queue.push_back(op);
        s.queued += 1;
        if self.eager {
            let _ = self.run(stream, u64::MAX);
        }
        Ok(())
    }
}

impl Fake {
    /// One device (`devices` of them) with `capacity` bytes of HBM each.
    pub fn new(devices: usize, capacity: u64) -> Fake {
        let mut streams = HashMap::new();
        streams.insert(0, Stream::default()); // the default stream
        Fake {
            gate: Mutex::new(None),
            gate_cv: std::sync::Condvar::new(),
            wait_gate: Mutex::new(None),
            wait_gate_cv: std::sync::Condvar::new(),
            st: Mutex::new(State {
                cur_dev: 0,
                per_thread: None,
                capacity: vec![capacity; devices],
                used: vec![0; devices],
                next_va: VA_BASE,
                reserved: BTreeMap::new(),
                next_handle: 0x7000_0000,
                phys: HashMap::new(),
                maps: BTreeMap::new(),
                streams,
                next_stream: 0x5000,
                events: HashMap::new(),
                next_event: 0xe000,
                host: BTreeMap::new(),
                eager: false,
                lost: false,
                seen: Seen::default(),
                fail_h2d: 0,
                pass_h2d: 0,
                contexts: HashMap::new(),
                thread_ctx: HashMap::new(),
                orders_pages: false,
            }),
        }
    }

    /// A fake that lives for the process (the manager keeps `&'static`).
    pub fn leak(devices: usize, capacity: u64) -> &'static Fake {
        Box::leak(Box::new(Fake::new(devices, capacity)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answer `Runtime::orders_pages` so (as `u3m replay`'s hand-over
    /// models do; the fake itself orders nothing by memory).
    pub fn set_orders_pages(&self, on: bool) {
        self.lock().orders_pages = on;
    }

    /// Each thread gets its own current device (0 until it sets one), as
    /// with the real runtime's per-thread context.
    pub fn set_per_thread_device(&self) {
        self.lock().per_thread = Some(HashMap::new());
    }

    /// A forked child's runtime: the parent's streams (their work and
    /// workers) are not there; work queued on one is a misuse. The default
    /// stream stays.
    pub fn forget_streams(&self) {
        self.lock().streams.retain(|&s, _| s == 0);
    }

    /// A new context on `dev` (aclrtCreateContext), made the calling
    /// thread's current context (its device becomes `dev`).
    pub fn create_context(&self, dev: u32) -> u64 {
        let mut st = self.lock();
        let ctx = 0xc1_0000 + st.contexts.len() as u64;
        st.contexts.insert(ctx, dev);
        drop(st);
        self.set_context(ctx).expect("a context just made");
        ctx
    }

    /// From now on, a host-to-device copy queued on a stream of `dev` is
    /// held inside the runtime (the caller blocks in `memcpy_async`) until
    /// `release_copy_ins`.
    pub fn hold_copy_ins(&self, dev: u32) {
        *self.gate.lock().unwrap() = Some((dev, false, 0));
    }

    /// Copies held by `hold_copy_ins` so far, waiting up to `ms` for one.
    pub fn copy_ins_held(&self, ms: u64) -> u32 {
        let g = self.gate.lock().unwrap();
        let (g, _) = self
            .gate_cv
            .wait_timeout_while(g, std::time::Duration::from_millis(ms), |g| {
                g.is_some_and(|(_, _, n)| n == 0)
            })
            .unwrap();
        g.map_or(0, |(_, _, n)| n)
    }

    /// Lets the held copies (and later ones) through.
    pub fn release_copy_ins(&self) {
        if let Some(g) = self.gate.lock().unwrap().as_mut() {
            g.1 = true;
        }
        self.gate_cv.notify_all();
    }

    /// Blocks a host-to-device copy on `stream` while the gate holds its device.
    fn gate(&self, stream: u64, kind: MemcpyKind) {
        if kind != MemcpyKind::HOST_TO_DEVICE {
            return;
        }
        let Some(dev) = self.lock().streams.get(&stream).map(|s| s.dev) else {
            return;
        };
        let mut g = self.gate.lock().unwrap();
        match g.as_mut() {
            Some((d, false, n)) if *d == dev => *n += 1,
            _ => return,
        }
        self.gate_cv.notify_all();
        let _g = self
            .gate_cv
            .wait_while(g, |g| matches!(g, Some((_, false, _))))
            .unwrap();
    }

    /// From now on the next `n` host waits (sync_stream, sync_event, any
    /// thread) are held inside the runtime, before they run anything, until
    /// `release_waits`; later ones go through.
    pub fn hold_waits(&self, n: u32) {
        *self.wait_gate.lock().unwrap() = Some((n, false, 0));
    }

    /// Waits held by `hold_waits` so far, waiting up to `ms` for one.
    pub fn waits_held(&self, ms: u64) -> u32 {
        let g = self.wait_gate.lock().unwrap();
        let (g, _) = self
            .wait_gate_cv
            .wait_timeout_while(g, std::time::Duration::from_millis(ms), |g| {
                g.is_some_and(|(_, _, n)| n == 0)
            })
            .unwrap();
        g.map_or(0, |(_, _, n)| n)
    }

    /// Lets the held waits through.
    pub fn release_waits(&self) {
        if let Some(g) = self.wait_gate.lock().unwrap().as_mut() {
            g.1 = true;
        }
        self.wait_gate_cv.notify_all();
    }

    /// Blocks a host wait while `hold_waits` has some left to hold.
    fn wait_gate(&self) {
        let mut g = self.wait_gate.lock().unwrap();
        match g.as_mut() {
            Some((left, false, n)) if *left > 0 => {
                *left -= 1;
                *n += 1;
            }
            _ => return,
        }
        self.wait_gate_cv.notify_all();
        let _g = self
            .wait_gate_cv
            .wait_while(g, |g| matches!(g, Some((_, false, _))))
            .unwrap();
    }

    /// Queued work runs as soon as it is queued (the device is never behind).
    pub fn set_eager(&self, eager: bool) {
        self.lock().eager = eager;
    }

    /// Runs every stream to the end (the device catches up).
    pub fn drain(&self) {
        let mut st = self.lock();
        let ids: Vec<u64> = st.streams.keys().copied().collect();
        for s in ids {
            let _ = st.run(s, u64::MAX);
        }
    }

    pub fn seen(&self) -> Seen {
        self.lock().seen.clone()
    }

    /// Physical handles alive / pinned host bytes held.
    pub fn held(&self) -> (usize, usize) {
        let st = self.lock();
        (st.phys.len(), st.host.values().sum())
    }

    /// The next `n` host-to-device `memcpy_async` calls fail.
    pub fn fail_h2d(&self, n: u32) {
        self.lock().fail_h2d = n;
    }

    /// The `n` host-to-device `memcpy_async` calls after the next `pass`
    /// fail.
    pub fn fail_h2d_after(&self, pass: u32, n: u32) {
        let mut st = self.lock();
        st.pass_h2d = pass;
        st.fail_h2d = n;
    }

    /// The card disappears: every call on it fails with
    /// ACL_ERROR_RT_DEVICE_TASK_ABORT from now on and its memory is gone.
    pub fn lose(&self) {
        let mut st = self.lock();
        st.lost = true;
        for p in st.phys.values_mut() {
            p.data.iter_mut().for_each(|b| *b = 0xdd);
        }
    }

    // --- the program's side (what libu3m.so's hooks forward) ---

    /// A stream of the program's.
    pub fn app_stream(&self) -> u64 {
        self.create_stream().expect("stream")
    }

    /// A synchronous host-to-device copy (aclrtMemcpy): runs now.
    pub fn app_write(&self, va: u64, data: &[u8]) -> Result<(), AclError> {
        let mut st = self.lock();
        if st.lost {
            return Err(AclError::RT_DEVICE_TASK_ABORT);
        }
        st.seen.h2d += 1;
        st.seen.h2d_bytes += data.len() as u64;
        if st.dev_write(va, data, "aclrtMemcpy H2D") {
            Ok(())
        } else {
            Err(AclError::RT_DEVICE_MEM_ERROR)
        }
    }

    /// A synchronous device-to-host copy (aclrtMemcpy): runs now.
    pub fn app_read(&self, va: u64, len: u64) -> Result<Vec<u8>, AclError> {
        let mut st = self.lock();
        if st.lost {
            return Err(AclError::RT_DEVICE_TASK_ABORT);
        }
        st.seen.d2h += 1;
        st.seen.d2h_bytes += len;
        let mut out = vec![0u8; len as usize];
        if st.dev_read(va, &mut out, "aclrtMemcpy D2H") {
            Ok(out)
        } else {
            Err(AclError::RT_DEVICE_MEM_ERROR)
        }
    }

    /// An operator launched on `stream`, touching `ranges` when it runs.
    pub fn app_launch(
        &self,
        stream: u64,
        what: &'static str,
        ranges: Vec<(u64, u64)>,
        f: Kernel,
    ) -> Result<(), AclError> {
        self.lock().queue(stream, Op::Launch { what, ranges, f })
    }
}

fn lost<T>(st: &State) -> Result<T, AclError> {
    debug_assert!(st.lost);
    Err(AclError::RT_DEVICE_TASK_ABORT)
}

impl Runtime for Fake {
    fn current_device(&self) -> Option<u32> {
        Some(self.lock().cur())
    }

    fn set_device(&self, dev: u32) -> Result<(), AclError> {
        let mut st = self.lock();
        if dev as usize >= st.capacity.len() {
            return Err(AclError::RT_PARAM_INVALID);
        }
        match st.per_thread.as_mut() {
            Some(m) => {
                m.insert(std::thread::current().id(), dev);
            }
            None => st.cur_dev = dev,
        }
        // aclrtSetDevice: the thread is on the device's default context
        st.thread_ctx.remove(&std::thread::current().id());
        Ok(())
    }

    fn current_context(&self) -> Option<u64> {
        let st = self.lock();
        let id = std::thread::current().id();
        Some(
            st.thread_ctx
                .get(&id)
                .copied()
                .unwrap_or(DEFAULT_CTX | st.cur() as u64),
        )
    }

    fn set_context(&self, ctx: u64) -> Result<(), AclError> {
        let explicit = self.lock().contexts.get(&ctx).copied();
        let dev = match explicit {
            Some(d) => d,
            None if ctx & !0xff == DEFAULT_CTX => (ctx & 0xff) as u32,
            None => {
                let mut st = self.lock();
                return Err(st.misuse(format!("set_context of unknown context {ctx:#x}")));
            }
        };
        self.set_device(dev)?;
        if explicit.is_some() {
            self.lock()
                .thread_ctx
                .insert(std::thread::current().id(), ctx);
        }
        Ok(())
    }

    fn malloc_physical(&self, dev: u32, bytes: u64) -> Result<u64, AclError> {
        let mut st = self.lock();
        if st.lost {
            return lost(&st);
        }
        let d = dev as usize;
        #[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than rust-version 1.75
        let whole_chunks = bytes % CHUNK == 0;
        if d >= st.capacity.len() || bytes == 0 || !whole_chunks {
            return Err(AclError::RT_PARAM_INVALID);
        }
        if st.used[d] + bytes > st.capacity[d] {
            return Err(AclError::RT_MEMORY_ALLOCATION);
        }
        st.used[d] += bytes;
        let h = st.next_handle;
        st.next_handle += 16;
        st.phys.insert(
            h,
            Phys {
                dev,
                data: vec![0u8; bytes as usize],
                maps: 0,
                host: false,
            },
        );
        Ok(h)
    }

    fn malloc_physical_host(&self, dev: u32, bytes: u64) -> Result<u64, AclError> {
        let mut st = self.lock();
        if st.lost {
            return lost(&st);
        }
        #[allow(clippy::manual_is_multiple_of)]
        let whole_chunks = bytes % CHUNK == 0;
        if bytes == 0 || !whole_chunks {
            return Err(AclError::RT_PARAM_INVALID);
        }
        let h = st.next_handle;
        st.next_handle += 16;
        st.phys.insert(
            h,
            Phys {
                dev,
                data: vec![0u8; bytes as usize],
                maps: 0,
                host: true,
            },
        );
        st.seen.host_handles += 1;
        Ok(h)
    }

    fn free_physical(&self, handle: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        match st.phys.get(&handle) {
            None => return Err(st.misuse(format!("free of unknown handle {handle:#x}"))),
            Some(p) if p.maps != 0 => {
                let m = format!("free of handle {handle:#x} still mapped {} time(s)", p.maps);
                st.misuse(m);
                return Err(AclError::RT_MEMORY_FREE);
            }
            Some(_) => {}
        }
        let p = st.phys.remove(&handle).expect("handle");
        if p.host {
            st.seen.host_handles -= 1;
        } else {
            st.used[p.dev as usize] -= p.data.len() as u64;
        }
        Ok(())
    }

    fn reserve(&self, bytes: u64) -> Result<u64, AclError> {
        let mut st = self.lock();
        let len = bytes.div_ceil(CHUNK).max(1) * CHUNK;
        let va = st.next_va;
        st.next_va += len + CHUNK; // a gap: adjacent reservations never merge
        st.reserved.insert(va, len);
        Ok(va)
    }

    fn release(&self, va: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        let Some(&len) = st.reserved.get(&va) else {
            return Err(st.misuse(format!("release of {va:#x}: not a reservation")));
        };
        if st.maps.range(va..va + len).next().is_some() {
            return Err(st.misuse(format!("release of {va:#x} with mappings left")));
        }
        st.reserved.remove(&va);
        Ok(())
    }

    fn map(&self, va: u64, bytes: u64, handle: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        if st.lost {
            return lost(&st);
        }
        let inside = st
            .reserved
            .range(..=va)
            .next_back()
            .map(|(&r, &n)| va + bytes <= r + n)
            .unwrap_or(false);
        let overlaps = st
            .maps
            .range(..va + bytes)
            .next_back()
            .map(|(&m, &(n, _))| m + n > va)
            .unwrap_or(false);
        let fits = st
            .phys
            .get(&handle)
            .map(|p| bytes <= p.data.len() as u64)
            .unwrap_or(false);
        if !inside || overlaps || !fits {
            return Err(st.misuse(format!(
                "map {va:#x}+{bytes} of {handle:#x}: inside a reservation {inside}, overlaps a mapping {overlaps}, handle fits {fits}"
            )));
        }
        st.maps.insert(va, (bytes, handle));
        st.phys.get_mut(&handle).expect("handle").maps += 1;
        Ok(())
    }

    fn unmap(&self, va: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        let Some((_, h)) = st.maps.remove(&va) else {
            return Err(st.misuse(format!("unmap of {va:#x}: not a mapping")));
        };
        if let Some(p) = st.phys.get_mut(&h) {
            p.maps -= 1;
        }
        Ok(())
    }

    fn create_stream(&self) -> Result<u64, AclError> {
        let mut st = self.lock();
        let s = st.next_stream;
        st.next_stream += 16;
        let dev = st.cur();
        st.streams.insert(
            s,
            Stream {
                dev,
                ..Stream::default()
            },
        );
        Ok(s)
    }

    fn memcpy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: u64,
        kind: MemcpyKind,
        stream: u64,
    ) -> Result<(), AclError> {
        self.gate(stream, kind);
        let mut st = self.lock();
        match kind {
            MemcpyKind::HOST_TO_DEVICE => {
                if st.fail_h2d > 0 && st.pass_h2d > 0 {
                    // (`fail_h2d_after`: these go through first)
                    st.pass_h2d -= 1;
                } else if st.fail_h2d > 0 {
                    // as the simulator's ACLSIM_FAULTS=copy:N: refused at the call
                    st.fail_h2d -= 1;
                    return Err(AclError::RT_DEVICE_MEM_ERROR);
                }
                st.seen.h2d += 1;
                st.seen.h2d_bytes += bytes;
            }
            MemcpyKind::DEVICE_TO_HOST => {
                st.seen.d2h += 1;
                st.seen.d2h_bytes += bytes;
            }
            _ => st.seen.d2d += 1,
        }
        st.context(stream, "memcpy_async")?;
        st.queue(
            stream,
            Op::Copy {
                dst,
                src,
                bytes,
                kind,
            },
        )
    }

    fn memset_async(&self, dst: u64, bytes: u64, value: u8, stream: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        st.context(stream, "memset_async")?;
        st.queue(
            stream,
            Op::Launch {
                what: "memset_async",
                ranges: vec![(dst, bytes)],
                f: Box::new(move |m: &mut Mem<'_>| m.write(dst, &vec![value; bytes as usize])),
            },
        )
    }

    fn sync_stream(&self, stream: u64) -> Result<(), AclError> {
        self.wait_gate();
        let mut st = self.lock();
        st.note_wait("sync_stream");
        if st.lost {
            return lost(&st);
        }
        st.context(stream, "sync_stream")?;
        st.run(stream, u64::MAX)
    }

    fn create_event(&self) -> Result<u64, AclError> {
        let mut st = self.lock();
        let e = st.next_event;
        st.next_event += 16;
        st.events.insert(e, None);
        Ok(e)
    }

    fn record_event(&self, event: u64, stream: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        if st.lost {
            return lost(&st);
        }
        let Some(pos) = st.streams.get(&stream).map(|s| s.queued) else {
            return Err(st.misuse(format!("record on unknown stream {stream:#x}")));
        };
        st.context(stream, "record_event")?;
        match st.events.get_mut(&event) {
            Some(e) => {
                *e = Some((stream, pos));
                *st.seen.records.entry(stream).or_insert(0) += 1;
                Ok(())
            }
            None => Err(st.misuse(format!("record of unknown event {event:#x}"))),
        }
    }

    fn event_done(&self, event: u64) -> Result<bool, AclError> {
        let mut st = self.lock();
        match st.events.get(&event) {
            Some(None) => Ok(true),
            Some(&Some((s, pos))) => {
                let done = st.streams[&s].run >= pos;
                if done {
                    *st.seen.done_answers.entry(s).or_insert(0) += 1;
                } else {
                    *st.seen.pending_answers.entry(event).or_insert(0) += 1;
                }
                Ok(done)
            }
            None => Err(st.misuse(format!("query of unknown event {event:#x}"))),
        }
    }

    fn sync_event(&self, event: u64) -> Result<(), AclError> {
        self.wait_gate();
        let mut st = self.lock();
        st.note_wait("sync_event");
        if st.lost {
            return lost(&st);
        }
        match st.events.get(&event) {
            Some(None) => Ok(()),
            Some(&Some((s, pos))) => st.run(s, pos),
            None => Err(st.misuse(format!("sync of unknown event {event:#x}"))),
        }
    }

    fn orders_pages(&self) -> bool {
        self.lock().orders_pages
    }

    fn stream_wait(&self, stream: u64, event: u64) -> Result<(), AclError> {
        let mut st = self.lock();
        st.context(stream, "stream_wait")?;
        *st.seen.stream_waits.entry(stream).or_insert(0) += 1;
        match st.events.get(&event) {
            Some(None) => Ok(()),
            Some(&Some((s, pos))) => st.queue(stream, Op::Wait { stream: s, pos }),
            None => Err(st.misuse(format!("wait on unknown event {event:#x}"))),
        }
    }

    fn malloc_host(&self, bytes: u64) -> Result<*mut u8, AclError> {
        let layout = Layout::from_size_align(bytes.max(1) as usize, HOST_ALIGN)
            .map_err(|_| AclError::RT_PARAM_INVALID)?;
        // zeroed pages come from mmap lazily: a 256 MiB slab costs nothing
        // until written
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(AclError::RT_MEMORY_ALLOCATION);
        }
        self.lock().host.insert(p as usize, layout.size());
        Ok(p)
    }

    fn free_host(&self, ptr: *mut u8) -> Result<(), AclError> {
        let mut st = self.lock();
        let Some(len) = st.host.remove(&(ptr as usize)) else {
            return Err(st.misuse(format!("free of unknown host memory {ptr:p}")));
        };
        let layout = Layout::from_size_align(len, HOST_ALIGN).expect("layout");
        unsafe { std::alloc::dealloc(ptr, layout) };
        Ok(())
    }

    fn mem_info(&self) -> Result<(u64, u64), AclError> {
        let st = self.lock();
        if st.lost {
            return lost(&st);
        }
        let d = st.cur() as usize;
        Ok((st.capacity[d] - st.used[d], st.capacity[d]))
    }
}
