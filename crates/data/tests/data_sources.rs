//! Corpora from where the field keeps them: a Hugging Face dataset's parquet files (local folder
//! or HF cache) and llama2.c token shards. Every fixture is written by the test itself.

mod common;

use std::path::{Path, PathBuf};

use ember_data::parquet::write_text_columns;
use ember_data::shards::{read_shard, tokenize_file, write_shard};
use ember_data::{
    CorpusConfig, DataConfig, Dataset, HfColumns, HfDatasetConfig, HfSplits, PairPaths, ParallelConfig,
    RawCorpus, Splits, TextConfig, TokenShardsConfig, Tokenizer, TokenizerConfig, TokenizerKind,
};

fn some(v: &[String]) -> Vec<Option<&str>> {
    v.iter().map(|s| Some(s.as_str())).collect()
}

fn hf(path: &Path, columns: HfColumns) -> HfDatasetConfig {
    HfDatasetConfig {
        path: Some(path.to_path_buf()),
        repo: None,
        revision: None,
        config: None,
        splits: HfSplits::default(),
        columns,
    }
}

fn translation_columns(source: &str, target: &str) -> HfColumns {
    HfColumns {
        text: None,
        source: Some(source.into()),
        target: Some(target.into()),
    }
}

fn text_column(name: &str) -> HfColumns {
    HfColumns {
        text: Some(name.into()),
        source: None,
        target: None,
    }
}

fn load(cfg: HfDatasetConfig) -> ember_data::Result<RawCorpus> {
    RawCorpus::load(&CorpusConfig::HfDataset(cfg))
}

/// The Hub's parquet-conversion layout `default/{split}/0000.parquet`, with an integer-free
/// extra column the reader must skip, nulls and blank rows, and several row groups.
fn write_translation_dataset(root: &Path) -> (Vec<String>, Vec<String>) {
    let (en, de) = common::toy_parallel();
    for split in ["train", "validation", "test"] {
        std::fs::create_dir_all(root.join("default").join(split)).unwrap();
    }
    let mut src = some(&en);
    let mut tgt = some(&de);
    let ids: Vec<String> = (0..en.len() + 2).map(|i| format!("id{i}")).collect();
    src.extend([None, Some("  ")]); // a null and a blank source: dropped and counted
    tgt.extend([Some("Hallo."), Some("Welt.")]);
    write_text_columns(
        &root.join("default/train/0000.parquet"),
        &[("id", some(&ids)), ("en", src), ("de", tgt)],
        3,
    )
    .unwrap();
    for split in ["validation", "test"] {
        write_text_columns(
            &root.join(format!("default/{split}/0000.parquet")),
            &[("en", some(&en[..2])), ("de", some(&de[..2]))],
            10,
        )
        .unwrap();
    }
    (en, de)
}

#[test]
fn translation_parquet_reads_like_the_same_parallel_text() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("multi30k");
    let (en, de) = write_translation_dataset(&root);
    let mut cfg = hf(&root, translation_columns("en", "de"));
    cfg.splits.test = Some("test".into());
    let RawCorpus::Translation { train, valid, test } = load(cfg).unwrap() else {
        panic!("source/target columns make a translation corpus")
    };
    assert_eq!(train.sources, en);
    assert_eq!(train.targets, de);
    assert_eq!(train.dropped_empty, 2);
    assert_eq!(valid.sources, en[..2]);
    assert_eq!(test.unwrap().targets, de[..2]);

    // The same pairs as text files give the same corpus.
    let w =
        |name: &str, lines: &[String]| common::write(dir.path(), name, (lines.join("\n") + "\n").as_bytes());
    let parallel = RawCorpus::load(&CorpusConfig::Parallel(ParallelConfig {
        train: PairPaths {
            source: w("train.en", &en),
            target: w("train.de", &de),
        },
        valid: PairPaths {
            source: w("valid.en", &en[..2]),
            target: w("valid.de", &de[..2]),
        },
        test: None,
    }))
    .unwrap();
    let RawCorpus::Translation { train: t2, .. } = parallel else {
        panic!()
    };
    assert_eq!((t2.sources, t2.targets), (train.sources, train.targets));
}

