/* hostmem_app: physical memory in host RAM mapped at device addresses
 * (aclrtMallocPhysical with an ACL_MEM_LOCATION_TYPE_HOST_NUMA location +
 * aclrtMapMem), and managed memory (aclrtMemAllocManaged + advise/prefetch).
 * Each case prints key=value facts; tests/sim_hostmem.rs decides what is right.
 *
 *   --case roundtrip   Add(a, b) written by the device into a host handle, read
 *                      back by D2H and compared with a host reference
 *   --case mixed       MatMul and Add with inputs half in HBM, half in host
 *                      handles, against the same operators all in HBM
 *   --case cost        simulated time of Add over host-mapped / HBM operands,
 *                      a D2D copy and a memset on host-mapped memory
 *   --case capacity    host handles larger than HBM; HBM stays free
 *   --case errors      misuse of host handles: "<name>=<aclError>" lines
 *   --case fault       an MMU fault right next to a host-mapped range
 *   --case adam        ApplyAdam with var, m, v in a host handle (updated in place
 *                      over the link) against the same step all in HBM
 *   --case collective  HcclAllReduce in place on host-mapped buffers of two
 *                      devices (ACLSIM_DEVICES=2)
 *   --case managed     managed memory: host and device use, advise, prefetch
 *   --case managed_errors  misuse of the managed-memory calls
 * Exit 0 when the case ran to its end, 2 on an unexpected ACL error. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "hccl/hccl.h"
#include "common/common.h"

#define MIB (1024ULL * 1024)
#define P(name, expr) printf("%s=%d\n", name, (int)(expr))

static aclrtStream g_stream;

static aclrtPhysicalMemProp host_prop(void) {
    aclrtPhysicalMemProp p = { ACL_MEM_HANDLE_TYPE_NONE, ACL_MEM_ALLOCATION_TYPE_PINNED, ACL_MEM_HUGE,
                               { 0, ACL_MEM_LOCATION_TYPE_HOST_NUMA }, 0 };
    return p;
}

static aclrtPhysicalMemProp dev_prop(void) {
    aclrtPhysicalMemProp p = { ACL_MEM_HANDLE_TYPE_NONE, ACL_MEM_ALLOCATION_TYPE_PINNED, ACL_HBM_MEM_HUGE,
                               { 0, ACL_MEM_LOCATION_TYPE_DEVICE }, 0 };
    return p;
}

/* A host handle of `bytes` mapped at the start of a fresh reservation. */
static void *host_mapped(uint64_t bytes, aclrtDrvMemHandle *h) {
    void *va = NULL;
    aclrtPhysicalMemProp p = host_prop();
    ACL_CHECK(aclrtReserveMemAddress(&va, bytes, 0, NULL, 0));
    ACL_CHECK(aclrtMallocPhysical(h, bytes, &p, 0));
    ACL_CHECK(aclrtMapMem(va, bytes, 0, *h, 0));
    return va;
}

static void unmap_free(void *va, aclrtDrvMemHandle h) {
    ACL_CHECK(aclrtUnmapMem(va));
    ACL_CHECK(aclrtFreePhysical(h));
    ACL_CHECK(aclrtReleaseMemAddress(va));
}

