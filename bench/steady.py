#!/usr/bin/env python3
"""Per-step copy-in bytes and simulated step time of u3m replay's policies in
every two-step window up to step N: the step after the first, and where the
run settles.
usage: bench/steady.py U3M [--event-model device|simulator] [--hbm-ratio R]
                       [--policy P,...] [--steps N] [--cache DIR]
                       [--replay REPLAY_ARG]... [--waits] [SYNTH_ARG...]
SYNTH_ARG default: --model llama2-13b --layers 8 --seq 1024 --batch 2
--workload lora (the 13B-shaped LoRA of issue 10); HBM = footprint / R
(default 1.5, rounded up to a MiB). For each policy (default
predictive,belady) it replays the 1-, 3-, ..., N-step traces of the shape
(N odd, default 5; `u3m synth --steps`, cached in DIR, default /tmp/steady)
and prints, per step, each window k-(k-2) = (k-step run - (k-2)-step run) / 2:
  3-1: steps 2 and 3, the measure BENCHMARKS.md uses; it holds step 2, where
       the predictive policy is still learning: the evictions of step 1
       (made before any access repeated) are paid for by step 2's fetches;
  5-3 and on: the steady state, once the order has settled.
GiB in = the replay's u3m copy-ins plus the program's own host-to-device
copies (the same in every run of a trace); ms = simulated time. Replay
options: --link-model shared --call-us 0 --issue acl-replay, then each
--replay REPLAY_ARG (e.g. --replay --discard-dead). --waits also prints,
per window and step, what the host waited for (the replay's
runtime.host_waits, ms: launch queue, the program's streams — its
synchronisations and victims still in use —, u3m's copy-ins, u3m's
copy-outs). The
environment is passed to u3m."""
import json, os, subprocess, sys

GIB, MIB = 1 << 30, 1 << 20
args = sys.argv[1:]
if not args or args[0].startswith("-"):
    sys.exit(__doc__)
u3m = args.pop(0)
em, ratio, pols, n, cache = "device", 1.5, "predictive,belady", 5, "/tmp/steady"
waits = False
rest, extra = [], []
while args:
    a = args.pop(0)
    if a == "--event-model":
        em = args.pop(0)
    elif a == "--hbm-ratio":
        ratio = float(args.pop(0))
    elif a == "--policy":
        pols = args.pop(0)
    elif a == "--steps":
        n = int(args.pop(0))
    elif a == "--cache":
        cache = args.pop(0)
    elif a == "--replay":
        extra.append(args.pop(0))
    elif a == "--waits":
        waits = True
    else:
        rest.append(a)
if n < 3 or n % 2 == 0:
    sys.exit("--steps: an odd number, at least 3")
shape = rest or ["--model", "llama2-13b", "--layers", "8", "--seq", "1024",
                 "--batch", "2", "--workload", "lora"]
os.makedirs(cache, exist_ok=True)
sizes = json.loads(subprocess.run([u3m, "synth"] + shape + ["--sizes"], capture_output=True,
                                  text=True, check=True).stdout)
hbm = (int(sizes["trace"]["reserved_bytes"] / ratio) + MIB - 1) // MIB * MIB
tag = "_".join(x.lstrip("-") for x in shape)
runs = {}
for steps in range(1, n + 1, 2):
    tr = os.path.join(cache, "%s_s%d" % (tag, steps))
    if not os.path.exists(tr):
        subprocess.run([u3m, "synth"] + shape + ["--steps", str(steps), "-o", tr],
                       check=True, capture_output=True)
    out = subprocess.run([u3m, "replay", tr, "--hbm", str(hbm), "--policy", pols, "--json",
                          "--link-model", "shared", "--event-model", em, "--call-us", "0",
                          "--issue", "acl-replay"] + extra, capture_output=True, text=True, check=True).stdout
    for p in json.loads(out)["traces"][0]["policies"]:
        rt = p["runtime"]
        w = rt["host_waits"]
        runs[(p["policy"], steps)] = (rt["h2d_bytes"] + rt["program_h2d_bytes"], p["total_ns"],
                                      [w[k]["ns"] for k in ("queue", "program", "copy_in", "copy_out")])
print("%s, HBM %d MiB (footprint / %.2f), --event-model %s %s" % (" ".join(shape), hbm // MIB, ratio, em, " ".join(extra)))
wins = list(range(3, n + 1, 2))
print("%-12s" % "policy" + "".join("%20s" % ("%d-%d: GiB in, ms" % (k, k - 2)) for k in wins))
for pol in pols.split(","):
    cells = []
    for k in wins:
        (ha, ta, _), (hb, tb, _) = runs[(pol, k - 2)], runs[(pol, k)]
        cells.append("%10.3f %9.1f" % ((hb - ha) / 2 / GIB, (tb - ta) / 2e6))
    print("%-12s" % pol + "".join("%20s" % c for c in cells))
if waits:
    print("host waits per step, ms (queue / program / copy-in / copy-out)")
    for pol in pols.split(","):
        cells = []
        for k in wins:
            wa, wb = runs[(pol, k - 2)][2], runs[(pol, k)][2]
            cells.append(" / ".join("%.1f" % ((b - a) / 2e6) for a, b in zip(wa, wb)))
        print("%-12s" % pol + "".join("%30s" % c for c in cells))
