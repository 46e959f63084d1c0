#!/usr/bin/env bash
# The main demo: `u3m ab` runs unmodified ACL programs on the simulated Ascend
# runtime with and without libu3m.so (U3M_MODE=tier) and prints the arms side
# by side. A footprint larger than HBM makes the stock runtime fail with 207001
# (the out-of-memory error frameworks report); under libu3m.so the same program
# completes with the results of an unconstrained run (the `ref` arm: the stock
# runtime with plenty of HBM). Builds everything it needs first; about 20 s on
# two cores. Exits non-zero if u3m's results differ from the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/prereqs.sh
source ci/prereqs.sh
ensure_prereqs
cargo build --release --workspace >&2

u3m=target/release/u3m
apps=target/release/acl-apps
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fact() { # file key: the last key=value on the program's stdout
    grep -Eo "(^| )$2=[^ ]+" "$1" | tail -1 | cut -d= -f2
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
mib() { echo $(($1 >> 20)); }
check() { # name arm-dir: the u3m arm must match the reference
    local ref tier
    ref=$(grep -E 'checksum=' "$2/ref.stdout" | md5sum | cut -c1-12)
    tier=$(grep -E 'checksum=' "$2/tier.stdout" | md5sum | cut -c1-12)
    if [ "$ref" != "$tier" ] || ! grep -q checksum= "$2/ref.stdout"; then
        echo "FAIL: $1 under libu3m.so does not match the unconstrained reference" >&2
        exit 1
    fi
}

# ---- training: mlp_train at 1.5 x HBM ------------------------------------
# The model's tensors round to 2 MiB pages, so its footprint moves in steps:
# --footprint 194M plans 203886592 bytes, 1.50 x a 130 MiB device (1.5 x a
# round 128 MiB would land at 1.52 x, above u3m's default 1.5 x virtual
# capacity, U3M_OVERSUB).
hbm=130M
hbm_bytes=$((130 << 20))
echo "== mlp_train (Adam training) at 1.5 x HBM on a simulated ${hbm} device"
echo
"$u3m" ab --hbm "$hbm" --ref-hbm 1G --keep "$tmp/mlp" -- \
    "$apps/mlp_train" --footprint 194M --batch 16 --steps 5
fp=$(fact "$tmp/mlp/ref.stdout" footprint_bytes)
check mlp_train "$tmp/mlp"
echo
echo "footprint $(mib "$fp") MiB = $(ratio "$fp" "$hbm_bytes") x HBM;" \
    "unconstrained reference checksum $(fact "$tmp/mlp/ref.stdout" checksum)," \
    "under libu3m.so $(fact "$tmp/mlp/tier.stdout" checksum): identical"

# ---- serving: kv_decode with 2.1 x the KV that fits ----------------------
# One layer, 2K-token contexts: each request's KV cache is 8 MiB. On an 88 MiB
# device the stock runtime holds the weights and 10 requests; 21 is 2.1 x that.
# Weights plus 2.1 x the KV exceed the default 1.5 x virtual capacity, so the
# run raises it (--oversub 3 sets U3M_OVERSUB).
hbm=88M
kv=(--layers 1 --max-context 2047)
echo
echo "== kv_decode (LLM decoding, KV caches) on a simulated ${hbm} device"
for r in 10 11; do
    set +e
    ACLSIM_HBM_BYTES=$hbm "$apps/kv_decode" "${kv[@]}" --requests $r >"$tmp/fit$r.out" 2>"$tmp/fit$r.err"
    rc=$?
    set -e
    if [ $rc -eq 0 ]; then
        echo "stock runtime, $r requests: served $(fact "$tmp/fit$r.out" requests_served)"
    else
        echo "stock runtime, $r requests: exit $rc, $(grep -Eo 'ACL error [0-9]+' "$tmp/fit$r.err" | head -1)"
    fi
done
echo
"$u3m" ab --hbm "$hbm" --ref-hbm 1G --oversub 3 --keep "$tmp/kv" -- \
    "$apps/kv_decode" "${kv[@]}" --requests 21
check kv_decode "$tmp/kv"
echo
kv_fit=$(fact "$tmp/fit10.out" footprint_bytes)
kv_all=$(fact "$tmp/kv/ref.stdout" footprint_bytes)
echo "KV $(mib "$kv_all") MiB = $(ratio "$kv_all" "$kv_fit") x the $(mib "$kv_fit") MiB that fits;" \
    "libu3m.so served $(fact "$tmp/kv/tier.stdout" requests_served) requests," \
    "every per-request checksum identical to the unconstrained reference"
