/* Operator kernels: validation (launch time, on the calling thread) and
 * computation (on the stream worker). See docs/simulator-ops.md.
 *
 * Every kernel reads its inputs in full before it writes any output: inputs
 * are used in place only when they are contiguous f32 and do not overlap an
 * output; otherwise they are first gathered into a private buffer. So aliased
 * (in-place) outputs and strided views are both well defined. */
#include "rt/kernels.h"
#include "rt/kernels_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ helpers */

const char *kern_dtype_name(int dt)
{
    switch (dt) {
    case ACL_FLOAT: return "float32";
    case ACL_FLOAT16: return "float16";
    case ACL_BF16: return "bfloat16";
    case ACL_DOUBLE: return "float64";
    case ACL_INT8: return "int8";
    case ACL_UINT8: return "uint8";
    case ACL_INT16: return "int16";
    case ACL_UINT16: return "uint16";
    case ACL_INT32: return "int32";
    case ACL_UINT32: return "uint32";
    case ACL_INT64: return "int64";
    case ACL_UINT64: return "uint64";
    case ACL_BOOL: return "bool";
    case ACL_STRING: return "string";
    case ACL_COMPLEX64: return "complex64";
    case ACL_COMPLEX128: return "complex128";
    case ACL_COMPLEX32: return "complex32";
    case ACL_INT4: return "int4";
    case ACL_UINT1: return "uint1";
    case ACL_HIFLOAT8: return "hifloat8";
    case ACL_FLOAT8_E5M2: return "float8_e5m2";
    case ACL_FLOAT8_E4M3FN: return "float8_e4m3fn";
    case ACL_FLOAT8_E8M0: return "float8_e8m0";
    default: {
        static __thread char buf[24];
        snprintf(buf, sizeof buf, "dtype%d", dt);
        return buf;
    }
    }
}

static size_t sig_tensors(char *buf, size_t n, size_t used, const char *label, const sim_tensor *t, int cnt)
{
    if (used < n) used += (size_t)snprintf(buf + used, n - used, "%s", label);
    for (int i = 0; i < cnt && used < n; i++) {
        used += (size_t)snprintf(buf + used, n - used, "%s%s[", i ? ", " : " ", kern_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim && used < n; d++)
            used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? "," : "", (long long)t[i].dims[d]);
        if (used < n) used += (size_t)snprintf(buf + used, n - used, "]");
    }
    if (!cnt && used < n) used += (size_t)snprintf(buf + used, n - used, " none");
    return used;
}

void kern_signature(const sim_op_args *a, char *buf, size_t n)
{
    if (!n) return;
    buf[0] = 0;
    size_t used = sig_tensors(buf, n, 0, "inputs", a->in, a->nin);
    sig_tensors(buf, n, used, "; outputs", a->out, a->nout);
}

void kern_refuse(const sim_op_args *a, const char *why, aclError code)
{
    char sig[512];
    kern_signature(a, sig, sizeof sig);
    aclsim_log("operator %s refused (%s): %s -> %d", a->op_type, why, sig, code);
}

const sim_attr *kern_attr(const sim_op_args *a, const char *name)
{
    const sim_attr *found = NULL;
    for (int i = 0; i < a->nattrs; i++)
        if (strcmp(a->attrs[i].name, name) == 0) found = &a->attrs[i];
    return found;
}

int64_t kern_attr_int(const sim_op_args *a, const char *name, int64_t def)
{
    const sim_attr *at = kern_attr(a, name);
    if (!at) return def;
    return at->type == SIM_ATTR_FLOAT ? (int64_t)at->f : at->i;
}

float kern_attr_float(const sim_op_args *a, const char *name, float def)
{
    const sim_attr *at = kern_attr(a, name);
    if (!at) return def;
    return at->type == SIM_ATTR_FLOAT ? at->f : (float)at->i;
}

uint64_t kern_numel(const sim_tensor *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->dims[i];
    return n;
}

uint64_t kern_view_bytes(const sim_tensor *t)
{
    size_t es = kern_dtype_size(t->dtype);
    if (es) return kern_numel(t) * es;
    uintptr_t end = (uintptr_t)t->base + t->bytes, d = (uintptr_t)t->data;
    return end > d ? end - d : 0;
}

int kern_is_contiguous(const sim_tensor *t)
{
    int64_t want = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->dims[i] != 1 && t->strides[i] != want) return 0;
        want *= t->dims[i];
    }
    return 1;
}

/* Offset (in elements) of the last element of the view, or -1 if empty. */
static int64_t last_offset(const sim_tensor *t)
{
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->dims[i] == 0) return -1;
        off += (t->dims[i] - 1) * t->strides[i];
    }
    return off;
}

