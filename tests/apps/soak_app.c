/* soak_app: a long-running ACL program for the soak test (tests/soak.rs).
 * Keeps --buffers device buffers of 2..--max-bytes each and, until
 * --seconds have passed, re-allocates them, writes random ranges (H2D,
 * synchronous or asynchronous on its stream), memsets, copies between
 * buffers (D2D) and reads ranges back (D2H), checking every byte it reads
 * against a host model of what each buffer must hold.
 *
 * Calls may fail when faults are injected (ACLSIM_FAULTS): a failed write
 * leaves the bytes it covered unknown (the model stops vouching for them
 * until they are written again), a failed asynchronous call does so for
 * everything queued since the last synchronisation, and a failed read is
 * not checked. A byte that reads back different from a known model byte is
 * corrupted.
 *
 * Prints a progress line every second and a last one:
 *   t=<s> ops=<n> verified_bytes=<n> corrupted_bytes=<n> errors=<n>
 * exit 1 if any byte was corrupted, 3 on bad usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "acl/acl.h"
#include "common/common.h"

#define MAXBUF 64
#define MIB (1ULL << 20)

typedef struct {
    void *dev;
    uint64_t bytes;
    unsigned char *model, *known;
} buffer;

static buffer g_b[MAXBUF];
static int g_n = 12;
static uint64_t g_max = 16 * MIB, g_rng = 1;
static unsigned char *g_host, *g_back;
static aclrtStream g_s;
static uint64_t g_ops, g_verified, g_corrupted, g_errors;
/* asynchronous writes since the last synchronisation: (buffer, off, len) */
static struct { int b; uint64_t off, len; } g_pend[64];
static int g_npend;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
static uint64_t rnd(uint64_t n) { return n ? app_rand_u64(&g_rng) % n : 0; }

/* counts an error; the first few are named on stderr */
static void error(int rc, const char *what) {
    if (g_errors++ < 20) fprintf(stderr, "soak_app: %s -> %d\n", what, rc);
}

static void forget(int b, uint64_t off, uint64_t len) { memset(g_b[b].known + off, 0, len); }

static void sync_stream(void) {
    int rc = aclrtSynchronizeStream(g_s);
    if (rc) {
        error(rc, "aclrtSynchronizeStream");
        for (int i = 0; i < g_npend; i++) forget(g_pend[i].b, g_pend[i].off, g_pend[i].len);
    }
    g_npend = 0;
}

/* a write the model applies now; on an error the bytes become unknown */
static void wrote(int rc, int async, int b, uint64_t off, uint64_t len, const unsigned char *data, int val) {
    if (rc) {
        error(rc, data ? "aclrtMemcpy(H2D)" : "aclrtMemset");
        forget(b, off, len);
        return;
    }
    if (data) memcpy(g_b[b].model + off, data, len);
    else memset(g_b[b].model + off, val, len);
    memset(g_b[b].known + off, 1, len);
    if (async) {
        g_pend[g_npend].b = b;
        g_pend[g_npend].off = off;
        g_pend[g_npend].len = len;
        if (++g_npend == 64) sync_stream();
    }
}

static void check(int b, uint64_t off, uint64_t len) {
    int rc = aclrtMemcpy(g_back, len, (char *)g_b[b].dev + off, len, ACL_MEMCPY_DEVICE_TO_HOST);
    if (rc) {
        error(rc, "aclrtMemcpy(D2H)");
        return;
    }
    for (uint64_t k = 0; k < len; k++) {
        if (!g_b[b].known[off + k]) continue;
        g_verified++;
        if (g_back[k] != g_b[b].model[off + k]) {
            if (!g_corrupted)
                fprintf(stderr, "soak_app: buffer %d byte %llu: read %02x, expected %02x\n", b,
                        (unsigned long long)(off + k), g_back[k], g_b[b].model[off + k]);
            g_corrupted++;
        }
    }
}

static void fill(unsigned char *p, uint64_t len) {
    for (uint64_t k = 0; k < len; k += 8) {
        uint64_t w = app_rand_u64(&g_rng);
        memcpy(p + k, &w, len - k < 8 ? len - k : 8);
    }
}

static void realloc_buf(int b) {
    buffer *x = &g_b[b];
    if (x->dev) {
        sync_stream();
        int rc = aclrtFree(x->dev);
        if (rc) error(rc, "aclrtFree");
        x->dev = NULL;
    }
    uint64_t bytes = 2 * MIB + rnd(g_max - 2 * MIB + 1);
    int rc = aclrtMalloc(&x->dev, bytes, ACL_MEM_MALLOC_HUGE_FIRST);
    if (rc) {
        error(rc, "aclrtMalloc");
        x->dev = NULL;
        return;
    }
    x->bytes = bytes;
    free(x->model);
    free(x->known);
    x->model = malloc(bytes);
    x->known = calloc(bytes, 1);
    if (!x->model || !x->known) app_die(1, "out of host memory");
    fill(g_host, bytes);
    wrote(aclrtMemcpy(x->dev, bytes, g_host, bytes, ACL_MEMCPY_HOST_TO_DEVICE), 0, b, 0, bytes, g_host, 0);
}

