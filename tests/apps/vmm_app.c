/* An expandable-segments allocator in the style of torch_npu's
 * (NPUCachingAllocator with PYTORCH_NPU_ALLOC_CONF=expandable_segments:True):
 *
 *   - aclrtGetMemInfo sizes the VA; torch_npu's support probe reserves 512 bytes
 *     with flags 1 and releases them;
 *   - ONE large VA range is reserved (flags 1 = huge pages) and split into a small
 *     pool (2 MiB segments, requests <= 1 MiB) and a large pool (20 MiB segments,
 *     ceil(1.125 * total / 20 MiB) of them, as torch_npu sizes it);
 *   - a bump allocator carves tensors at 512-byte granularity inside each pool;
 *     segments are backed on demand by aclrtMallocPhysical + aclrtMapMem (prop
 *     {NONE, PINNED, HBM_MEM_HUGE, {device, DEVICE}}), so tensors get interior
 *     pointers and some span two physical handles;
 *   - operators (MatMul, Add, Relu, Mul via aclopExecuteV2) run on them and every
 *     result is copied back and hashed;
 *   - when a pool reaches its mapped-segment limit, and after every step, it
 *     shrinks as torch_npu does: aclrtSynchronizeDevice, aclrtUnmapMem each slot,
 *     keep up to two free physical handles for reuse, aclrtFreePhysical the rest;
 *   - at the end: fresh handles re-mapped into some slots must read as zeros, a
 *     handle moved to another slot must keep its contents, and everything is
 *     unmapped, freed and released (device memory back to where it started).
 *
 * Options: --segments N (3: large-pool segments mapped at once), --tensors T (24
 *          operator groups per step), --steps S (3)
 * Output:  key=value facts, among them "checksum=<hex>" over all results read
 *          back and "mapped_peak=<bytes>". Deterministic. ACL errors exit 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "acl/acl_op.h"
#include "common/common.h"

#define MIB (1024ULL * 1024)
#define SMALL_SEG (2 * MIB)
#define LARGE_SEG (20 * MIB)
#define SMALL_REQ_MAX (1 * MIB)   /* torch_npu: requests up to 1 MiB use the small pool */
#define ALIGN 512ULL
#define CACHE_MAX 2

typedef struct {
    const char *name;
    uintptr_t base;
    uint64_t seg;
    int nslots;                  /* slots in the reservation */
    int limit;                   /* slots that may be mapped at once */
    int mapped;                  /* slots [0, mapped) are mapped */
    uint64_t bump;               /* next free byte offset */
    aclrtDrvMemHandle *h;        /* per slot */
    aclrtDrvMemHandle cache[CACHE_MAX];
    int ncache;
    int peak;                    /* most slots mapped at once */
} pool;

static int g_dev;
static uint64_t g_mapped, g_mapped_peak, g_handles, g_spans, g_resets;
static aclrtPhysicalMemProp g_prop;

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static aclrtDrvMemHandle new_handle(uint64_t size) {
    aclrtDrvMemHandle h = NULL;
    ACL_CHECK(aclrtMallocPhysical(&h, size, &g_prop, 0));
    g_handles++;
    return h;
}

/* Backs slots [mapped, upto) of `p`. */
static void pool_grow(pool *p, int upto) {
    for (int i = p->mapped; i < upto; i++) {
        aclrtDrvMemHandle h = p->ncache ? p->cache[--p->ncache] : new_handle(p->seg);
        ACL_CHECK(aclrtMapMem((void *)(p->base + (uint64_t)i * p->seg), p->seg, 0, h, 0));
        p->h[i] = h;
        g_mapped += p->seg;
        if (g_mapped > g_mapped_peak) g_mapped_peak = g_mapped;
    }
    if (upto > p->mapped) p->mapped = upto;
    if (p->mapped > p->peak) p->peak = p->mapped;
}

/* Releases every segment of `p`; the caller has synchronised the device (unmap
 * does not wait for queued work). */
static void pool_shrink(pool *p) {
    for (int i = 0; i < p->mapped; i++) {
        ACL_CHECK(aclrtUnmapMem((void *)(p->base + (uint64_t)i * p->seg)));
        g_mapped -= p->seg;
        if (p->ncache < CACHE_MAX) p->cache[p->ncache++] = p->h[i];
        else ACL_CHECK(aclrtFreePhysical(p->h[i]));
        p->h[i] = NULL;
    }
    p->mapped = 0;
    p->bump = 0;
    g_resets++;
}

static void pool_drop_cache(pool *p) {
    while (p->ncache) ACL_CHECK(aclrtFreePhysical(p->cache[--p->ncache]));
}

