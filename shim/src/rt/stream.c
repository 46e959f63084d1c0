/* Streams and events. Every stream (including each device's default stream) has
 * a worker thread that runs its queued work in order, so work is genuinely
 * asynchronous to the host: a program that forgets to synchronise sees the race.
 * Simulated time: an item starts at max(stream clock, host time at enqueue)
 * and ends start + cost; events carry the simulated time of their record; a
 * stream waiting on an event cannot start before the event's time. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "rt/rt.h"

typedef struct sim_node { sim_work *w; uint64_t host_ns, seq; struct sim_node *next; } sim_node;

/* Deterministic order. Every item queued on a device's streams takes the next
 * number of that device's sequence when it is queued; a worker costs an item
 * (sim_work_cost, which reserves the shared link's calendar) only when no
 * other stream of the device still holds an unfinished item with a lower
 * number, so the calendar is filled in the order the host issued the work,
 * not in the order worker threads happen to get there; a stream that is
 * parked (in a host function or a collective, which may wait for work issued
 * later, or in an event wait whose record has not run for a second) holds
 * nothing up. The data work itself is
 * not ordered (a program that forgets to make one stream wait for another
 * still sees the race). Synchronous copies and memsets of the host wait
 * likewise for the work queued before them (sim_host_gate). This orders real
 * time only: simulated times are unchanged by it, and no item waits for one
 * queued after it unless that one's stream is parked. */
#define SEQ_NONE UINT64_MAX
enum { PARK_NONE = 0, PARK_EVWAIT, PARK_EXTERNAL };
typedef struct sim_gate {
    pthread_mutex_t mu;          /* list, n, cap */
    atomic_ullong gen;           /* something on the device moved (event_ready_locked's progress) */
    atomic_ullong next_seq;      /* taken with the stream's lock held (enqueue) */
    struct sim_stream **list;    /* the device's streams, never removed */
    int n, cap;
} sim_gate;
/* Who waits for whom, and who wakes them. Every sleeper says so under the lock
 * its waker takes, and a waker makes a syscall only when someone sleeps:
 * - a stream's worker sleeps on its futex word `doze` (sleeping set); enqueue
 *   moves the word and wakes it, after dropping the stream's lock, only then
 *   (a bare futex: a condvar's waiter retakes the lock marked contended, so
 *   every wake-up cost the worker one more syscall at its next unlock);
 * - a gate waiter sleeps on the stream that holds it up (gate_cv, gate_waiters),
 *   woken when that stream's lowest unfinished number moves (an item finishes,
 *   the queue is dropped) or it parks. Queuing an item never lets a gate waiter
 *   on: the new number is above every number anyone waits behind;
 * - a synchronize sleeps on idle_cv until done reaches idle_want;
 * - an event's waiters (stream waits, synchronize, query) sleep on the event's
 *   own cv, broadcast by its record only (and, for a query, by a park: see
 *   g_queries). */
static sim_gate g_gate[SIM_MAX_DEVICES];
static pthread_once_t g_gate_once = PTHREAD_ONCE_INIT;
static atomic_ullong g_submits;  /* items queued, every stream (spin detection) */

/* Per-stream simulated time, kept after the stream is destroyed (stats). */
typedef struct sim_stream_rec { int dev, id; atomic_ullong clock; struct sim_stream_rec *next; } sim_stream_rec;

struct sim_stream {
    uint32_t magic;
    int dev, id;
    int dead;
    pthread_t thr;
    pthread_mutex_t mu;
    atomic_uint doze;            /* the worker's futex word: moved (under mu) to wake it */
    pthread_cond_t idle_cv;      /* done reached idle_want */
    pthread_cond_t gate_cv;      /* gate_ev moved */
    int sleeping;                /* the worker sleeps on doze: enqueue must wake it */
    atomic_ullong bell;          /* rung by every enqueue and the stop: a worker about to sleep watches it first */
    int idle_waiters, gate_waiters;
    uint64_t idle_want;          /* lowest `done` an idle_cv waiter waits for (UINT64_MAX: none) */
    uint64_t gate_ev;            /* lowest unfinished number moved, or parked changed */
    sim_node *head, *tail;
    uint64_t enq, done;
    uint64_t clock;              /* simulated end of the last item */
    uint64_t cur_seq;            /* the item the worker runs (SEQ_NONE: none); under mu */
    atomic_int parked;           /* PARK_*: the worker waits for something outside the device's order */
    aclError err;                /* sticky until the next synchronize */
    int stop_on_failure;         /* aclrtSetStreamFailureMode(ACL_STOP_ON_FAILURE) */
    int stop;
    sim_stream_rec *rec;
    sim_stream *next_all;
    void *ctx;                   /* the context it was created in */
    struct sim_model *capture;   /* aclmdlRICaptureBegin..End: work is recorded here */
};

typedef struct sim_event {
    uint32_t magic;
    uint32_t flags;
    int refs;                    /* handle + queued items referring to it */
    uint64_t rec_gen, done_gen;  /* records issued / completed */
    uint64_t time_ns;            /* simulated time of the last completed record */
    struct sim_stream *rec_stream; /* stream of the last record issued */
    uint64_t rec_host;           /* host time when it was issued (its start is not earlier) */
    uint64_t polls, poll_host, poll_sub; /* not-ready answers with nothing else happening (spin) */
    pthread_cond_t cv;           /* a record completed (with g_lock); broadcast only if waiters */
    int waiters;
} sim_event;

/* Queries waiting for a record (event_ready_locked), under g_lock: a stream
 * that parks outside the device's order wakes them, since it makes their
 * answer "not ready". */
typedef struct ev_query { sim_event *ev; struct ev_query *next; } ev_query;
static ev_query *g_queries;

enum { EV_RECORD = 1, EV_WAIT = 2 };
typedef struct ev_item { int op; sim_event *ev; uint64_t gen; } ev_item;

/* all under g_lock */
static sim_ptrset g_streams, g_events;
static sim_stream *g_all_streams;
static sim_stream_rec *g_recs;
static int g_next_stream_id[SIM_MAX_DEVICES];

static void event_unref_locked(sim_event *ev) {
    if (--ev->refs == 0) {
        ev->magic = 0;
        pthread_cond_destroy(&ev->cv);
        free(ev);
    }
}

static void free_work(sim_work *w) {
    if (w->destroy) w->destroy(w);
    free(w);
}

