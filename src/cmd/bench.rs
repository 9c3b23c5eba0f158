//! `ember bench`: measures the training throughput of a config (alone or as a data-parallel
//! job), with the time of each part of a step and the share of the machine's matmul peak.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::{load_and_join, print_result};

/// `bench --steps` / `--warmup` bound: a million steps is days of benchmarking.
const MAX_BENCH_STEPS: u64 = 1_000_000;

#[derive(Args)]
pub(crate) struct BenchArgs {
    config: PathBuf,
    /// Override a config key, e.g. `--set train.threads=1` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Timed steps (after the warm-up; 1 to 1,000,000).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=MAX_BENCH_STEPS))]
    steps: u64,
    /// Untimed warm-up steps (at most 1,000,000).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=MAX_BENCH_STEPS))]
    warmup: u64,
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: BenchArgs) -> Result<()> {
    let (cfg, world) = load_and_join(&args.config, &args.set)?;
    let r = ember_trainer::bench::bench(cfg, args.steps as usize, args.warmup as usize, world.clone())?;
    if !world.is_leader() {
        return Ok(());
    }
    print_result(args.json, &r, || {
        format!(
            "{}: {} params, {}{} threads, {} shares{}, {}, {:.0} tokens/step\n\
             step {:.1} ms median (p10 {:.1}, p90 {:.1}) = forward {:.1} + backward {:.1} + optimizer {:.1}{}\n\
             {:.0} tokens/s | peak RSS {:.0} MiB{} | {:.0} FLOPs/token → {:.1} GFLOP/s of a {:.1} GFLOP/s matmul peak ({:.0}%)",
            args.config.display(),
            r.params,
            if r.ranks > 1 { format!("{} ranks x ", r.ranks) } else { String::new() },
            r.threads,
            r.shares,
            r.activations_note(),
            r.products,
            r.tokens_per_step,
            r.ms_per_step_median,
            r.ms_per_step_p10,
            r.ms_per_step_p90,
            r.forward_ms,
            r.backward_ms,
            r.optimizer_ms,
            if r.ranks > 1 { format!(" (waiting for the slowest rank {:.1}, gradient all-reduce {:.1})", r.wait_ms, r.comm_ms) } else { String::new() },
            r.tokens_per_sec,
            r.peak_rss_mib,
            r.peak_heap_mib.map_or(String::new(), |h| format!(" (heap in use at most {h:.0} MiB)")),
            r.flops_per_token,
            r.achieved_gflops,
            r.matmul_peak_gflops,
            100.0 * r.utilisation
        )
    })
}
