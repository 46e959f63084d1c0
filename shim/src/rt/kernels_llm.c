/* Fused transformer kernels: layer norm and RMS norm (forward and backward),
 * rotary position embedding (and its gradient), SwiGLU (and its gradient),
 * the softmax gradient, and FlashAttentionScore forward and backward (the
 * attention torch_npu's scaled_dot_product_attention and npu_fusion_attention
 * launch: layouts BSH/SBH/BNSD/BSND, grouped-query heads, boolean masks,
 * causal and band sparse modes, the softmax max/sum statistics the backward
 * consumes). See docs/simulator-ops.md.
 *
 * All arithmetic is in double, rounded once when stored; float16/bfloat16
 * inputs are exact in double, so results match a float32 CPU computation
 * within its rounding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rt/kernels_util.h"

static int is_float(int dt) { return kn_flt_dtype(dt); }

/* elements of the trailing k dims, and of the rest */
static void rows_of(const sim_tensor *t, int k, uint64_t *rows, uint64_t *inner)
{
    *rows = 1; *inner = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (i < t->ndim - k) *rows *= (uint64_t)t->dims[i];
        else *inner *= (uint64_t)t->dims[i];
    }
}

/* ----------------------------------------------------------- LayerNorm */
/* x [*, normalized], gamma?, beta? (attributes "has_gamma", "has_beta") ->
 * y, mean?, rstd? (outputs in that order; "out_mean", "out_rstd" say which
 * are present). "norm_ndim" trailing dims are normalised; "eps". mean and
 * rstd hold one value per row (any shape with that many elements).
 *   y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(var + eps)
 * (biased variance), as torch.nn.functional.layer_norm. */

static aclError ln_check(const sim_op_args *a, uint64_t *flops)
{
    int hg = kern_attr_int(a, "has_gamma", 0) != 0, hb = kern_attr_int(a, "has_beta", 0) != 0;
    int om = kern_attr_int(a, "out_mean", 0) != 0, orr = kern_attr_int(a, "out_rstd", 0) != 0;
    aclError e;
    if ((e = kn_counts(a, 1 + hg + hb, 1 + hg + hb, 1 + om + orr, 1 + om + orr)) ||
        (e = kn_types(a, is_float, "float32, float16, bfloat16, float64")))
        return e;
    const sim_tensor *x = &a->in[0];
    int k = (int)kern_attr_int(a, "norm_ndim", 1);
    if (k < 1 || k > x->ndim) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "norm_ndim is out of range");
    uint64_t rows, inner;
    rows_of(x, k, &rows, &inner);
    for (int i = 1; i < a->nin; i++)
        if (kern_numel(&a->in[i]) != inner) return kn_shape_fail(a, "gamma and beta must have the normalized shape", &a->in[i], x);
    if (!kn_same_shape(x, &a->out[0])) return kn_shape_fail(a, "x and y differ", x, &a->out[0]);
    for (int j = 1; j < a->nout; j++)
        if (kern_numel(&a->out[j]) != rows) return kn_shape_fail(a, "mean and rstd need one element per row", &a->out[j], x);
    *flops = 8 * kern_numel(x);
    return ACL_SUCCESS;
}

static aclError ln_run(const sim_op_args *a)
{
    int hg = kern_attr_int(a, "has_gamma", 0) != 0, hb = kern_attr_int(a, "has_beta", 0) != 0;
    int om = kern_attr_int(a, "out_mean", 0) != 0, orr = kern_attr_int(a, "out_rstd", 0) != 0;
    const sim_tensor *x = &a->in[0];
    int k = (int)kern_attr_int(a, "norm_ndim", 1);
    double eps = kn_attr_d(a, "eps", 1e-5);
    uint64_t rows, inner;
    rows_of(x, k, &rows, &inner);
    double *v = kn_load_d(x), *g = hg ? kn_load_d(&a->in[1]) : NULL, *b = hb ? kn_load_d(&a->in[1 + hg]) : NULL;
    double *mean = malloc((rows ? rows : 1) * sizeof *mean), *rstd = malloc((rows ? rows : 1) * sizeof *rstd);
    if (!v || (hg && !g) || (hb && !b) || !mean || !rstd) {
        free(v); free(g); free(b); free(mean); free(rstd);
        return kn_oom(a);
    }
    for (uint64_t r = 0; r < rows; r++) {
        double *row = v + r * inner, s = 0, ss = 0;
        for (uint64_t i = 0; i < inner; i++) s += row[i];
        double m = s / (double)inner;
        for (uint64_t i = 0; i < inner; i++) ss += (row[i] - m) * (row[i] - m);
        double rs = 1.0 / sqrt(ss / (double)inner + eps);
        for (uint64_t i = 0; i < inner; i++) {
            double y = (row[i] - m) * rs;
            if (hg) y *= g[i];
            if (hb) y += b[i];
            row[i] = y;
        }
        mean[r] = m;
        rstd[r] = rs;
    }
    kn_store_d(&a->out[0], v);
    if (om) kn_store_d(&a->out[1], mean);
    if (orr) kn_store_d(&a->out[1 + om], rstd);
    free(v); free(g); free(b); free(mean); free(rstd);
    return ACL_SUCCESS;
}

/* LayerNormGrad: dy, x, mean, rstd, gamma? -> dx?, dgamma?, dbeta? (outputs
 * present by "out_mask" bits 0..2, in that order; "norm_ndim").
 *   xhat = (x - mean) * rstd,  g = dy * gamma
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
 *   dgamma = sum over rows of dy * xhat,  dbeta = sum over rows of dy */