/* Slots needed to hold `bump` bytes. */
static int slots_for(const pool *p, uint64_t bytes) { return (int)((bytes + p->seg - 1) / p->seg); }

static void *pool_alloc(pool *p, uint64_t bytes) {
    uint64_t off = round_up(p->bump, ALIGN), end = off + bytes;
    int need = slots_for(p, end);
    if (need > p->limit) app_die(1, "%s pool: %llu bytes do not fit its %d segments", p->name,
                                 (unsigned long long)bytes, p->limit);
    pool_grow(p, need);
    if (off / p->seg != (end - 1) / p->seg) g_spans++;
    p->bump = end;
    return (void *)(p->base + off);
}

typedef struct { void *p; int nd; int64_t d[2]; } T;
static T t1(void *p, int64_t a) { T t = { p, 1, { a, 0 } }; return t; }
static T t2(void *p, int64_t a, int64_t b) { T t = { p, 2, { a, b } }; return t; }

static void run_op(const char *type, int nin, const T *in, int nout, const T *out, aclrtStream s) {
    aclTensorDesc *id[4], *od[2];
    aclDataBuffer *ib[4], *ob[2];
    for (int i = 0; i < nin + nout; i++) {
        const T *t = i < nin ? &in[i] : &out[i - nin];
        size_t bytes = 4;
        for (int k = 0; k < t->nd; k++) bytes *= (size_t)t->d[k];
        aclTensorDesc *d = aclCreateTensorDesc(ACL_FLOAT, t->nd, t->d, ACL_FORMAT_ND);
        aclDataBuffer *b = aclCreateDataBuffer(t->p, bytes);
        if (!d || !b) app_die(2, "cannot describe a tensor of %s", type);
        if (i < nin) { id[i] = d; ib[i] = b; } else { od[i - nin] = d; ob[i - nin] = b; }
    }
    ACL_CHECK(aclopExecuteV2(type, nin, id, ib, nout, od, ob, NULL, s));
    for (int i = 0; i < nin; i++) { aclDestroyTensorDesc(id[i]); ACL_CHECK(aclDestroyDataBuffer(ib[i])); }
    for (int i = 0; i < nout; i++) { aclDestroyTensorDesc(od[i]); ACL_CHECK(aclDestroyDataBuffer(ob[i])); }
}

static pool *pool_for(pool *small, pool *large, uint64_t bytes) { return bytes <= SMALL_REQ_MAX ? small : large; }

