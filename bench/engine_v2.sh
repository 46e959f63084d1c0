#!/usr/bin/env bash
# bench/engine_v2.sh — the figures of BENCHMARKS.md "Residency engine v2"
# (issue 10), before and after each stage, in one run:
#   step    13B-shaped LoRA (8 layers, seq 1024 x batch 2), phantom, acl_replay:
#           unconstrained vs libu3m.so at 1.5 x HBM — simulated step time, the
#           link floor (design.md §5), H2D/D2H bytes per step, host CPU per step
#           (rusage total, and by thread: app / u3m-* / simulator aclsim-*)
#   call    callgrind Ir per call u3m adds in tier mode with nothing to move
#           (hookbench, T=1 and T=8)
#   start   start-up: wall and CPU time of a 50-step phantom mlp_train,
#           without libu3m.so and with it (observe, tier), arms alternated;
#           median of max(5, --reps)
#   rag     RAG: kv_decode, 25 requests (2.1 x the 12 whose KV fits 512 MiB),
#           phantom, predictive: simulated tokens/s and decode step against
#           its 14.43 ms link floor (BENCHMARKS.md "The RAG floor"), and the
#           host CPU of the app thread (user / sys) and of u3m's own threads
#           (u3m-apply, u3m-publish) against an unconstrained run
#           (1 TiB HBM, no libu3m.so); --reps pairs
#   (rag is not in the default set: ~1 min a pair; --only step,call,start,rag)
#
#   bench/engine_v2.sh [--only step,call,start] [--layers N] [--workload lora|adam]
#                      [--steps A,B] [--reps R] [--hbm MIB] [--out DIR] [--no-build] [--bin DIR]
# --hbm MIB: the step section's HBM (default: the footprint / 1.5); with
#   --layers 40, the Llama-2-13B LoRA step on a 32 GiB card is --hbm 32768
# --reps R: libu3m.so runs per step count (default 3; the median step is
#   shown with min-max: eviction timing follows the host's real time)
# --bin DIR: measure the build in DIR (an earlier run's OUT/bin: before/after)
# Per step = (B-step run - A-step run) / (B - A): start-up and weight load cancel.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT="" ONLY="step,call,start" LAYERS=8 WORKLOAD=lora STEPS="1,3" BUILD=1 FROM="" REPS=3 HBM=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        --layers) LAYERS=$2; shift 2 ;;
        --workload) WORKLOAD=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --hbm) HBM=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --bin) FROM=$(cd "$2" && pwd); BUILD=0; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "engine_v2.sh: unknown argument '$1' (--help)" >&2; exit 3 ;;
    esac
done
if [ -n "$HBM" ] && ! [[ "$HBM" =~ ^[1-9][0-9]*$ ]]; then
    echo "engine_v2.sh: --hbm takes a size in MiB (a positive integer), not '$HBM'" >&2
    exit 3
