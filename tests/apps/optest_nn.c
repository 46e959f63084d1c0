/* optest_nn: the aclnn operators added for PyTorch training (rt/kernels_nn.c),
 * reached the way op-plugin reaches them — dlopen("libopapi.so") + dlsym of
 * the name — on known inputs, against a double-precision reference computed
 * here. Prints "<case>_err=<max abs error>" per case (and a few exact facts)
 * for tests/sim_torch_surface.rs. Works without torch: the torch_npu tier
 * (tests/torch_npu.rs) checks the same operators under real torch_npu. */
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "common/common.h"

static void *g_opapi;
static aclrtStream g_stream;
static uint64_t g_seed = 4242;

typedef aclnnStatus (*launch_fn)(void *, uint64_t, aclOpExecutor *, aclrtStream);

static void *sym(const char *name)
{
    void *p = dlsym(g_opapi, name);
    if (!p) app_die(2, "libopapi.so lacks %s", name);
    return p;
}

/* GetWorkspaceSize through a typed pointer, then the launch by name. */
#define RUN(op, type, ...) do {                                                         \
        uint64_t ws_ = 0;                                                               \
        aclOpExecutor *ex_ = NULL;                                                      \
        ACL_CHECK(((type)sym(op "GetWorkspaceSize"))(__VA_ARGS__, &ws_, &ex_));         \
        ACL_CHECK(((launch_fn)sym(op))(NULL, ws_, ex_, g_stream));                      \
    } while (0)

