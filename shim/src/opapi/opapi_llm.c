/* aclnn fused transformer operators (kernels: rt/kernels_llm.c): layer norm
 * and RMS norm with their gradients, rotary position embedding and its
 * gradient, SwiGLU and its gradient, the softmax gradient, and
 * FlashAttentionScore forward and backward as torch_npu's
 * scaled_dot_product_attention / npu_fusion_attention call them
 * (op_plugin/ops/opapi/FlashAttentionKernelNpuOpApi.cpp; prototypes: the
 * CANN aclnnFlashAttentionScore pages). */
#include <string.h>

#include "opapi/nn_call.h"

/* Elements of an aclTensor's view, or -1 for a handle that is not a live
 * tensor (op-plugin passes empty [0] tensors, often without data, for
 * outputs it does not want). */
static int64_t nn_numel(const aclTensor *h)
{
    const aclTensor *t = h ? (const aclTensor *)aclsim_nn_lookup(h, NN_TENSOR) : NULL;
    if (!t) return -1;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->dims[i];
    return n;
}

/* An optional output: added when present and non-empty; 1 if added. */
static int nn_out_opt(nn_call *c, const aclTensor *t, const char *name)
{
    if (c->err || !t || nn_numel(t) == 0) return 0;
    nn_out(c, t, name);
    return 1;
}

/* An optional input that the simulator does not compute with: refused. */
static void nn_unsupported(nn_call *c, const void *arg, const char *what)
{
    if (!c->err && arg) nn_fail(c, ACLNN_ERR_PARAM_INVALID, "%s is not simulated", what);
}

/* ---- layer norm ---- */

static int nn_norm_ndim(nn_call *c, const aclIntArray *shape)
{
    if (c->err) return 0;
    if (!shape) { nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "normalizedShape is NULL"); return 0; }
    const aclIntArray *s = (const aclIntArray *)aclsim_nn_lookup(shape, NN_INT_ARRAY);
    if (!s) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "normalizedShape is not a live aclIntArray"); return 0; }
    const sim_tensor *x = &c->in[0];
    if (s->n < 1 || (int)s->n > x->ndim) { nn_fail(c, ACLNN_ERR_PARAM_INVALID, "normalizedShape has %llu dims", (unsigned long long)s->n); return 0; }
    for (uint64_t i = 0; i < s->n; i++)
        if (s->v[i] != x->dims[x->ndim - (int)s->n + (int)i]) {
            nn_fail(c, ACLNN_ERR_PARAM_INVALID, "normalizedShape does not match the input's trailing dims");
            return 0;
        }
    return (int)s->n;
}

ACL_FUNC_VISIBILITY aclnnStatus aclnnLayerNormGetWorkspaceSize(const aclTensor *input, const aclIntArray *normalizedShape,
    const aclTensor *weightOptional, const aclTensor *biasOptional, double eps, aclTensor *out, aclTensor *meanOutOptional,
    aclTensor *rstdOutOptional, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnLayerNorm", "LayerNorm");
    nn_in(&c, input, "input");
    int k = nn_norm_ndim(&c, normalizedShape);
    if (weightOptional) nn_in(&c, weightOptional, "weightOptional");
    if (biasOptional) nn_in(&c, biasOptional, "biasOptional");
    nn_out(&c, out, "out");
    int om = nn_out_opt(&c, meanOutOptional, "meanOutOptional");
    int orr = nn_out_opt(&c, rstdOutOptional, "rstdOutOptional");
    nn_attr_int(&c, "norm_ndim", k);
    nn_attr_int(&c, "has_gamma", weightOptional != NULL);
    nn_attr_int(&c, "has_beta", biasOptional != NULL);
    nn_attr_int(&c, "out_mean", om);
    nn_attr_int(&c, "out_rstd", orr);
    nn_attr_float(&c, "eps", (float)eps);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnLayerNorm)

