//! The recorder: many threads, multi-slot ops, drops, flushes (also from a
//! fatal-signal handler in a child process), VMM mappings, repairs, fork.

use std::path::PathBuf;
use std::sync::OnceLock;

use u3m_core::trace::recorder::{Slot, NAME_INLINE, RANGES_PER_SLOT};
use u3m_core::trace::{read_file, Body, CopyKind, Event, Range, Rec, Recorder, RecorderConfig};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("u3m-trace-rec-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn quiet(capacity: usize, lossless: bool) -> RecorderConfig {
    RecorderConfig {
        capacity,
        lossless,
        report: false,
        ..RecorderConfig::default()
    }
}

fn strip_t(mut e: Event) -> Event {
    e.t = None;
    e
}

/// What thread `k` records: its own device-address region, ops of 0..=19
/// ranges (so up to 3 slots each), copies of every kind, memsets, frees.
fn thread_events(k: u32, n: usize) -> Vec<Event> {
    let base = 0x1_0000_0000u64 * (k as u64 + 1);
    let mut evs = Vec::new();
    let mut i = 0u64;
    while evs.len() < n {
        let a = base + (i % 16) * 0x10_0000;
        evs.push(Event::alloc(a, 0x10_0000));
        let nr = (i % 20) as usize;
        let ranges: Vec<Range> = (0..nr as u64)
            .map(|j| Range::new(a + j * 64, 64 + j))
            .collect();
        let n_in = nr / 2;
        let mut op = Event::op(&format!("Op{}", i % 7), &ranges[..n_in], &ranges[n_in..]);
        if i.is_multiple_of(3) {
            op.flops = Some(i * 1000);
        }
        evs.push(op);
        evs.push(Event::copy(
            CopyKind::ALL[(i % 4) as usize],
            a + 8,
            a + 16,
            32,
        ));
        evs.push(Event::set(a + 100, 28));
        evs.push(Event::free(a));
        i += 1;
    }
    evs.truncate(n);
    // keep it valid: free whatever the truncation left allocated
    let live: Vec<u64> = {
        let mut l = std::collections::BTreeSet::new();
        for e in &evs {
            match e.body {
                Body::Alloc { addr, .. } => {
                    l.insert(addr);
                }
                Body::Free { addr } => {
                    l.remove(&addr);
                }
                _ => {}
            }
        }
        l.into_iter().collect()
    };
    evs.extend(live.into_iter().map(Event::free));
    evs.into_iter().map(|e| e.on_stream(k + 1)).collect()
}

#[test]
fn slots_are_small_fixed_records() {
    assert!(
        std::mem::size_of::<Slot>() <= 320,
        "{}",
        std::mem::size_of::<Slot>()
    );
    const { assert!(NAME_INLINE >= 48 && RANGES_PER_SLOT >= 4) };
}

#[test]
fn eight_threads_lossless_through_a_tiny_queue() {
    let path = tmp("mt.trace");
    // 32 slots: producers must wait for the writer all the time
    let rec = Recorder::start_with(&path, quiet(32, true)).unwrap();
    let per: Vec<Vec<Event>> = (0..8).map(|k| thread_events(k, 3000)).collect();
    std::thread::scope(|s| {
        for evs in &per {
            let rec = &rec;
            s.spawn(move || {
                for e in evs {
                    rec.record_event(e);
                }
            });
        }
    });
    let st = rec.stop();
    let total: usize = per.iter().map(Vec::len).sum();
    assert_eq!((st.dropped, st.repaired, st.written), (0, 0, total as u64));
    let back = read_file(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back.len(), total);
    for (k, evs) in per.iter().enumerate() {
        let mine: Vec<Event> = back
            .iter()
            .filter(|e| e.stream == k as u32 + 1)
            .cloned()
            .collect();
        let ts: Vec<u64> = mine
            .iter()
            .map(|e| e.t.expect("t= on every event"))
            .collect();
        assert!(
            ts.windows(2).all(|w| w[0] <= w[1]),
            "thread {k}: t goes backwards"
        );
        let mine: Vec<Event> = mine.into_iter().map(strip_t).collect();
        assert_eq!(&mine, evs, "thread {k}'s events, in its order");
    }
    // several threads' records really did interleave
    let switches = back
        .windows(2)
        .filter(|w| w[0].stream != w[1].stream)
        .count();
    assert!(switches > 8, "only {switches} switches between threads");
}