static void *up(const void *h, size_t bytes)
{
    void *d = NULL;
    ACL_CHECK(aclrtMalloc(&d, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemcpy(d, bytes, h, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    return d;
}

static void down(void *h, const void *d, size_t bytes)
{
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    ACL_CHECK(aclrtMemcpy(h, bytes, d, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
}

static aclTensor *tens(const int64_t *dims, int nd, aclDataType dt, void *data)
{
    int64_t st[8], n = 1;
    for (int i = nd - 1; i >= 0; i--) { st[i] = n; n *= dims[i]; }
    return aclCreateTensor(dims, (uint64_t)nd, dt, st, 0, ACL_FORMAT_ND, &n, 1, data);
}

static void rnd(float *a, size_t n, float scale) { for (size_t i = 0; i < n; i++) a[i] = app_rand_f32(&g_seed, scale); }

static double maxerr(const float *got, const double *want, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs((double)got[i] - want[i]));
    return e;
}

typedef aclnnStatus (*ws_t1_i64_t)(const aclTensor *, int64_t, aclTensor *, uint64_t *, aclOpExecutor **);
typedef aclnnStatus (*ws_nll)(const aclTensor *, const aclTensor *, const aclTensor *, int64_t, int64_t, aclTensor *,
    aclTensor *, uint64_t *, aclOpExecutor **);
typedef aclnnStatus (*ws_nllb)(const aclTensor *, const aclTensor *, const aclTensor *, const aclTensor *, int64_t,
    int64_t, const aclTensor *, aclTensor *, uint64_t *, aclOpExecutor **);

/* log_softmax -> nll_loss(mean, ignore_index) -> backward of both */
static void case_loss(void)
{
    enum { N = 5, C = 4 };
    float x[N * C], w[C] = { 1.0f, 0.5f, 2.0f, 1.5f };
    int64_t t[N] = { 0, 3, -100, 2, 1 };
    rnd(x, N * C, 2.0f);
    int64_t dx2[2] = { N, C }, dn[1] = { N }, dc[1] = { C }, d1[1] = { 1 };
    void *dX = up(x, sizeof x), *dT = up(t, sizeof t), *dW = up(w, sizeof w);
    float zeros[N * C] = {0};
    void *dL = up(zeros, sizeof zeros), *dY = up(zeros, 4), *dTW = up(zeros, 4), *dG = up(zeros, sizeof zeros),
         *dGL = up(zeros, sizeof zeros);
    float one = 1.0f;
    void *dOne = up(&one, 4);
    aclTensor *X = tens(dx2, 2, ACL_FLOAT, dX), *L = tens(dx2, 2, ACL_FLOAT, dL), *T = tens(dn, 1, ACL_INT64, dT);
    aclTensor *W = tens(dc, 1, ACL_FLOAT, dW), *Y = tens(d1, 0, ACL_FLOAT, dY), *TW = tens(d1, 0, ACL_FLOAT, dTW);
    aclTensor *G = tens(dx2, 2, ACL_FLOAT, dG), *GL = tens(dx2, 2, ACL_FLOAT, dGL), *ONE = tens(d1, 0, ACL_FLOAT, dOne);
    RUN("aclnnLogSoftmax", ws_t1_i64_t, X, 1, L);
    RUN("aclnnNLLLoss", ws_nll, L, T, W, 1, -100, Y, TW);
    RUN("aclnnNLLLossBackward", ws_nllb, ONE, L, T, W, 1, -100, TW, G);
    typedef aclnnStatus (*ws_lsb)(const aclTensor *, const aclTensor *, int64_t, aclTensor *, uint64_t *, aclOpExecutor **);
    RUN("aclnnLogSoftmaxBackward", ws_lsb, G, L, 1, GL);
    float y, l[N * C], gl[N * C];
    down(&y, dY, 4);
    down(l, dL, sizeof l);
    down(gl, dGL, sizeof gl);
    /* reference */
    double rl[N * C], rgl[N * C], sum = 0, tw = 0;
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, s = 0;
        for (int c = 0; c < C; c++) mx = fmax(mx, x[n * C + c]);
        for (int c = 0; c < C; c++) s += exp(x[n * C + c] - mx);
        for (int c = 0; c < C; c++) rl[n * C + c] = x[n * C + c] - mx - log(s);
        if (t[n] != -100) { sum += -w[t[n]] * rl[n * C + t[n]]; tw += w[t[n]]; }
    }
    double ry = sum / tw;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double g = (t[n] == c) ? -w[c] / tw : 0.0;   /* d loss / d logsoftmax */
            double gsum = t[n] == -100 ? 0.0 : -w[t[n]] / tw;
            rgl[n * C + c] = g - exp(rl[n * C + c]) * gsum;
        }
    printf("log_softmax_err=%.3g\n", maxerr(l, rl, N * C));
    printf("nll_loss_err=%.3g\n", fabs((double)y - ry));
    printf("loss_grad_err=%.3g\n", maxerr(gl, rgl, N * C));
}

/* addmm: beta * bias[N] + alpha * A[M,K] @ B[K,N] */
static void case_addmm(void)
{
    enum { M = 3, K = 5, N = 4 };
    float a[M * K], b[K * N], bias[N], y[M * N];
    rnd(a, M * K, 1.0f); rnd(b, K * N, 1.0f); rnd(bias, N, 1.0f);
    int64_t da[2] = { M, K }, db[2] = { K, N }, dy[2] = { M, N }, dn[1] = { N };
    void *dY = up(y, sizeof y);
    aclTensor *A = tens(da, 2, ACL_FLOAT, up(a, sizeof a)), *B = tens(db, 2, ACL_FLOAT, up(b, sizeof b));
    aclTensor *S = tens(dn, 1, ACL_FLOAT, up(bias, sizeof bias)), *Y = tens(dy, 2, ACL_FLOAT, dY);
    double beta = 0.5, alpha = 2.0;
    aclScalar *sb = aclCreateScalar(&beta, ACL_DOUBLE), *sa = aclCreateScalar(&alpha, ACL_DOUBLE);
    typedef aclnnStatus (*ws)(const aclTensor *, const aclTensor *, const aclTensor *, const aclScalar *,
        const aclScalar *, aclTensor *, int8_t, uint64_t *, aclOpExecutor **);
    RUN("aclnnAddmm", ws, S, A, B, sb, sa, Y, 1);
    down(y, dY, sizeof y);
    double r[M * N];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)a[i * K + k] * b[k * N + j];
            r[i * N + j] = beta * bias[j] + alpha * acc;
        }
    printf("addmm_err=%.3g\n", maxerr(y, r, M * N));
}

/* foreach: x * 0.5 (host scalar, V2), x * s (device scalar, V1),
 * x1 + [2, -1] * x2 / x3 (scalar list) */
