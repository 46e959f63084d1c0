/* Reduction, ordering and sampling kernels: max/min (whole tensor, over
 * dimensions, with indices), argmax/argmin, any/all, cumulative sums, vector
 * norms (and the foreach form gradient clipping uses), top-k, sort, and
 * multinomial sampling — what generation and gradient clipping launch. See
 * docs/simulator-ops.md.
 *
 * Reduced dimensions come as the bitmask attribute "axes" (bit i: dim i;
 * 0 = every dimension) with "keep_dims"; the output must hold the kept
 * dimensions' elements. NaN counts as the largest value (PyTorch's rule for
 * max, argmax, topk and sort). Floating types compute in double, integer
 * types exactly in int64. */
#define _GNU_SOURCE   /* qsort_r */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rt/kernels_util.h"

/* ------------------------------------------------------------ helpers */

static uint32_t axes_mask(const sim_op_args *a, int nd)
{
    uint32_t m = (uint32_t)kern_attr_int(a, "axes", 0);
    return m ? m : (nd ? (uint32_t)((1ull << nd) - 1) : 0);
}

/* the output element count for x reduced over mask; 0 on a bad mask */
static aclError check_reduced(const sim_op_args *a, const sim_tensor *x, uint32_t m, const sim_tensor *y)
{
    if (x->ndim < 32 && (m >> x->ndim)) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "an axis is out of range");
    uint64_t want = 1;
    for (int i = 0; i < x->ndim; i++)
        if (!((m >> i) & 1)) want *= (uint64_t)x->dims[i];
    if (kern_numel(y) != want) return kn_shape_fail(a, "the output does not hold x without the reduced axes", x, y);
    return ACL_SUCCESS;
}

/* Output position of every input element (row-major), for a reduction over
 * mask m. Caller frees. */
static uint64_t *reduce_map(const sim_tensor *x, uint32_t m)
{
    uint64_t n = kern_numel(x);
    uint64_t *o = malloc((n ? n : 1) * sizeof *o);
    if (!o) return NULL;
    int64_t idx[SIM_MAX_DIMS] = {0};
    for (uint64_t p = 0; p < n; p++) {
        uint64_t q = 0;
        for (int i = 0; i < x->ndim; i++)
            if (!((m >> i) & 1)) q = q * (uint64_t)x->dims[i] + (uint64_t)idx[i];
        o[p] = q;
        for (int i = x->ndim - 1; i >= 0; i--) {
            if (++idx[i] < x->dims[i]) break;
            idx[i] = 0;
        }
    }
    return o;
}

/* a > b with NaN the largest */
static int gt_nan(double a, double b) { return (a > b) || (a != a && b == b); }

/* [outer, d, inner] around axis */
static void split3(const sim_tensor *t, int axis, uint64_t *outer, uint64_t *d, uint64_t *inner)
{
    *outer = 1; *d = 1; *inner = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (i < axis) *outer *= (uint64_t)t->dims[i];
        else if (i == axis) *d = (uint64_t)t->dims[i];
        else *inner *= (uint64_t)t->dims[i];
    }
}

/* ------------------------------------------------ ReduceMax, ReduceMin */
/* x -> y, the maximum (minimum) over "axes" (every dimension by default). */

static aclError rmax_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    if (kern_numel(&a->in[0]) == 0) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "max/min of an empty tensor");
    if ((e = check_reduced(a, &a->in[0], axes_mask(a, a->in[0].ndim), &a->out[0]))) return e;
    *flops = kern_numel(&a->in[0]);
    return ACL_SUCCESS;
}

static aclError rmax_run(const sim_op_args *a)
{
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    int mx = !strcmp(a->op_type, "ReduceMax");
    int ints = kern_int_dtype(x->dtype) && kern_int_dtype(y->dtype);
    uint64_t n = kern_numel(x), ny = kern_numel(y);
    uint64_t *map = reduce_map(x, axes_mask(a, x->ndim));
    double *xd = NULL, *yd = NULL;
    int64_t *xi = NULL, *yi = NULL;
    char *seen = calloc(ny ? ny : 1, 1);
    if (ints) { xi = kn_load_i(x); yi = malloc((ny ? ny : 1) * sizeof *yi); }
    else { xd = kn_load_d(x); yd = malloc((ny ? ny : 1) * sizeof *yd); }
    if (!map || !seen || (ints ? (!xi || !yi) : (!xd || !yd))) {
        free(map); free(seen); free(xd); free(yd); free(xi); free(yi);
        return kn_oom(a);
    }
    for (uint64_t p = 0; p < n; p++) {
        uint64_t q = map[p];
        if (ints) {
            if (!seen[q] || (mx ? xi[p] > yi[q] : xi[p] < yi[q])) yi[q] = xi[p];
        } else if (!seen[q] || (mx ? gt_nan(xd[p], yd[q]) : (xd[p] < yd[q] || (xd[p] != xd[p] && yd[q] == yd[q])))) {
            yd[q] = xd[p];
        }
        seen[q] = 1;
    }
    if (ints) kn_store_i(y, yi);
    else kn_store_d(y, yd);
    free(map); free(seen); free(xd); free(yd); free(xi); free(yi);
    return ACL_SUCCESS;
}

