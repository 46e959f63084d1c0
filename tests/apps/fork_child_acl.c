/* fork_child_acl (issue 13, finding 5): a process that initialised ACL and
 * holds device memory (--buffers buffers of --bytes each: more than HBM
 * under an interposer that tiers) forks; the child keeps using ACL with
 * synchronous calls (the simulator's stream threads do not survive fork,
 * synchronous copies run on the calling thread): it reads the parent's
 * buffers, allocates its own buffer, writes and reads it back. The stock
 * runtime serves the child; an interposer must too.
 * Prints the child's facts (child_read_rc= (first failing code or 0),
 * child_parent_ok=, child_malloc_rc=, child_write_rc=, child_readback_rc=,
 * child_ok=), then child_exit= and the parent's parent_ok= after the child
 * is gone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "acl/acl.h"
#include "common/common.h"

static void fill(unsigned char *p, uint64_t n, uint64_t seed) {
    for (uint64_t k = 0; k < n; k++) p[k] = (unsigned char)app_rand_u64(&seed);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    uint64_t n = 8 << 20;
    int count = 1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--bytes"))) n = app_parse_size(v, "--bytes");
        else if ((v = app_opt(argc, argv, &i, "--buffers"))) count = (int)app_parse_int(v, "--buffers");
        else app_die(3, "usage: fork_child_acl [--bytes N] [--buffers K]");
    }
    if (count < 1 || count > 64) app_die(3, "--buffers must be 1..64");
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    unsigned char *pat = malloc(n), *back = malloc(n);
    if (!pat || !back) app_die(1, "out of host memory");
    void *d[64];
    for (int b = 0; b < count; b++) {
        ACL_CHECK(aclrtMalloc(&d[b], n, ACL_MEM_MALLOC_HUGE_FIRST));
        fill(pat, n, 5 + (uint64_t)b);
        ACL_CHECK(aclrtMemcpy(d[b], n, pat, n, ACL_MEMCPY_HOST_TO_DEVICE));
    }
    ACL_CHECK(aclrtSynchronizeDevice());
    pid_t child = fork();
    if (child < 0) app_die(1, "fork failed");
    if (child == 0) {
        int rc = 0, parent_ok = 1;
        for (int b = 0; b < count; b++) {
            memset(back, 0, n);
            int r = aclrtMemcpy(back, n, d[b], n, ACL_MEMCPY_DEVICE_TO_HOST);
            if (r && !rc) rc = r;
            fill(pat, n, 5 + (uint64_t)b);
            parent_ok &= r == 0 && memcmp(back, pat, n) == 0;
        }
        printf("child_read_rc=%d\n", rc);
        printf("child_parent_ok=%d\n", parent_ok);
        void *c = NULL;
        int mrc = aclrtMalloc(&c, n, ACL_MEM_MALLOC_HUGE_FIRST);
        printf("child_malloc_rc=%d\n", mrc);
        int wrc = -1, rrc = -1, ok = 0;
        if (mrc == 0) {
            unsigned char *p2 = malloc(n);
            if (!p2) app_die(1, "out of host memory");
            fill(p2, n, 6);
            wrc = aclrtMemcpy(c, n, p2, n, ACL_MEMCPY_HOST_TO_DEVICE);
            memset(back, 0, n);
            rrc = aclrtMemcpy(back, n, c, n, ACL_MEMCPY_DEVICE_TO_HOST);
            ok = wrc == 0 && rrc == 0 && memcmp(back, p2, n) == 0;
            printf("child_free_rc=%d\n", aclrtFree(c));
        }
        printf("child_write_rc=%d\nchild_readback_rc=%d\nchild_ok=%d\n", wrc, rrc, ok);
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    waitpid(child, &st, 0);
    printf("child_exit=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    int parent_ok = 1;
    for (int b = 0; b < count; b++) {
        memset(back, 0, n);
        ACL_CHECK(aclrtMemcpy(back, n, d[b], n, ACL_MEMCPY_DEVICE_TO_HOST));
        fill(pat, n, 5 + (uint64_t)b);
        parent_ok &= memcmp(back, pat, n) == 0;
        ACL_CHECK(aclrtFree(d[b]));
    }
    printf("parent_ok=%d\n", parent_ok);
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return 0;
}