static void case_foreach(void)
{
    enum { N1 = 6, N2 = 3 };
    float a[N1], b[N2], c[N1], d[N2], e[N1], f[N2];
    rnd(a, N1, 1); rnd(b, N2, 1); rnd(c, N1, 1); rnd(d, N2, 1); rnd(e, N1, 1); rnd(f, N2, 1);
    for (int i = 0; i < N1; i++) e[i] = 1.5f + fabsf(e[i]);
    for (int i = 0; i < N2; i++) f[i] = 1.5f + fabsf(f[i]);
    int64_t d1[1] = { N1 }, d2[1] = { N2 }, d0[1] = { 1 };
    void *dA = up(a, sizeof a), *dB = up(b, sizeof b), *dC = up(c, sizeof c), *dD = up(d, sizeof d);
    void *dE = up(e, sizeof e), *dF = up(f, sizeof f);
    float s3 = 3.0f;
    void *dS = up(&s3, 4);
    /* lists own their tensors: one list object per use */
#define L2(pa, pb) ({ const aclTensor *v_[2] = { tens(d1, 1, ACL_FLOAT, pa), tens(d2, 1, ACL_FLOAT, pb) }; \
                      aclCreateTensorList(v_, 2); })
    typedef aclnnStatus (*ws_v2)(const aclTensorList *, const aclScalar *, aclTensorList *, uint64_t *, aclOpExecutor **);
    typedef aclnnStatus (*ws_v1)(const aclTensorList *, const aclTensor *, aclTensorList *, uint64_t *, aclOpExecutor **);
    /* the ScalarList form takes a device tensor of per-element scalars, as
     * op-plugin's ForeachAddcdivTensor passes it */
    typedef aclnnStatus (*ws_cl)(const aclTensorList *, const aclTensorList *, const aclTensorList *,
        const aclTensor *, aclTensorList *, uint64_t *, aclOpExecutor **);
    double half = 0.5;
    aclScalar *sh = aclCreateScalar(&half, ACL_DOUBLE);
    aclTensorList *x = L2(dA, dB), *o = L2(dA, dB);
    RUN("aclnnForeachMulScalarV2", ws_v2, x, sh, o);             /* in place: a *= 0.5 */
    aclTensorList *x1 = L2(dA, dB), *o1 = L2(dA, dB);
    RUN("aclnnForeachMulScalar", ws_v1, x1, tens(d0, 0, ACL_FLOAT, dS), o1);   /* a *= 3 */
    float sv[2] = { 2.0f, -1.0f };
    int64_t dsv[1] = { 2 };
    aclTensor *sl = tens(dsv, 1, ACL_FLOAT, up(sv, sizeof sv));
    aclTensorList *p1 = L2(dA, dB), *p2 = L2(dC, dD), *p3 = L2(dE, dF), *po = L2(dA, dB);
    RUN("aclnnForeachAddcdivScalarList", ws_cl, p1, p2, p3, sl, po);
    float ga[N1], gb[N2];
    down(ga, dA, sizeof ga);
    down(gb, dB, sizeof gb);
    double ra[N1], rb[N2];
    for (int i = 0; i < N1; i++) ra[i] = (double)(float)((float)(a[i] * 0.5f) * 3.0f) + 2.0 * c[i] / e[i];
    for (int i = 0; i < N2; i++) rb[i] = (double)(float)((float)(b[i] * 0.5f) * 3.0f) - 1.0 * d[i] / f[i];
    printf("foreach_err=%.3g\n", fmax(maxerr(ga, ra, N1), maxerr(gb, rb, N2)));
    aclDestroyTensorList(x); aclDestroyTensorList(o); aclDestroyTensorList(x1); aclDestroyTensorList(o1);
    aclDestroyTensorList(p1); aclDestroyTensorList(p2); aclDestroyTensorList(p3); aclDestroyTensorList(po);
#undef L2
}

/* casts and integer arithmetic: float -> int64 truncates; int64 + int64 exact */
static void case_ints(void)
{
    float f[4] = { 2.9f, -2.9f, 1e3f, -0.5f };
    int64_t big[4] = { (int64_t)1 << 60, -7, 5, 0 }, out[4] = {0};
    int64_t d4[1] = { 4 };
    void *dF = up(f, sizeof f), *dI = up(out, sizeof out), *dBig = up(big, sizeof big), *dSum = up(out, sizeof out);
    typedef aclnnStatus (*ws_cast)(const aclTensor *, aclDataType, aclTensor *, uint64_t *, aclOpExecutor **);
    RUN("aclnnCast", ws_cast, tens(d4, 1, ACL_FLOAT, dF), ACL_INT64, tens(d4, 1, ACL_INT64, dI));
    down(out, dI, sizeof out);
    printf("cast_trunc=%lld,%lld,%lld,%lld\n", (long long)out[0], (long long)out[1], (long long)out[2],
        (long long)out[3]);
    int64_t one = 1;
    aclScalar *al = aclCreateScalar(&one, ACL_INT64);
    typedef aclnnStatus (*ws_add)(const aclTensor *, const aclTensor *, const aclScalar *, aclTensor *, uint64_t *,
        aclOpExecutor **);
    RUN("aclnnAdd", ws_add, tens(d4, 1, ACL_INT64, dBig), tens(d4, 1, ACL_INT64, dBig), al, tens(d4, 1, ACL_INT64, dSum));
    down(out, dSum, sizeof out);
    printf("int64_add_exact=%d\n", out[0] == ((int64_t)1 << 61) && out[1] == -14 && out[2] == 10 && out[3] == 0);
}

