/* optest_aclnn: drives the aclnn operators (libopapi/libnnopbase) on known
 * inputs, including strided views, and prints inputs and results for
 * tests/sim_ops.rs.
 *
 *   optest_aclnn add | mul | inplace | softmax R C DIM | errors
 *   optest_aclnn matmul_t M K N      (mat2 is a transposed view of an [N,K] buffer)
 *   optest_aclnn bmm B M K N         (self is a view at an offset into a larger buffer)
 *   optest_aclnn fault               (run with ACLSIM_FAULTS=op:1)
 *
 * Arrays print as name=v0,v1,... with %.9g. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnnop/aclnn_ops.h"
#include "common/common.h"

static aclrtStream g_stream;
static uint64_t g_seed = 777;

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    ACL_CHECK(aclrtMalloc(&p, bytes ? bytes : 4, ACL_MEM_MALLOC_HUGE_FIRST));
    return p;
}

static void *upload(const float *h, size_t n)
{
    void *d = dev_alloc(n * 4);
    ACL_CHECK(aclrtMemcpy(d, n * 4, h, n * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    return d;
}

static void download(float *h, const void *d, size_t n)
{
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    ACL_CHECK(aclrtMemcpy(h, n * 4, d, n * 4, ACL_MEMCPY_DEVICE_TO_HOST));
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

/* Contiguous f32 tensor over `data` (whole buffer as storage). */
static aclTensor *tensor(const int64_t *dims, int nd, void *data)
{
    int64_t st[8], n = 1;
    for (int i = nd - 1; i >= 0; i--) { st[i] = n; n *= dims[i]; }
    return aclCreateTensor(dims, (uint64_t)nd, ACL_FLOAT, st, 0, ACL_FORMAT_ND, &n, 1, data);
}

#define RUN(op, ...) do {                                                          \
        uint64_t ws_ = 0;                                                          \
        aclOpExecutor *ex_ = NULL;                                                 \
        ACL_CHECK(op##GetWorkspaceSize(__VA_ARGS__, &ws_, &ex_));                  \
        ACL_CHECK(op(NULL, ws_, ex_, g_stream));                                   \
    } while (0)

static void case_add(void)
{
    float *a = rand_arr(12, 1.0f), *b = rand_arr(4, 1.0f), y[12];
    int64_t d34[2] = { 3, 4 }, d4[1] = { 4 };
    void *dy = dev_alloc(48);
    aclTensor *ta = tensor(d34, 2, upload(a, 12)), *tb = tensor(d4, 1, upload(b, 4)), *ty = tensor(d34, 2, dy);
    float alpha = 2.5f;
    aclScalar *sa = aclCreateScalar(&alpha, ACL_FLOAT);
    RUN(aclnnAdd, ta, tb, sa, ty);
    download(y, dy, 12);
    print_arr("self", a, 12);
    print_arr("other", b, 4);
    print_arr("out", y, 12);
    ACL_CHECK(aclDestroyTensor(ta));
    ACL_CHECK(aclDestroyTensor(tb));
    ACL_CHECK(aclDestroyTensor(ty));
    ACL_CHECK(aclDestroyScalar(sa));
}

static void case_mul(void)
{
    float *a = rand_arr(3, 1.0f), *b = rand_arr(4, 1.0f), y[12];
    int64_t d31[2] = { 3, 1 }, d14[2] = { 1, 4 }, d34[2] = { 3, 4 };
    void *dy = dev_alloc(48);
    aclTensor *ta = tensor(d31, 2, upload(a, 3)), *tb = tensor(d14, 2, upload(b, 4)), *ty = tensor(d34, 2, dy);
    RUN(aclnnMul, ta, tb, ty);
    download(y, dy, 12);
    print_arr("self", a, 3);
    print_arr("other", b, 4);
    print_arr("out", y, 12);
}

static void case_inplace(void)
{
    /* self, other and out are one tensor: out = self + alpha * self, in place */
    float a[5] = { 1, 2, 3, 4, 5 }, y[5];
    int64_t d5[1] = { 5 };
    void *d = upload(a, 5);
    aclTensor *t = tensor(d5, 1, d);
    float alpha = -3.0f;
    aclScalar *sa = aclCreateScalar(&alpha, ACL_FLOAT);
    RUN(aclnnAdd, t, t, sa, t);
    download(y, d, 5);
    print_arr("out", y, 5);
}

