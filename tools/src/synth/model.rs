//! The model being traced: the (scaled) architecture, the workload options,
//! and the persistent tensors — weights, LoRA adapters, optimizer states —
//! allocated and loaded before the first step.

use u3m_core::plan::{self as core, Arch, PlanError};

use super::alloc::Tensor;
use super::emit::{Emit, HOST_STAGE};
use super::Component;

/// A linear projection of a decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Proj::Q => "q",
            Proj::K => "k",
            Proj::V => "v",
            Proj::O => "o",
            Proj::Gate => "gate",
            Proj::Up => "up",
            Proj::Down => "down",
        }
    }

    pub fn parse(s: &str) -> Option<Proj> {
        Proj::ALL.into_iter().find(|p| p.name() == s)
    }

    /// (d_in, d_out) of the projection: K and V are kv_dim wide (GQA).
    pub fn dims(self, a: &Arch) -> (u64, u64) {
        let (h, f, kv) = (a.hidden, a.ffn, a.kv_dim());
        match self {
            Proj::Q | Proj::O => (h, h),
            Proj::K | Proj::V => (h, kv),
            Proj::Gate | Proj::Up => (h, f),
            Proj::Down => (f, h),
        }
    }
}

/// The preset shrunk by `f`: heads (and KV heads, keeping the GQA ratio
/// where it divides), FFN and vocabulary divided by `f`; the head dimension
/// kept (128 for every preset) until one head is left, then shrunk with the
/// hidden size (not below 8). Layers are not scaled (`--layers` sets them).
pub fn scale_arch(a: Arch, f: f64) -> Arch {
    if f == 1.0 {
        return a;
    }
    let div = |v: u64, min: u64| ((v as f64 / f).round() as u64).max(min);
    let heads = div(a.heads, 1);
    let mut kv_heads = div(a.kv_heads, 1).min(heads);
    while heads % kv_heads != 0 {
        kv_heads -= 1;
    }
    let target = a.hidden as f64 / f / heads as f64;
    let head_dim = ((target / 8.0).floor() as u64 * 8).clamp(8, a.head_dim().max(8));
    Arch {
        layers: a.layers,
        hidden: heads * head_dim,
        heads,
        kv_heads,
        vocab: div(a.vocab, 8),
        ffn: div(a.ffn, 8),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Adam,
    Lora,
    Rag,
    Mixed,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Adam => "adam",
            Kind::Lora => "lora",
            Kind::Rag => "rag",
            Kind::Mixed => "mixed",
        }
    }
}

/// What is trained (the optimizer states that exist).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Train {
    Adam,
    Lora,
    None,
}

/// Everything the generator needs, validated.
#[derive(Clone, Debug)]
pub struct Opts {
    pub preset: &'static str,
    pub scale: f64,
    pub arch: Arch,
    pub kind: Kind,
    /// What the training phases train (mixed: --train).
    pub train: Train,
    pub seq: u64,
    pub batch: u64,
    pub steps: u64,
    pub requests: u64,
    pub context: u64,
    pub decode: u64,
    pub lora_rank: u64,
    pub lora_alpha: u64,
    pub lora_targets: Vec<Proj>,
    pub flash: bool,
    pub recompute: bool,
    /// One ApplyAdamW over flat gradient, master and moment buffers (torch_npu's
    /// NpuFusedAdamW, which combines the parameter set into contiguous buffers).
    pub fused_optimizer: bool,
    pub seed: u64,
    /// '# free ADDR BYTES' comments where the caching allocator frees a block.
    pub frees: bool,
}

