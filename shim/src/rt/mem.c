/* Device memory: a reserved VA arena per device, physical memory in a memfd per
 * device (2 MiB granules for VMM handles and large allocations, 4 KiB pages for
 * small ones), mappings made with mmap(MAP_FIXED) so that unmapped device VAs
 * are genuinely inaccessible. aclrtMalloc is reserve + physical + map inside
 * the runtime, as on CANN. Physical handles can also live in host RAM
 * (aclrtMallocPhysical at a HOST / HOST_NUMA location): a memfd of their own,
 * mapped at device VAs like HBM handles, outside HBM capacity; device work on
 * them is measured (sim_link_traffic_locked) and costed at link bandwidth.
 * Managed allocations (managed.c) are mappings too. Pinned host memory
 * (aclrtMallocHost) is tracked so copies can be costed and AsyncWithCondition
 * can tell pinned from pageable. Everything here is guarded by g_mm (writers:
 * allocation and mapping changes; readers: range checks and the data accesses
 * they protect). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "rt/rt.h"

#define MIB (1ULL << 20)
#define GIB (1ULL << 30)
#define TIB (1ULL << 40)

typedef struct sim_map { uintptr_t va; uint64_t len; sim_phys *ph; uint64_t off; int user; } sim_map;
enum { RESV_USER = 0, RESV_MALLOC = 1, RESV_MANAGED = 2 };
typedef struct sim_resv { uintptr_t va; uint64_t len; int dev; int kind; sim_phys *ph; } sim_resv;
typedef struct sim_block { uintptr_t addr; uint64_t len; } sim_block;

/* sorted dynamic arrays (by address) */
#define VEC(T) struct { T *v; size_t n, cap; }
static VEC(sim_resv) g_resv;
static VEC(sim_block) g_pinned;
static sim_ptrset g_phys_handles;

/* Host RAM for host-located physical handles (under g_mm). */
static struct {
    int ready;
    sim_ralloc phys;             /* free offsets in memfd */
    int memfd;                   /* absent in phantom mode */
    uint64_t used, peak;         /* bytes of live host handles */
    uint64_t mapped, mapped_peak;/* bytes of host handles mapped at device VAs */
} g_host;
static atomic_int g_link_maps;   /* mappings whose device access crosses the link (host, managed) */

#define VEC_INSERT(vec, at, item) do {                                             \
        if ((vec).n == (vec).cap) {                                                 \
            (vec).cap = (vec).cap ? (vec).cap * 2 : 64;                             \
            (vec).v = realloc((vec).v, (vec).cap * sizeof(*(vec).v));               \
            if (!(vec).v) abort();                                                  \
        }                                                                           \
        memmove((vec).v + (at) + 1, (vec).v + (at), ((vec).n - (at)) * sizeof(*(vec).v)); \
        (vec).v[at] = (item);                                                       \
        (vec).n++;                                                                  \
    } while (0)
#define VEC_REMOVE(vec, at) do {                                                   \
        memmove((vec).v + (at), (vec).v + (at) + 1, ((vec).n - (at) - 1) * sizeof(*(vec).v)); \
        (vec).n--;                                                                  \
    } while (0)
/* index of the last element with .FIELD <= key, or (size_t)-1 */
#define VEC_FLOOR(vec, FIELD, key, out) do {                                       \
        size_t lo_ = 0, hi_ = (vec).n;                                              \
        while (lo_ < hi_) {                                                         \
            size_t mid_ = (lo_ + hi_) / 2;                                          \
            if ((vec).v[mid_].FIELD <= (key)) lo_ = mid_ + 1; else hi_ = mid_;      \
        }                                                                           \
        (out) = lo_ - 1;                                                            \
    } while (0)

/* The mappings, ordered by VA: a treap (a binary search tree kept balanced by
 * random heap priorities), so that mapping and unmapping cost O(log n) —
 * not a sorted array shifted on every map and unmap (u3m maps and unmaps a
 * 2 MiB chunk at each fault-in and eviction: tens of thousands a step, and
 * the shifts were a fifth of the host CPU of a tiered 13B Adam step). Lookups
 * are exact floors (the mapping with the greatest VA <= a): work on memory
 * that is not mapped still faults. Under g_mm. */
typedef struct map_node { sim_map m; struct map_node *l, *r; uint32_t pri; } map_node;
static map_node *g_map_root;
static map_node *g_map_free;   /* freed nodes, reused (linked by .r) */
static uint32_t g_map_rand = 0x9e3779b9u;

/* the mapping with the greatest VA <= key, or NULL */
static sim_map *map_floor_locked(uintptr_t key) {
    map_node *t = g_map_root, *best = NULL;
    while (t) {
        if (t->m.va <= key) {
            best = t;
            t = t->r;
        } else {
            t = t->l;
        }
    }
    return best ? &best->m : NULL;
}

static map_node *map_tree_insert(map_node *t, map_node *n) {
    if (!t) return n;
    if (n->m.va < t->m.va) {
        t->l = map_tree_insert(t->l, n);
        if (t->l->pri > t->pri) {   /* rotate right */
            map_node *x = t->l;
            t->l = x->r;
            x->r = t;
            return x;
        }
    } else {
        t->r = map_tree_insert(t->r, n);
        if (t->r->pri > t->pri) {   /* rotate left */
            map_node *x = t->r;
            t->r = x->l;
            x->l = t;
            return x;
        }
    }
    return t;
}

static map_node *map_tree_merge(map_node *a, map_node *b) {   /* every VA of a < every VA of b */
    if (!a) return b;
    if (!b) return a;
    if (a->pri > b->pri) {
        a->r = map_tree_merge(a->r, b);
        return a;
    }
    b->l = map_tree_merge(a, b->l);
    return b;
}

/* removes the node of the mapping at exactly `va` (present) from the tree under *link */
static map_node *map_tree_erase(map_node **link, uintptr_t va) {
    while (*link && (*link)->m.va != va) link = va < (*link)->m.va ? &(*link)->l : &(*link)->r;
    map_node *n = *link;
    if (n) *link = map_tree_merge(n->l, n->r);
    return n;
}