static aclError lng_check(const sim_op_args *a, uint64_t *flops)
{
    int hg = kern_attr_int(a, "has_gamma", 0) != 0;
    uint32_t mask = (uint32_t)kern_attr_int(a, "out_mask", 7);
    int nout = (int)(mask & 1) + (int)((mask >> 1) & 1) + (int)((mask >> 2) & 1);
    aclError e;
    if ((e = kn_counts(a, 4 + hg, 4 + hg, nout, nout)) || (e = kn_types(a, is_float, "float32, float16, bfloat16, float64")))
        return e;
    if (nout == 0) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "no output requested");
    const sim_tensor *dy = &a->in[0], *x = &a->in[1];
    int k = (int)kern_attr_int(a, "norm_ndim", 1);
    if (k < 1 || k > x->ndim) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "norm_ndim is out of range");
    uint64_t rows, inner;
    rows_of(x, k, &rows, &inner);
    if (!kn_same_shape(dy, x)) return kn_shape_fail(a, "dy and x differ", dy, x);
    if (kern_numel(&a->in[2]) != rows || kern_numel(&a->in[3]) != rows)
        return kn_shape_fail(a, "mean and rstd need one element per row", &a->in[2], x);
    if (hg && kern_numel(&a->in[4]) != inner) return kn_shape_fail(a, "gamma must have the normalized shape", &a->in[4], x);
    int j = 0;
    if ((mask & 1) && !kn_same_shape(&a->out[j++], x)) return kn_shape_fail(a, "dx must have x's shape", &a->out[0], x);
    for (int bit = 1; bit < 3; bit++)
        if ((mask >> bit) & 1) {
            if (kern_numel(&a->out[j]) != inner) return kn_shape_fail(a, "dgamma and dbeta must have the normalized shape", &a->out[j], x);
            j++;
        }
    *flops = 10 * kern_numel(x);
    return ACL_SUCCESS;
}

