//! Specification of `data.tokenizer.kind: pretrained`: a model's own tokenizer (here a
//! GPT-2-style byte-level BPE whose only special token is `<|endoftext|>` at id 0, nothing like
//! Ember's four) is read from its folder as transformers wrote it, gives the ids the tokenizers
//! library gives, names its special tokens from `tokenizer_config.json`, and is copied into the
//! run directory, whose copy a later run reads.

use std::path::Path;

use ember_data::{
    CorpusConfig, DataConfig, Dataset, TextConfig, Tokenizer, TokenizerConfig, TokenizerKind,
    TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, TruncationParams};

const TEXT: &str =
    "The quick brown fox jumps over the lazy dog.\nA second line, with commas; and more words.\n";

/// Writes a byte-level BPE (`<|endoftext|>` = 0) and its tokenizer_config.json into `dir`. With
/// `truncate`, the tokenizer.json asks for truncation to 4 tokens, as some downloaded ones do.
fn byte_level_model(dir: &Path, merges: usize, truncate: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    // GPT-2's settings (SmolLM's and Qwen's too): no space added before the text.
    tok.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tok.with_decoder(Some(ByteLevel::default().add_prefix_space(false)));
    let mut trainer: TrainerWrapper = BpeTrainer::builder()
        .vocab_size(256 + 1 + merges)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
        .show_progress(false)
        .build()
        .into();
    let corpus = dir.join("train-tokenizer.txt");
    std::fs::write(&corpus, TEXT.repeat(5)).unwrap();
    tok.train_from_files(&mut trainer, vec![corpus.display().to_string()])
        .unwrap();
    if truncate {
        tok.with_truncation(Some(TruncationParams {
            max_length: 4,
            ..Default::default()
        }))
        .unwrap();
    }
    tok.save(dir.join(TOKENIZER_FILE), true).unwrap();
    let config = serde_json::json!({
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": null,
        "eos_token": "<|endoftext|>",
        "pad_token": {"content": "<|endoftext|>", "special": true},
        "model_max_length": 2048,
    });
    std::fs::write(dir.join(TOKENIZER_CONFIG_FILE), config.to_string()).unwrap();
}

fn text_config(dir: &Path, model: &Path) -> DataConfig {
    let (train, valid) = (dir.join("train.txt"), dir.join("valid.txt"));
    std::fs::write(&train, TEXT.repeat(20) + "<|endoftext|>" + TEXT).unwrap();
    std::fs::write(&valid, TEXT.repeat(3)).unwrap();
    DataConfig {
        corpus: CorpusConfig::Text(TextConfig {
            path: None,
            val_fraction: None,
            train_files: vec![train],
            val_files: vec![valid],
        }),
        tokenizer: TokenizerConfig {
            kind: TokenizerKind::Pretrained,
            path: Some(model.to_path_buf()),
            vocab_size: None,
            lowercase: false,
        },
        ..DataConfig::default()
    }
}

