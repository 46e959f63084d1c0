/* Data-movement and indexing kernels: concatenation and stacking, constant
 * padding, triangles, ranges, gathers (index_select, embedding, gather),
 * scatters, index_copy, advanced indexing (index, index_put — KV-cache
 * writes) and the embedding gradient. See docs/simulator-ops.md.
 *
 * Values move exactly: floating types travel as double (float32, float16,
 * bfloat16 and float64 round-trip unchanged), integer types and bool as
 * int64, chosen by the output's type; an input of the other class is
 * converted (float -> integer truncates). An index outside its dimension is
 * a device error (ACL_ERROR_RT_AICORE_EXCEPTION, one stderr line), as an
 * out-of-bounds access is on the device; nothing is written then. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt/kernels_util.h"

/* ------------------------------------------------------- value arrays */

typedef struct {
    int ints;
    double *d;
    int64_t *i;
} vals;

static void vals_free(vals *v) { free(v->d); free(v->i); v->d = NULL; v->i = NULL; }

/* t as the class `ints` (row-major copy of the view). 0 when out of memory. */
static int vals_load(const sim_tensor *t, int ints, vals *v)
{
    v->ints = ints;
    v->d = NULL;
    v->i = NULL;
    if (ints) v->i = kn_load_i(t);
    else v->d = kn_load_d(t);
    return ints ? v->i != NULL : v->d != NULL;
}

static int vals_alloc(uint64_t n, int ints, vals *v)
{
    v->ints = ints;
    v->d = ints ? NULL : calloc(n ? n : 1, sizeof *v->d);
    v->i = ints ? calloc(n ? n : 1, sizeof *v->i) : NULL;
    return ints ? v->i != NULL : v->d != NULL;
}

static void vals_store(const sim_tensor *t, const vals *v)
{
    if (v->ints) kn_store_i(t, v->i);
    else kn_store_d(t, v->d);
}

static inline void vcopy(vals *dst, uint64_t di, const vals *src, uint64_t si)
{
    if (dst->ints) dst->i[di] = src->i[si];
    else dst->d[di] = src->d[si];
}

static inline void vadd(vals *dst, uint64_t di, const vals *src, uint64_t si)
{
    if (dst->ints) dst->i[di] = (int64_t)((uint64_t)dst->i[di] + (uint64_t)src->i[si]);
    else dst->d[di] += src->d[si];
}

static int out_ints(const sim_op_args *a) { return kern_int_dtype(a->out[0].dtype); }

/* elements of dims [from, to) */
static uint64_t span(const sim_tensor *t, int from, int to)
{
    uint64_t n = 1;
    for (int i = from; i < to; i++) n *= (uint64_t)t->dims[i];
    return n;
}

/* An index into a dimension of size n: negative counts from the end when
 * `wrap`; -1 when out of range. */
static int64_t fix_index(int64_t v, int64_t n, int wrap)
{
    if (wrap && v < 0) v += n;
    return (v < 0 || v >= n) ? -1 : v;
}

static aclError bad_index(const sim_op_args *a, int64_t v, int64_t n, int dim)
{
    aclsim_log("%s: index %lld is out of range for dimension %d of size %lld (device error)", a->op_type,
        (long long)v, dim, (long long)n);
    return ACL_ERROR_RT_AICORE_EXCEPTION;
}

static int index_dtype(int dt) { return dt == ACL_INT32 || dt == ACL_INT64; }

/* ----------------------------------------------------------- ConcatD */
/* x0..xn-1 -> y along attribute "dim"; every input has y's rank and shape
 * except along dim (a 1-D empty input is skipped, as torch.cat does). */

static int cat_skip(const sim_tensor *x, const sim_tensor *y) { return x->ndim == 1 && x->dims[0] == 0 && y->ndim != 1; }

static aclError cat_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1 << 20, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    const sim_tensor *y = &a->out[0];
    int d = kn_norm_axis(kern_attr_int(a, "dim", 0), y->ndim);
    if (d < 0) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "dim is out of range");
    int64_t total = 0;
    for (int k = 0; k < a->nin; k++) {
        const sim_tensor *x = &a->in[k];
        if (cat_skip(x, y)) continue;
        if (x->ndim != y->ndim) return kn_shape_fail(a, "an input's rank differs from the output's", x, y);
        for (int i = 0; i < y->ndim; i++)
            if (i != d && x->dims[i] != y->dims[i]) return kn_shape_fail(a, "inputs differ outside dim", x, y);
        total += x->dims[d];
    }
    if (total != y->dims[d]) return kn_shape_fail(a, "the inputs' sizes along dim do not add up to the output's", &a->in[0], y);
    *flops = kern_numel(y);
    return ACL_SUCCESS;
}

static aclError cat_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    int d = kn_norm_axis(kern_attr_int(a, "dim", 0), y->ndim);
    int ints = out_ints(a);
    vals out;
    if (!vals_alloc(kern_numel(y), ints, &out)) return kn_oom(a);
    uint64_t outer = span(y, 0, d), yrow = span(y, d, y->ndim), at = 0;
    for (int k = 0; k < a->nin; k++) {
        const sim_tensor *x = &a->in[k];
        if (cat_skip(x, y)) continue;
        vals in;
        if (!vals_load(x, ints, &in)) { vals_free(&out); return kn_oom(a); }
        uint64_t xrow = span(x, d, x->ndim);
        for (uint64_t o = 0; o < outer; o++)
            for (uint64_t r = 0; r < xrow; r++) vcopy(&out, o * yrow + at + r, &in, o * xrow + r);
        at += xrow;
        vals_free(&in);
    }
    vals_store(y, &out);
    vals_free(&out);
    return ACL_SUCCESS;
}

