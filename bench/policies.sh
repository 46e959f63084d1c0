#!/usr/bin/env bash
# bench/policies.sh — the policy evaluation of BENCHMARKS.md ("Prediction and
# policies"): `u3m replay` of u3m synth traces and of recorded workload runs,
# every policy side by side with Belady's MIN.
#
#   bench/policies.sh [--out DIR] [--no-build] [--bin DIR]
# Traces, JSON results and the printed tables land in DIR (default
# /tmp/u3m-policies.XXXXXX). --bin DIR: u3m, libu3m.so and acl-apps/ from
# DIR (another build, for before/after) instead of target/release.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=""
BUILD=1
BIN=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --bin) BIN=$(cd "$2" && pwd); BUILD=0; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "policies.sh: unknown argument '$1'" >&2; exit 3 ;;
    esac
done
[ "$BUILD" = 1 ] && (cd "$ROOT" && cargo build --release --workspace >&2)
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/u3m-policies.XXXXXX)
mkdir -p "$OUT"
[ -n "$BIN" ] || BIN="$ROOT/target/release"
U3M="$BIN/u3m"
APPS="$BIN/acl-apps"
echo "policies.sh: results in $OUT" >&2

# name | how the trace is made | HBM as a fraction of the footprint
synth() { "$U3M" synth "$@"; }
synth --model llama2-7b --workload adam --scale 8 --steps 6 -o "$OUT/adam.trace"
synth --model llama2-7b --workload lora --scale 4 --steps 6 -o "$OUT/lora.trace"
synth --model llama3-8b --workload rag --scale 4 --requests 8 --context 2048 --decode-tokens 32 -o "$OUT/rag.trace"
synth --model llama3-8b --workload mixed --scale 8 --steps 3 -o "$OUT/mixed.trace"
# the training workloads' variants (issue 10: every u3m synth workload)
synth --model llama2-7b --workload adam --recompute --scale 8 --steps 6 -o "$OUT/adam_recompute.trace"
synth --model llama2-7b --workload adam --flash --scale 8 --steps 6 -o "$OUT/adam_flash.trace"
synth --model llama2-7b --workload adam --fused-optimizer --scale 8 --steps 6 -o "$OUT/adam_fused.trace"
synth --model llama2-7b --workload lora --recompute --flash --scale 4 --steps 6 -o "$OUT/lora_recompute_flash.trace"
synth --model llama3-8b --workload mixed --train lora --scale 8 --steps 3 -o "$OUT/mixed_lora.trace"
# smaller models: the first step is a larger share of the run
synth --model llama2-7b --workload adam --recompute --scale 8 --layers 4 --steps 6 -o "$OUT/adam_recompute_l4.trace"
synth --model llama2-7b --workload adam --recompute --scale 8 --layers 8 --steps 6 -o "$OUT/adam_recompute_l8.trace"
# full scale: the Llama-2-13B LoRA step (40 layers, seq 1024 x batch 2) at
# 1.68 x HBM, the shape `tiering.sh`'s 32 GiB 910B4 runs (~4 min to replay).
# 4 steps: step 2 pays for what the predictive policy evicted in step 1,
# before any access repeated (`bench/steady.py`); in a 2-step run that is
# half the run (1.256 x Belady's bytes on ebc4bb4, 1.107 in 4 steps; the
# other synth traces run 6)
synth --model llama2-13b --workload lora --seq 1024 --batch 2 --steps 4 -o "$OUT/lora_13b_full.trace"
# recorded runs of the workload programs (observe mode: nothing moves)
rec() {
    local name=$1; shift
    env ACLSIM_HBM_BYTES=16G LD_PRELOAD="$BIN/libu3m.so" U3M_MODE=observe \
        U3M_TRACE="$OUT/$name.trace" "$@" > "$OUT/$name.rec.out"
}
rec mlp_train "$APPS/mlp_train" --footprint 384M --hidden 1023 --steps 6
rec mlp_train_128m "$APPS/mlp_train" --footprint 128M --hidden 1023 --steps 6
rec kv_decode "$APPS/kv_decode" --requests 12 --max-context 2047 --decode 16
# the other recorded programs that move bytes at 1.5 x (soak_app is left
# out: it runs for a time, not a count, so its trace is not reproducible)
rec optest_llm "$APPS/optest_llm" wide_launch 24 0
rec oversize_app "$APPS/oversize_app"

