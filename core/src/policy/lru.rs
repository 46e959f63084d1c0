//! Least recently used: the baseline every other policy is measured against.

use super::{lru_order, Cand, Placement};

pub struct Lru;

impl Placement for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn on_access(&self, _now: u64, _class: u8, _keys: &[u64], _writes: &[bool]) {}

    fn order(&self, _now: u64, cands: &mut [Cand]) {
        lru_order(cands);
    }

    /// LRU's implicit prediction: what was used in the last `w` ticks is
    /// used again in the next `w`. Without per-key history here, the engine
    /// answers it from `Cand::last`; see `predicts_by_recency`.
    fn predicts(&self, _now: u64, _key: u64, _w: u64) -> bool {
        false
    }
}
