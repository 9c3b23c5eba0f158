//! The run configuration: one YAML file with the sections `model`, `data`, `train`, `eval`,
//! `checkpoint`, `log` and `device`, each a struct field for field.
//!
//! Loading goes YAML text → generic tree → `--set` overrides → typed config → range checks, and
//! every failure names the file, the key path, and (where the key came from the file) its line.

use std::path::{Path, PathBuf};

use ember_data::{DataConfig, WindowMode};
use ember_model::ModelConfig;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A whole run, as written in its YAML file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub model: ModelConfig,
    #[serde(default)]
    pub data: DataConfig,
    pub train: TrainConfig,
    #[serde(default)]
    pub eval: EvalConfig,
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub distributed: DistributedConfig,
    /// `cpu` or `cuda:N` (the latter needs the `cuda` cargo feature).
    #[serde(default = "default_device")]
    pub device: String,
    /// Defaults for `ember ablate` (command-line flags override them). Ignored by `ember train`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ablation: Option<AblationConfig>,
}

/// `ablation:` — the grid `ember ablate` runs: every variant × seed × learning rate, crossed with
/// the levels of any `grid` axes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AblationConfig {
    /// QK-norm variants to compare; `none` is the baseline the others are paired against.
    #[serde(default = "default_variants")]
    pub variants: Vec<ember_model::QkNorm>,
    /// Seeds per cell (seeds 1..=n); a seed fixes initial values and data order for every variant.
    #[serde(default = "default_seeds")]
    pub seeds: usize,
    /// Peak learning rates to sweep; empty means just `train.lr`.
    #[serde(default)]
    pub lrs: Vec<f64>,
    /// Runs at a time (each gets `threads` CPU threads).
    #[serde(default = "default_one")]
    pub jobs: usize,
    /// Threads per run (default: cores / jobs, at least 1).
    #[serde(default)]
    pub threads: Option<usize>,
    /// Output directory (default `runs/<config name>-ablation`).
    #[serde(default)]
    pub out: Option<PathBuf>,
    /// `KEY=VALUE` overrides for every run of the sweep, before the command line's `--set`
    /// (e.g. `train.steps=300`: a shorter sweep than the config's own training run).
    #[serde(default)]
    pub set: Vec<String>,
    /// Factorial axes, each `KEY=V1,V2,...` (e.g. `model.positions=rope,learned`): every
    /// combination of their values is crossed with the variants, learning rates and seeds.
    #[serde(default)]
    pub grid: Vec<String>,
}

fn default_variants() -> Vec<ember_model::QkNorm> {
    use ember_model::QkNorm;
    vec![QkNorm::None, QkNorm::Rmsnorm, QkNorm::Layernorm, QkNorm::L2]
}
fn default_seeds() -> usize {
    3
}

fn default_device() -> String {
    "cpu".into()
}

/// The learning-rate schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// Linear warmup, then constant.
    Constant,
    /// Linear warmup, then cosine decay to `min_lr` at the last step.
    Cosine,
    /// Linear warmup, then lr·√(warmup/step) (Vaswani et al. 2017; fairseq's inverse_sqrt).
    InverseSqrt,
}

/// What to do when the loss or a gradient is NaN or infinite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NonFinitePolicy {
    /// Do not apply the update; count it and continue.
    Skip,
    /// Do not apply the update; stop with an error naming the step and the tensor.
    Stop,
}

