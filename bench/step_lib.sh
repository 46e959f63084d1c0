#!/usr/bin/env bash
# bench/step_lib.sh BIN TRACE HBM K [VAR=VAL...]: step K (0-based) of TRACE under
# BIN/libu3m.so (acl_replay, phantom, 910b4): simulated ms of
# cut(K+1) - cut(K), H2D / D2H GiB, and the U3M_SUMMARY schedule counters.
set -euo pipefail
B=$1 T=$2 H=$3 K=$4; shift 4
tmp=$(mktemp -d); trap 'rm -rf $tmp' EXIT
cutat() { local n; n=$(grep -n "# train step $1: forward" "$T" | head -1 | cut -d: -f1); head -n $((n-1)) "$T" > $tmp/c$1; }
cutat $K; cutat $((K+1))
run() {
  local k=$1; shift
  env -i PATH="$PATH" HOME="$HOME" ACLSIM_PRESET=910b4 ACLSIM_PHANTOM=1 ACLSIM_HBM_BYTES=$H U3M_POLICY=predictive \
    U3M_OVERSUB=64 U3M_DRAM_BYTES=64G U3M_MODE=tier U3M_SHM_DIR=$tmp LD_PRELOAD=$B/libu3m.so \
    ACLSIM_STATS=$tmp/s$k.json U3M_SUMMARY=$tmp/u$k.json "$@" $B/acl-apps/acl_replay --no-verify $tmp/c$k > $tmp/o$k 2> $tmp/e$k \
    || { echo "run $k failed"; tail -5 $tmp/e$k; exit 1; }
}
run $K "$@"; run $((K+1)) "$@"
grep -h "u3m:" $tmp/e$((K+1)) | head -3 || true
python3 - $tmp/s$K.json $tmp/s$((K+1)).json $tmp/u$((K+1)).json <<'PY'
import json,sys
a,b=[json.load(open(f)) for f in sys.argv[1:3]]; u=json.load(open(sys.argv[3]))
G=1<<30
print("step %.1f ms  H2D %.3f GiB  D2H %.3f GiB  schedule_entries %s stops %s handoffs %s" % (
 (b["sim_ns"]-a["sim_ns"])/1e6, (b["copy_bytes"]["H2D"]-a["copy_bytes"]["H2D"])/G, (b["copy_bytes"]["D2H"]-a["copy_bytes"]["D2H"])/G,
 u["tier"].get("schedule_entries"), u["tier"].get("schedule_stops"), u["tier"].get("handoffs")))
PY
