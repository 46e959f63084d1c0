/* Runtime core: configuration, init/finalize, devices and contexts, the cost
 * model, fault injection and the statistics file. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "rt/rt.h"

sim_config g_cfg;
sim_device g_dev[SIM_MAX_DEVICES];
pthread_rwlock_t g_mm;
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_event_cv = PTHREAD_COND_INITIALIZER;
atomic_ullong g_host_ns;
atomic_ullong g_stat[ST_NCOUNTERS];
__thread int t_dev = -1;
__thread void *t_ctx;
static sim_ptrset g_ctxs;           /* live contexts made by aclrtCreateContext (under g_lock) */

static pthread_once_t g_cfg_once = PTHREAD_ONCE_INIT;
static int g_cfg_err;               /* a bad ACLSIM_* value was reported */
static atomic_int g_state;          /* 0 never initialised, 1 initialised, 2 finalised */
static atomic_int g_stats_written;

/* ---- logging ---- */
/* The last diagnostic of this thread, for aclGetRecentErrMsg (torch_npu
 * appends it to the error it raises for a failed call). */
static __thread char t_recent_msg[1024];
static __thread int t_recent_set;

SIM_API void aclsim_log(const char *fmt, ...) {
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "aclsim: ");
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    memcpy(t_recent_msg, buf, (size_t)n);
    t_recent_msg[n] = 0;
    t_recent_set = 1;
    buf[n++] = '\n';
    /* one write() so lines from several threads do not interleave */
    ssize_t r = write(2, buf, (size_t)n);
    (void)r;
}

/* The message of the most recent failure reported on this thread, once
 * (the real runtime clears it when read); NULL when there is none. */
ACL_FUNC_VISIBILITY const char *aclGetRecentErrMsg() {
    if (!t_recent_set) return NULL;
    t_recent_set = 0;
    return t_recent_msg;
}

/* ---- configuration ---- */
static int parse_size(const char *name, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0 || !isfinite(v)) goto bad;
    double mul = 1;
    switch (*end) {
    case 0: break;
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    case 't': case 'T': mul = 1099511627776.0; end++; break;
    default: goto bad;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) goto bad;
    *out = (uint64_t)(v * mul);
    return 0;
bad:
    aclsim_log("invalid %s='%s': expected a byte size such as 34359738368, 512M or 32G", name, s);
    return -1;
}

static int parse_double(const char *name, const char *s, double *out, double min) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < min) {
        aclsim_log("invalid %s='%s': expected a number >= %g", name, s, min);
        return -1;
    }
    *out = v;
    return 0;
}

static void fault_parse(const char *spec);
static void link_init(void);

static void config_load(void) {
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* writers (map/unmap/alloc) must not starve behind a stream of kernels */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&g_mm, &ra);

    sim_config *c = &g_cfg;
    const char *preset = getenv("ACLSIM_PRESET");
    c->hbm_bytes = 32ULL << 30; c->hbm_gbps = 800; c->tflops = 280; c->soc_name = "Ascend910B4";
    if (preset && *preset) {
        if (!strcasecmp(preset, "910b4")) {
            /* defaults above */
        } else if (!strcasecmp(preset, "910b2")) {
            c->hbm_bytes = 64ULL << 30; c->hbm_gbps = 1600; c->tflops = 320; c->soc_name = "Ascend910B2";
        } else {
            aclsim_log("invalid ACLSIM_PRESET='%s': expected 910b4 or 910b2", preset);
            g_cfg_err = 1;
        }
    }
    c->devices = 1;
    c->link_gbps = 25;
    c->launch_us = 5;
    const char *v;
    if ((v = getenv("ACLSIM_DEVICES")) && *v) {
        char *end;
        long n = strtol(v, &end, 10);
        if (*end || n < 1 || n > SIM_MAX_DEVICES) {
            aclsim_log("invalid ACLSIM_DEVICES='%s': expected 1..%d", v, SIM_MAX_DEVICES);
            g_cfg_err = 1;
        } else {
            c->devices = (int)n;
        }
    }
    if ((v = getenv("ACLSIM_HBM_BYTES")) && *v) {
        uint64_t b;
        if (parse_size("ACLSIM_HBM_BYTES", v, &b)) g_cfg_err = 1;
        else if (b < SIM_GRANULE || b > (1ULL << 44)) {
            aclsim_log("invalid ACLSIM_HBM_BYTES='%s': expected 2M..16T", v);
            g_cfg_err = 1;
        } else c->hbm_bytes = b;
    }
    if ((v = getenv("ACLSIM_HBM_GBPS")) && *v && parse_double("ACLSIM_HBM_GBPS", v, &c->hbm_gbps, 1e-3)) g_cfg_err = 1;
    if ((v = getenv("ACLSIM_LINK_GBPS")) && *v && parse_double("ACLSIM_LINK_GBPS", v, &c->link_gbps, 1e-3)) g_cfg_err = 1;
    if ((v = getenv("ACLSIM_TFLOPS")) && *v && parse_double("ACLSIM_TFLOPS", v, &c->tflops, 1e-6)) g_cfg_err = 1;
    if ((v = getenv("ACLSIM_LAUNCH_US")) && *v && parse_double("ACLSIM_LAUNCH_US", v, &c->launch_us, 0)) g_cfg_err = 1;
    if ((v = getenv("ACLSIM_PHANTOM")) && *v) {
        if (!strcmp(v, "1")) c->phantom = 1;
        else if (strcmp(v, "0")) {
            aclsim_log("invalid ACLSIM_PHANTOM='%s': expected 0 or 1", v);
            g_cfg_err = 1;
        }
    }
    /* host RAM for host-located physical handles: this machine's RAM (phantom
     * mode keeps no data: 2 TiB, a training server's order) */
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    c->host_bytes = c->phantom || pages <= 0 || psz <= 0 ? 2ULL << 40 : (uint64_t)pages * (uint64_t)psz;
    if ((v = getenv("ACLSIM_HOST_BYTES")) && *v) {
        uint64_t b;
        if (parse_size("ACLSIM_HOST_BYTES", v, &b)) g_cfg_err = 1;
        else if (b < SIM_GRANULE || b > (1ULL << 46)) {
            aclsim_log("invalid ACLSIM_HOST_BYTES='%s': expected 2M..64T", v);
            g_cfg_err = 1;
        } else c->host_bytes = b;
    }
    if ((v = getenv("ACLSIM_LINK_MODEL")) && *v) {
        if (!strcmp(v, "per-stream")) c->link_model = 1;
        else if (strcmp(v, "shared")) {
            aclsim_log("invalid ACLSIM_LINK_MODEL='%s': expected shared or per-stream", v);
            g_cfg_err = 1;
        }
    }
    link_init();
    if ((v = getenv("ACLSIM_STATS")) && *v) snprintf(c->stats_path, sizeof c->stats_path, "%s", v);
    if ((v = getenv("ACLSIM_FAULTS")) && *v) fault_parse(v);
    for (int i = 0; i < SIM_MAX_DEVICES; i++) g_dev[i].id = i;
}