static void *hbm(uint64_t bytes) {
    void *p = NULL;
    ACL_CHECK(aclrtMalloc(&p, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    return p;
}

static float *rand_arr(size_t n, uint64_t seed) {
    float *a = malloc(n * 4);
    if (!a) app_die(2, "out of host memory");
    for (size_t i = 0; i < n; i++) a[i] = app_rand_f32(&seed, 1.0f);
    return a;
}

static void put(void *dev, const float *h, size_t n) {
    ACL_CHECK(aclrtMemcpy(dev, n * 4, h, n * 4, ACL_MEMCPY_HOST_TO_DEVICE));
}

static void get(float *h, const void *dev, size_t n) {
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    ACL_CHECK(aclrtMemcpy(h, n * 4, dev, n * 4, ACL_MEMCPY_DEVICE_TO_HOST));
}

/* One f32 ND operator through aclopExecuteV2 on g_stream. */
static aclError op(const char *type, int nin, void *const *in, const int64_t (*ishape)[2], int nout, void *const *out,
                   const int64_t (*oshape)[2], aclopAttr *attr) {
    aclTensorDesc *id[4], *od[2];
    aclDataBuffer *ib[4], *ob[2];
    for (int i = 0; i < nin; i++) {
        id[i] = aclCreateTensorDesc(ACL_FLOAT, 2, ishape[i], ACL_FORMAT_ND);
        ib[i] = aclCreateDataBuffer(in[i], (size_t)(ishape[i][0] * ishape[i][1] * 4));
    }
    for (int j = 0; j < nout; j++) {
        od[j] = aclCreateTensorDesc(ACL_FLOAT, 2, oshape[j], ACL_FORMAT_ND);
        ob[j] = aclCreateDataBuffer(out[j], (size_t)(oshape[j][0] * oshape[j][1] * 4));
    }
    aclError rc = aclopExecuteV2(type, nin, id, ib, nout, od, ob, attr, g_stream);
    for (int i = 0; i < nin; i++) { aclDestroyTensorDesc(id[i]); aclDestroyDataBuffer(ib[i]); }
    for (int j = 0; j < nout; j++) { aclDestroyTensorDesc(od[j]); aclDestroyDataBuffer(ob[j]); }
    return rc;
}

static aclError add(void *a, void *b, void *c, int64_t rows, int64_t cols) {
    const int64_t sh[3][2] = { { rows, cols }, { rows, cols }, { rows, cols } };
    void *in[2] = { a, b }, *out[1] = { c };
    return op("Add", 2, in, sh, 1, out, sh + 2, NULL);
}

static aclError matmul(void *a, void *b, void *c, int64_t m, int64_t k, int64_t n) {
    const int64_t is[2][2] = { { m, k }, { k, n } }, os[1][2] = { { m, n } };
    void *in[2] = { a, b }, *out[1] = { c };
    aclopAttr *attr = aclopCreateAttr();
    ACL_CHECK(aclopSetAttrBool(attr, "transpose_x1", 0));
    ACL_CHECK(aclopSetAttrBool(attr, "transpose_x2", 0));
    aclError rc = op("MatMul", 2, in, is, 1, out, os, attr);
    aclopDestroyAttr(attr);
    return rc;
}

/* Simulated duration of what `fn` queues on g_stream, in ns (events). */
static double timed(void (*fn)(void *), void *arg) {
    aclrtEvent e0, e1;
    ACL_CHECK(aclrtCreateEvent(&e0));
    ACL_CHECK(aclrtCreateEvent(&e1));
    ACL_CHECK(aclrtRecordEvent(e0, g_stream));
    fn(arg);
    ACL_CHECK(aclrtRecordEvent(e1, g_stream));
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    float ms = 0;
    ACL_CHECK(aclrtEventElapsedTime(&ms, e0, e1));
    ACL_CHECK(aclrtDestroyEvent(e0));
    ACL_CHECK(aclrtDestroyEvent(e1));
    return (double)ms * 1e6;
}

/* ------------------------------------------------------------------ cases */

static int case_roundtrip(void) {
    const int64_t rows = 512, cols = 1024;             /* 2 MiB per operand */
    const size_t n = (size_t)(rows * cols);
    float *ha = rand_arr(n, 1), *hb = rand_arr(n, 2), *back = malloc(n * 4);
    void *a = hbm(n * 4), *b = hbm(n * 4);
    put(a, ha, n);
    put(b, hb, n);
    aclrtDrvMemHandle h;
    void *c = host_mapped(4 * MIB, &h);
    ACL_CHECK(add(a, b, c, rows, cols));
    get(back, c, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (back[i] != ha[i] + hb[i]) bad++;
    printf("roundtrip_mismatches=%zu\n", bad);
    printf("roundtrip_checksum=%016llx\n", (unsigned long long)app_fnv(APP_FNV_INIT, back, n * 4));
    /* the handle keeps its contents across unmap and a mapping elsewhere */
    void *va2 = NULL;
    ACL_CHECK(aclrtUnmapMem(c));
    ACL_CHECK(aclrtReserveMemAddress(&va2, 4 * MIB, 0, NULL, 0));
    ACL_CHECK(aclrtMapMem(va2, 4 * MIB, 0, h, 0));
    memset(back, 0, n * 4);
    get(back, va2, n);
    bad = 0;
    for (size_t i = 0; i < n; i++)
        if (back[i] != ha[i] + hb[i]) bad++;
    printf("remap_mismatches=%zu\n", bad);
    ACL_CHECK(aclrtUnmapMem(va2));
    ACL_CHECK(aclrtReleaseMemAddress(va2));
    ACL_CHECK(aclrtFreePhysical(h));
    ACL_CHECK(aclrtReleaseMemAddress(c));
    ACL_CHECK(aclrtFree(a));
    ACL_CHECK(aclrtFree(b));
    free(ha);
    free(hb);
    free(back);
    return 0;
}

/* out = MatMul(x, w) + bias, once with everything in HBM and once with x and
 * bias in HBM, w and out in one host handle (mixed with an HBM handle in the
 * same reservation). Prints both checksums. */
static int case_mixed(void) {
    const int64_t m = 128, k = 256, nn = 512;
    const size_t nx = (size_t)(m * k), nw = (size_t)(k * nn), no = (size_t)(m * nn);
    float *hx = rand_arr(nx, 3), *hw = rand_arr(nw, 4), *hbias = rand_arr(no, 5);
    float *r1 = malloc(no * 4), *r2 = malloc(no * 4);
    /* all HBM */
    void *x = hbm(nx * 4), *w = hbm(nw * 4), *bias = hbm(no * 4), *t = hbm(no * 4), *o = hbm(no * 4);
    put(x, hx, nx);
    put(w, hw, nw);
    put(bias, hbias, no);
    ACL_CHECK(matmul(x, w, t, m, k, nn));
    ACL_CHECK(add(t, bias, o, m, nn));
    get(r1, o, no);
    /* one reservation: [0, 2 MiB) an HBM handle (x, bias, t), [2, 4 MiB) a host handle (w, out) */
    void *va = NULL;
    aclrtDrvMemHandle hd, hh;
    aclrtPhysicalMemProp pd = dev_prop(), ph = host_prop();
    ACL_CHECK(aclrtReserveMemAddress(&va, 4 * MIB, 0, NULL, 0));
    ACL_CHECK(aclrtMallocPhysical(&hd, 2 * MIB, &pd, 0));
    ACL_CHECK(aclrtMallocPhysical(&hh, 2 * MIB, &ph, 0));
    ACL_CHECK(aclrtMapMem(va, 2 * MIB, 0, hd, 0));
    ACL_CHECK(aclrtMapMem((char *)va + 2 * MIB, 2 * MIB, 0, hh, 0));
    char *dv = va, *hv = (char *)va + 2 * MIB;
    void *x2 = dv, *bias2 = dv + nx * 4, *t2 = dv + nx * 4 + no * 4;
    void *w2 = hv, *o2 = hv + nw * 4;
    put(x2, hx, nx);
    put(w2, hw, nw);
    put(bias2, hbias, no);
    ACL_CHECK(matmul(x2, w2, t2, m, k, nn));
    ACL_CHECK(add(t2, bias2, o2, m, nn));
    get(r2, o2, no);
    printf("hbm_checksum=%016llx\n", (unsigned long long)app_fnv(APP_FNV_INIT, r1, no * 4));
    printf("mixed_checksum=%016llx\n", (unsigned long long)app_fnv(APP_FNV_INIT, r2, no * 4));
    printf("mixed_equal=%d\n", memcmp(r1, r2, no * 4) == 0);
    ACL_CHECK(aclrtUnmapMem(va));
    ACL_CHECK(aclrtUnmapMem(hv));
    ACL_CHECK(aclrtFreePhysical(hd));
    ACL_CHECK(aclrtFreePhysical(hh));
    ACL_CHECK(aclrtReleaseMemAddress(va));
    return 0;
}

typedef struct { void *a, *b, *c; int64_t rows, cols; uint64_t bytes; } cost_arg;

static void q_add(void *p) {
    cost_arg *c = p;
    ACL_CHECK(add(c->a, c->b, c->c, c->rows, c->cols));
}
static void q_copy(void *p) {
    cost_arg *c = p;
    ACL_CHECK(aclrtMemcpyAsync(c->c, c->bytes, c->a, c->bytes, ACL_MEMCPY_DEVICE_TO_DEVICE, g_stream));
}
static void q_memset(void *p) {
    cost_arg *c = p;
    ACL_CHECK(aclrtMemsetAsync(c->c, c->bytes, 7, c->bytes, g_stream));
}

/* Add over three 16 MiB operands: all host-mapped, then all HBM; a D2D copy
 * from a host handle into HBM; a memset of a host handle. */
static int case_cost(void) {
    const int64_t rows = 4096, cols = 1024;            /* 16 MiB per operand */
    const uint64_t bytes = (uint64_t)(rows * cols * 4);
    aclrtDrvMemHandle h;
    char *hm = host_mapped(3 * bytes, &h);
    void *a = hbm(bytes), *b = hbm(bytes), *c = hbm(bytes);
    cost_arg host = { hm, hm + bytes, hm + 2 * bytes, rows, cols, bytes };
    cost_arg dev = { a, b, c, rows, cols, bytes };
    printf("operand_bytes=%llu\n", (unsigned long long)bytes);
    printf("host_add_ns=%.0f\n", timed(q_add, &host));
    printf("hbm_add_ns=%.0f\n", timed(q_add, &dev));
    cost_arg cp = { hm, NULL, a, 0, 0, bytes };
    printf("host_to_hbm_copy_ns=%.0f\n", timed(q_copy, &cp));
    cost_arg cp2 = { b, NULL, a, 0, 0, bytes };
    printf("hbm_to_hbm_copy_ns=%.0f\n", timed(q_copy, &cp2));
    cost_arg ms = { NULL, NULL, hm, 0, 0, bytes };
    printf("host_memset_ns=%.0f\n", timed(q_memset, &ms));
    ACL_CHECK(aclrtFree(a));
    ACL_CHECK(aclrtFree(b));
    ACL_CHECK(aclrtFree(c));
    unmap_free(hm, h);
    return 0;
}

/* With ACLSIM_HBM_BYTES small: host handles of 4x HBM are mapped, used, and
 * HBM stays entirely free (aclrtGetMemInfo, then an allocation of all of it). */
static int case_capacity(void) {
    size_t free0 = 0, total = 0, free1 = 0, free2 = 0;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free0, &total));
    uint64_t hb = 4 * (uint64_t)total;
    aclrtDrvMemHandle h;
    char *va = host_mapped(hb, &h);
    ACL_CHECK(aclrtMemset(va + hb - 4096, 4096, 0x5a, 4096));
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total));
    void *all = NULL;
    aclError rc = aclrtMalloc(&all, free1 - 64, ACL_MEM_MALLOC_HUGE_FIRST);
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free2, &total));
    unsigned char last = 0;
    ACL_CHECK(aclrtMemcpy(&last, 1, va + hb - 1, 1, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("hbm_total=%zu\nhbm_free_before=%zu\nhbm_free_with_host_handles=%zu\nhost_handle_bytes=%llu\n", total,
           free0, free1, (unsigned long long)hb);
    printf("hbm_alloc_all_rc=%d\nhbm_free_after_alloc=%zu\nlast_byte=%d\n", (int)rc, free2, last);
    if (!rc) ACL_CHECK(aclrtFree(all));
    unmap_free(va, h);
    return 0;
}

static int case_errors(void) {
    aclrtPhysicalMemProp p = host_prop();
    aclrtDrvMemHandle h = NULL, h2 = NULL, hx = NULL;
    size_t g = 0;
    P("granularity_rc", aclrtMemGetAllocationGranularity(&p, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
    printf("granularity=%zu\n", g);

    aclrtPhysicalMemProp bad = p;
    bad.location.type = ACL_MEM_LOCATION_TYPE_UNREGISTERED;
    P("bad_location_unregistered", aclrtMallocPhysical(&hx, 2 * MIB, &bad, 0));
    bad.location.type = (aclrtMemLocationType)3;
    P("bad_location_3", aclrtMallocPhysical(&hx, 2 * MIB, &bad, 0));
    bad = p;
    bad.location.id = 4096;
    P("bad_numa_node", aclrtMallocPhysical(&hx, 2 * MIB, &bad, 0));
    bad = p;
    bad.memAttr = ACL_HBM_MEM_HUGE;
    P("hbm_attr_on_host", aclrtMallocPhysical(&hx, 2 * MIB, &bad, 0));
    bad.memAttr = ACL_MEM_HUGE1G;
    P("huge1g_on_host", aclrtMallocPhysical(&hx, 1024 * MIB, &bad, 0));
    bad.memAttr = ACL_HBM_MEM;
    P("unsupported_attr", aclrtMallocPhysical(&hx, 2 * MIB, &bad, 0));
    bad = dev_prop();
    bad.memAttr = ACL_DDR_MEM_HUGE;
    P("ddr_attr_on_device", aclrtMallocPhysical(&hx, 2 * MIB, &bad, 0));
    P("size_not_multiple", aclrtMallocPhysical(&hx, 3 * MIB, &p, 0));
    P("size_zero", aclrtMallocPhysical(&hx, 0, &p, 0));
    bad = p;
    bad.location.type = ACL_MEM_LOCATION_TYPE_HOST;
    bad.location.id = 77;                               /* ignored for HOST */
    P("host_location", aclrtMallocPhysical(&h2, 2 * MIB, &bad, 0));

    void *va = NULL;
    ACL_CHECK(aclrtReserveMemAddress(&va, 8 * MIB, 0, NULL, 0));
    char *v = va;
    ACL_CHECK(aclrtMallocPhysical(&h, 2 * MIB, &p, 0));
    P("map", aclrtMapMem(v, 2 * MIB, 0, h, 0));
    P("double_map_same_va", aclrtMapMem(v, 2 * MIB, 0, h2, 0));
    P("map_same_handle_twice", aclrtMapMem(v + 2 * MIB, 2 * MIB, 0, h, 0));
    P("map_unaligned", aclrtMapMem(v + 4096, 2 * MIB, 0, h2, 0));
    P("map_size_mismatch", aclrtMapMem(v + 4 * MIB, 4 * MIB, 0, h2, 0));
    P("free_while_mapped", aclrtFreePhysical(h));
    P("release_while_mapped", aclrtReleaseMemAddress(va));
    P("unmap_nothing", aclrtUnmapMem(v + 6 * MIB));
    P("unmap_interior", aclrtUnmapMem(v + 1 * MIB));
    P("unmap", aclrtUnmapMem(v));
    P("unmap_again", aclrtUnmapMem(v));
    P("unmap_second", aclrtUnmapMem(v + 2 * MIB));
    P("free", aclrtFreePhysical(h));
    P("map_freed_handle", aclrtMapMem(v, 2 * MIB, 0, h, 0));
    P("free_again", aclrtFreePhysical(h));
    P("free_h2", aclrtFreePhysical(h2));
    P("release", aclrtReleaseMemAddress(va));

    /* without a current device */
    ACL_CHECK(aclrtResetDevice(0));
    P("no_context", aclrtMallocPhysical(&hx, 2 * MIB, &p, 0));
    return 0;
}

/* [0, 2 MiB) host-mapped, [2, 4 MiB) never mapped: an operator over the
 * mapped part runs, one straddling the boundary or one past it faults. */
static int case_fault(void) {
    void *va = NULL;
    aclrtDrvMemHandle h;
    aclrtPhysicalMemProp p = host_prop();
    ACL_CHECK(aclrtReserveMemAddress(&va, 4 * MIB, 0, NULL, 0));
    ACL_CHECK(aclrtMallocPhysical(&h, 2 * MIB, &p, 0));
    ACL_CHECK(aclrtMapMem(va, 2 * MIB, 0, h, 0));
    char *v = va;
    const int64_t rows = 128, cols = 1024;             /* 512 KiB per operand */
    const uint64_t b = (uint64_t)(rows * cols * 4);
    ACL_CHECK(add(v, v + b, v + 2 * b, rows, cols));
    P("inside_sync", aclrtSynchronizeStream(g_stream));
    ACL_CHECK(add(v, v + b, v + 2 * MIB - b / 2, rows, cols));   /* output runs off the mapping */
    P("straddle_sync", aclrtSynchronizeStream(g_stream));
    ACL_CHECK(add(v + 2 * MIB, v, v + b, rows, cols));            /* input entirely unmapped */
    P("beyond_sync", aclrtSynchronizeStream(g_stream));
    P("memset_beyond", aclrtMemset(v + 2 * MIB, 4096, 0, 4096));
    P("memset_inside", aclrtMemset(v + 2 * MIB - 4096, 4096, 0, 4096));
    unmap_free(va, h);
    return 0;
}

/* One ApplyAdam step over P elements at var/m/v (grad and scalars in HBM). */
static void adam_step(void *var, void *m, void *v, void *grad, void *scal, int64_t P) {
    const int64_t vec[2] = { 1, P }, one[2] = { 1, 1 };
    const int64_t is[10][2] = { { vec[0], vec[1] }, { vec[0], vec[1] }, { vec[0], vec[1] }, { one[0], one[1] },
                                { one[0], one[1] }, { one[0], one[1] }, { one[0], one[1] }, { one[0], one[1] },
                                { one[0], one[1] }, { vec[0], vec[1] } };
    const int64_t os[3][2] = { { vec[0], vec[1] }, { vec[0], vec[1] }, { vec[0], vec[1] } };
    float *sc = scal;
    void *in[10] = { var, m, v, sc, sc + 1, sc + 2, sc + 3, sc + 4, sc + 5, grad };
    void *out[3] = { var, m, v };
    aclTensorDesc *id[10], *od[3];
    aclDataBuffer *ib[10], *ob[3];
    for (int i = 0; i < 10; i++) {
        id[i] = aclCreateTensorDesc(ACL_FLOAT, 2, is[i], ACL_FORMAT_ND);
        ib[i] = aclCreateDataBuffer(in[i], (size_t)(is[i][0] * is[i][1] * 4));
    }
    for (int j = 0; j < 3; j++) {
        od[j] = aclCreateTensorDesc(ACL_FLOAT, 2, os[j], ACL_FORMAT_ND);
        ob[j] = aclCreateDataBuffer(out[j], (size_t)(P * 4));
    }
    ACL_CHECK(aclopExecuteV2("ApplyAdam", 10, id, ib, 3, od, ob, NULL, g_stream));
    for (int i = 0; i < 10; i++) { aclDestroyTensorDesc(id[i]); aclDestroyDataBuffer(ib[i]); }
    for (int j = 0; j < 3; j++) { aclDestroyTensorDesc(od[j]); aclDestroyDataBuffer(ob[j]); }
}

/* Two Adam steps over P = 256Ki parameters: var/m/v all in HBM, then all in
 * one host handle; same grad. Prints both states' checksums and the time. */
static int case_adam(void) {
    const int64_t P = 256 * 1024;
    const uint64_t b = (uint64_t)P * 4;
    float *hv = rand_arr((size_t)P, 21), *hg = rand_arr((size_t)P, 22), *r1 = malloc(3 * b), *r2 = malloc(3 * b);
    const float scal[6] = { 0.9f, 0.999f, 1e-3f, 0.9f, 0.999f, 1e-8f };   /* b1^t, b2^t, lr, b1, b2, eps */
    void *grad = hbm(b), *sc = hbm(sizeof scal);
    put(grad, hg, (size_t)P);
    put(sc, scal, 6);
    char *d = hbm(3 * b);
    put(d, hv, (size_t)P);
    ACL_CHECK(aclrtMemset(d + b, 2 * b, 0, 2 * b));
    adam_step(d, d + b, d + 2 * b, grad, sc, P);
    adam_step(d, d + b, d + 2 * b, grad, sc, P);
    get(r1, d, (size_t)(3 * P));
    aclrtDrvMemHandle h;
    char *hm = host_mapped(4 * MIB, &h);
    put(hm, hv, (size_t)P);
    ACL_CHECK(aclrtMemset(hm + b, 2 * b, 0, 2 * b));
    aclrtEvent e0, e1;
    ACL_CHECK(aclrtCreateEvent(&e0));
    ACL_CHECK(aclrtCreateEvent(&e1));
    ACL_CHECK(aclrtRecordEvent(e0, g_stream));
    adam_step(hm, hm + b, hm + 2 * b, grad, sc, P);
    ACL_CHECK(aclrtRecordEvent(e1, g_stream));
    adam_step(hm, hm + b, hm + 2 * b, grad, sc, P);
    get(r2, hm, (size_t)(3 * P));
    float ms = 0;
    ACL_CHECK(aclrtEventElapsedTime(&ms, e0, e1));
    printf("adam_params=%lld\nadam_host_step_ns=%.0f\n", (long long)P, (double)ms * 1e6);
    printf("adam_hbm_checksum=%016llx\nadam_host_checksum=%016llx\nadam_equal=%d\n",
           (unsigned long long)app_fnv(APP_FNV_INIT, r1, 3 * b), (unsigned long long)app_fnv(APP_FNV_INIT, r2, 3 * b),
           memcmp(r1, r2, 3 * b) == 0);
    unmap_free(hm, h);
    return 0;
}

#define HCCL_CHECK(call) do {                                                              \
        HcclResult hr_ = (call);                                                           \
        if (hr_ != HCCL_SUCCESS) app_die(2, "%s failed with HCCL error %d", #call, (int)hr_); \
    } while (0)

/* In-place all-reduce of 512Ki floats held in a host handle on each of two
 * devices: the sum is right on both. */
static int case_collective(void) {
    const uint64_t n = 512 * 1024, b = n * 4;
    int32_t devs[2] = { 0, 1 };
    aclrtStream s[2];
    float *buf[2];
    aclrtDrvMemHandle h[2];
    float *in[2] = { rand_arr(n, 31), rand_arr(n, 32) }, *back = malloc(b);
    for (int d = 0; d < 2; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        ACL_CHECK(aclrtCreateStream(&s[d]));
        buf[d] = host_mapped(b, &h[d]);
        put(buf[d], in[d], n);
    }
    HcclComm comms[2];
    HCCL_CHECK(HcclCommInitAll(2, devs, comms));
    for (int d = 0; d < 2; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        HCCL_CHECK(HcclAllReduce(buf[d], buf[d], n, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comms[d], s[d]));
    }
    size_t bad = 0;
    for (int d = 0; d < 2; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        ACL_CHECK(aclrtSynchronizeStream(s[d]));
        ACL_CHECK(aclrtMemcpy(back, b, buf[d], b, ACL_MEMCPY_DEVICE_TO_HOST));
        for (uint64_t i = 0; i < n; i++)
            if (back[i] != in[0][i] + in[1][i]) bad++;
    }
    printf("allreduce_mismatches=%zu\n", bad);
    for (int d = 0; d < 2; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        HCCL_CHECK(HcclCommDestroy(comms[d]));
        unmap_free(buf[d], h[d]);
    }
    ACL_CHECK(aclrtSetDevice(0));
    return 0;
}

typedef struct { void *m, *out; int64_t rows, cols; uint64_t bytes; aclrtMemManagedLocation l; } mg_arg;
static void q_prefetch(void *p) {
    mg_arg *a = p;
    ACL_CHECK(aclrtMemManagedPrefetchAsync(a->m, a->bytes, a->l, 0, g_stream));
}
static void q_mg_add(void *p) {
    mg_arg *a = p;
    ACL_CHECK(add(a->m, a->m, a->out, a->rows, a->cols));
}

static int32_t attr_i(aclrtMemManagedRangeAttribute at, const void *p, uint64_t n) {
    int32_t v = -99;
    ACL_CHECK(aclrtMemManagedGetAttr(at, p, n, &v, sizeof v));
    return v;
}

static int case_managed(void) {
    const int64_t rows = 1024, cols = 2048;            /* 8 MiB */
    const size_t n = (size_t)(rows * cols);
    const uint64_t bytes = n * 4;
    const aclrtMemManagedLocation host = { ACL_MEM_LOCATIONTYPE_HOST, 0 }, dev0 = { ACL_MEM_LOCATIONTYPE_DEVICE, 0 };
    float *m = NULL, *ref = rand_arr(n, 11), *back = malloc(bytes);
    /* 8 MiB - 1: rounded up to 8 MiB */
    ACL_CHECK(aclrtMemAllocManaged((void **)&m, bytes - 1, ACL_RT_MEM_ATTACH_GLOBAL));
    printf("managed_ptr=%p\n", (void *)m);
    ACL_CHECK(aclrtMemManagedAdvise(m, bytes, ACL_MEM_ADVISE_SET_PREFERRED_LOCATION, host));
    printf("pref_type=%d pref=%d\n", attr_i(ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, m, bytes),
           attr_i(ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m, bytes));
    memcpy(m, ref, bytes);                             /* the host writes it directly */
    void *out = hbm(bytes);
    mg_arg a = { m, out, rows, cols, bytes, dev0 };
    printf("prefetch_to_device_ns=%.0f\n", timed(q_prefetch, &a));
    printf("last_prefetch_type=%d last_prefetch=%d\n",
           attr_i(ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE, m, bytes),
           attr_i(ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, bytes));
    printf("resident_add_ns=%.0f\n", timed(q_mg_add, &a));
    get(back, out, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (back[i] != ref[i] + ref[i]) bad++;
    printf("device_result_mismatches=%zu\n", bad);
    /* the device writes it (in place: m = m + m), the host reads it after a prefetch home */
    ACL_CHECK(add(m, m, m, rows, cols));
    a.l = host;
    printf("prefetch_to_host_ns=%.0f\n", timed(q_prefetch, &a));
    bad = 0;
    for (size_t i = 0; i < n; i++)
        if (m[i] != ref[i] + ref[i]) bad++;
    printf("host_read_mismatches=%zu\n", bad);
    printf("prefetch_again_ns=%.0f\n", timed(q_prefetch, &a));   /* already there: nothing moves */
    /* touched by the device without a prefetch: its pages migrate first */
    printf("migrating_add_ns=%.0f\n", timed(q_mg_add, &a));
    printf("hbm_add_ns=%.0f\n", timed(q_mg_add, &(mg_arg){ out, out, rows, cols, bytes, dev0 }));
    /* accessed-by: home on the host, read by the device in place over the link */
    float *r = NULL;
    ACL_CHECK(aclrtMemAllocManaged((void **)&r, bytes, ACL_RT_MEM_ATTACH_GLOBAL));
    ACL_CHECK(aclrtMemManagedAdvise(r, bytes, ACL_MEM_ADVISE_SET_PREFERRED_LOCATION, host));
    ACL_CHECK(aclrtMemManagedAdvise(r, bytes, ACL_MEM_ADVISE_SET_ACCESSED_BY, dev0));
    int32_t acc[3] = { 0, 0, 0 };
    ACL_CHECK(aclrtMemManagedGetAttr(ACL_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, r, bytes, acc, sizeof acc));
    printf("accessed_by=%d,%d,%d\n", acc[0], acc[1], acc[2]);
    memcpy(r, ref, bytes);
    printf("remote_add_ns=%.0f\n", timed(q_mg_add, &(mg_arg){ r, out, rows, cols, bytes, dev0 }));
    get(back, out, n);
    bad = 0;
    for (size_t i = 0; i < n; i++)
        if (back[i] != ref[i] + ref[i]) bad++;
    printf("remote_result_mismatches=%zu\n", bad);
    /* read-mostly */
    ACL_CHECK(aclrtMemManagedAdvise(r, bytes, ACL_MEM_ADVISE_SET_READ_MOSTLY, host));
    printf("read_mostly=%d\n", attr_i(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, r, bytes));
    ACL_CHECK(aclrtMemManagedAdvise(r, bytes, ACL_MEM_ADVISE_UNSET_READ_MOSTLY,
                                    (aclrtMemManagedLocation){ ACL_MEM_LOCATIONTYPE_INVALID, 0 }));
    printf("read_mostly_after_unset=%d\n", attr_i(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, r, bytes));
    /* several attributes at once */
    aclrtMemManagedRangeAttribute ats[2] = { ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE,
                                             ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY };
    int32_t v0 = -9, v1 = -9;
    void *data[2] = { &v0, &v1 };
    size_t sizes[2] = { 4, 4 };
    ACL_CHECK(aclrtMemManagedGetAttrs(ats, 2, r, bytes, data, sizes));
    printf("attrs=%d,%d\n", v0, v1);
    /* batch prefetch: both buffers to the device */
    const void *ptrs[2] = { m, r };
    size_t bsz[2] = { bytes, bytes }, idx[1] = { 0 };
    aclrtMemManagedLocation locs[1] = { dev0 };
    ACL_CHECK(aclrtMemManagedPrefetchBatchAsync(ptrs, bsz, 2, locs, idx, 1, 0, g_stream));
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    printf("batch_last_prefetch=%d\n", attr_i(ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE, r, bytes));
    /* memset and copies work on managed memory */
    ACL_CHECK(aclrtMemset(r, bytes, 0, bytes));
    ACL_CHECK(aclrtMemcpy(r, bytes, ref, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtMemcpy(back, bytes, r, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("copy_roundtrip_equal=%d\n", memcmp(back, ref, bytes) == 0);
    ACL_CHECK(aclrtFree(m));
    ACL_CHECK(aclrtFree(r));
    /* use after free is a device MMU fault */
    ACL_CHECK(add(r, r, out, rows, cols));
    P("use_after_free_sync", aclrtSynchronizeStream(g_stream));
    ACL_CHECK(aclrtFree(out));
    free(ref);
    free(back);
    return 0;
}

static int case_managed_errors(void) {
    void *m = NULL, *d = hbm(2 * MIB), *x = NULL;
    const aclrtMemManagedLocation dev0 = { ACL_MEM_LOCATIONTYPE_DEVICE, 0 };
    int32_t v = 0;
    ACL_CHECK(aclrtMemAllocManaged(&m, 4 * MIB, ACL_RT_MEM_ATTACH_GLOBAL));
    P("alloc_null", aclrtMemAllocManaged(NULL, 4 * MIB, ACL_RT_MEM_ATTACH_GLOBAL));
    P("alloc_flag0", aclrtMemAllocManaged(&x, 4 * MIB, 0));
    P("alloc_size0", aclrtMemAllocManaged(&x, 0, ACL_RT_MEM_ATTACH_GLOBAL));
    P("alloc_too_big", aclrtMemAllocManaged(&x, 4ULL << 40, ACL_RT_MEM_ATTACH_GLOBAL));
    P("advise_null", aclrtMemManagedAdvise(NULL, 2 * MIB, ACL_MEM_ADVISE_SET_ACCESSED_BY, dev0));
    P("advise_size0", aclrtMemManagedAdvise(m, 0, ACL_MEM_ADVISE_SET_ACCESSED_BY, dev0));
    P("advise_bad_type", aclrtMemManagedAdvise(m, 2 * MIB, (aclrtMemManagedAdviseType)6, dev0));
    P("advise_bad_device", aclrtMemManagedAdvise(m, 2 * MIB, ACL_MEM_ADVISE_SET_ACCESSED_BY,
                                                 (aclrtMemManagedLocation){ ACL_MEM_LOCATIONTYPE_DEVICE, 7 }));
    P("advise_bad_location", aclrtMemManagedAdvise(m, 2 * MIB, ACL_MEM_ADVISE_SET_ACCESSED_BY,
                                                   (aclrtMemManagedLocation){ ACL_MEM_LOCATIONTYPE_INVALID, 0 }));
    P("advise_unaligned_size", aclrtMemManagedAdvise(m, 1 * MIB, ACL_MEM_ADVISE_SET_ACCESSED_BY, dev0));
    P("advise_device_memory", aclrtMemManagedAdvise(d, 2 * MIB, ACL_MEM_ADVISE_SET_ACCESSED_BY, dev0));
    P("advise_past_end", aclrtMemManagedAdvise(m, 6 * MIB, ACL_MEM_ADVISE_SET_ACCESSED_BY, dev0));
    /* a page the device holds cannot prefer the host without read-mostly (docs) */
    ACL_CHECK(aclrtMemManagedPrefetchAsync(m, 2 * MIB, dev0, 0, g_stream));
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    P("prefer_host_when_on_device", aclrtMemManagedAdvise(m, 2 * MIB, ACL_MEM_ADVISE_SET_PREFERRED_LOCATION,
                                                          (aclrtMemManagedLocation){ ACL_MEM_LOCATIONTYPE_HOST, 0 }));
    P("prefer_device_when_on_device", aclrtMemManagedAdvise(m, 2 * MIB, ACL_MEM_ADVISE_SET_PREFERRED_LOCATION, dev0));
    P("prefetch_null", aclrtMemManagedPrefetchAsync(NULL, 2 * MIB, dev0, 0, g_stream));
    P("prefetch_size0", aclrtMemManagedPrefetchAsync(m, 0, dev0, 0, g_stream));
    P("prefetch_flags", aclrtMemManagedPrefetchAsync(m, 2 * MIB, dev0, 1, g_stream));
    P("prefetch_bad_location", aclrtMemManagedPrefetchAsync(m, 2 * MIB,
                                                            (aclrtMemManagedLocation){ ACL_MEM_LOCATIONTYPE_INVALID, 0 },
                                                            0, g_stream));
    P("prefetch_bad_device", aclrtMemManagedPrefetchAsync(m, 2 * MIB,
                                                          (aclrtMemManagedLocation){ ACL_MEM_LOCATIONTYPE_DEVICE, 9 },
                                                          0, g_stream));
    P("prefetch_unaligned_size", aclrtMemManagedPrefetchAsync(m, 1 * MIB, dev0, 0, g_stream));
    P("prefetch_device_memory", aclrtMemManagedPrefetchAsync(d, 2 * MIB, dev0, 0, g_stream));
    P("prefetch_bad_stream", aclrtMemManagedPrefetchAsync(m, 2 * MIB, dev0, 0, (aclrtStream)&v));
    P("getattr_null_data", aclrtMemManagedGetAttr(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, 2 * MIB, NULL, 4));
    P("getattr_bad_attr", aclrtMemManagedGetAttr((aclrtMemManagedRangeAttribute)0, m, 2 * MIB, &v, 4));
    P("getattr_bad_size", aclrtMemManagedGetAttr(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, 2 * MIB, &v, 8));
    P("getattr_device_memory", aclrtMemManagedGetAttr(ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, d, 2 * MIB, &v, 4));
    size_t sz = 2 * MIB, idx_bad[1] = { 1 };
    const void *ptrs[1] = { m };
    aclrtMemManagedLocation locs[1] = { dev0 };
    P("batch_idx0", aclrtMemManagedPrefetchBatchAsync(ptrs, &sz, 1, locs, idx_bad, 1, 0, g_stream));
    P("free_interior", aclrtFree((char *)m + 2 * MIB));
    P("free", aclrtFree(m));
    P("free_again", aclrtFree(m));
    P("advise_freed", aclrtMemManagedAdvise(m, 2 * MIB, ACL_MEM_ADVISE_SET_ACCESSED_BY, dev0));
    ACL_CHECK(aclrtFree(d));
    ACL_CHECK(aclrtResetDevice(0));
    P("alloc_no_context", aclrtMemAllocManaged(&x, 4 * MIB, ACL_RT_MEM_ATTACH_GLOBAL));
    return 0;
}

int main(int argc, char **argv) {
    const char *which = "roundtrip";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--case"))) which = v;
        else app_die(3, "unknown argument %s", argv[i]);
    }
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtCreateStream(&g_stream));
    int rc;
    if (!strcmp(which, "roundtrip")) rc = case_roundtrip();
    else if (!strcmp(which, "mixed")) rc = case_mixed();
    else if (!strcmp(which, "cost")) rc = case_cost();
    else if (!strcmp(which, "capacity")) rc = case_capacity();
    else if (!strcmp(which, "errors")) rc = case_errors();
    else if (!strcmp(which, "fault")) rc = case_fault();
    else if (!strcmp(which, "adam")) rc = case_adam();
    else if (!strcmp(which, "collective")) rc = case_collective();
    else if (!strcmp(which, "managed")) rc = case_managed();
    else if (!strcmp(which, "managed_errors")) rc = case_managed_errors();
    else app_die(3, "unknown case %s", which);
    ACL_CHECK(aclFinalize());
    return rc;
}
