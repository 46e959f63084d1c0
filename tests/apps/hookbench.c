/* hookbench [--iters N] [--threads T] [--case NAME[,NAME...]] [--warmup N] [--per-iter] [--list]
 *
 * Calls one hooked ACL function (or one small fixed sequence) N times in a
 * tight loop and prints what each iteration cost. It knows nothing of u3m:
 * bench/hooks.sh runs it with and without LD_PRELOAD=libu3m.so (the
 * difference is what u3m adds) and under callgrind (instructions). Not a test.
 *
 * Cases (one iteration each):
 *   malloc_free_small  aclrtMalloc(64 KiB) + aclrtFree                 2 calls
 *   malloc_free_large  aclrtMalloc(8 MiB) + aclrtFree                  2 calls
 *   memcpy_h2d         aclrtMemcpyAsync 256 B pinned host -> device    1 call, 1 range
 *   memcpy_d2d         aclrtMemcpyAsync 256 B device -> device         1 call, 2 ranges
 *   memset             aclrtMemsetAsync 256 B                          1 call, 1 range
 *   memcpy_h2d_sync    aclrtMemcpy, as memcpy_h2d                      1 call, 1 range
 *   memcpy_d2d_sync    aclrtMemcpy, as memcpy_d2d                      1 call, 2 ranges
 *   memset_sync        aclrtMemset, as memset                          1 call, 1 range
 *   aclop_1|4|16       aclopExecuteV2("ConcatD") with 1, 4 or 16 data
 *                      buffers (k-1 inputs, 1 output), 64 KiB each,
 *                      carved out of one 32 MiB allocation             1 call, k ranges
 *   aclnn_add          3 x aclCreateTensor (64 KiB each), aclCreateScalar,
 *                      aclnnAddGetWorkspaceSize, aclnnAdd (reached through
 *                      dlopen + dlsym, torch_npu's way), 3 x aclDestroyTensor,
 *                      aclDestroyScalar                                7 hooked calls, 3 ranges
 *
 * The synchronous variants run on the calling thread only (the simulator's
 * asynchronous calls also wake a stream worker, whose cost varies from call
 * to call by more than u3m adds). With --threads T each thread sets the
 * device, creates its own stream and its own buffers, and runs the same loop
 * after a barrier. Every 256 iterations the thread synchronises its stream,
 * so queues stay short (the synchronisation is part of every arm's figure
 * alike, and outside the per-iteration samples below).
 *
 * Output, one line per case (stdout):
 *   case=<name> threads=<T> iters=<N> calls_per_iter=<c> ranges_per_iter=<r>
 *   wall_ns_per_iter=<mean over threads> cpu_ns_per_iter=<mean over threads>
 *   wall_ns_max=<slowest thread> [p50_ns_per_iter=<median iteration>]
 * wall = CLOCK_MONOTONIC around the loop; cpu = CLOCK_THREAD_CPUTIME_ID, i.e.
 * the calling thread's own CPU time (excludes time descheduled, which at 8
 * threads on a small machine dominates wall time). With --per-iter, every
 * iteration is also timed on its own (CLOCK_MONOTONIC, the cost of reading
 * the clock subtracted) and p50 is the median over all threads' iterations:
 * insensitive to the occasional wake-up, preemption or synchronisation.
 *
 * The measured loop runs inside hb_measure (never inlined; the warm-up calls
 * the loop directly), so `valgrind --tool=callgrind --collect-atstart=no
 * --toggle-collect=hb_measure` counts exactly the calling threads'
 * instructions inside the measured loops: run one case per valgrind run. */
#include "acl/acl.h"
#include "aclnnop/aclnn_ops.h"
#include "common/common.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#define NOINLINE __attribute__((noinline, noclone))
#define SYNC_EVERY 256
#define RANGE_BYTES (64u << 10)
#define POOL_BYTES (32u << 20)
#define SMALL_COPY 256
#define MAX_K 16

typedef aclnnStatus (*ws_fn)(const aclTensor *, const aclTensor *, const aclScalar *, aclTensor *, uint64_t *,
                             aclOpExecutor **);