/// `train:` — the optimisation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Optimizer updates to run. Exactly one of `steps` and `epochs` is required.
    #[serde(default)]
    pub steps: Option<u64>,
    /// Passes over the training data (converted to steps from the batches per epoch).
    #[serde(default)]
    pub epochs: Option<f64>,
    #[serde(default)]
    pub seed: u64,
    /// Peak learning rate.
    pub lr: f64,
    #[serde(default = "default_schedule")]
    pub schedule: Schedule,
    #[serde(default)]
    pub warmup_steps: u64,
    /// The floor of the cosine schedule.
    #[serde(default)]
    pub min_lr: f64,
    /// Translation: padded tokens per micro-batch (fairseq's `--max-tokens`).
    #[serde(default)]
    pub max_tokens: Option<usize>,
    /// Language modelling: windows per micro-batch.
    #[serde(default)]
    pub batch_size: Option<usize>,
    /// Language modelling: tokens per window.
    #[serde(default)]
    pub block_size: Option<usize>,
    /// Language modelling: `sampled` random windows (nanoGPT) or a `sweep` over the stream.
    #[serde(default)]
    pub windows: WindowMode,
    /// Micro-batches per optimizer update; the loss is normalised by all their target tokens.
    #[serde(default = "default_one")]
    pub accumulation: usize,
    /// Global gradient-norm clip; null disables clipping.
    #[serde(default = "default_clip")]
    pub clip_grad_norm: Option<f64>,
    #[serde(default)]
    pub label_smoothing: f64,
    /// Coefficient of the z-loss log²Z (Wortsman et al. 2023 use 1e-4).
    #[serde(default)]
    pub z_loss: f64,
    #[serde(default = "default_wd")]
    pub weight_decay: f64,
    /// Also decay embedding matrices (norm gains, biases and scales are never decayed).
    #[serde(default)]
    pub decay_embeddings: bool,
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    #[serde(default = "default_adam_eps")]
    pub adam_eps: f64,
    #[serde(default = "default_nonfinite")]
    pub on_nonfinite: NonFinitePolicy,
    /// With `on_nonfinite: skip`: stop the run as diverged once more than this fraction of its
    /// steps so far were skipped (judged from the 10th skipped step on).
    #[serde(default = "default_max_skipped_fraction")]
    pub max_skipped_fraction: f64,
    /// Log training metrics every this many steps.
    #[serde(default = "default_log_every")]
    pub log_every: u64,
    /// Stop the run as diverged once the validation loss has been above its value at
    /// initialisation for this many evaluations in a row (null: never).
    #[serde(default)]
    pub divergence_evals: Option<u32>,
    /// CPU threads for Ember's kernels in this run (default: the physical cores; see
    /// `setup::set_threads`). Results do not depend on it.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Split every micro-batch into this many shares by rows, computed at once on the threads
    /// (each share's forward and backward on a thread of its own) and their gradients summed in
    /// order. Faster than splitting each op over the threads (1.3–1.4× at 2 threads), and no
    /// slower on one (the shares then run in turn, each with half the activations: lower peak
    /// memory); see docs/performance.md. The results depend on the shares (dropout masks are
    /// drawn per share, sums are grouped by share) but never on the threads, so the default is
    /// a fixed number, the same on every machine: 2 on the CPU ([`DEFAULT_CPU_SHARES`]), 1 on a
    /// GPU (where shares run in turn on one stream and would only halve each kernel's work);
    /// [`RunConfig::shares`] resolves it. In a data-parallel job each rank splits its part this
    /// many ways: W ranks of S shares give the bits of one process computing W·S shares.
    #[serde(default)]
    pub shares: Option<usize>,
}

fn default_schedule() -> Schedule {
    Schedule::Cosine
}
fn default_one() -> usize {
    1
}
fn default_clip() -> Option<f64> {
    Some(1.0)
}
fn default_wd() -> f64 {
    0.01
}
fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.98
}
fn default_adam_eps() -> f64 {
    1e-8
}
fn default_nonfinite() -> NonFinitePolicy {
    NonFinitePolicy::Stop
}
fn default_max_skipped_fraction() -> f64 {
    0.5
}
fn default_log_every() -> u64 {
    10
}

