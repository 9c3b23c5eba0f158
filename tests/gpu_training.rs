//! GPU suite, training as a whole (built with `--features cuda`, run on a machine with a GPU):
//! a CUDA run follows the CPU run's trajectory, switching the CUDA kernels on changes the
//! trajectory only by rounding, a bf16 run (`train.precision: bf16`, cuBLAS's bf16 products)
//! follows the f32 run within bf16's rounding, and a CUDA run killed with SIGKILL resumes to the
//! bit-identical result of an uninterrupted one, in f32 and in bf16. Runs the built `ember` ($EMBER_BIN where the binary was
//! carried to another machine, else Cargo's).
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn ember(dir: &Path) -> Command {
    let bin = std::env::var("EMBER_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_ember").to_string());
    let mut c = Command::new(bin);
    c.current_dir(dir).stdin(Stdio::null());
    c
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A small translation model on the embedded task, dropout on (its masks are the same on both
/// devices), a record every 5 steps, so that most steps are judged on the device unread.
fn yaml(steps: u64, device: &str, checkpoint_every: u64) -> String {
    yaml_in(steps, device, checkpoint_every, "f32")
}

/// [`yaml`] with `train.precision: precision`.
fn yaml_in(steps: u64, device: &str, checkpoint_every: u64, precision: &str) -> String {
    format!(
        r#"
device: {device}
model:
  arch: seq2seq
  d_model: 64
  n_layers: 2
  n_heads: 4
  d_ff: 128
  mlp: swiglu
  norm: rmsnorm
  qk_norm: layernorm
  max_seq_len: 64
  dropout: 0.1
  attn_dropout: 0.1
data:
  corpus: {{ kind: embedded, seed: 7, train_size: 2000, val_size: 50, test_size: 50 }}
  tokenizer: {{ kind: bpe, vocab_size: 300 }}
train:
  steps: {steps}
  seed: 3
  lr: 3.0e-3
  warmup_steps: 5
  max_tokens: 1024
  label_smoothing: 0.1
  z_loss: 1.0e-4
  clip_grad_norm: 1.0
  log_every: 5
  threads: 4
  # One share on both devices (the CPU's default is two, each with its own dropout masks).
  shares: 1
  precision: {precision}
eval:
  every: 0
checkpoint:
  every: {checkpoint_every}
  keep_last: 2
"#
    )
}

fn train(dir: &Path, cfg: &str, run: &str, kernels: &str) -> PathBuf {
    let cfg_path = dir.join(format!("{run}.yaml"));
    std::fs::write(&cfg_path, cfg).unwrap();
    let run_dir = dir.join(run);
    let out = ember(dir)
        .args(["train", s(&cfg_path), "--run-dir", s(&run_dir), "--quiet"])
        .env("EMBER_CUDA_KERNELS", kernels)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ember train {run} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    run_dir
}

/// (step, loss, grad norm) of every training record.
fn records(run_dir: &Path) -> Vec<(u64, f64, f64)> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["kind"] == "train")
        .map(|r| {
            (
                r["step"].as_u64().unwrap(),
                r["loss"].as_f64().unwrap(),
                r["grad_norm"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The largest relative difference of the losses and gradient norms of two runs' records.
fn max_rel_diff(a: &[(u64, f64, f64)], b: &[(u64, f64, f64)]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            assert_eq!(x.0, y.0);
            let rel = |p: f64, q: f64| (p - q).abs() / q.abs().max(1e-12);
            rel(x.1, y.1).max(rel(x.2, y.2))
        })
        .fold(0.0, f64::max)
}

#[test]
fn a_cuda_run_follows_the_cpu_run_for_50_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let cpu = records(&train(tmp.path(), &yaml(50, "cpu", 50), "cpu", "verified"));
    let gpu = records(&train(tmp.path(), &yaml(50, "cuda:0", 50), "gpu", "all"));
    assert_eq!(cpu.len(), 10);
    let d = max_rel_diff(&gpu, &cpu);
    eprintln!("CPU vs CUDA (all kernels), 50 steps: max relative difference of loss and grad norm {d:e}");
    // Float rounding only: the same initial weights, batches and dropout masks; sums differ in
    // order, and the difference grows over the steps.
    assert!(d < 1e-2, "CUDA and CPU runs drift apart: {d:e}");
    assert!(cpu.last().unwrap().1 < cpu[0].1, "the run learns");
}

#[test]
fn cuda_kernels_change_a_cuda_run_only_by_rounding() {
    let tmp = tempfile::tempdir().unwrap();
    let off = records(&train(tmp.path(), &yaml(30, "cuda:0", 30), "off", "none"));
    let on = records(&train(tmp.path(), &yaml(30, "cuda:0", 30), "on", "all"));
    let d = max_rel_diff(&on, &off);
    eprintln!("CUDA kernels on vs off, 30 steps: max relative difference {d:e}");
    assert!(
        d < 1e-2,
        "the kernels change the trajectory beyond rounding: {d:e}"
    );
}

fn checkpoints(run_dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut v: Vec<(u64, PathBuf)> = std::fs::read_dir(run_dir.join("checkpoints"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let step = name.strip_prefix("step-")?.parse().ok()?;
                    e.path().join("state.json").exists().then(|| (step, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// bf16 moves a run by rounding only: on the CPU this config's bf16 run stays within 2.6·10⁻³
/// (relative) of its f32 run over 50 steps; cuBLAS also rounds each product's output, so the
/// bound here is ten times that. A run no different from f32 did not compute in bf16. With
/// every kernel on (`all`) the pre-norm branches' activations are bf16 too
/// (`Precision::branch_dtype`); with the verified ones, f32.
#[test]
fn a_bf16_cuda_run_follows_the_f32_run_within_bf16s_rounding() {
    let tmp = tempfile::tempdir().unwrap();
    let f32 = records(&train(tmp.path(), &yaml(50, "cuda:0", 50), "f32", "all"));
    let mut runs = vec![];
    for kernels in ["all", "verified"] {
        let bf16 = records(&train(
            tmp.path(),
            &yaml_in(50, "cuda:0", 50, "bf16"),
            &format!("bf16-{kernels}"),
            kernels,
        ));
        let d = max_rel_diff(&bf16, &f32);
        eprintln!("CUDA bf16 ({kernels} kernels) vs f32, 50 steps: max relative difference of loss and grad norm {d:e}");
        assert!(
            d < 3e-2,
            "the bf16 run ({kernels} kernels) drifts from the f32 run: {d:e}"
        );
        assert!(
            d > 1e-6,
            "the bf16 run ({kernels} kernels) is the f32 run: its products are not bf16"
        );
        assert!(
            bf16.last().unwrap().1 < bf16[0].1,
            "the bf16 run ({kernels} kernels) learns"
        );
        runs.push(bf16);
    }
    assert!(
        max_rel_diff(&runs[0], &runs[1]) > 0.0,
        "bf16 branches (all kernels) gave the f32 branches' run (verified kernels): not run in bf16"
    );
}

#[test]
fn a_cuda_run_killed_with_sigkill_resumes_bit_identically() {
    assert_cuda_sigkill_resume_is_exact("f32");
}

#[test]
fn a_bf16_cuda_run_killed_with_sigkill_resumes_bit_identically() {
    assert_cuda_sigkill_resume_is_exact("bf16");
}

/// A run in `precision`, killed with SIGKILL after a checkpoint and resumed, ends with the
/// records, weights and optimizer state of an uninterrupted run, bit for bit.
fn assert_cuda_sigkill_resume_is_exact(precision: &str) {
    const STEPS: u64 = 60;
    let tmp = tempfile::tempdir().unwrap();
    let cfg_path = tmp.path().join("kill.yaml");
    std::fs::write(&cfg_path, yaml_in(STEPS, "cuda:0", 10, precision)).unwrap();
    let killed = tmp.path().join("killed");
    let mut child = ember(tmp.path())
        .args(["train", s(&cfg_path), "--run-dir", s(&killed), "--quiet"])
        .env("EMBER_CUDA_KERNELS", "all")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    // Kill once a checkpoint at step ≥ 20 is complete and training has moved past it.
    loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it was killed"
        );
        let newest = checkpoints(&killed).last().map(|c| c.0);
        let logged = std::fs::read_to_string(killed.join("metrics.jsonl"))
            .ok()
            .map(|t| t.lines().filter(|l| l.contains(r#""kind":"train""#)).count() as u64 * 5);
        if matches!((newest, logged), (Some(c), Some(l)) if c >= 20 && l > c) {
            break;
        }
        assert!(Instant::now() < deadline, "the moment to kill did not come");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let at_kill = checkpoints(&killed).last().unwrap().0;
    assert!(at_kill < STEPS);
    let out = ember(tmp.path())
        .args([
            "train",
            s(&cfg_path),
            "--run-dir",
            s(&killed),
            "--resume",
            "--quiet",
        ])
        .env("EMBER_CUDA_KERNELS", "all")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let straight = train(
        tmp.path(),
        &yaml_in(STEPS, "cuda:0", 10, precision),
        "straight",
        "all",
    );
    assert_eq!(
        records(&killed),
        records(&straight),
        "per-record losses must be bit-identical"
    );
    let newest = |d: &Path| checkpoints(d).last().unwrap().1.clone();
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let a = std::fs::read(newest(&killed).join(file)).unwrap();
        let b = std::fs::read(newest(&straight).join(file)).unwrap();
        assert!(a == b, "{file}: resumed after step {at_kill}, not bit-identical");
    }
}
