//! The recorder behind `U3M_TRACE=<path>`: hooks hand it what they saw, on any
//! thread, and one writer thread turns that into a trace file.
//!
//! Hot path ([`Recorder::record`]): a relaxed state check, one clock read
//! (`clock_gettime(CLOCK_MONOTONIC)`, served by the vDSO), one atomic
//! reservation and one push per record into a fixed-capacity lock-free queue
//! (crossbeam's `ArrayQueue`, allocated once at start) of fixed-size [`Slot`]s
//! — no lock, no allocation, no system call. The op type is copied inline (at
//! most [`NAME_INLINE`] bytes; longer names are cut there); an op's ranges go
//! [`RANGES_PER_SLOT`] to a slot, an op with more takes several consecutive
//! slots reserved all at once, so it is recorded whole or not at all.
//!
//! Full queue: the event is dropped and counted, and the count appears in the
//! file as `# dropped N events` comments (N since the previous such comment,
//! at the point the writer noticed) and on stderr at [`Recorder::stop`]. With
//! `lossless` (U3M_TRACE_LOSSLESS=1, for tests) the producer instead waits —
//! spinning briefly, then sleeping 50 µs and later 500 µs at a time — for the
//! writer to make room, for at most `lossless_wait`, then drops and counts.
//!
//! The writer thread pops records, reassembles multi-slot ops (an op keeps the
//! position of its first slot: later records wait behind it), feeds everything
//! through [`Repair`] (VMM runs, validity) and formats it into a 64 KiB
//! `BufWriter` on the file, which it writes out whenever the queue runs dry.
//! It polls: when idle it naps (20 µs right after work, then 1 ms, after a
//! quiet second 10 ms); producers
//! never wake it, as that would be a system call on the hot path.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use super::event::{sanitize_word, Body, CopyKind, Event, Range};
use super::repair::{Input, Output, Repair};
use super::writer::TraceWriter;

/// Op-type bytes kept per op.
pub const NAME_INLINE: usize = 64;
/// Ranges per slot.
pub const RANGES_PER_SLOT: usize = 8;

/// How a recorder runs.
#[derive(Debug, Clone)]
pub struct RecorderConfig {
    /// Queue capacity in slots (each [`Slot`] is 280 bytes, allocated at start).
    pub capacity: usize,
    /// Wait for room instead of dropping (U3M_TRACE_LOSSLESS=1).
    pub lossless: bool,
    /// Longest a lossless producer waits for room before dropping.
    pub lossless_wait: Duration,
    /// Longest [`Recorder::flush`] and [`Recorder::stop`] wait for the writer.
    pub flush_wait: Duration,
    /// Longest [`Recorder::flush_from_signal`] waits for the writer.
    pub signal_wait: Duration,
    /// Report drops and repairs on stderr at stop.
    pub report: bool,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        RecorderConfig {
            capacity: 16384,
            lossless: false,
            lossless_wait: Duration::from_secs(10),
            flush_wait: Duration::from_secs(10),
            signal_wait: Duration::from_secs(1),
            report: true,
        }
    }
}

/// What a hook saw, borrowed from its arguments. `op_type` is the raw C
/// string (made a word by the writer thread: see [`sanitize_word`]).
#[derive(Debug, Clone, Copy)]
pub enum Rec<'a> {
    /// An allocation succeeded (record after the real call returns).
    Alloc {
        addr: u64,
        bytes: u64,
    },
    /// An allocation is about to be freed (record before the real call, so a
    /// re-allocation of the same address on another thread comes after it).
    Free {
        addr: u64,
    },
    Op {
        op_type: &'a [u8],
        inputs: &'a [Range],
        outputs: &'a [Range],
        flops: Option<u64>,
    },
    Copy {
        kind: CopyKind,
        dst: u64,
        src: u64,
        bytes: u64,
    },
    /// A copy of unknown direction (ACL_MEMCPY_DEFAULT): the writer decides
    /// each side by whether it lies in a live allocation.
    CopyAuto {
        dst: u64,
        src: u64,
        bytes: u64,
    },
    Set {
        addr: u64,
        bytes: u64,
    },
    /// A VMM mapping was made (after aclrtMapMem succeeded).
    Map {
        addr: u64,
        bytes: u64,
    },
    /// A VMM mapping is about to be removed (before aclrtUnmapMem).
    Unmap {
        addr: u64,
    },
}

