//! Tokenizers built on the Hugging Face `tokenizers` crate, saved as a standard `tokenizer.json`.
//!
//! Two kinds, both with the same four special tokens at fixed ids so that batches, models and
//! checkpoints never need to look them up: `<pad>` = 0, `<s>` = 1 (bos), `</s>` = 2 (eos),
//! `<unk>` = 3.
//!
//! * **BPE** — SentencePiece-style: spaces become `▁` and start a new word (Metaspace), runs of
//!   punctuation/symbols are split off (with their leading `▁`, so Moses-tokenised ` .` stays one
//!   piece), then BPE merges are learned over the joint source+target text. Decoding is plain
//!   concatenation with `▁` → space, so `decode(encode(s)) == s` for normal text (single spaces,
//!   no leading/trailing whitespace, characters seen in training) and detokenised hypotheses go to
//!   sacreBLEU with no stray spaces around subword joins.
//! * **Char** — one token per character seen in training (sorted by code point, like nanoGPT),
//!   implemented as a BPE model with no merges and a concatenating decoder: exact round trip of
//!   newlines, punctuation and repeated spaces.
//!
//! Literal text such as `"<s>"` inside a corpus is tokenised as ordinary characters, never as a
//! special token (`encode_special_tokens`), so special ids only ever come from the batcher.
//!
//! Training is deterministic: the same texts and settings give a byte-identical `tokenizer.json`.
//!
//! A third kind is not trained but read: a **pretrained** model's own tokenizer
//! ([`Tokenizer::load_pretrained`]), as transformers wrote it, with whatever vocabulary and
//! special tokens the model has (its `tokenizer_config.json` names them). It feeds language
//! models only, whose batches are plain windows of the token stream.

use std::collections::BTreeSet;
use std::path::Path;

use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BpeTrainer, Vocab, BPE};
use tokenizers::models::{ModelWrapper, TrainerWrapper};
use tokenizers::normalizers::{Lowercase, NormalizerWrapper};
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::config::{TokenizerConfig, TokenizerKind, NUM_SPECIAL_TOKENS};
use crate::error::{DataError, Result};
use crate::io::write_atomic;

pub const PAD_TOKEN: &str = "<pad>";
pub const BOS_TOKEN: &str = "<s>";
pub const EOS_TOKEN: &str = "</s>";
pub const UNK_TOKEN: &str = "<unk>";
pub const PAD_ID: u32 = 0;
pub const BOS_ID: u32 = 1;
pub const EOS_ID: u32 = 2;
pub const UNK_ID: u32 = 3;

/// File name of the tokenizer inside a run directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// transformers' file of a tokenizer's settings, special tokens among them; a run with a
/// pretrained tokenizer keeps the model's copy next to its `tokenizer.json`.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

const SPECIALS: [(&str, u32); NUM_SPECIAL_TOKENS] = [
    (PAD_TOKEN, PAD_ID),
    (BOS_TOKEN, BOS_ID),
    (EOS_TOKEN, EOS_ID),
    (UNK_TOKEN, UNK_ID),
];

/// The SentencePiece word-boundary marker.
const METASPACE: char = '▁';
/// Pieces split off after Metaspace: a run of characters that are not letters, digits, marks,
/// whitespace or `▁` (punctuation and symbols), optionally with the `▁` before it; or a run of
/// newlines (only monolingual text has them).
const PUNCT_SPLIT: &str = r"▁?[^\p{L}\p{N}\p{M}\s▁]+|\n+";

/// The special-token ids a batcher needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialIds {
    pub pad: u32,
    pub bos: u32,
    pub eos: u32,
    pub unk: u32,
}

impl Default for SpecialIds {
    fn default() -> Self {
        Self {
            pad: PAD_ID,
            bos: BOS_ID,
            eos: EOS_ID,
            unk: UNK_ID,
        }
    }
}

/// The special tokens a tokenizer has, by role; a pretrained tokenizer may lack any of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SpecialTokens {
    pub pad: Option<u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
}

/// An Ember tokenizer: a `tokenizers::Tokenizer` with the fixed special ids checked, or a
/// pretrained model's own.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    kind: TokenizerKind,
    /// A pretrained tokenizer's `tokenizer_config.json`, kept as written (an export hands it
    /// on), and the special tokens it names.
    pretrained: Option<(Option<String>, SpecialTokens)>,
}

fn special_added_tokens() -> Vec<AddedToken> {
    SPECIALS.iter().map(|(t, _)| AddedToken::from(*t, true)).collect()
}

fn tk_err(e: impl std::fmt::Display) -> DataError {
    DataError::tokenizer(None, e)
}