static aclError lng_run(const sim_op_args *a)
{
    int hg = kern_attr_int(a, "has_gamma", 0) != 0;
    uint32_t mask = (uint32_t)kern_attr_int(a, "out_mask", 7);
    const sim_tensor *x = &a->in[1];
    int k = (int)kern_attr_int(a, "norm_ndim", 1);
    uint64_t rows, inner;
    rows_of(x, k, &rows, &inner);
    double *dy = kn_load_d(&a->in[0]), *xv = kn_load_d(x), *mean = kn_load_d(&a->in[2]), *rstd = kn_load_d(&a->in[3]);
    double *g = hg ? kn_load_d(&a->in[4]) : NULL;
    double *dx = calloc(kern_numel(x) ? kern_numel(x) : 1, sizeof *dx);
    double *dg = calloc(inner ? inner : 1, sizeof *dg), *db = calloc(inner ? inner : 1, sizeof *db);
    if (!dy || !xv || !mean || !rstd || (hg && !g) || !dx || !dg || !db) {
        free(dy); free(xv); free(mean); free(rstd); free(g); free(dx); free(dg); free(db);
        return kn_oom(a);
    }
    for (uint64_t r = 0; r < rows; r++) {
        const double *dr = dy + r * inner, *xr = xv + r * inner;
        double m = mean[r], rs = rstd[r], sg = 0, sgx = 0;
        for (uint64_t i = 0; i < inner; i++) {
            double xh = (xr[i] - m) * rs, gi = dr[i] * (hg ? g[i] : 1.0);
            sg += gi;
            sgx += gi * xh;
            dg[i] += dr[i] * xh;
            db[i] += dr[i];
        }
        sg /= (double)inner;
        sgx /= (double)inner;
        for (uint64_t i = 0; i < inner; i++) {
            double xh = (xr[i] - m) * rs, gi = dr[i] * (hg ? g[i] : 1.0);
            dx[r * inner + i] = rs * (gi - sg - xh * sgx);
        }
    }
    int j = 0;
    if (mask & 1) kn_store_d(&a->out[j++], dx);
    if ((mask >> 1) & 1) kn_store_d(&a->out[j++], dg);
    if ((mask >> 2) & 1) kn_store_d(&a->out[j++], db);
    free(dy); free(xv); free(mean); free(rstd); free(g); free(dx); free(dg); free(db);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------- RmsNorm */
/* RmsNorm: x, gamma -> y, rstd: over gamma's trailing dims,
 *   rstd = 1 / sqrt(mean(x^2) + eps), y = x * rstd * gamma.
 * RmsNormGrad: dy, x, rstd, gamma -> dx, dgamma:
 *   g = dy * gamma, dx = rstd * g - x * rstd^3 * mean(g * x),
 *   dgamma = sum over rows of dy * x * rstd. */

static aclError rms_check(const sim_op_args *a, uint64_t *flops)
{
    int grad = !strcmp(a->op_type, "RmsNormGrad");
    aclError e;
    if ((e = kn_counts(a, grad ? 4 : 2, grad ? 4 : 2, 2, 2)) ||
        (e = kn_types(a, is_float, "float32, float16, bfloat16, float64")))
        return e;
    const sim_tensor *x = &a->in[grad], *g = &a->in[grad ? 3 : 1];
    if (g->ndim < 1 || g->ndim > x->ndim) return kn_shape_fail(a, "gamma must match x's trailing dims", g, x);
    for (int i = 0; i < g->ndim; i++)
        if (g->dims[i] != x->dims[x->ndim - g->ndim + i]) return kn_shape_fail(a, "gamma must match x's trailing dims", g, x);
    uint64_t rows, inner;
    rows_of(x, g->ndim, &rows, &inner);
    if (grad) {
        if (!kn_same_shape(&a->in[0], x)) return kn_shape_fail(a, "dy and x differ", &a->in[0], x);
        if (kern_numel(&a->in[2]) != rows) return kn_shape_fail(a, "rstd needs one element per row", &a->in[2], x);
        if (!kn_same_shape(&a->out[0], x) || kern_numel(&a->out[1]) != inner)
            return kn_shape_fail(a, "dx must have x's shape and dgamma gamma's", &a->out[0], x);
    } else {
        if (!kn_same_shape(&a->out[0], x)) return kn_shape_fail(a, "x and y differ", x, &a->out[0]);
        if (kern_numel(&a->out[1]) != rows) return kn_shape_fail(a, "rstd needs one element per row", &a->out[1], x);
    }
    *flops = 6 * kern_numel(x);
    return ACL_SUCCESS;
}

static aclError rms_run(const sim_op_args *a)
{
    int grad = !strcmp(a->op_type, "RmsNormGrad");
    const sim_tensor *x = &a->in[grad], *gt = &a->in[grad ? 3 : 1];
    uint64_t rows, inner;
    rows_of(x, gt->ndim, &rows, &inner);
    double eps = kn_attr_d(a, "eps", 1e-6);
    double *xv = kn_load_d(x), *g = kn_load_d(gt);
    double *dy = grad ? kn_load_d(&a->in[0]) : NULL, *rs = grad ? kn_load_d(&a->in[2]) : NULL;
    double *r2 = grad ? NULL : malloc((rows ? rows : 1) * sizeof *r2);
    double *dg = grad ? calloc(inner ? inner : 1, sizeof *dg) : NULL;
    if (!xv || !g || (grad ? (!dy || !rs || !dg) : !r2)) {
        free(xv); free(g); free(dy); free(rs); free(r2); free(dg);
        return kn_oom(a);
    }
    for (uint64_t r = 0; r < rows; r++) {
        double *xr = xv + r * inner;
        if (!grad) {
            double ss = 0;
            for (uint64_t i = 0; i < inner; i++) ss += xr[i] * xr[i];
            double rstd = 1.0 / sqrt(ss / (double)inner + eps);
            for (uint64_t i = 0; i < inner; i++) xr[i] = xr[i] * rstd * g[i];
            r2[r] = rstd;
        } else {
            double *dr = dy + r * inner, rstd = rs[r], s = 0;
            for (uint64_t i = 0; i < inner; i++) s += dr[i] * g[i] * xr[i];
            s /= (double)inner;
            for (uint64_t i = 0; i < inner; i++) {
                dg[i] += dr[i] * xr[i] * rstd;
                dr[i] = rstd * dr[i] * g[i] - xr[i] * rstd * rstd * rstd * s;
            }
        }
    }
    if (!grad) {
        kn_store_d(&a->out[0], xv);
        kn_store_d(&a->out[1], r2);
    } else {
        kn_store_d(&a->out[0], dy);
        kn_store_d(&a->out[1], dg);
    }
    free(xv); free(g); free(dy); free(rs); free(r2); free(dg);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------- RoPE */
/* RotaryPositionEmbedding: x, cos, sin (broadcast to x) -> y = x * cos +
 *   rot(x) * sin, "mode" 0 (half: rot(x) = [-x2, x1] over the last dim's
 *   halves) or 1 (interleave: pairs (x0, x1) -> (-x1, x0)).
 * RotaryPositionEmbeddingGrad: dy, cos, sin[, x] -> dx[, dcos, dsin]:
 *   dx = dy * cos + rot^T(dy * sin); dcos, dsin: dy * x and dy * rot(x)
 *   summed to cos's and sin's shapes (needs x). */

/* rot(v) (transpose: rot^T) along the last dim of length D, in place into out */
static void rotate(const double *v, double *out, uint64_t n, uint64_t D, int mode, int transpose)
{
    for (uint64_t base = 0; base < n; base += D)
        for (uint64_t i = 0; i < D; i++) {
            double r;
            if (mode == 0) {
                uint64_t h = D / 2;
                /* rot: [-x2, x1]; rot^T: [x2, -x1] */
                r = i < h ? (transpose ? v[base + i + h] : -v[base + i + h]) : (transpose ? -v[base + i - h] : v[base + i - h]);
            } else {
                /* rot: (x0, x1) -> (-x1, x0); rot^T: (x1, -x0) */
                r = (i & 1) == 0 ? (transpose ? v[base + i + 1] : -v[base + i + 1]) : (transpose ? -v[base + i - 1] : v[base + i - 1]);
            }
            out[base + i] = r;
        }
}

static aclError rope_check(const sim_op_args *a, uint64_t *flops)
{
    int grad = !strcmp(a->op_type, "RotaryPositionEmbeddingGrad");
    aclError e;
    if (grad) e = kn_counts(a, 3, 4, a->nin == 4 ? 3 : 1, a->nin == 4 ? 3 : 1);
    else e = kn_counts(a, 3, 3, 1, 1);
    if (e || (e = kn_types(a, is_float, "float32, float16, bfloat16, float64"))) return e;
    const sim_tensor *x = &a->in[0];
    int64_t mode = kern_attr_int(a, "mode", 0);
    if (mode != 0 && mode != 1) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "mode must be 0 (half) or 1 (interleave)");
    if (x->ndim < 1 || x->dims[x->ndim - 1] % 2) return kn_shape_fail(a, "the last dim must be even", x, x);
    if (!kn_broadcasts_to(&a->in[1], x) || !kn_broadcasts_to(&a->in[2], x))
        return kn_shape_fail(a, "cos and sin must broadcast to x", &a->in[1], x);
    if (!kn_same_shape(&a->out[0], x)) return kn_shape_fail(a, "the output must have x's shape", &a->out[0], x);
    if (grad && a->nin == 4) {
        if (!kn_same_shape(&a->in[3], x)) return kn_shape_fail(a, "x and dy differ", &a->in[3], x);
        if (!kn_same_shape(&a->out[1], &a->in[1]) || !kn_same_shape(&a->out[2], &a->in[2]))
            return kn_shape_fail(a, "dcos and dsin must have cos's and sin's shapes", &a->out[1], &a->in[1]);
    }
    *flops = 4 * kern_numel(x);
    return ACL_SUCCESS;
}

/* sum of v (x's shape) onto the elements of the broadcast source `small` */
static double *unbroadcast(const double *v, const sim_tensor *x, const sim_tensor *small)
{
    uint64_t n = kern_numel(x), m = kern_numel(small);
    double *r = calloc(m ? m : 1, sizeof *r);
    if (!r) return NULL;
    int off = x->ndim - small->ndim;
    int64_t idx[SIM_MAX_DIMS] = {0};
    for (uint64_t p = 0; p < n; p++) {
        uint64_t q = 0;
        for (int i = 0; i < small->ndim; i++)
            q = q * (uint64_t)small->dims[i] + (uint64_t)(small->dims[i] == 1 ? 0 : idx[off + i]);
        r[q] += v[p];
        for (int i = x->ndim - 1; i >= 0; i--) {
            if (++idx[i] < x->dims[i]) break;
            idx[i] = 0;
        }
    }
    return r;
}

/* dx = dy * cos + rot^T(dy * sin) into tmp (then stored); dcos, dsin when x
 * is given */
static aclError rope_grad(const sim_op_args *a, const double *dy, const double *cs, const double *sn, double *tmp,
    uint64_t n, uint64_t D, int mode)
{
    const sim_tensor *x = &a->in[0];
    double *ds = calloc(n ? n : 1, sizeof *ds);
    double *xv = a->nin == 4 ? kn_load_d(&a->in[3]) : NULL;
    double *rx = a->nin == 4 ? malloc((n ? n : 1) * sizeof *rx) : NULL;
    if (!ds || (a->nin == 4 && (!xv || !rx))) { free(ds); free(xv); free(rx); return kn_oom(a); }
    for (uint64_t i = 0; i < n; i++) ds[i] = dy[i] * sn[i];
    rotate(ds, tmp, n, D, mode, 1);
    for (uint64_t i = 0; i < n; i++) tmp[i] += dy[i] * cs[i];
    aclError rc = ACL_SUCCESS;
    if (xv) {
        rotate(xv, rx, n, D, mode, 0);
        for (uint64_t i = 0; i < n; i++) { xv[i] *= dy[i]; rx[i] *= dy[i]; }
        double *dc = unbroadcast(xv, x, &a->in[1]), *dsn = unbroadcast(rx, x, &a->in[2]);
        if (!dc || !dsn) rc = kn_oom(a);
        else { kn_store_d(&a->out[1], dc); kn_store_d(&a->out[2], dsn); }
        free(dc); free(dsn);
    }
    if (!rc) kn_store_d(&a->out[0], tmp);
    free(ds); free(xv); free(rx);
    return rc;
}

static aclError rope_run(const sim_op_args *a)
{
    int grad = !strcmp(a->op_type, "RotaryPositionEmbeddingGrad");
    const sim_tensor *x = &a->in[0];
    int mode = (int)kern_attr_int(a, "mode", 0);
    uint64_t n = kern_numel(x), D = (uint64_t)x->dims[x->ndim - 1];
    double *c[3] = { NULL, NULL, NULL };
    double *v = kn_load_d(x), *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!v || !tmp || !kn_load_bcast(a, 1, 2, x, 0, c + 1, NULL)) { free(v); free(tmp); free(c[1]); free(c[2]); return kn_oom(a); }
    double *cs = c[1], *sn = c[2];
    aclError rc = ACL_SUCCESS;
    if (!grad) {
        rotate(v, tmp, n, D, mode, 0);
        for (uint64_t i = 0; i < n; i++) tmp[i] = v[i] * cs[i] + tmp[i] * sn[i];
        kn_store_d(&a->out[0], tmp);
    } else {
        rc = rope_grad(a, v, cs, sn, tmp, n, D, mode);
    }
    free(v); free(tmp); free(cs); free(sn);
    return rc;
}

