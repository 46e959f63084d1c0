//! `--policy plan --plan FILE`: an outside schedule run through the
//! engine's pipeline. The schedule names, for each gap between two uses of
//! a chunk that it has the chunk out of HBM, the trace line of the use
//! before the gap and the chunk's address (`bench/plan_schedule.py` writes
//! one from `bench/pipeline_bound.py`'s optimum). The `plan` policy orders
//! victims as Belady's MIN, with the chunks the schedule has out now first
//! (oldest last use first: the page that frees soonest), and the driver
//! has the engine evict each as soon as its last use before the gap is
//! complete (`Residency::evict_planned` after each event; core
//! residency/planned.rs). So the run moves the
//! schedule's bytes at the times the pipeline lets it, and its simulated
//! time says what that schedule costs under the event model chosen.
//!
//! File: one entry per line, `LINE ADDR [DEV]` — after the event on trace
//! line LINE, the 2 MiB chunk holding device address ADDR (hex, `0x`
//! optional) of device DEV (default 0) is out until its next use; `#`
//! starts a comment. An entry whose line holds no event, or whose chunk is
//! in no allocation live there or not touched by that event, stops the run
//! with an error naming it: a misaligned schedule would otherwise be
//! followed in part, silently. Entries past the trace's last event are
//! ignored (a trace cut short, as `bench/phases.py` replays one).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use u3m_core::policy::{Belady, Cand, Place, Placement, Touch};

/// A schedule file, by trace line.
#[derive(Debug, Default)]
pub struct Plan {
    pub name: String,
    /// trace line -> (plan file line, device, address)
    pub by_line: HashMap<u64, Vec<(u64, u32, u64)>>,
    pub entries: usize,
}

impl Plan {
    pub fn load(path: &Path) -> Result<Plan, String> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| format!("--plan {name}: {e}"))?;
        Plan::parse(&name, &text)
    }

    pub fn parse(name: &str, text: &str) -> Result<Plan, String> {
        let mut p = Plan {
            name: name.to_string(),
            ..Plan::default()
        };
        for (n, raw) in text.lines().enumerate() {
            let n = n as u64 + 1;
            let line = raw.split('#').next().unwrap_or("");
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.is_empty() {
                continue;
            }
            let bad = || {
                format!("{name}:{n}: expected 'LINE ADDR [DEV]' (trace line, hex device address, device), got '{}'", raw.trim())
            };
            if !(2..=3).contains(&f.len()) {
                return Err(bad());
            }
            let tl: u64 = f[0].parse().map_err(|_| bad())?;
            let a = u64::from_str_radix(f[1].trim_start_matches("0x"), 16).map_err(|_| bad())?;
            let dev: u32 = match f.get(2) {
                Some(d) => d.parse().map_err(|_| bad())?,
                None => 0,
            };
            p.by_line.entry(tl).or_default().push((n, dev, a));
            p.entries += 1;
        }
        if p.entries == 0 {
            return Err(format!("--plan {name}: no entries"));
        }
        Ok(p)
    }
}

/// What the driver and the policy share over one run.
#[derive(Default)]
struct State {
    /// Keys armed for the event about to run (its use is their last
    /// before the gap), with the plan file line naming each.
    next: Vec<(u64, u64)>,
    /// Keys the schedule has out now.
    out: HashSet<u64>,
    /// The first armed entry the event did not touch: (plan line, key).
    stray: Option<(u64, u64)>,
    /// `--plan-export`: the entries followed, in U3M_PLAN's terms (call
    /// clock, device, allocation ordinal, chunk); None: not exporting.
    export: Option<Vec<(u64, u32, u64, u32)>>,
}

/// The driver's side: arms the entries of each event before it runs.
#[derive(Clone)]
pub struct Armer {
    pub plan: Arc<Plan>,
    st: Arc<Mutex<State>>,
}

impl Armer {
    /// Before the event: `key` leaves after it (plan file line `n`).
    pub fn arm(&self, n: u64, key: u64) {
        self.lock().next.push((n, key));
    }

    /// After the event: entries it did not consume (an event that touches
    /// no managed chunk: an allocation, a free) are strays.
    pub fn after_event(&self) {
        let mut s = self.lock();
        if let Some(&first) = s.next.first() {
            s.stray.get_or_insert(first);
            s.next.clear();
        }
    }

    /// An entry the run could not follow (checked after it).
    pub fn stray(&self) -> Option<(u64, u64)> {
        self.lock().stray
    }

