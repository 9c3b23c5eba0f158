//! The study on a cluster: `ember ablate --launcher slurm` plans a sweep as a Slurm job array,
//! `ember ablate DIR --cell I` trains one cell of it, `ember ablate DIR --status` says where the
//! cells stand, and a cell warned with SIGUSR1 saves a checkpoint and is requeued.
//!
//! The first tests need no Slurm (the scripts ember writes, the cell and status commands, bad
//! input). The last one runs the quickstart ablation on a real Slurm — see its doc comment for
//! how it is run, and why it is `#[ignore]`d under a plain `cargo test`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::*;

/// A tiny character-level language model reading `text.txt` in `dir`.
fn lm_yaml(dir: &Path) -> String {
    std::fs::write(
        dir.join("text.txt"),
        "To be, or not to be, that is the question.\n".repeat(40),
    )
    .unwrap();
    format!(
        "model: {{ arch: lm, d_model: 32, n_layers: 1, n_heads: 4, d_ff: 64, max_seq_len: 32 }}\n\
         data:\n  corpus: {{ kind: text, path: {}, val_fraction: 0.1 }}\n  tokenizer: {{ kind: char }}\n\
         train: {{ steps: 4, lr: 3.0e-3, batch_size: 4, block_size: 16, threads: 1, log_every: 1 }}\n\
         eval: {{ every: 0 }}\n",
        dir.join("text.txt").display()
    )
}

fn read_json(path: &Path) -> Value {
    let t = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&t).unwrap()
}

fn status_json(dir: &Path, out: &Path) -> Vec<Value> {
    let v: Value = serde_json::from_str(&ok(dir, &["ablate", s(out), "--status", "--json"])).unwrap();
    v.as_array().unwrap().clone()
}

