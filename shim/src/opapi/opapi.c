/* libopapi.so stand-in: aclnn operators.
 *
 * Every operator is two-phase. aclnnXxxGetWorkspaceSize validates its
 * arguments, snapshots the tensors (as sim_tensor views) into a new executor
 * and reports a workspace of 0 bytes; aclnnXxx launches the executor through
 * the core (aclsim_launch_op) and frees it. Adding an operator is one small
 * GetWorkspaceSize function built from the nn_call helpers below plus one
 * NN_LAUNCHER line, e.g.
 *
 *   ACL_FUNC_VISIBILITY aclnnStatus aclnnReluGetWorkspaceSize(const aclTensor *self, aclTensor *out,
 *       uint64_t *workspaceSize, aclOpExecutor **executor)
 *   {
 *       nn_call c;
 *       nn_begin(&c, "aclnnRelu", "Relu");
 *       nn_in(&c, self, "self");
 *       nn_out(&c, out, "out");
 *       return nn_finish(&c, workspaceSize, executor);
 *   }
 *   NN_LAUNCHER(aclnnRelu)
 *
 * The op type must be one the core's kernels know (rt/kernels.c), or the
 * launch runs the hash kernel. Conventions: docs/simulator-ops.md. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "aclnnop/aclnn_ops.h"
#include "nnopbase/aclnn_objects.h"

#define NN_MAX_TENSORS 64
#define NN_MAX_ATTRS 16

/* Arguments of one operator being prepared. The first error sticks: later
 * helper calls become no-ops and nn_finish returns it. */
typedef struct nn_call {
    const char *api;
    const char *op_type;
    aclnnStatus err;
    int nin, nout, nattrs;
    sim_tensor in[NN_MAX_TENSORS];
    sim_tensor out[NN_MAX_TENSORS];
    sim_attr attrs[NN_MAX_ATTRS];
} nn_call;

static void nn_begin(nn_call *c, const char *api, const char *op_type)
{
    c->api = api;
    c->op_type = op_type;
    c->err = ACLNN_SUCCESS;
    c->nin = c->nout = c->nattrs = 0;
}

__attribute__((format(printf, 3, 4)))
static void nn_fail(nn_call *c, aclnnStatus st, const char *fmt, ...)
{
    if (c->err) return;
    c->err = st;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    aclsim_log("%sGetWorkspaceSize: %s", c->api, msg);
}

/* aclTensor -> sim_tensor view: data = storage base + offset * element size,
 * footprint = [base, base + prod(storageDims) * element size). */
static void nn_view(nn_call *c, const aclTensor *h, const char *name, sim_tensor *v)
{
    memset(v, 0, sizeof *v);
    if (c->err) return;
    if (!h) { nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", name); return; }
    const aclTensor *t = (const aclTensor *)aclsim_nn_lookup(h, NN_TENSOR);
    if (!t) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s (%p) is not a live aclTensor", name, (const void *)h); return; }
    if (!t->data) { nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "%s has no device data (NULL)", name); return; }
    size_t es = kern_dtype_size(t->dtype);
    if (es == 0) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s has data type %d without an element size", name, t->dtype); return; }
    if (t->offset < 0) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s has negative offset %lld", name, (long long)t->offset); return; }
    uint64_t elems = 1;
    for (int i = 0; i < t->storage_ndim; i++) {
        if (t->storage_dims[i] < 0 || __builtin_mul_overflow(elems, (uint64_t)t->storage_dims[i], &elems)) {
            nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s has an invalid storage shape", name);
            return;
        }
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(elems, (uint64_t)es, &bytes) || (uint64_t)t->offset > ((uint64_t)1 << 50)) {
        nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s storage size overflows", name);
        return;
    }
    v->base = t->data;
    v->bytes = (size_t)bytes;
    v->data = (char *)t->data + t->offset * (int64_t)es;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    memcpy(v->dims, t->dims, sizeof v->dims);
    memcpy(v->strides, t->strides, sizeof v->strides);
    /* the view's geometry against its footprint is checked by aclsim_op_check */
}

static void nn_in_view(nn_call *c, const sim_tensor *v)
{
    if (c->err) return;
    if (c->nin == NN_MAX_TENSORS) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "too many inputs"); return; }
    c->in[c->nin++] = *v;
}

static void nn_out_view(nn_call *c, const sim_tensor *v)
{
    if (c->err) return;
    if (c->nout == NN_MAX_TENSORS) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "too many outputs"); return; }
    c->out[c->nout++] = *v;
}

static void nn_in(nn_call *c, const aclTensor *t, const char *name)
{
    sim_tensor v;
    nn_view(c, t, name, &v);
    nn_in_view(c, &v);
}

