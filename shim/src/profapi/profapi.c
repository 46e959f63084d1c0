/* libprofapi.so stand-in: the Msprof* reporting interface (CANN
 * profiling/aprof_pub.h) that libtorch_npu.so and libnpu_profiler.so import.
 * On CANN, libprofapi.so is a dependency of libascendcl.so; here too.
 *
 * The simulator has no profiler: collection is never started (aclprof* are
 * not provided, so torch_npu.profiler cannot start one), and reports made
 * while nothing collects are dropped with success — what the real library
 * does while profiling is off. Registered callbacks are kept but never
 * invoked (no profiling command ever arrives). Hash ids and the cycle clock
 * are real. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define MSVP_PROF_API __attribute__((visibility("default")))
#define MSPROF_ERROR_NONE 0
#define MSPROF_ERROR (-1)

typedef int32_t (*ProfCommandHandle)(uint32_t type, void *data, uint32_t len);

#define MAX_MODULES 64
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { uint32_t module; ProfCommandHandle fn; } g_cb[MAX_MODULES];
static int g_ncb;

MSVP_PROF_API int32_t MsprofRegisterCallback(uint32_t moduleId, ProfCommandHandle handle)
{
    if (!handle) return MSPROF_ERROR;
    pthread_mutex_lock(&g_mu);
    int i;
    for (i = 0; i < g_ncb && g_cb[i].module != moduleId; i++) {}
    if (i == MAX_MODULES) { pthread_mutex_unlock(&g_mu); return MSPROF_ERROR; }
    g_cb[i].module = moduleId;
    g_cb[i].fn = handle;
    if (i == g_ncb) g_ncb++;
    pthread_mutex_unlock(&g_mu);
    return MSPROF_ERROR_NONE;
}

/* struct MsprofApi is opaque here: nothing is collected */
MSVP_PROF_API int32_t MsprofReportApi(uint32_t nonPersistantFlag, const void *api)
{
    return api ? MSPROF_ERROR_NONE : MSPROF_ERROR;
}

MSVP_PROF_API int32_t MsprofReportCompactInfo(uint32_t nonPersistantFlag, const void *data, uint32_t length)
{
    return data && length ? MSPROF_ERROR_NONE : MSPROF_ERROR;
}

MSVP_PROF_API int32_t MsprofReportAdditionalInfo(uint32_t nonPersistantFlag, const void *data, uint32_t length)
{
    return data && length ? MSPROF_ERROR_NONE : MSPROF_ERROR;
}

/* A stable 64-bit id for a string (FNV-1a): equal strings, equal ids. */
MSVP_PROF_API uint64_t MsprofGetHashId(const char *hashInfo, size_t length)
{
    if (!hashInfo) return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < length; i++) {
        h ^= (unsigned char)hashInfo[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* The profiler's timestamp source: a monotonic clock in nanoseconds. */
MSVP_PROF_API uint64_t MsprofSysCycleTime(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
