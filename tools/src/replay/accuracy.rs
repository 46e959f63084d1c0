//! Prediction precision and recall (design.md §5). At a sampling point (the
//! engine's logical clock at `now`), every live managed chunk is asked
//! `predicts(now, key, W)`; it was *actually* accessed if the baseline's
//! access log has it at a tick in (now, now + W]. Byte-weighted by the
//! chunk's bytes inside its allocation (the last chunk of an allocation may
//! be partial). Chunks allocated after `now` are outside both sets: no
//! predictor could name them.
//!
//! precision = |predicted ∩ accessed| / |predicted|,
//! recall    = |predicted ∩ accessed| / |accessed|, summed over all samples.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use u3m_core::engine::runtime::CHUNK;
use u3m_core::policy::Placement;

/// Chunk keys are 2 MiB-aligned VAs: a multiplicative hash of the chunk
/// number is enough (SipHash showed in the profile).
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = (k >> 21 ^ k << 43).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// Each key's access ticks, ascending (from a run's access log).
pub struct Future {
    ticks: KeyMap<Vec<u64>>,
}

impl Future {
    /// From a run's log: (tick, key, touch), touch not read.
    pub fn new<T>(log: &[(u64, u64, T)]) -> Future {
        let mut ticks: KeyMap<Vec<u64>> = KeyMap::default();
        for &(t, k, _) in log {
            let v = ticks.entry(k).or_default();
            if v.last() != Some(&t) {
                v.push(t);
            }
        }
        Future { ticks }
    }

    /// The first tick after `now` at which `key` is accessed.
    pub fn next_after(&self, key: u64, now: u64) -> Option<u64> {
        let v = self.ticks.get(&key)?;
        let i = v.partition_point(|&t| t <= now);
        v.get(i).copied()
    }
}

/// Byte sums for one window W.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Window {
    pub w: u64,
    pub predicted: u64,
    pub accessed: u64,
    pub hit: u64,
}

impl Window {
    pub fn precision(&self) -> Option<f64> {
        (self.predicted > 0).then(|| self.hit as f64 / self.predicted as f64)
    }
    pub fn recall(&self) -> Option<f64> {
        (self.accessed > 0).then(|| self.hit as f64 / self.accessed as f64)
    }
}

pub struct Accuracy {
    pub every: u64,
    pub samples: u64,
    pub windows: Vec<Window>,
    next: u64,
}

impl Accuracy {
    pub fn new(every: u64, windows: &[u64]) -> Accuracy {
        let every = every.max(1);
        Accuracy {
            every,
            samples: 0,
            windows: windows
                .iter()
                .map(|&w| Window {
                    w,
                    ..Window::default()
                })
                .collect(),
            next: every,
        }
    }

    /// Called after each tracked call with the engine's clock; samples when
    /// it reached the next sampling point.
    pub fn maybe_sample(
        &mut self,
        now: u64,
        policy: &dyn Placement,
        live: &BTreeMap<u64, u64>,
        future: &Future,
    ) {
        if now < self.next {
            return;
        }
        self.next = (now / self.every + 1) * self.every;
        self.samples += 1;
        for (&va, &size) in live {
            let mut off = 0;
            while off < size {
                let key = va + off;
                let bytes = (size - off).min(CHUNK);
                let next = future.next_after(key, now);
                for win in self.windows.iter_mut() {
                    let accessed = next.map(|t| t <= now + win.w).unwrap_or(false);
                    let predicted = policy.predicts(now, key, win.w);
                    if accessed {
                        win.accessed += bytes;
                    }
                    if predicted {
                        win.predicted += bytes;
                        if accessed {
                            win.hit += bytes;
                        }
                    }
                }
                off += CHUNK;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use u3m_core::policy::Lru;

    #[test]
    fn byte_weighted_against_the_future() {
        // two allocations: A (one full chunk), B (1.5 chunks)
        let a = 0x1000_0000_0000u64;
        let b = a + 4 * CHUNK;
        let live: BTreeMap<u64, u64> = [(a, CHUNK), (b, CHUNK + CHUNK / 2)].into_iter().collect();
        // ticks 1..=4: A, B0, A, B1
        let log = vec![(1, a, ()), (2, b, ()), (3, a, ()), (4, b + CHUNK, ())];
        let lru = Lru::new();
        for &(t, k, _) in &log[..3] {
            lru.on_access(t, 0, &[k], &[u3m_core::policy::Touch::READ]);
        }
        let f = Future::new(&log);
        let mut acc = Accuracy::new(3, &[1, 2]);
        acc.maybe_sample(2, &lru, &live, &f); // not a sampling point yet
        assert_eq!(acc.samples, 0);
        acc.maybe_sample(3, &lru, &live, &f);
        assert_eq!(acc.samples, 1);
        // at 3, LRU predicts what it saw in the last w ticks: w=1 {A}, w=2 {A, B0}
        // accessed in (3, 3+w]: w=1 {B1}, w=2 {B1}
        assert_eq!(
            acc.windows[0],
            Window {
                w: 1,
                predicted: CHUNK,
                accessed: CHUNK / 2,
                hit: 0
            }
        );
        assert_eq!(
            acc.windows[1],
            Window {
                w: 2,
                predicted: 2 * CHUNK,
                accessed: CHUNK / 2,
                hit: 0
            }
        );
        assert_eq!(acc.windows[0].precision(), Some(0.0));
        assert_eq!(f.next_after(a, 1), Some(3));
        assert_eq!(f.next_after(a, 3), None);
    }
}
