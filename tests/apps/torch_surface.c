/* torch_surface: the runtime calls torch_npu makes beyond the foundation's
 * (device settings, stream failure mode, forced stream destruction, device
 * synchronisation with a timeout, VA reservation before a device is set,
 * compile options, system parameters, the "not supported" entry points and
 * the libruntime/libprofapi stand-ins reached through libascendcl's
 * dependency tree). Prints one "name=value" fact per check for
 * tests/sim_torch_surface.rs. Run with ACLSIM_DEVICES=2. */
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>
#include "acl/acl.h"
#include "acl/acl_op_compiler.h"
#include "common/common.h"

#define SHOW(name, call) printf("%s=%d\n", name, (int)(call))
#define MIB (1ULL << 20)

static void sleep_ms(void *arg) { usleep((useconds_t)(uintptr_t)arg * 1000); }

static unsigned char read_byte(void *dev)
{
    unsigned char b = 0;
    ACL_CHECK(aclrtMemcpy(&b, 1, dev, 1, ACL_MEMCPY_DEVICE_TO_HOST));
    return b;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    ACL_CHECK(aclInit(NULL));

    /* before any device is set */
    SHOW("sat_mode_no_device", aclrtSetDeviceSatMode(ACL_RT_OVERFLOW_MODE_INFNAN));
    void *probe = NULL;
    SHOW("reserve_no_device", aclrtReserveMemAddress(&probe, 512, 0, NULL, 1));
    SHOW("release_no_device", aclrtReleaseMemAddress(probe));
    SHOW("sysparam_set_no_device", aclrtSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1));
    SHOW("ctx_sysparam_no_device", aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, 0));

    ACL_CHECK(aclrtSetDevice(0));

    /* overflow mode */
    SHOW("sat_infnan", aclrtSetDeviceSatMode(ACL_RT_OVERFLOW_MODE_INFNAN));
    SHOW("sat_saturation", aclrtSetDeviceSatMode(ACL_RT_OVERFLOW_MODE_SATURATION));
    SHOW("sat_bad", aclrtSetDeviceSatMode((aclrtFloatOverflowMode)7));
    aclrtFloatOverflowMode mode = ACL_RT_OVERFLOW_MODE_UNDEF;
    SHOW("sat_get", aclrtGetDeviceSatMode(&mode));
    SHOW("sat_mode", mode);

    /* timeouts */
    SHOW("exec_timeout", aclrtSetOpExecuteTimeOut(547));
    uint64_t actual = 0;
    SHOW("exec_timeout_v2", aclrtSetOpExecuteTimeOutV2(1500000, &actual));
    printf("exec_timeout_v2_actual=%llu\n", (unsigned long long)actual);
    SHOW("exec_timeout_v2_null", aclrtSetOpExecuteTimeOutV2(1, NULL));
    SHOW("wait_timeout", aclrtSetOpWaitTimeout(10));

    /* system parameters: process value, context override */
    int64_t v = -1;
    SHOW("sysparam_get", aclrtGetSysParamOpt(ACL_OPT_DETERMINISTIC, &v));
    printf("sysparam_value=%lld\n", (long long)v);
    SHOW("ctx_sysparam_get", aclrtCtxGetSysParamOpt(ACL_OPT_DETERMINISTIC, &v));
    printf("ctx_sysparam_value=%lld\n", (long long)v);
    SHOW("ctx_sysparam_set", aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, 0));
    SHOW("ctx_sysparam_get2", aclrtCtxGetSysParamOpt(ACL_OPT_DETERMINISTIC, &v));
    printf("ctx_sysparam_value2=%lld\n", (long long)v);
    SHOW("sysparam_bad_value", aclrtSetSysParamOpt(ACL_OPT_DETERMINISTIC, 2));
    SHOW("sysparam_bad_opt", aclrtSetSysParamOpt((aclSysParamOpt)9, 1));

    /* compile options */
    SHOW("compileopt_set", aclSetCompileopt(ACL_OP_JIT_COMPILE, "disable"));
    printf("compileopt_size=%zu\n", aclGetCompileoptSize(ACL_OP_JIT_COMPILE));
    char opt[16] = {0};
    SHOW("compileopt_get", aclGetCompileopt(ACL_OP_JIT_COMPILE, opt, sizeof opt));
    printf("compileopt_value=%s\n", opt);
    SHOW("compileopt_small_buffer", aclGetCompileopt(ACL_OP_JIT_COMPILE, opt, 4));
    printf("compileopt_unset_size=%zu\n", aclGetCompileoptSize(ACL_OP_DEBUG_LEVEL));

    /* capabilities, peers, pid */
    int64_t cap = -1;
    SHOW("cap_aicore", aclGetDeviceCapability(0, ACL_DEVICE_INFO_AI_CORE_NUM, &cap));
    printf("aicore_num=%lld\n", (long long)cap);
    ACL_CHECK(aclGetDeviceCapability(0, ACL_DEVICE_INFO_L2_SIZE, &cap));
    printf("l2_size=%lld\n", (long long)cap);
    SHOW("cap_bad_device", aclGetDeviceCapability(9, ACL_DEVICE_INFO_AI_CORE_NUM, &cap));
    int32_t can = -1;
    ACL_CHECK(aclrtDeviceCanAccessPeer(&can, 0, 1));
    printf("peer_0_1=%d\n", can);
    ACL_CHECK(aclrtDeviceCanAccessPeer(&can, 0, 0));
    printf("peer_0_0=%d\n", can);
    SHOW("enable_peer", aclrtDeviceEnablePeerAccess(1, 0));
    SHOW("enable_peer_flags", aclrtDeviceEnablePeerAccess(1, 3));
    int32_t pid = 0;
    ACL_CHECK(aclrtDeviceGetBareTgid(&pid));
    printf("bare_tgid_is_pid=%d\n", pid == (int32_t)getpid());
    SHOW("process_report", aclrtProcessReport(10));

    /* the most recent failure's message, once */
    char host[16];
    SHOW("free_host_ptr", aclrtFree(host));
    const char *msg = aclGetRecentErrMsg();
    printf("recent_err_names_call=%d\n", msg != NULL && strstr(msg, "aclrtFree") != NULL);
    printf("recent_err_again_null=%d\n", aclGetRecentErrMsg() == NULL);

    /* not supported: the real code */
    void *bin = NULL;
    char blob[64] = {0};
    SHOW("binary_load", aclrtBinaryLoadFromData(blob, sizeof blob, NULL, &bin));
    uint64_t share = 0;
    aclrtPhysicalMemProp prop = {0};
    prop.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
    prop.memAttr = ACL_HBM_MEM_HUGE;
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    aclrtDrvMemHandle h = NULL;
    ACL_CHECK(aclrtMallocPhysical(&h, 2 * MIB, &prop, 0));
    SHOW("export_shareable", aclrtMemExportToShareableHandle(h, ACL_MEM_HANDLE_TYPE_NONE, 0, &share));
    ACL_CHECK(aclrtFreePhysical(h));
    SHOW("init_dump", aclmdlInitDump());

    /* libruntime / libprofapi, found through libascendcl's dependency tree */
    void *acl = dlopen("libascendcl.so", RTLD_LAZY | RTLD_NOLOAD);
    int (*rt_launch)(const void *, uint32_t, void *, uint32_t, void *, void *) =
        (int (*)(const void *, uint32_t, void *, uint32_t, void *, void *))dlsym(acl, "rtKernelLaunch");
    uint64_t (*hash)(const char *, size_t) = (uint64_t (*)(const char *, size_t))dlsym(acl, "MsprofGetHashId");
    printf("rt_found=%d\n", rt_launch != NULL && hash != NULL);
    if (rt_launch) SHOW("rt_kernel_launch", rt_launch(blob, 1, NULL, 0, NULL, NULL));
    if (hash) printf("msprof_hash_stable=%d\n", hash("MatMul", 6) == hash("MatMul", 6) && hash("MatMul", 6) != hash("Add", 3));

    /* stream failure mode: a fault makes a STOP_ON_FAILURE stream discard its
     * later work until a synchronize; a default (continue) stream runs it */
    void *good = NULL, *hole = NULL;
    ACL_CHECK(aclrtMalloc(&good, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemset(good, 4096, 0, 4096));
    ACL_CHECK(aclrtReserveMemAddress(&hole, 2 * MIB, 0, NULL, 0));   /* never mapped */
    aclrtStream stop = NULL, cont = NULL;
    ACL_CHECK(aclrtCreateStreamWithConfig(&stop, 0, ACL_STREAM_FAST_LAUNCH | ACL_STREAM_FAST_SYNC));
    ACL_CHECK(aclrtCreateStream(&cont));
    SHOW("failure_mode_null_stream", aclrtSetStreamFailureMode(NULL, ACL_STOP_ON_FAILURE));
    SHOW("failure_mode_bad", aclrtSetStreamFailureMode(stop, 5));
    SHOW("failure_mode_stop", aclrtSetStreamFailureMode(stop, ACL_STOP_ON_FAILURE));
    ACL_CHECK(aclrtMemsetAsync(hole, 64, 1, 64, stop));
    ACL_CHECK(aclrtMemsetAsync(good, 4096, 0x5a, 1, stop));
    SHOW("stop_sync", aclrtSynchronizeStream(stop));
    printf("stop_discarded_later_work=%d\n", read_byte(good) == 0);
    ACL_CHECK(aclrtMemsetAsync(good, 4096, 0x33, 1, stop));
    SHOW("stop_sync_after", aclrtSynchronizeStream(stop));
    printf("stop_runs_after_sync=%d\n", read_byte(good) == 0x33);
    ACL_CHECK(aclrtMemsetAsync(hole, 64, 1, 64, cont));
    ACL_CHECK(aclrtMemsetAsync(good, 4096, 0x5a, 1, cont));
    SHOW("continue_sync", aclrtSynchronizeStream(cont));
    printf("continue_ran_later_work=%d\n", read_byte(good) == 0x5a);

    /* device synchronisation with a timeout */
    ACL_CHECK(aclrtLaunchHostFunc(cont, sleep_ms, (void *)(uintptr_t)300));
    SHOW("sync_device_timeout", aclrtSynchronizeDeviceWithTimeout(50));
    SHOW("sync_device_timeout_bad", aclrtSynchronizeDeviceWithTimeout(-5));
    SHOW("sync_device_wait", aclrtSynchronizeDeviceWithTimeout(-1));

    /* forced destruction discards queued work */
    ACL_CHECK(aclrtMemset(good, 4096, 0, 1));
    ACL_CHECK(aclrtLaunchHostFunc(stop, sleep_ms, (void *)(uintptr_t)100));
    ACL_CHECK(aclrtMemsetAsync(good, 4096, 0x77, 1, stop));
    SHOW("destroy_force", aclrtDestroyStreamForce(stop));
    printf("force_discarded_queued=%d\n", read_byte(good) == 0);
    SHOW("destroy_force_again", aclrtDestroyStreamForce(stop));

    ACL_CHECK(aclrtDestroyStream(cont));
    ACL_CHECK(aclrtReleaseMemAddress(hole));
    ACL_CHECK(aclrtFree(good));
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return 0;
}
