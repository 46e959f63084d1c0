/* Operator kernels for the aclnn operators a PyTorch training step needs
 * (torch_npu's op-plugin reaches them through libopapi): typed elementwise
 * arithmetic with broadcasting, casts and copies, activations and their
 * gradients, log-softmax, NLL loss, sum reductions, addmm, and the foreach
 * operators torch.optim.AdamW uses. See docs/simulator-ops.md.
 *
 * Element types: float32/float16/bfloat16/double are computed in double and
 * rounded once when stored (for a single +, -, *, / or sqrt that is exactly
 * the correctly rounded float32 result a CPU computes); the integer types and
 * bool are computed exactly in int64. As in kernels.c, every kernel reads all
 * of its inputs before it writes an output, so in-place (aliased) outputs and
 * strided views are well defined. */
#include "rt/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rt/kernels_util.h"

/* ------------------------------------------- integer paths of kernels.c */

aclError kern_int_binary_run(const sim_op_args *a, int kind)
{
    const sim_tensor *y = &a->out[0];
    int64_t *v[2] = { NULL, NULL };
    if (!kn_load_bcast(a, 0, 2, y, 1, NULL, v)) return kn_oom(a);
    int64_t alpha = kern_attr_int(a, "alpha", 1);
    uint64_t n = kern_numel(y);
    int64_t *o = v[0];
    for (uint64_t i = 0; i < n; i++) {
        int64_t x1 = v[0][i], x2 = v[1][i];
        /* two's complement wrap-around, as integer tensors do */
        switch (kind) {
        case 0: o[i] = (int64_t)((uint64_t)x1 + (uint64_t)alpha * (uint64_t)x2); break;
        case 1: o[i] = (int64_t)((uint64_t)x1 - (uint64_t)alpha * (uint64_t)x2); break;
        default: o[i] = (int64_t)((uint64_t)x1 * (uint64_t)x2); break;
        }
    }
    kn_store_i(y, o);
    free(v[0]); free(v[1]);
    return ACL_SUCCESS;
}

aclError kern_int_fill_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    uint64_t n = kern_numel(y);
    int64_t *o = malloc((n ? n : 1) * sizeof *o);
    if (!o) return kn_oom(a);
    const sim_attr *at = kern_attr(a, "value");
    int64_t val = !at ? 0 : at->type == SIM_ATTR_FLOAT ? kn_d_to_i(at->f) : at->i;
    for (uint64_t i = 0; i < n; i++) o[i] = val;
    kn_store_i(y, o);
    free(o);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------ Cast / ViewCopy */
/* x -> y converting the element type; x broadcasts to y's shape (copy_). */

static aclError cast_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types"))) return e;
    if (!kn_broadcasts_to(&a->in[0], &a->out[0])) return kn_shape_fail(a, "x does not broadcast to y", &a->in[0], &a->out[0]);
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError cast_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    int ints = kern_int_dtype(a->in[0].dtype) && kern_int_dtype(y->dtype);
    double *d[1] = { NULL };
    int64_t *iv[1] = { NULL };
    if (!kn_load_bcast(a, 0, 1, y, ints, d, iv)) return kn_oom(a);
    if (ints) kn_store_i(y, iv[0]);
    else kn_store_d(y, d[0]);
    free(d[0]); free(iv[0]);
    return ACL_SUCCESS;
}

/* ------------------------------------------- binary elementwise (tensor) */
/* Div (RealDiv), Maximum, Minimum: y = x1 op x2 with broadcasting. */

enum { EW_DIV, EW_MAX, EW_MIN };

static int ew_kind(const char *t)
{
    if (!strcmp(t, "Maximum")) return EW_MAX;
    if (!strcmp(t, "Minimum")) return EW_MIN;
    return EW_DIV;
}

static aclError ew2_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 2, 2, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types"))) return e;
    if ((e = kn_bcast_out(a, 0, 2, &a->out[0]))) return e;
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError ew2_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    double *v[2] = { NULL, NULL };
    if (!kn_load_bcast(a, 0, 2, y, 0, v, NULL)) return kn_oom(a);
    uint64_t n = kern_numel(y);
    int k = ew_kind(a->op_type);
    for (uint64_t i = 0; i < n; i++) {
        double x1 = v[0][i], x2 = v[1][i];
        switch (k) {
        case EW_DIV: v[0][i] = x1 / x2; break;
        case EW_MAX: v[0][i] = (x1 != x1 || x1 > x2) ? x1 : x2; break;   /* NaN propagates */
        default: v[0][i] = (x1 != x1 || x1 < x2) ? x1 : x2; break;
        }
    }
    kn_store_d(y, v[0]);
    free(v[0]); free(v[1]);
    return ACL_SUCCESS;
}

/* --------------------------------------------- elementwise with a scalar */
/* Adds: y = x + alpha*value; Subs: y = x - alpha*value; Muls: y = x*value;
 * Divs: y = x / value. Integer tensors with integer scalars stay exact. */

