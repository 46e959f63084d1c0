"""``python -m u3m ARGS``: the ``u3m`` command with ARGS (``python -m u3m run
-- python train.py``), with the installed libu3m.so."""

import os
import sys

from . import binary_path, preload_path


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    exe = binary_path()
    # `u3m run` finds libu3m.so itself (../lib/u3m/ from the binary); say
    # which one when the wheel's data went elsewhere (a --user install)
    if argv[:1] == ["run"] and "--lib" not in argv:
        try:
            lib = preload_path()
        except FileNotFoundError as e:
            sys.stderr.write("u3m: %s\n" % e)
            return 1
        argv = ["run", "--lib", lib] + argv[1:]
    os.execv(exe, [exe] + argv)


if __name__ == "__main__":
    sys.exit(main())
