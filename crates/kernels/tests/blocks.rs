//! Specification of the fused sub-block ops: each gives the bits of the ops one by one — its
//! output and its input's gradient bit for bit, each parameter's gradient equal (`==`: the sign
//! of an exact zero may differ, which moves no parameter) — once the caller merges the sink
//! after `backward()`, whether it keeps its activations or recomputes them in the backward
//! pass; a second backward pass through the same graph gives the same gradients;
//! an op that does not run (an input without a gradient) says so and reserves no dropout mask;
//! and a sink whose op never ran its backward pass refuses to merge rather than lose gradients.
//! A cross-attention sub-block's keys and values are inputs of its op: their gradients, like
//! x's, come back through candle with the composition's bits.
//! The fused output projection and loss hands its weight's gradient to a sink the same way.

#[path = "common/mod.rs"]
mod common;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use common::{every_precision, host, randn_cpu, same_bits};
use ember_kernels::{
    self as kernels, attention_block, causal_mask, cross_attention_block, mlp_block, padding_mask,
    ActivationMemory, AttentionOptions, AttentionWeights, BlockNorm, BlockPositions, BlockProjection,
    CrossAttentionWeights, GradSink, MlpActivation, MlpWeights, PositionScale, Precision, RopeTables,
};

/// One MLP sub-block's inputs: the stream x (B, T, d) and its parameters, as variables.
struct Mlp {
    x: Var,
    weight: Var,
    bias: Option<Var>,
    /// SwiGLU's gate (`None`: a GELU block).
    gate: Option<Var>,
    up: Var,
    down: Var,
    rms: bool,
}

impl Mlp {
    /// Shapes that are no multiple of the kernels' vector and tile widths.
    fn new(seed: u64, (b, t, d, ff): (usize, usize, usize, usize), norm: &str, swiglu: bool) -> Self {
        let var = |s: u64, shape: &[usize], scale: f32| {
            Var::from_tensor(&randn_cpu(seed + s, shape, scale)).unwrap()
        };
        // A gain near 1 and a small bias, as after some training.
        let gain = (randn_cpu(seed + 1, &[d], 0.1) + 1.0).unwrap();
        Self {
            x: var(0, &[b, t, d], 1.0),
            weight: Var::from_tensor(&gain).unwrap(),
            bias: (norm == "layernorm").then(|| var(2, &[d], 0.1)),
            gate: swiglu.then(|| var(5, &[ff, d], 0.3)),
            up: var(3, &[ff, d], 0.2),
            down: var(4, &[d, ff], 0.2),
            rms: norm == "rmsnorm",
        }
    }

