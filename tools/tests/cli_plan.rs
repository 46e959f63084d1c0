//! `u3m plan` end to end: the binary's JSON and table against sizes computed
//! by hand here (the arithmetic is written out, not copied from an output),
//! the fit decision at several capacities, and exit status 2 with a useful
//! message for bad input.

use serde_json::Value;
use std::process::{Command, Output};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn u3m(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_u3m"))
        .arg("plan")
        .args(args)
        .output()
        .expect("run u3m")
}

fn json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let o = u3m(&a);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("valid JSON")
}

fn component(v: &Value, name: &str) -> u64 {
    v["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()["bytes"]
        .as_u64()
        .unwrap()
}

fn placed(v: &Value, name: &str, tier: &str) -> u64 {
    v["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()[tier]
        .as_u64()
        .unwrap()
}

/// Llama-2-13B parameters: per layer attention 4·5120² = 104,857,600, SwiGLU
/// 3·5120·13824 = 212,336,640, two norms 2·5120 = 10,240; × 40 layers, plus
/// embedding and LM head 2·32000·5120 and the final norm 5120.
const P13: u64 = 40 * (4 * 5120 * 5120 + 3 * 5120 * 13824 + 2 * 5120) + 2 * 32000 * 5120 + 5120;

/// The seed's activation formula s·b·h·(34 + 5·a·s/h)·L for Llama-2-13B at
/// s = 1024, b = 1: 5·40·1024/5120 = 40, so 1024·5120·(34 + 40)·40.
const ACT13_1024: u64 = 1024 * 5120 * (34 + 40) * 40;

#[test]
fn seed_llama2_13b_full_adam_training() {
    assert_eq!(P13, 13_015_864_320, "13.0 B parameters");
    let v = json(&[
        "--model",
        "llama2-13b",
        "--train",
        "adam",
        "--seq",
        "1024",
        "--batch",
        "1",
        "--hbm",
        "32G",
    ]);
    assert_eq!(v["params"]["total"], P13);
    assert_eq!(v["params"]["trainable"], P13);
    // The seed: weights 13 B × 2 B = 26 GB, gradients 26 GB, Adam 13 B × 12 B = 156 GB.
    assert_eq!(component(&v, "weights"), P13 * 2);
    assert_eq!(component(&v, "gradients"), P13 * 2);
    assert_eq!(component(&v, "optimizer"), P13 * 12);
    // 16 B per parameter ≈ 208 GB (decimal), as the seed's 13 B × 16.
    let model_state = P13 * 16;
    assert_eq!(model_state / 1_000_000_000, 208);
    // Activations 15,518,924,800 B = 14.45 GiB (the seed's "14.5 GB").
    assert_eq!(component(&v, "activations"), ACT13_1024);
    assert_eq!(format!("{:.2}", ACT13_1024 as f64 / GIB as f64), "14.45");
    assert_eq!(component(&v, "kv_cache"), 0, "training serves no requests");
    assert_eq!(v["total_bytes"], model_state + ACT13_1024);
    // 208.40 GiB on one 32 GiB card at the default --oversub 1.5 (48 GiB budget): no.
    assert_eq!(v["fits"], false);
    assert_eq!(v["verdict"], "oversub");
    assert_eq!(v["capacity"]["budget"], 48 * GIB);
    assert_eq!(v["placed"]["unplaced"], model_state + ACT13_1024 - 48 * GIB);
    // Even the model state alone, split over 4 cards (ZeRO-3, as the seed), is 52 GB per card.
    assert!(model_state / 4 > 48 * GIB);
}

#[test]
fn kv_cache_mha_and_gqa() {
    // Llama-2-13B, MHA: 2 (K and V) × 40 layers × 5120 × 2 B = 819,200 B = 800 KiB per token.
    let v = json(&[
        "--model",
        "llama2-13b",
        "--train",
        "none",
        "--seq",
        "2048",
        "--requests",
        "120",
    ]);
    assert_eq!(v["kv_bytes_per_token"], 2 * 40 * 5120 * 2);
    assert_eq!(v["kv_bytes_per_token"], 800 * KIB);
    // The seed's request: 800 KiB × 2048 tokens = 1600 MiB ("1.56 GB"); 120 of them.
    assert_eq!(component(&v, "kv_cache"), 120 * 1600 * MIB);
    assert_eq!(component(&v, "activations"), 0);
    assert_eq!(component(&v, "optimizer"), 0);

    // Llama-3-8B, GQA: 2 × 32 layers × 8 kv heads × 128 × 2 B = 131,072 B = 128 KiB per token,
    // a quarter of what hidden (4096) in place of kv_heads × head_dim would give.
    let v = json(&[
        "--model",
        "llama3-8b",
        "--train",
        "none",
        "--seq",
        "4096",
        "--requests",
        "8",
    ]);
    assert_eq!(v["kv_bytes_per_token"], 2 * 32 * 8 * 128 * 2);
    assert_eq!(v["kv_bytes_per_token"], 128 * KIB);
    assert_eq!(component(&v, "kv_cache"), 128 * KIB * 4096 * 8);
    assert_eq!(v["model"]["head_dim"], 128);

    // The same model given field by field gives the same figures.
    let f = json(&[
        "--layers",
        "32",
        "--hidden",
        "4096",
        "--heads",
        "32",
        "--kv-heads",
        "8",
        "--vocab",
        "128256",
        "--ffn",
        "14336",
        "--train",
        "none",
        "--seq",
        "4096",
        "--requests",
        "8",
    ]);
    assert_eq!(f["components"], v["components"]);
    assert_eq!(f["params"], v["params"]);
    // Llama-3-8B: per layer q, o 2·4096² + k, v 2·4096·1024 + MLP 3·4096·14336 + norms 2·4096,
    // × 32; + embedding and LM head 2·128256·4096 + final norm 4096 = 8.03 B.
    let p8: u64 = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)
        + 2 * 128256 * 4096
        + 4096;
    assert_eq!(f["params"]["total"], p8);
    assert_eq!(p8, 8_030_261_248);
}

#[test]
fn lora_r16_on_q_k_v_o() {
    let v = json(&[
        "--model",
        "llama2-13b",
        "--train",
        "lora",
        "--seq",
        "1024",
        "--hbm",
        "32G",
        "--oversub",
        "1.5",
    ]);
    // Each adapted d_in → d_out projection gets A (r × d_in) and B (d_out × r): r·(d_in + d_out).
    // MHA, so q, k, v, o are all 5120 → 5120: 4 × 16 × (5120 + 5120) = 655,360 per layer, × 40.
    let lora: u64 = 40 * 4 * 16 * (5120 + 5120);
    assert_eq!(lora, 26_214_400);
    assert_eq!(v["params"]["lora"], lora);
    assert_eq!(v["params"]["trainable"], lora);
    assert_eq!(v["workload"]["lora"]["rank"], 16);
    assert_eq!(v["workload"]["lora"]["alpha"], 32);
    // Base weights frozen: stored in fp16, no gradients or Adam states for them.
    assert_eq!(component(&v, "weights"), P13 * 2);
    assert_eq!(component(&v, "adapters"), lora * 2);
    assert_eq!(component(&v, "gradients"), lora * 2);
    assert_eq!(component(&v, "optimizer"), lora * 12);
    assert_eq!(component(&v, "activations"), ACT13_1024);
    let total = P13 * 2 + lora * 16 + ACT13_1024; // 41,970,083,840 B = 39.09 GiB
    assert_eq!(v["total_bytes"], total);
    // 39.09 GiB on 32 GiB at 1.5: fits with u3m, 7.09 GiB spilled — all of it frozen weights,
    // which spill first (clean: dropped without a write-back).
    assert_eq!(v["fits"], true);
    assert_eq!(v["fits_without_u3m"], false);
    assert_eq!(v["verdict"], "spill");
    assert_eq!(placed(&v, "weights", "dram"), total - 32 * GIB);
    assert_eq!(placed(&v, "optimizer", "hbm"), lora * 12);
    // On a 64 GiB 910B2 it needs no tiering.
    let v = json(&[
        "--model",
        "llama2-13b",
        "--train",
        "lora",
        "--seq",
        "1024",
        "--hbm",
        "910b2",
    ]);
    assert_eq!(v["verdict"], "hbm");
    assert_eq!(v["placed"]["hbm"], total);

    // GQA changes k and v: Llama-3-8B q, o 16·(4096 + 4096), k, v 16·(4096 + 1024), × 32.
    let v = json(&["--model", "llama3-8b", "--train", "lora"]);
    assert_eq!(
        v["params"]["lora"],
        32 * (2 * 16 * (4096 + 4096) + 2 * 16 * (4096 + 1024))
    );
}

#[test]
fn fit_decision_at_several_capacities() {
    // Llama-3-8B serving 64 requests of 4096 tokens: weights 8,030,261,248 × 2 B, KV
    // 128 KiB × 4096 × 64 = 32 GiB; 46.96 GiB in all.
    let base = [
        "--model",
        "llama3-8b",
        "--train",
        "none",
        "--seq",
        "4096",
        "--requests",
        "64",
    ];
    let total = 8_030_261_248u64 * 2 + 32 * GIB;
    let at = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        json(&a)
    };
    let v = at(&["--hbm", "64G", "--oversub", "1"]);
    assert_eq!(
        (v["fits"].as_bool(), v["verdict"].as_str()),
        (Some(true), Some("hbm"))
    );
    assert_eq!(v["total_bytes"], total);
    let v = at(&["--hbm", "32G", "--oversub", "1"]);
    assert_eq!(
        (v["fits"].as_bool(), v["verdict"].as_str()),
        (Some(false), Some("oversub"))
    );
    assert_eq!(v["placed"]["unplaced"], total - 32 * GIB);
    // 1.4 × 32 GiB = 44.8 GiB < 46.96 GiB: no; 1.5 × 32 GiB = 48 GiB: yes.
    assert_eq!(at(&["--hbm", "32G", "--oversub", "1.4"])["fits"], false);
    let v = at(&["--hbm", "910b4", "--oversub", "1.5"]);
    assert_eq!(
        (v["fits"].as_bool(), v["verdict"].as_str()),
        (Some(true), Some("spill"))
    );
    // The weights stay in HBM; the KV cache is what spills, to DRAM.
    assert_eq!(placed(&v, "weights", "hbm"), 8_030_261_248 * 2);
    assert_eq!(placed(&v, "kv_cache", "dram"), total - 32 * GIB);
    // DRAM limited to 10 GiB and no NVMe: 14.96 GiB must spill, 4.96 GiB short.
    let v = at(&["--hbm", "32G", "--oversub", "1.5", "--dram", "10G"]);
    assert_eq!(
        (v["fits"].as_bool(), v["verdict"].as_str()),
        (Some(false), Some("host"))
    );
    assert_eq!(v["placed"]["unplaced"], total - 32 * GIB - 10 * GIB);
    // ... and with 5 GiB of NVMe it fits, the last 4.96 GiB on NVMe.
    let v = at(&[
        "--hbm",
        "32G",
        "--oversub",
        "1.5",
        "--dram",
        "10G",
        "--swap",
        "5G",
    ]);
    assert_eq!(v["verdict"], "spill");
    assert_eq!(v["placed"]["nvme"], total - 32 * GIB - 10 * GIB);
}