aclError kern_check_tensor(const sim_tensor *t, const char *what)
{
    if (t->ndim < 0 || t->ndim > SIM_MAX_DIMS) {
        aclsim_log("%s: %d dimensions (the simulator supports 0..%d)", what, t->ndim, SIM_MAX_DIMS);
        return ACL_ERROR_INVALID_PARAM;
    }
    for (int i = 0; i < t->ndim; i++) {
        if (t->dims[i] < 0 || t->strides[i] < 0) {
            aclsim_log("%s: dim %d has size %lld stride %lld (negative)", what, i, (long long)t->dims[i],
                (long long)t->strides[i]);
            return ACL_ERROR_INVALID_PARAM;
        }
        /* keep every later product far from overflow */
        if (t->dims[i] > ((int64_t)1 << 40) || t->strides[i] > ((int64_t)1 << 40)) {
            aclsim_log("%s: dim %d size %lld stride %lld is absurd", what, i, (long long)t->dims[i],
                (long long)t->strides[i]);
            return ACL_ERROR_INVALID_PARAM;
        }
    }
    int64_t last = last_offset(t);
    if (last < 0) return ACL_SUCCESS;        /* empty view touches nothing */
    size_t es = kern_dtype_size(t->dtype);
    if (es == 0) es = 1;
    if (!t->data) {
        aclsim_log("%s: NULL data for a non-empty tensor", what);
        return ACL_ERROR_INVALID_PARAM;
    }
    uintptr_t base = (uintptr_t)t->base, data = (uintptr_t)t->data;
    unsigned __int128 end = (unsigned __int128)data + ((unsigned __int128)last + 1) * es;
    if (data < base || end > (unsigned __int128)base + t->bytes) {
        aclsim_log("%s: view [%#lx, +%llu) lies outside its storage [%#lx, +%zu)", what, (unsigned long)data,
            (unsigned long long)(end - data), (unsigned long)base, t->bytes);
        return ACL_ERROR_INVALID_PARAM;
    }
    return ACL_SUCCESS;
}

/* Calls row(ctx, elem_offset, n, stride, dst_index) for each innermost row of
 * the view, in row-major order. */
typedef void (*row_fn)(void *ctx, int64_t off, int64_t n, int64_t stride, uint64_t idx);

static void for_each_row(const sim_tensor *t, row_fn fn, void *ctx)
{
    if (t->ndim == 0) { fn(ctx, 0, 1, 1, 0); return; }
    uint64_t numel = kern_numel(t);
    if (numel == 0) return;
    int nd = t->ndim;
    int64_t inner = t->dims[nd - 1], istride = t->strides[nd - 1];
    int64_t idx[SIM_MAX_DIMS] = {0};
    int64_t off = 0;
    for (uint64_t pos = 0; pos < numel; pos += (uint64_t)inner) {
        fn(ctx, off, inner, istride, pos);
        for (int k = nd - 2; k >= 0; k--) {
            off += t->strides[k];
            if (++idx[k] < t->dims[k]) break;
            off -= t->strides[k] * t->dims[k];
            idx[k] = 0;
        }
    }
}

typedef struct { const sim_tensor *t; float *f; unsigned char *b; size_t es; } xfer_ctx;

static void gather_row(void *c, int64_t off, int64_t n, int64_t st, uint64_t idx)
{
    xfer_ctx *x = c;
    float *dst = x->f + idx;
    switch (x->t->dtype) {
    case ACL_FLOAT: {
        const float *src = (const float *)x->t->data + off;
        if (st == 1) memcpy(dst, src, (size_t)n * 4);
        else for (int64_t j = 0; j < n; j++) dst[j] = src[j * st];
        break;
    }
    case ACL_FLOAT16: {
        const uint16_t *src = (const uint16_t *)x->t->data + off;
        for (int64_t j = 0; j < n; j++) dst[j] = kern_f16_to_f32(src[j * st]);
        break;
    }
    case ACL_BF16: {
        const uint16_t *src = (const uint16_t *)x->t->data + off;
        for (int64_t j = 0; j < n; j++) dst[j] = kern_bf16_to_f32(src[j * st]);
        break;
    }
    }
}

static void scatter_row(void *c, int64_t off, int64_t n, int64_t st, uint64_t idx)
{
    xfer_ctx *x = c;
    const float *src = x->f + idx;
    switch (x->t->dtype) {
    case ACL_FLOAT: {
        float *dst = (float *)x->t->data + off;
        if (st == 1) memmove(dst, src, (size_t)n * 4);
        else for (int64_t j = 0; j < n; j++) dst[j * st] = src[j];
        break;
    }
    case ACL_FLOAT16: {
        uint16_t *dst = (uint16_t *)x->t->data + off;
        for (int64_t j = 0; j < n; j++) dst[j * st] = kern_f32_to_f16(src[j]);
        break;
    }
    case ACL_BF16: {
        uint16_t *dst = (uint16_t *)x->t->data + off;
        for (int64_t j = 0; j < n; j++) dst[j * st] = kern_f32_to_bf16(src[j]);
        break;
    }
    }
}

static void gather_bytes_row(void *c, int64_t off, int64_t n, int64_t st, uint64_t idx)
{
    xfer_ctx *x = c;
    const unsigned char *src = (const unsigned char *)x->t->data + off * (int64_t)x->es;
    unsigned char *dst = x->b + idx * x->es;
    if (st == 1) memcpy(dst, src, (size_t)n * x->es);
    else for (int64_t j = 0; j < n; j++) memcpy(dst + j * x->es, src + j * st * (int64_t)x->es, x->es);
}

static void scatter_bytes_row(void *c, int64_t off, int64_t n, int64_t st, uint64_t idx)
{
    xfer_ctx *x = c;
    unsigned char *dst = (unsigned char *)x->t->data + off * (int64_t)x->es;
    const unsigned char *src = x->b + idx * x->es;
    if (st == 1) memcpy(dst, src, (size_t)n * x->es);
    else for (int64_t j = 0; j < n; j++) memcpy(dst + j * st * (int64_t)x->es, src + j * x->es, x->es);
}

