#!/usr/bin/env bash
# bench/replay_vs_lib.sh — `u3m replay` against libu3m.so on the simulator,
# same trace, same HBM, same policy (issue 10 part 5): the replayer's step
# time and bytes must predict the library's.
#
#   bench/replay_vs_lib.sh [--model M] [--layers N] [--seq S] [--batch B]
#       [--workload lora|adam] [--steps A,B] [--ratio R] [--policy P]
#       [--trace FILE] [--hbm SIZE] [--out DIR] [--no-build] [--link-model shared|per-stream]
#       [--replay-args "ARGS"]   (default "--event-model device --call-us 0 --issue acl-replay") [--reps R]
#       [--synth-args "ARGS"]    (more `u3m synth` options, e.g. --fused-optimizer)
# U3M_BIN=DIR: u3m, libu3m.so and acl-apps/ from DIR (another build: before/after)
#   instead of target/release.
# --reps R: library runs per trace (default 3); the median (by step) is
#   compared, min-max shown. On the simulator the library is deterministic
#   (same command, same simulated time and bytes, whatever the machine's load:
#   event queries answer by the simulated clock, the link is taken in the
#   order the work was issued, background rounds run on the simulated host
#   clock), so min = max unless something regressed. The replay is
#   deterministic too: one run.
#
# Library side: acl_replay --no-verify TRACE under libu3m.so (U3M_MODE=tier,
#   U3M_POLICY=P, U3M_OVERSUB=64, U3M_DRAM_BYTES=64G), phantom, preset 910b4,
#   ACLSIM_HBM_BYTES = footprint / R (as bench/engine_v2.sh), the simulator's
#   link model ACLSIM_LINK_MODEL (default shared).
# Replay side: u3m replay TRACE --hbm SAME --policy P --json --link-model SAME
#   ARGS (--event-model device: an event is complete once the host's
#   simulated clock has passed it, as the simulator answers a query;
#   --call-us 0: the simulator's host clock spends nothing per asynchronous
#   call; --issue acl-replay: the trace issued as acl_replay issues it, every
#   call asynchronous on its stream, event waits between streams for
#   conflicting accesses, the host waiting only at frees, re-used D2H host
#   buffers and every 1024 events).
# Per step = (B-step run - A-step run) / (B - A) on `u3m synth` traces
#   (default 1,2); with --trace, the whole run of that one trace.
# Prints the library's simulated step, the replay's, H2D and D2H bytes of
# both, and replay / library ratios. Times are simulated.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=llama2-13b LAYERS=2 SEQ=512 BATCH=1 WORKLOAD=lora STEPS="1,2" RATIO=1.5 POLICY=predictive
TRACE="" HBM="" OUT="" BUILD=1 LINK_MODEL=shared REPLAY_ARGS="--event-model device --call-us 0 --issue acl-replay" REPS=3 SYNTH_ARGS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --model) MODEL=$2; shift 2 ;;
        --layers) LAYERS=$2; shift 2 ;;
        --seq) SEQ=$2; shift 2 ;;
        --batch) BATCH=$2; shift 2 ;;
        --workload) WORKLOAD=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --ratio) RATIO=$2; shift 2 ;;
        --policy) POLICY=$2; shift 2 ;;
        --trace) TRACE=$(realpath "$2"); shift 2 ;;
        --hbm) HBM=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --link-model) LINK_MODEL=$2; shift 2 ;;
        --replay-args) REPLAY_ARGS=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --synth-args) SYNTH_ARGS=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "replay_vs_lib.sh: unknown argument '$1' (--help)" >&2; exit 3 ;;
    esac
done
[ "$BUILD" = 1 ] && (cd "$ROOT" && cargo build --release --workspace >&2)
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/u3m-replay-vs-lib.XXXXXX)
mkdir -p "$OUT"
echo "replay_vs_lib.sh: raw results in $OUT" >&2

