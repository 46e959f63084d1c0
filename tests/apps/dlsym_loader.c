/* dlsym_loader: looks ACL functions up the ways torch_npu does (dlopen of the
 * runtime library + dlsym on that handle; dlsym(RTLD_DEFAULT) as its
 * FunctionLoader does when LD_PRELOAD is set; op-plugin's dlsym on a
 * libopapi handle) and prints, for each lookup, the object the returned
 * pointer lies in. Also checks that RTLD_NEXT lookups and lookups of missing
 * names behave exactly as without an interposer, then allocates and frees
 * through the looked-up pointers. Links only -ldl. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static const char *obj(void *p) {
    if (!p) return "null";
    Dl_info info;
    if (!dladdr(p, &info) || !info.dli_fname) return "unknown";
    const char *slash = strrchr(info.dli_fname, '/');
    const char *name = slash ? slash + 1 : info.dli_fname;
    return *name ? name : "main";
}

static void show(const char *what, void *p) { printf("%s=%s\n", what, obj(p)); }

typedef int (*init_fn)(const char *);
typedef int (*setdev_fn)(int);
typedef int (*malloc_fn)(void **, size_t, int);
typedef int (*free_fn)(void *);

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *rt = dlopen("libascendcl.so", RTLD_LAZY);
    void *opapi = dlopen("libopapi.so", RTLD_LAZY | RTLD_LOCAL);
    if (!rt || !opapi) {
        fprintf(stderr, "dlsym_loader: dlopen failed: %s\n", dlerror());
        return 2;
    }
    show("handle_aclrtMallocAlign32", dlsym(rt, "aclrtMallocAlign32"));
    show("handle_aclrtFree", dlsym(rt, "aclrtFree"));
    show("default_aclrtMalloc", dlsym(RTLD_DEFAULT, "aclrtMalloc"));
    show("next_aclrtMalloc", dlsym(RTLD_NEXT, "aclrtMalloc"));
    show("next_printf", dlsym(RTLD_NEXT, "printf"));
    show("handle_missing", dlsym(rt, "aclrtMallocWithCfg"));
    show("default_missing", dlsym(RTLD_DEFAULT, "aclrtMallocWithCfg"));
    show("handle_not_acl", dlsym(rt, "aclsim_log"));
    show("opapi_aclnnAdd", dlsym(opapi, "aclnnAdd"));
    show("opapi_aclnnAddGetWorkspaceSize", dlsym(opapi, "aclnnAddGetWorkspaceSize"));
    show("opapi_aclCreateTensor", dlsym(opapi, "aclCreateTensor"));
    show("dlvsym_next_printf", dlvsym(RTLD_NEXT, "printf", "GLIBC_2.2.5"));
    /* the same name twice gives the same pointer */
    printf("stable=%d\n", dlsym(rt, "aclrtMallocAlign32") == dlsym(rt, "aclrtMallocAlign32"));

    init_fn init = (init_fn)dlsym(rt, "aclInit");
    setdev_fn setdev = (setdev_fn)dlsym(rt, "aclrtSetDevice");
    malloc_fn m = (malloc_fn)dlsym(rt, "aclrtMallocAlign32");
    free_fn f = (free_fn)dlsym(rt, "aclrtFree");
    if (!init || !setdev || !m || !f) return 2;
    printf("init=%d setdev=%d\n", init(NULL), setdev(0));
    void *p = NULL;
    int rc = m(&p, 4 << 20, 0);
    printf("malloc=%d free=%d free_again=%d\n", rc, f(p), f(p));
    return 0;
}
