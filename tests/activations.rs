//! Specification of `train.activations`: `recompute` and `recompute_attention` train the bits
//! `keep` trains (the same weights and optimizer state in every checkpoint, the same losses), in
//! f32 and in bf16, also across a resume that changes it, and hold less memory while they do,
//! `recompute` the least — a language model and a translation model alike; a model whose
//! sub-blocks cannot recompute, a sweep with such a cell,
//! and a value that is no choice are refused before any work, naming the key, while a model
//! whose attention sub-blocks alone run as one op may recompute those alone.

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

/// A character LM whose activations outweigh its weights: 4 pre-norm layers (GELU, no
/// biases), 16 windows of 96 tokens a step as one share, 2 heads of 32 (so the attention core
/// would keep its probabilities: 96 ≤ 4 × 32).
fn lm_yaml(corpus: &Path) -> String {
    format!(
        r#"
model: {{ arch: lm, d_model: 64, n_layers: 4, n_heads: 2, d_ff: 256, max_seq_len: 96, dropout: 0.1, attn_dropout: 0.1 }}
data:
  corpus: {{ kind: text, path: "{}", val_fraction: 0.1 }}
  tokenizer: {{ kind: char }}
train: {{ steps: 4, seed: 5, lr: 3.0e-3, batch_size: 16, block_size: 96, threads: 1, shares: 1, log_every: 1 }}
eval: {{ every: 4, max_batches: 2 }}
checkpoint: {{ every: 2 }}
"#,
        corpus.display()
    )
}

fn corpus(dir: &Path) -> std::path::PathBuf {
    let lines: String = (0..600)
        .map(|i| format!("line {i}: the quick brown fox jumps over the lazy dog.\n"))
        .collect();
    write(dir, "corpus.txt", lines)
}

/// Each checkpoint's files that hold numbers (weights, optimizer state), by step.
fn checkpoint_bytes(run_dir: &Path) -> Vec<(u64, Vec<u8>, Vec<u8>)> {
    checkpoints(run_dir)
        .into_iter()
        .map(|(step, dir)| {
            let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
            (step, read("model.safetensors"), read("optimizer.safetensors"))
        })
        .collect()
}

/// The losses of a run's train records, as logged.
fn losses(run_dir: &Path) -> Vec<String> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["kind"] == "train")
        .map(|r| r["loss"].to_string())
        .collect()
}

#[test]
fn recomputing_the_activations_trains_the_same_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let lm = write(dir, "lm.yaml", lm_yaml(&corpus(dir)));
    // A translation model: its decoder's cross-attention recomputes too.
    let seq2seq = write(dir, "seq2seq.yaml", seq2seq_yaml(4, 4, 2));
    for (model, cfg) in [("lm", &lm), ("seq2seq", &seq2seq)] {
        for precision in ["f32", "bf16"] {
            let what = format!("{model}, {precision}");
            let train = |memory: &str| {
                let run_dir = dir.join(format!("runs/{model}-{precision}-{memory}"));
                let p = format!("train.precision={precision}");
                let m = format!("train.activations={memory}");
                let args = ["train", s(cfg), "--run-dir", s(&run_dir), "--quiet"];
                ok(dir, &[&args[..], &["--set", &p, "--set", &m]].concat());
                run_dir
            };
            let kept = train("keep");
            let a = checkpoint_bytes(&kept);
            let steps: Vec<u64> = a.iter().map(|c| c.0).collect();
            assert_eq!(steps, [2, 4], "{what}: checkpoints");
            assert_eq!(losses(&kept).len(), 4, "{what}");
            for memory in ["recompute", "recompute_attention"] {
                let recomputed = train(memory);
                let b = checkpoint_bytes(&recomputed);
                assert!(a == b, "{what}, {memory}: the checkpoints differ");
                assert_eq!(
                    losses(&kept),
                    losses(&recomputed),
                    "{what}, {memory}: the losses differ"
                );
                // The choice is written into the run's config, so a resume keeps it.
                let written = std::fs::read_to_string(recomputed.join("config.yaml")).unwrap();
                assert!(written.contains(&format!("activations: {memory}\n")), "{written}");
            }
            let written = std::fs::read_to_string(kept.join("config.yaml")).unwrap();
            assert!(
                !written.contains("activations"),
                "keep is the default, left out: {written}"
            );
        }
    }
}

