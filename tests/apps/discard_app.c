/* discard_app: the one workload program that knows u3m — it gives u3m's
 * optional hint (docs/api.md), found with dlsym as a framework's caching
 * allocator would, and runs the same without libu3m.so.
 * Allocates X and Y (--bytes each), fills X, then (with --discard) tells u3m
 * X's contents are dead (u3m_discard), fills Y — over HBM, X leaves it —,
 * writes X anew, and reads both back.
 * Prints: api=present|absent, discard_rc= (with --discard and the API),
 * x_ok=, y_ok= (each read back as last written). --hold-ms N: then waits N
 * ms before freeing (a sidecar reads its stats meanwhile). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "acl/acl.h"
#include "common/common.h"

typedef int (*discard_fn)(const void *, size_t);

static void fill(unsigned char *p, uint64_t n, uint64_t seed) {
    for (uint64_t k = 0; k < n; k++) p[k] = (unsigned char)app_rand_u64(&seed);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    uint64_t n = 32 << 20;
    int discard = 0;
    long hold_ms = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--bytes"))) n = app_parse_size(v, "--bytes");
        else if ((v = app_opt(argc, argv, &i, "--hold-ms"))) hold_ms = (long)app_parse_size(v, "--hold-ms");
        else if (!strcmp(argv[i], "--discard")) discard = 1;
        else app_die(3, "usage: discard_app [--bytes N] [--discard] [--hold-ms N]");
    }
    discard_fn f = (discard_fn)dlsym(RTLD_DEFAULT, "u3m_discard");
    printf("api=%s\n", f ? "present" : "absent");
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    void *x, *y;
    ACL_CHECK(aclrtMalloc(&x, n, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMalloc(&y, n, ACL_MEM_MALLOC_HUGE_FIRST));
    unsigned char *pat = malloc(n), *back = malloc(n);
    if (!pat || !back) app_die(1, "out of host memory");
    fill(pat, n, 1);
    ACL_CHECK(aclrtMemcpy(x, n, pat, n, ACL_MEMCPY_HOST_TO_DEVICE));
    if (discard && f) {
        printf("null_rc=%d\n", f(NULL, n));
        printf("discard_rc=%d\n", f(x, n));
    }
    fill(pat, n, 2);
    ACL_CHECK(aclrtMemcpy(y, n, pat, n, ACL_MEMCPY_HOST_TO_DEVICE));
    fill(pat, n, 3);
    ACL_CHECK(aclrtMemcpy(x, n, pat, n, ACL_MEMCPY_HOST_TO_DEVICE));
    ACL_CHECK(aclrtMemcpy(back, n, x, n, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("x_ok=%d\n", memcmp(back, pat, n) == 0);
    fill(pat, n, 2);
    ACL_CHECK(aclrtMemcpy(back, n, y, n, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("y_ok=%d\n", memcmp(back, pat, n) == 0);
    if (hold_ms > 0) {
        struct timespec ts = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    ACL_CHECK(aclrtFree(x));
    ACL_CHECK(aclrtFree(y));
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    free(pat);
    free(back);
    return 0;
}
