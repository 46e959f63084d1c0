//! `u3m synth` end to end: every workload × preset writes a valid v1 trace
//! (read back with u3m_core's validating reader) that acl_replay runs; the
//! output is deterministic; `--sizes` agrees with `u3m plan` and with sizes
//! worked out by hand; and the traces have the properties the workloads are
//! for (LoRA never writes a base weight, every decode step reads every
//! request's whole KV cache, mixed has a training → serving → training
//! change of operator mix, tensors are interior pointers with reuse).

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use u3m_core::opclass::{classify, OpClass};
use u3m_core::trace::{read_str, Body, Event, Range};

fn u3m(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_u3m"))
        .args(args)
        .output()
        .expect("run u3m")
}

fn synth(args: &[&str]) -> String {
    let mut a = vec!["synth"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "-"]);
    let o = u3m(&a);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("UTF-8 trace")
}

fn sizes(args: &[&str]) -> Value {
    let mut a = vec!["synth"];
    a.extend_from_slice(args);
    a.push("--sizes");
    let o = u3m(&a);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON")
}

fn plan(args: &[&str]) -> Value {
    let mut a = vec!["plan", "--json"];
    a.extend_from_slice(args);
    let o = u3m(&a);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON")
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

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The classes the operator names are meant to have (the spec the
/// generator is checked against, written out here, not read from it).
const INTENDED: &[(&str, OpClass)] = &[
    ("MatMul", OpClass::MatMul),
    ("BatchMatMul", OpClass::MatMul),
    ("FlashAttentionScore", OpClass::AttentionPrefill),
    ("FlashAttentionScoreGrad", OpClass::AttentionPrefill),
    ("IncreFlashAttention", OpClass::AttentionDecode),
    ("ReshapeAndCache", OpClass::AttentionDecode),
    ("RmsNorm", OpClass::NormSoftmax),
    ("RmsNormGrad", OpClass::NormSoftmax),
    ("Softmax", OpClass::NormSoftmax),
    ("SoftmaxGrad", OpClass::NormSoftmax),
    ("SwiGlu", OpClass::Activation),
    ("SwiGluGrad", OpClass::Activation),
    ("Add", OpClass::Elementwise),
    ("Muls", OpClass::Elementwise),
    ("RotaryPositionEmbedding", OpClass::Elementwise),
    ("RotaryPositionEmbeddingGrad", OpClass::Elementwise),
    ("DropoutGenMask", OpClass::Elementwise),
    ("DropoutDoMask", OpClass::Elementwise),
    ("Embedding", OpClass::Embedding),
    ("EmbeddingDenseBackward", OpClass::Embedding),
    ("CrossEntropyLoss", OpClass::Reduction),
    ("CrossEntropyLossGrad", OpClass::Reduction),
    ("ArgMax", OpClass::Reduction),
    ("ApplyAdamW", OpClass::Optimizer),
    ("Cast", OpClass::Layout),
];

/// Small shapes: scale 8 keeps llama3-8b's GQA (4 heads, 1 KV head).
const SMALL: &[&str] = &[
    "--layers",
    "2",
    "--seq",
    "64",
    "--requests",
    "3",
    "--context",
    "40",
    "--decode-tokens",
    "5",
];

fn small(model: &str, workload: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["--model", model, "--workload", workload]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.extend(SMALL.iter().map(|s| s.to_string()));
    if !extra.contains(&"--scale") {
        v.extend(["--scale".to_string(), "8".to_string()]);
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(|s| s.as_str()).collect()
}

/// An `O` event: type, inputs, outputs, flops.
type Op<'a> = (&'a str, &'a [Range], &'a [Range], Option<u64>);

fn ops(events: &[Event]) -> Vec<Op<'_>> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            Body::Op {
                op_type,
                inputs,
                outputs,
            } => Some((op_type.as_str(), &inputs[..], &outputs[..], e.flops)),
            _ => None,
        })
        .collect()
}

