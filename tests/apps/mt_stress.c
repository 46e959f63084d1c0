/* mt_stress [--threads 8] [--iters N] [--seed S] [--max-bytes B]
 *
 * Multi-threaded stress of streams, events, copies, memsets and operators.
 * Each thread sets the device, creates its own stream and runs a random mix of
 * alloc (+ full H2D fill) / H2D / D2D / memset / Add (f32, real) / StressMix
 * (hash kernel) / D2H read-back / free, all asynchronous on its stream. A host
 * model holds the expected bytes of every buffer (with a per-byte "known" flag:
 * StressMix outputs are not modelled — the hash belongs to the simulator — so
 * they are only carried along, never checked). Every D2H read compares each
 * known byte against the model.
 *
 * Buffers are either FLOAT (hold valid f32s: written only by f32 H2D data,
 * memset 0, D2D from FLOAT buffers and Add) or BYTES (anything else).
 *
 * Cross-thread dependencies: every ROUND iterations each thread overwrites one
 * buffer completely (H2D of fresh data), records an event on its stream and
 * posts (buffer, event) to the next thread's mailbox; it then takes the buffer
 * its predecessor posted, makes its own stream wait on the event
 * (aclrtStreamWaitEvent) and reads it back at once. The ring schedule is
 * fixed, so the run is deterministic per seed. MT_STRESS_SKIP_WAIT=1 omits the
 * wait (negative test: the read then races the producer's write, and the
 * verifier must see it).
 *
 * Output: "threads=<n> iters=<n> verified_bytes=<n> corrupted_bytes=<n>";
 * exit 1 if any byte was corrupted, 2 on an ACL error, 3 on bad usage. */
#include "acl/acl.h"
#include "common/common.h"

#include <inttypes.h>
#include <pthread.h>
#include <string.h>

#define MAXB 8          /* live buffers per thread */
#define ROUND 8         /* iterations between handoffs */

typedef struct buf {
    void *dev;
    uint64_t bytes;
    int is_float;
    unsigned char *model;   /* expected contents */
    unsigned char *known;   /* 1 where model is authoritative */
} buf;

typedef struct mail {
    buf *b;
    aclrtEvent ev;
    struct mail *next;
} mail;

typedef struct mailbox {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mail *head, *tail;
} mailbox;

typedef struct thr {
    int id;
    pthread_t th;
    uint64_t rng;
    aclrtStream stream;
    buf *b[MAXB];
    int nb;
    unsigned char *in, *out;   /* pinned staging (max_bytes each) */
    int in_busy;               /* an H2D from `in` may still be queued */
    uint64_t verified, corrupted, reported;
    uint64_t n_ops;
} thr;

static int g_threads = 8;
static long long g_iters = 200;
static uint64_t g_seed = 1;
static uint64_t g_max_bytes = 256 << 10;
static int g_skip_wait;
static mailbox *g_mb;

static uint64_t rnd(thr *t, uint64_t n) { return n ? app_rand_u64(&t->rng) % n : 0; }

/* Random [off, off+len) inside `bytes`, both multiples of `align` (bytes >= align). */
static void pick_range(thr *t, uint64_t bytes, uint64_t align, uint64_t *off, uint64_t *len) {
    uint64_t units = bytes / align;
    uint64_t l = 1 + (rnd(t, 4) == 0 ? units - 1 : rnd(t, units));   /* sometimes the whole buffer */
    *len = l * align;
    *off = rnd(t, units - l + 1) * align;
}

static void stage_in(thr *t) {
    if (t->in_busy) { ACL_CHECK(aclrtSynchronizeStream(t->stream)); t->in_busy = 0; }
}

static void sync_own(thr *t) {
    ACL_CHECK(aclrtSynchronizeStream(t->stream));
    t->in_busy = 0;
}

