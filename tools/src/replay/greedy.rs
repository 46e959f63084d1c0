//! `u3m replay --greedy-plan OUT`: the library's greedy planner (core
//! residency/planner.rs) run on one step of a trace, its schedule written
//! for `--policy plan --plan OUT` — to compare it with the helper's Python
//! (/tmp/s42/uni.py) and to replay it.
//!
//! Step K (`--greedy-step`, from its `# train step K:` comment to the next)
//! is the cycle. Its calls are the trace's events that touch device memory
//! or free it, as bench/min_bounds.py lists them (an `F`, an `O`, an `S`, an
//! `M` other than host-to-host with bytes); a chunk key is (allocation, 2
//! MiB chunk of it), every allocation counted (the helper's, not only the
//! ones u3m manages), touched as `access::ranges` says: written whole only
//! if the call writes the whole chunk and reads none of it. A call's device
//! time is the cost model's (an operator max(flops / TFLOPS, bytes / HBM) +
//! launch, a memset bytes / HBM + launch, a device copy bytes / HBM; the
//! program's own host copies and frees 0, as min_bounds has them), in f64
//! µs; `--greedy-uniform` gives each call the step's mean, as the library
//! would plan (the mean summed pairwise as numpy does, so that the helper's
//! uniform figures come out bit for bit).
//!
//! The file is `TRACE_LINE ADDR` per chunk-gap out (after the call on that
//! line, the chunk at ADDR leaves HBM), the cycle written for every step
//! from 1 on whose call count is the cycle's (bench/plan_schedule.py's
//! convention; the other steps run as belady), each step in call order.

use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::time::Instant;

use u3m_core::policy::Touch;
use u3m_core::residency::planner::{self, Key, Params, Step};
use u3m_core::trace::{Body, CopyKind};

use super::access::{self, R, W};
use super::cost::Costs;
use super::drive::Trace;
use super::ReplayArgs;
use crate::error::CliError;

const CH: u64 = 2 << 20;

/// One call of the trace: its event index, its chunks in first-touch order
/// ((allocation start, allocation generation, chunk), write, whole) and its
/// device time (µs).
struct Call {
    event: usize,
    chunks: Vec<((u64, u64, u64), bool, bool)>,
    us: f64,
    free: bool,
}

/// The trace's calls (see the module doc).
fn calls(trace: &Trace, costs: &Costs) -> Result<Vec<Call>, String> {
    // allocation start -> (bytes, generation)
    let mut allocs: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut gen = 0u64;
    let mut out = Vec::new();
    let hbm = costs.hbm_gbps * 1e3; // bytes per µs
    for (i, ev) in trace.events.iter().enumerate() {
        let line = trace.lines[i];
        let us = match &ev.body {
            Body::Alloc { addr, bytes } => {
                gen += 1;
                allocs.insert(*addr, (*bytes, gen));
                continue;
            }
            Body::Free { addr } => {
                allocs.remove(addr);
                out.push(Call {
                    event: i,
                    chunks: Vec::new(),
                    us: 0.0,
                    free: true,
                });
                continue;
            }
            Body::Copy { kind, bytes, .. } => match kind {
                CopyKind::H2H => continue,
                _ if *bytes == 0 => continue,
                CopyKind::D2D => *bytes as f64 / hbm,
                _ => 0.0,
            },
            Body::Op { .. } => {
                let bytes: u64 = access::ranges(&ev.body).iter().map(|r| r.1).sum();
                let flops = ev.flops.unwrap_or(0) as f64;
                (flops / (costs.tflops * 1e6)).max(bytes as f64 / hbm) + costs.launch_us
            }
            Body::Set { bytes, .. } => *bytes as f64 / hbm + costs.launch_us,
        };
        let mut chunks: Vec<((u64, u64, u64), bool, bool)> = Vec::new();
        let mut at: HashMap<(u64, u64, u64), usize> = HashMap::new();
        for (a, n, f) in access::ranges(&ev.body) {
            if n == 0 {
                continue;
            }
            let Some((&b, &(size, g))) = allocs.range(..=a).next_back() else {
                return Err(format!("line {line}: {a:#x} is in no allocation"));
            };
            let (lo, hi) = (a - b, a - b + n);
            if hi > size {
                return Err(format!("line {line}: {a:#x}+{n} overruns its allocation"));
            }
            let (write, whole) = (f & W != 0, f & R == 0);
            for c in lo / CH..=(hi - 1) / CH {
                let cs = c * CH;
                let w = whole && write && lo <= cs && hi >= cs + CH && cs + CH <= size;
                let key = (b, g, c);
                match at.get(&key) {
                    Some(&p) => {
                        chunks[p].1 |= write;
                        chunks[p].2 &= w;
                    }
                    None => {
                        at.insert(key, chunks.len());
                        chunks.push((key, write, w));
                    }
                }
            }
        }
        out.push(Call {
            event: i,
            chunks,
            us,
            free: false,
        });
    }
    Ok(out)
}

