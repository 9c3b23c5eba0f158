//! End-to-end specification of the `ember` binary: what a user types and what they get back —
//! exit codes, JSON output, the files of a run directory, error messages without panics, and a
//! run killed with SIGKILL that resumes to the bit-identical result of one never interrupted.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::*;

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{stdout}"))
}

fn finite(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite(), "{what} = {x}");
    x
}

fn metrics(run_dir: &Path) -> Vec<Value> {
    // A record torn by a kill is not valid JSON; skip it (the trainer does the same).
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// (step, loss) of every training record, as bit patterns so equality is exact.
fn train_losses(run_dir: &Path) -> Vec<(u64, u64)> {
    metrics(run_dir)
        .iter()
        .filter(|r| r["kind"] == "train")
        .map(|r| (r["step"].as_u64().unwrap(), r["loss"].as_f64().unwrap().to_bits()))
        .collect()
}

#[test]
fn help_exits_zero_and_every_subcommand_documents_its_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let top = ok(tmp.path(), &["--help"]);
    let expected: &[(&str, &[&str])] = &[
        (
            "train",
            &[
                "<CONFIG>",
                "--set",
                "--run-dir",
                "--resume",
                "--quiet",
                "--fallback",
                "--json",
            ],
        ),
        ("eval", &["<RUN>", "--split", "--json"]),
        ("translate", &["<RUN>", "--beam"]),
        ("generate", &["<RUN>", "--prompt", "--max-tokens"]),
        (
            "bleu",
            &[
                "--reference",
                "--input",
                "--metrics",
                "--tokenize",
                "--lowercase",
                "--json",
            ],
        ),
        ("ablate", &["<CONFIG>"]),
        ("bench", &["<CONFIG>", "--steps"]),
        (
            "export",
            &["<RUN>", "<OUT>", "--format", "--dtype", "--reference-logits"],
        ),
        ("package", &["<RUN>", "<OUT>", "--json"]),
        ("tokenize", &["<TOKENIZER>", "<INPUT>", "<OUTPUT>"]),
    ];
    for (sub, args) in expected {
        assert!(top.contains(sub), "`ember --help` does not list {sub}:\n{top}");
        let help = ok(tmp.path(), &[sub, "--help"]);
        assert!(help.contains(&format!("ember {sub}")), "{sub} --help:\n{help}");
        for a in *args {
            assert!(
                help.contains(a),
                "`ember {sub} --help` does not mention {a}:\n{help}"
            );
        }
    }
    // Whatever subcommands exist beyond these also answer --help.
    let listed: Vec<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(listed.len() >= expected.len(), "{top}");
    for sub in listed {
        if sub == "help" {
            ok(tmp.path(), &["help", "train"]); // clap's own: `ember help SUBCOMMAND`
        } else {
            ok(tmp.path(), &[sub, "--help"]);
        }
    }
    ok(tmp.path(), &["--version"]);
}

#[test]
fn train_writes_a_complete_run_directory_and_a_json_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(6, 4, 2));
    let run_dir = tmp.path().join("run");
    let out = ok(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--quiet", "--json"],
    );
    let summary = json(&out);
    assert_eq!(summary["steps"], 6, "{summary}");
    assert_eq!(summary["total_steps"], 6, "{summary}");
    assert_eq!(summary["finished"], true, "{summary}");
    let val = finite(&summary["val_loss"], "val_loss");
    assert!(val > 0.0);
    finite(&summary["val_ppl"], "val_ppl");
    finite(&summary["final_train_loss"], "final_train_loss");

    for f in [
        "config.yaml",
        "tokenizer.json",
        "metrics.jsonl",
        "metrics.csv",
        "summary.json",
    ] {
        assert!(run_dir.join(f).is_file(), "run directory lacks {f}");
    }
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap())
        .expect("summary.json is JSON");
    assert_eq!(saved["steps"], 6);
    assert_eq!(saved["val_loss"], summary["val_loss"]);
    let ckpts = checkpoints(&run_dir);
    assert!(!ckpts.is_empty(), "no checkpoint");
    assert_eq!(
        ckpts.last().unwrap().0,
        6,
        "the final step is checkpointed: {ckpts:?}"
    );
    for (_, dir) in &ckpts {
        for f in [
            "model.safetensors",
            "optimizer.safetensors",
            "state.json",
            "config.yaml",
        ] {
            assert!(dir.join(f).is_file(), "{} lacks {f}", dir.display());
        }
    }
    let names: Vec<String> = std::fs::read_dir(run_dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        names.iter().all(|n| n.starts_with("step-") || n == ".lock"),
        "only step-* directories remain: {names:?}"
    );
    assert_eq!(
        train_losses(&run_dir).len(),
        6,
        "log_every 1: one train record per step"
    );
    let csv = std::fs::read_to_string(run_dir.join("metrics.csv")).unwrap();
    assert!(csv.starts_with("kind,step,"), "{csv}");
    assert_eq!(
        csv.lines().filter(|l| l.starts_with("train,")).count(),
        6,
        "{csv}"
    );
    // The saved config is the resolved one and loads as a config again.
    let resolved = std::fs::read_to_string(run_dir.join("config.yaml")).unwrap();
    assert!(resolved.contains("vocab_size"), "{resolved}");
}

