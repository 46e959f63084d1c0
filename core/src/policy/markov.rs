//! The GMT-style baseline (design.md §5, docs/prediction.md): each chunk is
//! Hot, Warm or Cold by its latest reuse distance (ticks between its last two
//! accesses: Hot within H, Warm within 8H, Cold beyond); one first-order
//! Markov chain over those states, learned online from every chunk's
//! transitions (3×3 counts, global as in GMT), predicts each chunk's next
//! state. Eviction takes predicted-Cold before Warm before Hot, LRU within a
//! state; an evicted chunk predicted Cold goes to NVMe, bypassing DRAM.
//!
//! H is the running median of observed reuse distances (a frugal streaming
//! estimate in log space: ×1.02 when a reuse is longer, ÷1.02 when shorter),
//! unless fixed with [`Markov::with_hot_ticks`].

use std::sync::Mutex;

use super::predictor::KeyMap;
use super::{lru_order, Cand, Place, Placement, Touch};

pub const HOT: u8 = 0;
pub const WARM: u8 = 1;
pub const COLD: u8 = 2;
/// Warm reaches this many H.
const WARM_SPAN: f64 = 8.0;
const MEDIAN_STEP: f64 = 1.02;

#[derive(Clone, Copy)]
struct Chunk {
    last: u64,
    /// State by the latest reuse distance (HOT for a chunk seen once: it was
    /// just touched).
    state: u8,
}

struct Inner {
    chunks: KeyMap<Chunk>,
    trans: [[u64; 3]; 3],
    h: f64,
    fixed: bool,
}

impl Inner {
    fn classify(&self, d: u64) -> u8 {
        let d = d as f64;
        if d <= self.h {
            HOT
        } else if d <= WARM_SPAN * self.h {
            WARM
        } else {
            COLD
        }
    }

    /// The chain's most likely next state from `s` (ties: the hotter; no
    /// transition seen from `s` yet: `s` itself).
    fn next_state(&self, s: u8) -> u8 {
        let row = &self.trans[s as usize];
        if row.iter().all(|&n| n == 0) {
            return s;
        }
        let mut best = 0;
        for j in 1..3 {
            if row[j] > row[best] {
                best = j;
            }
        }
        best as u8
    }

    /// The predicted state of a chunk last used at `last`, demoted when the
    /// time already elapsed since `last` rules it out (a chunk idle for
    /// more than 8H cannot come back as Hot or Warm).
    fn predicted(&self, now: u64, c: &Chunk) -> u8 {
        let p = self.next_state(c.state);
        let idle = now.saturating_sub(c.last) as f64;
        let floor = if idle > WARM_SPAN * self.h {
            COLD
        } else if idle > self.h {
            WARM
        } else {
            HOT
        };
        p.max(floor)
    }
}

pub struct Markov {
    inner: Mutex<Inner>,
}

impl Default for Markov {
    fn default() -> Self {
        Self::new()
    }
}

impl Markov {
    /// H from the running median reuse distance.
    pub fn new() -> Markov {
        Markov {
            inner: Mutex::new(Inner {
                chunks: KeyMap::default(),
                trans: [[0; 3]; 3],
                h: 0.0,
                fixed: false,
            }),
        }
    }

    /// A fixed H (ticks).
    pub fn with_hot_ticks(h: u64) -> Markov {
        let m = Markov::new();
        if let Ok(mut g) = m.inner.lock() {
            g.h = h.max(1) as f64;
            g.fixed = true;
        }
        m
    }

    /// The current H, ticks.
    pub fn hot_ticks(&self) -> f64 {
        self.inner.lock().map(|g| g.h).unwrap_or(0.0)
    }

    /// The learned transition counts (from-state rows).
    pub fn transitions(&self) -> [[u64; 3]; 3] {
        self.inner.lock().map(|g| g.trans).unwrap_or_default()
    }
}