    fn params(&self) -> Vec<&Var> {
        [
            Some(&self.weight),
            self.bias.as_ref(),
            self.gate.as_ref(),
            Some(&self.up),
            Some(&self.down),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    fn norm(&self) -> BlockNorm<'_> {
        BlockNorm {
            weight: self.weight.as_tensor(),
            bias: self.bias.as_ref().map(Var::as_tensor),
            rms: self.rms,
            eps: 1e-5,
        }
    }

    /// The block as one op with a sink (keeping its activations or recomputing them), the ops
    /// one by one without.
    fn forward(
        &self,
        (p, state): (f64, u64),
        precision: Precision,
        sink: Option<(&GradSink, ActivationMemory)>,
    ) -> Tensor {
        let (x, up, down) = (self.x.as_tensor(), self.up.as_tensor(), self.down.as_tensor());
        let Some((sink, memory)) = sink else {
            let h = norm_of(x, self.norm());
            let hidden = match &self.gate {
                Some(gate) => kernels::swiglu_in(
                    &kernels::linear_in(&h, gate.as_tensor(), precision).unwrap(),
                    &kernels::linear_in(&h, up, precision).unwrap(),
                    precision,
                ),
                None => kernels::linear_gelu_in(&h, up, precision),
            };
            return kernels::linear_residual_in(x, &hidden.unwrap(), down, p, state, precision).unwrap();
        };
        let w = match &self.gate {
            Some(gate) => MlpWeights {
                activation: MlpActivation::Swiglu,
                gate: Some(BlockProjection::unbiased(gate.as_tensor())),
                up: BlockProjection::unbiased(up),
                down: BlockProjection::unbiased(down),
            },
            None => gelu_weights(up, down),
        };
        let block = mlp_block(x, Some(self.norm()), w, precision, memory, sink, || (p, state)).unwrap();
        block.expect("the op did not run")
    }

    /// The gradients of Σ output·probe: x's, then each parameter's.
    fn grads(&self, store: &GradStore) -> Vec<Tensor> {
        std::iter::once(&self.x)
            .chain(self.params())
            .map(|v| store.get(v.as_tensor()).expect("a gradient is missing").clone())
            .collect()
    }
}

fn loss(y: &Tensor) -> Tensor {
    let probe = randn_cpu(99, y.dims(), 1.0);
    (y * probe).unwrap().sum_all().unwrap()
}

fn assert_equal(what: &str, a: &Tensor, b: &Tensor) {
    let (a, b) = (host(a), host(b));
    assert_eq!(a.len(), b.len(), "{what}: sizes differ");
    let differing = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    assert_eq!(differing, 0, "{what}: {differing} of {} elements differ", a.len());
}

#[test]
fn the_mlp_block_gives_the_bits_of_its_ops_one_by_one() {
    for (norm, swiglu) in [
        ("layernorm", false),
        ("layernorm-no-bias", true),
        ("rmsnorm", false),
        ("rmsnorm", true),
    ] {
        for (precision, memory) in every_precision().into_iter().flat_map(with_either_memory) {
            for dropout in [(0.0, 0), (0.1, 12345)] {
                let what = format!(
                    "{norm}, swiglu {swiglu}, {precision:?}, {memory:?}, dropout {}",
                    dropout.0
                );
                let m = Mlp::new(7, (2, 13, 24, 40), norm, swiglu);
                let y_ops = m.forward(dropout, precision, None);
                let grads_ops = m.grads(&loss(&y_ops).backward().unwrap());

                let sink = GradSink::new();
                let y = m.forward(dropout, precision, Some((&sink, memory)));
                assert!(same_bits(&y, &y_ops), "{what}: the output differs");
                let mut store = loss(&y).backward().unwrap();
                sink.merge_into(&mut store).unwrap();
                let grads = m.grads(&store);
                assert_gradients_match(&what, &grads, &grads_ops);
                assert!(sink.is_empty(), "{what}: the merge left gradients behind");
            }
        }
    }
}

/// `precision` with each [`ActivationMemory`]: the ops that keep their activations and those
/// that recompute them in the backward pass give the same bits.
fn with_either_memory(precision: Precision) -> [(Precision, ActivationMemory); 3] {
    ActivationMemory::ALL.map(|memory| (precision, memory))
}

#[test]
fn a_second_backward_pass_recomputes_what_the_first_took() {
    for ((swiglu, precision), memory) in [false, true]
        .into_iter()
        .flat_map(|s| every_precision().map(|p| (s, p)))
        .flat_map(|sp| ActivationMemory::ALL.map(|m| (sp, m)))
    {
        let m = Mlp::new(3, (1, 9, 16, 48), "layernorm", swiglu);
        let sink = GradSink::new();
        let l = loss(&m.forward((0.1, 7), precision, Some((&sink, memory))));
        let mut first = l.backward().unwrap();
        sink.merge_into(&mut first).unwrap();
        let mut second = l.backward().unwrap();
        sink.merge_into(&mut second).unwrap();
        for (i, (a, b)) in m.grads(&first).iter().zip(&m.grads(&second)).enumerate() {
            assert!(
                same_bits(a, b),
                "swiglu {swiglu}, {precision:?}, {memory:?}: gradient {i} differs on the second pass"
            );
        }
    }
}

#[test]
fn a_sink_whose_op_never_ran_backward_refuses_to_merge() {
    let m = Mlp::new(5, (1, 4, 8, 16), "rmsnorm", false);
    let sink = GradSink::new();
    let _unused = m.forward((0.0, 0), Precision::F32, Some((&sink, ActivationMemory::Keep)));
    // A loss that does not reach the block: its parameters get no gradient.
    let mut store = loss(m.x.as_tensor()).backward().unwrap();
    let err = sink.merge_into(&mut store).unwrap_err().to_string();
    assert!(
        err.contains("fused MLP block") && err.contains("never ran"),
        "{err}"
    );
}

#[test]
fn the_ops_do_not_run_on_an_input_without_a_gradient_and_reserve_no_dropout() {
    let m = Mlp::new(9, (1, 5, 8, 16), "layernorm", false);
    let sink = GradSink::new();
    let x = m.x.as_tensor().detach();
    let w = gelu_weights(m.up.as_tensor(), m.down.as_tensor());
    let reserved = std::cell::Cell::new(false);
    let dropout = || {
        reserved.set(true);
        (0.1, 1)
    };
    let y = mlp_block(
        &x,
        Some(m.norm()),
        w,
        Precision::F32,
        ActivationMemory::Keep,
        &sink,
        dropout,
    )
    .unwrap();
    assert!(y.is_none(), "the op ran on an input without a gradient");
    assert!(!reserved.get(), "the op reserved a dropout mask without running");
    assert!(sink.is_empty(), "the op registered with the sink without running");

    // The cross-attention op likewise, and with keys that are not f32.
    let c = Cross::new(9, (1, 5, 3, 8), (2, 2, 4));
    let k_bf16 = c.k.as_tensor().to_dtype(DType::BF16).unwrap();
    for (what, x, k) in [
        ("an input without a gradient", x.clone(), c.k.as_tensor().clone()),
        ("bf16 keys", c.x.as_tensor().clone(), k_bf16),
    ] {
        let called = std::cell::Cell::new(false);
        let options = || {
            called.set(true);
            AttentionOptions {
                heads: 2,
                kv_heads: 2,
                dropout: None,
                telemetry: false,
                precision: Precision::F32,
            }
        };
        let residual = || {
            called.set(true);
            (0.1, 1)
        };
        let w = CrossAttentionWeights {
            q: c.q.as_tensor(),
            o: c.o.as_tensor(),
            q_bias: None,
            o_bias: None,
            q_norm: None,
        };
        let norm = Some(block_norm(&c.norm, false, 1e-5));
        let (memory, kv) = (ActivationMemory::Keep, (&k, c.v.as_tensor()));
        let y = cross_attention_block(&x, norm, w, kv, 0.5, None, memory, &sink, options, residual);
        assert!(y.unwrap().is_none(), "the cross-attention op ran on {what}");
        assert!(
            !called.get(),
            "{what}: the op reserved dropout masks without running"
        );
        assert!(
            sink.is_empty(),
            "{what}: the op registered with the sink without running"
        );
    }
}

#[test]
fn an_rms_norm_with_a_bias_is_refused() {
    let m = Mlp::new(2, (1, 3, 8, 16), "layernorm", false);
    let norm = BlockNorm {
        rms: true,
        ..m.norm()
    };
    let w = gelu_weights(m.up.as_tensor(), m.down.as_tensor());
    let keep = ActivationMemory::Keep;
    let err = mlp_block(
        m.x.as_tensor(),
        Some(norm),
        w,
        Precision::F32,
        keep,
        &GradSink::new(),
        || (0.0, 0),
    )
    .unwrap_err();
    assert!(err.to_string().contains("RMSNorm takes no bias"), "{err}");
}

#[test]
fn a_bias_or_gate_that_does_not_fit_its_projection_is_refused_naming_the_shapes() {
    let m = Mlp::new(2, (1, 3, 8, 16), "layernorm", false);
    let (up, down) = (m.up.as_tensor(), m.down.as_tensor());
    let short_bias = randn_cpu(7, &[15], 0.1);
    let gate = randn_cpu(8, &[16, 8], 0.1);
    let cases = [
        (
            "an up bias of 15 for 16 rows",
            "up Some(([16, 8], Some([15])))",
            MlpWeights {
                up: BlockProjection {
                    weight: up,
                    bias: Some(&short_bias),
                },
                ..gelu_weights(up, down)
            },
        ),
        (
            "a gate beside ReLU",
            "Relu with gate Some(([16, 8], None))",
            MlpWeights {
                activation: MlpActivation::Relu,
                gate: Some(BlockProjection::unbiased(&gate)),
                ..gelu_weights(up, down)
            },
        ),
        (
            "SwiGLU without its gate",
            "Swiglu with gate None",
            MlpWeights {
                activation: MlpActivation::Swiglu,
                ..gelu_weights(up, down)
            },
        ),
    ];
    for (what, named, w) in cases {
        for norm in [Some(m.norm()), None] {
            let keep = ActivationMemory::Keep;
            let sink = GradSink::new();
            let err = mlp_block(m.x.as_tensor(), norm, w, Precision::F32, keep, &sink, || (0.0, 0))
                .expect_err(what)
                .to_string();
            assert!(
                err.starts_with("mlp_block:") && err.contains("do not fit") && err.contains(named),
                "{what}: {err}"
            );
            assert!(sink.is_empty(), "{what}: the refused op registered with the sink");
        }
    }
}

/// A QK-norm's variables over each head's `hd` elements: a gain near 1, and (LayerNorm) a small
/// bias.
fn qk_norm_vars(seed: u64, hd: usize, rms: bool) -> Vec<Var> {
    let gain = (randn_cpu(seed, &[hd], 0.1) + 1.0).unwrap();
    let mut vars = vec![Var::from_tensor(&gain).unwrap()];
    if !rms {
        vars.push(Var::from_tensor(&randn_cpu(seed + 1, &[hd], 0.1)).unwrap());
    }
    vars
}

/// A norm's variables (gain, and bias where it has one) as a block op takes them.
fn block_norm(vars: &[Var], rms: bool, eps: f64) -> BlockNorm<'_> {
    BlockNorm {
        weight: vars[0].as_tensor(),
        bias: vars.get(1).map(Var::as_tensor),
        rms,
        eps,
    }
}

