#!/usr/bin/env python3
"""Lower bounds on the bytes any residency schedule must move across the
host-device link, per direction, on a u3m trace and an HBM size.
usage: bench/min_bounds.py [--json] [--link-gbps G] HBM_BYTES TRACE [TRACE_LONGER]
       bench/min_bounds.py --selftest
With two traces of the same shape (k-step and (k+2)-step `u3m synth` runs)
it also prints the per-step difference, (longer - shorter) / 2: the steady
state, as bench/steady.py's windows.

The chunk model is the replay's (and bench/min_whole.py's): 2 MiB chunks from
each allocation's start; a call's chunks all in HBM together; an output that
overlaps no input of its call, an H2D/D2D destination and a memset write the
chunks they cover whole; a chunk never written holds nothing to copy.

- in_demand: Belady's MIN with dead-on-whole-write (a whole write needs no
  copy-in and ends the old contents' life; a chunk never written has
  nothing to copy back): the fewest copy-in bytes of any schedule that
  makes every chunk a call touches resident (bench/min_whole.py;
  bench/joint_bound.py's copy-in LP gives the same, and bounds both
  directions at once).
- in_bypass: the same, but a chunk read while absent may instead be read over
  the link without taking HBM (host mapping): MIN with bypass, the fewest
  host-to-device bytes of any schedule at all (a mapped read costs its bytes
  as a copy-in does).
- out: device-to-host bytes of schedules that never drop data they were not
  told is dead (u3m's rule without hints). A chunk's contents from one write
  to its next write (or its free), an epoch, must be copied out once if the
  chunk leaves HBM at any time within it, and cost nothing if it stays.
  out_greedy holds epochs in HBM greedily (where a call finds HBM
  over-full, give up the held epoch that ends last): a real offline schedule,
  so what is reachable. out_bound relaxes each held epoch to its longest
  gap between the calls that touch it; those are plain intervals, where the
  same greedy is exact, so no schedule copies out less. `--selftest` checks
  bound <= fewest <= greedy against brute force on random tiny traces.
ms: bytes at the link rate (--link-gbps, default 25 GB/s, each direction)."""
import bisect, heapq, sys

CH = 2 << 20
INF = 1 << 60


def parse_size(s):
    m = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)