/* ------------------------------------- ArgMax, ArgMin, MaxDim, MinDim */
/* x -> indices (ArgMax/ArgMin), or values and indices (MaxDim/MinDim), along
 * attribute "dim" (with or without the kept 1). The first extreme wins;
 * NaN is the maximum (and the minimum: it propagates). */

static int arg_is_max(const char *t) { return !strcmp(t, "ArgMax") || !strcmp(t, "MaxDim"); }
static int arg_has_values(const char *t) { return !strcmp(t, "MaxDim") || !strcmp(t, "MinDim"); }

static aclError argx_check(const sim_op_args *a, uint64_t *flops)
{
    int vals = arg_has_values(a->op_type);
    aclError e;
    if ((e = kn_counts(a, 1, 1, vals ? 2 : 1, vals ? 2 : 1))) return e;
    const sim_tensor *x = &a->in[0], *ix = &a->out[vals];
    if (!kn_num_dtype(x->dtype) || (vals && !kn_num_dtype(a->out[0].dtype)))
        return kn_refuse_type(a, "x must be numeric");
    if (ix->dtype != ACL_INT64 && ix->dtype != ACL_INT32) return kn_refuse_type(a, "indices must be int64 or int32");
    int d = kn_norm_axis(kern_attr_int(a, "dim", 0), x->ndim ? x->ndim : 1);
    if (d < 0) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "dim is out of range");
    if (x->ndim && x->dims[d] == 0) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "the reduced dimension is empty");
    uint64_t outer, dd, inner;
    split3(x, x->ndim ? d : -1, &outer, &dd, &inner);
    for (int j = 0; j < a->nout; j++)
        if (kern_numel(&a->out[j]) != outer * inner)
            return kn_shape_fail(a, "an output does not hold x without dim", x, &a->out[j]);
    *flops = kern_numel(x);
    return ACL_SUCCESS;
}

static aclError argx_run(const sim_op_args *a)
{
    const sim_tensor *x = &a->in[0];
    int vals = arg_has_values(a->op_type), mx = arg_is_max(a->op_type);
    int d = kn_norm_axis(kern_attr_int(a, "dim", 0), x->ndim ? x->ndim : 1);
    uint64_t outer, dd, inner;
    split3(x, x->ndim ? d : -1, &outer, &dd, &inner);
    int ints = kern_int_dtype(x->dtype);
    double *xd = ints ? NULL : kn_load_d(x);
    int64_t *xi = ints ? kn_load_i(x) : NULL;
    uint64_t ny = outer * inner;
    int64_t *ix = malloc((ny ? ny : 1) * sizeof *ix);
    if ((ints ? !xi : !xd) || !ix) { free(xd); free(xi); free(ix); return kn_oom(a); }
    for (uint64_t o = 0; o < outer; o++)
        for (uint64_t r = 0; r < inner; r++) {
            uint64_t best = 0;
            for (uint64_t k = 1; k < dd; k++) {
                uint64_t p = (o * dd + k) * inner + r, b = (o * dd + best) * inner + r;
                int better;
                if (ints) better = mx ? xi[p] > xi[b] : xi[p] < xi[b];
                else if (xd[b] != xd[b]) better = 0;                 /* the first NaN stays */
                else better = xd[p] != xd[p] || (mx ? xd[p] > xd[b] : xd[p] < xd[b]);
                if (better) best = k;
            }
            ix[o * inner + r] = (int64_t)best;
        }
    if (vals) {
        if (ints) {
            int64_t *v = malloc((ny ? ny : 1) * sizeof *v);
            if (!v) { free(xi); free(ix); return kn_oom(a); }
            for (uint64_t q = 0; q < ny; q++) v[q] = xi[(q / inner * dd + (uint64_t)ix[q]) * inner + q % inner];
            kn_store_i(&a->out[0], v);
            free(v);
        } else {
            double *v = malloc((ny ? ny : 1) * sizeof *v);
            if (!v) { free(xd); free(ix); return kn_oom(a); }
            for (uint64_t q = 0; q < ny; q++) v[q] = xd[(q / inner * dd + (uint64_t)ix[q]) * inner + q % inner];
            kn_store_d(&a->out[0], v);
            free(v);
        }
    }
    kn_store_i(&a->out[vals], ix);
    free(xd); free(xi); free(ix);
    return ACL_SUCCESS;
}

