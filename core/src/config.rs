//! U3M_* configuration, read once at start-up from the environment. One table
//! (`VARS`) names every variable with its default and meaning; the parser,
//! the docs and `u3m run --help` all come from it. An unknown U3M_* variable
//! or a bad value is an error: the library reports it once and falls back to
//! pass-through rather than guess.

use std::fmt;
use std::path::PathBuf;

/// What libu3m.so does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward every call untouched; no stats segment.
    Off,
    /// See and report everything, move nothing (bit-for-bit transparent).
    Observe,
    /// Observe, and tier device memory (HBM / DRAM / NVMe).
    Tier,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Observe => "observe",
            Mode::Tier => "tier",
        }
    }
}

/// One documented variable.
pub struct VarSpec {
    pub name: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

/// Every U3M_* variable u3m understands.
pub const VARS: &[VarSpec] = &[
    VarSpec { name: "U3M_MODE", default: "tier", doc: "off | observe | tier" },
    VarSpec { name: "U3M_TRACE", default: "", doc: "record the run to this trace file (u3m trace format v1)" },
    VarSpec { name: "U3M_TRACE_LOSSLESS", default: "0", doc: "1: the trace recorder never drops events (producers wait)" },
    VarSpec { name: "U3M_SUMMARY", default: "", doc: "write a JSON summary of the run (tier traffic, counters) to this file at exit" },
    VarSpec { name: "U3M_SHM_DIR", default: "/dev/shm", doc: "directory of the stats segments (u3m.<pid>)" },
    VarSpec { name: "U3M_LOG", default: "warn", doc: "stderr verbosity: quiet | warn | info | debug" },
    VarSpec { name: "U3M_HOT_INTERVAL_MS", default: "500", doc: "how often the hottest ranges are published to the stats segment" },
    VarSpec { name: "U3M_MAX_ALLOCS", default: "1048576", doc: "capacity of the heat table's allocation table" },
    VarSpec { name: "U3M_MAX_RANGES", default: "262144", doc: "capacity of the heat table's tensor-range table" },
    VarSpec { name: "U3M_MIN_BYTES", default: "2M", doc: "tier mode: allocations at least this large are managed" },
    VarSpec { name: "U3M_DRAM_BYTES", default: "0", doc: "tier mode: pinned host DRAM tier size (0: half of physical RAM)" },
    VarSpec { name: "U3M_SWAP_DIR", default: "", doc: "tier mode: directory for NVMe swap files (empty: no NVMe tier)" },
    VarSpec { name: "U3M_SWAP_BYTES", default: "0", doc: "tier mode: NVMe tier size" },
    VarSpec { name: "U3M_HBM_LOW", default: "0.75", doc: "tier mode: low watermark (fraction of HBM)" },
    VarSpec { name: "U3M_HBM_HIGH", default: "0.90", doc: "tier mode: high watermark (fraction of HBM)" },
    VarSpec { name: "U3M_SSD_RATE", default: "1G", doc: "tier mode: emergency spill rate limit to NVMe, bytes/s" },
    VarSpec { name: "U3M_ALLOC_WAIT_MS", default: "1000", doc: "tier mode: how long a new allocation waits when every tier is full" },
    VarSpec { name: "U3M_OVERSUB", default: "1.5", doc: "tier mode: virtual HBM capacity as a multiple of physical" },
    VarSpec { name: "U3M_POLICY", default: "predictive", doc: "placement policy: predictive (furthest predicted next use first, prefetch of the predicted next) | seed-heat (coldest by the seed's heat first) | lru" },
    VarSpec { name: "U3M_CALIB_S", default: "600", doc: "predictor calibration period, seconds" },
    VarSpec { name: "U3M_DEBUG_PANIC_AT_OP", default: "0", doc: "testing aid: the engine panics at this operator launch (proves a panic falls back to pass-through)" },
    VarSpec { name: "U3M_WARMUP_S", default: "30", doc: "predictor re-warm time after a mode switch, seconds" },
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Quiet,
    Warn,
    Info,
    Debug,
}

/// The parsed configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub mode: Mode,
    pub trace: Option<PathBuf>,
    pub trace_lossless: bool,
    pub summary: Option<PathBuf>,
    pub shm_dir: PathBuf,
    pub log: LogLevel,
    pub hot_interval_ms: u64,
    pub max_allocs: usize,
    pub max_ranges: usize,
    pub min_bytes: u64,
    pub dram_bytes: u64,
    pub swap_dir: Option<PathBuf>,
    pub swap_bytes: u64,
    pub hbm_low: f64,
    pub hbm_high: f64,
    pub ssd_rate: u64,
    pub alloc_wait_ms: u64,
    pub oversub: f64,
    pub policy: String,
    pub calib_s: f64,
    pub warmup_s: f64,
    pub debug_panic_at_op: u64,
    /// (name, value) of every U3M_* variable that was set, for the stats
    /// segment's configuration text.
    pub set: Vec<(String, String)>,
}

