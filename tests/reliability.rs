//! What the `ember` binary does when used carelessly or adversarially: two writers in one run
//! directory, stop signals, resuming with a changed tokenizer, data or config, resuming a
//! finished run, runs that mostly skip, absurd sizes, data that does not fit the model, odd
//! `translate` input and unclear messages. Every case ends in a clear error or a correct
//! result; none panics, aborts, or loses what was saved.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::*;

/// A tiny character-level language model on `text.txt` in `dir`.
fn lm_yaml(dir: &Path, steps: u64) -> String {
    let text =
        "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n".repeat(40);
    std::fs::write(dir.join("text.txt"), text).unwrap();
    format!(
        r#"
model: {{ arch: lm, d_model: 32, n_layers: 1, n_heads: 4, d_ff: 64, max_seq_len: 32 }}
data:
  corpus: {{ kind: text, path: {}, val_fraction: 0.1 }}
  tokenizer: {{ kind: char }}
train: {{ steps: {steps}, lr: 3.0e-3, batch_size: 4, block_size: 16, threads: 1, log_every: 1 }}
eval: {{ every: 0 }}
"#,
        dir.join("text.txt").display()
    )
}

fn summary(run_dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap()).unwrap()
}

fn final_weights(run_dir: &Path) -> Vec<u8> {
    let (_, dir) = checkpoints(run_dir).pop().expect("a checkpoint");
    std::fs::read(dir.join("model.safetensors")).unwrap()
}

/// Starts `ember ARGS` in the background, quiet.
fn spawn(dir: &Path, args: &[&str]) -> Child {
    ember(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (up to 120 s) until `ready()` holds, while `child` is still running.
fn wait_until(child: &mut Child, what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the process ended ({status}) before {what}");
        }
        assert!(Instant::now() < deadline, "{what} did not happen within 120 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

#[test]
fn a_second_writer_is_refused_at_once_naming_the_holder_and_a_stale_lock_does_not_block() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(100_000, 0, 5));
    let run_dir = tmp.path().join("run");
    let mut first = spawn(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--quiet"],
    );
    // Before its first checkpoint, a second `--resume` names the writer too (not the missing
    // checkpoint it is about to write).
    wait_until(&mut first, "the run's config.yaml", || {
        run_dir.join("config.yaml").exists()
    });
    let err = fails(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--resume"],
    );
    assert!(err.contains("is in use"), "{err}");
    wait_until(&mut first, "the first checkpoint", || {
        !checkpoints(&run_dir).is_empty()
    });

    let before = std::fs::read(run_dir.join("config.yaml")).unwrap();
    for extra in [&["--resume"][..], &[]] {
        let t0 = Instant::now();
        let mut args = vec!["train", s(&cfg), "--run-dir", s(&run_dir)];
        args.extend_from_slice(extra);
        let err = fails(tmp.path(), &args);
        assert!(err.contains("is in use"), "{err}");
        assert!(
            err.contains(&format!("pid {}", first.id())),
            "names the holder: {err}"
        );
        assert!(t0.elapsed() < Duration::from_secs(20), "refused at once");
    }
    assert_eq!(std::fs::read(run_dir.join("config.yaml")).unwrap(), before);

    // kill -9 leaves the lock file behind, but not the lock: resuming works.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(run_dir.join(".lock").exists());
    // A few steps past the newest checkpoint, wherever the killed run got to (on a loaded
    // machine it may have saved more than one before the kill).
    let newest = checkpoints(&run_dir).last().unwrap().0;
    let steps = format!("train.steps={}", newest + 7);
    ok_output(
        tmp.path(),
        &[
            "train",
            s(&cfg),
            "--run-dir",
            s(&run_dir),
            "--resume",
            "--quiet",
            "--set",
            &steps,
        ],
    );
    // Strictly increasing: a stretch logged twice (…, 7, 8, 6, 7, 8, …) fails it.
    let steps = logged_steps(&run_dir);
    assert!(
        steps.windows(2).all(|w| w[0] < w[1]),
        "every step logged once: {steps:?}"
    );
}

#[test]
fn sigint_stops_at_a_step_boundary_and_the_resumed_run_is_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    const STEPS: u64 = 60;
    let cfg = write(
        tmp.path(),
        "tiny.yaml",
        seq2seq_yaml(STEPS, 0, 5).replace("every: 5", "every: 50"),
    );
    let (stopped, straight) = (tmp.path().join("stopped"), tmp.path().join("straight"));
    let mut child = spawn(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&stopped), "--quiet"],
    );
    wait_until(&mut child, "step 3", || logged_steps(&stopped).len() >= 3);
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "SIGINT exits 130:\n{stderr}");
    let step = summary(&stopped)["steps"].as_u64().unwrap();
    assert!((3..STEPS).contains(&step), "{stderr}");
    assert!(
        stderr.contains(&format!("interrupted by SIGINT at step {step}")),
        "{stderr}"
    );
    let resume = format!(
        "resume with: ember train {} --run-dir {} --resume",
        s(&cfg),
        s(&stopped)
    );
    assert!(stderr.contains(&resume), "{stderr}");
    assert_eq!(
        checkpoints(&stopped).last().unwrap().0,
        step,
        "the stopped step is saved"
    );
    let sum = summary(&stopped);
    assert_eq!(sum["interrupted"], "SIGINT", "{sum}");
    assert_eq!(sum["finished"], false, "{sum}");

    ok_output(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&stopped), "--resume", "--quiet"],
    );
    ok_output(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&straight), "--quiet"],
    );
    assert_eq!(logged_steps(&stopped), (1..=STEPS).collect::<Vec<_>>());
    assert!(
        final_weights(&stopped) == final_weights(&straight),
        "final weights are bit-identical"
    );

    // SIGTERM (and SIGHUP) stop the same way, with the shell's status for them.
    let other = tmp.path().join("term");
    let mut child = spawn(tmp.path(), &["train", s(&cfg), "--run-dir", s(&other), "--quiet"]);
    wait_until(&mut child, "step 2", || logged_steps(&other).len() >= 2);
    signal(&child, libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    assert_eq!(
        checkpoints(&other).last().map(|c| c.0),
        summary(&other)["steps"].as_u64()
    );
}

