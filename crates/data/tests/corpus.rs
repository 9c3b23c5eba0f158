//! Corpus rules: what is read, what is dropped and counted, and the error every bad input gives.

mod common;

use std::path::Path;

use ember_data::{CacheStatus, TokenizerOrigin, TOKEN_CACHE_FILE};
use ember_data::{
    CorpusConfig, DataConfig, DataError, Dataset, EmbeddedConfig, PairPaths, ParallelConfig, RawCorpus,
    Splits, TextConfig, TokenizerConfig, TokenizerKind, TOKENIZER_FILE,
};

fn parallel_cfg(train: (&Path, &Path), valid: (&Path, &Path), vocab: usize) -> DataConfig {
    DataConfig {
        corpus: CorpusConfig::Parallel(ParallelConfig {
            train: PairPaths {
                source: train.0.into(),
                target: train.1.into(),
            },
            valid: PairPaths {
                source: valid.0.into(),
                target: valid.1.into(),
            },
            test: None,
        }),
        tokenizer: TokenizerConfig {
            kind: TokenizerKind::Bpe,
            path: None,
            vocab_size: Some(vocab),
            lowercase: false,
        },
        ..DataConfig::default()
    }
}

/// Writes the toy corpus as train (plain) and valid (gzip) files.
fn toy_files(dir: &Path) -> DataConfig {
    let (en, de) = common::toy_parallel();
    let s = common::write(dir, "train.en", (en.join("\n") + "\n").as_bytes());
    let t = common::write(dir, "train.de", (de.join("\n") + "\n").as_bytes());
    let vs = common::write_gz(dir, "val.en.gz", b"Two dogs play.\nA man reads.\n");
    let vt = common::write_gz(dir, "val.de.gz", b"Zwei Hunde spielen.\nEin Mann liest.\n");
    parallel_cfg((&s, &t), (&vs, &vt), 200)
}

fn expect_err(cfg: &DataConfig) -> DataError {
    match RawCorpus::load(&cfg.corpus) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[test]
fn parallel_files_plain_and_gzip_are_read_line_aligned() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = toy_files(dir.path());
    let RawCorpus::Translation { train, valid, test } = RawCorpus::load(&cfg.corpus).unwrap() else {
        panic!()
    };
    assert_eq!(train.sources.len(), 8);
    assert_eq!(train.sources[1], "Two dogs are playing in the snow.");
    assert_eq!(train.targets[1], "Zwei Hunde spielen im Schnee.");
    assert_eq!(valid.sources, vec!["Two dogs play.", "A man reads."]);
    assert!(test.is_none());
}

#[test]
fn misaligned_line_counts_are_an_error_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let s = common::write(dir.path(), "a.en", b"one\ntwo\nthree\n");
    let t = common::write(dir.path(), "a.de", b"eins\nzwei\n");
    let err = expect_err(&parallel_cfg((&s, &t), (&s, &t), 100));
    assert!(matches!(
        err,
        DataError::Misaligned {
            source_lines: 3,
            target_lines: 2,
            ..
        }
    ));
    let msg = err.to_string();
    assert!(
        msg.contains("a.en") && msg.contains("a.de") && msg.contains("3 lines") && msg.contains("2"),
        "{msg}"
    );
}

#[test]
fn a_missing_final_newline_does_not_count_as_misalignment() {
    let dir = tempfile::tempdir().unwrap();
    let s = common::write(dir.path(), "a.en", b"one\r\ntwo\r\n");
    let t = common::write(dir.path(), "a.de", b"eins\nzwei");
    let RawCorpus::Translation { train, .. } =
        RawCorpus::load(&parallel_cfg((&s, &t), (&s, &t), 100).corpus).unwrap()
    else {
        panic!()
    };
    assert_eq!(train.sources, vec!["one", "two"]);
    assert_eq!(train.targets, vec!["eins", "zwei"]);
}

