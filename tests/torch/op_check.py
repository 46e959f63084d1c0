#!/usr/bin/env python3
"""Runs PyTorch operations on the CPU and on 'npu' (torch_npu on the simulated
runtime) in one process and compares the results: every operator the
simulator provides for torch_npu, in float32 and — where LLM workloads use
them — float16 and bfloat16, integer and bool types, broadcasting, in-place
forms, strided views and gradients; torch_npu's fused operators
(npu_rms_norm, npu_rotary_mul, npu_swiglu, npu_fusion_attention) against
formulas written out on the CPU; and the refusals: configurations the
simulator cannot compute must raise, never return made-up numbers.

Output: one line per case, `case=<name> maxdiff=<x> ok=<0|1>` (or
`case=<name> refused=1 ok=1`), then `cases=N failed=M` and
`kernels=<every operator type with a simulated kernel>`. Exit status 0 when
every case passes: float32 within rtol/atol 1e-5 (1e-4 for reductions over
long rows), float16 within 2e-3, bfloat16 within 1.6e-2 (a couple of units in
the last place: the CPU rounds its float32 result, the simulator its double
one), integers and bool exactly.
"""
import ctypes
import math
import os
import sys

import torch
import torch.nn.functional as F
import torch_npu  # noqa: F401


TOL = {torch.float32: 1e-5, torch.float64: 1e-9, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def kernel_names():
    """Every operator type the simulator computes (libascendcl's table)."""
    home = os.environ.get("ASCEND_HOME_PATH", "")
    lib = ctypes.CDLL(os.path.join(home, "lib64", "libascendcl.so"))
    f = lib.aclsim_kernel_name
    f.restype = ctypes.c_char_p
    f.argtypes = [ctypes.c_int]
    out, i = [], 0
    while (n := f(i)) is not None:
        out.append(n.decode())
        i += 1
    return out


def main() -> int:
    g = torch.Generator().manual_seed(7)
    a = torch.randn(6, 5, generator=g)
    b = torch.randn(6, 5, generator=g)
    c = torch.rand(6, 5, generator=g) + 0.5
    row = torch.randn(5, generator=g)
    i64 = torch.randint(-50, 50, (6, 5), generator=g)
    i32 = i64.int()
    pos = torch.randint(1, 9, (6, 5), generator=g)
    tgt = torch.randint(0, 5, (6,), generator=g)
    tgt_ign = tgt.clone()
    tgt_ign[2] = -100
    w5 = torch.rand(5, generator=g) + 0.5
    m1, m2 = torch.randn(4, 7, generator=g), torch.randn(7, 3, generator=g)
    bias = torch.randn(3, generator=g)
    mask = torch.rand(6, 5, generator=g) > 0.5
    x3 = torch.randn(2, 3, 8, generator=g)
    x4 = torch.randn(2, 3, 4, 8, generator=g)
    emb = torch.randn(11, 8, generator=g)
    ids = torch.tensor([[1, 4, 10, 4], [0, 2, 2, 9]])
    probs = torch.softmax(torch.randn(3, 10, generator=g), dim=-1)

    def npu(t):
        return t.to("npu")

    def cpu(t):
        return t

    def half(fn, dt):
        """fn on inputs converted to dt"""
        return lambda d: fn(lambda t: d(t.to(dt)) if t.is_floating_point() else d(t))

    def grad_of(d, loss_fn, x=a):
        t = d(x).clone().requires_grad_()
        loss_fn(t).backward()
        return t.grad

    def grads(d, fn, *xs):
        """fn(*inputs) then backward of a fixed random projection: every input's gradient"""
        ts = [d(x).clone().requires_grad_() for x in xs]
        out = fn(*ts)
        outs = out if isinstance(out, (list, tuple)) else [out]
        gg = torch.Generator().manual_seed(3)
        loss = sum((o.float() * d(torch.randn(o.shape, generator=gg))).sum() for o in outs)
        loss.backward()
        return [o.detach() for o in outs] + [t.grad for t in ts]

    cases = [
        # ---- training basics (kernels_nn.c) ----
        ("add_alpha", lambda d: d(a).add(d(b), alpha=0.5)),
        ("add_broadcast_row", lambda d: d(a) + d(row)),
        ("adds", lambda d: d(a) + 2.25),
        ("sub", lambda d: d(a) - d(b)),
        ("subs_alpha", lambda d: torch.sub(d(a), 1.5, alpha=2)),
        ("rsub", lambda d: 1.0 - d(a)),
        ("rsub_tensor", lambda d: torch.rsub(d(a), d(b), alpha=2)),
        ("rsub_int64", lambda d: 7 - d(i64)),
        ("mul", lambda d: d(a) * d(b)),
        ("muls", lambda d: d(a) * 0.3),
        ("div", lambda d: d(a) / d(c)),
        ("divs", lambda d: d(a) / 3.0),
        ("maximum", lambda d: torch.maximum(d(a), d(b))),
        ("minimum", lambda d: torch.minimum(d(a), d(b))),
        ("neg", lambda d: -d(a)),
        ("sqrt", lambda d: torch.sqrt(d(c))),
        ("exp", lambda d: torch.exp(d(a))),
        ("relu", lambda d: F.relu(d(a))),
        ("gelu", lambda d: F.gelu(d(a))),
        ("log_softmax_dim0", lambda d: F.log_softmax(d(a), dim=0)),
        ("softmax_dim1", lambda d: F.softmax(d(a), dim=1)),
        ("nll_mean", lambda d: F.nll_loss(F.log_softmax(d(a), 1), d(tgt))),
        ("nll_sum_weight", lambda d: F.nll_loss(F.log_softmax(d(a), 1), d(tgt), weight=d(w5), reduction="sum")),
        ("nll_none_ignore", lambda d: F.nll_loss(F.log_softmax(d(a), 1), d(tgt_ign), reduction="none")),
        ("cross_entropy", lambda d: F.cross_entropy(d(a), d(tgt))),
        ("cross_entropy_arange_targets", lambda d: F.cross_entropy(d(a), torch.arange(6, device=d(a).device) % 5)),
        ("sum_all", lambda d: d(a).sum()),
        ("sum_dim0", lambda d: d(a).sum(0)),
        ("sum_dim1_keepdim", lambda d: d(a).sum(1, keepdim=True)),
        ("sum_int64", lambda d: d(i64).sum(0)),
        ("mm", lambda d: d(m1) @ d(m2)),
        ("mm_transposed_view", lambda d: d(m2).t() @ d(m1).t()),
        ("bmm", lambda d: torch.bmm(d(x3), d(x3).transpose(1, 2))),
        ("addmm", lambda d: torch.addmm(d(bias), d(m1), d(m2), beta=0.5, alpha=2.0)),
        ("linear", lambda d: F.linear(d(m1), d(m2).t(), d(bias))),
        ("addcmul", lambda d: torch.addcmul(d(a), d(b), d(c), value=0.5)),
        ("addcdiv", lambda d: torch.addcdiv(d(a), d(b), d(c), value=-0.25)),
        ("lerp", lambda d: torch.lerp(d(a), d(b), 0.3)),
        ("cast_f32_to_i64", lambda d: (d(a) * 10).long()),
        ("cast_i64_to_f32", lambda d: d(i64).float()),
        ("cast_i32_to_i64", lambda d: d(i32).long()),
        ("cast_f32_to_bf16", lambda d: d(a).bfloat16()),
        ("cast_f32_to_f16", lambda d: d(a).half()),
        ("cast_bool_to_f32", lambda d: d(mask).float()),
        ("int64_add", lambda d: d(i64) + d(i64)),
        ("int64_add_arange", lambda d: d(i64) + torch.arange(5, device=d(a).device)),
        ("int64_mul_scalar", lambda d: d(i64) * 3),
        ("int32_sub", lambda d: d(i32) - d(i32) * 2),
        ("contiguous_of_transpose", lambda d: d(a).t().contiguous()),
        ("slice_copy", lambda d: d(a)[1:4, ::2].contiguous()),
        ("zeros_like", lambda d: torch.zeros_like(d(a))),
        ("ones", lambda d: torch.ones(3, 4, device=d(a).device)),
        ("full_int", lambda d: torch.full((5,), 7, dtype=torch.long, device=d(a).device)),
        ("fill_", lambda d: d(a).clone().fill_(1.5)),
        ("zero_empty", lambda d: torch.empty(0, 4, device=d(a).device).zero_()),
        ("inplace_chain", lambda d: d(a).clone().mul_(2).add_(d(b)).sub_(1).div_(d(c))),
        ("foreach_mul", lambda d: torch._foreach_mul([d(a), d(b)], 0.5)),
        ("foreach_mul_tensor", lambda d: torch._foreach_mul([d(a), d(b)], d(torch.tensor(0.25)))),
        ("foreach_add_list", lambda d: torch._foreach_add([d(a), d(b)], [d(b), d(c)], alpha=2.0)),
        ("foreach_lerp", lambda d: torch._foreach_lerp([d(a), d(b)], [d(b), d(c)], 0.1)),
        ("foreach_addcmul", lambda d: torch._foreach_addcmul([d(a), d(b)], [d(b), d(c)], [d(c), d(a)], 0.2)),
        ("foreach_addcdiv_list", lambda d: torch._foreach_addcdiv([d(a), d(b)], [d(b), d(a)], [d(c), d(c)], [0.5, -2.0])),
        ("foreach_sqrt", lambda d: torch._foreach_sqrt([d(c), d(c) * 2])),
        ("foreach_div_list", lambda d: torch._foreach_div([d(a), d(b)], [2.0, 4.0])),
        ("foreach_norm", lambda d: torch._foreach_norm([d(a), d(b), d(x3)])),
    ]

    def adamw(d, fused, amsgrad=False):
        p = torch.nn.Parameter(d(a).clone())
        # the reference is the CPU's multi-tensor path; the NPU uses fused
        # (aclnnApplyAdamWV2) when asked
        opt = torch.optim.AdamW([p], lr=0.01, weight_decay=0.1, amsgrad=amsgrad, fused=fused and d is npu)
        for k in range(3):
            p.grad = d(b).clone() * (k + 1)
            opt.step()
        return p.detach()

    def clip(d):
        ps = [torch.nn.Parameter(d(a).clone()), torch.nn.Parameter(d(x3).clone())]
        ps[0].grad, ps[1].grad = d(b) * 3, d(x3) * 2
        n = torch.nn.utils.clip_grad_norm_(ps, 1.0)
        return [n] + [p.grad for p in ps]

    cases += [
        ("mean_all", lambda d: d(a).mean()),
        ("mean_dim1", lambda d: d(a).mean(1)),
        ("mse_loss", lambda d: F.mse_loss(d(a), d(b))),
        ("mse_loss_grad", lambda d: grad_of(d, lambda x: F.mse_loss(x, d(b)))),
        ("cross_entropy_grad", lambda d: grad_of(d, lambda x: F.cross_entropy(x, d(tgt)))),
        ("gelu_relu_grad", lambda d: grad_of(d, lambda x: (F.gelu(x) * F.relu(x)).sum())),
        ("adamw_foreach", lambda d: adamw(d, False)),
        ("adamw_fused", lambda d: adamw(d, True)),
        ("adamw_fused_amsgrad", lambda d: adamw(d, True, amsgrad=True)),
        ("clip_grad_norm", clip),
    ]

    # ---- activations and elementwise functions (kernels_math.c) ----
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        s = {torch.float32: "", torch.bfloat16: "_bf16", torch.float16: "_f16"}[dt]
        cases += [
            ("sin" + s, half(lambda d: torch.sin(d(a)), dt)),
            ("cos" + s, half(lambda d: torch.cos(d(a)), dt)),
            ("tanh" + s, half(lambda d: torch.tanh(d(a)), dt)),
            ("sigmoid" + s, half(lambda d: torch.sigmoid(d(a)), dt)),
            ("silu" + s, half(lambda d: F.silu(d(a)), dt)),
            # torch_npu 2.14 launches aclnnGelu (no approximate argument) for
            # both forms unless TORCH_NPU_USE_COMPATIBLE_IMPL is set; the
            # simulator's aclnnGelu is the erf form: compare with the CPU's
            ("gelu_tanh_arg" + s, lambda d, dt=dt: F.gelu(d(a.to(dt)), approximate="tanh") if d is npu
             else F.gelu(a.to(dt))),
            ("rsqrt" + s, half(lambda d: torch.rsqrt(d(c)), dt)),
            ("pow2" + s, half(lambda d: d(a).pow(2), dt)),
            ("softmax" + s, half(lambda d: F.softmax(d(a), dim=-1), dt)),
            ("matmul" + s, half(lambda d: d(m1) @ d(m2), dt)),
            ("layer_norm" + s, half(lambda d: F.layer_norm(d(x3), (8,), d(x3[0, 0]), d(x3[1, 1]), 1e-5), dt)),
        ]
    cases += [
        ("erf", lambda d: torch.erf(d(a))),
        ("log", lambda d: torch.log(d(c))),
        ("log1p", lambda d: torch.log1p(d(c))),
        ("expm1", lambda d: torch.expm1(d(a))),
        ("abs", lambda d: torch.abs(d(a))),
        ("round_half_even", lambda d: torch.round(d(torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6])))),
        ("floor_ceil_trunc", lambda d: (torch.floor(d(a) * 3), torch.ceil(d(a) * 3), torch.trunc(d(a) * 3))),
        ("sign", lambda d: (torch.sign(d(a)), torch.sign(d(i64)))),
        ("reciprocal", lambda d: torch.reciprocal(d(c))),
        ("inplace_unary_chain", lambda d: d(c).clone().sqrt_().exp_().reciprocal_().rsqrt_().neg_()),
        ("inplace_sigmoid_tanh_sin_cos", lambda d: (d(a).clone().sigmoid_(), d(a).clone().tanh_(),
                                                     d(a).clone().sin_(), d(a).clone().cos_())),
        ("silu_grad", lambda d: grad_of(d, lambda x: (F.silu(x) * d(b)).sum())),
        ("tanh_grad", lambda d: grad_of(d, lambda x: (torch.tanh(x) * d(b)).sum())),
        ("sigmoid_grad", lambda d: grad_of(d, lambda x: (torch.sigmoid(x) * d(b)).sum())),
        ("gelu_tanh_arg_grad", lambda d: grad_of(d, lambda x: (F.gelu(x, approximate="tanh" if d is npu else "none")
                                                                * d(b)).sum())),
        ("softmax_grad", lambda d: grad_of(d, lambda x: (F.softmax(x, dim=-1) * d(b)).sum())),
        ("pow_scalar", lambda d: d(c).pow(0.5) + d(c).pow(3) + d(c).pow(-1.5)),
        ("pow_scalar_base", lambda d: torch.pow(2.0, d(a))),
        ("pow_tensor", lambda d: torch.pow(d(c), d(a))),
        ("pow_int64", lambda d: d(pos).pow(3)),
        ("pow_inplace", lambda d: d(c).clone().pow_(2.5)),
        ("pow_grad", lambda d: grad_of(d, lambda x: (x.pow(2) * d(b)).sum())),
        ("remainder_float", lambda d: torch.remainder(d(a) * 7, 2.5)),
        ("remainder_int64_negative", lambda d: torch.remainder(d(i64), 7)),
        ("remainder_int64_tensor", lambda d: torch.remainder(d(i64), d(pos))),
        ("floor_divide_int64", lambda d: torch.floor_divide(d(i64), d(pos))),
        ("floor_divide_float", lambda d: torch.floor_divide(d(a) * 5, d(c))),
        ("clamp", lambda d: torch.clamp(d(a), -0.5, 0.7)),
        ("clamp_min", lambda d: torch.clamp(d(a), min=0.1)),
        ("clamp_max_int64", lambda d: torch.clamp(d(i64), max=10)),
        ("clamp_tensor", lambda d: torch.clamp(d(a), d(b), d(b) + 1)),
        ("clamp_min_tensor", lambda d: torch.clamp(d(a), min=d(row))),
    ]

    # ---- comparisons, logic, selection ----
    cases += [
        ("eq_tensor", lambda d: d(i64) == d(i64).flip(0)),
        ("eq_scalar", lambda d: d(i64) == 3),
        ("ne_tensor_float", lambda d: d(a) != d(b)),
        ("ne_scalar", lambda d: d(a) != 0.0),
        ("lt_scalar", lambda d: d(a) < 0.1),
        ("lt_tensor", lambda d: d(a) < d(b)),
        ("le_tensor_broadcast", lambda d: d(a) <= d(row)),
        ("le_scalar_int", lambda d: d(i64) <= -3),
        ("gt_scalar", lambda d: d(a) > 0),
        ("gt_tensor_int", lambda d: d(i64) > d(i64).flip(1)),
        ("ge_scalar", lambda d: d(i64) >= 0),
        ("ge_tensor", lambda d: d(a) >= d(b)),
        ("eq_inplace", lambda d: d(a).clone().eq_(d(a).clone().round())),
        ("logical_and", lambda d: torch.logical_and(d(mask), d(a) > 0)),
        ("logical_or", lambda d: torch.logical_or(d(mask), d(a) > 0)),
        ("logical_xor", lambda d: torch.logical_xor(d(mask), d(i64))),
        ("logical_not", lambda d: torch.logical_not(d(mask))),
        ("logical_not_float", lambda d: torch.logical_not(d(a).round())),
        ("bitwise_and_int", lambda d: d(i64) & d(pos)),
        ("bitwise_or_bool", lambda d: d(mask) | (d(a) > 0)),
        ("bitwise_xor_int", lambda d: d(i64) ^ d(pos)),
        ("bitwise_not_int", lambda d: ~d(i64)),
        ("bitwise_not_bool", lambda d: ~d(mask)),
        ("bitwise_and_scalar", lambda d: d(i64) & 6),
        ("bitwise_inplace", lambda d: d(mask).clone().logical_and_(d(a) > 0).logical_or_(d(b) > 1)),
        ("where", lambda d: torch.where(d(mask), d(a), d(b))),
        ("where_broadcast", lambda d: torch.where(d(a) > 0, d(row), d(torch.tensor(-1.0)))),
        ("where_int", lambda d: torch.where(d(mask), d(i64), d(pos))),
        ("masked_fill_scalar", lambda d: d(a).masked_fill(d(mask), -3.0)),
        ("masked_fill_neginf_softmax", lambda d: F.softmax(d(a).masked_fill(
            torch.triu(torch.ones(6, 5, dtype=torch.bool, device=d(a).device), 1), float("-inf")), dim=-1)),
        ("masked_fill_tensor", lambda d: d(a).masked_fill(d(mask), d(torch.tensor(2.5)))),
        ("masked_fill_int", lambda d: d(i64).masked_fill(d(mask), 0)),
        ("masked_fill_bf16", lambda d: d(a).bfloat16().masked_fill(d(mask), -1e4)),
    ]

    # ---- every remaining entry point: in-place and scalar forms ----
    l2 = lambda d: [d(a), d(b)]  # noqa: E731
    cases += [
        ("bitwise_scalar_or_xor", lambda d: (d(i64) | 5, d(i64) ^ 5)),
        ("npu_dtype_cast", lambda d: torch_npu.npu_dtype_cast(d(a), torch.float16) if d is npu else a.half()),
        ("clamp_min_max_scalar", lambda d: (torch.clamp_min(d(a), 0.2), torch.clamp_max(d(a), -0.1))),
        ("clamp_min_max_tensor", lambda d: (torch.clamp_min(d(a), d(b)), torch.clamp_max(d(a), d(row)))),
        ("floor_divide_scalar", lambda d: torch.floor_divide(d(i64), 4)),
        ("foreach_add_tensor_scalar", lambda d: torch._foreach_add(l2(d), d(torch.tensor(0.5)))),
        ("foreach_add_scalar_list", lambda d: torch._foreach_add(l2(d), [0.5, -1.0])),
        ("foreach_sub_scalar", lambda d: (torch._foreach_sub(l2(d), 0.25), torch._foreach_sub(l2(d), [1.0, 2.0]),
                                          torch._foreach_sub(l2(d), d(torch.tensor(3.0))))),
        ("foreach_div_scalar", lambda d: (torch._foreach_div(l2(d), 3.0), torch._foreach_div(l2(d), d(torch.tensor(2.0))))),
        ("foreach_sub_list", lambda d: torch._foreach_sub(l2(d), [d(c), d(a)], alpha=0.5)),
        ("foreach_mul_scalar_list", lambda d: torch._foreach_mul(l2(d), [2.0, -0.5])),
        ("foreach_mul_div_list", lambda d: (torch._foreach_mul(l2(d), [d(c), d(c)]), torch._foreach_div(l2(d), [d(c), d(c)]))),
        ("foreach_lerp_list", lambda d: torch._foreach_lerp(l2(d), [d(c), d(b)], [d(c) * 0.1, d(c) * 0.2])),
        ("foreach_exp_neg_reciprocal", lambda d: (torch._foreach_exp(l2(d)), torch._foreach_neg(l2(d)),
                                                  torch._foreach_reciprocal([d(c)]))),
        ("foreach_addcdiv_scalar", lambda d: (torch._foreach_addcdiv(l2(d), l2(d), [d(c), d(c)], 0.5),
                                              torch._foreach_addcdiv(l2(d), l2(d), [d(c), d(c)],
                                                                     torch.tensor([0.5, 2.0])))),
        ("foreach_addcmul_scalar", lambda d: (torch._foreach_addcmul(l2(d), l2(d), [d(c), d(c)],
                                                                     torch.tensor([0.5, 2.0])),
                                              torch._foreach_addcmul(l2(d), l2(d), [d(c), d(c)], [0.5, 2.0]))),
        ("index_copy_out_of_place", lambda d: torch.index_copy(d(a), 0, d(torch.tensor([4, 1])), d(b)[:2])),
        ("inplace_bitwise", lambda d: (d(i64).clone().bitwise_and_(d(pos)), d(i64).clone().bitwise_or_(d(pos)))),
        ("inplace_rounding", lambda d: (d(a).clone().mul_(3).ceil_(), d(a).clone().mul_(3).floor_(),
                                        d(a).clone().mul_(3).round_(), d(a).clone().mul_(3).trunc_())),
        ("inplace_divs_sub", lambda d: (d(a).clone().div_(3.0), d(a).clone().sub_(d(b)))),
        ("inplace_compare_scalar", lambda d: [getattr(d(a).clone(), f)(0.1) for f in
                                               ("eq_", "ne_", "lt_", "le_", "gt_", "ge_")]),
        ("inplace_compare_tensor", lambda d: [getattr(d(a).clone(), f)(d(b)) for f in
                                               ("ne_", "lt_", "le_", "gt_", "ge_")]),
        ("inplace_functions", lambda d: (d(a).clone().erf_(), d(c).clone().log_(), d(a).clone().neg_(),
                                         d(a).clone().relu_(), d(mask).clone().logical_not_())),
        ("inplace_pow_remainder", lambda d: (d(c).clone().pow_(d(b)), d(i64).clone().remainder_(d(pos)))),
        ("lerp_tensor_weight", lambda d: (torch.lerp(d(a), d(b), d(c) * 0.5), d(a).clone().lerp_(d(b), d(c) * 0.5))),
        ("mm_explicit", lambda d: torch.mm(d(m1), d(m2))),
        ("norm_p_dim", lambda d: torch.norm(d(x4), p=3, dim=1)),
        ("triu_inplace", lambda d: d(a).clone().triu_(1)),
        ("scatter_value_out_of_place", lambda d: torch.scatter(d(a), 1, d(torch.tensor([[0], [1], [2], [3], [4], [0]])),
                                                               -2.0)),
    ]

    # ---- movement and indexing (kernels_index.c) ----
    gidx = torch.randint(0, 5, (6, 3), generator=g)
    kv = torch.zeros(2, 2, 6, 4)
    new = torch.randn(2, 2, 1, 4, generator=g)

    def kv_write(d, how):
        cache = d(kv).clone()
        if how == "index_put":
            cache[:, :, 3] = d(new[:, :, 0])
        elif how == "index_copy":
            cache.index_copy_(2, d(torch.tensor([3])), d(new))
        else:
            cache[:, :, torch.tensor([1, 4], device=cache.device)] = d(new).expand(2, 2, 2, 4)
        return cache

    cases += [
        ("cat_dim0", lambda d: torch.cat([d(a), d(b)], 0)),
        ("cat_dim1_three", lambda d: torch.cat([d(a), d(c), d(b)[:, :2]], 1)),
        ("cat_int64", lambda d: torch.cat([d(i64), d(pos)], 1)),
        ("cat_with_empty", lambda d: torch.cat([d(a), d(torch.empty(0)), d(b)], 0)),
        ("cat_bf16", lambda d: torch.cat([d(a).bfloat16(), d(b).bfloat16()], -1)),
        ("stack_dim0", lambda d: torch.stack([d(a), d(b), d(c)])),
        ("stack_dim2", lambda d: torch.stack([d(a), d(b)], dim=2)),
        ("stack_scalars", lambda d: torch.stack([d(a).sum(), d(b).sum()])),
        ("split_views", lambda d: [t.contiguous() for t in d(x3).split([3, 5], dim=-1)]),
        ("chunk_views", lambda d: [t.contiguous() for t in d(a).chunk(3, 0)]),
        ("pad_constant", lambda d: F.pad(d(a), (1, 2, 0, 1), value=-1.0)),
        ("pad_int64", lambda d: F.pad(d(i64), (0, 3), value=-100)),
        ("pad_crop", lambda d: F.pad(d(a), (-1, 1))),
        ("triu", lambda d: torch.triu(d(a))),
        ("triu_diag1", lambda d: torch.triu(d(a), 1)),
        ("tril_diag_neg", lambda d: torch.tril(d(x4), -1)),
        ("triu_bool", lambda d: torch.triu(torch.ones(5, 7, dtype=torch.bool, device=d(a).device), 2)),
        ("tril_inplace", lambda d: d(a).clone().tril_()),
        ("arange_int", lambda d: torch.arange(3, 17, 2, device=d(a).device)),
        ("arange_float", lambda d: torch.arange(-1.0, 2.0, 0.25, device=d(a).device)),
        ("arange_negative_step", lambda d: torch.arange(10, 0, -3, device=d(a).device)),
        ("arange_mod", lambda d: torch.arange(12, device=d(a).device) % 5),
        ("index_select_dim0", lambda d: torch.index_select(d(a), 0, d(torch.tensor([5, 0, 2, 2])))),
        ("index_select_dim1_int32", lambda d: torch.index_select(d(a), 1, d(torch.tensor([4, 1], dtype=torch.int32)))),
        ("embedding", lambda d: F.embedding(d(ids), d(emb))),
        ("embedding_grad", lambda d: grads(d, lambda w: F.embedding(d(ids), w), emb)),
        ("embedding_grad_padding_idx", lambda d: grads(d, lambda w: F.embedding(d(ids), w, padding_idx=4), emb)),
        ("gather_dim1", lambda d: torch.gather(d(a), 1, d(gidx))),
        ("gather_dim0", lambda d: torch.gather(d(a), 0, d(torch.tensor([[5, 4, 3, 2, 1]])))),
        ("scatter_src", lambda d: torch.zeros(3, 5, device=d(a).device).scatter(1, d(torch.tensor([[4, 0], [1, 2], [3, 3]])),
                                                                             d(a)[:3, :2])),
        ("scatter_value", lambda d: d(a).clone().scatter_(0, d(torch.tensor([[1, 2, 3, 4, 5]])), 9.0)),
        ("scatter_add", lambda d: torch.zeros(3, 5, device=d(a).device).scatter_add(
            0, d(torch.tensor([[0, 1, 2, 0, 1], [0, 0, 1, 1, 2]])), d(a)[:2])),
        ("scatter_int64", lambda d: d(i64).clone().scatter_(1, d(torch.tensor([[0], [2], [4], [1], [3], [0]])),
                                                              d(pos)[:, :1])),
        ("index_copy", lambda d: d(a).clone().index_copy_(0, d(torch.tensor([4, 1])), d(b)[:2])),
        ("index_tensor", lambda d: d(a)[d(torch.tensor([5, 0, 5]))]),
        ("index_dim1", lambda d: d(x4)[:, d(torch.tensor([2, 0]))]),
        ("index_two_dims", lambda d: d(x4)[d(torch.tensor([1, 0])), :, d(torch.tensor([3, 1]))]),
        ("index_adjacent_dims", lambda d: d(x4)[:, d(torch.tensor([0, 2])), d(torch.tensor([1, 3]))]),
        ("index_negative", lambda d: d(a)[d(torch.tensor([-1, -6]))]),
        ("index_put", lambda d: d(a).clone().index_put_((d(torch.tensor([1, 3])),), d(row))),
        ("index_put_accumulate", lambda d: d(a).clone().index_put_((d(torch.tensor([1, 1, 4])),), d(b)[:3],
                                                                    accumulate=True)),
        ("index_put_two_dims", lambda d: d(x4).clone().index_put_((d(torch.tensor([0, 1])), d(torch.tensor([2, 0]))),
                                                                   d(torch.tensor(7.0)))),
        ("kv_cache_write_index_put", lambda d: kv_write(d, "index_put")),
        ("kv_cache_write_index_copy", lambda d: kv_write(d, "index_copy")),
        ("kv_cache_write_index_tensor", lambda d: kv_write(d, "index")),
        ("masked_scatter_assign", lambda d: (lambda t: (t.__setitem__(d(mask), 0.5), t)[1])(d(a).clone())),
        ("flip", lambda d: d(x4).flip(0, 3)),
        ("flip_int64", lambda d: d(i64).flip(1)),
        ("repeat", lambda d: d(x3).repeat(2, 1, 3)),
        ("repeat_new_dims", lambda d: d(row).repeat(3, 2)),
        ("repeat_expand_contiguous", lambda d: d(x3)[:, :, None].expand(2, 3, 2, 8).reshape(2, 6, 8).contiguous()),
    ]

    # ---- reductions, ordering, sampling (kernels_reduce.c) ----
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.5], [2.0, 2.0, 2.0, 2.0]])
    cases += [
        ("max_all", lambda d: d(a).max()),
        ("min_all_int64", lambda d: d(i64).min()),
        ("max_dim", lambda d: d(a).max(dim=1)),
        ("min_dim_keepdim", lambda d: d(a).min(dim=0, keepdim=True)),
        ("argmax_dim", lambda d: d(a).argmax(dim=-1)),
        ("argmax_flat", lambda d: d(a).argmax()),
        ("argmax_ties_first", lambda d: d(ties).argmax(dim=1)),
        ("argmin_dim", lambda d: d(a).argmin(dim=0)),
        ("argmax_bf16", lambda d: d(a).bfloat16().argmax(-1)),
        ("amax", lambda d: torch.amax(d(x4), dim=(1, 3))),
        ("amin_keepdim", lambda d: torch.amin(d(x4), dim=2, keepdim=True)),
        ("any_dim", lambda d: d(mask).any(dim=1)),
        ("all_dim", lambda d: (d(a) > -2).all(dim=0)),
        ("any_all", lambda d: (d(mask).any(), d(mask).all())),
        ("cumsum_int64", lambda d: torch.cumsum(d(i64), 1)),
        ("cumsum_float_dim0", lambda d: torch.cumsum(d(a), 0)),
        ("cumsum_bool", lambda d: torch.cumsum(d(mask), 1)),
        ("norm_2", lambda d: torch.norm(d(a))),
        ("norm_1_dim", lambda d: torch.norm(d(a), p=1, dim=1)),
        ("vector_norm_2_dims", lambda d: torch.linalg.vector_norm(d(x4), dim=(0, 2))),
        ("vector_norm_0", lambda d: torch.linalg.vector_norm(d(a).round(), ord=0, dim=1)),
        ("vector_norm_3", lambda d: torch.linalg.vector_norm(d(a), ord=3)),
        ("topk_largest", lambda d: torch.topk(d(a), 3, dim=1)),
        ("topk_smallest_dim0", lambda d: torch.topk(d(a), 2, dim=0, largest=False)),
        ("topk_int64", lambda d: torch.topk(d(i64), 2)),
        ("sort_ascending", lambda d: torch.sort(d(a), dim=1)),
        ("sort_descending_stable", lambda d: torch.sort(d(ties), dim=1, descending=True, stable=True)),
        ("sort_int64_dim0", lambda d: torch.sort(d(i64), dim=0, stable=True)),
        ("top_p_filter", lambda d: top_p(d(probs.log()), 0.8)),
    ]

    # ---- fused LLM operators (kernels_llm.c) ----
    rms_w = torch.rand(8, generator=g) + 0.5
    cos_, sin_ = torch.randn(1, 4, 1, 8, generator=g), torch.randn(1, 4, 1, 8, generator=g)
    xr = torch.randn(2, 4, 3, 8, generator=g)

    def rms_ref(x, w, eps=1e-6):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rot_half(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], -1)

    def rot_inter(x):
        return torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)

    cases += [
        ("layer_norm_no_affine", lambda d: F.layer_norm(d(x4), (4, 8))),
        ("layer_norm_grad", lambda d: grads(d, lambda x, w, bb: F.layer_norm(x, (8,), w, bb), x3, x3[0, 0], x3[1, 1])),
        ("layer_norm_grad_bf16", lambda d: grads(lambda t: d(t).bfloat16(), lambda x, w, bb: F.layer_norm(x, (8,), w, bb),
                                                 x3, x3[0, 0], x3[1, 1])),
        ("npu_rms_norm", lambda d: torch_npu.npu_rms_norm(d(x3), d(rms_w), 1e-6)[0] if d is npu else rms_ref(x3, rms_w)),
        ("npu_rms_norm_grad", lambda d: grads(d, (lambda x, w: torch_npu.npu_rms_norm(x, w, 1e-6)[0]) if d is npu
                                              else rms_ref, x3, rms_w)),
        ("npu_rms_norm_bf16", lambda d: (torch_npu.npu_rms_norm(d(x3).bfloat16(), d(rms_w).bfloat16())[0] if d is npu
                                         else rms_ref(x3.bfloat16().float(), rms_w.bfloat16().float()).bfloat16())),
        ("npu_rotary_mul_half", lambda d: torch_npu.npu_rotary_mul(d(xr), d(cos_), d(sin_)) if d is npu
         else xr * cos_ + rot_half(xr) * sin_),
        ("npu_rotary_mul_interleave", lambda d: torch_npu.npu_rotary_mul(d(xr), d(cos_), d(sin_), "interleave")
         if d is npu else xr * cos_ + rot_inter(xr) * sin_),
        ("npu_rotary_mul_grad", lambda d: grads(d, (lambda x, cc, ss: torch_npu.npu_rotary_mul(x, cc, ss)) if d is npu
                                                else (lambda x, cc, ss: x * cc + rot_half(x) * ss), xr, cos_, sin_)),
        ("npu_swiglu", lambda d: torch_npu.npu_swiglu(d(x3)) if d is npu
         else F.silu(x3[..., :4]) * x3[..., 4:]),
        ("npu_swiglu_dim0", lambda d: torch_npu.npu_swiglu(d(x4), dim=0) if d is npu
         else F.silu(x4[:1]) * x4[1:]),
        ("npu_swiglu_grad", lambda d: grads(d, (lambda x: torch_npu.npu_swiglu(x)) if d is npu
                                            else (lambda x: F.silu(x[..., :4]) * x[..., 4:]), x3)),
    ]

    # attention: SDPA (torch_npu: aclnnFlashAttentionScore) and npu_fusion_attention
    q = torch.randn(2, 4, 6, 8, generator=g)
    k = torch.randn(2, 4, 6, 8, generator=g)
    v = torch.randn(2, 4, 6, 8, generator=g)
    k2, v2 = k[:, :2].clone(), v[:, :2].clone()
    kl, vl = torch.randn(2, 4, 9, 8, generator=g), torch.randn(2, 4, 9, 8, generator=g)
    amask = torch.rand(2, 1, 6, 6, generator=g) > 0.3
    amask[..., 0] = True   # no fully masked row
    rowmask = torch.zeros(6, 6, dtype=torch.bool)
    rowmask[0] = True
    rowmask[2, 3:] = True

    def attn_ref(qq, kk, vv, drop=None, scale=None):
        """softmax(q k^T * scale, masked where drop is True) v, GQA by repetition"""
        rep = qq.shape[1] // kk.shape[1]
        kk, vv = kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1)
        s = (qq @ kk.transpose(-1, -2)) * (scale if scale is not None else qq.shape[-1] ** -0.5)
        if drop is not None:
            s = s.masked_fill(drop, float("-inf"))
        return torch.softmax(s, -1) @ vv

    def causal(sq, sk, shift=0):
        return torch.triu(torch.ones(sq, sk, dtype=torch.bool), 1 + shift)

    def bsh(t):
        return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)

    def fusion(d, qq, kk, vv, layout, **kw):
        if d is npu:
            conv = {"BNSD": lambda t: t, "BSH": bsh, "BSND": lambda t: t.transpose(1, 2).contiguous(),
                    "SBH": lambda t: bsh(t).transpose(0, 1).contiguous()}[layout]
            out = torch_npu.npu_fusion_attention(conv(d(qq)), conv(d(kk)), conv(d(vv)), qq.shape[1], layout,
                                                 scale=qq.shape[-1] ** -0.5, **kw)[0]
            back = {"BNSD": lambda t: t, "BSH": lambda t: t.reshape(t.shape[0], t.shape[1], qq.shape[1], -1)
                    .transpose(1, 2), "BSND": lambda t: t.transpose(1, 2),
                    "SBH": lambda t: t.transpose(0, 1).reshape(qq.shape[0], qq.shape[2], qq.shape[1], -1)
                    .transpose(1, 2)}[layout]
            return back(out)
        sm = kw.get("sparse_mode", 0)
        drop = None
        if "atten_mask" in kw:
            sq, sk = qq.shape[2], kk.shape[2]
            drop = {0: kw["atten_mask"], 1: kw["atten_mask"], 2: causal(sq, sk), 3: causal(sq, sk, sk - sq)}[sm]
        return attn_ref(qq, kk, vv, drop)

    big_causal = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        s = {torch.float32: "", torch.bfloat16: "_bf16", torch.float16: "_f16"}[dt]
        cases += [
            ("sdpa_causal" + s, half(lambda d: F.scaled_dot_product_attention(d(q), d(k), d(v), is_causal=True), dt)),
            ("sdpa_causal_grad" + s, lambda d, dt=dt: grads(
                lambda t: d(t).to(dt), lambda x, y, z: F.scaled_dot_product_attention(x, y, z, is_causal=True),
                q, k, v)),
        ]
    cases += [
        ("sdpa_no_mask", lambda d: F.scaled_dot_product_attention(d(q), d(k), d(v))),
        ("sdpa_bool_mask", lambda d: F.scaled_dot_product_attention(d(q), d(k), d(v), attn_mask=d(amask))),
        ("sdpa_bool_mask_grad", lambda d: grads(d, lambda x, y, z: F.scaled_dot_product_attention(
            x, y, z, attn_mask=d(amask)), q, k, v)),
        ("sdpa_float_mask", lambda d: F.scaled_dot_product_attention(
            d(q), d(k), d(v), attn_mask=d(torch.zeros(6, 6).masked_fill(causal(6, 6), float("-inf"))))),
        ("sdpa_scale", lambda d: F.scaled_dot_product_attention(d(q), d(k), d(v), is_causal=True, scale=0.1)),
        ("sdpa_gqa", lambda d: F.scaled_dot_product_attention(d(q), d(k2), d(v2), is_causal=True, enable_gqa=True)),
        ("sdpa_gqa_grad", lambda d: grads(d, lambda x, y, z: F.scaled_dot_product_attention(
            x, y, z, is_causal=True, enable_gqa=True), q, k2, v2)),
        ("sdpa_decode_step", lambda d: F.scaled_dot_product_attention(d(q[:, :, -1:]), d(kl), d(vl))),
        ("fusion_bnsd_causal", lambda d: fusion(d, q, k, v, "BNSD", atten_mask=d(big_causal), sparse_mode=2,
                                                next_tockens=0)),
        ("fusion_bsh_causal", lambda d: fusion(d, q, k, v, "BSH", atten_mask=d(big_causal), sparse_mode=2,
                                               next_tockens=0)),
        # npu_fusion_attention's mask: True = masked out (SDPA's: True = attend)
        ("fusion_bsnd_mask", lambda d: fusion(d, q, k, v, "BSND", atten_mask=d(~amask))),
        # a fully masked row (row 0) gives zeros, as PyTorch's _safe_softmax
        ("fusion_fully_masked_row", lambda d: fusion(d, q, k, v, "BNSD", atten_mask=d(rowmask)) if d is npu
         else torch.cat([torch.zeros(2, 4, 1, 8), attn_ref(q, k, v, rowmask)[:, :, 1:]], 2)),
        ("fusion_sbh_gqa", lambda d: fusion(d, q, k2, v2, "SBH", atten_mask=d(big_causal), sparse_mode=2)),
        ("fusion_right_down_causal", lambda d: fusion(d, q, kl, vl, "BNSD", atten_mask=d(big_causal), sparse_mode=3)),
        ("fusion_no_mask", lambda d: fusion(d, q, kl, vl, "BNSD")),
    ]

    failed = 0
    for name, fn in cases:
        try:
            refs, gots = flat(fn(cpu)), flat(fn(npu))
            diff, ok = 0.0, len(refs) == len(gots)
            for r, x in zip(refs, gots):
                x = x.detach().cpu()
                r = r.detach()
                if r.shape != x.shape or r.dtype != x.dtype:
                    ok = False
                    print(f"  {name}: shape/dtype {tuple(x.shape)} {x.dtype} vs CPU {tuple(r.shape)} {r.dtype}")
                    continue
                if r.dtype.is_floating_point:
                    tol = TOL[r.dtype] * (10 if "norm" in name or "cumsum" in name else 1)
                    dd = (r.double() - x.double()).abs()
                    dd = dd[~(r.isnan() & x.isnan())] if dd.numel() else dd
                    diff = max(diff, dd[dd.isfinite()].max().item() if dd.numel() and dd.isfinite().any() else 0.0)
                    ok = ok and torch.allclose(r.double(), x.double(), rtol=tol, atol=tol, equal_nan=True)
                else:
                    ok = ok and torch.equal(r, x)
                    diff = max(diff, float((r != x).sum().item()))
            print(f"case={name} maxdiff={diff:.3e} ok={int(ok)}", flush=True)
        except Exception as e:  # a failing case is reported, the others still run
            ok = False
            print(f"case={name} error={type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} ok=0",
                  flush=True)
        failed += not ok

    # sampling: no device reproduces the CPU's random stream, so
    # torch.multinomial is checked by what it must do
    for name, check in [("multinomial_distribution", check_multinomial), ("multinomial_no_replacement",
                                                                          check_multinomial_unique)]:
        ok, detail = check(probs)
        print(f"case={name} {detail} ok={int(ok)}", flush=True)
        failed += not ok

    # refusals: configurations the simulator cannot compute raise (never
    # made-up numbers), naming the operator on stderr. An aclnn refusal comes
    # from GetWorkspaceSize (161002) and torch_npu carries on; an aclop
    # fallback is refused at launch, which stops torch_npu's task queue for
    # the rest of the process — so exactly one of those, last.
    refusals = [
        ("refuse_fusion_pse", lambda: torch_npu.npu_fusion_attention(
            npu(q), npu(k), npu(v), 4, "BNSD", pse=npu(torch.zeros(2, 4, 6, 6)), scale=0.3)[0].cpu()),
        ("refuse_fusion_prefix_mode", lambda: torch_npu.npu_fusion_attention(
            npu(q), npu(k), npu(v), 4, "BNSD", atten_mask=npu(amask.expand(2, 4, 6, 6).contiguous()),
            scale=0.3, sparse_mode=5, prefix=[2, 3])[0].cpu()),
        # an element type the operator does not compute: int64 matrix products
        ("refuse_int64_matmul", lambda: (npu(i64) @ npu(i64).t()).cpu()),
        # torch_npu falls back to the aclop NonZero (no aclnnNonzero: its
        # output shape is only known after the kernel ran); raised at once
        ("refuse_bool_mask_index", lambda: npu(a)[npu(mask)].cpu()),
    ]
    for name, fn in refusals:
        try:
            r = fn()
            print(f"case={name} refused=0 got={r.flatten()[:4].tolist()} ok=0", flush=True)
            failed += 1
        except Exception as e:  # the refusal surfaces as torch_npu's error
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            print(f"case={name} refused=1 error={msg[:160]!r} ok=1", flush=True)
    # torch_npu carried on after those
    ok = torch.allclose((npu(a) + npu(b)).cpu(), a + b)
    print(f"case=after_refusals ok={int(ok)}", flush=True)
    failed += not ok
    total = len(cases) + 2 + len(refusals) + 1
    print(f"cases={total} failed={failed}", flush=True)
    print("kernels=" + ",".join(kernel_names()), flush=True)
    return 1 if failed else 0


