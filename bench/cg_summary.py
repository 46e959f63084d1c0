#!/usr/bin/env python3
"""Summarise a callgrind output file of hookbench (or touch_bench).

    cg_summary.py FILE            -> JSON: {"total": Ir, "objects": {obj: exclusive Ir}}

Exclusive cost per object (shared library or executable): every cost line is
charged to the object of the function it belongs to; the inclusive cost lines
that follow a `calls=` line are skipped (they are the callee's, counted where
the callee's own lines are). Only the first event (Ir) is read. With
--collect-atstart=no --toggle-collect='hb_case_*' the file holds exactly the
instructions executed inside the measured loops.
"""
import json
import sys


def summarise(path):
    objects = {}
    names = {}  # (kind, id) -> name, for callgrind's name compression
    cur_ob = "?"
    skip_next_cost = False
    total = None

    def resolve(kind, rest):
        rest = rest.strip()
        if rest.startswith("("):
            close = rest.index(")")
            ident = rest[1:close]
            name = rest[close + 1:].strip()
            if name:
                names[(kind, ident)] = name
            return names.get((kind, ident), "?")
        return rest

    with open(path, errors="replace") as f:
        for line in f:
            if not line or line[0] == "\n":
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                if skip_next_cost:
                    skip_next_cost = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    objects[cur_ob] = objects.get(cur_ob, 0) + int(parts[1])
                continue
            if line.startswith("ob="):
                cur_ob = resolve("ob", line[3:])
            elif line.startswith("cob="):
                resolve("ob", line[4:])  # registers the name only
            elif line.startswith("calls="):
                skip_next_cost = True
            elif line.startswith("totals:") or line.startswith("summary:"):
                total = int(line.split()[1])
    if total is None:
        total = sum(objects.values())
    short = {}
    for ob, ir in objects.items():
        k = ob.rsplit("/", 1)[-1]
        short[k] = short.get(k, 0) + ir
    return {"total": total, "objects": short}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: cg_summary.py CALLGRIND_OUT")
    json.dump(summarise(sys.argv[1]), sys.stdout)
    print()