const K_ALLOC: u8 = 1;
const K_FREE: u8 = 2;
const K_OP: u8 = 3;
const K_MORE: u8 = 4; // continuation of a multi-slot op
const K_COPY: u8 = 5;
const K_COPY_AUTO: u8 = 6;
const K_SET: u8 = 7;
const K_MAP: u8 = 8;
const K_UNMAP: u8 = 9;

const F_FLOPS: u8 = 1;

/// One queue record (plain data, copied in and out).
#[derive(Clone, Copy)]
pub struct Slot {
    t: u64,
    /// Multi-slot op id (0: single slot).
    id: u64,
    a: u64,
    b: u64,
    c: u64,
    flops: u64,
    tag: Option<&'static str>,
    dev: u32,
    stream: u32,
    n_in: u32,
    n_out: u32,
    kind: u8,
    copy_kind: u8,
    flags: u8,
    nranges: u8,
    name_len: u8,
    name: [u8; NAME_INLINE],
    ranges: [Range; RANGES_PER_SLOT],
}

const EMPTY: Slot = Slot {
    t: 0,
    id: 0,
    a: 0,
    b: 0,
    c: 0,
    flops: 0,
    tag: None,
    dev: 0,
    stream: 0,
    n_in: 0,
    n_out: 0,
    kind: 0,
    copy_kind: 0,
    flags: 0,
    nranges: 0,
    name_len: 0,
    name: [0; NAME_INLINE],
    ranges: [Range { addr: 0, bytes: 0 }; RANGES_PER_SLOT],
};

const RUNNING: u8 = 0;
const STOPPING: u8 = 1;
const STOPPED: u8 = 2;
const DISABLED: u8 = 3; // fork child: record nothing, write nothing

struct Shared {
    queue: ArrayQueue<Slot>,
    /// Slots reserved by producers and not yet popped (>= queue length).
    reserved: AtomicUsize,
    dropped: AtomicU64,
    next_op: AtomicU64,
    state: AtomicU8,
    paused: AtomicBool,
    /// The writer has seen `paused` (and drains nothing until it is cleared).
    pause_seen: AtomicBool,
    flush_req: AtomicU64,
    flushed: AtomicU64,
    finished: AtomicBool,
    writer_tid: AtomicI32,
    written: AtomicU64,
    repaired: AtomicU64,
    io_failed: AtomicBool,
    t0: Instant,
    cfg: RecorderConfig,
    path: PathBuf,
}

/// Counters at a point in time (see [`Recorder::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecorderStats {
    /// Event lines written to the file so far.
    pub written: u64,
    /// Events dropped because the queue was full.
    pub dropped: u64,
    /// Events the writer repaired or left out (see `repair`).
    pub repaired: u64,
}

/// A running trace recording. Share it by reference (it is `Sync`).
pub struct Recorder {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

impl Recorder {
    /// Creates (truncates) `path`, writes the header and starts the writer thread.
    pub fn start(path: impl AsRef<Path>) -> io::Result<Recorder> {
        Recorder::start_with(path, RecorderConfig::default())
    }

