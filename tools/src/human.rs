//! Numbers for people: sizes, durations, rates, addresses.

/// 0 B, 512 B, 1.5 KiB, 2.0 MiB, ... (binary units, one decimal).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// Bytes per second.
pub fn rate_bytes(bps: f64) -> String {
    let sign = if bps < 0.0 { "-" } else { "" };
    format!("{sign}{}/s", bytes(bps.abs() as u64))
}

/// A count per second: 0, 3.5, 120, 12.3k, 4.5M.
pub fn rate(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.1}")
    } else if v < 10_000.0 {
        format!("{v:.0}")
    } else if v < 10_000_000.0 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{:.1}M", v / 1e6)
    }
}

/// 850ms, 12s, 4m05s, 3h12m, 2d04h.
pub fn duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "-".into();
    }
    if secs < 1.0 {
        return format!("{}ms", (secs * 1000.0) as u64);
    }
    let s = secs as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// Seconds since an origin, for event times: +0.120s.
pub fn offset(ns_since: i128) -> String {
    format!(
        "{}{:.3}s",
        if ns_since < 0 { "-" } else { "+" },
        (ns_since.abs() as f64) / 1e9
    )
}

pub fn addr(a: u64) -> String {
    format!("{a:#014x}")
}

pub fn percent(used: u64, cap: u64) -> String {
    if cap == 0 {
        "-".into()
    } else {
        format!("{:.1}%", used as f64 * 100.0 / cap as f64)
    }
}

/// Local wall-clock time of day, HH:MM:SS.
pub fn clock(unix_ns: u64) -> String {
    let t = (unix_ns / 1_000_000_000) as libc::time_t;
    // SAFETY: localtime_r writes into our struct only.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return "--:--:--".into();
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(2 << 20), "2.0 MiB");
        assert_eq!(bytes(64 << 30), "64.0 GiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
        assert_eq!(duration(0.25), "250ms");
        assert_eq!(duration(42.9), "42s");
        assert_eq!(duration(245.0), "4m05s");
        assert_eq!(duration(3.0 * 3600.0 + 720.0), "3h12m");
        assert_eq!(duration(f64::INFINITY), "-");
        assert_eq!(rate(3.45), "3.5");
        assert_eq!(rate(120.2), "120");
        assert_eq!(rate(12_345.0), "12.3k");
        assert_eq!(rate_bytes(-1536.0), "-1.5 KiB/s");
        assert_eq!(offset(120_000_000), "+0.120s");
        assert_eq!(addr(0x1000), "0x000000001000");
        assert_eq!(percent(1, 0), "-");
        assert_eq!(percent(86, 100), "86.0%");
    }
}
