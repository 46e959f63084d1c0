#!/usr/bin/env python3
"""Per-thread Ir of a callgrind run with --separate-threads=yes
(`CG_THREADS=1 bench/cg_call.sh ...`): each OUT.cg-NN file's total, named
by the first thread entry point found in it (hookbench's `thread_main`,
u3m's `Publisher::main` or `applier`), and per call when CALLS is given.
BENCHMARKS.md `fast7`.

  bench/cg_threads.py OUT.cg [CALLS]
"""
import glob, re, sys

NAMES = [
    ("apply_deferred", "u3m-apply"),
    ("Publisher::main", "u3m-publish"),
    ("thread_main", "hookbench worker"),
    ("__libc_start_main", "main"),
]


def main():
    base = sys.argv[1]
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    by = {}
    for f in sorted(glob.glob(base + "-*")):
        total, name = 0, "other"
        text = open(f).read()
        m = re.search(r"^totals: (\d+)", text, re.M) or re.search(r"^summary: (\d+)", text, re.M)
        if m:
            total = int(m.group(1))
        # a function runs in this thread if a fn= line names it (callgrind
        # compresses names: the first mention, fn= or cfn=, carries it)
        ids = {}
        for m in re.finditer(r"^c?fn=\((\d+)\) ([^\n]*)", text, re.M):
            ids[m.group(1)] = m.group(2)
        ran = {ids.get(i, "") for i in re.findall(r"^fn=\((\d+)\)", text, re.M)}
        for key, label in NAMES:
            if any(key in n for n in ran):
                name = label
                break
        per = " %10.1f Ir per call" % (total / calls) if calls else ""
        print("%-20s %-16s %14d Ir%s" % (f.rsplit("/", 1)[-1], name, total, per))
        by[name] = by.get(name, 0) + total
    for name, total in by.items():
        per = " %10.1f Ir per call" % (total / calls) if calls else ""
        print("%-20s %-16s %14d Ir%s" % ("all", name, total, per))


if __name__ == "__main__":
    main()