/// `# tensor NAME ADDR BYTES TAG` comments: name -> (range, tag).
fn tensors(text: &str) -> BTreeMap<String, (Range, String)> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# tensor ") else {
            continue;
        };
        let f: Vec<&str> = rest.split(' ').collect();
        // The name may hold spaces (kv tensors): the last three fields are fixed.
        let k = f.len();
        let addr = u64::from_str_radix(f[k - 3].trim_start_matches("0x"), 16).unwrap();
        let bytes: u64 = f[k - 2].parse().unwrap();
        m.insert(
            f[..k - 3].join(" "),
            (Range::new(addr, bytes), f[k - 1].to_string()),
        );
    }
    m
}

fn overlaps(a: &Range, b: &Range) -> bool {
    a.addr < b.addr + b.bytes && b.addr < a.addr + a.bytes
}

#[test]
fn every_workload_and_preset_is_a_valid_trace_with_known_operators() {
    for model in ["llama2-7b", "llama2-13b", "llama3-8b"] {
        for workload in ["adam", "lora", "rag", "mixed"] {
            let args = small(model, workload, &[]);
            let text = synth(&refs(&args));
            let evs =
                read_str(&text, &format!("{model}/{workload}")).unwrap_or_else(|e| panic!("{e}"));
            let os = ops(&evs);
            assert!(os.len() > 50, "{model}/{workload}: {} ops", os.len());
            for (name, _, outs, flops) in &os {
                let want = INTENDED
                    .iter()
                    .find(|(n, _)| n == name)
                    .unwrap_or_else(|| panic!("unlisted op {name}"));
                assert_eq!(classify(name).0, want.1, "{name}");
                if matches!(want.1, OpClass::MatMul | OpClass::AttentionPrefill)
                    || *name == "IncreFlashAttention"
                {
                    assert!(
                        flops.unwrap_or(0) > 0,
                        "{model}/{workload}: {name} without flops"
                    );
                }
                assert!(!outs.is_empty(), "{name} writes nothing");
            }
            // Every A carries a tag; no F (a caching allocator keeps its segments).
            assert!(evs
                .iter()
                .all(|e| !matches!(e.body, Body::Alloc { .. }) || e.tag.is_some()));
            assert!(!evs.iter().any(|e| matches!(e.body, Body::Free { .. })));
        }
    }
    // Also with --flash and --recompute, and LoRA on every projection.
    for extra in [
        &["--flash"][..],
        &["--recompute"],
        &[
            "--flash",
            "--recompute",
            "--lora-targets",
            "q,k,v,o,gate,up,down",
        ],
    ] {
        let args = small("llama3-8b", "lora", extra);
        read_str(&synth(&refs(&args)), "x").unwrap_or_else(|e| panic!("{extra:?}: {e}"));
        let args = small("llama2-7b", "adam", extra);
        read_str(&synth(&refs(&args)), "x").unwrap_or_else(|e| panic!("{extra:?}: {e}"));
    }
}

#[test]
fn output_is_deterministic_and_the_seed_changes_only_the_input_data() {
    let args = small("llama3-8b", "mixed", &[]);
    let a = synth(&refs(&args));
    let b = synth(&refs(&args));
    assert!(a == b, "same arguments, different traces");
    let args2 = small("llama3-8b", "mixed", &["--seed", "7"]);
    let c = synth(&refs(&args2));
    assert_ne!(a, c);
    // Only the host side of H2D copies differs.
    let strip = |t: &str| -> Vec<String> {
        t.lines()
            .map(|l| {
                if l.starts_with("M H2D ") {
                    l.split(' ')
                        .enumerate()
                        .filter(|(i, _)| *i != 3)
                        .map(|(_, w)| w)
                        .collect::<Vec<_>>()
                        .join(" ")
                } else {
                    l.to_string()
                }
            })
            .collect()
    };
    assert_eq!(strip(&a), strip(&c));
}

