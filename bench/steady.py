#!/usr/bin/env python3
"""Per-step copy-in bytes and simulated step time of u3m replay's policies in
the step after the first and in steady state.
usage: bench/steady.py U3M [--event-model device|simulator] [--hbm-ratio R]
                       [--policy P,...] [--cache DIR] [SYNTH_ARG...]
SYNTH_ARG default: --model llama2-13b --layers 8 --seq 1024 --batch 2
--workload lora (the 13B-shaped LoRA of issue 10); HBM = footprint / R
(default 1.5, rounded up to a MiB, as /work/logs/s12/var.py sizes it).
For each policy (default predictive,belady) it replays the 1-, 3- and 5-step
traces of the shape (`u3m synth --steps N`, cached in DIR, default
/tmp/steady) and prints, per step:
  2nd+3rd: (3-step - 1-step) / 2, the measure BENCHMARKS.md uses; it holds
           step 2, where the predictive policy is still learning: the
           evictions of step 1 (made before any access repeated) are paid
           for by step 2's fetches;
  4th+5th: (5-step - 3-step) / 2, the steady state.
H2D = the replay's u3m copy-ins plus the program's own host-to-device
copies (the same in every run of a trace); ms = simulated time. Options as
var.py's: --link-model shared --call-us 0 --issue acl-replay."""
import json, os, subprocess, sys

GIB, MIB = 1 << 30, 1 << 20
args = sys.argv[1:]
if not args or args[0].startswith("-"):
    sys.exit(__doc__)
u3m = args.pop(0)
em, ratio, pols, cache = "device", 1.5, "predictive,belady", "/tmp/steady"
rest = []
while args:
    a = args.pop(0)
    if a == "--event-model":
        em = args.pop(0)
    elif a == "--hbm-ratio":
        ratio = float(args.pop(0))
    elif a == "--policy":
        pols = args.pop(0)
    elif a == "--cache":
        cache = args.pop(0)
    else:
        rest.append(a)
shape = rest or ["--model", "llama2-13b", "--layers", "8", "--seq", "1024",
                 "--batch", "2", "--workload", "lora"]
os.makedirs(cache, exist_ok=True)
sizes = json.loads(subprocess.run([u3m, "synth"] + shape + ["--sizes"], capture_output=True,
                                  text=True, check=True).stdout)
foot = sizes["trace"]["reserved_bytes"]
hbm = (int(foot / ratio) + MIB - 1) // MIB * MIB
tag = "_".join(x.lstrip("-") for x in shape)
runs = {}
for steps in (1, 3, 5):
    tr = os.path.join(cache, "%s_s%d" % (tag, steps))
    if not os.path.exists(tr):
        subprocess.run([u3m, "synth"] + shape + ["--steps", str(steps), "-o", tr],
                       check=True, capture_output=True)
    out = subprocess.run([u3m, "replay", tr, "--hbm", str(hbm), "--policy", pols, "--json",
                          "--link-model", "shared", "--event-model", em, "--call-us", "0",
                          "--issue", "acl-replay"], capture_output=True, text=True, check=True).stdout
    for p in json.loads(out)["traces"][0]["policies"]:
        rt = p["runtime"]
        runs[(p["policy"], steps)] = (rt["h2d_bytes"] + rt["program_h2d_bytes"], p["total_ns"])
print("%s, HBM %d MiB (footprint / %.2f), --event-model %s" % (" ".join(shape), hbm // MIB, ratio, em))
print("%-12s %24s %24s" % ("policy", "2nd+3rd: GiB in, ms", "4th+5th: GiB in, ms"))
for pol in pols.split(","):
    cells = []
    for a, b in ((1, 3), (3, 5)):
        (ha, ta), (hb, tb) = runs[(pol, a)], runs[(pol, b)]
        cells.append("%8.3f %8.1f" % ((hb - ha) / 2 / GIB, (tb - ta) / 2e6))
    print("%-12s %24s %24s" % (pol, cells[0], cells[1]))