/* outputMask: which of gradInput, gradWeight, gradBias to compute */
ACL_FUNC_VISIBILITY aclnnStatus aclnnLayerNormBackwardGetWorkspaceSize(const aclTensor *gradOut, const aclTensor *input,
    const aclIntArray *normalizedShape, const aclTensor *mean, const aclTensor *rstd, const aclTensor *weightOptional,
    const aclTensor *biasOptional, const aclBoolArray *outputMask, aclTensor *gradInputOut, aclTensor *gradWeightOut,
    aclTensor *gradBiasOut, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnLayerNormBackward", "LayerNormGrad");
    nn_in(&c, input, "input");           /* first, for nn_norm_ndim; reordered below */
    int k = nn_norm_ndim(&c, normalizedShape);
    c.nin = 0;
    nn_in(&c, gradOut, "gradOut");
    nn_in(&c, input, "input");
    nn_in(&c, mean, "mean");
    nn_in(&c, rstd, "rstd");
    if (weightOptional) nn_in(&c, weightOptional, "weightOptional");
    if (!c.err && !outputMask) nn_fail(&c, ACLNN_ERR_PARAM_NULLPTR, "outputMask is NULL");
    const aclBoolArray *m = c.err ? NULL : (const aclBoolArray *)aclsim_nn_lookup(outputMask, NN_BOOL_ARRAY);
    if (!c.err && (!m || m->n != 3)) nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "outputMask must be a live aclBoolArray of 3");
    uint32_t bits = 0;
    if (!c.err) {
        aclTensor *outs[3] = { gradInputOut, gradWeightOut, gradBiasOut };
        static const char *const names[3] = { "gradInputOut", "gradWeightOut", "gradBiasOut" };
        for (int i = 0; i < 3; i++)
            if (m->v[i]) {
                nn_out(&c, outs[i], names[i]);
                bits |= 1u << i;
            }
    }
    nn_attr_int(&c, "norm_ndim", k);
    nn_attr_int(&c, "has_gamma", weightOptional != NULL);
    nn_attr_int(&c, "out_mask", bits);
    (void)biasOptional;   /* the bias does not enter any gradient */
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnLayerNormBackward)

/* ---- RMS norm (torch_npu.npu_rms_norm) ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnRmsNormGetWorkspaceSize(const aclTensor *x, const aclTensor *gamma, double epsilon,
    const aclTensor *yOut, const aclTensor *rstdOut, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnRmsNorm", "RmsNorm");
    nn_in(&c, x, "x");
    nn_in(&c, gamma, "gamma");
    nn_out(&c, yOut, "yOut");
    nn_out(&c, rstdOut, "rstdOut");
    nn_attr_float(&c, "eps", (float)epsilon);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnRmsNorm)

ACL_FUNC_VISIBILITY aclnnStatus aclnnRmsNormGradGetWorkspaceSize(const aclTensor *dy, const aclTensor *x,
    const aclTensor *rstd, const aclTensor *gamma, const aclTensor *dxOut, const aclTensor *dgammaOut,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnRmsNormGrad", "RmsNormGrad");
    nn_in(&c, dy, "dy");
    nn_in(&c, x, "x");
    nn_in(&c, rstd, "rstd");
    nn_in(&c, gamma, "gamma");
    nn_out(&c, dxOut, "dxOut");
    nn_out(&c, dgammaOut, "dgammaOut");
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnRmsNormGrad)

/* ---- rotary position embedding (torch_npu.npu_rotary_mul): mode 0 half, 1 interleave ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnRotaryPositionEmbeddingGetWorkspaceSize(const aclTensor *x, const aclTensor *cos,
    const aclTensor *sin, int64_t mode, aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnRotaryPositionEmbedding", "RotaryPositionEmbedding");
    nn_in(&c, x, "x");
    nn_in(&c, cos, "cos");
    nn_in(&c, sin, "sin");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "mode", mode);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnRotaryPositionEmbedding)

ACL_FUNC_VISIBILITY aclnnStatus aclnnRotaryPositionEmbeddingGradGetWorkspaceSize(const aclTensor *dy,
    const aclTensor *cos, const aclTensor *sin, const aclTensor *xOptional, int64_t mode, aclTensor *dxOut,
    aclTensor *dcosOut, aclTensor *dsinOut, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnRotaryPositionEmbeddingGrad", "RotaryPositionEmbeddingGrad");
    nn_in(&c, dy, "dy");
    nn_in(&c, cos, "cos");
    nn_in(&c, sin, "sin");
    int want_cs = xOptional && nn_numel(xOptional) > 0 && nn_numel(dcosOut) > 0 && nn_numel(dsinOut) > 0;
    if (want_cs) nn_in(&c, xOptional, "xOptional");
    nn_out(&c, dxOut, "dxOut");
    if (want_cs) {
        nn_out(&c, dcosOut, "dcosOut");
        nn_out(&c, dsinOut, "dsinOut");
    }
    nn_attr_int(&c, "mode", mode);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnRotaryPositionEmbeddingGrad)

/* ---- SwiGLU (torch_npu.npu_swiglu): silu(first half) * second half along dim ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnSwiGluGetWorkspaceSize(const aclTensor *x, int64_t dim, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnSwiGlu", "SwiGlu");
    nn_in(&c, x, "x");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "dim", dim);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnSwiGlu)

ACL_FUNC_VISIBILITY aclnnStatus aclnnSwiGluGradGetWorkspaceSize(const aclTensor *yGrad, const aclTensor *x, int64_t dim,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnSwiGluGrad", "SwiGluGrad");
    nn_in(&c, yGrad, "yGrad");
    nn_in(&c, x, "x");
    nn_out(&c, out, "out");
    nn_attr_int(&c, "dim", dim);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnSwiGluGrad)

/* ---- softmax gradient ---- */

