//! Specification of `ember export --format hf`: a decoder-only run whose architecture maps is
//! written as a transformers model directory (Llama without QK-norm, Qwen3 with RMSNorm QK-norm)
//! whose weights are the checkpoint's, under transformers' names; a run that does not map is
//! refused with every blocking setting named. (That transformers loads the directory and gives
//! Ember's logits is checked by scripts/check-hf-export.py, where torch is installed.)

use std::collections::BTreeMap;
use std::path::Path;

use ember_export::{
    architecture, export_hf, export_hf_as, hf_weight_name, ExportDtype, ExportSource, HfArch, HF_FILES,
};
use ember_model::{Arch, MlpKind, ModelConfig, NormKind, QkNorm};
use ember_trainer::config::RunConfig;
use ember_trainer::metrics::Verbosity;
use ember_trainer::{train, TrainOptions};
use serde_json::Value;

fn lm_yaml(text: &Path, qk_norm: &str, tie: bool) -> String {
    format!(
        r#"
model:
  arch: lm
  d_model: 32
  n_layers: 2
  n_heads: 4
  n_kv_heads: 2
  d_ff: 48
  max_seq_len: 32
  qk_norm: {qk_norm}
  tie_embeddings: {tie}
data:
  corpus: {{ kind: text, path: "{}", val_fraction: 0.1 }}
  tokenizer: {{ kind: char }}
train:
  steps: 3
  seed: 5
  lr: 3.0e-3
  batch_size: 4
  block_size: 16
  log_every: 1
checkpoint:
  every: 3
"#,
        text.display()
    )
}

