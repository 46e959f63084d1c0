/* Elementwise operator kernels beyond the training basics of kernels_nn.c:
 * transcendental functions and activations (and their gradients),
 * comparisons, logical and bitwise operators, powers, remainders, selection
 * (where, masked fill), clamps and reversed subtraction — what LLM forward,
 * backward and generation launch through torch_npu. See
 * docs/simulator-ops.md.
 *
 * Every operator here broadcasts its tensor inputs to the output's shape
 * (numpy rules) and may take its second operand as a scalar attribute
 * ("value") instead of a tensor. Floating types compute in double and round
 * once on store; integer types and bool compute exactly in int64. Inputs are
 * read in full before the output is written (in-place forms are safe). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rt/kernels_util.h"

/* ------------------------------------------------------------- helpers */

static int is_float(int dt) { return kn_flt_dtype(dt); }
static int is_int(int dt) { return kern_int_dtype(dt); }

/* 1 if the operator's values are integers: every tensor input is an integer
 * type (or bool) and the scalar attribute, if any, is not a float. */
static int int_inputs(const sim_op_args *a, const char *scalar_attr)
{
    for (int i = 0; i < a->nin; i++)
        if (!is_int(a->in[i].dtype)) return 0;
    const sim_attr *s = scalar_attr ? kern_attr(a, scalar_attr) : NULL;
    return !(s && s->type == SIM_ATTR_FLOAT);
}

/* The tensor inputs and the scalar attribute "value" as n operands of the
 * output's shape: operand k is input k, or (k == nin) the scalar. */
typedef struct {
    int n;            /* operands */
    int ints;         /* int64 operands (else double) */
    double *d[4];
    int64_t *i[4];
    double sd;        /* the scalar operand */
    int64_t si;
    int has_scalar;
} operands;

static void ops_free(operands *o)
{
    for (int k = 0; k < 4; k++) { free(o->d[k]); free(o->i[k]); }
}

static int ops_load(const sim_op_args *a, operands *o, int ints)
{
    memset(o, 0, sizeof *o);
    o->ints = ints;
    o->n = a->nin;
    if (!kn_load_bcast(a, 0, a->nin, &a->out[0], ints, o->d, o->i)) return 0;
    const sim_attr *s = kern_attr(a, "value");
    if (s) {
        o->has_scalar = 1;
        o->sd = s->type == SIM_ATTR_FLOAT ? (double)s->f : (double)s->i;
        o->si = s->type == SIM_ATTR_FLOAT ? kn_d_to_i(s->f) : s->i;
    }
    return 1;
}

/* operand k at element j */
static double od(const operands *o, int k, uint64_t j) { return k < o->n ? o->d[k][j] : o->sd; }
static int64_t oi(const operands *o, int k, uint64_t j) { return k < o->n ? o->i[k][j] : o->si; }

/* Counts (nin_min..nin_max tensors, one output), a scalar attribute when
 * fewer than `operands_needed` tensors are given, and y the broadcast shape. */
static aclError ew_shape(const sim_op_args *a, int nin_min, int nin_max, int operands_needed)
{
    aclError e;
    if ((e = kn_counts(a, nin_min, nin_max, 1, 1))) return e;
    if (a->nin < operands_needed && !kern_attr(a, "value"))
        return kn_fail(a, ACL_ERROR_INVALID_PARAM, "the scalar operand (attribute 'value') is missing");
    return kn_bcast_out(a, 0, a->nin, &a->out[0]);
}

/* --------------------------------------------- unary float functions */

enum { U_SIN, U_COS, U_TANH, U_SIGMOID, U_SILU, U_ERF, U_GELU_TANH, U_LOG1P, U_EXPM1, U_ROUND, U_FLOOR, U_CEIL,
    U_TRUNC, U_SIGN, U_N };
static const char *const g_unary[U_N] = { "Sin", "Cos", "Tanh", "Sigmoid", "Silu", "Erf", "GeluTanh", "Log1p",
    "Expm1", "Round", "Floor", "Ceil", "Trunc", "Sign" };

/* rounding and sign keep integers as they are (exact) */
static int unary_exact_on_ints(int k) { return k >= U_ROUND; }

static int unary_kind(const char *t)
{
    for (int i = 0; i < U_N; i++)
        if (!strcmp(t, g_unary[i])) return i;
    return -1;
}

