//! Specification of the fused sub-block ops: each gives the bits of the ops one by one — its
//! output and its input's gradient bit for bit, each parameter's gradient equal (`==`: the sign
//! of an exact zero may differ, which moves no parameter) — once the caller merges the sink
//! after `backward()`; a second backward pass through the same graph gives the same gradients;
//! and a sink whose op never ran its backward pass refuses to merge rather than lose gradients.

#[path = "common/mod.rs"]
mod common;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use common::{host, randn_cpu, same_bits};
use ember_kernels::{
    attention_block, causal_mask, mlp_block, AttentionOptions, AttentionWeights, BlockNorm, BlockPositions,
    GradSink, MlpWeights, PositionScale, Precision, RopeTables,
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
            Some(&self.up),
            Some(&self.down),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    fn forward(&self, dropout: (f64, u64), precision: Precision, sink: Option<&GradSink>) -> Tensor {
        let norm = BlockNorm {
            weight: self.weight.as_tensor(),
            bias: self.bias.as_ref().map(Var::as_tensor),
            rms: self.rms,
            eps: 1e-5,
        };
        let (up, down) = (self.up.as_tensor(), self.down.as_tensor());
        let w = match &self.gate {
            Some(gate) => MlpWeights::Swiglu {
                gate: gate.as_tensor(),
                up,
                down,
            },
            None => MlpWeights::Gelu { up, down },
        };
        mlp_block(self.x.as_tensor(), norm, w, dropout, precision, sink).unwrap()
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
        for precision in Precision::on_this_cpu() {
            for dropout in [(0.0, 0), (0.1, 12345)] {
                let what = format!("{norm}, swiglu {swiglu}, {precision:?}, dropout {}", dropout.0);
                let m = Mlp::new(7, (2, 13, 24, 40), norm, swiglu);
                let y_ops = m.forward(dropout, precision, None);
                let grads_ops = m.grads(&loss(&y_ops).backward().unwrap());

                let sink = GradSink::new();
                let y = m.forward(dropout, precision, Some(&sink));
                assert!(same_bits(&y, &y_ops), "{what}: the output differs");
                let mut store = loss(&y).backward().unwrap();
                sink.merge_into(&mut store).unwrap();
                let grads = m.grads(&store);
                assert!(
                    same_bits(&grads[0], &grads_ops[0]),
                    "{what}: x's gradient differs"
                );
                for (i, (g, g_ops)) in grads.iter().zip(&grads_ops).enumerate().skip(1) {
                    assert_equal(&format!("{what}: parameter {i}'s gradient"), g, g_ops);
                }
                assert!(sink.is_empty(), "{what}: the merge left gradients behind");
            }
        }
    }
}

#[test]
fn a_second_backward_pass_recomputes_what_the_first_took() {
    for swiglu in [false, true] {
        let m = Mlp::new(3, (1, 9, 16, 48), "layernorm", swiglu);
        let sink = GradSink::new();
        let l = loss(&m.forward((0.1, 7), Precision::F32, Some(&sink)));
        let mut first = l.backward().unwrap();
        sink.merge_into(&mut first).unwrap();
        let mut second = l.backward().unwrap();
        sink.merge_into(&mut second).unwrap();
        for (i, (a, b)) in m.grads(&first).iter().zip(&m.grads(&second)).enumerate() {
            assert!(
                same_bits(a, b),
                "swiglu {swiglu}: gradient {i} differs on the second pass"
            );
        }
    }
}

#[test]
fn a_sink_whose_op_never_ran_backward_refuses_to_merge() {
    let m = Mlp::new(5, (1, 4, 8, 16), "rmsnorm", false);
    let sink = GradSink::new();
    let _unused = m.forward((0.0, 0), Precision::F32, Some(&sink));
    // A loss that does not reach the block: its parameters get no gradient.
    let mut store = loss(m.x.as_tensor()).backward().unwrap();
    let err = sink.merge_into(&mut store).unwrap_err().to_string();
    assert!(
        err.contains("fused MLP block") && err.contains("never ran"),
        "{err}"
    );
}

