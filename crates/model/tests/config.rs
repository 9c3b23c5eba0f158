//! Specification: a configuration that cannot build a model is refused with an error that
//! names the key, never a panic.

use candle_core::{DType, Device};
use ember_model::{init_model, Arch, ModelConfig, ModelError};

fn refused(mutate: impl FnOnce(&mut ModelConfig), arch: Arch) -> String {
    let mut c = ModelConfig::tiny(arch);
    mutate(&mut c);
    match init_model(&c, 0, DType::F32, &Device::Cpu) {
        Err(e @ ModelError::Config(_)) => e.to_string(),
        Err(e) => panic!("expected a configuration error, got {e}"),
        Ok(_) => panic!("expected {c:?} to be refused"),
    }
}

#[test]
fn d_model_must_divide_into_heads() {
    let e = refused(|c| c.d_model = 18, Arch::Lm);
    assert!(
        e.contains("model.d_model") && e.contains("divisible by n_heads"),
        "{e}"
    );
}

#[test]
fn heads_must_divide_into_kv_groups() {
    let e = refused(|c| c.n_kv_heads = Some(3), Arch::Lm);
    assert!(e.contains("model.n_kv_heads") && e.contains("divisible"), "{e}");
}

#[test]
fn zero_sizes_are_refused() {
    for (key, f) in [
        (
            "model.d_model",
            Box::new(|c: &mut ModelConfig| c.d_model = 0) as Box<dyn FnOnce(&mut ModelConfig)>,
        ),
        ("model.n_heads", Box::new(|c: &mut ModelConfig| c.n_heads = 0)),
        ("model.d_ff", Box::new(|c: &mut ModelConfig| c.d_ff = 0)),
        (
            "model.n_layers",
            Box::new(|c: &mut ModelConfig| c.n_layers = Some(0)),
        ),
        (
            "model.n_kv_heads",
            Box::new(|c: &mut ModelConfig| c.n_kv_heads = Some(0)),
        ),
        (
            "model.max_seq_len",
            Box::new(|c: &mut ModelConfig| c.max_seq_len = 0),
        ),
        (
            "model.vocab_size",
            Box::new(|c: &mut ModelConfig| c.vocab_size = Some(0)),
        ),
    ] {
        let e = refused(f, Arch::Seq2seq);
        assert!(e.contains(key), "expected {key} in: {e}");
    }
}

#[test]
fn odd_head_dim_cannot_rotate() {
    let e = refused(
        |c| {
            c.d_model = 12;
            c.n_heads = 4
        },
        Arch::Lm,
    );
    assert!(e.contains("even"), "{e}");
}

#[test]
fn missing_vocab_size_says_where_it_comes_from() {
    let e = refused(|c| c.vocab_size = None, Arch::Lm);
    assert!(e.contains("model.vocab_size") && e.contains("tokenizer"), "{e}");
}

#[test]
fn probabilities_and_scales_are_range_checked() {
    assert!(refused(|c| c.dropout = 1.0, Arch::Lm).contains("model.dropout"));
    assert!(refused(|c| c.attn_dropout = -0.1, Arch::Lm).contains("model.attn_dropout"));
    assert!(refused(|c| c.init_std = 0.0, Arch::Lm).contains("model.init_std"));
    assert!(refused(|c| c.norm_eps = f64::NAN, Arch::Lm).contains("model.norm_eps"));
    let e = refused(|c| c.qk_norm_init_scale = Some(2.0), Arch::Lm);
    assert!(e.contains("qk_norm: l2"), "{e}");
}

#[test]
fn layer_counts_belong_to_their_architecture() {
    assert!(refused(|c| c.n_encoder_layers = Some(2), Arch::Lm).contains("seq2seq only"));
    assert!(refused(|c| c.n_layers = None, Arch::Lm).contains("model.n_layers"));
    let e = refused(
        |c| {
            c.n_layers = None;
            c.n_encoder_layers = Some(2)
        },
        Arch::Seq2seq,
    );
    assert!(e.contains("model.n_decoder_layers"), "{e}");
}

#[test]
fn yaml_style_config_rejects_unknown_fields() {
    let json =
        r#"{"arch":"lm","vocab_size":10,"d_model":16,"n_layers":1,"n_heads":2,"d_ff":8,"qk_nrom":"l2"}"#;
    let err = serde_json::from_str::<ModelConfig>(json).unwrap_err().to_string();
    assert!(err.contains("qk_nrom"), "{err}");
    let ok: ModelConfig =
        serde_json::from_str(&json.replace(r#","qk_nrom":"l2""#, r#","qk_norm":"l2""#)).unwrap();
    assert_eq!(ok.qk_norm, ember_model::QkNorm::L2);
}

#[test]
fn norm_bias_defaults_to_on_and_reads_from_json() {
    let mut v = serde_json::to_value(ModelConfig::tiny(Arch::Lm)).unwrap();
    v.as_object_mut().unwrap().remove("norm_bias");
    let c: ModelConfig = serde_json::from_value(v.clone()).unwrap();
    assert!(c.norm_bias, "existing configs keep their LayerNorm biases");
    v["norm_bias"] = false.into();
    let c: ModelConfig = serde_json::from_value(v).unwrap();
    assert!(!c.norm_bias);
}

mod bounds {
    //! Any size above a documented limit is refused by validation, naming its key, before a
    //! tensor is allocated; every size within the limits passes that check.
    use ember_model::{Arch, ModelConfig};
    use ember_model::{MAX_LAYERS, MAX_SEQ_LEN};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn layer_counts_above_the_limit_are_refused_naming_the_key(
            n in (MAX_LAYERS + 1)..=usize::MAX,
            which in 0usize..3,
        ) {
            let (mut c, key) = match which {
                0 => (ModelConfig::tiny(Arch::Lm), "model.n_layers"),
                1 => (ModelConfig::tiny(Arch::Seq2seq), "model.n_encoder_layers"),
                _ => (ModelConfig::tiny(Arch::Seq2seq), "model.n_decoder_layers"),
            };
            match which {
                0 => c.n_layers = Some(n),
                1 => c.n_encoder_layers = Some(n),
                _ => c.n_decoder_layers = Some(n),
            }
            let e = c.validate().unwrap_err().to_string();
            prop_assert!(e.contains(key) && e.contains(&MAX_LAYERS.to_string()), "{}", e);
        }

        #[test]
        fn lengths_above_the_limit_are_refused_naming_the_key(n in (MAX_SEQ_LEN + 1)..=usize::MAX) {
            let mut c = ModelConfig::tiny(Arch::Lm);
            c.max_seq_len = n;
            let e = c.validate().unwrap_err().to_string();
            prop_assert!(e.contains("model.max_seq_len") && e.contains(&MAX_SEQ_LEN.to_string()), "{}", e);
        }

        #[test]
        fn sizes_within_the_limits_pass(layers in 1..=MAX_LAYERS, len in 1..=MAX_SEQ_LEN) {
            let mut c = ModelConfig::tiny(Arch::Lm);
            c.n_layers = Some(layers);
            c.max_seq_len = len;
            prop_assert!(c.validate().is_ok());
        }
    }
}
