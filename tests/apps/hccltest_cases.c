/* Scenario checks for the HCCL stand-in (run with ACLSIM_DEVICES >= 2); one
 * scenario per run, chosen with --case:
 *   ops       every collective, data types and reductions, in and out of place;
 *             results compared with host-computed expectations ("ok_<what>=1")
 *   threads   one host thread per device, many all-reduces ("ok_threads=1")
 *   fault     a collective on a freed buffer, then on an unmapped VMM range:
 *             the stream sync codes of both ranks, peer buffers untouched, and
 *             the group still works afterwards
 *   badinput  the HcclResult of bad calls ("<name>=<code>")
 *   timeout   only rank 0 calls: its stream sync code ("sync0=<code>")
 *   inject    first collective call under ACLSIM_FAULTS=coll:1 ("first=<code>")
 *   mismatch  ranks disagree on the count ("sync0=<code> sync1=<code>")
 *   lost      device 1 disappears (ACLSIM_FAULTS=lose:1@1) when its rank queues
 *             the collective: "call1=<HcclResult> sync0=<rank 0's sync code>"
 *   timing    device 0 is busy (a 256 MiB memset) before an all-reduce of 4 MiB:
 *             simulated times of events recorded before and after it on both
 *             streams ("t0_before=<ns> ..." from aclrtEventElapsedTime)
 * Exit 1 when a check fails, 2 on an unexpected ACL/HCCL error. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "hccl/hccl.h"
#include "common/common.h"

#define NDEV 2

#define HCCL_CHECK(call) do {                                                              \
        int hr_ = (int)(call);                                                              \
        if (hr_ != 0) {                                                                     \
            fprintf(stderr, "hccltest: HCCL error %d at %s:%d: %s\n", hr_, __FILE__, __LINE__, \
                    #call);                                                                 \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)

static HcclComm g_comm[NDEV];
static aclrtStream g_s[NDEV];
static int g_fail;

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "hccltest: check failed: %s\n", what);
        g_fail = 1;
    }
}

static void setup(void) {
    ACL_CHECK(aclInit(NULL));
    int32_t devs[NDEV];
    for (int d = 0; d < NDEV; d++) {
        devs[d] = d;
        ACL_CHECK(aclrtSetDevice(d));
        ACL_CHECK(aclrtCreateStream(&g_s[d]));
    }
    HCCL_CHECK(HcclCommInitAll(NDEV, devs, g_comm));
}

static void *dmalloc(int d, size_t bytes) {
    void *p = NULL;
    ACL_CHECK(aclrtSetDevice(d));
    ACL_CHECK(aclrtMalloc(&p, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    return p;
}

static void put(int d, void *dst, const void *src, size_t bytes) {
    ACL_CHECK(aclrtSetDevice(d));
    ACL_CHECK(aclrtMemcpy(dst, bytes, src, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
}

static void get(int d, void *dst, const void *src, size_t bytes) {
    ACL_CHECK(aclrtSetDevice(d));
    ACL_CHECK(aclrtSynchronizeStream(g_s[d]));
    ACL_CHECK(aclrtMemcpy(dst, bytes, src, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
}

static void sync_all(void) {
    for (int d = 0; d < NDEV; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        ACL_CHECK(aclrtSynchronizeStream(g_s[d]));
    }
}

/* ---- element helpers over the tested types ---- */
static int esize(int dt) {
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: return 1;
    case HCCL_DATA_TYPE_FP16: return 2;
    case HCCL_DATA_TYPE_INT32: case HCCL_DATA_TYPE_FP32: return 4;
    default: return 8;  /* INT64 */
    }
}

/* value of element i of rank r: small, so products fit every type */
static double val(int r, int i) { return (double)(((i * 7 + r * 3) % 7) - 3); }

static void store(int dt, void *buf, int i, double v) {
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case HCCL_DATA_TYPE_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case HCCL_DATA_TYPE_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case HCCL_DATA_TYPE_FP32: ((float *)buf)[i] = (float)(v * 0.25); break;
    case HCCL_DATA_TYPE_FP16: ((_Float16 *)buf)[i] = (_Float16)(v * 0.25); break;
    }
}

