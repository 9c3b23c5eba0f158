//! Cross-entropy with label smoothing, padding ignored, and optional z-loss — none of which
//! candle provides — of the logits of the output projection, which on CPU are never stored
//! whole (`ember_kernels::linear_cross_entropy`).

use candle_core::{DType, Result, Tensor};
use ember_kernels::{GradSink, Precision};

/// Summed losses of one micro-batch, over its real (non-pad) target tokens.
pub struct TokenLoss {
    /// The training objective summed over real tokens: (1−ε)·NLL + ε·mean(−log p) + z·log²Z.
    /// Divide by the token count of the whole (accumulated) batch before `backward`.
    pub objective: Tensor,
    /// Plain negative log-likelihood summed over real tokens (off the graph): what val loss and
    /// perplexity report.
    pub nll: Tensor,
}

/// The losses of the logits `hidden · Wᵀ` for hidden states (N, D) and the output weight (V, D);
/// `targets` (N) u32, `mask` (N) with 1 at real tokens and 0 at padding. `grads`: a backward
/// pass of `objective` times a constant follows (training), which the forward pass prepares;
/// with a `sink` too, the output weight's gradient goes there instead of candle's graph (the
/// caller merges it after the backward pass, as it does the fused blocks':
/// [`ember_kernels::linear_cross_entropy_to_sink`]). The products run in `precision` (the
/// model's); the loss itself is always f32.
#[allow(clippy::too_many_arguments)]
pub fn linear_cross_entropy(
    hidden: &Tensor,
    output_weight: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    label_smoothing: f64,
    z_loss: f64,
    grads: bool,
    precision: Precision,
    sink: Option<&GradSink>,
) -> Result<TokenLoss> {
    let hidden = hidden.to_dtype(DType::F32)?;
    let output_weight = output_weight.to_dtype(DType::F32)?;
    let mask = mask.to_dtype(DType::F32)?;
    let (h, w, terms) = (&hidden, &output_weight, (label_smoothing, z_loss));
    let per_token = match (grads, sink) {
        (true, Some(sink)) => ember_kernels::linear_cross_entropy_to_sink(
            h, w, targets, &mask, terms.0, terms.1, precision, sink,
        ),
        _ => ember_kernels::linear_cross_entropy_in(h, w, targets, &mask, terms.0, terms.1, grads, precision),
    }?;
    Ok(TokenLoss {
        objective: per_token.get(0)?.sum_all()?,
        nll: per_token.get(1)?.detach().sum_all()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t(v: &[f32], shape: (usize, usize)) -> Tensor {
        Tensor::from_vec(v.to_vec(), shape, &Device::Cpu).unwrap()
    }

    /// The losses of `logits` themselves: hidden states through an identity output weight.
    fn cross_entropy(
        logits: &Tensor,
        targets: &Tensor,
        mask: &Tensor,
        smoothing: f64,
        z: f64,
    ) -> Result<TokenLoss> {
        let v = logits.dim(1)?;
        let identity = Tensor::eye(v, DType::F32, &Device::Cpu)?;
        linear_cross_entropy(
            logits,
            &identity,
            targets,
            mask,
            smoothing,
            z,
            true,
            Precision::F32,
            None,
        )
    }

    #[test]
    fn nll_matches_a_hand_computation_and_ignores_padding() {
        let logits = t(&[1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 5.0, -1.0, 0.5], (3, 3));
        let targets = Tensor::new(&[2u32, 1, 0], &Device::Cpu).unwrap();
        let mask = Tensor::new(&[1f32, 1.0, 0.0], &Device::Cpu).unwrap();
        let l = cross_entropy(&logits, &targets, &mask, 0.0, 0.0).unwrap();
        let lse0 = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        let expected = (lse0 - 3.0) + 3f64.ln();
        let got = l.nll.to_scalar::<f32>().unwrap() as f64;
        assert!((got - expected).abs() < 1e-5, "{got} vs {expected}");
        assert!((l.objective.to_scalar::<f32>().unwrap() as f64 - expected).abs() < 1e-5);
    }

    #[test]
    fn smoothing_mixes_in_the_uniform_cross_entropy() {
        let logits = t(&[1.0, 2.0, 3.0], (1, 3));
        let targets = Tensor::new(&[0u32], &Device::Cpu).unwrap();
        let mask = Tensor::new(&[1f32], &Device::Cpu).unwrap();
        let l = cross_entropy(&logits, &targets, &mask, 0.1, 0.0).unwrap();
        let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        let nll = lse - 1.0;
        let uniform = lse - 2.0; // mean of −log p = lse − mean(logits)
        let expected = 0.9 * nll + 0.1 * uniform;
        assert!((l.objective.to_scalar::<f32>().unwrap() as f64 - expected).abs() < 1e-5);
        assert!(
            (l.nll.to_scalar::<f32>().unwrap() as f64 - nll).abs() < 1e-5,
            "reported NLL is unsmoothed"
        );
    }

    #[test]
    fn z_loss_adds_the_squared_log_partition() {
        let logits = t(&[1.0, 2.0], (1, 2));
        let targets = Tensor::new(&[1u32], &Device::Cpu).unwrap();
        let mask = Tensor::new(&[1f32], &Device::Cpu).unwrap();
        let base = cross_entropy(&logits, &targets, &mask, 0.0, 0.0).unwrap();
        let with = cross_entropy(&logits, &targets, &mask, 0.0, 1e-2).unwrap();
        let lse = (1f64.exp() + 2f64.exp()).ln();
        let diff = with.objective.to_scalar::<f32>().unwrap() - base.objective.to_scalar::<f32>().unwrap();
        assert!((diff as f64 - 1e-2 * lse * lse).abs() < 1e-5);
    }

    #[test]
    fn gradient_flows_to_logits_only_through_real_tokens() {
        let logits = candle_core::Var::from_tensor(&t(&[1.0, 2.0, 3.0, 4.0], (2, 2))).unwrap();
        let targets = Tensor::new(&[0u32, 1], &Device::Cpu).unwrap();
        let mask = Tensor::new(&[1f32, 0.0], &Device::Cpu).unwrap();
        let l = cross_entropy(logits.as_tensor(), &targets, &mask, 0.1, 1e-3).unwrap();
        let g = l.objective.backward().unwrap();
        let g: Vec<Vec<f32>> = g.get(logits.as_tensor()).unwrap().to_vec2().unwrap();
        assert!(g[0].iter().all(|x| x.abs() > 0.0));
        assert!(
            g[1].iter().all(|&x| x == 0.0),
            "padding row got gradient {:?}",
            g[1]
        );
    }
}
