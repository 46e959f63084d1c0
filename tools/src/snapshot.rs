//! `u3m snapshot`: a PyTorch memory snapshot (the pickle
//! `torch.cuda.memory._snapshot()` writes, which `torch.cuda._memory_viz` and
//! PyTorch's memory viewer read) of what u3m saw, so the viewer draws HBM
//! residency over time.
//!
//! u3m sits below the framework's caching allocator: every device
//! allocation is a *segment* (`segment_alloc` / `segment_free`) holding one
//! block (`alloc`, `free_requested`, `free_completed`). A chunk that arrives
//! in HBM (first touch, fault-in, prefetch) is `segment_map` of its 2 MiB at
//! its address, one that leaves (eviction) `segment_unmap` — the events
//! PyTorch's expandable segments write for the same thing.
//!
//! From a trace (`--trace FILE`) the residency comes from a replay through
//! the engine (`u3m replay`'s driver, with its cost model: times are
//! simulated). From a live process (`-p PID`) only the stats segment's event
//! ring is available: allocations and frees among its newest 4096 events;
//! the library publishes evictions and fault-ins as counters only, so a live
//! snapshot has no map/unmap events. docs/snapshot.md.

use crate::error::CliError;
use crate::pickle::{dumps, Py};
use crate::replay::drive::{Observed, RunOut, Trace};
use crate::replay::{observe_for, ObserveOpts};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use u3m_core::shm::layout::{EventKind, EVENT_CAPACITY};
use u3m_core::shm::EventCursor;
use u3m_core::trace::Body;

#[derive(clap::Args, Debug)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["pid", "trace"]))]
pub struct SnapshotArgs {
    /// A live u3m process: allocations and frees from its stats segment's event ring.
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pid: Option<u32>,
    /// A recorded trace (U3M_TRACE), replayed through the engine for residency.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Where to write the pickle.
    #[arg(short = 'o', long = "output", value_name = "OUT.pickle")]
    pub output: PathBuf,
    /// Physical HBM per device for the replay [default: unlimited: nothing is evicted].
    #[arg(long, value_name = "BYTES", requires = "trace")]
    pub hbm: Option<String>,
    /// DRAM tier for the replay [default: unlimited].
    #[arg(long, value_name = "BYTES", requires = "trace")]
    pub dram: Option<String>,
    /// Placement policy for the replay (seed-heat, lru, markov, predictive, belady).
    #[arg(
        long,
        value_name = "P",
        default_value = "predictive",
        requires = "trace"
    )]
    pub policy: String,
    /// Directory of the stats segments (with -p) [default: $U3M_SHM_DIR or /dev/shm].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// One entry of a device trace.
struct Entry {
    action: &'static str,
    addr: u64,
    size: u64,
    t_ns: u64,
    frame: Option<(String, String, u64)>,
}

impl Entry {
    fn py(&self) -> Py {
        let frames = match &self.frame {
            Some((name, file, line)) => vec![Py::dict(vec![
                ("filename", Py::str(file.clone())),
                ("line", Py::int(*line)),
                ("name", Py::str(name.clone())),
            ])],
            None => Vec::new(),
        };
        Py::dict(vec![
            ("action", Py::str(self.action)),
            ("addr", Py::int(self.addr)),
            ("size", Py::int(self.size)),
            ("stream", Py::int(0)),
            ("time_us", Py::int(self.t_ns / 1000)),
            ("frames", Py::List(frames)),
        ])
    }
}

/// A device allocation live at the end.
struct Live {
    dev: u32,
    addr: u64,
    bytes: u64,
    frame: Option<(String, String, u64)>,
}

/// Counts of what a snapshot holds, for the summary line and tests.
#[derive(Default, Debug)]
pub struct Counts {
    pub by_action: BTreeMap<&'static str, u64>,
    pub segments: usize,
}

