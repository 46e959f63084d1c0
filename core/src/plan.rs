//! Capacity planning for Llama-shaped models: parameter count from the
//! architecture, the memory of weights, gradients, optimizer states,
//! activations and KV cache by the design.md §1 formulas (GQA-correct), and
//! how that footprint splits across HBM / DRAM / NVMe under u3m's
//! oversubscription. Pure arithmetic: no I/O, no allocation beyond the result.
//! `u3m plan` prints it; docs/plan.md explains every formula and choice.

use std::fmt;

/// fp16/bf16: weights, gradients, KV cache and (in the activation formula)
/// activations.
pub const HALF: u64 = 2;
/// Mixed-precision Adam per trained parameter: fp32 master copy + first and
/// second moments (3 × 4 bytes).
pub const ADAM_STATE: u64 = 12;
/// The seed's LoRA setting (r = 16, α = 32). α only scales the adapter's
/// output (α / r = 2); it costs no memory.
pub const LORA_RANK: u64 = 16;
pub const LORA_ALPHA: u64 = 32;
/// Projections that carry a LoRA adapter (the attention block).
pub const LORA_TARGETS: [&str; 4] = ["q", "k", "v", "o"];

/// Sanity bounds: anything above them is a typo, not a model.
const MAX_LAYERS: u64 = 1024;
const MAX_HIDDEN: u64 = 1 << 17;
const MAX_VOCAB: u64 = 1 << 24;
const MAX_FFN: u64 = 1 << 20;
const MAX_SEQ: u64 = 1 << 24;
const MAX_BATCH: u64 = 1 << 16;
const MAX_REQUESTS: u64 = 1 << 20;
const MAX_CAPACITY: u64 = 1 << 60;
const MAX_OVERSUB: f64 = 64.0;
/// A footprint above 1 EiB is certainly a mistake in the input.
const MAX_FOOTPRINT: u128 = 1 << 60;

/// A decoder-only transformer with RMSNorm, (grouped-query) attention and a
/// SwiGLU MLP, untied LM head: the Llama family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arch {
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub vocab: u64,
    /// SwiGLU intermediate size.
    pub ffn: u64,
}

impl Arch {
    pub fn head_dim(&self) -> u64 {
        self.hidden / self.heads
    }
    /// Width of K (and of V): kv_heads × head_dim; `hidden` without GQA.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim()
    }
}

/// Llama's default SwiGLU width: 2/3 of 4h, rounded up to a multiple of 256
/// (Llama-2-7B/13B follow it; the 70B models and Llama-3 use a multiplier,
/// so their presets give the width explicitly).
pub fn default_ffn(hidden: u64) -> u64 {
    let raw = 8 * hidden / 3;
    raw.div_ceil(256) * 256
}

pub struct Preset {
    pub name: &'static str,
    pub arch: Arch,
}

const fn arch(layers: u64, hidden: u64, heads: u64, kv_heads: u64, vocab: u64, ffn: u64) -> Arch {
    Arch {
        layers,
        hidden,
        heads,
        kv_heads,
        vocab,
        ffn,
    }
}

/// Published configurations (config.json of each model).
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "llama2-7b",
        arch: arch(32, 4096, 32, 32, 32000, 11008),
    },
    Preset {
        name: "llama2-13b",
        arch: arch(40, 5120, 40, 40, 32000, 13824),
    },
    Preset {
        name: "llama2-70b",
        arch: arch(80, 8192, 64, 8, 32000, 28672),
    },
    Preset {
        name: "llama3-8b",
        arch: arch(32, 4096, 32, 8, 128256, 14336),
    },
    Preset {
        name: "llama3-70b",
        arch: arch(80, 8192, 64, 8, 128256, 28672),
    },
];

/// Case, '-', '_' and '.' do not matter: "Llama-2-13B" is llama2-13b.
fn norm_name(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, '-' | '_' | '.' | ' '))
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

pub fn preset(name: &str) -> Result<&'static Preset, PlanError> {
    let n = norm_name(name);
    PRESETS
        .iter()
        .find(|p| norm_name(p.name) == n)
        .ok_or_else(|| PlanError::UnknownPreset(name.to_string()))
}

/// Architecture fields given on the command line; with a preset they
/// override its values.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArchInput {
    pub layers: Option<u64>,
    pub hidden: Option<u64>,
    pub heads: Option<u64>,
    pub kv_heads: Option<u64>,
    pub vocab: Option<u64>,
    pub ffn: Option<u64>,
}