static void map_tree_add(sim_map m) {
    map_node *n = g_map_free;
    if (n) g_map_free = n->r;
    else if (!(n = malloc(sizeof *n))) abort();
    g_map_rand ^= g_map_rand << 13;
    g_map_rand ^= g_map_rand >> 17;
    g_map_rand ^= g_map_rand << 5;
    *n = (map_node){m, NULL, NULL, g_map_rand};
    g_map_root = map_tree_insert(g_map_root, n);
}

/* ---- devices ---- */
void sim_mem_init_device(sim_device *d) {
    if (d->arena) return;   /* already made by a reservation without a context */
    uint64_t len = g_cfg.hbm_bytes * 4;
    if (len < TIB) len = TIB;
    len = sim_round_up(len, GIB);
    /* a recognisable, device-specific range far from the host heap */
    void *hint = (void *)(uintptr_t)(0x100000000000ULL + (uint64_t)d->id * 0x40000000000ULL);
    void *p = mmap(hint, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        aclsim_log("cannot reserve %llu bytes of device VA for device %d: %s", (unsigned long long)len, d->id,
                   strerror(errno));
        abort();
    }
    d->arena = (uintptr_t)p;
    d->arena_len = len;
    ra_init(&d->va, d->arena, len);
    uint64_t phys_space = sim_round_up(g_cfg.hbm_bytes * 2 + GIB, GIB);
    ra_init(&d->phys, 0, phys_space);
    d->memfd = -1;
    if (!g_cfg.phantom) {
        char name[32];
        snprintf(name, sizeof name, "aclsim-hbm%d", d->id);
        d->memfd = memfd_create(name, MFD_CLOEXEC);
        if (d->memfd < 0 || ftruncate(d->memfd, (off_t)phys_space) != 0) {
            aclsim_log("cannot create device memory for device %d: %s", d->id, strerror(errno));
            abort();
        }
    }
}

void sim_mem_stats(int dev, uint64_t *used, uint64_t *peak) {
    pthread_rwlock_rdlock(&g_mm);
    *used = g_dev[dev].used;
    *peak = g_dev[dev].peak;
    pthread_rwlock_unlock(&g_mm);
}

static sim_device *dev_of_addr_locked(uintptr_t a) {
    for (int i = 0; i < g_cfg.devices; i++) {
        sim_device *d = &g_dev[i];
        if (d->arena && a >= d->arena && a - d->arena < d->arena_len) return d;
    }
    return NULL;
}

int sim_device_of_addr(const void *p) {
    sim_device *d = dev_of_addr_locked((uintptr_t)p);   /* arenas never move: no lock needed */
    return d ? d->id : -1;
}

SIM_API int aclsim_is_device_addr(const void *addr) { return sim_device_of_addr(addr) >= 0; }

/* ---- physical memory ---- */
static void note_failed_alloc(int dev) {
    atomic_fetch_add(&g_stat[ST_FAILED_ALLOCS], 1);
    atomic_fetch_add(&g_dev[dev].failed_allocs, 1);
}

static sim_phys *phys_alloc_locked(int dev, uint64_t size, uint64_t align) {
    sim_device *d = &g_dev[dev];
    uint64_t off;
    if (size > g_cfg.hbm_bytes || d->used + size > g_cfg.hbm_bytes) return NULL;
    if (ra_alloc(&d->phys, size, align, &off)) return NULL;
    sim_phys *ph = calloc(1, sizeof *ph);
    if (!ph) abort();
    *ph = (sim_phys){.magic = SIM_MAGIC_PHYS, .dev = dev, .loc = SIM_PH_HBM, .off = off, .size = size};
    d->used += size;
    if (d->used > d->peak) d->peak = d->used;
    return ph;
}

static void host_pool_init_locked(void) {
    if (g_host.ready) return;
    uint64_t space = sim_round_up(g_cfg.host_bytes * 2 + GIB, GIB);
    ra_init(&g_host.phys, 0, space);
    g_host.memfd = -1;
    if (!g_cfg.phantom) {
        g_host.memfd = memfd_create("aclsim-hostmem", MFD_CLOEXEC);
        if (g_host.memfd < 0 || ftruncate(g_host.memfd, (off_t)space) != 0) {
            aclsim_log("cannot create host memory for physical handles: %s", strerror(errno));
            abort();
        }
    }
    g_host.ready = 1;
}

/* A physical handle in host RAM (NUMA node `numa`): 0 or -1 (no room). */
static sim_phys *host_phys_alloc_locked(uint64_t size, int numa) {
    host_pool_init_locked();
    uint64_t off;
    if (size > g_cfg.host_bytes || g_host.used + size > g_cfg.host_bytes) return NULL;
    if (ra_alloc(&g_host.phys, size, SIM_GRANULE, &off)) return NULL;
    sim_phys *ph = calloc(1, sizeof *ph);
    if (!ph) abort();
    *ph = (sim_phys){.magic = SIM_MAGIC_PHYS, .dev = -1, .loc = SIM_PH_HOST, .numa = numa, .off = off,
                     .size = size};
    g_host.used += size;
    if (g_host.used > g_host.peak) g_host.peak = g_host.used;
    return ph;
}

static int phys_memfd(const sim_phys *ph) {
    return ph->loc == SIM_PH_HOST ? g_host.memfd : g_dev[ph->dev].memfd;
}

static void phys_release_locked(sim_phys *ph) {
    int fd = phys_memfd(ph);
    /* punching the hole returns the pages and makes the next owner read zeros */
    if (fd >= 0 && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)ph->off, (off_t)ph->size) != 0)
        aclsim_log("fallocate(PUNCH_HOLE) failed: %s", strerror(errno));
    if (ph->loc == SIM_PH_HOST) {
        ra_free(&g_host.phys, ph->off, ph->size);
        g_host.used -= ph->size;
    } else {
        sim_device *d = &g_dev[ph->dev];
        ra_free(&d->phys, ph->off, ph->size);
        d->used -= ph->size;
    }
    ph->magic = 0;
    free(ph);
}