/// The choice changes no bit, so a run may change it when it resumes: the config change is
/// listed, and the run ends where the uninterrupted one does.
#[test]
fn a_run_resumed_with_the_other_choice_is_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cfg = write(dir, "lm.yaml", lm_yaml(&corpus(dir)));
    let whole = dir.join("runs/whole");
    ok(dir, &["train", s(&cfg), "--run-dir", s(&whole), "--quiet"]);
    // The same run stopped after its step-2 checkpoint, as a kill would leave it.
    let stopped = dir.join("runs/stopped");
    let copy = std::process::Command::new("cp")
        .args(["-r", s(&whole), s(&stopped)])
        .status();
    assert!(copy.unwrap().success());
    let (newest, newest_dir) = checkpoints(&stopped).pop().unwrap();
    assert_eq!(newest, 4);
    std::fs::remove_dir_all(newest_dir).unwrap();
    let out = ok_output(
        dir,
        &[
            "train",
            s(&cfg),
            "--run-dir",
            s(&stopped),
            "--resume",
            "--set",
            "train.activations=recompute",
        ],
    );
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(
        said.contains(r#"train.activations: "keep" → "recompute""#),
        "the change is not listed: {said}"
    );
    assert!(
        checkpoint_bytes(&whole) == checkpoint_bytes(&stopped),
        "the resumed run's checkpoints differ"
    );
}

#[test]
fn recomputing_the_activations_holds_less_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let lm = write(dir, "lm.yaml", lm_yaml(&corpus(dir)));
    let peak = |cfg: &Path, memory: &str, sets: &[&str]| {
        let m = format!("train.activations={memory}");
        let bench = [
            "bench",
            s(cfg),
            "--steps",
            "2",
            "--warmup",
            "1",
            "--json",
            "--set",
            &m,
        ];
        let out = ok(dir, &[&bench[..], sets].concat());
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        v["peak_heap_mib"]
            .as_f64()
            .unwrap_or_else(|| panic!("no heap peak: {v}"))
    };
    let (kept, recomputed) = (peak(&lm, "keep", &[]), peak(&lm, "recompute", &[]));
    // Four layers' activations against one layer's and the layers' inputs: 43 and 16 MiB when
    // this was written, where the attention probabilities kept by mistake would add 4.5 MiB.
    assert!(
        recomputed < 0.45 * kept,
        "recomputing held {recomputed} MiB at most, keeping {kept} MiB"
    );
    // The attention sub-blocks' share of them, with their probabilities: 30.5 MiB when this
    // was written, against 42.5 kept and 16.5 all recomputed.
    let attention = peak(&lm, "recompute_attention", &[]);
    assert!(
        attention < 0.8 * kept && attention > recomputed + 0.15 * kept,
        "recomputing attention held {attention} MiB at most, all {recomputed}, keeping {kept}"
    );
    // A translation model (2 + 2 layers of d 64, 4,000 tokens a step), whose decoder's
    // cross-attention recomputes too: 39.3, 23.4 and 18.2 MiB when this was written; with the
    // cross-attention keeping its activations by mistake, 26.0 (0.66×) and 20.8 (0.53×).
    let seq2seq = write(dir, "seq2seq.yaml", seq2seq_yaml(4, 4, 2));
    let larger = [
        "--set",
        "model.d_model=64",
        "--set",
        "model.n_layers=2",
        "--set",
        "train.max_tokens=4000",
        "--set",
        "data.corpus.train_size=2000",
    ];
    let [kept, attention, recomputed] =
        ["keep", "recompute_attention", "recompute"].map(|memory| peak(&seq2seq, memory, &larger));
    assert!(
        attention < 0.63 * kept && recomputed < 0.5 * kept,
        "a translation model held {kept} MiB keeping, {attention} recomputing attention, {recomputed} all"
    );
}

