/* acl_replay TRACE [--no-verify] [--device N] [--discard] [--frees] [--sums]
 *
 * Executes a u3m access trace (docs: trace-format.md) through the ACL API, so a
 * recorded workload can be re-run on the runtime (and under libu3m.so).
 *
 *   A   -> aclrtMalloc(HUGE_FIRST)            (0-byte allocations get 1 byte)
 *   F   -> (read back unless --no-verify) sync the streams that used it, aclrtFree
 *   O   -> aclopExecuteV2(op_type); each range is a data buffer with a 1-D
 *          ACL_UINT8 description of its byte length; `flops=` -> int attr "flops"
 *   M   -> aclrtMemcpyAsync; host addresses name host staging buffers of our own
 *          (aclrtMallocHost, one per distinct host address, as large as the
 *          largest copy that names it); H2D sources are pre-filled with
 *          splitmix64 words seeded by the host address (not in phantom mode,
 *          ACLSIM_PHANTOM=1, where copies carry no data)
 *   S   -> aclrtMemsetAsync with value = low byte of the trace line number
 * Zero-byte copies and memsets are skipped (nothing to move). Lines may end in
 * CRLF; everything else follows trace-format.md strictly.
 *
 * Devices: trace dev=d runs on device N+d (N from --device, default 0).
 * Streams: one ACL stream per (dev, stream=) pair the trace names, created after
 * validation and before the first event, so every stream's start event marks
 * the same instant. Cross-stream order: per allocation and per host buffer we
 * track the last writer and the readers since; an access on stream b that
 * conflicts with earlier work on stream a (RAW, WAR, WAW) makes b wait on an
 * event recorded on a (same device) or synchronises a on the host (different
 * devices). Recorded events are destroyed in batches, after synchronising all
 * streams (the runtime requires events to be complete before destruction).
 *
 * Output: one line "checksum=<hex> ops=<n> sim_ns=<n>". The checksum
 * (FNV-1a 64) chains, in trace order: the bytes of every D2H copy (hashed once
 * the copy is complete: when its host buffer is next overwritten, at the next
 * read-back, or at the end) and, unless --no-verify, the full contents of each
 * allocation read back just before it is freed; then those of every allocation
 * still live at the end, in order of allocation. In phantom mode read-back
 * copies are issued but, carrying no data, not hashed. sim_ns = max over
 * streams of the simulated time between a start event and an end event
 * recorded on that stream (end events follow the last trace event and precede
 * the final read-back; read-backs at F events are inside the window, so use
 * --no-verify for timing runs).
 *
 * --discard: acl_replay then plays a framework that knows when its blocks die
 * (docs/api.md): right after issuing the last access to a 2 MiB chunk of an
 * allocation (counted from its start; the last chunk ends with it) before an
 * event that writes all of it without reading it, it calls u3m_discard on the
 * chunk — if libu3m.so provides it (dlsym); without it nothing changes.
 * `u3m replay --discard-dead` calls the Tier's discard at the same places.
 *
 * --frees: acl_replay plays torch_npu under libu3m.so, whose caching allocator
 * reports each freed block to u3m (docs/torch-npu.md): at each
 * `# free ADDR BYTES` comment (`u3m synth --frees`) it calls u3m_discard on
 * those bytes, if libu3m.so provides it. Without the flag such comments are
 * comments; with it, one naming bytes outside a live allocation is an error.
 *
 * --sums: also write to stderr, for each allocation read back (at its free or
 * at the end; not in phantom mode), "sum alloc=K off=O fnv=H" per 2 MiB of it
 * (K: the trace's allocation index from 0; O: the byte offset) and each
 * allocation's address as "alloc=K ptr=P" when it is made: which chunk of
 * which allocation differs between two runs whose checksums differ (the
 * forty-first sitting found u3m's hand-off bug so).
 *
 * Errors: malformed trace -> "acl_replay: FILE:LINE: what", exit 3, nothing run
 * (the whole trace is validated before aclInit); ACL error -> "acl_replay:
 * trace line L: ACL error C in CALL", exit 2. Asynchronous errors surface at
 * the next synchronisation and are reported with that line. */
#include "acl/acl.h"
#include "common/common.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

static int g_frees;   /* --frees: '# free' comments are hints */

#define PROG "acl_replay"
#define READBACK_CHUNK (64ull << 20)
#define EVENT_BATCH 1024

/* ------------------------------------------------------------------ utils */

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) app_die(2, "out of host memory (%zu bytes)", n);
    return p;
}
static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) app_die(2, "out of host memory (%zu bytes)", n);
    return p;
}
#define GROW(arr, n, cap) do { if ((n) >= (cap)) { (cap) = (cap) ? 2 * (cap) : 16; \
    (arr) = xrealloc((arr), (size_t)(cap) * sizeof(*(arr))); } } while (0)

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* u64 -> int open-addressing map (device ids, (dev,stream) pairs, host addrs). */
typedef struct u64map {
    uint64_t *keys;
    int *vals;
    unsigned char *used;
    size_t cap, n;
} u64map;

static int map_get(const u64map *m, uint64_t k) {
    if (!m->cap) return -1;
    for (size_t i = mix64(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->used[i]) return -1;
        if (m->keys[i] == k) return m->vals[i];
    }
}
static void map_put(u64map *m, uint64_t k, int v) {
    if (2 * (m->n + 1) > m->cap) {
        u64map nm = {0};
        nm.cap = m->cap ? 2 * m->cap : 64;
        nm.keys = xmalloc(nm.cap * sizeof(uint64_t));
        nm.vals = xmalloc(nm.cap * sizeof(int));
        nm.used = calloc(nm.cap, 1);
        if (!nm.used) app_die(2, "out of host memory");
        for (size_t i = 0; i < m->cap; i++)
            if (m->used[i]) map_put(&nm, m->keys[i], m->vals[i]);
        free(m->keys); free(m->vals); free(m->used);
        *m = nm;
    }
    size_t i = mix64(k) & (m->cap - 1);
    while (m->used[i] && m->keys[i] != k) i = (i + 1) & (m->cap - 1);
    if (!m->used[i]) { m->used[i] = 1; m->keys[i] = k; m->n++; }
    m->vals[i] = v;
}

/* ------------------------------------------- live allocations: a treap */

typedef struct node {
    uint64_t addr, bytes;
    int id;              /* allocation id (index into g_allocs) */
    uint64_t prio;
    struct node *l, *r;
} node;

