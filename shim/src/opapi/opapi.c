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

/* foreach operators pass whole parameter lists (op-plugin splits them at
 * 48 tensors per list, up to 3 lists plus the outputs) */
#define NN_MAX_TENSORS 256
#define NN_MAX_ATTRS 80

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

/* A host scalar as an attribute, keeping its kind: an integer (or bool)
 * scalar becomes an int attribute (exact), a floating one a float attribute
 * (the precision the float32 kernels compute with). */
static void nn_attr_scalar(nn_call *c, const char *attr, const aclScalar *h, const char *name)
{
    if (c->err) return;
    if (!h) { nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", name); return; }
    const aclScalar *s = (const aclScalar *)aclsim_nn_lookup(h, NN_SCALAR);
    if (!s) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s (%p) is not a live aclScalar", name, (const void *)h); return; }
    int64_t iv;
    switch (s->dtype) {
    case ACL_INT8: iv = *(const int8_t *)s->value; break;
    case ACL_UINT8: case ACL_BOOL: iv = s->value[0]; break;
    case ACL_INT16: { int16_t v; memcpy(&v, s->value, 2); iv = v; break; }
    case ACL_UINT16: { uint16_t v; memcpy(&v, s->value, 2); iv = v; break; }
    case ACL_INT32: { int32_t v; memcpy(&v, s->value, 4); iv = v; break; }
    case ACL_UINT32: { uint32_t v; memcpy(&v, s->value, 4); iv = v; break; }
    case ACL_INT64: case ACL_UINT64: memcpy(&iv, s->value, 8); break;
    default:
        nn_attr_float(c, attr, nn_scalar_float(c, h, name));
        return;
    }
    if (s->dtype == ACL_BOOL) iv = iv != 0;
    nn_attr_int(c, attr, iv);
}

/* ACLNN_ERR_INNER_FIND_KERNEL_ERROR: "an inner error occurs when the API
 * searches for the NPU kernel (the operator binary package is not
 * installed)" — the aclnn return-code table of the CANN docs
 * (hiascend.com, "aclnn Return Codes"). Not in the public headers. */
#define NN_ERR_FIND_KERNEL 561003

/* Validation errors of the core (shape, dtype, counts) are argument errors:
 * 161002, what every aclnn page documents for a data type or shape outside
 * the operator's range. An operator without a kernel is 561003. */
static aclnnStatus nn_status(aclError e)
{
    if (e == ACL_ERROR_INVALID_PARAM || e == ACL_ERROR_OP_INPUT_NOT_MATCH || e == ACL_ERROR_OP_OUTPUT_NOT_MATCH ||
        e == ACL_ERROR_OP_ATTR_NOT_MATCH || e == ACL_ERROR_UNSUPPORTED_DATA_TYPE)
        return ACLNN_ERR_PARAM_INVALID;
    if (e == ACL_ERROR_OP_NOT_FOUND) return NN_ERR_FIND_KERNEL;
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

/* ============================================================================
 * The operators of a PyTorch training step, as torch_npu's op-plugin calls
 * them (prototypes: the CANN aclnnop/aclnn_*.h headers; op-plugin passes
 * at::Scalar as an aclScalar of DOUBLE, INT64 or BOOL). Kernels:
 * rt/kernels_nn.c (and kernels.c for MatMul, Add/Sub/Mul, Relu, Fill).
 * ========================================================================= */

/* Binary tensor-tensor op; with_alpha: the required alpha scalar scales other. */
static aclnnStatus nn_binary(const char *api, const char *op, const aclTensor *self, const aclTensor *other,
    int with_alpha, const aclScalar *alpha, const aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, op);
    nn_in(&c, self, "self");
    nn_in(&c, other, "other");
    nn_out(&c, out, "out");
    if (with_alpha) nn_attr_scalar(&c, "alpha", alpha, "alpha");
    return nn_finish(&c, workspaceSize, executor);
}

/* Tensor-scalar op: out = self op value (alpha scales value for Adds/Subs). */
static aclnnStatus nn_scalar_op(const char *api, const char *op, const aclTensor *self, const aclScalar *value,
    const aclScalar *alpha, const aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, op);
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    nn_attr_scalar(&c, "value", value, "other");
    if (alpha) nn_attr_scalar(&c, "alpha", alpha, "alpha");
    return nn_finish(&c, workspaceSize, executor);
}

