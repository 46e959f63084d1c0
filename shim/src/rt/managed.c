/* Managed (unified virtual) memory: aclrtMemAllocManaged, aclrtMemManagedAdvise,
 * aclrtMemManagedPrefetch(Batch)Async, aclrtMemManagedGetAttr(s); aclrtFree
 * frees it (mem.c).
 *
 * What CANN documents (runtime API reference 11-05 "unified addressing", CANN
 * 9.0; the checks are those of hicann/runtime src/acl/aclrt_impl/memory.cpp and
 * src/runtime/api/impl/api_error_uvm.cc): one pointer valid on host and device,
 * size rounded up to 2 MiB, at most 3 TiB per process inside the UVM range
 * [0x90000000000, +3 TiB); pages get physical memory where they are first
 * touched and migrate (page fault) when another side touches them; advise sets
 * read-mostly / preferred-location / accessed-by; a prefetch is queued on a
 * stream (the runtime launches it as a host function) and moves the pages.
 *
 * The simulator: the allocation is one anonymous mapping at a UVM address, so
 * host and device code read and write the same bytes. Each 2 MiB page has a
 * residency (never touched, a device, host, a host NUMA node); residency only
 * decides simulated time, never data. Device work touching a page that lives
 * elsewhere migrates the whole page first (page bytes at link bandwidth), unless
 * the device is in the page's accessed-by set and the page sits at its preferred
 * location: then the device reads and writes it remotely, over the link, in
 * place. A page nobody touched becomes resident where it is first put, with no
 * transfer. Host reads and writes are not observed (no fault handler): a page
 * moves to the host only by a prefetch or advise. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "rt/rt.h"

#define MG_BASE 0x90000000000ULL      /* the UVM range the CANN docs give */
#define MG_LEN (3ULL << 40)           /* 3 TiB per process */
#define MG_PAGE ((uint64_t)SIM_GRANULE)
#define LOC_HOST_BIT 16

struct sim_mpage {
    int8_t loc_t, loc_id;    /* residency: ACL_MEM_LOCATIONTYPE_INVALID = never touched */
    int8_t pref_t, pref_id;  /* preferred location (INVALID: none) */
    int8_t lp_t, lp_id;      /* last prefetch target (INVALID: none) */
    uint8_t read_mostly;
    uint32_t acc;            /* accessed-by set, as loc_bit()s */
    uint32_t copies;         /* read-mostly: where read-only copies exist */
};

typedef struct mloc { int8_t t, id; } mloc;

/* arena and byte counts under g_mm; page states under g_mg_mu (taken with g_mm
 * held, never the other way round) */
static struct {
    sim_ralloc va;
    uint64_t bytes, peak;
} g_mg;
static _Atomic uintptr_t g_mg_base;
static pthread_mutex_t g_mg_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_dev_resident, g_dev_resident_peak;   /* bytes of pages on a device (g_mg_mu) */

int sim_managed_addr(const void *p) {
    uintptr_t b = atomic_load(&g_mg_base), a = (uintptr_t)p;
    return b && a >= b && a - b < MG_LEN;
}

/* ---- locations ---- */
static uint32_t loc_bit(int t, int id) {
    switch (t) {
    case ACL_MEM_LOCATIONTYPE_DEVICE: return 1u << id;
    case ACL_MEM_LOCATIONTYPE_HOST: return 1u << LOC_HOST_BIT;
    case ACL_MEM_LOCATIONTYPE_HOST_NUMA: return 1u << (LOC_HOST_BIT + 1 + (id < 14 ? id : 14));
    default: return 0;
    }
}
static int host_side(int t) { return t == ACL_MEM_LOCATIONTYPE_HOST || t == ACL_MEM_LOCATIONTYPE_HOST_NUMA; }
static int same_loc(int t1, int id1, int t2, int id2) {
    return t1 == t2 && (t1 == ACL_MEM_LOCATIONTYPE_HOST || id1 == id2);
}
/* moving between these two locations crosses the link (host <-> device, device <-> device) */
static int crosses_link(int t1, int id1, int t2, int id2) {
    if (host_side(t1) && host_side(t2)) return 0;
    return !same_loc(t1, id1, t2, id2);
}
static int on_device(const sim_mpage *g) {
    if (g->read_mostly) return (g->copies & ((1u << LOC_HOST_BIT) - 1)) != 0;
    return g->loc_t == ACL_MEM_LOCATIONTYPE_DEVICE;
}

