/* malloc_bad_policy (issue 13, finding 4): an aclrtMalloc-family call with a
 * policy that is not an aclrtMemMallocPolicy value is refused with
 * ACL_ERROR_INVALID_PARAM (100000), whatever the size — an interposer that
 * manages large allocations itself must refuse it too. Prints one
 * "<api> size=<bytes> policy=<p> rc=<code>" line per call. */
#include <stdio.h>
#include "acl/acl.h"
#include "common/common.h"

typedef aclError (*malloc_fn)(void **, size_t, aclrtMemMallocPolicy);

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    struct { const char *name; malloc_fn f; } apis[] = {
        {"aclrtMalloc", aclrtMalloc},
        {"aclrtMallocCached", aclrtMallocCached},
        {"aclrtMallocAlign32", aclrtMallocAlign32},
    };
    const size_t sizes[] = {4096, 4 << 20, 64 << 20};
    const int policies[] = {99, 12, 0xff, -1};
    for (size_t a = 0; a < sizeof apis / sizeof *apis; a++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t p = 0; p < sizeof policies / sizeof *policies; p++) {
                void *d = NULL;
                int rc = apis[a].f(&d, sizes[s], (aclrtMemMallocPolicy)policies[p]);
                printf("%s size=%zu policy=%d rc=%d\n", apis[a].name, sizes[s], policies[p], rc);
                if (rc == 0) ACL_CHECK(aclrtFree(d));
            }
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return 0;
}
