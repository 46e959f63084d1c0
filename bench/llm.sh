#!/usr/bin/env bash
# bench/llm.sh — the LLM benchmark of BENCHMARKS.md ("## LLM under torch_npu"):
# a Llama (transformers, tests/torch/llm.py) trained and decoding through the
# real torch_npu on the simulated runtime, unconstrained and under libu3m.so
# in tier mode with HBM at footprint / 1.5 and / 2, against the link floor.
# Every time is simulated device time (torch.npu.Event on the simulator).
#
#   bench/llm.sh                  the default model (hidden 256, 4 layers, vocab 2048, seq 64)
#   bench/llm.sh --model ARGS     other llm.py size arguments, e.g. "--hidden 64"
#   bench/llm.sh --out DIR        raw results there (default /tmp/u3m-llm.XXXXXX)
#   bench/llm.sh --no-build       skip cargo build --release --workspace
#   bench/llm.sh --u3m-env K=V    set K=V in the u3m runs (repeatable), e.g.
#                                 U3M_TORCH_HINTS=on (torch_npu's freed blocks as discard hints)
#
# Needs the torch venv (ci/install-torch.sh). Runs with TASK_QUEUE_ENABLE=0,
# and each u3m point (and the unconstrained run) once more with torch_npu's
# task queue (launches on the queue thread).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=""
BUILD=1
MODEL="--hidden 256 --layers 4 --vocab 2048 --seq 64"
U3M_ENV=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --u3m-env) U3M_ENV="$U3M_ENV $2"; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "llm.sh: unknown argument '$1' (--help)" >&2; exit 3 ;;
    esac
done
if [ "$BUILD" = 1 ]; then (cd "$ROOT" && cargo build --release --workspace >&2); fi
PY=$(bash "$ROOT/ci/install-torch.sh")
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/u3m-llm.XXXXXX)
mkdir -p "$OUT"
echo "llm.sh: raw results in $OUT" >&2

exec python3 - "$ROOT" "$OUT" "$PY" "$MODEL" "$U3M_ENV" <<'PY'
import json, os, platform, re, shlex, statistics, subprocess, sys, time

ROOT, OUT, PY, MODEL, U3M_ENV = sys.argv[1:6]
T = os.path.join(ROOT, "target", "release")
LINK = 25e9          # bytes/s, the simulator's host<->device link (ACLSIM_LINK_GBPS default)
ARGS = ["--models", "llama", "--devices", "npu", "--runs", "f32", "--caches", "dynamic", "--steps", "6",
        "--timing"] + shlex.split(MODEL)


def run(name, hbm=None, u3m=False, task_queue=False, expect_oom=False):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACLSIM_", "U3M_", "ASCEND_", "PYTORCH_NPU")) and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    home = os.path.join(T, "cann")
    env.update(ASCEND_HOME_PATH=home, ASCEND_TOOLKIT_HOME=home, ASCEND_OPP_PATH=os.path.join(home, "opp"),
               LD_LIBRARY_PATH=os.path.join(home, "lib64"), PYTHONDONTWRITEBYTECODE="1",
               ACLSIM_STATS=os.path.join(OUT, name + ".stats.json"))
    pre = [os.path.join(T, "torch_harness_preload.so")]
    if hbm:
        env["ACLSIM_HBM_BYTES"] = str(hbm)
    if not task_queue:
        env["TASK_QUEUE_ENABLE"] = "0"
    if u3m:
        pre.append(os.path.join(T, "libu3m.so"))
        shm = os.path.join(OUT, name + ".shm")
        os.makedirs(shm, exist_ok=True)
        env.update(U3M_MODE="tier", U3M_OVERSUB="3", U3M_SHM_DIR=shm,
                   U3M_SUMMARY=os.path.join(OUT, name + ".summary.json"))
        env.update(kv.split("=", 1) for kv in U3M_ENV.split())
    env["LD_PRELOAD"] = " ".join(pre)
    cmd = [PY, os.path.join(ROOT, "tests/torch/llm.py")] + ARGS + (["--expect-oom"] if expect_oom else [])
    with open(os.path.join(OUT, name + ".cmd"), "w") as f:
        f.write(" ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()) if k.startswith(
            ("ACLSIM_", "U3M_", "TASK_", "LD_PRELOAD"))) + " " + " ".join(map(shlex.quote, cmd)) + "\n")
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300 if task_queue and u3m else 900)
        code, stdout, stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:   # torch_npu can hang after a failed launch
        code = "hang"
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    wall = time.time() - t0
    open(os.path.join(OUT, name + ".out"), "w").write(stdout)
    open(os.path.join(OUT, name + ".err"), "w").write(stderr)
    r = {"name": name, "code": code, "wall": wall, "stdout": stdout, "hbm": hbm}
    # the first failed operator torch_npu names
    m = re.search(r"call (aclnn\w+) failed, error code is (\d+)", stderr)
    r["failure"] = f"{m.group(1)}: {m.group(2)}" if m else ("hangs" if code == "hang" else f"exit {code}")
    for fn, key in ((".stats.json", "stats"), (".summary.json", "summary")):
        try:
            r[key] = json.load(open(os.path.join(OUT, name + fn)))
        except (OSError, ValueError):
            r[key] = None
    vals, lines = {}, []   # every key=value of the output; each line as a dict
    for line in stdout.splitlines():
        d = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        lines.append(d)
        for k, v in d.items():
            vals.setdefault(k, []).append(v)
    r["vals"] = vals
    r["results"] = [l for l in stdout.splitlines() if ("loss=" in l or "tokens=" in l)]
    r["step_ms"] = [float(d["step_sim_ms"]) for d in lines if "step_sim_ms" in d]
    r["decode_ms"] = {d["when"]: float(d["decode_sim_ms"]) for d in lines if "decode_sim_ms" in d}
    print(f"llm.sh: {name}: exit {code} in {wall:.0f} s", file=sys.stderr)
    return r


