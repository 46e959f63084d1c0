/* Operator kernels of the simulated runtime (part of libascendcl.so).
 *
 * A kernel works on sim_tensor views (device addresses, element strides) and
 * runs on a stream worker with the mapping lock held, after the core has
 * range-checked every tensor footprint. Known f32 operators compute real
 * results; every other operator runs the deterministic hash kernel.
 *
 * The static inline helpers (dtype sizes, fp16/bf16 conversion) are also used
 * by libnnopbase/libopapi, which must not call public ACL names themselves. */
#ifndef ACLSIM_KERNELS_H_
#define ACLSIM_KERNELS_H_

#include <stdint.h>
#include <string.h>
#include "sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element types ---- */

/* Same table as the real aclDataTypeSize: 0 for STRING/UNDEFINED, 1 for the
 * packed sub-byte types, 8 for anything unknown. */
static inline size_t kern_dtype_size(int dt)
{
    switch (dt) {
    case ACL_STRING: case ACL_DT_UNDEFINED: return 0;
    case ACL_UINT1: case ACL_INT4: return 1;
    case ACL_BOOL: case ACL_INT8: case ACL_UINT8: case ACL_HIFLOAT8:
    case ACL_FLOAT8_E5M2: case ACL_FLOAT8_E4M3FN: case ACL_FLOAT8_E8M0: return 1;
    case ACL_FLOAT16: case ACL_INT16: case ACL_UINT16: case ACL_BF16: return 2;
    case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: case ACL_COMPLEX32: return 4;
    case ACL_COMPLEX128: return 16;
    default: return 8;
    }
}

static inline float kern_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {                       /* inf / nan */
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {                   /* normal */
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {                   /* zero */
        bits = sign;
    } else {                                 /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, overflow to inf, NaN kept quiet. */
static inline uint16_t kern_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)                   /* inf / nan */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u)                   /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {                  /* below the smallest normal half */
        if (ax < 0x33000000u) return (uint16_t)sign;   /* < 2^-25: zero */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;            /* 14 + (113 - e) - 1 */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static inline float kern_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t kern_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* 1 if the f32 kernels can read and write this element type (through f32). */
static inline int kern_float_dtype(int dt)
{
    return dt == ACL_FLOAT || dt == ACL_FLOAT16 || dt == ACL_BF16;
}

/* ---- operator descriptions ---- */

typedef struct sim_op_args {
    const char *op_type;
    int nin, nout, nattrs;
    const sim_tensor *in;
    const sim_tensor *out;
    const sim_attr *attrs;
} sim_op_args;

typedef struct sim_kernel_def {
    const char *name;
    /* Launch-time validation (counts, shapes, dtypes, attrs): 0 or an aclError;
     * sets *flops for the cost model. */
    aclError (*check)(const sim_op_args *a, uint64_t *flops);
    /* Worker-time computation: 0 or an aclError for the stream. */
    aclError (*run)(const sim_op_args *a);
    /* Bit i set: input i is updated in place (its range is a write range). */
    uint32_t writes_inputs;
} sim_kernel_def;

/* Known operator `op_type`, or NULL (the hash kernel applies). */
const sim_kernel_def *kern_find(const char *op_type);
/* 1 if every tensor (vacuously: none) is a 1-D ACL_UINT8 byte range (acl_replay ops): hash kernel. */
int kern_is_byte_range_op(const sim_op_args *a);
/* The deterministic hash kernel. */
aclError kern_hash_run(const sim_op_args *a);

/* Short name of an element type ("float32", "int64", ...; "dtype<N>" if unknown). */
const char *kern_dtype_name(int dt);
/* "inputs float32[2,3], int64[6]; outputs float32[2,3]" into buf. */
void kern_signature(const sim_op_args *a, char *buf, size_t n);
/* The one stderr line of a refused operator: op type, why, every tensor's
 * element type and shape, and the code returned. */
void kern_refuse(const sim_op_args *a, const char *why, aclError code);

/* Attribute lookup (last setting of `name` wins). */
const sim_attr *kern_attr(const sim_op_args *a, const char *name);
int64_t kern_attr_int(const sim_op_args *a, const char *name, int64_t def);
float kern_attr_float(const sim_op_args *a, const char *name, float def);

/* View geometry. */
uint64_t kern_numel(const sim_tensor *t);
/* Bytes the view covers element by element (numel * element size; for
 * size-0 types the rest of the footprint from data). */
uint64_t kern_view_bytes(const sim_tensor *t);
int kern_is_contiguous(const sim_tensor *t);

/* Validates one tensor's geometry against its footprint: dims >= 0, strides
 * >= 0, at most SIM_MAX_DIMS dims, every element of the view inside
 * [base, base + bytes), data non-NULL when the view is non-empty. 0 or
 * ACL_ERROR_INVALID_PARAM (with a message naming `what`). */
aclError kern_check_tensor(const sim_tensor *t, const char *what);

/* ---- helpers shared by kernels.c and kernels_nn.c ---- */

/* Calls fn(ctx, elem_offset, n, stride, dst_index) for each innermost row of
 * the view, in row-major order (dst_index: position of the row's first
 * element in a contiguous row-major copy). */
typedef void (*kern_row_fn)(void *ctx, int64_t off, int64_t n, int64_t stride, uint64_t idx);
void kern_for_each_row(const sim_tensor *t, kern_row_fn fn, void *ctx);
/* x viewed with y's shape (numpy broadcasting: stride 0 on broadcast dims);
 * 0 if x does not broadcast to y. */
int kern_broadcast_view(const sim_tensor *x, const sim_tensor *y, sim_tensor *v);
/* Contiguous f32 copy of a float view (in place when safe; *owned to free). */
const float *kern_in_f32(const sim_op_args *a, const sim_tensor *t, float **owned);
float *kern_out_f32(const sim_tensor *t, float **owned);
void kern_out_f32_done(const sim_tensor *t, float *owned);
/* C[m,n] = A[m,k] * B[k,n], row-major f32. */
void kern_gemm(const float *A, const float *B, float *C, int64_t m, int64_t k, int64_t n);

/* kernels_nn.c: the operators torch_npu's training path needs (typed
 * elementwise ops, casts, reductions, losses, optimizer updates). */
const sim_kernel_def *kern_find_nn(const char *op_type);
/* the i-th kernel name of kernels_nn.c, NULL past the end */
const char *kern_nn_name(int i);
/* 1 for the integer element types (and bool) the typed kernels handle. */
int kern_int_dtype(int dt);
/* Integer paths of the float kernels in kernels.c (Add/Sub/Mul, Fill). */
aclError kern_int_binary_run(const sim_op_args *a, int kind /* 0 add, 1 sub, 2 mul */);
aclError kern_int_fill_run(const sim_op_args *a);

/* aclsim_op_check (launch-time validation shared with libopapi) is declared
 * in sim.h. */

#ifdef __cplusplus
}
#endif

#endif