#[test]
fn a_pretrained_tokenizer_gives_the_tokenizers_librarys_ids_and_its_own_special_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    byte_level_model(&model, 40, true);
    let run = tmp.path().join("run");
    let data = Dataset::prepare(&text_config(tmp.path(), &model), Some(&run)).unwrap();

    let reference = tokenizers::Tokenizer::from_file(model.join(TOKENIZER_FILE)).unwrap();
    let mut reference = reference;
    reference.with_truncation(None).unwrap();
    let train_text = std::fs::read_to_string(tmp.path().join("train.txt")).unwrap();
    let expected = reference
        .encode(train_text.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    let splits = data.splits.text().unwrap();
    assert_eq!(splits.train, expected, "the library's ids, untruncated");
    assert!(splits.train.len() > 4);
    assert_eq!(
        splits.train.iter().filter(|&&i| i == 0).count(),
        1,
        "<|endoftext|> written in the text is the special token, as in transformers"
    );
    assert_eq!(
        splits.stats.train_unk_tokens, 0,
        "a byte-level vocabulary has no unknown token"
    );

    let specials = data.tokenizer.special_tokens();
    assert_eq!(
        (specials.eos, specials.pad, specials.bos, specials.unk),
        (Some(0), Some(0), None, None)
    );
    assert_eq!(data.tokenizer.kind(), TokenizerKind::Pretrained);
    assert_eq!(
        data.tokenizer
            .decode(&data.tokenizer.encode("lazy dog.").unwrap())
            .unwrap(),
        "lazy dog."
    );

    // The run keeps its copy, and reads it from then on: also with the model folder gone.
    assert!(run.join(TOKENIZER_FILE).is_file());
    assert_eq!(
        std::fs::read_to_string(run.join(TOKENIZER_CONFIG_FILE)).unwrap(),
        std::fs::read_to_string(model.join(TOKENIZER_CONFIG_FILE)).unwrap()
    );
    let again = Dataset::prepare(&text_config(tmp.path(), &model), Some(&run)).unwrap();
    assert_eq!(again.splits.text().unwrap().train, expected);
    std::fs::rename(&model, tmp.path().join("moved")).unwrap();
    let moved = Dataset::prepare(&text_config(tmp.path(), &model), Some(&run)).unwrap();
    assert_eq!(moved.splits.text().unwrap().train, expected);
    assert_eq!(moved.tokenizer.special_tokens().eos, Some(0));
}

#[test]
fn a_run_refuses_a_model_folder_whose_tokenizer_is_not_its_own() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    byte_level_model(&model, 40, false);
    let run = tmp.path().join("run");
    Dataset::prepare(&text_config(tmp.path(), &model), Some(&run)).unwrap();
    byte_level_model(&model, 20, false);
    let e = Dataset::prepare(&text_config(tmp.path(), &model), Some(&run))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("differs from the tokenizer of data.tokenizer.path"),
        "{e}"
    );
}

#[test]
fn a_tokenizer_config_naming_a_token_the_vocabulary_lacks_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    byte_level_model(tmp.path(), 10, false);
    std::fs::write(tmp.path().join(TOKENIZER_CONFIG_FILE), r#"{"eos_token": "</s>"}"#).unwrap();
    let e = Tokenizer::load_pretrained(tmp.path()).unwrap_err().to_string();
    assert!(
        e.contains("eos_token is \"</s>\"") && e.contains(TOKENIZER_CONFIG_FILE),
        "{e}"
    );
    // Without a tokenizer_config.json the tokenizer has no known special tokens.
    std::fs::remove_file(tmp.path().join(TOKENIZER_CONFIG_FILE)).unwrap();
    let tok = Tokenizer::load_pretrained(tmp.path()).unwrap();
    assert_eq!(tok.special_tokens(), Default::default());
}

#[test]
fn pretrained_settings_that_cannot_work_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    let base = text_config(tmp.path(), &model);
    let key_of = |cfg: &DataConfig| match cfg.validate() {
        Err(ember_data::DataError::Config { key, message }) => format!("{key}: {message}"),
        other => panic!("expected a config error, got {other:?}"),
    };
    let mut c = base.clone();
    c.tokenizer.path = None;
    assert!(key_of(&c).starts_with("data.tokenizer.path: kind: pretrained needs"));
    let mut c = base.clone();
    c.tokenizer.vocab_size = Some(100);
    assert!(key_of(&c).starts_with("data.tokenizer.vocab_size: does not apply"));
    let mut c = base.clone();
    c.tokenizer.kind = TokenizerKind::Bpe;
    assert!(key_of(&c).starts_with("data.tokenizer.path: applies to kind: pretrained only"));
    let mut c = base.clone();
    c.corpus = CorpusConfig::default();
    assert!(key_of(&c).contains("pretrained tokenizers are for language models"));
    // The YAML spelling.
    let yaml = "kind: pretrained\npath: models/smollm\n";
    let t: TokenizerConfig = serde_saphyr::from_str(yaml).unwrap();
    assert_eq!(t.kind, TokenizerKind::Pretrained);
    assert_eq!(t.path.as_deref(), Some(Path::new("models/smollm")));
}