#[test]
fn nested_struct_columns_are_reached_with_a_dotted_name() {
    // The WMT datasets' layout: one struct column `translation: {de, en}`, files named
    // `{split}-NNNNN-of-NNNNN.parquet` in `{config}/`.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("wmt");
    std::fs::create_dir_all(root.join("de-en")).unwrap();
    let (en, de) = common::toy_parallel();
    for split in ["train", "validation"] {
        write_text_columns(
            &root.join(format!("de-en/{split}-00000-of-00001.parquet")),
            &[("translation.de", some(&de)), ("translation.en", some(&en))],
            4,
        )
        .unwrap();
    }
    let RawCorpus::Translation { train, .. } =
        load(hf(&root, translation_columns("translation.en", "translation.de"))).unwrap()
    else {
        panic!()
    };
    assert_eq!(train.sources, en);
    assert_eq!(train.targets, de);
}

#[test]
fn text_parquet_rows_become_lines_of_one_stream_in_file_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("stories");
    std::fs::create_dir_all(root.join("data")).unwrap();
    let rows =
        |from: usize, n: usize| -> Vec<String> { (from..from + n).map(|i| format!("story {i}.")).collect() };
    // Two train shards (read in name order), a null row, and the validation split.
    let (a, b, v) = (rows(0, 5), rows(5, 3), rows(100, 4));
    let mut a_col = some(&a);
    a_col.insert(2, None);
    write_text_columns(
        &root.join("data/train-00001-of-00002.parquet"),
        &[("text", some(&b))],
        2,
    )
    .unwrap();
    write_text_columns(
        &root.join("data/train-00000-of-00002.parquet"),
        &[("text", a_col)],
        2,
    )
    .unwrap();
    write_text_columns(
        &root.join("data/validation-00000-of-00001.parquet"),
        &[("text", some(&v))],
        2,
    )
    .unwrap();
    let RawCorpus::Text { train, valid } = load(hf(&root, text_column("text"))).unwrap() else {
        panic!("a text column makes a language-model corpus")
    };
    let expected: Vec<String> = a.iter().chain(&b).cloned().collect();
    assert_eq!(train.len(), 1);
    assert_eq!(train[0].text, expected.join("\n"));
    assert_eq!(valid[0].text, v.join("\n"));
}

#[test]
fn a_missing_column_names_the_columns_present() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("d");
    write_translation_dataset(&root);
    let err = load(hf(&root, translation_columns("en", "fr")))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("data.corpus.columns.target: "), "{err}");
    assert!(err.contains("\"fr\" is not in"), "{err}");
    assert!(err.contains("(its columns: id, en, de)"), "{err}");
    let err = load(hf(&root, text_column("id "))).unwrap_err().to_string();
    assert!(err.contains("its columns: id, en, de"), "{err}");
}

#[test]
fn a_missing_split_or_an_ambiguous_config_is_an_error_that_lists_what_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("d");
    write_translation_dataset(&root);
    let mut cfg = hf(&root, translation_columns("en", "de"));
    cfg.splits.valid = "dev".into();
    let err = load(cfg.clone()).unwrap_err().to_string();
    assert!(
        err.starts_with("data.corpus.splits.valid: no parquet file of split \"dev\""),
        "{err}"
    );
    assert!(err.contains("default/validation/0000.parquet"), "{err}");

    // A second config with the same splits: the choice must be explicit.
    let other = root.join("other/train");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::copy(
        root.join("default/train/0000.parquet"),
        other.join("0000.parquet"),
    )
    .unwrap();
    cfg.splits.valid = "validation".into();
    let err = load(cfg.clone()).unwrap_err().to_string();
    assert!(err.starts_with("data.corpus.config: "), "{err}");
    assert!(err.contains("default, other"), "{err}");
    cfg.config = Some("default".into());
    assert!(load(cfg.clone()).is_ok());
    cfg.config = Some("nope".into());
    let err = load(cfg).unwrap_err().to_string();
    assert!(err.contains("its folders: default, other"), "{err}");
}

