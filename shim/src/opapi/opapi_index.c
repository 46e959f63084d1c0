/* aclnn data-movement and indexing operators (kernels: rt/kernels_index.c):
 * cat, stack, constant padding, triu/tril, arange, index_select, embedding
 * and its gradient, gather, scatter, index_copy, index and index_put.
 * Prototypes: the CANN aclnnop headers, in the argument order of op-plugin's
 * EXEC_NPU_CMD (op_plugin/ops/opapi/). */
#include <stdio.h>
#include <string.h>

#include "opapi/nn_call.h"

/* ---- cat, stack ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnCatGetWorkspaceSize(const aclTensorList *tensors, int64_t dim, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnCat", "ConcatD");
    nn_list(&c, tensors, "tensors", 0);
    nn_out(&c, out, "out");
    nn_attr_int(&c, "dim", dim);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnCat)

ACL_FUNC_VISIBILITY aclnnStatus aclnnStackGetWorkspaceSize(const aclTensorList *tensors, int64_t dim, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnStack", "Pack");
    nn_list(&c, tensors, "tensors", 0);
    nn_out(&c, out, "out");
    nn_attr_int(&c, "dim", dim);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnStack)

/* ---- constant padding: pad holds (before, after) pairs from the last dim ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnConstantPadNdGetWorkspaceSize(const aclTensor *self, const aclIntArray *pad,
    const aclScalar *value, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnConstantPadNd", "PadV3");
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    nn_attr_scalar(&c, "value", value, "value");
    if (!c.err && !pad) nn_fail(&c, ACLNN_ERR_PARAM_NULLPTR, "pad is NULL");
    const aclIntArray *p = c.err ? NULL : (const aclIntArray *)aclsim_nn_lookup(pad, NN_INT_ARRAY);
    if (!c.err && !p) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "pad (%p) is not a live aclIntArray", (const void *)pad);
    if (!c.err && p->n > 2 * SIM_MAX_DIMS) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "pad has %llu values", (unsigned long long)p->n);
    for (uint64_t i = 0; !c.err && i < p->n; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "pad%llu", (unsigned long long)i);
        nn_attr_int(&c, nm, p->v[i]);
    }
    if (!c.err) nn_attr_int(&c, "npad", (int64_t)p->n);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnConstantPadNd)

/* ---- flip, repeat ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnFlipGetWorkspaceSize(const aclTensor *self, const aclIntArray *dims, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnFlip", "ReverseV2");
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    if (!c.err && !dims) nn_fail(&c, ACLNN_ERR_PARAM_NULLPTR, "dims is NULL");
    const aclIntArray *d = c.err ? NULL : (const aclIntArray *)aclsim_nn_lookup(dims, NN_INT_ARRAY);
    if (!c.err && !d) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "dims is not a live aclIntArray");
    uint32_t mask = 0;
    for (uint64_t i = 0; !c.err && i < d->n; i++) {
        int nd = c.in[0].ndim;
        int64_t ax = d->v[i] < 0 ? d->v[i] + nd : d->v[i];
        if (ax < 0 || ax >= nd) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "dim %lld is out of range", (long long)d->v[i]);
        else if (mask & (1u << ax)) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "dim %lld appears twice", (long long)d->v[i]);
        else mask |= 1u << ax;
    }
    nn_attr_int(&c, "axes", mask);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnFlip)

ACL_FUNC_VISIBILITY aclnnStatus aclnnRepeatGetWorkspaceSize(const aclTensor *self, const aclIntArray *repeats,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnRepeat", "Tile");
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    if (!c.err && !repeats) nn_fail(&c, ACLNN_ERR_PARAM_NULLPTR, "repeats is NULL");
    const aclIntArray *r = c.err ? NULL : (const aclIntArray *)aclsim_nn_lookup(repeats, NN_INT_ARRAY);
    if (!c.err && (!r || r->n > SIM_MAX_DIMS)) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "repeats is not a live aclIntArray of at most 8");
    for (uint64_t i = 0; !c.err && i < r->n; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "rep%llu", (unsigned long long)i);
        nn_attr_int(&c, nm, r->v[i]);
    }
    if (!c.err) nn_attr_int(&c, "nrep", (int64_t)r->n);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnRepeat)

/* ---- triangles ---- */

