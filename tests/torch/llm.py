#!/usr/bin/env python3
"""Small language models from `transformers` (random initialisation, nothing
downloaded), trained and then used for greedy generation, unmodified code that
runs on any device: `--device cpu` is the reference, `--device npu` runs
torch_npu (here: on the simulated CANN runtime, see docs/torch-npu.md).

  --model llama  LlamaForCausalLM: RMS norm, rotary position embedding,
                 grouped-query attention through SDPA, SwiGLU MLP
  --model gpt2   GPT2LMHeadModel: layer norm, GELU (tanh), learned positions

The weights and the data are generated on the CPU from fixed seeds and then
moved with .to(device), so both runs start from identical bits. Training:
`--steps` AdamW steps on next-token prediction (transformers' own loss:
shifted cross entropy), `--autocast bf16` under torch.autocast. Then greedy
generation of `--gen` tokens with the KV cache (`--cache dynamic`: the cache
grows by torch.cat; `static`: a preallocated cache written with index_copy_).

Output (stdout):
    step=0 loss=5.5412345678
    ...
    tokens=12,200,7,...            (the generated tokens, prompt excluded)
    done model=llama device=npu steps=5 gen=16 wall_s=...
"""
import argparse
import os
import sys
import time

import torch


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
    # the scaled-dot-product-attention path (aclnnFlashAttentionScore on torch_npu)
    model.config._attn_implementation = "sdpa"
    return model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama", help="llama or gpt2")
    ap.add_argument("--device", default="cpu", help="cpu or npu")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--gen", type=int, default=16, help="tokens to generate (0: none)")
    ap.add_argument("--cache", default="dynamic", help="dynamic or static KV cache")
    ap.add_argument("--autocast", default="", help="bf16: train under torch.autocast(bfloat16)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    if args.device.startswith("npu"):
        import torch_npu  # noqa: F401  (registers the 'npu' device)
    dev = torch.device(args.device)
    t0 = time.time()

    torch.manual_seed(args.seed)
    model = build(args.model, args).to(dev)  # weights made on the CPU, then moved
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    # data with structure to learn: each sequence counts up from a random start
    gen = torch.Generator().manual_seed(args.seed + 1)
    starts = torch.randint(0, args.vocab, (args.batch, 1), generator=gen)
    steps = torch.randint(1, 4, (args.batch, 1), generator=gen)
    data = (starts + steps * torch.arange(args.seq)) % args.vocab

    model.train()
    for step in range(args.steps):
        ids = data.to(dev)
        opt.zero_grad(set_to_none=True)
        if args.autocast == "bf16":
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
        else:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        print(f"step={step} loss={loss.detach().float().cpu().item():.10f}", flush=True)

    if args.gen > 0:
        model.eval()
        prompt = data[:1, : args.prompt].to(dev)
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=args.gen, min_new_tokens=args.gen, do_sample=False,
                                 use_cache=True, cache_implementation=None if args.cache == "dynamic" else "static",
                                 pad_token_id=0)
        toks = out[0, args.prompt:].cpu().tolist()
        print("tokens=" + ",".join(str(t) for t in toks), flush=True)

    if dev.type != "cpu":
        torch.npu.synchronize()
    print(f"done model={args.model} device={args.device} steps={args.steps} gen={args.gen} "
          f"wall_s={time.time() - t0:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sys.exit(main())
