#!/usr/bin/env python3
"""Small language models from `transformers` (random initialisation, nothing
downloaded), trained and then used for greedy generation — unmodified code
that runs on any device: `cpu` is the reference, `npu` runs torch_npu (here:
on the simulated CANN runtime, see docs/torch-npu.md).

  llama  LlamaForCausalLM: RMS norm, rotary position embedding, grouped-query
         attention (4 query heads, 2 key/value heads) through SDPA, SwiGLU MLP
  gpt2   GPT2LMHeadModel: layer norm, GELU (tanh), learned positions

Every (model, device, run) starts from the same weights: they are generated
on the CPU from a fixed seed and moved with .to(device). A run:
  f32   greedy generation of `--gen` tokens from the initial weights, then
        `--steps` AdamW steps (transformers' shifted cross-entropy loss,
        gradient clipping), then greedy generation again — each with every
        KV cache of `--caches`: `dynamic` grows by torch.cat, `static` is
        preallocated and written with index_copy_; with `--sample`, also
        sampling (top-k 4, top-p 0.9, temperature 0.8) whose every token
        is checked against the top 4 of a CPU copy's logits
  bf16  the same training under torch.autocast(bfloat16)

Several models, devices and runs share one process (one import of torch,
torch_npu and transformers). Output (stdout), one line per result:
    model=llama device=npu run=f32 grad_norms=1.2e-01,...   (first step, per parameter)
    model=llama device=npu run=f32 step=0 loss=5.5966224670
    model=llama device=npu run=f32 when=init cache=dynamic tokens=12,200,...
    model=llama device=npu run=f32 when=trained cache=dynamic tokens=227,230,...
    model=llama device=npu run=f32 sample tokens=... in_top4=1
    model=llama device=npu run=f32 step=1 step_sim_ms=3.2100   (--timing)
    model=llama device=npu run=f32 when=trained cache=dynamic decode_sim_ms=... tokens_generated=16
    model=llama device=npu run=f32 train_mem_peak=... decode_mem_peak=... mem_reserved=...   (bytes)
    model=llama device=npu run=f32 oom=1      (--expect-oom: the run ran out of
                                               device memory, as expected)
    done wall_s=...
"""
import argparse
import os
import sys
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402


def build(kind: str, args):
    import transformers

    common = dict(vocab_size=args.vocab, tie_word_embeddings=False)
    if kind == "llama":
        cfg = transformers.LlamaConfig(
            hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4, num_hidden_layers=args.layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=args.seq + args.gen + 8,
            rms_norm_eps=1e-6, attention_dropout=0.0, **common)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=args.hidden, n_layer=args.layers, n_head=4, n_positions=args.seq + args.gen + 8,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        raise SystemExit(f"unknown model {kind}")
    # scaled_dot_product_attention (aclnnFlashAttentionScore on torch_npu)
    model.config._attn_implementation = "sdpa"
    return model


def data_for(args):
    # structure to learn: each sequence counts up from a random start
    gen = torch.Generator().manual_seed(args.seed + 1)
    starts = torch.randint(0, args.vocab, (args.batch, 1), generator=gen)
    steps = torch.randint(1, 4, (args.batch, 1), generator=gen)
    return (starts + steps * torch.arange(args.seq)) % args.vocab


class DeviceTimer:
    """Device time between two points of the current stream (torch.npu.Event
    with timing; on the simulator: simulated milliseconds). Off on the CPU."""

    def __init__(self, dev, on):
        self.on = on and dev.type == "npu"

    def __enter__(self):
        if self.on:
            self.t0 = torch.npu.Event(enable_timing=True)
            self.t1 = torch.npu.Event(enable_timing=True)
            self.t0.record()
        return self

    def __exit__(self, *exc):
        if self.on:
            self.t1.record()
            self.t1.synchronize()
            self.ms = self.t0.elapsed_time(self.t1)


def generate(model, dev, data, args, when, emit):
    model.eval()
    prompt = data[:1, : args.prompt].to(dev)
    for cache in args.caches.split(","):
        with torch.no_grad(), DeviceTimer(dev, args.timing) as t:
            out = model.generate(prompt, max_new_tokens=args.gen, min_new_tokens=args.gen, do_sample=False,
                                 use_cache=True, cache_implementation=None if cache == "dynamic" else cache,
                                 pad_token_id=0)
        emit(f"when={when} cache={cache} tokens=" + ",".join(str(t) for t in out[0, args.prompt:].cpu().tolist()))
        if t.on:
            emit(f"when={when} cache={cache} decode_sim_ms={t.ms:.4f} tokens_generated={args.gen}")