/* -------------------------------------------------------------- SwiGlu */
/* SwiGlu: x -> y: x split in halves A, B along "dim"; y = silu(A) * B.
 * SwiGluGrad: dy, x -> dx: dA = dy * B * silu'(A), dB = dy * silu(A). */

static void swiglu_geom(const sim_tensor *x, int d, uint64_t *outer, uint64_t *half, uint64_t *inner)
{
    *outer = 1; *inner = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < d) *outer *= (uint64_t)x->dims[i];
        else if (i > d) *inner *= (uint64_t)x->dims[i];
    }
    *half = (uint64_t)x->dims[d] / 2;
}

static aclError swiglu_check(const sim_op_args *a, uint64_t *flops)
{
    int grad = !strcmp(a->op_type, "SwiGluGrad");
    aclError e;
    if ((e = kn_counts(a, grad ? 2 : 1, grad ? 2 : 1, 1, 1)) ||
        (e = kn_types(a, is_float, "float32, float16, bfloat16, float64")))
        return e;
    const sim_tensor *x = &a->in[grad];
    int d = kn_norm_axis(kern_attr_int(a, "dim", -1), x->ndim);
    if (d < 0 || x->dims[d] % 2) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "dim must be a dimension of even size");
    const sim_tensor *half = grad ? &a->in[0] : &a->out[0];
    if (half->ndim != x->ndim) return kn_shape_fail(a, "y must be x with dim halved", half, x);
    for (int i = 0; i < x->ndim; i++)
        if (half->dims[i] != (i == d ? x->dims[i] / 2 : x->dims[i])) return kn_shape_fail(a, "y must be x with dim halved", half, x);
    if (grad && !kn_same_shape(&a->out[0], x)) return kn_shape_fail(a, "dx must have x's shape", &a->out[0], x);
    *flops = 6 * kern_numel(x);
    return ACL_SUCCESS;
}

