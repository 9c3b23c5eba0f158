//! Tokenizer rules: round trips, determinism, fixed special ids, save/load, clear errors.

mod common;

use ember_data::io::{lines, read_text};
use ember_data::{embedded, DataError, EmbeddedConfig, Tokenizer, BOS_ID, EOS_ID, PAD_ID, UNK_ID};
use ember_data::{TokenizerConfig, TokenizerKind};

fn toy_bpe(vocab: usize) -> Tokenizer {
    let (en, de) = common::toy_parallel();
    Tokenizer::train_bpe(en.iter().chain(&de).map(String::as_str), vocab, false).unwrap()
}

#[test]
fn bpe_decode_inverts_encode_for_normal_text_without_stray_spaces() {
    let tok = toy_bpe(200);
    let (en, de) = common::toy_parallel();
    for s in en.iter().chain(&de) {
        let ids = tok.encode(s).unwrap();
        assert!(!ids.contains(&UNK_ID), "{s}");
        assert_eq!(tok.decode(&ids).unwrap(), *s);
    }
    // Unseen word made of seen characters: still exact, split into subwords.
    let s = "A dog reads the stage.";
    assert_eq!(tok.decode(&tok.encode(s).unwrap()).unwrap(), s);
}

#[test]
fn bpe_keeps_moses_tokenised_punctuation_as_one_piece_with_its_space() {
    let tok = Tokenizer::train_bpe(["a man , a dog .", "two dogs ."], 50, false).unwrap();
    let ids = tok.encode("a dog .").unwrap();
    let pieces: Vec<String> = ids.iter().map(|&i| tok.id_to_token(i).unwrap()).collect();
    assert_eq!(pieces.last().map(String::as_str), Some("▁."));
    assert_eq!(tok.decode(&ids).unwrap(), "a dog .");
}

#[test]
fn bpe_training_is_deterministic() {
    let a = toy_bpe(150).to_json().unwrap();
    let b = toy_bpe(150).to_json().unwrap();
    assert_eq!(a, b);
}

#[test]
fn bpe_vocab_size_is_an_upper_bound_and_special_ids_are_fixed() {
    let tok = toy_bpe(120);
    assert_eq!(tok.vocab_size(), 120);
    assert_eq!(
        (tok.pad_id(), tok.bos_id(), tok.eos_id(), tok.unk_id()),
        (0, 1, 2, 3)
    );
    assert_eq!(tok.token_to_id("<pad>"), Some(PAD_ID));
    assert_eq!(tok.token_to_id("<s>"), Some(BOS_ID));
    assert_eq!(tok.token_to_id("</s>"), Some(EOS_ID));
    assert_eq!(tok.token_to_id("<unk>"), Some(UNK_ID));
    // A huge bound stops when nothing is left to merge.
    let big = toy_bpe(100_000);
    assert!(big.vocab_size() < 1000);
}

#[test]
fn bpe_vocab_size_smaller_than_the_alphabet_is_a_config_error() {
    let (en, de) = common::toy_parallel();
    let err = Tokenizer::train_bpe(en.iter().chain(&de).map(String::as_str), 10, false).unwrap_err();
    assert!(matches!(err, DataError::Config { ref key, .. } if key == "data.tokenizer.vocab_size"));
    assert!(err.to_string().contains("raise vocab_size to at least"), "{err}");
}

#[test]
fn decode_skips_special_tokens() {
    let tok = toy_bpe(150);
    let mut ids = vec![BOS_ID];
    ids.extend(tok.encode("Two dogs").unwrap());
    ids.extend([EOS_ID, PAD_ID, PAD_ID]);
    assert_eq!(tok.decode(&ids).unwrap(), "Two dogs");
}

#[test]
fn literal_special_token_text_is_ordinary_text() {
    let tok = Tokenizer::train_chars(["<s> and </s> and <pad>"], false).unwrap();
    let ids = tok.encode("<s>").unwrap();
    assert_eq!(ids.len(), 3);
    assert!(!ids.contains(&BOS_ID));
    assert_eq!(tok.decode(&ids).unwrap(), "<s>");
}