static void nn_out(nn_call *c, const aclTensor *t, const char *name)
{
    sim_tensor v;
    nn_view(c, t, name, &v);
    nn_out_view(c, &v);
}

static sim_attr *nn_attr(nn_call *c, const char *name, int type)
{
    if (c->err) return NULL;
    if (c->nattrs == NN_MAX_ATTRS) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "too many attributes"); return NULL; }
    sim_attr *a = &c->attrs[c->nattrs++];
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", name);
    a->type = type;
    return a;
}

static void nn_attr_int(nn_call *c, const char *name, int64_t v)
{
    sim_attr *a = nn_attr(c, name, SIM_ATTR_INT);
    if (a) a->i = v;
}

static void nn_attr_float(nn_call *c, const char *name, float v)
{
    sim_attr *a = nn_attr(c, name, SIM_ATTR_FLOAT);
    if (a) a->f = v;
}

/* Value of a host scalar as float (any numeric type). */
static float nn_scalar_float(nn_call *c, const aclScalar *h, const char *name)
{
    if (c->err) return 0.0f;
    if (!h) { nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", name); return 0.0f; }
    const aclScalar *s = (const aclScalar *)aclsim_nn_lookup(h, NN_SCALAR);
    if (!s) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s (%p) is not a live aclScalar", name, (const void *)h); return 0.0f; }
    const void *p = s->value;
    union { float f; double d; int8_t i8; uint8_t u8; int16_t i16; uint16_t u16; int32_t i32; uint32_t u32;
            int64_t i64; uint64_t u64; } u;
    memcpy(&u, p, sizeof u);
    switch (s->dtype) {
    case ACL_FLOAT: return u.f;
    case ACL_DOUBLE: return (float)u.d;
    case ACL_FLOAT16: return kern_f16_to_f32(u.u16);
    case ACL_BF16: return kern_bf16_to_f32(u.u16);
    case ACL_INT8: return u.i8;
    case ACL_UINT8: return u.u8;
    case ACL_BOOL: return u.u8 != 0;
    case ACL_INT16: return u.i16;
    case ACL_UINT16: return u.u16;
    case ACL_INT32: return (float)u.i32;
    case ACL_UINT32: return (float)u.u32;
    case ACL_INT64: return (float)u.i64;
    case ACL_UINT64: return (float)u.u64;
    default:
        nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s has unsupported data type %d", name, s->dtype);
        return 0.0f;
    }
}

/* Validation errors of the core (shape, dtype, counts) are argument errors. */
static aclnnStatus nn_status(aclError e)
{
    if (e == ACL_ERROR_INVALID_PARAM || e == ACL_ERROR_OP_INPUT_NOT_MATCH || e == ACL_ERROR_OP_OUTPUT_NOT_MATCH ||
        e == ACL_ERROR_OP_ATTR_NOT_MATCH || e == ACL_ERROR_UNSUPPORTED_DATA_TYPE)
        return ACLNN_ERR_PARAM_INVALID;
    return e;
}

static aclnnStatus nn_finish(nn_call *c, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!c->err && (!workspaceSize || !executor))
        nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", workspaceSize ? "executor" : "workspaceSize");
    if (c->err) return c->err;
    uint64_t flops = 0;
    aclError e = aclsim_op_check(c->op_type, c->in, c->nin, c->out, c->nout, c->attrs, c->nattrs, &flops);
    if (e) {
        nn_fail(c, nn_status(e), "arguments rejected for %s (error %d)", c->op_type, e);
        return c->err;
    }
    int nt = c->nin + c->nout;
    aclOpExecutor *ex = calloc(1, sizeof *ex + (size_t)nt * sizeof(sim_tensor) + (size_t)c->nattrs * sizeof(sim_attr));
    if (!ex) return ACLNN_ERR_INNER;
    ex->t = (sim_tensor *)(ex + 1);
    ex->attrs = (sim_attr *)(ex->t + nt);
    snprintf(ex->api, sizeof ex->api, "%s", c->api);
    snprintf(ex->op_type, sizeof ex->op_type, "%s", c->op_type);
    ex->nin = c->nin;
    ex->nout = c->nout;
    ex->nattrs = c->nattrs;
    ex->flops = flops;
    memcpy(ex->t, c->in, (size_t)c->nin * sizeof(sim_tensor));
    memcpy(ex->t + c->nin, c->out, (size_t)c->nout * sizeof(sim_tensor));
    memcpy(ex->attrs, c->attrs, (size_t)c->nattrs * sizeof(sim_attr));
    aclsim_nn_register(&ex->h, NN_EXECUTOR);
    *workspaceSize = 0;
    *executor = ex;
    return ACLNN_SUCCESS;
}

