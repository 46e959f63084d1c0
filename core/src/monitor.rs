//! The seed's memory monitor: warning at 85 % and critical at 95 % of
//! capacity, with hysteresis so a level does not flap at its threshold, and a
//! predicted time to OOM from the recent growth rate. Pure logic over
//! samples: no clock, no allocation, no I/O. The library feeds it, raises
//! the transitions as events and publishes `status()` into the stats segment.
//!
//! What "capacity" means depends on the mode. Without tiering it is the
//! physical HBM (fed on allocation and free). Under tiering a full HBM is the
//! normal state, so the level comes from what can actually run out
//! (`Pressure`, fed by the tier's background round): the virtual capacity the
//! process is told (allocations beyond it fail), the host tiers that hold
//! what is not resident (DRAM + NVMe), and the share of time calls stall
//! waiting for u3m to make memory resident (warning at 50 %, critical at
//! 80 %). The level is the worst of the three; the event names the cause.

use crate::shm::ShortText;
use std::cell::UnsafeCell;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Severity of HBM use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Level {
    Ok = 0,
    Warning = 1,
    Critical = 2,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warning => "warning",
            Level::Critical => "critical",
        }
    }
    /// Unknown values read as Critical: a newer writer's extra level is at
    /// least as bad as the worst we know.
    pub fn from_u64(v: u64) -> Level {
        match v {
            0 => Level::Ok,
            1 => Level::Warning,
            _ => Level::Critical,
        }
    }
}

/// What a level or a prediction is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Physical HBM (no tiering).
    Hbm,
    /// The virtual device capacity under tiering.
    Virtual,
    /// The host tiers (DRAM + NVMe) holding what is not resident.
    Host,
    /// Calls waiting for u3m.
    Stall,
}

impl Cause {
    pub fn name(self) -> &'static str {
        match self {
            Cause::Hbm => "hbm",
            Cause::Virtual => "virtual",
            Cause::Host => "host tiers",
            Cause::Stall => "stall",
        }
    }
}

/// One observation under tiering.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Pressure {
    /// Device memory in use as the process sees it, and its capacity (the
    /// virtual capacity under tiering).
    pub used: u64,
    pub capacity: u64,
    /// Bytes the host tiers must hold, and their limit (0: no host tiers).
    pub host_used: u64,
    pub host_capacity: u64,
    /// Share of wall time calls spent waiting for u3m (0..1) recently.
    pub stall: f64,
}

/// Thresholds and the prediction window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MonitorConfig {
    /// Fraction of capacity at which the level rises to Warning.
    pub warning: f64,
    /// Fraction of capacity at which the level rises to Critical.
    pub critical: f64,
    /// A level falls only once use is this far (fraction of capacity) below
    /// the threshold that raised it.
    pub hysteresis: f64,
    /// Growth is estimated from the peak of each interval of this length...
    pub sample_interval_ns: u64,
    /// ...over the intervals that ended within this window.
    pub window_ns: u64,
    /// Growth below this (bytes/s) is "not growing": no prediction.
    pub min_growth_bps: f64,
    /// An OomPredicted transition fires when the prediction drops below this;
    /// it re-arms once the prediction is gone or above twice this.
    pub oom_horizon_s: f64,
    /// Stall share at which the level rises to Warning / Critical, and its
    /// hysteresis (stalls come in bursts).
    pub stall_warning: f64,
    pub stall_critical: f64,
    pub stall_hysteresis: f64,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            warning: 0.85,
            critical: 0.95,
            hysteresis: 0.05,
            sample_interval_ns: 250_000_000,
            window_ns: 10_000_000_000,
            min_growth_bps: 1024.0,
            oom_horizon_s: 60.0,
            stall_warning: 0.5,
            stall_critical: 0.8,
            stall_hysteresis: 0.1,
        }
    }
}

