/* adamw_exact: is a host AdamW update equal, bit for bit, to the simulated
 * device's ApplyAdamWV2 (docs/host-optimizer.md, "Exactness")?
 *
 * Runs aclnnApplyAdamWV2 on N f32 parameters (var, m, v, grad; step tensor =
 * count - 1) for a few steps and, beside it, two host kernels on copies of
 * the same state:
 *   sim  the simulator's formula (shim/src/rt/kernels_nn.c adamw_run): each
 *        element loaded as double, the same operations in the same order,
 *        stored as float once at the end;
 *   f32  the same update computed in float (PyTorch's order).
 * Prints the number of elements of var, m and v that differ from the device
 * for each kernel ("sim_diff=", "f32_diff="), and the largest relative
 * difference of the f32 kernel. Usage: adamw_exact [N] [steps] */
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "common/common.h"

typedef aclnnStatus (*launch_fn)(void *, uint64_t, aclOpExecutor *, aclrtStream);
typedef aclnnStatus (*ws_fn)(aclTensor *, aclTensor *, aclTensor *, aclTensor *, const aclTensor *, const aclTensor *,
    float, float, float, float, float, bool, bool, uint64_t *, aclOpExecutor **);

static aclTensor *tens(int64_t n, aclDataType dt, void *data)
{
    int64_t dims[1] = { n }, st[1] = { 1 };
    return aclCreateTensor(dims, 1, dt, st, 0, ACL_FORMAT_ND, dims, 1, data);
}

static void sim_step(float *w, float *m, float *v, const float *g, size_t n, double lr, double b1, double b2,
    double wd, double eps, double t)
{
    double bc1 = 1.0 - pow(b1, t), bc2s = sqrt(1.0 - pow(b2, t));
    for (size_t i = 0; i < n; i++) {
        double gi = g[i], var = w[i], mm = m[i], vv = v[i];
        var *= 1.0 - lr * wd;
        mm += (gi - mm) * (1.0 - b1);
        vv = b2 * vv + (1.0 - b2) * gi * gi;
        var -= lr / bc1 * mm / (sqrt(vv) / bc2s + eps);
        w[i] = (float)var;
        m[i] = (float)mm;
        v[i] = (float)vv;
    }
}

static void f32_step(float *w, float *m, float *v, const float *g, size_t n, float lr, float b1, float b2,
    float wd, float eps, float t)
{
    float bc1 = 1.0f - powf(b1, t), bc2s = sqrtf(1.0f - powf(b2, t));
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        w[i] *= 1.0f - lr * wd;
        m[i] += (gi - m[i]) * (1.0f - b1);
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        w[i] -= lr / bc1 * m[i] / (sqrtf(v[i]) / bc2s + eps);
    }
}

static size_t diff(const float *a, const float *b, size_t n, double *rel)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            d++;
            double r = fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), 1e-30);
            if (rel && r > *rel) *rel = r;
        }
    }
    return d;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 0) : (1u << 20);
    int steps = argc > 2 ? atoi(argv[2]) : 3;
    if (n == 0 || steps < 1) app_die(2, "usage: adamw_exact [N] [steps]");
    void *opapi = dlopen("libopapi.so", RTLD_LAZY);
    if (!opapi) app_die(2, "dlopen libopapi.so: %s", dlerror());
    ws_fn ws = (ws_fn)dlsym(opapi, "aclnnApplyAdamWV2GetWorkspaceSize");
    launch_fn launch = (launch_fn)dlsym(opapi, "aclnnApplyAdamWV2");
    if (!ws || !launch) app_die(2, "libopapi.so lacks aclnnApplyAdamWV2");
    ACL_CHECK(aclInit(NULL));
    ACL_CHECK(aclrtSetDevice(0));
    aclrtStream stream;
    ACL_CHECK(aclrtCreateStream(&stream));

    size_t bytes = n * sizeof(float);
    float *st[4], *sim[3], *f32[3], *dev[3];
    for (int k = 0; k < 4; k++) st[k] = malloc(bytes);
    for (int k = 0; k < 3; k++) { sim[k] = malloc(bytes); f32[k] = malloc(bytes); dev[k] = malloc(bytes); }
    uint64_t seed = 11;
    for (size_t i = 0; i < n; i++) {
        st[0][i] = app_rand_f32(&seed, 1.0f);
        st[1][i] = app_rand_f32(&seed, 0.1f);
        st[2][i] = 1e-4f + fabsf(app_rand_f32(&seed, 0.01f));
    }
    for (int k = 0; k < 3; k++) { memcpy(sim[k], st[k], bytes); memcpy(f32[k], st[k], bytes); }
    void *d[4];
    for (int k = 0; k < 4; k++) {
        ACL_CHECK(aclrtMalloc(&d[k], bytes, ACL_MEM_MALLOC_HUGE_FIRST));
        if (k < 3) ACL_CHECK(aclrtMemcpy(d[k], bytes, st[k], bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    }
    void *dstep;
    ACL_CHECK(aclrtMalloc(&dstep, 8, ACL_MEM_MALLOC_HUGE_FIRST));
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, wd = 0.01f, eps = 1e-8f;
    for (int s = 0; s < steps; s++) {
        for (size_t i = 0; i < n; i++) st[3][i] = app_rand_f32(&seed, 0.05f);
        ACL_CHECK(aclrtMemcpy(d[3], bytes, st[3], bytes, ACL_MEMCPY_HOST_TO_DEVICE));
        int64_t step = s; /* the (s+1)-th update: the tensor holds count - 1 */
        ACL_CHECK(aclrtMemcpy(dstep, 8, &step, 8, ACL_MEMCPY_HOST_TO_DEVICE));
        uint64_t wsz = 0;
        aclOpExecutor *ex = NULL;
        ACL_CHECK(ws(tens(n, ACL_FLOAT, d[0]), tens(n, ACL_FLOAT, d[1]), tens(n, ACL_FLOAT, d[2]), NULL,
            tens(n, ACL_FLOAT, d[3]), tens(1, ACL_INT64, dstep), lr, b1, b2, wd, eps, false, false, &wsz, &ex));
        ACL_CHECK(launch(NULL, wsz, ex, stream));
        /* the next step's grad and step overwrite these buffers */
        ACL_CHECK(aclrtSynchronizeStream(stream));
        /* the attributes reach the kernel as float, read as double */
        sim_step(sim[0], sim[1], sim[2], st[3], n, lr, b1, b2, wd, eps, s + 1.0);
        f32_step(f32[0], f32[1], f32[2], st[3], n, lr, b1, b2, wd, eps, s + 1.0f);
    }
    ACL_CHECK(aclrtSynchronizeStream(stream));
    for (int k = 0; k < 3; k++) ACL_CHECK(aclrtMemcpy(dev[k], bytes, d[k], bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    const char *name[3] = { "var", "m", "v" };
    size_t sd = 0, fd = 0;
    double rel = 0;
    for (int k = 0; k < 3; k++) {
        size_t a = diff(sim[k], dev[k], n, NULL), b = diff(f32[k], dev[k], n, &rel);
        printf("%s_sim_diff=%zu %s_f32_diff=%zu\n", name[k], a, name[k], b);
        sd += a;
        fd += b;
    }
    printf("elements=%zu steps=%d\nsim_diff=%zu\nf32_diff=%zu\nf32_max_rel=%.3g\n", n, steps, sd, fd, rel);
    return 0;
}