#[test]
fn a_hub_dataset_is_read_from_the_hugging_face_cache_without_the_network() {
    let dir = tempfile::tempdir().unwrap();
    // The layout huggingface_hub and hf-hub write: refs/<revision> holds the commit.
    let repo_dir = dir.path().join("datasets--someone--multi30k");
    std::fs::create_dir_all(repo_dir.join("refs/refs/convert")).unwrap();
    std::fs::write(repo_dir.join("refs/refs/convert/parquet"), "0123abcd").unwrap();
    let (en, _) = write_translation_dataset(&repo_dir.join("snapshots/0123abcd"));
    // Only this test reads the variable.
    std::env::set_var("HF_HUB_CACHE", dir.path());
    let mut cfg = hf(dir.path(), translation_columns("en", "de"));
    cfg.path = None;
    cfg.repo = Some("someone/multi30k".into());
    let RawCorpus::Translation { train, .. } = load(cfg.clone()).unwrap() else {
        panic!()
    };
    assert_eq!(train.sources, en);
    cfg.repo = Some("someone/absent".into());
    let err = load(cfg.clone()).unwrap_err().to_string();
    assert!(
        err.starts_with("data.corpus.repo: someone/absent at revision refs/convert/parquet is not in the Hugging Face cache"),
        "{err}"
    );
    assert!(
        err.contains("huggingface-cli download --repo-type dataset someone/absent"),
        "{err}"
    );

    // Another revision: a branch through its ref, or a commit hash directly.
    std::fs::write(repo_dir.join("refs/main"), "4567cdef").unwrap();
    write_translation_dataset(&repo_dir.join("snapshots/4567cdef"));
    std::fs::write(
        repo_dir.join("snapshots/4567cdef/default/train/extra.parquet"),
        b"",
    )
    .unwrap();
    cfg.repo = Some("someone/multi30k".into());
    cfg.revision = Some("main".into());
    let err = load(cfg.clone()).unwrap_err().to_string();
    assert!(
        err.contains("4567cdef/default/train/extra.parquet"),
        "main is read, not the parquet branch: {err}"
    );
    cfg.revision = Some("0123abcd".into());
    assert!(load(cfg.clone()).is_ok());
    cfg.revision = Some("v2".into());
    let err = load(cfg).unwrap_err().to_string();
    assert!(
        err.starts_with("data.corpus.revision: someone/multi30k at revision v2 is not in"),
        "{err}"
    );
}

fn char_text_files(dir: &Path) -> (PathBuf, PathBuf) {
    let train: String = (0..60)
        .map(|i| format!("to be or not to be, line {i}\n"))
        .collect();
    let valid: String = (0..10).map(|i| format!("that is the question {i}\n")).collect();
    (
        common::write(dir, "train.txt", train.as_bytes()),
        common::write(dir, "valid.txt", valid.as_bytes()),
    )
}

#[test]
fn token_shards_round_trip_to_the_ids_of_the_text_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let (train, valid) = char_text_files(dir.path());
    for kind in [TokenizerKind::Char, TokenizerKind::Bpe] {
        let run = dir.path().join(format!("run-{kind:?}"));
        let text = DataConfig {
            corpus: CorpusConfig::Text(TextConfig {
                path: None,
                val_fraction: None,
                train_files: vec![train.clone()],
                val_files: vec![valid.clone()],
            }),
            tokenizer: TokenizerConfig {
                kind,
                path: None,
                vocab_size: (kind == TokenizerKind::Bpe).then_some(120),
                lowercase: false,
            },
            ..DataConfig::default()
        };
        let from_text = Dataset::prepare(&text, Some(&run)).unwrap();
        let tok = Tokenizer::load(run.join("tokenizer.json")).unwrap();
        let (train_bin, valid_bin) = (dir.path().join("train.bin"), dir.path().join("valid.bin"));
        let n = tokenize_file(&tok, &train, &train_bin).unwrap();
        tokenize_file(&tok, &valid, &valid_bin).unwrap();
        let Splits::Text(t) = &from_text.splits else {
            panic!()
        };
        assert_eq!(n, t.train.len());
        assert_eq!(read_shard(&train_bin, None).unwrap(), t.train, "{kind:?}");

        let shards = DataConfig {
            corpus: CorpusConfig::TokenShards(TokenShardsConfig {
                train_files: vec![train_bin.clone()],
                val_files: vec![valid_bin.clone()],
                tokenizer: run.clone(),
            }),
            ..DataConfig::default()
        };
        let shard_run = dir.path().join(format!("shard-run-{kind:?}"));
        let streams = |d: &Dataset| {
            let Splits::Text(t) = &d.splits else { panic!() };
            (t.train.clone(), t.valid.clone())
        };
        let from_shards = Dataset::prepare(&shards, Some(&shard_run)).unwrap();
        assert_eq!(streams(&from_shards), streams(&from_text), "{kind:?}");
        assert_eq!(
            std::fs::read_to_string(shard_run.join("tokenizer.json")).unwrap(),
            std::fs::read_to_string(run.join("tokenizer.json")).unwrap(),
            "the shards' tokenizer becomes the run's"
        );
        // Opened again (resume, eval), the run keeps it.
        assert_eq!(
            streams(&Dataset::prepare(&shards, Some(&shard_run)).unwrap()),
            streams(&from_text)
        );
    }
}

