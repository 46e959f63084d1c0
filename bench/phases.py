#!/usr/bin/env python3
"""Simulated time and u3m's bytes in / out of each phase of one training step
in `u3m replay`: the trace cut at each `# train step N: PHASE` comment that
`u3m synth` writes (forward, backward, optimizer), replayed to each cut; a
phase's figures are the differences between consecutive cuts (a cut run
ends when its work drains, so copies issued late in a phase may count in the
next).
usage: bench/phases.py U3M TRACE HBM_BYTES [--step N] [--policy P] [REPLAY_ARG...]
N: the 0-based step (default 3: the steady state of a 5-step trace, as
bench/steady.py's 5-3 window). Replay options: --link-model shared
--call-us 0 --issue acl-replay, then REPLAY_ARG. The environment is passed
to u3m."""
import json, os, subprocess, sys, tempfile

args = sys.argv[1:]
if len(args) < 3 or args[0].startswith("-"):
    sys.exit(__doc__)
u3m, trace, hbm = args[:3]
args = args[3:]
step, policy, extra = 3, "predictive", []
while args:
    a = args.pop(0)
    if a == "--step":
        step = int(args.pop(0))
    elif a == "--policy":
        policy = args.pop(0)
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
                    rt["h2d_bytes"], rt["d2h_bytes"]))
GIB = float(1 << 30)
print("%s, step %d, HBM %s, %s %s" % (trace, step, hbm, policy, " ".join(extra)))
for a, b in zip(res, res[1:]):
    print("%-16s %8.1f ms   in %6.3f GiB   out %6.3f GiB"
          % (a[0], (b[1] - a[1]) / 1e6, (b[2] - a[2]) / GIB, (b[3] - a[3]) / GIB))
print("%-16s %8.1f ms   in %6.3f GiB   out %6.3f GiB"
      % ("step", (res[-1][1] - res[0][1]) / 1e6, (res[-1][2] - res[0][2]) / GIB, (res[-1][3] - res[0][3]) / GIB))