/// The architecture from a preset and/or explicit fields, validated.
pub fn resolve_arch(preset_name: Option<&str>, i: &ArchInput) -> Result<Arch, PlanError> {
    let base = match preset_name {
        Some(n) => Some(preset(n)?.arch),
        None => None,
    };
    let pick = |v: Option<u64>, b: Option<u64>| v.or(b);
    let fields = [
        ("--layers", pick(i.layers, base.map(|a| a.layers))),
        ("--hidden", pick(i.hidden, base.map(|a| a.hidden))),
        ("--heads", pick(i.heads, base.map(|a| a.heads))),
        ("--kv-heads", pick(i.kv_heads, base.map(|a| a.kv_heads))),
        ("--vocab", pick(i.vocab, base.map(|a| a.vocab))),
    ];
    let missing: Vec<&str> = fields
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        return Err(PlanError::MissingArch(missing.join(", ")));
    }
    let [l, h, a, k, v] = fields.map(|(_, v)| v.unwrap());
    // An explicit --hidden without --ffn gets Llama's rule, not the preset's
    // width for another hidden size.
    let ffn = match (i.ffn, i.hidden, base) {
        (Some(f), _, _) => f,
        (None, None, Some(b)) => b.ffn,
        _ => default_ffn(h),
    };
    let a = Arch {
        layers: l,
        hidden: h,
        heads: a,
        kv_heads: k,
        vocab: v,
        ffn,
    };
    validate_arch(&a)?;
    Ok(a)
}

fn in_range(what: &'static str, v: u64, max: u64) -> Result<(), PlanError> {
    if v == 0 {
        Err(PlanError::Zero(what))
    } else if v > max {
        Err(PlanError::Absurd {
            what,
            value: v.to_string(),
            max: max.to_string(),
        })
    } else {
        Ok(())
    }
}

pub fn validate_arch(a: &Arch) -> Result<(), PlanError> {
    in_range("--layers", a.layers, MAX_LAYERS)?;
    in_range("--hidden", a.hidden, MAX_HIDDEN)?;
    // Above hidden / heads they are caught as not dividing.
    in_range("--heads", a.heads, MAX_HIDDEN)?;
    in_range("--kv-heads", a.kv_heads, MAX_HIDDEN)?;
    in_range("--vocab", a.vocab, MAX_VOCAB)?;
    in_range("--ffn", a.ffn, MAX_FFN)?;
    if a.hidden % a.heads != 0 {
        return Err(PlanError::NotDividing {
            what: "--heads",
            by: a.heads,
            of: "--hidden",
            value: a.hidden,
        });
    }
    if a.heads % a.kv_heads != 0 {
        return Err(PlanError::NotDividing {
            what: "--kv-heads",
            by: a.kv_heads,
            of: "--heads",
            value: a.heads,
        });
    }
    Ok(())
}

/// What is trained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Train {
    /// Full-parameter mixed-precision Adam.
    Adam,
    /// LoRA adapters of this rank on q, k, v, o; the base weights frozen.
    Lora { rank: u64 },
    /// Inference only.
    None,
}

