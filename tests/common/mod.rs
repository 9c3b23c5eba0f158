//! What the CLI tests share: running the built `ember` in a test's directory, the two ways a
//! run may end (success, or a clear failure — status 1 or 2, a message, no panic), and the tiny
//! seq2seq config they train (a few milliseconds per step, one thread, so that concurrent tests
//! do not oversubscribe the cores).
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A tiny seq2seq run on a slice of the embedded task: dropout on, evaluation every
/// `eval_every` steps (0: never), a checkpoint every `checkpoint_every`, the newest two kept.
pub fn seq2seq_yaml(steps: u64, eval_every: u64, checkpoint_every: u64) -> String {
    format!(
        r#"
model:
  arch: seq2seq
  d_model: 32
  n_layers: 1
  n_heads: 4
  d_ff: 64
  max_seq_len: 64
  dropout: 0.1
  attn_dropout: 0.1
data:
  corpus: {{ kind: embedded, seed: 7, train_size: 300, val_size: 40, test_size: 40 }}
  tokenizer: {{ kind: bpe, vocab_size: 200 }}
train:
  steps: {steps}
  seed: 3
  lr: 3.0e-3
  warmup_steps: 2
  max_tokens: 300
  label_smoothing: 0.1
  z_loss: 1.0e-4
  log_every: 1
  threads: 1
eval:
  every: {eval_every}
checkpoint:
  every: {checkpoint_every}
  keep_last: 2
"#
    )
}

/// `ember`, started in `dir` (relative default paths such as runs/<name> land there), with bf16
/// products on any CPU: natively where it has AVX512_BF16, else emulated with the same bits
/// (`EMBER_CPU_BF16=emulate`), so that the bf16 specifications run everywhere, CI's CPU
/// included. A test of the refusal removes the variable.
pub fn ember(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.current_dir(dir).env(ember_kernels::BF16_ENV, "emulate");
    c
}

/// Runs `ember ARGS` in `dir` to the end, with nothing on stdin.
pub fn run(dir: &Path, args: &[&str]) -> Output {
    ember(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ember")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `ember ARGS`, requires exit status 0, and returns what it printed.
pub fn ok_output(dir: &Path, args: &[&str]) -> Output {
    let out = run(dir, args);
    assert!(
        out.status.success(),
        "ember {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

/// Runs `ember ARGS`, requires exit status 0, and returns stdout.
pub fn ok(dir: &Path, args: &[&str]) -> String {
    text(&ok_output(dir, args).stdout)
}

/// Runs `ember ARGS`, requires a clear failure, and returns stderr.
pub fn fails(dir: &Path, args: &[&str]) -> String {
    let out = run(dir, args);
    assert_clear_failure(&out, &format!("{args:?}"))
}

/// A failure that is not a crash: exit status 1 or 2, no panic, something said on stderr.
pub fn assert_clear_failure(out: &Output, what: &str) -> String {
    let stderr = text(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(1 | 2)),
        "ember {what} should fail with status 1 or 2, got {}:\nstdout:\n{}\nstderr:\n{stderr}",
        out.status,
        text(&out.stdout)
    );
    assert!(!stderr.contains("panicked"), "ember {what} panicked:\n{stderr}");
    assert!(!stderr.trim().is_empty(), "ember {what} failed silently");
    stderr
}

pub fn write(dir: &Path, name: &str, content: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Complete checkpoints of a run (directories holding state.json), oldest first.
pub fn checkpoints(run_dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(run_dir.join("checkpoints"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            e.path().join("state.json").is_file().then(|| (step, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// The steps of a run's train records in metrics.jsonl, in file order (a record torn by a
/// kill is skipped, as the trainer does).
pub fn logged_steps(run_dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["kind"] == "train")
        .filter_map(|r| r["step"].as_u64())
        .collect()
}
