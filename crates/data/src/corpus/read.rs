//! Reading a corpus: every split's text from the files (or the generator) a `data.corpus`
//! config names, and the fingerprint a resumed run checks it against.

use std::path::PathBuf;

use crate::cache::ContentHash;
use crate::config::{CorpusConfig, PairPaths, TextConfig, TokenShardsConfig, DEFAULT_VAL_FRACTION};
use crate::embedded;
use crate::error::{DataError, Result};
use crate::io::{lines, read_lines, read_text};
use crate::raw::{RawCorpus, RawPairs, RawText, TokenShard};
use crate::shards;

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
    pub(super) fn groups(&self) -> Vec<Vec<&str>> {
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
        // Windows line endings are counted before the split, then read as plain newlines.
        let whole = RawText::plain_newlines(
            path.display().to_string(),
            read_text(path, Some("data.corpus.path"))?,
        );
        let text = whole.text;
        if text.trim().is_empty() {
            return Err(DataError::EmptyFile {
                path: path.clone(),
                key: Some("data.corpus.path".into()),
            });
        }
        let fraction = t.val_fraction.unwrap_or(DEFAULT_VAL_FRACTION);
        let cut = split_point(&text, fraction);
        let (train, valid) = text.split_at(cut);
        // The count goes with the training part: the file's, said once.
        let crlf = whole.crlf;
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
                crlf,
            }],
            valid: vec![RawText {
                name: format!("{name}[{pct:.1}%..]"),
                text: valid.to_string(),
                crlf: 0,
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
                    Ok(RawText::plain_newlines(p.display().to_string(), text))
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
fn split_point(text: &str, val_fraction: f64) -> usize {
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

/// Feeds text groups to `h`: each group's length, then its texts (the fingerprint's and the
/// token cache key's common part).
pub(super) fn hash_groups(h: &mut ContentHash, groups: &[Vec<&str>]) {
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
}
