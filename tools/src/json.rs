//! `u3m stat --json`, schema 1 (docs/stats.md). Within schema 1 fields are
//! only ever added; renaming, removing or changing the meaning of one bumps
//! `SCHEMA`. Device counters come from `DEVICE_FIELDS`, so the JSON, the
//! table and the docs check share one list.

use serde_json::{json, Map, Value};
use u3m_core::shm::layout::DEVICE_FIELDS;
use u3m_core::shm::reader::DeviceSnapshot;
use u3m_core::shm::{Event, Snapshot};

pub const SCHEMA: u64 = 1;

/// What `stat` shows of one process.
pub struct ProcView<'a> {
    pub snap: &'a Snapshot,
    pub events: &'a [Event],
    /// Records of the requested window no longer readable (ring overrun).
    pub lost: u64,
}

pub fn document(procs: &[ProcView], now_unix_ns: u64) -> Value {
    json!({
        "schema": SCHEMA,
        "u3m_version": u3m_core::VERSION,
        "time_unix_ns": now_unix_ns,
        "processes": procs.iter().map(process).collect::<Vec<_>>(),
    })
}

fn secs_since(start: u64, t: u64) -> f64 {
    round3((t as i128 - start as i128) as f64 / 1e9)
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

pub fn process(p: &ProcView) -> Value {
    let s = p.snap;
    let config: Map<String, Value> = s
        .config_pairs()
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    let calls: Map<String, Value> = s
        .calls
        .iter()
        .filter(|c| c.count > 0)
        .map(|c| (c.name.clone(), json!(c.count)))
        .collect();
    let hot: Vec<Value> = s
        .hot
        .iter()
        .map(|h| {
            json!({
                "address": format!("{:#x}", h.addr),
                "len": h.len,
                "device": h.device,
                "accesses": h.accesses,
                "heat": h.heat,
                "classes": s.class_list(h.class_mask),
                "last_access_s": if h.last_ns == 0 { Value::Null } else { json!(secs_since(s.start_mono_ns, h.last_ns)) },
            })
        })
        .collect();
    json!({
        "pid": s.pid,
        "writer_version": s.writer_version,
        "layout": format!("{}.{}", s.layout.0, s.layout.1),
        "labels": u3m_core::shm::layout::LABEL_NAMES
            .iter()
            .zip(&s.labels)
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect::<Map<String, Value>>(),
        "state": if s.exiting { "exiting" } else { "running" },
        "start_unix_ns": s.start_unix_ns,
        "uptime_s": secs_since(s.start_mono_ns, s.taken_mono_ns),
        "config": config,
        "devices": s.devices.iter().map(device).collect::<Vec<_>>(),
        "calls": calls,
        "calls_overflow": s.calls_overflow,
        "hot": hot,
        "events": {
            "head": s.event_head,
            "dropped_by_writer": s.events_dropped,
            "lost": p.lost,
            "recent": p.events.iter().map(|e| event(e, s.start_mono_ns)).collect::<Vec<_>>(),
        },
    })
}

pub fn device(d: &DeviceSnapshot) -> Value {
    let mut m = Map::new();
    m.insert("device".into(), json!(d.index));
    for (f, v) in DEVICE_FIELDS.iter().zip(&d.values) {
        insert_path(&mut m, f.key, json!(v));
    }
    m.insert(
        "monitor".into(),
        json!({
            "level": d.monitor.level.name(),
            "hbm_use": round6(d.monitor.use_fraction),
            "basis": crate::table::monitor_basis(d),
            "seconds_to_oom": d.monitor.seconds_to_oom,
            "growth_bytes_per_s": d.monitor.growth_bps,
        }),
    );
    Value::Object(m)
}

fn round6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

/// Puts `v` at dotted `path` ("copies.h2d.bytes") in nested objects.
fn insert_path(m: &mut Map<String, Value>, path: &str, v: Value) {
    match path.split_once('.') {
        None => {
            m.insert(path.to_string(), v);
        }
        Some((head, rest)) => {
            let e = m
                .entry(head.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(inner) = e {
                insert_path(inner, rest, v);
            }
        }
    }
}

pub fn event(e: &Event, start_mono_ns: u64) -> Value {
    json!({
        "seq": e.seq,
        "t_s": secs_since(start_mono_ns, e.time_ns),
        "kind": e.kind_name(),
        "device": e.device,
        "address": format!("{:#x}", e.addr),
        "len": e.len,
        "value": e.value,
        "text": e.text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_paths_nest() {
        let mut m = Map::new();
        insert_path(&mut m, "copies.h2d.bytes", json!(1));
        insert_path(&mut m, "copies.h2d.calls", json!(2));
        insert_path(&mut m, "pinned_bytes", json!(3));
        assert_eq!(
            Value::Object(m),
            json!({"copies": {"h2d": {"bytes": 1, "calls": 2}}, "pinned_bytes": 3})
        );
    }
}
