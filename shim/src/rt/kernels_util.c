/* Helpers shared by the typed operator kernels (kernels_*.c): element
 * loads and stores through any dtype, whole-view copies as double or int64,
 * broadcasting, and the argument checks with their refusal messages.
 * Declared in kernels_util.h. */
#include "rt/kernels_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ element types */

int kern_int_dtype(int dt)
{
    switch (dt) {
    case ACL_INT8: case ACL_UINT8: case ACL_INT16: case ACL_UINT16: case ACL_INT32: case ACL_UINT32:
    case ACL_INT64: case ACL_UINT64: case ACL_BOOL:
        return 1;
    default:
        return 0;
    }
}

int kn_flt_dtype(int dt)
{
    return dt == ACL_FLOAT || dt == ACL_FLOAT16 || dt == ACL_BF16 || dt == ACL_DOUBLE;
}

int kn_num_dtype(int dt) { return kn_flt_dtype(dt) || kern_int_dtype(dt); }

double kn_ld_d(const unsigned char *p, int dt)
{
    switch (dt) {
    case ACL_FLOAT: { float v; memcpy(&v, p, 4); return v; }
    case ACL_DOUBLE: { double v; memcpy(&v, p, 8); return v; }
    case ACL_FLOAT16: { uint16_t v; memcpy(&v, p, 2); return kern_f16_to_f32(v); }
    case ACL_BF16: { uint16_t v; memcpy(&v, p, 2); return kern_bf16_to_f32(v); }
    case ACL_INT8: return *(const int8_t *)p;
    case ACL_UINT8: return *p;
    case ACL_BOOL: return *p != 0;
    case ACL_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case ACL_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case ACL_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    case ACL_UINT32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case ACL_INT64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case ACL_UINT64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
    default: return 0;
    }
}

int64_t kn_ld_i(const unsigned char *p, int dt)
{
    switch (dt) {
    case ACL_INT8: return *(const int8_t *)p;
    case ACL_UINT8: return *p;
    case ACL_BOOL: return *p != 0;
    case ACL_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case ACL_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case ACL_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    case ACL_UINT32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case ACL_INT64: case ACL_UINT64: { int64_t v; memcpy(&v, p, 8); return v; }
    default: return (int64_t)kn_ld_d(p, dt);
    }
}

/* float -> integer truncates toward zero (C and PyTorch semantics); NaN and
 * out-of-range values become 0 rather than undefined behaviour */
int64_t kn_d_to_i(double v)
{
    if (!(v > -9.2233720368547758e18 && v < 9.2233720368547758e18)) return 0;
    return (int64_t)v;
}

void kn_st_d(unsigned char *p, int dt, double v)
{
    switch (dt) {
    case ACL_FLOAT: { float f = (float)v; memcpy(p, &f, 4); return; }
    case ACL_DOUBLE: memcpy(p, &v, 8); return;
    case ACL_FLOAT16: { uint16_t h = kern_f32_to_f16((float)v); memcpy(p, &h, 2); return; }
    case ACL_BF16: { uint16_t h = kern_f32_to_bf16((float)v); memcpy(p, &h, 2); return; }
    case ACL_BOOL: *p = v != 0; return;
    default: break;
    }
    int64_t i = kn_d_to_i(v);
    switch (dt) {
    case ACL_INT8: case ACL_UINT8: *p = (unsigned char)i; return;
    case ACL_INT16: case ACL_UINT16: { uint16_t x = (uint16_t)i; memcpy(p, &x, 2); return; }
    case ACL_INT32: case ACL_UINT32: { uint32_t x = (uint32_t)i; memcpy(p, &x, 4); return; }
    case ACL_INT64: case ACL_UINT64: memcpy(p, &i, 8); return;
    default: return;
    }
}

void kn_st_i(unsigned char *p, int dt, int64_t v)
{
    switch (dt) {
    case ACL_BOOL: *p = v != 0; return;
    case ACL_INT8: case ACL_UINT8: *p = (unsigned char)v; return;
    case ACL_INT16: case ACL_UINT16: { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); return; }
    case ACL_INT32: case ACL_UINT32: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); return; }
    case ACL_INT64: case ACL_UINT64: memcpy(p, &v, 8); return;
    default: kn_st_d(p, dt, (double)v); return;
    }
}

/* ----------------------------------------------- whole-view loads and stores */

