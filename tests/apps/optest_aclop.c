/* optest_aclop: drives single operators through the aclop path (aclopExecuteV2,
 * aclopExecute, aclopCompileAndExecute(V2)) on known inputs and prints inputs
 * and results, so tests/sim_ops.rs can check them against references.
 *
 *   optest_aclop matmul M K N TA TB [v2|v1|compile|compile2]
 *   optest_aclop batchmatmul B M K N ADJ1 ADJ2
 *   optest_aclop binary Add|Sub|Mul SHAPE1 SHAPE2 SHAPEY   (shapes like 3x4, "s" = scalar)
 *   optest_aclop relu N | relugrad N | softmax R C | reducesum SHAPE AXIS | fill N VALUE
 *   optest_aclop adam N
 *   optest_aclop hash | inplace | errors | mmu | host | f16 | aliases
 *   optest_aclop flops F          (F < 0: no flops attr)
 *   optest_aclop wide N OTHER     (one opaque operator over N inputs of 2 MiB)
 *
 * Arrays print as name=v0,v1,... with %.9g (exact float round trip). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "acl/acl_op_compiler.h"
#include "common/common.h"

static aclrtStream g_stream;
static uint64_t g_seed = 12345;

typedef struct { int nd; int64_t d[8]; } shape_t;

static shape_t parse_shape(const char *s)
{
    shape_t sh = { 0, {0} };
    if (strcmp(s, "s") == 0) return sh;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, "x"); tok; tok = strtok(NULL, "x")) {
        if (sh.nd == 8) app_die(3, "too many dims in %s", s);
        sh.d[sh.nd++] = app_parse_int(tok, "dim");
    }
    return sh;
}

static size_t numel(shape_t s)
{
    size_t n = 1;
    for (int i = 0; i < s.nd; i++) n *= (size_t)s.d[i];
    return n;
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    ACL_CHECK(aclrtMalloc(&p, bytes ? bytes : 4, ACL_MEM_MALLOC_HUGE_FIRST));
    return p;
}

static void *upload(const float *h, size_t n)
{
    void *d = dev_alloc(n * 4);
    if (n) ACL_CHECK(aclrtMemcpy(d, n * 4, h, n * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    return d;
}

static void download(float *h, const void *d, size_t n)
{
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    if (n) ACL_CHECK(aclrtMemcpy(h, n * 4, d, n * 4, ACL_MEMCPY_DEVICE_TO_HOST));
}

static float *rand_arr(size_t n, float scale)
{
    float *a = malloc((n ? n : 1) * 4);
    for (size_t i = 0; i < n; i++) a[i] = app_rand_f32(&g_seed, scale);
    return a;
}

static void print_arr(const char *name, const float *a, size_t n)
{
    printf("%s=", name);
    for (size_t i = 0; i < n; i++) printf("%s%.9g", i ? "," : "", a[i]);
    printf("\n");
}

/* One operator: inputs/outputs given as (shape, device pointer); f32 ND. */
typedef struct { shape_t sh; void *dev; size_t bytes; aclDataType dt; } arg_t;

static arg_t farg(shape_t sh, void *dev) { arg_t a = { sh, dev, numel(sh) * 4, ACL_FLOAT }; return a; }

static aclError run_op_api(const char *api, const char *type, int nin, const arg_t *in, int nout, const arg_t *out,
    aclopAttr *attr)
{
    aclTensorDesc *id[16], *od[16];
    aclDataBuffer *ib[16], *ob[16];
    for (int i = 0; i < nin; i++) {
        id[i] = aclCreateTensorDesc(in[i].dt, in[i].sh.nd, in[i].sh.d, ACL_FORMAT_ND);
        ib[i] = aclCreateDataBuffer(in[i].dev, in[i].bytes);
    }
    for (int j = 0; j < nout; j++) {
        od[j] = aclCreateTensorDesc(out[j].dt, out[j].sh.nd, out[j].sh.d, ACL_FORMAT_ND);
        ob[j] = aclCreateDataBuffer(out[j].dev, out[j].bytes);
    }
    aclError rc;
    if (!strcmp(api, "v1"))
        rc = aclopExecute(type, nin, (const aclTensorDesc *const *)id, (const aclDataBuffer *const *)ib, nout,
            (const aclTensorDesc *const *)od, ob, attr, g_stream);
    else if (!strcmp(api, "compile"))
        rc = aclopCompileAndExecute(type, nin, (const aclTensorDesc *const *)id, (const aclDataBuffer *const *)ib,
            nout, (const aclTensorDesc *const *)od, ob, attr, ACL_ENGINE_SYS, ACL_COMPILE_SYS, NULL, g_stream);
    else if (!strcmp(api, "compile2"))
        rc = aclopCompileAndExecuteV2(type, nin, id, ib, nout, od, ob, attr, ACL_ENGINE_SYS, ACL_COMPILE_SYS, NULL,
            g_stream);
    else
        rc = aclopExecuteV2(type, nin, id, ib, nout, od, ob, attr, g_stream);
    for (int i = 0; i < nin; i++) { aclDestroyTensorDesc(id[i]); ACL_CHECK(aclDestroyDataBuffer(ib[i])); }
    for (int j = 0; j < nout; j++) { aclDestroyTensorDesc(od[j]); ACL_CHECK(aclDestroyDataBuffer(ob[j])); }
    return rc;
}