impl Train {
    pub fn name(self) -> &'static str {
        match self {
            Train::Adam => "adam",
            Train::Lora { .. } => "lora",
            Train::None => "none",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Workload {
    pub train: Train,
    /// Tokens per training sequence, and the context each served request holds.
    pub seq: u64,
    /// Training micro-batch (sequences whose activations are live at once).
    pub batch: u64,
    /// Concurrent inference requests, each holding a KV cache of `seq` tokens.
    pub requests: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Capacity {
    /// Physical HBM of one device.
    pub hbm: u64,
    /// Virtual HBM as a multiple of physical (U3M_OVERSUB): everything
    /// placed, on any tier, counts against hbm × oversub.
    pub oversub: f64,
    /// DRAM tier limit; None: not limited.
    pub dram: Option<u64>,
    /// NVMe tier size; 0: no NVMe tier (as U3M_SWAP_DIR unset).
    pub swap: u64,
}

/// HBM sizes of Ascend 910B parts (design.md §2), for `--hbm 910b4`.
pub const DEVICES: &[(&str, u64)] = &[
    ("910b1", 64 << 30),
    ("910b2", 64 << 30),
    ("910b3", 64 << 30),
    ("910b4", 32 << 30),
];

/// A capacity: a device name from `DEVICES` or a size as U3M_* sizes take it
/// (4096, 64K, 1.5G, 32GiB: binary units).
pub fn parse_capacity(s: &str) -> Option<u64> {
    let n = norm_name(s);
    if let Some(&(_, b)) = DEVICES.iter().find(|(d, _)| *d == n) {
        return Some(b);
    }
    crate::config::parse_size(s)
}

/// Parameter counts by part of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub embedding: u64,
    /// q, k, v, o of every layer (no biases).
    pub attention: u64,
    /// gate, up, down of every layer.
    pub mlp: u64,
    /// Two RMSNorm weight vectors per layer and the final one.
    pub norms: u64,
    pub lm_head: u64,
    pub total: u64,
    /// LoRA adapter parameters (0 unless LoRA).
    pub lora: u64,
    /// Parameters with gradients and optimizer state.
    pub trainable: u64,
}

pub fn params(a: &Arch, train: Train) -> Params {
    let (h, kvd, l) = (a.hidden, a.kv_dim(), a.layers);
    let embedding = a.vocab * h;
    let attention = l * (2 * h * h + 2 * h * kvd);
    let mlp = l * 3 * h * a.ffn;
    let norms = l * 2 * h + h;
    let lm_head = a.vocab * h;
    let total = embedding + attention + mlp + norms + lm_head;
    let lora = match train {
        Train::Lora { rank } => lora_params(a, rank),
        _ => 0,
    };
    let trainable = match train {
        Train::Adam => total,
        Train::Lora { .. } => lora,
        Train::None => 0,
    };
    Params {
        embedding,
        attention,
        mlp,
        norms,
        lm_head,
        total,
        lora,
        trainable,
    }
}

/// A rank-r adapter on a d_in → d_out projection is A (r × d_in) and
/// B (d_out × r): r·(d_in + d_out). Per layer: q and o are h → h, k and v
/// are h → kv_dim, so r·(2h + 2h + 2·(h + kv_dim)) = r·(6h + 2·kv_dim),
/// which is 8·r·h without GQA.
pub fn lora_params(a: &Arch, rank: u64) -> u64 {
    a.layers * rank * (6 * a.hidden + 2 * a.kv_dim())
}

/// KV cache of one token: K and V of every layer, fp16.
pub fn kv_bytes_per_token(a: &Arch) -> u64 {
    2 * a.layers * a.kv_dim() * HALF
}

/// The seed's activation estimate, s·b·h·(34 + 5·a·s/h)·L bytes (fp16, no
/// recomputation), expanded so it is exact in integers:
/// 34·s·b·h·L + 5·a·s²·b·L.
pub fn activation_bytes(a: &Arch, seq: u64, batch: u64) -> u128 {
    let (s, b, h, n, l) = (
        seq as u128,
        batch as u128,
        a.hidden as u128,
        a.heads as u128,
        a.layers as u128,
    );
    34 * s * b * h * l + 5 * n * s * s * b * l
}

/// Parts of the footprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Activations,
    Adapters,
    Weights,
    Gradients,
    KvCache,
    Optimizer,
}

impl Component {
    /// The order in which components claim HBM, hottest first; what comes
    /// last spills first. Activations are made and consumed within a step.
    /// Full Adam: weights are read forward and backward, gradients written
    /// backward and read by the optimizer, a served request's KV cache every
    /// decode step, the optimizer states once per step (the coldest, as the
    /// seed puts the moments in DRAM / SSD). LoRA: the adapters and their
    /// gradients and states are tiny and touched every step; the frozen base
    /// weights spill first, as they are read-only and can be streamed ahead
    /// of use and dropped without a write-back (design.md §2), while the KV
    /// cache is written every step.
    pub fn claim_order(train: Train) -> [Component; 6] {
        use Component::*;
        match train {
            Train::Lora { .. } => [
                Activations,
                Adapters,
                Gradients,
                Optimizer,
                KvCache,
                Weights,
            ],
            Train::Adam | Train::None => [
                Activations,
                Adapters,
                Weights,
                Gradients,
                KvCache,
                Optimizer,
            ],
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Component::Activations => "activations",
            Component::Adapters => "adapters",
            Component::Weights => "weights",
            Component::Gradients => "gradients",
            Component::KvCache => "kv_cache",
            Component::Optimizer => "optimizer",
        }
    }
}

/// One component and where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub component: Component,
    pub bytes: u64,
    pub hbm: u64,
    pub dram: u64,
    pub nvme: u64,
    /// Bytes no tier can take (the plan does not fit).
    pub unplaced: u64,
}

/// The fit decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// Everything in HBM; no tiering needed.
    Hbm { free: u64 },
    /// Fits with u3m: `spill` bytes live in DRAM / NVMe.
    Spill { spill: u64 },
    /// The footprint is above hbm × oversub by `short` bytes.
    Oversub { short: u64 },
    /// Within hbm × oversub, but DRAM + NVMe cannot hold the spill.
    Host { short: u64 },
}

impl Verdict {
    pub fn fits(&self) -> bool {
        matches!(self, Verdict::Hbm { .. } | Verdict::Spill { .. })
    }
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Hbm { .. } => "hbm",
            Verdict::Spill { .. } => "spill",
            Verdict::Oversub { .. } => "oversub",
            Verdict::Host { .. } => "host",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub arch: Arch,
    pub workload: Workload,
    pub capacity: Capacity,
    pub params: Params,
    pub kv_per_token: u64,
    /// Every component in `Component::claim_order` (zero-byte ones included).
    pub rows: [Row; 6],
    pub total: u64,
    /// hbm × oversub: what may be placed across all tiers.
    pub budget: u64,
    pub verdict: Verdict,
}