/* -------------------------------------------------------------- Pack */
/* x0..xn-1 (one shape) -> y with a new dimension of size n at "dim". */

static aclError pack_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1 << 20, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    const sim_tensor *y = &a->out[0], *x0 = &a->in[0];
    int d = kn_norm_axis(kern_attr_int(a, "dim", 0), y->ndim);
    if (d < 0 || y->ndim != x0->ndim + 1 || y->dims[d] != a->nin)
        return kn_shape_fail(a, "the output is not the inputs stacked along dim", x0, y);
    for (int k = 0; k < a->nin; k++)
        if (!kn_same_shape(&a->in[k], x0)) return kn_shape_fail(a, "the inputs differ in shape", &a->in[k], x0);
    for (int i = 0, j = 0; i < y->ndim; i++)
        if (i != d && y->dims[i] != x0->dims[j++]) return kn_shape_fail(a, "the output is not the inputs stacked along dim", x0, y);
    *flops = kern_numel(y);
    return ACL_SUCCESS;
}

static aclError pack_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    int d = kn_norm_axis(kern_attr_int(a, "dim", 0), y->ndim);
    int ints = out_ints(a);
    vals out;
    if (!vals_alloc(kern_numel(y), ints, &out)) return kn_oom(a);
    uint64_t outer = span(&a->in[0], 0, d), inner = span(&a->in[0], d, a->in[0].ndim), n = (uint64_t)a->nin;
    for (int k = 0; k < a->nin; k++) {
        vals in;
        if (!vals_load(&a->in[k], ints, &in)) { vals_free(&out); return kn_oom(a); }
        for (uint64_t o = 0; o < outer; o++)
            for (uint64_t r = 0; r < inner; r++) vcopy(&out, (o * n + (uint64_t)k) * inner + r, &in, o * inner + r);
        vals_free(&in);
    }
    vals_store(y, &out);
    vals_free(&out);
    return ACL_SUCCESS;
}

/* -------------------------------------------------------------- PadV3 */
/* x -> y padded with the scalar "value"; attribute "npad" (even) and
 * "pad0".."pad<npad-1>": (before, after) pairs starting at the last
 * dimension, as torch.nn.functional.pad. Negative amounts crop. */

static int64_t pad_amount(const sim_op_args *a, int dim_from_end, int after)
{
    char nm[16];
    snprintf(nm, sizeof nm, "pad%d", 2 * dim_from_end + after);
    return kern_attr_int(a, nm, 0);
}

static aclError pad_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    int64_t np = kern_attr_int(a, "npad", 0);
    if (np < 0 || np % 2 || np / 2 > x->ndim) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "pad must hold (before, after) pairs, at most one per dimension");
    if (!kern_attr(a, "value")) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "the pad value (attribute 'value') is missing");
    if (y->ndim != x->ndim) return kn_shape_fail(a, "x and y differ in rank", x, y);
    for (int i = 0; i < x->ndim; i++) {
        int fe = x->ndim - 1 - i;
        int64_t want = x->dims[i] + (fe < np / 2 ? pad_amount(a, fe, 0) + pad_amount(a, fe, 1) : 0);
        if (y->dims[i] != want) return kn_shape_fail(a, "y is not x padded by pad", x, y);
    }
    *flops = kern_numel(y);
    return ACL_SUCCESS;
}

static aclError pad_run(const sim_op_args *a)
{
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    int ints = out_ints(a), nd = y->ndim;
    int64_t np = kern_attr_int(a, "npad", 0);
    const sim_attr *va = kern_attr(a, "value");
    vals in, out;
    if (!vals_load(x, ints, &in)) return kn_oom(a);
    if (!vals_alloc(kern_numel(y), ints, &out)) { vals_free(&in); return kn_oom(a); }
    int64_t before[SIM_MAX_DIMS] = {0};
    for (int i = 0; i < nd; i++) {
        int fe = nd - 1 - i;
        before[i] = fe < np / 2 ? pad_amount(a, fe, 0) : 0;
    }
    uint64_t n = kern_numel(y);
    int64_t idx[SIM_MAX_DIMS] = {0};
    for (uint64_t j = 0; j < n; j++) {
        uint64_t src = 0;
        int inside = 1;
        for (int i = 0; i < nd; i++) {
            int64_t s = idx[i] - before[i];
            if (s < 0 || s >= x->dims[i]) { inside = 0; break; }
            src = src * (uint64_t)x->dims[i] + (uint64_t)s;
        }
        if (inside) vcopy(&out, j, &in, src);
        else if (ints) out.i[j] = va->type == SIM_ATTR_FLOAT ? kn_d_to_i(va->f) : va->i;
        else out.d[j] = va->type == SIM_ATTR_FLOAT ? (double)va->f : (double)va->i;
        for (int i = nd - 1; i >= 0; i--) {
            if (++idx[i] < y->dims[i]) break;
            idx[i] = 0;
        }
    }
    vals_store(y, &out);
    vals_free(&in); vals_free(&out);
    return ACL_SUCCESS;
}

