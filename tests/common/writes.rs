//! u3m's operator roles against the simulator: every byte an aclnn launch
//! may write (the simulator's ACLSIM_WRITES_LOG: each output view's extent)
//! must lie in a range u3m's trace marks written for that launch (U3M_TRACE:
//! an op's outputs). A tensor marked read-only that the operator writes would
//! be a dirty chunk dropped as clean in tier mode: silent data loss.

use u3m_core::trace::event::Body;
use u3m_core::trace::reader::read_str;

/// How far ahead a simulator launch looks for its trace event (a launch the
/// simulator saw but that failed has none).
const WINDOW: usize = 16;

/// Checks the launches of one run; Ok(launches checked) or the violations.
pub fn check(trace_text: &str, writes_log: &str) -> Result<usize, Vec<String>> {
    let evs = read_str(trace_text, "trace").map_err(|e| vec![format!("trace: {e}")])?;
    let ops: Vec<(&str, Vec<(u64, u64)>)> = evs
        .iter()
        .filter_map(|e| match &e.body {
            Body::Op {
                op_type, outputs, ..
            } if op_type.starts_with("acl") => Some((
                op_type.as_str(),
                outputs.iter().map(|r| (r.addr, r.addr + r.bytes)).collect(),
            )),
            _ => None,
        })
        .collect();
    let mut bad = Vec::new();
    let (mut next, mut checked) = (0, 0);
    for line in writes_log.lines() {
        let mut f = line.split_whitespace();
        let Some(api) = f.next() else { continue };
        let extents: Vec<(u64, u64)> = f
            .filter_map(|x| {
                let (lo, hi) = x.split_once(':')?;
                Some((
                    u64::from_str_radix(lo, 16).ok()?,
                    u64::from_str_radix(hi, 16).ok()?,
                ))
            })
            .collect();
        let Some(k) = (next..ops.len().min(next + WINDOW)).find(|&k| ops[k].0 == api) else {
            continue;
        };
        next = k + 1;
        checked += 1;
        for &(lo, hi) in &extents {
            if !covered(&ops[k].1, lo, hi) {
                bad.push(format!(
                    "{api}: bytes {lo:#x}..{hi:#x} written by the simulator, not all marked \
                     written by u3m (written: {:x?})",
                    ops[k].1
                ));
            }
        }
    }
    if bad.is_empty() {
        Ok(checked)
    } else {
        Err(bad)
    }
}

/// [lo, hi) lies in the union of `ranges`.
fn covered(ranges: &[(u64, u64)], lo: u64, hi: u64) -> bool {
    let mut v = ranges.to_vec();
    v.sort_unstable();
    let mut at = lo;
    for (a, b) in v {
        if a <= at && b > at {
            at = b;
        }
        if at >= hi {
            return true;
        }
    }
    at >= hi
}
