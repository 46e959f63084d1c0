//! What u3m tells the operator, kept apart from the residency code so that
//! each call site is one line: the start line and the exit summary at
//! `U3M_LOG=info`, the migration lines at `debug` (at most four a second),
//! the one line an allocation refused by the virtual capacity or full host
//! tiers gets, the stall-time account, and the per-tier flows the stats
//! segment publishes (counts and bytes from the same figures, so they agree).
//!
//! Text is built by pure functions (unit-tested below); `Operator` holds the
//! little state they need (what was already said, when).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use super::runtime::CHUNK;
use crate::config::{size_text, Config, Mode};
use crate::residency::Counters;
use crate::shm::layout::{TIERS, TIER_DRAM, TIER_HBM, TIER_NVME};

/// Bytes in binary units with one decimal: "130.0 MiB", "0 B".
pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// Chunks moved into and out of each tier (HBM, DRAM, NVMe). Bytes are
/// always chunks × 2 MiB: every movement is a whole chunk copied. A chunk
/// made resident without a copy (fresh memory, or about to be overwritten
/// whole) moved nothing and is not counted here (it is a fault-in all the
/// same), nor is a clean chunk dropped from HBM (its host copy is current).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flows {
    pub chunks_in: [u64; TIERS],
    pub chunks_out: [u64; TIERS],
}

impl Flows {
    pub fn of(c: &Counters) -> Flows {
        let copied_in = c.fault_bytes / CHUNK; // DRAM or NVMe -> HBM, on demand
        let prefetched = c.prefetch_bytes / CHUNK; // DRAM -> HBM, ahead of use
        let copied_out = c.eviction_bytes / CHUNK; // HBM -> DRAM or NVMe
        let mut f = Flows::default();
        f.chunks_in[TIER_HBM] = copied_in + prefetched;
        f.chunks_out[TIER_HBM] = copied_out;
        f.chunks_in[TIER_DRAM] = c.to_dram;
        f.chunks_out[TIER_DRAM] = copied_in.saturating_sub(c.from_nvme) + prefetched + c.spilled;
        f.chunks_in[TIER_NVME] = c.to_nvme;
        f.chunks_out[TIER_NVME] = c.from_nvme;
        f
    }

    pub fn bytes_in(&self, tier: usize) -> u64 {
        self.chunks_in[tier] * CHUNK
    }

    pub fn bytes_out(&self, tier: usize) -> u64 {
        self.chunks_out[tier] * CHUNK
    }

    /// What moved since `earlier`.
    pub fn since(&self, earlier: &Flows) -> Flows {
        let mut d = Flows::default();
        for t in 0..TIERS {
            d.chunks_in[t] = self.chunks_in[t].saturating_sub(earlier.chunks_in[t]);
            d.chunks_out[t] = self.chunks_out[t].saturating_sub(earlier.chunks_out[t]);
        }
        d
    }

    pub fn is_empty(&self) -> bool {
        self.chunks_in
            .iter()
            .chain(&self.chunks_out)
            .all(|&c| c == 0)
    }

    /// "HBM→host 34 chunks (68.0 MiB), host→HBM 22 chunks (44.0 MiB),
    /// DRAM→NVMe 3 (6.0 MiB)"
    pub fn text(&self) -> String {
        let dram_to_nvme = self.chunks_in[TIER_NVME]
            .saturating_sub(self.chunks_out[TIER_HBM].saturating_sub(self.chunks_in[TIER_DRAM]));
        let mut parts = vec![
            format!(
                "HBM→host {} chunks ({})",
                self.chunks_out[TIER_HBM],
                bytes(self.bytes_out(TIER_HBM))
            ),
            format!(
                "host→HBM {} chunks ({})",
                self.chunks_in[TIER_HBM],
                bytes(self.bytes_in(TIER_HBM))
            ),
        ];
        if self.chunks_out[TIER_NVME] > 0 {
            parts.push(format!("of which from NVMe {}", self.chunks_out[TIER_NVME]));
        }
        if dram_to_nvme > 0 {
            parts.push(format!(
                "DRAM→NVMe {dram_to_nvme} ({})",
                bytes(dram_to_nvme * CHUNK)
            ));
        }
        parts.join(", ")
    }
}

/// Publishes the flows into a device's gauges (the process-wide figures
/// live on device 0): chunks and bytes in and out of every tier.
pub fn publish_flows(g: &crate::shm::layout::DeviceGauges, f: &Flows) {
    for t in 0..TIERS {
        g.migrations_in[t].store(f.chunks_in[t], Relaxed);
        g.migrations_out[t].store(f.chunks_out[t], Relaxed);
        g.migration_bytes_in[t].store(f.bytes_in(t), Relaxed);
        g.migration_bytes_out[t].store(f.bytes_out(t), Relaxed);
    }
}