static aclError swiglu_run(const sim_op_args *a)
{
    int grad = !strcmp(a->op_type, "SwiGluGrad");
    const sim_tensor *x = &a->in[grad];
    int d = kn_norm_axis(kern_attr_int(a, "dim", -1), x->ndim);
    uint64_t outer, half, inner;
    swiglu_geom(x, d, &outer, &half, &inner);
    double *xv = kn_load_d(x), *dy = grad ? kn_load_d(&a->in[0]) : NULL;
    uint64_t ny = outer * half * inner;
    double *y = grad ? NULL : malloc((ny ? ny : 1) * sizeof *y);
    if (!xv || (grad ? !dy : !y)) { free(xv); free(dy); free(y); return kn_oom(a); }
    for (uint64_t o = 0; o < outer; o++)
        for (uint64_t h = 0; h < half; h++)
            for (uint64_t r = 0; r < inner; r++) {
                uint64_t pa = (o * 2 * half + h) * inner + r, pb = (o * 2 * half + half + h) * inner + r;
                uint64_t q = (o * half + h) * inner + r;
                double A = xv[pa], B = xv[pb], s = 1.0 / (1.0 + exp(-A)), silu = A * s;
                if (!grad) {
                    y[q] = silu * B;
                } else {
                    double g = dy[q];
                    xv[pa] = g * B * s * (1.0 + A * (1.0 - s));
                    xv[pb] = g * silu;
                }
            }
    kn_store_d(&a->out[0], grad ? xv : y);
    free(xv); free(dy); free(y);
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------- SoftmaxGrad */
/* dy, y -> dx = y * (dy - sum(dy * y)) along "axis". */

static aclError smg_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 2, 2, 1, 1)) || (e = kn_types(a, is_float, "float32, float16, bfloat16, float64"))) return e;
    if (!kn_same_shape(&a->in[0], &a->in[1]) || !kn_same_shape(&a->in[0], &a->out[0]))
        return kn_shape_fail(a, "dy, y and dx must have one shape", &a->in[0], &a->in[1]);
    if (a->in[0].ndim && kn_norm_axis(kern_attr_int(a, "axis", -1), a->in[0].ndim) < 0)
        return kn_fail(a, ACL_ERROR_INVALID_PARAM, "axis is out of range");
    *flops = 4 * kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError smg_run(const sim_op_args *a)
{
    const sim_tensor *t = &a->in[0];
    int ax = t->ndim ? kn_norm_axis(kern_attr_int(a, "axis", -1), t->ndim) : 0;
    uint64_t outer = 1, d = 1, inner = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (i < ax) outer *= (uint64_t)t->dims[i];
        else if (i == ax) d = (uint64_t)t->dims[i];
        else inner *= (uint64_t)t->dims[i];
    }
    double *dy = kn_load_d(&a->in[0]), *y = kn_load_d(&a->in[1]);
    if (!dy || !y) { free(dy); free(y); return kn_oom(a); }
    for (uint64_t o = 0; o < outer; o++)
        for (uint64_t r = 0; r < inner; r++) {
            double s = 0;
            for (uint64_t k = 0; k < d; k++) s += dy[(o * d + k) * inner + r] * y[(o * d + k) * inner + r];
            for (uint64_t k = 0; k < d; k++) {
                uint64_t p = (o * d + k) * inner + r;
                dy[p] = y[p] * (dy[p] - s);
            }
        }
    kn_store_d(&a->out[0], dy);
    free(dy); free(y);
    return ACL_SUCCESS;
}

/* -------------------------------------------------- FlashAttentionScore */
/* Forward: q, k, v[, atten_mask] -> softmax_max, softmax_sum, attention_out
 * Backward: q, k, v, dy[, atten_mask], softmax_max, softmax_sum[,
 *   attention_in] -> dq, dk, dv
 * Attributes: "layout" (0 BSH, 1 SBH, 2 BNSD, 3 BSND), "head_num" (query
 * heads N1; key/value heads N2 = N1 / group come from k's shape), "scale",
 * "sparse_mode", "pre_tokens", "next_tokens", "has_mask" and, for the
 * backward, "has_attention_in". The mask (bool or uint8; 1 = masked out) is
 * [S1, S2], [B or 1, N1 or 1, S1, S2]; sparse modes 2 (causal from the top
 * left), 3 (causal from the bottom right) and 4 (band from the bottom right
 * by pre/next tokens) compute their band, as CANN does with its compressed
 * mask; modes 0 and 1 apply the mask, mode 0 also the pre/next-token band.
 * Without a mask nothing is masked, whatever the mode (CANN's rule).
 * softmax_max/sum are [B, N1, S1, 8] float32: the row maximum of the scaled,
 * masked scores and the sum of exp(score - max), repeated 8 times. A fully
 * masked row gives zeros (PyTorch's _safe_softmax).
 * Refused (the caller checks): pse, dropout (keep_prob < 1 or a drop mask),
 * padding mask, prefix and varlen (TND) modes. */

enum { L_BSH, L_SBH, L_BNSD, L_BSND };

typedef struct {
    int layout;
    int64_t B, N1, N2, S1, S2, D, D2;
    int64_t sparse, pre, next;
    double scale;
    const sim_tensor *mask;
} fa_geom;

/* element offset of (b, n, s, d) in a row-major tensor of this layout with
 * N heads, S positions, D head dim */
static uint64_t fa_off(int layout, int64_t B, int64_t N, int64_t S, int64_t D, int64_t b, int64_t n, int64_t s,
    int64_t d)
{
    switch (layout) {
    case L_BSH: return (uint64_t)(((b * S + s) * N + n) * D + d);
    case L_SBH: return (uint64_t)(((s * B + b) * N + n) * D + d);
    case L_BNSD: return (uint64_t)(((b * N + n) * S + s) * D + d);
    default: return (uint64_t)(((b * S + s) * N + n) * D + d);
    }
}

/* B, S, N*D (BSH/SBH) or B, N, S, D (BNSD) or B, S, N, D (BSND) */
static int fa_dims(const sim_tensor *t, int layout, int64_t n_known, int64_t d_known, int64_t *B, int64_t *N,
    int64_t *S, int64_t *D)
{
    if (layout == L_BSH || layout == L_SBH) {
        if (t->ndim != 3) return 0;
        *B = layout == L_BSH ? t->dims[0] : t->dims[1];
        *S = layout == L_BSH ? t->dims[1] : t->dims[0];
        if (n_known > 0) { *N = n_known; if (t->dims[2] % n_known) return 0; *D = t->dims[2] / n_known; }
        else { *D = d_known; if (d_known <= 0 || t->dims[2] % d_known) return 0; *N = t->dims[2] / d_known; }
        return 1;
    }
    if (t->ndim != 4) return 0;
    *B = t->dims[0];
    *N = layout == L_BNSD ? t->dims[1] : t->dims[2];
    *S = layout == L_BNSD ? t->dims[2] : t->dims[1];
    *D = t->dims[3];
    return n_known <= 0 || *N == n_known;
}