/// `norm` as the model runs it outside a block.
fn norm_of(x: &Tensor, norm: BlockNorm) -> Tensor {
    match norm.rms {
        true => kernels::rms_norm(x, norm.weight, norm.eps),
        false => kernels::layer_norm(x, norm.weight, norm.bias, norm.eps),
    }
    .unwrap()
}

/// One attention sub-block's inputs: the stream x (B, T, D) and its parameters, as variables.
struct Attention {
    x: Var,
    norm: Vec<Var>,
    w: [Var; 4],
    rms: bool,
    heads: usize,
    kv_heads: usize,
    /// QK-norm's query and key norms (gain, and bias for LayerNorm), and whether they are RMS.
    qk_norm: Option<([Vec<Var>; 2], bool)>,
    /// The biases of q's, k's and v's projections, where they have one (Qwen2's: all three).
    qkv_bias: [Option<Var>; 3],
}

impl Attention {
    fn new(
        seed: u64,
        (b, t, d): (usize, usize, usize),
        (heads, kv_heads, hd): (usize, usize, usize),
        rms: bool,
    ) -> Self {
        let var = |s: u64, shape: &[usize], scale: f32| {
            Var::from_tensor(&randn_cpu(seed + s, shape, scale)).unwrap()
        };
        let gain = Var::from_tensor(&(randn_cpu(seed + 1, &[d], 0.1) + 1.0).unwrap()).unwrap();
        let mut norm = vec![gain];
        if !rms {
            norm.push(var(2, &[d], 0.1));
        }
        Self {
            x: var(0, &[b, t, d], 1.0),
            norm,
            w: [
                var(3, &[heads * hd, d], 0.3),
                var(4, &[kv_heads * hd, d], 0.3),
                var(5, &[kv_heads * hd, d], 0.3),
                var(6, &[d, heads * hd], 0.2),
            ],
            rms,
            heads,
            kv_heads,
            qk_norm: None,
            qkv_bias: [None, None, None],
        }
    }

    /// The same with biases on those of q's, k's and v's projections that `biased` names.
    fn with_qkv_bias(mut self, seed: u64, biased: [bool; 3]) -> Self {
        let [q, k, _, _] = self.w.each_ref().map(|w| w.dims()[0]);
        let widths = [q, k, k];
        self.qkv_bias = std::array::from_fn(|i| {
            biased[i].then(|| Var::from_tensor(&randn_cpu(seed + i as u64, &[widths[i]], 0.5)).unwrap())
        });
        self
    }

