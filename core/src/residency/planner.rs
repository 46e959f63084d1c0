//! A schedule computed from one step of a program: which chunks leave HBM
//! in which gaps between their uses, so that every call's chunks fit and
//! the copies fit the link. The step is taken as a cycle (the program
//! repeats it); per group of chunks used alike (the same calls, the same
//! way) and per gap between two of their uses, the planner says how many
//! of the group's chunks are out during that gap.
//!
//! It is the greedy link-budget planner of the thirty-ninth sitting's
//! helper (`g4.budget` then `g3.prune`, its default path), ported so that
//! it gives the same schedule, on the gap model of
//! bench/pipeline_bound.py's `cycle` (chunks that live across the step:
//! every chunk is taken to hold data when the step starts):
//! - each call k lends the link β·d_k chunks each way (d_k its device time);
//! - a gap whose next use comes within `min_gap_us` of device time stays
//!   in HBM (a host running ahead would wait for its mapping);
//! - calls are covered in order: while call k is over HBM, a chunk-gap
//!   covering it goes out, the one whose copies (a copy-in if its next use
//!   reads it, a copy-out if its data is not yet on the host) fit the
//!   link's remaining budget ASAP after the gap opens and ALAP before it
//!   closes, cheapest then longest out past k (`Key::Cost`), or longest
//!   (`Key::Far`); a chunk counts as out only between its copy-out's end
//!   and its copy-in's start. When no gap fits the budgets, the cheapest
//!   is taken anyway (over the whole gap) and counted as overbooked;
//! - a pruning pass then gives back what the other gaps made unnecessary.
//!
//! The library cannot know each call's device time before it runs, so it
//! plans with every call at the step's mean time ("uniform"); the API takes
//! per-call times all the same (`u3m replay --greedy-plan` can use the cost
//! model's). Pure: no engine state, no allocation beyond its own tables.

use std::collections::HashMap;

use crate::policy::Touch;

/// One step of a program, as a cycle.
#[derive(Clone, Debug, Default)]
pub struct Step {
    /// Calls in the step (n).
    pub calls: u32,
    /// (call index, key index, how the call touches the chunk), sorted by
    /// call then key, one entry per (call, key).
    pub touches: Vec<(u32, u32, Touch)>,
    /// Distinct chunk keys 0..keys. Groups of keys used alike are ordered
    /// by their lowest key, and so are ties between gaps: the order of
    /// first use is the helper's.
    pub keys: u32,
    /// Per-call device time, µs (len == calls).
    pub dev_us: Vec<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// Fewest copies (a copy-in, a copy-out) first, then longest out past
    /// the call being covered.
    Cost,
    /// Longest out past the call being covered.
    Far,
}

#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// HBM, in 2 MiB chunks.
    pub cap_chunks: u64,
    /// The link's rate each way, chunks per µs.
    pub link_chunks_per_us: f64,
    /// Gaps shorter than this (device time of the calls inside) stay in HBM.
    pub min_gap_us: f64,
    pub key: Key,
}

/// The schedule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// (call, key): after call `call` (its use before the gap) the chunk
    /// `key` leaves HBM until its next use; sorted by call (then by gap and
    /// key, as planned).
    pub out: Vec<(u32, u32)>,
    /// Chunk-gaps taken without room on the link (the HBM constraint holds
    /// only if the copies take longer than the calls).
    pub overbooked: u64,
    /// The most chunks any call is still over HBM by (0: the schedule
    /// fits; otherwise the gaps that could take them are held or full).
    pub unmet: u64,
    /// Chunks copied in per step (gaps whose next use reads the chunk).
    pub in_chunks: u64,
    /// Chunks copied out per step (once per write of the data).
    pub out_chunks: u64,
}

/// Floating tolerance of the helper's link sums.
const EPS: f64 = 1e-9;
/// Chunk-gaps taken at a time.
const BATCH: i64 = 16;
/// Picks per call, at most (the helper's guard).
const GUARD: u32 = 10_000;

