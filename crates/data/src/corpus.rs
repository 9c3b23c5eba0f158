//! From a `data:` config to token ids: raw text ([`RawCorpus`](crate::RawCorpus)), a tokenizer (loaded from the
//! run directory or trained there), and tokenised splits ([`Splits`]) with the statistics a run
//! report needs.
//!
//! Translation splits keep the raw source and reference lines next to the ids, because BLEU is
//! computed on detokenised text against the *original* references, not against decoded ids.
//! Only the training split is length-filtered: evaluation must see every pair.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::cache::{self, ContentHash, Groups};
use crate::config::{
    CorpusConfig, DataConfig, PairPaths, TextConfig, TokenShardsConfig, TokenizerConfig, TokenizerKind,
    DEFAULT_VAL_FRACTION,
};
use crate::embedded;
use crate::error::{DataError, Result};
use crate::io::{lines, read_lines, read_text};
use crate::raw::{RawCorpus, RawPairs, RawText, TokenShard};
use crate::shards;
use crate::tokenizer::{Tokenizer, TOKENIZER_FILE, UNK_ID};

/// File name of the token-id cache inside a run directory.
pub const TOKEN_CACHE_FILE: &str = "token-cache.bin";

/// One translation pair as token ids, without bos/eos (the batcher adds them).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Example {
    pub source: Vec<u32>,
    pub target: Vec<u32>,
}

impl RawCorpus {
    /// Reads (or, for `kind: embedded`, generates) every split named by `cfg`.
    pub fn load(cfg: &CorpusConfig) -> Result<Self> {
        match cfg {
            CorpusConfig::Embedded(e) => {
                let task = embedded::generate(e)?;
                let to_raw = |pairs: Vec<embedded::Pair>| {
                    let (sources, targets): (Vec<_>, Vec<_>) =
                        pairs.into_iter().map(|p| (p.english, p.german)).unzip();
                    RawPairs {
                        lines: (1..=sources.len()).collect(),
                        sources,
                        targets,
                        dropped_empty: 0,
                    }
                };
                Ok(RawCorpus::Translation {
                    train: to_raw(task.train),
                    valid: to_raw(task.valid),
                    test: if task.test.is_empty() {
                        None
                    } else {
                        Some(to_raw(task.test))
                    },
                })
            }
            CorpusConfig::Parallel(p) => Ok(RawCorpus::Translation {
                train: read_pairs(&p.train, "data.corpus.train")?,
                valid: read_pairs(&p.valid, "data.corpus.valid")?,
                test: p
                    .test
                    .as_ref()
                    .map(|t| read_pairs(t, "data.corpus.test"))
                    .transpose()?,
            }),
            CorpusConfig::Text(t) => load_text(t),
            CorpusConfig::HfDataset(h) => crate::hf_dataset::load(h),
            CorpusConfig::TokenShards(t) => load_shards(t),
        }
    }

    /// The texts a new tokenizer is trained on: all training sources then all training targets
    /// (one joint vocabulary), or the training text. Validation and test text never leak in.
    pub fn tokenizer_texts(&self) -> Vec<&str> {
        match self {
            RawCorpus::Translation { train, .. } => train
                .sources
                .iter()
                .chain(&train.targets)
                .map(String::as_str)
                .collect(),
            RawCorpus::Text { train, .. } => train.iter().map(|t| t.text.as_str()).collect(),
            // Shards come with the tokenizer that wrote them; nothing is trained.
            RawCorpus::Tokens { .. } => Vec::new(),
        }
    }

    /// A fingerprint of every split's text, for checking on resume that a run continues on the
    /// data it was trained on. It hashes the text itself rather than file sizes and times: the
    /// text is in memory already (hashing Multi30k takes milliseconds next to the seconds of
    /// reading and tokenising it), a copied or moved corpus with the same content still
    /// matches, and any edit to any line does not.
    pub fn fingerprint(&self) -> String {
        let mut h = ContentHash::new();
        match self {
            // Token shards have no text: their ids are the content.
            RawCorpus::Tokens { train, valid } => {
                for split in [train, valid] {
                    h.bytes(&(split.len() as u64).to_le_bytes());
                    for shard in split {
                        let bytes: Vec<u8> = shard.ids.iter().flat_map(|i| i.to_le_bytes()).collect();
                        h.bytes(&bytes);
                    }
                }
            }
            _ => hash_groups(&mut h, &self.groups()),
        }
        let [a, b] = h.finish();
        format!("{a:016x}{b:016x}")
    }

