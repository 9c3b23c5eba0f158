//! Parameter counts and forward+backward time for the two reference shapes.
//!
//! `cargo run --release -p ember-model --example fwd_bwd` — times are the median of 20 steps
//! after 3 warm-up steps, on random tokens, with a plain sum-of-logits loss.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use ember_model::{init_model, Arch, ForwardCtx, MlpKind, ModelConfig, NormKind, QkNorm};
use ember_rng::SplitMix64;

fn ids(b: usize, t: usize, vocab: usize, rng: &mut SplitMix64) -> Tensor {
    let v: Vec<u32> = (0..b * t)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect();
    Tensor::from_vec(v, (b, t), &Device::Cpu).unwrap()
}

fn median_ms(mut f: impl FnMut()) -> (f64, f64, f64) {
    for _ in 0..3 {
        f();
    }
    let mut times: Vec<f64> = (0..20)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    (times[times.len() / 2], times[2], times[17])
}

fn main() {
    let mut rng = SplitMix64::new(0);
    for qk in [QkNorm::None, QkNorm::Rmsnorm] {
        // Transformer-Tiny-like: 4+4 layers, d=128, FFN 256, 4 heads, 10k joint vocab; a
        // 4096-token batch of 64 pairs × 32 source and 32 target tokens.
        let mut s2s = ModelConfig::tiny(Arch::Seq2seq);
        s2s.vocab_size = Some(10_000);
        s2s.d_model = 128;
        s2s.n_layers = Some(4);
        s2s.n_heads = 4;
        s2s.d_ff = 256;
        s2s.mlp = MlpKind::Gelu;
        s2s.norm = NormKind::Layernorm;
        s2s.max_seq_len = 256;
        s2s.qk_norm = qk;
        let (model, params) = init_model(&s2s, 0, DType::F32, &Device::Cpu).unwrap();
        let m = model.as_seq2seq().unwrap();
        let (src, tgt) = (ids(64, 32, 10_000, &mut rng), ids(64, 32, 10_000, &mut rng));
        let (med, p10, p90) = median_ms(|| {
            let loss = m
                .forward(&src, None, &tgt, ForwardCtx::eval())
                .unwrap()
                .sum_all()
                .unwrap();
            loss.backward().unwrap();
        });
        println!(
            "seq2seq tiny (4+4, d128, ff256, h4, V10k, qk_norm {qk:?}): {} params; fwd+bwd 64×(32+32) tokens: median {med:.1} ms (p10 {p10:.1}, p90 {p90:.1})",
            params.num_params()
        );

        // nanoGPT Shakespeare-char CPU shape: 4 layers, d=128, 4 heads, vocab 65, batch 12 × 64.
        let mut lm = ModelConfig::tiny(Arch::Lm);
        lm.vocab_size = Some(65);
        lm.d_model = 128;
        lm.n_layers = Some(4);
        lm.n_heads = 4;
        lm.d_ff = 512;
        lm.mlp = MlpKind::Gelu;
        lm.norm = NormKind::Layernorm;
        lm.max_seq_len = 64;
        lm.qk_norm = qk;
        let (model, params) = init_model(&lm, 0, DType::F32, &Device::Cpu).unwrap();
        let m = model.as_lm().unwrap();
        let x = ids(12, 64, 65, &mut rng);
        let (med, p10, p90) = median_ms(|| {
            let loss = m.forward(&x, ForwardCtx::eval()).unwrap().sum_all().unwrap();
            loss.backward().unwrap();
        });
        println!(
            "lm nanoGPT-CPU (4 layers, d128, ff512, h4, V65, qk_norm {qk:?}): {} params; fwd+bwd 12×64 tokens: median {med:.1} ms (p10 {p10:.1}, p90 {p90:.1})",
            params.num_params()
        );
    }
}
