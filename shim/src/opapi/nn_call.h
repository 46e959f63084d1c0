/* The helpers every libopapi operator is built from (nn_call.c): an nn_call
 * collects one operator's tensors (as sim_tensor views of aclTensors) and
 * attributes; nn_finish validates them with the core's kernel check and
 * snapshots them into an executor; NN_LAUNCHER defines the aclnnXxx entry
 * that launches it. The first error sticks. */
#ifndef ACLSIM_NN_CALL_H_
#define ACLSIM_NN_CALL_H_

#include <stdbool.h>
#include <stdint.h>

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

#define NN_LAUNCHER(name)                                                                              \
    ACL_FUNC_VISIBILITY aclnnStatus name(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, \
        aclrtStream stream)                                                                            \
    {                                                                                                  \
        return nn_launch(#name, workspace, workspaceSize, executor, stream);                          \
    }

/* ACLNN_ERR_INNER_FIND_KERNEL_ERROR: "an inner error occurs when the API
 * searches for the NPU kernel (the operator binary package is not
 * installed)" — the aclnn return-code table of the CANN docs
 * (hiascend.com, "aclnn Return Codes"). Not in the public headers. */
#define NN_ERR_FIND_KERNEL 561003


void nn_begin(nn_call *c, const char *api, const char *op_type);
__attribute__((format(printf, 3, 4))) void nn_fail(nn_call *c, aclnnStatus st, const char *fmt, ...);
/* aclTensor -> sim_tensor view (data = storage base + offset); NULL or dead
 * handles, missing data: the recorded error */
void nn_view(nn_call *c, const aclTensor *h, const char *name, sim_tensor *v);
void nn_in_view(nn_call *c, const sim_tensor *v);
void nn_out_view(nn_call *c, const sim_tensor *v);
void nn_in(nn_call *c, const aclTensor *t, const char *name);
void nn_out(nn_call *c, const aclTensor *t, const char *name);
sim_attr *nn_attr(nn_call *c, const char *name, int type);
void nn_attr_int(nn_call *c, const char *name, int64_t v);
void nn_attr_float(nn_call *c, const char *name, float v);
/* a host scalar's value as float (any numeric type) */
float nn_scalar_float(nn_call *c, const aclScalar *h, const char *name);
/* a host scalar as attribute `attr`: integer scalars as int attributes
 * (exact), floating ones as float */
void nn_attr_scalar(nn_call *c, const char *attr, const aclScalar *h, const char *name);
/* core error -> aclnn status (argument errors 161002, no kernel 561003) */
aclnnStatus nn_status(aclError e);
aclnnStatus nn_finish(nn_call *c, uint64_t *workspaceSize, aclOpExecutor **executor);
aclnnStatus nn_launch(const char *api, void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
    aclrtStream stream);
/* common shapes of operators: self op other -> out (alpha scales other),
 * self op scalar -> out, f(self) -> out */
aclnnStatus nn_binary(const char *api, const char *op, const aclTensor *self, const aclTensor *other,
    int with_alpha, const aclScalar *alpha, const aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor);
aclnnStatus nn_scalar_op(const char *api, const char *op, const aclTensor *self, const aclScalar *value,
    const aclScalar *alpha, const aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor);
aclnnStatus nn_unary(const char *api, const char *op, const aclTensor *self, const aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor);
/* a required pointer argument is NULL: 161001 */
aclnnStatus nn_null(const char *api, const char *what);
/* every tensor of a list as inputs (or outputs); its length, or -1 */
int64_t nn_list(nn_call *c, const aclTensorList *h, const char *name, int as_out);

#endif