static int current_numa_node(void) {
    unsigned cpu = 0, node = 0;
    if (syscall(SYS_getcpu, &cpu, &node, NULL) != 0 || !sim_numa_node_valid((int)node)) return 0;
    return (int)node;
}

/* A location argument: 0 and *out, or the error code (107000, as the runtime's
 * location conversion and device-id checks give). allow_invalid: INVALID is
 * accepted (as "none"). */
static aclError loc_resolve(aclrtMemManagedLocation l, int allow_invalid, mloc *out, const char *api) {
    switch (l.type) {
    case ACL_MEM_LOCATIONTYPE_DEVICE:
        if (l.id < 0 || l.id >= aclsim_config()->devices) {
            aclsim_log("%s: device %d out of range [0, %d]", api, l.id, aclsim_config()->devices - 1);
            return ACL_ERROR_RT_PARAM_INVALID;
        }
        *out = (mloc){ACL_MEM_LOCATIONTYPE_DEVICE, (int8_t)l.id};
        return 0;
    case ACL_MEM_LOCATIONTYPE_HOST:
        *out = (mloc){ACL_MEM_LOCATIONTYPE_HOST, 0};
        return 0;
    case ACL_MEM_LOCATIONTYPE_HOST_NUMA:
        if (!sim_numa_node_valid(l.id)) {
            aclsim_log("%s: NUMA node %d does not exist on this host", api, l.id);
            return ACL_ERROR_RT_PARAM_INVALID;
        }
        *out = (mloc){ACL_MEM_LOCATIONTYPE_HOST_NUMA, (int8_t)l.id};
        return 0;
    case ACL_MEM_LOCATIONTYPE_HOST_NUMA_CURRENT:
        *out = (mloc){ACL_MEM_LOCATIONTYPE_HOST_NUMA, (int8_t)current_numa_node()};
        return 0;
    case ACL_MEM_LOCATIONTYPE_INVALID:
        if (allow_invalid) {
            *out = (mloc){ACL_MEM_LOCATIONTYPE_INVALID, 0};
            return 0;
        }
        /* fall through */
    default:
        aclsim_log("%s: location type %d is not DEVICE, HOST, HOST_NUMA or HOST_NUMA_CURRENT", api, (int)l.type);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
}

/* ---- allocation ---- */
static aclError arena_init_locked(void) {
    if (atomic_load(&g_mg_base)) return 0;
    void *p = mmap((void *)(uintptr_t)MG_BASE, MG_LEN, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) /* something else lives there: keep working at another address */
        p = mmap(NULL, MG_LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        aclsim_log("cannot reserve the managed memory range: %s", strerror(errno));
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    if ((uintptr_t)p != MG_BASE)   /* also a kernel without MAP_FIXED_NOREPLACE (a hint there) */
        aclsim_log("managed memory range at %p, not at the documented 0x%llx (address in use)", p,
                   (unsigned long long)MG_BASE);
    ra_init(&g_mg.va, (uintptr_t)p, MG_LEN);
    atomic_store(&g_mg_base, (uintptr_t)p);
    return 0;
}

ACL_FUNC_VISIBILITY aclError aclrtMemAllocManaged(void **ptr, uint64_t size, uint32_t flag) {
    if (!ptr) return ACL_ERROR_INVALID_PARAM;
    if (flag != ACL_RT_MEM_ATTACH_GLOBAL) {
        aclsim_log("aclrtMemAllocManaged: flag %u is not ACL_RT_MEM_ATTACH_GLOBAL (1), the only one", flag);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    if (size == 0) return ACL_ERROR_RT_PARAM_INVALID;   /* the runtime's check, after the acl layer's */
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    if (size > MG_LEN) goto oom;
    uint64_t len = sim_round_up(size, MG_PAGE), va;
    pthread_rwlock_wrlock(&g_mm);
    if ((rc = arena_init_locked()) || ra_alloc(&g_mg.va, len, MG_PAGE, &va)) {
        pthread_rwlock_unlock(&g_mm);
        goto oom;
    }
    if (mmap((void *)va, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
             0) == MAP_FAILED) {
        aclsim_log("aclrtMemAllocManaged: mmap of %llu bytes failed: %s", (unsigned long long)len, strerror(errno));
        ra_free(&g_mg.va, va, len);
        pthread_rwlock_unlock(&g_mm);
        goto oom;
    }
    sim_phys *ph = calloc(1, sizeof *ph);
    sim_mpage *pages = calloc(len / MG_PAGE, sizeof *pages);
    if (!ph || !pages) abort();
    *ph = (sim_phys){.magic = SIM_MAGIC_PHYS, .dev = -1, .loc = SIM_PH_MANAGED, .size = len, .pages = pages};
    sim_mem_add_managed_locked(va, len, ph);
    g_mg.bytes += len;
    if (g_mg.bytes > g_mg.peak) g_mg.peak = g_mg.bytes;
    pthread_rwlock_unlock(&g_mm);
    atomic_fetch_add(&g_stat[ST_AL_MANAGED], 1);
    atomic_fetch_add(&g_stat[ST_AL_MANAGED_BYTES], size);
    *ptr = (void *)va;
    return ACL_SUCCESS;
oom:
    atomic_fetch_add(&g_stat[ST_FAILED_ALLOCS], 1);
    aclsim_log("aclrtMemAllocManaged(%llu): the managed range (3 TiB per process) is full -> 207001",
               (unsigned long long)size);
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
}

void sim_managed_free_locked(sim_phys *ph, uintptr_t va, uint64_t len) {
    /* back to the inaccessible reservation: later accesses fault */
    if (mmap((void *)va, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
        aclsim_log("re-reserving managed memory at 0x%lx failed: %s", (unsigned long)va, strerror(errno));
    ra_free(&g_mg.va, va, len);
    g_mg.bytes -= len;
    pthread_mutex_lock(&g_mg_mu);
    for (uint64_t i = 0; i < len / MG_PAGE; i++)
        if (on_device(&ph->pages[i])) g_dev_resident -= MG_PAGE;
    pthread_mutex_unlock(&g_mg_mu);
    free(ph->pages);
    ph->magic = 0;
    free(ph);
}

/* ---- residency (g_mg_mu held) ---- */
static void note_dev_resident(int before, const sim_mpage *g) {
    int after = on_device(g);
    if (after > before) {
        g_dev_resident += MG_PAGE;
        if (g_dev_resident > g_dev_resident_peak) g_dev_resident_peak = g_dev_resident;
    } else if (after < before) {
        g_dev_resident -= MG_PAGE;
    }
}

/* Puts a copy of page g at l (read-mostly) or moves it there; returns the
 * bytes that crossed the link. */
static uint64_t page_place(sim_mpage *g, mloc l) {
    int before = on_device(g);
    uint64_t moved = 0;
    if (g->read_mostly) {
        uint32_t b = loc_bit(l.t, l.id);
        if (!(g->copies & b)) {
            /* a copy comes from an existing one: the host's if there is one */
            int from_host = (g->copies >> LOC_HOST_BIT) != 0;
            if (g->copies && (host_side(l.t) ? !from_host : 1)) moved = MG_PAGE;
            g->copies |= b;
        }
    } else if (g->loc_t == ACL_MEM_LOCATIONTYPE_INVALID) {
        g->loc_t = l.t;
        g->loc_id = l.id;
    } else if (!same_loc(g->loc_t, g->loc_id, l.t, l.id)) {
        if (crosses_link(g->loc_t, g->loc_id, l.t, l.id)) moved = MG_PAGE;
        g->loc_t = l.t;
        g->loc_id = l.id;
    }
    note_dev_resident(before, g);
    return moved;
}

void sim_managed_access_locked(sim_phys *ph, uintptr_t map_va, uintptr_t a, uint64_t n, int write, int dev,
                               sim_link *l) {
    mloc me = {ACL_MEM_LOCATIONTYPE_DEVICE, (int8_t)dev};
    uint32_t mebit = loc_bit(me.t, me.id);
    pthread_mutex_lock(&g_mg_mu);
    for (uintptr_t p = a, end = a + n; p < end;) {
        uint64_t idx = (p - map_va) / MG_PAGE;
        uintptr_t page_end = map_va + (idx + 1) * MG_PAGE;
        uint64_t seg = (page_end < end ? page_end : end) - p;
        sim_mpage *g = &ph->pages[idx];
        if (!g->read_mostly && g->loc_t != ACL_MEM_LOCATIONTYPE_INVALID &&
            !same_loc(g->loc_t, g->loc_id, me.t, me.id) && (g->acc & mebit) &&
            g->pref_t != ACL_MEM_LOCATIONTYPE_INVALID && same_loc(g->loc_t, g->loc_id, g->pref_t, g->pref_id)) {
            /* accessed-by: mapped remotely, read and written in place over the link */
            if (write == 0 || write == 2) l->mg_rd += seg;
            if (write == 1 || write == 2) l->mg_wr += seg;
            l->mg_fp += seg;
        } else if (write >= 0) {
            l->mg_migrated += page_place(g, me);
            if (write && g->read_mostly) {
                /* a write invalidates every other copy and ends read-mostly (docs) */
                int before = on_device(g);
                g->copies = 0;
                g->read_mostly = 0;
                g->loc_t = me.t;
                g->loc_id = me.id;
                note_dev_resident(before, g);
            }
        }
        p += seg;
    }
    pthread_mutex_unlock(&g_mg_mu);
}

/* ---- range validation ---- */
typedef struct mg_visit {
    int (*page)(struct mg_visit *v, sim_mpage *g);   /* per page; non-zero stops */
    int bad;                                          /* a piece that is not managed memory */
    uint64_t moved;
    mloc l;
    int advise;
    /* attribute aggregation */
    int first;
    sim_mpage agg;
    uint32_t acc_all;
    int rm_all, pref_same, lp_same;
} mg_visit;

static int visit_piece(void *ctx, sim_phys *ph, uintptr_t map_va, uintptr_t a, uint64_t n) {
    mg_visit *v = ctx;
    if (ph->loc != SIM_PH_MANAGED) {
        v->bad = 1;
        return 1;
    }
    if (!v->page) return 0;
    uint64_t first = (a - map_va) / MG_PAGE, last = (a + n - 1 - map_va) / MG_PAGE;
    for (uint64_t i = first; i <= last; i++) {
        int rc = v->page(v, &ph->pages[i]);
        if (rc) return rc;
    }
    return 0;
}

/* Checks that [ptr, ptr+size) is live managed memory (g_mm held), then runs
 * v->page over its pages (g_mg_mu held). 0, or 107000 with a message. */
static aclError mg_visit_range(const void *ptr, uint64_t size, mg_visit *v, const char *api) {
    uintptr_t a = (uintptr_t)ptr;
    if (!sim_managed_addr(ptr) || a + size < a || !sim_managed_addr((const void *)(a + size - 1))) {
        aclsim_log("%s(%p, %llu): not inside the managed memory range", api, ptr, (unsigned long long)size);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    mg_visit probe = {0};
    if (sim_mem_walk_locked(a, size, visit_piece, &probe) || probe.bad) {
        aclsim_log("%s(%p, %llu): not live managed memory (aclrtMemAllocManaged)", api, ptr,
                   (unsigned long long)size);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    if (!v) return 0;
    pthread_mutex_lock(&g_mg_mu);
    int rc = sim_mem_walk_locked(a, size, visit_piece, v);
    pthread_mutex_unlock(&g_mg_mu);
    return rc > 0 ? ACL_ERROR_RT_PARAM_INVALID : 0;
}

/* The documented size rule of advise and prefetch: a multiple of 2 MiB, at most 3 TiB. */
static aclError size_check(uint64_t size, const char *api) {
    if (size % MG_PAGE || size > MG_LEN) {
        aclsim_log("%s: size %llu is not a multiple of 2 MiB in (0, 3 TiB]", api, (unsigned long long)size);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    return 0;
}

/* ---- prefetch ---- */
typedef struct pf_item { uintptr_t a; uint64_t n; mloc l; } pf_item;
typedef struct pf_payload { size_t n; pf_item it[]; } pf_payload;

static int pf_page(mg_visit *v, sim_mpage *g) {
    v->moved += page_place(g, v->l);
    g->lp_t = v->l.t;
    g->lp_id = v->l.id;
    return 0;
}

/* Runs on the stream (a host function, as on CANN): moves the pages, then the
 * stream is busy for the bytes moved at link bandwidth. Memory freed since the
 * call is skipped with a message, as the runtime's callback only logs. */
static aclError prefetch_exec(sim_work *w) {
    pf_payload *p = w->payload;
    uint64_t moved = 0, end = w->start_ns;
    pthread_rwlock_rdlock(&g_mm);
    for (size_t i = 0; i < p->n; i++) {
        mg_visit v = {.page = pf_page, .l = p->it[i].l};
        if (mg_visit_range((void *)p->it[i].a, p->it[i].n, &v, w->what) == 0 && v.moved) {
            moved += v.moved;
            /* over the shared link (core.c): to a device on that device's
             * link, to the host on the stream's device's */
            int to_dev = p->it[i].l.t == ACL_MEM_LOCATIONTYPE_DEVICE;
            uint64_t e = sim_link_transfer(to_dev ? p->it[i].l.id : w->device, to_dev, end, v.moved);
            if (e > end) end = e;
        }
    }
    pthread_rwlock_unlock(&g_mm);
    atomic_fetch_add(&g_stat[ST_MG_PREFETCH_BYTES], moved);
    w->end_ns = end;
    return 0;
}

static void pf_destroy(sim_work *w) { free(w->payload); }

static aclError prefetch_submit(pf_payload *p, aclrtStream stream, const char *api) {
    aclError rc;
    pthread_rwlock_rdlock(&g_mm);
    for (size_t i = 0; i < p->n; i++) {
        if ((rc = size_check(p->it[i].n, api)) || (rc = mg_visit_range((void *)p->it[i].a, p->it[i].n, NULL, api))) {
            pthread_rwlock_unlock(&g_mm);
            free(p);
            return rc;
        }
    }
    pthread_rwlock_unlock(&g_mm);
    sim_work *w = aclsim_work_new(0);
    snprintf(w->what, sizeof w->what, "%s", api);
    w->kind = SIM_WORK_HOST_FUNC;
    w->exec = prefetch_exec;
    w->destroy = pf_destroy;
    w->payload = p;
    rc = aclsim_submit(stream, w);
    if (!rc) atomic_fetch_add(&g_stat[ST_MG_PREFETCHES], 1);
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtMemManagedPrefetchAsync(const void *ptr, size_t size,
    aclrtMemManagedLocation location, uint32_t flags, aclrtStream stream) {
    const char *api = "aclrtMemManagedPrefetchAsync";
    if (!ptr || size == 0 || flags != 0) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    aclError rc = aclsim_stream_check(stream);
    if (rc) return rc;
    mloc l;
    if ((rc = loc_resolve(location, 0, &l, api))) return rc;
    pf_payload *p = malloc(sizeof *p + sizeof(pf_item));
    if (!p) abort();
    p->n = 1;
    p->it[0] = (pf_item){(uintptr_t)ptr, size, l};
    return prefetch_submit(p, stream, api);
}

ACL_FUNC_VISIBILITY aclError aclrtMemManagedPrefetchBatchAsync(const void **ptrs, size_t *sizes, size_t count,
    aclrtMemManagedLocation *prefetchLocs, size_t *prefetchLocIdxs, size_t numPrefetchLocs, uint64_t flags,
    aclrtStream stream) {
    const char *api = "aclrtMemManagedPrefetchBatchAsync";
    if (!ptrs || !sizes || !prefetchLocs || !prefetchLocIdxs || count == 0 || numPrefetchLocs == 0 || flags != 0 ||
        count < numPrefetchLocs)
        return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    if (prefetchLocIdxs[0] != 0) {
        aclsim_log("%s: prefetchLocIdxs[0] must be 0", api);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    for (size_t i = 0; i < numPrefetchLocs; i++) {
        if (prefetchLocIdxs[i] >= count || (i && prefetchLocIdxs[i] <= prefetchLocIdxs[i - 1])) {
            aclsim_log("%s: prefetchLocIdxs must increase from 0 and stay below count %zu", api, count);
            return ACL_ERROR_RT_PARAM_INVALID;
        }
    }
    for (size_t i = 0; i < count; i++)
        if (!ptrs[i]) return ACL_ERROR_RT_PARAM_INVALID;
    aclError rc = aclsim_stream_check(stream);
    if (rc) return rc;
    pf_payload *p = malloc(sizeof *p + count * sizeof(pf_item));
    if (!p) abort();
    p->n = count;
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        while (k + 1 < numPrefetchLocs && prefetchLocIdxs[k + 1] <= i) k++;
        mloc l;
        if ((rc = loc_resolve(prefetchLocs[k], 0, &l, api))) {
            free(p);
            return rc;
        }
        p->it[i] = (pf_item){(uintptr_t)ptrs[i], sizes[i], l};
        if (sizes[i] == 0) {
            free(p);
            return ACL_ERROR_RT_PARAM_INVALID;
        }
    }
    return prefetch_submit(p, stream, api);
}

/* ---- advise ---- */
/* Checks the documented preconditions of SET_PREFERRED_LOCATION for one page:
 * without read-mostly, a page already resident elsewhere is an error. */
static int adv_check_page(mg_visit *v, sim_mpage *g) {
    if (v->advise != ACL_MEM_ADVISE_SET_PREFERRED_LOCATION || g->read_mostly) return 0;
    if (g->loc_t == ACL_MEM_LOCATIONTYPE_INVALID) return 0;
    if (host_side(v->l.t) ? g->loc_t == ACL_MEM_LOCATIONTYPE_DEVICE : !same_loc(g->loc_t, g->loc_id, v->l.t, v->l.id)) {
        v->bad = 2;
        return 1;
    }
    return 0;
}

static int adv_page(mg_visit *v, sim_mpage *g) {
    mloc l = v->l;
    int before = on_device(g);
    switch (v->advise) {
    case ACL_MEM_ADVISE_SET_READ_MOSTLY:
        /* location ignored: the host gets a read-only copy */
        if (!g->read_mostly) {
            uint32_t cur = g->loc_t == ACL_MEM_LOCATIONTYPE_INVALID ? 0 : loc_bit(g->loc_t, g->loc_id);
            if (g->loc_t == ACL_MEM_LOCATIONTYPE_DEVICE) v->moved += MG_PAGE;
            g->read_mostly = 1;
            g->copies = cur | (1u << LOC_HOST_BIT);
        }
        break;
    case ACL_MEM_ADVISE_UNSET_READ_MOSTLY:
        /* one copy stays, at `location` (INVALID: the host), made there if need be */
        if (g->read_mostly) {
            if (l.t == ACL_MEM_LOCATIONTYPE_INVALID) l = (mloc){ACL_MEM_LOCATIONTYPE_HOST, 0};
            if (!(g->copies & loc_bit(l.t, l.id))) v->moved += page_place(g, l);
            g->read_mostly = 0;
            g->copies = 0;
            g->loc_t = l.t;
            g->loc_id = l.id;
        }
        break;
    case ACL_MEM_ADVISE_SET_PREFERRED_LOCATION:
        if (g->read_mostly) {
            if (l.t == ACL_MEM_LOCATIONTYPE_DEVICE) v->moved += page_place(g, l);   /* a read-only copy there */
        } else if (g->loc_t == ACL_MEM_LOCATIONTYPE_INVALID) {
            g->loc_t = l.t;          /* physical memory at the preferred location */
            g->loc_id = l.id;
        }
        g->pref_t = l.t;
        g->pref_id = l.id;
        break;
    case ACL_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
        g->pref_t = ACL_MEM_LOCATIONTYPE_INVALID;
        g->pref_id = 0;
        break;
    case ACL_MEM_ADVISE_SET_ACCESSED_BY:
        g->acc |= loc_bit(l.t, l.id);
        /* with the same location as the preferred one: memory is set up there now */
        if (!g->read_mostly && g->loc_t == ACL_MEM_LOCATIONTYPE_INVALID &&
            same_loc(g->pref_t, g->pref_id, l.t, l.id)) {
            g->loc_t = l.t;
            g->loc_id = l.id;
        }
        break;
    case ACL_MEM_ADVISE_UNSET_ACCESSED_BY:
        g->acc &= ~loc_bit(l.t, l.id);
        break;
    }
    note_dev_resident(before, g);
    return 0;
}

/* Synchronous; what it moves (read-only copies, preferred placement) costs the
 * caller link time. */
ACL_FUNC_VISIBILITY aclError aclrtMemManagedAdvise(const void *const ptr, uint64_t size,
    aclrtMemManagedAdviseType advise, aclrtMemManagedLocation location) {
    const char *api = "aclrtMemManagedAdvise";
    if (!ptr || size == 0) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    if ((unsigned)advise > ACL_MEM_ADVISE_UNSET_ACCESSED_BY) {
        aclsim_log("%s: advise %d out of range [0, %d]", api, (int)advise, ACL_MEM_ADVISE_UNSET_ACCESSED_BY);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    if (location.type == ACL_MEM_LOCATIONTYPE_DEVICE &&
        (location.id < 0 || location.id >= aclsim_config()->devices)) {
        aclsim_log("%s: device %d out of range", api, location.id);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    if ((rc = size_check(size, api))) return rc;
    mloc l = {ACL_MEM_LOCATIONTYPE_INVALID, 0};
    switch (advise) {
    case ACL_MEM_ADVISE_SET_READ_MOSTLY: case ACL_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
        break;   /* location ignored */
    case ACL_MEM_ADVISE_UNSET_READ_MOSTLY:
        rc = loc_resolve(location, 1, &l, api);
        break;
    default:
        rc = loc_resolve(location, 0, &l, api);
    }
    if (rc) return rc;
    pthread_rwlock_rdlock(&g_mm);
    mg_visit check = {.page = adv_check_page, .l = l, .advise = advise};
    rc = mg_visit_range(ptr, size, &check, api);
    if (rc && check.bad == 2) {
        aclsim_log("%s: cannot prefer %s: part of the range already has memory elsewhere (set the preferred "
                   "location before first use, or prefetch first)", api,
                   l.t == ACL_MEM_LOCATIONTYPE_DEVICE ? "a device" : "the host");
    }
    mg_visit v = {.page = adv_page, .l = l, .advise = advise};
    if (!rc) rc = mg_visit_range(ptr, size, &v, api);
    pthread_rwlock_unlock(&g_mm);
    if (rc) return rc;
    atomic_fetch_add(&g_stat[ST_MG_ADVISES], 1);
    atomic_fetch_add(&g_stat[ST_MG_ADVISE_BYTES], v.moved);
    if (v.moved) {
        /* what it places on a device crosses to it, the rest (host copies)
         * from the current device, over the shared link */
        int to_dev = l.t == ACL_MEM_LOCATIONTYPE_DEVICE;
        sim_host_gate(to_dev ? l.id : t_dev);
        uint64_t start = atomic_load(&g_host_ns);
        sim_host_advance(sim_link_transfer(to_dev ? l.id : t_dev, to_dev, start, v.moved) - start);
    }
    return ACL_SUCCESS;
}

/* ---- attributes ---- */
static int attr_page(mg_visit *v, sim_mpage *g) {
    if (!v->first) {
        v->first = 1;
        v->agg = *g;
        v->acc_all = g->acc;
        v->rm_all = g->read_mostly;
        v->pref_same = v->lp_same = 1;
        return 0;
    }
    v->acc_all &= g->acc;
    v->rm_all &= g->read_mostly;
    if (!same_loc(g->pref_t, g->pref_id, v->agg.pref_t, v->agg.pref_id)) v->pref_same = 0;
    if (!same_loc(g->lp_t, g->lp_id, v->agg.lp_t, v->agg.lp_id)) v->lp_same = 0;
    return 0;
}

/* -1 host, the id for a device or NUMA node, -2 none or mixed (docs) */
static int32_t loc_attr_id(int same, int t, int id) {
    if (!same || t == ACL_MEM_LOCATIONTYPE_INVALID) return -2;
    return t == ACL_MEM_LOCATIONTYPE_HOST ? -1 : id;
}

static aclError attr_fill(aclrtMemManagedRangeAttribute a, const mg_visit *v, void *data, size_t dataSize,
                          const char *api) {
    int32_t *out = data;
    if (a == ACL_MEM_RANGE_ATTRIBUTE_ACCESSED_BY) {
        if (dataSize == 0 || dataSize % 4) goto bad_size;
        size_t n = dataSize / 4, k = 0;
        for (int b = 0; b < 32 && k < n; b++) {
            if (!(v->acc_all >> b & 1)) continue;
            out[k++] = b < LOC_HOST_BIT ? b : b == LOC_HOST_BIT ? -1 : b - LOC_HOST_BIT - 1;
        }
        while (k < n) out[k++] = -2;
        return 0;
    }
    if (dataSize != 4) goto bad_size;   /* every other attribute is one 4-byte value */
    switch (a) {
    case ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY: *out = v->rm_all; break;
    case ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION: *out = loc_attr_id(v->pref_same, v->agg.pref_t, v->agg.pref_id); break;
    case ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE:
        *out = v->pref_same ? v->agg.pref_t : ACL_MEM_LOCATIONTYPE_INVALID;
        break;
    case ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID:
        *out = v->pref_same && v->agg.pref_t != ACL_MEM_LOCATIONTYPE_HOST ? loc_attr_id(1, v->agg.pref_t, v->agg.pref_id)
                                                                         : -2;
        break;
    case ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION: *out = loc_attr_id(v->lp_same, v->agg.lp_t, v->agg.lp_id); break;
    case ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE:
        *out = v->lp_same ? v->agg.lp_t : ACL_MEM_LOCATIONTYPE_INVALID;
        break;
    case ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID:
        *out = v->lp_same && v->agg.lp_t != ACL_MEM_LOCATIONTYPE_HOST ? loc_attr_id(1, v->agg.lp_t, v->agg.lp_id) : -2;
        break;
    default: break;
    }
    return 0;
bad_size:
    aclsim_log("%s: dataSize %zu does not fit attribute %d (4 bytes; ACCESSED_BY: a multiple of 4)", api, dataSize,
               (int)a);
    return ACL_ERROR_RT_PARAM_INVALID;
}

static int attr_valid(int a) {
    return a >= ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY && a <= ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID;
}

static aclError attrs_query(aclrtMemManagedRangeAttribute *attrs, size_t n, const void *ptr, size_t size,
                            void **data, size_t *sizes, const char *api) {
    for (size_t i = 0; i < n; i++) {
        if (!attr_valid(attrs[i])) {
            aclsim_log("%s: attribute %d out of range [1, 8]", api, (int)attrs[i]);
            return ACL_ERROR_RT_PARAM_INVALID;
        }
        if (!data[i]) return ACL_ERROR_RT_PARAM_INVALID;
    }
    mg_visit v = {.page = attr_page};
    pthread_rwlock_rdlock(&g_mm);
    aclError rc = mg_visit_range(ptr, size, &v, api);
    pthread_rwlock_unlock(&g_mm);
    for (size_t i = 0; !rc && i < n; i++) rc = attr_fill(attrs[i], &v, data[i], sizes[i], api);
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtMemManagedGetAttr(aclrtMemManagedRangeAttribute attribute, const void *ptr,
    size_t size, void *data, size_t dataSize) {
    if (!ptr || !data || size == 0) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    return attrs_query(&attribute, 1, ptr, size, &data, &dataSize, "aclrtMemManagedGetAttr");
}

ACL_FUNC_VISIBILITY aclError aclrtMemManagedGetAttrs(aclrtMemManagedRangeAttribute *attributes,
    size_t numAttributes, const void *ptr, size_t size, void **data, size_t *dataSizes) {
    if (!ptr || !attributes || !data || !dataSizes || size == 0) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    return attrs_query(attributes, numAttributes, ptr, size, data, dataSizes, "aclrtMemManagedGetAttrs");
}

/* ---- statistics ---- */
void sim_managed_json(FILE *f) {
    pthread_rwlock_rdlock(&g_mm);
    uint64_t bytes = g_mg.bytes, peak = g_mg.peak;
    pthread_rwlock_unlock(&g_mm);
    pthread_mutex_lock(&g_mg_mu);
    uint64_t dev = g_dev_resident, dev_peak = g_dev_resident_peak;
    pthread_mutex_unlock(&g_mg_mu);
    fprintf(f, "  \"managed\": {\"bytes\": %llu, \"peak_bytes\": %llu, \"device_resident_bytes\": %llu, "
            "\"device_resident_peak_bytes\": %llu, \"migrated_bytes\": %llu, \"remote_bytes\": %llu,\n"
            "    \"prefetches\": %llu, \"prefetch_bytes\": %llu, \"advises\": %llu, \"advise_moved_bytes\": %llu},\n",
            (unsigned long long)bytes, (unsigned long long)peak, (unsigned long long)dev, (unsigned long long)dev_peak,
            (unsigned long long)g_stat[ST_MG_MIGRATED], (unsigned long long)g_stat[ST_MG_REMOTE],
            (unsigned long long)g_stat[ST_MG_PREFETCHES], (unsigned long long)g_stat[ST_MG_PREFETCH_BYTES],
            (unsigned long long)g_stat[ST_MG_ADVISES], (unsigned long long)g_stat[ST_MG_ADVISE_BYTES]);
}
