//! Decoding with a trained model: translating token-id sources in batches, scoring the output
//! against references with sacreBLEU-exact BLEU and chrF, and sampling from language models.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use ember_data::{PairSplit, Tokenizer};
use ember_model::{beam_search_finished, greedy, rank, BeamConfig, Hypothesis, LengthPenalty, Seq2Seq};
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
    decode_finished(model, tokenizer, sources, beam, device)?
        .into_iter()
        .map(|finished| best_translation(tokenizer, finished, beam.length_penalty))
        .collect()
}

/// The best of a sentence's finished hypotheses under `penalty`, as text.
fn best_translation(
    tokenizer: &Tokenizer,
    finished: Vec<Hypothesis>,
    penalty: LengthPenalty,
) -> Result<Translation> {
    let Some(hyp) = rank(finished, penalty, 1).pop() else {
        bail!("a sentence ended without a hypothesis");
    };
    Ok(Translation {
        text: tokenizer.decode(&hyp.tokens)?,
        tokens: hyp.tokens,
        score: hyp.score,
    })
}

/// Every finished hypothesis of each source (in the sources' order; for greedy search, the one),
/// to be ranked under any length penalty: the search does not depend on it.
pub fn decode_finished(
    model: &Seq2Seq,
    tokenizer: &Tokenizer,
    sources: &[Vec<u32>],
    beam: &BeamConfig,
    device: &Device,
) -> Result<Vec<Vec<Hypothesis>>> {
    let pad = tokenizer.pad_id();
    // Longest first: batches of similar lengths waste little on padding.
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sources[i].len()));
    let mut out: Vec<Vec<Hypothesis>> = vec![Vec::new(); sources.len()];
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
        let finished: Vec<Vec<Hypothesis>> = if beam.beam_size <= 1 {
            greedy(model, &src, Some(&src_mask), bos, eos, beam)?
                .into_iter()
                .map(|h| vec![h])
                .collect()
        } else {
            beam_search_finished(model, &src, Some(&src_mask), bos, eos, beam)?
        };
        if finished.len() != batch.len() {
            bail!(
                "decoding returned {} hypothesis lists for {} sentences",
                finished.len(),
                batch.len()
            );
        }
        for (&i, list) in batch.iter().zip(finished) {
            out[i] = list;
        }
    }
    Ok(out)
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
    /// The length penalty the hypotheses were ranked under.
    #[serde(serialize_with = "as_text")]
    pub length_penalty: LengthPenalty,
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
    let penalties = [beam.length_penalty];
    let bleu = BleuConfig::default();
    let mut scores = score_split_under(model, tokenizer, split, beam, &penalties, &bleu, limit, device)?;
    Ok(scores.remove(0))
}

/// [`score_split`] under each of `penalties` (in that order), from one search, with BLEU as
/// `bleu` says: what a study tunes its length penalty with. Each result's `secs` is the one
/// search's time.
#[allow(clippy::too_many_arguments)]
pub fn score_split_under(
    model: &Seq2Seq,
    tokenizer: &Tokenizer,
    split: &PairSplit,
    beam: &BeamConfig,
    penalties: &[LengthPenalty],
    bleu: &BleuConfig,
    limit: Option<usize>,
    device: &Device,
) -> Result<Vec<SplitScores>> {
    let n = limit.unwrap_or(usize::MAX).min(split.examples.len());
    let sources: Vec<Vec<u32>> = split.examples[..n].iter().map(|e| e.source.clone()).collect();
    let t0 = std::time::Instant::now();
    let finished = decode_finished(model, tokenizer, &sources, beam, device)?;
    let secs = t0.elapsed().as_secs_f64();
    let refs = [split.references[..n].to_vec()];
    penalties
        .iter()
        .map(|&penalty| {
            let hyps: Vec<String> = finished
                .iter()
                .map(|list| Ok(best_translation(tokenizer, list.clone(), penalty)?.text))
                .collect::<Result<_>>()?;
            Ok(SplitScores {
                bleu: corpus_bleu(&hyps, &refs, bleu)?,
                chrf: corpus_chrf(&hyps, &refs, &ChrfConfig::default())?,
                length_penalty: penalty,
                sentences: n,
                secs,
                hypotheses: hyps,
            })
        })
        .collect()
}

/// A length penalty in JSON: its `gnmt:0.6` form.
fn as_text<S: serde::Serializer>(penalty: &LengthPenalty, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(penalty)
}