#[test]
fn sizes_agree_with_plan_and_hand_figures() {
    // Llama-2-7B, full Adam, s = 512, b = 1. Params: per layer 4·4096² + 3·4096·11008 + 2·4096 =
    // 202,383,360; × 32 + 2·32000·4096 + 4096 = 6,738,415,616 (6.74 B).
    let p7: u64 = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096) + 2 * 32000 * 4096 + 4096;
    assert_eq!(p7, 6_738_415_616);
    let s = sizes(&[
        "--model",
        "llama2-7b",
        "--workload",
        "adam",
        "--seq",
        "512",
        "--steps",
        "1",
    ]);
    assert_eq!(n(&s["params"]["total"]), p7);
    let b = &s["bytes"];
    assert_eq!(n(&b["weights"]), 2 * p7);
    assert_eq!(n(&b["grads"]), 2 * p7);
    assert_eq!(n(&b["optimizer"]), 12 * p7);
    // s·b·h·(34 + 5·a·s/h)·L = 512·4096·(34 + 5·32·512/4096)·32 = 512·4096·54·32.
    assert_eq!(n(&b["activations"]), 512 * 4096 * 54 * 32);
    assert_eq!(n(&b["kv"]), 0);
    assert!(n(&b["workspace"]) > 0);
    let total: u64 = [
        "weights",
        "adapters",
        "grads",
        "optimizer",
        "activations",
        "kv",
        "workspace",
    ]
    .iter()
    .map(|k| n(&b[*k]))
    .sum();
    assert_eq!(n(&b["total"]), total);
    let p = plan(&[
        "--model",
        "llama2-7b",
        "--train",
        "adam",
        "--seq",
        "512",
        "--batch",
        "1",
    ]);
    assert_eq!(n(&b["weights"]), component(&p, "weights"));
    assert_eq!(n(&b["grads"]), component(&p, "gradients"));
    assert_eq!(n(&b["optimizer"]), component(&p, "optimizer"));
    assert_eq!(n(&b["activations"]), component(&p, "activations"));
    // The trace really holds it: peak of live tensors ≥ weights + optimizer + activations.
    assert!(n(&s["trace"]["peak_allocated_bytes"]) >= 14 * p7 + 512 * 4096 * 54 * 32);
    let tr = &s["trace"];
    assert!(n(&tr["reserved_bytes"]) >= n(&tr["peak_allocated_bytes"]));
    // Segments are whole 2 MiB pages: each takes one more page on the simulator (its 32 B pad).
    assert_eq!(
        n(&tr["device_bytes"]),
        n(&tr["reserved_bytes"]) + n(&tr["segments"]) * (2 << 20)
    );

    // Llama-3-8B serving: KV per token with GQA = 2 · 32 layers · 8 kv heads · 128 · 2 B = 131,072 B.
    let s = sizes(&[
        "--model",
        "llama3-8b",
        "--workload",
        "rag",
        "--requests",
        "4",
        "--context",
        "512",
        "--decode-tokens",
        "8",
    ]);
    assert_eq!(n(&s["kv_bytes_per_token"]), 2 * 32 * 8 * 128 * 2);
    assert_eq!(n(&s["kv_bytes_per_token"]), 131_072);
    assert_eq!(n(&s["bytes"]["kv"]), 131_072 * (512 + 8) * 4);
    assert_eq!(
        n(&s["bytes"]["grads"]) + n(&s["bytes"]["optimizer"]) + n(&s["bytes"]["activations"]),
        0
    );
    let p = plan(&[
        "--model",
        "llama3-8b",
        "--train",
        "none",
        "--seq",
        "520",
        "--requests",
        "4",
    ]);
    assert_eq!(n(&s["bytes"]["kv"]), component(&p, "kv_cache"));
    assert_eq!(n(&s["bytes"]["weights"]), component(&p, "weights"));

    // LoRA on q,k,v,o (u3m plan's assumption), Llama-2-13B, s = 256: adapters 16·(5120+5120)·4·40
    // = 26,214,400 params; activations = the formula plus the rank-16 intermediates 2·s·r per target per layer.
    let s = sizes(&[
        "--model",
        "llama2-13b",
        "--workload",
        "lora",
        "--seq",
        "256",
        "--lora-targets",
        "q,k,v,o",
    ]);
    let p = plan(&[
        "--model",
        "llama2-13b",
        "--train",
        "lora",
        "--seq",
        "256",
        "--batch",
        "1",
    ]);
    let b = &s["bytes"];
    assert_eq!(n(&s["params"]["lora"]), 26_214_400);
    assert_eq!(n(&b["adapters"]), component(&p, "adapters"));
    assert_eq!(n(&b["grads"]), component(&p, "gradients"));
    assert_eq!(n(&b["optimizer"]), component(&p, "optimizer"));
    assert_eq!(n(&b["weights"]), component(&p, "weights"));
    assert_eq!(
        n(&b["activations"]),
        component(&p, "activations") + 2 * 256 * 16 * 4 * 40
    );

    // Scaled: the small model's dimensions, given to plan, give the same figures.
    let s = sizes(&[
        "--model",
        "llama3-8b",
        "--workload",
        "adam",
        "--scale",
        "8",
        "--seq",
        "128",
    ]);
    let m = &s["model"];
    assert_eq!(
        (
            n(&m["heads"]),
            n(&m["kv_heads"]),
            n(&m["head_dim"]),
            n(&m["hidden"])
        ),
        (4, 1, 128, 512)
    );
    assert_eq!((n(&m["ffn"]), n(&m["vocab"])), (1792, 16032));
    let dims: Vec<String> = ["layers", "hidden", "heads", "kv_heads", "vocab", "ffn"]
        .iter()
        .map(|k| n(&m[*k]).to_string())
        .collect();
    let p = plan(&[
        "--layers",
        &dims[0],
        "--hidden",
        &dims[1],
        "--heads",
        &dims[2],
        "--kv-heads",
        &dims[3],
        "--vocab",
        &dims[4],
        "--ffn",
        &dims[5],
        "--train",
        "adam",
        "--seq",
        "128",
    ]);
    for (k, c) in [
        ("weights", "weights"),
        ("grads", "gradients"),
        ("optimizer", "optimizer"),
        ("activations", "activations"),
    ] {
        assert_eq!(n(&s["bytes"][k]), component(&p, c), "{k}");
    }
}

