/* Two simulated devices swap many buffers with ONE HcclBatchSendRecv per rank:
 * rank d sends its buffers src[0..N) to rank 1-d and receives rank 1-d's into
 * dst[0..N), 2N items per call (the items alternate send, receive). Before the
 * exchange each device writes `--fill` more buffers of the same size, so under
 * a tiering library with a small HBM the sources written first are no longer
 * in HBM when the batch runs: every item's memory must be made resident, not
 * only the first few.
 *
 * Options: --items N (80 buffers each way), --bytes B (2M per buffer),
 *          --fill F (buffers written after the sources; 0)
 * Output:  "received_ok=<n>" (buffers whose data is exactly the peer's),
 *          "mismatches=<n>", "checksum=<hex>" (FNV-1a of every received
 *          buffer, device 0 first). ACL/HCCL errors exit 2; usage errors 3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "hccl/hccl.h"
#include "common/common.h"

#define HCCL_CHECK(call) do {                                                                  \
        int hr_ = (int)(call);                                                                  \
        if (hr_ != 0) {                                                                         \
            fprintf(stderr, "batch_sendrecv_app: HCCL error %d at %s:%d: %s\n", hr_, __FILE__,  \
                    __LINE__, #call);                                                           \
            fflush(stdout);                                                                     \
            exit(2);                                                                            \
        }                                                                                       \
    } while (0)

/* The value of word w of buffer i of device d. */
static uint32_t pattern(int d, int i, size_t w) {
    return 0x9e3779b9u * (uint32_t)(d + 1) ^ (uint32_t)i * 0x85ebca6bu ^ (uint32_t)w;
}

int main(int argc, char **argv) {
    int n = 80, fill = 0;
    uint64_t bytes = 2u << 20;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--items"))) n = (int)app_parse_int(v, "--items");
        else if ((v = app_opt(argc, argv, &i, "--bytes"))) bytes = app_parse_size(v, "--bytes");
        else if ((v = app_opt(argc, argv, &i, "--fill"))) fill = (int)app_parse_int(v, "--fill");
        else app_die(3, "usage: batch_sendrecv_app [--items N] [--bytes B] [--fill F]");
    }
    if (n < 1 || n > 4096 || fill < 0 || fill > 65536 || bytes < 4 || bytes % 4 || bytes > (1ull << 30))
        app_die(3, "--items 1..4096, --fill 0..65536, --bytes a multiple of 4 up to 1G");
    const size_t words = bytes / 4;

    ACL_CHECK(aclInit(NULL));
    int32_t devs[2] = { 0, 1 };
    HcclComm comm[2];
    HCCL_CHECK(HcclCommInitAll(2, devs, comm));

    uint32_t *host = malloc(bytes);
    void **src[2], **dst[2], **pad[2];
    aclrtStream st[2];
    if (!host) app_die(3, "out of host memory");
    for (int d = 0; d < 2; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        ACL_CHECK(aclrtCreateStream(&st[d]));
        src[d] = calloc((size_t)n, sizeof(void *));
        dst[d] = calloc((size_t)n, sizeof(void *));
        pad[d] = calloc((size_t)fill + 1, sizeof(void *));
        if (!src[d] || !dst[d] || !pad[d]) app_die(3, "out of host memory");
        for (int i = 0; i < n; i++) {
            ACL_CHECK(aclrtMalloc(&src[d][i], bytes, ACL_MEM_MALLOC_HUGE_FIRST));
            ACL_CHECK(aclrtMalloc(&dst[d][i], bytes, ACL_MEM_MALLOC_HUGE_FIRST));
            for (size_t w = 0; w < words; w++) host[w] = pattern(d, i, w);
            ACL_CHECK(aclrtMemcpy(src[d][i], bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
            ACL_CHECK(aclrtMemset(dst[d][i], bytes, 0, bytes));
        }
        memset(host, 0x5a, bytes);
        for (int i = 0; i < fill; i++) {
            ACL_CHECK(aclrtMalloc(&pad[d][i], bytes, ACL_MEM_MALLOC_HUGE_FIRST));
            ACL_CHECK(aclrtMemcpy(pad[d][i], bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
        }
    }

    HcclSendRecvItem *items = calloc((size_t)n * 2, sizeof *items);
    if (!items) app_die(3, "out of host memory");
    for (int d = 0; d < 2; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        for (int i = 0; i < n; i++) {
            items[2 * i] = (HcclSendRecvItem){ HCCL_SEND, src[d][i], words, HCCL_DATA_TYPE_FP32, (uint32_t)(1 - d) };
            items[2 * i + 1] = (HcclSendRecvItem){ HCCL_RECV, dst[d][i], words, HCCL_DATA_TYPE_FP32, (uint32_t)(1 - d) };
        }
        HCCL_CHECK(HcclBatchSendRecv(items, (uint32_t)n * 2, comm[d], st[d]));
    }

    int ok = 0, bad = 0;
    uint64_t h = APP_FNV_INIT;
    for (int d = 0; d < 2; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        ACL_CHECK(aclrtSynchronizeStream(st[d]));
        for (int i = 0; i < n; i++) {
            ACL_CHECK(aclrtMemcpy(host, bytes, dst[d][i], bytes, ACL_MEMCPY_DEVICE_TO_HOST));
            size_t w = 0;
            while (w < words && host[w] == pattern(1 - d, i, w)) w++;
            if (w == words) ok++;
            else bad++;
            h = app_fnv(h, host, bytes);
        }
    }
    printf("received_ok=%d\nmismatches=%d\nchecksum=%016llx\n", ok, bad, (unsigned long long)h);

    for (int d = 0; d < 2; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        for (int i = 0; i < n; i++) {
            ACL_CHECK(aclrtFree(src[d][i]));
            ACL_CHECK(aclrtFree(dst[d][i]));
        }
        for (int i = 0; i < fill; i++) ACL_CHECK(aclrtFree(pad[d][i]));
        ACL_CHECK(aclrtDestroyStream(st[d]));
        HCCL_CHECK(HcclCommDestroy(comm[d]));
    }
    ACL_CHECK(aclFinalize());
    free(items);
    free(host);
    return bad ? 1 : 0;
}
