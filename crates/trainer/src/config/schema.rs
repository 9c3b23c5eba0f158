//! The schema: one struct per section of the run config's YAML, field for field, with the
//! defaults of the keys a config may leave out.

use std::path::PathBuf;

use ember_data::{DataConfig, WindowMode};
use ember_kernels::{ActivationMemory, Precision};
use ember_model::{LengthPenalty, ModelConfig};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{MAX_ACCUMULATION, MAX_BEAM, MAX_THREADS};

/// A whole run, as written in its YAML file.
///
/// The schema states the rules between sections that a JSON Schema can; Ember checks those and
/// the rest (e.g. `train.min_lr` ≤ `train.lr`, `train.block_size` ≤
/// `model.max_seq_len`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "$comment" = "A language-model corpus (`data.corpus.kind: text` or `token_shards`, or `hf_dataset` with a `text` column) needs `model.arch: lm`, `train.batch_size` and `train.block_size`, no `train.max_tokens`, and `checkpoint.keep_best_by: loss`; a translation corpus (the rest, `embedded` by default) needs `model.arch: seq2seq` (no `model.init_from`), `train.max_tokens` and no `batch_size`/`block_size`, and `keep_best_by: bleu` needs `eval.bleu: true`.",
    // A language-model corpus (text, token shards, or a dataset's text column) …
    "if" = {"required": ["data"], "properties": {"data": {"required": ["corpus"], "properties": {"corpus": {
        "required": ["kind"],
        "anyOf": [{"properties": {"kind": {"enum": ["text", "token_shards"]}}},
                  {"properties": {"kind": {"const": "hf_dataset"},
                                  "columns": {"required": ["text"], "properties": {"text": {"type": "string"}}}}}]}}}}},
    // … trains a language model on windows …
    "then" = {"properties": {
        "model": {"properties": {"arch": {"const": "lm"}}},
        "train": {"required": ["batch_size", "block_size"],
                  "properties": {"batch_size": {"type": "integer"}, "block_size": {"type": "integer"},
                                 "max_tokens": {"type": "null"}}},
        "checkpoint": {"properties": {"keep_best_by": {"const": "loss"}}}}},
    // … and a translation corpus a seq2seq model on token budgets (BLEU can pick the best).
    "else" = {"properties": {
        "model": {"properties": {"arch": {"const": "seq2seq"}, "init_from": {"type": "null"}}},
        "train": {"required": ["max_tokens"],
                  "properties": {"max_tokens": {"type": "integer"},
                                 "batch_size": {"type": "null"}, "block_size": {"type": "null"}}}},
        "if": {"required": ["checkpoint"], "properties": {"checkpoint": {
            "required": ["keep_best_by"], "properties": {"keep_best_by": {"const": "bleu"}}}}},
        "then": {"properties": {"eval": {"properties": {"bleu": {"const": true}}}}}}
))]
pub struct RunConfig {
    /// `model:` — the architecture.
    pub model: ModelConfig,
    /// `data:` — the corpus, the tokenizer and which examples to drop.
    #[serde(default)]
    pub data: DataConfig,
    /// `train:` — the optimisation: length, learning rate, batches, optimizer.
    pub train: TrainConfig,
    /// `eval:` — validation during and after training.
    #[serde(default)]
    pub eval: EvalConfig,
    /// `checkpoint:` — when to save and what to keep.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// `log:` — where metrics go besides `metrics.jsonl`.
    #[serde(default)]
    pub log: LogConfig,
    /// `distributed:` — how the ranks of a data-parallel job talk.
    #[serde(default)]
    pub distributed: DistributedConfig,
    /// `cpu` or `cuda:N` (the latter needs the `cuda` cargo feature).
    #[serde(default = "default_device")]
    #[schemars(regex(pattern = r"^(cpu|cuda:\+?[0-9]{1,19})$"))]
    pub device: String,
    /// Defaults for `ember ablate` (command-line flags override them). Ignored by `ember train`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ablation: Option<AblationConfig>,
}

/// `ablation:` — the grid `ember ablate` runs: every variant × seed × learning rate, crossed with
/// the levels of any `grid` axes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AblationConfig {
    /// QK-norm variants to compare; `none` is the baseline the others are paired against.
    #[serde(default = "default_variants")]
    #[schemars(length(min = 1))]
    pub variants: Vec<ember_model::QkNorm>,
    /// Seeds per cell (seeds 1..=n); a seed fixes initial values and data order for every variant.
    #[serde(default = "default_seeds")]
    #[schemars(range(min = 1))]
    pub seeds: usize,
    /// Peak learning rates to sweep; empty means just `train.lr`.
    #[serde(default)]
    #[schemars(extend("items" = {"type": "number", "format": "double", "exclusiveMinimum": 0}))]
    pub lrs: Vec<f64>,
    /// Runs at a time (each gets `threads` CPU threads).
    #[serde(default = "default_one")]
    #[schemars(range(min = 1))]
    pub jobs: usize,
    /// Threads per run (default: cores / jobs, at least 1).
    #[serde(default)]
    #[schemars(range(min = 1))]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NonFinitePolicy {
    /// Do not apply the update; count it and continue.
    Skip,
    /// Do not apply the update; stop with an error naming the step and the tensor.
    Stop,
}

