//! `u3m replay --audit`: which chunks u3m moved in each phase of a training
//! step, per allocation tag, and which of its evictions it paid for again —
//! the chunk copied back in later (in the same phase: an eviction the phase
//! itself undid), with what the policy predicted for the chunk when it left.
//! Where `--held` says what HBM holds as each phase begins, this says which
//! evictions inside a phase cost a copy-in, and whether the policy saw it
//! coming (docs/replay.md).

use std::collections::{BTreeMap, HashMap};

use u3m_core::engine::runtime::CHUNK;
use u3m_core::residency::{Move, MoveKind};

/// One phase: from a `# train step` comment (or the trace's start) to the
/// next.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Phase {
    /// The comment's line and text ("start", line 0: before the first).
    pub line: u64,
    pub label: String,
    /// The logical clock (`Residency::now`) as the phase began and ended.
    pub from: u64,
    pub to: u64,
    pub by_tag: BTreeMap<String, Moved>,
}

/// Bytes moved in a phase, of one tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Copied in for a call that needed the chunk / ahead of use.
    pub in_demand: u64,
    pub in_prefetch: u64,
    /// Evicted, and of those copied out (dirty).
    pub out: u64,
    pub out_dirty: u64,
    /// Of the evicted: copied in again later in the run, and before this
    /// phase ended.
    pub back: u64,
    pub back_in_phase: u64,
    /// Of those back in the phase: the policy predicted the next use before
    /// the phase's end when it evicted the chunk (it knew, and took it
    /// anyway: every other candidate was needed sooner or in use) —
    pub back_in_phase_foreseen: u64,
    /// — or predicted it dead (written whole before any read), and a read
    /// brought it back.
    pub back_in_phase_taken_for_dead: u64,
}

/// A phase as the replay logs it: (line, label, the clock at its start),
/// and the moves logged while it ran.
pub type Logged = (u64, String, u64, Vec<Move>);

/// Builds the phases from the moves logged between marks (`end`: the clock
/// at the run's end). `tag_of` names a chunk key's allocation tag.
pub fn phases(logged: &[Logged], end: u64, tag_of: impl Fn(u64) -> String) -> Vec<Phase> {
    let mut out: Vec<Phase> = logged
        .iter()
        .enumerate()
        .map(|(p, (line, label, from, _))| Phase {
            line: *line,
            label: label.clone(),
            from: *from,
            to: logged.get(p + 1).map_or(end, |b| b.2),
            by_tag: BTreeMap::new(),
        })
        .collect();
    // per chunk key, its latest eviction not yet followed by a copy-in:
    // (phase, tag, the policy's prediction then)
    let mut left: HashMap<u64, (usize, String, Option<u64>)> = HashMap::new();
    for (p, (.., ms)) in logged.iter().enumerate() {
        for m in ms {
            let tag = tag_of(m.key);
            match m.kind {
                MoveKind::In { demand } => {
                    let e = out[p].by_tag.entry(tag).or_default();
                    if demand {
                        e.in_demand += CHUNK;
                    } else {
                        e.in_prefetch += CHUNK;
                    }
                    let Some((q, tag, next)) = left.remove(&m.key) else {
                        continue;
                    };
                    let to = out[q].to;
                    let e = out[q].by_tag.entry(tag).or_default();
                    e.back += CHUNK;
                    if q == p {
                        e.back_in_phase += CHUNK;
                        match next {
                            Some(u64::MAX) => e.back_in_phase_taken_for_dead += CHUNK,
                            Some(t) if t < to => e.back_in_phase_foreseen += CHUNK,
                            _ => {}
                        }
                    }
                }
                MoveKind::Out { dirty, next } => {
                    let e = out[p].by_tag.entry(tag.clone()).or_default();
                    e.out += CHUNK;
                    if dirty {
                        e.out_dirty += CHUNK;
                    }
                    left.insert(m.key, (p, tag, next));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(tick: u64, key: u64, kind: MoveKind) -> Move {
        Move { tick, key, kind }
    }

    /// Evictions undone in their own phase, later, or never; the policy's
    /// prediction at eviction sorts the ones undone in the phase.
    #[test]
    fn evictions_are_matched_to_the_copy_in_that_undid_them() {
        let out = |dirty, next| MoveKind::Out { dirty, next };
        let fetch = MoveKind::In { demand: true };
        let (a, b, c, d, e) = (CHUNK, 2 * CHUNK, 3 * CHUNK, 4 * CHUNK, 1 << 40);
        let logged = [
            (
                0,
                "start".to_string(),
                0,
                vec![
                    mv(1, a, out(true, Some(5))),         // back at 4: foreseen (5 < 10)
                    mv(2, b, out(false, Some(u64::MAX))), // back at 3: taken for dead
                    mv(2, c, out(false, Some(50))),       // back at 4, predicted after the phase
                    mv(3, b, fetch),
                    mv(4, a, fetch),
                    mv(4, c, fetch),
                    mv(5, d, out(true, None)),     // back in the next phase
                    mv(6, a, out(true, Some(20))), // never back
                ],
            ),
            (
                7,
                "train step 0: forward".to_string(),
                10,
                vec![mv(12, d, MoveKind::In { demand: false }), mv(13, e, fetch)],
            ),
        ];
        let ph = phases(
            &logged,
            30,
            |k| {
                if k == e {
                    "x".into()
                } else {
                    "w".into()
                }
            },
        );
        assert_eq!(
            (ph[0].from, ph[0].to, ph[1].from, ph[1].to),
            (0, 10, 10, 30)
        );
        let w = ph[0].by_tag["w"];
        assert_eq!(
            w,
            Moved {
                in_demand: 3 * CHUNK,
                in_prefetch: 0,
                out: 5 * CHUNK,
                out_dirty: 3 * CHUNK,
                back: 4 * CHUNK,
                back_in_phase: 3 * CHUNK,
                back_in_phase_foreseen: CHUNK,
                back_in_phase_taken_for_dead: CHUNK,
            }
        );
        assert_eq!(ph[1].by_tag["w"].in_prefetch, CHUNK);
        assert_eq!(
            ph[1].by_tag["w"].back, 0,
            "d's return counts in its eviction's phase"
        );
        assert_eq!(ph[1].by_tag["x"].in_demand, CHUNK);
        assert_eq!(ph[1].by_tag["x"].back, 0, "never evicted");
    }
}