/* fused AdamW: one step from given state (step tensor = count - 1) */
static void case_adamw(void)
{
    enum { N = 8 };
    float var[N], m[N], v[N], g[N];
    rnd(var, N, 1); rnd(m, N, 0.1f); rnd(g, N, 1);
    for (int i = 0; i < N; i++) v[i] = 0.01f + fabsf(app_rand_f32(&g_seed, 0.1f));
    int64_t step = 4;   /* the 5th update */
    int64_t dn[1] = { N }, d1[1] = { 1 };
    void *dV = up(var, sizeof var), *dM = up(m, sizeof m), *dVV = up(v, sizeof v);
    typedef aclnnStatus (*ws)(aclTensor *, aclTensor *, aclTensor *, aclTensor *, const aclTensor *, const aclTensor *,
        float, float, float, float, float, bool, bool, uint64_t *, aclOpExecutor **);
    RUN("aclnnApplyAdamWV2", ws, tens(dn, 1, ACL_FLOAT, dV), tens(dn, 1, ACL_FLOAT, dM), tens(dn, 1, ACL_FLOAT, dVV),
        NULL, tens(dn, 1, ACL_FLOAT, up(g, sizeof g)), tens(d1, 1, ACL_INT64, up(&step, 8)),
        0.01f, 0.9f, 0.999f, 0.1f, 1e-8f, false, false);
    float got[N];
    down(got, dV, sizeof got);
    double r[N], t = 5, lr = 0.01f, b1 = 0.9f, b2 = 0.999f, wd = 0.1f, eps = 1e-8f;
    for (int i = 0; i < N; i++) {
        double p = var[i] * (1 - lr * wd);
        double mm = m[i] + (g[i] - m[i]) * (1 - b1), vv = b2 * v[i] + (1 - b2) * g[i] * g[i];
        r[i] = p - lr / (1 - pow(b1, t)) * mm / (sqrt(vv) / sqrt(1 - pow(b2, t)) + eps);
    }
    printf("adamw_err=%.3g\n", maxerr(got, r, N));
}

/* GELU and its gradient (exact form) */
static void case_gelu(void)
{
    enum { N = 9 };
    float x[N], dy[N], y[N], dx[N];
    rnd(x, N, 3); rnd(dy, N, 1);
    int64_t dn[1] = { N };
    void *dX = up(x, sizeof x), *dDY = up(dy, sizeof dy), *dYo = up(y, sizeof y), *dDX = up(dx, sizeof dx);
    typedef aclnnStatus (*ws_u)(const aclTensor *, aclTensor *, uint64_t *, aclOpExecutor **);
    typedef aclnnStatus (*ws_b)(const aclTensor *, const aclTensor *, aclTensor *, uint64_t *, aclOpExecutor **);
    RUN("aclnnGelu", ws_u, tens(dn, 1, ACL_FLOAT, dX), tens(dn, 1, ACL_FLOAT, dYo));
    RUN("aclnnGeluBackward", ws_b, tens(dn, 1, ACL_FLOAT, dDY), tens(dn, 1, ACL_FLOAT, dX), tens(dn, 1, ACL_FLOAT, dDX));
    down(y, dYo, sizeof y);
    down(dx, dDX, sizeof dx);
    double ry[N], rdx[N];
    for (int i = 0; i < N; i++) {
        double cdf = 0.5 * (1 + erf(x[i] / sqrt(2.0)));
        ry[i] = x[i] * cdf;
        rdx[i] = dy[i] * (cdf + x[i] * exp(-0.5 * x[i] * x[i]) / sqrt(2 * M_PI));
    }
    printf("gelu_err=%.3g\n", fmax(maxerr(y, ry, N), maxerr(dx, rdx, N)));
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_opapi = dlopen("libopapi.so", RTLD_LAZY);
    if (!g_opapi) app_die(2, "dlopen libopapi.so: %s", dlerror());
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtCreateStream(&g_stream));
    case_loss();
    case_addmm();
    case_foreach();
    case_ints();
    case_adamw();
    case_gelu();
    ACL_CHECK(aclrtSynchronizeStream(g_stream));
    ACL_CHECK(aclrtDestroyStream(g_stream));
    ACL_CHECK(aclFinalize());
    return 0;
}