/* [lo, hi) address span the view touches (empty: lo == hi). */
static void view_span(const sim_tensor *t, uintptr_t *lo, uintptr_t *hi)
{
    int64_t last = last_offset(t);
    size_t es = kern_dtype_size(t->dtype);
    *lo = (uintptr_t)t->data;
    *hi = last < 0 ? *lo : *lo + (uintptr_t)(last + 1) * (es ? es : 1);
}

static int overlaps_output(const sim_op_args *a, const sim_tensor *t)
{
    uintptr_t lo, hi;
    view_span(t, &lo, &hi);
    if (lo == hi) return 0;
    for (int j = 0; j < a->nout; j++) {
        uintptr_t olo, ohi;
        view_span(&a->out[j], &olo, &ohi);
        if (olo < hi && lo < ohi) return 1;
    }
    return 0;
}

/* A contiguous f32 copy of view `t` in row-major order. Points into device
 * memory when that is safe (contiguous f32, no overlap with an output),
 * otherwise into a private buffer (*owned set). NULL on allocation failure. */
static const float *in_f32(const sim_op_args *a, const sim_tensor *t, float **owned)
{
    *owned = NULL;
    if (t->dtype == ACL_FLOAT && kern_is_contiguous(t) && !overlaps_output(a, t)) return (const float *)t->data;
    uint64_t n = kern_numel(t);
    float *buf = malloc((n ? n : 1) * sizeof(float));
    if (!buf) return NULL;
    xfer_ctx x = { t, buf, NULL, 0 };
    for_each_row(t, gather_row, &x);
    *owned = buf;
    return buf;
}

/* Destination for a computed output: the output itself when contiguous f32,
 * else a private buffer that out_f32_done() scatters. */
static float *out_f32(const sim_tensor *t, float **owned)
{
    *owned = NULL;
    if (t->dtype == ACL_FLOAT && kern_is_contiguous(t)) return (float *)t->data;
    uint64_t n = kern_numel(t);
    *owned = malloc((n ? n : 1) * sizeof(float));
    return *owned;
}

static void out_f32_done(const sim_tensor *t, float *owned)
{
    if (!owned) return;
    xfer_ctx x = { t, owned, NULL, 0 };
    for_each_row(t, scatter_row, &x);
    free(owned);
}

static aclError oom(const sim_op_args *a)
{
    aclsim_log("%s: out of host memory for the kernel's scratch buffers", a->op_type);
    return ACL_ERROR_RT_AICORE_EXCEPTION;
}

/* --------------------------------------------------------- shared checks */

static aclError need_float(const sim_op_args *a, const sim_tensor *t, const char *role)
{
    if (!kern_float_dtype(t->dtype)) {
        char why[96];
        snprintf(why, sizeof why, "%s is %s; supported: float32, float16, bfloat16", role,
            kern_dtype_name(t->dtype));
        kern_refuse(a, why, ACL_ERROR_UNSUPPORTED_DATA_TYPE);
        return ACL_ERROR_UNSUPPORTED_DATA_TYPE;
    }
    return ACL_SUCCESS;
}

static aclError need_all_float(const sim_op_args *a, int nin)
{
    aclError e;
    for (int i = 0; i < nin && i < a->nin; i++)
        if ((e = need_float(a, &a->in[i], "an input"))) return e;
    for (int j = 0; j < a->nout; j++)
        if ((e = need_float(a, &a->out[j], "an output"))) return e;
    return ACL_SUCCESS;
}

static int same_shape(const sim_tensor *x, const sim_tensor *y)
{
    if (x->ndim != y->ndim) return 0;
    for (int i = 0; i < x->ndim; i++)
        if (x->dims[i] != y->dims[i]) return 0;
    return 1;
}

static void shape_str(const sim_tensor *t, char *buf, size_t n)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? "," : "", (long long)t->dims[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
}

static aclError shape_error(const sim_op_args *a, const char *why, const sim_tensor *x, const sim_tensor *y)
{
    char s1[128], s2[128];
    shape_str(x, s1, sizeof s1);
    shape_str(y, s2, sizeof s2);
    aclsim_log("%s: %s (%s vs %s)", a->op_type, why, s1, s2);
    return ACL_ERROR_INVALID_PARAM;
}

/* Normalises axis (negative counts from the end) for rank `nd`; -1 if out of range. */
static int norm_axis(int64_t axis, int nd)
{
    if (axis < 0) axis += nd;
    return (axis < 0 || axis >= nd) ? -1 : (int)axis;
}

/* ---------------------------------------------------------------- MatMul */

typedef struct mm_geom {
    int64_t batch, m, k, n;
    int ta, tb;
} mm_geom;

static int is_batch(const sim_op_args *a) { return strcmp(a->op_type, "BatchMatMul") == 0 || strcmp(a->op_type, "BatchMatMulV2") == 0; }

static void mm_flags(const sim_op_args *a, int *ta, int *tb)
{
    if (is_batch(a)) {
        *ta = kern_attr_int(a, "adj_x1", 0) != 0;
        *tb = kern_attr_int(a, "adj_x2", 0) != 0;
    } else {
        *ta = kern_attr_int(a, "transpose_x1", 0) != 0;
        *tb = kern_attr_int(a, "transpose_x2", 0) != 0;
    }
}

