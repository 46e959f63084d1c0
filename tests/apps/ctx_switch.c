/* ctx_switch SCENARIO: contexts and device references (tests/ctx.rs).
 *
 *   sim    the runtime's context contract: aclrtCreateContext makes the
 *          thread's context (its own default stream), aclrtSetDevice puts it
 *          back on the device's default context, aclrtDestroyContext refuses
 *          a default context and takes the context's streams with it, a
 *          thread left on a destroyed context is told so; aclsim_device_refs
 *          counts aclrtSetDevice calls not yet matched by aclrtResetDevice.
 *   cross  main fills device 0 beyond its HBM (under libu3m.so, tier mode,
 *          the first buffers go to the host), then a thread on device 1 in a
 *          context of its own (aclrtSetDevice(1) + aclrtCreateContext) fills
 *          device 1 beyond its HBM and reads it back, then copies
 *          every device-0 buffer to device 1 (u3m brings them back on device
 *          0's stream from device 1's thread) and checks after each copy that
 *          its context is still its own, and that a stream of its context
 *          still takes work; then it destroys its context and, back on
 *          device 1's default context, fills device 1 beyond its HBM and
 *          reads it all back. Prints ctx_lost, the copies verified, and the
 *          device references before the program's aclrtResetDevice calls
 *          (refs_dev0/refs_dev1: what it took, one each).
 *   shared main and a second thread both hold device 0 (aclrtSetDevice
 *          each); main fills device 0 beyond its HBM, the second thread
 *          drops its own reference (aclrtResetDevice(0)) and ends, and main,
 *          whose reference still holds the device and its memory, reads
 *          every buffer back and frees it. Prints shared_verified and
 *          refs_after_other_reset (main's one).
 *   force  main holds device 0 twice (aclrtSetDevice x2), fills it beyond
 *          its HBM, then aclrtResetDeviceForce(0) drops both references and
 *          the device's memory; an old buffer no longer reads back
 *          (old_read: the runtime's error); main sets the device again and
 *          fills it beyond its HBM once more, reading everything back.
 *          Prints refs_after_force, old_read, free_after_force (bytes
 *          aclrtGetMemInfo calls free right after the reset: all of it, for
 *          the runtime and for u3m) and force_verified.
 *   reown  a thread whose only context is one it made on device 1 fills the
 *          device beyond its HBM (u3m takes its own reference on device 1
 *          for its default context), destroys the context; main then sets
 *          device 1, fills it and leaves it allocated, resets it (the
 *          program's last reference: the runtime releases the memory),
 *          sets it again and fills it beyond its HBM once more. Prints
 *          reown_verified (the first and last fills' buffers read back) and
 *          refs_after_reset (what the runtime still counts after the
 *          program's last reset).
 * Options (cross): --buffers N (default 24) --size BYTES (default 8M). */
#include <pthread.h>
#include <string.h>
#include "acl/acl.h"
#include "common/common.h"

#define MIB (1ULL << 20)
#define SHOW(name, call) printf("%s=%d\n", name, (int)(call))

/* the simulator's reference count (not part of ACL) */
extern int aclsim_device_refs(int dev);

typedef struct other_args {
    aclrtContext ctx;
    int rc;
    pthread_barrier_t b;
} other_args;

static void *other_thread(void *p) {
    other_args *o = p;
    ACL_CHECK(aclrtSetCurrentContext(o->ctx));
    pthread_barrier_wait(&o->b);
    pthread_barrier_wait(&o->b);
    void *d = NULL;
    o->rc = aclrtMalloc(&d, 64, ACL_MEM_MALLOC_HUGE_FIRST);
    return NULL;
}