/* ---- mappings ---- */
static void map_record_locked(uintptr_t va, uint64_t len, sim_phys *ph, uint64_t off, int user) {
    map_tree_add((sim_map){va, len, ph, off, user});
    ph->nmaps++;
    if (ph->loc != SIM_PH_HBM) atomic_fetch_add(&g_link_maps, 1);
    if (ph->loc == SIM_PH_HOST) {
        g_host.mapped += len;
        if (g_host.mapped > g_host.mapped_peak) g_host.mapped_peak = g_host.mapped;
    }
}

static int map_insert_locked(uintptr_t va, uint64_t len, sim_phys *ph, uint64_t off, int user) {
    int fd = phys_memfd(ph);
    if (fd >= 0) {
        void *p = mmap((void *)va, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)(ph->off + off));
        if (p == MAP_FAILED) {
            aclsim_log("mmap of %s memory at 0x%lx failed: %s", ph->loc == SIM_PH_HOST ? "host" : "device",
                       (unsigned long)va, strerror(errno));
            return -1;
        }
    }
    map_record_locked(va, len, ph, off, user);
    return 0;
}

/* removes `mp` (a mapping map_floor_locked returned) */
static void map_remove_locked(sim_map *mp) {
    sim_map m = *mp;
    if (!g_cfg.phantom && m.ph->loc != SIM_PH_MANAGED) {
        /* back to an inaccessible reservation: later accesses fault */
        if (mmap((void *)m.va, m.len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) ==
            MAP_FAILED)
            aclsim_log("re-reserving 0x%lx failed: %s", (unsigned long)m.va, strerror(errno));
    }
    m.ph->nmaps--;
    if (m.ph->loc != SIM_PH_HBM) atomic_fetch_sub(&g_link_maps, 1);
    if (m.ph->loc == SIM_PH_HOST) g_host.mapped -= m.len;
    map_node *n = map_tree_erase(&g_map_root, m.va);
    if (n) {
        n->r = g_map_free;
        g_map_free = n;
    }
}

/* 1 if any mapping intersects [va, va+len) */
static int map_overlaps_locked(uintptr_t va, uint64_t len) {
    sim_map *m = map_floor_locked(va + len - 1);
    return m && m->va + m->len > va;
}

static size_t resv_find_locked(uintptr_t va) {
    size_t i;
    VEC_FLOOR(g_resv, va, va, i);
    return i;
}

/* managed.c made the (anonymous, host-accessible) mapping itself */
void sim_mem_add_managed_locked(uintptr_t va, uint64_t len, sim_phys *ph) {
    map_record_locked(va, len, ph, 0, 0);
    size_t at = resv_find_locked(va);
    VEC_INSERT(g_resv, at + 1, ((sim_resv){va, len, -1, RESV_MANAGED, ph}));
}

typedef VEC(uintptr_t) va_vec;

/* In order, the VAs of the mappings inside [lo, hi) or of `dev`'s HBM. */
static void map_collect(map_node *t, int dev, uintptr_t lo, uintptr_t hi, va_vec *out) {
    for (; t; t = t->r) {
        map_collect(t->l, dev, lo, hi, out);
        int here = t->m.va >= lo && t->m.va < hi;
        int ours = t->m.ph->loc == SIM_PH_HBM && t->m.ph->dev == dev;
        if (here || ours) VEC_INSERT(*out, out->n, t->m.va);
    }
}

/* The last reference to `dev` went (aclrtResetDevice, aclrtResetDeviceForce):
 * as on CANN, the device's memory goes with its default context. Every
 * mapping at the device's addresses or of its HBM, every aclrtMalloc block
 * and reserved range of the device, and every physical handle in its HBM is
 * released; addresses and handles the program still holds then fault or are
 * refused as not live. Host-located handles belong to the host and stay
 * (only their mappings here go); managed memory is the process's and stays.
 * Returns the HBM bytes released. */
uint64_t sim_mem_release_device(int dev) {
    pthread_rwlock_wrlock(&g_mm);
    sim_device *d = &g_dev[dev];
    if (!d->arena) {
        pthread_rwlock_unlock(&g_mm);
        return 0;
    }
    uint64_t before = d->used;
    va_vec vas = {0};
    map_collect(g_map_root, dev, d->arena, d->arena + d->arena_len, &vas);
    for (size_t i = 0; i < vas.n; i++) {
        sim_map *m = map_floor_locked(vas.v[i]);
        if (m && m->va == vas.v[i]) map_remove_locked(m);
    }
    free(vas.v);
    for (size_t i = g_resv.n; i-- > 0;) {
        sim_resv r = g_resv.v[i];
        if (r.dev != dev || r.kind == RESV_MANAGED) continue;
        if (r.kind == RESV_MALLOC) phys_release_locked(r.ph);
        ra_free(&d->va, r.va, r.len);
        VEC_REMOVE(g_resv, i);
    }
    for (size_t i = 0; i < g_phys_handles.cap; i++) {
        uintptr_t k = g_phys_handles.slot[i];
        if (k <= 1) continue;   /* empty or a tombstone */
        sim_phys *ph = (sim_phys *)k;
        if (ph->loc != SIM_PH_HBM || ph->dev != dev) continue;
        g_phys_handles.slot[i] = 1;   /* ps_del's tombstone, in place: the walk goes on */
        phys_release_locked(ph);
    }
    uint64_t released = before - d->used;
    pthread_rwlock_unlock(&g_mm);
    return released;
}

SIM_API void aclsim_mm_read_lock(void) { pthread_rwlock_rdlock(&g_mm); }
SIM_API void aclsim_mm_read_unlock(void) { pthread_rwlock_unlock(&g_mm); }