static double load(int dt, const void *buf, int i) {
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: return ((const int8_t *)buf)[i];
    case HCCL_DATA_TYPE_INT32: return ((const int32_t *)buf)[i];
    case HCCL_DATA_TYPE_INT64: return (double)((const int64_t *)buf)[i];
    case HCCL_DATA_TYPE_FP32: return ((const float *)buf)[i];
    default: return (double)((const _Float16 *)buf)[i];
    }
}

static double red(int op, double a, double b) {
    switch (op) {
    case HCCL_REDUCE_SUM: return a + b;
    case HCCL_REDUCE_PROD: return a * b;
    case HCCL_REDUCE_MAX: return a > b ? a : b;
    default: return a < b ? a : b;
    }
}

static int case_ops(void) {
    setup();
    const int dts[] = { HCCL_DATA_TYPE_INT8, HCCL_DATA_TYPE_INT32, HCCL_DATA_TYPE_INT64, HCCL_DATA_TYPE_FP32,
                        HCCL_DATA_TYPE_FP16 };
    const int ops[] = { HCCL_REDUCE_SUM, HCCL_REDUCE_PROD, HCCL_REDUCE_MAX, HCCL_REDUCE_MIN };
    enum { CNT = 37 };
    unsigned char host[NDEV][CNT * 8], out[CNT * 8];
    void *send[NDEV], *recv[NDEV];
    for (int d = 0; d < NDEV; d++) {
        send[d] = dmalloc(d, CNT * 8 * NDEV);
        recv[d] = dmalloc(d, CNT * 8 * NDEV);
    }
    int collectives = 0;
    int ok_ar = 1;
    for (size_t a = 0; a < sizeof dts / sizeof dts[0]; a++) {
        for (size_t b = 0; b < sizeof ops / sizeof ops[0]; b++) {
            int dt = dts[a], op = ops[b];
            for (int inplace = 0; inplace < 2; inplace++) {
                for (int d = 0; d < NDEV; d++) {
                    for (int i = 0; i < CNT; i++) store(dt, host[d], i, val(d, i));
                    put(d, send[d], host[d], (size_t)CNT * esize(dt));
                }
                for (int d = 0; d < NDEV; d++) {
                    ACL_CHECK(aclrtSetDevice(d));
                    void *dst = inplace ? send[d] : recv[d];
                    HCCL_CHECK(HcclAllReduce(send[d], dst, CNT, (HcclDataType)dt, (HcclReduceOp)op, g_comm[d], g_s[d]));
                }
                collectives++;
                for (int d = 0; d < NDEV; d++) {
                    get(d, out, inplace ? send[d] : recv[d], (size_t)CNT * esize(dt));
                    for (int i = 0; i < CNT; i++) {
                        double e = load(dt, host[0], i);
                        for (int r = 1; r < NDEV; r++) e = red(op, e, load(dt, host[r], i));
                        if (dt == HCCL_DATA_TYPE_FP16) e = (double)(_Float16)e;
                        if (dt == HCCL_DATA_TYPE_FP32) e = (double)(float)e;
                        if (load(dt, out, i) != e) {
                            fprintf(stderr, "allreduce dt %d op %d inplace %d dev %d elem %d: got %g want %g\n", dt,
                                    op, inplace, d, i, load(dt, out, i), e);
                            ok_ar = 0;
                            break;
                        }
                    }
                }
            }
        }
    }
    check(ok_ar, "allreduce results");
    printf("ok_allreduce=%d\n", ok_ar);

    /* AllGather, out of place and in place (send = own block of recv). */
    enum { SC = 5 };
    int ok_ag = 1;
    for (int inplace = 0; inplace < 2; inplace++) {
        float h[NDEV][SC], o[NDEV * SC];
        for (int d = 0; d < NDEV; d++) {
            for (int i = 0; i < SC; i++) h[d][i] = (float)(100 * d + i);
            void *src = inplace ? (char *)recv[d] + (size_t)d * SC * 4 : send[d];
            put(d, src, h[d], sizeof h[d]);
        }
        for (int d = 0; d < NDEV; d++) {
            ACL_CHECK(aclrtSetDevice(d));
            void *src = inplace ? (char *)recv[d] + (size_t)d * SC * 4 : send[d];
            HCCL_CHECK(HcclAllGather(src, recv[d], SC, HCCL_DATA_TYPE_FP32, g_comm[d], g_s[d]));
        }
        collectives++;
        for (int d = 0; d < NDEV; d++) {
            get(d, o, recv[d], sizeof o);
            for (int r = 0; r < NDEV; r++)
                if (memcmp(&o[r * SC], h[r], sizeof h[r]) != 0) ok_ag = 0;
        }
    }
    check(ok_ag, "allgather results");
    printf("ok_allgather=%d\n", ok_ag);

    /* ReduceScatter (SUM, MAX on int32). */
    enum { RC = 6 };
    int ok_rs = 1;
    for (int k = 0; k < 2; k++) {
        int op = k ? HCCL_REDUCE_MAX : HCCL_REDUCE_SUM;
        int32_t h[NDEV][NDEV * RC], o[RC];
        for (int d = 0; d < NDEV; d++) {
            for (int i = 0; i < NDEV * RC; i++) h[d][i] = (i * 5 + d * 11) % 13 - 6;
            put(d, send[d], h[d], sizeof h[d]);
        }
        for (int d = 0; d < NDEV; d++) {
            ACL_CHECK(aclrtSetDevice(d));
            HCCL_CHECK(HcclReduceScatter(send[d], recv[d], RC, HCCL_DATA_TYPE_INT32, (HcclReduceOp)op, g_comm[d], g_s[d]));
        }
        collectives++;
        for (int d = 0; d < NDEV; d++) {
            get(d, o, recv[d], sizeof o);
            for (int i = 0; i < RC; i++) {
                int32_t e = h[0][d * RC + i];
                for (int r = 1; r < NDEV; r++) e = op ? (e > h[r][d * RC + i] ? e : h[r][d * RC + i]) : e + h[r][d * RC + i];
                if (o[i] != e) ok_rs = 0;
            }
        }
    }
    check(ok_rs, "reducescatter results");
    printf("ok_reducescatter=%d\n", ok_rs);

    /* Broadcast from rank 1. */
    int ok_bc = 1;
    {
        int64_t h[NDEV][9], o[9];
        for (int d = 0; d < NDEV; d++) {
            for (int i = 0; i < 9; i++) h[d][i] = (int64_t)1000000007 * (d + 1) + i;
            put(d, send[d], h[d], sizeof h[d]);
        }
        for (int d = 0; d < NDEV; d++) {
            ACL_CHECK(aclrtSetDevice(d));
            HCCL_CHECK(HcclBroadcast(send[d], 9, HCCL_DATA_TYPE_INT64, 1, g_comm[d], g_s[d]));
        }
        collectives++;
        for (int d = 0; d < NDEV; d++) {
            get(d, o, send[d], sizeof o);
            if (memcmp(o, h[1], sizeof o) != 0) ok_bc = 0;
        }
    }
    check(ok_bc, "broadcast results");
    printf("ok_broadcast=%d\n", ok_bc);

    /* count 0 is a successful no-op that queues nothing */
    for (int d = 0; d < NDEV; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        HCCL_CHECK(HcclAllReduce(send[d], recv[d], 0, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, g_comm[d], g_s[d]));
    }
    sync_all();
    uint32_t rs = 0, rk = 0;
    HCCL_CHECK(HcclGetRankSize(g_comm[1], &rs));
    HCCL_CHECK(HcclGetRankId(g_comm[1], &rk));
    printf("rank_size=%u rank_of_comm1=%u\n", rs, rk);
    printf("collectives=%d\n", collectives);
    for (int d = 0; d < NDEV; d++) HCCL_CHECK(HcclCommDestroy(g_comm[d]));
    ACL_CHECK(aclFinalize());
    return g_fail;
}

