/* Device-level odds and ends that torch_npu calls while it initialises a
 * device and creates its streams: overflow (saturation) mode, timeouts,
 * capabilities, peer access, the application log, the recent-error message,
 * and the entry points of features the simulator does not implement (kernel
 * binaries, IPC of physical memory, model dumps), which return the real
 * "not supported" code instead of pretending to work. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "rt/rt.h"

/* Every entry point of a feature the simulator lacks goes through here: one
 * stderr line per API (not per call), then ACL_ERROR_RT_FEATURE_NOT_SUPPORT. */
static aclError not_supported(const char *api, atomic_int *said)
{
    if (!atomic_exchange(said, 1))
        aclsim_log("%s: not supported by the simulator -> %d (ACL_ERROR_RT_FEATURE_NOT_SUPPORT)", api,
                   ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
}
#define NOT_SUPPORTED(api)                      \
    do {                                        \
        static atomic_int said_;                \
        return not_supported(api, &said_);      \
    } while (0)

/* ---- floating-point overflow mode ---- */

/* Per device. 910B parts default to IEEE inf/nan (what every simulated
 * kernel computes); saturation mode is not simulated. */
static int g_sat_mode[SIM_MAX_DEVICES];   /* 0 = not set: the default INFNAN */

ACL_FUNC_VISIBILITY aclError aclrtSetDeviceSatMode(aclrtFloatOverflowMode mode)
{
    if (mode != ACL_RT_OVERFLOW_MODE_SATURATION && mode != ACL_RT_OVERFLOW_MODE_INFNAN)
        return ACL_ERROR_INVALID_PARAM;
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    if (mode == ACL_RT_OVERFLOW_MODE_SATURATION) {
        /* the kernels compute IEEE results; saturating them would be a
         * different device */
        NOT_SUPPORTED("aclrtSetDeviceSatMode(ACL_RT_OVERFLOW_MODE_SATURATION)");
    }
    g_sat_mode[t_dev] = 1 + (int)mode;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtGetDeviceSatMode(aclrtFloatOverflowMode *mode)
{
    if (!mode) return ACL_ERROR_INVALID_PARAM;
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    *mode = g_sat_mode[t_dev] ? (aclrtFloatOverflowMode)(g_sat_mode[t_dev] - 1) : ACL_RT_OVERFLOW_MODE_INFNAN;
    return ACL_SUCCESS;
}

/* ---- timeouts ----
 * Simulated operators always finish, so these timeouts never fire; they are
 * recorded (process-wide, as on CANN) and validated. */
static atomic_uint g_op_exec_timeout_s, g_op_wait_timeout_s;

ACL_FUNC_VISIBILITY aclError aclrtSetOpExecuteTimeOut(uint32_t timeout)
{
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    atomic_store(&g_op_exec_timeout_s, timeout);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtSetOpExecuteTimeOutWithMs(uint32_t timeout)
{
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    atomic_store(&g_op_exec_timeout_s, (timeout + 999) / 1000);
    return ACL_SUCCESS;
}

/* microseconds; every value is honoured exactly (nothing to round to) */
ACL_FUNC_VISIBILITY aclError aclrtSetOpExecuteTimeOutV2(uint64_t timeout, uint64_t *actualTimeout)
{
    if (!actualTimeout) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    atomic_store(&g_op_exec_timeout_s, (unsigned)((timeout + 999999) / 1000000));
    *actualTimeout = timeout;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtSetOpWaitTimeout(uint32_t timeout)
{
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    atomic_store(&g_op_wait_timeout_s, timeout);
    return ACL_SUCCESS;
}

/* ---- capabilities ---- */

ACL_FUNC_VISIBILITY aclError aclGetDeviceCapability(uint32_t deviceId, aclDeviceInfo deviceInfo, int64_t *value)
{
    if (!value) return ACL_ERROR_INVALID_PARAM;
    sim_ensure_config();
    if (deviceId >= (uint32_t)g_cfg.devices) return ACL_ERROR_RT_INVALID_DEVICEID;
    /* Ascend910B4: 20 AI cores, 40 vector cores, 96 MiB L2;
     * Ascend910B2: 24, 48, 192 MiB */
    int b2 = strcmp(g_cfg.soc_name, "Ascend910B2") == 0;
    switch (deviceInfo) {
    case ACL_DEVICE_INFO_AI_CORE_NUM: *value = b2 ? 24 : 20; return ACL_SUCCESS;
    case ACL_DEVICE_INFO_VECTOR_CORE_NUM: *value = b2 ? 48 : 40; return ACL_SUCCESS;
    case ACL_DEVICE_INFO_L2_SIZE: *value = (int64_t)(b2 ? 192 : 96) << 20; return ACL_SUCCESS;
    default: return ACL_ERROR_INVALID_PARAM;
    }
}

/* ---- peer access ----
 * Devices of one simulated process share a host address space, so every pair
 * of distinct devices can reach each other (as on an HCCS-connected 910B
 * server). */
static atomic_uint g_peer_enabled[SIM_MAX_DEVICES];   /* bit p: access to peer p enabled */

ACL_FUNC_VISIBILITY aclError aclrtDeviceCanAccessPeer(int32_t *canAccessPeer, int32_t deviceId, int32_t peerDeviceId)
{
    if (!canAccessPeer) return ACL_ERROR_INVALID_PARAM;
    if (sim_config_error()) return ACL_ERROR_INVALID_PARAM;
    if (deviceId < 0 || deviceId >= g_cfg.devices || peerDeviceId < 0 || peerDeviceId >= g_cfg.devices)
        return ACL_ERROR_RT_INVALID_DEVICEID;
    *canAccessPeer = deviceId != peerDeviceId;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtDeviceEnablePeerAccess(int32_t peerDeviceId, uint32_t flags)
{
    if (flags != 0) return ACL_ERROR_INVALID_PARAM;   /* reserved, must be 0 */
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    if (peerDeviceId < 0 || peerDeviceId >= g_cfg.devices) return ACL_ERROR_RT_INVALID_DEVICEID;
    if (peerDeviceId == t_dev) return ACL_ERROR_INVALID_PARAM;
    atomic_fetch_or(&g_peer_enabled[t_dev], 1u << peerDeviceId);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtDeviceGetBareTgid(int32_t *pid)
{
    if (!pid) return ACL_ERROR_INVALID_PARAM;
    /* the host-side process id (no container pid namespace here) */
    *pid = (int32_t)getpid();
    return ACL_SUCCESS;
}

/* ---- callbacks: aclrtSubscribeReport / aclrtLaunchCallback are not
 * implemented, so no thread is ever subscribed to report processing. ---- */
ACL_FUNC_VISIBILITY aclError aclrtProcessReport(int32_t timeout)
{
    if (timeout < -1) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    return ACL_ERROR_RT_THREAD_SUBSCRIBE;
}

/* ---- application log (CANN's plog) ----
 * Messages at or above ASCEND_GLOBAL_LOG_LEVEL (0 debug .. 3 error, 4 off;
 * default 3) go to stderr; CANN would write them to its log files. */
static int applog_level(void)
{
    static int level = -1;
    if (level < 0) {
        const char *v = getenv("ASCEND_GLOBAL_LOG_LEVEL");
        int l = (v && *v >= '0' && *v <= '4' && !v[1]) ? *v - '0' : ACL_ERROR;
        level = l;
    }
    return level;
}

ACL_FUNC_VISIBILITY void aclAppLog(aclLogLevel logLevel, const char *func, const char *file, uint32_t line,
    const char *fmt, ...)
{
    if (!fmt || (int)logLevel < applog_level()) return;
    static const char *names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
    const char *lv = ((int)logLevel >= 0 && (int)logLevel <= 3) ? names[logLevel] : "?";
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *base = file ? strrchr(file, '/') : NULL;
    base = base ? base + 1 : (file ? file : "?");
    char buf[1280];
    int n = snprintf(buf, sizeof buf, "[%s] %s:%u %s: %s\n", lv, base, line, func ? func : "?", msg);
    if (n > (int)sizeof buf - 1) n = (int)sizeof buf - 1;
    ssize_t r = write(2, buf, (size_t)n);
    (void)r;
}

/* ---- features the simulator does not implement ---- */

ACL_FUNC_VISIBILITY aclError aclrtBinaryLoadFromData(const void *data, size_t length,
    const aclrtBinaryLoadOptions *options, aclrtBinHandle *binHandle)
{
    if (!data || length == 0 || !binHandle) return ACL_ERROR_INVALID_PARAM;
    NOT_SUPPORTED("aclrtBinaryLoadFromData (device kernel binaries)");
}

ACL_FUNC_VISIBILITY aclError aclrtBinaryGetFunction(const aclrtBinHandle binHandle, const char *kernelName,
    aclrtFuncHandle *funcHandle)
{
    if (!binHandle || !kernelName || !funcHandle) return ACL_ERROR_INVALID_PARAM;
    /* no binary can have been loaded */
    return ACL_ERROR_RT_INVALID_HANDLE;
}

ACL_FUNC_VISIBILITY aclError aclrtGetFunctionAddr(aclrtFuncHandle funcHandle, void **aicAddr, void **aivAddr)
{
    if (!funcHandle || !aicAddr || !aivAddr) return ACL_ERROR_INVALID_PARAM;
    return ACL_ERROR_RT_INVALID_HANDLE;
}

ACL_FUNC_VISIBILITY aclError aclrtMemExportToShareableHandle(aclrtDrvMemHandle handle,
    aclrtMemHandleType handleType, uint64_t flags, uint64_t *shareableHandle)
{
    if (!handle || !shareableHandle) return ACL_ERROR_INVALID_PARAM;
    NOT_SUPPORTED("aclrtMemExportToShareableHandle (inter-process memory sharing)");
}

ACL_FUNC_VISIBILITY aclError aclrtMemImportFromShareableHandle(uint64_t shareableHandle, int32_t deviceId,
    aclrtDrvMemHandle *handle)
{
    if (!handle) return ACL_ERROR_INVALID_PARAM;
    NOT_SUPPORTED("aclrtMemImportFromShareableHandle (inter-process memory sharing)");
}

ACL_FUNC_VISIBILITY aclError aclrtMemSetPidToShareableHandle(uint64_t shareableHandle, int32_t *pid, size_t pidNum)
{
    if (!pid || pidNum == 0) return ACL_ERROR_INVALID_PARAM;
    NOT_SUPPORTED("aclrtMemSetPidToShareableHandle (inter-process memory sharing)");
}

ACL_FUNC_VISIBILITY aclError aclmdlInitDump(void)
{
    NOT_SUPPORTED("aclmdlInitDump (operator data dump)");
}

ACL_FUNC_VISIBILITY aclError aclmdlSetDump(const char *dumpCfgPath)
{
    if (!dumpCfgPath) return ACL_ERROR_INVALID_PARAM;
    NOT_SUPPORTED("aclmdlSetDump (operator data dump)");
}

ACL_FUNC_VISIBILITY aclError aclmdlFinalizeDump(void)
{
    NOT_SUPPORTED("aclmdlFinalizeDump (operator data dump)");
}

/* ---- system parameters (aclrt[Ctx]{Set,Get}SysParamOpt) ----
 * Process-wide values, overridden per context (device). Every option is a
 * 0/1 switch; unset options read 0. The simulated kernels are always
 * deterministic and strongly consistent, so the values change no result. */
#define N_SYS_OPTS ((int)ACL_OPT_STRONG_CONSISTENCY + 1)
static pthread_mutex_t g_sysopt_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t g_sysopt[N_SYS_OPTS];
static int64_t g_ctx_sysopt[SIM_MAX_DEVICES][N_SYS_OPTS];
static unsigned char g_ctx_sysopt_set[SIM_MAX_DEVICES][N_SYS_OPTS];

static int sysopt_ok(aclSysParamOpt opt) { return (int)opt >= 0 && (int)opt < N_SYS_OPTS; }

ACL_FUNC_VISIBILITY aclError aclrtSetSysParamOpt(aclSysParamOpt opt, int64_t value)
{
    if (!sysopt_ok(opt) || (value != 0 && value != 1)) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    pthread_mutex_lock(&g_sysopt_mu);
    g_sysopt[opt] = value;
    pthread_mutex_unlock(&g_sysopt_mu);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtGetSysParamOpt(aclSysParamOpt opt, int64_t *value)
{
    if (!sysopt_ok(opt) || !value) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    pthread_mutex_lock(&g_sysopt_mu);
    *value = g_sysopt[opt];
    pthread_mutex_unlock(&g_sysopt_mu);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtCtxSetSysParamOpt(aclSysParamOpt opt, int64_t value)
{
    if (!sysopt_ok(opt) || (value != 0 && value != 1)) return ACL_ERROR_INVALID_PARAM;
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    pthread_mutex_lock(&g_sysopt_mu);
    g_ctx_sysopt[t_dev][opt] = value;
    g_ctx_sysopt_set[t_dev][opt] = 1;
    pthread_mutex_unlock(&g_sysopt_mu);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtCtxGetSysParamOpt(aclSysParamOpt opt, int64_t *value)
{
    if (!sysopt_ok(opt) || !value) return ACL_ERROR_INVALID_PARAM;
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    pthread_mutex_lock(&g_sysopt_mu);
    *value = g_ctx_sysopt_set[t_dev][opt] ? g_ctx_sysopt[t_dev][opt] : g_sysopt[opt];
    pthread_mutex_unlock(&g_sysopt_mu);
    return ACL_SUCCESS;
}