/* -------------------------------------------------------- Triu, Tril */
/* x [..., M, N] -> y: Triu keeps element (i, j) when j - i >= diagonal,
 * Tril when j - i <= diagonal; the rest is 0. */

static aclError tri_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    if (a->in[0].ndim < 2) return kn_shape_fail(a, "x must have at least 2 dimensions", &a->in[0], &a->out[0]);
    if (!kn_same_shape(&a->in[0], &a->out[0])) return kn_shape_fail(a, "x and y differ", &a->in[0], &a->out[0]);
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError tri_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    int ints = out_ints(a), upper = !strcmp(a->op_type, "Triu");
    int64_t diag = kern_attr_int(a, "diagonal", 0);
    vals v;
    if (!vals_load(&a->in[0], ints, &v)) return kn_oom(a);
    int64_t M = y->dims[y->ndim - 2], N = y->dims[y->ndim - 1];
    uint64_t n = kern_numel(y);
    for (uint64_t p = 0; p < n; p++) {
        int64_t j = (int64_t)(p % (uint64_t)N), i = (int64_t)((p / (uint64_t)N) % (uint64_t)M);
        int keep = upper ? j - i >= diag : j - i <= diag;
        if (!keep) {
            if (ints) v.i[p] = 0;
            else v.d[p] = 0;
        }
    }
    vals_store(y, &v);
    vals_free(&v);
    return ACL_SUCCESS;
}

/* -------------------------------------------------------------- Range */
/* y[k] = start + k * step (1-D); attributes "start", "step" and "end"
 * (checked: y has ceil((end - start) / step) elements). Integer outputs
 * with integer attributes are exact; otherwise computed in double. */

static aclError range_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 0, 0, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types"))) return e;
    const sim_tensor *y = &a->out[0];
    if (y->ndim != 1) return kn_shape_fail(a, "y must be 1-D", y, y);
    if (!kern_attr(a, "start") || !kern_attr(a, "step") || !kern_attr(a, "end"))
        return kn_fail(a, ACL_ERROR_INVALID_PARAM, "start, end and step are required");
    double st = kn_attr_d(a, "start", 0), en = kn_attr_d(a, "end", 0), sp = kn_attr_d(a, "step", 1);
    if (sp == 0 || (sp > 0 && en < st) || (sp < 0 && en > st))
        return kn_fail(a, ACL_ERROR_INVALID_PARAM, "step must be non-zero and point from start to end");
    double cnt = ceil((en - st) / sp);
    if ((double)y->dims[0] != cnt) return kn_shape_fail(a, "y does not hold ceil((end - start) / step) elements", y, y);
    *flops = kern_numel(y);
    return ACL_SUCCESS;
}

static aclError range_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    const sim_attr *s = kern_attr(a, "start"), *p = kern_attr(a, "step");
    uint64_t n = kern_numel(y);
    int ints = out_ints(a) && s->type != SIM_ATTR_FLOAT && p->type != SIM_ATTR_FLOAT;
    vals v;
    if (!vals_alloc(n, ints, &v)) return kn_oom(a);
    for (uint64_t k = 0; k < n; k++) {
        if (ints) v.i[k] = s->i + (int64_t)k * p->i;
        else v.d[k] = kn_attr_d(a, "start", 0) + (double)k * kn_attr_d(a, "step", 1);
    }
    if (!ints && out_ints(a)) {
        /* a float range into an integer tensor: truncate each element */
        for (uint64_t k = 0; k < n; k++) v.d[k] = (double)kn_d_to_i(v.d[k]);
    }
    vals_store(y, &v);
    vals_free(&v);
    return ACL_SUCCESS;
}

/* ----------------------------------------------------------- GatherV2 */
/* x, index (int32/int64, any shape) -> y = x indexed along attribute "axis":
 * y.shape = x.shape[:axis] + index.shape + x.shape[axis+1:]
 * (index_select, embedding). */

static aclError gatherv2_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 2, 2, 1, 1))) return e;
    const sim_tensor *x = &a->in[0], *ix = &a->in[1], *y = &a->out[0];
    if (!index_dtype(ix->dtype)) return kn_refuse_type(a, "index must be int32 or int64");
    if (!kn_num_dtype(x->dtype) || !kn_num_dtype(y->dtype)) return kn_refuse_type(a, "x and y must be numeric");
    int ax = kn_norm_axis(kern_attr_int(a, "axis", 0), x->ndim);
    if (ax < 0) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "axis is out of range");
    if (y->ndim != x->ndim - 1 + ix->ndim) return kn_shape_fail(a, "y's rank is not x's - 1 + index's", x, y);
    int k = 0;
    for (int i = 0; i < ax; i++) if (y->dims[k++] != x->dims[i]) return kn_shape_fail(a, "y's shape is wrong", x, y);
    for (int i = 0; i < ix->ndim; i++) if (y->dims[k++] != ix->dims[i]) return kn_shape_fail(a, "y's shape is wrong", ix, y);
    for (int i = ax + 1; i < x->ndim; i++) if (y->dims[k++] != x->dims[i]) return kn_shape_fail(a, "y's shape is wrong", x, y);
    *flops = kern_numel(y);
    return ACL_SUCCESS;
}