static int sim(void) {
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtSetDevice(0));
    aclrtContext def0 = NULL, cur = NULL, ctx = NULL;
    ACL_CHECK(aclrtGetCurrentContext(&def0));
    SHOW("refs_after_two_sets", aclsim_device_refs(0));
    SHOW("create_context", aclrtCreateContext(&ctx, 1));
    int32_t dev = -1;
    ACL_CHECK(aclrtGetDevice(&dev));
    ACL_CHECK(aclrtGetCurrentContext(&cur));
    SHOW("created_is_current", cur == ctx);
    SHOW("created_device", dev);
    SHOW("create_takes_no_ref", aclsim_device_refs(1) == 0);
    /* a stream of the context and its default stream take work */
    aclrtStream s = NULL;
    ACL_CHECK(aclrtCreateStream(&s));
    void *d = NULL;
    char buf[64] = "context";
    ACL_CHECK(aclrtMalloc(&d, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    SHOW("copy_on_ctx_stream", aclrtMemcpyAsync(d, 64, buf, 64, ACL_MEMCPY_HOST_TO_DEVICE, s));
    SHOW("sync_ctx_stream", aclrtSynchronizeStream(s));
    SHOW("copy_on_ctx_default_stream", aclrtMemcpyAsync(d, 64, buf, 64, ACL_MEMCPY_HOST_TO_DEVICE, NULL));
    SHOW("sync_ctx_default_stream", aclrtSynchronizeStream(NULL));
    /* device 0's default context: its streams are refused here (device 1) */
    SHOW("set_default_ctx", aclrtSetCurrentContext(def0));
    ACL_CHECK(aclrtGetDevice(&dev));
    SHOW("default_ctx_device", dev);
    SHOW("ctx_stream_from_device0", aclrtSynchronizeStream(s));
    SHOW("set_own_ctx", aclrtSetCurrentContext(ctx));
    ACL_CHECK(aclrtFree(d));
    /* aclrtSetDevice leaves the created context for the device's default */
    ACL_CHECK(aclrtSetDevice(1));
    aclrtContext def1 = NULL;
    ACL_CHECK(aclrtGetCurrentContext(&def1));
    SHOW("set_device_leaves_ctx", def1 != ctx);
    SHOW("refs_dev1", aclsim_device_refs(1));
    SHOW("destroy_default_ctx", aclrtDestroyContext(def1));
    /* a second thread on the context when it is destroyed */
    other_args o = {.ctx = ctx};
    pthread_barrier_init(&o.b, NULL, 2);
    pthread_t t;
    if (pthread_create(&t, NULL, other_thread, &o)) app_die(1, "pthread_create");
    pthread_barrier_wait(&o.b);   /* it is on ctx */
    ACL_CHECK(aclrtSetCurrentContext(ctx));
    SHOW("destroy_ctx", aclrtDestroyContext(ctx));
    SHOW("get_ctx_after_destroy", aclrtGetCurrentContext(&cur));
    pthread_barrier_wait(&o.b);   /* destroyed */
    pthread_join(t, NULL);
    SHOW("other_thread_malloc_after_destroy", o.rc);
    ACL_CHECK(aclrtSetCurrentContext(def1));
    SHOW("ctx_stream_after_destroy", aclrtSynchronizeStream(s));
    SHOW("set_destroyed_ctx", aclrtSetCurrentContext(ctx));
    SHOW("destroy_twice", aclrtDestroyContext(ctx));
    /* references: 0 twice, 1 once */
    ACL_CHECK(aclrtResetDevice(1));
    SHOW("refs_dev1_after_reset", aclsim_device_refs(1));
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtResetDevice(0));
    SHOW("refs_dev0_after_one_reset", aclsim_device_refs(0));
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclrtResetDevice(0));
    SHOW("refs_dev0_after_three_resets", aclsim_device_refs(0));
    SHOW("reset_extra", aclrtResetDevice(0));
    SHOW("refs_dev0_never_negative", aclsim_device_refs(0));
    ACL_CHECK(aclFinalize());
    return 0;
}

typedef struct cross_args {
    void **bufs;
    int n;
    size_t size;
    long verified, lost, stream_ok, before_verified, after_verified;
} cross_args;

static uint8_t expected(int i, size_t k) { return (uint8_t)(i * 37 + k * 11 + (k >> 12)); }

/* n buffers of `size` on the current device, written and read back: how
 * many came back intact */