#[test]
fn sigint_to_ablate_stops_its_children_with_checkpoints_and_a_rerun_resumes_them() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(400, 0, 5));
    let out_dir = tmp.path().join("sweep");
    let args = [
        "ablate",
        s(&cfg),
        "--variants",
        "none",
        "--seeds",
        "1",
        "--jobs",
        "1",
        "--out",
        s(&out_dir),
        "--quiet",
    ];
    let mut sweep = spawn(tmp.path(), &args);
    let run_dir = out_dir.join("runs/none-lr3e-3-seed1");
    wait_until(&mut sweep, "the child's step 3", || {
        logged_steps(&run_dir).len() >= 3
    });
    signal(&sweep, libc::SIGINT);
    let out = sweep.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("run the same command again"), "{stderr}");
    // The child stopped too (it released its run directory) and saved its step.
    let sum = summary(&run_dir);
    assert_eq!(sum["interrupted"], "SIGINT", "{sum}");
    assert_eq!(
        checkpoints(&run_dir).last().unwrap().0,
        sum["steps"].as_u64().unwrap()
    );
    let status: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("status.json")).unwrap()).unwrap();
    assert_eq!(
        status["runs"]["none-lr3e-3-seed1"]["status"], "interrupted",
        "{status}"
    );

    let rerun = ok_output(tmp.path(), &args[..args.len() - 1]);
    assert!(text(&rerun.stdout).contains("resume"), "{}", text(&rerun.stdout));
    assert_eq!(summary(&run_dir)["finished"], true);
}

