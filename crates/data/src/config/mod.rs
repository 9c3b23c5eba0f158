//! The `data:` section of a run config, one struct per YAML mapping.
//!
//! ```yaml
//! data:
//!   corpus:
//!     kind: embedded          # embedded | parallel | text | hf_dataset | token_shards
//!     seed: 1234
//!     train_size: 20000
//!     val_size: 500
//!     test_size: 500
//!   tokenizer: { kind: bpe, vocab_size: 1000, lowercase: false }
//!   max_source_len: 256
//!   max_target_len: 256
//! ```
//!
//! Unknown keys are rejected everywhere (a typo must not silently fall back to a default), and
//! [`DataConfig::validate`] checks ranges, naming the offending key path in its error. Relative
//! corpus paths are resolved against the process's working directory, like any CLI path.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod validate;

/// Default upper bound on BPE vocabulary size. The trained vocabulary can be smaller when the
/// corpus runs out of pairs to merge; the model must take its size from the tokenizer.
pub const DEFAULT_BPE_VOCAB_SIZE: usize = 8000;
/// Number of reserved ids (`<pad>`, `<s>`, `</s>`, `<unk>`) at the start of every vocabulary.
pub const NUM_SPECIAL_TOKENS: usize = 4;

/// `data:` — what to read, how to tokenize it, and which training pairs to drop.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("allOf" = [
    {"$comment": "`tokenizer.kind: pretrained` is for language models read as text (`corpus.kind: text`, or `hf_dataset` with a `text` column); token shards bring their own tokenizer.",
     "if": {"properties": {"tokenizer": {"properties": {"kind": {"const": "pretrained"}}, "required": ["kind"]}},
            "required": ["tokenizer"]},
     "then": {"required": ["corpus"], "properties": {"corpus": {
        "required": ["kind"], "properties": {"kind": {"enum": ["text", "hf_dataset"]}},
        "if": {"properties": {"kind": {"const": "hf_dataset"}}},
        "then": {"properties": {"columns": {"required": ["text"], "properties": {"text": {"type": "string"}}}}}}}}}
]))]
pub struct DataConfig {
    /// Where the text comes from.
    #[serde(default)]
    pub corpus: CorpusConfig,
    /// How text becomes ids.
    #[serde(default)]
    pub tokenizer: TokenizerConfig,
    /// Training pairs whose source has more tokens than this (bos/eos not counted) are dropped
    /// and counted. Validation and test pairs are never dropped: evaluation must see every line.
    /// Ignored by `kind: text`.
    #[serde(default = "default_max_len")]
    #[schemars(range(min = 1))]
    pub max_source_len: usize,
    /// As `max_source_len`, for the target side.
    #[serde(default = "default_max_len")]
    #[schemars(range(min = 1))]
    pub max_target_len: usize,
    /// What to do with a pair (any split) that does not fit the model's positions
    /// (`model.max_seq_len`: the source, or the target plus its bos/eos): `error` (default: stop
    /// at load, naming the file and line), `skip` it, or `truncate` it to fit.
    #[serde(default)]
    pub too_long: TooLong,
}

/// `data.too_long`: the fate of an example longer than the model's positions.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TooLong {
    /// Refuse the data at load, naming the file and line of the first such example.
    #[default]
    Error,
    /// Drop such examples (counted and reported; validation BLEU then covers the rest).
    Skip,
    /// Cut such examples to fit (references for BLEU stay whole).
    Truncate,
}

fn default_max_len() -> usize {
    256
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            corpus: CorpusConfig::default(),
            tokenizer: TokenizerConfig::default(),
            max_source_len: default_max_len(),
            max_target_len: default_max_len(),
            too_long: TooLong::default(),
        }
    }
}

/// `data.corpus:` — exactly one kind of corpus, chosen by `kind:`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CorpusConfig {
    /// The procedurally generated English→German number task (no files needed).
    Embedded(EmbeddedConfig),
    /// Line-aligned source/target files (plain or gzip), e.g. Multi30k.
    Parallel(ParallelConfig),
    /// Monolingual text for language modelling, e.g. Tiny Shakespeare.
    Text(TextConfig),
    /// A Hugging Face dataset's parquet files (translation or language modelling), from a
    /// local folder or the Hugging Face cache.
    HfDataset(HfDatasetConfig),
    /// Pre-tokenised llama2.c shards (raw little-endian u16 ids) for language modelling.
    TokenShards(TokenShardsConfig),
}

