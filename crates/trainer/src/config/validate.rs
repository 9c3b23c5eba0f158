//! Range and consistency checks that serde cannot express, one function per section; the first
//! failure is returned as (key path, message), which loading turns into an error at the key.

use super::{KeepBestBy, RunConfig, DEFAULT_CPU_SHARES};

/// A failed check: (key path, message).
pub type Invalid = (String, String);

pub(super) fn bad<T>(key: &str, message: String) -> Result<T, Invalid> {
    Err((key.to_string(), message))
}

impl RunConfig {
    /// Range and consistency checks that serde cannot express, section by section; the first
    /// failure is returned as (key path, message).
    pub fn validate(&self) -> Result<(), Invalid> {
        self.validate_length_and_schedule()?;
        self.validate_optimizer()?;
        self.validate_logging_and_threads()?;
        self.batching()?;
        self.validate_ablation()?;
        self.validate_eval_checkpoint_device()?;
        self.data.validate().map_err(|e| match e {
            ember_data::DataError::Config { key, message } => (key, message),
            other => ("data".to_string(), other.to_string()),
        })?;
        let mut model = self.model.clone();
        // The vocabulary comes from the tokenizer when left out; everything else must hold now.
        model.vocab_size.get_or_insert(2);
        model.validate().map_err(|e| (e.key.clone(), e.message.clone()))?;
        Ok(())
    }

    /// `train.steps`/`train.epochs` and the learning-rate schedule.
    fn validate_length_and_schedule(&self) -> Result<(), Invalid> {
        let t = &self.train;
        match (t.steps, t.epochs) {
            (None, None) => return bad("train.steps", "set train.steps or train.epochs".into()),
            (Some(_), Some(_)) => {
                return bad(
                    "train.epochs",
                    "set only one of train.steps and train.epochs".into(),
                )
            }
            (Some(0), _) => return bad("train.steps", "must be at least 1".into()),
            (_, Some(e)) if !(e > 0.0 && e.is_finite()) => {
                return bad("train.epochs", format!("must be a positive number, got {e}"))
            }
            _ => {}
        }
        if !(t.lr > 0.0 && t.lr.is_finite()) {
            return bad("train.lr", format!("must be a positive number, got {}", t.lr));
        }
        if !(t.min_lr >= 0.0 && t.min_lr <= t.lr) {
            return bad(
                "train.min_lr",
                format!("must be in [0, train.lr = {}], got {}", t.lr, t.min_lr),
            );
        }
        Ok(())
    }

    /// Accumulation, clipping, the loss's extras and AdamW's hyper-parameters.
    fn validate_optimizer(&self) -> Result<(), Invalid> {
        let t = &self.train;
        if t.accumulation == 0 {
            return bad("train.accumulation", "must be at least 1".into());
        }
        if t.accumulation > MAX_ACCUMULATION {
            // Each step holds its micro-batches at once: an absurd count would exhaust memory
            // before the first step, and no run needs more than a few hundred.
            return bad(
                "train.accumulation",
                format!("{} micro-batches per step is far more than any run needs; use at most {MAX_ACCUMULATION} (raise train.max_tokens or train.batch_size for bigger steps)", t.accumulation),
            );
        }
        if let Some(c) = t.clip_grad_norm {
            if !(c > 0.0 && c.is_finite()) {
                return bad(
                    "train.clip_grad_norm",
                    format!("must be positive (or null to disable), got {c}"),
                );
            }
        }
        if !(0.0..1.0).contains(&t.label_smoothing) {
            return bad(
                "train.label_smoothing",
                format!("must be in [0, 1), got {}", t.label_smoothing),
            );
        }
        if !(t.z_loss >= 0.0 && t.z_loss.is_finite()) {
            return bad("train.z_loss", format!("must be ≥ 0, got {}", t.z_loss));
        }
        if !(t.weight_decay >= 0.0 && t.weight_decay.is_finite()) {
            return bad(
                "train.weight_decay",
                format!("must be ≥ 0, got {}", t.weight_decay),
            );
        }
        for (k, b) in [("train.beta1", t.beta1), ("train.beta2", t.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(k, format!("must be in [0, 1), got {b}"));
            }
        }
        // Written so that NaN is rejected too.
        if t.adam_eps.is_nan() || t.adam_eps <= 0.0 {
            return bad("train.adam_eps", format!("must be positive, got {}", t.adam_eps));
        }
        if t.divergence_evals == Some(0) {
            return bad(
                "train.divergence_evals",
                "must be at least 1 (or null to disable)".into(),
            );
        }
        // Written so that NaN is refused too.
        if !(t.max_skipped_fraction > 0.0 && t.max_skipped_fraction <= 1.0) {
            return bad(
                "train.max_skipped_fraction",
                format!("must be in (0, 1], got {}", t.max_skipped_fraction),
            );
        }
        Ok(())
    }

    /// Logging cadence and the thread count.
    fn validate_logging_and_threads(&self) -> Result<(), Invalid> {
        let t = &self.train;
        if t.log_every == 0 {
            return bad("train.log_every", "must be at least 1".into());
        }
        if t.threads == Some(0) {
            return bad(
                "train.threads",
                "must be at least 1 (or left out for one per physical core)".into(),
            );
        }
        if let Some(shares) = t.shares.filter(|&s| s == 0 || s > MAX_THREADS) {
            return bad(
                "train.shares",
                format!(
                    "must be 1 to {MAX_THREADS} (1: each micro-batch whole; null: \
                     {DEFAULT_CPU_SHARES} on the CPU, 1 on a GPU), got {shares}"
                ),
            );
        }
        if let Some(n) = t.threads.filter(|&n| n > MAX_THREADS) {
            return bad(
                "train.threads",
                format!("{n} threads is more than any machine runs usefully; use at most {MAX_THREADS} (one per core is best)"),
            );
        }
        Ok(())
    }

