#!/usr/bin/env python3
"""The pipeline bound's optimum as a schedule `u3m replay --policy plan
--plan FILE` follows: what that schedule costs through the engine's
pipeline, against the LP's figure (docs/replay.md, `--plan`).
usage: bench/plan_schedule.py [--step K] [--from S] [--no-at-eviction]
                              [--min-gap-us G] HBM_BYTES TRACE OUT

bench/pipeline_bound.py solves step K (default 3) of TRACE as a cycle; its
optimum has, per group of chunks alike and per gap between two of their
uses, a number of chunks out of HBM (fractional: rounded to the nearest).
Each such chunk-gap becomes a line `LINE ADDR` of OUT: after the event on
trace line LINE (the use before the gap) the 2 MiB chunk at trace address
ADDR leaves HBM until its next use. The cycle is written for every step
from S (default 1) to the trace's last, each step's own lines (a step with
another number of calls than K's is left out, said on stderr); the steps
before S run as belady. `--copy-out-at-eviction` is the default here (the
bound for u3m's pipeline); `--no-at-eviction` solves the looser one.
`--min-gap-us G`: the LP keeps in HBM every chunk whose gap before its
next use takes less than G µs of device time (the calls between its two
uses, under min_bounds' cost model). A host running ahead of the device
issues that next use before the use ending the gap has run; if the chunk
had been given up, its address could not map new HBM until that use ends
(aclrtMapMem waits for the host), so the host waits and its lead is gone.
The optimum so constrained is not a bound on every schedule; it is the
schedule the hand-off of BENCHMARKS.md's thirty-eighth and thirty-ninth
sittings can follow (G = 30000 on the 8-layer LoRA).
Prints the LP's figures and what was written to stderr."""
import os, re, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import min_bounds as mb  # noqa: E402
import joint_bound as jb  # noqa: E402
import pipeline_bound as pb  # noqa: E402


def call_lines(path):
    """The trace line of each call `mb.load` lists, in its order."""
    out = []
    for ln, line in enumerate(open(path), 1):
        f = line.split()
        if not f or f[0].startswith('#'):
            continue
        if f[0] in ('F', 'O', 'S') or (f[0] == 'M' and f[1] in ('D2H', 'D2D', 'H2D')
                                       and int(f[4]) > 0):
            out.append(ln)
    return out


def main(argv):
    step, first, at_ev, pos, mg = 3, 1, True, [], 0.0
    while argv:
        x = argv.pop(0)
        if x == '--step':
            step = int(argv.pop(0))
        elif x == '--from':
            first = int(argv.pop(0))
        elif x == '--min-gap-us':
            mg = float(argv.pop(0))
        elif x == '--no-at-eviction':
            at_ev = False
        elif x.startswith('-'):
            sys.exit(__doc__)
        else:
            pos.append(x)
    if len(pos) != 3:
        sys.exit(__doc__)
    hbm, path, out = mb.parse_size(pos[0]), pos[1], pos[2]
    times = []
    calls = mb.load(path, times)
    lines = call_lines(path)
    if len(lines) != len(calls):
        sys.exit(f"{path}: {len(lines)} call lines against {len(calls)} calls")
    a, b = jb.window_start(path, step), jb.window_start(path, step + 1)
    keys = []
    n, touched, groups = pb.cycle(calls, a, b, keys)
    beta = 25.0 * 1e3 / mb.CH
    r = pb.solve(n, touched, groups, times[a:b], hbm // mb.CH, beta, jb.alloc_tags(path), at_ev, mg)
    lp = r["lp"]
    plan, frac = [], 0.0
    for j, gap in enumerate(lp["gaps"]):
        m, s = gap[0], gap[1]
        x = float(lp["out"][j])
        frac += x
        cnt = min(m, int(x + 0.5))
        for key in keys[lp["owner"][j]][:cnt]:
            # (alloc base, generation, chunk index): out after use s - 1
            plan.append(((s - 1) % n, key[0] + key[2] * mb.CH))
    text = open(path).read()
    steps = 1 + max(int(m.group(1)) for m in re.finditer(r"^# train step (\d+):", text, re.M))
    starts = [jb.window_start(path, t) for t in range(steps)] + [len(calls)]
    written = 0
    with open(out, 'w') as fo:
        fo.write(f"# bench/plan_schedule.py: {path} step {step} at HBM {hbm}, "
                 f"the LP's {r['step_us'] / 1e3:.1f} ms\n")
        for t in range(first, steps):
            if starts[t + 1] - starts[t] != n:
                print(f"step {t}: {starts[t + 1] - starts[t]} calls, not {n}: left out",
                      file=sys.stderr)
                continue
            for last, addr in plan:
                fo.write(f"{lines[starts[t] + last]} {addr:#x}\n")
                written += 1
    if mg:
        print(f"--min-gap-us {mg:g}: {lp['held_gaps']} of {len(lp['gaps'])} gaps kept in HBM",
              file=sys.stderr)
    print(f"{path}: step {step}, HBM {hbm // mb.CH} chunks: the LP's optimum {r['step_us'] / 1e3:.1f} ms, "
          f"in {r['in_gib']:.3f} / out {r['out_gib']:.3f} GiB; {len(plan)} chunk-gaps out a step "
          f"({frac:.1f} in the LP); {written} lines for steps {first}..{steps - 1} to {out}",
          file=sys.stderr)


if __name__ == '__main__':
    main(sys.argv[1:])