#[test]
fn an_empty_file_is_an_error_naming_the_file_and_its_config_key() {
    let dir = tempfile::tempdir().unwrap();
    let s = common::write(dir.path(), "a.en", b"one\n");
    let empty = common::write(dir.path(), "empty.de", b"\n  \n");
    let err = expect_err(&parallel_cfg((&s, &empty), (&s, &s), 100));
    assert!(matches!(err, DataError::EmptyFile { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("empty.de") && msg.contains("data.corpus.train.target"),
        "{msg}"
    );
}

#[test]
fn invalid_utf8_is_an_error_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let s = common::write(dir.path(), "a.en", b"one\ntwo\nthr\xffee\n");
    let t = common::write(dir.path(), "a.de", b"eins\nzwei\ndrei\n");
    let err = expect_err(&parallel_cfg((&s, &t), (&s, &t), 100));
    assert!(matches!(err, DataError::InvalidUtf8 { line: 3, .. }), "{err:?}");
    assert!(err.to_string().contains("a.en:3:"), "{err}");
    // Inside gzip too.
    let g = common::write_gz(dir.path(), "b.en.gz", b"ok\n\xc3\x28\n");
    let t2 = common::write(dir.path(), "b.de", b"ok\nok\n");
    let err = expect_err(&parallel_cfg((&t2, &t2), (&g, &t2), 100));
    assert!(matches!(err, DataError::InvalidUtf8 { line: 2, .. }), "{err:?}");
    assert!(err.to_string().contains("b.en.gz:2:"), "{err}");
}

#[test]
fn missing_and_corrupt_files_are_errors_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let s = common::write(dir.path(), "a.en", b"one\n");
    let missing = dir.path().join("missing.de");
    let err = expect_err(&parallel_cfg((&s, &missing), (&s, &s), 100)).to_string();
    assert!(
        err.contains("data.corpus.train.target") && err.contains("missing.de") && err.contains("get-data.sh"),
        "{err}"
    );

    let mut gz = std::fs::read(common::write_gz(
        dir.path(),
        "x.gz",
        b"hello world\n".repeat(100).as_slice(),
    ))
    .unwrap();
    gz.truncate(gz.len() / 2);
    let broken = common::write(dir.path(), "broken.en.gz", &gz);
    let err = expect_err(&parallel_cfg((&broken, &s), (&s, &s), 100));
    assert!(matches!(err, DataError::Io { .. }));
    assert!(
        err.to_string().contains("broken.en.gz") && err.to_string().contains("truncated"),
        "{err}"
    );
}

#[test]
fn blank_pairs_are_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let s = common::write(dir.path(), "a.en", b"one\n\nthree\nfour\n");
    let t = common::write(dir.path(), "a.de", b"eins\nzwei\n   \nvier\n");
    let RawCorpus::Translation { train, .. } =
        RawCorpus::load(&parallel_cfg((&s, &t), (&s, &t), 100).corpus).unwrap()
    else {
        panic!()
    };
    assert_eq!(train.sources, vec!["one", "four"]);
    assert_eq!(train.dropped_empty, 2);
}