/* ---- threads: one host thread per device ---- */
typedef struct { int d; int ok; } targ;

static void *thread_main(void *p) {
    targ *t = p;
    int d = t->d;
    enum { CNT = 1000, ROUNDS = 50 };
    ACL_CHECK(aclrtSetDevice(d));
    aclrtStream s;
    ACL_CHECK(aclrtCreateStream(&s));
    float *h = malloc(CNT * 4), *o = malloc(CNT * 4);
    void *buf = NULL;
    ACL_CHECK(aclrtMalloc(&buf, CNT * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    t->ok = 1;
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < CNT; i++) h[i] = (float)(d * 1000 + i + round);
        ACL_CHECK(aclrtMemcpy(buf, CNT * 4, h, CNT * 4, ACL_MEMCPY_HOST_TO_DEVICE));
        HCCL_CHECK(HcclAllReduce(buf, buf, CNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, g_comm[d], s));
        ACL_CHECK(aclrtSynchronizeStream(s));
        ACL_CHECK(aclrtMemcpy(o, CNT * 4, buf, CNT * 4, ACL_MEMCPY_DEVICE_TO_HOST));
        for (int i = 0; i < CNT; i++) {
            float e = 0;
            for (int r = 0; r < NDEV; r++) e += (float)(r * 1000 + i + round);
            if (o[i] != e) { t->ok = 0; break; }
        }
    }
    ACL_CHECK(aclrtFree(buf));
    ACL_CHECK(aclrtDestroyStream(s));
    free(h);
    free(o);
    return NULL;
}

