//! Serving: R concurrent requests (a RAG burst) over read-only weights.
//! Each request owns a static KV cache, one K and one V tensor per layer of
//! (context + decode tokens) × kv_heads × head_dim × 2 B, allocated when it
//! is admitted. Prefill runs request by request over its C context tokens
//! (FlashAttentionScore; ReshapeAndCache writes the first C token slots);
//! then T decode steps run the R requests as one batch: per layer one
//! ReshapeAndCache per request writes the new token's K/V slot, and one
//! IncreFlashAttention reads every request's whole cache so far. Activations
//! are temporaries, freed as soon as they are consumed (no autograd).

use u3m_core::trace::Range;

use super::alloc::Tensor;
use super::emit::{Emit, HOST_INPUT, HOST_OUTPUT};
use super::model::{Model, Opts, Proj};
use super::train::{host_input, linear};
use super::Component::{Kv, Workspace as Ws};

/// A request's cache: per layer (K, V).
pub struct Request {
    pub kv: Vec<(Tensor, Tensor)>,
}

/// One decoder layer over `rows` tokens of activations `x` (freed); returns
/// the layer output. `attend` issues the cache write and attention between
/// the projections and the output projection, given (q, k, v) and writing ctx.
fn layer(
    g: &mut Emit,
    m: &Model,
    o: &Opts,
    l: usize,
    x: Tensor,
    rows: u64,
    attend: &mut dyn FnMut(&mut Emit, Range, Range, Range, Range),
) -> Tensor {
    let a = &o.arch;
    let (h, kvd, f) = (a.hidden, a.kv_dim(), a.ffn);
    let ly = &m.layers[l];
    let ln = g.alloc(2 * rows * h, Ws);
    g.op("RmsNorm", &[x.range(), m.w(ly.norm1)], &[ln.range()], 0);
    let q = g.alloc(2 * rows * h, Ws);
    linear(g, m, o, l, Proj::Q, ln.range(), q.range(), rows, false);
    let k = g.alloc(2 * rows * kvd, Ws);
    linear(g, m, o, l, Proj::K, ln.range(), k.range(), rows, false);
    let v = g.alloc(2 * rows * kvd, Ws);
    linear(g, m, o, l, Proj::V, ln.range(), v.range(), rows, false);
    g.free(ln);
    g.op(
        "RotaryPositionEmbedding",
        &[q.range(), k.range()],
        &[q.range(), k.range()],
        0,
    );
    let ctx = g.alloc(2 * rows * h, Ws);
    attend(g, q.range(), k.range(), v.range(), ctx.range());
    g.free(q);
    g.free(k);
    g.free(v);
    let att = g.alloc(2 * rows * h, Ws);
    linear(g, m, o, l, Proj::O, ctx.range(), att.range(), rows, false);
    g.free(ctx);
    let x_mid = g.alloc(2 * rows * h, Ws);
    g.op("Add", &[x.range(), att.range()], &[x_mid.range()], 0);
    g.free(x);
    g.free(att);
    let ln2 = g.alloc(2 * rows * h, Ws);
    g.op(
        "RmsNorm",
        &[x_mid.range(), m.w(ly.norm2)],
        &[ln2.range()],
        0,
    );
    let gate = g.alloc(2 * rows * f, Ws);
    linear(
        g,
        m,
        o,
        l,
        Proj::Gate,
        ln2.range(),
        gate.range(),
        rows,
        false,
    );
    let up = g.alloc(2 * rows * f, Ws);
    linear(g, m, o, l, Proj::Up, ln2.range(), up.range(), rows, false);
    g.free(ln2);
    let act = g.alloc(2 * rows * f, Ws);
    g.op("SwiGlu", &[gate.range(), up.range()], &[act.range()], 0);
    g.free(gate);
    g.free(up);
    let down = g.alloc(2 * rows * h, Ws);
    linear(
        g,
        m,
        o,
        l,
        Proj::Down,
        act.range(),
        down.range(),
        rows,
        false,
    );
    g.free(act);
    let out = g.alloc(2 * rows * h, Ws);
    g.op("Add", &[x_mid.range(), down.range()], &[out.range()], 0);
    g.free(x_mid);
    g.free(down);
    out
}