    /// The same with QK-norm of each head's `hd` elements: RMSNorm, or LayerNorm with biases.
    /// The attention options of this sub-block's heads, with telemetry.
    fn options(&self, dropout: Option<(f64, u64)>, precision: Precision) -> AttentionOptions {
        AttentionOptions {
            heads: self.heads,
            kv_heads: self.kv_heads,
            dropout,
            telemetry: true,
            precision,
        }
    }

    fn with_qk_norm(mut self, seed: u64, hd: usize, rms: bool) -> Self {
        let norm = |s: u64| qk_norm_vars(seed + s, hd, rms);
        self.qk_norm = Some(([norm(20), norm(30)], rms));
        self
    }

    fn forward(
        &self,
        positions: BlockPositions,
        mask: Option<&Tensor>,
        opts: &AttentionOptions,
        sink: Option<(&GradSink, ActivationMemory)>,
    ) -> (Tensor, Option<ember_kernels::AttentionTelemetry>) {
        let norm = block_norm(&self.norm, self.rms, 1e-5);
        let [q, k, v, o] = &self.w;
        let qk_norm = self
            .qk_norm
            .as_ref()
            .map(|(sides, rms)| sides.each_ref().map(|vars| block_norm(vars, *rms, 1e-6)));
        let w = AttentionWeights {
            q: q.as_tensor(),
            k: k.as_tensor(),
            v: v.as_tensor(),
            o: o.as_tensor(),
            qkv_bias: self.qkv_bias.each_ref().map(|b| b.as_ref().map(Var::as_tensor)),
            o_bias: None,
            qk_norm,
        };
        let x = self.x.as_tensor();
        let residual = (0.1, 777);
        match sink {
            Some((sink, memory)) => attention_block(
                x,
                Some(norm),
                w,
                positions,
                mask,
                memory,
                sink,
                || *opts,
                || residual,
            )
            .unwrap()
            .expect("the op did not run"),
            None => attention_ops(x, norm, w, positions, mask, opts, residual),
        }
    }

    fn grads(&self, store: &GradStore) -> Vec<Tensor> {
        std::iter::once(&self.x)
            .chain(&self.norm)
            .chain(&self.w)
            .chain(self.qk_norm.iter().flat_map(|(sides, _)| sides.iter().flatten()))
            .chain(self.qkv_bias.iter().flatten())
            .map(|v| store.get(v.as_tensor()).expect("a gradient is missing").clone())
            .collect()
    }
}

#[test]
fn the_attention_block_gives_the_bits_of_its_ops_one_by_one() {
    let (b, t, hd) = (2, 11, 8);
    let tables = RopeTables::new(hd, 16, 10_000.0, DType::F32, &Device::Cpu).unwrap();
    let mask = causal_mask(t, 0, DType::F32, &Device::Cpu).unwrap();
    let rotary = |logn_length| BlockPositions::Rotary {
        tables: &tables,
        scale: PositionScale {
            scale: 1.0 / (hd as f64).sqrt(),
            logn_length,
        },
    };
    // (what, positions, heads, norm is RMS, mask, QK-norm: None, or Some(is RMS))
    let cases = [
        (
            "rotary, MHA, layernorm",
            rotary(None),
            (4, 4),
            false,
            Some(&mask),
            None,
        ),
        (
            "rotary, GQA 4/2, rmsnorm, QK layernorm",
            rotary(None),
            (4, 2),
            true,
            Some(&mask),
            Some(false),
        ),
        (
            "unrotated, MHA, layernorm, QK rmsnorm",
            BlockPositions::Unrotated { scale: 0.35 },
            (4, 4),
            false,
            Some(&mask),
            Some(true),
        ),
        (
            "rotary with log-n, GQA 4/2, rmsnorm",
            rotary(Some(4)),
            (4, 2),
            true,
            Some(&mask),
            None,
        ),
        (
            "unrotated, GQA 4/1, layernorm, no mask",
            BlockPositions::Unrotated { scale: 0.35 },
            (4, 1),
            false,
            None,
            None,
        ),
    ];
    // No biases; Qwen2's on q, k and v; fairseq's unrotated pattern, q and v alone.
    let biases = [[false; 3], [true; 3], [true, false, true]];
    let with_biases = cases.into_iter().flat_map(|c| biases.map(|b| (c, b)));
    for ((what, positions, (heads, kv_heads), rms, mask, qk_rms), biased) in with_biases {
        for (precision, memory) in every_precision().into_iter().flat_map(with_either_memory) {
            for dropout in [None, Some((0.1, 4242))] {
                let what = format!(
                    "{what}, q/k/v biases {biased:?}, {precision:?}, {memory:?}, attention dropout {dropout:?}"
                );
                let mut a = Attention::new(11, (b, t, heads * hd - 3), (heads, kv_heads, hd), rms);
                if let Some(qk_rms) = qk_rms {
                    a = a.with_qk_norm(40, hd, qk_rms);
                }
                if biased.contains(&true) {
                    a = a.with_qkv_bias(50, biased);
                }
                let opts = a.options(dropout, precision);
                assert_block_gives_its_ops_bits(&what, &a, positions, mask, &opts, memory);
            }
        }
    }
}

