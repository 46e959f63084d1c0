/* aclnn elementwise operators of LLM workloads (kernels: rt/kernels_math.c,
 * rt/kernels_nn.c): activations and their gradients, comparisons, logical
 * and bitwise operators, powers, remainders, where, masked fill, clamps,
 * reversed subtraction. Prototypes: the CANN aclnnop headers, in the
 * argument order op-plugin's EXEC_NPU_CMD passes (op_plugin/ops/opapi/). */
#include <string.h>

#include "opapi/nn_call.h"

/* ---- unary functions: out = f(self), and the in-place forms ---- */

#define UNARY(name, op)                                                                                  \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensor *self, aclTensor *out,         \
        uint64_t *workspaceSize, aclOpExecutor **executor)                                              \
    {                                                                                                    \
        return nn_unary(#name, op, self, out, workspaceSize, executor);                                  \
    }                                                                                                    \
    NN_LAUNCHER(name)

#define UNARY_INPLACE(name, op)                                                                          \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(aclTensor *selfRef, uint64_t *workspaceSize,   \
        aclOpExecutor **executor)                                                                        \
    {                                                                                                    \
        return nn_unary(#name, op, selfRef, selfRef, workspaceSize, executor);                           \
    }                                                                                                    \
    NN_LAUNCHER(name)

UNARY(aclnnSin, "Sin")
UNARY_INPLACE(aclnnInplaceSin, "Sin")
UNARY(aclnnCos, "Cos")
UNARY_INPLACE(aclnnInplaceCos, "Cos")
UNARY(aclnnTanh, "Tanh")
UNARY_INPLACE(aclnnInplaceTanh, "Tanh")
UNARY(aclnnSigmoid, "Sigmoid")
UNARY_INPLACE(aclnnInplaceSigmoid, "Sigmoid")
UNARY(aclnnSilu, "Silu")
UNARY(aclnnErf, "Erf")
UNARY_INPLACE(aclnnInplaceErf, "Erf")
UNARY(aclnnLog, "Log")
UNARY_INPLACE(aclnnInplaceLog, "Log")
UNARY(aclnnLog1p, "Log1p")
UNARY(aclnnExpm1, "Expm1")
UNARY(aclnnAbs, "Abs")
UNARY(aclnnReciprocal, "Reciprocal")
UNARY_INPLACE(aclnnInplaceReciprocal, "Reciprocal")
UNARY(aclnnRsqrt, "Rsqrt")
UNARY_INPLACE(aclnnInplaceRsqrt, "Rsqrt")
UNARY_INPLACE(aclnnInplaceSqrt, "Sqrt")
UNARY_INPLACE(aclnnInplaceExp, "Exp")
UNARY(aclnnRound, "Round")
UNARY(aclnnFloor, "Floor")
UNARY_INPLACE(aclnnInplaceFloor, "Floor")
UNARY(aclnnCeil, "Ceil")
UNARY_INPLACE(aclnnInplaceCeil, "Ceil")
UNARY(aclnnTrunc, "Trunc")
UNARY(aclnnSign, "Sign")
UNARY(aclnnLogicalNot, "LogicalNot")
UNARY_INPLACE(aclnnInplaceLogicalNot, "LogicalNot")
UNARY(aclnnBitwiseNot, "BitwiseNot")

/* ---- activation gradients: gradInput = gradOutput * f'(...) ---- */

#define GRAD2(name, op, second)                                                                          \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensor *gradOutput,                  \
        const aclTensor *second, aclTensor *gradInput, uint64_t *workspaceSize, aclOpExecutor **executor) \
    {                                                                                                    \
        nn_call c;                                                                                       \
        nn_begin(&c, #name, op);                                                                         \
        nn_in(&c, gradOutput, "gradOutput");                                                             \
        nn_in(&c, second, #second);                                                                      \
        nn_out(&c, gradInput, "gradInput");                                                              \
        return nn_finish(&c, workspaceSize, executor);                                                   \
    }                                                                                                    \
    NN_LAUNCHER(name)

GRAD2(aclnnSiluBackward, "SiluGrad", self)
GRAD2(aclnnTanhBackward, "TanhGrad", output)
GRAD2(aclnnSigmoidBackward, "SigmoidGrad", output)

/* GELU with approximate 0 (none: erf) or 1 (tanh) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnGeluV2GetWorkspaceSize(const aclTensor *self, int64_t approximate,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnGeluV2", approximate == 1 ? "GeluTanh" : "Gelu");
    nn_in(&c, self, "self");
    nn_out(&c, out, "out");
    if (!c.err && approximate != 0 && approximate != 1)
        nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "approximate=%lld is not 0 (none) or 1 (tanh)", (long long)approximate);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnGeluV2)

/* approximate: "none" or "tanh" (a C string, as op-plugin passes it) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnGeluBackwardV2GetWorkspaceSize(const aclTensor *gradOutput,
    const aclTensor *self, char *approximate, aclTensor *gradInput, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    nn_call c;
    int tanh_mode = approximate && !strcmp(approximate, "tanh");
    nn_begin(&c, "aclnnGeluBackwardV2", tanh_mode ? "GeluTanhGrad" : "GeluGrad");
    nn_in(&c, gradOutput, "gradOutput");
    nn_in(&c, self, "self");
    nn_out(&c, gradInput, "gradInput");
    if (!c.err && !approximate) nn_fail(&c, ACLNN_ERR_PARAM_NULLPTR, "approximate is NULL");
    if (!c.err && !tanh_mode && strcmp(approximate, "none"))
        nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "approximate '%s' is not 'none' or 'tanh'", approximate);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnGeluBackwardV2)

/* ---- comparisons: out = self op other (tensor or scalar) ---- */

#define COMPARE(base, op)                                                                                \
    ACL_FUNC_VISIBILITY aclnnStatus base##TensorGetWorkspaceSize(const aclTensor *self,                   \
        const aclTensor *other, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)       \
    {                                                                                                    \
        return nn_binary(#base "Tensor", op, self, other, 0, NULL, out, workspaceSize, executor);        \
    }                                                                                                    \
    NN_LAUNCHER(base##Tensor)                                                                            \
    ACL_FUNC_VISIBILITY aclnnStatus base##ScalarGetWorkspaceSize(const aclTensor *self,                   \
        const aclScalar *other, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)       \
    {                                                                                                    \
        return nn_scalar_op(#base "Scalar", op, self, other, NULL, out, workspaceSize, executor);         \
    }                                                                                                    \
    NN_LAUNCHER(base##Scalar)

COMPARE(aclnnEq, "Equal")
COMPARE(aclnnNe, "NotEqual")
COMPARE(aclnnLt, "Less")
COMPARE(aclnnLe, "LessEqual")
COMPARE(aclnnGt, "Greater")
COMPARE(aclnnGe, "GreaterEqual")

/* the in-place forms are named aclnnInplaceEqTensor etc. */
#define COMPARE_INPLACE(name, op)                                                                        \
    ACL_FUNC_VISIBILITY aclnnStatus name##TensorGetWorkspaceSize(aclTensor *selfRef, const aclTensor *other, \
        uint64_t *workspaceSize, aclOpExecutor **executor)                                               \
    {                                                                                                    \
        return nn_binary(#name "Tensor", op, selfRef, other, 0, NULL, selfRef, workspaceSize, executor); \
    }                                                                                                    \
    NN_LAUNCHER(name##Tensor)                                                                            \
    ACL_FUNC_VISIBILITY aclnnStatus name##ScalarGetWorkspaceSize(aclTensor *selfRef, const aclScalar *other, \
        uint64_t *workspaceSize, aclOpExecutor **executor)                                               \
    {                                                                                                    \
        return nn_scalar_op(#name "Scalar", op, selfRef, other, NULL, selfRef, workspaceSize, executor);  \
    }                                                                                                    \
    NN_LAUNCHER(name##Scalar)

COMPARE_INPLACE(aclnnInplaceEq, "Equal")
COMPARE_INPLACE(aclnnInplaceNe, "NotEqual")
COMPARE_INPLACE(aclnnInplaceLt, "Less")
COMPARE_INPLACE(aclnnInplaceLe, "LessEqual")
COMPARE_INPLACE(aclnnInplaceGt, "Greater")
COMPARE_INPLACE(aclnnInplaceGe, "GreaterEqual")

/* ---- logical and bitwise ---- */

#define BINARY(name, op)                                                                                 \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensor *self, const aclTensor *other, \
        aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)                               \
    {                                                                                                    \
        return nn_binary(#name, op, self, other, 0, NULL, out, workspaceSize, executor);                 \
    }                                                                                                    \
    NN_LAUNCHER(name)

#define BINARY_SCALAR(name, op)                                                                          \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(const aclTensor *self, const aclScalar *other, \
        aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)                               \
    {                                                                                                    \
        return nn_scalar_op(#name, op, self, other, NULL, out, workspaceSize, executor);                 \
    }                                                                                                    \
    NN_LAUNCHER(name)

#define BINARY_INPLACE(name, op)                                                                         \
    ACL_FUNC_VISIBILITY aclnnStatus name##GetWorkspaceSize(aclTensor *selfRef, const aclTensor *other,    \
        uint64_t *workspaceSize, aclOpExecutor **executor)                                               \
    {                                                                                                    \
        return nn_binary(#name, op, selfRef, other, 0, NULL, selfRef, workspaceSize, executor);          \
    }                                                                                                    \
    NN_LAUNCHER(name)

BINARY(aclnnLogicalAnd, "LogicalAnd")
BINARY_INPLACE(aclnnInplaceLogicalAnd, "LogicalAnd")
BINARY(aclnnLogicalOr, "LogicalOr")
BINARY_INPLACE(aclnnInplaceLogicalOr, "LogicalOr")
BINARY(aclnnLogicalXor, "LogicalXor")
BINARY(aclnnBitwiseAndTensor, "BitwiseAnd")
BINARY_SCALAR(aclnnBitwiseAndScalar, "BitwiseAnd")
BINARY(aclnnBitwiseOrTensor, "BitwiseOr")
BINARY_SCALAR(aclnnBitwiseOrScalar, "BitwiseOr")
BINARY(aclnnBitwiseXorTensor, "BitwiseXor")
BINARY_SCALAR(aclnnBitwiseXorScalar, "BitwiseXor")

/* ---- powers, remainders ---- */

BINARY_SCALAR(aclnnPowTensorScalar, "Pow")
BINARY(aclnnPowTensorTensor, "Pow")
BINARY_INPLACE(aclnnInplacePowTensorTensor, "Pow")
BINARY_SCALAR(aclnnRemainderTensorScalar, "Remainder")
BINARY(aclnnRemainderTensorTensor, "Remainder")
BINARY_INPLACE(aclnnInplaceRemainderTensorTensor, "Remainder")
BINARY(aclnnFloorDivide, "FloorDiv")
BINARY_SCALAR(aclnnFloorDivides, "FloorDiv")

ACL_FUNC_VISIBILITY aclnnStatus aclnnInplacePowTensorScalarGetWorkspaceSize(aclTensor *selfRef,
    const aclScalar *exponent, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scalar_op("aclnnInplacePowTensorScalar", "Pow", selfRef, exponent, NULL, selfRef, workspaceSize,
        executor);
}
NN_LAUNCHER(aclnnInplacePowTensorScalar)

/* out = self ** exponent with a scalar base */
ACL_FUNC_VISIBILITY aclnnStatus aclnnPowScalarTensorGetWorkspaceSize(const aclScalar *self, const aclTensor *exponent,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_scalar_op("aclnnPowScalarTensor", "PowScalarTensor", exponent, self, NULL, out, workspaceSize,
        executor);
}
NN_LAUNCHER(aclnnPowScalarTensor)

/* ---- reversed subtraction: out = other - alpha * self ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnRsubsGetWorkspaceSize(const aclTensor *self, const aclScalar *other,
    const aclScalar *alpha, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!alpha) return nn_null("aclnnRsubs", "alpha");
    return nn_scalar_op("aclnnRsubs", "Rsubs", self, other, alpha, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnRsubs)

/* Sub computes x1 - alpha * x2: the operands swapped */
ACL_FUNC_VISIBILITY aclnnStatus aclnnRsubGetWorkspaceSize(const aclTensor *self, const aclTensor *other,
    const aclScalar *alpha, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_binary("aclnnRsub", "Sub", other, self, 1, alpha, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnRsub)

/* ---- selection ---- */

/* out = condition ? self : other (broadcasting) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnSWhereGetWorkspaceSize(const aclTensor *condition, const aclTensor *self,
    const aclTensor *other, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnSWhere", "SelectV2");
    nn_in(&c, condition, "condition");
    nn_in(&c, self, "self");
    nn_in(&c, other, "other");
    nn_out(&c, out, "out");
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnSWhere)

/* selfRef[mask] = value (mask broadcasts to selfRef) */
ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceMaskedFillScalarGetWorkspaceSize(aclTensor *selfRef, const aclTensor *mask,
    const aclScalar *value, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnInplaceMaskedFillScalar", "MaskedFill");
    nn_in(&c, selfRef, "selfRef");
    nn_in(&c, mask, "mask");
    nn_out(&c, selfRef, "selfRef");
    nn_attr_scalar(&c, "value", value, "value");
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceMaskedFillScalar)

/* value: a one-element tensor */
ACL_FUNC_VISIBILITY aclnnStatus aclnnInplaceMaskedFillTensorGetWorkspaceSize(aclTensor *selfRef, const aclTensor *mask,
    const aclTensor *value, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnInplaceMaskedFillTensor", "MaskedFill");
    nn_in(&c, selfRef, "selfRef");
    nn_in(&c, mask, "mask");
    nn_in(&c, value, "value");
    nn_out(&c, selfRef, "selfRef");
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnInplaceMaskedFillTensor)

/* ---- clamps ---- */

static aclnnStatus nn_clamp(const char *api, const aclTensor *self, const aclScalar *lo, const aclScalar *hi,
    const aclTensor *loT, const aclTensor *hiT, int tensors, const aclTensor *out, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, api, "Clamp");
    nn_in(&c, self, "self");
    int has_min = tensors ? loT != NULL : lo != NULL, has_max = tensors ? hiT != NULL : hi != NULL;
    if (tensors) {
        if (loT) nn_in(&c, loT, "min");
        if (hiT) nn_in(&c, hiT, "max");
    } else {
        if (lo) nn_attr_scalar(&c, "min", lo, "min");
        if (hi) nn_attr_scalar(&c, "max", hi, "max");
    }
    nn_out(&c, out, "out");
    if (!c.err && !has_min && !has_max) nn_fail(&c, ACLNN_ERR_PARAM_NULLPTR, "min and max are both NULL");
    nn_attr_int(&c, "has_min", has_min);
    nn_attr_int(&c, "has_max", has_max);
    nn_attr_int(&c, "tensors", tensors);
    return nn_finish(&c, workspaceSize, executor);
}

ACL_FUNC_VISIBILITY aclnnStatus aclnnClampGetWorkspaceSize(const aclTensor *self, const aclScalar *clipValueMin,
    const aclScalar *clipValueMax, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_clamp("aclnnClamp", self, clipValueMin, clipValueMax, NULL, NULL, 0, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnClamp)

ACL_FUNC_VISIBILITY aclnnStatus aclnnClampMinGetWorkspaceSize(const aclTensor *self, const aclScalar *clipValueMin,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!clipValueMin) return nn_null("aclnnClampMin", "clipValueMin");
    return nn_clamp("aclnnClampMin", self, clipValueMin, NULL, NULL, NULL, 0, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnClampMin)

ACL_FUNC_VISIBILITY aclnnStatus aclnnClampMaxGetWorkspaceSize(const aclTensor *self, const aclScalar *clipValueMax,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!clipValueMax) return nn_null("aclnnClampMax", "clipValueMax");
    return nn_clamp("aclnnClampMax", self, NULL, clipValueMax, NULL, NULL, 0, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnClampMax)

ACL_FUNC_VISIBILITY aclnnStatus aclnnClampTensorGetWorkspaceSize(const aclTensor *self, const aclTensor *clipValueMin,
    const aclTensor *clipValueMax, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    return nn_clamp("aclnnClampTensor", self, NULL, NULL, clipValueMin, clipValueMax, 1, out, workspaceSize,
        executor);
}
NN_LAUNCHER(aclnnClampTensor)

ACL_FUNC_VISIBILITY aclnnStatus aclnnClampMinTensorGetWorkspaceSize(const aclTensor *self,
    const aclTensor *clipValueMin, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!clipValueMin) return nn_null("aclnnClampMinTensor", "clipValueMin");
    return nn_clamp("aclnnClampMinTensor", self, NULL, NULL, clipValueMin, NULL, 1, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnClampMinTensor)

ACL_FUNC_VISIBILITY aclnnStatus aclnnClampMaxTensorGetWorkspaceSize(const aclTensor *self,
    const aclTensor *clipValueMax, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    if (!clipValueMax) return nn_null("aclnnClampMaxTensor", "clipValueMax");
    return nn_clamp("aclnnClampMaxTensor", self, NULL, NULL, NULL, clipValueMax, 1, out, workspaceSize, executor);
}
NN_LAUNCHER(aclnnClampMaxTensor)
