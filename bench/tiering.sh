#!/usr/bin/env bash
# bench/tiering.sh — the tiering benchmarks of BENCHMARKS.md ("## Tiering"):
#   train  mlp_train footprint sweep on a 256 MiB device (real data, checksums)
#   lora   13B-shaped (8-layer) LoRA and full-Adam traces at 1.5x HBM (phantom)
#   rag    kv_decode requests served at a latency budget, stock vs u3m
#   13b    Llama-2-13B-shaped training steps on a 32 GiB 910B4 (phantom)
# Every run's command, stdout, stderr, ACLSIM_STATS and U3M_SUMMARY go to the
# output directory; the tables at the end are computed from those files.
#
#   bench/tiering.sh                    everything (~30 min on 2 cores)
#   bench/tiering.sh --quick            fewer footprints and configurations
#   bench/tiering.sh --only rag,13b     some sections (train,lora,rag,13b)
#   bench/tiering.sh --full40           also the 40-layer full-Adam 13B step (6.6x HBM, slow)
#   bench/tiering.sh --out DIR          raw results there (default /tmp/u3m-tiering.XXXXXX)
#   bench/tiering.sh --no-build         skip cargo build --release --workspace
#   bench/tiering.sh --report DIR       only print the tables of an earlier run
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=""
ONLY="train,lora,rag,13b"
QUICK=0
BUILD=1
FULL40=0
REPORT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --no-build) BUILD=0; shift ;;
        --full40) FULL40=1; shift ;;
        --report) REPORT=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "tiering.sh: unknown argument '$1' (--help)" >&2; exit 3 ;;
    esac
done