ACL_FUNC_VISIBILITY aclnnStatus aclnnSoftmaxBackwardGetWorkspaceSize(const aclTensor *gradOutput, const aclTensor *output,
    int64_t dim, aclTensor *gradInput, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnSoftmaxBackward", "SoftmaxGrad");
    nn_in(&c, gradOutput, "gradOutput");
    nn_in(&c, output, "output");
    nn_out(&c, gradInput, "gradInput");
    nn_attr_int(&c, "axis", dim);
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnSoftmaxBackward)

/* ---- FlashAttentionScore ---- */

/* layout string -> the kernel's code; -1 for TND (varlen) or anything else */
static int nn_layout(nn_call *c, const char *layout)
{
    if (c->err) return -1;
    if (!layout) { nn_fail(c, ACLNN_ERR_PARAM_NULLPTR, "inputLayout is NULL"); return -1; }
    static const char *const names[] = { "BSH", "SBH", "BNSD", "BSND" };
    for (int i = 0; i < 4; i++)
        if (!strcmp(layout, names[i])) return i;
    nn_fail(c, ACLNN_ERR_PARAM_INVALID, "inputLayout '%s' is not simulated (BSH, SBH, BNSD, BSND)", layout);
    return -1;
}

/* The attributes and optional inputs both directions share. Dropout (a drop
 * mask, keep_prob < 1), pse, padding masks and prefix lengths are refused. */
static void nn_fa_common(nn_call *c, const aclTensor *pse, const aclTensor *dropMask, const aclTensor *paddingMask,
    const aclTensor *attenMask, const aclIntArray *prefix, double scale, double keepProb, int64_t preTokens,
    int64_t nextTokens, int64_t headNum, char *inputLayout, int64_t sparseMode)
{
    nn_unsupported(c, nn_numel(pse) > 0 ? pse : NULL, "pse (realShift)");
    nn_unsupported(c, nn_numel(dropMask) > 0 ? dropMask : NULL, "dropout (dropMask)");
    nn_unsupported(c, nn_numel(paddingMask) > 0 ? paddingMask : NULL, "paddingMask");
    if (!c->err && keepProb != 1.0) nn_fail(c, ACLNN_ERR_PARAM_INVALID, "keepProb %g: dropout is not simulated", keepProb);
    if (!c->err && prefix) {
        const aclIntArray *p = (const aclIntArray *)aclsim_nn_lookup(prefix, NN_INT_ARRAY);
        if (!p) nn_fail(c, ACLNN_ERR_PARAM_INVALID, "prefix is not a live aclIntArray");
        else if (p->n) nn_fail(c, ACLNN_ERR_PARAM_INVALID, "prefix lengths are not simulated");
    }
    int has_mask = attenMask && nn_numel(attenMask) > 0;
    if (has_mask) nn_in(c, attenMask, "attenMask");
    nn_attr_int(c, "layout", nn_layout(c, inputLayout));
    nn_attr_int(c, "head_num", headNum);
    nn_attr_float(c, "scale", (float)scale);
    nn_attr_int(c, "pre_tokens", preTokens);
    nn_attr_int(c, "next_tokens", nextTokens);
    nn_attr_int(c, "sparse_mode", sparseMode);
    nn_attr_int(c, "has_mask", has_mask);
}

