//! Sizes checked before anything is allocated: a config whose model, batch or context cannot
//! fit in this machine's memory is refused with an estimate and the keys that drive it, instead
//! of aborting inside the allocator minutes (or milliseconds) later.
//!
//! The estimate is deliberately rough (within a small factor of the measured peak for the
//! shipped configs: quickstart ~200 MiB, multi30k-tiny ~1.1 GiB): it only has to separate
//! "fits" from "cannot possibly fit", and it errs low, so a config that trains today is never
//! refused. All arithmetic is in f64, so absurd sizes give a huge number, not an overflow.

use anyhow::{bail, Result};
use ember_data::Dataset;
use ember_kernels::{ActivationMemory, SubBlock};
use ember_model::{Arch, MlpKind, ModelConfig, NormPlacement, Positions};

use crate::config::{Batched, Batching, RunConfig};

const F32: f64 = 4.0;
const GIB: f64 = (1u64 << 30) as f64;

/// Where the bytes of a training run go.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryEstimate {
    /// Weights, AdamW's two moments and the gradients: 3 + `train.shares` copies of every
    /// parameter (each share's gradients are held until they are summed).
    pub parameters: f64,
    /// One micro-batch's activations kept for the backward pass (or an evaluation batch's, if larger).
    pub activations: f64,
    /// The rotary position tables (`model.max_seq_len` × head_dim).
    pub positions: f64,
}

impl MemoryEstimate {
    pub fn total(&self) -> f64 {
        self.parameters + self.activations + self.positions
    }
}

/// Parameters of a model config (embedding, blocks, norms; the output head unless tied).
pub fn parameter_count(m: &ModelConfig) -> f64 {
    let d = m.d_model as f64;
    let (q, kv) = (m.q_width() as f64, (m.kv_heads() * m.head_dim()) as f64);
    // q and o are d × q (q = d unless model.head_dim says otherwise), k and v d × kv. Biases are
    // one value per output, where the model has them (`ModelConfig::query_value_bias`,
    // `key_bias`: keys are rotated in self-attention with rotary positions; `proj_bias` adds o's
    // and the MLP's).
    let attention = |rotated: bool| {
        let biases =
            if m.query_value_bias() { q + kv } else { 0.0 } + if m.key_bias(rotated) { kv } else { 0.0 };
        2.0 * d * q + 2.0 * d * kv + biases + if m.proj_bias { d } else { 0.0 }
    };
    let ff = m.d_ff as f64;
    let mlp = match m.mlp {
        MlpKind::Swiglu => 3.0 * d * ff + if m.proj_bias { 2.0 * ff + d } else { 0.0 },
        MlpKind::Gelu | MlpKind::Relu => 2.0 * d * ff + if m.proj_bias { ff + d } else { 0.0 },
    };
    let norms = 4.0 * d;
    let vocab = m.vocab() as f64;
    let embeddings = vocab * d * if m.tie_embeddings { 1.0 } else { 2.0 };
    let self_attention = attention(m.positions == Positions::Rope);
    let encoder = m.encoder_layers() as f64 * (self_attention + mlp + norms);
    let cross = if m.arch == Arch::Seq2seq {
        attention(false)
    } else {
        0.0
    };
    let decoder = m.decoder_layers() as f64 * (self_attention + cross + mlp + norms);
    // A learned position table per stack.
    let stacks = if m.arch == Arch::Seq2seq { 2.0 } else { 1.0 };
    let learned = match m.positions {
        Positions::Learned => stacks * m.max_seq_len as f64 * d,
        Positions::Rope | Positions::Sinusoidal | Positions::None => 0.0,
    };
    embeddings + learned + encoder + decoder
}

/// The batch shape that drives activation memory: tokens per micro-batch and the longest row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchShape {
    pub tokens: f64,
    pub longest: f64,
}

