//! The window floor (docs/replay.md, "The window floor"): a lower bound on
//! the simulated time of any schedule of a trace's calls on a device with
//! `hbm` bytes of HBM and a full-duplex link of `link_gbps`, given the cost
//! model's per-call device times.
//!
//! The calls are cut into consecutive windows; the windows' device spans are
//! disjoint, so the time is at least the sum of the spans. A window's span is
//! at least its busiest stream's work C, and at least (U − H)⁺ / B and
//! (D − H)⁺ / B, where U is the bytes holding data at its start that it reads
//! before overwriting them and D the bytes it writes whose next access after
//! it is a read. The floor is the best sum over partitions (a DP over the
//! window boundaries); any subset of boundaries still gives a valid bound,
//! so long spans use every `stride`-th event as a candidate boundary.
//!
//! One sweep over the events computes U and D for every candidate window
//! start at once: both are kept as difference arrays over the window start
//! (bucketed by candidate), so the work is O(accesses + candidates²).

use std::collections::HashMap;
use std::ops::Range;

use u3m_core::trace::{Body, CopyKind};

use super::access::{self, R, W};
use super::cost::Costs;
use super::drive::Trace;

/// The most candidate boundaries a span gets before the stride grows
/// (the DP is quadratic in them: 12,000 is about 72 M window pairs).
pub const MAX_CANDIDATES: usize = 12_000;

/// One window of the DP's chosen partition: events `start..end` (trace
/// indices), its busiest stream's work, its link time and the bytes that
/// gave it (U: needed in, D: needed out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub start: usize,
    pub end: usize,
    pub compute_ns: u64,
    pub link_ns: u64,
    pub u_bytes: u64,
    pub d_bytes: u64,
}

/// The floor of a span of a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Floor {
    /// The lower bound on the span's simulated time.
    pub ns: u64,
    /// The same bound with unlimited HBM (no link term): the best sum of
    /// per-window busiest-stream work (one stream: the sum of its calls).
    pub compute_ns: u64,
    /// The DP's partition (the whole span, in order).
    pub windows: Vec<Window>,
    /// Every `stride`-th event (and the span's step marks) was a candidate
    /// boundary; 1: every event.
    pub stride: usize,
    /// The device whose floor this is (the largest of the trace's devices').
    pub device: u32,
    /// Its streams: with more than one, only synchronous calls cut windows.
    pub streams: usize,
}

/// Access flags: `access::R`, `access::W`, and C: an `A` or `F` (afterwards
/// the bytes hold no data).
const C: u8 = 4;
const NONE: u32 = u32::MAX;

/// One device's events, cut into elementary intervals.
struct Dev {
    dev: u32,
    /// Trace index of each of the device's events.
    global: Vec<usize>,
    /// Dense stream index and device duration of each event.
    stream: Vec<u32>,
    dur: Vec<u64>,
    streams: usize,
    /// Per position 0..=n: every call before it ends before any call from
    /// it on starts (with one stream, every position).
    barrier: Vec<bool>,
    /// Bytes of each elementary interval.
    size: Vec<u64>,
    /// Per interval, its accesses (event, flags) in event order: CSR.
    x_start: Vec<u32>,
    acc_f: Vec<u8>,
    /// Per event, the (interval, index into acc_*) it touches: CSR.
    t_start: Vec<u32>,
    t_acc: Vec<(u32, u32)>,
}

/// A trace prepared for floors of any span (intervals and durations are
/// computed once).
pub struct Prepared {
    devs: Vec<Dev>,
    link_gbps: f64,
}

/// The floor of `span` (trace event indices) with `hbm` bytes per device;
/// the stride is chosen so that at most `MAX_CANDIDATES` boundaries remain.
#[cfg_attr(not(test), allow(dead_code))]
pub fn window_floor(trace: &Trace, hbm: u64, costs: &Costs, span: Range<usize>) -> Floor {
    Prepared::new(trace, costs, false).floor(hbm, span, None, &[])
}

