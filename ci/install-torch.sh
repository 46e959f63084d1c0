#!/usr/bin/env bash
# Install PyTorch and torch_npu for the torch_npu test tier (tests/torch_npu.rs,
# docs/torch-npu.md) into a venv in the cache directory outside the checkout,
# and print the venv's python on stdout (the only line on stdout). The LLM
# tests' models come from transformers (pinned below; about 27 MB more, added
# to an existing venv without touching torch).
#
#   ci/install-torch.sh            install if missing, print the interpreter
#
# Venv: ${U3M_CACHE:-$HOME/.cache/u3m}/torch-venv, reused by every checkout
# (and a fresh clone) on the machine. torch==2.14.0's only x86-64 build on
# PyPI is the CUDA one: the first install downloads about 5.5 GB (torch, the
# nvidia-* wheels it depends on, torch-npu). Later runs only check it.
# Runs are serialised with flock, so parallel tests are safe.
set -euo pipefail

TORCH_VERSION=2.14.0
TORCH_NPU_VERSION=2.14.0
# the newest release when the LLM tests were written; it installs beside
# torch 2.14.0 without changing it (tests/torch/llm.py)
TRANSFORMERS_VERSION=5.24.0

die() { echo "install-torch: error: $*" >&2; exit 1; }
log() { echo "install-torch: $*" >&2; }

CACHE=${U3M_CACHE:-$HOME/.cache/u3m}
VENV=$CACHE/torch-venv
mkdir -p "$CACHE" || die "cannot create the cache directory $CACHE"

command -v python3 >/dev/null 2>&1 || die "python3 not found"
command -v flock >/dev/null 2>&1 || die "flock not found (util-linux)"

exec 9>"$CACHE/torch-venv.lock"
flock -w 3600 9 || die "timed out waiting for the lock on $CACHE/torch-venv.lock"

# Ready: the interpreter runs and both distributions are installed at the
# pinned versions, with no interrupted install pending.
is_ready() {
    [ -x "$VENV/bin/python" ] && [ ! -e "$VENV/.u3m-installing" ] || return 1
    "$VENV/bin/python" - "$TORCH_VERSION" "$TORCH_NPU_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
t = version("torch")
assert t == sys.argv[1] or t.startswith(sys.argv[1] + "+"), t
assert version("torch-npu") == sys.argv[2]
EOF
}

# The extras the LLM tests import, at their pinned versions.
extras_ready() {
    "$VENV/bin/python" - "$TRANSFORMERS_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("transformers") == sys.argv[1]
EOF
}

if ! is_ready; then
    if [ -e "$VENV" ]; then
        log "removing the incomplete venv $VENV"
        rm -rf "$VENV"
    fi
    log "creating $VENV and installing torch==$TORCH_VERSION torch-npu==$TORCH_NPU_VERSION from PyPI"
    log "(first time only: about 5.5 GB to download; progress in $CACHE/torch-install.log)"
    python3 -m venv "$VENV" >&2 || die "python3 -m venv failed (install python3-venv)"
    touch "$VENV/.u3m-installing"
    set +e
    {
        "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
            "torch==$TORCH_VERSION" "torch-npu==$TORCH_NPU_VERSION" pyyaml numpy \
            "transformers==$TRANSFORMERS_VERSION"
        echo "exit=$?"
    } >"$CACHE/torch-install.log" 2>&1
    set -e
    if ! grep -q '^exit=0$' "$CACHE/torch-install.log"; then
        tail -n 20 "$CACHE/torch-install.log" >&2
        die "pip could not install torch==$TORCH_VERSION torch-npu==$TORCH_NPU_VERSION (see $CACHE/torch-install.log): is PyPI reachable? Set U3M_SKIP_TORCH=1 to skip the torch_npu tests offline."
    fi
    rm -f "$VENV/.u3m-installing"
    is_ready || die "the venv at $VENV does not hold torch $TORCH_VERSION and torch-npu $TORCH_NPU_VERSION after installing"
    log "installed"
fi

if ! extras_ready; then
    # a venv from before the LLM tests: add transformers (torch stays as it is)
    log "adding transformers==$TRANSFORMERS_VERSION to $VENV (about 27 MB; log in $CACHE/torch-install.log)"
    set +e
    {
        "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
            "transformers==$TRANSFORMERS_VERSION"
        echo "exit=$?"
    } >>"$CACHE/torch-install.log" 2>&1
    set -e
    if ! tail -n 1 "$CACHE/torch-install.log" | grep -q '^exit=0$'; then
        tail -n 20 "$CACHE/torch-install.log" >&2
        die "pip could not install transformers==$TRANSFORMERS_VERSION (see $CACHE/torch-install.log): is PyPI reachable? Set U3M_SKIP_TORCH=1 to skip the torch_npu tests offline."
    fi
    is_ready || die "installing transformers changed torch or torch-npu in $VENV"
    extras_ready || die "the venv at $VENV does not hold transformers $TRANSFORMERS_VERSION after installing"
    log "transformers installed"
fi

echo "$VENV/bin/python"