/* Unary op: out = f(self). */
static aclnnStatus nn_unary(const char *api, const char *op, const aclTensor *self, const aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, op);
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    return nn_finish(&c, workspaceSize, executor);
}

/* ---- tensor-tensor arithmetic ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceAddGetWorkspaceSize(aclTensor *selfRef, const aclTensor *other,
    const aclScalar *alpha, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_binary("aclnnInplaceAdd", "Add", selfRef, other, 1, alpha, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceAdd)

ACL_FUNC_VISIBILITY aclnnStatus aclnnSubGetWorkspaceSize(const aclTensor *self, const aclTensor *other,
    const aclScalar *alpha, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_binary("aclnnSub", "Sub", self, other, 1, alpha, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnSub)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceSubGetWorkspaceSize(aclTensor *selfRef, const aclTensor *other,
    const aclScalar *alpha, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_binary("aclnnInplaceSub", "Sub", selfRef, other, 1, alpha, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceSub)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceMulGetWorkspaceSize(aclTensor *selfRef, const aclTensor *other,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_binary("aclnnInplaceMul", "Mul", selfRef, other, 0, NULL, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceMul)

ACL_FUNC_VISIBILITY aclnnStatus aclnnDivGetWorkspaceSize(const aclTensor *self, const aclTensor *other,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_binary("aclnnDiv", "RealDiv", self, other, 0, NULL, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnDiv)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceDivGetWorkspaceSize(aclTensor *selfRef, const aclTensor *other,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_binary("aclnnInplaceDiv", "RealDiv", selfRef, other, 0, NULL, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceDiv)

ACL_FUNC_VISIBILITY aclnnStatus aclnnMaximumGetWorkspaceSize(const aclTensor *self, const aclTensor *other,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_binary("aclnnMaximum", "Maximum", self, other, 0, NULL, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnMaximum)

ACL_FUNC_VISIBILITY aclnnStatus aclnnMinimumGetWorkspaceSize(const aclTensor *self, const aclTensor *other,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_binary("aclnnMinimum", "Minimum", self, other, 0, NULL, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnMinimum)

/* ---- tensor-scalar arithmetic ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnAddsGetWorkspaceSize(const aclTensor *self, const aclScalar *other,
    const aclScalar *alpha, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scalar_op("aclnnAdds", "Adds", self, other, alpha, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnAdds)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceAddsGetWorkspaceSize(aclTensor *selfRef, const aclScalar *other,
    const aclScalar *alpha, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scalar_op("aclnnInplaceAdds", "Adds", selfRef, other, alpha, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceAdds)

ACL_FUNC_VISIBILITY aclnnStatus aclnnSubsGetWorkspaceSize(const aclTensor *self, const aclScalar *other,
    const aclScalar *alpha, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scalar_op("aclnnSubs", "Subs", self, other, alpha, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnSubs)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceSubsGetWorkspaceSize(aclTensor *selfRef, const aclScalar *other,
    const aclScalar *alpha, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scalar_op("aclnnInplaceSubs", "Subs", selfRef, other, alpha, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceSubs)

ACL_FUNC_VISIBILITY aclnnStatus aclnnMulsGetWorkspaceSize(const aclTensor *self, const aclScalar *other,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scalar_op("aclnnMuls", "Muls", self, other, NULL, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnMuls)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceMulsGetWorkspaceSize(aclTensor *selfRef, const aclScalar *other,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scalar_op("aclnnInplaceMuls", "Muls", selfRef, other, NULL, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceMuls)

ACL_FUNC_VISIBILITY aclnnStatus aclnnDivsGetWorkspaceSize(const aclTensor *self, const aclScalar *other,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scalar_op("aclnnDivs", "Divs", self, other, NULL, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnDivs)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceDivsGetWorkspaceSize(aclTensor *selfRef, const aclScalar *other,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scalar_op("aclnnInplaceDivs", "Divs", selfRef, other, NULL, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceDivs)

/* ---- fills and copies ---- */