SIM_API sim_work *aclsim_work_new(int nranges) {
    if (nranges < 0) nranges = 0;
    sim_work *w = calloc(1, sizeof(sim_work) + (size_t)nranges * sizeof(sim_range));
    if (!w) abort();
    w->nranges = nranges;
    w->ranges = nranges ? (sim_range *)(w + 1) : NULL;
    return w;
}

static void gate_init(void) {
    for (int d = 0; d < SIM_MAX_DEVICES; d++) pthread_mutex_init(&g_gate[d].mu, NULL);
}

static sim_gate *gate_of(int dev) {
    pthread_once(&g_gate_once, gate_init);
    return &g_gate[dev];
}

/* Something on the device moved (for event_ready_locked's progress check). */
static void gate_note(int dev) { atomic_fetch_add(&gate_of(dev)->gen, 1); }

/* The lowest unfinished number of `s` moved or its parking changed: wake
 * the gate waiters held up by it. s->mu held. */
static void gate_moved_locked(sim_stream *s) {
    s->gate_ev++;
    if (s->gate_waiters) pthread_cond_broadcast(&s->gate_cv);
}

static void gate_add_stream(sim_stream *s) {
    sim_gate *g = gate_of(s->dev);
    pthread_mutex_lock(&g->mu);
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        sim_stream **l = realloc(g->list, (size_t)cap * sizeof *l);
        if (!l) abort();
        g->list = l;
        g->cap = cap;
    }
    g->list[g->n++] = s;
    pthread_mutex_unlock(&g->mu);
    gate_note(s->dev);   /* a new stream holds nobody up: it has no items yet */
}

/* Lowest number of an unfinished item of `t` (SEQ_NONE: none). t->mu held. */
static uint64_t stream_min_seq_locked(sim_stream *t) {
    if (t->cur_seq != SEQ_NONE) return t->cur_seq;
    return t->head ? t->head->seq : SEQ_NONE;
}

/* Waits until no stream of `dev` but `self` (NULL: none) holds an unfinished
 * item numbered below `seq`, parked streams aside: a pass over the streams
 * that finds none holding it up. A stream that does is waited on alone, until
 * its lowest number moves or it parks; then the pass starts again. */
static void gate_wait(int dev, sim_stream *self, uint64_t seq) {
    sim_gate *g = gate_of(dev);
    sim_stream *local[64], **list = local;
    int cap = 64;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        int n = g->n;
        if (n > cap) {
            if (list != local) free(list);
            list = malloc((size_t)n * sizeof *list);
            if (!list) abort();
            cap = n;
        }
        memcpy(list, g->list, (size_t)n * sizeof *list);
        pthread_mutex_unlock(&g->mu);
        int ok = 1;
        for (int i = 0; i < n && ok; i++) {
            sim_stream *t = list[i];
            if (t == self || atomic_load(&t->parked)) continue;
            pthread_mutex_lock(&t->mu);
            /* park() stores parked before it takes t->mu to wake us */
            if (!atomic_load(&t->parked) && stream_min_seq_locked(t) < seq) {
                ok = 0;
                uint64_t ev = t->gate_ev;
                t->gate_waiters++;
                while (t->gate_ev == ev) pthread_cond_wait(&t->gate_cv, &t->mu);
                t->gate_waiters--;
            }
            pthread_mutex_unlock(&t->mu);
        }
        if (ok) break;
    }
    if (list != local) free(list);
}

static void park(sim_stream *s, int how) {
    atomic_store(&s->parked, how);
    pthread_mutex_lock(&s->mu);
    gate_moved_locked(s);   /* its waiters go on without it */
    pthread_mutex_unlock(&s->mu);
    gate_note(s->dev);
    if (how == PARK_EXTERNAL) {
        /* a query waiting for a record on it answers "not ready" now */
        pthread_mutex_lock(&g_lock);
        for (ev_query *q = g_queries; q; q = q->next)
            if (q->ev->rec_stream == s) pthread_cond_broadcast(&q->ev->cv);
        pthread_mutex_unlock(&g_lock);
    }
}

/* Unparking lets nobody on (it can only hold waiters up again): no wake. */
static void unpark(sim_stream *s) {
    atomic_store(&s->parked, PARK_NONE);
    gate_note(s->dev);
}

/* Host-side work on `dev` (a synchronous copy or memset) waits until the
 * work queued on the device before it has run, so that it takes the shared
 * link after that work in every run. A host function's own synchronous work
 * does not wait for its stream (parked). */
void sim_host_gate(int dev) {
    if (dev < 0 || dev >= SIM_MAX_DEVICES) return;
    sim_gate *g = gate_of(dev);
    uint64_t seq = atomic_load(&g->next_seq);
    gate_wait(dev, NULL, seq);
}

/* Runs `n` (taken off the queue by worker(), which says whether to skip it)
 * and returns its error; worker() records the completion. */