static void tp_split(node *t, uint64_t key, node **lo, node **hi) {  /* lo: < key */
    if (!t) { *lo = *hi = NULL; return; }
    if (t->addr < key) { tp_split(t->r, key, &t->r, hi); *lo = t; }
    else { tp_split(t->l, key, lo, &t->l); *hi = t; }
}
static node *tp_merge(node *a, node *b) {
    if (!a) return b;
    if (!b) return a;
    if (a->prio > b->prio) { a->r = tp_merge(a->r, b); return a; }
    b->l = tp_merge(a, b->l);
    return b;
}
static void tp_insert(node **root, node *n) {
    node *lo, *hi;
    tp_split(*root, n->addr, &lo, &hi);
    *root = tp_merge(tp_merge(lo, n), hi);
}
static node *tp_floor(node *t, uint64_t key) {   /* largest addr <= key */
    node *best = NULL;
    while (t) {
        if (t->addr <= key) { best = t; t = t->r; } else t = t->l;
    }
    return best;
}
static node *tp_higher(node *t, uint64_t key) {  /* smallest addr > key */
    node *best = NULL;
    while (t) {
        if (t->addr > key) { best = t; t = t->l; } else t = t->r;
    }
    return best;
}
static node *tp_erase(node **root, uint64_t key) {  /* returns the unlinked node */
    node **p = root;
    while (*p && (*p)->addr != key) p = key < (*p)->addr ? &(*p)->l : &(*p)->r;
    node *n = *p;
    if (n) *p = tp_merge(n->l, n->r);
    return n;
}
static void tp_free_all(node *t) {
    if (!t) return;
    tp_free_all(t->l);
    tp_free_all(t->r);
    free(t);
}
static uint64_t span(uint64_t bytes) { return bytes ? bytes : 1; }  /* 0-byte A still occupies its address */

/* ------------------------------------------------------------ trace model */

enum { MK_H2H = 0, MK_H2D, MK_D2H, MK_D2D };  /* same order as aclrtMemcpyKind */

typedef struct rng {     /* a device range resolved to its allocation */
    int alloc;
    uint64_t off, bytes;
} rng;

typedef struct event {
    char kind;
    int dev_slot, stream_slot;
    int has_flops;
    uint64_t flops;
    /* A/F */
    int alloc;
    uint64_t bytes;
    /* O */
    const char *op;
    int n_in, n_out;
    rng *r;              /* points into g_rbuf */
    /* M */
    int mkind;
    rng d_dst, d_src;
    uint64_t h_dst, h_src;
    /* S */
    rng s;
} event;

typedef struct alloc_rec { int dev_slot; uint64_t addr, bytes; } alloc_rec;

static const char *g_file;
static alloc_rec *g_arec;
static int g_narec, g_caparec;
static int g_nalloc_pass;      /* allocation ids handed out in the current pass */

typedef struct dev_slot { int64_t dev; node *live; int first_line; } dev_slot;
static dev_slot *g_devs;
static int g_ndevs, g_capdevs;
static u64map g_devmap;

typedef struct stream_key { int dev_slot; uint64_t id; int first_line; } stream_key;
static stream_key *g_skeys;
static int g_nskeys, g_capskeys;
static u64map g_smap;

typedef struct hostbuf_rec { uint64_t addr, bytes; } hostbuf_rec;
static hostbuf_rec *g_hrec;
static int g_nhrec, g_caphrec;
static u64map g_hmap;

static rng *g_rbuf;
static int g_caprbuf;

static void trace_die(int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void trace_die(int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, PROG ": %s:%d: ", g_file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(3);
}

static int parse_hex(const char *s, uint64_t *v) {
    if (s[0] != '0' || s[1] != 'x' || !s[2]) return -1;
    uint64_t x = 0;
    for (const char *p = s + 2; *p; p++) {
        int d;
        if (*p >= '0' && *p <= '9') d = *p - '0';
        else if (*p >= 'a' && *p <= 'f') d = *p - 'a' + 10;
        else if (*p >= 'A' && *p <= 'F') d = *p - 'A' + 10;
        else return -1;
        if (x >> 60) return -1;   /* overflow */
        x = (x << 4) | (uint64_t)d;
    }
    *v = x;
    return 0;
}
static int parse_dec(const char *s, uint64_t *v) {
    if (!*s) return -1;
    uint64_t x = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        uint64_t d = (uint64_t)(*p - '0');
        if (x > (UINT64_MAX - d) / 10) return -1;
        x = x * 10 + d;
    }
    *v = x;
    return 0;
}
static int is_kv(const char *t) { const char *e = strchr(t, '='); return e && e != t; }

static int dev_slot_of(uint64_t dev, int line) {
    int s = map_get(&g_devmap, dev);
    if (s >= 0) return s;
    GROW(g_devs, g_ndevs, g_capdevs);
    g_devs[g_ndevs].dev = (int64_t)dev;
    g_devs[g_ndevs].live = NULL;
    g_devs[g_ndevs].first_line = line;
    map_put(&g_devmap, dev, g_ndevs);
    return g_ndevs++;
}
static int stream_slot_of(int dslot, uint64_t id, int line) {
    uint64_t key = ((uint64_t)dslot << 32) | id;
    int s = map_get(&g_smap, key);
    if (s >= 0) return s;
    GROW(g_skeys, g_nskeys, g_capskeys);
    g_skeys[g_nskeys].dev_slot = dslot;
    g_skeys[g_nskeys].id = id;
    g_skeys[g_nskeys].first_line = line;
    map_put(&g_smap, key, g_nskeys);
    return g_nskeys++;
}
/* Host buffers are sized by pass 1; pass 2 only looks them up. */
static void host_note(uint64_t addr, uint64_t bytes) {
    int h = map_get(&g_hmap, addr);
    if (h < 0) {
        GROW(g_hrec, g_nhrec, g_caphrec);
        g_hrec[g_nhrec].addr = addr;
        g_hrec[g_nhrec].bytes = 0;
        map_put(&g_hmap, addr, g_nhrec);
        h = g_nhrec++;
    }
    if (bytes > g_hrec[h].bytes) g_hrec[h].bytes = bytes;
}

static void need_hex(int line, const char *tok, const char *what, uint64_t *v) {
    if (!tok || is_kv(tok)) trace_die(line, "missing %s", what);
    if (parse_hex(tok, v)) trace_die(line, "bad %s '%s': expected hexadecimal with a 0x prefix", what, tok);
}
static void need_dec(int line, const char *tok, const char *what, uint64_t *v) {
    if (!tok || is_kv(tok)) trace_die(line, "missing %s", what);
    if (parse_dec(tok, v)) trace_die(line, "bad %s '%s': expected a decimal number", what, tok);
}

