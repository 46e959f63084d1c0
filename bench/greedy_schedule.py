#!/usr/bin/env python3
"""A greedy eviction schedule with link prices, written as a plan for
`u3m replay --policy plan --plan FILE`: the kind of planner an online
engine could run over its model of the step, set beside the pipeline
bound's LP optimum (bench/plan_schedule.py) through the same pipeline.
usage: bench/greedy_schedule.py [--from S] [--windows W] [--iters N]
                                [--eta E] HBM_BYTES TRACE OUT

The chunk model is bench/min_bounds.py's (`load`): 2 MiB chunks, a call's
chunks all in HBM together, a whole write needs no copy-in, a chunk never
written nothing to copy. The trace is walked once per pass with HBM_BYTES
of chunks; when a call needs room, the resident chunk the call does not
touch with the highest

    (device time to its next access) / (price of its copy-in + price of its copy-out)

leaves: the copy-in priced only if the next access reads it (not a whole
write) and there is data to read, the copy-out only if it is dirty (u3m
copies out dirty data even when it is dead: it is not told). First go
clean chunks never used again, then clean ones whose next access writes
them whole (nothing to pay either way), then dirty ones never used again
(their copy-out only), then the rest by the ratio. The device times are `load`'s (the replay's 910B4 cost model). Each eviction
becomes a plan line `LINE ADDR`: the chunk at ADDR leaves after its last
use before the eviction, on trace line LINE (as plan_schedule.py's lines;
the replay evicts it once that use completes). Lines are written for the
evictions of steps S (default 1) on; earlier ones run as the replay's
Belady order.

Prices: the step from S's marker is cut into W windows (default 2) by call
position, each with a price per direction, all 1 in the first pass. After
a pass, each window's copy-ins (charged to the window of the access that
needs them) and copy-outs (charged to the window of the last use before
the eviction), per step, at 25 GB/s, are set against the window's device
time: a price is multiplied by (link time / device time) ** E (default
0.5), and the prices renormalised to mean 1. N passes (default 8) follow
the first; the plan written is the pass whose estimate — the sum over
windows of max(device time, copy-in time, copy-out time) — is least.

This is an instrument, not the engine's planner: BENCHMARKS.md (thirty-
eighth sitting) has what its schedules cost against the LP's. Prints each
pass's bytes per step and estimate to stderr."""
import bisect, heapq, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import min_bounds as mb  # noqa: E402
import joint_bound as jb  # noqa: E402
import plan_schedule as ps  # noqa: E402

CH = mb.CH
INF = mb.INF
LINK = 25e3 / CH   # chunks per µs at 25 GB/s


def schedule(calls, times, cap, step1, n, lin, lout):
    """One pass: (plan [(call of the last use, key)], copy-ins and copy-outs
    per window, counted from `step1` on)."""
    W = len(lin)
    acc = mb.accesses(calls)
    clock = [0.0]
    for x in times:
        clock.append(clock[-1] + x)

    def win(t):
        return ((t - step1) % n) * W // n if t >= step1 else None

    def price(p, t):
        w = win(t)
        return 1.0 if w is None else p[w]

    res, dirty, hosted, heap, ver, last = set(), set(), set(), [], {}, {}
    plan, ins, outs = [], [0] * W, [0] * W

    def key_of(c, t):
        """The heap key of chunk c after its access at call t (higher:
        leaves sooner)."""
        lst = acc[c]
        k = bisect.bisect_right(lst, (t, True))
        if k >= len(lst):
            return INF if c not in dirty else INF // 2
        nt, need = lst[k]
        reads = need and (c in dirty or c in hosted)
        cost = (price(lin, nt) if reads else 0.0) + (price(lout, t) if c in dirty else 0.0)
        if cost == 0:
            return INF - 1
        return int((clock[nt] - clock[t + 1] + 1.0) * 1000 / cost)

    for t, (kind, c) in enumerate(calls):
        if kind == 'free':
            for key in c:
                res.discard(key)
                dirty.discard(key)
                hosted.discard(key)
            continue
        for key, (_w, whole) in c.items():
            if key in res:
                continue
            if len(res) >= cap:
                e = mb.top_victim(heap, res, ver, c)
                if e is None:
                    sys.exit(f"call {t} touches more chunks than HBM holds ({cap})")
                v = e[1]
                res.discard(v)
                if v in dirty:
                    dirty.discard(v)
                    hosted.add(v)
                    if last[v] >= step1:
                        outs[win(last[v])] += 1
                if last[v] >= step1:
                    plan.append((last[v], v))
            if not whole and key in hosted and t >= step1:
                ins[win(t)] += 1
            res.add(key)
        for key, (w, whole) in c.items():
            last[key] = t
            if w:
                dirty.add(key)
                if whole:
                    hosted.discard(key)
        for key in c:
            v = ver.get(key, 0) + 1
            ver[key] = v
            heapq.heappush(heap, (-key_of(key, t), key, v))
    return plan, ins, outs