/// At 160 positions a causal mask leaves blocks of the probabilities dead (from 128 keys), which
/// bf16 skips, and the probabilities kept between the passes are their live blocks alone
/// (S ≤ 4·head_dim keeps them): the sub-block still gives its ops' bits, keeping its
/// activations or recomputing them, with two query heads over each KV head.
#[test]
fn the_attention_block_over_160_positions_gives_the_bits_of_its_ops_one_by_one() {
    let (b, t, hd) = (2, 160, 48);
    let tables = RopeTables::new(hd, t, 10_000.0, DType::F32, &Device::Cpu).unwrap();
    let mask = causal_mask(t, 0, DType::F32, &Device::Cpu).unwrap();
    let positions = BlockPositions::Rotary {
        tables: &tables,
        scale: PositionScale {
            scale: 1.0 / (hd as f64).sqrt(),
            logn_length: None,
        },
    };
    for qk_rms in [None, Some(true)] {
        for (precision, memory) in every_precision().into_iter().flat_map(with_either_memory) {
            for dropout in [None, Some((0.1, 4242))] {
                let what =
                    format!("QK-norm {qk_rms:?}, {precision:?}, {memory:?}, attention dropout {dropout:?}");
                let mut a = Attention::new(12, (b, t, 2 * hd - 3), (2, 1, hd), true);
                if let Some(qk_rms) = qk_rms {
                    a = a.with_qk_norm(41, hd, qk_rms);
                }
                let opts = a.options(dropout, precision);
                assert_block_gives_its_ops_bits(&what, &a, positions, Some(&mask), &opts, memory);
            }
        }
    }
}

/// The fused sub-block (its parameters' gradients through a sink, its activations as `memory`
/// says) against the ops one by one: the output, the telemetry and x's gradient bit for bit,
/// each parameter's gradient equal.
fn assert_block_gives_its_ops_bits(
    what: &str,
    a: &Attention,
    positions: BlockPositions,
    mask: Option<&Tensor>,
    opts: &AttentionOptions,
    memory: ActivationMemory,
) {
    let (y_ops, measured_ops) = a.forward(positions, mask, opts, None);
    let grads_ops = a.grads(&loss(&y_ops).backward().unwrap());

    let sink = GradSink::new();
    let (y, measured) = a.forward(positions, mask, opts, Some((&sink, memory)));
    assert!(same_bits(&y, &y_ops), "{what}: the output differs");
    assert_eq!(measured, measured_ops, "{what}: the telemetry differs");
    assert!(measured.is_some(), "{what}: no telemetry");
    let mut store = loss(&y).backward().unwrap();
    sink.merge_into(&mut store).unwrap();
    let grads = a.grads(&store);
    assert_gradients_match(what, &grads, &grads_ops);
}

/// x's gradient (the first) bit for bit and each parameter's equal (up to the sign of an exact
/// zero), against the ops one by one.
fn assert_gradients_match(what: &str, grads: &[Tensor], grads_ops: &[Tensor]) {
    assert!(
        same_bits(&grads[0], &grads_ops[0]),
        "{what}: x's gradient differs"
    );
    for (i, (g, g_ops)) in grads.iter().zip(grads_ops).enumerate().skip(1) {
        assert_equal(&format!("{what}: parameter {i}'s gradient"), g, g_ops);
    }
}

/// The attention sub-block the ops one by one, as the model composes them.
fn attention_ops(
    x: &Tensor,
    norm: BlockNorm,
    w: AttentionWeights,
    positions: BlockPositions,
    mask: Option<&Tensor>,
    opts: &AttentionOptions,
    (p, state): (f64, u64),
) -> (Tensor, Option<ember_kernels::AttentionTelemetry>) {
    let precision = opts.precision;
    let h = norm_of(x, norm);
    // A projection with its bias, if any, then QK-norm, if any: the model's order.
    let project = |w: &Tensor, bias: Option<&Tensor>| match bias {
        Some(b) => kernels::linear_bias_in(&h, w, b, precision).unwrap(),
        None => kernels::linear_in(&h, w, precision).unwrap(),
    };
    let [q_bias, k_bias, v_bias] = w.qkv_bias;
    let through = |w: &Tensor, bias: Option<&Tensor>, norm: Option<BlockNorm>| match norm {
        Some(norm) => norm_of(&project(w, bias), norm),
        None => project(w, bias),
    };
    let [qn, kn] = match w.qk_norm {
        Some([qn, kn]) => [Some(qn), Some(kn)],
        None => [None, None],
    };
    // Where nothing comes between a side's product and its rotation or scale (no bias, no
    // QK-norm), the model fuses them; each side decides alone.
    let q = match (positions, qn, q_bias) {
        (BlockPositions::Rotary { tables, scale }, None, None) => {
            kernels::linear_rope_in(&h, w.q, tables, 0, scale, precision).unwrap()
        }
        (BlockPositions::Rotary { tables, scale }, ..) => {
            kernels::rope(&through(w.q, q_bias, qn), tables, 0, scale).unwrap()
        }
        (BlockPositions::Unrotated { scale }, None, None) => {
            kernels::linear_scaled_in(&h, w.q, scale, precision).unwrap()
        }
        (BlockPositions::Unrotated { scale }, ..) => PositionScale::from(scale)
            .apply_unfused(&through(w.q, q_bias, qn), 0)
            .unwrap(),
    };
    let k = match (positions, kn, k_bias) {
        (BlockPositions::Rotary { tables, .. }, None, None) => {
            kernels::linear_rope_in(&h, w.k, tables, 0, 1.0, precision).unwrap()
        }
        (BlockPositions::Rotary { tables, .. }, ..) => {
            kernels::rope(&through(w.k, k_bias, kn), tables, 0, 1.0).unwrap()
        }
        (BlockPositions::Unrotated { .. }, ..) => through(w.k, k_bias, kn),
    };
    let v = project(w.v, v_bias);
    let (o, telemetry) = kernels::attention(&q, &k, &v, mask, opts).unwrap();
    let out = kernels::linear_residual_in(x, &o, w.o, p, state, precision).unwrap();
    (out, telemetry)
}

