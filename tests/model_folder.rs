//! A model folder (`ember package`): one checkpoint's weights with the run's tokenizer and config,
//! which `translate`, `generate` and `eval` open in place of the run — the form a trained model
//! is released in.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::*;
use serde_json::Value;

/// A small parallel corpus in files (number words, English → German), so that a test can take
/// the corpus away and see what still works without it.
fn write_corpus(dir: &Path) {
    const EN: [&str; 10] = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    ];
    const DE: [&str; 10] = [
        "null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun",
    ];
    std::fs::create_dir_all(dir.join("corpus")).unwrap();
    let mut state = 12345u64;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    for (split, lines) in [("train", 300), ("valid", 30), ("test", 30)] {
        let (mut en, mut de) = (String::new(), String::new());
        for _ in 0..lines {
            let words: Vec<usize> = (0..1 + next(5)).map(|_| next(10) as usize).collect();
            en += &(words.iter().map(|&w| EN[w]).collect::<Vec<_>>().join(" ") + "\n");
            de += &(words.iter().map(|&w| DE[w]).collect::<Vec<_>>().join(" ") + "\n");
        }
        std::fs::write(dir.join(format!("corpus/{split}.en")), en).unwrap();
        std::fs::write(dir.join(format!("corpus/{split}.de")), de).unwrap();
    }
}

const CONFIG: &str = r#"
model: { arch: seq2seq, d_model: 32, n_layers: 1, n_heads: 4, d_ff: 64, max_seq_len: 64, dropout: 0.1 }
data:
  corpus:
    kind: parallel
    train: { source: corpus/train.en, target: corpus/train.de }
    valid: { source: corpus/valid.en, target: corpus/valid.de }
    test: { source: corpus/test.en, target: corpus/test.de }
  tokenizer: { kind: bpe, vocab_size: 120 }
train: { steps: 30, seed: 2, lr: 3.0e-3, warmup_steps: 5, max_tokens: 300, log_every: 10, threads: 1 }
eval: { every: 0 }
checkpoint: { every: 10, keep_last: 3 }
"#;

/// Trains the corpus's run in `dir` and averages its last 3 checkpoints; returns the averaged
/// checkpoint.
fn trained_average(dir: &Path) -> PathBuf {
    write_corpus(dir);
    let cfg = write(dir, "numbers.yaml", CONFIG);
    ok(dir, &["train", s(&cfg), "--run-dir", "run", "--quiet"]);
    ok(dir, &["average", "run", "--last", "3"]);
    dir.join("run/checkpoints/average-last-3")
}

fn translate(cwd: &Path, model: &Path, input: &str) -> String {
    let mut cmd = ember(cwd);
    cmd.args(["translate", s(model), "--beam", "3"]);
    run_with_stdin(cmd, input)
}

