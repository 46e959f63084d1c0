#!/usr/bin/env python3
"""A lower bound on the busier direction of the link, both directions at once,
for any residency schedule that is not told which data is dead (u3m without
hints): an LP relaxation, solved with HiGHS (pip install scipy).
usage: bench/joint_bound.py [--json] [--link-gbps G] [--from-step K] [--by-tag] HBM_BYTES TRACE
       bench/joint_bound.py --selftest
bench/min_bounds.py bounds each direction alone; each of its bounds is reached
only by giving up the other direction (in_demand drops dead data freely, which
costs copy-outs; out_bound keeps every epoch, which costs copy-ins and HBM). A
step takes at least max(bytes in, bytes out) / link (the two directions run
at the link rate each), so what bounds the step is the least max over one
schedule. Chunk model and costs are min_bounds.py's (its `load`):
- every chunk a call touches is in HBM during the call (at most HBM / 2 MiB);
- a chunk out of HBM between two calls that touch it is out for the whole gap
  (leaving later or coming back sooner frees no more HBM for the same bytes);
- coming back costs a copy-in unless the call writes the chunk whole or the
  chunk was never written;
- an epoch (a chunk's contents from one write to its next write or free) is
  copied out once if the chunk leaves HBM anywhere within it.
x_g in [0, 1] is the share of gap g spent out (chunks with the same accesses
are one variable of their count), y_e the epoch's copy-out. The covering
constraints at each call are written as a running sum (O(gaps + calls)).
The integral schedules are feasible at their own bytes, so the LP's optimum
is at most any schedule's max(in, out).

--from-step K counts only bytes of the calls from the trace's `# train step K:`
marker on (the issue's windows: K = 1 on a 3-step trace is steps 2-3, K = 3 on
a 5-step trace steps 4-5): copy-ins for accesses in the window, copy-outs of
epochs whose first gap spent out starts in it (y_e >= x_g - the epoch's gaps
out before the window). The window's bytes then bound its steady state per
step; a prefetch started before the window is counted at its access, which
evens out over a steady step."""
import importlib.util, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("min_bounds", os.path.join(HERE, "min_bounds.py"))
mb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mb)
CH = mb.CH


def window_start(path, step):
    """Index in `mb.load(path)`'s calls of the `# train step STEP:` marker."""
    return call_index(path, "# train step %d:" % step)


def call_index(path, mark):
    """Index in `mb.load(path)`'s calls of the first line starting `mark`."""
    lines = []
    with open(path) as f:
        for line in f:
            if line.startswith(mark):
                break
            lines.append(line)
        else:
            sys.exit(f"{path}: no '{mark}' marker")
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".trace", delete=False) as tmp:
        tmp.writelines(lines)
    try:
        return len(mb.load(tmp.name))
    finally:
        os.unlink(tmp.name)


def alloc_tags(path):
    """Allocation generation (as `mb.load` numbers them) -> its `tag=`."""
    tags, gen = {}, 0
    for line in open(path):
        if line.startswith("A "):
            gen += 1
            t = [f[4:] for f in line.split()[3:] if f.startswith("tag=")]
            tags[gen] = t[0] if t else "?"
    return tags


def gaps(calls):
    """Groups of chunks with the same accesses: [(count, gaps, epochs, the
    members' allocation generations)] where
    a gap is (first call out, last call out, copy-in on return?, epoch index,
    access call it returns for or None) and there are `epochs` epochs; and per
    call the number of chunks it touches."""
    acc, freed = {}, {}
    for t, (kind, c) in enumerate(calls):
        if kind == 'free':
            for key in c:
                if key in acc:
                    freed[key] = t
        else:
            for key, (w, whole) in c.items():
                acc.setdefault(key, []).append((t, not whole, w))
    groups = {}
    for key, a in acc.items():
        sig = (tuple(a), freed.get(key))
        groups.setdefault(sig, []).append(key[1])
    end = len(calls)
    out = []
    for (a, fr), gens in groups.items():
        m = len(gens)
        gs, ep, written = [], -1, False
        for i, (t, need, w) in enumerate(a):
            if w:
                ep += 1
                written = True
            if i + 1 < len(a):
                t2, need2, _ = a[i + 1]
                last, cin, ret = t2 - 1, need2 and written, t2
            else:
                last, cin, ret = (fr if fr is not None else end) - 1, False, None
            if last >= t + 1:
                gs.append((t + 1, last, cin, ep if written else -1, ret))
        out.append((m, gs, ep + 1, gens))
    touched = [len(c) if k == 'call' else 0 for k, c in calls]
    return out, touched