static void run_op(const char *type, int nin, const arg_t *in, int nout, const arg_t *out, aclopAttr *attr)
{
    ACL_CHECK(run_op_api("v2", type, nin, in, nout, out, attr));
}

static shape_t S1(int64_t a) { shape_t s = { 1, {a} }; return s; }
static shape_t S2(int64_t a, int64_t b) { shape_t s = { 2, {a, b} }; return s; }
static shape_t S3(int64_t a, int64_t b, int64_t c) { shape_t s = { 3, {a, b, c} }; return s; }

/* ------------------------------------------------------------------ cases */

static void case_matmul(int argc, char **argv)
{
    if (argc < 7) app_die(3, "matmul M K N TA TB [api]");
    int64_t m = app_parse_int(argv[2], "M"), k = app_parse_int(argv[3], "K"), n = app_parse_int(argv[4], "N");
    int ta = (int)app_parse_int(argv[5], "TA"), tb = (int)app_parse_int(argv[6], "TB");
    const char *api = argc > 7 ? argv[7] : "v2";
    shape_t s1 = ta ? S2(k, m) : S2(m, k), s2 = tb ? S2(n, k) : S2(k, n), sy = S2(m, n);
    float *x1 = rand_arr(numel(s1), 1.0f), *x2 = rand_arr(numel(s2), 1.0f), *y = malloc(numel(sy) * 4);
    arg_t in[2] = { farg(s1, upload(x1, numel(s1))), farg(s2, upload(x2, numel(s2))) };
    arg_t out[1] = { farg(sy, dev_alloc(numel(sy) * 4)) };
    aclopAttr *attr = aclopCreateAttr();
    ACL_CHECK(aclopSetAttrBool(attr, "transpose_x1", (uint8_t)ta));
    ACL_CHECK(aclopSetAttrBool(attr, "transpose_x2", (uint8_t)tb));
    ACL_CHECK(run_op_api(api, "MatMul", 2, in, 1, out, attr));
    aclopDestroyAttr(attr);
    download(y, out[0].dev, numel(sy));
    print_arr("x1", x1, numel(s1));
    print_arr("x2", x2, numel(s2));
    print_arr("y", y, numel(sy));
}

static void case_batchmatmul(int argc, char **argv)
{
    if (argc < 8) app_die(3, "batchmatmul B M K N ADJ1 ADJ2");
    int64_t b = app_parse_int(argv[2], "B"), m = app_parse_int(argv[3], "M"), k = app_parse_int(argv[4], "K"),
            n = app_parse_int(argv[5], "N");
    int ta = (int)app_parse_int(argv[6], "ADJ1"), tb = (int)app_parse_int(argv[7], "ADJ2");
    shape_t s1 = ta ? S3(b, k, m) : S3(b, m, k), s2 = tb ? S3(b, n, k) : S3(b, k, n), sy = S3(b, m, n);
    float *x1 = rand_arr(numel(s1), 1.0f), *x2 = rand_arr(numel(s2), 1.0f), *y = malloc(numel(sy) * 4);
    arg_t in[2] = { farg(s1, upload(x1, numel(s1))), farg(s2, upload(x2, numel(s2))) };
    arg_t out[1] = { farg(sy, dev_alloc(numel(sy) * 4)) };
    aclopAttr *attr = aclopCreateAttr();
    ACL_CHECK(aclopSetAttrBool(attr, "adj_x1", (uint8_t)ta));
    ACL_CHECK(aclopSetAttrBool(attr, "adj_x2", (uint8_t)tb));
    run_op("BatchMatMul", 2, in, 1, out, attr);
    aclopDestroyAttr(attr);
    download(y, out[0].dev, numel(sy));
    print_arr("x1", x1, numel(s1));
    print_arr("x2", x2, numel(s2));
    print_arr("y", y, numel(sy));
}

static void case_binary(int argc, char **argv)
{
    if (argc < 6) app_die(3, "binary OP SHAPE1 SHAPE2 SHAPEY");
    shape_t s1 = parse_shape(argv[3]), s2 = parse_shape(argv[4]), sy = parse_shape(argv[5]);
    float *x1 = rand_arr(numel(s1), 2.0f), *x2 = rand_arr(numel(s2), 2.0f), *y = malloc(numel(sy) * 4);
    arg_t in[2] = { farg(s1, upload(x1, numel(s1))), farg(s2, upload(x2, numel(s2))) };
    arg_t out[1] = { farg(sy, dev_alloc(numel(sy) * 4)) };
    run_op(argv[2], 2, in, 1, out, NULL);
    download(y, out[0].dev, numel(sy));
    print_arr("x1", x1, numel(s1));
    print_arr("x2", x2, numel(s2));
    print_arr("y", y, numel(sy));
}

