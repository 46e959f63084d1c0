#!/usr/bin/env python3
"""Llama-shaped training traces in the u3m trace format (trace-format.md v1).

One device, one stream. Every tensor a training step keeps is an allocation
(A) made before the first step and never freed, as a framework with a static
memory plan does (MindSpore graph mode; torch's caching allocator looks the
same to u3m: its segments are never freed):

  weights    bf16 base weights per layer (q, k, v, o, gate, up, down, two
             norms) plus embedding, final norm and LM head
  full mode  per trainable tensor: bf16 weight, bf16 grad, fp32 master, Adam m,
             Adam v (16 bytes/parameter, design.md §1)
  lora mode  base weights frozen: read by forward and backward, never written;
             per layer one small set of adapter tensors (rank r on the chosen
             projections) with bf16 weight, grad, fp32 master, m, v
  activations per layer, sized by design.md §1: s*b*h*(34 + 5*a*s/h) bytes,
             split into the tensors that formula counts (Korthikanti et al.):
             x_in 2, ln1 2, q 2, k 2, v 2, scores 2as/h, mask as/h, probs 2as/h,
             ctx 2, drop1 1, x_mid 2, ln2 2, mlp_h 8, mlp_act 8, drop2 1 (× sbh)
             --flash drops the s² tensors (flash attention keeps only
             softmax statistics, s*b*a*4 bytes); --recompute keeps only x_in
             per layer and re-runs the layer's forward into one shared set
             before its backward (activation checkpointing)
  workspace  activation-gradient buffers, logits, the input ids

A step: H2D of the input ids; forward (embedding, per layer RMSNorm,
q/k/v/o projections, attention, MLP; final norm, LM head, loss); D2H of the
loss; backward in reverse layer order (reading activations and weights,
writing activation gradients and, for trainable tensors, weight gradients);
optimizer (ApplyAdam per trainable tensor: reads grad, master, m, v; writes
master, m, v and the bf16 weight). Matrix products and attention carry
flops= (2*M*N*K per product); element-wise ops carry none (memory-bound in
the simulator's cost model).

Before the first step the weights (and fp32 masters) are loaded by H2D copies
from one staging buffer, Adam moments are zeroed by memsets.

  gen_llama_trace.py --preset llama2-13b --mode lora --seq 1024 --batch 2 \\
      --steps 3 -o lora.trace
  gen_llama_trace.py --preset llama2-13b --mode full --layers 8 --sizes

--sizes prints the footprint as JSON instead of writing a trace:
requested_bytes (the sum of the A sizes: what the program asks for),
device_bytes (as the simulated aclrtMalloc takes them: +32 bytes of pad, 2 MiB
pages above 1 MiB, so a tensor of exactly 20 MiB takes 22), managed_bytes (the
2 MiB chunks u3m maps for the allocations of 2 MiB and more), by_tag
(device bytes per tag), ops_per_step, base_params.
"""

import argparse
import json
import sys

PRESETS = {
    # Llama-2-13B: design.md §2 (40 layers, hidden 5120, 40 heads); FFN and
    # vocabulary from the model card.
    "llama2-13b": dict(layers=40, hidden=5120, heads=40, ffn=13824, vocab=32000),
    "llama2-7b": dict(layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000),
}

MIB2 = 2 << 20
BASE = 0x100000000000  # trace addresses: arbitrary, 2 MiB-aligned
HOST_STAGE = 0x7F0000000000
HOST_IDS = 0x7F1000000000
HOST_LOSS = 0x7F2000000000

PROJ = ("q", "k", "v", "o", "gate", "up", "down")


def device_bytes(n):
    """Device bytes aclrtMalloc(n, HUGE_FIRST) takes on the simulator: 32-byte
    round plus 32 bytes of pad; 4 KiB pages up to 1 MiB, 2 MiB pages above."""
    padded = (n + 31) // 32 * 32 + 32
    g = MIB2 if padded > (1 << 20) else 4096
    return (padded + g - 1) // g * g