#[test]
fn training_pairs_over_the_length_limits_are_dropped_and_counted_but_eval_pairs_never_are() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = toy_files(dir.path());
    let long_val = common::write(dir.path(), "long.en", "word ".repeat(50).trim().as_bytes());
    let long_val_de = common::write(dir.path(), "long.de", b"Wort");
    if let CorpusConfig::Parallel(p) = &mut cfg.corpus {
        p.valid = PairPaths {
            source: long_val,
            target: long_val_de,
        };
    }
    // Limits at the median lengths of the unfiltered corpus.
    let unfiltered = Dataset::prepare(&cfg, None).unwrap();
    let median = |f: &dyn Fn(&ember_data::Example) -> usize| {
        let mut v: Vec<usize> = unfiltered
            .splits
            .translation()
            .unwrap()
            .train
            .examples
            .iter()
            .map(f)
            .collect();
        v.sort();
        v[v.len() / 2]
    };
    let (max_src, max_tgt) = (median(&|e| e.source.len()), median(&|e| e.target.len()));
    cfg.max_source_len = max_src;
    cfg.max_target_len = max_tgt;
    let data = Dataset::prepare(&cfg, None).unwrap();
    let Splits::Translation(s) = &data.splits else {
        panic!()
    };
    let dropped = s.train.stats.dropped_too_long;
    assert!(dropped > 0 && dropped < 8, "dropped {dropped}");
    assert_eq!(s.train.stats.pairs + dropped, 8);
    assert_eq!(s.train.examples.len(), s.train.sources.len());
    assert!(s
        .train
        .examples
        .iter()
        .all(|e| e.source.len() <= max_src && e.target.len() <= max_tgt));
    // Raw text stays aligned with ids after filtering.
    for (ex, src) in s.train.examples.iter().zip(&s.train.sources) {
        assert_eq!(data.tokenizer.decode(&ex.source).unwrap(), *src);
    }
    assert_eq!(s.valid.stats.pairs, 1);
    assert_eq!(s.valid.stats.dropped_too_long, 0);
    assert!(s.valid.examples[0].source.len() > max_src);
}

#[test]
fn dropping_every_training_pair_is_an_error_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = toy_files(dir.path());
    cfg.max_source_len = 1;
    let err = Dataset::prepare(&cfg, None).unwrap_err();
    assert!(
        matches!(err, DataError::Config { ref key, .. } if key == "data.max_source_len"),
        "{err}"
    );
}

#[test]
fn prepare_trains_and_saves_the_tokenizer_then_reuses_it_and_the_token_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = toy_files(dir.path());
    let run = dir.path().join("run");
    let first = Dataset::prepare(&cfg, Some(&run)).unwrap();
    assert_eq!(
        first.report.tokenizer,
        TokenizerOrigin::Trained(Some(run.join(TOKENIZER_FILE)))
    );
    assert_eq!(first.report.cache, CacheStatus::Written);
    assert!(run.join(TOKENIZER_FILE).exists() && run.join(TOKEN_CACHE_FILE).exists());

    let second = Dataset::prepare(&cfg, Some(&run)).unwrap();
    assert_eq!(
        second.report.tokenizer,
        TokenizerOrigin::Loaded(run.join(TOKENIZER_FILE))
    );
    assert_eq!(second.report.cache, CacheStatus::Hit);
    assert_eq!(first.splits, second.splits);

    // Changing the text invalidates the cache instead of serving stale ids.
    let (en, _) = common::toy_parallel();
    let mut en2 = en.clone();
    en2[0] = "A woman is riding a horse down the street.".into();
    let CorpusConfig::Parallel(p) = &cfg.corpus else {
        panic!()
    };
    std::fs::write(&p.train.source, en2.join("\n")).unwrap();
    let third = Dataset::prepare(&cfg, Some(&run)).unwrap();
    assert_eq!(third.report.cache, CacheStatus::Written);
    let Splits::Translation(s) = &third.splits else {
        panic!()
    };
    assert_eq!(
        third.tokenizer.decode(&s.train.examples[0].source).unwrap(),
        en2[0]
    );
}

#[test]
fn a_run_tokenizer_that_contradicts_the_config_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = toy_files(dir.path());
    let run = dir.path().join("run");
    Dataset::prepare(&cfg, Some(&run)).unwrap();
    let mut char_cfg = cfg.clone();
    char_cfg.tokenizer = TokenizerConfig {
        kind: TokenizerKind::Char,
        path: None,
        vocab_size: None,
        lowercase: false,
    };
    let err = Dataset::prepare(&char_cfg, Some(&run)).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("data.tokenizer.kind"),
        "{err}"
    );
    let mut lower = cfg.clone();
    lower.tokenizer.lowercase = true;
    let err = Dataset::prepare(&lower, Some(&run)).unwrap_err().to_string();
    assert!(err.contains("data.tokenizer.lowercase"), "{err}");
    let mut smaller = cfg.clone();
    smaller.tokenizer.vocab_size = Some(100);
    let err = Dataset::prepare(&smaller, Some(&run)).unwrap_err().to_string();
    assert!(err.contains("data.tokenizer.vocab_size"), "{err}");
}

