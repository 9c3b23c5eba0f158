//! Specification: what a run directory or a stop request holds that the user did not intend is
//! refused before anything is written, and a run stopped before its first step leaves nothing
//! that would make the next attempt fail.
//!
//! - A checkpoint whose `state.json` names another step than its directory is corrupt: resuming
//!   from it is refused (nothing changes); `--fallback` skips it.
//! - A stop request that arrives while the data is prepared ends the run there, with nothing
//!   trained and no checkpoint claimed, and the tokenizer the attempt trained is removed again.
//! - Data that shrank under a checkpoint's position is refused naming the way forward, and
//!   with `--allow-data-change` the run goes on from the next epoch.
//! - A tokenizer trained by a resume that is then refused does not stay behind.

mod common;

use common::*;
use ember_trainer::checkpoint;
use ember_trainer::interrupt::{Interrupted, StopRequest};
use ember_trainer::train;

/// Every file under `dir` with its bytes.
fn contents(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(contents(&p));
        } else if p.file_name().is_some_and(|n| n != ".lock") {
            out.push((p.clone(), std::fs::read(&p).unwrap()));
        }
    }
    out.sort();
    out
}

#[test]
fn a_state_json_that_names_another_step_is_refused_and_nothing_is_rewritten() {
    let tmp = tempdir();
    let run = tmp.path().join("run");
    let yaml = seq2seq_yaml();
    let mut first = opts(&run);
    first.stop_after = Some(6);
    train(config(&yaml, &[]), &first).unwrap();
    let newest = newest_checkpoint(&run);
    let step = checkpoint::list(&run).last().unwrap().0;
    let state = newest.join("state.json");
    let text = std::fs::read_to_string(&state).unwrap();
    let other = step - 3;
    std::fs::write(
        &state,
        text.replacen(&format!("\"step\": {step}"), &format!("\"step\": {other}"), 1),
    )
    .unwrap();
    let before = contents(&run);

    let mut resume = opts(&run);
    resume.resume = true;
    let err = format!("{:#}", train(config(&yaml, &[]), &resume).unwrap_err());
    assert!(
        err.contains("state.json")
            && err.contains(&format!("says step {other}"))
            && err.contains("--fallback"),
        "{err}"
    );
    assert!(contents(&run) == before, "nothing in the run directory changed");

    // --fallback resumes from the newest intact checkpoint instead.
    resume.fallback = true;
    let summary = train(config(&yaml, &[]), &resume).unwrap();
    assert!(summary.finished);
    assert!(
        summary.resumed_from_step.is_some_and(|s| s < step),
        "{:?}",
        summary.resumed_from_step
    );
}

#[test]
fn a_stop_while_the_data_is_prepared_ends_with_nothing_trained_and_no_tokenizer_left() {
    let tmp = tempdir();
    let text = write_text(tmp.path());
    let run = tmp.path().join("run");
    let stop = StopRequest::new();
    stop.request(libc_sigint());
    let mut o = opts(&run);
    o.stop = Some(stop.clone());
    let err = train(config(&lm_yaml(&text), &[]), &o).unwrap_err();
    let stopped = err.downcast_ref::<Interrupted>().expect("an interruption");
    assert_eq!(
        (stopped.step, &stopped.checkpoint),
        (0, &None),
        "nothing was trained or saved"
    );
    assert!(
        stop.phase().contains("once the data is ready"),
        "{}",
        stop.phase()
    );
    assert!(
        !run.join("tokenizer.json").exists(),
        "the run will start over with a fresh tokenizer"
    );
    assert!(checkpoint::list(&run).is_empty());
    // The next attempt starts over as if nothing had happened.
    assert!(train(config(&lm_yaml(&text), &[]), &opts(&run)).unwrap().finished);
}

#[test]
fn data_that_shrank_under_the_checkpoint_is_refused_and_allowed_from_the_next_epoch() {
    let tmp = tempdir();
    let text = write_text(tmp.path());
    let run = tmp.path().join("run");
    // Small windows and many steps: the checkpoint's position is deep into an epoch.
    let yaml = lm_yaml(&text)
        .replace("steps: 8", "steps: 40")
        .replace("every: 3", "every: 10");
    let mut first = opts(&run);
    first.stop_after = Some(20);
    train(config(&yaml, &[]), &first).unwrap();
    let full = std::fs::read_to_string(&text).unwrap();
    std::fs::write(&text, &full[..full.len() / 20]).unwrap();

    let mut resume = opts(&run);
    resume.resume = true;
    resume.allow_data_change = false;
    let err = format!("{:#}", train(config(&yaml, &[]), &resume).unwrap_err());
    assert!(err.contains("--allow-data-change"), "{err}");

    resume.allow_data_change = true;
    let summary = train(config(&yaml, &[]), &resume).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(summary.finished && summary.steps == 40);
}

#[test]
fn a_tokenizer_trained_by_a_refused_resume_does_not_stay_behind() {
    let tmp = tempdir();
    let text = write_text(tmp.path());
    let run = tmp.path().join("run");
    let yaml = lm_yaml(&text);
    let mut first = opts(&run);
    first.stop_after = Some(4);
    train(config(&yaml, &[]), &first).unwrap();
    std::fs::remove_file(run.join("tokenizer.json")).unwrap();
    // Other text (other characters): the new tokenizer is allowed, the data change is not.
    std::fs::write(&text, "Ωmega ☃ snow and other words\n".repeat(200)).unwrap();
    let mut resume = opts(&run);
    resume.resume = true;
    resume.allow_tokenizer_change = true;
    let err = format!("{:#}", train(config(&yaml, &[]), &resume).unwrap_err());
    assert!(err.contains("data differs"), "{err}");
    assert!(
        !run.join("tokenizer.json").exists(),
        "the directory is as it was: no tokenizer.json the next resume would have to refuse"
    );
}

fn libc_sigint() -> i32 {
    ember_trainer::interrupt::STOP_SIGNALS[0].0
}
