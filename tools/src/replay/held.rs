//! `u3m replay --held`: what u3m holds in HBM as each phase of a training
//! step begins — at every `# train step N: PHASE` comment (`u3m synth`
//! writes them), as the host issues the phase's first call — per
//! allocation tag, split by whether the trace reads the chunk's contents
//! again (live) or next writes it whole or frees it (dead), by whether
//! evicting it needs a copy-out (dirty), and by whether the policy foresees
//! it: predicts a whole write next (what its victim order weighs as dead). Set beside `bench/pipeline_bound.py
//! --held`, the same split for the bound's optimum, it shows what the
//! engine keeps that the optimum gives up, and the reverse.

use std::collections::{BTreeMap, HashMap};

use super::dead::{for_each_touch, ChunkTouch};
use super::drive::Trace;

/// Per chunk (device, trace address of its start), the events that touch
/// or free it, in order, and whether each needs its contents.
pub struct NextUse {
    touches: HashMap<(u32, u64), Vec<(usize, bool)>>,
}

impl NextUse {
    pub fn new(trace: &Trace) -> NextUse {
        let mut touches: HashMap<(u32, u64), Vec<(usize, bool)>> = HashMap::new();
        for_each_touch(trace, |k, dev, c, t| {
            touches
                .entry((dev, c))
                .or_default()
                .push((k, t == ChunkTouch::Reads));
        });
        NextUse { touches }
    }

    /// Whether the first event from `k` on that touches the chunk reads
    /// its contents (false: it writes it whole, frees it, or none does).
    pub fn live_from(&self, dev: u32, chunk: u64, k: usize) -> bool {
        let Some(v) = self.touches.get(&(dev, chunk)) else {
            return false;
        };
        let i = v.partition_point(|&(e, _)| e < k);
        v.get(i).is_some_and(|&(_, reads)| reads)
    }
}

/// The events a `# train step` comment precedes: (index of the first event
/// after it, its line, its text after `# `), in trace order; a comment after
/// the last event has none and is left out.
pub fn marks(trace: &Trace) -> Result<Vec<(usize, u64, String)>, String> {
    let text = std::fs::read_to_string(&trace.name).map_err(|e| format!("{}: {e}", trace.name))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some(label) = line.strip_prefix("# train step ") else {
            continue;
        };
        let lineno = n as u64 + 1;
        let k = trace.lines.partition_point(|&l| l < lineno);
        if k < trace.events.len() {
            out.push((k, lineno, format!("train step {}", label.trim())));
        }
    }
    Ok(out)
}

/// What HBM held at one mark.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Held {
    /// The comment's line and text.
    pub line: u64,
    pub label: String,
    /// Simulated host time then.
    pub host_ns: u64,
    /// Bytes per allocation tag ("-": untagged): live clean, live dirty,
    /// dead clean, dead dirty; then of the dead, those the policy foresees
    /// as dead (its next use of the chunk is a whole write), and of the
    /// live, those it takes for dead.
    pub by_tag: BTreeMap<String, [u64; 6]>,
}

impl Held {
    pub fn resident(&self) -> u64 {
        self.by_tag
            .values()
            .map(|b| b[..4].iter().sum::<u64>())
            .sum()
    }

    /// Counts one chunk of `bytes`; `foreseen`: the policy predicts a whole
    /// write next.
    pub fn add(&mut self, tag: &str, live: bool, dirty: bool, foreseen: bool, bytes: u64) {
        let b = self.by_tag.entry(tag.to_string()).or_default();
        b[(!live as usize) * 2 + dirty as usize] += bytes;
        if foreseen {
            b[4 + live as usize] += bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::dead::tests::trace_kept as trace;
    use super::*;

    #[test]
    fn a_chunk_is_live_until_its_last_read_and_dead_before_a_whole_write_or_free() {
        let t = trace(
            "# u3m-trace 1\n\
             A 0x10000000 4194304\n\
             S 0x10000000 4194304\n\
             # train step 0: forward\n\
             O Relu 1 1 0x10000000:1024 0x10200000:1024\n\
             # train step 0: backward\n\
             S 0x10000000 2097152\n\
             O Relu 1 1 0x10200000:1024 0x10200000:1024\n\
             F 0x10000000\n",
        );
        let n = NextUse::new(&t);
        // the memset (event 1) writes the first chunk whole, the op (event
        // 2) reads it, then it is written whole again
        assert!(!n.live_from(0, 0x10000000, 0));
        assert!(n.live_from(0, 0x10000000, 2));
        assert!(!n.live_from(0, 0x10000000, 3));
        // the second: written in part by event 2 (its other bytes are
        // still needed), read in place by event 4, then freed
        assert!(n.live_from(0, 0x10200000, 2));
        assert!(n.live_from(0, 0x10200000, 4));
        assert!(!n.live_from(0, 0x10200000, 5));
        assert!(!n.live_from(0, 0x10400000, 0), "never touched");
        let m = marks(&t).unwrap();
        assert_eq!(
            m,
            vec![
                (2, 4, "train step 0: forward".to_string()),
                (3, 6, "train step 0: backward".to_string())
            ]
        );
        let _ = std::fs::remove_file(&t.name);
    }

    #[test]
    fn held_sums_by_tag_and_state() {
        let mut h = Held::default();
        h.add("act", false, true, true, 2);
        h.add("act", false, true, false, 2);
        h.add("act", true, false, true, 2);
        h.add("weight", true, false, false, 2);
        assert_eq!(h.by_tag["act"], [2, 0, 0, 4, 2, 2]);
        assert_eq!(h.by_tag["weight"], [2, 0, 0, 0, 0, 0]);
        assert_eq!(h.resident(), 8);
    }
}
