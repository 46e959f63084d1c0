/* difftest: executes a differential-test script (tests/difftest.rs writes
 * them; saved cases live in tests/difftest/cases/) through the ACL API and
 * prints one result line per call, so that a run on the stock runtime and a
 * run under an interposer can be compared line by line. Scripts name buffers,
 * streams and events by slot number, never by address, so the same script
 * means the same thing in both runs.
 *
 * Script: one call per line, '#' starts a comment. Slots: B (device buffer,
 * 0..255), H (host buffer, 0..63), S (stream, 0 = the default stream,
 * 1..15), E (event, 0..15). A stream field '-' means the synchronous call.
 *   malloc B SIZE POLICY API      API m (aclrtMalloc) c (Cached) a (Align32)
 *   malloc_null SIZE POLICY       aclrtMalloc(NULL, ...)
 *   free B                        aclrtFree of B's pointer (kept: a second free
 *                                 is a double free)
 *   free_interior B OFF | free_host | free_unknown | free_null
 *   hmalloc H SIZE                aclrtMallocHost
 *   hfill H OFF LEN SEED          host writes a pattern
 *   hash H OFF LEN                prints an FNV-1a hash of host bytes
 *   h2d B OFF H HOFF LEN KIND S   KIND: a number (aclrtMemcpyKind); copies
 *   d2h H HOFF B OFF LEN KIND S   count LEN with destMax LEN, or with
 *   d2d B OFF B2 OFF2 LEN KIND S  destMax LEN-1 when the line ends in "over"
 *   memset B OFF LEN VAL S [over]
 *   op NIN NOUT B:OFF:LEN... S    aclopExecuteV2("DiffOp") of 1-D ACL_UINT8
 *                                 tensors: the simulator's hash kernel
 *   stream_create S | stream_destroy S | sync_stream S | sync_device
 *   event_create E | event_destroy E | event_record E S | stream_wait S E |
 *   event_sync E
 * Output: "<line> <verb> rc=<code>" per call ("h=<hash>" added by hash).
 * Exit 0 when the script ran (whatever the codes), 3 on a malformed script. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "acl/acl.h"
#include "common/common.h"

#define NB 256
#define NH 64
#define NS 16
#define NE 16

static void *g_b[NB];
static unsigned char *g_h[NH];
static uint64_t g_hsize[NH];
static aclrtStream g_s[NS];
static aclrtEvent g_e[NE];
static int g_line;
/* NULL, hidden from -Wnonnull: passing it is the point of malloc_null/free_null */
static void *volatile g_null_v;
#define g_null ((void *)g_null_v)

static void bad(const char *what) { app_die(3, "script line %d: %s", g_line, what); }