impl Tokenizer {
    /// Trains the tokenizer `cfg` asks for on `texts` (for translation: every train source and
    /// target line, which gives the joint vocabulary).
    pub fn train<'a>(cfg: &TokenizerConfig, texts: impl IntoIterator<Item = &'a str>) -> Result<Self> {
        match cfg.kind {
            TokenizerKind::Bpe => Self::train_bpe(texts, cfg.bpe_vocab_size(), cfg.lowercase),
            TokenizerKind::Char => Self::train_chars(texts, cfg.lowercase),
            TokenizerKind::Pretrained => Err(DataError::config(
                "data.tokenizer.kind",
                "a pretrained tokenizer is read from data.tokenizer.path, not trained",
            )),
        }
    }

    /// Learns BPE merges until the vocabulary (specials included) reaches `vocab_size` or no
    /// pair is left to merge. Errors if the characters alone would exceed `vocab_size`: the
    /// vocabulary always holds every training character, and silently overshooting the
    /// configured size would break the promise `vocab_size` makes to the model config.
    pub fn train_bpe<'a>(
        texts: impl IntoIterator<Item = &'a str>,
        vocab_size: usize,
        lowercase: bool,
    ) -> Result<Self> {
        if vocab_size <= NUM_SPECIAL_TOKENS {
            return Err(DataError::config(
                "data.tokenizer.vocab_size",
                format!("must be > {NUM_SPECIAL_TOKENS}, got {vocab_size}"),
            ));
        }
        let texts: Vec<&str> = texts.into_iter().collect();
        if texts.iter().all(|t| t.trim().is_empty()) {
            return Err(DataError::tokenizer(
                None,
                "cannot train BPE on empty text: the training split has no characters",
            ));
        }
        let model = BPE::builder()
            .unk_token(UNK_TOKEN.to_string())
            .build()
            .map_err(tk_err)?;
        let mut inner = new_inner(model, lowercase)?;
        let split = Split::new(
            SplitPattern::Regex(PUNCT_SPLIT.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(tk_err)?;
        inner.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Metaspace(Metaspace::new(METASPACE, PrependScheme::First, true)),
            PreTokenizerWrapper::Split(split),
        ]))));
        inner.with_decoder(Some(DecoderWrapper::Metaspace(Metaspace::new(
            METASPACE,
            PrependScheme::First,
            true,
        ))));
        let mut trainer: TrainerWrapper = BpeTrainer::builder()
            .vocab_size(vocab_size)
            .min_frequency(0)
            .show_progress(false)
            .special_tokens(special_added_tokens())
            .build()
            .into();
        inner.train(&mut trainer, texts.into_iter()).map_err(tk_err)?;
        let tok = Self::finish(inner, TokenizerKind::Bpe, None)?;
        if tok.vocab_size() > vocab_size {
            return Err(DataError::config(
                "data.tokenizer.vocab_size",
                format!(
                    "{vocab_size} is too small: the training text has {} distinct characters, which \
                     with the {NUM_SPECIAL_TOKENS} special tokens need {} entries before any merge; \
                     raise vocab_size to at least {}",
                    tok.vocab_size() - NUM_SPECIAL_TOKENS,
                    tok.vocab_size(),
                    tok.vocab_size()
                ),
            ));
        }
        Ok(tok)
    }

    /// Builds a character vocabulary: the specials, then every distinct character of `texts`
    /// in code-point order.
    pub fn train_chars<'a>(texts: impl IntoIterator<Item = &'a str>, lowercase: bool) -> Result<Self> {
        let mut chars = BTreeSet::new();
        for t in texts {
            if lowercase {
                chars.extend(t.chars().flat_map(char::to_lowercase));
            } else {
                chars.extend(t.chars());
            }
        }
        if chars.is_empty() {
            return Err(DataError::tokenizer(
                None,
                "cannot build a character vocabulary from empty text",
            ));
        }
        let mut vocab: Vocab = SPECIALS.iter().map(|(t, id)| (t.to_string(), *id)).collect();
        for c in chars {
            let next = vocab.len() as u32;
            vocab.entry(c.to_string()).or_insert(next);
        }
        let model = BPE::builder()
            .vocab_and_merges(vocab, Vec::new())
            .unk_token(UNK_TOKEN.to_string())
            .build()
            .map_err(tk_err)?;
        let mut inner = new_inner(model, lowercase)?;
        inner.with_decoder(Some(DecoderWrapper::Fuse(Fuse::new())));
        inner.add_special_tokens(special_added_tokens()).map_err(tk_err)?;
        Self::finish(inner, TokenizerKind::Char, None)
    }

    /// Checks the invariants every Ember tokenizer has and switches off special-token matching
    /// in input text.
    fn finish(mut inner: tokenizers::Tokenizer, kind: TokenizerKind, path: Option<&Path>) -> Result<Self> {
        for (token, id) in SPECIALS {
            let found = inner.token_to_id(token);
            if found != Some(id) {
                return Err(DataError::tokenizer(
                    path,
                    format!(
                        "special token {token} has id {found:?}, expected {id}; this is not a \
                         tokenizer written by Ember; restore the run's own tokenizer.json (in a run \
                         directory without checkpoints, deleting it trains a new one)"
                    ),
                ));
            }
        }
        if inner.get_padding().is_some()
            || inner.get_truncation().is_some()
            || inner.get_post_processor().is_some()
        {
            return Err(DataError::tokenizer(
                path,
                "padding, truncation and post-processors must be unset: the batcher adds bos/eos and padding itself",
            ));
        }
        inner.set_encode_special_tokens(true);
        Ok(Self {
            inner,
            kind,
            pretrained: None,
        })
    }

    /// Reads a pretrained model's tokenizer from the folder `dir`: its `tokenizer.json`, whatever
    /// its vocabulary, special tokens and pipeline, and its `tokenizer_config.json` (optional)
    /// for which tokens are bos, eos, pad and unk. Truncation and padding are switched off (the
    /// batcher cuts windows itself). Special tokens written in the text are recognised, as
    /// transformers' tokenizer does, so a corpus can separate documents with the model's own
    /// `<|endoftext|>`.
    pub fn load_pretrained(dir: &Path) -> Result<Self> {
        let path = dir.join(TOKENIZER_FILE);
        let bytes = crate::io::read_bytes(&path).map_err(|e| DataError::Io {
            path: path.clone(),
            key: Some("data.tokenizer.path".into()),
            hint: match e.kind() {
                std::io::ErrorKind::NotFound => {
                    "a pretrained model's folder holds its tokenizer.json next to config.json"
                }
                std::io::ErrorKind::TimedOut => "nothing was read",
                _ => "it must be the model's tokenizer.json, a regular file",
            }
            .into(),
            source: e,
        })?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            DataError::tokenizer(
                Some(&path),
                format!("not a tokenizer.json that the tokenizers library reads ({e})"),
            )
        })?;
        inner.with_truncation(None).map_err(tk_err)?;
        inner.with_padding(None);
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config = match crate::io::read_small_text(&config_path, 1 << 24) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(DataError::Io {
                    path: config_path,
                    key: Some("data.tokenizer.path".into()),
                    source: e,
                    hint: "it names the tokenizer's special tokens".into(),
                })
            }
        };
        let specials = match &config {
            Some(text) => pretrained_specials(&inner, text, &config_path)?,
            None => SpecialTokens::default(),
        };
        Ok(Self {
            inner,
            kind: TokenizerKind::Pretrained,
            pretrained: Some((config, specials)),
        })
    }

    /// Writes the tokenizer into the folder `dir`: `tokenizer.json`, and for a pretrained
    /// tokenizer its `tokenizer_config.json` as it was read.
    pub fn save_in(&self, dir: &Path) -> Result<()> {
        self.save(dir.join(TOKENIZER_FILE))?;
        if let Some((Some(config), _)) = &self.pretrained {
            let path = dir.join(TOKENIZER_CONFIG_FILE);
            crate::io::write_atomic(&path, config.as_bytes()).map_err(|e| DataError::Io {
                path,
                key: None,
                source: e,
                hint: "check that the run directory is writable".into(),
            })?;
        }
        Ok(())
    }

    /// A pretrained tokenizer's `tokenizer_config.json` as it was read (`None` for Ember's
    /// own kinds, or a model folder without one).
    pub fn pretrained_config(&self) -> Option<&str> {
        self.pretrained.as_ref().and_then(|(c, _)| c.as_deref())
    }

    /// The special tokens by role: Ember's fixed four, or those a pretrained tokenizer's
    /// config names.
    pub fn special_tokens(&self) -> SpecialTokens {
        match &self.pretrained {
            Some((_, specials)) => *specials,
            None => SpecialTokens {
                pad: Some(PAD_ID),
                bos: Some(BOS_ID),
                eos: Some(EOS_ID),
                unk: Some(UNK_ID),
            },
        }
    }

    /// Writes `tokenizer.json` (pretty-printed, through [`write_atomic`] so an interrupted run
    /// never leaves half a tokenizer behind).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let json = self.to_json()?;
        write_atomic(path, json.as_bytes()).map_err(|e| DataError::Io {
            path: path.to_path_buf(),
            key: None,
            source: e,
            hint: "check that the run directory exists and is writable".into(),
        })
    }

    /// The exact JSON `save` writes.
    pub fn to_json(&self) -> Result<String> {
        let mut s = self.inner.to_string(true).map_err(tk_err)?;
        s.push('\n');
        Ok(s)
    }

    /// Loads a `tokenizer.json` written by [`Tokenizer::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        crate::io::refuse_special_input(path, Some("tokenizer"))?;
        let bytes = crate::io::read_bytes(path).map_err(|e| DataError::Io {
            path: path.to_path_buf(),
            key: None,
            source: e,
            hint: "check the path; a run directory gets its tokenizer.json when its first \
                   training run starts"
                .into(),
        })?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            DataError::tokenizer(
                Some(path),
                format!(
                    "not a valid tokenizer.json ({e}); restore the run's original file (its model \
                     knows only those ids: a new tokenizer would give them other meanings). Only \
                     in a run directory without checkpoints, delete it to train a new one"
                ),
            )
        })?;
        let kind = match inner.get_decoder() {
            Some(DecoderWrapper::Fuse(_)) => TokenizerKind::Char,
            Some(DecoderWrapper::Metaspace(_)) => TokenizerKind::Bpe,
            _ => {
                return Err(DataError::tokenizer(
                    Some(path),
                    "unsupported decoder: Ember reads the BPE (Metaspace) and char (Fuse) tokenizers it writes; restore the run's own tokenizer.json (in a run directory without checkpoints, deleting it trains a new one)",
                ))
            }
        };
        if !matches!(inner.get_model(), ModelWrapper::BPE(_)) {
            return Err(DataError::tokenizer(
                Some(path),
                "unsupported model type (expected BPE); restore the run's own tokenizer.json (in a run directory without checkpoints, deleting it trains a new one)",
            ));
        }
        Self::finish(inner, kind, Some(path))
    }

    /// Loads and checks that the vocabulary has exactly `expected_vocab_size` entries, which a
    /// checkpoint's embedding and output layers were built for.
    pub fn load_checked(path: impl AsRef<Path>, expected_vocab_size: usize) -> Result<Self> {
        let path = path.as_ref();
        let tok = Self::load(path)?;
        tok.check_vocab_size(path, expected_vocab_size)?;
        Ok(tok)
    }

    /// Errors (naming `path`) unless the vocabulary size is `expected`.
    pub fn check_vocab_size(&self, path: &Path, expected: usize) -> Result<()> {
        if self.vocab_size() != expected {
            return Err(DataError::VocabSizeMismatch {
                path: path.to_path_buf(),
                actual: self.vocab_size(),
                expected,
            });
        }
        Ok(())
    }

    /// Token ids of `text`, without bos/eos.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode_fast(text, false).map_err(tk_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Encodes many texts in parallel (rayon, inside `tokenizers`).
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        let encs = self
            .inner
            .encode_batch_fast(texts.to_vec(), false)
            .map_err(tk_err)?;
        Ok(encs.into_iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// Text of `ids`, skipping special tokens (pad/bos/eos/unk) and unknown ids, ready for
    /// sacreBLEU.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(tk_err)
    }

    /// Number of ids, specials included (the model's embedding size).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    pub fn specials(&self) -> SpecialIds {
        SpecialIds::default()
    }
    pub fn pad_id(&self) -> u32 {
        PAD_ID
    }
    pub fn bos_id(&self) -> u32 {
        BOS_ID
    }
    pub fn eos_id(&self) -> u32 {
        EOS_ID
    }
    pub fn unk_id(&self) -> u32 {
        UNK_ID
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The wrapped HF tokenizer, for anything not covered here.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// The ids of the special tokens `tokenizer_config.json` names (`bos_token`, `eos_token`,
/// `pad_token`, `unk_token`: a string, or an object with `content`, or null). A token the
/// vocabulary lacks is an error: the config belongs to another tokenizer.
fn pretrained_specials(inner: &tokenizers::Tokenizer, text: &str, path: &Path) -> Result<SpecialTokens> {
    let config: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| DataError::tokenizer(Some(path), format!("not valid JSON ({e})")))?;
    let id = |role: &str| -> Result<Option<u32>> {
        let token = match config.get(role) {
            Some(serde_json::Value::String(t)) => t.as_str(),
            Some(serde_json::Value::Object(o)) => match o.get("content").and_then(|c| c.as_str()) {
                Some(t) => t,
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        inner.token_to_id(token).map(Some).ok_or_else(|| {
            DataError::tokenizer(
                Some(path),
                format!("{role} is {token:?}, which the folder's tokenizer.json does not have"),
            )
        })
    };
    Ok(SpecialTokens {
        pad: id("pad_token")?,
        bos: id("bos_token")?,
        eos: id("eos_token")?,
        unk: id("unk_token")?,
    })
}

/// A tokenizer around `model`, lowercasing its input when asked.
fn new_inner(model: BPE, lowercase: bool) -> Result<tokenizers::Tokenizer> {
    let mut inner = tokenizers::Tokenizer::new(model);
    if lowercase {
        inner
            .with_normalizer(Some(NormalizerWrapper::Lowercase(Lowercase)))
            .map_err(tk_err)?;
    }
    Ok(inner)
}
