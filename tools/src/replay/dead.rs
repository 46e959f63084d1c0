//! The discard what-if (`u3m replay --discard-dead`): where a program that
//! knows its buffers' lifetimes — a framework whose caching allocator frees
//! a block — would call `u3m_discard` (docs/api.md). Read off the whole
//! trace: after event k, the chunks that k accessed last before a call
//! writes them whole; their contents are dead in between.

use std::collections::{BTreeMap, HashMap};

use u3m_core::engine::runtime::CHUNK;
use u3m_core::trace::Body;

use super::access;
use super::drive::Trace;

/// Per event: the chunks dead after it, as (device, trace address of the
/// chunk's start; chunks are counted from each allocation's start, as the
/// Tier counts them).
pub fn dead_after(trace: &Trace) -> Vec<Vec<(u32, u64)>> {
    let mut dead: Vec<Vec<(u32, u64)>> = vec![Vec::new(); trace.events.len()];
    // (device, chunk) -> the last event that accessed it
    let mut last: HashMap<(u32, u64), usize> = HashMap::new();
    for_each_touch(trace, |k, dev, c, t| match t {
        // freed: dead for good, the free itself gives the memory back
        ChunkTouch::Freed => {
            last.remove(&(dev, c));
        }
        t => {
            if let Some(p) = last.insert((dev, c), k) {
                if t == ChunkTouch::Whole {
                    dead[p].push((dev, c));
                }
            }
        }
    });
    dead
}

/// What an event does to one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkTouch {
    /// Reads it, or writes only part of it: its contents are needed.
    Reads,
    /// Only writes it whole: its old contents are not.
    Whole,
    /// Frees its allocation.
    Freed,
}

/// Calls `f(event, device, chunk, touch)` for every chunk each event
/// touches (once per event) or frees, in trace order; chunks are named by
/// the trace address of their start, counted from each allocation's start
/// (an allocation's last chunk ends with it, so a write of its tail is
/// whole).
pub fn for_each_touch(trace: &Trace, mut f: impl FnMut(usize, u32, u64, ChunkTouch)) {
    // per device: allocation start -> bytes
    let mut allocs: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); trace.devices];
    // per chunk of this event: whether the event only wrote it whole
    let mut here: BTreeMap<u64, bool> = BTreeMap::new();
    for (k, ev) in trace.events.iter().enumerate() {
        let dev = ev.dev;
        let al = &mut allocs[dev as usize];
        match &ev.body {
            Body::Alloc { addr, bytes } => {
                al.insert(*addr, *bytes);
                continue;
            }
            Body::Free { addr } => {
                if let Some(b) = al.remove(addr) {
                    let mut c = *addr;
                    while c < addr + b {
                        f(k, dev, c, ChunkTouch::Freed);
                        c += CHUNK;
                    }
                }
                continue;
            }
            _ => {}
        }
        here.clear();
        for (a, b, fl) in access::ranges(&ev.body) {
            let whole = fl == access::W;
            let Some((&s, &len)) = al.range(..=a).next_back() else {
                continue;
            };
            if b == 0 || a >= s + len {
                continue;
            }
            let mut c = s + (a - s) / CHUNK * CHUNK;
            while c < a + b {
                // the allocation's last chunk ends with the allocation
                let end = (c + CHUNK).min(s + len);
                let e = here.entry(c).or_insert(true);
                *e = *e && whole && a <= c && a + b >= end;
                c += CHUNK;
            }
        }
        for (&c, &whole) in &here {
            let t = if whole {
                ChunkTouch::Whole
            } else {
                ChunkTouch::Reads
            };
            f(k, dev, c, t);
        }
    }
}

/// Per event, the blocks freed right after it: (trace address, bytes).
pub type Frees = Vec<Vec<(u64, u64)>>;

