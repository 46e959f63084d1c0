/* MLP regression model shared by mlp_train (ACL symbols linked directly) and
 * dlsym_app (every symbol reached through dlopen + dlsym, as torch_npu does).
 * build.rs compiles each .c file in tests/apps as its own program, so the shared code
 * lives here as static functions; the ACL entry points come from a table of
 * function pointers (struct mlp_api) that each program fills its own way.
 *
 * The model: L layers y = x*W + b (ReLU between layers), trained with Adam on a
 * synthetic regression task (targets from a fixed random "teacher" network,
 * a fresh batch every step). Everything runs on the device through operators:
 * forward MatMul/Add/Relu, loss Sub/Mul/ReduceSum/Mul, backward MatMul with
 * transposes, ReduceSum over the batch, ReluGrad, then ApplyAdam on every
 * tensor. The loss is copied back every step. */
#ifndef ACLAPP_MLP_MODEL_H_
#define ACLAPP_MLP_MODEL_H_

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "acl/acl_op_compiler.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_ops.h"
#include "common/common.h"

/* ---- the ACL surface the model uses ---- */
/* Runtime and aclop (libascendcl.so): required by both programs. */
#define MLP_API_RT(X)                                                                               \
    X(aclInit) X(aclFinalize) X(aclrtSetDevice) X(aclrtResetDevice) X(aclrtCreateStream)           \
    X(aclrtDestroyStream) X(aclrtSynchronizeStream) X(aclrtMalloc) X(aclrtFree) X(aclrtMemcpy)     \
    X(aclrtMemcpyAsync) X(aclrtMemsetAsync) X(aclrtGetMemInfo) X(aclCreateTensorDesc)              \
    X(aclDestroyTensorDesc) X(aclCreateDataBuffer) X(aclDestroyDataBuffer) X(aclopCreateAttr)      \
    X(aclopDestroyAttr) X(aclopSetAttrBool) X(aclopSetAttrInt) X(aclopExecuteV2)
/* libacl_op_compiler.so: optional (NULL = every op through aclopExecuteV2). */
#define MLP_API_OPC(X) X(aclopCompileAndExecuteV2)
/* aclnn (libopapi.so, tensors from libnnopbase.so): optional (NULL = the bias
 * add goes through aclop Add). */
#define MLP_API_NN_TENSOR(X) X(aclCreateTensor) X(aclDestroyTensor)
#define MLP_API_NN_SCALAR(X) X(aclCreateScalar) X(aclDestroyScalar)
#define MLP_API_NN_OPS(X) X(aclnnAddGetWorkspaceSize) X(aclnnAdd)

struct mlp_api {
#define MLP_API_MEMBER(f) __typeof__(f) *f;
    MLP_API_RT(MLP_API_MEMBER)
    MLP_API_OPC(MLP_API_MEMBER)
    MLP_API_NN_TENSOR(MLP_API_MEMBER)
    MLP_API_NN_SCALAR(MLP_API_MEMBER)
    MLP_API_NN_OPS(MLP_API_MEMBER)
#undef MLP_API_MEMBER
};

/* ---- configuration ---- */
typedef struct mlp_cfg {
    int layers;
    int64_t hidden;
    int64_t batch, in, out;
    int steps;
    float lr;
    uint64_t seed;
    uint64_t footprint;      /* 0 = not requested */
    double footprint_x;      /* 0 = not requested */
    int64_t max_hidden;      /* footprint planning grows layers beyond this width */
    int hidden_given, layers_given;
} mlp_cfg;

#define MLP_GRANULE (2ull << 20)
#define MLP_SMALL_PAGE 4096ull
#define MLP_TEACHER_HIDDEN 32
/* Initial weights come from a per-tensor pool of random values repeated over
 * the tensor (exactly random when the tensor is smaller than the pool). A prime
 * period keeps rows and columns of large tensors distinct while bounding host
 * memory and work, so footprints of tens of GiB initialise in well under a
 * second (phantom mode) with a small resident set. */
#define MLP_POOL_FLOATS 1048573ull
#define MLP_STAGE_BYTES (4ull << 20)

static void mlp_usage(const char *prog, int default_steps) {
    fprintf(stderr,
        "usage: %s [--layers L] [--hidden H] [--batch B] [--in I] [--out O] [--steps S (%d)]\n"
        "          [--lr F] [--seed N] [--footprint BYTES | --footprint-x X] [--max-hidden H]\n"
        "  --footprint/--footprint-x (a multiple of the device's HBM) choose the hidden size\n"
        "  (or, with --hidden, the layer count) so that weights + grads + Adam moments +\n"
        "  activations reach that device footprint.\n", prog, default_steps);
}

