//! Specification: the original Transformer's block as fairseq builds it (Wu et al.'s
//! Transformer-Tiny): post-norm residual blocks, sinusoidal positions added to √d-scaled
//! embeddings, and a ReLU MLP — each checked against its definition, and every parameter of
//! every combination learning with autograd's gradient equal to the finite difference.

mod common;

use candle_core::{DType, Device, Tensor, Var, D};
use common::*;
use ember_model::{
    sinusoids, Arch, ForwardCtx, MlpKind, ModelConfig, NormKind, NormPlacement, Positions, QkNorm,
};

fn fairseq_block(arch: Arch, qk: QkNorm) -> ModelConfig {
    let mut c = cfg(arch, qk, NormKind::Layernorm, MlpKind::Relu);
    c.norm_placement = NormPlacement::Post;
    c.positions = Positions::Sinusoidal;
    c.scale_embeddings = true;
    c
}

fn var(params: &ember_model::ParamStore, name: &str) -> Var {
    params
        .vars()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no parameter {name}"))
        .1
}

fn layer_norm(x: &Tensor, gain: &Tensor, bias: &Tensor, eps: f64) -> Tensor {
    let mean = x.mean_keepdim(D::Minus1).unwrap();
    let centred = x.broadcast_sub(&mean).unwrap();
    let var = centred.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
    centred
        .broadcast_div(&(var + eps).unwrap().sqrt().unwrap())
        .unwrap()
        .broadcast_mul(gain)
        .unwrap()
        .broadcast_add(bias)
        .unwrap()
}

#[test]
fn the_sinusoids_are_fairseqs_sines_then_cosines() {
    let table: Vec<Vec<f32>> = sinusoids(3, 4, &Device::Cpu).unwrap().to_vec2().unwrap();
    // dim 4: two frequencies, ω₀ = 1 and ω₁ = 10000^(−1/(2 − 1)) = 1e-4.
    for (p, row) in table.iter().enumerate() {
        let p = p as f64;
        let expected = [p.sin(), (p * 1e-4).sin(), p.cos(), (p * 1e-4).cos()];
        for (got, want) in row.iter().zip(expected) {
            assert!((*got as f64 - want).abs() < 1e-6, "position {p}: {row:?}");
        }
    }
    // An odd width leaves its last column at zero, as fairseq pads it.
    let odd: Vec<Vec<f32>> = sinusoids(2, 5, &Device::Cpu).unwrap().to_vec2().unwrap();
    assert_eq!(odd[1][4], 0.0);
    assert!((odd[1][0] - 1f32.sin()).abs() < 1e-6);
}

/// A one-layer post-norm language model's hidden states against the block computed by hand,
/// its attention branch silenced (the output projection's weight zero) so that the branch writes
/// its bias alone: h = LN₂(y + relu(y·Uᵀ + b_u)·Dᵀ + b_d) with y = LN₁(x + b_o), every b zero
/// without `proj_bias`. Returns the model's parameter names.
fn check_the_post_norm_block_by_hand(proj_bias: bool) -> Vec<String> {
    let mut c = fairseq_block(Arch::Lm, QkNorm::None);
    c.n_layers = Some(1);
    c.tie_embeddings = false;
    c.proj_bias = proj_bias;
    let (model, params) = build(&c, DType::F64);
    perturb(&params, 0.1, 11);
    let names: Vec<String> = params.vars().into_iter().map(|(n, _)| n).collect();
    let o = var(&params, "decoder.layers.0.self_attn.o_proj.weight");
    o.set(&o.as_tensor().zeros_like().unwrap()).unwrap();
    let ids = tokens(2, 5, c.vocab(), 4);
    let embed = var(&params, "embed.weight").as_tensor().clone();
    let x = embed
        .index_select(&ids.flatten_all().unwrap(), 0)
        .unwrap()
        .reshape((2, 5, c.d_model))
        .unwrap();
    let positions = sinusoids(5, c.d_model, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap();
    let x = ((x * (c.d_model as f64).sqrt()).unwrap())
        .broadcast_add(&positions)
        .unwrap();
    let p = |name: &str| {
        var(&params, &format!("decoder.layers.0.{name}"))
            .as_tensor()
            .clone()
    };
    let b = |name: &str, n: usize| match proj_bias {
        true => p(&format!("{name}.bias")),
        false => Tensor::zeros(n, DType::F64, &Device::Cpu).unwrap(),
    };
    let attended = x.broadcast_add(&b("self_attn.o_proj", c.d_model)).unwrap();
    let y = layer_norm(
        &attended,
        &p("attn_norm.weight"),
        &p("attn_norm.bias"),
        c.norm_eps,
    );
    let mlp = y
        .broadcast_matmul(&p("mlp.up_proj.weight").t().unwrap())
        .unwrap()
        .broadcast_add(&b("mlp.up_proj", c.d_ff))
        .unwrap()
        .relu()
        .unwrap()
        .broadcast_matmul(&p("mlp.down_proj.weight").t().unwrap())
        .unwrap()
        .broadcast_add(&b("mlp.down_proj", c.d_model))
        .unwrap();
    let expected = layer_norm(
        &(&y + mlp).unwrap(),
        &p("mlp_norm.weight"),
        &p("mlp_norm.bias"),
        c.norm_eps,
    );
    let got = model.as_lm().unwrap().hidden(&ids, ForwardCtx::eval()).unwrap();
    assert!(
        max_abs_diff(&got, &expected) < 1e-10,
        "{}",
        max_abs_diff(&got, &expected)
    );
    names
}

#[test]
fn a_post_norm_block_is_norm_of_x_plus_branch_and_its_stack_has_no_final_norm() {
    let names = check_the_post_norm_block_by_hand(false);
    assert!(!names.iter().any(|n| n.starts_with("decoder.norm")), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("proj.bias")), "{names:?}");
}

