//! Specification: a run stopped and resumed is bit-identical to one that never stopped; the
//! same config and seed give bit-identical losses; checkpoints refuse what they cannot honour.

mod common;

use common::*;
use ember_trainer::train;

fn assert_resume_is_exact(yaml: &str) {
    let tmp = tempdir();
    let (a, b) = (tmp.path().join("straight"), tmp.path().join("interrupted"));
    let full = train(config(yaml, &[]), &opts(&a)).unwrap();
    assert!(full.finished);

    let mut first = opts(&b);
    first.stop_after = Some(5);
    let partial = train(config(yaml, &[]), &first).unwrap();
    assert!(!partial.finished);
    assert_eq!(partial.steps, 5);
    let mut second = opts(&b);
    second.resume = true;
    let resumed = train(config(yaml, &[]), &second).unwrap();
    assert_eq!(resumed.resumed_from_step, Some(5));
    assert!(resumed.finished);

    let (la, lb) = (losses(&a), losses(&b));
    assert_eq!(la.len(), 8, "one record per step");
    assert_eq!(la, lb, "per-step losses must be bit-identical");
    let wa = std::fs::read(newest_checkpoint(&a).join("model.safetensors")).unwrap();
    let wb = std::fs::read(newest_checkpoint(&b).join("model.safetensors")).unwrap();
    assert!(wa == wb, "final weights must be bit-identical");
    let oa = std::fs::read(newest_checkpoint(&a).join("optimizer.safetensors")).unwrap();
    let ob = std::fs::read(newest_checkpoint(&b).join("optimizer.safetensors")).unwrap();
    assert!(oa == ob, "final optimizer moments must be bit-identical");
}

#[test]
fn resuming_a_translation_run_is_bit_identical_to_an_uninterrupted_one() {
    assert_resume_is_exact(&seq2seq_yaml());
}

#[test]
fn resuming_a_language_model_run_with_accumulation_is_bit_identical() {
    let tmp = tempdir();
    let text = write_text(tmp.path());
    assert_resume_is_exact(&lm_yaml(&text));
}

#[test]
fn resuming_a_bf16_translation_run_is_bit_identical_to_an_uninterrupted_one() {
    bf16_everywhere();
    assert_resume_is_exact(&in_bf16(&seq2seq_yaml()));
}

#[test]
fn resuming_a_bf16_language_model_run_with_accumulation_is_bit_identical() {
    bf16_everywhere();
    let tmp = tempdir();
    let text = write_text(tmp.path());
    assert_resume_is_exact(&in_bf16(&lm_yaml(&text)));
}

#[test]
fn the_same_seed_gives_bit_identical_losses_and_another_seed_does_not() {
    let tmp = tempdir();
    let yaml = seq2seq_yaml();
    train(config(&yaml, &[]), &opts(&tmp.path().join("a"))).unwrap();
    train(config(&yaml, &[]), &opts(&tmp.path().join("b"))).unwrap();
    train(config(&yaml, &["train.seed=4"]), &opts(&tmp.path().join("c"))).unwrap();
    let a = losses(&tmp.path().join("a"));
    assert_eq!(a, losses(&tmp.path().join("b")));
    assert_ne!(a, losses(&tmp.path().join("c")));
}

#[test]
fn training_reduces_the_loss() {
    let tmp = tempdir();
    let s = train(
        config(&seq2seq_yaml(), &["train.steps=30", "train.lr=1e-2"]),
        &opts(tmp.path()),
    )
    .unwrap();
    let l = losses(tmp.path());
    assert!(l.last().unwrap().1 < l[0].1 - 0.5, "{l:?}");
    assert!(s.val_loss.unwrap() < l[0].1);
}