void sim_ensure_config(void) { pthread_once(&g_cfg_once, config_load); }
int sim_config_error(void) { sim_ensure_config(); return g_cfg_err; }
SIM_API const sim_config *aclsim_config(void) { sim_ensure_config(); return &g_cfg; }
int sim_initialized(void) { return atomic_load(&g_state) == 1; }

/* ---- fault injection ---- */
typedef struct fault_rule { int site; uint64_t n; int onward; } fault_rule;
static fault_rule g_rules[64];
static int g_nrules;
static atomic_ullong g_site_calls[SIM_FAULT_NSITES];
static struct { int dev; uint64_t n; } g_lose[SIM_MAX_DEVICES];
static int g_nlose;
static const char *const site_names[SIM_FAULT_NSITES] = {
    "malloc", "phys", "map", "copy", "memset", "op", "host", "coll"};

static void fault_parse(const char *spec) {
    char *dup = strdup(spec), *save = NULL;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok)) tok++;
        char *colon = strchr(tok, ':');
        if (!colon) goto bad;
        *colon = 0;
        char *arg = colon + 1, *end;
        if (!strcmp(tok, "lose")) {
            long dev = strtol(arg, &end, 10);
            if (end == arg || *end != '@' || dev < 0 || dev >= SIM_MAX_DEVICES) goto bad;
            char *ns = end + 1;
            unsigned long long n = strtoull(ns, &end, 10);
            if (end == ns || *end || n == 0 || g_nlose == SIM_MAX_DEVICES) goto bad;
            g_lose[g_nlose].dev = (int)dev;
            g_lose[g_nlose++].n = n;
            continue;
        }
        int site = -1;
        for (int s = 0; s < SIM_FAULT_NSITES; s++)
            if (!strcmp(tok, site_names[s])) site = s;
        if (site < 0) goto bad;
        unsigned long long n = strtoull(arg, &end, 10);
        if (end == arg || n == 0 || g_nrules == 64) goto bad;
        int onward = 0;
        if (*end == '+') { onward = 1; end++; }
        if (*end) goto bad;
        g_rules[g_nrules++] = (fault_rule){site, n, onward};
        continue;
    bad:
        aclsim_log("invalid ACLSIM_FAULTS rule '%s%s%s' in '%s': expected SITE:N, SITE:N+ "
                   "(sites malloc phys map copy memset op host coll) or lose:DEV@N",
                   tok, colon ? ":" : "", colon ? colon + 1 : "", spec);
        g_cfg_err = 1;
        break;
    }
    free(dup);
}

SIM_API int aclsim_fault_hit(int site) {
    if (site < 0 || site >= SIM_FAULT_NSITES || g_nrules == 0) return 0;
    uint64_t n = atomic_fetch_add(&g_site_calls[site], 1) + 1;
    for (int i = 0; i < g_nrules; i++) {
        if (g_rules[i].site != site) continue;
        if (n == g_rules[i].n || (g_rules[i].onward && n > g_rules[i].n)) {
            atomic_fetch_add(&g_stat[ST_INJECTED], 1);
            aclsim_log("injected fault: %s call #%llu fails (ACLSIM_FAULTS)", site_names[site],
                       (unsigned long long)n);
            return 1;
        }
    }
    return 0;
}