#[test]
fn without_a_gradient_on_its_input_the_block_runs_its_ops_one_by_one() {
    let m = Mlp::new(9, (1, 5, 8, 16), "layernorm", false);
    let sink = GradSink::new();
    let x = m.x.as_tensor().detach();
    let norm = BlockNorm {
        weight: m.weight.as_tensor(),
        bias: m.bias.as_ref().map(Var::as_tensor),
        rms: false,
        eps: 1e-5,
    };
    let w = MlpWeights::Gelu {
        up: m.up.as_tensor(),
        down: m.down.as_tensor(),
    };
    let y = mlp_block(&x, norm, w, (0.0, 0), Precision::F32, Some(&sink)).unwrap();
    let store = loss(&y).backward().unwrap();
    assert!(sink.is_empty(), "the unfused path registered with the sink");
    for p in m.params() {
        assert!(
            store.get(p.as_tensor()).is_some(),
            "candle computed no gradient for a parameter"
        );
    }
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
        }
    }

    /// The same with QK-norm of each head's `hd` elements: RMSNorm, or LayerNorm with biases.
    fn with_qk_norm(mut self, seed: u64, hd: usize, rms: bool) -> Self {
        let norm = |s: u64| {
            let gain = (randn_cpu(seed + s, &[hd], 0.1) + 1.0).unwrap();
            let mut vars = vec![Var::from_tensor(&gain).unwrap()];
            if !rms {
                vars.push(Var::from_tensor(&randn_cpu(seed + s + 1, &[hd], 0.1)).unwrap());
            }
            vars
        };
        self.qk_norm = Some(([norm(20), norm(30)], rms));
        self
    }

    fn forward(
        &self,
        positions: BlockPositions,
        mask: Option<&Tensor>,
        opts: &AttentionOptions,
        sink: Option<&GradSink>,
    ) -> (Tensor, Option<ember_kernels::AttentionTelemetry>) {
        let norm = BlockNorm {
            weight: self.norm[0].as_tensor(),
            bias: self.norm.get(1).map(Var::as_tensor),
            rms: self.rms,
            eps: 1e-5,
        };
        let [q, k, v, o] = &self.w;
        let qk_norm = self.qk_norm.as_ref().map(|(sides, rms)| {
            sides.each_ref().map(|vars| BlockNorm {
                weight: vars[0].as_tensor(),
                bias: vars.get(1).map(Var::as_tensor),
                rms: *rms,
                eps: 1e-6,
            })
        });
        let w = AttentionWeights {
            q: q.as_tensor(),
            k: k.as_tensor(),
            v: v.as_tensor(),
            o: o.as_tensor(),
            qk_norm,
        };
        attention_block(
            self.x.as_tensor(),
            norm,
            w,
            positions,
            mask,
            opts,
            (0.1, 777),
            sink,
        )
        .unwrap()
    }

    fn grads(&self, store: &GradStore) -> Vec<Tensor> {
        std::iter::once(&self.x)
            .chain(&self.norm)
            .chain(&self.w)
            .chain(self.qk_norm.iter().flat_map(|(sides, _)| sides.iter().flatten()))
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
    for (what, positions, (heads, kv_heads), rms, mask, qk_rms) in cases {
        for precision in Precision::on_this_cpu() {
            for dropout in [None, Some((0.1, 4242))] {
                let what = format!("{what}, {precision:?}, attention dropout {dropout:?}");
                let mut a = Attention::new(11, (b, t, heads * hd - 3), (heads, kv_heads, hd), rms);
                if let Some(qk_rms) = qk_rms {
                    a = a.with_qk_norm(40, hd, qk_rms);
                }
                let opts = AttentionOptions {
                    heads: a.heads,
                    kv_heads: a.kv_heads,
                    dropout,
                    telemetry: true,
                    precision,
                };
                let (y_ops, measured_ops) = a.forward(positions, mask, &opts, None);
                let grads_ops = a.grads(&loss(&y_ops).backward().unwrap());

                let sink = GradSink::new();
                let (y, measured) = a.forward(positions, mask, &opts, Some(&sink));
                assert!(same_bits(&y, &y_ops), "{what}: the output differs");
                assert_eq!(measured, measured_ops, "{what}: the telemetry differs");
                assert!(measured.is_some(), "{what}: no telemetry");
                let mut store = loss(&y).backward().unwrap();
                sink.merge_into(&mut store).unwrap();
                let grads = a.grads(&store);
                assert!(
                    same_bits(&grads[0], &grads_ops[0]),
                    "{what}: x's gradient differs"
                );
                for (i, (g, g_ops)) in grads.iter().zip(&grads_ops).enumerate().skip(1) {
                    assert_equal(&format!("{what}: parameter {i}'s gradient"), g, g_ops);
                }
            }
        }
    }
}