static aclError fa_geometry(const sim_op_args *a, int grad, fa_geom *g)
{
    memset(g, 0, sizeof *g);
    g->layout = (int)kern_attr_int(a, "layout", -1);
    if (g->layout < L_BSH || g->layout > L_BSND) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "layout must be BSH, SBH, BNSD or BSND");
    int64_t n1 = kern_attr_int(a, "head_num", 0);
    if (n1 <= 0) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "head_num must be positive");
    const sim_tensor *q = &a->in[0], *k = &a->in[1], *v = &a->in[2];
    int64_t B, S, Bk, Sk, Bv, Sv, Nv, Dk, Dv;
    if (!fa_dims(q, g->layout, n1, 0, &B, &g->N1, &S, &g->D))
        return kn_shape_fail(a, "query does not fit the layout and head_num", q, q);
    if (!fa_dims(k, g->layout, 0, g->D, &Bk, &g->N2, &Sk, &Dk))
        return kn_shape_fail(a, "key does not fit the layout and query's head dim", k, q);
    /* value: same heads and positions as key, its own head dim */
    if (g->layout == L_BSH || g->layout == L_SBH) {
        if (v->ndim != 3 || v->dims[2] % g->N2) return kn_shape_fail(a, "value does not fit key's heads", v, k);
        Dv = v->dims[2] / g->N2;
        Nv = g->N2;
        Bv = g->layout == L_BSH ? v->dims[0] : v->dims[1];
        Sv = g->layout == L_BSH ? v->dims[1] : v->dims[0];
    } else if (!fa_dims(v, g->layout, g->N2, 0, &Bv, &Nv, &Sv, &Dv)) {
        return kn_shape_fail(a, "value does not fit key's heads", v, k);
    }
    if (Bk != B || Bv != B || Sv != Sk || Nv != g->N2) return kn_shape_fail(a, "query, key and value disagree", q, k);
    if (g->N2 <= 0 || g->N1 % g->N2) return kn_shape_fail(a, "query heads must be a multiple of key heads", q, k);
    g->B = B; g->S1 = S; g->S2 = Sk; g->D2 = Dv;
    g->scale = kn_attr_d(a, "scale", 1.0);
    g->sparse = kern_attr_int(a, "sparse_mode", 0);
    g->pre = kern_attr_int(a, "pre_tokens", INT64_MAX);
    g->next = kern_attr_int(a, "next_tokens", INT64_MAX);
    if (g->sparse < 0 || g->sparse > 4) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "sparse_mode must be 0..4 (prefix and varlen modes are not simulated)");
    int has_mask = kern_attr_int(a, "has_mask", 0) != 0;
    if (has_mask) {
        g->mask = &a->in[grad ? 4 : 3];
        const sim_tensor *m = g->mask;
        if (m->dtype != ACL_BOOL && m->dtype != ACL_UINT8) return kn_refuse_type(a, "atten_mask must be bool or uint8");
        int ok = 0;
        if (g->sparse >= 2) ok = m->ndim == 2 || m->ndim == 4;   /* the compressed causal mask: not read */
        else if (m->ndim == 2) ok = m->dims[0] == g->S1 && m->dims[1] == g->S2;
        else if (m->ndim == 4)
            ok = (m->dims[0] == B || m->dims[0] == 1) && (m->dims[1] == g->N1 || m->dims[1] == 1) &&
                 m->dims[2] == g->S1 && m->dims[3] == g->S2;
        if (!ok) return kn_shape_fail(a, "atten_mask must be [S1,S2] or [B|1,N1|1,S1,S2]", m, q);
    }
    return ACL_SUCCESS;
}

/* 1 if query row i may attend key j (b, n only matter for a 4-D mask).
 * Without atten_mask nothing is masked: CANN ignores sparse_mode and the
 * pre/next tokens then ("fixed to full computation"). */
static int fa_allowed(const fa_geom *g, const unsigned char *mask, int64_t b, int64_t n, int64_t i, int64_t j)
{
    if (!g->mask) return 1;
    int64_t shift = g->S2 - g->S1;
    switch (g->sparse) {
    case 2: return j <= i;
    case 3: return j <= i + shift;
    case 4: return j - (i + shift) <= g->next && (i + shift) - j <= g->pre;
    default: break;
    }
    if (g->sparse == 0 && (i - j > g->pre || j - i > g->next)) return 0;
    if (!mask) return 1;
    const sim_tensor *m = g->mask;
    uint64_t p;
    if (m->ndim == 2) p = (uint64_t)(i * g->S2 + j);
    else p = (uint64_t)((((m->dims[0] == 1 ? 0 : b) * m->dims[1] + (m->dims[1] == 1 ? 0 : n)) * g->S1 + i) * g->S2 + j);
    return mask[p] == 0;
}

static unsigned char *fa_load_mask(const fa_geom *g)
{
    if (!g->mask || g->sparse >= 2) return NULL;
    int64_t *v = kn_load_i(g->mask);
    if (!v) return NULL;
    uint64_t n = kern_numel(g->mask);
    unsigned char *m = malloc(n ? n : 1);
    if (m) for (uint64_t i = 0; i < n; i++) m[i] = v[i] != 0;
    free(v);
    return m;
}