#[test]
fn set_overrides_the_config_and_the_default_run_dir_is_runs_slash_the_config_name() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(50, 4, 2));
    let out = ok(
        tmp.path(),
        &[
            "train",
            s(&cfg),
            "--set",
            "train.steps=3",
            "--set",
            "eval.every=0",
            "--json",
        ],
    );
    let summary = json(&out);
    assert_eq!(summary["steps"], 3, "{summary}");
    let run_dir = tmp.path().join("runs/tiny");
    assert!(
        run_dir.join("summary.json").is_file(),
        "default run dir runs/tiny"
    );
    let resolved = std::fs::read_to_string(run_dir.join("config.yaml")).unwrap();
    assert!(
        resolved.contains("steps: 3"),
        "the override is saved with the run:\n{resolved}"
    );
    assert_eq!(train_losses(&run_dir).len(), 3);
}

#[test]
fn a_bad_config_fails_with_file_line_and_key_on_stderr_and_no_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let yaml = seq2seq_yaml(4, 4, 2).replace("lr: 3.0e-3", "lr: fast");
    let line = yaml.lines().position(|l| l.contains("lr: fast")).unwrap() + 1;
    let cfg = write(tmp.path(), "bad.yaml", &yaml);
    let run_dir = tmp.path().join("run");
    let err = fails(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--quiet"],
    );
    assert!(err.contains(&format!("bad.yaml:{line}:")), "{err}");
    assert!(err.contains("train.lr"), "{err}");
    assert!(
        !run_dir.exists(),
        "nothing is created for a config that does not load"
    );

    // The same file, fixed from the command line.
    ok(
        tmp.path(),
        &[
            "train",
            s(&cfg),
            "--run-dir",
            s(&run_dir),
            "--quiet",
            "--set",
            "train.lr=1e-3",
            "--set",
            "train.steps=1",
        ],
    );

    // --set mistakes, a missing file, and an out-of-range value.
    let good = write(tmp.path(), "good.yaml", seq2seq_yaml(2, 4, 2));
    let err = fails(tmp.path(), &["train", s(&good), "--set", "train.lrr=1"]);
    assert!(err.contains("good.yaml") && err.contains("lrr"), "{err}");
    let err = fails(tmp.path(), &["train", s(&good), "--set", "train.lr"]);
    assert!(err.contains("KEY=VALUE"), "{err}");
    let err = fails(tmp.path(), &["train", s(&good), "--set", "train.lr=-1"]);
    assert!(err.contains("train.lr") && err.contains("-1"), "{err}");
    let err = fails(tmp.path(), &["train", s(&good), "--fallback"]);
    assert!(err.contains("--resume"), "--fallback requires --resume: {err}");
    let err = fails(tmp.path(), &["train", "missing.yaml"]);
    assert!(err.contains("missing.yaml"), "{err}");
    assert!(
        !tmp.path().join("runs").exists(),
        "failed runs create no run directory"
    );
}

/// A run of `steps` steps that checkpoints every `ckpt_every` steps and evaluates only at the
/// end, logging every `log_every` steps.
fn kill_yaml(steps: u64, ckpt_every: u64, log_every: u64) -> String {
    seq2seq_yaml(steps, 4, 2)
        .replace("  every: 4\n", "  every: 0\n")
        .replace("  every: 2\n", &format!("  every: {ckpt_every}\n"))
        .replace("  log_every: 1\n", &format!("  log_every: {log_every}\n"))
}

