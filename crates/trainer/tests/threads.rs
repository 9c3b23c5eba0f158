//! Specification: the thread count is a speed setting, never a numerical one. A run trained on
//! one thread, and the same run trained on three threads, stopped, and resumed on two, log the
//! same losses and end with the same weights and optimizer moments, bit for bit — also when
//! each micro-batch is split into shares computed at once (`train.shares`). The shares group
//! the sums differently, but compute the same gradient.
//!
//! (Its own test binary: the kernels' thread pool is process-wide, and other tests running
//! beside this one would resize it under it.)

mod common;

use common::*;
use ember_trainer::metrics::{self, Record};
use ember_trainer::run_dir::METRICS;
use ember_trainer::train;

/// The kernels' pool is process-wide and `train` resizes it: the tests of this binary take
/// turns, or one would resize it under another.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static POOL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

fn assert_threads_change_nothing(yaml: &str, shares: &str) {
    let _one_at_a_time = one_at_a_time();
    let tmp = tempdir();
    let (a, b) = (tmp.path().join("one-thread"), tmp.path().join("three-then-two"));
    // Wide enough that products, attention and elementwise ops all split into several tasks.
    let sized = ["model.d_model=64", "model.d_ff=256", shares];
    let with = |threads: &str| {
        let mut o = sized.to_vec();
        o.push(threads);
        config(yaml, &o)
    };
    assert!(train(with("train.threads=1"), &opts(&a)).unwrap().finished);

    let mut first = opts(&b);
    first.stop_after = Some(5);
    train(with("train.threads=3"), &first).unwrap();
    let mut second = opts(&b);
    second.resume = true;
    assert!(train(with("train.threads=2"), &second).unwrap().finished);

    assert_eq!(losses(&a), losses(&b), "per-step losses");
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let wa = std::fs::read(newest_checkpoint(&a).join(file)).unwrap();
        let wb = std::fs::read(newest_checkpoint(&b).join(file)).unwrap();
        assert!(wa == wb, "{file} differs between thread counts");
    }
}

#[test]
fn a_translation_run_is_bit_identical_at_any_thread_count() {
    assert_threads_change_nothing(&seq2seq_yaml(), "train.shares=1");
}

#[test]
fn a_translation_run_in_shares_is_bit_identical_at_any_thread_count() {
    assert_threads_change_nothing(&seq2seq_yaml(), "train.shares=3");
}

#[test]
fn a_language_model_run_is_bit_identical_at_any_thread_count() {
    let tmp = tempdir();
    let text = write_text(tmp.path());
    assert_threads_change_nothing(&lm_yaml(&text), "train.shares=1");
}

#[test]
fn a_language_model_run_in_shares_is_bit_identical_at_any_thread_count() {
    let tmp = tempdir();
    let text = write_text(tmp.path());
    assert_threads_change_nothing(&lm_yaml(&text), "train.shares=2");
}

#[test]
fn a_bf16_translation_run_in_shares_is_bit_identical_at_any_thread_count() {
    bf16_everywhere();
    assert_threads_change_nothing(&in_bf16(&seq2seq_yaml()), "train.shares=3");
}

#[test]
fn a_bf16_language_model_run_is_bit_identical_at_any_thread_count() {
    bf16_everywhere();
    let tmp = tempdir();
    let text = write_text(tmp.path());
    assert_threads_change_nothing(&in_bf16(&lm_yaml(&text)), "train.shares=1");
}

#[test]
fn shares_group_the_sums_differently_but_compute_the_same_gradient() {
    let _one_at_a_time = one_at_a_time();
    let tmp = tempdir();
    let (whole, halves) = (tmp.path().join("whole"), tmp.path().join("halves"));
    // Without dropout the shares draw no masks of their own: only the grouping of sums differs.
    let no_dropout = ["model.dropout=0.0", "model.attn_dropout=0.0", "train.threads=1"];
    let with = |shares: &str| {
        let mut o = no_dropout.to_vec();
        o.push(shares);
        config(&seq2seq_yaml(), &o)
    };
    train(with("train.shares=1"), &opts(&whole)).unwrap();
    train(with("train.shares=2"), &opts(&halves)).unwrap();
    let (a, b) = (losses(&whole), losses(&halves));
    assert_eq!(a.len(), b.len());
    for ((step, x), (_, y)) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-4 * x.abs(), "step {step}: {x} vs {y}");
    }
    assert_ne!(
        a, b,
        "the shares' sums are grouped differently, so some bits differ"
    );
}

#[test]
fn attention_is_measured_when_a_batch_has_fewer_rows_than_shares() {
    let _one_at_a_time = one_at_a_time();
    let tmp = tempdir();
    let text = write_text(tmp.path());
    let run = tmp.path().join("run");
    // 4 windows a micro-batch in 8 shares: shares 0, 2, 4 and 6 have no rows.
    train(
        config(&lm_yaml(&text), &["train.shares=8", "train.threads=2"]),
        &opts(&run),
    )
    .unwrap();
    let records = metrics::read(&run.join(METRICS)).unwrap();
    let logged: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Train(t) => Some(t),
            Record::Eval(_) => None,
        })
        .collect();
    assert_eq!(logged.len(), 8);
    for t in logged {
        assert!(
            !t.attn_max_logit.is_empty() && t.attn_max_logit.iter().all(|x| x.is_finite() && *x > 0.0),
            "step {}: {:?}",
            t.step,
            t.attn_max_logit
        );
    }
}