static aclError run_item(sim_stream *s, sim_node *n, int skip) {
    sim_work *w = n->w;
    uint64_t start = s->clock > n->host_ns ? s->clock : n->host_ns;
    w->device = s->dev;
    w->stream_id = s->id;
    w->start_ns = start;
    w->end_ns = start + w->cost_ns;
    aclError rc = 0;
    sim_link link = {0};
    if (skip) {
        w->end_ns = start;
    } else if (w->kind == SIM_WORK_EVENT) {
        ev_item *e = w->payload;
        pthread_mutex_lock(&g_lock);
        if (e->op == EV_RECORD) {
            e->ev->time_ns = start;
            if (e->gen > e->ev->done_gen) e->ev->done_gen = e->gen;
            if (e->ev->waiters) pthread_cond_broadcast(&e->ev->cv);
        } else {
            if (e->ev->done_gen < e->gen) {
                /* The record was queued before this wait, so it has a lower
                 * number and never waits for this stream's later items: wait
                 * without parking, so that no item queued after this wait
                 * takes the link before the items behind it (the device's
                 * order stays deterministic). Only a record stuck behind a
                 * host function or a collective (which may wait for the host)
                 * leaves us parked, after a second of real time. */
                struct timespec dl;
                clock_gettime(CLOCK_REALTIME, &dl);
                dl.tv_sec += 1;
                e->ev->waiters++;
                while (e->ev->done_gen < e->gen)
                    if (pthread_cond_timedwait(&e->ev->cv, &g_lock, &dl) == ETIMEDOUT) break;
                if (e->ev->done_gen < e->gen) {
                    atomic_fetch_add(&g_stat[ST_WAIT_PARKS], 1);
                    pthread_mutex_unlock(&g_lock);
                    park(s, PARK_EVWAIT);
                    pthread_mutex_lock(&g_lock);
                    while (e->ev->done_gen < e->gen) pthread_cond_wait(&e->ev->cv, &g_lock);
                    pthread_mutex_unlock(&g_lock);
                    unpark(s);
                    pthread_mutex_lock(&g_lock);
                }
                e->ev->waiters--;
            }
            if (e->ev->time_ns > w->end_ns) w->end_ns = e->ev->time_ns;
        }
        event_unref_locked(e->ev);
        pthread_mutex_unlock(&g_lock);
    } else if (w->kind == SIM_WORK_HOST_FUNC) {
        /* the host function may wait for anything (the host, other streams) */
        park(s, PARK_EXTERNAL);
        if (w->exec) rc = w->exec(w);
        unpark(s);
    } else if (w->flags & SIM_WF_SELF_CHECK) {
        if (w->exec) rc = w->exec(w);
        if (!rc) {
            pthread_rwlock_rdlock(&g_mm);
            sim_link_traffic_locked(s->dev, w->ranges, w->nranges, &link);
            pthread_rwlock_unlock(&g_mm);
        }
    } else {
        /* a collective waits for its peers, which other hosts issue */
        int coll = w->kind == SIM_WORK_COLLECTIVE;
        if (coll) park(s, PARK_EXTERNAL);
        pthread_rwlock_rdlock(&g_mm);
        rc = aclsim_check_ranges(w->ranges, w->nranges, w->what);
        /* measured as it runs: where the memory is now decides the cost */
        if (!rc) sim_link_traffic_locked(s->dev, w->ranges, w->nranges, &link);
        if (!rc && w->exec && !g_cfg.phantom) rc = w->exec(w);
        pthread_rwlock_unlock(&g_mm);
        if (coll) unpark(s);
    }
    if (!rc && !skip && w->kind != SIM_WORK_EVENT && w->kind != SIM_WORK_HOST_FUNC) {
        /* the link's calendar in the device's order (see g_gate) */
        if (w->kind != SIM_WORK_COLLECTIVE) gate_wait(s->dev, s, n->seq);
        uint64_t cost =
            sim_work_cost(s->dev, w->kind, w->copy_kind, start, w->cost_ns, w->flops, w->bytes, &link);
        if (cost != w->cost_ns) {
            int64_t end = (int64_t)w->end_ns + ((int64_t)cost - (int64_t)w->cost_ns);
            w->end_ns = end > (int64_t)start ? (uint64_t)end : start;
        }
        sim_count_link(w->kind, &link);
    }
    if (skip) {
        /* nothing ran: no statistics */
    } else if (!rc) {
        switch (w->kind) {
        case SIM_WORK_OP: atomic_fetch_add(&g_stat[ST_OPS], 1); break;
        case SIM_WORK_COPY: sim_count_copy(w->copy_kind, w->bytes); break;
        case SIM_WORK_MEMSET: atomic_fetch_add(&g_stat[ST_MEMSETS], 1); break;
        default: break;
        }
    } else if (rc != ACL_ERROR_RT_DEVICE_MEM_ERROR) {
        aclsim_log("stream %d.%d: %s failed with error %d", s->dev, s->id, w->what[0] ? w->what : "work", rc);
    }
    if (w->end_ns < start) w->end_ns = start;
    s->clock = w->end_ns;
    atomic_store(&s->rec->clock, s->clock);
    free_work(w);
    free(n);
    return rc;
}

/* ACLSIM_SPIN_US: how long a worker whose queue ran dry watches its bell
 * before it sleeps (default 0: it sleeps at once). It moves real time only,
 * but libu3m.so decides by what it sees complete in real time: 5 µs took the
 * 13B Adam step from 845.5 to 851.0 ms (simulated), so it is off unless asked. */
#define SIM_SPIN_US_DEFAULT 0.0
static uint64_t g_spin_ns;
static pthread_once_t g_spin_once = PTHREAD_ONCE_INIT;
static void spin_init(void) {
    double us = SIM_SPIN_US_DEFAULT;
    const char *e = getenv("ACLSIM_SPIN_US");
    if (e && *e) {
        char *end;
        double v = strtod(e, &end);
        if (*end || !(v >= 0 && v <= 1e6))
            aclsim_log("ACLSIM_SPIN_US=%s: not a number of microseconds in [0, 1e6]; using %g", e, us);
        else
            us = v;
    }
    g_spin_ns = (uint64_t)(us * 1000);
}
static uint64_t spin_ns(void) {
    pthread_once(&g_spin_once, spin_init);
    return g_spin_ns;
}

static uint64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Watches the stream's bell for a while before the worker sleeps: work queued
 * meanwhile is taken without a wake-up (no syscall on either side). */
static void bell_watch(sim_stream *s, uint64_t seen) {
    uint64_t end = mono_ns() + spin_ns();
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&s->bell, memory_order_acquire) != seen) return;
        cpu_relax();
        if (!(i & 63) && mono_ns() >= end) return;
    }
}

/* One lock round per item: the completion of an item and the taking of the
 * next happen under the same hold of s->mu. */
static void *worker(void *arg) {
    sim_stream *s = arg;
    char name[16];
    snprintf(name, sizeof name, "aclsim-s%d.%d", s->dev, s->id);
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (!s->head && !s->stop && spin_ns()) {
            uint64_t seen = atomic_load(&s->bell);
            pthread_mutex_unlock(&s->mu);
            bell_watch(s, seen);
            pthread_mutex_lock(&s->mu);
        }
        while (!s->head && !s->stop) {
            s->sleeping = 1;
            unsigned v = atomic_load(&s->doze);
            pthread_mutex_unlock(&s->mu);
            /* returns at once if the word moved since it was read */
            syscall(SYS_futex, &s->doze, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
            pthread_mutex_lock(&s->mu);
        }
        s->sleeping = 0;
        sim_node *n = s->head;
        if (!n) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        s->head = n->next;
        if (!s->head) s->tail = NULL;
        s->cur_seq = n->seq;
        /* ACL_STOP_ON_FAILURE: once a task has failed, the stream's later
         * work is discarded until the error is collected by a synchronize.
         * Event records and host functions still run, so nothing waiting on
         * them hangs. */
        int skip = n->w->kind != SIM_WORK_EVENT && n->w->kind != SIM_WORK_HOST_FUNC && s->stop_on_failure && s->err;
        pthread_mutex_unlock(&s->mu);
        aclError rc = run_item(s, n, skip);
        pthread_mutex_lock(&s->mu);
        if (rc && !s->err) s->err = rc;
        s->done++;
        s->cur_seq = SEQ_NONE;
        if (s->idle_waiters && s->done >= s->idle_want) {
            s->idle_want = UINT64_MAX;   /* each waiter left asks again */
            pthread_cond_broadcast(&s->idle_cv);
        }
        gate_moved_locked(s);
        gate_note(s->dev);
    }
}