impl Opts {
    pub fn tokens(&self) -> u64 {
        self.seq * self.batch
    }
    pub fn trains(&self) -> bool {
        matches!(self.kind, Kind::Adam | Kind::Lora | Kind::Mixed)
    }
    pub fn serves(&self) -> bool {
        matches!(self.kind, Kind::Rag | Kind::Mixed)
    }
    /// Tokens of KV cache each request holds by the last decode step.
    pub fn kv_tokens(&self) -> u64 {
        self.context + self.decode
    }
    /// LoRA adapter parameters: r·(d_in + d_out) per target per layer
    /// (u3m_core::plan::lora_params for targets q,k,v,o).
    pub fn lora_params(&self) -> u64 {
        if self.train != Train::Lora {
            return 0;
        }
        let per_layer: u64 = self
            .lora_targets
            .iter()
            .map(|p| {
                let (i, o) = p.dims(&self.arch);
                self.lora_rank * (i + o)
            })
            .sum();
        self.arch.layers * per_layer
    }
    pub fn validate(&self) -> Result<(), PlanError> {
        core::validate_arch(&self.arch)?;
        let w = core::Workload {
            train: core::Train::None,
            seq: self.seq,
            batch: self.batch,
            requests: self.requests,
        };
        core::validate_workload(&w)?;
        let absurd = |what: &'static str, v: u64, max: u64| {
            if v > max {
                Err(PlanError::Absurd {
                    what,
                    value: v.to_string(),
                    max: max.to_string(),
                })
            } else {
                Ok(())
            }
        };
        absurd("--steps", self.steps, 1 << 20)?;
        absurd("--requests", self.requests, 1 << 16)?;
        absurd("--context + --decode-tokens", self.kv_tokens(), 1 << 24)?;
        absurd("--lora-rank", self.lora_rank, self.arch.hidden)?;
        if self.trains() && self.steps == 0 {
            return Err(PlanError::Zero("--steps"));
        }
        if self.serves() {
            if self.requests == 0 {
                return Err(PlanError::Zero("--requests"));
            }
            if self.context == 0 {
                return Err(PlanError::Zero("--context"));
            }
        }
        if self.train == Train::Lora {
            if self.lora_rank == 0 {
                return Err(PlanError::Zero("--lora-rank"));
            }
            if self.lora_targets.is_empty() {
                return Err(PlanError::Zero("--lora-targets"));
            }
        }
        Ok(())
    }
}

/// A parameter tensor: bf16 weight, and for trained ones the fp32 master
/// copy and Adam moments (12 bytes per parameter).
pub struct Param {
    pub n: u64,
    pub w: Tensor,
    pub state: Option<[Tensor; 3]>,
    pub grad: Option<Tensor>,
    /// Has optimizer state (set before a fused model's flat state exists).
    pub trained: bool,
}

/// The fused optimizer's flat buffers over every trained parameter, in model
/// order: bf16 gradients, fp32 master, m and v. They live for the whole run
/// (the gradients too: NpuFusedAdamW keeps its combined gradient buffer).
pub struct Flat {
    pub grad: Tensor,
    pub master: Tensor,
    pub m: Tensor,
    pub v: Tensor,
}

/// Allocates the flat buffers and points every trained parameter's state and
/// gradient at its slice of them; masters by a Cast from each weight, the
/// moments zeroed by one memset each.
fn flat_state(g: &mut Emit, params: &mut [Param]) -> Flat {
    let n: u64 = params.iter().filter(|p| p.trained).map(|p| p.n).sum();
    let grad = g.named("flat.grad", 2 * n, Component::Grads);
    let master = g.named("flat.master", 4 * n, Component::Optimizer);
    let m = g.named("flat.adam_m", 4 * n, Component::Optimizer);
    let v = g.named("flat.adam_v", 4 * n, Component::Optimizer);
    let view = |t: &Tensor, off: u64, bytes: u64| Tensor {
        addr: t.addr + off,
        bytes,
        comp: t.comp,
    };
    let mut off = 0;
    for p in params.iter_mut().filter(|p| p.trained) {
        let s = [
            view(&master, 4 * off, 4 * p.n),
            view(&m, 4 * off, 4 * p.n),
            view(&v, 4 * off, 4 * p.n),
        ];
        g.op("Cast", &[p.w.range()], &[s[0].range()], 0);
        p.state = Some(s);
        p.grad = Some(view(&grad, 2 * off, 2 * p.n));
        off += p.n;
    }
    g.memset(m.range());
    g.memset(v.range());
    Flat { grad, master, m, v }
}

pub struct Layer {
    pub proj: [usize; 7],
    pub norm1: usize,
    pub norm2: usize,
    /// (target, A [r × d_in], B [d_out × r]).
    pub lora: Vec<(Proj, usize, usize)>,
}

