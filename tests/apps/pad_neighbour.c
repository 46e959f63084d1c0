/* pad_neighbour (issue 13, finding 1): aclrtMalloc(N) and aclrtMallocCached(N)
 * round N up to 32 bytes and add 32 bytes that the program may use (CANN
 * documents it; the simulator leaves that room). With N a multiple of 2 MiB,
 * a program that writes N+32 bytes into its buffer must not touch the next
 * allocation. Allocates A and B (N bytes each, through the API named by
 * --api), fills B, writes N+32 bytes into A, and reads both back.
 * Prints: write_rc=, a_ok= (A's N+32 bytes read back), b_ok= (B intact). */
#include <stdio.h>
#include <string.h>
#include "acl/acl.h"
#include "common/common.h"

typedef aclError (*malloc_fn)(void **, size_t, aclrtMemMallocPolicy);

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *api = "malloc";
    uint64_t n = 4 << 20;
    int count = 4;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--api"))) api = v;
        else if ((v = app_opt(argc, argv, &i, "--bytes"))) n = app_parse_size(v, "--bytes");
        else if ((v = app_opt(argc, argv, &i, "--count"))) count = (int)app_parse_int(v, "--count");
        else app_die(3, "usage: pad_neighbour [--api malloc|cached] [--bytes N] [--count K]");
    }
    malloc_fn f = !strcmp(api, "cached") ? aclrtMallocCached : aclrtMalloc;
    if (count < 2 || count > 64) app_die(3, "--count must be 2..64");
    uint64_t padded = ((n + 31) / 32) * 32 + 32;
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    /* several buffers in a row: whichever lies after A is checked */
    void *d[64];
    for (int i = 0; i < count; i++) ACL_CHECK(f(&d[i], n, ACL_MEM_MALLOC_HUGE_FIRST));
    unsigned char *pat = malloc(padded), *back = malloc(padded);
    if (!pat || !back) app_die(1, "out of host memory");
    uint64_t seed = 1;
    for (int i = 1; i < count; i++) {
        for (uint64_t k = 0; k < n; k++) pat[k] = (unsigned char)app_rand_u64(&seed);
        ACL_CHECK(aclrtMemcpy(d[i], n, pat, n, ACL_MEMCPY_HOST_TO_DEVICE));
    }
    /* the padding write: N+32 bytes (and the rounding) into buffer 0 */
    memset(pat, 0xA5, padded);
    int wrc = aclrtMemcpy(d[0], padded, pat, padded, ACL_MEMCPY_HOST_TO_DEVICE);
    printf("write_rc=%d\n", wrc);
    int rrc = aclrtMemcpy(back, padded, d[0], padded, ACL_MEMCPY_DEVICE_TO_HOST);
    printf("read_rc=%d\n", rrc);
    printf("a_ok=%d\n", rrc == 0 && memcmp(back, pat, padded) == 0);
    seed = 1;
    int b_ok = 1;
    for (int i = 1; i < count; i++) {
        for (uint64_t k = 0; k < n; k++) pat[k] = (unsigned char)app_rand_u64(&seed);
        ACL_CHECK(aclrtMemcpy(back, n, d[i], n, ACL_MEMCPY_DEVICE_TO_HOST));
        if (memcmp(back, pat, n)) {
            uint64_t k = 0;
            while (back[k] == pat[k]) k++;
            printf("corrupted buffer=%d offset=%llu\n", i, (unsigned long long)k);
            b_ok = 0;
        }
    }
    printf("b_ok=%d\n", b_ok);
    for (int i = 0; i < count; i++) ACL_CHECK(aclrtFree(d[i]));
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return 0;
}