static const double SQRT_2_OVER_PI = 0.79788456080286535588;

/* GELU, tanh approximation (PyTorch approximate='tanh') */
static double gelu_tanh(double x)
{
    double inner = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + tanh(inner));
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static aclError unary_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 1, 1, 1, 1))) return e;
    int ints = is_int(a->in[0].dtype) && is_int(a->out[0].dtype);
    if (ints && !unary_exact_on_ints(unary_kind(a->op_type)))
        return kn_refuse_type(a, "an integer output needs a rounding or sign function");
    if (!kn_num_dtype(a->in[0].dtype) || !(is_float(a->out[0].dtype) || ints))
        return kn_refuse_type(a, "input must be numeric and the output float32, float16, bfloat16 or float64");
    if (!kn_same_shape(&a->in[0], &a->out[0])) return kn_shape_fail(a, "x and y differ", &a->in[0], &a->out[0]);
    *flops = 8 * kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError unary_run(const sim_op_args *a)
{
    int k = unary_kind(a->op_type);
    if (is_int(a->in[0].dtype) && is_int(a->out[0].dtype)) {
        int64_t *iv = kn_load_i(&a->in[0]);
        if (!iv) return kn_oom(a);
        uint64_t n = kern_numel(&a->out[0]);
        if (k == U_SIGN)
            for (uint64_t i = 0; i < n; i++) iv[i] = (iv[i] > 0) - (iv[i] < 0);
        kn_store_i(&a->out[0], iv);
        free(iv);
        return ACL_SUCCESS;
    }
    double *v = kn_load_d(&a->in[0]);
    if (!v) return kn_oom(a);
    uint64_t n = kern_numel(&a->out[0]);
    for (uint64_t i = 0; i < n; i++) {
        double x = v[i];
        switch (k) {
        case U_SIN: v[i] = sin(x); break;
        case U_COS: v[i] = cos(x); break;
        case U_TANH: v[i] = tanh(x); break;
        case U_SIGMOID: v[i] = sigmoid(x); break;
        case U_SILU: v[i] = x * sigmoid(x); break;
        case U_ERF: v[i] = erf(x); break;
        case U_GELU_TANH: v[i] = gelu_tanh(x); break;
        case U_LOG1P: v[i] = log1p(x); break;
        case U_EXPM1: v[i] = expm1(x); break;
        case U_ROUND: v[i] = nearbyint(x); break;   /* half to even, as torch.round */
        case U_FLOOR: v[i] = floor(x); break;
        case U_CEIL: v[i] = ceil(x); break;
        case U_TRUNC: v[i] = trunc(x); break;
        default: v[i] = x > 0 ? 1.0 : x < 0 ? -1.0 : x; break;   /* NaN stays NaN, -0 stays -0 */
        }
    }
    kn_store_d(&a->out[0], v);
    free(v);
    return ACL_SUCCESS;
}

/* ---------------------------------------------- activation gradients */
/* SiluGrad: dy, x -> dy * s(x) * (1 + x (1 - s(x)))
 * GeluTanhGrad: dy, x -> dy * d/dx gelu_tanh(x)
 * TanhGrad: dy, y -> dy * (1 - y^2)      (y = tanh(x), the forward output)
 * SigmoidGrad: dy, y -> dy * y * (1 - y) (y = sigmoid(x)) */

static aclError agrad_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 2, 2, 1, 1)) || (e = kn_types(a, is_float, "float32, float16, bfloat16, float64")))
        return e;
    if (!kn_same_shape(&a->in[0], &a->in[1]) || !kn_same_shape(&a->in[0], &a->out[0]))
        return kn_shape_fail(a, "dy, the saved tensor and dx must have one shape", &a->in[0], &a->in[1]);
    *flops = 10 * kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError agrad_run(const sim_op_args *a)
{
    double *dy = kn_load_d(&a->in[0]), *x = dy ? kn_load_d(&a->in[1]) : NULL;
    if (!x) { free(dy); return kn_oom(a); }
    uint64_t n = kern_numel(&a->out[0]);
    const char *t = a->op_type;
    if (!strcmp(t, "SiluGrad")) {
        for (uint64_t i = 0; i < n; i++) {
            double s = sigmoid(x[i]);
            dy[i] *= s * (1.0 + x[i] * (1.0 - s));
        }
    } else if (!strcmp(t, "GeluTanhGrad")) {
        for (uint64_t i = 0; i < n; i++) {
            double v = x[i], inner = SQRT_2_OVER_PI * (v + 0.044715 * v * v * v);
            double th = tanh(inner);
            double dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * v * v);
            dy[i] *= 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * dinner;
        }
    } else if (!strcmp(t, "TanhGrad")) {
        for (uint64_t i = 0; i < n; i++) dy[i] *= 1.0 - x[i] * x[i];
    } else {
        for (uint64_t i = 0; i < n; i++) dy[i] *= x[i] * (1.0 - x[i]);
    }
    kn_store_d(&a->out[0], dy);
    free(dy); free(x);
    return ACL_SUCCESS;
}

