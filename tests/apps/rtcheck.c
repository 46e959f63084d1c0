/* rtcheck SCENARIO: exercises the simulated runtime's core contract (error
 * codes, capacity, asynchrony, events, fault injection, MMU faults, phantom
 * mode) and prints one "name=value" fact per check; tests/sim_runtime.rs
 * asserts them. Scenarios: errors capacity race events faults lose mmu phantom. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#include "acl/acl.h"
#include "common/common.h"

#define SHOW(name, call) printf("%s=%d\n", name, (int)(call))
#define MIB (1ULL << 20)

static void sleep_ms(void *arg) { usleep((useconds_t)(uintptr_t)arg * 1000); }

static void init_dev(int dev) {
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(dev));
}

static int errors(void) {
    void *p = NULL;
    SHOW("malloc_before_init", aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    SHOW("finalize_before_init", aclFinalize());
    SHOW("init", aclInit(NULL));
    SHOW("init_again", aclInit(NULL));
    SHOW("malloc_no_device", aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    int32_t dev = -1;
    SHOW("get_device_none", aclrtGetDevice(&dev));
    SHOW("set_device_out_of_range", aclrtSetDevice(99));
    SHOW("set_device", aclrtSetDevice(0));
    SHOW("malloc_null_out", aclrtMalloc(NULL, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    SHOW("malloc_size0", aclrtMalloc(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST));
    SHOW("malloc_bad_policy", aclrtMalloc(&p, 64, (aclrtMemMallocPolicy)77));
    SHOW("malloc_absurd", aclrtMalloc(&p, (size_t)1 << 62, ACL_MEM_MALLOC_HUGE_FIRST));
    SHOW("malloc", aclrtMalloc(&p, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    char host[64];
    SHOW("free_null", aclrtFree(NULL));
    SHOW("free_interior", aclrtFree((char *)p + 64));
    SHOW("free_host_ptr", aclrtFree(host));
    SHOW("memcpy_count_gt_destmax", aclrtMemcpy(p, 16, host, 64, ACL_MEMCPY_HOST_TO_DEVICE));
    SHOW("memcpy_wrong_kind", aclrtMemcpy(p, 64, host, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    SHOW("memcpy_bad_kind", aclrtMemcpy(p, 64, host, 64, (aclrtMemcpyKind)42));
    SHOW("memcpy_null_dst", aclrtMemcpy(NULL, 64, host, 64, ACL_MEMCPY_HOST_TO_DEVICE));
    SHOW("memcpy_default_kind", aclrtMemcpy(p, 64, host, 64, ACL_MEMCPY_DEFAULT));
    SHOW("memset_count_gt_max", aclrtMemset(p, 16, 0, 64));
    SHOW("memset_host_ptr", aclrtMemset(host, 64, 0, 64));
    SHOW("free", aclrtFree(p));
    SHOW("free_twice", aclrtFree(p));
    aclrtStream s;
    SHOW("create_stream", aclrtCreateStream(&s));
    SHOW("destroy_stream", aclrtDestroyStream(s));
    SHOW("sync_destroyed_stream", aclrtSynchronizeStream(s));
    SHOW("sync_bogus_stream", aclrtSynchronizeStream((aclrtStream)host));
    aclrtEvent e;
    SHOW("create_event", aclrtCreateEvent(&e));
    SHOW("destroy_event", aclrtDestroyEvent(e));
    SHOW("record_destroyed_event", aclrtRecordEvent(e, NULL));
    SHOW("host_func_null", aclrtLaunchHostFunc(NULL, NULL, NULL));
    SHOW("reserve_expect_ptr", aclrtReserveMemAddress(&p, 2 * MIB, 0, host, 0));
    SHOW("reserve_alignment", aclrtReserveMemAddress(&p, 2 * MIB, 4096, NULL, 0));
    SHOW("map_bogus_handle", aclrtMapMem((void *)0x1000, 2 * MIB, 0, (aclrtDrvMemHandle)host, 0));
    SHOW("free_physical_bogus", aclrtFreePhysical((aclrtDrvMemHandle)host));
    SHOW("unmap_not_mapped", aclrtUnmapMem(host));
    size_t fr, tot;
    SHOW("meminfo_null", aclrtGetMemInfo(ACL_HBM_MEM, NULL, &tot));
    SHOW("meminfo", aclrtGetMemInfo(ACL_HBM_MEM, &fr, &tot));
    SHOW("finalize", aclFinalize());
    SHOW("finalize_again", aclFinalize());
    SHOW("malloc_after_finalize", aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    return 0;
}

/* Fill the device with 16 MiB allocations until 207001. */
static int capacity(void) {
    init_dev(0);
    size_t fr, tot;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &fr, &tot));
    printf("total=%zu free_before=%zu\n", tot, fr);
    void *ptrs[4096];
    int n = 0, rc = 0;
    while (n < 4096 && (rc = aclrtMallocAlign32(&ptrs[n], 16 * MIB, ACL_MEM_MALLOC_HUGE_FIRST)) == 0) n++;
    printf("allocated=%d fail_code=%d\n", n, rc);
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &fr, &tot));
    printf("free_full=%zu\n", fr);
    ACL_CHECK(aclrtFree(ptrs[--n]));
    SHOW("realloc_after_free", aclrtMallocAlign32(&ptrs[n], 16 * MIB, ACL_MEM_MALLOC_HUGE_FIRST));
    /* aclrtMalloc pads by 32 bytes: exactly 16 MiB then needs one more 2 MiB page */
    ACL_CHECK(aclrtFree(ptrs[n]));
    void *q;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &fr, &tot));
    uint64_t before = tot - fr;
    ACL_CHECK(aclrtMalloc(&q, 2 * MIB, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &fr, &tot));
    printf("malloc_2m_physical=%llu\n", (unsigned long long)(tot - fr - before));
    ACL_CHECK(aclFinalize());
    return 0;
}

