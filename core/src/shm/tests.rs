//! Writer/reader round trips, liveness, ABI checks, and a concurrent
//! writers/reader stress test of the event ring's seqlocks.

use super::layout::*;
use super::reader::{self, liveness};
use super::*;
use crate::monitor::{Level, Monitor};

use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::test_alloc::allocs;

/// A scratch directory removed when the test ends (segments are 560 KiB).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("u3m-shm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

const HOOKS: &[&str] = &["aclrtMalloc", "aclrtFree", "aclrtMemcpy", "aclopExecuteV2"];
const CLASSES: &[&str] = &["matmul", "norm", "attention"];

fn create(dir: &Path, config: &str) -> StatsSegment {
    let cfg = SegmentConfig {
        dir: dir.to_path_buf(),
        config_text: config,
        hook_names: HOOKS,
        class_names: CLASSES,
        labels: Default::default(),
    };
    StatsSegment::create(&cfg).expect("create segment")
}

#[test]
fn create_writes_a_0600_file_that_reads_back() {
    let dir = scratch("roundtrip");
    let seg = create(&dir, "U3M_MODE=observe\nU3M_MIN_BYTES=2097152\n");
    let path = dir.join(format!("u3m.{}", std::process::id()));
    assert_eq!(seg.path(), path);
    let md = std::fs::metadata(&path).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o600);
    assert_eq!(md.len(), SEGMENT_SIZE as u64);

    let g = seg.device(1);
    g.capacity[TIER_HBM].store(64 << 30, Relaxed);
    g.add_used(TIER_HBM, 3 << 30);
    g.add_used(TIER_HBM, 1 << 30);
    g.sub_used(TIER_HBM, 2 << 30);
    g.sub_used(TIER_DRAM, 5); // saturates, never wraps
    g.ops.fetch_add(7, Relaxed);
    g.add_copy(COPY_H2D, 4096);
    g.add_copy(COPY_H2D, 4096);
    seg.device(99).ops.fetch_add(1, Relaxed); // out of range: ignored, no panic
    seg.count_call(0);
    seg.count_call(0);
    seg.count_call(3);
    seg.count_call(200); // unnamed
    seg.count_call(100_000); // overflow
    let mut mon = Monitor::default();
    mon.observe(0, 62 << 30, 64 << 30);
    seg.publish_monitor(1, &mon.status());
    let hot = [
        HotEntry {
            addr: 0x1000_0000,
            len: 2 << 20,
            device: 1,
            accesses: 40,
            heat: 0.9,
            class_mask: 0b101,
            last_ns: 5,
        },
        HotEntry {
            addr: 0x2000_0000,
            len: 4 << 20,
            device: 1,
            accesses: 3,
            heat: 0.1,
            class_mask: 1 << 40,
            last_ns: 0,
        },
    ];
    assert!(seg.publish_hot(&hot));

    let r = SegmentReader::open(&path).expect("open");
    assert_eq!(r.pid(), std::process::id());
    assert_eq!(r.liveness(), Liveness::Alive);
    let s = r.snapshot();
    assert_eq!(s.layout, (LAYOUT_MAJOR, LAYOUT_MINOR));
    assert_eq!(s.writer_version, crate::VERSION);
    assert!(!s.exiting);
    assert_eq!(
        s.config_pairs()[1],
        ("U3M_MIN_BYTES".to_string(), "2097152".to_string())
    );
    assert_eq!(s.devices.len(), 1, "only touched devices are listed");
    let d = &s.devices[0];
    assert_eq!(d.index, 1);
    assert_eq!(d.get("hbm.used"), 2 << 30);
    assert_eq!(d.get("hbm.peak"), 4 << 30);
    assert_eq!(d.get("hbm.capacity"), 64 << 30);
    assert_eq!(d.get("dram.used"), 0);
    assert_eq!(d.get("launches.ops"), 7);
    assert_eq!(d.get("copies.h2d.calls"), 2);
    assert_eq!(d.get("copies.h2d.bytes"), 8192);
    assert_eq!(d.monitor.level, Level::Critical);
    assert!((d.monitor.use_fraction - 62.0 / 64.0).abs() < 1e-6);
    assert_eq!(d.monitor.seconds_to_oom, None);
    let calls: Vec<(&str, u64)> = s.calls.iter().map(|c| (c.name.as_str(), c.count)).collect();
    assert_eq!(
        calls,
        vec![
            ("aclrtMalloc", 2),
            ("aclrtFree", 0),
            ("aclrtMemcpy", 0),
            ("aclopExecuteV2", 1),
            ("hook#200", 1)
        ]
    );
    assert_eq!(s.calls_overflow, 1);
    assert_eq!(s.hot, hot.to_vec());
    assert_eq!(s.class_list(0b101), vec!["matmul", "attention"]);
    assert_eq!(s.class_list(1 << 40), vec!["class#40"]);
    assert_eq!(s.hot_publishes, 1);
    // The Start event is the first record.
    let t = r.tail(&mut EventCursor::default(), 100);
    assert_eq!(t.events.len(), 1);
    assert_eq!(t.events[0].kind(), Some(EventKind::Start));
    assert_eq!(t.events[0].value, std::process::id() as u64);
    assert_eq!(t.events[0].text, "observe");

    seg.remove();
    assert!(!path.exists(), "remove unlinks");
    assert!(r.snapshot().exiting, "an open reader sees the writer leave");
}

