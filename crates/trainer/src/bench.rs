//! `ember bench`: training throughput of a config, measured in process.
//!
//! Runs warm-up steps, then N timed steps of the very step `ember train` runs
//! (`Training::step`, set up in memory by `Training::in_memory`: same batches, loss,
//! clipping and AdamW, without checkpoints or evaluation), and reports the
//! median and spread of the step time with its forward / backward / optimizer split, tokens/s,
//! peak RSS, model FLOPs per token and the achieved GFLOP/s against a matmul peak measured on
//! the spot.

use std::rc::Rc;
use std::time::Instant;

use anyhow::Result;
use candle_core::{Device, Tensor};
use ember_data::Batch;
use ember_distributed::World;
use ember_kernels::{ActivationMemory, Precision};
use ember_model::{Arch, ModelConfig};
use serde::Serialize;

use crate::config::RunConfig;
use crate::data_parallel::DataParallel;
use crate::step::training::{Stepped, Training};

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub steps: usize,
    pub warmup: usize,
    pub params: usize,
    pub threads: usize,
    /// Shares each micro-batch is split into in this process (`train.shares` resolved).
    pub shares: usize,
    /// Ranks of the data-parallel job that ran the benchmark (1: one process); `threads` is per rank.
    pub ranks: usize,
    pub ms_per_step_median: f64,
    pub ms_per_step_p10: f64,
    pub ms_per_step_p90: f64,
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub optimizer_ms: f64,
    /// Waiting for the slowest rank, then summing the gradients across ranks (0 for one
    /// process), medians per step.
    pub wait_ms: f64,
    pub comm_ms: f64,
    /// Median over steps of tokens per second; tokens are target tokens (LM: batch × block).
    pub tokens_per_sec: f64,
    pub tokens_per_step: f64,
    /// Peak resident memory, summed over the ranks of a job.
    pub peak_rss_mib: f64,
    /// The most heap memory in use at once ([`crate::heap`]), summed over the ranks; `None`
    /// where the allocator does not count it (anything but the `ember` binary on Linux/glibc).
    pub peak_heap_mib: Option<f64>,
    /// Forward+backward FLOPs per target token (6 × matmul parameters + attention), analytic.
    pub flops_per_token: f64,
    pub achieved_gflops: f64,
    /// Single-matmul throughput in the run's precision, measured now at d_model-sized and 1024²
    /// shapes.
    pub matmul_peak_gflops: f64,
    pub utilisation: f64,
    /// `train.precision` of the benchmarked step (`f32` or `bf16`), and what its CPU products
    /// run on (e.g. `bf16 products on AVX512_BF16 (vdpbf16ps), f32 sums`).
    pub precision: String,
    pub products: String,
    /// `train.activations` of the benchmarked step: `keep`, `recompute` or
    /// `recompute_attention` (whose recomputed forward passes `flops_per_token` leaves out, as
    /// model FLOPs do).
    pub activations: ActivationMemory,
}

impl BenchReport {
    /// What was recomputed, for the report's first line ([`crate::activations::note`]).
    pub fn activations_note(&self) -> &'static str {
        crate::activations::note(self.activations)
    }
}

/// Peak resident set size of this process (Linux `VmHWM`), in MiB.
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Analytic training FLOPs per target token, PaLM-style (Chowdhery et al. 2022, app. B):
/// 6 per weight per token (2 forward, 4 backward) plus 12·d per attended position per layer.
/// For seq2seq the encoder's work per source token is charged pro rata to the target tokens.
pub fn flops_per_token(cfg: &ModelConfig, src_len: f64, tgt_len: f64) -> f64 {
    let d = cfg.d_model as f64;
    let (q, kv) = (cfg.q_width() as f64, (cfg.kv_heads() * cfg.head_dim()) as f64);
    let attn_proj = 2.0 * d * q + 2.0 * d * kv;
    let mlp = match cfg.mlp {
        ember_model::MlpKind::Swiglu => 3.0 * d * cfg.d_ff as f64,
        ember_model::MlpKind::Gelu | ember_model::MlpKind::Relu => 2.0 * d * cfg.d_ff as f64,
    };
    let layer = attn_proj + mlp;
    let head = cfg.vocab() as f64 * d;
    let n = cfg.decoder_layers() as f64;
    match cfg.arch {
        Arch::Lm => 6.0 * (n * layer + head) + 12.0 * n * d * tgt_len,
        Arch::Seq2seq => {
            let e = cfg.encoder_layers() as f64;
            let encoder_per_source_token = 6.0 * e * layer + 12.0 * e * d * src_len;
            let decoder = 6.0 * (n * (layer + attn_proj) + head) + 12.0 * n * d * (tgt_len + src_len);
            encoder_per_source_token * src_len / tgt_len.max(1.0) + decoder
        }
    }
}