SIM_API int aclsim_device_lost(int dev) {
    if (dev < 0 || dev >= SIM_MAX_DEVICES) return 0;
    return atomic_load(&g_dev[dev].lost);
}

/* Counts one work item on `dev`; the device disappears at the configured count. */
static int sim_lose_tick(int dev) {
    uint64_t n = atomic_fetch_add(&g_dev[dev].work_submitted, 1) + 1;
    for (int i = 0; i < g_nlose; i++) {
        if (g_lose[i].dev == dev && n >= g_lose[i].n && !atomic_exchange(&g_dev[dev].lost, 1)) {
            atomic_fetch_add(&g_stat[ST_INJECTED], 1);
            aclsim_log("injected fault: device %d disappeared at work item #%llu (ACLSIM_FAULTS)", dev,
                       (unsigned long long)n);
        }
    }
    return atomic_load(&g_dev[dev].lost);
}

aclError sim_device_check(int dev) {
    if (dev < 0 || dev >= g_cfg.devices) return ACL_ERROR_RT_INVALID_DEVICEID;
    if (atomic_load(&g_dev[dev].lost)) return ACL_ERROR_RT_DEVICE_TASK_ABORT;
    return 0;
}

/* Every work item (async or sync) on a device passes here. */
aclError sim_work_tick(int dev) {
    if (sim_lose_tick(dev)) return ACL_ERROR_RT_DEVICE_TASK_ABORT;
    return 0;
}

/* ---- readiness ---- */
SIM_API aclError aclsim_check_ready(void) {
    if (atomic_load(&g_state) != 1) return ACL_ERROR_UNINITIALIZE;
    if (t_dev < 0) return ACL_ERROR_RT_CONTEXT_NULL;
    if (t_ctx && t_ctx != (void *)&g_dev[t_dev] && ((sim_ctx *)t_ctx)->dead) {
        aclsim_log("the current context %p was destroyed (aclrtDestroyContext)", t_ctx);
        return ACL_ERROR_RT_CONTEXT_NULL;
    }
    return sim_device_check(t_dev);
}

SIM_API int aclsim_device_refs(int dev) {
    if (dev < 0 || dev >= SIM_MAX_DEVICES) return -1;
    return atomic_load(&g_dev[dev].refs);
}

SIM_API int aclsim_current_device(void) { return t_dev; }

/* ---- cost model ---- */
SIM_API uint64_t aclsim_op_cost_ns(uint64_t flops, uint64_t bytes) {
    sim_ensure_config();
    double compute = (double)flops / (g_cfg.tflops * 1e12) * 1e9;
    double memory = (double)bytes / (g_cfg.hbm_gbps * 1e9) * 1e9;
    return (uint64_t)llround(fmax(compute, memory) + g_cfg.launch_us * 1e3);
}

SIM_API uint64_t aclsim_copy_cost_ns(int kind, uint64_t bytes, int host_pinned) {
    sim_ensure_config();
    double gbps;
    switch (kind) {
    case ACL_MEMCPY_HOST_TO_DEVICE:
    case ACL_MEMCPY_DEVICE_TO_HOST:
        /* pageable host memory is staged through a bounce buffer: half speed */
        gbps = host_pinned ? g_cfg.link_gbps : g_cfg.link_gbps / 2;
        break;
    case ACL_MEMCPY_DEVICE_TO_DEVICE:
        gbps = g_cfg.hbm_gbps;
        break;
    default:
        return 0;   /* host to host: not device time */
    }
    return (uint64_t)llround((double)bytes / (gbps * 1e9) * 1e9);
}

uint64_t sim_link_ns(uint64_t bytes) {
    sim_ensure_config();
    return (uint64_t)llround((double)bytes / (g_cfg.link_gbps * 1e9) * 1e9);
}

/* ---- the host link, shared in simulated time ----
 * Each device has one host<->device link (PCIe x16: full duplex), modelled as
 * one calendar per direction: the simulated time already taken on it, as
 * sorted, disjoint busy intervals. A transfer that needs `need` ns of the
 * link from `start` on takes the free time after `start` until it has had
 * `need` ns (it fills the gaps other transfers left), so transfers that
 * overlap in simulated time share the direction's bandwidth and the link
 * never carries more than link_gbps in either direction. Work items reach
 * the calendar in the order their stream threads run them, not in simulated
 * order; which of two overlapping transfers finishes first can therefore
 * vary between runs, the total time the link is busy cannot.
 * ACLSIM_LINK_MODEL=per-stream restores the old model (every stream has the
 * whole link to itself). */
