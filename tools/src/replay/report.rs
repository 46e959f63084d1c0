//! The report: one description of each figure drives both the table and
//! the JSON (docs/replay.md lists them).

use serde_json::{json, Value};
use std::fmt::Write;

use u3m_core::engine::runtime::CHUNK;

use super::accuracy::Window;
use super::drive::{RunOut, Setup, Trace};
use super::floor::{Floor, Window as FloorWindow};
use super::simrt::{WaitFor, Waits};
use crate::human::bytes;
use crate::table::columns;

/// One policy's figures on one trace.
pub struct PolicyRow {
    pub policy: String,
    pub fault_in_dram: u64,
    pub fault_in_nvme: u64,
    pub writeback_dram: u64,
    pub writeback_nvme: u64,
    pub spill: u64,
    /// Bytes the background prefetch copied in ahead of use (from DRAM).
    pub prefetch: u64,
    pub clean_drops: u64,
    pub faults: u64,
    pub evictions: u64,
    /// Of the evictions, those a `--plan` schedule named (planned.rs).
    pub planned_outs: u64,
    /// `--handoff on`: evictions ordered after the chunk's uses on the
    /// device, and copy-ins given a copy-out's HBM still in flight.
    pub ordered_outs: u64,
    pub handoffs: u64,
    /// `--schedule`: entries followed, and 1 once one the run did not
    /// match stopped it (U3M_PLAN's counters).
    pub schedule_entries: u64,
    pub schedule_stops: u64,
    pub overwrites: u64,
    /// Chunks host-mapped for calls larger than HBM, bytes copied into their
    /// host handles, host-mapped chunks brought back into HBM.
    pub host_maps: u64,
    pub host_map_bytes: u64,
    pub host_unmaps: u64,
    /// U3M_HOST_MAP=probe or stream: chunks mapped instead of copied, reads in place.
    pub stream_maps: u64,
    pub stream_reads: u64,
    /// U3M_HOST_MAP=auto's read-once probe: verdicts, of which mapping.
    pub probe_verdicts: u64,
    pub probe_maps: u64,
    pub total_ns: u64,
    pub stall_ns: u64,
    pub peak_hbm: u64,
    pub misuse: u64,
    pub sim: super::simrt::SimCounters,
    pub samples: u64,
    pub windows: Vec<Window>,
    pub events: Vec<(f64, String)>,
    pub arrivals_by_tag: std::collections::BTreeMap<String, u64>,
    pub copies_by_tag: std::collections::BTreeMap<String, [u64; 2]>,
    pub long_waits: Vec<super::simrt::LongWait>,
    pub held: Vec<super::held::Held>,
    pub audit: Vec<super::audit::Phase>,
}

impl PolicyRow {
    pub fn new(policy: &str, o: &RunOut, baseline_ns: u64) -> PolicyRow {
        let t = &o.tier;
        let from_nvme = t.from_nvme * CHUNK;
        PolicyRow {
            policy: policy.to_string(),
            fault_in_dram: t.fault_bytes.saturating_sub(from_nvme),
            fault_in_nvme: from_nvme,
            writeback_dram: t.to_dram * CHUNK,
            writeback_nvme: t.to_nvme.saturating_sub(o.spilled) * CHUNK,
            spill: o.spilled * CHUNK,
            prefetch: t.prefetch_bytes,
            clean_drops: t.clean_drops,
            faults: t.faults_in,
            evictions: t.evictions,
            planned_outs: t.planned_outs,
            ordered_outs: t.ordered_outs,
            handoffs: t.handoffs,
            schedule_entries: t.schedule_entries,
            schedule_stops: t.schedule_stops,
            overwrites: t.overwrites,
            host_maps: t.host_maps,
            host_map_bytes: t.host_map_bytes,
            host_unmaps: t.host_unmaps,
            stream_maps: t.stream_maps,
            stream_reads: t.stream_reads,
            probe_verdicts: t.probe_verdicts,
            probe_maps: t.probe_maps,
            total_ns: o.total_ns,
            stall_ns: o.total_ns.saturating_sub(baseline_ns),
            peak_hbm: o.peak_hbm,
            misuse: o.sim.misuse,
            sim: o.sim,
            samples: o.accuracy.as_ref().map(|a| a.samples).unwrap_or(0),
            windows: o
                .accuracy
                .as_ref()
                .map(|a| a.windows.clone())
                .unwrap_or_default(),
            events: o.events.clone(),
            arrivals_by_tag: o.arrivals_by_tag.clone(),
            copies_by_tag: o.copies_by_tag.clone(),
            long_waits: o.long_waits.clone(),
            held: o.held.clone(),
            audit: o.audit.clone(),
        }
    }