#[test]
fn resume_refuses_a_missing_or_other_tokenizer_and_other_data_and_records_config_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(5, 0, 5));
    let run_dir = tmp.path().join("run");
    ok_output(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--quiet"],
    );
    let extend = [
        "train",
        s(&cfg),
        "--run-dir",
        s(&run_dir),
        "--resume",
        "--quiet",
        "--set",
        "train.steps=10",
    ];
    let tokenizer = run_dir.join("tokenizer.json");
    let original = std::fs::read(&tokenizer).unwrap();

    // Missing: never silently retrained.
    std::fs::remove_file(&tokenizer).unwrap();
    let err = fails(tmp.path(), &extend);
    assert!(
        err.contains("tokenizer.json is missing") && err.contains("--allow-tokenizer-change"),
        "{err}"
    );
    assert!(!tokenizer.exists(), "no tokenizer was trained");
    // Corrupt: the advice is to restore it, not to delete it.
    std::fs::write(&tokenizer, b"{ not json").unwrap();
    let err = fails(tmp.path(), &extend);
    assert!(err.contains("restore the run's original"), "{err}");
    // Another valid tokenizer (one trained on other data).
    let other_cfg = write(
        tmp.path(),
        "other.yaml",
        seq2seq_yaml(1, 0, 5).replace("seed: 7", "seed: 8"),
    );
    let other = tmp.path().join("other");
    ok_output(
        tmp.path(),
        &["train", s(&other_cfg), "--run-dir", s(&other), "--quiet"],
    );
    std::fs::copy(other.join("tokenizer.json"), &tokenizer).unwrap();
    let err = fails(tmp.path(), &extend);
    assert!(
        err.contains("is not the tokenizer") && err.contains("--allow-tokenizer-change"),
        "{err}"
    );
    std::fs::write(&tokenizer, &original).unwrap();

    // Other data (the embedded task with another seed).
    let mut changed = extend.to_vec();
    changed.extend(["--set", "data.corpus.seed=8"]);
    let err = fails(tmp.path(), &changed);
    assert!(
        err.contains("the data differs") && err.contains("--allow-data-change"),
        "{err}"
    );
    // A key that selects examples is a data change too.
    let mut changed = extend.to_vec();
    changed.extend(["--set", "data.max_source_len=10"]);
    let err = fails(tmp.path(), &changed);
    assert!(
        err.contains("data.max_source_len") && err.contains("--allow-data-change"),
        "{err}"
    );
    // A model change is refused as before.
    let mut changed = extend.to_vec();
    changed.extend(["--set", "model.d_ff=32"]);
    let err = fails(tmp.path(), &changed);
    assert!(err.contains("model.d_ff"), "{err}");
    assert_eq!(
        checkpoints(&run_dir).last().unwrap().0,
        5,
        "nothing was trained by the refusals"
    );

    // Other keys are listed, the old config kept, and the run goes on.
    let mut changed = extend.to_vec();
    changed.extend(["--set", "train.lr=1e-3"]);
    let out = ok_output(tmp.path(), &changed);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("train.lr: 0.003 → 0.001"), "{stderr}");
    assert!(stderr.contains("train.steps: 5 → 10"), "{stderr}");
    let kept = run_dir.join("config-history/config.step-00000005.yaml");
    assert!(
        std::fs::read_to_string(&kept).unwrap().contains("lr: 0.003"),
        "the old config is kept"
    );
    assert!(std::fs::read_to_string(run_dir.join("config.yaml"))
        .unwrap()
        .contains("lr: 0.001"));
    assert_eq!(checkpoints(&run_dir).last().unwrap().0, 10);
}

#[test]
fn resuming_a_finished_run_changes_nothing_and_extending_it_is_exact_under_a_constant_schedule() {
    let tmp = tempfile::tempdir().unwrap();
    // Logged every 4 steps and at the last: the 6-step run logs (and measures attention) at
    // step 6, the 12-step one does not, and the two must still agree to the bit.
    let yaml = seq2seq_yaml(6, 0, 5)
        .replace("warmup_steps: 2", "warmup_steps: 0\n  schedule: constant")
        .replace("log_every: 1", "log_every: 4");
    let cfg = write(tmp.path(), "tiny.yaml", yaml);
    let (extended, straight) = (tmp.path().join("extended"), tmp.path().join("straight"));
    ok_output(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&extended), "--quiet"],
    );

    let files = ["metrics.jsonl", "metrics.csv", "summary.json", "config.yaml"];
    let read_all = |d: &Path| files.map(|f| std::fs::read(d.join(f)).unwrap());
    let before = read_all(&extended);
    let out = ok_output(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&extended), "--resume"],
    );
    assert!(
        text(&out.stdout).contains("already finished its 6 steps"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        read_all(&extended) == before,
        "resuming a finished run rewrote a file"
    );
    assert!(summary(&extended)["final_train_loss"].is_number());

    ok_output(
        tmp.path(),
        &[
            "train",
            s(&cfg),
            "--run-dir",
            s(&extended),
            "--resume",
            "--quiet",
            "--set",
            "train.steps=12",
        ],
    );
    ok_output(
        tmp.path(),
        &[
            "train",
            s(&cfg),
            "--run-dir",
            s(&straight),
            "--quiet",
            "--set",
            "train.steps=12",
        ],
    );
    let metrics = std::fs::read_to_string(extended.join("metrics.jsonl")).unwrap();
    assert!(
        metrics.starts_with(&text(&before[0])),
        "the lines of the first 6 steps are kept byte for byte"
    );
    assert!(
        final_weights(&extended) == final_weights(&straight),
        "6 steps + 6 more end with the weights of 12 steps"
    );
}

#[test]
fn a_skip_mode_run_that_mostly_skips_fails_as_diverged_with_a_clear_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let yaml = seq2seq_yaml(60, 0, 5)
        .replace("lr: 3.0e-3", "lr: 1.0e4\n  on_nonfinite: skip")
        .replace("eval:\n  every: 0", "eval:\n  every: 20");
    let cfg = write(tmp.path(), "hot.yaml", yaml);
    let run_dir = tmp.path().join("run");
    let out = run(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--quiet"],
    );
    let err = assert_clear_failure(&out, "train with lr 1e4");
    assert!(err.contains("diverged"), "{err}");
    let sum = summary(&run_dir);
    assert!(sum["diverged"].is_string(), "{sum}");
    assert_ne!(sum["final_train_loss"], 0.0, "no invented 0 loss: {sum}");
    assert_eq!(sum["finished"], false, "{sum}");
    // The state it stopped in is saved.
    assert_eq!(
        checkpoints(&run_dir).last().unwrap().0,
        sum["steps"].as_u64().unwrap()
    );
}