int main(int argc, char **argv) {
    int segments = 3, tensors = 24, steps = 3;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--segments"))) segments = (int)app_parse_int(v, "--segments");
        else if ((v = app_opt(argc, argv, &i, "--tensors"))) tensors = (int)app_parse_int(v, "--tensors");
        else if ((v = app_opt(argc, argv, &i, "--steps"))) steps = (int)app_parse_int(v, "--steps");
        else app_die(3, "usage: vmm_app [--segments N] [--tensors T] [--steps S]");
    }
    if (segments < 1 || segments > 4096) app_die(3, "--segments must be 1..4096");

    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(g_dev));
    aclrtStream s;
    ACL_CHECK(aclrtCreateStream(&s));

    size_t free0 = 0, total = 0;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free0, &total));

    g_prop.handleType = ACL_MEM_HANDLE_TYPE_NONE;
    g_prop.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
    g_prop.memAttr = ACL_HBM_MEM_HUGE;
    g_prop.location.id = (uint32_t)g_dev;
    g_prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    g_prop.reserve = 0;
    size_t gran = 0;
    ACL_CHECK(aclrtMemGetAllocationGranularity(&g_prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &gran));
    if (gran == 0 || SMALL_SEG % gran || LARGE_SEG % gran) app_die(1, "unexpected granularity %zu", gran);

    /* torch_npu's probe for expandable-segment support. */
    void *probe = NULL;
    ACL_CHECK(aclrtReserveMemAddress(&probe, 512, 0, NULL, 1));
    ACL_CHECK(aclrtReleaseMemAddress(probe));

    pool small = { "small", 0, SMALL_SEG, 64, 0, 0, 0, NULL, { 0 }, 0, 0 };
    pool large = { "large", 0, LARGE_SEG, 0, 0, 0, 0, NULL, { 0 }, 0, 0 };
    large.nslots = (int)((total + total / 8 + LARGE_SEG - 1) / LARGE_SEG);
    if (large.nslots < 3) large.nslots = 3;
    large.limit = segments < large.nslots ? segments : large.nslots;
    small.limit = 2 * segments > 4 ? 2 * segments : 4;
    if (small.limit > small.nslots) small.limit = small.nslots;
    uint64_t small_bytes = (uint64_t)small.nslots * SMALL_SEG, large_bytes = (uint64_t)large.nslots * LARGE_SEG;
    void *va = NULL;
    ACL_CHECK(aclrtReserveMemAddress(&va, small_bytes + large_bytes, 0, NULL, 1));
    small.base = (uintptr_t)va;
    large.base = (uintptr_t)va + small_bytes;
    small.h = calloc((size_t)small.nslots, sizeof(aclrtDrvMemHandle));
    large.h = calloc((size_t)large.nslots, sizeof(aclrtDrvMemHandle));
    if (!small.h || !large.h) app_die(3, "out of host memory");

    const int64_t Ms[] = { 256, 1024, 2048, 4096, 8192, 16384 }, Ks[] = { 16, 32, 64 }, Ns[] = { 16, 32, 64, 128 };
    size_t hostcap = (size_t)16384 * 128;
    float *ha = calloc(hostcap, 4), *hb = calloc(hostcap, 4), *hc = calloc(hostcap, 4);
    if (!ha || !hb || !hc) app_die(3, "out of host memory");
    uint64_t rng = 0xc0ffeeULL, sum = APP_FNV_INIT;

    for (int step = 0; step < steps; step++) {
        for (int g = 0; g < tensors; g++) {
            int64_t M = Ms[app_rand_u64(&rng) % 6], K = Ks[app_rand_u64(&rng) % 3], N = Ns[app_rand_u64(&rng) % 4];
            uint64_t bA = (uint64_t)(M * K) * 4, bB = (uint64_t)(K * N) * 4, bC = (uint64_t)(M * N) * 4;
            uint64_t bBias = (uint64_t)N * 4, bS = 4;
            /* The whole group must fit each pool it uses; shrink a full pool first
             * (after a device sync, as torch_npu does before unmapping). */
            uint64_t sz[5] = { bA, bB, bC, bBias, bS };
            uint64_t want_small = round_up(small.bump, ALIGN), want_large = round_up(large.bump, ALIGN);
            for (int i = 0; i < 5; i++) {
                if (pool_for(&small, &large, sz[i]) == &small) want_small = round_up(want_small, ALIGN) + sz[i];
                else want_large = round_up(want_large, ALIGN) + sz[i];
            }
            int shrink_small = slots_for(&small, want_small) > small.limit;
            int shrink_large = slots_for(&large, want_large) > large.limit;
            if (shrink_small || shrink_large) {
                ACL_CHECK(aclrtSynchronizeDevice());
                if (shrink_small) pool_shrink(&small);
                if (shrink_large) pool_shrink(&large);
            }
            float *A = pool_alloc(pool_for(&small, &large, bA), bA);
            float *B = pool_alloc(pool_for(&small, &large, bB), bB);
            float *C = pool_alloc(pool_for(&small, &large, bC), bC);
            float *bias = pool_alloc(pool_for(&small, &large, bBias), bBias);
            float *half = pool_alloc(pool_for(&small, &large, bS), bS);

            for (int64_t i = 0; i < M * K; i++) ha[i] = app_rand_f32(&rng, 1.0f);
            for (int64_t i = 0; i < K * N; i++) hb[i] = app_rand_f32(&rng, 1.0f);
            ACL_CHECK(aclrtMemcpy(A, bA, ha, bA, ACL_MEMCPY_HOST_TO_DEVICE));
            ACL_CHECK(aclrtMemcpy(B, bB, hb, bB, ACL_MEMCPY_HOST_TO_DEVICE));
            for (int64_t i = 0; i < N; i++) hc[i] = app_rand_f32(&rng, 0.5f);
            hc[N] = 0.5f;
            ACL_CHECK(aclrtMemcpy(bias, bBias, hc, bBias, ACL_MEMCPY_HOST_TO_DEVICE));
            ACL_CHECK(aclrtMemcpy(half, bS, &hc[N], bS, ACL_MEMCPY_HOST_TO_DEVICE));

            /* C = relu(A B + bias) * 0.5 */
            { T in[2] = { t2(A, M, K), t2(B, K, N) }; T out[1] = { t2(C, M, N) }; run_op("MatMul", 2, in, 1, out, s); }
            { T in[2] = { t2(C, M, N), t1(bias, N) }; T out[1] = { t2(C, M, N) }; run_op("Add", 2, in, 1, out, s); }
            { T in[1] = { t2(C, M, N) }; T out[1] = { t2(C, M, N) }; run_op("Relu", 1, in, 1, out, s); }
            { T in[2] = { t2(C, M, N), t1(half, 1) }; T out[1] = { t2(C, M, N) }; run_op("Mul", 2, in, 1, out, s); }

            ACL_CHECK(aclrtSynchronizeStream(s));
            ACL_CHECK(aclrtMemcpy(hc, bC, C, bC, ACL_MEMCPY_DEVICE_TO_HOST));
            sum = app_fnv(sum, hc, bC);
        }
        /* End of step: release the segments (torch_npu's empty_cache path). */
        ACL_CHECK(aclrtSynchronizeDevice());
        pool_shrink(&small);
        pool_shrink(&large);
    }
    pool_drop_cache(&small);
    pool_drop_cache(&large);

    /* Fresh handles must read as zeros wherever they are mapped. */
    uint8_t *buf = malloc(LARGE_SEG);
    if (!buf) app_die(3, "out of host memory");
    int fresh_zero = 1;
    struct { pool *p; int slot; } probes[] = { { &small, 0 }, { &small, small.nslots - 1 }, { &large, 0 }, { &large, 1 } };
    for (size_t k = 0; k < sizeof probes / sizeof probes[0]; k++) {
        pool *p = probes[k].p;
        void *at = (void *)(p->base + (uint64_t)probes[k].slot * p->seg);
        aclrtDrvMemHandle h = new_handle(p->seg);
        ACL_CHECK(aclrtMapMem(at, p->seg, 0, h, 0));
        memset(buf, 0xab, p->seg);
        ACL_CHECK(aclrtMemcpy(buf, p->seg, at, p->seg, ACL_MEMCPY_DEVICE_TO_HOST));
        for (uint64_t i = 0; i < p->seg; i++)
            if (buf[i]) { fresh_zero = 0; break; }
        ACL_CHECK(aclrtUnmapMem(at));
        ACL_CHECK(aclrtFreePhysical(h));
    }

    /* Physical memory keeps its contents when it is mapped somewhere else. */
    int remap_preserves = 1;
    {
        void *from = (void *)large.base, *to = (void *)(large.base + 2 * LARGE_SEG);
        aclrtDrvMemHandle h = new_handle(LARGE_SEG);
        ACL_CHECK(aclrtMapMem(from, LARGE_SEG, 0, h, 0));
        for (uint64_t i = 0; i < LARGE_SEG; i++) buf[i] = (uint8_t)(i * 131 + (i >> 13));
        ACL_CHECK(aclrtMemcpy(from, LARGE_SEG, buf, LARGE_SEG, ACL_MEMCPY_HOST_TO_DEVICE));
        ACL_CHECK(aclrtUnmapMem(from));
        ACL_CHECK(aclrtMapMem(to, LARGE_SEG, 0, h, 0));
        uint8_t *back = calloc(1, LARGE_SEG);
        if (!back) app_die(3, "out of host memory");
        ACL_CHECK(aclrtMemcpy(back, LARGE_SEG, to, LARGE_SEG, ACL_MEMCPY_DEVICE_TO_HOST));
        remap_preserves = memcmp(back, buf, LARGE_SEG) == 0;
        free(back);
        ACL_CHECK(aclrtUnmapMem(to));
        ACL_CHECK(aclrtFreePhysical(h));
    }

    ACL_CHECK(aclrtReleaseMemAddress(va));
    size_t free1 = 0, total1 = 0;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total1));

    printf("granularity=%zu\n", gran);
    printf("reserved=%llu large_slots=%d small_slots=%d\n", (unsigned long long)(small_bytes + large_bytes),
           large.nslots, small.nslots);
    printf("small_peak_segments=%d large_peak_segments=%d\n", small.peak, large.peak);
    printf("handles_allocated=%llu spans=%llu shrinks=%llu\n", (unsigned long long)g_handles,
           (unsigned long long)g_spans, (unsigned long long)g_resets);
    printf("fresh_zero=%d remap_preserves=%d memory_restored=%d\n", fresh_zero, remap_preserves, free1 == free0);
    printf("mapped_peak=%llu\n", (unsigned long long)g_mapped_peak);
    printf("checksum=%016llx\n", (unsigned long long)sum);

    free(small.h);
    free(large.h);
    free(ha); free(hb); free(hc); free(buf);
    ACL_CHECK(aclrtDestroyStream(s));
    ACL_CHECK(aclrtResetDevice(g_dev));
    ACL_CHECK(aclFinalize());
    return 0;
}