/* Resolves [addr, addr+bytes) to the live allocation containing it. */
static rng resolve(int line, int dslot, uint64_t addr, uint64_t bytes, const char *what) {
    node *p = tp_floor(g_devs[dslot].live, addr);
    if (!p || addr - p->addr > p->bytes || bytes > p->bytes - (addr - p->addr))
        trace_die(line, "%s range 0x%" PRIx64 ":%" PRIu64 " is not inside one live allocation on device %" PRId64,
            what, addr, bytes, g_devs[dslot].dev);
    rng r = { p->id, addr - p->addr, bytes };
    return r;
}

static char **g_tok;
static int g_captok;

/* Parses and validates one line against the live-allocation model (updating
 * it). Returns 0 for an event (filled into *ev), 1 for a blank/comment line.
 * Both passes run this, so allocation ids agree between them. */
static int parse_line(char *line, int lineno, event *ev) {
    int nt = 0;
    for (char *p = line;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        GROW(g_tok, nt, g_captok);
        g_tok[nt++] = p;
        while (*p && *p != ' ' && *p != '\t') p++;
        if (*p) *p++ = 0;
    }
    if (nt == 0) return 1;
    if (g_tok[0][0] == '#') {
        if (!g_frees || nt < 2 || strcmp(g_tok[0], "#") || strcmp(g_tok[1], "free")) return 1;
        /* --frees: a block the caching allocator freed (device 0, as synth writes) */
        uint64_t fa = 0, fb = 0;
        if (nt != 4) trace_die(lineno, "'# free' comment: expected '# free <0xaddr> <bytes>'");
        need_hex(lineno, g_tok[2], "address", &fa);
        need_dec(lineno, g_tok[3], "size", &fb);
        memset(ev, 0, sizeof(*ev));
        ev->kind = 'H';
        ev->dev_slot = dev_slot_of(0, lineno);
        ev->s = resolve(lineno, ev->dev_slot, fa, fb, "# free");
        return 0;
    }

    memset(ev, 0, sizeof(*ev));
    const char *k = g_tok[0];
    int i = 1;
    if (strlen(k) != 1 || !strchr("AFOMS", k[0])) trace_die(lineno, "unknown event kind '%s'", k);
    ev->kind = k[0];
#define TOK (i < nt ? g_tok[i] : NULL)
    /* fixed fields; ranges are resolved after the keys (dev= may come last) */
    uint64_t addr = 0, bytes = 0, n_in = 0, n_out = 0, h1 = 0, h2 = 0;
    int first_range = 0, nranges = 0;
    switch (ev->kind) {
    case 'A':
        need_hex(lineno, TOK, "address", &addr); i++;
        need_dec(lineno, TOK, "size", &bytes); i++;
        break;
    case 'F':
        need_hex(lineno, TOK, "address", &addr); i++;
        break;
    case 'S':
        need_hex(lineno, TOK, "address", &addr); i++;
        need_dec(lineno, TOK, "size", &bytes); i++;
        break;
    case 'M': {
        const char *mk = TOK;
        if (!mk || is_kv(mk)) trace_die(lineno, "missing copy kind");
        if (!strcmp(mk, "H2H")) ev->mkind = MK_H2H;
        else if (!strcmp(mk, "H2D")) ev->mkind = MK_H2D;
        else if (!strcmp(mk, "D2H")) ev->mkind = MK_D2H;
        else if (!strcmp(mk, "D2D")) ev->mkind = MK_D2D;
        else trace_die(lineno, "unknown copy kind '%s': expected H2D, D2H, D2D or H2H", mk);
        i++;
        need_hex(lineno, TOK, "destination address", &h1); i++;
        need_hex(lineno, TOK, "source address", &h2); i++;
        need_dec(lineno, TOK, "size", &bytes); i++;
        break;
    }
    case 'O': {
        const char *op = TOK;
        if (!op || is_kv(op)) trace_die(lineno, "missing op_type");
        ev->op = op;
        i++;
        need_dec(lineno, TOK, "n_in", &n_in); i++;
        need_dec(lineno, TOK, "n_out", &n_out); i++;
        first_range = i;
        while (i < nt && !is_kv(g_tok[i])) i++;
        nranges = i - first_range;
        if (n_in > 1000000 || n_out > 1000000 || (uint64_t)nranges != n_in + n_out)
            trace_die(lineno, "O %s: n_in=%" PRIu64 " n_out=%" PRIu64 " but %d range%s follow%s", op, n_in, n_out,
                nranges, nranges == 1 ? "" : "s", nranges == 1 ? "s" : "");
        ev->n_in = (int)n_in;
        ev->n_out = (int)n_out;
        break;
    }
    }
    /* optional key=value fields */
    uint64_t dev = 0, stream = 0;
    for (; i < nt; i++) {
        char *t = g_tok[i];
        if (!is_kv(t)) trace_die(lineno, "unexpected field '%s' (expected key=value)", t);
        char *eq = strchr(t, '=');
        size_t kl = (size_t)(eq - t);
        const char *v = eq + 1;
        uint64_t x;
#define KEY(name) (kl == strlen(name) && !strncmp(t, name, kl))
        if (KEY("dev") || KEY("stream") || KEY("t") || KEY("flops")) {
            if (parse_dec(v, &x)) trace_die(lineno, "bad value in '%s': expected a decimal number", t);
            if (KEY("dev")) {
                if (x > 0x7fffffff) trace_die(lineno, "device index in '%s' out of range", t);
                dev = x;
            } else if (KEY("stream")) {
                if (x > 0xffffffffull) trace_die(lineno, "stream id in '%s' out of range", t);
                stream = x;
            } else if (KEY("flops")) {
                if (x > (uint64_t)INT64_MAX) trace_die(lineno, "flops in '%s' out of range", t);
                ev->has_flops = 1;
                ev->flops = x;
            }
        }
#undef KEY
    }
    int ds = dev_slot_of(dev, lineno);
    ev->dev_slot = ds;
    ev->stream_slot = stream_slot_of(ds, stream, lineno);

    switch (ev->kind) {
    case 'A': {
        node *prev = tp_floor(g_devs[ds].live, addr);
        node *next = tp_higher(g_devs[ds].live, addr);
        if (addr + span(bytes) < addr) trace_die(lineno, "A 0x%" PRIx64 " %" PRIu64 ": range wraps around", addr, bytes);
        node *hit = NULL;
        if (prev && addr - prev->addr < span(prev->bytes)) hit = prev;
        else if (next && next->addr - addr < span(bytes)) hit = next;
        if (hit)
            trace_die(lineno, "A 0x%" PRIx64 " %" PRIu64 " overlaps the live allocation 0x%" PRIx64 " %" PRIu64
                " on device %" PRIu64, addr, bytes, hit->addr, hit->bytes, dev);
        node *n = xmalloc(sizeof(node));
        n->addr = addr;
        n->bytes = bytes;
        n->id = g_nalloc_pass++;
        n->prio = mix64(addr ^ ((uint64_t)n->id << 1));
        n->l = n->r = NULL;
        tp_insert(&g_devs[ds].live, n);
        if (n->id >= g_narec) {   /* pass 1 records it; pass 2 sees the same ids */
            GROW(g_arec, g_narec, g_caparec);
            g_arec[g_narec].dev_slot = ds;
            g_arec[g_narec].addr = addr;
            g_arec[g_narec].bytes = bytes;
            g_narec++;
        }
        ev->alloc = n->id;
        ev->bytes = bytes;
        break;
    }
    case 'F': {
        node *n = tp_erase(&g_devs[ds].live, addr);
        if (!n) trace_die(lineno, "F 0x%" PRIx64 ": no live allocation starts there on device %" PRIu64, addr, dev);
        ev->alloc = n->id;
        free(n);
        break;
    }
    case 'S':
        ev->s = resolve(lineno, ds, addr, bytes, "S");
        break;
    case 'M':
        ev->bytes = bytes;
        if (ev->mkind == MK_H2D || ev->mkind == MK_D2D) ev->d_dst = resolve(lineno, ds, h1, bytes, "M destination");
        else { ev->h_dst = h1; host_note(h1, bytes); }
        if (ev->mkind == MK_D2H || ev->mkind == MK_D2D) ev->d_src = resolve(lineno, ds, h2, bytes, "M source");
        else { ev->h_src = h2; host_note(h2, bytes); }
        break;
    case 'O':
        if (nranges > g_caprbuf) {
            g_caprbuf = nranges;
            g_rbuf = xrealloc(g_rbuf, (size_t)g_caprbuf * sizeof(rng));
        }
        ev->r = g_rbuf;
        for (int j = 0; j < nranges; j++) {
            char *t = g_tok[first_range + j];
            char *colon = strchr(t, ':');
            if (!colon) trace_die(lineno, "bad range '%s': expected <0xaddr>:<bytes>", t);
            *colon = 0;
            uint64_t ra, rb;
            if (parse_hex(t, &ra)) trace_die(lineno, "bad range address '%s': expected hexadecimal with a 0x prefix", t);
            if (parse_dec(colon + 1, &rb)) trace_die(lineno, "bad range size '%s': expected a decimal number", colon + 1);
            ev->r[j] = resolve(lineno, ds, ra, rb, j < ev->n_in ? "O input" : "O output");
        }
        break;
    }
#undef TOK
    return 0;
}