/// The start line: version, mode, HBM and the virtual capacity, the tiers
/// and their sizes, the policy.
pub fn start_line(cfg: &Config, hbm: Option<u64>, dram_limit: u64, nvme: u64) -> String {
    let mut s = format!(
        "start: u3m {}, pid {}, {} mode",
        crate::VERSION,
        std::process::id(),
        cfg.mode.name()
    );
    match (cfg.mode, hbm) {
        (Mode::Tier, Some(h)) => s.push_str(&format!(
            ", HBM {} × {} = {} virtual (U3M_OVERSUB)",
            bytes(h),
            cfg.oversub,
            bytes((h as f64 * cfg.oversub) as u64)
        )),
        (Mode::Tier, None) => s.push_str(&format!(", virtual capacity {} × HBM", cfg.oversub)),
        (_, Some(h)) => s.push_str(&format!(", HBM {}", bytes(h))),
        _ => {}
    }
    if cfg.mode == Mode::Tier {
        s.push_str(&format!(", DRAM tier {} pinned", bytes(dram_limit)));
        match &cfg.swap_dir {
            Some(d) if nvme > 0 => {
                s.push_str(&format!(", NVMe tier {} in {}", bytes(nvme), d.display()))
            }
            _ => s.push_str(", no NVMe tier (U3M_SWAP_DIR)"),
        }
        s.push_str(&format!(
            ", policy {}, managing allocations ≥ {}",
            cfg.policy,
            size_text(cfg.min_bytes)
        ));
    }
    s
}

/// Figures of a whole run for the exit summary.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunFigures {
    pub wall_ns: u64,
    pub stall_ns: u64,
    pub peak_hbm: u64,
    pub hbm: u64,
    pub refusals: u64,
    pub ops: u64,
}

/// The exit summary: bytes moved each way, peak HBM, stall, refusals.
pub fn exit_summary(mode: Mode, c: &Counters, r: &RunFigures) -> String {
    let secs = r.wall_ns as f64 / 1e9;
    let peak = if r.hbm > 0 {
        format!("peak HBM {} of {}", bytes(r.peak_hbm), bytes(r.hbm))
    } else {
        format!("peak HBM {}", bytes(r.peak_hbm))
    };
    if mode != Mode::Tier {
        return format!(
            "summary: {secs:.1} s, {} mode: {} operator launches seen, {peak}, nothing moved",
            mode.name(),
            r.ops
        );
    }
    let f = Flows::of(c);
    let stall_pct = if r.wall_ns > 0 {
        100.0 * r.stall_ns as f64 / r.wall_ns as f64
    } else {
        0.0
    };
    let mut moved = format!(
        "HBM→host {} chunks ({}; {} evictions, {} of them clean drops), host→HBM {} chunks ({}; {} faults-in, {} prefetched)",
        f.chunks_out[TIER_HBM],
        bytes(f.bytes_out(TIER_HBM)),
        c.evictions,
        c.clean_drops,
        f.chunks_in[TIER_HBM],
        bytes(f.bytes_in(TIER_HBM)),
        c.faults_in,
        c.prefetches
    );
    if c.to_nvme + c.from_nvme > 0 {
        moved.push_str(&format!(
            ", NVMe in {} out {}",
            bytes(f.bytes_in(TIER_NVME)),
            bytes(f.bytes_out(TIER_NVME))
        ));
    }
    let mut line = format!(
        "summary: {secs:.1} s: {moved}; {peak}; calls stalled {:.2} s in u3m ({stall_pct:.0} % of wall time); {} allocation{} refused",
        r.stall_ns as f64 / 1e9,
        r.refusals,
        if r.refusals == 1 { "" } else { "s" }
    );
    if c.host_maps > 0 {
        line.push_str(&format!(
            "; host-mapped {} chunks ({} copied into host handles), {} brought back",
            c.host_maps,
            bytes(c.host_map_bytes),
            c.host_unmaps
        ));
    }
    if c.stream_maps > 0 || c.stream_reads > 0 {
        line.push_str(&format!(
            "; read-once streams mapped instead of copied: {} chunks, {} reads in place",
            c.stream_maps, c.stream_reads
        ));
    }
    if c.probe_verdicts > 0 {
        line.push_str(&format!(
            "; read-once probe: mapping timed faster in {} of {} probes",
            c.probe_maps, c.probe_verdicts
        ));
    }
    if c.refused_oversize > 0 {
        line.push_str(&format!(
            "; {} call{} refused as larger than HBM",
            c.refused_oversize,
            if c.refused_oversize == 1 { "" } else { "s" }
        ));
    }
    line
}

