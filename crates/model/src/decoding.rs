//! Decoding: greedy and beam search for translation models, sampling for language models.
//!
//! Search is batched: every live hypothesis of every sentence is one row of the decoder batch,
//! and all rows advance through one [`Seq2Seq::decode_step`] per time step. Between steps the
//! KV cache and the encoder memory follow the surviving hypotheses through
//! [`DecoderCache::select`] and [`Memory::select`], which also expands each source to its beam
//! after the first step and drops sentences as soon as they are finished. A step then runs
//! the decoder on one new position per row, whose attention alone reads the `t` cached
//! positions, instead of a full pass over the prefix: decoding time grows about linearly with
//! the output length, not quadratically. `use_cache: false` re-runs the decoder over the whole
//! prefix at every step, as a baseline and a cross-check.
//!
//! Logits come to the host once per step: the log-softmax and top-k of B·beam rows of a
//! 10k-word vocabulary are cheap next to the decoder itself, and host code keeps the
//! bookkeeping (finished lists, length constraints, tie-breaking) simple and exactly
//! reproducible on every device.
//!
//! ## Beam search, as in fairseq
//!
//! At step `t` (hypotheses of `t` tokens after BOS), each sentence takes its `2·k` best
//! continuations over all its live hypotheses, ranked by cumulative log-probability. An EOS
//! continuation among the first `k` finishes a hypothesis, scored with the length penalty
//! ([`LengthPenalty`]: GNMT's `logprob / ((5 + len) / 6)^α` by default, or fairseq's
//! `logprob / len^p`), `len` counting the EOS. The first `k`
//! non-EOS continuations form the next beam (taking `2·k` candidates guarantees `k` of them,
//! since each live hypothesis contributes at most one EOS).
//!
//! **Stopping rule.** A sentence is done as soon as it holds `k` finished hypotheses, or at its
//! maximum length `max_len = ⌊max_len_a · src_len + max_len_b⌋` (EOS excluded; `src_len` counts
//! the sentence's real tokens), where EOS is forced on every live hypothesis. EOS is suppressed
//! before `min_len` tokens (the maximum length wins if `min_len` exceeds it). Its n-best list is
//! its best `n_best` finished hypotheses by score. With `k = 1` this is exactly greedy search.
//! Which hypotheses finish depends on log-probabilities alone, never on the length penalty, so
//! [`beam_search_finished`] returns them all and [`rank`] orders them for any penalty: one
//! search, every penalty (how a study tunes α on its validation set at the cost of one decode).
//! Like fairseq's, the rule does not prove that no live hypothesis could still overtake the
//! finished ones; it stops where the beam itself says the search is over, which keeps
//! decoding time proportional to the output length.
//!
//! Forced and suppressed tokens change what may be chosen, never the log-probabilities: a
//! hypothesis's `logprob` is always the model's own, so rescoring it with a teacher-forced
//! forward pass gives the same number.

use candle_core::{bail, DType, Device, Result, Tensor};

use crate::block::Memory;
use crate::layers::ForwardCtx;
use crate::length_penalty::LengthPenalty;
use crate::transformer::{DecoderCache, LanguageModel, Seq2Seq};
use ember_rng::SplitMix64;

/// Settings of greedy and beam search.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamConfig {
    /// Hypotheses kept per sentence (`k`). Greedy search ignores it.
    pub beam_size: usize,
    /// How finished hypotheses of different lengths are ranked (GNMT's α or fairseq's p). 0
    /// ranks by raw log-probability (which favours short outputs); larger values favour longer
    /// ones.
    pub length_penalty: LengthPenalty,
    /// Maximum output length (tokens, EOS excluded) is `⌊max_len_a · src_len + max_len_b⌋`,
    /// with `src_len` the real (unpadded) length of each source.
    pub max_len_a: f64,
    pub max_len_b: usize,
    /// EOS is not allowed before this many tokens.
    pub min_len: usize,
    /// Hypotheses returned per sentence, best first; at most `beam_size`. Greedy ignores it.
    pub n_best: usize,
    /// Decode incrementally with the KV cache (O(t) per step). `false` re-runs the decoder over
    /// the whole prefix at every step (O(t²) per step): the same tokens, only slower.
    pub use_cache: bool,
    /// The model's `max_seq_len`, when known: the decoder then never sees more positions than
    /// its rotary table covers, by capping the output length at `max_seq_len − 1` (BOS takes
    /// one position). `None`: no cap, and an output that would run past the table fails with
    /// the model's error.
    pub max_seq_len: Option<usize>,
}