#[test]
fn sizes_are_checked_before_anything_is_allocated() {
    let tmp = tempfile::tempdir().unwrap();
    let lm = write(tmp.path(), "lm.yaml", lm_yaml(tmp.path(), 2));
    let lm_run = tmp.path().join("lm");
    ok_output(tmp.path(), &["train", s(&lm), "--run-dir", s(&lm_run), "--quiet"]);
    let max = u64::MAX.to_string();
    let err = fails(tmp.path(), &["generate", s(&lm_run), "--max-tokens", &max]);
    assert!(err.contains("--max-tokens") && err.contains("1000000"), "{err}");
    let err = fails(tmp.path(), &["bench", s(&lm), "--steps", &max]);
    assert!(err.contains("--steps"), "{err}");
    let err = fails(tmp.path(), &["bench", s(&lm), "--warmup", &max]);
    assert!(err.contains("--warmup"), "{err}");

    let tiny = write(tmp.path(), "tiny.yaml", seq2seq_yaml(2, 0, 5));
    let run_dir = tmp.path().join("run");
    ok_output(
        tmp.path(),
        &["train", s(&tiny), "--run-dir", s(&run_dir), "--quiet"],
    );
    for beam in ["--beam=100000", "--beam=0", "--beam=-1"] {
        let err = fails(tmp.path(), &["translate", s(&run_dir), beam]);
        assert!(err.contains("--beam"), "{err}");
    }
    // Past its documented bound a length is refused by name, before any estimate.
    let err = fails(
        tmp.path(),
        &["train", s(&tiny), "--set", "model.max_seq_len=4000000000"],
    );
    assert!(
        err.contains("model.max_seq_len") && err.contains("at most 1048576"),
        "{err}"
    );
    for (sets, key) in [
        (&["model.d_model=1048576"][..], "model.d_model"),
        // Every share's gradients are held until they are summed: 1,024 copies of a model that
        // trains alone in under a GiB.
        (
            &["model.d_model=2048", "train.shares=1024"],
            "train.shares = 1024",
        ),
    ] {
        let dir = tmp.path().join(sets[0]);
        let mut args = vec!["train", s(&tiny), "--run-dir", s(&dir)];
        for set in sets {
            args.extend(["--set", set]);
        }
        let err = fails(tmp.path(), &args);
        assert!(err.contains("of memory") && err.contains(key), "{sets:?}: {err}");
        assert!(checkpoints(&dir).is_empty());
    }
    // A token budget larger than the corpus is harmless (a batch holds at most the corpus),
    // so it is accepted.
    let budget = tmp.path().join("budget");
    ok_output(
        tmp.path(),
        &[
            "train",
            s(&tiny),
            "--run-dir",
            s(&budget),
            "--quiet",
            "--set",
            "train.max_tokens=1000000000000",
        ],
    );
    let err = fails(
        tmp.path(),
        &["train", s(&lm), "--set", "train.batch_size=100000000000"],
    );
    assert!(
        err.contains("of memory") && err.contains("train.batch_size"),
        "{err}"
    );
    for (set, key) in [
        ("train.threads=1000000000", "train.threads"),
        ("train.accumulation=1000000000000", "train.accumulation"),
        ("eval.beam=100000", "eval.beam"),
    ] {
        let err = fails(tmp.path(), &["train", s(&lm), "--set", set]);
        assert!(err.contains(key) && err.contains("at most"), "{set}: {err}");
    }
}