static double mlp_parse_double(const char *s, const char *what) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || *end || !(v > 0) || v > 1e12) app_die(3, "bad %s '%s': expected a positive number", what, s);
    return v;
}

static void mlp_parse(mlp_cfg *c, int argc, char **argv, int default_steps) {
    memset(c, 0, sizeof *c);
    c->layers = 4;
    c->hidden = 256;
    c->batch = 64;
    c->in = 32;
    c->out = 8;
    c->steps = default_steps;
    c->lr = 1e-3f;
    c->seed = 42;
    c->max_hidden = 8192;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--layers"))) { c->layers = (int)app_parse_int(v, "--layers"); c->layers_given = 1; }
        else if ((v = app_opt(argc, argv, &i, "--hidden"))) { c->hidden = app_parse_int(v, "--hidden"); c->hidden_given = 1; }
        else if ((v = app_opt(argc, argv, &i, "--batch"))) c->batch = app_parse_int(v, "--batch");
        else if ((v = app_opt(argc, argv, &i, "--in"))) c->in = app_parse_int(v, "--in");
        else if ((v = app_opt(argc, argv, &i, "--out"))) c->out = app_parse_int(v, "--out");
        else if ((v = app_opt(argc, argv, &i, "--steps"))) c->steps = (int)app_parse_int(v, "--steps");
        else if ((v = app_opt(argc, argv, &i, "--lr"))) c->lr = (float)mlp_parse_double(v, "--lr");
        else if ((v = app_opt(argc, argv, &i, "--seed"))) c->seed = (uint64_t)app_parse_int(v, "--seed");
        else if ((v = app_opt(argc, argv, &i, "--footprint-x"))) c->footprint_x = mlp_parse_double(v, "--footprint-x");
        else if ((v = app_opt(argc, argv, &i, "--footprint"))) c->footprint = app_parse_size(v, "--footprint");
        else if ((v = app_opt(argc, argv, &i, "--max-hidden"))) c->max_hidden = app_parse_int(v, "--max-hidden");
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { mlp_usage(argv[0], default_steps); exit(0); }
        else { mlp_usage(argv[0], default_steps); app_die(3, "unknown argument '%s'", argv[i]); }
    }
    if (c->layers < 1 || c->layers > 100000) app_die(3, "--layers must be in 1..100000");
    if (c->hidden < 1 || c->batch < 1 || c->in < 1 || c->out < 1 || c->max_hidden < 1)
        app_die(3, "--hidden, --batch, --in, --out and --max-hidden must be positive");
    if (c->hidden > (1 << 20) || c->batch > (1 << 20) || c->in > (1 << 20) || c->out > (1 << 20))
        app_die(3, "tensor dimensions above 2^20 are not supported");
    if (c->footprint && c->footprint_x > 0) app_die(3, "give --footprint or --footprint-x, not both");
}

/* ---- memory plan: exactly the allocations mlp_alloc makes ---- */
/* Device bytes one aclrtMalloc(n, ACL_MEM_MALLOC_HUGE_FIRST) takes: the
 * runtime rounds to 32 bytes and adds 32, then uses 4 KiB pages up to 1 MiB and
 * 2 MiB huge pages above. */
static uint64_t mlp_round(uint64_t n) {
    uint64_t padded = (n + 31) / 32 * 32 + 32;
    uint64_t g = padded > (1ull << 20) ? MLP_GRANULE : MLP_SMALL_PAGE;
    return (padded + g - 1) / g * g;
}

static int64_t mlp_din(const mlp_cfg *c, int l) { return l == 0 ? c->in : c->hidden; }
static int64_t mlp_dout(const mlp_cfg *c, int l) { return l == c->layers - 1 ? c->out : c->hidden; }
static int64_t mlp_maxdim(const mlp_cfg *c) {
    int64_t m = c->in > c->out ? c->in : c->out;
    return c->layers > 1 && c->hidden > m ? c->hidden : m;
}

