//! Least recently used: the baseline every other policy is measured against.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{lru_order, Cand, Placement, Touch};

/// Eviction by `Cand::last`; the per-key recency map exists only for its
/// implicit prediction (what was used in the last `w` ticks is used again in
/// the next `w`), which precision/recall and prefetch ask for.
#[derive(Default)]
pub struct Lru {
    last: Mutex<HashMap<u64, u64>>,
}

impl Lru {
    pub fn new() -> Lru {
        Lru::default()
    }
}

impl Placement for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn on_access(&self, now: u64, _class: u8, keys: &[u64], _writes: &[Touch]) {
        if let Ok(mut m) = self.last.lock() {
            for &k in keys {
                m.insert(k, now);
            }
        }
    }

    fn on_free(&self, key: u64) {
        if let Ok(mut m) = self.last.lock() {
            m.remove(&key);
        }
    }

    fn order(&self, _now: u64, cands: &mut [Cand]) {
        lru_order(cands);
    }

    fn predicts(&self, now: u64, key: u64, w: u64) -> bool {
        self.last
            .lock()
            .ok()
            .and_then(|m| m.get(&key).copied())
            .map(|t| now.saturating_sub(t) < w)
            .unwrap_or(false)
    }
}