/* Walks the in-memory trace, calling fn for every event line. */
static char *g_text;
static size_t g_textlen;
static char *g_linebuf;
static size_t g_caplinebuf;
static int g_line;   /* line being executed (0: outside the trace) */
static uint64_t g_evno;  /* ordinal of the event walk() hands out (from 0 each pass) */

static void reset_model(void) {
    for (int d = 0; d < g_ndevs; d++) { tp_free_all(g_devs[d].live); g_devs[d].live = NULL; }
    g_nalloc_pass = 0;
    g_evno = 0;
}

static void walk(void (*fn)(event *ev)) {
    reset_model();
    int lineno = 0, header = 0;
    size_t pos = 0;
    while (pos < g_textlen) {
        size_t end = pos;
        while (end < g_textlen && g_text[end] != '\n') end++;
        size_t len = end - pos;
        lineno++;
        if (len && g_text[pos + len - 1] == '\r') len--;   /* tolerate CRLF files */
        if (len + 1 > g_caplinebuf) { g_caplinebuf = len + 1; g_linebuf = xrealloc(g_linebuf, g_caplinebuf); }
        memcpy(g_linebuf, g_text + pos, len);
        g_linebuf[len] = 0;
        pos = end + 1;
        if (memchr(g_linebuf, 0, len)) trace_die(lineno, "NUL byte in line");
        if (!header) {
            size_t k = 0;
            while (k < len && (g_linebuf[k] == ' ' || g_linebuf[k] == '\t')) k++;
            if (k == len) continue;
            if (strcmp(g_linebuf, "# u3m-trace 1") != 0)
                trace_die(lineno, "expected the header '# u3m-trace 1' as the first non-empty line, found '%.60s'",
                    g_linebuf);
            header = 1;
            continue;
        }
        event ev;
        if (parse_line(g_linebuf, lineno, &ev)) continue;
        g_line = lineno;
        fn(&ev);
        g_evno++;
    }
    if (!header) trace_die(lineno ? lineno : 1, "missing the header '# u3m-trace 1' (no non-empty line)");
    g_line = 0;
}

/* ------------------------------------------------------------- execution */

static void acl_fail(int rc, const char *call) __attribute__((noreturn));
static void acl_fail(int rc, const char *call) {
    if (g_line > 0) fprintf(stderr, PROG ": trace line %d: ACL error %d in %s\n", g_line, rc, call);
    else fprintf(stderr, PROG ": ACL error %d in %s (outside trace events)\n", rc, call);
    fflush(stdout);
    exit(2);
}
#define RC(call, name) do { aclError rc_ = (call); if (rc_ != ACL_SUCCESS) acl_fail(rc_, name); } while (0)

typedef struct touch { int s; uint64_t seq; } touch;
typedef struct tracker {     /* who wrote / read a resource since its last write */
    int wr_s;
    uint64_t wr_seq;
    touch *rd;
    int nrd, caprd;
} tracker;

typedef struct stream_st {
    int dev_slot;
    aclrtStream st;
    aclrtEvent t0, t1;
    uint64_t seq;            /* work items submitted */
    uint64_t synced;         /* seq known complete on the host */
    uint64_t *waited;        /* waited[a]: seq of stream a this stream has waited for */
} stream_st;

typedef struct alloc_st { void *ptr; tracker tr; int live; } alloc_st;
typedef struct hostbuf_st {
    unsigned char *ptr;
    tracker tr;
    int pend_s;              /* stream of the D2H whose bytes are not hashed yet, or -1 */
    uint64_t pend_bytes;
} hostbuf_st;

