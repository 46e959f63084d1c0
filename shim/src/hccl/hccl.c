/* libhccl.so stand-in: collectives between the simulated devices of ONE process
 * (HcclCommInitAll: one communicator per device, all in one group).
 *
 * How a collective runs (the rendezvous)
 * --------------------------------------
 * A collective call never blocks the host. After validating its arguments the
 * call takes the next sequence number k of its communicator (per rank, in call
 * order) and queues a sim_work (kind SIM_WORK_COLLECTIVE, flag SIM_WF_SELF_CHECK)
 * on the rank's stream. Its exec() runs later on that stream's worker thread:
 *
 *   1. Under the group mutex it finds or creates the group's slot for collective
 *      #k and records its arrival: its arguments and its simulated start time.
 *   2. Not the last arrival: it waits on the group condition variable until the
 *      slot is DONE (or FAILED), never holding the mapping lock while it waits.
 *      If the peers do not all arrive within the real-time timeout (60 s, or
 *      ACLSIM_HCCL_TIMEOUT seconds) the slot becomes FAILED: every rank that is
 *      or later arrives there fails with ACL_ERROR_RT_TASK_TIMEOUT and a message
 *      on stderr names HCCL_E_TIMEOUT — a missing peer never hangs the process.
 *      A peer whose device disappeared (ACLSIM_FAULTS lose:) fails the wait at
 *      once with ACL_ERROR_RT_SUSPECT_REMOTE_ERROR (checked every 50 ms).
 *   3. The last arrival (state RUNNING, group mutex released) checks that every
 *      rank asked for the same collective, then takes aclsim_mm_read_lock(),
 *      range-checks every rank's send/recv buffers with aclsim_check_ranges (one
 *      MMU fault fails the collective on all ranks: the faulting rank's stream
 *      gets ACL_ERROR_RT_DEVICE_MEM_ERROR, its peers ACL_ERROR_RT_SUSPECT_REMOTE_ERROR),
 *      computes the results for all ranks — every input is read into a scratch
 *      buffer before any output is written, since send and recv may alias —
 *      unlocks, sets the common finish time end = max over ranks of start_ns +
 *      cost, marks the slot DONE and wakes the others.
 *   4. Each rank copies its result code and end time into its own work item and
 *      departs; the last to depart frees the slot.
 * Phantom mode (no data) keeps steps 1-4 but skips the data work in step 3.
 *
 * Cost: a ring over the host link, e.g. all-reduce 2*(n-1)/n * bytes / link
 * bandwidth, plus the launch latency.
 *
 * Argument checks follow HCCL's op_base.cc / param_check.cc: count 0 succeeds
 * before anything else is looked at; NULL comm, buffer, stream or output ->
 * HCCL_E_PTR; a data type or reduction op outside the enum -> HCCL_E_NOT_SUPPORT
 * (HcomCheckDataType / HcomCheckReductionOp); a root out of range, a count above
 * HCCL's limit or a stream of another device -> HCCL_E_PARA. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim.h"
#include "hccl/hccl.h"

#define HCCL_EXPORT __attribute__((visibility("default")))

/* Stream error codes with their values from the real acl/error_codes/rt_error_codes.h
 * (not all are in the stand-in headers). */
#ifndef ACL_ERROR_RT_TASK_TIMEOUT
#define ACL_ERROR_RT_TASK_TIMEOUT 107020
#endif
#ifndef ACL_ERROR_RT_SUSPECT_REMOTE_ERROR
#define ACL_ERROR_RT_SUSPECT_REMOTE_ERROR 507057
#endif

/* HCCL's SYS_MAX_COUNT: larger counts are HCCL_E_PARA. */
#define HCCL_MAX_COUNT 0x7FFFFFFFFFULL

#define COMM_MAGIC 0x48434d4dU /* "HCMM" */

enum coll_kind { COLL_ALLREDUCE = 0, COLL_ALLGATHER, COLL_REDUCESCATTER, COLL_BROADCAST, COLL_BATCH };
static const char *const k_coll_name[] = { "HcclAllReduce", "HcclAllGather", "HcclReduceScatter", "HcclBroadcast",
                                           "HcclBatchSendRecv" };

/* One rank's arguments to a collective. */
typedef struct coll_args {
    int kind;
    uintptr_t send, recv;    /* broadcast: both are `buf` */
    uint64_t count;          /* the API's count argument (per-rank unit) */
    int dtype;
    int reduces;             /* AllReduce, ReduceScatter: `op` is meaningful */
    int op;
    uint32_t root;
    /* HcclBatchSendRecv: the rank's items (a copy owned by its coll_work) */
    const HcclSendRecvItem *items;
    uint32_t nitems;
} coll_args;

enum slot_state { SLOT_WAITING = 0, SLOT_RUNNING, SLOT_DONE, SLOT_FAILED };

typedef struct coll_slot {
    struct coll_slot *next;
    uint64_t seq;
    int state;
    int arrived, departed;
    aclError fail_rc;        /* SLOT_FAILED */
    uint64_t end_ns;         /* SLOT_DONE */
    uint64_t cost_ns;
    unsigned char present[SIM_MAX_DEVICES];
    coll_args args[SIM_MAX_DEVICES];
    uint64_t start_ns[SIM_MAX_DEVICES];
    aclError rc[SIM_MAX_DEVICES];
} coll_slot;

typedef struct coll_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* CLOCK_MONOTONIC */
    int nranks;
    int devices[SIM_MAX_DEVICES];
    int refs;                /* live comms + queued work items (under mu) */
    coll_slot *slots;
} coll_group;

typedef struct hccl_comm {
    uint32_t magic;
    struct hccl_comm *next;  /* registry of live comms */
    coll_group *g;
    int rank;
    int device;
    pthread_mutex_t mu;      /* keeps sequence numbers in stream order */
    uint64_t next_seq;
} hccl_comm;