ACL_FUNC_VISIBILITY aclnnStatus aclnnFlashAttentionScoreGetWorkspaceSize(const aclTensor *query, const aclTensor *key,
    const aclTensor *value, const aclTensor *realShiftOptional, const aclTensor *dropMaskOptional,
    const aclTensor *paddingMaskOptional, const aclTensor *attenMaskOptional, const aclIntArray *prefixOptional,
    double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char *inputLayout,
    int64_t innerPrecise, int64_t sparseMode, const aclTensor *softmaxMaxOut, const aclTensor *softmaxSumOut,
    const aclTensor *softmaxOutOut, const aclTensor *attentionOutOut, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnFlashAttentionScore", "FlashAttentionScore");
    nn_in(&c, query, "query");
    nn_in(&c, key, "key");
    nn_in(&c, value, "value");
    nn_fa_common(&c, realShiftOptional, dropMaskOptional, paddingMaskOptional, attenMaskOptional, prefixOptional,
        scaleValue, keepProb, preTokens, nextTokens, headNum, inputLayout, sparseMode);
    nn_out(&c, softmaxMaxOut, "softmaxMaxOut");
    nn_out(&c, softmaxSumOut, "softmaxSumOut");
    nn_unsupported(&c, nn_numel(softmaxOutOut) > 0 ? softmaxOutOut : NULL, "softmaxOut (the probabilities)");
    nn_out(&c, attentionOutOut, "attentionOutOut");
    (void)innerPrecise;   /* a precision/performance hint */
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnFlashAttentionScore)

ACL_FUNC_VISIBILITY aclnnStatus aclnnFlashAttentionScoreGradGetWorkspaceSize(const aclTensor *query,
    const aclTensor *keyIn, const aclTensor *value, const aclTensor *dy, const aclTensor *pseShiftOptional,
    const aclTensor *dropMaskOptional, const aclTensor *paddingMaskOptional, const aclTensor *attenMaskOptional,
    const aclTensor *softmaxMaxOptional, const aclTensor *softmaxSumOptional, const aclTensor *softmaxInOptional,
    const aclTensor *attentionInOptional, const aclIntArray *prefixOptional, double scaleValue, double keepProb,
    int64_t preTokens, int64_t nextTokens, int64_t headNum, char *inputLayout, int64_t innerPrecise,
    int64_t sparseMode, const aclTensor *dqOut, const aclTensor *dkOut, const aclTensor *dvOut,
    const aclTensor *dpseOut, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    nn_call c;
    nn_begin(&c, "aclnnFlashAttentionScoreGrad", "FlashAttentionScoreGrad");
    nn_in(&c, query, "query");
    nn_in(&c, keyIn, "keyIn");
    nn_in(&c, value, "value");
    nn_in(&c, dy, "dy");
    nn_fa_common(&c, pseShiftOptional, dropMaskOptional, paddingMaskOptional, attenMaskOptional, prefixOptional,
        scaleValue, keepProb, preTokens, nextTokens, headNum, inputLayout, sparseMode);
    if (!c.err && (nn_numel(softmaxMaxOptional) <= 0 || nn_numel(softmaxSumOptional) <= 0))
        nn_fail(&c, ACLNN_ERR_PARAM_INVALID, "softmaxMax and softmaxSum from the forward are required");
    nn_in(&c, softmaxMaxOptional, "softmaxMaxOptional");
    nn_in(&c, softmaxSumOptional, "softmaxSumOptional");
    int has_att = attentionInOptional && nn_numel(attentionInOptional) > 0;
    if (has_att) nn_in(&c, attentionInOptional, "attentionInOptional");
    (void)softmaxInOptional;   /* the probabilities are recomputed from max and sum */
    nn_out(&c, dqOut, "dqOut");
    nn_out(&c, dkOut, "dkOut");
    nn_out(&c, dvOut, "dvOut");
    (void)dpseOut;             /* no pse, so no pse gradient */
    nn_attr_int(&c, "has_attention_in", has_att);
    (void)innerPrecise;
    return nn_finish(&c, workspaceSize, executor);
}
NN_LAUNCHER(aclnnFlashAttentionScoreGrad)