/// A hook's calls (and a device's operator launches) are the shared count
/// plus every thread row's: more threads than rows count at once (the rest in the shared counts), give
/// their rows back, and the next round's threads take them on. Fails if
/// the reader leaves the rows out, if a row taken on does not count on
/// from its last holder's counts, or if a row is handed to two threads.
#[test]
fn calls_counted_in_thread_rows_add_up() {
    let dir = scratch("rows");
    let seg = Arc::new(create(&dir, "U3M_MODE=observe\n"));
    let r = SegmentReader::open(seg.path()).expect("open");
    const T: usize = THREAD_ROWS + 8;
    const N: u64 = 2000;
    const ROUNDS: u64 = 3;
    for round in 1..=ROUNDS {
        let taken = Arc::new(std::sync::Barrier::new(T));
        let hs: Vec<_> = (0..T)
            .map(|k| {
                let (seg, taken) = (seg.clone(), taken.clone());
                std::thread::spawn(move || {
                    let row = seg.take_thread_calls();
                    // every thread tries before any gives its row back
                    taken.wait();
                    for _ in 0..N {
                        seg.count_call_in(row, k % 3);
                        seg.count_op_in(row, k % 2);
                    }
                    seg.count_op_in(row, MAX_DEVICES + 1); // the sink: nowhere
                    seg.count_call_in(row, 100_000); // overflow: shared
                    if let Some(row) = row {
                        row.give_back();
                    }
                    row.is_some()
                })
            })
            .collect();
        let with_rows = hs.into_iter().map(|h| h.join().unwrap());
        assert_eq!(
            with_rows.filter(|&b| b).count(),
            THREAD_ROWS,
            "a row each for as many threads as there are rows"
        );
        let s = r.snapshot();
        let count = |id: usize| s.calls.iter().find(|c| c.id == id).unwrap().count;
        for h in 0..3 {
            let threads = (0..T).filter(|k| k % 3 == h).count() as u64;
            assert_eq!(
                count(h),
                round * threads * N,
                "hook {h} after round {round}"
            );
        }
        assert_eq!(count(3), 0);
        assert_eq!(s.calls_overflow, round * T as u64);
        assert_eq!(s.devices.len(), 2);
        for (d, dev) in s.devices.iter().enumerate() {
            let threads = (0..T).filter(|k| k % 2 == d).count() as u64;
            assert_eq!(dev.get("launches.ops"), round * threads * N, "device {d}");
        }
    }
    // every row was given back, and is taken by one thread at a time
    let rows: Vec<_> = (0..THREAD_ROWS).map(|_| seg.take_thread_calls()).collect();
    assert!(rows.iter().all(|w| w.is_some()));
    assert!(seg.take_thread_calls().is_none());
}