typedef struct coll_work {
    coll_group *g;
    int rank;
    uint64_t seq;
    coll_args a;
} coll_work;

static pthread_mutex_t g_reg = PTHREAD_MUTEX_INITIALIZER;
static hccl_comm *g_comms;

/* ---------------------------------------------------------------- helpers */

static int dtype_size(int dt) {
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: case HCCL_DATA_TYPE_UINT8: case HCCL_DATA_TYPE_HIF8:
    case HCCL_DATA_TYPE_FP8E4M3: case HCCL_DATA_TYPE_FP8E5M2: case HCCL_DATA_TYPE_FP8E8M0:
        return 1;
    case HCCL_DATA_TYPE_INT16: case HCCL_DATA_TYPE_UINT16: case HCCL_DATA_TYPE_FP16:
    case HCCL_DATA_TYPE_BFP16:
        return 2;
    case HCCL_DATA_TYPE_INT32: case HCCL_DATA_TYPE_UINT32: case HCCL_DATA_TYPE_FP32:
        return 4;
    case HCCL_DATA_TYPE_INT64: case HCCL_DATA_TYPE_UINT64: case HCCL_DATA_TYPE_FP64:
        return 8;
    case HCCL_DATA_TYPE_INT128:
        return 16;
    default:
        return 0;
    }
}

/* Types the reduction kernels handle (fp8/hif8/int128 only move). */
static int dtype_reducible(int dt) {
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: case HCCL_DATA_TYPE_UINT8: case HCCL_DATA_TYPE_INT16:
    case HCCL_DATA_TYPE_UINT16: case HCCL_DATA_TYPE_INT32: case HCCL_DATA_TYPE_UINT32:
    case HCCL_DATA_TYPE_INT64: case HCCL_DATA_TYPE_UINT64: case HCCL_DATA_TYPE_FP16:
    case HCCL_DATA_TYPE_BFP16: case HCCL_DATA_TYPE_FP32: case HCCL_DATA_TYPE_FP64:
        return 1;
    default:
        return 0;
    }
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {                 /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, with overflow to infinity and subnormals. */
static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0);
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return sign | 0x7c00u;
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (absx < 0x33000000u) return sign;
        uint32_t e = absx >> 23, man = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;     /* 14 + (113 - e) */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return sign | (uint16_t)half;
    }
    uint32_t r = absx + 0xfffu + ((absx >> 13) & 1u) - ((uint32_t)(127 - 15) << 23);
    return sign | (uint16_t)(r >> 13);
}

static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* dst[i] = src[0][i] op src[1][i] op ... op src[n-1][i], ranks in order. Integer
 * sums and products wrap (computed unsigned). */
#define DEF_INT_REDUCE(NAME, T, UT)                                                           \
    static void red_##NAME(void *dst, const void *const *src, int n, uint64_t cnt, int op) {  \
        T *d = (T *)dst;                                                                      \
        for (uint64_t i = 0; i < cnt; i++) {                                                  \
            T a = ((const T *)src[0])[i];                                                     \
            for (int r = 1; r < n; r++) {                                                     \
                T b = ((const T *)src[r])[i];                                                 \
                switch (op) {                                                                 \
                case HCCL_REDUCE_SUM: a = (T)((UT)a + (UT)b); break;                          \
                case HCCL_REDUCE_PROD: a = (T)((UT)a * (UT)b); break;                         \
                case HCCL_REDUCE_MAX: a = a > b ? a : b; break;                               \
                default: a = a < b ? a : b; break;                                            \
                }                                                                             \
            }                                                                                 \
            d[i] = a;                                                                         \
        }                                                                                     \
    }
DEF_INT_REDUCE(i8, int8_t, uint8_t)
DEF_INT_REDUCE(u8, uint8_t, uint8_t)
DEF_INT_REDUCE(i16, int16_t, uint16_t)
DEF_INT_REDUCE(u16, uint16_t, uint16_t)
DEF_INT_REDUCE(i32, int32_t, uint32_t)
DEF_INT_REDUCE(u32, uint32_t, uint32_t)
DEF_INT_REDUCE(i64, int64_t, uint64_t)
DEF_INT_REDUCE(u64, uint64_t, uint64_t)

static inline double fop(double a, double b, int op) {
    switch (op) {
    case HCCL_REDUCE_SUM: return a + b;
    case HCCL_REDUCE_PROD: return a * b;
    case HCCL_REDUCE_MAX: return a > b ? a : b;
    default: return a < b ? a : b;
    }
}

/* f32 accumulates in f32 (as the device does); f16/bf16 accumulate in f32 and
 * round once. */
static void red_f32(void *dst, const void *const *src, int n, uint64_t cnt, int op) {
    float *d = (float *)dst;
    for (uint64_t i = 0; i < cnt; i++) {
        float a = ((const float *)src[0])[i];
        for (int r = 1; r < n; r++) a = (float)fop(a, ((const float *)src[r])[i], op);
        d[i] = a;
    }
}
static void red_f64(void *dst, const void *const *src, int n, uint64_t cnt, int op) {
    double *d = (double *)dst;
    for (uint64_t i = 0; i < cnt; i++) {
        double a = ((const double *)src[0])[i];
        for (int r = 1; r < n; r++) a = fop(a, ((const double *)src[r])[i], op);
        d[i] = a;
    }
}
static void red_f16(void *dst, const void *const *src, int n, uint64_t cnt, int op) {
    uint16_t *d = (uint16_t *)dst;
    for (uint64_t i = 0; i < cnt; i++) {
        float a = half_to_float(((const uint16_t *)src[0])[i]);
        for (int r = 1; r < n; r++) a = (float)fop(a, half_to_float(((const uint16_t *)src[r])[i]), op);
        d[i] = float_to_half(a);
    }
}
static void red_bf16(void *dst, const void *const *src, int n, uint64_t cnt, int op) {
    uint16_t *d = (uint16_t *)dst;
    for (uint64_t i = 0; i < cnt; i++) {
        float a = bf16_to_float(((const uint16_t *)src[0])[i]);
        for (int r = 1; r < n; r++) a = (float)fop(a, bf16_to_float(((const uint16_t *)src[r])[i]), op);
        d[i] = float_to_bf16(a);
    }
}

