#!/usr/bin/env python3
"""Issue 10's step figures over a band of HBM sizes, not at one point.
usage: bench/band.py U3M [--shapes lora,adam,b13] [--spread S] [--points K]
                     [--cache DIR] [--bound] [REPLAY_ARG...]
For each shape, `u3m replay` (the library's engine on the simulator's cost
model: --policy predictive --link-model shared --call-us 0 --issue acl-replay
--event-model device unless a REPLAY_ARG names one, then each REPLAY_ARG) of its 1-, 3- and 5-step traces
at K HBM sizes spread evenly over the issue's size x (1 - S) .. (1 + S)
(default K = 7, S = 0.015; sizes rounded down to 2 MiB), and per size the
simulated ms per step of steps 2-3 ((3-step - 1-step) / 2, the issue's
measure) and of steps 4-5 (the steady state); then the mean, min and max
over the band. With --bound, also per size the least steady step any
schedule whose copy-outs start at eviction can have
(`bench/pipeline_bound.py --copy-out-at-eviction`, step 3 of the 5-step
trace; needs scipy) and the steps 4-5 figure over it. The engine's figures on the 8-layer LoRA and the 32 GiB
Llama-2-13B step move by 10-20 % with 1 % more or less HBM (BENCHMARKS.md,
twentieth sitting): a change's effect on them is its effect on the band's
mean, not on the point.
Shapes (traces `u3m synth` makes into DIR, default /tmp/steady, once):
  lora  --model llama2-13b --layers 8 --seq 1024 --batch 2 --workload lora, 7939 MiB
  adam  the same with --workload adam, 31330 MiB
  b13   --model llama2-13b --seq 1024 --batch 2 --workload lora, 32 GiB"""
import json, os, statistics, subprocess, sys

MIB = 1 << 20
SHAPES = {
    "lora": (["--model", "llama2-13b", "--layers", "8", "--seq", "1024", "--batch", "2", "--workload", "lora"],
             7939 * MIB),
    "adam": (["--model", "llama2-13b", "--layers", "8", "--seq", "1024", "--batch", "2", "--workload", "adam"],
             31330 * MIB),
    "b13": (["--model", "llama2-13b", "--seq", "1024", "--batch", "2", "--workload", "lora"], 32 << 30),
}


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    u3m = args.pop(0)
    shapes, spread, points, cache, extra = ["lora", "adam", "b13"], 0.015, 7, "/tmp/steady", []
    with_bound = False
    while args:
        a = args.pop(0)
        if a in ("--shapes", "--spread", "--points", "--cache") and not args:
            sys.exit("band.py: %s needs a value" % a)
        if a == "--shapes":
            shapes = args.pop(0).split(",")
            bad = [s for s in shapes if s not in SHAPES]
            if bad:
                sys.exit("band.py: unknown shape %s (lora, adam, b13)" % ",".join(bad))
        elif a == "--spread":
            spread = float(args.pop(0))
        elif a == "--points":
            points = int(args.pop(0))
        elif a == "--cache":
            cache = args.pop(0)
        elif a == "--bound":
            with_bound = True
        else:
            extra.append(a)
    if points < 1 or not 0 <= spread < 1:
        sys.exit("band.py: --points must be >= 1 and --spread in [0, 1)")
    # the device model unless a REPLAY_ARG names another (u3m replay takes one)
    model = [] if "--event-model" in extra else ["--event-model", "device"]
    os.makedirs(cache, exist_ok=True)
    for name in shapes:
        synth, h0 = SHAPES[name]
        base = os.path.join(cache, "band_" + name)
        for s in (1, 3, 5):
            path = "%s_s%d" % (base, s)
            if not os.path.exists(path):
                subprocess.run([u3m, "synth"] + synth + ["--steps", str(s), "-o", path + ".tmp"], check=True,
                               stdout=subprocess.DEVNULL)
                os.replace(path + ".tmp", path)
        facs = [1 - spread + 2 * spread * k / (points - 1) for k in range(points)] if points > 1 else [1.0]
        w23, w45, over = [], [], []
        for f in facs:
            hbm = int(h0 * f) // (2 * MIB) * (2 * MIB)
            runs = {s: subprocess.Popen([u3m, "replay", "%s_s%d" % (base, s), "--hbm", str(hbm), "--policy",
                                         "predictive", "--json", "--link-model", "shared", "--call-us", "0",
                                         "--issue", "acl-replay"] + model + extra,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for s in (1, 3, 5)}
            ms = {}
            for s, p in runs.items():
                out, err = p.communicate()
                if p.returncode != 0:
                    sys.exit("band.py: u3m replay %s_s%d --hbm %d: %s" % (base, s, hbm, err.strip()))
                ms[s] = json.loads(out)["traces"][0]["policies"][0]["total_ns"] / 1e6
            w23.append((ms[3] - ms[1]) / 2)
            w45.append((ms[5] - ms[3]) / 2)
            bound = ""
            if with_bound:
                b = pipeline_bound(base + "_s5", hbm)
                over.append(w45[-1] / b)
                bound = "; bound %7.1f ms, 4-5 = %.3f x" % (b, over[-1])
            print("%-4s HBM %6d MiB (x %.4f): steps 2-3 %7.1f ms, 4-5 %7.1f ms%s" % (name, hbm // MIB, f, w23[-1],
                                                                                      w45[-1], bound), flush=True)
        series = [("steps 2-3", w23), ("steps 4-5", w45)]
        for label, w in series:
            print("%-4s %s: mean %.1f ms, min %.1f, max %.1f over %d sizes" % (name, label, statistics.mean(w),
                                                                            min(w), max(w), len(w)))
        if over:
            print("%-4s steps 4-5 over the bound: mean %.3f x, min %.3f, max %.3f" % (
                name, statistics.mean(over), min(over), max(over)))


def pipeline_bound(trace, hbm):
    """`bench/pipeline_bound.py --copy-out-at-eviction`'s ms per step."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, os.path.join(here, "pipeline_bound.py"), "--json",
                          "--copy-out-at-eviction", str(hbm), trace], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("band.py: pipeline_bound.py %s: %s" % (trace, out.stderr.strip()))
    return json.loads(out.stdout)["bound_ms"]


if __name__ == "__main__":
    main()
