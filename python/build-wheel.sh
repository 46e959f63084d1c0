#!/usr/bin/env bash
# Builds the u3m wheel into DIR (default target/wheels): libu3m.so first (the
# root crate), copied into the wheel's data, then maturin builds the u3m
# binary and packs both with the python/u3m package. maturin comes from PyPI
# into a build venv cached under ~/.cache/u3m. Prints the wheel's path.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-target/wheels}")
cache=${U3M_CACHE:-$HOME/.cache/u3m}
venv=$cache/maturin-venv
if [ ! -x "$venv/bin/maturin" ]; then
    # no pip of its own (ensurepip is slow): the machine's pip installs into it
    python3 -m venv --without-pip "$venv" >&2
    python3 -m pip --python "$venv/bin/python" install -q "maturin==1.16.0" >&2 || {
        rm -rf "$venv"
        python3 -m venv "$venv" >&2
        "$venv/bin/pip" install -q "maturin==1.16.0" >&2
    }
fi
cargo build --release -p u3m >&2
data=python/u3m.data/data/lib/u3m
mkdir -p "$data"
# the release profile keeps line tables for backtraces; the wheel does not need them
cp target/release/libu3m.so "$data/libu3m.so"
strip --strip-debug "$data/libu3m.so"
rm -f "$out"/u3m-*.whl
# the binary links only libc; "linux" skips the manylinux audit of a wheel
# that is meant for the machine (or distribution) it was built on
(cd python && "$venv/bin/maturin" build --release --quiet \
    --compatibility linux --out "$out" >&2)
ls "$out"/u3m-*.whl