static aclError scal_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types"))) return e;
    if (!kn_same_shape(&a->in[0], &a->out[0])) return kn_shape_fail(a, "x and y differ", &a->in[0], &a->out[0]);
    if (!kern_attr(a, "value")) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "attribute 'value' is missing");
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError scal_run(const sim_op_args *a)
{
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    uint64_t n = kern_numel(y);
    const char *t = a->op_type;
    const sim_attr *va = kern_attr(a, "value"), *aa = kern_attr(a, "alpha");
    int int_scalars = va->type != SIM_ATTR_FLOAT && (!aa || aa->type != SIM_ATTR_FLOAT);
    if (kern_int_dtype(x->dtype) && kern_int_dtype(y->dtype) && int_scalars && strcmp(t, "Divs")) {
        int64_t *v = kn_load_i(x);
        if (!v) return kn_oom(a);
        uint64_t s = (uint64_t)va->i, al = aa ? (uint64_t)aa->i : 1;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t u = (uint64_t)v[i];
            v[i] = (int64_t)(!strcmp(t, "Adds") ? u + al * s : !strcmp(t, "Subs") ? u - al * s : u * s);
        }
        kn_store_i(y, v);
        free(v);
        return ACL_SUCCESS;
    }
    double *v = kn_load_d(x);
    if (!v) return kn_oom(a);
    double s = kn_attr_d(a, "value", 0), al = kn_attr_d(a, "alpha", 1);
    if (!strcmp(t, "Adds")) for (uint64_t i = 0; i < n; i++) v[i] = v[i] + al * s;
    else if (!strcmp(t, "Subs")) for (uint64_t i = 0; i < n; i++) v[i] = v[i] - al * s;
    else if (!strcmp(t, "Muls")) for (uint64_t i = 0; i < n; i++) v[i] = v[i] * s;
    else for (uint64_t i = 0; i < n; i++) v[i] = v[i] / s;
    kn_store_d(y, v);
    free(v);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------ unary (float) */

static const double SQRT1_2 = 0.70710678118654752440;
static const double INV_SQRT_2PI = 0.39894228040143267794;

static double gelu(double x) { return 0.5 * x * (1.0 + erf(x * SQRT1_2)); }

enum { UN_SQRT, UN_NEG, UN_EXP, UN_LOG, UN_ABS, UN_RECIP, UN_GELU, UN_RSQRT };

static int un_kind(const char *t)
{
    static const char *names[] = { "Sqrt", "Neg", "Exp", "Log", "Abs", "Reciprocal", "Gelu", "Rsqrt" };
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (!strcmp(t, names[i])) return i;
    return -1;
}

static aclError un_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_flt_dtype, "float32, float16, bfloat16, double"))) return e;
    if (!kn_same_shape(&a->in[0], &a->out[0])) return kn_shape_fail(a, "x and y differ", &a->in[0], &a->out[0]);
    *flops = kern_numel(&a->out[0]) * (un_kind(a->op_type) == UN_GELU ? 8 : 1);
    return ACL_SUCCESS;
}

static aclError un_run(const sim_op_args *a)
{
    double *v = kn_load_d(&a->in[0]);
    if (!v) return kn_oom(a);
    uint64_t n = kern_numel(&a->out[0]);
    int k = un_kind(a->op_type);
    for (uint64_t i = 0; i < n; i++) {
        double x = v[i];
        switch (k) {
        case UN_SQRT: v[i] = sqrt(x); break;
        case UN_NEG: v[i] = -x; break;
        case UN_EXP: v[i] = exp(x); break;
        case UN_LOG: v[i] = log(x); break;
        case UN_ABS: v[i] = fabs(x); break;
        case UN_RECIP: v[i] = 1.0 / x; break;
        case UN_GELU: v[i] = gelu(x); break;
        default: v[i] = 1.0 / sqrt(x); break;
        }
    }
    kn_store_d(&a->out[0], v);
    free(v);
    return ACL_SUCCESS;
}

/* --------------------------------------------------------- gradients */
/* GeluGrad: dy, x -> dx = dy * (Phi(x) + x * phi(x)) (exact, erf-based GELU)
 * ThresholdGradV2D: dy, x -> dx = x > threshold ? dy : 0 (ReLU backward) */

static aclError grad2_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 2, 2, 1, 1)) || (e = kn_types(a, kn_flt_dtype, "float32, float16, bfloat16, double"))) return e;
    if (!kn_same_shape(&a->in[0], &a->in[1])) return kn_shape_fail(a, "dy and x differ", &a->in[0], &a->in[1]);
    if (!kn_same_shape(&a->in[0], &a->out[0])) return kn_shape_fail(a, "dy and dx differ", &a->in[0], &a->out[0]);
    *flops = kern_numel(&a->out[0]) * 8;
    return ACL_SUCCESS;
}

static aclError grad2_run(const sim_op_args *a)
{
    double *dy = kn_load_d(&a->in[0]), *x = dy ? kn_load_d(&a->in[1]) : NULL;
    if (!x) { free(dy); return kn_oom(a); }
    uint64_t n = kern_numel(&a->out[0]);
    if (!strcmp(a->op_type, "GeluGrad")) {
        for (uint64_t i = 0; i < n; i++) {
            double cdf = 0.5 * (1.0 + erf(x[i] * SQRT1_2));
            double pdf = INV_SQRT_2PI * exp(-0.5 * x[i] * x[i]);
            dy[i] = dy[i] * (cdf + x[i] * pdf);
        }
    } else {
        double th = kn_attr_d(a, "threshold", 0);
        for (uint64_t i = 0; i < n; i++) dy[i] = x[i] > th ? dy[i] : 0.0;
    }
    kn_store_d(&a->out[0], dy);
    free(dy); free(x);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------- LogSoftmax */
/* LogSoftmaxV2: x -> y = x - max - log(sum(exp(x - max))) along "axis"
 * LogSoftmaxGrad: dy, y -> dx = dy - exp(y) * sum(dy) along "axis" */

static void split3(const sim_tensor *t, int axis, uint64_t *outer, uint64_t *d, uint64_t *inner)
{
    *outer = 1; *inner = 1; *d = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (i < axis) *outer *= (uint64_t)t->dims[i];
        else if (i == axis) *d = (uint64_t)t->dims[i];
        else *inner *= (uint64_t)t->dims[i];
    }
}

