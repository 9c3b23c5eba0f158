//! The bookkeeping of a training run, and the decisions that follow from it.
//!
//! The loop does the work (batches, forward and backward, the update, evaluation, writing);
//! [`RunState`] keeps the counts and says what they mean: which steps log, evaluate or
//! checkpoint, whether an evaluation is a new best or shows divergence, and what a checkpoint's
//! `state.json` and the final [`Summary`] hold. All of it is restored from a checkpoint, so a
//! resumed run decides exactly as an uninterrupted one would.

use std::path::Path;

use ember_data::Cursor;
use ember_model::AttentionStats;

use crate::checkpoint::{self, Best, CheckpointState, LogWindow};
use crate::config::{KeepBestBy, RunConfig};
use crate::eval::evaluate::{EvalResult, Validation};
use crate::metrics::{EvalRecord, TrainRecord};
use crate::output::summary::Summary;
use crate::update::Settled;

/// Skipped steps before the skipped fraction can end a run as diverged.
const MIN_SKIPPED_TO_JUDGE: u64 = 10;

/// Counters and decisions of one training run.
pub struct RunState {
    counters: Counters,
    /// Sums since the last training record.
    window: LogWindow,
    stats: RunStats,
    cadence: Cadence,
    /// The step the run was resumed after, if it was.
    resumed_from_step: Option<u64>,
    /// The step this invocation started from, for `stop_after`.
    start_step: u64,
    /// Why the run stops early as diverged.
    diverged: Option<String>,
    /// The stop signal that ended this invocation early.
    interrupted: Option<String>,
}

/// Counters that a checkpoint carries besides weights, moments and the data cursor.
#[derive(Debug, Clone, Default)]
struct Counters {
    step: u64,
    best: Option<Best>,
    skipped: u64,
    tokens_seen: u64,
    train_secs: f64,
    initial_val_loss: Option<f64>,
    evals_above_initial: u32,
    spiked_since_eval: bool,
}

/// A training loss above this multiple of the initial validation loss counts as divergence at
/// the next evaluation even when the validation loss is back down: a run whose logits exploded
/// often ends as a dead model predicting the uniform distribution, whose loss (ln V) sits just
/// below a fresh model's, so the validation loss alone would call it healthy. Ten times ln V is
/// far beyond any loss a learning run has (a fresh model starts near 1× and falls).
pub const SPIKE_FACTOR: f64 = 10.0;

impl Counters {
    fn from_state(s: &CheckpointState) -> Self {
        Self {
            step: s.step,
            best: s.best,
            skipped: s.skipped_steps,
            tokens_seen: s.tokens_seen,
            train_secs: s.elapsed_secs,
            initial_val_loss: s.initial_val_loss,
            evals_above_initial: s.evals_above_initial,
            spiked_since_eval: s.spiked_since_eval,
        }
    }
}

/// What this invocation observed, for the summary.
#[derive(Default)]
struct RunStats {
    rates: Vec<f64>,
    last_train_loss: Option<f64>,
    last_eval: Option<EvalResult>,
}

/// When things happen, from the config.
struct Cadence {
    total_steps: u64,
    log_every: u64,
    eval_every: u64,
    checkpoint_every: u64,
    divergence_evals: Option<u32>,
    max_skipped_fraction: f64,
    keep_best_by: KeepBestBy,
    /// Stop (with a checkpoint) after this many steps of this invocation.
    stop_after: Option<u64>,
}

impl RunState {
    /// The state of a fresh run, or of one continuing from the checkpoint state `resumed`.
    pub fn new(
        cfg: &RunConfig,
        total_steps: u64,
        resumed: Option<&CheckpointState>,
        stop_after: Option<u64>,
    ) -> Self {
        let counters = resumed.map(Counters::from_state).unwrap_or_default();
        Self {
            start_step: counters.step,
            counters,
            window: resumed.map(|s| s.log_window.clone()).unwrap_or_default(),
            stats: RunStats::default(),
            cadence: Cadence {
                total_steps,
                log_every: cfg.train.log_every,
                eval_every: cfg.eval.every,
                checkpoint_every: cfg.checkpoint.every,
                divergence_evals: cfg.train.divergence_evals,
                max_skipped_fraction: cfg.train.max_skipped_fraction,
                keep_best_by: cfg.checkpoint.keep_best_by,
                stop_after,
            },
            resumed_from_step: resumed.map(|s| s.step),
            diverged: None,
            interrupted: None,
        }
    }

    /// Optimizer steps completed (counting skipped ones).
    pub fn step(&self) -> u64 {
        self.counters.step
    }

    pub fn resumed_from_step(&self) -> Option<u64> {
        self.resumed_from_step
    }

    /// Whether divergence detection still needs the validation loss at initialisation.
    pub fn needs_initial_val_loss(&self) -> bool {
        self.cadence.divergence_evals.is_some() && self.counters.initial_val_loss.is_none()
    }

    pub fn set_initial_val_loss(&mut self, loss: f64) {
        self.counters.initial_val_loss = Some(loss);
    }

