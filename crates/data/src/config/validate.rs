//! The `data:` section's checks: ranges and the rules between keys that serde cannot express,
//! each failure naming its key path (`data.…`), and the settings that are allowed but probably
//! not meant.

use super::{
    CorpusConfig, DataConfig, EmbeddedConfig, HfDatasetConfig, TextConfig, TokenShardsConfig, TokenizerKind,
    DEFAULT_VAL_FRACTION, NUM_SPECIAL_TOKENS,
};
use crate::error::{DataError, Result};

impl DataConfig {
    /// Settings that are allowed but probably not meant: a validation split that is (partly)
    /// the training data measures memorisation, not generalisation.
    pub fn warnings(&self) -> Vec<String> {
        let same = |key: &str, what: String| {
            format!(
                "{key} names the training data ({what}): validation then measures how well the \
                 model remembers its training text, not how it generalises; name held-out data"
            )
        };
        let mut out = vec![];
        match &self.corpus {
            CorpusConfig::HfDataset(h) => {
                if h.splits.valid == h.splits.train {
                    out.push(same(
                        "data.corpus.splits.valid",
                        format!("split {:?}", h.splits.train),
                    ));
                }
                if h.splits.test.as_ref() == Some(&h.splits.train) {
                    out.push(same(
                        "data.corpus.splits.test",
                        format!("split {:?}", h.splits.train),
                    ));
                }
            }
            CorpusConfig::Parallel(p) => {
                if p.valid.source == p.train.source || p.valid.target == p.train.target {
                    out.push(same("data.corpus.valid", p.train.source.display().to_string()));
                }
            }
            CorpusConfig::Text(t) => {
                if let Some(f) = t.val_files.iter().find(|f| t.train_files.contains(f)) {
                    out.push(same("data.corpus.val_files", f.display().to_string()));
                }
            }
            CorpusConfig::TokenShards(t) => {
                if let Some(f) = t.val_files.iter().find(|f| t.train_files.contains(f)) {
                    out.push(same("data.corpus.val_files", f.display().to_string()));
                }
            }
            CorpusConfig::Embedded(_) => {}
        }
        out
    }

    /// Checks every range and cross-field rule; errors name the key path (`data.…`).
    pub fn validate(&self) -> Result<()> {
        match &self.corpus {
            CorpusConfig::Embedded(e) => {
                if e.train_size == 0 {
                    return Err(DataError::config("data.corpus.train_size", "must be > 0"));
                }
                if e.val_size == 0 {
                    return Err(DataError::config("data.corpus.val_size", "must be > 0"));
                }
                let total = e.train_size as u128 + e.val_size as u128 + e.test_size as u128;
                if total > EmbeddedConfig::MAX_TOTAL_SIZE as u128 {
                    return Err(DataError::config(
                        "data.corpus.train_size",
                        format!(
                            "train_size + val_size + test_size = {total} exceeds {} distinct \
                             sentences the embedded task can generate quickly; use smaller sizes",
                            EmbeddedConfig::MAX_TOTAL_SIZE
                        ),
                    ));
                }
            }
            CorpusConfig::Parallel(p) => {
                for (name, pair) in [
                    ("train", Some(&p.train)),
                    ("valid", Some(&p.valid)),
                    ("test", p.test.as_ref()),
                ] {
                    let Some(pair) = pair else { continue };
                    for (side, path) in [("source", &pair.source), ("target", &pair.target)] {
                        if path.as_os_str().is_empty() {
                            return Err(DataError::config(
                                format!("data.corpus.{name}.{side}"),
                                "must be a file path, got an empty string",
                            ));
                        }
                    }
                }
            }
            CorpusConfig::Text(t) => validate_text(t)?,
            CorpusConfig::HfDataset(h) => validate_hf_dataset(h)?,
            CorpusConfig::TokenShards(t) => validate_token_shards(t)?,
        }
        if self.tokenizer.kind != TokenizerKind::Pretrained && self.tokenizer.path.is_some() {
            return Err(DataError::config(
                "data.tokenizer.path",
                "applies to kind: pretrained only (a bpe or char tokenizer is trained on the corpus); \
                 remove the key",
            ));
        }
        match self.tokenizer.kind {
            TokenizerKind::Pretrained => validate_pretrained(self)?,
            TokenizerKind::Bpe => {
                let v = self.tokenizer.bpe_vocab_size();
                if v <= NUM_SPECIAL_TOKENS {
                    return Err(DataError::config(
                        "data.tokenizer.vocab_size",
                        format!("must be > {NUM_SPECIAL_TOKENS} (the special tokens alone take {NUM_SPECIAL_TOKENS}), got {v}"),
                    ));
                }
                if v > u32::MAX as usize / 2 {
                    return Err(DataError::config(
                        "data.tokenizer.vocab_size",
                        format!("{v} is unreasonably large; use at most a few hundred thousand"),
                    ));
                }
            }
            TokenizerKind::Char => {
                if self.tokenizer.vocab_size.is_some() {
                    return Err(DataError::config(
                        "data.tokenizer.vocab_size",
                        "is not used by kind: char (the vocabulary is every character of the \
                         training text); remove the key",
                    ));
                }
            }
        }
        if self.max_source_len == 0 {
            return Err(DataError::config("data.max_source_len", "must be > 0"));
        }
        if self.max_target_len == 0 {
            return Err(DataError::config("data.max_target_len", "must be > 0"));
        }
        Ok(())
    }
}