/// Final norm and LM head over the last `rows` token rows of `x` (freed),
/// greedy sampling, and the D2H of the token ids.
fn sample(g: &mut Emit, m: &Model, o: &Opts, x: Tensor, rows: u64, host: u64) {
    let (h, vocab) = (o.arch.hidden, o.arch.vocab);
    let last = x.slice(x.bytes - 2 * rows * h, 2 * rows * h);
    let fn_out = g.alloc(2 * rows * h, Ws);
    g.op("RmsNorm", &[last, m.w(m.fnorm)], &[fn_out.range()], 0);
    g.free(x);
    let logits = g.alloc(2 * rows * vocab, Ws);
    g.op(
        "MatMul",
        &[fn_out.range(), m.w(m.head)],
        &[logits.range()],
        2 * rows * h * vocab,
    );
    g.free(fn_out);
    let tok = g.alloc(4 * rows, Ws);
    g.op("ArgMax", &[logits.range()], &[tok.range()], 0);
    g.free(logits);
    g.d2h(host, tok.range());
    g.free(tok);
}

/// Admits `o.requests` requests (their caches), prefills each, then runs
/// `o.decode` decode steps; `burst` numbers the bursts of a trace (host
/// buffers differ per burst). Frees the caches at the end (the requests
/// complete).
pub fn serve(g: &mut Emit, m: &Model, o: &Opts, burst: u64) {
    let a = &o.arch;
    let (h, kvd) = (a.hidden, a.kv_dim());
    let slot = 2 * kvd; // bytes of one token of K (or V) in one layer
    let cap = o.kv_tokens() * slot;
    let c = o.context;
    let mut reqs = Vec::new();
    for r in 0..o.requests {
        g.comment(&format!(
            "serve burst {burst}: prefill request {r} ({c} tokens)"
        ));
        let kv = (0..a.layers)
            .map(|l| {
                let k = g.named(&format!("kv b{burst} r{r} l{l} K"), cap, Kv);
                let v = g.named(&format!("kv b{burst} r{r} l{l} V"), cap, Kv);
                (k, v)
            })
            .collect();
        let req = Request { kv };
        let ids = g.alloc(4 * c, Ws);
        g.h2d(
            ids.range(),
            host_input(o.seed ^ 0x5eed_0000_0000, burst * o.requests + r),
        );
        let mut x = g.alloc(2 * c * h, Ws);
        g.op("Embedding", &[ids.range(), m.w(m.emb)], &[x.range()], 0);
        g.free(ids);
        for l in 0..a.layers as usize {
            let (kc, vc) = req.kv[l];
            let mut attend = |g: &mut Emit, q: Range, k: Range, v: Range, ctx: Range| {
                g.op(
                    "ReshapeAndCache",
                    &[k, v],
                    &[kc.slice(0, c * slot), vc.slice(0, c * slot)],
                    0,
                );
                // QKᵀ and PV over C tokens, all heads: 2 · 2·C²·h.
                g.op("FlashAttentionScore", &[q, k, v], &[ctx], 4 * c * c * h);
            };
            x = layer(g, m, o, l, x, c, &mut attend);
        }
        sample(g, m, o, x, 1, HOST_OUTPUT + (burst * o.requests + r) * 64);
        reqs.push(req);
    }
    let n = o.requests;
    for j in 0..o.decode {
        g.comment(&format!(
            "serve burst {burst}: decode step {j} ({n} requests)"
        ));
        let ids = g.alloc(4 * n, Ws);
        g.h2d(ids.range(), HOST_INPUT + 0x100_0000 + j * 64);
        let mut x = g.alloc(2 * n * h, Ws);
        g.op("Embedding", &[ids.range(), m.w(m.emb)], &[x.range()], 0);
        g.free(ids);
        let pos = c + j; // the new token's slot
        for l in 0..a.layers as usize {
            let reqs = &reqs;
            let mut attend = |g: &mut Emit, q: Range, k: Range, v: Range, ctx: Range| {
                for (r, req) in reqs.iter().enumerate() {
                    let (kc, vc) = req.kv[l];
                    let row = r as u64 * slot;
                    g.op(
                        "ReshapeAndCache",
                        &[
                            Range::new(k.addr + row, slot),
                            Range::new(v.addr + row, slot),
                        ],
                        &[kc.slice(pos * slot, slot), vc.slice(pos * slot, slot)],
                        0,
                    );
                }
                let mut ins = vec![q];
                for req in reqs {
                    let (kc, vc) = req.kv[l];
                    ins.push(kc.slice(0, (pos + 1) * slot));
                    ins.push(vc.slice(0, (pos + 1) * slot));
                }
                // Per request QKᵀ and PV over pos + 1 tokens: 2 · 2·(pos + 1)·h.
                g.op("IncreFlashAttention", &ins, &[ctx], n * 4 * (pos + 1) * h);
            };
            x = layer(g, m, o, l, x, n, &mut attend);
        }
        sample(g, m, o, x, n, HOST_OUTPUT + 0x100_0000 + j * 64);
    }
    for req in reqs {
        for (k, v) in req.kv {
            g.free(k);
            g.free(v);
        }
    }
}