static void reduce(int dt, void *dst, const void *const *src, int n, uint64_t cnt, int op) {
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: red_i8(dst, src, n, cnt, op); break;
    case HCCL_DATA_TYPE_UINT8: red_u8(dst, src, n, cnt, op); break;
    case HCCL_DATA_TYPE_INT16: red_i16(dst, src, n, cnt, op); break;
    case HCCL_DATA_TYPE_UINT16: red_u16(dst, src, n, cnt, op); break;
    case HCCL_DATA_TYPE_INT32: red_i32(dst, src, n, cnt, op); break;
    case HCCL_DATA_TYPE_UINT32: red_u32(dst, src, n, cnt, op); break;
    case HCCL_DATA_TYPE_INT64: red_i64(dst, src, n, cnt, op); break;
    case HCCL_DATA_TYPE_UINT64: red_u64(dst, src, n, cnt, op); break;
    case HCCL_DATA_TYPE_FP16: red_f16(dst, src, n, cnt, op); break;
    case HCCL_DATA_TYPE_BFP16: red_bf16(dst, src, n, cnt, op); break;
    case HCCL_DATA_TYPE_FP32: red_f32(dst, src, n, cnt, op); break;
    case HCCL_DATA_TYPE_FP64: red_f64(dst, src, n, cnt, op); break;
    default: break;          /* rejected at the call */
    }
}

/* Byte sizes of one rank's send and recv buffers. */
static void coll_sizes(const coll_args *a, int n, uint64_t *send_b, uint64_t *recv_b) {
    uint64_t b = a->count * (uint64_t)dtype_size(a->dtype);
    switch (a->kind) {
    case COLL_ALLGATHER: *send_b = b; *recv_b = b * (uint64_t)n; break;
    case COLL_REDUCESCATTER: *send_b = b * (uint64_t)n; *recv_b = b; break;
    default: *send_b = b; *recv_b = b; break;
    }
}

/* Ring algorithms over the link: bytes each rank moves, then time. */
static uint64_t coll_cost_ns(const coll_args *a, int n) {
    const sim_config *c = aclsim_config();
    uint64_t b = a->count * (uint64_t)dtype_size(a->dtype);
    double moved = 0;
    if (a->kind == COLL_BATCH) {
        /* every item crosses the link once (sends out, receives in) */
        for (uint32_t i = 0; i < a->nitems; i++)
            moved += (double)a->items[i].count * (double)dtype_size(a->items[i].dataType);
    } else if (n > 1) {
        switch (a->kind) {
        case COLL_ALLREDUCE: moved = 2.0 * (n - 1) / n * (double)b; break;
        case COLL_ALLGATHER: /* fall through: (n-1) of n blocks of b */
        case COLL_REDUCESCATTER: moved = (double)(n - 1) * (double)b; break;
        default: moved = (double)b; break;
        }
    }
    double bw = c->link_gbps > 0 ? c->link_gbps * 1e9 : 25e9;
    return (uint64_t)(moved / bw * 1e9) + (uint64_t)(c->launch_us * 1000.0);
}

/* Real-time limit for peers to arrive (read once). */
static double g_timeout_s = 60.0;
static pthread_once_t g_timeout_once = PTHREAD_ONCE_INIT;

static void timeout_init(void) {
    const char *e = getenv("ACLSIM_HCCL_TIMEOUT");
    if (e && *e) {
        char *end = NULL;
        double x = strtod(e, &end);
        if (end != e && *end == 0 && x > 0 && x < 1e6) g_timeout_s = x;
        else aclsim_log("ignoring ACLSIM_HCCL_TIMEOUT='%s' (want seconds > 0); using %.0f s", e, g_timeout_s);
    }
}

static double timeout_seconds(void) {
    pthread_once(&g_timeout_once, timeout_init);
    return g_timeout_s;
}

static void ts_add(struct timespec *t, double sec) {
    t->tv_sec += (time_t)sec;
    t->tv_nsec += (long)((sec - (double)(time_t)sec) * 1e9);
    if (t->tv_nsec >= 1000000000L) { t->tv_sec++; t->tv_nsec -= 1000000000L; }
}

/* --------------------------------------------------------------- groups */

static void group_unref_locked(coll_group *g, int *freed) {
    *freed = 0;
    if (--g->refs == 0) {
        coll_slot *s = g->slots;
        while (s) {
            coll_slot *n = s->next;
            free(s);
            s = n;
        }
        g->slots = NULL;
        *freed = 1;
    }
}

static void group_unref(coll_group *g) {
    int freed;
    pthread_mutex_lock(&g->mu);
    group_unref_locked(g, &freed);
    pthread_mutex_unlock(&g->mu);
    if (freed) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        free(g);
    }
}

static coll_slot *slot_get(coll_group *g, uint64_t seq) {
    for (coll_slot *s = g->slots; s; s = s->next)
        if (s->seq == seq) return s;
    coll_slot *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->seq = seq;
    s->next = g->slots;
    g->slots = s;
    return s;
}

static void slot_remove(coll_group *g, coll_slot *s) {
    for (coll_slot **p = &g->slots; *p; p = &(*p)->next) {
        if (*p == s) {
            *p = s->next;
            free(s);
            return;
        }
    }
}