/// A gap of a group: its chunks are out from call `s` to call `e`
/// (inclusive, cyclic: `e < s` wraps), back for call `ret`.
struct Gap {
    group: usize,
    m: i64,
    s: usize,
    e: usize,
    ret: usize,
    /// The return reads the chunk (a copy-in).
    cin: bool,
    /// The write whose data the gap holds (a copy-out once per epoch), or
    /// None: never written in the step (clean).
    epoch: Option<usize>,
    /// That write's call.
    wt: usize,
}

/// Whether `k` is in the cyclic span s..=e.
fn inside(s: usize, e: usize, k: usize) -> bool {
    if s <= e {
        s <= k && k <= e
    } else {
        k >= s || k <= e
    }
}

/// Calls from `a` forward to `b`.
fn span_len(n: usize, a: usize, b: usize) -> i64 {
    ((b + n - a) % n) as i64
}

/// Calls of the cyclic span s..=e, in order.
fn span(n: usize, s: usize, e: usize) -> impl Iterator<Item = usize> {
    let len = (e + n - s) % n + 1;
    (0..len).map(move |i| (s + i) % n)
}

/// The plan of `step` (see the module doc). Err: malformed input, or a call
/// touching more chunks than HBM holds.
pub fn plan(step: &Step, p: &Params) -> Result<Plan, String> {
    let n = step.calls as usize;
    if step.dev_us.len() != n {
        return Err(format!("{} device times for {n} calls", step.dev_us.len()));
    }
    if step.dev_us.iter().any(|d| !(d.is_finite() && *d >= 0.0)) {
        return Err("a device time is negative or not finite".into());
    }
    if !(p.link_chunks_per_us.is_finite() && p.link_chunks_per_us >= 0.0) {
        return Err("the link rate is negative or not finite".into());
    }
    let cap = i64::try_from(p.cap_chunks).map_err(|_| "HBM too large")?;
    let mut touched = vec![0i64; n];
    let mut uses: Vec<Vec<(u32, bool, bool)>> = vec![Vec::new(); step.keys as usize];
    let mut prev: Option<(u32, u32)> = None;
    for &(c, k, t) in &step.touches {
        if c as usize >= n || k >= step.keys {
            return Err(format!(
                "touch ({c}, {k}) out of {n} calls, {} keys",
                step.keys
            ));
        }
        if prev.is_some_and(|q| q >= (c, k)) {
            return Err(format!("touch ({c}, {k}) out of order or repeated"));
        }
        prev = Some((c, k));
        touched[c as usize] += 1;
        // (call, its copy-in needs the old data, writes)
        uses[k as usize].push((c, !t.whole(), t.writes()));
    }
    if let Some(k) = (0..n).find(|&k| touched[k] > cap) {
        return Err(format!(
            "call {k} touches {} chunks, more than HBM's {cap}",
            touched[k]
        ));
    }

    if n == 0 {
        return Ok(Plan::default());
    }

    // groups of keys with identical uses, ordered by their lowest key
    let mut group_of: HashMap<&[(u32, bool, bool)], usize> = HashMap::new();
    let mut members: Vec<Vec<u32>> = Vec::new();
    for (key, u) in uses.iter().enumerate() {
        if u.is_empty() {
            continue;
        }
        let g = *group_of.entry(u.as_slice()).or_insert_with(|| {
            members.push(Vec::new());
            members.len() - 1
        });
        members[g].push(key as u32);
    }
    let mut lists: Vec<&[(u32, bool, bool)]> = vec![&[]; members.len()];
    for (u, &g) in &group_of {
        lists[g] = u;
    }

    // the gaps (pipeline_bound.cycle, chunks live across the step)
    let mut gaps: Vec<Gap> = Vec::new();
    let mut epochs: HashMap<(usize, usize), usize> = HashMap::new();
    for (g, lst) in lists.iter().enumerate() {
        let writes: Vec<usize> = (0..lst.len()).filter(|&i| lst[i].2).collect();
        let len = lst.len();
        for i in 0..len {
            let t = lst[i].0 as usize;
            let (t2, need2, _) = lst[(i + 1) % len];
            let t2 = t2 as usize;
            let sp = if len > 1 {
                (t2 + 2 * n - t - 1) % n
            } else {
                n - 1
            };
            if sp == 0 {
                continue;
            }
            let (epoch, wt) = match writes.iter().rev().find(|&&j| j <= i).or(writes.last()) {
                Some(&last) => {
                    let id = epochs.len();
                    (
                        Some(*epochs.entry((g, last)).or_insert(id)),
                        lst[last].0 as usize,
                    )
                }
                None => (None, 0),
            };
            gaps.push(Gap {
                group: g,
                m: members[g].len() as i64,
                s: (t + 1) % n,
                e: (t + sp) % n,
                ret: t2,
                cin: need2,
                epoch,
                wt,
            });
        }
    }

    let d = &step.dev_us;
    let mut cum = vec![0.0f64; n + 1];
    for k in 0..n {
        cum[k + 1] = cum[k] + d[k];
    }
    let dur = |g: &Gap| {
        if g.s <= g.e {
            cum[g.e + 1] - cum[g.s]
        } else {
            cum[n] - cum[g.s] + cum[g.e + 1]
        }
    };
    let held: Vec<bool> = gaps
        .iter()
        .map(|g| p.min_gap_us > 0.0 && dur(g) < p.min_gap_us)
        .collect();
    let mut cover: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut idle = vec![0i64; n];
    for (j, g) in gaps.iter().enumerate() {
        for k in span(n, g.s, g.e) {
            cover[k].push(j as u32);
            idle[k] += g.m;
        }
    }
    let need0: Vec<i64> = (0..n).map(|k| touched[k] + idle[k] - cap).collect();

    let x = budget(n, &gaps, &held, &cover, need0.clone(), d, p);
    let (mut x, overbooked) = x;
    let outp = prune(n, &gaps, &need0, &mut x, &dur);
    let unmet = (0..n).map(|k| need0[k] - outp[k]).max().unwrap_or(0).max(0) as u64;

    let mut out: Vec<(u32, u32)> = Vec::new();
    for (j, g) in gaps.iter().enumerate() {
        let call = ((g.s + n - 1) % n) as u32;
        out.extend(members[g.group][..x[j] as usize].iter().map(|&k| (call, k)));
    }
    out.sort_by_key(|o| o.0);
    let in_chunks = gaps
        .iter()
        .zip(&x)
        .filter(|(g, _)| g.cin)
        .map(|(_, &v)| v as u64)
        .sum();
    // copied out once per epoch: the most of its gaps out, in order from its write
    let mut by_epoch: Vec<Vec<usize>> = vec![Vec::new(); epochs.len()];
    for (j, g) in gaps.iter().enumerate() {
        if let Some(ep) = g.epoch {
            by_epoch[ep].push(j);
        }
    }
    let mut out_chunks = 0u64;
    for js in &mut by_epoch {
        js.sort_by_key(|&j| (gaps[j].s + 2 * n - gaps[j].wt - 1) % n);
        let mut most = 0i64;
        for &j in js.iter() {
            if x[j] > most {
                out_chunks += (x[j] - most) as u64;
                most = x[j];
            }
        }
    }
    Ok(Plan {
        out,
        overbooked,
        unmet,
        in_chunks,
        out_chunks,
    })
}

