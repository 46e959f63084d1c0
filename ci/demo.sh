#!/usr/bin/env bash
# The main demo: ACL workloads on the simulated Ascend runtime, A/B style.
# Until the interposer lands, the A/B is "fits in HBM" vs "1.5 x HBM": the stock
# runtime serves the first and fails the second with 207001 — the failure u3m
# exists to remove. Builds everything it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/prereqs.sh
source ci/prereqs.sh
ensure_prereqs
cargo build --release --workspace >&2

apps=target/release/acl-apps
hbm=${DEMO_HBM:-512M}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

stat() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

run() { # name, footprint multiple, program args...
    local name=$1 x=$2; shift 2
    local out="$tmp/$name.out" st="$tmp/$name.json"
    set +e
    ACLSIM_HBM_BYTES=$hbm ACLSIM_STATS=$st "$apps/$1" "${@:2}" --footprint-x "$x" >"$out" 2>"$tmp/$name.err"
    local rc=$?
    set -e
    local peak=- simms=- result
    if [ -f "$st" ]; then
        peak=$(stat "$st" "d['devices'][0]['peak_bytes']>>20")
        simms=$(stat "$st" "round(d['sim_ns']/1e6, 2)")
    fi
    if [ $rc -eq 0 ]; then
        result=$(grep -Eo '(final_loss|requests_served)=[^ ]+' "$out" | tail -1)
    else
        result="failed: $(grep -Eo 'ACL error [0-9]+' "$tmp/$name.err" | head -1)"
    fi
    printf '%-28s %6s %6s %12s %12s  %s\n' "$name" "$x" "$rc" "$peak" "$simms" "$result"
}

echo "simulated device: ${hbm} HBM (ACLSIM_HBM_BYTES); times are simulated device time"
printf '%-28s %6s %6s %12s %12s  %s\n' run "xHBM" exit "peak MiB" "sim ms" result
run "mlp_train fits"      0.8 mlp_train --steps 10
run "mlp_train 1.5x HBM"  1.5 mlp_train --steps 10
run "kv_decode fits"      0.8 kv_decode
run "kv_decode 2.1x KV"   2.1 kv_decode
echo
echo "with libu3m.so (issue 'tiering'), the 1.5x and 2.1x runs complete with the same results."