#[test]
fn lora_never_writes_a_base_weight_but_adam_does() {
    for (workload, extra) in [
        ("lora", &[][..]),
        (
            "lora",
            &["--recompute", "--lora-targets", "q,k,v,o,gate,up,down"][..],
        ),
        ("adam", &[][..]),
    ] {
        let args = small("llama3-8b", workload, extra);
        let text = synth(&refs(&args));
        let evs = read_str(&text, "t").unwrap();
        let t = tensors(&text);
        let weights: Vec<Range> = t
            .values()
            .filter(|(_, tag)| tag == "weight")
            .map(|(r, _)| *r)
            .collect();
        // 2 layers × (7 projections + 2 norms) + embedding, final norm, LM head.
        assert_eq!(weights.len(), 2 * 9 + 3);
        let (mut reads, mut writes) = (0, 0);
        for (name, ins, outs, _) in ops(&evs) {
            for w in &weights {
                reads += ins.iter().filter(|r| overlaps(r, w)).count();
                if outs.iter().any(|r| overlaps(r, w)) {
                    writes += 1;
                    assert_eq!(
                        workload, "adam",
                        "{workload} {extra:?}: {name} writes a base weight"
                    );
                }
            }
        }
        assert!(reads > 0);
        if workload == "adam" {
            // The optimizer's Cast writes every weight each step (2 steps).
            assert_eq!(writes, 2 * weights.len(), "adam writes");
        } else {
            // Adapters are written: their optimizer states too.
            let adapters: Vec<Range> = t
                .values()
                .filter(|(_, tag)| tag == "adapter")
                .map(|(r, _)| *r)
                .collect();
            assert_eq!(adapters.len(), 2 * 2 * if extra.is_empty() { 2 } else { 7 });
            let written = ops(&evs)
                .iter()
                .filter(|(_, _, outs, _)| {
                    adapters.iter().any(|a| outs.iter().any(|r| overlaps(r, a)))
                })
                .count();
            assert_eq!(written, 2 * adapters.len(), "one Cast per adapter per step");
        }
    }
}

