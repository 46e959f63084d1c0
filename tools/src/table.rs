//! `u3m stat`'s text output: one block per process.

use crate::human::{addr, bytes, duration, offset, percent};
use crate::json::ProcView;
use std::fmt::Write;
use u3m_core::shm::layout::{COPY_NAMES, TIER_NAMES};
use u3m_core::shm::reader::DeviceSnapshot;
use u3m_core::shm::{Event, Snapshot};

/// Left-aligned columns separated by two spaces; the last column is not padded.
pub fn columns(rows: &[Vec<String>], indent: &str) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::from(indent);
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                let _ = write!(line, "{c:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub fn process_header(s: &Snapshot) -> String {
    let up = (s.taken_mono_ns.saturating_sub(s.start_mono_ns)) as f64 / 1e9;
    let rank = crate::ranks::rank_text(s)
        .map(|r| format!(" · {r}"))
        .unwrap_or_default();
    format!(
        "pid {}{rank} · u3m {} · layout {}.{} · up {} · {}",
        s.pid,
        s.writer_version,
        s.layout.0,
        s.layout.1,
        duration(up),
        if s.exiting { "exiting" } else { "running" }
    )
}

pub fn config_line(s: &Snapshot) -> String {
    let pairs: Vec<String> = s
        .config_pairs()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if pairs.is_empty() {
        "(none)".into()
    } else {
        pairs.join(" ")
    }
}

/// What the monitor's use is a share of: the virtual capacity under
/// tiering (the writer publishes one), else physical HBM.
pub fn monitor_basis(d: &DeviceSnapshot) -> &'static str {
    if d.get("hbm.virtual_capacity") > 0 {
        "virtual"
    } else {
        "hbm"
    }
}

pub fn monitor_line(d: &DeviceSnapshot) -> String {
    let m = &d.monitor;
    let mut s = format!(
        "{}, {} {:.1}%",
        m.level.name(),
        monitor_basis(d),
        m.use_fraction * 100.0
    );
    match m.seconds_to_oom {
        Some(t) => {
            let _ = write!(
                s,
                ", OOM in {} at {}",
                duration(t),
                crate::human::rate_bytes(m.growth_bps as f64)
            );
        }
        None => s.push_str(", not growing"),
    }
    s
}

fn tier_rows(d: &DeviceSnapshot) -> Vec<Vec<String>> {
    let mut rows = vec![[
        "tier",
        "used",
        "capacity",
        "use",
        "peak",
        "moved in",
        "moved out",
    ]
    .map(String::from)
    .to_vec()];
    for t in TIER_NAMES {
        let used = d.get(&format!("{t}.used"));
        let cap = d.get(&format!("{t}.capacity"));
        rows.push(vec![
            t.to_string(),
            bytes(used),
            bytes(cap),
            percent(used, cap),
            bytes(d.get(&format!("{t}.peak"))),
            bytes(d.get(&format!("migrations.{t}.bytes_in"))),
            bytes(d.get(&format!("migrations.{t}.bytes_out"))),
        ]);
    }
    let v = d.get("hbm.virtual_capacity");
    if v != 0 {
        rows[1][2] = format!("{} (virtual {})", bytes(d.get("hbm.capacity")), bytes(v));
    }
    rows
}

fn counters(d: &DeviceSnapshot) -> Vec<Vec<String>> {
    let copies: Vec<String> = COPY_NAMES
        .iter()
        .map(|k| {
            format!(
                "{k} {} ({})",
                d.get(&format!("copies.{k}.calls")),
                bytes(d.get(&format!("copies.{k}.bytes")))
            )
        })
        .collect();
    vec![
        vec![
            "allocs".into(),
            format!(
                "{} live ({}), {} total ({}), {} frees, {} failed",
                d.get("allocs.live"),
                bytes(d.get("allocs.bytes_live")),
                d.get("allocs.total"),
                bytes(d.get("allocs.bytes_total")),
                d.get("allocs.frees"),
                d.get("allocs.failed")
            ),
        ],
        vec![
            "launches".into(),
            format!(
                "ops {}, kernels {}, graphs {}",
                d.get("launches.ops"),
                d.get("launches.kernels"),
                d.get("launches.graphs")
            ),
        ],
        vec!["copies".into(), copies.join(", ")],
        vec![
            "memsets".into(),
            format!(
                "{} ({}); collectives {} ({})",
                d.get("memsets.calls"),
                bytes(d.get("memsets.bytes")),
                d.get("collectives.calls"),
                bytes(d.get("collectives.bytes"))
            ),
        ],
        vec![
            "residency".into(),
            format!(
                "faults-in {} ({}), evictions {} ({}), pinned {}{}{}",
                d.get("faults_in.count"),
                bytes(d.get("faults_in.bytes")),
                d.get("evictions.count"),
                bytes(d.get("evictions.bytes")),
                bytes(d.get("pinned_bytes")),
                discards_text(d),
                hostmap_text(d)
            ),
        ],
    ]
}