#define TRIANGLE(name, inplace, op)                                                                            \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensor *self, int64_t diagonal,       \
        aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)                               \
    {                                                                                                    \
        nn_call c;                                                                                       \
        nn_begin(&c, #name, op);                                                                         \
        nn_in(&c, self, "self");                                                                         \
        nn_out(&c, out, "out");                                                                          \
        nn_attr_int(&c, "diagonal", diagonal);                                                           \
        return nn_finish(&c, workspaceSize, executor);                                                   \
    }                                                                                                    \
    NN_LAUNCHER(name)                                                                                    \
    ACL_FUNC_VISIBILITY aclnnStatus inplace##GetWorkspaceSize(aclTensor *selfRef, int64_t diagonal,      \
        uint64_t *workspaceSize, aclOpExecutor **executor)                                               \
    {                                                                                                    \
        nn_call c;                                                                                       \
        nn_begin(&c, #inplace, op);                                                                      \
        nn_in(&c, selfRef, "selfRef");                                                                   \
        nn_out(&c, selfRef, "selfRef");                                                                  \
        nn_attr_int(&c, "diagonal", diagonal);                                                           \
        return nn_finish(&c, workspaceSize, executor);                                                   \
    }                                                                                                    \
    NN_LAUNCHER(inplace)

TRIANGLE(aclnnTriu, aclnnInplaceTriu, "Triu")
TRIANGLE(aclnnTril, aclnnInplaceTril, "Tril")

/* ---- arange: out[k] = start + k * step ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnArangeGetWorkspaceSize(const aclScalar *start, const aclScalar *end,
    const aclScalar *step, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnArange", "Range");
    nn_out(&c, out, "out");
    nn_attr_scalar(&c, "start", start, "start");
    nn_attr_scalar(&c, "end", end, "end");
    nn_attr_scalar(&c, "step", step, "step");
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnArange)

/* ---- gathers ---- */

static aclnnStatus nn_gatherv2(const char *api, const aclTensor *self, int64_t dim, const aclTensor *index,
    const aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, "GatherV2");
    nn_in(&c, self, "self");
    nn_in(&c, index, "index");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "axis", dim);
    return nn_finish(&c, workspaceSize, executor);
}

/* out = self.index_select(dim, index) (index 1-D) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnIndexSelectGetWorkspaceSize(const aclTensor *self, int64_t dim,
    const aclTensor *index, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_gatherv2("aclnnIndexSelect", self, dim, index, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnIndexSelect)

/* out = weight[indices] (rows) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnEmbeddingGetWorkspaceSize(const aclTensor *weight, const aclTensor *indices,
    const aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_gatherv2("aclnnEmbedding", weight, 0, indices, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnEmbedding)

/* out[num_weights, D] = per-index sums of grad's rows */
ACL_FUNC_VISIBILITY aclnnStatus aclnnEmbeddingDenseBackwardGetWorkspaceSize(const aclTensor *grad,
    const aclTensor *sortIndices, uint64_t numWeights, uint64_t paddingIdx, bool scaleGradByFreq, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnEmbeddingDenseBackward", "EmbeddingDenseGrad");
    nn_in(&c, grad, "grad");
    nn_in(&c, sortIndices, "sortIndices");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "num_weights", (int64_t)numWeights);
    nn_attr_int(&c, "padding_idx", (int64_t)paddingIdx);
    nn_attr_int(&c, "scale_grad_by_freq", scaleGradByFreq);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnEmbeddingDenseBackward)

/* out = torch.gather(self, dim, index) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnGatherGetWorkspaceSize(const aclTensor *self, int64_t dim, const aclTensor *index,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnGather", "GatherElements");
    nn_in(&c, self, "self");
    nn_in(&c, index, "index");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "dim", dim);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnGather)

/* ---- scatters: reduce 0 none, 1 add, 2 multiply ---- */

static aclnnStatus nn_scatter(const char *api, const aclTensor *self, int64_t dim, const aclTensor *index,
    const aclTensor *src, const aclScalar *value, int64_t reduce, const aclTensor *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, "ScatterElements");
    nn_in(&c, self, "self");
    nn_in(&c, index, "index");
    if (value) nn_attr_scalar(&c, "value", value, "value");
    else nn_in(&c, src, "src");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "dim", dim);
    nn_attr_int(&c, "reduce", reduce);
    return nn_finish(&c, workspaceSize, executor);
}

