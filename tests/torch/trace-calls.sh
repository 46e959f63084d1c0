#!/usr/bin/env bash
# Which simulator entry points does a program call, in which order?
#
#   tests/torch/trace-calls.sh [-o LOG] -- CMD ARGS...
#
# Builds an instrumented copy of the stand-in libraries (gcc
# -finstrument-functions; a hook logs every exported function entered from
# outside its library) into a scratch directory, runs CMD with those libraries
# first on LD_LIBRARY_PATH (also for the fake CANN tree's lib64), and prints
# the call counts, most frequent first. The ordered log (one "TRACE name" line
# per call) is kept in LOG (default: a file under /tmp, named at the end).
# This is how the torch_npu call sequence in docs/torch-npu.md was found, e.g.
#
#   source target/release/cann/set_env.sh
#   LD_PRELOAD=$PWD/target/release/torch_harness_preload.so \
#     tests/torch/trace-calls.sh -- "$(ci/install-torch.sh)" tests/torch/train_mlp.py --device npu --steps 2
#
# A debugging aid only: the instrumented libraries are several times slower.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
log=""
while [ $# -gt 0 ]; do
    case "$1" in
    -o) log=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [-o LOG] -- CMD ARGS..." >&2; exit 3 ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: $0 [-o LOG] -- CMD ARGS..." >&2; exit 3; }
out=$(mktemp -d /tmp/aclsim-trace.XXXXXX)
[ -n "$log" ] || log=$out/calls.log

cat >"$out/tracer.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
static __thread int depth;   /* per library copy: calls from outside only */
__attribute__((no_instrument_function)) void __cyg_profile_func_enter(void *fn, void *site)
{
    (void)site;
    if (depth++) return;
    Dl_info i;
    if (dladdr(fn, &i) && i.dli_sname && i.dli_saddr == fn) {
        char b[256];
        int n = snprintf(b, sizeof b, "TRACE %s\n", i.dli_sname);
        if (n > 0) { ssize_t r = write(2, b, (size_t)n); (void)r; }
    }
}
__attribute__((no_instrument_function)) void __cyg_profile_func_exit(void *fn, void *site)
{
    (void)fn; (void)site;
    depth--;
}
EOF

S=$root/shim
cflags=(-O1 -g -std=gnu11 -pthread "-I$S/include" "-I$S/src" -finstrument-functions -shared -fPIC
        -fvisibility=hidden '-Wl,-rpath,$ORIGIN' -Wl,-Bsymbolic-functions "-L$out")
build() { # lib dir deps...
    local lib=$1 dir=$2
    shift 2
    gcc "${cflags[@]}" "-Wl,-soname,$lib" -o "$out/$lib" "$S"/src/"$dir"/*.c "$out/tracer.c" \
        -Wl,--no-as-needed "$@" -Wl,--as-needed -lm -ldl
}
build libruntime.so runtime
build libprofapi.so profapi
build libascendcl.so rt -lruntime -lprofapi
build libnnopbase.so nnopbase -lascendcl
build libopapi.so opapi -lnnopbase -lascendcl
build libhccl.so hccl -lascendcl
build libacl_op_compiler.so op_compiler -lascendcl
for stub in ge_runner graph acl_tdt_channel; do
    gcc -shared -fPIC -o "$out/lib$stub.so" "$S/src/stubs/$stub/$stub.c"
done

set +e
LD_LIBRARY_PATH="$out${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@" 2> >(tee "$log.stderr" | grep -v '^TRACE ' >&2)
rc=$?
set -e
wait
grep '^TRACE ' "$log.stderr" | grep -v '^TRACE aclsim_' >"$log" || true
rm -f "$log.stderr"
echo "--- calls into the simulator (exit $rc; ordered log: $log)" >&2
awk '{print $2}' "$log" | sort | uniq -c | sort -rn >&2
exit $rc
