#!/usr/bin/env bash
# u3m's added host instructions on RAG (kv_decode at 2 x the KV that fits,
# phantom, predictive: bench/engine_v2.sh --only rag's run), counted by
# callgrind: the whole process's Ir under libu3m.so less the unconstrained
# run's, and per eviction. Runs of one build repeat its evictions exactly
# and its count within ~0.5 % (the simulator's threads poll), where the
# host-CPU seconds of engine_v2.sh --only rag move by +-0.04 x the
# simulated run between runs of one build on this VM: compare builds here
# (BENCHMARKS.md, twenty-ninth sitting).
#
#   bench/rag_ir.sh BIN [REQUESTS]      # default 25, engine_v2's (~3 min)
#
# BIN: a directory with libu3m.so and acl-apps/kv_decode (target/release).
# Fewer requests evict far less (16: ~21,000 evictions against ~93,500;
# under 13: none) and can hide a cost that grows with them: a victim rule
# cost +1.7 % at 16 requests and +30 % at 25.
set -euo pipefail
BIN=$1 REQ=${2:-25}
command -v valgrind >/dev/null || { echo "rag_ir.sh: needs valgrind" >&2; exit 2; }
OUT=$(mktemp -d /tmp/u3m-rag-ir.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
ARGS=(--heads 8 --head-dim 128 --prompt 512 --decode 511 --max-context 1023 --requests "$REQ")
run() { # NAME ENV...: Ir of the run
    local name=$1
    shift
    env -i PATH="$PATH" HOME="$HOME" ACLSIM_PHANTOM=1 "$@" \
        valgrind --tool=callgrind --callgrind-out-file="$OUT/$name.cg" \
        "$BIN/acl-apps/kv_decode" "${ARGS[@]}" >"$OUT/$name.out" 2>"$OUT/$name.err"
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$OUT/$name.err"
}
unc=$(run unc ACLSIM_HBM_BYTES=1T)
tier=$(run tier ACLSIM_HBM_BYTES=512M U3M_MODE=tier U3M_OVERSUB=2 U3M_DRAM_BYTES=16G \
    U3M_POLICY=predictive U3M_SUMMARY="$OUT/summary.json" LD_PRELOAD="$BIN/libu3m.so")
python3 - "$unc" "$tier" "$OUT/summary.json" "$REQ" <<'EOF'
import json, sys
unc, tier, summary, req = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
t = json.load(open(summary))["tier"]
added = tier - unc
print("rag_ir: kv_decode %s requests, 512 MiB HBM, predictive: unconstrained %d Ir, under libu3m.so %d Ir;"
      " u3m adds %d Ir (%.1f M), %d evictions, %.0f Ir per eviction"
      % (req, unc, tier, added, added / 1e6, t["evictions"], added / max(t["evictions"], 1)))
EOF