exec python3 - "$ROOT" "$OUT" "$MODEL" "$LAYERS" "$SEQ" "$BATCH" "$WORKLOAD" "$STEPS" "$RATIO" "$POLICY" \
    "$TRACE" "$HBM" "$LINK_MODEL" "$REPLAY_ARGS" "$REPS" "$SYNTH_ARGS" <<'PY'
import json, os, subprocess, sys, time

ROOT, OUT, MODEL, LAYERS, SEQ, BATCH, WORKLOAD, STEPS, RATIO, POLICY, TRACE, HBM, LINK_MODEL = sys.argv[1:14]
EXTRA = sys.argv[14].split()
REPS = max(1, int(sys.argv[15]))
SYNTH_EXTRA = sys.argv[16].split()
REL = os.environ.get("U3M_BIN") or os.path.join(ROOT, "target", "release")
U3M, LIB, APP = os.path.join(REL, "u3m"), os.path.join(REL, "libu3m.so"), os.path.join(REL, "acl-apps", "acl_replay")
MIB, GIB = 1 << 20, 1 << 30

def log(m):
    print("replay_vs_lib: " + m, file=sys.stderr, flush=True)

def parse_size(s):
    m = {"K": 1 << 10, "M": MIB, "G": GIB, "T": 1 << 40}
    s = s.strip().upper().rstrip("B").rstrip("I")
    return int(float(s[:-1]) * m[s[-1]]) if s[-1] in m else int(s)

def lib_run(name, trace, hbm):
    e = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    e.update(ACLSIM_PRESET="910b4", ACLSIM_PHANTOM="1", ACLSIM_HBM_BYTES=str(hbm), ACLSIM_LINK_MODEL=LINK_MODEL,
             ACLSIM_STATS=os.path.join(OUT, name + ".stats.json"), LD_PRELOAD=LIB, U3M_MODE="tier",
             U3M_POLICY=POLICY, U3M_OVERSUB="64", U3M_DRAM_BYTES="64G",
             U3M_SUMMARY=os.path.join(OUT, name + ".summary.json"))
    t0 = time.monotonic()
    with open(os.path.join(OUT, name + ".err"), "w") as fe:
        p = subprocess.run([APP, "--no-verify", trace], env=e, stdout=subprocess.DEVNULL, stderr=fe, cwd=ROOT)
    if p.returncode != 0:
        log("%s failed (rc %d)" % (name, p.returncode))
        sys.exit(1)
    st = json.load(open(os.path.join(OUT, name + ".stats.json")))
    cb = st.get("copy_bytes") or {}
    dev = (st.get("devices") or [{}])[0]
    return {"ns": st["sim_ns"], "h2d": cb.get("H2D", 0), "d2h": cb.get("D2H", 0),
            "busy_in": dev.get("link_h2d_busy_ns", 0), "busy_out": dev.get("link_d2h_busy_ns", 0),
            "wall": time.monotonic() - t0}

def replay_run(name, trace, hbm):
    t0 = time.monotonic()
    p = subprocess.run([U3M, "replay", trace, "--hbm", str(hbm), "--policy", POLICY, "--json",
                        "--link-model", LINK_MODEL] + EXTRA,
                       capture_output=True, text=True, cwd=ROOT)
    open(os.path.join(OUT, name + ".json"), "w").write(p.stdout)
    if p.returncode != 0:
        log("%s failed (rc %d): %s" % (name, p.returncode, p.stderr[-400:]))
        sys.exit(1)
    j = json.loads(p.stdout)
    pol = [x for x in j["traces"][0]["policies"] if x["policy"] == POLICY][0]
    rt = pol["runtime"]
    # the simulator counts the program's copies and the Tier's alike
    return {"ns": pol["total_ns"], "h2d": rt["h2d_bytes"] + rt["program_h2d_bytes"],
            "d2h": rt["d2h_bytes"] + rt["program_d2h_bytes"],
            "busy_in": rt.get("link_h2d_busy_ns", 0), "busy_out": rt.get("link_d2h_busy_ns", 0),
            "wall": time.monotonic() - t0}

def fmt_b(b):
    return "%.2f GiB" % (b / GIB) if abs(b) >= GIB else "%.1f MiB" % (b / MIB)