/// Something the library raises as an event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transition {
    /// The level changed; `cause` is the dimension at the new level (its
    /// figures are `used` of `capacity`, or the stall share in parts per
    /// million of 1).
    Level {
        from: Level,
        to: Level,
        used: u64,
        capacity: u64,
        cause: Cause,
    },
    /// The predicted time to OOM fell below the horizon.
    OomPredicted {
        seconds: f64,
        used: u64,
        capacity: u64,
        cause: Cause,
    },
}

impl Transition {
    /// Event text, formatted without allocating, e.g.
    /// "hbm 86.0% warning (was ok)", "host tiers 96.1% critical (was
    /// warning)" or "virtual 50.0% full in 42.0s".
    pub fn text(&self) -> ShortText {
        let mut t = ShortText::new();
        match *self {
            Transition::Level {
                from,
                to,
                used,
                capacity,
                cause,
            } => {
                let _ = write!(
                    t,
                    "{} {:.1}% {} (was {})",
                    cause.name(),
                    pct(used, capacity),
                    to.name(),
                    from.name()
                );
            }
            Transition::OomPredicted {
                seconds,
                used,
                capacity,
                cause,
            } => {
                let _ = write!(
                    t,
                    "{} {:.1}% full in {:.1}s",
                    cause.name(),
                    pct(used, capacity),
                    seconds
                );
            }
        }
        t
    }
}

fn fraction(used: u64, capacity: u64) -> f64 {
    if capacity == 0 {
        0.0
    } else {
        used as f64 / capacity as f64
    }
}

/// One dimension's next level from its current one and the fraction `f`:
/// rising at `warning` / `critical`, falling only once `f` is `hysteresis`
/// below the threshold that raised it.
fn step(cur: Level, f: f64, warning: f64, critical: f64, hysteresis: f64) -> Level {
    let rising = if f >= critical {
        Level::Critical
    } else if f >= warning {
        Level::Warning
    } else {
        Level::Ok
    };
    if rising >= cur {
        return rising;
    }
    let threshold = |l: Level| match l {
        Level::Ok => 0.0,
        Level::Warning => warning,
        Level::Critical => critical,
    };
    let mut l = cur;
    while l > Level::Ok && f < threshold(l) - hysteresis {
        l = if l == Level::Critical {
            Level::Warning
        } else {
            Level::Ok
        };
    }
    l
}

fn pct(used: u64, capacity: u64) -> f64 {
    if capacity == 0 {
        0.0
    } else {
        used as f64 * 100.0 / capacity as f64
    }
}

/// What the segment shows for one device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Status {
    pub level: Level,
    pub use_fraction: f64,
    pub seconds_to_oom: Option<f64>,
    /// Estimated growth of use, bytes/s (negative when shrinking).
    pub growth_bps: f64,
}

const SAMPLES: usize = 64;

/// Monitor of one device's memory.
#[derive(Debug, Clone)]
pub struct Monitor {
    cfg: MonitorConfig,
    level: Level,
    /// Level of each dimension (device, host, stall), each with its own
    /// hysteresis; `level` is the worst.
    dims: [Level; 3],
    /// Hbm or Virtual: what the device dimension is.
    device_cause: Cause,
    /// Ring of (time, peak use) per completed interval.
    samples: [(u64, u64); SAMPLES],
    n: usize,
    next: usize,
    /// Current interval: start, peak use and its time.
    bucket_start: u64,
    bucket_peak: (u64, u64),
    bucket_open: bool,
    last_used: u64,
    last_capacity: u64,
    oom_armed: bool,
    growth_bps: Option<f64>,
    /// When `growth_bps` was last computed: the fit is redone only when an
    /// interval closes or ages, so `observe` is O(1) on the allocation path.
    estimated_at: Option<u64>,
}

impl Default for Monitor {
    fn default() -> Self {
        Monitor::new(MonitorConfig::default())
    }
}

