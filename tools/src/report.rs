//! `u3m report TRACE -o report.html`: one self-contained HTML page (inline
//! SVG and CSS, no script, nothing fetched) of what the tiering engine does
//! with a trace: tier occupancy over time per device, migrations per second
//! each way, the stall against an unlimited-HBM run, and the hottest and
//! coldest allocations.
//!
//! A trace records calls, not migrations, so the report replays it through
//! the engine (`u3m replay`'s driver: the library's Tier and policy over the
//! simulated runtime and its cost model) with the HBM, DRAM and policy
//! given, and draws what that run did. Times are simulated. docs/report.md.

use crate::error::CliError;
use crate::human::{bytes, duration};
use crate::replay::drive::Observed;
use crate::replay::{observe_for, Observation, ObserveOpts};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use u3m_core::trace::Body;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// A recorded trace (U3M_TRACE; docs/trace-format.md).
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// Where to write the HTML page.
    #[arg(short = 'o', long = "output", value_name = "report.html")]
    pub output: PathBuf,
    /// Physical HBM per device for the replay (e.g. 16G) [default: unlimited: nothing migrates].
    #[arg(long, value_name = "BYTES")]
    pub hbm: Option<String>,
    /// DRAM tier [default: unlimited].
    #[arg(long, value_name = "BYTES")]
    pub dram: Option<String>,
    /// NVMe tier (a swap file in a temporary directory) [default: none].
    #[arg(long, value_name = "BYTES")]
    pub nvme: Option<String>,
    /// Placement policy (seed-heat, lru, markov, predictive, belady).
    #[arg(long, value_name = "P", default_value = "predictive")]
    pub policy: String,
    /// Allocations listed as hottest and as coldest.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
}

/// One allocation of the trace, with what the replay did to it.
#[derive(Debug, Clone, Default)]
pub struct AllocRow {
    pub dev: u32,
    pub addr: u64,
    pub bytes: u64,
    pub tag: String,
    pub line: u64,
    /// Calls (operators, copies, memsets) that touched it.
    pub accesses: u64,
    /// Chunks of it that arrived in HBM (first touches included) / left it.
    pub arrivals: u64,
    pub evictions: u64,
    /// Simulated ns it was live.
    pub live_ns: u64,
}

impl AllocRow {
    /// Accesses per MiB per simulated second alive: heat, size- and
    /// lifetime-fair.
    fn heat(&self) -> f64 {
        let mib = (self.bytes.max(1) as f64) / (1 << 20) as f64;
        let s = (self.live_ns.max(1) as f64) / 1e9;
        self.accesses as f64 / mib / s
    }
}