/* Fills staging with fresh data for [off, off+len) of b, updates the model, queues the H2D. */
static void h2d(thr *t, buf *b, uint64_t off, uint64_t len) {
    stage_in(t);
    if (b->is_float) {
        for (uint64_t i = 0; i < len; i += 4) {
            float f = app_rand_f32(&t->rng, 4.0f);
            memcpy(t->in + i, &f, 4);
        }
    } else {
        for (uint64_t i = 0; i < len; i += 8) {
            uint64_t w = app_rand_u64(&t->rng);
            memcpy(t->in + i, &w, len - i < 8 ? len - i : 8);
        }
    }
    memcpy(b->model + off, t->in, len);
    memset(b->known + off, 1, len);
    ACL_CHECK(aclrtMemcpyAsync((char *)b->dev + off, len, t->in, len, ACL_MEMCPY_HOST_TO_DEVICE, t->stream));
    t->in_busy = 1;
}

/* D2H of [off, off+len) and comparison with the model's known bytes. */
static void verify(thr *t, buf *b, uint64_t off, uint64_t len) {
    ACL_CHECK(aclrtMemcpyAsync(t->out, len, (char *)b->dev + off, len, ACL_MEMCPY_DEVICE_TO_HOST, t->stream));
    sync_own(t);
    for (uint64_t i = 0; i < len; i++) {
        if (!b->known[off + i]) continue;
        t->verified++;
        if (t->out[i] != b->model[off + i]) {
            t->corrupted++;
            if (t->reported++ < 5)
                fprintf(stderr, "mt_stress: thread %d: buffer %p+%" PRIu64 " (of %" PRIu64 "): expected 0x%02x, read 0x%02x\n",
                    t->id, b->dev, off + i, b->bytes, b->model[off + i], t->out[i]);
        }
    }
}