/// `eval:` — validation during and after training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalConfig {
    /// Validate every this many steps (and always at the end); 0 = only at the end.
    #[serde(default = "default_eval_every")]
    pub every: u64,
    /// Translation: padded tokens per evaluation batch.
    #[serde(default = "default_eval_tokens")]
    pub max_tokens: usize,
    /// Language modelling: evaluate at most this many windows-batches (null = the whole split).
    #[serde(default)]
    pub max_batches: Option<usize>,
    /// Translation: also decode the validation set and report BLEU at every evaluation.
    #[serde(default = "default_true")]
    pub bleu: bool,
    /// Beam size for that decoding (1 = greedy, the default: fast and close to beam's ranking).
    #[serde(default = "default_one")]
    pub beam: usize,
    /// Decode only the first this many validation sentences (null = all).
    #[serde(default)]
    pub bleu_sentences: Option<usize>,
}

fn default_true() -> bool {
    true
}

fn default_eval_every() -> u64 {
    500
}
fn default_eval_tokens() -> usize {
    8192
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            every: default_eval_every(),
            max_tokens: default_eval_tokens(),
            max_batches: None,
            bleu: true,
            beam: 1,
            bleu_sentences: None,
        }
    }
}

/// Which validation metric picks the "best" checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeepBestBy {
    /// Lowest validation loss.
    Loss,
    /// Highest validation BLEU (translation with `eval.bleu: true`).
    Bleu,
}

/// `distributed:` — how the ranks of a data-parallel job (`mpirun -np N ember train …`) talk.
/// Ignored by a process started without a launcher; free to change on `--resume`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistributedConfig {
    /// Gradients are summed across ranks in buckets of about this many MiB: one all-reduce per
    /// bucket, not one per tensor.
    #[serde(default = "default_bucket_mib")]
    pub bucket_mib: f64,
    /// How long a rank waits for the others in any collective before it ends the job (a rank
    /// that died or hangs). Must cover the slowest rank's step and evaluation.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
}

fn default_bucket_mib() -> f64 {
    25.0
}
fn default_timeout_secs() -> u64 {
    600
}

impl Default for DistributedConfig {
    fn default() -> Self {
        Self {
            bucket_mib: default_bucket_mib(),
            timeout_secs: default_timeout_secs(),
        }
    }
}

/// `checkpoint:` — when to save and what to keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Save every this many steps (and always at the end); 0 = only at the end.
    #[serde(default = "default_ckpt_every")]
    pub every: u64,
    /// Keep the newest this many checkpoints (plus the best).
    #[serde(default = "default_keep_last")]
    pub keep_last: usize,
    #[serde(default = "default_keep_best_by")]
    pub keep_best_by: KeepBestBy,
}

fn default_ckpt_every() -> u64 {
    1000
}
fn default_keep_last() -> usize {
    2
}
fn default_keep_best_by() -> KeepBestBy {
    KeepBestBy::Loss
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            every: default_ckpt_every(),
            keep_last: default_keep_last(),
            keep_best_by: default_keep_best_by(),
        }
    }
}

/// `log:` — where a run's metrics go besides `metrics.jsonl` (always written).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// Also write TensorBoard event files into the run directory (`tensorboard --logdir runs/`
    /// then shows every run, and an ablation's runs side by side).
    #[serde(default = "default_true")]
    pub tensorboard: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { tensorboard: true }
    }
}

/// A configuration that cannot be used, with everything needed to fix it.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {message}{}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default(), key.as_ref().map(|k| format!(" (key `{k}`)")).unwrap_or_default())]
pub struct ConfigFileError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub key: Option<String>,
    pub message: String,
}

/// A failed check: (key path, message).
pub type Invalid = (String, String);

fn bad(key: &str, message: String) -> Result<(), Invalid> {
    Err((key.to_string(), message))
}

/// `train.shares` left out, on the CPU: two shares computed at once use two cores better than
/// each op split over both, and on one core they cost nothing (measured, docs/performance.md).
pub const DEFAULT_CPU_SHARES: usize = 2;