#[test]
fn scaled_embeddings_are_the_table_times_the_square_root_of_d_model() {
    // Untied, so the table feeds the input alone: scaling on ≡ a table √d times larger.
    let mut scaled = fairseq_block(Arch::Seq2seq, QkNorm::Layernorm);
    scaled.tie_embeddings = false;
    let plain = ModelConfig {
        scale_embeddings: false,
        ..scaled.clone()
    };
    let (a, pa) = build(&scaled, DType::F64);
    let (b, pb) = build(&plain, DType::F64);
    let table = var(&pb, "embed.weight");
    table
        .set(&(var(&pa, "embed.weight").as_tensor() * (scaled.d_model as f64).sqrt()).unwrap())
        .unwrap();
    let (la, lb) = (
        logits(&a, scaled.vocab(), ForwardCtx::eval()).unwrap(),
        logits(&b, plain.vocab(), ForwardCtx::eval()).unwrap(),
    );
    assert!(max_abs_diff(&la, &lb) < 1e-9, "{}", max_abs_diff(&la, &lb));
}

/// A language model's last hidden states, one row per position, for `tokens` (one sentence).
fn hidden_rows(c: &ModelConfig, tokens: &[u32]) -> Vec<Vec<f32>> {
    let (model, _) = build(c, DType::F32);
    let ids = Tensor::new(tokens, &Device::Cpu).unwrap().unsqueeze(0).unwrap();
    let lm = model.as_lm().unwrap();
    lm.hidden(&ids, ForwardCtx::eval())
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec2()
        .unwrap()
}

#[test]
fn sinusoidal_positions_have_no_parameters_yet_tell_positions_apart() {
    let c = fairseq_block(Arch::Lm, QkNorm::None);
    let (_, params) = build(&c, DType::F32);
    assert!(params.vars().iter().all(|(n, _)| !n.contains("embed_positions")));
    // The same token at every position: without positions every row of a causal LM's first
    // position-independent pass would agree at the last layer only by the attention's
    // averaging; with sinusoids the rows differ.
    let same = [7u32, 7, 7, 7];
    let h = hidden_rows(&c, &same);
    let none = ModelConfig {
        positions: Positions::None,
        ..c.clone()
    };
    let h0 = hidden_rows(&none, &same);
    let spread = |h: &[Vec<f32>]| {
        h.iter()
            .map(|r| {
                r.iter()
                    .zip(&h[0])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max)
            })
            .fold(0f32, f32::max)
    };
    // Attention over identical keys and values returns that value: no positions, no difference.
    assert!(spread(&h0) < 1e-5, "{}", spread(&h0));
    assert!(spread(&h) > 1e-2, "{}", spread(&h));
}

