//! A schedule of evictions the library follows (`U3M_PLAN=FILE`): for
//! each gap between two uses of a chunk that an outside planner has the
//! chunk out of HBM, the call before the gap and the chunk. After that
//! call is queued (`finish`), the chunk joins the device's planned list
//! and leaves as soon as its uses allow (planned.rs) — ordered after them
//! on the device with U3M_HANDOFF. Demand evictions still choose by the
//! policy.
//!
//! The file is in the library's own terms, so that a program run again
//! meets it call for call (`u3m replay --plan-export` writes one from a
//! trace-keyed plan): one entry per line, `CALL ALLOC CHUNK [DEV]`, `#`
//! starts a comment.
//! - CALL: u3m's logical clock at the call — the ordinal of the call
//!   among those that touch managed memory, from 1 (`Residency::now`);
//! - ALLOC: the allocation's ordinal among the ones u3m manages on the
//!   device, from 0, in the order they were made;
//! - CHUNK: the 2 MiB chunk of the allocation, from 0;
//! - DEV: the device (default 0).
//!
//! One line `repeat FROM PERIOD` makes it a loop's: the entries from call
//! FROM on (all before FROM + PERIOD) hold again every PERIOD calls — a
//! training step planned once serves every later step (`u3m replay
//! --plan-export` writes it so when the plan's steps repeat).
//!
//! A schedule that does not match the run is not followed in part
//! silently: the first entry whose chunk the call on its line does not
//! touch stops it for good, and the engine names the entry (`stopped`).

use std::path::Path;

use super::MAX_DEVICES;

/// The largest schedule file read (a larger one is a mistake, and would
/// hold the program's memory for nothing).
const MAX_FILE: u64 = 256 << 20;

/// One entry: after the call at `clock`, chunk `chunk` of backing `id`
/// leaves; `line` is its line in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub clock: u64,
    pub id: u64,
    pub chunk: u32,
    pub line: u64,
}

/// A loaded schedule: each device's entries by clock.
#[derive(Debug)]
pub struct Schedule {
    pub name: String,
    pub by_dev: Vec<Vec<Entry>>,
    /// `repeat FROM PERIOD`: (FROM, PERIOD).
    pub repeat: Option<(u64, u64)>,
}

/// The backing id of a device's `alloc`-th managed allocation (ids are
/// the device's index modulo `MAX_DEVICES`, from `MAX_DEVICES`: mod.rs).
pub fn id_of(dev: u32, alloc: u64) -> Option<u64> {
    alloc
        .checked_add(1)?
        .checked_mul(MAX_DEVICES as u64)?
        .checked_add(dev as u64)
}

/// The inverse of `id_of`: (device, allocation ordinal).
pub fn ordinal_of(id: u64) -> (u32, u64) {
    let m = MAX_DEVICES as u64;
    ((id % m) as u32, (id / m).saturating_sub(1))
}

