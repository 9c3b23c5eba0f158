//! Specification of `ember config`: `schema` prints the committed JSON Schema, `reference` the
//! committed reference page, and `show` a config with every default filled in and the source of
//! each value, as YAML that loads back as the same config (or as JSON).

mod common;

use std::path::Path;

use common::*;
use ember_trainer::config::{RunConfig, REFERENCE_FILE, SCHEMA_FILE};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn schema_and_reference_print_the_committed_files() {
    for (command, file) in [("schema", SCHEMA_FILE), ("reference", REFERENCE_FILE)] {
        let printed = ok(repo(), &["config", command]);
        let committed = std::fs::read_to_string(repo().join(file)).unwrap();
        assert!(
            printed == committed,
            "`ember config {command}` differs from {file}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("schema.json");
    ok(dir.path(), &["config", "schema", "--output", s(&out)]);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        std::fs::read_to_string(repo().join(SCHEMA_FILE)).unwrap()
    );
}

#[test]
fn show_names_the_source_of_every_value() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "run.yaml", seq2seq_yaml(8, 4, 4));
    let json = ok(
        dir.path(),
        &["config", "show", "run.yaml", "--set", "train.lr=1e-3", "--json"],
    );
    let shown: serde_json::Value = serde_json::from_str(&json).unwrap();
    let sources = &shown["sources"];
    assert_eq!(sources["train.lr"], "set", "{json}");
    assert_eq!(sources["model.d_model"], "file");
    assert_eq!(sources["train.beta2"], "default");
    assert_eq!(sources["data.corpus.seed"], "file");
    assert_eq!(shown["config"]["train"]["lr"], 1e-3);
    assert_eq!(shown["config"]["train"]["beta2"], 0.98);
    assert_eq!(shown["config"]["model"]["head_dim"], serde_json::Value::Null);

    let text = ok(
        dir.path(),
        &["config", "show", "run.yaml", "--set", "train.lr=1e-3"],
    );
    let line = |key: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_default()
    };
    assert!(line("lr:").ends_with("# --set"), "{text}");
    assert!(line("d_model:").ends_with("# file"), "{text}");
    assert!(line("beta2:").ends_with("# default"), "{text}");
    // The output is a config: it loads back as the config it shows.
    let again = write(dir.path(), "shown.yaml", &text);
    assert_eq!(
        RunConfig::load(&again, &[]).unwrap(),
        RunConfig::load(&cfg, &["train.lr=1e-3".to_string()]).unwrap()
    );
}

#[test]
fn every_shipped_config_shows_and_loads_back() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(repo().join("configs")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if path.extension().is_none_or(|x| x != "yaml") || text.contains("init_from:") {
            continue; // the fine-tuning config needs its downloaded model folder
        }
        let shown = ok(repo(), &["config", "show", s(&path)]);
        let again = write(dir.path(), "shown.yaml", &shown);
        assert_eq!(
            RunConfig::load(&again, &[]).unwrap(),
            RunConfig::load(&path, &[]).unwrap(),
            "{}",
            path.display()
        );
    }
}

#[test]
fn show_refuses_a_broken_config_as_train_does() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "bad.yaml",
        seq2seq_yaml(8, 4, 4)
            .replace("qk_norm", "x")
            .replace("d_ff: 64", "d_ff: 0"),
    );
    let message = fails(dir.path(), &["config", "show", "bad.yaml"]);
    assert!(
        message.contains("bad.yaml:") && message.contains("model.d_ff"),
        "{message}"
    );
}

#[test]
fn show_names_what_the_model_folder_of_init_from_filled_in() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("llama")).unwrap();
    write(
        dir.path(),
        "llama/config.json",
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
            "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "hidden_act": "silu",
            "max_position_embeddings": 64, "rms_norm_eps": 1e-05, "rope_theta": 10000,
            "tie_word_embeddings": true}"#,
    );
    write(
        dir.path(),
        "ft.yaml",
        "model: { init_from: llama, max_seq_len: 32 }\n\
         data: { corpus: { kind: text, path: text.txt } }\n\
         train: { steps: 2, lr: 1.0e-4, batch_size: 2, block_size: 16 }\n",
    );
    let json = ok(dir.path(), &["config", "show", "ft.yaml", "--json"]);
    let shown: serde_json::Value = serde_json::from_str(&json).unwrap();
    let sources = &shown["sources"];
    assert_eq!(sources["model.d_model"], "model_folder", "{json}");
    assert_eq!(shown["config"]["model"]["d_model"], 16);
    assert_eq!(sources["model.n_kv_heads"], "model_folder");
    assert_eq!(sources["data.tokenizer.kind"], "model_folder");
    assert_eq!(sources["model.max_seq_len"], "file");
    assert_eq!(sources["model.init_from"], "file");
}