    pub fn fault_in(&self) -> u64 {
        self.fault_in_dram + self.fault_in_nvme
    }

    pub fn written_back(&self) -> u64 {
        self.writeback_dram + self.writeback_nvme
    }

    /// Bytes over the link for this policy: copied in (on demand and by
    /// prefetch) plus copied out.
    pub fn moved(&self) -> u64 {
        self.fault_in() + self.prefetch + self.written_back()
    }
}

pub struct TraceReport {
    pub trace: String,
    pub events: usize,
    pub ticks: u64,
    pub accesses: usize,
    pub footprint: u64,
    pub baseline_ns: u64,
    pub rows: Vec<PolicyRow>,
    pub unavailable: Vec<(String, String)>,
    /// `--floor`: the window floor.
    pub floor: Option<FloorReport>,
}

/// The window floor of a trace (`--floor`): the whole trace and step spans.
pub struct FloorReport {
    pub whole: Floor,
    pub steps: Vec<StepFloor>,
}

/// The floor of the events of steps `first..=last` (`span`: trace indices).
pub struct StepFloor {
    pub first: u64,
    pub last: u64,
    pub span: std::ops::Range<usize>,
    pub floor: Floor,
}

impl TraceReport {
    pub fn new(
        trace: &Trace,
        base: &RunOut,
        rows: Vec<PolicyRow>,
        unavailable: Vec<(String, String)>,
    ) -> TraceReport {
        TraceReport {
            trace: trace.name.clone(),
            events: trace.events.len(),
            ticks: base.ticks,
            accesses: base.log.len(),
            footprint: base.peak_hbm,
            baseline_ns: base.total_ns,
            rows,
            unavailable,
            floor: None,
        }
    }

    fn belady_moved(&self) -> Option<u64> {
        self.rows
            .iter()
            .find(|r| r.policy == "belady")
            .map(|r| r.moved())
    }
}

fn waits_json(w: &Waits) -> Value {
    json!({"count": w.count, "ns": w.ns})
}

fn ms(ns: u64) -> String {
    format!("{:.3}ms", ns as f64 / 1e6)
}

fn frac(v: Option<f64>) -> String {
    v.map(|x| format!("{:.2}", x)).unwrap_or_else(|| "-".into())
}

fn ratio(a: u64, b: Option<u64>) -> Option<f64> {
    match b {
        Some(0) if a == 0 => Some(1.0),
        Some(0) | None => None,
        Some(b) => Some(a as f64 / b as f64),
    }
}

