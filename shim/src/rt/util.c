/* Small containers used by the core: an interval allocator and a pointer set. */
#include <stdlib.h>
#include <string.h>
#include "rt/rt.h"

static void ra_insert(sim_ralloc *ra, size_t at, sim_span s) {
    if (ra->n == ra->cap) {
        ra->cap = ra->cap ? ra->cap * 2 : 64;
        ra->free = realloc(ra->free, ra->cap * sizeof(sim_span));
        if (!ra->free) abort();
    }
    memmove(ra->free + at + 1, ra->free + at, (ra->n - at) * sizeof(sim_span));
    ra->free[at] = s;
    ra->n++;
}

static void ra_remove(sim_ralloc *ra, size_t at) {
    memmove(ra->free + at, ra->free + at + 1, (ra->n - at - 1) * sizeof(sim_span));
    ra->n--;
}

void ra_init(sim_ralloc *ra, uint64_t start, uint64_t len) {
    ra->free = NULL;
    ra->n = ra->cap = 0;
    ra_insert(ra, 0, (sim_span){start, len});
}

int ra_alloc(sim_ralloc *ra, uint64_t len, uint64_t align, uint64_t *out) {
    for (size_t i = 0; i < ra->n; i++) {
        sim_span f = ra->free[i];
        uint64_t a = sim_round_up(f.start, align);
        if (a < f.start || a - f.start > f.len || f.len - (a - f.start) < len) continue;
        uint64_t end = a + len, fend = f.start + f.len;
        /* split the span into the part before and after the allocation */
        if (a == f.start && end == fend) {
            ra_remove(ra, i);
        } else if (a == f.start) {
            ra->free[i].start = end;
            ra->free[i].len = fend - end;
        } else {
            ra->free[i].len = a - f.start;
            if (end < fend) ra_insert(ra, i + 1, (sim_span){end, fend - end});
        }
        *out = a;
        return 0;
    }
    return -1;
}

void ra_free(sim_ralloc *ra, uint64_t start, uint64_t len) {
    size_t lo = 0, hi = ra->n;
    while (lo < hi) {       /* first span starting after `start` */
        size_t mid = (lo + hi) / 2;
        if (ra->free[mid].start < start) lo = mid + 1; else hi = mid;
    }
    ra_insert(ra, lo, (sim_span){start, len});
    /* coalesce with the next, then with the previous */
    if (lo + 1 < ra->n && ra->free[lo].start + ra->free[lo].len == ra->free[lo + 1].start) {
        ra->free[lo].len += ra->free[lo + 1].len;
        ra_remove(ra, lo + 1);
    }
    if (lo > 0 && ra->free[lo - 1].start + ra->free[lo - 1].len == ra->free[lo].start) {
        ra->free[lo - 1].len += ra->free[lo].len;
        ra_remove(ra, lo);
    }
}

#define PS_TOMB ((uintptr_t)1)

static size_t ps_hash(uintptr_t p, size_t cap) {
    uint64_t h = (uint64_t)p * 0x9e3779b97f4a7c15ULL;
    return (size_t)(h >> 17) & (cap - 1);
}

int ps_has(const sim_ptrset *s, const void *p) {
    if (!s->cap || !p) return 0;
    uintptr_t k = (uintptr_t)p;
    for (size_t i = ps_hash(k, s->cap), n = 0; n < s->cap; i = (i + 1) & (s->cap - 1), n++) {
        if (s->slot[i] == k) return 1;
        if (s->slot[i] == 0) return 0;
    }
    return 0;
}

static void ps_rehash(sim_ptrset *s, size_t cap) {
    uintptr_t *old = s->slot;
    size_t oldcap = s->cap;
    s->slot = calloc(cap, sizeof(uintptr_t));
    if (!s->slot) abort();
    s->cap = cap;
    s->n = 0;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i] > PS_TOMB) ps_add(s, (void *)old[i]);
    free(old);
}

void ps_add(sim_ptrset *s, const void *p) {
    if ((s->n + 1) * 2 > s->cap) ps_rehash(s, s->cap ? s->cap * 2 : 64);
    uintptr_t k = (uintptr_t)p;
    for (size_t i = ps_hash(k, s->cap);; i = (i + 1) & (s->cap - 1)) {
        if (s->slot[i] == k) return;
        if (s->slot[i] <= PS_TOMB) {
            s->slot[i] = k;
            s->n++;
            return;
        }
    }
}

void ps_del(sim_ptrset *s, const void *p) {
    if (!s->cap) return;
    uintptr_t k = (uintptr_t)p;
    for (size_t i = ps_hash(k, s->cap), n = 0; n < s->cap; i = (i + 1) & (s->cap - 1), n++) {
        if (s->slot[i] == k) {
            s->slot[i] = PS_TOMB;   /* n counts tombstones too: rehash clears them */
            return;
        }
        if (s->slot[i] == 0) return;
    }
}