static int case_threads(void) {
    ACL_CHECK(aclInit(NULL));
    int32_t devs[NDEV];
    for (int d = 0; d < NDEV; d++) devs[d] = d;
    HCCL_CHECK(HcclCommInitAll(NDEV, devs, g_comm));
    pthread_t th[NDEV];
    targ ta[NDEV];
    for (int d = 0; d < NDEV; d++) {
        ta[d].d = d;
        if (pthread_create(&th[d], NULL, thread_main, &ta[d])) app_die(2, "pthread_create failed");
    }
    int ok = 1;
    for (int d = 0; d < NDEV; d++) {
        pthread_join(th[d], NULL);
        ok &= ta[d].ok;
    }
    printf("ok_threads=%d\n", ok);
    for (int d = 0; d < NDEV; d++) HCCL_CHECK(HcclCommDestroy(g_comm[d]));
    ACL_CHECK(aclFinalize());
    return ok ? 0 : 1;
}

/* ---- fault: collectives on memory that is not there ---- */
static int allreduce_both(void *const send[], void *const recv[], uint64_t cnt, int code[NDEV]) {
    for (int d = 0; d < NDEV; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        HCCL_CHECK(HcclAllReduce(send[d], recv[d], cnt, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, g_comm[d], g_s[d]));
    }
    for (int d = 0; d < NDEV; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        code[d] = aclrtSynchronizeStream(g_s[d]);
    }
    return 0;
}