static int g_base_dev;
static int g_verify = 1;
static int g_sums = 0;   /* --sums */
static int g_phantom;
static stream_st *g_st;
static alloc_st *g_al;
static hostbuf_st *g_hb;
static int g_cur_dev = -1;
static uint64_t g_hash = APP_FNV_INIT;
static uint64_t g_ops;
static aclopAttr *g_empty_attr;
static aclrtEvent *g_events;
static int g_nevents, g_capevents;
static unsigned char *g_stage;
static uint64_t g_stage_bytes;

static void use_dev(int dslot) {
    int d = g_base_dev + (int)g_devs[dslot].dev;
    if (d != g_cur_dev) {
        RC(aclrtSetDevice(d), "aclrtSetDevice");
        g_cur_dev = d;
    }
}

static void sync_stream(int s) {
    if (g_st[s].synced == g_st[s].seq) return;
    int back = g_cur_dev;
    use_dev(g_st[s].dev_slot);
    RC(aclrtSynchronizeStream(g_st[s].st), "aclrtSynchronizeStream");
    g_st[s].synced = g_st[s].seq;
    if (back >= 0 && back != g_cur_dev) { RC(aclrtSetDevice(back), "aclrtSetDevice"); g_cur_dev = back; }
}

static void sync_all(void) {
    int back = g_cur_dev;
    for (int s = 0; s < g_nskeys; s++) {
        use_dev(g_st[s].dev_slot);
        RC(aclrtSynchronizeStream(g_st[s].st), "aclrtSynchronizeStream");
        g_st[s].synced = g_st[s].seq;
    }
    for (int e = 0; e < g_nevents; e++) RC(aclrtDestroyEvent(g_events[e]), "aclrtDestroyEvent");
    g_nevents = 0;
    if (back >= 0 && back != g_cur_dev) { RC(aclrtSetDevice(back), "aclrtSetDevice"); g_cur_dev = back; }
}

/* Stream b must not run its next work before stream a's work up to seq k. */
static void need(int b, int a, uint64_t k) {
    if (a < 0 || a == b || g_st[a].synced >= k || g_st[b].waited[a] >= k) return;
    if (g_st[a].dev_slot != g_st[b].dev_slot) {
        sync_stream(a);   /* cross-device: order through the host */
        return;
    }
    if (g_nevents >= EVENT_BATCH) {
        sync_all();       /* everything before is now complete */
        return;
    }
    aclrtEvent e;
    RC(aclrtCreateEvent(&e), "aclrtCreateEvent");
    GROW(g_events, g_nevents, g_capevents);
    g_events[g_nevents++] = e;
    RC(aclrtRecordEvent(e, g_st[a].st), "aclrtRecordEvent");
    RC(aclrtStreamWaitEvent(g_st[b].st, e), "aclrtStreamWaitEvent");
    g_st[b].waited[a] = g_st[a].seq;
}

typedef struct access { tracker *tr; int write; } access;

static void deps_before(int b, const access *ac, int n) {
    for (int i = 0; i < n; i++) {
        tracker *t = ac[i].tr;
        need(b, t->wr_s, t->wr_seq);
        if (ac[i].write)
            for (int j = 0; j < t->nrd; j++) need(b, t->rd[j].s, t->rd[j].seq);
    }
}
static void touch_after(int b, const access *ac, int n) {
    uint64_t k = ++g_st[b].seq;
    for (int i = 0; i < n; i++) {
        tracker *t = ac[i].tr;
        if (ac[i].write) { t->wr_s = b; t->wr_seq = k; t->nrd = 0; continue; }
        int j = 0;
        while (j < t->nrd && t->rd[j].s != b) j++;
        if (j == t->nrd) { GROW(t->rd, t->nrd, t->caprd); t->nrd++; t->rd[j].s = b; }
        t->rd[j].seq = k;
    }
}
/* Adds an access, merging repeats of one resource (a write wins). */
static int add_access(access *ac, int n, tracker *t, int write) {
    for (int i = 0; i < n; i++)
        if (ac[i].tr == t) { ac[i].write |= write; return n; }
    ac[n].tr = t;
    ac[n].write = write;
    return n + 1;
}

static void *dptr(const rng *r) { return (unsigned char *)g_al[r->alloc].ptr + r->off; }

/* D2H copies whose bytes are not hashed yet, in trace order. A host buffer is
 * in the queue at most once: a later write to it flushes it first. */
static int *g_pend;
static int g_pend_head, g_npend, g_cappend;

static void flush_one(void) {
    hostbuf_st *hb = &g_hb[g_pend[g_pend_head++]];
    sync_stream(hb->pend_s);
    g_hash = app_fnv(g_hash, hb->ptr, hb->pend_bytes);
    hb->pend_s = -1;
}
/* Hashes pending D2H bytes up to and including host buffer h's (keeping trace order). */
static void flush_host(int h) {
    if (g_hb[h].pend_s < 0) return;
    while (g_hb[h].pend_s >= 0) flush_one();
}
static void flush_all(void) {
    while (g_pend_head < g_npend) flush_one();
    g_pend_head = g_npend = 0;
}

static void ensure_stage(uint64_t bytes) {
    uint64_t want = bytes < READBACK_CHUNK ? bytes : READBACK_CHUNK;
    if (want <= g_stage_bytes) return;
    if (g_stage) RC(aclrtFreeHost(g_stage), "aclrtFreeHost");
    void *p = NULL;
    RC(aclrtMallocHost(&p, want), "aclrtMallocHost");
    g_stage = p;
    g_stage_bytes = want;
}

/* Reads allocation a back on stream s (as a read access) and hashes it. */
static void read_back(int a, int s) {
    uint64_t bytes = g_arec[a].bytes;
    flush_all();   /* earlier D2H bytes come first in the checksum */
    if (!bytes) return;
    access ac = { &g_al[a].tr, 0 };
    deps_before(s, &ac, 1);
    ensure_stage(bytes);
    for (uint64_t off = 0; off < bytes; off += g_stage_bytes) {
        uint64_t n = bytes - off < g_stage_bytes ? bytes - off : g_stage_bytes;
        RC(aclrtMemcpyAsync(g_stage, n, (unsigned char *)g_al[a].ptr + off, n, ACL_MEMCPY_DEVICE_TO_HOST, g_st[s].st),
            "aclrtMemcpyAsync(D2H read-back)");
        touch_after(s, &ac, 1);
        sync_stream(s);
        if (!g_phantom) g_hash = app_fnv(g_hash, g_stage, n);   /* phantom copies carry no data */
        for (uint64_t c = 0; g_sums && !g_phantom && c < n; c += 2u << 20) {
            uint64_t m = n - c < (2u << 20) ? n - c : (2u << 20);
            fprintf(stderr, "sum alloc=%d off=%llu fnv=%016llx\n", a, (unsigned long long)(off + c),
                (unsigned long long)app_fnv(APP_FNV_INIT, (unsigned char *)g_stage + c, m));
        }
    }
}

