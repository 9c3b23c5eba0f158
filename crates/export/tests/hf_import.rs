//! Specification of `model.init_from` (Hugging Face models in) against `ember export --format hf`
//! (models out), without network: a run exported and imported again is the same model bit for
//! bit, Qwen3-, Qwen2- and Llama-shaped, tied and untied; a run from an imported model starts from its
//! weights, resumes bit-exactly and exports back out; sharded and half-precision checkpoints
//! load; and what Ember cannot represent is refused by name before a weight is read. (That
//! transformers' own models import and agree with transformers is scripts/check-hf-import.py's
//! part, where torch is installed.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use ember_export::{export_hf, export_hf_as, ExportDtype, ExportSource};
use ember_model::{Model, ModelConfig};
use ember_trainer::config::RunConfig;
use ember_trainer::metrics::Verbosity;
use ember_trainer::{checkpoint, evaluate, open_run, train, Split, TrainOptions};
use serde_json::Value;

fn corpus(dir: &Path) -> PathBuf {
    let text = dir.join("corpus.txt");
    if !text.exists() {
        let lines: String = (0..200)
            .map(|i| format!("line {i}: the quick brown fox.\n"))
            .collect();
        std::fs::write(&text, lines).unwrap();
    }
    text
}

/// The sections of a small LM run after its `model:` section.
fn rest_of_config(text: &Path, steps: u64) -> String {
    format!(
        r#"
data:
  corpus: {{ kind: text, path: "{}", val_fraction: 0.1 }}
train:
  steps: {steps}
  seed: 5
  lr: 3.0e-3
  batch_size: 4
  block_size: 16
  log_every: 1
  divergence_evals: 1000
checkpoint:
  every: 2
eval:
  every: 1000
"#,
        text.display()
    )
}

fn quiet(run: &Path) -> TrainOptions {
    TrainOptions {
        verbosity: Verbosity::Quiet,
        ..TrainOptions::new(run)
    }
}

/// Trains a 3-step Ember run from scratch in `dir/name`.
fn trained_run(dir: &Path, name: &str, qk_norm: &str, tie: bool) -> PathBuf {
    trained_run_with(dir, name, qk_norm, tie, false)
}

/// [`trained_run`], with Qwen2's q, k and v biases or without.
fn trained_run_with(dir: &Path, name: &str, qk_norm: &str, tie: bool, qkv_bias: bool) -> PathBuf {
    let yaml = format!(
        "model:\n  arch: lm\n  d_model: 32\n  n_layers: 2\n  n_heads: 4\n  n_kv_heads: 2\n  d_ff: 48\n  \
         max_seq_len: 32\n  qk_norm: {qk_norm}\n  tie_embeddings: {tie}\n  qkv_bias: {qkv_bias}\n{}",
        rest_of_config(&corpus(dir), 3)
    );
    let cfg = RunConfig::from_yaml(&yaml, Path::new("t.yaml"), &[]).unwrap();
    let run = dir.join(name);
    train(cfg, &quiet(&run)).unwrap();
    run
}

/// A config whose model is the folder `hf`, and nothing else of it.
fn import_yaml(dir: &Path, hf: &Path, steps: u64) -> String {
    format!(
        "model:\n  init_from: \"{}\"\n{}",
        hf.display(),
        rest_of_config(&corpus(dir), steps)
    )
}