#[test]
fn every_parameter_of_the_published_block_learns_and_matches_finite_differences() {
    for arch in ALL_ARCHS {
        for qk in [QkNorm::None, QkNorm::Layernorm] {
            for positions in [Positions::Sinusoidal, Positions::Learned] {
                for placement in [NormPlacement::Post, NormPlacement::Pre] {
                    let mut c = fairseq_block(arch, qk);
                    c.positions = positions;
                    c.norm_placement = placement;
                    let what = format!("{arch:?}/{qk:?}/{positions:?}/{placement:?}");
                    let (model, params) = build(&c, DType::F32);
                    let grads = loss(&model, c.vocab()).unwrap().backward().unwrap();
                    for (name, var) in params.vars() {
                        let g = grads
                            .get(var.as_tensor())
                            .unwrap_or_else(|| panic!("{what}: {name} has no gradient"));
                        let norm2 = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
                        assert!(norm2 > 0.0 && norm2.is_finite(), "{what}: {name} {norm2}");
                    }
                }
            }
            let mut c = fairseq_block(arch, qk);
            check_against_finite_differences(&c);
            // With fairseq's biases on every projection.
            c.proj_bias = true;
            check_against_finite_differences(&c);
        }
    }
}

/// `proj_bias` adds a bias to the attention's output and to each MLP projection (and q's and
/// v's), each where fairseq adds it; without a rotation a key bias could not learn (the softmax
/// cancels it), so there is none, and the output layer has none.
#[test]
fn fairseqs_biases_enter_each_branch_where_fairseq_adds_them() {
    let names = check_the_post_norm_block_by_hand(true);
    for bias in [
        "self_attn.q_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ] {
        assert!(
            names.contains(&format!("decoder.layers.0.{bias}.bias")),
            "{bias}: {names:?}"
        );
    }
    assert!(!names.iter().any(|n| n.contains("k_proj.bias")), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("lm_head") && n.ends_with("bias")),
        "{names:?}"
    );
}

/// fairseq's biases start as fairseq starts them: q's and v's uniform on ±1/√fan_in, the
/// attention output's at 0, the MLP's uniform on ±1/√fan_in under `init_scheme: fairseq` and at 0
/// under `fairseq_0_9` (its `Linear` helper zeroes them); every bias at 0 under `normal`.
#[test]
fn fairseqs_biases_start_as_fairseq_starts_them() {
    use ember_model::InitScheme::{Fairseq, Fairseq09, Normal};
    let mut c = fairseq_block(Arch::Seq2seq, QkNorm::None);
    (c.d_model, c.d_ff, c.n_heads) = (128, 256, 4);
    c.proj_bias = true;
    for scheme in [Fairseq, Fairseq09, Normal] {
        c.init_scheme = scheme;
        let (_, params) = build(&c, DType::F64);
        let mut seen = 0;
        for (name, v) in params.vars() {
            let Some(projection) = name.strip_suffix(".bias") else {
                continue;
            };
            let b: Vec<f64> = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            let largest = b.iter().fold(0f64, |m, x| m.max(x.abs()));
            let bound = match (scheme, projection.rsplit('.').next().unwrap()) {
                (Normal, "q_proj" | "v_proj" | "up_proj" | "down_proj" | "o_proj") => 0.0,
                (_, "q_proj" | "v_proj") | (Fairseq, "up_proj") => 1.0 / 128f64.sqrt(),
                (Fairseq, "down_proj") => 1.0 / 256f64.sqrt(),
                (_, "o_proj" | "up_proj" | "down_proj") => 0.0,
                _ => continue, // the norms' biases
            };
            seen += 1;
            if bound > 0.0 {
                assert!(
                    largest <= bound && largest > 0.8 * bound,
                    "{name}: {largest} for ±{bound} under {scheme:?}"
                )
            } else {
                assert_eq!(largest, 0.0, "{name} under {scheme:?}")
            }
        }
        assert_eq!(
            seen,
            c.encoder_layers() * 5 + c.decoder_layers() * 8,
            "{scheme:?}"
        );
    }
}