/// Starts `ember train CFG --run-dir DIR --quiet`, polls until `ready(newest complete checkpoint,
/// last logged train step)` holds, and kills it with SIGKILL. Returns the killed process's id.
fn train_and_kill(
    dir: &Path,
    cfg: &Path,
    run_dir: &Path,
    ready: impl Fn(Option<u64>, Option<u64>) -> bool,
) -> u32 {
    let mut child = ember(dir)
        .args(["train", s(cfg), "--run-dir", s(run_dir), "--quiet"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before the moment to kill it came; raise its steps");
        }
        let newest = checkpoints(run_dir).last().map(|c| c.0);
        let logged = train_losses(run_dir).last().map(|l| l.0);
        if ready(newest, logged) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the moment to kill did not come within 120 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL on Unix: no destructors, no final save
    child.wait().unwrap();
    child.id()
}

#[test]
fn a_run_killed_with_sigkill_resumes_to_the_bit_identical_result_of_an_uninterrupted_run() {
    assert_sigkill_resume_is_exact("");
}

/// The same in bf16 mixed precision (`train.precision: bf16`; emulated where the CPU has no
/// AVX512_BF16, as every test runs `ember`).
#[test]
fn a_bf16_run_killed_with_sigkill_resumes_to_the_bit_identical_result_of_an_uninterrupted_run() {
    assert_sigkill_resume_is_exact("  precision: bf16\n");
}

/// A run with `train_keys` added to its `train:` section, killed with SIGKILL mid-run and
/// resumed, against the same run uninterrupted: every file and logged loss bit-identical.
fn assert_sigkill_resume_is_exact(train_keys: &str) {
    let tmp = tempfile::tempdir().unwrap();
    const STEPS: u64 = 80;
    // Frequent checkpoints (keep_last 2, so older ones are pruned) and no intermediate evaluation.
    let yaml = kill_yaml(STEPS, 5, 1).replacen("\ntrain:\n", &format!("\ntrain:\n{train_keys}"), 1);
    let cfg = write(tmp.path(), "kill.yaml", yaml);
    let (killed, straight) = (tmp.path().join("killed"), tmp.path().join("straight"));

    // Kill mid-run: a few checkpoints are complete and training has gone past the newest.
    let pid = train_and_kill(
        tmp.path(),
        &cfg,
        &killed,
        |c, l| matches!((c, l), (Some(c), Some(l)) if c >= 15 && l > c),
    );
    let at_kill = checkpoints(&killed).last().unwrap().0;
    assert!(at_kill < STEPS, "killed at checkpoint {at_kill}, before the end");
    assert!(
        train_losses(&killed).last().unwrap().0 > at_kill,
        "steps after the checkpoint were logged and must be re-run"
    );
    // What a kill in the middle of a save or of a metrics write leaves behind (if this kill
    // happened not to): a temporary checkpoint directory and a torn last line.
    let stale = killed.join(format!("checkpoints/.tmp-step-{:08}-{pid}", at_kill + 5));
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("model.safetensors"), b"partial").unwrap();
    let mut metrics_file = std::fs::OpenOptions::new()
        .append(true)
        .open(killed.join("metrics.jsonl"))
        .unwrap();
    use std::io::Write;
    metrics_file.write_all(br#"{"kind":"train","step":"#).unwrap();
    drop(metrics_file);

    let out = ok(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&killed), "--resume", "--quiet"],
    );
    assert!(out.contains(&format!("{STEPS} steps")), "{out}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(killed.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["resumed_from_step"], at_kill, "{summary}");
    assert_eq!(summary["steps"], STEPS, "{summary}");
    assert_eq!(summary["finished"], true, "{summary}");

    ok(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&straight), "--quiet"],
    );

    let (a, b) = (train_losses(&straight), train_losses(&killed));
    let steps: Vec<u64> = b.iter().map(|r| r.0).collect();
    assert_eq!(
        steps,
        (1..=STEPS).collect::<Vec<_>>(),
        "every step logged exactly once, in order"
    );
    assert_eq!(a, b, "per-step training losses must be bit-identical");
    let newest = |d: &Path| checkpoints(d).last().unwrap().clone();
    let (na, nb) = (newest(&straight), newest(&killed));
    assert_eq!((na.0, nb.0), (STEPS, STEPS));
    let wa = std::fs::read(na.1.join("model.safetensors")).unwrap();
    let wb = std::fs::read(nb.1.join("model.safetensors")).unwrap();
    assert!(wa == wb, "final weights must be bit-identical");
    let oa = std::fs::read(na.1.join("optimizer.safetensors")).unwrap();
    let ob = std::fs::read(nb.1.join("optimizer.safetensors")).unwrap();
    assert!(oa == ob, "final optimizer state must be bit-identical");
    let eval = |d: &Path| -> Vec<Value> { metrics(d).into_iter().filter(|r| r["kind"] == "eval").collect() };
    let (ea, eb) = (eval(&straight), eval(&killed));
    assert_eq!(eb.len(), 1, "one evaluation, at the end: {eb:?}");
    assert_eq!(ea[0]["loss"], eb[0]["loss"], "final validation loss");

    let leftovers: Vec<String> = std::fs::read_dir(killed.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        // The readers' lock (`ember average`) is the folder's own file, not a leftover.
        .filter(|n| !n.starts_with("step-") && n != ".lock")
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary directories left behind: {leftovers:?}"
    );
    assert!(
        checkpoints(&killed).len() <= 2 + 1,
        "keep_last 2 (plus the best) still holds after resuming: {:?}",
        checkpoints(&killed)
    );
}

#[test]
fn starting_over_after_a_kill_before_the_first_checkpoint_logs_each_step_once() {
    let tmp = tempfile::tempdir().unwrap();
    const STEPS: u64 = 40;
    // Only the final checkpoint: a kill mid-run leaves none, so starting over is allowed.
    let cfg = write(tmp.path(), "early.yaml", kill_yaml(STEPS, 0, 1));
    let run_dir = tmp.path().join("run");
    train_and_kill(tmp.path(), &cfg, &run_dir, |c, l| {
        c.is_none() && l.is_some_and(|l| l >= 3)
    });
    assert!(checkpoints(&run_dir).is_empty());
    let err = fails(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--resume"],
    );
    assert!(err.contains("no complete checkpoint"), "{err}");

    ok(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--quiet"],
    );
    let steps: Vec<u64> = train_losses(&run_dir).iter().map(|r| r.0).collect();
    assert_eq!(steps, (1..=STEPS).collect::<Vec<_>>(), "each step logged once");
}

#[test]
fn a_resumed_run_logs_the_same_losses_when_log_every_does_not_divide_the_checkpoint_step() {
    let tmp = tempfile::tempdir().unwrap();
    const STEPS: u64 = 60;
    let cfg = write(tmp.path(), "window.yaml", kill_yaml(STEPS, 5, 7));
    let (killed, straight) = (tmp.path().join("killed"), tmp.path().join("straight"));
    train_and_kill(
        tmp.path(),
        &cfg,
        &killed,
        |c, l| matches!((c, l), (Some(c), Some(l)) if c % 7 != 0 && l > c),
    );
    let at_kill = checkpoints(&killed).last().unwrap().0;
    ok(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&killed), "--resume", "--quiet"],
    );
    ok(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&straight), "--quiet"],
    );
    let (a, b) = (train_losses(&straight), train_losses(&killed));
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    assert_eq!(
        a, b,
        "resumed from step {at_kill}; logged losses (as bits) differ"
    );
}

