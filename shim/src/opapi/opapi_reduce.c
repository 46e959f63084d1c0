/* aclnn reductions, ordering and sampling (kernels: rt/kernels_reduce.c):
 * max/min, amax/amin, max/min along a dim, argmax/argmin, any/all, cumsum,
 * vector norms (linalg_vector_norm, the foreach norm of gradient
 * clipping), topk, sort and multinomial. Prototypes: the CANN aclnnop
 * headers, in the argument order of op-plugin's EXEC_NPU_CMD. */
#include <stdio.h>

#include "opapi/nn_call.h"

/* The "axes" bitmask attribute of a dim list for a rank-nd input (an empty
 * or NULL list: every dimension). */
static void nn_axes(nn_call *c, const aclIntArray *dim, int nd, int required)
{
    if (c->err) return;
    if (!dim) {
        if (required) nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "dim is NULL");
        else nn_attr_int(c, "axes", 0);
        return;
    }
    const aclIntArray *d = (const aclIntArray *)aclsim_nn_lookup(dim, NN_INT_ARRAY);
    if (!d) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "dim (%p) is not a live aclIntArray", (const void *)dim); return; }
    uint32_t mask = 0;
    for (uint64_t i = 0; i < d->n; i++) {
        int64_t ax = d->v[i] < 0 ? d->v[i] + nd : d->v[i];
        if (ax < 0 || ax >= (nd ? nd : 1)) {
            nn_fail(c, ACLNN_ERR_PARAM_INVALID, "dim %lld is out of range for rank %d", (long long)d->v[i], nd);
            return;
        }
        if (nd) mask |= 1u << ax;
    }
    nn_attr_int(c, "axes", mask);
}

/* ---- max / min ---- */

#define REDUCE_ALL(name, op)                                                                             \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensor *self, aclTensor *out,         \
        uint64_t *workspaceSize, aclOpExecutor **executor)                                               \
    {                                                                                                    \
        nn_call c;                                                                                       \
        nn_begin(&c, #name, op);                                                                         \
        nn_in(&c, self, "self");                                                                         \
        nn_out(&c, out, "out");                                                                          \
        nn_attr_int(&c, "axes", 0);                                                                      \
        return nn_finish(&c, workspaceSize, executor);                                                   \
    }                                                                                                    \
    NN_LAUNCHER(name)

REDUCE_ALL(aclnnMax, "ReduceMax")
REDUCE_ALL(aclnnMin, "ReduceMin")

#define REDUCE_DIMS(name, op)                                                                            \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensor *self, const aclIntArray *dim, \
        bool keepDim, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)                 \
    {                                                                                                    \
        nn_call c;                                                                                       \
        nn_begin(&c, #name, op);                                                                         \
        nn_in(&c, self, "self");                                                                         \
        nn_out(&c, out, "out");                                                                          \
        nn_axes(&c, dim, c.err ? 0 : c.in[0].ndim, 0);                                                  \
        nn_attr_int(&c, "keep_dims", keepDim);                                                           \
        return nn_finish(&c, workspaceSize, executor);                                                   \
    }                                                                                                    \
    NN_LAUNCHER(name)

REDUCE_DIMS(aclnnAmax, "ReduceMax")
REDUCE_DIMS(aclnnAmin, "ReduceMin")
REDUCE_DIMS(aclnnAny, "ReduceAny")
REDUCE_DIMS(aclnnAll, "ReduceAll")

/* values and indices along dim */
#define REDUCE_DIM_INDEX(name, op)                                                                       \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensor *self, int64_t dim, bool keepdim, \
        aclTensor *out, aclTensor *indices, uint64_t *workspaceSize, aclOpExecutor **executor)           \
    {                                                                                                    \
        nn_call c;                                                                                       \
        nn_begin(&c, #name, op);                                                                         \
        nn_in(&c, self, "self");                                                                         \
        nn_out(&c, out, "out");                                                                          \
        nn_out(&c, indices, "indices");                                                                  \
        nn_attr_int(&c, "dim", dim);                                                                     \
        nn_attr_int(&c, "keep_dims", keepdim);                                                           \
        return nn_finish(&c, workspaceSize, executor);                                                   \
    }                                                                                                    \
    NN_LAUNCHER(name)

REDUCE_DIM_INDEX(aclnnMaxDim, "MaxDim")
REDUCE_DIM_INDEX(aclnnMinDim, "MinDim")

#define ARG_REDUCE(name, op)                                                                             \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensor *self, int64_t dim, bool keepdim, \
        aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)                               \
    {                                                                                                    \
        nn_call c;                                                                                       \
        nn_begin(&c, #name, op);                                                                         \
        nn_in(&c, self, "self");                                                                         \
        nn_out(&c, out, "out");                                                                          \
        nn_attr_int(&c, "dim", dim);                                                                     \
        nn_attr_int(&c, "keep_dims", keepdim);                                                           \
        return nn_finish(&c, workspaceSize, executor);                                                   \
    }                                                                                                    \
    NN_LAUNCHER(name)

ARG_REDUCE(aclnnArgMax, "ArgMax")
ARG_REDUCE(aclnnArgMin, "ArgMin")

/* ---- cumsum: out (of type dtype) = running sums of self along dim ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnCumsumGetWorkspaceSize(const aclTensor *self, int64_t dim, aclDataType dtype,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnCumsum", "Cumsum");
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "dim", dim);
    if (!c.err && c.out[0].dtype != (int)dtype)
        nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "dtype %d differs from out's data type %d", (int)dtype, c.out[0].dtype);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnCumsum)

/* ---- norms ---- */

static aclnnStatus nn_norm(const char *api, const aclTensor *self, const aclScalar *ord, const aclIntArray *dims,
    bool keepDim, int check_dtype, aclDataType dtype, const aclTensor *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, "LpNorm");
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    nn_attr_float(&c, "p", nn_scalar_float(&c, ord, "ord"));
    nn_axes(&c, dims, c.err ? 0 : c.in[0].ndim, 0);
    nn_attr_int(&c, "keep_dims", keepDim);
    if (!c.err && check_dtype && c.out[0].dtype != (int)dtype)
        nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "dtype %d differs from out's data type %d", (int)dtype, c.out[0].dtype);
    return nn_finish(&c, workspaceSize, executor);
}