if TRACE:
    runs = [(0, TRACE)]
    if not HBM:
        log("--trace needs --hbm")
        sys.exit(3)
    hbm = parse_size(HBM)
    what = "%s (whole run)" % os.path.basename(TRACE)
else:
    shape = ["--model", MODEL, "--layers", LAYERS, "--seq", SEQ, "--batch", BATCH, "--workload", WORKLOAD] + SYNTH_EXTRA
    sz = json.loads(subprocess.run([U3M, "synth"] + shape + ["--sizes"], capture_output=True, text=True,
                                   check=True).stdout)
    F = sz["trace"]["reserved_bytes"]
    hbm = parse_size(HBM) if HBM else (int(F / float(RATIO)) + MIB - 1) // MIB * MIB
    S = [int(x) for x in STEPS.split(",")]
    runs = []
    for s in S:
        tr = os.path.join(OUT, "trace-s%d" % s)
        subprocess.run([U3M, "synth"] + shape + ["--steps", str(s), "-o", tr], check=True)
        runs.append((s, tr))
    what = "%s %s, %s layers, seq %s x batch %s, footprint %s, per step from %s-step runs" % (
        MODEL, WORKLOAD, LAYERS, SEQ, BATCH, fmt_b(F), " and ".join(map(str, S)))
res = {}
for s, tr in runs:
    for k in range(REPS):
        log("library, %d steps, run %d" % (s, k + 1))
        res[("lib%d" % k, s)] = lib_run("lib-s%d-r%d" % (s, k), tr, hbm)
    log("replay, %d steps" % s)
    res[("rep", s)] = replay_run("rep-s%d" % s, tr, hbm)
arms = ["lib%d" % k for k in range(REPS)] + ["rep"]
last = runs[-1][0]
tables = [("whole %d-step run" % last if last else "whole run", {arm: res[(arm, last)] for arm in arms})]
if len(runs) == 2:
    (a, _), (b, _) = runs
    tables.append(("per step: (%d-step run - %d-step run) / %d, library runs paired in order" % (b, a, b - a),
                   {arm: {k: (res[(arm, b)][k] - res[(arm, a)][k]) / (b - a) for k in res[(arm, b)]} for arm in arms}))
print("# replay_vs_lib.sh, commit %s, %s, load %s" % (
    subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), " ".join("%.1f" % x for x in os.getloadavg())))
print("%s; HBM %s; policy %s; link model %s; replay %s; library runs %d" % (
    what, fmt_b(hbm), POLICY, LINK_MODEL, " ".join(EXTRA), REPS))
rows = [("time (simulated ms)", "ns", 1e-6), ("H2D bytes (GiB)", "h2d", 1 / GIB), ("D2H bytes (GiB)", "d2h", 1 / GIB),
        ("link H2D busy (sim ms)", "busy_in", 1e-6), ("link D2H busy (sim ms)", "busy_out", 1e-6)]
for title, v in tables:
    libs = sorted((v["lib%d" % k] for k in range(REPS)), key=lambda x: x["ns"])
    med = libs[len(libs) // 2]
    print("\n## %s" % title)
    print("%-26s %14s %21s %12s %8s" % ("", "library median", "library min-max", "replay", "ratio"))
    worst = 0.0
    for label, k, sc in rows:
        l, r = med[k] * sc, v["rep"][k] * sc
        lo, hi = min(x[k] for x in libs) * sc, max(x[k] for x in libs) * sc
        ratio = r / l if l else float("nan")
        if k in ("ns", "h2d", "d2h") and l:
            worst = max(worst, abs(ratio - 1))
        print("%-26s %14.3f %10.3f-%-10.3f %12.3f %8.3f" % (label, l, lo, hi, r, ratio))
    print("largest time/bytes deviation from the library's median run: %.1f %%" % (100 * worst))
print("\nwall s: library %s, replay %s" % (" ".join("%.1f" % res[("lib0", s)]["wall"] for s, _ in runs),
                                        " ".join("%.1f" % res[("rep", s)]["wall"] for s, _ in runs)))
PY
