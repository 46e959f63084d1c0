//! `u3m synth`: writes traces (format v1) of Llama-shaped workloads — full
//! Adam training, LoRA fine-tuning, RAG serving, and training interleaved
//! with a serving burst — as a framework running them on one device would
//! produce: real operator sequences with flop counts, tensors carved out of
//! caching-allocator segments (interior pointers, block reuse), optionally
//! shrunk by `--scale` so that the trace replays in seconds. Model shapes
//! and sizing formulas come from u3m_core::plan (`u3m plan`). docs/synth.md.

mod alloc;
mod emit;
mod infer;
mod model;
mod train;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Value};
use u3m_core::opclass::OpClass;
use u3m_core::plan as core;

use crate::error::CliError;
use emit::Emit;
use model::{Kind, Model, Opts, Proj, Train};

/// What a tensor is, for `--sizes` and the `tag=` of the segment it opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Weights,
    Adapters,
    Grads,
    Optimizer,
    Activations,
    Kv,
    Workspace,
}

impl Component {
    pub const COUNT: usize = 7;
    pub const ALL: [Component; 7] = [
        Component::Weights,
        Component::Adapters,
        Component::Grads,
        Component::Optimizer,
        Component::Activations,
        Component::Kv,
        Component::Workspace,
    ];
    pub fn tag(self) -> &'static str {
        match self {
            Component::Weights => "weight",
            Component::Adapters => "adapter",
            Component::Grads => "grad",
            Component::Optimizer => "optim",
            Component::Activations => "act",
            Component::Kv => "kv",
            Component::Workspace => "workspace",
        }
    }
    /// The key in `--sizes`.
    pub fn key(self) -> &'static str {
        match self {
            Component::Weights => "weights",
            Component::Adapters => "adapters",
            Component::Grads => "grads",
            Component::Optimizer => "optimizer",
            Component::Activations => "activations",
            Component::Kv => "kv",
            Component::Workspace => "workspace",
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadArg {
    /// Full-parameter training, mixed-precision AdamW (16 B per parameter).
    Adam,
    /// LoRA fine-tuning: base weights frozen, adapters trained.
    Lora,
    /// RAG serving: prefill R requests of C tokens, then T decode steps.
    Rag,
    /// Training steps, a serving burst, training steps again.
    Mixed,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrainArg {
    Adam,
    Lora,
}

/// A repeated option takes its last value, so a base command line can be
/// extended with overrides (as bench scripts do).
#[derive(clap::Args, Debug)]
#[command(args_override_self = true)]
pub struct SynthArgs {
    /// Model preset: llama2-7b, llama2-13b, llama3-8b (GQA), or another preset of `u3m plan`.
    #[arg(long, value_name = "PRESET")]
    pub model: String,
    /// What runs.
    #[arg(long, value_enum)]
    pub workload: WorkloadArg,
    /// Divide hidden size, FFN width, vocabulary and heads by F (head_dim kept): a small model of the same shape.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub scale: f64,
    /// Transformer layers [default: the preset's].
    #[arg(long, value_name = "L")]
    pub layers: Option<u64>,
    /// Training: tokens per sequence.
    #[arg(long, value_name = "S", default_value_t = 1024)]
    pub seq: u64,
    /// Training: sequences per step.
    #[arg(long, value_name = "B", default_value_t = 1)]
    pub batch: u64,
    /// Training steps (mixed: before and again after the serving burst).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub steps: u64,
    /// Serving: concurrent requests.
    #[arg(long, value_name = "R", default_value_t = 8)]
    pub requests: u64,
    /// Serving: context (prompt + retrieved) tokens per request.
    #[arg(long, value_name = "C", default_value_t = 1024)]
    pub context: u64,
    /// Serving: decode steps (tokens generated per request).
    #[arg(long = "decode-tokens", value_name = "T", default_value_t = 32)]
    pub decode_tokens: u64,
    /// What the training phases of `mixed` train.
    #[arg(long, value_enum, default_value_t = TrainArg::Adam)]
    pub train: TrainArg,
    /// LoRA rank.
    #[arg(long = "lora-rank", value_name = "R", default_value_t = core::LORA_RANK)]
    pub lora_rank: u64,
    /// LoRA α (scales the adapter output by α/r; recorded in the header comment).
    #[arg(long = "lora-alpha", value_name = "A", default_value_t = core::LORA_ALPHA)]
    pub lora_alpha: u64,
    /// Projections with an adapter, comma-separated of q,k,v,o,gate,up,down (`u3m plan` assumes q,k,v,o).
    #[arg(long = "lora-targets", value_name = "LIST", default_value = "q,v")]
    pub lora_targets: String,
    /// Training attention by FlashAttention: no s² activations are kept.
    #[arg(long)]
    pub flash: bool,
    /// Activation checkpointing: keep each layer's input only, re-run its forward before its backward.
    #[arg(long)]
    pub recompute: bool,
    /// Adam: one fused ApplyAdamW over flat gradient/master/moment buffers (torch_npu NpuFusedAdamW) instead of one per tensor.
    #[arg(long = "fused-optimizer")]
    pub fused_optimizer: bool,
    /// Seeds the input data (the host buffers token ids are copied from); the memory pattern does not depend on it.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Mark each block the caching allocator frees with a '# free ADDR BYTES' comment (the FREE_COMPLETED torch_npu reports to u3m's tracker: docs/torch-npu.md); `acl_replay --frees` turns them into u3m_discard hints.
    #[arg(long)]
    pub frees: bool,
    /// Trace file to write; `-` for stdout.
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Print the footprint breakdown as JSON (docs/synth.md) instead of writing a trace (or as well, with -o FILE).
    #[arg(long)]
    pub sizes: bool,
}

fn usage(e: impl ToString) -> CliError {
    CliError::Usage(e.to_string())
}

/// The validated options the arguments describe.
pub fn options(a: &SynthArgs) -> Result<Opts, CliError> {
    let p = core::preset(&a.model).map_err(usage)?;
    if !(a.scale.is_finite() && a.scale >= 1.0 && a.scale <= 1e6) {
        return Err(usage(format!(
            "--scale {} must be a number from 1 (full size) up",
            a.scale
        )));
    }
    let mut arch = model::scale_arch(p.arch, a.scale);
    if let Some(l) = a.layers {
        arch.layers = l;
    }
    let kind = match a.workload {
        WorkloadArg::Adam => Kind::Adam,
        WorkloadArg::Lora => Kind::Lora,
        WorkloadArg::Rag => Kind::Rag,
        WorkloadArg::Mixed => Kind::Mixed,
    };
    let train = match (kind, a.train) {
        (Kind::Adam, _) | (Kind::Mixed, TrainArg::Adam) => Train::Adam,
        (Kind::Lora, _) | (Kind::Mixed, TrainArg::Lora) => Train::Lora,
        (Kind::Rag, _) => Train::None,
    };
    let mut targets = Vec::new();
    for t in a.lora_targets.split(',').filter(|t| !t.is_empty()) {
        let p = Proj::parse(t).ok_or_else(|| {
            usage(format!(
                "--lora-targets: unknown projection '{t}' (q, k, v, o, gate, up, down)"
            ))
        })?;
        if !targets.contains(&p) {
            targets.push(p);
        }
    }
    targets.sort();
    let o = Opts {
        preset: p.name,
        scale: a.scale,
        arch,
        kind,
        train,
        seq: a.seq,
        batch: a.batch,
        steps: a.steps,
        requests: a.requests,
        context: a.context,
        decode: a.decode_tokens,
        lora_rank: a.lora_rank,
        lora_alpha: a.lora_alpha,
        lora_targets: targets,
        flash: a.flash,
        recompute: a.recompute,
        fused_optimizer: a.fused_optimizer,
        seed: a.seed,
        frees: a.frees,
    };
    o.validate().map_err(usage)?;
    if o.fused_optimizer && o.train == Train::None {
        return Err(usage("--fused-optimizer: the rag workload trains nothing"));
    }
    Ok(o)
}

/// What a generation run produced, for `--sizes`.
pub struct Report {
    pub events: u64,
    pub ops: u64,
    pub by_class: [u64; OpClass::COUNT],
    pub copy_bytes: u64,
    pub segments: usize,
    pub reserved: u64,
    pub device_bytes: u64,
    pub peak: [u64; Component::COUNT],
    pub peak_total: u64,
}

fn describe(o: &Opts) -> Vec<String> {
    let a = &o.arch;
    let mut v = vec![format!(
        "u3m synth: {} workload, model {} scale {}: {} layers, hidden {}, {} heads ({} kv heads of {}), vocab {}, ffn {}",
        o.kind.name(),
        o.preset,
        o.scale,
        a.layers,
        a.hidden,
        a.heads,
        a.kv_heads,
        a.head_dim(),
        a.vocab,
        a.ffn
    )];
    if o.trains() {
        v.push(format!(
            "training: {} steps{}, seq {} batch {}, {}{}{}{}",
            o.steps,
            if o.kind == Kind::Mixed {
                " before and after serving"
            } else {
                ""
            },
            o.seq,
            o.batch,
            if o.train == Train::Adam {
                "full AdamW"
            } else {
                "LoRA"
            },
            if o.flash { ", flash attention" } else { "" },
            if o.recompute {
                ", activation recomputation"
            } else {
                ""
            },
            if o.fused_optimizer {
                ", one fused ApplyAdamW over flat buffers"
            } else {
                ""
            }
        ));
    }
    if o.train == Train::Lora {
        let t: Vec<&str> = o.lora_targets.iter().map(|p| p.name()).collect();
        v.push(format!(
            "lora: r={} alpha={} scaling={} targets={}",
            o.lora_rank,
            o.lora_alpha,
            o.lora_alpha as f64 / o.lora_rank as f64,
            t.join(",")
        ));
    }
    if o.serves() {
        v.push(format!(
            "serving: {} requests, context {} tokens, {} decode steps; KV {} B per token",
            o.requests,
            o.context,
            o.decode,
            core::kv_bytes_per_token(&o.arch)
        ));
    }
    v.push(
        "tensors live inside caching-allocator segments (A events); '# tensor NAME ADDR BYTES TAG' names the persistent ones"
            .into(),
    );
    if o.frees {
        v.push("'# free ADDR BYTES': the caching allocator freed the block at ADDR (BYTES requested), as torch_npu reports it to u3m".into());
    }
    v
}

/// Writes the workload's events to `out` (None: count only).
pub fn generate(o: &Opts, out: Option<Box<dyn Write + '_>>) -> io::Result<Report> {
    let mut g = Emit::new(out)?;
    g.frees = o.frees;
    for line in describe(o) {
        g.comment(&line);
    }
    let mut m = Model::load(&mut g, o);
    let mut step = 0;
    let mut train = |g: &mut Emit, m: &mut Model, n: u64| {
        for _ in 0..n {
            train::step(g, m, o, step);
            step += 1;
        }
    };
    match o.kind {
        Kind::Adam | Kind::Lora => train(&mut g, &mut m, o.steps),
        Kind::Rag => infer::serve(&mut g, &m, o, 0),
        Kind::Mixed => {
            train(&mut g, &mut m, o.steps);
            infer::serve(&mut g, &m, o, 0);
            train(&mut g, &mut m, o.steps);
        }
    }
    g.flush()?;
    let mem = &g.mem;
    Ok(Report {
        events: g.events,
        ops: g.ops,
        by_class: g.by_class,
        copy_bytes: g.copy_bytes,
        segments: mem.segments(),
        reserved: mem.reserved,
        device_bytes: mem.device_bytes(),
        peak: mem.peak,
        peak_total: mem.peak_total,
    })
}

/// The `--sizes` document: measured peaks per component next to the
/// u3m_core::plan formulas for the same shape.
pub fn sizes(o: &Opts, r: &Report) -> Value {
    let a = &o.arch;
    let train = match o.train {
        Train::Adam => core::Train::Adam,
        Train::Lora => core::Train::Lora { rank: o.lora_rank },
        Train::None => core::Train::None,
    };
    let p = core::params(a, train);
    let trainable = match o.train {
        Train::Adam => p.total,
        Train::Lora => o.lora_params(),
        Train::None => 0,
    };
    let kv_tok = core::kv_bytes_per_token(a);
    let act_formula = if o.trains() {
        core::activation_bytes(a, o.seq, o.batch) as u64
    } else {
        0
    };
    let kv = if o.serves() {
        kv_tok * o.kv_tokens() * o.requests
    } else {
        0
    };
    let mut bytes = serde_json::Map::new();
    for c in Component::ALL {
        bytes.insert(c.key().into(), json!(r.peak[c as usize]));
    }
    bytes.insert("total".into(), json!(r.peak.iter().sum::<u64>()));
    let classes: serde_json::Map<String, Value> = OpClass::ALL
        .iter()
        .filter(|c| r.by_class[**c as usize] > 0)
        .map(|c| (c.name().into(), json!(r.by_class[*c as usize])))
        .collect();
    let lora = if o.train == Train::Lora {
        json!({ "rank": o.lora_rank, "alpha": o.lora_alpha,
                "targets": o.lora_targets.iter().map(|p| p.name()).collect::<Vec<_>>() })
    } else {
        Value::Null
    };
    json!({
        "schema": 1,
        "model": {
            "preset": o.preset, "scale": o.scale, "layers": a.layers, "hidden": a.hidden, "heads": a.heads,
            "kv_heads": a.kv_heads, "head_dim": a.head_dim(), "vocab": a.vocab, "ffn": a.ffn,
        },
        "workload": {
            "kind": o.kind.name(),
            "train": match o.train { Train::Adam => "adam", Train::Lora => "lora", Train::None => "none" },
            "seq": o.seq, "batch": o.batch, "steps": o.steps, "requests": o.requests, "context": o.context,
            "decode_tokens": o.decode, "flash": o.flash, "recompute": o.recompute, "fused_optimizer": o.fused_optimizer, "seed": o.seed, "lora": lora,
        },
        "params": { "total": p.total, "trainable": trainable, "lora": o.lora_params() },
        "kv_bytes_per_token": kv_tok,
        "bytes": Value::Object(bytes),
        "formula": {
            "weights": p.total * core::HALF,
            "adapters": o.lora_params() * core::HALF,
            "grads": trainable * core::HALF,
            "optimizer": trainable * core::ADAM_STATE,
            "activations": act_formula,
            "kv": kv,
        },
        "trace": {
            "events": r.events, "ops": r.ops, "ops_by_class": Value::Object(classes),
            "segments": r.segments, "reserved_bytes": r.reserved, "peak_allocated_bytes": r.peak_total,
            "device_bytes": r.device_bytes,
            "copy_bytes": r.copy_bytes,
        },
    })
}

pub fn main(a: &SynthArgs) -> Result<ExitCode, CliError> {
    let o = options(a)?;
    let io_err = |what: &'static str| move |err: io::Error| CliError::Io { what, err };
    let to_stdout = a.output.as_deref().is_some_and(|p| p.as_os_str() == "-");
    if a.sizes && to_stdout {
        return Err(usage(
            "--sizes prints JSON on stdout: give -o a file to write the trace as well",
        ));
    }
    if !a.sizes && a.output.is_none() {
        return Err(usage(
            "give -o PATH (or -o - for stdout) for the trace, or --sizes",
        ));
    }
    let t0 = std::time::Instant::now();
    crate::progress::start("u3m synth");
    crate::progress::stage("writing");
    let report = match &a.output {
        Some(_) if to_stdout => {
            let out = io::stdout().lock();
            generate(&o, Some(Box::new(BufWriter::with_capacity(1 << 20, out))))
                .map_err(io_err("writing the trace"))?
        }
        Some(path) => {
            let f = File::create(path).map_err(|err| CliError::Io {
                what: "creating the trace file",
                err,
            })?;
            generate(&o, Some(Box::new(BufWriter::with_capacity(1 << 20, f))))
                .map_err(io_err("writing the trace"))?
        }
        None => generate(&o, None).map_err(io_err("generating"))?,
    };
    crate::progress::clear();
    if let Some(path) = a.output.as_ref().filter(|_| !to_stdout) {
        // the one-line result (stderr: stdout may carry --sizes JSON)
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        eprintln!(
            "u3m synth: wrote {} ({} events, {} operators, {}) in {:.1} s",
            path.display(),
            report.events,
            report.ops,
            crate::human::bytes(size),
            t0.elapsed().as_secs_f64()
        );
    }
    if a.sizes {
        let mut s =
            serde_json::to_string_pretty(&sizes(&o, &report)).expect("JSON of plain values");
        s.push('\n');
        io::stdout()
            .write_all(s.as_bytes())
            .map_err(io_err("writing stdout"))?;
    }
    Ok(ExitCode::SUCCESS)
}
