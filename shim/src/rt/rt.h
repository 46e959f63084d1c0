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
} sim_device;

extern sim_config g_cfg;
extern sim_device g_dev[SIM_MAX_DEVICES];
extern pthread_rwlock_t g_mm;       /* device memory map */
extern pthread_mutex_t g_lock;      /* streams, events */
extern pthread_cond_t g_event_cv;   /* broadcast when an event record completes */
extern atomic_ullong g_host_ns;     /* simulated host time */
extern __thread int t_dev;          /* current device of this thread, -1 none */

/* statistics (atomic counters) */
enum { ST_OPS, ST_HCCL_OPS, ST_MEMSETS, ST_MMU_FAULTS, ST_FAILED_ALLOCS, ST_INJECTED,
       ST_COPY_BYTES_H2H, ST_COPY_BYTES_H2D, ST_COPY_BYTES_D2H, ST_COPY_BYTES_D2D,
       ST_COPIES_H2H, ST_COPIES_H2D, ST_COPIES_D2H, ST_COPIES_D2D,
       /* successful allocation calls, by family (the "allocs" object) */
       ST_AL_MALLOC, ST_AL_MALLOC_BYTES, ST_AL_PHYS, ST_AL_PHYS_BYTES, ST_AL_MAP, ST_AL_RESERVE,
       ST_AL_HOST, ST_AL_HOST_BYTES, ST_NCOUNTERS };
extern atomic_ullong g_stat[ST_NCOUNTERS];
void sim_count_copy(int kind, uint64_t bytes);

/* core.c */
int sim_config_error(void);         /* 0 or ACL_ERROR_INVALID_PARAM (reported) */
void sim_ensure_config(void);
int sim_initialized(void);
aclError sim_device_check(int dev);  /* lost device -> 107022 */
aclError sim_work_tick(int dev);     /* counts a work item; lost device -> 107022 */
void sim_note_host_time(uint64_t t);
uint64_t sim_host_advance(uint64_t cost); /* sync work: returns end time */
void sim_write_stats(void);

/* mem.c */
void sim_mem_init_device(sim_device *d);
/* Resolve a copy kind: validates that the device side(s) are device VAs and
 * the host side(s) are not; DEFAULT is inferred. Returns the resolved kind or
 * -1 (wrong kind). */
int sim_resolve_copy_kind(int kind, const void *dst, const void *src);
int sim_device_of_addr(const void *p);
void sim_mem_stats(int dev, uint64_t *used, uint64_t *peak);

/* stream.c */
void sim_streams_init_device(int dev);
sim_stream *sim_stream_resolve(aclrtStream s, aclError *err);
aclError sim_sync_all(int dev /* -1 = all */);
aclError sim_stream_sync_handle(aclrtStream stream);
void sim_stream_stats(FILE *f);
uint64_t sim_max_stream_clock(void);

#endif