#[test]
fn data_that_does_not_fit_the_model_is_refused_at_load_naming_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let sentence = "a small dog runs on the grass";
    let lines = |n: usize| (0..n).map(|_| sentence).collect::<Vec<_>>().join("\n") + "\n";
    let long = vec!["word"; 300].join(" ");
    for (name, content) in [("train.src", lines(50)), ("train.tgt", lines(50))] {
        write(tmp.path(), name, content);
    }
    write(
        tmp.path(),
        "valid.src",
        format!("{sentence}\n{sentence}\n{long}\n{sentence}\n"),
    );
    write(tmp.path(), "valid.tgt", lines(4));
    let yaml = seq2seq_yaml(2, 0, 5).replace(
        "corpus: { kind: embedded, seed: 7, train_size: 300, val_size: 40, test_size: 40 }",
        "corpus:\n    kind: parallel\n    train: { source: train.src, target: train.tgt }\n    valid: { source: valid.src, target: valid.tgt }",
    );
    let cfg = write(tmp.path(), "par.yaml", yaml);
    let run_dir = tmp.path().join("run");
    let t0 = Instant::now();
    let err = fails(tmp.path(), &["train", s(&cfg), "--run-dir", s(&run_dir)]);
    assert!(
        err.contains("valid.src:3:") && err.contains("model.max_seq_len = 64"),
        "{err}"
    );
    assert!(err.contains("data.too_long"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(30), "refused at load");
    assert!(checkpoints(&run_dir).is_empty());
    let out = ok_output(
        tmp.path(),
        &[
            "train",
            s(&cfg),
            "--run-dir",
            s(&run_dir),
            "--set",
            "data.too_long=skip",
            "--quiet",
        ],
    );
    assert!(text(&out.stderr).contains("valid: 1"), "{}", text(&out.stderr));

    // A language model's validation text shorter than one window: refused at load, with advice
    // that makes it longer.
    let lm = write(tmp.path(), "lm.yaml", lm_yaml(tmp.path(), 2));
    let err = fails(
        tmp.path(),
        &[
            "train",
            s(&lm),
            "--run-dir",
            s(&tmp.path().join("lm")),
            "--set",
            "data.corpus.val_fraction=0.002",
        ],
    );
    assert!(
        err.contains("validation text has") && err.contains("raise data.corpus.val_fraction"),
        "{err}"
    );
}

#[test]
fn translate_keeps_one_output_line_per_input_line_and_names_the_lines_it_cannot_translate() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(40, 0, 5));
    let run_dir = tmp.path().join("run");
    ok_output(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--quiet"],
    );
    let mut input = b"twenty one cats\n\n".to_vec();
    input.extend_from_slice(b"bad \xff\xfe byte\n");
    input.extend_from_slice((vec!["seven"; 200].join(" ") + "\nthree dogs\n").as_bytes());
    let mut child = ember(tmp.path())
        .args(["translate", s(&run_dir), "--beam", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = assert_clear_failure(&out, "translate");
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "one output line per input line:\n{stdout}");
    assert_eq!(lines[1], "", "a blank line stays blank");
    // (40 steps: enough for the model to emit words rather than end every sentence at once.)
    assert!(!lines[0].is_empty() && !lines[4].is_empty(), "{stdout}");
    assert!(err.contains("stdin:3: not valid UTF-8"), "{err}");
    assert!(err.contains("stdin:4: the line has"), "{err}");
    assert!(
        err.contains("2 of 5 lines could not be translated (lines 3, 4)"),
        "{err}"
    );
    // The closing line says why, so a user who reads only it knows what to fix.
    assert!(
        err.contains("1 not valid UTF-8 (re-encode the input as UTF-8")
            && err.contains("1 longer than the model's max_seq_len"),
        "{err}"
    );
}

