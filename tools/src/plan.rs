//! `u3m plan`: the seed's sizing arithmetic as a tool. The figures come from
//! u3m_core::plan; this file only reads arguments and prints (docs/plan.md).

use crate::error::CliError;
use serde_json::{json, Value};
use std::fmt::Write;
use std::process::ExitCode;
use u3m_core::plan::{self as core, gib, ArchInput, Capacity, Component, Plan, Train, Workload};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrainArg {
    /// Full-parameter mixed-precision Adam (16 bytes per parameter).
    Adam,
    /// LoRA r = 16, α = 32 on q, k, v, o; base weights frozen.
    Lora,
    /// Inference only.
    None,
}

/// U3M_OVERSUB's default (core/src/config.rs), so `plan` answers for u3m as it
/// runs out of the box.
const DEFAULT_OVERSUB: f64 = 1.5;

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// Model preset (llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b); architecture flags override its fields.
    #[arg(long, value_name = "PRESET")]
    pub model: Option<String>,
    /// Transformer layers.
    #[arg(long, value_name = "L")]
    pub layers: Option<u64>,
    /// Hidden size.
    #[arg(long, value_name = "H")]
    pub hidden: Option<u64>,
    /// Attention (query) heads.
    #[arg(long, value_name = "A")]
    pub heads: Option<u64>,
    /// Key/value heads (grouped-query attention; = heads without GQA).
    #[arg(long = "kv-heads", value_name = "K")]
    pub kv_heads: Option<u64>,
    /// Vocabulary size.
    #[arg(long, value_name = "V")]
    pub vocab: Option<u64>,
    /// SwiGLU intermediate size [default: the preset's, else 8·H/3 rounded up to 256].
    #[arg(long, value_name = "F")]
    pub ffn: Option<u64>,
    /// What is trained.
    #[arg(long, value_enum, default_value_t = TrainArg::Adam)]
    pub train: TrainArg,
    /// Tokens per training sequence, and the context each served request holds.
    #[arg(long, value_name = "S", default_value_t = 2048)]
    pub seq: u64,
    /// Training micro-batch (sequences whose activations are live at once).
    #[arg(long, value_name = "B", default_value_t = 1)]
    pub batch: u64,
    /// Concurrent inference requests holding a KV cache of S tokens [default: B with --train none, else 0].
    #[arg(long, value_name = "R")]
    pub requests: Option<u64>,
    /// Physical HBM per device: a size (32G, 64GiB, bytes) or 910b1..910b4.
    #[arg(long, value_name = "BYTES", default_value = "910b4", value_parser = capacity)]
    pub hbm: u64,
    /// Virtual HBM as a multiple of physical (U3M_OVERSUB); 1 = without u3m.
    #[arg(long, value_name = "X", default_value_t = DEFAULT_OVERSUB)]
    pub oversub: f64,
    /// DRAM tier limit [default: not limited].
    #[arg(long, value_name = "BYTES", value_parser = capacity)]
    pub dram: Option<u64>,
    /// NVMe tier size [default: none, as without U3M_SWAP_DIR].
    #[arg(long, value_name = "BYTES", value_parser = capacity)]
    pub swap: Option<u64>,
    /// Print JSON (docs/plan.md) instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn capacity(s: &str) -> Result<u64, String> {
    core::parse_capacity(s).ok_or_else(|| {
        format!("'{s}' is not a size (4096, 64K, 1.5G, 32GiB: binary units) or a device (910b1, 910b2, 910b3, 910b4)")
    })
}

/// The plan the arguments describe, or a usage error (exit 2).
pub fn build(a: &PlanArgs) -> Result<Plan, CliError> {
    let usage = |e: core::PlanError| CliError::Usage(e.to_string());
    let input = ArchInput {
        layers: a.layers,
        hidden: a.hidden,
        heads: a.heads,
        kv_heads: a.kv_heads,
        vocab: a.vocab,
        ffn: a.ffn,
    };
    let arch = core::resolve_arch(a.model.as_deref(), &input).map_err(usage)?;
    let train = match a.train {
        TrainArg::Adam => Train::Adam,
        TrainArg::Lora => Train::Lora {
            rank: core::LORA_RANK,
        },
        TrainArg::None => Train::None,
    };
    let requests = a
        .requests
        .unwrap_or(if train == Train::None { a.batch } else { 0 });
    let workload = Workload {
        train,
        seq: a.seq,
        batch: a.batch,
        requests,
    };
    let cap = Capacity {
        hbm: a.hbm,
        oversub: a.oversub,
        dram: a.dram,
        swap: a.swap.unwrap_or(0),
    };
    core::plan(arch, workload, cap).map_err(usage)
}