impl Default for CorpusConfig {
    fn default() -> Self {
        CorpusConfig::Embedded(EmbeddedConfig::default())
    }
}

impl CorpusConfig {
    /// True for corpora that yield (source, target) pairs rather than one token stream.
    pub fn is_translation(&self) -> bool {
        match self {
            CorpusConfig::Embedded(_) | CorpusConfig::Parallel(_) => true,
            CorpusConfig::Text(_) | CorpusConfig::TokenShards(_) => false,
            CorpusConfig::HfDataset(h) => h.columns.is_translation(),
        }
    }
}

/// `data.corpus` with `kind: embedded`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddedConfig {
    /// Generation seed; the same seed gives byte-identical splits on every machine.
    #[serde(default = "default_embedded_seed")]
    pub seed: u64,
    /// Training pairs to generate; `train_size + val_size + test_size` is at most 1,000,000.
    #[serde(default = "default_embedded_train")]
    #[schemars(range(min = 1, max = EmbeddedConfig::MAX_TOTAL_SIZE))]
    pub train_size: usize,
    /// Validation pairs to generate.
    #[serde(default = "default_embedded_eval")]
    #[schemars(range(min = 1, max = EmbeddedConfig::MAX_TOTAL_SIZE))]
    pub val_size: usize,
    /// Test pairs to generate (0: no test split).
    #[serde(default = "default_embedded_eval")]
    #[schemars(range(max = EmbeddedConfig::MAX_TOTAL_SIZE))]
    pub test_size: usize,
}

fn default_embedded_seed() -> u64 {
    1234
}
fn default_embedded_train() -> usize {
    20_000
}
fn default_embedded_eval() -> usize {
    500
}

impl EmbeddedConfig {
    /// Upper bound on `train_size + val_size + test_size` (keeps generation under a few seconds).
    pub const MAX_TOTAL_SIZE: usize = 1_000_000;
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self {
            seed: default_embedded_seed(),
            train_size: default_embedded_train(),
            val_size: default_embedded_eval(),
            test_size: default_embedded_eval(),
        }
    }
}

/// `data.corpus` with `kind: parallel`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParallelConfig {
    /// The training pairs.
    pub train: PairPaths,
    /// The validation pairs.
    pub valid: PairPaths,
    /// Optional held-out test set (BLEU is reported on it when present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<PairPaths>,
}

/// A source file and its line-aligned target file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PairPaths {
    /// The source-language file (one sentence a line; plain or `.gz`).
    #[schemars(length(min = 1))]
    pub source: PathBuf,
    /// The target-language file, line-aligned with `source`.
    #[schemars(length(min = 1))]
    pub target: PathBuf,
}

/// `data.corpus` with `kind: text`: either one `path` split by `val_fraction`, or explicit
/// `train_files` and `val_files`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "$comment" = "Either `path` (split by `val_fraction`) or `train_files` with `val_files`, not both.",
    "if" = {"properties": {"path": {"type": "string"}}, "required": ["path"]},
    "then" = {"properties": {"train_files": {"maxItems": 0}, "val_files": {"maxItems": 0}}},
    "else" = {"required": ["train_files", "val_files"],
              "properties": {"train_files": {"minItems": 1}, "val_files": {"minItems": 1},
                             "val_fraction": {"type": "null"}}}
))]
pub struct TextConfig {
    /// One text file, split into training and validation by `val_fraction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub path: Option<PathBuf>,
    /// Fraction of `path` (its tail, cut at a line boundary) held out for validation; default 0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0, "exclusiveMaximum" = 1))]
    pub val_fraction: Option<f64>,
    /// Training text files, read in order as one stream (instead of `path`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)), extend("default" = []))]
    pub train_files: Vec<PathBuf>,
    /// Validation text files (with `train_files`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)), extend("default" = []))]
    pub val_files: Vec<PathBuf>,
}

