/* libopapi.so stand-in: aclnn operators.
 *
 * Every operator is two-phase. aclnnXxxGetWorkspaceSize validates its
 * arguments, snapshots the tensors (as sim_tensor views) into a new executor
 * and reports a workspace of 0 bytes; aclnnXxx launches the executor through
 * the core (aclsim_launch_op) and frees it. Adding an operator is one small
 * GetWorkspaceSize function built from the nn_call helpers (nn_call.h) plus one
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
 * The op type must be one the core's kernels know (rt/kernels*.c), or the
 * operator is refused (561003). Conventions: docs/simulator-ops.md.
 * The LLM operators are in opapi_math.c, opapi_index.c, opapi_reduce.c and
 * opapi_llm.c. */
#include <stdlib.h>
#include <string.h>

#include "opapi/nn_call.h"

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

/* x1 - alpha * x2 (torch._foreach_sub of two lists) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnForeachSubListV2GetWorkspaceSize(const aclTensorList *x1,
    const aclTensorList *x2, const aclScalar *alpha, aclTensorList *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    if (!alpha) return nn_null("aclnnForeachSubListV2", "alpha");
    return nn_foreach("aclnnForeachSubListV2", "ForeachSubList", x1, x2, NULL, alpha, NULL, NULL, out, workspaceSize,
        executor);
}
NN_LAUNCHER(aclnnForeachSubListV2)

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
    /* ScalarList: a device tensor with one scalar per list element (as   \
     * op-plugin's ForeachAddcdivTensor/AddcmulTensor pass it) */         \
    ACL_FUNC_VISIBILITY aclnnStatus name##ListGetWorkspaceSize(const aclTensorList *x1,                        \
        const aclTensorList *x2, const aclTensorList *x3, const aclTensor *scalars, aclTensorList *out,      \
        uint64_t *workspaceSize, aclOpExecutor **executor)                                                   \
    {                                                                                                         \
        if (!scalars) return nn_null(#name "List", "scalars"); \
        return nn_foreach(#name "List", op, x1, x2, x3, NULL, NULL, scalars, out, workspaceSize, executor);    \
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