impl Monitor {
    pub fn new(cfg: MonitorConfig) -> Self {
        Monitor {
            cfg,
            level: Level::Ok,
            dims: [Level::Ok; 3],
            device_cause: Cause::Hbm,
            samples: [(0, 0); SAMPLES],
            n: 0,
            next: 0,
            bucket_start: 0,
            bucket_peak: (0, 0),
            bucket_open: false,
            last_used: 0,
            last_capacity: 0,
            oom_armed: true,
            growth_bps: None,
            estimated_at: None,
        }
    }

    pub fn level(&self) -> Level {
        self.level
    }

    /// Records that `used` of `capacity` bytes of HBM are in use at `now_ns`
    /// (monotonic) and returns the transition this causes, if any. A level
    /// change wins over a prediction in the same call; the prediction then
    /// fires on a later call.
    pub fn observe(&mut self, now_ns: u64, used: u64, capacity: u64) -> Option<Transition> {
        self.device_cause = Cause::Hbm;
        self.observe_dims(now_ns, used, capacity, (0, 0), 0.0)
    }

    /// Under tiering: the device dimension is the virtual capacity, and the
    /// host tiers and the stall share count too.
    pub fn observe_pressure(&mut self, now_ns: u64, p: &Pressure) -> Option<Transition> {
        self.device_cause = Cause::Virtual;
        self.observe_dims(
            now_ns,
            p.used,
            p.capacity,
            (p.host_used, p.host_capacity),
            p.stall,
        )
    }