/// `init_scheme: fairseq` draws each projection as fairseq's `transformer` does: q, k and v
/// uniform on ±(1/√2)·√(6 / (fan_in + fan_out)) (Xavier, gain 1/√2), the attention's output on
/// ±√(6 / (fan_in + fan_out)), the MLP's two on ±1/√fan_in (`nn.Linear`'s default); embeddings
/// stay normal(0, init_std). `fairseq_0_9` differs in the MLP alone, Xavier-uniform (gain 1) as
/// fairseq 0.9's `Linear` helper drew it. In every layer of both stacks, cross-attention
/// included, and with grouped key/value heads (fan_out of k and v smaller).
#[test]
fn the_fairseq_inits_draw_each_projection_from_its_uniform() {
    for scheme in [
        ember_model::InitScheme::Fairseq,
        ember_model::InitScheme::Fairseq09,
    ] {
        each_projection_is_drawn_from_its_uniform(scheme);
    }
}

fn each_projection_is_drawn_from_its_uniform(scheme: ember_model::InitScheme) {
    let mut c = fairseq_block(Arch::Seq2seq, QkNorm::None);
    (c.d_model, c.d_ff, c.n_heads, c.n_kv_heads) = (128, 256, 4, Some(2));
    c.init_std = 128f64.powf(-0.5);
    c.init_scheme = scheme;
    let (_, params) = build(&c, DType::F64);
    let xavier = |fan_in: usize, fan_out: usize, gain: f64| gain * (6.0 / (fan_in + fan_out) as f64).sqrt();
    let half = std::f64::consts::FRAC_1_SQRT_2;
    let fairseq_0_9 = scheme == ember_model::InitScheme::Fairseq09;
    let mut seen = 0;
    for (name, v) in params.vars() {
        let w: Vec<f64> = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let n = w.len() as f64;
        let mean = w.iter().sum::<f64>() / n;
        let sd = (w.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
        let largest = w.iter().fold(0f64, |m, x| m.max(x.abs()));
        let bound = if name.ends_with("q_proj.weight") {
            xavier(128, 128, half)
        } else if name.ends_with("k_proj.weight") || name.ends_with("v_proj.weight") {
            xavier(128, 64, half)
        } else if name.ends_with("o_proj.weight") {
            xavier(128, 128, 1.0)
        } else if name.ends_with("up_proj.weight") || name.ends_with("down_proj.weight") {
            match fairseq_0_9 {
                true => xavier(128, 256, 1.0),
                false if name.ends_with("up_proj.weight") => 1.0 / 128f64.sqrt(),
                false => 1.0 / 256f64.sqrt(),
            }
        } else if name == "embed.weight" {
            assert!(
                (sd / c.init_std - 1.0).abs() < 0.03,
                "{name}: sd {sd}, not init_std"
            );
            assert!(largest > 3.0 * c.init_std, "{name}: no normal tails ({largest})");
            continue;
        } else {
            continue;
        };
        seen += 1;
        // Uniform on ±b: every value inside, the range filled, sd b/√3.
        assert!(largest <= bound, "{name}: {largest} beyond ±{bound}");
        assert!(
            largest > 0.97 * bound,
            "{name}: {largest} fills little of ±{bound}"
        );
        assert!(
            (sd * 3f64.sqrt() / bound - 1.0).abs() < 0.03,
            "{name}: sd {sd} for ±{bound}"
        );
        assert!(mean.abs() < 0.03 * bound, "{name}: mean {mean}");
    }
    // Six projections in each encoder layer, ten in each decoder layer (cross-attention too).
    let layers = c.encoder_layers() * 6 + c.decoder_layers() * 10;
    assert_eq!(seen, layers, "projections checked under {scheme:?}");
}

/// The default scheme is left out of a written config, so configs written before the option
/// existed hash as they did; `fairseq` and `fairseq_0_9` are written.
#[test]
fn the_normal_init_scheme_is_not_written_and_fairseq_is() {
    let mut c = fairseq_block(Arch::Seq2seq, QkNorm::None);
    let default = serde_json::to_string(&c).unwrap();
    assert!(
        !default.contains("init_scheme") && !default.contains("proj_bias"),
        "{default}"
    );
    for (scheme, yaml) in [
        (ember_model::InitScheme::Fairseq, "fairseq"),
        (ember_model::InitScheme::Fairseq09, "fairseq_0_9"),
    ] {
        c.init_scheme = scheme;
        let written = serde_json::to_string(&c).unwrap();
        assert!(
            written.contains(&format!(r#""init_scheme":"{yaml}""#)),
            "{written}"
        );
        let read: ModelConfig = serde_json::from_str(&written).unwrap();
        assert_eq!(read.init_scheme, scheme);
    }
}
