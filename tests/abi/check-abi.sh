#!/usr/bin/env bash
# Run the ABI checker (tests/abi/check_abi.py) with libclang from PyPI.
#
#   tests/abi/check-abi.sh --real <torch_npu/include> [--shim <dir>] [--allow <file>] [-v]
#
# libclang (the PyPI package, which bundles libclang.so) is installed into a venv
# under ${U3M_CACHE:-$HOME/.cache/u3m}/abi-venv on first use and reused after;
# creation is serialised with flock. Exit status: 0 = conformant, 1 = differences
# (listed on stdout, one "DIFF" line each), 2 = the checker could not run.
set -euo pipefail

LIBCLANG_VERSION=18.1.1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${U3M_CACHE:-$HOME/.cache/u3m}
VENV="$CACHE/abi-venv"

die() { echo "check-abi: error: $*" >&2; exit 2; }

command -v python3 >/dev/null 2>&1 || die "python3 not found"
mkdir -p "$CACHE" || die "cannot create $CACHE"

exec 9>"$CACHE/.abi-venv.lock"
flock -w 900 9 || die "timed out waiting for $CACHE/.abi-venv.lock"
STAMP="$VENV/.u3m-stamp"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "libclang==$LIBCLANG_VERSION" ] \
    || ! "$VENV/bin/python" -c 'import clang.cindex' >/dev/null 2>&1; then
    echo "check-abi: creating $VENV with libclang==$LIBCLANG_VERSION" >&2
    rm -rf "$VENV"
    python3 -m venv "$VENV" 1>&2 || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q \
        "libclang==$LIBCLANG_VERSION" 1>&2 \
        || die "pip could not install libclang==$LIBCLANG_VERSION (is PyPI reachable?)"
    "$VENV/bin/python" -c 'import clang.cindex; clang.cindex.Index.create()' 1>&2 \
        || die "libclang installed but does not load"
    echo "libclang==$LIBCLANG_VERSION" > "$STAMP"
fi
exec 9>&-

exec "$VENV/bin/python" "$HERE/check_abi.py" "$@"