/* Same collective on every rank? Returns -1 if so, else the first rank that differs. */
static int args_mismatch(const coll_slot *s, int n) {
    const coll_args *a0 = &s->args[0];
    for (int r = 1; r < n; r++) {
        const coll_args *a = &s->args[r];
        if (a->kind != a0->kind || a->count != a0->count || a->dtype != a0->dtype || a->op != a0->op ||
            a->root != a0->root)
            return r;
    }
    return -1;
}

/* Index of the k-th item of `type` with remoteRank `peer` in a rank's batch, or -1. */
static int batch_nth(const coll_args *a, int type, uint32_t peer, uint32_t k) {
    for (uint32_t i = 0; i < a->nitems; i++) {
        if ((int)a->items[i].sendRecvType == type && a->items[i].remoteRank == peer) {
            if (k == 0) return (int)i;
            k--;
        }
    }
    return -1;
}

static uint32_t batch_count(const coll_args *a, int type, uint32_t peer) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < a->nitems; i++)
        if ((int)a->items[i].sendRecvType == type && a->items[i].remoteRank == peer) k++;
    return k;
}

static uint64_t item_bytes(const HcclSendRecvItem *it) {
    return it->count * (uint64_t)dtype_size(it->dataType);
}

/* HcclBatchSendRecv's last arrival: the k-th send of rank r to rank q pairs
 * with the k-th receive of q from r (counts and data types must agree), every
 * buffer is range-checked, every send is read into scratch before any receive
 * is written (buffers may alias). Group mutex NOT held. */
static void run_batch(coll_group *g, coll_slot *s) {
    const int n = g->nranks;
    for (int r = 0; r < n; r++) {
        for (int q = 0; q < n; q++) {
            const coll_args *a = &s->args[r], *b = &s->args[q];
            uint32_t sends = batch_count(a, HCCL_SEND, (uint32_t)q), recvs = batch_count(b, HCCL_RECV, (uint32_t)r);
            const char *why = NULL;
            uint32_t k = 0;
            if (sends != recvs) why = "the numbers of sends and receives differ";
            for (; !why && k < sends; k++) {
                const HcclSendRecvItem *x = &a->items[batch_nth(a, HCCL_SEND, (uint32_t)q, k)];
                const HcclSendRecvItem *y = &b->items[batch_nth(b, HCCL_RECV, (uint32_t)r, k)];
                if (x->count != y->count || x->dataType != y->dataType) why = "a send and its receive differ in count or type";
            }
            if (why) {
                aclsim_log("HcclBatchSendRecv #%llu: rank %d sends %u item(s) to rank %d, which receives %u from it: %s; "
                           "failing it on all ranks", (unsigned long long)s->seq, r, sends, q, recvs, why);
                for (int x = 0; x < n; x++) s->rc[x] = ACL_ERROR_RT_PARAM_INVALID;
                return;
            }
        }
    }
    aclsim_mm_read_lock();
    int faulted = 0;
    uint64_t total = 0;
    for (int r = 0; r < n; r++) {
        const coll_args *a = &s->args[r];
        sim_range *rg = calloc(a->nitems ? a->nitems : 1, sizeof *rg);
        if (!rg) {
            s->rc[r] = ACL_ERROR_RT_INTERNAL_ERROR;
            faulted = 1;
            continue;
        }
        for (uint32_t i = 0; i < a->nitems; i++) {
            rg[i] = (sim_range){ (uintptr_t)a->items[i].buf, item_bytes(&a->items[i]), a->items[i].sendRecvType == HCCL_RECV };
            if (a->items[i].sendRecvType == HCCL_SEND) total += rg[i].bytes;
        }
        char what[96];
        snprintf(what, sizeof what, "HcclBatchSendRecv (rank %d of %d, device %d)", r, n, g->devices[r]);
        s->rc[r] = aclsim_check_ranges(rg, (int)a->nitems, what);
        if (s->rc[r]) faulted = 1;
        free(rg);
    }
    if (faulted) {
        for (int r = 0; r < n; r++)
            if (!s->rc[r]) s->rc[r] = ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;
    } else if (!aclsim_config()->phantom && total > 0) {
        unsigned char *tmp = malloc(total);
        if (!tmp) {
            aclsim_log("HcclBatchSendRecv: cannot allocate %llu bytes of host scratch", (unsigned long long)total);
            for (int r = 0; r < n; r++) s->rc[r] = ACL_ERROR_RT_INTERNAL_ERROR;
        } else {
            /* pass 0 reads every send into scratch, pass 1 writes every receive */
            for (int pass = 0; pass < 2; pass++) {
                uint64_t off = 0;
                for (int r = 0; r < n; r++) {
                    for (int q = 0; q < n; q++) {
                        const coll_args *a = &s->args[r], *b = &s->args[q];
                        uint32_t sends = batch_count(a, HCCL_SEND, (uint32_t)q);
                        for (uint32_t k = 0; k < sends; k++) {
                            const HcclSendRecvItem *x = &a->items[batch_nth(a, HCCL_SEND, (uint32_t)q, k)];
                            const HcclSendRecvItem *y = &b->items[batch_nth(b, HCCL_RECV, (uint32_t)r, k)];
                            uint64_t nb = item_bytes(x);
                            if (pass == 0) memcpy(tmp + off, x->buf, nb);
                            else memcpy(y->buf, tmp + off, nb);
                            off += nb;
                        }
                    }
                }
            }
            free(tmp);
        }
    }
    aclsim_mm_read_unlock();
}