/// `data.tokenizer.kind: pretrained`: a folder, a language-model corpus, nothing to train.
fn validate_pretrained(cfg: &DataConfig) -> Result<()> {
    let t = &cfg.tokenizer;
    if t.path.as_ref().is_none_or(|p| p.as_os_str().is_empty()) {
        return Err(DataError::config(
            "data.tokenizer.path",
            "kind: pretrained needs the folder of the model's tokenizer.json (model.init_from sets it)",
        ));
    }
    if t.vocab_size.is_some() || t.lowercase {
        return Err(DataError::config(
            if t.lowercase {
                "data.tokenizer.lowercase"
            } else {
                "data.tokenizer.vocab_size"
            },
            "does not apply to kind: pretrained (the model's tokenizer is used as it is); remove the key",
        ));
    }
    if cfg.corpus.is_translation() {
        return Err(DataError::config(
            "data.tokenizer.kind",
            "pretrained tokenizers are for language models (text corpora): translation batches use \
             Ember's fixed <pad>/<s>/</s> ids, which a pretrained vocabulary does not have",
        ));
    }
    if let CorpusConfig::TokenShards(_) = cfg.corpus {
        return Err(DataError::config(
            "data.tokenizer.kind",
            "token shards carry their own tokenizer (data.corpus.tokenizer); with a pretrained \
             model's tokenizer, train on the text itself (data.corpus.kind: text or hf_dataset)",
        ));
    }
    Ok(())
}

