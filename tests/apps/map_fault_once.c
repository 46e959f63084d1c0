/* map_fault_once (issue 13, finding 3): a program that only allocates,
 * copies and reads back, run with ACLSIM_FAULTS=map:4 (one aclrtMapMem
 * failure). The program itself never maps memory, so on the stock runtime
 * the fault never fires; an interposer that maps memory on the program's
 * behalf must absorb one transient failure (retry), not fail the program's
 * copy. Writes --buffers buffers of --bytes each, reads each back.
 * Prints one "buf=<i> write_rc= read_rc= ok=" line per buffer and
 * all_ok=. */
#include <stdio.h>
#include <string.h>
#include "acl/acl.h"
#include "common/common.h"

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    uint64_t n = 8 << 20;
    int count = 4;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--bytes"))) n = app_parse_size(v, "--bytes");
        else if ((v = app_opt(argc, argv, &i, "--buffers"))) count = (int)app_parse_int(v, "--buffers");
        else app_die(3, "usage: map_fault_once [--bytes N] [--buffers K]");
    }
    if (count < 1 || count > 64) app_die(3, "--buffers must be 1..64");
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    unsigned char *pat = malloc(n), *back = malloc(n);
    if (!pat || !back) app_die(1, "out of host memory");
    int all_ok = 1;
    for (int i = 0; i < count; i++) {
        void *d;
        ACL_CHECK(aclrtMalloc(&d, n, ACL_MEM_MALLOC_HUGE_FIRST));
        uint64_t seed = 77 + (uint64_t)i;
        for (uint64_t k = 0; k < n; k++) pat[k] = (unsigned char)app_rand_u64(&seed);
        int w = aclrtMemcpy(d, n, pat, n, ACL_MEMCPY_HOST_TO_DEVICE);
        memset(back, 0, n);
        int r = aclrtMemcpy(back, n, d, n, ACL_MEMCPY_DEVICE_TO_HOST);
        int ok = w == 0 && r == 0 && memcmp(back, pat, n) == 0;
        printf("buf=%d write_rc=%d read_rc=%d ok=%d\n", i, w, r, ok);
        all_ok &= ok;
        ACL_CHECK(aclrtFree(d));
    }
    printf("all_ok=%d\n", all_ok);
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return 0;
}