impl Schedule {
    pub fn load(path: &Path) -> Result<Schedule, String> {
        let name = path.display().to_string();
        let len = std::fs::metadata(path)
            .map_err(|e| format!("U3M_PLAN={name}: {e}"))?
            .len();
        if len > MAX_FILE {
            return Err(format!(
                "U3M_PLAN={name}: {len} bytes, more than the {MAX_FILE} a schedule may have (about 20 million entries)"
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("U3M_PLAN={name}: {e}"))?;
        Schedule::parse(&name, &text)
    }

    pub fn parse(name: &str, text: &str) -> Result<Schedule, String> {
        let mut by_dev: Vec<Vec<Entry>> = Vec::new();
        let mut repeat = None;
        for (n, raw) in text.lines().enumerate() {
            let line = n as u64 + 1;
            let f: Vec<&str> = raw
                .split('#')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            if f.is_empty() {
                continue;
            }
            let bad = |why: &str| {
                format!(
                    "U3M_PLAN={name}:{line}: {why} (expected 'CALL ALLOC CHUNK [DEV]', decimal), got '{}'",
                    raw.trim()
                )
            };
            let num = |s: &str| s.parse::<u64>().map_err(|_| bad("not a number"));
            if f[0] == "repeat" {
                let nums = match (f.len(), repeat) {
                    (3, None) => (f[1].parse::<u64>(), f[2].parse::<u64>()),
                    _ => (Ok(0), Ok(0)),
                };
                let (Ok(from @ 1..), Ok(period @ 1..)) = nums else {
                    return Err(format!(
                        "U3M_PLAN={name}:{line}: expected 'repeat FROM PERIOD', FROM and PERIOD from 1, once, got '{}'",
                        raw.trim()
                    ));
                };
                repeat = Some((from, period));
                continue;
            }
            if !(3..=4).contains(&f.len()) {
                return Err(bad("wrong number of fields"));
            }
            let (clock, alloc, chunk) = (num(f[0])?, num(f[1])?, num(f[2])?);
            let dev = match f.get(3) {
                Some(d) => num(d)?,
                None => 0,
            };
            if clock == 0 {
                return Err(bad("CALL counts from 1"));
            }
            if dev >= MAX_DEVICES as u64 {
                return Err(bad(&format!(
                    "DEV is {dev}, u3m manages devices 0..{MAX_DEVICES}"
                )));
            }
            let chunk = u32::try_from(chunk).map_err(|_| bad("CHUNK too large"))?;
            let id = id_of(dev as u32, alloc).ok_or_else(|| bad("ALLOC too large"))?;
            let d = dev as usize;
            if by_dev.len() <= d {
                by_dev.resize_with(d + 1, Vec::new);
            }
            by_dev[d].push(Entry {
                clock,
                id,
                chunk,
                line,
            });
        }
        if by_dev.iter().all(|v| v.is_empty()) {
            return Err(format!("U3M_PLAN={name}: no entries"));
        }
        for v in &mut by_dev {
            // stable: entries of one call keep the file's order
            v.sort_by_key(|e| e.clock);
        }
        if let Some((from, period)) = repeat {
            // a loop's entries lie in one period
            let end = from.saturating_add(period);
            if let Some(e) = by_dev
                .iter()
                .flatten()
                .filter(|e| e.clock >= end)
                .min_by_key(|e| e.line)
            {
                return Err(format!(
                    "U3M_PLAN={name}:{}: call {} is past the repeated period (calls {from}..{end}): a loop's entries lie in one period",
                    e.line, e.clock
                ));
            }
        }
        Ok(Schedule {
            name: name.to_string(),
            by_dev,
            repeat,
        })
    }

    /// Device `dev`'s entries for the call at `clock`.
    pub fn at(&self, dev: u32, clock: u64) -> &[Entry] {
        let Some(v) = self.by_dev.get(dev as usize) else {
            return &[];
        };
        let clock = match self.repeat {
            Some((from, period)) if clock >= from => from + (clock - from) % period,
            _ => clock,
        };
        let lo = v.partition_point(|e| e.clock < clock);
        let hi = lo + v[lo..].partition_point(|e| e.clock == clock);
        &v[lo..hi]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_file_is_read_by_call_and_names_its_bad_lines() {
        let s = Schedule::parse("p", "# c\n12 0 3\n9 2 0 1 # x\n12 1 7\n\n").unwrap();
        assert_eq!(s.by_dev.iter().map(Vec::len).sum::<usize>(), 3);
        let e = |clock, dev, alloc, chunk, line| Entry {
            clock,
            id: id_of(dev, alloc).unwrap(),
            chunk,
            line,
        };
        assert_eq!(s.at(0, 12), &[e(12, 0, 0, 3, 2), e(12, 0, 1, 7, 4)]);
        assert_eq!(s.at(1, 9), &[e(9, 1, 2, 0, 3)]);
        assert!(s.at(0, 9).is_empty() && s.at(0, 13).is_empty() && s.at(5, 12).is_empty());
        assert_eq!(ordinal_of(id_of(3, 41).unwrap()), (3, 41));
        // the first backing of device 0 is MAX_DEVICES (mod.rs first_id)
        assert_eq!(id_of(0, 0), Some(MAX_DEVICES as u64));
        for (bad, why) in [
            ("12 0", "wrong number of fields"),
            ("12 0 1 0 9", "wrong number of fields"),
            ("x 0 1", "not a number"),
            ("12 0x1 1", "not a number"),
            ("0 0 1", "CALL counts from 1"),
            ("12 0 1 16", "DEV is 16"),
            ("12 0 4294967296", "CHUNK too large"),
            ("12 18446744073709551615 1", "ALLOC too large"),
        ] {
            let e = Schedule::parse("p", bad).unwrap_err();
            assert!(e.starts_with(&format!("U3M_PLAN=p:1: {why}")), "{bad}: {e}");
        }
        assert!(Schedule::parse("p", "# none\n")
            .unwrap_err()
            .contains("no entries"));
    }

    /// `repeat FROM PERIOD`: the period's entries hold at every later call
    /// PERIOD on; calls before FROM keep their own; an entry past the
    /// period, a second `repeat` or a zero are refused, named.
    #[test]
    fn a_repeated_schedule_holds_every_period() {
        let s = Schedule::parse("p", "2 0 0\nrepeat 10 5\n10 1 0\n12 1 1\n14 1 2\n").unwrap();
        let calls = |c| s.at(0, c).iter().map(|e| e.chunk).collect::<Vec<_>>();
        assert_eq!(calls(2), vec![0]);
        assert_eq!(calls(7), Vec::<u32>::new());
        for k in 0..3 {
            assert_eq!(calls(10 + 5 * k), vec![0]);
            assert_eq!(calls(12 + 5 * k), vec![1]);
            assert_eq!(calls(14 + 5 * k), vec![2]);
            assert!(calls(11 + 5 * k).is_empty() && calls(13 + 5 * k).is_empty());
        }
        assert!(s.at(0, 1_000_000_000_002).iter().all(|e| e.chunk == 1));
        for (bad, why) in [
            (
                "repeat 10 5\n15 0 0\n",
                "U3M_PLAN=p:2: call 15 is past the repeated period",
            ),
            (
                "repeat 10 5\nrepeat 10 5\n10 0 0\n",
                "U3M_PLAN=p:2: expected 'repeat FROM PERIOD'",
            ),
            (
                "repeat 10 0\n10 0 0\n",
                "U3M_PLAN=p:1: expected 'repeat FROM PERIOD'",
            ),
            (
                "repeat 10\n10 0 0\n",
                "U3M_PLAN=p:1: expected 'repeat FROM PERIOD'",
            ),
        ] {
            let e = Schedule::parse("p", bad).unwrap_err();
            assert!(e.starts_with(why), "{bad}: {e}");
        }
    }
}