def flat(x):
    """the tensors of nested lists and tuples, in order"""
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in flat(e)]
    return [x]


def top_p(logits, p):
    """transformers' TopPLogitsWarper: sort, softmax, cumsum, scatter back"""
    sorted_logits, sorted_idx = torch.sort(logits, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cum <= (1 - p)
    remove[..., -1:] = 0
    remove = remove.scatter(1, sorted_idx, remove)
    return logits.masked_fill(remove, -float("inf"))


def check_multinomial(probs):
    """20000 draws per row with replacement: every frequency within 5 sigma
    of its probability, and the same draws again from the same seed"""
    n = 20000
    torch.npu.manual_seed(11)
    s1 = torch.multinomial(probs.to("npu"), n, replacement=True).cpu()
    torch.npu.manual_seed(11)
    s2 = torch.multinomial(probs.to("npu"), n, replacement=True).cpu()
    worst = 0.0
    for r in range(probs.shape[0]):
        freq = torch.bincount(s1[r], minlength=probs.shape[1]).double() / n
        sigma = (probs[r].double() * (1 - probs[r].double()) / n).sqrt()
        worst = max(worst, ((freq - probs[r].double()).abs() / sigma).max().item())
    return worst < 5 and torch.equal(s1, s2), f"worst_sigma={worst:.2f} repeatable={int(torch.equal(s1, s2))}"


def check_multinomial_unique(probs):
    """without replacement: distinct categories, never a zero-probability one"""
    p = probs.clone()
    p[:, 3] = 0
    s = torch.multinomial(p.to("npu"), 9, replacement=False).cpu()
    distinct = all(len(set(row.tolist())) == 9 for row in s)
    return distinct and not (s == 3).any().item(), f"distinct={int(distinct)}"


if __name__ == "__main__":
    sys.exit(main())
