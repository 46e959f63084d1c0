//! Belady's MIN, the offline optimum (design.md §5): evict the chunk whose
//! next use is furthest in the future, a chunk never used again first. It
//! needs the future, so it exists only for `u3m replay`, which records the
//! (tick, key) access log in a first run and hands it over for the second.

use super::predictive::PREFETCH_TICKS;
use super::predictor::KeyMap;
use super::{Cand, Place, Placement};

pub struct Belady {
    /// Every key's access ticks, ascending.
    uses: KeyMap<Vec<u64>>,
    /// The whole log by tick: (tick, key), ascending (`upcoming`).
    by_tick: Vec<(u64, u64)>,
    prefetch: u64,
}

impl Belady {
    /// From the access log of the same trace: (tick, key), any order.
    pub fn new(log: Vec<(u64, u64)>) -> Belady {
        let mut uses: KeyMap<Vec<u64>> = KeyMap::default();
        let mut by_tick = log.clone();
        by_tick.sort_unstable();
        by_tick.dedup();
        for (t, k) in log {
            uses.entry(k).or_default().push(t);
        }
        for v in uses.values_mut() {
            v.sort_unstable();
            v.dedup();
        }
        Belady {
            uses,
            by_tick,
            prefetch: PREFETCH_TICKS,
        }
    }

    /// `place` says Hbm for chunks used within `ticks` (as the predictive
    /// policy's horizon, so both prefetch alike).
    pub fn with_prefetch_horizon(mut self, ticks: u64) -> Belady {
        self.prefetch = ticks;
        self
    }

    /// The first use of `key` after `now`.
    pub fn next_use(&self, now: u64, key: u64) -> Option<u64> {
        let v = self.uses.get(&key)?;
        v.get(v.partition_point(|&t| t <= now)).copied()
    }
}

impl Placement for Belady {
    fn name(&self) -> &'static str {
        "belady"
    }

    fn on_access(&self, _now: u64, _class: u8, _keys: &[u64], _writes: &[bool]) {}

    // the optimum is a property of the exact next uses at each eviction
    fn order_ttl(&self) -> u64 {
        0
    }

    fn order(&self, now: u64, cands: &mut [Cand]) {
        let mut v: Vec<(u64, Cand)> = cands
            .iter()
            .map(|c| (self.next_use(now, c.key).unwrap_or(u64::MAX), *c))
            .collect();
        // furthest next use first; among equals (never used again) clean first, then LRU
        v.sort_unstable_by(|a, b| {
            b.0.cmp(&a.0)
                .then(a.1.dirty.cmp(&b.1.dirty))
                .then(a.1.last.cmp(&b.1.last))
                .then(a.1.key.cmp(&b.1.key))
        });
        for (slot, (_, c)) in cands.iter_mut().zip(v) {
            *slot = c;
        }
    }

    fn next_use(&self, now: u64, key: u64) -> Option<u64> {
        Belady::next_use(self, now, key)
    }

    fn upcoming(&self, now: u64, d: u64, out: &mut Vec<(u64, u64)>) {
        let end = now.saturating_add(d);
        let from = self.by_tick.partition_point(|&(t, _)| t <= now);
        out.extend(
            self.by_tick[from..]
                .iter()
                .take_while(|&&(t, _)| t <= end)
                .copied(),
        );
    }

    fn predicts(&self, now: u64, key: u64, w: u64) -> bool {
        self.next_use(now, key)
            .is_some_and(|t| t <= now.saturating_add(w))
    }

    fn place(&self, now: u64, key: u64) -> Option<Place> {
        self.next_use(now, key)
            .filter(|&t| t <= now.saturating_add(self.prefetch))
            .map(|_| Place::Hbm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_furthest_next_use_and_never_used_first() {
        // a: 1, 10   b: 2, 5   c: 3   d: 4, 7
        let log = vec![
            (1, 0xa),
            (2, 0xb),
            (3, 0xc),
            (4, 0xd),
            (5, 0xb),
            (7, 0xd),
            (10, 0xa),
        ];
        let b = Belady::new(log);
        let mut c: Vec<Cand> = [0xa, 0xb, 0xc, 0xd]
            .iter()
            .map(|&k| Cand {
                key: k,
                last: 0,
                dirty: false,
            })
            .collect();
        b.order(4, &mut c);
        assert_eq!(
            c.iter().map(|c| c.key).collect::<Vec<_>>(),
            vec![0xc, 0xa, 0xd, 0xb]
        );
        b.order(7, &mut c);
        assert_eq!(
            c.iter().map(|c| c.key).collect::<Vec<_>>(),
            vec![0xb, 0xc, 0xd, 0xa],
            "never used again first"
        );
        assert!(b.predicts(4, 0xb, 1) && !b.predicts(4, 0xa, 5) && b.predicts(4, 0xa, 6));
        assert!(!b.predicts(3, 0xc, 1000));
        // when, exactly, through the trait
        let p: &dyn Placement = &b;
        assert_eq!(p.next_use(4, 0xa), Some(10));
        assert_eq!(p.next_use(3, 0xc), None);
        let mut up = Vec::new();
        p.upcoming(3, 4, &mut up);
        assert_eq!(up, vec![(4, 0xd), (5, 0xb), (7, 0xd)]);
        assert_eq!(b.place(8, 0xa), Some(Place::Hbm));
        assert_eq!(b.place(3, 0xc), None);
    }

    /// Faults of a fully associative cache of `cap` chunks under an order.
    fn faults(p: &dyn Placement, log: &[(u64, u64)], cap: usize) -> u64 {
        let mut res: Vec<Cand> = Vec::new();
        let mut f = 0;
        for &(t, k) in log {
            if let Some(c) = res.iter_mut().find(|c| c.key == k) {
                c.last = t;
            } else {
                f += 1;
                if res.len() == cap {
                    p.order(t - 1, &mut res);
                    res.remove(0);
                }
                res.push(Cand {
                    key: k,
                    last: t,
                    dirty: false,
                });
            }
            p.on_access(t, 0, &[k], &[false]);
        }
        f
    }

    #[test]
    fn never_beaten_on_random_traces() {
        let mut x = 7u64;
        for round in 0..20 {
            let mut log = Vec::new();
            for t in 1..=600u64 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let k = if x >> 62 == 0 {
                    (x >> 40) % 40
                } else {
                    (x >> 40) % 12
                };
                log.push((t, k));
            }
            let b = Belady::new(log.clone());
            let opt = faults(&b, &log, 8);
            let lru = faults(&super::super::Lru::new(), &log, 8);
            let pred = faults(&super::super::Predictive::new(), &log, 8);
            let mk = faults(&super::super::Markov::new(), &log, 8);
            assert!(
                opt <= lru && opt <= pred && opt <= mk,
                "round {round}: belady {opt} lru {lru} predictive {pred} markov {mk}"
            );
        }
    }
}