static aclError mm_shape(const sim_op_args *a, mm_geom *g)
{
    const sim_tensor *x1 = &a->in[0], *x2 = &a->in[1], *y = &a->out[0];
    int batched = is_batch(a);
    int nd = x1->ndim;
    if (batched ? (nd < 3) : (nd != 2))
        return shape_error(a, batched ? "x1 must have a batch dim and 2 matrix dims" : "x1 must be 2-D", x1, x1);
    if (x2->ndim != nd || y->ndim != nd) return shape_error(a, "x1, x2 and y must have the same rank", x2, y);
    g->batch = 1;
    for (int i = 0; i < nd - 2; i++) {
        if (x2->dims[i] != x1->dims[i] || y->dims[i] != x1->dims[i])
            return shape_error(a, "batch dims differ", x1, x2);
        g->batch *= x1->dims[i];
    }
    mm_flags(a, &g->ta, &g->tb);
    int64_t m = g->ta ? x1->dims[nd - 1] : x1->dims[nd - 2];
    int64_t k = g->ta ? x1->dims[nd - 2] : x1->dims[nd - 1];
    int64_t k2 = g->tb ? x2->dims[nd - 1] : x2->dims[nd - 2];
    int64_t n = g->tb ? x2->dims[nd - 2] : x2->dims[nd - 1];
    if (k != k2) return shape_error(a, "inner dims of x1 and x2 differ", x1, x2);
    if (y->dims[nd - 2] != m || y->dims[nd - 1] != n) return shape_error(a, "y is not [M,N]", x1, y);
    if (a->nin == 3) {
        const sim_tensor *bias = &a->in[2];
        uint64_t bn = kern_numel(bias);
        if (!(bn == 1 || (bias->ndim >= 1 && bias->dims[bias->ndim - 1] == n && bn == (uint64_t)n)))
            return shape_error(a, "bias must be [N]", bias, y);
    }
    g->m = m; g->k = k; g->n = n;
    return ACL_SUCCESS;
}

static aclError matmul_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    mm_geom g;
    if ((e = kn_counts(a, 2, 3, 1, 1)) || (e = need_all_float(a, a->nin)) || (e = mm_shape(a, &g))) return e;
    *flops = 2ull * (uint64_t)g.batch * (uint64_t)g.m * (uint64_t)g.n * (uint64_t)g.k;
    return ACL_SUCCESS;
}

/* View of the last two dims swapped (a transposed operand). */
static sim_tensor swapped(const sim_tensor *t)
{
    sim_tensor v = *t;
    int nd = t->ndim;
    v.dims[nd - 1] = t->dims[nd - 2]; v.dims[nd - 2] = t->dims[nd - 1];
    v.strides[nd - 1] = t->strides[nd - 2]; v.strides[nd - 2] = t->strides[nd - 1];
    return v;
}

/* The library is built at -O2; the GEMM inner loop is ~3x faster vectorised,
 * and programs run thousands of MatMuls. */
#if defined(__GNUC__) && !defined(__clang__)
#define KERN_VECTORIZE __attribute__((optimize("O3")))
#else
#define KERN_VECTORIZE
#endif

/* C[m,n] = A[m,k] * B[k,n], row-major, i-k-j order so the inner loop streams
 * rows of B and C. */
static KERN_VECTORIZE void gemm(const float *restrict A, const float *restrict B, float *restrict C, int64_t m, int64_t k, int64_t n)
{
    for (int64_t i = 0; i < m; i++) {
        float *restrict c = C + i * n;
        for (int64_t j = 0; j < n; j++) c[j] = 0.0f;
        const float *arow = A + i * k;
        for (int64_t p = 0; p < k; p++) {
            const float av = arow[p];
            const float *restrict b = B + p * n;
            for (int64_t j = 0; j < n; j++) c[j] += av * b[j];
        }
    }
}