    /// Every text in a fixed order, grouped as the token cache stores them.
    fn groups(&self) -> Vec<Vec<&str>> {
        fn strs(v: &[String]) -> Vec<&str> {
            v.iter().map(String::as_str).collect()
        }
        match self {
            RawCorpus::Translation { train, valid, test } => {
                let mut g = vec![
                    strs(&train.sources),
                    strs(&train.targets),
                    strs(&valid.sources),
                    strs(&valid.targets),
                ];
                if let Some(t) = test {
                    g.push(strs(&t.sources));
                    g.push(strs(&t.targets));
                }
                g
            }
            RawCorpus::Text { train, valid } => vec![
                train.iter().map(|t| t.text.as_str()).collect(),
                valid.iter().map(|t| t.text.as_str()).collect(),
            ],
            RawCorpus::Tokens { .. } => Vec::new(),
        }
    }

    /// Tokenises every split, reusing `cache_path` when it holds ids for exactly this tokenizer
    /// and text. Training pairs longer than `max_source_len`/`max_target_len` tokens are dropped.
    pub fn tokenize(
        &self,
        tokenizer: &Tokenizer,
        max_source_len: usize,
        max_target_len: usize,
        cache_path: Option<&Path>,
    ) -> Result<(Splits, CacheStatus)> {
        if let RawCorpus::Tokens { train, valid } = self {
            // Already ids: no tokenising, so nothing to cache.
            return Ok((shard_splits(train, valid, tokenizer)?, CacheStatus::Disabled));
        }
        let groups = self.groups();
        let key = cache_path.map(|_| -> Result<[u64; 2]> {
            let mut h = ContentHash::new();
            h.str(&tokenizer.to_json()?);
            hash_groups(&mut h, &groups);
            Ok(h.finish())
        });
        let key = key.transpose()?;
        let cached = match (cache_path, key) {
            (Some(p), Some(k)) => cache::load(p, k).filter(|c| {
                c.len() == groups.len() && c.iter().zip(&groups).all(|(a, b)| a.len() == b.len())
            }),
            _ => None,
        };
        let (ids, status) = match cached {
            Some(ids) => (ids, CacheStatus::Hit),
            None => {
                let ids = encode_groups(self, tokenizer, &groups)?;
                let status = match (cache_path, key) {
                    (Some(p), Some(k)) => match cache::store(p, k, &ids) {
                        Ok(()) => CacheStatus::Written,
                        Err(e) => CacheStatus::WriteFailed(format!("{}: {e}", p.display())),
                    },
                    _ => CacheStatus::Disabled,
                };
                (ids, status)
            }
        };
        let unk = tokenizer.special_tokens().unk;
        let splits = self.assemble(ids, max_source_len, max_target_len, unk)?;
        Ok((splits, status))
    }

    fn assemble(
        &self,
        ids: Groups,
        max_source_len: usize,
        max_target_len: usize,
        unk: Option<u32>,
    ) -> Result<Splits> {
        let mut ids = ids.into_iter();
        let mut next = || ids.next().unwrap_or_default();
        match self {
            RawCorpus::Translation { train, valid, test } => {
                let train = PairSplit::build(train, next(), next(), Some((max_source_len, max_target_len)));
                let valid = PairSplit::build(valid, next(), next(), None);
                let test = test.as_ref().map(|t| PairSplit::build(t, next(), next(), None));
                Ok(Splits::Translation(TranslationSplits { train, valid, test }))
            }
            RawCorpus::Text { train, valid } => {
                let tr: Vec<u32> = next().concat();
                let va: Vec<u32> = next().concat();
                let chars = |s: &[RawText]| s.iter().map(|t| t.text.chars().count()).sum();
                Ok(text_splits(tr, va, chars(train), chars(valid), unk))
            }
            RawCorpus::Tokens { .. } => unreachable!("token shards are not tokenised"),
        }
    }
}

/// The token streams of shard splits, after checking every id against the tokenizer.
fn shard_splits(train: &[TokenShard], valid: &[TokenShard], tokenizer: &Tokenizer) -> Result<Splits> {
    let vocab = tokenizer.vocab_size();
    for shard in train.iter().chain(valid) {
        if let Some((pos, id)) = shard.ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
            return Err(DataError::config(
                "data.corpus.tokenizer",
                format!(
                    "{} holds id {id} at token {pos}, but the tokenizer has only {vocab} tokens; \
                     the shards were written with another tokenizer (name the one `ember \
                     tokenize` used)",
                    shard.path.display()
                ),
            ));
        }
    }
    let concat = |s: &[TokenShard]| -> Vec<u32> { s.iter().flat_map(|s| s.ids.iter().copied()).collect() };
    let (tr, va) = (concat(train), concat(valid));
    // No text was read: characters are unknown (0).
    Ok(text_splits(tr, va, 0, 0, tokenizer.special_tokens().unk))
}