static uint64_t mlp_plan_bytes(const mlp_cfg *c) {
    uint64_t t = 0, B = (uint64_t)c->batch;
    for (int l = 0; l < c->layers; l++) {
        uint64_t w = (uint64_t)mlp_din(c, l) * (uint64_t)mlp_dout(c, l) * 4, b = (uint64_t)mlp_dout(c, l) * 4;
        t += 4 * mlp_round(w) + 4 * mlp_round(b);          /* value, grad, Adam m, Adam v */
        t += mlp_round(B * (uint64_t)mlp_din(c, l) * 4);   /* layer input activation */
    }
    uint64_t bo = B * (uint64_t)c->out * 4;
    t += 4 * mlp_round(bo);                                /* prediction, target, diff, square */
    t += 2 * mlp_round(B * (uint64_t)mlp_maxdim(c) * 4);   /* gradient ping-pong */
    t += 10 * mlp_round(4);                                /* loss sum, loss, 8 scalars */
    return t;
}

/* Picks the hidden width (or, with --hidden, the layer count; or, past
 * --max-hidden, more layers) whose plan first reaches `target` bytes. */
static void mlp_plan_footprint(mlp_cfg *c, uint64_t target) {
    if (!c->hidden_given) {
        mlp_cfg t = *c;
        t.hidden = c->max_hidden;
        if (mlp_plan_bytes(&t) >= target) {
            int64_t lo = 1, hi = c->max_hidden;
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                t.hidden = mid;
                if (mlp_plan_bytes(&t) >= target) hi = mid; else lo = mid + 1;
            }
            c->hidden = lo;
            return;
        }
        c->hidden = c->max_hidden;
        if (c->layers_given) app_die(3, "--footprint %llu needs more than --layers %d at --max-hidden %lld",
                                     (unsigned long long)target, c->layers, (long long)c->max_hidden);
    }
    if (c->layers_given && c->hidden_given)
        app_die(3, "--footprint chooses the hidden size or the layer count: do not give both");
    /* grow the layer count: from 2 layers on, each extra hidden layer adds the
     * same number of bytes */
    mlp_cfg t = *c;
    t.layers = 1;
    if (mlp_plan_bytes(&t) >= target) { c->layers = 1; return; }
    t.layers = 2;
    uint64_t base = mlp_plan_bytes(&t);
    t.layers = 3;
    uint64_t per = mlp_plan_bytes(&t) - base;
    if (base >= target) { c->layers = 2; return; }
    uint64_t extra = (target - base + per - 1) / per;
    if (extra > 100000) app_die(3, "--footprint %llu needs more than 100000 layers", (unsigned long long)target);
    c->layers = 2 + (int)extra;
}

/* ---- device state ---- */
typedef struct mlp {
    const struct mlp_api *api;
    mlp_cfg c;
    aclrtStream s;
    int L;
    void **W, **b, **gW, **gb, **mW, **vW, **mb, **vb;
    void **act;              /* act[0] = X (batch input), act[l] = input of layer l, act[L] = prediction */
    void *Y, *diff, *sq, *lsum, *loss, *g1, *g2;
    void *sc_lr, *sc_b1, *sc_b2, *sc_eps, *sc_b1p, *sc_b2p, *sc_invn, *sc_2n;
    void *ws;                /* aclnn workspace (grown on demand) */
    uint64_t ws_bytes;
    uint64_t allocated;      /* rounded bytes actually allocated */
    float *hx, *hy, *teacher_a, *teacher_b;
} mlp;