/* caller holds g_lock */
static sim_stream *stream_new_locked(int dev) {
    sim_stream *s = calloc(1, sizeof *s);
    sim_stream_rec *r = calloc(1, sizeof *r);
    if (!s || !r) abort();
    s->magic = SIM_MAGIC_STREAM;
    s->dev = dev;
    s->ctx = &g_dev[dev];        /* the device's default context unless the caller says */
    s->id = g_next_stream_id[dev]++;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    pthread_cond_init(&s->gate_cv, NULL);
    s->idle_want = UINT64_MAX;
    s->cur_seq = SEQ_NONE;
    r->dev = dev;
    r->id = s->id;
    r->next = g_recs;
    g_recs = r;
    s->rec = r;
    if (pthread_create(&s->thr, NULL, worker, s) != 0) {
        aclsim_log("cannot start a stream worker thread");
        abort();
    }
    s->next_all = g_all_streams;
    g_all_streams = s;
    ps_add(&g_streams, s);
    gate_add_stream(s);
    return s;
}

void sim_streams_init_device(int dev) { g_dev[dev].default_stream = stream_new_locked(dev); }

sim_stream *sim_stream_new_in(int dev, void *ctx) {
    pthread_mutex_lock(&g_lock);
    sim_stream *s = stream_new_locked(dev);
    s->ctx = ctx;
    pthread_mutex_unlock(&g_lock);
    return s;
}

/* The stream "NULL" names: the current context's default stream. */
static sim_stream *current_default_stream(void) {
    if (t_ctx && t_ctx != (void *)&g_dev[t_dev]) return ((sim_ctx *)t_ctx)->default_stream;
    return g_dev[t_dev].default_stream;
}

sim_stream *sim_stream_resolve(aclrtStream stream, aclError *err) {
    *err = aclsim_check_ready();
    if (*err) return NULL;
    if (!stream) return current_default_stream();
    pthread_mutex_lock(&g_lock);
    int ok = ps_has(&g_streams, stream);
    pthread_mutex_unlock(&g_lock);
    sim_stream *s = stream;
    if (!ok || s->dead) {
        *err = ACL_ERROR_RT_PARAM_INVALID;
        aclsim_log("stream %p is not a live stream", stream);
        return NULL;
    }
    if (s->dev != t_dev) {
        *err = ACL_ERROR_RT_STREAM_CONTEXT;
        aclsim_log("stream %p belongs to device %d, but the current device is %d", stream, s->dev, t_dev);
        return NULL;
    }
    return s;
}

SIM_API aclError aclsim_stream_check(aclrtStream stream) {
    aclError rc;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    return s ? sim_device_check(s->dev) : rc;
}

SIM_API int aclsim_stream_device(aclrtStream stream) {
    aclError rc;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    return s ? s->dev : -1;
}

static void enqueue(sim_stream *s, sim_work *w) {
    sim_node *n = malloc(sizeof *n);
    if (!n) abort();
    n->w = w;
    n->next = NULL;
    sim_gate *g = gate_of(s->dev);
    pthread_mutex_lock(&s->mu);
    /* read under the lock: sim_link_low_water relies on it */
    n->host_ns = atomic_load(&g_host_ns);
    /* numbered and queued under one hold of s->mu, for gate_wait (a number
     * below the one sim_host_gate read is visible to its scan) */
    n->seq = atomic_fetch_add(&g->next_seq, 1);
    if (s->tail) s->tail->next = n; else s->head = n;
    s->tail = n;
    s->enq++;
    atomic_fetch_add_explicit(&s->bell, 1, memory_order_release);
    atomic_fetch_add(&g_submits, 1);
    int wake = s->sleeping;
    if (wake) {
        s->sleeping = 0;
        atomic_fetch_add(&s->doze, 1);
    }
    pthread_mutex_unlock(&s->mu);
    gate_note(s->dev);
    /* after the unlock, so that the worker does not wake into a held lock;
     * streams are never freed */
    if (wake) syscall(SYS_futex, &s->doze, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static aclError capture_record(sim_stream *s, sim_work *w);

SIM_API aclError aclsim_submit(aclrtStream stream, sim_work *w) {
    aclError rc;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    if (!s) {
        free_work(w);
        return rc;
    }
    if (s->capture) return capture_record(s, w);
    if (w->kind != SIM_WORK_EVENT && w->kind != SIM_WORK_HOST_FUNC && (rc = sim_work_tick(s->dev))) {
        free_work(w);
        return rc;
    }
    enqueue(s, w);
    return ACL_SUCCESS;
}

/* Waits until everything queued on `s` before the call has run; timeout_ms < 0
 * waits forever. Returns and clears the stream's sticky error. */
static aclError stream_sync(sim_stream *s, int32_t timeout_ms) {
    struct timespec dl;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    }
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->enq;
    while (s->done < target) {
        if (target < s->idle_want) s->idle_want = target;
        s->idle_waiters++;
        int r = timeout_ms < 0 ? pthread_cond_wait(&s->idle_cv, &s->mu)
                               : pthread_cond_timedwait(&s->idle_cv, &s->mu, &dl);
        s->idle_waiters--;
        if (r == ETIMEDOUT) {
            pthread_mutex_unlock(&s->mu);
            return ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
        }
    }
    aclError rc = s->err;
    s->err = 0;
    uint64_t clock = s->clock;
    pthread_mutex_unlock(&s->mu);
    sim_note_host_time(clock);
    if (!rc && atomic_load(&g_dev[s->dev].lost)) rc = ACL_ERROR_RT_DEVICE_TASK_ABORT;
    return rc;
}

aclError sim_stream_sync_handle(aclrtStream stream) {
    aclError rc;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    return s ? stream_sync(s, -1) : rc;
}

aclError sim_sync_all(int dev) {
    sim_stream *list[1024];
    int n = 0;
    pthread_mutex_lock(&g_lock);
    for (sim_stream *s = g_all_streams; s && n < 1024; s = s->next_all)
        if (!s->dead && (dev < 0 || s->dev == dev)) list[n++] = s;
    pthread_mutex_unlock(&g_lock);
    aclError first = 0;
    for (int i = 0; i < n; i++) {   /* streams are never freed, so this is safe */
        aclError rc = stream_sync(list[i], -1);
        if (rc && !first) first = rc;
    }
    return first;
}

uint64_t sim_max_stream_clock(void) {
    uint64_t m = 0;
    pthread_mutex_lock(&g_lock);
    for (sim_stream_rec *r = g_recs; r; r = r->next) {
        uint64_t c = atomic_load(&r->clock);
        if (c > m) m = c;
    }
    pthread_mutex_unlock(&g_lock);
    return m;
}

/* Every item starts at or after its stream's clock, and an item queued later
 * at or after the host time when it is queued (read under the stream's lock,
 * after `host` below), so the minimum over the device's streams of their
 * clock (work pending or running) or max(clock, host) (idle) bounds every
 * future start. */
uint64_t sim_link_low_water(int dev) {
    uint64_t host = atomic_load(&g_host_ns), m = host;
    sim_stream *list[1024];
    int n = 0;
    pthread_mutex_lock(&g_lock);
    for (sim_stream *s = g_all_streams; s; s = s->next_all) {
        if (s->dev != dev) continue;
        if (n == 1024) {   /* too many to look at: prune nothing */
            pthread_mutex_unlock(&g_lock);
            return 0;
        }
        list[n++] = s;
    }
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < n; i++) {   /* streams are never freed */
        sim_stream *s = list[i];
        pthread_mutex_lock(&s->mu);
        uint64_t clock = atomic_load(&s->rec->clock);
        int busy = s->done < s->enq;
        pthread_mutex_unlock(&s->mu);
        uint64_t lb = busy ? clock : (clock > host ? clock : host);
        if (lb < m) m = lb;
    }
    return m;
}

