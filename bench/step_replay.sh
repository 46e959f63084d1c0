#!/usr/bin/env bash
# bench/step_replay.sh U3M TRACE HBM K POLICY [REPLAY_ARGS...]: step K (0-based) of TRACE,
# simulated ms = replay(cut before step K+1) - replay(cut before step K),
# with GiB in (fault-in + prefetch) / out (write-back) of the step.
set -euo pipefail
U3M=$1 T=$2 H=$3 K=$4 P=$5; shift 5
tmp=$(mktemp -d); trap 'rm -rf $tmp' EXIT
cutat() { local n; n=$(grep -n "# train step $1: forward" "$T" | head -1 | cut -d: -f1); head -n $((n-1)) "$T" > $tmp/c$1; }
cutat $K; cutat $((K+1))
run() { "$U3M" replay --hbm "$H" --policy "$P" --link-model shared --call-us 0 --issue acl-replay --json "$@" ; }
run $tmp/c$K "$@" > $tmp/a.json 2>$tmp/a.err || { cat $tmp/a.err; exit 1; }
run $tmp/c$((K+1)) "$@" > $tmp/b.json 2>$tmp/b.err || { cat $tmp/b.err; exit 1; }
python3 - $tmp/a.json $tmp/b.json "$P" <<'PY'
import json,sys
def row(f):
    j=json.load(open(f)); t=j["traces"][0] if "traces" in j else j
    r=[r for r in t["policies"] if r["policy"]==sys.argv[3]][0]
    return r["total_ns"], r["fault_in_bytes"]["total"]+r["prefetch_bytes"], r["writeback_bytes"]["total"], r
a,b=row(sys.argv[1]),row(sys.argv[2])
G=1<<30
print("step %.1f ms  in %.3f GiB  out %.3f GiB" % ((b[0]-a[0])/1e6,(b[1]-a[1])/G,(b[2]-a[2])/G))
PY