def main(argv):
    first, W, iters, eta, pos = 1, 2, 8, 0.5, []
    while argv:
        x = argv.pop(0)
        if x in ('--from', '--windows', '--iters', '--eta') and argv:
            v = argv.pop(0)
            if x == '--from':
                first = int(v)
            elif x == '--windows':
                W = int(v)
            elif x == '--iters':
                iters = int(v)
            else:
                eta = float(v)
        elif x.startswith('-'):
            sys.exit(__doc__)
        else:
            pos.append(x)
    if len(pos) != 3 or W < 1 or iters < 0:
        sys.exit(__doc__)
    hbm, path, out = mb.parse_size(pos[0]), pos[1], pos[2]
    times = []
    calls = mb.load(path, times)
    lines = ps.call_lines(path)
    if len(lines) != len(calls):
        sys.exit(f"{path}: {len(lines)} call lines against {len(calls)} calls")
    step1, step2 = jb.window_start(path, first), jb.window_start(path, first + 1)
    n = step2 - step1
    if n < W:
        sys.exit(f"{path}: step {first} has {n} calls, fewer than {W} windows")
    steps = (len(calls) - step1) / n
    device = [0.0] * W
    for t in range(step1, step2):
        device[(t - step1) * W // n] += times[t] + 1.0
    lin, lout = [1.0] * W, [1.0] * W
    best = None
    for it in range(iters + 1):
        plan, ins, outs = schedule(calls, times, hbm // CH, step1, n, lin, lout)
        tin = [k / steps / LINK for k in ins]
        tout = [k / steps / LINK for k in outs]
        est = sum(max(device[w], tin[w], tout[w]) for w in range(W))
        gi, go = sum(ins) * CH / 2**30, sum(outs) * CH / 2**30
        print(f"pass {it}: in {gi / steps:.3f} / out {go / steps:.3f} GiB a step "
              f"({gi:.4f} / {go:.4f} GiB from step {first}), estimate {est / 1e3:.1f} ms",
              file=sys.stderr)
        if best is None or est < best[0]:
            best = (est, plan, it)
        for w in range(W):
            lin[w] *= max(tin[w] / device[w], 0.05) ** eta
            lout[w] *= max(tout[w] / device[w], 0.05) ** eta
        mean = (sum(lin) + sum(lout)) / (2 * W)
        lin = [p / mean for p in lin]
        lout = [p / mean for p in lout]
    est, plan, it = best
    with open(out, 'w') as fo:
        fo.write(f"# bench/greedy_schedule.py: {path} at HBM {hbm}, {W} windows, "
                 f"pass {it} of {iters + 1}\n")
        for t, (base, _gen, i) in sorted(plan):
            fo.write(f"{lines[t]} {base + i * CH:#x}\n")
    print(f"{path}: pass {it} written ({est / 1e3:.1f} ms estimated), {len(plan)} lines to {out}",
          file=sys.stderr)


if __name__ == '__main__':
    main(sys.argv[1:])