/// Training and evaluation batch shapes of `cfg` on `data` (token budgets capped by what the
/// data can fill, lengths by the longest example and `model.max_seq_len`).
pub(crate) fn batch_shapes(cfg: &RunConfig, batched: &Batched) -> (BatchShape, BatchShape) {
    let max_len = cfg.model.max_seq_len as f64;
    match *batched {
        Batched::Translation {
            splits: s,
            max_tokens,
        } => {
            let longest = |st: &ember_data::SplitStats| (st.max_source_len.max(st.max_target_len) + 1) as f64;
            let corpus_tokens = |st: &ember_data::SplitStats| (st.pairs as f64) * longest(st);
            let train_budget = max_tokens as f64;
            let train = BatchShape {
                tokens: train_budget.min(corpus_tokens(&s.train.stats)).max(1.0),
                longest: longest(&s.train.stats).min(max_len),
            };
            let eval = BatchShape {
                tokens: (cfg.eval.max_tokens as f64)
                    .min(corpus_tokens(&s.valid.stats))
                    .max(1.0),
                longest: longest(&s.valid.stats).min(max_len),
            };
            (train, eval)
        }
        Batched::Text {
            batch_size,
            block_size,
            ..
        } => {
            let shape = BatchShape {
                tokens: batch_size as f64 * block_size as f64,
                longest: block_size as f64,
            };
            (shape, shape)
        }
    }
}

/// Estimates the peak memory of training `m` on batches of `train` split into `shares` (and
/// evaluating on `eval`), its layers' activations kept or recomputed as `activations` says.
pub fn estimate(
    m: &ModelConfig,
    train: BatchShape,
    eval: BatchShape,
    shares: usize,
    activations: ActivationMemory,
) -> MemoryEstimate {
    let d = m.d_model as f64;
    let layers = (m.encoder_layers() + m.decoder_layers()) as f64;
    let cross_layers = if m.arch == Arch::Seq2seq {
        m.decoder_layers() as f64
    } else {
        0.0
    };
    let heads = m.n_heads as f64;
    let kv = (m.kv_heads() * m.head_dim()) as f64;
    let vocab = m.vocab() as f64;
    let per_batch = |b: BatchShape, kept: f64, memory: ActivationMemory| {
        // Per layer and token, kept for backward: the attention sub-block's norm, q, k, v and
        // output, and its scores per head over the row's length (per token: heads × L); a
        // decoder's cross-attention the same but k and v, which it reads from the encoder's
        // projections and holds either way; the feed-forward block's norm, hidden activations
        // and output.
        let sub_blocks = [
            (SubBlock::Attention, layers, kept * 5.0 * d + heads * b.longest),
            (
                SubBlock::Attention,
                cross_layers,
                kept * 3.0 * d + heads * b.longest,
            ),
            (
                SubBlock::FeedForward,
                layers,
                kept * (3.0 * d + 3.0 * m.d_ff as f64),
            ),
        ];
        // A sub-block that recomputes keeps its input in each layer (post-norm: its norm's
        // input too, the op's output), and one layer's activations live at a time in the
        // backward pass.
        let inputs_kept = if m.norm_placement == NormPlacement::Post {
            2.0
        } else {
            1.0
        };
        let all_layers: f64 = sub_blocks
            .iter()
            .filter(|&&(_, count, _)| count > 0.0)
            .map(|&(sub, count, per_layer_token)| match memory.recomputes(sub) {
                true => count * inputs_kept * d + per_layer_token,
                false => count * per_layer_token,
            })
            .sum();
        let cross_kv = cross_layers * 2.0 * kv;
        let logits = 3.0 * vocab; // logits, their gradient, the softmax
        b.tokens * (all_layers + cross_kv + logits) * F32
    };
    MemoryEstimate {
        parameters: (3.0 + shares.max(1) as f64) * parameter_count(m) * F32,
        activations: per_batch(train, 1.0, activations).max(per_batch(eval, 0.25, ActivationMemory::Keep)),
        // The rotary cos/sin tables (learned tables are parameters, counted above), at their
        // peak while built: per position and head dimension, cos and sin in f64 (16 bytes),
        // their f32 tensors (8) and the f32 half tables (4): 28 bytes, 7 f32s.
        positions: match m.positions {
            Positions::Rope => 7.0 * m.max_seq_len as f64 * m.head_dim() as f64 * F32,
            // The sinusoid table: one f32 per position and model dimension per stack.
            Positions::Sinusoidal => 2.0 * m.max_seq_len as f64 * m.d_model as f64 * F32,
            Positions::Learned | Positions::None => 0.0,
        },
    }
}