#[test]
fn a_full_queue_drops_and_counts() {
    let path = tmp("drop.trace");
    let rec = Recorder::start_with(&path, quiet(16, false)).unwrap();
    rec.pause_writer(true);
    rec.record(
        0,
        0,
        Rec::Alloc {
            addr: 0x1000,
            bytes: 4096,
        },
    );
    for i in 0..100u64 {
        rec.record(
            0,
            0,
            Rec::Set {
                addr: 0x1000 + i,
                bytes: 1,
            },
        );
    }
    // an op of 3 slots no longer fits whole: dropped, not cut
    let ranges = vec![Range::new(0x1000, 8); 2 * RANGES_PER_SLOT + 1];
    rec.record(
        0,
        0,
        Rec::Op {
            op_type: b"Big",
            inputs: &ranges,
            outputs: &[],
            flops: None,
        },
    );
    assert_eq!(rec.stats().dropped, 101 + 1 - 16);
    rec.pause_writer(false);
    assert!(rec.flush());
    rec.record(0, 0, Rec::Free { addr: 0x1000 });
    let st = rec.stop();
    assert_eq!((st.dropped, st.written), (86, 17));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\n# dropped 86 events\n"), "{text}");
    assert_eq!(read_file(&path).unwrap().len(), 17);
}

#[test]
fn an_op_larger_than_the_queue_is_dropped_even_lossless() {
    let path = tmp("huge-op.trace");
    let rec = Recorder::start_with(&path, quiet(4, true)).unwrap();
    rec.record(
        0,
        0,
        Rec::Alloc {
            addr: 0x1000,
            bytes: 4096,
        },
    );
    let ranges = vec![Range::new(0x1000, 8); 5 * RANGES_PER_SLOT];
    rec.record(
        0,
        0,
        Rec::Op {
            op_type: b"Huge",
            inputs: &ranges,
            outputs: &ranges,
            flops: None,
        },
    );
    let fits = vec![Range::new(0x1800, 16); 4 * RANGES_PER_SLOT];
    rec.record(
        0,
        0,
        Rec::Op {
            op_type: b"Fits",
            inputs: &fits[..5],
            outputs: &fits[5..],
            flops: Some(7),
        },
    );
    let st = rec.stop();
    assert_eq!((st.dropped, st.written), (1, 2));
    let back = read_file(&path).unwrap();
    assert_eq!(
        strip_t(back[1].clone()),
        Event::op("Fits", &fits[..5], &fits[5..]).with_flops(7)
    );
}

#[test]
fn flush_makes_everything_recorded_so_far_visible() {
    let path = tmp("flush.trace");
    let rec = Recorder::start_with(&path, quiet(1024, false)).unwrap();
    for i in 0..500u64 {
        rec.record(
            0,
            0,
            Rec::Alloc {
                addr: 0x1000 * (i + 1),
                bytes: 16,
            },
        );
    }
    assert!(rec.flush());
    assert_eq!(read_file(&path).unwrap().len(), 500, "before stop");
    assert!(
        rec.flush_from_signal(),
        "the signal-path flush, from a plain thread"
    );
    rec.stop();
    rec.record(0, 0, Rec::Free { addr: 0x1000 });
    assert!(!rec.flush_from_signal());
    assert_eq!(
        read_file(&path).unwrap().len(),
        500,
        "records after stop are ignored"
    );
}