fn states(cells: &[Value]) -> Vec<String> {
    cells
        .iter()
        .map(|c| c["state"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_slurm_plan_is_an_array_of_the_unfinished_cells_with_a_warning_signal_and_an_afterany_report() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("tiny.yaml"), seq2seq_yaml(4, 0, 2)).unwrap();
    let plan = [
        "ablate",
        "tiny.yaml",
        "--variants",
        "none,rmsnorm",
        "--seeds",
        "1",
        "--out",
        "sweep",
        "--launcher",
        "slurm",
        "--max-parallel",
        "2",
        "--cpus-per-task",
        "1",
        "--time",
        "0:30:00",
        "--partition",
        "debug",
        "--sbatch-arg=--mem=1G",
    ];
    let stdout = ok(tmp.path(), &plan);
    let out = tmp.path().join("sweep");
    // Without --submit: the commands, the array's id feeding the report job's dependency.
    assert!(
        stdout.contains("ARRAY=$(sbatch --parsable sweep/slurm/cells.sbatch)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("sbatch --dependency=afterany:${ARRAY%%;*} sweep/slurm/report.sbatch"),
        "{stdout}"
    );
    let cells = std::fs::read_to_string(out.join("slurm/cells.sbatch")).unwrap();
    for line in [
        "#SBATCH --array=0-1%2",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --time=0:30:00",
        "#SBATCH --partition=debug",
        "#SBATCH --mem=1G",
        "#SBATCH --signal=B:USR1@120",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=sweep/slurm/logs/cell-%a.out",
        &format!("#SBATCH --chdir={}", tmp.path().canonicalize().unwrap().display()),
        "ablate sweep --cell \"$SLURM_ARRAY_TASK_ID\" &",
        "scontrol requeue \"$SLURM_JOB_ID\"",
    ] {
        assert!(cells.contains(line), "{line:?} missing from:\n{cells}");
    }
    let report = std::fs::read_to_string(out.join("slurm/report.sbatch")).unwrap();
    assert!(report.contains("report sweep\n"), "{report}");
    assert_eq!(states(&status_json(tmp.path(), &out)), ["pending", "pending"]);

    // Cell 1 trained on its own (as array task 1 would) is done; the re-planned array leaves it out.
    let cell = ok(tmp.path(), &["ablate", "sweep", "--cell", "1"]);
    assert!(cell.contains("start    rmsnorm-lr3e-3-seed1"), "{cell}");
    assert_eq!(states(&status_json(tmp.path(), &out)), ["pending", "done"]);
    ok(tmp.path(), &plan);
    let cells = std::fs::read_to_string(out.join("slurm/cells.sbatch")).unwrap();
    assert!(cells.contains("#SBATCH --array=0%2\n"), "{cells}");
    // A cell given by name is the same cell; a finished one is skipped, not retrained.
    let again = ok(tmp.path(), &["ablate", "sweep", "--cell", "rmsnorm-lr3e-3-seed1"]);
    assert!(again.contains("skipped  rmsnorm-lr3e-3-seed1"), "{again}");
    ok(tmp.path(), &["ablate", "sweep", "--cell", "0"]);
    let all_done = ok(tmp.path(), &plan);
    assert!(all_done.contains("nothing to submit"), "{all_done}");
}

#[test]
fn sigusr1_stops_a_cell_with_a_checkpoint_and_exit_status_138_and_the_next_attempt_resumes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("tiny.yaml"), seq2seq_yaml(1000, 0, 2)).unwrap();
    ok(
        dir,
        &[
            "ablate",
            "tiny.yaml",
            "--variants",
            "none",
            "--seeds",
            "1",
            "--out",
            "sweep",
            "--launcher",
            "slurm",
        ],
    );
    let out = dir.join("sweep");
    let run_dir = out.join("runs/none-lr3e-3-seed1");
    let mut cell = Command::new(env!("CARGO_BIN_EXE_ember"))
        .current_dir(dir)
        .args(["ablate", "sweep", "--cell", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while logged_steps(&run_dir).len() < 5 {
        assert!(
            cell.try_wait().unwrap().is_none(),
            "the cell ended before its step 5"
        );
        assert!(
            Instant::now() < deadline,
            "the cell did not reach step 5 within 120 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // While it trains, the status says so (the run directory's lock is held).
    assert_eq!(states(&status_json(dir, &out)), ["running"]);
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(cell.id() as i32, libc::SIGUSR1) }, 0);
    let stopped = cell.wait_with_output().unwrap();
    let stderr = text(&stopped.stderr);
    assert_eq!(stopped.status.code(), Some(138), "{stderr}");
    assert!(stderr.contains("interrupted by SIGUSR1"), "{stderr}");
    let cells = status_json(dir, &out);
    assert_eq!(states(&cells), ["interrupted"]);
    let step = cells[0]["step"].as_u64().unwrap();
    assert!(
        (5..1000).contains(&step),
        "stopped mid-run with its step saved: {step}"
    );
    let summary = read_json(&run_dir.join("summary.json"));
    assert_eq!(summary["interrupted"], "SIGUSR1", "{summary}");

    let again = ok(dir, &["ablate", "sweep", "--cell", "0"]);
    assert!(
        again.contains(&format!("resume   none-lr3e-3-seed1 (from step {step})")),
        "{again}"
    );
    assert_eq!(states(&status_json(dir, &out)), ["done"]);
}

#[test]
fn a_cell_that_fails_is_recorded_as_failed_in_the_status_and_the_report() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("lm.yaml"), lm_yaml(tmp.path())).unwrap();
    ok(
        tmp.path(),
        &[
            "ablate",
            "lm.yaml",
            "--variants",
            "none",
            "--seeds",
            "1",
            "--out",
            "sweep",
            "--launcher",
            "slurm",
        ],
    );
    // The data vanishes between planning and the cell's turn (a scratch disk wiped, say).
    std::fs::remove_file(tmp.path().join("text.txt")).unwrap();
    let err = fails(tmp.path(), &["ablate", "sweep", "--cell", "0"]);
    assert!(
        err.contains("cell 0 (none-lr3e-3-seed1) failed") && err.contains("ablate-stderr.log"),
        "{err}"
    );
    let out = tmp.path().join("sweep");
    let cells = status_json(tmp.path(), &out);
    assert_eq!(states(&cells), ["failed"]);
    assert!(
        cells[0]["detail"].as_str().unwrap().contains("exit status 1"),
        "{cells:?}"
    );
    ok(tmp.path(), &["report", "sweep"]);
    let report = read_json(&out.join("report.json"));
    assert_eq!(report["runs"][0]["status"], "failed", "{report}");
    assert_eq!(report["counts"]["failed"], 1, "{report}");
    assert!(
        report["runs"][0]["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("text.txt"),
        "the cause is in the report: {report}"
    );
}

#[test]
fn bad_cluster_flags_and_directories_get_errors_naming_the_flag_or_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("tiny.yaml"), seq2seq_yaml(2, 0, 2)).unwrap();
    let base = [
        "ablate",
        "tiny.yaml",
        "--variants",
        "none",
        "--seeds",
        "1",
        "--out",
        "sweep",
    ];
    fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [base, extra].concat()
    }

    let e = fails(dir, &with(&base, &["--partition", "gpu"]));
    assert!(e.contains("add --launcher slurm"), "{e}");
    let e = fails(dir, &with(&base, &["--launcher", "slurm", "--jobs", "2"]));
    assert!(e.contains("--max-parallel"), "{e}");
    let e = fails(dir, &with(&base, &["--launcher", "slurm", "--time", "two hours"]));
    assert!(e.contains("--time") && e.contains("2:00:00"), "{e}");
    let e = fails(dir, &with(&base, &["--launcher", "slurm", "--max-parallel", "0"]));
    assert!(e.contains("--max-parallel must be at least 1"), "{e}");
    let e = fails(
        dir,
        &with(&base, &["--launcher", "slurm", "--sbatch-arg", "mem=4G"]),
    );
    assert!(e.contains("--sbatch-arg"), "{e}");
    let e = fails(dir, &with(&base, &["--launcher", "pbs"]));
    assert!(e.contains("--launcher"), "{e}");

    let e = fails(dir, &["ablate", "nowhere", "--status"]);
    assert!(
        e.contains("nowhere/grid.json") && e.contains("plan it first"),
        "{e}"
    );
    let e = fails(dir, &["ablate", "nowhere", "--cell", "0"]);
    assert!(e.contains("nowhere/grid.json"), "{e}");
    ok(dir, &with(&base, &["--launcher", "slurm"]));
    let e = fails(dir, &["ablate", "sweep", "--cell", "7"]);
    assert!(e.contains("--cell \"7\"") && e.contains("numbered 0 to 0"), "{e}");
    let e = fails(dir, &["ablate", "sweep", "--cell", "l2-lr1-seed9"]);
    assert!(e.contains("--status"), "{e}");
    // Grid flags belong to planning, not to a planned cell.
    let e = fails(dir, &["ablate", "sweep", "--cell", "0", "--seeds", "3"]);
    assert!(e.contains("--seeds"), "{e}");
    std::fs::write(dir.join("sweep/grid.json"), "{ not json").unwrap();
    let e = fails(dir, &["ablate", "sweep", "--status"]);
    assert!(e.contains("grid.json is not a plan ember wrote"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// On a real Slurm.

/// The quickstart ablation, shortened: 2 variants × 3 seeds at lr 1e-2, 40 steps each, of the
/// 2+2-layer model at 2,048 tokens a step (its steps are slow enough that cell 0 is still
/// training when the test warns it).
const QUICK: [&str; 16] = [
    "--variants",
    "none,rmsnorm",
    "--lrs",
    "1e-2",
    "--set",
    "train.steps=40",
    "--set",
    "eval.every=20",
    "--set",
    "checkpoint.every=10",
    "--set",
    "train.log_every=5",
    "--set",
    "model.n_layers=2",
    "--set",
    "train.max_tokens=2048",
];

fn quickstart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/quickstart.yaml")
}

fn cmd(program: &str, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {program} ({e}): this test needs a running Slurm. Start the one-node \
                 cluster with `sudo scripts/slurm-local.sh up` (CI's .ci/run does), then run \
                 `cargo test --release --test slurm -- --ignored`"
        )
    })
}

