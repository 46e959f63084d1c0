/* dlsym_app: mlp_train's first steps with every ACL, aclop and aclnn function
 * reached through dlopen + dlsym, the way torch_npu loads CANN. The program
 * links only libdl/libm. Some operators go through aclopCompileAndExecuteV2
 * (libacl_op_compiler.so), the rest through aclopExecuteV2, and the forward
 * bias add through aclnnAdd (libopapi.so; aclCreateTensor is reached through
 * the libopapi handle, whose dependency libnnopbase.so defines it). With the
 * same options its losses equal mlp_train's. A library or symbol that cannot
 * be found is reported by name (exit 2). */
#include <dlfcn.h>

#include "mlp_model.h"

static void *open_lib(const char *name) {
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) app_die(2, "cannot dlopen %s: %s", name, dlerror());
    return h;
}

static void *sym(void *h, const char *lib, const char *name) {
    dlerror();
    void *p = dlsym(h, name);
    const char *err = dlerror();
    if (!p) app_die(2, "missing symbol %s in %s: %s", name, lib, err ? err : "NULL address");
    return p;
}

int main(int argc, char **argv) {
    void *acl = open_lib("libascendcl.so");
    void *opc = open_lib("libacl_op_compiler.so");
    void *opapi = open_lib("libopapi.so");
    void *nnop = open_lib("libnnopbase.so");
    struct mlp_api api;
    memset(&api, 0, sizeof api);
#define FILL_ACL(f) api.f = (__typeof__(api.f))sym(acl, "libascendcl.so", #f);
#define FILL_OPC(f) api.f = (__typeof__(api.f))sym(opc, "libacl_op_compiler.so", #f);
#define FILL_OPAPI(f) api.f = (__typeof__(api.f))sym(opapi, "libopapi.so", #f);
#define FILL_NNOP(f) api.f = (__typeof__(api.f))sym(nnop, "libnnopbase.so", #f);
    MLP_API_RT(FILL_ACL)
    MLP_API_OPC(FILL_OPC)
    MLP_API_NN_TENSOR(FILL_OPAPI)   /* through libopapi's dependency, as op-plugin does */
    MLP_API_NN_SCALAR(FILL_NNOP)
    MLP_API_NN_OPS(FILL_OPAPI)
    int rc = mlp_main(&api, argc, argv, 3);
    /* unload in reverse order of opening */
    dlclose(nnop);
    dlclose(opapi);
    dlclose(opc);
    dlclose(acl);
    return rc;
}