/// `train:` — the optimisation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("$comment" = "Exactly one of `steps` and `epochs`.", "oneOf" = [
    {"required": ["steps"], "properties": {"steps": {"type": "integer"}, "epochs": {"type": "null"}}},
    {"required": ["epochs"], "properties": {"epochs": {"type": "number"}, "steps": {"type": "null"}}}
]))]
pub struct TrainConfig {
    /// Optimizer updates to run. Exactly one of `steps` and `epochs` is required.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub steps: Option<u64>,
    /// Passes over the training data (converted to steps from the batches per epoch).
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub epochs: Option<f64>,
    /// Seed of the initial weights, the data order and the dropout masks.
    #[serde(default)]
    pub seed: u64,
    /// Peak learning rate.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub lr: f64,
    /// The learning-rate schedule: `constant`, `cosine` or `inverse_sqrt`.
    #[serde(default = "default_schedule")]
    pub schedule: Schedule,
    /// Steps of linear warmup from 0 to `lr`.
    #[serde(default)]
    pub warmup_steps: u64,
    /// The floor of the cosine schedule (at most `lr`).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_lr: f64,
    /// Translation: padded tokens per micro-batch (fairseq's `--max-tokens`).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_tokens: Option<usize>,
    /// Language modelling: windows per micro-batch.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub batch_size: Option<usize>,
    /// Language modelling: tokens per window.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub block_size: Option<usize>,
    /// Language modelling: `sampled` random windows (nanoGPT) or a `sweep` over the stream.
    #[serde(default)]
    pub windows: WindowMode,
    /// Micro-batches per optimizer update; the loss is normalised by all their target tokens.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1, max = MAX_ACCUMULATION))]
    pub accumulation: usize,
    /// Global gradient-norm clip; null disables clipping.
    #[serde(default = "default_clip")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub clip_grad_norm: Option<f64>,
    /// Label smoothing ε of the cross-entropy (fairseq's `--label-smoothing`).
    #[serde(default)]
    #[schemars(range(min = 0), extend("exclusiveMaximum" = 1))]
    pub label_smoothing: f64,
    /// Coefficient of the z-loss log²Z (Wortsman et al. 2023 use 1e-4).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub z_loss: f64,
    /// AdamW's decoupled weight decay (of matrices; see `decay_embeddings`).
    #[serde(default = "default_wd")]
    #[schemars(range(min = 0))]
    pub weight_decay: f64,
    /// Also decay embedding matrices (norm gains, biases and scales are never decayed).
    #[serde(default)]
    pub decay_embeddings: bool,
    /// AdamW's β₁.
    #[serde(default = "default_beta1")]
    #[schemars(range(min = 0), extend("exclusiveMaximum" = 1))]
    pub beta1: f64,
    /// AdamW's β₂.
    #[serde(default = "default_beta2")]
    #[schemars(range(min = 0), extend("exclusiveMaximum" = 1))]
    pub beta2: f64,
    /// AdamW's ε.
    #[serde(default = "default_adam_eps")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub adam_eps: f64,
    /// What a NaN or infinite loss or gradient does: `stop` the run or `skip` the update.
    #[serde(default = "default_nonfinite")]
    pub on_nonfinite: NonFinitePolicy,
    /// With `on_nonfinite: skip`: stop the run as diverged once more than this fraction of its
    /// steps so far were skipped (judged from the 10th skipped step on).
    #[serde(default = "default_max_skipped_fraction")]
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 1))]
    pub max_skipped_fraction: f64,
    /// Log training metrics every this many steps.
    #[serde(default = "default_log_every")]
    #[schemars(range(min = 1))]
    pub log_every: u64,
    /// Stop the run as diverged once the validation loss has been above its value at
    /// initialisation for this many evaluations in a row (null: never).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub divergence_evals: Option<u32>,
    /// CPU threads for Ember's kernels in this run (default: one per physical core). Results do
    /// not depend on it.
    #[serde(default)]
    #[schemars(range(min = 1, max = MAX_THREADS))]
    pub threads: Option<usize>,
    /// Split every micro-batch into this many shares by rows, computed at once on the threads
    /// (each share's forward and backward on a thread of its own) and their gradients summed in
    /// order. Faster than splitting each op over the threads (1.3–1.4× at 2 threads), and no
    /// slower on one (the shares then run in turn, each with half the activations: lower peak
    /// memory); see docs/performance.md. The results depend on the shares (dropout masks are
    /// drawn per share, sums are grouped by share) but never on the threads, so the default is
    /// a fixed number, the same on every machine: 2 on the CPU, 1 on a GPU (where shares run in
    /// turn on one stream and would only halve each kernel's work). In a data-parallel job each rank splits its part this
    /// many ways: W ranks of S shares give the bits of one process computing W·S shares.
    #[serde(default)]
    #[schemars(range(min = 1, max = MAX_THREADS))]
    pub shares: Option<usize>,
    /// The precision of the matrix products: `f32`, or `bf16` — mixed precision, bf16 operands
    /// with f32 sums, f32 weights, gradients and optimizer, f32 activations but for what the
    /// fused sub-blocks keep in bf16 (CPUs with AVX512_BF16;
    /// elsewhere refused, or emulated with the same bits where `EMBER_CPU_BF16=emulate` asks for
    /// it; on CUDA with every kernel family on, the pre-norm branches' activations bf16; see
    /// `precision`). Written into a run's config only when it is not f32, so an f32 run's
    /// files are byte for byte what they were before the key existed.
    #[serde(default, skip_serializing_if = "is_f32")]
    #[schemars(extend("default" = "f32"))]
    pub precision: Precision,
    /// What the backward pass reads: `keep` holds every activation from the forward pass (the
    /// fastest); `recompute` holds only each sub-block's input (a post-norm one's output too,
    /// its norm's input) and computes its activations again in the backward pass, with the same bits (activation checkpointing: most of the
    /// activations' memory for about one more forward pass of the layers);
    /// `recompute_attention` does so for the attention sub-blocks alone and keeps the
    /// feed-forward blocks' (less memory saved, less time spent). Models (language and
    /// translation, pre- or post-norm) on the CPU whose recomputed sub-blocks run as one op: no
    /// L2 QK-norm, log-n scaling only with rotary positions; others are refused before any
    /// work, naming why.
    /// Written into a run's config only when it is not `keep`.
    #[serde(default, skip_serializing_if = "is_keep")]
    #[schemars(extend("default" = "keep"))]
    pub activations: ActivationMemory,
}