impl Placement for Markov {
    fn name(&self) -> &'static str {
        "markov"
    }

    fn on_access(&self, now: u64, _class: u8, keys: &[u64], _writes: &[Touch]) {
        let Ok(mut g) = self.inner.lock() else { return };
        let g = &mut *g;
        for &k in keys {
            let Some(c) = g.chunks.get(&k).copied() else {
                g.chunks.insert(
                    k,
                    Chunk {
                        last: now,
                        state: HOT,
                    },
                );
                continue;
            };
            if now <= c.last {
                continue;
            }
            let d = now - c.last;
            if !g.fixed {
                if g.h == 0.0 {
                    g.h = d as f64;
                } else if d as f64 > g.h {
                    g.h *= MEDIAN_STEP;
                } else if (d as f64) < g.h {
                    g.h = (g.h / MEDIAN_STEP).max(1.0);
                }
            }
            let s = g.classify(d);
            g.trans[c.state as usize][s as usize] += 1;
            g.chunks.insert(
                k,
                Chunk {
                    last: now,
                    state: s,
                },
            );
        }
    }

    fn on_free(&self, key: u64) {
        if let Ok(mut g) = self.inner.lock() {
            g.chunks.remove(&key);
        }
    }

    fn order(&self, now: u64, cands: &mut [Cand]) {
        let Ok(g) = self.inner.lock() else {
            return lru_order(cands);
        };
        let mut v: Vec<(u8, Cand)> = Vec::with_capacity(cands.len());
        for c in cands.iter() {
            let s = match g.chunks.get(&c.key) {
                Some(ch) => g.predicted(
                    now,
                    &Chunk {
                        last: ch.last.max(c.last),
                        state: ch.state,
                    },
                ),
                None => COLD,
            };
            v.push((s, *c));
        }
        drop(g);
        v.sort_unstable_by(|a, b| {
            b.0.cmp(&a.0)
                .then(a.1.last.cmp(&b.1.last))
                .then(a.1.key.cmp(&b.1.key))
        });
        for (slot, (_, c)) in cands.iter_mut().zip(v) {
            *slot = c;
        }
    }

    /// Hot: the next access falls within H of the last; Warm: between H and
    /// 8H after it; Cold: not within 8H — "not soon", never predicted. True
    /// when the predicted interval meets (now, now + w].
    fn predicts(&self, now: u64, key: u64, w: u64) -> bool {
        let Ok(g) = self.inner.lock() else {
            return false;
        };
        let Some(c) = g.chunks.get(&key) else {
            return false;
        };
        let (lo, hi) = match g.predicted(now, c) {
            HOT => (0.0, g.h),
            WARM => (g.h, WARM_SPAN * g.h),
            _ => return false,
        };
        let (a, b) = (c.last as f64 + lo, c.last as f64 + hi);
        (now as f64) < b && (now.saturating_add(w) as f64) > a
    }

    /// Predicted Cold: NVMe (an evicted chunk bypasses DRAM); else no opinion.
    fn place(&self, now: u64, key: u64) -> Option<Place> {
        let g = self.inner.lock().ok()?;
        let c = g.chunks.get(&key)?;
        (g.predicted(now, c) == COLD).then_some(Place::Nvme)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB2: u64 = 2 << 20;

    #[test]
    fn median_reuse_sets_h_and_states() {
        let m = Markov::new();
        // 10 hot chunks every 10 ticks
        for t in 0..5000u64 {
            m.on_access(t + 1, 0, &[(t % 10) * MB2], &[Touch::READ]);
        }
        let h = m.hot_ticks();
        assert!((9.0..=11.0).contains(&h), "{h}");
        assert!(m.predicts(5000, 0, 10));
        let tr = m.transitions();
        assert!(tr[HOT as usize][HOT as usize] > 4000, "{tr:?}");
    }

    #[test]
    fn cold_first_then_warm_then_hot_lru_within() {
        let m = Markov::with_hot_ticks(10);
        let mut t = 0;
        // hot: keys 1,2 every 5 ticks; warm: key 3 every 40; cold: key 4 every 200
        for _ in 0..20 {
            for _ in 0..40 {
                t += 5;
                m.on_access(t, 0, &[MB2, 2 * MB2], &[Touch::READ; 2]);
                if t % 40 == 0 {
                    m.on_access(t, 0, &[3 * MB2], &[Touch::READ]);
                }
                if t % 200 == 0 {
                    m.on_access(t, 0, &[4 * MB2], &[Touch::READ]);
                }
            }
        }
        let now = t;
        let mut c: Vec<Cand> = [1u64, 2, 3, 4]
            .iter()
            .map(|&k| Cand {
                key: k * MB2,
                last: now - k,
                dirty: false,
            })
            .collect();
        m.order(now, &mut c);
        assert_eq!(
            c.iter().map(|c| c.key / MB2).collect::<Vec<_>>(),
            vec![4, 3, 2, 1]
        );
        assert_eq!(
            m.place(now, 4 * MB2),
            Some(Place::Nvme),
            "predicted cold bypasses DRAM"
        );
        assert_eq!(m.place(now, 3 * MB2), None);
        assert_eq!(m.place(now, MB2), None);
        assert!(!m.predicts(now, 4 * MB2, 50));
        assert!(m.predicts(now, 3 * MB2, 50) && !m.predicts(now, 3 * MB2, 5));
        assert!(m.predicts(now, MB2, 5));
    }

    #[test]
    fn a_hot_chunk_left_idle_is_demoted() {
        let m = Markov::with_hot_ticks(10);
        for t in 1..100u64 {
            m.on_access(t * 5, 0, &[MB2], &[Touch::READ]);
        }
        assert_eq!(m.place(495 + 5, MB2), None);
        assert_eq!(m.place(495 + 81, MB2), Some(Place::Nvme));
        assert!(!m.predicts(495 + 81, MB2, 1000));
    }
}
