/* oversize_app (issue 11): one operator whose memory is larger than HBM, the
 * shape of a fused optimizer step over a flat parameter set.
 *
 *   oversize_app [--inputs N] [--bytes B] [--steps S] [--op NAME]
 *
 * Allocates N input buffers and one output of B bytes each (all filled from
 * the host with seeded data), plus a small "keep" buffer no operator
 * touches. Each step launches one byte-range operator (aclopExecuteV2, every
 * buffer a 1-D ACL_UINT8 tensor: the simulator hashes the inputs into the
 * output) reading all N inputs and writing the output, then synchronises.
 * A step that fails is reported, not fatal: the program then reads every
 * buffer back, so a refused launch can be seen to have left the data intact.
 *
 * Prints "step=<i> op_rc=<code>" per step, then
 * "inputs=<fnv> output=<fnv> keep_ok=<0|1> checksum=<fnv of all>". */
#include <stdio.h>
#include <string.h>
#include "acl/acl.h"
#include "common/common.h"

static uint64_t read_hash(uint64_t h, void *d, uint64_t n, unsigned char *back) {
    ACL_CHECK(aclrtMemcpy(back, n, d, n, ACL_MEMCPY_DEVICE_TO_HOST));
    return app_fnv(h, back, n);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int nin = 4, steps = 1;
    uint64_t n = 16 << 20;
    const char *op = "ApplyAdamW";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--inputs"))) nin = (int)app_parse_int(v, "--inputs");
        else if ((v = app_opt(argc, argv, &i, "--bytes"))) n = app_parse_size(v, "--bytes");
        else if ((v = app_opt(argc, argv, &i, "--steps"))) steps = (int)app_parse_int(v, "--steps");
        else if ((v = app_opt(argc, argv, &i, "--op"))) op = v;
        else app_die(3, "usage: oversize_app [--inputs N] [--bytes B] [--steps S] [--op NAME]");
    }
    if (nin < 1 || nin > 4096 || n == 0 || steps < 0) app_die(3, "bad arguments");
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    aclrtStream st;
    ACL_CHECK(aclrtCreateStream(&st));
    unsigned char *host = malloc(n);
    if (!host) app_die(1, "out of host memory");
    int nb = nin + 1;
    void **dev = calloc((size_t)nb, sizeof(void *));
    aclTensorDesc **desc = calloc((size_t)nb, sizeof(*desc));
    aclDataBuffer **buf = calloc((size_t)nb, sizeof(*buf));
    if (!dev || !desc || !buf) app_die(1, "out of host memory");
    int64_t dim = (int64_t)n;
    for (int i = 0; i < nb; i++) {
        ACL_CHECK(aclrtMalloc(&dev[i], n, ACL_MEM_MALLOC_HUGE_FIRST));
        uint64_t seed = 1000 + (uint64_t)i;
        for (uint64_t k = 0; k + 8 <= n; k += 8) {
            uint64_t w = app_rand_u64(&seed);
            memcpy(host + k, &w, 8);
        }
        ACL_CHECK(aclrtMemcpy(dev[i], n, host, n, ACL_MEMCPY_HOST_TO_DEVICE));
        desc[i] = aclCreateTensorDesc(ACL_UINT8, 1, &dim, ACL_FORMAT_ND);
        buf[i] = aclCreateDataBuffer(dev[i], n);
        if (!desc[i] || !buf[i]) app_die(1, "aclCreateTensorDesc/aclCreateDataBuffer failed");
    }
    /* data no operator touches */
    const uint64_t keep_n = 1 << 20;
    unsigned char *keep_host = malloc(keep_n), *keep_back = malloc(keep_n);
    if (!keep_host || !keep_back) app_die(1, "out of host memory");
    for (uint64_t k = 0; k < keep_n; k++) keep_host[k] = (unsigned char)(k * 131 + 7);
    void *keep;
    ACL_CHECK(aclrtMalloc(&keep, keep_n, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMemcpy(keep, keep_n, keep_host, keep_n, ACL_MEMCPY_HOST_TO_DEVICE));
    aclopAttr *attr = aclopCreateAttr();
    if (!attr) app_die(1, "aclopCreateAttr failed");
    for (int s = 0; s < steps; s++) {
        int rc = aclopExecuteV2(op, nin, desc, buf, 1, desc + nin, buf + nin, attr, st);
        if (rc == 0) rc = aclrtSynchronizeStream(st);
        printf("step=%d op_rc=%d\n", s, rc);
    }
    ACL_CHECK(aclrtSynchronizeStream(st));
    uint64_t hin = APP_FNV_INIT, hout = APP_FNV_INIT;
    for (int i = 0; i < nin; i++) hin = read_hash(hin, dev[i], n, host);
    hout = read_hash(hout, dev[nin], n, host);
    ACL_CHECK(aclrtMemcpy(keep_back, keep_n, keep, keep_n, ACL_MEMCPY_DEVICE_TO_HOST));
    int keep_ok = memcmp(keep_back, keep_host, keep_n) == 0;
    uint64_t all = app_fnv(app_fnv(APP_FNV_INIT, &hin, 8), &hout, 8);
    printf("inputs=%016llx output=%016llx keep_ok=%d checksum=%016llx\n", (unsigned long long)hin,
        (unsigned long long)hout, keep_ok, (unsigned long long)all);
    aclopDestroyAttr(attr);
    for (int i = 0; i < nb; i++) {
        aclDestroyDataBuffer(buf[i]);
        aclDestroyTensorDesc(desc[i]);
        ACL_CHECK(aclrtFree(dev[i]));
    }
    ACL_CHECK(aclrtFree(keep));
    ACL_CHECK(aclrtDestroyStream(st));
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    return 0;
}