#[test]
fn eval_reports_loss_and_perplexity_on_valid_and_test_splits() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(4, 4, 2));
    let run_dir = tmp.path().join("run");
    let summary = json(&ok(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--json"],
    ));

    let valid = json(&ok(tmp.path(), &["eval", s(&run_dir), "--json"]));
    let loss = finite(&valid["loss"], "loss");
    let ppl = finite(&valid["ppl"], "ppl");
    assert!((ppl - loss.exp()).abs() <= 1e-9 * ppl, "ppl = exp(loss): {valid}");
    assert_eq!(valid["split"], "valid");
    assert!(valid["tokens"].as_u64().unwrap() > 0, "{valid}");
    // The newest checkpoint is the final one, whose validation loss the summary reports.
    let val = summary["val_loss"].as_f64().unwrap();
    assert!(
        (loss - val).abs() <= 1e-9 * val,
        "eval {loss} vs training's final val loss {val}"
    );

    let test = ok(tmp.path(), &["eval", s(&run_dir), "--split", "test"]);
    assert!(
        test.contains("test") && test.contains("loss") && test.contains("ppl"),
        "{test}"
    );
    let test_json = json(&ok(
        tmp.path(),
        &["eval", s(&run_dir), "--split", "test", "--json"],
    ));
    finite(&test_json["loss"], "test loss");
    assert_eq!(test_json["split"], "test");

    // A checkpoint directory inside the run works too.
    let newest = checkpoints(&run_dir).last().unwrap().1.clone();
    let at = json(&ok(tmp.path(), &["eval", s(&newest), "--json", "--no-bleu"]));
    assert_eq!(at["loss"], valid["loss"], "{at}");
    assert_eq!(at["checkpoint"].as_str().map(PathBuf::from), Some(newest));

    let err = fails(tmp.path(), &["eval", s(&run_dir), "--split", "train"]);
    assert!(err.contains("valid") && err.contains("test"), "{err}");
    let err = fails(tmp.path(), &["eval", s(&tmp.path().join("nothing-here"))]);
    assert!(err.contains("nothing-here"), "{err}");
}

