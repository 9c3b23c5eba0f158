//! The `data:` config: the documented YAML shapes parse, typos are rejected, and `validate`
//! names the offending key.

use std::path::PathBuf;

use ember_data::{
    CorpusConfig, DataConfig, DataError, EmbeddedConfig, PairPaths, ParallelConfig, TextConfig,
    TokenizerConfig, TokenizerKind,
};

/// The YAML a run config's `data:` section holds (the mapping under `data:`).
fn parse(yaml: &str) -> Result<DataConfig, String> {
    serde_saphyr::from_str::<DataConfig>(yaml).map_err(|e| e.to_string())
}

const EMBEDDED_YAML: &str = "
corpus:
  kind: embedded
  seed: 1234
  train_size: 20000
  val_size: 500
  test_size: 500
tokenizer: { kind: bpe, vocab_size: 1000 }
";

const MULTI30K_YAML: &str = "
corpus:
  kind: parallel
  train: { source: data/multi30k/train.en.gz, target: data/multi30k/train.de.gz }
  valid: { source: data/multi30k/val.en.gz, target: data/multi30k/val.de.gz }
  test:  { source: data/multi30k/test_2016_flickr.en.gz, target: data/multi30k/test_2016_flickr.de.gz }
tokenizer: { kind: bpe, vocab_size: 8000, lowercase: false }
max_source_len: 128
max_target_len: 128
";

const SHAKESPEARE_YAML: &str = "
corpus:
  kind: text
  path: data/tinyshakespeare/input.txt
  val_fraction: 0.1
tokenizer: { kind: char }
";

#[test]
fn the_documented_yaml_shapes_parse_and_validate() {
    let e = parse(EMBEDDED_YAML).unwrap();
    assert_eq!(e.corpus, CorpusConfig::Embedded(EmbeddedConfig::default()));
    assert_eq!(
        e.tokenizer,
        TokenizerConfig {
            kind: TokenizerKind::Bpe,
            path: None,
            vocab_size: Some(1000),
            lowercase: false
        }
    );
    e.validate().unwrap();

    let m = parse(MULTI30K_YAML).unwrap();
    let CorpusConfig::Parallel(p) = &m.corpus else {
        panic!()
    };
    assert_eq!(p.train.source, PathBuf::from("data/multi30k/train.en.gz"));
    assert_eq!(
        p.test.as_ref().unwrap().target,
        PathBuf::from("data/multi30k/test_2016_flickr.de.gz")
    );
    assert_eq!((m.max_source_len, m.max_target_len), (128, 128));
    m.validate().unwrap();

    let s = parse(SHAKESPEARE_YAML).unwrap();
    assert_eq!(
        s.corpus,
        CorpusConfig::Text(TextConfig {
            path: Some("data/tinyshakespeare/input.txt".into()),
            val_fraction: Some(0.1),
            train_files: vec![],
            val_files: vec![],
        })
    );
    s.validate().unwrap();
}

#[test]
fn defaults_are_the_embedded_quickstart() {
    let d = parse("{}").unwrap();
    assert_eq!(d, DataConfig::default());
    assert!(matches!(d.corpus, CorpusConfig::Embedded(_)));
    assert_eq!(d.tokenizer.bpe_vocab_size(), 8000);
    d.validate().unwrap();
    let e = parse("corpus: { kind: embedded }").unwrap();
    assert_eq!(e.corpus, CorpusConfig::Embedded(EmbeddedConfig::default()));
}

#[test]
fn unknown_keys_are_rejected_at_every_level() {
    for yaml in [
        "corpus: { kind: embedded }\nmax_src_len: 10",
        "corpus: { kind: embedded, train_sise: 10 }",
        "corpus: { kind: parallel, train: { source: a, target: b, extra: c }, valid: { source: a, target: b } }",
        "corpus: { kind: text, path: a, val_frac: 0.1 }",
        "tokenizer: { kind: bpe, vocab: 100 }",
        "corpus: { kind: wikipedia }",
        "tokenizer: { kind: wordpiece }",
    ] {
        assert!(parse(yaml).is_err(), "accepted: {yaml}");
    }
}

#[test]
fn a_config_round_trips_through_serde() {
    for yaml in [EMBEDDED_YAML, MULTI30K_YAML, SHAKESPEARE_YAML] {
        let cfg = parse(yaml).unwrap();
        let json = serde_json::to_string(&cfg).unwrap();
        assert_eq!(serde_json::from_str::<DataConfig>(&json).unwrap(), cfg);
    }
}

fn key_of(cfg: &DataConfig) -> String {
    match cfg.validate() {
        Err(DataError::Config { key, .. }) => key,
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn validate_names_the_offending_key() {
    let base = DataConfig::default();
    let with = |f: &dyn Fn(&mut DataConfig)| {
        let mut c = base.clone();
        f(&mut c);
        c
    };
    assert_eq!(
        key_of(&with(&|c| c.tokenizer.vocab_size = Some(4))),
        "data.tokenizer.vocab_size"
    );
    assert_eq!(
        key_of(&with(&|c| c.tokenizer = TokenizerConfig {
            kind: TokenizerKind::Char,
            path: None,
            vocab_size: Some(100),
            lowercase: false
        })),
        "data.tokenizer.vocab_size"
    );
    assert_eq!(key_of(&with(&|c| c.max_source_len = 0)), "data.max_source_len");
    assert_eq!(key_of(&with(&|c| c.max_target_len = 0)), "data.max_target_len");
    assert_eq!(
        key_of(&with(&|c| c.corpus = CorpusConfig::Embedded(EmbeddedConfig {
            train_size: 0,
            ..Default::default()
        }))),
        "data.corpus.train_size"
    );
    assert_eq!(
        key_of(&with(&|c| c.corpus = CorpusConfig::Embedded(EmbeddedConfig {
            val_size: 0,
            ..Default::default()
        }))),
        "data.corpus.val_size"
    );
    let text = |t: TextConfig| with(&move |c| c.corpus = CorpusConfig::Text(t.clone()));
    let t0 = TextConfig {
        path: None,
        val_fraction: None,
        train_files: vec![],
        val_files: vec![],
    };
    assert_eq!(key_of(&text(t0.clone())), "data.corpus.path");
    assert_eq!(
        key_of(&text(TextConfig {
            path: Some("a".into()),
            val_fraction: Some(1.0),
            ..t0.clone()
        })),
        "data.corpus.val_fraction"
    );
    assert_eq!(
        key_of(&text(TextConfig {
            path: Some("a".into()),
            train_files: vec!["b".into()],
            ..t0.clone()
        })),
        "data.corpus.path"
    );
    assert_eq!(
        key_of(&text(TextConfig {
            train_files: vec!["b".into()],
            ..t0.clone()
        })),
        "data.corpus.val_files"
    );
    assert_eq!(
        key_of(&text(TextConfig {
            train_files: vec!["b".into()],
            val_files: vec!["c".into()],
            val_fraction: Some(0.1),
            ..t0.clone()
        })),
        "data.corpus.val_fraction"
    );
    let par = with(&|c| {
        c.corpus = CorpusConfig::Parallel(ParallelConfig {
            train: PairPaths {
                source: "a".into(),
                target: "".into(),
            },
            valid: PairPaths {
                source: "a".into(),
                target: "b".into(),
            },
            test: None,
        })
    });
    assert_eq!(key_of(&par), "data.corpus.train.target");
    let msg = par.validate().unwrap_err().to_string();
    assert!(msg.starts_with("data.corpus.train.target: "), "{msg}");
}
