//! The seed's heat policy: a chunk's heat is the heat table's
//! accesses/s × log2(1 + refcount) / MiB; eviction takes the coldest first
//! (least recently used among equals), and two thresholds place chunks:
//! heat ≥ `hbm` belongs in HBM (the background prefetch brings it back when
//! there is room), `dram` ≤ heat < `hbm` in DRAM, heat < `dram` on NVMe (an
//! evicted chunk that cold bypasses DRAM when a swap file exists).
//!
//! The seed's thresholds (0.8 and 0.3) are starting points: heat's scale
//! depends on the workload's access rate, so every `recal_s` seconds (30)
//! both are scaled together to hold HBM between the watermarks — up by
//! 1.25 × when HBM use is above the high watermark (fewer chunks count as
//! hot: less prefetch), down by 0.8 × below the low one (more prefetch).

use std::sync::{Mutex, OnceLock};

use super::{lru_order, Cand, HeatFn, Place, Placement, Touch};

/// The seed's thresholds.
pub const SEED_HBM: f64 = 0.8;
pub const SEED_DRAM: f64 = 0.3;
/// Recalibration period, seconds (the seed's 30 s).
pub const RECAL_S: f64 = 30.0;

struct Thresholds {
    hbm: f64,
    dram: f64,
    next_recal: f64,
    events: Vec<String>,
}

pub struct SeedHeat {
    heat: OnceLock<HeatFn>,
    /// HBM watermarks (fractions of capacity) the thresholds steer toward.
    low: f64,
    high: f64,
    recal_s: f64,
    th: Mutex<Thresholds>,
}

impl SeedHeat {
    /// With the seed's thresholds, U3M_HBM_LOW/HIGH's defaults and 30 s.
    pub fn new() -> SeedHeat {
        SeedHeat::with(0.75, 0.90, RECAL_S)
    }

    pub fn with(low: f64, high: f64, recal_s: f64) -> SeedHeat {
        SeedHeat {
            heat: OnceLock::new(),
            low,
            high,
            recal_s: recal_s.max(0.001),
            th: Mutex::new(Thresholds {
                hbm: SEED_HBM,
                dram: SEED_DRAM,
                next_recal: recal_s,
                events: Vec::new(),
            }),
        }
    }

    /// The current (HBM, DRAM) thresholds.
    pub fn thresholds(&self) -> (f64, f64) {
        self.th
            .lock()
            .map(|t| (t.hbm, t.dram))
            .unwrap_or((SEED_HBM, SEED_DRAM))
    }