fn load(yaml: &str) -> Result<RunConfig, String> {
    RunConfig::from_yaml(yaml, Path::new("import.yaml"), &[]).map_err(|e| e.to_string())
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

#[test]
fn an_exported_run_imports_as_the_same_model_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    for (qk_norm, tie, bias, class) in [
        ("rmsnorm", false, false, "Qwen3ForCausalLM"),
        ("rmsnorm", true, false, "Qwen3ForCausalLM"),
        ("none", false, false, "LlamaForCausalLM"),
        ("none", true, false, "LlamaForCausalLM"),
        ("none", false, true, "Qwen2ForCausalLM"),
        ("none", true, true, "Qwen2ForCausalLM"),
    ] {
        let what = format!("qk_norm {qk_norm}, tied {tie}, qkv_bias {bias}");
        let name = format!("{qk_norm}-{tie}-{bias}");
        let run = trained_run_with(tmp.path(), &name, qk_norm, tie, bias);
        let source = ExportSource::open(&run).unwrap();
        let hf = tmp.path().join(format!("hf-{name}"));
        export_hf(&source, &hf).unwrap();
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(hf.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["architectures"][0], class, "{what}");

        // The model section comes back key for key; only the import's own keys are added.
        let cfg = load(&import_yaml(tmp.path(), &hf, 1)).unwrap();
        assert_eq!(cfg.model.init_from.as_deref(), Some(hf.as_path()));
        assert_eq!(
            cfg.model.head_dim,
            Some(8),
            "{what}: stated, as config.json states it"
        );
        let back = ModelConfig {
            init_from: None,
            head_dim: None,
            ..cfg.model.clone()
        };
        assert_eq!(back, source.model, "{what}");

        // Every parameter, bit for bit, and nothing else.
        let params = ember_import::load_weights(&hf, &cfg.model, &Device::Cpu)
            .unwrap()
            .params;
        let original = &source.checkpoint.params;
        assert_eq!(params.names(), original.names(), "{what}");
        let biases = original.names().iter().filter(|n| n.ends_with(".bias")).count();
        assert_eq!(biases, if bias { 6 } else { 0 }, "{what}");
        for (name, var) in original.vars() {
            let imported = params.get(&name).unwrap();
            assert_eq!(imported.dims(), var.dims(), "{what}: {name}");
            assert!(bits(&imported) == bits(var.as_tensor()), "{what}: {name} differs");
        }
        // And so the same logits, to the bit.
        let tokens = source.tokenizer.encode("line 7: the quick").unwrap();
        let model = Model::new(&cfg.model, &params).unwrap();
        let input = Tensor::new(tokens.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = model
            .as_lm()
            .unwrap()
            .forward(&input, ember_model::ForwardCtx::eval())
            .unwrap()
            .squeeze(0)
            .unwrap();
        let expected = Tensor::new(source.logits(&tokens).unwrap(), &Device::Cpu).unwrap();
        assert!(bits(&logits) == bits(&expected), "{what}: logits differ");
    }
}

#[test]
fn a_run_from_an_imported_model_starts_from_its_weights_resumes_bit_exactly_and_exports_back_out() {
    let tmp = tempfile::tempdir().unwrap();
    let source_run = trained_run(tmp.path(), "source", "rmsnorm", false);
    let hf = tmp.path().join("hf");
    export_hf(&ExportSource::open(&source_run).unwrap(), &hf).unwrap();
    let yaml = import_yaml(tmp.path(), &hf, 4);

    let straight = tmp.path().join("straight");
    let done = train(load(&yaml).unwrap(), &quiet(&straight)).unwrap();

    // The run started from the imported weights: its validation loss before the first step is
    // the exported checkpoint's on the same text.
    let step4 = checkpoint::list(&straight).last().unwrap().1.clone();
    let state = checkpoint::load(&step4, &Device::Cpu).unwrap().state;
    let source = open_run(&source_run, None).unwrap();
    let expected = evaluate(
        &source.model,
        &source.data,
        &source.cfg,
        Split::Valid,
        &source.device,
    )
    .unwrap()
    .loss;
    let initial = state.initial_val_loss.unwrap();
    assert!(
        (initial - expected).abs() <= 1e-6 * expected,
        "initial validation loss {initial}, the exported model's {expected}"
    );

    // Its config.yaml states the whole architecture and the model's own tokenizer.
    let saved = std::fs::read_to_string(straight.join("config.yaml")).unwrap();
    for line in [
        "init_from:",
        "head_dim: 8",
        "qk_norm: rmsnorm",
        "kind: pretrained",
    ] {
        assert!(saved.contains(line), "{line} missing from:\n{saved}");
    }
    assert!(straight.join("tokenizer_config.json").is_file());

    // Stopped after 2 steps and resumed: the weights of the straight run.
    assert_eq!(
        stopped_and_resumed(&yaml, &tmp.path().join("resumed")),
        done.weights_sha256
    );
    // The run directory's own config.yaml reopens it without the model folder.
    std::fs::rename(&hf, tmp.path().join("hf-moved")).unwrap();
    let reopened = open_run(&straight, None).unwrap();
    assert_eq!(reopened.cfg.model.d_model, 32);

    // Out again: the same architecture and tokenizer as the first export, the new weights.
    let out = tmp.path().join("hf-again");
    let source = ExportSource::open(&straight).unwrap();
    export_hf(&source, &out).unwrap();
    let read = |p: PathBuf| serde_json::from_str::<Value>(&std::fs::read_to_string(p).unwrap()).unwrap();
    let (first, second) = (
        read(tmp.path().join("hf-moved/config.json")),
        read(out.join("config.json")),
    );
    for key in [
        "architectures",
        "hidden_size",
        "num_hidden_layers",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "tie_word_embeddings",
        "vocab_size",
        "rope_theta",
        "rms_norm_eps",
        "eos_token_id",
    ] {
        assert_eq!(first[key], second[key], "{key}");
    }
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("hf-moved/tokenizer.json")).unwrap(),
        std::fs::read_to_string(out.join("tokenizer.json")).unwrap()
    );
}