#[test]
fn every_decode_step_reads_every_requests_whole_kv_cache() {
    let (r, c, t, layers) = (3u64, 40u64, 5u64, 2u64);
    let args = small("llama3-8b", "rag", &[]);
    let text = synth(&refs(&args));
    let evs = read_str(&text, "rag").unwrap();
    let kv = tensors(&text);
    // 3 requests × 2 layers × K, V; each (40 + 5) tokens × 1 kv head × 128 × 2 B.
    let slot = 128 * 2;
    let kvs: Vec<&Range> = kv
        .iter()
        .filter(|(_, (_, tag))| tag == "kv")
        .map(|(_, (r, _))| r)
        .collect();
    assert_eq!(kvs.len() as u64, r * layers * 2);
    assert!(kvs.iter().all(|x| x.bytes == (c + t) * slot));
    let attn: Vec<_> = ops(&evs)
        .into_iter()
        .filter(|o| o.0 == "IncreFlashAttention")
        .collect();
    assert_eq!(attn.len() as u64, t * layers);
    for (i, (_, ins, _, _)) in attn.iter().enumerate() {
        let (step, layer) = (i as u64 / layers, i as u64 % layers);
        for req in 0..r {
            for kind in ["K", "V"] {
                let (cache, _) = kv[&format!("kv b0 r{req} l{layer} {kind}")];
                let want = Range::new(cache.addr, (c + step + 1) * slot);
                assert!(
                    ins.contains(&want),
                    "step {step} layer {layer} request {req} {kind}: {ins:?}"
                );
            }
        }
    }
    // Each step writes one token slot per request and layer, at position c + step.
    let writes: Vec<_> = ops(&evs)
        .into_iter()
        .filter(|o| o.0 == "ReshapeAndCache")
        .collect();
    assert_eq!(writes.len() as u64, r * layers + t * layers * r);
    let (k0, _) = kv["kv b0 r0 l0 K"];
    assert!(writes.iter().any(|w| w
        .2
        .contains(&Range::new(k0.addr + (c + t - 1) * slot, slot))));
    // Prefill writes the first c slots.
    assert!(writes
        .iter()
        .any(|w| w.2.contains(&Range::new(k0.addr, c * slot))));
}

#[test]
fn mixed_has_training_then_serving_then_training() {
    // The default 8 requests.
    let text = synth(&[
        "--model",
        "llama2-7b",
        "--workload",
        "mixed",
        "--scale",
        "8",
        "--layers",
        "2",
        "--seq",
        "64",
        "--context",
        "40",
        "--decode-tokens",
        "5",
    ]);
    let evs = read_str(&text, "mixed").unwrap();
    let classes: Vec<OpClass> = ops(&evs).iter().map(|o| classify(o.0).0).collect();
    let first = classes
        .iter()
        .position(|c| *c == OpClass::AttentionDecode)
        .expect("serving ops");
    let last = classes
        .iter()
        .rposition(|c| *c == OpClass::AttentionDecode)
        .unwrap();
    let count = |w: &[OpClass], c: OpClass| w.iter().filter(|x| **x == c).count();
    let (before, during, after) = (
        &classes[..first],
        &classes[first..=last],
        &classes[last + 1..],
    );
    for w in [before, after] {
        assert!(count(w, OpClass::Optimizer) > 0 && count(w, OpClass::AttentionPrefill) == 0);
        assert!(count(w, OpClass::MatMul) > 5 * count(w, OpClass::AttentionDecode).max(1));
    }
    assert_eq!(count(during, OpClass::Optimizer), 0);
    // The decode part (after the last prefill attention): decode attention outnumbers MatMul.
    let last_prefill = during
        .iter()
        .rposition(|c| *c == OpClass::AttentionPrefill)
        .unwrap();
    let decode = &during[last_prefill + 1..];
    assert!(
        count(decode, OpClass::AttentionDecode) > count(decode, OpClass::MatMul),
        "decode: {} attention-decode vs {} matmul",
        count(decode, OpClass::AttentionDecode),
        count(decode, OpClass::MatMul)
    );
}