static void case_matmul_t(int argc, char **argv)
{
    if (argc < 5) app_die(3, "matmul_t M K N");
    int64_t m = app_parse_int(argv[2], "M"), k = app_parse_int(argv[3], "K"), n = app_parse_int(argv[4], "N");
    float *a = rand_arr((size_t)(m * k), 1.0f), *bt = rand_arr((size_t)(n * k), 1.0f);
    float *y = malloc((size_t)(m * n) * 4);
    void *dy = dev_alloc((size_t)(m * n) * 4);
    int64_t da[2] = { m, k }, dyd[2] = { m, n };
    aclTensor *ta = tensor(da, 2, upload(a, (size_t)(m * k)));
    /* mat2 = bt^T: view [K,N] with strides [1,K] over storage [N*K] */
    int64_t vd[2] = { k, n }, vs[2] = { 1, k }, sd[1] = { n * k };
    aclTensor *tb = aclCreateTensor(vd, 2, ACL_FLOAT, vs, 0, ACL_FORMAT_ND, sd, 1, upload(bt, (size_t)(n * k)));
    aclTensor *ty = tensor(dyd, 2, dy);
    RUN(aclnnMatmul, ta, tb, ty, 1);
    download(y, dy, (size_t)(m * n));
    print_arr("self", a, (size_t)(m * k));
    print_arr("mat2_storage", bt, (size_t)(n * k));
    print_arr("out", y, (size_t)(m * n));
    int64_t *vdims = NULL;
    uint64_t vn = 0;
    ACL_CHECK(aclGetViewShape(tb, &vdims, &vn));
    printf("view_shape=%llu:%lld,%lld\n", (unsigned long long)vn, (long long)vdims[0], (long long)vdims[1]);
    free(vdims);
}

static void case_bmm(int argc, char **argv)
{
    if (argc < 6) app_die(3, "bmm B M K N");
    int64_t b = app_parse_int(argv[2], "B"), m = app_parse_int(argv[3], "M"), k = app_parse_int(argv[4], "K"),
            n = app_parse_int(argv[5], "N");
    const int64_t pad = 7;   /* self starts 7 elements into its storage */
    size_t na = (size_t)(b * m * k), nb = (size_t)(b * k * n), ny = (size_t)(b * m * n);
    float *store = rand_arr(na + (size_t)pad + 5, 1.0f), *bb = rand_arr(nb, 1.0f), *y = malloc(ny * 4);
    int64_t da[3] = { b, m, k }, sa[3] = { m * k, k, 1 }, sda[1] = { (int64_t)na + pad + 5 };
    aclTensor *ta = aclCreateTensor(da, 3, ACL_FLOAT, sa, pad, ACL_FORMAT_ND, sda, 1, upload(store, na + (size_t)pad + 5));
    int64_t dbb[3] = { b, k, n }, dyy[3] = { b, m, n };
    void *dy = dev_alloc(ny * 4);
    aclTensor *tb = tensor(dbb, 3, upload(bb, nb)), *ty = tensor(dyy, 3, dy);
    RUN(aclnnMatmul, ta, tb, ty, 0);
    download(y, dy, ny);
    print_arr("self", store + pad, na);
    print_arr("mat2", bb, nb);
    print_arr("out", y, ny);
}

static void case_softmax(int argc, char **argv)
{
    if (argc < 5) app_die(3, "softmax R C DIM");
    int64_t r = app_parse_int(argv[2], "R"), c = app_parse_int(argv[3], "C");
    long dim = strtol(argv[4], NULL, 10);
    size_t n = (size_t)(r * c);
    float *x = rand_arr(n, 5.0f), *y = malloc(n * 4);
    int64_t d[2] = { r, c };
    void *dy = dev_alloc(n * 4);
    aclTensor *tx = tensor(d, 2, upload(x, n)), *ty = tensor(d, 2, dy);
    RUN(aclnnSoftmax, tx, dim, ty);
    download(y, dy, n);
    print_arr("x", x, n);
    print_arr("y", y, n);
}

#define TRY(name, expr) printf("%s=%d\n", name, (int)(expr))