impl Default for BeamConfig {
    /// Beam 5, α = 0.6 (GNMT's and tensor2tensor's default for this penalty), outputs of at
    /// most 1.2 · source + 10 tokens, one hypothesis per sentence, with the KV cache.
    fn default() -> Self {
        Self {
            beam_size: 5,
            length_penalty: LengthPenalty::Gnmt(0.6),
            max_len_a: 1.2,
            max_len_b: 10,
            min_len: 0,
            n_best: 1,
            use_cache: true,
            max_seq_len: None,
        }
    }
}

impl BeamConfig {
    /// Greedy search's settings: beam 1, otherwise the defaults.
    pub fn greedy() -> Self {
        Self {
            beam_size: 1,
            ..Self::default()
        }
    }

    fn validate(&self) -> Result<()> {
        if self.beam_size == 0 {
            bail!("beam_size must be at least 1");
        }
        if self.n_best == 0 || self.n_best > self.beam_size {
            bail!(
                "n_best must be between 1 and beam_size = {}, got {}",
                self.beam_size,
                self.n_best
            );
        }
        if let Err(e) = self.length_penalty.check() {
            bail!("{e}");
        }
        if !(self.max_len_a.is_finite() && self.max_len_a >= 0.0) {
            bail!("max_len_a must be a non-negative number, got {}", self.max_len_a);
        }
        if self.max_seq_len == Some(0) {
            bail!("max_seq_len must be at least 1");
        }
        Ok(())
    }

    /// Longest output (tokens, EOS excluded) for a source of `src_len` real tokens.
    pub fn max_len(&self, src_len: usize) -> usize {
        let len = (self.max_len_a * src_len as f64).floor() as usize + self.max_len_b;
        match self.max_seq_len {
            Some(positions) => len.min(positions.saturating_sub(1)),
            None => len,
        }
    }

    /// The length-penalised score of a finished hypothesis of `tokens` tokens plus EOS.
    pub fn score(&self, logprob: f64, tokens: usize) -> f64 {
        self.length_penalty.score(logprob, tokens)
    }
}

/// One finished output.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    /// Output tokens, without BOS and without the final EOS.
    pub tokens: Vec<u32>,
    /// `logprob` with the length penalty applied: what hypotheses are ranked by.
    pub score: f64,
    /// Sum of the model's log-probabilities of the tokens and the final EOS.
    pub logprob: f64,
}

/// One live hypothesis: a row of the decoder batch.
#[derive(Clone)]
struct Row {
    sent: usize,
    tokens: Vec<u32>,
    logprob: f64,
}

/// Greedy search: the most probable token at every step, until EOS or the maximum length.
/// Returns one hypothesis per sentence of `src` (B, S); `src_mask` (B, S) is 1 at real tokens.
/// Uses the length, `min_len`, `use_cache` and `max_seq_len` settings of `cfg` (the score is
/// length-penalised with its α); `beam_size` and `n_best` are ignored.
pub fn greedy(
    model: &Seq2Seq,
    src: &Tensor,
    src_mask: Option<&Tensor>,
    bos: u32,
    eos: u32,
    cfg: &BeamConfig,
) -> Result<Vec<Hypothesis>> {
    let cfg = BeamConfig {
        beam_size: 1,
        n_best: 1,
        ..cfg.clone()
    };
    // With a beam of one, beam search's stopping rule takes the most probable token at every
    // step and stops at the first EOS: it is greedy search, so greedy search is that.
    beam_search(model, src, src_mask, bos, eos, &cfg)?
        .into_iter()
        .map(|n_best| {
            n_best
                .into_iter()
                .next()
                .ok_or_else(|| candle_core::Error::Msg("a sentence ended without a hypothesis".into()))
        })
        .collect()
}

/// Beam search (see the module documentation for the stopping rule). Returns, per sentence of
/// `src` (B, S), its `n_best` hypotheses, best first; `src_mask` (B, S) is 1 at real tokens.
/// Sentences of different lengths decode exactly as they would alone.
pub fn beam_search(
    model: &Seq2Seq,
    src: &Tensor,
    src_mask: Option<&Tensor>,
    bos: u32,
    eos: u32,
    cfg: &BeamConfig,
) -> Result<Vec<Vec<Hypothesis>>> {
    Ok(beam_search_finished(model, src, src_mask, bos, eos, cfg)?
        .into_iter()
        .map(|list| rank(list, cfg.length_penalty, cfg.n_best))
        .collect())
}

