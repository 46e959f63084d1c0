#!/usr/bin/env python3
"""Per-step copy-in bytes and simulated step time of u3m replay's predictive
policy in every two-step window up to step N: where the order settles.
usage: bench/steps.py U3M [--event-model device|simulator] [--hbm-ratio R]
                      [--steps N] [--cache DIR] [SYNTH_ARG...]
SYNTH_ARG default: --model llama2-13b --layers 8 --seq 1024 --batch 2
--workload lora (issue 10's 13B-shaped LoRA); HBM = footprint / R (default
1.5, rounded up to a MiB, as bench/steady.py sizes it). Replays the 1-, 3-,
..., N-step traces (N odd, default 11; `u3m synth --steps`, cached in DIR,
default /tmp/steady) and prints, for each window k-(k-2) = (k-step run -
(k-2)-step run) / 2, GiB in per step (u3m's copy-ins plus the program's own
H2D) and simulated ms per step. Options as bench/steady.py's: --link-model
shared --call-us 0 --issue acl-replay. The environment is passed to u3m."""
import json, os, subprocess, sys

GIB, MIB = 1 << 30, 1 << 20
args = sys.argv[1:]
if not args or args[0].startswith("-"):
    sys.exit(__doc__)
u3m = args.pop(0)
em, ratio, n, cache = "device", 1.5, 11, "/tmp/steady"
rest = []
while args:
    a = args.pop(0)
    if a == "--event-model":
        em = args.pop(0)
    elif a == "--hbm-ratio":
        ratio = float(args.pop(0))
    elif a == "--steps":
        n = int(args.pop(0))
    elif a == "--cache":
        cache = args.pop(0)
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
    out = subprocess.run([u3m, "replay", tr, "--hbm", str(hbm), "--policy", "predictive",
                          "--json", "--link-model", "shared", "--event-model", em,
                          "--call-us", "0", "--issue", "acl-replay"],
                         capture_output=True, text=True, check=True).stdout
    p = json.loads(out)["traces"][0]["policies"][0]
    rt = p["runtime"]
    runs[steps] = (rt["h2d_bytes"] + rt["program_h2d_bytes"], p["total_ns"])
print("%s, HBM %d MiB (footprint / %.2f), --event-model %s" % (" ".join(shape), hbm // MIB,
                                                              ratio, em))
print("%-8s %9s %9s" % ("window", "GiB in", "ms"))
for k in range(3, n + 1, 2):
    print("%-8s %9.3f %9.1f" % ("%d-%d" % (k, k - 2), (runs[k][0] - runs[k - 2][0]) / 2 / GIB,
                                (runs[k][1] - runs[k - 2][1]) / 2e6))
