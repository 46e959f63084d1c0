/* Data-parallel training of a small MLP on several simulated devices, driven by
 * ONE host thread that switches devices with aclrtSetDevice (streams belong to
 * their device). Every device holds a replica of the model (same initial
 * weights), computes the gradients of its own shard of a fixed batch with real
 * operators (aclopExecuteV2: MatMul, Add, Sub, Mul, Relu, ReluGrad, ReduceSum),
 * all-reduces them with HcclAllReduce (SUM, then Mul by 1/ndev) and applies the
 * same update (ApplyAdam, or SGD with --opt sgd), so the replicas must stay
 * bit-identical.
 *
 *   model: h = relu(x W1 + b1); y = h W2 + b2; loss = mean((y - t)^2)
 *   data:  x uniform in [-1, 1), t = x A for a fixed random A
 *
 * Options: --devices N (2), --steps S (20), --dim D (32: input and hidden width),
 *          --batch B (16 rows per device), --opt adam|sgd (adam), --lr F
 * Output:  "step=<i> loss=<f>" per step (the all-reduced global loss), then
 *          "replicas_identical=<0|1>" and "checksum=<hex>" (FNV-1a of the final
 *          weights of device 0). ACL/HCCL errors exit 2; usage errors exit 3. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "acl/acl_op.h"
#include "hccl/hccl.h"
#include "common/common.h"

#define MAXDEV 16

#define HCCL_CHECK(call) do {                                                             \
        int hr_ = (int)(call);                                                             \
        if (hr_ != 0) {                                                                    \
            fprintf(stderr, "allreduce_app: HCCL error %d at %s:%d: %s\n", hr_, __FILE__,  \
                    __LINE__, #call);                                                      \
            fflush(stdout);                                                                \
            exit(2);                                                                       \
        }                                                                                  \
    } while (0)

/* A float tensor: device address and shape (row-major, contiguous). */
typedef struct { void *p; int nd; int64_t d[4]; } T;

static T t1(void *p, int64_t a) { T t = { p, 1, { a } }; return t; }
static T t2(void *p, int64_t a, int64_t b) { T t = { p, 2, { a, b } }; return t; }

static size_t t_bytes(const T *t) {
    size_t n = 1;
    for (int i = 0; i < t->nd; i++) n *= (size_t)t->d[i];
    return n * sizeof(float);
}

