//! Data-parallel training under a real `mpirun` (Open MPI, from Debian's openmpi-bin, which
//! scripts/mpi-local.sh installs): ranks against one process computing the same shares, exact
//! resume of a killed job, a stop signal on one rank, and a rank that dies or hangs.
//!
//! Built only with `--features distributed`; `.ci/run` installs MPI and runs these. One job at a
//! time: a job takes every core, and Open MPI's ranks poll while they wait.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::*;

static ONE_JOB_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_job() -> std::sync::MutexGuard<'static, ()> {
    ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// `mpirun -np N ember ARGS` in `dir`, in a process group of its own (so a test can kill the
/// whole job).
fn mpirun(dir: &Path, ranks: usize, args: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        // bf16 on any CPU, as `ember` runs in every test (`common::ember`).
        "-x",
        ember_kernels::BF16_ENV,
        "-np",
        &ranks.to_string(),
    ])
    .env(ember_kernels::BF16_ENV, "emulate")
    .arg(env!("CARGO_BIN_EXE_ember"))
    .args(args)
    .current_dir(dir)
    .stdin(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    c
}

fn job_ok(dir: &Path, ranks: usize, args: &[&str]) -> Output {
    let out = mpirun(dir, ranks, args)
        .output()
        .expect("mpirun (install Open MPI: scripts/mpi-local.sh)");
    assert!(
        out.status.success(),
        "mpirun -np {ranks} ember {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

/// Starts a job in the background. Give it `--quiet`: nothing reads its output until
/// [`finish`], and a job whose output pipe is full stalls (its ranks block writing).
fn spawn_job(dir: &Path, ranks: usize, args: &[&str]) -> Child {
    mpirun(dir, ranks, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun")
}

/// A tiny character-level language model on `text.txt` in `dir` (dropout on).
fn lm_yaml(dir: &Path, steps: u64, checkpoint_every: u64) -> String {
    let text =
        "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n".repeat(40);
    std::fs::write(dir.join("text.txt"), text).unwrap();
    format!(
        r#"
model: {{ arch: lm, d_model: 32, n_layers: 1, n_heads: 4, d_ff: 64, max_seq_len: 32, dropout: 0.1 }}
data:
  corpus: {{ kind: text, path: {}, val_fraction: 0.1 }}
  tokenizer: {{ kind: char }}
train: {{ steps: {steps}, lr: 3.0e-3, batch_size: 6, block_size: 16, threads: 1, log_every: 1 }}
eval: {{ every: 4 }}
checkpoint: {{ every: {checkpoint_every}, keep_last: 10 }}
"#,
        dir.join("text.txt").display()
    )
}

/// Train and eval records of a run, without the fields that are wall-clock times.
fn records(run_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            let o = v.as_object_mut().unwrap();
            for timing in ["tokens_per_sec", "elapsed_secs", "secs", "eval_secs"] {
                o.remove(timing);
            }
            v
        })
        .collect()
}

fn summary(run_dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap()).unwrap()
}

fn newest_weights(run_dir: &Path) -> (u64, Vec<u8>) {
    let (step, dir) = checkpoints(run_dir).pop().expect("a checkpoint");
    (step, std::fs::read(dir.join("model.safetensors")).unwrap())
}

/// The f32 values of a safetensors file, tensor after tensor as stored.
fn floats(safetensors: &[u8]) -> Vec<f32> {
    let header = u64::from_le_bytes(safetensors[..8].try_into().unwrap()) as usize;
    safetensors[8 + header..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// ‖a − b‖ / ‖b‖ over all weights.
fn relative_difference(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let diff: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let norm: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (diff / norm).sqrt()
}

struct Pair {
    _tmp: tempfile::TempDir,
    job: PathBuf,
    alone: PathBuf,
}

/// The same config trained by an N-rank job of one share per rank and by one process computing
/// N shares.
fn job_and_shares(yaml: &str, ranks: usize) -> Pair {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "run.yaml", yaml);
    let (job, alone) = (tmp.path().join("job"), tmp.path().join("alone"));
    let out = job_ok(
        tmp.path(),
        ranks,
        &["train", s(&cfg), "--run-dir", s(&job), "--set", "train.shares=1"],
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("data parallel: {ranks} ranks")),
        "{stdout}"
    );
    // Rank 0 alone prints: one summary line for the job.
    assert_eq!(stdout.matches("done:").count(), 1, "{stdout}");
    ok(
        tmp.path(),
        &[
            "train",
            s(&cfg),
            "--run-dir",
            s(&alone),
            "--set",
            &format!("train.shares={ranks}"),
        ],
    );
    Pair {
        _tmp: tmp,
        job,
        alone,
    }
}

