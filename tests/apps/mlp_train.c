/* mlp_train: trains an N-layer MLP with Adam through aclopExecuteV2 on one
 * stream (see mlp_model.h for the model and its options). Every ACL symbol is
 * linked directly; dlsym_app runs the same model through dlopen + dlsym.
 *
 * Prints "step=<i> loss=<f>" per step, then "final_loss=<f>" and
 * "checksum=<hex>" (FNV-1a over the final weights and biases). With
 * --footprint/--footprint-x the model is sized to a device footprint
 * ("footprint_bytes=<n>"); over capacity, aclrtMalloc's 207001 ends it (exit 2). */
#include "mlp_model.h"

int main(int argc, char **argv) {
    struct mlp_api api;
    memset(&api, 0, sizeof api);
    /* aclop only: the compile path and the aclnn bias add stay NULL */
#define MLP_FILL(f) api.f = f;
    MLP_API_RT(MLP_FILL)
#undef MLP_FILL
    return mlp_main(&api, argc, argv, 20);
}