    /// `--plan-export`: keep the entries followed (`exported`).
    pub fn start_export(&self) {
        self.lock().export = Some(Vec::new());
    }

    pub fn exporting(&self) -> bool {
        self.lock().export.is_some()
    }

    /// The entries of the event just run, each resolved before it to
    /// (device, allocation ordinal, chunk), at the engine's clock `clock`
    /// (the event's call: it touched them).
    pub fn exported(&self, clock: u64, chunks: &[Option<(u32, u64, u32)>]) {
        if let Some(v) = self.lock().export.as_mut() {
            v.extend(chunks.iter().flatten().map(|&(d, a, c)| (clock, d, a, c)));
        }
    }

    /// The U3M_PLAN file of the entries followed (`u3m replay
    /// --plan-export`; core residency/schedule.rs reads it): when they
    /// repeat (`period_of`), one period and its `repeat` line, so that the
    /// library follows it for every later step too.
    pub fn export_text(&self, trace: &str) -> String {
        let s = self.lock();
        let v = s.export.as_deref().unwrap_or(&[]);
        let mut out = format!(
            "# u3m schedule (U3M_PLAN): {} entries of {} followed on {trace}\n",
            v.len(),
            self.plan.name
        );
        let end = match period_of(v) {
            Some((from, period)) => {
                let seen = (v[v.len() - 1].0 - from) / period + 1;
                out.push_str(&format!(
                    "# they repeat every {period} calls from call {from} ({seen} periods seen)\nrepeat {from} {period}\n"
                ));
                from + period
            }
            None => u64::MAX,
        };
        out.push_str("# CALL ALLOC CHUNK DEV\n");
        for &(clock, d, a, c) in v.iter().take_while(|e| e.0 < end) {
            out.push_str(&format!("{clock} {a} {c} {d}\n"));
        }
        out
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The least period under which the exported entries `v` (call clock,
/// device, allocation, chunk; in call order) repeat, with the first
/// entry's call: every entry a period or more in has its twin a period
/// back, every entry a period or more before the last one its twin a
/// period on, and the entries reach into a third period (a twin seen
/// once may be chance). Candidates are the calls
/// at which the first entry's chunk is named again.
pub fn period_of(v: &[(u64, u32, u64, u32)]) -> Option<(u64, u64)> {
    let (first, last) = (v.first()?, v.last()?);
    let all: HashSet<(u64, u32, u64, u32)> = v.iter().copied().collect();
    let twin = |e: &(u64, u32, u64, u32), c: u64| all.contains(&(c, e.1, e.2, e.3));
    v.iter()
        .filter(|e| (e.1, e.2, e.3) == (first.1, first.2, first.3) && e.0 > first.0)
        .map(|e| e.0 - first.0)
        .take_while(|&p| last.0 >= first.0 + 2 * p)
        .find(|&p| {
            v.iter().all(|e| {
                (e.0 < first.0 + p || twin(e, e.0 - p)) && (e.0 + p > last.0 || twin(e, e.0 + p))
            })
        })
        .map(|p| (first.0, p))
}

/// The `plan` policy (see the module doc).
pub struct Scheduled {
    inner: Belady,
    st: Arc<Mutex<State>>,
}

/// The policy and its driver side, over `log` (the baseline's accesses,
/// as Belady's).
pub fn policy(plan: Arc<Plan>, log: Vec<(u64, u64, Touch)>) -> (Scheduled, Armer) {
    let st: Arc<Mutex<State>> = Arc::default();
    (
        Scheduled {
            inner: Belady::with_touches(log),
            st: st.clone(),
        },
        Armer { plan, st },
    )
}

impl Scheduled {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Placement for Scheduled {
    fn name(&self) -> &'static str {
        "plan"
    }

    fn on_access(&self, now: u64, class: u8, keys: &[u64], writes: &[Touch]) {
        let mut s = self.lock();
        for k in keys {
            s.out.remove(k);
        }
        let next = std::mem::take(&mut s.next);
        for (n, k) in next {
            if keys.contains(&k) {
                s.out.insert(k);
            } else if s.stray.is_none() {
                s.stray = Some((n, k));
            }
        }
        drop(s);
        self.inner.on_access(now, class, keys, writes);
    }

    // the schedule's set changes at every call
    fn order_ttl(&self) -> u64 {
        0
    }

    fn order(&self, now: u64, cands: &mut [Cand]) {
        self.inner.order(now, cands);
        let s = self.lock();
        let (mut out, kept): (Vec<Cand>, Vec<Cand>) =
            cands.iter().partition(|c| s.out.contains(&c.key));
        // which of them goes changes no byte, only when its page is free
        out.sort_by_key(|c| c.last);
        out.extend(kept);
        cands.copy_from_slice(&out);
    }

    fn predicts(&self, now: u64, key: u64, w: u64) -> bool {
        self.inner.predicts(now, key, w)
    }

    fn next_use(&self, now: u64, key: u64) -> Option<u64> {
        Placement::next_use(&self.inner, now, key)
    }

    fn upcoming(&self, now: u64, d: u64, out: &mut Vec<(u64, u64)>) {
        self.inner.upcoming(now, d, out)
    }

    fn place(&self, now: u64, key: u64) -> Option<Place> {
        self.inner.place(now, key)
    }

    fn plan_out(&self, key: u64) -> bool {
        self.lock().out.contains(&key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_file_names_its_bad_lines() {
        let p = Plan::parse("p", "# c\n12 0x1000\n12 2000 1 # x\n\n").unwrap();
        assert_eq!(p.entries, 2);
        assert_eq!(p.by_line[&12], vec![(2, 0, 0x1000), (3, 1, 0x2000)]);
        for bad in ["12", "x 0x10", "12 0xzz", "12 10 1 2", "12 10 d"] {
            let e = Plan::parse("p", bad).unwrap_err();
            assert!(e.starts_with("p:1: expected 'LINE ADDR [DEV]'"), "{e}");
        }
        assert!(Plan::parse("p", "# none\n")
            .unwrap_err()
            .contains("no entries"));
    }

    /// Exported entries that repeat are found to; ones that do not, or
    /// never repeat, are not.
    #[test]
    fn an_exported_schedule_repeats_when_its_steps_do() {
        let step = |k: u64| {
            vec![
                (5 + 10 * k, 0, 1, 0),
                (5 + 10 * k, 0, 2, 3),
                (9 + 10 * k, 0, 1, 0),
            ]
        };
        let v: Vec<_> = (0..4).flat_map(step).collect();
        // (1, 0) is named again at 9: not a period; at 15 it is
        assert_eq!(period_of(&v), Some((5, 10)));
        let mut odd = v.clone();
        odd[4].3 = 7;
        assert_eq!(period_of(&odd), None);
        assert_eq!(period_of(&step(0)), None, "one step: nothing repeats");
        // a last step cut short (between two calls: a call's entries are
        // exported together) still repeats
        assert_eq!(period_of(&v[..11]), Some((5, 10)));
    }

    /// The schedule's chunks go first, the one used longest ago first;
    /// the rest in Belady's order. A key armed for an event is out after
    /// it, back in once used; one the event did not touch is a stray.
    #[test]
    fn the_schedules_chunks_go_first_oldest_use_first() {
        // uses: a at 1, 5; b at 2, 9; c at 3, 20; d at 4, 7
        let log = [
            (1, 0xa),
            (5, 0xa),
            (2, 0xb),
            (9, 0xb),
            (3, 0xc),
            (20, 0xc),
            (4, 0xd),
            (7, 0xd),
        ]
        .map(|(t, k)| (t, k, Touch::READ))
        .to_vec();
        let (p, arm) = policy(Arc::new(Plan::default()), log);
        let cand = |key, last| Cand {
            key,
            last,
            dirty: false,
        };
        arm.arm(7, 0xd);
        p.on_access(4, 0, &[0xd], &[Touch::READ]);
        arm.arm(8, 0xb);
        p.on_access(2, 0, &[0xb], &[Touch::READ]);
        assert!(p.plan_out(0xb) && p.plan_out(0xd) && !p.plan_out(0xa));
        let mut c = [cand(0xa, 1), cand(0xb, 2), cand(0xc, 3), cand(0xd, 4)];
        p.order(4, &mut c);
        let keys: Vec<u64> = c.iter().map(|c| c.key).collect();
        // b, d (planned; b used earlier), then c (next use 20), a (5)
        assert_eq!(keys, [0xb, 0xd, 0xc, 0xa]);
        p.on_access(5, 0, &[0xb], &[Touch::READ]);
        assert!(!p.plan_out(0xb), "used again: back in");
        assert_eq!(arm.stray(), None);
        arm.arm(9, 0xc);
        p.on_access(6, 0, &[0xa], &[Touch::READ]);
        assert_eq!(arm.stray(), Some((9, 0xc)));
        assert!(!p.plan_out(0xc));
    }
}