static aclError lsm_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    int grad = !strcmp(a->op_type, "LogSoftmaxGrad");
    if ((e = kn_counts(a, grad ? 2 : 1, grad ? 2 : 1, 1, 1)) ||
        (e = kn_types(a, kn_flt_dtype, "float32, float16, bfloat16, double")))
        return e;
    for (int i = 0; i < a->nin; i++)
        if (!kn_same_shape(&a->in[i], &a->out[0])) return kn_shape_fail(a, "inputs and output differ", &a->in[i], &a->out[0]);
    int nd = a->out[0].ndim;
    if (nd > 0 && kn_norm_axis(kern_attr_int(a, "axis", -1), nd) < 0)
        return kn_fail(a, ACL_ERROR_INVALID_PARAM, "axis out of range");
    *flops = 5 * kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError lsm_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    int axis = y->ndim ? kn_norm_axis(kern_attr_int(a, "axis", -1), y->ndim) : 0;
    uint64_t outer, d, inner;
    split3(y, axis, &outer, &d, &inner);
    int grad = !strcmp(a->op_type, "LogSoftmaxGrad");
    double *x = kn_load_d(&a->in[0]), *o = (x && grad) ? kn_load_d(&a->in[1]) : NULL;
    if (!x || (grad && !o)) { free(x); free(o); return kn_oom(a); }
    for (uint64_t p = 0; p < outer; p++)
        for (uint64_t q = 0; q < inner; q++) {
            double *r = x + p * d * inner + q;
            if (!grad) {
                double mx = -INFINITY, sum = 0;
                for (uint64_t i = 0; i < d; i++) if (r[i * inner] > mx) mx = r[i * inner];
                for (uint64_t i = 0; i < d; i++) sum += exp(r[i * inner] - mx);
                double lse = mx + log(sum);
                for (uint64_t i = 0; i < d; i++) r[i * inner] -= lse;
            } else {
                const double *yr = o + p * d * inner + q;
                double sum = 0;
                for (uint64_t i = 0; i < d; i++) sum += r[i * inner];
                for (uint64_t i = 0; i < d; i++) r[i * inner] -= exp(yr[i * inner]) * sum;
            }
        }
    kn_store_d(y, x);
    free(x); free(o);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------- NLLLoss */
/* NLLLoss: x [N,C] (or [C]), target [N] (or []) of class indices, weight [C]
 *   -> y, total_weight. reduction 0 none (y [N]), 1 mean, 2 sum (y []);
 *   targets equal to ignore_index contribute nothing.
 * NLLLossGrad: x, dy, target, weight, total_weight -> dx (x's shape). */

enum { RED_NONE = 0, RED_MEAN = 1, RED_SUM = 2 };

static aclError nll_geom(const sim_op_args *a, const sim_tensor *x, const sim_tensor *tg, const sim_tensor *w,
    int64_t *N, int64_t *C)
{
    if (x->ndim == 2) { *N = x->dims[0]; *C = x->dims[1]; }
    else if (x->ndim == 1) { *N = 1; *C = x->dims[0]; }
    else return kn_shape_fail(a, "x must be [N,C] or [C]", x, x);
    if ((int64_t)kern_numel(tg) != *N || tg->ndim != (x->ndim == 2 ? 1 : 0))
        return kn_shape_fail(a, "target must be [N] (or [] for x [C])", tg, x);
    if (!kern_int_dtype(tg->dtype) || tg->dtype == ACL_BOOL) {
        return kn_refuse_type(a, "target must be an integer type");
    }
    if ((int64_t)kern_numel(w) != *C) return kn_shape_fail(a, "weight must have C elements", w, x);
    if (!kn_flt_dtype(x->dtype) || !kn_flt_dtype(w->dtype)) {
        return kn_refuse_type(a, "x and weight must be floating point");
    }
    int64_t red = kern_attr_int(a, "reduction", RED_MEAN);
    if (red < 0 || red > 2) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "reduction must be 0 (none), 1 (mean) or 2 (sum)");
    return ACL_SUCCESS;
}

static aclError nll_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    int64_t N, C;
    if ((e = kn_counts(a, 3, 3, 2, 2)) || (e = nll_geom(a, &a->in[0], &a->in[1], &a->in[2], &N, &C))) return e;
    int64_t red = kern_attr_int(a, "reduction", RED_MEAN);
    if (red == RED_NONE ? (int64_t)kern_numel(&a->out[0]) != N : kern_numel(&a->out[0]) != 1)
        return kn_shape_fail(a, "y must be [N] for reduction none, one element otherwise", &a->out[0], &a->in[0]);
    if (kern_numel(&a->out[1]) != 1) return kn_shape_fail(a, "total_weight must have one element", &a->out[1], &a->out[1]);
    if (!kn_flt_dtype(a->out[0].dtype) || !kn_flt_dtype(a->out[1].dtype))
        return kn_refuse_type(a, "outputs must be floating point");
    *flops = (uint64_t)N * 2;
    return ACL_SUCCESS;
}

/* the class of row n, or -1 if ignored; -2 if out of range */
static int64_t nll_class(int64_t t, int64_t C, int64_t ignore)
{
    if (t == ignore) return -1;
    return (t < 0 || t >= C) ? -2 : t;
}

static aclError nll_run(const sim_op_args *a)
{
    int64_t N, C;
    nll_geom(a, &a->in[0], &a->in[1], &a->in[2], &N, &C);
    int64_t red = kern_attr_int(a, "reduction", RED_MEAN), ignore = kern_attr_int(a, "ignore_index", -100);
    double *x = kn_load_d(&a->in[0]), *w = x ? kn_load_d(&a->in[2]) : NULL;
    int64_t *t = w ? kn_load_i(&a->in[1]) : NULL;
    double *y = t ? malloc((size_t)(N ? N : 1) * sizeof *y) : NULL;
    if (!y) { free(x); free(w); free(t); return kn_oom(a); }
    double sum = 0, tw = 0;
    aclError rc = ACL_SUCCESS;
    for (int64_t n = 0; n < N; n++) {
        int64_t c = nll_class(t[n], C, ignore);
        if (c == -2) {
            aclsim_log("%s: target %lld of row %lld is out of range [0, %lld)", a->op_type, (long long)t[n],
                (long long)n, (long long)C);
            rc = ACL_ERROR_RT_AICORE_EXCEPTION;   /* a device-side assertion on real hardware */
            c = -1;
        }
        y[n] = c < 0 ? 0.0 : -w[c] * x[n * C + c];
        if (c >= 0) { sum += y[n]; tw += w[c]; }
    }
    double twv = tw;
    if (red == RED_NONE) kn_store_d(&a->out[0], y);
    else {
        double r = red == RED_SUM ? sum : sum / tw;   /* mean over zero weight is NaN, as in PyTorch */
        kn_store_d(&a->out[0], &r);
    }
    kn_store_d(&a->out[1], &twv);
    free(x); free(w); free(t); free(y);
    return rc;
}

