/* Private layouts of the aclnn objects, shared by libnnopbase.so (which creates
 * and destroys them) and libopapi.so (which reads them and creates executors).
 *
 * Every object starts with an nn_obj header and is entered in a registry of
 * live objects kept by libnnopbase, so a NULL, foreign, wrong-kind or destroyed
 * pointer is recognised without dereferencing it (aclsim_nn_lookup). */
#ifndef ACLSIM_ACLNN_OBJECTS_H_
#define ACLSIM_ACLNN_OBJECTS_H_

#include <stdbool.h>
#include <stdint.h>
#include "aclnn/acl_meta.h"
#include "sim.h"
#include "rt/kernels.h"   /* static inline dtype helpers only */

#ifdef __cplusplus
extern "C" {
#endif

/* Real nnopbase code (acl_op_api.cpp) for a NULL executor. */
#define NN_ERR_INNER_NULLPTR 561103

enum nn_kind {
    NN_TENSOR = 1,
    NN_SCALAR,
    NN_INT_ARRAY,
    NN_FLOAT_ARRAY,
    NN_BOOL_ARRAY,
    NN_TENSOR_LIST,
    NN_SCALAR_LIST,
    NN_EXECUTOR,
};

#define NN_MAGIC 0x4e4e4f42u   /* "NNOB"; cleared when the object dies */

typedef struct nn_obj {
    uint32_t magic;
    uint32_t kind;
    struct nn_obj *next;   /* registry chain */
} nn_obj;

struct aclTensor {
    nn_obj h;
    aclDataType dtype;
    aclFormat format;
    int ndim;
    int storage_ndim;
    int64_t dims[SIM_MAX_DIMS];
    int64_t strides[SIM_MAX_DIMS];   /* elements */
    int64_t offset;                  /* elements from data to the view's first element */
    int64_t storage_dims[SIM_MAX_DIMS];
    void *data;                      /* storage base (may be NULL until an op needs it) */
};

struct aclScalar {
    nn_obj h;
    aclDataType dtype;
    unsigned char value[16];         /* host copy, kern_dtype_size(dtype) bytes */
};

struct aclIntArray { nn_obj h; uint64_t n; int64_t v[]; };
struct aclFloatArray { nn_obj h; uint64_t n; float v[]; };
struct aclBoolArray { nn_obj h; uint64_t n; bool v[]; };
struct aclTensorList { nn_obj h; uint64_t n; const aclTensor *v[]; };
struct aclScalarList { nn_obj h; uint64_t n; const aclScalar *v[]; };

/* What aclnnXxxGetWorkspaceSize prepared: one operator launch, with the
 * tensors snapshotted (later changes to the aclTensors do not affect it).
 * One allocation: t and attrs point into it. Created by libopapi, freed by
 * aclnnXxx (after the launch) or aclDestroyAclOpExecutor. */
struct aclOpExecutor {
    nn_obj h;
    char api[48];                    /* "aclnnAdd" */
    char op_type[48];                /* "Add" */
    int nin, nout, nattrs;
    sim_tensor *t;                   /* nin inputs then nout outputs */
    sim_attr *attrs;
    uint64_t flops;
};

/* Registry (defined in libnnopbase). register sets magic and kind. lookup
 * returns the object if `p` is live and of `kind`, else NULL. unregister
 * removes it (clearing its magic) and returns 1, or 0 if it was not live. */
SIM_API void aclsim_nn_register(nn_obj *o, uint32_t kind);
SIM_API nn_obj *aclsim_nn_lookup(const void *p, uint32_t kind);
SIM_API int aclsim_nn_unregister(const void *p, uint32_t kind);

#ifdef __cplusplus
}
#endif

#endif