static aclnnStatus nn_fill(const char *api, aclTensor *selfRef, const aclScalar *value, double constant,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, "Fill");
    nn_out(&c, selfRef, "selfRef");
    if (value) nn_attr_scalar(&c, "value", value, "value");
    else nn_attr_int(&c, "value", (int64_t)constant);
    return nn_finish(&c, workspaceSize, executor);
}

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceZeroGetWorkspaceSize(aclTensor *selfRef, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    return nn_fill("aclnnInplaceZero", selfRef, NULL, 0, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceZero)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceOneGetWorkspaceSize(aclTensor *selfRef, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    return nn_fill("aclnnInplaceOne", selfRef, NULL, 1, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceOne)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceFillScalarGetWorkspaceSize(aclTensor *selfRef, const aclScalar *value,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!value) {
        nn_call c;
        nn_begin(&c, "aclnnInplaceFillScalar", "Fill");
        nn_fail(&c, ACLNN_ERR_PARAM_NULLPTR, "value is NULL");
        return c.err;
    }
    return nn_fill("aclnnInplaceFillScalar", selfRef, value, 0, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceFillScalar)

/* selfRef = src, converting the element type; src broadcasts to selfRef */
ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceCopyGetWorkspaceSize(aclTensor *selfRef, const aclTensor *src,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnInplaceCopy", "ViewCopy");
    nn_in(&c, src, "src");
    nn_out(&c, selfRef, "selfRef");
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceCopy)

ACL_FUNC_VISIBILITY aclnnStatus aclnnCastGetWorkspaceSize(const aclTensor *self, const aclDataType dtype,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnCast", "Cast");
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    if (!c.err && c.out[0].dtype != (int)dtype)
        nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "dtype %d differs from out's data type %d", (int)dtype, c.out[0].dtype);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnCast)

/* ---- matrix products ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnMmGetWorkspaceSize(const aclTensor *self, const aclTensor *mat2,
    aclTensor *out, int8_t cubeMathType, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnMm", "MatMul");
    nn_in(&c, self, "self");
    nn_in(&c, mat2, "mat2");
    nn_out(&c, out, "out");
    if (!c.err && (cubeMathType < 0 || cubeMathType > 3))
        nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "cubeMathType %d is not one of 0..3", cubeMathType);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnMm)

/* out = beta * self + alpha * (mat1 @ mat2) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnAddmmGetWorkspaceSize(const aclTensor *self, const aclTensor *mat1,
    const aclTensor *mat2, const aclScalar *beta, const aclScalar *alpha, aclTensor *out, int8_t cubeMathType,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnAddmm", "Addmm");
    nn_in(&c, self, "self");
    nn_in(&c, mat1, "mat1");
    nn_in(&c, mat2, "mat2");
    nn_out(&c, out, "out");
    nn_attr_scalar(&c, "beta", beta, "beta");
    nn_attr_scalar(&c, "alpha", alpha, "alpha");
    if (!c.err && (cubeMathType < 0 || cubeMathType > 3))
        nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "cubeMathType %d is not one of 0..3", cubeMathType);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnAddmm)

/* ---- activations ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnReluGetWorkspaceSize(const aclTensor *self, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_unary("aclnnRelu", "Relu", self, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnRelu)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceReluGetWorkspaceSize(aclTensor *selfRef, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    return nn_unary("aclnnInplaceRelu", "Relu", selfRef, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceRelu)

/* gradInput = self > threshold ? gradOutput : 0 (ReLU backward) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnThresholdBackwardGetWorkspaceSize(const aclTensor *gradOutput,
    const aclTensor *self, const aclScalar *threshold, aclTensor *gradInput, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnThresholdBackward", "ThresholdGradV2D");
    nn_in(&c, gradOutput, "gradOutput");
    nn_in(&c, self, "self");
    nn_out(&c, gradInput, "gradInput");
    nn_attr_scalar(&c, "threshold", threshold, "threshold");
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnThresholdBackward)

/* exact (erf) GELU */
ACL_FUNC_VISIBILITY aclnnStatus aclnnGeluGetWorkspaceSize(const aclTensor *self, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_unary("aclnnGelu", "Gelu", self, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnGelu)

ACL_FUNC_VISIBILITY aclnnStatus aclnnGeluBackwardGetWorkspaceSize(const aclTensor *gradOutput, const aclTensor *self,
    aclTensor *gradInput, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnGeluBackward", "GeluGrad");
    nn_in(&c, gradOutput, "gradOutput");
    nn_in(&c, self, "self");
    nn_out(&c, gradInput, "gradInput");
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnGeluBackward)

/* GeluV2: approximate 0 = none (erf); 1 = tanh is not simulated */
ACL_FUNC_VISIBILITY aclnnStatus aclnnGeluV2GetWorkspaceSize(const aclTensor *self, int64_t approximate,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnGeluV2", "Gelu");
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    if (!c.err && approximate != 0)
        nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "approximate=%lld: only 0 (none) is simulated", (long long)approximate);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnGeluV2)

ACL_FUNC_VISIBILITY aclnnStatus aclnnSqrtGetWorkspaceSize(const aclTensor *self, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_unary("aclnnSqrt", "Sqrt", self, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnSqrt)

ACL_FUNC_VISIBILITY aclnnStatus aclnnNegGetWorkspaceSize(const aclTensor *self, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_unary("aclnnNeg", "Neg", self, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnNeg)

ACL_FUNC_VISIBILITY aclnnStatus aclnnExpGetWorkspaceSize(const aclTensor *self, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_unary("aclnnExp", "Exp", self, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnExp)

/* ---- softmax family and loss ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnLogSoftmaxGetWorkspaceSize(const aclTensor *self, int64_t dim, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnLogSoftmax", "LogSoftmaxV2");
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "axis", dim);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnLogSoftmax)

ACL_FUNC_VISIBILITY aclnnStatus aclnnLogSoftmaxBackwardGetWorkspaceSize(const aclTensor *gradOutput,
    const aclTensor *output, int64_t dim, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnLogSoftmaxBackward", "LogSoftmaxGrad");
    nn_in(&c, gradOutput, "gradOutput");
    nn_in(&c, output, "output");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "axis", dim);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnLogSoftmaxBackward)

/* reduction: 0 none, 1 mean, 2 sum */
ACL_FUNC_VISIBILITY aclnnStatus aclnnNLLLossGetWorkspaceSize(const aclTensor *self, const aclTensor *target,
    const aclTensor *weight, int64_t reduction, int64_t ignoreIndex, aclTensor *out, aclTensor *totalWeightOut,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnNLLLoss", "NLLLoss");
    nn_in(&c, self, "self");
    nn_in(&c, target, "target");
    nn_in(&c, weight, "weight");
    nn_out(&c, out, "out");
    nn_out(&c, totalWeightOut, "totalWeightOut");
    nn_attr_int(&c, "reduction", reduction);
    nn_attr_int(&c, "ignore_index", ignoreIndex);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnNLLLoss)

ACL_FUNC_VISIBILITY aclnnStatus aclnnNLLLossBackwardGetWorkspaceSize(const aclTensor *gradOutput,
    const aclTensor *self, const aclTensor *target, const aclTensor *weight, int64_t reduction, int64_t ignoreIndex,
    const aclTensor *totalWeight, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnNLLLossBackward", "NLLLossGrad");
    nn_in(&c, self, "self");
    nn_in(&c, gradOutput, "gradOutput");
    nn_in(&c, target, "target");
    nn_in(&c, weight, "weight");
    nn_in(&c, totalWeight, "totalWeight");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "reduction", reduction);
    nn_attr_int(&c, "ignore_index", ignoreIndex);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnNLLLossBackward)

/* ---- reductions ---- */

static aclnnStatus nn_reduce(const char *api, const char *op, const aclTensor *self, const aclIntArray *dim,
    bool keepDim, aclDataType dtype, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor);

/* out = sum of self over dims (empty: every dim); dtype is out's type */
ACL_FUNC_VISIBILITY aclnnStatus aclnnReduceSumGetWorkspaceSize(const aclTensor *self, const aclIntArray *dim,
    bool keepDim, aclDataType dtype, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_reduce("aclnnReduceSum", "ReduceSumD", self, dim, keepDim, dtype, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnReduceSum)

/* out = mean of self over dims (empty: every dim) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnMeanGetWorkspaceSize(const aclTensor *self, const aclIntArray *dim, bool keepDim,
    aclDataType dtype, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_reduce("aclnnMean", "ReduceMeanD", self, dim, keepDim, dtype, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnMean)

static aclnnStatus nn_reduce(const char *api, const char *op, const aclTensor *self, const aclIntArray *dim,
    bool keepDim, aclDataType dtype, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, op);
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    if (!c.err && !dim) nn_fail(&c, ACLNN_ERR_PARAM_NULLPTR, "dim is NULL");
    const aclIntArray *d = c.err ? NULL : (const aclIntArray *)aclsim_nn_lookup(dim, NN_INT_ARRAY);
    if (!c.err && !d) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "dim (%p) is not a live aclIntArray", (const void *)dim);
    uint32_t mask = 0;
    for (uint64_t i = 0; !c.err && i < d->n; i++) {
        int nd = c.in[0].ndim;
        int64_t ax = d->v[i] < 0 ? d->v[i] + nd : d->v[i];
        if (ax < 0 || ax >= (nd ? nd : 1))
            nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "dim %lld is out of range for rank %d", (long long)d->v[i], nd);
        else if (nd) mask |= 1u << ax;
    }
    if (!c.err && c.out[0].dtype != (int)dtype)
        nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "dtype %d differs from out's data type %d", (int)dtype, c.out[0].dtype);
    nn_attr_int(&c, "axes", mask);
    nn_attr_int(&c, "keep_dims", keepDim);
    return nn_finish(&c, workspaceSize, executor);
}

/* ---- foreach (torch.optim's multi-tensor path) ---- */

/* A required pointer argument is NULL. */
static aclnnStatus nn_null(const char *api, const char *what)
{
    nn_call c;
    nn_begin(&c, api, "");
    nn_fail(&c, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", what);
    return c.err;
}

/* Adds every tensor of a list as an input (or output); returns its length,
 * or -1 after recording the error. */
static int64_t nn_list(nn_call *c, const aclTensorList *h, const char *name, int as_out)
{
    if (c->err) return -1;
    if (!h) { nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", name); return -1; }
    const aclTensorList *l = (const aclTensorList *)aclsim_nn_lookup(h, NN_TENSOR_LIST);
    if (!l) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s (%p) is not a live aclTensorList", name, (const void *)h); return -1; }
    if (l->n == 0) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s is empty", name); return -1; }
    for (uint64_t i = 0; i < l->n; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "%s[%llu]", name, (unsigned long long)i);
        if (as_out) nn_out(c, l->v[i], nm); else nn_in(c, l->v[i], nm);
    }
    return c->err ? -1 : (int64_t)l->n;
}

/* One foreach launch: up to three input lists, an optional scalar (host
 * aclScalar, a scalar list, or a one-element device tensor), the out list. */
static aclnnStatus nn_foreach(const char *api, const char *op, const aclTensorList *x1, const aclTensorList *x2,
    const aclTensorList *x3, const aclScalar *scalar, const aclScalarList *scalars, const aclTensor *scalarTensor,
    const aclTensorList *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, op);
    int64_t n = nn_list(&c, x1, "x1", 0);
    if (x2 && nn_list(&c, x2, "x2", 0) != n && !c.err) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "x1 and x2 differ in length");
    if (x3 && nn_list(&c, x3, "x3", 0) != n && !c.err) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "x1 and x3 differ in length");
    if (scalarTensor) {
        nn_in(&c, scalarTensor, "scalar");
        nn_attr_int(&c, "scalar_input", 1);
    }
    if (nn_list(&c, out, "out", 1) != n && !c.err) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "x1 and out differ in length");
    nn_attr_int(&c, "n", n);
    if (scalar) nn_attr_scalar(&c, "scalar", scalar, "scalar");
    if (scalars && !c.err) {
        const aclScalarList *sl = (const aclScalarList *)aclsim_nn_lookup(scalars, NN_SCALAR_LIST);
        if (!sl) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "scalars (%p) is not a live aclScalarList", (const void *)scalars);
        else if ((int64_t)sl->n != n) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "scalars has %llu elements, the lists %lld",
            (unsigned long long)sl->n, (long long)n);
        for (uint64_t i = 0; !c.err && i < sl->n; i++) {
            char nm[32];
            snprintf(nm, sizeof nm, "scalar%llu", (unsigned long long)i);
            nn_attr_scalar(&c, nm, sl->v[i], "scalars[i]");
        }
    }
    return nn_finish(&c, workspaceSize, executor);
}

