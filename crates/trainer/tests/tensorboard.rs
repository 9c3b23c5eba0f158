//! Specification: a run's TensorBoard event files hold the numbers of its metrics.jsonl, framed
//! and encoded as TensorBoard reads them (every record's CRCs are checked on reading back), and
//! a resumed run adds a file that starts with a restart marker instead of rewriting the old one.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use ember_tensorboard::{event_files, proto, read_records, FILE_VERSION};
use ember_trainer::metrics::{self, Record};
use ember_trainer::run_dir::METRICS;
use ember_trainer::train;

/// Every event of every event file in `dir`, in TensorBoard's reading order, per file.
fn events(dir: &Path) -> Vec<Vec<proto::DecodedEvent>> {
    event_files(dir)
        .unwrap()
        .iter()
        .map(|f| {
            read_records(f)
                .unwrap()
                .iter()
                .map(|r| proto::decode_event(r).expect("a decodable Event"))
                .collect()
        })
        .collect()
}

/// tag -> [(step, value)] over all scalar events.
fn scalars(events: &[proto::DecodedEvent]) -> BTreeMap<String, Vec<(i64, f32)>> {
    let mut out: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    for e in events {
        for (tag, v) in &e.scalars {
            out.entry(tag.clone()).or_default().push((e.step, *v));
        }
    }
    out
}

#[test]
fn a_language_model_run_logs_its_metrics_as_tensorboard_scalars() {
    let tmp = tempdir();
    let text = write_text(tmp.path());
    let run = tmp.path().join("run");
    train(config(&lm_yaml(&text), &[]), &opts(&run)).unwrap();

    let files = events(&run);
    assert_eq!(files.len(), 1, "one event file per invocation");
    assert_eq!(files[0][0].file_version.as_deref(), Some(FILE_VERSION));
    let got = scalars(&files[0]);

    let records = metrics::read(&run.join(METRICS)).unwrap();
    let mut expected: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    let mut push = |tag: &str, step: u64, v: f64| {
        expected
            .entry(tag.to_string())
            .or_default()
            .push((step as i64, v as f32))
    };
    for r in &records {
        match r {
            Record::Train(t) => {
                push("train/loss", t.step, t.loss);
                push("train/nll", t.step, t.nll);
                push("train/lr", t.step, t.lr);
                push("train/grad_norm", t.step, t.grad_norm);
                push("train/tokens_per_sec", t.step, t.tokens_per_sec);
                // Two decoder layers: one self-attention module each.
                assert_eq!(t.attn_max_logit.len(), 2);
                for (i, (m, h)) in t.attn_max_logit.iter().zip(&t.attn_entropy).enumerate() {
                    let module = format!("decoder.layers.{i}.self_attn");
                    push(&format!("attn/max_logit/{module}"), t.step, *m as f64);
                    push(&format!("attn/entropy/{module}"), t.step, *h as f64);
                }
            }
            Record::Eval(e) => {
                push("eval/loss", e.step, e.loss);
                push("eval/ppl", e.step, e.ppl);
            }
        }
    }
    assert_eq!(got, expected);
    assert_eq!(got["train/loss"].len(), 8, "one point per logged step");
    assert_eq!(
        got["eval/ppl"].iter().map(|p| p.0).collect::<Vec<_>>(),
        vec![4, 8]
    );
}

#[test]
fn a_resumed_run_adds_a_file_that_starts_with_a_restart_marker() {
    let tmp = tempdir();
    let text = write_text(tmp.path());
    let run = tmp.path().join("run");
    let yaml = lm_yaml(&text);
    let mut first = opts(&run);
    first.stop_after = Some(5);
    train(config(&yaml, &[]), &first).unwrap();
    let mut second = opts(&run);
    second.resume = true;
    train(config(&yaml, &[]), &second).unwrap();

    let files = events(&run);
    assert_eq!(
        files.len(),
        2,
        "the resumed process writes its own file after the first"
    );
    let restart = &files[1][1];
    assert!(
        restart.session_start,
        "the second file's first event after the version is a restart"
    );
    assert_eq!(
        restart.step, 6,
        "TensorBoard drops the old file's points from the first resumed step on"
    );
    let (before, after) = (scalars(&files[0]), scalars(&files[1]));
    let steps =
        |s: &BTreeMap<String, Vec<(i64, f32)>>| s["train/loss"].iter().map(|p| p.0).collect::<Vec<_>>();
    assert_eq!(steps(&before), vec![1, 2, 3, 4, 5]);
    assert_eq!(steps(&after), vec![6, 7, 8]);
}

#[test]
fn log_tensorboard_false_writes_no_event_file() {
    let tmp = tempdir();
    let text = write_text(tmp.path());
    let run = tmp.path().join("run");
    train(
        config(&lm_yaml(&text), &["log.tensorboard=false", "train.steps=2"]),
        &opts(&run),
    )
    .unwrap();
    assert!(event_files(&run).unwrap().is_empty());
    assert!(run.join(METRICS).is_file());
}