static void case_unary(int argc, char **argv)
{
    const char *what = argv[1];
    if (!strcmp(what, "relu") || !strcmp(what, "relugrad")) {
        if (argc < 3) app_die(3, "%s N", what);
        int64_t n = app_parse_int(argv[2], "N");
        float *x = rand_arr((size_t)n, 1.0f), *g = rand_arr((size_t)n, 3.0f), *y = malloc((size_t)n * 4);
        arg_t out[1] = { farg(S1(n), dev_alloc((size_t)n * 4)) };
        if (!strcmp(what, "relu")) {
            arg_t in[1] = { farg(S1(n), upload(x, (size_t)n)) };
            run_op("Relu", 1, in, 1, out, NULL);
        } else {
            arg_t in[2] = { farg(S1(n), upload(g, (size_t)n)), farg(S1(n), upload(x, (size_t)n)) };
            run_op("ReluGrad", 2, in, 1, out, NULL);
            print_arr("g", g, (size_t)n);
        }
        download(y, out[0].dev, (size_t)n);
        print_arr("x", x, (size_t)n);
        print_arr("y", y, (size_t)n);
    } else if (!strcmp(what, "softmax")) {
        if (argc < 4) app_die(3, "softmax R C");
        int64_t r = app_parse_int(argv[2], "R"), c = app_parse_int(argv[3], "C");
        size_t n = (size_t)(r * c);
        float *x = rand_arr(n, 20.0f), *y = malloc(n * 4);
        x[0] = 80.0f;   /* exp(80) overflows f32 unless the max is subtracted */
        arg_t in[1] = { farg(S2(r, c), upload(x, n)) };
        arg_t out[1] = { farg(S2(r, c), dev_alloc(n * 4)) };
        run_op("SoftmaxV2", 1, in, 1, out, NULL);
        download(y, out[0].dev, n);
        print_arr("x", x, n);
        print_arr("y", y, n);
    } else if (!strcmp(what, "reducesum")) {
        if (argc < 4) app_die(3, "reducesum SHAPE AXIS");
        shape_t s = parse_shape(argv[2]);
        long axis = strtol(argv[3], NULL, 10);
        int ax = (int)(axis < 0 ? axis + s.nd : axis);
        shape_t sy = { 0, {0} };
        for (int i = 0; i < s.nd; i++) if (i != ax) sy.d[sy.nd++] = s.d[i];
        float *x = rand_arr(numel(s), 1.0f), *y = malloc(numel(sy) * 4);
        arg_t in[1] = { farg(s, upload(x, numel(s))) };
        arg_t out[1] = { farg(sy, dev_alloc(numel(sy) * 4)) };
        aclopAttr *attr = aclopCreateAttr();
        ACL_CHECK(aclopSetAttrInt(attr, "axis", axis));
        run_op("ReduceSum", 1, in, 1, out, attr);
        aclopDestroyAttr(attr);
        download(y, out[0].dev, numel(sy));
        print_arr("x", x, numel(s));
        print_arr("y", y, numel(sy));
    } else if (!strcmp(what, "fill")) {
        if (argc < 4) app_die(3, "fill N VALUE");
        int64_t n = app_parse_int(argv[2], "N");
        float v = strtof(argv[3], NULL), *y = malloc((size_t)n * 4);
        arg_t out[1] = { farg(S1(n), dev_alloc((size_t)n * 4)) };
        aclopAttr *attr = aclopCreateAttr();
        ACL_CHECK(aclopSetAttrFloat(attr, "value", v));
        run_op("Fill", 0, NULL, 1, out, attr);
        aclopDestroyAttr(attr);
        download(y, out[0].dev, (size_t)n);
        print_arr("y", y, (size_t)n);
    }
}

