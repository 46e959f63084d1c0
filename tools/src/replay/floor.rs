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

use super::cost::Costs;
use super::drive::{Trace, ALIAS_CHECK_MAX};

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
}

/// `F` of the access flags: the call reads the bytes (before any write).
const R: u8 = 1;
/// The call overwrites the bytes.
const W: u8 = 2;
/// An `A` or `F`: afterwards the bytes hold no data.
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
    Prepared::new(trace, costs).floor(hbm, span, None, &[])
}

impl Prepared {
    pub fn new(trace: &Trace, costs: &Costs) -> Prepared {
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
            .map(|(d, g)| Dev::new(trace, costs, d as u32, g))
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
        Body::Op {
            inputs, outputs, ..
        } => {
            // as the replay: an output overlapping no input is written
            // whole; past ALIAS_CHECK_MAX pairs, none is
            let check = inputs.len() * outputs.len() <= ALIAS_CHECK_MAX;
            let mut a: Vec<(u64, u64, u8)> = inputs.iter().map(|r| (r.addr, r.bytes, R)).collect();
            let mut touched: u64 = inputs.iter().map(|r| r.bytes).sum();
            for o in outputs {
                touched += o.bytes;
                let overlaps = !check
                    || inputs
                        .iter()
                        .any(|i| i.addr < o.addr + o.bytes && o.addr < i.addr + i.bytes);
                a.push((o.addr, o.bytes, if overlaps { R | W } else { W }));
            }
            (costs.op_ns(ev.flops.unwrap_or(0), touched), a)
        }
        Body::Copy {
            kind,
            dst,
            src,
            bytes,
        } => match kind {
            CopyKind::H2D => (costs.link_ns(*bytes), vec![(*dst, *bytes, W)]),
            CopyKind::D2H => (costs.link_ns(*bytes), vec![(*src, *bytes, R)]),
            CopyKind::D2D => (
                costs.d2d_ns(*bytes),
                vec![(*src, *bytes, R), (*dst, *bytes, W)],
            ),
            CopyKind::H2H => (0, Vec::new()),
        },
        Body::Set { addr, bytes } => (costs.memset_ns(*bytes), vec![(*addr, *bytes, W)]),
    }
}

impl Dev {
    fn new(trace: &Trace, costs: &Costs, dev: u32, global: Vec<usize>) -> Dev {
        let n = global.len();
        let mut sizes = HashMap::new();
        let mut stream_ids: HashMap<u32, u32> = HashMap::new();
        let (mut stream, mut dur) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut raw: Vec<(u32, u64, u64, u8)> = Vec::new();
        let mut cuts: Vec<u64> = Vec::new();
        for (t, &g) in global.iter().enumerate() {
            let ev = &trace.events[g];
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
        let stride = stride
            .unwrap_or_else(|| len.div_ceil(MAX_CANDIDATES))
            .max(1);
        // candidate boundaries (device event indices)
        let mut cand: Vec<usize> = (lo..hi).step_by(stride).collect();
        cand.push(hi);
        for &m in marks {
            let t = self.global.partition_point(|&g| g < m);
            if (lo..=hi).contains(&t) {
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
                let l = link(su.max(sd));
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
