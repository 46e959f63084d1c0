# Sourced by the ci/ scripts: makes sure a fresh machine has what the build and
# the tests need (a C compiler, python3 with pip for the ABI test's header
# download and scipy, tmux for the test that reads `u3m top`'s screen). The Rust
# toolchain comes with the machine.
ensure_prereqs() {
    local missing=()
    command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
    command -v python3 >/dev/null 2>&1 || missing+=(python3)
    python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
    command -v g++ >/dev/null 2>&1 || missing+=(g++)
    command -v nm >/dev/null 2>&1 || missing+=(binutils)
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
    command -v tmux >/dev/null 2>&1 || missing+=(tmux)
    if ((${#missing[@]})); then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "installing: ${missing[*]}" >&2
            apt-get update -qq >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
        else
            echo "missing: ${missing[*]} (install them, or run as root on Debian/Ubuntu)" >&2
            return 1
        fi
    fi
    # bench/joint_bound.py's LP (tests/bounds.rs): scipy's HiGHS, from PyPI
    if ! python3 -c 'import scipy.optimize' >/dev/null 2>&1; then
        echo "installing: scipy (python3 -m pip)" >&2
        python3 -m pip install --quiet scipy >&2 || {
            echo "could not install scipy: python3 -m pip install scipy" >&2
            return 1
        }
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        echo "cargo not found: install a Rust toolchain (https://rustup.rs)" >&2
        return 1
    fi
}

# The ecosystem tests' tools (tests/exporter.rs, tests/report.rs): Debian's
# prometheus (with promtool) and chromium + chromium-driver. Installed as root
# when missing (--no-install-recommends: ~35 s on the 2-core CI machine);
# U3M_SKIP_PROMETHEUS / U3M_SKIP_BROWSER skip both the install and the tests.
ensure_test_tools() {
    local missing=()
    if [ -z "${U3M_SKIP_PROMETHEUS:-}" ]; then
        command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 ||
            missing+=(prometheus)
    fi
    if [ -z "${U3M_SKIP_BROWSER:-}" ]; then
        command -v chromium >/dev/null 2>&1 || missing+=(chromium chromium-driver)
    fi
    ((${#missing[@]})) || return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing: ${missing[*]}" >&2
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    else
        echo "missing: ${missing[*]} (install them as root, or set U3M_SKIP_PROMETHEUS=1 / U3M_SKIP_BROWSER=1)" >&2
        return 1
    fi
}
