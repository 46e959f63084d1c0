#!/usr/bin/env python3
"""A lower bound on the steady step time of any residency schedule that is not
told which data is dead, with the pipeline's physics: copies take link time,
a copied-in page is held from its copy's start, an evicted dirty page until
its copy-out ends, and an operator's pages until the operator ends. An LP
over one step taken as a cycle, solved with HiGHS (pip install scipy).
usage: bench/pipeline_bound.py [--json] [--link-gbps G] [--step K]
                               [--copy-out-at-eviction] [--held] HBM_BYTES TRACE
       bench/pipeline_bound.py --selftest

bench/joint_bound.py bounds the bytes; a step takes at least those bytes at
the link rate. That bound lets a chunk come back at the instant the call
that needs it starts, so HBM never holds a copy in transit, and the LP it
solves fills HBM to the last page at most calls. Here the calls run in
stream order with the replay's device times d_k (`min_bounds.load`'s
times), and a stall s_k >= 0 may precede call k; the step is sum(d + s).
Chunk model as joint_bound's (a chunk out between two calls that touch it
is out for the whole gap; an epoch is copied out once if the chunk leaves
HBM within it), over step K's calls as a cycle: an allocation the step
makes and frees is as in joint_bound; one that outlives the step wraps from
its last access to its first. A chunk the step never writes costs no
copy-out (its host copy stays valid). At the instant before call k ends:

  touched_k + (chunks whose gaps span k, less those out)
            + B_k (bytes already copied in for later calls)
            + D_k (evicted right after a write, copy-out not yet done) <= HBM

where, per direction at the link rate b (each way):
  B_k >= R_{k+1} - b s_{k+1}                (R: copy-ins call k+1 waits for)
  B_k >= R_{k+1} + B_{k+1} - b (d + s)_{k+1}
  D_k >= D_{k-1} + O_{k-1} - b (d + s)_k    (O: copy-outs released as k-1 ends)
  Q_k >= Q_{k-1} + E_{k-1} - b (d + s)_k    (E: every copy-out of an epoch
                                             its write at k-1 starts)
Each holds for every physical schedule (a copy-out cannot start before the
write it saves ends; a copy-in done before call k ends holds its page; a
page evicted right after its write is held until the copy-out ends; a
copy-out later in the epoch may have been done while the page was resident,
so it is charged link time, not HBM — at any time after its write, even
after the page is given up: a relaxation; the most waiting to go out in a
phase, printed, says how far the optimum leans on it). The step is periodic (every step of a
`u3m synth` trace is the same calls on the same addresses), and the LP is
convex and shift-invariant, so the average of any long schedule's steps is
at least the optimum. What it leaves out only lowers it: a copy-in may start
before its chunk leaves, copies and operators share nothing but the link,
the program's own host copies take no time.

`--step K` (default 3): the cycle is step K's calls (from its `# train step
K:` marker to the next); step K + 1 must begin with the same events (host
addresses aside), or the bound is refused: step 0 allocates what later
steps reuse.
`--copy-out-at-eviction`: the bound for schedules whose copy-outs start when
the chunk is evicted, as u3m's do (no write-back ahead of the eviction):
every copy-out is released at its gap's start and holds its page until it
ends (the D term for every gap).
`--held`: what the optimum holds in HBM as each phase's first call runs,
as its HBM constraint counts it: per allocation tag, the chunks idle in a
gap spanning that call, split into live (the next access reads them: a
copy-in if they are out) and dead (a whole write, or a free, comes next, or
they were never written: nothing to copy in), each as GiB idle, out and
held (idle less out); the chunks the call touches (all in HBM); and the
totals with B (copied in ahead) and D (evicted, copy-out pending), which
the constraint also counts, and what is left free. The figures are the
LP's fractional optimum, one vertex of possibly many: the LP keeps, of the
fastest schedules, one moving the fewest bytes, so the held figures are
that vertex's, not the only way to reach the bound (B and D, bounded only
from below, may sit above what the vertex needs where HBM has room).
`--json` adds them as a `held` list, one entry per phase."""
import json, os, sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import min_bounds as mb  # noqa: E402
import joint_bound as jb  # noqa: E402

CH = mb.CH


