//! The configs the config specifications share: a valid base, the shipped configs, and the
//! hostile configs the suite refuses (`config_errors.rs` checks Ember's messages for them,
//! `config_schema.rs` that the JSON Schema gives the same verdict).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ember_trainer::config::RunConfig;

/// A complete, valid translation config in block style, so every key has its own line.
pub const BASE: &str = "\
model:
  arch: seq2seq
  d_model: 32
  n_layers: 1
  n_heads: 4
  d_ff: 64
  max_seq_len: 64
  qk_norm: none
  dropout: 0.1
data:
  corpus:
    kind: embedded
    seed: 7
    train_size: 300
    val_size: 40
    test_size: 40
  tokenizer:
    kind: bpe
    vocab_size: 200
train:
  steps: 8
  seed: 3
  lr: 3.0e-3
  warmup_steps: 2
  max_tokens: 300
  label_smoothing: 0.1
  z_loss: 1.0e-4
  log_every: 1
eval:
  every: 4
checkpoint:
  every: 2
  keep_last: 2
";

/// `text` with the first occurrence of `from` replaced (which must exist).
pub fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} is not in the config");
    text.replacen(from, to, 1)
}

pub fn shipped_configs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    out.sort();
    assert!(
        out.iter().any(|p| p.ends_with("quickstart.yaml")),
        "configs/quickstart.yaml is shipped: {out:?}"
    );
    out
}

/// A config.json in SmolLM2-135M's shape (Llama, 30 layers of d 576, 9 heads over 3 key/value
/// heads, tied embeddings), for the shipped config that fine-tunes it.
const SMOLLM2_135M: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
  "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_act": "silu",
  "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 100000,
  "rope_scaling": null, "attention_bias": false, "attention_dropout": 0.0,
  "tie_word_embeddings": true, "initializer_range": 0.041666666666666664,
  "bos_token_id": 0, "eos_token_id": 0, "torch_dtype": "bfloat16"}"#;

/// Loads a shipped config. One that fine-tunes a downloaded model (`model.init_from`) is given a
/// stand-in folder with that model's config.json, since nothing is downloaded here (the
/// weights and tokenizer are only read when a run starts).
pub fn load_shipped(path: &Path, tmp: &Path) -> RunConfig {
    let text = std::fs::read_to_string(path).unwrap();
    let mut sets = vec![];
    if text.contains("init_from:") {
        let folder = tmp.join("SmolLM2-135M");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("config.json"), SMOLLM2_135M).unwrap();
        sets.push(format!("model.init_from={}", folder.display()));
    }
    RunConfig::load(path, &sets).unwrap_or_else(|e| panic!("{e}"))
}

/// A valid language-model config in flow style: the one `tests/hostile_inputs.rs` trains.
pub const LM: &str = "\
model: { arch: lm, d_model: 16, n_layers: 1, n_heads: 2, d_ff: 32, max_seq_len: 16 }
data:
  corpus: { kind: text, path: text.txt, val_fraction: 0.2 }
  tokenizer: { kind: char }
train: { steps: 4, lr: 3.0e-3, batch_size: 2, block_size: 8, threads: 1, log_every: 1 }
eval: { every: 0 }
checkpoint: { every: 2, keep_last: 3 }
";

/// One config the suite feeds to Ember, and the test that does.
pub struct Case {
    /// What is wrong with it (or that nothing is).
    pub name: &'static str,
    pub text: String,
    pub overrides: Vec<String>,
    /// The rule Ember refuses it by, when a JSON Schema cannot state that rule (it compares
    /// two keys' values, or divides one by another): the schema then accepts what Ember refuses.
    pub beyond_schema: Option<&'static str>,
}

fn case(name: &'static str, text: impl Into<String>, overrides: &[&str]) -> Case {
    Case {
        name,
        text: text.into(),
        overrides: overrides.iter().map(|s| s.to_string()).collect(),
        beyond_schema: None,
    }
}

