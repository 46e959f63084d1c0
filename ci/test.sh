#!/usr/bin/env bash
# Runs every test: builds the workspace (the u3m library, the simulated CANN
# runtime, the workload programs, the CLI) and runs the whole cargo test suite,
# including the ABI conformance test against the real CANN headers (fetched
# once from PyPI into ~/.cache/u3m). Installs what it needs on a fresh machine.
# Ends with one summary line "total: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/prereqs.sh
source ci/prereqs.sh
ensure_prereqs
ensure_test_tools

cargo build --release --workspace
# the soak's RSS trend needs a run long enough for its DRAM tier to fill
# (tests/soak.rs): two minutes here whatever the CI variable says
export U3M_SOAK_SECS=${U3M_SOAK_SECS:-120}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --release --workspace --no-fail-fast -- --test-threads="${U3M_TEST_THREADS:-2}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# the residency suite again with debug assertions: each victim order built
# from the chunks marked since the last one is then checked against a walk
# of every chunk (evict.rs `check_tracked`), which release builds leave out
cargo test -p u3m-core --lib --no-fail-fast residency:: -- --test-threads="${U3M_TEST_THREADS:-2}" 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
# the bug hunters (docs/reliability.md): loom, bounded fuzzing, the
# sanitizer build; U3M_SKIP_LOOM / U3M_SKIP_FUZZ / U3M_SKIP_SANITIZERS=1 skip one
for hunt in loom fuzz sanitizers; do
    skip="U3M_SKIP_${hunt^^}"
    [ "${!skip:-0}" = 1 ] && continue
    bash "ci/$hunt.sh" 2>&1 | tee -a "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
set -e
echo
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "total: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
