//! Specification: what the data loses on its way to token ids is said, not silent. Windows line
//! endings, characters the tokenizer does not know (read as `<unk>`) and a validation split
//! that is the training data each give a warning naming the file or key.

use ember_data::{DataConfig, Dataset};

fn parse(yaml: &str) -> DataConfig {
    serde_saphyr::from_str::<DataConfig>(yaml).unwrap()
}

fn text_config(path: &std::path::Path) -> DataConfig {
    parse(&format!(
        "corpus: {{ kind: text, path: \"{}\", val_fraction: 0.2 }}\ntokenizer: {{ kind: char }}\n",
        path.display()
    ))
}

#[test]
fn windows_line_endings_are_named_with_their_file_and_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dos.txt");
    std::fs::write(&path, "hello there\r\ngeneral kenobi\r\n".repeat(20)).unwrap();
    let data = Dataset::prepare(&text_config(&path), None).unwrap();
    let w = data.warnings().join("\n");
    assert!(w.contains("dos.txt has 40 Windows line ending(s) (CRLF)"), "{w}");
    assert!(w.contains("read as plain newlines"), "{w}");
    // The '\r' is no character of the vocabulary, and no token of the text.
    assert!(
        data.tokenizer
            .encode("\r")
            .unwrap()
            .iter()
            .all(|&id| id == ember_data::UNK_ID),
        "{w}"
    );
    let ember_data::RawCorpus::Text { train, .. } = &data.raw else {
        panic!("a text corpus")
    };
    assert!(train.iter().all(|t| !t.text.contains('\r')));

    std::fs::write(&path, "hello there\ngeneral kenobi\n".repeat(20)).unwrap();
    let data = Dataset::prepare(&text_config(&path), None).unwrap();
    assert!(data.warnings().is_empty(), "{:?}", data.warnings());
}

#[test]
fn characters_the_tokenizer_does_not_know_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("text.txt");
    // The validation part (the last 20%) has characters the training part never shows.
    let text = format!("{}{}", "abc abc abc\n".repeat(40), "xyz Ω\n".repeat(10));
    std::fs::write(&path, text).unwrap();
    let data = Dataset::prepare(&text_config(&path), None).unwrap();
    let w = data.warnings().join("\n");
    assert!(w.contains("validation tokens") && w.contains("<unk>"), "{w}");
    assert!(
        !w.contains("training tokens"),
        "the training text knows all its characters: {w}"
    );
}

#[test]
fn a_validation_split_that_is_the_training_data_is_named() {
    let cfg = parse(
        "corpus:\n  kind: hf_dataset\n  path: somewhere\n  splits: { train: train, valid: train }\n  columns: { text: text }\n",
    );
    let w = cfg.warnings().join("\n");
    assert!(
        w.contains("data.corpus.splits.valid") && w.contains("\"train\""),
        "{w}"
    );
    let cfg = parse("corpus:\n  kind: text\n  train_files: [a.txt, b.txt]\n  val_files: [b.txt]\n");
    assert!(
        cfg.warnings().join("\n").contains("data.corpus.val_files"),
        "{:?}",
        cfg.warnings()
    );
    let cfg = parse("corpus:\n  kind: text\n  train_files: [a.txt]\n  val_files: [b.txt]\n");
    assert!(cfg.warnings().is_empty());
}
