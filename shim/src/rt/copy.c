/* Copies and memsets: synchronous ones run on the calling thread (they do not
 * wait for queued stream work, as on the device), asynchronous ones are queued
 * on the stream. Device sides are range-checked against the mappings before
 * any byte moves. */
#include <stdlib.h>
#include <string.h>
#include "rt/rt.h"

typedef struct seg { void *dst; const void *src; size_t n; } seg;
typedef struct copy_payload { size_t nseg; seg s[]; } copy_payload;

static aclError copy_exec(sim_work *w) {
    copy_payload *p = w->payload;
    for (size_t i = 0; i < p->nseg; i++) memmove(p->s[i].dst, p->s[i].src, p->s[i].n);
    return 0;
}

static void free_payload(sim_work *w) { free(w->payload); }

static const char *kind_name(int k) {
    static const char *n[] = {"H2H", "H2D", "D2H", "D2D"};
    return k >= 0 && k < 4 ? n[k] : "?";
}

/* Validates one copy; returns 0 and the resolved kind, or the error code. */
static aclError copy_check(void *dst, size_t destMax, const void *src, size_t count, int kind, int *rk,
                           const char *api) {
    if (!dst || !src) return ACL_ERROR_INVALID_PARAM;
    if (count > destMax) {
        aclsim_log("%s: count %zu exceeds destMax %zu", api, count, destMax);
        return ACL_ERROR_INVALID_PARAM;
    }
    int k = sim_resolve_copy_kind(kind, dst, src);
    if (k == -2) return ACL_ERROR_INVALID_PARAM;
    if (k < 0) {
        aclsim_log("%s: copy kind %d does not match the pointers (dst %p is %s, src %p is %s)", api, kind, dst,
                   aclsim_is_device_addr(dst) ? "device" : "host", src,
                   aclsim_is_device_addr(src) ? "device" : "host");
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    *rk = k;
    return 0;
}

/* device of a copy's device side (-1 for host to host); managed memory is
 * reached by the current device */
static int copy_device(int k, const void *dst, const void *src) {
    if (k == ACL_MEMCPY_HOST_TO_HOST) return -1;
    const void *side = k == ACL_MEMCPY_DEVICE_TO_HOST ? src : dst;
    int dev = sim_device_of_addr(side);
    if (dev < 0 && k == ACL_MEMCPY_DEVICE_TO_DEVICE) dev = sim_device_of_addr(src);
    if (dev < 0 && (sim_managed_addr(dst) || sim_managed_addr(src))) dev = t_dev;
    return dev;
}

static int host_pinned(int k, const void *dst, const void *src, size_t n) {
    if (k == ACL_MEMCPY_HOST_TO_DEVICE) return aclsim_is_pinned_host(src, n);
    if (k == ACL_MEMCPY_DEVICE_TO_HOST) return aclsim_is_pinned_host(dst, n);
    return 1;
}

/* device ranges touched by a copy of `n` bytes (dst span, src span) */
static int copy_ranges(int k, void *dst, size_t dspan, const void *src, size_t sspan, sim_range *r) {
    int n = 0;
    if (k == ACL_MEMCPY_HOST_TO_DEVICE || k == ACL_MEMCPY_DEVICE_TO_DEVICE)
        r[n++] = (sim_range){(uintptr_t)dst, dspan, 1};
    if (k == ACL_MEMCPY_DEVICE_TO_HOST || k == ACL_MEMCPY_DEVICE_TO_DEVICE)
        r[n++] = (sim_range){(uintptr_t)src, sspan, 0};
    return n;
}

static aclError device_gate(int dev) {
    if (dev < 0) return 0;
    aclError rc = sim_device_check(dev);
    if (rc) return rc;
    return sim_work_tick(dev);
}

/* Runs a copy now on the calling thread; a device side in host memory (host
 * physical handles, managed pages) is costed at link bandwidth. */
static aclError sync_copy(int k, int dev, const seg *s, size_t nseg, const sim_range *r, int nr, uint64_t bytes,
                          uint64_t cost, const char *what) {
    aclError rc = 0;
    sim_link link = {0};
    pthread_rwlock_rdlock(&g_mm);
    rc = aclsim_check_ranges(r, nr, what);
    if (!rc) sim_link_traffic_locked(dev >= 0 ? dev : t_dev, r, nr, &link);
    if (!rc && !(g_cfg.phantom && k != ACL_MEMCPY_HOST_TO_HOST))
        for (size_t i = 0; i < nseg; i++) memmove(s[i].dst, s[i].src, s[i].n);
    pthread_rwlock_unlock(&g_mm);
    if (rc) return rc;
    sim_host_gate(dev);
    uint64_t start = atomic_load(&g_host_ns);
    sim_host_advance(sim_work_cost(dev, SIM_WORK_COPY, k, start, cost, 0, bytes, &link));
    sim_count_link(SIM_WORK_COPY, &link);
    sim_count_copy(k, bytes);
    return 0;
}

static aclError copy1(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                      aclrtStream stream, int async, const char *api) {
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    int k;
    if ((rc = copy_check(dst, destMax, src, count, kind, &k, api))) return rc;
    if (count == 0) return ACL_SUCCESS;
    if (aclsim_fault_hit(SIM_FAULT_COPY)) return ACL_ERROR_RT_COPY_DATA;
    int dev = copy_device(k, dst, src);
    uint64_t cost = aclsim_copy_cost_ns(k, count, host_pinned(k, dst, src, count));
    if (!async) {
        if ((rc = device_gate(dev))) return rc;
        sim_range r[2];
        char what[96];
        snprintf(what, sizeof what, "%s(%s)", api, kind_name(k));
        int nr = copy_ranges(k, dst, count, src, count, r);
        seg s = {dst, src, count};
        return sync_copy(k, dev, &s, 1, r, nr, count, cost, what);
    }
    if (dev >= 0 && (rc = sim_device_check(dev))) return rc;
    sim_work *w = aclsim_work_new(2);
    copy_payload *p = malloc(sizeof *p + sizeof(seg));
    if (!p) abort();
    p->nseg = 1;
    p->s[0] = (seg){dst, src, count};
    snprintf(w->what, sizeof w->what, "%s(%s)", api, kind_name(k));
    w->kind = SIM_WORK_COPY;
    w->copy_kind = k;
    w->nranges = copy_ranges(k, dst, count, src, count, w->ranges);
    w->cost_ns = cost;
    w->bytes = count;
    w->exec = copy_exec;
    w->destroy = free_payload;
    w->payload = p;
    return aclsim_submit(stream, w);
}

ACL_FUNC_VISIBILITY aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
    aclrtMemcpyKind kind) {
    return copy1(dst, destMax, src, count, kind, NULL, 0, "aclrtMemcpy");
}