/// Matmul GFLOP/s at n×n in `precision` (best of a few runs).
fn matmul_gflops(n: usize, device: &Device, precision: Precision) -> Result<f64> {
    let a = Tensor::randn(0f32, 1.0, (n, n), device)?;
    let b = Tensor::randn(0f32, 1.0, (n, n), device)?;
    let reps = (2_000_000_000 / (2 * n * n * n)).clamp(1, 200);
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps {
            // The model's own matmul path (`kernels::linear`: SGEMM on CPU, cuBLAS on CUDA).
            let _ = ember_kernels::linear_in(&a, &b, precision)?;
        }
        device.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    Ok(2.0 * (n * n * n) as f64 / best / 1e9)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Benchmarks `cfg`'s training step; as a rank of a job (`world`), its share of the job's step,
/// whose gradients the ranks sum as `ember train` does. Every rank returns the report.
pub fn bench(cfg: RunConfig, steps: usize, warmup: usize, world: Rc<World>) -> Result<BenchReport> {
    let total_steps = steps
        .checked_add(warmup)
        .filter(|_| steps > 0)
        .ok_or_else(|| anyhow::anyhow!("bench needs at least 1 timed step and fewer than 2^64 in all"))?;
    let dp = DataParallel::new(world, cfg.shares(), cfg.distributed.bucket_mib);
    // Measured (a few products) where it is told: the leader alone, as a training run does, so
    // that ranks sharing a machine do not time their products against each other.
    if let Some(note) = dp
        .is_leader()
        .then(|| crate::precision::products_note(&cfg))
        .flatten()
    {
        crate::tell!("note: {note}");
    }
    let mut run = Training::in_memory(cfg, total_steps as u64, &dp)?;
    let mut timings = Timings::default();
    for step in 0..total_steps {
        // The very step `ember train` runs (telemetry off, as on non-logging steps).
        let mut stepped = run.step(&dp, step as u64 + 1, false, None, None)?;
        stepped.out.grads.clear();
        // A GPU's queued work is done before the clock is read.
        run.device.synchronize()?;
        if step >= warmup {
            timings.add(&stepped);
        }
    }
    timings.report(&run, &dp, steps, warmup)
}

/// The timed steps' times and token counts.
#[derive(Default)]
struct Timings {
    total: Vec<f64>,
    forward: Vec<f64>,
    backward: Vec<f64>,
    optimizer: Vec<f64>,
    wait: Vec<f64>,
    comm: Vec<f64>,
    rates: Vec<f64>,
    src_tokens: f64,
    tgt_tokens: f64,
    rows: f64,
}

impl Timings {
    /// Adds a step that has just completed (its device work included).
    fn add(&mut self, stepped: &Stepped) {
        let out = &stepped.out;
        let secs = stepped.began.elapsed().as_secs_f64();
        self.total.push(secs * 1e3);
        self.forward.push(out.forward_secs * 1e3);
        self.backward.push(out.backward_secs * 1e3);
        self.optimizer
            .push(stepped.update_began.elapsed().as_secs_f64() * 1e3);
        self.wait.push(out.wait_secs * 1e3);
        self.comm.push(out.comm_secs * 1e3);
        self.rates.push(out.tokens as f64 / secs);
        for batch in &stepped.batches {
            match batch {
                Batch::Seq2Seq(s) => {
                    self.src_tokens += s.n_src_tokens as f64;
                    self.tgt_tokens += s.n_tgt_tokens as f64;
                    self.rows += s.batch_size as f64;
                }
                Batch::Lm(l) => {
                    self.tgt_tokens += l.target.len() as f64;
                    self.rows += l.batch_size as f64;
                }
            }
        }
    }

    /// The report of `steps` timed steps after `warmup`, with the matmul peak measured now and
    /// the peak memory summed over the ranks.
    fn report(
        mut self,
        run: &Training,
        dp: &DataParallel,
        steps: usize,
        warmup: usize,
    ) -> Result<BenchReport> {
        let cfg = &run.cfg;
        let tokens_per_step = self.tgt_tokens / steps as f64;
        let rows = self.rows.max(1.0);
        let (src_len, tgt_len) = (self.src_tokens / rows, self.tgt_tokens / rows);
        let fpt = flops_per_token(&cfg.model, src_len, tgt_len);
        let tokens_per_sec = median(&mut self.rates);
        let achieved = fpt * tokens_per_sec / 1e9;
        let precision = run.model.precision();
        let peak = matmul_gflops(1024, &run.device, precision)?.max(matmul_gflops(
            cfg.model.d_model.max(64) * 4,
            &run.device,
            precision,
        )?);
        let heap = crate::heap::peak_mib();
        let mut memory = [peak_rss_mib(), heap.unwrap_or(0.0)];
        dp.world()
            .all_reduce_sum_f64(&mut memory, "the benchmark's memory report");
        let [rss, heap_sum] = memory;
        let (p10, p90) = {
            let mut v = self.total.clone();
            v.sort_by(|a, b| a.total_cmp(b));
            (v[v.len() / 10], v[(v.len() * 9) / 10])
        };
        Ok(BenchReport {
            steps,
            warmup,
            params: run.params.num_params(),
            threads: ember_kernels::par::threads(),
            shares: cfg.shares(),
            ranks: dp.world().size(),
            ms_per_step_median: median(&mut self.total),
            ms_per_step_p10: p10,
            ms_per_step_p90: p90,
            forward_ms: median(&mut self.forward),
            backward_ms: median(&mut self.backward),
            optimizer_ms: median(&mut self.optimizer),
            wait_ms: median(&mut self.wait),
            comm_ms: median(&mut self.comm),
            tokens_per_sec,
            tokens_per_step,
            peak_rss_mib: rss,
            peak_heap_mib: heap.map(|_| heap_sum),
            flops_per_token: fpt,
            achieved_gflops: achieved,
            matmul_peak_gflops: peak,
            utilisation: achieved / peak,
            precision: precision.name().into(),
            products: crate::precision::describe_products(cfg),
            activations: cfg.train.activations,
        })
    }
}