void sim_stream_stats(FILE *f) {
    pthread_mutex_lock(&g_lock);
    int first = 1;
    /* oldest first */
    int n = 0;
    for (sim_stream_rec *r = g_recs; r; r = r->next) n++;
    sim_stream_rec **v = calloc((size_t)n + 1, sizeof *v);
    int i = n;
    for (sim_stream_rec *r = g_recs; r; r = r->next) v[--i] = r;
    for (i = 0; i < n; i++) {
        fprintf(f, "%s\n    {\"device\": %d, \"id\": %d, \"sim_ns\": %llu}", first ? "" : ",", v[i]->dev, v[i]->id,
                (unsigned long long)atomic_load(&v[i]->clock));
        first = 0;
    }
    free(v);
    pthread_mutex_unlock(&g_lock);
}

/* ---- streams: public API ---- */
ACL_FUNC_VISIBILITY aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag) {
    if (!stream) return ACL_ERROR_INVALID_PARAM;
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    pthread_mutex_lock(&g_lock);
    sim_stream *s = stream_new_locked(t_dev);
    s->ctx = t_ctx;   /* it belongs to the current context */
    *stream = s;
    pthread_mutex_unlock(&g_lock);
    return ACL_SUCCESS;
}

/* ACL_CONTINUE_ON_FAILURE (the default): later tasks run after a failed one;
 * ACL_STOP_ON_FAILURE: they are discarded until the next synchronize. The
 * default stream cannot be configured (NULL is an invalid argument). */