ACL_FUNC_VISIBILITY aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
    aclrtMemcpyKind kind, aclrtStream stream) {
    return copy1(dst, destMax, src, count, kind, stream, 1, "aclrtMemcpyAsync");
}

/* Pageable host memory makes the copy synchronous (ordered on the stream and
 * complete on return), as the real header documents. */
ACL_FUNC_VISIBILITY aclError aclrtMemcpyAsyncWithCondition(void *dst, size_t destMax, const void *src,
    size_t count, aclrtMemcpyKind kind, aclrtStream stream) {
    aclError rc = copy1(dst, destMax, src, count, kind, stream, 1, "aclrtMemcpyAsyncWithCondition");
    if (rc || count == 0) return rc;
    int k = sim_resolve_copy_kind(kind, dst, src);
    if (!host_pinned(k, dst, src, count)) return sim_stream_sync_handle(stream);
    return ACL_SUCCESS;
}

static aclError copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                       aclrtMemcpyKind kind, aclrtStream stream, int async, const char *api) {
    if (!dst || !src || width == 0 || height == 0 || width > dpitch || width > spitch) return ACL_ERROR_INVALID_PARAM;
    if (height > ((size_t)1 << 32)) return ACL_ERROR_INVALID_PARAM;
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
    int k;
    if ((rc = copy_check(dst, dspan, src, dspan, kind, &k, api))) return rc;
    if (k == ACL_MEMCPY_HOST_TO_HOST) return ACL_ERROR_INVALID_PARAM;
    if (aclsim_fault_hit(SIM_FAULT_COPY)) return ACL_ERROR_RT_COPY_DATA;
    int dev = copy_device(k, dst, src);
    uint64_t bytes = (uint64_t)width * height;
    uint64_t cost = aclsim_copy_cost_ns(k, bytes, host_pinned(k, dst, src, sspan));
    copy_payload *p = malloc(sizeof *p + height * sizeof(seg));
    if (!p) return ACL_ERROR_BAD_ALLOC;
    p->nseg = height;
    for (size_t i = 0; i < height; i++)
        p->s[i] = (seg){(char *)dst + i * dpitch, (const char *)src + i * spitch, width};
    if (!async) {
        if ((rc = device_gate(dev))) { free(p); return rc; }
        sim_range r[2];
        int nr = copy_ranges(k, dst, dspan, src, sspan, r);
        rc = sync_copy(k, dev, p->s, height, r, nr, bytes, cost, api);
        free(p);
        return rc;
    }
    if (dev >= 0 && (rc = sim_device_check(dev))) { free(p); return rc; }
    sim_work *w = aclsim_work_new(2);
    snprintf(w->what, sizeof w->what, "%s(%s)", api, kind_name(k));
    w->kind = SIM_WORK_COPY;
    w->copy_kind = k;
    w->nranges = copy_ranges(k, dst, dspan, src, sspan, w->ranges);
    w->cost_ns = cost;
    w->bytes = bytes;
    w->exec = copy_exec;
    w->destroy = free_payload;
    w->payload = p;
    return aclsim_submit(stream, w);
}