    /// The `ablation:` section, when present.
    fn validate_ablation(&self) -> Result<(), Invalid> {
        if let Some(a) = &self.ablation {
            if a.variants.is_empty() {
                return bad(
                    "ablation.variants",
                    "list at least one of none, layernorm, rmsnorm, l2".into(),
                );
            }
            if a.seeds == 0 {
                return bad("ablation.seeds", "must be at least 1".into());
            }
            if let Some(lr) = a.lrs.iter().find(|lr| !(**lr > 0.0 && lr.is_finite())) {
                return bad(
                    "ablation.lrs",
                    format!("learning rates must be positive numbers, got {lr}"),
                );
            }
            if a.jobs == 0 || a.threads == Some(0) {
                return bad("ablation.jobs", "jobs and threads must be at least 1".into());
            }
        }
        Ok(())
    }

    /// `eval:`, `checkpoint:`, `distributed:` and `device`.
    fn validate_eval_checkpoint_device(&self) -> Result<(), Invalid> {
        if self.eval.beam == 0 {
            return bad("eval.beam", "must be at least 1 (1 = greedy)".into());
        }
        if self.eval.beam > MAX_BEAM {
            return bad(
                "eval.beam",
                format!("{} is far past any useful beam (beyond a few dozen it stops helping, and each sentence keeps beam × vocabulary scores); use at most {MAX_BEAM}", self.eval.beam),
            );
        }
        if self.checkpoint.keep_best_by == KeepBestBy::Bleu
            && !(self.data.corpus.is_translation() && self.eval.bleu)
        {
            return bad(
                "checkpoint.keep_best_by",
                "bleu needs a translation corpus with eval.bleu: true; use loss".into(),
            );
        }
        if self.eval.max_tokens == 0 {
            return bad("eval.max_tokens", "must be at least 1".into());
        }
        if self.eval.max_batches == Some(0) {
            return bad(
                "eval.max_batches",
                "must be at least 1 (null evaluates the whole split)".into(),
            );
        }
        if self.eval.bleu_sentences == Some(0) {
            return bad(
                "eval.bleu_sentences",
                "must be at least 1 (null decodes every sentence; to skip BLEU set eval.bleu: false)".into(),
            );
        }
        let d = &self.distributed;
        if !(d.bucket_mib.is_finite() && d.bucket_mib > 0.0 && d.bucket_mib <= 4096.0) {
            return bad(
                "distributed.bucket_mib",
                format!("must be in (0, 4096], got {}", d.bucket_mib),
            );
        }
        if d.timeout_secs == 0 || d.timeout_secs > 7 * 24 * 3600 {
            return bad(
                "distributed.timeout_secs",
                format!("must be 1 to 604800 (a week), got {}", d.timeout_secs),
            );
        }
        if self.checkpoint.keep_last == 0 {
            return bad(
                "checkpoint.keep_last",
                "must be at least 1 (resuming needs a checkpoint)".into(),
            );
        }
        if !(self.device == "cpu"
            || self
                .device
                .strip_prefix("cuda:")
                .is_some_and(|n| n.parse::<usize>().is_ok()))
        {
            return bad(
                "device",
                format!("must be `cpu` or `cuda:N`, got {:?}", self.device),
            );
        }
        Ok(())
    }

    /// Settings that are allowed but probably not meant, in words, for the CLI to print before
    /// it starts.
    pub fn warnings(&self) -> Vec<String> {
        let t = &self.train;
        let mut out = vec![];
        if let Some(steps) = t.steps.filter(|&s| t.warmup_steps > s) {
            out.push(format!(
                "train.warmup_steps = {} is more than train.steps = {steps}: the learning rate is still \
                 warming up when the run ends and never reaches train.lr = {} (it peaks at {:.0}% of it)",
                t.warmup_steps,
                t.lr,
                100.0 * steps as f64 / t.warmup_steps as f64
            ));
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let Some(n) = t.threads.filter(|&n| n > cores) {
            out.push(format!(
                "train.threads = {n} but this machine has {cores} core(s): threads beyond the cores \
                 only wait for each other, so training is slower, not faster"
            ));
        }
        out.extend(self.logn_warning());
        out.extend(self.data.warnings());
        out
    }

    /// `model.logn_length` below the length a language model trains at: log-n scaling is a
    /// no-op up to m, meant for lengths past training, but with m below the block it scales the
    /// queries of training positions too (a different model, and no longer the one `ember eval
    /// --logn off` compares with at the training length).
    fn logn_warning(&self) -> Option<String> {
        let m = self.model.logn_length.filter(|_| self.model.logn_attention)?;
        let trained = self.text_training_length();
        (self.model.arch == ember_model::Arch::Lm && m < trained).then(|| {
            format!(
                "model.logn_length = {m} is below the training length ({trained}, train.block_size \
                 or model.max_seq_len): log-n scaling, meant for lengths past training, then also \
                 scales the queries of training positions {}..{trained}; leave model.logn_length \
                 out to take the training length",
                m + 1
            )
        })
    }
}

/// `train.threads` above this is refused: no machine runs that many usefully, and asking the
/// thread pool for billions aborts the process.
pub const MAX_THREADS: usize = 1024;

/// `train.accumulation` above this is refused (see `validate`).
pub const MAX_ACCUMULATION: usize = 1 << 16;

/// The largest beam `eval.beam` (and the CLI's `--beam`) accepts.
pub const MAX_BEAM: usize = 1024;