#[test]
fn op_types_become_words_and_long_ones_are_cut() {
    let path = tmp("names.trace");
    let rec = Recorder::start_with(&path, quiet(64, true)).unwrap();
    rec.record(
        0,
        0,
        Rec::Alloc {
            addr: 0x1000,
            bytes: 64,
        },
    );
    rec.record(
        0,
        0,
        Rec::Op {
            op_type: b"a b=c\n\xff",
            inputs: &[],
            outputs: &[],
            flops: None,
        },
    );
    rec.record(
        0,
        0,
        Rec::Op {
            op_type: b"",
            inputs: &[],
            outputs: &[],
            flops: None,
        },
    );
    let long = "L".repeat(100);
    rec.record(
        0,
        0,
        Rec::Op {
            op_type: long.as_bytes(),
            inputs: &[],
            outputs: &[],
            flops: None,
        },
    );
    rec.stop();
    let names: Vec<String> = read_file(&path)
        .unwrap()
        .into_iter()
        .filter_map(|e| {
            if let Body::Op { op_type, .. } = e.body {
                Some(op_type)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        names,
        [
            "a_b_c_\u{fffd}".to_string(),
            "_".to_string(),
            "L".repeat(NAME_INLINE)
        ]
    );
}

#[test]
fn vmm_mappings_become_runs_of_contiguous_allocations() {
    let path = tmp("vmm.trace");
    let rec = Recorder::start_with(&path, quiet(256, true)).unwrap();
    let seg = 0x20_0000u64;
    let va = 0x40_0000_0000u64; // a reservation: nothing recorded for it
    rec.record(
        0,
        0,
        Rec::Map {
            addr: va,
            bytes: seg,
        },
    );
    rec.record(
        0,
        0,
        Rec::Map {
            addr: va + seg,
            bytes: seg,
        },
    ); // extends the run
       // a tensor across both physical handles
    let t = Range::new(va + seg - 512, 1024);
    rec.record(
        0,
        1,
        Rec::Op {
            op_type: b"Relu",
            inputs: &[t],
            outputs: &[t],
            flops: None,
        },
    );
    rec.record(
        0,
        0,
        Rec::Map {
            addr: va + 3 * seg,
            bytes: seg,
        },
    ); // a separate run
    rec.record(
        0,
        0,
        Rec::Map {
            addr: va + 2 * seg,
            bytes: seg,
        },
    ); // joins the two
    rec.record(0, 0, Rec::Unmap { addr: va + seg }); // splits it
    rec.record(0, 0, Rec::Unmap { addr: va });
    rec.record(0, 0, Rec::Unmap { addr: va + 3 * seg });
    rec.record(0, 0, Rec::Unmap { addr: va + 2 * seg });
    let st = rec.stop();
    assert_eq!(st.repaired, 0);
    let lines: Vec<String> = read_file(&path)
        .unwrap()
        .into_iter()
        .map(|e| strip_t(e).to_string())
        .collect();
    let want = [
        "A 0x4000000000 2097152 tag=vmm",
        "F 0x4000000000",
        "A 0x4000000000 4194304 tag=vmm",
        "O Relu 1 1 0x40001ffe00:1024 0x40001ffe00:1024 stream=1",
        "A 0x4000600000 2097152 tag=vmm",
        "F 0x4000000000",
        "F 0x4000600000",
        "A 0x4000000000 8388608 tag=vmm",
        "F 0x4000000000",
        "A 0x4000000000 2097152 tag=vmm",
        "A 0x4000400000 4194304 tag=vmm",
        "F 0x4000000000",
        "F 0x4000400000",
        "A 0x4000400000 2097152 tag=vmm",
        "F 0x4000400000",
    ];
    assert_eq!(lines, want);
}

#[test]
fn what_cannot_be_valid_is_repaired_and_noted() {
    let path = tmp("repair.trace");
    let rec = Recorder::start_with(&path, quiet(256, true)).unwrap();
    rec.record(0, 0, Rec::Free { addr: 0x5000 }); // never allocated
    rec.record(
        0,
        0,
        Rec::Alloc {
            addr: 0x1000,
            bytes: 0x1000,
        },
    );
    rec.record(
        0,
        0,
        Rec::Alloc {
            addr: 0x1800,
            bytes: 0x1000,
        },
    ); // its free was missed
    let r = [Range::new(0x1800, 16), Range::new(0x9000, 16)];
    rec.record(
        0,
        0,
        Rec::Op {
            op_type: b"Mix",
            inputs: &r,
            outputs: &[],
            flops: None,
        },
    );
    rec.record(
        0,
        0,
        Rec::Copy {
            kind: CopyKind::H2D,
            dst: 0x9000,
            src: 0x7f00,
            bytes: 4,
        },
    );
    rec.record(
        0,
        0,
        Rec::CopyAuto {
            dst: 0x7f00,
            src: 0x1800,
            bytes: 4,
        },
    );
    rec.record(0, 0, Rec::Unmap { addr: 0x1800 });
    let st = rec.stop();
    assert_eq!(st.repaired, 5);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.split(" t=").next().unwrap())
        .collect();
    assert_eq!(
        lines,
        [
            "# u3m-trace 1",
            "# u3m: F 0x5000 on device 0: not the start of a live allocation: left out",
            "A 0x1000 4096",
            "# u3m: A 0x1800 4096 overlaps the live allocation 0x1000 4096: freed here",
            "F 0x1000",
            "A 0x1800 4096",
            "# u3m: O Mix: 1 range(s) outside every live allocation left out",
            "O Mix 1 0 0x1800:16",
            "# u3m: M H2D 0x9000 0x7f00 4: device side outside every live allocation: left out",
            "M D2H 0x7f00 0x1800 4",
            "# u3m: unmap 0x1800 on device 0: no mapping starts there: left out",
            "# u3m: repaired 5 events in all",
        ]
    );
}

#[test]
fn a_fork_child_records_nothing() {
    let path = tmp("fork.trace");
    let rec = Recorder::start_with(&path, quiet(64, true)).unwrap();
    rec.record(
        0,
        0,
        Rec::Alloc {
            addr: 0x1000,
            bytes: 1,
        },
    );
    rec.flush();
    rec.forget_after_fork(); // as the interposer's atfork child handler would
    rec.record(0, 0, Rec::Free { addr: 0x1000 });
    assert!(!rec.flush_from_signal());
    let st = rec.stop();
    assert_eq!(st.written, 1);
    assert_eq!(read_file(&path).unwrap().len(), 1);
}

static CRASH_REC: OnceLock<Recorder> = OnceLock::new();

extern "C" fn on_fatal(sig: libc::c_int) {
    if let Some(r) = CRASH_REC.get() {
        r.flush_from_signal();
    }
    // SAFETY: restoring the default action and re-raising are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Runs only as the child of `a_fatal_signal_flushes_what_was_recorded`.
#[test]
fn crash_child() {
    let Ok(path) = std::env::var("U3M_TEST_CRASH_TRACE") else {
        return;
    };
    let rec = CRASH_REC.get_or_init(|| Recorder::start_with(&path, quiet(1 << 16, true)).unwrap());
    // SAFETY: installing a handler for SIGSEGV.
    unsafe { libc::signal(libc::SIGSEGV, on_fatal as *const () as libc::sighandler_t) };
    for i in 0..20_000u64 {
        rec.record(
            0,
            0,
            Rec::Alloc {
                addr: 0x1000 * (i + 1),
                bytes: 8,
            },
        );
    }
    // SAFETY: raising a signal at ourselves; the handler flushes and dies.
    unsafe { libc::raise(libc::SIGSEGV) };
    unreachable!("survived SIGSEGV");
}

#[test]
fn a_fatal_signal_flushes_what_was_recorded() {
    use std::os::unix::process::ExitStatusExt;
    let path = tmp("crash.trace");
    let _ = std::fs::remove_file(&path);
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env("U3M_TEST_CRASH_TRACE", &path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status:?}");
    let evs = read_file(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        evs.len(),
        20_000,
        "every event recorded before the crash is in the file"
    );
}