static aclError fa_check(const sim_op_args *a, uint64_t *flops)
{
    int grad = !strcmp(a->op_type, "FlashAttentionScoreGrad");
    int has_mask = kern_attr_int(a, "has_mask", 0) != 0, has_att = kern_attr_int(a, "has_attention_in", 0) != 0;
    int nin = grad ? 4 + has_mask + 2 + has_att : 3 + has_mask;
    aclError e;
    if ((e = kn_counts(a, nin, nin, 3, 3))) return e;
    for (int i = 0; i < a->nin; i++) {
        if (has_mask && i == (grad ? 4 : 3)) continue;
        if (!is_float(a->in[i].dtype)) return kn_refuse_type(a, "query, key, value, dy and the statistics must be floating point");
    }
    for (int j = 0; j < a->nout; j++)
        if (!is_float(a->out[j].dtype)) return kn_refuse_type(a, "the outputs must be floating point");
    fa_geom g;
    if ((e = fa_geometry(a, grad, &g))) return e;
    if (!grad) {
        for (int j = 0; j < 2; j++) {
            const sim_tensor *s = &a->out[j];
            if (s->ndim != 4 || s->dims[0] != g.B || s->dims[1] != g.N1 || s->dims[2] != g.S1 || s->dims[3] < 1)
                return kn_shape_fail(a, "softmax_max/sum must be [B, N1, S1, 8]", s, &a->in[0]);
        }
        const sim_tensor *o = &a->out[2];
        if (kern_numel(o) != (uint64_t)(g.B * g.N1 * g.S1 * g.D2))
            return kn_shape_fail(a, "attention_out must be query's layout with value's head dim", o, &a->in[0]);
    } else {
        int si = 4 + has_mask;
        for (int j = 0; j < 2; j++) {
            const sim_tensor *s = &a->in[si + j];
            if (s->ndim != 4 || s->dims[0] != g.B || s->dims[1] != g.N1 || s->dims[2] != g.S1 || s->dims[3] < 1)
                return kn_shape_fail(a, "softmax_max/sum must be [B, N1, S1, 8]", s, &a->in[0]);
        }
        if (kern_numel(&a->in[3]) != (uint64_t)(g.B * g.N1 * g.S1 * g.D2))
            return kn_shape_fail(a, "dy must be query's layout with value's head dim", &a->in[3], &a->in[0]);
        if (has_att && !kn_same_shape(&a->in[si + 2], &a->in[3]))
            return kn_shape_fail(a, "attention_in must have dy's shape", &a->in[si + 2], &a->in[3]);
        for (int j = 0; j < 3; j++)
            if (!kn_same_shape(&a->out[j], &a->in[j])) return kn_shape_fail(a, "dq, dk, dv must have q, k, v's shapes", &a->out[j], &a->in[j]);
    }
    *flops = (uint64_t)(grad ? 5 : 2) * 2ull * (uint64_t)(g.B * g.N1 * g.S1 * g.S2) * (uint64_t)(g.D + g.D2) / 2;
    return ACL_SUCCESS;
}

static aclError fa_fwd_run(const sim_op_args *a)
{
    fa_geom g;
    if (fa_geometry(a, 0, &g)) return ACL_ERROR_RT_AICORE_EXCEPTION;
    double *q = kn_load_d(&a->in[0]), *k = kn_load_d(&a->in[1]), *v = kn_load_d(&a->in[2]);
    unsigned char *mask = fa_load_mask(&g);
    uint64_t nst = kern_numel(&a->out[0]), width = (uint64_t)a->out[0].dims[3];
    uint64_t no = kern_numel(&a->out[2]);
    double *mx = malloc((nst ? nst : 1) * sizeof *mx), *sm = malloc((nst ? nst : 1) * sizeof *sm);
    double *o = calloc(no ? no : 1, sizeof *o), *s = malloc((size_t)(g.S2 ? g.S2 : 1) * sizeof *s);
    if (!q || !k || !v || (g.mask && g.sparse < 2 && !mask) || !mx || !sm || !o || !s) {
        free(q); free(k); free(v); free(mask); free(mx); free(sm); free(o); free(s);
        return kn_oom(a);
    }
    int64_t group = g.N1 / g.N2;
    for (int64_t b = 0; b < g.B; b++)
        for (int64_t n = 0; n < g.N1; n++) {
            int64_t nk = n / group;
            for (int64_t i = 0; i < g.S1; i++) {
                double m = -INFINITY;
                for (int64_t j = 0; j < g.S2; j++) {
                    if (!fa_allowed(&g, mask, b, n, i, j)) { s[j] = -INFINITY; continue; }
                    double dot = 0;
                    for (int64_t d = 0; d < g.D; d++)
                        dot += q[fa_off(g.layout, g.B, g.N1, g.S1, g.D, b, n, i, d)] *
                               k[fa_off(g.layout, g.B, g.N2, g.S2, g.D, b, nk, j, d)];
                    s[j] = dot * g.scale;
                    if (s[j] > m) m = s[j];
                }
                double sum = 0;
                if (m != -INFINITY)
                    for (int64_t j = 0; j < g.S2; j++) {
                        s[j] = s[j] == -INFINITY ? 0 : exp(s[j] - m);
                        sum += s[j];
                    }
                for (int64_t d = 0; d < g.D2; d++) {
                    double acc = 0;
                    if (sum > 0)
                        for (int64_t j = 0; j < g.S2; j++)
                            if (s[j] != 0) acc += s[j] * v[fa_off(g.layout, g.B, g.N2, g.S2, g.D2, b, nk, j, d)];
                    o[fa_off(g.layout, g.B, g.N1, g.S1, g.D2, b, n, i, d)] = sum > 0 ? acc / sum : 0;
                }
                uint64_t row = (uint64_t)((b * g.N1 + n) * g.S1 + i) * width;
                for (uint64_t w = 0; w < width; w++) { mx[row + w] = m; sm[row + w] = sum; }
            }
        }
    kn_store_d(&a->out[0], mx);
    kn_store_d(&a->out[1], sm);
    kn_store_d(&a->out[2], o);
    free(q); free(k); free(v); free(mask); free(mx); free(sm); free(o); free(s);
    return ACL_SUCCESS;
}

/* P = exp(s - max) / sum from the forward's statistics;
 *   dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D),
 *   dQ = scale dS K, dK = scale dS^T Q (key/value gradients summed over the
 *   query heads of their group). */