#[test]
fn a_second_backward_pass_through_the_attention_block_recomputes_what_the_first_took() {
    let (b, t, hd) = (1, 9, 8);
    let tables = RopeTables::new(hd, 16, 10_000.0, DType::F32, &Device::Cpu).unwrap();
    let mask = causal_mask(t, 0, DType::F32, &Device::Cpu).unwrap();
    let positions = BlockPositions::Rotary {
        tables: &tables,
        scale: PositionScale::from(0.3),
    };
    let a = Attention::new(5, (b, t, 29), (4, 2, hd), false)
        .with_qk_norm(6, hd, false)
        .with_qkv_bias(7, [true; 3]);
    let opts = AttentionOptions {
        heads: 4,
        kv_heads: 2,
        dropout: Some((0.1, 99)),
        telemetry: false,
        precision: Precision::F32,
    };
    for memory in ActivationMemory::ALL {
        let sink = GradSink::new();
        let (y, _) = a.forward(positions, Some(&mask), &opts, Some((&sink, memory)));
        let l = loss(&y);
        let mut first = l.backward().unwrap();
        sink.merge_into(&mut first).unwrap();
        let mut second = l.backward().unwrap();
        sink.merge_into(&mut second).unwrap();
        for (i, (g1, g2)) in a.grads(&first).iter().zip(&a.grads(&second)).enumerate() {
            assert!(
                same_bits(g1, g2),
                "{memory}: gradient {i} differs on the second pass"
            );
        }
    }
}

/// One cross-attention sub-block's inputs: the decoder's stream x (B, T, D), the keys and values
/// it attends to (B, S, H_kv·d; a seq2seq model projects them from the encoder output), and its
/// parameters, as variables.
struct Cross {
    x: Var,
    k: Var,
    v: Var,
    norm: Vec<Var>,
    rms: bool,
    q: Var,
    o: Var,
    q_bias: Option<Var>,
    /// QK-norm's query norm (gain, and bias for LayerNorm), and whether it is RMS.
    q_norm: Option<(Vec<Var>, bool)>,
}

impl Cross {
    fn new(
        seed: u64,
        (b, t, s, d): (usize, usize, usize, usize),
        (heads, kv_heads, hd): (usize, usize, usize),
    ) -> Self {
        let var = |i: u64, shape: &[usize], scale: f32| {
            Var::from_tensor(&randn_cpu(seed + i, shape, scale)).unwrap()
        };
        let gain = Var::from_tensor(&(randn_cpu(seed + 1, &[d], 0.1) + 1.0).unwrap()).unwrap();
        Self {
            x: var(0, &[b, t, d], 1.0),
            k: var(2, &[b, s, kv_heads * hd], 1.0),
            v: var(3, &[b, s, kv_heads * hd], 1.0),
            norm: vec![gain, var(4, &[d], 0.1)],
            rms: false,
            q: var(5, &[heads * hd, d], 0.3),
            o: var(6, &[d, heads * hd], 0.2),
            q_bias: None,
            q_norm: None,
        }
    }

    /// The sub-block's input gradients (x's, k's, v's), then each parameter's.
    fn vars(&self) -> Vec<&Var> {
        [&self.x, &self.k, &self.v]
            .into_iter()
            .chain(&self.norm)
            .chain([&self.q, &self.o])
            .chain(&self.q_bias)
            .chain(self.q_norm.iter().flat_map(|(vars, _)| vars))
            .collect()
    }

    fn forward(
        &self,
        mask: Option<&Tensor>,
        opts: &AttentionOptions,
        sink: Option<(&GradSink, ActivationMemory)>,
    ) -> (Tensor, Option<ember_kernels::AttentionTelemetry>) {
        let norm = block_norm(&self.norm, self.rms, 1e-5);
        let q_norm = self
            .q_norm
            .as_ref()
            .map(|(vars, rms)| block_norm(vars, *rms, 1e-6));
        let (x, k, v) = (self.x.as_tensor(), self.k.as_tensor(), self.v.as_tensor());
        let (wq, wo) = (self.q.as_tensor(), self.o.as_tensor());
        let q_bias = self.q_bias.as_ref().map(Var::as_tensor);
        let scale = 0.35;
        let residual = (0.1, 777);
        if let Some((sink, memory)) = sink {
            let w = CrossAttentionWeights {
                q: wq,
                o: wo,
                q_bias,
                o_bias: None,
                q_norm,
            };
            let block = cross_attention_block(
                x,
                Some(norm),
                w,
                (k, v),
                scale,
                mask,
                memory,
                sink,
                || *opts,
                || residual,
            );
            return block.unwrap().expect("the op did not run");
        }
        // The ops one by one, as the model composes them: q's product fused with the scale
        // where nothing comes between.
        let precision = opts.precision;
        let h = norm_of(x, norm);
        let q = match (q_bias, q_norm) {
            (None, None) => kernels::linear_scaled_in(&h, wq, scale, precision).unwrap(),
            _ => {
                let q = match q_bias {
                    Some(b) => kernels::linear_bias_in(&h, wq, b, precision).unwrap(),
                    None => kernels::linear_in(&h, wq, precision).unwrap(),
                };
                let q = q_norm.map_or(q.clone(), |n| norm_of(&q, n));
                PositionScale::from(scale).apply_unfused(&q, 0).unwrap()
            }
        };
        let (o, telemetry) = kernels::attention(&q, k, v, mask, opts).unwrap();
        let out = kernels::linear_residual_in(x, &o, wo, residual.0, residual.1, precision).unwrap();
        (out, telemetry)
    }

