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

/* ---- compile options (aclSetCompileopt / aclGetCompileopt) ----
 * Process-wide settings of the (simulated) operator compiler. Nothing is
 * compiled, so they change no result: the simulated kernels are always
 * deterministic, compute f32 in f32 (no precision-mode downcast) and never
 * JIT-compile. They are kept so that a reader gets back what was set, as on
 * CANN; an option never set reads as the empty string. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define N_COMPILE_OPTS ((int)ACL_OP_DEBUG_OPTION + 1)
static pthread_mutex_t g_opt_mu = PTHREAD_MUTEX_INITIALIZER;
static char *g_opt[N_COMPILE_OPTS];

ACL_FUNC_VISIBILITY aclError aclSetCompileopt(aclCompileOpt opt, const char *value)
{
    if ((int)opt < 0 || (int)opt >= N_COMPILE_OPTS || !value) return ACL_ERROR_INVALID_PARAM;
    if (strlen(value) >= 4096) {
        aclsim_log("aclSetCompileopt(%d): value longer than 4095 bytes", (int)opt);
        return ACL_ERROR_INVALID_PARAM;
    }
    char *v = strdup(value);
    if (!v) return ACL_ERROR_BAD_ALLOC;
    pthread_mutex_lock(&g_opt_mu);
    free(g_opt[opt]);
    g_opt[opt] = v;
    pthread_mutex_unlock(&g_opt_mu);
    return ACL_SUCCESS;
}

/* bytes needed for the value including its terminating NUL; 0 for a bad option */
ACL_FUNC_VISIBILITY size_t aclGetCompileoptSize(aclCompileOpt opt)
{
    if ((int)opt < 0 || (int)opt >= N_COMPILE_OPTS) return 0;
    pthread_mutex_lock(&g_opt_mu);
    size_t n = (g_opt[opt] ? strlen(g_opt[opt]) : 0) + 1;
    pthread_mutex_unlock(&g_opt_mu);
    return n;
}

ACL_FUNC_VISIBILITY aclError aclGetCompileopt(aclCompileOpt opt, char *value, size_t length)
{
    if ((int)opt < 0 || (int)opt >= N_COMPILE_OPTS || !value || length == 0) return ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&g_opt_mu);
    const char *v = g_opt[opt] ? g_opt[opt] : "";
    size_t n = strlen(v);
    aclError rc = ACL_SUCCESS;
    if (n + 1 > length) rc = ACL_ERROR_INVALID_PARAM;
    else memcpy(value, v, n + 1);
    pthread_mutex_unlock(&g_opt_mu);
    return rc;
}