/* --------------------------------------------- ReduceAny, ReduceAll */
/* x -> y (bool or any type: 1 / 0): any (all) element non-zero over "axes". */

static aclError rany_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    if ((e = check_reduced(a, &a->in[0], axes_mask(a, a->in[0].ndim), &a->out[0]))) return e;
    *flops = kern_numel(&a->in[0]);
    return ACL_SUCCESS;
}

static aclError rany_run(const sim_op_args *a)
{
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    int all = !strcmp(a->op_type, "ReduceAll");
    uint64_t n = kern_numel(x), ny = kern_numel(y);
    uint64_t *map = reduce_map(x, axes_mask(a, x->ndim));
    double *xd = kn_load_d(x);
    int64_t *yi = malloc((ny ? ny : 1) * sizeof *yi);
    if (!map || !xd || !yi) { free(map); free(xd); free(yi); return kn_oom(a); }
    for (uint64_t q = 0; q < ny; q++) yi[q] = all;
    for (uint64_t p = 0; p < n; p++) {
        int t = xd[p] != 0;
        if (all) yi[map[p]] &= t;
        else yi[map[p]] |= t;
    }
    kn_store_i(y, yi);
    free(map); free(xd); free(yi);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------ Cumsum */
/* x -> y (x's shape, y's type): running sums along attribute "dim". */

static aclError cumsum_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    if (!kn_same_shape(&a->in[0], &a->out[0])) return kn_shape_fail(a, "x and y differ", &a->in[0], &a->out[0]);
    if (kn_norm_axis(kern_attr_int(a, "dim", 0), a->in[0].ndim ? a->in[0].ndim : 1) < 0)
        return kn_fail(a, ACL_ERROR_INVALID_PARAM, "dim is out of range");
    *flops = kern_numel(&a->in[0]);
    return ACL_SUCCESS;
}

static aclError cumsum_run(const sim_op_args *a)
{
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    int d = kn_norm_axis(kern_attr_int(a, "dim", 0), x->ndim ? x->ndim : 1);
    uint64_t outer, dd, inner;
    split3(x, x->ndim ? d : -1, &outer, &dd, &inner);
    int ints = kern_int_dtype(y->dtype) && kern_int_dtype(x->dtype);
    double *v = ints ? NULL : kn_load_d(x);
    int64_t *w = ints ? kn_load_i(x) : NULL;
    if (ints ? !w : !v) return kn_oom(a);
    for (uint64_t o = 0; o < outer; o++)
        for (uint64_t r = 0; r < inner; r++)
            for (uint64_t k = 1; k < dd; k++) {
                uint64_t p = (o * dd + k) * inner + r, q = p - inner;
                if (ints) w[p] = (int64_t)((uint64_t)w[p] + (uint64_t)w[q]);
                else v[p] += v[q];
            }
    if (ints) kn_store_i(y, w);
    else kn_store_d(y, v);
    free(v); free(w);
    return ACL_SUCCESS;
}

/* ------------------------------------------------- LpNorm, ForeachNorm */
/* LpNorm: x -> y = (sum |x|^p)^(1/p) over "axes" (attribute "p": inf is the
 * maximum |x|, -inf the minimum, 0 the count of non-zeros).
 * ForeachNorm: x_0..x_n-1 -> y_0..y_n-1 (one element each), the norm of
 * each whole tensor. */

static double norm_of(const double *v, uint64_t n, double p)
{
    double acc = p == -INFINITY ? INFINITY : 0;
    for (uint64_t k = 0; k < n; k++) {
        double x = fabs(v[k]);
        if (x != x) return NAN;
        if (p == INFINITY) { if (x > acc) acc = x; }
        else if (p == -INFINITY) { if (x < acc) acc = x; }
        else if (p == 0) acc += x != 0;
        else if (p == 1) acc += x;
        else if (p == 2) acc += x * x;
        else acc += pow(x, p);
    }
    if (p == INFINITY || p == -INFINITY || p == 0 || p == 1) return acc;
    return p == 2 ? sqrt(acc) : pow(acc, 1.0 / p);
}