#[test]
fn hot_paths_do_not_allocate() {
    let dir = scratch("noalloc");
    let seg = create(&dir, "U3M_MODE=observe\n");
    let hot = [HotEntry::default(); 80];
    let mut mon = Monitor::default();
    let row = seg.take_thread_calls();
    assert!(row.is_some());
    let before = allocs();
    for i in 0..10_000u64 {
        seg.device((i % 3) as usize).ops.fetch_add(1, Relaxed);
        seg.device(0).add_used(TIER_HBM, 10);
        seg.count_call((i % 300) as usize);
        seg.count_call_in(row, (i % 300) as usize);
        seg.event(
            EventKind::Alloc,
            0,
            i,
            4096,
            "a text longer than the eighty bytes an event record can hold, so it is cut",
        );
        if let Some(t) = mon.observe(i * 1_000_000, i << 20, 8 << 30) {
            seg.event_value(EventKind::Monitor, 0, 0, i << 20, 1, &t.text());
        }
        seg.publish_monitor(0, &mon.status());
    }
    seg.publish_hot(&hot);
    seg.set_config("U3M_MODE=off\n");
    seg.remove();
    assert_eq!(allocs() - before, 0, "writer allocated on a hot path");
}

#[test]
fn events_read_back_in_order_with_text_cut_at_a_char_boundary() {
    let dir = scratch("events");
    let seg = create(&dir, "");
    let r = SegmentReader::open(seg.path()).unwrap();
    let mut cur = EventCursor::from(r.event_head());
    let long = "é".repeat(60); // 120 bytes
    seg.event_at(
        seg.start_mono_ns() + 5,
        EventKind::Migrate,
        2,
        0xabc000,
        2 << 20,
        (TIER_HBM as u64) << 8 | TIER_DRAM as u64,
        &long,
    );
    seg.event(
        EventKind::ConfigError,
        NO_DEVICE,
        0,
        0,
        "U3M_HBM_HIGH=2: not a fraction in (0,1]",
    );
    seg.event(EventKind::Free, 70_000, 1, 2, ""); // device out of range -> none
    let t = r.tail(&mut cur, 100);
    assert_eq!(t.lost, 0);
    assert_eq!(t.events.len(), 3);
    let e = &t.events[0];
    assert_eq!(
        (e.kind(), e.device, e.addr, e.len, e.value),
        (Some(EventKind::Migrate), Some(2), 0xabc000, 2 << 20, 1)
    );
    assert_eq!(e.time_ns, seg.start_mono_ns() + 5);
    assert_eq!(e.text, "é".repeat(40));
    assert_eq!(t.events[1].kind_name(), "config-error");
    assert_eq!(t.events[1].device, None);
    assert_eq!(t.events[2].device, None);
    assert!(t.events.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    assert!(r.tail(&mut cur, 100).events.is_empty(), "nothing new");
}

#[test]
fn overrun_is_reported_as_a_sequence_gap() {
    let dir = scratch("overrun");
    let seg = create(&dir, "");
    let r = SegmentReader::open(seg.path()).unwrap();
    let mut cur = EventCursor::from(r.event_head());
    let n = EVENT_CAPACITY as u64 * 2 + 10;
    for i in 0..n {
        seg.event(EventKind::Alloc, 0, i, 1, "");
    }
    let t = r.tail(&mut cur, usize::MAX);
    assert_eq!(t.lost, n - EVENT_CAPACITY as u64);
    assert_eq!(t.events.len(), EVENT_CAPACITY);
    assert_eq!(t.events.first().unwrap().addr, n - EVENT_CAPACITY as u64);
    assert_eq!(t.events.last().unwrap().addr, n - 1);
    assert_eq!(cur.next, r.event_head());
    // max keeps the newest and says how many it skipped.
    seg.event(EventKind::Free, 0, 1, 1, "");
    seg.event(EventKind::Free, 0, 2, 1, "");
    seg.event(EventKind::Free, 0, 3, 1, "");
    let t = r.tail(&mut cur, 2);
    assert_eq!((t.skipped, t.lost), (1, 0));
    assert_eq!(
        t.events.iter().map(|e| e.addr).collect::<Vec<_>>(),
        vec![2, 3]
    );
}

#[test]
fn unfinished_record_stalls_the_tail_once_then_counts_as_lost() {
    let dir = scratch("pending");
    let seg = create(&dir, "");
    let r = SegmentReader::open(seg.path()).unwrap();
    let mut cur = EventCursor::from(r.event_head());
    // Simulate a writer that took a ticket and never finished.
    let head = seg.raw_header().event_head.fetch_add(1, Relaxed);
    seg.event(EventKind::Alloc, 0, 7, 1, "");
    let t = r.tail(&mut cur, 100);
    assert!(t.events.is_empty(), "stops at the unfinished record {head}");
    assert_eq!(cur.next, head);
    let t = r.tail(&mut cur, 100);
    assert_eq!(t.lost, 1);
    assert_eq!(t.events.len(), 1);
    assert_eq!(t.events[0].addr, 7);
}

#[test]
fn concurrent_writers_and_reader_never_see_a_torn_record() {
    let dir = scratch("stress");
    let seg = Arc::new(create(&dir, ""));
    let r = SegmentReader::open(seg.path()).unwrap();
    let mut cur = EventCursor::from(r.event_head());
    const THREADS: u64 = 4;
    const PER: u64 = 200_000;
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let seg = seg.clone();
            std::thread::spawn(move || {
                let mut text = String::with_capacity(80);
                for i in 0..PER {
                    let addr = (t << 40) | i;
                    text.clear();
                    use std::fmt::Write;
                    let _ = write!(text, "{addr:x}-{}", "x".repeat((i % 50) as usize));
                    seg.event_at(
                        addr ^ 0x5555,
                        EventKind::Alloc,
                        t as u32,
                        addr,
                        !addr,
                        addr.wrapping_mul(31),
                        &text,
                    );
                }
            })
        })
        .collect();
    let mut read = 0u64;
    let mut lost = 0u64;
    let mut last_per_thread = [None::<u64>; THREADS as usize];
    let check = |e: &Event, last: &mut [Option<u64>]| {
        let t = e.addr >> 40;
        let i = e.addr & ((1 << 40) - 1);
        assert!(t < THREADS, "bad addr {e:?}");
        assert_eq!(e.len, !e.addr, "torn len {e:?}");
        assert_eq!(e.value, e.addr.wrapping_mul(31), "torn value {e:?}");
        assert_eq!(e.time_ns, e.addr ^ 0x5555, "torn time {e:?}");
        assert_eq!(e.device, Some(t as u16), "torn device {e:?}");
        assert_eq!(
            e.text,
            format!("{:x}-{}", e.addr, "x".repeat((i % 50) as usize)),
            "torn text"
        );
        if let Some(p) = last[t as usize] {
            assert!(i > p, "per-thread order broken: {p} then {i}");
        }
        last[t as usize] = Some(i);
    };
    let mut prev_seq = None::<u64>;
    loop {
        let done = writers.iter().all(|w| w.is_finished());
        let t = r.tail(&mut cur, usize::MAX);
        for e in &t.events {
            check(e, &mut last_per_thread);
            if let Some(p) = prev_seq {
                assert!(e.seq > p, "sequence went backwards");
            }
            prev_seq = Some(e.seq);
        }
        read += t.events.len() as u64;
        lost += t.lost;
        if done && cur.next == r.event_head() && cur.stuck_at.is_none() {
            break;
        }
    }
    for w in writers {
        w.join().unwrap();
    }
    let start_events = 1; // Start event written at creation, before the cursor
    let total = THREADS * PER;
    let dropped = r.snapshot().events_dropped;
    assert_eq!(r.event_head(), total + start_events);
    assert_eq!(
        read + lost,
        total,
        "every sequence number is read or counted lost"
    );
    assert!(read > 0);
    eprintln!(
        "stress: {read} read, {lost} lost (of which {dropped} dropped by writers) of {total}"
    );
}