/* The last arrival: check, compute, time. Group mutex NOT held. */
static void run_collective(coll_group *g, coll_slot *s) {
    const int n = g->nranks;
    const coll_args *a0 = &s->args[0];
    const char *name = k_coll_name[a0->kind];

    int bad = args_mismatch(s, n);
    if (bad >= 0) {
        aclsim_log("%s: collective #%llu differs between ranks (rank 0: %s count %llu dtype %d op %d root %u; "
                   "rank %d: %s count %llu dtype %d op %d root %u); failing it on all ranks",
                   name, (unsigned long long)s->seq, name, (unsigned long long)a0->count, a0->dtype, a0->op,
                   a0->root, bad, k_coll_name[s->args[bad].kind], (unsigned long long)s->args[bad].count,
                   s->args[bad].dtype, s->args[bad].op, s->args[bad].root);
        for (int r = 0; r < n; r++) s->rc[r] = ACL_ERROR_RT_PARAM_INVALID;
        return;
    }
    if (a0->kind == COLL_BATCH) {
        run_batch(g, s);
        goto timing;
    }

    uint64_t send_b, recv_b;
    coll_sizes(a0, n, &send_b, &recv_b);
    aclsim_mm_read_lock();
    int faulted = 0;
    for (int r = 0; r < n; r++) {
        const coll_args *a = &s->args[r];
        sim_range rg[2];
        int nr = 0;
        if (a->kind == COLL_BROADCAST) {
            rg[nr++] = (sim_range){ a->send, send_b, (uint32_t)r != a->root };
        } else {
            rg[nr++] = (sim_range){ a->send, send_b, 0 };
            rg[nr++] = (sim_range){ a->recv, recv_b, 1 };
        }
        char what[96];
        snprintf(what, sizeof what, "%s (rank %d of %d, device %d)", name, r, n, g->devices[r]);
        s->rc[r] = aclsim_check_ranges(rg, nr, what);
        if (s->rc[r]) faulted = 1;
    }
    if (faulted) {
        for (int r = 0; r < n; r++)
            if (!s->rc[r]) s->rc[r] = ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;
    } else if (!aclsim_config()->phantom && send_b > 0) {
        /* Read every input into scratch before writing any output (aliasing). */
        uint64_t tmp_b = a0->kind == COLL_ALLGATHER ? recv_b : send_b;
        unsigned char *tmp = malloc(tmp_b);
        if (!tmp) {
            aclsim_log("%s: cannot allocate %llu bytes of host scratch", name, (unsigned long long)tmp_b);
            for (int r = 0; r < n; r++) s->rc[r] = ACL_ERROR_RT_INTERNAL_ERROR;
        } else {
            const void *src[SIM_MAX_DEVICES] = { 0 };
            for (int r = 0; r < n; r++) src[r] = (const void *)s->args[r].send;
            switch (a0->kind) {
            case COLL_ALLREDUCE:
                reduce(a0->dtype, tmp, src, n, a0->count, a0->op);
                for (int r = 0; r < n; r++) memcpy((void *)s->args[r].recv, tmp, recv_b);
                break;
            case COLL_REDUCESCATTER:
                reduce(a0->dtype, tmp, src, n, a0->count * (uint64_t)n, a0->op);
                for (int r = 0; r < n; r++) memcpy((void *)s->args[r].recv, tmp + (uint64_t)r * recv_b, recv_b);
                break;
            case COLL_ALLGATHER:
                for (int r = 0; r < n; r++) memcpy(tmp + (uint64_t)r * send_b, src[r], send_b);
                for (int r = 0; r < n; r++) memcpy((void *)s->args[r].recv, tmp, recv_b);
                break;
            case COLL_BROADCAST:
                memcpy(tmp, src[a0->root], send_b);
                for (int r = 0; r < n; r++)
                    if ((uint32_t)r != a0->root) memcpy((void *)s->args[r].send, tmp, send_b);
                break;
            }
            free(tmp);
        }
    }
    aclsim_mm_read_unlock();

timing:;
    uint64_t end = 0;
    for (int r = 0; r < n; r++)
        if (s->start_ns[r] + s->cost_ns > end) end = s->start_ns[r] + s->cost_ns;
    s->end_ns = end;
}

static aclError coll_exec(sim_work *w) {
    coll_work *cw = (coll_work *)w->payload;
    coll_group *g = cw->g;
    const int r = cw->rank, n = g->nranks;
    aclError rc;

    aclsim_stat_add("hccl_ops", 1);
    pthread_mutex_lock(&g->mu);
    coll_slot *s = slot_get(g, cw->seq);
    if (!s) {
        pthread_mutex_unlock(&g->mu);
        aclsim_log("%s: out of host memory", k_coll_name[cw->a.kind]);
        return ACL_ERROR_RT_INTERNAL_ERROR;
    }
    if (s->state == SLOT_FAILED) {
        /* A peer gave up on this collective before we arrived. */
        rc = s->fail_rc;
        s->departed++;
        if (s->departed == n) slot_remove(g, s);
        pthread_mutex_unlock(&g->mu);
        return rc;
    }
    s->present[r] = 1;
    s->args[r] = cw->a;
    s->start_ns[r] = w->start_ns;
    if (w->cost_ns > s->cost_ns) s->cost_ns = w->cost_ns;
    s->arrived++;
    if (s->arrived == n) {
        s->state = SLOT_RUNNING;
        pthread_mutex_unlock(&g->mu);
        run_collective(g, s);
        pthread_mutex_lock(&g->mu);
        s->state = SLOT_DONE;
        pthread_cond_broadcast(&g->cv);
    } else {
        struct timespec dl, now;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        double t = timeout_seconds();
        ts_add(&dl, t);
        while (s->state == SLOT_WAITING || s->state == SLOT_RUNNING) {
            if (s->state == SLOT_RUNNING) {
                /* Everyone arrived; the data work is bounded: no timeout. */
                pthread_cond_wait(&g->cv, &g->mu);
                continue;
            }
            /* Wake up now and then to notice a peer whose device disappeared. */
            clock_gettime(CLOCK_MONOTONIC, &now);
            ts_add(&now, 0.05);
            int last = now.tv_sec > dl.tv_sec || (now.tv_sec == dl.tv_sec && now.tv_nsec >= dl.tv_nsec);
            int e = pthread_cond_timedwait(&g->cv, &g->mu, last ? &dl : &now);
            if (s->state != SLOT_WAITING) continue;
            char missing[128] = "";
            size_t off = 0;
            int lost = -1;
            for (int q = 0; q < n; q++) {
                if (s->present[q]) continue;
                if (off < sizeof missing - 8) off += (size_t)snprintf(missing + off, sizeof missing - off, " %d", q);
                if (lost < 0 && aclsim_device_lost(g->devices[q])) lost = q;
            }
            if (lost >= 0) {
                aclsim_log("%s: rank %d (device %d): peer rank %d lost its device %d before collective #%llu",
                           k_coll_name[cw->a.kind], r, g->devices[r], lost, g->devices[lost],
                           (unsigned long long)cw->seq);
                s->state = SLOT_FAILED;
                s->fail_rc = ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;
                pthread_cond_broadcast(&g->cv);
            } else if (e == ETIMEDOUT && last) {
                aclsim_log("%s: HCCL_E_TIMEOUT: rank %d (device %d) waited %.1f s for collective #%llu; "
                           "rank(s)%s never arrived", k_coll_name[cw->a.kind], r, g->devices[r], t,
                           (unsigned long long)cw->seq, missing);
                s->state = SLOT_FAILED;
                s->fail_rc = ACL_ERROR_RT_TASK_TIMEOUT;
                pthread_cond_broadcast(&g->cv);
            }
        }
    }
    if (s->state == SLOT_DONE) {
        rc = s->rc[r];
        if (s->end_ns > w->end_ns) w->end_ns = s->end_ns;
    } else {
        rc = s->fail_rc;
    }
    s->departed++;
    if (s->departed == n) slot_remove(g, s);
    pthread_mutex_unlock(&g->mu);
    return rc;
}