static aclError lpnorm_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_flt_dtype, "float32, float16, bfloat16, float64")))
        return e;
    if ((e = check_reduced(a, &a->in[0], axes_mask(a, a->in[0].ndim), &a->out[0]))) return e;
    *flops = 2 * kern_numel(&a->in[0]);
    return ACL_SUCCESS;
}

static aclError lpnorm_run(const sim_op_args *a)
{
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    double p = kn_attr_d(a, "p", 2);
    uint64_t n = kern_numel(x), ny = kern_numel(y);
    uint64_t *map = reduce_map(x, axes_mask(a, x->ndim));
    double *xd = kn_load_d(x), *yd = malloc((ny ? ny : 1) * sizeof *yd);
    if (!map || !xd || !yd) { free(map); free(xd); free(yd); return kn_oom(a); }
    if (ny == 1) yd[0] = norm_of(xd, n, p);
    else {
        /* group the elements by output position once (O(n) passes per output would be quadratic) */
        double *acc = calloc(ny, sizeof *acc);
        if (!acc) { free(map); free(xd); free(yd); return kn_oom(a); }
        for (uint64_t q = 0; q < ny; q++) acc[q] = p == -INFINITY ? INFINITY : 0;
        for (uint64_t k = 0; k < n; k++) {
            double v = fabs(xd[k]);
            uint64_t q = map[k];
            if (v != v || acc[q] != acc[q]) { acc[q] = NAN; continue; }
            if (p == INFINITY) { if (v > acc[q]) acc[q] = v; }
            else if (p == -INFINITY) { if (v < acc[q]) acc[q] = v; }
            else if (p == 0) acc[q] += v != 0;
            else if (p == 1) acc[q] += v;
            else if (p == 2) acc[q] += v * v;
            else acc[q] += pow(v, p);
        }
        for (uint64_t q = 0; q < ny; q++)
            yd[q] = (p == INFINITY || p == -INFINITY || p == 0 || p == 1) ? acc[q]
                  : p == 2 ? sqrt(acc[q]) : pow(acc[q], 1.0 / p);
        free(acc);
    }
    kn_store_d(y, yd);
    free(map); free(xd); free(yd);
    return ACL_SUCCESS;
}

static aclError fenorm_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if (a->nin < 1 || a->nin != a->nout)
        return kn_fail(a, ACL_ERROR_OP_INPUT_NOT_MATCH, "one output per input tensor is required");
    if ((e = kn_types(a, kn_flt_dtype, "float32, float16, bfloat16, float64"))) return e;
    uint64_t total = 0;
    for (int j = 0; j < a->nout; j++) {
        if (kern_numel(&a->out[j]) != 1) return kn_shape_fail(a, "each output must have one element", &a->out[j], &a->in[j]);
        total += kern_numel(&a->in[j]);
    }
    *flops = 2 * total;
    return ACL_SUCCESS;
}

static aclError fenorm_run(const sim_op_args *a)
{
    double p = kn_attr_d(a, "p", 2);
    double *r = malloc((size_t)a->nout * sizeof *r);
    if (!r) return kn_oom(a);
    /* every input read before any output is written */
    for (int j = 0; j < a->nin; j++) {
        double *v = kn_load_d(&a->in[j]);
        if (!v) { free(r); return kn_oom(a); }
        r[j] = norm_of(v, kern_numel(&a->in[j]), p);
        free(v);
    }
    for (int j = 0; j < a->nout; j++) kn_store_d(&a->out[j], &r[j]);
    free(r);
    return ACL_SUCCESS;
}

/* ----------------------------------------------------- TopK, Sort */
/* TopK: x -> values, indices (int64/int32): the "k" largest (attribute
 * "largest" = 0: smallest) along "dim", in order when "sorted" (always, here).
 * Sort: x -> values, indices along "dim" ("descending"). Both stable: equal
 * values keep their order. NaN is the largest. */

typedef struct { double v; int64_t iv; uint64_t idx; } sort_item;
typedef struct { int desc, ints; } sort_how;

