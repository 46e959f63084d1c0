/* tier_probe: small scenarios for the tiering engine, each checking its
 * own data (FNV-1a of what it wrote vs what it reads back).
 *
 *   --scenario prefetch --bytes S --idle-ms T
 *       B (S bytes) is written, then A (S bytes) is written (with S above half
 *       of HBM, u3m evicts part of B), A is freed, the program idles T ms,
 *       then reads B back. Prints "b_ok=<0|1>".
 *   --scenario lose --buffers K --bytes S --touches R   (ACLSIM_DEVICES=2)
 *       K buffers on device 1 are written, then R small writes go to the
 *       last one (a card failure injected with ACLSIM_FAULTS=lose:1@N lands
 *       among them), then every buffer is read back; device 0 holds a buffer
 *       of its own throughout. Prints "buf=<i> rc=<code> ok=<0|1>" per
 *       buffer, "readable=<n> lost=<n> touch_errors=<n> dev0_ok=<0|1>".
 *   --scenario export --bytes S
 *       a 20 MiB physical handle is mapped and written, S bytes of other
 *       memory are written (pressure), the handle is exported for IPC (the
 *       simulator refuses IPC: rc printed), more pressure, then the handle's
 *       data is read back through its mapping and through a second mapping.
 *       Prints "export_rc=<code> h_ok=<0|1> remap_ok=<0|1>".
 *   --scenario refused --bytes S
 *       A (S bytes) is written, then B and C (S bytes each: pressure that
 *       evicts A), then an operator the runtime refuses (an unknown op type
 *       over FLOAT input) is launched with A as its output, described as a
 *       contiguous ND tensor of all of A's bytes (so u3m may skip A's
 *       copy-in: the op would write it whole), then A is read back.
 *       Prints "op_rc=<code> a_ok=<0|1>": a refused op writes nothing.
 * Exit 0 when the scenario ran to its end (whatever it found), 2 on an ACL
 * error outside the expected ones, 3 on bad usage. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "acl/acl.h"
#include "acl/acl_op_compiler.h"
#include "common/common.h"

static void fill(unsigned char *h, uint64_t n, uint64_t seed) {
    uint64_t st = seed;
    for (uint64_t i = 0; i < n; i += 8) {
        uint64_t v = app_rand_u64(&st);
        memcpy(h + i, &v, n - i < 8 ? n - i : 8);
    }
}

static int same(const unsigned char *a, const unsigned char *b, uint64_t n) {
    return app_fnv(0, a, n) == app_fnv(0, b, n) && memcmp(a, b, n) == 0;
}

static void idle_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int prefetch(uint64_t bytes, long idle) {
    unsigned char *hb = malloc(bytes), *ha = malloc(bytes), *back = malloc(bytes);
    if (!hb || !ha || !back) app_die(2, "out of host memory");
    fill(hb, bytes, 1);
    fill(ha, bytes, 2);
    void *a = NULL, *b = NULL;
    ACL_CHECK(aclrtMalloc(&b, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemcpy(b, bytes, hb, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtMalloc(&a, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemcpy(a, bytes, ha, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtFree(a));
    idle_ms(idle);
    ACL_CHECK(aclrtMemcpy(back, bytes, b, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("b_ok=%d\n", same(back, hb, bytes));
    ACL_CHECK(aclrtFree(b));
    free(hb);
    free(ha);
    free(back);
    return 0;
}

static int lose(int k, uint64_t bytes, int touches) {
    unsigned char *want = malloc(bytes), *back = malloc(bytes);
    void **buf = calloc((size_t)k, sizeof(void *));
    if (!want || !back || !buf) app_die(2, "out of host memory");
    /* device 0: a buffer that must survive device 1's failure */
    void *d0 = NULL;
    uint64_t n0 = 4u << 20;
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtMalloc(&d0, n0, ACL_MEM_MALLOC_HUGE_FIRST));
    fill(want, n0, 99);
    ACL_CHECK(aclrtMemcpy(d0, n0, want, n0, ACL_MEMCPY_HOST_TO_DEVICE));

    ACL_CHECK(aclrtSetDevice(1));
    for (int i = 0; i < k; i++) {
        ACL_CHECK(aclrtMalloc(&buf[i], bytes, ACL_MEM_MALLOC_HUGE_FIRST));
        fill(want, bytes, 1000 + (uint64_t)i);
        ACL_CHECK(aclrtMemcpy(buf[i], bytes, want, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    }
    /* small rewrites of the last buffer with the same bytes: its data stays
     * what `want` says, and it stays dirty in HBM */
    fill(want, bytes, 1000 + (uint64_t)(k - 1));
    int touch_errors = 0;
    for (int t = 0; t < touches; t++) {
        uint64_t off = ((uint64_t)t * 4096) % bytes;
        if (aclrtMemcpy((char *)buf[k - 1] + off, 4096, want + off, 4096, ACL_MEMCPY_HOST_TO_DEVICE) != ACL_SUCCESS) touch_errors++;
    }
    int readable = 0, lost = 0;
    for (int i = 0; i < k; i++) {
        fill(want, bytes, 1000 + (uint64_t)i);
        memset(back, 0xa5, bytes);
        aclError rc = aclrtMemcpy(back, bytes, buf[i], bytes, ACL_MEMCPY_DEVICE_TO_HOST);
        int ok = rc == ACL_SUCCESS && same(back, want, bytes);
        printf("buf=%d rc=%d ok=%d\n", i, (int)rc, ok);
        if (rc == ACL_SUCCESS && !ok) app_die(2, "buffer %d read back wrong data", i);
        if (ok) readable++; else lost++;
    }
    ACL_CHECK(aclrtSetDevice(0));
    fill(want, n0, 99);
    ACL_CHECK(aclrtMemcpy(back, n0, d0, n0, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("readable=%d lost=%d touch_errors=%d dev0_ok=%d\n", readable, lost, touch_errors, same(back, want, n0));
    ACL_CHECK(aclrtFree(d0));
    free(want);
    free(back);
    free(buf);
    return 0;
}

static int export_scenario(uint64_t bytes) {
    const uint64_t hn = 20u << 20;
    unsigned char *want = malloc(hn), *back = malloc(hn), *junk = malloc(bytes);
    if (!want || !back || !junk) app_die(2, "out of host memory");
    fill(want, hn, 7);
    fill(junk, bytes, 8);
    aclrtPhysicalMemProp prop = {0};
    prop.handleType = ACL_MEM_HANDLE_TYPE_NONE;
    prop.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
    prop.memAttr = ACL_HBM_MEM_HUGE;
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    aclrtDrvMemHandle h = NULL;
    void *va = NULL, *va2 = NULL, *p1 = NULL, *p2 = NULL;
    ACL_CHECK(aclrtMallocPhysical(&h, hn, &prop, 0));
    ACL_CHECK(aclrtReserveMemAddress(&va, hn, 0, NULL, 0));
    ACL_CHECK(aclrtMapMem(va, hn, 0, h, 0));
    ACL_CHECK(aclrtMemcpy(va, hn, want, hn, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtMalloc(&p1, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemcpy(p1, bytes, junk, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    uint64_t share = 0;
    aclError erc = aclrtMemExportToShareableHandle(h, ACL_MEM_HANDLE_TYPE_NONE, 0, &share);
    ACL_CHECK(aclrtMalloc(&p2, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemcpy(p2, bytes, junk, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtMemcpy(back, hn, va, hn, ACL_MEMCPY_DEVICE_TO_HOST));
    int h_ok = same(back, want, hn);
    ACL_CHECK(aclrtUnmapMem(va));
    ACL_CHECK(aclrtReserveMemAddress(&va2, hn, 0, NULL, 0));
    ACL_CHECK(aclrtMapMem(va2, hn, 0, h, 0));
    memset(back, 0, hn);
    ACL_CHECK(aclrtMemcpy(back, hn, va2, hn, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("export_rc=%d h_ok=%d remap_ok=%d\n", (int)erc, h_ok, same(back, want, hn));
    ACL_CHECK(aclrtUnmapMem(va2));
    ACL_CHECK(aclrtFreePhysical(h));
    ACL_CHECK(aclrtReleaseMemAddress(va));
    ACL_CHECK(aclrtReleaseMemAddress(va2));
    ACL_CHECK(aclrtFree(p1));
    ACL_CHECK(aclrtFree(p2));
    free(want);
    free(back);
    free(junk);
    return 0;
}

static int refused(uint64_t bytes) {
    unsigned char *want = malloc(bytes), *junk = malloc(bytes), *back = malloc(bytes);
    if (!want || !junk || !back) app_die(2, "out of host memory");
    fill(want, bytes, 11);
    fill(junk, bytes, 12);
    void *a = NULL, *b = NULL, *c = NULL, *in = NULL;
    ACL_CHECK(aclrtMalloc(&a, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemcpy(a, bytes, want, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtMalloc(&b, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemcpy(b, bytes, junk, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtMalloc(&c, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemcpy(c, bytes, junk, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtMalloc(&in, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemset(in, 4096, 0, 4096));
    aclrtStream st = NULL;
    ACL_CHECK(aclrtCreateStream(&st));
    int64_t din[1] = {1024}, dout[1] = {(int64_t)bytes};
    aclTensorDesc *id = aclCreateTensorDesc(ACL_FLOAT, 1, din, ACL_FORMAT_ND);
    aclTensorDesc *od = aclCreateTensorDesc(ACL_UINT8, 1, dout, ACL_FORMAT_ND);
    aclDataBuffer *ib = aclCreateDataBuffer(in, 4096), *ob = aclCreateDataBuffer(a, bytes);
    aclopAttr *attr = aclopCreateAttr();
    if (!id || !od || !ib || !ob || !attr) app_die(2, "could not describe the operator");
    aclError orc = aclopExecuteV2("U3mNoSuchOp", 1, &id, &ib, 1, &od, &ob, attr, st);
    aclError src = aclrtSynchronizeStream(st);
    memset(back, 0x5a, bytes);
    ACL_CHECK(aclrtMemcpy(back, bytes, a, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("op_rc=%d sync_rc=%d a_ok=%d\n", (int)orc, (int)src, same(back, want, bytes));
    aclopDestroyAttr(attr);
    aclDestroyDataBuffer(ib);
    aclDestroyDataBuffer(ob);
    aclDestroyTensorDesc(id);
    aclDestroyTensorDesc(od);
    ACL_CHECK(aclrtDestroyStream(st));
    ACL_CHECK(aclrtFree(in));
    ACL_CHECK(aclrtFree(c));
    ACL_CHECK(aclrtFree(b));
    ACL_CHECK(aclrtFree(a));
    free(want);
    free(junk);
    free(back);
    return 0;
}

int main(int argc, char **argv) {
    const char *scenario = NULL;
    uint64_t bytes = 32u << 20;
    long idle = 200, k = 4, touches = 100;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--scenario"))) scenario = v;
        else if ((v = app_opt(argc, argv, &i, "--bytes"))) bytes = app_parse_size(v, "--bytes");
        else if ((v = app_opt(argc, argv, &i, "--idle-ms"))) idle = (long)app_parse_int(v, "--idle-ms");
        else if ((v = app_opt(argc, argv, &i, "--buffers"))) k = (long)app_parse_int(v, "--buffers");
        else if ((v = app_opt(argc, argv, &i, "--touches"))) touches = (long)app_parse_int(v, "--touches");
        else app_die(3, "usage: tier_probe --scenario prefetch|lose|export|refused [--bytes S] [--idle-ms T] [--buffers K] [--touches R]");
    }
    if (!scenario || bytes < 8192 || k < 1 || touches < 0 || idle < 0) app_die(3, "usage: tier_probe --scenario prefetch|lose|export|refused [--bytes S] [--idle-ms T] [--buffers K] [--touches R]");
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    int rc;
    if (!strcmp(scenario, "prefetch")) rc = prefetch(bytes, idle);
    else if (!strcmp(scenario, "lose")) rc = lose((int)k, bytes, (int)touches);
    else if (!strcmp(scenario, "export")) rc = export_scenario(bytes);
    else if (!strcmp(scenario, "refused")) rc = refused(bytes);
    else app_die(3, "unknown scenario '%s'", scenario);
    /* a lost device makes its reset fail: finalize regardless */
    aclFinalize();
    return rc;
}