SIM_API aclError aclsim_check_ranges(const sim_range *r, int n, const char *what) {
    for (int k = 0; k < n; k++) {
        uintptr_t a = r[k].addr, end = r[k].addr + r[k].bytes;
        if (r[k].bytes == 0) continue;
        if (end < a) goto fault;   /* wraps around */
        while (a < end) {
            sim_map *m = map_floor_locked(a);
            if (!m || m->va + m->len <= a) goto fault;
            a = m->va + m->len;
        }
        continue;
    fault:;
        sim_device *d = dev_of_addr_locked(a);
        atomic_fetch_add(&g_stat[ST_MMU_FAULTS], 1);
        atomic_fetch_add(&(d ? d : &g_dev[t_dev >= 0 ? t_dev : 0])->mmu_faults, 1);
        aclsim_log("device MMU fault: %s %s unmapped device memory at 0x%lx (range 0x%lx + %zu bytes)%s",
                   what ? what : "work", r[k].write ? "wrote" : "read", (unsigned long)a,
                   (unsigned long)r[k].addr, r[k].bytes,
                   d ? "" : sim_managed_addr((void *)a) ? " [managed range, not allocated]" : " [not a device address]");
        return ACL_ERROR_RT_DEVICE_MEM_ERROR;
    }
    return 0;
}

int sim_mem_walk_locked(uintptr_t a, uint64_t n,
                        int (*fn)(void *ctx, sim_phys *ph, uintptr_t map_va, uintptr_t a, uint64_t n), void *ctx) {
    uintptr_t end = a + n;
    if (end < a) return -1;
    while (a < end) {
        sim_map *m = map_floor_locked(a);
        if (!m || m->va + m->len <= a) return -1;
        uintptr_t stop = m->va + m->len < end ? m->va + m->len : end;
        int rc = fn(ctx, m->ph, m->va, a, stop - a);
        if (rc) return rc;
        a = stop;
    }
    return 0;
}

typedef struct link_ctx { int dev, write; sim_link *l; } link_ctx;

/* write: 0 read, 1 written, 2 read and written, -1 footprint only */
static int link_piece(void *ctx, sim_phys *ph, uintptr_t map_va, uintptr_t a, uint64_t n) {
    link_ctx *c = ctx;
    if (ph->loc == SIM_PH_HOST) {
        if (c->write == 0 || c->write == 2) c->l->hm_rd += n;
        if (c->write == 1 || c->write == 2) c->l->hm_wr += n;
        c->l->hm_fp += n;
    } else if (ph->loc == SIM_PH_MANAGED) {
        sim_managed_access_locked(ph, map_va, a, n, c->write, c->dev, c->l);
    }
    return 0;
}

/* An output range that repeats an input updated in place (ApplyAdam lists var,
 * m, v as both) is written once, not twice. */
static int repeats_inplace_input(const sim_range *r, int n, int k) {
    if (r[k].write != 1) return 0;
    for (int j = 0; j < n; j++)
        if (r[j].write == 2 && r[j].addr == r[k].addr && r[j].bytes == r[k].bytes) return 1;
    return 0;
}

void sim_link_traffic_locked(int dev, const sim_range *r, int n, sim_link *out) {
    memset(out, 0, sizeof *out);
    if (atomic_load(&g_link_maps) == 0) return;   /* everything is in HBM */
    for (int k = 0; k < n; k++) {
        if (!r[k].bytes) continue;
        link_ctx c = {dev, repeats_inplace_input(r, n, k) ? -1 : r[k].write, out};
        sim_mem_walk_locked(r[k].addr, r[k].bytes, link_piece, &c);   /* unmapped parts were a fault */
    }
}

/* ---- aclrtMalloc family ---- */
static aclError sim_malloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy, int pad, const char *api) {
    if (!devPtr || size == 0) return ACL_ERROR_INVALID_PARAM;
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    int dev = t_dev;
    unsigned base = (unsigned)policy & 0xff;
    if (base > ACL_MEM_MALLOC_HUGE1G_ONLY_P2P) return ACL_ERROR_INVALID_PARAM;
    if (aclsim_fault_hit(SIM_FAULT_MALLOC)) {
        note_failed_alloc(dev);
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    if (size > g_cfg.hbm_bytes) goto oom;
    /* aclrtMalloc pads by 32 bytes after rounding; Align32 only rounds */
    uint64_t padded = sim_round_up(size, 32) + (pad ? 32 : 0);
    int huge;
    switch (base) {
    case ACL_MEM_MALLOC_HUGE_ONLY: case ACL_MEM_MALLOC_HUGE_ONLY_P2P:
    case ACL_MEM_MALLOC_HUGE1G_ONLY: case ACL_MEM_MALLOC_HUGE1G_ONLY_P2P:
        huge = 1; break;
    case ACL_MEM_MALLOC_NORMAL_ONLY: case ACL_MEM_MALLOC_NORMAL_ONLY_P2P:
        huge = 0; break;
    default:  /* HUGE_FIRST: up to 1 MiB normal pages, above that huge pages */
        huge = padded > MIB;
    }
    uint64_t gran = huge ? SIM_GRANULE : SIM_SMALL_PAGE;
    uint64_t len = sim_round_up(padded, gran);
    pthread_rwlock_wrlock(&g_mm);
    sim_device *d = &g_dev[dev];
    sim_phys *ph = phys_alloc_locked(dev, len, gran);
    if (!ph) {
        pthread_rwlock_unlock(&g_mm);
        goto oom;
    }
    uint64_t va;
    if (ra_alloc(&d->va, len, gran, &va)) {
        phys_release_locked(ph);
        pthread_rwlock_unlock(&g_mm);
        goto oom;
    }
    if (map_insert_locked(va, len, ph, 0, 0)) {
        ra_free(&d->va, va, len);
        phys_release_locked(ph);
        pthread_rwlock_unlock(&g_mm);
        return ACL_ERROR_RT_INTERNAL_ERROR;
    }
    size_t at = resv_find_locked(va);
    VEC_INSERT(g_resv, at + 1, ((sim_resv){va, len, dev, RESV_MALLOC, ph}));
    pthread_rwlock_unlock(&g_mm);
    atomic_fetch_add(&g_stat[ST_AL_MALLOC], 1);
    atomic_fetch_add(&g_stat[ST_AL_MALLOC_BYTES], size);
    *devPtr = (void *)va;
    return ACL_SUCCESS;
oom:
    note_failed_alloc(dev);
    {
        uint64_t used, peak;
        sim_mem_stats(dev, &used, &peak);
        aclsim_log("%s(%zu bytes) on device %d: out of memory (%llu of %llu bytes in use) -> 207001", api, size,
                   dev, (unsigned long long)used, (unsigned long long)g_cfg.hbm_bytes);
    }
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
}

ACL_FUNC_VISIBILITY aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    return sim_malloc(devPtr, size, policy, 1, "aclrtMalloc");
}
ACL_FUNC_VISIBILITY aclError aclrtMallocAlign32(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    return sim_malloc(devPtr, size, policy, 0, "aclrtMallocAlign32");
}
ACL_FUNC_VISIBILITY aclError aclrtMallocCached(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    return sim_malloc(devPtr, size, policy, 1, "aclrtMallocCached");
}

