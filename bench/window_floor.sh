#!/usr/bin/env bash
# The window floor (docs/replay.md) of issue 10's three training shapes, per
# step over steps 1-2 and 3-4, next to the issue's heuristic link floor.
#
#   bench/window_floor.sh U3M [CACHE]
#
# U3M: the u3m binary. CACHE (default /tmp/steady): where the 5-step traces
# are (bench/steady.py's names; made with `u3m synth` when missing). HBM:
# the 8-layer shapes at footprint / 1.5 (as bench/steady.py), the 40-layer
# LoRA at 32 GiB.
set -euo pipefail
U3M=$1 CACHE=${2:-/tmp/steady}
mkdir -p "$CACHE"
S8="model_llama2-13b_layers_8_seq_1024_batch_2_workload"
trace() { # NAME SYNTH_ARGS...
    local t="$CACHE/$1"
    shift
    [ -s "$t" ] || "$U3M" synth "$@" -o "$t" >/dev/null
    echo "$t"
}
run() { # LABEL TRACE HBM HEURISTIC_MS
    "$U3M" replay "$2" --hbm "$3" --policy lru --floor --floor-steps 1-2,3-4 --json |
        python3 -c '
import json, sys
label, hbm, heur = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
f = json.load(sys.stdin)["traces"][0]["floor"]
cells = []
for s in f["steps"]:
    k = s["last_step"] - s["step"] + 1
    cells.append("steps %d-%d: %.1f ms/step (compute %.1f, stride %d)" % (
        s["step"], s["last_step"], s["ns"] / 1e6 / k, s["compute_ns"] / 1e6 / k, s["stride"]))
print("%-22s HBM %6.2f GiB  heuristic %.1f ms  window floor %s" % (label, hbm / 2**30, heur, "; ".join(cells)))
' "$1" "$3" "$4"
}
run "LoRA 8L, 1.5x" "$(trace "${S8}_lora_s5" --model llama2-13b --layers 8 --seq 1024 --batch 2 --workload lora --steps 5)" 8324644864 166.5
run "AdamW 8L, 1.5x" "$(trace "${S8}_adam_s5" --model llama2-13b --layers 8 --seq 1024 --batch 2 --workload adam --steps 5)" 32851886080 657.0
run "LoRA 13B 40L, 32 GiB" "$(trace b13_s5 --model llama2-13b --seq 1024 --batch 2 --workload lora --steps 5)" $((32 << 30)) 941.5