static void run_op(const char *type, int nin, const T *in, int nout, const T *out, aclopAttr *attr,
                   aclrtStream s) {
    aclTensorDesc *id[10], *od[3];
    aclDataBuffer *ib[10], *ob[3];
    for (int i = 0; i < nin; i++) {
        id[i] = aclCreateTensorDesc(ACL_FLOAT, in[i].nd, in[i].d, ACL_FORMAT_ND);
        ib[i] = aclCreateDataBuffer(in[i].p, t_bytes(&in[i]));
        if (!id[i] || !ib[i]) app_die(2, "cannot describe input %d of %s", i, type);
    }
    for (int i = 0; i < nout; i++) {
        od[i] = aclCreateTensorDesc(ACL_FLOAT, out[i].nd, out[i].d, ACL_FORMAT_ND);
        ob[i] = aclCreateDataBuffer(out[i].p, t_bytes(&out[i]));
        if (!od[i] || !ob[i]) app_die(2, "cannot describe output %d of %s", i, type);
    }
    ACL_CHECK(aclopExecuteV2(type, nin, id, ib, nout, od, ob, attr, s));
    for (int i = 0; i < nin; i++) {
        aclDestroyTensorDesc(id[i]);
        ACL_CHECK(aclDestroyDataBuffer(ib[i]));
    }
    for (int i = 0; i < nout; i++) {
        aclDestroyTensorDesc(od[i]);
        ACL_CHECK(aclDestroyDataBuffer(ob[i]));
    }
}

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    ACL_CHECK(aclrtMalloc(&p, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    return p;
}

static void h2d(void *dst, const void *src, size_t bytes) {
    ACL_CHECK(aclrtMemcpy(dst, bytes, src, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
}

/* Per-device state. Parameters and gradients are flat buffers laid out as
 * [W1 (D*H) | b1 (H) | W2 (H*O) | b2 (O)], so one all-reduce and one ApplyAdam
 * cover the whole model. */
typedef struct {
    aclrtStream s;
    float *params, *grad, *m, *v, *tmp;
    float *x, *t;                    /* this device's shard */
    float *z, *h, *y, *diff, *dy, *dh, *dz, *sq, *loss;
    float *k;                        /* constants: see K_* */
    float *pows;                     /* beta1^i, beta2^i for i = 1..steps */
} replica;

enum { K_LR, K_BETA1, K_BETA2, K_EPS, K_INV_NDEV, K_DY_SCALE, K_N };

int main(int argc, char **argv) {
    int ndev = 2, steps = 20, dim = 32, batch = 16, adam = 1;
    float lr = -1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = app_opt(argc, argv, &i, "--devices"))) ndev = (int)app_parse_int(v, "--devices");
        else if ((v = app_opt(argc, argv, &i, "--steps"))) steps = (int)app_parse_int(v, "--steps");
        else if ((v = app_opt(argc, argv, &i, "--dim"))) dim = (int)app_parse_int(v, "--dim");
        else if ((v = app_opt(argc, argv, &i, "--batch"))) batch = (int)app_parse_int(v, "--batch");
        else if ((v = app_opt(argc, argv, &i, "--lr"))) lr = strtof(v, NULL);
        else if ((v = app_opt(argc, argv, &i, "--opt"))) {
            if (!strcmp(v, "adam")) adam = 1;
            else if (!strcmp(v, "sgd")) adam = 0;
            else app_die(3, "--opt must be adam or sgd");
        } else app_die(3, "usage: allreduce_app [--devices N] [--steps S] [--dim D] [--batch B] [--opt adam|sgd] [--lr F]");
    }
    if (ndev < 1 || ndev > MAXDEV) app_die(3, "--devices must be 1..%d", MAXDEV);
    if (dim < 4 || dim > 4096 || batch < 1 || batch > 65536) app_die(3, "--dim must be 4..4096, --batch 1..65536");
    if (lr <= 0) lr = adam ? 0.01f : 0.05f;

    const int64_t D = dim, H = dim, O = dim / 4 > 0 ? dim / 4 : 1, B = batch, BT = (int64_t)batch * ndev;
    const int64_t oW1 = 0, ob1 = D * H, oW2 = ob1 + H, ob2 = oW2 + H * O, P = ob2 + O;

    /* Host data: identical initial weights for every replica; one fixed batch. */
    uint64_t rng = 0x5eedULL;
    float *w0 = calloc((size_t)P, sizeof(float));
    float *X = malloc((size_t)(BT * D) * sizeof(float));
    float *A = malloc((size_t)(D * O) * sizeof(float));
    float *Tt = calloc((size_t)(BT * O), sizeof(float));
    if (!w0 || !X || !A || !Tt) app_die(3, "out of host memory");
    for (int64_t i = 0; i < D * H; i++) w0[oW1 + i] = app_rand_f32(&rng, 1.0f / sqrtf((float)D));
    for (int64_t i = 0; i < H * O; i++) w0[oW2 + i] = app_rand_f32(&rng, 1.0f / sqrtf((float)H));
    for (int64_t i = 0; i < BT * D; i++) X[i] = app_rand_f32(&rng, 1.0f);
    for (int64_t i = 0; i < D * O; i++) A[i] = app_rand_f32(&rng, 1.0f / sqrtf((float)D));
    for (int64_t r = 0; r < BT; r++)
        for (int64_t o = 0; o < O; o++) {
            double acc = 0;
            for (int64_t k = 0; k < D; k++) acc += (double)X[r * D + k] * A[k * O + o];
            Tt[r * O + o] = (float)acc;
        }
    float kh[K_N];
    kh[K_LR] = lr;
    kh[K_BETA1] = 0.9f;
    kh[K_BETA2] = 0.999f;
    kh[K_EPS] = 1e-8f;
    kh[K_INV_NDEV] = 1.0f / (float)ndev;
    kh[K_DY_SCALE] = 2.0f / (float)(B * O);   /* d(mean over this shard)/dy */
    float *pows = malloc((size_t)(2 * (steps + 1)) * sizeof(float));
    if (!pows) app_die(3, "out of host memory");
    for (int i = 0; i <= steps; i++) {
        pows[2 * i] = powf(kh[K_BETA1], (float)(i + 1));
        pows[2 * i + 1] = powf(kh[K_BETA2], (float)(i + 1));
    }

    ACL_CHECK(aclInit(NULL));
    replica rep[MAXDEV];
    int32_t devs[MAXDEV];
    for (int d = 0; d < ndev; d++) {
        devs[d] = d;
        replica *r = &rep[d];
        ACL_CHECK(aclrtSetDevice(d));
        ACL_CHECK(aclrtCreateStream(&r->s));
        r->params = dev_alloc((size_t)P * 4);
        r->grad = dev_alloc((size_t)P * 4);
        r->m = dev_alloc((size_t)P * 4);
        r->v = dev_alloc((size_t)P * 4);
        r->tmp = dev_alloc((size_t)P * 4);
        r->x = dev_alloc((size_t)(B * D) * 4);
        r->t = dev_alloc((size_t)(B * O) * 4);
        r->z = dev_alloc((size_t)(B * H) * 4);
        r->h = dev_alloc((size_t)(B * H) * 4);
        r->y = dev_alloc((size_t)(B * O) * 4);
        r->diff = dev_alloc((size_t)(B * O) * 4);
        r->dy = dev_alloc((size_t)(B * O) * 4);
        r->dh = dev_alloc((size_t)(B * H) * 4);
        r->dz = dev_alloc((size_t)(B * H) * 4);
        r->sq = dev_alloc((size_t)(B * O) * 4);
        r->loss = dev_alloc(4);
        r->k = dev_alloc(sizeof kh);
        r->pows = dev_alloc((size_t)(2 * (steps + 1)) * 4);
        h2d(r->params, w0, (size_t)P * 4);
        h2d(r->x, X + (size_t)d * B * D, (size_t)(B * D) * 4);
        h2d(r->t, Tt + (size_t)d * B * O, (size_t)(B * O) * 4);
        h2d(r->k, kh, sizeof kh);
        h2d(r->pows, pows, (size_t)(2 * (steps + 1)) * 4);
        /* Adam moments start at zero (fresh device memory is zero, but say so). */
        ACL_CHECK(aclrtMemset(r->m, (size_t)P * 4, 0, (size_t)P * 4));
        ACL_CHECK(aclrtMemset(r->v, (size_t)P * 4, 0, (size_t)P * 4));
    }
    HcclComm comms[MAXDEV];
    HCCL_CHECK(HcclCommInitAll((uint32_t)ndev, devs, comms));

    aclopAttr *tr1 = aclopCreateAttr(), *tr2 = aclopCreateAttr(), *ax0 = aclopCreateAttr(), *ax1 = aclopCreateAttr();
    if (!tr1 || !tr2 || !ax0 || !ax1) app_die(2, "aclopCreateAttr failed");
    ACL_CHECK(aclopSetAttrBool(tr1, "transpose_x1", 1));
    ACL_CHECK(aclopSetAttrBool(tr2, "transpose_x2", 1));
    ACL_CHECK(aclopSetAttrInt(ax0, "axis", 0));
    ACL_CHECK(aclopSetAttrInt(ax1, "axis", 1));

    for (int step = 0; step < steps; step++) {
        /* Everything below only queues work: the collectives of device 0 wait
         * on its stream for device 1's arrival while the host moves on. */
        for (int d = 0; d < ndev; d++) {
            replica *r = &rep[d];
            aclrtStream s = r->s;
            float *W1 = r->params + oW1, *b1 = r->params + ob1, *W2 = r->params + oW2, *b2 = r->params + ob2;
            float *gW1 = r->grad + oW1, *gb1 = r->grad + ob1, *gW2 = r->grad + oW2, *gb2 = r->grad + ob2;
            ACL_CHECK(aclrtSetDevice(d));
            /* forward */
            { T in[2] = { t2(r->x, B, D), t2(W1, D, H) }; T out[1] = { t2(r->z, B, H) };
              run_op("MatMul", 2, in, 1, out, NULL, s); }
            { T in[2] = { t2(r->z, B, H), t1(b1, H) }; T out[1] = { t2(r->z, B, H) };
              run_op("Add", 2, in, 1, out, NULL, s); }
            { T in[1] = { t2(r->z, B, H) }; T out[1] = { t2(r->h, B, H) };
              run_op("Relu", 1, in, 1, out, NULL, s); }
            { T in[2] = { t2(r->h, B, H), t2(W2, H, O) }; T out[1] = { t2(r->y, B, O) };
              run_op("MatMul", 2, in, 1, out, NULL, s); }
            { T in[2] = { t2(r->y, B, O), t1(b2, O) }; T out[1] = { t2(r->y, B, O) };
              run_op("Add", 2, in, 1, out, NULL, s); }
            /* loss (this shard's sum of squares) */
            { T in[2] = { t2(r->y, B, O), t2(r->t, B, O) }; T out[1] = { t2(r->diff, B, O) };
              run_op("Sub", 2, in, 1, out, NULL, s); }
            { T in[2] = { t2(r->diff, B, O), t2(r->diff, B, O) }; T out[1] = { t2(r->sq, B, O) };
              run_op("Mul", 2, in, 1, out, NULL, s); }
            { T in[1] = { t2(r->sq, 1, B * O) }; T out[1] = { t1(r->loss, 1) };
              run_op("ReduceSum", 1, in, 1, out, ax1, s); }
            /* backward */
            { T in[2] = { t2(r->diff, B, O), t1(r->k + K_DY_SCALE, 1) }; T out[1] = { t2(r->dy, B, O) };
              run_op("Mul", 2, in, 1, out, NULL, s); }
            { T in[2] = { t2(r->h, B, H), t2(r->dy, B, O) }; T out[1] = { t2(gW2, H, O) };
              run_op("MatMul", 2, in, 1, out, tr1, s); }
            { T in[1] = { t2(r->dy, B, O) }; T out[1] = { t1(gb2, O) };
              run_op("ReduceSum", 1, in, 1, out, ax0, s); }
            { T in[2] = { t2(r->dy, B, O), t2(W2, H, O) }; T out[1] = { t2(r->dh, B, H) };
              run_op("MatMul", 2, in, 1, out, tr2, s); }
            { T in[2] = { t2(r->dh, B, H), t2(r->z, B, H) }; T out[1] = { t2(r->dz, B, H) };
              run_op("ReluGrad", 2, in, 1, out, NULL, s); }
            { T in[2] = { t2(r->x, B, D), t2(r->dz, B, H) }; T out[1] = { t2(gW1, D, H) };
              run_op("MatMul", 2, in, 1, out, tr1, s); }
            { T in[1] = { t2(r->dz, B, H) }; T out[1] = { t1(gb1, H) };
              run_op("ReduceSum", 1, in, 1, out, ax0, s); }
            /* gradient and loss all-reduce (in place), then the mean over replicas */
            HCCL_CHECK(HcclAllReduce(r->grad, r->grad, (uint64_t)P, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comms[d], s));
            HCCL_CHECK(HcclAllReduce(r->loss, r->loss, 1, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comms[d], s));
            { T in[2] = { t1(r->grad, P), t1(r->k + K_INV_NDEV, 1) }; T out[1] = { t1(r->grad, P) };
              run_op("Mul", 2, in, 1, out, NULL, s); }
            /* update */
            if (adam) {
                T in[10] = { t1(r->params, P), t1(r->m, P), t1(r->v, P), t1(r->pows + 2 * step, 1),
                             t1(r->pows + 2 * step + 1, 1), t1(r->k + K_LR, 1), t1(r->k + K_BETA1, 1),
                             t1(r->k + K_BETA2, 1), t1(r->k + K_EPS, 1), t1(r->grad, P) };
                T out[3] = { t1(r->params, P), t1(r->m, P), t1(r->v, P) };
                run_op("ApplyAdam", 10, in, 3, out, NULL, s);
            } else {
                { T in[2] = { t1(r->grad, P), t1(r->k + K_LR, 1) }; T out[1] = { t1(r->tmp, P) };
                  run_op("Mul", 2, in, 1, out, NULL, s); }
                { T in[2] = { t1(r->params, P), t1(r->tmp, P) }; T out[1] = { t1(r->params, P) };
                  run_op("Sub", 2, in, 1, out, NULL, s); }
            }
        }
        /* Read the global loss from every replica (they must agree). */
        float lossv[MAXDEV] = { 0 };
        for (int d = 0; d < ndev; d++) {
            ACL_CHECK(aclrtSetDevice(d));
            ACL_CHECK(aclrtSynchronizeStream(rep[d].s));
            ACL_CHECK(aclrtMemcpy(&lossv[d], 4, rep[d].loss, 4, ACL_MEMCPY_DEVICE_TO_HOST));
        }
        for (int d = 1; d < ndev; d++)
            if (memcmp(&lossv[d], &lossv[0], 4) != 0)
                app_die(1, "step %d: device %d sees loss %g, device 0 sees %g", step, d, lossv[d], lossv[0]);
        printf("step=%d loss=%.6f\n", step, lossv[0] / (float)(BT * O));
    }

    /* Compare the replicas byte for byte. */
    float *final0 = calloc((size_t)P, 4), *other = calloc((size_t)P, 4);
    if (!final0 || !other) app_die(3, "out of host memory");
    int identical = 1;
    for (int d = 0; d < ndev; d++) {
        ACL_CHECK(aclrtSetDevice(d));
        ACL_CHECK(aclrtSynchronizeStream(rep[d].s));
        ACL_CHECK(aclrtMemcpy(d == 0 ? final0 : other, (size_t)P * 4, rep[d].params, (size_t)P * 4,
                              ACL_MEMCPY_DEVICE_TO_HOST));
        if (d > 0 && memcmp(final0, other, (size_t)P * 4) != 0) identical = 0;
    }
    printf("devices=%d params=%lld\n", ndev, (long long)P);
    printf("replicas_identical=%d\n", identical);
    printf("checksum=%016llx\n", (unsigned long long)app_fnv(APP_FNV_INIT, final0, (size_t)P * 4));

    aclopDestroyAttr(tr1);
    aclopDestroyAttr(tr2);
    aclopDestroyAttr(ax0);
    aclopDestroyAttr(ax1);
    for (int d = 0; d < ndev; d++) {
        replica *r = &rep[d];
        ACL_CHECK(aclrtSetDevice(d));
        void *bufs[] = { r->params, r->grad, r->m, r->v, r->tmp, r->x, r->t, r->z, r->h, r->y, r->diff, r->dy,
                         r->dh, r->dz, r->sq, r->loss, r->k, r->pows };
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ACL_CHECK(aclrtFree(bufs[i]));
        ACL_CHECK(aclrtDestroyStream(r->s));
        HCCL_CHECK(HcclCommDestroy(comms[d]));
    }
    for (int d = 0; d < ndev; d++) ACL_CHECK(aclrtResetDevice(d));
    ACL_CHECK(aclFinalize());
    free(w0); free(X); free(A); free(Tt); free(pows); free(final0); free(other);
    return 0;
}