pub fn main(a: &PlanArgs) -> Result<ExitCode, CliError> {
    let p = build(a)?;
    let out = if a.json {
        let mut s = serde_json::to_string_pretty(&document(&p, a.model.as_deref()))
            .expect("JSON of plain values");
        s.push('\n');
        s
    } else {
        text(&p, a.model.as_deref())
    };
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}

pub const SCHEMA: u64 = 1;

pub fn document(p: &Plan, preset: Option<&str>) -> Value {
    let a = &p.arch;
    let pr = &p.params;
    let c = &p.capacity;
    let (hbm, dram, nvme, unplaced) = p.placed();
    let lora = match p.workload.train {
        Train::Lora { rank } => {
            json!({ "rank": rank, "alpha": core::LORA_ALPHA, "targets": core::LORA_TARGETS })
        }
        _ => Value::Null,
    };
    json!({
        "schema": SCHEMA,
        "model": {
            "preset": preset.map(|n| core::preset(n).map(|p| p.name).unwrap_or(n)),
            "layers": a.layers, "hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv_heads,
            "head_dim": a.head_dim(), "vocab": a.vocab, "ffn": a.ffn,
        },
        "workload": {
            "train": p.workload.train.name(), "seq": p.workload.seq, "batch": p.workload.batch,
            "requests": p.workload.requests, "lora": lora,
        },
        "params": {
            "embedding": pr.embedding, "attention": pr.attention, "mlp": pr.mlp, "norms": pr.norms,
            "lm_head": pr.lm_head, "total": pr.total, "lora": pr.lora, "trainable": pr.trainable,
        },
        "kv_bytes_per_token": p.kv_per_token,
        "components": p.rows.iter().map(|r| json!({
            "name": r.component.name(), "bytes": r.bytes,
            "hbm": r.hbm, "dram": r.dram, "nvme": r.nvme, "unplaced": r.unplaced,
        })).collect::<Vec<_>>(),
        "total_bytes": p.total,
        "capacity": { "hbm": c.hbm, "oversub": c.oversub, "budget": p.budget, "dram": c.dram, "swap": c.swap },
        "placed": { "hbm": hbm, "dram": dram, "nvme": nvme, "unplaced": unplaced },
        "hbm_ratio": (p.hbm_ratio() * 1e4).round() / 1e4,
        "fits": p.verdict.fits(),
        "fits_without_u3m": p.fits_without_u3m(),
        "verdict": p.verdict.name(),
        "reason": p.reason(),
    })
}

/// 13015864320 → "13,015,864,320".
fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn billions(n: u64) -> String {
    format!("{:.3} B", n as f64 / 1e9)
}

fn g2(b: u64) -> String {
    format!("{:.2}", gib(b))
}

/// How each component is sized, for the table's last column.
fn formula(c: Component, p: &Plan) -> String {
    let w = &p.workload;
    match c {
        Component::Activations if w.train == Train::None => "none kept (inference)".into(),
        Component::Activations => format!("s·b·h·(34 + 5·a·s/h)·L, s {} b {}", w.seq, w.batch),
        Component::Adapters => match w.train {
            Train::Lora { rank } => format!(
                "2 B × {} adapter params (r {rank} on q,k,v,o)",
                grouped(p.params.lora)
            ),
            _ => "no LoRA".into(),
        },
        Component::Weights => match w.train {
            Train::Lora { .. } => format!("2 B × {} params, frozen", grouped(p.params.total)),
            _ => format!("2 B × {} params", grouped(p.params.total)),
        },
        Component::Gradients => format!("2 B × {} trainable", grouped(p.params.trainable)),
        Component::KvCache => {
            format!(
                "{} KiB/token × {} tokens × {} requests",
                p.kv_per_token as f64 / 1024.0,
                w.seq,
                w.requests
            )
        }
        Component::Optimizer => format!(
            "12 B × {} trainable (fp32 master, m, v)",
            grouped(p.params.trainable)
        ),
    }
}

