#!/usr/bin/env python3
"""Native added ns per hooked call (host CPU, not simulated): hookbench
--per-iter, tier mode, phantom device, p50 per iteration divided by the
calls per iteration, with libu3m.so minus without, in pairs (which arm
goes first alternates; the builds' order is random per pair). T=1 20,000
iterations, unpinned and pinned to CPU 0; T=8 5,000 per thread, pinned to CPU 0. fast5's
/tmp/f5/hb.py, kept here (BENCHMARKS.md `fast7`).

  bench/hb_pairs.py PAIRS BIN...     (BIN: libu3m.so and acl-apps/hookbench)
  bench/hb_pairs.py --t8 PAIRS BIN...

--t8: aclop_4 at T=8 pinned only (the issue's per-call figure), with the
median and the 10 % trimmed mean per build: builds that differ only in
libu3m.so, measured in one run, compare without the VM's drift between
runs (BENCHMARKS.md, thirty-fourth and thirty-fifth sittings).
"""
import os, random, re, statistics, subprocess, sys, tempfile

CASES = "aclop_4,memcpy_h2d,memset_sync,aclnn_add,malloc_free_small"


def run(b, lib, t, iters, pin, shm):
    env = dict(os.environ, ACLSIM_PHANTOM="1")
    if lib:
        env.update(LD_PRELOAD=os.path.join(b, "libu3m.so"), U3M_MODE="tier", U3M_SHM_DIR=shm)
    cmd = ["nice", "-n", "5"] + (["taskset", "-c", "0"] if pin else [])
    cmd += [os.path.join(b, "acl-apps/hookbench"), "--threads", str(t), "--iters", str(iters),
            "--per-iter", "--case", CASES]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    r = {}
    for line in out.splitlines():
        m = re.search(r"case=(\S+) .*calls_per_iter=(\d+).*p50_ns_per_iter=([\d.]+)", line)
        if m:
            r[m.group(1)] = float(m.group(3)) / int(m.group(2))
    return r


def main():
    args = sys.argv[1:]
    t8 = bool(args) and args[0] == "--t8"
    if t8:
        args = args[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    global CASES
    pairs, bins = int(args[0]), args[1:]
    configs = ((1, 20000, False), (1, 20000, True), (8, 5000, True))
    if t8:
        CASES, configs = "aclop_4", ((8, 5000, True),)
    shm = tempfile.mkdtemp(prefix="u3m-hb.")
    res = {}
    for p in range(pairs):
        order = list(bins)
        random.shuffle(order)
        for b in order:
            for (t, iters, pin) in configs:
                arms = [False, True] if p % 2 == 0 else [True, False]
                got = {lib: run(b, lib, t, iters, pin, shm) for lib in arms}
                for c in got[True]:
                    res.setdefault((b, t, pin, c), []).append(got[True][c] - got[False][c])
        print("pair %d done, load %.1f" % (p + 1, os.getloadavg()[0]), file=sys.stderr, flush=True)
    for (b, t, pin, c), v in sorted(res.items()):
        if t8:
            w, k = sorted(v), len(v) // 10
            print("%-24s aclop_4 T=8 pinned median %6.1f ns  trimmed10 %6.1f  (n %d)" % (
                b, statistics.median(w), statistics.mean(w[k:len(w) - k]), len(w)))
            continue
        print("%-16s T=%d%s %-17s median %6.1f ns  [%s]" % (
            b.rstrip("/").rsplit("/", 1)[-1], t, " pinned" if pin else "", c,
            statistics.median(v), " ".join("%.0f" % x for x in v)))


if __name__ == "__main__":
    main()