/* ascending (or descending) by value, then by position: a stable order */
static int item_cmp(const void *pa, const void *pb, void *ctx)
{
    const sort_item *a = pa, *b = pb;
    const sort_how *h = ctx;
    int c;
    if (h->ints) c = a->iv < b->iv ? -1 : a->iv > b->iv;
    else c = gt_nan(b->v, a->v) ? -1 : gt_nan(a->v, b->v) ? 1 : 0;
    if (h->desc) c = -c;
    if (c) return c;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

static aclError sort_check(const sim_op_args *a, uint64_t *flops)
{
    int topk = !strcmp(a->op_type, "TopK");
    aclError e;
    if ((e = kn_counts(a, 1, 1, 2, 2))) return e;
    const sim_tensor *x = &a->in[0], *v = &a->out[0], *ix = &a->out[1];
    if (!kn_num_dtype(x->dtype) || !kn_num_dtype(v->dtype)) return kn_refuse_type(a, "x and values must be numeric");
    if (ix->dtype != ACL_INT64 && ix->dtype != ACL_INT32) return kn_refuse_type(a, "indices must be int64 or int32");
    int d = kn_norm_axis(kern_attr_int(a, "dim", -1), x->ndim ? x->ndim : 1);
    if (d < 0) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "dim is out of range");
    int64_t len = x->ndim ? x->dims[d] : 1;
    int64_t k = topk ? kern_attr_int(a, "k", -1) : len;
    if (k < 0 || k > len) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "k is out of range");
    if (!kn_same_shape(v, ix) || v->ndim != x->ndim) return kn_shape_fail(a, "values and indices must have x's rank", v, ix);
    for (int i = 0; i < x->ndim; i++)
        if (v->dims[i] != (i == d ? k : x->dims[i])) return kn_shape_fail(a, "values are not x with k along dim", x, v);
    *flops = kern_numel(x) * 8;
    return ACL_SUCCESS;
}

static aclError sort_run(const sim_op_args *a)
{
    int topk = !strcmp(a->op_type, "TopK");
    const sim_tensor *x = &a->in[0];
    int d = kn_norm_axis(kern_attr_int(a, "dim", -1), x->ndim ? x->ndim : 1);
    uint64_t outer, dd, inner;
    split3(x, x->ndim ? d : -1, &outer, &dd, &inner);
    uint64_t k = topk ? (uint64_t)kern_attr_int(a, "k", 0) : dd;
    int desc = topk ? kern_attr_int(a, "largest", 1) != 0 : kern_attr_int(a, "descending", 0) != 0;
    int ints = kern_int_dtype(x->dtype) && kern_int_dtype(a->out[0].dtype);
    double *xd = ints ? NULL : kn_load_d(x);
    int64_t *xi = ints ? kn_load_i(x) : NULL;
    uint64_t ny = outer * k * inner;
    sort_item *it = malloc((dd ? dd : 1) * sizeof *it);
    double *vd = malloc((ny ? ny : 1) * sizeof *vd);
    int64_t *vi = malloc((ny ? ny : 1) * sizeof *vi), *ix = malloc((ny ? ny : 1) * sizeof *ix);
    if ((ints ? !xi : !xd) || !it || !vd || !vi || !ix) {
        free(xd); free(xi); free(it); free(vd); free(vi); free(ix);
        return kn_oom(a);
    }
    sort_how how = { desc, ints };
    for (uint64_t o = 0; o < outer; o++)
        for (uint64_t r = 0; r < inner; r++) {
            for (uint64_t j = 0; j < dd; j++) {
                uint64_t p = (o * dd + j) * inner + r;
                it[j].v = ints ? 0 : xd[p];
                it[j].iv = ints ? xi[p] : 0;
                it[j].idx = j;
            }
            qsort_r(it, dd, sizeof *it, item_cmp, &how);
            for (uint64_t j = 0; j < k; j++) {
                uint64_t q = (o * k + j) * inner + r;
                vd[q] = it[j].v;
                vi[q] = it[j].iv;
                ix[q] = (int64_t)it[j].idx;
            }
        }
    if (ints) kn_store_i(&a->out[0], vi);
    else kn_store_d(&a->out[0], vd);
    kn_store_i(&a->out[1], ix);
    free(xd); free(xi); free(it); free(vd); free(vi); free(ix);
    return ACL_SUCCESS;
}

