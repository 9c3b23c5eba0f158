//! Specification of `train.precision`: `bf16` trains in mixed precision (bf16 products, f32
//! everything else) and records it in the run; evaluation and decoding of the run take its
//! precision; f32 runs' files carry no trace of the key; a changed precision on resume and a
//! bad value are refused with the key named, nothing written.

mod common;

use common::*;
use ember_kernels::Precision;
use ember_trainer::run_dir::RUN_CONFIG;
use ember_trainer::{evaluate, open_run, train, Split};

#[test]
fn a_bf16_run_trains_in_bf16_and_says_so_in_its_config() {
    bf16_everywhere();
    let tmp = tempdir();
    let (f32_dir, bf16_dir) = (tmp.path().join("f32"), tmp.path().join("bf16"));
    let yaml = seq2seq_yaml();
    assert!(train(config(&yaml, &[]), &opts(&f32_dir)).unwrap().finished);
    let summary = train(config(&in_bf16(&yaml), &[]), &opts(&bf16_dir)).unwrap();
    assert!(summary.finished && summary.diverged.is_none());

    let (a, b) = (losses(&f32_dir), losses(&bf16_dir));
    // The same start, rounded differently: the first loss agrees to bf16's precision, and the
    // weights end up different (the products really were bf16).
    assert!(
        (a[0].1 - b[0].1).abs() < 1e-2 * a[0].1,
        "first losses {} vs {}",
        a[0].1,
        b[0].1
    );
    assert_ne!(a, b, "bf16 logged the f32 run's losses");
    assert!(b.last().unwrap().1 < b[0].1, "bf16 did not learn: {b:?}");
    let weights =
        |d: &std::path::Path| std::fs::read(newest_checkpoint(d).join("model.safetensors")).unwrap();
    assert!(weights(&f32_dir) != weights(&bf16_dir));

    let saved = |d: &std::path::Path| std::fs::read_to_string(d.join(RUN_CONFIG)).unwrap();
    assert!(
        saved(&bf16_dir).contains("precision: bf16"),
        "{}",
        saved(&bf16_dir)
    );
    assert!(
        !saved(&f32_dir).contains("precision"),
        "an f32 config names no precision"
    );
}

#[test]
fn evaluating_a_bf16_run_takes_its_precision_and_reproduces_its_validation_loss() {
    bf16_everywhere();
    let tmp = tempdir();
    let dir = tmp.path().join("bf16");
    let summary = train(config(&in_bf16(&seq2seq_yaml()), &[]), &opts(&dir)).unwrap();
    let run = open_run(&dir, None).unwrap();
    assert_eq!(run.model.precision(), Precision::Bf16);
    let valid = evaluate(&run.model, &run.data, &run.cfg, Split::Valid, &run.device).unwrap();
    assert_eq!(Some(valid.loss), summary.val_loss, "eval of the final checkpoint");
    // In f32 the same weights give another (close) loss: evaluation really ran in bf16.
    let mut f32_model = open_run(&dir, None).unwrap();
    f32_model.model.set_precision(Precision::F32);
    let in_f32 = evaluate(&f32_model.model, &run.data, &run.cfg, Split::Valid, &run.device).unwrap();
    assert_ne!(in_f32.loss, valid.loss);
    assert!((in_f32.loss - valid.loss).abs() < 2e-2 * valid.loss);
}

#[test]
fn resuming_in_another_precision_is_refused_unless_allowed() {
    bf16_everywhere();
    let tmp = tempdir();
    let dir = tmp.path().join("run");
    let yaml = seq2seq_yaml();
    let mut first = opts(&dir);
    first.stop_after = Some(4);
    train(config(&yaml, &[]), &first).unwrap();
    let before = std::fs::read(dir.join(RUN_CONFIG)).unwrap();

    let mut resume = opts(&dir);
    resume.resume = true;
    let err = format!("{:#}", train(config(&in_bf16(&yaml), &[]), &resume).unwrap_err());
    assert!(
        err.contains("train.precision: f32")
            && err.contains("now says bf16")
            && err.contains("--allow-precision-change"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(dir.join(RUN_CONFIG)).unwrap(),
        before,
        "config.yaml untouched"
    );
    assert_eq!(losses(&dir).len(), 4, "nothing trained");

    resume.allow_precision_change = true;
    assert!(train(config(&in_bf16(&yaml), &[]), &resume).unwrap().finished);
    assert!(std::fs::read_to_string(dir.join(RUN_CONFIG))
        .unwrap()
        .contains("precision: bf16"));
}

#[test]
fn a_bad_precision_value_is_refused_naming_the_key_and_the_choices() {
    let yaml = seq2seq_yaml().replacen("\ntrain:\n", "\ntrain:\n  precision: fp16\n", 1);
    let o: Vec<String> = vec![];
    let err = ember_trainer::config::RunConfig::from_yaml(&yaml, std::path::Path::new("bad.yaml"), &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("train.precision") && err.contains("f32") && err.contains("bf16"),
        "{err}"
    );
    let set = vec!["train.precision=half".to_string()];
    let err =
        ember_trainer::config::RunConfig::from_yaml(&seq2seq_yaml(), std::path::Path::new("ok.yaml"), &set)
            .unwrap_err()
            .to_string();
    assert!(err.contains("train.precision") && err.contains("half"), "{err}");
}