#[test]
fn unclear_inputs_get_messages_in_user_words() {
    let tmp = tempfile::tempdir().unwrap();
    let r = write(tmp.path(), "ref.txt", "a cat\n");
    let out = run(
        tmp.path(),
        &["bleu", "-r", s(&r), "-i", s(&r), "--metrics", "bleu,banana"],
    );
    let err = assert_clear_failure(&out, "bleu --metrics bleu,banana");
    assert!(err.contains("banana"), "{err}");
    assert!(out.stdout.is_empty(), "nothing printed before the refusal");

    let cfg = write(
        tmp.path(),
        "warm.yaml",
        seq2seq_yaml(2, 0, 5).replace("warmup_steps: 2", "warmup_steps: 10"),
    );
    let out = ok_output(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&tmp.path().join("w")), "--quiet"],
    );
    assert!(text(&out.stderr).contains("warning: train.warmup_steps = 10 is more than train.steps = 2"));

    let dup = write(
        tmp.path(),
        "dup.yaml",
        seq2seq_yaml(2, 0, 5).replace("  lr: 3.0e-3\n", "  lr: 3.0e-3\n  lr: 1.0e-3\n"),
    );
    let err = fails(tmp.path(), &["train", s(&dup)]);
    assert!(
        err.contains("dup.yaml:") && err.contains("`lr` is given twice"),
        "{err}"
    );

    // A list where a section's mapping belongs.
    let list = seq2seq_yaml(2, 0, 5).replace("checkpoint:\n  every: 5\n  keep_last: 2", "checkpoint: [5, 2]");
    let err = fails(tmp.path(), &["train", s(&write(tmp.path(), "list.yaml", list))]);
    assert!(
        err.contains("`checkpoint` must be a mapping of keys") && err.contains("a list"),
        "{err}"
    );
    // An alias bomb: refused by what it is, not by the parser's budget name.
    let bomb = (0..8).fold(
        String::from("a0: &a0 [x, x, x, x, x, x, x, x, x]\n"),
        |text, i| {
            let alias = format!("*a{i}");
            format!(
                "{text}a{}: &a{} [{}]\n",
                i + 1,
                i + 1,
                [alias.as_str(); 9].join(", ")
            )
        },
    );
    let err = fails(tmp.path(), &["train", s(&write(tmp.path(), "bomb.yaml", bomb))]);
    assert!(
        err.contains("alias bomb") && !err.contains("budget breached"),
        "{err}"
    );
    // A 10 MB value is refused with its size, not echoed back.
    let huge = seq2seq_yaml(2, 0, 5).replace("threads: 1", &format!("threads: {}", "9".repeat(10 << 20)));
    let err = fails(tmp.path(), &["train", s(&write(tmp.path(), "huge.yaml", huge))]);
    assert!(err.len() < 2000, "the message is short: {} bytes", err.len());
    assert!(err.contains("huge.yaml") && err.contains("bytes"), "{err}");
    let long =
        seq2seq_yaml(2, 0, 5).replace("  dropout: 0.1", &format!("  qk_norm: {}", "n".repeat(100_000)));
    let err = fails(tmp.path(), &["train", s(&write(tmp.path(), "long.yaml", long))]);
    assert!(
        err.len() < 2000 && err.contains("(100000 characters)"),
        "{}",
        &err[..err.len().min(3000)]
    );
    // Not a text file at all: /dev/zero is refused as a device before a byte is read.
    let err = fails(tmp.path(), &["train", "/dev/zero"]);
    assert!(err.contains("/dev/zero") && err.contains("a device"), "{err}");
    // More threads than cores: accepted, with a warning saying why it is slower.
    let cores = std::thread::available_parallelism().unwrap().get();
    let out = run(
        tmp.path(),
        &[
            "bench",
            s(&cfg),
            "--steps",
            "1",
            "--warmup",
            "0",
            "--set",
            &format!("train.threads={}", cores + 1),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!(
            "warning: train.threads = {} but this machine has {cores} core(s)",
            cores + 1
        )),
        "{}",
        text(&out.stderr)
    );

    // A file where a directory is expected, and a directory where a file is.
    let file = write(tmp.path(), "not-a-dir", "x");
    let err = fails(tmp.path(), &["train", s(&cfg), "--run-dir", s(&file)]);
    assert!(err.contains(s(&file)), "names the path: {err}");
    let err = fails(tmp.path(), &["train", s(tmp.path())]);
    assert!(err.contains(s(tmp.path())), "names the path: {err}");
}

/// `ember ARGS` with its stdout a pipe whose reader has already gone (as `ember … | head` once
/// head has exited): returns how it ended.
fn with_reader_gone(dir: &Path, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut child = ember(dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    // The process may end before reading all of it: a failed write here is expected.
    let _ = std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin);
    child.wait_with_output().unwrap()
}