#[test]
fn embedded_corpus_needs_no_files_and_keeps_raw_references() {
    let cfg = DataConfig {
        corpus: CorpusConfig::Embedded(EmbeddedConfig {
            seed: 3,
            train_size: 2000,
            val_size: 100,
            test_size: 100,
        }),
        tokenizer: TokenizerConfig {
            kind: TokenizerKind::Bpe,
            path: None,
            vocab_size: Some(600),
            lowercase: false,
        },
        ..DataConfig::default()
    };
    let data = Dataset::prepare(&cfg, None).unwrap();
    let Splits::Translation(s) = &data.splits else {
        panic!()
    };
    assert_eq!(s.train.stats.pairs, 2000);
    assert_eq!(s.valid.references.len(), 100);
    assert_eq!(s.test.as_ref().unwrap().stats.pairs, 100);
    for (ex, reference) in s
        .test
        .as_ref()
        .unwrap()
        .examples
        .iter()
        .zip(&s.test.as_ref().unwrap().references)
    {
        assert_eq!(data.tokenizer.decode(&ex.target).unwrap(), *reference);
    }
    assert!(s.train.stats.p975_source_len >= s.train.stats.avg_source_len as usize);
    assert_eq!(data.raw.tokenizer_texts().len(), 4000);
}

fn text_cfg(t: TextConfig) -> DataConfig {
    DataConfig {
        corpus: CorpusConfig::Text(t),
        tokenizer: TokenizerConfig {
            kind: TokenizerKind::Char,
            path: None,
            vocab_size: None,
            lowercase: false,
        },
        ..DataConfig::default()
    }
}

#[test]
fn text_corpus_is_split_by_fraction_at_a_line_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let body: String = (0..100).map(|i| format!("line number {i}\n")).collect();
    let path = common::write(dir.path(), "input.txt", body.as_bytes());
    let cfg = text_cfg(TextConfig {
        path: Some(path),
        val_fraction: Some(0.2),
        train_files: vec![],
        val_files: vec![],
    });
    let data = Dataset::prepare(&cfg, None).unwrap();
    let Splits::Text(t) = &data.splits else { panic!() };
    let train = data.tokenizer.decode(&t.train).unwrap();
    let valid = data.tokenizer.decode(&t.valid).unwrap();
    assert_eq!(format!("{train}{valid}"), body);
    assert!(valid.starts_with("line number 8"), "{valid:.30}");
    assert!((valid.len() as f64 / body.len() as f64 - 0.2).abs() < 0.02);
    assert_eq!(t.stats.train_tokens + t.stats.valid_tokens, body.len());
}

#[test]
fn text_corpus_from_files_keeps_the_files_apart() {
    let dir = tempfile::tempdir().unwrap();
    let a = common::write(dir.path(), "a.txt", b"to be or not to be\n");
    let b = common::write_gz(dir.path(), "b.txt.gz", b"that is the question\n");
    let v = common::write(dir.path(), "v.txt", b"be not\n");
    let cfg = text_cfg(TextConfig {
        path: None,
        val_fraction: None,
        train_files: vec![a, b],
        val_files: vec![v],
    });
    let data = Dataset::prepare(&cfg, None).unwrap();
    let t = data.splits.text().unwrap();
    assert_eq!(
        data.tokenizer.decode(&t.train).unwrap(),
        "to be or not to be\nthat is the question\n"
    );
    assert_eq!(data.tokenizer.decode(&t.valid).unwrap(), "be not\n");
}

