#!/usr/bin/env bash
# Whole-process instructions (callgrind Ir) of one acl_replay run of a
# training trace under libu3m.so, tier mode, phantom 910B4 — the figure
# BENCHMARKS.md's "u3m's instructions" rows take, less the same trace's
# unconstrained run (UNCONSTRAINED=1, no preload, HBM 1T: the run must not
# stop at an allocation over the card, thirty-third sitting).
#
#   bench/cg_step.sh BIN TRACE HBM OUT        # e.g. /tmp/steady/band_lora_s3 7939M
#   UNCONSTRAINED=1 bench/cg_step.sh BIN TRACE 1T OUT
#
# BIN: a directory with libu3m.so and acl-apps/acl_replay (target/release).
# Prints "OUT IR"; leaves OUT.cg (read it with callgrind_annotate) and
# OUT.log. The hot-chunk publisher is kept quiet (U3M_HOT_INTERVAL_MS at its
# maximum): it runs every 500 ms of wall time, and under callgrind's
# slowdown that was 56 scans of the heat table on a 3-step AdamW run (521 M
# Ir) and 1,131 M on the 32 GiB step, moving with the machine's load
# (thirty-fourth sitting). The engine's rounds run on simulated time and
# are counted.
set -euo pipefail
BIN=$1 TR=$2 H=$3 OUT=$4
command -v valgrind >/dev/null || { echo "cg_step.sh: needs valgrind" >&2; exit 2; }
SHM=$(mktemp -d /tmp/u3m-cg-step.XXXXXX)
trap 'rm -rf "$SHM"' EXIT
env=(ACLSIM_PRESET=910b4 ACLSIM_PHANTOM=1 ACLSIM_HBM_BYTES="$H")
if [ "${UNCONSTRAINED:-0}" != 1 ]; then
    env+=(U3M_OVERSUB=2 U3M_DRAM_BYTES=64G U3M_MODE=tier U3M_SHM_DIR="$SHM"
        U3M_HOT_INTERVAL_MS=3600000 LD_PRELOAD="$BIN/libu3m.so")
fi
env "${env[@]}" valgrind --tool=callgrind --callgrind-out-file="$OUT.cg" \
    "$BIN/acl-apps/acl_replay" --no-verify "$TR" >/dev/null 2>"$OUT.log"
echo "$OUT $(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$OUT.log")"