static int case_fault(void) {
    setup();
    enum { CNT = 4096 };
    float marker[CNT], o[CNT];
    for (int i = 0; i < CNT; i++) marker[i] = -1.5f;
    void *send[NDEV], *recv[NDEV];
    for (int d = 0; d < NDEV; d++) {
        send[d] = dmalloc(d, CNT * 4);
        recv[d] = dmalloc(d, CNT * 4);
        put(d, send[d], marker, sizeof marker);
        put(d, recv[d], marker, sizeof marker);
    }
    /* 1. rank 1's receive buffer was freed (a use-after-free the host cannot see). */
    ACL_CHECK(aclrtSetDevice(1));
    ACL_CHECK(aclrtFree(recv[1]));
    void *freed = recv[1];
    int code[NDEV];
    allreduce_both(send, recv, CNT, code);
    printf("freed_sync0=%d freed_sync1=%d\n", code[0], code[1]);
    get(0, o, recv[0], sizeof o);
    printf("freed_rank0_untouched=%d\n", memcmp(o, marker, sizeof o) == 0);
    (void)freed;

    /* 2. rank 0's send buffer lies in a VMM range whose mapping was removed. */
    ACL_CHECK(aclrtSetDevice(0));
    aclrtPhysicalMemProp prop = { ACL_MEM_HANDLE_TYPE_NONE, ACL_MEM_ALLOCATION_TYPE_PINNED, ACL_HBM_MEM_HUGE,
                                  { 0, ACL_MEM_LOCATION_TYPE_DEVICE }, 0 };
    void *va = NULL;
    aclrtDrvMemHandle h = NULL;
    ACL_CHECK(aclrtReserveMemAddress(&va, 4u << 20, 0, NULL, 1));
    ACL_CHECK(aclrtMallocPhysical(&h, 2u << 20, &prop, 0));
    ACL_CHECK(aclrtMapMem(va, 2u << 20, 0, h, 0));
    ACL_CHECK(aclrtUnmapMem(va));
    recv[1] = dmalloc(1, CNT * 4);
    put(1, recv[1], marker, sizeof marker);
    void *send2[NDEV] = { (char *)va + 4096, send[1] };
    allreduce_both(send2, recv, CNT, code);
    printf("unmapped_sync0=%d unmapped_sync1=%d\n", code[0], code[1]);
    get(1, o, recv[1], sizeof o);
    printf("unmapped_rank1_untouched=%d\n", memcmp(o, marker, sizeof o) == 0);

    /* 3. a partly mapped buffer: the range runs off the end of the mapping. */
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtMapMem(va, 2u << 20, 0, h, 0));
    void *send3[NDEV] = { (char *)va + (2u << 20) - 1024, send[1] };
    allreduce_both(send3, recv, CNT, code);
    printf("partial_sync0=%d partial_sync1=%d\n", code[0], code[1]);

    /* 4. the group still works. */
    float h0[CNT];
    for (int i = 0; i < CNT; i++) h0[i] = (float)i;
    for (int d = 0; d < NDEV; d++) put(d, send[d], h0, sizeof h0);
    allreduce_both(send, recv, CNT, code);
    int after = code[0] == 0 && code[1] == 0;
    for (int d = 0; d < NDEV; d++) {
        get(d, o, recv[d], sizeof o);
        for (int i = 0; i < CNT; i++)
            if (o[i] != 2.0f * (float)i) { after = 0; break; }
    }
    printf("after_ok=%d\n", after);

    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtUnmapMem(va));
    ACL_CHECK(aclrtFreePhysical(h));
    ACL_CHECK(aclrtReleaseMemAddress(va));
    for (int d = 0; d < NDEV; d++) HCCL_CHECK(HcclCommDestroy(g_comm[d]));
    ACL_CHECK(aclFinalize());
    return 0;
}

