//! The checks behind the fuzz targets, shared with `tests/fuzz_corpus.rs`,
//! which replays the committed corpus and every saved crash input
//! (fuzz/regressions/<target>/) through them in the ordinary test run: a
//! crash found by fuzzing becomes a regression test by saving its input.
#![allow(dead_code)]
use std::path::PathBuf;
use std::sync::OnceLock;
use u3m_core::config::{parse_size, Config, VARS};
use u3m_core::shm::{EventCursor, EventKind, HotEntry, SegmentConfig, SegmentReader, StatsSegment};
use u3m_core::trace::{read_str, write_string, TraceReader};

/// The trace reader (core/src/trace/reader.rs) on arbitrary bytes: it must
/// return events or a `TraceError` naming the line, never panic or hang;
/// and whatever it accepts must survive a write/read round trip unchanged
/// (the writer's text is a trace the reader takes back as the same events).
pub fn trace_reader(data: &[u8]) {
    let mut events = Vec::new();
    let mut reader = TraceReader::new(data, "fuzz");
    let mut failed = false;
    for ev in &mut reader {
        match ev {
            Ok(e) => events.push(e),
            Err(e) => {
                assert!(
                    e.line <= data.len() as u64 + 1,
                    "error line {} past the input",
                    e.line
                );
                let _ = e.to_string();
                failed = true;
                break;
            }
        }
    }
    if failed {
        return;
    }
    let text = write_string(&events);
    let back = read_str(&text, "round-trip")
        .unwrap_or_else(|e| panic!("the writer's own text is refused: {e}\n{text}"));
    assert_eq!(back, events, "round trip changed the events");
}

/// The U3M_* configuration parser (core/src/config.rs, `Config::from_vars`,
/// the entry point `Config::from_env` uses) on synthetic environments. Each
/// input line is one variable: a first byte below 0x80 picks a known name
/// from `VARS` (so values reach every parser), anything else is a raw
/// `NAME=VALUE` line. The parser must accept or name the variable at fault,
/// never panic; what it accepts must be internally consistent.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut vars: Vec<(String, String)> = Vec::new();
    for line in text.split('\n') {
        let Some(first) = line.chars().next() else {
            continue;
        };
        if (first as u32) < 0x80 {
            let spec = &VARS[first as usize % VARS.len()];
            let value: String = line.chars().skip(1).collect();
            let _ = parse_size(&value);
            vars.push((spec.name.to_string(), value));
        } else if let Some((k, v)) = line.split_once('=') {
            vars.push((k.to_string(), v.to_string()));
        }
    }
    match Config::from_vars(vars.clone()) {
        Ok(c) => {
            assert!(c.hbm_low <= c.hbm_high, "{c:?}");
            assert!((0.0..=1.0).contains(&c.hbm_low) && (0.0..=1.0).contains(&c.hbm_high));
            assert!((1.0..=64.0).contains(&c.oversub), "{c:?}");
            assert!(c.calib_s > 0.0 && c.warmup_s >= 0.0);
            assert!(c.hot_interval_ms >= 10);
            let _ = c.summary();
        }
        Err(e) => {
            assert!(
                vars.iter().any(|(k, _)| *k == e.var) || VARS.iter().any(|v| v.name == e.var),
                "error names a variable that was not set: {e}"
            );
            let _ = e.to_string();
        }
    }
}

fn dir() -> PathBuf {
    // tmpfs when there is one: every input writes a 560 KiB file
    let root = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let d = root.join(format!("u3m-fuzz-shm-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A real segment with some of everything in it, made once.
fn base() -> &'static Vec<u8> {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    BASE.get_or_init(|| {
        let d = dir().join("base");
        std::fs::create_dir_all(&d).unwrap();
        let cfg = SegmentConfig {
            dir: d.clone(),
            config_text: "mode=tier U3M_OVERSUB=2",
            hook_names: &["aclrtMalloc", "aclrtFree", "aclopExecuteV2"],
            class_names: &["matmul", "norm"],
            labels: std::array::from_fn(|i| {
                ["node-a", "3", "1", "8", "2", "run", "pod", "ns"][i % 8].to_string()
            }),
        };
        let seg = StatsSegment::create(&cfg).expect("segment");
        seg.count_call(0);
        seg.count_call(2);
        seg.device(0)
            .ops
            .fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        for i in 0..40 {
            seg.event(EventKind::Alloc, 0, 0x1000 * i, 4096, "fuzz");
        }
        seg.publish_hot(&[HotEntry {
            addr: 0x1000,
            len: 2 << 20,
            device: 0,
            accesses: 9,
            heat: 0.5,
            class_mask: 1,
            last_ns: 1,
        }]);
        let bytes = std::fs::read(seg.path()).unwrap();
        seg.remove();
        bytes
    })
}

/// The stats-segment reader (core/src/shm/reader.rs) on forged segment
/// files: what `u3m stat`/`top` do with a file in the segment directory that
/// any local user could have written. The input is either a whole file (first
/// byte 0xff: the rest, truncated or not) or a list of patches applied to a
/// real segment written by the library's own writer (each patch: 3 bytes of
/// little-endian offset, 1 byte of length, the bytes). Opening must succeed
/// or fail with an `OpenError`; a reader that opened must read the snapshot,
/// configuration, hot table and event tail without panicking or hanging.
pub fn stats_segment(data: &[u8]) {
    let file: Vec<u8> = if data.first() == Some(&0xff) {
        data[1..].to_vec()
    } else {
        let mut f = base().clone();
        let mut p = data;
        while p.len() >= 4 {
            let off = (p[0] as usize | (p[1] as usize) << 8 | (p[2] as usize) << 16) % f.len();
            let n = (p[3] as usize).min(p.len() - 4).min(f.len() - off);
            f[off..off + n].copy_from_slice(&p[4..4 + n]);
            p = &p[4 + n..];
        }
        f
    };
    let path = dir().join(format!("u3m.{}", std::process::id()));
    std::fs::write(&path, &file).unwrap();
    if let Ok(r) = SegmentReader::open(&path) {
        let s = r.snapshot();
        let _ = (
            s.config_pairs(),
            s.class_list(u64::MAX),
            r.liveness(),
            r.pid(),
        );
        for d in &s.devices {
            let _ = d.get("evictions.count");
        }
        let _ = r.config();
        let _ = r.hot();
        // fuzz/regressions/stats_segment/event-head-overflow: a forged
        // event_head at or above 2^63 once overflowed read_slot's stamp
        let mut c = EventCursor::from(0);
        for _ in 0..3 {
            let t = r.tail(&mut c, 64);
            for e in &t.events {
                let _ = (e.kind(), e.kind_name());
            }
        }
        let mut far = EventCursor::from(u64::MAX - 5);
        let _ = r.tail(&mut far, 1 << 20);
    }
}