impl Plan {
    pub fn row(&self, c: Component) -> &Row {
        self.rows
            .iter()
            .find(|r| r.component == c)
            .expect("every component has a row")
    }
    /// Bytes per tier: (hbm, dram, nvme, unplaced).
    pub fn placed(&self) -> (u64, u64, u64, u64) {
        self.rows.iter().fold((0, 0, 0, 0), |t, r| {
            (t.0 + r.hbm, t.1 + r.dram, t.2 + r.nvme, t.3 + r.unplaced)
        })
    }
    /// Footprint as a multiple of HBM: the smallest --oversub that admits it.
    pub fn hbm_ratio(&self) -> f64 {
        self.total as f64 / self.capacity.hbm as f64
    }
    pub fn fits_without_u3m(&self) -> bool {
        self.total <= self.capacity.hbm
    }
    /// One sentence: whether it fits and why.
    pub fn reason(&self) -> String {
        let g = |b: u64| format!("{:.2} GiB", gib(b));
        let c = &self.capacity;
        match self.verdict {
            Verdict::Hbm { free } => {
                format!(
                    "the footprint {} fits in HBM {} with {} free",
                    g(self.total),
                    g(c.hbm),
                    g(free)
                )
            }
            Verdict::Spill { spill } => {
                let (_, dram, nvme, _) = self.placed();
                format!(
                    "with u3m: {} is {:.2} × HBM, within --oversub {}; {} spills ({} to DRAM, {} to NVMe)",
                    g(self.total),
                    self.hbm_ratio(),
                    c.oversub,
                    g(spill),
                    g(dram),
                    g(nvme)
                )
            }
            Verdict::Oversub { short } => format!(
                "the footprint {} is {:.2} × HBM {}, above --oversub {} (budget {}): {} short",
                g(self.total),
                self.hbm_ratio(),
                g(c.hbm),
                c.oversub,
                g(self.budget),
                g(short)
            ),
            Verdict::Host { short } => format!(
                "{} must spill below HBM but DRAM ({}) + NVMe ({}) hold only {}: {} short",
                g(self.total.saturating_sub(c.hbm)),
                c.dram.map_or("not limited".to_string(), g),
                g(c.swap),
                g(c.dram.unwrap_or(u64::MAX).saturating_add(c.swap)),
                g(short)
            ),
        }
    }
}

pub fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

pub fn validate_workload(w: &Workload) -> Result<(), PlanError> {
    in_range("--seq", w.seq, MAX_SEQ)?;
    in_range("--batch", w.batch, MAX_BATCH)?;
    if w.requests > MAX_REQUESTS {
        return Err(PlanError::Absurd {
            what: "--requests",
            value: w.requests.to_string(),
            max: MAX_REQUESTS.to_string(),
        });
    }
    if let Train::Lora { rank } = w.train {
        in_range("LoRA rank", rank, MAX_HIDDEN)?;
    }
    Ok(())
}

pub fn validate_capacity(c: &Capacity) -> Result<(), PlanError> {
    in_range("--hbm", c.hbm, MAX_CAPACITY)?;
    if !(c.oversub.is_finite() && (1.0..=MAX_OVERSUB).contains(&c.oversub)) {
        return Err(PlanError::Oversub(c.oversub));
    }
    for (what, v) in [("--dram", c.dram.unwrap_or(0)), ("--swap", c.swap)] {
        if v > MAX_CAPACITY {
            return Err(PlanError::Absurd {
                what,
                value: v.to_string(),
                max: MAX_CAPACITY.to_string(),
            });
        }
    }
    Ok(())
}

/// Sizes every component and places them: HBM first in claim order, then
/// what spills goes to DRAM, then NVMe, all within hbm × oversub.
pub fn plan(arch: Arch, workload: Workload, capacity: Capacity) -> Result<Plan, PlanError> {
    validate_arch(&arch)?;
    validate_workload(&workload)?;
    validate_capacity(&capacity)?;
    let p = params(&arch, workload.train);
    let kv_per_token = kv_bytes_per_token(&arch);
    let (p_total, p_lora, p_train) = (p.total as u128, p.lora as u128, p.trainable as u128);
    let training = workload.train != Train::None;
    let order = Component::claim_order(workload.train);
    let sizes: [u128; 6] = order.map(|c| match c {
        Component::Activations if training => activation_bytes(&arch, workload.seq, workload.batch),
        Component::Activations => 0,
        Component::Adapters => p_lora * HALF as u128,
        Component::Weights => p_total * HALF as u128,
        Component::Gradients => p_train * HALF as u128,
        Component::KvCache => {
            kv_per_token as u128 * workload.seq as u128 * workload.requests as u128
        }
        Component::Optimizer => p_train * ADAM_STATE as u128,
    });
    let total: u128 = sizes.iter().sum();
    if total > MAX_FOOTPRINT {
        return Err(PlanError::Absurd {
            what: "footprint",
            value: format!("{total} bytes"),
            max: format!("{MAX_FOOTPRINT} (1 EiB); check --seq, --batch and --requests"),
        });
    }
    let total = total as u64;
    // Same rounding as the engine's virtual capacity.
    let budget = (capacity.hbm as f64 * capacity.oversub) as u64;
    let mut room_hbm = capacity.hbm;
    let mut room_below = budget.saturating_sub(capacity.hbm);
    let mut room_dram = capacity.dram.unwrap_or(u64::MAX);
    let mut room_nvme = capacity.swap;
    let take = |want: &mut u64, room: &mut u64| {
        let t = (*want).min(*room);
        *want -= t;
        *room -= t;
        t
    };
    let rows = std::array::from_fn(|i| {
        let bytes = sizes[i] as u64;
        let mut left = bytes;
        let hbm = take(&mut left, &mut room_hbm);
        // Below HBM, the oversubscription allowance and the tier both bound.
        let mut below = left.min(room_below);
        let dram = take(&mut below, &mut room_dram);
        let nvme = take(&mut below, &mut room_nvme);
        room_below -= dram + nvme;
        let unplaced = left - dram - nvme;
        Row {
            component: order[i],
            bytes,
            hbm,
            dram,
            nvme,
            unplaced,
        }
    });
    let verdict = if total <= capacity.hbm {
        Verdict::Hbm {
            free: capacity.hbm - total,
        }
    } else if total > budget {
        Verdict::Oversub {
            short: total - budget,
        }
    } else {
        let unplaced: u64 = rows.iter().map(|r: &Row| r.unplaced).sum();
        if unplaced > 0 {
            Verdict::Host { short: unplaced }
        } else {
            Verdict::Spill {
                spill: total - capacity.hbm,
            }
        }
    };
    Ok(Plan {
        arch,
        workload,
        capacity,
        params: p,
        kv_per_token,
        rows,
        total,
        budget,
        verdict,
    })
}