fi
[ "$BUILD" = 1 ] && (cd "$ROOT" && cargo build --release --workspace >&2)
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/u3m-engine-v2.XXXXXX)
mkdir -p "$OUT/bin"
# a private copy of the build: other builds may rewrite target/release meanwhile
SRC=${FROM:-$ROOT/target/release}
cp -a "$SRC"/*.so "$SRC/acl-apps" "$SRC/u3m" "$OUT/bin/"
# which commit the measured build is: this checkout's when it built or took
# its own target/, the earlier run's record for --bin, else unknown
if [ -z "$FROM" ]; then
    git -C "$ROOT" rev-parse --short HEAD >"$OUT/bin/COMMIT"
elif [ -f "$FROM/COMMIT" ]; then
    [ "$FROM" = "$OUT/bin" ] || cp "$FROM/COMMIT" "$OUT/bin/COMMIT"
else
    echo "unknown (--bin $FROM)" >"$OUT/bin/COMMIT"
fi
echo "engine_v2.sh: raw results in $OUT" >&2

exec python3 - "$ROOT" "$OUT" "$ONLY" "$LAYERS" "$WORKLOAD" "$STEPS" "$REPS" "$HBM" <<'PY'
import json, os, statistics, subprocess, sys, threading, time

ROOT, OUT, ONLY, LAYERS, WORKLOAD, STEPS, REPS, HBM = sys.argv[1:9]
REPS = int(REPS)
ONLY = set(ONLY.split(","))
S1, S2 = (int(x) for x in STEPS.split(","))
BIN = os.path.join(OUT, "bin")
APPS, LIB, U3M = os.path.join(BIN, "acl-apps"), os.path.join(BIN, "libu3m.so"), os.path.join(BIN, "u3m")
MIB, GIB, LINK = 1 << 20, 1 << 30, 25e9  # LINK: ACLSIM_LINK_GBPS default, bytes/s

def log(m):
    print("engine_v2: " + m, file=sys.stderr, flush=True)

THREAD_POLL_S = 0.01
TICK = os.sysconf("SC_CLK_TCK")

def sample_threads(pid, seen):
    """CPU seconds of every thread of pid so far, by tid: {tid: (comm, s)}.
    schedstat (ns) where the kernel has it, else stat's utime + stime (ticks).
    A thread that exits between two samples keeps its last sample: up to
    THREAD_POLL_S of its CPU goes unattributed (the total comes from rusage)."""
    base = "/proc/%d/task" % pid
    try:
        tids = os.listdir(base)
    except OSError:
        return
    for t in tids:
        try:
            st = open("%s/%s/stat" % (base, t)).read()
            comm = st[st.index("(") + 1:st.rindex(")")]
            try:
                cpu = int(open("%s/%s/schedstat" % (base, t)).read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                f = st[st.rindex(")") + 2:].split()
                cpu = (int(f[11]) + int(f[12])) / TICK
        except (OSError, ValueError):
            continue
        if cpu >= seen.get(int(t), ("", 0.0))[1]:
            seen[int(t)] = (comm, cpu)
        if int(t) == pid:
            f = st[st.rindex(")") + 2:].split()
            seen["app_us"] = (int(f[11]) / TICK, int(f[12]) / TICK)

def thread_group(pid, tid, comm):
    if tid == pid:
        return "app"  # the program's main thread: u3m's hooks run inline on it
    if comm.startswith("aclsim-"):
        return "sim"  # the simulated runtime's stream workers (device work)
    if comm.startswith("u3m"):
        return "u3m"  # u3m's named background threads
    return "other"  # unnamed threads (they inherit the creator's name)

def thread_groups(pid, seen):
    g = {"app": 0.0, "sim": 0.0, "u3m": 0.0, "other": 0.0}
    for tid, (comm, cpu) in seen.items():
        if tid == "app_us":
            g["app_user"], g["app_sys"] = comm, cpu
            continue
        g[thread_group(pid, tid, comm)] += cpu
    g["names"] = sorted({v[0] for k, v in seen.items() if k != "app_us"})
    return g

def run(name, cmd, env, tier=False, by_thread=False):
    """Runs cmd with a hermetic environment; returns stats, summary, rusage
    (and, by_thread, each thread's CPU: see sample_threads)."""
    path = os.path.join(OUT, name)
    e = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    e.update(env)
    e["ACLSIM_STATS"] = path + ".stats.json"
    if tier:
        e["LD_PRELOAD"] = LIB
        e.setdefault("U3M_MODE", "tier")
        e["U3M_SUMMARY"] = path + ".summary.json"
    log("%s: %s %s" % (name, " ".join("%s=%s" % kv for kv in env.items()), " ".join(cmd)))
    t0 = time.monotonic()
    with open(path + ".out", "w") as fo, open(path + ".err", "w") as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=e, cwd=ROOT)
        threads, stop = {}, threading.Event()
        if by_thread:
            def poll():
                while not stop.wait(THREAD_POLL_S):
                    sample_threads(p.pid, threads)
            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            # exit seen at once (no polling delay in wall_s), not yet reaped:
            # the zombie's last sample, then wait4
            os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
            stop.set()
            poller.join()
            sample_threads(p.pid, threads)
        _, status, ru = os.wait4(p.pid, 0)
    rec = {"name": name, "rc": os.waitstatus_to_exitcode(status), "wall_s": time.monotonic() - t0,
           "cpu_s": ru.ru_utime + ru.ru_stime, "threads": thread_groups(p.pid, threads)}
    for f, k in ((".stats.json", "stats"), (".summary.json", "summary")):
        try:
            rec[k] = json.load(open(path + f))
        except (OSError, ValueError):
            rec[k] = {}
    if rec["rc"] != 0:
        log("%s failed (rc %d): %s" % (name, rec["rc"], open(path + ".err").read()[-400:]))
    rt = {k: rec["stats"].get(k, 0) for k in ("query_giveups", "wait_parks")}
    if any(rt.values()):
        # the simulated figures then depend on how the machine scheduled it
        log("WARNING %s: the simulator answered by real time (%s): its simulated figures may "
            "not reproduce" % (name, ", ".join("%s %d" % kv for kv in rt.items())))
    return rec

def fmt_b(b):
    return "%.2f GiB" % (b / GIB) if abs(b) >= GIB else "%.1f MiB" % (b / MIB)

def sec_step():
    shape = ["--model", "llama2-13b", "--layers", LAYERS, "--seq", "1024", "--batch", "2", "--workload", WORKLOAD]
    sz = json.loads(subprocess.run([U3M, "synth"] + shape + ["--sizes"], capture_output=True, text=True, check=True).stdout)
    F = sz["trace"]["reserved_bytes"]
    H = int(HBM) * MIB if HBM else (int(F / 1.5) + MIB - 1) // MIB * MIB
    # read-only memory: the frozen base weights of a LoRA step; everything else
    # may be written. The floor places the excess on read-only memory first.
    ro = sz["bytes"]["weights"] if WORKLOAD == "lora" else 0
    excess = F - H
    must_cross = min(excess, ro) + 2 * max(0, excess - ro)
    ph = {"ACLSIM_PRESET": "910b4", "ACLSIM_PHANTOM": "1"}
    res = {}
    for s in (S1, S2):
        tr = os.path.join(OUT, "trace-s%d" % s)
        subprocess.run([U3M, "synth"] + shape + ["--steps", str(s), "-o", tr], check=True)
        cmd = [os.path.join(APPS, "acl_replay"), "--no-verify", tr]
        res[("unc", s)] = run("unc-s%d" % s, cmd, dict(ph, ACLSIM_HBM_BYTES="1T"), by_thread=True)
        for k in range(REPS):
            res[("tier%d" % k, s)] = run("tier-s%d-r%d" % (s, k), cmd, dict(ph, ACLSIM_HBM_BYTES="%dM" % (H // MIB),
                                         U3M_OVERSUB="2", U3M_DRAM_BYTES="64G"), tier=True, by_thread=True)
        os.unlink(tr)
    d = lambda arm, f: (f(res[(arm, S2)]) - f(res[(arm, S1)])) / (S2 - S1)
    cb = lambda k: (lambda r: (r["stats"].get("copy_bytes") or {}).get(k, 0))
    unc = d("unc", lambda r: r["stats"]["sim_ns"]) / 1e6
    # the i-th runs paired; the run with the median step stands for the rest
    steps = sorted((d("tier%d" % k, lambda r: r["stats"]["sim_ns"]) / 1e6, k) for k in range(REPS))
    tier, med = steps[len(steps) // 2]
    for s in (S1, S2):
        res[("tier", s)] = res[("tier%d" % med, s)]
    floor = max(unc, must_cross / LINK * 1e3)
    # the simulator's link is full duplex (PCIe is; docs/simulator.md): one
    # shared calendar per direction, so copy-ins and copy-outs overlap and
    # the floor is the busier direction (excess in, dirty excess out)
    dirty_out = max(0, excess - ro)
    floor_duplex = max(unc, max(excess, dirty_out) / LINK * 1e3)
    print("## step: 13B-shaped %s, %s layers, seq 1024 x batch 2, phantom acl_replay, 910b4, per step from %d- and %d-step runs"
          % (WORKLOAD, LAYERS, S1, S2))
    print("footprint F %s, HBM %s (%s), excess %s, read-only %s -> bytes that must cross %s / step"
          % (fmt_b(F), fmt_b(H), "--hbm" if HBM else "F/1.5", fmt_b(excess), fmt_b(ro), fmt_b(must_cross)))
    print("step unconstrained (simulated)  %.1f ms" % unc)
    print("link floor (simulated)          %.1f ms" % floor)
    print("full-duplex floor (simulated)   %.1f ms" % floor_duplex)
    print("step libu3m.so (simulated)      %.1f ms = %.2f x floor, %.2f x full-duplex floor (median of %d, %.1f-%.1f ms)"
          % (tier, tier / floor, tier / floor_duplex, REPS, steps[0][0], steps[-1][0]))
    for arm in ["unc", "tier"] + ["tier%d" % k for k in range(REPS)]:
        print("%-5s H2D / step %s, D2H / step %s, host CPU / step %.2f s, whole %d-step run: %.1f s CPU, %.1f s wall"
              % (arm, fmt_b(d(arm, cb("H2D"))), fmt_b(d(arm, cb("D2H"))), d(arm, lambda r: r["cpu_s"]), S2,
                 res[(arm, S2)]["cpu_s"], res[(arm, S2)]["wall_s"]))
    # host CPU by thread: per step, each group's (B-step - A-step) / (B - A);
    # "unattributed" = rusage total - the threads' samples (threads that
    # exited between two samples). u3m's added CPU = tier - unc.
    grp = lambda g: (lambda r: r["threads"][g])
    unatt = lambda r: r["cpu_s"] - sum(r["threads"][g] for g in ("app", "sim", "u3m", "other"))
    cols = (("app", grp("app")), ("u3m-bg", grp("u3m")), ("sim", grp("sim")), ("other", grp("other")),
            ("unattributed", unatt), ("total", lambda r: r["cpu_s"]))
    print("host CPU by thread / step (s): app = main thread incl. u3m's inline hooks, u3m-bg = u3m-* threads,"
          " sim = simulator stream threads aclsim-*, other = unnamed threads")
    for arm in ["unc", "tier"] + ["tier%d" % k for k in range(REPS)]:
        print("%-5s %s" % (arm, ", ".join("%s %.3f" % (c, d(arm, f)) for c, f in cols)))
    u3m_add = d("tier", grp("app")) + d("tier", grp("u3m")) + d("tier", grp("other")) \
        - d("unc", grp("app")) - d("unc", grp("u3m")) - d("unc", grp("other"))
    print("u3m's added host CPU / step (tier - unc, threads other than sim): %.3f s = %.2f x the simulated step;"
          " sim threads %.3f s (unc %.3f s)" % (u3m_add, u3m_add / (tier / 1e3), d("tier", grp("sim")), d("unc", grp("sim"))))
    print("thread names (%d-step tier run): %s" % (S2, " ".join(res[("tier", S2)]["threads"]["names"])))
    t = (res[("tier", S2)]["summary"].get("tier") or {})
    print("tier counters (%d-step run): %s" % (S2, ", ".join("%s=%s" % (k, t.get(k)) for k in
          ("faults_in", "evictions", "clean_drops", "to_dram", "prefetched", "evict_waits") if k in t)))
    rcs = [r["rc"] for r in res.values()]
    if any(rcs):
        print("FAILED runs: %s" % [r["name"] for r in res.values() if r["rc"]])
    print()

def sec_call():
    hb = os.path.join(APPS, "hookbench")
    print("## call: Ir per call u3m adds, tier mode, nothing to move (hookbench, callgrind, phantom)")
    for t, iters in ((1, 4000), (8, 500)):
        row = []
        for c in ("aclop_4", "memcpy_h2d", "memset_sync", "aclnn_add", "malloc_free_small"):
            ir = {}
            for arm in ("direct", "u3m"):
                f = os.path.join(OUT, "cg-%s-t%d-%s" % (arm, t, c))
                env = dict(os.environ, ACLSIM_PHANTOM="1")
                if arm == "u3m":
                    env.update(LD_PRELOAD=LIB, U3M_MODE="tier", U3M_SHM_DIR=OUT)
                subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=hb_measure",
                                "--callgrind-out-file=" + f + ".cg", hb, "--threads", str(t), "--iters", str(iters),
                                "--warmup", "200", "--case", c], env=env, stdout=subprocess.DEVNULL,
                               stderr=open(f + ".log", "w"), check=True)
                s = subprocess.run([sys.executable, os.path.join(ROOT, "bench/cg_summary.py"), f + ".cg"],
                                   capture_output=True, text=True, check=True)
                ir[arm] = json.loads(s.stdout)["total"]
            calls = {"aclnn_add": 7, "malloc_free_small": 2}.get(c, 1)
            row.append("%s %.0f" % (c, (ir["u3m"] - ir["direct"]) / (iters * t) / calls))
        print("T=%d: %s" % (t, ", ".join(row)))
    print()

RAG_ARGS = ["--heads", "8", "--head-dim", "128", "--prompt", "512", "--decode", "511", "--max-context", "1023",
            "--requests", "25"]
RAG_FLOOR_MS = 14.43  # per decode step: 360.7 MB of read-only KV must cross per step (BENCHMARKS.md)

def app_user_sys(r):
    return r["threads"].get("app_user", 0.0), r["threads"].get("app_sys", 0.0)

def sec_rag():
    kv = [os.path.join(APPS, "kv_decode")] + RAG_ARGS
    # u3m's added host CPU: the app thread (u3m's hooks run inline on it)
    # plus u3m's own threads (u3m-apply does the calls' deferred work)
    print("## rag: kv_decode 25 requests, 512 MiB HBM, phantom, predictive; app thread + u3m-* threads host CPU (s), simulated time")
    print("| run | tokens/s (sim) | ms / decode step (sim) | x floor 14.43 ms | app CPU s (user / sys) | u3m-* threads CPU s | u3m added / simulated run |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k in range(REPS):
        u = run("rag-unc-%d" % k, kv, {"ACLSIM_PHANTOM": "1", "ACLSIM_HBM_BYTES": "1T"}, by_thread=True)
        t = run("rag-tier-%d" % k, kv, {"ACLSIM_PHANTOM": "1", "ACLSIM_HBM_BYTES": "512M", "U3M_OVERSUB": "2",
                                        "U3M_DRAM_BYTES": "16G", "U3M_POLICY": "predictive"}, tier=True, by_thread=True)
        for name, r in (("unc", u), ("tier", t)):
            kvs = dict(l.split("=", 1) for l in open(os.path.join(OUT, r["name"] + ".out")).read().split()
                       if "=" in l and l.count("=") == 1)
            r["sim_ms"] = float(kvs.get("sim_ms", "nan"))
            r["tps"] = float(kvs.get("sim_tokens_per_s", "nan"))
        own = lambda r: r["threads"]["app"] + r["threads"]["u3m"]
        add = own(t) - own(u)
        for name, r in (("unc", u), ("tier", t)):
            us, sy = app_user_sys(r)
            step = r["sim_ms"] / 511
            print("| %s %d | %.1f | %.2f | %s | %.2f (%.2f / %.2f) | %.2f | %s |" % (
                name, k, r["tps"], step, "%.3f" % (step / RAG_FLOOR_MS) if name == "tier" else "",
                r["threads"]["app"], us, sy, r["threads"]["u3m"],
                "%.3f s = %.2f x" % (add, add / (t["sim_ms"] / 1e3)) if name == "tier" else ""))
    print()

def sec_start():
    cmd = [os.path.join(APPS, "mlp_train"), "--steps", "50"]
    n = max(5, REPS)
    print("## start: 50-step phantom mlp_train, wall s and CPU s (rusage, all threads), median of %d, arms alternated" % n)
    arms = (("without", {}, False), ("observe", {"U3M_MODE": "observe"}, True), ("tier", {}, True))
    runs = {a[0]: [] for a in arms}
    for i in range(n):
        for arm, env, tier in arms:
            runs[arm].append(run("start-%s-%d" % (arm, i), cmd, dict(env, ACLSIM_PHANTOM="1"), tier=tier))
    print(", ".join("%s %.3f s (min %.3f), CPU %.3f s" % (
        arm, statistics.median(r["wall_s"] for r in rs), min(r["wall_s"] for r in rs),
        statistics.median(r["cpu_s"] for r in rs)) for arm, rs in runs.items()))
    print()

print("# engine_v2.sh, build of commit %s, %s, load %s\n" % (
    open(os.path.join(BIN, "COMMIT")).read().strip(),
    time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), " ".join("%.1f" % x for x in os.getloadavg())))
for name, f in (("step", sec_step), ("call", sec_call), ("start", sec_start), ("rag", sec_rag)):
    if name in ONLY:
        f()
PY
