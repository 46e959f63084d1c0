//! A `Placement` that forwards every call to the policy under test and logs
//! the accesses the engine reports: (logical tick, chunk key, how the call
//! touched it). The baseline
//! run's log is the future Belady's MIN is given and the look-ahead for
//! precision and recall; every other run's log must be identical to it
//! (the same trace gives the same ticks and keys whatever the policy), which
//! the driver checks.

use std::sync::{Arc, Mutex};

use u3m_core::policy::{Cand, HeatFn, KeptCursor, KeptId, Place, Placement, RankTail, Touch};

pub type Log = Arc<Mutex<Vec<(u64, u64, Touch)>>>;

pub struct Recording {
    inner: Box<dyn Placement>,
    log: Log,
}

impl Recording {
    pub fn new(inner: Box<dyn Placement>) -> (Recording, Log) {
        let log: Log = Arc::default();
        (
            Recording {
                inner,
                log: log.clone(),
            },
            log,
        )
    }
}

impl Placement for Recording {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn on_access(&self, now: u64, class: u8, keys: &[u64], touch: &[Touch]) {
        if let Ok(mut l) = self.log.lock() {
            l.extend(keys.iter().zip(touch).map(|(&k, &t)| (now, k, t)));
        }
        self.inner.on_access(now, class, keys, touch);
    }

    fn on_free(&self, key: u64) {
        self.inner.on_free(key)
    }

    fn order(&self, now: u64, cands: &mut [Cand]) {
        self.inner.order(now, cands)
    }

    fn order_ttl(&self) -> u64 {
        self.inner.order_ttl()
    }

    fn predicts(&self, now: u64, key: u64, w: u64) -> bool {
        self.inner.predicts(now, key, w)
    }

    fn next_use(&self, now: u64, key: u64) -> Option<u64> {
        self.inner.next_use(now, key)
    }

    fn upcoming(&self, now: u64, d: u64, out: &mut Vec<(u64, u64)>) {
        self.inner.upcoming(now, d, out)
    }

    fn plan_out(&self, key: u64) -> bool {
        self.inner.plan_out(key)
    }

    fn place(&self, now: u64, key: u64) -> Option<Place> {
        self.inner.place(now, key)
    }

    fn tick(&self, secs: f64, resident_fraction: f64) {
        self.inner.tick(secs, resident_fraction)
    }

    fn drain_events(&self, out: &mut Vec<String>) {
        self.inner.drain_events(out)
    }

    fn set_heat_fn(&self, f: HeatFn) {
        self.inner.set_heat_fn(f)
    }

    fn set_out_slack(&self, slack: bool) {
        self.inner.set_out_slack(slack)
    }

    fn order_top(&self, now: u64, cands: &mut Vec<Cand>, k: usize) {
        self.inner.order_top(now, cands, k)
    }

    fn order_ranked(&self, now: u64, cands: &mut Vec<Cand>, k: usize, tail: &mut RankTail) -> bool {
        self.inner.order_ranked(now, cands, k, tail)
    }

    fn order_kept(
        &self,
        kept: KeptId,
        now: u64,
        all: &[Cand],
        gone: &[u64],
        new: &[Cand],
        k: usize,
        cands: &mut Vec<Cand>,
        tail: &mut RankTail,
    ) -> bool {
        self.inner
            .order_kept(kept, now, all, gone, new, k, cands, tail)
    }

    fn order_kept_next(&self, cur: &mut KeptCursor, n: usize, out: &mut Vec<Cand>) {
        self.inner.order_kept_next(cur, n, out)
    }
}