static aclError matmul_run(const sim_op_args *a)
{
    mm_geom g;
    if (mm_shape(a, &g)) return ACL_ERROR_RT_AICORE_EXCEPTION;
    sim_tensor va = g.ta ? swapped(&a->in[0]) : a->in[0];
    sim_tensor vb = g.tb ? swapped(&a->in[1]) : a->in[1];
    float *oa, *ob, *ob2 = NULL, *oy;
    const float *A = in_f32(a, &va, &oa);
    const float *B = A ? in_f32(a, &vb, &ob) : NULL;
    const float *bias = NULL;
    if (B && a->nin == 3) bias = in_f32(a, &a->in[2], &ob2);
    float *Y = (B && (a->nin < 3 || bias)) ? out_f32(&a->out[0], &oy) : NULL;
    if (!Y) { free(oa); free(ob); free(ob2); return oom(a); }
    for (int64_t b = 0; b < g.batch; b++) {
        float *c = Y + b * g.m * g.n;
        gemm(A + b * g.m * g.k, B + b * g.k * g.n, c, g.m, g.k, g.n);
        if (bias) {
            uint64_t bn = kern_numel(&a->in[2]);
            for (int64_t i = 0; i < g.m; i++)
                for (int64_t j = 0; j < g.n; j++) c[i * g.n + j] += bias[bn == 1 ? 0 : j];
        }
    }
    out_f32_done(&a->out[0], oy);
    free(oa); free(ob); free(ob2);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------ binary elementwise */

/* Numpy broadcasting: x viewed with y's shape (stride 0 on broadcast dims).
 * 0 if x does not broadcast to y. */
static int broadcast_view(const sim_tensor *x, const sim_tensor *y, sim_tensor *v)
{
    if (x->ndim > y->ndim) return 0;
    *v = *x;
    v->ndim = y->ndim;
    int off = y->ndim - x->ndim;
    for (int i = 0; i < y->ndim; i++) {
        v->dims[i] = y->dims[i];
        if (i < off) { v->strides[i] = 0; continue; }
        int64_t d = x->dims[i - off];
        if (d == y->dims[i]) v->strides[i] = x->strides[i - off];
        else if (d == 1) v->strides[i] = 0;
        else return 0;
    }
    return 1;
}

enum { BIN_ADD, BIN_SUB, BIN_MUL };   /* also kern_int_binary_run's kinds */

static int bin_kind(const char *t)
{
    if (!strcmp(t, "Sub")) return BIN_SUB;
    if (!strcmp(t, "Mul")) return BIN_MUL;
    return BIN_ADD;
}

/* 1 if every input and output has an integer (or bool) element type: the
 * integer path of kernels_nn.c computes it exactly in int64. */
static int all_int(const sim_op_args *a)
{
    for (int i = 0; i < a->nin; i++)
        if (!kern_int_dtype(a->in[i].dtype)) return 0;
    for (int j = 0; j < a->nout; j++)
        if (!kern_int_dtype(a->out[j].dtype)) return 0;
    return a->nin + a->nout > 0;
}

static aclError binary_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 2, 2, 1, 1))) return e;
    if (!all_int(a) && (e = need_all_float(a, 2))) return e;
    const sim_tensor *y = &a->out[0];
    /* y must be exactly the broadcast shape of x1 and x2 */
    int nd = a->in[0].ndim > a->in[1].ndim ? a->in[0].ndim : a->in[1].ndim;
    if (y->ndim != nd) return shape_error(a, "y is not the broadcast shape of x1 and x2", &a->in[0], &a->in[1]);
    for (int i = 0; i < nd; i++) {
        int64_t want = 1;
        for (int s = 0; s < 2; s++) {
            const sim_tensor *x = &a->in[s];
            int k = i - (nd - x->ndim);
            if (k < 0) continue;
            int64_t d = x->dims[k];
            if (d != 1) {
                if (want != 1 && want != d)
                    return shape_error(a, "x1 and x2 do not broadcast", &a->in[0], &a->in[1]);
                want = d;
            }
        }
        /* a dim of 0 in either input (and 1 in the other) gives 0 */
        if (y->dims[i] != want) return shape_error(a, "y is not the broadcast shape of x1 and x2", &a->in[0], y);
    }
    *flops = kern_numel(y);
    return ACL_SUCCESS;
}

static aclError binary_run(const sim_op_args *a)
{
    if (all_int(a)) return kern_int_binary_run(a, bin_kind(a->op_type));
    const sim_tensor *y = &a->out[0];
    sim_tensor v1, v2;
    if (!broadcast_view(&a->in[0], y, &v1) || !broadcast_view(&a->in[1], y, &v2)) return ACL_ERROR_RT_AICORE_EXCEPTION;
    float *o1, *o2, *oy;
    const float *x1 = in_f32(a, &v1, &o1);
    const float *x2 = x1 ? in_f32(a, &v2, &o2) : NULL;
    float *out = x2 ? out_f32(y, &oy) : NULL;
    if (!out) { free(o1); free(o2); return oom(a); }
    uint64_t n = kern_numel(y);
    float alpha = kern_attr_float(a, "alpha", 1.0f);   /* aclnnAdd/aclnnSub: x1 op alpha*x2 */
    switch (bin_kind(a->op_type)) {
    case BIN_ADD:
        if (alpha == 1.0f) for (uint64_t i = 0; i < n; i++) out[i] = x1[i] + x2[i];
        else for (uint64_t i = 0; i < n; i++) out[i] = x1[i] + alpha * x2[i];
        break;
    case BIN_SUB:
        if (alpha == 1.0f) for (uint64_t i = 0; i < n; i++) out[i] = x1[i] - x2[i];
        else for (uint64_t i = 0; i < n; i++) out[i] = x1[i] - alpha * x2[i];
        break;
    case BIN_MUL:
        for (uint64_t i = 0; i < n; i++) out[i] = x1[i] * x2[i];
        break;
    }
    out_f32_done(y, oy);
    free(o1); free(o2);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------ Relu family */

static aclError relu_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = need_all_float(a, 1))) return e;
    if (!same_shape(&a->in[0], &a->out[0])) return shape_error(a, "x and y differ", &a->in[0], &a->out[0]);
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError relu_run(const sim_op_args *a)
{
    float *ox, *oy;
    const float *x = in_f32(a, &a->in[0], &ox);
    float *y = x ? out_f32(&a->out[0], &oy) : NULL;
    if (!y) { free(ox); return oom(a); }
    uint64_t n = kern_numel(&a->out[0]);
    for (uint64_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    out_f32_done(&a->out[0], oy);
    free(ox);
    return ACL_SUCCESS;
}

static aclError relugrad_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 2, 2, 1, 1)) || (e = need_all_float(a, 2))) return e;
    if (!same_shape(&a->in[0], &a->in[1])) return shape_error(a, "gradients and features differ", &a->in[0], &a->in[1]);
    if (!same_shape(&a->in[0], &a->out[0])) return shape_error(a, "gradients and backprops differ", &a->in[0], &a->out[0]);
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError relugrad_run(const sim_op_args *a)
{
    float *og, *of, *oy;
    const float *g = in_f32(a, &a->in[0], &og);
    const float *f = g ? in_f32(a, &a->in[1], &of) : NULL;
    float *y = f ? out_f32(&a->out[0], &oy) : NULL;
    if (!y) { free(og); free(of); return oom(a); }
    uint64_t n = kern_numel(&a->out[0]);
    for (uint64_t i = 0; i < n; i++) y[i] = f[i] > 0.0f ? g[i] : 0.0f;
    out_f32_done(&a->out[0], oy);
    free(og); free(of);
    return ACL_SUCCESS;
}