static aclError gatherv2_run(const sim_op_args *a)
{
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    int ax = kn_norm_axis(kern_attr_int(a, "axis", 0), x->ndim);
    int ints = out_ints(a);
    vals in, out;
    int64_t *ix = kn_load_i(&a->in[1]);
    if (!ix || !vals_load(x, ints, &in)) { free(ix); vals_free(&in); return kn_oom(a); }
    if (!vals_alloc(kern_numel(y), ints, &out)) { free(ix); vals_free(&in); return kn_oom(a); }
    uint64_t outer = span(x, 0, ax), inner = span(x, ax + 1, x->ndim), ni = kern_numel(&a->in[1]);
    int64_t dimn = x->dims[ax];
    aclError rc = ACL_SUCCESS;
    for (uint64_t k = 0; k < ni && !rc; k++)
        if (fix_index(ix[k], dimn, 0) < 0) rc = bad_index(a, ix[k], dimn, ax);
    if (!rc) {
        for (uint64_t o = 0; o < outer; o++)
            for (uint64_t k = 0; k < ni; k++)
                for (uint64_t r = 0; r < inner; r++)
                    vcopy(&out, (o * ni + k) * inner + r, &in, (o * (uint64_t)dimn + (uint64_t)ix[k]) * inner + r);
        vals_store(y, &out);
    }
    free(ix); vals_free(&in); vals_free(&out);
    return rc;
}

/* ---------------------------------------------- GatherElements, Scatter */
/* GatherElements: x, index (x's rank, int32/int64) -> y (index's shape),
 *   y[..i..] = x[.. index[..i..] at "dim" ..] (torch.gather).
 * ScatterElements: self, index, src (or the scalar "value") -> y (self's
 *   shape): y = self, then y[.. index[..i..] at "dim" ..] = src[..i..]
 *   (attribute "reduce": 0 replace, 1 add, 2 multiply), in row-major order
 *   of index (torch.scatter / scatter_add). */

/* position in a row-major array of shape t of index vector idx, with
 * coordinate `dim` replaced by v */
static uint64_t pos_with(const sim_tensor *t, const int64_t *idx, int dim, int64_t v)
{
    uint64_t p = 0;
    for (int i = 0; i < t->ndim; i++) p = p * (uint64_t)t->dims[i] + (uint64_t)(i == dim ? v : idx[i]);
    return p;
}

static void bump(const sim_tensor *t, int64_t *idx)
{
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (++idx[i] < t->dims[i]) return;
        idx[i] = 0;
    }
}

static aclError gel_check(const sim_op_args *a, uint64_t *flops)
{
    int scatter = !strcmp(a->op_type, "ScatterElements");
    aclError e;
    if ((e = kn_counts(a, 2, scatter ? 3 : 2, 1, 1))) return e;
    const sim_tensor *x = &a->in[0], *ix = &a->in[1], *y = &a->out[0];
    if (!index_dtype(ix->dtype)) return kn_refuse_type(a, "index must be int32 or int64");
    if (!kn_num_dtype(x->dtype) || !kn_num_dtype(y->dtype) || (a->nin == 3 && !kn_num_dtype(a->in[2].dtype)))
        return kn_refuse_type(a, "values must be numeric");
    int d = kn_norm_axis(kern_attr_int(a, "dim", 0), x->ndim ? x->ndim : 1);
    if (d < 0) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "dim is out of range");
    if (ix->ndim != x->ndim) return kn_shape_fail(a, "index and x differ in rank", ix, x);
    for (int i = 0; i < x->ndim; i++)
        if (i != d && ix->dims[i] > x->dims[i]) return kn_shape_fail(a, "index is larger than x outside dim", ix, x);
    if (scatter) {
        if (!kn_same_shape(x, y)) return kn_shape_fail(a, "y must have self's shape", x, y);
        if (a->nin == 3) {
            const sim_tensor *src = &a->in[2];
            if (src->ndim != ix->ndim) return kn_shape_fail(a, "src and index differ in rank", src, ix);
            for (int i = 0; i < ix->ndim; i++)
                if (ix->dims[i] > src->dims[i]) return kn_shape_fail(a, "index is larger than src", ix, src);
        } else if (!kern_attr(a, "value")) {
            return kn_fail(a, ACL_ERROR_INVALID_PARAM, "src or the scalar 'value' is required");
        }
        int64_t red = kern_attr_int(a, "reduce", 0);
        if (red < 0 || red > 2) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "reduce must be 0 (none), 1 (add) or 2 (multiply)");
    } else if (!kn_same_shape(ix, y)) {
        return kn_shape_fail(a, "y must have index's shape", ix, y);
    }
    *flops = kern_numel(ix);
    return ACL_SUCCESS;
}