/* -------------------------------------------------------- Multinomial */
/* probs [C] or [N, C] (non-negative weights, any positive sum) -> y [n] or
 * [N, n] (int64): "num_samples" category indices drawn per row, with or
 * without "replacement". The random stream is keyed by the attributes
 * "seed" and "offset" (torch_npu's generator state): a reproducible, correct
 * sample of the distribution — not the CPU generator's stream, which no
 * device reproduces. A row with a negative, NaN or infinite weight, or no
 * positive weight, is a device error. */

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static aclError multi_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1))) return e;
    const sim_tensor *p = &a->in[0], *y = &a->out[0];
    if (!kn_flt_dtype(p->dtype)) return kn_refuse_type(a, "probabilities must be floating point");
    if (y->dtype != ACL_INT64) return kn_refuse_type(a, "the output must be int64");
    if (p->ndim < 1 || p->ndim > 2 || y->ndim != p->ndim) return kn_shape_fail(a, "probs must be [C] or [N, C]", p, y);
    int64_t n = kern_attr_int(a, "num_samples", 0), C = p->dims[p->ndim - 1];
    int repl = kern_attr_int(a, "replacement", 0) != 0;
    if (n <= 0 || (!repl && n > C)) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "num_samples is out of range");
    if (y->dims[y->ndim - 1] != n || (p->ndim == 2 && y->dims[0] != p->dims[0]))
        return kn_shape_fail(a, "y must be [num_samples] or [N, num_samples]", p, y);
    *flops = kern_numel(p) * (uint64_t)n;
    return ACL_SUCCESS;
}

static aclError multi_run(const sim_op_args *a)
{
    const sim_tensor *p = &a->in[0], *y = &a->out[0];
    int64_t n = kern_attr_int(a, "num_samples", 0), C = p->dims[p->ndim - 1];
    int64_t rows = p->ndim == 2 ? p->dims[0] : 1;
    int repl = kern_attr_int(a, "replacement", 0) != 0;
    uint64_t seed = (uint64_t)kern_attr_int(a, "seed", 0), off = (uint64_t)kern_attr_int(a, "offset", 0);
    double *w = kn_load_d(p);
    int64_t *out = malloc((size_t)(rows * n > 0 ? rows * n : 1) * sizeof *out);
    if (!w || !out) { free(w); free(out); return kn_oom(a); }
    aclError rc = ACL_SUCCESS;
    for (int64_t r = 0; r < rows && !rc; r++) {
        double *row = w + r * C;
        for (int64_t c = 0; c < C; c++)
            if (!(row[c] >= 0) || isinf(row[c])) rc = ACL_ERROR_RT_AICORE_EXCEPTION;
        for (int64_t s = 0; s < n && !rc; s++) {
            double total = 0;
            for (int64_t c = 0; c < C; c++) total += row[c];
            if (!(total > 0)) { rc = ACL_ERROR_RT_AICORE_EXCEPTION; break; }
            uint64_t h = mix64(seed ^ mix64(off + (uint64_t)(r * n + s)));
            double u = (double)(h >> 11) * (1.0 / 9007199254740992.0) * total;
            int64_t pick = -1;
            double acc = 0;
            for (int64_t c = 0; c < C; c++) {
                if (row[c] <= 0) continue;
                acc += row[c];
                pick = c;
                if (u < acc) break;
            }
            out[r * n + s] = pick;
            if (!repl) row[pick] = 0;
        }
    }
    if (rc) aclsim_log("%s: a row has a negative, infinite or NaN weight, or none is positive (device error)",
        a->op_type);
    else kn_store_i(y, out);
    free(w); free(out);
    return rc;
}

/* ---------------------------------------------------------------- table */

const sim_kernel_def kern_table_reduce[] = {
    { "ReduceMax", rmax_check, rmax_run, 0 },
    { "ReduceMin", rmax_check, rmax_run, 0 },
    { "ArgMax", argx_check, argx_run, 0 },
    { "ArgMin", argx_check, argx_run, 0 },
    { "MaxDim", argx_check, argx_run, 0 },
    { "MinDim", argx_check, argx_run, 0 },
    { "ReduceAny", rany_check, rany_run, 0 },
    { "ReduceAll", rany_check, rany_run, 0 },
    { "Cumsum", cumsum_check, cumsum_run, 0 },
    { "LpNorm", lpnorm_check, lpnorm_run, 0 },
    { "ForeachNorm", fenorm_check, fenorm_run, 0 },
    { "TopK", sort_check, sort_run, 0 },
    { "Sort", sort_check, sort_run, 0 },
    { "Multinomial", multi_check, multi_run, 0 },
    { NULL, NULL, NULL, 0 },
};