impl RunConfig {
    /// Shares each micro-batch is split into: `train.shares`, or its default ([`DEFAULT_CPU_SHARES`]
    /// on the CPU, 1 on a GPU).
    pub fn shares(&self) -> usize {
        self.train.shares.unwrap_or(if self.device.starts_with("cuda") {
            1
        } else {
            DEFAULT_CPU_SHARES
        })
    }

    /// The length a language model trains at: `train.block_size`, else `model.max_seq_len`.
    pub fn text_training_length(&self) -> usize {
        self.train.block_size.unwrap_or(self.model.max_seq_len)
    }

    /// Reads `path`, applies `--set KEY=VALUE` overrides, and validates.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigFileError> {
        use std::io::Read;
        let err = |message: String| ConfigFileError {
            file: path.to_path_buf(),
            line: None,
            key: None,
            message,
        };
        // At most one byte past the limit is read, so that `/dev/zero` or a 10 GB file given
        // by mistake is refused by from_yaml's size check instead of filling the memory.
        let mut text = String::new();
        ember_data::io::open_input(path)
            .and_then(|f| f.take(MAX_CONFIG_BYTES as u64 + 1).read_to_string(&mut text))
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidData => {
                    err("cannot read the config: it is not UTF-8 text (is it the YAML file?)".into())
                }
                _ => err(format!("cannot read the config: {e}")),
            })?;
        Self::from_yaml(&text, path, overrides)
    }

    /// As [`load`](Self::load), from YAML text; `path` only labels errors.
    pub fn from_yaml(text: &str, path: &Path, overrides: &[String]) -> Result<Self, ConfigFileError> {
        let err = |line, key: Option<String>, message: String| ConfigFileError {
            file: path.to_path_buf(),
            line,
            key,
            message,
        };
        if text.len() > MAX_CONFIG_BYTES {
            return Err(err(
                None,
                None,
                format!(
                    "the file has more than {MAX_CONFIG_BYTES} bytes; a config is a few kilobytes, \
                     so this is probably not the config you meant"
                ),
            ));
        }
        let mut tree: Value = serde_saphyr::from_str(text).map_err(|e| {
            let message = first_line(&e.to_string()).to_string();
            let line = yaml_error_line(&message);
            // A value the parser refuses (`.inf`) is named by its key; a structural error is not
            // at a key.
            let key = line
                .filter(|_| message.contains("non-finite"))
                .and_then(|l| key_at(text, l, yaml_error_column(&message)));
            err(line, key.clone(), yaml_message(&message, key.as_deref()))
        })?;
        if tree.is_null() {
            return Err(err(
                None,
                None,
                "the file is empty; see configs/quickstart.yaml for a complete example".into(),
            ));
        }
        let mut overridden = vec![];
        for o in overrides {
            let (key, value) = o.split_once('=').ok_or_else(|| {
                err(
                    None,
                    None,
                    format!("--set {o:?}: expected KEY=VALUE, e.g. --set train.lr=3e-3"),
                )
            })?;
            let value: Value = serde_saphyr::from_str(value).map_err(|e| {
                let said = yaml_message(first_line(&e.to_string()), Some(key));
                err(
                    None,
                    Some(key.into()),
                    format!(
                        "--set {key}={}: {}",
                        clip(value),
                        said.strip_prefix("not valid YAML: ").unwrap_or(&said)
                    ),
                )
            })?;
            set_path(&mut tree, key, value)
                .map_err(|m| err(None, Some(key.into()), format!("--set: {m}")))?;
            overridden.push(key.to_string());
        }
        if let Some((key, message)) = misshapen_section(&tree) {
            let line = locate(text, &key);
            return Err(err(line, (key != ".").then_some(key), message));
        }
        crate::init_from::complete(&mut tree)
            .map_err(|(key, message)| err(locate(text, &key), Some(key), message))?;
        let cfg: RunConfig = serde_path_to_error::deserialize(&tree).map_err(|e| {
            let mut key = e.path().to_string();
            let mut message = e.into_inner().to_string();
            if key == "data.corpus" {
                // The corpus is an internally tagged enum, where serde loses the field's path;
                // deserialising the chosen variant on its own recovers it.
                if let Some((field, m)) = corpus_error(&tree["data"]["corpus"]) {
                    key = format!("data.corpus.{field}");
                    message = m;
                }
            }
            let from_set = overridden
                .iter()
                .any(|k| key.starts_with(k.as_str()) || k.starts_with(&key));
            let key = (key != ".").then_some(key);
            let line = if from_set {
                None
            } else {
                key.as_deref().and_then(|k| locate(text, k))
            };
            err(line, key, clip(&message))
        })?;
        cfg.validate().map_err(|(key, message)| {
            let message = if overrides.is_empty() {
                message
            } else {
                format!("{message} (with --set {})", clip(&overrides.join(" --set ")))
            };
            err(locate(text, &key), Some(key), message)
        })?;
        Ok(cfg)
    }

    /// Range and consistency checks that serde cannot express, section by section; the first
    /// failure is returned as (key path, message).
    pub fn validate(&self) -> Result<(), Invalid> {
        self.validate_length_and_schedule()?;
        self.validate_optimizer()?;
        self.validate_logging_and_threads()?;
        self.validate_batches()?;
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

    /// Batching that fits the corpus: token budgets for translation, windows for language models.
    fn validate_batches(&self) -> Result<(), Invalid> {
        let t = &self.train;
        if self.data.corpus.is_translation() {
            if self.model.arch != ember_model::Arch::Seq2seq {
                return bad(
                    "model.arch",
                    "a translation corpus (data.corpus.kind: embedded | parallel, or hf_dataset with source/target columns) needs model.arch: seq2seq"
                        .into(),
                );
            }
            match t.max_tokens {
                None | Some(0) => {
                    return bad(
                        "train.max_tokens",
                        "translation needs train.max_tokens (e.g. 4096)".into(),
                    )
                }
                _ => {}
            }
            if t.batch_size.is_some() || t.block_size.is_some() {
                return bad(
                    "train.batch_size",
                    "batch_size/block_size are for language models; use train.max_tokens".into(),
                );
            }
        } else {
            if self.model.arch != ember_model::Arch::Lm {
                return bad(
                    "model.arch",
                    "a text corpus (data.corpus.kind: text | token_shards, or hf_dataset with a text column) needs model.arch: lm".into(),
                );
            }
            match (t.batch_size, t.block_size) {
                (Some(b), Some(s)) if b > 0 && s > 0 => {
                    if s > self.model.max_seq_len {
                        return bad(
                            "train.block_size",
                            format!("{s} exceeds model.max_seq_len = {}", self.model.max_seq_len),
                        );
                    }
                }
                _ => {
                    return bad(
                        "train.batch_size",
                        "language models need train.batch_size and train.block_size (both ≥ 1)".into(),
                    )
                }
            }
            if t.max_tokens.is_some() {
                return bad(
                    "train.max_tokens",
                    "max_tokens is for translation; use batch_size and block_size".into(),
                );
            }
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
        out.extend(self.data.warnings());
        out
    }

    /// The resolved configuration as YAML, as saved in run directories.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).unwrap_or_else(|e| format!("# could not serialise the config: {e}\n"))
    }
}

