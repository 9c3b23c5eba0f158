//! `ember bench`: training throughput of a config, measured in process.
//!
//! Runs warm-up steps, then N timed steps of the real training step (same batches, loss,
//! clipping and AdamW as `ember train`, without checkpoints or evaluation), and reports the
//! median and spread of the step time with its forward / backward / optimizer split, tokens/s,
//! peak RSS, model FLOPs per token and the achieved GFLOP/s against a matmul peak measured on
//! the spot.

use std::rc::Rc;
use std::time::Instant;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use ember_data::{Batch, Dataset};
use ember_distributed::World;
use ember_model::{init_model, Arch, ModelConfig};
use serde::Serialize;

use crate::config::RunConfig;
use crate::data_parallel::DataParallel;
use crate::optim::{AdamW, LrSchedule};
use crate::setup::{device, make_batcher, resolve_model_config, set_threads};
use crate::step::micro_batches;
use crate::update::Updater;

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
    /// Forward+backward FLOPs per target token (6 × matmul parameters + attention), analytic.
    pub flops_per_token: f64,
    pub achieved_gflops: f64,
    /// Single-matmul f32 throughput measured now at d_model-sized and 1024² shapes.
    pub matmul_peak_gflops: f64,
    pub utilisation: f64,
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
        ember_model::MlpKind::Gelu => 2.0 * d * cfg.d_ff as f64,
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

/// f32 matmul GFLOP/s at n×n (best of a few runs).
fn matmul_gflops(n: usize, device: &Device) -> Result<f64> {
    let a = Tensor::randn(0f32, 1.0, (n, n), device)?;
    let b = Tensor::randn(0f32, 1.0, (n, n), device)?;
    let reps = (2_000_000_000 / (2 * n * n * n)).clamp(1, 200);
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps {
            // The model's own matmul path (`kernels::linear`: SGEMM on CPU, cuBLAS on CUDA).
            let _ = ember_kernels::linear(&a, &b)?;
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
pub fn bench(mut cfg: RunConfig, steps: usize, warmup: usize, world: Rc<World>) -> Result<BenchReport> {
    set_threads(&cfg)?;
    let device = device(&cfg.device)?;
    let mut data = Dataset::prepare(&cfg.data, None)?;
    resolve_model_config(&mut cfg, &data)?;
    ember_data::fit_to_positions(&mut data.splits, &cfg.data, cfg.model.max_seq_len)?;
    crate::limits::check_memory(&cfg, &data)?;
    let total_steps = steps
        .checked_add(warmup)
        .filter(|_| steps > 0)
        .ok_or_else(|| anyhow::anyhow!("bench needs at least 1 timed step and fewer than 2^64 in all"))?;
    let (model, params) = init_model(&cfg.model, cfg.train.seed, DType::F32, &device)?;
    let mut batcher = make_batcher(&cfg, &data)?;
    let mut opt = AdamW::new(params.vars(), &cfg.train)?;
    let dp = DataParallel::new(world, cfg.shares(), cfg.distributed.bucket_mib);
    let mut updater = Updater::new(&device, &opt, 0, !dp.world().is_launched())?;
    let schedule = LrSchedule::new(&cfg.train, total_steps as u64);
    let t = &cfg.train;
    let (mut total, mut fwd, mut bwd, mut optim) = (vec![], vec![], vec![], vec![]);
    let (mut wait, mut comm, mut rates) = (vec![], vec![], vec![]);
    let (mut src_tokens, mut tgt_tokens, mut rows) = (0f64, 0f64, 0f64);
    for step in 0..total_steps {
        let batches = micro_batches(batcher.as_mut(), t.accumulation);
        let start = Instant::now();
        // The very step `ember train` runs (telemetry off, as on non-logging steps).
        let mut out = dp
            .forward_backward(
                &model,
                opt.params(),
                &batches,
                t,
                &device,
                step as u64 + 1,
                false,
                None,
            )?
            .out;
        let (n_tokens, f, b) = (out.tokens, out.forward_secs, out.backward_secs);
        let (w, c) = (out.wait_secs, out.comm_secs);
        let t2 = Instant::now();
        // The update `ember train` applies, judged where it judges it (host, or the device).
        updater.update(
            &mut opt,
            &out,
            schedule.at(step as u64 + 1),
            step as u64 + 1,
            None,
            t,
        )?;
        out.grads.clear();
        // A GPU's queued work is done before the clock is read.
        device.synchronize()?;
        let o = t2.elapsed().as_secs_f64();
        let secs = start.elapsed().as_secs_f64();
        if step >= warmup {
            total.push(secs * 1e3);
            fwd.push(f * 1e3);
            bwd.push(b * 1e3);
            optim.push(o * 1e3);
            wait.push(w * 1e3);
            comm.push(c * 1e3);
            rates.push(n_tokens as f64 / secs);
            for batch in &batches {
                match batch {
                    Batch::Seq2Seq(s) => {
                        src_tokens += s.n_src_tokens as f64;
                        tgt_tokens += s.n_tgt_tokens as f64;
                        rows += s.batch_size as f64;
                    }
                    Batch::Lm(l) => {
                        tgt_tokens += l.target.len() as f64;
                        rows += l.batch_size as f64;
                    }
                }
            }
        }
    }
    let tokens_per_step = tgt_tokens / steps as f64;
    let (src_len, tgt_len) = (src_tokens / rows.max(1.0), tgt_tokens / rows.max(1.0));
    let fpt = flops_per_token(&cfg.model, src_len, tgt_len);
    let tokens_per_sec = median(&mut rates);
    let achieved = fpt * tokens_per_sec / 1e9;
    let peak = matmul_gflops(1024, &device)?.max(matmul_gflops(cfg.model.d_model.max(64) * 4, &device)?);
    let mut rss = [peak_rss_mib()];
    dp.world()
        .all_reduce_sum_f64(&mut rss, "the benchmark's memory report");
    let rss = rss[0];
    let (p10, p90) = {
        let mut v = total.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        (v[v.len() / 10], v[(v.len() * 9) / 10])
    };
    Ok(BenchReport {
        steps,
        warmup,
        params: params.num_params(),
        threads: ember_kernels::par::threads(),
        shares: cfg.shares(),
        ranks: dp.world().size(),
        ms_per_step_median: median(&mut total),
        ms_per_step_p10: p10,
        ms_per_step_p90: p90,
        forward_ms: median(&mut fwd),
        backward_ms: median(&mut bwd),
        optimizer_ms: median(&mut optim),
        wait_ms: median(&mut wait),
        comm_ms: median(&mut comm),
        tokens_per_sec,
        tokens_per_step,
        peak_rss_mib: rss,
        flops_per_token: fpt,
        achieved_gflops: achieved,
        matmul_peak_gflops: peak,
        utilisation: achieved / peak,
    })
}
