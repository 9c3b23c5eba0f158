//! From a `data:` config to token ids: raw text ([`RawCorpus`](crate::RawCorpus)), a tokenizer (loaded from the
//! run directory or trained there), and tokenised splits ([`Splits`]) with the statistics a run
//! report needs.
//!
//! Translation splits keep the raw source and reference lines next to the ids, because BLEU is
//! computed on detokenised text against the *original* references, not against decoded ids.
//! Only the training split is length-filtered: evaluation must see every pair.
//!
//! Reading the text is `read`'s job, tokenising it `splits`'; here the two meet the tokenizer
//! in a [`Dataset`].

mod read;
mod splits;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::config::{CorpusConfig, DataConfig, TokenizerConfig, TokenizerKind};
use crate::error::{DataError, Result};
use crate::raw::RawCorpus;
use crate::tokenizer::{Tokenizer, TOKENIZER_FILE};

pub use splits::{
    CacheStatus, Example, PairSplit, SplitStats, Splits, TextSplits, TextStats, TranslationSplits,
};

/// File name of the token-id cache inside a run directory.
pub const TOKEN_CACHE_FILE: &str = "token-cache.bin";

/// Where the run's tokenizer came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum TokenizerOrigin {
    /// Read from the run directory (a resumed or evaluated run).
    Loaded(PathBuf),
    /// Trained now and saved at the path (or not saved, without a run directory).
    Trained(Option<PathBuf>),
    /// Supplied by the caller.
    Given,
}

/// How loading went, for the run log.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoadReport {
    pub tokenizer: TokenizerOrigin,
    pub cache: CacheStatus,
    /// Seconds spent reading (or generating) raw text.
    pub read_secs: f64,
    /// Seconds spent loading or training the tokenizer.
    pub tokenizer_secs: f64,
    /// Seconds spent turning text into ids (cache lookup included).
    pub tokenize_secs: f64,
}

/// Everything a run needs from the data side.
#[derive(Clone, Debug)]
pub struct Dataset {
    pub raw: RawCorpus,
    pub tokenizer: Tokenizer,
    pub splits: Splits,
    pub report: LoadReport,
}

impl Dataset {
    /// Loads the corpus, then loads `run_dir/tokenizer.json` if it exists (checking it against
    /// `data.tokenizer`) or trains one on the training text and saves it there, then tokenises
    /// through `run_dir/token-cache.bin`. Without a run directory nothing is written.
    pub fn prepare(cfg: &DataConfig, run_dir: Option<&Path>) -> Result<Self> {
        cfg.validate()?;
        let t0 = Instant::now();
        let raw = RawCorpus::load(&cfg.corpus)?;
        let read_secs = t0.elapsed().as_secs_f64();

        let t1 = Instant::now();
        if let (TokenizerKind::Pretrained, Some(source)) = (cfg.tokenizer.kind, &cfg.tokenizer.path) {
            let (tokenizer, origin) = pretrained_tokenizer(source, run_dir)?;
            let cache = run_dir.map(|d| d.join(TOKEN_CACHE_FILE));
            let tokenizer_secs = t1.elapsed().as_secs_f64();
            return Self::finish(
                cfg,
                raw,
                tokenizer,
                origin,
                cache.as_deref(),
                read_secs,
                tokenizer_secs,
            );
        }
        let shard_tokenizer = match &cfg.corpus {
            CorpusConfig::TokenShards(t) => Some(load_shard_tokenizer(&t.tokenizer)?),
            _ => None,
        };
        let (tokenizer, origin) = match run_dir {
            Some(dir) => {
                let path = dir.join(TOKENIZER_FILE);
                if path.exists() {
                    let tok = Tokenizer::load(&path)?;
                    match &shard_tokenizer {
                        Some(shards) => check_same_tokenizer(&tok, &path, shards)?,
                        None => check_tokenizer_matches_config(&tok, &cfg.tokenizer, &path)?,
                    }
                    (tok, TokenizerOrigin::Loaded(path))
                } else {
                    let tok = match shard_tokenizer {
                        Some((tok, _)) => tok,
                        None => Tokenizer::train(&cfg.tokenizer, raw.tokenizer_texts())?,
                    };
                    std::fs::create_dir_all(dir).map_err(|e| DataError::Io {
                        path: dir.to_path_buf(),
                        key: None,
                        source: e,
                        hint: "cannot create the run directory; check permissions".into(),
                    })?;
                    tok.save(&path)?;
                    (tok, TokenizerOrigin::Trained(Some(path)))
                }
            }
            None => match shard_tokenizer {
                Some((tok, path)) => (tok, TokenizerOrigin::Loaded(path)),
                None => (
                    Tokenizer::train(&cfg.tokenizer, raw.tokenizer_texts())?,
                    TokenizerOrigin::Trained(None),
                ),
            },
        };
        let tokenizer_secs = t1.elapsed().as_secs_f64();

        let cache = run_dir.map(|d| d.join(TOKEN_CACHE_FILE));
        Self::finish(
            cfg,
            raw,
            tokenizer,
            origin,
            cache.as_deref(),
            read_secs,
            tokenizer_secs,
        )
    }