fn is_f32(p: &Precision) -> bool {
    *p == Precision::F32
}

fn is_keep(m: &ActivationMemory) -> bool {
    *m == ActivationMemory::Keep
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalConfig {
    /// Validate every this many steps (and always at the end); 0 = only at the end.
    #[serde(default = "default_eval_every")]
    pub every: u64,
    /// Translation: padded tokens per evaluation batch.
    #[serde(default = "default_eval_tokens")]
    #[schemars(range(min = 1))]
    pub max_tokens: usize,
    /// Language modelling: evaluate at most this many windows-batches (null = the whole split).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_batches: Option<usize>,
    /// Translation: also decode the validation set and report BLEU at every evaluation.
    #[serde(default = "default_true")]
    pub bleu: bool,
    /// Beam size for that decoding (1 = greedy, the default: fast and close to beam's ranking).
    #[serde(default = "default_one")]
    #[schemars(range(min = 1, max = MAX_BEAM))]
    pub beam: usize,
    /// Decode only the first this many validation sentences (null = all).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub bleu_sentences: Option<usize>,
    /// Length penalty for that decoding, and for `ember translate` and `ember eval` of this run
    /// or its model folder when they are not given `--length-penalty`: `gnmt:α` or a bare α,
    /// or `fairseq:p` (null: GNMT's α = 0.6). `ember package --length-penalty` sets it in a
    /// folder, so that a model decodes as it was chosen on validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length_penalty: Option<LengthPenalty>,
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
            length_penalty: None,
        }
    }
}

/// Which validation metric picks the "best" checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeepBestBy {
    /// Lowest validation loss.
    Loss,
    /// Highest validation BLEU (translation with `eval.bleu: true`).
    Bleu,
}

/// `distributed:` — how the ranks of a data-parallel job (`mpirun -np N ember train …`) talk.
/// Ignored by a process started without a launcher; free to change on `--resume`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DistributedConfig {
    /// Gradients are summed across ranks in buckets of about this many MiB: one all-reduce per
    /// bucket, not one per tensor.
    #[serde(default = "default_bucket_mib")]
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 4096))]
    pub bucket_mib: f64,
    /// How long a rank waits for the others in any collective before it ends the job (a rank
    /// that died or hangs). Must cover the slowest rank's step and evaluation.
    #[serde(default = "default_timeout_secs")]
    #[schemars(range(min = 1, max = 604_800))]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Save every this many steps (and always at the end); 0 = only at the end.
    #[serde(default = "default_ckpt_every")]
    pub every: u64,
    /// Keep the newest this many checkpoints (plus the best).
    #[serde(default = "default_keep_last")]
    #[schemars(range(min = 1))]
    pub keep_last: usize,
    /// Which validation metric picks the best checkpoint: `loss` or `bleu`.
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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

    /// The resolved configuration as YAML, as saved in run directories.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).unwrap_or_else(|e| format!("# could not serialise the config: {e}\n"))
    }
}