#[test]
fn two_ranks_give_the_bits_of_one_process_computing_the_same_two_shares() {
    let _job = one_job();
    let text_dir = tempfile::tempdir().unwrap();
    for yaml in [seq2seq_yaml(12, 6, 6), lm_yaml(text_dir.path(), 12, 6)] {
        let pair = job_and_shares(&yaml, 2);
        // Losses, gradient norms, attention telemetry and validation losses, record for record.
        let (job, alone) = (records(&pair.job), records(&pair.alone));
        assert_eq!(job.len(), alone.len());
        for (a, b) in job.iter().zip(&alone) {
            assert_eq!(a, b);
        }
        assert_eq!(newest_weights(&pair.job), newest_weights(&pair.alone));
        // The ranks checked each other's weights (SHA-256, all-gathered) before writing.
        let summary = summary(&pair.job);
        assert_eq!(summary["world_size"], 2);
        assert_eq!(summary["weights_sha256"].as_str().unwrap().len(), 64);
        // Rank 0 alone writes the run directory: the same files as the process alone.
        let names = |d: &Path| {
            let mut v: Vec<String> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with("events."))
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&pair.job), names(&pair.alone));
    }
}

/// The same in bf16 mixed precision (`train.precision: bf16`; emulated where the CPU has no
/// AVX512_BF16): the ranks' bf16 products and the all-reduce of their f32 gradients give one process's bits.
#[test]
fn two_bf16_ranks_give_the_bits_of_one_bf16_process_computing_the_same_two_shares() {
    let _job = one_job();
    let text_dir = tempfile::tempdir().unwrap();
    let yaml = lm_yaml(text_dir.path(), 12, 6).replace("threads: 1,", "threads: 1, precision: bf16,");
    assert!(yaml.contains("precision: bf16"));
    let pair = job_and_shares(&yaml, 2);
    assert_eq!(records(&pair.job), records(&pair.alone));
    assert_eq!(newest_weights(&pair.job), newest_weights(&pair.alone));
    // And bf16 is not f32: the products' rounding shows in the weights.
    let f32_pair = job_and_shares(&lm_yaml(text_dir.path(), 12, 6), 2);
    assert_ne!(newest_weights(&pair.job), newest_weights(&f32_pair.job));
}

#[test]
fn three_ranks_agree_with_one_process_within_1e_6() {
    let _job = one_job();
    let pair = job_and_shares(&seq2seq_yaml(10, 5, 5), 3);
    let (job, alone) = (records(&pair.job), records(&pair.alone));
    assert_eq!(job.len(), alone.len());
    for (a, b) in job.iter().zip(&alone) {
        assert_eq!(a["step"], b["step"]);
        for key in ["loss", "nll", "ppl", "grad_norm"] {
            if let (Some(x), Some(y)) = (a[key].as_f64(), b[key].as_f64()) {
                assert!(
                    (x - y).abs() <= 1e-6 * x.abs().max(y.abs()),
                    "{key} at step {}: {x} vs {y}",
                    a["step"]
                );
            }
        }
    }
    let (step, job_weights) = newest_weights(&pair.job);
    let (_, alone_weights) = newest_weights(&pair.alone);
    assert_eq!(step, 10);
    let d = relative_difference(&floats(&job_weights), &floats(&alone_weights));
    // Three terms may be summed in another order by MPI than by one process ((g0+g1)+g2):
    // a rounding apart per step, which AdamW then carries.
    eprintln!("3 ranks vs one process: weights differ by {d:e} (relative, as vectors)");
    assert!(d <= 1e-6, "weights differ by {d:e} (relative, as vectors)");
}

