/* aclsim internal interface: shared by libascendcl.so (the runtime core, which
 * defines everything here) and the satellite stand-ins (libopapi, libnnopbase,
 * libhccl, libacl_op_compiler), which link against libascendcl.so and reach the
 * core only through these aclsim_* symbols, never through public ACL names —
 * so an interposer sees each application call exactly once. */
#ifndef ACLSIM_SIM_H_
#define ACLSIM_SIM_H_

#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include "acl/acl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SIM_API __attribute__((visibility("default")))
#define SIM_MAX_DIMS 8
#define SIM_MAX_DEVICES 16
#define SIM_GRANULE (2u << 20)   /* physical chunk / huge page: 2 MiB */
#define SIM_SMALL_PAGE 4096u     /* normal page for small aclrtMalloc */

/* ---- configuration (read once from ACLSIM_* at first use) ---- */
typedef struct sim_config {
    int devices;             /* ACLSIM_DEVICES, default 1 */
    uint64_t hbm_bytes;      /* ACLSIM_HBM_BYTES per device */
    double hbm_gbps;         /* ACLSIM_HBM_GBPS  (GB/s = 1e9 B/s) */
    double link_gbps;        /* ACLSIM_LINK_GBPS, default 25 */
    double tflops;           /* ACLSIM_TFLOPS */
    double launch_us;        /* ACLSIM_LAUNCH_US, default 5 */
    int phantom;             /* ACLSIM_PHANTOM=1: no data kept or computed */
    uint64_t host_bytes;     /* ACLSIM_HOST_BYTES: host RAM for host-located physical handles */
    const char *soc_name;    /* from ACLSIM_PRESET */
    char stats_path[1024];   /* ACLSIM_STATS */
    int link_model;          /* ACLSIM_LINK_MODEL: 0 shared (default), 1 per-stream */
} sim_config;

SIM_API const sim_config *aclsim_config(void);

/* Logging: always stderr, prefixed "aclsim: ". Never stdout. */
SIM_API void aclsim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* 0 when the calling thread may use the runtime (aclInit done, not finalized,
 * a device set on this thread); otherwise the error code the real runtime gives
 * (ACL_ERROR_UNINITIALIZE or ACL_ERROR_RT_CONTEXT_NULL). */
SIM_API aclError aclsim_check_ready(void);
SIM_API int aclsim_current_device(void);   /* -1 if none */
/* aclrtSetDevice calls on `dev` not yet matched by aclrtResetDevice (-1: no such device). */
SIM_API int aclsim_device_refs(int dev);

/* ---- cost model (simulated nanoseconds) ---- */
SIM_API uint64_t aclsim_op_cost_ns(uint64_t flops, uint64_t bytes_touched);
SIM_API uint64_t aclsim_copy_cost_ns(int kind /* aclrtMemcpyKind */, uint64_t bytes, int host_pinned);
/* Simulated ns device `dev`'s host link has been busy in direction `dir`
 * (0 host->device, 1 device->host) so far (the shared link, core.c). */
SIM_API uint64_t aclsim_link_busy_ns(int dev, int dir);
/* The simulated host clock (ns): where the host's simulated time stands now
 * (it moves on synchronisation). An interposer paces time-driven work by it
 * (libu3m.so's background rounds, core/src/engine/publish.rs). */
SIM_API uint64_t aclsim_host_ns(void);

/* ---- device memory ---- */
typedef struct sim_range {
    uintptr_t addr;
    size_t bytes;
    int write;               /* 1 if the work writes the range, 2 if it reads and writes it */
} sim_range;

/* 1 if [addr, addr+bytes) lies in device VA space (reserved by the runtime). */
SIM_API int aclsim_is_device_addr(const void *addr);
/* 1 if host memory [addr, addr+bytes) came from aclrtMallocHost (pinned). */
SIM_API int aclsim_is_pinned_host(const void *addr, size_t bytes);

/* Shared lock over the device mappings: work that touches device memory holds it
 * (shared) from the range check to the end of the data access, so an unmap on
 * another thread can never pull pages out from under a running kernel. */
SIM_API void aclsim_mm_read_lock(void);
SIM_API void aclsim_mm_read_unlock(void);
/* With the read lock held: 0 if every range is fully backed by mapped physical
 * memory; otherwise records an MMU fault (counter + stderr message naming `what`
 * and the first unmapped address) and returns ACL_ERROR_RT_DEVICE_MEM_ERROR. */
SIM_API aclError aclsim_check_ranges(const sim_range *r, int n, const char *what);

/* ---- streams: asynchronous work ---- */
enum sim_work_kind {
    SIM_WORK_OP = 0,         /* operator (aclop, aclnn) */
    SIM_WORK_COPY,           /* memcpy of any kind; copy_kind says which */
    SIM_WORK_MEMSET,
    SIM_WORK_COLLECTIVE,     /* HCCL */
    SIM_WORK_HOST_FUNC,
    SIM_WORK_EVENT,          /* record / wait (internal) */
};

enum sim_work_flags {
    /* exec() does its own locking and range checks (collectives, which must wait
     * for peers without holding the mapping lock). */
    SIM_WF_SELF_CHECK = 1u << 0,
};