def cycle(calls, a, b, keys=None):
    """The step [a, b) of `calls` as a cycle: (n calls, touched per call,
    groups [(count, gaps, generations, calls touching it)]) where a gap is
    (first call out, last call out (may be < first: it wraps), returns at
    (call or None), copy-in on return?, epoch (hashable, or None: nothing to
    copy out), first gap of its epoch?, the epoch's write (call)). With a
    list `keys`, also appends each group's chunk keys to it, in the groups'
    order (bench/plan_schedule.py names the chunks)."""
    n = b - a
    acc, freed, written_before = {}, {}, set()
    for t in range(a):
        kind, c = calls[t]
        if kind == 'call':
            for key, (w, _whole) in c.items():
                if w:
                    written_before.add(key)
    touched = [0] * n
    for t in range(a, b):
        kind, c = calls[t]
        if kind == 'free':
            for key in c:
                freed[key] = t - a
        else:
            touched[t - a] = len(c)
            for key, (w, whole) in c.items():
                acc.setdefault(key, []).append((t - a, not whole, w))
    groups = {}
    for key, lst in acc.items():
        transient = key in freed
        if transient and key in written_before:
            sys.exit(f"chunk {key} outlives neither the step nor lives only in it: "
                     "the cycle needs steps that free what they allocate")
        sig = (transient, tuple(lst), freed.get(key), key in written_before)
        groups.setdefault(sig, []).append(key)
    if keys is not None:
        keys.extend(list(ks) for ks in groups.values())
    groups = {sig: [k[1] for k in ks] for sig, ks in groups.items()}
    out = []
    for (transient, lst, fr, before), gens in groups.items():
        m = len(gens)
        gs = []
        if transient:
            ep, written = None, False
            for i, (t, _need, w) in enumerate(lst):
                if w:
                    ep, written = ('e', i), True
                first = w
                if i + 1 < len(lst):
                    t2, need2, _ = lst[i + 1]
                    s, e, ret, cin = t + 1, t2 - 1, t2, need2 and written
                else:
                    s, e, ret, cin = t + 1, fr - 1, None, False
                if e >= s:
                    gs.append((s, e, ret, cin, ep, first, ep and lst[ep[1]][0]))
        else:
            writes = [i for i, (_t, _n, w) in enumerate(lst) if w]
            k = len(lst)
            for i, (t, _need, w) in enumerate(lst):
                t2, need2, _ = lst[(i + 1) % k]
                span = (t2 - t - 1) % n if k > 1 else n - 1
                if span == 0:
                    continue
                cin = need2 and (before or bool(writes))
                if writes:
                    last = max((j for j in writes if j <= i), default=writes[-1])
                    ep = ('e', last)
                    wt = lst[last][0]
                else:
                    ep, wt = None, None
                gs.append(((t + 1) % n, (t + span) % n, t2, cin, ep, w, wt))
        out.append((m, gs, gens, tuple(t for t, _need, _w in lst)))
    return n, touched, out