/* ---- badinput ---- */
static int case_badinput(void) {
    setup();
    void *b0 = dmalloc(0, 4096), *b1 = dmalloc(1, 4096);
    ACL_CHECK(aclrtSetDevice(0));
    HcclComm c = g_comm[0];
    aclrtStream s = g_s[0];
#define P(name, expr) printf("%s=%d\n", name, (int)(expr))
    P("null_comm", HcclAllReduce(b0, b0, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, NULL, s));
    P("null_send", HcclAllReduce(NULL, b0, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, c, s));
    P("null_recv", HcclAllReduce(b0, NULL, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, c, s));
    P("null_stream", HcclAllReduce(b0, b0, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, c, NULL));
    P("count0_null_bufs", HcclAllReduce(NULL, NULL, 0, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, c, s));
    P("bad_dtype", HcclAllReduce(b0, b0, 4, (HcclDataType)99, HCCL_REDUCE_SUM, c, s));
    P("bad_dtype_255", HcclAllReduce(b0, b0, 4, HCCL_DATA_TYPE_RESERVED, HCCL_REDUCE_SUM, c, s));
    P("bad_op", HcclAllReduce(b0, b0, 4, HCCL_DATA_TYPE_FP32, (HcclReduceOp)9, c, s));
    P("sum_fp8", HcclAllReduce(b0, b0, 4, HCCL_DATA_TYPE_FP8E4M3, HCCL_REDUCE_SUM, c, s));
    P("prod_int16", HcclAllReduce(b0, b0, 4, HCCL_DATA_TYPE_INT16, HCCL_REDUCE_PROD, c, s));
    P("huge_count", HcclAllReduce(b0, b0, 1ULL << 40, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, c, s));
    P("bcast_root_oob", HcclBroadcast(b0, 4, HCCL_DATA_TYPE_FP32, 2, c, s));
    P("bcast_null_buf", HcclBroadcast(NULL, 4, HCCL_DATA_TYPE_FP32, 0, c, s));
    P("ag_null_recv", HcclAllGather(b0, NULL, 4, HCCL_DATA_TYPE_FP32, c, s));
    P("rs_bad_op", HcclReduceScatter(b0, b0, 4, HCCL_DATA_TYPE_FP32, (HcclReduceOp)-1, c, s));
    /* comm of device 1 with a stream of device 0 (current device 0) */
    P("stream_other_device", HcclAllReduce(b0, b0, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, g_comm[1], s));
    /* comm of device 0 with a stream of device 1 while device 1 is current */
    ACL_CHECK(aclrtSetDevice(1));
    P("stream_other_device2", HcclAllReduce(b1, b1, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, c, g_s[1]));
    ACL_CHECK(aclrtSetDevice(0));
    uint32_t u = 0;
    P("ranksize_null_out", HcclGetRankSize(c, NULL));
    P("ranksize_null_comm", HcclGetRankSize(NULL, &u));
    P("rankid_null_out", HcclGetRankId(c, NULL));
    int32_t devs[3] = { 0, 1, 0 };
    HcclComm cs[3];
    P("initall_ndev0", HcclCommInitAll(0, devs, cs));
    P("initall_null_devices", HcclCommInitAll(2, NULL, cs));
    P("initall_null_comms", HcclCommInitAll(2, devs, NULL));
    P("initall_duplicate", HcclCommInitAll(3, devs, cs));
    int32_t far[2] = { 0, 7 };
    P("initall_bad_device", HcclCommInitAll(2, far, cs));
    P("destroy_null", HcclCommDestroy(NULL));
    /* a destroyed communicator is not a live handle any more */
    int32_t one[1] = { 0 };
    HcclComm solo;
    HCCL_CHECK(HcclCommInitAll(1, one, &solo));
    HCCL_CHECK(HcclCommDestroy(solo));
    P("destroyed_comm", HcclAllReduce(b0, b0, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, solo, s));
    P("destroy_twice", HcclCommDestroy(solo));
    /* nothing above may have queued work: both streams are clean */
    P("sync0", aclrtSynchronizeStream(s));
    ACL_CHECK(aclrtSetDevice(1));
    P("sync1", aclrtSynchronizeStream(g_s[1]));
#undef P
    for (int d = 0; d < NDEV; d++) HCCL_CHECK(HcclCommDestroy(g_comm[d]));
    ACL_CHECK(aclFinalize());
    return 0;
}

/* ---- timeout: rank 1 never arrives ---- */
static int case_timeout(void) {
    setup();
    void *b0 = dmalloc(0, 4096);
    ACL_CHECK(aclrtSetDevice(0));
    HCCL_CHECK(HcclAllReduce(b0, b0, 16, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, g_comm[0], g_s[0]));
    printf("sync0=%d\n", aclrtSynchronizeStream(g_s[0]));
    fflush(stdout);
    for (int d = 0; d < NDEV; d++) HCCL_CHECK(HcclCommDestroy(g_comm[d]));
    ACL_CHECK(aclFinalize());
    return 0;
}

/* ---- inject: ACLSIM_FAULTS=coll:1 ---- */
static int case_inject(void) {
    setup();
    enum { CNT = 64 };
    float h[CNT], o[CNT];
    void *b[NDEV];
    for (int i = 0; i < CNT; i++) h[i] = (float)i;
    for (int d = 0; d < NDEV; d++) {
        b[d] = dmalloc(d, CNT * 4);
        put(d, b[d], h, sizeof h);
    }
    ACL_CHECK(aclrtSetDevice(0));
    printf("first=%d\n", HcclAllReduce(b[0], b[0], CNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, g_comm[0], g_s[0]));
    /* the failed call queued nothing: the next pair matches up */
    for (int d = 0; d < NDEV; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        HCCL_CHECK(HcclAllReduce(b[d], b[d], CNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, g_comm[d], g_s[d]));
    }
    int ok = 1;
    for (int d = 0; d < NDEV; d++) {
        get(d, o, b[d], sizeof o);
        for (int i = 0; i < CNT; i++)
            if (o[i] != 2.0f * i) ok = 0;
    }
    printf("second_ok=%d\n", ok);
    for (int d = 0; d < NDEV; d++) HCCL_CHECK(HcclCommDestroy(g_comm[d]));
    ACL_CHECK(aclFinalize());
    return 0;
}