static aclError nllgrad_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    int64_t N, C;
    if ((e = kn_counts(a, 5, 5, 1, 1)) || (e = nll_geom(a, &a->in[0], &a->in[2], &a->in[3], &N, &C))) return e;
    int64_t red = kern_attr_int(a, "reduction", RED_MEAN);
    if (red == RED_NONE ? (int64_t)kern_numel(&a->in[1]) != N : kern_numel(&a->in[1]) != 1)
        return kn_shape_fail(a, "dy must be [N] for reduction none, one element otherwise", &a->in[1], &a->in[0]);
    if (kern_numel(&a->in[4]) != 1) return kn_shape_fail(a, "total_weight must have one element", &a->in[4], &a->in[4]);
    if (!kn_same_shape(&a->in[0], &a->out[0])) return kn_shape_fail(a, "dx must have x's shape", &a->out[0], &a->in[0]);
    if (!kn_flt_dtype(a->in[1].dtype) || !kn_flt_dtype(a->in[4].dtype) || !kn_flt_dtype(a->out[0].dtype))
        return kn_refuse_type(a, "dy, total_weight and dx must be floating point");
    *flops = (uint64_t)N * (uint64_t)C;
    return ACL_SUCCESS;
}

static aclError nllgrad_run(const sim_op_args *a)
{
    int64_t N, C;
    nll_geom(a, &a->in[0], &a->in[2], &a->in[3], &N, &C);
    int64_t red = kern_attr_int(a, "reduction", RED_MEAN), ignore = kern_attr_int(a, "ignore_index", -100);
    double *dy = kn_load_d(&a->in[1]), *w = dy ? kn_load_d(&a->in[3]) : NULL, *tw = w ? kn_load_d(&a->in[4]) : NULL;
    int64_t *t = tw ? kn_load_i(&a->in[2]) : NULL;
    uint64_t nx = (uint64_t)N * (uint64_t)C;
    double *dx = t ? calloc(nx ? nx : 1, sizeof *dx) : NULL;
    if (!dx) { free(dy); free(w); free(tw); free(t); return kn_oom(a); }
    for (int64_t n = 0; n < N; n++) {
        int64_t c = nll_class(t[n], C, ignore);
        if (c < 0) continue;
        double g = red == RED_NONE ? dy[n] : dy[0];
        if (red == RED_MEAN) g /= tw[0];
        dx[n * C + c] = -w[c] * g;
    }
    kn_store_d(&a->out[0], dx);
    free(dy); free(w); free(tw); free(t); free(dx);
    return ACL_SUCCESS;
}

/* ----------------------------------------------------------- ReduceSumD */
/* x -> y summed (ReduceMeanD: averaged) over the dims in the bitmask
 * attribute "axes" (bit i: dim i; 0 = every dim); "keep_dims" keeps them as
 * size 1. */

static uint32_t red_mask(const sim_op_args *a, int nd)
{
    uint32_t m = (uint32_t)kern_attr_int(a, "axes", 0);
    return m ? m : (nd ? (uint32_t)((1ull << nd) - 1) : 0);
}

static aclError rsum_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types"))) return e;
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    uint32_t m = red_mask(a, x->ndim);
    if (x->ndim < 32 && (m >> x->ndim)) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "an axis is out of range");
    uint64_t want = 1;
    for (int i = 0; i < x->ndim; i++)
        if (!((m >> i) & 1)) want *= (uint64_t)x->dims[i];
    if (kern_numel(y) != want) return kn_shape_fail(a, "y does not hold x without the reduced axes", x, y);
    *flops = kern_numel(x);
    return ACL_SUCCESS;
}