static long fill_and_check(int n, size_t size, uint8_t *host, int seed) {
    void **b = calloc((size_t)n, sizeof *b);
    if (!b) app_die(1, "out of memory");
    long ok = 0;
    for (int i = 0; i < n; i++) {
        ACL_CHECK(aclrtMalloc(&b[i], size, ACL_MEM_MALLOC_HUGE_FIRST));
        for (size_t k = 0; k < size; k++) host[k] = expected(seed + i, k);
        ACL_CHECK(aclrtMemcpy(b[i], size, host, size, ACL_MEMCPY_HOST_TO_DEVICE));
    }
    for (int i = 0; i < n; i++) {
        ACL_CHECK(aclrtMemcpy(host, size, b[i], size, ACL_MEMCPY_DEVICE_TO_HOST));
        size_t k = 0;
        while (k < size && host[k] == expected(seed + i, k)) k++;
        if (k == size) ok++;
        ACL_CHECK(aclrtFree(b[i]));
    }
    free(b);
    return ok;
}

static void *cross_thread(void *p) {
    cross_args *a = p;
    ACL_CHECK(aclrtSetDevice(1));
    aclrtContext def1 = NULL, ctx = NULL;
    ACL_CHECK(aclrtGetCurrentContext(&def1));
    ACL_CHECK(aclrtCreateContext(&ctx, 1));
    aclrtStream s = NULL;
    ACL_CHECK(aclrtCreateStream(&s));
    void *dst = NULL;
    ACL_CHECK(aclrtMalloc(&dst, a->size, ACL_MEM_MALLOC_HUGE_FIRST));
    uint8_t *host = malloc(a->size);
    if (!host) app_die(1, "out of memory");
    /* device 1 beyond its HBM from this context first: u3m's copies on
     * device 1 start here */
    a->before_verified = fill_and_check(a->n * 2 / 3, a->size, host, 1000);
    for (int i = 0; i < a->n; i++) {
        ACL_CHECK(aclrtMemcpy(dst, a->size, a->bufs[i], a->size, ACL_MEMCPY_DEVICE_TO_DEVICE));
        aclrtContext cur = NULL;
        ACL_CHECK(aclrtGetCurrentContext(&cur));
        if (cur != ctx) {
            a->lost++;
            fprintf(stderr, "ctx_switch: after copy %d the context is %p, not the thread's %p\n", i, cur, ctx);
            ACL_CHECK(aclrtSetCurrentContext(ctx));
        }
        /* the thread's own stream takes work in its context */
        if (aclrtMemcpyAsync(host, a->size, dst, a->size, ACL_MEMCPY_DEVICE_TO_HOST, s) == 0 &&
            aclrtSynchronizeStream(s) == 0)
            a->stream_ok++;
        else
            ACL_CHECK(aclrtMemcpy(host, a->size, dst, a->size, ACL_MEMCPY_DEVICE_TO_HOST));
        size_t k = 0;
        while (k < a->size && host[k] == expected(i, k)) k++;
        if (k == a->size) a->verified++;
        else fprintf(stderr, "ctx_switch: buffer %d differs at byte %zu\n", i, k);
    }
    ACL_CHECK(aclrtFree(dst));
    ACL_CHECK(aclrtDestroyStream(s));
    ACL_CHECK(aclrtDestroyContext(ctx));
    /* back on device 1's default context: device 1 beyond its HBM (under
     * libu3m.so its copies to and from the host run on u3m's streams,
     * which must not have gone with the context) */
    ACL_CHECK(aclrtSetCurrentContext(def1));
    a->after_verified = fill_and_check(a->n * 2 / 3, a->size, host, 2000);
    free(host);
    return NULL;
}

