#!/usr/bin/env python3
"""What u3m holds in HBM as each phase of a training step begins, against
what the pipeline bound's optimum holds: per allocation tag, the live bytes
(read again before written whole) and the dead ones, each side's, and the
engine's minus the optimum's.
usage: bench/held_gap.py [--json] U3M TRACE HBM_BYTES [--step N] [REPLAY_ARG...]
The engine's side is `u3m replay --held` (--policy predictive --link-model
shared --call-us 0 --issue acl-replay, then REPLAY_ARG, e.g. --event-model
device): its state as the host reaches the phase's first call. The
optimum's is `bench/pipeline_bound.py --copy-out-at-eviction --held --step
N` (default 3: a 5-step trace's steady state; needs scipy): one vertex of
the LP's fastest schedules, as the phase's first call runs; the chunks that
call touches count as live. A positive gap on dead data is data the engine
keeps that the optimum has copied out; a negative gap on live data is what
the engine must fetch that the optimum holds (BENCHMARKS.md, twenty-eighth
sitting)."""
import json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = float(1 << 30)


def engine(u3m, trace, hbm, step, extra):
    """{phase: {tag: (live GiB, dead GiB)}} of u3m replay --held, step N."""
    out = subprocess.run([u3m, "replay", trace, "--hbm", hbm, "--policy", "predictive", "--json",
                          "--held", "--link-model", "shared", "--call-us", "0", "--issue",
                          "acl-replay"] + extra, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("held_gap.py: u3m replay failed: " + out.stderr.strip())
    p = json.loads(out.stdout)["traces"][0]["policies"][0]
    res = {}
    for h in p["held"]:
        pre = "train step %d: " % step
        if h["label"].startswith(pre):
            res[h["label"][len(pre):]] = {
                t: ((b["live_clean"] + b["live_dirty"]) / GIB, (b["dead_clean"] + b["dead_dirty"]) / GIB)
                for t, b in h["by_tag"].items()}
    return res


def optimum(trace, hbm, step):
    """{phase: {tag: (live GiB, dead GiB)}} of pipeline_bound.py --held."""
    out = subprocess.run([sys.executable, os.path.join(HERE, "pipeline_bound.py"),
                          "--copy-out-at-eviction", "--held", "--json", "--step", str(step),
                          hbm, trace], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("held_gap.py: pipeline_bound.py failed: " + out.stderr.strip())
    res = {}
    for h in json.loads(out.stdout)["held"]:
        res[h["phase"]] = {
            t: (b["live"]["held_gib"] + b["touched_gib"], b["dead"]["held_gib"])
            for t, b in h["by_tag"].items()}
    return res


def main():
    args = sys.argv[1:]
    as_json = bool(args) and args[0] == "--json"
    if as_json:
        args.pop(0)
    if len(args) < 3 or args[0].startswith("-"):
        sys.exit(__doc__)
    u3m, trace, hbm = args[:3]
    rest, step, extra = args[3:], 3, []
    while rest:
        a = rest.pop(0)
        if a == "--step":
            if not rest:
                sys.exit("held_gap.py: --step needs a value")
            step = int(rest.pop(0))
        else:
            extra.append(a)
    e, o = engine(u3m, trace, hbm, step, extra), optimum(trace, hbm, step)
    if not e:
        sys.exit("held_gap.py: %s has no '# train step %d:' comment" % (trace, step))
    rows = []
    for phase in e:
        tags = sorted(set(e[phase]) | set(o.get(phase, {})))
        for t in tags:
            el, ed = e[phase].get(t, (0.0, 0.0))
            ol, od = o.get(phase, {}).get(t, (0.0, 0.0))
            rows.append({"phase": phase, "tag": t, "engine_live_gib": el, "engine_dead_gib": ed,
                         "optimum_live_gib": ol, "optimum_dead_gib": od})
    if as_json:
        print(json.dumps({"trace": trace, "hbm": hbm, "step": step, "rows": rows}))
        return
    print("%s, step %d, HBM %s: GiB held as each phase begins, engine / optimum (gap)" % (trace, step, hbm))
    for phase in e:
        rs = [r for r in rows if r["phase"] == phase]
        tot = [sum(r[k] for r in rs) for k in ("engine_live_gib", "optimum_live_gib",
                                                "engine_dead_gib", "optimum_dead_gib")]
        print("%s: live %.3f / %.3f (%+.3f), dead %.3f / %.3f (%+.3f)"
              % (phase, tot[0], tot[1], tot[0] - tot[1], tot[2], tot[3], tot[2] - tot[3]))
        for r in rs:
            el, ol, ed, od = (r["engine_live_gib"], r["optimum_live_gib"],
                              r["engine_dead_gib"], r["optimum_dead_gib"])
            if max(el, ol, ed, od) >= 4 / 1024:
                print("  %10s  live %7.3f / %7.3f (%+.3f)   dead %7.3f / %7.3f (%+.3f)"
                      % (r["tag"], el, ol, el - ol, ed, od, ed - od))


if __name__ == "__main__":
    main()