impl Prepared {
    /// `acl_replay`: the trace is issued as `--issue acl-replay` (no
    /// synchronous calls: with several streams, no barriers inside).
    pub fn new(trace: &Trace, costs: &Costs, acl_replay: bool) -> Prepared {
        let mut per_dev: Vec<Vec<usize>> = Vec::new();
        for (i, ev) in trace.events.iter().enumerate() {
            let d = ev.dev as usize;
            if per_dev.len() <= d {
                per_dev.resize_with(d + 1, Vec::new);
            }
            per_dev[d].push(i);
        }
        let devs = per_dev
            .into_iter()
            .enumerate()
            .filter(|(_, g)| !g.is_empty())
            .map(|(d, g)| Dev::new(trace, costs, acl_replay, d as u32, g))
            .collect();
        Prepared {
            devs,
            link_gbps: costs.link_gbps,
        }
    }

    /// The floor of `span`: every device's, the largest (its `device` says
    /// which). `stride`: None picks the least that keeps the candidates
    /// under `MAX_CANDIDATES`; `marks` (trace indices) are always
    /// candidates.
    pub fn floor(
        &self,
        hbm: u64,
        span: Range<usize>,
        stride: Option<usize>,
        marks: &[usize],
    ) -> Floor {
        let mut best: Option<Floor> = None;
        for d in &self.devs {
            let f = d.floor(hbm, self.link_gbps, &span, stride, marks);
            if best.as_ref().map_or(true, |b| f.ns > b.ns) {
                best = Some(f);
            }
        }
        best.unwrap_or(Floor {
            stride: 1,
            streams: 1,
            ..Floor::default()
        })
    }
}

/// Device time of one call per the cost model (launch included), and its
/// accesses: (addr, bytes, flags).
fn call(
    ev: &u3m_core::trace::Event,
    costs: &Costs,
    sizes: &mut HashMap<u64, u64>,
) -> (u64, Vec<(u64, u64, u8)>) {
    match &ev.body {
        Body::Alloc { addr, bytes } => {
            sizes.insert(*addr, *bytes);
            (0, vec![(*addr, *bytes, C)])
        }
        Body::Free { addr } => {
            let bytes = sizes.remove(addr).unwrap_or(0);
            (0, vec![(*addr, bytes, C)])
        }
        body => {
            let a = access::ranges(body);
            let ns = match body {
                Body::Op { .. } => costs.op_ns(ev.flops.unwrap_or(0), a.iter().map(|r| r.1).sum()),
                Body::Copy {
                    kind: CopyKind::H2D | CopyKind::D2H,
                    bytes,
                    ..
                } => costs.link_ns(*bytes),
                Body::Copy {
                    kind: CopyKind::D2D,
                    bytes,
                    ..
                } => costs.d2d_ns(*bytes),
                Body::Set { bytes, .. } => costs.memset_ns(*bytes),
                _ => 0,
            };
            (ns, a)
        }
    }
}