    fn grads(&self, store: &GradStore) -> Vec<Tensor> {
        self.vars()
            .into_iter()
            .map(|v| store.get(v.as_tensor()).expect("a gradient is missing").clone())
            .collect()
    }
}

#[test]
fn the_cross_attention_block_gives_the_bits_of_its_ops_one_by_one() {
    let (b, t, s, hd) = (2, 11, 7, 8);
    // The second source row is padded after 4 keys.
    let keys = Tensor::new(&[[1u8; 7], [1, 1, 1, 1, 0, 0, 0]], &Device::Cpu).unwrap();
    let padding = padding_mask(&keys, DType::F32).unwrap();
    // (what, heads, norm is RMS, QK-norm's query norm: None, or Some(is RMS), q's bias, mask)
    let cases = [
        ("MHA, layernorm", (4, 4), false, None, false, Some(&padding)),
        (
            "GQA 4/2, rmsnorm, QK layernorm",
            (4, 2),
            true,
            Some(false),
            false,
            Some(&padding),
        ),
        (
            "MHA, layernorm, QK rmsnorm, q bias",
            (4, 4),
            false,
            Some(true),
            true,
            Some(&padding),
        ),
        (
            "GQA 4/1, rmsnorm, q bias, no mask",
            (4, 1),
            true,
            None,
            true,
            None,
        ),
    ];
    for (what, (heads, kv_heads), rms, q_norm, q_bias, mask) in cases {
        for (precision, memory) in every_precision().into_iter().flat_map(with_either_memory) {
            for dropout in [None, Some((0.1, 4242))] {
                let what = format!("{what}, {precision:?}, {memory:?}, attention dropout {dropout:?}");
                let mut a = Cross::new(21, (b, t, s, heads * hd - 3), (heads, kv_heads, hd));
                if rms {
                    (a.rms, a.norm) = (true, a.norm[..1].to_vec());
                }
                if let Some(qk_rms) = q_norm {
                    a.q_norm = Some((qk_norm_vars(60, hd, qk_rms), qk_rms));
                }
                if q_bias {
                    a.q_bias = Some(Var::from_tensor(&randn_cpu(62, &[heads * hd], 0.5)).unwrap());
                }
                let opts = AttentionOptions {
                    heads,
                    kv_heads,
                    dropout,
                    telemetry: true,
                    precision,
                };
                let (y_ops, measured_ops) = a.forward(mask, &opts, None);
                let grads_ops = a.grads(&loss(&y_ops).backward().unwrap());

                let sink = GradSink::new();
                let (y, measured) = a.forward(mask, &opts, Some((&sink, memory)));
                assert!(same_bits(&y, &y_ops), "{what}: the output differs");
                assert_eq!(measured, measured_ops, "{what}: the telemetry differs");
                assert!(measured.is_some(), "{what}: no telemetry");
                let l = loss(&y);
                let mut store = l.backward().unwrap();
                sink.merge_into(&mut store).unwrap();
                let grads = a.grads(&store);
                for (i, input) in ["x", "k", "v"].into_iter().enumerate() {
                    assert!(
                        same_bits(&grads[i], &grads_ops[i]),
                        "{what}: {input}'s gradient differs"
                    );
                }
                for (i, (g, g_ops)) in grads.iter().zip(&grads_ops).enumerate().skip(3) {
                    assert_equal(&format!("{what}: parameter {i}'s gradient"), g, g_ops);
                }
                // A second backward pass through the same graph recomputes what the first took.
                let mut second = l.backward().unwrap();
                sink.merge_into(&mut second).unwrap();
                for (i, (g1, g2)) in grads.iter().zip(&a.grads(&second)).enumerate() {
                    assert!(
                        same_bits(g1, g2),
                        "{what}: gradient {i} differs on the second pass"
                    );
                }
            }
        }
    }
}

/// The output projection and loss, its weight's gradient through the graph or through a sink:
/// (the losses, the hidden states' gradient, W's gradient, whether the sink was left empty). W
/// is tied (its rows also embed the tokens, looked up through the same sink, as a tied language
/// model's are: W's two gradients summed in candle's order) or not, and a variable or, for `derived`, made from one by an op
/// (which no sink can take: the gradient takes the graph to the variable).
fn output_layer(
    precision: Precision,
    sink: Option<&GradSink>,
    tied: bool,
    derived: bool,
) -> (Tensor, Tensor, Tensor, bool) {
    let (b, t, d, vocab) = (2, 13, 24, 70);
    let rows = b * t;
    let x = Var::from_tensor(&randn_cpu(31, &[b, t, d], 1.0)).unwrap();
    let w = Var::from_tensor(&randn_cpu(32, &[vocab, d], 0.3)).unwrap();
    let ids: Vec<u32> = (0..rows as u32).map(|i| (i * 7 + 3) % vocab as u32).collect();
    let targets = Tensor::new(&ids[..], &Device::Cpu).unwrap();
    let mask = Tensor::ones(rows, DType::F32, &Device::Cpu).unwrap();
    let weight = match derived {
        true => (w.as_tensor() * 1.0).unwrap(),
        false => w.as_tensor().clone(),
    };
    let h = match tied {
        true => {
            let looked_up =
                sink.and_then(|sink| kernels::embedding_to_sink(&weight, &targets, sink).unwrap());
            assert_eq!(
                looked_up.is_some(),
                sink.is_some() && !derived,
                "where the lookup runs"
            );
            let embedded = looked_up.unwrap_or_else(|| weight.index_select(&targets, 0).unwrap());
            (x.as_tensor() + embedded.reshape((b, t, d)).unwrap()).unwrap()
        }
        false => x.as_tensor().clone(),
    };
    let per_token = match sink {
        Some(sink) => {
            kernels::linear_cross_entropy_to_sink(&h, &weight, &targets, &mask, 0.1, 1e-4, precision, sink)
        }
        None => kernels::linear_cross_entropy_in(&h, &weight, &targets, &mask, 0.1, 1e-4, true, precision),
    }
    .unwrap();
    let objective = (per_token.get(0).unwrap().sum_all().unwrap() / rows as f64).unwrap();
    let mut store = objective.backward().unwrap();
    if let Some(sink) = sink {
        sink.merge_into(&mut store).unwrap();
    }
    let grad = |v: &Var| store.get(v.as_tensor()).expect("a gradient is missing").clone();
    (per_token, grad(&x), grad(&w), sink.is_none_or(GradSink::is_empty))
}