static void coll_destroy(sim_work *w) {
    coll_work *cw = (coll_work *)w->payload;
    if (!cw) return;
    group_unref(cw->g);
    free((void *)cw->a.items);
    free(cw);
    w->payload = NULL;
}

/* ---------------------------------------------------------------- comms */

/* With g_reg held: the live comm `h` or NULL. */
static hccl_comm *comm_find_locked(HcclComm h) {
    for (hccl_comm *c = g_comms; c; c = c->next)
        if ((void *)c == h) return c;
    return NULL;
}

HCCL_EXPORT HcclResult HcclCommInitAll(uint32_t ndev, int32_t *devices, HcclComm *comms) {
    if (ndev == 0) {
        aclsim_log("HcclCommInitAll: ndev is 0");
        return HCCL_E_PARA;
    }
    if (!comms || !devices) return HCCL_E_PTR;
    if (ndev > 65536) {      /* not a device list: do not walk it */
        aclsim_log("HcclCommInitAll: ndev %u is absurd", ndev);
        return HCCL_E_PARA;
    }
    for (uint32_t i = 0; i < ndev; i++)
        for (uint32_t j = i + 1; j < ndev; j++)
            if (devices[i] == devices[j]) {
                aclsim_log("HcclCommInitAll: duplicate device id %d in the device list", devices[i]);
                return HCCL_E_PARA;
            }
    const sim_config *cfg = aclsim_config();
    if (ndev > SIM_MAX_DEVICES || (int)ndev > cfg->devices) {
        /* More ranks than devices: some id is necessarily invalid (HCCL fails to
         * set the device: HCCL_E_INTERNAL). */
        aclsim_log("HcclCommInitAll: %u devices requested, %d present", ndev, cfg->devices);
        return HCCL_E_INTERNAL;
    }
    for (uint32_t i = 0; i < ndev; i++) {
        comms[i] = NULL;
        if (devices[i] < 0 || devices[i] >= cfg->devices) {
            aclsim_log("HcclCommInitAll: cannot set device %d (%d devices present)", devices[i], cfg->devices);
            return HCCL_E_INTERNAL;
        }
    }

    coll_group *g = calloc(1, sizeof *g);
    hccl_comm *cs[SIM_MAX_DEVICES] = { 0 };
    int ok = g != NULL;
    for (uint32_t i = 0; ok && i < ndev; i++) ok = (cs[i] = calloc(1, sizeof *cs[i])) != NULL;
    if (!ok) {
        for (uint32_t i = 0; i < ndev; i++) free(cs[i]);
        free(g);
        return HCCL_E_MEMORY;
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    g->nranks = (int)ndev;
    g->refs = (int)ndev;
    for (uint32_t i = 0; i < ndev; i++) g->devices[i] = devices[i];

    pthread_mutex_lock(&g_reg);
    for (uint32_t i = 0; i < ndev; i++) {
        hccl_comm *c = cs[i];
        c->magic = COMM_MAGIC;
        c->g = g;
        c->rank = (int)i;
        c->device = devices[i];
        pthread_mutex_init(&c->mu, NULL);
        c->next = g_comms;
        g_comms = c;
        comms[i] = c;
    }
    pthread_mutex_unlock(&g_reg);
    return HCCL_SUCCESS;
}

HCCL_EXPORT HcclResult HcclCommDestroy(HcclComm comm) {
    if (!comm) return HCCL_E_PTR;
    pthread_mutex_lock(&g_reg);
    hccl_comm *c = comm_find_locked(comm);
    if (!c) {
        pthread_mutex_unlock(&g_reg);
        aclsim_log("HcclCommDestroy: %p is not a live communicator", comm);
        return HCCL_E_PARA;
    }
    for (hccl_comm **p = &g_comms; *p; p = &(*p)->next)
        if (*p == c) { *p = c->next; break; }
    /* Wait for a collective being queued on it by another thread. */
    pthread_mutex_lock(&c->mu);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&g_reg);
    coll_group *g = c->g;
    c->magic = 0;
    pthread_mutex_destroy(&c->mu);
    free(c);
    /* Queued collectives keep the group alive; peers still waiting for this rank
     * time out. */
    group_unref(g);
    return HCCL_SUCCESS;
}