/// Trains a 3-step run in `dir/name` and returns its directory.
fn trained_run(dir: &Path, name: &str, qk_norm: &str, tie: bool) -> std::path::PathBuf {
    let text = dir.join("corpus.txt");
    let lines: String = (0..200)
        .map(|i| format!("line {i}: the quick brown fox.\n"))
        .collect();
    std::fs::write(&text, lines).unwrap();
    let cfg = RunConfig::from_yaml(&lm_yaml(&text, qk_norm, tie), Path::new("t.yaml"), &[]).unwrap();
    let run = dir.join(name);
    train(
        cfg,
        &TrainOptions {
            verbosity: Verbosity::Quiet,
            ..TrainOptions::new(&run)
        },
    )
    .unwrap();
    run
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// name -> (shape, f32 values) of a safetensors file.
fn tensors(path: &Path) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

#[test]
fn a_qk_rmsnorm_run_exports_as_qwen3_with_the_checkpoint_weights_under_transformers_names() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained_run(tmp.path(), "qwen", "rmsnorm", false);
    let source = ExportSource::open(&run).unwrap();
    let out = tmp.path().join("hf");
    let exported = export_hf(&source, &out).unwrap();
    assert_eq!(exported.arch, HfArch::Qwen3);
    for f in HF_FILES {
        assert!(out.join(f).is_file(), "{f}");
    }

    let c = read_json(&out.join("config.json"));
    let vocab = source.tokenizer.vocab_size();
    assert_eq!(c["architectures"][0], "Qwen3ForCausalLM");
    assert_eq!(c["model_type"], "qwen3");
    assert_eq!(c["vocab_size"], vocab);
    assert_eq!(c["hidden_size"], 32);
    assert_eq!(c["intermediate_size"], 48);
    assert_eq!(c["num_hidden_layers"], 2);
    assert_eq!(
        (
            c["num_attention_heads"].as_u64(),
            c["num_key_value_heads"].as_u64()
        ),
        (Some(4), Some(2))
    );
    assert_eq!(
        c["head_dim"], 8,
        "Qwen3's default head_dim is 128: it must be written"
    );
    assert_eq!(c["rope_theta"], 10000.0);
    assert_eq!(c["rope_parameters"]["rope_theta"], 10000.0);
    assert_eq!(c["rms_norm_eps"], 1e-5);
    assert_eq!(c["tie_word_embeddings"], false);
    assert_eq!(c["max_position_embeddings"], 32);
    let tc = read_json(&out.join("tokenizer_config.json"));
    assert_eq!(tc["tokenizer_class"], "PreTrainedTokenizerFast");
    assert_eq!(
        std::fs::read_to_string(out.join("tokenizer.json")).unwrap(),
        std::fs::read_to_string(run.join("tokenizer.json")).unwrap(),
        "the run's tokenizer, unchanged"
    );

    // Every checkpoint tensor, bit for bit, under its transformers name; nothing else.
    let ckpt = tensors(&exported.checkpoint.join("model.safetensors"));
    let hf = tensors(&out.join("model.safetensors"));
    assert_eq!(
        hf.len(),
        2 * 11 + 3,
        "per layer 9 + q/k norms; embedding, final norm, lm_head"
    );
    assert_eq!(ckpt.len(), hf.len());
    for (name, value) in &ckpt {
        let hf_name = hf_weight_name(name).unwrap_or_else(|| panic!("{name} has no transformers name"));
        assert_eq!(hf.get(&hf_name), Some(value), "{name} -> {hf_name}");
    }
    let shape = |n: &str| hf[n].0.clone();
    assert_eq!(shape("model.embed_tokens.weight"), vec![vocab, 32]);
    assert_eq!(shape("lm_head.weight"), vec![vocab, 32]);
    assert_eq!(shape("model.layers.1.self_attn.q_proj.weight"), vec![4 * 8, 32]);
    assert_eq!(shape("model.layers.1.self_attn.k_proj.weight"), vec![2 * 8, 32]);
    assert_eq!(shape("model.layers.1.self_attn.q_norm.weight"), vec![8]);
    assert_eq!(shape("model.layers.0.mlp.down_proj.weight"), vec![32, 48]);
    let header = std::fs::read(out.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(header[..8].try_into().unwrap()) as usize;
    let meta: Value = serde_json::from_slice(&header[8..8 + n]).unwrap();
    assert_eq!(
        meta["__metadata__"]["format"], "pt",
        "transformers checks the format metadata"
    );
}

/// `--dtype bf16`: every tensor stored in bf16, each the checkpoint's f32 weight rounded to
/// nearest even (the raw bits of the rounding, half the file), config.json saying bfloat16; and
/// the reference logits are those of the rounded weights, which transformers computes from the
/// export in float32.
#[test]
fn a_bf16_export_stores_each_weight_rounded_to_nearest_even() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained_run(tmp.path(), "run", "rmsnorm", false);
    let source = ExportSource::open(&run).unwrap();
    let (full, half) = (tmp.path().join("f32"), tmp.path().join("bf16"));
    export_hf(&source, &full).unwrap();
    let exported = export_hf_as(&source, &half, ExportDtype::Bf16).unwrap();
    assert_eq!(exported.dtype, ExportDtype::Bf16);
    let c = read_json(&half.join("config.json"));
    assert_eq!(
        (c["torch_dtype"].as_str(), c["dtype"].as_str()),
        (Some("bfloat16"), Some("bfloat16"))
    );
    assert_eq!(read_json(&full.join("config.json"))["torch_dtype"], "float32");

    let f32_weights = tensors(&full.join("model.safetensors"));
    let bytes = std::fs::read(half.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensors().len(), f32_weights.len());
    for (name, view) in st.tensors() {
        assert_eq!(view.dtype(), safetensors::Dtype::BF16, "{name}");
        let (shape, values) = &f32_weights[&name];
        assert_eq!(view.shape(), shape.as_slice(), "{name}");
        let stored: Vec<u16> = view
            .data()
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        let rounded: Vec<u16> = values
            .iter()
            .map(|x| {
                // Round to nearest, ties to even (the weights are finite).
                let b = x.to_bits();
                ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
            })
            .collect();
        assert_eq!(
            stored, rounded,
            "{name}: not the f32 weights rounded to nearest even"
        );
    }
    let size = |d: &Path| std::fs::metadata(d.join("model.safetensors")).unwrap().len() as f64;
    assert!(
        size(&half) < 0.55 * size(&full),
        "{} vs {}",
        size(&half),
        size(&full)
    );

    let tokens = source.tokenizer.encode("line 7: the quick").unwrap();
    let exact = source.logits(&tokens).unwrap();
    let of_rounded = source.logits_as(&tokens, ExportDtype::Bf16).unwrap();
    assert_ne!(
        exact, of_rounded,
        "the reference logits of a bf16 export use the rounded weights"
    );
    let worst = exact
        .iter()
        .flatten()
        .zip(of_rounded.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 0.1, "rounding the weights moved a logit by {worst}");
}

#[test]
fn a_run_without_qk_norm_exports_as_llama_and_a_tied_head_is_not_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained_run(tmp.path(), "llama", "none", true);
    let out = tmp.path().join("hf");
    let exported = export_hf(&ExportSource::open(&run).unwrap(), &out).unwrap();
    assert_eq!(exported.arch, HfArch::Llama);
    let c = read_json(&out.join("config.json"));
    assert_eq!(c["architectures"][0], "LlamaForCausalLM");
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(c["mlp_bias"], false);
    let hf = tensors(&out.join("model.safetensors"));
    assert_eq!(hf.len(), 2 * 9 + 2);
    assert!(!hf.contains_key("lm_head.weight"));
    assert!(!hf.keys().any(|k| k.contains("q_norm")));
}