/// A candidate's rank, least first: `copies` it costs (a copy-in, a
/// copy-out), `far` minus the calls it stays out past the one covered.
fn rank(key: Key, copies: i64, far: i64) -> (i64, i64) {
    match key {
        Key::Cost => (copies, far),
        Key::Far => (far, 0),
    }
}

/// The greedy cover (`g4.budget`): chunk-gaps out per gap, and how many
/// were taken without room on the link.
fn budget(
    n: usize,
    gaps: &[Gap],
    held: &[bool],
    cover: &[Vec<u32>],
    mut need: Vec<i64>,
    d: &[f64],
    p: &Params,
) -> (Vec<i64>, u64) {
    let beta = p.link_chunks_per_us;
    let mut in_f: Vec<f64> = d.iter().map(|&v| beta * v).collect();
    let mut out_f = in_f.clone();
    let epochs = gaps
        .iter()
        .filter_map(|g| g.epoch)
        .max()
        .map_or(0, |e| e + 1);
    let mut paid = vec![0i64; epochs];
    let mut x = vec![0i64; gaps.len()];
    let mut over = 0u64;

    // the call where a copy-out of `amt` from `s` ends (None: not by `e`)
    let out_scan = |out_f: &[f64], s: usize, e: usize, amt: f64| -> Option<usize> {
        let (mut k, mut acc) = (s, 0.0f64);
        for _ in 0..n {
            if amt <= EPS {
                return Some((k + n - 1) % n);
            }
            acc += out_f[k];
            if acc >= amt - EPS {
                return Some(k);
            }
            if k == e {
                return None;
            }
            k = (k + 1) % n;
        }
        None
    };
    // the call where an ALAP copy-in of `amt` ending before `ret` starts
    let in_scan = |in_f: &[f64], s: usize, ret: usize, amt: f64| -> Option<usize> {
        let (mut k, mut acc) = ((ret + n - 1) % n, 0.0f64);
        for _ in 0..n {
            acc += in_f[k];
            if acc >= amt - EPS {
                return Some(k);
            }
            if k == s {
                return None;
            }
            k = (k + n - 1) % n;
        }
        None
    };
    // take `amt` off a budget from `k` on, forward or backward
    let consume = |f: &mut [f64], mut k: usize, mut amt: f64, fwd: bool| {
        // (bounded: the scans found the room; the helper's loop is not)
        for _ in 0..2 * n {
            if amt <= EPS {
                break;
            }
            let t = if amt < f[k] { amt } else { f[k] };
            f[k] -= t;
            amt -= t;
            k = if fwd { (k + 1) % n } else { (k + n - 1) % n };
        }
    };

    for k in 0..n {
        let mut guard = 0;
        while need[k] > 0 && guard < GUARD {
            guard += 1;
            // (key, gap, a, co, ci, es, ee)
            let mut best: Option<((i64, i64), usize, i64, i64, bool, usize, usize)> = None;
            for &j in &cover[k] {
                let j = j as usize;
                let g = &gaps[j];
                if held[j] || x[j] >= g.m {
                    continue;
                }
                let a = (g.m - x[j]).min(need[k]).min(BATCH);
                let ci = g.cin;
                let co = match g.epoch {
                    Some(ep) => (x[j] + a - paid[ep].max(x[j])).max(0),
                    None => 0,
                };
                let copies = ci as i64 + (co > 0) as i64;
                // the best this gap can score (its chunks out until e): no
                // better than the best so far, it cannot be picked
                let bound = rank(p.key, copies, -span_len(n, k, g.e));
                if best.as_ref().is_some_and(|b| bound >= b.0) {
                    continue;
                }
                let es = if co > 0 {
                    match out_scan(&out_f, g.s, g.e, co as f64) {
                        Some(ce) => (ce + 1) % n,
                        None => continue,
                    }
                } else {
                    g.s
                };
                let ee = if ci {
                    match in_scan(&in_f, g.s, g.ret, a as f64) {
                        Some(cs) => (cs + n - 1) % n,
                        None => continue,
                    }
                } else {
                    g.e
                };
                if !inside(g.s, g.e, es)
                    || !inside(g.s, g.e, ee)
                    || span_len(n, g.s, es) > span_len(n, g.s, ee)
                    || !inside(es, ee, k)
                {
                    continue;
                }
                let kk = rank(p.key, copies, -span_len(n, k, ee));
                if best.as_ref().is_none_or(|b| kk < b.0) {
                    best = Some((kk, j, a, co, ci, es, ee));
                }
            }
            let Some((_, j, a, co, ci, es, ee)) = best else {
                // nothing fits the link: the cheapest, longest, unpaid
                let mut pick: Option<((i64, i64), usize)> = None;
                for &j in &cover[k] {
                    let j = j as usize;
                    let g = &gaps[j];
                    if held[j] || x[j] >= g.m {
                        continue;
                    }
                    let co = g.epoch.is_some_and(|ep| paid[ep] <= x[j]);
                    let kk = (g.cin as i64 + co as i64, -span_len(n, k, g.e));
                    if pick.is_none_or(|b| kk < b.0) {
                        pick = Some((kk, j));
                    }
                }
                let Some((_, j)) = pick else { break };
                let g = &gaps[j];
                let a = (g.m - x[j]).min(need[k]).min(BATCH);
                x[j] += a;
                over += a as u64;
                if let Some(ep) = g.epoch {
                    paid[ep] = paid[ep].max(x[j]);
                }
                for q in span(n, g.s, g.e) {
                    need[q] -= a;
                }
                continue;
            };
            let g = &gaps[j];
            x[j] += a;
            if let Some(ep) = g.epoch {
                paid[ep] = paid[ep].max(x[j]);
            }
            if co > 0 {
                consume(&mut out_f, g.s, co as f64, true);
            }
            if ci {
                consume(&mut in_f, (g.ret + n - 1) % n, a as f64, false);
            }
            for q in span(n, es, ee) {
                need[q] -= a;
            }
        }
    }
    (x, over)
}