static void case_errors(void)
{
    float h[16] = { 0 };
    int64_t d44[2] = { 4, 4 }, d33[2] = { 3, 3 }, d4[1] = { 4 };
    void *d = upload(h, 16), *d2 = upload(h, 16);
    aclTensor *a = tensor(d44, 2, d), *b = tensor(d44, 2, d2), *bad = tensor(d33, 2, d2);
    aclTensor *nodata = tensor(d44, 2, NULL);
    float one = 1.0f;
    aclScalar *s = aclCreateScalar(&one, ACL_FLOAT);
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    TRY("null_self", aclnnAddGetWorkspaceSize(NULL, b, s, a, &ws, &ex));
    TRY("null_alpha", aclnnAddGetWorkspaceSize(a, b, NULL, a, &ws, &ex));
    TRY("null_data", aclnnAddGetWorkspaceSize(a, nodata, s, a, &ws, &ex));
    TRY("null_data_out", aclnnMulGetWorkspaceSize(a, b, nodata, &ws, &ex));
    TRY("null_executor_out", aclnnMulGetWorkspaceSize(a, b, a, &ws, NULL));
    TRY("shape_mismatch", aclnnAddGetWorkspaceSize(a, bad, s, a, &ws, &ex));
    TRY("matmul_mismatch", aclnnMatmulGetWorkspaceSize(a, bad, a, 0, &ws, &ex));
    TRY("matmul_bad_cube", aclnnMatmulGetWorkspaceSize(a, b, a, 9, &ws, &ex));
    TRY("softmax_bad_dim", aclnnSoftmaxGetWorkspaceSize(a, 2, b, &ws, &ex));
    /* a view reaching past its storage */
    int64_t vd[2] = { 4, 4 }, vs[2] = { 4, 1 }, sd[1] = { 16 };
    aclTensor *over = aclCreateTensor(vd, 2, ACL_FLOAT, vs, 1, ACL_FORMAT_ND, sd, 1, d);
    TRY("view_out_of_storage", aclnnMulGetWorkspaceSize(a, over, b, &ws, &ex));
    /* executors: NULL, unknown, used, destroyed */
    TRY("launch_null", aclnnMul(NULL, 0, NULL, g_stream));
    int junk[64] = { 0 };
    TRY("launch_unknown", aclnnMul(NULL, 0, (aclOpExecutor *)junk, g_stream));
    ex = NULL;
    TRY("prepare_ok", aclnnMulGetWorkspaceSize(a, b, a, &ws, &ex));
    printf("workspace=%llu\n", (unsigned long long)ws);
    TRY("launch_ok", aclnnMul(NULL, ws, ex, g_stream));
    TRY("launch_reused", aclnnMul(NULL, ws, ex, g_stream));
    ex = NULL;
    ACL_CHECK(aclnnMulGetWorkspaceSize(a, b, a, &ws, &ex));
    TRY("destroy_executor", aclDestroyAclOpExecutor(ex));
    TRY("launch_destroyed", aclnnMul(NULL, ws, ex, g_stream));
    TRY("destroy_executor_null", aclDestroyAclOpExecutor(NULL));
    /* a tensor destroyed after GetWorkspaceSize is not needed by the launch
     * (the executor holds a snapshot), but a destroyed handle is rejected */
    aclTensor *tmp = tensor(d4, 1, d);
    TRY("destroy_tensor", aclDestroyTensor(tmp));
    TRY("destroy_tensor_again", aclDestroyTensor(tmp));
    TRY("use_destroyed", aclnnMulGetWorkspaceSize(tmp, tmp, tmp, &ws, &ex));
    TRY("destroy_null", aclDestroyTensor(NULL));
    TRY("destroy_wrong_kind", aclDestroyScalar((aclScalar *)a));
    int64_t *vdims = NULL;
    uint64_t vn = 0;
    TRY("viewshape_null", aclGetViewShape(a, NULL, &vn));
    TRY("viewshape_destroyed", aclGetViewShape(tmp, &vdims, &vn));
    /* creation edge cases */
    printf("create_null_dims=%d\n", aclCreateTensor(NULL, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, sd, 1, d) == NULL);
    printf("create_null_scalar=%d\n", aclCreateScalar(NULL, ACL_FLOAT) == NULL);
    int64_t iv[3] = { 1, 2, 3 };
    aclIntArray *ia = aclCreateIntArray(iv, 3);
    TRY("destroy_intarray", aclDestroyIntArray(ia));
    const aclTensor *lt[2] = { tensor(d4, 1, d), tensor(d4, 1, d) };
    aclTensorList *tl = aclCreateTensorList(lt, 2);
    TRY("destroy_list", aclDestroyTensorList(tl));
    TRY("list_owned_tensor", aclDestroyTensor(lt[0]));   /* the list destroyed it */
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
}

static void case_fault(void)
{
    float h[4] = { 1, 2, 3, 4 };
    int64_t d4[1] = { 4 };
    void *d = upload(h, 4);
    aclTensor *t = tensor(d4, 1, d);
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    ACL_CHECK(aclnnMulGetWorkspaceSize(t, t, t, &ws, &ex));
    TRY("first_launch", aclnnMul(NULL, ws, ex, g_stream));
    ACL_CHECK(aclnnMulGetWorkspaceSize(t, t, t, &ws, &ex));
    TRY("second_launch", aclnnMul(NULL, ws, ex, g_stream));
    float y[4];
    download(y, d, 4);
    print_arr("out", y, 4);
}

int main(int argc, char **argv)
{
    if (argc < 2) app_die(3, "usage: optest_aclnn CASE [ARGS]");
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtCreateStream(&g_stream));
    const char *c = argv[1];
    if (!strcmp(c, "add")) case_add();
    else if (!strcmp(c, "mul")) case_mul();
    else if (!strcmp(c, "inplace")) case_inplace();
    else if (!strcmp(c, "matmul_t")) case_matmul_t(argc, argv);
    else if (!strcmp(c, "bmm")) case_bmm(argc, argv);
    else if (!strcmp(c, "softmax")) case_softmax(argc, argv);
    else if (!strcmp(c, "errors")) case_errors();
    else if (!strcmp(c, "fault")) case_fault();
    else app_die(3, "unknown case %s", c);
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    ACL_CHECK(aclrtDestroyStream(g_stream));
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return 0;
}