/* --------------------------------------------------------------- Softmax */

/* [outer, d, inner] split of a shape around `axis`. */
static void split3(const sim_tensor *t, int axis, uint64_t *outer, uint64_t *d, uint64_t *inner)
{
    *outer = 1; *inner = 1; *d = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (i < axis) *outer *= (uint64_t)t->dims[i];
        else if (i == axis) *d = (uint64_t)t->dims[i];
        else *inner *= (uint64_t)t->dims[i];
    }
}

static aclError softmax_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = need_all_float(a, 1))) return e;
    if (!same_shape(&a->in[0], &a->out[0])) return shape_error(a, "x and y differ", &a->in[0], &a->out[0]);
    int nd = a->in[0].ndim;
    if (nd > 0 && norm_axis(kern_attr_int(a, "axis", -1), nd) < 0) {
        aclsim_log("%s: axis %lld out of range for rank %d", a->op_type, (long long)kern_attr_int(a, "axis", -1), nd);
        return ACL_ERROR_INVALID_PARAM;
    }
    *flops = 5 * kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError softmax_run(const sim_op_args *a)
{
    const sim_tensor *xt = &a->in[0];
    int axis = xt->ndim ? norm_axis(kern_attr_int(a, "axis", -1), xt->ndim) : 0;
    uint64_t outer, d, inner;
    split3(xt, axis, &outer, &d, &inner);
    float *ox, *oy;
    const float *x = in_f32(a, xt, &ox);
    float *y = x ? out_f32(&a->out[0], &oy) : NULL;
    if (!y) { free(ox); return oom(a); }
    for (uint64_t o = 0; o < outer; o++) {
        for (uint64_t in = 0; in < inner; in++) {
            const float *xr = x + o * d * inner + in;
            float *yr = y + o * d * inner + in;
            float mx = -INFINITY;
            for (uint64_t i = 0; i < d; i++) if (xr[i * inner] > mx) mx = xr[i * inner];
            double sum = 0;
            for (uint64_t i = 0; i < d; i++) {
                float e = expf(xr[i * inner] - mx);
                yr[i * inner] = e;
                sum += e;
            }
            float inv = (float)(1.0 / sum);
            for (uint64_t i = 0; i < d; i++) yr[i * inner] *= inv;
        }
    }
    out_f32_done(&a->out[0], oy);
    free(ox);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------- ReduceSum */

static aclError reducesum_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = need_all_float(a, 1))) return e;
    const sim_tensor *x = &a->in[0];
    int64_t ax = kern_attr_int(a, "axis", 0);
    int axis = norm_axis(ax, x->ndim);
    if (axis < 0) {
        aclsim_log("%s: axis %lld out of range for rank %d", a->op_type, (long long)ax, x->ndim);
        return ACL_ERROR_INVALID_PARAM;
    }
    uint64_t outer, d, inner;
    split3(x, axis, &outer, &d, &inner);
    if (kern_numel(&a->out[0]) != outer * inner) return shape_error(a, "y does not hold x without the reduced axis", x, &a->out[0]);
    *flops = kern_numel(x);
    return ACL_SUCCESS;
}

static aclError reducesum_run(const sim_op_args *a)
{
    const sim_tensor *xt = &a->in[0];
    int axis = norm_axis(kern_attr_int(a, "axis", 0), xt->ndim);
    uint64_t outer, d, inner;
    split3(xt, axis, &outer, &d, &inner);
    float *ox, *oy;
    const float *x = in_f32(a, xt, &ox);
    float *y = x ? out_f32(&a->out[0], &oy) : NULL;
    if (!y) { free(ox); return oom(a); }
    for (uint64_t o = 0; o < outer; o++)
        for (uint64_t in = 0; in < inner; in++) {
            double s = 0;
            for (uint64_t i = 0; i < d; i++) s += x[(o * d + i) * inner + in];
            y[o * inner + in] = (float)s;
        }
    out_f32_done(&a->out[0], oy);
    free(ox);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------------ Fill */

static aclError fill_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 0, 1 << 20, 1, 1))) return e;
    if (!kern_int_dtype(a->out[0].dtype) && (e = need_float(a, &a->out[0], "y"))) return e;
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError fill_run(const sim_op_args *a)
{
    if (kern_int_dtype(a->out[0].dtype)) return kern_int_fill_run(a);
    float *oy;
    float *y = out_f32(&a->out[0], &oy);
    if (!y) return oom(a);
    float v = kern_attr_float(a, "value", 0.0f);
    uint64_t n = kern_numel(&a->out[0]);
    for (uint64_t i = 0; i < n; i++) y[i] = v;
    out_f32_done(&a->out[0], oy);
    return ACL_SUCCESS;
}