#[test]
fn eval_ranks_one_decode_under_each_length_penalty_and_reports_the_highest_bleu() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(4, 4, 2));
    let run_dir = tmp.path().join("run");
    ok(tmp.path(), &["train", s(&cfg), "--run-dir", s(&run_dir)]);
    let hyps = tmp.path().join("best.hyp");
    let all = json(&ok(
        tmp.path(),
        &[
            "eval",
            s(&run_dir),
            "--length-penalty",
            "0,gnmt:1.0,fairseq:1",
            "--output",
            s(&hyps),
            "--json",
        ],
    ));
    let scores = all["length_penalties"].as_array().expect("one score per penalty");
    let names: Vec<&str> = scores
        .iter()
        .map(|x| x["length_penalty"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gnmt:0", "gnmt:1", "fairseq:1"], "{all}");
    // The headline is the first of the highest BLEU, and --output holds its hypotheses.
    let bleu = |x: &Value| x["bleu"]["score"].as_f64().unwrap();
    let best = scores
        .iter()
        .fold(&scores[0], |b, x| if bleu(x) > bleu(b) { x } else { b });
    assert_eq!(all["length_penalty"], best["length_penalty"], "{all}");
    assert_eq!(all["bleu"], best["bleu"], "{all}");
    let written = std::fs::read_to_string(&hyps).unwrap();
    assert_eq!(
        written.lines().count() as u64,
        best["sentences"].as_u64().unwrap()
    );
    // Each penalty alone ranks the same finished hypotheses: the same scores as in the grid.
    for x in scores {
        let one = json(&ok(
            tmp.path(),
            &[
                "eval",
                s(&run_dir),
                "--length-penalty",
                x["length_penalty"].as_str().unwrap(),
                "--json",
            ],
        ));
        assert_eq!(one["bleu"], x["bleu"], "{}", x["length_penalty"]);
        assert!(one.get("length_penalties").is_none(), "{one}");
    }
    // Several penalties on test is allowed, with a warning that test is no longer held out.
    let out = common::ok_output(
        tmp.path(),
        &["eval", s(&run_dir), "--split", "test", "--length-penalty", "0,1"],
    );
    assert!(
        text(&out.stderr).contains("length penalties on the test split"),
        "{}",
        text(&out.stderr)
    );
    let err = fails(tmp.path(), &["eval", s(&run_dir), "--length-penalty", "gnmt:x"]);
    assert!(err.contains("length") && err.contains("gnmt:x"), "{err}");
}

#[test]
fn bleu_prints_the_sacrebleu_line_or_json_and_refuses_mismatched_line_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let r = write(
        tmp.path(),
        "ref.txt",
        "The cat sat on the mat.\nA quick brown fox jumps over the lazy dog.\nHello world!\n",
    );
    let h = write(
        tmp.path(),
        "hyp.txt",
        "The cat sat on a mat.\nA fast brown fox jumps over the lazy dog.\nHello world!\n",
    );
    let out = ok(tmp.path(), &["bleu", "-r", s(&r), "-i", s(&h)]);
    let line = out.lines().next().unwrap_or_default();
    assert!(
        line.starts_with("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:"),
        "{out}"
    );
    assert!(line.contains(" = ") && line.contains("BP = "), "{line}");

    let j = json(&ok(tmp.path(), &["bleu", "-r", s(&r), "-i", s(&h), "--json"]));
    let score = finite(&j["bleu"]["score"], "bleu.score");
    assert!(score > 0.0 && score < 100.0, "{j}");

    // Identical text scores 100, read from standard input.
    let mut child = ember(tmp.path())
        .args(["bleu", "-r", s(&r)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&std::fs::read(&r).unwrap())
        .unwrap();
    let piped = child.wait_with_output().unwrap();
    assert!(piped.status.success());
    assert!(
        text(&piped.stdout).contains(" = 100.00 "),
        "{}",
        text(&piped.stdout)
    );

    let short = write(tmp.path(), "short.txt", "The cat sat on a mat.\nHello world!\n");
    let err = fails(tmp.path(), &["bleu", "-r", s(&r), "-i", s(&short)]);
    assert!(
        err.contains('2') && err.contains('3'),
        "names both line counts: {err}"
    );
    assert!(
        err.contains("ref.txt") && err.contains("short.txt"),
        "names both files: {err}"
    );
}

/// An LM config on a Hugging Face dataset's parquet files in a local folder.
fn hf_lm_yaml(dataset: &Path, qk_norm: &str) -> String {
    format!(
        r#"
model: {{ arch: lm, d_model: 32, n_layers: 1, n_heads: 4, n_kv_heads: 2, d_ff: 48, max_seq_len: 32, qk_norm: {qk_norm} }}
data:
  corpus:
    kind: hf_dataset
    path: "{}"
    splits: {{ train: train, valid: validation }}
    columns: {{ text: text }}
  tokenizer: {{ kind: char }}
train: {{ steps: 4, seed: 2, lr: 3.0e-3, batch_size: 4, block_size: 16, log_every: 1, threads: 1 }}
eval: {{ every: 4 }}
checkpoint: {{ every: 4 }}
"#,
        dataset.display()
    )
}

#[test]
fn a_parquet_dataset_trains_exports_to_hugging_face_and_tokenizes_to_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The Hub's parquet-conversion layout: default/{split}/0000.parquet with a text column.
    let rows: Vec<String> = (0..300)
        .map(|i| format!("row {i}: the quick brown fox."))
        .collect();
    let dataset = dir.join("dataset");
    for (split, part) in [("train", &rows[..270]), ("validation", &rows[270..])] {
        std::fs::create_dir_all(dataset.join("default").join(split)).unwrap();
        let col: Vec<Option<&str>> = part.iter().map(|r| Some(r.as_str())).collect();
        ember_data::parquet::write_text_columns(
            &dataset.join(format!("default/{split}/0000.parquet")),
            &[("text", col)],
            64,
        )
        .unwrap();
    }
    let cfg = write(dir, "hf.yaml", hf_lm_yaml(&dataset, "rmsnorm"));
    let run_dir = dir.join("runs/hf");
    let summary = json(&ok(
        dir,
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--quiet", "--json"],
    ));
    assert_eq!(summary["steps"], 4, "{summary}");
    assert_eq!(
        metrics(&run_dir).iter().filter(|r| r["kind"] == "train").count(),
        4
    );

    let out = dir.join("hf-out");
    let exported = json(&ok(dir, &["export", s(&run_dir), s(&out), "--json"]));
    assert_eq!(exported["arch"], "Qwen3", "{exported}");
    assert_eq!(exported["dtype"], "f32", "{exported}");
    let half = dir.join("hf-bf16");
    let said = ok(dir, &["export", s(&run_dir), s(&half), "--dtype", "bf16"]);
    assert!(said.contains("bfloat16"), "{said}");
    let weights = |d: &Path| std::fs::metadata(d.join("model.safetensors")).unwrap().len();
    assert!(
        2 * weights(&half) < weights(&out) + 4096,
        "bf16 weights are half the size"
    );
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
    #[cfg(unix)]
    {
        // Written through a 0600 temporary file, the weights still get the mode of the rest.
        use std::os::unix::fs::PermissionsExt;
        let mode = |f: &str| std::fs::metadata(out.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode("model.safetensors"), mode("config.json"));
    }

    // A run that does not map is refused, naming the setting.
    let gelu = write(
        dir,
        "gelu.yaml",
        hf_lm_yaml(&dataset, "none").replace("qk_norm: none", "qk_norm: none, mlp: gelu"),
    );
    ok(
        dir,
        &[
            "train",
            s(&gelu),
            "--run-dir",
            s(&dir.join("runs/gelu")),
            "--quiet",
        ],
    );
    let err = fails(
        dir,
        &["export", s(&dir.join("runs/gelu")), s(&dir.join("gelu-out"))],
    );
    assert!(err.contains("model.mlp: gelu"), "{err}");

    // The same rows as text, tokenised to a shard with the run's tokenizer, train an LM too.
    let train_txt = dir.join("train.txt");
    std::fs::write(&train_txt, rows[..270].join("\n")).unwrap();
    let valid_txt = dir.join("valid.txt");
    std::fs::write(&valid_txt, rows[270..].join("\n")).unwrap();
    let said = ok(
        dir,
        &["tokenize", s(&run_dir), s(&train_txt), s(&dir.join("train.bin"))],
    );
    assert!(
        said.starts_with(&format!(
            "wrote {} tokens",
            rows[..270].join("\n").chars().count()
        )),
        "{said}"
    );
    ok(
        dir,
        &[
            "tokenize",
            s(&run_dir.join("tokenizer.json")),
            s(&valid_txt),
            s(&dir.join("valid.bin")),
        ],
    );
    let shards = hf_lm_yaml(&dataset, "none").replace(
        &format!(
            "kind: hf_dataset\n    path: \"{}\"\n    splits: {{ train: train, valid: validation }}\n    columns: {{ text: text }}",
            dataset.display()
        ),
        &format!(
            "kind: token_shards\n    train_files: [\"{}\"]\n    val_files: [\"{}\"]\n    tokenizer: \"{}\"",
            dir.join("train.bin").display(),
            dir.join("valid.bin").display(),
            run_dir.display()
        ),
    );
    assert!(shards.contains("token_shards"));
    let cfg = write(dir, "shards.yaml", &shards);
    let summary = json(&ok(
        dir,
        &[
            "train",
            s(&cfg),
            "--run-dir",
            s(&dir.join("runs/shards")),
            "--quiet",
            "--json",
        ],
    ));
    assert_eq!(summary["steps"], 4, "{summary}");
}