typedef struct { const sim_tensor *t; double *d; int64_t *i; size_t es; } vctx;

static void row_ld_d(void *c, int64_t off, int64_t n, int64_t st, uint64_t idx)
{
    vctx *x = c;
    const unsigned char *b = (const unsigned char *)x->t->data;
    for (int64_t j = 0; j < n; j++) x->d[idx + j] = kn_ld_d(b + (off + j * st) * (int64_t)x->es, x->t->dtype);
}
static void row_ld_i(void *c, int64_t off, int64_t n, int64_t st, uint64_t idx)
{
    vctx *x = c;
    const unsigned char *b = (const unsigned char *)x->t->data;
    for (int64_t j = 0; j < n; j++) x->i[idx + j] = kn_ld_i(b + (off + j * st) * (int64_t)x->es, x->t->dtype);
}
static void row_st_d(void *c, int64_t off, int64_t n, int64_t st, uint64_t idx)
{
    vctx *x = c;
    unsigned char *b = (unsigned char *)x->t->data;
    for (int64_t j = 0; j < n; j++) kn_st_d(b + (off + j * st) * (int64_t)x->es, x->t->dtype, x->d[idx + j]);
}
static void row_st_i(void *c, int64_t off, int64_t n, int64_t st, uint64_t idx)
{
    vctx *x = c;
    unsigned char *b = (unsigned char *)x->t->data;
    for (int64_t j = 0; j < n; j++) kn_st_i(b + (off + j * st) * (int64_t)x->es, x->t->dtype, x->i[idx + j]);
}

/* Row-major copies of a view (malloc'd, at least one element). */
double *kn_load_d(const sim_tensor *t)
{
    uint64_t n = kern_numel(t);
    double *d = malloc((n ? n : 1) * sizeof *d);
    if (!d) return NULL;
    vctx x = { t, d, NULL, kern_dtype_size(t->dtype) };
    kern_for_each_row(t, row_ld_d, &x);
    return d;
}
int64_t *kn_load_i(const sim_tensor *t)
{
    uint64_t n = kern_numel(t);
    int64_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return NULL;
    vctx x = { t, NULL, v, kern_dtype_size(t->dtype) };
    kern_for_each_row(t, row_ld_i, &x);
    return v;
}
void kn_store_d(const sim_tensor *t, const double *v)
{
    vctx x = { t, (double *)v, NULL, kern_dtype_size(t->dtype) };
    kern_for_each_row(t, row_st_d, &x);
}
void kn_store_i(const sim_tensor *t, const int64_t *v)
{
    vctx x = { t, NULL, (int64_t *)v, kern_dtype_size(t->dtype) };
    kern_for_each_row(t, row_st_i, &x);
}

/* ---------------------------------------------------------- shared checks */

aclError kn_fail(const sim_op_args *a, aclError e, const char *why)
{
    aclsim_log("%s: %s", a->op_type, why);
    return e;
}

aclError kn_oom(const sim_op_args *a)
{
    return kn_fail(a, ACL_ERROR_RT_AICORE_EXCEPTION, "out of host memory for the kernel's scratch buffers");
}

aclError kn_counts(const sim_op_args *a, int nin_min, int nin_max, int nout_min, int nout_max)
{
    if (a->nin < nin_min || a->nin > nin_max) {
        aclsim_log("%s: %d inputs (expected %d..%d)", a->op_type, a->nin, nin_min, nin_max);
        return ACL_ERROR_OP_INPUT_NOT_MATCH;
    }
    if (a->nout < nout_min || a->nout > nout_max) {
        aclsim_log("%s: %d outputs (expected %d..%d)", a->op_type, a->nout, nout_min, nout_max);
        return ACL_ERROR_OP_OUTPUT_NOT_MATCH;
    }
    return ACL_SUCCESS;
}

aclError kn_refuse_type(const sim_op_args *a, const char *why)
{
    kern_refuse(a, why, ACL_ERROR_UNSUPPORTED_DATA_TYPE);
    return ACL_ERROR_UNSUPPORTED_DATA_TYPE;
}

/* ACL_ERROR_UNSUPPORTED_DATA_TYPE (100026) with the refusal line when a
 * tensor's element type is not `ok` (libopapi turns it into 161002, the
 * code the aclnn documentation gives for a data type outside the range). */