    pub fn start_with(path: impl AsRef<Path>, cfg: RecorderConfig) -> io::Result<Recorder> {
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path)?;
        let mut out = TraceWriter::new(BufWriter::with_capacity(1 << 16, file))?;
        out.flush()?;
        let shared = Arc::new(Shared {
            queue: ArrayQueue::new(cfg.capacity.max(2)),
            reserved: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            next_op: AtomicU64::new(1),
            state: AtomicU8::new(RUNNING),
            paused: AtomicBool::new(false),
            pause_seen: AtomicBool::new(false),
            flush_req: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            finished: AtomicBool::new(false),
            writer_tid: AtomicI32::new(0),
            written: AtomicU64::new(0),
            repaired: AtomicU64::new(0),
            io_failed: AtomicBool::new(false),
            t0: Instant::now(),
            cfg,
            path,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("u3m-trace".into())
            .spawn(move || writer_main(&s, out))?;
        Ok(Recorder {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Records what a hook saw on device `dev`, stream id `stream` (0: the
    /// default stream and synchronous calls). Never blocks (unless lossless),
    /// never allocates, never makes a system call.
    #[inline]
    pub fn record(&self, dev: u32, stream: u32, rec: Rec<'_>) {
        self.record_tagged(dev, stream, None, rec)
    }

    /// [`Recorder::record`] with a `tag=` (a static word: `weight`, `kv`, ...).
    pub fn record_tagged(&self, dev: u32, stream: u32, tag: Option<&'static str>, rec: Rec<'_>) {
        let sh = &*self.shared;
        if sh.state.load(Relaxed) != RUNNING {
            return;
        }
        let t = sh.t0.elapsed().as_nanos() as u64;
        let mut s = Slot {
            t,
            dev,
            stream,
            tag,
            ..EMPTY
        };
        match rec {
            Rec::Alloc { addr, bytes } => (s.kind, s.a, s.b) = (K_ALLOC, addr, bytes),
            Rec::Free { addr } => (s.kind, s.a) = (K_FREE, addr),
            Rec::Copy {
                kind,
                dst,
                src,
                bytes,
            } => (s.kind, s.copy_kind, s.a, s.b, s.c) = (K_COPY, kind as u8, dst, src, bytes),
            Rec::CopyAuto { dst, src, bytes } => {
                (s.kind, s.a, s.b, s.c) = (K_COPY_AUTO, dst, src, bytes)
            }
            Rec::Set { addr, bytes } => (s.kind, s.a, s.b) = (K_SET, addr, bytes),
            Rec::Map { addr, bytes } => (s.kind, s.a, s.b) = (K_MAP, addr, bytes),
            Rec::Unmap { addr } => (s.kind, s.a) = (K_UNMAP, addr),
            Rec::Op {
                op_type,
                inputs,
                outputs,
                flops,
            } => return self.record_op(s, op_type, inputs, outputs, flops),
        }
        if self.reserve(1) {
            self.push(s);
        }
    }

    fn record_op(
        &self,
        mut s: Slot,
        op_type: &[u8],
        inputs: &[Range],
        outputs: &[Range],
        flops: Option<u64>,
    ) {
        let n = inputs.len() + outputs.len();
        let slots = n.div_ceil(RANGES_PER_SLOT).max(1);
        if n > u32::MAX as usize || !self.reserve(slots) {
            if n > u32::MAX as usize {
                self.shared.dropped.fetch_add(1, Relaxed);
            }
            return;
        }
        s.kind = K_OP;
        let len = op_type.len().min(NAME_INLINE);
        s.name[..len].copy_from_slice(&op_type[..len]);
        s.name_len = len as u8;
        (s.n_in, s.n_out) = (inputs.len() as u32, outputs.len() as u32);
        if let Some(f) = flops {
            s.flops = f;
            s.flags |= F_FLOPS;
        }
        if slots > 1 {
            s.id = self.shared.next_op.fetch_add(1, Relaxed);
        }
        let mut ranges = inputs.iter().chain(outputs);
        for part in 0..slots {
            if part > 0 {
                s = Slot {
                    t: s.t,
                    id: s.id,
                    kind: K_MORE,
                    ..EMPTY
                };
            }
            let mut k = 0;
            for r in ranges.by_ref().take(RANGES_PER_SLOT) {
                s.ranges[k] = *r;
                k += 1;
            }
            s.nranges = k as u8;
            self.push(s);
        }
    }

    /// Reserves `n` queue slots, or counts a dropped event and says no.
    fn reserve(&self, n: usize) -> bool {
        let sh = &*self.shared;
        let cap = sh.queue.capacity();
        if n > cap {
            sh.dropped.fetch_add(1, Relaxed);
            return false;
        }
        let mut waited: Option<Instant> = None;
        let mut spins = 0u32;
        loop {
            let prev = sh.reserved.fetch_add(n, AcqRel);
            if prev + n <= cap {
                return true;
            }
            sh.reserved.fetch_sub(n, AcqRel);
            if !sh.cfg.lossless || sh.state.load(Relaxed) != RUNNING || sh.finished.load(Relaxed) {
                break;
            }
            // lossless: wait for the writer, boundedly
            let start = *waited.get_or_insert_with(Instant::now);
            if start.elapsed() > sh.cfg.lossless_wait {
                break;
            }
            spins += 1;
            // give the CPU to the writer: spinning producers starve it when
            // there are more threads than cores
            if spins < 16 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(if spins < 64 { 50 } else { 500 }));
            }
        }
        sh.dropped.fetch_add(1, Relaxed);
        false
    }

    fn push(&self, s: Slot) {
        // Cannot fail: the reservation guarantees room.
        if self.shared.queue.push(s).is_err() {
            self.shared.dropped.fetch_add(1, Relaxed);
        }
    }

    /// Records an owned event (tests, tools): as [`Recorder::record`], with the
    /// event's dev, stream, flops and tag (a tag not among a few known words is
    /// written as `other`, since the queue holds only static strings).
    pub fn record_event(&self, ev: &Event) {
        const TAGS: [&str; 8] = [
            "weight", "act", "kv", "optim", "grad", "pool", "vmm", "host",
        ];
        let tag = ev
            .tag
            .as_deref()
            .map(|t| TAGS.iter().copied().find(|k| *k == t).unwrap_or("other"));
        let rec = match &ev.body {
            Body::Alloc { addr, bytes } => Rec::Alloc {
                addr: *addr,
                bytes: *bytes,
            },
            Body::Free { addr } => Rec::Free { addr: *addr },
            Body::Op {
                op_type,
                inputs,
                outputs,
            } => Rec::Op {
                op_type: op_type.as_bytes(),
                inputs,
                outputs,
                flops: ev.flops,
            },
            Body::Copy {
                kind,
                dst,
                src,
                bytes,
            } => Rec::Copy {
                kind: *kind,
                dst: *dst,
                src: *src,
                bytes: *bytes,
            },
            Body::Set { addr, bytes } => Rec::Set {
                addr: *addr,
                bytes: *bytes,
            },
        };
        self.record_tagged(ev.dev, ev.stream, tag, rec);
    }

    /// Counters so far.
    pub fn stats(&self) -> RecorderStats {
        let sh = &*self.shared;
        RecorderStats {
            written: sh.written.load(Acquire),
            dropped: sh.dropped.load(Acquire),
            repaired: sh.repaired.load(Acquire),
        }
    }

    /// Waits (at most `flush_wait`) until everything recorded before the call
    /// is written to the file. Returns whether it was. Not for signal handlers.
    pub fn flush(&self) -> bool {
        let sh = &*self.shared;
        if sh.state.load(Acquire) == DISABLED || sh.finished.load(Acquire) {
            return sh.finished.load(Acquire);
        }
        let gen = sh.flush_req.fetch_add(1, SeqCst) + 1;
        if let Some(t) = self
            .thread
            .lock()
            .ok()
            .and_then(|g| g.as_ref().map(|h| h.thread().clone()))
        {
            t.unpark();
        }
        let start = Instant::now();
        while sh.flushed.load(SeqCst) < gen {
            if sh.finished.load(Acquire) {
                return true;
            }
            if start.elapsed() > sh.cfg.flush_wait {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }

    /// For a fatal-signal handler: asks the writer thread to drain the queue
    /// and write everything out, and waits for it at most `signal_wait`, using
    /// only atomics, `syscall(SYS_gettid)` and `nanosleep` (async-signal-safe).
    /// Nothing is formatted or allocated here. Returns whether the writer
    /// confirmed. It cannot help if the signal arrived on the writer thread
    /// itself (returns at once), if the writer is blocked (e.g. on a malloc
    /// lock the crashing thread holds, or a full disk), or if the process is
    /// killed outright (SIGKILL): then what was still queued is lost, while
    /// what the writer had already written stays in the file.
    pub fn flush_from_signal(&self) -> bool {
        let sh = &*self.shared;
        if sh.state.load(Acquire) != RUNNING || sh.finished.load(Acquire) {
            return false;
        }
        if gettid() == sh.writer_tid.load(Acquire) {
            return false;
        }
        let gen = sh.flush_req.fetch_add(1, SeqCst) + 1;
        let step = libc::timespec {
            tv_sec: 0,
            tv_nsec: 500_000,
        };
        let steps = (sh.cfg.signal_wait.as_micros() / 500).max(1);
        for _ in 0..steps {
            if sh.flushed.load(SeqCst) >= gen {
                return true;
            }
            // SAFETY: nanosleep with a valid timespec; the remainder pointer may be null.
            unsafe { libc::nanosleep(&step, std::ptr::null_mut()) };
        }
        sh.flushed.load(SeqCst) >= gen
    }

    /// Writes everything out, ends the file with the drop/repair summary,
    /// stops the writer thread and reports drops and repairs on stderr.
    /// Records after this are ignored. Idempotent; waits at most `flush_wait`.
    pub fn stop(&self) -> RecorderStats {
        let sh = &*self.shared;
        if sh
            .state
            .compare_exchange(RUNNING, STOPPING, AcqRel, Acquire)
            .is_err()
        {
            return self.stats();
        }
        sh.paused.store(false, Release);
        let handle = self.thread.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = &handle {
            h.thread().unpark();
        }
        let start = Instant::now();
        while !sh.finished.load(Acquire) && start.elapsed() <= sh.cfg.flush_wait {
            std::thread::sleep(Duration::from_micros(200));
        }
        let finished = sh.finished.load(Acquire);
        if finished {
            if let Some(h) = handle {
                let _ = h.join();
            }
        }
        sh.state.store(STOPPED, Release);
        let st = self.stats();
        if sh.cfg.report {
            let mut err = io::stderr().lock();
            let p = sh.path.display();
            if !finished {
                let _ = writeln!(
                    err,
                    "u3m: trace {p}: the writer did not finish in time; the file may be incomplete"
                );
            }
            if st.dropped > 0 {
                let _ = writeln!(
                    err,
                    "u3m: trace {p}: {} events dropped (queue full; U3M_TRACE_LOSSLESS=1 waits instead)",
                    st.dropped
                );
            }
            if st.repaired > 0 {
                let _ = writeln!(
                    err,
                    "u3m: trace {p}: {} events repaired or left out (see '# u3m:' comments)",
                    st.repaired
                );
            }
        }
        st
    }

    /// In a forked child: the writer thread does not exist there and the file
    /// belongs to the parent, so the recorder goes quiet (records are ignored,
    /// nothing is written). Start a new recorder for the child if it should be
    /// traced. Async-signal-safe (one atomic store).
    pub fn forget_after_fork(&self) {
        self.shared.state.store(DISABLED, Release);
    }

    /// Test hook: a paused writer does not drain the queue (so tests can fill
    /// it). Pausing waits (at most `flush_wait`) until the writer has seen it.
    #[doc(hidden)]
    pub fn pause_writer(&self, paused: bool) {
        let sh = &*self.shared;
        sh.paused.store(paused, SeqCst);
        let start = Instant::now();
        while paused
            && !sh.pause_seen.load(SeqCst)
            && !sh.finished.load(Acquire)
            && start.elapsed() < sh.cfg.flush_wait
        {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.shared.state.load(Acquire) == RUNNING {
            self.stop();
        }
    }
}

/// Reassembles multi-slot ops; keeps records in the order of their first slot.
struct Assembler {
    pending: std::collections::VecDeque<Pending>,
}

struct Pending {
    id: u64,
    /// Ranges still to come (0: complete).
    missing: usize,
    n_in: usize,
    input: Input,
}

fn slot_name(s: &Slot) -> String {
    sanitize_word(&s.name[..s.name_len as usize])
}

impl Assembler {
    fn new() -> Assembler {
        Assembler {
            pending: std::collections::VecDeque::new(),
        }
    }

    /// Takes one slot; appends inputs that are complete and first in line.
    fn push(&mut self, s: &Slot, ready: &mut Vec<Input>) {
        let t = Some(s.t);
        let ev = |body: Body| -> Input {
            let mut e = Event::new(body).on_dev(s.dev).on_stream(s.stream);
            e.t = t;
            e.tag = s.tag.map(str::to_string);
            Input::Event(e)
        };
        let input = match s.kind {
            K_ALLOC => ev(Body::Alloc {
                addr: s.a,
                bytes: s.b,
            }),
            K_FREE => ev(Body::Free { addr: s.a }),
            K_SET => ev(Body::Set {
                addr: s.a,
                bytes: s.b,
            }),
            K_COPY => match CopyKind::ALL.get(s.copy_kind as usize) {
                Some(kind) => ev(Body::Copy {
                    kind: *kind,
                    dst: s.a,
                    src: s.b,
                    bytes: s.c,
                }),
                None => return,
            },
            K_COPY_AUTO => Input::CopyAuto {
                dev: s.dev,
                stream: s.stream,
                dst: s.a,
                src: s.b,
                bytes: s.c,
                t,
            },
            K_MAP => Input::Map {
                dev: s.dev,
                addr: s.a,
                bytes: s.b,
                t,
            },
            K_UNMAP => Input::Unmap {
                dev: s.dev,
                addr: s.a,
                t,
            },
            K_OP => {
                let total = s.n_in as usize + s.n_out as usize;
                let mut inputs = Vec::with_capacity(s.n_in as usize);
                let mut outputs = Vec::with_capacity(s.n_out as usize);
                for r in &s.ranges[..s.nranges as usize] {
                    if inputs.len() < s.n_in as usize {
                        inputs.push(*r);
                    } else {
                        outputs.push(*r);
                    }
                }
                let mut input = ev(Body::Op {
                    op_type: slot_name(s),
                    inputs,
                    outputs,
                });
                if s.flags & F_FLOPS != 0 {
                    if let Input::Event(e) = &mut input {
                        e.flops = Some(s.flops);
                    }
                }
                let missing = total - s.nranges as usize;
                self.pending.push_back(Pending {
                    id: s.id,
                    missing,
                    n_in: s.n_in as usize,
                    input,
                });
                self.release(ready);
                return;
            }
            K_MORE => {
                if let Some(p) = self
                    .pending
                    .iter_mut()
                    .rev()
                    .find(|p| p.id == s.id && p.missing > 0)
                {
                    if let Input::Event(Event {
                        body:
                            Body::Op {
                                inputs, outputs, ..
                            },
                        ..
                    }) = &mut p.input
                    {
                        for r in &s.ranges[..s.nranges as usize] {
                            if inputs.len() < p.n_in {
                                inputs.push(*r);
                            } else {
                                outputs.push(*r);
                            }
                        }
                    }
                    p.missing = p.missing.saturating_sub(s.nranges as usize);
                }
                self.release(ready);
                return;
            }
            _ => return,
        };
        self.pending.push_back(Pending {
            id: 0,
            missing: 0,
            n_in: 0,
            input,
        });
        self.release(ready);
    }

    fn release(&mut self, ready: &mut Vec<Input>) {
        while self.pending.front().is_some_and(|p| p.missing == 0) {
            if let Some(p) = self.pending.pop_front() {
                ready.push(p.input);
            }
        }
    }
}

fn writer_main(sh: &Shared, mut out: TraceWriter<BufWriter<File>>) {
    sh.writer_tid.store(gettid(), Release);
    let mut asm = Assembler::new();
    let mut repair = Repair::new();
    let mut ready = Vec::new();
    let mut outputs = Vec::new();
    let mut dropped_noted = 0u64;
    let mut idle = 0u32;
    let mut io_error: Option<io::Error> = None;
    let write =
        |out: &mut TraceWriter<BufWriter<File>>, o: &Output, io_error: &mut Option<io::Error>| {
            if io_error.is_some() {
                return;
            }
            let r = match o {
                Output::Event(e) => out.event(e).map(|_| {
                    sh.written.fetch_add(1, Release);
                }),
                Output::Comment(c) => out.comment(c),
            };
            if let Err(e) = r {
                *io_error = Some(e);
            }
        };
    loop {
        let req = sh.flush_req.load(SeqCst);
        let stopping = sh.state.load(Acquire) != RUNNING;
        let mut popped = 0usize;
        let paused = sh.paused.load(SeqCst) && !stopping;
        sh.pause_seen.store(paused, SeqCst);
        if !paused {
            while let Some(slot) = sh.queue.pop() {
                sh.reserved.fetch_sub(1, AcqRel);
                popped += 1;
                asm.push(&slot, &mut ready);
                for input in ready.drain(..) {
                    repair.push(input, &mut outputs);
                }
                for o in outputs.drain(..) {
                    write(&mut out, &o, &mut io_error);
                }
                sh.repaired.store(repair.repaired(), Release);
            }
        }
        // (not while paused: the queue still holds events recorded before
        // those drops, and the comment goes after them)
        let dropped = sh.dropped.load(Acquire);
        if !paused && dropped > dropped_noted {
            write(
                &mut out,
                &Output::Comment(format!("dropped {} events", dropped - dropped_noted)),
                &mut io_error,
            );
            dropped_noted = dropped;
        }
        if stopping && repair.repaired() > 0 {
            let c = format!("u3m: repaired {} events in all", repair.repaired());
            write(&mut out, &Output::Comment(c), &mut io_error);
        }
        if io_error.is_none() {
            if let Err(e) = out.flush() {
                io_error = Some(e);
            }
        }
        if let Some(e) = &io_error {
            if !sh.io_failed.swap(true, AcqRel) {
                if sh.cfg.report {
                    let _ = writeln!(
                        io::stderr(),
                        "u3m: trace {}: write failed: {e}; recording stops",
                        sh.path.display()
                    );
                }
                let _ = sh
                    .state
                    .compare_exchange(RUNNING, STOPPING, AcqRel, Acquire);
            }
        }
        if !paused {
            sh.flushed.store(req, SeqCst);
        }
        if stopping {
            break;
        }
        // idle: short naps right after work (producers waiting for room come
        // back soon), longer ones as it stays quiet
        if popped == 0 {
            idle = idle.saturating_add(1);
            let nap = if idle < 50 {
                Duration::from_micros(20)
            } else if idle < 1000 {
                Duration::from_millis(1)
            } else {
                Duration::from_millis(10) // quiet for a second: ~100 wakeups/s
            };
            std::thread::park_timeout(nap);
        } else {
            idle = 0;
        }
    }
    sh.finished.store(true, Release);
}
