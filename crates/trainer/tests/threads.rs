//! Specification: the thread count is a speed setting, never a numerical one. A run trained on
//! one thread, and the same run trained on three threads, stopped, and resumed on two, log the
//! same losses and end with the same weights and optimizer moments, bit for bit.
//!
//! (Its own test binary: the kernels' thread pool is process-wide, and other tests running
//! beside this one would resize it under it.)

mod common;

use common::*;
use ember_trainer::train;

fn assert_threads_change_nothing(yaml: &str) {
    // The kernels' pool is process-wide and `train` resizes it: the two tests of this binary
    // take turns, or one would resize it under the other.
    static POOL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempdir();
    let (a, b) = (tmp.path().join("one-thread"), tmp.path().join("three-then-two"));
    // Wide enough that products, attention and elementwise ops all split into several tasks.
    let sized = ["model.d_model=64", "model.d_ff=256"];
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
    assert_threads_change_nothing(&seq2seq_yaml());
}

#[test]
fn a_language_model_run_is_bit_identical_at_any_thread_count() {
    let tmp = tempdir();
    let text = write_text(tmp.path());
    assert_threads_change_nothing(&lm_yaml(&text));
}