/// `data.corpus` with `kind: hf_dataset`: the parquet files of a Hugging Face dataset, read from
/// a local folder (`path`) or from the Hugging Face cache (`repo`).
///
/// ```yaml
/// corpus:
///   kind: hf_dataset
///   repo: bentrevett/multi30k       # or path: data/multi30k-parquet (a local folder)
///   revision: refs/convert/parquet  # with repo: the branch/tag/commit read from the cache (default)
///   config: default                 # the dataset's subset folder, when it has several
///   splits: { train: train, valid: validation, test: test }
///   columns: { source: en, target: de }     # translation; or columns: { text: text }
/// ```
///
/// A parquet file belongs to split `S` when its folder is `S` (or `partial-S`), as in the Hub's
/// parquet conversion `config/S/0000.parquet`, or its name is `S` or starts with `S-`, as in
/// `data/S-00000-of-00001.parquet`. Files are read in path order, so a run reads the same rows
/// in the same order every time (which resuming relies on).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "$comment" = "Exactly one of `path` and `repo`; `revision` only with `repo`.",
    "oneOf" = [{"required": ["path"], "properties": {"path": {"type": "string"}, "repo": {"type": "null"}}},
               {"required": ["repo"], "properties": {"repo": {"type": "string"}, "path": {"type": "null"}}}],
    "if" = {"properties": {"revision": {"type": "string"}}, "required": ["revision"]},
    "then" = {"required": ["repo"], "properties": {"repo": {"type": "string"}}}
))]
pub struct HfDatasetConfig {
    /// A local folder holding the dataset's parquet files (searched recursively).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub path: Option<PathBuf>,
    /// A Hub dataset id (`owner/name`). Its parquet conversion (the `refs/convert/parquet`
    /// branch) is read from the Hugging Face cache (`HF_HUB_CACHE`, `HF_HOME/hub` or
    /// `~/.cache/huggingface/hub`); a build with `--features hf-hub` fetches it there first when
    /// it is missing. Exactly one of `path` and `repo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[^/]+(/[^/]+)?$"), extend("not" = {"pattern": "^\\s*$"}))]
    pub repo: Option<String>,
    /// With `repo`: the branch, tag or commit whose snapshot in the cache is read; defaults to
    /// `refs/convert/parquet`, the Hub's parquet conversion (the only one `--features hf-hub`
    /// fetches). Use e.g. `main` for a dataset uploaded as parquet, fetched with
    /// `huggingface-cli download --repo-type dataset OWNER/NAME --revision main`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"\S"))]
    pub revision: Option<String>,
    /// The dataset's config (subset): the first folder level of its parquet conversion, e.g.
    /// `default` or `de-en`. Needed only when the dataset has several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"\S"))]
    pub config: Option<String>,
    /// The dataset's split names for Ember's train, valid and test splits.
    #[serde(default)]
    pub splits: HfSplits,
    /// Which columns hold the text.
    pub columns: HfColumns,
}

/// `data.corpus.splits` of `kind: hf_dataset`: the dataset's split names for each of Ember's.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HfSplits {
    /// The dataset's training split.
    #[serde(default = "default_train_split")]
    #[schemars(regex(pattern = r"\S"))]
    pub train: String,
    /// The dataset's validation split.
    #[serde(default = "default_valid_split")]
    #[schemars(regex(pattern = r"\S"))]
    pub valid: String,
    /// Optional held-out test split (translation reports BLEU on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"\S"))]
    pub test: Option<String>,
}

fn default_train_split() -> String {
    "train".into()
}
fn default_valid_split() -> String {
    "validation".into()
}

impl Default for HfSplits {
    fn default() -> Self {
        Self {
            train: default_train_split(),
            valid: default_valid_split(),
            test: None,
        }
    }
}

/// `data.corpus.columns` of `kind: hf_dataset`: `text` for a language model, or `source` and
/// `target` for translation. A dotted name reaches into a struct column, e.g.
/// `translation.de` for the WMT datasets' `translation: {de, en}` column.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("$comment" = "Either `text` (a language model) or both `source` and `target` (translation).", "oneOf" = [
    {"required": ["text"], "properties": {"text": {"type": "string"}, "source": {"type": "null"}, "target": {"type": "null"}}},
    {"required": ["source", "target"],
     "properties": {"text": {"type": "null"}, "source": {"type": "string"}, "target": {"type": "string"}}}
]))]
pub struct HfColumns {
    /// Language modelling: the column with each row's text; rows are joined with a newline,
    /// as if they were the lines of a text file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"\S"))]
    pub text: Option<String>,
    /// Translation: the source-language column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"\S"))]
    pub source: Option<String>,
    /// Translation: the target-language column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"\S"))]
    pub target: Option<String>,
}