def solve(calls, cap, w0=0, objective="max", tags=None, model=None):
    """(bytes in, bytes out) of the LP optimum: objective "max" the least
    max(in, out), "in" / "out" the least of one direction alone. With `tags`
    (allocation generation -> tag) also {tag: [bytes in, bytes out]}, each
    group's bytes shared among its members' tags. `model`: `gaps(calls)`,
    when the caller solves the same trace more than once."""
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix
    groups, touched = model or gaps(calls)
    n = len(calls)
    # variables: x (gaps), y (epochs), P (running sum of x spent out at each call), z
    xs, ys, yg, share = [], [], [], []
    for gi, (m, gs, neps, gens) in enumerate(groups):
        base = len(ys)
        ys += [m] * neps
        yg += [gi] * neps
        for g in gs:
            xs.append((m, g, base))
            share.append(gi)
    nx, ny = len(xs), len(ys)
    ix, iy, ip, iz = 0, nx, nx + ny, nx + ny + n
    nv = iz + 1
    # demand per call: chunks that stay in HBM unless out, plus those touched
    span = np.zeros(n + 1)
    for m, (s, e, _c, _ep, _r), _b in xs:
        span[s] += m
        span[e + 1] -= m
    demand = np.cumsum(span)[:n] + np.array(touched) - cap
    if max(np.array(touched) - cap) > 0:
        sys.exit("a call touches more chunks than HBM holds")
    # P_t - P_{t-1} - sum x starting at t + sum x ending at t-1 = 0
    er, ec, ev = [], [], []
    for t in range(n):
        er.append(t), ec.append(ip + t), ev.append(1.0)
        if t:
            er.append(t), ec.append(ip + t - 1), ev.append(-1.0)
    for j, (m, (s, e, _c, _ep, _r), _b) in enumerate(xs):
        er.append(s), ec.append(ix + j), ev.append(-1.0)
        if e + 1 < n:
            er.append(e + 1), ec.append(ix + j), ev.append(1.0)
    A_eq = coo_matrix((ev, (er, ec)), shape=(n, nv)).tocsr()
    b_eq = np.zeros(n)
    # in / out rows and the epochs' y_e >= x_g - (x out before the window)
    ur, uc, uv, b_ub = [], [], [], []
    row = 0
    in_cols, out_cols = [], []
    for j, (m, (s, e, cin, ep, ret), base) in enumerate(xs):
        if cin and ret is not None and ret >= w0:
            in_cols.append(ix + j)
    pre = {}
    for j, (m, (s, e, cin, ep, ret), base) in enumerate(xs):
        if ep >= 0 and s < w0:
            pre.setdefault(base + ep, []).append(ix + j)
    for j, (m, (s, e, cin, ep, ret), base) in enumerate(xs):
        if ep >= 0 and s >= w0:
            # x_g - sum(pre) - y_e <= 0
            ur += [row, row]
            uc += [ix + j, iy + base + ep]
            uv += [1.0, -1.0]
            for p in pre.get(base + ep, ()):
                ur.append(row), uc.append(p), uv.append(-1.0)
            b_ub.append(0.0)
            row += 1
    out_cols = [iy + k for k in range(ny)]
    c = np.zeros(nv)
    if objective == "max":
        for cols in (in_cols, out_cols):
            for col in cols:
                ur.append(row), uc.append(col), uv.append(1.0)
            ur.append(row), uc.append(iz), uv.append(-1.0)
            b_ub.append(0.0)
            row += 1
        c[iz] = 1.0
    elif objective == "in":
        c[in_cols] = 1.0
    else:
        c[out_cols] = 1.0
    A_ub = coo_matrix((uv, (ur, uc)), shape=(row, nv)).tocsr() if row else None
    bounds = [(0, m) for m, _g, _b in xs] + [(0, m) for m in ys] + \
        [(max(0.0, d), None) for d in demand] + [(0, None)]
    r = linprog(c, A_ub=A_ub, b_ub=b_ub if row else None, A_eq=A_eq, b_eq=b_eq,
                bounds=bounds, method="highs")
    if r.status != 0:
        sys.exit(f"LP not solved: {r.message}")
    if objective == "max":
        # of the schedules with that busier direction, the fewest bytes in all
        # (the optimum of max(in, out) alone leaves the other direction loose)
        c = np.zeros(nv)
        c[in_cols] = 1.0
        c[out_cols] = 1.0
        bounds[iz] = (0, r.x[iz] * (1 + 1e-9) + 1e-6)
        r = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
        if r.status != 0:
            sys.exit(f"LP not solved: {r.message}")
    x = r.x
    bi, bo = sum(x[k] for k in in_cols) * CH, sum(x[k] for k in out_cols) * CH
    if tags is None:
        return bi, bo
    by = {}

    def add(gi, d, v):
        gens = groups[gi][3]
        for gen in gens:
            by.setdefault(tags.get(gen, "?"), [0.0, 0.0])[d] += v * CH / len(gens)
    for k in in_cols:
        add(share[k - ix], 0, x[k])
    for k in out_cols:
        add(yg[k - iy], 1, x[k])
    return bi, bo, by