#[test]
fn table_shows_components_placement_and_verdict() {
    let o = u3m(&[
        "--model",
        "llama2-13b",
        "--seq",
        "1024",
        "--hbm",
        "32G",
        "--oversub",
        "1",
    ]);
    assert!(o.status.success());
    let t = String::from_utf8(o.stdout).unwrap();
    let gib = |b: u64| format!("{:.2}", b as f64 / GIB as f64);
    let line = |name: &str| {
        t.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} line:\n{t}"))
    };
    // component, GiB, HBM, DRAM, NVMe, unplaced
    let cols = |name: &str| {
        line(name)
            .split_whitespace()
            .take(6)
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let act = ACT13_1024;
    let w = P13 * 2;
    // 32 GiB of HBM: activations, then the weights' first 32 GiB − activations; no room below.
    assert_eq!(
        cols("activations"),
        ["activations", &gib(act), &gib(act), "0.00", "0.00", "0.00"]
    );
    assert_eq!(
        cols("weights"),
        [
            "weights",
            &gib(w),
            &gib(32 * GIB - act),
            "0.00",
            "0.00",
            &gib(w - (32 * GIB - act))
        ]
    );
    assert_eq!(
        cols("optimizer"),
        [
            "optimizer",
            &gib(P13 * 12),
            "0.00",
            "0.00",
            "0.00",
            &gib(P13 * 12)
        ]
    );
    assert_eq!(cols("total")[1], gib(P13 * 16 + act));
    assert!(line("fits").starts_with("fits       no: "), "{t}");
    assert!(line("no u3m").contains("does not fit"), "{t}");
    assert!(
        line("kv cache").contains("819,200 B per token (800 KiB)"),
        "{t}"
    );

    let o = u3m(&["--model", "llama2-7b", "--train", "none", "--hbm", "64G"]);
    let t = String::from_utf8(o.stdout).unwrap();
    assert!(t.lines().any(|l| l.starts_with("fits       yes: ")), "{t}");
}