#[test]
fn text_corpus_errors_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let empty = common::write(dir.path(), "empty.txt", b"");
    let cfg = text_cfg(TextConfig {
        path: Some(empty),
        val_fraction: None,
        train_files: vec![],
        val_files: vec![],
    });
    let err = Dataset::prepare(&cfg, None).unwrap_err().to_string();
    assert!(
        err.contains("data.corpus.path") && err.contains("empty.txt"),
        "{err}"
    );

    let one_line = common::write(
        dir.path(),
        "one.txt",
        b"just one line without a newline at the end",
    );
    let cfg = text_cfg(TextConfig {
        path: Some(one_line),
        val_fraction: Some(0.999),
        train_files: vec![],
        val_files: vec![],
    });
    let err = Dataset::prepare(&cfg, None).unwrap_err().to_string();
    assert!(err.contains("data.corpus.val_fraction"), "{err}");

    let good = common::write(dir.path(), "good.txt", b"abc\n");
    let bad = common::write(dir.path(), "bad.txt", b"\xfe\n");
    let cfg = text_cfg(TextConfig {
        path: None,
        val_fraction: None,
        train_files: vec![good],
        val_files: vec![bad],
    });
    let err = Dataset::prepare(&cfg, None).unwrap_err().to_string();
    assert!(err.contains("bad.txt:1:"), "{err}");
}

#[test]
fn tiny_shakespeare_char_corpus_has_65_characters_and_a_90_10_split() {
    let Some(root) = common::shared_data("tiny_shakespeare_char_corpus") else {
        return;
    };
    let cfg = text_cfg(TextConfig {
        path: Some(root.join("tinyshakespeare/input.txt")),
        val_fraction: None,
        train_files: vec![],
        val_files: vec![],
    });
    let data = Dataset::prepare(&cfg, None).unwrap();
    let t = data.splits.text().unwrap();
    assert_eq!(data.tokenizer.vocab_size(), 4 + 65);
    assert_eq!(t.train.len() + t.valid.len(), 1_115_394);
    let frac = t.valid.len() as f64 / 1_115_394.0;
    assert!((frac - 0.1).abs() < 0.001, "{frac}");
    assert_eq!(t.stats.valid_unk_tokens, 0);
}

#[test]
fn multi30k_loads_29000_training_pairs_with_statistics() {
    let Some(root) = common::shared_data("multi30k_loads_29000_training_pairs") else {
        return;
    };
    let m = root.join("multi30k");
    let mut cfg = parallel_cfg(
        (&m.join("train.en.gz"), &m.join("train.de.gz")),
        (&m.join("val.en.gz"), &m.join("val.de.gz")),
        8000,
    );
    if let CorpusConfig::Parallel(p) = &mut cfg.corpus {
        p.test = Some(PairPaths {
            source: m.join("test_2016_flickr.en.gz"),
            target: m.join("test_2016_flickr.de.gz"),
        });
    }
    let run = tempfile::tempdir().unwrap();
    let data = Dataset::prepare(&cfg, Some(run.path())).unwrap();
    let s = data.splits.translation().unwrap();
    assert_eq!(
        s.train.stats.pairs + s.train.stats.dropped_too_long + s.train.stats.dropped_empty,
        29_000
    );
    assert_eq!(s.valid.stats.pairs, 1014);
    assert_eq!(s.test.as_ref().unwrap().stats.pairs, 1000);
    assert_eq!(data.tokenizer.vocab_size(), 8000);
    assert!(s.train.stats.avg_tokens_per_sentence() > 10.0 && s.train.stats.avg_tokens_per_sentence() < 20.0);
    // Second load reads the token cache.
    let again = Dataset::prepare(&cfg, Some(run.path())).unwrap();
    assert_eq!(again.report.cache, CacheStatus::Hit);
    println!(
        "multi30k: tokenise {:.3}s uncached, {:.3}s cached",
        data.report.tokenize_secs, again.report.tokenize_secs
    );
}