pub fn text(s: &Setup, hbm: u64, reports: &[TraceReport], show_events: bool) -> String {
    let mut out = String::new();
    for r in reports {
        let _ = writeln!(
            out,
            "{}: {} events, {} tracked calls, peak footprint {} vs HBM {}; unlimited-HBM time {}",
            r.trace,
            r.events,
            r.ticks,
            bytes(r.footprint),
            bytes(hbm),
            ms(r.baseline_ns)
        );
        let mut head: Vec<String> = [
            "policy",
            "in<-DRAM",
            "in<-NVMe",
            "prefetch",
            "out->DRAM",
            "out->NVMe",
            "clean",
            "stall",
            "total",
            "x belady",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for w in &s.windows {
            head.push(format!("P/R@{w}"));
        }
        let mut rows = vec![head];
        let bm = r.belady_moved();
        for p in &r.rows {
            let mut row = vec![
                p.policy.clone(),
                bytes(p.fault_in_dram),
                bytes(p.fault_in_nvme),
                bytes(p.prefetch),
                bytes(p.writeback_dram),
                bytes(p.writeback_nvme),
                p.clean_drops.to_string(),
                ms(p.stall_ns),
                ms(p.total_ns),
                ratio(p.moved(), bm)
                    .map(|x| format!("{x:.2}"))
                    .unwrap_or_else(|| "-".into()),
            ];
            for w in &p.windows {
                row.push(format!("{}/{}", frac(w.precision()), frac(w.recall())));
            }
            rows.push(row);
        }
        out.push_str(&columns(&rows, "  "));
        for (p, why) in &r.unavailable {
            let _ = writeln!(out, "  {p}: unavailable: {why}");
        }
        // calls larger than HBM ran with part of their memory host-mapped
        for p in r.rows.iter().filter(|p| p.host_maps > 0) {
            let _ = writeln!(
                out,
                "  {}: host-mapped {} chunks ({} copied into host handles; device access over the link {} read, {} written), {} back into HBM; read-once streams: {} chunks mapped instead of copied, {} reads in place; read-once probe: {} verdicts, {} for mapping",
                p.policy,
                p.host_maps,
                bytes(p.host_map_bytes),
                bytes(p.sim.host_read_bytes),
                bytes(p.sim.host_write_bytes),
                p.host_unmaps,
                p.stream_maps,
                p.stream_reads,
                p.probe_verdicts,
                p.probe_maps
            );
        }
        let misuse: u64 = r.rows.iter().map(|p| p.misuse).sum();
        if misuse > 0 {
            let _ = writeln!(out, "  warning: the engine misused the runtime {misuse} times (double map, unmap of nothing, ...)");
        }
        if let Some(f) = &r.floor {
            floor_text(&mut out, f, s.costs.shared_link);
        }
        if show_events {
            for p in &r.rows {
                for (t, line) in &p.events {
                    let _ = writeln!(out, "  {} @{t:.3}s: {line}", p.policy);
                }
            }
        }
        out.push('\n');
    }
    out.push_str(
        "in<-: bytes copied into HBM on demand from each tier; prefetch: copied in ahead of use; out->: bytes written back on eviction (clean: chunks dropped without a copy); \
stall: total - unlimited-HBM time; x belady: bytes moved / belady's; P/R@W: byte-weighted prediction precision/recall for the next W tracked calls\n",
    );
    out
}

/// How many link-bound windows a floor line names.
const NAMED_WINDOWS: usize = 6;

fn floor_line(f: &Floor) -> String {
    let bound: Vec<&FloorWindow> = f
        .windows
        .iter()
        .filter(|w| w.link_ns > w.compute_ns)
        .collect();
    let mut s = format!(
        "{} (compute {}) over {} windows{}",
        ms(f.ns),
        ms(f.compute_ns),
        f.windows.len(),
        match (f.streams > 1, f.stride > 1) {
            (false, false) => String::new(),
            (false, true) => format!(" (a boundary every {} events)", f.stride),
            (true, false) => format!(" ({} streams: cut only at synchronous calls)", f.streams),
            (true, true) => format!(
                " ({} streams: cut only at synchronous calls, one in {})",
                f.streams, f.stride
            ),
        }
    );
    if bound.is_empty() {
        s.push_str("; no window is link-bound");
        return s;
    }
    let _ = write!(s, "; the link-bound windows ({}):", bound.len());
    for w in bound.iter().take(NAMED_WINDOWS) {
        let _ = write!(
            s,
            " [{},{}) {} vs compute {} (in {}, out {});",
            w.start,
            w.end,
            ms(w.link_ns),
            ms(w.compute_ns),
            bytes(w.u_bytes),
            bytes(w.d_bytes)
        );
    }
    if bound.len() > NAMED_WINDOWS {
        let _ = write!(s, " and {} more", bound.len() - NAMED_WINDOWS);
    } else {
        s.pop();
    }
    s
}

fn floor_text(out: &mut String, f: &FloorReport, shared_link: bool) {
    if !shared_link {
        let _ = writeln!(out, "  note: --link-model per-stream gives every stream the whole link; the window floor assumes one shared link and is not a lower bound here");
    }
    let dev = if f.whole.device > 0 {
        format!(" (device {}, the largest)", f.whole.device)
    } else {
        String::new()
    };
    let _ = writeln!(out, "  window floor{dev}: {}", floor_line(&f.whole));
    for st in &f.steps {
        let (which, per) = if st.first == st.last {
            (format!("step {}", st.first), String::new())
        } else {
            (
                format!("steps {}-{}", st.first, st.last),
                format!("; {} per step", ms(st.floor.ns / (st.last - st.first + 1))),
            )
        };
        let _ = writeln!(
            out,
            "  window floor of {which} (events {}..{}{per}): {}",
            st.span.start,
            st.span.end,
            floor_line(&st.floor)
        );
    }
}

fn floor_json(f: &Floor) -> Value {
    json!({
        "ns": f.ns,
        "compute_ns": f.compute_ns,
        "stride": f.stride,
        "device": f.device,
        "streams": f.streams,
        "windows": f.windows.iter().map(|w| json!({
            "start": w.start, "end": w.end, "compute_ns": w.compute_ns, "link_ns": w.link_ns,
            "u_bytes": w.u_bytes, "d_bytes": w.d_bytes,
        })).collect::<Vec<_>>(),
    })
}

pub fn json(s: &Setup, hbm: u64, reports: &[TraceReport]) -> String {
    let traces: Vec<Value> = reports
        .iter()
        .map(|r| {
            let bm = r.belady_moved();
            let floor = r.floor.as_ref().map(|f| {
                let mut v = floor_json(&f.whole);
                v["steps"] = f
                    .steps
                    .iter()
                    .map(|st| {
                        let mut x = floor_json(&st.floor);
                        x["step"] = json!(st.first);
                        x["last_step"] = json!(st.last);
                        x["start"] = json!(st.span.start);
                        x["end"] = json!(st.span.end);
                        x
                    })
                    .collect();
                v
            });
            let rows: Vec<Value> = r
                .rows
                .iter()
                .map(|p| {
                    let mut row = json!({
                        "policy": p.policy,
                        "fault_in_bytes": {"dram": p.fault_in_dram, "nvme": p.fault_in_nvme, "total": p.fault_in()},
                        "writeback_bytes": {"dram": p.writeback_dram, "nvme": p.writeback_nvme, "total": p.written_back()},
                        "prefetch_bytes": p.prefetch,
                        "spill_bytes": p.spill,
                        "moved_bytes": p.moved(),
                        "moved_vs_belady": ratio(p.moved(), bm),
                        "clean_drops": p.clean_drops,
                        "faults_in": p.faults,
                        "evictions": p.evictions,
                        "planned_outs": p.planned_outs,
                        "overwrites": p.overwrites,
                        "host_map": {"maps": p.host_maps, "map_bytes": p.host_map_bytes, "unmaps": p.host_unmaps, "stream_maps": p.stream_maps, "stream_reads": p.stream_reads, "probe_verdicts": p.probe_verdicts, "probe_maps": p.probe_maps},
                        "total_ns": p.total_ns,
                        "stall_ns": p.stall_ns,
                        "peak_hbm_bytes": p.peak_hbm,
                        "runtime_misuse": p.misuse,
                        "runtime": {
                            "h2d_bytes": p.sim.h2d_bytes, "d2h_bytes": p.sim.d2h_bytes,
                            "nvme_read_bytes": p.sim.nvme_read_bytes, "nvme_write_bytes": p.sim.nvme_write_bytes,
                            "link_busy_ns": p.sim.link_ns, "nvme_busy_ns": p.sim.nvme_ns,
                            "link_h2d_busy_ns": p.sim.link_in_busy_ns, "link_d2h_busy_ns": p.sim.link_out_busy_ns,
                            "program_h2d_bytes": p.sim.program_h2d_bytes, "program_d2h_bytes": p.sim.program_d2h_bytes,
                            "host_mapped_read_bytes": p.sim.host_read_bytes, "host_mapped_write_bytes": p.sim.host_write_bytes,
                            "host_phys_peak_bytes": p.sim.host_phys_peak,
                            "host_waits": ([WaitFor::Queue, WaitFor::Program, WaitFor::CopyIn, WaitFor::CopyOut]
                                .iter()
                                .map(|&w| (w.name().to_string(), waits_json(&p.sim.waits[w as usize])))
                                .collect::<serde_json::Map<_, _>>()),
                        },
                        "samples": p.samples,
                        "prediction": p.windows.iter().map(|w| json!({
                            "window": w.w, "predicted_bytes": w.predicted, "accessed_bytes": w.accessed, "hit_bytes": w.hit,
                            "precision": w.precision(), "recall": w.recall(),
                        })).collect::<Vec<_>>(),
                        "arrivals_by_tag": p.arrivals_by_tag,
                        "copies_by_tag": p.copies_by_tag.iter()
                            .map(|(t, [i, o])| (t.clone(), json!({"in": i, "out": o})))
                            .collect::<serde_json::Map<_, _>>(),
                        "events": p.events.iter().map(|(t, l)| json!({"secs": t, "event": l})).collect::<Vec<_>>(),
                        "long_waits": p.long_waits.iter().map(|w| json!({
                            "line": w.line, "at_ns": w.at, "ns": w.ns, "for": w.what.name(),
                        })).collect::<Vec<_>>(),
                        "held": p.held.iter().map(|h| json!({
                            "line": h.line, "label": h.label, "host_ns": h.host_ns,
                            "resident_bytes": h.resident(),
                            "by_tag": h.by_tag.iter().map(|(t, b)| (t.clone(), json!({
                                "live_clean": b[0], "live_dirty": b[1], "dead_clean": b[2], "dead_dirty": b[3],
                                "dead_foreseen": b[4], "live_taken_for_dead": b[5],
                            }))).collect::<serde_json::Map<_, _>>(),
                        })).collect::<Vec<_>>(),
                        "audit": p.audit.iter().map(|a| json!({
                            "line": a.line, "label": a.label, "from_tick": a.from, "to_tick": a.to,
                            "by_tag": a.by_tag.iter().map(|(t, m)| (t.clone(), json!({
                                "in_demand": m.in_demand, "in_prefetch": m.in_prefetch,
                                "out": m.out, "out_dirty": m.out_dirty,
                                "back": m.back, "back_in_phase": m.back_in_phase,
                                "back_in_phase_foreseen": m.back_in_phase_foreseen,
                                "back_in_phase_taken_for_dead": m.back_in_phase_taken_for_dead,
                            }))).collect::<serde_json::Map<_, _>>(),
                        })).collect::<Vec<_>>(),
                    });
                    // (outside the macro: its recursion limit)
                    row["ordered_outs"] = json!(p.ordered_outs);
                    row["handoffs"] = json!(p.handoffs);
                    row["schedule_entries"] = json!(p.schedule_entries);
                    row["schedule_stops"] = json!(p.schedule_stops);
                    row
                })
                .collect();
            let mut t = json!({
                "trace": r.trace,
                "events": r.events,
                "ticks": r.ticks,
                "accesses": r.accesses,
                "footprint_bytes": r.footprint,
                "baseline_ns": r.baseline_ns,
                "policies": rows,
                "unavailable": r.unavailable.iter().map(|(p, why)| json!({"policy": p, "reason": why})).collect::<Vec<_>>(),
            });
            if let Some(f) = floor {
                t["floor"] = f;
            }
            t
        })
        .collect();
    let c = &s.costs;
    let v = json!({
        "schema": 1,
        "hbm_bytes": hbm,
        "dram_bytes": s.dram,
        "nvme_bytes": s.nvme,
        "min_bytes": s.min_bytes,
        "costs": {"link_gbps": c.link_gbps, "hbm_gbps": c.hbm_gbps, "tflops": c.tflops, "launch_us": c.launch_us,
                  "nvme_read_gbps": c.nvme_read_gbps, "nvme_write_gbps": c.nvme_write_gbps, "pageable": c.pageable,
                  "link_model": if c.shared_link { "shared" } else { "per-stream" },
                  "event_model": match (c.events_at_record, c.handover) { (false, _) => "device", (true, 0) => "simulator", (true, 1) => "handover", _ => "handover-free" }, "call_us": c.call_us},
        "tick_ns": s.tick_ns,
        "watermarks": [s.hbm_low, s.hbm_high],
        "queue": s.queue,
        "issue": if s.acl_replay { "acl-replay" } else { "recorded" },
        "sample_every": s.sample_every,
        "windows": s.windows,
        "traces": traces,
    });
    let mut out = serde_json::to_string_pretty(&v).unwrap_or_default();
    out.push('\n');
    out
}
