#!/usr/bin/env python3
"""Belady's MIN copy-in bytes on a u3m trace, with and without knowing that a
whole write needs no copy-in and makes the chunk's old contents dead.
usage: bench/min_whole.py TRACE HBM_BYTES [LAG]  -> prints fetch bytes for both models.
LAG (default 0): a chunk used by one of the last LAG calls may not be evicted
(its use still queued on the device: a copy-in overlapping the device's work
cannot take its memory) — MIN restricted to victims idle that long.
Model as the replay's: 2 MiB chunks from each allocation's start; a call's
chunks all resident together; an O output overlapping no input of its line,
H2D/D2D destinations and memsets are whole writes; a chunk is whole for a
call only if every range of the call covering it is a whole write covering
all of it; fresh chunks (never written) need no copy-in."""
import sys, bisect, heapq
CH = 2 << 20
def parse_size(s):
    m = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)
tr, hbm = sys.argv[1], parse_size(sys.argv[2])
lag = int(sys.argv[3]) if len(sys.argv) > 3 else 0
cap = hbm // CH
allocs = {}   # base -> (size, gen)
starts = []   # sorted bases
gen = 0
calls = []    # list of dict chunkid -> whole(bool)
def owner(a):
    k = bisect.bisect_right(starts, a) - 1
    b = starts[k]
    return b
def add(call, a, n, write, whole):
    if n == 0: return
    b = owner(a); size, g = allocs[b]
    lo, hi = a - b, a - b + n
    for i in range(lo // CH, (hi - 1) // CH + 1):
        cs = i * CH
        w = whole and write and lo <= cs and hi >= cs + CH and cs + CH <= size
        key = (b, g, i)
        call[key] = call.get(key, True) and w
for line in open(tr):
    f = line.split()
    if not f or f[0].startswith('#'): continue
    k = f[0]
    if k == 'A':
        a, n = int(f[1], 16), int(f[2]); gen += 1
        allocs[a] = (n, gen); bisect.insort(starts, a)
    elif k == 'F':
        a = int(f[1], 16); del allocs[a]; starts.remove(a)
        calls.append({('free', a): None})
    elif k == 'O':
        ni, no = int(f[2]), int(f[3])
        rs = [tuple(int(x, 16) if x.startswith('0x') else int(x) for x in r.split(':')) for r in f[4:4 + ni + no]]
        ins, outs = rs[:ni], rs[ni:]
        c = {}
        for a, n in ins: add(c, a, n, False, False)
        for a, n in outs:
            ov = any(i[0] < a + n and a < i[0] + i[1] for i in ins)
            add(c, a, n, True, not ov)
        calls.append(c)
    elif k == 'M':
        kind, d, s, n = f[1], int(f[2], 16), int(f[3], 16), int(f[4])
        c = {}
        if kind in ('D2H', 'D2D'): add(c, s, n, False, False)
        if kind in ('H2D', 'D2D'): add(c, d, n, True, True)
        if c: calls.append(c)
    elif k == 'S':
        c = {}; add(c, int(f[1], 16), int(f[2]), True, True); calls.append(c)

def run(know_dead):
    # per chunk: times of accesses and whether the access needs the contents
    INF = 1 << 60
    acc = {}
    for t, c in enumerate(calls):
        for key, whole in c.items():
            if key[0] == 'free': continue
            acc.setdefault(key, []).append((t, not whole))
    # next "needing" time after t: the next access if it needs contents;
    # with know_dead, an access that is a whole write ends the chunk's life
    def nxt(key, t):
        lst = acc[key]
        k = bisect.bisect_right(lst, (t, True))
        if k >= len(lst): return INF
        tt, need = lst[k]
        if know_dead and not need: return INF - 1  # dead until rewritten
        return tt
    res = set(); written = set(); heap = []; fetched = 0
    ver = {}; lastuse = {}
    for t, c in enumerate(calls):
        keys = [k for k in c if k[0] != 'free']
        if not keys:
            # a free: its chunks die
            a = next(iter(c))[1]
            for key in [k for k in res if k[0] == a]:
                res.discard(key)
            continue
        for key in keys:
            if key in res: continue
            need = not c[key]
            if need and key in written: fetched += CH
            # evict to make room
            held = []
            while len(res) >= cap:
                if not heap:
                    sys.exit(f"lag {lag}: at call {t} every chunk in HBM was used by one of the last {lag} calls: no victim")
                negn, kk, v = heapq.heappop(heap)
                if kk not in res or ver.get(kk) != v: continue
                if kk in c or lastuse.get(kk, -1 << 60) > t - lag:
                    held.append((negn, kk, v)); continue
                res.discard(kk)
            for h in held: heapq.heappush(heap, h)
            res.add(key)
        for key in keys:
            lastuse[key] = t
            written.add(key)
            v = ver.get(key, 0) + 1; ver[key] = v
            heapq.heappush(heap, (-nxt(key, t), key, v))
    return fetched
# written: a chunk has contents worth fetching once any call touched it (a
# read of never-written memory has nothing to copy either, as the library's
# fresh chunks)
a = run(False); b = run(True)
print(f"calls {len(calls)} cap {cap} chunks lag {lag}; MIN fetch bytes: classic {a} ({a/2**30:.2f} GiB), dead-on-whole-write {b} ({b/2**30:.2f} GiB)")
