#!/usr/bin/env bash
# Hook-overhead benchmark: what libu3m.so adds to each hooked call in observe
# mode, in instructions (callgrind: repeatable) and in ns (native: noisy on a
# shared machine), single-threaded and at 8 threads; plus the engine alone
# (core/examples/touch_bench). Prints the tables of BENCHMARKS.md.
#
#   bench/hooks.sh [--quick] [--no-build] [--no-callgrind] [--reps R] [--mode M] [--out DIR]
#
# Not part of the test suite. Takes ~7 minutes on a 2-core machine (--quick: ~2).
# Raw results stay in DIR (default: a new /tmp/u3m-bench.XXXXXX); the report
# is DIR/report.md and stdout. See bench/README.md for how to read it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
REL="$ROOT/target/release"
HB="$REL/acl-apps/hookbench"
TB="$REL/examples/touch_bench"
LIB="$REL/libu3m.so"

quick=0 build=1 callgrind=1 reps=5 out="" mode=observe
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --no-build) build=0 ;;
        --no-callgrind) callgrind=0 ;;
        --reps) reps="$2"; shift ;;
        --out) out="$2"; shift ;;
        --mode) mode="$2"; shift ;;  # U3M_MODE of the u3m arm (the issue's figure: observe)
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "hooks.sh: unknown option $1" >&2; exit 3 ;;
    esac
    shift
done

# iterations per thread
nat_t1=20000 nat_t8=5000 cg_t1=2000 cg_t8=500 tb_t1=200000 tb_t8=50000 tb_cg=20000 tb_reps=3
if [ "$quick" = 1 ]; then
    nat_t1=5000 nat_t8=1000 cg_t1=500 cg_t8=100 tb_t1=50000 tb_t8=10000 tb_cg=5000 tb_reps=1
    [ "$reps" = 5 ] && reps=2
fi

if [ "$build" = 1 ]; then
    (cd "$ROOT" && cargo build --release --workspace -q && cargo build --release -q -p u3m-core --example touch_bench)
fi
for f in "$HB" "$TB" "$LIB"; do
    [ -e "$f" ] || { echo "hooks.sh: $f is missing (build first)" >&2; exit 2; }
done
if [ "$callgrind" = 1 ] && ! command -v valgrind >/dev/null; then
    echo "hooks.sh: valgrind not found: skipping instruction counts" >&2
    callgrind=0
fi

[ -n "$out" ] || out=$(mktemp -d /tmp/u3m-bench.XXXXXX)
mkdir -p "$out/native" "$out/cg" "$out/touch" "$out/bin/acl-apps"
# Measure a snapshot: target/release is shared with other builds, which may
# rewrite a library in the middle of a run. The layout keeps hookbench's
# $ORIGIN/.. runpath working.
cp "$REL"/lib*.so "$out/bin/"
cp "$HB" "$out/bin/acl-apps/"
cp "$TB" "$out/bin/"
HB="$out/bin/acl-apps/hookbench" TB="$out/bin/touch_bench" LIB="$out/bin/libu3m.so"
shm=$(mktemp -d /tmp/u3m-bench-shm.XXXXXX)
trap 'rm -rf "$shm"' EXIT

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$ROOT" && git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "nproc: $(nproc)"
    echo "kernel: $(uname -r)"
    echo "rustc: $(rustc --version 2>/dev/null || echo '?')"
    echo "cc: $(cc --version 2>/dev/null | head -1)"
    echo "valgrind: $(valgrind --version 2>/dev/null || echo none)"
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "mode: $mode"
} > "$out/machine.txt"
echo "hooks.sh: results in $out" >&2

# Both arms run on the simulator in phantom mode (no data, no kernels: the
# least simulator work per call); the u3m arm adds only LD_PRELOAD.
run_arm() { # arm, then the hookbench arguments
    local arm="$1"; shift
    if [ "$arm" = u3m ]; then
        env ACLSIM_PHANTOM=1 LD_PRELOAD="$LIB" U3M_MODE="$mode" U3M_SHM_DIR="$shm" "$@"
    else
        env ACLSIM_PHANTOM=1 "$@"
    fi
}

# ---- native: paired runs, alternating which arm goes first
for t in 1 8; do
    iters=$nat_t1; [ "$t" = 8 ] && iters=$nat_t8
    for r in $(seq 1 "$reps"); do
        order="direct u3m"; [ $((r % 2)) = 0 ] && order="u3m direct"
        for arm in $order; do
            echo "hooks.sh: native T=$t rep $r/$reps $arm" >&2
            run_arm "$arm" "$HB" --threads "$t" --iters "$iters" --per-iter > "$out/native/$arm-t$t-r$r.txt"
        done
    done
done

# ---- callgrind: one case per run, counting only inside hb_measure
if [ "$callgrind" = 1 ]; then
    echo "iters_t1=$cg_t1 iters_t8=$cg_t8" > "$out/cg/params.txt"
    for t in 1 8; do
        iters=$cg_t1; [ "$t" = 8 ] && iters=$cg_t8
        for c in $("$HB" --list); do
            for arm in direct u3m; do
                echo "hooks.sh: callgrind T=$t $c $arm" >&2
                f="$out/cg/$arm-t$t-$c"
                run_arm "$arm" valgrind --tool=callgrind --collect-atstart=no --toggle-collect=hb_measure \
                    --callgrind-out-file="$f.cg" "$HB" --threads "$t" --iters "$iters" --warmup 200 --case "$c" \
                    > "$f.out" 2> "$f.log"
                python3 "$ROOT/bench/cg_summary.py" "$f.cg" > "$f.json"
            done
        done
    done
fi

# ---- the engine alone
for t in 1 8; do
    iters=$tb_t1; [ "$t" = 8 ] && iters=$tb_t8
    for r in $(seq 1 "$tb_reps"); do
        echo "hooks.sh: touch_bench T=$t rep $r/$tb_reps" >&2
        "$TB" --threads "$t" --iters "$iters" > "$out/touch/native-t$t-r$r.txt"
    done
done
if [ "$callgrind" = 1 ]; then
    echo "cg_iters=$tb_cg" > "$out/touch/params.txt"
    for c in $("$TB" --list); do
        echo "hooks.sh: callgrind touch_bench $c" >&2
        f="$out/touch/cg-$c"
        valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*touch_bench::measure' \
            --callgrind-out-file="$f.cg" "$TB" --iters "$tb_cg" --case "$c" > "$f.out" 2> "$f.log"
        python3 "$ROOT/bench/cg_summary.py" "$f.cg" > "$f.json"
    done
fi

python3 "$ROOT/bench/report.py" "$out" | tee "$out/report.md"
