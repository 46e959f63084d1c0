#!/usr/bin/env python3
"""Runs a list of PyTorch operations on the CPU and on 'npu' (torch_npu on the
simulated runtime) in one process and compares the results: every operator
the simulator adds for torch_npu, plus the dtype, broadcasting, in-place and
strided-view cases the training loop does not reach.

Output: one line per case, `case=<name> maxdiff=<x> ok=<0|1>`, then
`cases=N failed=M`. Exit status 0 when every case matches (float32 within
rtol/atol 1e-5, integers exactly), 1 otherwise.
"""
import sys

import torch
import torch.nn.functional as F
import torch_npu  # noqa: F401


def main() -> int:
    g = torch.Generator().manual_seed(7)
    a = torch.randn(6, 5, generator=g)
    b = torch.randn(6, 5, generator=g)
    c = torch.rand(6, 5, generator=g) + 0.5
    row = torch.randn(5, generator=g)
    i64 = torch.randint(-50, 50, (6, 5), generator=g)
    i32 = i64.int()
    tgt = torch.randint(0, 5, (6,), generator=g)
    tgt_ign = tgt.clone()
    tgt_ign[2] = -100
    w5 = torch.rand(5, generator=g) + 0.5
    m1, m2 = torch.randn(4, 7, generator=g), torch.randn(7, 3, generator=g)
    bias = torch.randn(3, generator=g)

    def npu(t):
        return t.to("npu")

    cases = [
        ("add_alpha", lambda d: d(a).add(d(b), alpha=0.5)),
        ("add_broadcast_row", lambda d: d(a) + d(row)),
        ("adds", lambda d: d(a) + 2.25),
        ("sub", lambda d: d(a) - d(b)),
        ("subs_alpha", lambda d: torch.sub(d(a), 1.5, alpha=2)),
        ("rsub", lambda d: 1.0 - d(a)),
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
        ("sum_all", lambda d: d(a).sum()),
        ("sum_dim0", lambda d: d(a).sum(0)),
        ("sum_dim1_keepdim", lambda d: d(a).sum(1, keepdim=True)),
        ("sum_int64", lambda d: d(i64).sum(0)),
        ("mm", lambda d: d(m1) @ d(m2)),
        ("mm_transposed_view", lambda d: d(m2).t() @ d(m1).t()),
        ("addmm", lambda d: torch.addmm(d(bias), d(m1), d(m2), beta=0.5, alpha=2.0)),
        ("linear", lambda d: F.linear(d(m1), d(m2).t(), d(bias))),
        ("addcmul", lambda d: torch.addcmul(d(a), d(b), d(c), value=0.5)),
        ("addcdiv", lambda d: torch.addcdiv(d(a), d(b), d(c), value=-0.25)),
        ("lerp", lambda d: torch.lerp(d(a), d(b), 0.3)),
        ("cast_f32_to_i64", lambda d: (d(a) * 10).long()),
        ("cast_i64_to_f32", lambda d: d(i64).float()),
        ("cast_i32_to_i64", lambda d: d(i32).long()),
        ("int64_add", lambda d: d(i64) + d(i64)),
        ("int64_mul_scalar", lambda d: d(i64) * 3),
        ("int32_sub", lambda d: d(i32) - d(i32) * 2),
        ("contiguous_of_transpose", lambda d: d(a).t().contiguous()),
        ("slice_copy", lambda d: d(a)[1:4, ::2].contiguous()),
        ("zeros_like", lambda d: torch.zeros_like(d(a))),
        ("ones", lambda d: torch.ones(3, 4, device=d(a).device)),
        ("full_int", lambda d: torch.full((5,), 7, dtype=torch.long, device=d(a).device)),
        ("fill_", lambda d: d(a).clone().fill_(1.5)),
        ("inplace_chain", lambda d: d(a).clone().mul_(2).add_(d(b)).sub_(1).div_(d(c))),
        ("foreach_mul", lambda d: torch._foreach_mul([d(a), d(b)], 0.5)),
        ("foreach_add_list", lambda d: torch._foreach_add([d(a), d(b)], [d(b), d(c)], alpha=2.0)),
        ("foreach_lerp", lambda d: torch._foreach_lerp([d(a), d(b)], [d(b), d(c)], 0.1)),
        ("foreach_addcmul", lambda d: torch._foreach_addcmul([d(a), d(b)], [d(b), d(c)], [d(c), d(a)], 0.2)),
        ("foreach_addcdiv_list", lambda d: torch._foreach_addcdiv([d(a), d(b)], [d(b), d(a)], [d(c), d(c)], [0.5, -2.0])),
        ("foreach_sqrt", lambda d: torch._foreach_sqrt([d(c), d(c) * 2])),
        ("foreach_div_list", lambda d: torch._foreach_div([d(a), d(b)], [2.0, 4.0])),
    ]

    def grad_of(d, loss_fn):
        x = d(a).clone().requires_grad_()
        loss_fn(x).backward()
        return x.grad

    def adamw(d, fused, amsgrad=False):
        p = torch.nn.Parameter(d(a).clone())
        # the reference is the CPU's multi-tensor path; the NPU uses fused
        # (aclnnApplyAdamWV2) when asked
        opt = torch.optim.AdamW([p], lr=0.01, weight_decay=0.1, amsgrad=amsgrad, fused=fused and d is npu)
        for k in range(3):
            p.grad = d(b).clone() * (k + 1)
            opt.step()
        return p.detach()

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
    ]

    failed = 0
    for name, fn in cases:
        try:
            ref = fn(lambda t: t)
            got = fn(npu)
            refs = ref if isinstance(ref, (list, tuple)) else [ref]
            gots = got if isinstance(got, (list, tuple)) else [got]
            diff, ok = 0.0, len(refs) == len(gots)
            for r, x in zip(refs, gots):
                x = x.detach().cpu()
                if r.shape != x.shape or r.dtype != x.dtype:
                    ok = False
                    continue
                if r.dtype.is_floating_point:
                    d = (r.double() - x.double()).abs()
                    diff = max(diff, d.max().item() if d.numel() else 0.0)
                    ok = ok and torch.allclose(r, x, rtol=1e-5, atol=1e-5, equal_nan=True)
                else:
                    ok = ok and torch.equal(r, x)
                    diff = max(diff, float((r != x).sum().item()))
            print(f"case={name} maxdiff={diff:.3e} ok={int(ok)}", flush=True)
        except Exception as e:  # a failing case is reported, the others still run
            ok = False
            print(f"case={name} error={type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} ok=0",
                  flush=True)
        failed += not ok
    print(f"cases={len(cases)} failed={failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