static int cross(int argc, char **argv) {
    int n = 24;
    size_t size = 8 * MIB;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--buffers"))) n = (int)app_parse_int(v, "--buffers");
        else if ((v = app_opt(argc, argv, &i, "--size"))) size = app_parse_size(v, "--size");
        else app_die(3, "unknown option %s", argv[i]);
    }
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    void **bufs = calloc((size_t)n, sizeof *bufs);
    uint8_t *host = malloc(size);
    if (!bufs || !host) app_die(1, "out of memory");
    for (int i = 0; i < n; i++) {
        ACL_CHECK(aclrtMalloc(&bufs[i], size, ACL_MEM_MALLOC_HUGE_FIRST));
        for (size_t k = 0; k < size; k++) host[k] = expected(i, k);
        ACL_CHECK(aclrtMemcpy(bufs[i], size, host, size, ACL_MEMCPY_HOST_TO_DEVICE));
    }
    cross_args a = {bufs, n, size, 0, 0, 0, 0, 0};
    pthread_t t;
    if (pthread_create(&t, NULL, cross_thread, &a)) app_die(1, "pthread_create");
    pthread_join(t, NULL);
    /* main is still on device 0's default context */
    aclrtContext cur = NULL;
    ACL_CHECK(aclrtGetCurrentContext(&cur));
    int32_t dev = -1;
    ACL_CHECK(aclrtGetDevice(&dev));
    printf("main_device=%d\n", dev);
    printf("copies=%d verified=%ld ctx_lost=%ld stream_ok=%ld\n", n, a.verified, a.lost, a.stream_ok);
    printf("in_ctx_verified=%ld after_destroy_verified=%ld\n", a.before_verified, a.after_verified);
    /* what the program took: one reference on each device */
    printf("refs_dev0=%d refs_dev1=%d\n", aclsim_device_refs(0), aclsim_device_refs(1));
    for (int i = 0; i < n; i++) ACL_CHECK(aclrtFree(bufs[i]));
    free(bufs);
    free(host);
    ACL_CHECK(aclrtResetDevice(1));
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return 0;
}

/* A thread whose only context is one it made on device 1 (no
 * aclrtSetDevice at all) fills device 1 beyond its HBM: its memory is device
 * 1's (under libu3m.so too: u3m must know the thread's device from the
 * context; ACLSIM_STATS shows each device's peak). */
/* 16 buffers of 8 MiB filled and read back by a thread whose only context
 * is one it made on device 1 (destroyed after); the buffers verified. */
static long fill_in_made_context(uint8_t *host, int seed) {
    aclrtContext ctx = NULL;
    ACL_CHECK(aclrtCreateContext(&ctx, 1));
    long ok = fill_and_check(16, 8 * MIB, host, seed);
    ACL_CHECK(aclrtDestroyContext(ctx));
    return ok;
}

static int created(void) {
    ACL_CHECK(aclInit(NULL));
    uint8_t *host = malloc(8 * MIB);
    if (!host) app_die(1, "out of memory");
    printf("created_verified=%ld\n", fill_in_made_context(host, 3000));
    free(host);
    ACL_CHECK(aclFinalize());
    return 0;
}