static aclError gel_run(const sim_op_args *a)
{
    int scatter = !strcmp(a->op_type, "ScatterElements");
    const sim_tensor *x = &a->in[0], *ixt = &a->in[1], *y = &a->out[0];
    int d = kn_norm_axis(kern_attr_int(a, "dim", 0), x->ndim ? x->ndim : 1);
    int ints = out_ints(a);
    int64_t *ix = kn_load_i(ixt);
    vals xv = { 0 }, src = { 0 }, out = { 0 };
    int ok = ix && vals_load(x, ints, &xv);
    if (ok && scatter && a->nin == 3) ok = vals_load(&a->in[2], ints, &src);
    if (ok && !scatter) ok = vals_alloc(kern_numel(y), ints, &out);
    if (!ok) { free(ix); vals_free(&xv); vals_free(&src); vals_free(&out); return kn_oom(a); }
    uint64_t ni = kern_numel(ixt);
    int64_t dimn = x->ndim ? x->dims[d] : 1;
    aclError rc = ACL_SUCCESS;
    for (uint64_t k = 0; k < ni && !rc; k++)
        if (fix_index(ix[k], dimn, 0) < 0) rc = bad_index(a, ix[k], dimn, d);
    if (!rc) {
        int64_t idx[SIM_MAX_DIMS] = {0};
        int64_t red = kern_attr_int(a, "reduce", 0);
        const sim_attr *va = kern_attr(a, "value");
        for (uint64_t k = 0; k < ni; k++, bump(ixt, idx)) {
            uint64_t xp = x->ndim ? pos_with(x, idx, d, ix[k]) : 0;
            if (!scatter) { vcopy(&out, k, &xv, xp); continue; }
            double sd = 0;
            int64_t si = 0;
            if (a->nin == 3) {
                uint64_t sp = pos_with(&a->in[2], idx, -1, 0);
                if (ints) si = src.i[sp]; else sd = src.d[sp];
            } else {
                si = va->type == SIM_ATTR_FLOAT ? kn_d_to_i(va->f) : va->i;
                sd = va->type == SIM_ATTR_FLOAT ? (double)va->f : (double)va->i;
            }
            if (ints) xv.i[xp] = red == 1 ? (int64_t)((uint64_t)xv.i[xp] + (uint64_t)si)
                               : red == 2 ? (int64_t)((uint64_t)xv.i[xp] * (uint64_t)si) : si;
            else xv.d[xp] = red == 1 ? xv.d[xp] + sd : red == 2 ? xv.d[xp] * sd : sd;
        }
        vals_store(y, scatter ? &xv : &out);
    }
    free(ix); vals_free(&xv); vals_free(&src); vals_free(&out);
    return rc;
}

/* ---------------------------------------------------------- IndexCopy */
/* self, index (1-D), source -> y = self with y.select(dim, index[k]) =
 * source.select(dim, k) (attribute "dim"). */

static aclError icopy_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 3, 3, 1, 1))) return e;
    const sim_tensor *x = &a->in[0], *ix = &a->in[1], *s = &a->in[2], *y = &a->out[0];
    if (!index_dtype(ix->dtype)) return kn_refuse_type(a, "index must be int32 or int64");
    if (!kn_num_dtype(x->dtype) || !kn_num_dtype(s->dtype) || !kn_num_dtype(y->dtype))
        return kn_refuse_type(a, "values must be numeric");
    int d = kn_norm_axis(kern_attr_int(a, "dim", 0), x->ndim ? x->ndim : 1);
    if (d < 0) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "dim is out of range");
    if (ix->ndim > 1) return kn_shape_fail(a, "index must be 1-D", ix, ix);
    if (!kn_same_shape(x, y) || s->ndim != x->ndim) return kn_shape_fail(a, "self, source and y must have one rank", x, s);
    for (int i = 0; i < x->ndim; i++)
        if (i == d ? s->dims[i] != (int64_t)kern_numel(ix) : s->dims[i] != x->dims[i])
            return kn_shape_fail(a, "source is not self with index's length along dim", s, x);
    *flops = kern_numel(s);
    return ACL_SUCCESS;
}

static aclError icopy_run(const sim_op_args *a)
{
    const sim_tensor *x = &a->in[0], *s = &a->in[2], *y = &a->out[0];
    int d = kn_norm_axis(kern_attr_int(a, "dim", 0), x->ndim ? x->ndim : 1);
    int ints = out_ints(a);
    int64_t *ix = kn_load_i(&a->in[1]);
    vals xv = { 0 }, sv = { 0 };
    if (!ix || !vals_load(x, ints, &xv) || !vals_load(s, ints, &sv)) {
        free(ix); vals_free(&xv); vals_free(&sv);
        return kn_oom(a);
    }
    uint64_t ni = kern_numel(&a->in[1]);
    int64_t dimn = x->ndim ? x->dims[d] : 1;
    aclError rc = ACL_SUCCESS;
    for (uint64_t k = 0; k < ni && !rc; k++)
        if (fix_index(ix[k], dimn, 0) < 0) rc = bad_index(a, ix[k], dimn, d);
    if (!rc) {
        uint64_t outer = x->ndim ? span(x, 0, d) : 1, inner = x->ndim ? span(x, d + 1, x->ndim) : 1;
        for (uint64_t o = 0; o < outer; o++)
            for (uint64_t k = 0; k < ni; k++)
                for (uint64_t r = 0; r < inner; r++)
                    vcopy(&xv, (o * (uint64_t)dimn + (uint64_t)ix[k]) * inner + r, &sv, (o * ni + k) * inner + r);
        vals_store(y, &xv);
    }
    free(ix); vals_free(&xv); vals_free(&sv);
    return rc;
}

