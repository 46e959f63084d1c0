/* Device memory: a reserved VA arena per device, physical memory in a memfd per
 * device (2 MiB granules for VMM handles and large allocations, 4 KiB pages for
 * small ones), mappings made with mmap(MAP_FIXED) so that unmapped device VAs
 * are genuinely inaccessible. aclrtMalloc is reserve + physical + map inside
 * the runtime, as on CANN. Pinned host memory (aclrtMallocHost) is tracked so
 * copies can be costed and AsyncWithCondition can tell pinned from pageable.
 * Everything here is guarded by g_mm (writers: allocation and mapping changes;
 * readers: range checks and the data accesses they protect). */
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

typedef struct sim_phys {
    uint32_t magic;
    int dev;
    int user;                /* from aclrtMallocPhysical (else internal to aclrtMalloc) */
    int nmaps;
    uint64_t off, size;
} sim_phys;

typedef struct sim_map { uintptr_t va; uint64_t len; sim_phys *ph; uint64_t off; int user; } sim_map;
enum { RESV_USER = 0, RESV_MALLOC = 1 };
typedef struct sim_resv { uintptr_t va; uint64_t len; int dev; int kind; sim_phys *ph; } sim_resv;
typedef struct sim_block { uintptr_t addr; uint64_t len; } sim_block;

/* sorted dynamic arrays (by address) */
#define VEC(T) struct { T *v; size_t n, cap; }
static VEC(sim_map) g_maps;
static VEC(sim_resv) g_resv;
static VEC(sim_block) g_pinned;
static sim_ptrset g_phys_handles;

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
    *ph = (sim_phys){SIM_MAGIC_PHYS, dev, 0, 0, off, size};
    d->used += size;
    if (d->used > d->peak) d->peak = d->used;
    return ph;
}

static void phys_release_locked(sim_phys *ph) {
    sim_device *d = &g_dev[ph->dev];
    /* punching the hole returns the pages and makes the next owner read zeros */
    if (d->memfd >= 0 &&
        fallocate(d->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)ph->off, (off_t)ph->size) != 0)
        aclsim_log("fallocate(PUNCH_HOLE) failed: %s", strerror(errno));
    ra_free(&d->phys, ph->off, ph->size);
    d->used -= ph->size;
    ph->magic = 0;
    free(ph);
}

/* ---- mappings ---- */
static int map_insert_locked(uintptr_t va, uint64_t len, sim_phys *ph, uint64_t off, int user) {
    sim_device *d = &g_dev[ph->dev];
    if (d->memfd >= 0) {
        void *p = mmap((void *)va, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, d->memfd,
                       (off_t)(ph->off + off));
        if (p == MAP_FAILED) {
            aclsim_log("mmap of device memory at 0x%lx failed: %s", (unsigned long)va, strerror(errno));
            return -1;
        }
    }
    size_t at;
    VEC_FLOOR(g_maps, va, va, at);
    VEC_INSERT(g_maps, at + 1, ((sim_map){va, len, ph, off, user}));
    ph->nmaps++;
    return 0;
}

static void map_remove_locked(size_t i) {
    sim_map m = g_maps.v[i];
    if (!g_cfg.phantom) {
        /* back to an inaccessible reservation: later accesses fault */
        if (mmap((void *)m.va, m.len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) ==
            MAP_FAILED)
            aclsim_log("re-reserving 0x%lx failed: %s", (unsigned long)m.va, strerror(errno));
    }
    m.ph->nmaps--;
    VEC_REMOVE(g_maps, i);
}

/* 1 if any mapping intersects [va, va+len) */
static int map_overlaps_locked(uintptr_t va, uint64_t len) {
    size_t i;
    VEC_FLOOR(g_maps, va, va + len - 1, i);
    if (i == (size_t)-1) return 0;
    sim_map *m = &g_maps.v[i];
    return m->va + m->len > va;
}

static size_t resv_find_locked(uintptr_t va) {
    size_t i;
    VEC_FLOOR(g_resv, va, va, i);
    return i;
}

SIM_API void aclsim_mm_read_lock(void) { pthread_rwlock_rdlock(&g_mm); }
SIM_API void aclsim_mm_read_unlock(void) { pthread_rwlock_unlock(&g_mm); }