ACL_FUNC_VISIBILITY aclError aclrtMemcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
    size_t height, aclrtMemcpyKind kind) {
    return copy2d(dst, dpitch, src, spitch, width, height, kind, NULL, 0, "aclrtMemcpy2d");
}

ACL_FUNC_VISIBILITY aclError aclrtMemcpy2dAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
    size_t width, size_t height, aclrtMemcpyKind kind, aclrtStream stream) {
    return copy2d(dst, dpitch, src, spitch, width, height, kind, stream, 1, "aclrtMemcpy2dAsync");
}

/* Batch copies: attrs[k] gives the locations of copies attrsIndexes[k] ..
 * attrsIndexes[k+1]-1 (the last attr runs to the end). All copies in a batch
 * must be of one direction class per attr; *failIndex names the first bad copy. */
static int loc_kind(const aclrtMemcpyBatchAttr *a) {
    int dd = a->dstLoc.type == ACL_MEM_LOCATION_TYPE_DEVICE, sd = a->srcLoc.type == ACL_MEM_LOCATION_TYPE_DEVICE;
    if ((a->dstLoc.type != ACL_MEM_LOCATION_TYPE_HOST && !dd) || (a->srcLoc.type != ACL_MEM_LOCATION_TYPE_HOST && !sd))
        return -2;
    return dd ? (sd ? ACL_MEMCPY_DEVICE_TO_DEVICE : ACL_MEMCPY_HOST_TO_DEVICE)
              : (sd ? ACL_MEMCPY_DEVICE_TO_HOST : ACL_MEMCPY_HOST_TO_HOST);
}

static aclError batch(void **dsts, size_t *destMaxs, void **srcs, size_t *sizes, size_t numBatches,
                      aclrtMemcpyBatchAttr *attrs, size_t *attrsIndexes, size_t numAttrs, size_t *failIndex,
                      aclrtStream stream, int async, const char *api) {
    if (!dsts || !destMaxs || !srcs || !sizes || !attrs || !attrsIndexes || !failIndex || numBatches == 0 ||
        numAttrs == 0 || numAttrs > numBatches)
        return ACL_ERROR_INVALID_PARAM;
    *failIndex = SIZE_MAX;
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    if (attrsIndexes[0] != 0) return ACL_ERROR_INVALID_PARAM;
    for (size_t a = 1; a < numAttrs; a++)
        if (attrsIndexes[a] <= attrsIndexes[a - 1] || attrsIndexes[a] >= numBatches) return ACL_ERROR_INVALID_PARAM;
    copy_payload *p = malloc(sizeof *p + numBatches * sizeof(seg));
    int *kinds = malloc(numBatches * sizeof(int));
    if (!p || !kinds) abort();
    p->nseg = numBatches;
    uint64_t cost = 0, bytes = 0;
    size_t a = 0;
    int dev = -1;
    for (size_t i = 0; i < numBatches; i++) {
        while (a + 1 < numAttrs && attrsIndexes[a + 1] <= i) a++;
        int lk = loc_kind(&attrs[a]), k;
        if (lk == -2) rc = ACL_ERROR_INVALID_PARAM;
        else rc = copy_check(dsts[i], destMaxs[i], srcs[i], sizes[i], lk, &k, api);
        if (rc) {
            *failIndex = i;
            free(p); free(kinds);
            return rc;
        }
        kinds[i] = k;
        p->s[i] = (seg){dsts[i], srcs[i], sizes[i]};
        cost += aclsim_copy_cost_ns(k, sizes[i], host_pinned(k, dsts[i], srcs[i], sizes[i]));
        bytes += sizes[i];
        if (dev < 0) dev = copy_device(k, dsts[i], srcs[i]);
    }
    if (aclsim_fault_hit(SIM_FAULT_COPY)) { free(p); free(kinds); return ACL_ERROR_RT_COPY_DATA; }
    sim_work *w = aclsim_work_new((int)(2 * numBatches));
    int nr = 0;
    for (size_t i = 0; i < numBatches; i++)
        nr += copy_ranges(kinds[i], dsts[i], sizes[i], srcs[i], sizes[i], w->ranges + nr);
    w->nranges = nr;
    int kind0 = kinds[0];
    free(kinds);
    if (!async) {
        if ((rc = device_gate(dev))) { free(p); free(w); return rc; }
        rc = sync_copy(kind0, dev, p->s, numBatches, w->ranges, nr, bytes, cost, api);
        free(p);
        free(w);
        return rc;
    }
    if (dev >= 0 && (rc = sim_device_check(dev))) { free(p); free(w); return rc; }
    snprintf(w->what, sizeof w->what, "%s", api);
    w->kind = SIM_WORK_COPY;
    w->copy_kind = kind0;
    w->cost_ns = cost;
    w->bytes = bytes;
    w->exec = copy_exec;
    w->destroy = free_payload;
    w->payload = p;
    return aclsim_submit(stream, w);
}