#[test]
fn reader_rejects_foreign_and_future_files() {
    let dir = scratch("abi");
    let p = dir.join("u3m.1");
    std::fs::write(&p, b"").unwrap();
    assert!(matches!(SegmentReader::open(&p), Err(OpenError::NotReady)));
    std::fs::write(&p, vec![0u8; 100]).unwrap();
    assert!(matches!(
        SegmentReader::open(&p),
        Err(OpenError::TooSmall { .. })
    ));
    std::fs::write(&p, vec![7u8; SEGMENT_SIZE]).unwrap();
    assert!(matches!(
        SegmentReader::open(&p),
        Err(OpenError::BadMagic(_))
    ));

    let seg = create(&dir, "");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(seg.path())
        .unwrap();
    // the next major, and the last (layout 1: no thread rows)
    for major in [LAYOUT_MAJOR + 1, LAYOUT_MAJOR - 1] {
        f.write_all_at(&major.to_le_bytes(), 8).unwrap();
        f.write_all_at(&0u32.to_le_bytes(), 12).unwrap();
        let e = SegmentReader::open(seg.path())
            .err()
            .expect("another major refused");
        assert!(matches!(e, OpenError::Version { major: m, minor: 0 } if m == major));
        assert!(e.to_string().contains(&format!("layout {major}.0")), "{e}");
    }
    f.write_all_at(&LAYOUT_MAJOR.to_le_bytes(), 8).unwrap();
    f.write_all_at(&7u32.to_le_bytes(), 12).unwrap(); // a newer minor is fine
    assert!(SegmentReader::open(seg.path()).is_ok());
    f.write_all_at(&8u32.to_le_bytes(), 120).unwrap(); // thread_rows
    assert!(matches!(
        SegmentReader::open(seg.path()),
        Err(OpenError::Geometry(_))
    ));
    f.write_all_at(&(THREAD_ROWS as u32).to_le_bytes(), 120)
        .unwrap();
    assert!(SegmentReader::open(seg.path()).is_ok());
    f.write_all_at(&8u32.to_le_bytes(), 100).unwrap(); // max_hooks
    assert!(matches!(
        SegmentReader::open(seg.path()),
        Err(OpenError::Geometry(_))
    ));
}