static long long num(const char *t) {
    if (!t) bad("missing field");
    char *end;
    /* sizes up to 2^64-1 wrap to negative values; they are cast back */
    long long v = *t == '-' ? strtoll(t, &end, 0) : (long long)strtoull(t, &end, 0);
    if (*end || end == t) bad("not a number");
    return v;
}
static int slot(const char *t, int n) {
    long long v = num(t);
    if (v < 0 || v >= n) bad("slot out of range");
    return (int)v;
}
static aclrtStream stream_of(const char *t) {
    if (!t) bad("missing stream");
    return g_s[slot(t, NS)];
}
static unsigned char *host(int h, uint64_t off, uint64_t len) {
    if (!g_h[h] || off + len > g_hsize[h] || off + len < off) bad("host range outside its buffer");
    return g_h[h] + off;
}
/* 1 for a stream field "-" (the synchronous call) */
static int sync_field(const char *t) {
    if (!t) bad("missing stream");
    return t[0] == '-' && t[1] == 0;
}
static char *dev(int b, uint64_t off) { return (char *)g_b[b] + off; }

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    if (argc != 2) app_die(3, "usage: difftest SCRIPT");
    FILE *f = fopen(argv[1], "r");
    if (!f) app_die(3, "cannot open %s", argv[1]);
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    g_s[0] = NULL;
    char line[4096];
    aclopAttr *attr = aclopCreateAttr();
    while (fgets(line, sizeof line, f)) {
        g_line++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *tok[40];
        int nt = 0;
        for (char *p = strtok(line, " \t\r\n"); p && nt < 40; p = strtok(NULL, " \t\r\n")) tok[nt++] = p;
        if (!nt) continue;
        const char *v = tok[0];
        int over = nt > 1 && !strcmp(tok[nt - 1], "over");
        if (over) nt--;
#define T(i) ((i) < nt ? tok[i] : NULL)
        int rc = 0;
        char extra[64] = "";
        if (!strcmp(v, "malloc")) {
            int b = slot(T(1), NB);
            size_t size = (size_t)num(T(2));
            int pol = (int)num(T(3));
            const char *api = T(4);
            if (!api) bad("missing api");
            void *p = NULL;
            if (*api == 'c') rc = aclrtMallocCached(&p, size, (aclrtMemMallocPolicy)pol);
            else if (*api == 'a') rc = aclrtMallocAlign32(&p, size, (aclrtMemMallocPolicy)pol);
            else rc = aclrtMalloc(&p, size, (aclrtMemMallocPolicy)pol);
            if (rc == 0) g_b[b] = p;
        } else if (!strcmp(v, "malloc_null")) {
            rc = aclrtMalloc(g_null, (size_t)num(T(1)), (aclrtMemMallocPolicy)num(T(2)));
        } else if (!strcmp(v, "free")) {
            rc = aclrtFree(g_b[slot(T(1), NB)]);
        } else if (!strcmp(v, "free_interior")) {
            rc = aclrtFree(dev(slot(T(1), NB), (uint64_t)num(T(2))));
        } else if (!strcmp(v, "free_host")) {
            rc = aclrtFree(line);
        } else if (!strcmp(v, "free_unknown")) {
            rc = aclrtFree((void *)(uintptr_t)0x17fff0000000ULL);
        } else if (!strcmp(v, "free_null")) {
            rc = aclrtFree(g_null);
        } else if (!strcmp(v, "hmalloc")) {
            int h = slot(T(1), NH);
            uint64_t size = (uint64_t)num(T(2));
            void *p = NULL;
            rc = aclrtMallocHost(&p, size);
            if (rc == 0) {
                g_h[h] = p;
                g_hsize[h] = size;
                memset(p, 0, size);
            }
        } else if (!strcmp(v, "hfill")) {
            int h = slot(T(1), NH);
            uint64_t off = (uint64_t)num(T(2)), len = (uint64_t)num(T(3));
            uint64_t seed = (uint64_t)num(T(4));
            unsigned char *p = host(h, off, len);
            for (uint64_t k = 0; k < len; k += 8) {
                uint64_t w = app_rand_u64(&seed);
                memcpy(p + k, &w, len - k < 8 ? len - k : 8);
            }
        } else if (!strcmp(v, "hash")) {
            int h = slot(T(1), NH);
            uint64_t off = (uint64_t)num(T(2)), len = (uint64_t)num(T(3));
            snprintf(extra, sizeof extra, " h=%016llx",
                     (unsigned long long)app_fnv(APP_FNV_INIT, host(h, off, len), len));
        } else if (!strcmp(v, "h2d") || !strcmp(v, "d2h") || !strcmp(v, "d2d")) {
            void *dst, *src;
            uint64_t len = (uint64_t)num(T(5));
            if (v[0] == 'h') {
                dst = dev(slot(T(1), NB), (uint64_t)num(T(2)));
                src = host(slot(T(3), NH), (uint64_t)num(T(4)), len);
            } else if (v[2] == 'h') {
                dst = host(slot(T(1), NH), (uint64_t)num(T(2)), len);
                src = dev(slot(T(3), NB), (uint64_t)num(T(4)));
            } else {
                dst = dev(slot(T(1), NB), (uint64_t)num(T(2)));
                src = dev(slot(T(3), NB), (uint64_t)num(T(4)));
            }
            aclrtMemcpyKind kind = (aclrtMemcpyKind)num(T(6));
            size_t dmax = over ? len - 1 : len;
            if (sync_field(T(7))) rc = aclrtMemcpy(dst, dmax, src, len, kind);
            else rc = aclrtMemcpyAsync(dst, dmax, src, len, kind, stream_of(T(7)));
        } else if (!strcmp(v, "memset")) {
            void *p = dev(slot(T(1), NB), (uint64_t)num(T(2)));
            uint64_t len = (uint64_t)num(T(3));
            int val = (int)num(T(4));
            size_t dmax = over ? len - 1 : len;
            if (sync_field(T(5))) rc = aclrtMemset(p, dmax, val, len);
            else rc = aclrtMemsetAsync(p, dmax, val, len, stream_of(T(5)));
        } else if (!strcmp(v, "op")) {
            int nin = (int)num(T(1)), nout = (int)num(T(2)), n = nin + nout;
            if (nin < 0 || nout < 1 || n > 16 || nt != 4 + n) bad("op: NIN NOUT ranges... STREAM");
            aclTensorDesc *desc[16];
            aclDataBuffer *buf[16];
            for (int j = 0; j < n; j++) {
                int b;
                unsigned long long off, len;
                if (sscanf(tok[3 + j], "%d:%llu:%llu", &b, &off, &len) != 3 || b < 0 || b >= NB)
                    bad("op range is B:OFF:LEN");
                int64_t dim = (int64_t)len;
                desc[j] = aclCreateTensorDesc(ACL_UINT8, 1, &dim, ACL_FORMAT_ND);
                buf[j] = aclCreateDataBuffer(dev(b, off), (size_t)len);
                if (!desc[j] || !buf[j]) bad("aclCreateTensorDesc/aclCreateDataBuffer failed");
            }
            rc = aclopExecuteV2("DiffOp", nin, desc, buf, nout, desc + nin, buf + nin, attr, stream_of(T(3 + n)));
            for (int j = 0; j < n; j++) {
                aclDestroyTensorDesc(desc[j]);
                aclDestroyDataBuffer(buf[j]);
            }
        } else if (!strcmp(v, "stream_create")) {
            int s = slot(T(1), NS);
            if (s == 0) bad("stream 0 is the default stream");
            rc = aclrtCreateStream(&g_s[s]);
        } else if (!strcmp(v, "stream_destroy")) {
            rc = aclrtDestroyStream(stream_of(T(1)));
        } else if (!strcmp(v, "sync_stream")) {
            rc = aclrtSynchronizeStream(stream_of(T(1)));
        } else if (!strcmp(v, "sync_device")) {
            rc = aclrtSynchronizeDevice();
        } else if (!strcmp(v, "event_create")) {
            rc = aclrtCreateEvent(&g_e[slot(T(1), NE)]);
        } else if (!strcmp(v, "event_destroy")) {
            rc = aclrtDestroyEvent(g_e[slot(T(1), NE)]);
        } else if (!strcmp(v, "event_record")) {
            rc = aclrtRecordEvent(g_e[slot(T(1), NE)], stream_of(T(2)));
        } else if (!strcmp(v, "stream_wait")) {
            aclrtStream s = stream_of(T(1));
            rc = aclrtStreamWaitEvent(s, g_e[slot(T(2), NE)]);
        } else if (!strcmp(v, "event_sync")) {
            rc = aclrtSynchronizeEvent(g_e[slot(T(1), NE)]);
        } else {
            bad("unknown call");
        }
#undef T
        printf("%d %s rc=%d%s\n", g_line, v, rc, extra);
    }
    fclose(f);
    aclopDestroyAttr(attr);
    printf("end rc=%d\n", aclrtSynchronizeDevice());
    fflush(stdout);
    /* no cleanup of what the script left: aclFinalize must cope */
    ACL_CHECK(aclFinalize());
    return 0;
}