/* --------------------------------------------------------- comparisons */
/* Equal, NotEqual, Less, LessEqual, Greater, GreaterEqual: x1, x2 (or x1 and
 * the scalar "value") -> y (bool or any numeric type: 1 / 0). Integers
 * compare exactly; anything with a float compares as double (NaN: only
 * NotEqual is true). */

enum { C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE, C_N };
static const char *const g_cmp[C_N] = { "Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual" };

static int cmp_kind(const char *t)
{
    for (int i = 0; i < C_N; i++)
        if (!strcmp(t, g_cmp[i])) return i;
    return -1;
}

static aclError cmp_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = ew_shape(a, 1, 2, 2)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError cmp_run(const sim_op_args *a)
{
    operands o;
    int ints = int_inputs(a, "value");
    if (!ops_load(a, &o, ints)) return kn_oom(a);
    uint64_t n = kern_numel(&a->out[0]);
    int64_t *r = malloc((n ? n : 1) * sizeof *r);
    if (!r) { ops_free(&o); return kn_oom(a); }
    int k = cmp_kind(a->op_type);
    for (uint64_t j = 0; j < n; j++) {
        int v;
        if (ints) {
            int64_t x = oi(&o, 0, j), y = oi(&o, 1, j);
            v = k == C_EQ ? x == y : k == C_NE ? x != y : k == C_LT ? x < y : k == C_LE ? x <= y : k == C_GT ? x > y
                                                                                                             : x >= y;
        } else {
            double x = od(&o, 0, j), y = od(&o, 1, j);
            v = k == C_EQ ? x == y : k == C_NE ? x != y : k == C_LT ? x < y : k == C_LE ? x <= y : k == C_GT ? x > y
                                                                                                             : x >= y;
        }
        r[j] = v;
    }
    kn_store_i(&a->out[0], r);
    free(r);
    ops_free(&o);
    return ACL_SUCCESS;
}

/* ------------------------------------------------- logical and bitwise */
/* LogicalAnd/Or/Xor (x1, x2 or value) and LogicalNot (x): truth values ->
 * y (1 / 0). BitwiseAnd/Or/Xor (x1, x2 or value) and BitwiseNot (x):
 * integer types and bool (on bool: the logical operation). */

enum { L_AND, L_OR, L_XOR, L_NOT };

static int logic_kind(const char *t, int *bitwise)
{
    *bitwise = !strncmp(t, "Bitwise", 7);
    const char *op = t + (*bitwise ? 7 : 7);   /* "Logical" and "Bitwise" are both 7 characters */
    if (!strcmp(op, "And")) return L_AND;
    if (!strcmp(op, "Or")) return L_OR;
    if (!strcmp(op, "Xor")) return L_XOR;
    return L_NOT;
}