/* Work is asynchronous: without a synchronize the host sees stale data. */
static int race(void) {
    init_dev(0);
    aclrtStream s;
    ACL_CHECK(aclrtCreateStream(&s));
    void *d;
    ACL_CHECK(aclrtMalloc(&d, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    char src[4096], out[4096];
    memset(src, 0x5a, sizeof src);
    ACL_CHECK(aclrtLaunchHostFunc(s, sleep_ms, (void *)(uintptr_t)200));
    ACL_CHECK(aclrtMemcpyAsync(d, 4096, src, 4096, ACL_MEMCPY_HOST_TO_DEVICE, s));
    aclrtStreamStatus st;
    ACL_CHECK(aclrtStreamQuery(s, &st));
    printf("query_while_busy=%d\n", (int)st);
    ACL_CHECK(aclrtMemcpy(out, 4096, d, 4096, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("unsynchronised_read=%d\n", out[0]);
    ACL_CHECK(aclrtSynchronizeStream(s));
    ACL_CHECK(aclrtStreamQuery(s, &st));
    printf("query_after_sync=%d\n", (int)st);
    ACL_CHECK(aclrtMemcpy(out, 4096, d, 4096, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("synchronised_read=%d\n", out[0]);
    ACL_CHECK(aclFinalize());
    return 0;
}

/* Stream B waits on an event recorded on stream A after slow work. */
static int events(void) {
    init_dev(0);
    aclrtStream a, b;
    ACL_CHECK(aclrtCreateStream(&a));
    ACL_CHECK(aclrtCreateStream(&b));
    void *x, *y;
    ACL_CHECK(aclrtMalloc(&x, 8 * MIB, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMalloc(&y, 8 * MIB, ACL_MEM_MALLOC_HUGE_FIRST));
    aclrtEvent start, done, never;
    ACL_CHECK(aclrtCreateEvent(&start));
    ACL_CHECK(aclrtCreateEvent(&done));
    ACL_CHECK(aclrtCreateEvent(&never));
    ACL_CHECK(aclrtRecordEvent(start, a));
    ACL_CHECK(aclrtLaunchHostFunc(a, sleep_ms, (void *)(uintptr_t)150));
    ACL_CHECK(aclrtMemsetAsync(x, 8 * MIB, 5, 8 * MIB, a));
    ACL_CHECK(aclrtRecordEvent(done, a));
    aclrtEventRecordedStatus es;
    ACL_CHECK(aclrtQueryEventStatus(done, &es));
    printf("event_status_before=%d\n", (int)es);
    ACL_CHECK(aclrtStreamWaitEvent(b, done));
    ACL_CHECK(aclrtStreamWaitEvent(b, never));   /* never recorded: no wait */
    ACL_CHECK(aclrtMemcpyAsync(y, 8 * MIB, x, 8 * MIB, ACL_MEMCPY_DEVICE_TO_DEVICE, b));
    ACL_CHECK(aclrtSynchronizeStream(b));
    unsigned char out[16];
    ACL_CHECK(aclrtMemcpy(out, 16, (char *)y + 8 * MIB - 16, 16, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("ordered_value=%d\n", out[15]);
    ACL_CHECK(aclrtQueryEventStatus(done, &es));
    printf("event_status_after=%d\n", (int)es);
    float ms = -1;
    ACL_CHECK(aclrtEventElapsedTime(&ms, start, done));
    /* 8 MiB memset at the preset HBM bandwidth plus launch latency */
    printf("elapsed_sim_us=%.3f\n", ms * 1000.0);
    SHOW("elapsed_unrecorded", aclrtEventElapsedTime(&ms, start, never));
    ACL_CHECK(aclrtSynchronizeEvent(done));
    ACL_CHECK(aclFinalize());
    return 0;
}

/* The simulator's two real-time rules, counted in its statistics: stream B
 * waits on an event whose record on stream A sits behind a host function
 * that runs 2.5 s of real time; a query of B's later event waits for the
 * device, which makes no progress, and answers NOT_READY after a second
 * (query_giveups); B's wait parks after a second (wait_parks). */
static int realtime(void) {
    init_dev(0);
    aclrtStream a, b;
    ACL_CHECK(aclrtCreateStream(&a));
    ACL_CHECK(aclrtCreateStream(&b));
    aclrtEvent on_a, on_b;
    ACL_CHECK(aclrtCreateEvent(&on_a));
    ACL_CHECK(aclrtCreateEvent(&on_b));
    ACL_CHECK(aclrtLaunchHostFunc(a, sleep_ms, (void *)(uintptr_t)2500));
    ACL_CHECK(aclrtRecordEvent(on_a, a));
    ACL_CHECK(aclrtStreamWaitEvent(b, on_a));
    ACL_CHECK(aclrtRecordEvent(on_b, b));
    aclrtEventRecordedStatus es;
    ACL_CHECK(aclrtQueryEventStatus(on_b, &es));
    printf("query_while_stuck=%d\n", (int)es);
    ACL_CHECK(aclrtSynchronizeStream(b));
    ACL_CHECK(aclrtQueryEventStatus(on_b, &es));
    printf("query_after_sync=%d\n", (int)es);
    ACL_CHECK(aclFinalize());
    return 0;
}

/* Calls each fault-injection site twice; ACLSIM_FAULTS decides which fail. */
static int faults(void) {
    init_dev(0);
    void *a, *b, *h;
    SHOW("malloc1", aclrtMalloc(&a, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    SHOW("malloc2", aclrtMalloc(&b, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    SHOW("host1", aclrtMallocHost(&h, 4096));
    char buf[4096] = {1};
    SHOW("copy1", aclrtMemcpy(a, 4096, buf, 4096, ACL_MEMCPY_HOST_TO_DEVICE));
    SHOW("copy2", aclrtMemcpyAsync(a, 4096, buf, 4096, ACL_MEMCPY_HOST_TO_DEVICE, NULL));
    SHOW("memset1", aclrtMemset(a, 4096, 0, 4096));
    SHOW("memset2", aclrtMemsetAsync(a, 4096, 0, 4096, NULL));
    aclrtPhysicalMemProp prop = {0};
    prop.memAttr = ACL_HBM_MEM_HUGE;
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    aclrtDrvMemHandle h1 = NULL, h2 = NULL;
    SHOW("phys1", aclrtMallocPhysical(&h1, 2 * MIB, &prop, 0));
    SHOW("phys2", aclrtMallocPhysical(&h2, 2 * MIB, &prop, 0));
    void *va;
    ACL_CHECK(aclrtReserveMemAddress(&va, 4 * MIB, 0, NULL, 0));
    if (h1) SHOW("map1", aclrtMapMem(va, 2 * MIB, 0, h1, 0));
    SHOW("sync", aclrtSynchronizeStream(NULL));
    ACL_CHECK(aclFinalize());
    return 0;
}

/* Device 1 disappears (ACLSIM_FAULTS=lose:1@N); device 0 keeps working. */
static int lose(void) {
    ACL_CHECK(aclInit(NULL));
    void *d0, *d1;
    char buf[4096] = {3};
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtMalloc(&d0, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtSetDevice(1));
    ACL_CHECK(aclrtMalloc(&d1, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    for (int i = 1; i <= 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "dev1_copy%d", i);
        SHOW(name, aclrtMemcpy(d1, 4096, buf, 4096, ACL_MEMCPY_HOST_TO_DEVICE));
    }
    void *x;
    SHOW("dev1_malloc_after", aclrtMalloc(&x, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    SHOW("dev1_sync_after", aclrtSynchronizeDevice());
    SHOW("dev1_set_after", aclrtSetDevice(1));
    ACL_CHECK(aclrtSetDevice(0));
    SHOW("dev0_copy", aclrtMemcpy(d0, 4096, buf, 4096, ACL_MEMCPY_HOST_TO_DEVICE));
    char out[4096];
    SHOW("dev0_read", aclrtMemcpy(out, 4096, d0, 4096, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("dev0_value=%d\n", out[0]);
    ACL_CHECK(aclFinalize());
    return 0;
}

/* Use after free: an MMU fault, reported by the stream, counted in stats. */
static int mmu(void) {
    init_dev(0);
    void *d;
    ACL_CHECK(aclrtMalloc(&d, 4 * MIB, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtFree(d));
    char buf[64];
    SHOW("async_enqueue", aclrtMemcpyAsync(buf, 64, (char *)d + 100, 64, ACL_MEMCPY_DEVICE_TO_HOST, NULL));
    SHOW("sync_reports", aclrtSynchronizeStream(NULL));
    SHOW("sync_cleared", aclrtSynchronizeStream(NULL));
    SHOW("sync_copy", aclrtMemcpy(buf, 64, (char *)d, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    ACL_CHECK(aclFinalize());
    return 0;
}

/* A 20 GiB device footprint with copies, in phantom mode. */
static int phantom(void) {
    init_dev(0);
    enum { N = 20 };
    void *d[N], *h;
    ACL_CHECK(aclrtMallocHost(&h, 1ULL << 30));
    for (int i = 0; i < N; i++) {
        ACL_CHECK(aclrtMalloc(&d[i], 1ULL << 30, ACL_MEM_MALLOC_HUGE_FIRST));
        ACL_CHECK(aclrtMemcpyAsync(d[i], 1ULL << 30, h, 1ULL << 30, ACL_MEMCPY_HOST_TO_DEVICE, NULL));
    }
    ACL_CHECK(aclrtSynchronizeStream(NULL));
    size_t fr, tot;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &fr, &tot));
    printf("used=%zu\n", tot - fr);
    printf("peak_rss_kb=%ld\n", app_peak_rss_kb());
    for (int i = 0; i < N; i++) ACL_CHECK(aclrtFree(d[i]));
    ACL_CHECK(aclFinalize());
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) app_die(3, "usage: rtcheck errors|capacity|race|events|realtime|faults|lose|mmu|phantom");
    const char *s = argv[1];
    if (!strcmp(s, "errors")) return errors();
    if (!strcmp(s, "capacity")) return capacity();
    if (!strcmp(s, "race")) return race();
    if (!strcmp(s, "events")) return events();
    if (!strcmp(s, "realtime")) return realtime();
    if (!strcmp(s, "faults")) return faults();
    if (!strcmp(s, "lose")) return lose();
    if (!strcmp(s, "mmu")) return mmu();
    if (!strcmp(s, "phantom")) return phantom();
    app_die(3, "unknown scenario '%s'", s);
}
