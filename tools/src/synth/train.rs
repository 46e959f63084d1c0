//! One training step: forward through every layer (keeping the activations
//! the design.md §1 formula counts), loss, backward in reverse layer order,
//! then ApplyAdamW per trained tensor. Tensors come from the caching
//! allocator and go back to it when dead, as under torch: activations when
//! their layer's backward has run, gradients after the optimizer step
//! (`zero_grad(set_to_none=True)`), temporaries right after their last use.
//!
//! Saved activations per layer, in units of s·b·h bytes (the formula's terms,
//! Korthikanti et al.): layer input 2, attention norm 2, q 2, k 2, v 2,
//! attention output 2, dropout mask 1, residual 2, MLP norm 2, gate|up 8,
//! SwiGLU output 8, dropout mask 1 = 34; plus, without --flash, softmax
//! output 2·a·s/h, its dropout mask a·s/h and the dropped probabilities
//! 2·a·s/h (= 5·a·s/h). With --flash the three s² tensors are replaced by
//! the softmax statistics (4·s·b·a bytes). LoRA adds its rank-r
//! intermediate x·Aᵀ (2·s·b·r bytes per target).

use u3m_core::trace::Range;

use super::alloc::Tensor;
use super::emit::{Emit, HOST_INPUT, HOST_OUTPUT};
use super::model::{Model, Opts, Proj};
use super::Component::{Activations as Act, Grads, Workspace as Ws};

enum Attn {
    Flash {
        lse: Tensor,
    },
    Eager {
        scores: Tensor,
        mask: Tensor,
        probs: Tensor,
    },
}

struct Saved {
    x_in: Tensor,
    ln1: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn: Attn,
    ctx: Tensor,
    drop1: Tensor,
    x_mid: Tensor,
    ln2: Tensor,
    gate_up: Tensor,
    act: Tensor,
    drop2: Tensor,
    lora_t: Vec<(Proj, Tensor)>,
}

impl Saved {
    fn free(self, g: &mut Emit) {
        let x_in = self.x_in;
        free_except_input(g, self);
        g.free(x_in);
    }
}