pub fn text(p: &Plan, preset: Option<&str>) -> String {
    let a = &p.arch;
    let pr = &p.params;
    let c = &p.capacity;
    let mut s = String::new();
    let name = preset
        .map(|n| core::preset(n).map(|p| p.name).unwrap_or(n))
        .unwrap_or("custom");
    let _ = writeln!(
        s,
        "model      {name}: {} layers, hidden {}, {} heads ({} kv heads of {}), vocab {}, ffn {}",
        a.layers,
        a.hidden,
        a.heads,
        a.kv_heads,
        a.head_dim(),
        a.vocab,
        a.ffn
    );
    let _ = writeln!(
        s,
        "params     {} ({}): embedding {}, attention {}, mlp {}, norms {}, lm head {}",
        grouped(pr.total),
        billions(pr.total),
        billions(pr.embedding),
        billions(pr.attention),
        billions(pr.mlp),
        grouped(pr.norms),
        billions(pr.lm_head)
    );
    let _ = writeln!(
        s,
        "workload   train {} ({} trainable), seq {}, batch {}, requests {}",
        p.workload.train.name(),
        grouped(pr.trainable),
        p.workload.seq,
        p.workload.batch,
        p.workload.requests
    );
    let _ = writeln!(
        s,
        "kv cache   {} B per token ({} KiB)",
        grouped(p.kv_per_token),
        p.kv_per_token as f64 / 1024.0
    );
    s.push('\n');

    let mut rows: Vec<[String; 7]> =
        vec![["component", "GiB", "HBM", "DRAM", "NVMe", "unplaced", "how"].map(String::from)];
    for r in &p.rows {
        rows.push([
            r.component.name().into(),
            g2(r.bytes),
            g2(r.hbm),
            g2(r.dram),
            g2(r.nvme),
            g2(r.unplaced),
            formula(r.component, p),
        ]);
    }
    let (h, d, n, u) = p.placed();
    rows.push([
        "total".into(),
        g2(p.total),
        g2(h),
        g2(d),
        g2(n),
        g2(u),
        String::new(),
    ]);
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let mut line = format!("{:<w$}", r[0], w = widths[0]);
        for i in 1..6 {
            let _ = write!(line, "  {:>w$}", r[i], w = widths[i]);
        }
        let _ = write!(line, "  {}", r[6]);
        s.push_str(line.trim_end());
        s.push('\n');
    }
    s.push('\n');

    let _ = writeln!(
        s,
        "capacity   HBM {} GiB, oversub {} -> budget {} GiB, DRAM {}, NVMe {}",
        g2(c.hbm),
        c.oversub,
        g2(p.budget),
        c.dram
            .map_or("not limited".into(), |b| format!("{} GiB", g2(b))),
        if c.swap == 0 {
            "none".into()
        } else {
            format!("{} GiB", g2(c.swap))
        }
    );
    let _ = writeln!(
        s,
        "footprint  {} GiB = {:.2} GB, {:.2} × HBM",
        g2(p.total),
        p.total as f64 / 1e9,
        p.hbm_ratio()
    );
    let _ = writeln!(
        s,
        "fits       {}: {}",
        if p.verdict.fits() { "yes" } else { "no" },
        p.reason()
    );
    let _ = writeln!(
        s,
        "no u3m     {}",
        if p.fits_without_u3m() {
            "fits: HBM alone holds it".to_string()
        } else {
            format!(
                "does not fit: HBM alone holds {:.0}% of it (--oversub {:.2} would admit it)",
                100.0 / p.hbm_ratio(),
                ceil2(p.hbm_ratio())
            )
        }
    );
    s
}

/// Rounded up to 2 decimals, so the printed ratio always admits the footprint.
fn ceil2(x: f64) -> f64 {
    (x * 100.0).ceil() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_oversub_is_u3ms() {
        assert_eq!(
            DEFAULT_OVERSUB,
            u3m_core::config::Config::defaults().oversub
        );
    }

    #[test]
    fn grouping() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(13_015_864_320), "13,015,864,320");
    }
}