static void exec_event(event *ev) {
    int b = ev->stream_slot;
    use_dev(ev->dev_slot);
    aclrtStream st = g_st[b].st;
    switch (ev->kind) {
    case 'A': {
        void *p = NULL;
        RC(aclrtMalloc(&p, span(ev->bytes), ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc");
        g_al[ev->alloc].ptr = p;
        if (g_sums) fprintf(stderr, "alloc=%d ptr=%p\n", ev->alloc, p);
        g_al[ev->alloc].live = 1;
        g_al[ev->alloc].tr.wr_s = -1;
        break;
    }
    case 'F': {
        alloc_st *al = &g_al[ev->alloc];
        if (g_verify) read_back(ev->alloc, b);
        /* the writer waited for earlier readers, so these cover every user */
        if (al->tr.wr_s >= 0) sync_stream(al->tr.wr_s);
        for (int j = 0; j < al->tr.nrd; j++) sync_stream(al->tr.rd[j].s);
        use_dev(ev->dev_slot);
        RC(aclrtFree(al->ptr), "aclrtFree");
        al->ptr = NULL;
        al->live = 0;
        free(al->tr.rd);
        memset(&al->tr, 0, sizeof(al->tr));
        al->tr.wr_s = -1;
        break;
    }
    case 'S': {
        if (!ev->s.bytes) break;
        access ac = { &g_al[ev->s.alloc].tr, 1 };
        deps_before(b, &ac, 1);
        RC(aclrtMemsetAsync(dptr(&ev->s), ev->s.bytes, g_line & 0xff, ev->s.bytes, st), "aclrtMemsetAsync");
        touch_after(b, &ac, 1);
        break;
    }
    case 'M': {
        if (!ev->bytes) break;
        access ac[2];
        int n = 0;
        void *dst, *src;
        int hd = -1;
        if (ev->mkind == MK_H2D || ev->mkind == MK_D2D) {
            n = add_access(ac, n, &g_al[ev->d_dst.alloc].tr, 1);
            dst = dptr(&ev->d_dst);
        } else {
            hd = map_get(&g_hmap, ev->h_dst);
            flush_host(hd);   /* hash the previous D2H bytes before they are overwritten */
            n = add_access(ac, n, &g_hb[hd].tr, 1);
            dst = g_hb[hd].ptr;
        }
        if (ev->mkind == MK_D2H || ev->mkind == MK_D2D) {
            n = add_access(ac, n, &g_al[ev->d_src.alloc].tr, 0);
            src = dptr(&ev->d_src);
        } else {
            int hs = map_get(&g_hmap, ev->h_src);
            n = add_access(ac, n, &g_hb[hs].tr, 0);
            src = g_hb[hs].ptr;
        }
        deps_before(b, ac, n);
        static const aclrtMemcpyKind kinds[] = { ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE,
            ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_DEVICE_TO_DEVICE };
        RC(aclrtMemcpyAsync(dst, ev->bytes, src, ev->bytes, kinds[ev->mkind], st), "aclrtMemcpyAsync");
        touch_after(b, ac, n);
        if (ev->mkind == MK_D2H) {
            g_hb[hd].pend_s = b;
            g_hb[hd].pend_bytes = ev->bytes;
            if (g_pend_head > 1024 && 2 * g_pend_head > g_npend) {   /* compact the consumed prefix */
                memmove(g_pend, g_pend + g_pend_head, (size_t)(g_npend - g_pend_head) * sizeof(int));
                g_npend -= g_pend_head;
                g_pend_head = 0;
            }
            GROW(g_pend, g_npend, g_cappend);
            g_pend[g_npend++] = hd;
        }
        break;
    }
    case 'O': {
        int nr = ev->n_in + ev->n_out;
        access *ac = xmalloc((size_t)(nr ? nr : 1) * sizeof(access));
        aclTensorDesc **desc = xmalloc((size_t)(nr ? nr : 1) * sizeof(*desc));
        aclDataBuffer **buf = xmalloc((size_t)(nr ? nr : 1) * sizeof(*buf));
        int n = 0;
        for (int j = 0; j < nr; j++) {
            const rng *r = &ev->r[j];
            n = add_access(ac, n, &g_al[r->alloc].tr, j >= ev->n_in);
            int64_t dim = (int64_t)r->bytes;
            desc[j] = aclCreateTensorDesc(ACL_UINT8, 1, &dim, ACL_FORMAT_ND);
            buf[j] = aclCreateDataBuffer(dptr(r), r->bytes);
            if (!desc[j] || !buf[j]) acl_fail(ACL_ERROR_INVALID_PARAM, "aclCreateTensorDesc/aclCreateDataBuffer");
        }
        aclopAttr *attr = g_empty_attr;
        if (ev->has_flops) {
            attr = aclopCreateAttr();
            if (!attr) acl_fail(ACL_ERROR_BAD_ALLOC, "aclopCreateAttr");
            RC(aclopSetAttrInt(attr, "flops", (int64_t)ev->flops), "aclopSetAttrInt(flops)");
        }
        deps_before(b, ac, n);
        char call[160];
        snprintf(call, sizeof(call), "aclopExecuteV2(%s)", ev->op);
        RC(aclopExecuteV2(ev->op, ev->n_in, desc, buf, ev->n_out, desc + ev->n_in, buf + ev->n_in, attr, st), call);
        touch_after(b, ac, n);
        g_ops++;
        if (attr != g_empty_attr) aclopDestroyAttr(attr);
        for (int j = 0; j < nr; j++) {
            aclDestroyTensorDesc(desc[j]);
            RC(aclDestroyDataBuffer(buf[j]), "aclDestroyDataBuffer");
        }
        free(ac); free(desc); free(buf);
        break;
    }
    }
}

static void note_event(event *ev) { (void)ev; }   /* pass 1: validation only */

static void fill_host(unsigned char *p, uint64_t bytes, uint64_t addr) {
    uint64_t state = addr;
    for (uint64_t off = 0; off < bytes; off += 8) {
        uint64_t w = app_rand_u64(&state);
        uint64_t n = bytes - off < 8 ? bytes - off : 8;
        memcpy(p + off, &w, n);
    }
}

/* ------------------------------------------------------ --discard hints */

#define DEAD_CHUNK (2ull << 20)
typedef struct dead_rec { uint64_t after; int alloc; uint64_t chunk; } dead_rec;
typedef struct chunk_acc { int alloc; uint64_t chunk; int whole; } chunk_acc;
static int g_discard;
static int (*g_u3m_discard)(const void *, size_t);
static uint64_t **g_last;      /* per allocation id, per chunk: last accessing event + 1 (0: none) */
static dead_rec *g_dead;       /* sorted by `after` before execution */
static size_t g_ndead, g_capdead, g_dead_next;
static chunk_acc *g_cacc;
static size_t g_ncacc, g_capcacc;

static uint64_t chunks_of(int a) { return (span(g_arec[a].bytes) + DEAD_CHUNK - 1) / DEAD_CHUNK; }

/* one access of this event: each chunk it touches, and whether it writes
 * all of that chunk (the last chunk ends with the allocation) */
static void dead_access(const rng *r, int whole) {
    if (!r->bytes) return;
    uint64_t size = span(g_arec[r->alloc].bytes);
    for (uint64_t c = r->off / DEAD_CHUNK; c * DEAD_CHUNK < r->off + r->bytes; c++) {
        uint64_t lo = c * DEAD_CHUNK, hi = lo + DEAD_CHUNK < size ? lo + DEAD_CHUNK : size;
        GROW(g_cacc, g_ncacc, g_capcacc);
        g_cacc[g_ncacc++] = (chunk_acc){ r->alloc, c, whole && r->off <= lo && r->off + r->bytes >= hi };
    }
}

static int cacc_cmp(const void *x, const void *y) {
    const chunk_acc *a = x, *b = y;
    if (a->alloc != b->alloc) return a->alloc < b->alloc ? -1 : 1;
    return a->chunk < b->chunk ? -1 : a->chunk > b->chunk;
}

static int overlaps(const rng *a, const rng *b) {
    return a->alloc == b->alloc && a->off < b->off + b->bytes && b->off < a->off + a->bytes;
}

static void dead_event(event *ev) {
    g_ncacc = 0;
    switch (ev->kind) {
    case 'A':
        g_last[ev->alloc] = calloc(chunks_of(ev->alloc), sizeof(uint64_t));
        if (!g_last[ev->alloc]) app_die(2, "out of host memory");
        return;
    case 'F': return;   /* the free gives the memory back: no hint */
    case 'O':
        for (int i = 0; i < ev->n_in; i++) dead_access(&ev->r[i], 0);
        for (int o = ev->n_in; o < ev->n_in + ev->n_out; o++) {
            int read = 0;   /* an output overlapping an input is read too */
            for (int i = 0; i < ev->n_in; i++) read |= overlaps(&ev->r[o], &ev->r[i]);
            dead_access(&ev->r[o], !read);
        }
        break;
    case 'M':
        if (ev->mkind == MK_H2D || ev->mkind == MK_D2D) dead_access(&ev->d_dst, 1);
        if (ev->mkind == MK_D2H || ev->mkind == MK_D2D) dead_access(&ev->d_src, 0);
        break;
    case 'S': dead_access(&ev->s, 1); break;
    }
    qsort(g_cacc, g_ncacc, sizeof *g_cacc, cacc_cmp);
    for (size_t i = 0; i < g_ncacc;) {
        chunk_acc c = g_cacc[i];
        for (i++; i < g_ncacc && g_cacc[i].alloc == c.alloc && g_cacc[i].chunk == c.chunk; i++)
            c.whole &= g_cacc[i].whole;
        uint64_t *last = &g_last[c.alloc][c.chunk];
        if (*last && c.whole) {
            GROW(g_dead, g_ndead, g_capdead);
            g_dead[g_ndead++] = (dead_rec){ *last - 1, c.alloc, c.chunk };
        }
        *last = g_evno + 1;
    }
}

static int dead_cmp(const void *x, const void *y) {
    const dead_rec *a = x, *b = y;
    return a->after < b->after ? -1 : a->after > b->after;
}

/* the hints due after the event just issued */
static void discard_after(void) {
    while (g_dead_next < g_ndead && g_dead[g_dead_next].after == g_evno) {
        const dead_rec *d = &g_dead[g_dead_next++];
        uint64_t size = span(g_arec[d->alloc].bytes), lo = d->chunk * DEAD_CHUNK;
        uint64_t n = size - lo < DEAD_CHUNK ? size - lo : DEAD_CHUNK;
        if (g_al[d->alloc].live) g_u3m_discard((unsigned char *)g_al[d->alloc].ptr + lo, n);
    }
}

static size_t g_free_hints;

static void exec_and_discard(event *ev) {
    if (ev->kind == 'H') {   /* --frees: a freed block, never an ACL call */
        if (g_u3m_discard && g_al[ev->s.alloc].live) {
            g_u3m_discard((unsigned char *)g_al[ev->s.alloc].ptr + ev->s.off, ev->s.bytes);
            g_free_hints++;
        }
        return;   /* no --discard hint falls after it: it accesses nothing */
    }
    exec_event(ev);
    if (g_discard && g_u3m_discard) discard_after();
}

static void usage(void) {
    app_die(3, "usage: acl_replay TRACE [--no-verify] [--device N] [--discard] [--frees] [--sums]");
}

int main(int argc, char **argv) {
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--no-verify")) g_verify = 0;
        else if (!strcmp(argv[i], "--discard")) g_discard = 1;
        else if (!strcmp(argv[i], "--frees")) g_frees = 1;
        else if (!strcmp(argv[i], "--sums")) g_sums = 1;
        else if ((v = app_opt(argc, argv, &i, "--device"))) {
            long long d = app_parse_int(v, "--device");
            if (d > 0x7fffffff) app_die(3, "--device %lld out of range", d);
            g_base_dev = (int)d;
        } else if (argv[i][0] == '-' && argv[i][1]) usage();
        else if (!path) path = argv[i];
        else usage();
    }
    if (!path) usage();
    g_file = path;
    const char *ph = getenv("ACLSIM_PHANTOM");
    g_phantom = ph && !strcmp(ph, "1");   /* phantom runs keep no data: skip filling host sources */

    FILE *f = fopen(path, "rb");
    if (!f) app_die(3, "cannot open trace %s: %s", path, strerror(errno));
    size_t cap = 1 << 16;
    g_text = xmalloc(cap);
    for (;;) {
        if (g_textlen == cap) { cap *= 2; g_text = xrealloc(g_text, cap); }
        size_t n = fread(g_text + g_textlen, 1, cap - g_textlen, f);
        if (n == 0) break;
        g_textlen += n;
    }
    if (ferror(f)) app_die(3, "cannot read trace %s: %s", path, strerror(errno));
    fclose(f);

    /* pass 1: validate everything, size host buffers, collect streams */
    walk(note_event);
    for (int d = 0; d < g_ndevs; d++)
        if ((int64_t)g_base_dev + g_devs[d].dev > 0x7fffffff) app_die(3, "device %d+%" PRId64 " out of range",
            g_base_dev, g_devs[d].dev);

    /* --discard: where the hints go (a pass over the validated trace) */
    if (g_discard || g_frees) g_u3m_discard = (int (*)(const void *, size_t))dlsym(RTLD_DEFAULT, "u3m_discard");
    if (g_discard && g_u3m_discard) {
        g_last = calloc((size_t)(g_narec ? g_narec : 1), sizeof *g_last);
        if (!g_last) app_die(2, "out of host memory");
        walk(dead_event);
        qsort(g_dead, g_ndead, sizeof *g_dead, dead_cmp);
        for (int a = 0; a < g_narec; a++) free(g_last[a]);
        free(g_last);
        free(g_cacc);
    }

    /* setup: devices, streams, timing events, host buffers */
    RC(aclInit(NULL), "aclInit");
    g_st = calloc((size_t)(g_nskeys ? g_nskeys : 1), sizeof(stream_st));
    g_al = calloc((size_t)(g_narec ? g_narec : 1), sizeof(alloc_st));
    g_hb = calloc((size_t)(g_nhrec ? g_nhrec : 1), sizeof(hostbuf_st));
    if (!g_st || !g_al || !g_hb) app_die(2, "out of host memory");
    /* setup errors name the first line that uses the device or stream */
    for (int d = 0; d < g_ndevs; d++) { g_line = g_devs[d].first_line; use_dev(d); }
    for (int s = 0; s < g_nskeys; s++) {
        g_line = g_skeys[s].first_line;
        g_st[s].dev_slot = g_skeys[s].dev_slot;
        g_st[s].waited = calloc((size_t)g_nskeys, sizeof(uint64_t));
        if (!g_st[s].waited) app_die(2, "out of host memory");
        use_dev(g_st[s].dev_slot);
        RC(aclrtCreateStream(&g_st[s].st), "aclrtCreateStream");
        RC(aclrtCreateEvent(&g_st[s].t0), "aclrtCreateEvent");
        RC(aclrtCreateEvent(&g_st[s].t1), "aclrtCreateEvent");
    }
    g_line = 0;
    for (int h = 0; h < g_nhrec; h++) {
        void *p = NULL;
        uint64_t n = (g_hrec[h].bytes + 7) & ~7ull;
        RC(aclrtMallocHost(&p, n ? n : 8), "aclrtMallocHost");
        g_hb[h].ptr = p;
        g_hb[h].tr.wr_s = -1;
        g_hb[h].pend_s = -1;
        if (!g_phantom) fill_host(p, g_hrec[h].bytes, g_hrec[h].addr);
    }
    if (!(g_empty_attr = aclopCreateAttr())) acl_fail(ACL_ERROR_BAD_ALLOC, "aclopCreateAttr");
    for (int s = 0; s < g_nskeys; s++) {
        use_dev(g_st[s].dev_slot);
        RC(aclrtRecordEvent(g_st[s].t0, g_st[s].st), "aclrtRecordEvent");
    }

    /* pass 2: execute */
    walk(exec_and_discard);

    for (int s = 0; s < g_nskeys; s++) {
        use_dev(g_st[s].dev_slot);
        RC(aclrtRecordEvent(g_st[s].t1, g_st[s].st), "aclrtRecordEvent");
    }
    sync_all();
    uint64_t sim_ns = 0;
    for (int s = 0; s < g_nskeys; s++) {
        float ms = 0;
        use_dev(g_st[s].dev_slot);
        RC(aclrtEventElapsedTime(&ms, g_st[s].t0, g_st[s].t1), "aclrtEventElapsedTime");
        uint64_t ns = ms > 0 ? (uint64_t)((double)ms * 1e6 + 0.5) : 0;
        if (ns > sim_ns) sim_ns = ns;
    }
    flush_all();
    /* allocations still live: read back (in id order), then free */
    for (int a = 0; a < g_narec; a++) {
        if (!g_al[a].live) continue;
        int ds = g_arec[a].dev_slot;
        int s = 0;
        while (g_st[s].dev_slot != ds) s++;   /* A registered a stream on its device */
        use_dev(ds);
        if (g_verify) read_back(a, s);
    }
    sync_all();
    for (int a = 0; a < g_narec; a++) {
        if (!g_al[a].live) continue;
        use_dev(g_arec[a].dev_slot);
        RC(aclrtFree(g_al[a].ptr), "aclrtFree");
        g_al[a].live = 0;
    }
    for (int h = 0; h < g_nhrec; h++) RC(aclrtFreeHost(g_hb[h].ptr), "aclrtFreeHost");
    if (g_stage) RC(aclrtFreeHost(g_stage), "aclrtFreeHost");
    aclopDestroyAttr(g_empty_attr);
    for (int s = 0; s < g_nskeys; s++) {
        use_dev(g_st[s].dev_slot);
        RC(aclrtDestroyEvent(g_st[s].t0), "aclrtDestroyEvent");
        RC(aclrtDestroyEvent(g_st[s].t1), "aclrtDestroyEvent");
        RC(aclrtDestroyStream(g_st[s].st), "aclrtDestroyStream");
    }
    for (int d = 0; d < g_ndevs; d++) RC(aclrtResetDevice(g_base_dev + (int)g_devs[d].dev), "aclrtResetDevice");
    RC(aclFinalize(), "aclFinalize");
    printf("checksum=%016" PRIx64 " ops=%" PRIu64 " sim_ns=%" PRIu64 "\n", g_hash, g_ops, sim_ns);
    if (g_discard) printf("discard=%s hints=%zu\n", g_u3m_discard ? "present" : "absent", g_dead_next);
    if (g_frees) printf("frees=%s hints=%zu\n", g_u3m_discard ? "present" : "absent", g_free_hints);
    return 0;
}