exec python3 - "$U3M" "$OUT" <<'PY'
import json, subprocess, sys, os
U3M, OUT = sys.argv[1], sys.argv[2]
# trace, HBM / footprint, extra replay options
CASES = [("adam", 1 / 1.5, []), ("lora", 1 / 1.5, []), ("rag", 1 / 2.1, []), ("mixed", 1 / 1.5, []),
         ("adam_recompute", 1 / 1.5, []), ("adam_flash", 1 / 1.5, []), ("adam_fused", 1 / 1.5, []),
         ("lora_recompute_flash", 1 / 1.5, []), ("mixed_lora", 1 / 1.5, []),
         ("adam_recompute_l4", 1 / 1.5, []), ("adam_recompute_l8", 1 / 1.5, []),
         ("lora_13b_full", 1 / 1.68, []),
         ("mlp_train", 1 / 1.5, ["--pageable"]), ("mlp_train_128m", 1 / 1.5, ["--pageable"]),
         ("kv_decode", 1 / 2.1, []),
         ("optest_llm", 1 / 1.5, ["--pageable"]), ("oversize_app", 1 / 1.5, ["--pageable"])]
MIB = 1 << 20
def fmt_b(b):
    return "%.2f GiB" % (b / (1 << 30)) if b >= 1 << 30 else "%.0f MiB" % (b / MIB)
rows, acc, proof = [], [], []
for name, frac, extra in CASES:
    tr = os.path.join(OUT, name + ".trace")
    probe = json.loads(subprocess.run([U3M, "replay", tr, "--hbm", "1T", "--policy", "lru", "--json"] + extra,
                                      capture_output=True, text=True, check=True).stdout)
    foot = probe["traces"][0]["footprint_bytes"]
    hbm = max(8 * MIB, int(foot * frac) // (2 * MIB) * (2 * MIB))
    cmd = [U3M, "replay", tr, "--hbm", str(hbm), "--json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print("%s: u3m replay failed: %s" % (name, p.stderr.strip()), file=sys.stderr)
        continue
    d = json.loads(p.stdout)
    json.dump(d, open(os.path.join(OUT, name + ".json"), "w"), indent=1)
    t = d["traces"][0]
    base = t["baseline_ns"]
    for pol in t["policies"]:
        if pol.get("error"):
            continue
        rows.append([name, fmt_b(foot), "%.2f×" % (foot / hbm), pol["policy"], fmt_b(pol["fault_in_bytes"]["total"]),
                     fmt_b(pol["writeback_bytes"]["total"]), "%d" % pol["clean_drops"],
                     "%.2f" % pol["moved_vs_belady"] if pol.get("moved_vs_belady") is not None else "—",
                     "%.2f×" % (pol["total_ns"] / base)])
        if pol["policy"] == "predictive" and pol.get("moved_vs_belady") is not None:
            r = pol["moved_vs_belady"]
            proof.append([name, "%.3f" % r, "yes" if r <= 1.15 else "**no**"])
        pr = pol["prediction"]
        acc.append([name, pol["policy"]] + ["%s / %s" % ("—" if x["precision"] is None else "%.2f" % x["precision"],
                                                       "—" if x["recall"] is None else "%.2f" % x["recall"]) for x in pr])
    print("%s: %s" % (name, " ".join(cmd[1:])), file=sys.stderr)
def table(h, rs):
    print("| " + " | ".join(h) + " |")
    print("|" + "---|" * len(h))
    for r in rs:
        print("| " + " | ".join(str(c) for c in r) + " |")
    print()
table(["trace", "footprint", "footprint / HBM", "policy", "copied in", "written back", "clean drops",
       "bytes moved / belady", "sim time / unlimited HBM"], rows)
table(["trace", "policy", "P / R, W=16", "P / R, W=64", "P / R, W=256"], acc)
# issue 10's proof: predictive's bytes moved within 1.15 x Belady's
table(["trace", "predictive bytes moved / belady", "<= 1.15?"], proof)
PY
