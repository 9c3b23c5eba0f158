//! Decoding speed of greedy and beam-5 search, with and without the KV cache, as the output
//! grows. With the cache, step t runs the decoder on one new position per hypothesis and only
//! its attention reads the t cached keys, so time per sentence grows about linearly with the
//! output length T (×2 per doubling). Without it every step re-runs the decoder over the whole
//! prefix, t positions, so time grows with T² (×4 per doubling). (The uncached step goes
//! through `Seq2Seq::decode`, which also projects every prefix position onto the vocabulary.)
//!
//! `cargo run --release -p ember-model --example decode_speed -- [--sentences 8]
//! [--lengths 16,32,64,128] [--modes kv,none] [--repeats 3]` (the defaults). `--modes` picks
//! the cached (`kv`) or uncached (`none`) runs; each time is the best of `--repeats` runs, the
//! one least disturbed by whatever else the machine is doing; on Linux the CPU time of the
//! process is shown too, which other processes' load does not inflate.
//!
//! The model is a randomly initialised Transformer-Tiny-like seq2seq (4+4 layers, d=128,
//! FFN 256, 4 heads, 10k vocabulary); sources have 20 tokens, and every output is forced to
//! exactly the given length (EOS suppressed until then, forced there), so the numbers measure
//! the search, not what an untrained model happens to say.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use ember_model::{beam_search, greedy, BeamConfig};
use ember_model::{init_model, Arch, MlpKind, ModelConfig, NormKind, Seq2Seq};
use ember_rng::SplitMix64;

const BOS: u32 = 1;
const EOS: u32 = 2;
const SRC_LEN: usize = 20;

fn main() -> candle_core::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let sentences: usize = flag("--sentences").map_or(8, |a| a.parse().expect("--sentences N"));
    let repeats: usize = flag("--repeats").map_or(3, |a| a.parse().expect("--repeats N"));
    let lengths: Vec<usize> = flag("--lengths").map_or(vec![16, 32, 64, 128], |a| {
        a.split(',')
            .map(|l| l.parse().expect("--lengths: comma-separated numbers"))
            .collect()
    });
    let modes = flag("--modes").unwrap_or("kv,none");
    let cache_modes: Vec<bool> = [(true, "kv"), (false, "none")]
        .into_iter()
        .filter(|(_, name)| modes.split(',').any(|m| m == *name))
        .map(|(use_cache, _)| use_cache)
        .collect();

    let mut c = ModelConfig::tiny(Arch::Seq2seq);
    c.vocab_size = Some(10_000);
    c.d_model = 128;
    c.n_layers = Some(4);
    c.n_heads = 4;
    c.d_ff = 256;
    c.mlp = MlpKind::Gelu;
    c.norm = NormKind::Layernorm;
    c.max_seq_len = 512;
    let (model, _) = init_model(&c, 0, DType::F32, &Device::Cpu).map_err(candle_core::Error::wrap)?;
    let m = model.as_seq2seq().expect("a seq2seq config");
    let mut rng = SplitMix64::new(0);
    let ids: Vec<u32> = (0..sentences * SRC_LEN)
        .map(|_| 4 + (rng.next_u64() % 9_996) as u32)
        .collect();
    let src = Tensor::from_vec(ids, (sentences, SRC_LEN), &Device::Cpu)?;

    println!(
        "seq2seq 4+4 layers, d128, ff256, 4 heads, V10k; {sentences} sentences of {SRC_LEN} source tokens per batch; \
         candle CPU, {} threads; best of {repeats}",
        candle_core::utils::get_num_threads()
    );
    println!(
        "{:<7} {:<5} {:>6} {:>12} {:>12} {:>9} {:>16} {:>15}",
        "search",
        "cache",
        "length",
        "ms/sentence",
        "sentences/s",
        "×/double",
        "CPU ms/sentence",
        "CPU ×/double"
    );
    // Warm-up: first-touch allocations and thread-pool start-up.
    run(m, &src, 5, 8, true)?;
    for (beam, name) in [(1, "greedy"), (5, "beam-5")] {
        for &use_cache in &cache_modes {
            let mut previous: Option<(usize, f64, Option<f64>)> = None;
            for &len in &lengths {
                let (mut wall, mut cpu) = (f64::INFINITY, None::<f64>);
                for _ in 0..repeats.max(1) {
                    let (w, c) = run(m, &src, beam, len, use_cache)?;
                    wall = wall.min(w);
                    cpu = match (cpu, c) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                let per = |ms: f64| ms / sentences as f64;
                let (wall, cpu) = (per(wall), cpu.map(per));
                let ratio = |now: Option<f64>, before: Option<f64>| match (previous, now, before) {
                    (Some((l, ..)), Some(a), Some(b)) if len == 2 * l => format!("{:.2}", a / b),
                    _ => "-".into(),
                };
                println!(
                    "{name:<7} {:<5} {len:>6} {wall:>12.2} {:>12.1} {:>9} {:>16} {:>15}",
                    if use_cache { "kv" } else { "none" },
                    1e3 / wall,
                    ratio(Some(wall), previous.map(|p| p.1)),
                    cpu.map_or("-".into(), |c| format!("{c:.2}")),
                    ratio(cpu, previous.and_then(|p| p.2)),
                );
                previous = Some((len, wall, cpu));
            }
        }
    }
    Ok(())
}

/// Wall-clock and CPU milliseconds to decode the batch to exactly `len` tokens per sentence.
fn run(
    m: &Seq2Seq,
    src: &Tensor,
    beam: usize,
    len: usize,
    use_cache: bool,
) -> candle_core::Result<(f64, Option<f64>)> {
    let cfg = BeamConfig {
        beam_size: beam,
        n_best: 1,
        max_len_a: 0.0,
        max_len_b: len,
        min_len: len,
        use_cache,
        ..BeamConfig::default()
    };
    let (start, cpu_start) = (Instant::now(), cpu_ns());
    let lengths: Vec<usize> = if beam == 1 {
        greedy(m, src, None, BOS, EOS, &cfg)?
            .iter()
            .map(|h| h.tokens.len())
            .collect()
    } else {
        beam_search(m, src, None, BOS, EOS, &cfg)?
            .iter()
            .map(|l| l[0].tokens.len())
            .collect()
    };
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let cpu_ms = cpu_start
        .zip(cpu_ns())
        .map(|(a, b)| b.saturating_sub(a) as f64 / 1e6);
    assert!(
        lengths.iter().all(|&l| l == len),
        "outputs of {lengths:?}, not {len}"
    );
    Ok((ms, cpu_ms))
}

/// CPU time of all this process's threads, in nanoseconds (Linux): unlike wall-clock time it
/// does not count the time other processes hold the cores, so it keeps the growth ratios
/// readable on a shared machine.
fn cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}