ACL_FUNC_VISIBILITY aclError aclrtMemcpyBatch(void **dsts, size_t *destMaxs, void **srcs, size_t *sizes,
    size_t numBatches, aclrtMemcpyBatchAttr *attrs, size_t *attrsIndexes, size_t numAttrs, size_t *failIndex) {
    return batch(dsts, destMaxs, srcs, sizes, numBatches, attrs, attrsIndexes, numAttrs, failIndex, NULL, 0,
                 "aclrtMemcpyBatch");
}

ACL_FUNC_VISIBILITY aclError aclrtMemcpyBatchAsync(void **dsts, size_t *destMaxs, void **srcs, size_t *sizes,
    size_t numBatches, aclrtMemcpyBatchAttr *attrs, size_t *attrsIndexes, size_t numAttrs, size_t *failIndex,
    aclrtStream stream) {
    return batch(dsts, destMaxs, srcs, sizes, numBatches, attrs, attrsIndexes, numAttrs, failIndex, stream, 1,
                 "aclrtMemcpyBatchAsync");
}

/* ---- memset ---- */
typedef struct set_payload { void *dst; int value; size_t n; } set_payload;

static aclError set_exec(sim_work *w) {
    set_payload *p = w->payload;
    memset(p->dst, p->value, p->n);
    return 0;
}

static aclError memset_any(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream,
                           int async, const char *api) {
    if (!devPtr || count > maxCount) return ACL_ERROR_INVALID_PARAM;
    aclError rc = aclsim_check_ready();
    if (rc) return rc;
    int dev = sim_device_of_addr(devPtr);
    if (dev < 0 && sim_managed_addr(devPtr)) dev = t_dev;   /* managed memory: the current device sets it */
    if (dev < 0) {
        aclsim_log("%s(%p): not a device address", api, devPtr);
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    if (count == 0) return ACL_SUCCESS;
    if (aclsim_fault_hit(SIM_FAULT_MEMSET)) return ACL_ERROR_RT_COPY_DATA;
    uint64_t cost = aclsim_op_cost_ns(0, count);
    if (!async) {
        if ((rc = device_gate(dev))) return rc;
        sim_range r = {(uintptr_t)devPtr, count, 1};
        sim_link link = {0};
        pthread_rwlock_rdlock(&g_mm);
        rc = aclsim_check_ranges(&r, 1, api);
        if (!rc) sim_link_traffic_locked(dev, &r, 1, &link);
        if (!rc && !g_cfg.phantom) memset(devPtr, value, count);
        pthread_rwlock_unlock(&g_mm);
        if (rc) return rc;
        sim_host_gate(dev);
        uint64_t start = atomic_load(&g_host_ns);
        sim_host_advance(sim_work_cost(dev, SIM_WORK_MEMSET, 0, start, cost, 0, count, &link));
        sim_count_link(SIM_WORK_MEMSET, &link);
        atomic_fetch_add(&g_stat[ST_MEMSETS], 1);
        return ACL_SUCCESS;
    }
    if ((rc = sim_device_check(dev))) return rc;
    sim_work *w = aclsim_work_new(1);
    set_payload *p = malloc(sizeof *p);
    if (!p) abort();
    *p = (set_payload){devPtr, value, count};
    snprintf(w->what, sizeof w->what, "%s", api);
    w->kind = SIM_WORK_MEMSET;
    w->ranges[0] = (sim_range){(uintptr_t)devPtr, count, 1};
    w->cost_ns = cost;
    w->bytes = count;
    w->exec = set_exec;
    w->destroy = free_payload;
    w->payload = p;
    return aclsim_submit(stream, w);
}

ACL_FUNC_VISIBILITY aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count) {
    return memset_any(devPtr, maxCount, value, count, NULL, 0, "aclrtMemset");
}

ACL_FUNC_VISIBILITY aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count,
    aclrtStream stream) {
    return memset_any(devPtr, maxCount, value, count, stream, 1, "aclrtMemsetAsync");
}