if [ -z "$REPORT" ]; then
    if [ "$BUILD" = 1 ]; then
        (cd "$ROOT" && cargo build --release --workspace >&2)
    fi
    [ -n "$OUT" ] || OUT=$(mktemp -d /tmp/u3m-tiering.XXXXXX)
    mkdir -p "$OUT"
    echo "tiering.sh: raw results in $OUT" >&2
    # a private copy of the build: others may rebuild target/release meanwhile
    # (the programs find their libraries through an $ORIGIN/.. runpath)
    rm -rf "$OUT/bin"
    mkdir -p "$OUT/bin"
    cp -a "$ROOT"/target/release/*.so "$ROOT/target/release/acl-apps" "$ROOT/target/release/u3m" "$OUT/bin/"
else
    OUT=$REPORT
fi

exec python3 - "$ROOT" "$OUT" "$ONLY" "$QUICK" "$FULL40" "${REPORT:+report}" <<'PY'
import json, os, platform, re, shlex, signal, subprocess, sys, threading, time

ROOT, OUT, ONLY, QUICK, FULL40 = sys.argv[1], sys.argv[2], set(sys.argv[3].split(",")), sys.argv[4] == "1", sys.argv[5] == "1"
REPORT_ONLY = len(sys.argv) > 6 and sys.argv[6] == "report"
BIN = os.path.join(OUT, "bin")
REL = BIN if os.path.isdir(BIN) else os.path.join(ROOT, "target/release")
APPS = os.path.join(REL, "acl-apps")
LIB = os.path.join(REL, "libu3m.so")
MIB, GIB = 1 << 20, 1 << 30
LINK = 25e9  # ACLSIM_LINK_GBPS default: host<->device bytes/s

def log(msg):
    print("tiering: " + msg, file=sys.stderr, flush=True)

# ------------------------------------------------------------------ running
def rel(p):
    """Paths as a reader would type them: the snapshot is target/release."""
    if p.startswith(BIN + "/"):
        return "target/release/" + p[len(BIN) + 1:]
    if p.startswith(OUT + "/"):
        return p[len(OUT) + 1:]
    return os.path.relpath(p, ROOT) if p.startswith(ROOT) else p

def run(name, cmd, env, tier=False, timeout=3600):
    """Runs cmd with a hermetic environment; keeps everything under OUT/name.*"""
    path = os.path.join(OUT, name)
    e = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env = dict(env)
    env["ACLSIM_STATS"] = path + ".stats.json"
    if tier:
        env.setdefault("U3M_MODE", "tier")
        env["LD_PRELOAD"] = LIB
        env["U3M_SUMMARY"] = path + ".summary.json"
    e.update(env)
    for f in (".stats.json", ".summary.json"):
        if os.path.exists(path + f):
            os.unlink(path + f)
    shown = " ".join("%s=%s" % (k, shlex.quote(rel(v) if k in ("LD_PRELOAD", "U3M_SWAP_DIR") else v))
                     for k, v in env.items() if k not in ("ACLSIM_STATS", "U3M_SUMMARY"))
    shown += " " + " ".join(shlex.quote(rel(c)) for c in cmd)
    log("%-28s %s" % (name, shown))
    t0 = time.monotonic()
    with open(path + ".out", "w") as fo, open(path + ".err", "w") as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=e, cwd=ROOT, start_new_session=True)
        timer = threading.Timer(timeout, lambda: os.killpg(p.pid, signal.SIGKILL))
        timer.start()
        _, status, ru = os.wait4(p.pid, 0)
        timer.cancel()
    wall = time.monotonic() - t0
    rc = os.waitstatus_to_exitcode(status)
    p.returncode = rc
    rec = {"name": name, "cmd": shown.strip(), "rc": rc, "wall_s": round(wall, 2), "maxrss_kb": ru.ru_maxrss}
    json.dump(rec, open(path + ".run.json", "w"), indent=1)
    return load(name)

def load(name):
    path = os.path.join(OUT, name)
    rec = json.load(open(path + ".run.json"))
    out = open(path + ".out").read()
    err = open(path + ".err").read()
    kv = {}
    for line in out.splitlines():
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                kv.setdefault(k, v) if k == "request" else kv.__setitem__(k, v)
    rec["kv"] = kv
    rec["requests"] = re.findall(r"request=(\d+) decoded=(\d+) checksum=([0-9a-f]+)", out)
    rec["err"] = err
    rec["e207001"] = "207001" in err
    for f, k in ((".stats.json", "stats"), (".summary.json", "summary")):
        try:
            rec[k] = json.load(open(path + f))
        except (OSError, ValueError):
            rec[k] = None
    st = rec["stats"] or {}
    rec["sim_ns"] = st.get("sim_ns")
    rec["mmu"] = st.get("mmu_faults", 0)
    rt = {k: st.get(k, 0) for k in ("query_giveups", "wait_parks")}
    if any(rt.values()):
        # the simulated figures then depend on how the machine scheduled it
        log("WARNING %s: the simulator answered by real time (%s): its simulated figures may "
            "not reproduce" % (name, ", ".join("%s %d" % kv for kv in rt.items())))
    return rec

def ok(r):
    return r["rc"] == 0

def tier_counters(r):
    s = (r.get("summary") or {}).get("tier") or {}
    return s

U3M = os.path.join(BIN, "u3m")

def synth_args(args):
    """The generator's options in `u3m synth` terms (--preset -> --model,
    --mode lora|full -> --workload lora|adam)."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "--preset":
            out += ["--model", args[i + 1]]; i += 2
        elif a == "--mode":
            out += ["--workload", {"full": "adam"}.get(args[i + 1], args[i + 1])]; i += 2
        else:
            out.append(a); i += 1
    return out

def sizes(args):
    p = subprocess.run([U3M, "synth"] + synth_args(args) + ["--sizes"], capture_output=True, text=True, check=True)
    s = json.loads(p.stdout)
    # requested = what the trace's allocations ask for (its segments)
    s["requested_bytes"] = s["trace"]["reserved_bytes"]
    s["managed_bytes"] = s["trace"]["reserved_bytes"]
    s["config"] = {"seq": s["workload"]["seq"], "batch": s["workload"]["batch"]}
    return s

def gen(name, args):
    path = os.path.join(OUT, name + ".trace")
    subprocess.run([U3M, "synth"] + synth_args(args) + ["-o", path], check=True)
    return path

def per_step(r1, r2, s1, s2, f):
    a, b = f(r1), f(r2)
    if a is None or b is None:
        return None
    return (b - a) / (s2 - s1)

def copy(r, k):
    st = r.get("stats") or {}
    return (st.get("copy_bytes") or {}).get(k)

def tc(r, k):
    return tier_counters(r).get(k)

def fmt_ms(ns):
    return "—" if ns is None else "%.3f" % (ns / 1e6)

def fmt_b(b):
    if b is None:
        return "—"
    for u, d in (("GiB", GIB), ("MiB", MIB)):
        if abs(b) >= d:
            return "%.2f %s" % (b / d, u)
    return "%d B" % b

def status(r):
    if ok(r):
        return "ok"
    return "fails (207001)" if r["e207001"] else "fails (rc %d)" % r["rc"]

def lib_id():
    import hashlib
    try:
        h = hashlib.sha256(open(LIB, "rb").read()).hexdigest()[:12]
        return "libu3m.so sha256 %s (built %s)" % (h, time.strftime("%H:%M UTC", time.gmtime(os.stat(LIB).st_mtime)))
    except OSError:
        return "libu3m.so missing"

def machine():
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit, dirty = "?", ""
    return {"lib": lib_id(), "cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem / GIB, 1), "kernel": platform.release(),
            "commit": commit + ("+local changes" if dirty else ""), "load": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

# ---------------------------------------------------------------- sections
MLP_HBM = 256 * MIB
MLP_STEPS = (2, 4)
REPS = 1 if QUICK else 3  # u3m runs per point: eviction choices depend on real-time event completion

def pair(prefix, steps, cmd_of, env, tier=False, reps=1, timeout=3600):
    """Runs cmd_of(steps) for both step counts, `reps` times each (stops
    repeating a point that fails); returns {"s<n>": [run names]}."""
    res = {}
    for s in steps:
        names = []
        for i in range(reps):
            r = run("%s-s%d%s" % (prefix, s, "-r%d" % i if reps > 1 else ""), cmd_of(s), env, tier=tier, timeout=timeout)
            names.append(r["name"])
            if not ok(r):
                break
        res["s%d" % s] = names
    return res

def sec_train():
    """mlp_train: footprint sweep at a 256 MiB device, real data."""
    xs = [1.5, 2] if QUICK else [1.2, 1.5, 2, 3, 4, 6, 8]
    steps = (1, 2) if QUICK else MLP_STEPS
    base = [os.path.join(APPS, "mlp_train")]
    # hidden 1023: a layer (weights, grads, Adam m and v: 16 MiB) is a fine
    # step of the footprint planner; each 4 MiB tensor takes 2 chunks both on
    # the stock runtime (+32 bytes of pad still fit) and under u3m; no single
    # operator needs more than a few MiB resident
    cases = [("x%g" % x, x, ["--hidden", "1023"], {}) for x in xs]
    if not QUICK:
        # the README demo's model (default planner, widest layers) at 1.5x
        cases.append(("x1.5-wide", 1.5, [], {}))
        # DRAM capped below the spill: NVMe carries the rest
        swap = os.path.join(OUT, "swap")
        os.makedirs(swap, exist_ok=True)
        cases.append(("x2-nvme", 2, ["--hidden", "1023"],
                      {"U3M_DRAM_BYTES": "128M", "U3M_SWAP_DIR": swap, "U3M_SWAP_BYTES": "4G"}))
        # the other eviction order
        for x in (1.5, 4):
            cases.append(("x%g-lru" % x, x, ["--hidden", "1023"], {"U3M_POLICY": "lru"}))
        # widest layers at 3x: one ApplyAdam needs more than the whole device
        cases.append(("x3-wide", 3, [], {}))
    rows = []
    for tag, x, extra, tenv in cases:
        args = ["--footprint", "%dM" % int(x * MLP_HBM / MIB)] + extra
        cmd = lambda s, args=args: base + args + ["--steps", str(s)]
        stock = run("train-%s-stock" % tag, cmd(steps[0]), {"ACLSIM_HBM_BYTES": "256M"})
        u = pair("train-%s-unc" % tag, steps, cmd, {"ACLSIM_HBM_BYTES": "16G"})
        tenv = dict({"ACLSIM_HBM_BYTES": "256M", "U3M_OVERSUB": "%g" % (x + 1)}, **tenv)
        t = pair("train-%s-tier" % tag, steps if tag != "x3-wide" else steps[:1], cmd, tenv, tier=True,
                 reps=REPS if tag != "x3-wide" else 1)
        rows.append({"tag": tag, "x": x, "steps": steps, "stock": stock["name"], "unc": u, "tier": t})
    json.dump(rows, open(os.path.join(OUT, "train.json"), "w"), indent=1)

# the policy arms of the trace sections: key in the results, U3M_POLICY
ARMS = (("tier", "seed-heat"), ("tierlru", "lru"), ("tierpred", "predictive"))

LORA_SHAPE = ["--preset", "llama2-13b", "--layers", "8", "--seq", "1024", "--batch", "2"]

def traces(prefix, args, steps):
    return {s: gen("%s-s%d" % (prefix, s), args + ["--steps", str(s)]) for s in steps}

def sec_lora():
    """13B-shaped (8 layers) LoRA and full-Adam traces at 1.5x HBM, phantom."""
    cfgs = [("lora", ["--mode", "lora"]), ("lora-flash", ["--mode", "lora", "--flash"]),
            ("lora-recompute", ["--mode", "lora", "--recompute"]),
            # 4x the tokens per step: compute grows, the weights beyond HBM do not
            ("lora-flash-recompute-8k", ["--mode", "lora", "--flash", "--recompute", "--seq", "2048", "--batch", "4"]),
            ("full", ["--mode", "full"])]
    if QUICK:
        cfgs = cfgs[:1] + cfgs[3:4]
    steps = (1, 4)
    rows = []
    replay = [os.path.join(APPS, "acl_replay"), "--no-verify"]
    for tag, extra in cfgs:
        args = LORA_SHAPE + extra
        sz = sizes(args)
        F = sz["requested_bytes"]
        H = (int(F / 1.5) + MIB - 1) // MIB * MIB
        hs = "%dM" % (H // MIB)
        tr = traces("lora-%s" % tag, args, steps)
        cmd = lambda s, tr=tr: replay + [tr[s]]
        ph = {"ACLSIM_PRESET": "910b4", "ACLSIM_PHANTOM": "1"}
        stock = run("lora-%s-stock" % tag, cmd(steps[0]), dict(ph, ACLSIM_HBM_BYTES=hs))
        u = pair("lora-%s-unc" % tag, steps, cmd, dict(ph, ACLSIM_HBM_BYTES="1T"))
        tenv = dict(ph, ACLSIM_HBM_BYTES=hs, U3M_OVERSUB="2", U3M_DRAM_BYTES="64G")
        reps = 1 if tag == "full" else REPS  # full: ~2 min a run, and far above the noise
        t = pair("lora-%s-tier" % tag, steps, cmd, dict(tenv, U3M_POLICY="seed-heat"), tier=True, reps=reps)
        tl = pair("lora-%s-tierlru" % tag, steps, cmd, dict(tenv, U3M_POLICY="lru"), tier=True, reps=reps)
        tp = pair("lora-%s-tierpred" % tag, steps, cmd, dict(tenv, U3M_POLICY="predictive"), tier=True, reps=reps)
        tb = pair("lora-%s-tierbig" % tag, steps, cmd, dict(ph, ACLSIM_HBM_BYTES="1T", U3M_DRAM_BYTES="64G"), tier=True)
        rows.append({"tag": tag, "args": args, "sizes": sz, "hbm": H, "steps": steps, "stock": stock["name"],
                     "unc": u, "tier": t, "tierlru": tl, "tierpred": tp, "tierbig": tb})
        for f in tr.values():
            os.unlink(f)  # regenerated by the command in the report
    json.dump(rows, open(os.path.join(OUT, "lora.json"), "w"), indent=1)

RAG_ARGS = ["--heads", "8", "--head-dim", "128", "--prompt", "512", "--decode", "511", "--max-context", "1023"]
RAG_HBM = "512M"
RAG_BUDGET_MS = 50.0  # per decode step (time per output token), simulated
RAG_DECODE = int(RAG_ARGS[RAG_ARGS.index("--decode") + 1])

def sec_rag():
    kv = [os.path.join(APPS, "kv_decode")]
    ph = {"ACLSIM_PHANTOM": "1", "ACLSIM_HBM_BYTES": RAG_HBM}
    # stock capacity: the most requests whose KV fits
    R = 0
    for r in range(1, 129):
        rec = run("rag-stock-r%d" % r, kv + RAG_ARGS + ["--requests", str(r)], ph)
        if not ok(rec):
            break
        R = r
    R21 = int(2.1 * R + 1e-9)
    tenv = dict(ph, U3M_OVERSUB="2", U3M_DRAM_BYTES="16G", U3M_POLICY="seed-heat")
    run("rag-tier-r%d" % R, kv + RAG_ARGS + ["--requests", str(R)], tenv, tier=True)

    def tpot(k):
        r = run("rag-tier-r%d" % k, kv + RAG_ARGS + ["--requests", str(k)], tenv, tier=True)
        return float(r["kv"]["sim_ms"]) / RAG_DECODE if ok(r) else float("inf")
    ks = [R + 1, R21]
    # the most requests within each budget: binary search between R and 2.1 R
    # (time per decode step grows with the request count)
    times = {k: tpot(k) for k in ks}
    for budget in ([] if QUICK else [2 * float(load("rag-stock-r%d" % R)["kv"]["sim_ms"]) / RAG_DECODE, RAG_BUDGET_MS]):
        lo, hi = R, R21 + 1  # lo meets the budget (stock time), hi does not (or is past 2.1 R)
        if times[R21] <= budget:
            continue
        hi = R21
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if mid not in times:
                times[mid] = tpot(mid)
            if times[mid] <= budget:
                lo = mid
            else:
                hi = mid
    ks = sorted(times)
    for k in ([R21] if QUICK else [R + 1, R21]):
        run("rag-tierlru-r%d" % k, kv + RAG_ARGS + ["--requests", str(k)], dict(tenv, U3M_POLICY="lru"), tier=True)
        run("rag-tierpred-r%d" % k, kv + RAG_ARGS + ["--requests", str(k)], dict(tenv, U3M_POLICY="predictive"), tier=True)
    # correctness at 2.1x, real data (a small model: every request's checksum)
    small = ["--heads", "8", "--head-dim", "64", "--prompt", "32", "--decode", "8", "--max-context", "2047"]
    rs = 0
    for r in range(1, 65):
        rec = run("ragv-stock-r%d" % r, kv + small + ["--requests", str(r)], {"ACLSIM_HBM_BYTES": "256M"})
        if not ok(rec):
            break
        rs = r
    k = int(2.1 * rs + 1e-9)
    run("ragv-unc-r%d" % k, kv + small + ["--requests", str(k)], {"ACLSIM_HBM_BYTES": "4G"})
    run("ragv-tier-r%d" % k, kv + small + ["--requests", str(k)],
        {"ACLSIM_HBM_BYTES": "256M", "U3M_OVERSUB": "2.5"}, tier=True)
    json.dump({"R": R, "R21": R21, "ks": ks, "lru": [R21] if QUICK else [R + 1, R21], "small_R": rs, "small_k": k}, open(os.path.join(OUT, "rag.json"), "w"),
              indent=1)

def sec_13b():
    cfgs = [("lora40", ["--mode", "lora", "--seq", "1024", "--batch", "2"], "2", "64G"),
            ("lora40-flash-4k", ["--mode", "lora", "--flash", "--seq", "2048", "--batch", "2"], "2", "64G"),
            ("full10", ["--mode", "full", "--layers", "10", "--seq", "1024", "--batch", "1"], "2.5", "64G")]
    if FULL40:
        cfgs.append(("full40", ["--mode", "full", "--seq", "1024", "--batch", "1"], "7.5", "256G"))
    if QUICK:
        cfgs = cfgs[:1]
    steps = (1, 2)
    replay = [os.path.join(APPS, "acl_replay"), "--no-verify"]
    ph = {"ACLSIM_PRESET": "910b4", "ACLSIM_PHANTOM": "1"}
    rows = []
    for tag, extra, oversub, dram in cfgs:
        args = ["--preset", "llama2-13b"] + extra
        sz = sizes(args)
        tr = traces("b13-%s" % tag, args, steps)
        cmd = lambda s, tr=tr: replay + [tr[s]]
        stock = run("b13-%s-stock" % tag, cmd(steps[0]), ph)
        u = pair("b13-%s-unc" % tag, steps, cmd, dict(ph, ACLSIM_HBM_BYTES="1T"))
        tenv = dict(ph, U3M_OVERSUB=oversub, U3M_DRAM_BYTES=dram, U3M_POLICY="seed-heat")
        t = pair("b13-%s-tier" % tag, steps, cmd, tenv, tier=True, timeout=4 * 3600)
        row = {"tag": tag, "args": args, "sizes": sz, "hbm": 32 * GIB, "steps": steps, "stock": stock["name"],
               "unc": u, "tier": t, "oversub": oversub, "dram": dram}
        if tag == "lora40":
            row["tierpred"] = pair("b13-%s-tierpred" % tag, steps, cmd, dict(tenv, U3M_POLICY="predictive"), tier=True,
                                   timeout=4 * 3600)
            row["tierlru"] = pair("b13-%s-tierlru" % tag, steps, cmd, dict(tenv, U3M_POLICY="lru"), tier=True,
                                  timeout=4 * 3600)
        rows.append(row)
        for f in tr.values():
            os.unlink(f)
    json.dump(rows, open(os.path.join(OUT, "b13.json"), "w"), indent=1)

# ------------------------------------------------------------------ report
def table(head, rows):
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(" --- " for _ in head) + "|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    print()

def steady(runs, steps):
    """runs: {"s<a>": names, "s<b>": names}. Per-step figures from the
    difference between the two step counts (start-up cancels); with several
    repetitions the i-th runs are paired and the median step is reported."""
    s1, s2 = steps
    a = [load(n) for n in runs["s%d" % s1]]
    b = [load(n) for n in runs.get("s%d" % s2, [])]
    res = {"r1": a[0], "r2": b[0] if b else a[0], "ok": bool(b) and all(ok(r) for r in a + b),
           "mmu": max((r["mmu"] or 0) for r in a + b), "all": a + b}
    res["checksums"] = (set(r["kv"].get("checksum") for r in a), set(r["kv"].get("checksum") for r in b))
    if not res["ok"]:
        res["step"] = None
        return res
    st = sorted((y["sim_ns"] - x["sim_ns"]) / (s2 - s1) for x, y in zip(a, b))
    res["step"] = st[len(st) // 2]
    res["spread"] = (st[0], st[-1]) if len(st) > 1 else None
    d = lambda f: per_step(a[0], b[0], s1, s2, f)
    res["h2d"] = d(lambda r: copy(r, "H2D"))
    res["d2h"] = d(lambda r: copy(r, "D2H"))
    res["clean"] = d(lambda r: tc(r, "clean_drops")) if a[0].get("summary") else None
    res["dirty"] = d(lambda r: tc(r, "to_dram") + tc(r, "to_nvme")) if a[0].get("summary") else None
    return res

def fmt_step(r):
    if r["step"] is None:
        return "—"
    t = fmt_ms(r["step"])
    if r.get("spread"):
        t += " (%s–%s)" % (fmt_ms(r["spread"][0]), fmt_ms(r["spread"][1]))
    return t

def pct(x, y):
    return "%+.1f %%" % (100 * (x / y - 1)) if x is not None and y else "—"

def mmu_cell(*rs):
    m = max(r["mmu"] for r in rs)
    return "**%d**" % m if m else "0"

def run_status(r):
    bad = [x for x in r["all"] if not ok(x)]
    return status(bad[0]) if bad else "ok"

def rep_train():
    p = os.path.join(OUT, "train.json")
    if not os.path.exists(p):
        return
    print("### mlp_train footprint sweep (real data, 256 MiB device)\n")
    rows, cmds = [], []
    for c in json.load(open(p)):
        st = load(c["stock"])
        u, t = steady(c["unc"], c["steps"]), steady(c["tier"], c["steps"])
        req = (u["r1"]["stats"] or {}).get("allocs", {}).get("malloc_bytes", 0)
        same = t["ok"] and u["ok"] and all(len(x) == 1 for x in t["checksums"]) and t["checksums"] == u["checksums"]
        extra = lambda k: fmt_b(t[k] - u[k]) if t["step"] is not None else "—"
        nv = tc(t["r2"], "to_nvme") if t["ok"] else None
        rows.append([c["tag"], u["r1"]["kv"].get("layers", "?") + "×" + u["r1"]["kv"].get("hidden", "?"),
                     "%.2f×" % (req / MLP_HBM), status(st), run_status(t), ("yes" if same else "**no**") if t["ok"] else "—",
                     fmt_ms(u["step"]), fmt_step(t), "%.1f×" % (t["step"] / u["step"]) if t["step"] and u["step"] else "—",
                     "%.1f×" % max(1.0, (req - MLP_HBM) / LINK * 1e9 / u["step"]) if u["step"] else "—",
                     extra("h2d"), extra("d2h"), "%.0f" % t["clean"] if t["step"] is not None else "—",
                     "—" if nv is None else nv, mmu_cell(t),
                     "%.0f / %.0f" % (t["r2"]["wall_s"], t["r2"]["maxrss_kb"] / 1024)])
        cmds.append((c["tag"], st["cmd"], u["r2"]["cmd"], t["r2"]["cmd"]))
    table(["case", "layers×hidden", "footprint / HBM", "stock", "u3m tier", "checksum = unconstrained",
           "step, unconstrained (sim ms)", "step, u3m (sim ms, median (min–max))", "slowdown",
           "floor: (F − HBM) / link vs step", "extra H2D / step", "extra D2H / step", "clean drops / step", "chunks to NVMe", "MMU faults",
           "u3m run: wall s / max RSS MiB"], rows)
    print("<details><summary>commands</summary>\n\n```sh")
    for x in cmds:
        print("# %s\n%s" % (x[0], "\n".join(x[1:])))
    print("```\n</details>\n")

def host_per_move(t, u):
    """Real (wall) time of the u3m run beyond the unconstrained run's, per
    chunk fault-in or eviction: what u3m's bookkeeping costs the host. The
    simulated clock does not see it."""
    s = t.get("summary") or {}
    n = (s.get("tier") or {}).get("faults_in", 0) + (s.get("tier") or {}).get("evictions", 0)
    return "%.0f" % ((t["wall_s"] - u["wall_s"]) / n * 1e6) if n and ok(t) else "—"

def rep_lora(fname, title, tiers=False):
    p = os.path.join(OUT, fname)
    if not os.path.exists(p):
        return
    print(title + "\n")
    rows, rows2, cmds = [], [], []
    for c in json.load(open(p)):
        F, H = c["sizes"]["requested_bytes"], c["hbm"]
        st = load(c["stock"])
        u = steady(c["unc"], c["steps"])
        tb = steady(c["tierbig"], c["steps"]) if c.get("tierbig") else None
        # the link-time floor: every byte beyond HBM crosses the link at least
        # once per step (the whole footprint is touched every step)
        floor = (F - H) / LINK * 1e9
        cf = c["sizes"]["config"]
        for key, pol in ARMS:
            if key not in c:
                continue
            t = steady(c[key], c["steps"])
            rows.append([c["tag"], pol, cf["seq"] * cf["batch"], fmt_b(F), "%.2f×" % (F / H), status(st), run_status(t),
                         fmt_ms(u["step"]), fmt_ms(tb["step"]) if tb else "—", fmt_step(t), pct(t["step"], u["step"]),
                         pct(t["r2"]["sim_ns"], u["r2"]["sim_ns"]) if t["ok"] else "—",
                         "%+.1f %%" % (100 * max(0.0, floor / u["step"] - 1)) if u["step"] else "—", mmu_cell(t)])
            rows2.append([c["tag"], pol, fmt_b(t.get("h2d")), fmt_b(t.get("d2h")),
                          "%.0f" % t["dirty"] if t.get("dirty") is not None else "—",
                          "%.0f" % t["clean"] if t.get("clean") is not None else "—", fmt_b(F - H),
                          "%.0f / %.0f" % (t["r2"]["wall_s"], t["r2"]["maxrss_kb"] / 1024),
                          host_per_move(t["r2"], u["r2"]), c["sizes"]["managed_bytes"] // (2 * MIB)])
            if key == "tier":
                trace = u["r2"]["cmd"].split()[-1]
                cmds.append((c["tag"], "u3m synth " + " ".join(synth_args(c["args"])) +
                             " --steps %d -o %s" % (c["steps"][1], trace), st["cmd"], u["r2"]["cmd"], t["r2"]["cmd"]))
            else:
                cmds.append((c["tag"] + ", lru", t["r2"]["cmd"]))
    table(["config", "policy", "tokens / step", "footprint", "footprint / HBM", "stock", "u3m tier",
           "step, unconstrained (sim ms)", "step, u3m with HBM to spare (sim ms)",
           "step, u3m (sim ms, median (min–max))", "u3m vs unconstrained, per step",
           "u3m vs unconstrained, whole run (weight load + most steps)", "floor: (F − HBM) / link vs step",
           "MMU faults"], rows)
    table(["config", "policy", "H2D / step (u3m)", "D2H / step (u3m)", "dirty evictions / step (2 MiB)",
           "clean drops / step (2 MiB)", "F − HBM", "u3m run: wall s / max RSS MiB",
           "host time per chunk moved (µs)", "managed chunks"], rows2)
    if tiers:
        rows3 = []
        for c in json.load(open(p)):
            for key, pol in ARMS:
                if key not in c:
                    continue
                t = steady(c[key], c["steps"])["r2"]
                sm = tier_counters(t)
                if not sm:
                    continue
                rows3.append([c["tag"], pol, c["steps"][1], "%d / %s" % (sm["faults_in"], fmt_b(sm["fault_bytes"])),
                              "%d / %s" % (sm["evictions"], fmt_b(sm["eviction_bytes"])),
                              sm["to_dram"], sm["to_nvme"], sm["from_nvme"], sm["clean_drops"],
                              fmt_b(copy(t, "H2D")), fmt_b(copy(t, "D2H"))])
        print("Per tier, whole run (U3M_SUMMARY; ACLSIM_STATS for the link), weight load included:\n")
        table(["config", "policy", "steps", "fault-ins: chunks / bytes (DRAM or NVMe → HBM)",
               "evictions: chunks / bytes copied out", "copied out to DRAM (chunks)", "to NVMe (chunks)",
               "NVMe → HBM (chunks)", "clean drops (chunks, nothing copied)", "H2D on the link", "D2H on the link"], rows3)
    print("<details><summary>commands</summary>\n\n```sh")
    for x in cmds:
        print("# %s\n%s" % (x[0], "\n".join(x[1:])))
    print("```\n</details>\n")

def rep_rag():
    p = os.path.join(OUT, "rag.json")
    if not os.path.exists(p):
        return
    c = json.load(open(p))
    R, R21 = c["R"], c["R21"]
    print("### kv_decode: requests served at a latency budget (phantom, %s device)\n" % RAG_HBM)
    stock = load("rag-stock-r%d" % R)
    tight = 2 * float(stock["kv"]["sim_ms"]) / RAG_DECODE
    budgets = [tight, RAG_BUDGET_MS]
    rows = []
    def tp(r):
        return float(r["kv"]["sim_ms"]) / RAG_DECODE if ok(r) else None
    def row(label, r):
        t = tp(r)
        served = int(r["kv"].get("requests_served", 0)) if ok(r) else 0
        rows.append([label, r["cmd"].split("--requests ")[1].split()[0], status(r), served,
                     "%.1f" % float(r["kv"]["sim_tokens_per_s"]) if ok(r) else "—",
                     "%.2f" % t if t is not None else "—"] +
                    [("yes" if t <= bud else "no") if t is not None else "—" for bud in budgets] +
                    [fmt_b(tc(r, "fault_bytes")) if r.get("summary") else "—",
                     fmt_b(tc(r, "eviction_bytes")) if r.get("summary") else "—",
                     "**%d**" % r["mmu"] if r["mmu"] else 0])
    row("stock", stock)
    row("stock", load("rag-stock-r%d" % (R + 1)))
    ks = [R] + c["ks"]
    for k in ks:
        row("u3m tier (seed-heat)", load("rag-tier-r%d" % k))
    for k in c.get("lru", []):
        row("u3m tier, U3M_POLICY=lru", load("rag-tierlru-r%d" % k))
    for k in c.get("lru", []):
        if os.path.exists(os.path.join(OUT, "rag-tierpred-r%d.run.json" % k)):
            row("u3m tier, U3M_POLICY=predictive", load("rag-tierpred-r%d" % k))
    table(["runtime", "requests", "status", "served", "sim tokens/s", "sim ms per decode step (TPOT)",
           "within %.2f ms (2 × stock TPOT)" % tight, "within %.0f ms" % RAG_BUDGET_MS, "u3m copy-in",
           "u3m copy-out", "MMU faults"], rows)
    for bud in budgets:
        best = max([k for k in ks if tp(load("rag-tier-r%d" % k)) is not None and tp(load("rag-tier-r%d" % k)) <= bud] or [0])
        r = load("rag-tier-r%d" % best) if best else None
        print("- budget %.2f ms per decode step: stock serves %d requests at %.1f tokens/s; u3m serves %d at %s tokens/s "
              "(2.1 × stock = %d)." % (bud, R, float(stock["kv"]["sim_tokens_per_s"]), best,
                                         "%.1f" % float(r["kv"]["sim_tokens_per_s"]) if r else "—", R21))
    k = c["small_k"]
    u, t = load("ragv-unc-r%d" % k), load("ragv-tier-r%d" % k)
    same = ok(u) and ok(t) and u["requests"] == t["requests"] and len(u["requests"]) == k
    print("\nReal-data check (small model, 256 MiB device): stock fits %d requests; %d requests (2.1×) under u3m: "
          "%s, served %s, per-request checksums %s the unconstrained run's, MMU faults %d.\n" % (
              c["small_R"], k, status(t), t["kv"].get("requests_served", "—"), "equal to" if same else "**differ from**",
              t["mmu"] or 0))
    print("<details><summary>commands</summary>\n\n```sh")
    for n in ["rag-stock-r%d" % R, "rag-stock-r%d" % (R + 1)] + ["rag-tier-r%d" % k for k in ks] + \
            ["rag-tierlru-r%d" % k for k in c.get("lru", [])] + \
            ["ragv-stock-r%d" % c["small_R"], "ragv-stock-r%d" % (c["small_R"] + 1), "ragv-unc-r%d" % k, "ragv-tier-r%d" % k]:
        print(load(n)["cmd"])
    print("```\n</details>\n")

def report():
    mp = os.path.join(OUT, "machine.json")
    m = json.load(open(mp)) if os.path.exists(mp) else machine()
    print("Machine: %s, %d cores, %.1f GiB RAM, Linux %s; commit %s, %s; load average at the start %.1f %.1f %.1f; "
          "started %s.\n" % (m["cpu"], m["cores"], m["ram_gib"], m["kernel"], m["commit"], m["lib"], *m["load"],
                             m["date"]))
    rep_train()
    rep_lora("lora.json", "### 13B-shaped training at 1.5 × HBM, 8 layers (phantom, 910B4 rates)")
    rep_rag()
    rep_lora("b13.json", "### Llama-2-13B-shaped training step on a 32 GiB 910B4 (phantom)", tiers=True)

if not REPORT_ONLY:
    json.dump(machine(), open(os.path.join(OUT, "machine.json"), "w"), indent=1)
    for sec, f in (("train", sec_train), ("lora", sec_lora), ("rag", sec_rag), ("13b", sec_13b)):
        if sec in ONLY:
            f()
report()
PY