#[test]
fn starting_over_an_existing_run_is_refused_and_changes_nothing() {
    let tmp = tempdir();
    train(config(&seq2seq_yaml(), &[]), &opts(tmp.path())).unwrap();
    let before = std::fs::read(tmp.path().join("metrics.jsonl")).unwrap();
    let err = train(config(&seq2seq_yaml(), &[]), &opts(tmp.path()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--resume"), "{err}");
    assert_eq!(before, std::fs::read(tmp.path().join("metrics.jsonl")).unwrap());
}

#[test]
fn resuming_with_another_model_config_is_refused_naming_the_difference() {
    let tmp = tempdir();
    let mut o = opts(tmp.path());
    o.stop_after = Some(2);
    train(config(&seq2seq_yaml(), &[]), &o).unwrap();
    o.resume = true;
    o.stop_after = None;
    let err = train(config(&seq2seq_yaml(), &["model.d_ff=128"]), &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.d_ff") && err.contains("64") && err.contains("128"),
        "{err}"
    );
}

#[test]
fn a_corrupt_checkpoint_is_detected_and_fallback_happens_only_on_request() {
    let tmp = tempdir();
    let mut o = opts(tmp.path());
    o.stop_after = Some(4); // checkpoints at 2 and 4
    train(config(&seq2seq_yaml(), &[]), &o).unwrap();
    let newest = newest_checkpoint(tmp.path());
    let weights = newest.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();

    o.resume = true;
    o.stop_after = None;
    let err = format!("{:#}", train(config(&seq2seq_yaml(), &[]), &o).unwrap_err());
    assert!(
        err.contains("corrupt") && err.contains("model.safetensors") && err.contains("--fallback"),
        "{err}"
    );

    o.fallback = true;
    let s = train(config(&seq2seq_yaml(), &[]), &o).unwrap();
    assert_eq!(s.resumed_from_step, Some(2));
    assert!(s.finished);
}

#[test]
fn resume_without_a_checkpoint_says_how_to_start() {
    let tmp = tempdir();
    let mut o = opts(tmp.path());
    o.resume = true;
    let err = train(config(&seq2seq_yaml(), &[]), &o).unwrap_err().to_string();
    assert!(
        err.contains("no complete checkpoint") && err.contains("without --resume"),
        "{err}"
    );
}

#[test]
fn a_non_finite_loss_stops_the_run_naming_the_step_or_is_skipped_on_request() {
    let tmp = tempdir();
    let yaml = seq2seq_yaml();
    let err = train(
        config(
            &yaml,
            &[
                "train.lr=1e30",
                "train.clip_grad_norm=null",
                "train.warmup_steps=0",
            ],
        ),
        &opts(&tmp.path().join("stop")),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("step ") && err.contains("not applied") && err.contains("on_nonfinite"),
        "{err}"
    );
    // Nothing corrupt was saved: every checkpoint present is loadable.
    for (_, dir) in ember_trainer::checkpoint::list(&tmp.path().join("stop")) {
        ember_trainer::checkpoint::load(&dir, &candle_core::Device::Cpu).unwrap();
    }
    let s = train(
        config(
            &yaml,
            &[
                "train.lr=1e30",
                "train.clip_grad_norm=null",
                "train.warmup_steps=0",
                "train.on_nonfinite=skip",
            ],
        ),
        &opts(&tmp.path().join("skip")),
    )
    .unwrap();
    assert!(s.skipped_steps > 0 && s.finished, "{s:?}");
}

#[test]
fn checkpoints_keep_the_last_k_plus_the_best() {
    let tmp = tempdir();
    train(
        config(
            &seq2seq_yaml(),
            &["train.steps=12", "checkpoint.every=2", "checkpoint.keep_last=2"],
        ),
        &opts(tmp.path()),
    )
    .unwrap();
    let steps: Vec<u64> = ember_trainer::checkpoint::list(tmp.path())
        .iter()
        .map(|(s, _)| *s)
        .collect();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("summary.json")).unwrap()).unwrap();
    let best = summary["best"]["step"].as_u64().unwrap();
    assert!(steps.ends_with(&[10, 12]), "{steps:?}");
    assert!(steps.contains(&best), "best step {best} kept: {steps:?}");
    assert!(steps.len() <= 3, "{steps:?}");
}

#[test]
fn a_run_whose_validation_loss_stays_above_its_initial_value_stops_as_diverged() {
    let tmp = tempdir();
    // A learning rate this high wrecks the model without producing NaNs (clipping keeps the
    // gradients finite): the loss climbs above its value at initialisation and stays there.
    let s = train(
        config(
            &seq2seq_yaml(),
            &[
                "train.lr=5.0",
                "train.warmup_steps=0",
                "train.steps=40",
                "eval.every=2",
                "train.divergence_evals=2",
            ],
        ),
        &opts(tmp.path()),
    )
    .unwrap();
    let reason = s.diverged.clone().expect("diverged");
    assert!(reason.contains("above its initial value"), "{reason}");
    assert!(!s.finished && s.steps < 40, "{s:?}");
    let summary = std::fs::read_to_string(tmp.path().join("summary.json")).unwrap();
    assert!(summary.contains("\"diverged\""), "{summary}");
}

#[test]
fn a_non_finite_stop_leaves_a_summary_saying_so() {
    let tmp = tempdir();
    let cfg = config(
        &seq2seq_yaml(),
        &[
            "train.lr=1e30",
            "train.clip_grad_norm=null",
            "train.warmup_steps=0",
        ],
    );
    assert!(train(cfg, &opts(tmp.path())).is_err());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("summary.json")).unwrap()).unwrap();
    assert!(
        summary["diverged"].as_str().unwrap().contains("step "),
        "{summary}"
    );
    assert_eq!(summary["finished"], false);
}