    fn observe_dims(
        &mut self,
        now_ns: u64,
        used: u64,
        capacity: u64,
        host: (u64, u64),
        stall: f64,
    ) -> Option<Transition> {
        let closed = self.sample(now_ns, used);
        self.last_used = used;
        self.last_capacity = capacity;
        let stale = match self.estimated_at {
            None => true,
            Some(t) => now_ns.saturating_sub(t) >= self.cfg.sample_interval_ns,
        };
        if closed || stale {
            self.growth_bps = self.estimate_growth(now_ns);
            self.estimated_at = Some(now_ns);
        }
        let (w, c, h) = (self.cfg.warning, self.cfg.critical, self.cfg.hysteresis);
        let stall = if stall.is_finite() {
            stall.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let stall_ppm = (stall * 1e6) as u64;
        let before = self.dims;
        let figures = [
            (self.device_cause, used, capacity),
            (Cause::Host, host.0, host.1),
            (Cause::Stall, stall_ppm, 1_000_000),
        ];
        self.dims[0] = step(self.dims[0], fraction(used, capacity), w, c, h);
        self.dims[1] = step(self.dims[1], fraction(host.0, host.1), w, c, h);
        self.dims[2] = step(
            self.dims[2],
            stall,
            self.cfg.stall_warning,
            self.cfg.stall_critical,
            self.cfg.stall_hysteresis,
        );
        let to = self.dims.iter().copied().max().unwrap_or(Level::Ok);
        if to != self.level {
            let from = self.level;
            self.level = to;
            // rising: the first dimension at the new level says why;
            // falling: the first one that fell
            let i = if to > from {
                self.dims.iter().position(|&l| l == to)
            } else {
                (0..3).find(|&k| self.dims[k] < before[k])
            }
            .unwrap_or(0);
            let (cause, used, capacity) = figures[i];
            return Some(Transition::Level {
                from,
                to,
                used,
                capacity,
                cause,
            });
        }
        match self.seconds_to_oom() {
            Some(s) if s < self.cfg.oom_horizon_s && self.oom_armed => {
                self.oom_armed = false;
                Some(Transition::OomPredicted {
                    seconds: s,
                    used,
                    capacity,
                    cause: self.device_cause,
                })
            }
            Some(s) if s <= 2.0 * self.cfg.oom_horizon_s => None,
            _ => {
                self.oom_armed = true;
                None
            }
        }
    }

    /// Predicted seconds until use reaches capacity at the recent growth
    /// rate; None when not growing (or capacity unknown), 0 when full.
    pub fn seconds_to_oom(&self) -> Option<f64> {
        if self.last_capacity == 0 {
            return None;
        }
        if self.last_used >= self.last_capacity {
            return Some(0.0);
        }
        let g = self.growth_bps?;
        if g < self.cfg.min_growth_bps {
            return None;
        }
        Some((self.last_capacity - self.last_used) as f64 / g)
    }

    pub fn status(&self) -> Status {
        Status {
            level: self.level,
            use_fraction: if self.last_capacity == 0 {
                0.0
            } else {
                self.last_used as f64 / self.last_capacity as f64
            },
            seconds_to_oom: self.seconds_to_oom(),
            growth_bps: self.growth_bps.unwrap_or(0.0),
        }
    }

    /// Keeps the peak of each interval: OOM happens at peaks, and a training
    /// step's saw-tooth then reads as flat instead of as noise. Returns true
    /// when an interval closed.
    fn sample(&mut self, now: u64, used: u64) -> bool {
        if !self.bucket_open {
            self.bucket_open = true;
            self.bucket_start = now;
            self.bucket_peak = (now, used);
            return false;
        }
        if now.saturating_sub(self.bucket_start) >= self.cfg.sample_interval_ns {
            self.samples[self.next] = self.bucket_peak;
            self.next = (self.next + 1) % SAMPLES;
            self.n = (self.n + 1).min(SAMPLES);
            self.bucket_start = now;
            self.bucket_peak = (now, used);
            return true;
        }
        if used >= self.bucket_peak.1 {
            self.bucket_peak = (now, used);
        }
        false
    }

    /// Least-squares slope (bytes/s) of the interval peaks within the window;
    /// None with fewer than 3 of them.
    fn estimate_growth(&self, now: u64) -> Option<f64> {
        let since = now.saturating_sub(self.cfg.window_ns);
        let pts = (0..self.n)
            .map(|i| self.samples[(self.next + SAMPLES - 1 - i) % SAMPLES])
            .filter(|&(t, _)| t >= since);
        let (mut k, mut st, mut su) = (0.0f64, 0.0f64, 0.0f64);
        let t0 = since;
        for (t, u) in pts.clone() {
            k += 1.0;
            st += (t - t0) as f64 / 1e9;
            su += u as f64;
        }
        if k < 3.0 {
            return None;
        }
        let (mt, mu) = (st / k, su / k);
        let (mut sxy, mut sxx) = (0.0, 0.0);
        for (t, u) in pts {
            let dx = (t - t0) as f64 / 1e9 - mt;
            sxy += dx * (u as f64 - mu);
            sxx += dx * dx;
        }
        if sxx <= 0.0 {
            return None;
        }
        Some(sxy / sxx)
    }
}

/// A `Monitor` that any thread may feed without waiting: an observation
/// that finds another one in progress is skipped (the next allocation or free
/// brings the news), so the allocation path never blocks on it.
pub struct SharedMonitor {
    busy: AtomicBool,
    inner: UnsafeCell<Monitor>,
}

// SAFETY: `inner` is only touched by the thread that flipped `busy` to true.
unsafe impl Sync for SharedMonitor {}
unsafe impl Send for SharedMonitor {}

impl SharedMonitor {
    pub fn new(cfg: MonitorConfig) -> Self {
        SharedMonitor {
            busy: AtomicBool::new(false),
            inner: UnsafeCell::new(Monitor::new(cfg)),
        }
    }

