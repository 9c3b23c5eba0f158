//! Decoding with a trained model: translating token-id sources in batches, scoring the output
//! against references with sacreBLEU-exact BLEU and chrF, and sampling from language models.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use ember_data::{PairSplit, Tokenizer};
use ember_model::{beam_search, greedy, BeamConfig, Seq2Seq};
use ember_sacrebleu::{corpus_bleu, corpus_chrf, BleuConfig, BleuScore, ChrfConfig, ChrfScore};
use serde::Serialize;

/// Padded source tokens × beam rows per decoding batch: big enough to keep matmuls efficient,
/// small enough that the cache of a 10k-vocabulary model stays modest.
const DECODE_BUDGET: usize = 16_384;

/// One translated sentence.
#[derive(Debug, Clone, Serialize)]
pub struct Translation {
    pub text: String,
    pub tokens: Vec<u32>,
    /// Length-penalised log-probability (what beam search ranks by).
    pub score: f64,
}

/// Translates token-id sources (in any order; outputs keep it), `beam.beam_size` 1 = greedy.
pub fn translate_ids(
    model: &Seq2Seq,
    tokenizer: &Tokenizer,
    sources: &[Vec<u32>],
    beam: &BeamConfig,
    device: &Device,
) -> Result<Vec<Translation>> {
    let pad = tokenizer.pad_id();
    // Longest first: batches of similar lengths waste little on padding.
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sources[i].len()));
    let mut out: Vec<Option<Translation>> = vec![None; sources.len()];
    let mut start = 0;
    while start < order.len() {
        let longest = sources[order[start]].len().max(1);
        let per_batch = (DECODE_BUDGET / (longest * beam.beam_size.max(1))).max(1);
        let batch = &order[start..(start + per_batch).min(order.len())];
        start += batch.len();
        let mut ids = vec![pad; batch.len() * longest];
        let mut mask = vec![0u32; batch.len() * longest];
        for (row, &i) in batch.iter().enumerate() {
            let s = &sources[i];
            ids[row * longest..row * longest + s.len()].copy_from_slice(s);
            mask[row * longest..row * longest + s.len()].fill(1);
        }
        let src = Tensor::from_vec(ids, (batch.len(), longest), device)?;
        let src_mask = Tensor::from_vec(mask, (batch.len(), longest), device)?;
        let (bos, eos) = (tokenizer.bos_id(), tokenizer.eos_id());
        let best: Vec<_> = if beam.beam_size <= 1 {
            greedy(model, &src, Some(&src_mask), bos, eos, beam)?
        } else {
            beam_search(model, &src, Some(&src_mask), bos, eos, beam)?
                .into_iter()
                .map(|mut n| n.remove(0))
                .collect()
        };
        if best.len() != batch.len() {
            bail!(
                "decoding returned {} hypotheses for {} sentences",
                best.len(),
                batch.len()
            );
        }
        for (&i, hyp) in batch.iter().zip(best) {
            out[i] = Some(Translation {
                text: tokenizer.decode(&hyp.tokens)?,
                tokens: hyp.tokens,
                score: hyp.score,
            });
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// Translates raw text lines.
pub fn translate_lines(
    model: &Seq2Seq,
    tokenizer: &Tokenizer,
    lines: &[String],
    beam: &BeamConfig,
    device: &Device,
) -> Result<Vec<Translation>> {
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let ids = tokenizer.encode_batch(&refs)?;
    translate_ids(model, tokenizer, &ids, beam, device)
}

/// Translates lines as a user gives them: a blank line translates to a blank line (a model would
/// otherwise invent a sentence for it), and a line that cannot be read (`Err`, e.g. not UTF-8)
/// or is longer than the model's `max_seq_len` positions gets an `Err` saying why, while every
/// other line is still translated.
pub fn translate_source_lines(
    model: &Seq2Seq,
    tokenizer: &Tokenizer,
    lines: &[Result<String, String>],
    max_seq_len: usize,
    beam: &BeamConfig,
    device: &Device,
) -> Result<Vec<Result<Translation, String>>> {
    let blank = Translation {
        text: String::new(),
        tokens: vec![],
        score: 0.0,
    };
    let mut out: Vec<Result<Translation, String>> = Vec::with_capacity(lines.len());
    let mut todo: Vec<(usize, Vec<u32>)> = vec![];
    for (i, line) in lines.iter().enumerate() {
        match line {
            Err(reason) => out.push(Err(reason.clone())),
            Ok(text) if text.trim().is_empty() => out.push(Ok(blank.clone())),
            Ok(text) => {
                let ids = tokenizer.encode(text)?;
                if ids.len() > max_seq_len {
                    out.push(Err(format!(
                        "the line has {} tokens, more than the model's max_seq_len = {max_seq_len}; \
                         split it into shorter sentences",
                        ids.len()
                    )));
                } else {
                    out.push(Ok(blank.clone()));
                    todo.push((i, ids));
                }
            }
        }
    }
    let sources: Vec<Vec<u32>> = todo.iter().map(|(_, ids)| ids.clone()).collect();
    let translated = translate_ids(model, tokenizer, &sources, beam, device)?;
    for ((i, _), t) in todo.into_iter().zip(translated) {
        out[i] = Ok(t);
    }
    Ok(out)
}

/// BLEU and chrF of a decoded split against its references.
#[derive(Debug, Clone, Serialize)]
pub struct SplitScores {
    pub bleu: BleuScore,
    pub chrf: ChrfScore,
    pub sentences: usize,
    pub secs: f64,
    #[serde(skip)]
    pub hypotheses: Vec<String>,
}

/// Decodes the first `limit` (or all) sentences of `split` and scores them, sacreBLEU-default.
pub fn score_split(
    model: &Seq2Seq,
    tokenizer: &Tokenizer,
    split: &PairSplit,
    beam: &BeamConfig,
    limit: Option<usize>,
    device: &Device,
) -> Result<SplitScores> {
    let n = limit.unwrap_or(usize::MAX).min(split.examples.len());
    let sources: Vec<Vec<u32>> = split.examples[..n].iter().map(|e| e.source.clone()).collect();
    let t0 = std::time::Instant::now();
    let hyps: Vec<String> = translate_ids(model, tokenizer, &sources, beam, device)?
        .into_iter()
        .map(|t| t.text)
        .collect();
    let secs = t0.elapsed().as_secs_f64();
    let refs = [split.references[..n].to_vec()];
    Ok(SplitScores {
        bleu: corpus_bleu(&hyps, &refs, &BleuConfig::default())?,
        chrf: corpus_chrf(&hyps, &refs, &ChrfConfig::default())?,
        sentences: n,
        secs,
        hypotheses: hyps,
    })
}
