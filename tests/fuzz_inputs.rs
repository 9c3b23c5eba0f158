//! Property: whatever config YAML or command line a user gives, `ember` ends with success or a
//! clear error (exit status 0, 1 or 2, something said on stderr when it fails), never with a
//! Rust panic, an allocation abort, or any other death by signal.
//!
//! Each case runs the built binary, so an abort (which no `catch_unwind` sees) is caught too.
//! The cases are bounded for CI (about 10 s on 2 cores): every generated config is a
//! mutation of a tiny seq2seq or language-model config, and the commands that do real work
//! (`bench`, `train`) run one or two steps of it. Proptest's shrinking reports the smallest
//! failing input; set `PROPTEST_CASES` to run more cases locally.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

/// Cases per property (the default; `PROPTEST_CASES` overrides it).
const CASES: u32 = 256;

fn ember(dir: &Path, args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run ember")
}

/// The property itself: a normal exit, and a failure that says something and is no panic.
fn assert_no_crash(out: &Output, what: &str) -> std::result::Result<(), TestCaseError> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    prop_assert!(
        matches!(out.status.code(), Some(0..=2)),
        "{what}: ended with {} (a signal or an unexpected status), stderr:\n{stderr}",
        out.status
    );
    prop_assert!(!stderr.contains("panicked"), "{what}: panicked:\n{stderr}");
    prop_assert!(
        !stderr.contains("memory allocation of"),
        "{what}: allocation failure:\n{stderr}"
    );
    if !out.status.success() {
        prop_assert!(!stderr.trim().is_empty(), "{what}: failed without a word");
    }
    Ok(())
}

const SEQ2SEQ: &str = "\
model:
  arch: seq2seq
  d_model: 16
  n_layers: 1
  n_heads: 2
  d_ff: 32
  max_seq_len: 64
  dropout: 0.1
data:
  corpus: { kind: embedded, seed: 7, train_size: 60, val_size: 8, test_size: 8 }
  tokenizer: { kind: bpe, vocab_size: 200 }
train:
  steps: 2
  seed: 3
  lr: 3.0e-3
  warmup_steps: 1
  max_tokens: 200
  log_every: 1
  threads: 1
eval:
  every: 0
  max_tokens: 200
checkpoint:
  every: 0
  keep_last: 1
";

const LM: &str = "\
model: { arch: lm, d_model: 16, n_layers: 1, n_heads: 2, d_ff: 32, max_seq_len: 16 }
data:
  corpus: { kind: text, path: text.txt, val_fraction: 0.2 }
  tokenizer: { kind: char }
train: { steps: 2, lr: 3.0e-3, batch_size: 2, block_size: 8, threads: 1, log_every: 1 }
eval: { every: 0 }
";

/// The base configs as trees, for mutations that keep the YAML well-formed.
fn seq2seq_tree() -> serde_json::Value {
    serde_json::json!({
        "model": { "arch": "seq2seq", "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32,
                   "max_seq_len": 64, "dropout": 0.1 },
        "data": { "corpus": { "kind": "embedded", "seed": 7, "train_size": 60, "val_size": 8, "test_size": 8 },
                  "tokenizer": { "kind": "bpe", "vocab_size": 200 } },
        "train": { "steps": 2, "seed": 3, "lr": 3.0e-3, "warmup_steps": 1, "max_tokens": 200,
                   "log_every": 1, "threads": 1 },
        "eval": { "every": 0, "max_tokens": 200 },
        "checkpoint": { "every": 0, "keep_last": 1 }
    })
}