impl Dev {
    fn new(trace: &Trace, costs: &Costs, acl_replay: bool, dev: u32, global: Vec<usize>) -> Dev {
        let n = global.len();
        let mut sizes = HashMap::new();
        let mut stream_ids: HashMap<u32, u32> = HashMap::new();
        let (mut stream, mut dur) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut raw: Vec<(u32, u64, u64, u8)> = Vec::new();
        let mut cuts: Vec<u64> = Vec::new();
        let mut barrier = vec![false; n + 1];
        for (t, &g) in global.iter().enumerate() {
            let ev = &trace.events[g];
            // the replay's recorded issue: a stream-0 copy or memset is
            // synchronous — the host waits for the device's streams first
            // and issues nothing more until it ends (drive.rs `call`)
            let sync = match &ev.body {
                Body::Set { .. } => true,
                Body::Copy { kind, .. } => *kind != CopyKind::H2H,
                _ => false,
            };
            if sync && ev.stream == 0 && !acl_replay {
                barrier[t] = true;
                barrier[t + 1] = true;
            }
            let k = stream_ids.len() as u32;
            stream.push(*stream_ids.entry(ev.stream).or_insert(k));
            let (d, acc) = call(ev, costs, &mut sizes);
            dur.push(d);
            for (a, b, f) in acc {
                if b == 0 {
                    continue;
                }
                let end = a.saturating_add(b);
                cuts.push(a);
                cuts.push(end);
                raw.push((t as u32, a, end, f));
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let size: Vec<u64> = cuts.windows(2).map(|w| w[1] - w[0]).collect();
        // (interval, event, flags), merged per (interval, event)
        let mut ent: Vec<(u32, u32, u8)> = Vec::new();
        for (t, a, end, f) in raw {
            let i = cuts.partition_point(|&c| c < a);
            let j = cuts.partition_point(|&c| c < end);
            for x in i..j {
                ent.push((x as u32, t, f));
            }
        }
        ent.sort_unstable_by_key(|e| (e.0, e.1));
        let mut merged: Vec<(u32, u32, u8)> = Vec::with_capacity(ent.len());
        for e in ent {
            match merged.last_mut() {
                Some(m) if m.0 == e.0 && m.1 == e.1 => m.2 |= e.2,
                _ => merged.push(e),
            }
        }
        let mut x_start = vec![0u32; size.len() + 1];
        for e in &merged {
            x_start[e.0 as usize + 1] += 1;
        }
        for i in 0..size.len() {
            x_start[i + 1] += x_start[i];
        }
        let acc_f: Vec<u8> = merged.iter().map(|e| e.2).collect();
        let mut t_start = vec![0u32; n + 1];
        for e in &merged {
            t_start[e.1 as usize + 1] += 1;
        }
        for i in 0..n {
            t_start[i + 1] += t_start[i];
        }
        let mut fill = t_start.clone();
        let mut t_acc = vec![(0u32, 0u32); merged.len()];
        for (k, e) in merged.iter().enumerate() {
            let p = &mut fill[e.1 as usize];
            t_acc[*p as usize] = (e.0, k as u32);
            *p += 1;
        }
        Dev {
            dev,
            global,
            stream,
            dur,
            streams: stream_ids.len().max(1),
            barrier: if stream_ids.len() <= 1 {
                vec![true; n + 1]
            } else {
                barrier[0] = true;
                barrier[n] = true;
                barrier
            },
            size,
            x_start,
            acc_f,
            t_start,
            t_acc,
        }
    }

    fn floor(
        &self,
        hbm: u64,
        link_gbps: f64,
        span: &Range<usize>,
        stride: Option<usize>,
        marks: &[usize],
    ) -> Floor {
        let lo = self.global.partition_point(|&g| g < span.start);
        let hi = self.global.partition_point(|&g| g < span.end);
        let to_global = |t: usize| {
            if t >= hi {
                span.end
            } else if t <= lo {
                span.start
            } else {
                self.global[t]
            }
        };
        let len = hi - lo;
        // candidate boundaries (device event indices): interior ones must be
        // barriers (the windows' spans are then disjoint), every
        // `stride`-th of them; the span's own ends always bound it
        let eligible: Vec<usize> = (lo..hi).filter(|&t| self.barrier[t]).collect();
        let stride = stride
            .unwrap_or_else(|| eligible.len().div_ceil(MAX_CANDIDATES))
            .max(1);
        let mut cand: Vec<usize> = eligible.into_iter().step_by(stride).collect();
        cand.push(lo);
        cand.push(hi);
        for &m in marks {
            let t = self.global.partition_point(|&g| g < m);
            if (lo..=hi).contains(&t) && self.barrier[t] {
                cand.push(t);
            }
        }
        cand.sort_unstable();
        cand.dedup();
        let nc = cand.len();
        // bucket of each position in lo..=hi: the last candidate at or before it
        let mut bucket = vec![0u32; len + 1];
        {
            let mut j = 0;
            for (p, b) in bucket.iter_mut().enumerate() {
                while j + 1 < nc && cand[j + 1] <= lo + p {
                    j += 1;
                }
                *b = j as u32;
            }
        }
        let s = self.streams;
        let mut pre = vec![0u64; nc * s];
        let mut run = vec![0u64; s];
        let mut bu = vec![0i64; nc];
        let mut bd = vec![0i64; nc];
        let mut best = vec![0u64; nc];
        let mut best_c = vec![0u64; nc];
        // per candidate end: (start candidate, compute, link, U, D)
        let mut arg = vec![(0usize, 0u64, 0u64, 0u64, 0u64); nc];
        // per interval: the event of its last write if it holds data (else
        // NONE), its last read, where its D term sits, its next access
        let nx = self.size.len();
        let mut lw = vec![NONE; nx];
        let mut lr = vec![NONE; nx];
        let mut contrib = vec![NONE; nx];
        let mut ptr: Vec<u32> = self.x_start[..nx].to_vec();
        let link = |bytes: i64| -> u64 {
            let over = bytes - hbm as i64;
            if over <= 0 || link_gbps <= 0.0 {
                0
            } else {
                (over as f64 / link_gbps).floor() as u64
            }
        };
        let mut jc = 0; // next candidate to reach
        for t in 0..hi {
            if t >= lo {
                while jc < nc && cand[jc] == t {
                    pre[jc * s..(jc + 1) * s].copy_from_slice(&run);
                    jc += 1;
                }
                run[self.stream[t] as usize] += self.dur[t];
            }
            for &(x, k) in &self.t_acc[self.t_start[t] as usize..self.t_start[t + 1] as usize] {
                let x = x as usize;
                let f = self.acc_f[k as usize];
                let sz = self.size[x] as i64;
                if f & R != 0 {
                    // U: windows starting in (max(last write, last read), t]
                    // read this byte before overwriting it, and it holds data
                    if lw[x] != NONE && t >= lo {
                        let from = match lr[x] {
                            NONE => lw[x],
                            r => lw[x].max(r),
                        } as usize
                            + 1;
                        bu[bucket[t - lo] as usize] += sz;
                        if from > lo {
                            bu[bucket[from - 1 - lo] as usize] -= sz;
                        }
                    }
                    lr[x] = t as u32;
                }
                if contrib[x] != NONE {
                    bd[bucket[contrib[x] as usize - lo] as usize] -= sz;
                    contrib[x] = NONE;
                }
                if f & W != 0 {
                    lw[x] = t as u32;
                }
                if f & C != 0 {
                    lw[x] = NONE;
                    lr[x] = NONE;
                }
                ptr[x] = k + 1;
                // D: windows starting at or before its last write end with
                // this byte's value needed later
                let next_read =
                    ptr[x] < self.x_start[x + 1] && self.acc_f[ptr[x] as usize] & R != 0;
                if next_read && lw[x] != NONE && lw[x] as usize >= lo {
                    contrib[x] = lw[x];
                    bd[bucket[lw[x] as usize - lo] as usize] += sz;
                }
            }
            let e = t + 1;
            if e <= lo || jc >= nc || cand[jc] != e {
                continue;
            }
            let je = jc;
            let pe = &run;
            let (mut su, mut sd) = (0i64, 0i64);
            let mut first = true;
            for j in (0..je).rev() {
                su += bu[j];
                sd += bd[j];
                let pb = &pre[j * s..(j + 1) * s];
                let c = pe.iter().zip(pb).map(|(a, b)| a - b).max().unwrap_or(0);
                // U needs the window to start at a barrier (every earlier
                // write done), D to end at one
                let l = link(match (self.barrier[cand[j]], self.barrier[cand[je]]) {
                    (true, true) => su.max(sd),
                    (true, false) => su,
                    (false, true) => sd,
                    (false, false) => 0,
                });
                let v = best[j] + c.max(l);
                if first || v >= best[je] {
                    best[je] = v;
                    arg[je] = (j, c, l, su as u64, sd as u64);
                }
                let vc = best_c[j] + c;
                if first || vc > best_c[je] {
                    best_c[je] = vc;
                }
                first = false;
            }
        }
        // the last candidate (hi) is reached after the loop
        let last = nc - 1;
        let mut windows = Vec::new();
        let mut e = last;
        while e > 0 {
            let (b, c, l, u, d) = arg[e];
            windows.push(Window {
                start: to_global(cand[b]),
                end: to_global(cand[e]),
                compute_ns: c,
                link_ns: l,
                u_bytes: u,
                d_bytes: d,
            });
            e = b;
        }
        windows.reverse();
        Floor {
            ns: best[last],
            compute_ns: best_c[last],
            windows,
            stride,
            device: self.dev,
            streams: self.streams,
        }
    }
}

/// `# train step N: PHASE` comments (`u3m synth`'s): per step, the trace
/// index of its first event and of the first event after it (the next
/// step's first, or the trace's end). Steps without events are left out.
pub fn steps(text: &str, trace: &Trace) -> Vec<(u64, Range<usize>)> {
    let mut marks: Vec<(u64, usize)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(rest) = line.strip_prefix("# train step ") else {
            continue;
        };
        let Some(n) = rest
            .split(':')
            .next()
            .and_then(|n| n.trim().parse::<u64>().ok())
        else {
            continue;
        };
        let line_no = i as u64 + 1;
        let at = trace.lines.partition_point(|&l| l < line_no);
        if marks.last().map_or(true, |m| m.0 != n) {
            marks.push((n, at));
        }
    }
    let n = trace.events.len();
    let mut out = Vec::new();
    for (k, &(step, at)) in marks.iter().enumerate() {
        let end = marks.get(k + 1).map_or(n, |m| m.1);
        if end > at {
            out.push((step, at..end));
        }
    }
    out
}

/// Every `# train step` comment's event index (the DP's extra candidates).
pub fn step_marks(text: &str, trace: &Trace) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("# train step "))
        .map(|(i, _)| trace.lines.partition_point(|&l| l < i as u64 + 1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use u3m_core::trace::{Event, Range as R8};

    const MIB: u64 = 1 << 20;
    const X: u64 = 0x1000_0000;
    const Y: u64 = 0x2000_0000;

    fn trace(events: Vec<Event>) -> Trace {
        let lines = (1..=events.len() as u64).collect();
        let devices = events.iter().map(|e| e.dev as usize + 1).max().unwrap_or(1);
        Trace {
            name: "hand".into(),
            events,
            lines,
            devices,
            frees: Default::default(),
        }
    }

    /// floor(bytes / 25 GB/s), the default link.
    fn link(bytes: u64) -> u64 {
        (bytes as f64 / 25.0).floor() as u64
    }

    fn all(t: &Trace, hbm: u64) -> Floor {
        window_floor(t, hbm, &Costs::default(), 0..t.events.len())
    }

    /// 8 MiB written by a memset, then read whole by an operator, 4 MiB of
    /// HBM: the memset's window ends with 8 MiB whose next access is a read
    /// (at least 4 MiB left over the link), the read's window starts with
    /// 8 MiB it needs (at least 4 MiB came over the link).
    #[test]
    fn a_read_of_twice_hbm_needs_half_of_it_over_the_link() {
        let c = Costs::default();
        let t = trace(vec![
            Event::alloc(X, 8 * MIB),
            Event::alloc(Y, MIB),
            Event::set(X, 8 * MIB),
            Event::op("Sum", &[R8::new(X, 8 * MIB)], &[R8::new(Y, 4096)]),
        ]);
        let memset = c.memset_ns(8 * MIB);
        let op = c.op_ns(0, 8 * MIB + 4096);
        assert_eq!((memset, op), (15_486, 15_491));
        assert_eq!(link(4 * MIB), 167_772);
        let f = all(&t, 4 * MIB);
        // in and out: both windows are link-bound
        assert_eq!(f.ns, 2 * 167_772);
        assert!(f.ns >= memset + op.max(link(4 * MIB)));
        assert_eq!(f.compute_ns, memset + op);
        let w = &f.windows;
        assert_eq!(w.len(), 2, "{w:?}");
        assert_eq!((w[1].start, w[1].end, w[1].u_bytes), (3, 4, 8 * MIB));
        assert_eq!(
            (w[0].end, w[0].d_bytes, w[0].link_ns),
            (3, 8 * MIB, 167_772)
        );
        // the read alone (the data is there before the span): U only
        let c = Costs::default();
        let r = window_floor(&t, 4 * MIB, &c, 3..4);
        assert_eq!(r.ns, 167_772);
        assert_eq!(r.windows[0].u_bytes, 8 * MIB);
        // HBM for all of it: the sum of the calls
        let big = all(&t, 9 * MIB);
        assert_eq!((big.ns, big.compute_ns), (memset + op, memset + op));
        assert!(big.windows.iter().all(|w| w.link_ns == 0));
    }

    /// 8 MiB written, a 1 ms operator elsewhere, then the 8 MiB read: the
    /// D term charges the write's window for what must leave HBM.
    #[test]
    fn dirty_bytes_needed_later_must_leave_hbm() {
        let c = Costs::default();
        let t = trace(vec![
            Event::alloc(X, 8 * MIB),
            Event::alloc(Y, MIB),
            Event::set(X, 8 * MIB),
            Event::op("Busy", &[], &[R8::new(Y, 4096)]).with_flops(280_000_000_000),
            Event::op("Sum", &[R8::new(X, 8 * MIB)], &[R8::new(Y, 4096)]),
        ]);
        let busy = c.op_ns(280_000_000_000, 4096);
        assert_eq!(busy, 1_005_000);
        let f = all(&t, 4 * MIB);
        // {memset} {busy} {sum}: out, compute, in
        assert_eq!(f.ns, 167_772 + busy + 167_772, "{:?}", f.windows);
        // without the D term the best is 15_486 + busy + 167_772: the D
        // term is what makes the memset's window cost the link time
        assert_eq!(f.windows[0].d_bytes, 8 * MIB);
        assert_eq!(f.windows[0].link_ns, 167_772);
        // the span up to the read: D alone
        let up = window_floor(&t, 4 * MIB, &c, 0..4);
        assert_eq!(up.ns, 167_772 + busy);
        // overwritten whole before the read: nothing is needed later
        let mut ev = t.events.clone();
        ev.insert(4, Event::set(X, 8 * MIB));
        let f = all(&trace(ev), 4 * MIB);
        assert_eq!(f.windows[0].d_bytes, 0, "{:?}", f.windows);
    }

    /// Allocated bytes hold nothing until written, and freed bytes nothing
    /// again: reading them needs no copy-in, writing them before a free
    /// no copy-out.
    #[test]
    fn unwritten_and_freed_bytes_need_no_link() {
        let c = Costs::default();
        let read = Event::op("Sum", &[R8::new(X, 8 * MIB)], &[R8::new(Y, 4096)]);
        let t = trace(vec![
            Event::alloc(X, 8 * MIB),
            Event::alloc(Y, MIB),
            read.clone(),
            Event::set(X, 8 * MIB),
            Event::free(X),
            Event::alloc(X, 8 * MIB),
            read,
        ]);
        let f = all(&t, 4 * MIB);
        assert_eq!(f.ns, f.compute_ns, "{:?}", f.windows);
        let sum = c.op_ns(0, 8 * MIB + 4096);
        assert_eq!(f.ns, 2 * sum + c.memset_ns(8 * MIB));
    }

    /// A read-modify-write output (overlapping an input) is read: its old
    /// value is needed; an output overlapping none is not.
    #[test]
    fn outputs_overlapping_an_input_are_read() {
        let t = trace(vec![
            Event::alloc(X, 8 * MIB),
            Event::alloc(Y, MIB),
            Event::set(X, 8 * MIB),
            Event::set(Y, MIB),
            Event::op("Add", &[R8::new(Y, MIB)], &[R8::new(X, 8 * MIB)]),
        ]);
        let c = Costs::default();
        assert_eq!(window_floor(&t, 4 * MIB, &c, 4..5).ns, c.op_ns(0, 9 * MIB));
        let mut ev = t.events.clone();
        ev[4] = Event::op(
            "Add",
            &[R8::new(Y, MIB), R8::new(X, MIB)],
            &[R8::new(X, 8 * MIB)],
        );
        let f = window_floor(&trace(ev), 4 * MIB, &c, 4..5);
        assert_eq!(f.windows[0].u_bytes, 9 * MIB);
        assert_eq!(f.ns, link(5 * MIB));
    }

    /// Fewer candidate boundaries never raise the floor; the per-device
    /// floor is the largest device's.
    #[test]
    fn strides_and_devices() {
        let mut ev = vec![Event::alloc(X, 8 * MIB), Event::alloc(Y, MIB)];
        for i in 0..40u64 {
            ev.push(Event::set(X + (i % 8) * MIB, MIB));
            ev.push(
                Event::op("Sum", &[R8::new(X, 8 * MIB)], &[R8::new(Y, 4096)])
                    .with_flops(i * 1_000_000_000),
            );
        }
        let t = trace(ev.clone());
        let c = Costs::default();
        let p = Prepared::new(&t, &c, false);
        let one = p.floor(3 * MIB, 0..t.events.len(), Some(1), &[]);
        assert!(one.ns > one.compute_ns);
        for k in [2, 3, 7, 100] {
            let f = p.floor(3 * MIB, 0..t.events.len(), Some(k), &[]);
            assert!(
                f.ns <= one.ns && f.ns >= f.compute_ns,
                "stride {k}: {} > {}",
                f.ns,
                one.ns
            );
            assert_eq!(f.stride, k);
        }
        // the same calls on device 1 with less flops: device 0's floor
        let mut two = ev.clone();
        two.extend(ev.iter().map(|e| {
            let mut e = e.clone().on_dev(1);
            e.flops = None;
            e
        }));
        let f = all(&trace(two), 3 * MIB);
        assert_eq!((f.ns, f.device), (one.ns, 0));
    }

    /// With two streams only synchronous calls (stream-0 memsets and
    /// copies) cut windows: two 1 ms operators on different streams could
    /// run at once, so the floor is 1 ms, not 2.
    #[test]
    fn several_streams_cut_only_at_synchronous_calls() {
        let c = Costs::default();
        let busy = |s: u32| {
            Event::op("Busy", &[], &[R8::new(Y + s as u64 * 4096, 4096)])
                .with_flops(280_000_000_000)
                .on_stream(s)
        };
        let t = trace(vec![Event::alloc(Y, MIB), busy(1), busy(2)]);
        let one = c.op_ns(280_000_000_000, 4096);
        assert_eq!(all(&t, 4 * MIB).ns, one);
        // a stream-0 memset between them is a barrier
        let t = trace(vec![
            Event::alloc(Y, MIB),
            busy(1),
            Event::set(Y + 8192, 4096),
            busy(2),
        ]);
        let f = all(&t, 4 * MIB);
        assert_eq!(f.ns, 2 * one + c.memset_ns(4096));
        // acl-replay issues nothing synchronously
        let p = Prepared::new(&t, &c, true);
        assert_eq!(p.floor(4 * MIB, 0..4, None, &[]).ns, one);
    }

    /// The floor straight from its definition, byte by byte, over every
    /// partition: U, D and has-data recomputed for each window. With
    /// several streams, windows end only next to stream-0 memsets and
    /// copies; U counts only from one, D only up to one.
    fn naive(t: &Trace, hbm: u64, c: &Costs) -> u64 {
        let n = t.events.len();
        let streams: std::collections::HashSet<u32> = t.events.iter().map(|e| e.stream).collect();
        let mut barrier = vec![streams.len() <= 1; n + 1];
        barrier[0] = true;
        barrier[n] = true;
        for (i, e) in t.events.iter().enumerate() {
            if e.stream == 0 && matches!(e.body, Body::Set { .. } | Body::Copy { .. }) {
                barrier[i] = true;
                barrier[i + 1] = true;
            }
        }
        let mut sizes = HashMap::new();
        // per event: duration, bytes read, written, cleared
        let mut calls = Vec::new();
        for ev in &t.events {
            let (d, acc) = call(ev, c, &mut sizes);
            let (mut r, mut w, mut cl) = (Vec::new(), Vec::new(), Vec::new());
            for (a, b, f) in acc {
                for x in a..a + b {
                    if f & R != 0 {
                        r.push(x);
                    }
                    if f & W != 0 {
                        w.push(x);
                    }
                    if f & C != 0 {
                        cl.push(x);
                    }
                }
            }
            calls.push((d, r, w, cl));
        }
        let has_data = |x: u64, b: usize| {
            let mut h = false;
            for (_, _, w, cl) in &calls[..b] {
                if w.contains(&x) {
                    h = true;
                }
                if cl.contains(&x) {
                    h = false;
                }
            }
            h
        };
        let read_next = |x: u64, e: usize| {
            for (_, r, w, cl) in &calls[e..] {
                if r.contains(&x) {
                    return true;
                }
                if w.contains(&x) || cl.contains(&x) {
                    return false;
                }
            }
            false
        };
        let cost = |b: usize, e: usize| {
            let mut per: HashMap<u32, u64> = HashMap::new();
            for (k, c) in calls[b..e].iter().enumerate() {
                *per.entry(t.events[b + k].stream).or_default() += c.0;
            }
            let comp = per.values().copied().max().unwrap_or(0);
            let mut fresh = std::collections::HashSet::new();
            let mut need = std::collections::HashSet::new();
            let mut wrote = std::collections::HashSet::new();
            for (_, r, w, cl) in &calls[b..e] {
                for &x in r {
                    if !fresh.contains(&x) && has_data(x, b) {
                        need.insert(x);
                    }
                }
                for &x in w {
                    fresh.insert(x);
                    wrote.insert(x);
                }
                for &x in cl {
                    fresh.insert(x);
                    wrote.remove(&x);
                }
            }
            let u = if barrier[b] { need.len() as u64 } else { 0 };
            let d = if barrier[e] {
                wrote.iter().filter(|&&x| read_next(x, e)).count() as u64
            } else {
                0
            };
            let over = u.max(d).saturating_sub(hbm);
            comp.max((over as f64 / c.link_gbps).floor() as u64)
        };
        let mut best = vec![0u64; n + 1];
        for e in (1..=n).filter(|&e| barrier[e]) {
            best[e] = (0..e)
                .filter(|&b| barrier[b])
                .map(|b| best[b] + cost(b, e))
                .max()
                .unwrap();
        }
        best[n]
    }

    /// Random small traces: the sweep's floor is the definition's.
    #[test]
    fn the_sweep_computes_the_definition() {
        let c = Costs {
            link_gbps: 0.05,
            hbm_gbps: 1.0,
            launch_us: 0.1,
            ..Costs::default()
        };
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |k: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % k
        };
        for round in 0..200 {
            let mut ev = Vec::new();
            let mut live: Vec<(u64, u64)> = Vec::new();
            let mut next = 0x1000u64;
            for _ in 0..(5 + rnd(25)) {
                let range = |rnd: &mut dyn FnMut(u64) -> u64, live: &[(u64, u64)]| {
                    let (a, b) = live[rnd(live.len() as u64) as usize];
                    let off = rnd(b);
                    R8::new(a + off, 1 + rnd(b - off))
                };
                match rnd(if live.is_empty() { 1 } else { 10 }) {
                    0 => {
                        let b = 8 + rnd(40);
                        ev.push(Event::alloc(next, b));
                        live.push((next, b));
                        next += 64;
                    }
                    1 if live.len() > 1 => {
                        let (a, _) = live.remove(rnd(live.len() as u64) as usize);
                        ev.push(Event::free(a));
                    }
                    2 => {
                        let r = range(&mut rnd, &live);
                        ev.push(Event::set(r.addr, r.bytes));
                    }
                    3 => {
                        let r = range(&mut rnd, &live);
                        ev.push(Event::copy(CopyKind::H2D, r.addr, 0x7f00_0000, r.bytes));
                    }
                    4 => {
                        let r = range(&mut rnd, &live);
                        ev.push(Event::copy(CopyKind::D2H, 0x7f00_0000, r.addr, r.bytes));
                    }
                    5 => {
                        let a = range(&mut rnd, &live);
                        let b = range(&mut rnd, &live);
                        let k = a.bytes.min(b.bytes);
                        ev.push(Event::copy(CopyKind::D2D, a.addr, b.addr, k));
                    }
                    _ => {
                        let ins: Vec<R8> = (0..rnd(3)).map(|_| range(&mut rnd, &live)).collect();
                        let outs: Vec<R8> =
                            (0..1 + rnd(2)).map(|_| range(&mut rnd, &live)).collect();
                        ev.push(Event::op("Op", &ins, &outs).with_flops(rnd(3) * 20_000_000));
                    }
                }
            }
            // every third trace on up to three streams
            if round % 3 == 2 {
                for e in ev.iter_mut() {
                    e.stream = rnd(3) as u32;
                }
            }
            let t = trace(ev);
            for hbm in [0, 16, 48] {
                let f = window_floor(&t, hbm, &c, 0..t.events.len());
                assert_eq!(
                    f.ns,
                    naive(&t, hbm, &c),
                    "round {round} hbm {hbm}: {:?} {:?}",
                    f.windows,
                    t.events
                );
                // the partition adds up
                let sum: u64 = f.windows.iter().map(|w| w.compute_ns.max(w.link_ns)).sum();
                assert_eq!(sum, f.ns);
            }
        }
    }
}
