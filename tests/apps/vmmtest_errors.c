/* Error behaviour of the VMM calls (aclrtReserveMemAddress, aclrtMallocPhysical,
 * aclrtMapMem, aclrtUnmapMem, aclrtFreePhysical, aclrtReleaseMemAddress) on
 * device 0. Prints "<case>=<aclError>" for each misuse; the test decides which
 * codes are right. --case misuse (default) | fill (allocate 2 MiB handles until
 * the device is full) | faults (three allocations, for ACLSIM_FAULTS=phys:N).
 * Setup failures exit 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "common/common.h"

#define MIB (1024ULL * 1024)

static aclrtPhysicalMemProp g_prop = { ACL_MEM_HANDLE_TYPE_NONE, ACL_MEM_ALLOCATION_TYPE_PINNED, ACL_HBM_MEM_HUGE,
                                       { 0, ACL_MEM_LOCATION_TYPE_DEVICE }, 0 };

#define P(name, expr) printf("%s=%d\n", name, (int)(expr))

static int case_misuse(void) {
    void *va = NULL;
    aclrtDrvMemHandle h2 = NULL, h4 = NULL, hx = NULL;
    ACL_CHECK(aclrtReserveMemAddress(&va, 16 * MIB, 0, NULL, 1));
    char *v = va;

    P("phys_not_multiple", aclrtMallocPhysical(&hx, 1 * MIB, &g_prop, 0));
    P("phys_size0", aclrtMallocPhysical(&hx, 0, &g_prop, 0));
    P("phys_flags", aclrtMallocPhysical(&hx, 2 * MIB, &g_prop, 1));
    P("phys_null_prop", aclrtMallocPhysical(&hx, 2 * MIB, NULL, 0));
    ACL_CHECK(aclrtMallocPhysical(&h2, 2 * MIB, &g_prop, 0));
    ACL_CHECK(aclrtMallocPhysical(&h4, 4 * MIB, &g_prop, 0));

    P("map_unaligned_va", aclrtMapMem(v + 4096, 2 * MIB, 0, h2, 0));
    P("map_size_not_multiple", aclrtMapMem(v, 1 * MIB, 0, h2, 0));
    P("map_size_beyond_handle", aclrtMapMem(v, 4 * MIB, 0, h2, 0));
    P("map_outside_reservation", aclrtMapMem(v + 16 * MIB, 2 * MIB, 0, h2, 0));
    P("map_runs_off_reservation", aclrtMapMem(v + 14 * MIB, 4 * MIB, 0, h4, 0));
    P("map_host_pointer", aclrtMapMem(&g_prop, 2 * MIB, 0, h2, 0));
    P("map_bad_handle", aclrtMapMem(v, 2 * MIB, 0, (aclrtDrvMemHandle)&g_prop, 0));
    P("map_ok", aclrtMapMem(v, 2 * MIB, 0, h2, 0));
    P("map_over_mapped", aclrtMapMem(v, 4 * MIB, 0, h4, 0));
    P("map_ok2", aclrtMapMem(v + 2 * MIB, 4 * MIB, 0, h4, 0));
    P("map_overlap_tail", aclrtMapMem(v + 4 * MIB, 2 * MIB, 0, h2, 0));

    P("unmap_not_start", aclrtUnmapMem(v + 4 * MIB));
    P("unmap_interior_byte", aclrtUnmapMem(v + 2 * MIB + 4096));
    P("unmap_unmapped", aclrtUnmapMem(v + 8 * MIB));
    P("free_mapped", aclrtFreePhysical(h2));
    P("release_live", aclrtReleaseMemAddress(va));
    P("release_interior", aclrtReleaseMemAddress(v + 2 * MIB));

    P("unmap_ok", aclrtUnmapMem(v));
    P("unmap_twice", aclrtUnmapMem(v));
    P("free_ok", aclrtFreePhysical(h2));
    P("free_twice", aclrtFreePhysical(h2));
    P("release_still_live", aclrtReleaseMemAddress(va));
    P("unmap_ok2", aclrtUnmapMem(v + 2 * MIB));
    P("free_ok2", aclrtFreePhysical(h4));
    P("release_ok", aclrtReleaseMemAddress(va));
    P("release_twice", aclrtReleaseMemAddress(va));

    size_t fr = 0, total = 0;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &fr, &total));
    P("phys_over_capacity", aclrtMallocPhysical(&hx, (total / (2 * MIB) + 1) * 2 * MIB, &g_prop, 0));
    P("reserve_probe", aclrtReserveMemAddress(&va, 512, 0, NULL, 1));
    P("release_probe", aclrtReleaseMemAddress(va));
    P("reserve_alignment", aclrtReserveMemAddress(&va, 2 * MIB, 4096, NULL, 0));
    P("reserve_expect_ptr", aclrtReserveMemAddress(&va, 2 * MIB, 0, (void *)0x1000, 0));
    return 0;
}

static int case_fill(void) {
    size_t fr = 0, total = 0;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &fr, &total));
    size_t cap = total / (2 * MIB) + 8;
    aclrtDrvMemHandle *hs = calloc(cap, sizeof *hs);
    if (!hs) app_die(3, "out of host memory");
    size_t n = 0;
    int rc = 0;
    while (n < cap && (rc = aclrtMallocPhysical(&hs[n], 2 * MIB, &g_prop, 0)) == 0) n++;
    size_t fr_full = 0;
    ACL_CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &fr_full, &total));
    printf("total=%zu filled=%zu fail=%d free_when_full=%zu\n", total, n, rc, fr_full);
    for (size_t i = 0; i < n; i++) ACL_CHECK(aclrtFreePhysical(hs[i]));
    /* room again after freeing */
    aclrtDrvMemHandle h;
    P("after_free", aclrtMallocPhysical(&h, 2 * MIB, &g_prop, 0));
    ACL_CHECK(aclrtFreePhysical(h));
    free(hs);
    return 0;
}

static int case_faults(void) {
    aclrtDrvMemHandle h[3] = { 0 };
    for (int i = 0; i < 3; i++) {
        int rc = aclrtMallocPhysical(&h[i], 2 * MIB, &g_prop, 0);
        printf("phys%d=%d\n", i + 1, rc);
        if (rc) h[i] = NULL;
    }
    for (int i = 0; i < 3; i++)
        if (h[i]) ACL_CHECK(aclrtFreePhysical(h[i]));
    return 0;
}

int main(int argc, char **argv) {
    const char *which = "misuse";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--case"))) which = v;
        else app_die(3, "usage: vmmtest_errors [--case misuse|fill|faults]");
    }
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    int rc;
    if (!strcmp(which, "misuse")) rc = case_misuse();
    else if (!strcmp(which, "fill")) rc = case_fill();
    else if (!strcmp(which, "faults")) rc = case_faults();
    else app_die(3, "unknown case '%s'", which);
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return rc;
}
