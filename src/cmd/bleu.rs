//! `ember bleu`: BLEU and chrF of a hypothesis file exactly as sacreBLEU 2.x scores them, for the
//! whole corpus and, with `--source`, per source-length bucket.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use ember_sacrebleu::{corpus_bleu, corpus_chrf, BleuConfig, ChrfConfig, Tokenize};
use ember_trainer::say;

#[derive(Args)]
pub(crate) struct BleuArgs {
    /// Reference file(s), one segment per line (repeat for multiple references).
    #[arg(short = 'r', long = "reference", required = true)]
    references: Vec<PathBuf>,
    /// Hypothesis file (default: standard input).
    #[arg(short = 'i', long = "input")]
    input: Option<PathBuf>,
    /// Metrics to compute: bleu, chrf, or both separated by commas.
    #[arg(short = 'm', long, default_value = "bleu", value_delimiter = ',')]
    metrics: Vec<String>,
    /// Tokenisation for BLEU: none, 13a or intl.
    #[arg(long, default_value = "13a")]
    tokenize: String,
    /// Case-insensitive scoring.
    #[arg(long)]
    lowercase: bool,
    /// The source side, one segment per line: also score the segments grouped by source length
    /// (whitespace-separated words) into the buckets of --length-buckets.
    #[arg(long)]
    source: Option<PathBuf>,
    /// With --source: the last length of every bucket but the open-ended last one.
    #[arg(long, requires = "source", value_delimiter = ',', default_value = "10,15,20")]
    length_buckets: Vec<usize>,
    #[arg(long)]
    json: bool,
}

/// Segments whose source has `first..=last` words (`last` = `None`: no upper bound).
struct LengthBucket {
    first: usize,
    last: Option<usize>,
    rows: Vec<usize>,
}

impl LengthBucket {
    fn label(&self) -> String {
        match self.last {
            Some(last) => format!("{}-{last}", self.first),
            None => format!("{}+", self.first),
        }
    }
}

/// The segments of each source-length bucket; `ends` are the buckets' last lengths, ascending.
fn source_length_buckets(
    sources: &[String],
    path: &Path,
    segments: usize,
    ends: &[usize],
) -> Result<Vec<LengthBucket>> {
    if sources.len() != segments {
        bail!(
            "--source {} has {} lines but the hypothesis has {segments}; they must be line-aligned",
            path.display(),
            sources.len()
        );
    }
    if ends.is_empty() || ends[0] == 0 || ends.windows(2).any(|w| w[0] >= w[1]) {
        bail!("--length-buckets must be ascending word counts above 0, e.g. 10,15,20; got {ends:?}");
    }
    let mut buckets: Vec<LengthBucket> = std::iter::once(0)
        .chain(ends.iter().map(|e| e + 1))
        .zip(ends.iter().map(|&e| Some(e)).chain([None]))
        .map(|(first, last)| LengthBucket {
            first,
            last,
            rows: Vec::new(),
        })
        .collect();
    for (i, line) in sources.iter().enumerate() {
        let words = line.split_whitespace().count();
        let b = ends.iter().position(|&e| words <= e).unwrap_or(ends.len());
        buckets[b].rows.push(i);
    }
    buckets.retain(|b| !b.rows.is_empty());
    Ok(buckets)
}

fn read_lines(path: &Path, flag: &str) -> Result<Vec<String>> {
    ember_data::io::refuse_special_input(path, Some(flag))?;
    let bytes = ember_data::io::read_bytes(path).with_context(|| format!("reading {}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{} is not UTF-8 text; re-encode it as UTF-8", path.display()))?;
    Ok(split_lines(&text))
}

/// Lines as sacreBLEU reads them: split on '\n', a trailing newline does not make an empty segment.
fn split_lines(text: &str) -> Vec<String> {
    let text = text.strip_suffix('\n').unwrap_or(text);
    if text.is_empty() {
        return vec![];
    }
    text.split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l).to_string())
        .collect()
}