/// A character LM trained at block 16 on a text file.
fn text_lm_yaml(corpus: &Path) -> String {
    format!(
        r#"
model: {{ arch: lm, d_model: 32, n_layers: 2, n_heads: 4, d_ff: 64, max_seq_len: 16 }}
data:
  corpus: {{ kind: text, path: "{}", val_fraction: 0.2 }}
  tokenizer: {{ kind: char }}
train: {{ steps: 6, seed: 3, lr: 3.0e-3, batch_size: 4, block_size: 16, threads: 1 }}
eval: {{ every: 6 }}
checkpoint: {{ every: 6 }}
"#,
        corpus.display()
    )
}

#[test]
fn eval_context_reports_loss_and_attention_entropy_by_position_past_the_training_length() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let lines: String = (0..400)
        .map(|i| format!("line {i}: to be or not to be.\n"))
        .collect();
    let corpus = write(dir, "corpus.txt", lines);
    let cfg = write(dir, "lm.yaml", text_lm_yaml(&corpus));
    let run_dir = dir.join("runs/lm");
    ok(dir, &["train", s(&cfg), "--run-dir", s(&run_dir), "--quiet"]);

    let eval = |args: &[&str]| {
        let mut all = vec!["eval", s(&run_dir), "--json"];
        all.extend_from_slice(args);
        json(&ok(dir, &all))
    };
    let long = eval(&["--context", "64"]);
    assert_eq!(long["train_length"], 16, "{long}");
    assert_eq!(long["beyond_training"], true);
    assert_eq!(long["logn_attention"], false);
    let windows = long["windows"].as_u64().unwrap();
    assert!(windows > 0);
    assert_eq!(long["tokens"].as_u64().unwrap(), windows * 64);
    let edges: Vec<(u64, u64)> = long["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["first"].as_u64().unwrap(), b["last"].as_u64().unwrap()))
        .collect();
    assert_eq!(edges, vec![(1, 16), (17, 32), (33, 64)]);
    for key in ["loss_by_position", "entropy_by_position"] {
        let v = long[key].as_array().unwrap();
        assert_eq!(v.len(), 64, "{key}");
        assert!(v.iter().all(|x| x.as_f64().unwrap().is_finite()), "{key}");
    }
    // The first query sees one key: its attention has zero entropy.
    assert!(long["entropy_by_position"][0].as_f64().unwrap().abs() < 1e-6);

    // Log-n scaling with m = the block size: the same numbers within the training length, lower
    // attention entropy past it.
    let scaled = eval(&["--context", "64", "--logn", "on"]);
    assert_eq!(scaled["logn_length"], 16, "{scaled}");
    let bucket = |r: &Value, i: usize, key: &str| r["buckets"][i][key].as_f64().unwrap();
    assert_eq!(bucket(&scaled, 0, "loss"), bucket(&long, 0, "loss"));
    assert!(
        bucket(&scaled, 2, "entropy") < bucket(&long, 2, "entropy"),
        "{scaled}"
    );
    let within = eval(&["--context", "16"]);
    assert_eq!(within["beyond_training"], false);
    assert_eq!(within["loss"], eval(&["--context", "16", "--logn", "on"])["loss"]);

    // Text output states that the context is past the training length.
    let text_out = ok(dir, &["eval", s(&run_dir), "--context", "64"]);
    assert!(text_out.contains("4.0x the training length 16"), "{text_out}");
    assert!(text_out.contains("positions    33..64"), "{text_out}");

    // What cannot be evaluated is an error naming why.
    let err = fails(dir, &["eval", s(&run_dir), "--context", "100000"]);
    assert!(err.contains("--context"), "{err}");
    let err = fails(dir, &["eval", s(&run_dir), "--context", "60000"]);
    assert!(err.contains("fewer than one window"), "{err}");
    let err = fails(dir, &["eval", s(&run_dir), "--logn", "on"]);
    assert!(err.contains("--context"), "{err}");
    let err = fails(dir, &["eval", s(&run_dir), "--context", "32", "--split", "test"]);
    assert!(err.contains("validation split"), "{err}");
    // Learned positions end at max_seq_len: evaluation past it is refused, naming why, and so
    // is export to an architecture with rotary positions.
    let learned = write(
        dir,
        "learned.yaml",
        text_lm_yaml(&corpus).replace("max_seq_len: 16", "max_seq_len: 16, positions: learned"),
    );
    let learned_dir = dir.join("runs/learned");
    ok(
        dir,
        &["train", s(&learned), "--run-dir", s(&learned_dir), "--quiet"],
    );
    let within = json(&ok(dir, &["eval", s(&learned_dir), "--context", "16", "--json"]));
    assert!(within["loss"].as_f64().unwrap().is_finite());
    let err = fails(dir, &["eval", s(&learned_dir), "--context", "32"]);
    assert!(err.contains("learned position table"), "{err}");
    let err = fails(dir, &["export", s(&learned_dir), s(&dir.join("learned-hf"))]);
    assert!(err.contains("model.positions: learned"), "{err}");
    let seq2seq = write(dir, "s2s.yaml", seq2seq_yaml(2, 2, 2));
    let s2s_dir = dir.join("runs/s2s");
    ok(dir, &["train", s(&seq2seq), "--run-dir", s(&s2s_dir), "--quiet"]);
    let err = fails(dir, &["eval", s(&s2s_dir), "--context", "8"]);
    assert!(err.contains("translation run"), "{err}");
}