/// The configs of the config specifications (`config_errors.rs`, and the config cases of the
/// CLI's `tests/hostile_inputs.rs`), valid and hostile, each as text and `--set` overrides.
pub fn cases() -> Vec<Case> {
    let corpus = "  corpus:\n    kind: embedded\n    seed: 7\n    train_size: 300\n    val_size: 40\n    test_size: 40\n";
    let lr_fast = edit(BASE, "lr: 3.0e-3", "lr: fast");
    let mut cases = vec![
        case("the base config", BASE, &[]),
        case("the language-model config", LM, &[]),
        case(
            "an unknown section",
            format!("{BASE}optimiser:\n  kind: adam\n"),
            &[],
        ),
        case(
            "an unknown train key",
            edit(BASE, "  lr: 3.0e-3\n", "  lr: 3.0e-3\n  lrr: 1.0\n"),
            &[],
        ),
        case(
            "a misspelt model key",
            edit(BASE, "qk_norm: none", "qk_nrom: none"),
            &[],
        ),
        case(
            "an unknown corpus key",
            edit(BASE, "    seed: 7\n", "    seed: 7\n    sede: 8\n"),
            &[],
        ),
        case(
            "a word for a corpus size",
            edit(BASE, "train_size: 300", "train_size: many"),
            &[],
        ),
        case(
            "an unknown corpus kind",
            edit(BASE, "kind: embedded", "kind: embeded"),
            &[],
        ),
        case("a word for the learning rate", lr_fast.clone(), &[]),
        case(
            "an unknown QK-norm",
            edit(BASE, "qk_norm: none", "qk_norm: foo"),
            &[],
        ),
        case(
            "another unknown QK-norm",
            edit(BASE, "qk_norm: none", "qk_norm: l3"),
            &[],
        ),
        case(
            "an unknown schedule",
            edit(
                BASE,
                "  warmup_steps: 2\n",
                "  warmup_steps: 2\n  schedule: linear\n",
            ),
            &[],
        ),
        case(
            "label smoothing above 1",
            edit(BASE, "label_smoothing: 0.1", "label_smoothing: 1.5"),
            &[],
        ),
        case(
            "a negative learning rate",
            edit(BASE, "lr: 3.0e-3", "lr: -1"),
            &[],
        ),
        case("no batches to evaluate", BASE, &["eval.max_batches=0"]),
        case("no sentences to decode", BASE, &["eval.bleu_sentences=0"]),
        case(
            "an empty training split",
            edit(BASE, "train_size: 300", "train_size: 0"),
            &[],
        ),
        case(
            "a vocabulary of 3",
            edit(BASE, "vocab_size: 200", "vocab_size: 3"),
            &[],
        ),
        case("no learning rate", edit(BASE, "  lr: 3.0e-3\n", ""), &[]),
        case("neither steps nor epochs", edit(BASE, "  steps: 8\n", ""), &[]),
        case("both steps and epochs", BASE, &["train.epochs=2"]),
        case(
            "a text corpus for seq2seq",
            edit(BASE, corpus, "  corpus:\n    kind: text\n    path: corpus.txt\n"),
            &[],
        ),
        case(
            "a translation corpus for an lm",
            edit(BASE, "arch: seq2seq", "arch: lm"),
            &[],
        ),
        case(
            "translation without max_tokens",
            "model: { arch: seq2seq, d_model: 32, n_layers: 1, n_heads: 4, d_ff: 64 }\n\
             train: { steps: 8, lr: 3.0e-3 }\neval:\n  max_tokens: 300\n",
            &[],
        ),
        case("an unknown key by --set", BASE, &["train.lrr=1"]),
        case("a word for the learning rate by --set", BASE, &["train.lr=fast"]),
        case("a negative learning rate by --set", BASE, &["train.lr=-1"]),
        case(
            "a broken file mended by --set",
            lr_fast,
            &[
                "train.lr=1e-3",
                "train.clip_grad_norm=null",
                "eval.every=7",
                "model.qk_norm=rmsnorm",
            ],
        ),
        case(
            "a 100 kB --set value",
            LM,
            &[&format!("train.lr={}", "a".repeat(100_000))],
        ),
        case(
            "a 100 kB key by --set",
            LM,
            &[&format!("model.{}=1", "a".repeat(100_000))],
        ),
        case(
            "BLEU keeps the best of a language model",
            LM,
            &["checkpoint.keep_best_by=bleu"],
        ),
        case(
            "BLEU keeps the best without BLEU",
            BASE,
            &["checkpoint.keep_best_by=bleu", "eval.bleu=false"],
        ),
        case(
            "a char tokenizer with a vocabulary size",
            LM,
            &["data.tokenizer.vocab_size=10"],
        ),
        case(
            "a text corpus with path and train_files",
            LM,
            &["data.corpus.train_files=[a.txt]"],
        ),
        case("a device that is not one", BASE, &["device=gpu"]),
        case("the second GPU", BASE, &["device=cuda:1"]),
        case("an l2 scale without l2", BASE, &["model.qk_norm_init_scale=2.0"]),
        case(
            "an odd head width with rotary positions",
            LM,
            &["model.head_dim=3"],
        ),
        case(
            "an odd head width without positions",
            LM,
            &["model.head_dim=3", "model.positions=none"],
        ),
        case("Qwen2's biases in seq2seq", BASE, &["model.qkv_bias=true"]),
        case("a log-n length without log-n", LM, &["model.logn_length=8"]),
        case(
            "shards without validation",
            LM,
            &["data.corpus={kind: token_shards, train_files: [a.bin], val_files: [], tokenizer: run}"],
        ),
        case(
            "a dataset with path and repo",
            LM,
            &["data.corpus={kind: hf_dataset, path: d, repo: a/b, columns: {text: text}}"],
        ),
        case(
            "a dataset id with two slashes",
            LM,
            &["data.corpus={kind: hf_dataset, repo: a/b/c, columns: {text: text}}"],
        ),
        case(
            "a dataset with half a translation",
            BASE,
            &["data.corpus={kind: hf_dataset, path: d, columns: {source: en}}"],
        ),
        case(
            "a pretrained tokenizer for translation",
            BASE,
            &["data.tokenizer={kind: pretrained, path: m}"],
        ),
        case("a zero thread count", LM, &["train.threads=0"]),
        case("a beam of 2000", BASE, &["eval.beam=2000"]),
    ];
    for (name, text, overrides, rule) in [
        (
            "heads that do not divide the width",
            edit(
                &edit(BASE, "d_model: 32", "d_model: 100"),
                "n_heads: 4",
                "n_heads: 3",
            ),
            vec![],
            "model.d_model divisible by model.n_heads",
        ),
        (
            "a floor above the peak",
            BASE.to_string(),
            vec!["train.min_lr=1.0"],
            "train.min_lr ≤ train.lr",
        ),
        (
            "windows longer than the positions",
            LM.to_string(),
            vec!["train.block_size=32"],
            "train.block_size ≤ model.max_seq_len",
        ),
        (
            "an embedded task too large to generate",
            BASE.to_string(),
            vec!["data.corpus.train_size=999999", "data.corpus.val_size=999"],
            "data.corpus train_size + val_size + test_size ≤ 1,000,000",
        ),
    ] {
        let mut c = case(name, text, &overrides);
        c.beyond_schema = Some(rule);
        cases.push(c);
    }
    cases
}

/// Configs the YAML parser (or `--set`) refuses before there is a tree to check: both Ember
/// and an editor flag them as YAML, not against the schema.
pub fn unparsable() -> Vec<Case> {
    vec![
        case(
            "an unclosed list",
            edit(BASE, "  d_model: 32\n", "  d_model: [32\n"),
            &[],
        ),
        case("a key with two colons", "model:\n  arch: lm\n   bad: : x\n", &[]),
        case("an empty file", "", &[]),
        case("blank lines", "\n\n", &[]),
        case("only a comment", "# only a comment\n", &[]),
        case("--set without a value", BASE, &["train.lr"]),
        case("--set into a number", BASE, &["train.lr.x=1"]),
        case(
            "an infinite learning rate",
            LM.replace("lr: 3.0e-3", "lr: .inf"),
            &[],
        ),
        case("a NaN by --set", LM, &["train.lr=.nan"]),
        case(
            "two YAML documents",
            format!("{LM}---\ntrain: {{ steps: 2 }}\n"),
            &[],
        ),
    ]
}