static void *mlp_malloc(mlp *m, uint64_t bytes) {
    void *p = NULL;
    ACL_CHECK(m->api->aclrtMalloc(&p, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    m->allocated += mlp_round(bytes);
    return p;
}

static void mlp_upload_scalar(mlp *m, void *dev, float v) {
    ACL_CHECK(m->api->aclrtMemcpy(dev, 4, &v, 4, ACL_MEMCPY_HOST_TO_DEVICE));
}

/* Fills `n` floats at `dev` with uniform [-scale, scale) values from a pool
 * seeded by `seed` (see MLP_POOL_FLOATS). */
static void mlp_init_tensor(mlp *m, void *dev, uint64_t n, float scale, uint64_t seed, float *pool) {
    uint64_t pn = n < MLP_POOL_FLOATS ? n : MLP_POOL_FLOATS;
    uint64_t st = seed;
    for (uint64_t i = 0; i < pn; i++) pool[i] = app_rand_f32(&st, scale);
    for (uint64_t off = 0; off < n; off += pn) {
        uint64_t k = n - off < pn ? n - off : pn;
        ACL_CHECK(m->api->aclrtMemcpy((char *)dev + off * 4, k * 4, pool, k * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    }
}

static void mlp_zero(mlp *m, void *dev, uint64_t bytes) {
    ACL_CHECK(m->api->aclrtMemsetAsync(dev, bytes, 0, bytes, m->s));
}

static void mlp_alloc(mlp *m) {
    const mlp_cfg *c = &m->c;
    int L = m->L = c->layers;
    void ***arrs[] = {&m->W, &m->b, &m->gW, &m->gb, &m->mW, &m->vW, &m->mb, &m->vb};
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
        *arrs[i] = calloc((size_t)L, sizeof(void *));
        if (!*arrs[i]) app_die(1, "out of host memory");
    }
    m->act = calloc((size_t)L + 1, sizeof(void *));
    if (!m->act) app_die(1, "out of host memory");
    uint64_t B = (uint64_t)c->batch;
    for (int l = 0; l < L; l++) {
        uint64_t w = (uint64_t)mlp_din(c, l) * (uint64_t)mlp_dout(c, l) * 4, bb = (uint64_t)mlp_dout(c, l) * 4;
        m->W[l] = mlp_malloc(m, w);
        m->b[l] = mlp_malloc(m, bb);
        m->gW[l] = mlp_malloc(m, w);
        m->gb[l] = mlp_malloc(m, bb);
        m->mW[l] = mlp_malloc(m, w);
        m->vW[l] = mlp_malloc(m, w);
        m->mb[l] = mlp_malloc(m, bb);
        m->vb[l] = mlp_malloc(m, bb);
        m->act[l] = mlp_malloc(m, B * (uint64_t)mlp_din(c, l) * 4);
    }
    uint64_t bo = B * (uint64_t)c->out * 4;
    m->act[L] = mlp_malloc(m, bo);
    m->Y = mlp_malloc(m, bo);
    m->diff = mlp_malloc(m, bo);
    m->sq = mlp_malloc(m, bo);
    m->g1 = mlp_malloc(m, B * (uint64_t)mlp_maxdim(c) * 4);
    m->g2 = mlp_malloc(m, B * (uint64_t)mlp_maxdim(c) * 4);
    void **sc[] = {&m->lsum, &m->loss, &m->sc_lr, &m->sc_b1, &m->sc_b2, &m->sc_eps, &m->sc_b1p, &m->sc_b2p,
                   &m->sc_invn, &m->sc_2n};
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) *sc[i] = mlp_malloc(m, 4);
}

static void mlp_init_params(mlp *m) {
    const mlp_cfg *c = &m->c;
    float *pool = malloc(MLP_POOL_FLOATS * 4);
    if (!pool) app_die(1, "out of host memory");
    for (int l = 0; l < m->L; l++) {
        uint64_t din = (uint64_t)mlp_din(c, l), dout = (uint64_t)mlp_dout(c, l);
        /* He-uniform for ReLU layers, LeCun-uniform for the linear output layer */
        float scale = sqrtf((l == m->L - 1 ? 3.0f : 6.0f) / (float)din);
        mlp_init_tensor(m, m->W[l], din * dout, scale, c->seed * 0x100000001b3ull + 17 * (uint64_t)l + 1, pool);
        mlp_zero(m, m->b[l], dout * 4);
        mlp_zero(m, m->mW[l], din * dout * 4);
        mlp_zero(m, m->vW[l], din * dout * 4);
        mlp_zero(m, m->mb[l], dout * 4);
        mlp_zero(m, m->vb[l], dout * 4);
    }
    free(pool);
    const float beta1 = 0.9f, beta2 = 0.999f;
    mlp_upload_scalar(m, m->sc_lr, c->lr);
    mlp_upload_scalar(m, m->sc_b1, beta1);
    mlp_upload_scalar(m, m->sc_b2, beta2);
    mlp_upload_scalar(m, m->sc_eps, 1e-8f);
    mlp_upload_scalar(m, m->sc_b1p, beta1);   /* beta^t for t = 1 at the first update */
    mlp_upload_scalar(m, m->sc_b2p, beta2);
    float n = (float)(c->batch * c->out);
    mlp_upload_scalar(m, m->sc_invn, 1.0f / n);
    mlp_upload_scalar(m, m->sc_2n, 2.0f / n);

    /* teacher network: targets y = tanh(x*A)*Bt */
    uint64_t st = c->seed ^ 0x7eac4e5ull;
    m->teacher_a = malloc((size_t)(c->in * MLP_TEACHER_HIDDEN) * 4);
    m->teacher_b = malloc((size_t)(MLP_TEACHER_HIDDEN * c->out) * 4);
    m->hx = malloc((size_t)(c->batch * c->in) * 4);
    m->hy = malloc((size_t)(c->batch * c->out) * 4);
    if (!m->teacher_a || !m->teacher_b || !m->hx || !m->hy) app_die(1, "out of host memory");
    for (int64_t i = 0; i < c->in * MLP_TEACHER_HIDDEN; i++) m->teacher_a[i] = app_rand_f32(&st, 1.5f * sqrtf(3.0f / (float)c->in));
    for (int64_t i = 0; i < MLP_TEACHER_HIDDEN * c->out; i++) m->teacher_b[i] = app_rand_f32(&st, sqrtf(3.0f / MLP_TEACHER_HIDDEN));
}

/* A fresh batch every step: x uniform in [-1, 1), y from the teacher. */
static void mlp_make_batch(mlp *m, int step) {
    const mlp_cfg *c = &m->c;
    uint64_t st = (c->seed + 1) * 0x9e3779b97f4a7c15ull + (uint64_t)step * 7919;
    for (int64_t i = 0; i < c->batch * c->in; i++) m->hx[i] = app_rand_f32(&st, 1.0f);
    float h[MLP_TEACHER_HIDDEN];
    for (int64_t r = 0; r < c->batch; r++) {
        const float *x = m->hx + r * c->in;
        for (int t = 0; t < MLP_TEACHER_HIDDEN; t++) {
            float a = 0;
            for (int64_t i = 0; i < c->in; i++) a += x[i] * m->teacher_a[i * MLP_TEACHER_HIDDEN + t];
            h[t] = tanhf(a);
        }
        for (int64_t o = 0; o < c->out; o++) {
            float a = 0;
            for (int t = 0; t < MLP_TEACHER_HIDDEN; t++) a += h[t] * m->teacher_b[t * c->out + o];
            m->hy[r * c->out + o] = a;
        }
    }
}

/* ---- operator launch ---- */
typedef struct mlp_t {
    void *p;
    int nd;
    int64_t d[2];
} mlp_t;

static mlp_t mlp_t1(void *p, int64_t a) { mlp_t t = {p, 1, {a, 0}}; return t; }
static mlp_t mlp_t2(void *p, int64_t a, int64_t b) { mlp_t t = {p, 2, {a, b}}; return t; }

enum { MLP_EXEC = 0, MLP_COMPILE = 1 };

static aclopAttr *mlp_attr(mlp *m) {
    aclopAttr *a = m->api->aclopCreateAttr();
    if (!a) app_die(2, "aclopCreateAttr returned NULL");
    return a;
}

/* Launches `type`; consumes `attr` (NULL = no attributes). route MLP_COMPILE
 * goes through aclopCompileAndExecuteV2 when the table has it. */
static void mlp_op(mlp *m, int route, const char *type, int nin, const mlp_t *in, int nout, const mlp_t *out,
                   aclopAttr *attr) {
    const struct mlp_api *api = m->api;
    aclTensorDesc *id[10], *od[3];
    aclDataBuffer *ib[10], *ob[3];
    if (nin > 10 || nout > 3) app_die(1, "internal: too many operands for %s", type);
    for (int k = 0; k < nin + nout; k++) {
        const mlp_t *t = k < nin ? &in[k] : &out[k - nin];
        size_t bytes = 4;
        for (int d = 0; d < t->nd; d++) bytes *= (size_t)t->d[d];
        aclTensorDesc *desc = api->aclCreateTensorDesc(ACL_FLOAT, t->nd, t->d, ACL_FORMAT_ND);
        aclDataBuffer *buf = api->aclCreateDataBuffer(t->p, bytes);
        if (!desc || !buf) app_die(2, "cannot describe operand %d of %s", k, type);
        if (k < nin) { id[k] = desc; ib[k] = buf; } else { od[k - nin] = desc; ob[k - nin] = buf; }
    }
    if (!attr) attr = mlp_attr(m);
    if (route == MLP_COMPILE && api->aclopCompileAndExecuteV2)
        ACL_CHECK(api->aclopCompileAndExecuteV2(type, nin, id, ib, nout, od, ob, attr, ACL_ENGINE_SYS,
                                                ACL_COMPILE_SYS, NULL, m->s));
    else
        ACL_CHECK(api->aclopExecuteV2(type, nin, id, ib, nout, od, ob, attr, m->s));
    /* the launch copied what it needs: descriptions and buffers are host-side
     * metadata the caller may release right away */
    api->aclopDestroyAttr(attr);
    for (int k = 0; k < nin; k++) { api->aclDestroyTensorDesc(id[k]); ACL_CHECK(api->aclDestroyDataBuffer(ib[k])); }
    for (int k = 0; k < nout; k++) { api->aclDestroyTensorDesc(od[k]); ACL_CHECK(api->aclDestroyDataBuffer(ob[k])); }
}

static void mlp_binop(mlp *m, int route, const char *type, mlp_t a, mlp_t b, mlp_t y) {
    mlp_t in[2] = {a, b};
    mlp_op(m, route, type, 2, in, 1, &y, NULL);
}

static void mlp_matmul(mlp *m, mlp_t a, int ta, mlp_t b, int tb, mlp_t y) {
    aclopAttr *at = mlp_attr(m);
    ACL_CHECK(m->api->aclopSetAttrBool(at, "transpose_x1", (uint8_t)ta));
    ACL_CHECK(m->api->aclopSetAttrBool(at, "transpose_x2", (uint8_t)tb));
    mlp_t in[2] = {a, b};
    mlp_op(m, MLP_EXEC, "MatMul", 2, in, 1, &y, at);
}

static void mlp_reduce_sum(mlp *m, mlp_t x, int64_t axis, mlp_t y) {
    aclopAttr *at = mlp_attr(m);
    ACL_CHECK(m->api->aclopSetAttrInt(at, "axis", axis));
    mlp_op(m, MLP_COMPILE, "ReduceSum", 1, &x, 1, &y, at);
}

static void mlp_sync(mlp *m) { ACL_CHECK(m->api->aclrtSynchronizeStream(m->s)); }

/* z[B,N] += bias[N], in place: aclnnAdd when the table has it (alpha = 1, so
 * the f32 sum is the same as aclop Add's), else aclop Add with broadcasting. */
static void mlp_bias_add(mlp *m, void *z, void *bias, int64_t B, int64_t N) {
    const struct mlp_api *api = m->api;
    if (!api->aclnnAdd) {
        mlp_binop(m, MLP_EXEC, "Add", mlp_t2(z, B, N), mlp_t1(bias, N), mlp_t2(z, B, N));
        return;
    }
    int64_t zd[2] = {B, N}, zs[2] = {N, 1}, zst[1] = {B * N};
    int64_t bd[1] = {N}, bs[1] = {1}, bst[1] = {N};
    aclTensor *self = api->aclCreateTensor(zd, 2, ACL_FLOAT, zs, 0, ACL_FORMAT_ND, zst, 1, z);
    aclTensor *other = api->aclCreateTensor(bd, 1, ACL_FLOAT, bs, 0, ACL_FORMAT_ND, bst, 1, bias);
    aclTensor *out = api->aclCreateTensor(zd, 2, ACL_FLOAT, zs, 0, ACL_FORMAT_ND, zst, 1, z);
    float one = 1.0f;
    aclScalar *alpha = api->aclCreateScalar(&one, ACL_FLOAT);
    if (!self || !other || !out || !alpha) app_die(2, "aclCreateTensor/aclCreateScalar returned NULL");
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    ACL_CHECK(api->aclnnAddGetWorkspaceSize(self, other, alpha, out, &ws, &ex));
    if (ws > m->ws_bytes) {
        /* queued work may still use the old workspace */
        if (m->ws) { mlp_sync(m); ACL_CHECK(api->aclrtFree(m->ws)); }
        m->ws = mlp_malloc(m, ws);
        m->ws_bytes = ws;
    }
    ACL_CHECK(api->aclnnAdd(ws ? m->ws : NULL, ws, ex, m->s));
    ACL_CHECK(api->aclDestroyTensor(self));
    ACL_CHECK(api->aclDestroyTensor(other));
    ACL_CHECK(api->aclDestroyTensor(out));
    ACL_CHECK(api->aclDestroyScalar(alpha));
}

/* Queues one training step; returns after the loss is on the host. */
static float mlp_step(mlp *m, int step) {
    const mlp_cfg *c = &m->c;
    const struct mlp_api *api = m->api;
    int L = m->L;
    int64_t B = c->batch, O = c->out;
    mlp_make_batch(m, step);
    ACL_CHECK(api->aclrtMemcpyAsync(m->act[0], (size_t)(B * c->in) * 4, m->hx, (size_t)(B * c->in) * 4,
                                    ACL_MEMCPY_HOST_TO_DEVICE, m->s));
    ACL_CHECK(api->aclrtMemcpyAsync(m->Y, (size_t)(B * O) * 4, m->hy, (size_t)(B * O) * 4,
                                    ACL_MEMCPY_HOST_TO_DEVICE, m->s));
    /* forward */
    for (int l = 0; l < L; l++) {
        int64_t din = mlp_din(c, l), dout = mlp_dout(c, l);
        mlp_t z = mlp_t2(m->act[l + 1], B, dout);
        mlp_matmul(m, mlp_t2(m->act[l], B, din), 0, mlp_t2(m->W[l], din, dout), 0, z);
        mlp_bias_add(m, m->act[l + 1], m->b[l], B, dout);
        if (l < L - 1) mlp_op(m, MLP_COMPILE, "Relu", 1, &z, 1, &z, NULL);
    }
    /* loss = sum((pred - y)^2) / (B*O); dpred = 2 (pred - y) / (B*O) */
    mlp_binop(m, MLP_COMPILE, "Sub", mlp_t2(m->act[L], B, O), mlp_t2(m->Y, B, O), mlp_t2(m->diff, B, O));
    mlp_binop(m, MLP_EXEC, "Mul", mlp_t2(m->diff, B, O), mlp_t2(m->diff, B, O), mlp_t2(m->sq, B, O));
    mlp_reduce_sum(m, mlp_t2(m->sq, 1, B * O), 1, mlp_t1(m->lsum, 1));
    mlp_binop(m, MLP_EXEC, "Mul", mlp_t1(m->lsum, 1), mlp_t1(m->sc_invn, 1), mlp_t1(m->loss, 1));
    float loss = 0;
    ACL_CHECK(api->aclrtMemcpyAsync(&loss, 4, m->loss, 4, ACL_MEMCPY_DEVICE_TO_HOST, m->s));
    void *g = m->g1, *g2 = m->g2;
    mlp_binop(m, MLP_EXEC, "Mul", mlp_t2(m->diff, B, O), mlp_t1(m->sc_2n, 1), mlp_t2(g, B, O));
    /* backward */
    for (int l = L - 1; l >= 0; l--) {
        int64_t din = mlp_din(c, l), dout = mlp_dout(c, l);
        mlp_t dy = mlp_t2(g, B, dout);
        mlp_matmul(m, mlp_t2(m->act[l], B, din), 1, dy, 0, mlp_t2(m->gW[l], din, dout));   /* dW = x^T dy */
        mlp_reduce_sum(m, dy, 0, mlp_t1(m->gb[l], dout));                                 /* db = sum_b dy */
        if (l > 0) {
            mlp_t dx = mlp_t2(g2, B, din);
            mlp_matmul(m, dy, 0, mlp_t2(m->W[l], din, dout), 1, dx);                     /* dx = dy W^T */
            mlp_binop(m, MLP_COMPILE, "ReluGrad", dx, mlp_t2(m->act[l], B, din), dx);
            void *t = g; g = g2; g2 = t;
        }
    }
    /* Adam on every tensor */
    for (int l = 0; l < L; l++) {
        int64_t din = mlp_din(c, l), dout = mlp_dout(c, l);
        for (int isb = 0; isb < 2; isb++) {
            mlp_t var = isb ? mlp_t1(m->b[l], dout) : mlp_t2(m->W[l], din, dout);
            mlp_t mm = var, vv = var, gg = var;
            mm.p = isb ? m->mb[l] : m->mW[l];
            vv.p = isb ? m->vb[l] : m->vW[l];
            gg.p = isb ? m->gb[l] : m->gW[l];
            mlp_t in[10] = {var, mm, vv, mlp_t1(m->sc_b1p, 1), mlp_t1(m->sc_b2p, 1), mlp_t1(m->sc_lr, 1),
                            mlp_t1(m->sc_b1, 1), mlp_t1(m->sc_b2, 1), mlp_t1(m->sc_eps, 1), gg};
            mlp_t out[3] = {var, mm, vv};
            mlp_op(m, MLP_EXEC, "ApplyAdam", 10, in, 3, out, NULL);
        }
    }
    mlp_binop(m, MLP_EXEC, "Mul", mlp_t1(m->sc_b1p, 1), mlp_t1(m->sc_b1, 1), mlp_t1(m->sc_b1p, 1));
    mlp_binop(m, MLP_EXEC, "Mul", mlp_t1(m->sc_b2p, 1), mlp_t1(m->sc_b2, 1), mlp_t1(m->sc_b2p, 1));
    /* the loss copy and the host batch buffers are in use until the stream drains */
    mlp_sync(m);
    return loss;
}

/* FNV-1a over every weight and bias, streamed through a small host buffer. */
static uint64_t mlp_checksum(mlp *m) {
    const mlp_cfg *c = &m->c;
    unsigned char *stage = malloc(MLP_STAGE_BYTES);
    if (!stage) app_die(1, "out of host memory");
    uint64_t h = APP_FNV_INIT;
    for (int l = 0; l < m->L; l++) {
        for (int isb = 0; isb < 2; isb++) {
            uint64_t n = (isb ? 1 : (uint64_t)mlp_din(c, l)) * (uint64_t)mlp_dout(c, l) * 4;
            const char *src = isb ? m->b[l] : m->W[l];
            for (uint64_t off = 0; off < n; off += MLP_STAGE_BYTES) {
                uint64_t k = n - off < MLP_STAGE_BYTES ? n - off : MLP_STAGE_BYTES;
                ACL_CHECK(m->api->aclrtMemcpy(stage, k, src + off, k, ACL_MEMCPY_DEVICE_TO_HOST));
                h = app_fnv(h, stage, k);
            }
        }
    }
    free(stage);
    return h;
}

static void mlp_free_all(mlp *m) {
    const struct mlp_api *api = m->api;
    for (int l = 0; l < m->L; l++) {
        void *ps[] = {m->W[l], m->b[l], m->gW[l], m->gb[l], m->mW[l], m->vW[l], m->mb[l], m->vb[l], m->act[l]};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) ACL_CHECK(api->aclrtFree(ps[i]));
    }
    void *ps[] = {m->act[m->L], m->Y, m->diff, m->sq, m->g1, m->g2, m->lsum, m->loss, m->sc_lr, m->sc_b1,
                  m->sc_b2, m->sc_eps, m->sc_b1p, m->sc_b2p, m->sc_invn, m->sc_2n};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) ACL_CHECK(api->aclrtFree(ps[i]));
    if (m->ws) ACL_CHECK(api->aclrtFree(m->ws));
    free(m->W); free(m->b); free(m->gW); free(m->gb); free(m->mW); free(m->vW); free(m->mb); free(m->vb);
    free(m->act);
    free(m->hx); free(m->hy); free(m->teacher_a); free(m->teacher_b);
}