fn model(arch: Arch, norm: NormKind, mlp: MlpKind, qk_norm: QkNorm) -> ModelConfig {
    ModelConfig {
        init_from: None,
        arch,
        vocab_size: Some(40),
        d_model: 32,
        n_layers: Some(2),
        n_encoder_layers: None,
        n_decoder_layers: None,
        n_heads: 4,
        n_kv_heads: None,
        head_dim: None,
        qkv_bias: false,
        d_ff: 64,
        mlp,
        norm,
        norm_placement: ember_model::NormPlacement::Pre,
        norm_bias: true,
        norm_eps: 1e-5,
        rope_theta: 10000.0,
        max_seq_len: 32,
        positions: ember_model::Positions::Rope,
        qk_norm,
        qk_norm_init_scale: None,
        qk_norm_length: None,
        logn_attention: false,
        logn_length: None,
        dropout: 0.0,
        attn_dropout: 0.0,
        tie_embeddings: true,
        scale_embeddings: false,
        init_std: 0.02,
        init_scheme: ember_model::InitScheme::Normal,
        proj_bias: false,
    }
}

#[test]
fn a_run_that_does_not_map_is_refused_with_every_blocking_setting_named() {
    let ok = model(Arch::Lm, NormKind::Rmsnorm, MlpKind::Swiglu, QkNorm::None);
    assert_eq!(architecture(&ok), Ok(HfArch::Llama));
    let blockers = architecture(&model(
        Arch::Seq2seq,
        NormKind::Layernorm,
        MlpKind::Gelu,
        QkNorm::L2,
    ))
    .unwrap_err();
    let keys: Vec<&str> = blockers.iter().map(|b| b.split(':').next().unwrap()).collect();
    assert_eq!(
        keys,
        ["model.arch", "model.norm", "model.mlp", "model.qk_norm"],
        "{blockers:?}"
    );
    assert!(blockers[0].contains("seq2seq"));
    assert!(blockers[3].contains("l2"));
    let blockers = architecture(&model(
        Arch::Lm,
        NormKind::Rmsnorm,
        MlpKind::Swiglu,
        QkNorm::Layernorm,
    ))
    .unwrap_err();
    assert_eq!(blockers.len(), 1);
    assert!(
        blockers[0].starts_with("model.qk_norm: layernorm"),
        "{blockers:?}"
    );
    // Learned or no positions, log-n scaling and fairseq's biases have no Llama/Qwen3
    // counterpart either.
    for (cfg, key) in [
        (
            ModelConfig {
                proj_bias: true,
                ..ok.clone()
            },
            "model.proj_bias: true (",
        ),
        (
            ModelConfig {
                positions: ember_model::Positions::Learned,
                ..ok.clone()
            },
            "model.positions: learned (",
        ),
        (
            ModelConfig {
                logn_attention: true,
                ..ok.clone()
            },
            "model.logn_attention: true (",
        ),
    ] {
        let blockers = architecture(&cfg).unwrap_err();
        assert_eq!(blockers.len(), 1, "{blockers:?}");
        assert!(blockers[0].starts_with(key), "{blockers:?}");
        assert!(
            !blockers[0].contains("  "),
            "one space between words: {blockers:?}"
        );
    }

    // Through a real run: the error names the run and the settings, and nothing is written.
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("corpus.txt");
    std::fs::write(&text, "abc def ghi\n".repeat(100)).unwrap();
    let yaml = lm_yaml(&text, "l2", true) + "\n";
    let cfg = RunConfig::from_yaml(&yaml, Path::new("t.yaml"), &["model.mlp=gelu".to_string()]).unwrap();
    let run = tmp.path().join("l2");
    train(
        cfg,
        &TrainOptions {
            verbosity: Verbosity::Quiet,
            ..TrainOptions::new(&run)
        },
    )
    .unwrap();
    let out = tmp.path().join("hf");
    let err = export_hf(&ExportSource::open(&run).unwrap(), &out)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("cannot export "), "{err}");
    assert!(err.contains("model.mlp: gelu"), "{err}");
    assert!(err.contains("model.qk_norm: l2"), "{err}");
    assert!(!out.exists(), "nothing is written for a run that does not map");
}
