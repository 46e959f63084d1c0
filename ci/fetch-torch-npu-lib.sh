#!/usr/bin/env bash
# Extract the real torch_npu 2.14.0 binary, torch_npu/lib/libtorch_npu.so, from
# the torch-npu wheel and print its path on stdout.
#
#   ci/fetch-torch-npu-lib.sh
#
# The wheel itself is fetched, sha256-checked and cached by
# ci/fetch-cann-headers.sh (same cache, same pin: the pin is read from that
# script so there is one source of truth). This script only unpacks the library
# next to it, in ${U3M_CACHE:-$HOME/.cache/u3m}/torch-npu-lib, and checks the
# library's own sha256 (the binary docs/torch-npu-symbols.md and the
# allow-list describe). A finished extraction leaves a stamp and later runs
# only re-check the checksum; runs are serialised with flock.
# Only the last line of stdout is meaningful: the library path. Everything
# else goes to stderr.
set -euo pipefail

die() { echo "fetch-torch-npu-lib: error: $*" >&2; exit 1; }
log() { echo "fetch-torch-npu-lib: $*" >&2; }

HERE=$(cd "$(dirname "$0")" && pwd)
HEADERS_SCRIPT="$HERE/fetch-cann-headers.sh"
[ -f "$HEADERS_SCRIPT" ] || die "missing $HEADERS_SCRIPT"

# The wheel pin, read (not sourced: the script has side effects) from the
# header fetcher.
pin() {
    sed -n "s/^$1=\([A-Za-z0-9._-]*\)\$/\1/p" "$HEADERS_SCRIPT" | head -n1
}
TNPU_VERSION=$(pin TNPU_VERSION)
WHEEL=$(pin WHEEL)
WHEEL_SHA256=$(pin WHEEL_SHA256)
[ -n "$TNPU_VERSION" ] && [ -n "$WHEEL" ] && [ -n "$WHEEL_SHA256" ] ||
    die "could not read TNPU_VERSION/WHEEL/WHEEL_SHA256 from $HEADERS_SCRIPT"

# Pinned: the exact binary the allow-list (tests/torch_npu_allowlist.txt) was
# written against. It is inside the pinned wheel; checking it again catches a
# corrupted extraction.
MEMBER=torch_npu/lib/libtorch_npu.so
LIB_SHA256=3e9db1b57f7a1a68db5266e1954fd6f4822044d3dbd2dc5deb939079c98c6f7f
[ "$TNPU_VERSION" = 2.14.0 ] ||
    die "fetch-cann-headers.sh now pins torch-npu $TNPU_VERSION; update LIB_SHA256 here and re-check tests/torch_npu_allowlist.txt"

command -v python3 >/dev/null 2>&1 || die "python3 not found (needed to unpack the wheel)"
command -v flock >/dev/null 2>&1 || die "flock not found (util-linux)"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"

CACHE=${U3M_CACHE:-$HOME/.cache/u3m}
WHEEL_PATH="$CACHE/cann-headers/$WHEEL"
DEST="$CACHE/torch-npu-lib"
mkdir -p "$DEST" || die "cannot create cache directory $DEST"
DEST=$(cd "$DEST" && pwd)

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

exec 9>"$DEST/.lock"
flock -w 900 9 || die "timed out waiting for the lock on $DEST/.lock"

LIB="$DEST/torch_npu-$TNPU_VERSION/libtorch_npu.so"
STAMP="$DEST/stamp"
STAMP_LINE="torch-npu $TNPU_VERSION $WHEEL_SHA256 $MEMBER $LIB_SHA256"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_LINE" ] &&
    [ -f "$LIB" ] && [ "$(sha_of "$LIB")" = "$LIB_SHA256" ]; then
    echo "$LIB"
    exit 0
fi
rm -f "$STAMP"

# Download (or re-verify) the wheel; its stdout (the include path) is not ours.
bash "$HEADERS_SCRIPT" >/dev/null ||
    die "ci/fetch-cann-headers.sh could not provide the torch-npu wheel (see above); offline developers can skip this test with U3M_SKIP_ABI=1"
[ -f "$WHEEL_PATH" ] || die "the wheel is not at $WHEEL_PATH after ci/fetch-cann-headers.sh"
[ "$(sha_of "$WHEEL_PATH")" = "$WHEEL_SHA256" ] || die "sha256 mismatch for $WHEEL_PATH"

log "extracting $MEMBER from $WHEEL"
TMP="$DEST/.unpack.$$"
rm -rf "$TMP"
mkdir -p "$TMP"
python3 - "$WHEEL_PATH" "$MEMBER" "$TMP/libtorch_npu.so" <<'EOF' || { rm -rf "$TMP"; die "could not extract $MEMBER"; }
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
got=$(sha_of "$TMP/libtorch_npu.so")
if [ "$got" != "$LIB_SHA256" ]; then
    rm -rf "$TMP"
    die "sha256 mismatch for $MEMBER: got $got, expected $LIB_SHA256"
fi
mkdir -p "$(dirname "$LIB")"
mv -f "$TMP/libtorch_npu.so" "$LIB"
rm -rf "$TMP"
echo "$STAMP_LINE" > "$STAMP.tmp"
mv -f "$STAMP.tmp" "$STAMP"
echo "$LIB"