/// Which limit refused an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// The virtual capacity (U3M_OVERSUB × HBM).
    Virtual,
    /// The host tiers cannot hold what would not be resident.
    HostTiers,
}

/// An allocation tier mode refused, with the figures that refused it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Refusal {
    pub dev: u32,
    pub size: u64,
    pub limit: Limit,
    /// Device memory the process holds, and the virtual capacity.
    pub virtual_used: u64,
    pub virtual_total: u64,
    pub hbm: u64,
    pub oversub: f64,
    /// What the host tiers would have to hold, and their limit.
    pub host_need: u64,
    pub host_limit: u64,
    pub waited_ms: u64,
}

impl Refusal {
    /// One line: the numbers and the variable to change.
    pub fn line(&self) -> String {
        let what = format!(
            "allocation of {} on device {} refused (207001)",
            bytes(self.size),
            self.dev
        );
        match self.limit {
            Limit::Virtual => {
                let need = (self.virtual_used + self.size) as f64 / self.hbm.max(1) as f64;
                format!(
                    "{what}: {} of the virtual capacity {} ({} × HBM {}) is in use; raise U3M_OVERSUB (≥ {:.2} would fit this allocation)",
                    bytes(self.virtual_used),
                    bytes(self.virtual_total),
                    self.oversub,
                    bytes(self.hbm),
                    (need * 100.0).ceil() / 100.0
                )
            }
            Limit::HostTiers => format!(
                "{what} after waiting {} ms: the host tiers would have to hold {} but hold at most {}; raise U3M_DRAM_BYTES, or add an NVMe tier (U3M_SWAP_DIR)",
                self.waited_ms,
                bytes(self.host_need),
                bytes(self.host_limit)
            ),
        }
    }
}

/// The line for a call refused before launch because its memory cannot all
/// be accessible at once.
pub fn oversize_line(what: &str, o: &crate::residency::Oversize) -> String {
    let why = match o.host_map_failed {
        None => "host mapping is off (U3M_HOST_MAP=off)".to_string(),
        Some(e) => format!("host memory could not be mapped for it (error {})", e.raw()),
    };
    format!(
        "{what} on device {} needs {} of device memory at once; HBM is {} ({} of it available to managed memory) and {why}: refused before launch (207001)",
        o.dev,
        bytes(o.need),
        bytes(o.hbm),
        bytes(o.room)
    )
}

/// Migration lines and events at most this often.
pub const ACTIVITY_PERIOD_NS: u64 = 250_000_000;
/// A refusal line at most this often (the first always).
const REFUSAL_PERIOD_NS: u64 = 1_000_000_000;

/// What the engine has told the operator so far, and the stall account.
#[derive(Default)]
pub struct Operator {
    /// ns calls spent in u3m making memory resident or waiting for room.
    pub stall_ns: AtomicU64,
    pub refusals: AtomicU64,
    started: AtomicBool,
    last_refusal_ns: AtomicU64,
    /// Flows and time of the last activity report; stall of the last tick.
    activity: Mutex<(Flows, u64)>,
    stall_seen: Mutex<(u64, u64)>,
}

impl Operator {
    /// True the first time only: the caller prints the start line.
    pub fn first_start(&self) -> bool {
        !self.started.swap(true, Relaxed)
    }

    /// Counts a refusal; the line to print, unless one was printed less
    /// than a second ago.
    pub fn refused(&self, now_ns: u64, r: &Refusal) -> Option<String> {
        let n = self.refusals.fetch_add(1, Relaxed);
        let last = self.last_refusal_ns.load(Relaxed);
        if n > 0 && now_ns.saturating_sub(last) < REFUSAL_PERIOD_NS {
            return None;
        }
        self.last_refusal_ns.store(now_ns, Relaxed);
        Some(r.line())
    }

    /// What moved since the last report, when at least `ACTIVITY_PERIOD_NS`
    /// passed and something did: (flows, ns covered).
    pub fn activity(&self, now_ns: u64, c: &Counters) -> Option<(Flows, u64)> {
        let mut a = self.activity.lock().ok()?;
        let (prev, at) = *a;
        if at != 0 && now_ns.saturating_sub(at) < ACTIVITY_PERIOD_NS {
            return None;
        }
        let cur = Flows::of(c);
        *a = (cur, now_ns);
        if at == 0 {
            return None;
        }
        let d = cur.since(&prev);
        (!d.is_empty()).then_some((d, now_ns - at))
    }