ACL_FUNC_VISIBILITY aclnnStatus aclnnLinalgVectorNormGetWorkspaceSize(const aclTensor *self, const aclScalar *ord,
    const aclIntArray *dims, bool keepDim, aclDataType dtype, aclTensor *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    return nn_norm("aclnnLinalgVectorNorm", self, ord, dims, keepDim, 1, dtype, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnLinalgVectorNorm)

/* out[i] = the p-norm of x[i] (torch._foreach_norm) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnForeachNormGetWorkspaceSize(const aclTensorList *x, const aclScalar *scalar,
    aclTensorList *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnForeachNorm", "ForeachNorm");
    int64_t n = nn_list(&c, x, "x", 0);
    if (nn_list(&c, out, "out", 1) != n && !c.err) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "x and out differ in length");
    nn_attr_float(&c, "p", nn_scalar_float(&c, scalar, "scalar"));
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnForeachNorm)

/* ---- ordering ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnTopkGetWorkspaceSize(const aclTensor *self, int64_t k, int64_t dim, bool largest,
    bool sorted, aclTensor *valuesOut, aclTensor *indicesOut, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnTopk", "TopK");
    nn_in(&c, self, "self");
    nn_out(&c, valuesOut, "valuesOut");
    nn_out(&c, indicesOut, "indicesOut");
    nn_attr_int(&c, "k", k);
    nn_attr_int(&c, "dim", dim);
    nn_attr_int(&c, "largest", largest);
    nn_attr_int(&c, "sorted", sorted);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnTopk)

ACL_FUNC_VISIBILITY aclnnStatus aclnnSortGetWorkspaceSize(const aclTensor *self, bool stable, int64_t dim,
    bool descending, aclTensor *valuesOut, aclTensor *indicesOut, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnSort", "Sort");
    nn_in(&c, self, "self");
    nn_out(&c, valuesOut, "valuesOut");
    nn_out(&c, indicesOut, "indicesOut");
    nn_attr_int(&c, "dim", dim);
    nn_attr_int(&c, "descending", descending);
    nn_attr_int(&c, "stable", stable);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnSort)

/* ---- sampling: seed and offset are torch_npu's generator state ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnMultinomialGetWorkspaceSize(const aclTensor *self, int64_t numsamples,
    bool replacement, int64_t seed, int64_t offset, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnMultinomial", "Multinomial");
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "num_samples", numsamples);
    nn_attr_int(&c, "replacement", replacement);
    nn_attr_int(&c, "seed", seed);
    nn_attr_int(&c, "offset", offset);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnMultinomial)