/// Every allocation of the trace with its accesses and residency changes.
pub fn allocations(o: &Observation) -> Vec<AllocRow> {
    let t = &o.trace;
    let empty = Observed::default();
    let obs = o.out.observed.as_ref().unwrap_or(&empty);
    let end_ns = o.out.total_ns;
    let mut live: Vec<BTreeMap<u64, usize>> = (0..t.devices).map(|_| BTreeMap::new()).collect();
    let mut rows: Vec<AllocRow> = Vec::new();
    let mut born: Vec<u64> = Vec::new();
    let find = |live: &BTreeMap<u64, usize>, rows: &[AllocRow], a: u64| {
        live.range(..=a)
            .next_back()
            .filter(|(&s, &i)| a < s + rows[i].bytes.max(1))
            .map(|(_, &i)| i)
    };
    for (k, ev) in t.events.iter().enumerate() {
        let d = ev.dev as usize;
        let now = obs.event_ns.get(k).copied().unwrap_or(0);
        match &ev.body {
            Body::Alloc { addr, bytes } => {
                live[d].insert(*addr, rows.len());
                born.push(now);
                rows.push(AllocRow {
                    dev: ev.dev,
                    addr: *addr,
                    bytes: *bytes,
                    tag: ev.tag.clone().unwrap_or_else(|| "-".into()),
                    line: t.lines.get(k).copied().unwrap_or(0),
                    ..AllocRow::default()
                });
            }
            Body::Free { addr } => {
                if let Some(i) = live[d].remove(addr) {
                    rows[i].live_ns = now.saturating_sub(born[i]);
                }
            }
            Body::Op {
                inputs, outputs, ..
            } => {
                let mut seen = Vec::new();
                for r in inputs.iter().chain(outputs) {
                    if let Some(i) = find(&live[d], &rows, r.addr) {
                        if !seen.contains(&i) {
                            seen.push(i);
                            rows[i].accesses += 1;
                        }
                    }
                }
            }
            Body::Copy { dst, src, .. } => {
                for a in [*dst, *src] {
                    if let Some(i) = find(&live[d], &rows, a) {
                        rows[i].accesses += 1;
                    }
                }
            }
            Body::Set { addr, .. } => {
                if let Some(i) = find(&live[d], &rows, *addr) {
                    rows[i].accesses += 1;
                }
            }
        }
    }
    for m in live.iter().flat_map(|m| m.values()) {
        rows[*m].live_ns = end_ns.saturating_sub(born[*m]);
    }
    // the Tier's maps and unmaps, by the allocation their VA belongs to
    let mut by_start: BTreeMap<(u32, u64), usize> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        // a trace address may be reused after a free: the latest wins, and
        // the origin table below tells them apart by VA
        by_start.insert((r.dev, r.addr), i);
    }
    let mut va_row: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    {
        // VAs are handed out in allocation order, never reused: pair the
        // n-th managed allocation at (dev, addr) with the n-th origin entry
        let mut queue: BTreeMap<(u32, u64), Vec<usize>> = BTreeMap::new();
        for (i, r) in rows.iter().enumerate() {
            queue.entry((r.dev, r.addr)).or_default().push(i);
        }
        for q in queue.values_mut() {
            q.reverse();
        }
        for (&va, &(dev, addr, bytes)) in &obs.origin {
            if let Some(i) = queue.get_mut(&(dev, addr)).and_then(|q| q.pop()) {
                va_row.insert(va, (bytes, i));
            }
        }
    }
    for m in &obs.maps {
        if let Some((&va0, &(bytes, i))) = va_row.range(..=m.va).next_back() {
            if m.va < va0 + bytes.max(1) {
                if m.map {
                    rows[i].arrivals += 1;
                } else {
                    rows[i].evictions += 1;
                }
            }
        }
    }
    rows
}

/// HTML-escaped text.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One line series of a chart.
struct Series {
    name: String,
    color: &'static str,
    /// SVG stroke-dasharray ("" for a solid line).
    dash: &'static str,
    points: Vec<(f64, f64)>,
}

/// A line chart as inline SVG: x in simulated seconds, y formatted by `fmt`.
fn chart(id: &str, title: &str, series: &[Series], fmt: &dyn Fn(f64) -> String) -> String {
    let (w, h, l, r, t, b) = (900.0, 260.0, 90.0, 20.0, 30.0, 40.0);
    let xmax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let ymax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let px = |x: f64| l + (x / xmax) * (w - l - r);
    let py = |y: f64| h - b - (y / ymax) * (h - t - b);
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<figure><svg id="{id}" class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{t}"><title>{t}</title>"#,
        t = esc(title)
    );
    let _ = write!(
        o,
        r##"<rect x="{l}" y="{t}" width="{}" height="{}" fill="#fbfbfb" stroke="#ccc"/>"##,
        w - l - r,
        h - t - b
    );
    for i in 0..=4 {
        let y = ymax * i as f64 / 4.0;
        let _ = write!(
            o,
            r##"<line x1="{l}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#e4e4e4"/><text x="{}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"##,
            w - r,
            l - 6.0,
            py(y) + 4.0,
            esc(&fmt(y)),
            yy = py(y)
        );
        let x = xmax * i as f64 / 4.0;
        let _ = write!(
            o,
            r#"<text x="{:.1}" y="{}" text-anchor="middle" font-size="11">{}</text>"#,
            px(x),
            h - b + 16.0,
            esc(&duration_s(x))
        );
    }
    let _ = write!(
        o,
        r#"<text x="{:.1}" y="{}" text-anchor="middle" font-size="11">simulated time</text>"#,
        (l + w - r) / 2.0,
        h - 6.0
    );
    let _ = write!(
        o,
        r#"<text x="{l}" y="18" font-size="13" font-weight="bold">{}</text>"#,
        esc(title)
    );
    for (k, s) in series.iter().enumerate() {
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = write!(
            o,
            r#"<polyline class="series" data-name="{}" fill="none" stroke="{}" stroke-dasharray="{}" stroke-width="1.6" points="{}"/>"#,
            esc(&s.name),
            s.color,
            s.dash,
            pts.join(" ")
        );
        let lx = w - r - 160.0;
        let ly = t + 14.0 + 16.0 * k as f64;
        let _ = write!(
            o,
            r#"<rect x="{lx}" y="{:.1}" width="12" height="4" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            ly - 4.0,
            s.color,
            lx + 18.0,
            ly,
            esc(&s.name)
        );
    }
    o.push_str("</svg></figure>\n");
    o
}