def load(path, times=None):
    """Calls in order: ('free', [chunk keys]) or ('call', {key: (write, whole)}).
    With a list `times`, also appends each call's device time in µs under
    the replay's cost model (tools/src/replay/cost.rs, 910b4 preset: an
    operator max(flops / 280 TFLOPS, bytes touched / 800 GB/s) + 5 µs of
    launch, a memset bytes / HBM + launch, a D2D copy bytes / HBM); the
    program's own host copies and frees count 0, which can only lower a
    bound built on these times."""
    allocs, starts, gen, calls = {}, [], 0, []
    hbm, launch = 800e3, 5.0  # bytes per µs, µs

    def took(us):
        if times is not None:
            times.append(us)

    def add(c, a, n, write, whole):
        if n == 0:
            return
        b = starts[bisect.bisect_right(starts, a) - 1]
        size, g = allocs[b]
        lo, hi = a - b, a - b + n
        for i in range(lo // CH, (hi - 1) // CH + 1):
            cs = i * CH
            w = whole and write and lo <= cs and hi >= cs + CH and cs + CH <= size
            key = (b, g, i)
            pw, pwhole = c.get(key, (False, True))
            c[key] = (pw or write, pwhole and w)

    for lineno, line in enumerate(open(path), 1):
        f = line.split()
        if not f or f[0].startswith('#'):
            continue
        k = f[0]
        if k == 'A':
            a, n = int(f[1], 16), int(f[2])
            gen += 1
            allocs[a] = (n, gen)
            bisect.insort(starts, a)
        elif k == 'F':
            a = int(f[1], 16)
            n, g = allocs.pop(a)
            starts.remove(a)
            calls.append(('free', [(a, g, i) for i in range((n + CH - 1) // CH)]))
            took(0.0)
        elif k == 'O':
            ni, no = int(f[2]), int(f[3])
            rs = [tuple(int(x, 16) if x.startswith('0x') else int(x) for x in r.split(':'))
                  for r in f[4:4 + ni + no]]
            ins, outs = rs[:ni], rs[ni:]
            c = {}
            for a, n in ins:
                add(c, a, n, False, False)
            for a, n in outs:
                ov = any(i[0] < a + n and a < i[0] + i[1] for i in ins)
                add(c, a, n, True, not ov)
            calls.append(('call', c))
            flops = [int(x[6:]) for x in f[4 + ni + no:] if x.startswith('flops=')]
            touched = sum(n for _a, n in rs)
            took(max((flops[0] if flops else 0) / 280e6, touched / hbm) + launch)
        elif k == 'M':
            kind, d, s, n = f[1], int(f[2], 16), int(f[3], 16), int(f[4])
            c = {}
            if kind in ('D2H', 'D2D'):
                add(c, s, n, False, False)
            if kind in ('H2D', 'D2D'):
                add(c, d, n, True, True)
            if c:
                calls.append(('call', c))
                took(n / hbm if kind == 'D2D' else 0.0)
        elif k == 'S':
            c = {}
            add(c, int(f[1], 16), int(f[2]), True, True)
            calls.append(('call', c))
            took(int(f[2]) / hbm + launch)
    return calls


def accesses(calls):
    """key -> [(t, needs_contents)] over the calls that touch it."""
    acc = {}
    for t, (kind, c) in enumerate(calls):
        if kind == 'call':
            for key, (_w, whole) in c.items():
                acc.setdefault(key, []).append((t, not whole))
    return acc


def top_victim(heap, res, ver, c):
    """The first valid entry of `heap` (entries (key, chunk, version); valid:
    the chunk is in `res` and `ver` has that version) whose chunk the call's
    chunks `c` do not include, or None; the heap is left as it was."""
    aside, found = [], None
    while heap:
        e = heapq.heappop(heap)
        if e[1] not in res or ver.get(e[1]) != e[2]:
            continue
        aside.append(e)
        if e[1] not in c:
            found = e
            break
    for e in aside:
        heapq.heappush(heap, e)
    return found


def min_in(calls, cap, bypass):
    """Belady's MIN on copy-in bytes, whole writes known dead; with bypass a
    chunk absent when a call touches it may stay out (read or written over the
    link) when it is needed no sooner than every chunk HBM could give up."""
    acc = accesses(calls)

    def nxt(key, t, held=True):
        lst = acc[key]
        k = bisect.bisect_right(lst, (t, True))
        if k >= len(lst):
            return INF
        tt, need = lst[k]
        # a whole write, or for a chunk HBM holds, one never written
        # (nothing to copy back in): dead until then
        return tt if need and (key in written or not held) else INF - 1

    res, written, heap, ver, fetched = set(), set(), [], {}, 0

    def victim(c):
        return top_victim(heap, res, ver, c)

    for t, (kind, c) in enumerate(calls):
        if kind == 'free':
            for key in c:
                res.discard(key)
                written.discard(key)
            continue
        for key, (_w, whole) in c.items():
            if key in res:
                continue
            if not whole and key in written:
                fetched += CH
            if len(res) >= cap:
                e = victim(c)
                if e is None:
                    sys.exit(f"call {t} touches more chunks than HBM holds ({cap})")
                if bypass and nxt(key, t, held=False) >= -e[0]:
                    continue   # over the link; HBM keeps what it has
                res.discard(e[1])
            res.add(key)
        for key, (w, _whole) in c.items():
            if w:
                written.add(key)
            if key in res:
                v = ver.get(key, 0) + 1
                ver[key] = v
                heapq.heappush(heap, (-nxt(key, t), key, v))
    return fetched


def epochs(calls):
    """Every epoch as (start t, end t, key); end INF if it outlives the trace."""
    out, open_ = [], {}
    for t, (kind, c) in enumerate(calls):
        if kind == 'free':
            for key in c:
                if key in open_:
                    out.append((open_.pop(key), t, key))
            continue
        for key, (w, _whole) in c.items():
            if w:
                if key in open_:
                    out.append((open_.pop(key), t, key))
                open_[key] = t
    out += [(s, INF, key) for key, s in open_.items()]
    return out


def min_out(calls, cap):
    """A set of epochs HBM can hold throughout, found greedily: where a call
    finds HBM over-full, give up the held epoch that ends last. Returns the
    epochs not held: the copy-outs of a real (offline) schedule, so an upper
    bound on the fewest."""
    starts = {}
    for e in epochs(calls):
        starts.setdefault(e[0], []).append(e)
    held = {}    # key -> end of its epoch HBM holds
    heap = []    # (-end, key), stale entries skipped
    lost = 0
    for t, (kind, c) in enumerate(calls):
        if kind == 'free':
            for key in c:
                held.pop(key, None)
            continue
        for s, end, key in starts.get(t, ()):
            held[key] = end   # a write: the previous epoch ended here
            heapq.heappush(heap, (-end, key))
        # the call's chunks take HBM whether or not their epoch is held
        over = len(c) + len(held) - sum(1 for k in c if k in held) - cap
        aside = []
        while over > 0:
            if not heap:
                sys.exit(f"call {t} touches more chunks than HBM holds ({cap})")
            negend, key = heapq.heappop(heap)
            if held.get(key) != -negend:
                continue
            if key in c:
                aside.append((negend, key))
                continue
            del held[key]
            lost += 1
            over -= 1
        for e in aside:
            heapq.heappush(heap, e)
    return lost


def min_out_lb(calls, cap):
    """A lower bound on the fewest copy-outs. Holding an epoch means holding
    its chunk through every gap between the calls that touch it; relax that
    to its longest gap alone (a held epoch takes HBM there and nowhere else).
    Those gaps are plain intervals, where dropping the one that ends last
    at each over-full call is optimal (Belady), so the relaxed optimum is
    exact and no real schedule loses fewer epochs."""
    touches, ends = {}, {}
    for s, end, key in epochs(calls):
        touches[(s, key)] = [s]
        ends[(s, key)] = end
    opened = {}
    for t, (kind, c) in enumerate(calls):
        if kind == 'call':
            for key, (w, _whole) in c.items():
                if w:
                    opened[key] = t
                elif key in opened:
                    touches[(opened[key], key)].append(t)
        else:
            for key in c:
                opened.pop(key, None)
    gaps = {}
    n = len(calls)
    for (s, key), ts in touches.items():
        end = min(ends[(s, key)], n)
        pts = ts + [end]
        a, b = max(zip(pts, pts[1:]), key=lambda g: g[1] - g[0])
        if b - a > 1:   # a gap with calls in it
            gaps.setdefault(a + 1, []).append((b, key))
    active = {}    # key -> b: its gap covers calls a+1 .. b-1
    far, near, lost = [], [], 0
    for t, (kind, c) in enumerate(calls):
        while near and near[0][0] <= t:
            b, key = heapq.heappop(near)
            if active.get(key) == b:
                del active[key]
        for b, key in gaps.get(t, ()):
            active[key] = b
            heapq.heappush(far, (-b, key))
            heapq.heappush(near, (b, key))
        over = (len(c) if kind == 'call' else 0) + len(active) - cap
        while over > 0:
            if not far:
                sys.exit(f"call {t} touches more chunks than HBM holds ({cap})")
            negb, key = heapq.heappop(far)
            if active.get(key) != -negb:
                continue
            del active[key]
            lost += 1
            over -= 1
    return lost


def min_out_brute(calls, cap):
    """min_out by trying every set of epochs to hold (tiny traces only)."""
    from itertools import combinations
    eps = epochs(calls)
    for k in range(len(eps), -1, -1):
        for hold in combinations(eps, k):
            ok = True
            for t, (kind, c) in enumerate(calls):
                if kind == 'free':
                    continue
                span = sum(1 for s, end, key in hold if s < t < end and key not in c)
                if len(c) + span > cap:
                    ok = False
                    break
            if ok:
                return len(eps) - k
    return len(eps)


def random_trace(rnd, max_calls, wholes):
    """(HBM chunks, calls) of a random tiny trace: 1-3 chunks of HBM, 2-5
    keys, up to `max_calls` calls (a tenth of them frees); each chunk a
    call touches written with probability 1/2, and with `wholes` half of
    those writes whole."""
    cap, nkeys, calls = rnd.randint(1, 3), rnd.randint(2, 5), []
    gen = {k: 0 for k in range(nkeys)}
    for _ in range(rnd.randint(1, max_calls)):
        if rnd.random() < 0.1:
            k = rnd.randrange(nkeys)
            calls.append(('free', [(k, gen[k], 0)]))
            gen[k] += 1
            continue
        keys = rnd.sample(range(nkeys), rnd.randint(1, min(cap, nkeys)))
        c = {}
        for k in keys:
            w = rnd.random() < 0.5
            c[(k, gen[k], 0)] = (w, wholes and w and rnd.random() < 0.5)
        calls.append(('call', c))
    return cap, calls


def selftest(n=3000):
    """The bound and the greedy schedule against brute force on random tiny traces."""
    import random
    rnd = random.Random(1)
    exact = 0
    for case in range(n):
        cap, calls = random_trace(rnd, 9, False)
        lo, best, hi = min_out_lb(calls, cap), min_out_brute(calls, cap), min_out(calls, cap)
        if not lo <= best <= hi:
            sys.exit(f"selftest case {case}: bound {lo}, brute force {best}, greedy {hi}: {calls} cap {cap}")
        exact += lo == best
    print(f"selftest: bound <= fewest <= greedy on {n} random traces (bound exact on {exact})")


def main():
    args = sys.argv[1:]
    if args == ['--selftest']:
        return selftest()
    gbps = 25.0
    as_json = '--json' in args
    args = [a for a in args if a != '--json']
    if '--link-gbps' in args:
        i = args.index('--link-gbps')
        gbps = float(args[i + 1])
        del args[i:i + 2]
    if len(args) not in (2, 3):
        sys.exit(__doc__)
    cap = parse_size(args[0]) // CH
    rows = []
    names = ("in_demand", "in_bypass", "out_bound", "out_greedy")
    report = {"hbm_chunks": cap, "chunk_bytes": CH, "traces": []}
    for tr in args[1:]:
        calls = load(tr)
        r = (min_in(calls, cap, False), min_in(calls, cap, True),
             min_out_lb(calls, cap) * CH, min_out(calls, cap) * CH)
        rows.append(r)
        report["traces"].append(dict(trace=tr, calls=len(calls), **dict(zip(names, r))))
        if not as_json:
            print(f"{tr}: {len(calls)} calls, HBM {cap} chunks: " +
                  ", ".join(f"{k} {v / 2**30:.3f} GiB" for k, v in zip(names, r)))
    if len(rows) == 2:
        d = [(b - a) / 2 for a, b in zip(*rows)]
        report["per_step"] = dict(zip(names, d))
        if not as_json:
            print(f"per step, ms at {gbps:g} GB/s each way: " +
                  ", ".join(f"{k} {v / 2**30:.3f} GiB = {v / (gbps * 1e9) * 1e3:.1f} ms"
                            for k, v in zip(names, d)))
    if as_json:
        import json
        print(json.dumps(report))


if __name__ == '__main__':
    main()