aclError kn_types(const sim_op_args *a, int (*ok)(int), const char *what)
{
    char why[160];
    for (int i = 0; i < a->nin + a->nout; i++) {
        const sim_tensor *t = i < a->nin ? &a->in[i] : &a->out[i - a->nin];
        if (ok(t->dtype)) continue;
        snprintf(why, sizeof why, "%s %d is %s; supported: %s", i < a->nin ? "input" : "output",
            i < a->nin ? i : i - a->nin, kern_dtype_name(t->dtype), what);
        kern_refuse(a, why, ACL_ERROR_UNSUPPORTED_DATA_TYPE);
        return ACL_ERROR_UNSUPPORTED_DATA_TYPE;
    }
    return ACL_SUCCESS;
}

int kn_same_shape(const sim_tensor *x, const sim_tensor *y)
{
    if (x->ndim != y->ndim) return 0;
    for (int i = 0; i < x->ndim; i++)
        if (x->dims[i] != y->dims[i]) return 0;
    return 1;
}

aclError kn_shape_fail(const sim_op_args *a, const char *why, const sim_tensor *x, const sim_tensor *y)
{
    char s1[128] = "[", s2[128] = "[";
    for (int i = 0; i < x->ndim; i++)
        snprintf(s1 + strlen(s1), sizeof s1 - strlen(s1), "%s%lld", i ? "," : "", (long long)x->dims[i]);
    for (int i = 0; i < y->ndim; i++)
        snprintf(s2 + strlen(s2), sizeof s2 - strlen(s2), "%s%lld", i ? "," : "", (long long)y->dims[i]);
    aclsim_log("%s: %s (%s] vs %s])", a->op_type, why, s1, s2);
    return ACL_ERROR_INVALID_PARAM;
}

/* x broadcasts to y's shape */
int kn_broadcasts_to(const sim_tensor *x, const sim_tensor *y)
{
    sim_tensor v;
    return kern_broadcast_view(x, y, &v);
}

/* y is exactly the broadcast shape of the inputs in[first..first+n) */
aclError kn_bcast_out(const sim_op_args *a, int first, int n, const sim_tensor *y)
{
    int nd = 0;
    for (int s = first; s < first + n; s++)
        if (a->in[s].ndim > nd) nd = a->in[s].ndim;
    if (y->ndim != nd) return kn_shape_fail(a, "output is not the broadcast shape of the inputs", &a->in[first], y);
    for (int i = 0; i < nd; i++) {
        int64_t want = 1;
        for (int s = first; s < first + n; s++) {
            const sim_tensor *x = &a->in[s];
            int k = i - (nd - x->ndim);
            if (k < 0) continue;
            int64_t d = x->dims[k];
            if (d != 1) {
                if (want != 1 && want != d) return kn_shape_fail(a, "inputs do not broadcast", &a->in[first], x);
                want = d;
            }
        }
        if (y->dims[i] != want) return kn_shape_fail(a, "output is not the broadcast shape of the inputs", &a->in[first], y);
    }
    return ACL_SUCCESS;
}

/* A numeric attribute as double (float or int attribute). */
double kn_attr_d(const sim_op_args *a, const char *name, double def)
{
    const sim_attr *at = kern_attr(a, name);
    if (!at) return def;
    return at->type == SIM_ATTR_FLOAT ? (double)at->f : (double)at->i;
}

int kn_norm_axis(int64_t axis, int nd)
{
    if (axis < 0) axis += nd;
    return (axis < 0 || axis >= nd) ? -1 : (int)axis;
}

/* Inputs of an elementwise op viewed with the output's shape, loaded as
 * double (or int64 when `ints`). Frees everything on failure. */
int kn_load_bcast(const sim_op_args *a, int first, int n, const sim_tensor *y, int ints, double **d, int64_t **iv)
{
    for (int k = 0; k < n; k++) {
        sim_tensor v;
        if (!kern_broadcast_view(&a->in[first + k], y, &v)) goto bad;
        if (ints) { if (!(iv[k] = kn_load_i(&v))) goto bad; }
        else if (!(d[k] = kn_load_d(&v))) goto bad;
    }
    return 1;
bad:
    for (int k = 0; k < n; k++) { if (d) free(d[k]), d[k] = NULL; if (iv) free(iv[k]), iv[k] = NULL; }
    return 0;
}