#[test]
fn token_shards_with_ids_beyond_the_vocabulary_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (train, valid) = char_text_files(dir.path());
    let tok = Tokenizer::train_chars([std::fs::read_to_string(&train).unwrap().as_str()], false).unwrap();
    let tok_path = dir.path().join("tokenizer.json");
    tok.save(&tok_path).unwrap();
    let good = dir.path().join("valid.bin");
    tokenize_file(&tok, &valid, &good).unwrap();
    let bad = dir.path().join("bad.bin");
    write_shard(&bad, &[5, 6, tok.vocab_size() as u32]).unwrap();
    let cfg = DataConfig {
        corpus: CorpusConfig::TokenShards(TokenShardsConfig {
            train_files: vec![bad],
            val_files: vec![good],
            tokenizer: tok_path,
        }),
        ..DataConfig::default()
    };
    let err = Dataset::prepare(&cfg, None).unwrap_err().to_string();
    assert!(err.contains("bad.bin holds id"), "{err}");
    assert!(err.contains("at token 2"), "{err}");
}

#[test]
fn hf_dataset_settings_are_checked_before_any_file_is_read() {
    let check = |cfg: HfDatasetConfig| {
        DataConfig {
            corpus: CorpusConfig::HfDataset(cfg),
            ..DataConfig::default()
        }
        .validate()
        .map_err(|e| e.to_string())
    };
    let dir = Path::new("/nonexistent");
    assert!(check(hf(dir, text_column("text"))).is_ok());
    let mut both = hf(dir, text_column("text"));
    both.repo = Some("a/b".into());
    assert!(check(both)
        .unwrap_err()
        .starts_with("data.corpus.repo: give either path"));
    let mut rev = hf(dir, text_column("text"));
    rev.revision = Some("main".into());
    assert!(check(rev)
        .unwrap_err()
        .starts_with("data.corpus.revision: only applies to repo"));
    let mut bad_repo = hf(dir, text_column("text"));
    bad_repo.path = None;
    bad_repo.repo = Some("owner/name/extra".into());
    assert!(check(bad_repo).unwrap_err().contains("is not a Hub dataset id"));
    let half = hf(
        dir,
        HfColumns {
            text: None,
            source: Some("en".into()),
            target: None,
        },
    );
    assert!(check(half)
        .unwrap_err()
        .starts_with("data.corpus.columns.target: missing"));
    let none = hf(
        dir,
        HfColumns {
            text: None,
            source: None,
            target: None,
        },
    );
    assert!(check(none).unwrap_err().starts_with("data.corpus.columns: "));
}

#[test]
fn the_fingerprint_of_token_shards_follows_their_ids() {
    // What `train --resume` compares: a changed shard must not pass for the one trained on.
    let shard = |ids: Vec<u32>| ember_data::TokenShard {
        path: PathBuf::from("x.bin"),
        ids,
    };
    let corpus = |train: Vec<u32>| RawCorpus::Tokens {
        train: vec![shard(train)],
        valid: vec![shard(vec![7, 8, 9])],
    };
    let a = corpus(vec![1, 2, 3, 4]);
    assert_eq!(a.fingerprint(), corpus(vec![1, 2, 3, 4]).fingerprint());
    assert_ne!(a.fingerprint(), corpus(vec![1, 2, 3, 5]).fingerprint());
    assert_ne!(
        a.fingerprint(),
        RawCorpus::Tokens {
            train: vec![],
            valid: vec![]
        }
        .fingerprint()
    );
}