static aclError rsum_run(const sim_op_args *a)
{
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    uint32_t m = red_mask(a, x->ndim);
    uint64_t nx = kern_numel(x), ny = kern_numel(y);
    int ints = kern_int_dtype(x->dtype) && kern_int_dtype(y->dtype);
    double *xd = NULL, *yd = NULL;
    int64_t *xi = NULL, *yi = NULL;
    if (ints) { xi = kn_load_i(x); yi = calloc(ny ? ny : 1, sizeof *yi); }
    else { xd = kn_load_d(x); yd = calloc(ny ? ny : 1, sizeof *yd); }
    if (ints ? (!xi || !yi) : (!xd || !yd)) { free(xd); free(yd); free(xi); free(yi); return kn_oom(a); }
    /* output index of each input element: the kept dims in row-major order */
    int64_t idx[SIM_MAX_DIMS] = {0};
    for (uint64_t p = 0; p < nx; p++) {
        uint64_t o = 0;
        for (int i = 0; i < x->ndim; i++)
            if (!((m >> i) & 1)) o = o * (uint64_t)x->dims[i] + (uint64_t)idx[i];
        if (ints) yi[o] += xi[p]; else yd[o] += xd[p];
        for (int i = x->ndim - 1; i >= 0; i--) {
            if (++idx[i] < x->dims[i]) break;
            idx[i] = 0;
        }
    }
    if (!strcmp(a->op_type, "ReduceMeanD") && !ints) {
        double cnt = ny ? (double)nx / (double)ny : 0;
        for (uint64_t o = 0; o < ny; o++) yd[o] /= cnt;
    }
    if (ints) kn_store_i(y, yi); else kn_store_d(y, yd);
    free(xd); free(yd); free(xi); free(yi);
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------------- Addmm */
/* self (broadcasts to [M,N]), mat1 [M,K], mat2 [K,N] -> y [M,N] =
 * beta*self + alpha*(mat1 @ mat2); beta 0 ignores self (even NaN), as PyTorch. */

static aclError addmm_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 3, 3, 1, 1)) || (e = kn_types(a, kern_float_dtype, "float32, float16, bfloat16"))) return e;
    const sim_tensor *s = &a->in[0], *m1 = &a->in[1], *m2 = &a->in[2], *y = &a->out[0];
    if (m1->ndim != 2 || m2->ndim != 2 || y->ndim != 2) return kn_shape_fail(a, "mat1, mat2 and y must be 2-D", m1, m2);
    if (m1->dims[1] != m2->dims[0]) return kn_shape_fail(a, "inner dims of mat1 and mat2 differ", m1, m2);
    if (y->dims[0] != m1->dims[0] || y->dims[1] != m2->dims[1]) return kn_shape_fail(a, "y is not [M,N]", m1, y);
    if (!kn_broadcasts_to(s, y)) return kn_shape_fail(a, "self does not broadcast to [M,N]", s, y);
    *flops = 2ull * (uint64_t)m1->dims[0] * (uint64_t)m1->dims[1] * (uint64_t)m2->dims[1];
    return ACL_SUCCESS;
}

static aclError addmm_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    int64_t M = a->in[1].dims[0], K = a->in[1].dims[1], N = a->in[2].dims[1];
    float *o1, *o2;
    const float *A = kern_in_f32(a, &a->in[1], &o1);
    const float *B = A ? kern_in_f32(a, &a->in[2], &o2) : NULL;
    float *C = B ? malloc((size_t)((M * N) != 0 ? M * N : 1) * sizeof *C) : NULL;
    double *sv = NULL;
    double beta = kn_attr_d(a, "beta", 1), alpha = kn_attr_d(a, "alpha", 1);
    if (C && beta != 0) {
        sim_tensor v;
        kern_broadcast_view(&a->in[0], y, &v);
        sv = kn_load_d(&v);
    }
    if (!C || (beta != 0 && !sv)) { free(o1); free(o2); free(C); free(sv); return kn_oom(a); }
    kern_gemm(A, B, C, M, K, N);
    double *r = malloc((size_t)((M * N) != 0 ? M * N : 1) * sizeof *r);
    if (!r) { free(o1); free(o2); free(C); free(sv); return kn_oom(a); }
    /* f32 product, then the same combination a CPU addmm makes */
    for (int64_t i = 0; i < M * N; i++) {
        float p = alpha == 1 ? C[i] : (float)(alpha * C[i]);
        r[i] = beta == 0 ? p : (beta == 1 ? (double)((float)sv[i] + p) : (double)((float)(beta * sv[i]) + p));
    }
    kn_store_d(y, r);
    free(o1); free(o2); free(C); free(sv); free(r);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------ Addcmul/Addcdiv */
/* self, t1, t2 -> y = self + value * t1 * t2 (Addcmul) or
 * self + value * t1 / t2 (Addcdiv), broadcasting; "value" attribute (the
 * aclop form passes it as a fourth, one-element input instead). */

static aclError addc_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 3, 4, 1, 1)) || (e = kn_types(a, kn_flt_dtype, "float32, float16, bfloat16, double"))) return e;
    if (a->nin == 4 && kern_numel(&a->in[3]) != 1)
        return kn_shape_fail(a, "value must have one element", &a->in[3], &a->in[3]);
    if (a->nin == 3 && !kern_attr(a, "value")) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "attribute 'value' is missing");
    if ((e = kn_bcast_out(a, 0, 3, &a->out[0]))) return e;
    *flops = 3 * kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError addc_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    double *v[3] = { NULL, NULL, NULL };
    double value = kn_attr_d(a, "value", 1);
    if (a->nin == 4) {
        double *vv = kn_load_d(&a->in[3]);
        if (!vv) return kn_oom(a);
        value = vv[0];
        free(vv);
    }
    if (!kn_load_bcast(a, 0, 3, y, 0, v, NULL)) return kn_oom(a);
    uint64_t n = kern_numel(y);
    int div = !strcmp(a->op_type, "Addcdiv");
    for (uint64_t i = 0; i < n; i++)
        v[0][i] = div ? v[0][i] + value * (v[1][i] / v[2][i]) : v[0][i] + value * (v[1][i] * v[2][i]);
    kn_store_d(y, v[0]);
    free(v[0]); free(v[1]); free(v[2]);
    return ACL_SUCCESS;
}

/* ----------------------------------------------------------------- Lerp */
/* start, end[, weight] -> y = start + weight * (end - start), broadcasting;
 * without a weight input, the "weight" attribute. */

static aclError lerp_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 2, 3, 1, 1)) || (e = kn_types(a, kn_flt_dtype, "float32, float16, bfloat16, double"))) return e;
    if (a->nin == 2 && !kern_attr(a, "weight")) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "attribute 'weight' is missing");
    if ((e = kn_bcast_out(a, 0, a->nin, &a->out[0]))) return e;
    *flops = 3 * kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError lerp_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    double *v[3] = { NULL, NULL, NULL };
    if (!kn_load_bcast(a, 0, a->nin, y, 0, v, NULL)) return kn_oom(a);
    double w = kn_attr_d(a, "weight", 0);
    uint64_t n = kern_numel(y);
    for (uint64_t i = 0; i < n; i++) {
        double wi = a->nin == 3 ? v[2][i] : w;
        v[0][i] = v[0][i] + wi * (v[1][i] - v[0][i]);
    }
    kn_store_d(y, v[0]);
    free(v[0]); free(v[1]); free(v[2]);
    return ACL_SUCCESS;
}