ACL_FUNC_VISIBILITY aclError aclrtFree(void *devPtr) {
    if (!devPtr) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    pthread_rwlock_wrlock(&g_mm);
    size_t i = resv_find_locked((uintptr_t)devPtr);
    if (i == (size_t)-1 || g_resv.v[i].va != (uintptr_t)devPtr ||
        (g_resv.v[i].kind != RESV_MALLOC && g_resv.v[i].kind != RESV_MANAGED)) {
        pthread_rwlock_unlock(&g_mm);
        aclsim_log("aclrtFree(%p): not the start of a live device or managed allocation", devPtr);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    sim_resv r = g_resv.v[i];
    VEC_REMOVE(g_resv, i);
    sim_map *m = map_floor_locked(r.va);
    if (m && m->va == r.va) map_remove_locked(m);
    if (r.kind == RESV_MANAGED) {
        sim_managed_free_locked(r.ph, r.va, r.len);   /* aclrtFree frees managed memory too (CANN docs) */
    } else {
        phys_release_locked(r.ph);
        ra_free(&g_dev[r.dev].va, r.va, r.len);
    }
    pthread_rwlock_unlock(&g_mm);
    return ACL_SUCCESS;
}

/* ---- pinned host memory ---- */
ACL_FUNC_VISIBILITY aclError aclrtMallocHost(void **hostPtr, size_t size) {
    if (!hostPtr || size == 0) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    if (aclsim_fault_hit(SIM_FAULT_HOST)) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    if (size > (1ULL << 46)) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    uint64_t len = sim_round_up(size, 4096);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    pthread_rwlock_wrlock(&g_mm);
    size_t at;
    VEC_FLOOR(g_pinned, addr, (uintptr_t)p, at);
    VEC_INSERT(g_pinned, at + 1, ((sim_block){(uintptr_t)p, len}));
    pthread_rwlock_unlock(&g_mm);
    atomic_fetch_add(&g_stat[ST_AL_HOST], 1);
    atomic_fetch_add(&g_stat[ST_AL_HOST_BYTES], size);
    *hostPtr = p;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtFreeHost(void *hostPtr) {
    if (!hostPtr) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    pthread_rwlock_wrlock(&g_mm);
    size_t i;
    VEC_FLOOR(g_pinned, addr, (uintptr_t)hostPtr, i);
    if (i == (size_t)-1 || g_pinned.v[i].addr != (uintptr_t)hostPtr) {
        pthread_rwlock_unlock(&g_mm);
        aclsim_log("aclrtFreeHost(%p): not a live aclrtMallocHost allocation", hostPtr);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    sim_block b = g_pinned.v[i];
    VEC_REMOVE(g_pinned, i);
    pthread_rwlock_unlock(&g_mm);
    munmap((void *)b.addr, b.len);
    return ACL_SUCCESS;
}

SIM_API int aclsim_is_pinned_host(const void *addr, size_t bytes) {
    pthread_rwlock_rdlock(&g_mm);
    size_t i;
    VEC_FLOOR(g_pinned, addr, (uintptr_t)addr, i);
    int ok = i != (size_t)-1 && (uintptr_t)addr + bytes <= g_pinned.v[i].addr + g_pinned.v[i].len;
    pthread_rwlock_unlock(&g_mm);
    return ok;
}

/* ---- information ---- */
ACL_FUNC_VISIBILITY aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free_, size_t *total) {
    if (!free_ || !total) return ACL_ERROR_INVALID_PARAM;
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    switch (attr) {
    case ACL_HBM_MEM: case ACL_HBM_MEM_HUGE: case ACL_HBM_MEM_NORMAL: case ACL_HBM_MEM_P2P_HUGE:
    case ACL_HBM_MEM_P2P_NORMAL: case ACL_HBM_MEM_HUGE1G: case ACL_HBM_MEM_P2P_HUGE1G: {
        uint64_t used, peak;
        sim_mem_stats(t_dev, &used, &peak);
        *total = g_cfg.hbm_bytes;
        *free_ = g_cfg.hbm_bytes - used;
        return ACL_SUCCESS;
    }
    case ACL_DDR_MEM: case ACL_DDR_MEM_HUGE: case ACL_DDR_MEM_NORMAL: case ACL_DDR_MEM_P2P_HUGE:
    case ACL_DDR_MEM_P2P_NORMAL:
        /* 910B parts have no device DDR */
        *total = 0;
        *free_ = 0;
        return ACL_SUCCESS;
    default:
        return ACL_ERROR_INVALID_PARAM;
    }
}

static uint64_t prop_granularity(const aclrtPhysicalMemProp *prop) {
    switch (prop->memAttr) {
    case ACL_HBM_MEM_HUGE1G: case ACL_HBM_MEM_P2P_HUGE1G: case ACL_MEM_HUGE1G: case ACL_MEM_P2P_HUGE1G:
        return GIB;
    default:
        return SIM_GRANULE;
    }
}

static int is_host_location(aclrtMemLocationType t) {
    return t == ACL_MEM_LOCATION_TYPE_HOST || t == ACL_MEM_LOCATION_TYPE_HOST_NUMA;
}

/* NUMA nodes of this machine (/sys/devices/system/node/nodeN), read once;
 * node 0 only where sysfs does not say. */
static uint64_t g_numa_mask;
static pthread_once_t g_numa_once = PTHREAD_ONCE_INIT;
static void numa_load(void) {
    for (int n = 0; n < 64; n++) {
        char path[64];
        snprintf(path, sizeof path, "/sys/devices/system/node/node%d", n);
        if (access(path, F_OK) == 0) g_numa_mask |= 1ULL << n;
    }
    if (!g_numa_mask) g_numa_mask = 1;
}
int sim_numa_node_valid(int node) {
    pthread_once(&g_numa_once, numa_load);
    return node >= 0 && node < 64 && (g_numa_mask >> node & 1);
}

/* The memAttr/location rules for host-located handles, from the CANN docs of
 * aclrtMallocPhysical (CANN 9.0) and the runtime's acl layer (hicann/runtime,
 * src/acl/aclrt_impl/memory.cpp):
 *   - memAttr must be one the runtime maps (DDR_MEM_{HUGE,NORMAL,P2P_HUGE,P2P_NORMAL},
 *     MEM_{NORMAL,HUGE,HUGE1G}, MEM_P2P_{NORMAL,HUGE,HUGE1G}, HBM_MEM_{HUGE,NORMAL,HUGE1G});
 *     anything else is ACL_ERROR_INVALID_PARAM at the acl layer;
 *   - HBM kinds and the 1 GiB kinds are documented as device-only: the driver
 *     refuses them for host memory (the simulator's code: 107000, the driver's
 *     "invalid value");
 *   - HOST_NUMA: location.id is a NUMA node of this machine (else 107000);
 *     HOST: id is ignored (docs: "fixed at 0").
 * The docs give no granularity for host memory; the simulator uses 2 MiB for
 * every host kind, so host and HBM handles share one mapping rule. */
static aclError host_prop_check(const aclrtPhysicalMemProp *prop, const char *api) {
    switch (prop->memAttr) {
    case ACL_DDR_MEM_HUGE: case ACL_DDR_MEM_NORMAL: case ACL_DDR_MEM_P2P_HUGE: case ACL_DDR_MEM_P2P_NORMAL:
    case ACL_MEM_NORMAL: case ACL_MEM_HUGE: case ACL_MEM_P2P_NORMAL: case ACL_MEM_P2P_HUGE:
        break;
    case ACL_HBM_MEM_HUGE: case ACL_HBM_MEM_NORMAL: case ACL_HBM_MEM_HUGE1G: case ACL_MEM_HUGE1G:
    case ACL_MEM_P2P_HUGE1G:
        aclsim_log("%s: memAttr %d is device-only; host memory takes ACL_MEM_HUGE, ACL_MEM_NORMAL, "
                   "ACL_MEM_P2P_* or ACL_DDR_MEM_*", api, (int)prop->memAttr);
        return ACL_ERROR_RT_PARAM_INVALID;
    default:
        aclsim_log("%s: memAttr %d is not supported for physical memory", api, (int)prop->memAttr);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (prop->location.type == ACL_MEM_LOCATION_TYPE_HOST_NUMA && !sim_numa_node_valid((int)prop->location.id)) {
        aclsim_log("%s: NUMA node %u does not exist on this host", api, prop->location.id);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    return 0;
}

ACL_FUNC_VISIBILITY aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop,
    aclrtMemGranularityOptions option, size_t *granularity) {
    if (!prop || !granularity) return ACL_ERROR_INVALID_PARAM;
    if (option != ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM && option != ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return ACL_ERROR_INVALID_PARAM;
    if (is_host_location(prop->location.type)) {
        aclError rc = host_prop_check(prop, "aclrtMemGetAllocationGranularity");
        if (rc) return rc;
        *granularity = SIM_GRANULE;
        return ACL_SUCCESS;
    }
    *granularity = prop_granularity(prop);
    return ACL_SUCCESS;
}

/* ---- virtual memory management ---- */
ACL_FUNC_VISIBILITY aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr,
    uint64_t flags) {
    if (!virPtr || size == 0 || alignment != 0 || expectPtr != NULL || flags > 1) return ACL_ERROR_INVALID_PARAM;
    aclError rc = aclsim_check_ready();
    int dev = t_dev;
    if (rc == ACL_ERROR_RT_CONTEXT_NULL) {
        /* A VA reservation is a process-level (driver) operation on CANN and
         * needs no context: torch_npu probes expandable-segment support with
         * a 512-byte reservation before it sets a device. Without one, the
         * range comes from device 0's VA arena (created if need be); mapping
         * decides which device's memory backs it. */
        dev = 0;
        pthread_mutex_lock(&g_lock);
        pthread_rwlock_wrlock(&g_mm);
        sim_mem_init_device(&g_dev[0]);
        pthread_rwlock_unlock(&g_mm);
        pthread_mutex_unlock(&g_lock);
        rc = sim_device_check(0);
    }
    if (rc) return rc;
    if (size > (1ULL << 46)) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    uint64_t len = sim_round_up(size, SIM_GRANULE), va;
    pthread_rwlock_wrlock(&g_mm);
    sim_device *d = &g_dev[dev];
    if (ra_alloc(&d->va, len, SIM_GRANULE, &va)) {
        pthread_rwlock_unlock(&g_mm);
        aclsim_log("aclrtReserveMemAddress(%zu): device %d VA space exhausted", size, dev);
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    size_t at = resv_find_locked(va);
    VEC_INSERT(g_resv, at + 1, ((sim_resv){va, len, dev, RESV_USER, NULL}));
    pthread_rwlock_unlock(&g_mm);
    atomic_fetch_add(&g_stat[ST_AL_RESERVE], 1);
    *virPtr = (void *)va;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtReleaseMemAddress(void *virPtr) {
    if (!virPtr) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    pthread_rwlock_wrlock(&g_mm);
    size_t i = resv_find_locked((uintptr_t)virPtr);
    if (i == (size_t)-1 || g_resv.v[i].va != (uintptr_t)virPtr || g_resv.v[i].kind != RESV_USER) {
        pthread_rwlock_unlock(&g_mm);
        aclsim_log("aclrtReleaseMemAddress(%p): not the start of a reserved range", virPtr);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    sim_resv r = g_resv.v[i];
    if (map_overlaps_locked(r.va, r.len)) {
        pthread_rwlock_unlock(&g_mm);
        aclsim_log("aclrtReleaseMemAddress(%p): range still has mapped memory (unmap it first)", virPtr);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    VEC_REMOVE(g_resv, i);
    ra_free(&g_dev[r.dev].va, r.va, r.len);
    pthread_rwlock_unlock(&g_mm);
    return ACL_SUCCESS;
}

/* A physical handle in host RAM: HOST (id ignored) or HOST_NUMA (id = NUMA
 * node). Not HBM: it does not count against ACLSIM_HBM_BYTES, only against
 * ACLSIM_HOST_BYTES. Like HOST_NUMA on CANN (ApiErrorDecorator::MallocPhysical)
 * it needs a current context. */
static aclError malloc_physical_host(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop) {
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    if ((rc = host_prop_check(prop, "aclrtMallocPhysical"))) return rc;
    if (size % SIM_GRANULE) {
        aclsim_log("aclrtMallocPhysical(%zu): size is not a multiple of the granularity %u", size, SIM_GRANULE);
        return ACL_ERROR_INVALID_PARAM;
    }
    int numa = prop->location.type == ACL_MEM_LOCATION_TYPE_HOST_NUMA ? (int)prop->location.id : 0;
    if (aclsim_fault_hit(SIM_FAULT_PHYS)) {
        atomic_fetch_add(&g_stat[ST_FAILED_ALLOCS], 1);
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    pthread_rwlock_wrlock(&g_mm);
    sim_phys *ph = host_phys_alloc_locked(size, numa);
    if (ph) {
        ph->user = 1;
        ps_add(&g_phys_handles, ph);
    }
    uint64_t used = g_host.used;
    pthread_rwlock_unlock(&g_mm);
    if (!ph) {
        atomic_fetch_add(&g_stat[ST_FAILED_ALLOCS], 1);
        aclsim_log("aclrtMallocPhysical(%zu) in host memory: out of memory (%llu of %llu bytes in use, "
                   "ACLSIM_HOST_BYTES) -> 207001", size, (unsigned long long)used,
                   (unsigned long long)g_cfg.host_bytes);
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    atomic_fetch_add(&g_stat[ST_AL_PHYS], 1);
    atomic_fetch_add(&g_stat[ST_AL_PHYS_BYTES], size);
    atomic_fetch_add(&g_stat[ST_AL_PHYS_HOST], 1);
    atomic_fetch_add(&g_stat[ST_AL_PHYS_HOST_BYTES], size);
    *handle = ph;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size,
    const aclrtPhysicalMemProp *prop, uint64_t flags) {
    if (!handle || !prop || size == 0 || flags != 0) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    if (prop->handleType != ACL_MEM_HANDLE_TYPE_NONE && prop->handleType != ACL_MEM_HANDLE_TYPE_POSIX)
        return ACL_ERROR_INVALID_PARAM;
    if (prop->allocationType != ACL_MEM_ALLOCATION_TYPE_PINNED) return ACL_ERROR_INVALID_PARAM;
    if (is_host_location(prop->location.type)) return malloc_physical_host(handle, size, prop);
    if (prop->location.type != ACL_MEM_LOCATION_TYPE_DEVICE) {
        aclsim_log("aclrtMallocPhysical: location type %d is not DEVICE, HOST or HOST_NUMA",
                   (int)prop->location.type);
        return ACL_ERROR_INVALID_PARAM;
    }
    switch (prop->memAttr) {
    case ACL_DDR_MEM_HUGE: case ACL_DDR_MEM_NORMAL: case ACL_DDR_MEM_P2P_HUGE: case ACL_DDR_MEM_P2P_NORMAL:
        /* documented host-only; the acl layer refuses them for a device */
        aclsim_log("aclrtMallocPhysical: memAttr %d is host memory only (location is DEVICE)", (int)prop->memAttr);
        return ACL_ERROR_INVALID_PARAM;
    default:
        break;
    }
    int dev = (int)prop->location.id;
    if (prop->location.id >= (uint32_t)g_cfg.devices) return ACL_ERROR_RT_INVALID_DEVICEID;
    if (!g_dev[dev].opened) return ACL_ERROR_RT_CONTEXT_NULL;
    aclError rc = sim_device_check(dev);
    if (rc) return rc;
    uint64_t gran = prop_granularity(prop);
    if (size % gran) {
        aclsim_log("aclrtMallocPhysical(%zu): size is not a multiple of the granularity %llu", size,
                   (unsigned long long)gran);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (aclsim_fault_hit(SIM_FAULT_PHYS)) {
        note_failed_alloc(dev);
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    pthread_rwlock_wrlock(&g_mm);
    sim_phys *ph = phys_alloc_locked(dev, size, SIM_GRANULE);
    if (ph) {
        ph->user = 1;
        ps_add(&g_phys_handles, ph);
    }
    uint64_t used = g_dev[dev].used;
    pthread_rwlock_unlock(&g_mm);
    if (!ph) {
        note_failed_alloc(dev);
        aclsim_log("aclrtMallocPhysical(%zu) on device %d: out of memory (%llu of %llu bytes in use) -> 207001",
                   size, dev, (unsigned long long)used, (unsigned long long)g_cfg.hbm_bytes);
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    atomic_fetch_add(&g_stat[ST_AL_PHYS], 1);
    atomic_fetch_add(&g_stat[ST_AL_PHYS_BYTES], size);
    *handle = ph;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtFreePhysical(aclrtDrvMemHandle handle) {
    if (!handle) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    pthread_rwlock_wrlock(&g_mm);
    if (!ps_has(&g_phys_handles, handle)) {
        pthread_rwlock_unlock(&g_mm);
        aclsim_log("aclrtFreePhysical(%p): not a live physical memory handle", handle);
        return ACL_ERROR_RT_INVALID_HANDLE;
    }
    sim_phys *ph = handle;
    if (ph->nmaps) {
        pthread_rwlock_unlock(&g_mm);
        aclsim_log("aclrtFreePhysical(%p): handle is still mapped %d time(s) (unmap it first)", handle, ph->nmaps);
        return ACL_ERROR_RT_MEMORY_FREE;
    }
    ps_del(&g_phys_handles, ph);
    phys_release_locked(ph);
    pthread_rwlock_unlock(&g_mm);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle,
    uint64_t flags) {
    if (!virPtr || !handle || size == 0 || flags != 0) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    uintptr_t va = (uintptr_t)virPtr;
    pthread_rwlock_wrlock(&g_mm);
    aclError rc = 0;
    const char *why = NULL;
    if (!ps_has(&g_phys_handles, handle)) {
        rc = ACL_ERROR_RT_INVALID_HANDLE; why = "not a live physical memory handle";
        goto out;
    }
    sim_phys *ph = handle;
    if (ph->loc == SIM_PH_HBM && (rc = sim_device_check(ph->dev))) goto out;
    size_t i = resv_find_locked(va);
    if (i == (size_t)-1 || g_resv.v[i].kind != RESV_USER || va + size < va ||
        va + size > g_resv.v[i].va + g_resv.v[i].len) {
        rc = ACL_ERROR_RT_PARAM_INVALID; why = "range is not inside a reserved VA range";
        goto out;
    }
    /* a host handle is reached over the link by the device that owns the VA */
    if (ph->loc == SIM_PH_HOST && (rc = sim_device_check(g_resv.v[i].dev))) goto out;
    if ((va - g_resv.v[i].va) % SIM_GRANULE || size % SIM_GRANULE || offset % SIM_GRANULE) {
        rc = ACL_ERROR_RT_ADDR_UNALIGNED; why = "address, size or offset is not a multiple of 2 MiB";
        goto out;
    }
    /* CANN: offset "currently can only be 0" and size must equal the handle's
     * size — partial maps would pass here and fail on hardware */
    if (offset != 0 || size != ph->size) {
        rc = ACL_ERROR_INVALID_PARAM;
        why = offset ? "offset must be 0 (CANN maps whole handles)" : "size must equal the physical handle's size";
        goto out;
    }
    if (map_overlaps_locked(va, size)) {
        rc = ACL_ERROR_RT_PARAM_INVALID; why = "range overlaps an existing mapping";
        goto out;
    }
    if (aclsim_fault_hit(SIM_FAULT_MAP)) {
        rc = ACL_ERROR_RT_DRV_INTERNAL_ERROR;
        goto out;
    }
    if (map_insert_locked(va, size, ph, offset, 1)) rc = ACL_ERROR_RT_DRV_INTERNAL_ERROR;
    else atomic_fetch_add(&g_stat[ST_AL_MAP], 1);
out:
    pthread_rwlock_unlock(&g_mm);
    if (why) aclsim_log("aclrtMapMem(%p, %zu, %zu, %p): %s", virPtr, size, offset, handle, why);
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtUnmapMem(void *virPtr) {
    if (!virPtr) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    pthread_rwlock_wrlock(&g_mm);
    sim_map *m = map_floor_locked((uintptr_t)virPtr);
    if (!m || m->va != (uintptr_t)virPtr || !m->user) {
        pthread_rwlock_unlock(&g_mm);
        aclsim_log("aclrtUnmapMem(%p): not the start of a mapping made by aclrtMapMem", virPtr);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    map_remove_locked(m);
    pthread_rwlock_unlock(&g_mm);
    return ACL_SUCCESS;
}

/* ---- copy kinds ---- */
/* Managed memory is both: it may stand on the device side or the host side of
 * any kind (the runtime copies it by its own path, whatever the kind); with
 * ACL_MEMCPY_DEFAULT it counts as device memory. */
int sim_resolve_copy_kind(int kind, const void *dst, const void *src) {
    int dd = aclsim_is_device_addr(dst), sd = aclsim_is_device_addr(src);
    int dm = sim_managed_addr(dst), sm = sim_managed_addr(src);
    switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST: return !dd && !sd ? kind : -1;
    case ACL_MEMCPY_HOST_TO_DEVICE:
    case ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: return (dd || dm) && !sd ? ACL_MEMCPY_HOST_TO_DEVICE : -1;
    case ACL_MEMCPY_DEVICE_TO_HOST: return !dd && (sd || sm) ? kind : -1;
    case ACL_MEMCPY_DEVICE_TO_DEVICE:
    case ACL_MEMCPY_INNER_DEVICE_TO_DEVICE:
    case ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: return (dd || dm) && (sd || sm) ? ACL_MEMCPY_DEVICE_TO_DEVICE : -1;
    case ACL_MEMCPY_DEFAULT:
        dd |= dm;
        sd |= sm;
        return dd ? (sd ? ACL_MEMCPY_DEVICE_TO_DEVICE : ACL_MEMCPY_HOST_TO_DEVICE)
                  : (sd ? ACL_MEMCPY_DEVICE_TO_HOST : ACL_MEMCPY_HOST_TO_HOST);
    default: return -2;
    }
}

/* ---- statistics ---- */
void sim_mem_json(FILE *f) {
    pthread_rwlock_rdlock(&g_mm);
    uint64_t used = g_host.used, peak = g_host.peak, mapped = g_host.mapped, mpeak = g_host.mapped_peak;
    pthread_rwlock_unlock(&g_mm);
    static const char *cls[4] = {"op", "copy", "memset", "collective"};
    fprintf(f, "  \"host_mapped\": {\"limit_bytes\": %llu, \"phys_bytes\": %llu, \"phys_peak_bytes\": %llu, "
            "\"mapped_bytes\": %llu, \"mapped_peak_bytes\": %llu,\n    \"read_bytes\": {",
            (unsigned long long)g_cfg.host_bytes, (unsigned long long)used, (unsigned long long)peak,
            (unsigned long long)mapped, (unsigned long long)mpeak);
    for (int c = 0; c < 4; c++)
        fprintf(f, "%s\"%s\": %llu", c ? ", " : "", cls[c], (unsigned long long)g_stat[ST_HM_RD_OP + c]);
    fprintf(f, "},\n    \"write_bytes\": {");
    for (int c = 0; c < 4; c++)
        fprintf(f, "%s\"%s\": %llu", c ? ", " : "", cls[c], (unsigned long long)g_stat[ST_HM_WR_OP + c]);
    fprintf(f, "}},\n");
    sim_managed_json(f);
}
