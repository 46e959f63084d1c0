#!/usr/bin/env bash
# Bounded fuzzing of u3m's parsers of outside input (fuzz/: the trace reader,
# the U3M_* configuration parser, the stats-segment reader) with libFuzzer,
# on the stable toolchain: libfuzzer-sys builds libFuzzer from source (a C++
# compiler, which ci/prereqs.sh installs), and coverage comes from LLVM's
# sanitizer-coverage pass, which stable rustc runs through -Cpasses (cargo
# fuzz's -Zsanitizer=address is the only nightly part, and Rust code needs
# it least). Each target starts from its committed corpus (fuzz/corpus/T,
# read-only here) and saved crash inputs (fuzz/regressions/T); new corpus
# entries go to a scratch directory. A crash leaves its input in
# $CARGO_TARGET_DIR/artifacts/ and fails the script: copy it to
# fuzz/regressions/T/ and tests/fuzz_corpus.rs replays it forever after.
#   U3M_FUZZ_SECS   seconds per target (default 25)
#   U3M_FUZZ_TARGETS  space-separated subset (default: all)
#   U3M_FUZZ_TARGET_DIR  build directory (default ~/.cache/u3m/fuzz-target)
# `ci/fuzz.sh --known` instead runs every input of an open finding
# (fuzz/known/T/*, which the targets steer around) without the guard, and
# says which still crash; once one passes, its fix landed: move the input to
# fuzz/regressions/T/ and drop the guard.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/prereqs.sh
source ci/prereqs.sh
ensure_prereqs

secs=${U3M_FUZZ_SECS:-25}
targets=${U3M_FUZZ_TARGETS:-"trace_reader config stats_segment"}
# kept across runs (the instrumented build of libFuzzer and core takes ~3 min)
export CARGO_TARGET_DIR="${U3M_FUZZ_TARGET_DIR:-$HOME/.cache/u3m/fuzz-target}"
export RUSTFLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# an explicit --target keeps RUSTFLAGS off build scripts (as cargo fuzz does)
host=$(rustc -vV | awk '/^host:/ {print $2}')
cargo build --release --locked --manifest-path fuzz/Cargo.toml --bins --target "$host"

if [ "${1:-}" = --known ]; then
    for t in $targets; do
        for f in fuzz/known/"$t"/*; do
            [ -e "$f" ] || continue
            if U3M_FUZZ_UNGUARDED=1 "$CARGO_TARGET_DIR/$host/release/$t" "$f" >"$CARGO_TARGET_DIR/known.log" 2>&1; then
                echo "fuzz: $f passes now: move it to fuzz/regressions/$t/ and drop its guard" >&2
            else
                echo "fuzz: $f still crashes: $(grep -m1 -A1 panicked "$CARGO_TARGET_DIR/known.log" | tail -1)" >&2
            fi
        done
    done
    exit 0
fi

status=0
for t in $targets; do
    work="$CARGO_TARGET_DIR/corpus/$t"
    art="$CARGO_TARGET_DIR/artifacts/$t"
    mkdir -p "$work" "$art" "fuzz/regressions/$t"
    log="$CARGO_TARGET_DIR/$t.log"
    echo "fuzz: $t for ${secs}s" >&2
    if "$CARGO_TARGET_DIR/$host/release/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$art/" -print_final_stats=1 \
        "$work" "fuzz/corpus/$t" "fuzz/regressions/$t" >"$log" 2>&1; then
        runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
        echo "fuzz: $t: ${runs:-?} runs, coverage ${cov:-?} edges, no crash" >&2
    else
        status=1
        echo "fuzz: $t FAILED — crash input in $art/ (save it to fuzz/regressions/$t/):" >&2
        grep -E "panicked|ERROR|SUMMARY|Test unit written" "$log" | head -20 >&2 || tail -30 "$log" >&2
    fi
done
exit "$status"