/* -------------------------------------------------------------- MseLoss */
/* MseLoss: x, target -> y = (x - target)^2, reduced by "reduction"
 * (0 none: x's shape, 1 mean, 2 sum: one element).
 * MseLossGrad: dy, x, target -> dx = 2 (x - target) dy (/ numel for mean). */

static aclError mse_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    int grad = !strcmp(a->op_type, "MseLossGrad");
    if ((e = kn_counts(a, grad ? 3 : 2, grad ? 3 : 2, 1, 1)) ||
        (e = kn_types(a, kn_flt_dtype, "float32, float16, bfloat16, double")))
        return e;
    const sim_tensor *x = &a->in[grad], *t = &a->in[grad + 1];
    int64_t red = kern_attr_int(a, "reduction", RED_MEAN);
    if (red < 0 || red > 2) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "reduction must be 0, 1 or 2");
    if (!kn_same_shape(x, t)) return kn_shape_fail(a, "x and target differ", x, t);
    const sim_tensor *y = grad ? &a->out[0] : &a->out[0];
    if (grad ? !kn_same_shape(y, x) : (red == RED_NONE ? !kn_same_shape(y, x) : kern_numel(y) != 1))
        return kn_shape_fail(a, "output has the wrong shape", y, x);
    if (grad && (red == RED_NONE ? !kn_same_shape(&a->in[0], x) : kern_numel(&a->in[0]) != 1))
        return kn_shape_fail(a, "dy has the wrong shape", &a->in[0], x);
    *flops = 3 * kern_numel(x);
    return ACL_SUCCESS;
}

static aclError mse_run(const sim_op_args *a)
{
    int grad = !strcmp(a->op_type, "MseLossGrad");
    int64_t red = kern_attr_int(a, "reduction", RED_MEAN);
    double *x = kn_load_d(&a->in[grad]), *t = x ? kn_load_d(&a->in[grad + 1]) : NULL;
    double *dy = (t && grad) ? kn_load_d(&a->in[0]) : NULL;
    if (!t || (grad && !dy)) { free(x); free(t); free(dy); return kn_oom(a); }
    uint64_t n = kern_numel(&a->in[grad]);
    if (!grad) {
        double sum = 0;
        for (uint64_t i = 0; i < n; i++) { x[i] = (x[i] - t[i]) * (x[i] - t[i]); sum += x[i]; }
        if (red == RED_NONE) kn_store_d(&a->out[0], x);
        else { double r = red == RED_SUM ? sum : sum / (double)n; kn_store_d(&a->out[0], &r); }
    } else {
        for (uint64_t i = 0; i < n; i++) {
            double g = red == RED_NONE ? dy[i] : dy[0];
            if (red == RED_MEAN) g /= (double)n;
            x[i] = 2.0 * (x[i] - t[i]) * g;
        }
        kn_store_d(&a->out[0], x);
    }
    free(x); free(t); free(dy);
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------- ApplyAdamWV2 */
/* grad, step -> var, m, v[, max_v] updated in place (PyTorch's AdamW):
 *   var *= 1 - lr*weight_decay;  m = lerp(m, g, 1-beta1);
 *   v = beta2*v + (1-beta2)*g^2;  (amsgrad: max_v = max(max_v, v), used below)
 *   var -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
 * with t = step + 1: op-plugin passes the step count minus one (its state
 * steps are already incremented); maximize negates g. */

static aclError adamw_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    int ams = kern_attr_int(a, "amsgrad", 0) != 0;
    if ((e = kn_counts(a, 2, 2, ams ? 4 : 3, 4))) return e;
    const sim_tensor *var = &a->out[0];
    for (int j = 0; j < a->nout; j++)
        if (!kn_flt_dtype(a->out[j].dtype) || !kn_same_shape(var, &a->out[j]))
            return kn_shape_fail(a, "var, m, v (and max_v) must be floating point of one shape", var, &a->out[j]);
    if (!kn_flt_dtype(a->in[0].dtype) || !kn_same_shape(var, &a->in[0])) return kn_shape_fail(a, "grad differs from var", &a->in[0], var);
    if (kern_numel(&a->in[1]) != 1 || !kn_num_dtype(a->in[1].dtype))
        return kn_shape_fail(a, "step must be one number", &a->in[1], &a->in[1]);
    *flops = 12 * kern_numel(var);
    return ACL_SUCCESS;
}