#[derive(Clone, Debug, PartialEq)]
pub enum PlanError {
    UnknownPreset(String),
    MissingArch(String),
    Zero(&'static str),
    Absurd {
        what: &'static str,
        value: String,
        max: String,
    },
    NotDividing {
        what: &'static str,
        by: u64,
        of: &'static str,
        value: u64,
    },
    Oversub(f64),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::UnknownPreset(n) => {
                let known: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
                write!(f, "unknown model preset '{n}'; known presets: {}", known.join(", "))?;
                if norm_name(n).contains("llama313b") {
                    // The seed's "LLAMA3 13B" does not exist; its arithmetic is Llama-2-13B's.
                    write!(f, " (there is no Llama-3-13B; the seed's 13B figures are llama2-13b's)")?;
                }
                Ok(())
            }
            PlanError::MissingArch(m) => write!(
                f,
                "missing architecture field(s) {m}: give --model PRESET or all of --layers, --hidden, --heads, --kv-heads, --vocab"
            ),
            PlanError::Zero(w) => write!(f, "{w} must be at least 1"),
            PlanError::Absurd { what, value, max } => write!(f, "{what} {value} is beyond any real model or machine (at most {max})"),
            PlanError::NotDividing { what, by, of, value } => {
                write!(f, "{what} {by} does not divide {of} {value}")
            }
            PlanError::Oversub(x) => {
                write!(f, "--oversub {x} must be between 1 (HBM only) and {MAX_OVERSUB}")
            }
        }
    }
}

