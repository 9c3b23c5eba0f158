//! Shared fixtures for the model specification tests.
#![allow(dead_code)]

pub mod branches;

use candle_core::{DType, Device, Result, Tensor};
use ember_model::{init_model, Arch, ForwardCtx, MlpKind, Model, ModelConfig, NormKind, ParamStore, QkNorm};
use ember_rng::SplitMix64;

pub const ALL_QK: [QkNorm; 4] = [QkNorm::None, QkNorm::Layernorm, QkNorm::Rmsnorm, QkNorm::L2];
pub const ALL_NORMS: [NormKind; 2] = [NormKind::Rmsnorm, NormKind::Layernorm];
pub const ALL_MLPS: [MlpKind; 3] = [MlpKind::Swiglu, MlpKind::Gelu, MlpKind::Relu];
pub const ALL_ARCHS: [Arch; 2] = [Arch::Lm, Arch::Seq2seq];

pub fn cfg(arch: Arch, qk: QkNorm, norm: NormKind, mlp: MlpKind) -> ModelConfig {
    let mut c = ModelConfig::tiny(arch);
    c.qk_norm = qk;
    c.norm = norm;
    c.mlp = mlp;
    c
}

pub fn build(cfg: &ModelConfig, dtype: DType) -> (Model, ParamStore) {
    init_model(cfg, 1234, dtype, &Device::Cpu).expect("valid test config")
}

/// Adds noise to every parameter so that gains ≠ 1 and biases ≠ 0: gradient checks at the
/// symmetric initial point could miss terms.
pub fn perturb(params: &ParamStore, scale: f64, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    for (_, var) in params.vars() {
        let noise: Vec<f64> = (0..var.elem_count()).map(|_| scale * rng.normal()).collect();
        let noise = Tensor::from_vec(noise, var.shape(), var.device())
            .unwrap()
            .to_dtype(var.dtype())
            .unwrap();
        var.set(&(var.as_tensor() + noise).unwrap()).unwrap();
    }
}

/// Deterministic pseudo-random token ids in [4, vocab) of shape (b, t).
pub fn tokens(b: usize, t: usize, vocab: usize, seed: u64) -> Tensor {
    let mut rng = SplitMix64::new(seed);
    let ids: Vec<u32> = (0..b * t)
        .map(|_| 4 + (rng.next_u64() % (vocab as u64 - 4)) as u32)
        .collect();
    Tensor::from_vec(ids, (b, t), &Device::Cpu).unwrap()
}

pub fn random(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    let mut rng = SplitMix64::new(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// A 0/1 source mask (b, s) with row i having `lens[i]` real tokens.
pub fn lengths_mask(lens: &[usize], s: usize) -> Tensor {
    let v: Vec<u32> = lens
        .iter()
        .flat_map(|&l| (0..s).map(move |j| (j < l) as u32))
        .collect();
    Tensor::from_vec(v, (lens.len(), s), &Device::Cpu).unwrap()
}

/// Logits of a fixed small batch, with padding in the source for seq2seq.
pub fn logits(model: &Model, vocab: usize, ctx: ForwardCtx) -> Result<Tensor> {
    logits_on(model, vocab, ctx, &Device::Cpu)
}

/// [`logits`] of a model on `device`.
pub fn logits_on(model: &Model, vocab: usize, ctx: ForwardCtx, device: &Device) -> Result<Tensor> {
    let on = |t: Tensor| t.to_device(device);
    match model {
        Model::Lm(m) => m.forward(&on(tokens(2, 7, vocab, 1))?, ctx),
        Model::Seq2seq(m) => {
            let src = on(tokens(2, 6, vocab, 2))?;
            let mask = on(lengths_mask(&[6, 4], 6))?;
            m.forward(&src, Some(&mask), &on(tokens(2, 5, vocab, 3))?, ctx)
        }
    }
}

/// A scalar loss that reaches every logit with a different weight.
pub fn loss(model: &Model, vocab: usize) -> Result<Tensor> {
    let logits = logits(model, vocab, ForwardCtx::eval())?;
    let weights = random(logits.dims(), logits.dtype(), 99);
    (logits * weights)?.sum_all()
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

/// Central differences in f64 against autograd, on a few entries of every parameter.
pub fn check_against_finite_differences(c: &ModelConfig) {
    let (model, params) = build(c, DType::F64);
    perturb(&params, 0.1, 7);
    let vocab = c.vocab();
    let grads = loss(&model, vocab).unwrap().backward().unwrap();
    let h = 1e-6;
    for (name, var) in params.vars() {
        let analytic: Vec<f64> = grads
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let n = base.len();
        for &i in &[0, n / 2, n - 1] {
            let eval_at = |delta: f64| {
                let mut v = base.clone();
                v[i] += delta;
                var.set(&Tensor::from_vec(v, var.shape(), var.device()).unwrap())
                    .unwrap();
                loss(&model, vocab).unwrap().to_scalar::<f64>().unwrap()
            };
            let numeric = (eval_at(h) - eval_at(-h)) / (2.0 * h);
            var.set(&Tensor::from_vec(base.clone(), var.shape(), var.device()).unwrap())
                .unwrap();
            let err = (numeric - analytic[i]).abs();
            assert!(
                err <= 1e-6 + 1e-5 * analytic[i].abs(),
                "{:?}/{:?}: d loss / d {name}[{i}]: autograd {} vs finite difference {numeric}",
                c.arch,
                c.qk_norm,
                analytic[i]
            );
        }
    }
}

/// Every precision, bf16 on any CPU: natively where it has AVX512_BF16, else emulated with the
/// same bits (`ember_kernels::emulate_bf16_products`), so that the bf16 specifications run on
/// every machine, CI's included.
pub fn every_precision() -> [ember_kernels::Precision; 2] {
    ember_kernels::emulate_bf16_products();
    [ember_kernels::Precision::F32, ember_kernels::Precision::Bf16]
}