static aclError adamw_run(const sim_op_args *a)
{
    int ams = kern_attr_int(a, "amsgrad", 0) != 0 && a->nout == 4;
    double lr = kn_attr_d(a, "lr", 0), b1 = kn_attr_d(a, "beta1", 0.9), b2 = kn_attr_d(a, "beta2", 0.999);
    double wd = kn_attr_d(a, "weight_decay", 0), eps = kn_attr_d(a, "eps", 1e-8);
    int maximize = kern_attr_int(a, "maximize", 0) != 0;
    double *g = kn_load_d(&a->in[0]), *st = g ? kn_load_d(&a->in[1]) : NULL;
    double *var = st ? kn_load_d(&a->out[0]) : NULL, *m = var ? kn_load_d(&a->out[1]) : NULL;
    double *v = m ? kn_load_d(&a->out[2]) : NULL, *mx = (v && ams) ? kn_load_d(&a->out[3]) : NULL;
    if (!v || (ams && !mx)) { free(g); free(st); free(var); free(m); free(v); free(mx); return kn_oom(a); }
    double t = st[0] + 1.0;
    double bc1 = 1.0 - pow(b1, t), bc2s = sqrt(1.0 - pow(b2, t));
    uint64_t n = kern_numel(&a->out[0]);
    for (uint64_t i = 0; i < n; i++) {
        double gi = maximize ? -g[i] : g[i];
        var[i] *= 1.0 - lr * wd;
        m[i] += (gi - m[i]) * (1.0 - b1);
        v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
        double vv = v[i];
        if (ams) { if (v[i] > mx[i]) mx[i] = v[i]; vv = mx[i]; }
        var[i] -= lr / bc1 * m[i] / (sqrt(vv) / bc2s + eps);
    }
    kn_store_d(&a->out[0], var);
    kn_store_d(&a->out[1], m);
    kn_store_d(&a->out[2], v);
    if (ams) kn_store_d(&a->out[3], mx);
    free(g); free(st); free(var); free(m); free(v); free(mx);
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------------- table */

static const sim_kernel_def g_nn_kernels[] = {
    { "Cast", cast_check, cast_run, 0 },
    { "ViewCopy", cast_check, cast_run, 0 },
    { "Div", ew2_check, ew2_run, 0 },
    { "RealDiv", ew2_check, ew2_run, 0 },
    { "Maximum", ew2_check, ew2_run, 0 },
    { "Minimum", ew2_check, ew2_run, 0 },
    { "Adds", scal_check, scal_run, 0 },
    { "Subs", scal_check, scal_run, 0 },
    { "Muls", scal_check, scal_run, 0 },
    { "Divs", scal_check, scal_run, 0 },
    { "Sqrt", un_check, un_run, 0 },
    { "Rsqrt", un_check, un_run, 0 },
    { "Neg", un_check, un_run, 0 },
    { "Exp", un_check, un_run, 0 },
    { "Log", un_check, un_run, 0 },
    { "Abs", un_check, un_run, 0 },
    { "Reciprocal", un_check, un_run, 0 },
    { "Gelu", un_check, un_run, 0 },
    { "GeluGrad", grad2_check, grad2_run, 0 },
    { "ThresholdGradV2D", grad2_check, grad2_run, 0 },
    { "LogSoftmaxV2", lsm_check, lsm_run, 0 },
    { "LogSoftmaxGrad", lsm_check, lsm_run, 0 },
    { "NLLLoss", nll_check, nll_run, 0 },
    { "NLLLossGrad", nllgrad_check, nllgrad_run, 0 },
    { "ReduceSumD", rsum_check, rsum_run, 0 },
    { "Addmm", addmm_check, addmm_run, 0 },
    { "Addcmul", addc_check, addc_run, 0 },
    { "Addcdiv", addc_check, addc_run, 0 },
    { "Lerp", lerp_check, lerp_run, 0 },
    { "ReduceMeanD", rsum_check, rsum_run, 0 },
    { "MseLoss", mse_check, mse_run, 0 },
    { "MseLossGrad", mse_check, mse_run, 0 },
    { "ApplyAdamWV2", adamw_check, adamw_run, 0 },
};

static const sim_kernel_def *kern_find_foreach(const char *op_type);

const sim_kernel_def *kern_find_nn(const char *op_type)
{
    for (size_t i = 0; i < sizeof g_nn_kernels / sizeof g_nn_kernels[0]; i++)
        if (strcmp(g_nn_kernels[i].name, op_type) == 0) return &g_nn_kernels[i];
    return kern_find_foreach(op_type);
}

/* ------------------------------------------------------------- Foreach */
/* Foreach<Op>: attribute "n" = list length; inputs are the input lists one
 * after another (list k, element i at in[k*n + i]), outputs the n results.
 * The scalar comes from attribute "scalar", or per element from "scalar<i>"
 * (scalar-list variants), or — "scalar_input" = 1 — from a one-element
 * device tensor after the lists (the V1 aclnn variants).
 *   AddScalar x+s, SubScalar x-s, MulScalar x*s, DivScalar x/s,
 *   AddList x1+s*x2 (s default 1), SubList x1-s*x2, MulList x1*x2,
 *   DivList x1/x2, LerpScalar x1+s*(x2-x1), LerpList x1+x3*(x2-x1),
 *   AddcmulScalar x1+s*x2*x3, AddcdivScalar x1+s*x2/x3, Sqrt, Neg,
 *   Reciprocal, Exp. */

typedef struct fe_def { const char *name; int lists; int scalar; } fe_def;
static const fe_def g_fe[] = {
    { "ForeachAddScalar", 1, 1 }, { "ForeachSubScalar", 1, 1 }, { "ForeachMulScalar", 1, 1 },
    { "ForeachDivScalar", 1, 1 }, { "ForeachAddList", 2, 0 }, { "ForeachSubList", 2, 0 },
    { "ForeachMulList", 2, 0 }, { "ForeachDivList", 2, 0 }, { "ForeachLerpScalar", 2, 1 },
    { "ForeachLerpList", 3, 0 }, { "ForeachAddcmulScalar", 3, 1 }, { "ForeachAddcdivScalar", 3, 1 },
    { "ForeachSqrt", 1, 0 }, { "ForeachNeg", 1, 0 }, { "ForeachReciprocal", 1, 0 }, { "ForeachExp", 1, 0 },
};

static const fe_def *fe_find(const char *t)
{
    for (size_t i = 0; i < sizeof g_fe / sizeof g_fe[0]; i++)
        if (!strcmp(g_fe[i].name, t)) return &g_fe[i];
    return NULL;
}

static aclError fe_check(const sim_op_args *a, uint64_t *flops)
{
    const fe_def *d = fe_find(a->op_type);
    int64_t n = kern_attr_int(a, "n", -1);
    int sin = (int)kern_attr_int(a, "scalar_input", 0) != 0;
    if (n < 1 || a->nin != d->lists * n + sin || a->nout != n)
        return kn_fail(a, ACL_ERROR_OP_INPUT_NOT_MATCH, "list lengths do not match (attribute n, inputs, outputs)");
    aclError e;
    if ((e = kn_types(a, kn_flt_dtype, "float32, float16, bfloat16, double"))) return e;
    if (sin && kern_numel(&a->in[a->nin - 1]) != 1 && kern_numel(&a->in[a->nin - 1]) != (uint64_t)n)
        return kn_shape_fail(a, "the scalar tensor must have one element or one per list element",
            &a->in[a->nin - 1], &a->in[a->nin - 1]);
    if (d->scalar && !sin && !kern_attr(a, "scalar")) {
        char nm[32];
        for (int64_t i = 0; i < n; i++) {
            snprintf(nm, sizeof nm, "scalar%lld", (long long)i);
            if (!kern_attr(a, nm)) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "a scalar is missing");
        }
    }
    uint64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        for (int k = 1; k < d->lists; k++)
            if (!kn_same_shape(&a->in[i], &a->in[k * n + i])) return kn_shape_fail(a, "list elements differ", &a->in[i], &a->in[k * n + i]);
        if (!kn_same_shape(&a->in[i], &a->out[i])) return kn_shape_fail(a, "output differs from input", &a->in[i], &a->out[i]);
        total += kern_numel(&a->out[i]);
    }
    *flops = total * (uint64_t)d->lists;
    return ACL_SUCCESS;
}

