/* Host AdamW throughput (issue 11 bullet 5, docs/host-optimizer.md).
 *
 *   cc -O3 -march=native -ffp-contract=off -pthread bench/adamw_host.c -lm -o adamw_host
 *   ./adamw_host [params, default 32M] [threads, default 1] [reps, default 5]
 *
 * Two kernels over N f32 parameters (w, g, m, v: 16 B each, g read, w m v
 * read and written: 28 B of memory traffic per parameter):
 *   f32  the update in float, PyTorch's AdamW order;
 *   sim  the simulator's ApplyAdamWV2 (shim/src/rt/kernels_nn.c adamw_run):
 *        loaded as double, the same operations in the same order, stored
 *        as float once at the end: what a host path must compute to equal
 *        the simulated device bit for bit.
 * and a STREAM-style triad (w = g + 3 m: 12 B per element) for the
 * machine's memory bandwidth. Prints params/s and the memory bandwidth that
 * implies, per kernel, and
 * whether `sim` equals a second, single-threaded run of itself (the split
 * across threads must not change a bit). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    float *w, *g, *m, *v;
    size_t lo, hi;
    int kind; /* 0 f32, 1 sim, 2 triad (memory bandwidth: w = g + 3 m) */
    double lr, b1, b2, wd, eps, bc1, bc2s;
} job;

static void *run(void *p)
{
    job *j = p;
    if (j->kind == 2) {
        for (size_t i = j->lo; i < j->hi; i++) j->w[i] = j->g[i] + 3.0f * j->m[i];
    } else if (j->kind == 0) {
        float lr = (float)j->lr, b1 = (float)j->b1, b2 = (float)j->b2, wd = (float)j->wd;
        float eps = (float)j->eps, bc1 = (float)j->bc1, bc2s = (float)j->bc2s;
        for (size_t i = j->lo; i < j->hi; i++) {
            float g = j->g[i];
            float w = j->w[i] * (1.0f - lr * wd);
            float m = j->m[i] + (g - j->m[i]) * (1.0f - b1);
            float v = b2 * j->v[i] + (1.0f - b2) * g * g;
            j->m[i] = m;
            j->v[i] = v;
            j->w[i] = w - lr / bc1 * m / (sqrtf(v) / bc2s + eps);
        }
    } else {
        for (size_t i = j->lo; i < j->hi; i++) {
            double g = j->g[i], w = j->w[i], m = j->m[i], v = j->v[i];
            w *= 1.0 - j->lr * j->wd;
            m += (g - m) * (1.0 - j->b1);
            v = j->b2 * v + (1.0 - j->b2) * g * g;
            w -= j->lr / j->bc1 * m / (sqrt(v) / j->bc2s + j->eps);
            j->w[i] = (float)w;
            j->m[i] = (float)m;
            j->v[i] = (float)v;
        }
    }
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void fill(float *a, size_t n, uint64_t seed, float scale, int positive)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        float u = (float)((x >> 11) * (1.0 / 9007199254740992.0));
        a[i] = positive ? u * scale : (u - 0.5f) * scale;
    }
}

static double step(float **b, size_t n, int threads, int kind, double t)
{
    job jobs[64];
    pthread_t th[64];
    for (int k = 0; k < threads; k++) {
        jobs[k] = (job){ b[0], b[1], b[2], b[3], n * k / threads, n * (k + 1) / threads, kind,
                         1e-3, 0.9, 0.999, 0.01, 1e-8, 1.0 - pow(0.9, t), sqrt(1.0 - pow(0.999, t)) };
    }
    double t0 = now();
    for (int k = 1; k < threads; k++) pthread_create(&th[k], NULL, run, &jobs[k]);
    run(&jobs[0]);
    for (int k = 1; k < threads; k++) pthread_join(th[k], NULL);
    return now() - t0;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 0) : (32u << 20);
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (threads < 1 || threads > 64 || reps < 1) return 2;
    float *b[4], *c[4];
    for (int k = 0; k < 4; k++) {
        b[k] = malloc(n * sizeof(float));
        c[k] = malloc(n * sizeof(float));
        if (!b[k] || !c[k]) { fprintf(stderr, "out of memory\n"); return 1; }
    }
    const char *name[3] = { "f32", "sim", "triad" };
    for (int kind = 0; kind < 3; kind++) {
        fill(b[0], n, 1, 0.1f, 0); fill(b[1], n, 2, 0.01f, 0);
        fill(b[2], n, 3, 0.001f, 0); fill(b[3], n, 4, 1e-6f, 1);
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double s = step(b, n, threads, kind, r + 1);
            if (s < best) best = s;
        }
        double ps = n / best;
        printf("kernel=%s params=%zu threads=%d best_s=%.4f params_per_s=%.3e mem_GBps=%.2f\n",
               name[kind], n, threads, best, ps, ps * (kind == 2 ? 12 : 28) / 1e9);
    }
    /* the sim kernel split across threads equals one thread, bit for bit */
    for (int k = 0; k < 4; k++) {
        fill(b[k], n, k + 1, 0.01f, k == 3);
        memcpy(c[k], b[k], n * sizeof(float));
    }
    step(b, n, threads, 1, 1);
    step(c, n, 1, 1, 1);
    int same = 1;
    for (int k = 0; k < 4 && same; k++) same = memcmp(b[k], c[k], n * sizeof(float)) == 0;
    printf("sim_bitwise_equal_across_threads=%d\n", same);
    return 0;
}