/* -------------------------------------------------------------- ApplyAdam */

enum { AD_VAR, AD_M, AD_V, AD_B1P, AD_B2P, AD_LR, AD_B1, AD_B2, AD_EPS, AD_GRAD, AD_N };

static aclError adam_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, AD_N, AD_N, 1, 3)) || (e = need_all_float(a, AD_N))) return e;
    const sim_tensor *var = &a->in[AD_VAR];
    if (!same_shape(var, &a->in[AD_M]) || !same_shape(var, &a->in[AD_V]) || !same_shape(var, &a->in[AD_GRAD]))
        return shape_error(a, "var, m, v and grad must have the same shape", var, &a->in[AD_GRAD]);
    for (int i = AD_B1P; i <= AD_EPS; i++)
        if (kern_numel(&a->in[i]) != 1) return shape_error(a, "scalar inputs must have 1 element", &a->in[i], &a->in[i]);
    for (int j = 0; j < a->nout; j++)
        if (!same_shape(var, &a->out[j])) return shape_error(a, "outputs must have var's shape", var, &a->out[j]);
    *flops = 10 * kern_numel(var);
    return ACL_SUCCESS;
}

static aclError adam_run(const sim_op_args *a)
{
    float s[AD_N];
    for (int i = AD_B1P; i <= AD_EPS; i++) {
        float buf;
        xfer_ctx x = { &a->in[i], &buf, NULL, 0 };
        for_each_row(&a->in[i], gather_row, &x);
        s[i] = buf;
    }
    /* var, m, v and grad are read in full before anything is written */
    float *own[4] = {0};
    float *cp[4];
    static const int idx[4] = { AD_VAR, AD_M, AD_V, AD_GRAD };
    uint64_t n = kern_numel(&a->in[AD_VAR]);
    for (int k = 0; k < 4; k++) {
        cp[k] = own[k] = malloc((n ? n : 1) * sizeof(float));
        if (!cp[k]) { for (int q = 0; q < 4; q++) free(own[q]); return oom(a); }
        xfer_ctx x = { &a->in[idx[k]], cp[k], NULL, 0 };
        for_each_row(&a->in[idx[k]], gather_row, &x);
    }
    float *var = cp[0], *m = cp[1], *v = cp[2];
    const float *g = cp[3];
    const float lr_t = s[AD_LR] * sqrtf(1.0f - s[AD_B2P]) / (1.0f - s[AD_B1P]);
    const float c1 = 1.0f - s[AD_B1], c2 = 1.0f - s[AD_B2], eps = s[AD_EPS];
    for (uint64_t i = 0; i < n; i++) {
        m[i] += (g[i] - m[i]) * c1;
        v[i] += (g[i] * g[i] - v[i]) * c2;
        var[i] -= lr_t * m[i] / (sqrtf(v[i]) + eps);
    }
    /* in place into var/m/v, and into each output (which normally alias them) */
    for (int k = 0; k < 3; k++) {
        xfer_ctx x = { &a->in[idx[k]], cp[k], NULL, 0 };
        for_each_row(&a->in[idx[k]], scatter_row, &x);
        if (k < a->nout && a->out[k].data != a->in[idx[k]].data) {
            xfer_ctx y = { &a->out[k], cp[k], NULL, 0 };
            for_each_row(&a->out[k], scatter_row, &y);
        }
    }
    for (int q = 0; q < 4; q++) free(own[q]);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------ hash kernel */

static inline uint64_t hmix(uint64_t h, uint64_t w)
{
    /* each step is a bijection of h for fixed w and of w for fixed h, so a
     * change in any one input word always changes the final hash */
    h ^= w;
    h *= 0x9e3779b97f4a7c15ull;
    h ^= h >> 32;
    return h;
}

static uint64_t hash_bytes(uint64_t h, const unsigned char *p, uint64_t n)
{
    uint64_t i = 0, w;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        h = hmix(h, w);
    }
    if (i < n) {
        w = 0;
        memcpy(&w, p + i, (size_t)(n - i));
        h = hmix(h, w ^ 0xa5ull << 56);
    }
    return h;
}

static inline uint64_t splitmix_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_stream(unsigned char *p, uint64_t n, uint64_t seed)
{
    uint64_t s = seed, i = 0, r;
    for (; i + 8 <= n; i += 8) {
        r = splitmix_next(&s);
        memcpy(p + i, &r, 8);
    }
    if (i < n) {
        r = splitmix_next(&s);
        memcpy(p + i, &r, (size_t)(n - i));
    }
}

/* Vacuously true without tensors: such an operator (a trace's operator whose
 * ranges were all elided) has nothing to compute and writes nothing. */
int kern_is_byte_range_op(const sim_op_args *a)
{
    for (int i = 0; i < a->nin; i++)
        if (a->in[i].ndim != 1 || a->in[i].dtype != ACL_UINT8) return 0;
    for (int j = 0; j < a->nout; j++)
        if (a->out[j].ndim != 1 || a->out[j].dtype != ACL_UINT8) return 0;
    return 1;
}

/* Strided views are walked element by element (element size of the dtype);
 * size-0 types cover the rest of their footprint as raw bytes. */