static aclError fa_bwd_run(const sim_op_args *a)
{
    fa_geom g;
    if (fa_geometry(a, 1, &g)) return ACL_ERROR_RT_AICORE_EXCEPTION;
    int has_mask = kern_attr_int(a, "has_mask", 0) != 0, has_att = kern_attr_int(a, "has_attention_in", 0) != 0;
    int si = 4 + has_mask;
    double *q = kn_load_d(&a->in[0]), *k = kn_load_d(&a->in[1]), *v = kn_load_d(&a->in[2]);
    double *dO = kn_load_d(&a->in[3]), *mx = kn_load_d(&a->in[si]), *sm = kn_load_d(&a->in[si + 1]);
    double *att = has_att ? kn_load_d(&a->in[si + 2]) : NULL;
    unsigned char *mask = fa_load_mask(&g);
    uint64_t width = (uint64_t)a->in[si].dims[3];
    double *dq = calloc(kern_numel(&a->in[0]) ? kern_numel(&a->in[0]) : 1, sizeof *dq);
    double *dk = calloc(kern_numel(&a->in[1]) ? kern_numel(&a->in[1]) : 1, sizeof *dk);
    double *dv = calloc(kern_numel(&a->in[2]) ? kern_numel(&a->in[2]) : 1, sizeof *dv);
    double *p = malloc((size_t)(g.S2 ? g.S2 : 1) * sizeof *p), *dp = malloc((size_t)(g.S2 ? g.S2 : 1) * sizeof *dp);
    if (!q || !k || !v || !dO || !mx || !sm || (has_att && !att) || (g.mask && g.sparse < 2 && !mask) || !dq || !dk ||
        !dv || !p || !dp) {
        free(q); free(k); free(v); free(dO); free(mx); free(sm); free(att); free(mask);
        free(dq); free(dk); free(dv); free(p); free(dp);
        return kn_oom(a);
    }
    int64_t group = g.N1 / g.N2;
    for (int64_t b = 0; b < g.B; b++)
        for (int64_t n = 0; n < g.N1; n++) {
            int64_t nk = n / group;
            for (int64_t i = 0; i < g.S1; i++) {
                uint64_t row = (uint64_t)((b * g.N1 + n) * g.S1 + i) * width;
                double m = mx[row], sum = sm[row];
                for (int64_t j = 0; j < g.S2; j++) {
                    p[j] = 0;
                    if (!(sum > 0) || !fa_allowed(&g, mask, b, n, i, j)) continue;
                    double dot = 0;
                    for (int64_t d = 0; d < g.D; d++)
                        dot += q[fa_off(g.layout, g.B, g.N1, g.S1, g.D, b, n, i, d)] *
                               k[fa_off(g.layout, g.B, g.N2, g.S2, g.D, b, nk, j, d)];
                    p[j] = exp(dot * g.scale - m) / sum;
                }
                /* D = rowsum(dO * O), O from attention_in or from P V */
                double Dsum = 0;
                for (int64_t d = 0; d < g.D2; d++) {
                    uint64_t oo = fa_off(g.layout, g.B, g.N1, g.S1, g.D2, b, n, i, d);
                    double od;
                    if (att) od = att[oo];
                    else {
                        od = 0;
                        for (int64_t j = 0; j < g.S2; j++)
                            if (p[j] != 0) od += p[j] * v[fa_off(g.layout, g.B, g.N2, g.S2, g.D2, b, nk, j, d)];
                    }
                    Dsum += dO[oo] * od;
                }
                for (int64_t j = 0; j < g.S2; j++) {
                    if (p[j] == 0) { dp[j] = 0; continue; }
                    double acc = 0;
                    for (int64_t d = 0; d < g.D2; d++) {
                        double go = dO[fa_off(g.layout, g.B, g.N1, g.S1, g.D2, b, n, i, d)];
                        uint64_t vo = fa_off(g.layout, g.B, g.N2, g.S2, g.D2, b, nk, j, d);
                        acc += go * v[vo];
                        dv[vo] += p[j] * go;
                    }
                    dp[j] = p[j] * (acc - Dsum) * g.scale;   /* dS, scaled */
                }
                for (int64_t j = 0; j < g.S2; j++) {
                    if (dp[j] == 0) continue;
                    for (int64_t d = 0; d < g.D; d++) {
                        uint64_t qo = fa_off(g.layout, g.B, g.N1, g.S1, g.D, b, n, i, d);
                        uint64_t ko = fa_off(g.layout, g.B, g.N2, g.S2, g.D, b, nk, j, d);
                        dq[qo] += dp[j] * k[ko];
                        dk[ko] += dp[j] * q[qo];
                    }
                }
            }
        }
    kn_store_d(&a->out[0], dq);
    kn_store_d(&a->out[1], dk);
    kn_store_d(&a->out[2], dv);
    free(q); free(k); free(v); free(dO); free(mx); free(sm); free(att); free(mask);
    free(dq); free(dk); free(dv); free(p); free(dp);
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------------- table */

const sim_kernel_def kern_table_llm[] = {
    { "LayerNorm", ln_check, ln_run, 0 },
    { "LayerNormGrad", lng_check, lng_run, 0 },
    { "RmsNorm", rms_check, rms_run, 0 },
    { "RmsNormGrad", rms_check, rms_run, 0 },
    { "RotaryPositionEmbedding", rope_check, rope_run, 0 },
    { "RotaryPositionEmbeddingGrad", rope_check, rope_run, 0 },
    { "SwiGlu", swiglu_check, swiglu_run, 0 },
    { "SwiGluGrad", swiglu_check, swiglu_run, 0 },
    { "SoftmaxGrad", smg_check, smg_run, 0 },
    { "FlashAttentionScore", fa_check, fa_fwd_run, 0 },
    { "FlashAttentionScoreGrad", fa_check, fa_bwd_run, 0 },
    { NULL, NULL, NULL, 0 },
};