/// Token streams of a language-model corpus with their statistics; `unk` is the tokenizer's
/// unknown token (a byte-level tokenizer has none).
fn text_splits(
    train: Vec<u32>,
    valid: Vec<u32>,
    train_chars: usize,
    valid_chars: usize,
    unk: Option<u32>,
) -> Splits {
    let count_unk = |v: &[u32]| v.iter().filter(|&&i| Some(i) == unk).count();
    let stats = TextStats {
        train_tokens: train.len(),
        valid_tokens: valid.len(),
        train_chars,
        valid_chars,
        train_unk_tokens: count_unk(&train),
        valid_unk_tokens: count_unk(&valid),
    };
    Splits::Text(TextSplits { train, valid, stats })
}

fn load_shards(t: &TokenShardsConfig) -> Result<RawCorpus> {
    let read = |entries: &[PathBuf], key: &str| -> Result<Vec<TokenShard>> {
        let mut out = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let k = format!("data.corpus.{key}[{i}]");
            for path in shards::expand(entry, &k)? {
                let ids = shards::read_shard(&path, Some(&k))?;
                out.push(TokenShard { path, ids });
            }
        }
        Ok(out)
    };
    Ok(RawCorpus::Tokens {
        train: read(&t.train_files, "train_files")?,
        valid: read(&t.val_files, "val_files")?,
    })
}

fn encode_groups(raw: &RawCorpus, tokenizer: &Tokenizer, groups: &[Vec<&str>]) -> Result<Groups> {
    match raw {
        // Sentences: the HF pipeline encodes them in parallel.
        RawCorpus::Translation { .. } => groups.iter().map(|g| tokenizer.encode_batch(g)).collect(),
        // Whole documents: one call each, so BPE sees the text exactly as it will be decoded.
        RawCorpus::Text { .. } | RawCorpus::Tokens { .. } => groups
            .iter()
            .map(|g| g.iter().map(|t| tokenizer.encode(t)).collect::<Result<Vec<_>>>())
            .collect(),
    }
}

fn read_pairs(paths: &PairPaths, key: &str) -> Result<RawPairs> {
    let src_key = format!("{key}.source");
    let tgt_key = format!("{key}.target");
    let (src_text, n_src) = read_lines(&paths.source, Some(&src_key))?;
    let (tgt_text, n_tgt) = read_lines(&paths.target, Some(&tgt_key))?;
    if n_src != n_tgt {
        return Err(DataError::Misaligned {
            source_path: paths.source.clone(),
            source_lines: n_src,
            target_path: paths.target.clone(),
            target_lines: n_tgt,
        });
    }
    let mut out = RawPairs::default();
    for (i, (s, t)) in lines(&src_text).into_iter().zip(lines(&tgt_text)).enumerate() {
        let (s, t) = (s.trim(), t.trim());
        if s.is_empty() || t.is_empty() {
            out.dropped_empty += 1;
        } else {
            out.sources.push(s.to_string());
            out.targets.push(t.to_string());
            out.lines.push(i + 1);
        }
    }
    if out.sources.is_empty() {
        return Err(DataError::config(
            key,
            format!(
                "{} and {} have no line pair with text on both sides",
                paths.source.display(),
                paths.target.display()
            ),
        ));
    }
    Ok(out)
}