/// The `n` best of a sentence's finished hypotheses (as [`beam_search_finished`] returns them)
/// under `penalty`, best first, each scored with it. Equal scores keep the order in which the
/// hypotheses finished, as [`beam_search`] does.
pub fn rank(finished: Vec<Hypothesis>, penalty: LengthPenalty, n: usize) -> Vec<Hypothesis> {
    let mut list: Vec<Hypothesis> = finished
        .into_iter()
        .map(|h| Hypothesis {
            score: penalty.score(h.logprob, h.tokens.len()),
            ..h
        })
        .collect();
    // Stable: equal scores keep the order in which they finished.
    list.sort_by(|a, b| b.score.total_cmp(&a.score));
    list.truncate(n);
    list
}

/// Beam search's every finished hypothesis per sentence, in the order they finished (scored
/// with `cfg`'s length penalty, which does not change which ones finish). [`rank`] with any
/// penalty then gives exactly what [`beam_search`] with that penalty returns.
pub fn beam_search_finished(
    model: &Seq2Seq,
    src: &Tensor,
    src_mask: Option<&Tensor>,
    bos: u32,
    eos: u32,
    cfg: &BeamConfig,
) -> Result<Vec<Vec<Hypothesis>>> {
    cfg.validate()?;
    let k = cfg.beam_size;
    let Some((memory, src_lens)) = encode(model, src, src_mask)? else {
        return Ok(Vec::new());
    };
    let max_lens: Vec<usize> = src_lens.iter().map(|&l| cfg.max_len(l)).collect();
    let mut finished: Vec<Vec<Hypothesis>> = vec![Vec::new(); src_lens.len()];
    // Every beam starts as a single row: its k copies would all propose the same tokens.
    let mut rows: Vec<Row> = (0..src_lens.len()).map(Row::start).collect();
    let mut stepper = Stepper::new(model, memory, cfg.use_cache);
    let mut step = 0;
    while !rows.is_empty() {
        let (mut lp, vocab) = stepper.log_probs(bos, &rows)?;
        check_ids(bos, eos, vocab)?;
        constrain(&mut lp, vocab, &rows, step, eos, cfg.min_len, &max_lens);
        let mut next = Vec::with_capacity(rows.len());
        let mut parents = Vec::with_capacity(rows.len());
        // Rows of one sentence are contiguous: they are pushed sentence by sentence.
        let mut start = 0;
        while start < rows.len() {
            let sent = rows[start].sent;
            let end = start + rows[start..].iter().take_while(|r| r.sent == sent).count();
            let mut candidates: Vec<(f64, usize, u32)> = Vec::with_capacity((end - start) * 2 * k);
            for (r, row) in rows.iter().enumerate().take(end).skip(start) {
                for (token, value) in top_m(&lp[r * vocab..(r + 1) * vocab], 2 * k) {
                    candidates.push((row.logprob + value as f64, r, token));
                }
            }
            candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            candidates.truncate(2 * k);
            let before = next.len();
            for (rank, &(logprob, r, token)) in candidates.iter().enumerate() {
                let row = &rows[r];
                if token == eos {
                    // An EOS outside the top k is not finished: fairseq's rule, which makes
                    // beam 1 pick exactly what greedy picks.
                    if rank < k {
                        finished[sent].push(Hypothesis {
                            score: cfg.score(logprob, row.tokens.len()),
                            tokens: row.tokens.clone(),
                            logprob,
                        });
                    }
                } else if next.len() - before < k {
                    next.push(row.extend(token, logprob));
                    parents.push(r as u32);
                }
            }
            if finished[sent].len() >= k {
                next.truncate(before);
                parents.truncate(before);
            }
            start = end;
        }
        stepper.select(&parents)?;
        rows = next;
        step += 1;
    }
    Ok(finished)
}

