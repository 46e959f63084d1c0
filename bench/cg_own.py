#!/usr/bin/env python3
"""What u3m itself executes per hooked call, from a callgrind run of
hookbench: the inclusive Ir of libu3m.so's wrapper of FN (default
aclopExecuteV2) less the inclusive Ir of the real FN it calls
(libascendcl.so), divided by CALLS. Unlike the whole window's difference
(bench/engine_v2.sh --only call, which counts other threads' work too and
moves by +-150 Ir per call between runs of one binary), this repeats to
about +-10 Ir. BENCHMARKS.md `fast5`.

  valgrind --tool=callgrind --collect-atstart=no --toggle-collect=hb_measure \\
      --callgrind-out-file=F.cg hookbench --case aclop_4 --iters 4000 ...
  bench/cg_own.py F.cg 4000 [FN] [--less-deferred]

--less-deferred: also less the model and heat updates the calling threads
ran for the background applier (the inclusive Ir of `after_call` and
`HeatTable::apply` called from u3m's other code): those run on a caller
only when the applier lags, which under callgrind's one-thread-at-a-time
schedule varies from run to run. What is left repeats to about +-5 Ir
(2,065 and 2,015 Ir with them, 1,599 and 1,603 without, for two runs of
one library; BENCHMARKS.md, thirty-fifth sitting). It is the "own less
deferred" figure of earlier sittings, whose script lived in /tmp.
"""
import collections, re, sys

# the applier's work when a caller does it (`--less-deferred`)
DEFERRED = re.compile(r"Placement>::after_call|HeatTable>::apply")


def own(cg, name, less_deferred=False):
    obs, fns = {}, {}

    def ref(tab, v):
        m = re.match(r"\((\d+)\)(?: (.*))?", v)
        if m.group(2) is not None:
            tab[m.group(1)] = m.group(2)
        return tab[m.group(1)]

    ob = fn = cob = cfn = None
    pending = False
    self_ir = collections.Counter()
    call_ir = collections.Counter()
    for line in open(cg):
        line = line.rstrip("\n")
        if not line:
            continue
        if line.startswith("ob="):
            ob, cob = ref(obs, line[3:]), None
            continue
        if line.startswith("fn="):
            fn, cob = ref(fns, line[3:]), None
            continue
        if line.startswith("cob="):
            cob = ref(obs, line[4:])
            continue
        if line.startswith("cfn="):
            cfn = ref(fns, line[4:])
            continue
        if line.startswith(("cfi=", "cfl=", "fi=", "fe=", "fl=")):
            continue
        if line.startswith("calls="):
            pending = True
            continue
        if line[0] in "0123456789+-*":
            ir = int(line.split()[-1]) if len(line.split()) > 1 else 0
            if pending:
                # the inclusive cost of the call just named
                pending = False
                call_ir[(ob, fn, cob or ob, cfn)] += ir
                cob = None
            else:
                self_ir[(ob, fn)] += ir
    u3m = next(o for o in set(obs.values()) if "libu3m" in o)
    acl = next(o for o in set(obs.values()) if "libascendcl" in o)
    wrapper = self_ir[(u3m, name)] + sum(
        c for (o, f, co, cf), c in call_ir.items()
        if o == u3m and f == name and not (co == u3m and cf == name))
    real = sum(c for (o, f, co, cf), c in call_ir.items()
               if o == u3m and co == acl and cf == name)
    deferred = sum(c for (o, f, co, cf), c in call_ir.items()
                   if o == u3m and DEFERRED.search(cf) and not DEFERRED.search(f))
    return wrapper - real - (deferred if less_deferred else 0)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--less-deferred"]
    if len(args) < 2:
        sys.exit(__doc__)
    fn = args[2] if len(args) > 2 else "aclopExecuteV2"
    less = "--less-deferred" in sys.argv[1:]
    print("%.0f" % (own(args[0], fn, less) / float(args[1])))