static aclError logic_check(const sim_op_args *a, uint64_t *flops)
{
    int bitwise;
    int k = logic_kind(a->op_type, &bitwise);
    aclError e;
    if ((e = ew_shape(a, 1, k == L_NOT ? 1 : 2, k == L_NOT ? 1 : 2))) return e;
    if (bitwise) {
        if ((e = kn_types(a, is_int, "integer types and bool"))) return e;
        const sim_attr *s = kern_attr(a, "value");
        if (s && s->type == SIM_ATTR_FLOAT && k != L_NOT) return kn_refuse_type(a, "a bitwise scalar must be an integer");
    } else if ((e = kn_types(a, kn_num_dtype, "numeric types and bool"))) {
        return e;
    }
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError logic_run(const sim_op_args *a)
{
    int bitwise;
    int k = logic_kind(a->op_type, &bitwise);
    operands o;
    /* truth values of floats are taken in double (0.5 is true) */
    int ints = bitwise || int_inputs(a, "value");
    if (!ops_load(a, &o, ints)) return kn_oom(a);
    uint64_t n = kern_numel(&a->out[0]);
    int64_t *r = malloc((n ? n : 1) * sizeof *r);
    if (!r) { ops_free(&o); return kn_oom(a); }
    /* a bool output of a bitwise operation on bools is the logical result */
    int as_bool = bitwise && a->out[0].dtype == ACL_BOOL;
    for (uint64_t j = 0; j < n; j++) {
        if (bitwise && !as_bool) {
            int64_t x = oi(&o, 0, j), y = k == L_NOT ? 0 : oi(&o, 1, j);
            r[j] = k == L_AND ? (x & y) : k == L_OR ? (x | y) : k == L_XOR ? (x ^ y) : ~x;
        } else {
            int x = ints ? oi(&o, 0, j) != 0 : od(&o, 0, j) != 0;
            int y = k == L_NOT ? 0 : (ints ? oi(&o, 1, j) != 0 : od(&o, 1, j) != 0);
            r[j] = k == L_AND ? (x && y) : k == L_OR ? (x || y) : k == L_XOR ? (x != y) : !x;
        }
    }
    kn_store_i(&a->out[0], r);
    free(r);
    ops_free(&o);
    return ACL_SUCCESS;
}

/* --------------------------------------------------------------- powers */
/* Pow: x, exponent (tensor, or the scalar "value") -> y = x ** e.
 * PowScalarTensor: exponent tensor and the scalar base "value" -> base ** e.
 * Integer operands: exact integer power (a negative exponent: 1 / x rounded
 * toward zero, as PyTorch; 0 ** -n is a device error). */

static int64_t ipow(int64_t b, int64_t e)
{
    if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;
    uint64_t r = 1, x = (uint64_t)b;
    while (e) {
        if (e & 1) r *= x;
        x *= x;
        e >>= 1;
    }
    return (int64_t)r;
}

static aclError pow_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = ew_shape(a, 1, 2, 2)) || (e = kn_types(a, kn_num_dtype, "numeric types"))) return e;
    int ints = int_inputs(a, "value") && is_int(a->out[0].dtype);
    if (!ints && !is_float(a->out[0].dtype))
        return kn_refuse_type(a, "a float power needs a floating-point output");
    *flops = 4 * kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError pow_run(const sim_op_args *a)
{
    int ints = int_inputs(a, "value") && is_int(a->out[0].dtype);
    int base_scalar = !strcmp(a->op_type, "PowScalarTensor");
    operands o;
    if (!ops_load(a, &o, ints)) return kn_oom(a);
    uint64_t n = kern_numel(&a->out[0]);
    aclError rc = ACL_SUCCESS;
    /* operand 0 is the tensor; the other is input 1 or the scalar */
    for (uint64_t j = 0; j < n; j++) {
        if (ints) {
            int64_t b = base_scalar ? o.si : oi(&o, 0, j), e = base_scalar ? oi(&o, 0, j) : oi(&o, 1, j);
            if (b == 0 && e < 0) rc = ACL_ERROR_RT_AICORE_EXCEPTION;
            o.i[0][j] = ipow(b, e);
        } else {
            double b = base_scalar ? o.sd : od(&o, 0, j), e = base_scalar ? od(&o, 0, j) : od(&o, 1, j);
            o.d[0][j] = e == 2.0 ? b * b : e == 0.5 ? sqrt(b) : pow(b, e);
        }
    }
    if (rc) aclsim_log("%s: integer zero to a negative power", a->op_type);
    if (ints) kn_store_i(&a->out[0], o.i[0]);
    else kn_store_d(&a->out[0], o.d[0]);
    ops_free(&o);
    return rc;
}

/* ------------------------------------------------- remainder, floor div */
/* Remainder: x1, x2 (or value) -> x1 - floor(x1 / x2) * x2, the sign of the
 * divisor (Python's %, torch.remainder). FloorDiv: floor(x1 / x2). Integer
 * division by zero is a device error. */