/// A model as Hugging Face ships them, in bf16, fine-tuned in bf16 mixed precision (emulated where
/// the CPU has no AVX512_BF16): it imports as the exact f32 values of its bf16 weights, trains, and resumes
/// bit-exactly.
#[test]
fn a_bf16_export_imports_and_fine_tunes_in_bf16_resuming_bit_exactly() {
    // bf16 on any CPU: natively where it has AVX512_BF16, else emulated with the same bits.
    ember_kernels::emulate_bf16_products();
    let tmp = tempfile::tempdir().unwrap();
    let source_run = trained_run(tmp.path(), "source", "none", true);
    let hf = tmp.path().join("hf");
    export_hf_as(&ExportSource::open(&source_run).unwrap(), &hf, ExportDtype::Bf16).unwrap();
    let yaml = import_yaml(tmp.path(), &hf, 4).replacen("  seed: 5\n", "  seed: 5\n  precision: bf16\n", 1);
    assert!(yaml.contains("precision: bf16"));

    let straight = tmp.path().join("straight");
    let done = train(load(&yaml).unwrap(), &quiet(&straight)).unwrap();
    assert_eq!((done.steps, done.finished), (4, true));
    let saved = std::fs::read_to_string(straight.join("config.yaml")).unwrap();
    assert!(saved.contains("precision: bf16"), "{saved}");
    // It started from the bf16 values: every f32 the import makes has a zero low half.
    let cfg = ember_import::model_config(&hf).unwrap();
    let imported = ember_import::load_weights(&hf, &cfg, &Device::Cpu).unwrap();
    for (name, var) in imported.params.vars() {
        let low_halves = bits(var.as_tensor()).iter().filter(|b| *b & 0xffff != 0).count();
        assert_eq!(low_halves, 0, "{name} is not bf16-exact");
    }

    assert_eq!(
        stopped_and_resumed(&yaml, &tmp.path().join("resumed")),
        done.weights_sha256
    );
}

/// The run of `yaml` in `run`, stopped after 2 steps and resumed to its end: its final weights'
/// SHA-256.
fn stopped_and_resumed(yaml: &str, run: &Path) -> Option<String> {
    let stop = TrainOptions {
        stop_after: Some(2),
        ..quiet(run)
    };
    let stopped = train(load(yaml).unwrap(), &stop).unwrap();
    assert_eq!((stopped.steps, stopped.finished), (2, false));
    let resume = TrainOptions {
        resume: true,
        ..quiet(run)
    };
    train(load(yaml).unwrap(), &resume).unwrap().weights_sha256
}