pub(crate) fn run(args: BleuArgs) -> Result<()> {
    let (hyps, refs) = read_hypothesis_and_references(&args)?;
    let tokenize: Tokenize = args
        .tokenize
        .parse()
        .map_err(|e| anyhow::anyhow!("--tokenize: {e}"))?;
    // Every metric is checked before any is computed: a typo must not print half the output.
    if let Some(bad) = args
        .metrics
        .iter()
        .find(|m| !["bleu", "chrf"].contains(&m.as_str()))
    {
        bail!("--metrics: unknown metric {bad:?}; use bleu, chrf or bleu,chrf");
    }
    let buckets = match &args.source {
        Some(path) => source_length_buckets(
            &read_lines(path, "--source")?,
            path,
            hyps.len(),
            &args.length_buckets,
        )?,
        None => Vec::new(),
    };
    let mut json = serde_json::Map::new();
    for metric in &args.metrics {
        // The whole corpus, then each source-length bucket.
        let score =
            |hyps: &[String], refs: &[Vec<String>]| score(metric, tokenize, args.lowercase, hyps, refs);
        let (line, value) = score(&hyps, &refs)?;
        let mut by_length = Vec::new();
        for b in &buckets {
            let pick = |lines: &[String]| b.rows.iter().map(|&i| lines[i].clone()).collect::<Vec<_>>();
            let sub_refs: Vec<Vec<String>> = refs.iter().map(|r| pick(r)).collect();
            let (sub_line, sub_value) = score(&pick(&hyps), &sub_refs)?;
            by_length.push((b, sub_line, sub_value));
        }
        if args.json {
            json.insert(metric.clone(), value);
            if !buckets.is_empty() {
                let rows: Vec<serde_json::Value> = by_length
                    .into_iter()
                    .map(|(b, _, v)| {
                        serde_json::json!({
                            "first": b.first, "last": b.last, "sentences": b.rows.len(), "score": v,
                        })
                    })
                    .collect();
                json.insert(format!("{metric}_by_source_length"), rows.into());
            }
        } else {
            say!("{line}");
            for (b, sub_line, _) in by_length {
                say!(
                    "  source words {}: {} sentences | {sub_line}",
                    b.label(),
                    b.rows.len()
                );
            }
        }
    }
    if args.json {
        say!("{}", serde_json::to_string_pretty(&json)?);
    }
    Ok(())
}

/// The hypothesis lines (from `-i` or stdin) and each reference file's, refused unless every
/// reference has one line per hypothesis line.
fn read_hypothesis_and_references(args: &BleuArgs) -> Result<(Vec<String>, Vec<Vec<String>>)> {
    let hyps = match &args.input {
        Some(path) => read_lines(path, "-i")?,
        None => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading the hypothesis from stdin")?;
            split_lines(&text)
        }
    };
    let refs = args
        .references
        .iter()
        .map(|p| read_lines(p, "-r"))
        .collect::<Result<Vec<_>>>()?;
    let hyp_name = args
        .input
        .as_ref()
        .map_or("standard input".to_string(), |p| p.display().to_string());
    if hyps.is_empty() {
        bail!("the hypothesis ({hyp_name}) has no lines: nothing to score");
    }
    for (path, lines) in args.references.iter().zip(&refs) {
        if lines.len() != hyps.len() {
            bail!(
                "-r {} has {} line(s) but the hypothesis ({hyp_name}) has {}: each reference file \
                 needs one line per hypothesis line, in the same order",
                path.display(),
                lines.len(),
                hyps.len()
            );
        }
    }
    Ok((hyps, refs))
}

/// One metric (`bleu` or `chrf`, checked before) of `hyps` against `refs`: its line as
/// sacreBLEU prints it, and its JSON.
fn score(
    metric: &str,
    tokenize: Tokenize,
    lowercase: bool,
    hyps: &[String],
    refs: &[Vec<String>],
) -> Result<(String, serde_json::Value)> {
    Ok(match metric {
        "bleu" => {
            let cfg = BleuConfig {
                tokenize,
                lowercase,
                ..BleuConfig::default()
            };
            let score = corpus_bleu(hyps, refs, &cfg)?;
            (score.format(), serde_json::to_value(&score)?)
        }
        "chrf" => {
            let cfg = ChrfConfig {
                lowercase,
                ..ChrfConfig::default()
            };
            let score = corpus_chrf(hyps, refs, &cfg)?;
            (score.format(), serde_json::to_value(&score)?)
        }
        other => unreachable!("--metrics {other:?} was checked above"),
    })
}