def selftest(n=400):
    """Against min_bounds on random tiny traces: the copy-in LP equals
    Belady's MIN with dead-on-whole-write (an interval LP is integral), the
    copy-out LP lies between min_bounds' bound and the brute-force fewest,
    and the joint optimum is at least each alone and at most any schedule."""
    import random
    rnd = random.Random(7)
    same = 0
    for case in range(n):
        cap, calls = mb.random_trace(rnd, 10, True)
        lin = solve(calls, cap, objective="in")[0] / CH
        belady = mb.min_in(calls, cap, False) / CH
        if lin > belady + 1e-6 or abs(lin - round(lin)) > 1e-6:
            sys.exit(f"selftest case {case}: copy-in LP {lin}, MIN {belady}: {calls} cap {cap}")
        same += abs(lin - belady) < 1e-6
        lout = solve(calls, cap, objective="out")[1] / CH
        if not mb.min_out_lb(calls, cap) - 1e-6 <= lout <= mb.min_out_brute(calls, cap) + 1e-6:
            sys.exit(f"selftest case {case}: copy-out LP {lout} outside "
                     f"[{mb.min_out_lb(calls, cap)}, {mb.min_out_brute(calls, cap)}]: {calls} cap {cap}")
        ji, jo = solve(calls, cap)
        if max(ji, jo) / CH < max(lin, lout) - 1e-6:
            sys.exit(f"selftest case {case}: joint {ji / CH}, {jo / CH} under a direction alone")
    print(f"selftest: {n} random traces: copy-in LP integral and <= min_bounds' MIN (equal on {same}), "
          "out bound <= copy-out LP <= fewest, joint >= each")


def main():
    args = sys.argv[1:]
    if args == ['--selftest']:
        return selftest()
    gbps, step, by_tag, as_json = 25.0, None, False, False
    while args and args[0].startswith('--'):
        a = args.pop(0)
        if a == '--link-gbps':
            gbps = float(args.pop(0))
        elif a == '--from-step':
            step = int(args.pop(0))
        elif a == '--by-tag':
            by_tag = True
        elif a == '--json':
            as_json = True
        else:
            sys.exit(__doc__)
    if len(args) != 2:
        sys.exit(__doc__)
    cap = mb.parse_size(args[0]) // CH
    calls = mb.load(args[1])
    w0 = window_start(args[1], step) if step is not None else 0
    ms = lambda b: b / (gbps * 1e9) * 1e3
    report = {"trace": args[1], "calls": len(calls), "window_from_call": w0, "hbm_chunks": cap}
    if not as_json:
        print(f"{args[1]}: {len(calls)} calls, window from call {w0}, HBM {cap} chunks")
    model = gaps(calls)
    for obj in ("in", "out", "max"):
        r = solve(calls, cap, w0, obj, alloc_tags(args[1]) if by_tag and obj == "max" else None, model)
        bi, bo = r[0], r[1]
        report["least_" + obj] = {"in": bi, "out": bo}
        if len(r) > 2:
            report["by_tag"] = {t: {"in": v[0], "out": v[1]} for t, v in r[2].items()}
        if as_json:
            continue
        print(f"  least {obj:>3}: in {bi / 2**30:8.3f} GiB = {ms(bi):7.1f} ms, "
              f"out {bo / 2**30:8.3f} GiB = {ms(bo):7.1f} ms; busier {ms(max(bi, bo)):7.1f} ms", flush=True)
        if len(r) > 2:
            for tag, (ti, to) in sorted(r[2].items()):
                print(f"      {tag:>10}: in {ti / 2**30:8.3f} GiB, out {to / 2**30:8.3f} GiB")
    if as_json:
        import json
        print(json.dumps(report))


if __name__ == '__main__':
    main()