/// Runs `cmd` with `input` on its stdin, requires success, and returns its stdout.
fn run_with_stdin(mut cmd: std::process::Command, input: &str) -> String {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

fn eval_test(cwd: &Path, model: &Path, hyps: &str) -> Value {
    eval_test_with(cwd, model, hyps, &[])
}

/// `ember eval` of the test split with `extra` options, as JSON.
fn eval_test_with(cwd: &Path, model: &Path, hyps: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "eval",
        s(model),
        "--split",
        "test",
        "--beam",
        "3",
        "--output",
        hyps,
        "--json",
    ];
    args.extend(extra);
    serde_json::from_str(&ok(cwd, &args)).unwrap()
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_model_folder_translates_and_evaluates_exactly_as_the_checkpoint_it_was_packaged_from() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let average = trained_average(dir);
    let packaged: Value =
        serde_json::from_str(&ok(dir, &["package", s(&average), "released/numbers", "--json"])).unwrap();
    let folder = dir.join("released/numbers");
    assert_eq!(packaged["step"], 30, "{packaged}");
    assert_eq!(
        file_names(&folder),
        ["config.yaml", "model.json", "model.safetensors", "tokenizer.json"],
        "weights, config, tokenizer and the manifest; no optimizer state"
    );
    assert_eq!(
        std::fs::read(folder.join("model.safetensors")).unwrap(),
        std::fs::read(average.join("model.safetensors")).unwrap(),
        "the checkpoint's weights, unchanged"
    );
    #[cfg(unix)]
    {
        // The weights are written through a temporary file created 0600; they must end up
        // readable as every other file is (the umask's mode), in a checkpoint and a folder.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: PathBuf| std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        for dir in [&average, &folder] {
            for name in ["model.safetensors", "optimizer.safetensors"] {
                if dir.join(name).exists() {
                    assert_eq!(
                        mode(dir.join(name)),
                        mode(dir.join("config.yaml")),
                        "{}",
                        dir.join(name).display()
                    );
                }
            }
        }
    }

    // Evaluation reads the corpus the config names and scores as the checkpoint does.
    let from_run = eval_test(dir, &average, "run.hyp");
    let from_folder = eval_test(dir, &folder, "folder.hyp");
    for key in ["loss", "tokens", "bleu", "chrf"] {
        assert_eq!(
            from_folder[key], from_run[key],
            "{key}: {from_folder} vs {from_run}"
        );
    }
    assert_eq!(
        std::fs::read(dir.join("folder.hyp")).unwrap(),
        std::fs::read(dir.join("run.hyp")).unwrap()
    );
    assert_eq!(
        file_names(&folder).len(),
        4,
        "evaluation writes nothing into the folder"
    );

    // Decoding needs no corpus: moved elsewhere, with the corpus gone, it translates the same.
    let input = "three one four\nnine nine\n";
    let expected = translate(dir, &average, input);
    assert_eq!(expected.lines().count(), 2, "{expected}");
    let elsewhere = tempfile::tempdir().unwrap();
    let moved = elsewhere.path().join("numbers");
    std::fs::rename(&folder, &moved).unwrap();
    std::fs::remove_dir_all(dir.join("corpus")).unwrap();
    assert_eq!(translate(elsewhere.path(), &moved, input), expected);
    // Evaluation without the corpus says which file is missing.
    let err = fails(elsewhere.path(), &["eval", s(&moved), "--split", "test"]);
    assert!(
        err.contains("corpus/train.en") && err.contains("config.yaml"),
        "{err}"
    );
}

#[test]
fn packaging_never_overwrites_and_a_damaged_folder_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let average = trained_average(dir);

    // An existing folder is left as it is.
    std::fs::create_dir(dir.join("taken")).unwrap();
    write(&dir.join("taken"), "keep.txt", "mine");
    let err = fails(dir, &["package", s(&average), "taken"]);
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(file_names(&dir.join("taken")), ["keep.txt"]);
    // Not a run: refused, nothing written.
    let err = fails(dir, &["package", "corpus", "out"]);
    assert!(err.contains("corpus"), "{err}");
    assert!(!dir.join("out").exists());

    ok(dir, &["package", s(&average), "good"]);
    let folder = dir.join("good");
    assert!(
        !file_names(dir).iter().any(|n| n.contains(".tmp-")),
        "no temporary folder is left: {:?}",
        file_names(dir)
    );

    // One byte changed in the weights: every command refuses the folder and names the file.
    let weights = folder.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&weights, bytes).unwrap();
    for args in [vec!["eval", "good", "--split", "test"], vec!["generate", "good"]] {
        let err = fails(dir, &args);
        assert!(
            err.contains("model.safetensors") && err.contains("corrupt"),
            "{args:?}: {err}"
        );
    }

    // A tokenizer from another run: the manifest's checksum catches it before any decoding.
    ok(dir, &["package", s(&average), "other"]);
    std::fs::write(dir.join("other/tokenizer.json"), "{}").unwrap();
    let err = fails(dir, &["eval", "other"]);
    assert!(err.contains("tokenizer.json") && err.contains("corrupt"), "{err}");
    // A manifest that is not one.
    std::fs::write(dir.join("other/model.json"), "not json").unwrap();
    let err = fails(dir, &["eval", "other"]);
    assert!(err.contains("model.json"), "{err}");
}