static void *shared_thread(void *p) {
    int *rc = p;
    ACL_CHECK(aclrtSetDevice(0));
    void *d = NULL;
    ACL_CHECK(aclrtMalloc(&d, 4 * MIB, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemset(d, 4 * MIB, 7, 4 * MIB));
    ACL_CHECK(aclrtFree(d));
    *rc = aclrtResetDevice(0);
    return NULL;
}

static int shared(void) {
    const int n = 24;
    const size_t size = 8 * MIB;
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    void *bufs[24];
    uint8_t *host = malloc(size);
    if (!host) app_die(1, "out of memory");
    for (int i = 0; i < n; i++) {
        ACL_CHECK(aclrtMalloc(&bufs[i], size, ACL_MEM_MALLOC_HUGE_FIRST));
        for (size_t k = 0; k < size; k++) host[k] = expected(4000 + i, k);
        ACL_CHECK(aclrtMemcpy(bufs[i], size, host, size, ACL_MEMCPY_HOST_TO_DEVICE));
    }
    int rc = -1;
    pthread_t t;
    if (pthread_create(&t, NULL, shared_thread, &rc)) app_die(1, "pthread_create");
    pthread_join(t, NULL);
    printf("other_reset=%d refs_after_other_reset=%d\n", rc, aclsim_device_refs(0));
    long ok = 0;
    for (int i = 0; i < n; i++) {
        aclError e = aclrtMemcpy(host, size, bufs[i], size, ACL_MEMCPY_DEVICE_TO_HOST);
        size_t k = 0;
        while (e == ACL_SUCCESS && k < size && host[k] == expected(4000 + i, k)) k++;
        if (e == ACL_SUCCESS && k == size) ok++;
        else fprintf(stderr, "ctx_switch: buffer %d: copy %d, differs at byte %zu\n", i, (int)e, k);
        if (aclrtFree(bufs[i]) != ACL_SUCCESS) fprintf(stderr, "ctx_switch: free of buffer %d failed\n", i);
    }
    printf("shared_verified=%ld\n", ok);
    free(host);
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return 0;
}

static int force(void) {
    const int n = 24;
    const size_t size = 8 * MIB;
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtSetDevice(0));
    void *bufs[24];
    uint8_t *host = malloc(size);
    if (!host) app_die(1, "out of memory");
    for (int i = 0; i < n; i++) {
        ACL_CHECK(aclrtMalloc(&bufs[i], size, ACL_MEM_MALLOC_HUGE_FIRST));
        for (size_t k = 0; k < size; k++) host[k] = expected(5000 + i, k);
        ACL_CHECK(aclrtMemcpy(bufs[i], size, host, size, ACL_MEMCPY_HOST_TO_DEVICE));
    }
    size_t free0 = 0, total0 = 0;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free0, &total0));
    ACL_CHECK(aclrtResetDeviceForce(0));
    printf("refs_after_force=%d\n", aclsim_device_refs(0));
    ACL_CHECK(aclrtSetDevice(0));
    size_t free1 = 0, total1 = 0;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total1));
    printf("used_before_force=%zu free_after_force=%zu total=%zu\n", total0 - free0, free1, total1);
    /* the old buffers' memory is gone: a read is refused (first and last:
     * one u3m had on the host, one it had in HBM) */
    int first = (int)aclrtMemcpy(host, size, bufs[0], size, ACL_MEMCPY_DEVICE_TO_HOST);
    int last = (int)aclrtMemcpy(host, size, bufs[n - 1], size, ACL_MEMCPY_DEVICE_TO_HOST);
    printf("old_read=%d,%d\n", first, last);
    printf("force_verified=%ld\n", fill_and_check(n, size, host, 6000));
    free(host);
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return 0;
}

static int reown(void) {
    ACL_CHECK(aclInit(NULL));
    uint8_t *host = malloc(8 * MIB);
    if (!host) app_die(1, "out of memory");
    long ok = fill_in_made_context(host, 7000);
    ACL_CHECK(aclrtSetDevice(1));
    /* left allocated: the reset releases them */
    for (int i = 0; i < 16; i++) {
        void *d = NULL;
        ACL_CHECK(aclrtMalloc(&d, 8 * MIB, ACL_MEM_MALLOC_HUGE_FIRST));
        ACL_CHECK(aclrtMemset(d, 8 * MIB, i, 8 * MIB));
    }
    ACL_CHECK(aclrtResetDevice(1));
    printf("refs_after_reset=%d\n", aclsim_device_refs(1));
    ACL_CHECK(aclrtSetDevice(1));
    ok += fill_and_check(16, 8 * MIB, host, 7200);
    printf("reown_verified=%ld\n", ok);
    free(host);
    ACL_CHECK(aclrtResetDevice(1));
    ACL_CHECK(aclFinalize());
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "sim")) return sim();
    if (argc >= 2 && !strcmp(argv[1], "cross")) return cross(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "created")) return created();
    if (argc >= 2 && !strcmp(argv[1], "shared")) return shared();
    if (argc >= 2 && !strcmp(argv[1], "force")) return force();
    if (argc >= 2 && !strcmp(argv[1], "reown")) return reown();
    app_die(3, "usage: ctx_switch sim|cross|created|shared [--buffers N] [--size BYTES]");
}