    /// Share of wall time spent stalled since the previous call (0..1; calls
    /// on several threads can add up to more than the wall time: capped).
    pub fn stall_share(&self, now_ns: u64) -> f64 {
        let stall = self.stall_ns.load(Relaxed);
        let Ok(mut s) = self.stall_seen.lock() else {
            return 0.0;
        };
        let (prev_stall, prev_ns) = *s;
        *s = (stall, now_ns);
        if prev_ns == 0 || now_ns <= prev_ns {
            return 0.0;
        }
        ((stall - prev_stall.min(stall)) as f64 / (now_ns - prev_ns) as f64).min(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn counters() -> Counters {
        // 10 chunks out (8 copied: 6 to DRAM, 2 straight to NVMe; 2 clean),
        // 7 copied back (5 from DRAM, 2 from NVMe) plus 3 prefetched, 1 spilled
        Counters {
            faults_in: 9, // 7 copied + 2 fresh
            fault_bytes: 7 * CHUNK,
            evictions: 10,
            eviction_bytes: 8 * CHUNK,
            clean_drops: 2,
            to_dram: 6,
            to_nvme: 3,
            from_nvme: 2,
            spilled: 1,
            prefetches: 3,
            prefetch_bytes: 3 * CHUNK,
            ..Counters::default()
        }
    }

    /// Issue 14: `dram.bytes_in` was 0 with `dram.in` 841. Counts and bytes
    /// now come from the same figures, and the flows balance.
    #[test]
    fn flows_agree_with_counts_and_balance() {
        let c = counters();
        let f = Flows::of(&c);
        for t in 0..TIERS {
            assert_eq!(f.bytes_in(t), f.chunks_in[t] * CHUNK);
            assert_eq!(f.bytes_out(t), f.chunks_out[t] * CHUNK);
        }
        assert_eq!(f.chunks_out[TIER_HBM], 8);
        assert_eq!(f.chunks_in[TIER_HBM], 10);
        // what left HBM went to DRAM or straight to NVMe
        let direct_to_nvme = c.to_nvme - c.spilled;
        assert_eq!(
            f.chunks_out[TIER_HBM],
            f.chunks_in[TIER_DRAM] + direct_to_nvme
        );
        // what came back came from DRAM or NVMe
        assert_eq!(
            f.chunks_in[TIER_HBM],
            f.chunks_out[TIER_DRAM] - c.spilled + f.chunks_out[TIER_NVME]
        );
        assert_eq!(
            f.text(),
            "HBM→host 8 chunks (16.0 MiB), host→HBM 10 chunks (20.0 MiB), of which from NVMe 2, DRAM→NVMe 1 (2.0 MiB)"
        );
        let later = Flows::of(&Counters {
            eviction_bytes: 9 * CHUNK,
            to_dram: 7,
            ..c
        });
        let d = later.since(&f);
        assert_eq!((d.chunks_out[TIER_HBM], d.chunks_in[TIER_DRAM]), (1, 1));
        assert!(Flows::default().since(&f).is_empty());
    }

    #[test]
    fn start_line_says_what_is_active() {
        let cfg = Config::from_vars([("U3M_OVERSUB".to_string(), "1.5".to_string())]).unwrap();
        let s = start_line(&cfg, Some(130 * MIB), 12 << 30, 0);
        assert!(
            s.starts_with(&format!("start: u3m {}, pid ", crate::VERSION)),
            "{s}"
        );
        assert!(
            s.ends_with(", tier mode, HBM 130.0 MiB × 1.5 = 195.0 MiB virtual (U3M_OVERSUB), DRAM tier 12.0 GiB pinned, no NVMe tier (U3M_SWAP_DIR), policy predictive, managing allocations ≥ 2M"),
            "{s}"
        );
        let cfg = Config::from_vars([
            ("U3M_SWAP_DIR".to_string(), "/nvme".to_string()),
            ("U3M_MODE".to_string(), "tier".to_string()),
        ])
        .unwrap();
        assert!(start_line(&cfg, None, 1 << 30, 4 << 30).contains(", NVMe tier 4.0 GiB in /nvme"));
        let cfg = Config::from_vars([("U3M_MODE".to_string(), "observe".to_string())]).unwrap();
        assert!(start_line(&cfg, Some(1 << 30), 0, 0).ends_with("observe mode, HBM 1.0 GiB"));
    }

    #[test]
    fn exit_summary_has_the_figures() {
        let r = RunFigures {
            wall_ns: 10_000_000_000,
            stall_ns: 2_500_000_000,
            peak_hbm: 128 * MIB,
            hbm: 130 * MIB,
            refusals: 1,
            ops: 5,
        };
        let s = exit_summary(Mode::Tier, &counters(), &r);
        assert_eq!(
            s,
            "summary: 10.0 s: HBM→host 8 chunks (16.0 MiB; 10 evictions, 2 of them clean drops), host→HBM 10 chunks (20.0 MiB; 9 faults-in, 3 prefetched), NVMe in 6.0 MiB out 4.0 MiB; peak HBM 128.0 MiB of 130.0 MiB; calls stalled 2.50 s in u3m (25 % of wall time); 1 allocation refused"
        );
        // U3M_HOST_MAP=stream: the maps of read-once streams and the reads
        // served in place follow the host-mapped figures
        let c = Counters {
            host_maps: 5,
            host_map_bytes: 5 * CHUNK,
            stream_maps: 4,
            stream_reads: 12,
            ..counters()
        };
        let t = exit_summary(Mode::Tier, &c, &r);
        assert!(
            t.ends_with("; 1 allocation refused; host-mapped 5 chunks (10.0 MiB copied into host handles), 0 brought back; read-once streams mapped instead of copied: 4 chunks, 12 reads in place"),
            "{t}"
        );
        let s = exit_summary(Mode::Observe, &Counters::default(), &r);
        assert_eq!(
            s,
            "summary: 10.0 s, observe mode: 5 operator launches seen, peak HBM 128.0 MiB of 130.0 MiB, nothing moved"
        );
    }

    #[test]
    fn refusal_lines_name_the_numbers_and_the_variable() {
        let r = Refusal {
            dev: 0,
            size: 64 * MIB,
            limit: Limit::Virtual,
            virtual_used: 160 * MIB,
            virtual_total: 195 * MIB,
            hbm: 130 * MIB,
            oversub: 1.5,
            host_need: 0,
            host_limit: 0,
            waited_ms: 0,
        };
        assert_eq!(
            r.line(),
            "allocation of 64.0 MiB on device 0 refused (207001): 160.0 MiB of the virtual capacity 195.0 MiB (1.5 × HBM 130.0 MiB) is in use; raise U3M_OVERSUB (≥ 1.73 would fit this allocation)"
        );
        let h = Refusal {
            limit: Limit::HostTiers,
            host_need: 300 * MIB,
            host_limit: 256 * MIB,
            waited_ms: 1000,
            ..r
        };
        assert!(h.line().ends_with("after waiting 1000 ms: the host tiers would have to hold 300.0 MiB but hold at most 256.0 MiB; raise U3M_DRAM_BYTES, or add an NVMe tier (U3M_SWAP_DIR)"), "{}", h.line());
        // the first line always, then at most one a second; every one counted
        let o = Operator::default();
        assert!(o.refused(5, &r).is_some());
        assert!(o.refused(10, &r).is_none());
        assert!(o.refused(1_000_000_006, &r).is_some());
        assert_eq!(o.refusals.load(Relaxed), 3);
    }

    #[test]
    fn activity_is_reported_at_most_every_period_and_only_when_something_moved() {
        let o = Operator::default();
        let mut c = Counters::default();
        assert_eq!(o.activity(1, &c), None, "the first call sets the baseline");
        c.eviction_bytes = 4 * CHUNK;
        c.to_dram = 4;
        assert_eq!(o.activity(1 + ACTIVITY_PERIOD_NS / 2, &c), None, "too soon");
        let (f, dt) = o.activity(1 + ACTIVITY_PERIOD_NS, &c).expect("moved");
        assert_eq!((f.chunks_out[TIER_HBM], dt), (4, ACTIVITY_PERIOD_NS));
        assert_eq!(
            o.activity(1 + 2 * ACTIVITY_PERIOD_NS, &c),
            None,
            "nothing moved"
        );
    }

    #[test]
    fn stall_share_is_a_fraction_of_wall_time() {
        let o = Operator::default();
        assert_eq!(o.stall_share(1_000), 0.0);
        o.stall_ns.fetch_add(250, Relaxed);
        assert_eq!(o.stall_share(2_000), 0.25);
        o.stall_ns.fetch_add(5_000, Relaxed);
        assert_eq!(o.stall_share(3_000), 1.0, "several threads: capped");
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1536), "1.5 KiB");
    }
}