/// numpy's mean: the sum pairwise (blocks of 8 under 128), over the count.
fn np_mean(v: &[f64]) -> f64 {
    fn sum(a: &[f64]) -> f64 {
        let n = a.len();
        if n < 8 {
            a.iter().fold(0.0, |s, x| s + x)
        } else if n <= 128 {
            let mut r = [0.0f64; 8];
            r.copy_from_slice(&a[..8]);
            let mut i = 8;
            while i < n - n % 8 {
                for j in 0..8 {
                    r[j] += a[i + j];
                }
                i += 8;
            }
            let mut s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
            while i < n {
                s += a[i];
                i += 1;
            }
            s
        } else {
            let h = n / 2;
            let h = h - h % 8;
            sum(&a[..h]) + sum(&a[h..])
        }
    }
    sum(v) / v.len() as f64
}

/// Per step number, the index (in `calls`) of its first call: the calls
/// before its first `# train step N:` comment.
fn step_starts(text: &str, trace: &Trace, calls: &[Call]) -> BTreeMap<u64, usize> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let Some(rest) = line.strip_prefix("# train step ") else {
            continue;
        };
        let Some((num, _)) = rest.split_once(':') else {
            continue;
        };
        let Ok(k) = num.parse::<u64>() else { continue };
        let ln = i as u64 + 1;
        out.entry(k)
            .or_insert_with(|| calls.partition_point(|c| trace.lines[c.event] < ln));
    }
    out
}