HCCL_EXPORT HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize) {
    if (!comm || !rankSize) return HCCL_E_PTR;
    pthread_mutex_lock(&g_reg);
    hccl_comm *c = comm_find_locked(comm);
    if (c) *rankSize = (uint32_t)c->g->nranks;
    pthread_mutex_unlock(&g_reg);
    if (!c) {
        aclsim_log("HcclGetRankSize: %p is not a live communicator", comm);
        return HCCL_E_PARA;
    }
    return HCCL_SUCCESS;
}

HCCL_EXPORT HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank) {
    if (!comm || !rank) return HCCL_E_PTR;
    pthread_mutex_lock(&g_reg);
    hccl_comm *c = comm_find_locked(comm);
    if (c) *rank = (uint32_t)c->rank;
    pthread_mutex_unlock(&g_reg);
    if (!c) {
        aclsim_log("HcclGetRankId: %p is not a live communicator", comm);
        return HCCL_E_PARA;
    }
    return HCCL_SUCCESS;
}

/* ----------------------------------------------------------- collectives */

static HcclResult coll_launch(const char *name, coll_args *a, HcclComm comm, aclrtStream stream) {
    /* Same order as HcomCheckOpParam, HcomCheckReductionOp, HcomCheckReduceDataType. */
    if (a->count > HCCL_MAX_COUNT) {
        aclsim_log("%s: count %llu is bigger than the maximum %llu", name, (unsigned long long)a->count,
                   (unsigned long long)HCCL_MAX_COUNT);
        return HCCL_E_PARA;
    }
    if (a->dtype < 0 || a->dtype >= HCCL_DATA_TYPE_RESERVED || dtype_size(a->dtype) == 0) {
        aclsim_log("%s: data type %d not supported", name, a->dtype);
        return HCCL_E_NOT_SUPPORT;
    }
    if (!stream) {
        aclsim_log("%s: stream is NULL", name);
        return HCCL_E_PTR;
    }
    if (a->reduces) {
        if (a->op < HCCL_REDUCE_SUM || a->op > HCCL_REDUCE_MIN) {
            aclsim_log("%s: reduction op %d not supported", name, a->op);
            return HCCL_E_NOT_SUPPORT;
        }
        /* 910B rejects PROD on int16/bf16; fp8/hif8/int128 cannot be reduced here. */
        if (!dtype_reducible(a->dtype) ||
            (a->op == HCCL_REDUCE_PROD && (a->dtype == HCCL_DATA_TYPE_INT16 || a->dtype == HCCL_DATA_TYPE_BFP16))) {
            aclsim_log("%s: reduction op %d not supported for data type %d", name, a->op, a->dtype);
            return HCCL_E_NOT_SUPPORT;
        }
    }

    pthread_mutex_lock(&g_reg);
    hccl_comm *c = comm_find_locked(comm);
    if (!c) {
        pthread_mutex_unlock(&g_reg);
        aclsim_log("%s: %p is not a live communicator", name, comm);
        return HCCL_E_PARA;
    }
    pthread_mutex_lock(&c->mu);
    pthread_mutex_unlock(&g_reg);
    coll_group *g = c->g;
    HcclResult hr = HCCL_SUCCESS;

    if (a->kind == COLL_BROADCAST && a->root >= (uint32_t)g->nranks) {
        aclsim_log("%s: root %u is out of range [0, %d)", name, a->root, g->nranks);
        hr = HCCL_E_PARA;
        goto out;
    }
    aclError e = aclsim_check_ready();
    if (e) {
        aclsim_log("%s: runtime not ready on this thread (error %d)", name, e);
        hr = HCCL_E_RUNTIME;
        goto out;
    }
    int sdev = aclsim_stream_device(stream);
    if (sdev < 0) {
        aclsim_log("%s: %p is not a valid stream", name, stream);
        hr = HCCL_E_PARA;
        goto out;
    }
    if (sdev != c->device) {
        aclsim_log("%s: stream %p belongs to device %d but rank %d of the communicator is device %d", name, stream,
                   sdev, c->rank, c->device);
        hr = HCCL_E_PARA;
        goto out;
    }
    if (aclsim_fault_hit(SIM_FAULT_COLL)) {
        aclsim_log("%s: injected fault (ACLSIM_FAULTS coll) on rank %d", name, c->rank);
        hr = HCCL_E_RUNTIME;
        goto out;
    }

    uint64_t send_b, recv_b;
    coll_sizes(a, g->nranks, &send_b, &recv_b);
    coll_work *cw = calloc(1, sizeof *cw);
    int nr = a->kind == COLL_BATCH ? (int)a->nitems : a->kind == COLL_BROADCAST ? 1 : 2;
    HcclSendRecvItem *items = NULL;
    if (cw && a->kind == COLL_BATCH) {
        items = malloc((size_t)a->nitems * sizeof *items);
        if (items) memcpy(items, a->items, (size_t)a->nitems * sizeof *items);
    }
    sim_work *w = cw && (items || a->kind != COLL_BATCH) ? aclsim_work_new(nr) : NULL;
    if (!w) {
        free(items);
        free(cw);
        hr = HCCL_E_MEMORY;
        goto out;
    }
    snprintf(w->what, sizeof w->what, "%s(rank %d)", name, c->rank);
    w->kind = SIM_WORK_COLLECTIVE;
    w->flags = SIM_WF_SELF_CHECK;
    if (a->kind == COLL_BATCH) {
        w->nranges = nr;
        for (int i = 0; i < nr; i++)
            w->ranges[i] = (sim_range){ (uintptr_t)items[i].buf, item_bytes(&items[i]), items[i].sendRecvType == HCCL_RECV };
    } else if (a->kind == COLL_BROADCAST) {
        w->nranges = 1;
        w->ranges[0] = (sim_range){ a->send, send_b, a->root != (uint32_t)c->rank };
    } else {
        w->nranges = 2;
        w->ranges[0] = (sim_range){ a->send, send_b, 0 };
        w->ranges[1] = (sim_range){ a->recv, recv_b, 1 };
    }
    w->cost_ns = coll_cost_ns(a, g->nranks);
    w->exec = coll_exec;
    w->destroy = coll_destroy;
    cw->g = g;
    cw->rank = c->rank;
    cw->seq = c->next_seq;
    cw->a = *a;
    cw->a.items = items;
    w->payload = cw;
    pthread_mutex_lock(&g->mu);
    g->refs++;               /* released by coll_destroy */
    pthread_mutex_unlock(&g->mu);

    e = aclsim_submit(stream, w);   /* takes ownership of w (destroy runs on failure too) */
    if (e) {
        aclsim_log("%s: queueing on the stream failed (error %d)", name, e);
        hr = HCCL_E_RUNTIME;
        goto out;
    }
    c->next_seq++;
out:
    pthread_mutex_unlock(&c->mu);
    return hr;
}

