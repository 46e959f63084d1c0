#!/usr/bin/env bash
# bench/read_once.sh — BENCHMARKS.md "The read-once probe" (issue 11
# bullet 2): read-once streams copied (U3M_HOST_MAP=auto), mapped when the
# device times it faster (probe) or always (stream), on
#   rag      decode over a 7B-shaped 8-layer model at 2 x HBM: u3m replay and
#            acl_replay under libu3m.so (phantom), per decode step =
#            (128-token run - 64-token run) / 64
#   lora     the 13B-shaped LoRA step at 1.5 x HBM (u3m replay), per step =
#            (112-step run - 16-step run) / 96
#   kv       kv_decode, 25 requests on 512 MiB under libu3m.so (phantom)
#   small    serving over weights 2 x HBM with real data on 32 MiB
#            (acl_replay, the tests/hostmap_stream.rs probe case)
# All times are simulated (910B4 preset, 25 GB/s link shared per direction).
#
#   bench/read_once.sh [--only rag,lora,kv,small] [--reps R] [--no-build]
# --reps R: runs under libu3m.so per arm (default 3; the background thread
#   runs on the host's clock, so those runs vary by ~1-3 %); replay is
#   deterministic and runs once.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ONLY="rag,lora,kv,small" REPS=3 BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --only) ONLY=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "read_once.sh: unknown argument '$1' (--help)" >&2; exit 3 ;;
    esac