enum { LINK_H2D = 0, LINK_D2H = 1 };
typedef struct link_cal {
    pthread_mutex_t mu;
    uint64_t (*iv)[2];       /* busy [start, end), sorted, disjoint, not adjacent */
    size_t n, cap;
    size_t prune_at;         /* prune once n exceeds this */
    uint64_t floor;          /* time below it was pruned: counts as busy */
    uint64_t busy_ns;        /* total reserved (statistics) */
} link_cal;
static link_cal g_link[SIM_MAX_DEVICES][2];

static void link_init(void) {
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        for (int k = 0; k < 2; k++) {
            pthread_mutex_init(&g_link[d][k].mu, NULL);
            g_link[d][k].prune_at = 1024;
        }
}

/* Drops busy intervals that end before `wm`: no work can start before it. */
static void link_prune_locked(link_cal *c, uint64_t wm) {
    size_t i = 0;
    while (i < c->n && c->iv[i][1] <= wm) i++;
    if (i) {
        memmove(c->iv, c->iv + i, (c->n - i) * sizeof *c->iv);
        c->n -= i;
    }
    if (wm > c->floor) c->floor = wm;
    c->prune_at = c->n * 2 > 1024 ? c->n * 2 : 1024;
}

/* Reserves `need` ns of direction `dir` of device `dev`'s link from `start`
 * on; returns when the transfer ends. */
static uint64_t link_reserve(int dev, int dir, uint64_t start, uint64_t need) {
    if (!need) return start;
    if (dev < 0 || dev >= SIM_MAX_DEVICES) return start + need;
    link_cal *c = &g_link[dev][dir];
    uint64_t wm = 0;
    pthread_mutex_lock(&c->mu);
    int prune = c->n > c->prune_at;
    pthread_mutex_unlock(&c->mu);
    if (prune) wm = sim_link_low_water(dev);   /* takes stream locks: not under c->mu */
    pthread_mutex_lock(&c->mu);
    if (prune) link_prune_locked(c, wm);
    if (start < c->floor) start = c->floor;
    /* first interval ending after start */
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c->iv[mid][1] <= start) lo = mid + 1; else hi = mid;
    }
    size_t i = lo, j = lo;
    uint64_t t = start, left = need;
    while (left) {
        if (j < c->n && c->iv[j][0] <= t) {   /* busy: skip to its end */
            t = c->iv[j][1];
            j++;
            continue;
        }
        uint64_t gap = j < c->n ? c->iv[j][0] - t : UINT64_MAX - t;
        uint64_t take = left < gap ? left : gap;
        t += take;
        left -= take;
    }
    /* [s, t) is busy now: replace intervals i..k-1 by one, merged with
     * neighbours that touch it */
    uint64_t s = start, e = t;
    if (i < c->n && c->iv[i][0] < s) s = c->iv[i][0];
    if (i > 0 && c->iv[i - 1][1] == s) s = c->iv[--i][0];
    size_t k = j;
    if (k < c->n && c->iv[k][0] <= e) e = c->iv[k++][1];
    if (k == i) {   /* insert */
        if (c->n == c->cap) {
            size_t cap = c->cap ? 2 * c->cap : 256;
            void *p = realloc(c->iv, cap * sizeof *c->iv);
            if (!p) abort();
            c->iv = p;
            c->cap = cap;
        }
        memmove(c->iv + i + 1, c->iv + i, (c->n - i) * sizeof *c->iv);
        c->n++;
    } else if (k > i + 1) {
        memmove(c->iv + i + 1, c->iv + k, (c->n - k) * sizeof *c->iv);
        c->n -= k - i - 1;
    }
    c->iv[i][0] = s;
    c->iv[i][1] = e;
    c->busy_ns += need;
    pthread_mutex_unlock(&c->mu);
    return t;
}

static int link_per_stream(void) { return g_cfg.link_model == 1; }

uint64_t sim_link_transfer(int dev, int to_device, uint64_t start, uint64_t bytes) {
    uint64_t need = sim_link_ns(bytes);
    if (link_per_stream()) return start + need;
    return link_reserve(dev, to_device ? LINK_H2D : LINK_D2H, start, need);
}

/* The old model: every stream has the whole link (ACLSIM_LINK_MODEL=per-stream). */
static uint64_t cost_per_stream(int kind, int copy_kind, uint64_t base, uint64_t flops, uint64_t bytes,
                                const sim_link *l) {
    uint64_t remote = l->hm_rd + l->hm_wr + l->mg_rd + l->mg_wr, fp = l->hm_fp + l->mg_fp;
    if (!remote && !l->mg_migrated) return base;
    double link = (double)sim_link_ns(remote), mig = (double)sim_link_ns(l->mg_migrated);
    switch (kind) {
    case SIM_WORK_OP:
    case SIM_WORK_MEMSET: {
        double compute = (double)flops / (g_cfg.tflops * 1e12) * 1e9;
        double local = (double)(bytes > fp ? bytes - fp : 0) / (g_cfg.hbm_gbps * 1e9) * 1e9;
        return (uint64_t)llround(fmax(compute, fmax(local, link)) + g_cfg.launch_us * 1e3 + mig);
    }
    case SIM_WORK_COPY:
        if (copy_kind == ACL_MEMCPY_DEVICE_TO_DEVICE) return (uint64_t)llround(fmax((double)base, link) + mig);
        return base + (uint64_t)llround(link + mig);
    default:   /* collectives: their ring already runs over the link */
        return base + (uint64_t)llround(link + mig);
    }
}