#[test]
fn a_reader_that_goes_away_neither_stops_training_nor_crashes_a_command() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(6, 3, 3));
    let run_dir = tmp.path().join("run");
    // Training prints a line per step and per evaluation into the dead pipe: it goes on to the
    // end as if quiet, and everything it saves is there.
    let out = with_reader_gone(tmp.path(), &["train", s(&cfg), "--run-dir", s(&run_dir)], b"");
    let err = text(&out.stderr);
    assert!(out.status.success(), "train ended with {}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(summary(&run_dir)["steps"], 6);
    assert_eq!(logged_steps(&run_dir), (1..=6).collect::<Vec<_>>());

    // Commands whose product is their output stop at once, quietly, with status 0.
    let input = "three dogs\n".repeat(2_000);
    for args in [
        vec!["translate", s(&run_dir), "--beam", "1"],
        vec!["eval", s(&run_dir)],
        vec!["bench", s(&cfg), "--steps", "2", "--warmup", "0"],
    ] {
        let out = with_reader_gone(tmp.path(), &args, input.as_bytes());
        let err = text(&out.stderr);
        assert!(out.status.success(), "{args:?} ended with {}: {err}", out.status);
        assert!(
            !err.contains("panicked") && !err.contains("error"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn output_that_cannot_be_written_is_an_error_and_training_still_saves_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(4, 2, 2));
    let run_dir = tmp.path().join("run");
    // stdout on a full disk (/dev/full: every write fails with ENOSPC).
    let full = |args: &[&str]| {
        let dev_full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = ember(tmp.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(dev_full)
            .output()
            .unwrap();
        assert_clear_failure(&out, &args.join(" "))
    };
    let err = full(&["train", s(&cfg), "--run-dir", s(&run_dir)]);
    assert!(
        err.contains("writing to stdout failed") && err.contains("No space left"),
        "{err}"
    );
    assert_eq!(summary(&run_dir)["steps"], 4, "the run itself went on to the end");
    for args in [
        vec!["bench", s(&cfg), "--steps", "1", "--warmup", "0", "--json"],
        vec!["eval", s(&run_dir), "--json"],
    ] {
        let err = full(&args);
        assert!(err.contains("writing to stdout failed"), "{args:?}: {err}");
    }
}

/// The children a sweep with `--jobs 2` is training, once each has logged `steps` steps.
fn wait_for_children(sweep: &mut Child, runs: &[std::path::PathBuf], steps: usize) {
    wait_until(sweep, "both children's steps", || {
        runs.iter().all(|r| logged_steps(r).len() >= steps)
    });
}

/// Waits (up to 120 s) until no process holds `run_dir`'s lock.
fn wait_released(run_dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while ember_trainer::run_lock::holder(run_dir).is_some() {
        assert!(
            Instant::now() < deadline,
            "{} still held after 120 s",
            run_dir.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_sweep_killed_with_sigkill_leaves_each_child_stopped_with_a_checkpoint_not_aborted() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(4000, 0, 1000));
    let out_dir = tmp.path().join("sweep");
    let args = [
        "ablate",
        s(&cfg),
        "--variants",
        "none,rmsnorm",
        "--seeds",
        "1",
        "--jobs",
        "2",
        "--threads",
        "1",
        "--out",
        s(&out_dir),
        "--quiet",
    ];
    let mut sweep = spawn(tmp.path(), &args);
    let runs = [
        out_dir.join("runs/none-lr3e-3-seed1"),
        out_dir.join("runs/rmsnorm-lr3e-3-seed1"),
    ];
    wait_for_children(&mut sweep, &runs, 3);
    signal(&sweep, libc::SIGKILL);
    sweep.wait().unwrap();
    for run in &runs {
        wait_released(run);
        let log = std::fs::read_to_string(run.join("ablate-stderr.log")).unwrap();
        assert!(
            !log.contains("aborting now"),
            "the parent's death is one stop request:\n{log}"
        );
        assert!(log.contains("SIGTERM received"), "acknowledged at once:\n{log}");
        let sum = summary(run);
        assert_eq!(sum["interrupted"], "SIGTERM", "{sum}");
        assert_eq!(
            checkpoints(run).last().unwrap().0,
            sum["steps"].as_u64().unwrap(),
            "its step is saved"
        );
    }
}

#[test]
fn a_stop_before_the_first_step_says_the_run_starts_over_and_never_offers_a_resume_that_fails() {
    let tmp = tempfile::tempdir().unwrap();
    // Enough text that preparing it (a BPE tokenizer, the token cache) takes a moment.
    let line = "the quick brown fox jumps over the lazy dog while seven wizards quietly hex jumbled boxes\n";
    let corpus = (0..40_000).map(|i| format!("{i} {line}")).collect::<String>();
    write(tmp.path(), "big.txt", corpus);
    let cfg = write(
        tmp.path(),
        "lm.yaml",
        "model: { arch: lm, d_model: 16, n_layers: 1, n_heads: 2, d_ff: 32, max_seq_len: 16 }\n\
         data:\n  corpus: { kind: text, path: big.txt, val_fraction: 0.1 }\n  tokenizer: { kind: bpe, vocab_size: 2000 }\n\
         train: { steps: 100000, lr: 3.0e-3, batch_size: 2, block_size: 8, threads: 1, log_every: 1 }\n\
         eval: { every: 0 }\ncheckpoint: { every: 100000 }\n",
    );
    let run_dir = tmp.path().join("run");
    let mut child = spawn(tmp.path(), &["train", s(&cfg), "--run-dir", s(&run_dir)]);
    // The lock is taken once the stop signals are connected, before the data is prepared.
    wait_until(&mut child, "the run directory's lock", || {
        run_dir.join(".lock").is_file()
    });
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("SIGINT received: stopping"),
        "acknowledged at once: {stderr}"
    );
    match checkpoints(&run_dir).last() {
        // Stopped before a step was trained: nothing to resume, and it says so.
        None => {
            assert!(
                stderr.contains("to start it over, run: ember train") && !stderr.contains("--resume"),
                "{stderr}"
            );
            ok_output(
                tmp.path(),
                &[
                    "train",
                    s(&cfg),
                    "--run-dir",
                    s(&run_dir),
                    "--quiet",
                    "--set",
                    "train.steps=2",
                ],
            );
        }
        // The data was ready sooner than the signal: the step it saved is what resumes.
        Some(_) => assert!(stderr.contains("resume with:"), "{stderr}"),
    }
}

#[test]
fn average_during_training_always_finds_the_checkpoints_it_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(
        tmp.path(),
        "tiny.yaml",
        seq2seq_yaml(100_000, 0, 1).replace("keep_last: 2", "keep_last: 3"),
    );
    let run_dir = tmp.path().join("run");
    let mut child = spawn(
        tmp.path(),
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--quiet"],
    );
    wait_until(&mut child, "three checkpoints", || {
        checkpoints(&run_dir).len() >= 3
    });
    for _ in 0..25 {
        let out = run(tmp.path(), &["average", s(&run_dir), "--last", "3"]);
        assert!(
            out.status.success(),
            "average failed while training:\n{}",
            text(&out.stderr)
        );
    }
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
}

#[test]
fn a_cell_being_trained_is_neither_retried_nor_reported_as_interrupted() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "tiny.yaml", seq2seq_yaml(100_000, 0, 1000));
    let out_dir = tmp.path().join("sweep");
    let args = [
        "ablate",
        s(&cfg),
        "--variants",
        "none",
        "--seeds",
        "1",
        "--out",
        s(&out_dir),
        "--quiet",
    ];
    let mut sweep = spawn(tmp.path(), &args);
    let run_dir = out_dir.join("runs/none-lr3e-3-seed1");
    wait_until(&mut sweep, "the child's step 3", || {
        logged_steps(&run_dir).len() >= 3
    });
    let log = run_dir.join("ablate-stderr.log");
    let status = || std::fs::read_to_string(out_dir.join("status.json")).unwrap();
    let (status_before, log_len) = (status(), std::fs::metadata(&log).unwrap().len());

    let err = fails(tmp.path(), &["ablate", s(&out_dir), "--cell", "0"]);
    assert!(
        err.contains("is in use") && err.contains("Nothing was changed"),
        "{err}"
    );
    assert_eq!(status(), status_before, "its record is untouched");
    assert!(
        std::fs::metadata(&log).unwrap().len() >= log_len,
        "its log is not truncated"
    );

    let out = ok_output(tmp.path(), &["report", s(&out_dir)]);
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(
        md.contains("running") && !md.contains("interrupted"),
        "{md}\n{}",
        text(&out.stderr)
    );
    let table = ok(tmp.path(), &["ablate", s(&out_dir), "--status"]);
    assert!(table.contains("running"), "{table}");

    signal(&sweep, libc::SIGINT);
    let out = sweep.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
}