/* ------------------------------------------------ advanced indexing */
/* Index: self, i_0..i_m-1 -> y;  IndexPut: self, values, i_0..i_m-1 -> y
 * (y is self, updated: y[indices] = values, or += with "accumulate").
 * Attribute "present": bit k set when dimension k of self is indexed (by
 * the next index tensor, in order); the index tensors (int32/int64)
 * broadcast to one shape B. PyTorch's rule: when the indexed dimensions are
 * adjacent, B replaces them in place; otherwise B comes first, followed by
 * the other dimensions. Negative indices count from the end. */

typedef struct {
    int nd;                          /* self's rank */
    uint32_t present;
    int nidx;
    int adjacent, first;             /* indexed dims adjacent; the first one */
    sim_tensor b;                    /* shape B (geometry only) */
    sim_tensor res;                  /* the indexing result's shape */
} adv_geom;

static aclError adv_geom_make(const sim_op_args *a, int first_index, adv_geom *g)
{
    const sim_tensor *x = &a->in[0];
    memset(g, 0, sizeof *g);
    g->nd = x->ndim;
    g->present = (uint32_t)kern_attr_int(a, "present", 0);
    g->nidx = a->nin - first_index;
    int cnt = 0, last = -1;
    g->first = -1;
    g->adjacent = 1;
    for (int d = 0; d < x->ndim; d++)
        if ((g->present >> d) & 1) {
            if (g->first < 0) g->first = d;
            else if (d != last + 1) g->adjacent = 0;
            last = d;
            cnt++;
        }
    if (cnt == 0 || cnt != g->nidx || (x->ndim < 32 && (g->present >> x->ndim)))
        return kn_fail(a, ACL_ERROR_INVALID_PARAM, "the index tensors do not match attribute 'present'");
    /* B: the broadcast shape of the index tensors */
    int rb = 0;
    for (int k = 0; k < g->nidx; k++)
        if (a->in[first_index + k].ndim > rb) rb = a->in[first_index + k].ndim;
    g->b.ndim = rb;
    for (int i = 0; i < rb; i++) {
        int64_t want = 1;
        for (int k = 0; k < g->nidx; k++) {
            const sim_tensor *t = &a->in[first_index + k];
            int j = i - (rb - t->ndim);
            if (j < 0 || t->dims[j] == 1) continue;
            if (want != 1 && want != t->dims[j]) return kn_shape_fail(a, "the index tensors do not broadcast", t, &a->in[first_index]);
            want = t->dims[j];
        }
        g->b.dims[i] = want;
    }
    /* result shape */
    int r = 0;
    if (g->adjacent) {
        for (int d = 0; d < g->first; d++) g->res.dims[r++] = x->dims[d];
        for (int i = 0; i < rb; i++) g->res.dims[r++] = g->b.dims[i];
        for (int d = last + 1; d < x->ndim; d++) g->res.dims[r++] = x->dims[d];
    } else {
        for (int i = 0; i < rb; i++) g->res.dims[r++] = g->b.dims[i];
        for (int d = 0; d < x->ndim; d++)
            if (!((g->present >> d) & 1)) g->res.dims[r++] = x->dims[d];
    }
    if (r > SIM_MAX_DIMS) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "the indexing result has too many dimensions");
    g->res.ndim = r;
    return ACL_SUCCESS;
}

/* For result element `pos` (row-major in g->res): its position in self, or
 * an index error. */
static aclError adv_self_pos(const sim_op_args *a, const adv_geom *g, int64_t *const *ix, uint64_t pos,
    uint64_t *out)
{
    const sim_tensor *x = &a->in[0];
    int64_t ri[SIM_MAX_DIMS];
    for (int i = g->res.ndim - 1; i >= 0; i--) {
        ri[i] = (int64_t)(pos % (uint64_t)g->res.dims[i]);
        pos /= (uint64_t)g->res.dims[i];
    }
    int rb = g->b.ndim;
    int boff = g->adjacent ? g->first : 0;      /* where B's coordinates start in the result */
    uint64_t bp = 0;
    for (int i = 0; i < rb; i++) bp = bp * (uint64_t)g->b.dims[i] + (uint64_t)ri[boff + i];
    uint64_t p = 0;
    int k = 0, rest = 0;
    for (int d = 0; d < x->ndim; d++) {
        int64_t v;
        if ((g->present >> d) & 1) {
            int64_t raw = ix[k++][bp];
            v = fix_index(raw, x->dims[d], 1);
            if (v < 0) return bad_index(a, raw, x->dims[d], d);
        } else if (g->adjacent) {
            v = ri[d < g->first ? d : d - (g->nidx) + rb];
        } else {
            v = ri[rb + rest++];
        }
        p = p * (uint64_t)x->dims[d] + (uint64_t)v;
    }
    *out = p;
    return ACL_SUCCESS;
}