#[test]
fn tensors_are_interior_pointers_and_blocks_are_reused() {
    let args = small("llama2-7b", "adam", &[]);
    let evs = read_str(&synth(&refs(&args)), "adam").unwrap();
    let allocs: Vec<u64> = evs
        .iter()
        .filter_map(|e| {
            if let Body::Alloc { addr, .. } = e.body {
                Some(addr)
            } else {
                None
            }
        })
        .collect();
    let os = ops(&evs);
    let outs: Vec<Range> = os.iter().flat_map(|o| o.2.iter().copied()).collect();
    let interior = outs.iter().filter(|r| !allocs.contains(&r.addr)).count();
    assert!(
        interior * 2 > outs.len(),
        "{interior} of {} outputs interior",
        outs.len()
    );
    assert!(allocs.len() * 10 < outs.len());
    // One address written by different operator types in one step: freed and reused.
    let step1 = &os[..os.len() / 2];
    let mut by_addr: BTreeMap<u64, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for (name, _, outs, _) in step1 {
        for r in *outs {
            by_addr.entry(r.addr).or_default().insert(name);
        }
    }
    assert!(by_addr.values().filter(|s| s.len() >= 3).count() > 5);
}

fn acl_replay() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_u3m"))
        .parent()
        .unwrap()
        .join("acl-apps/acl_replay");
    assert!(
        p.exists(),
        "{} missing: build the workspace (cargo build --release --workspace)",
        p.display()
    );
    p
}

