/* optest_llm: the aclnn entry points of LLM workloads that torch_npu 2.14
 * reaches only in compatibility modes (GELU V2 with its approximate argument,
 * the V1 foreach operators with a device scalar), FlashAttentionScore called
 * directly, and the refusals: prints inputs, results and return codes for
 * tests/sim_ops.rs, which computes the references. Prototypes as op-plugin
 * calls them (the CANN aclnnop pages); they are not in shim/include.
 *
 *   optest_llm gelu | foreach_v1 | attention | refusals
 *   optest_llm empty_launch MIB   (MIB of live tensors, then an operator on an
 *                                  empty tensor: under libu3m.so in tier mode
 *                                  with less HBM, see tests/tier_aclnn.rs)
 *   optest_llm queued_launch MIB  (MIB of live tensors, then an operator
 *                                  built here and launched on another thread,
 *                                  as torch_npu's task queue does: the same)
 *   optest_llm view_write OFF N   (a view of N floats at element OFF of a
 *                                  16 MiB buffer zeroed: tests/aclnn_roles.rs)
 *   optest_llm wide_launch N OTHER (one foreach operator over N + N tensors of
 *                                  2 MiB each after OTHER MiB of other data:
 *                                  the same, tests/tier_aclnn.rs)
 *   optest_llm out_write contig|strided (aclnnAbs into 8 MiB outputs holding
 *                                  a pattern, whole or every other float:
 *                                  a hash of every output byte, the same)
 *
 * Arrays print as name=v0,v1,... with %.9g. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "common/common.h"

#define WS uint64_t *workspaceSize, aclOpExecutor **executor
#define EXEC(name) aclnnStatus name(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream)

aclnnStatus aclnnGeluV2GetWorkspaceSize(const aclTensor *self, int64_t approximate, aclTensor *out, WS);
EXEC(aclnnGeluV2);
aclnnStatus aclnnGeluBackwardV2GetWorkspaceSize(const aclTensor *gradOutput, const aclTensor *self, char *approximate,
    aclTensor *gradInput, WS);
EXEC(aclnnGeluBackwardV2);
aclnnStatus aclnnForeachAddScalarGetWorkspaceSize(const aclTensorList *x, const aclTensor *scalar, aclTensorList *out, WS);
EXEC(aclnnForeachAddScalar);
aclnnStatus aclnnForeachSubScalarGetWorkspaceSize(const aclTensorList *x, const aclTensor *scalar, aclTensorList *out, WS);
EXEC(aclnnForeachSubScalar);
aclnnStatus aclnnForeachMulScalarGetWorkspaceSize(const aclTensorList *x, const aclTensor *scalar, aclTensorList *out, WS);
EXEC(aclnnForeachMulScalar);
aclnnStatus aclnnForeachDivScalarGetWorkspaceSize(const aclTensorList *x, const aclTensor *scalar, aclTensorList *out, WS);
EXEC(aclnnForeachDivScalar);
aclnnStatus aclnnForeachAddListGetWorkspaceSize(const aclTensorList *x1, const aclTensorList *x2, const aclTensor *alpha,
    aclTensorList *out, WS);
EXEC(aclnnForeachAddList);
aclnnStatus aclnnForeachAddcdivScalarGetWorkspaceSize(const aclTensorList *x1, const aclTensorList *x2,
    const aclTensorList *x3, const aclTensor *scalar, aclTensorList *out, WS);
EXEC(aclnnForeachAddcdivScalar);
aclnnStatus aclnnForeachAddcmulScalarGetWorkspaceSize(const aclTensorList *x1, const aclTensorList *x2,
    const aclTensorList *x3, const aclTensor *scalar, aclTensorList *out, WS);
EXEC(aclnnForeachAddcmulScalar);
aclnnStatus aclnnFlashAttentionScoreGetWorkspaceSize(const aclTensor *query, const aclTensor *key, const aclTensor *value,
    const aclTensor *realShiftOptional, const aclTensor *dropMaskOptional, const aclTensor *paddingMaskOptional,
    const aclTensor *attenMaskOptional, const aclIntArray *prefixOptional, double scaleValue, double keepProb,
    int64_t preTokens, int64_t nextTokens, int64_t headNum, char *inputLayout, int64_t innerPrecise, int64_t sparseMode,
    const aclTensor *softmaxMaxOut, const aclTensor *softmaxSumOut, const aclTensor *softmaxOutOut,
    const aclTensor *attentionOutOut, WS);
EXEC(aclnnFlashAttentionScore);
aclnnStatus aclnnSiluGetWorkspaceSize(const aclTensor *self, aclTensor *out, WS);
aclnnStatus aclnnInplaceZeroGetWorkspaceSize(aclTensor *selfRef, WS);
EXEC(aclnnInplaceZero);

static aclrtStream g_stream;
static uint64_t g_seed = 4242;

/* device copy of h (NULL h: uninitialised device memory) */
static void *upload(const void *h, size_t bytes)
{
    void *d = NULL;
    ACL_CHECK(aclrtMalloc(&d, bytes ? bytes : 4, ACL_MEM_MALLOC_HUGE_FIRST));
    if (bytes && h) ACL_CHECK(aclrtMemcpy(d, bytes, h, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    return d;
}

static void download(void *h, const void *d, size_t bytes)
{
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    ACL_CHECK(aclrtMemcpy(h, bytes, d, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
}

static float *rand_arr(size_t n, float scale)
{
    float *a = malloc(n * 4);
    for (size_t i = 0; i < n; i++) a[i] = app_rand_f32(&g_seed, scale);
    return a;
}

static void print_arr(const char *name, const float *a, size_t n)
{
    printf("%s=", name);
    for (size_t i = 0; i < n; i++) printf("%s%.9g", i ? "," : "", a[i]);
    printf("\n");
}

/* contiguous tensor of `dt` over device data */
static aclTensor *tensor(const int64_t *dims, int nd, aclDataType dt, void *data)
{
    int64_t st[8], n = 1;
    for (int i = nd - 1; i >= 0; i--) { st[i] = n; n *= dims[i]; }
    return aclCreateTensor(dims, (uint64_t)nd, dt, st, 0, ACL_FORMAT_ND, &n, 1, data);
}

static aclTensor *ftensor(const int64_t *dims, int nd, const float *h)
{
    size_t n = 1;
    for (int i = 0; i < nd; i++) n *= (size_t)dims[i];
    return tensor(dims, nd, ACL_FLOAT, upload(h, n * 4));
}

#define RUN(op, ...) do {                                                          \
        uint64_t ws_ = 0;                                                          \
        aclOpExecutor *ex_ = NULL;                                                 \
        ACL_CHECK(op##GetWorkspaceSize(__VA_ARGS__, &ws_, &ex_));                  \
        ACL_CHECK(op(NULL, ws_, ex_, g_stream));                                   \
    } while (0)

static void fetch(const char *name, const aclTensor *t, void *dev, size_t n)
{
    (void)t;
    float *h = malloc(n * 4);
    download(h, dev, n * 4);
    print_arr(name, h, n);
    free(h);
}

static void case_gelu(void)
{
    enum { N = 16 };
    float *x = rand_arr(N, 3.0f), *dy = rand_arr(N, 1.0f);
    int64_t d[1] = { N };
    aclTensor *tx = ftensor(d, 1, x), *tdy = ftensor(d, 1, dy);
    void *o[4];
    aclTensor *to[4];
    for (int i = 0; i < 4; i++) { o[i] = upload(NULL, N * 4); to[i] = tensor(d, 1, ACL_FLOAT, o[i]); }
    RUN(aclnnGeluV2, tx, 0, to[0]);
    RUN(aclnnGeluV2, tx, 1, to[1]);
    RUN(aclnnGeluBackwardV2, tdy, tx, "none", to[2]);
    RUN(aclnnGeluBackwardV2, tdy, tx, "tanh", to[3]);
    print_arr("x", x, N);
    print_arr("dy", dy, N);
    fetch("gelu_none", to[0], o[0], N);
    fetch("gelu_tanh", to[1], o[1], N);
    fetch("grad_none", to[2], o[2], N);
    fetch("grad_tanh", to[3], o[3], N);
    uint64_t ws;
    aclOpExecutor *ex;
    printf("approximate_2=%d\n", (int)aclnnGeluV2GetWorkspaceSize(tx, 2, to[0], &ws, &ex));
    printf("approximate_bad=%d\n", (int)aclnnGeluBackwardV2GetWorkspaceSize(tdy, tx, "erf", to[2], &ws, &ex));
}

/* two-element lists of f32 tensors (5 and 3 elements) */
static aclTensorList *list2(const float *a, const float *b, void **dev)
{
    int64_t d5[1] = { 5 }, d3[1] = { 3 };
    dev[0] = upload(a, 20);
    dev[1] = upload(b, 12);
    const aclTensor *t[2] = { tensor(d5, 1, ACL_FLOAT, dev[0]), tensor(d3, 1, ACL_FLOAT, dev[1]) };
    return aclCreateTensorList(t, 2);
}

static void case_foreach_v1(void)
{
    float *x1 = rand_arr(8, 1.0f), *x2 = rand_arr(8, 1.0f), *x3 = rand_arr(8, 1.0f), s = 0.75f;
    for (int i = 0; i < 8; i++) x3[i] = x3[i] > 0 ? x3[i] + 0.5f : x3[i] - 0.5f;   /* away from 0: a divisor */
    print_arr("x1", x1, 8);
    print_arr("x2", x2, 8);
    print_arr("x3", x3, 8);
    int64_t d1[1] = { 1 };
    aclTensor *ts = tensor(d1, 1, ACL_FLOAT, upload(&s, 4));
    void *dv[2], *ov[2], *d2[2], *d3[2];
    static const char *const names[] = { "add_scalar", "sub_scalar", "mul_scalar", "div_scalar", "add_list",
        "addcdiv_scalar", "addcmul_scalar" };
    for (int op = 0; op < 7; op++) {
        aclTensorList *l1 = list2(x1, x1 + 5, dv), *out = list2(x1, x1 + 5, ov);   /* out starts as a copy */
        aclTensorList *l2 = list2(x2, x2 + 5, d2), *l3 = list2(x3, x3 + 5, d3);
        switch (op) {
        case 0: RUN(aclnnForeachAddScalar, l1, ts, out); break;
        case 1: RUN(aclnnForeachSubScalar, l1, ts, out); break;
        case 2: RUN(aclnnForeachMulScalar, l1, ts, out); break;
        case 3: RUN(aclnnForeachDivScalar, l1, ts, out); break;
        case 4: RUN(aclnnForeachAddList, l1, l2, ts, out); break;
        case 5: RUN(aclnnForeachAddcdivScalar, l1, l2, l3, ts, out); break;
        default: RUN(aclnnForeachAddcmulScalar, l1, l2, l3, ts, out); break;
        }
        float r[8];
        download(r, ov[0], 20);
        download(r + 5, ov[1], 12);
        print_arr(names[op], r, 8);
    }
}

/* FlashAttentionScore, BNSD, B=1, N1=4, N2=2 (grouped-query), S1=3, S2=5,
 * D=4, causal from the bottom right (sparse mode 3, compressed mask) */
static void case_attention(void)
{
    enum { B = 1, N1 = 4, N2 = 2, S1 = 3, S2 = 5, D = 4 };
    float *q = rand_arr(B * N1 * S1 * D, 1.0f), *k = rand_arr(B * N2 * S2 * D, 1.0f), *v = rand_arr(B * N2 * S2 * D, 1.0f);
    int64_t dq[4] = { B, N1, S1, D }, dk[4] = { B, N2, S2, D }, dst[4] = { B, N1, S1, 8 }, dm[2] = { 2048, 2048 };
    aclTensor *tq = ftensor(dq, 4, q), *tk = ftensor(dk, 4, k), *tv = ftensor(dk, 4, v);
    unsigned char *mask = calloc(2048 * 2048, 1);
    for (int i = 0; i < 2048; i++) for (int j = i + 1; j < 2048; j++) mask[i * 2048 + j] = 1;
    aclTensor *tm = tensor(dm, 2, ACL_BOOL, upload(mask, 2048 * 2048));
    void *omx = upload(NULL, B * N1 * S1 * 8 * 4), *osm = upload(NULL, B * N1 * S1 * 8 * 4), *oo = upload(NULL, B * N1 * S1 * D * 4);
    aclTensor *tmx = tensor(dst, 4, ACL_FLOAT, omx), *tsm = tensor(dst, 4, ACL_FLOAT, osm), *to = tensor(dq, 4, ACL_FLOAT, oo);
    RUN(aclnnFlashAttentionScore, tq, tk, tv, NULL, NULL, NULL, tm, NULL, 0.5, 1.0, 2147483647, 0, N1, "BNSD", 0, 3,
        tmx, tsm, NULL, to);
    print_arr("q", q, B * N1 * S1 * D);
    print_arr("k", k, B * N2 * S2 * D);
    print_arr("v", v, B * N2 * S2 * D);
    fetch("out", to, oo, B * N1 * S1 * D);
    fetch("softmax_max", tmx, omx, B * N1 * S1 * 8);
    fetch("softmax_sum", tsm, osm, B * N1 * S1 * 8);
    /* refused configurations (GetWorkspaceSize) */
    uint64_t ws;
    aclOpExecutor *ex;
    printf("keep_prob=%d\n", (int)aclnnFlashAttentionScoreGetWorkspaceSize(tq, tk, tv, NULL, NULL, NULL, tm, NULL, 0.5,
        0.9, 2147483647, 0, N1, "BNSD", 0, 3, tmx, tsm, NULL, to, &ws, &ex));
    printf("layout_tnd=%d\n", (int)aclnnFlashAttentionScoreGetWorkspaceSize(tq, tk, tv, NULL, NULL, NULL, tm, NULL, 0.5,
        1.0, 2147483647, 0, N1, "TND", 0, 3, tmx, tsm, NULL, to, &ws, &ex));
    printf("pse=%d\n", (int)aclnnFlashAttentionScoreGetWorkspaceSize(tq, tk, tv, tq, NULL, NULL, tm, NULL, 0.5,
        1.0, 2147483647, 0, N1, "BNSD", 0, 3, tmx, tsm, NULL, to, &ws, &ex));
    printf("sparse_prefix=%d\n", (int)aclnnFlashAttentionScoreGetWorkspaceSize(tq, tk, tv, NULL, NULL, NULL, tm, NULL,
        0.5, 1.0, 2147483647, 0, N1, "BNSD", 0, 5, tmx, tsm, NULL, to, &ws, &ex));
    printf("heads_not_multiple=%d\n", (int)aclnnFlashAttentionScoreGetWorkspaceSize(tq, tk, tv, NULL, NULL, NULL, tm,
        NULL, 0.5, 1.0, 2147483647, 0, 3, "BNSD", 0, 3, tmx, tsm, NULL, to, &ws, &ex));
    free(mask);
}

/* an element type an operator does not compute: refused with 161002 and
 * one stderr line; nothing runs */
static void case_refusals(void)
{
    int32_t xi[6] = { 1, 2, 3, 4, 5, 6 };
    int64_t d[2] = { 2, 3 };
    aclTensor *t = tensor(d, 2, ACL_INT32, upload(xi, 24)), *o = tensor(d, 2, ACL_INT32, upload(NULL, 24));
    uint64_t ws;
    aclOpExecutor *ex;
    printf("silu_int32=%d\n", (int)aclnnSiluGetWorkspaceSize(t, o, &ws, &ex));
}

/* `mib` MiB in 2 MiB tensors, each zeroed, all kept alive as aclTensors (as
 * torch_npu keeps its parameters' tensors); then zero_ of an empty tensor,
 * which touches no memory at all. The operator is looked up with dlopen +
 * dlsym, the way op-plugin does (what an interposer sees). */
static void case_empty_launch(int argc, char **argv)
{
    if (argc < 3) app_die(3, "empty_launch MIB");
    void *lib = dlopen("libopapi.so", RTLD_NOW);
    if (!lib) app_die(2, "dlopen libopapi.so: %s", dlerror());
    typedef aclnnStatus (*ws_fn)(aclTensor *, uint64_t *, aclOpExecutor **);
    typedef aclnnStatus (*run_fn)(void *, uint64_t, aclOpExecutor *, aclrtStream);
    ws_fn zero_ws = (ws_fn)dlsym(lib, "aclnnInplaceZeroGetWorkspaceSize");
    run_fn zero = (run_fn)dlsym(lib, "aclnnInplaceZero");
    if (!zero_ws || !zero) app_die(2, "dlsym aclnnInplaceZero: %s", dlerror());
    int64_t mib = app_parse_int(argv[2], "MIB"), n = mib / 2;
    int64_t d[1] = { (2 << 20) / 4 };
    aclTensor **live = calloc((size_t)n, sizeof *live);
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    for (int64_t i = 0; i < n; i++) {
        live[i] = tensor(d, 1, ACL_FLOAT, upload(NULL, 2u << 20));
        ACL_CHECK(zero_ws(live[i], &ws, &ex));
        ACL_CHECK(zero(NULL, ws, ex, g_stream));
    }
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    int64_t e[2] = { 0, 4 };
    aclTensor *empty = aclCreateTensor(e, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, e, 2, NULL);
    int rc = zero_ws(empty, &ws, &ex);
    if (!rc) rc = zero(NULL, ws, ex, g_stream);
    printf("live_mib=%lld empty_zero=%d\n", (long long)mib, rc);
}

/* N input and N output tensors, each in its own 2 MiB allocation, inputs
 * filled with i; OTHER MiB of other data copied in after them (pushing them
 * out of a small HBM under u3m); then out[i] = in[i] + 1 in one foreach
 * launch (op-plugin passes up to 48 tensors per list), through dlsym */
static void case_wide_launch(int argc, char **argv)
{
    if (argc < 4) app_die(3, "wide_launch N OTHER");
    int64_t n = app_parse_int(argv[2], "N"), other = app_parse_int(argv[3], "OTHER");
    void *lib = dlopen("libopapi.so", RTLD_NOW);
    if (!lib) app_die(2, "dlopen libopapi.so: %s", dlerror());
    typedef aclnnStatus (*ws_fn)(const aclTensorList *, const aclScalar *, aclTensorList *, uint64_t *,
        aclOpExecutor **);
    typedef aclnnStatus (*run_fn)(void *, uint64_t, aclOpExecutor *, aclrtStream);
    ws_fn add_ws = (ws_fn)dlsym(lib, "aclnnForeachAddScalarV2GetWorkspaceSize");
    run_fn add = (run_fn)dlsym(lib, "aclnnForeachAddScalarV2");
    if (!add_ws || !add) app_die(2, "dlsym: %s", dlerror());
    enum { E = (2 << 20) / 4 };
    int64_t d[1] = { E };
    float *h = malloc((size_t)E * 4);
    void **in = calloc((size_t)n, sizeof *in), **out = calloc((size_t)n, sizeof *out);
    const aclTensor **ti = calloc((size_t)n, sizeof *ti), **to = calloc((size_t)n, sizeof *to);
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < E; j++) h[j] = (float)i;
        in[i] = upload(h, (size_t)E * 4);
        out[i] = upload(NULL, (size_t)E * 4);
    }
    /* other data, copied in after the inputs (plain copies, no operator) */
    for (int64_t k = 0; k < other / 2; k++) upload(h, (size_t)E * 4);
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    /* the operator's tensors, created right before its launch (as op-plugin does) */
    for (int64_t i = 0; i < n; i++) {
        ti[i] = tensor(d, 1, ACL_FLOAT, in[i]);
        to[i] = tensor(d, 1, ACL_FLOAT, out[i]);
    }
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    aclTensorList *li = aclCreateTensorList(ti, (uint64_t)n), *lo = aclCreateTensorList(to, (uint64_t)n);
    float one = 1.0f;
    aclScalar *s1 = aclCreateScalar(&one, ACL_FLOAT);
    int rc = add_ws(li, s1, lo, &ws, &ex);
    if (!rc) rc = add(NULL, ws, ex, g_stream);
    int rs = aclrtSynchronizeStream(g_stream);
    int bad = 0;
    for (int64_t i = 0; i < n && !rc && !rs; i++) {
        ACL_CHECK(aclrtMemcpy(h, (size_t)E * 4, out[i], (size_t)E * 4, ACL_MEMCPY_DEVICE_TO_HOST));
        for (int j = 0; j < E; j += 4096) bad += h[j] != (float)i + 1.0f;
    }
    printf("tensors=%lld launch=%d sync=%d wrong=%d\n", (long long)(2 * n), rc, rs, bad);
}

/* FNV-1a over n bytes, continued from h */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* N = 8 inputs and 8 outputs of 8 MiB each (128 MiB: pushed out of a 64 MiB
 * HBM under u3m), every output filled with a pattern; then y[i] = |x[i]| by
 * aclnnAbs (through dlsym) into each output: `contig` the whole buffer (an
 * out-of-place output written whole), `strided` a view of every other float
 * (stride 2: the floats between keep the pattern, so the output's copy-in
 * must stay). Prints a hash of every output byte, compared with stock. */
static void case_out_write(int argc, char **argv)
{
    if (argc < 3) app_die(3, "out_write contig|strided");
    int strided = !strcmp(argv[2], "strided");
    if (!strided && strcmp(argv[2], "contig")) app_die(3, "out_write contig|strided");
    void *lib = dlopen("libopapi.so", RTLD_NOW);
    if (!lib) app_die(2, "dlopen libopapi.so: %s", dlerror());
    typedef aclnnStatus (*ws_fn)(const aclTensor *, aclTensor *, uint64_t *, aclOpExecutor **);
    typedef aclnnStatus (*run_fn)(void *, uint64_t, aclOpExecutor *, aclrtStream);
    ws_fn abs_ws = (ws_fn)dlsym(lib, "aclnnAbsGetWorkspaceSize");
    run_fn abs_run = (run_fn)dlsym(lib, "aclnnAbs");
    if (!abs_ws || !abs_run) app_die(2, "dlsym aclnnAbs: %s", dlerror());
    enum { N = 8, E = (8 << 20) / 4 };
    int64_t ne = strided ? E / 2 : E;
    float *h = malloc((size_t)E * 4);
    void *x[N], *y[N];
    for (int i = 0; i < N; i++) {
        for (int64_t j = 0; j < ne; j++) h[j] = app_rand_f32(&g_seed, 4.0f) - 2.0f;
        x[i] = upload(h, (size_t)ne * 4);
        for (int j = 0; j < E; j++) h[j] = (float)(i * 1000) + 0.5f * (float)(j % 4099);
        y[i] = upload(h, (size_t)E * 4);
    }
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    int rc = 0;
    for (int i = 0; i < N && !rc; i++) {
        int64_t d[1] = { ne }, one[1] = { 1 }, two[1] = { 2 }, st = strided ? E - 1 : E;
        aclTensor *tx = tensor(d, 1, ACL_FLOAT, x[i]);
        aclTensor *ty = strided ? aclCreateTensor(d, 1, ACL_FLOAT, two, 0, ACL_FORMAT_ND, &st, 1, y[i])
                                : aclCreateTensor(d, 1, ACL_FLOAT, one, 0, ACL_FORMAT_ND, &st, 1, y[i]);
        uint64_t ws = 0;
        aclOpExecutor *ex = NULL;
        rc = abs_ws(tx, ty, &ws, &ex);
        if (!rc) rc = abs_run(NULL, ws, ex, g_stream);
        aclDestroyTensor(tx);
        aclDestroyTensor(ty);
    }
    int rs = aclrtSynchronizeStream(g_stream);
    uint64_t hash = 0xcbf29ce484222325ull;
    for (int i = 0; i < N && !rc && !rs; i++) {
        ACL_CHECK(aclrtMemcpy(h, (size_t)E * 4, y[i], (size_t)E * 4, ACL_MEMCPY_DEVICE_TO_HOST));
        hash = fnv(hash, h, (size_t)E * 4);
    }
    printf("out_write=%s launch=%d sync=%d hash=%016llx last_y1=%.9g\n", argv[2], rc, rs,
        (unsigned long long)hash, h[1]);
    free(h);
}


/* A launch on another thread than the one that built its executor, as
 * torch_npu's task queue does: `mib` MiB of live 2 MiB tensors (each zeroed
 * once), then x (2 MiB of ones) is zeroed by aclnnInplaceZero whose
 * GetWorkspaceSize runs here and whose launch runs on a second thread. */
typedef aclnnStatus (*queued_run_fn)(void *, uint64_t, aclOpExecutor *, aclrtStream);
static struct { queued_run_fn run; uint64_t ws; aclOpExecutor *ex; int rc; } g_queued;

static void *queued_worker(void *arg)
{
    (void)arg;
    g_queued.rc = aclrtSetDevice(0);
    if (!g_queued.rc) g_queued.rc = g_queued.run(NULL, g_queued.ws, g_queued.ex, g_stream);
    return NULL;
}

static void case_queued_launch(int argc, char **argv)
{
    if (argc < 3) app_die(3, "queued_launch MIB");
    void *lib = dlopen("libopapi.so", RTLD_NOW);
    if (!lib) app_die(2, "dlopen libopapi.so: %s", dlerror());
    typedef aclnnStatus (*ws_fn)(aclTensor *, uint64_t *, aclOpExecutor **);
    ws_fn zero_ws = (ws_fn)dlsym(lib, "aclnnInplaceZeroGetWorkspaceSize");
    queued_run_fn zero = (queued_run_fn)dlsym(lib, "aclnnInplaceZero");
    if (!zero_ws || !zero) app_die(2, "dlsym aclnnInplaceZero: %s", dlerror());
    int64_t mib = app_parse_int(argv[2], "MIB"), n = mib / 2;
    enum { E = (2 << 20) / 4 };
    int64_t d[1] = { E };
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    for (int64_t i = 0; i < n; i++) {
        aclTensor *t = tensor(d, 1, ACL_FLOAT, upload(NULL, 2u << 20));
        ACL_CHECK(zero_ws(t, &ws, &ex));
        ACL_CHECK(zero(NULL, ws, ex, g_stream));
    }
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    float *h = malloc((size_t)E * 4);
    for (int j = 0; j < E; j++) h[j] = 1.0f;
    void *xd = upload(h, (size_t)E * 4);
    aclTensor *x = tensor(d, 1, ACL_FLOAT, xd);
    ACL_CHECK(zero_ws(x, &g_queued.ws, &g_queued.ex));
    g_queued.run = zero;
    pthread_t th;
    if (pthread_create(&th, NULL, queued_worker, NULL)) app_die(2, "pthread_create");
    pthread_join(th, NULL);
    int rs = aclrtSynchronizeStream(g_stream), bad = 0;
    if (!g_queued.rc && !rs) {
        download(h, xd, (size_t)E * 4);
        for (int j = 0; j < E; j++) bad += h[j] != 0.0f;
    }
    printf("live_mib=%lld queued=%d sync=%d wrong=%d\n", (long long)mib, g_queued.rc, rs, bad);
}


/* A view into a large buffer, as a KV-cache append writes one slot: a
 * 1-D view of ELEMS floats at element OFFSET of a 16 MiB storage, zeroed by
 * aclnnInplaceZero through dlsym. Prints the storage's address so the
 * caller can compare the range u3m records (tests/aclnn_roles.rs). */
static void case_view_write(int argc, char **argv)
{
    if (argc < 4) app_die(3, "view_write OFFSET ELEMS");
    int64_t off = app_parse_int(argv[2], "OFFSET"), n = app_parse_int(argv[3], "ELEMS");
    void *lib = dlopen("libopapi.so", RTLD_NOW);
    if (!lib) app_die(2, "dlopen libopapi.so: %s", dlerror());
    typedef aclnnStatus (*ws_fn)(aclTensor *, uint64_t *, aclOpExecutor **);
    ws_fn zero_ws = (ws_fn)dlsym(lib, "aclnnInplaceZeroGetWorkspaceSize");
    queued_run_fn zero = (queued_run_fn)dlsym(lib, "aclnnInplaceZero");
    if (!zero_ws || !zero) app_die(2, "dlsym aclnnInplaceZero: %s", dlerror());
    int64_t storage = (16 << 20) / 4, st[1] = { 1 }, d[1] = { n };
    void *base = upload(NULL, (size_t)storage * 4);
    aclTensor *v = aclCreateTensor(d, 1, ACL_FLOAT, st, off, ACL_FORMAT_ND, &storage, 1, base);
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    int rc = zero_ws(v, &ws, &ex);
    if (!rc) rc = zero(NULL, ws, ex, g_stream);
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    printf("base=%llx view_rc=%d\n", (unsigned long long)(uintptr_t)base, rc);
}

int main(int argc, char **argv)
{
    if (argc < 2) app_die(3, "usage: optest_llm gelu | foreach_v1 | attention | refusals");
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtCreateStream(&g_stream));
    const char *c = argv[1];
    if (!strcmp(c, "gelu")) case_gelu();
    else if (!strcmp(c, "foreach_v1")) case_foreach_v1();
    else if (!strcmp(c, "attention")) case_attention();
    else if (!strcmp(c, "refusals")) case_refusals();
    else if (!strcmp(c, "empty_launch")) case_empty_launch(argc, argv);
    else if (!strcmp(c, "wide_launch")) case_wide_launch(argc, argv);
    else if (!strcmp(c, "queued_launch")) case_queued_launch(argc, argv);
    else if (!strcmp(c, "view_write")) case_view_write(argc, argv);
    else if (!strcmp(c, "out_write")) case_out_write(argc, argv);
    else app_die(3, "unknown case %s", c);
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    printf("done\n");
    return 0;
}