class Trace:
    def __init__(self, out):
        self.out = out
        self.next = BASE
        self.allocs = []  # (name, addr, bytes, tag)
        self.ops = 0
        self.out.write("# u3m-trace 1\n")

    def comment(self, text):
        self.out.write("# %s\n" % text)

    def alloc(self, name, nbytes, tag):
        nbytes = max(1, int(nbytes))
        addr = self.next
        # keep every allocation on its own 2 MiB boundary, as the runtime does
        self.next += (nbytes + MIB2 - 1) // MIB2 * MIB2 + MIB2
        self.allocs.append((name, addr, nbytes, tag))
        self.out.write("A 0x%x %d tag=%s\n" % (addr, nbytes, tag))
        return (addr, nbytes)

    def op(self, kind, ins, outs, flops=0):
        rng = " ".join("0x%x:%d" % r for r in list(ins) + list(outs))
        extra = " flops=%d" % flops if flops else ""
        self.out.write("O %s %d %d %s%s\n" % (kind, len(ins), len(outs), rng, extra))
        self.ops += 1

    def h2d(self, dst, host, nbytes=None):
        self.out.write("M H2D 0x%x 0x%x %d\n" % (dst[0], host, dst[1] if nbytes is None else nbytes))

    def d2h(self, host, src):
        self.out.write("M D2H 0x%x 0x%x %d\n" % (host, src[0], src[1]))

    def memset(self, dst):
        self.out.write("S 0x%x %d\n" % dst)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--preset", default="llama2-13b", choices=sorted(PRESETS))
    p.add_argument("--layers", type=int, help="layer count (default: the preset's)")
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--ffn", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--scale", type=int, default=1,
                   help="divide hidden, FFN, vocabulary and heads by this (a small model of the same shape)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--mode", choices=("full", "lora"), default="full")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-targets", default="q,v", help="comma-separated of %s" % ",".join(PROJ))
    p.add_argument("--flash", action="store_true", help="no s*s attention tensors are kept")
    p.add_argument("--recompute", action="store_true", help="activation checkpointing: keep only layer inputs")
    p.add_argument("-o", "--out", help="trace file (default: stdout)")
    p.add_argument("--sizes", action="store_true", help="print the footprint as JSON, write no trace")
    a = p.parse_args(argv)
    pre = PRESETS[a.preset]
    for k in ("layers", "hidden", "heads", "ffn", "vocab"):
        if getattr(a, k) is None:
            v = pre[k]
            if k != "layers" and a.scale > 1:
                v = max(1, v // a.scale)
            setattr(a, k, v)
    if a.scale < 1:
        p.error("--scale must be at least 1")
    for k in ("layers", "hidden", "heads", "ffn", "vocab", "seq", "batch", "steps", "lora_rank"):
        if getattr(a, k) < 1:
            p.error("--%s must be positive" % k.replace("_", "-"))
    if a.hidden % a.heads:
        p.error("--hidden %d is not a multiple of --heads %d" % (a.hidden, a.heads))
    a.targets = [t for t in a.lora_targets.split(",") if t]
    for t in a.targets:
        if t not in PROJ:
            p.error("unknown LoRA target '%s' (one of %s)" % (t, ",".join(PROJ)))
    return a


def shapes(a):
    """(in, out) of each projection of one layer."""
    h, f = a.hidden, a.ffn
    return {"q": (h, h), "k": (h, h), "v": (h, h), "o": (h, h), "gate": (h, f), "up": (h, f), "down": (f, h)}


def act_sizes(a):
    """Per-layer activation tensors (bytes), design.md §1 split by term."""
    s, b, h, n = a.seq, a.batch, a.hidden, a.heads
    sbh = s * b * h
    t = {"ln1": 2 * sbh, "q": 2 * sbh, "k": 2 * sbh, "v": 2 * sbh, "ctx": 2 * sbh, "drop1": sbh,
         "x_mid": 2 * sbh, "ln2": 2 * sbh, "mlp_h": 8 * sbh, "mlp_act": 8 * sbh, "drop2": sbh}
    if a.flash:
        t["lse"] = s * b * n * 4
    else:
        ass = n * s * s * b
        t.update({"scores": 2 * ass, "mask": ass, "probs": 2 * ass})
    return t  # + x_in (2 sbh), kept per layer in every mode


def generate(a, out):
    tr = Trace(out)
    s, b, h, n, V, L = a.seq, a.batch, a.hidden, a.heads, a.vocab, a.layers
    T = s * b
    lora = a.mode == "lora"
    shp = shapes(a)
    tr.comment("llama-shaped training: preset=%s layers=%d hidden=%d heads=%d ffn=%d vocab=%d seq=%d batch=%d "
               "steps=%d mode=%s%s%s%s" % (
                   a.preset, L, h, n, a.ffn, V, s, b, a.steps, a.mode,
                   " lora_rank=%d lora_targets=%s" % (a.lora_rank, ",".join(a.targets)) if lora else "",
                   " flash" if a.flash else "", " recompute" if a.recompute else ""))

    # ---- allocations ----
    trainable = []  # (name, param count, w16, g16, w32, m, v)

    def param(name, count, tag="weight", train=True):
        w = tr.alloc(name, 2 * count, tag)
        if not train:
            return w, None
        g = tr.alloc(name + ".grad", 2 * count, "grad")
        w32 = tr.alloc(name + ".master", 4 * count, "optim")
        m = tr.alloc(name + ".adam_m", 4 * count, "optim")
        v = tr.alloc(name + ".adam_v", 4 * count, "optim")
        trainable.append((name, count, w, g, w32, m, v))
        return w, g

    full = not lora
    emb, g_emb = param("embed", V * h, train=full)
    layers = []
    for l in range(L):
        ly = {}
        for p in PROJ:
            i, o = shp[p]
            ly[p], ly["g_" + p] = param("l%d.%s" % (l, p), i * o, train=full)
        ly["n1"], ly["g_n1"] = param("l%d.norm1" % l, h, train=full)
        ly["n2"], ly["g_n2"] = param("l%d.norm2" % l, h, train=full)
        if lora:
            r = a.lora_rank
            cnt = sum(r * (shp[t][0] + shp[t][1]) for t in a.targets)
            ly["lora"], ly["g_lora"] = param("l%d.lora" % l, cnt, tag="adapter")
            # the rank-r intermediates x*A, kept for the backward
            ly["lora_t"] = tr.alloc("l%d.lora_t" % l, 2 * T * r * len(a.targets), "act")
        layers.append(ly)
    fnorm, g_fnorm = param("final_norm", h, train=full)
    head, g_head = param("lm_head", h * V, train=full)

    acts = act_sizes(a)
    x_in = [tr.alloc("l%d.x_in" % l, 2 * T * h, "act") for l in range(L)]
    x_out = tr.alloc("x_final", 2 * T * h, "act")
    if a.recompute:
        shared = {k: tr.alloc("recompute.%s" % k, v, "act") for k, v in acts.items()}
        lact = [shared] * L
    else:
        lact = [{k: tr.alloc("l%d.%s" % (l, k), v, "act") for k, v in acts.items()} for l in range(L)]
    ids = tr.alloc("input_ids", 4 * T, "input")
    fn_out = tr.alloc("final_norm_out", 2 * T * h, "act")
    logits = tr.alloc("logits", 2 * T * V, "act")
    loss = tr.alloc("loss", 4, "act")
    big = max(8 * T * h, 2 * n * s * s * b if not a.flash else 0, 2 * T * a.ffn)
    ga = tr.alloc("grad_x.a", 2 * T * h, "workspace")
    gb = tr.alloc("grad_x.b", 2 * T * h, "workspace")
    gq = tr.alloc("grad_q", 2 * T * h, "workspace")
    gk = tr.alloc("grad_k", 2 * T * h, "workspace")
    gv = tr.alloc("grad_v", 2 * T * h, "workspace")
    gbig1 = tr.alloc("grad_big.a", big, "workspace")
    gbig2 = tr.alloc("grad_big.b", big, "workspace")

    # ---- initial state: weights from a checkpoint, moments zeroed ----
    loaded = [x for x in tr.allocs if x[3] in ("weight", "adapter") or x[0].endswith(".master")]
    stage = max(x[2] for x in loaded)
    tr.comment("load weights (one staging buffer of %d bytes)" % stage)
    for l_name, addr, nb, tag in list(tr.allocs):
        if tag in ("weight", "adapter") or l_name.endswith(".master"):
            tr.h2d((addr, nb), HOST_STAGE)
        elif l_name.endswith(".adam_m") or l_name.endswith(".adam_v"):
            tr.memset((addr, nb))

    def mm(x, w, y, k_in, k_out, extra_in=()):
        tr.op("MatMul", [x, w] + list(extra_in), [y], 2 * T * k_in * k_out)

    def lora_fwd(l, p, x, y):
        if lora and p in a.targets:
            r = a.lora_rank
            tr.op("LoraMatMul", [x, layers[l]["lora"], y], [layers[l]["lora_t"], y],
                  2 * T * r * (shp[p][0] + shp[p][1]))

    attn_flops = 2 * b * s * s * h  # one of QK^T, PV

    def forward_layer(l, ac):
        ly = layers[l]
        xi = x_in[l]
        xo = x_in[l + 1] if l + 1 < L else x_out
        tr.op("RMSNorm", [xi, ly["n1"]], [ac["ln1"]])
        for p in ("q", "k", "v"):
            mm(ac["ln1"], ly[p], ac[p], h, h)
            lora_fwd(l, p, ac["ln1"], ac[p])
        if a.flash:
            tr.op("FlashAttention", [ac["q"], ac["k"], ac["v"]], [ac["ctx"], ac["lse"]], 2 * attn_flops)
        else:
            tr.op("BatchMatMul", [ac["q"], ac["k"]], [ac["scores"]], attn_flops)
            tr.op("SoftmaxDropout", [ac["scores"]], [ac["scores"], ac["mask"], ac["probs"]])
            tr.op("BatchMatMul", [ac["probs"], ac["v"]], [ac["ctx"]], attn_flops)
        mm(ac["ctx"], ly["o"], ac["x_mid"], h, h, extra_in=[xi])
        lora_fwd(l, "o", ac["ctx"], ac["x_mid"])
        tr.op("DropoutAdd", [ac["x_mid"]], [ac["x_mid"], ac["drop1"]])
        tr.op("RMSNorm", [ac["x_mid"], ly["n2"]], [ac["ln2"]])
        tr.op("MatMul", [ac["ln2"], ly["gate"], ly["up"]], [ac["mlp_h"]], 2 * 2 * T * h * a.ffn)
        lora_fwd(l, "gate", ac["ln2"], ac["mlp_h"])
        lora_fwd(l, "up", ac["ln2"], ac["mlp_h"])
        tr.op("SwiGLU", [ac["mlp_h"]], [ac["mlp_act"]])
        mm(ac["mlp_act"], ly["down"], xo, a.ffn, h, extra_in=[ac["x_mid"]])
        lora_fwd(l, "down", ac["mlp_act"], xo)
        tr.op("DropoutAdd", [xo], [xo, ac["drop2"]])

    def wgrad(l, p, x, dy, k_in, k_out):
        """Gradient of projection p's weight (full mode) / adapter (lora)."""
        ly = layers[l]
        if full:
            tr.op("MatMulGradW", [x, dy], [ly["g_" + p]], 2 * T * k_in * k_out)
        elif p in a.targets:
            r = a.lora_rank
            tr.op("LoraGrad", [x, dy, ly["lora"], ly["lora_t"]], [ly["g_lora"]], 2 * 2 * T * r * (k_in + k_out))

    def backward_layer(l, ac, dout, dx):
        """dout: gradient of the layer output; leaves the input's in dx."""
        ly = layers[l]
        xi = x_in[l]
        # MLP
        tr.op("DropoutGrad", [dout, ac["drop2"]], [gbig1])
        wgrad(l, "down", ac["mlp_act"], dout, a.ffn, h)
        tr.op("MatMulGradX", [dout, ly["down"]], [gbig1], 2 * T * a.ffn * h)
        tr.op("SwiGLUGrad", [gbig1, ac["mlp_h"]], [gbig2])
        wgrad(l, "gate", ac["ln2"], gbig2, h, a.ffn)
        wgrad(l, "up", ac["ln2"], gbig2, h, a.ffn)
        tr.op("MatMulGradX", [gbig2, ly["gate"], ly["up"]], [gq], 2 * 2 * T * h * a.ffn)
        tr.op("RMSNormGrad", [gq, ac["x_mid"], ly["n2"], dout], [dx] + ([ly["g_n2"]] if full else []))
        # attention
        tr.op("DropoutGrad", [dx, ac["drop1"]], [gk])
        wgrad(l, "o", ac["ctx"], gk, h, h)
        tr.op("MatMulGradX", [gk, ly["o"]], [gv], 2 * T * h * h)
        if a.flash:
            tr.op("FlashAttentionGrad", [gv, ac["q"], ac["k"], ac["v"], ac["ctx"], ac["lse"]], [gq, gk, gv],
                  4 * attn_flops)
        else:
            tr.op("BatchMatMulGrad", [gv, ac["probs"], ac["v"]], [gbig1, gv], 2 * attn_flops)
            tr.op("SoftmaxDropoutGrad", [gbig1, ac["scores"], ac["mask"]], [gbig2])
            tr.op("BatchMatMulGrad", [gbig2, ac["q"], ac["k"]], [gq, gk], 2 * attn_flops)
        for p, g in (("q", gq), ("k", gk), ("v", gv)):
            wgrad(l, p, ac["ln1"], g, h, h)
        tr.op("MatMulGradX", [gq, gk, gv, ly["q"], ly["k"], ly["v"]], [ga if dx is gb else gb], 3 * 2 * T * h * h)
        tmp = ga if dx is gb else gb
        tr.op("RMSNormGrad", [tmp, xi, ly["n1"], dx], [dx] + ([ly["g_n1"]] if full else []))

    # ---- steps ----
    for st in range(a.steps):
        tr.comment("step %d: forward" % st)
        tr.h2d(ids, HOST_IDS + st * 0x100000)
        tr.op("Embedding", [ids, emb], [x_in[0]])
        for l in range(L):
            forward_layer(l, lact[l])
        tr.op("RMSNorm", [x_out, fnorm], [fn_out])
        mm(fn_out, head, logits, h, V)
        tr.op("CrossEntropy", [logits, ids], [loss, logits])  # loss, and dlogits in place
        tr.d2h(HOST_LOSS + st * 64, loss)
        tr.comment("step %d: backward" % st)
        if full:
            tr.op("MatMulGradW", [fn_out, logits], [g_head], 2 * T * h * V)
        tr.op("MatMulGradX", [logits, head], [gb], 2 * T * h * V)
        tr.op("RMSNormGrad", [gb, x_out, fnorm], [ga] + ([g_fnorm] if full else []))
        dout, dx = ga, gb
        for l in reversed(range(L)):
            if a.recompute:
                tr.comment("step %d: recompute layer %d" % (st, l))
                forward_layer(l, lact[l])
            backward_layer(l, lact[l], dout, dx)
            dout, dx = dx, dout
        if full:
            tr.op("EmbeddingGrad", [dout, ids], [g_emb])
        tr.comment("step %d: optimizer" % st)
        for name, cnt, w, g, w32, m, v in trainable:
            tr.op("ApplyAdam", [g, w32, m, v], [w32, m, v, w])
    return tr


def footprint(a):
    """Device bytes by tag, from a dry run."""

    class Null:
        def write(self, _):
            pass

    tr = generate(a, Null())
    by = {}
    for _, _, nb, tag in tr.allocs:
        by[tag] = by.get(tag, 0) + device_bytes(nb)
    total = sum(by.values())
    requested = sum(nb for _, _, nb, _ in tr.allocs)
    # what u3m maps for a managed allocation (>= 2 MiB): whole chunks, no pad
    managed = sum((nb + MIB2 - 1) // MIB2 * MIB2 for _, _, nb, _ in tr.allocs if nb >= MIB2)
    params = sum(x[2] for x in tr.allocs if x[3] == "weight") // 2
    return {"requested_bytes": requested, "device_bytes": total, "managed_bytes": managed, "by_tag": by, "allocations": len(tr.allocs),
            "ops_per_step": tr.ops // a.steps, "base_params": params,
            "config": {k: getattr(a, k) for k in ("preset", "layers", "hidden", "heads", "ffn", "vocab", "seq",
                                                   "batch", "steps", "mode", "lora_rank", "flash", "recompute")}}


def main(argv):
    a = parse_args(argv)
    if a.sizes:
        json.dump(footprint(a), sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    if a.out:
        with open(a.out, "w") as f:
            generate(a, f)
    else:
        generate(a, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