/* Second phase: runs and consumes the executor. A NULL, destroyed or already
 * launched executor is ACLNN_ERR_PARAM_INVALID; runtime failures (not ready,
 * bad stream, injected op fault, lost device) return the runtime's code. */
static aclnnStatus nn_launch(const char *api, void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
    aclrtStream stream)
{
    aclOpExecutor *ex = (aclOpExecutor *)aclsim_nn_lookup(executor, NN_EXECUTOR);
    if (!ex || !aclsim_nn_unregister(ex, NN_EXECUTOR)) {
        aclsim_log("%s: executor %p is not live (NULL, already launched or destroyed)", api, (void *)executor);
        return ACLNN_ERR_PARAM_INVALID;
    }
    if (strcmp(ex->api, api) != 0)
        aclsim_log("%s: launching an executor prepared by %sGetWorkspaceSize", api, ex->api);
    aclnnStatus st;
    if ((st = aclsim_check_ready()) == 0 && (st = aclsim_stream_check(stream)) == 0) {
        if (aclsim_fault_hit(SIM_FAULT_OP))
            st = ACL_ERROR_RT_AICORE_EXCEPTION;
        else
            st = nn_status(aclsim_launch_op(stream, api, ex->op_type, ex->t, ex->nin, ex->t + ex->nin, ex->nout,
                ex->attrs, ex->nattrs));
    }
    free(ex);
    return st;
}

#define NN_LAUNCHER(name)                                                                              \
    ACL_FUNC_VISIBILITY aclnnStatus name(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, \
        aclrtStream stream)                                                                            \
    {                                                                                                  \
        return nn_launch(#name, workspace, workspaceSize, executor, stream);                          \
    }

/* ------------------------------------------------------------- operators */

/* out = self + alpha * other (broadcasting) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnAddGetWorkspaceSize(const aclTensor *self, const aclTensor *other,
    const aclScalar *alpha, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnAdd", "Add");
    nn_in(&c, self, "self");
    nn_in(&c, other, "other");
    nn_out(&c, out, "out");
    nn_attr_float(&c, "alpha", nn_scalar_float(&c, alpha, "alpha"));
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnAdd)

/* out = self * other (broadcasting) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnMulGetWorkspaceSize(const aclTensor *self, const aclTensor *other,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnMul", "Mul");
    nn_in(&c, self, "self");
    nn_in(&c, other, "other");
    nn_out(&c, out, "out");
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnMul)

/* out = self @ mat2: 2-D x 2-D, or batched (equal batch dims), or batched x
 * 2-D (mat2 shared by every batch). Transposed operands are strided views. */
ACL_FUNC_VISIBILITY aclnnStatus aclnnMatmulGetWorkspaceSize(const aclTensor *self, const aclTensor *mat2,
    aclTensor *out, int8_t cubeMathType, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    sim_tensor a, b, y;
    nn_begin(&c, "aclnnMatmul", "MatMul");
    nn_view(&c, self, "self", &a);
    nn_view(&c, mat2, "mat2", &b);
    nn_view(&c, out, "out", &y);
    if (!c.err && (cubeMathType < 0 || cubeMathType > 3))
        nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "cubeMathType %d is not one of 0..3", cubeMathType);
    if (!c.err) {
        if (a.ndim == 2 && b.ndim == 2) {
            c.op_type = "MatMul";
        } else if (a.ndim >= 3 && b.ndim == a.ndim) {
            c.op_type = "BatchMatMul";
        } else if (a.ndim >= 3 && b.ndim == 2) {
            /* the same mat2 for every batch: a batched view with stride 0 */
            sim_tensor bb = b;
            int nb = a.ndim - 2;
            bb.ndim = a.ndim;
            for (int i = 0; i < nb; i++) { bb.dims[i] = a.dims[i]; bb.strides[i] = 0; }
            for (int i = 0; i < 2; i++) { bb.dims[nb + i] = b.dims[i]; bb.strides[nb + i] = b.strides[i]; }
            b = bb;
            c.op_type = "BatchMatMul";
        } else {
            nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "self is %d-D and mat2 %d-D (supported: 2-D x 2-D, N-D x N-D, N-D x 2-D)",
                a.ndim, b.ndim);
        }
    }
    nn_in_view(&c, &a);
    nn_in_view(&c, &b);
    nn_out_view(&c, &y);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnMatmul)

/* out = softmax(self) along dim (negative counts from the end) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnSoftmaxGetWorkspaceSize(const aclTensor *self, int64_t dim, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnSoftmax", "SoftmaxV2");
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "axis", dim);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnSoftmax)