#[test]
fn the_output_weights_gradient_through_a_sink_is_the_graphs() {
    for precision in every_precision() {
        for tied in [false, true] {
            for derived in [false, true] {
                let what = format!("{precision:?}, tied {tied}, derived {derived}");
                let (y_graph, dx_graph, dw_graph, _) = output_layer(precision, None, tied, derived);
                let sink = GradSink::new();
                let (y, dx, dw, emptied) = output_layer(precision, Some(&sink), tied, derived);
                assert!(same_bits(&y, &y_graph), "{what}: the losses differ");
                assert!(
                    same_bits(&dx, &dx_graph),
                    "{what}: the hidden states' gradient differs"
                );
                assert_equal(&format!("{what}: W's gradient"), &dw, &dw_graph);
                assert!(dw.is_contiguous(), "{what}: W's gradient is left a strided view");
                assert!(emptied, "{what}: the merge left gradients behind");
            }
        }
    }
}

#[test]
fn a_sink_whose_output_layer_never_ran_backward_refuses_to_merge() {
    let (rows, d, vocab) = (6, 8, 11);
    let h = Var::from_tensor(&randn_cpu(41, &[rows, d], 1.0)).unwrap();
    let w = Var::from_tensor(&randn_cpu(42, &[vocab, d], 0.3)).unwrap();
    let targets = Tensor::new(&[1u32, 2, 3, 4, 5, 6], &Device::Cpu).unwrap();
    let mask = Tensor::ones(rows, DType::F32, &Device::Cpu).unwrap();
    let sink = GradSink::new();
    let _unused = kernels::linear_cross_entropy_to_sink(
        h.as_tensor(),
        w.as_tensor(),
        &targets,
        &mask,
        0.0,
        0.0,
        Precision::F32,
        &sink,
    )
    .unwrap();
    let mut store = loss(h.as_tensor()).backward().unwrap();
    let err = sink.merge_into(&mut store).unwrap_err().to_string();
    assert!(
        err.contains("output projection") && err.contains("never ran"),
        "{err}"
    );
}

#[test]
fn the_embedding_lookup_through_a_sink_is_index_selects() {
    let weight = Var::from_tensor(&randn_cpu(51, &[20, 6], 1.0)).unwrap();
    let ids = Tensor::new(&[[3u32, 19, 3, 0], [7, 7, 7, 12]], &Device::Cpu).unwrap();
    let y_graph = weight
        .as_tensor()
        .index_select(&ids.flatten_all().unwrap(), 0)
        .unwrap();
    let y_graph = y_graph.reshape((2, 4, 6)).unwrap();
    let g_graph = loss(&y_graph).backward().unwrap();
    let sink = GradSink::new();
    let y = kernels::embedding_to_sink(weight.as_tensor(), &ids, &sink)
        .unwrap()
        .expect("runs on a variable");
    assert!(same_bits(&y, &y_graph), "the rows differ");
    let mut store = loss(&y).backward().unwrap();
    sink.merge_into(&mut store).unwrap();
    let (g, g_graph) = (
        store.get(weight.as_tensor()).unwrap(),
        g_graph.get(weight.as_tensor()).unwrap(),
    );
    assert!(same_bits(g, g_graph), "the gradient differs");
    assert!(sink.is_empty());
}

#[test]
fn an_embedding_lookup_refuses_ids_outside_the_vocabulary_and_leaves_other_types_to_index_select() {
    let weight = Var::from_tensor(&randn_cpu(52, &[20, 6], 1.0)).unwrap();
    let ids = Tensor::new(&[3u32, 20], &Device::Cpu).unwrap();
    let err = kernels::embedding_to_sink(weight.as_tensor(), &ids, &GradSink::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("token id 20") && err.contains("vocabulary of 20"),
        "{err}"
    );
    // Ids of another type are left to `index_select`, which checks them itself (a conversion
    // to u32 would wrap −1 around to a valid id).
    let sink = GradSink::new();
    let signed = Tensor::new(&[3i64, -1], &Device::Cpu).unwrap();
    assert!(kernels::embedding_to_sink(weight.as_tensor(), &signed, &sink)
        .unwrap()
        .is_none());
    assert!(sink.is_empty(), "a lookup that did not run registered");
}

/// A GELU feed-forward block's projections, without biases.
fn gelu_weights<'a>(up: &'a Tensor, down: &'a Tensor) -> MlpWeights<'a> {
    MlpWeights {
        activation: MlpActivation::Gelu,
        gate: None,
        up: BlockProjection::unbiased(up),
        down: BlockProjection::unbiased(down),
    }
}