#[test]
fn a_model_that_cannot_recompute_is_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cfg = write(dir, "tiny.yaml", seq2seq_yaml(4, 4, 2));
    let lm = write(dir, "lm.yaml", lm_yaml(&corpus(dir)));
    let run_dir = dir.join("run");
    // Only attention sub-blocks the ops do not cover refuse, under either setting.
    let logn = [
        "--set",
        "model.logn_attention=true",
        "--set",
        "model.positions=learned",
    ];
    let refused = [
        (&lm, &["--set", "model.qk_norm=l2"][..], "model.qk_norm: l2"),
        (&cfg, &["--set", "model.qk_norm=l2"], "model.qk_norm: l2"),
        (&lm, &logn, "model.logn_attention without rotary positions"),
    ];
    for (cfg, set, named) in refused {
        for memory in ["recompute", "recompute_attention"] {
            for command in [
                &["train", s(cfg), "--run-dir", s(&run_dir)][..],
                &["bench", s(cfg), "--steps", "1"],
            ] {
                let m = format!("train.activations={memory}");
                let err = fails(dir, &[command, set, &["--set", &m]].concat());
                assert!(
                    err.contains(&format!("train.activations: {memory} needs every"))
                        && err.contains(named)
                        && err.contains("keep"),
                    "{set:?}, {memory}: {err}"
                );
                assert!(!run_dir.exists(), "a refused run created {}", run_dir.display());
            }
        }
    }
    // Post-norm, ReLU and biased sub-blocks are ops too: fairseq's Transformer recomputes.
    let fairseq = [
        "--set",
        "model.norm_placement=post",
        "--set",
        "model.mlp=relu",
        "--set",
        "model.proj_bias=true",
    ];
    for model in [&lm, &cfg] {
        for memory in ["recompute", "recompute_attention"] {
            let m = format!("train.activations={memory}");
            let args = [
                &["bench", s(model), "--steps", "1", "--warmup", "0"][..],
                &fairseq,
                &["--set", &m],
            ];
            let out = ok(dir, &args.concat());
            assert!(out.contains(said(memory)), "{memory}: {out}");
        }
    }
    // Qwen2's biases on q, k and v are the attention op's own.
    let bench = ["bench", s(&lm), "--steps", "1", "--warmup", "0"];
    for memory in ["recompute", "recompute_attention"] {
        let m = format!("train.activations={memory}");
        let out = ok(
            dir,
            &[&bench[..], &["--set", "model.qkv_bias=true", "--set", &m]].concat(),
        );
        assert!(out.contains(said(memory)), "{memory}: {out}");
    }
    // A sweep whose L2 variant cannot recompute is refused before it plans anything.
    let out = dir.join("sweep");
    let args = [
        "ablate",
        s(&lm),
        "--variants",
        "none,l2",
        "--seeds",
        "1",
        "--out",
        s(&out),
    ];
    let err = fails(
        dir,
        &[&args[..], &["--set", "train.activations=recompute"]].concat(),
    );
    assert!(
        err.contains("train.activations: recompute")
            && err.contains("model.qk_norm: l2")
            && err.contains("l2 variant"),
        "{err}"
    );
    assert!(
        !out.join("runs").exists(),
        "a refused sweep created runs under {}",
        out.display()
    );
    let err = fails(
        dir,
        &[
            "train",
            s(&lm),
            "--run-dir",
            s(&run_dir),
            "--set",
            "train.activations=sometimes",
        ],
    );
    assert!(
        err.contains("train.activations")
            && err.contains("keep")
            && err.contains("recompute")
            && err.contains("recompute_attention"),
        "{err}"
    );
    assert!(!run_dir.exists());
}

/// What the run's first line says of `train.activations: memory` (the setting it ran with).
fn said(memory: &str) -> &'static str {
    match memory {
        "recompute" => ", activations recomputed",
        _ => "attention's activations recomputed",
    }
}