    /// As [`Dataset::prepare`] with a tokenizer the caller already has (e.g. from
    /// [`Tokenizer::load_checked`]); `cache_path` is the token-id cache file, if any.
    pub fn prepare_with_tokenizer(
        cfg: &DataConfig,
        tokenizer: Tokenizer,
        cache_path: Option<&Path>,
    ) -> Result<Self> {
        cfg.validate()?;
        let t0 = Instant::now();
        let raw = RawCorpus::load(&cfg.corpus)?;
        let read_secs = t0.elapsed().as_secs_f64();
        Self::finish(
            cfg,
            raw,
            tokenizer,
            TokenizerOrigin::Given,
            cache_path,
            read_secs,
            0.0,
        )
    }

    fn finish(
        cfg: &DataConfig,
        raw: RawCorpus,
        tokenizer: Tokenizer,
        origin: TokenizerOrigin,
        cache_path: Option<&Path>,
        read_secs: f64,
        tokenizer_secs: f64,
    ) -> Result<Self> {
        let t = Instant::now();
        let (splits, cache) = raw.tokenize(&tokenizer, cfg.max_source_len, cfg.max_target_len, cache_path)?;
        if let Splits::Translation(s) = &splits {
            if s.train.examples.is_empty() {
                return Err(DataError::config(
                    "data.max_source_len",
                    format!(
                        "every one of the {} training pairs is longer than data.max_source_len = {} \
                         or data.max_target_len = {} tokens; raise them",
                        s.train.stats.dropped_too_long, cfg.max_source_len, cfg.max_target_len
                    ),
                ));
            }
        }
        let report = LoadReport {
            tokenizer: origin,
            cache,
            read_secs,
            tokenizer_secs,
            tokenize_secs: t.elapsed().as_secs_f64(),
        };
        Ok(Self {
            raw,
            tokenizer,
            splits,
            report,
        })
    }
}

/// A pretrained model's tokenizer, from the folder `source`: read there for a new run (and copied
/// into the run directory), or from the run directory once it has its copy. The copy is
/// authoritative, as a trained tokenizer is: the model folder may have moved since, but where it
/// is still there it must hold the same tokenizer.
fn pretrained_tokenizer(source: &Path, run_dir: Option<&Path>) -> Result<(Tokenizer, TokenizerOrigin)> {
    let Some(dir) = run_dir else {
        let tok = Tokenizer::load_pretrained(source)?;
        return Ok((tok, TokenizerOrigin::Loaded(source.join(TOKENIZER_FILE))));
    };
    let copy = dir.join(TOKENIZER_FILE);
    if copy.exists() {
        let tok = Tokenizer::load_pretrained(dir)?;
        if let Ok(original) = Tokenizer::load_pretrained(source) {
            if original.to_json()? != tok.to_json()?
                || original.pretrained_config() != tok.pretrained_config()
            {
                return Err(DataError::tokenizer(
                    Some(&copy),
                    format!(
                        "differs from the tokenizer of data.tokenizer.path ({}), which this run \
                         started with; continue with the model folder the run was started from, \
                         or start a new run directory",
                        source.display()
                    ),
                ));
            }
        }
        return Ok((tok, TokenizerOrigin::Loaded(copy)));
    }
    let tok = Tokenizer::load_pretrained(source)?;
    std::fs::create_dir_all(dir).map_err(|e| DataError::Io {
        path: dir.to_path_buf(),
        key: None,
        source: e,
        hint: "cannot create the run directory; check permissions".into(),
    })?;
    tok.save_in(dir)?;
    Ok((tok, TokenizerOrigin::Loaded(source.join(TOKENIZER_FILE))))
}