static buf *new_buf(thr *t) {
    buf *b = calloc(1, sizeof(buf));
    if (!b) app_die(2, "out of host memory");
    b->is_float = (int)rnd(t, 2);
    uint64_t cap = rnd(t, 4) == 0 ? (4096 < g_max_bytes ? 4096 : g_max_bytes) : g_max_bytes;
    uint64_t units = cap / 4;
    b->bytes = 4 * (1 + rnd(t, units));
    if (!b->is_float && rnd(t, 2)) b->bytes -= rnd(t, 4);   /* odd sizes for byte buffers */
    if (b->bytes == 0) b->bytes = 1;
    b->model = malloc(b->bytes);
    b->known = calloc(b->bytes, 1);
    if (!b->model || !b->known) app_die(2, "out of host memory");
    ACL_CHECK(aclrtMalloc(&b->dev, b->bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    h2d(t, b, 0, b->bytes);
    return b;
}

static void drop_buf(thr *t, int i) {
    buf *b = t->b[i];
    sync_own(t);   /* aclrtFree does not wait for queued work */
    ACL_CHECK(aclrtFree(b->dev));
    free(b->model);
    free(b->known);
    free(b);
    t->b[i] = t->b[--t->nb];
}

static void add_buf(thr *t, buf *b) {
    if (t->nb == MAXB) drop_buf(t, (int)rnd(t, MAXB));
    t->b[t->nb++] = b;
}

static buf *pick(thr *t, int want_float) {   /* -1: any */
    int idx[MAXB], n = 0;
    for (int i = 0; i < t->nb; i++)
        if (want_float < 0 || t->b[i]->is_float == want_float) idx[n++] = i;
    return n ? t->b[idx[rnd(t, (uint64_t)n)]] : NULL;
}

static void op_d2d(thr *t) {
    buf *d = pick(t, -1);
    buf *s = pick(t, d->is_float ? 1 : -1);
    if (!s) return;
    uint64_t align = d->is_float ? 4 : 1;
    uint64_t soff, doff, len;
    if (s == d) {   /* same buffer: disjoint halves (overlapping copies are undefined) */
        uint64_t half = (d->bytes / 2) / align * align;
        if (half < align) return;
        pick_range(t, half, align, &soff, &len);
        doff = half + rnd(t, (d->bytes - half - len) / align + 1) * align;
    } else {
        uint64_t m = s->bytes < d->bytes ? s->bytes : d->bytes;
        m = m / align * align;
        if (m < align) return;
        uint64_t l0;
        pick_range(t, m, align, &soff, &l0);
        len = l0;
        soff = rnd(t, (s->bytes - len) / align + 1) * align;
        doff = rnd(t, (d->bytes - len) / align + 1) * align;
    }
    memmove(d->model + doff, s->model + soff, len);
    memmove(d->known + doff, s->known + soff, len);
    ACL_CHECK(aclrtMemcpyAsync((char *)d->dev + doff, len, (char *)s->dev + soff, len, ACL_MEMCPY_DEVICE_TO_DEVICE,
        t->stream));
}

static void op_memset(thr *t) {
    buf *b = pick(t, -1);
    uint64_t off, len;
    int v = 0;
    if (b->is_float) {
        if (b->bytes < 4) return;
        pick_range(t, b->bytes, 4, &off, &len);
    } else {
        pick_range(t, b->bytes, 1, &off, &len);
        v = (int)rnd(t, 256);
    }
    memset(b->model + off, v, len);
    memset(b->known + off, 1, len);
    ACL_CHECK(aclrtMemsetAsync((char *)b->dev + off, len, v, len, t->stream));
}

static aclTensorDesc *desc(aclDataType dt, int nd, int64_t d0, int64_t d1) {
    int64_t dims[2] = { d0, d1 };
    aclTensorDesc *d = aclCreateTensorDesc(dt, nd, dims, ACL_FORMAT_ND);
    if (!d) app_die(2, "aclCreateTensorDesc failed");
    return d;
}

/* y = x1 + x2 (f32), sometimes with x2 broadcast as a bias over rows. */
static void op_add(thr *t) {
    buf *a = pick(t, 1), *c = pick(t, 1), *y = pick(t, 1);
    if (!a) return;
    uint64_t na = a->bytes / 4, nc = c->bytes / 4, ny = y->bytes / 4;
    uint64_t n = na < ny ? na : ny;
    int bias = rnd(t, 4) == 0;
    uint64_t cols = 0, rows = 0, n2;
    if (bias) {
        cols = 1 + rnd(t, nc < 64 ? nc : 64);
        rows = n / cols;
        if (rows == 0) return;
        rows = 1 + rnd(t, rows);
        n = rows * cols;
        n2 = cols;
    } else {
        if (nc < n) n = nc;
        n = 1 + rnd(t, n);
        n2 = n;
    }
    uint64_t oa = rnd(t, na - n + 1) * 4, oc = rnd(t, nc - n2 + 1) * 4, oy = rnd(t, ny - n + 1) * 4;
    for (uint64_t i = 0; i < n * 4; i++) if (!a->known[oa + i]) return;
    for (uint64_t i = 0; i < n2 * 4; i++) if (!c->known[oc + i]) return;
    /* inputs are read in full before the output is written: compute into a temporary */
    float *r = malloc(n * sizeof(float));
    if (!r) app_die(2, "out of host memory");
    for (uint64_t i = 0; i < n; i++) {
        float x1, x2;
        memcpy(&x1, a->model + oa + 4 * i, 4);
        memcpy(&x2, c->model + oc + 4 * (bias ? i % cols : i), 4);
        r[i] = x1 + x2;
    }
    memcpy(y->model + oy, r, n * 4);
    memset(y->known + oy, 1, n * 4);
    free(r);

    aclTensorDesc *d[3];
    aclDataBuffer *db[3];
    if (bias) {
        d[0] = desc(ACL_FLOAT, 2, (int64_t)rows, (int64_t)cols);
        d[1] = desc(ACL_FLOAT, 1, (int64_t)cols, 0);
        d[2] = desc(ACL_FLOAT, 2, (int64_t)rows, (int64_t)cols);
    } else {
        d[0] = desc(ACL_FLOAT, 1, (int64_t)n, 0);
        d[1] = desc(ACL_FLOAT, 1, (int64_t)n, 0);
        d[2] = desc(ACL_FLOAT, 1, (int64_t)n, 0);
    }
    db[0] = aclCreateDataBuffer((char *)a->dev + oa, n * 4);
    db[1] = aclCreateDataBuffer((char *)c->dev + oc, n2 * 4);
    db[2] = aclCreateDataBuffer((char *)y->dev + oy, n * 4);
    if (!db[0] || !db[1] || !db[2]) app_die(2, "aclCreateDataBuffer failed");
    aclopAttr *attr = aclopCreateAttr();
    if (!attr) app_die(2, "aclopCreateAttr failed");
    ACL_CHECK(aclopExecuteV2("Add", 2, d, db, 1, d + 2, db + 2, attr, t->stream));
    aclopDestroyAttr(attr);
    for (int i = 0; i < 3; i++) {
        aclDestroyTensorDesc(d[i]);
        ACL_CHECK(aclDestroyDataBuffer(db[i]));
    }
    t->n_ops++;
}

/* Hash kernel over byte ranges: output becomes unknown to the model. */
static void op_mix(thr *t) {
    buf *o = pick(t, 0);
    if (!o) return;
    int nin = 1 + (int)rnd(t, 2);
    aclTensorDesc *d[3];
    aclDataBuffer *db[3];
    for (int i = 0; i < nin; i++) {
        buf *s = pick(t, -1);
        uint64_t off, len;
        pick_range(t, s->bytes, 1, &off, &len);
        d[i] = desc(ACL_UINT8, 1, (int64_t)len, 0);
        db[i] = aclCreateDataBuffer((char *)s->dev + off, len);
    }
    uint64_t off, len;
    pick_range(t, o->bytes, 1, &off, &len);
    d[nin] = desc(ACL_UINT8, 1, (int64_t)len, 0);
    db[nin] = aclCreateDataBuffer((char *)o->dev + off, len);
    for (int i = 0; i <= nin; i++) if (!db[i]) app_die(2, "aclCreateDataBuffer failed");
    memset(o->known + off, 0, len);
    aclopAttr *attr = aclopCreateAttr();
    if (!attr) app_die(2, "aclopCreateAttr failed");
    ACL_CHECK(aclopExecuteV2("StressMix", nin, d, db, 1, d + nin, db + nin, attr, t->stream));
    aclopDestroyAttr(attr);
    for (int i = 0; i <= nin; i++) {
        aclDestroyTensorDesc(d[i]);
        ACL_CHECK(aclDestroyDataBuffer(db[i]));
    }
    t->n_ops++;
}

static void post(int to, buf *b, aclrtEvent ev) {
    mail *m = malloc(sizeof(mail));
    if (!m) app_die(2, "out of host memory");
    m->b = b;
    m->ev = ev;
    m->next = NULL;
    mailbox *mb = &g_mb[to];
    pthread_mutex_lock(&mb->mu);
    if (mb->tail) mb->tail->next = m; else mb->head = m;
    mb->tail = m;
    pthread_cond_signal(&mb->cv);
    pthread_mutex_unlock(&mb->mu);
}

static mail *take(int me) {
    mailbox *mb = &g_mb[me];
    pthread_mutex_lock(&mb->mu);
    while (!mb->head) pthread_cond_wait(&mb->cv, &mb->mu);
    mail *m = mb->head;
    mb->head = m->next;
    if (!mb->head) mb->tail = NULL;
    pthread_mutex_unlock(&mb->mu);
    return m;
}

static void handoff(thr *t) {
    if (t->nb == 0) add_buf(t, new_buf(t));
    int i = (int)rnd(t, (uint64_t)t->nb);
    buf *b = t->b[i];
    t->b[i] = t->b[--t->nb];
    h2d(t, b, 0, b->bytes);   /* the consumer must see exactly this */
    aclrtEvent ev;
    ACL_CHECK(aclrtCreateEvent(&ev));
    ACL_CHECK(aclrtRecordEvent(ev, t->stream));
    post((t->id + 1) % g_threads, b, ev);

    mail *m = take(t->id);
    if (!g_skip_wait) ACL_CHECK(aclrtStreamWaitEvent(t->stream, m->ev));
    verify(t, m->b, 0, m->b->bytes);   /* at once: nothing of ours delays the read */
    add_buf(t, m->b);
    /* the producer's write is complete once the event is: from here on the
     * buffer is ours (also in skip-wait mode, where the read above raced it) */
    ACL_CHECK(aclrtSynchronizeEvent(m->ev));
    ACL_CHECK(aclrtDestroyEvent(m->ev));
    free(m);
}

static void *worker(void *arg) {
    thr *t = arg;
    ACL_CHECK(aclrtSetDevice(0));
    ACL_CHECK(aclrtCreateStream(&t->stream));
    void *p;
    ACL_CHECK(aclrtMallocHost(&p, g_max_bytes));
    t->in = p;
    ACL_CHECK(aclrtMallocHost(&p, g_max_bytes));
    t->out = p;
    for (long long it = 0; it < g_iters; it++) {
        if (g_threads > 1 && it % ROUND == ROUND - 1) { handoff(t); continue; }
        if (t->nb < 2) { add_buf(t, new_buf(t)); continue; }
        uint64_t r = rnd(t, 100);
        if (r < 8) add_buf(t, new_buf(t));
        else if (r < 15) { if (t->nb > 2) drop_buf(t, (int)rnd(t, (uint64_t)t->nb)); }
        else if (r < 30) {
            buf *b = pick(t, -1);
            uint64_t off, len;
            pick_range(t, b->bytes, b->is_float ? 4 : 1, &off, &len);
            h2d(t, b, off, len);
        } else if (r < 45) op_d2d(t);
        else if (r < 55) op_memset(t);
        else if (r < 70) op_add(t);
        else if (r < 80) op_mix(t);
        else {
            buf *b = pick(t, -1);
            uint64_t off, len;
            pick_range(t, b->bytes, 1, &off, &len);
            verify(t, b, off, len);
        }
    }
    /* final check of everything this thread holds, then clean up */
    for (int i = 0; i < t->nb; i++) verify(t, t->b[i], 0, t->b[i]->bytes);
    while (t->nb) drop_buf(t, t->nb - 1);
    sync_own(t);
    ACL_CHECK(aclrtFreeHost(t->in));
    ACL_CHECK(aclrtFreeHost(t->out));
    ACL_CHECK(aclrtDestroyStream(t->stream));
    return NULL;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--threads"))) g_threads = (int)app_parse_int(v, "--threads");
        else if ((v = app_opt(argc, argv, &i, "--iters"))) g_iters = app_parse_int(v, "--iters");
        else if ((v = app_opt(argc, argv, &i, "--seed"))) g_seed = (uint64_t)app_parse_int(v, "--seed");
        else if ((v = app_opt(argc, argv, &i, "--max-bytes"))) g_max_bytes = app_parse_size(v, "--max-bytes");
        else app_die(3, "usage: mt_stress [--threads N] [--iters N] [--seed S] [--max-bytes B]");
    }
    if (g_threads < 1 || g_threads > 256) app_die(3, "--threads must be 1..256");
    if (g_max_bytes < 4 || g_max_bytes > (1ull << 30)) app_die(3, "--max-bytes must be 4..1G");
    const char *sk = getenv("MT_STRESS_SKIP_WAIT");
    g_skip_wait = sk && !strcmp(sk, "1");

    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    g_mb = calloc((size_t)g_threads, sizeof(mailbox));
    thr *th = calloc((size_t)g_threads, sizeof(thr));
    if (!g_mb || !th) app_die(2, "out of host memory");
    for (int i = 0; i < g_threads; i++) {
        pthread_mutex_init(&g_mb[i].mu, NULL);
        pthread_cond_init(&g_mb[i].cv, NULL);
        th[i].id = i;
        uint64_t s = g_seed * 0x9e3779b97f4a7c15ULL + (uint64_t)i;
        th[i].rng = app_rand_u64(&s);   /* per-thread stream, fixed by --seed */
    }
    for (int i = 0; i < g_threads; i++)
        if (pthread_create(&th[i].th, NULL, worker, &th[i])) app_die(2, "pthread_create failed");
    uint64_t verified = 0, corrupted = 0;
    for (int i = 0; i < g_threads; i++) {
        pthread_join(th[i].th, NULL);
        verified += th[i].verified;
        corrupted += th[i].corrupted;
    }
    for (int i = 0; i < g_threads; i++) {
        pthread_mutex_destroy(&g_mb[i].mu);
        pthread_cond_destroy(&g_mb[i].cv);
    }
    free(th);
    free(g_mb);
    ACL_CHECK(aclrtResetDevice(0));
    ACL_CHECK(aclFinalize());
    printf("threads=%d iters=%lld verified_bytes=%" PRIu64 " corrupted_bytes=%" PRIu64 "\n", g_threads, g_iters,
        verified, corrupted);
    return corrupted ? 1 : 0;
}