/// The snapshot dict: `segments` and `device_traces`.
fn build(devices: usize, traces: Vec<Vec<Entry>>, live: Vec<Live>) -> (Py, Counts) {
    let mut c = Counts::default();
    let mut dev_traces = Vec::with_capacity(devices);
    for t in traces {
        for e in &t {
            *c.by_action.entry(e.action).or_insert(0) += 1;
        }
        dev_traces.push(Py::List(t.iter().map(Entry::py).collect()));
    }
    c.segments = live.len();
    let segments = live
        .into_iter()
        .map(|l| {
            let frames = Py::List(
                l.frame
                    .map(|(name, file, line)| {
                        vec![Py::dict(vec![
                            ("filename", Py::str(file)),
                            ("line", Py::int(line)),
                            ("name", Py::str(name)),
                        ])]
                    })
                    .unwrap_or_default(),
            );
            Py::dict(vec![
                ("device", Py::int(l.dev)),
                ("address", Py::int(l.addr)),
                ("total_size", Py::int(l.bytes)),
                ("allocated_size", Py::int(l.bytes)),
                ("active_size", Py::int(l.bytes)),
                ("requested_size", Py::int(l.bytes)),
                ("stream", Py::int(0)),
                (
                    "segment_type",
                    Py::str(if l.bytes >= 1 << 20 { "large" } else { "small" }),
                ),
                ("segment_pool_id", Py::Tuple(vec![Py::int(0), Py::int(0)])),
                ("is_expandable", Py::Bool(false)),
                (
                    "blocks",
                    Py::List(vec![Py::dict(vec![
                        ("address", Py::int(l.addr)),
                        ("size", Py::int(l.bytes)),
                        ("requested_size", Py::int(l.bytes)),
                        ("state", Py::str("active_allocated")),
                        ("frames", frames.clone()),
                    ])]),
                ),
                ("frames", frames),
            ])
        })
        .collect();
    (
        Py::dict(vec![
            ("segments", Py::List(segments)),
            ("device_traces", Py::List(dev_traces)),
        ]),
        c,
    )
}

/// The snapshot of a replayed trace.
pub fn from_replay(trace: &Trace, out: &RunOut) -> (Py, Counts) {
    let empty = Observed::default();
    let o = out.observed.as_ref().unwrap_or(&empty);
    let mut traces: Vec<Vec<Entry>> = (0..trace.devices).map(|_| Vec::new()).collect();
    // trace address -> (bytes, frame) of the live allocations per device
    let mut live: Vec<BTreeMap<u64, (u64, Option<(String, String, u64)>)>> =
        (0..trace.devices).map(|_| BTreeMap::new()).collect();
    let mut t_last = 0u64;
    let emit_maps = |traces: &mut Vec<Vec<Entry>>, from: usize, to: usize, t_last: &mut u64| {
        for m in &o.maps[from.min(o.maps.len())..to.min(o.maps.len())] {
            // VA -> the trace allocation it belongs to
            let Some((&va0, &(dev, addr, bytes))) = o.origin.range(..=m.va).next_back() else {
                continue;
            };
            if m.va >= va0 + bytes.max(1) || dev as usize >= traces.len() {
                continue;
            }
            let off = m.va - va0;
            *t_last = (*t_last).max(m.t_ns);
            traces[dev as usize].push(Entry {
                action: if m.map {
                    "segment_map"
                } else {
                    "segment_unmap"
                },
                addr: addr + off,
                size: m.bytes.min(bytes - off),
                t_ns: *t_last,
                frame: None,
            });
        }
    };
    for (k, ev) in trace.events.iter().enumerate() {
        if k > 0 {
            let (a, b) = (o.map_mark.get(k - 1), o.map_mark.get(k));
            if let (Some(&a), Some(&b)) = (a, b) {
                emit_maps(&mut traces, a, b, &mut t_last);
            }
        }
        let t = o.event_ns.get(k).copied().unwrap_or(t_last).max(t_last);
        t_last = t;
        let d = ev.dev as usize;
        let line = trace.lines.get(k).copied().unwrap_or(0);
        match &ev.body {
            Body::Alloc { addr, bytes } => {
                let frame = Some((
                    ev.tag.clone().unwrap_or_else(|| "aclrtMalloc".into()),
                    trace.name.clone(),
                    line,
                ));
                for action in ["segment_alloc", "alloc"] {
                    traces[d].push(Entry {
                        action,
                        addr: *addr,
                        size: *bytes,
                        t_ns: t,
                        frame: frame.clone(),
                    });
                }
                live[d].insert(*addr, (*bytes, frame));
            }
            Body::Free { addr } => {
                let (bytes, frame) = live[d].remove(addr).unwrap_or((0, None));
                for action in ["free_requested", "free_completed", "segment_free"] {
                    traces[d].push(Entry {
                        action,
                        addr: *addr,
                        size: bytes,
                        t_ns: t,
                        frame: frame.clone(),
                    });
                }
            }
            _ => {}
        }
    }
    if let Some(&a) = o.map_mark.last() {
        emit_maps(&mut traces, a, usize::MAX, &mut t_last);
    }
    let live = live
        .into_iter()
        .enumerate()
        .flat_map(|(dev, m)| {
            m.into_iter().map(move |(addr, (bytes, frame))| Live {
                dev: dev as u32,
                addr,
                bytes,
                frame,
            })
        })
        .collect();
    build(trace.devices, traces, live)
}

