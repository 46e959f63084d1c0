//! Belady's MIN, the offline optimum (design.md §5): evict the chunk whose
//! next use is furthest in the future, a chunk never used again first. It
//! needs the future, so it exists only for `u3m replay`, which records the
//! (tick, key, touch) access log in a first run and hands it over for the
//! second.
//!
//! A use that writes the chunk whole ([`Touch::WHOLE`]) needs none of its
//! contents (the engine skips its copy-in): for eviction a chunk whose next
//! use is one is as good as never used again (`bench/min_whole.py` is this
//! MIN on the trace alone), and nothing is copied in ahead of one.

use super::predictive::PREFETCH_TICKS;
use super::predictor::KeyMap;
use super::{Cand, Place, Placement, Touch};

pub struct Belady {
    /// Every key's access ticks, ascending, each with whether it wrote the
    /// chunk whole.
    uses: KeyMap<Vec<(u64, bool)>>,
    /// The log by tick: (tick, key), ascending, of the uses that need the
    /// chunk's contents (`upcoming`).
    by_tick: Vec<(u64, u64)>,
    prefetch: u64,
}

impl Belady {
    /// From the access log of the same trace: (tick, key), any order, every
    /// use a read.
    pub fn new(log: Vec<(u64, u64)>) -> Belady {
        Belady::with_touches(log.into_iter().map(|(t, k)| (t, k, Touch::READ)).collect())
    }

    /// From the access log of the same trace: (tick, key, how the use
    /// touched it), any order. A key used twice at one tick is written
    /// whole there only if both say so.
    pub fn with_touches(mut log: Vec<(u64, u64, Touch)>) -> Belady {
        log.sort_unstable_by_key(|&(t, k, _)| (k, t));
        let mut uses: KeyMap<Vec<(u64, bool)>> = KeyMap::default();
        let mut by_tick = Vec::with_capacity(log.len());
        for (t, k, touch) in log {
            let v = uses.entry(k).or_default();
            match v.last_mut() {
                Some(u) if u.0 == t => u.1 &= touch.whole(),
                _ => v.push((t, touch.whole())),
            }
        }
        for (&k, v) in &uses {
            by_tick.extend(v.iter().filter(|u| !u.1).map(|u| (u.0, k)));
        }
        by_tick.sort_unstable();
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

    /// The first use of `key` after `now`: (tick, it writes the chunk
    /// whole).
    fn next(&self, now: u64, key: u64) -> Option<(u64, bool)> {
        let v = self.uses.get(&key)?;
        v.get(v.partition_point(|u| u.0 <= now)).copied()
    }

    /// The first use of `key` after `now`.
    pub fn next_use(&self, now: u64, key: u64) -> Option<u64> {
        self.next(now, key).map(|u| u.0)
    }

    /// The first use of `key` after `now` that needs its contents:
    /// u64::MAX when that is a whole write, None when there is none.
    pub fn next_need(&self, now: u64, key: u64) -> Option<u64> {
        self.next(now, key)
            .map(|(t, whole)| if whole { u64::MAX } else { t })
    }
}

impl Placement for Belady {
    fn name(&self) -> &'static str {
        "belady"
    }

    fn on_access(&self, _now: u64, _class: u8, _keys: &[u64], _writes: &[Touch]) {}

    // the optimum is a property of the exact next uses at each eviction
    fn order_ttl(&self) -> u64 {
        0
    }

    fn order(&self, now: u64, cands: &mut [Cand]) {
        let mut v: Vec<(u64, Cand)> = cands
            .iter()
            .map(|c| {
                let w = match self.next(now, c.key) {
                    // a dirty one costs its copy-out all the same
                    Some((t, true)) if c.dirty => t,
                    Some((_, true)) | None => u64::MAX,
                    Some((t, false)) => t,
                };
                (w, *c)
            })
            .collect();
        // furthest next use first; among equals (never used again, or
        // written whole next) clean first, then LRU
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

    // (a whole write next: as never used again, as `Predictive` says)
    fn next_use(&self, now: u64, key: u64) -> Option<u64> {
        self.next_need(now, key)
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
        self.next_need(now, key)
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

    /// A chunk whose next use writes it whole goes as if never used again
    /// when clean (nothing to copy out or in), and by that use's tick when
    /// dirty (its copy-out costs as a fetch would); nothing is fetched
    /// ahead of such a use.
    #[test]
    fn a_whole_write_next_is_as_never_used_again() {
        // a: read 1, read 10   b: read 2, whole 5, read 8
        let b = Belady::with_touches(vec![
            (1, 0xa, Touch::READ),
            (10, 0xa, Touch::READ),
            (2, 0xb, Touch::READ),
            (5, 0xb, Touch::WHOLE),
            (8, 0xb, Touch::READ),
        ]);
        let cand = |key, dirty| Cand {
            key,
            last: 0,
            dirty,
        };
        let mut c = vec![cand(0xa, false), cand(0xb, false)];
        b.order(4, &mut c);
        assert_eq!(c[0].key, 0xb, "clean, written whole next: free");
        let mut c = vec![cand(0xa, false), cand(0xb, true)];
        b.order(4, &mut c);
        assert_eq!(c[0].key, 0xa, "dirty: by the tick of its next use");
        let p: &dyn Placement = &b;
        assert_eq!(p.next_use(4, 0xb), Some(u64::MAX));
        assert_eq!(p.next_use(5, 0xb), Some(8));
        assert!(b.predicts(4, 0xb, 1), "it is used, all the same");
        let mut up = Vec::new();
        p.upcoming(2, 8, &mut up);
        assert_eq!(up, vec![(8, 0xb), (10, 0xa)]);
        assert_eq!(b.place(4, 0xb), None);
        assert_eq!(b.place(6, 0xb), Some(Place::Hbm));
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
            p.on_access(t, 0, &[k], &[Touch::READ]);
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
