/* Private state of the runtime core (libascendcl.so). Not seen by the satellite
 * libraries, which use sim.h only. */
#ifndef ACLSIM_RT_H_
#define ACLSIM_RT_H_

#include <pthread.h>
#include <stdatomic.h>
#include "sim.h"

#define SIM_MAGIC_STREAM 0x5354524dU
#define SIM_MAGIC_EVENT  0x4556544eU
#define SIM_MAGIC_PHYS   0x50485953U
#define SIM_MAGIC_CTX    0x43545854U

/* ---- generic helpers ---- */
static inline uint64_t sim_round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* First-fit allocator over an integer interval (VA space, physical offsets). */
typedef struct sim_span { uint64_t start, len; } sim_span;
typedef struct sim_ralloc {
    sim_span *free;          /* sorted by start, coalesced */
    size_t n, cap;
} sim_ralloc;
void ra_init(sim_ralloc *ra, uint64_t start, uint64_t len);
int ra_alloc(sim_ralloc *ra, uint64_t len, uint64_t align, uint64_t *out);
void ra_free(sim_ralloc *ra, uint64_t start, uint64_t len);

/* Open-addressing set of live handles, so a stale or foreign pointer passed as a
 * stream/event/handle is recognised without being dereferenced. */
typedef struct sim_ptrset { uintptr_t *slot; size_t cap, n; } sim_ptrset;
int ps_has(const sim_ptrset *s, const void *p);
void ps_add(sim_ptrset *s, const void *p);
void ps_del(sim_ptrset *s, const void *p);

/* ---- devices ---- */
typedef struct sim_stream sim_stream;
typedef struct sim_device {
    int id;
    int opened;                     /* a context exists (SetDevice was called) */
    atomic_int lost;
    sim_stream *default_stream;
    /* memory (under g_mm write lock) */
    uintptr_t arena;                /* device VA arena */
    uint64_t arena_len;
    sim_ralloc va;                  /* free VA */
    sim_ralloc phys;                /* free physical offsets in memfd */
    int memfd;                      /* physical memory (absent in phantom mode) */
    uint64_t used, peak;            /* physical bytes allocated */
    atomic_ullong failed_allocs, mmu_faults, work_submitted;
    atomic_int refs;                /* aclrtSetDevice calls not yet matched by aclrtResetDevice */
} sim_device;

/* A context: the device's default one is &g_dev[dev] itself (made by the
 * first aclrtSetDevice, destroyed never); one made by aclrtCreateContext is a
 * sim_ctx with its own default stream. Never freed: a thread still holding a
 * destroyed one is told so (ACL_ERROR_RT_CONTEXT_NULL), not left with a
 * dangling pointer. */
typedef struct sim_ctx {
    uint32_t magic;
    int dev;
    int dead;                       /* aclrtDestroyContext ran */
    sim_stream *default_stream;
} sim_ctx;

extern sim_config g_cfg;
extern sim_device g_dev[SIM_MAX_DEVICES];
extern pthread_rwlock_t g_mm;       /* device memory map */
extern pthread_mutex_t g_lock;      /* streams, events */
extern pthread_cond_t g_event_cv;   /* broadcast when an event record completes */
extern atomic_ullong g_host_ns;     /* simulated host time */
extern __thread int t_dev;          /* current device of this thread, -1 none */
extern __thread void *t_ctx;        /* current context of this thread (&g_dev[t_dev] or a sim_ctx) */

/* statistics (atomic counters) */
enum { ST_OPS, ST_HCCL_OPS, ST_MEMSETS, ST_MMU_FAULTS, ST_FAILED_ALLOCS, ST_INJECTED,
       ST_COPY_BYTES_H2H, ST_COPY_BYTES_H2D, ST_COPY_BYTES_D2H, ST_COPY_BYTES_D2D,
       ST_COPIES_H2H, ST_COPIES_H2D, ST_COPIES_D2H, ST_COPIES_D2D,
       /* successful allocation calls, by family (the "allocs" object) */
       ST_AL_MALLOC, ST_AL_MALLOC_BYTES, ST_AL_PHYS, ST_AL_PHYS_BYTES, ST_AL_MAP, ST_AL_RESERVE,
       ST_AL_HOST, ST_AL_HOST_BYTES, ST_AL_PHYS_HOST, ST_AL_PHYS_HOST_BYTES, ST_AL_MANAGED, ST_AL_MANAGED_BYTES,
       /* device bytes read / written over the link in host-located physical
        * memory, by work class (SIM_LC_*) */
       ST_HM_RD_OP, ST_HM_RD_COPY, ST_HM_RD_MEMSET, ST_HM_RD_COLL,
       ST_HM_WR_OP, ST_HM_WR_COPY, ST_HM_WR_MEMSET, ST_HM_WR_COLL,
       /* managed memory */
       ST_MG_MIGRATED, ST_MG_REMOTE, ST_MG_PREFETCHES, ST_MG_PREFETCH_BYTES, ST_MG_ADVISES,
       ST_MG_ADVISE_BYTES,
       /* event queries answered "not ready" because the device made no
        * progress for a second of real time (event_ready_locked): the one
        * answer that depends on real time, not on the simulated clock */
       ST_QUERY_GIVEUPS,
       /* stream waits parked after a second of real time with their record
        * not run (run_item): other streams' items may then go first */
       ST_WAIT_PARKS,
       ST_NCOUNTERS };
enum { SIM_LC_OP = 0, SIM_LC_COPY, SIM_LC_MEMSET, SIM_LC_COLL };   /* offsets from ST_HM_RD_OP / ST_HM_WR_OP */
extern atomic_ullong g_stat[ST_NCOUNTERS];
void sim_count_copy(int kind, uint64_t bytes);