static int hash_view_plain(const sim_tensor *t)
{
    return kern_dtype_size(t->dtype) == 0 || kern_is_contiguous(t);
}

aclError kern_hash_run(const sim_op_args *a)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = hash_bytes(h, (const unsigned char *)a->op_type, strlen(a->op_type));
    for (int i = 0; i < a->nin; i++) {
        const sim_tensor *t = &a->in[i];
        uint64_t nb = kern_view_bytes(t);
        h = hmix(h, 0x1000000ull + (uint64_t)i);
        h = hmix(h, nb);
        if (nb == 0) continue;
        if (hash_view_plain(t)) {
            h = hash_bytes(h, t->data, nb);
        } else {
            unsigned char *buf = malloc(nb);
            if (!buf) return oom(a);
            xfer_ctx x = { t, NULL, buf, kern_dtype_size(t->dtype) };
            for_each_row(t, gather_bytes_row, &x);
            h = hash_bytes(h, buf, nb);
            free(buf);
        }
    }
    /* finalise so that nearby hashes seed unrelated streams */
    uint64_t hs = h;
    h = splitmix_next(&hs);
    for (int j = 0; j < a->nout; j++) {
        const sim_tensor *t = &a->out[j];
        uint64_t nb = kern_view_bytes(t);
        if (nb == 0) continue;
        uint64_t seed = h ^ (0xd1b54a32d192ed03ull * (uint64_t)(j + 1));
        if (hash_view_plain(t)) {
            fill_stream(t->data, nb, seed);
        } else {
            unsigned char *buf = malloc(nb);
            if (!buf) return oom(a);
            fill_stream(buf, nb, seed);
            xfer_ctx x = { t, NULL, buf, kern_dtype_size(t->dtype) };
            for_each_row(t, scatter_bytes_row, &x);
            free(buf);
        }
    }
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------------ table */

static const sim_kernel_def g_kernels[] = {
    { "MatMul", matmul_check, matmul_run, 0 },
    { "MatMulV2", matmul_check, matmul_run, 0 },
    { "BatchMatMul", matmul_check, matmul_run, 0 },
    { "BatchMatMulV2", matmul_check, matmul_run, 0 },
    { "Add", binary_check, binary_run, 0 },
    { "AddV2", binary_check, binary_run, 0 },
    { "Sub", binary_check, binary_run, 0 },
    { "Mul", binary_check, binary_run, 0 },
    { "Relu", relu_check, relu_run, 0 },
    { "ReluGrad", relugrad_check, relugrad_run, 0 },
    { "Softmax", softmax_check, softmax_run, 0 },
    { "SoftmaxV2", softmax_check, softmax_run, 0 },
    { "ReduceSum", reducesum_check, reducesum_run, 0 },
    { "Fill", fill_check, fill_run, 0 },
    { "ApplyAdam", adam_check, adam_run, (1u << AD_VAR) | (1u << AD_M) | (1u << AD_V) },
};

/* The typed kernel files' tables, NULL-name terminated (kernels_util.h). */
static const sim_kernel_def *const g_tables[] = { kern_table_math, kern_table_index, kern_table_reduce,
    kern_table_llm };

const sim_kernel_def *kern_find(const char *op_type)
{
    for (size_t i = 0; i < sizeof g_kernels / sizeof g_kernels[0]; i++)
        if (strcmp(g_kernels[i].name, op_type) == 0) return &g_kernels[i];
    const sim_kernel_def *k = kern_find_nn(op_type);
    if (k) return k;
    for (size_t t = 0; t < sizeof g_tables / sizeof g_tables[0]; t++)
        for (const sim_kernel_def *d = g_tables[t]; d->name; d++)
            if (strcmp(d->name, op_type) == 0) return d;
    return NULL;
}

/* The i-th operator type with a kernel (every table), NULL past the end:
 * lets tests walk every operator the simulator computes. Not a CANN API. */
SIM_API const char *aclsim_kernel_name(int i)
{
    if (i < 0) return NULL;
    int n = (int)(sizeof g_kernels / sizeof g_kernels[0]);
    if (i < n) return g_kernels[i].name;
    i -= n;
    const char *nm;
    for (n = 0; (nm = kern_nn_name(n)); n++)
        if (n == i) return nm;
    i -= n;
    for (size_t t = 0; t < sizeof g_tables / sizeof g_tables[0]; t++)
        for (const sim_kernel_def *d = g_tables[t]; d->name; d++)
            if (i-- == 0) return d->name;
    return NULL;
}

/* ------------------------------------------------- shared with kernels_nn.c */

void kern_for_each_row(const sim_tensor *t, kern_row_fn fn, void *ctx) { for_each_row(t, fn, ctx); }
int kern_broadcast_view(const sim_tensor *x, const sim_tensor *y, sim_tensor *v) { return broadcast_view(x, y, v); }
const float *kern_in_f32(const sim_op_args *a, const sim_tensor *t, float **owned) { return in_f32(a, t, owned); }
float *kern_out_f32(const sim_tensor *t, float **owned) { return out_f32(t, owned); }
void kern_out_f32_done(const sim_tensor *t, float *owned) { out_f32_done(t, owned); }
void kern_gemm(const float *A, const float *B, float *C, int64_t m, int64_t k, int64_t n) { gemm(A, B, C, m, k, n); }