#define FOREACH_SCALAR(name, op)                                                                              \
    ACL_FUNC_VISIBILITY aclnnStatus name##V2GetWorkspaceSize(const aclTensorList *x, const aclScalar *scalar,  \
        aclTensorList *out, uint64_t *workspaceSize, aclOpExecutor **executor)                               \
    {                                                                                                         \
        if (!scalar) return nn_null(#name "V2", "scalar"); \
        return nn_foreach(#name "V2", op, x, NULL, NULL, scalar, NULL, NULL, out, workspaceSize, executor);   \
    }                                                                                                         \
    NN_LAUNCHER(name##V2)                                                                                     \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensorList *x, const aclTensor *scalar,    \
        aclTensorList *out, uint64_t *workspaceSize, aclOpExecutor **executor)                               \
    {                                                                                                         \
        if (!scalar) return nn_null(#name, "scalar"); \
        return nn_foreach(#name, op, x, NULL, NULL, NULL, NULL, scalar, out, workspaceSize, executor);        \
    }                                                                                                         \
    NN_LAUNCHER(name)                                                                                         \
    ACL_FUNC_VISIBILITY aclnnStatus name##ListGetWorkspaceSize(const aclTensorList *x,                         \
        const aclScalarList *scalars, aclTensorList *out, uint64_t *workspaceSize, aclOpExecutor **executor) \
    {                                                                                                         \
        if (!scalars) return nn_null(#name "List", "scalars"); \
        return nn_foreach(#name "List", op, x, NULL, NULL, NULL, scalars, NULL, out, workspaceSize, executor); \
    }                                                                                                         \
    NN_LAUNCHER(name##List)

/* aclnnForeachXxxScalar (device scalar), ...ScalarV2 (host scalar), ...ScalarList */
FOREACH_SCALAR(aclnnForeachAddScalar, "ForeachAddScalar")
FOREACH_SCALAR(aclnnForeachSubScalar, "ForeachSubScalar")
FOREACH_SCALAR(aclnnForeachMulScalar, "ForeachMulScalar")
FOREACH_SCALAR(aclnnForeachDivScalar, "ForeachDivScalar")

#define FOREACH_UNARY(name, op)                                                                               \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensorList *x, aclTensorList *out,         \
        uint64_t *workspaceSize, aclOpExecutor **executor)                                                   \
    {                                                                                                         \
        return nn_foreach(#name, op, x, NULL, NULL, NULL, NULL, NULL, out, workspaceSize, executor);          \
    }                                                                                                         \
    NN_LAUNCHER(name)

FOREACH_UNARY(aclnnForeachSqrt, "ForeachSqrt")
FOREACH_UNARY(aclnnForeachNeg, "ForeachNeg")
FOREACH_UNARY(aclnnForeachReciprocal, "ForeachReciprocal")
FOREACH_UNARY(aclnnForeachExp, "ForeachExp")

/* x1 op x2 elementwise; Add/Sub scale x2 by alpha */
ACL_FUNC_VISIBILITY aclnnStatus aclnnForeachAddListGetWorkspaceSize(const aclTensorList *x1, const aclTensorList *x2,
    const aclTensor *alpha, aclTensorList *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!alpha) return nn_null("aclnnForeachAddList", "alpha");
    return nn_foreach("aclnnForeachAddList", "ForeachAddList", x1, x2, NULL, NULL, NULL, alpha, out, workspaceSize,
        executor);
}
NN_LAUNCHER(aclnnForeachAddList)

ACL_FUNC_VISIBILITY aclnnStatus aclnnForeachAddListV2GetWorkspaceSize(const aclTensorList *x1,
    const aclTensorList *x2, const aclScalar *alpha, aclTensorList *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    if (!alpha) return nn_null("aclnnForeachAddListV2", "alpha");
    return nn_foreach("aclnnForeachAddListV2", "ForeachAddList", x1, x2, NULL, alpha, NULL, NULL, out, workspaceSize,
        executor);
}
NN_LAUNCHER(aclnnForeachAddListV2)

ACL_FUNC_VISIBILITY aclnnStatus aclnnForeachMulListGetWorkspaceSize(const aclTensorList *x1, const aclTensorList *x2,
    aclTensorList *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_foreach("aclnnForeachMulList", "ForeachMulList", x1, x2, NULL, NULL, NULL, NULL, out, workspaceSize,
        executor);
}
NN_LAUNCHER(aclnnForeachMulList)

ACL_FUNC_VISIBILITY aclnnStatus aclnnForeachDivListGetWorkspaceSize(const aclTensorList *x1, const aclTensorList *x2,
    aclTensorList *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_foreach("aclnnForeachDivList", "ForeachDivList", x1, x2, NULL, NULL, NULL, NULL, out, workspaceSize,
        executor);
}
NN_LAUNCHER(aclnnForeachDivList)

/* x1 + weight * (x2 - x1) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnForeachLerpScalarGetWorkspaceSize(const aclTensorList *x1,
    const aclTensorList *x2, const aclScalar *weight, aclTensorList *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    if (!weight) return nn_null("aclnnForeachLerpScalar", "weight");
    return nn_foreach("aclnnForeachLerpScalar", "ForeachLerpScalar", x1, x2, NULL, weight, NULL, NULL, out,
        workspaceSize, executor);
}
NN_LAUNCHER(aclnnForeachLerpScalar)

ACL_FUNC_VISIBILITY aclnnStatus aclnnForeachLerpListGetWorkspaceSize(const aclTensorList *x1,
    const aclTensorList *x2, const aclTensorList *weight, aclTensorList *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    return nn_foreach("aclnnForeachLerpList", "ForeachLerpList", x1, x2, weight, NULL, NULL, NULL, out,
        workspaceSize, executor);
}
NN_LAUNCHER(aclnnForeachLerpList)

/* x1 + scalar * x2 * x3 (Addcmul) or x1 + scalar * x2 / x3 (Addcdiv) */
#define FOREACH_ADDC(name, op)                                                                                \
    ACL_FUNC_VISIBILITY aclnnStatus name##V2GetWorkspaceSize(const aclTensorList *x1, const aclTensorList *x2, \
        const aclTensorList *x3, const aclScalar *scalar, aclTensorList *out, uint64_t *workspaceSize,       \
        aclOpExecutor **executor)                                                                            \
    {                                                                                                         \
        if (!scalar) return nn_null(#name "V2", "scalar"); \
        return nn_foreach(#name "V2", op, x1, x2, x3, scalar, NULL, NULL, out, workspaceSize, executor);       \
    }                                                                                                         \
    NN_LAUNCHER(name##V2)                                                                                     \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensorList *x1, const aclTensorList *x2,   \
        const aclTensorList *x3, const aclTensor *scalar, aclTensorList *out, uint64_t *workspaceSize,       \
        aclOpExecutor **executor)                                                                            \
    {                                                                                                         \
        if (!scalar) return nn_null(#name, "scalar"); \
        return nn_foreach(#name, op, x1, x2, x3, NULL, NULL, scalar, out, workspaceSize, executor);            \
    }                                                                                                         \
    NN_LAUNCHER(name)                                                                                         \
    ACL_FUNC_VISIBILITY aclnnStatus name##ListGetWorkspaceSize(const aclTensorList *x1,                        \
        const aclTensorList *x2, const aclTensorList *x3, const aclScalarList *scalars, aclTensorList *out,  \
        uint64_t *workspaceSize, aclOpExecutor **executor)                                                   \
    {                                                                                                         \
        if (!scalars) return nn_null(#name "List", "scalars"); \
        return nn_foreach(#name "List", op, x1, x2, x3, NULL, scalars, NULL, out, workspaceSize, executor);    \
    }                                                                                                         \
    NN_LAUNCHER(name##List)

FOREACH_ADDC(aclnnForeachAddcmulScalar, "ForeachAddcmulScalar")
FOREACH_ADDC(aclnnForeachAddcdivScalar, "ForeachAddcdivScalar")

/* ---- addcmul / addcdiv: self + value * tensor1 (*|/) tensor2 ---- */

static aclnnStatus nn_addc(const char *api, const char *op, const aclTensor *self, const aclTensor *t1,
    const aclTensor *t2, const aclScalar *value, const aclTensor *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, op);
    nn_in(&c, self, "self");
    nn_in(&c, t1, "tensor1");
    nn_in(&c, t2, "tensor2");
    nn_out(&c, out, "out");
    nn_attr_scalar(&c, "value", value, "value");
    return nn_finish(&c, workspaceSize, executor);
}

ACL_FUNC_VISIBILITY aclnnStatus aclnnAddcdivGetWorkspaceSize(const aclTensor *self, const aclTensor *tensor1,
    const aclTensor *tensor2, const aclScalar *value, aclTensor *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    return nn_addc("aclnnAddcdiv", "Addcdiv", self, tensor1, tensor2, value, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnAddcdiv)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceAddcdivGetWorkspaceSize(aclTensor *selfRef, const aclTensor *tensor1,
    const aclTensor *tensor2, const aclScalar *value, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_addc("aclnnInplaceAddcdiv", "Addcdiv", selfRef, tensor1, tensor2, value, selfRef, workspaceSize,
        executor);
}
NN_LAUNCHER(aclnnInplaceAddcdiv)

ACL_FUNC_VISIBILITY aclnnStatus aclnnAddcmulGetWorkspaceSize(const aclTensor *self, const aclTensor *tensor1,
    const aclTensor *tensor2, const aclScalar *value, aclTensor *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    return nn_addc("aclnnAddcmul", "Addcmul", self, tensor1, tensor2, value, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnAddcmul)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceAddcmulGetWorkspaceSize(aclTensor *selfRef, const aclTensor *tensor1,
    const aclTensor *tensor2, const aclScalar *value, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_addc("aclnnInplaceAddcmul", "Addcmul", selfRef, tensor1, tensor2, value, selfRef, workspaceSize,
        executor);
}
NN_LAUNCHER(aclnnInplaceAddcmul)

/* ---- lerp: self + weight * (end - self) ---- */

static aclnnStatus nn_lerp(const char *api, const aclTensor *self, const aclTensor *end, const aclTensor *weightT,
    const aclScalar *weightS, const aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, "Lerp");
    nn_in(&c, self, "self");
    nn_in(&c, end, "end");
    if (weightS) nn_attr_scalar(&c, "weight", weightS, "weight");
    else nn_in(&c, weightT, "weight");
    nn_out(&c, out, "out");
    return nn_finish(&c, workspaceSize, executor);
}

ACL_FUNC_VISIBILITY aclnnStatus aclnnLerpGetWorkspaceSize(const aclTensor *self, const aclTensor *end,
    const aclTensor *weight, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_lerp("aclnnLerp", self, end, weight, NULL, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnLerp)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceLerpGetWorkspaceSize(aclTensor *selfRef, const aclTensor *end,
    const aclTensor *weight, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_lerp("aclnnInplaceLerp", selfRef, end, weight, NULL, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceLerp)

ACL_FUNC_VISIBILITY aclnnStatus aclnnLerpsGetWorkspaceSize(const aclTensor *self, const aclTensor *end,
    const aclScalar *weight, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!weight) return nn_null("aclnnLerps", "weight");
    return nn_lerp("aclnnLerps", self, end, NULL, weight, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnLerps)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceLerpsGetWorkspaceSize(aclTensor *selfRef, const aclTensor *end,
    const aclScalar *weight, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!weight) return nn_null("aclnnInplaceLerps", "weight");
    return nn_lerp("aclnnInplaceLerps", selfRef, end, NULL, weight, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceLerps)

/* ---- MSE loss ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnMseLossGetWorkspaceSize(const aclTensor *self, const aclTensor *target,
    int64_t reduction, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnMseLoss", "MseLoss");
    nn_in(&c, self, "self");
    nn_in(&c, target, "target");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "reduction", reduction);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnMseLoss)

ACL_FUNC_VISIBILITY aclnnStatus aclnnMseLossBackwardGetWorkspaceSize(const aclTensor *gradOutput, const aclTensor *self,
    const aclTensor *target, int64_t reduction, aclTensor *gradInput, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnMseLossBackward", "MseLossGrad");
    nn_in(&c, gradOutput, "gradOutput");
    nn_in(&c, self, "self");
    nn_in(&c, target, "target");
    nn_out(&c, gradInput, "gradInput");
    nn_attr_int(&c, "reduction", reduction);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnMseLossBackward)

/* ---- fused AdamW (torch.optim.AdamW(fused=True)): var, m, v (and max_v
 * with amsgrad) are updated in place; step is the step count minus one ---- */
ACL_FUNC_VISIBILITY aclnnStatus aclnnApplyAdamWV2GetWorkspaceSize(aclTensor *varRef, aclTensor *mRef, aclTensor *vRef,
    aclTensor *maxGradNormOptionalRef, const aclTensor *grad, const aclTensor *step, float lr, float beta1,
    float beta2, float weightDecay, float eps, bool amsgrad, bool maximize, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnApplyAdamWV2", "ApplyAdamWV2");
    nn_in(&c, grad, "grad");
    nn_in(&c, step, "step");
    nn_out(&c, varRef, "varRef");
    nn_out(&c, mRef, "mRef");
    nn_out(&c, vRef, "vRef");
    if (amsgrad) nn_out(&c, maxGradNormOptionalRef, "maxGradNormOptionalRef");
    nn_attr_float(&c, "lr", lr);
    nn_attr_float(&c, "beta1", beta1);
    nn_attr_float(&c, "beta2", beta2);
    nn_attr_float(&c, "weight_decay", weightDecay);
    nn_attr_float(&c, "eps", eps);
    nn_attr_int(&c, "amsgrad", amsgrad);
    nn_attr_int(&c, "maximize", maximize);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnApplyAdamWV2)