/* ---- physical memory ---- */
enum { SIM_PH_HBM = 0, SIM_PH_HOST, SIM_PH_MANAGED };
typedef struct sim_mpage sim_mpage;          /* managed.c: residency of one 2 MiB page */
typedef struct sim_phys {
    uint32_t magic;
    int dev;                 /* SIM_PH_HBM: the device whose HBM holds it; -1 otherwise */
    int loc;                 /* SIM_PH_* */
    int numa;                /* SIM_PH_HOST: NUMA node */
    int user;                /* from aclrtMallocPhysical (else internal) */
    int nmaps;
    uint64_t off, size;      /* offset in the pool's memfd, bytes */
    sim_mpage *pages;        /* SIM_PH_MANAGED: one per 2 MiB */
} sim_phys;

/* Link traffic of one piece of device work, measured when it runs. Bytes in
 * host RAM are accessed over the host link, not from HBM. */
typedef struct sim_link {
    uint64_t hm_rd, hm_wr;   /* host-located physical handles mapped at device VAs */
    uint64_t hm_fp;          /* footprint of those ranges (each byte once) */
    uint64_t mg_rd, mg_wr;   /* managed pages accessed remotely (accessed-by, not migrated) */
    uint64_t mg_fp;
    uint64_t mg_migrated;    /* managed pages moved onto the device before the access */
} sim_link;

/* core.c */
int sim_config_error(void);         /* 0 or ACL_ERROR_INVALID_PARAM (reported) */
void sim_ensure_config(void);
int sim_initialized(void);
aclError sim_device_check(int dev);  /* lost device -> 107022 */
aclError sim_work_tick(int dev);     /* counts a work item; lost device -> 107022 */
void sim_note_host_time(uint64_t t);
uint64_t sim_host_advance(uint64_t cost); /* sync work: returns end time */
void sim_write_stats(void);
/* Duration of work on device `dev` (-1: none) starting at `start` whose
 * all-HBM cost was `base`, once its link traffic `l` is known: bytes in host
 * memory go over the device's link, shared in simulated time with every other
 * transfer in the same direction (the roofline's memory side splits into HBM
 * and link), migrations come first. Reserves the link time it uses. */
uint64_t sim_work_cost(int dev, int kind, int copy_kind, uint64_t start, uint64_t base, uint64_t flops,
                       uint64_t bytes, const sim_link *l);
uint64_t sim_link_ns(uint64_t bytes);
/* `bytes` over device `dev`'s link (to the device or from it) from `start`
 * on, shared with every other transfer; returns when they have crossed. */
uint64_t sim_link_transfer(int dev, int to_device, uint64_t start, uint64_t bytes);
void sim_count_link(int work_kind, const sim_link *l);

/* mem.c */
void sim_mem_init_device(sim_device *d);
/* Resolve a copy kind: validates that the device side(s) are device VAs and
 * the host side(s) are not; DEFAULT is inferred. Returns the resolved kind or
 * -1 (wrong kind). */
int sim_resolve_copy_kind(int kind, const void *dst, const void *src);
int sim_device_of_addr(const void *p);
void sim_mem_stats(int dev, uint64_t *used, uint64_t *peak);
uint64_t sim_mem_release_device(int dev);   /* the device's last reference went */
/* With g_mm held (read): the link traffic of work on device `dev` touching
 * `r` (managed pages it touches become resident on `dev`). */
void sim_link_traffic_locked(int dev, const sim_range *r, int n, sim_link *out);
/* Calls fn for each mapping piece covering [a, a+n) in order; stops at the
 * first non-zero return. Returns that value, or -1 if part of the range is
 * not mapped. g_mm held. */
int sim_mem_walk_locked(uintptr_t a, uint64_t n,
                        int (*fn)(void *ctx, sim_phys *ph, uintptr_t map_va, uintptr_t a, uint64_t n), void *ctx);
/* Managed allocations as mappings (g_mm held for writing). */
void sim_mem_add_managed_locked(uintptr_t va, uint64_t len, sim_phys *ph);
void sim_mem_json(FILE *f);            /* "host_mapped" and "managed" statistics */
int sim_numa_node_valid(int node);

/* managed.c */
int sim_managed_addr(const void *p);   /* 1 if p lies in the managed (UVM) VA range */
void sim_managed_access_locked(sim_phys *ph, uintptr_t map_va, uintptr_t a, uint64_t n, int write, int dev,
                               sim_link *l);
void sim_managed_free_locked(sim_phys *ph, uintptr_t va, uint64_t len);   /* g_mm held for writing */
void sim_managed_json(FILE *f);

/* stream.c */
void sim_streams_init_device(int dev);
/* A new stream on `dev` belonging to context `ctx` (takes g_lock). */
sim_stream *sim_stream_new_in(int dev, void *ctx);
/* Destroys (as aclrtDestroyStream: queued work runs first) every live stream
 * created in context `ctx`; returns how many. */
int sim_streams_destroy_context(void *ctx);
sim_stream *sim_stream_resolve(aclrtStream s, aclError *err);
aclError sim_sync_all(int dev /* -1 = all */);
aclError sim_stream_sync_handle(aclrtStream stream);
void sim_stream_stats(FILE *f);
uint64_t sim_max_stream_clock(void);
/* No work on `dev` can start before this simulated time (the shared link
 * forgets its calendar below it). Takes g_lock and stream locks. */
uint64_t sim_link_low_water(int dev);
/* Host-side work on `dev` waits until the work queued before it has run (the
 * device's order, see stream.c). */
void sim_host_gate(int dev);

#endif