def solve(n, touched, groups, times, cap, beta, tags=None, at_eviction=False, min_gap_us=0.0):
    """The LP's optimum: {"step_us", "stall_us", "in_gib", "out_gib",
    "by_tag": {tag: [GiB in, GiB out]}, "calls": per call (µs it takes with
    its stall, chunks copied in for it, chunks of copy-outs its write
    releases, out backlog and copied-in-ahead chunks as it ends)}; `beta`
    is the link in chunks per µs each way, `cap` HBM in chunks, `tags`
    allocation generation -> tag (a group's bytes shared among its
    members' tags). `at_eviction`: every copy-out starts when its chunk is
    evicted and holds the page until it ends (no write-back ahead of the
    eviction, as u3m's engine copies out). `min_gap_us`: no chunk leaves HBM
    for a gap before a use that takes less device time than that (a
    schedule for a host running that far ahead: bench/plan_schedule.py);
    no longer a bound on every schedule. "lp": what `held_at` reads;
    "held_gaps": how many gaps `min_gap_us` kept in HBM."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix
    if max(touched) > cap:
        sys.exit("a call touches more chunks than HBM holds")
    d = np.asarray(times, dtype=float)
    gaps = []  # (m, s, e, ret, cin, epoch key, first, write call)
    owner = []
    for gi, (m, gs, *_r) in enumerate(groups):
        for (s, e, ret, cin, ep, first, wt) in gs:
            gaps.append((m, s, e, ret, cin, None if ep is None else (gi, ep), first, wt))
            owner.append(gi)
    ng = len(gaps)
    epochs = {}
    for j, g in enumerate(gaps):
        if g[5] is not None:
            epochs.setdefault(g[5], []).append(j)
    # variables: x[ng], w[ng], P[n], sigma[n], B[n], D[n], Q[n]
    ix, iw, ip, isg, ib, idd, iq = 0, ng, 2 * ng, 2 * ng + n, 2 * ng + 2 * n, 2 * ng + 3 * n, 2 * ng + 4 * n
    nv = 2 * ng + 5 * n
    er, ec, ev = [], [], []
    # P_0 = sum of x covering call 0; P_k - P_{k-1} = starting at k - ending at k - 1
    span = np.zeros(n + 1)
    for j, (m, s, e, *_r) in enumerate(gaps):
        if s <= e:
            span[s] += m
            span[e + 1] -= m
            if s == 0:
                er.append(0), ec.append(ix + j), ev.append(-1.0)
        else:  # wraps: s..n-1 and 0..e
            span[s] += m
            span[0] += m
            span[e + 1] -= m
            er.append(0), ec.append(ix + j), ev.append(-1.0)
        if 0 < s:
            er.append(s), ec.append(ix + j), ev.append(-1.0)
        if e + 1 < n:
            er.append(e + 1), ec.append(ix + j), ev.append(1.0)
    for k in range(n):
        er.append(k), ec.append(ip + k), ev.append(1.0)
        if k:
            er.append(k), ec.append(ip + k - 1), ev.append(-1.0)
    A_eq = coo_matrix((ev, (er, ec)), shape=(n, nv)).tocsr()
    spanm = np.cumsum(span)[:n]
    ur, uc, uv, ub = [], [], [], []
    row = [0]

    def le(terms, rhs):  # sum(v * var) <= rhs
        for col, v in terms:
            ur.append(row[0]), uc.append(col), uv.append(v)
        ub.append(rhs)
        row[0] += 1
    # HBM at the instant before call k ends
    for k in range(n):
        le([(ip + k, -1.0), (ib + k, 1.0), (idd + k, 1.0)], cap - touched[k] - spanm[k])
    # an epoch is copied out by the time any of its gaps is out
    for ep, js in epochs.items():
        wt = gaps[js[0]][7]
        order = sorted(js, key=lambda j: (gaps[j][1] - wt - 1) % n)
        for i, j in enumerate(order):
            le([(ix + j, 1.0)] + [(iw + q, -1.0) for q in order[:i + 1]], 0.0)
    R = [[] for _ in range(n)]
    O1 = [[] for _ in range(n)]
    E = [[] for _ in range(n)]
    for j, (m, s, e, ret, cin, ep, first, wt) in enumerate(gaps):
        if cin and ret is not None:
            R[ret].append(ix + j)
        if ep is not None:
            E[(s - 1) % n if at_eviction else wt].append(iw + j)
            if first or at_eviction:
                O1[(s - 1) % n].append(iw + j)
    for k in range(n):
        k1, km = (k + 1) % n, (k - 1) % n
        # B_k >= R_{k+1} - b s_{k+1};  B_k >= R_{k+1} + B_{k+1} - b (d + s)_{k+1}
        le([(c, 1.0) for c in R[k1]] + [(ib + k, -1.0), (isg + k1, -beta)], 0.0)
        le([(c, 1.0) for c in R[k1]] + [(ib + k1, 1.0), (ib + k, -1.0), (isg + k1, -beta)],
           beta * d[k1])
        le([(c, 1.0) for c in O1[km]] + [(idd + km, 1.0), (idd + k, -1.0), (isg + k, -beta)],
           beta * d[k])
        le([(c, 1.0) for c in E[km]] + [(iq + km, 1.0), (iq + k, -1.0), (isg + k, -beta)],
           beta * d[k])
    A_ub = coo_matrix((uv, (ur, uc)), shape=(row[0], nv)).tocsr()
    c = np.zeros(nv)
    c[isg:isg + n] = 1.0
    # `min_gap_us`: a gap shorter than that (device time of the calls
    # between its two uses) keeps its chunks in HBM
    cum = np.concatenate([[0.0], np.cumsum(d)])
    held = set(j for j, (m, s, e, ret, *_r) in enumerate(gaps)
               if ret is not None and min_gap_us > 0
               and (cum[e + 1] - cum[s] if s <= e else cum[n] - cum[s] + cum[e + 1]) < min_gap_us)
    bounds = [(0, 0 if j in held else g[0]) for j, g in enumerate(gaps)] + \
        [(0, g[0]) for g in gaps] + [(None, None)] * n + [(0, None)] * (4 * n)
    r = linprog(c, A_ub=A_ub, b_ub=ub, A_eq=A_eq, b_eq=np.zeros(n), bounds=bounds,
                method="highs")
    if r.status != 0:
        sys.exit(f"LP not solved: {r.message}" + (
            f" (--min-gap-us {min_gap_us:g} keeps {len(held)} gaps in HBM)" if held else ""))
    # of the schedules that fast, the fewest bytes (the optimum is not
    # unique: what it moves is otherwise one arbitrary vertex's)
    bounds[isg:isg + n] = [(0, None)] * n
    least = float(sum(r.x[isg:isg + n]))
    c2 = np.zeros(nv)
    c2[iw:iw + ng] = 1.0
    for k in range(n):
        for cc in R[k]:
            c2[cc] += 1.0
    extra = coo_matrix(([1.0] * n, ([0] * n, list(range(isg, isg + n)))), shape=(1, nv))
    from scipy.sparse import vstack
    r2 = linprog(c2, A_ub=vstack([A_ub, extra]).tocsr(), b_ub=ub + [least * (1 + 1e-7) + 1e-6],
                 A_eq=A_eq, b_eq=np.zeros(n), bounds=bounds, method="highs")
    if r2.status == 0:
        r = r2
    x = r.x
    bin_ = sum(x[cc] for k in range(n) for cc in R[k])
    bout = sum(x[iw:iw + ng])
    stall = float(sum(x[isg:isg + n]))
    by = {}
    for k in range(n):
        for cc in R[k]:
            share(by, groups[owner[cc - ix]][2], tags, 0, x[cc])
    for j in range(ng):
        share(by, groups[owner[j]][2], tags, 1, x[iw + j])
    calls = [(d[k] + x[isg + k], sum(x[cc] for cc in R[k]), sum(x[cc] for cc in E[k]),
              x[iq + k], x[ib + k]) for k in range(n)]
    # what `held_at` reads back: the optimum's chunks out per gap, P, B, D
    lp = {"gaps": gaps, "owner": owner, "out": x[ix:ix + ng], "P": x[ip:ip + n],
          "B": x[ib:ib + n], "D": x[idd:idd + n], "groups": groups, "tags": tags,
          "cap": cap, "touched": touched, "held_gaps": len(held)}
    return {"step_us": float(d.sum()) + stall, "stall_us": stall, "in_gib": bin_ * CH / 2**30,
            "out_gib": bout * CH / 2**30, "by_tag": by, "calls": calls, "lp": lp}


def spans(s, e, k):
    """Whether the gap s..e (wrapping when s > e) covers call k."""
    return s <= k <= e if s <= e else (k >= s or k <= e)


def held_at(r, k):
    """What `solve`'s optimum `r` holds in HBM as call k runs, in GiB, as
    its HBM constraint counts it: per tag, chunks idle in a gap covering k
    ("live": the return reads them, "dead": a whole write or a free comes
    next, or they hold nothing yet) as idle, out and held (idle less out),
    and those k touches; and
    the totals, with B_k (in ahead) and D_k (copy-outs pending)."""
    lp, G = r["lp"], CH / 2**30
    by = {"live": {}, "dead": {}}  # state -> tag -> [idle, out] GiB
    for j, (m, s, e, _ret, cin, *_r) in enumerate(lp["gaps"]):
        if spans(s, e, k):
            gens = lp["groups"][lp["owner"][j]][2]
            st = by["live" if cin else "dead"]
            share(st, gens, lp["tags"], 0, m)
            share(st, gens, lp["tags"], 1, lp["out"][j])
    touched = {}
    for m, _gs, gens, at in lp["groups"]:
        if k in at:
            share(touched, gens, lp["tags"], 0, m)
    tags = {}
    for t in sorted(set(by["live"]) | set(by["dead"]) | set(touched)):
        tags[t] = {st: figures(*by[st].get(t, (0.0, 0.0))) for st in ("live", "dead")}
        tags[t]["touched_gib"] = touched.get(t, (0.0, 0.0))[0]
    return {"by_tag": tags,
            "touched_gib": sum(v["touched_gib"] for v in tags.values()),
            "held_gib": sum(v[st]["held_gib"] for v in tags.values() for st in ("live", "dead")),
            "in_ahead_gib": float(lp["B"][k] * G), "copy_outs_pending_gib": float(lp["D"][k] * G),
            "hbm_gib": lp["cap"] * G}


def figures(idle, out):
    return {"idle_gib": float(idle), "out_gib": float(out), "held_gib": float(idle - out)}


def share(by, gens, tags, direction, chunks):
    for gen in gens:
        t = (tags or {}).get(gen, "?")
        by.setdefault(t, [0.0, 0.0])[direction] += chunks * CH / 2**30 / len(gens)


def bound(path, hbm, step=3, gbps=25.0, at_eviction=False):
    """`solve`'s optimum for step `step` of the trace at `path`, with
    "phases": [(name, first call, end)] from synth's `# train step K: NAME`
    markers (calls counted from the step's start)."""
    if not repeats(path, step):
        sys.exit(f"{path}: step {step}'s events differ from step {step + 1}'s; the bound "
                 "takes a step as a cycle, so it needs one that repeats (a later step)")
    times = []
    calls = mb.load(path, times)
    a, b = jb.window_start(path, step), jb.window_start(path, step + 1)
    n, touched, groups = cycle(calls, a, b)
    beta = gbps * 1e3 / CH  # chunks per µs
    r = solve(n, touched, groups, times[a:b], hbm // CH, beta, jb.alloc_tags(path), at_eviction)
    names = [ln.split(":", 1)[1].strip() for ln in open(path)
             if ln.startswith(f"# train step {step}:")]
    starts = []
    for name in names:
        starts.append(jb.call_index(path, f"# train step {step}: {name}") - a)
    r["phases"] = [(nm, s0, s1) for nm, s0, s1 in zip(names, starts, starts[1:] + [n])]
    r["calls_in_step"] = n
    return r


def repeats(path, step):
    """Whether step `step`'s events recur as step `step + 1`'s first ones,
    host addresses and timestamps aside."""
    secs, cur = {}, None
    for line in open(path):
        if line.startswith("# train step "):
            cur = int(line.split()[3].rstrip(":"))
            secs.setdefault(cur, [])
            continue
        f = line.split()
        if cur is None or not f or f[0].startswith("#"):
            continue
        f = [x for x in f if not x.startswith("t=")]
        if f[0] == "M" and len(f) > 4:
            if f[1] in ("H2D", "H2H"):
                f[3] = "host"
            if f[1] in ("D2H", "H2H"):
                f[2] = "host"
        secs[cur].append(" ".join(f))
    this, nxt = secs.get(step, []), secs.get(step + 1, [])
    return bool(this) and nxt[:len(this)] == this


def selftest():
    """Cases with known optima, and the bound against schedules that exist."""
    beta = 0.5  # chunks per µs
    key = lambda i: (i, 1, 0)  # noqa: E731

    def run(cyc, cap, times, setup=()):
        calls = [('call', {key(i): (True, True)}) for i in setup] + cyc
        n, touched, groups = cycle(calls, len(setup), len(calls))
        r = solve(n, touched, groups, times, cap, beta)
        return r["step_us"], r["stall_us"], r["in_gib"], r["out_gib"], r["by_tag"]

    # two calls, each the whole of HBM (4 chunks), read only: nothing can be
    # brought in while the other runs, so each waits 4 / b = 8 µs
    A = {key(i): (False, False) for i in range(4)}
    B = {key(i): (False, False) for i in range(4, 8)}
    t, s, _i, _o, _b = run([('call', A), ('call', B)], 4, [100.0, 100.0], range(8))
    assert abs(t - 216.0) < 1e-6, t
    # with HBM for both, no stall; with one chunk spare, the 4 chunks of the
    # next call come in during this one only as far as the spare page goes
    t, s, _i, _o, _b = run([('call', A), ('call', B)], 8, [100.0, 100.0], range(8))
    assert abs(t - 200.0) < 1e-6, t
    t5, _s, _i, _o, _b = run([('call', A), ('call', B)], 5, [100.0, 100.0], range(8))
    assert 200.0 < t5 < 216.0, t5
    # written every step: each eviction is also a copy-out, held until it ends
    Aw = {key(i): (True, False) for i in range(4)}
    Bw = {key(i): (True, False) for i in range(4, 8)}
    tw, _s, gi, go, _b = run([('call', Aw), ('call', Bw)], 4, [100.0, 100.0], range(8))
    assert tw >= 216.0 - 1e-6 and go > 0, (tw, go)
    # link-bound: short calls, the bytes at the link rate dominate
    tl, _s, gi, _o, _b = run([('call', A), ('call', B)], 4, [1.0, 1.0], range(8))
    assert tl >= 8 * 2 / 1 - 1e-6, tl
    held_known()
    # the bound never exceeds a schedule that exists: on-demand, serial copies
    import random
    rnd = random.Random(11)
    for case in range(200):
        nkeys = rnd.randint(2, 6)
        cap = rnd.randint(2, 4)
        cyc = []
        for _ in range(rnd.randint(2, 7)):
            ks = rnd.sample(range(nkeys), rnd.randint(1, min(cap, nkeys)))
            ws = {k: rnd.random() < 0.4 for k in ks}
            cyc.append(('call', {key(k): (ws[k], ws[k] and rnd.random() < 0.5) for k in ks}))
        times = [float(rnd.randint(1, 20)) for _ in cyc]
        setup = [k for k in range(nkeys) if rnd.random() < 0.7]
        whole = [('call', {key(i): (True, True)}) for i in setup] + cyc
        r1 = solve(*cycle(whole, len(setup), len(whole)), times, cap, beta)
        t = r1["step_us"]
        sim = on_demand(cyc, cap, times, {key(k) for k in setup}, beta)
        if t > sim + 1e-6:
            sys.exit(f"selftest case {case}: bound {t} above the on-demand schedule's {sim}")
        r2 = solve(*cycle(whole, len(setup), len(whole)), times, cap, beta, at_eviction=True)
        if r2["step_us"] < t - 1e-6 or r2["step_us"] > sim + 1e-6:
            sys.exit(f"selftest case {case}: copy-outs at eviction {r2['step_us']}, "
                     f"outside [{t}, {sim}]")
        for r in (r1, r2):
            for k in range(len(cyc)):
                held_fits(r, k, f"selftest case {case}, call {k}")
    print("selftest: known optima, and 200 random cycles: bound <= bound with copy-outs at eviction "
          "<= an on-demand schedule's steady step; --held's figures add up to the LP's "
          "and fit in HBM at every call")


def held_fits(r, k, where):
    """`held_at(r, k)` against the LP's own counts: out <= idle per tag, the
    outs sum to P_k, the touched to touched_k, and all of it fits in HBM."""
    h, lp, G = held_at(r, k), r["lp"], CH / 2**30
    eps = 1e-6 * G  # a millionth of a chunk: the solver's tolerance
    fig = [f for v in h["by_tag"].values() for f in (v["live"], v["dead"])]
    used = h["touched_gib"] + h["held_gib"] + h["in_ahead_gib"] + h["copy_outs_pending_gib"]
    bad = [f for f in fig if not -eps <= f["out_gib"] <= f["idle_gib"] + eps]
    if bad or used > h["hbm_gib"] + eps:
        sys.exit(f"{where}: out outside [0, idle] ({bad}) or {used} GiB above HBM")
    if abs(sum(f["out_gib"] for f in fig) - lp["P"][k] * G) > eps or \
            abs(h["touched_gib"] - lp["touched"][k] * G) > eps:
        sys.exit(f"{where}: held's out or touched differ from the LP's P_k, touched_k: {h}")


def held_known():
    """--held on cycles whose optimum is unique (each call 100 µs, the link
    a chunk per 2 µs), in chunks: (tag, state): (idle, out), (tag,
    "touched"): chunks, "B" and "D" as the call runs.
    1. HBM 3: call 0 reads two chunks (w), call 1 reads one (x) and wholly
    writes one (y). As call 0 runs only one of x, y fits: the fastest keeps
    x (else call 1 waits for it) and has y out (its copy-out costs no wait);
    as call 1 runs one w is out, and call 0 waits 2 µs for it: HBM is full,
    so nothing comes in ahead.
    2. HBM 2: call 0 reads p and q, call 1 r, call 2 s. As call 0 runs r and
    s are out (HBM full), so call 1 waits for r; s comes in ahead during
    call 1 and p, q during call 2 as far as HBM goes (each call's spare
    page), so p and q are out as calls 1 and 2 run, and call 0 waits for
    one of them."""
    key = lambda i, g: (i, g, 0)  # noqa: E731
    rd, ww = (False, False), (True, True)
    cases = [
        ([{(0, 1): rd, (1, 1): rd}, {(2, 2): rd, (3, 3): ww}], 3, {1: "w", 2: "x", 3: "y"}, 202.0,
         {0: {("w", "touched"): 2, ("x", "live"): (1, 0), ("y", "dead"): (1, 1), "B": 0, "D": 0},
          1: {("x", "touched"): 1, ("y", "touched"): 1, ("w", "live"): (2, 1), "B": 0, "D": 0}}),
        ([{(0, 1): rd, (1, 1): rd}, {(2, 2): rd}, {(3, 3): rd}], 2, {1: "p", 2: "r", 3: "s"}, 304.0,
         {0: {("p", "touched"): 2, ("r", "live"): (1, 1), ("s", "live"): (1, 1), "B": 0, "D": 0},
          1: {("r", "touched"): 1, ("p", "live"): (2, 2), ("s", "live"): (1, 1), "B": 1, "D": 0},
          2: {("s", "touched"): 1, ("p", "live"): (2, 2), ("r", "live"): (1, 1), "B": 1, "D": 0}}),
    ]
    G = CH / 2**30
    for ci, (cs, cap, tags, step, want) in enumerate(cases, 1):
        cyc = [('call', {key(*kg): a for kg, a in c.items()}) for c in cs]
        setup = [('call', {key(*kg): ww}) for c in cs for kg, a in c.items() if a == rd]
        for at_eviction in (False, True):
            r = solve(*cycle(setup + cyc, len(setup), len(setup) + len(cyc)), [100.0] * len(cyc),
                      cap, 0.5, tags, at_eviction)
            assert abs(r["step_us"] - step) < 1e-4, (ci, r["step_us"])  # fewest bytes' slack
            for k, exp in want.items():
                h = held_at(r, k)
                got = {"B": h["in_ahead_gib"] / G, "D": h["copy_outs_pending_gib"] / G}
                for tag, v in h["by_tag"].items():
                    for st in ("live", "dead"):
                        if v[st]["idle_gib"] > 0:
                            got[tag, st] = (v[st]["idle_gib"] / G, v[st]["out_gib"] / G)
                    if v["touched_gib"] > 0:
                        got[tag, "touched"] = v["touched_gib"] / G
                if got.keys() != exp.keys() or not all(
                        np.allclose(got[q], exp[q], atol=1e-4) for q in exp):
                    sys.exit(f"selftest --held case {ci}, call {k}, copy-outs at eviction "
                             f"{at_eviction}: {got}, want {exp}")


def on_demand(cyc, cap, times, has, beta, cycles=40):
    """Steady step of a physical schedule: calls in order; a call's absent
    chunks are brought in before it starts, evicting the resident chunk used
    furthest ahead (copying it out first if its contents changed since its
    last copy-out); copies run one at a time, nothing overlaps a call."""
    n = len(cyc)
    uses = {}
    for t, (_k, c) in enumerate(cyc):
        for key in c:
            uses.setdefault(key, []).append(t)
    res, clean, has = set(), set(has), set(has)  # `clean`: host copy is current
    clock, ends = 0.0, []
    for r in range(cycles):
        for t, (_k, c) in enumerate(cyc):
            def nxt(key):
                return min(((u - t - 1) % n for u in uses[key]))
            for key, (w, whole) in c.items():
                if key in res:
                    continue
                while len(res) >= cap:
                    v = max((k for k in res if k not in c), key=nxt)
                    if v not in clean:
                        clock += 1 / beta
                        clean.add(v)
                    res.discard(v)
                if key in has and not (w and whole):
                    clock += 1 / beta
                res.add(key)
            for key, (w, _whole) in c.items():
                if w:
                    clean.discard(key)
                    has.add(key)
            clock += times[t]
        ends.append(clock)
    return (ends[-1] - ends[cycles // 2]) / (cycles - 1 - cycles // 2)


def main():
    args = sys.argv[1:]
    if args == ['--selftest']:
        return selftest()
    gbps, step, as_json, at_eviction, held = 25.0, 3, False, False, False
    while args and args[0].startswith('--'):
        a = args.pop(0)
        if a == '--link-gbps':
            gbps = float(args.pop(0))
        elif a == '--step':
            step = int(args.pop(0))
        elif a == '--json':
            as_json = True
        elif a == '--copy-out-at-eviction':
            at_eviction = True
        elif a == '--held':
            held = True
        else:
            sys.exit(__doc__)
    if len(args) != 2:
        sys.exit(__doc__)
    hbm = mb.parse_size(args[0])
    r = bound(args[1], hbm, step, gbps, at_eviction)
    t, stall, n = r["step_us"], r["stall_us"], r["calls_in_step"]
    G = CH / 2**30
    phases = []
    for name, s0, s1 in r["phases"]:
        cs = r["calls"][s0:s1]
        span = sum(c[0] for c in cs)
        phases.append({"phase": name, "calls": [s0, s1], "ms": span / 1e3,
                       "in_gib": sum(c[1] for c in cs) * G, "out_released_gib": sum(c[2] for c in cs) * G,
                       "in_link_busy": sum(c[1] for c in cs) / (gbps * 1e3 / CH) / span if span else 0.0,
                       "out_backlog_max_mib": max((c[3] for c in cs), default=0) * CH / 2**20,
                       "in_ahead_max_mib": max((c[4] for c in cs), default=0) * CH / 2**20})
    rep = {"trace": args[1], "hbm_bytes": hbm, "step": step, "calls": n,
           "copy_out_at_eviction": at_eviction,
           "bound_ms": t / 1e3, "compute_ms": (t - stall) / 1e3, "stall_ms": stall / 1e3,
           "in_gib": r["in_gib"], "out_gib": r["out_gib"],
           "by_tag": {k: {"in_gib": v[0], "out_gib": v[1]} for k, v in sorted(r["by_tag"].items())},
           "phases": phases}
    if held:
        rep["held"] = [dict(phase=name, call=s0, **held_at(r, s0)) for name, s0, _s1 in r["phases"]]
    if as_json:
        print(json.dumps(rep))
        return
    print(f"{args[1]}: step {step}, {n} calls, HBM {hbm // CH} chunks: at least "
          f"{t / 1e3:.1f} ms per step ({(t - stall) / 1e3:.1f} device + {stall / 1e3:.1f} "
          f"waiting); the optimum moves {r['in_gib']:.3f} GiB in, {r['out_gib']:.3f} GiB out")
    for tag, (ti, to) in sorted(r["by_tag"].items()):
        if ti > 5e-4 or to > 5e-4:
            print(f"  {tag:>10}: in {ti:8.3f} GiB, out {to:8.3f} GiB")
    for p in phases:
        print(f"  {p['phase']:>10}: {p['ms']:7.1f} ms, in {p['in_gib']:7.3f} GiB (the link "
              f"{p['in_link_busy'] * 100:3.0f} % busy), copy-outs released {p['out_released_gib']:7.3f} GiB; "
              f"at most {p['out_backlog_max_mib']:.0f} MiB waiting to go out, "
              f"{p['in_ahead_max_mib']:.0f} MiB in ahead")
    for h in rep.get("held", []):
        print_held(h)


def print_held(h):
    """`--held`'s lines for one phase start."""
    used = h["touched_gib"] + h["held_gib"] + h["in_ahead_gib"] + h["copy_outs_pending_gib"]
    print(f"  held as {h['phase']} begins (call {h['call']}): HBM {h['hbm_gib']:.3f} GiB = "
          f"touched {z(h['touched_gib'])} + held {z(h['held_gib'])} + in ahead "
          f"{z(h['in_ahead_gib'])} + copy-outs pending {z(h['copy_outs_pending_gib'])} "
          f"(+ free {z(h['hbm_gib'] - used)})")
    print(f"{'tag':>14}{'state':>8}{'idle GiB':>14}{'out GiB':>11}{'held GiB':>11}")
    for tag, v in h["by_tag"].items():
        for state in ("dead", "live"):
            f = v[state]
            if f["idle_gib"] >= 5e-4:
                print(f"{tag:>14}{state:>8}{z(f['idle_gib']):>14}{z(f['out_gib']):>11}"
                      f"{z(f['held_gib']):>11}")
        if v["touched_gib"] >= 5e-4:
            print(f"{tag:>14}{'touched':>8}{'':25}{z(v['touched_gib']):>11}")


def z(gib):
    """GiB to 3 places; the solver's -1e-12 prints 0.000, not -0.000."""
    return f"{round(gib, 3) + 0.0:.3f}"

if __name__ == '__main__':
    main()