fn load_text(t: &TextConfig) -> Result<RawCorpus> {
    if let Some(path) = &t.path {
        let text = read_text(path, Some("data.corpus.path"))?;
        if text.trim().is_empty() {
            return Err(DataError::EmptyFile {
                path: path.clone(),
                key: Some("data.corpus.path".into()),
            });
        }
        let fraction = t.val_fraction.unwrap_or(DEFAULT_VAL_FRACTION);
        let cut = split_point(&text, fraction);
        let (train, valid) = text.split_at(cut);
        if train.trim().is_empty() || valid.trim().is_empty() {
            return Err(DataError::config(
                "data.corpus.val_fraction",
                format!(
                    "{fraction} leaves an empty {} split of {} ({} characters in all); adjust it",
                    if train.trim().is_empty() {
                        "training"
                    } else {
                        "validation"
                    },
                    path.display(),
                    text.chars().count()
                ),
            ));
        }
        let name = path.display().to_string();
        let pct = (1.0 - fraction) * 100.0;
        Ok(RawCorpus::Text {
            train: vec![RawText {
                name: format!("{name}[..{pct:.1}%]"),
                text: train.to_string(),
            }],
            valid: vec![RawText {
                name: format!("{name}[{pct:.1}%..]"),
                text: valid.to_string(),
            }],
        })
    } else {
        let read_all = |files: &[PathBuf], key: &str| -> Result<Vec<RawText>> {
            files
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let k = format!("data.corpus.{key}[{i}]");
                    let text = read_text(p, Some(&k))?;
                    if text.trim().is_empty() {
                        return Err(DataError::EmptyFile {
                            path: p.clone(),
                            key: Some(k),
                        });
                    }
                    Ok(RawText {
                        name: p.display().to_string(),
                        text,
                    })
                })
                .collect()
        };
        if t.train_files.is_empty() || t.val_files.is_empty() {
            return Err(DataError::config(
                "data.corpus.train_files",
                "train_files and val_files must both be non-empty",
            ));
        }
        Ok(RawCorpus::Text {
            train: read_all(&t.train_files, "train_files")?,
            valid: read_all(&t.val_files, "val_files")?,
        })
    }
}

/// Byte index where the validation tail starts: the first line start at or after
/// `(1 - fraction)` of the text, or that exact character if no newline follows it.
pub fn split_point(text: &str, val_fraction: f64) -> usize {
    let target = ((text.len() as f64) * (1.0 - val_fraction)).floor() as usize;
    let mut cut = target.min(text.len());
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    if cut == 0 || text.as_bytes().get(cut - 1) == Some(&b'\n') {
        return cut;
    }
    match text[cut..].find('\n') {
        Some(i) if cut + i + 1 < text.len() => cut + i + 1,
        _ => cut,
    }
}

/// What happened to the token-id cache during loading.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum CacheStatus {
    /// No cache path was given.
    Disabled,
    /// Ids were read from the cache; nothing was tokenised.
    Hit,
    /// Ids were computed and stored.
    Written,
    /// Ids were computed but could not be stored (the run still works).
    WriteFailed(String),
}

/// Token ids of every split.
// One value per run, matched by reference: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Splits {
    Translation(TranslationSplits),
    Text(TextSplits),
}

