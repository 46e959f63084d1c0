/* The nn_call helpers of libopapi (nn_call.h): argument collection,
 * validation, executors and the launch. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opapi/nn_call.h"
#include "rt/kernels.h"

void nn_begin(nn_call *c, const char *api, const char *op_type)
{
    c->api = api;
    c->op_type = op_type;
    c->err = ACLNN_SUCCESS;
    c->nin = c->nout = c->nattrs = 0;
}

void nn_fail(nn_call *c, aclnnStatus st, const char *fmt, ...)
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
void nn_view(nn_call *c, const aclTensor *h, const char *name, sim_tensor *v)
{
    memset(v, 0, sizeof *v);
    if (c->err) return;
    if (!h) { nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", name); return; }
    const aclTensor *t = (const aclTensor *)aclsim_nn_lookup(h, NN_TENSOR);
    if (!t) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s (%p) is not a live aclTensor", name, (const void *)h); return; }
    /* an empty view needs no data (frameworks pass empty tensors without
     * storage; the real operators accept them and compute nothing) */
    int64_t elems_view = 1;
    for (int i = 0; i < t->ndim; i++) elems_view *= t->dims[i];
    if (!t->data && elems_view != 0) { nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "%s has no device data (NULL)", name); return; }
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
    v->bytes = elems_view ? (size_t)bytes : 0;   /* an empty view touches nothing */
    v->data = (char *)t->data + t->offset * (int64_t)es;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    memcpy(v->dims, t->dims, sizeof v->dims);
    memcpy(v->strides, t->strides, sizeof v->strides);
    /* the view's geometry against its footprint is checked by aclsim_op_check */
}

void nn_in_view(nn_call *c, const sim_tensor *v)
{
    if (c->err) return;
    if (c->nin == NN_MAX_TENSORS) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "too many inputs"); return; }
    c->in[c->nin++] = *v;
}

void nn_out_view(nn_call *c, const sim_tensor *v)
{
    if (c->err) return;
    if (c->nout == NN_MAX_TENSORS) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "too many outputs"); return; }
    c->out[c->nout++] = *v;
}

void nn_in(nn_call *c, const aclTensor *t, const char *name)
{
    sim_tensor v;
    nn_view(c, t, name, &v);
    nn_in_view(c, &v);
}

void nn_out(nn_call *c, const aclTensor *t, const char *name)
{
    sim_tensor v;
    nn_view(c, t, name, &v);
    nn_out_view(c, &v);
}

sim_attr *nn_attr(nn_call *c, const char *name, int type)
{
    if (c->err) return NULL;
    if (c->nattrs == NN_MAX_ATTRS) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "too many attributes"); return NULL; }
    sim_attr *a = &c->attrs[c->nattrs++];
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", name);
    a->type = type;
    return a;
}

void nn_attr_int(nn_call *c, const char *name, int64_t v)
{
    sim_attr *a = nn_attr(c, name, SIM_ATTR_INT);
    if (a) a->i = v;
}

void nn_attr_float(nn_call *c, const char *name, float v)
{
    sim_attr *a = nn_attr(c, name, SIM_ATTR_FLOAT);
    if (a) a->f = v;
}

/* Value of a host scalar as float (any numeric type). */
float nn_scalar_float(nn_call *c, const aclScalar *h, const char *name)
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
void nn_attr_scalar(nn_call *c, const char *attr, const aclScalar *h, const char *name)
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


/* Validation errors of the core (shape, dtype, counts) are argument errors:
 * 161002, what every aclnn page documents for a data type or shape outside
 * the operator's range. An operator without a kernel is 561003. */
aclnnStatus nn_status(aclError e)
{
    if (e == ACL_ERROR_INVALID_PARAM || e == ACL_ERROR_OP_INPUT_NOT_MATCH || e == ACL_ERROR_OP_OUTPUT_NOT_MATCH ||
        e == ACL_ERROR_OP_ATTR_NOT_MATCH || e == ACL_ERROR_UNSUPPORTED_DATA_TYPE)
        return ACLNN_ERR_PARAM_INVALID;
    if (e == ACL_ERROR_OP_NOT_FOUND) return NN_ERR_FIND_KERNEL;
    return e;
}

aclnnStatus nn_finish(nn_call *c, uint64_t *workspaceSize, aclOpExecutor **executor)
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

/* ACLSIM_WRITES_LOG=FILE: one line per aclnn launch, the API and the byte
 * extent [lo, hi) of every output view the kernel may write (what an
 * interposer must treat as written: tests/aclnn_roles.rs checks u3m's
 * operator roles against it). Empty outputs are left out. */
static void nn_log_writes(const aclOpExecutor *ex)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static FILE *f;
    static int state;   /* 0: not looked at, 1: off, 2: on */
    pthread_mutex_lock(&lock);
    if (state == 0) {
        const char *v = getenv("ACLSIM_WRITES_LOG");
        f = v && *v ? fopen(v, "a") : NULL;
        state = f ? 2 : 1;
    }
    if (state == 2) {
        fprintf(f, "%s", ex->api);
        for (int j = 0; j < ex->nout; j++) {
            const sim_tensor *t = &ex->t[ex->nin + j];
            int64_t lo = 0, hi = 0;
            int empty = 0;
            for (int k = 0; k < t->ndim; k++) {
                if (t->dims[k] <= 0) empty = 1;
                int64_t span = (t->dims[k] - 1) * t->strides[k];
                if (span < 0) lo += span; else hi += span;
            }
            if (empty) continue;
            int64_t es = (int64_t)kern_dtype_size(t->dtype);
            uintptr_t d = (uintptr_t)t->data;
            fprintf(f, " %llx:%llx", (unsigned long long)(d + (uintptr_t)(lo * es)),
                (unsigned long long)(d + (uintptr_t)((hi + 1) * es)));
        }
        fprintf(f, "\n");
        fflush(f);
    }
    pthread_mutex_unlock(&lock);
}

/* Second phase: runs and consumes the executor. A NULL, destroyed or already
 * launched executor is ACLNN_ERR_PARAM_INVALID; runtime failures (not ready,
 * bad stream, injected op fault, lost device) return the runtime's code. */
aclnnStatus nn_launch(const char *api, void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
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
    nn_log_writes(ex);
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


/* Binary tensor-tensor op; with_alpha: the required alpha scalar scales other. */
aclnnStatus nn_binary(const char *api, const char *op, const aclTensor *self, const aclTensor *other,
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
aclnnStatus nn_scalar_op(const char *api, const char *op, const aclTensor *self, const aclScalar *value,
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
aclnnStatus nn_unary(const char *api, const char *op, const aclTensor *self, const aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, op);
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    return nn_finish(&c, workspaceSize, executor);
}

/* A required pointer argument is NULL. */
aclnnStatus nn_null(const char *api, const char *what)
{
    nn_call c;
    nn_begin(&c, api, "");
    nn_fail(&c, ACLNN_ERR_PARAM_NULLPTR, "%s is NULL", what);
    return c.err;
}

/* Adds every tensor of a list as an input (or output); returns its length,
 * or -1 after recording the error. */
int64_t nn_list(nn_call *c, const aclTensorList *h, const char *name, int as_out)
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