typedef aclnnStatus (*exec_fn)(void *, uint64_t, aclOpExecutor *, aclrtStream);
static ws_fn g_add_ws;
static exec_fn g_add;

/* Per-thread state: created before the barrier, outside the measured loop. */
typedef struct ctx {
    double *samples;            /* per-iteration ns (--per-iter), NULL in warm-up */
    aclrtStream stream;
    char *pool;                 /* device, POOL_BYTES */
    char *dev2;                 /* device, SMALL_COPY (copy/memset target) */
    void *host;                 /* pinned host, SMALL_COPY */
    aclTensorDesc *desc[MAX_K];
    aclDataBuffer *buf[MAX_K];
} ctx;

static void sync_every(ctx *c, long long i)
{
    if ((i & (SYNC_EVERY - 1)) == SYNC_EVERY - 1) ACL_CHECK(aclrtSynchronizeStream(c->stream));
}

static inline double mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* Per-iteration timing around the hooked calls only (not the periodic
 * synchronisation); a no-op branch unless --per-iter. */
#define ITER_BEGIN(c) double t0_ = (c)->samples ? mono_ns() : 0
#define ITER_END(c, i) do { if ((c)->samples) (c)->samples[i] = mono_ns() - t0_; } while (0)

/* ---------------------------------------------------------- the loops */

