/* fork_app: a process that forks after initialising ACL. The child must start
 * clean under an interposer (its own stats segment, no state inherited from
 * the parent's threads); the parent must keep its own. Prints facts about the
 * segment files in $U3M_SHM_DIR (default /dev/shm). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "acl/acl.h"
#include "common/common.h"

static int segment_exists(pid_t pid) {
    const char *dir = getenv("U3M_SHM_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/u3m.%d", dir && *dir ? dir : "/dev/shm", (int)pid);
    return access(path, F_OK) == 0;
}

/* Copies the segment of `pid` to `to`: 1 done, 0 not. */
static int copy_segment(pid_t pid, const char *to) {
    const char *dir = getenv("U3M_SHM_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/u3m.%d", dir && *dir ? dir : "/dev/shm", (int)pid);
    FILE *in = fopen(path, "rb"), *out = fopen(to, "wb");
    int ok = in && out;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    return ok;
}

#define CHILD_CALLS 40

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    void *d;
    ACL_CHECK(aclrtMalloc(&d, 4 << 20, ACL_MEM_MALLOC_HUGE_FIRST));
    printf("parent_segment_before=%d\n", segment_exists(getpid()));
    pid_t child = fork();
    if (child < 0) app_die(1, "fork failed");
    if (child == 0) {
        /* host-side calls only: the simulator's stream threads do not survive fork */
        void *h = NULL;
        int rc = aclrtMallocHost(&h, 4096);
        printf("child_malloc_host=%d\n", rc);
        /* more hooked calls: counted in the child's segment, never the parent's */
        for (int i = 0; i < CHILD_CALLS; i++) {
            void *x = NULL;
            if (aclrtMallocHost(&x, 4096) == ACL_SUCCESS) aclrtFreeHost(x);
        }
        printf("child_segment=%d\n", segment_exists(getpid()));
        printf("child_sees_parent_segment=%d\n", segment_exists(getppid()));
        if (h) aclrtFreeHost(h);
        fflush(stdout);
        exit(0);
    }
    int st = 0;
    waitpid(child, &st, 0);
    printf("child_exit=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    printf("child_segment_after_exit=%d\n", segment_exists(child));
    printf("parent_segment_after=%d\n", segment_exists(getpid()));
    /* FORK_APP_SEG_COPY=PATH: a copy of the parent's segment as it stands
     * after the child's exit (the test reads its call counts) */
    const char *copy = getenv("FORK_APP_SEG_COPY");
    if (copy && *copy) printf("parent_segment_copied=%d\n", copy_segment(getpid(), copy));
    ACL_CHECK(aclrtFree(d));
    ACL_CHECK(aclFinalize());
    return 0;
}