ACL_FUNC_VISIBILITY aclError aclrtSetStreamFailureMode(aclrtStream stream, uint64_t mode) {
    if (!stream || (mode != ACL_CONTINUE_ON_FAILURE && mode != ACL_STOP_ON_FAILURE)) return ACL_ERROR_INVALID_PARAM;
    aclError rc;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    if (!s) return rc;
    pthread_mutex_lock(&s->mu);
    s->stop_on_failure = mode == ACL_STOP_ON_FAILURE;
    pthread_mutex_unlock(&s->mu);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtCreateStream(aclrtStream *stream) {
    return aclrtCreateStreamWithConfig(stream, 0, 0);
}

static aclError stream_destroy(aclrtStream stream, int force);

ACL_FUNC_VISIBILITY aclError aclrtDestroyStream(aclrtStream stream) { return stream_destroy(stream, 0); }

/* Like aclrtDestroyStream, but work still queued (not yet started) is
 * discarded instead of run; an item already running completes. */
ACL_FUNC_VISIBILITY aclError aclrtDestroyStreamForce(aclrtStream stream) { return stream_destroy(stream, 1); }

static aclError stream_destroy(aclrtStream stream, int force) {
    if (!stream) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    pthread_mutex_lock(&g_lock);
    int ok = ps_has(&g_streams, stream);
    sim_stream *s = stream;
    if (ok) {
        ps_del(&g_streams, s);
        s->dead = 1;
    }
    pthread_mutex_unlock(&g_lock);
    if (!ok) {
        aclsim_log("%s(%p): not a live stream", force ? "aclrtDestroyStreamForce" : "aclrtDestroyStream", stream);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    /* queued work still runs to completion (unless forced), then the worker exits */
    pthread_mutex_lock(&s->mu);
    if (force) {
        sim_node *n = s->head;
        s->head = s->tail = NULL;
        while (n) {
            sim_node *next = n->next;
            if (n->w->kind == SIM_WORK_EVENT) {   /* drop its event reference too */
                ev_item *e = n->w->payload;
                pthread_mutex_lock(&g_lock);
                event_unref_locked(e->ev);
                pthread_mutex_unlock(&g_lock);
            }
            free_work(n->w);
            free(n);
            s->done++;
            n = next;
        }
        s->idle_want = UINT64_MAX;
        pthread_cond_broadcast(&s->idle_cv);
        gate_moved_locked(s);
    }
    s->stop = 1;
    atomic_fetch_add(&s->bell, 1);
    atomic_fetch_add(&s->doze, 1);
    pthread_mutex_unlock(&s->mu);
    syscall(SYS_futex, &s->doze, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    if (force) gate_note(s->dev);
    pthread_join(s->thr, NULL);
    sim_note_host_time(s->clock);
    return ACL_SUCCESS;
}

int sim_streams_destroy_context(void *ctx) {
    int n = 0;
    for (;;) {
        sim_stream *victim = NULL;
        pthread_mutex_lock(&g_lock);
        for (sim_stream *st = g_all_streams; st; st = st->next_all)
            if (!st->dead && st->ctx == ctx) { victim = st; break; }
        pthread_mutex_unlock(&g_lock);
        if (!victim || stream_destroy(victim, 0) != ACL_SUCCESS) return n;
        n++;
    }
}

ACL_FUNC_VISIBILITY aclError aclrtSynchronizeStream(aclrtStream stream) {
    aclError rc;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    return s ? stream_sync(s, -1) : rc;
}

ACL_FUNC_VISIBILITY aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout) {
    if (timeout < -1) return ACL_ERROR_INVALID_PARAM;
    aclError rc;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    return s ? stream_sync(s, timeout) : rc;
}

ACL_FUNC_VISIBILITY aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status) {
    if (!status) return ACL_ERROR_INVALID_PARAM;
    aclError rc;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    if (!s) return rc;
    /* by the simulated clock, as aclrtQueryEventStatus: complete once all its
     * work has run and ended by the host's time; waits for the worker unless
     * the stream's clock is already past the host's or it is parked (then not
     * ready). */
    uint64_t host = atomic_load(&g_host_ns);
    int ready = -1, idle_waits = 0;
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->enq, seen = s->done;
    while (ready < 0) {
        if (s->done >= target) {
            ready = s->clock <= host;
        } else if (atomic_load(&s->rec->clock) > host || atomic_load(&s->parked) == PARK_EXTERNAL) {
            ready = 0;
        } else {
            /* short waits: the worker may park (a host function) without
             * completing anything; no progress for a second: not ready */
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_nsec += 5 * 1000000L;
            if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
            if (s->done + 1 < s->idle_want) s->idle_want = s->done + 1;
            s->idle_waiters++;
            pthread_cond_timedwait(&s->idle_cv, &s->mu, &dl);
            s->idle_waiters--;
            if (s->done != seen) {
                seen = s->done;
                idle_waits = 0;
            } else if (++idle_waits > 200) {
                ready = 0;
                atomic_fetch_add(&g_stat[ST_QUERY_GIVEUPS], 1);
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    *status = ready ? ACL_STREAM_STATUS_COMPLETE : ACL_STREAM_STATUS_NOT_READY;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtSynchronizeDevice(void) {
    aclError rc = aclsim_check_ready();
    if (rc == ACL_ERROR_RT_DEVICE_TASK_ABORT) {
        sim_sync_all(t_dev);
        return rc;
    }
    if (rc) return rc;
    return sim_sync_all(t_dev);
}

/* aclrtSynchronizeDevice with a deadline: timeout in ms, -1 waits forever. */
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout) {
    if (timeout < -1) return ACL_ERROR_INVALID_PARAM;
    if (timeout == -1) return aclrtSynchronizeDevice();
    aclError rc = aclsim_check_ready();
    if (rc && rc != ACL_ERROR_RT_DEVICE_TASK_ABORT) return rc;
    int dev = t_dev;
    sim_stream *list[1024];
    int n = 0;
    pthread_mutex_lock(&g_lock);
    for (sim_stream *st = g_all_streams; st && n < 1024; st = st->next_all)
        if (!st->dead && st->dev == dev) list[n++] = st;
    pthread_mutex_unlock(&g_lock);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    aclError first = 0;
    for (int i = 0; i < n; i++) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t spent = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        int32_t left = spent >= timeout ? 0 : (int32_t)(timeout - spent);
        aclError e = stream_sync(list[i], left);
        if (e == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT) return e;
        if (e && !first) first = e;
    }
    return rc ? rc : first;
}

static aclError host_func_exec(sim_work *w) {
    aclrtHostFunc fn = (aclrtHostFunc)(uintptr_t)w->bytes;
    fn(w->payload);
    return 0;
}

ACL_FUNC_VISIBILITY aclError aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void *args) {
    if (!fn) return ACL_ERROR_INVALID_PARAM;
    sim_work *w = aclsim_work_new(0);
    snprintf(w->what, sizeof w->what, "aclrtLaunchHostFunc");
    w->kind = SIM_WORK_HOST_FUNC;
    w->exec = host_func_exec;
    w->bytes = (uint64_t)(uintptr_t)fn;   /* the function travels in `bytes`: payload is the user's */
    w->payload = args;
    return aclsim_submit(stream, w);
}

/* ---- events ---- */
static aclError event_create(aclrtEvent *event, uint32_t flags) {
    if (!event) return ACL_ERROR_INVALID_PARAM;
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    sim_event *ev = calloc(1, sizeof *ev);
    if (!ev) return ACL_ERROR_BAD_ALLOC;
    ev->magic = SIM_MAGIC_EVENT;
    ev->flags = flags;
    ev->refs = 1;
    pthread_cond_init(&ev->cv, NULL);
    pthread_mutex_lock(&g_lock);
    ps_add(&g_events, ev);
    pthread_mutex_unlock(&g_lock);
    *event = ev;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtCreateEvent(aclrtEvent *event) { return event_create(event, ACL_EVENT_SYNC); }
ACL_FUNC_VISIBILITY aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag) {
    return event_create(event, flag);
}
ACL_FUNC_VISIBILITY aclError aclrtCreateEventExWithFlag(aclrtEvent *event, uint32_t flag) {
    return event_create(event, flag);
}

/* Looks the event up and takes a reference (g_lock held on success). */
static sim_event *event_get_locked(aclrtEvent event) {
    pthread_mutex_lock(&g_lock);
    if (event && ps_has(&g_events, event)) return event;
    pthread_mutex_unlock(&g_lock);
    aclsim_log("event %p is not a live event", event);
    return NULL;
}

ACL_FUNC_VISIBILITY aclError aclrtDestroyEvent(aclrtEvent event) {
    if (!event) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    sim_event *ev = event_get_locked(event);
    if (!ev) return ACL_ERROR_RT_PARAM_INVALID;
    ps_del(&g_events, ev);
    event_unref_locked(ev);
    pthread_mutex_unlock(&g_lock);
    return ACL_SUCCESS;
}

static void free_payload(sim_work *w) { free(w->payload); }

static aclError event_enqueue(aclrtEvent event, aclrtStream stream, int op) {
    if (!event) return ACL_ERROR_INVALID_PARAM;
    aclError rc;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    if (!s) return rc;
    if (s->capture) {
        /* the real runtime would capture it into the graph; the simulator's
         * capture records operators, copies and memsets only */
        aclsim_log("%s on a capturing stream: not supported by the simulator's capture",
                   op == EV_RECORD ? "aclrtRecordEvent" : "aclrtStreamWaitEvent");
        return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
    }
    sim_event *ev = event_get_locked(event);
    if (!ev) return ACL_ERROR_RT_PARAM_INVALID;
    uint64_t gen = op == EV_RECORD ? ++ev->rec_gen : ev->rec_gen;
    if (op == EV_RECORD) {
        ev->rec_stream = s;
        ev->rec_host = atomic_load(&g_host_ns);
    }
    if (op == EV_WAIT && gen == 0) {   /* never recorded: nothing to wait for */
        pthread_mutex_unlock(&g_lock);
        return ACL_SUCCESS;
    }
    ev->refs++;
    pthread_mutex_unlock(&g_lock);
    sim_work *w = aclsim_work_new(0);
    ev_item *e = malloc(sizeof *e);
    if (!e) abort();
    *e = (ev_item){op, ev, gen};
    snprintf(w->what, sizeof w->what, op == EV_RECORD ? "aclrtRecordEvent" : "aclrtStreamWaitEvent");
    w->kind = SIM_WORK_EVENT;
    w->payload = e;
    w->destroy = free_payload;
    enqueue(s, w);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
    return event_enqueue(event, stream, EV_RECORD);
}

ACL_FUNC_VISIBILITY aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
    return event_enqueue(event, stream, EV_WAIT);
}

ACL_FUNC_VISIBILITY aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream) {
    if (!event) return ACL_ERROR_INVALID_PARAM;
    aclError rc;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    if (!s) return rc;
    sim_event *ev = event_get_locked(event);
    if (!ev) return ACL_ERROR_RT_PARAM_INVALID;
    pthread_mutex_unlock(&g_lock);
    return ACL_SUCCESS;
}

