//! Specification of `ember ablate` over a model imported with `model.init_from`: a learning-rate
//! sweep of a fine-tune, every run starting from the imported weights; QK-norm variants other
//! than the model's own are refused before anything runs.

use std::path::{Path, PathBuf};

use candle_core::Device;
use ember_experiment::ablate::{self, AblateOptions, RunStatus, Runner};
use ember_model::QkNorm;
use ember_trainer::config::RunConfig;
use ember_trainer::metrics::Verbosity;
use ember_trainer::{checkpoint, train, TrainOptions};

const TRAINING: &str = r#"
train:
  steps: 4
  lr: 1.0e-3
  schedule: constant
  batch_size: 4
  block_size: 16
  log_every: 2
  divergence_evals: 100
eval:
  every: 0
checkpoint:
  every: 0
log:
  tensorboard: false
"#;

/// A Qwen3-shaped Hugging Face folder: a short Ember run on `corpus`, exported.
fn qwen3_folder(dir: &Path, corpus: &Path) -> PathBuf {
    let yaml = format!(
        "model:\n  arch: lm\n  d_model: 32\n  n_layers: 2\n  n_heads: 4\n  n_kv_heads: 2\n  d_ff: 48\n  \
         max_seq_len: 32\n  qk_norm: rmsnorm\ndata:\n  corpus: {{ kind: text, path: \"{}\" }}\n  \
         tokenizer: {{ kind: char }}\n{TRAINING}",
        corpus.display()
    );
    let run = dir.join("pretraining");
    let cfg = RunConfig::from_yaml(&yaml, Path::new("pretraining.yaml"), &[]).unwrap();
    train(
        cfg,
        &TrainOptions {
            verbosity: Verbosity::Quiet,
            ..TrainOptions::new(&run)
        },
    )
    .unwrap();
    let hf = dir.join("hf");
    ember_export::export_hf(&ember_export::ExportSource::open(&run).unwrap(), &hf).unwrap();
    hf
}

fn fine_tune_sweep(dir: &Path, variants: &[QkNorm]) -> AblateOptions {
    let corpus = dir.join("corpus.txt");
    let text: String = (0..300)
        .map(|i| format!("verse {i}: sing of the sea.\n"))
        .collect();
    std::fs::write(&corpus, text).unwrap();
    let hf = qwen3_folder(dir, &corpus);
    let config = dir.join("fine-tune.yaml");
    let yaml = format!(
        "model:\n  init_from: \"{}\"\ndata:\n  corpus: {{ kind: text, path: \"{}\" }}\n{TRAINING}",
        hf.display(),
        corpus.display()
    );
    std::fs::write(&config, yaml).unwrap();
    let mut o = AblateOptions::new(config, Runner::InProcess);
    o.variants = Some(variants.to_vec());
    o.seeds = Some(1);
    o.lrs = Some(vec![1e-3, 1e-2]);
    o.out = Some(dir.join("sweep"));
    o.quiet = true;
    o
}

#[test]
fn a_learning_rate_sweep_of_a_fine_tune_starts_every_run_from_the_imported_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let outcome = ablate::ablate(&fine_tune_sweep(tmp.path(), &[QkNorm::Rmsnorm])).unwrap();
    assert_eq!(outcome.runs.len(), 2);
    assert!(
        outcome.runs.iter().all(|r| r.status == RunStatus::Ok),
        "{:?}",
        outcome.runs
    );
    // The validation loss before training is the imported model's, the same for both rates.
    let initial: Vec<f64> = outcome
        .runs
        .iter()
        .map(|r| {
            let (_, last) = checkpoint::list(&r.run_dir).pop().unwrap();
            checkpoint::load(&last, &Device::Cpu)
                .unwrap()
                .state
                .initial_val_loss
                .unwrap()
        })
        .collect();
    assert_eq!(initial[0], initial[1]);
    assert!(
        initial[0] < (34f64).ln(),
        "the imported model has learned something: {initial:?}"
    );
    let finals: Vec<f64> = outcome.runs.iter().map(|r| r.val_loss.unwrap()).collect();
    assert_ne!(finals[0], finals[1], "the learning rates differ in effect");
    assert!(tmp.path().join("sweep/report.md").is_file());
}

#[test]
fn variants_other_than_the_imported_models_own_are_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let e = ablate::ablate(&fine_tune_sweep(tmp.path(), &[QkNorm::None, QkNorm::Rmsnorm]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("qk_norm: rmsnorm") && e.contains("variant none") && e.contains("--variants rmsnorm"),
        "{e}"
    );
    assert!(!tmp.path().join("sweep").exists());
}
