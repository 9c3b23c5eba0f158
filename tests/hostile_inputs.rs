//! The hostile-input probe, in the suite: a table of invocations of the real `ember` binary
//! that a careless or adversarial user might type — outputs that are inputs or devices, lock
//! files that are links, checkpoints whose state lies, sizes that cannot fit, sweeps too large
//! to plan, YAML the parser refuses for its own reasons, files that are not what they seem.
//!
//! Every case must end as the table says — a correct success, or a clear refusal — and in
//! every case:
//! - the process exits 0, 1 or 2 (no panic, no allocation abort, no death by signal) within
//!   its time limit (no hang);
//! - a refusal names the offending input (the file, key or flag in the table), in a short
//!   message without Rust Debug output or a library's advice;
//! - nothing outside the directories the case may write changes: not the inputs, not the run
//!   it reads, not the file a link points at, not `/dev/null`.
//!
//! Each case runs in a fresh copy of one fixture (a trained tiny language model and its
//! files), so they cannot disturb each other; the table takes about 20 s on 2 cores, plus 20 s
//! for each FIFO that nothing writes into (the documented wait). The cases of imported and
//! packaged models, import folders, vector units, launchers and moved sweeps are in
//! `hostile_inputs/models_and_sweeps.rs`.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;
use common::*;

// The config the cases train, shared with the config specifications of ember-trainer (whose
// schema test checks the JSON Schema's verdict on these same configs).
#[path = "../crates/trainer/tests/config_cases/mod.rs"]
mod config_cases;
use config_cases::LM;

#[path = "hostile_inputs/models_and_sweeps.rs"]
mod models_and_sweeps;

const TEXT: &str = "First Citizen:\nBefore we proceed any further, hear me speak.\n";

/// The fine-tune of the fixture: the exported run (`hf/`) as its starting point.
const FT: &str = "\
model: { init_from: hf }
data:
  corpus: { kind: text, path: text.txt, val_fraction: 0.2 }
train: { steps: 2, lr: 3.0e-3, batch_size: 2, block_size: 8, threads: 1, log_every: 1 }
eval: { every: 0 }
checkpoint: { every: 2, keep_last: 3 }
";

/// The fixture every case copies: `lm.yaml`, `text.txt`, `in.txt`, `ref.txt`, a file a link
/// may point at (`precious.txt`), `run/`, the model trained from `lm.yaml` (checkpoints at
/// steps 2 and 4), `hf/`, that run exported for transformers, and `ft/`, trained from `ft.yaml`
/// (`model.init_from: hf`).
fn fixture() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        write(p, "lm.yaml", LM);
        write(p, "text.txt", TEXT.repeat(20));
        write(p, "in.txt", TEXT.repeat(3));
        write(p, "ref.txt", "a cat sat\non the mat\n");
        write(p, "hyp.txt", "a cat sat\n");
        write(p, "precious.txt", "the user's own file\n");
        ok(p, &["train", "lm.yaml", "--run-dir", "run", "--quiet"]);
        ok(p, &["export", "run", "hf"]);
        write(p, "ft.yaml", FT);
        ok(p, &["train", "ft.yaml", "--run-dir", "ft", "--quiet"]);
        dir
    })
    .path()
}

/// What a case must end with.
enum Expect {
    /// Exit 0, and stderr says each of these (a warning, say).
    Ok(&'static [&'static str]),
    /// Exit 1 or 2, and the message names each of these.
    Refused(&'static [&'static str]),
}

struct Case {
    name: &'static str,
    args: Vec<String>,
    expect: Expect,
    /// Paths (relative to the case's directory) the command may create or change.
    writable: &'static [&'static str],
    /// Prepares the case's copy of the fixture.
    setup: fn(&Path),
    /// Checks what the command left (beyond the table's rules).
    after: fn(&Path, &Output),
    /// Environment variables the command runs with.
    env: &'static [(&'static str, &'static str)],
}

