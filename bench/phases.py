#!/usr/bin/env python3
"""Simulated time and u3m's bytes in / out of each phase of one training step
in `u3m replay`: the trace cut at each `# train step N: PHASE` comment that
`u3m synth` writes (forward, backward, optimizer), replayed to each cut; a
phase's figures are the differences between consecutive cuts (a cut run
ends when its work drains, so copies issued late in a phase may count in the
next).
usage: bench/phases.py U3M TRACE HBM_BYTES [--step N] [--policy P] [--tags]
                       [--held] [--audit] [REPLAY_ARG...]
N: the 0-based step (default 3: the steady state of a 5-step trace, as
bench/steady.py's 5-3 window). --tags: also, per phase, the bytes in / out
of each allocation tag the trace names (weight, act, workspace, ...; GiB,
tags under 4 MiB left out) and the host's waits by what it waited for
(count / ms: the program's work, u3m's copy-ins, its copy-outs, the launch
queue). --held: also what u3m holds in HBM as each phase of step N begins
(`u3m replay --held`, one run of the whole trace: per tag, GiB live — read
again before written whole — and dead, each with its dirty part, and the
live the policy takes for dead and the dead it foresees: predicts a whole
write next; set it beside `bench/pipeline_bound.py --held`). --audit: also,
per phase of step N and tag, what u3m evicted and what of it came back in
before the phase ended (`u3m replay --audit`, one run of the whole trace:
GiB evicted, copied out, back in the phase, and of that what the policy
foresaw — predicted the use before the phase's end — or took for dead).
Replay options: --link-model shared --call-us 0 --issue
acl-replay, then REPLAY_ARG. The environment is passed to u3m."""
import json, os, subprocess, sys, tempfile

args = sys.argv[1:]
if len(args) < 3 or args[0].startswith("-"):
    sys.exit(__doc__)
u3m, trace, hbm = args[:3]
args = args[3:]
step, policy, extra, tags, held, audit = 3, "predictive", [], False, False, False
while args:
    a = args.pop(0)
    if a == "--step":
        step = int(args.pop(0))
    elif a == "--policy":
        policy = args.pop(0)
    elif a == "--tags":
        tags = True
    elif a == "--held":
        held = True
    elif a == "--audit":
        audit = True
    else:
        extra.append(a)
lines = open(trace).read().split("\n")
here = "# train step %d:" % step
cuts = [i for i, l in enumerate(lines) if l.startswith(here)]
nxt = [i for i, l in enumerate(lines) if l.startswith("# train step %d:" % (step + 1))]
if not cuts:
    sys.exit("%s: no '%s' comment (a `u3m synth` training trace with more steps?)" % (trace, here))
cuts.append(nxt[0] if nxt else len(lines))
res = []
with tempfile.TemporaryDirectory() as tmp:
    for i in cuts:
        cut = os.path.join(tmp, "cut")
        with open(cut, "w") as f:
            f.write("\n".join(lines[:i]) + "\n")
        out = subprocess.run([u3m, "replay", cut, "--hbm", hbm, "--policy", policy, "--json",
                              "--link-model", "shared", "--call-us", "0", "--issue", "acl-replay"] + extra,
                             capture_output=True, text=True, check=True).stdout
        p = json.loads(out)["traces"][0]["policies"][0]
        rt = p["runtime"]
        res.append((lines[i][len("# train step "):] if i < len(lines) else "end", p["total_ns"],
                    rt["h2d_bytes"], rt["d2h_bytes"], p.get("copies_by_tag", {}), rt.get("host_waits", {})))
GIB = float(1 << 30)
print("%s, step %d, HBM %s, %s %s" % (trace, step, hbm, policy, " ".join(extra)))
for a, b in zip(res, res[1:]):
    print("%-16s %8.1f ms   in %6.3f GiB   out %6.3f GiB"
          % (a[0], (b[1] - a[1]) / 1e6, (b[2] - a[2]) / GIB, (b[3] - a[3]) / GIB))
    if tags:
        by = []
        for t in sorted(b[4]):
            was = a[4].get(t, {"in": 0, "out": 0})
            din, dout = b[4][t]["in"] - was["in"], b[4][t]["out"] - was["out"]
            if din + dout >= 4 << 20:
                by.append("%s %.3f / %.3f" % (t, din / GIB, dout / GIB))
        print("    by tag (in / out GiB): %s" % ("; ".join(by) or "none"))
        waits = []
        for k in ("program", "copy_in", "copy_out", "queue"):
            if k in b[5]:
                was = a[5].get(k, {"count": 0, "ns": 0})
                waits.append("%s %d / %.1f ms" % (k, b[5][k]["count"] - was["count"],
                                                   (b[5][k]["ns"] - was["ns"]) / 1e6))
        print("    host waits (count / ms): %s" % "; ".join(waits))
print("%-16s %8.1f ms   in %6.3f GiB   out %6.3f GiB"
      % ("step", (res[-1][1] - res[0][1]) / 1e6, (res[-1][2] - res[0][2]) / GIB, (res[-1][3] - res[0][3]) / GIB))
def whole(flag, key):
    """One run of the whole trace with `flag`: its `key` list, the entries
    of step N's phases (--held: the trace's future decides live or dead;
    --audit: an eviction's copy-in may come phases later; so neither cuts
    the trace)."""
    out = subprocess.run([u3m, "replay", trace, "--hbm", hbm, "--policy", policy, "--json", flag,
                          "--link-model", "shared", "--call-us", "0", "--issue", "acl-replay"] + extra,
                         capture_output=True, text=True, check=True).stdout
    p = json.loads(out)["traces"][0]["policies"][0]
    return [e for e in p[key] if e["label"].startswith("train step %d:" % step)]

if held:
    for h in whole("--held", "held"):
        print("held as %s begins (line %d): %.3f GiB; by tag, GiB live (dirty; taken for dead)"
              " / dead (dirty; foreseen)" % (h["label"][len("train step "):], h["line"], h["resident_bytes"] / GIB))
        for t, b in sorted(h["by_tag"].items()):
            live, dead = b["live_clean"] + b["live_dirty"], b["dead_clean"] + b["dead_dirty"]
            if live + dead >= 4 << 20:
                print("  %10s %7.3f (%.3f; %.3f) / %7.3f (%.3f; %.3f)"
                      % (t, live / GIB, b["live_dirty"] / GIB, b["live_taken_for_dead"] / GIB,
                         dead / GIB, b["dead_dirty"] / GIB, b["dead_foreseen"] / GIB))
if audit:
    for a in whole("--audit", "audit"):
        print("moved in %s (ticks %d-%d); by tag, GiB evicted (copied out) / back in the phase"
              " (foreseen; taken for dead) / copied in (ahead)"
              % (a["label"][len("train step "):], a["from_tick"], a["to_tick"]))
        for t, m in sorted(a["by_tag"].items()):
            if m["out"] + m["in_demand"] + m["in_prefetch"] >= 4 << 20:
                print("  %10s %7.3f (%.3f) / %7.3f (%.3f; %.3f) / %7.3f (%.3f)"
                      % (t, m["out"] / GIB, m["out_dirty"] / GIB, m["back_in_phase"] / GIB,
                         m["back_in_phase_foreseen"] / GIB, m["back_in_phase_taken_for_dead"] / GIB,
                         (m["in_demand"] + m["in_prefetch"]) / GIB, m["in_prefetch"] / GIB))
