//! The JSON files of a Hugging Face model directory besides the weights and tokenizer.
//!
//! Written for transformers 4.x and 5.x alike: RoPE as both the legacy top-level `rope_theta` and
//! v5's `rope_parameters`, the dtype as both `torch_dtype` and `dtype`, and `head_dim` always
//! (Qwen3's default is 128). Ember's special ids are fixed: `<pad>` 0, `<s>` 1, `</s>` 2, `<unk>` 3;
//! a run on a pretrained model's tokenizer (`model.init_from`) has that model's instead, and
//! hands its `tokenizer_config.json` on unchanged.

use ember_data::{SpecialTokens, Tokenizer};
use ember_data::{BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, UNK_TOKEN};
use ember_model::ModelConfig;
use serde_json::{json, Value};

use crate::HfArch;

/// `config.json`; `specials` are the tokenizer's, `dtype` the weights' (`float32`, `bfloat16`).
pub fn model_config(arch: HfArch, m: &ModelConfig, specials: SpecialTokens, dtype: &str) -> Value {
    let mut c = json!({
        "architectures": [arch.class_name()],
        "model_type": arch.model_type(),
        "vocab_size": m.vocab(),
        "hidden_size": m.d_model,
        "intermediate_size": m.d_ff,
        "num_hidden_layers": m.decoder_layers(),
        "num_attention_heads": m.n_heads,
        "num_key_value_heads": m.kv_heads(),
        "head_dim": m.head_dim(),
        "hidden_act": "silu",
        "max_position_embeddings": m.max_seq_len,
        "rms_norm_eps": m.norm_eps,
        "rope_theta": m.rope_theta,
        "rope_parameters": { "rope_type": "default", "rope_theta": m.rope_theta },
        "attention_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": m.init_std,
        "tie_word_embeddings": m.tie_embeddings,
        "bos_token_id": specials.bos,
        "eos_token_id": specials.eos,
        "pad_token_id": specials.pad,
        "torch_dtype": dtype,
        "dtype": dtype,
        "use_cache": true,
    });
    match arch {
        HfArch::Llama => c["mlp_bias"] = json!(false),
        // Qwen2's q, k and v biases are in its code, not its config; its window is off.
        HfArch::Qwen2 => {
            let c = c.as_object_mut().expect("an object");
            c.remove("attention_bias");
            c.insert("use_sliding_window".into(), json!(false));
            c.insert("sliding_window".into(), Value::Null);
            c.insert("max_window_layers".into(), json!(m.decoder_layers()));
        }
        HfArch::Qwen3 => {}
    }
    c
}

/// `generation_config.json`: the special ids, and `ember generate`'s default sampling
/// (temperature 0.8, no top-k or top-p cut).
pub fn generation_config(specials: SpecialTokens) -> Value {
    json!({
        "bos_token_id": specials.bos,
        "eos_token_id": specials.eos,
        "pad_token_id": specials.pad,
        "do_sample": true,
        "temperature": 0.8,
        "top_k": 0,
        "top_p": 1.0,
    })
}

/// `tokenizer_config.json`: without it AutoTokenizer falls back to the model type's own
/// tokenizer class and special tokens, which are not Ember's. A pretrained tokenizer's own is
/// handed on as it was read (its special tokens, chat template and all).
pub fn tokenizer_config(m: &ModelConfig, tokenizer: &Tokenizer) -> Result<Value, serde_json::Error> {
    match tokenizer.pretrained_config() {
        Some(own) => return serde_json::from_str(own),
        None if tokenizer.kind() == ember_data::TokenizerKind::Pretrained => {
            return Ok(json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": m.max_seq_len,
                "clean_up_tokenization_spaces": false,
            }))
        }
        None => {}
    }
    Ok(json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": UNK_TOKEN,
        "model_max_length": m.max_seq_len,
        // Ember trains language models on raw token streams: no bos/eos around a text.
        "add_bos_token": false,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
    }))
}
