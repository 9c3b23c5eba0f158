//! `model.init_from: DIR`: a run that starts from a Hugging Face model folder (`config.json`,
//! `*.safetensors`, `tokenizer.json`) instead of random weights.
//!
//! When the config loads ([`complete`]), the folder's `config.json` fills in the model section:
//! its architecture keys (one the YAML gives must agree, since the weights fix it) and what it
//! suggests for the rest (`max_seq_len` from `max_position_embeddings`, attention dropout, the
//! init std), which the YAML may set otherwise; and `data.tokenizer` becomes the model's own
//! (`kind: pretrained` at DIR). So the `config.yaml` a run directory keeps states the whole
//! architecture, and reading it back needs the folder no more. At set-up ([`load_model`]), after
//! the memory check, the folder's weights become the initial parameters. From there the run is
//! like any other: its checkpoints hold the weights, which resuming, evaluating, generating and
//! exporting read.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::Device;
use ember_data::{TokenizerConfig, TokenizerKind};
use ember_import::{ARCHITECTURE_KEYS, CONFIG_FILE};
use ember_model::{Model, ModelConfig, ParamStore};
use serde_json::{Map, Value};

/// Fills in what `model.init_from` decides in the config `tree` (a no-op without it): the model
/// section from the folder's config.json, and the model's own tokenizer. A `config.yaml` that
/// already states every architecture key is taken as it is when the folder is gone. A failure
/// is (key path, message), as the config's own checks give it.
pub(crate) fn complete(tree: &mut Value) -> Result<(), (String, String)> {
    let Some(dir) = tree
        .get("model")
        .and_then(|m| m.get("init_from"))
        .and_then(Value::as_str)
        .map(PathBuf::from)
    else {
        return Ok(());
    };
    let Some(model) = tree.get_mut("model").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let stated = |m: &Map<String, Value>, key: &str| m.get(key).filter(|v| !v.is_null()).cloned();
    // A config.yaml leaves qkv_bias out when it is false (so configs from before it hash the same).
    let all_stated = ARCHITECTURE_KEYS
        .iter()
        .all(|k| stated(model, k).is_some() || *k == "qkv_bias");
    if !all_stated || dir.join(CONFIG_FILE).exists() {
        let hf =
            ember_import::read_config(&dir).map_err(|e| ("model.init_from".to_string(), format!("{e:#}")))?;
        for (key, value, source) in &hf.architecture {
            match stated(model, key) {
                None => {
                    model.insert(key.to_string(), value.clone());
                }
                Some(given) if same(&given, value) => {}
                Some(given) => {
                    return Err((
                        format!("model.{key}"),
                        format!(
                            "is {}, but {} gives {} (`{source}`); the imported weights fix the \
                             architecture, so leave model.{key} out",
                            show(&given),
                            dir.join(CONFIG_FILE).display(),
                            show(value)
                        ),
                    ))
                }
            }
        }
        for (key, value) in &hf.defaults {
            if stated(model, key).is_none() {
                model.insert(key.to_string(), value.clone());
            }
        }
    }
    own_tokenizer(tree, &dir)
}

/// Sets `data.tokenizer` to the model's own tokenizer; a different one given is an error.
fn own_tokenizer(tree: &mut Value, dir: &Path) -> Result<(), (String, String)> {
    let own = TokenizerConfig {
        kind: TokenizerKind::Pretrained,
        path: Some(dir.to_path_buf()),
        ..TokenizerConfig::default()
    };
    let Some(root) = tree.as_object_mut() else {
        return Ok(());
    };
    let data = root.entry("data").or_insert(Value::Null);
    if data.is_null() {
        *data = Value::Object(Map::new());
    }
    let Some(data) = data.as_object_mut() else {
        return Ok(());
    };
    match data.get("tokenizer").filter(|t| !t.is_null()) {
        None => {
            let value =
                serde_json::to_value(&own).map_err(|e| ("data.tokenizer".to_string(), e.to_string()))?;
            data.insert("tokenizer".into(), value);
            Ok(())
        }
        Some(given) if serde_json::from_value::<TokenizerConfig>(given.clone()).ok() == Some(own) => Ok(()),
        Some(_) => Err((
            "data.tokenizer".into(),
            format!(
                "a model imported with model.init_from reads text with its own tokenizer ({}); \
                 leave data.tokenizer out",
                dir.join(ember_data::TOKENIZER_FILE).display()
            ),
        )),
    }
}

/// Equal as config values: numbers by value (`1e-6` and `1.0e-06`, `64` and `64.0`), the rest
/// exactly.
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The model of a run that starts from `cfg.init_from`: the folder's weights (checked against
/// `cfg` from the files' headers before any value is read, and finite) as f32 parameters on
/// `device`; what the import has to say (which weight files, an unused head) is said as a
/// warning.
pub(crate) fn load_model(cfg: &ModelConfig, device: &Device) -> Result<(Model, ParamStore)> {
    let dir = cfg
        .init_from
        .as_deref()
        .context("load_model needs model.init_from")?;
    let imported = ember_import::load_weights(dir, cfg, device)
        .with_context(|| format!("model.init_from: loading the weights of {}", dir.display()))?;
    for note in &imported.notes {
        crate::tell!("warning: model.init_from: {note}");
    }
    let params = imported.params;
    let model = Model::new(cfg, &params)
        .with_context(|| format!("model.init_from: building the model from {}", dir.display()))?;
    Ok((model, params))
}