/// Per event: the blocks the program's caching allocator freed right after
/// it, (trace address, bytes) on device 0 — the `# free ADDR BYTES`
/// comments of `u3m synth --frees` (`u3m replay --discard-frees`; what
/// torch_npu reports to libu3m.so under U3M_TORCH_HINTS=on, and `acl_replay
/// --frees` plays). A comment that is not `# free <0xaddr> <bytes>` is
/// an error naming its line.
pub fn frees_after(trace: &Trace) -> Result<Frees, String> {
    let text = std::fs::read_to_string(&trace.name).map_err(|e| format!("{}: {e}", trace.name))?;
    let mut frees: Frees = vec![Vec::new(); trace.events.len()];
    for (n, line) in text.lines().enumerate() {
        // tokens as acl_replay splits them (spaces and tabs, leading ones
        // too), so both play the same comments
        let mut t = line.split([' ', '\t']).filter(|t| !t.is_empty());
        if (t.next(), t.next()) != (Some("#"), Some("free")) {
            continue;
        }
        let lineno = n as u64 + 1;
        let bad = || {
            format!(
                "{}:{lineno}: expected '# free <0xaddr> <bytes>'",
                trace.name
            )
        };
        let (Some(a), Some(b), None) = (t.next(), t.next(), t.next()) else {
            return Err(bad());
        };
        let a = a
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or_else(bad)?;
        let b: u64 = b.parse().map_err(|_| bad())?;
        // after the last event on an earlier line
        let k = trace.lines.partition_point(|&l| l < lineno);
        if k == 0 {
            return Err(format!("{}:{lineno}: a free before any event", trace.name));
        }
        frees[k - 1].push((a, b));
    }
    Ok(frees)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The trace in `text`, read as `u3m replay` reads a file, and the file
    /// (one of its own per call: the tests run in parallel), kept for what
    /// reads it again; the caller removes it.
    pub fn trace_kept(text: &str) -> Trace {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("u3m-trace-{}-{n}.trace", std::process::id()));
        std::fs::write(&path, text).unwrap();
        crate::replay::load(&path).unwrap()
    }

    /// The trace in `text` (its file removed).
    fn trace(text: &str) -> Trace {
        let t = trace_kept(text);
        let _ = std::fs::remove_file(&t.name);
        t
    }

    /// `frees_after` on `text`.
    fn frees(text: &str) -> Result<Vec<Vec<(u64, u64)>>, String> {
        let t = trace_kept(text);
        let f = frees_after(&t);
        let _ = std::fs::remove_file(&t.name);
        f
    }

    #[test]
    fn a_free_comment_follows_the_event_before_it() {
        let f = frees(
            "# u3m-trace 1\n\
             # a comment that is no free\n\
             A 0x10000000 4194304\n\
             O Relu 1 1 0x10000000:1024 0x10000400:1024\n\
             # free 0x10000000 1024\n\
             # free 0x10000400 1024\n\
             S 0x10200000 2097152\n\
             # free 0x10200000 2097152\n",
        )
        .unwrap();
        assert_eq!(
            f,
            vec![
                vec![],
                vec![(0x10000000, 1024), (0x10000400, 1024)],
                vec![(0x10200000, 2097152)]
            ]
        );
    }

    #[test]
    fn a_free_comment_is_split_on_spaces_and_tabs_as_acl_replay_splits_it() {
        let f = frees(
            "# u3m-trace 1\n\
             A 0x10000000 4194304\n\
             \t#\tfree  0x10000000\t1024\n\
             #free 0x10000400 1024\n",
        )
        .unwrap();
        // the second is another comment: its first token is `#free`
        assert_eq!(f, vec![vec![(0x10000000, 1024)]]);
        let e = frees("# u3m-trace 1\nA 0x10000000 4194304\n  # free\n").unwrap_err();
        assert!(e.ends_with(":3: expected '# free <0xaddr> <bytes>'"), "{e}");
    }

    #[test]
    fn a_malformed_or_early_free_names_its_line() {
        let e = frees("# u3m-trace 1\nA 0x10000000 4194304\n# free 10000000 1024\n").unwrap_err();
        assert!(e.ends_with(":3: expected '# free <0xaddr> <bytes>'"), "{e}");
        let e =
            frees("# u3m-trace 1\nA 0x10000000 4194304\n# free 0x10000000 1024 9\n").unwrap_err();
        assert!(e.contains(":3:"), "{e}");
        let e = frees("# u3m-trace 1\n# free 0x10000000 1024\nA 0x10000000 4194304\n").unwrap_err();
        assert!(e.ends_with(":2: a free before any event"), "{e}");
    }

    #[test]
    fn a_chunk_is_dead_from_its_last_read_to_its_next_whole_write() {
        // two chunks; the second is written whole by the last memset, the
        // first only in part (its old bytes are still needed)
        let t = trace(
            "# u3m-trace 1\n\
             A 0x10000000 4194304\n\
             S 0x10000000 4194304\n\
             O Relu 1 1 0x10000000:1024 0x10000400:1024\n\
             O Relu 1 1 0x10200000:1024 0x10200000:1024\n\
             S 0x10000000 1024\n\
             S 0x10200000 2097152\n",
        );
        let d = dead_after(&t);
        // event 3 (the in-place op) read the second chunk last before event 5
        assert_eq!(d[3], vec![(0, 0x10200000)]);
        // the first chunk is next written only in part: never dead
        assert!(d.iter().flatten().all(|&(_, c)| c != 0x10000000), "{d:?}");
        assert_eq!(d.iter().map(Vec::len).sum::<usize>(), 1, "{d:?}");
    }

    #[test]
    fn a_free_ends_the_chunk_and_the_last_chunk_ends_with_its_allocation() {
        // 3 MiB: the second chunk is 1 MiB long; a write of that 1 MiB is whole
        let t = trace(
            "# u3m-trace 1\n\
             A 0x10000000 3145728\n\
             S 0x10000000 3145728\n\
             S 0x10200000 1048576\n\
             F 0x10000000\n\
             A 0x10000000 3145728\n\
             S 0x10000000 3145728\n",
        );
        let d = dead_after(&t);
        assert_eq!(d[1], vec![(0, 0x10200000)], "{d:?}");
        // after the free, the new allocation's first writes kill nothing
        assert!(d[2].is_empty() && d[4].is_empty(), "{d:?}");
    }
}