static aclError adv_check(const sim_op_args *a, uint64_t *flops)
{
    int put = !strcmp(a->op_type, "IndexPut");
    int fi = put ? 2 : 1;
    aclError e;
    if ((e = kn_counts(a, fi + 1, fi + SIM_MAX_DIMS, 1, 1))) return e;
    for (int k = fi; k < a->nin; k++)
        if (!index_dtype(a->in[k].dtype)) return kn_refuse_type(a, "index tensors must be int32 or int64");
    if (!kn_num_dtype(a->in[0].dtype) || !kn_num_dtype(a->out[0].dtype) || (put && !kn_num_dtype(a->in[1].dtype)))
        return kn_refuse_type(a, "values must be numeric");
    adv_geom g;
    if ((e = adv_geom_make(a, fi, &g))) return e;
    if (put) {
        if (!kn_same_shape(&a->in[0], &a->out[0])) return kn_shape_fail(a, "y must have self's shape", &a->in[0], &a->out[0]);
        if (!kn_broadcasts_to(&a->in[1], &g.res)) return kn_shape_fail(a, "values do not broadcast to the indexing result", &a->in[1], &g.res);
    } else if (!kn_same_shape(&g.res, &a->out[0])) {
        return kn_shape_fail(a, "y is not the indexing result's shape", &g.res, &a->out[0]);
    }
    *flops = kern_numel(&g.res);
    return ACL_SUCCESS;
}

static aclError adv_run(const sim_op_args *a)
{
    int put = !strcmp(a->op_type, "IndexPut");
    int fi = put ? 2 : 1;
    adv_geom g;
    aclError rc = adv_geom_make(a, fi, &g);
    if (rc) return ACL_ERROR_RT_AICORE_EXCEPTION;
    int ints = out_ints(a);
    int64_t *ix[SIM_MAX_DIMS] = {0};
    vals xv = { 0 }, vv = { 0 }, out = { 0 };
    int ok = vals_load(&a->in[0], ints, &xv);
    for (int k = 0; ok && k < g.nidx; k++) {
        sim_tensor bv;
        ok = kern_broadcast_view(&a->in[fi + k], &g.b, &bv) && (ix[k] = kn_load_i(&bv)) != NULL;
    }
    if (ok && put) {
        sim_tensor vb;
        ok = kern_broadcast_view(&a->in[1], &g.res, &vb) && vals_load(&vb, ints, &vv);
    }
    uint64_t n = kern_numel(&g.res);
    if (ok && !put) ok = vals_alloc(n, ints, &out);
    /* positions first: an index error writes nothing */
    uint64_t *pos = ok ? malloc((n ? n : 1) * sizeof *pos) : NULL;
    if (!pos) ok = 0;
    for (uint64_t j = 0; ok && j < n && !rc; j++) rc = adv_self_pos(a, &g, ix, j, &pos[j]);
    if (ok && !rc) {
        int acc = kern_attr_int(a, "accumulate", 0) != 0;
        for (uint64_t j = 0; j < n; j++) {
            if (!put) vcopy(&out, j, &xv, pos[j]);
            else if (acc) vadd(&xv, pos[j], &vv, j);
            else vcopy(&xv, pos[j], &vv, j);
        }
        vals_store(&a->out[0], put ? &xv : &out);
    }
    free(pos);
    for (int k = 0; k < SIM_MAX_DIMS; k++) free(ix[k]);
    vals_free(&xv); vals_free(&vv); vals_free(&out);
    return !ok ? kn_oom(a) : rc;
}

/* ------------------------------------------------- EmbeddingDenseGrad */
/* grad [*, D], indices [*] (int32/int64) -> y [num_weights, D]: the sum of
 * the gradient rows per index; rows whose index is "padding_idx" add
 * nothing; with "scale_grad_by_freq" each sum is divided by its index's
 * count. */

static aclError embgrad_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 2, 2, 1, 1))) return e;
    const sim_tensor *g = &a->in[0], *ix = &a->in[1], *y = &a->out[0];
    if (!index_dtype(ix->dtype)) return kn_refuse_type(a, "indices must be int32 or int64");
    if (!kn_flt_dtype(g->dtype) || !kn_flt_dtype(y->dtype)) return kn_refuse_type(a, "grad and y must be floating point");
    if (y->ndim != 2 || y->dims[0] != kern_attr_int(a, "num_weights", -1))
        return kn_shape_fail(a, "y must be [num_weights, D]", y, y);
    if (g->ndim < 1 || g->dims[g->ndim - 1] != y->dims[1] || kern_numel(g) != kern_numel(ix) * (uint64_t)y->dims[1])
        return kn_shape_fail(a, "grad must be indices' shape + [D]", g, ix);
    *flops = kern_numel(g);
    return ACL_SUCCESS;
}