impl Splits {
    pub fn translation(&self) -> Option<&TranslationSplits> {
        match self {
            Splits::Translation(t) => Some(t),
            Splits::Text(_) => None,
        }
    }
    pub fn text(&self) -> Option<&TextSplits> {
        match self {
            Splits::Text(t) => Some(t),
            Splits::Translation(_) => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TranslationSplits {
    pub train: PairSplit,
    pub valid: PairSplit,
    pub test: Option<PairSplit>,
}

/// One translation split: ids plus the raw text they came from, index-aligned.
#[derive(Clone, Debug, PartialEq)]
pub struct PairSplit {
    pub examples: Vec<Example>,
    /// Raw source lines (input for decoding demos and for hypothesis files).
    pub sources: Vec<String>,
    /// Raw target lines: the references for BLEU.
    pub references: Vec<String>,
    /// The 1-based line of each example in its files (its index + 1 for the embedded task).
    pub lines: Vec<usize>,
    pub stats: SplitStats,
}

impl PairSplit {
    fn build(
        raw: &RawPairs,
        src: Vec<Vec<u32>>,
        tgt: Vec<Vec<u32>>,
        max_len: Option<(usize, usize)>,
    ) -> Self {
        let mut out = PairSplit {
            examples: Vec::with_capacity(src.len()),
            sources: Vec::with_capacity(src.len()),
            references: Vec::with_capacity(src.len()),
            lines: Vec::with_capacity(src.len()),
            stats: SplitStats {
                dropped_empty: raw.dropped_empty,
                ..SplitStats::default()
            },
        };
        for (i, (s, t)) in src.into_iter().zip(tgt).enumerate() {
            if let Some((ms, mt)) = max_len {
                if s.len() > ms || t.len() > mt {
                    out.stats.dropped_too_long += 1;
                    continue;
                }
            }
            out.sources.push(raw.sources[i].clone());
            out.references.push(raw.targets[i].clone());
            out.lines.push(raw.lines.get(i).copied().unwrap_or(i + 1));
            out.examples.push(Example { source: s, target: t });
        }
        out.stats.fill(&out.examples);
        out
    }

    /// Recomputes the statistics after examples were dropped or cut (counters of drops stay).
    pub(crate) fn refresh_stats(&mut self) {
        self.stats.fill(&self.examples);
    }
}

/// Size and length statistics of one translation split (lengths in tokens, without bos/eos).
#[derive(Clone, Debug, PartialEq, Default, Serialize)]
pub struct SplitStats {
    /// Pairs kept.
    pub pairs: usize,
    pub dropped_empty: usize,
    /// Training pairs over `max_source_len`/`max_target_len` (always 0 for valid/test).
    pub dropped_too_long: usize,
    pub source_tokens: usize,
    pub target_tokens: usize,
    pub avg_source_len: f64,
    pub avg_target_len: f64,
    /// 97.5th percentile (nearest rank) of source / target lengths.
    pub p975_source_len: usize,
    pub p975_target_len: usize,
    pub max_source_len: usize,
    pub max_target_len: usize,
    /// `<unk>` tokens on either side (characters the tokenizer never saw).
    pub unk_tokens: usize,
}

impl SplitStats {
    fn fill(&mut self, examples: &[Example]) {
        let src: Vec<usize> = examples.iter().map(|e| e.source.len()).collect();
        let tgt: Vec<usize> = examples.iter().map(|e| e.target.len()).collect();
        self.pairs = examples.len();
        self.source_tokens = src.iter().sum();
        self.target_tokens = tgt.iter().sum();
        let n = self.pairs.max(1) as f64;
        self.avg_source_len = self.source_tokens as f64 / n;
        self.avg_target_len = self.target_tokens as f64 / n;
        self.p975_source_len = percentile(&src, 0.975);
        self.p975_target_len = percentile(&tgt, 0.975);
        self.max_source_len = src.iter().copied().max().unwrap_or(0);
        self.max_target_len = tgt.iter().copied().max().unwrap_or(0);
        self.unk_tokens = examples
            .iter()
            .flat_map(|e| e.source.iter().chain(&e.target))
            .filter(|&&i| i == UNK_ID)
            .count();
    }

    /// Mean tokens per sentence over both sides.
    pub fn avg_tokens_per_sentence(&self) -> f64 {
        (self.source_tokens + self.target_tokens) as f64 / (2 * self.pairs.max(1)) as f64
    }
}

/// Nearest-rank percentile (`q` in 0..=1) of unsorted values; 0 for an empty slice.
pub fn percentile(values: &[usize], q: f64) -> usize {
    if values.is_empty() {
        return 0;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Token streams for language modelling.
#[derive(Clone, Debug, PartialEq)]
pub struct TextSplits {
    pub train: Vec<u32>,
    pub valid: Vec<u32>,
    pub stats: TextStats,
}

#[derive(Clone, Debug, PartialEq, Default, Serialize)]
pub struct TextStats {
    pub train_tokens: usize,
    pub valid_tokens: usize,
    pub train_chars: usize,
    pub valid_chars: usize,
    pub train_unk_tokens: usize,
    pub valid_unk_tokens: usize,
}

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
    /// (the `\r` before each newline stays in the text the model learns).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = vec![];
        if let RawCorpus::Text { train, valid } = &self.raw {
            let mut crlf: Vec<(String, usize)> = vec![];
            for t in train.iter().chain(valid) {
                let n = t.text.matches("\r\n").count();
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
                    "{file} has {n} Windows line ending(s) (CRLF): the '\\r' before each newline is \
                     part of the text the model learns{}; convert the file to plain newlines \
                     (`dos2unix {file}`) and start a new run to train without them",
                    if self.tokenizer.kind() == TokenizerKind::Char {
                        " (a character of its own in the vocabulary)"
                    } else {
                        ""
                    }
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

/// Feeds text groups to `h`: each group's length, then its texts (the fingerprint's and the
/// token cache key's common part).
fn hash_groups(h: &mut ContentHash, groups: &[Vec<&str>]) {
    for g in groups {
        h.bytes(&(g.len() as u64).to_le_bytes());
        for s in g {
            h.str(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_point_cuts_at_a_line_start() {
        let text = "aaaa\nbbbb\ncccc\ndddd\n";
        let cut = split_point(text, 0.5);
        assert_eq!(&text[cut..], "cccc\ndddd\n");
        assert!(split_point("abcdef", 0.5) == 3);
        // Multi-byte characters are never split.
        let t = "ääääää";
        let c = split_point(t, 0.5);
        assert!(t.is_char_boundary(c));
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<usize> = (1..=40).collect();
        assert_eq!(percentile(&v, 0.975), 39);
        assert_eq!(percentile(&v, 1.0), 40);
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[5], 0.975), 5);
    }
}