/// A configuration error: the variable and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub var: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.var, self.reason)
    }
}

/// Parses a byte size: 4096, 64K, 2M, 1.5G, 1T (binary units; KiB/MiB/... and
/// a trailing B accepted).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    let mul = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches('B')
        .trim_end_matches('I')
    {
        "" => 1.0,
        "K" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        "T" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let b = v * mul;
    if b > u64::MAX as f64 {
        None
    } else {
        Some(b as u64)
    }
}

impl Config {
    /// Defaults, as if no variable were set.
    pub fn defaults() -> Config {
        Config::from_vars(std::iter::empty::<(String, String)>()).expect("defaults parse")
    }

    /// From the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_vars(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// From (name, value) pairs; names not starting with U3M_ are ignored.
    pub fn from_vars<I: IntoIterator<Item = (String, String)>>(
        vars: I,
    ) -> Result<Config, ConfigError> {
        let mut set: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(k, _)| k.starts_with("U3M_"))
            .collect();
        set.sort();
        for (k, _) in &set {
            if !VARS.iter().any(|v| v.name == k) {
                return Err(ConfigError {
                    var: k.clone(),
                    reason: "unknown variable (see `u3m run --help` for the list)".into(),
                });
            }
        }
        let get = |name: &str| -> String {
            set.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| {
                    VARS.iter()
                        .find(|v| v.name == name)
                        .map(|v| v.default.to_string())
                        .unwrap_or_default()
                })
        };
        let err = |name: &str, reason: String| ConfigError {
            var: name.to_string(),
            reason,
        };
        let size = |name: &str| -> Result<u64, ConfigError> {
            let v = get(name);
            parse_size(&v).ok_or_else(|| {
                err(
                    name,
                    format!("'{v}' is not a byte size (e.g. 4096, 512M, 2G)"),
                )
            })
        };
        let int = |name: &str| -> Result<u64, ConfigError> {
            let v = get(name);
            v.trim()
                .parse::<u64>()
                .map_err(|_| err(name, format!("'{v}' is not a non-negative integer")))
        };
        let num = |name: &str, lo: f64, hi: f64| -> Result<f64, ConfigError> {
            let v = get(name);
            match v.trim().parse::<f64>() {
                Ok(x) if x.is_finite() && x >= lo && x <= hi => Ok(x),
                _ => Err(err(name, format!("'{v}' is not a number in [{lo}, {hi}]"))),
            }
        };
        let flag = |name: &str| -> Result<bool, ConfigError> {
            match get(name).trim() {
                "0" | "" => Ok(false),
                "1" => Ok(true),
                v => Err(err(name, format!("'{v}' is not 0 or 1"))),
            }
        };
        let mode = match get("U3M_MODE").trim() {
            "off" => Mode::Off,
            "observe" => Mode::Observe,
            "tier" => Mode::Tier,
            v => {
                return Err(err(
                    "U3M_MODE",
                    format!("'{v}' is not off, observe or tier"),
                ))
            }
        };
        let log = match get("U3M_LOG").trim() {
            "quiet" => LogLevel::Quiet,
            "warn" => LogLevel::Warn,
            "info" => LogLevel::Info,
            "debug" => LogLevel::Debug,
            v => {
                return Err(err(
                    "U3M_LOG",
                    format!("'{v}' is not quiet, warn, info or debug"),
                ))
            }
        };
        let path = |name: &str| -> Option<PathBuf> {
            let v = get(name);
            if v.is_empty() {
                None
            } else {
                Some(PathBuf::from(v))
            }
        };
        let policy = get("U3M_POLICY");
        if !crate::policy::LIBRARY_POLICIES.contains(&policy.trim()) {
            return Err(err(
                "U3M_POLICY",
                format!(
                    "'{policy}' is not one of {}",
                    crate::policy::LIBRARY_POLICIES.join(", ")
                ),
            ));
        }
        let hbm_low = num("U3M_HBM_LOW", 0.0, 1.0)?;
        let hbm_high = num("U3M_HBM_HIGH", 0.0, 1.0)?;
        if hbm_low > hbm_high {
            return Err(err(
                "U3M_HBM_LOW",
                format!("{hbm_low} is above U3M_HBM_HIGH ({hbm_high})"),
            ));
        }
        let max_allocs = int("U3M_MAX_ALLOCS")?;
        if !(1024..=(1 << 26)).contains(&max_allocs) {
            return Err(err(
                "U3M_MAX_ALLOCS",
                format!("{max_allocs} is outside 1024..67108864"),
            ));
        }
        let max_ranges = int("U3M_MAX_RANGES")?;
        if !(1024..=(1 << 26)).contains(&max_ranges) {
            return Err(err(
                "U3M_MAX_RANGES",
                format!("{max_ranges} is outside 1024..67108864"),
            ));
        }
        Ok(Config {
            mode,
            trace: path("U3M_TRACE"),
            trace_lossless: flag("U3M_TRACE_LOSSLESS")?,
            summary: path("U3M_SUMMARY"),
            shm_dir: path("U3M_SHM_DIR").unwrap_or_else(|| PathBuf::from("/dev/shm")),
            log,
            hot_interval_ms: int("U3M_HOT_INTERVAL_MS")?.max(10),
            max_allocs: max_allocs as usize,
            max_ranges: max_ranges as usize,
            min_bytes: size("U3M_MIN_BYTES")?,
            dram_bytes: size("U3M_DRAM_BYTES")?,
            swap_dir: path("U3M_SWAP_DIR"),
            swap_bytes: size("U3M_SWAP_BYTES")?,
            hbm_low,
            hbm_high,
            ssd_rate: size("U3M_SSD_RATE")?,
            alloc_wait_ms: int("U3M_ALLOC_WAIT_MS")?,
            oversub: num("U3M_OVERSUB", 1.0, 64.0)?,
            policy: policy.trim().to_string(),
            calib_s: num("U3M_CALIB_S", 0.001, 1e9)?,
            warmup_s: num("U3M_WARMUP_S", 0.0, 1e9)?,
            debug_panic_at_op: int("U3M_DEBUG_PANIC_AT_OP")?,
            set,
        })
    }

    /// One line per set variable, plus the mode: the stats segment's text.
    pub fn summary(&self) -> String {
        let mut s = format!("mode={}", self.mode.name());
        for (k, v) in &self.set {
            if k != "U3M_MODE" {
                s.push(' ');
                s.push_str(k);
                s.push('=');
                s.push_str(v);
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn defaults_are_tier() {
        let c = Config::defaults();
        assert_eq!(c.mode, Mode::Tier);
        assert_eq!(c.min_bytes, 2 << 20);
        assert_eq!(c.hbm_high, 0.90);
        assert!(c.trace.is_none());
    }

    #[test]
    fn unknown_variable_is_named() {
        let e = cfg(&[("U3M_MOED", "tier")]).unwrap_err();
        assert_eq!(e.var, "U3M_MOED");
        assert!(e.reason.contains("unknown"));
    }

    #[test]
    fn bad_values_are_named() {
        assert_eq!(cfg(&[("U3M_MODE", "fast")]).unwrap_err().var, "U3M_MODE");
        assert_eq!(
            cfg(&[("U3M_MIN_BYTES", "lots")]).unwrap_err().var,
            "U3M_MIN_BYTES"
        );
        assert_eq!(
            cfg(&[("U3M_HBM_LOW", "0.95")]).unwrap_err().var,
            "U3M_HBM_LOW"
        );
        assert_eq!(
            cfg(&[("U3M_OVERSUB", "-1")]).unwrap_err().var,
            "U3M_OVERSUB"
        );
        assert_eq!(
            cfg(&[("U3M_TRACE_LOSSLESS", "yes")]).unwrap_err().var,
            "U3M_TRACE_LOSSLESS"
        );
        let e = cfg(&[("U3M_POLICY", "belady")]).unwrap_err();
        assert!(
            e.var == "U3M_POLICY" && e.reason.contains("not one of seed-heat, lru, predictive"),
            "{e}"
        );
        assert_eq!(cfg(&[("U3M_CALIB_S", "0")]).unwrap_err().var, "U3M_CALIB_S");
        assert_eq!(
            cfg(&[("U3M_WARMUP_S", "-1")]).unwrap_err().var,
            "U3M_WARMUP_S"
        );
    }

    #[test]
    fn predictive_takes_its_periods() {
        let c = cfg(&[
            ("U3M_POLICY", "predictive"),
            ("U3M_CALIB_S", "2.5"),
            ("U3M_WARMUP_S", "0"),
        ])
        .unwrap();
        assert_eq!(
            (c.policy.as_str(), c.calib_s, c.warmup_s),
            ("predictive", 2.5, 0.0)
        );
        let d = Config::defaults();
        assert_eq!((d.calib_s, d.warmup_s), (600.0, 30.0));
        assert_eq!(
            crate::policy::by_config(&c).map(|p| p.name()),
            Some("predictive")
        );
    }

    #[test]
    fn other_variables_are_ignored() {
        assert!(cfg(&[("PATH", "/bin"), ("ACLSIM_HBM_BYTES", "1G")]).is_ok());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("64KiB"), Some(64 << 10));
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn summary_lists_set_variables() {
        let c = cfg(&[("U3M_MODE", "observe"), ("U3M_TRACE", "/tmp/t")]).unwrap();
        assert_eq!(c.summary(), "mode=observe U3M_TRACE=/tmp/t");
        assert_eq!(cfg(&[]).unwrap().summary(), "mode=tier");
    }
}