static NOINLINE void malloc_free(ctx *c, long long n, size_t bytes)
{
    for (long long i = 0; i < n; i++) {
        void *p = NULL;
        ITER_BEGIN(c);
        ACL_CHECK(aclrtMalloc(&p, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
        ACL_CHECK(aclrtFree(p));
        ITER_END(c, i);
    }
}

static NOINLINE void loop_malloc_free_small(ctx *c, long long n) { malloc_free(c, n, 64u << 10); }
static NOINLINE void loop_malloc_free_large(ctx *c, long long n) { malloc_free(c, n, 8u << 20); }

static NOINLINE void loop_memcpy_h2d(ctx *c, long long n)
{
    for (long long i = 0; i < n; i++) {
        ITER_BEGIN(c);
        ACL_CHECK(aclrtMemcpyAsync(c->dev2, SMALL_COPY, c->host, SMALL_COPY, ACL_MEMCPY_HOST_TO_DEVICE, c->stream));
        ITER_END(c, i);
        sync_every(c, i);
    }
}

static NOINLINE void loop_memcpy_d2d(ctx *c, long long n)
{
    for (long long i = 0; i < n; i++) {
        ITER_BEGIN(c);
        ACL_CHECK(aclrtMemcpyAsync(c->dev2, SMALL_COPY, c->pool, SMALL_COPY, ACL_MEMCPY_DEVICE_TO_DEVICE, c->stream));
        ITER_END(c, i);
        sync_every(c, i);
    }
}

static NOINLINE void loop_memset(ctx *c, long long n)
{
    for (long long i = 0; i < n; i++) {
        ITER_BEGIN(c);
        ACL_CHECK(aclrtMemsetAsync(c->dev2, SMALL_COPY, (int32_t)(i & 0xff), SMALL_COPY, c->stream));
        ITER_END(c, i);
        sync_every(c, i);
    }
}

static NOINLINE void loop_memcpy_h2d_sync(ctx *c, long long n)
{
    for (long long i = 0; i < n; i++) {
        ITER_BEGIN(c);
        ACL_CHECK(aclrtMemcpy(c->dev2, SMALL_COPY, c->host, SMALL_COPY, ACL_MEMCPY_HOST_TO_DEVICE));
        ITER_END(c, i);
    }
}

static NOINLINE void loop_memcpy_d2d_sync(ctx *c, long long n)
{
    for (long long i = 0; i < n; i++) {
        ITER_BEGIN(c);
        ACL_CHECK(aclrtMemcpy(c->dev2, SMALL_COPY, c->pool, SMALL_COPY, ACL_MEMCPY_DEVICE_TO_DEVICE));
        ITER_END(c, i);
    }
}

static NOINLINE void loop_memset_sync(ctx *c, long long n)
{
    for (long long i = 0; i < n; i++) {
        ITER_BEGIN(c);
        ACL_CHECK(aclrtMemset(c->dev2, SMALL_COPY, (int32_t)(i & 0xff), SMALL_COPY));
        ITER_END(c, i);
    }
}

static NOINLINE void aclop(ctx *c, long long n, int k)
{
    for (long long i = 0; i < n; i++) {
        /* k-1 inputs, 1 output (the last buffer) */
        ITER_BEGIN(c);
        ACL_CHECK(aclopExecuteV2("ConcatD", k - 1, c->desc, c->buf, 1, &c->desc[k - 1], &c->buf[k - 1], NULL,
                                 c->stream));
        ITER_END(c, i);
        sync_every(c, i);
    }
}

static NOINLINE void loop_aclop_1(ctx *c, long long n) { aclop(c, n, 1); }
static NOINLINE void loop_aclop_4(ctx *c, long long n) { aclop(c, n, 4); }
static NOINLINE void loop_aclop_16(ctx *c, long long n) { aclop(c, n, 16); }

static NOINLINE void loop_aclnn_add(ctx *c, long long n)
{
    const int64_t elems = RANGE_BYTES / 4, strides[1] = { 1 };
    const int64_t dims[1] = { elems };
    float alpha = 1.0f;
    for (long long i = 0; i < n; i++) {
        ITER_BEGIN(c);
        aclTensor *a = aclCreateTensor(dims, 1, ACL_FLOAT, strides, 0, ACL_FORMAT_ND, dims, 1, c->pool);
        aclTensor *b = aclCreateTensor(dims, 1, ACL_FLOAT, strides, 0, ACL_FORMAT_ND, dims, 1, c->pool + RANGE_BYTES);
        aclTensor *y = aclCreateTensor(dims, 1, ACL_FLOAT, strides, 0, ACL_FORMAT_ND, dims, 1, c->pool + 2 * RANGE_BYTES);
        aclScalar *s = aclCreateScalar(&alpha, ACL_FLOAT);
        if (!a || !b || !y || !s) app_die(2, "aclCreateTensor/aclCreateScalar failed");
        uint64_t ws = 0;
        aclOpExecutor *ex = NULL;
        ACL_CHECK(g_add_ws(a, b, s, y, &ws, &ex));
        ACL_CHECK(g_add(NULL, ws, ex, c->stream));
        ACL_CHECK(aclDestroyTensor(a));
        ACL_CHECK(aclDestroyTensor(b));
        ACL_CHECK(aclDestroyTensor(y));
        ACL_CHECK(aclDestroyScalar(s));
        ITER_END(c, i);
        sync_every(c, i);
    }
}

typedef struct bcase {
    const char *name;
    void (*fn)(ctx *, long long);
    int calls, ranges;
} bcase;

static const bcase CASES[] = {
    { "malloc_free_small", loop_malloc_free_small, 2, 0 },
    { "malloc_free_large", loop_malloc_free_large, 2, 0 },
    { "memcpy_h2d", loop_memcpy_h2d, 1, 1 },
    { "memcpy_d2d", loop_memcpy_d2d, 1, 2 },
    { "memset", loop_memset, 1, 1 },
    { "memcpy_h2d_sync", loop_memcpy_h2d_sync, 1, 1 },
    { "memcpy_d2d_sync", loop_memcpy_d2d_sync, 1, 2 },
    { "memset_sync", loop_memset_sync, 1, 1 },
    { "aclop_1", loop_aclop_1, 1, 1 },
    { "aclop_4", loop_aclop_4, 1, 4 },
    { "aclop_16", loop_aclop_16, 1, 16 },
    { "aclnn_add", loop_aclnn_add, 7, 3 },
};
#define NCASES (sizeof CASES / sizeof CASES[0])

/* ---------------------------------------------------------- threads */

static long long g_iters = 20000, g_warmup = 1000;
static int g_threads = 1, g_per_iter;
static const bcase *g_case;
static pthread_barrier_t g_start, g_done;

typedef struct thr {
    pthread_t th;
    ctx c;
    double wall_ns, cpu_ns;
} thr;

/* The one function callgrind collects in (see the header). */
static NOINLINE void hb_measure(const bcase *bc, ctx *c, long long n)
{
    bc->fn(c, n);
    __asm__ volatile("" ::: "memory");
}

static double ts_ns(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void ctx_init(ctx *c)
{
    memset(c, 0, sizeof *c);
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtCreateStream(&c->stream));
    /* frameworks ask for the capacity at start-up (torch_npu does); it arms
     * u3m's HBM monitor, which then runs on every allocation and free */
    size_t hbm_free = 0, hbm_total = 0;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &hbm_free, &hbm_total));
    ACL_CHECK(aclrtMalloc((void **)&c->pool, POOL_BYTES, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMalloc((void **)&c->dev2, SMALL_COPY, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMallocHost(&c->host, SMALL_COPY));
    memset(c->host, 0x5a, SMALL_COPY);
    /* opaque byte ranges (as acl_replay describes them): the simulator runs
     * its hash kernel on them; typed tensors would need a real ConcatD */
    int64_t dims[1] = { RANGE_BYTES };
    for (int i = 0; i < MAX_K; i++) {
        c->desc[i] = aclCreateTensorDesc(ACL_UINT8, 1, dims, ACL_FORMAT_ND);
        c->buf[i] = aclCreateDataBuffer(c->pool + (size_t)i * RANGE_BYTES, RANGE_BYTES);
        if (!c->desc[i] || !c->buf[i]) app_die(2, "aclCreateTensorDesc/aclCreateDataBuffer failed");
    }
}

static void ctx_fini(ctx *c)
{
    ACL_CHECK(aclrtSynchronizeStream(c->stream));
    for (int i = 0; i < MAX_K; i++) {
        aclDestroyTensorDesc(c->desc[i]);
        ACL_CHECK(aclDestroyDataBuffer(c->buf[i]));
    }
    ACL_CHECK(aclrtFreeHost(c->host));
    ACL_CHECK(aclrtFree(c->dev2));
    ACL_CHECK(aclrtFree(c->pool));
    ACL_CHECK(aclrtDestroyStream(c->stream));
}

static void *thread_main(void *arg)
{
    thr *t = arg;
    ctx_init(&t->c);
    /* first calls resolve symbols, classify names, create table entries:
     * not what a steady-state call costs */
    if (g_warmup > 0) {
        g_case->fn(&t->c, g_warmup);
        ACL_CHECK(aclrtSynchronizeStream(t->c.stream));
    }
    if (g_per_iter && !(t->c.samples = malloc((size_t)g_iters * sizeof(double)))) app_die(2, "out of memory");
    pthread_barrier_wait(&g_start);
    double w0 = ts_ns(CLOCK_MONOTONIC), c0 = ts_ns(CLOCK_THREAD_CPUTIME_ID);
    hb_measure(g_case, &t->c, g_iters);
    ACL_CHECK(aclrtSynchronizeStream(t->c.stream));
    t->cpu_ns = ts_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
    t->wall_ns = ts_ns(CLOCK_MONOTONIC) - w0;
    pthread_barrier_wait(&g_done);
    ctx_fini(&t->c);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* What ITER_BEGIN/ITER_END measure around nothing: one clock read. */
static double clock_cost(void)
{
    enum { K = 2001 };
    static double v[K];
    for (int i = 0; i < K; i++) {
        double t0 = mono_ns();
        v[i] = mono_ns() - t0;
    }
    return median(v, K);
}

static void run_case(const bcase *bc)
{
    g_case = bc;
    thr *ts = calloc((size_t)g_threads, sizeof *ts);
    if (!ts) app_die(2, "out of memory");
    pthread_barrier_init(&g_start, NULL, (unsigned)g_threads);
    pthread_barrier_init(&g_done, NULL, (unsigned)g_threads);
    for (int i = 0; i < g_threads; i++)
        if (pthread_create(&ts[i].th, NULL, thread_main, &ts[i]) != 0) app_die(2, "pthread_create failed");
    double wall = 0, cpu = 0, wmax = 0;
    for (int i = 0; i < g_threads; i++) {
        pthread_join(ts[i].th, NULL);
        wall += ts[i].wall_ns;
        cpu += ts[i].cpu_ns;
        if (ts[i].wall_ns > wmax) wmax = ts[i].wall_ns;
    }
    char p50[64] = "";
    if (g_per_iter) {
        size_t n = (size_t)g_iters * (size_t)g_threads;
        double *all = malloc(n * sizeof *all);
        if (!all) app_die(2, "out of memory");
        for (int i = 0; i < g_threads; i++) {
            memcpy(all + (size_t)i * (size_t)g_iters, ts[i].c.samples, (size_t)g_iters * sizeof *all);
            free(ts[i].c.samples);
        }
        snprintf(p50, sizeof p50, " p50_ns_per_iter=%.1f", median(all, n) - clock_cost());
        free(all);
    }
    pthread_barrier_destroy(&g_start);
    pthread_barrier_destroy(&g_done);
    double n = (double)g_iters;
    printf("case=%s threads=%d iters=%lld calls_per_iter=%d ranges_per_iter=%d wall_ns_per_iter=%.1f "
           "cpu_ns_per_iter=%.1f wall_ns_max=%.1f%s\n",
           bc->name, g_threads, g_iters, bc->calls, bc->ranges, wall / g_threads / n, cpu / g_threads / n,
           wmax / n, p50);
    fflush(stdout);
    free(ts);
}

/* aclnn through dlopen + dlsym, the way torch_npu reaches every operator */
static void resolve_aclnn(void)
{
    void *h = dlopen("libopapi.so", RTLD_NOW | RTLD_GLOBAL);
    if (!h) app_die(2, "dlopen libopapi.so: %s", dlerror());
    g_add_ws = (ws_fn)dlsym(h, "aclnnAddGetWorkspaceSize");
    g_add = (exec_fn)dlsym(h, "aclnnAdd");
    if (!g_add_ws || !g_add) app_die(2, "dlsym aclnnAdd: %s", dlerror());
}

static int selected(const char *list, const char *name)
{
    if (!list || !strcmp(list, "all")) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *cases = NULL, *v;
    for (int i = 1; i < argc; i++) {
        if ((v = app_opt(argc, argv, &i, "--iters"))) g_iters = app_parse_int(v, "--iters");
        else if ((v = app_opt(argc, argv, &i, "--warmup"))) g_warmup = app_parse_int(v, "--warmup");
        else if ((v = app_opt(argc, argv, &i, "--threads"))) g_threads = (int)app_parse_int(v, "--threads");
        else if ((v = app_opt(argc, argv, &i, "--case"))) cases = v;
        else if (!strcmp(argv[i], "--per-iter")) g_per_iter = 1;
        else if (!strcmp(argv[i], "--list")) {
            for (size_t k = 0; k < NCASES; k++) printf("%s\n", CASES[k].name);
            return 0;
        } else app_die(3, "usage: hookbench [--iters N] [--warmup N] [--threads T] [--case a,b|all] [--per-iter] [--list]");
    }
    if (g_threads < 1 || g_threads > 64 || g_iters < 1) app_die(3, "--threads must be 1..64 and --iters >= 1");
    for (size_t k = 0; k < NCASES; k++)
        if (cases && selected(cases, CASES[k].name)) goto known;
    if (cases && strcmp(cases, "all")) app_die(3, "no known case in '%s' (see --list)", cases);
known:
    ACL_CHECK(aclInit(NULL));
    resolve_aclnn();
    for (size_t k = 0; k < NCASES; k++)
        if (selected(cases, CASES[k].name)) run_case(&CASES[k]);
    ACL_CHECK(aclFinalize());
    return 0;
}
