/* dlsym_reload_after_finalize (issue 13, finding 2): a program that loads the
 * runtime with dlopen, uses it, calls aclFinalize, dlcloses it, and then does
 * the same again (a plugin host, a test runner that reloads a backend).
 * Every round must work as the first: allocations, asynchronous copies on a
 * stream of that round, synchronous reads. Links only -ldl (the name starts
 * with "dlsym", so shim/build.rs does not link the runtime).
 * Prints per round: "round=<r> rc=<first failing code or 0> ok=<data intact>"
 * and rounds_ok=. */
#include <dlfcn.h>
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
    int rounds_ok = 0;
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
        if (d) TRY(fre(d));
        if (s) TRY(rmstream(s));
        TRY(resetdev(0));
        TRY(fin());
        dlclose(h);
        printf("round=%d rc=%d ok=%d\n", round, rc, ok);
        rounds_ok += ok && !rc;
    }
    printf("rounds_ok=%d\n", rounds_ok);
    return 0;
}