/// `train.threads` above this is refused: no machine runs that many usefully, and asking the
/// thread pool for billions aborts the process.
pub const MAX_THREADS: usize = 1024;

/// `train.accumulation` above this is refused (see `validate`).
pub const MAX_ACCUMULATION: usize = 1 << 16;

/// The largest beam `eval.beam` (and the CLI's `--beam`) accepts.
pub const MAX_BEAM: usize = 1024;

/// Configs larger than this are refused before parsing: a real one is a few kilobytes.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// A serde-saphyr error in the user's words: what is wrong and what to do. `key` is the
/// dotted key the error is at, when known.
fn yaml_message(message: &str, key: Option<&str>) -> String {
    let detail = message
        .split_once(": ")
        .filter(|(head, _)| head.starts_with("error"))
        .map_or(message, |(_, rest)| rest);
    // Past "line L column C: ", the parser's own words.
    let what = detail
        .find(": ")
        .filter(|_| detail.starts_with("line "))
        .map_or(detail, |i| &detail[i + 2..]);
    let at = detail.strip_suffix(what).unwrap_or("").trim_end_matches(": ");
    let said = if let Some(rest) = what.strip_prefix("duplicate mapping key: ") {
        let key = rest.split(", set DuplicateKeyPolicy").next().unwrap_or(rest);
        format!(
            "the key `{}` is given twice in the same section ({at}); keep one of them",
            clip(key)
        )
    } else if what.starts_with("budget breached: Depth") || what.contains("recursion limit") {
        "the file nests sections or lists more deeply than any config does (a config is a \
         few levels of `key: value`); write it as plain nested mappings"
            .to_string()
    } else if what.starts_with("budget breached") {
        "the file holds, or expands into through its anchors and aliases (`&name` … `*name`: \
         an \"alias bomb\"), far more values than any config has; write a config's values out \
         plainly"
            .to_string()
    } else if what.contains("found a tab") {
        format!("{at}: a tab where YAML needs spaces; indent with spaces only")
    } else if let Some(rest) = what.strip_prefix("non-finite float `") {
        let value = rest.split('`').next().unwrap_or("");
        format!(
            "{} is {}: config values must be finite numbers; give a number",
            key.map_or("a value".to_string(), |k| format!("`{k}`")),
            clip(value)
        )
    } else if what.starts_with("multiple YAML documents") {
        format!(
            "the file holds more than one YAML document (a `---` line starts another, {at}); a \
             config is one document: remove the `---` line and keep every section in one mapping"
        )
    } else if what.contains("policy") || what.contains("from_str") || what.contains("Options") {
        // Words about the parser's settings mean nothing to a user: say where, not why.
        format!("{at}: YAML that Ember does not read here; write plain `key: value` mappings")
    } else {
        format!("{at}: {}", clip(what))
    };
    format!("not valid YAML: {said}")
}