/// Rewrites the weights of `hf` through `f` (name, tensor) → tensors to write, as `files`
/// safetensors files with an index when there are several.
fn rewrite(hf: &Path, files: usize, f: impl Fn(&str, Tensor) -> Vec<(String, Tensor)>) {
    let all = candle_core::safetensors::load(hf.join("model.safetensors"), &Device::Cpu).unwrap();
    let mut names: Vec<String> = all.keys().cloned().collect();
    names.sort();
    let mut out: Vec<(String, Tensor)> = vec![];
    for name in names {
        out.extend(f(&name, all[&name].clone()));
    }
    std::fs::remove_file(hf.join("model.safetensors")).unwrap();
    if files == 1 {
        let map: HashMap<String, Tensor> = out.into_iter().collect();
        candle_core::safetensors::save(&map, hf.join("model.safetensors")).unwrap();
        return;
    }
    let mut weight_map = serde_json::Map::new();
    let per = out.len().div_ceil(files);
    for (i, chunk) in out.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{files:05}.safetensors", i + 1);
        let map: HashMap<String, Tensor> = chunk.iter().cloned().collect();
        candle_core::safetensors::save(&map, hf.join(&file)).unwrap();
        for (name, _) in chunk {
            weight_map.insert(name.clone(), Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(hf.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn sharded_and_half_precision_checkpoints_load_as_their_exact_f32_values() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained_run(tmp.path(), "run", "rmsnorm", true);
    let source = ExportSource::open(&run).unwrap();
    for (dtype, files) in [(DType::BF16, 3), (DType::F16, 1), (DType::F32, 2)] {
        let hf = tmp.path().join(format!("hf-{dtype:?}-{files}"));
        export_hf(&source, &hf).unwrap();
        rewrite(&hf, files, |name, t| {
            vec![(name.to_string(), t.to_dtype(dtype).unwrap())]
        });
        let cfg = load(&import_yaml(tmp.path(), &hf, 1)).unwrap();
        let params = ember_import::load_weights(&hf, &cfg.model, &Device::Cpu)
            .unwrap()
            .params;
        for (name, var) in source.checkpoint.params.vars() {
            let rounded = var
                .as_tensor()
                .to_dtype(dtype)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            let imported = params.get(&name).unwrap();
            assert_eq!(imported.dtype(), DType::F32);
            assert!(bits(&imported) == bits(&rounded), "{dtype:?}/{files}: {name}");
        }
    }
}

#[test]
fn what_ember_cannot_represent_is_refused_by_name_before_a_weight_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained_run(tmp.path(), "run", "none", false);
    let source = ExportSource::open(&run).unwrap();
    let fresh = |name: &str| {
        let hf = tmp.path().join(name);
        export_hf(&source, &hf).unwrap();
        hf
    };
    let weights_error = |hf: &Path| {
        let cfg = load(&import_yaml(tmp.path(), hf, 1)).unwrap();
        format!(
            "{:#}",
            ember_import::load_weights(hf, &cfg.model, &Device::Cpu)
                .err()
                .unwrap()
        )
    };

    // A bias, which transformers' Llama has with attention_bias: true, has no place in Ember.
    let hf = fresh("bias");
    rewrite(&hf, 1, |name, t| {
        let mut out = vec![(name.to_string(), t.clone())];
        if name == "model.layers.1.self_attn.q_proj.weight" {
            let bias = Tensor::zeros(t.dim(0).unwrap(), DType::F32, &Device::Cpu).unwrap();
            out.push(("model.layers.1.self_attn.q_proj.bias".into(), bias));
        }
        out
    });
    let e = weights_error(&hf);
    assert!(e.contains("model.layers.1.self_attn.q_proj.bias (a bias"), "{e}");

    // A missing tensor, and one of another shape, are named.
    let hf = fresh("missing");
    rewrite(&hf, 2, |name, t| {
        if name == "model.layers.0.mlp.up_proj.weight" {
            vec![]
        } else if name == "model.norm.weight" {
            vec![(
                name.to_string(),
                Tensor::ones(5, DType::F32, &Device::Cpu).unwrap(),
            )]
        } else {
            vec![(name.to_string(), t)]
        }
    });
    let e = weights_error(&hf);
    assert!(e.contains("model.layers.0.mlp.up_proj.weight is missing"), "{e}");
    assert!(e.contains("model.norm.weight has shape [5]"), "{e}");

    // A truncated download.
    let hf = fresh("truncated");
    let file = hf.join("model.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    assert!(weights_error(&hf).contains("is truncated"));

    // PyTorch pickles only.
    let hf = fresh("pickle");
    std::fs::rename(hf.join("model.safetensors"), hf.join("pytorch_model.bin")).unwrap();
    assert!(weights_error(&hf).contains("it has pytorch_model.bin"));

    // config.json settings are refused when the config loads, every one named.
    let hf = fresh("config");
    let path = hf.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["attention_bias"] = true.into();
    c["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    std::fs::write(&path, c.to_string()).unwrap();
    let e = load(&import_yaml(tmp.path(), &hf, 1)).unwrap_err();
    for part in [
        "model.init_from",
        "Ember cannot represent this model",
        "attention_bias: true",
        "\"yarn\"",
    ] {
        assert!(e.contains(part), "{part} missing from: {e}");
    }

    // Keys of the model section must agree with config.json; the tokenizer is the model's.
    let hf = fresh("keys");
    let yaml = import_yaml(tmp.path(), &hf, 1);
    let with = |extra: &str| yaml.replacen("model:\n", &format!("model:\n{extra}"), 1);
    let e = load(&with("  d_model: 64\n")).unwrap_err();
    assert!(
        e.contains("model.d_model") && e.contains("is 64, but") && e.contains("gives 32 (`hidden_size`)"),
        "{e}"
    );
    let e = load(&with("  qk_norm: rmsnorm\n")).unwrap_err();
    assert!(e.contains("model.qk_norm") && e.contains("gives none"), "{e}");
    assert!(load(&with(
        "  d_model: 32\n  norm_eps: 1.0e-5\n  max_seq_len: 24\n  dropout: 0.1\n"
    ))
    .is_ok());
    let e = load(&yaml.replacen("data:\n", "data:\n  tokenizer: { kind: char }\n", 1)).unwrap_err();
    assert!(
        e.contains("data.tokenizer") && e.contains("its own tokenizer"),
        "{e}"
    );
    let e = load(&import_yaml(tmp.path(), &tmp.path().join("nowhere"), 1)).unwrap_err();
    assert!(
        e.contains("model.init_from") && e.contains("nowhere/config.json"),
        "{e}"
    );
}

#[test]
fn an_imported_model_too_large_for_this_machine_is_refused_with_the_estimate_before_loading() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained_run(tmp.path(), "run", "rmsnorm", true);
    let hf = tmp.path().join("huge");
    export_hf(&ExportSource::open(&run).unwrap(), &hf).unwrap();
    // A config.json of a 4-trillion-parameter model over the small model's weights: the size
    // check must stop the run before the weights are looked at.
    let path = hf.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["hidden_size"] = 65536.into();
    c["intermediate_size"] = 262144.into();
    c["num_hidden_layers"] = 80.into();
    c["num_attention_heads"] = 512.into();
    c["num_key_value_heads"] = 64.into();
    c["head_dim"] = 128.into();
    std::fs::write(&path, c.to_string()).unwrap();
    let e = format!(
        "{:#}",
        train(
            load(&import_yaml(tmp.path(), &hf, 1)).unwrap(),
            &quiet(&tmp.path().join("r"))
        )
        .unwrap_err()
    );
    assert!(e.contains("GiB") && e.contains("model.d_model"), "{e}");
    assert!(
        e.contains("whose size is fixed") && e.contains("start from a smaller model"),
        "{e}"
    );
    assert!(
        !e.contains("safetensors"),
        "refused by size, not by its weights: {e}"
    );
}

#[test]
fn the_shipped_fine_tune_config_takes_its_model_and_tokenizer_from_the_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained_run(tmp.path(), "run", "none", true);
    let hf = tmp.path().join("hf");
    export_hf(&ExportSource::open(&run).unwrap(), &hf).unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/fine-tune-smollm2.yaml");
    let sets = [
        format!("model.init_from={}", hf.display()),
        format!("data.corpus.path={}", corpus(tmp.path()).display()),
    ];
    let cfg = RunConfig::load(&path, &sets).unwrap();
    assert_eq!((cfg.model.d_model, cfg.model.n_layers), (32, Some(2)));
    assert_eq!(cfg.model.max_seq_len, 256, "the config's training length");
    assert_eq!(cfg.data.tokenizer.kind, ember_data::TokenizerKind::Pretrained);
    assert_eq!(cfg.data.tokenizer.path.as_deref(), Some(hf.as_path()));
    assert_eq!(cfg.ablation.unwrap().lrs.len(), 3, "an LR sweep of the fine-tune");
}