    /// Whether this invocation has run the steps it was allowed (`stop_after`).
    pub fn stop_requested(&self) -> bool {
        let done = self.counters.step - self.start_step;
        self.cadence.stop_after.is_some_and(|n| done >= n)
    }

    /// Whether `step` (the one about to run) writes a training record.
    pub fn is_log_step(&self, step: u64) -> bool {
        step.is_multiple_of(self.cadence.log_every) || step == self.cadence.total_steps
    }

    /// Counts a step whose update was skipped; returns how many so far.
    pub fn skip_update(&mut self) -> u64 {
        self.counters.skipped += 1;
        self.counters.skipped
    }

    /// Completes a step of `tokens` target tokens that took `secs`. `judged`: its losses per
    /// token and gradient norm when the host judged it (they join the logging window now;
    /// non-finite values stay out of its sums, so one bad step does not turn a whole record into
    /// NaN); `None` when the device did, whose sums join at the next [`settle`](Self::settle).
    pub fn record(&mut self, tokens: usize, secs: f64, judged: Option<(f64, f64, f64)>) {
        let (c, w) = (&mut self.counters, &mut self.window);
        c.step += 1;
        c.train_secs += secs;
        c.tokens_seen += tokens as u64;
        w.steps += 1;
        w.secs += secs;
        let Some((loss, nll, grad_norm)) = judged else {
            return;
        };
        if let Some(initial) = c.initial_val_loss {
            // A NaN loss counts as a spike too.
            c.spiked_since_eval |= loss.is_nan() || loss > SPIKE_FACTOR * initial;
        }
        if loss.is_finite() {
            w.loss += loss * tokens as f64;
            w.nll += nll * tokens as f64;
            w.tokens += tokens;
        }
        w.grad_norm += if grad_norm.is_finite() { grad_norm } else { 0.0 };
    }

    /// A training loss per token above which a step counts as a spike (see [`SPIKE_FACTOR`]);
    /// `None` before the initial validation loss is known.
    pub fn spike_loss(&self) -> Option<f64> {
        self.counters
            .initial_val_loss
            .map(|initial| SPIKE_FACTOR * initial)
    }

    /// Takes in what the device judged since the last settle: the window's sums, the skipped
    /// steps and a spike.
    pub fn settle(&mut self, s: &Settled) {
        let (c, w) = (&mut self.counters, &mut self.window);
        w.loss += s.loss_sum;
        w.nll += s.nll_sum;
        w.tokens += s.tokens as usize;
        w.grad_norm += s.grad_norm_sum;
        c.skipped = s.skipped_total;
        c.spiked_since_eval |= s.spiked;
    }

    /// Closes the logging window into the training record of the step just recorded.
    pub fn train_record(&mut self, epoch: u64, lr: f64, attention: &[AttentionStats]) -> TrainRecord {
        let w = std::mem::take(&mut self.window);
        // A window whose every step was skipped has no loss to report: NaN (null in the JSON),
        // not the 0 an empty sum would give.
        let (loss, nll) = if w.tokens == 0 {
            (f64::NAN, f64::NAN)
        } else {
            (w.loss / w.tokens as f64, w.nll / w.tokens as f64)
        };
        let rate = w.tokens as f64 / w.secs.max(1e-9);
        self.stats.rates.push(rate);
        self.stats.last_train_loss = loss.is_finite().then_some(loss);
        TrainRecord {
            step: self.counters.step,
            epoch,
            loss,
            nll,
            lr,
            grad_norm: w.grad_norm / w.steps.max(1) as f64,
            tokens_per_sec: rate,
            elapsed_secs: self.counters.train_secs,
            skipped_steps: self.counters.skipped,
            attn_max_logit: attention.iter().map(|a| a.max_logit).collect(),
            attn_entropy: attention.iter().map(|a| a.entropy).collect(),
        }
    }

    /// Whether the step just recorded is validated: every `eval.every` steps and at the end.
    pub fn is_eval_step(&self) -> bool {
        let step = self.counters.step;
        step == self.cadence.total_steps
            || (self.cadence.eval_every > 0 && step.is_multiple_of(self.cadence.eval_every))
    }

