//! Specification: where the CPU cannot run bf16 products (here made to act as an AVX2 machine
//! with `EMBER_CPU_VECTOR_UNIT=avx2`, set before any kernel runs in this process), the bf16 ops
//! refuse with an error naming the missing feature — never a silent f32 product or a slow
//! emulation nobody asked for (`EMBER_CPU_BF16=emulate` asks) — while f32 runs as before.

use candle_core::{Device, Tensor};
use ember_kernels::{self as kernels, Precision};

#[test]
fn bf16_products_are_refused_naming_the_missing_cpu_feature() {
    // The only test of this binary: the vector unit and the emulation's switch are read once per
    // process.
    std::env::set_var(kernels::VECTOR_UNIT_ENV, "avx2");
    std::env::remove_var(kernels::BF16_ENV);
    assert_eq!(kernels::vector_unit(), "AVX2");
    let missing = Precision::Bf16
        .missing_cpu_feature()
        .expect("bf16 refused on AVX2");
    assert!(missing.contains("AVX512_BF16"), "{missing}");
    assert_eq!(Precision::F32.missing_cpu_feature(), None);
    let x = Tensor::ones((3, 8), candle_core::DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::ones((5, 8), candle_core::DType::F32, &Device::Cpu).unwrap();
    let err = kernels::linear_in(&x, &w, Precision::Bf16)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bf16 products need AVX512_BF16"), "{err}");
    let targets = Tensor::new(&[0u32, 1, 2], &Device::Cpu).unwrap();
    let mask = Tensor::ones(3, candle_core::DType::F32, &Device::Cpu).unwrap();
    let err = kernels::linear_cross_entropy_in(&x, &w, &targets, &mask, 0.0, 0.0, true, Precision::Bf16)
        .unwrap_err()
        .to_string();
    assert!(err.contains("AVX512_BF16"), "{err}");
    let q = Tensor::ones((1, 3, 8), candle_core::DType::F32, &Device::Cpu).unwrap();
    let opts = |precision| kernels::AttentionOptions {
        heads: 2,
        kv_heads: 2,
        dropout: None,
        telemetry: false,
        precision,
    };
    let err = kernels::attention(&q, &q, &q, None, &opts(Precision::Bf16))
        .unwrap_err()
        .to_string();
    assert!(err.contains("AVX512_BF16"), "{err}");
    let (o, _) = kernels::attention(&q, &q, &q, None, &opts(Precision::F32)).unwrap();
    assert_eq!(o.sum_all().unwrap().to_scalar::<f32>().unwrap(), 24.0);
    let y = kernels::linear_in(&x, &w, Precision::F32).unwrap();
    assert_eq!(y.sum_all().unwrap().to_scalar::<f32>().unwrap(), 120.0);
}