static aclError fe_run(const sim_op_args *a)
{
    const fe_def *d = fe_find(a->op_type);
    int n = (int)kern_attr_int(a, "n", 0);
    int sin = (int)kern_attr_int(a, "scalar_input", 0) != 0;
    double s_all = kn_attr_d(a, "scalar", 1.0);
    double *sv = NULL;   /* per-element scalars from a device tensor */
    if (sin) {
        sv = kn_load_d(&a->in[a->nin - 1]);
        if (!sv) return kn_oom(a);
        s_all = sv[0];
        if (kern_numel(&a->in[a->nin - 1]) == 1) { free(sv); sv = NULL; }
    }
    /* every input of every element is read before any output is written */
    int nl = d->lists * n;
    double **v = calloc((size_t)nl, sizeof *v);
    if (!v) { free(sv); return kn_oom(a); }
    for (int k = 0; k < nl; k++)
        if (!(v[k] = kn_load_d(&a->in[k]))) {
            for (int q = 0; q < k; q++) free(v[q]);
            free(v);
            free(sv);
            return kn_oom(a);
        }
    /* the operation, decided once (not per element) */
    static const char *const names[] = { "AddScalar", "SubScalar", "MulScalar", "DivScalar", "AddList", "SubList",
        "MulList", "DivList", "LerpScalar", "LerpList", "AddcmulScalar", "AddcdivScalar", "Sqrt", "Neg",
        "Reciprocal", "Exp" };
    int op = 0;
    while (op < 15 && strcmp(a->op_type + 7, names[op])) op++;   /* after "Foreach" */
    for (int i = 0; i < n; i++) {
        double s = s_all;
        char nm[32];
        snprintf(nm, sizeof nm, "scalar%d", i);
        if (kern_attr(a, nm)) s = kn_attr_d(a, nm, 1.0);
        if (sv) s = sv[i];
        double *x1 = v[i], *x2 = d->lists > 1 ? v[n + i] : NULL, *x3 = d->lists > 2 ? v[2 * n + i] : NULL;
        uint64_t m = kern_numel(&a->out[i]);
        for (uint64_t j = 0; j < m; j++) {
            double x = x1[j];
            switch (op) {
            case 0: x = x + s; break;
            case 1: x = x - s; break;
            case 2: x = x * s; break;
            case 3: x = x / s; break;
            case 4: x = x + s * x2[j]; break;
            case 5: x = x - s * x2[j]; break;
            case 6: x = x * x2[j]; break;
            case 7: x = x / x2[j]; break;
            case 8: x = x + s * (x2[j] - x); break;
            case 9: x = x + x3[j] * (x2[j] - x); break;
            case 10: x = x + s * x2[j] * x3[j]; break;
            case 11: x = x + s * x2[j] / x3[j]; break;
            case 12: x = sqrt(x); break;
            case 13: x = -x; break;
            case 14: x = 1.0 / x; break;
            default: x = exp(x); break;
            }
            x1[j] = x;
        }
    }
    for (int i = 0; i < n; i++) kn_store_d(&a->out[i], v[i]);
    for (int k = 0; k < nl; k++) free(v[k]);
    free(v);
    free(sv);
    return ACL_SUCCESS;
}

#define FE(name) { name, fe_check, fe_run, 0 }
static const sim_kernel_def g_fe_kernels[] = {
    FE("ForeachAddScalar"), FE("ForeachSubScalar"), FE("ForeachMulScalar"), FE("ForeachDivScalar"),
    FE("ForeachAddList"), FE("ForeachSubList"), FE("ForeachMulList"), FE("ForeachDivList"),
    FE("ForeachLerpScalar"), FE("ForeachLerpList"), FE("ForeachAddcmulScalar"), FE("ForeachAddcdivScalar"),
    FE("ForeachSqrt"), FE("ForeachNeg"), FE("ForeachReciprocal"), FE("ForeachExp"),
};

static const sim_kernel_def *kern_find_foreach(const char *op_type)
{
    for (size_t i = 0; i < sizeof g_fe_kernels / sizeof g_fe_kernels[0]; i++)
        if (!strcmp(g_fe_kernels[i].name, op_type) && fe_find(op_type)) return &g_fe_kernels[i];
    return NULL;
}

/* the i-th kernel of this file's tables, NULL past the end */
const char *kern_nn_name(int i)
{
    int n1 = (int)(sizeof g_nn_kernels / sizeof g_nn_kernels[0]);
    int n2 = (int)(sizeof g_fe_kernels / sizeof g_fe_kernels[0]);
    if (i < 0) return NULL;
    if (i < n1) return g_nn_kernels[i].name;
    return i - n1 < n2 ? g_fe_kernels[i - n1].name : NULL;
}