/// Input-ids host buffer of a step: the data acl_replay puts there is seeded
/// by the address, so `--seed` changes the data, not the memory pattern.
pub fn host_input(seed: u64, step: u64) -> u64 {
    HOST_INPUT + (splitmix(seed.wrapping_add(step)) & 0xfff_ffff) * 64
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// y (a view of `y`) = x·Wᵀ for projection `p` of layer `l` over `tokens`
/// rows, plus the LoRA path (x·Aᵀ)·Bᵀ·α/r when `p` carries an adapter; the
/// rank-r intermediate is returned (kept for the backward when `keep`).
#[allow(clippy::too_many_arguments)]
pub fn linear(
    g: &mut Emit,
    m: &Model,
    o: &Opts,
    l: usize,
    p: Proj,
    x: Range,
    y: Range,
    tokens: u64,
    keep: bool,
) -> Option<Tensor> {
    let (d_in, d_out) = p.dims(&o.arch);
    let ly = &m.layers[l];
    g.op(
        "MatMul",
        &[x, m.w(ly.w(p))],
        &[y],
        2 * tokens * d_in * d_out,
    );
    let (a, b) = ly.lora(p)?;
    let r = o.lora_rank;
    let t = g.alloc(2 * tokens * r, if keep { Act } else { Ws });
    g.op("MatMul", &[x, m.w(a)], &[t.range()], 2 * tokens * d_in * r);
    let u = g.alloc(2 * tokens * d_out, Ws);
    g.op(
        "MatMul",
        &[t.range(), m.w(b)],
        &[u.range()],
        2 * tokens * r * d_out,
    );
    g.op("Muls", &[u.range()], &[u.range()], 0);
    g.op("Add", &[y, u.range()], &[y], 0);
    g.free(u);
    if keep {
        Some(t)
    } else {
        g.free(t);
        None
    }
}

/// Forward of layer `l` from `x_in`; returns the saved set (None when
/// `keep` is false: everything but `x_in` is freed) and the layer output.
fn forward_layer(
    g: &mut Emit,
    m: &Model,
    o: &Opts,
    l: usize,
    x_in: Tensor,
    keep: bool,
) -> (Option<Saved>, Tensor) {
    let a = &o.arch;
    let (s, b, h, n) = (o.seq, o.batch, a.hidden, a.heads);
    let t = s * b;
    let sbh = t * h;
    let ly = &m.layers[l];
    let mut lora_t = Vec::new();
    let mut lin = |g: &mut Emit, p: Proj, x: Range, y: Range| {
        if let Some(lt) = linear(g, m, o, l, p, x, y, t, true) {
            lora_t.push((p, lt));
        }
    };
    let ln1 = g.alloc(2 * sbh, Act);
    g.op("RmsNorm", &[x_in.range(), m.w(ly.norm1)], &[ln1.range()], 0);
    let q = g.alloc(2 * sbh, Act);
    lin(g, Proj::Q, ln1.range(), q.range());
    let k = g.alloc(2 * sbh, Act);
    lin(g, Proj::K, ln1.range(), k.range());
    let v = g.alloc(2 * sbh, Act);
    lin(g, Proj::V, ln1.range(), v.range());
    g.op(
        "RotaryPositionEmbedding",
        &[q.range(), k.range()],
        &[q.range(), k.range()],
        0,
    );
    let ctx = g.alloc(2 * sbh, Act);
    // One of QKᵀ, PV: 2·b·s²·h (all heads; GQA shares K/V, not the work).
    let prod = 2 * b * s * s * h;
    let attn = if o.flash {
        let lse = g.alloc(4 * s * b * n, Act);
        g.op(
            "FlashAttentionScore",
            &[q.range(), k.range(), v.range()],
            &[ctx.range(), lse.range()],
            2 * prod,
        );
        Attn::Flash { lse }
    } else {
        let ass = n * s * s * b;
        let scores = g.alloc(2 * ass, Act);
        g.op(
            "BatchMatMul",
            &[q.range(), k.range()],
            &[scores.range()],
            prod,
        );
        g.op("Softmax", &[scores.range()], &[scores.range()], 0);
        let mask = g.alloc(ass, Act);
        g.op("DropoutGenMask", &[], &[mask.range()], 0);
        let probs = g.alloc(2 * ass, Act);
        g.op(
            "DropoutDoMask",
            &[scores.range(), mask.range()],
            &[probs.range()],
            0,
        );
        g.op(
            "BatchMatMul",
            &[probs.range(), v.range()],
            &[ctx.range()],
            prod,
        );
        Attn::Eager {
            scores,
            mask,
            probs,
        }
    };
    let o_out = g.alloc(2 * sbh, Ws);
    lin(g, Proj::O, ctx.range(), o_out.range());
    let drop1 = g.alloc(sbh, Act);
    g.op("DropoutGenMask", &[], &[drop1.range()], 0);
    g.op(
        "DropoutDoMask",
        &[o_out.range(), drop1.range()],
        &[o_out.range()],
        0,
    );
    let x_mid = g.alloc(2 * sbh, Act);
    g.op("Add", &[x_in.range(), o_out.range()], &[x_mid.range()], 0);
    g.free(o_out);
    let ln2 = g.alloc(2 * sbh, Act);
    g.op(
        "RmsNorm",
        &[x_mid.range(), m.w(ly.norm2)],
        &[ln2.range()],
        0,
    );
    // gate and up write the two halves of one buffer (views into it).
    let gate_up = g.alloc(8 * sbh, Act);
    lin(g, Proj::Gate, ln2.range(), gate_up.slice(0, 4 * sbh));
    lin(g, Proj::Up, ln2.range(), gate_up.slice(4 * sbh, 4 * sbh));
    let act = g.alloc(8 * sbh, Act);
    g.op("SwiGlu", &[gate_up.range()], &[act.range()], 0);
    let down = g.alloc(2 * sbh, Ws);
    lin(g, Proj::Down, act.range(), down.range());
    let drop2 = g.alloc(sbh, Act);
    g.op("DropoutGenMask", &[], &[drop2.range()], 0);
    g.op(
        "DropoutDoMask",
        &[down.range(), drop2.range()],
        &[down.range()],
        0,
    );
    // The last layer's output is the final norm's input, not a layer activation.
    let x_out = g.alloc(2 * sbh, if l + 1 < a.layers as usize { Act } else { Ws });
    g.op("Add", &[x_mid.range(), down.range()], &[x_out.range()], 0);
    g.free(down);
    let saved = Saved {
        x_in,
        ln1,
        q,
        k,
        v,
        attn,
        ctx,
        drop1,
        x_mid,
        ln2,
        gate_up,
        act,
        drop2,
        lora_t,
    };
    if keep {
        (Some(saved), x_out)
    } else {
        // Checkpointing: the caller keeps x_in; the rest is dead.
        free_except_input(g, saved);
        (None, x_out)
    }
}

fn free_except_input(g: &mut Emit, s: Saved) {
    for t in [
        s.ln1, s.q, s.k, s.v, s.ctx, s.drop1, s.x_mid, s.ln2, s.gate_up, s.act, s.drop2,
    ] {
        g.free(t);
    }
    match s.attn {
        Attn::Flash { lse } => g.free(lse),
        Attn::Eager {
            scores,
            mask,
            probs,
        } => {
            g.free(scores);
            g.free(mask);
            g.free(probs);
        }
    }
    for (_, t) in s.lora_t {
        g.free(t);
    }
}

/// Gradient of parameter `i` by a MatMul of `ins`, when it is trained: the
/// gradient tensor is allocated on first write (torch creates `.grad` in the
/// backward) and lives until the optimizer step.
fn wgrad(g: &mut Emit, m: &mut Model, i: usize, ins: &[Range], flops: u64) {
    if let Some(gr) = grad(g, m, i) {
        g.op("MatMul", ins, &[gr], flops);
    }
}

/// The gradient range of parameter `i` (allocated if needed), None if frozen.
fn grad(g: &mut Emit, m: &mut Model, i: usize) -> Option<Range> {
    let p = &mut m.params[i];
    p.state.as_ref()?;
    if p.grad.is_none() {
        p.grad = Some(g.alloc(2 * p.n, Grads));
    }
    p.grad.map(|t| t.range())
}

/// Backward of projection `p`: dx += dy·W (into `acc`, allocated on first
/// use), the weight gradient when trained, and the LoRA path's gradients.
#[allow(clippy::too_many_arguments)]
fn linear_back(
    g: &mut Emit,
    m: &mut Model,
    o: &Opts,
    l: usize,
    p: Proj,
    x: Range,
    dy: Range,
    lora_t: Option<Tensor>,
    acc: &mut Option<Tensor>,
) {
    let t = o.tokens();
    let (d_in, d_out) = p.dims(&o.arch);
    let w = m.layers[l].w(p);
    wgrad(g, m, w, &[dy, x], 2 * t * d_in * d_out);
    let dx = g.alloc(2 * t * d_in, Ws);
    g.op("MatMul", &[dy, m.w(w)], &[dx.range()], 2 * t * d_in * d_out);
    accumulate(g, acc, dx);
    if let (Some((a, b)), Some(lt)) = (m.layers[l].lora(p), lora_t) {
        let r = o.lora_rank;
        let du = g.alloc(2 * t * d_out, Ws);
        g.op("Muls", &[dy], &[du.range()], 0);
        wgrad(g, m, b, &[du.range(), lt.range()], 2 * t * d_out * r);
        let dt = g.alloc(2 * t * r, Ws);
        g.op(
            "MatMul",
            &[du.range(), m.w(b)],
            &[dt.range()],
            2 * t * d_out * r,
        );
        g.free(du);
        wgrad(g, m, a, &[dt.range(), x], 2 * t * r * d_in);
        let dxl = g.alloc(2 * t * d_in, Ws);
        g.op(
            "MatMul",
            &[dt.range(), m.w(a)],
            &[dxl.range()],
            2 * t * r * d_in,
        );
        g.free(dt);
        accumulate(g, acc, dxl);
        g.free(lt);
    }
}

fn accumulate(g: &mut Emit, acc: &mut Option<Tensor>, d: Tensor) {
    match acc {
        None => *acc = Some(d),
        Some(a) => {
            g.op("Add", &[a.range(), d.range()], &[a.range()], 0);
            g.free(d);
        }
    }
}

fn take_lora(s: &mut Saved, p: Proj) -> Option<Tensor> {
    let i = s.lora_t.iter().position(|(q, _)| *q == p)?;
    Some(s.lora_t.remove(i).1)
}

/// Backward of layer `l`: consumes `dy` (gradient of the layer output) and
/// the saved set; returns the gradient of the layer input.
fn backward_layer(
    g: &mut Emit,
    m: &mut Model,
    o: &Opts,
    l: usize,
    mut s: Saved,
    dy: Tensor,
) -> Tensor {
    let a = &o.arch;
    let (sq, b, h) = (o.seq, o.batch, a.hidden);
    let t = sq * b;
    let sbh = t * h;
    let (n1, n2) = (m.layers[l].norm1, m.layers[l].norm2);
    // MLP: through the dropout, down, SwiGLU, gate/up, the norm.
    let d_down = g.alloc(2 * sbh, Ws);
    g.op(
        "DropoutDoMask",
        &[dy.range(), s.drop2.range()],
        &[d_down.range()],
        0,
    );
    let lt = take_lora(&mut s, Proj::Down);
    let mut d_act = None;
    linear_back(
        g,
        m,
        o,
        l,
        Proj::Down,
        s.act.range(),
        d_down.range(),
        lt,
        &mut d_act,
    );
    g.free(d_down);
    let d_act = d_act.expect("dx allocated");
    let d_gu = g.alloc(4 * t * a.ffn, Ws);
    g.op(
        "SwiGluGrad",
        &[d_act.range(), s.gate_up.range()],
        &[d_gu.range()],
        0,
    );
    g.free(d_act);
    let mut d_ln2 = None;
    let half = 2 * t * a.ffn;
    for (p, off) in [(Proj::Gate, 0), (Proj::Up, half)] {
        let lt = take_lora(&mut s, p);
        linear_back(
            g,
            m,
            o,
            l,
            p,
            s.ln2.range(),
            d_gu.slice(off, half),
            lt,
            &mut d_ln2,
        );
    }
    g.free(d_gu);
    let d_ln2 = d_ln2.expect("dx allocated");
    let d_mid = g.alloc(2 * sbh, Ws);
    let mut outs = vec![d_mid.range()];
    outs.extend(grad(g, m, n2));
    g.op(
        "RmsNormGrad",
        &[d_ln2.range(), s.x_mid.range(), m.w(n2)],
        &outs,
        0,
    );
    g.free(d_ln2);
    // The residual: the output gradient flows to x_mid unchanged too.
    g.op("Add", &[d_mid.range(), dy.range()], &[d_mid.range()], 0);
    g.free(dy);
    // Attention.
    let d_o = g.alloc(2 * sbh, Ws);
    g.op(
        "DropoutDoMask",
        &[d_mid.range(), s.drop1.range()],
        &[d_o.range()],
        0,
    );
    let lt = take_lora(&mut s, Proj::O);
    let mut d_ctx = None;
    linear_back(
        g,
        m,
        o,
        l,
        Proj::O,
        s.ctx.range(),
        d_o.range(),
        lt,
        &mut d_ctx,
    );
    g.free(d_o);
    let d_ctx = d_ctx.expect("dx allocated");
    let dq = g.alloc(2 * sbh, Ws);
    let dk = g.alloc(2 * sbh, Ws);
    let dv = g.alloc(2 * sbh, Ws);
    let prod = 2 * b * sq * sq * h;
    match &s.attn {
        Attn::Flash { lse } => {
            g.op(
                "FlashAttentionScoreGrad",
                &[
                    d_ctx.range(),
                    s.q.range(),
                    s.k.range(),
                    s.v.range(),
                    s.ctx.range(),
                    lse.range(),
                ],
                &[dq.range(), dk.range(), dv.range()],
                4 * prod,
            );
        }
        Attn::Eager {
            scores,
            mask,
            probs,
        } => {
            let ass = a.heads * sq * sq * b;
            let dp = g.alloc(2 * ass, Ws);
            g.op(
                "BatchMatMul",
                &[d_ctx.range(), s.v.range()],
                &[dp.range()],
                prod,
            );
            g.op(
                "BatchMatMul",
                &[d_ctx.range(), probs.range()],
                &[dv.range()],
                prod,
            );
            g.op(
                "DropoutDoMask",
                &[dp.range(), mask.range()],
                &[dp.range()],
                0,
            );
            g.op(
                "SoftmaxGrad",
                &[dp.range(), scores.range()],
                &[dp.range()],
                0,
            );
            g.op(
                "BatchMatMul",
                &[dp.range(), s.k.range()],
                &[dq.range()],
                prod,
            );
            g.op(
                "BatchMatMul",
                &[dp.range(), s.q.range()],
                &[dk.range()],
                prod,
            );
            g.free(dp);
        }
    }
    g.free(d_ctx);
    g.op(
        "RotaryPositionEmbeddingGrad",
        &[dq.range(), dk.range()],
        &[dq.range(), dk.range()],
        0,
    );
    let mut d_ln1 = None;
    for (p, d) in [(Proj::Q, dq), (Proj::K, dk), (Proj::V, dv)] {
        let lt = take_lora(&mut s, p);
        linear_back(g, m, o, l, p, s.ln1.range(), d.range(), lt, &mut d_ln1);
        g.free(d);
    }
    let d_ln1 = d_ln1.expect("dx allocated");
    let dx = g.alloc(2 * sbh, Ws);
    let mut outs = vec![dx.range()];
    outs.extend(grad(g, m, n1));
    g.op(
        "RmsNormGrad",
        &[d_ln1.range(), s.x_in.range(), m.w(n1)],
        &outs,
        0,
    );
    g.free(d_ln1);
    g.op("Add", &[dx.range(), d_mid.range()], &[dx.range()], 0);
    g.free(d_mid);
    s.free(g);
    dx
}

/// One training step (`step` numbers the steps of the whole trace).
pub fn step(g: &mut Emit, m: &mut Model, o: &Opts, step: u64) {
    let a = &o.arch;
    let (h, vocab, layers) = (a.hidden, a.vocab, a.layers as usize);
    let t = o.tokens();
    g.comment(&format!("train step {step}: forward"));
    let ids = g.alloc(4 * t, Ws);
    g.h2d(ids.range(), host_input(o.seed, step));
    let mut x = g.alloc(2 * t * h, if layers > 0 { Act } else { Ws });
    g.op("Embedding", &[ids.range(), m.w(m.emb)], &[x.range()], 0);
    // Per layer: its saved set, or (with --recompute) its input only.
    let mut saved: Vec<Result<Saved, Tensor>> = Vec::with_capacity(layers);
    for l in 0..layers {
        let x_in = x;
        let (s, out) = forward_layer(g, m, o, l, x_in, !o.recompute);
        saved.push(s.ok_or(x_in));
        x = out;
    }
    let fn_out = g.alloc(2 * t * h, Ws);
    g.op("RmsNorm", &[x.range(), m.w(m.fnorm)], &[fn_out.range()], 0);
    let logits = g.alloc(2 * t * vocab, Ws);
    g.op(
        "MatMul",
        &[fn_out.range(), m.w(m.head)],
        &[logits.range()],
        2 * t * h * vocab,
    );
    let loss = g.alloc(4, Ws);
    g.op(
        "CrossEntropyLoss",
        &[logits.range(), ids.range()],
        &[loss.range()],
        0,
    );
    g.d2h(HOST_OUTPUT + step * 64, loss.range());
    g.comment(&format!("train step {step}: backward"));
    let dlogits = g.alloc(2 * t * vocab, Ws);
    g.op(
        "CrossEntropyLossGrad",
        &[logits.range(), ids.range(), loss.range()],
        &[dlogits.range()],
        0,
    );
    g.free(logits);
    g.free(loss);
    wgrad(
        g,
        m,
        m.head,
        &[dlogits.range(), fn_out.range()],
        2 * t * h * vocab,
    );
    let d_fn = g.alloc(2 * t * h, Ws);
    g.op(
        "MatMul",
        &[dlogits.range(), m.w(m.head)],
        &[d_fn.range()],
        2 * t * h * vocab,
    );
    g.free(dlogits);
    let mut dy = g.alloc(2 * t * h, Ws);
    let mut outs = vec![dy.range()];
    outs.extend(grad(g, m, m.fnorm));
    g.op(
        "RmsNormGrad",
        &[d_fn.range(), x.range(), m.w(m.fnorm)],
        &outs,
        0,
    );
    g.free(d_fn);
    g.free(fn_out);
    g.free(x);
    for l in (0..layers).rev() {
        let s = match saved.pop().expect("one entry per layer") {
            Ok(s) => s,
            Err(x_in) => {
                // Activation checkpointing: the layer's forward again, now keeping its set.
                let (s, out) = forward_layer(g, m, o, l, x_in, true);
                g.free(out);
                s.expect("kept")
            }
        };
        dy = backward_layer(g, m, o, l, s, dy);
    }
    if let Some(ge) = grad(g, m, m.emb) {
        g.op(
            "EmbeddingDenseBackward",
            &[dy.range(), ids.range()],
            &[ge],
            0,
        );
    }
    g.free(dy);
    g.free(ids);
    g.comment(&format!("train step {step}: optimizer"));
    if let Some(f) = &m.flat {
        // One operator over the whole flat parameter set: about 14 B per
        // parameter at once, what makes a step larger than HBM.
        g.op(
            "ApplyAdamW",
            &[f.grad.range(), f.master.range(), f.m.range(), f.v.range()],
            &[f.master.range(), f.m.range(), f.v.range()],
            0,
        );
        for i in m.trained().collect::<Vec<_>>() {
            let p = &m.params[i];
            let [m32, _, _] = p.state.expect("trained");
            g.op("Cast", &[m32.range()], &[p.w.range()], 0);
        }
        // the flat gradient buffer stays (zeroed by the next backward's writes)
        return;
    }
    let trained: Vec<usize> = m.trained().collect();
    for i in trained {
        let p = &m.params[i];
        let [m32, mo, vo] = p.state.expect("trained");
        let gr = p.grad.expect("every trained parameter got a gradient");
        g.op(
            "ApplyAdamW",
            &[gr.range(), m32.range(), mo.range(), vo.range()],
            &[m32.range(), mo.range(), vo.range()],
            0,
        );
        g.op("Cast", &[m32.range()], &[p.w.range()], 0);
    }
    for p in &mut m.params {
        if let Some(gr) = p.grad.take() {
            g.free(gr);
        }
    }
}