SIM_API aclError aclsim_check_ranges(const sim_range *r, int n, const char *what) {
    for (int k = 0; k < n; k++) {
        uintptr_t a = r[k].addr, end = r[k].addr + r[k].bytes;
        if (r[k].bytes == 0) continue;
        if (end < a) goto fault;   /* wraps around */
        while (a < end) {
            size_t i;
            VEC_FLOOR(g_maps, va, a, i);
            if (i == (size_t)-1 || g_maps.v[i].va + g_maps.v[i].len <= a) goto fault;
            a = g_maps.v[i].va + g_maps.v[i].len;
        }
        continue;
    fault:;
        sim_device *d = dev_of_addr_locked(a);
        atomic_fetch_add(&g_stat[ST_MMU_FAULTS], 1);
        atomic_fetch_add(&(d ? d : &g_dev[t_dev >= 0 ? t_dev : 0])->mmu_faults, 1);
        aclsim_log("device MMU fault: %s %s unmapped device memory at 0x%lx (range 0x%lx + %zu bytes)%s",
                   what ? what : "work", r[k].write ? "wrote" : "read", (unsigned long)a,
                   (unsigned long)r[k].addr, r[k].bytes, d ? "" : " [not a device address]");
        return ACL_ERROR_RT_DEVICE_MEM_ERROR;
    }
    return 0;
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
    if (i == (size_t)-1 || g_resv.v[i].va != (uintptr_t)devPtr || g_resv.v[i].kind != RESV_MALLOC) {
        pthread_rwlock_unlock(&g_mm);
        aclsim_log("aclrtFree(%p): not the start of a live device allocation", devPtr);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    sim_resv r = g_resv.v[i];
    VEC_REMOVE(g_resv, i);
    size_t m;
    VEC_FLOOR(g_maps, va, r.va, m);
    if (m != (size_t)-1 && g_maps.v[m].va == r.va) map_remove_locked(m);
    phys_release_locked(r.ph);
    ra_free(&g_dev[r.dev].va, r.va, r.len);
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

ACL_FUNC_VISIBILITY aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop,
    aclrtMemGranularityOptions option, size_t *granularity) {
    if (!prop || !granularity) return ACL_ERROR_INVALID_PARAM;
    if (option != ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM && option != ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return ACL_ERROR_INVALID_PARAM;
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

ACL_FUNC_VISIBILITY aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size,
    const aclrtPhysicalMemProp *prop, uint64_t flags) {
    if (!handle || !prop || size == 0 || flags != 0) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    if (prop->location.type != ACL_MEM_LOCATION_TYPE_DEVICE) return ACL_ERROR_INVALID_PARAM;
    if (prop->handleType != ACL_MEM_HANDLE_TYPE_NONE && prop->handleType != ACL_MEM_HANDLE_TYPE_POSIX)
        return ACL_ERROR_INVALID_PARAM;
    if (prop->allocationType != ACL_MEM_ALLOCATION_TYPE_PINNED) return ACL_ERROR_INVALID_PARAM;
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
    if ((rc = sim_device_check(ph->dev))) goto out;
    size_t i = resv_find_locked(va);
    if (i == (size_t)-1 || g_resv.v[i].kind != RESV_USER || va + size < va ||
        va + size > g_resv.v[i].va + g_resv.v[i].len) {
        rc = ACL_ERROR_RT_PARAM_INVALID; why = "range is not inside a reserved VA range";
        goto out;
    }
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
    size_t i;
    VEC_FLOOR(g_maps, va, (uintptr_t)virPtr, i);
    if (i == (size_t)-1 || g_maps.v[i].va != (uintptr_t)virPtr || !g_maps.v[i].user) {
        pthread_rwlock_unlock(&g_mm);
        aclsim_log("aclrtUnmapMem(%p): not the start of a mapping made by aclrtMapMem", virPtr);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    map_remove_locked(i);
    pthread_rwlock_unlock(&g_mm);
    return ACL_SUCCESS;
}

/* ---- copy kinds ---- */
int sim_resolve_copy_kind(int kind, const void *dst, const void *src) {
    int dd = aclsim_is_device_addr(dst), sd = aclsim_is_device_addr(src);
    switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST: return !dd && !sd ? kind : -1;
    case ACL_MEMCPY_HOST_TO_DEVICE:
    case ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: return dd && !sd ? ACL_MEMCPY_HOST_TO_DEVICE : -1;
    case ACL_MEMCPY_DEVICE_TO_HOST: return !dd && sd ? kind : -1;
    case ACL_MEMCPY_DEVICE_TO_DEVICE:
    case ACL_MEMCPY_INNER_DEVICE_TO_DEVICE:
    case ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: return dd && sd ? ACL_MEMCPY_DEVICE_TO_DEVICE : -1;
    case ACL_MEMCPY_DEFAULT:
        return dd ? (sd ? ACL_MEMCPY_DEVICE_TO_DEVICE : ACL_MEMCPY_HOST_TO_DEVICE)
                  : (sd ? ACL_MEMCPY_DEVICE_TO_HOST : ACL_MEMCPY_HOST_TO_HOST);
    default: return -2;
    }
}
