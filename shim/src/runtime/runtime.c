/* libruntime.so stand-in: the low-level rt* kernel-launch entry points that
 * libtorch_npu.so imports (its inductor/MLIR path launches compiled device
 * kernels through them). On CANN they live in libruntime.so, a dependency of
 * libascendcl.so; here too. The simulator cannot run device kernel binaries,
 * so every call returns the runtime's "feature not supported" code
 * (ACL_ERROR_RT_FEATURE_NOT_SUPPORT, 207000 — rt* calls return the same
 * external codes as aclrt*). Nothing here touches the simulated device. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define RT_API __attribute__((visibility("default")))
typedef int32_t rtError_t;
#define RT_FEATURE_NOT_SUPPORT 207000
#define RT_PARAM_INVALID 107000

/* one stderr line per entry point, prefixed like every simulator message */
static void say_once(int *said, const char *api)
{
    if (__atomic_exchange_n(said, 1, __ATOMIC_RELAXED)) return;
    char buf[256];
    int n = snprintf(buf, sizeof buf, "aclsim: %s: device kernel binaries are not supported by the simulator -> %d\n",
                     api, RT_FEATURE_NOT_SUPPORT);
    if (n > 0) { ssize_t r = write(2, buf, (size_t)n); (void)r; }
}

#define UNSUPPORTED(api) do { static int said_; say_once(&said_, api); return RT_FEATURE_NOT_SUPPORT; } while (0)

/* rtError_t rtDevBinaryRegister(const rtDevBinary_t *bin, void **hdl) */
RT_API rtError_t rtDevBinaryRegister(const void *bin, void **hdl)
{
    if (!bin || !hdl) return RT_PARAM_INVALID;
    UNSUPPORTED("rtDevBinaryRegister");
}

/* rtError_t rtFunctionRegister(void *binHandle, const void *stubFunc, const char *stubName,
 *                              const void *kernelInfoExt, uint32_t funcMode) */
RT_API rtError_t rtFunctionRegister(void *binHandle, const void *stubFunc, const char *stubName,
    const void *kernelInfoExt, uint32_t funcMode)
{
    if (!binHandle || !stubFunc || !stubName) return RT_PARAM_INVALID;
    UNSUPPORTED("rtFunctionRegister");
}

/* rtError_t rtKernelLaunch(const void *stubFunc, uint32_t blockDim, void *args, uint32_t argsSize,
 *                          rtSmDesc_t *smDesc, rtStream_t stm) */
RT_API rtError_t rtKernelLaunch(const void *stubFunc, uint32_t blockDim, void *args, uint32_t argsSize,
    void *smDesc, void *stm)
{
    if (!stubFunc) return RT_PARAM_INVALID;
    UNSUPPORTED("rtKernelLaunch");
}

/* rtError_t rtGetC2cCtrlAddr(uint64_t *addr, uint32_t *len): the chip-to-chip
 * control block used by fused communication kernels */
RT_API rtError_t rtGetC2cCtrlAddr(uint64_t *addr, uint32_t *len)
{
    if (!addr || !len) return RT_PARAM_INVALID;
    UNSUPPORTED("rtGetC2cCtrlAddr");
}