/// `--greedy-plan`: plans, writes the file, says what on stderr.
pub fn run(a: &ReplayArgs, costs: &Costs) -> Result<ExitCode, CliError> {
    let usage = |m: String| Err(CliError::Usage(m));
    let Some(out) = &a.greedy_plan else {
        return usage("--greedy-plan: no file".into());
    };
    if a.traces.len() != 1 {
        return usage(
            "--greedy-plan OUT: a schedule names one trace's lines: give one trace".into(),
        );
    }
    let key = match a.greedy_key.as_str() {
        "cost" => Key::Cost,
        _ => Key::Far,
    };
    let path = &a.traces[0];
    let trace = match super::load(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("u3m replay: {e}");
            return Ok(ExitCode::from(3));
        }
    };
    let fail = |e: String| -> Result<ExitCode, CliError> {
        eprintln!("u3m replay: --greedy-plan: {e}");
        Ok(ExitCode::from(1))
    };
    if trace.devices > 1 {
        return fail(format!(
            "{}: {} devices; the planner takes one",
            trace.name, trace.devices
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|err| CliError::Io {
        what: "re-reading the trace for its step comments",
        err,
    })?;
    let calls = match calls(&trace, costs) {
        Ok(c) => c,
        Err(e) => return fail(format!("{}: {e}", trace.name)),
    };
    let starts = step_starts(&text, &trace, &calls);
    let k = a.greedy_step;
    let Some(&lo) = starts.get(&k) else {
        return fail(format!("{}: no '# train step {k}:' comment", trace.name));
    };
    let hi = starts.get(&(k + 1)).copied().unwrap_or(calls.len());
    let cyc = &calls[lo..hi];
    if let Some(c) = cyc.iter().find(|c| c.free) {
        return fail(format!(
            "step {k} frees memory (line {}): the planner takes chunks that live across the step",
            trace.lines[c.event]
        ));
    }

    // keys by first touch in the step; touches by call, then key
    let mut key_of: HashMap<(u64, u64, u64), u32> = HashMap::new();
    let mut names: Vec<(u64, u64, u64)> = Vec::new();
    let mut touches: Vec<(u32, u32, Touch)> = Vec::new();
    for (i, c) in cyc.iter().enumerate() {
        let first = touches.len();
        for &(name, write, whole) in &c.chunks {
            let id = *key_of.entry(name).or_insert_with(|| {
                names.push(name);
                names.len() as u32 - 1
            });
            touches.push((i as u32, id, Touch::new(write, whole)));
        }
        touches[first..].sort_by_key(|t| t.1);
    }
    let mut dev_us: Vec<f64> = cyc.iter().map(|c| c.us).collect();
    if a.greedy_uniform && !dev_us.is_empty() {
        let m = np_mean(&dev_us);
        dev_us.iter_mut().for_each(|d| *d = m);
    }
    let step = Step {
        calls: cyc.len() as u32,
        touches,
        keys: names.len() as u32,
        dev_us,
    };
    let p = Params {
        cap_chunks: a.hbm / CH,
        link_chunks_per_us: a.link_gbps * 1e3 / CH as f64,
        min_gap_us: a.min_gap_us,
        key,
    };
    let t0 = Instant::now();
    let plan = match planner::plan(&step, &p) {
        Ok(pl) => pl,
        Err(e) => return fail(format!("{} step {k}: {e}", trace.name)),
    };
    let took = t0.elapsed();

    let n = cyc.len();
    let mut text_out = String::new();
    let mut written = 0usize;
    let (mut steps, mut left) = (Vec::new(), Vec::new());
    for (&t, &s) in starts.range(1..) {
        let e = starts.get(&(t + 1)).copied().unwrap_or(calls.len());
        if e - s != n {
            left.push(t);
            continue;
        }
        steps.push(t);
        for &(call, key) in &plan.out {
            let (b, _, c) = names[key as usize];
            let line = trace.lines[calls[s + call as usize].event];
            text_out.push_str(&format!("{line} {:#x}\n", b + c * CH));
            written += 1;
        }
    }
    std::fs::write(out, &text_out).map_err(|err| CliError::Io {
        what: "writing the --greedy-plan file",
        err,
    })?;
    let gib = |c: u64| (c * CH) as f64 / (1u64 << 30) as f64;
    eprintln!(
        "{}: step {k} ({n} calls, {} chunks, HBM {} chunks, {} times{}): {} chunk-gaps out a step, in {:.3} / out {:.3} GiB, {} overbooked, {} over HBM at worst; planned in {:.1} ms; {written} lines for steps {:?} to {}{}",
        trace.name,
        names.len(),
        p.cap_chunks,
        if a.greedy_uniform { "uniform" } else { "cost-model" },
        if a.min_gap_us > 0.0 {
            format!(", gaps under {} µs held", a.min_gap_us)
        } else {
            String::new()
        },
        plan.out.len(),
        gib(plan.in_chunks),
        gib(plan.out_chunks),
        plan.overbooked,
        plan.unmet,
        took.as_secs_f64() * 1e3,
        steps,
        out.display(),
        if left.is_empty() {
            String::new()
        } else {
            format!(" (steps {left:?}: another call count, left out)")
        }
    );
    Ok(ExitCode::SUCCESS)
}