/* Duration of work on device `dev` starting at `start` whose all-HBM cost is
 * `base`, once its link traffic `l` is known. The memory side of the roofline
 * splits: bytes in HBM at HBM bandwidth, bytes in host memory over the link,
 * in parallel; managed pages migrated before the access come first (the access
 * waits for them). Host->device traffic (a H2D copy's bytes, device reads of
 * host memory, migrations) takes the H2D direction of the shared link, the
 * rest the D2H direction (see link_reserve). Collectives keep their own ring
 * cost plus their host-memory bytes at link rate, outside the calendar. */
uint64_t sim_work_cost(int dev, int kind, int copy_kind, uint64_t start, uint64_t base, uint64_t flops,
                       uint64_t bytes, const sim_link *l) {
    uint64_t remote = l->hm_rd + l->hm_wr + l->mg_rd + l->mg_wr, fp = l->hm_fp + l->mg_fp;
    int xfer = kind == SIM_WORK_COPY &&
               (copy_kind == ACL_MEMCPY_HOST_TO_DEVICE || copy_kind == ACL_MEMCPY_DEVICE_TO_HOST);
    if (link_per_stream() || kind == SIM_WORK_COLLECTIVE || dev < 0 || (!xfer && !remote && !l->mg_migrated))
        return cost_per_stream(kind, copy_kind, base, flops, bytes, l);
    /* migrations first */
    uint64_t t1 = link_reserve(dev, LINK_H2D, start, sim_link_ns(l->mg_migrated));
    uint64_t in = l->hm_rd + l->mg_rd, out = l->hm_wr + l->mg_wr;
    if (xfer && copy_kind == ACL_MEMCPY_HOST_TO_DEVICE) in += bytes;
    if (xfer && copy_kind == ACL_MEMCPY_DEVICE_TO_HOST) out += bytes;
    uint64_t e_in = link_reserve(dev, LINK_H2D, t1, sim_link_ns(in));
    uint64_t e_out = link_reserve(dev, LINK_D2H, t1, sim_link_ns(out));
    uint64_t link = (e_in > e_out ? e_in : e_out) - t1;
    switch (kind) {
    case SIM_WORK_OP:
    case SIM_WORK_MEMSET: {
        double compute = (double)flops / (g_cfg.tflops * 1e12) * 1e9;
        double local = (double)(bytes > fp ? bytes - fp : 0) / (g_cfg.hbm_gbps * 1e9) * 1e9;
        return (t1 - start) + (uint64_t)llround(fmax(compute, fmax(local, (double)link)) + g_cfg.launch_us * 1e3);
    }
    default:   /* copies: at least their own cost (pageable memory: half rate) */
        return (t1 - start) + (base > link ? base : link);
    }
}

SIM_API uint64_t aclsim_link_busy_ns(int dev, int dir) {
    if (dev < 0 || dev >= SIM_MAX_DEVICES || dir < 0 || dir > 1) return 0;
    link_cal *c = &g_link[dev][dir];
    pthread_mutex_lock(&c->mu);
    uint64_t b = c->busy_ns;
    pthread_mutex_unlock(&c->mu);
    return b;
}

void sim_count_link(int work_kind, const sim_link *l) {
    int c;
    switch (work_kind) {
    case SIM_WORK_OP: c = SIM_LC_OP; break;
    case SIM_WORK_COPY: c = SIM_LC_COPY; break;
    case SIM_WORK_MEMSET: c = SIM_LC_MEMSET; break;
    default: c = SIM_LC_COLL; break;
    }
    if (l->hm_rd) atomic_fetch_add(&g_stat[ST_HM_RD_OP + c], l->hm_rd);
    if (l->hm_wr) atomic_fetch_add(&g_stat[ST_HM_WR_OP + c], l->hm_wr);
    if (l->mg_rd + l->mg_wr) atomic_fetch_add(&g_stat[ST_MG_REMOTE], l->mg_rd + l->mg_wr);
    if (l->mg_migrated) atomic_fetch_add(&g_stat[ST_MG_MIGRATED], l->mg_migrated);
}

void sim_note_host_time(uint64_t t) {
    uint64_t cur = atomic_load(&g_host_ns);
    while (t > cur && !atomic_compare_exchange_weak(&g_host_ns, &cur, t)) {}
}

uint64_t sim_host_advance(uint64_t cost) { return atomic_fetch_add(&g_host_ns, cost) + cost; }

SIM_API uint64_t aclsim_host_ns(void) { return atomic_load(&g_host_ns); }

SIM_API void aclsim_stat_add(const char *counter, uint64_t v) {
    if (!strcmp(counter, "ops")) atomic_fetch_add(&g_stat[ST_OPS], v);
    else if (!strcmp(counter, "hccl_ops")) atomic_fetch_add(&g_stat[ST_HCCL_OPS], v);
    else if (!strcmp(counter, "memsets")) atomic_fetch_add(&g_stat[ST_MEMSETS], v);
}