impl Row {
    fn start(sent: usize) -> Self {
        Self {
            sent,
            tokens: Vec::new(),
            logprob: 0.0,
        }
    }
    fn extend(&self, token: u32, logprob: f64) -> Self {
        let mut tokens = Vec::with_capacity(self.tokens.len() + 1);
        tokens.extend_from_slice(&self.tokens);
        tokens.push(token);
        Self {
            sent: self.sent,
            tokens,
            logprob,
        }
    }
}

/// Encodes the source and counts each sentence's real tokens; `None` for a batch of no sentences.
fn encode(model: &Seq2Seq, src: &Tensor, src_mask: Option<&Tensor>) -> Result<Option<(Memory, Vec<usize>)>> {
    let (b, s) = src.dims2().map_err(|_| {
        candle_core::Error::Msg(format!(
            "the source must be token ids of shape (batch, length), got {:?}",
            src.dims()
        ))
    })?;
    if let Some(mask) = src_mask {
        if mask.dims() != [b, s] {
            bail!(
                "the source mask has shape {:?}, the source {:?}",
                mask.dims(),
                src.dims()
            );
        }
    }
    if b == 0 {
        return Ok(None);
    }
    let lens = match src_mask {
        Some(mask) => mask
            .to_dtype(DType::F32)?
            .ne(0f64)?
            .to_dtype(DType::F32)?
            .sum(1)?
            .to_vec1::<f32>()?
            .into_iter()
            .map(|l| l as usize)
            .collect(),
        None => vec![s; b],
    };
    if s == 0 {
        // Attention over zero keys is undefined; one masked-out position is the same empty
        // source in a shape every op accepts (fully masked attention stays finite).
        let one = Tensor::zeros((b, 1), DType::U32, src.device())?;
        let memory = model.encode(&one, Some(&one), ForwardCtx::eval())?;
        return Ok(Some((detached(memory), lens)));
    }
    let memory = model.encode(src, src_mask, ForwardCtx::eval())?;
    Ok(Some((detached(memory), lens)))
}

/// The memory off the autograd graph. The model's weights are variables, so its outputs record
/// the ops that made them; every `select` of a recorded tensor would keep its predecessor (and
/// the whole encoder pass) alive until decoding ends.
fn detached(memory: Memory) -> Memory {
    Memory {
        hidden: memory.hidden.detach(),
        mask: memory.mask.map(|m| m.detach()),
    }
}

fn check_ids(bos: u32, eos: u32, vocab: usize) -> Result<()> {
    for (name, id) in [("bos", bos), ("eos", eos)] {
        if id as usize >= vocab {
            bail!("{name} = {id} is not in the model's vocabulary of {vocab}");
        }
    }
    Ok(())
}

/// Applies the length constraints to the log-probabilities (rows × vocab) of step `step`:
/// EOS is suppressed before `min_len`, and is the only choice at a sentence's maximum length.
fn constrain(
    lp: &mut [f32],
    vocab: usize,
    rows: &[Row],
    step: usize,
    eos: u32,
    min_len: usize,
    max_lens: &[usize],
) {
    let eos = eos as usize;
    for (row, lp) in rows.iter().zip(lp.chunks_mut(vocab)) {
        if step >= max_lens[row.sent] {
            let keep = lp[eos];
            lp.fill(f32::NEG_INFINITY);
            lp[eos] = keep;
        } else if step < min_len {
            lp[eos] = f32::NEG_INFINITY;
        }
    }
}

/// Runs the decoder one position further for a batch of hypotheses, with or without the cache.
struct Stepper<'a> {
    model: &'a Seq2Seq,
    memory: Memory,
    /// `None` re-runs the decoder over every prefix.
    cache: Option<DecoderCache>,
    device: Device,
}

impl<'a> Stepper<'a> {
    fn new(model: &'a Seq2Seq, memory: Memory, use_cache: bool) -> Self {
        let device = memory.hidden.device().clone();
        Self {
            model,
            memory,
            cache: use_cache.then(DecoderCache::default),
            device,
        }
    }

