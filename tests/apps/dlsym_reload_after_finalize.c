/* dlsym_reload_after_finalize (issue 13, finding 2): a program that loads the
 * runtime with dlopen, uses it, calls aclFinalize, dlcloses it, and then does
 * the same again (a plugin host, a test runner that reloads a backend).
 * Every round must work as the first: allocations, asynchronous copies on a
 * stream of that round, synchronous reads. Links only -ldl (the name starts
 * with "dlsym", so shim/build.rs does not link the runtime).
 * Prints per round: "round=<r> rc=<first failing code or 0> ok=<data intact>"
 * and rounds_ok=. With "aclnn" as the second argument each round also loads
 * libopapi.so + libnnopbase.so, runs aclnnAdd (out = x + 2x) and checks it;
 * from round 2 on the address range libopapi had is reserved first, so it
 * loads elsewhere (prints "aclnn_moved=1" when it did). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*init_fn)(const char *);
typedef int (*void_fn)(void);
typedef int (*dev_fn)(int);
typedef int (*malloc_fn)(void **, size_t, int);
typedef int (*free_fn)(void *);
typedef int (*memcpy_fn)(void *, size_t, const void *, size_t, int);
typedef int (*memcpy_async_fn)(void *, size_t, const void *, size_t, int, void *);
typedef int (*stream_fn)(void **);
typedef int (*stream1_fn)(void *);

typedef void *(*tensor_fn)(const int64_t *, uint64_t, int, const int64_t *, int64_t, int,
                           const int64_t *, uint64_t, void *);
typedef int (*destroy_fn)(void *);
typedef void *(*scalar_fn)(void *, int);
typedef int (*add_gws_fn)(void *, void *, void *, void *, uint64_t *, void **);
typedef int (*exec_fn)(void *, uint64_t, void *, void *);

#define H2D 1
#define D2H 2

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "dlsym_reload_after_finalize: missing %s\n", name);
        exit(2);
    }
    return p;
}

static uint64_t rnd(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define TRY(x) do { int r_ = (x); if (r_ && !rc) { rc = r_; fprintf(stderr, "round %d: %s -> %d\n", round, #x, r_); } } while (0)

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rounds = argc > 1 ? atoi(argv[1]) : 2;
    size_t n = 32u << 20;
    unsigned char *pat = malloc(n), *back = malloc(n);
    if (!pat || !back) return 1;
    int rounds_ok = 0, with_aclnn = argc > 2 && !strcmp(argv[2], "aclnn"), moved = 0;
    uintptr_t opapi_base = 0;
    for (int round = 1; round <= rounds; round++) {
        void *h = dlopen("libascendcl.so", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 2;
        }
        init_fn init = (init_fn)sym(h, "aclInit");
        void_fn fin = (void_fn)sym(h, "aclFinalize");
        dev_fn setdev = (dev_fn)sym(h, "aclrtSetDevice");
        dev_fn resetdev = (dev_fn)sym(h, "aclrtResetDevice");
        malloc_fn mal = (malloc_fn)sym(h, "aclrtMalloc");
        free_fn fre = (free_fn)sym(h, "aclrtFree");
        memcpy_fn cpy = (memcpy_fn)sym(h, "aclrtMemcpy");
        memcpy_async_fn cpya = (memcpy_async_fn)sym(h, "aclrtMemcpyAsync");
        stream_fn mkstream = (stream_fn)sym(h, "aclrtCreateStream");
        stream1_fn syncstream = (stream1_fn)sym(h, "aclrtSynchronizeStream");
        stream1_fn rmstream = (stream1_fn)sym(h, "aclrtDestroyStream");
        void *opapi = NULL, *nnop = NULL;
        if (with_aclnn) {
            if (opapi_base) /* keep the loader from reusing the old range */
                mmap((void *)opapi_base, 4096, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
            opapi = dlopen("libopapi.so", RTLD_NOW | RTLD_LOCAL);
            nnop = dlopen("libnnopbase.so", RTLD_NOW | RTLD_LOCAL);
            if (!opapi || !nnop) {
                fprintf(stderr, "dlopen: %s\n", dlerror());
                return 2;
            }
            struct link_map *lm = NULL;
            if (dlinfo(opapi, RTLD_DI_LINKMAP, &lm) == 0 && lm) {
                if (opapi_base && lm->l_addr != opapi_base) moved = 1;
                opapi_base = lm->l_addr;
            }
        }
        int rc = 0, ok = 0;
        TRY(init(NULL));
        TRY(setdev(0));
        void *s = NULL, *d = NULL;
        TRY(mkstream(&s));
        TRY(mal(&d, n, 0));
        uint64_t seed = (uint64_t)round * 1000;
        for (size_t k = 0; k < n; k++) pat[k] = (unsigned char)rnd(&seed);
        memset(back, 0, n);
        if (d && s) {
            TRY(cpya(d, n, pat, n, H2D, s));
            TRY(syncstream(s));
            TRY(cpy(back, n, d, n, D2H));
            ok = !rc && memcmp(back, pat, n) == 0;
        }
        if (with_aclnn && d && s) {
            tensor_fn mkt = (tensor_fn)sym(opapi, "aclCreateTensor");
            destroy_fn rmt = (destroy_fn)sym(opapi, "aclDestroyTensor");
            scalar_fn mks = (scalar_fn)sym(nnop, "aclCreateScalar");
            destroy_fn rms = (destroy_fn)sym(nnop, "aclDestroyScalar");
            add_gws_fn add_gws = (add_gws_fn)sym(opapi, "aclnnAddGetWorkspaceSize");
            exec_fn add = (exec_fn)sym(opapi, "aclnnAdd");
            /* x in d[0..k), out = x + 2 * x in d[k..2k) (floats) */
            int64_t k = 4096, dims[1] = {k}, strides[1] = {1};
            float *hx = (float *)pat, *hout = (float *)back;
            for (int64_t i = 0; i < k; i++) hx[i] = (float)(i + round);
            void *x = d, *out = (char *)d + k * 4;
            TRY(cpy(x, k * 4, hx, k * 4, H2D));
            void *tx = mkt(dims, 1, 0, strides, 0, 2, dims, 1, x);
            void *tout = mkt(dims, 1, 0, strides, 0, 2, dims, 1, out);
            float two = 2.0f;
            void *alpha = mks(&two, 0);
            uint64_t ws = 0;
            void *ex = NULL;
            int aok = 0;
            if (tx && tout && alpha) {
                TRY(add_gws(tx, tx, alpha, tout, &ws, &ex));
                if (!rc && ws == 0) TRY(add(NULL, 0, ex, s));
                TRY(syncstream(s));
                TRY(cpy(hout, k * 4, out, k * 4, D2H));
                aok = !rc;
                for (int64_t i = 0; aok && i < k; i++) aok = hout[i] == 3.0f * (float)(i + round);
            }
            if (tx) rmt(tx);
            if (tout) rmt(tout);
            if (alpha) rms(alpha);
            printf("aclnn_round=%d ok=%d\n", round, aok);
            ok = ok && aok;
        }
        if (d) TRY(fre(d));
        if (s) TRY(rmstream(s));
        TRY(resetdev(0));
        TRY(fin());
        if (nnop) dlclose(nnop);
        if (opapi) dlclose(opapi);
        dlclose(h);
        printf("round=%d rc=%d ok=%d\n", round, rc, ok);
        rounds_ok += ok && !rc;
    }
    if (with_aclnn) printf("aclnn_moved=%d\n", moved);
    printf("rounds_ok=%d\n", rounds_ok);
    return 0;
}