fn nothing(_: &Path) {}
fn no_check(_: &Path, _: &Output) {}

fn case(name: &'static str, args: &[&str], expect: Expect, writable: &'static [&'static str]) -> Case {
    Case {
        name,
        args: args.iter().map(|a| a.to_string()).collect(),
        expect,
        writable,
        setup: nothing,
        after: no_check,
        env: &[],
    }
}

impl Case {
    fn setup(self, setup: fn(&Path)) -> Self {
        Case { setup, ..self }
    }
    fn after(self, after: fn(&Path, &Output)) -> Self {
        Case { after, ..self }
    }
    fn env(self, env: &'static [(&'static str, &'static str)]) -> Self {
        Case { env, ..self }
    }
}

fn cases() -> Vec<Case> {
    use Expect::*;
    let huge_grid: Vec<String> = (0..6)
        .flat_map(|a| {
            let levels: Vec<String> = (0..10).map(|l| format!("v{l}")).collect();
            ["--grid".to_string(), format!("model.k{a}={}", levels.join(","))]
        })
        .collect();
    let mut grid_args = vec!["ablate", "lm.yaml", "--out", "sweep"];
    grid_args.extend(huge_grid.iter().map(String::as_str));
    let long_set = format!("train.lr={}", "ab ".repeat(35_000));
    let long_word = "a".repeat(100_000);
    let long_key = format!("model.{long_word}=1");
    let long_grid = format!("{long_word}=1,2");
    let mut cases = vec![
        // Outputs that are not what the user asked to be written.
        case(
            "tokenize over its input",
            &["tokenize", "run", "in.txt", "in.txt"],
            Refused(&["in.txt", "OUTPUT"]),
            &[],
        ),
        case(
            "tokenize over the tokenizer",
            &["tokenize", "run", "in.txt", "run/tokenizer.json"],
            Refused(&["tokenizer.json"]),
            &[],
        ),
        case(
            "tokenize into /dev/null",
            &["tokenize", "run", "in.txt", "/dev/null"],
            Refused(&["/dev/null", "special file"]),
            &[],
        )
        .after(|_, _| {
            use std::os::unix::fs::FileTypeExt;
            let kind = std::fs::metadata("/dev/null").unwrap().file_type();
            assert!(kind.is_char_device(), "/dev/null is still the device");
        }),
        case(
            "tokenize into a folder",
            &["tokenize", "run", "in.txt", "run"],
            Refused(&["run", "folder"]),
            &[],
        ),
        case(
            "tokenize /dev/zero",
            &["tokenize", "run", "/dev/zero", "out.bin"],
            Refused(&["/dev/zero", "device"]),
            &["out.bin"],
        ),
        case(
            "tokenize unknown characters",
            &["tokenize", "run", "in.txt", "out.bin"],
            Ok(&["<unk>"]),
            &["out.bin"],
        )
        .setup(|d| std::fs::write(d.join("in.txt"), "Ωmega ☃ snow\n").unwrap()),
        case(
            "tokenize into a link to another file",
            &["tokenize", "run", "in.txt", "link.bin"],
            Refused(&["OUTPUT", "link.bin", "symbolic link"]),
            &[],
        )
        .setup(|d| std::os::unix::fs::symlink("precious.txt", d.join("link.bin")).unwrap()),
        case(
            "tokenize into a dangling link",
            &["tokenize", "run", "in.txt", "dangling.bin"],
            Refused(&["dangling.bin", "symbolic link"]),
            &[],
        )
        .setup(|d| std::os::unix::fs::symlink("nowhere.bin", d.join("dangling.bin")).unwrap())
        .after(|d, _| {
            assert!(
                !d.join("nowhere.bin").exists(),
                "nothing written through the link"
            )
        }),
        case(
            "tokenize into a link to stdout",
            &["tokenize", "run", "in.txt", "stdout.bin"],
            Refused(&["stdout.bin", "symbolic link"]),
            &[],
        )
        .setup(|d| std::os::unix::fs::symlink("/dev/stdout", d.join("stdout.bin")).unwrap()),
        case(
            "eval --output into a link",
            &["eval", "run", "--output", "link.json"],
            Refused(&["--output", "link.json", "symbolic link"]),
            &[],
        )
        .setup(|d| std::os::unix::fs::symlink("precious.txt", d.join("link.json")).unwrap()),
        case(
            "export into another run",
            &["export", "run", "other"],
            Refused(&["other", "run directory"]),
            &[],
        )
        .setup(|d| {
            // Another run, with a tokenizer of its own that the export would replace.
            copy_dir(&d.join("run"), &d.join("other"));
            std::fs::write(d.join("other/tokenizer.json"), "{\"its own\": true}").unwrap();
        }),
        case(
            "export through a link in its folder",
            &["export", "run", "out"],
            Refused(&["out/config.json", "symbolic link", "already exists"]),
            &[],
        )
        .setup(|d| {
            std::fs::create_dir(d.join("out")).unwrap();
            std::os::unix::fs::symlink("../precious.txt", d.join("out/config.json")).unwrap();
        }),
        case("export", &["export", "run", "hf2"], Ok(&[]), &["hf2"]),
        case(
            "export into the run",
            &["export", "run", "run"],
            Refused(&["run directory"]),
            &[],
        ),
        case("package", &["package", "run", "released"], Ok(&[]), &["released"]),
        case(
            "package into a folder that exists",
            &["package", "run", "run"],
            Refused(&["run", "already exists", "run directory"]),
            &[],
        ),
        case(
            "package into a dangling link",
            &["package", "run", "dangling"],
            Refused(&["dangling", "already exists"]),
            &[],
        )
        .setup(|d| std::os::unix::fs::symlink("nowhere", d.join("dangling")).unwrap())
        .after(|d, _| assert!(!d.join("nowhere").exists(), "nothing written through the link")),
        case(
            "package under a file",
            &["package", "run", "precious.txt/model"],
            Refused(&["precious.txt"]),
            &[],
        ),
        case(
            "package a folder that is no run",
            &["package", "in.txt", "released"],
            Refused(&["in.txt", "run directory"]),
            &[],
        ),
        case(
            "generate from a model folder whose manifest lies",
            &["generate", "released", "--max-tokens", "4"],
            Refused(&["released/model.json"]),
            &["released"],
        )
        .setup(|d| {
            ok(d, &["package", "run", "released"]);
            std::fs::write(d.join("released/model.json"), "{\"format\": \"ember-model\"}").unwrap();
        }),
        case(
            "eval --output over the config",
            &["eval", "run", "--output", "run/config.yaml"],
            Refused(&["--output", "config.yaml"]),
            &[],
        ),
        // Files in the run directory that are not what they seem.
        case(
            "a lock that is a link",
            &["train", "lm.yaml", "--run-dir", "run", "--resume"],
            Refused(&[".lock", "symbolic link"]),
            &[],
        )
        .setup(|d| {
            std::fs::remove_file(d.join("run/.lock")).ok();
            std::os::unix::fs::symlink(d.join("precious.txt"), d.join("run/.lock")).unwrap();
        }),
        case(
            "a lock that is a hard link",
            &["train", "lm.yaml", "--run-dir", "run", "--resume"],
            Refused(&[".lock", "hard link"]),
            &[],
        )
        .setup(|d| {
            std::fs::remove_file(d.join("run/.lock")).ok();
            std::fs::hard_link(d.join("precious.txt"), d.join("run/.lock")).unwrap();
        }),
        case(
            "a state.json of another step",
            &[
                "train",
                "lm.yaml",
                "--run-dir",
                "run",
                "--resume",
                "--set",
                "train.steps=8",
            ],
            Refused(&["state.json", "step 2", "--fallback"]),
            &["run/.lock"],
        )
        .setup(|d| {
            let path = d.join("run/checkpoints/step-00000004/state.json");
            let text = std::fs::read_to_string(&path)
                .unwrap()
                .replacen("\"step\": 4", "\"step\": 2", 1);
            std::fs::write(path, text).unwrap();
        }),
        case(
            "a metrics log that is a FIFO",
            &[
                "train",
                "lm.yaml",
                "--run-dir",
                "run",
                "--resume",
                "--set",
                "train.steps=6",
            ],
            Refused(&["metrics.jsonl", "not a regular file"]),
            &["run"],
        )
        .setup(|d| {
            std::fs::remove_file(d.join("run/metrics.jsonl")).unwrap();
            mkfifo(&d.join("run/metrics.jsonl"));
        }),
        case(
            "a token cache that is a FIFO",
            &[
                "train",
                "lm.yaml",
                "--run-dir",
                "run",
                "--resume",
                "--set",
                "train.steps=6",
                "--quiet",
            ],
            Ok(&[]),
            &["run"],
        )
        .setup(|d| {
            std::fs::remove_file(d.join("run/token-cache.bin")).unwrap();
            mkfifo(&d.join("run/token-cache.bin"));
        }),
        case(
            "run files that are links",
            &[
                "train",
                "lm.yaml",
                "--run-dir",
                "run",
                "--resume",
                "--set",
                "train.steps=6",
                "--quiet",
            ],
            Ok(&[]),
            &["run"],
        )
        .setup(|d| {
            for name in ["metrics.csv", "summary.json", "token-cache.bin"] {
                std::fs::remove_file(d.join("run").join(name)).unwrap();
                std::os::unix::fs::symlink("../precious.txt", d.join("run").join(name)).unwrap();
            }
        }),
        case(
            "a run directory that is a checkpoint",
            &["train", "lm.yaml", "--run-dir", "run/checkpoints/step-00000004"],
            Refused(&["--run-dir", "step-00000004", "a checkpoint"]),
            &[],
        ),
        case(
            "a run directory inside a run's checkpoints",
            &["train", "lm.yaml", "--run-dir", "run/checkpoints/new"],
            Refused(&["--run-dir", "inside the checkpoints of the run"]),
            &[],
        ),
        case(
            "a run directory that is a sweep",
            &["train", "lm.yaml", "--run-dir", "sweep"],
            Refused(&["--run-dir", "sweep", "grid.json"]),
            &[],
        )
        .setup(|d| {
            ok(
                d,
                &[
                    "ablate",
                    "lm.yaml",
                    "--launcher",
                    "slurm",
                    "--variants",
                    "none",
                    "--seeds",
                    "1",
                    "--out",
                    "sweep",
                ],
            );
        }),
        case(
            "a sweep into a run directory",
            &[
                "ablate",
                "lm.yaml",
                "--variants",
                "none",
                "--seeds",
                "1",
                "--out",
                "run",
            ],
            Refused(&["--out", "run", "training run's directory"]),
            &[],
        ),
        case(
            "average more than kept",
            &["average", "run", "--last", "5"],
            Refused(&["--last", "2 checkpoint"]),
            &["run"],
        ),
        case("average", &["average", "run", "--last", "2"], Ok(&[]), &["run"]),
        // Sizes: refused before anything is allocated or enumerated.
        case(
            "a context longer than the data",
            &["eval", "run", "--context", "65536", "--max-windows", "1"],
            Refused(&["--context 65536", "fewer than one window"]),
            &[],
        ),
        case(
            "a context that cannot fit",
            &["eval", "big", "--context", "65536", "--max-windows", "1"],
            Refused(&["--context 65536", "GiB of memory", "fits here"]),
            &[],
        )
        .setup(|d| {
            // Enough validation text for a window of 65,536 tokens, and 8 heads: the scores of
            // one window alone (8 × 65536² floats, 128 GiB) fit no test machine.
            std::fs::write(d.join("big.txt"), TEXT.repeat(6_000)).unwrap();
            let cfg = LM
                .replace("text.txt", "big.txt")
                .replace("n_heads: 2", "n_heads: 8")
                .replace("steps: 4", "steps: 1");
            std::fs::write(d.join("big.yaml"), cfg).unwrap();
            ok(d, &["train", "big.yaml", "--run-dir", "big", "--quiet"]);
        }),
        case(
            "a grid of a million cells",
            &grid_args,
            Refused(&["12000000 cells", "10 levels of --grid model.k0"]),
            &["sweep"],
        ),
        case(
            "2^64-1 seeds",
            &[
                "ablate",
                "lm.yaml",
                "--seeds",
                "18446744073709551615",
                "--out",
                "sweep",
            ],
            Refused(&["seed", "cells"]),
            &["sweep"],
        ),
        case(
            "2^64-1 threads",
            &[
                "ablate",
                "lm.yaml",
                "--variants",
                "none",
                "--seeds",
                "1",
                "--threads",
                "18446744073709551615",
                "--out",
                "sweep",
            ],
            Refused(&["--threads"]),
            &["sweep"],
        ),
        case(
            "100,000 jobs",
            &["ablate", "lm.yaml", "--jobs", "100000", "--out", "sweep"],
            Refused(&["--jobs"]),
            &["sweep"],
        ),
        case(
            "2^64-1 CPUs per Slurm task",
            &[
                "ablate",
                "lm.yaml",
                "--launcher",
                "slurm",
                "--cpus-per-task",
                "18446744073709551615",
                "--out",
                "sweep",
            ],
            Refused(&["--cpus-per-task"]),
            &["sweep"],
        ),
        case(
            "100,000 layers",
            &[
                "train",
                "lm.yaml",
                "--set",
                "model.n_layers=100000",
                "--run-dir",
                "new",
            ],
            Refused(&["model.n_layers", "1024"]),
            &["new"],
        ),
        case(
            "10^8 positions",
            &[
                "train",
                "lm.yaml",
                "--set",
                "model.max_seq_len=100000000",
                "--run-dir",
                "new",
            ],
            Refused(&["model.max_seq_len", "1048576"]),
            &["new"],
        ),
        case(
            "a vocabulary of 2^32 BPE tokens",
            &[
                "train",
                "lm.yaml",
                "--set",
                "data.tokenizer.kind=bpe",
                "--set",
                "data.tokenizer.vocab_size=4294967296",
                "--run-dir",
                "new",
            ],
            Refused(&["data.tokenizer.vocab_size"]),
            &["new"],
        ),
        // Sweeps named wrongly.
        case(
            "--status of a config",
            &["ablate", "lm.yaml", "--status"],
            Refused(&["lm.yaml", "output directory", "runs/lm-ablation"]),
            &[],
        ),
        case(
            "--status of a training run",
            &["ablate", "run", "--status"],
            Refused(&["run", "training run's directory", "--out of `ember ablate"]),
            &[],
        ),
        case(
            "--cell of nothing planned",
            &["ablate", "nowhere", "--cell", "0"],
            Refused(&["nowhere"]),
            &[],
        ),
        case(
            "a Slurm sweep into a folder with a space",
            &[
                "ablate",
                "lm.yaml",
                "--launcher",
                "slurm",
                "--variants",
                "none",
                "--seeds",
                "1",
                "--out",
                "my sweep",
            ],
            Ok(&[]),
            &["my sweep"],
        )
        .after(|d, _| {
            let script = std::fs::read_to_string(d.join("my sweep/slurm/cells.sbatch")).unwrap();
            let line = script
                .lines()
                .find(|l| l.starts_with("#SBATCH --output="))
                .unwrap();
            assert_eq!(line, "#SBATCH --output=\"my sweep/slurm/logs/cell-%a.out\"");
        }),
        case("a report over links", &["report", "sweep"], Ok(&[]), &["sweep"]).setup(|d| {
            let run = d.join("sweep/runs/none-lr3e-3-seed1");
            copy_dir(&d.join("run"), &run);
            for name in ["report.md", "report.json"] {
                std::os::unix::fs::symlink("../precious.txt", d.join("sweep").join(name)).unwrap();
            }
        }),
        case(
            "report of damaged run files",
            &["report", "sweep"],
            Ok(&["metrics.jsonl", "summary.json", "warning"]),
            &["sweep"],
        )
        .setup(|d| {
            let run = d.join("sweep/runs/none-lr3e-3-seed1");
            std::fs::create_dir_all(&run).unwrap();
            std::fs::copy(d.join("run/config.yaml"), run.join("config.yaml")).unwrap();
            std::fs::write(
                run.join("metrics.jsonl"),
                "not a record\n\u{0}\u{1}\n{\"kind\": 3}\n",
            )
            .unwrap();
            std::fs::write(run.join("summary.json"), "{ truncated").unwrap();
        }),
        // YAML the parser refuses for reasons of its own.
        case(
            "a .inf in the config",
            &["train", "inf.yaml", "--run-dir", "new"],
            Refused(&["inf.yaml", "train.lr", "finite"]),
            &["new"],
        )
        .setup(|d| std::fs::write(d.join("inf.yaml"), LM.replace("lr: 3.0e-3", "lr: .inf")).unwrap()),
        case(
            "a .nan by --set",
            &["train", "lm.yaml", "--set", "train.lr=.nan", "--run-dir", "new"],
            Refused(&["train.lr", "finite"]),
            &["new"],
        ),
        case(
            "two YAML documents",
            &["train", "two.yaml", "--run-dir", "new"],
            Refused(&["two.yaml", "---"]),
            &["new"],
        )
        .setup(|d| std::fs::write(d.join("two.yaml"), format!("{LM}---\ntrain: {{ steps: 2 }}\n")).unwrap()),
        case(
            "a 100 kB --set value",
            &["train", "lm.yaml", "--set", &long_set, "--run-dir", "new"],
            Refused(&["train.lr", "characters"]),
            &["new"],
        ),
        case(
            "a 100 kB key by --set",
            &["train", "lm.yaml", "--set", &long_key, "--run-dir", "new"],
            Refused(&["model.aaaa", "100000 characters"]),
            &["new"],
        ),
        case(
            "a 100 kB --set without a value",
            &["train", "lm.yaml", "--set", &long_word, "--run-dir", "new"],
            Refused(&["--set", "characters"]),
            &["new"],
        ),
        case(
            "a 100 kB --grid key",
            &["ablate", "lm.yaml", "--grid", &long_grid, "--out", "sweep"],
            Refused(&["--grid", "characters"]),
            &["sweep"],
        ),
        case(
            "a 100 kB --lrs",
            &["ablate", "lm.yaml", "--lrs", &long_word, "--out", "sweep"],
            Refused(&["--lrs", "characters"]),
            &["sweep"],
        ),
        // Data that is not what it seems.
        case(
            "a shard of u32 ids",
            &["train", "shards.yaml", "--run-dir", "new"],
            Refused(&["u32.bin", "32-bit"]),
            &["new"],
        )
        .setup(|d| {
            let ids: Vec<u8> = (0..400u32)
                .map(|i| 4 + i % 20)
                .flat_map(|i| i.to_le_bytes())
                .collect();
            std::fs::write(d.join("u32.bin"), ids).unwrap();
            let cfg = LM.replace(
                "{ kind: text, path: text.txt, val_fraction: 0.2 }",
                "{ kind: token_shards, train_files: [u32.bin], val_files: [u32.bin], tokenizer: run }",
            );
            std::fs::write(d.join("shards.yaml"), cfg).unwrap();
        }),
        case(
            "Windows line endings",
            &["train", "lm.yaml", "--run-dir", "new", "--quiet"],
            Ok(&["CRLF", "text.txt"]),
            &["new"],
        )
        .setup(|d| std::fs::write(d.join("text.txt"), TEXT.replace('\n', "\r\n").repeat(20)).unwrap())
        .after(|d, _| {
            // Read as plain newlines: no '\r' in the vocabulary the run keeps.
            let vocab = std::fs::read_to_string(d.join("new/tokenizer.json")).unwrap();
            assert!(!vocab.contains("\\r"), "{vocab}");
        }),
        case(
            "a corpus that is a device",
            &[
                "train",
                "lm.yaml",
                "--set",
                "data.corpus.path=/dev/zero",
                "--run-dir",
                "new",
            ],
            Refused(&["/dev/zero", "device"]),
            &["new"],
        ),
        case(
            "a run directory that is a device",
            &["train", "lm.yaml", "--run-dir", "/dev/null"],
            Refused(&["/dev/null"]),
            &[],
        ),
        case(
            "unknown characters in a prompt",
            &["generate", "run", "--prompt", "Ω☃", "--max-tokens", "3"],
            Ok(&["<unk>", "--prompt"]),
            &[],
        ),
        case(
            "a sampling flag out of range",
            &["generate", "run", "--top-p", "2"],
            Refused(&["--top-p"]),
            &[],
        ),
        case(
            "a shard that is a device",
            &["train", "shards.yaml", "--run-dir", "new"],
            Refused(&["/dev/zero", "device"]),
            &["new"],
        )
        .setup(|d| {
            let cfg = LM.replace(
                "{ kind: text, path: text.txt, val_fraction: 0.2 }",
                "{ kind: token_shards, train_files: [/dev/zero], val_files: [/dev/zero], tokenizer: run }",
            );
            std::fs::write(d.join("shards.yaml"), cfg).unwrap();
        }),
        case(
            "a sweep plan that points outside the sweep",
            &["ablate", "sweep", "--cell", "0"],
            Refused(&["grid.json", "outside", "Nothing was changed"]),
            &["sweep"],
        )
        .setup(|d| {
            ok(
                d,
                &[
                    "ablate",
                    "lm.yaml",
                    "--launcher",
                    "slurm",
                    "--variants",
                    "none",
                    "--seeds",
                    "1",
                    "--out",
                    "sweep",
                ],
            );
            let grid = d.join("sweep/grid.json");
            let text = std::fs::read_to_string(&grid)
                .unwrap()
                .replace("\"runs/none-lr3e-3-seed1\"", "\"outside\"");
            std::fs::write(grid, text).unwrap();
        }),
        case(
            "references of another length",
            &["bleu", "-r", "ref.txt", "-i", "hyp.txt"],
            Refused(&["ref.txt", "2 line"]),
            &[],
        ),
        case(
            "a source from /dev/zero",
            &["bleu", "-r", "ref.txt", "-i", "ref.txt", "--source", "/dev/zero"],
            Refused(&["--source", "/dev/zero", "device"]),
            &[],
        ),
        case(
            "references from /dev/zero",
            &["bleu", "-r", "/dev/zero", "-i", "hyp.txt"],
            Refused(&["/dev/zero", "device"]),
            &[],
        ),
    ];
    cases.extend(models_and_sweeps::cases());
    cases
}

/// Everything under `root` but the writable paths: kind, size and a hash of the content (or a
/// link's target).
fn snapshot(root: &Path, writable: &[PathBuf]) -> BTreeMap<PathBuf, (String, u64)> {
    fn walk(root: &Path, dir: &Path, writable: &[PathBuf], out: &mut BTreeMap<PathBuf, (String, u64)>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if writable.iter().any(|w| path.starts_with(w)) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let mut h = std::collections::hash_map::DefaultHasher::new();
            let kind = if meta.file_type().is_symlink() {
                std::fs::read_link(&path).unwrap().hash(&mut h);
                "link"
            } else if meta.is_dir() {
                walk(root, &path, writable, out);
                "dir"
            } else if !meta.is_file() {
                // A FIFO a case made: reading it would wait for a writer.
                "special"
            } else {
                std::fs::read(&path).unwrap().hash(&mut h);
                "file"
            };
            out.insert(rel, (kind.to_string(), h.finish() ^ meta.len()));
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, writable, &mut out);
    out
}

/// Runs `ember ARGS` in `dir` with `env` set, killing it after `limit` (then the case fails as
/// a hang).
fn run_limited(dir: &Path, args: &[String], env: &[(&str, &str)], limit: Duration) -> Output {
    // Backtraces on, as many shells have them: none may reach the user's screen.
    let mut child = ember(dir)
        .env("RUST_BACKTRACE", "1")
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ember");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "ember {args:?} still ran after {limit:?} (a hang); stderr:\n{}",
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Words that only Rust's Debug output, or a library speaking to its programmer, would print.
const NOT_FOR_USERS: &[&str] = &[
    "panicked",
    "memory allocation of",
    "RUST_BACKTRACE",
    "Os {",
    "Error {",
    "Custom {",
    "kind: ",
    "Some(",
    "from_str_multiple",
    "configured policy",
    "DuplicateKeyPolicy",
    ".rs:",
    "   0: ",
];

#[test]
fn every_hostile_invocation_ends_in_a_clear_refusal_or_a_correct_success_and_touches_nothing_else() {
    let base = fixture();
    let mut failures = vec![];
    for case in cases() {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(base, dir.path());
        (case.setup)(dir.path());
        let writable: Vec<PathBuf> = case.writable.iter().map(|w| dir.path().join(w)).collect();
        let before = snapshot(dir.path(), &writable);
        let out = run_limited(dir.path(), &case.args, case.env, Duration::from_secs(90));
        let stderr = text(&out.stderr);
        let mut problems = vec![];
        let code = out.status.code();
        match (&case.expect, code) {
            (Expect::Ok(_), Some(0)) | (Expect::Refused(_), Some(1 | 2)) => {}
            _ => problems.push(format!("ended with {}", out.status)),
        }
        let words = match &case.expect {
            Expect::Ok(w) | Expect::Refused(w) => *w,
        };
        for w in words {
            if !stderr.contains(w) {
                problems.push(format!("does not say {w:?}"));
            }
        }
        if let Some(w) = NOT_FOR_USERS.iter().find(|w| stderr.contains(*w)) {
            problems.push(format!("says {w:?}"));
        }
        if matches!(case.expect, Expect::Refused(_)) && stderr.len() > 3000 {
            problems.push(format!("a {}-byte message", stderr.len()));
        }
        let after = snapshot(dir.path(), &writable);
        let changed: Vec<String> = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k) != after.get(*k))
            .map(|k| k.display().to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !changed.is_empty() {
            problems.push(format!("changed files it may not write: {changed:?}"));
        }
        if problems.is_empty() {
            (case.after)(dir.path(), &out);
        } else {
            failures.push(format!(
                "{}: `ember {}`: {}\nstderr:\n{}",
                case.name,
                case.args.join(" ").chars().take(200).collect::<String>(),
                problems.join("; "),
                stderr.chars().take(1500).collect::<String>()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a path in the case's own temporary folder.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(entry.file_name());
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            copy_dir(&entry.path(), &dest);
        } else if kind.is_file() {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}

/// Arguments that are not UTF-8 (the table's are text): the refusal names which one.
#[test]
fn an_argument_that_is_not_utf8_is_named() {
    use std::os::unix::ffi::OsStrExt;
    let base = fixture();
    for (flag, value) in [("--set", &b"train.lr=\xff"[..]), ("--prompt", b"\xfe\xff")] {
        let command = if flag == "--set" { "train" } else { "generate" };
        let target = if flag == "--set" { "lm.yaml" } else { "run" };
        let out = ember(base)
            .args([command, target, flag])
            .arg(std::ffi::OsStr::from_bytes(value))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("the value of {flag}")) && err.contains("not valid UTF-8"),
            "{err}"
        );
    }
}