/* A query answers by the simulated clock, as a card answers by device
 * progress: complete once the record has run and its simulated time is not
 * after the host's; so the answer does not depend on how far the stream's
 * worker thread got in real time. A record whose time is not yet known waits
 * for its worker unless the stream's clock already lies beyond the host's
 * (then the record does too: not ready), or unless its stream is parked (a
 * host function, a collective: it may wait for this host) or makes no
 * progress for a second of real time: then not ready, which is always safe.
 * A program that spins on a query (SIM_SPIN_POLLS not-ready answers for the
 * same event with no work queued and no host time passing between them) has
 * its host clock moved to the event's time, as spinning would on a card. */
#define SIM_SPIN_POLLS 1000
static int event_ready_locked(sim_event *ev) {
    uint64_t gen = ev->rec_gen;
    if (gen == 0) return 1;   /* never recorded */
    uint64_t host = atomic_load(&g_host_ns);
    int ready = -1;
    struct timespec last;
    clock_gettime(CLOCK_MONOTONIC, &last);
    uint64_t last_gen = SEQ_NONE;
    while (ready < 0) {
        if (ev->done_gen >= gen) {
            ready = ev->time_ns <= host;
            break;
        }
        sim_stream *rs = ev->rec_stream;
        uint64_t lb = atomic_load(&rs->rec->clock);
        if (ev->rec_host > lb) lb = ev->rec_host;
        if (lb > host || atomic_load(&rs->parked) == PARK_EXTERNAL) {
            ready = 0;
            break;
        }
        /* wait for the worker: the record broadcasts the event's cv, and so
         * does its stream parking outside the device's order (park) */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 20 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
        ev_query q = {ev, g_queries};
        g_queries = &q;
        ev->waiters++;
        pthread_cond_timedwait(&ev->cv, &g_lock, &dl);
        ev->waiters--;
        ev_query **pp = &g_queries;
        while (*pp != &q) pp = &(*pp)->next;
        *pp = q.next;
        /* no progress on its device for a second: give up (not ready) */
        uint64_t gg = atomic_load(&gate_of(rs->dev)->gen);
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (gg != last_gen) {
            last_gen = gg;
            last = now;
        } else if ((now.tv_sec - last.tv_sec) * 1000 + (now.tv_nsec - last.tv_nsec) / 1000000 > 1000) {
            ready = 0;
            atomic_fetch_add(&g_stat[ST_QUERY_GIVEUPS], 1);
        }
    }
    if (ready) {
        ev->polls = 0;
        return 1;
    }
    uint64_t sub = atomic_load(&g_submits);
    if (ev->polls && ev->poll_host == host && ev->poll_sub == sub) {
        ev->polls++;
    } else {
        ev->polls = 1;
        ev->poll_host = host;
        ev->poll_sub = sub;
    }
    if (ev->polls < SIM_SPIN_POLLS) return 0;
    /* spinning: the host's time passes until the event completes */
    ev->polls = 0;
    ev->refs++;
    ev->waiters++;
    while (ev->done_gen < gen) pthread_cond_wait(&ev->cv, &g_lock);
    ev->waiters--;
    uint64_t t = ev->time_ns;
    event_unref_locked(ev);
    sim_note_host_time(t);
    return 1;
}