fn duration_s(s: f64) -> String {
    if s == 0.0 {
        "0".into()
    } else {
        duration(s)
    }
}

fn rate(bps: f64) -> String {
    format!("{}/s", bytes(bps.max(0.0) as u64))
}

fn alloc_table(id: &str, rows: &[&AllocRow]) -> String {
    let mut o = format!(
        r#"<table id="{id}"><thead><tr><th>device</th><th>address</th><th>size</th><th>tag</th><th>trace line</th><th>accesses</th><th>accesses/MiB/s</th><th>chunk arrivals</th><th>evictions</th><th>live</th></tr></thead><tbody>"#
    );
    for r in rows {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{:#x}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            r.dev,
            r.addr,
            bytes(r.bytes),
            esc(&r.tag),
            r.line,
            r.accesses,
            r.heat(),
            r.arrivals,
            r.evictions,
            duration_s(r.live_ns as f64 / 1e9)
        );
    }
    o.push_str("</tbody></table>\n");
    o
}

/// The whole page.
pub fn html(o: &Observation, top: usize) -> String {
    let empty = Observed::default();
    let obs = o.out.observed.as_ref().unwrap_or(&empty);
    let t = &o.out.tier;
    let stall = o.out.total_ns.saturating_sub(o.baseline_ns);
    let unlimited = o.hbm >= crate::replay::drive::UNLIMITED;
    let mut p = String::new();
    let _ = write!(
        p,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>u3m report: {name}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; max-width: 1000px; }}