/// Chunks the program's discard hints freed from a copy-out (`u3m_discard`,
/// U3M_TORCH_HINTS), when there were any.
fn discards_text(d: &DeviceSnapshot) -> String {
    match d.get("discards") {
        0 => String::new(),
        n => format!(", {}", discarded(n)),
    }
}

/// "discarded 16 (32.0 MiB)": `n` chunks a discard hint freed from a
/// copy-out (`u3m stat`, `u3m top`).
pub fn discarded(n: u64) -> String {
    format!(
        "discarded {n} ({})",
        bytes(n.saturating_mul(u3m_core::engine::runtime::CHUNK))
    )
}

/// The host-mapped state and calls refused as larger than HBM, when there
/// were any (issue 11).
fn hostmap_text(d: &DeviceSnapshot) -> String {
    let mut t = String::new();
    if d.get("hostmap.bytes") + d.get("hostmap.maps") > 0 {
        t += &format!(
            ", host-mapped {} now ({} chunks mapped, {} back in HBM)",
            bytes(d.get("hostmap.bytes")),
            d.get("hostmap.maps"),
            d.get("hostmap.unmaps")
        );
    }
    if d.get("hostmap.stream_maps") + d.get("hostmap.stream_reads") > 0 {
        t += &format!(
            ", read-once: {} chunks mapped instead of copied, {} reads in place",
            d.get("hostmap.stream_maps"),
            d.get("hostmap.stream_reads")
        );
    }
    if d.get("refused_oversize") > 0 {
        t += &format!(
            ", {} calls refused as larger than HBM",
            d.get("refused_oversize")
        );
    }
    t
}

pub fn calls_line(s: &Snapshot) -> String {
    let mut called: Vec<(&str, u64)> = s
        .calls
        .iter()
        .filter(|c| c.count > 0)
        .map(|c| (c.name.as_str(), c.count))
        .collect();
    called.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut parts: Vec<String> = called.iter().map(|(n, c)| format!("{n} {c}")).collect();
    if s.calls_overflow > 0 {
        parts.push(format!("(unnumbered) {}", s.calls_overflow));
    }
    if parts.is_empty() {
        "(none)".into()
    } else {
        parts.join(" · ")
    }
}

pub fn hot_rows(s: &Snapshot, limit: usize) -> Vec<Vec<String>> {
    let mut rows = vec![["address", "len", "dev", "accesses", "heat", "classes"]
        .map(String::from)
        .to_vec()];
    for h in s.hot.iter().take(limit) {
        let classes = s.class_list(h.class_mask).join(",");
        rows.push(vec![
            addr(h.addr),
            bytes(h.len),
            h.device.to_string(),
            h.accesses.to_string(),
            format!("{:.3}", h.heat),
            if classes.is_empty() {
                "-".into()
            } else {
                classes
            },
        ]);
    }
    rows
}

pub fn event_row(e: &Event, start_mono_ns: u64) -> Vec<String> {
    vec![
        offset(e.time_ns as i128 - start_mono_ns as i128),
        e.kind_name(),
        e.device.map_or("-".into(), |d| format!("dev{d}")),
        if e.addr == 0 {
            "-".into()
        } else {
            addr(e.addr)
        },
        if e.len == 0 { "-".into() } else { bytes(e.len) },
        e.text.clone(),
    ]
}

/// The whole block of one process.
pub fn render(p: &ProcView) -> String {
    let s = p.snap;
    let mut out = String::new();
    let _ = writeln!(out, "{}", process_header(s));
    let _ = writeln!(out, "  config  {}", config_line(s));
    if s.devices.is_empty() {
        let _ = writeln!(out, "  (no device used yet)");
    }
    for d in &s.devices {
        let _ = writeln!(out, "  device {}  monitor: {}", d.index, monitor_line(d));
        out.push_str(&columns(&tier_rows(d), "    "));
        out.push_str(&columns(&counters(d), "    "));
    }
    let _ = writeln!(out, "  calls   {}", calls_line(s));
    if s.hot.is_empty() {
        let _ = writeln!(out, "  hot ranges: none published");
    } else {
        let age = (s.taken_mono_ns.saturating_sub(s.hot_published_ns)) as f64 / 1e9;
        let _ = writeln!(
            out,
            "  hot ranges (top {} of {}, published {} ago)",
            s.hot.len().min(10),
            s.hot.len(),
            duration(age)
        );
        out.push_str(&columns(&hot_rows(s, 10), "    "));
    }
    let _ = writeln!(
        out,
        "  events (last {} of {}; {} lost, {} dropped by writer)",
        p.events.len(),
        s.event_head,
        p.lost,
        s.events_dropped
    );
    let rows: Vec<Vec<String>> = p
        .events
        .iter()
        .map(|e| event_row(e, s.start_mono_ns))
        .collect();
    out.push_str(&columns(&rows, "    "));
    out
}