ACL_FUNC_VISIBILITY aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status) {
    if (!event || !status) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    sim_event *ev = event_get_locked(event);
    if (!ev) return ACL_ERROR_RT_PARAM_INVALID;
    ev->refs++;   /* keep it alive if destroyed while we wait */
    int ready = event_ready_locked(ev);
    event_unref_locked(ev);
    *status = ready ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    pthread_mutex_unlock(&g_lock);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtQueryEvent(aclrtEvent event, aclrtEventStatus *status) {
    if (!status) return ACL_ERROR_INVALID_PARAM;
    aclrtEventRecordedStatus st;
    aclError rc = aclrtQueryEventStatus(event, &st);
    if (!rc) *status = st == ACL_EVENT_RECORDED_STATUS_COMPLETE ? ACL_EVENT_STATUS_COMPLETE : ACL_EVENT_STATUS_NOT_READY;
    return rc;
}

ACL_FUNC_VISIBILITY aclError aclrtSynchronizeEvent(aclrtEvent event) {
    if (!event) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    sim_event *ev = event_get_locked(event);
    if (!ev) return ACL_ERROR_RT_PARAM_INVALID;
    uint64_t gen = ev->rec_gen;
    ev->refs++;   /* keep it alive if destroyed while we wait */
    ev->waiters++;
    while (ev->done_gen < gen) pthread_cond_wait(&ev->cv, &g_lock);
    ev->waiters--;
    uint64_t t = ev->time_ns;
    event_unref_locked(ev);
    pthread_mutex_unlock(&g_lock);
    sim_note_host_time(t);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent) {
    if (!ms || !startEvent || !endEvent) return ACL_ERROR_INVALID_PARAM;
    if (!sim_initialized()) return ACL_ERROR_UNINITIALIZE;
    pthread_mutex_lock(&g_lock);
    sim_event *a = startEvent, *b = endEvent;
    aclError rc = 0;
    if (!ps_has(&g_events, a) || !ps_has(&g_events, b)) rc = ACL_ERROR_RT_PARAM_INVALID;
    else if (!a->rec_gen || !b->rec_gen || a->done_gen < a->rec_gen || b->done_gen < b->rec_gen)
        rc = ACL_ERROR_RT_EVENT_NOT_COMPLETE;
    else
        *ms = (float)(((double)b->time_ns - (double)a->time_ns) / 1e6);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* ---- stream capture (aclmdlRI) -------------------------------------------
 * Work submitted to a capturing stream is recorded, not run (as on the real
 * runtime, nothing executes until the graph is replayed). A replay submits a
 * proxy of every recorded item, in order, whose exec runs the original:
 * operators, copies and memsets read their device addresses at replay time,
 * so a replay sees the memory as it is then — and touches exactly the ranges
 * recorded, checked like any other work (an unmapped range is an MMU fault). */
#define SIM_MAGIC_MODEL 0x4d4f444cu
typedef struct sim_model {
    uint32_t magic;
    int dev;
    int n, cap;
    sim_work **items;
} sim_model;

static sim_ptrset g_models;

static aclError capture_record(sim_stream *s, sim_work *w) {
    sim_model *m = s->capture;
    if (w->kind == SIM_WORK_EVENT || w->kind == SIM_WORK_HOST_FUNC || w->kind == SIM_WORK_COLLECTIVE) {
        aclsim_log("%s on a capturing stream: not supported by the simulator's capture", w->what);
        free_work(w);
        return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
    }
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        sim_work **items = realloc(m->items, (size_t)cap * sizeof *items);
        if (!items) abort();
        m->items = items;
        m->cap = cap;
    }
    m->items[m->n++] = w;
    return ACL_SUCCESS;
}

static aclError proxy_exec(sim_work *p) {
    sim_work *o = p->payload;
    o->device = p->device;
    o->stream_id = p->stream_id;
    o->start_ns = p->start_ns;
    o->end_ns = p->end_ns;
    aclError rc = o->exec ? o->exec(o) : ACL_SUCCESS;
    p->end_ns = o->end_ns;
    return rc;
}

static sim_model *model_resolve(aclmdlRI ri) {
    pthread_mutex_lock(&g_lock);
    int ok = ri && ps_has(&g_models, ri);
    pthread_mutex_unlock(&g_lock);
    if (!ok || ((sim_model *)ri)->magic != SIM_MAGIC_MODEL) {
        aclsim_log("%p is not a live captured model", ri);
        return NULL;
    }
    return ri;
}

ACL_FUNC_VISIBILITY aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode) {
    aclError rc;
    if (!stream || (int)mode < ACL_MODEL_RI_CAPTURE_MODE_GLOBAL || (int)mode > ACL_MODEL_RI_CAPTURE_MODE_RELAXED) {
        if (!stream) aclsim_log("aclmdlRICaptureBegin: the default stream cannot be captured");
        return ACL_ERROR_INVALID_PARAM;
    }
    sim_stream *s = sim_stream_resolve(stream, &rc);
    if (!s) return rc;
    if (s->capture) {
        aclsim_log("aclmdlRICaptureBegin: stream %p is already capturing", stream);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    sim_model *m = calloc(1, sizeof *m);
    if (!m) abort();
    m->magic = SIM_MAGIC_MODEL;
    m->dev = s->dev;
    s->capture = m;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI *modelRI) {
    aclError rc;
    if (!stream || !modelRI) return ACL_ERROR_INVALID_PARAM;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    if (!s) return rc;
    if (!s->capture) {
        aclsim_log("aclmdlRICaptureEnd: stream %p is not capturing", stream);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    sim_model *m = s->capture;
    s->capture = NULL;
    pthread_mutex_lock(&g_lock);
    ps_add(&g_models, m);
    pthread_mutex_unlock(&g_lock);
    *modelRI = m;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream) {
    sim_model *m = model_resolve(modelRI);
    if (!m) return ACL_ERROR_INVALID_PARAM;
    aclError rc;
    sim_stream *s = sim_stream_resolve(stream, &rc);
    if (!s) return rc;
    if (s->dev != m->dev) {
        aclsim_log("aclmdlRIExecuteAsync: model of device %d on a stream of device %d", m->dev, s->dev);
        return ACL_ERROR_RT_STREAM_CONTEXT;
    }
    for (int i = 0; i < m->n; i++) {
        sim_work *o = m->items[i];
        sim_work *p = aclsim_work_new(o->nranges);
        memcpy(p->what, o->what, sizeof p->what);
        p->kind = o->kind;
        p->copy_kind = o->copy_kind;
        p->flags = o->flags;
        if (o->nranges) memcpy(p->ranges, o->ranges, (size_t)o->nranges * sizeof *p->ranges);
        p->cost_ns = o->cost_ns;
        p->bytes = o->bytes;
        p->flops = o->flops;
        p->exec = proxy_exec;
        p->payload = o;
        if ((rc = aclsim_submit(stream, p)) != ACL_SUCCESS) return rc;
    }
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclmdlRIExecute(aclmdlRI modelRI, int32_t timeout) {
    aclError rc = aclmdlRIExecuteAsync(modelRI, NULL);
    if (rc) return rc;
    return sim_stream_sync_handle(NULL);
}

ACL_FUNC_VISIBILITY aclError aclmdlRIDestroy(aclmdlRI modelRI) {
    sim_model *m = model_resolve(modelRI);
    if (!m) return ACL_ERROR_INVALID_PARAM;
    /* replays still queued run the recorded items: let them finish */
    sim_sync_all(m->dev);
    pthread_mutex_lock(&g_lock);
    ps_del(&g_models, m);
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < m->n; i++) free_work(m->items[i]);
    free(m->items);
    m->magic = 0;
    free(m);
    return ACL_SUCCESS;
}