    /// Log-probabilities of the next token after each row's `BOS + tokens`, on the host:
    /// (rows × vocab, row-major) and the vocabulary size.
    fn log_probs(&mut self, bos: u32, rows: &[Row]) -> Result<(Vec<f32>, usize)> {
        let n = rows.len();
        let logits = match &mut self.cache {
            Some(cache) => {
                let last: Vec<u32> = rows
                    .iter()
                    .map(|r| r.tokens.last().copied().unwrap_or(bos))
                    .collect();
                let input = Tensor::from_vec(last, (n, 1), &self.device)?;
                self.model
                    .decode_step(&input, &self.memory, cache, ForwardCtx::eval())?
            }
            None => {
                let t = rows[0].tokens.len() + 1;
                let ids: Vec<u32> = rows
                    .iter()
                    .flat_map(|r| std::iter::once(bos).chain(r.tokens.iter().copied()))
                    .collect();
                let input = Tensor::from_vec(ids, (n, t), &self.device)?;
                self.model
                    .decode(&input, &self.memory, ForwardCtx::eval())?
                    .narrow(1, t - 1, 1)?
            }
        };
        let vocab = logits.dim(2)?;
        let mut lp = logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        log_softmax_rows(&mut lp, vocab)?;
        Ok((lp, vocab))
    }

    /// Keeps rows `parents` (in that order) of the memory and the cache.
    fn select(&mut self, parents: &[u32]) -> Result<()> {
        let n = self.memory.hidden.dim(0)?;
        if parents.is_empty()
            || (parents.len() == n && parents.iter().enumerate().all(|(i, &p)| p as usize == i))
        {
            return Ok(());
        }
        let rows = Tensor::new(parents, &self.device)?;
        self.memory = self.memory.select(&rows)?;
        if let Some(cache) = &mut self.cache {
            cache.select(&rows)?;
        }
        Ok(())
    }
}

/// In-place log-softmax of each row of `x` (rows × `vocab`). Non-finite logits (a diverged
/// model) are an error rather than a NaN that would silently win or lose every comparison.
fn log_softmax_rows(x: &mut [f32], vocab: usize) -> Result<()> {
    for row in x.chunks_mut(vocab) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row.iter().map(|&v| (v - max).exp() as f64).sum();
        let lse = max as f64 + sum.ln();
        if !lse.is_finite() {
            bail!("the model produced non-finite logits");
        }
        for v in row.iter_mut() {
            *v = (*v as f64 - lse) as f32;
        }
    }
    Ok(())
}

/// The `m` largest finite entries of `row` as (index, value), largest first; among equal
/// values the lower index comes first, so that ties break the same way everywhere.
fn top_m(row: &[f32], m: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(m + 1);
    if m == 0 {
        return best;
    }
    for (i, &v) in row.iter().enumerate() {
        if !v.is_finite() || (best.len() == m && v <= best[m - 1].1) {
            continue;
        }
        let at = best.partition_point(|&(_, b)| b >= v);
        best.insert(at, (i as u32, v));
        best.truncate(m);
    }
    best
}

/// Settings of language-model sampling.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleConfig {
    /// Most tokens to generate.
    pub max_new_tokens: usize,
    /// Logits are divided by it before sampling; 0 takes the most probable token (greedy).
    pub temperature: f64,
    /// Sample only among the `k` most probable tokens.
    pub top_k: Option<usize>,
    /// Sample only among the most probable tokens whose probabilities (after temperature and
    /// top-k) add up to at least `p` (nucleus sampling, Holtzman et al. 2020); in (0, 1].
    pub top_p: Option<f64>,
    /// Seeds the sampling stream: the same seed, model and prompt give the same tokens.
    pub seed: u64,
    /// Generation stops when this token is drawn; it is not included in the output.
    pub stop_token: Option<u32>,
    /// The model's `max_seq_len`, when known: generation then stops once prompt + output
    /// reach it, so the output always fits the model's context. `None`: no cap, and running
    /// past the model's rotary table fails with the model's error.
    pub max_seq_len: Option<usize>,
    /// With `max_seq_len`: instead of stopping when the context is full, keep generating
    /// conditioned on the last `max_seq_len` tokens (nanoGPT's cropping), re-encoding that
    /// window at every step from then on.
    pub sliding_window: bool,
}

impl Default for SampleConfig {
    /// 200 tokens at temperature 1 from the full distribution, seed 0, no stop token.
    fn default() -> Self {
        Self {
            max_new_tokens: 200,
            temperature: 1.0,
            top_k: None,
            top_p: None,
            seed: 0,
            stop_token: None,
            max_seq_len: None,
            sliding_window: false,
        }
    }
}

impl SampleConfig {
    fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            bail!(
                "temperature must be a non-negative number, got {}",
                self.temperature
            );
        }
        if self.top_k == Some(0) {
            bail!("top_k must be at least 1");
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                bail!("top_p must be in (0, 1], got {p}");
            }
        }
        Ok(())
    }
}