/* ---- mismatch: ranks disagree on the count ---- */
static int case_mismatch(void) {
    setup();
    void *b[NDEV];
    for (int d = 0; d < NDEV; d++) b[d] = dmalloc(d, 4096);
    for (int d = 0; d < NDEV; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        HCCL_CHECK(HcclAllReduce(b[d], b[d], 8 + (uint64_t)d, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, g_comm[d], g_s[d]));
    }
    for (int d = 0; d < NDEV; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        printf("sync%d=%d\n", d, aclrtSynchronizeStream(g_s[d]));
    }
    for (int d = 0; d < NDEV; d++) HCCL_CHECK(HcclCommDestroy(g_comm[d]));
    ACL_CHECK(aclFinalize());
    return 0;
}

/* ---- lost: rank 1's device disappears as it queues its part ---- */
static int case_lost(void) {
    setup();
    void *b[NDEV];
    for (int d = 0; d < NDEV; d++) b[d] = dmalloc(d, 4096);
    for (int d = 0; d < NDEV; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        int rc = HcclAllReduce(b[d], b[d], 16, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, g_comm[d], g_s[d]);
        printf("call%d=%d\n", d, rc);
    }
    ACL_CHECK(aclrtSetDevice(0));
    printf("sync0=%d\n", aclrtSynchronizeStream(g_s[0]));
    return 0;
}

/* ---- timing: the collective ends at the same simulated time on every rank ---- */
static int case_timing(void) {
    setup();
    enum { CNT = 1 << 20 };
    void *b[NDEV], *big = dmalloc(0, 256u << 20);
    aclrtEvent start[NDEV], before[NDEV], after[NDEV];
    for (int d = 0; d < NDEV; d++) {
        b[d] = dmalloc(d, CNT * 4);
        ACL_CHECK(aclrtSetDevice(d));
        ACL_CHECK(aclrtCreateEvent(&start[d]));
        ACL_CHECK(aclrtCreateEvent(&before[d]));
        ACL_CHECK(aclrtCreateEvent(&after[d]));
        ACL_CHECK(aclrtRecordEvent(start[d], g_s[d]));
    }
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtMemsetAsync(big, 256u << 20, 1, 256u << 20, g_s[0]));
    for (int d = 0; d < NDEV; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        ACL_CHECK(aclrtRecordEvent(before[d], g_s[d]));
        HCCL_CHECK(HcclAllReduce(b[d], b[d], CNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, g_comm[d], g_s[d]));
        ACL_CHECK(aclrtRecordEvent(after[d], g_s[d]));
    }
    sync_all();
    /* every time relative to device 0's start event (simulated clocks are global) */
    for (int d = 0; d < NDEV; d++) {
        float a = 0, z = 0;
        ACL_CHECK(aclrtEventElapsedTime(&a, start[0], before[d]));
        ACL_CHECK(aclrtEventElapsedTime(&z, start[0], after[d]));
        printf("t%d_before=%.0f t%d_after=%.0f\n", d, (double)a * 1e6, d, (double)z * 1e6);
    }
    for (int d = 0; d < NDEV; d++) HCCL_CHECK(HcclCommDestroy(g_comm[d]));
    ACL_CHECK(aclFinalize());
    return 0;
}

int main(int argc, char **argv) {
    const char *which = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--case"))) which = v;
        else app_die(3, "usage: hccltest_cases --case ops|threads|fault|badinput|timeout|inject|mismatch|timing|lost");
    }
    if (!which) app_die(3, "--case is required");
    if (!strcmp(which, "ops")) return case_ops();
    if (!strcmp(which, "threads")) return case_threads();
    if (!strcmp(which, "fault")) return case_fault();
    if (!strcmp(which, "badinput")) return case_badinput();
    if (!strcmp(which, "timeout")) return case_timeout();
    if (!strcmp(which, "inject")) return case_inject();
    if (!strcmp(which, "mismatch")) return case_mismatch();
    if (!strcmp(which, "timing")) return case_timing();
    if (!strcmp(which, "lost")) return case_lost();
    app_die(3, "unknown case '%s'", which);
}