/// Shortens any word of a message longer than 60 characters, and the whole message to 400
/// characters (a 10 MB value is not echoed back, with or without spaces in it).
fn clip(message: &str) -> String {
    const MOST: usize = 400;
    let words = clip_words(message);
    let n = words.chars().count();
    if n <= MOST {
        return words;
    }
    let head: String = words.chars().take(MOST - 60).collect();
    format!("{head}… ({n} characters in all)")
}

/// The dotted key a YAML error at `line` (1-based; `column` 1-based, if known) is at: the
/// block-style keys that enclose the line, then, inside a flow mapping (`train: { lr: .inf }`),
/// the keys of the mappings open before the column.
fn key_at(text: &str, line: usize, column: Option<usize>) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let target = *lines.get(line.checked_sub(1)?)?;
    let mut path: Vec<(usize, String)> = vec![];
    let simple = |k: &str| !k.is_empty() && k.chars().all(|c| c.is_alphanumeric() || c == '_');
    for l in &lines[..line] {
        let trimmed = l.trim_start();
        let indent = l.len() - trimmed.len();
        let Some((k, _)) = trimmed.split_once(':') else {
            continue;
        };
        if trimmed.starts_with('#') || !simple(k.trim()) {
            continue;
        }
        while path.last().is_some_and(|(i, _)| *i >= indent) {
            path.pop();
        }
        path.push((indent, k.trim().to_string()));
    }
    let mut keys: Vec<String> = path.into_iter().map(|(_, k)| k).collect();
    // Flow mappings on the line, up to the column.
    let prefix: String = match column {
        Some(c) => target.chars().take(c.saturating_sub(1)).collect(),
        None => target.to_string(),
    };
    if prefix.contains('{') {
        let own = prefix.split_once(':').map(|(k, _)| k.trim().to_string());
        if own.is_some() && keys.last() == own.as_ref() {
            keys.pop();
        }
        let (mut stack, mut word, mut last): (Vec<String>, String, Option<String>) =
            (vec![], String::new(), None);
        for c in prefix.chars() {
            match c {
                ':' if simple(word.trim()) => {
                    last = Some(word.trim().to_string());
                    word.clear();
                }
                '{' => {
                    stack.extend(last.take());
                    word.clear();
                }
                '}' => {
                    stack.pop();
                    last = None;
                    word.clear();
                }
                ',' => {
                    last = None;
                    word.clear();
                }
                c => word.push(c),
            }
        }
        keys.extend(stack);
        keys.extend(last);
    }
    (!keys.is_empty()).then(|| keys.join("."))
}