/// Gives back chunk-gaps the others made unnecessary (`g3.prune`): the
/// costliest first (a copy-in, a copy-out), then the shortest. Returns the
/// chunks out at each call.
fn prune(
    n: usize,
    gaps: &[Gap],
    need: &[i64],
    x: &mut [i64],
    dur: &dyn Fn(&Gap) -> f64,
) -> Vec<i64> {
    let mut outp = vec![0i64; n];
    for (j, g) in gaps.iter().enumerate() {
        for k in span(n, g.s, g.e) {
            outp[k] += x[j];
        }
    }
    let cost = |g: &Gap| g.cin as i64 + g.epoch.is_some() as i64;
    let mut js: Vec<(i64, f64, usize)> = (0..gaps.len())
        .filter(|&j| x[j] > 0)
        .map(|j| (-cost(&gaps[j]), dur(&gaps[j]), j))
        .collect();
    // stable, as Python's sort
    js.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    for &(_, _, j) in &js {
        let g = &gaps[j];
        let slack = span(n, g.s, g.e)
            .map(|k| outp[k] - need[k])
            .min()
            .unwrap_or(0);
        let r = x[j].min(slack);
        if r > 0 {
            x[j] -= r;
            for k in span(n, g.s, g.e) {
                outp[k] -= r;
            }
        }
    }
    outp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step from per-key uses: (call, 'r' read, 'w' written and read,
    /// 'W' written whole).
    fn step(n: u32, uses: &[Vec<(u32, char)>], d: &[f64]) -> Step {
        let mut touches: Vec<(u32, u32, Touch)> = Vec::new();
        for (k, u) in uses.iter().enumerate() {
            for &(c, t) in u {
                touches.push((c, k as u32, Touch::new(t != 'r', t == 'W')));
            }
        }
        touches.sort_by_key(|t| (t.0, t.1));
        Step {
            calls: n,
            touches,
            keys: uses.len() as u32,
            dev_us: d.to_vec(),
        }
    }

    fn params(cap: u64, beta: f64, min_gap_us: f64, key: Key) -> Params {
        Params {
            cap_chunks: cap,
            link_chunks_per_us: beta,
            min_gap_us,
            key,
        }
    }

    /// Chunks in HBM at each call under `plan`: a key is out from the call
    /// after an entry's call until its next use.
    fn resident(s: &Step, plan: &Plan) -> Vec<u64> {
        let n = s.calls as usize;
        let mut out = vec![vec![false; s.keys as usize]; n];
        let mut used = vec![vec![false; s.keys as usize]; n];
        for &(c, k, _) in &s.touches {
            used[c as usize][k as usize] = true;
        }
        for &(c, k) in &plan.out {
            let mut q = (c as usize + 1) % n;
            while !used[q][k as usize] {
                assert!(!out[q][k as usize], "key {k} out twice at call {q}");
                out[q][k as usize] = true;
                q = (q + 1) % n;
            }
        }
        // a key touched in the step is in HBM unless out
        let live: Vec<bool> = (0..s.keys as usize)
            .map(|k| used.iter().any(|u| u[k]))
            .collect();
        (0..n)
            .map(|q| {
                (0..s.keys as usize)
                    .filter(|&k| live[k] && !out[q][k])
                    .count() as u64
            })
            .collect()
    }

    /// Weights W (keys 0, 1) read at call 0, R (2, 3) read at calls 2 and 6:
    /// 8 calls of 1 ms, 2 chunks of HBM, so 2 chunks out at every call.
    fn w_and_r() -> Step {
        let w = vec![(0, 'r')];
        let r = vec![(2, 'r'), (6, 'r')];
        step(8, &[w.clone(), w, r.clone(), r], &[1000.0; 8])
    }

    #[test]
    fn the_long_gaps_go_and_the_held_ones_stay() {
        let s = w_and_r();
        // call 0 can only be covered by R's gap 7..1 (its copy-in ALAP at
        // call 1), calls 2..6 by W's 1..7 (copy-in at call 7)
        let p = plan(&s, &params(2, 1.0, 0.0, Key::Cost)).unwrap();
        assert_eq!(p.out, vec![(0, 0), (0, 1), (6, 2), (6, 3)]);
        assert_eq!(
            (p.overbooked, p.unmet, p.in_chunks, p.out_chunks),
            (0, 0, 4, 0)
        );
        assert!(resident(&s, &p).iter().all(|&r| r <= 2));
        // R's gaps (3 ms) under a 3.5 ms minimum stay in HBM, however short
        // of room calls 7 and 0 are; W's (7 ms) still goes
        let p = plan(&s, &params(2, 1.0, 3500.0, Key::Cost)).unwrap();
        assert_eq!(p.out, vec![(0, 0), (0, 1)]);
        assert_eq!((p.overbooked, p.unmet), (0, 2));
        assert_eq!(resident(&s, &p)[0], 4);
    }

    #[test]
    fn a_gap_whose_copies_do_not_fit_the_link_is_overbooked() {
        let s = w_and_r();
        // 0.001 chunk per µs: a call lends 1 chunk each way, so R's gap 7..1
        // cannot copy its 2 chunks in at call 1 alone: it is taken anyway
        // (whole, no link charged) and counted
        let p = plan(&s, &params(2, 0.001, 0.0, Key::Cost)).unwrap();
        assert_eq!(p.out, vec![(0, 0), (0, 1), (6, 2), (6, 3)]);
        assert_eq!((p.overbooked, p.unmet), (2, 0));
        assert!(resident(&s, &p).iter().all(|&r| r <= 2));
    }

    #[test]
    fn a_dirty_chunk_is_copied_out_once_per_write() {
        // D (keys 0, 1) written at call 0 (not whole), read at 4; P (2..5)
        // read at 2 and 6; 8 calls, 4 chunks of HBM: D's two gaps and half
        // of P's carry the 2 chunks over; D's data leaves once
        let d = vec![(0, 'w'), (4, 'r')];
        let q = vec![(2, 'r'), (6, 'r')];
        let s = step(
            8,
            &[d.clone(), d, q.clone(), q.clone(), q.clone(), q],
            &[1000.0; 8],
        );
        let p = plan(&s, &params(4, 1.0, 0.0, Key::Cost)).unwrap();
        let want = [
            (0, 0),
            (0, 1),
            (2, 2),
            (2, 3),
            (4, 0),
            (4, 1),
            (6, 2),
            (6, 3),
        ];
        assert_eq!(p.out, want);
        assert_eq!(
            (p.overbooked, p.unmet, p.in_chunks, p.out_chunks),
            (2, 0, 8, 2)
        );
        assert!(resident(&s, &p).iter().all(|&r| r <= 4));
    }

    #[test]
    fn pruning_gives_back_what_later_gaps_made_unnecessary() {
        // keys 0 (read at calls 0, 3), 1 (1, 2), 2 (2, 3); 2 chunks of HBM.
        // Covering call 0 the greedy takes key 2's gap 0..1 (key 1's 3..0
        // cannot copy in before call 1 there); covering call 3 it takes key
        // 1's 3..0, which covers call 0 as well: the first goes back
        let s = step(
            4,
            &[
                vec![(0, 'r'), (3, 'r')],
                vec![(1, 'r'), (2, 'r')],
                vec![(2, 'r'), (3, 'r')],
            ],
            &[100.0; 4],
        );
        let p = plan(&s, &params(2, 1.0, 0.0, Key::Cost)).unwrap();
        assert_eq!(p.out, vec![(0, 0), (2, 1)]);
        assert_eq!((p.overbooked, p.unmet, p.in_chunks), (0, 0, 2));
        assert_eq!(resident(&s, &p), vec![2; 4]);
    }

    #[test]
    fn malformed_steps_are_refused() {
        let s = w_and_r();
        assert!(plan(&s, &params(1, 1.0, 0.0, Key::Cost)).is_err()); // call 0 touches 2
        let mut t = s.clone();
        t.dev_us.pop();
        assert!(plan(&t, &params(2, 1.0, 0.0, Key::Cost)).is_err());
        let mut t = s.clone();
        t.touches.swap(0, 1);
        assert!(plan(&t, &params(2, 1.0, 0.0, Key::Cost)).is_err());
        let mut t = s;
        t.touches[0].1 = 9;
        assert!(plan(&t, &params(2, 1.0, 0.0, Key::Cost)).is_err());
    }

    /// Cycles with the helper's own plans (/tmp/s42/helper g4.budget then
    /// g3.prune on random small steps): `n cap min_gap key beta | times |
    /// uses per key (call + r/w/W, keys ordered by first use) | out | over`.
    fn check_cases(text: &str) {
        for (i, line) in text.lines().enumerate() {
            let f: Vec<&str> = line.split('|').collect();
            let h: Vec<&str> = f[0].split_whitespace().collect();
            let n: u32 = h[0].parse().unwrap();
            let key = if h[3] == "cost" { Key::Cost } else { Key::Far };
            let pr = params(
                h[1].parse().unwrap(),
                h[4].parse().unwrap(),
                h[2].parse().unwrap(),
                key,
            );
            let d: Vec<f64> = f[1]
                .split_whitespace()
                .map(|v| v.parse().unwrap())
                .collect();
            let uses: Vec<Vec<(u32, char)>> = f[2]
                .split(';')
                .map(|u| {
                    u.split(',')
                        .map(|x| {
                            let (c, t) = x.split_at(x.len() - 1);
                            (c.parse().unwrap(), t.chars().next().unwrap())
                        })
                        .collect()
                })
                .collect();
            let want: Vec<(u32, u32)> = f[3]
                .split_whitespace()
                .map(|o| {
                    let (c, k) = o.split_once(':').unwrap();
                    (c.parse().unwrap(), k.parse().unwrap())
                })
                .collect();
            let s = step(n, &uses, &d);
            let p = plan(&s, &pr).unwrap();
            assert_eq!(p.out, want, "case {i}: {line}");
            assert_eq!(
                p.overbooked,
                f[4].parse::<u64>().unwrap(),
                "case {i}: {line}"
            );
            if p.unmet == 0 {
                let r = resident(&s, &p);
                assert!(r.iter().all(|&r| r <= pr.cap_chunks), "case {i}: {r:?}");
            }
        }
    }

    #[test]
    fn the_helpers_plans_of_small_cycles() {
        check_cases(include_str!("planner_cases.txt"));
    }

    /// `U3M_PLANNER_CASES=FILE`: more of them (from the helper's script).
    #[test]
    #[ignore]
    fn the_helpers_plans_from_a_file() {
        let f = std::env::var("U3M_PLANNER_CASES").expect("U3M_PLANNER_CASES");
        check_cases(&std::fs::read_to_string(f).unwrap());
    }
}
