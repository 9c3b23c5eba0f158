//! The GPU suite of the norm, activation and rope kernels (`cuda/norm.cu`, `cuda/activation.cu`,
//! `cuda/rope.cu`): each against its unfused candle composition on the GPU (values and every
//! input's gradient, contiguous and strided, several shapes), bit-for-bit repeatability, and the
//! CUDA result against the CPU kernel's.

use crate::common::*;
use candle_core::{DType, Device, Tensor};
use ember_kernels as kernels;
use ember_kernels::{PositionScale, RopeTables};

/// f32 kernel against f32 composition.
const TOL: f64 = 1e-5;

/// `t` on the host.
fn cpu(t: &Tensor) -> Tensor {
    t.to_device(&Device::Cpu).unwrap()
}

/// The op `f` on the GPU inputs and on their copies on the host (the CPU kernel): forward and
/// every gradient within `tol` (0: the same bits).
fn cuda_vs_cpu(what: &str, inputs: &[Tensor], f: &dyn Fn(&[Tensor]) -> Tensor, tol: f64) {
    let dev = inputs[0].device().clone();
    let probe = randn(&dev, 98, f(inputs).dims(), 1.0);
    let (yg, gg) = run(inputs, &probe, f);
    let host: Vec<Tensor> = inputs.iter().map(cpu).collect();
    let (yc, gc) = run(&host, &cpu(&probe), f);
    let check = |part: String, a: &Tensor, b: &Tensor| {
        if tol == 0.0 {
            assert!(
                same_bits(a, b),
                "{part}: the CUDA kernel's bits are not the CPU kernel's"
            );
        } else {
            assert_close(&part, &cpu(a), b, tol);
        }
    };
    check(format!("{what} forward, CUDA vs CPU"), &yg, &yc);
    for (i, (a, b)) in gg.iter().zip(&gc).enumerate() {
        check(format!("{what} gradient {i}, CUDA vs CPU"), a, b);
    }
}