static aclError rem_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = ew_shape(a, 1, 2, 2)) || (e = kn_types(a, kn_num_dtype, "numeric types"))) return e;
    *flops = 3 * kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError rem_run(const sim_op_args *a)
{
    int ints = int_inputs(a, "value") && is_int(a->out[0].dtype);
    int floordiv = !strcmp(a->op_type, "FloorDiv");
    operands o;
    if (!ops_load(a, &o, ints)) return kn_oom(a);
    uint64_t n = kern_numel(&a->out[0]);
    aclError rc = ACL_SUCCESS;
    for (uint64_t j = 0; j < n; j++) {
        if (ints) {
            int64_t x = oi(&o, 0, j), y = oi(&o, 1, j);
            if (y == 0) { rc = ACL_ERROR_RT_AICORE_EXCEPTION; o.i[0][j] = 0; continue; }
            int64_t q = x / y, r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) { r += y; q -= 1; }
            o.i[0][j] = floordiv ? q : r;
        } else {
            double x = od(&o, 0, j), y = od(&o, 1, j);
            if (floordiv) {
                o.d[0][j] = floor(x / y);
            } else {
                double r = fmod(x, y);
                if (r != 0 && ((r < 0) != (y < 0))) r += y;
                o.d[0][j] = r;
            }
        }
    }
    if (rc) aclsim_log("%s: integer division by zero", a->op_type);
    if (ints) kn_store_i(&a->out[0], o.i[0]);
    else kn_store_d(&a->out[0], o.d[0]);
    ops_free(&o);
    return rc;
}

/* ------------------------------------------------- where, masked fill */
/* SelectV2: condition, x1, x2 -> y = condition ? x1 : x2 (all broadcast).
 * MaskedFill: x, mask[, value tensor of one element] (or the scalar
 * "value") -> y = mask ? value : x; mask broadcasts to x, y has x's shape. */

static aclError select_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 3, 3, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    if ((e = kn_bcast_out(a, 0, 3, &a->out[0]))) return e;
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError select_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    int ints = is_int(y->dtype);
    uint64_t n = kern_numel(y);
    sim_tensor cv;
    if (!kern_broadcast_view(&a->in[0], y, &cv)) return ACL_ERROR_RT_AICORE_EXCEPTION;
    double *c = kn_load_d(&cv);
    double *d[3] = { NULL, NULL, NULL };
    int64_t *iv[3] = { NULL, NULL, NULL };
    if (!c || !kn_load_bcast(a, 1, 2, y, ints, d, iv)) { free(c); return kn_oom(a); }
    for (uint64_t j = 0; j < n; j++) {
        int pick = c[j] != 0 ? 0 : 1;
        if (ints) iv[0][j] = iv[pick][j];
        else d[0][j] = d[pick][j];
    }
    if (ints) kn_store_i(y, iv[0]);
    else kn_store_d(y, d[0]);
    free(c);
    for (int k = 0; k < 3; k++) { free(d[k]); free(iv[k]); }
    return ACL_SUCCESS;
}