/// The snapshot of a live process: its ring's allocations and frees.
fn from_live(a: &SnapshotArgs, pid: u32) -> Result<(Py, Counts, u64), CliError> {
    let dir = a.dir.clone().unwrap_or_else(u3m_core::shm::default_dir);
    let found = crate::collect::scan_once(dir, Some(pid))?;
    let r = &found[0].reader;
    let snap = r.snapshot();
    let mut cur = EventCursor::from(snap.event_head.saturating_sub(EVENT_CAPACITY as u64));
    let tail = r.tail(&mut cur, EVENT_CAPACITY);
    let devices = tail
        .events
        .iter()
        .filter_map(|e| e.device)
        .chain(snap.devices.iter().map(|d| d.index as u16))
        .map(|d| d as usize + 1)
        .max()
        .unwrap_or(1);
    let mut traces: Vec<Vec<Entry>> = (0..devices).map(|_| Vec::new()).collect();
    let mut live: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for e in &tail.events {
        let Some(d) = e.device else { continue };
        let t = e.time_ns.saturating_sub(snap.start_mono_ns);
        let actions: &[&'static str] = match e.kind() {
            Some(EventKind::Alloc) => {
                live.insert((d as u32, e.addr), e.len);
                &["segment_alloc", "alloc"]
            }
            Some(EventKind::Free) => {
                live.remove(&(d as u32, e.addr));
                &["free_requested", "free_completed", "segment_free"]
            }
            _ => continue,
        };
        for &action in actions {
            traces[d as usize].push(Entry {
                action,
                addr: e.addr,
                size: e.len,
                t_ns: t,
                frame: None,
            });
        }
    }
    let live = live
        .into_iter()
        .map(|((dev, addr), bytes)| Live {
            dev,
            addr,
            bytes,
            frame: None,
        })
        .collect();
    let (py, c) = build(devices, traces, live);
    Ok((py, c, tail.lost))
}

pub fn main(a: &SnapshotArgs) -> Result<ExitCode, CliError> {
    let (py, counts, note) = if let Some(pid) = a.pid {
        let (py, c, lost) = from_live(a, pid)?;
        let note = format!(
            "live process {pid}: allocations and frees from the stats segment's event ring{}; no segment_map/segment_unmap (the library counts evictions and fault-ins, it does not list them: record a trace with U3M_TRACE and use --trace)",
            if lost > 0 { format!(" ({lost} older events already overwritten: allocations made before them are missing)") } else { String::new() }
        );
        (py, c, note)
    } else {
        let path = a.trace.clone().expect("clap: --trace or -p");
        let opts = ObserveOpts {
            trace: &path,
            hbm: a.hbm.as_deref(),
            dram: a.dram.as_deref(),
            nvme: None,
            policy: &a.policy,
        };
        let o = match observe_for("snapshot", &opts)? {
            Ok(o) => o,
            Err(code) => return Ok(code),
        };
        let (py, c) = from_replay(&o.trace, &o.out);
        let note = format!(
            "{}: replayed with policy {} (times are simulated)",
            o.trace.name, o.policy
        );
        (py, c, note)
    };
    std::fs::write(&a.output, dumps(&py)).map_err(|err| CliError::Io {
        what: "writing the snapshot",
        err,
    })?;
    let acts: Vec<String> = counts
        .by_action
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    eprintln!(
        "u3m snapshot: wrote {}: {} segments live at the end; trace entries: {}\nu3m snapshot: {note}",
        a.output.display(),
        counts.segments,
        if acts.is_empty() { "none".into() } else { acts.join(", ") }
    );
    Ok(ExitCode::SUCCESS)
}