base = run("unconstrained")
assert base["code"] == 0, base["stdout"]
queue = run("unconstrained-task-queue", task_queue=True)
F = base["stats"]["devices"][0]["peak_bytes"]
w_train = int(base["vals"]["train_mem_peak"][0])
w_decode = int(base["vals"]["decode_mem_peak"][0])
rows = []
for ratio in (1.5, 2.0):
    hbm = int(F / ratio)
    stock = run(f"stock-{ratio}x", hbm=hbm, expect_oom=True)
    tier = run(f"u3m-{ratio}x", hbm=hbm, u3m=True)
    tq = run(f"u3m-{ratio}x-task-queue", hbm=hbm, u3m=True, task_queue=True)
    rows.append((ratio, hbm, stock, tier, tq))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


step0 = med(base["step_ms"][1:])          # step 0 allocates the optimizer state
dec0 = base["decode_ms"]["trained"]       # the trained model's 16 tokens
dec0_init = base["decode_ms"]["init"]     # the same from the initial weights (before any training)
mib = lambda b: f"{b / 2**20:.1f} MiB"   # noqa: E731
print(f"\n### Llama `{MODEL}` — footprint {mib(F)} (torch_npu's caching-allocator blocks), "
      f"live tensors at the step's peak {mib(w_train)} (training), {mib(w_decode)} (decoding)\n")
print(f"Unconstrained (32 GiB): training step {step0:.3f} ms (median of steps 1-5), 16 decoded tokens "
      f"{dec0:.3f} ms ({dec0_init:.3f} ms from the initial weights); with torch_npu's task queue: "
      f"{med(queue['step_ms'][1:]):.3f} / {queue['decode_ms'].get('trained', float('nan')):.3f} ms.\n")
print("| HBM | footprint / HBM | stock | u3m tier (TASK_QUEUE_ENABLE=0) | losses, tokens = unconstrained | "
      "decode before training (sim ms) | step (sim ms) | step / unconstrained | step floor (sim ms) | step / floor | "
      "decode 16 tokens (sim ms) | decode / unconstrained | decode floor (sim ms) | decode / floor | "
      "evictions (bytes) | faults-in (bytes) | H2D + D2H copied | u3m with the task queue |")
print("| --- " * 18 + "|")
for ratio, hbm, stock, tier, tq in rows:
    ooms = sum(1 for v in stock["vals"].get("oom", []) if v == "1")
    st = "fails: NPU out of memory" if ooms else f"exit {stock['code']}"
    same = tier["results"] == base["results"]
    ok = tier["code"] == 0
    step = med(tier["step_ms"][1:]) if ok else float("nan")
    dec = tier["decode_ms"].get("trained", float("nan"))
    dec_init = tier["decode_ms"].get("init", float("nan"))
    num = lambda v, f="{:.3f}": f.format(v) if v == v else "—"   # noqa: E731
    # the link floor (design.md §5): bytes beyond HBM that a step must move —
    # at most its live tensors; a training step writes them (twice across the
    # link), a decoding step reads weights and cache once per token
    f_step = max(step0, 2 * max(0, w_train - hbm) / LINK * 1e3)
    f_dec = max(dec0, 16 * max(0, w_decode - hbm) / LINK * 1e3)
    s = tier.get("summary") or {}
    t = s.get("tier", {})
    cp = (tier.get("stats") or {}).get("copy_bytes", {})
    copied = sum(v for k, v in cp.items() if k in ("H2D", "D2H")) if isinstance(cp, dict) else 0
    tq_s = "ok" if tq["code"] == 0 else "fails (" + tq["failure"] + ")"
    same_s = "yes" if same else ("—" if not ok else "NO")
    print(f"| {mib(hbm)} | {ratio}× | {st} | {'ok' if ok else 'fails (' + tier['failure'] + ')'} | {same_s} | "
          f"{num(dec_init)} | {num(step)} | {num(step / step0, '{:.2f}×')} | {f_step:.3f} | "
          f"{num(step / f_step, '{:.2f}×')} | {num(dec)} | {num(dec / dec0, '{:.2f}×')} | {f_dec:.3f} | "
          f"{num(dec / f_dec, '{:.2f}×')} | {t.get('evictions', 0)} ({mib(t.get('eviction_bytes', 0))}) | "
          f"{t.get('faults_in', 0)} ({mib(t.get('fault_bytes', 0))}) | {mib(copied)} | {tq_s} |")
print(f"\nMachine: {platform.node()}, {os.cpu_count()} cores, {platform.platform()}; link {LINK / 1e9:.0f} GB/s "
      f"(simulated); raw results in {OUT}")
PY