#[test]
fn bad_input_exits_2_with_a_reason() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--model", "gpt5"],
            "known presets: llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b",
        ),
        (&["--model", "llama3-13b"], "no Llama-3-13B"),
        (
            &["--layers", "32", "--hidden", "4096"],
            "missing architecture field(s) --heads, --kv-heads, --vocab",
        ),
        (
            &[
                "--layers",
                "2",
                "--hidden",
                "100",
                "--heads",
                "3",
                "--kv-heads",
                "1",
                "--vocab",
                "10",
            ],
            "--heads 3 does not divide --hidden 100",
        ),
        (
            &[
                "--layers",
                "2",
                "--hidden",
                "64",
                "--heads",
                "8",
                "--kv-heads",
                "3",
                "--vocab",
                "10",
            ],
            "--kv-heads 3 does not divide --heads 8",
        ),
        (
            &[
                "--layers",
                "2",
                "--hidden",
                "64",
                "--heads",
                "4",
                "--kv-heads",
                "8",
                "--vocab",
                "10",
            ],
            "--kv-heads 8",
        ),
        (
            &["--model", "llama2-7b", "--layers", "0"],
            "--layers must be at least 1",
        ),
        (
            &["--model", "llama2-7b", "--batch", "0"],
            "--batch must be at least 1",
        ),
        (
            &["--model", "llama2-7b", "--hbm", "0"],
            "--hbm must be at least 1",
        ),
        (
            &["--model", "llama2-7b", "--hidden", "10000000"],
            "beyond any real model",
        ),
        (
            &[
                "--model",
                "llama2-7b",
                "--seq",
                "16777216",
                "--batch",
                "65536",
            ],
            "footprint",
        ),
        (
            &["--model", "llama2-7b", "--oversub", "0.9"],
            "--oversub 0.9 must be between 1",
        ),
        (&["--model", "llama2-7b", "--hbm", "lots"], "not a size"),
        (
            &["--model", "llama2-7b", "--train", "sgd"],
            "possible values: adam, lora, none",
        ),
    ];
    for (args, want) in cases {
        let o = u3m(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want '{want}' in: {err}");
        assert!(o.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
}
