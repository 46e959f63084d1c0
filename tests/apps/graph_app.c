/* graph_app: a captured graph replayed under memory pressure.
 *
 * Four buffers of S bytes form a copy chain captured once on a stream
 * (b1 <- b0, b2 <- b1, b3 <- b2: aclrtMemcpyAsync device to device). Each
 * round writes new data into b0, then writes a pressure buffer of P bytes
 * (under u3m in a device too small for everything, this pushes the chain's
 * buffers out of HBM), then replays the graph and reads b3 back: it must
 * equal what b0 was given. Prints "round=<r> ok=<0|1>" and "rounds_ok=<n>".
 *
 *   graph_app [--bytes S] [--pressure P] [--rounds R] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "common/common.h"

int main(int argc, char **argv) {
    uint64_t bytes = 12u << 20, pressure = 40u << 20;
    long rounds = 3;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--bytes"))) bytes = app_parse_size(v, "--bytes");
        else if ((v = app_opt(argc, argv, &i, "--pressure"))) pressure = app_parse_size(v, "--pressure");
        else if ((v = app_opt(argc, argv, &i, "--rounds"))) rounds = (long)app_parse_int(v, "--rounds");
        else app_die(3, "usage: graph_app [--bytes S] [--pressure P] [--rounds R]");
    }
    if (bytes < 4096 || pressure < 4096 || rounds < 1) app_die(3, "usage: graph_app [--bytes S] [--pressure P] [--rounds R]");
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    unsigned char *want = malloc(bytes), *back = malloc(bytes), *junk = malloc(pressure);
    if (!want || !back || !junk) app_die(2, "out of host memory");
    void *b[4], *p = NULL;
    for (int i = 0; i < 4; i++) {
        ACL_CHECK(aclrtMalloc(&b[i], bytes, ACL_MEM_MALLOC_HUGE_FIRST));
        ACL_CHECK(aclrtMemset(b[i], bytes, 0, bytes));
    }
    ACL_CHECK(aclrtMalloc(&p, pressure, ACL_MEM_MALLOC_HUGE_FIRST));
    /* pressure before the capture too: under u3m part of the chain is then
     * out of HBM while it is captured */
    memset(junk, 0x5a, pressure);
    ACL_CHECK(aclrtMemcpy(p, pressure, junk, pressure, ACL_MEMCPY_HOST_TO_DEVICE));
    aclrtStream s = NULL;
    ACL_CHECK(aclrtCreateStream(&s));
    aclmdlRI graph = NULL;
    ACL_CHECK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < 3; i++) ACL_CHECK(aclrtMemcpyAsync(b[i + 1], bytes, b[i], bytes, ACL_MEMCPY_DEVICE_TO_DEVICE, s));
    ACL_CHECK(aclmdlRICaptureEnd(s, &graph));
    /* nothing ran at capture: b3 is still zero */
    ACL_CHECK(aclrtSynchronizeStream(s));
    ACL_CHECK(aclrtMemcpy(back, bytes, b[3], bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    int zero = 1;
    for (uint64_t k = 0; k < bytes; k++) zero &= back[k] == 0;
    printf("captured_not_run=%d\n", zero);
    int ok_rounds = 0;
    uint64_t st = 42;
    for (long r = 0; r < rounds; r++) {
        for (uint64_t k = 0; k < bytes; k++) want[k] = (unsigned char)app_rand_u64(&st);
        ACL_CHECK(aclrtMemcpy(b[0], bytes, want, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
        memset(junk, (int)r + 1, pressure);
        ACL_CHECK(aclrtMemcpy(p, pressure, junk, pressure, ACL_MEMCPY_HOST_TO_DEVICE));
        ACL_CHECK(aclmdlRIExecuteAsync(graph, s));
        ACL_CHECK(aclrtSynchronizeStream(s));
        ACL_CHECK(aclrtMemcpy(back, bytes, b[3], bytes, ACL_MEMCPY_DEVICE_TO_HOST));
        int ok = memcmp(back, want, bytes) == 0;
        printf("round=%ld ok=%d\n", r, ok);
        ok_rounds += ok;
    }
    printf("rounds_ok=%d\n", ok_rounds);
    ACL_CHECK(aclmdlRIDestroy(graph));
    ACL_CHECK(aclrtDestroyStream(s));
    for (int i = 0; i < 4; i++) ACL_CHECK(aclrtFree(b[i]));
    ACL_CHECK(aclrtFree(p));
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    free(want);
    free(back);
    free(junk);
    return 0;
}
