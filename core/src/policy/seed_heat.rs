//! The seed's heat policy: coldest first by the heat table's
//! accesses/s × log2(1 + refcount) / MiB, least recently used among equals.

use std::sync::OnceLock;

use super::{lru_order, Cand, HeatFn, Placement};

pub struct SeedHeat {
    heat: OnceLock<HeatFn>,
}

impl SeedHeat {
    pub fn new() -> SeedHeat {
        SeedHeat { heat: OnceLock::new() }
    }
}

impl Default for SeedHeat {
    fn default() -> Self {
        Self::new()
    }
}

impl Placement for SeedHeat {
    fn name(&self) -> &'static str {
        "seed-heat"
    }

    fn on_access(&self, _now: u64, _class: u8, _keys: &[u64], _writes: &[bool]) {}

    fn order(&self, _now: u64, cands: &mut [Cand]) {
        let Some(h) = self.heat.get() else { return lru_order(cands) };
        let mut keyed: Vec<(f64, Cand)> = cands.iter().map(|c| (h(c.key), *c)).collect();
        keyed.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.last.cmp(&b.1.last)).then(a.1.key.cmp(&b.1.key)));
        for (k, (_, c)) in keyed.into_iter().enumerate() {
            cands[k] = c;
        }
    }

    fn predicts(&self, _now: u64, _key: u64, _w: u64) -> bool {
        false
    }

    fn set_heat_fn(&self, f: HeatFn) {
        let _ = self.heat.set(f);
    }
}