/* Phantom mode (the simulator keeps no data) makes the weights meaningless, and
 * hashing tens of GiB would dominate the run: the checksum is skipped there. */
static int mlp_phantom(void) {
    const char *v = getenv("ACLSIM_PHANTOM");
    return v && !strcmp(v, "1");
}

/* The whole program: parse, plan, allocate, train, report. */
static int mlp_main(const struct mlp_api *api, int argc, char **argv, int default_steps) {
    mlp m;
    memset(&m, 0, sizeof m);
    m.api = api;
    mlp_parse(&m.c, argc, argv, default_steps);
    ACL_CHECK(api->aclInit(NULL));
    ACL_CHECK(api->aclrtSetDevice(0));
    if (m.c.footprint_x > 0) {
        size_t free_b = 0, total_b = 0;
        ACL_CHECK(api->aclrtGetMemInfo(ACL_HBM_MEM, &free_b, &total_b));
        m.c.footprint = (uint64_t)(m.c.footprint_x * (double)total_b);
    }
    if (m.c.footprint) mlp_plan_footprint(&m.c, m.c.footprint);
    const mlp_cfg *c = &m.c;
    uint64_t params = 0;
    for (int l = 0; l < c->layers; l++) params += (uint64_t)(mlp_din(c, l) + 1) * (uint64_t)mlp_dout(c, l);
    printf("layers=%d hidden=%lld batch=%lld in=%lld out=%lld steps=%d params=%llu\n", c->layers,
           (long long)c->hidden, (long long)c->batch, (long long)c->in, (long long)c->out, c->steps,
           (unsigned long long)params);
    printf("footprint_bytes=%llu\n", (unsigned long long)mlp_plan_bytes(c));
    fflush(stdout);
    ACL_CHECK(api->aclrtCreateStream(&m.s));
    mlp_alloc(&m);
    mlp_init_params(&m);
    float loss = 0;
    for (int s = 0; s < c->steps; s++) {
        loss = mlp_step(&m, s);
        printf("step=%d loss=%.9g\n", s, loss);
        fflush(stdout);
    }
    mlp_sync(&m);
    if (c->steps > 0) printf("final_loss=%.9g\n", loss);
    if (mlp_phantom()) {
        printf("checksum=none (phantom mode keeps no data)\n");
    } else {
        printf("checksum=%016llx\n", (unsigned long long)mlp_checksum(&m));
    }
    printf("allocated_bytes=%llu\n", (unsigned long long)m.allocated);
    mlp_free_all(&m);
    ACL_CHECK(api->aclrtDestroyStream(m.s));
    ACL_CHECK(api->aclrtResetDevice(0));
    ACL_CHECK(api->aclFinalize());
    return 0;
}

#endif
