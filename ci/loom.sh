#!/usr/bin/env bash
# Model-checks u3m's lock-free structures with loom (loom/: the heat table's
# generation-tagged records, the real core/src/heat/record.rs, and a model of
# the stats segment's event-ring seqlock). Stable toolchain; the build lives
# in ~/.cache/u3m/loom-target. LOOM_MAX_PREEMPTIONS bounds the search
# (default 2 here: every test below finishes in seconds; 3 explores more).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/prereqs.sh
source ci/prereqs.sh
ensure_prereqs
export CARGO_TARGET_DIR="${U3M_LOOM_TARGET_DIR:-$HOME/.cache/u3m/loom-target}"
export RUSTFLAGS="--cfg loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
# only the loom_ tests: record.rs's own unit tests run in the normal suite
cargo test --locked --manifest-path loom/Cargo.toml loom_ -- --test-threads=2
