#!/usr/bin/env bash
# The simulated runtime (shim/, C) and the workload programs (tests/apps/)
# built with AddressSanitizer + UndefinedBehaviorSanitizer (ci/asan-cc as CC;
# every finding is fatal) in their own target directory, and a selection of
# the simulator's tests and of the workload programs — on the stock runtime
# and under LD_PRELOAD=libu3m.so in tier mode — run against that build.
#
# Notes (docs/reliability.md has the why):
#  - the simulator's device VA arena asks for 0x100000000000 + dev * 4 TiB
#    only as a hint; under ASan that address lies in the shadow region, the
#    kernel places the arena elsewhere and nothing depends on where;
#  - libu3m.so (Rust) preloaded into an ASan program comes before the ASan
#    runtime in the library list: verify_asan_link_order=0 lets ASan start
#    anyway (its interceptors still win: the program links libasan first);
#    LD_PRELOAD="$(cc -print-file-name=libasan.so):libu3m.so" is the other way;
#  - the Rust test binaries are the ordinary ones (target/release): only
#    their programs and stand-in libraries come from the sanitizer build;
#  - detect_leaks=0: the short-lived test programs do not free what they
#    created (tensor descriptions, host arrays) before exit; LeakSanitizer
#    reports only those;
#  - not run here: sim_programs' dlsym_app_names_a_missing_symbol (ASan's
#    dlopen interceptor makes dlopen ignore the program's $ORIGIN runpath)
#    and interposer's handle lookups (they name the library a symbol
#    resolves to, and ASan's interceptors are such a library), and
#    sim_hostmem's managed-memory test (it pins the documented UVM range at
#    0x90000000000, which lies in ASan's shadow memory on x86-64: the
#    simulator places the range elsewhere and says so).
# U3M_ASAN_FULL=1 runs the whole tier suite too (about 5 min).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/prereqs.sh
source ci/prereqs.sh
ensure_prereqs

asan_cc="$PWD/ci/asan-cc"
asan_dir="${U3M_ASAN_TARGET_DIR:-$HOME/.cache/u3m/asan-target}"
export ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

# The instrument first: a heap overflow must be caught.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
cat >"$probe/oob.c" <<'C'
#include <stdlib.h>
int main(int argc, char **argv) {
    volatile char *p = malloc(16);
    for (int i = 0; i < 16; i++) p[i] = (char)i;
    int r = p[15 + (argc > 1)];      /* one byte past the end with an argument */
    (void)argv;
    free((void *)p);
    return r == 15 ? 0 : 3;
}
C
"$asan_cc" -O1 -g "$probe/oob.c" -o "$probe/oob"
"$probe/oob" || { echo "sanitizers: the clean probe failed" >&2; exit 1; }
if "$probe/oob" x 2>"$probe/err"; then
    echo "sanitizers: ASan missed a heap overflow" >&2
    exit 1
fi
# UBSan's object-size check or ASan's redzone, whichever looks first
grep -qE "heap-buffer-overflow|runtime error" "$probe/err" || { echo "sanitizers: no report:" >&2; cat "$probe/err" >&2; exit 1; }
echo "sanitizers: probe caught: $(grep -m1 -oE 'heap-buffer-overflow|runtime error: [a-z ]*' "$probe/err")" >&2

# Only the C parts are built with the sanitizers (the aclsim crate's build
# script, with ci/asan-cc as CC, in a target directory of their own); the
# tests are the ordinary ones from target/release, pointed at that build by
# ACLSIM_TARGET_DIR, and libu3m.so is the ordinary one.
CC="$asan_cc" CARGO_TARGET_DIR="$asan_dir" cargo build --release -p aclsim
cargo build --release -p u3m -p aclsim
ln -sf "$PWD/target/release/libu3m.so" "$asan_dir/release/libu3m.so"
export ACLSIM_TARGET_DIR="$asan_dir/release"
# run TEST [libtest arguments...]
run() {
    local t=$1
    shift
    cargo test --release --test "$t" -- --test-threads=2 "$@"
}
if [ "${U3M_ASAN_FULL:-0}" = 1 ]; then
    run tier
fi
run sim_runtime
run sim_ops
run sim_hccl_vmm
run sim_hostmem --skip managed_memory_round_trips_with_prefetch_and_advise
run sim_programs --skip dlsym_app_names_a_missing_symbol
run findings
run tier mt_stress kv_decode captured_graph
U3M_DIFFTEST_SEEDS=${U3M_DIFFTEST_SEEDS:-6} run difftest random