impl Layer {
    pub fn w(&self, p: Proj) -> usize {
        self.proj[p as usize]
    }
    pub fn lora(&self, p: Proj) -> Option<(usize, usize)> {
        self.lora
            .iter()
            .find(|(q, _, _)| *q == p)
            .map(|&(_, a, b)| (a, b))
    }
}

pub struct Model {
    pub params: Vec<Param>,
    pub emb: usize,
    pub layers: Vec<Layer>,
    pub fnorm: usize,
    pub head: usize,
    /// The fused optimizer's flat buffers (--fused-optimizer).
    pub flat: Option<Flat>,
}

impl Model {
    pub fn w(&self, i: usize) -> u3m_core::trace::Range {
        self.params[i].w.range()
    }

    /// Allocates every weight (and its optimizer state when trained) in
    /// model order, loads the weights from one host staging buffer (a
    /// checkpoint read shard by shard), initialises fp32 masters by a Cast
    /// from the bf16 weight, zeroes the moments; LoRA A is loaded, B zeroed
    /// (so the adapter starts as the identity, as peft does).
    pub fn load(g: &mut Emit, o: &Opts) -> Model {
        let a = &o.arch;
        let full = o.train == Train::Adam;
        // Fused: the states are views of flat buffers allocated after the weights.
        let per_param_state = !o.fused_optimizer;
        let mut params = Vec::new();
        let mut add =
            |g: &mut Emit, name: String, n: u64, comp: Component, trained: bool, zero: bool| {
                let w = g.named(&name, 2 * n, comp);
                if zero {
                    g.memset(w.range());
                } else {
                    g.h2d(w.range(), HOST_STAGE);
                }
                let state = if trained && per_param_state {
                    let m32 = g.named(&format!("{name}.master"), 4 * n, Component::Optimizer);
                    let m = g.named(&format!("{name}.adam_m"), 4 * n, Component::Optimizer);
                    let v = g.named(&format!("{name}.adam_v"), 4 * n, Component::Optimizer);
                    g.op("Cast", &[w.range()], &[m32.range()], 0);
                    g.memset(m.range());
                    g.memset(v.range());
                    Some([m32, m, v])
                } else {
                    None
                };
                params.push(Param {
                    n,
                    w,
                    state,
                    grad: None,
                    trained,
                });
                params.len() - 1
            };
        let (h, v) = (a.hidden, a.vocab);
        let emb = add(g, "embed".into(), v * h, Component::Weights, full, false);
        let mut layers = Vec::new();
        for l in 0..a.layers {
            let mut proj = [0; 7];
            for p in Proj::ALL {
                let (i, out) = p.dims(a);
                proj[p as usize] = add(
                    g,
                    format!("l{l}.{}", p.name()),
                    i * out,
                    Component::Weights,
                    full,
                    false,
                );
            }
            let norm1 = add(g, format!("l{l}.norm1"), h, Component::Weights, full, false);
            let norm2 = add(g, format!("l{l}.norm2"), h, Component::Weights, full, false);
            let mut lora = Vec::new();
            if o.train == Train::Lora {
                for &p in &o.lora_targets {
                    let (i, out) = p.dims(a);
                    let r = o.lora_rank;
                    let la = add(
                        g,
                        format!("l{l}.{}.lora_a", p.name()),
                        r * i,
                        Component::Adapters,
                        true,
                        false,
                    );
                    let lb = add(
                        g,
                        format!("l{l}.{}.lora_b", p.name()),
                        out * r,
                        Component::Adapters,
                        true,
                        true,
                    );
                    lora.push((p, la, lb));
                }
            }
            layers.push(Layer {
                proj,
                norm1,
                norm2,
                lora,
            });
        }
        let fnorm = add(g, "final_norm".into(), h, Component::Weights, full, false);
        let head = add(g, "lm_head".into(), h * v, Component::Weights, full, false);
        let flat = if o.fused_optimizer {
            Some(flat_state(g, &mut params))
        } else {
            None
        };
        Model {
            params,
            emb,
            layers,
            fnorm,
            head,
            flat,
        }
    }

    /// The parameters with optimizer state, in model order.
    pub fn trained(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.params.len()).filter(|&i| self.params[i].state.is_some())
    }
}