#[test]
fn bleu_by_source_length_scores_each_bucket_of_line_aligned_segments() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let src = write(
        dir,
        "src.txt",
        "a b\nc d e f g h\na b c\none two three four five six seven\n",
    );
    let reference = write(
        dir,
        "ref.txt",
        "the cat sat down\nthe dog ran far away today\nhello there you all\nit was a long day at work\n",
    );
    // Short sources translated perfectly, long ones not at all.
    let hyp = write(
        dir,
        "hyp.txt",
        "the cat sat down\nzz yy xx ww vv uu\nhello there you all\nqq rr ss tt uu vv\n",
    );
    let out = json(&ok(
        dir,
        &[
            "bleu",
            "-r",
            s(&reference),
            "-i",
            s(&hyp),
            "--source",
            s(&src),
            "--length-buckets",
            "3",
            "--json",
        ],
    ));
    let buckets = out["bleu_by_source_length"].as_array().unwrap();
    assert_eq!(buckets.len(), 2, "{out}");
    assert_eq!(
        (buckets[0]["first"].as_u64(), buckets[0]["last"].as_u64()),
        (Some(0), Some(3))
    );
    assert_eq!(buckets[0]["sentences"], 2);
    assert!(
        (buckets[0]["score"]["score"].as_f64().unwrap() - 100.0).abs() < 1e-9,
        "{out}"
    );
    assert!(buckets[1]["last"].is_null());
    assert_eq!(buckets[1]["score"]["score"].as_f64().unwrap(), 0.0, "{out}");
    let text_out = ok(
        dir,
        &[
            "bleu",
            "-r",
            s(&reference),
            "-i",
            s(&hyp),
            "--source",
            s(&src),
            "--length-buckets",
            "3",
        ],
    );
    assert!(text_out.contains("source words 4+: 2 sentences"), "{text_out}");

    let short = write(dir, "short.txt", "a b\n");
    let err = fails(
        dir,
        &["bleu", "-r", s(&reference), "-i", s(&hyp), "--source", s(&short)],
    );
    assert!(err.contains("line-aligned"), "{err}");
    let err = fails(
        dir,
        &[
            "bleu",
            "-r",
            s(&reference),
            "-i",
            s(&hyp),
            "--source",
            s(&src),
            "--length-buckets",
            "5,3",
        ],
    );
    assert!(err.contains("ascending"), "{err}");
}

/// On a CPU without AVX512_BF16 (here one acting as an AVX2 machine) `train.precision: bf16` is
/// refused before any work, naming the key, the missing feature and the emulation one can ask
/// for: no run directory is created, and `ember bench` refuses alike.
#[test]
fn bf16_on_a_cpu_without_avx512_bf16_is_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cfg = write(dir, "tiny.yaml", seq2seq_yaml(4, 4, 2));
    let run_dir = dir.join("run");
    for args in [
        vec![
            "train",
            s(&cfg),
            "--run-dir",
            s(&run_dir),
            "--set",
            "train.precision=bf16",
        ],
        vec!["bench", s(&cfg), "--steps", "2", "--set", "train.precision=bf16"],
    ] {
        let out = ember(dir)
            .env(ember_kernels::VECTOR_UNIT_ENV, "avx2")
            .env_remove(ember_kernels::BF16_ENV)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = assert_clear_failure(&out, "bf16 on an AVX2 machine");
        assert!(
            err.contains("train.precision: bf16")
                && err.contains("AVX512_BF16")
                && err.contains("f32")
                && err.contains("EMBER_CPU_BF16=emulate"),
            "{err}"
        );
        assert!(!run_dir.exists(), "a refused run created {}", run_dir.display());
    }
    // A value that is no precision at all names the key and the choices.
    let err = fails(
        dir,
        &[
            "train",
            s(&cfg),
            "--run-dir",
            s(&run_dir),
            "--set",
            "train.precision=fp16",
        ],
    );
    assert!(err.contains("train.precision") && err.contains("bf16"), "{err}");
}