done
[ "$BUILD" = 1 ] && (cd "$ROOT" && cargo build --release --workspace >&2)
OUT=$(mktemp -d /tmp/u3m-read-once.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
# a private copy of the build: other builds may rewrite target/release
cp -a "$ROOT"/target/release/*.so "$ROOT/target/release/acl-apps" "$ROOT/target/release/u3m" "$OUT/"
B=$OUT U3M=$OUT/u3m
has() { [[ ",$ONLY," == *",$1,"* ]]; }
echo "read_once.sh: $(git -C "$ROOT" rev-parse --short HEAD), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

# u3m replay: one JSON row -> "total_ns h2d d2h mapped_read maps verdicts for_map"
replay() {
    "$U3M" replay "$1" --hbm "$2" --policy predictive --host-map "$3" --json | python3 -c '
import json, sys
p = json.load(sys.stdin)["traces"][0]["policies"][0]
r, h = p["runtime"], p["host_map"]
print(p["total_ns"], r["h2d_bytes"], r["d2h_bytes"], r["host_mapped_read_bytes"], h["stream_maps"], h["probe_verdicts"], h["probe_maps"])'
}
# per-step figures from two replays of S1 and S2 steps
per_step() {  # name trace1 trace2 steps hbm
    local name=$1 t1=$2 t2=$3 n=$4 hbm=$5
    for m in auto probe stream; do
        a=$(replay "$t1" "$hbm" $m) b=$(replay "$t2" "$hbm" $m)
        python3 - "$name" "$m" "$n" "$a" "$b" <<'PY'
import sys
name, m, n, a, b = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4].split(), sys.argv[5].split()
a, b = [int(x) for x in a], [int(x) for x in b]
d = [(y - x) / n for x, y in zip(a, b)]
G = 1 << 30
print(f"| {name} | u3m replay | {m} | {d[0]/1e6:.2f} | {d[1]/G:.2f} | {d[2]/G:.2f} | {d[3]/G:.2f} | {b[4]} | {b[6]} of {b[5]} |")
PY
    done
}
# acl_replay under libu3m.so: "sim_ns stream_maps verdicts for_map"
lib() {  # trace hbm oversub mode [--no-verify]
    local s="$OUT/sum.json"
    out=$(ACLSIM_PRESET=910b4 ACLSIM_PHANTOM=${PHANTOM:-1} ACLSIM_HBM_BYTES=$2 LD_PRELOAD=$B/libu3m.so \
        U3M_MODE=tier U3M_OVERSUB=$3 U3M_DRAM_BYTES=64G U3M_HOST_MAP=$4 U3M_SUMMARY=$s \
        "$B/acl-apps/acl_replay" ${5:-} "$1" 2>/dev/null)
    python3 - "$s" "$out" <<'PY'
import json, re, sys
t = json.load(open(sys.argv[1]))["tier"]
ns = re.search(r"sim_ns=(\d+)", sys.argv[2]).group(1)
ck = re.search(r"checksum=(\w+)", sys.argv[2])
print(ns, t["stream_maps"], t["probe_verdicts"], t["probe_maps"], ck.group(1) if ck else "-")
PY
}
echo "| workload | runner | U3M_HOST_MAP | per step (sim ms) | H2D GiB/step | D2H GiB/step | read in place GiB/step | chunks mapped (run) | verdicts for mapping |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
if has rag; then
    for T in 64 128; do
        "$U3M" synth --model llama2-7b --workload rag --layers 8 --requests 8 --context 1024 \
            --decode-tokens $T -o "$OUT/rag$T.trace" 2>/dev/null
    done
    per_step "rag 2x" "$OUT/rag64.trace" "$OUT/rag128.trace" 64 2458M
    for m in auto probe stream; do
        steps=() maps="" verd=""
        for r in $(seq "$REPS"); do
            read -r a _ <<<"$(lib "$OUT/rag64.trace" 2458M 4 $m --no-verify)"
            read -r b sm v pm _ <<<"$(lib "$OUT/rag128.trace" 2458M 4 $m --no-verify)"
            steps+=("$(python3 -c "print(f'{($b - $a) / 64 / 1e6:.2f}')")") maps+="$sm " verd+="$pm/$v "
        done
        echo "| rag 2x | libu3m.so ($REPS runs) | $m | ${steps[*]} | | | | $maps | $verd |"
    done
fi
if has lora; then
    for S in 16 112; do
        "$U3M" synth --model llama2-13b --layers 8 --seq 1024 --batch 2 --workload lora \
            --steps $S -o "$OUT/lora$S.trace" 2>/dev/null
    done
    per_step "LoRA 13B 1.5x" "$OUT/lora16.trace" "$OUT/lora112.trace" 96 7939M
fi
if has kv; then
    for m in auto probe stream; do
        tps=() verd=""
        for r in $(seq "$REPS"); do
            o=$(ACLSIM_PHANTOM=1 ACLSIM_HBM_BYTES=512M LD_PRELOAD=$B/libu3m.so U3M_MODE=tier U3M_OVERSUB=2 \
                U3M_DRAM_BYTES=16G U3M_HOST_MAP=$m U3M_SUMMARY="$OUT/kv.json" "$B/acl-apps/kv_decode" \
                --heads 8 --head-dim 128 --prompt 512 --decode 511 --max-context 1023 --requests 25 2>/dev/null)
            tps+=("$(grep -o 'sim_tokens_per_s=[0-9.]*' <<<"$o" | cut -d= -f2)")
            verd+="$(python3 -c "import json; t=json.load(open('$OUT/kv.json'))['tier']; print(f\"{t['probe_maps']}/{t['probe_verdicts']}\")") "
        done
        echo "| kv_decode 25 req | libu3m.so ($REPS runs) | $m | tokens/s: ${tps[*]} | | | | | $verd |"
    done
fi
if has small; then
    "$U3M" synth --model llama2-7b --workload rag --scale 8 --layers 8 --requests 2 --context 64 \
        --decode-tokens 160 -o "$OUT/small.trace" 2>/dev/null
    ref=$(ACLSIM_HBM_BYTES=1G "$B/acl-apps/acl_replay" "$OUT/small.trace" | grep -o 'checksum=\w*' | cut -d= -f2)
    for m in auto probe stream; do
        read -r ns sm v pm ck <<<"$(PHANTOM=0 lib "$OUT/small.trace" 32M 8 $m)"
        same=$([ "$ck" = "$ref" ] && echo "checksum = unconstrained" || echo "CHECKSUM DIFFERS")
        echo "| small, real data, 32 MiB | libu3m.so | $m | whole run $(python3 -c "print(f'{$ns / 1e6:.1f}')") ms ($same) | | | | $sm | $pm/$v |"
    done
fi