/// Memory this process can still use: `MemAvailable` from /proc/meminfo, or less where a
/// container's memory limit (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`) leaves less
/// (None where neither is known).
pub fn available_memory() -> Option<f64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let kib: f64 = text
            .lines()
            .find(|l| l.starts_with("MemAvailable:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some(kib * 1024.0)
    });
    let read = |path: &str| -> Option<f64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    let cgroup = [
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ]
    .iter()
    // "max" (no limit) does not parse; a v1 "no limit" is a huge number, which min() ignores.
    .find_map(|(limit, used)| Some((read(limit)? - read(used).unwrap_or(0.0)).max(0.0)));
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Peak memory of evaluating `m` on `windows` windows of `context` tokens in one forward pass
/// (no gradients, no optimizer): the weights, the batch's logits, one layer's activations, its
/// attention scores, probabilities and telemetry (context² per head and window) and the causal
/// mask, and the rotary tables extended to `context`.
pub fn estimate_eval(m: &ModelConfig, windows: usize, context: usize) -> f64 {
    let (w, n) = (windows as f64, context as f64);
    let d = m.d_model as f64;
    let tokens = w * n;
    let weights = parameter_count(m) * F32;
    let logits = 3.0 * tokens * m.vocab() as f64 * F32;
    let layer = tokens * (8.0 * d + 3.0 * m.d_ff as f64) * F32;
    let attention = 3.0 * w * m.n_heads as f64 * n * n * F32;
    let mask = n * n * F32;
    let rope = 2.0 * n * m.head_dim() as f64 * F32;
    weights + logits + layer + attention + mask + rope
}

/// Refuses `ember eval --context N` where one batch of windows cannot fit in this machine's
/// memory, before anything is allocated, saying which context would.
pub fn check_eval_context(m: &ModelConfig, windows: usize, context: usize) -> Result<()> {
    let Some(available) = available_memory() else {
        return Ok(());
    };
    let need = estimate_eval(m, windows, context);
    if need <= available {
        return Ok(());
    }
    let mut fits = context;
    while fits > 1 && estimate_eval(m, 1, fits) > available {
        fits /= 2;
    }
    let attention = 3.0 * windows as f64 * m.n_heads as f64 * (context as f64).powi(2) * F32;
    bail!(
        "--context {context}: evaluating {windows} window(s) of {context} tokens at once needs about {} \
         of memory (attention alone holds {context}² scores per head and window: {}), but this \
         machine has {} available. Use a shorter --context ({fits} fits here). Nothing was computed.",
        human(need),
        human(attention),
        human(available)
    )
}

