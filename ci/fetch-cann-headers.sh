#!/usr/bin/env bash
# Fetch the real CANN public headers that ship inside the torch-npu wheel on PyPI
# and print the path of their include directory (torch_npu/include) on stdout.
#
#   ci/fetch-cann-headers.sh [DEST]
#
# DEST defaults to ${U3M_CACHE:-$HOME/.cache/u3m}/cann-headers (outside the
# checkout, so clean clones and `cargo clean` keep it). A finished fetch leaves a
# stamp; later runs reuse it after re-checking the wheel's sha256. Runs are
# serialised with flock, so concurrent callers (parallel tests) are safe.
# Only the last line of stdout is meaningful: the include path. Everything else,
# pip's chatter included, goes to stderr.
set -euo pipefail

# Pinned: the headers the shim must match. The wheel file is fixed by platform and
# Python tag so that the sha256 pin holds on every host (the headers are not
# Python-specific; we never install or import the wheel).
TNPU_VERSION=2.14.0
WHEEL=torch_npu-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl
WHEEL_SHA256=7736f7d82cf9f16c7dfc4537f7e7c638153da760273a193455e70857f912189e

die() { echo "fetch-cann-headers: error: $*" >&2; exit 1; }
log() { echo "fetch-cann-headers: $*" >&2; }

DEST=${1:-${U3M_CACHE:-$HOME/.cache/u3m}/cann-headers}
mkdir -p "$DEST" || die "cannot create cache directory $DEST"
DEST=$(cd "$DEST" && pwd)

command -v python3 >/dev/null 2>&1 || die "python3 not found (needed for pip and to unpack the wheel)"
command -v flock >/dev/null 2>&1 || die "flock not found (util-linux)"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"

exec 9>"$DEST/.lock"
flock -w 900 9 || die "timed out waiting for the lock on $DEST/.lock"

STAMP="$DEST/stamp"
UNPACKED="$DEST/torch_npu-$TNPU_VERSION"
INCLUDE="$UNPACKED/torch_npu/include"
STAMP_LINE="torch-npu $TNPU_VERSION $WHEEL $WHEEL_SHA256"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

is_ready() {
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_LINE" ] || return 1
    [ -f "$DEST/$WHEEL" ] && [ "$(sha_of "$DEST/$WHEEL")" = "$WHEEL_SHA256" ] || return 1
    [ -f "$INCLUDE/acl/acl.h" ] && [ -f "$INCLUDE/third_party/hccl/inc/hccl/hccl.h" ]
}

if ! is_ready; then
    rm -f "$STAMP"
    if [ -f "$DEST/$WHEEL" ] && [ "$(sha_of "$DEST/$WHEEL")" = "$WHEEL_SHA256" ]; then
        log "reusing downloaded $WHEEL"
    else
        rm -f "$DEST/$WHEEL"
        DL="$DEST/.download.$$"
        rm -rf "$DL"
        mkdir -p "$DL"
        log "downloading torch-npu==$TNPU_VERSION from PyPI (pip, no dependencies)"
        set +e
        python3 -m pip download "torch-npu==$TNPU_VERSION" --no-deps --only-binary=:all: \
            --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp --abi cp311 \
            --progress-bar off --disable-pip-version-check -d "$DL" 1>&2
        rc=$?
        set -e
        if [ $rc -ne 0 ]; then
            rm -rf "$DL"
            die "pip could not download torch-npu==$TNPU_VERSION (exit $rc): is PyPI reachable and pip installed (python3 -m pip)? Offline developers can skip the ABI test with U3M_SKIP_ABI=1."
        fi
        [ -f "$DL/$WHEEL" ] || { ls -l "$DL" >&2; rm -rf "$DL"; die "pip did not produce $WHEEL"; }
        got=$(sha_of "$DL/$WHEEL")
        if [ "$got" != "$WHEEL_SHA256" ]; then
            rm -rf "$DL"
            die "sha256 mismatch for $WHEEL: got $got, expected $WHEEL_SHA256"
        fi
        mv -f "$DL/$WHEEL" "$DEST/$WHEEL"
        rm -rf "$DL"
    fi

    log "unpacking torch_npu/include"
    TMP="$DEST/.unpack.$$"
    rm -rf "$TMP"
    mkdir -p "$TMP"
    # Only torch_npu/include/ is extracted; member names are checked so that a
    # malformed archive cannot write outside the target directory.
    python3 - "$DEST/$WHEEL" "$TMP" <<'EOF' || { rm -rf "$TMP"; die "could not unpack the wheel"; }
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
n = 0
with zipfile.ZipFile(wheel) as z:
    for m in z.infolist():
        name = m.filename
        if not name.startswith("torch_npu/include/") or name.endswith("/"):
            continue
        parts = name.split("/")
        if ".." in parts or name.startswith("/"):
            sys.exit("unsafe member name in wheel: " + name)
        z.extract(m, out)
        n += 1
if n == 0:
    sys.exit("no torch_npu/include/ members in " + wheel)
print("extracted %d files" % n, file=sys.stderr)
EOF
    rm -rf "$UNPACKED"
    mv "$TMP" "$UNPACKED"
    [ -f "$INCLUDE/acl/acl.h" ] || die "acl/acl.h missing from the unpacked headers"
    echo "$STAMP_LINE" > "$STAMP.tmp"
    mv -f "$STAMP.tmp" "$STAMP"
fi

echo "$INCLUDE"