HCCL_EXPORT HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType,
    HcclReduceOp op, HcclComm comm, aclrtStream stream) {
    if (count == 0) return HCCL_SUCCESS;
    if (!comm || !sendBuf || !recvBuf) return HCCL_E_PTR;
    coll_args a = { COLL_ALLREDUCE, (uintptr_t)sendBuf, (uintptr_t)recvBuf, count, (int)dataType, 1, (int)op, 0, NULL, 0 };
    return coll_launch("HcclAllReduce", &a, comm, stream);
}

HCCL_EXPORT HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType,
    HcclComm comm, aclrtStream stream) {
    if (sendCount == 0) return HCCL_SUCCESS;
    if (!comm || !sendBuf || !recvBuf) return HCCL_E_PTR;
    coll_args a = { COLL_ALLGATHER, (uintptr_t)sendBuf, (uintptr_t)recvBuf, sendCount, (int)dataType, 0, 0, 0, NULL, 0 };
    return coll_launch("HcclAllGather", &a, comm, stream);
}

HCCL_EXPORT HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType,
    HcclReduceOp op, HcclComm comm, aclrtStream stream) {
    if (recvCount == 0) return HCCL_SUCCESS;
    if (!comm || !sendBuf || !recvBuf) return HCCL_E_PTR;
    coll_args a = { COLL_REDUCESCATTER, (uintptr_t)sendBuf, (uintptr_t)recvBuf, recvCount, (int)dataType, 1, (int)op,
                     0, NULL, 0 };
    return coll_launch("HcclReduceScatter", &a, comm, stream);
}

HCCL_EXPORT HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
    aclrtStream stream) {
    if (count == 0) return HCCL_SUCCESS;
    if (!comm || !buf) return HCCL_E_PTR;
    coll_args a = { COLL_BROADCAST, (uintptr_t)buf, (uintptr_t)buf, count, (int)dataType, 0, 0, root, NULL, 0 };
    return coll_launch("HcclBroadcast", &a, comm, stream);
}

/* Point-to-point transfers between the ranks of one communicator. The
 * simulator pairs them through the communicator's rendezvous: every rank of the
 * communicator calls HcclBatchSendRecv the same number of times, in the same
 * order relative to its other collectives (real HCCL only needs the ranks that
 * exchange data); the k-th send of rank r to rank q pairs with the k-th receive
 * of q from r. Argument checks follow the collectives': no items -> success;
 * a NULL item array, buffer or comm -> HCCL_E_PTR; an unknown send/recv type,
 * a remote rank outside the communicator or a count above the limit ->
 * HCCL_E_PARA; an unknown data type -> HCCL_E_NOT_SUPPORT. */
HCCL_EXPORT HcclResult HcclBatchSendRecv(HcclSendRecvItem *sendRecvInfo, uint32_t itemNum, HcclComm comm,
    aclrtStream stream) {
    if (itemNum == 0) return HCCL_SUCCESS;
    if (!comm || !sendRecvInfo) return HCCL_E_PTR;
    uint32_t nranks = 0;
    HcclResult hr = HcclGetRankSize(comm, &nranks);
    if (hr != HCCL_SUCCESS) return hr;
    for (uint32_t i = 0; i < itemNum; i++) {
        const HcclSendRecvItem *it = &sendRecvInfo[i];
        if (it->sendRecvType != HCCL_SEND && it->sendRecvType != HCCL_RECV) {
            aclsim_log("HcclBatchSendRecv: item %u has send/recv type %d", i, (int)it->sendRecvType);
            return HCCL_E_PARA;
        }
        if (it->remoteRank >= nranks) {
            aclsim_log("HcclBatchSendRecv: item %u names remote rank %u of a communicator of %u", i, it->remoteRank,
                       nranks);
            return HCCL_E_PARA;
        }
        if (it->count > HCCL_MAX_COUNT) {
            aclsim_log("HcclBatchSendRecv: item %u: count %llu is bigger than the maximum %llu", i,
                       (unsigned long long)it->count, (unsigned long long)HCCL_MAX_COUNT);
            return HCCL_E_PARA;
        }
        if ((int)it->dataType < 0 || it->dataType >= HCCL_DATA_TYPE_RESERVED || dtype_size(it->dataType) == 0) {
            aclsim_log("HcclBatchSendRecv: item %u: data type %d not supported", i, (int)it->dataType);
            return HCCL_E_NOT_SUPPORT;
        }
        if (!it->buf && it->count > 0) return HCCL_E_PTR;
    }
    coll_args a = { COLL_BATCH, 0, 0, 0, HCCL_DATA_TYPE_INT8, 0, 0, 0, sendRecvInfo, itemNum };
    return coll_launch("HcclBatchSendRecv", &a, comm, stream);
}