static aclError embgrad_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    int64_t nw = y->dims[0], D = y->dims[1];
    int64_t pad = kern_attr_int(a, "padding_idx", -1);
    int scale = kern_attr_int(a, "scale_grad_by_freq", 0) != 0;
    double *g = kn_load_d(&a->in[0]), *acc = calloc((size_t)(nw * D > 0 ? nw * D : 1), sizeof *acc);
    int64_t *ix = kn_load_i(&a->in[1]), *cnt = calloc((size_t)(nw ? nw : 1), sizeof *cnt);
    if (!g || !acc || !ix || !cnt) { free(g); free(acc); free(ix); free(cnt); return kn_oom(a); }
    uint64_t n = kern_numel(&a->in[1]);
    aclError rc = ACL_SUCCESS;
    for (uint64_t k = 0; k < n && !rc; k++)
        if (fix_index(ix[k], nw, 0) < 0) rc = bad_index(a, ix[k], nw, 0);
    if (!rc) {
        for (uint64_t k = 0; k < n; k++) cnt[ix[k]]++;
        for (uint64_t k = 0; k < n; k++) {
            if (ix[k] == pad) continue;
            double s = scale ? 1.0 / (double)cnt[ix[k]] : 1.0;
            for (int64_t c = 0; c < D; c++) acc[ix[k] * D + c] += g[k * (uint64_t)D + (uint64_t)c] * s;
        }
        kn_store_d(y, acc);
    }
    free(g); free(acc); free(ix); free(cnt);
    return rc;
}

/* ------------------------------------------------------ ReverseV2, Tile */
/* ReverseV2: x -> y (x's shape) reversed along the dims in the bitmask
 * attribute "axes" (torch.flip).
 * Tile: x -> y = x repeated "rep<i>" times along dim i of y ("nrep" values;
 * x is aligned to y's last dims, as torch.Tensor.repeat). */

static aclError flip_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    if (!kn_same_shape(&a->in[0], &a->out[0])) return kn_shape_fail(a, "x and y differ", &a->in[0], &a->out[0]);
    uint32_t m = (uint32_t)kern_attr_int(a, "axes", 0);
    if (a->in[0].ndim < 32 && (m >> a->in[0].ndim)) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "an axis is out of range");
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError flip_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    uint32_t m = (uint32_t)kern_attr_int(a, "axes", 0);
    int ints = out_ints(a);
    vals in, out;
    if (!vals_load(&a->in[0], ints, &in)) return kn_oom(a);
    if (!vals_alloc(kern_numel(y), ints, &out)) { vals_free(&in); return kn_oom(a); }
    int64_t idx[SIM_MAX_DIMS] = {0};
    uint64_t n = kern_numel(y);
    for (uint64_t j = 0; j < n; j++, bump(y, idx)) {
        uint64_t src = 0;
        for (int i = 0; i < y->ndim; i++)
            src = src * (uint64_t)y->dims[i] + (uint64_t)(((m >> i) & 1) ? y->dims[i] - 1 - idx[i] : idx[i]);
        vcopy(&out, j, &in, src);
    }
    vals_store(y, &out);
    vals_free(&in); vals_free(&out);
    return ACL_SUCCESS;
}

static aclError tile_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    int64_t nr = kern_attr_int(a, "nrep", -1);
    if (nr != y->ndim || nr < x->ndim) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "repeats must have one value per output dim, at least x's rank");
    int off = y->ndim - x->ndim;
    for (int i = 0; i < y->ndim; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "rep%d", i);
        int64_t r = kern_attr_int(a, nm, -1), xd = i < off ? 1 : x->dims[i - off];
        if (r < 0 || y->dims[i] != xd * r) return kn_shape_fail(a, "y is not x repeated", x, y);
    }
    *flops = kern_numel(y);
    return ACL_SUCCESS;
}

static aclError tile_run(const sim_op_args *a)
{
    const sim_tensor *x = &a->in[0], *y = &a->out[0];
    int ints = out_ints(a), off = y->ndim - x->ndim;
    vals in, out;
    if (!vals_load(x, ints, &in)) return kn_oom(a);
    if (!vals_alloc(kern_numel(y), ints, &out)) { vals_free(&in); return kn_oom(a); }
    int64_t idx[SIM_MAX_DIMS] = {0};
    uint64_t n = kern_numel(y);
    for (uint64_t j = 0; j < n; j++, bump(y, idx)) {
        uint64_t src = 0;
        for (int i = off; i < y->ndim; i++) src = src * (uint64_t)x->dims[i - off] + (uint64_t)(idx[i] % x->dims[i - off]);
        vcopy(&out, j, &in, src);
    }
    vals_store(y, &out);
    vals_free(&in); vals_free(&out);
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------------- table */

const sim_kernel_def kern_table_index[] = {
    { "ConcatD", cat_check, cat_run, 0 },
    { "Pack", pack_check, pack_run, 0 },
    { "PadV3", pad_check, pad_run, 0 },
    { "Triu", tri_check, tri_run, 0 },
    { "Tril", tri_check, tri_run, 0 },
    { "Range", range_check, range_run, 0 },
    { "GatherV2", gatherv2_check, gatherv2_run, 0 },
    { "GatherElements", gel_check, gel_run, 0 },
    { "ScatterElements", gel_check, gel_run, 0 },
    { "IndexCopy", icopy_check, icopy_run, 0 },
    { "Index", adv_check, adv_run, 0 },
    { "IndexPut", adv_check, adv_run, 0 },
    { "EmbeddingDenseGrad", embgrad_check, embgrad_run, 0 },
    { "ReverseV2", flip_check, flip_run, 0 },
    { "Tile", tile_check, tile_run, 0 },
    { NULL, NULL, NULL, 0 },
};
