#!/usr/bin/env python3
"""Atomic read-modify-writes and thread-local lookups a callgrind run executed,
exactly: every instruction's execution count (callgrind --dump-instr=yes)
matched against objdump of its object. Counts lock-prefixed instructions,
xchg with a memory operand (an implicit lock) and calls to __tls_get_addr,
per object, divided by CALLS (valgrind counts the general-dynamic TLS
sequence's padded call instruction twice: a lookup reads 2.00 here, one call
in callgrind's call graph); --sites lists each site in OBJ (a path, e.g.
libu3m.so) with its inlined call chain (addr2line). BENCHMARKS.md `fast4`.

  valgrind --tool=callgrind --dump-instr=yes --collect-atstart=no \\
      --toggle-collect=hb_measure --callgrind-out-file=F.cg hookbench ...
  bench/cg_atomics.py F.cg CALLS [--sites OBJ]
"""
import collections, re, subprocess, sys

def counts(cg):
    obs, fns, cost, fnof = {}, {}, collections.Counter(), {}
    ob = fn = None
    addr, skip = 0, False
    def ref(tab, v):
        m = re.match(r"\((\d+)\)(?: (.*))?", v)
        if m.group(2) is not None:
            tab[m.group(1)] = m.group(2)
        return tab[m.group(1)]
    for line in open(cg):
        line = line.rstrip("\n")
        if not line:
            continue
        if line.startswith("ob="):
            ob = ref(obs, line[3:]); continue
        if line.startswith("fn="):
            fn = ref(fns, line[3:]); continue
        if line.startswith("cob="):
            ref(obs, line[4:]); continue
        if line.startswith("cfn="):
            ref(fns, line[4:]); continue
        if line.startswith(("cfi=", "cfl=")):
            continue
        if line.startswith("calls="):
            skip = True; continue  # the next cost line is the call's inclusive cost
        if line[0] in "0123456789+-*":
            f = line.split()
            a = f[0]
            if a.startswith("0x"):
                addr = int(a, 16)
            elif a[0] in "+-":
                d = int(a[1:], 16) if a[1:].startswith("0x") else int(a[1:])
                addr += d if a[0] == "+" else -d
            if skip:
                skip = False; continue
            if len(f) >= 3:
                cost[(ob, addr)] += int(f[2]); fnof[(ob, addr)] = fn
    return cost

def kind(ins):
    if ins.startswith("lock "):
        return "lock"
    if ins.startswith("xchg") and "(" in ins:
        return "xchg"
    if ins.startswith("call") and "__tls_get_addr" in ins:
        return "tls_get_addr"
    return None

def main():
    cg, calls = sys.argv[1], int(sys.argv[2])
    sites = sys.argv[sys.argv.index("--sites") + 1] if "--sites" in sys.argv else None
    cost = counts(cg)
    byob = collections.defaultdict(dict)
    for (o, a), n in cost.items():
        byob[o][a] = n
    tot = collections.Counter()
    for o, m in byob.items():
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", o], capture_output=True, text=True).stdout
        for l in dis.splitlines():
            mm = re.match(r"\s*([0-9a-f]+):\s+(.*)", l)
            if not mm or int(mm.group(1), 16) not in m:
                continue
            a, ins = int(mm.group(1), 16), mm.group(2)
            k = kind(ins)
            if not k:
                continue
            tot[(k, o.split("/")[-1])] += m[a]
            if sites and o.endswith(sites) and m[a] / calls >= 0.05:
                s = subprocess.run(["addr2line", "-i", "-f", "-C", "-e", o, hex(a)],
                                   capture_output=True, text=True).stdout.split("\n")
                fr = [s[i + 1].split("/")[-1] + " " + s[i].split("::")[-1][:32] for i in range(0, len(s) - 1, 2)]
                fr = [x for x in fr if not x.startswith(("atomic.rs", "local.rs", "function.rs", "futex.rs", "mutex.rs"))]
                print("  %5.2f %-12s %s" % (m[a] / calls, k, " <- ".join(fr[:4])))
    for (k, o), v in sorted(tot.items()):
        print("%-13s %-26s %7.2f per call" % (k, o, v / calls))

main()