#[test]
fn liveness_tells_dead_and_reused_pids() {
    let me = std::process::id();
    let ticks = proc_start(me).unwrap().0;
    assert_eq!(liveness(me, ticks), Liveness::Alive);
    assert_eq!(
        liveness(me, 0),
        Liveness::Alive,
        "unknown start time: trust kill()"
    );
    assert_eq!(
        liveness(me, ticks + 1),
        Liveness::Dead("pid now belongs to another process")
    );
    // A child that exited and was reaped.
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    assert!(matches!(liveness(pid, 0), Liveness::Dead(_)));
    // A zombie (exited, not reaped yet).
    let c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    for _ in 0..1000 {
        if matches!(proc_start(pid), Some((_, b'Z'))) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(
        liveness(pid, 0),
        Liveness::Dead("process has exited (zombie)")
    );
    drop(c);
}

#[test]
fn stale_file_with_our_pid_is_replaced() {
    let dir = scratch("stale");
    let p = dir.join(format!("u3m.{}", std::process::id()));
    std::fs::write(&p, b"left over by a previous process with this pid").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let seg = create(&dir, "");
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(SegmentReader::open(&p).is_ok());
    drop(seg);
    let l = reader::list(&dir).unwrap();
    assert_eq!(l, vec![(std::process::id(), p.clone())]);
    std::fs::write(dir.join("u3m.notapid"), b"").unwrap();
    std::fs::write(dir.join("other.1"), b"").unwrap();
    assert_eq!(
        reader::list(&dir).unwrap().len(),
        1,
        "only u3m.<pid> files are listed"
    );
}

#[test]
fn config_and_hot_table_are_consistent_under_rewrites() {
    let dir = scratch("seqlock");
    let seg = Arc::new(create(&dir, ""));
    let r = SegmentReader::open(seg.path()).unwrap();
    let w = {
        let seg = seg.clone();
        std::thread::spawn(move || {
            for i in 0..20_000u64 {
                let n = (i % 60) as usize + 1;
                let entries: Vec<HotEntry> = (0..n)
                    .map(|k| HotEntry {
                        addr: i,
                        len: k as u64,
                        accesses: i * 3,
                        ..Default::default()
                    })
                    .collect();
                seg.publish_hot(&entries);
                let c = format!("GEN={i}\nCHECK={}\n", i * 7);
                seg.set_config(&c);
            }
        })
    };
    let mut seen = 0;
    while !w.is_finished() || seen == 0 {
        if let Some((hot, _)) = r.hot() {
            if let Some(first) = hot.first() {
                assert_eq!(
                    hot.len(),
                    (first.addr % 60) as usize + 1,
                    "mixed publications"
                );
                for (k, e) in hot.iter().enumerate() {
                    assert_eq!(
                        (e.addr, e.len, e.accesses),
                        (first.addr, k as u64, first.addr * 3)
                    );
                }
                seen += 1;
            }
        }
        if let Some(c) = r.config() {
            if let Some(rest) = c.strip_prefix("GEN=") {
                let (g, chk) = rest.trim_end().split_once("\nCHECK=").expect("whole text");
                assert_eq!(chk.parse::<u64>().unwrap(), g.parse::<u64>().unwrap() * 7);
            }
        }
    }
    w.join().unwrap();
    assert!(seen > 0);
}

#[test]
fn labels_and_pid_namespace_are_recorded() {
    let dir = scratch("labels");
    let env = |k: &str| match k {
        "RANK" => Some("3".to_string()),
        "LOCAL_RANK" => Some("1".to_string()),
        "WORLD_SIZE" => Some("8".to_string()),
        "POD_NAME" => Some("train-0".to_string()),
        "POD_NAMESPACE" => Some("ml".to_string()),
        "NODE_NAME" => Some(String::new()), // empty: falls back to the host name
        _ => None,
    };
    let mut labels = labels_from_env(&env);
    labels[LABEL_NAMES.iter().position(|n| *n == "run_id").unwrap()] = "x".repeat(100);
    let cfg = SegmentConfig {
        dir: dir.to_path_buf(),
        config_text: "U3M_MODE=observe",
        hook_names: HOOKS,
        class_names: CLASSES,
        labels,
    };
    let seg = StatsSegment::create(&cfg).unwrap();
    let r = reader::SegmentReader::open(seg.path()).unwrap();
    let s = r.snapshot();
    assert_eq!(s.layout, (LAYOUT_MAJOR, LAYOUT_MINOR));
    assert_eq!(s.label("rank"), "3");
    assert_eq!(s.label("local_rank"), "1");
    assert_eq!(s.label("world_size"), "8");
    assert_eq!(s.label("local_world_size"), "");
    assert_eq!(s.label("pod"), "train-0");
    assert_eq!(s.label("namespace"), "ml");
    assert_eq!(s.label("node"), host_name());
    assert!(!s.label("node").is_empty());
    assert_eq!(s.label("run_id").len(), LABEL_LEN - 1, "cut to fit");
    assert_eq!(s.label("nosuch"), "");
    assert!(!s.foreign_pid_ns, "same namespace");
    assert!(!r.foreign_pid_ns());
    assert_ne!(own_pid_ns(), 0);
}

#[test]
fn a_writer_in_another_pid_namespace_is_never_judged_by_its_pid() {
    let dir = scratch("pidns");
    let seg = create(&dir, "U3M_MODE=observe");
    let path = seg.path().to_path_buf();
    // a pid that does not exist here, from a namespace that is not ours
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&(i32::MAX as u32 - 7).to_le_bytes(), 28)
        .unwrap();
    let r = reader::SegmentReader::open(&path).unwrap();
    assert!(
        matches!(r.liveness(), Liveness::Dead(_)),
        "same namespace: checked by pid"
    );
    f.write_all_at(&(own_pid_ns() ^ 1).to_le_bytes(), 224)
        .unwrap();
    let r = reader::SegmentReader::open(&path).unwrap();
    assert!(r.foreign_pid_ns());
    assert_eq!(r.liveness(), Liveness::Alive);
    assert!(r.snapshot().foreign_pid_ns);
    drop(seg);
}

#[test]
fn last_update_is_the_newest_sign_of_life() {
    let dir = scratch("lastupdate");
    let seg = create(&dir, "U3M_MODE=observe");
    let r = reader::SegmentReader::open(seg.path()).unwrap();
    let s0 = r.snapshot();
    let start_ev = r.newest_event_ns();
    assert!(start_ev >= s0.start_mono_ns, "the start event");
    assert_eq!(s0.last_update_mono_ns(start_ev), start_ev);
    std::thread::sleep(std::time::Duration::from_millis(2));
    seg.publish_hot(&[]);
    let s1 = r.snapshot();
    assert!(s1.last_update_mono_ns(r.newest_event_ns()) > start_ev);
    assert_eq!(s1.last_update_mono_ns(0), s1.hot_published_ns);
}