impl HfColumns {
    /// True when the columns name a source and a target (a translation corpus).
    pub fn is_translation(&self) -> bool {
        self.text.is_none() && (self.source.is_some() || self.target.is_some())
    }
}

/// `data.corpus` with `kind: token_shards`: llama2.c-style `.bin` shards (raw little-endian
/// u16 token ids, no header), as `ember tokenize` writes them. Each list is read in order and
/// concatenated into one token stream; an entry may be a file or a folder (its `*.bin` files
/// in name order).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenShardsConfig {
    /// Training shards (files, or folders of `*.bin` files in name order), concatenated.
    #[schemars(length(min = 1), inner(length(min = 1)))]
    pub train_files: Vec<PathBuf>,
    /// Validation shards, as `train_files`.
    #[schemars(length(min = 1), inner(length(min = 1)))]
    pub val_files: Vec<PathBuf>,
    /// The `tokenizer.json` the shards were written with, or a run directory holding one. It
    /// becomes the run's tokenizer (`data.tokenizer` is not used).
    #[schemars(length(min = 1))]
    pub tokenizer: PathBuf,
}

/// Validation fraction used when `val_fraction` is not given.
pub const DEFAULT_VAL_FRACTION: f64 = 0.1;

/// `data.tokenizer:`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "$comment" = "`kind: pretrained` needs `path` and takes neither `vocab_size` nor `lowercase: true`; `path` is for `pretrained` only; `kind: char` takes no `vocab_size`; a `bpe` vocabulary is 5 to 2147483647.",
    "if" = {"properties": {"kind": {"const": "pretrained"}}, "required": ["kind"]},
    "then" = {"required": ["path"], "properties": {"path": {"type": "string", "minLength": 1},
              "vocab_size": {"type": "null"}, "lowercase": {"const": false}}},
    "else" = {"properties": {"path": {"type": "null"}}, "allOf": [
        {"if": {"properties": {"kind": {"const": "char"}}, "required": ["kind"]},
         "then": {"properties": {"vocab_size": {"type": "null"}}},
         "else": {"properties": {"vocab_size": {"minimum": 5, "maximum": 2147483647}}}}]}
))]
pub struct TokenizerConfig {
    /// `bpe` (trained on the corpus), `char`, or `pretrained` (a model's own).
    #[serde(default)]
    pub kind: TokenizerKind,
    /// `kind: pretrained` only: the folder holding the model's `tokenizer.json` (and its
    /// `tokenizer_config.json`, which names the special tokens). `model.init_from` sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Upper bound on the BPE vocabulary, specials included (default 8000). Not allowed for
    /// `kind: char`, whose vocabulary is the set of characters in the training text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    /// Lowercase all text before tokenizing (decoded output is then lowercase too).
    #[serde(default)]
    pub lowercase: bool,
}

impl Default for TokenizerConfig {
    fn default() -> Self {
        Self {
            kind: TokenizerKind::Bpe,
            path: None,
            vocab_size: None,
            lowercase: false,
        }
    }
}

impl TokenizerConfig {
    /// The BPE vocabulary bound in effect (`vocab_size` or the default).
    pub fn bpe_vocab_size(&self) -> usize {
        self.vocab_size.unwrap_or(DEFAULT_BPE_VOCAB_SIZE)
    }
}

/// Which tokenizer to train when the run directory has none.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenizerKind {
    /// Byte-pair encoding over SentencePiece-style `▁`-marked words (joint vocabulary for translation).
    #[default]
    Bpe,
    /// One token per character (exact round trip of any text whose characters were seen in training).
    Char,
    /// A pretrained model's own tokenizer, read from `path` as transformers wrote it (any
    /// vocabulary and special tokens): language models only.
    Pretrained,
}
