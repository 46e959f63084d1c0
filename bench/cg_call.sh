#!/usr/bin/env bash
# Callgrind over hookbench, tier mode, nothing to move (phantom device):
# the per-call figures of BENCHMARKS.md (fast5, fast7).
#
#   bench/cg_call.sh BIN OUT THREADS ITERS [CASE]
#
# BIN: a directory with libu3m.so and acl-apps/hookbench (target/release).
# Writes OUT.cg (the measured loop only, every thread in one profile, as
# fast5: read it with `bench/cg_own.py OUT.cg CALLS` and
# `bench/cg_atomics.py OUT.cg CALLS`, CALLS = THREADS x ITERS) and OUT.log.
# With CG_THREADS=1 it instead profiles the whole run per thread
# (--separate-threads=yes, OUT.cg-NN): `bench/cg_threads.py OUT.cg` prints
# each thread's Ir (u3m's background threads' share of the run).
set -euo pipefail
BIN=$1 OUT=$2 T=$3 N=$4 C=${5:-aclop_4}
SHM=$(mktemp -d /tmp/u3m-cg.XXXXXX)
trap 'rm -rf "$SHM"' EXIT
if [ "${CG_THREADS:-0}" = 1 ]; then
    opts=(--separate-threads=yes)
else
    opts=(--dump-instr=yes --collect-atstart=no --toggle-collect=hb_measure)
fi
ACLSIM_PHANTOM=1 LD_PRELOAD="$BIN/libu3m.so" U3M_MODE=tier U3M_SHM_DIR="$SHM" \
    valgrind --tool=callgrind "${opts[@]}" --callgrind-out-file="$OUT.cg" \
    "$BIN/acl-apps/hookbench" --threads "$T" --iters "$N" --warmup 200 --case "$C" \
    >/dev/null 2>"$OUT.log"