fn replay(trace: &str, env: &[(&str, &str)]) -> String {
    let dir = std::env::temp_dir().join(format!("u3m-synth-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("t{}.trace", trace.len()));
    std::fs::write(&path, trace).unwrap();
    let mut cmd = Command::new(acl_replay());
    cmd.arg(&path).env_remove("LD_PRELOAD");
    for (k, _) in std::env::vars() {
        if k.starts_with("ACLSIM_") || k.starts_with("U3M_") {
            cmd.env_remove(k);
        }
    }
    let o = cmd.envs(env.iter().copied()).output().unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        o.status.success(),
        "acl_replay: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Real data (every operator hashes its inputs): scale 16 keeps it under a second.
fn replay_small(workload: &str) {
    let args = small("llama3-8b", workload, &["--scale", "16"]);
    let text = synth(&refs(&args));
    let n_ops = ops(&read_str(&text, "t").unwrap()).len();
    let out = replay(&text, &[("ACLSIM_HBM_BYTES", "2G")]);
    assert!(out.contains(&format!(" ops={n_ops} ")), "{workload}: {out}");
}

#[test]
fn acl_replay_runs_training_traces() {
    replay_small("adam");
    replay_small("lora");
}

#[test]
fn acl_replay_runs_serving_traces() {
    replay_small("rag");
    replay_small("mixed");
}

#[test]
fn acl_replay_runs_a_full_size_trace_in_phantom_mode() {
    // Llama-2-13B serving: 26 GB of weights, 8 requests × 1032 tokens × 800 KiB of KV.
    let text = synth(&[
        "--model",
        "llama2-13b",
        "--workload",
        "rag",
        "--decode-tokens",
        "8",
    ]);
    let n_ops = ops(&read_str(&text, "t").unwrap()).len();
    let out = replay(
        &text,
        &[("ACLSIM_PHANTOM", "1"), ("ACLSIM_HBM_BYTES", "1T")],
    );
    assert!(out.contains(&format!(" ops={n_ops} ")), "{out}");
}

/// `--fused-optimizer`: each step's optimizer is one ApplyAdamW over flat
/// buffers — bf16 gradients (2 B per parameter), fp32 master, m and v (4 B
/// each), master and moments updated in place — holding every trained
/// parameter's slice, with the same footprint as the per-tensor optimizer.
#[test]
fn the_fused_optimizer_is_one_apply_adamw_over_the_flat_parameter_set() {
    let args = small("llama2-7b", "adam", &["--fused-optimizer", "--steps", "2"]);
    let text = synth(&refs(&args));
    let events = read_str(&text, "t").unwrap();
    let adam: Vec<Op> = ops(&events)
        .into_iter()
        .filter(|o| o.0 == "ApplyAdamW")
        .collect();
    assert_eq!(adam.len(), 2, "one per step");
    let fused = sizes(&refs(&args));
    let per_tensor = sizes(&refs(&small("llama2-7b", "adam", &["--steps", "2"])));
    let p = n(&fused["params"]["trainable"]);
    assert_eq!(fused["bytes"], per_tensor["bytes"]);
    let (_, ins, outs, _) = adam[0];
    let bytes: Vec<u64> = ins.iter().map(|r| r.bytes).collect();
    assert_eq!(bytes, [2 * p, 4 * p, 4 * p, 4 * p]);
    assert_eq!(outs, &ins[1..], "master, m and v updated in place");
    assert_eq!(adam[1].1, ins, "the same buffers every step");
    // every trained tensor's master is a slice of the flat master
    let t = tensors(&text);
    let masters: u64 = t
        .values()
        .filter(|(_, tag)| tag == "weight")
        .map(|(r, _)| 2 * r.bytes)
        .sum();
    assert_eq!(masters, 4 * p);
    assert_eq!(t["flat.master"].0, ins[1]);
    // the weights are updated from the master by one Cast each, after the step
    let casts_after = ops(&events)
        .into_iter()
        .skip_while(|o| o.0 != "ApplyAdamW")
        .take_while(|o| o.0 == "ApplyAdamW" || o.0 == "Cast")
        .filter(|o| o.0 == "Cast" && overlaps(&o.1[0], &ins[1]))
        .count();
    assert_eq!(
        casts_after as u64,
        3 + 9 * 2,
        "embed, final norm, head, 9 per layer"
    );
    // it replays (real data)
    let n_ops = ops(&events).len();
    let out = replay(&text, &[("ACLSIM_HBM_BYTES", "2G")]);
    assert!(out.contains(&format!(" ops={n_ops} ")), "{out}");
}

#[test]
fn bad_input_is_named() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--model", "llama3-13b", "--workload", "adam", "--sizes"],
            "no Llama-3-13B",
        ),
        (
            &[
                "--model",
                "llama2-7b",
                "--workload",
                "adam",
                "--scale",
                "0.5",
                "--sizes",
            ],
            "--scale",
        ),
        (&["--model", "llama2-7b", "--workload", "adam"], "-o PATH"),
        (
            &[
                "--model",
                "llama2-7b",
                "--workload",
                "lora",
                "--lora-targets",
                "q,x",
                "--sizes",
            ],
            "'x'",
        ),
        (
            &[
                "--model",
                "llama2-7b",
                "--workload",
                "rag",
                "--requests",
                "0",
                "--sizes",
            ],
            "--requests",
        ),
        (
            &[
                "--model",
                "llama2-7b",
                "--workload",
                "adam",
                "--sizes",
                "-o",
                "-",
            ],
            "--sizes",
        ),
        (
            &[
                "--model",
                "llama2-7b",
                "--workload",
                "rag",
                "--fused-optimizer",
                "--sizes",
            ],
            "--fused-optimizer",
        ),
    ];
    for (args, want) in cases {
        let mut a = vec!["synth"];
        a.extend_from_slice(args);
        let o = u3m(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn a_repeated_option_takes_its_last_value() {
    let s = sizes(&[
        "--model",
        "llama2-7b",
        "--workload",
        "lora",
        "--seq",
        "1024",
        "--layers",
        "2",
        "--seq",
        "256",
    ]);
    assert_eq!(n(&s["workload"]["seq"]), 256);
}