static void case_adam(int argc, char **argv)
{
    if (argc < 3) app_die(3, "adam N");
    size_t n = (size_t)app_parse_int(argv[2], "N");
    float *var = rand_arr(n, 1.0f), *m = rand_arr(n, 0.1f), *v = rand_arr(n, 0.01f), *g = rand_arr(n, 1.0f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float sc[7] = { 0.729f, 0.997003f, 0.01f, 0.9f, 0.999f, 1e-8f, 0 };   /* b1^3, b2^3, lr, b1, b2, eps */
    void *dv = upload(var, n), *dm = upload(m, n), *dvv = upload(v, n), *dg = upload(g, n);
    arg_t in[10];
    in[0] = farg(S1((int64_t)n), dv);
    in[1] = farg(S1((int64_t)n), dm);
    in[2] = farg(S1((int64_t)n), dvv);
    for (int i = 0; i < 6; i++) in[3 + i] = farg(S1(1), upload(&sc[i], 1));
    in[9] = farg(S1((int64_t)n), dg);
    arg_t out[3] = { in[0], in[1], in[2] };
    run_op("ApplyAdam", 10, in, 3, out, NULL);
    float *var2 = malloc(n * 4), *m2 = malloc(n * 4), *v2 = malloc(n * 4);
    download(var2, dv, n);
    download(m2, dm, n);
    download(v2, dvv, n);
    print_arr("var", var, n);
    print_arr("m", m, n);
    print_arr("v", v, n);
    print_arr("g", g, n);
    print_arr("scalars", sc, 6);
    print_arr("var_out", var2, n);
    print_arr("m_out", m2, n);
    print_arr("v_out", v2, n);
}

/* Runs `type` on byte ranges, returns the FNV of each output. */
static void hash_run(const char *type, void *in0, void *in1, size_t n, void *o0, void *o1, aclDataType dt,
    uint64_t *h0, uint64_t *h1)
{
    shape_t s = S1((int64_t)(dt == ACL_UINT8 ? n : n / 4));
    arg_t in[2] = { { s, in0, n, dt }, { s, in1, n, dt } };
    arg_t out[2] = { { s, o0, n, dt }, { s, o1, n, dt } };
    run_op(type, 2, in, 2, out, NULL);
    unsigned char *b = malloc(n);
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    ACL_CHECK(aclrtMemcpy(b, n, o0, n, ACL_MEMCPY_DEVICE_TO_HOST));
    *h0 = app_fnv(APP_FNV_INIT, b, n);
    ACL_CHECK(aclrtMemcpy(b, n, o1, n, ACL_MEMCPY_DEVICE_TO_HOST));
    *h1 = app_fnv(APP_FNV_INIT, b, n);
    free(b);
}

static void case_hash(void)
{
    const size_t n = 4096 + 13;   /* not a multiple of 8: the tail counts too */
    unsigned char *h = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)app_rand_u64(&g_seed);
    void *a = dev_alloc(n), *b = dev_alloc(n), *o0 = dev_alloc(n), *o1 = dev_alloc(n);
    ACL_CHECK(aclrtMemcpy(a, n, h, n, ACL_MEMCPY_HOST_TO_DEVICE));
    for (size_t i = 0; i < n; i++) h[i] ^= 0x5a;
    ACL_CHECK(aclrtMemcpy(b, n, h, n, ACL_MEMCPY_HOST_TO_DEVICE));
    uint64_t r[8][2];
    hash_run("MyCustomOp", a, b, n, o0, o1, ACL_UINT8, &r[0][0], &r[0][1]);
    hash_run("MyCustomOp", a, b, n, o0, o1, ACL_UINT8, &r[1][0], &r[1][1]);
    /* flip one byte of input 1, at the very end (the partial tail word) */
    unsigned char c;
    ACL_CHECK(aclrtMemcpy(&c, 1, (char *)b + n - 1, 1, ACL_MEMCPY_DEVICE_TO_HOST));
    c ^= 1;
    ACL_CHECK(aclrtMemcpy((char *)b + n - 1, 1, &c, 1, ACL_MEMCPY_HOST_TO_DEVICE));
    hash_run("MyCustomOp", a, b, n, o0, o1, ACL_UINT8, &r[2][0], &r[2][1]);
    c ^= 1;   /* restore, then flip a byte in the middle of input 0 */
    ACL_CHECK(aclrtMemcpy((char *)b + n - 1, 1, &c, 1, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtMemcpy(&c, 1, (char *)a + 1000, 1, ACL_MEMCPY_DEVICE_TO_HOST));
    c ^= 0x80;
    ACL_CHECK(aclrtMemcpy((char *)a + 1000, 1, &c, 1, ACL_MEMCPY_HOST_TO_DEVICE));
    hash_run("MyCustomOp", a, b, n, o0, o1, ACL_UINT8, &r[3][0], &r[3][1]);
    c ^= 0x80;
    ACL_CHECK(aclrtMemcpy((char *)a + 1000, 1, &c, 1, ACL_MEMCPY_HOST_TO_DEVICE));
    /* back to the original inputs: original outputs */
    hash_run("MyCustomOp", a, b, n, o0, o1, ACL_UINT8, &r[4][0], &r[4][1]);
    /* another op type on the same bytes */
    hash_run("OtherOp", a, b, n, o0, o1, ACL_UINT8, &r[5][0], &r[5][1]);
    /* a known type described as byte ranges (acl_replay) runs the hash kernel */
    hash_run("MatMul", a, b, n, o0, o1, ACL_UINT8, &r[6][0], &r[6][1]);
    printf("same0=%d same1=%d\n", r[0][0] == r[1][0], r[0][1] == r[1][1]);
    printf("flip_tail0=%d flip_tail1=%d\n", r[2][0] != r[0][0], r[2][1] != r[0][1]);
    printf("flip_mid0=%d flip_mid1=%d\n", r[3][0] != r[0][0], r[3][1] != r[0][1]);
    printf("restored=%d\n", r[4][0] == r[0][0] && r[4][1] == r[0][1]);
    printf("outputs_differ=%d\n", r[0][0] != r[0][1]);
    printf("type_matters=%d\n", r[5][0] != r[0][0]);
    printf("bytes_matmul_hashed=%d\n", r[6][0] != r[0][0] && r[6][0] != r[5][0]);
    printf("hash0=%016llx hash1=%016llx\n", (unsigned long long)r[0][0], (unsigned long long)r[0][1]);
}

static void case_inplace(void)
{
    /* Add with y aliasing x1: y = x1 + x1 */
    float a[6] = { 1, -2, 3.5f, 4, 5, -6 }, r[6];
    void *d = upload(a, 6);
    arg_t in[2] = { farg(S1(6), d), farg(S1(6), d) };
    arg_t out[1] = { farg(S1(6), d) };
    run_op("Add", 2, in, 1, out, NULL);
    download(r, d, 6);
    print_arr("add_inplace", r, 6);
    /* MatMul with y aliasing x1 (square): every element of y depends on a
     * whole row of x1, so an in-place kernel reading x1 as it writes y would
     * give different numbers than the reference */
    float *x1 = rand_arr(16, 1.0f), *x2 = rand_arr(16, 1.0f), y[16];
    void *d1 = upload(x1, 16), *d2 = upload(x2, 16);
    arg_t min[2] = { farg(S2(4, 4), d1), farg(S2(4, 4), d2) };
    arg_t mout[1] = { farg(S2(4, 4), d1) };
    run_op("MatMul", 2, min, 1, mout, NULL);
    download(y, d1, 16);
    print_arr("mm_x1", x1, 16);
    print_arr("mm_x2", x2, 16);
    print_arr("mm_y", y, 16);
    /* hash kernel with output == input 0: same result as out of place */
    const size_t n = 256;
    unsigned char hb[256];
    for (size_t i = 0; i < n; i++) hb[i] = (unsigned char)(i * 7 + 1);
    void *ha = dev_alloc(n), *hb2 = dev_alloc(n), *ho = dev_alloc(n), *hscratch = dev_alloc(n);
    ACL_CHECK(aclrtMemcpy(ha, n, hb, n, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtMemcpy(hb2, n, hb, n, ACL_MEMCPY_HOST_TO_DEVICE));
    uint64_t out_of_place, in_place, dummy;
    hash_run("HashInPlace", ha, hb2, n, ho, hscratch, ACL_UINT8, &out_of_place, &dummy);
    hash_run("HashInPlace", ha, hb2, n, ha, hscratch, ACL_UINT8, &in_place, &dummy);
    printf("hash_inplace_same=%d\n", out_of_place == in_place);
}

#define TRY(name, expr) printf("%s=%d\n", name, (int)(expr))

static void case_errors(void)
{
    float h[16] = { 0 };
    void *d = upload(h, 16);
    int64_t dims2[2] = { 4, 4 }, dims1[1] = { 16 };
    aclTensorDesc *t44 = aclCreateTensorDesc(ACL_FLOAT, 2, dims2, ACL_FORMAT_ND);
    aclTensorDesc *t16 = aclCreateTensorDesc(ACL_FLOAT, 1, dims1, ACL_FORMAT_ND);
    aclDataBuffer *b = aclCreateDataBuffer(d, 64);
    aclDataBuffer *small = aclCreateDataBuffer(d, 60);
    aclDataBuffer *nulldata = aclCreateDataBuffer(NULL, 64);
    aclTensorDesc *in2[2] = { t44, t44 }, *out1[1] = { t44 };
    aclDataBuffer *bin2[2] = { b, b }, *bout1[1] = { b };

    TRY("null_optype", aclopExecuteV2(NULL, 2, in2, bin2, 1, out1, bout1, NULL, g_stream));
    TRY("negative_inputs", aclopExecuteV2("MatMul", -1, in2, bin2, 1, out1, bout1, NULL, g_stream));
    TRY("negative_outputs", aclopExecuteV2("MatMul", 2, in2, bin2, -1, out1, bout1, NULL, g_stream));
    TRY("null_desc_array", aclopExecuteV2("MatMul", 2, NULL, bin2, 1, out1, bout1, NULL, g_stream));
    TRY("null_buffer_array", aclopExecuteV2("MatMul", 2, in2, NULL, 1, out1, bout1, NULL, g_stream));
    aclDataBuffer *bnull[2] = { b, NULL };
    TRY("null_buffer", aclopExecuteV2("MatMul", 2, in2, bnull, 1, out1, bout1, NULL, g_stream));
    aclDataBuffer *bnd[2] = { b, nulldata };
    TRY("null_data", aclopExecuteV2("MatMul", 2, in2, bnd, 1, out1, bout1, NULL, g_stream));
    aclDataBuffer *bsmall[2] = { b, small };
    TRY("small_buffer", aclopExecuteV2("MatMul", 2, in2, bsmall, 1, out1, bout1, NULL, g_stream));
    TRY("matmul_one_input", aclopExecuteV2("MatMul", 1, in2, bin2, 1, out1, bout1, NULL, g_stream));
    TRY("matmul_no_output", aclopExecuteV2("MatMul", 2, in2, bin2, 0, out1, bout1, NULL, g_stream));
    aclTensorDesc *mis[2] = { t44, t16 };
    TRY("matmul_bad_shape", aclopExecuteV2("MatMul", 2, mis, bin2, 1, out1, bout1, NULL, g_stream));
    aclTensorDesc *t44d = aclCreateTensorDesc(ACL_DOUBLE, 2, dims2, ACL_FORMAT_ND);
    aclDataBuffer *b128 = aclCreateDataBuffer(dev_alloc(128), 128);
    aclTensorDesc *dd[2] = { t44d, t44d }, *ddo[1] = { t44d };
    aclDataBuffer *bdd[2] = { b128, b128 }, *bddo[1] = { b128 };
    TRY("add_double", aclopExecuteV2("Add", 2, dd, bdd, 1, ddo, bddo, NULL, g_stream));
    /* typed tensors on an operator without a kernel: refused, never hashed */
    TRY("unknown_typed", aclopExecuteV2("MyCustomOp", 2, in2, bin2, 1, out1, bout1, NULL, g_stream));
    int64_t dims_u8[2] = { 8, 8 };
    aclTensorDesc *u8 = aclCreateTensorDesc(ACL_UINT8, 2, dims_u8, ACL_FORMAT_ND);
    aclTensorDesc *u8in[1] = { u8 }, *u8out[1] = { u8 };
    TRY("unknown_uint8_2d", aclopExecuteV2("MyCustomOp", 1, u8in, bin2, 1, u8out, bout1, NULL, g_stream));
    aclDestroyTensorDesc(u8);
    int bogus_stream_storage;
    TRY("bad_stream", aclopExecuteV2("Add", 2, in2, bin2, 1, out1, bout1, NULL, &bogus_stream_storage));
    /* a destroyed data buffer is recognised */
    aclDataBuffer *dead = aclCreateDataBuffer(d, 64);
    TRY("destroy_buffer", aclDestroyDataBuffer(dead));
    TRY("destroy_null_buffer", aclDestroyDataBuffer(NULL));
    TRY("compile_bad_flag", aclopCompileAndExecuteV2("Add", 2, in2, bin2, 1, out1, bout1, NULL, ACL_ENGINE_SYS,
        (aclopCompileType)7, NULL, g_stream));
    TRY("compile_unregistered_no_path", aclopCompileAndExecuteV2("Add", 2, in2, bin2, 1, out1, bout1, NULL,
        ACL_ENGINE_SYS, ACL_COMPILE_UNREGISTERED, NULL, g_stream));
    TRY("attr_null", aclopSetAttrInt(NULL, "x", 1));
    aclopAttr *at = aclopCreateAttr();
    TRY("attr_null_name", aclopSetAttrInt(at, NULL, 1));
    ACL_CHECK(aclopSetAttrInt(at, "axis", 5));
    aclTensorDesc *r1[1] = { t44 }, *r1o[1] = { t16 };
    aclDataBuffer *rb[1] = { b }, *rbo[1] = { b };
    TRY("reducesum_bad_axis", aclopExecuteV2("ReduceSum", 1, r1, rb, 1, r1o, rbo, at, g_stream));
    aclopDestroyAttr(at);
    /* all outputs empty: success, nothing runs */
    int64_t zero[1] = { 0 };
    aclTensorDesc *tz = aclCreateTensorDesc(ACL_FLOAT, 1, zero, ACL_FORMAT_ND);
    aclTensorDesc *oz[1] = { tz };
    TRY("empty_outputs", aclopExecuteV2("Relu", 1, in2, bnull, 1, oz, bout1, NULL, g_stream));
    /* descriptor getters */
    int64_t dim = -1;
    TRY("desc_dim_ok", aclGetTensorDescDimV2(t44, 1, &dim));
    printf("desc_dim1=%lld\n", (long long)dim);
    TRY("desc_dim_oob", aclGetTensorDescDimV2(t44, 2, &dim));
    printf("desc_size=%zu desc_count=%zu desc_ndims=%zu\n", aclGetTensorDescSize(t44),
        aclGetTensorDescElementCount(t44), aclGetTensorDescNumDims(t44));
    printf("dtsize_float=%zu dtsize_f16=%zu dtsize_bool=%zu dtsize_string=%zu dtsize_c128=%zu dtsize_999=%zu\n",
        aclDataTypeSize(ACL_FLOAT), aclDataTypeSize(ACL_FLOAT16), aclDataTypeSize(ACL_BOOL),
        aclDataTypeSize(ACL_STRING), aclDataTypeSize(ACL_COMPLEX128), aclDataTypeSize((aclDataType)999));
    printf("f16_roundtrip=%.9g f16_bits=%04x f16_half=%04x f16_max=%04x f16_inf=%04x\n",
        aclFloat16ToFloat(aclFloatToFloat16(0.333333f)), aclFloatToFloat16(1.0f), aclFloatToFloat16(0.5f),
        aclFloatToFloat16(65504.0f), aclFloatToFloat16(1e6f));
    printf("null_desc_create=%d\n", aclCreateTensorDesc(ACL_FLOAT, 2, NULL, ACL_FORMAT_ND) == NULL);
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
}

static void case_mmu(void)
{
    float h[64];
    for (int i = 0; i < 64; i++) h[i] = (float)i;
    void *x = upload(h, 64), *y = dev_alloc(256);
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    ACL_CHECK(aclrtFree(x));   /* the op below reads freed memory */
    arg_t in[1] = { farg(S1(64), x) };
    arg_t out[1] = { farg(S1(64), y) };
    TRY("launch_rc", run_op_api("v2", "Relu", 1, in, 1, out, NULL));
    TRY("sync_rc", aclrtSynchronizeStream(g_stream));
    TRY("sync_again_rc", aclrtSynchronizeStream(g_stream));
    /* the stream still works after the fault */
    void *x2 = upload(h, 64);
    arg_t in2[1] = { farg(S1(64), x2) };
    TRY("after_rc", run_op_api("v2", "Relu", 1, in2, 1, out, NULL));
    float r[64];
    download(r, y, 64);
    printf("after_y63=%.9g\n", r[63]);
}

static void case_host(void)
{
    /* y = x1 + x2 with x2 in host memory (aclSetTensorPlaceMent HOST): its
     * bytes are taken at launch, so changing them afterwards has no effect */
    float a[4] = { 1, 2, 3, 4 }, hb[4] = { 10, 20, 30, 40 }, r[4];
    void *da = upload(a, 4), *dy = dev_alloc(16);
    int64_t dims[1] = { 4 };
    aclTensorDesc *td = aclCreateTensorDesc(ACL_FLOAT, 1, dims, ACL_FORMAT_ND);
    aclTensorDesc *th = aclCreateTensorDesc(ACL_FLOAT, 1, dims, ACL_FORMAT_ND);
    ACL_CHECK(aclSetTensorPlaceMent(th, ACL_MEMTYPE_HOST));
    aclDataBuffer *ba = aclCreateDataBuffer(da, 16), *bh = aclCreateDataBuffer(hb, 16), *by = aclCreateDataBuffer(dy, 16);
    aclTensorDesc *in[2] = { td, th }, *out[1] = { td };
    aclDataBuffer *bin[2] = { ba, bh }, *bout[1] = { by };
    ACL_CHECK(aclopExecuteV2("Add", 2, in, bin, 1, out, bout, NULL, g_stream));
    hb[0] = 1000;
    download(r, dy, 4);
    print_arr("y", r, 4);
}

/* float16 operands: y = x1 + x2 and z = x1 @ x2 (4x4), computed through f32
 * and rounded to f16; prints the f16 inputs/outputs as floats */
/* The alias op types (MatMulV2, BatchMatMulV2, AddV2, Softmax, Div) give the
 * bits of the type they stand for (whose results other cases check). */
static void case_aliases(void)
{
    static const struct { const char *alias, *canon; int kind; } pairs[] = {
        { "MatMulV2", "MatMul", 0 }, { "BatchMatMulV2", "BatchMatMul", 1 }, { "AddV2", "Add", 2 },
        { "Softmax", "SoftmaxV2", 3 }, { "Div", "RealDiv", 2 },
    };
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        shape_t s1, s2, sy;
        int nin = 2;
        switch (pairs[p].kind) {
        case 0: s1 = S2(3, 5); s2 = S2(5, 4); sy = S2(3, 4); break;
        case 1: s1 = S3(2, 3, 5); s2 = S3(2, 5, 4); sy = S3(2, 3, 4); break;
        case 2: s1 = S2(3, 4); s2 = S2(3, 4); sy = S2(3, 4); break;
        default: s1 = S2(3, 4); s2 = s1; sy = S2(3, 4); nin = 1; break;
        }
        float *x1 = rand_arr(numel(s1), 1.0f), *x2 = rand_arr(numel(s2), 1.0f);
        float *y[2] = { malloc(numel(sy) * 4), malloc(numel(sy) * 4) };
        arg_t in[2] = { farg(s1, upload(x1, numel(s1))), farg(s2, upload(x2, numel(s2))) };
        for (int v = 0; v < 2; v++) {
            arg_t out[1] = { farg(sy, dev_alloc(numel(sy) * 4)) };
            run_op(v ? pairs[p].canon : pairs[p].alias, nin, in, 1, out, NULL);
            download(y[v], out[0].dev, numel(sy));
        }
        printf("alias_%s_same=%d\n", pairs[p].alias, memcmp(y[0], y[1], numel(sy) * 4) == 0);
    }
}

static void case_f16(void)
{
    enum { N = 16 };
    float *a = rand_arr(N, 2.0f), *b = rand_arr(N, 2.0f), fa[N], fb[N], fy[N], fz[N];
    uint16_t ha[N], hb[N], hy[N], hz[N];
    for (int i = 0; i < N; i++) {
        ha[i] = aclFloatToFloat16(a[i]);
        hb[i] = aclFloatToFloat16(b[i]);
        fa[i] = aclFloat16ToFloat(ha[i]);
        fb[i] = aclFloat16ToFloat(hb[i]);
    }
    void *da = dev_alloc(N * 2), *db = dev_alloc(N * 2), *dy = dev_alloc(N * 2), *dz = dev_alloc(N * 2);
    ACL_CHECK(aclrtMemcpy(da, N * 2, ha, N * 2, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtMemcpy(db, N * 2, hb, N * 2, ACL_MEMCPY_HOST_TO_DEVICE));
    arg_t in[2] = { { S2(4, 4), da, N * 2, ACL_FLOAT16 }, { S2(4, 4), db, N * 2, ACL_FLOAT16 } };
    arg_t oy[1] = { { S2(4, 4), dy, N * 2, ACL_FLOAT16 } }, oz[1] = { { S2(4, 4), dz, N * 2, ACL_FLOAT16 } };
    run_op("Add", 2, in, 1, oy, NULL);
    run_op("MatMul", 2, in, 1, oz, NULL);
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    ACL_CHECK(aclrtMemcpy(hy, N * 2, dy, N * 2, ACL_MEMCPY_DEVICE_TO_HOST));
    ACL_CHECK(aclrtMemcpy(hz, N * 2, dz, N * 2, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int i = 0; i < N; i++) { fy[i] = aclFloat16ToFloat(hy[i]); fz[i] = aclFloat16ToFloat(hz[i]); }
    print_arr("x1", fa, N);
    print_arr("x2", fb, N);
    print_arr("y", fy, N);
    print_arr("z", fz, N);
}

static void case_flops(int argc, char **argv)
{
    if (argc < 3) app_die(3, "flops F");
    long long f = strtoll(argv[2], NULL, 10);
    void *a = dev_alloc(64), *o = dev_alloc(64);
    arg_t in[1] = { { S1(64), a, 64, ACL_UINT8 } };
    arg_t out[1] = { { S1(64), o, 64, ACL_UINT8 } };
    aclopAttr *attr = aclopCreateAttr();
    if (f >= 0) ACL_CHECK(aclopSetAttrInt(attr, "flops", f));
    run_op("CostOp", 1, in, 1, out, attr);
    aclopDestroyAttr(attr);
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    printf("ok=1\n");
}


/* N inputs of 2 MiB each (bytes, an opaque operator: the hash kernel reads
 * every input), then OTHER MiB of other data copied in after them (pushing
 * them out of a small HBM under u3m), then one aclopExecuteV2 over all N
 * inputs and one output: under libu3m.so in tier mode every buffer must be
 * resident (tests/tier_aclnn.rs) */
static void case_wide(int argc, char **argv)
{
    if (argc < 4) app_die(3, "wide N OTHER");
    int64_t n = app_parse_int(argv[2], "N"), other = app_parse_int(argv[3], "OTHER");
    const size_t b = 2u << 20;
    unsigned char *h = malloc(b);
    for (size_t i = 0; i < b; i++) h[i] = (unsigned char)i;
    aclTensorDesc **id = calloc((size_t)n, sizeof *id);
    aclDataBuffer **ib = calloc((size_t)n, sizeof *ib);
    int64_t d[1] = { (int64_t)b };
    for (int64_t i = 0; i < n; i++) {
        void *p = dev_alloc(b);
        ACL_CHECK(aclrtMemcpy(p, b, h, b, ACL_MEMCPY_HOST_TO_DEVICE));
        id[i] = aclCreateTensorDesc(ACL_UINT8, 1, d, ACL_FORMAT_ND);
        ib[i] = aclCreateDataBuffer(p, b);
    }
    for (int64_t k = 0; k < other / 2; k++) {
        void *p = dev_alloc(b);
        ACL_CHECK(aclrtMemcpy(p, b, h, b, ACL_MEMCPY_HOST_TO_DEVICE));
    }
    void *o = dev_alloc(b);
    aclTensorDesc *od[1] = { aclCreateTensorDesc(ACL_UINT8, 1, d, ACL_FORMAT_ND) };
    aclDataBuffer *ob[1] = { aclCreateDataBuffer(o, b) };
    int rc = aclopExecuteV2("WideOpaqueOp", (int)n, id, ib, 1, od, ob, NULL, g_stream);
    int rs = aclrtSynchronizeStream(g_stream);
    printf("inputs=%lld launch=%d sync=%d\n", (long long)n, rc, rs);
}

int main(int argc, char **argv)
{
    if (argc < 2) app_die(3, "usage: optest_aclop CASE [ARGS]");
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtCreateStream(&g_stream));
    const char *c = argv[1];
    if (!strcmp(c, "matmul")) case_matmul(argc, argv);
    else if (!strcmp(c, "batchmatmul")) case_batchmatmul(argc, argv);
    else if (!strcmp(c, "binary")) case_binary(argc, argv);
    else if (!strcmp(c, "relu") || !strcmp(c, "relugrad") || !strcmp(c, "softmax") || !strcmp(c, "reducesum") ||
             !strcmp(c, "fill")) case_unary(argc, argv);
    else if (!strcmp(c, "adam")) case_adam(argc, argv);
    else if (!strcmp(c, "hash")) case_hash();
    else if (!strcmp(c, "inplace")) case_inplace();
    else if (!strcmp(c, "errors")) case_errors();
    else if (!strcmp(c, "mmu")) case_mmu();
    else if (!strcmp(c, "host")) case_host();
    else if (!strcmp(c, "f16")) case_f16();
    else if (!strcmp(c, "aliases")) case_aliases();
    else if (!strcmp(c, "flops")) case_flops(argc, argv);
    else if (!strcmp(c, "wide")) case_wide(argc, argv);
    else app_die(3, "unknown case %s", c);
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    ACL_CHECK(aclrtDestroyStream(g_stream));
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return 0;
}