fn lm_tree() -> serde_json::Value {
    serde_json::json!({
        "model": { "arch": "lm", "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "max_seq_len": 16 },
        "data": { "corpus": { "kind": "text", "path": "text.txt", "val_fraction": 0.2 },
                  "tokenizer": { "kind": "char" } },
        "train": { "steps": 2, "lr": 3.0e-3, "batch_size": 2, "block_size": 8, "threads": 1, "log_every": 1 },
        "eval": { "every": 0 }
    })
}

/// Every key of the two base configs, as `section.key` (what a mutation replaces).
const KEYS: &[&str] = &[
    "model.arch",
    "model.d_model",
    "model.n_layers",
    "model.n_heads",
    "model.d_ff",
    "model.max_seq_len",
    "model.dropout",
    "model.vocab_size",
    "model.qk_norm",
    "model.n_kv_heads",
    "model.positions",
    "model.norm_bias",
    "model.logn_attention",
    "model.logn_length",
    "data.corpus",
    "data.corpus.kind",
    "data.corpus.train_size",
    "data.corpus.val_size",
    "data.corpus.path",
    "data.corpus.val_fraction",
    "data.tokenizer",
    "data.tokenizer.kind",
    "data.tokenizer.vocab_size",
    "data.max_source_len",
    "data.too_long",
    "train.steps",
    "train.epochs",
    "train.lr",
    "train.warmup_steps",
    "train.schedule",
    "train.max_tokens",
    "train.batch_size",
    "train.block_size",
    "train.accumulation",
    "train.threads",
    "train.log_every",
    "train.clip_grad_norm",
    "train.label_smoothing",
    "train.on_nonfinite",
    "train.max_skipped_fraction",
    "eval.every",
    "eval.max_tokens",
    "eval.beam",
    "checkpoint.every",
    "checkpoint.keep_last",
    "device",
    "model",
    "train",
    "nonsense",
];

/// Values a careless or hostile user writes: out of range, wrong type, absurdly large, empty.
fn adversarial_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("1".to_string()),
        Just("3".to_string()),
        Just("-1".to_string()),
        Just("4294967296".to_string()),
        Just("18446744073709551615".to_string()),
        Just("99999999999999999999999".to_string()),
        Just("1.0e300".to_string()),
        Just("-0.5".to_string()),
        Just(".nan".to_string()),
        Just(".inf".to_string()),
        Just("null".to_string()),
        Just("true".to_string()),
        Just("''".to_string()),
        Just("[1, 2]".to_string()),
        Just("{ a: 1 }".to_string()),
        Just("cuda:7".to_string()),
        Just("/nonexistent/file".to_string()),
        Just("x".repeat(5000)),
        "[a-z]{1,8}",
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|x| format!("{x:e}")),
    ]
}

/// `--set` form of one mutation (flow YAML is valid on the command line too).
fn override_of(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

/// Hostile values as YAML values (JSON is YAML, and serde_json writes it safely).
fn yaml_value(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_string()))
}

/// A YAML document made from `base`: each edit sets one key (creating its sections) to a
/// hostile value, and then, in a quarter of the cases, one structural mutation of the text
/// (duplicate key, alias bomb, tab, truncation, a list around it all, a lost colon).
fn mutate_yaml(lm: bool, edits: &[(usize, String)], structural: u8, cut: usize) -> String {
    let base = if lm { LM } else { SEQ2SEQ };
    let mut tree = if lm { lm_tree() } else { seq2seq_tree() };
    for (k, value) in edits {
        let mut node = &mut tree;
        let parts: Vec<&str> = KEYS[k % KEYS.len()].split('.').collect();
        for part in &parts[..parts.len() - 1] {
            if !node.get(*part).is_some_and(|n| n.is_object()) {
                node[*part] = serde_json::json!({});
            }
            node = &mut node[*part];
        }
        node[*parts.last().unwrap()] = yaml_value(value);
    }
    let text = serde_json::to_string_pretty(&tree).unwrap();
    match structural % 24 {
        0 => text.replacen("\"lr\":", "\"lr\": 1.0, \"lr\":", 1),
        1 => format!("a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b, *b, *b]\n{}", base),
        2 => base.replacen("  ", "\t", 1),
        3 => base.chars().take(cut % (base.chars().count() + 1)).collect(),
        4 => format!("- {}", base.replace('\n', "\n  ")),
        5 => base.replacen(':', "", 1),
        _ => text,
    }
}

/// A temporary directory with the LM's text file and, made once, a trained tiny run of each
/// kind for the commands that read one (`eval`, `translate`, `generate`, `average`).
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn seq2seq_run(&self) -> PathBuf {
        self.path().join("s2s-run")
    }
    fn lm_run(&self) -> PathBuf {
        self.path().join("lm-run")
    }
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let text = "First Citizen:\nBefore we proceed any further, hear me speak.\n".repeat(20);
        std::fs::write(p.join("text.txt"), text).unwrap();
        std::fs::write(p.join("s2s.yaml"), SEQ2SEQ).unwrap();
        std::fs::write(p.join("lm.yaml"), LM).unwrap();
        std::fs::write(p.join("ref.txt"), "a cat sat\n").unwrap();
        for (cfg, run) in [("s2s.yaml", "s2s-run"), ("lm.yaml", "lm-run")] {
            let args = ["train", cfg, "--run-dir", run, "--quiet"].map(String::from);
            let out = ember(p, &args);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        Fixture { dir }
    })
}