/// A study chooses each model's length penalty on validation; the released folder carries that
/// choice, so that whoever decodes it without knowing the choice gets the decoding that was scored.
#[test]
fn a_folder_decodes_with_the_length_penalty_it_was_packaged_with_unless_told_otherwise() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let average = trained_average(dir);
    ok(dir, &["package", s(&average), "plain"]);
    ok(
        dir,
        &["package", s(&average), "chosen", "--length-penalty", "fairseq:1"],
    );
    let config = std::fs::read_to_string(dir.join("chosen/config.yaml")).unwrap();
    assert!(config.contains("length_penalty: fairseq:1"), "{config}");
    assert!(!std::fs::read_to_string(dir.join("plain/config.yaml"))
        .unwrap()
        .contains("length_penalty"));

    let plain = eval_test(dir, &dir.join("plain"), "plain.hyp");
    assert_eq!(
        plain["length_penalty"], "gnmt:0.6",
        "the default without a choice: {plain}"
    );
    let chosen = eval_test(dir, &dir.join("chosen"), "chosen.hyp");
    let told = eval_test_with(dir, &average, "told.hyp", &["--length-penalty", "fairseq:1"]);
    assert_eq!(chosen["length_penalty"], "fairseq:1", "{chosen}");
    for key in ["loss", "bleu", "chrf"] {
        assert_eq!(chosen[key], told[key], "{key}: {chosen} vs {told}");
    }
    assert_eq!(
        std::fs::read(dir.join("chosen.hyp")).unwrap(),
        std::fs::read(dir.join("told.hyp")).unwrap(),
        "the folder decodes as the checkpoint does under the penalty it was chosen with"
    );
    let input = "three one four\nnine nine\n";
    let elsewhere = tempfile::tempdir().unwrap();
    let mut translate_told = ember(elsewhere.path());
    translate_told.args([
        "translate",
        s(&average),
        "--beam",
        "3",
        "--length-penalty",
        "fairseq:1",
    ]);
    assert_eq!(
        translate(elsewhere.path(), &dir.join("chosen"), input),
        run_with_stdin(translate_told, input)
    );

    // A penalty given on the command line still wins over the folder's.
    let overridden = eval_test_with(
        dir,
        &dir.join("chosen"),
        "overridden.hyp",
        &["--length-penalty", "0.6"],
    );
    assert_eq!(overridden["length_penalty"], "gnmt:0.6", "{overridden}");
    assert_eq!(overridden["bleu"], plain["bleu"], "{overridden} vs {plain}");

    // A penalty that is no penalty is refused by name, and no folder is written.
    let err = fails(
        dir,
        &["package", s(&average), "negative", "--length-penalty", "gnmt:-1"],
    );
    assert!(err.contains("--length-penalty") && err.contains("≥ 0"), "{err}");
    assert!(!dir.join("negative").exists());
}

/// The study's released models (docs/results/multi30k-full) are what users download: a change to
/// the folder format, the config or the model's forward pass must not leave them unreadable or
/// translating differently.
#[test]
fn the_released_multi30k_models_still_open_and_translate() {
    let released = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/results/multi30k-full");
    let input = "a man in a red shirt is riding a bike .\n\
                 two dogs are playing in the snow .\n\
                 a little girl is eating an apple .\n";
    let expected = "ein mann in einem roten hemd fährt fahrrad .\n\
                    zwei hunde spielen im schnee .\n\
                    ein kleines mädchen isst einen apfel .\n";
    let elsewhere = tempfile::tempdir().unwrap();
    for name in [
        "none-seed8-avg10",
        "layernorm-seed7-avg5",
        "rmsnorm-seed2-avg5",
        "l2-seed2-avg10",
    ] {
        assert_eq!(
            translate(elsewhere.path(), &released.join(name), input),
            expected,
            "{name}"
        );
    }
}