void sim_count_copy(int kind, uint64_t bytes) {
    if (kind < 0 || kind > 3) return;
    atomic_fetch_add(&g_stat[ST_COPY_BYTES_H2H + kind], bytes);
    atomic_fetch_add(&g_stat[ST_COPIES_H2H + kind], 1);
}

/* ---- init, devices, contexts ---- */
static void atexit_stats(void) { sim_write_stats(); }

ACL_FUNC_VISIBILITY aclError aclInit(const char *configPath) {
    if (sim_config_error()) return ACL_ERROR_INVALID_PARAM;
    if (configPath && *configPath && access(configPath, R_OK) != 0) {
        aclsim_log("aclInit: config file '%s' cannot be read", configPath);
        return ACL_ERROR_INVALID_FILE;
    }
    int expected = 0;
    if (!atomic_compare_exchange_strong(&g_state, &expected, 1)) {
        if (expected == 1) return ACL_ERROR_REPEAT_INITIALIZE;
        /* re-initialising after aclFinalize is allowed, as on CANN */
        atomic_store(&g_state, 1);
        return ACL_SUCCESS;
    }
    atexit(atexit_stats);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclFinalize() {
    int st = atomic_load(&g_state);
    if (st == 0) return ACL_ERROR_UNINITIALIZE;
    if (st == 2) return ACL_ERROR_REPEAT_FINALIZE;
    sim_sync_all(-1);
    sim_write_stats();
    atomic_store(&g_state, 2);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtGetDeviceCount(uint32_t *count) {
    if (!count) return ACL_ERROR_INVALID_PARAM;
    if (sim_config_error()) return ACL_ERROR_INVALID_PARAM;
    *count = (uint32_t)g_cfg.devices;
    return ACL_SUCCESS;
}

/* The device's memory and default context, made once (g_lock held). */
static void device_open_locked(int dev) {
    if (g_dev[dev].opened) return;
    pthread_rwlock_wrlock(&g_mm);
    sim_mem_init_device(&g_dev[dev]);
    pthread_rwlock_unlock(&g_mm);
    sim_streams_init_device(dev);
    g_dev[dev].opened = 1;
}

/* Each call takes a reference on the device (released by as many
 * aclrtResetDevice, as on CANN) and puts the thread on the device's default
 * context. */
ACL_FUNC_VISIBILITY aclError aclrtSetDevice(int32_t deviceId) {
    if (atomic_load(&g_state) != 1) return ACL_ERROR_UNINITIALIZE;
    if (deviceId < 0 || deviceId >= g_cfg.devices) return ACL_ERROR_RT_INVALID_DEVICEID;
    if (atomic_load(&g_dev[deviceId].lost)) return ACL_ERROR_RT_DEVICE_TASK_ABORT;
    pthread_mutex_lock(&g_lock);
    device_open_locked(deviceId);
    pthread_mutex_unlock(&g_lock);
    atomic_fetch_add(&g_dev[deviceId].refs, 1);
    t_dev = deviceId;
    t_ctx = &g_dev[deviceId];
    return ACL_SUCCESS;
}

/* Drops one reference (none left: nothing to drop). The call that drops the
 * last waits for the device's work and releases the device's memory
 * (sim_mem_release_device), as CANN does with the default context; the
 * calling thread loses its context if it was on this device, at every call. */
ACL_FUNC_VISIBILITY aclError aclrtResetDevice(int32_t deviceId) {
    if (atomic_load(&g_state) != 1) return ACL_ERROR_UNINITIALIZE;
    if (deviceId < 0 || deviceId >= g_cfg.devices) return ACL_ERROR_RT_INVALID_DEVICEID;
    if (!g_dev[deviceId].opened) return ACL_SUCCESS;
    int refs = atomic_load(&g_dev[deviceId].refs);
    while (refs > 0 && !atomic_compare_exchange_weak(&g_dev[deviceId].refs, &refs, refs - 1)) {}
    (void)sim_sync_all(deviceId);   /* a lost device's work is dropped: the reset still succeeds */
    if (refs == 1) sim_mem_release_device(deviceId);
    if (t_dev == deviceId) {
        t_dev = -1;
        t_ctx = NULL;
    }
    return ACL_SUCCESS;
}

/* Drops every reference at once, however many aclrtSetDevice calls took
 * them, and releases the device's memory like the last aclrtResetDevice. */
ACL_FUNC_VISIBILITY aclError aclrtResetDeviceForce(int32_t deviceId) {
    if (atomic_load(&g_state) != 1) return ACL_ERROR_UNINITIALIZE;
    if (deviceId < 0 || deviceId >= g_cfg.devices) return ACL_ERROR_RT_INVALID_DEVICEID;
    if (!g_dev[deviceId].opened) return ACL_SUCCESS;
    int refs = atomic_exchange(&g_dev[deviceId].refs, 0);
    (void)sim_sync_all(deviceId);
    if (refs > 0) sim_mem_release_device(deviceId);
    if (t_dev == deviceId) {
        t_dev = -1;
        t_ctx = NULL;
    }
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtGetDevice(int32_t *deviceId) {
    if (!deviceId) return ACL_ERROR_INVALID_PARAM;
    if (atomic_load(&g_state) != 1) return ACL_ERROR_UNINITIALIZE;
    if (t_dev < 0) return ACL_ERROR_RT_CONTEXT_NULL;
    *deviceId = t_dev;
    return ACL_SUCCESS;
}

/* Contexts: each device's default context (made by its first
 * aclrtSetDevice) and those made by aclrtCreateContext; the current context
 * is per thread, and sets the thread's device. */
ACL_FUNC_VISIBILITY aclError aclrtGetCurrentContext(aclrtContext *context) {
    if (!context) return ACL_ERROR_INVALID_PARAM;
    if (atomic_load(&g_state) != 1) return ACL_ERROR_UNINITIALIZE;
    if (t_dev < 0) return ACL_ERROR_RT_CONTEXT_NULL;
    *context = t_ctx;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclrtSetCurrentContext(aclrtContext context) {
    if (!context) return ACL_ERROR_INVALID_PARAM;
    if (atomic_load(&g_state) != 1) return ACL_ERROR_UNINITIALIZE;
    for (int i = 0; i < g_cfg.devices; i++) {
        if (context == &g_dev[i] && g_dev[i].opened) {
            t_dev = i;
            t_ctx = context;
            return ACL_SUCCESS;
        }
    }
    pthread_mutex_lock(&g_lock);
    int live = ps_has(&g_ctxs, context);
    pthread_mutex_unlock(&g_lock);
    if (!live) {
        aclsim_log("aclrtSetCurrentContext(%p): not a live context", context);
        return ACL_ERROR_INVALID_PARAM;
    }
    t_dev = ((sim_ctx *)context)->dev;
    t_ctx = context;
    return ACL_SUCCESS;
}

/* A context of the calling process on `deviceId`, with its own default
 * stream; it becomes the calling thread's context. Takes no device
 * reference (aclrtSetDevice does). */
ACL_FUNC_VISIBILITY aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId) {
    if (!context) return ACL_ERROR_INVALID_PARAM;
    if (atomic_load(&g_state) != 1) return ACL_ERROR_UNINITIALIZE;
    if (deviceId < 0 || deviceId >= g_cfg.devices) return ACL_ERROR_RT_INVALID_DEVICEID;
    if (atomic_load(&g_dev[deviceId].lost)) return ACL_ERROR_RT_DEVICE_TASK_ABORT;
    sim_ctx *c = calloc(1, sizeof *c);
    if (!c) return ACL_ERROR_BAD_ALLOC;
    c->magic = SIM_MAGIC_CTX;
    c->dev = deviceId;
    pthread_mutex_lock(&g_lock);
    device_open_locked(deviceId);
    pthread_mutex_unlock(&g_lock);
    c->default_stream = sim_stream_new_in(deviceId, c);
    pthread_mutex_lock(&g_lock);
    ps_add(&g_ctxs, c);
    pthread_mutex_unlock(&g_lock);
    *context = c;
    t_dev = deviceId;
    t_ctx = c;
    return ACL_SUCCESS;
}

/* Destroys a context made by aclrtCreateContext (a default context cannot
 * be); the streams created in it go with it (their queued work runs first,
 * as aclrtDestroyStream). A thread whose current context it was has none. */
ACL_FUNC_VISIBILITY aclError aclrtDestroyContext(aclrtContext context) {
    if (!context) return ACL_ERROR_INVALID_PARAM;
    if (atomic_load(&g_state) != 1) return ACL_ERROR_UNINITIALIZE;
    pthread_mutex_lock(&g_lock);
    int live = ps_has(&g_ctxs, context);
    if (live) {
        ps_del(&g_ctxs, context);
        ((sim_ctx *)context)->dead = 1;
    }
    pthread_mutex_unlock(&g_lock);
    if (!live) {
        aclsim_log("aclrtDestroyContext(%p): not a context made by aclrtCreateContext", context);
        return ACL_ERROR_INVALID_PARAM;
    }
    int n = sim_streams_destroy_context(context) - 1;   /* less its default stream */
    if (n > 0) aclsim_log("aclrtDestroyContext(%p): %d stream(s) created in it destroyed with it", context, n);
    if (t_ctx == context) {
        t_dev = -1;
        t_ctx = NULL;
    }
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY const char *aclrtGetSocName() {
    sim_ensure_config();
    return g_cfg.soc_name;
}

/* ---- statistics file ---- */
void sim_write_stats(void) {
    if (!g_cfg.stats_path[0] || atomic_exchange(&g_stats_written, 1)) return;
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", g_cfg.stats_path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        aclsim_log("cannot write ACLSIM_STATS file '%s': %s", g_cfg.stats_path, strerror(errno));
        return;
    }
    uint64_t host = atomic_load(&g_host_ns), dev_max = sim_max_stream_clock();
    fprintf(f, "{\n  \"version\": 1,\n  \"phantom\": %s,\n", g_cfg.phantom ? "true" : "false");
    fprintf(f, "  \"sim_ns\": %llu,\n", (unsigned long long)(host > dev_max ? host : dev_max));
    fprintf(f, "  \"host_sim_ns\": %llu,\n", (unsigned long long)host);
    fprintf(f, "  \"link_model\": \"%s\",\n", g_cfg.link_model ? "per-stream" : "shared");
    fprintf(f, "  \"ops\": %llu,\n  \"hccl_ops\": %llu,\n  \"memsets\": %llu,\n",
            (unsigned long long)g_stat[ST_OPS], (unsigned long long)g_stat[ST_HCCL_OPS],
            (unsigned long long)g_stat[ST_MEMSETS]);
    fprintf(f, "  \"mmu_faults\": %llu,\n  \"failed_allocs\": %llu,\n  \"injected_faults\": %llu,\n",
            (unsigned long long)g_stat[ST_MMU_FAULTS], (unsigned long long)g_stat[ST_FAILED_ALLOCS],
            (unsigned long long)g_stat[ST_INJECTED]);
    fprintf(f, "  \"query_giveups\": %llu, \"wait_parks\": %llu,\n",
            (unsigned long long)g_stat[ST_QUERY_GIVEUPS], (unsigned long long)g_stat[ST_WAIT_PARKS]);
    static const char *kinds[4] = {"H2H", "H2D", "D2H", "D2D"};
    fprintf(f, "  \"copy_bytes\": {");
    for (int k = 0; k < 4; k++)
        fprintf(f, "%s\"%s\": %llu", k ? ", " : "", kinds[k], (unsigned long long)g_stat[ST_COPY_BYTES_H2H + k]);
    fprintf(f, "},\n  \"copies\": {");
    for (int k = 0; k < 4; k++)
        fprintf(f, "%s\"%s\": %llu", k ? ", " : "", kinds[k], (unsigned long long)g_stat[ST_COPIES_H2H + k]);
    fprintf(f, "},\n  \"allocs\": {\"malloc\": %llu, \"malloc_bytes\": %llu, \"reserve\": %llu, \"phys\": %llu, "
            "\"phys_bytes\": %llu, \"map\": %llu, \"host\": %llu, \"host_bytes\": %llu,\n    \"phys_host\": %llu, "
            "\"phys_host_bytes\": %llu, \"managed\": %llu, \"managed_bytes\": %llu",
            (unsigned long long)g_stat[ST_AL_MALLOC], (unsigned long long)g_stat[ST_AL_MALLOC_BYTES],
            (unsigned long long)g_stat[ST_AL_RESERVE], (unsigned long long)g_stat[ST_AL_PHYS],
            (unsigned long long)g_stat[ST_AL_PHYS_BYTES], (unsigned long long)g_stat[ST_AL_MAP],
            (unsigned long long)g_stat[ST_AL_HOST], (unsigned long long)g_stat[ST_AL_HOST_BYTES],
            (unsigned long long)g_stat[ST_AL_PHYS_HOST], (unsigned long long)g_stat[ST_AL_PHYS_HOST_BYTES],
            (unsigned long long)g_stat[ST_AL_MANAGED], (unsigned long long)g_stat[ST_AL_MANAGED_BYTES]);
    fprintf(f, "},\n");
    sim_mem_json(f);
    fprintf(f, "  \"devices\": [");
    for (int d = 0; d < g_cfg.devices; d++) {
        uint64_t used = 0, peak = 0;
        sim_mem_stats(d, &used, &peak);
        fprintf(f, "%s\n    {\"id\": %d, \"hbm_bytes\": %llu, \"peak_bytes\": %llu, \"current_bytes\": %llu, "
                "\"failed_allocs\": %llu, \"mmu_faults\": %llu, \"lost\": %s,\n     \"link_h2d_busy_ns\": %llu, "
                "\"link_d2h_busy_ns\": %llu}",
                d ? "," : "", d, (unsigned long long)g_cfg.hbm_bytes, (unsigned long long)peak,
                (unsigned long long)used, (unsigned long long)g_dev[d].failed_allocs,
                (unsigned long long)g_dev[d].mmu_faults, g_dev[d].lost ? "true" : "false",
                (unsigned long long)aclsim_link_busy_ns(d, 0), (unsigned long long)aclsim_link_busy_ns(d, 1));
    }
    fprintf(f, "\n  ],\n  \"device_refs\": [");
    for (int d = 0; d < g_cfg.devices; d++) fprintf(f, "%s%d", d ? ", " : "", atomic_load(&g_dev[d].refs));
    fprintf(f, "],\n  \"streams\": [");
    sim_stream_stats(f);
    fprintf(f, "\n  ]\n}\n");
    if (fclose(f) != 0 || rename(tmp, g_cfg.stats_path) != 0)
        aclsim_log("cannot write ACLSIM_STATS file '%s': %s", g_cfg.stats_path, strerror(errno));
}