    /// Takes in the validation of the step just recorded — is it a new best, does it show
    /// divergence — and returns its metrics record.
    pub fn record_eval(&mut self, v: &Validation) -> EvalRecord {
        let (c, r) = (&mut self.counters, v.result);
        self.stats.last_eval = Some(r);
        if !r.loss.is_finite() {
            // The model's outputs overflow: no later step can recover from that.
            self.diverged = Some(format!(
                "step {}: the validation loss is {} (the model's outputs are not finite)",
                c.step, r.loss
            ));
        }
        if let (Some(limit), Some(initial)) = (self.cadence.divergence_evals, c.initial_val_loss) {
            // NaN compares false, so a NaN validation loss also counts as "above".
            let healthy = r.loss <= initial && !c.spiked_since_eval;
            c.evals_above_initial = if healthy { 0 } else { c.evals_above_initial + 1 };
            if c.evals_above_initial >= limit && self.diverged.is_none() {
                self.diverged = Some(format!(
                    "step {}: for {limit} evaluation(s) the validation loss (now {:.4}) has been \
                     above its initial value {initial:.4} or a training loss above {SPIKE_FACTOR}× it",
                    c.step, r.loss
                ));
            }
        }
        c.spiked_since_eval = false;
        let better = match (self.cadence.keep_best_by, c.best) {
            (_, None) => r.loss.is_finite(),
            (KeepBestBy::Loss, Some(b)) => r.loss < b.val_loss,
            (KeepBestBy::Bleu, Some(b)) => v.bleu > b.bleu,
        };
        if better {
            c.best = Some(Best {
                step: c.step,
                val_loss: r.loss,
                bleu: v.bleu,
            });
        }
        EvalRecord {
            step: c.step,
            split: "valid".into(),
            loss: r.loss,
            ppl: r.ppl,
            tokens: r.tokens,
            elapsed_secs: c.train_secs,
            bleu: v.bleu,
        }
    }

    /// Whether to checkpoint after the step just recorded: at a new best (so that it can be
    /// kept), at the end, when stopping as diverged, and every `checkpoint.every` steps.
    pub fn checkpoint_due(&self) -> bool {
        let step = self.counters.step;
        let every = self.cadence.checkpoint_every;
        self.best_step() == Some(step)
            || step == self.cadence.total_steps
            || self.diverged.is_some()
            || (every > 0 && step.is_multiple_of(every))
    }

    /// The step of the best validation so far, whose checkpoint pruning keeps.
    pub fn best_step(&self) -> Option<u64> {
        self.counters.best.map(|b| b.step)
    }

    /// Why the run stops early as diverged, if it does.
    pub fn diverged(&self) -> Option<&str> {
        self.diverged.as_deref()
    }

    /// With `train.on_nonfinite: skip`: stops the run as diverged once more than
    /// `train.max_skipped_fraction` of its steps so far were skipped (judged from the 10th
    /// skipped step on, so that a few early skips do not end a run).
    pub fn check_skipped(&mut self) {
        let (skipped, step) = (self.counters.skipped, self.counters.step);
        if self.diverged.is_none()
            && skipped >= MIN_SKIPPED_TO_JUDGE
            && skipped as f64 > self.cadence.max_skipped_fraction * step as f64
        {
            self.diverged = Some(format!(
                "step {step}: {skipped} of {step} steps were skipped for non-finite values, more than \
                 train.max_skipped_fraction = {}; the weights have hardly trained. Lower train.lr",
                self.cadence.max_skipped_fraction
            ));
        }
    }

    /// Marks this invocation as ended by a stop signal (it resumes with `--resume`).
    pub fn mark_interrupted(&mut self, signal: String) {
        self.interrupted = Some(signal);
    }

    /// Marks the run as stopped early as diverged by a non-finite step (`train.on_nonfinite: stop`).
    pub fn mark_diverged(&mut self, reason: String) {
        self.diverged = Some(reason);
    }

    /// `state.json` for a checkpoint of the step just recorded.
    pub fn checkpoint_state(&self, cfg: &RunConfig, cursor: Cursor, optimizer_step: u64) -> CheckpointState {
        let c = &self.counters;
        CheckpointState {
            format: 1,
            step: c.step,
            cursor,
            optimizer_step,
            seed: cfg.train.seed,
            best: c.best,
            initial_val_loss: c.initial_val_loss,
            evals_above_initial: c.evals_above_initial,
            spiked_since_eval: c.spiked_since_eval,
            log_window: self.window.clone(),
            skipped_steps: c.skipped,
            tokens_seen: c.tokens_seen,
            elapsed_secs: c.train_secs,
            model_config_hash: checkpoint::model_config_hash(&cfg.model),
            model_config: cfg.model.clone(),
            tokenizer_sha256: None,
            data_fingerprint: None,
            shares: None,
            vector_units: vec![],
            files: Default::default(),
        }
    }

    /// What the run reports as it ends.
    pub fn summary(&self, run_dir: &Path, params: usize, wall_secs: f64) -> Summary {
        let c = &self.counters;
        let mut rates = self.stats.rates.clone();
        rates.sort_by(|a, b| a.total_cmp(b));
        Summary {
            run_dir: run_dir.to_path_buf(),
            steps: c.step,
            total_steps: self.cadence.total_steps,
            finished: c.step == self.cadence.total_steps && self.diverged.is_none(),
            interrupted: self.interrupted.clone(),
            params,
            final_train_loss: self.stats.last_train_loss,
            val_loss: self.stats.last_eval.map(|e| e.loss),
            val_ppl: self.stats.last_eval.map(|e| e.ppl),
            best: c.best,
            skipped_steps: c.skipped,
            tokens_per_sec: rates.get(rates.len() / 2).copied().unwrap_or(0.0),
            wall_secs,
            train_secs: c.train_secs,
            resumed_from_step: self.resumed_from_step,
            diverged: self.diverged.clone(),
            world_size: None,
            weights_sha256: None,
        }
    }
}