impl Dataset {
    /// What the data lost on its way to token ids, in words, for the run to print as warnings:
    /// characters the tokenizer does not know (each read as `<unk>`), and Windows line endings
    /// (read as plain newlines: the `\r` before each newline is dropped).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = vec![];
        if let RawCorpus::Text { train, valid } = &self.raw {
            let mut crlf: Vec<(String, usize)> = vec![];
            for t in train.iter().chain(valid) {
                let n = t.crlf;
                // `input.txt[0..90%]` and `input.txt[90%..]` are one file.
                let file = match t.name.rsplit_once('[') {
                    Some((file, part)) if part.contains('%') && part.ends_with(']') => file.to_string(),
                    _ => t.name.clone(),
                };
                match crlf.iter_mut().find(|(f, _)| *f == file) {
                    Some((_, count)) => *count += n,
                    None if n > 0 => crlf.push((file, n)),
                    None => {}
                }
            }
            for (file, n) in crlf.into_iter().filter(|(_, n)| *n > 0) {
                out.push(format!(
                    "{file} has {n} Windows line ending(s) (CRLF): they are read as plain newlines, \
                     so the '\\r' before each newline is neither in the text the model learns nor a \
                     token of its vocabulary (`dos2unix {file}` converts the file itself)"
                ));
            }
        }
        let unknown = |split: &str, unk: usize, total: usize| {
            (unk > 0).then(|| {
                format!(
                    "{unk} of the {total} {split} tokens ({:.2}%) are <unk>: characters the tokenizer \
                     (learnt from the training text) does not know, all read as one unknown token",
                    100.0 * unk as f64 / total.max(1) as f64
                )
            })
        };
        match &self.splits {
            Splits::Text(s) => {
                out.extend(unknown(
                    "training",
                    s.stats.train_unk_tokens,
                    s.stats.train_tokens,
                ));
                out.extend(unknown(
                    "validation",
                    s.stats.valid_unk_tokens,
                    s.stats.valid_tokens,
                ));
            }
            Splits::Translation(s) => {
                let st = |p: &PairSplit| (p.stats.unk_tokens, p.stats.source_tokens + p.stats.target_tokens);
                let (u, t) = st(&s.train);
                out.extend(unknown("training", u, t));
                let (u, t) = st(&s.valid);
                out.extend(unknown("validation", u, t));
                if let Some(test) = &s.test {
                    let (u, t) = st(test);
                    out.extend(unknown("test", u, t));
                }
            }
        }
        out
    }
}

/// The tokenizer token shards were written with: `path` is a `tokenizer.json` or a run
/// directory holding one.
fn load_shard_tokenizer(path: &Path) -> Result<(Tokenizer, PathBuf)> {
    let file = if path.is_dir() {
        path.join(TOKENIZER_FILE)
    } else {
        path.to_path_buf()
    };
    Ok((Tokenizer::load(&file)?, file))
}

/// A run on token shards must keep the tokenizer it started with: its ids mean nothing under
/// another vocabulary.
fn check_same_tokenizer(
    run_tok: &Tokenizer,
    run_path: &Path,
    (shards, path): &(Tokenizer, PathBuf),
) -> Result<()> {
    if run_tok.to_json()? != shards.to_json()? {
        return Err(DataError::tokenizer(
            Some(run_path),
            format!(
                "differs from data.corpus.tokenizer ({}), which the shards were written with; \
                 train on these shards in a new run directory, or point data.corpus.tokenizer at \
                 this run's tokenizer",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// A run directory's tokenizer is authoritative on resume, but it must be the kind the config
/// asks for; a silent mismatch would train on different ids than the config describes.
pub fn check_tokenizer_matches_config(tok: &Tokenizer, cfg: &TokenizerConfig, path: &Path) -> Result<()> {
    let name = |k: TokenizerKind| match k {
        TokenizerKind::Bpe => "bpe",
        TokenizerKind::Char => "char",
        TokenizerKind::Pretrained => "pretrained",
    };
    let fix = "restore the data.tokenizer settings the run was started with (a run with checkpoints \
               needs its own tokenizer); only in a run directory without checkpoints, delete it to \
               train one with the new settings";
    if tok.kind() != cfg.kind {
        return Err(DataError::tokenizer(
            Some(path),
            format!(
                "is a {} tokenizer but data.tokenizer.kind is {}; {fix}",
                name(tok.kind()),
                name(cfg.kind)
            ),
        ));
    }
    let lower = tok.inner().get_normalizer().is_some();
    if lower != cfg.lowercase {
        return Err(DataError::tokenizer(
            Some(path),
            format!(
                "has lowercase = {lower} but data.tokenizer.lowercase is {}; {fix}",
                cfg.lowercase
            ),
        ));
    }
    if cfg.kind == TokenizerKind::Bpe && tok.vocab_size() > cfg.bpe_vocab_size() {
        return Err(DataError::tokenizer(
            Some(path),
            format!(
                "has {} tokens, more than data.tokenizer.vocab_size = {}; {fix}",
                tok.vocab_size(),
                cfg.bpe_vocab_size()
            ),
        ));
    }
    Ok(())
}