    fn heat_of(&self, key: u64) -> Option<f64> {
        self.heat.get().map(|h| h(key))
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

    fn on_access(&self, _now: u64, _class: u8, _keys: &[u64], _writes: &[Touch]) {}

    fn order(&self, _now: u64, cands: &mut [Cand]) {
        let Some(h) = self.heat.get() else {
            return lru_order(cands);
        };
        let mut keyed: Vec<(f64, Cand)> = cands.iter().map(|c| (h(c.key), *c)).collect();
        keyed.sort_unstable_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then(a.1.last.cmp(&b.1.last))
                .then(a.1.key.cmp(&b.1.key))
        });
        for (k, (_, c)) in keyed.into_iter().enumerate() {
            cands[k] = c;
        }
    }

    /// Hot (heat ≥ the HBM threshold) chunks are the ones expected soon;
    /// heat has no notion of a horizon, so `w` is ignored.
    fn predicts(&self, _now: u64, key: u64, _w: u64) -> bool {
        let (hbm, _) = self.thresholds();
        self.heat_of(key).map(|h| h >= hbm).unwrap_or(false)
    }

    fn place(&self, _now: u64, key: u64) -> Option<Place> {
        let h = self.heat_of(key)?;
        let (hbm, dram) = self.thresholds();
        Some(if h >= hbm {
            Place::Hbm
        } else if h >= dram {
            Place::Dram
        } else {
            Place::Nvme
        })
    }

    fn tick(&self, secs: f64, resident_fraction: f64) {
        let Ok(mut t) = self.th.lock() else { return };
        if secs < t.next_recal {
            return;
        }
        t.next_recal = secs + self.recal_s;
        let f = if resident_fraction > self.high {
            1.25
        } else if resident_fraction < self.low {
            0.8
        } else {
            return;
        };
        t.hbm *= f;
        t.dram *= f;
        let line = format!(
            "seed-heat: thresholds HBM >= {:.3}, DRAM >= {:.3} (HBM use {:.0}% {} the {:.0}-{:.0}% watermarks, at {:.0} s)",
            t.hbm,
            t.dram,
            resident_fraction * 100.0,
            if f > 1.0 { "above" } else { "below" },
            self.low * 100.0,
            self.high * 100.0,
            secs
        );
        if t.events.len() < 64 {
            t.events.push(line);
        }
    }

    fn drain_events(&self, out: &mut Vec<String>) {
        if let Ok(mut t) = self.th.lock() {
            out.append(&mut t.events);
        }
    }

    fn set_heat_fn(&self, f: HeatFn) {
        let _ = self.heat.set(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_heat(p: &SeedHeat) {
        // heat = key / 1000 for the test keys
        p.set_heat_fn(Box::new(|k| k as f64 / 1000.0));
    }

    #[test]
    fn places_by_the_seed_thresholds() {
        let p = SeedHeat::new();
        assert_eq!(p.place(0, 900), None, "no heat yet: no opinion");
        with_heat(&p);
        assert_eq!(p.place(0, 900), Some(Place::Hbm));
        assert_eq!(p.place(0, 800), Some(Place::Hbm));
        assert_eq!(p.place(0, 500), Some(Place::Dram));
        assert_eq!(p.place(0, 299), Some(Place::Nvme));
        assert!(p.predicts(0, 850, 1) && !p.predicts(0, 700, 1000));
    }

    #[test]
    fn recalibrates_toward_the_watermarks_every_period() {
        let p = SeedHeat::with(0.75, 0.90, 30.0);
        with_heat(&p);
        p.tick(10.0, 0.99); // before the first period: nothing
        assert_eq!(p.thresholds(), (SEED_HBM, SEED_DRAM));
        p.tick(30.0, 0.95); // above high: raise
        let (h, d) = p.thresholds();
        assert!(
            (h - 1.0).abs() < 1e-9 && (d - 0.375).abs() < 1e-9,
            "{h} {d}"
        );
        assert_eq!(p.place(0, 900), Some(Place::Dram), "0.9 is no longer hot");
        p.tick(45.0, 0.10); // within the period: nothing
        assert_eq!(p.thresholds().0, h);
        p.tick(60.0, 0.80); // between the watermarks: keep
        assert_eq!(p.thresholds().0, h);
        p.tick(90.0, 0.10); // below low: lower
        assert!((p.thresholds().0 - 0.8).abs() < 1e-9);
        let mut ev = Vec::new();
        p.drain_events(&mut ev);
        assert_eq!(ev.len(), 2, "{ev:?}");
        assert!(ev[0].contains("above") && ev[1].contains("below"), "{ev:?}");
        ev.clear();
        p.drain_events(&mut ev);
        assert!(ev.is_empty());
    }

    #[test]
    fn evicts_coldest_first_then_least_recent() {
        let p = SeedHeat::new();
        with_heat(&p);
        let mut c = vec![
            Cand {
                key: 500,
                last: 1,
                dirty: false,
            },
            Cand {
                key: 100,
                last: 9,
                dirty: true,
            },
            Cand {
                key: 100 + 0,
                last: 3,
                dirty: false,
            },
        ];
        c[2].key = 100; // equal heat: least recent first
        p.order(0, &mut c);
        assert_eq!((c[0].key, c[0].last), (100, 3));
        assert_eq!((c[1].key, c[1].last), (100, 9));
        assert_eq!(c[2].key, 500);
    }
}