    /// `Monitor::observe` plus the resulting status, or None if another
    /// thread is observing right now.
    pub fn try_observe(
        &self,
        now_ns: u64,
        used: u64,
        capacity: u64,
    ) -> Option<(Option<Transition>, Status)> {
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        // SAFETY: we hold `busy`.
        let m = unsafe { &mut *self.inner.get() };
        let r = (m.observe(now_ns, used, capacity), m.status());
        self.busy.store(false, Ordering::Release);
        Some(r)
    }
}

impl Default for SharedMonitor {
    fn default() -> Self {
        SharedMonitor::new(MonitorConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MS: u64 = 1_000_000;

    fn levels(m: &mut Monitor, fractions: &[f64]) -> Vec<Option<(Level, Level)>> {
        let cap = 100 * GIB;
        fractions
            .iter()
            .enumerate()
            .map(
                |(i, f)| match m.observe(i as u64 * MS, (f * cap as f64) as u64, cap) {
                    Some(Transition::Level { from, to, .. }) => Some((from, to)),
                    _ => None,
                },
            )
            .collect()
    }

    #[test]
    fn thresholds_rise_at_85_and_95() {
        let mut m = Monitor::default();
        let t = levels(&mut m, &[0.5, 0.849, 0.85, 0.949, 0.95, 1.2]);
        assert_eq!(
            t,
            vec![
                None,
                None,
                Some((Level::Ok, Level::Warning)),
                None,
                Some((Level::Warning, Level::Critical)),
                None
            ]
        );
        let mut m = Monitor::default();
        assert_eq!(
            levels(&mut m, &[0.97]),
            vec![Some((Level::Ok, Level::Critical))],
            "jumps straight to critical"
        );
    }

    #[test]
    fn hysteresis_stops_flapping_at_a_threshold() {
        let mut m = Monitor::default();
        // Oscillating around 85 % raises once, never clears.
        let seq: Vec<f64> = (0..40)
            .map(|i| if i % 2 == 0 { 0.851 } else { 0.84 })
            .collect();
        let changes: Vec<_> = levels(&mut m, &seq).into_iter().flatten().collect();
        assert_eq!(changes, vec![(Level::Ok, Level::Warning)]);
        // Clears only below 80 %.
        assert_eq!(
            levels(&mut m, &[0.81, 0.801, 0.799]),
            vec![None, None, Some((Level::Warning, Level::Ok))]
        );
        // Critical falls to warning below 90 %, to ok below 80 %.
        let mut m = Monitor::default();
        let t = levels(&mut m, &[0.96, 0.93, 0.905, 0.899, 0.85, 0.79]);
        assert_eq!(
            t,
            vec![
                Some((Level::Ok, Level::Critical)),
                None,
                None,
                Some((Level::Critical, Level::Warning)),
                None,
                Some((Level::Warning, Level::Ok))
            ]
        );
        // A big drop from critical goes straight to ok.
        let mut m = Monitor::default();
        assert_eq!(
            levels(&mut m, &[0.99, 0.1]).into_iter().flatten().last(),
            Some((Level::Critical, Level::Ok))
        );
    }

    #[test]
    fn predicts_oom_from_linear_growth() {
        let mut m = Monitor::default();
        let cap = 64 * GIB;
        // 100 MiB/s from 10 GiB, observed every 10 ms for 5 s.
        let rate = 100u64 << 20;
        for i in 0..=500u64 {
            let t = i * 10 * MS;
            m.observe(t, 10 * GIB + rate * t / 1_000_000_000, cap);
        }
        let used = 10 * GIB + rate * 5;
        let expect = (cap - used) as f64 / rate as f64;
        let got = m.seconds_to_oom().expect("growing");
        assert!(
            (got - expect).abs() / expect < 0.02,
            "predicted {got:.1}s, expected {expect:.1}s"
        );
        let g = m.status().growth_bps;
        assert!((g - rate as f64).abs() / (rate as f64) < 0.02, "growth {g}");
    }

    #[test]
    fn no_prediction_when_flat_shrinking_or_sawtooth() {
        let cap = 64 * GIB;
        let mut flat = Monitor::default();
        let mut shrink = Monitor::default();
        let mut saw = Monitor::default();
        for i in 0..1000u64 {
            let t = i * 7 * MS;
            flat.observe(t, 30 * GIB, cap);
            shrink.observe(t, 50 * GIB - i * (8 << 20), cap);
            // A training step: activations grow for 70 ms then are freed.
            saw.observe(t, 20 * GIB + (i % 10) * GIB, cap);
        }
        assert_eq!(flat.seconds_to_oom(), None);
        assert_eq!(shrink.seconds_to_oom(), None);
        assert!(shrink.status().growth_bps < 0.0);
        assert_eq!(
            saw.seconds_to_oom(),
            None,
            "growth {}",
            saw.status().growth_bps
        );
    }

    #[test]
    fn too_few_samples_or_stale_samples_predict_nothing() {
        let cap = 64 * GIB;
        let mut m = Monitor::default();
        m.observe(0, GIB, cap);
        m.observe(300 * MS, 2 * GIB, cap);
        m.observe(600 * MS, 3 * GIB, cap);
        assert_eq!(m.seconds_to_oom(), None, "only two completed intervals");
        for i in 3..20u64 {
            m.observe(i * 300 * MS, (i + 1) * GIB, cap);
        }
        assert!(m.seconds_to_oom().is_some());
        // After a long idle period the old growth no longer counts.
        m.observe(3600 * 1000 * MS, 20 * GIB, cap);
        assert_eq!(m.seconds_to_oom(), None);
    }

    #[test]
    fn full_device_predicts_zero_and_unknown_capacity_nothing() {
        let mut m = Monitor::default();
        m.observe(0, 10, 10);
        assert_eq!(m.seconds_to_oom(), Some(0.0));
        let mut m = Monitor::default();
        assert_eq!(m.observe(0, 10, 0), None);
        assert_eq!(m.seconds_to_oom(), None);
        assert_eq!(m.status().use_fraction, 0.0);
    }

    #[test]
    fn oom_prediction_fires_once_and_rearms() {
        let cap = 64 * GIB;
        let mut m = Monitor::default();
        let mut fired = Vec::new();
        // Grow 1 GiB/s from 0: OOM in < 60 s once past 4 GiB (still < 85 %).
        for i in 0..=200u64 {
            let t = i * 50 * MS;
            if let Some(Transition::OomPredicted { seconds, .. }) =
                m.observe(t, GIB * t / 1_000_000_000, cap)
            {
                fired.push((i, seconds));
            }
        }
        assert_eq!(fired.len(), 1, "{fired:?}");
        assert!(fired[0].1 < 60.0 && fired[0].1 > 40.0, "{fired:?}");
        // Flat for a while: prediction gone, re-armed; growth again fires again.
        let base = 10 * GIB;
        let t0 = 20_000 * MS;
        for i in 0..100u64 {
            assert!(!matches!(
                m.observe(t0 + i * 200 * MS, base, cap),
                Some(Transition::OomPredicted { .. })
            ));
        }
        assert_eq!(m.seconds_to_oom(), None);
        let t1 = t0 + 100 * 200 * MS;
        let mut again = 0;
        for i in 0..200u64 {
            let t = i * 50 * MS;
            if let Some(Transition::OomPredicted { .. }) =
                m.observe(t1 + t, base + GIB * t / 1_000_000_000, cap)
            {
                again += 1;
            }
        }
        assert_eq!(again, 1);
    }

    #[test]
    fn transition_text_is_short_and_readable() {
        let t = Transition::Level {
            from: Level::Ok,
            to: Level::Warning,
            used: 86,
            capacity: 100,
            cause: Cause::Hbm,
        };
        assert_eq!(&*t.text(), "hbm 86.0% warning (was ok)");
        let t = Transition::OomPredicted {
            seconds: 42.0,
            used: 50,
            capacity: 100,
            cause: Cause::Virtual,
        };
        assert_eq!(&*t.text(), "virtual 50.0% full in 42.0s");
    }

    fn press(used: f64, host: f64, stall: f64) -> Pressure {
        Pressure {
            used: (used * 1000.0) as u64,
            capacity: 1000,
            host_used: (host * 1000.0) as u64,
            host_capacity: 1000,
            stall,
        }
    }

    /// Issue 14: under tiering the monitor said "critical, hbm 100%, OOM in
    /// 0ms" through a healthy run. A full HBM is not an input any more; what
    /// can run out is.
    #[test]
    fn under_tiering_full_hbm_is_ok_and_what_can_run_out_is_not() {
        let mut m = Monitor::default();
        // HBM full, virtual half used, host tiers a third, little stall:
        for i in 0..100 {
            assert_eq!(
                m.observe_pressure(i * 20 * MS, &press(0.5, 0.33, 0.1)),
                None
            );
        }
        assert_eq!(m.level(), Level::Ok);
        assert_eq!(m.seconds_to_oom(), None);
        let text = |t: Option<Transition>| t.map(|t| t.text().to_string());
        // the virtual capacity nears exhaustion
        assert_eq!(
            text(m.observe_pressure(3000 * MS, &press(0.96, 0.33, 0.1))).as_deref(),
            Some("virtual 96.0% critical (was ok)")
        );
        let mut m = Monitor::default();
        assert_eq!(
            text(m.observe_pressure(0, &press(0.5, 0.9, 0.0))).as_deref(),
            Some("host tiers 90.0% warning (was ok)")
        );
        // stall time dominating: warning at 50 %, critical at 80 %, falls
        // back only 10 points below
        let mut m = Monitor::default();
        let seq = [0.6, 0.85, 0.75, 0.69, 0.45, 0.39];
        let got: Vec<Option<String>> = seq
            .iter()
            .enumerate()
            .map(|(i, &s)| text(m.observe_pressure(i as u64 * MS, &press(0.2, 0.2, s))))
            .collect();
        assert_eq!(
            got,
            vec![
                Some("stall 60.0% warning (was ok)".to_string()),
                Some("stall 85.0% critical (was warning)".to_string()),
                None,
                Some("stall 69.0% warning (was critical)".to_string()),
                None,
                Some("stall 39.0% ok (was warning)".to_string()),
            ]
        );
        // the worst dimension wins and names itself
        let mut m = Monitor::default();
        let t = m.observe_pressure(0, &press(0.9, 0.2, 0.9)).unwrap();
        assert!(
            matches!(
                t,
                Transition::Level {
                    to: Level::Critical,
                    cause: Cause::Stall,
                    ..
                }
            ),
            "{t:?}"
        );
        // no host tiers, garbage stall: no level from them
        let mut m = Monitor::default();
        let p = Pressure {
            used: 1,
            capacity: 10,
            host_used: 5,
            host_capacity: 0,
            stall: f64::NAN,
        };
        assert_eq!(m.observe_pressure(0, &p), None);
    }

    #[test]
    fn shared_monitor_never_waits_and_stays_consistent() {
        let m = std::sync::Arc::new(SharedMonitor::default());
        let cap = 100 * GIB;
        const N: u64 = 20_000;
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    let (mut done, mut skipped, mut levels) = (0u64, 0u64, Vec::new());
                    for i in 0..N {
                        // Every thread walks use up from 0 to 99 %.
                        match m.try_observe(i * 1000 + t, i * cap / 20_200, cap) {
                            Some((tr, st)) => {
                                done += 1;
                                if let Some(Transition::Level { from, to, .. }) = tr {
                                    assert_ne!(from, to);
                                    assert_eq!(st.level, to, "status reflects the transition");
                                    levels.push(to);
                                }
                            }
                            None => skipped += 1,
                        }
                    }
                    (done, skipped, levels)
                })
            })
            .collect();
        let mut levels = Vec::new();
        for h in handles {
            let (done, skipped, l) = h.join().unwrap();
            assert_eq!(done + skipped, N);
            levels.extend(l);
        }
        assert!(
            levels.contains(&Level::Warning) && levels.contains(&Level::Critical),
            "{levels:?}"
        );
        let (tr, st) = m
            .try_observe(N * 1000 + 10, 99 * GIB, cap)
            .expect("uncontended");
        assert_eq!(st.level, Level::Critical);
        assert_eq!(tr, None, "already critical");
    }
}