#[test]
fn a_stop_during_an_evaluation_is_acknowledged_at_once_and_saves_the_evaluated_step() {
    let tmp = tempfile::tempdir().unwrap();
    // A validation split long enough that evaluating it takes seconds.
    let words = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    ];
    let corpus: String = (0..240_000)
        .map(|i| {
            format!(
                "{} {} {}\n",
                words[i % 8],
                words[(i / 8) % 8],
                words[(i / 64) % 8]
            )
        })
        .collect();
    write(tmp.path(), "words.txt", corpus);
    let cfg = write(
        tmp.path(),
        "lm.yaml",
        "model: { arch: lm, d_model: 32, n_layers: 2, n_heads: 2, d_ff: 64, max_seq_len: 32 }\n\
         data:\n  corpus: { kind: text, path: words.txt, val_fraction: 0.5 }\n  tokenizer: { kind: char }\n\
         train: { steps: 1000, lr: 3.0e-3, batch_size: 2, block_size: 32, threads: 1, log_every: 1 }\n\
         eval: { every: 2, max_tokens: 1000000000 }\ncheckpoint: { every: 1000 }\n",
    );
    let run_dir = tmp.path().join("run");
    // stdout and stderr in one file, in the order they were written.
    let log_path = tmp.path().join("out.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = ember(tmp.path())
        .args(["train", s(&cfg), "--run-dir", s(&run_dir)])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    // Step 2's record is written once its evaluation is announced, before it starts.
    wait_until(&mut child, "step 2", || logged_steps(&run_dir).len() >= 2);
    signal(&child, libc::SIGINT);
    let status = child.wait().unwrap();
    let out = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(status.code(), Some(130), "{out}");
    let ack = out
        .find("SIGINT received: stopping after this evaluation (step 2 is trained)")
        .unwrap_or_else(|| panic!("acknowledged as a stop after the evaluation:\n{out}"));
    let evaluated = out.find("step 2: val loss").expect("the evaluation finished");
    assert!(
        ack < evaluated,
        "said at once, before the evaluation ended:\n{out}"
    );
    assert!(!out.contains("aborting now"), "{out}");
    assert_eq!(checkpoints(&run_dir).last().map(|c| c.0), Some(2), "{out}");
    assert_eq!(summary(&run_dir)["interrupted"], "SIGINT");
}