def sample(model, dev, data, args, emit):
    """The sampling path of generation (logits processors, softmax,
    multinomial): each sampled token must be among the 4 most likely of a CPU
    copy of the model at its position (the sampler cannot be compared token
    by token: no device reproduces the CPU's random stream)."""
    import copy

    model.eval()
    prompt = data[:1, : args.prompt].to(dev)
    torch.manual_seed(args.seed + 2)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=args.gen, min_new_tokens=args.gen, do_sample=True, top_k=4,
                             top_p=0.9, temperature=0.8, use_cache=True, pad_token_id=0)
        seq = out[0].cpu()
        ref = copy.deepcopy(model).to("cpu")
        logits = ref(seq[None, :-1]).logits[0]
    ok = all(int(seq[p]) in logits[p - 1].topk(4).indices.tolist() for p in range(args.prompt, len(seq)))
    emit("sample tokens=" + ",".join(str(t) for t in seq[args.prompt:].tolist()) + f" in_top4={int(ok)}")


def one_run(kind: str, dev: torch.device, run: str, args, emit):
    torch.manual_seed(args.seed)
    model = build(kind, args).to(dev)  # weights made on the CPU, then moved
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    data = data_for(args)
    if run == "f32" and args.gen > 0:
        generate(model, dev, data, args, "init", emit)
    model.train()
    for step in range(args.steps):
        ids = data.to(dev)
        with DeviceTimer(dev, args.timing) as t:
            opt.zero_grad(set_to_none=True)
            if run == "bf16":
                with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                    loss = model(input_ids=ids, labels=ids).loss
            else:
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            if step == 0:
                # every parameter's gradient, compared one by one (AdamW's
                # update hides a gradient off by a constant factor from the losses)
                emit("grad_norms=" + ",".join(f"{p.grad.float().norm().item():.8e}" for p in model.parameters()))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        emit(f"step={step} loss={loss.detach().float().cpu().item():.10f}")
        if t.on:
            emit(f"step={step} step_sim_ms={t.ms:.4f}")
    if args.timing and dev.type == "npu":
        # the bytes a step can touch: the live tensors at the step's peak
        torch.npu.synchronize()
        emit(f"train_mem_peak={torch.npu.max_memory_allocated()}")
        torch.npu.reset_peak_memory_stats()
    if run == "f32" and args.gen > 0:
        generate(model, dev, data, args, "trained", emit)
        if args.timing and dev.type == "npu":
            emit(f"decode_mem_peak={torch.npu.max_memory_allocated()}")
        if args.sample:
            sample(model, dev, data, args, emit)
    if dev.type != "cpu":
        torch.npu.synchronize()
        if args.timing:
            emit(f"mem_reserved={torch.npu.memory_reserved()}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama", help="comma list: llama, gpt2")
    ap.add_argument("--devices", default="cpu", help="comma list: cpu, npu")
    ap.add_argument("--runs", default="f32", help="comma list: f32, bf16")
    ap.add_argument("--caches", default="dynamic", help="comma list: dynamic, static")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--gen", type=int, default=16, help="tokens to generate (0: none)")
    ap.add_argument("--sample", action="store_true", help="also sample (f32 runs)")
    ap.add_argument("--timing", action="store_true",
                    help="device time of each training step and of each generation (npu: simulated ms)")
    ap.add_argument("--expect-oom", action="store_true",
                    help="a run that runs out of device memory prints oom=1 and the next one starts")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    t0 = time.time()
    devices = args.devices.split(",")
    if any(d.startswith("npu") for d in devices):
        import torch_npu  # noqa: F401  (registers the 'npu' device)
    for kind in args.models.split(","):
        for d in devices:
            for run in args.runs.split(","):
                prefix = f"model={kind} device={d} run={run}"
                try:
                    one_run(kind, torch.device(d), run, args, lambda s: print(f"{prefix} {s}", flush=True))
                except torch.OutOfMemoryError as e:
                    if not args.expect_oom:
                        raise
                    print(f"{prefix} oom=1 error={str(e).splitlines()[0][:120]!r}", flush=True)
    print(f"done wall_s={time.time() - t0:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