impl std::error::Error for PlanError {}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const KIB: u64 = 1 << 10;

    fn p(name: &str) -> Arch {
        preset(name).unwrap().arch
    }

    fn cap(hbm: u64, oversub: f64) -> Capacity {
        Capacity {
            hbm,
            oversub,
            dram: None,
            swap: 0,
        }
    }

    #[test]
    fn parameter_counts_match_the_published_sizes() {
        // Llama-2-7B. Per layer: attention 4·4096² = 67,108,864; MLP
        // 3·4096·11008 = 135,266,304; norms 2·4096 = 8,192; sum 202,383,360.
        // × 32 = 6,476,267,520; + embedding and LM head 2·32000·4096 =
        // 262,144,000; + final norm 4,096 = 6,738,415,616 ("6.74 B").
        assert_eq!(params(&p("llama2-7b"), Train::Adam).total, 6_738_415_616);
        // Llama-2-13B. Per layer: 4·5120² = 104,857,600; 3·5120·13824 =
        // 212,336,640; 2·5120 = 10,240; sum 317,204,480. × 40 =
        // 12,688,179,200; + 2·32000·5120 = 327,680,000; + 5,120 =
        // 13,015,864,320 ("13.0 B").
        let p13 = params(&p("llama2-13b"), Train::Adam);
        assert_eq!(p13.total, 13_015_864_320);
        assert_eq!(p13.embedding, 32000 * 5120);
        assert_eq!(p13.norms, 40 * 2 * 5120 + 5120);
        // Llama-3-8B (GQA, K and V are 4096 → 8·128 = 1024). Per layer:
        // q, o 2·4096² = 33,554,432; k, v 2·4096·1024 = 8,388,608; MLP
        // 3·4096·14336 = 176,160,768; norms 8,192; sum 218,112,000. × 32 =
        // 6,979,584,000; + 2·128256·4096 = 1,050,673,152; + 4,096 =
        // 8,030,261,248 ("8.03 B").
        assert_eq!(params(&p("llama3-8b"), Train::Adam).total, 8_030_261_248);
        // Llama-2-70B, published as 68.98 B (≈ 69 B); only check the scale.
        let t70 = params(&p("llama2-70b"), Train::Adam).total;
        assert!((68_900_000_000..69_100_000_000).contains(&t70), "{t70}");
    }

    #[test]
    fn default_ffn_follows_the_llama_rule() {
        // 8·4096/3 = 10922 → next multiple of 256 is 43·256 = 11008.
        assert_eq!(default_ffn(4096), 11008);
        // 8·5120/3 = 13653 → 54·256 = 13824.
        assert_eq!(default_ffn(5120), 13824);
    }

    #[test]
    fn seed_llama2_13b_full_adam_training() {
        let w = Workload {
            train: Train::Adam,
            seq: 1024,
            batch: 1,
            requests: 0,
        };
        let pl = plan(p("llama2-13b"), w, cap(32 * GIB, 1.0)).unwrap();
        let n = 13_015_864_320u64;
        // The seed: weights 13 B × 2 = 26 GB, gradients 26 GB, Adam states
        // 13 B × 12 = 156 GB.
        assert_eq!(pl.row(Component::Weights).bytes, n * 2);
        assert_eq!(pl.row(Component::Gradients).bytes, n * 2);
        assert_eq!(pl.row(Component::Optimizer).bytes, n * 12);
        // 16 bytes per parameter ≈ 208 GB.
        let model_state = n * 16;
        assert_eq!(model_state, 208_253_829_120);
        // Activations at s = 1024, b = 1: s·b·h = 1024·5120 = 5,242,880;
        // 5·a·s/h = 5·40·1024/5120 = 40; (34 + 40) = 74; × L = 40:
        // 5,242,880 · 74 · 40 = 15,518,924,800 B = 14.45 GiB (the seed's "14.5 GB").
        assert_eq!(pl.row(Component::Activations).bytes, 15_518_924_800);
        assert_eq!(pl.row(Component::KvCache).bytes, 0);
        assert_eq!(pl.total, model_state + 15_518_924_800);
        // 223.8 GB ≈ the seed's 222.5 GB (it rounds 13.016 B to 13 B).
        assert!(!pl.verdict.fits());
    }

    #[test]
    fn kv_cache_per_token_mha_and_gqa() {
        // Llama-2-13B: 2 (K, V) × 40 layers × 5120 (40 heads × 128) × 2 B = 819,200 B = 800 KiB.
        assert_eq!(kv_bytes_per_token(&p("llama2-13b")), 2 * 40 * 5120 * 2);
        assert_eq!(kv_bytes_per_token(&p("llama2-13b")), 800 * KIB);
        // Llama-3-8B with GQA: 2 × 32 layers × 8 kv heads × 128 × 2 B = 131,072 B = 128 KiB
        // (not 2 × 32 × 4096 × 2 = 512 KiB).
        assert_eq!(kv_bytes_per_token(&p("llama3-8b")), 128 * KIB);
        // The seed's request: seq 2048, batch 1 → 800 KiB × 2048 = 1,600 MiB = 1.5625 GiB
        // ("1.56 GB"); 120 concurrent → 187.5 GiB.
        let w = Workload {
            train: Train::None,
            seq: 2048,
            batch: 1,
            requests: 120,
        };
        let pl = plan(p("llama2-13b"), w, cap(32 * GIB, 1.5)).unwrap();
        assert_eq!(pl.row(Component::KvCache).bytes, 120 * 1600 * (1 << 20));
        assert_eq!(
            pl.row(Component::Activations).bytes,
            0,
            "inference keeps no activations"
        );
        assert_eq!(pl.row(Component::Gradients).bytes, 0);
        assert_eq!(pl.row(Component::Optimizer).bytes, 0);
    }

    #[test]
    fn lora_adapters_on_q_k_v_o() {
        // Llama-2-13B, r = 16, MHA: per projection r·(5120 + 5120) = 163,840; 4 projections =
        // 655,360 per layer (= 8·r·h); × 40 = 26,214,400 trainable parameters.
        let a = p("llama2-13b");
        assert_eq!(lora_params(&a, 16), 26_214_400);
        // Llama-3-8B, GQA: q, o 16·(4096 + 4096) = 131,072 each; k, v 16·(4096 + 1024) = 81,920
        // each; 425,984 per layer; × 32 = 13,631,488.
        assert_eq!(lora_params(&p("llama3-8b"), 16), 13_631_488);
        let w = Workload {
            train: Train::Lora { rank: 16 },
            seq: 1024,
            batch: 1,
            requests: 0,
        };
        let pl = plan(a, w, cap(32 * GIB, 1.5)).unwrap();
        // Frozen base: weights only, no gradients or Adam state for them.
        assert_eq!(pl.row(Component::Weights).bytes, 13_015_864_320 * 2);
        assert_eq!(pl.row(Component::Adapters).bytes, 26_214_400 * 2);
        assert_eq!(pl.row(Component::Gradients).bytes, 26_214_400 * 2);
        assert_eq!(pl.row(Component::Optimizer).bytes, 26_214_400 * 12);
        assert_eq!(pl.params.trainable, 26_214_400);
        // 26,031,728,640 + 16·26,214,400 = 419,430,400 + 15,518,924,800 activations
        // = 41,970,083,840 B = 39.09 GiB: over 32 GiB, within 1.5 × 32 = 48 GiB.
        assert_eq!(pl.total, 41_970_083_840);
        assert_eq!(
            pl.verdict,
            Verdict::Spill {
                spill: 41_970_083_840 - 32 * GIB
            }
        );
    }

    #[test]
    fn placement_fills_hbm_hottest_first_then_dram_then_nvme() {
        let w = Workload {
            train: Train::Lora { rank: 16 },
            seq: 1024,
            batch: 1,
            requests: 0,
        };
        let a = p("llama2-13b");
        let pl = plan(
            a,
            w,
            Capacity {
                hbm: 32 * GIB,
                oversub: 1.5,
                dram: Some(4 * GIB),
                swap: 8 * GIB,
            },
        )
        .unwrap();
        let act = 15_518_924_800u64;
        let adapters = 26_214_400u64 * 2;
        // HBM takes activations, the adapters with their gradients and Adam states
        // (2 + 2 + 12 bytes per adapter parameter), then as much of the frozen weights as is left.
        assert_eq!(pl.row(Component::Activations).hbm, act);
        assert_eq!(pl.row(Component::Adapters).hbm, adapters);
        assert_eq!(pl.row(Component::Gradients).hbm, 26_214_400 * 2);
        assert_eq!(pl.row(Component::Optimizer).hbm, 26_214_400 * 12);
        let w_hbm = 32 * GIB - act - 26_214_400 * 16;
        assert_eq!(pl.row(Component::Weights).hbm, w_hbm);
        // The rest of the weights: 4 GiB to DRAM, the remainder to NVMe.
        let w_rest = 13_015_864_320 * 2 - w_hbm;
        assert_eq!(pl.row(Component::Weights).dram, 4 * GIB);
        assert_eq!(pl.row(Component::Weights).nvme, w_rest - 4 * GIB);
        let (h, d, n, u) = pl.placed();
        assert_eq!((h, d, u), (32 * GIB, 4 * GIB, 0));
        assert_eq!(h + d + n, pl.total);
        assert!(pl.verdict.fits());
        // 1 GiB less NVMe than the spill needs: short by exactly the difference.
        let need_nvme = n;
        let tight = Capacity {
            hbm: 32 * GIB,
            oversub: 1.5,
            dram: Some(4 * GIB),
            swap: need_nvme - GIB,
        };
        assert_eq!(
            plan(a, w, tight).unwrap().verdict,
            Verdict::Host { short: GIB }
        );
    }

    #[test]
    fn fit_decision_at_several_hbm_and_oversub_values() {
        // Llama-3-8B inference, 64 requests of 4096 tokens:
        // weights 8,030,261,248 × 2 = 16,060,522,496 B (14.96 GiB);
        // KV 128 KiB × 4096 × 64 = 32 GiB; total 46.96 GiB.
        let w = Workload {
            train: Train::None,
            seq: 4096,
            batch: 1,
            requests: 64,
        };
        let a = p("llama3-8b");
        let total = 16_060_522_496 + 32 * GIB;
        let at = |hbm: u64, x: f64| plan(a, w, cap(hbm, x)).unwrap();
        // 64 GiB (910B2): fits in HBM with 64 GiB − total free.
        let v = at(64 * GIB, 1.0);
        assert_eq!(v.total, total);
        assert_eq!(
            v.verdict,
            Verdict::Hbm {
                free: 64 * GIB - total
            }
        );
        // 32 GiB (910B4) without oversubscription: total − 32 GiB short.
        assert_eq!(
            at(32 * GIB, 1.0).verdict,
            Verdict::Oversub {
                short: total - 32 * GIB
            }
        );
        // 32 GiB at 1.4: budget 44.8 GiB = 48,103,633,715 B (rounded down) < 46.96 GiB.
        assert_eq!(
            at(32 * GIB, 1.4).verdict,
            Verdict::Oversub {
                short: total - 48_103_633_715
            }
        );
        // 32 GiB at the default 1.5: budget 48 GiB ≥ total: fits, total − 32 GiB spilled, all
        // to DRAM (not limited), and it is the KV cache that spills (weights claim HBM first).
        let v = at(32 * GIB, 1.5);
        assert_eq!(
            v.verdict,
            Verdict::Spill {
                spill: total - 32 * GIB
            }
        );
        assert_eq!(v.row(Component::Weights).hbm, 16_060_522_496);
        assert_eq!(v.row(Component::KvCache).hbm, 32 * GIB - 16_060_522_496);
        assert_eq!(v.row(Component::KvCache).dram, total - 32 * GIB);
        assert!(!v.fits_without_u3m());
        assert!((v.hbm_ratio() - total as f64 / (32 * GIB) as f64).abs() < 1e-12);
        // Exactly at the HBM size: fits with 0 free.
        assert_eq!(at(total, 1.0).verdict, Verdict::Hbm { free: 0 });
    }

    #[test]
    fn oversub_bounds_what_goes_below_hbm_even_with_room_there() {
        // Full Adam for Llama-2-7B (6,738,415,616 × 16 = 107,814,649,856 B ≈ 100.4 GiB plus
        // activations) on 64 GiB at 1.5: budget 96 GiB; DRAM unlimited does not help.
        let w = Workload {
            train: Train::Adam,
            seq: 512,
            batch: 1,
            requests: 0,
        };
        let pl = plan(p("llama2-7b"), w, cap(64 * GIB, 1.5)).unwrap();
        // activations: 512·1·4096·(34 + 5·32·512/4096)·32 = 512·4096·54·32 = 3,623,878,656.
        assert_eq!(pl.row(Component::Activations).bytes, 3_623_878_656);
        let total = 107_814_649_856 + 3_623_878_656;
        assert_eq!(
            pl.verdict,
            Verdict::Oversub {
                short: total - 96 * GIB
            }
        );
        let (h, d, n, u) = pl.placed();
        assert_eq!((h, d, n, u), (64 * GIB, 32 * GIB, 0, total - 96 * GIB));
        // The coldest (optimizer states) is what is left unplaced.
        assert_eq!(pl.row(Component::Optimizer).unplaced, u);
    }

    #[test]
    fn bad_input_is_named() {
        let none = ArchInput::default();
        let e = resolve_arch(Some("llama3-13b"), &none).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("llama2-13b") && m.contains("llama3-8b") && m.contains("no Llama-3-13B"),
            "{m}"
        );
        assert_eq!(
            resolve_arch(Some("Llama-2-13B"), &none).unwrap(),
            p("llama2-13b")
        );
        let e = resolve_arch(
            None,
            &ArchInput {
                layers: Some(2),
                hidden: Some(64),
                ..none
            },
        )
        .unwrap_err();
        assert_eq!(
            e,
            PlanError::MissingArch("--heads, --kv-heads, --vocab".into())
        );
        let full = ArchInput {
            layers: Some(2),
            hidden: Some(64),
            heads: Some(4),
            kv_heads: Some(2),
            vocab: Some(100),
            ffn: None,
        };
        let a = resolve_arch(None, &full).unwrap();
        assert_eq!(a.ffn, 256, "8·64/3 = 170 → 256");
        assert!(matches!(
            resolve_arch(
                None,
                &ArchInput {
                    heads: Some(5),
                    ..full
                }
            ),
            Err(PlanError::NotDividing {
                what: "--heads",
                ..
            })
        ));
        assert!(matches!(
            resolve_arch(
                None,
                &ArchInput {
                    kv_heads: Some(3),
                    ..full
                }
            ),
            Err(PlanError::NotDividing {
                what: "--kv-heads",
                ..
            })
        ));
        assert_eq!(
            resolve_arch(
                None,
                &ArchInput {
                    layers: Some(0),
                    ..full
                }
            ),
            Err(PlanError::Zero("--layers"))
        );
        assert!(matches!(
            resolve_arch(
                None,
                &ArchInput {
                    layers: Some(1 << 40),
                    ..full
                }
            ),
            Err(PlanError::Absurd { .. })
        ));
        // Preset overrides: --layers on top of llama2-13b keeps the rest.
        let o = resolve_arch(
            Some("llama2-13b"),
            &ArchInput {
                layers: Some(20),
                ..none
            },
        )
        .unwrap();
        assert_eq!((o.layers, o.hidden, o.ffn), (20, 5120, 13824));
        let w = Workload {
            train: Train::Adam,
            seq: 1 << 24,
            batch: 1 << 16,
            requests: 0,
        };
        assert!(matches!(
            plan(p("llama2-7b"), w, cap(GIB, 1.0)),
            Err(PlanError::Absurd {
                what: "footprint",
                ..
            })
        ));
        let ok = Workload {
            train: Train::Adam,
            seq: 1,
            batch: 1,
            requests: 0,
        };
        assert_eq!(
            plan(p("llama2-7b"), Workload { seq: 0, ..ok }, cap(GIB, 1.0)).unwrap_err(),
            PlanError::Zero("--seq")
        );
        assert_eq!(
            plan(p("llama2-7b"), ok, cap(GIB, 0.5)).unwrap_err(),
            PlanError::Oversub(0.5)
        );
        assert!(plan(p("llama2-7b"), ok, cap(GIB, f64::NAN)).is_err());
        assert_eq!(
            plan(p("llama2-7b"), ok, cap(0, 1.0)).unwrap_err(),
            PlanError::Zero("--hbm")
        );
    }

    #[test]
    fn capacities_parse_as_u3m_sizes_or_device_names() {
        assert_eq!(parse_capacity("910B4"), Some(32 * GIB));
        assert_eq!(parse_capacity("910b2"), Some(64 * GIB));
        assert_eq!(parse_capacity("32G"), Some(32 * GIB));
        assert_eq!(parse_capacity("1.5GiB"), Some(3 * GIB / 2));
        assert_eq!(parse_capacity("4096"), Some(4096));
        assert_eq!(parse_capacity("lots"), None);
    }
}