/// Refuses a run whose estimate exceeds this machine's available memory, naming the keys that
/// drive the largest part.
pub fn check_memory(cfg: &RunConfig, data: &Dataset) -> Result<MemoryEstimate> {
    let batching = Batching::of(cfg)?;
    let (train, eval) = batch_shapes(cfg, &Batching::of_data(cfg, &data.splits)?);
    let e = estimate(&cfg.model, train, eval, cfg.shares(), cfg.train.activations);
    let Some(available) = available_memory() else {
        return Ok(e);
    };
    if e.total() <= available {
        return Ok(e);
    }
    let m = &cfg.model;
    let batch_keys = match batching {
        Batching::TokenBudget { max_tokens } => format!(
            "train.max_tokens = {max_tokens}, eval.max_tokens = {}",
            cfg.eval.max_tokens
        ),
        Batching::Windows {
            batch_size,
            block_size,
        } => format!("train.batch_size = {batch_size}, train.block_size = {block_size}"),
    };
    // An imported model's sizes are its weights': the way out is another model.
    let imported = m
        .init_from
        .as_ref()
        .map(|dir| {
            format!(
                "the model of model.init_from = {}, whose size is fixed: ",
                dir.display()
            )
        })
        .unwrap_or_default();
    let parts = [
        (
            e.parameters,
            "parameters, gradients and AdamW moments",
            format!(
                "{imported}model.d_model = {}, model.d_ff = {}, layers = {}, vocabulary = {}{}",
                m.d_model,
                m.d_ff,
                m.encoder_layers() + m.decoder_layers(),
                m.vocab(),
                if cfg.shares() > 1 {
                    format!(", train.shares = {}", cfg.shares())
                } else {
                    String::new()
                }
            ),
        ),
        (
            e.activations,
            "activations of one batch",
            format!(
                "{batch_keys}, model.d_model = {}, model.d_ff = {}",
                m.d_model, m.d_ff
            ),
        ),
        (
            e.positions,
            "rotary position tables",
            format!("model.max_seq_len = {}", m.max_seq_len),
        ),
    ];
    let largest = parts
        .iter()
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .expect("three parts");
    let advice = match (&m.init_from, std::ptr::eq(largest, &parts[0])) {
        (Some(_), true) if cfg.shares() > 1 => "start from a smaller model, or lower train.shares".into(),
        (Some(_), true) => "start from a smaller model".into(),
        // The activations are the largest part: recomputing them in the backward pass keeps
        // only the layers' inputs, where the model can.
        _ => match recompute_more(cfg).filter(|_| std::ptr::eq(largest, &parts[1])) {
            Some(memory) => format!(
                "lower those, or set train.activations: {memory} (the same results, a slower \
                 step), and try again"
            ),
            None => "lower those and try again".to_string(),
        },
    };
    bail!(
        "this config needs about {} of memory but this machine has {} available: {}. Most of it \
         is {} ({}); {advice}. No model was allocated and no run started (only the data's token \
         cache may have been written, for the next try).",
        human(e.total()),
        human(available),
        parts
            .iter()
            .map(|(b, what, _)| format!("{what} {}", human(*b)))
            .collect::<Vec<_>>()
            .join(", "),
        largest.1,
        largest.2
    )
}

/// `recompute`, where `cfg` does not set it already and its model can. Only attention
/// sub-blocks are ever refused (L2 QK-norm, log-n without rotary positions), and they are
/// `recompute_attention`'s too, so a model that cannot recompute everything cannot recompute
/// its attention alone either.
fn recompute_more(cfg: &RunConfig) -> Option<ActivationMemory> {
    let all = ActivationMemory::Recompute;
    let can = super::activations::recompute_refusals(cfg, all).is_empty();
    (cfg.train.activations != all && can).then_some(all)
}