/// Asked for (`EMBER_CPU_BF16=emulate`), the same machine trains in bf16 with the products
/// emulated, and says so at the start with how many times slower than f32 it measured a product;
/// its config and report name bf16 and the emulation.
#[test]
fn bf16_emulated_where_asked_trains_and_says_how_much_slower() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cfg = write(dir, "tiny.yaml", seq2seq_yaml(4, 4, 2));
    let run_dir = dir.join("run");
    let out = ember(dir)
        .env(ember_kernels::VECTOR_UNIT_ENV, "avx2")
        .env(ember_kernels::BF16_ENV, "emulate")
        .args([
            "train",
            s(&cfg),
            "--run-dir",
            s(&run_dir),
            "--set",
            "train.precision=bf16",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let told = format!("{stdout}{stderr}");
    assert!(
        told.contains("bf16 runs emulated") && told.contains("× as long as in f32"),
        "{told}"
    );
    assert!(told.contains("bf16 products emulated in software"), "{told}");
    let saved = std::fs::read_to_string(run_dir.join("config.yaml")).unwrap();
    assert!(saved.contains("precision: bf16"), "{saved}");
}

/// The thread count is a speed setting in every pool a process has — Ember's kernels and
/// candle's elementwise ops alike, which are sized once per process (so this runs `ember` as
/// separate processes; crates/trainer/tests/threads.rs covers resume across counts in one).
#[test]
fn separate_processes_at_one_and_three_threads_train_the_same_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cfg = write(dir, "tiny.yaml", seq2seq_yaml(6, 6, 6));
    let weights =
        |threads: &str| final_weights(&train_d128(dir, &cfg, &format!("t{threads}"), threads, None));
    let one = weights("1");
    assert!(one == weights("3"), "weights differ between 1 and 3 threads");
}

/// Trains `cfg` at d_model 128 and 1,024 tokens a step — large enough that candle splits its
/// elementwise ops (64 Ki elements and up) — into runs/NAME with `threads` threads, logging
/// every step, with `EMBER_CPU_VECTOR_UNIT=unit` when given; returns the run directory.
fn train_d128(dir: &Path, cfg: &Path, name: &str, threads: &str, unit: Option<&str>) -> PathBuf {
    let run_dir = dir.join("runs").join(name);
    let mut cmd = ember(dir);
    cmd.args([
        "train",
        s(cfg),
        "--run-dir",
        s(&run_dir),
        "--quiet",
        "--set",
        &format!("train.threads={threads}"),
        "--set",
        "train.log_every=1",
        "--set",
        "model.d_model=128",
        "--set",
        "train.max_tokens=1024",
    ]);
    if let Some(u) = unit {
        cmd.env(ember_kernels::VECTOR_UNIT_ENV, u);
    }
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    run_dir
}

/// The weights of a run's newest checkpoint, as bytes.
fn final_weights(run_dir: &Path) -> Vec<u8> {
    let (_, last) = checkpoints(run_dir).pop().expect("a checkpoint");
    std::fs::read(last.join("model.safetensors")).unwrap()
}

/// The one thing that changes a run's bits between machines is the CPU's vector unit: with
/// AVX-512 the matrix products run Ember's own kernel, without it matrixmultiply, which sums in
/// another order. `EMBER_CPU_VECTOR_UNIT=avx2` makes an AVX-512 machine compute what an AVX2 one
/// does; the two agree to the last few digits and each is bit-identical at any thread count.
#[test]
fn the_vector_unit_moves_only_the_last_digits_and_avx2_can_be_chosen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cfg = write(dir, "tiny.yaml", seq2seq_yaml(6, 6, 6));
    let train = |name: &str, unit: Option<&str>, threads: &str| {
        let run_dir = train_d128(dir, &cfg, name, threads, unit);
        let losses: Vec<f64> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["kind"] == "train")
            .map(|r| r["loss"].as_f64().unwrap())
            .collect();
        (losses, final_weights(&run_dir))
    };
    let (native_losses, native) = train("native", None, "1");
    let (avx2_losses, avx2) = train("avx2", Some("avx2"), "1");
    let (_, avx2_three_threads) = train("avx2-3", Some("avx2"), "3");
    assert!(
        avx2 == avx2_three_threads,
        "AVX2 weights differ between 1 and 3 threads"
    );
    assert_eq!(native_losses.len(), 6);
    if ember_kernels::vector_unit() == "AVX-512" {
        assert!(native != avx2, "AVX2 requested, but the AVX-512 kernels ran");
        for (a, b) in native_losses.iter().zip(&avx2_losses) {
            assert!((a - b).abs() <= 1e-4 * a.abs(), "losses {a} vs {b}");
        }
    } else {
        // This CPU has no AVX-512: avx2 is what it runs anyway.
        assert!(native == avx2 && native_losses == avx2_losses);
    }
}