table {{ border-collapse: collapse; margin: 8px 0 20px; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th {{ background: #f0f0f0; }}
td:nth-child(4) {{ text-align: left; }}
figure {{ margin: 8px 0 16px; }}
.note {{ color: #666; font-size: 13px; }}
</style></head><body>
<h1>u3m report: {name}</h1>
<p class="note">The trace replayed through u3m's tiering engine (the library's Tier and placement policy over u3m replay's simulated runtime and cost model). All times are simulated.</p>
"#,
        name = esc(&o.trace.name)
    );
    let _ = write!(
        p,
        r#"<table id="summary"><tbody>
<tr><th>trace</th><td>{}</td></tr>
<tr><th>events</th><td>{}</td></tr>
<tr><th>HBM per device</th><td>{}</td></tr>
<tr><th>DRAM tier</th><td>{}</td></tr>
<tr><th>policy</th><td>{}</td></tr>
<tr><th>simulated time</th><td id="total-time">{}</td></tr>
<tr><th>with unlimited HBM</th><td>{}</td></tr>
<tr><th>stall</th><td id="stall">{} ({:.1}%)</td></tr>
<tr><th>fault-ins</th><td id="faults">{} chunks, {}</td></tr>
<tr><th>evictions</th><td id="evictions">{} chunks, {}</td></tr>
<tr><th>prefetched</th><td>{} chunks, {}</td></tr>
<tr><th>peak HBM</th><td>{}</td></tr>
</tbody></table>
"#,
        esc(&o.trace.name),
        o.trace.events.len(),
        if unlimited {
            "unlimited (nothing migrates: pass --hbm)".to_string()
        } else {
            bytes(o.hbm)
        },
        if o.setup.dram >= 1 << 40 {
            "unlimited".to_string()
        } else {
            bytes(o.setup.dram)
        },
        esc(&o.policy),
        duration_s(o.out.total_ns as f64 / 1e9),
        duration_s(o.baseline_ns as f64 / 1e9),
        duration_s(stall as f64 / 1e9),
        100.0 * stall as f64 / o.baseline_ns.max(1) as f64,
        t.faults_in,
        bytes(t.fault_bytes),
        t.evictions,
        bytes(t.eviction_bytes),
        t.prefetches,
        bytes(t.prefetch_bytes),
        bytes(o.out.peak_hbm),
    );
    p.push_str("<h2>Tier occupancy</h2>\n");
    let colors = ["#1f77b4", "#ff7f0e", "#2ca02c"];
    for d in 0..o.trace.devices {
        let series: Vec<Series> = ["HBM", "DRAM", "NVMe"]
            .iter()
            .enumerate()
            .map(|(k, name)| Series {
                name: name.to_string(),
                color: colors[k],
                dash: "",
                points: obs
                    .samples
                    .iter()
                    .map(|s| {
                        let v = s.tiers.get(d).copied().unwrap_or_default();
                        (s.t_ns as f64 / 1e9, [v.0, v.1, v.2][k] as f64)
                    })
                    .collect(),
            })
            .collect();
        p.push_str(&chart(
            &format!("occupancy-dev{d}"),
            &format!("device {d}: bytes per tier (DRAM and NVMe are process-wide)"),
            &series,
            &|v| bytes(v as u64),
        ));
    }
    p.push_str("<h2>Migrations</h2>\n");
    let mut into = Vec::new();
    let mut out = Vec::new();
    for w in obs.samples.windows(2) {
        let dt = (w[1].t_ns.saturating_sub(w[0].t_ns)) as f64 / 1e9;
        if dt <= 0.0 {
            continue;
        }
        let (a, b) = (&w[0].counters, &w[1].counters);
        let x = w[1].t_ns as f64 / 1e9;
        let inb =
            (b.fault_bytes + b.prefetch_bytes).saturating_sub(a.fault_bytes + a.prefetch_bytes);
        into.push((x, inb as f64 / dt));
        out.push((
            x,
            b.eviction_bytes.saturating_sub(a.eviction_bytes) as f64 / dt,
        ));
    }
    p.push_str(&chart(
        "migrations",
        "bytes per second into HBM (fault-ins and prefetch) and out of it (evictions), all devices",
        &[
            Series {
                name: "into HBM".into(),
                color: "#2ca02c",
                dash: "",
                points: into,
            },
            Series {
                name: "out of HBM".into(),
                color: "#d62728",
                dash: "5 3",
                points: out,
            },
        ],
        &rate,
    ));
    p.push_str("<h2>Allocations</h2>\n");
    let rows = allocations(o);
    // the allocations the engine manages (U3M_MIN_BYTES and up): the rest
    // never leave HBM
    let mut by_heat: Vec<&AllocRow> = rows
        .iter()
        .filter(|r| r.bytes >= o.setup.min_bytes.max(1))
        .collect();
    by_heat.sort_by(|a, b| b.heat().total_cmp(&a.heat()).then(a.line.cmp(&b.line)));
    let n = top.min(by_heat.len());
    let _ = writeln!(
        p,
        r#"<p class="note">{} allocations, {} of them managed (at least {}; smaller ones stay in HBM and are not ranked). Heat: calls touching the allocation per MiB per simulated second it was live. Chunk arrivals count first touches, fault-ins and prefetches of its 2 MiB chunks.</p>"#,
        rows.len(),
        by_heat.len(),
        bytes(o.setup.min_bytes)
    );
    p.push_str("<h3>Hottest</h3>\n");
    p.push_str(&alloc_table("hottest", &by_heat[..n]));
    p.push_str("<h3>Coldest</h3>\n");
    let cold: Vec<&AllocRow> = by_heat.iter().rev().take(n).copied().collect();
    p.push_str(&alloc_table("coldest", &cold));
    p.push_str("</body></html>\n");
    p
}

pub fn main(a: &ReportArgs) -> Result<ExitCode, CliError> {
    let opts = ObserveOpts {
        trace: &a.trace,
        hbm: a.hbm.as_deref(),
        dram: a.dram.as_deref(),
        nvme: a.nvme.as_deref(),
        policy: &a.policy,
    };
    let o = match observe_for("report", &opts)? {
        Ok(o) => o,
        Err(code) => return Ok(code),
    };
    let page = html(&o, a.top);
    std::fs::write(&a.output, page).map_err(|err| CliError::Io {
        what: "writing the report",
        err,
    })?;
    eprintln!(
        "u3m report: wrote {} ({} devices, {} samples, policy {}, simulated {} vs {} with unlimited HBM)",
        a.output.display(),
        o.trace.devices,
        o.out.observed.as_ref().map_or(0, |x| x.samples.len()),
        o.policy,
        duration_s(o.out.total_ns as f64 / 1e9),
        duration_s(o.baseline_ns as f64 / 1e9)
    );
    Ok(ExitCode::SUCCESS)
}
