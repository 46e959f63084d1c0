#!/usr/bin/env python3
"""A small MLP trained with torch.optim.AdamW, unmodified PyTorch code that runs
on any device: `--device cpu` for the reference run, `--device npu` for
torch_npu (here: on the simulated CANN runtime, see docs/torch-npu.md).

A few distinct batches are cycled, so the loss falls step by step.
Deterministic: the data and the initial weights are generated on the CPU from
fixed seeds and then moved with .to(device), so the CPU and NPU runs start from
identical bits and their losses can be compared step by step. The model lives
on the device; labels are created on the device directly; the loss is brought
back with .cpu() every step.

Output (stdout), one line per step, then a summary:
    step=0 loss=2.3145210743
    ...
    final_loss=... param_checksum=... steps=N device=npu
"""
import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", help="cpu or npu")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batches", type=int, default=4, help="distinct batches, cycled")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--in-dim", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-pin", action="store_true", help="keep the batches in pageable memory")
    args = ap.parse_args()

    if args.device.startswith("npu"):
        import torch_npu  # noqa: F401  (registers the 'npu' device)
    dev = torch.device(args.device)
    t0 = time.time()

    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(args.in_dim, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.GELU(),
        nn.Linear(args.hidden, args.classes),
    )
    model = model.to(dev)  # weights made on the CPU from the seed, then moved
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    gen = torch.Generator().manual_seed(args.seed + 1)
    xs = torch.randn(args.batches, args.batch, args.in_dim, generator=gen)
    ys = torch.randint(0, args.classes, (args.batches, args.batch), generator=gen)
    # a learned-by-construction target: the label also depends on the input
    ys = (ys + (xs[:, :, 0] > 0).long()) % args.classes
    pinned = dev.type != "cpu" and not args.no_pin
    if pinned:
        # page-locked host batches (torch_npu: aclrtMallocHost), copied to the
        # device asynchronously (aclrtMemcpyAsync on the current stream)
        xs, ys = xs.pin_memory(), ys.pin_memory()

    for step in range(args.steps):
        b = step % args.batches
        x = xs[b].to(dev, non_blocking=pinned)
        # labels built on the device: a zero tensor created there plus the data
        y = torch.zeros(args.batch, dtype=torch.long, device=dev) + ys[b].to(dev, non_blocking=pinned)
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        print(f"step={step} loss={loss.detach().cpu().item():.10f}", flush=True)

    if dev.type != "cpu":
        torch.npu.synchronize()
    final = loss.detach().cpu().item()
    checksum = sum(float(p.detach().cpu().double().sum()) for p in model.parameters())
    print(f"final_loss={final:.10f} param_checksum={checksum:.10f} steps={args.steps} device={args.device} "
          f"wall_s={time.time() - t0:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