/// `1.5 GiB`, `3.2e6 GiB` for the absurd.
pub fn human(bytes: f64) -> String {
    let gib = bytes / GIB;
    if gib >= 1e5 {
        format!("{gib:.1e} GiB")
    } else if gib >= 1.0 {
        format!("{gib:.1} GiB")
    } else {
        format!("{:.0} MiB", bytes / (1u64 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_count_matches_the_quickstart_model() {
        // configs/quickstart.yaml: 522,112 parameters as the trainer reports them.
        let mut m = ModelConfig::tiny(Arch::Seq2seq);
        m.d_model = 128;
        m.n_layers = Some(1);
        m.n_heads = 4;
        m.d_ff = 256;
        m.mlp = MlpKind::Swiglu;
        m.vocab_size = Some(1000);
        let n = parameter_count(&m);
        assert!((n / 522_112.0 - 1.0).abs() < 0.05, "{n}");
    }

    #[test]
    fn learned_positions_count_one_table_per_stack() {
        for (arch, stacks) in [(Arch::Lm, 1.0), (Arch::Seq2seq, 2.0)] {
            let rope = ModelConfig::tiny(arch);
            let learned = ModelConfig {
                positions: Positions::Learned,
                ..rope.clone()
            };
            let table = (rope.max_seq_len * rope.d_model) as f64;
            assert_eq!(parameter_count(&learned) - parameter_count(&rope), stacks * table);
        }
    }

    #[test]
    fn qkv_biases_count_one_value_per_query_key_and_value_output() {
        let plain = ModelConfig {
            head_dim: Some(8),
            n_kv_heads: Some(2),
            ..ModelConfig::tiny(Arch::Lm)
        };
        let biased = ModelConfig {
            qkv_bias: true,
            ..plain.clone()
        };
        let per_layer = (plain.n_heads * 8 + 2 * 2 * 8) as f64;
        assert_eq!(
            parameter_count(&biased) - parameter_count(&plain),
            plain.decoder_layers() as f64 * per_layer
        );
    }

    /// fairseq's biases add to the count what they add to the model, rotated or not, with either
    /// MLP.
    #[test]
    fn fairseqs_biases_count_as_many_values_as_they_add_to_the_model() {
        let held = |m: &ModelConfig| {
            let (_, params) =
                ember_model::init_model(m, 1, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
            params.vars().iter().map(|(_, v)| v.elem_count()).sum::<usize>() as f64
        };
        for (arch, positions) in [
            (Arch::Seq2seq, Positions::Sinusoidal),
            (Arch::Seq2seq, Positions::Rope),
            (Arch::Lm, Positions::Rope),
        ] {
            for mlp in [MlpKind::Relu, MlpKind::Swiglu] {
                let plain = ModelConfig {
                    positions,
                    mlp,
                    ..ModelConfig::tiny(arch)
                };
                let biased = ModelConfig {
                    proj_bias: true,
                    ..plain.clone()
                };
                assert_eq!(
                    parameter_count(&biased) - parameter_count(&plain),
                    held(&biased) - held(&plain),
                    "{arch:?} {positions:?} {mlp:?}"
                );
            }
        }
    }

    #[test]
    fn an_evaluation_context_grows_with_its_square_and_absurd_ones_are_refused() {
        let m = ModelConfig::tiny(Arch::Lm);
        let (a, b) = (estimate_eval(&m, 1, 4096), estimate_eval(&m, 1, 8192));
        assert!(b > 3.5 * a, "{a} {b}");
        // 2^20 tokens of context: terabytes, on any machine.
        let e = check_eval_context(&m, 1, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("--context 1048576") && e.contains("fits here"), "{e}");
        check_eval_context(&m, 1, 64).expect("a small context fits");
    }

    /// A language model 24 layers deep, where what a layer keeps dominates the estimate.
    fn deep_lm() -> ModelConfig {
        ModelConfig {
            n_layers: Some(24),
            ..ModelConfig::tiny(Arch::Lm)
        }
    }

    /// A training batch of 16 rows of 256 tokens.
    const TRAIN_BATCH: BatchShape = BatchShape {
        tokens: 4096.0,
        longest: 256.0,
    };

    /// Evaluation on one token, so that training's activations are the larger.
    const ONE_TOKEN: BatchShape = BatchShape {
        tokens: 1.0,
        longest: 1.0,
    };

    /// Recomputing, a stack holds its layers' inputs and one layer's activations: the estimate
    /// of a deep stack's activations falls by about its depth, and the parameters' stays.
    /// Recomputing the attention sub-blocks alone saves a part of that.
    #[test]
    fn recomputed_activations_count_one_layer_and_the_layers_inputs() {
        let m = deep_lm();
        let [kept, all, attention] =
            ActivationMemory::ALL.map(|memory| estimate(&m, TRAIN_BATCH, ONE_TOKEN, 1, memory));
        assert_eq!(kept.parameters, all.parameters);
        let ratio = all.activations / kept.activations;
        assert!((0.04..0.25).contains(&ratio), "{ratio}");
        let (all, attention, kept) = (all.activations, attention.activations, kept.activations);
        assert!(all < attention && attention < kept, "{all} {attention} {kept}");
    }

    /// A post-norm sub-block that recomputes holds the op's output (its norm's input) beside
    /// its own input: one vector of d more per token, layer and sub-block than a pre-norm one
    /// under `recompute`, and nothing more under `keep`.
    #[test]
    fn a_recomputing_post_norm_sub_block_holds_two_inputs() {
        let pre = deep_lm();
        let post = ModelConfig {
            norm_placement: NormPlacement::Post,
            ..pre.clone()
        };
        let activations =
            |m: &ModelConfig, memory| estimate(m, TRAIN_BATCH, ONE_TOKEN, 1, memory).activations;
        let keep = ActivationMemory::Keep;
        assert_eq!(activations(&post, keep), activations(&pre, keep));
        let recompute = ActivationMemory::Recompute;
        let more = activations(&post, recompute) - activations(&pre, recompute);
        let expected = TRAIN_BATCH.tokens * 24.0 * 2.0 * pre.d_model as f64 * F32;
        assert!((more - expected).abs() < 1e-6 * expected, "{more} {expected}");
    }

    /// A translation decoder's cross-attention holds activations of its own beside its
    /// self-attention's, and recomputing them still holds the encoder's keys and values it
    /// reads: against a language model with as many layers, a translation model's estimate is
    /// larger by more under `keep` than under `recompute`, and by at least those keys and values.
    #[test]
    fn a_decoders_cross_attention_counts_and_holds_its_keys_and_values() {
        let seq2seq = ModelConfig {
            n_layers: Some(6),
            ..ModelConfig::tiny(Arch::Seq2seq)
        };
        let lm = ModelConfig {
            n_layers: Some(12),
            ..ModelConfig::tiny(Arch::Lm)
        };
        assert_eq!(
            seq2seq.encoder_layers() + seq2seq.decoder_layers(),
            lm.decoder_layers()
        );
        let shape = BatchShape {
            tokens: 4096.0,
            longest: 64.0,
        };
        let more = |memory| {
            let activations = |m: &ModelConfig| estimate(m, shape, shape, 1, memory).activations;
            activations(&seq2seq) - activations(&lm)
        };
        let keys_values = shape.tokens * 6.0 * 2.0 * (lm.kv_heads() * lm.head_dim()) as f64 * F32;
        let (kept, recomputed) = (more(ActivationMemory::Keep), more(ActivationMemory::Recompute));
        assert!(
            kept > recomputed && recomputed > keys_values,
            "{kept} {recomputed} {keys_values}"
        );
    }

    /// A config out of memory because of its activations is pointed at recomputing them: all
    /// where the model can (every sub-block but an attention sub-block the ops do not cover),
    /// else nothing more.
    #[test]
    fn the_advice_recomputes_what_the_model_can() {
        let advice_for = |config: &str, sets: &[&str]| {
            let path = format!("{}/../../configs/{config}", env!("CARGO_MANIFEST_DIR"));
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            let cfg = RunConfig::load(std::path::Path::new(&path), &sets).unwrap();
            recompute_more(&cfg)
        };
        let advice = |sets: &[&str]| advice_for("shakespeare-char.yaml", sets);
        assert_eq!(advice(&[]), Some(ActivationMemory::Recompute));
        assert_eq!(advice(&["model.mlp=relu"]), Some(ActivationMemory::Recompute));
        assert_eq!(
            advice(&["train.activations=recompute_attention"]),
            Some(ActivationMemory::Recompute)
        );
        assert_eq!(advice(&["train.activations=recompute"]), None);
        assert_eq!(
            advice(&["model.norm_placement=post", "model.proj_bias=true"]),
            Some(ActivationMemory::Recompute)
        );
        // L2 QK-norm's attention runs op by op: neither setting recomputes it.
        assert_eq!(advice(&["model.qk_norm=l2"]), None);
        // Translation models recompute (cross-attention too), fairseq's post-norm
        // Transformer-Tiny as well.
        assert_eq!(
            advice_for("quickstart.yaml", &[]),
            Some(ActivationMemory::Recompute)
        );
        assert_eq!(
            advice_for("multi30k-tiny-wu.yaml", &[]),
            Some(ActivationMemory::Recompute)
        );
    }

    #[test]
    fn absurd_sizes_give_finite_huge_estimates() {
        let mut m = ModelConfig::tiny(Arch::Lm);
        m.max_seq_len = usize::MAX;
        m.d_model = usize::MAX;
        m.vocab_size = Some(usize::MAX);
        let shape = BatchShape {
            tokens: 1e30,
            longest: 1e20,
        };
        let e = estimate(&m, shape, shape, 1, ActivationMemory::Keep);
        assert!(e.total() > 1e20 && !e.total().is_nan());
    }
}