#[test]
fn char_tokenizer_round_trips_exactly_including_newlines_and_repeated_spaces() {
    let text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n  Speak,  speak.\n";
    let tok = Tokenizer::train_chars([text], false).unwrap();
    let ids = tok.encode(text).unwrap();
    assert_eq!(ids.len(), text.chars().count());
    assert_eq!(tok.decode(&ids).unwrap(), text);
    // Vocabulary: 4 specials + distinct characters in code-point order.
    let distinct: std::collections::BTreeSet<char> = text.chars().collect();
    assert_eq!(tok.vocab_size(), 4 + distinct.len());
    assert_eq!(
        tok.id_to_token(4).unwrap(),
        distinct.iter().next().unwrap().to_string()
    );
    assert_eq!(tok.encode("Z").unwrap(), vec![UNK_ID]);
}

#[test]
fn lowercase_option_lowercases_before_tokenizing() {
    let cfg = TokenizerConfig {
        kind: TokenizerKind::Bpe,
        path: None,
        vocab_size: Some(100),
        lowercase: true,
    };
    let tok = Tokenizer::train(&cfg, ["Two Dogs PLAY.", "a dog plays."]).unwrap();
    assert_eq!(tok.decode(&tok.encode("Two Dogs").unwrap()).unwrap(), "two dogs");
    let cfg = TokenizerConfig {
        kind: TokenizerKind::Char,
        path: None,
        vocab_size: None,
        lowercase: true,
    };
    let tok = Tokenizer::train(&cfg, ["ABC abc"]).unwrap();
    assert_eq!(tok.vocab_size(), 4 + 4);
}

#[test]
fn save_then_load_gives_identical_ids_and_json() {
    let dir = tempfile::tempdir().unwrap();
    for tok in [
        toy_bpe(150),
        Tokenizer::train_chars(["hello, world\n"], false).unwrap(),
    ] {
        let path = dir.path().join("tokenizer.json");
        tok.save(&path).unwrap();
        let back = Tokenizer::load(&path).unwrap();
        assert_eq!(back.kind(), tok.kind());
        assert_eq!(back.to_json().unwrap(), tok.to_json().unwrap());
        let s = "hello, world";
        assert_eq!(back.encode(s).unwrap(), tok.encode(s).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), tok.to_json().unwrap());
    }
}

#[test]
fn load_checked_rejects_a_vocab_size_that_disagrees_with_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    let tok = toy_bpe(150);
    tok.save(&path).unwrap();
    assert!(Tokenizer::load_checked(&path, 150).is_ok());
    let err = Tokenizer::load_checked(&path, 8000).unwrap_err();
    assert!(matches!(
        err,
        DataError::VocabSizeMismatch {
            actual: 150,
            expected: 8000,
            ..
        }
    ));
    let msg = err.to_string();
    assert!(
        msg.contains("tokenizer.json") && msg.contains("150") && msg.contains("8000"),
        "{msg}"
    );
}

#[test]
fn loading_a_missing_or_foreign_tokenizer_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.json");
    let err = Tokenizer::load(&missing).unwrap_err();
    assert!(matches!(err, DataError::Io { .. }));
    assert!(err.to_string().contains("nope.json"));

    let garbage = common::write(dir.path(), "garbage.json", b"{ not json");
    let err = Tokenizer::load(&garbage).unwrap_err().to_string();
    assert!(
        err.contains("garbage.json") && err.contains("not a valid tokenizer.json"),
        "{err}"
    );

    // A valid HF tokenizer whose special tokens are elsewhere is not an Ember tokenizer.
    let json = toy_bpe(150).to_json().unwrap().replace("\"<pad>\"", "\"[PAD]\"");
    let foreign = common::write(dir.path(), "foreign.json", json.as_bytes());
    let err = Tokenizer::load(&foreign).unwrap_err().to_string();
    assert!(err.contains("<pad>") && err.contains("foreign.json"), "{err}");
}