/// PIDs of the ranks of the mpirun job `mpirun_pid`, by rank.
fn rank_pids(mpirun_pid: u32, ranks: usize) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut found = vec![None; ranks];
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Field 4, after the parenthesised command name, is the parent's pid.
            let parent = stat
                .rsplit(") ")
                .next()
                .and_then(|r| r.split(' ').nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if parent != Some(mpirun_pid) {
                continue;
            }
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let rank = environ
                .split(|&b| b == 0)
                .find_map(|kv| kv.strip_prefix(b"OMPI_COMM_WORLD_RANK="))
                .and_then(|r| std::str::from_utf8(r).ok()?.parse::<usize>().ok());
            if let Some(r) = rank.filter(|&r| r < ranks) {
                found[r] = Some(pid);
            }
        }
        if found.iter().all(Option::is_some) {
            return found.into_iter().map(Option::unwrap).collect();
        }
        assert!(
            Instant::now() < deadline,
            "the ranks of mpirun {mpirun_pid} did not appear"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the processes `pids` have exited (gone, or zombies nobody reaps).
fn wait_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for pid in pids {
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(") ")
                .next()
                .and_then(|r| r.split(' ').next())
                .unwrap_or("");
            if stat.is_empty() || state == "Z" || state == "X" {
                break;
            }
            assert!(Instant::now() < deadline, "rank {pid} did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on processes (or a process group) this test started.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

/// Waits (up to 120 s) until `ready()` holds; panics if the job ends first.
fn wait_until(job: &mut Child, what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready() {
        if let Some(status) = job.try_wait().unwrap() {
            let out = job.stderr.take().map(|mut e| {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut e, &mut s).unwrap();
                s
            });
            panic!("the job ended ({status}) before {what}: {out:?}");
        }
        assert!(Instant::now() < deadline, "{what} did not happen within 120 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for `job` to end, at most `limit`; returns its status, stdout and stderr and how long
/// it took.
fn finish(job: Child, limit: Duration) -> (Output, Duration) {
    let t0 = Instant::now();
    let pid = job.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(job.wait_with_output()));
    match rx.recv_timeout(limit) {
        Ok(out) => (out.unwrap(), t0.elapsed()),
        Err(_) => {
            signal(-(pid as i32), libc::SIGKILL);
            panic!("the job did not end within {limit:?}");
        }
    }
}

/// A 2-rank job trained to the end (`whole`), and the same job started again in the background
/// (`cut`) for a test to interrupt, with its ranks' PIDs.
struct InterruptedJob {
    tmp: tempfile::TempDir,
    cfg: PathBuf,
    whole: PathBuf,
    cut: PathBuf,
    pids: Vec<u32>,
}

impl InterruptedJob {
    /// The finished job, and the running one's mpirun.
    fn start(yaml: &str) -> (Self, Child) {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = write(tmp.path(), "run.yaml", yaml);
        let (whole, cut) = (tmp.path().join("whole"), tmp.path().join("cut"));
        job_ok(
            tmp.path(),
            2,
            &["train", s(&cfg), "--run-dir", s(&whole), "--quiet"],
        );
        let job = spawn_job(
            tmp.path(),
            2,
            &["train", s(&cfg), "--run-dir", s(&cut), "--quiet"],
        );
        let pids = rank_pids(job.id(), 2);
        let finished = InterruptedJob {
            tmp,
            cfg,
            whole,
            cut,
            pids,
        };
        (finished, job)
    }

    /// Resumes the interrupted job and requires the bits of the one never interrupted.
    fn resume_to_the_whole_jobs_bits(&self) {
        job_ok(
            self.tmp.path(),
            2,
            &[
                "train",
                s(&self.cfg),
                "--run-dir",
                s(&self.cut),
                "--resume",
                "--quiet",
            ],
        );
        assert_eq!(newest_weights(&self.cut), newest_weights(&self.whole));
        assert_eq!(records(&self.cut), records(&self.whole));
        assert_eq!(
            summary(&self.cut)["weights_sha256"],
            summary(&self.whole)["weights_sha256"]
        );
    }
}

#[test]
fn a_job_killed_with_kill_9_resumes_to_the_bits_of_one_never_stopped() {
    let _job = one_job();
    let (j, mut job) = InterruptedJob::start(&seq2seq_yaml(120, 10, 5));
    wait_until(&mut job, "the checkpoint of step 10", || {
        checkpoints(&j.cut).iter().any(|(s, _)| *s >= 10)
    });
    // The whole job at once, mid-step, as a node failure or `scancel -s KILL` would: the
    // ranks (each in a process group of its own) and mpirun.
    for &pid in &j.pids {
        signal(pid as i32, libc::SIGKILL);
    }
    signal(-(job.id() as i32), libc::SIGKILL);
    let _ = job.wait();
    wait_gone(&j.pids);
    let (step, _) = checkpoints(&j.cut).pop().unwrap();
    assert!(step < 120, "killed before the end (at checkpoint {step})");
    j.resume_to_the_whole_jobs_bits();
}

#[test]
fn a_stop_signal_to_one_rank_stops_every_rank_after_the_same_step_and_the_job_resumes_exactly() {
    let _job = one_job();
    let (j, mut job) = InterruptedJob::start(&seq2seq_yaml(300, 0, 1000));
    wait_until(&mut job, "step 5", || logged_steps(&j.cut).len() >= 5);
    // SIGTERM to rank 1 alone: rank 0 hears of it in the step's collective.
    signal(j.pids[1] as i32, libc::SIGTERM);
    let (out, _) = finish(job, Duration::from_secs(120));
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    assert!(stderr.contains("--resume"), "says how to resume: {stderr}");
    let stopped = summary(&j.cut);
    assert_eq!(stopped["interrupted"], "SIGTERM");
    let step = stopped["steps"].as_u64().unwrap();
    assert!(step < 300, "stopped early (after step {step})");
    // Rank 0 checkpointed the step both ranks finished, and the weights were checked equal.
    assert_eq!(checkpoints(&j.cut).last().unwrap().0, step);
    assert_eq!(stopped["world_size"], 2);
    j.resume_to_the_whole_jobs_bits();
}

/// A 2-rank job that would train for ever (a checkpoint every `checkpoint_every` steps), started
/// in the background with `extra` arguments and past its third step, with its ranks' PIDs.
struct EndlessJob {
    tmp: tempfile::TempDir,
    cfg: PathBuf,
    run_dir: PathBuf,
    pids: Vec<u32>,
}

impl EndlessJob {
    fn start(checkpoint_every: u64, extra: &[&str]) -> (Self, Child) {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = write(tmp.path(), "run.yaml", seq2seq_yaml(100_000, 0, checkpoint_every));
        let run_dir = tmp.path().join("run");
        let mut args = vec!["train", s(&cfg), "--run-dir", s(&run_dir), "--quiet"];
        args.extend_from_slice(extra);
        let mut job = spawn_job(tmp.path(), 2, &args);
        let pids = rank_pids(job.id(), 2);
        wait_until(&mut job, "step 3", || logged_steps(&run_dir).len() >= 3);
        let started = EndlessJob {
            tmp,
            cfg,
            run_dir,
            pids,
        };
        (started, job)
    }
}

#[test]
fn a_rank_killed_mid_run_ends_the_job_at_once_with_a_message_naming_it() {
    let _job = one_job();
    let (j, job) = EndlessJob::start(1000, &[]);
    signal(j.pids[1] as i32, libc::SIGKILL);
    // mpirun sees the rank die and ends the job (well within distributed.timeout_secs).
    let (out, took) = finish(job, Duration::from_secs(60));
    assert!(!out.status.success());
    let said = text(&out.stderr) + &text(&out.stdout);
    assert!(said.contains("rank 1"), "names the rank: {said}");
    assert!(took < Duration::from_secs(30), "ended in {took:?}");
}

#[test]
fn a_rank_that_hangs_ends_the_job_after_the_collective_timeout() {
    let _job = one_job();
    let (j, job) = EndlessJob::start(2, &["--set", "distributed.timeout_secs=3"]);
    // A rank that stops responding (SIGSTOP: alive, so the launcher sees nothing wrong).
    signal(j.pids[1] as i32, libc::SIGSTOP);
    let (out, took) = finish(job, Duration::from_secs(90));
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("rank 0:"), "{stderr}");
    assert!(stderr.contains("did not take part within 3 s"), "{stderr}");
    assert!(took < Duration::from_secs(60), "ended in {took:?}");
    // What was saved is intact: the run resumes, alone (so split another way), for 2 more steps.
    let (saved, _) = checkpoints(&j.run_dir)
        .pop()
        .expect("a checkpoint before the hang");
    let steps = format!("train.steps={}", saved + 2);
    let out = ok_output(
        j.tmp.path(),
        &[
            "train",
            s(&j.cfg),
            "--run-dir",
            s(&j.run_dir),
            "--resume",
            "--set",
            &steps,
            "--quiet",
        ],
    );
    assert!(
        // 2 ranks of the default 2 shares; alone, the default 2.
        text(&out.stderr).contains("split 4 way(s) (ranks x train.shares), this run splits them 2"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(summary(&j.run_dir)["steps"].as_u64(), Some(saved + 2));
}

#[test]
fn a_job_resumes_a_single_process_checkpoint_and_continues_the_same_data() {
    let _job = one_job();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "run.yaml", seq2seq_yaml(16, 0, 8));
    let run_dir = tmp.path().join("run");
    ok(
        tmp.path(),
        &[
            "train",
            s(&cfg),
            "--run-dir",
            s(&run_dir),
            "--set",
            "train.steps=8",
            "--quiet",
        ],
    );
    let out = job_ok(
        tmp.path(),
        2,
        &["train", s(&cfg), "--run-dir", s(&run_dir), "--resume"],
    );
    assert!(
        // Alone, the default 2 shares; 2 ranks of 2 shares each.
        text(&out.stderr).contains("split 2 way(s) (ranks x train.shares), this run splits them 4"),
        "{}",
        text(&out.stderr)
    );
    let done = summary(&run_dir);
    assert_eq!(
        (done["steps"].as_u64(), done["resumed_from_step"].as_u64()),
        (Some(16), Some(8))
    );
    // The data position is global: the job's steps 9-16 saw the batches a single process would.
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoints(&run_dir).pop().unwrap().1.join("state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["shares"], 4);
    let tmp2 = tempfile::tempdir().unwrap();
    let alone = tmp2.path().join("alone");
    ok(
        tmp2.path(),
        &["train", s(&cfg), "--run-dir", s(&alone), "--quiet"],
    );
    let alone_state: Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoints(&alone).pop().unwrap().1.join("state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["cursor"], alone_state["cursor"]);
    assert_eq!(state["tokens_seen"], alone_state["tokens_seen"]);
}

/// Needs a running Slurm with the PMIx plugin (`sudo scripts/slurm-local.sh up`, as CI does):
/// `cargo test --release --features distributed --test distributed -- --ignored`.
#[test]
#[ignore = "needs a running Slurm cluster (scripts/slurm-local.sh up)"]
fn srun_starts_a_job_that_trains_as_mpirun_does() {
    let _job = one_job();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "run.yaml", seq2seq_yaml(12, 6, 6));
    let (by_srun, by_mpirun) = (tmp.path().join("srun"), tmp.path().join("mpirun"));
    let out = Command::new("srun")
        .args(["--mpi=pmix", "-n", "2", "--kill-on-bad-exit=1", "--time=5"])
        .arg(env!("CARGO_BIN_EXE_ember"))
        .args(["train", s(&cfg), "--run-dir", s(&by_srun)])
        .current_dir(tmp.path())
        .stdin(Stdio::null())
        .output()
        .expect("srun");
    assert!(
        out.status.success(),
        "srun failed ({}):\n{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("data parallel: 2 ranks (started by PMIx)"),
        "{}",
        text(&out.stdout)
    );
    job_ok(tmp.path(), 2, &["train", s(&cfg), "--run-dir", s(&by_mpirun)]);
    assert_eq!(newest_weights(&by_srun), newest_weights(&by_mpirun));
    assert_eq!(records(&by_srun), records(&by_mpirun));
}

#[test]
fn ctrl_c_on_mpirun_stops_the_job_after_a_step_with_a_checkpoint() {
    let _job = one_job();
    let (j, job) = EndlessJob::start(1000, &[]);
    // mpirun passes SIGINT on to the ranks as SIGTERM.
    signal(job.id() as i32, libc::SIGINT);
    let (out, _) = finish(job, Duration::from_secs(60));
    assert!(!out.status.success());
    let done = summary(&j.run_dir);
    assert_eq!(done["interrupted"], "SIGTERM", "{done}");
    let step = done["steps"].as_u64().unwrap();
    assert_eq!(checkpoints(&j.run_dir).last().unwrap().0, step);
    assert!(text(&out.stderr).contains("--resume"), "{}", text(&out.stderr));
}

#[test]
fn a_set_up_error_ends_every_rank_and_is_said_once() {
    let _job = one_job();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "run.yaml", seq2seq_yaml(10, 0, 5));
    let missing = tmp.path().join("missing");
    let out = mpirun(
        tmp.path(),
        2,
        &["train", s(&cfg), "--run-dir", s(&missing), "--resume"],
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert_eq!(stderr.matches("nothing to resume").count(), 1, "{stderr}");
    assert!(stderr.contains("rank 0 of 2: error"), "{stderr}");
    // Every rank knew, so none had to abort the job.
    assert!(!stderr.contains("MPI_ABORT"), "{stderr}");
}

#[test]
fn a_job_of_one_rank_trains_the_bits_of_a_process_started_alone() {
    let _job = one_job();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "run.yaml", seq2seq_yaml(12, 6, 6));
    let (job, alone) = (tmp.path().join("job"), tmp.path().join("alone"));
    // mpirun -np 1 runs a rank's whole path: shares, MPI's sums (of one), the stop check; even
    // with one share, which a process started alone computes without any of it.
    let one = ["--quiet", "--set", "train.shares=1"];
    let job_args = [&["train", s(&cfg), "--run-dir", s(&job)][..], &one].concat();
    job_ok(tmp.path(), 1, &job_args);
    let alone_args = [&["train", s(&cfg), "--run-dir", s(&alone)][..], &one].concat();
    ok(tmp.path(), &alone_args);
    assert_eq!(records(&job), records(&alone));
    assert_eq!(newest_weights(&job), newest_weights(&alone));
}