fn validate_hf_dataset(h: &HfDatasetConfig) -> Result<()> {
    match (&h.path, &h.repo) {
        (Some(_), Some(_)) => {
            return Err(DataError::config(
                "data.corpus.repo",
                "give either path (a local folder) or repo (a Hub dataset id), not both",
            ))
        }
        (None, None) => {
            return Err(DataError::config(
                "data.corpus.path",
                "missing: give path (a local folder of parquet files) or repo (a Hub dataset id such as bentrevett/multi30k)",
            ))
        }
        (Some(p), None) if p.as_os_str().is_empty() => {
            return Err(DataError::config(
                "data.corpus.path",
                "must be a folder path, got an empty string",
            ))
        }
        (None, Some(r)) if r.trim().is_empty() || r.split('/').any(str::is_empty) || r.matches('/').count() > 1 => {
            return Err(DataError::config(
                "data.corpus.repo",
                format!("{r:?} is not a Hub dataset id; expected owner/name, e.g. bentrevett/multi30k"),
            ))
        }
        _ => {}
    }
    if h.revision.is_some() && h.repo.is_none() {
        return Err(DataError::config(
            "data.corpus.revision",
            "only applies to repo (a Hub dataset in the cache); remove it for a local path",
        ));
    }
    let names = [
        ("revision", h.revision.as_ref()),
        ("config", h.config.as_ref()),
        ("splits.train", Some(&h.splits.train)),
        ("splits.valid", Some(&h.splits.valid)),
        ("splits.test", h.splits.test.as_ref()),
        ("columns.text", h.columns.text.as_ref()),
        ("columns.source", h.columns.source.as_ref()),
        ("columns.target", h.columns.target.as_ref()),
    ];
    for (key, value) in names {
        if value.is_some_and(|v| v.trim().is_empty()) {
            return Err(DataError::config(
                format!("data.corpus.{key}"),
                "must not be empty",
            ));
        }
    }
    let c = &h.columns;
    match (&c.text, &c.source, &c.target) {
        (Some(_), None, None) | (None, Some(_), Some(_)) => Ok(()),
        (Some(_), _, _) => Err(DataError::config(
            "data.corpus.columns.text",
            "give either text (a language model) or source and target (translation), not both",
        )),
        (None, Some(_), None) => Err(DataError::config(
            "data.corpus.columns.target",
            "missing: translation needs both source and target columns",
        )),
        (None, None, Some(_)) => Err(DataError::config(
            "data.corpus.columns.source",
            "missing: translation needs both source and target columns",
        )),
        (None, None, None) => Err(DataError::config(
            "data.corpus.columns",
            "name the text column (columns: { text: text }) or the translation columns (columns: { source: en, target: de })",
        )),
    }
}

fn validate_token_shards(t: &TokenShardsConfig) -> Result<()> {
    for (key, files) in [("train_files", &t.train_files), ("val_files", &t.val_files)] {
        if files.is_empty() {
            return Err(DataError::config(
                format!("data.corpus.{key}"),
                "must list at least one shard file or folder",
            ));
        }
        if let Some(i) = files.iter().position(|p| p.as_os_str().is_empty()) {
            return Err(DataError::config(
                format!("data.corpus.{key}[{i}]"),
                "must be a file path, got an empty string",
            ));
        }
    }
    if t.tokenizer.as_os_str().is_empty() {
        return Err(DataError::config(
            "data.corpus.tokenizer",
            "must be a tokenizer.json path (or a run directory), got an empty string",
        ));
    }
    Ok(())
}

fn validate_text(t: &TextConfig) -> Result<()> {
    match (&t.path, t.train_files.is_empty()) {
        (Some(_), false) => Err(DataError::config(
            "data.corpus.path",
            "give either path (with val_fraction) or train_files + val_files, not both",
        )),
        (None, true) => Err(DataError::config(
            "data.corpus.path",
            "missing: give path (split by val_fraction) or train_files + val_files",
        )),
        (Some(path), true) => {
            if path.as_os_str().is_empty() {
                return Err(DataError::config(
                    "data.corpus.path",
                    "must be a file path, got an empty string",
                ));
            }
            if !t.val_files.is_empty() {
                return Err(DataError::config(
                    "data.corpus.val_files",
                    "only allowed together with train_files; with path, use val_fraction",
                ));
            }
            let f = t.val_fraction.unwrap_or(DEFAULT_VAL_FRACTION);
            if !(f > 0.0 && f < 1.0) {
                return Err(DataError::config(
                    "data.corpus.val_fraction",
                    format!("must be strictly between 0 and 1, got {f}"),
                ));
            }
            Ok(())
        }
        (None, false) => {
            if t.val_files.is_empty() {
                return Err(DataError::config(
                    "data.corpus.val_files",
                    "missing: train_files needs at least one validation file",
                ));
            }
            if t.val_fraction.is_some() {
                return Err(DataError::config(
                    "data.corpus.val_fraction",
                    "only allowed with path; train_files/val_files already fix the split",
                ));
            }
            for (key, files) in [("train_files", &t.train_files), ("val_files", &t.val_files)] {
                if let Some(i) = files.iter().position(|p| p.as_os_str().is_empty()) {
                    return Err(DataError::config(
                        format!("data.corpus.{key}[{i}]"),
                        "must be a file path, got an empty string",
                    ));
                }
            }
            Ok(())
        }
    }
}