#[test]
fn encode_batch_matches_encode() {
    let tok = toy_bpe(150);
    let (en, _) = common::toy_parallel();
    let refs: Vec<&str> = en.iter().map(String::as_str).collect();
    let batch = tok.encode_batch(&refs).unwrap();
    for (s, ids) in refs.iter().zip(batch) {
        assert_eq!(tok.encode(s).unwrap(), ids);
    }
}

#[test]
fn embedded_task_round_trips_through_bpe() {
    let task = embedded::generate(&EmbeddedConfig {
        seed: 5,
        train_size: 3000,
        val_size: 200,
        test_size: 200,
    })
    .unwrap();
    let texts = task
        .train
        .iter()
        .flat_map(|p| [p.english.as_str(), p.german.as_str()]);
    let tok = Tokenizer::train_bpe(texts, 1000, false).unwrap();
    for p in task.valid.iter().chain(&task.test) {
        for s in [&p.english, &p.german] {
            let ids = tok.encode(s).unwrap();
            assert!(!ids.contains(&UNK_ID), "{s}");
            assert_eq!(tok.decode(&ids).unwrap(), *s);
        }
    }
}

#[test]
fn multi30k_val_lines_round_trip() {
    let Some(root) = common::shared_data("multi30k_val_lines_round_trip") else {
        return;
    };
    let m = root.join("multi30k");
    let train_en = read_text(&m.join("train.en.gz"), None).unwrap();
    let train_de = read_text(&m.join("train.de.gz"), None).unwrap();
    let texts: Vec<&str> = lines(&train_en)
        .into_iter()
        .chain(lines(&train_de))
        .map(str::trim)
        .collect();
    let tok = Tokenizer::train_bpe(texts, 8000, false).unwrap();
    let mut checked = 0;
    let mut with_unk = 0;
    for lang in ["en", "de"] {
        let val = read_text(&m.join(format!("val.{lang}.gz")), None).unwrap();
        for line in lines(&val) {
            let line = line.trim();
            let ids = tok.encode(line).unwrap();
            if ids.contains(&UNK_ID) {
                // A character never seen in training cannot round-trip; there should be (almost) none.
                with_unk += 1;
                continue;
            }
            assert_eq!(tok.decode(&ids).unwrap(), line);
            checked += 1;
        }
    }
    assert!(
        checked >= 2 * 1014 - 5 && with_unk <= 5,
        "checked {checked}, with unk {with_unk}"
    );

    // The lowercased, Moses-tokenised copies round-trip too.
    let tok_en = read_text(&m.join("train.lc.norm.tok.en"), None).unwrap();
    let tok_de = read_text(&m.join("train.lc.norm.tok.de"), None).unwrap();
    let texts: Vec<&str> = lines(&tok_en)
        .into_iter()
        .chain(lines(&tok_de))
        .map(str::trim)
        .collect();
    let tok = Tokenizer::train_bpe(texts, 8000, false).unwrap();
    let val = read_text(&m.join("val.lc.norm.tok.de"), None).unwrap();
    for line in lines(&val) {
        let line = line.trim();
        let ids = tok.encode(line).unwrap();
        if !ids.contains(&UNK_ID) {
            assert_eq!(tok.decode(&ids).unwrap(), line);
        }
    }
}

#[test]
fn tiny_shakespeare_round_trips_through_the_char_tokenizer() {
    let Some(root) = common::shared_data("tiny_shakespeare_round_trips_through_the_char_tokenizer") else {
        return;
    };
    let text = read_text(&root.join("tinyshakespeare/input.txt"), None).unwrap();
    let tok = Tokenizer::train_chars([text.as_str()], false).unwrap();
    assert_eq!(tok.vocab_size(), 4 + 65);
    let ids = tok.encode(&text).unwrap();
    assert_eq!(ids.len(), 1_115_394);
    assert_eq!(tok.decode(&ids).unwrap(), text);
}