typedef struct sim_work sim_work;
struct sim_work {
    /* filled by the submitter */
    char what[96];           /* e.g. "aclopExecuteV2(MatMul)": named in fault messages */
    int kind;                /* enum sim_work_kind */
    int copy_kind;           /* aclrtMemcpyKind for SIM_WORK_COPY */
    uint32_t flags;          /* enum sim_work_flags */
    int nranges;
    sim_range *ranges;       /* device ranges; checked before exec unless SELF_CHECK */
    uint64_t cost_ns;        /* simulated duration */
    uint64_t bytes;          /* bytes moved (copies, memsets) or touched (operators) */
    uint64_t flops;          /* operators: for the roofline, recomputed when the work runs */
    /* Runs on the stream's worker thread after the check, with the mapping lock
     * held (shared) unless SELF_CHECK. Not called in phantom mode unless
     * SELF_CHECK. Returns 0 or an aclError that becomes the stream's error. */
    aclError (*exec)(sim_work *w);
    void (*destroy)(sim_work *w);  /* frees payload (and ranges if owned); may be NULL */
    void *payload;
    /* filled by the runtime before exec */
    int device;
    int stream_id;
    uint64_t start_ns;       /* simulated start on this stream */
    uint64_t end_ns;         /* exec may raise it (collectives); default start + cost */
};

/* Allocates a zeroed work item with room for `nranges` ranges (w->ranges points
 * into the same allocation; destroy need not free it). */
SIM_API sim_work *aclsim_work_new(int nranges);
/* Queue `w` on `stream` (NULL = the current device's default stream). Takes
 * ownership of w in every case. Errors: invalid stream, not ready, device lost.
 * Statistics (ops, bytes per copy kind) are counted when the work runs. */
SIM_API aclError aclsim_submit(aclrtStream stream, sim_work *w);
/* Validates a stream handle for the calling thread (NULL is valid). */
SIM_API aclError aclsim_stream_check(aclrtStream stream);
/* Device index of a stream (NULL = current device). -1 if invalid. */
SIM_API int aclsim_stream_device(aclrtStream stream);

/* ---- operators ---- */
typedef struct sim_tensor {
    void *data;              /* device address of element 0 of the view */
    void *base;              /* start of the storage footprint (range-checked) */
    size_t bytes;            /* footprint size in bytes */
    int dtype;               /* aclDataType */
    int ndim;
    int64_t dims[SIM_MAX_DIMS];
    int64_t strides[SIM_MAX_DIMS];   /* in elements */
} sim_tensor;

enum sim_attr_type { SIM_ATTR_BOOL = 0, SIM_ATTR_INT, SIM_ATTR_FLOAT };
typedef struct sim_attr {
    char name[48];
    int type;
    int64_t i;               /* bool and int */
    float f;
} sim_attr;

/* Launch operator `op_type` on `stream`: copies everything it is given, computes
 * the simulated cost (flops from shapes, or the int attr "flops"), queues the
 * range check and the kernel. `api` names the public entry point for messages.
 * Known types compute real f32 results; any other type (and byte-range ops)
 * runs the deterministic hash kernel. */
SIM_API aclError aclsim_launch_op(aclrtStream stream, const char *api, const char *op_type,
    const sim_tensor *in, int nin, const sim_tensor *out, int nout, const sim_attr *attrs, int nattrs);

/* Launch-time validation shared with libopapi (GetWorkspaceSize phase): the
 * checks aclsim_launch_op makes before queueing `op_type`, without queueing.
 * Sets *flops (the "flops" attr overrides the shape-derived count). */
SIM_API aclError aclsim_op_check(const char *op_type, const sim_tensor *in, int nin, const sim_tensor *out,
    int nout, const sim_attr *attrs, int nattrs, uint64_t *flops);

/* aclop path shared with libacl_op_compiler.so: same contract as aclopExecuteV2. */
SIM_API aclError aclsim_op_execute(const char *api, const char *opType, int numInputs,
    const aclTensorDesc *const inputDesc[], const aclDataBuffer *const inputs[], int numOutputs,
    const aclTensorDesc *const outputDesc[], aclDataBuffer *const outputs[], const aclopAttr *attr,
    aclrtStream stream);

/* ---- fault injection (ACLSIM_FAULTS) ---- */
enum sim_fault_site {
    SIM_FAULT_MALLOC = 0,    /* aclrtMalloc family           -> 207001 */
    SIM_FAULT_PHYS,          /* aclrtMallocPhysical          -> 207001 */
    SIM_FAULT_MAP,           /* aclrtMapMem                  -> 507899 */
    SIM_FAULT_COPY,          /* any memcpy                   -> 507052 */
    SIM_FAULT_MEMSET,        /* any memset                   -> 507052 */
    SIM_FAULT_OP,            /* operator launch              -> 507015 */
    SIM_FAULT_HOST,          /* aclrtMallocHost              -> 207001 */
    SIM_FAULT_COLL,          /* HCCL collective              -> HCCL_E_RUNTIME */
    SIM_FAULT_NSITES
};
/* Counts one call at `site`; returns 1 if this call must fail. */
SIM_API int aclsim_fault_hit(int site);
/* 1 if device `dev` has disappeared (fault "lose"); calls on it then fail with
 * ACL_ERROR_RT_DEVICE_TASK_ABORT / ACL_ERROR_RT_NO_DEVICE. */
SIM_API int aclsim_device_lost(int dev);

/* ---- statistics ---- */
SIM_API void aclsim_stat_add(const char *counter, uint64_t v);  /* "ops", "hccl_ops", ... */

#ifdef __cplusplus
}
#endif

#endif
