"""u3m: transparent three-tier memory for Ascend NPU processes.

The wheel installs the ``u3m`` command (``u3m run -- python train.py``) and
libu3m.so. Launchers that set LD_PRELOAD themselves use ``preload_path()``::

    env["LD_PRELOAD"] = u3m.preload_path()
"""

import os
import shutil
import sys
import sysconfig

__all__ = ["preload_path", "binary_path", "__version__"]
__version__ = "0.1.0"


def _prefixes():
    # where pip put the wheel's data and scripts: this interpreter's scheme
    # first, then the user scheme and the plain prefixes
    seen = []
    for p in (
        sysconfig.get_paths().get("data"),
        sysconfig.get_paths(scheme=sysconfig.get_preferred_scheme("user")).get("data")
        if hasattr(sysconfig, "get_preferred_scheme")
        else None,
        sys.prefix,
        sys.base_prefix,
    ):
        if p and p not in seen:
            seen.append(p)
    return seen


def preload_path():
    """Absolute path of the installed libu3m.so (for LD_PRELOAD)."""
    for prefix in _prefixes():
        p = os.path.join(prefix, "lib", "u3m", "libu3m.so")
        if os.path.isfile(p):
            return p
    raise FileNotFoundError(
        "libu3m.so is not installed in %s (reinstall the u3m wheel)"
        % " or ".join(os.path.join(p, "lib", "u3m") for p in _prefixes())
    )


def binary_path():
    """Absolute path of the installed ``u3m`` command."""
    for prefix in _prefixes():
        p = os.path.join(prefix, "bin", "u3m")
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    scripts = sysconfig.get_paths().get("scripts")
    if scripts and os.path.isfile(os.path.join(scripts, "u3m")):
        return os.path.join(scripts, "u3m")
    found = shutil.which("u3m")
    if found:
        return found
    raise FileNotFoundError("the u3m command is not installed (reinstall the u3m wheel)")