/// The input as given and a strided view of the same values.
fn layouts(x: &Tensor) -> [(&'static str, Tensor); 2] {
    [("contiguous", x.clone()), ("strided", strided(x))]
}

// ---------------------------------------------------------------------------------------------
// Norm

/// (input shape, gain size): per position (widths below, at and above a warp, not multiples of
/// 32, above a block's 1024) and per head of a projection (QK-norm, a gain of head_dim).
const NORM_SHAPES: [(&[usize], usize); 10] = [
    (&[3, 5, 128], 128),
    (&[7, 33], 33),
    (&[2, 3, 4, 32], 32),
    (&[1, 1, 9], 9),
    (&[4, 37, 768], 768),
    (&[2, 3, 1500], 1500),
    (&[2, 130, 96], 96),
    (&[2, 5, 4 * 24], 24),
    (&[3, 7, 2 * 64], 64),
    (&[4, 300, 2 * 64], 64),
];

fn norm_inputs(dev: &Device, i: usize, shape: &[usize], d: usize) -> (Tensor, Tensor, Tensor) {
    let seed = 100 + 10 * i as u64;
    // An offset mean, as in a residual stream: LayerNorm's centring matters.
    let x = (randn(dev, seed, shape, 1.5) + 0.7).unwrap();
    let w = (randn(dev, seed + 1, &[d], 0.3) + 1.0).unwrap();
    let b = randn(dev, seed + 2, &[d], 0.2);
    (x, w, b)
}

#[test]
fn norms_match_the_unfused_composition_on_the_gpu() {
    let dev = gpu();
    for (i, (shape, d)) in NORM_SHAPES.into_iter().enumerate() {
        let (x, w, b) = norm_inputs(&dev, i, shape, d);
        for (label, x) in layouts(&x) {
            let what = |op: &str| format!("{op} {shape:?} gain {d} {label}");
            compare(
                &what("rmsnorm"),
                &[x.clone(), w.clone()],
                &|t| kernels::rms_norm(&t[0], &t[1], 1e-5).unwrap(),
                &|t| kernels::rms_norm_unfused(&t[0], &t[1], 1e-5).unwrap(),
                TOL,
            );
            compare(
                &what("layernorm"),
                &[x.clone(), w.clone(), b.clone()],
                &|t| kernels::layer_norm(&t[0], &t[1], Some(&t[2]), 1e-5).unwrap(),
                &|t| kernels::layer_norm_unfused(&t[0], &t[1], Some(&t[2]), 1e-5).unwrap(),
                TOL,
            );
            compare(
                &what("layernorm no bias"),
                &[x.clone(), w.clone()],
                &|t| kernels::layer_norm(&t[0], &t[1], None, 1e-6).unwrap(),
                &|t| kernels::layer_norm_unfused(&t[0], &t[1], None, 1e-6).unwrap(),
                TOL,
            );
        }
    }
}

#[test]
fn norms_on_the_gpu_match_the_cpu_kernel() {
    // The warp sums in another order than the CPU's eight lanes, and the gain's gradient sums
    // chunks of vectors: rounding differences only.
    let dev = gpu();
    for (i, (shape, d)) in NORM_SHAPES.into_iter().enumerate() {
        let (x, w, b) = norm_inputs(&dev, i, shape, d);
        let what = format!("{shape:?} gain {d}");
        cuda_vs_cpu(
            &format!("rmsnorm {what}"),
            &[x.clone(), w.clone()],
            &|t| kernels::rms_norm(&t[0], &t[1], 1e-5).unwrap(),
            TOL,
        );
        cuda_vs_cpu(
            &format!("layernorm {what}"),
            &[x.clone(), w.clone(), b.clone()],
            &|t| kernels::layer_norm(&t[0], &t[1], Some(&t[2]), 1e-5).unwrap(),
            TOL,
        );
    }
}

#[test]
fn the_norm_kernel_is_what_runs() {
    // The fallback is the unfused composition itself, bit for bit; the kernel rounds otherwise
    // somewhere among these elements. (Guards the dispatch: a test of the fallback against
    // itself would pass every comparison above.)
    let dev = gpu();
    let (x, w, b) = norm_inputs(&dev, 0, &[4, 37, 768], 768);
    let fused = kernels::layer_norm(&x, &w, Some(&b), 1e-5).unwrap();
    let unfused = kernels::layer_norm_unfused(&x, &w, Some(&b), 1e-5).unwrap();
    assert!(
        !same_bits(&fused, &unfused),
        "layer_norm took the unfused composition on CUDA"
    );
    let fused = kernels::rms_norm(&x, &w, 1e-5).unwrap();
    let unfused = kernels::rms_norm_unfused(&x, &w, 1e-5).unwrap();
    assert!(
        !same_bits(&fused, &unfused),
        "rms_norm took the unfused composition on CUDA"
    );
}

// ---------------------------------------------------------------------------------------------
// Activation

const ACTIVATION_SHAPES: [&[usize]; 6] = [
    &[3, 5, 128],
    &[7, 33],
    &[2, 3, 1500],
    &[1, 1, 9],
    &[64, 3072],
    &[2, 3, 4, 5],
];

#[test]
fn activations_match_the_unfused_composition_on_the_gpu() {
    // candle's GELU is x·Φ(x) through normcdff, the kernel (erf(x/√2) + 1)·0.5·x through erff:
    // float rounding apart. Inputs of scale 2 reach GELU's flat tails.
    let dev = gpu();
    for (i, shape) in ACTIVATION_SHAPES.into_iter().enumerate() {
        let seed = 200 + 10 * i as u64;
        let (x, u) = (randn(&dev, seed, shape, 2.0), randn(&dev, seed + 1, shape, 1.0));
        for (label, x) in layouts(&x) {
            compare(
                &format!("gelu {shape:?} {label}"),
                std::slice::from_ref(&x),
                &|t| kernels::gelu_erf(&t[0]).unwrap(),
                &|t| t[0].gelu_erf().unwrap(),
                TOL,
            );
            compare(
                &format!("swiglu {shape:?} {label}"),
                &[x.clone(), strided(&u)],
                &|t| kernels::swiglu(&t[0], &t[1]).unwrap(),
                &|t| kernels::swiglu_unfused(&t[0], &t[1]).unwrap(),
                TOL,
            );
        }
    }
}

#[test]
fn activations_on_the_gpu_match_the_cpu_kernel() {
    // erff/expf against the CPU's polynomial erf (|error| < 1.5·10⁻⁷) and its exp: a few ulp.
    let dev = gpu();
    for (i, shape) in ACTIVATION_SHAPES.into_iter().enumerate() {
        let seed = 300 + 10 * i as u64;
        let (x, u) = (randn(&dev, seed, shape, 2.0), randn(&dev, seed + 1, shape, 1.0));
        cuda_vs_cpu(
            &format!("gelu {shape:?}"),
            std::slice::from_ref(&x),
            &|t| kernels::gelu_erf(&t[0]).unwrap(),
            2e-6,
        );
        cuda_vs_cpu(
            &format!("swiglu {shape:?}"),
            &[x.clone(), u.clone()],
            &|t| kernels::swiglu(&t[0], &t[1]).unwrap(),
            2e-6,
        );
    }
}

#[test]
fn the_gelu_kernel_is_what_runs() {
    // The fallback is candle's own gelu_erf, bit for bit; the kernel's formula rounds otherwise.
    let dev = gpu();
    let x = randn(&dev, 400, &[64, 3072], 2.0);
    let fused = kernels::gelu_erf(&x).unwrap();
    assert!(
        !same_bits(&fused, &x.gelu_erf().unwrap()),
        "gelu_erf took candle's op on CUDA"
    );
}

#[test]
fn a_projection_then_gelu_matches_the_ops_one_by_one_on_the_gpu() {
    let dev = gpu();
    for (i, (xs, ws)) in [
        (&[2usize, 7, 24][..], [40usize, 24]),
        (&[3, 33][..], [17, 33]),
        (&[2, 3, 64][..], [1500, 64]),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 500 + 10 * i as u64;
        let (x, w) = (randn(&dev, seed, xs, 1.0), randn(&dev, seed + 1, &ws, 0.3));
        for (label, x) in layouts(&x) {
            let what = format!("linear_gelu {xs:?}·{ws:?}ᵀ {label}");
            let inputs = [x.clone(), w.clone()];
            compare(
                &what,
                &inputs,
                &|t| kernels::linear_gelu(&t[0], &t[1]).unwrap(),
                &|t| kernels::linear_gelu_unfused(&t[0], &t[1]).unwrap(),
                TOL,
            );
            // On CUDA the op is cuBLAS's product then the GELU kernel, forward and backward.
            let probe = randn(&dev, 99, kernels::linear_gelu(&x, &w).unwrap().dims(), 1.0);
            let (y, g) = run(&inputs, &probe, &|t| kernels::linear_gelu(&t[0], &t[1]).unwrap());
            let (y2, g2) = run(&inputs, &probe, &|t| {
                kernels::gelu_erf(&kernels::linear(&t[0], &t[1]).unwrap()).unwrap()
            });
            assert!(
                same_bits(&y, &y2),
                "{what}: not the bits of linear, then gelu_erf"
            );
            for (a, b) in g.iter().zip(&g2) {
                assert!(
                    same_bits(a, b),
                    "{what}: gradients not those of linear, then gelu_erf"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rope

/// (B, H, T, head_dim, offset, max_len, log-n training length).
const ROPE_CASES: [(usize, usize, usize, usize, usize, usize, Option<usize>); 6] = [
    (2, 3, 7, 32, 0, 16, None),
    (1, 2, 5, 8, 3, 16, None),
    (3, 1, 1, 6, 9, 16, None),
    (2, 3, 12, 8, 0, 32, Some(4)),
    (2, 1, 9, 4, 3, 32, Some(7)),
    (2, 4, 70, 64, 5, 80, Some(32)),
];

#[test]
fn rope_matches_the_unfused_rotation_on_the_gpu() {
    let dev = gpu();
    for (i, (b, h, t, d, offset, max_len, logn_length)) in ROPE_CASES.into_iter().enumerate() {
        let tables = RopeTables::new(d, max_len, 10_000.0, DType::F32, &dev).unwrap();
        let x = randn(&dev, 600 + i as u64, &[b, t, h * d], 1.0);
        for (label, x) in layouts(&x) {
            for scale in [1.0, 0.125] {
                let scale = PositionScale { scale, logn_length };
                compare(
                    &format!("rope {:?} {label} {scale:?}", (b, h, t, d, offset)),
                    std::slice::from_ref(&x),
                    &|v| kernels::rope(&v[0], &tables, offset, scale).unwrap(),
                    &|v| {
                        let rotated = kernels::rope_unfused(&v[0], &tables, offset).unwrap();
                        scale.apply_unfused(&rotated, offset).unwrap()
                    },
                    TOL,
                );
            }
        }
    }
}

#[test]
fn rope_on_the_gpu_is_the_cpu_kernel_bit_for_bit() {
    // The same tables (f64 angles rounded to f32 once), the same f64 log-n factor rounded once,
    // the same products and sums with no contraction: the same bits, both directions.
    let dev = gpu();
    for (i, (b, h, t, d, offset, max_len, logn_length)) in ROPE_CASES.into_iter().enumerate() {
        let gpu_tables = RopeTables::new(d, max_len, 10_000.0, DType::F32, &dev).unwrap();
        let cpu_tables = RopeTables::new(d, max_len, 10_000.0, DType::F32, &Device::Cpu).unwrap();
        let x = randn(&dev, 700 + i as u64, &[b, t, h * d], 1.0);
        let scale = PositionScale {
            scale: 0.125,
            logn_length,
        };
        let f = |v: &[Tensor]| {
            let tables = if v[0].device().is_cuda() {
                &gpu_tables
            } else {
                &cpu_tables
            };
            kernels::rope(&v[0], tables, offset, scale).unwrap()
        };
        cuda_vs_cpu(
            &format!("rope {:?}", (b, h, t, d, offset, logn_length)),
            &[x],
            &f,
            0.0,
        );
    }
}

#[test]
fn a_projection_then_rope_matches_the_ops_one_by_one_on_the_gpu() {
    let dev = gpu();
    for (i, (b, h, t, d, offset, max_len, logn_length)) in ROPE_CASES.into_iter().enumerate() {
        let tables = RopeTables::new(d, max_len, 10_000.0, DType::F32, &dev).unwrap();
        let x = randn(&dev, 800 + i as u64, &[b, t, 24], 1.0);
        let w = randn(&dev, 801 + i as u64, &[h * d, 24], 0.3);
        let scale = PositionScale {
            scale: 0.25,
            logn_length,
        };
        for (label, x) in layouts(&x) {
            let what = format!("linear_rope {:?} {label}", (b, h, t, d, offset, logn_length));
            let inputs = [x.clone(), w.clone()];
            compare(
                &what,
                &inputs,
                &|v| kernels::linear_rope(&v[0], &v[1], &tables, offset, scale).unwrap(),
                &|v| kernels::linear_rope_unfused(&v[0], &v[1], &tables, offset, scale).unwrap(),
                TOL,
            );
            let probe = randn(&dev, 99, &[b, t, h * d], 1.0);
            let (y, g) = run(&inputs, &probe, &|v| {
                kernels::linear_rope(&v[0], &v[1], &tables, offset, scale).unwrap()
            });
            let (y2, g2) = run(&inputs, &probe, &|v| {
                kernels::rope(&kernels::linear(&v[0], &v[1]).unwrap(), &tables, offset, scale).unwrap()
            });
            assert!(same_bits(&y, &y2), "{what}: not the bits of linear, then rope");
            for (a, b) in g.iter().zip(&g2) {
                assert!(
                    same_bits(a, b),
                    "{what}: gradients not those of linear, then rope"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Empty inputs

#[test]
fn empty_inputs_give_empty_outputs_and_zero_parameter_gradients() {
    // No rows: the kernels launch nothing for the rows, and the gain's and bias's gradients,
    // sums over no vectors, are zeros.
    let dev = gpu();
    let x = Tensor::zeros((2, 0, 64), DType::F32, &dev).unwrap();
    let (w, b) = (randn(&dev, 900, &[64], 1.0), randn(&dev, 901, &[64], 1.0));
    let probe = Tensor::zeros((2, 0, 64), DType::F32, &dev).unwrap();
    let (y, g) = run(&[x.clone(), w.clone(), b.clone()], &probe, &|t| {
        kernels::layer_norm(&t[0], &t[1], Some(&t[2]), 1e-5).unwrap()
    });
    assert_eq!(y.dims(), &[2, 0, 64]);
    assert_eq!(g[0].dims(), &[2, 0, 64]);
    assert!(host(&g[1]).iter().chain(&host(&g[2])).all(|&v| v == 0.0));
    let (y, g) = run(&[x.clone(), w.clone()], &probe, &|t| {
        kernels::rms_norm(&t[0], &t[1], 1e-5).unwrap()
    });
    assert_eq!(y.dims(), &[2, 0, 64]);
    assert!(host(&g[1]).iter().all(|&v| v == 0.0));
    let (y, g) = run(&[x.clone(), x.clone()], &probe, &|t| {
        kernels::swiglu(&t[0], &t[1]).unwrap()
    });
    assert_eq!((y.dims(), g[0].dims()), (&[2, 0, 64][..], &[2, 0, 64][..]));
    let (y, _) = run(std::slice::from_ref(&x), &probe, &|t| {
        kernels::gelu_erf(&t[0]).unwrap()
    });
    assert_eq!(y.dims(), &[2, 0, 64]);
    let tables = RopeTables::new(16, 8, 10_000.0, DType::F32, &dev).unwrap();
    let (y, g) = run(std::slice::from_ref(&x), &probe, &|t| {
        kernels::rope(&t[0], &tables, 0, 0.5).unwrap()
    });
    assert_eq!((y.dims(), g[0].dims()), (&[2, 0, 64][..], &[2, 0, 64][..]));
}