static void range(int b, uint64_t *off, uint64_t *len) {
    uint64_t n = g_b[b].bytes;
    switch (rnd(3)) {
    case 0: *off = 0; *len = n; break;
    case 1: {  /* across a 2 MiB boundary */
        uint64_t k = (1 + rnd((n - 1) / (2 * MIB))) * 2 * MIB;
        if (k >= n) k = 2 * MIB;
        uint64_t before = 1 + rnd(k < 65536 ? k : 65536);
        uint64_t after = 1 + rnd(n - k < 65536 ? n - k : 65536);
        *off = k - before;
        *len = before + after;
        break;
    }
    default: *off = rnd(n); *len = 1 + rnd(n - *off); break;
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    double seconds = 20;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--seconds"))) seconds = (double)app_parse_int(v, "--seconds");
        else if ((v = app_opt(argc, argv, &i, "--buffers"))) g_n = (int)app_parse_int(v, "--buffers");
        else if ((v = app_opt(argc, argv, &i, "--max-bytes"))) g_max = app_parse_size(v, "--max-bytes");
        else if ((v = app_opt(argc, argv, &i, "--seed"))) g_rng = (uint64_t)app_parse_int(v, "--seed");
        else app_die(3, "usage: soak_app [--seconds S] [--buffers K] [--max-bytes B] [--seed N]");
    }
    if (g_n < 2 || g_n > MAXBUF || g_max < 2 * MIB) app_die(3, "--buffers 2..64, --max-bytes >= 2M");
    g_host = malloc(g_max);
    g_back = malloc(g_max);
    if (!g_host || !g_back) app_die(1, "out of host memory");
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtCreateStream(&g_s));
    for (int b = 0; b < g_n; b++) realloc_buf(b);
    double t0 = now_s(), next = t0 + 1;
    for (;;) {
        double t = now_s();
        if (t >= next) {
            printf("t=%.0f ops=%llu verified_bytes=%llu corrupted_bytes=%llu errors=%llu\n", t - t0,
                   (unsigned long long)g_ops, (unsigned long long)g_verified, (unsigned long long)g_corrupted,
                   (unsigned long long)g_errors);
            next = t + 1;
        }
        if (t - t0 >= seconds) break;
        int b = (int)rnd((uint64_t)g_n);
        if (!g_b[b].dev) {
            realloc_buf(b);
            continue;
        }
        uint64_t off, len;
        range(b, &off, &len);
        g_ops++;
        switch (rnd(10)) {
        case 0:
            realloc_buf(b);
            break;
        case 1: case 2: {
            fill(g_host, len);
            int async = (int)rnd(2);
            if (!async) sync_stream();   /* a synchronous copy does not wait for queued work */
            int rc = async ? aclrtMemcpyAsync((char *)g_b[b].dev + off, len, g_host, len,
                                              ACL_MEMCPY_HOST_TO_DEVICE, g_s)
                           : aclrtMemcpy((char *)g_b[b].dev + off, len, g_host, len, ACL_MEMCPY_HOST_TO_DEVICE);
            wrote(rc, async, b, off, len, g_host, 0);
            if (async) sync_stream();   /* g_host is reused by the next call */
            break;
        }
        case 3: {
            int val = (int)rnd(256);
            int async = (int)rnd(2);
            if (!async) sync_stream();
            int rc = async ? aclrtMemsetAsync((char *)g_b[b].dev + off, len, val, len, g_s)
                           : aclrtMemset((char *)g_b[b].dev + off, len, val, len);
            wrote(rc, async, b, off, len, NULL, val);
            break;
        }
        case 4: case 5: {
            int a = (int)rnd((uint64_t)g_n);
            if (a == b || !g_b[a].dev) break;
            if (len > g_b[a].bytes) len = g_b[a].bytes;
            uint64_t aoff = rnd(g_b[a].bytes - len + 1);
            sync_stream();
            int rc = aclrtMemcpyAsync((char *)g_b[b].dev + off, len, (char *)g_b[a].dev + aoff, len,
                                      ACL_MEMCPY_DEVICE_TO_DEVICE, g_s);
            if (rc) {
                error(rc, "aclrtMemcpyAsync(D2D)");
                forget(b, off, len);
                break;
            }
            memcpy(g_b[b].model + off, g_b[a].model + aoff, len);
            memcpy(g_b[b].known + off, g_b[a].known + aoff, len);
            g_pend[g_npend].b = b;
            g_pend[g_npend].off = off;
            g_pend[g_npend].len = len;
            g_npend++;
            sync_stream();
            break;
        }
        default:
            sync_stream();
            check(b, off, len);
        }
    }
    sync_stream();
    for (int b = 0; b < g_n; b++)
        if (g_b[b].dev) check(b, 0, g_b[b].bytes);
    printf("t=%.0f ops=%llu verified_bytes=%llu corrupted_bytes=%llu errors=%llu\n", now_s() - t0,
           (unsigned long long)g_ops, (unsigned long long)g_verified, (unsigned long long)g_corrupted,
           (unsigned long long)g_errors);
    for (int b = 0; b < g_n; b++)
        if (g_b[b].dev) aclrtFree(g_b[b].dev);
    aclrtDestroyStream(g_s);
    aclrtResetDevice(0);
    aclFinalize();
    return g_corrupted ? 1 : 0;
}
