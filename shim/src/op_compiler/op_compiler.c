/* libacl_op_compiler.so stand-in: compile-and-execute entry points. Nothing is
 * compiled; the operator runs exactly as through aclopExecuteV2, reached via
 * the core's internal aclsim_op_execute (never through a public ACL name, so an
 * interposer sees the application's call once). */
#include "acl/acl_op_compiler.h"
#include "sim.h"

/* Like the real library: counts first, then a compile flag outside the enum is
 * ACL_ERROR_API_NOT_SUPPORT; ACL_COMPILE_UNREGISTERED needs opPath. The engine
 * type is only a hint. */
static aclError check_compile_args(const char *api, int numInputs, int numOutputs, aclopCompileType compileFlag,
    const char *opPath)
{
    if (numInputs < 0 || numOutputs < 0) {
        aclsim_log("%s: negative count (%d inputs, %d outputs)", api, numInputs, numOutputs);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (compileFlag != ACL_COMPILE_SYS && compileFlag != ACL_COMPILE_UNREGISTERED) {
        aclsim_log("%s: compile flag %d not supported", api, (int)compileFlag);
        return ACL_ERROR_API_NOT_SUPPORT;
    }
    if (compileFlag == ACL_COMPILE_UNREGISTERED && !opPath) {
        aclsim_log("%s: opPath is NULL with ACL_COMPILE_UNREGISTERED", api);
        return ACL_ERROR_INVALID_PARAM;
    }
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclopCompileAndExecute(const char *opType, int numInputs,
    const aclTensorDesc *const inputDesc[], const aclDataBuffer *const inputs[], int numOutputs,
    const aclTensorDesc *const outputDesc[], aclDataBuffer *const outputs[], const aclopAttr *attr,
    aclopEngineType engineType, aclopCompileType compileFlag, const char *opPath, aclrtStream stream)
{
    aclError e = check_compile_args("aclopCompileAndExecute", numInputs, numOutputs, compileFlag, opPath);
    if (e) return e;
    return aclsim_op_execute("aclopCompileAndExecute", opType, numInputs, inputDesc, inputs, numOutputs, outputDesc,
        outputs, attr, stream);
}

ACL_FUNC_VISIBILITY aclError aclopCompileAndExecuteV2(const char *opType, int numInputs,
    aclTensorDesc *inputDesc[], aclDataBuffer *inputs[], int numOutputs, aclTensorDesc *outputDesc[],
    aclDataBuffer *outputs[], aclopAttr *attr, aclopEngineType engineType, aclopCompileType compileFlag,
    const char *opPath, aclrtStream stream)
{
    aclError e = check_compile_args("aclopCompileAndExecuteV2", numInputs, numOutputs, compileFlag, opPath);
    if (e) return e;
    return aclsim_op_execute("aclopCompileAndExecuteV2", opType, numInputs, (const aclTensorDesc *const *)inputDesc,
        (const aclDataBuffer *const *)inputs, numOutputs, (const aclTensorDesc *const *)outputDesc, outputs, attr,
        stream);
}