/// Continues `prompt` with tokens sampled from `model` (on `device`), using the KV cache.
/// Returns the generated tokens only. The prompt must not be empty: start it with BOS to
/// generate from nothing.
pub fn sample(
    model: &LanguageModel,
    prompt: &[u32],
    device: &Device,
    cfg: &SampleConfig,
) -> Result<Vec<u32>> {
    cfg.validate()?;
    if prompt.is_empty() {
        bail!("the prompt is empty; start it with BOS to generate from nothing");
    }
    let window = cfg.max_seq_len.filter(|_| cfg.sliding_window);
    let budget = match (cfg.max_seq_len, window) {
        (Some(max), None) if prompt.len() > max => bail!(
            "the prompt has {} tokens, more than max_seq_len = {max}",
            prompt.len()
        ),
        (Some(max), None) => cfg.max_new_tokens.min(max - prompt.len()),
        _ => cfg.max_new_tokens,
    };
    let mut out = Vec::with_capacity(budget);
    if budget == 0 {
        return Ok(out);
    }
    let mut rng = SplitMix64::for_stream(cfg.seed, "sample");
    let mut cache = DecoderCache::default();
    // Every token so far; with a sliding window only its last `max_seq_len` are ever encoded.
    let mut context = prompt.to_vec();
    let first = match window {
        Some(max) => &prompt[prompt.len().saturating_sub(max)..],
        None => prompt,
    };
    let mut input = Tensor::new(first, device)?.unsqueeze(0)?;
    for i in 0..budget {
        if let Some(max) = window {
            if cache.len() + input.dim(1)? > max {
                // The context is full: positions restart at 0 over the newest `max` tokens.
                cache = DecoderCache::default();
                input = Tensor::new(&context[context.len() - max..], device)?.unsqueeze(0)?;
            }
        }
        let logits = model.forward_step(&input, &mut cache, ForwardCtx::eval())?;
        let t = logits.dim(1)?;
        let logits = logits
            .narrow(1, t - 1, 1)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let token = choose(&logits, cfg, &mut rng)?;
        if Some(token) == cfg.stop_token {
            break;
        }
        out.push(token);
        context.push(token);
        if i + 1 < budget {
            input = Tensor::new(&[[token]], device)?;
        }
    }
    Ok(out)
}

/// Draws the next token from `logits` under the temperature, top-k and top-p settings.
fn choose(logits: &[f32], cfg: &SampleConfig, rng: &mut SplitMix64) -> Result<u32> {
    if logits.iter().any(|v| !v.is_finite()) {
        bail!("the model produced non-finite logits");
    }
    if cfg.temperature == 0.0 {
        return Ok(top_m(logits, 1)[0].0);
    }
    // Candidates, most probable first (ties: lower id first, as in greedy), then the
    // filters, each of which keeps at least the most probable token.
    let mut candidates: Vec<(u32, f64)> = match cfg.top_k {
        Some(k) if k < logits.len() => top_m(logits, k).into_iter().map(|(i, v)| (i, v as f64)).collect(),
        _ => {
            let mut all: Vec<(u32, f64)> = logits
                .iter()
                .enumerate()
                .map(|(i, &v)| (i as u32, v as f64))
                .collect();
            if cfg.top_p.is_some() {
                all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            }
            all
        }
    };
    let max = candidates.iter().map(|c| c.1).fold(f64::NEG_INFINITY, f64::max);
    for c in candidates.iter_mut() {
        c.1 = ((c.1 - max) / cfg.temperature).exp();
    }
    if let Some(p) = cfg.top_p {
        let total: f64 = candidates.iter().map(|c| c.1).sum();
        let mut mass = 0.0;
        let keep = candidates
            .iter()
            .position(|c| {
                mass += c.1 / total;
                mass >= p
            })
            .map_or(candidates.len(), |i| i + 1);
        candidates.truncate(keep);
    }
    let total: f64 = candidates.iter().map(|c| c.1).sum();
    let mut u = rng.uniform() * total;
    for &(token, weight) in &candidates {
        if u < weight {
            return Ok(token);
        }
        u -= weight;
    }
    // Rounding left `u` just past the last weight.
    Ok(candidates.last().map_or(0, |c| c.0))
}