static aclError mfill_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = kn_counts(a, 2, 3, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types and bool"))) return e;
    if (a->nin == 2 && !kern_attr(a, "value"))
        return kn_fail(a, ACL_ERROR_INVALID_PARAM, "the fill value (attribute 'value') is missing");
    if (a->nin == 3 && kern_numel(&a->in[2]) != 1)
        return kn_shape_fail(a, "the value tensor must have one element", &a->in[2], &a->in[2]);
    if (!kn_same_shape(&a->in[0], &a->out[0])) return kn_shape_fail(a, "x and y differ", &a->in[0], &a->out[0]);
    if (!kn_broadcasts_to(&a->in[1], &a->in[0])) return kn_shape_fail(a, "mask does not broadcast to x", &a->in[1], &a->in[0]);
    *flops = kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError mfill_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    int ints = is_int(y->dtype);
    uint64_t n = kern_numel(y);
    sim_tensor mv;
    if (!kern_broadcast_view(&a->in[1], &a->in[0], &mv)) return ACL_ERROR_RT_AICORE_EXCEPTION;
    double *m = kn_load_d(&mv);
    double *xd = NULL, vd = 0;
    int64_t *xi = NULL, vi = 0;
    if (a->nin == 3) {
        if (ints) { int64_t *t = kn_load_i(&a->in[2]); if (t) { vi = t[0]; free(t); } }
        else { double *t = kn_load_d(&a->in[2]); if (t) { vd = t[0]; free(t); } }
    } else {
        const sim_attr *s = kern_attr(a, "value");
        vd = s->type == SIM_ATTR_FLOAT ? (double)s->f : (double)s->i;
        vi = s->type == SIM_ATTR_FLOAT ? kn_d_to_i(s->f) : s->i;
    }
    if (ints) xi = kn_load_i(&a->in[0]);
    else xd = kn_load_d(&a->in[0]);
    if (!m || (ints ? !xi : !xd)) { free(m); free(xd); free(xi); return kn_oom(a); }
    for (uint64_t j = 0; j < n; j++)
        if (m[j] != 0) {
            if (ints) xi[j] = vi;
            else xd[j] = vd;
        }
    if (ints) kn_store_i(y, xi);
    else kn_store_d(y, xd);
    free(m); free(xd); free(xi);
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------------- clamp */
/* Clamp: x -> min(max(x, lo), hi) with bool attributes "has_min"/"has_max"
 * and the bounds as attributes "min"/"max" (scalar forms) or as inputs
 * after x in that order (tensor forms, attribute "tensors" = 1). NaN in x
 * stays NaN, as PyTorch. */

static aclError clamp_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    int hmin = kern_attr_int(a, "has_min", 0) != 0, hmax = kern_attr_int(a, "has_max", 0) != 0;
    int tens = kern_attr_int(a, "tensors", 0) != 0;
    int want = 1 + (tens ? hmin + hmax : 0);
    if ((e = kn_counts(a, want, want, 1, 1)) || (e = kn_types(a, kn_num_dtype, "numeric types"))) return e;
    if (!hmin && !hmax) return kn_fail(a, ACL_ERROR_INVALID_PARAM, "at least one of min and max is required");
    if (!tens && ((hmin && !kern_attr(a, "min")) || (hmax && !kern_attr(a, "max"))))
        return kn_fail(a, ACL_ERROR_INVALID_PARAM, "a bound attribute is missing");
    if ((e = kn_bcast_out(a, 0, a->nin, &a->out[0]))) return e;
    *flops = 2 * kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError clamp_run(const sim_op_args *a)
{
    const sim_tensor *y = &a->out[0];
    int hmin = kern_attr_int(a, "has_min", 0) != 0, hmax = kern_attr_int(a, "has_max", 0) != 0;
    int tens = kern_attr_int(a, "tensors", 0) != 0;
    const sim_attr *amin = kern_attr(a, "min"), *amax = kern_attr(a, "max");
    int ints = is_int(y->dtype);
    for (int i = 0; i < a->nin; i++) ints = ints && is_int(a->in[i].dtype);
    if (!tens) ints = ints && !(amin && amin->type == SIM_ATTR_FLOAT) && !(amax && amax->type == SIM_ATTR_FLOAT);
    double *d[3] = { NULL, NULL, NULL };
    int64_t *iv[3] = { NULL, NULL, NULL };
    if (!kn_load_bcast(a, 0, a->nin, y, ints, d, iv)) return kn_oom(a);
    uint64_t n = kern_numel(y);
    int kmin = 1, kmax = 1 + hmin;
    for (uint64_t j = 0; j < n; j++) {
        if (ints) {
            int64_t v = iv[0][j];
            if (hmin) { int64_t lo = tens ? iv[kmin][j] : amin->i; if (v < lo) v = lo; }
            if (hmax) { int64_t hi = tens ? iv[kmax][j] : amax->i; if (v > hi) v = hi; }
            iv[0][j] = v;
        } else {
            double v = d[0][j];
            if (v != v) continue;
            if (hmin) {
                double lo = tens ? d[kmin][j] : (amin->type == SIM_ATTR_FLOAT ? amin->f : (double)amin->i);
                if (v < lo || lo != lo) v = lo;
            }
            if (hmax) {
                double hi = tens ? d[kmax][j] : (amax->type == SIM_ATTR_FLOAT ? amax->f : (double)amax->i);
                if (v > hi || hi != hi) v = hi;
            }
            d[0][j] = v;
        }
    }
    if (ints) kn_store_i(y, iv[0]);
    else kn_store_d(y, d[0]);
    for (int k = 0; k < 3; k++) { free(d[k]); free(iv[k]); }
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------- Rsubs */
/* Rsubs: x -> y = value - alpha * x (torch.rsub with a scalar). */

static aclError rsubs_check(const sim_op_args *a, uint64_t *flops)
{
    aclError e;
    if ((e = ew_shape(a, 1, 1, 2)) || (e = kn_types(a, kn_num_dtype, "numeric types"))) return e;
    *flops = 2 * kern_numel(&a->out[0]);
    return ACL_SUCCESS;
}

static aclError rsubs_run(const sim_op_args *a)
{
    const sim_attr *al = kern_attr(a, "alpha");
    int ints = int_inputs(a, "value") && is_int(a->out[0].dtype) && !(al && al->type == SIM_ATTR_FLOAT);
    operands o;
    if (!ops_load(a, &o, ints)) return kn_oom(a);
    uint64_t n = kern_numel(&a->out[0]);
    if (ints) {
        uint64_t alpha = (uint64_t)kern_attr_int(a, "alpha", 1);
        for (uint64_t j = 0; j < n; j++) o.i[0][j] = (int64_t)((uint64_t)o.si - alpha * (uint64_t)o.i[0][j]);
        kn_store_i(&a->out[0], o.i[0]);
    } else {
        double alpha = kn_attr_d(a, "alpha", 1);
        for (uint64_t j = 0; j < n; j++) o.d[0][j] = o.sd - alpha * o.d[0][j];
        kn_store_d(&a->out[0], o.d[0]);
    }
    ops_free(&o);
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------------- table */

const sim_kernel_def kern_table_math[] = {
    { "Sin", unary_check, unary_run, 0 },
    { "Cos", unary_check, unary_run, 0 },
    { "Tanh", unary_check, unary_run, 0 },
    { "Sigmoid", unary_check, unary_run, 0 },
    { "Silu", unary_check, unary_run, 0 },
    { "Erf", unary_check, unary_run, 0 },
    { "GeluTanh", unary_check, unary_run, 0 },
    { "Log1p", unary_check, unary_run, 0 },
    { "Expm1", unary_check, unary_run, 0 },
    { "Round", unary_check, unary_run, 0 },
    { "Floor", unary_check, unary_run, 0 },
    { "Ceil", unary_check, unary_run, 0 },
    { "Trunc", unary_check, unary_run, 0 },
    { "Sign", unary_check, unary_run, 0 },
    { "SiluGrad", agrad_check, agrad_run, 0 },
    { "GeluTanhGrad", agrad_check, agrad_run, 0 },
    { "TanhGrad", agrad_check, agrad_run, 0 },
    { "SigmoidGrad", agrad_check, agrad_run, 0 },
    { "Equal", cmp_check, cmp_run, 0 },
    { "NotEqual", cmp_check, cmp_run, 0 },
    { "Less", cmp_check, cmp_run, 0 },
    { "LessEqual", cmp_check, cmp_run, 0 },
    { "Greater", cmp_check, cmp_run, 0 },
    { "GreaterEqual", cmp_check, cmp_run, 0 },
    { "LogicalAnd", logic_check, logic_run, 0 },
    { "LogicalOr", logic_check, logic_run, 0 },
    { "LogicalXor", logic_check, logic_run, 0 },
    { "LogicalNot", logic_check, logic_run, 0 },
    { "BitwiseAnd", logic_check, logic_run, 0 },
    { "BitwiseOr", logic_check, logic_run, 0 },
    { "BitwiseXor", logic_check, logic_run, 0 },
    { "BitwiseNot", logic_check, logic_run, 0 },
    { "Pow", pow_check, pow_run, 0 },
    { "PowScalarTensor", pow_check, pow_run, 0 },
    { "Remainder", rem_check, rem_run, 0 },
    { "FloorDiv", rem_check, rem_run, 0 },
    { "SelectV2", select_check, select_run, 0 },
    { "MaskedFill", mfill_check, mfill_run, 0 },
    { "Clamp", clamp_check, clamp_run, 0 },
    { "Rsubs", rsubs_check, rsubs_run, 0 },
    { NULL, NULL, NULL, 0 },
};