fn config() -> Config {
    Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(CASES),
        // Shrinking runs the binary once per step: bounded so that a failure reports quickly.
        max_shrink_iters: 64,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// A mutated config, through `bench` (set-up, memory estimate, one training step; no run
    /// directory) or `train` (the same, plus the run directory, for two steps).
    #[test]
    fn no_config_yaml_makes_ember_panic_or_abort(
        lm in any::<bool>(),
        edits in prop::collection::vec((any::<usize>(), adversarial_value()), 0..4),
        sets in prop::collection::vec((any::<usize>(), adversarial_value()), 0..2),
        structural in any::<u8>(),
        cut in any::<usize>(),
        train in any::<bool>(),
    ) {
        let f = fixture();
        let yaml = mutate_yaml(lm, &edits, structural, cut);
        let case = tempfile::tempdir_in(f.path()).unwrap();
        let cfg = case.path().join("case.yaml");
        std::fs::write(&cfg, &yaml).unwrap();
        let cfg = cfg.to_str().unwrap().to_string();
        let mut args: Vec<String> = if train {
            let run_dir = case.path().join("run").to_str().unwrap().to_string();
            vec!["train".into(), cfg, "--run-dir".into(), run_dir, "--quiet".into()]
        } else {
            vec!["bench".into(), cfg, "--steps".into(), "1".into(), "--warmup".into(), "0".into()]
        };
        for (k, value) in &sets {
            args.push("--set".into());
            args.push(override_of(KEYS[k % KEYS.len()], value));
        }
        // Whatever the mutations say, at most two steps are trained (`--set` comes last).
        if train {
            args.extend(["--set".into(), "train.steps=2".into(), "--set".into(), "train.epochs=null".into()]);
        }
        let out = ember(f.path(), &args);
        assert_no_crash(&out, &format!("{args:?} with config:\n{yaml}"))?;
    }

    /// A command line of one subcommand's own flags with hostile values (as `--flag=value`,
    /// so that `-1` is a value), now and then a stray word, against the fixture's trained runs
    /// and files.
    #[test]
    fn no_command_line_makes_ember_panic_or_abort(
        command in 0usize..9,
        flags in prop::collection::vec((any::<usize>(), adversarial_value(), 0u8..8), 0..4),
    ) {
        let f = fixture();
        const DECODE: &[&str] = &["--beam", "--length-penalty", "--no-cache", "--device", "--json"];
        let (name, target, own): (&str, PathBuf, &[&str]) = [
            ("eval", f.seq2seq_run(), &["--split", "--no-bleu", "--json", "--beam", "--length-penalty", "--device"][..]),
            ("eval", f.lm_run(), &["--split", "--json", "--device"][..]),
            ("translate", f.seq2seq_run(), DECODE),
            ("translate", f.lm_run(), DECODE),
            ("generate", f.lm_run(), &["--prompt", "--temperature", "--top-k", "--top-p", "--seed", "--json", "--device"][..]),
            ("generate", f.seq2seq_run(), &["--prompt", "--temperature"][..]),
            ("bench", f.path().join("s2s.yaml"), &["--set", "--json"][..]),
            ("bleu", f.path().join("ref.txt"), &["--metrics", "--tokenize", "--json", "-r"][..]),
            ("average", f.seq2seq_run(), &["--last"][..]),
        ][command].clone();
        let mut args = vec![name.to_string()];
        if name == "bleu" {
            args.extend(["-r".into(), "ref.txt".into(), "-i".into()]);
        }
        args.push(target.to_str().unwrap().to_string());
        for (i, value, form) in &flags {
            let flag = own[i % own.len()];
            args.push(match form {
                0 => value.clone(),                    // a stray word
                1 => flag.to_string(),                 // the flag alone
                _ if flag == "--set" => format!("--set={}", override_of(KEYS[i % KEYS.len()], value)),
                _ => format!("{flag}={value}"),
            });
        }
        // Bounded work: `bench` times one step and `generate` samples 8 tokens (their range
        // checks are covered by tests/reliability.rs).
        match name {
            "bench" => args.extend(["--steps", "1", "--warmup", "0"].map(String::from)),
            "generate" => args.extend(["--max-tokens", "8"].map(String::from)),
            _ => {}
        }
        // `average` writes a checkpoint into the run it reads: a copy keeps the fixture intact.
        let copy = tempfile::tempdir_in(f.path()).unwrap();
        if name == "average" {
            copy_dir(&target, copy.path());
            args[1] = copy.path().to_str().unwrap().to_string();
        }
        let out = ember(f.path(), &args);
        assert_no_crash(&out, &format!("{args:?}"))?;
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}