ACL_FUNC_VISIBILITY aclnnStatus aclnnScatterGetWorkspaceSize(const aclTensor *self, int64_t dim, const aclTensor *index,
    const aclTensor *src, int64_t reduce, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scatter("aclnnScatter", self, dim, index, src, NULL, reduce, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnScatter)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceScatterGetWorkspaceSize(aclTensor *selfRef, int64_t dim,
    const aclTensor *index, const aclTensor *src, int64_t reduce, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scatter("aclnnInplaceScatter", selfRef, dim, index, src, NULL, reduce, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceScatter)

ACL_FUNC_VISIBILITY aclnnStatus aclnnScatterValueGetWorkspaceSize(const aclTensor *self, int64_t dim,
    const aclTensor *index, const aclScalar *value, int64_t reduce, aclTensor *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    if (!value) return nn_null("aclnnScatterValue", "value");
    return nn_scatter("aclnnScatterValue", self, dim, index, NULL, value, reduce, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnScatterValue)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceScatterValueGetWorkspaceSize(aclTensor *selfRef, int64_t dim,
    const aclTensor *index, const aclScalar *value, int64_t reduce, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!value) return nn_null("aclnnInplaceScatterValue", "value");
    return nn_scatter("aclnnInplaceScatterValue", selfRef, dim, index, NULL, value, reduce, selfRef, workspaceSize,
        executor);
}
NN_LAUNCHER(aclnnInplaceScatterValue)

ACL_FUNC_VISIBILITY aclnnStatus aclnnScatterAddGetWorkspaceSize(const aclTensor *self, int64_t dim,
    const aclTensor *index, const aclTensor *src, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scatter("aclnnScatterAdd", self, dim, index, src, NULL, 1, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnScatterAdd)

/* ---- index_copy: out = self with out.select(dim, index[k]) = source.select(dim, k) ---- */

static aclnnStatus nn_index_copy(const char *api, const aclTensor *selfRef, int64_t dim, const aclTensor *index,
    const aclTensor *source, const aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, "IndexCopy");
    nn_in(&c, selfRef, "selfRef");
    nn_in(&c, index, "index");
    nn_in(&c, source, "source");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "dim", dim);
    return nn_finish(&c, workspaceSize, executor);
}

ACL_FUNC_VISIBILITY aclnnStatus aclnnIndexCopyGetWorkspaceSize(aclTensor *selfRef, int64_t dim, const aclTensor *index,
    const aclTensor *source, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_index_copy("aclnnIndexCopy", selfRef, dim, index, source, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnIndexCopy)

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceIndexCopyGetWorkspaceSize(aclTensor *selfRef, int64_t dim,
    const aclTensor *index, const aclTensor *source, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_index_copy("aclnnInplaceIndexCopy", selfRef, dim, index, source, selfRef, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceIndexCopy)

/* ---- advanced indexing ---- */

/* Adds the index tensors of `indices` (op-plugin passes an empty tensor for
 * a dimension that is not indexed) and sets attribute "present". */
static void nn_indices(nn_call *c, const aclTensorList *indices)
{
    if (c->err) return;
    if (!indices) { nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "indices is NULL"); return; }
    const aclTensorList *l = (const aclTensorList *)aclsim_nn_lookup(indices, NN_TENSOR_LIST);
    if (!l) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "indices (%p) is not a live aclTensorList", (const void *)indices); return; }
    if (l->n > SIM_MAX_DIMS) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "indices has %llu entries", (unsigned long long)l->n); return; }
    uint32_t present = 0;
    for (uint64_t k = 0; k < l->n; k++) {
        const aclTensor *t = l->v[k] ? (const aclTensor *)aclsim_nn_lookup(l->v[k], NN_TENSOR) : NULL;
        if (!t) continue;                     /* NULL: not indexed */
        uint64_t n = 1;
        for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->dims[i];
        if (n == 0) continue;                 /* op-plugin's placeholder */
        char nm[40];
        snprintf(nm, sizeof nm, "indices[%llu]", (unsigned long long)k);
        nn_in(c, l->v[k], nm);
        present |= 1u << k;
    }
    if (!c->err && !present) nn_fail(c, ACLNN_ERR_PARAM_INVALID, "indices holds no index tensor");
    nn_attr_int(c, "present", present);
}

/* out = self[indices] */
ACL_FUNC_VISIBILITY aclnnStatus aclnnIndexGetWorkspaceSize(const aclTensor *self, const aclTensorList *indices,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnIndex", "Index");
    nn_in(&c, self, "self");
    nn_indices(&c, indices);
    nn_out(&c, out, "out");
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnIndex)

/* selfRef[indices] = values (+= with accumulate) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnIndexPutImplGetWorkspaceSize(aclTensor *selfRef, const aclTensorList *indices,
    const aclTensor *values, const bool accumulate, const bool unsafe, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnIndexPutImpl", "IndexPut");
    nn_in(&c, selfRef, "selfRef");
    nn_in(&c, values, "values");
    nn_indices(&c, indices);
    nn_out(&c, selfRef, "selfRef");
    nn_attr_int(&c, "accumulate", accumulate);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnIndexPutImpl)