/// `scontrol show job ID`'s `Key=Value` field.
fn job_field(job: &str, key: &str) -> Option<String> {
    let out = cmd("scontrol", &["show", "job", "-o", job]);
    let t = text(&out.stdout);
    t.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_string))
}

/// Polls (every 200 ms, at most 15 minutes) until `ready()`; on timeout, fails with `logs`.
fn wait_for(what: &str, logs: &Path, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(900);
    while !ready() {
        if Instant::now() > deadline {
            let q = cmd("squeue", &["-a"]);
            panic!(
                "{what} did not happen within 15 minutes.\nsqueue:\n{}\nlogs in {}:\n{}",
                text(&q.stdout),
                logs.display(),
                all_logs(logs)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn all_logs(dir: &Path) -> String {
    let mut s = String::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        s += &format!(
            "--- {}\n{}\n",
            e.path().display(),
            std::fs::read_to_string(e.path()).unwrap_or_default()
        );
    }
    s
}

fn final_weights(run_dir: &Path) -> Vec<u8> {
    let mut ckpts: Vec<PathBuf> = std::fs::read_dir(run_dir.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("state.json").is_file())
        .collect();
    ckpts.sort();
    std::fs::read(ckpts.last().expect("a checkpoint").join("model.safetensors")).unwrap()
}

/// report.json without what measures the machine rather than the experiment: wall and training
/// times, throughput (per run, per cell, and its paired difference), the hardware, how many
/// invocations and where the directory is.
fn experiment_only(mut report: Value) -> Value {
    for key in [
        "out_dir",
        "wall_secs",
        "train_secs",
        "invocations",
        "hardware",
        "jobs",
    ] {
        report.as_object_mut().unwrap().remove(key);
    }
    // The command names the sweep's own copy of the base config, under the sweep (`OUT/base.yaml`,
    // so that a moved sweep still finds it): where the sweep lies, like out_dir.
    let config = &mut report["base_command"][2];
    let in_sweep = Path::new(config.as_str().unwrap())
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    *config = Value::String(format!("OUT/{in_sweep}"));
    for run in report["runs"].as_array_mut().unwrap() {
        for key in ["tokens_per_sec", "train_secs"] {
            run.as_object_mut().unwrap().remove(key);
        }
    }
    for cell in report["cells"].as_array_mut().unwrap() {
        cell.as_object_mut().unwrap().remove("tokens_per_sec");
        cell["vs_none"].as_object_mut().unwrap().remove("tokens_per_sec");
    }
    report
}

/// The paths at which two JSON values differ.
fn differences(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (u, v) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                differences(&format!("{prefix}.{k}"), u, v, out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                differences(&format!("{prefix}[{i}]"), u, v, out);
            }
        }
        _ if a != b => out.push(prefix.to_string()),
        _ => {}
    }
}

/// The quickstart ablation (2 variants × 3 seeds, shortened to 40 steps) submitted as a Slurm
/// job array gives a report.json equal, number for number, to a local `ember ablate` of the same
/// plan; and cell 0, sent Slurm's warning signal (SIGUSR1 to its batch shell, as
/// `--signal=B:USR1@120` does before a time limit) mid-run, saves a checkpoint, is requeued,
/// resumes, and ends with weights bit-identical to the uninterrupted local run.
///
/// It needs a running Slurm, so a plain `cargo test` (the README's test command, on any fresh
/// machine) lists it as ignored with the reason instead of failing where Slurm cannot be
/// installed (no root, no apt). It is not skipped where it matters: CI's `.ci/run` starts the
/// one-node cluster with `scripts/slurm-local.sh up` (which installs the Debian packages, and
/// fails CI if it cannot) and then runs `cargo test --release --test slurm -- --ignored`;
/// without a reachable Slurm the test fails, naming the command that starts one.
#[test]
#[ignore = "needs a running Slurm: `sudo scripts/slurm-local.sh up`, then `cargo test --release --test slurm -- --ignored` (CI's .ci/run does both)"]
fn the_quickstart_ablation_as_a_slurm_array_equals_a_local_sweep_and_a_warned_cell_is_requeued_bit_identical()
{
    let sinfo = cmd("sinfo", &["-h", "-o", "%T"]);
    assert!(
        sinfo.status.success() && !text(&sinfo.stdout).trim().is_empty(),
        "Slurm does not answer (sinfo: {}): start it with `sudo scripts/slurm-local.sh up`",
        text(&sinfo.stderr).trim()
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let config = quickstart();
    let grid = |out: &str| -> Vec<String> {
        let mut a: Vec<String> = ["ablate", s(&config), "--out", out, "--quiet"]
            .iter()
            .map(|x| x.to_string())
            .collect();
        a.extend(QUICK.iter().map(|x| x.to_string()));
        a
    };
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }

    // On Slurm, 2 cells at a time with one CPU each.
    let mut slurm = grid("cluster");
    slurm.extend(
        [
            "--launcher",
            "slurm",
            "--max-parallel",
            "2",
            "--cpus-per-task",
            "1",
            "--submit",
            "--json",
        ]
        .map(String::from),
    );
    let submitted: Value = serde_json::from_str(&ok(dir, &args(&slurm))).unwrap();
    let array = submitted["array_job"].as_str().unwrap().to_string();
    let report_job = submitted["report_job"].as_str().unwrap().to_string();
    assert_eq!(submitted["array"], "0-5");
    let cluster = dir.join("cluster");
    let logs = cluster.join("slurm/logs");

    // Cell 0 past its first checkpoint (step 10) and still training: the warning, to the batch
    // shell only, as slurmd sends it before a time limit (`--signal=B:USR1@120`). Sent with
    // kill(2) to the shell's pid, which the script logs: `scancel --batch --signal=USR1` does
    // the same, but retries every 5 s while the job changes state — and the requeue is such a
    // change, so it also warned the second attempt.
    let cell0 = cluster.join("runs/none-lr1e-2-seed1");
    wait_for("cell 0's step 15", &logs, || {
        logged_steps(&cell0).iter().any(|&s| s >= 15)
    });
    let log0 = std::fs::read_to_string(logs.join("cell-0.out")).unwrap();
    let shell: i32 = log0
        .split("batch shell pid ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no batch shell pid in cell-0.out:\n{log0}"));
    // SAFETY: kill(2) with a pid and a signal number; no memory is involved.
    assert_eq!(
        unsafe { libc::kill(shell, libc::SIGUSR1) },
        0,
        "the batch shell {shell} is gone"
    );
    let task0 = format!("{array}_0");

    // The local sweep meanwhile (it competes for the 2 cores; the results do not depend on it).
    let mut local = grid("local");
    local.extend(["--jobs", "2", "--threads", "1"].map(String::from));
    ok(dir, &args(&local));

    wait_for("the report job's end", &logs, || {
        matches!(
            job_field(&report_job, "JobState").as_deref(),
            Some("COMPLETED" | "FAILED" | "CANCELLED" | "TIMEOUT")
        )
    });
    assert_eq!(
        job_field(&report_job, "JobState").as_deref(),
        Some("COMPLETED"),
        "{}",
        all_logs(&logs)
    );

    // The warned cell: stopped at a step boundary with a checkpoint, requeued by its script,
    // resumed by the second attempt, finished.
    let log0 = std::fs::read_to_string(logs.join("cell-0.out")).unwrap();
    assert!(log0.contains("stopped by SIGUSR1 with a checkpoint"), "{log0}");
    assert!(log0.contains("ember exited 138"), "{log0}");
    assert!(log0.contains("requeueing"), "{log0}");
    assert!(
        log0.contains("attempt 2") && !log0.contains("attempt 3"),
        "{log0}"
    );
    assert!(log0.contains("resume   none-lr1e-2-seed1 (from step"), "{log0}");
    assert_eq!(job_field(&task0, "Restarts").as_deref(), Some("1"));
    assert_eq!(
        final_weights(&cell0),
        final_weights(&dir.join("local/runs/none-lr1e-2-seed1")),
        "the requeued cell's final weights differ from the uninterrupted local run's"
    );
    let steps = logged_steps(&cell0);
    assert!(
        steps.windows(2).all(|w| w[0] < w[1]) && steps.last() == Some(&40),
        "every step logged once, up to the last: {steps:?}"
    );

    // The report job's report.json equals the local one, number for number, but for the
    // machine's measurements (printed for the record: run with --nocapture to see them).
    let (c, l) = (
        read_json(&cluster.join("report.json")),
        read_json(&dir.join("local/report.json")),
    );
    let mut differ = vec![];
    differences("", &c, &l, &mut differ);
    println!(
        "report.json, Slurm array vs local sweep: {} fields differ: {differ:?}",
        differ.len()
    );
    let (c, l) = (experiment_only(c), experiment_only(l));
    let mut differ = vec![];
    differences("", &c, &l, &mut differ);
    println!(
        "...and {} once the machine's measurements are left out",
        differ.len()
    );
    assert_eq!(c["counts"]["ok"], 6, "{c}");
    assert_eq!(
        serde_json::to_string_pretty(&c).unwrap(),
        serde_json::to_string_pretty(&l).unwrap()
    );
    let status = ok(dir, &["ablate", "cluster", "--status"]);
    assert!(status.contains("6 cells: 6 done"), "{status}");
}