/// The column in a serde-saphyr message ("... line 3 column 7: ...").
fn yaml_error_column(message: &str) -> Option<usize> {
    let rest = &message[message.find("column ")? + 7..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Shortens any word of a message longer than 60 characters.
fn clip_words(message: &str) -> String {
    const KEEP: usize = 40;
    let mut out = String::new();
    for (i, word) in message.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        if word.chars().count() > 60 {
            // The count is of the value itself, without the quotes and commas around it.
            let tail: Vec<char> = word.chars().rev().take_while(|c| !c.is_alphanumeric()).collect();
            let head = word.chars().take_while(|c| !c.is_alphanumeric()).count();
            let n = word.chars().count().saturating_sub(head + tail.len());
            out.extend(word.chars().take(KEEP));
            out.push_str(&format!("… ({n} characters)"));
            out.extend(tail.into_iter().rev());
        } else {
            out.push_str(word);
        }
    }
    out
}

/// The first section (or the whole file) that is not a mapping of keys: serde's account of it
/// ("invalid type: integer `1`, expected string or map (key `model[0]`)") names neither the
/// section nor the fix.
fn misshapen_section(tree: &Value) -> Option<(String, String)> {
    let kind = |v: &Value| match v {
        Value::Array(_) => "a list",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        _ => "something else",
    };
    if !tree.is_object() {
        return Some((
            ".".into(),
            format!(
                "the file holds {} where a config needs a mapping of sections (`model:`, `data:`, \
                 `train:`, ...); see configs/quickstart.yaml",
                kind(tree)
            ),
        ));
    }
    let sections = [
        "model",
        "data",
        "data.corpus",
        "data.tokenizer",
        "train",
        "eval",
        "checkpoint",
        "ablation",
    ];
    for key in sections {
        let Some(node) = key.split('.').try_fold(tree, |node, part| node.get(part)) else {
            continue;
        };
        if !(node.is_object() || node.is_null()) {
            return Some((
                key.to_string(),
                format!(
                    "`{key}` must be a mapping of keys (`name: value` lines indented under `{}:`), \
                     but it is {}",
                    key.rsplit('.').next().unwrap_or(key),
                    kind(node)
                ),
            ));
        }
    }
    None
}

/// The line number in a serde-saphyr message ("... line 3 column 7: ...").
fn yaml_error_line(message: &str) -> Option<usize> {
    let rest = &message[message.find("line ")? + 5..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// For a `data.corpus` mapping that fails to deserialise: the offending field and message,
/// found by deserialising the variant named by `kind` on its own.
fn corpus_error(corpus: &Value) -> Option<(String, String)> {
    use ember_data::{EmbeddedConfig, HfDatasetConfig, ParallelConfig, TextConfig, TokenShardsConfig};
    fn check<T: serde::de::DeserializeOwned>(v: &Value) -> Option<(String, String)> {
        serde_path_to_error::deserialize::<_, T>(v)
            .err()
            .map(|e| (e.path().to_string(), e.into_inner().to_string()))
    }
    let mut fields = corpus.as_object()?.clone();
    let kind = fields.remove("kind")?;
    let rest = Value::Object(fields);
    let (field, message) = match kind.as_str()? {
        "embedded" => check::<EmbeddedConfig>(&rest),
        "parallel" => check::<ParallelConfig>(&rest),
        "text" => check::<TextConfig>(&rest),
        "hf_dataset" => check::<HfDatasetConfig>(&rest),
        "token_shards" => check::<TokenShardsConfig>(&rest),
        _ => None,
    }?;
    // An unknown field's path is its parent; name the field itself from serde's message.
    let field = if field == "." {
        message.split('`').nth(1).unwrap_or("kind").to_string()
    } else {
        field
    };
    Some((field, message))
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// Sets `a.b.c` in a YAML tree, creating mappings on the way; refuses to descend into scalars.
fn set_path(tree: &mut Value, key: &str, value: Value) -> Result<(), String> {
    let mut node = tree;
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!("malformed key {key:?}; use dotted keys like train.lr"));
    }
    for (i, part) in parts.iter().enumerate() {
        if node.is_null() {
            *node = Value::Object(Default::default());
        }
        let map = node.as_object_mut().ok_or_else(|| {
            format!(
                "{} is not a mapping, so it has no key {part:?}",
                parts[..i].join(".")
            )
        })?;
        if i + 1 == parts.len() {
            map.insert(part.to_string(), value);
            return Ok(());
        }
        node = map.entry(part.to_string()).or_insert(Value::Null);
    }
    Ok(())
}

/// Finds the 1-based line of a dotted key path in block-style YAML: each component must appear
/// as `name:` indented deeper than its parent, after the parent's line.
pub fn locate(text: &str, key: &str) -> Option<usize> {
    let mut start = 0;
    let mut parent_indent: isize = -1;
    let lines: Vec<&str> = text.lines().collect();
    for part in key.split('.') {
        let mut found = None;
        for (i, line) in lines.iter().enumerate().skip(start) {
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let indent = (line.len() - trimmed.len()) as isize;
            if indent <= parent_indent {
                break; // left the parent's block
            }
            let name = trimmed.trim_start_matches("- ");
            if indent > parent_indent
                && (name.starts_with(&format!("{part}:")) || name.starts_with(&format!("{part} :")))
            {
                found = Some((i, indent));
                break;
            }
        }
        let (i, indent) = found?;
        start = i + 1;
        parent_indent = indent;
    }
    Some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_yaml_error_is_placed_at_its_key_in_block_and_flow_style() {
        let y = "model:\n  d_model: 1\ntrain:\n  steps: 2\n  lr: .inf\n";
        assert_eq!(key_at(y, 5, Some(7)).as_deref(), Some("train.lr"));
        let y = "train: { steps: 2, lr: .nan }\n";
        assert_eq!(key_at(y, 1, Some(24)).as_deref(), Some("train.lr"));
        let y = "data:\n  corpus: { kind: text, extra: { x: .inf } }\n";
        assert_eq!(key_at(y, 2, Some(37)).as_deref(), Some("data.corpus.extra.x"));
    }

    #[test]
    fn a_long_value_is_never_echoed_whole() {
        let long = "ab ".repeat(50_000);
        let c = clip(&long);
        assert!(
            c.chars().count() < 450 && c.contains("150000 characters in all"),
            "{}",
            c.len()
        );
        assert_eq!(clip("short words stay"), "short words stay");
    }

    #[test]
    fn locate_finds_nested_keys() {
        let y = "model:\n  d_model: 1\ntrain:\n  lr: 2\n  steps: 3\n";
        assert_eq!(locate(y, "train.lr"), Some(4));
        assert_eq!(locate(y, "model.d_model"), Some(2));
        assert_eq!(locate(y, "train.nope"), None);
    }
}
