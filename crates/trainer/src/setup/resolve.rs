//! Completing a config from its data: the model fields the data fills in (the vocabulary size
//! and the QK-norm and log-n lengths) and the checks that the data fits the model's positions
//! and the batch shape.

use anyhow::{bail, Result};
use ember_data::{Dataset, Splits, TokenizerKind};
use ember_model::{ModelConfig, QkNorm};

use crate::config::{Batching, RunConfig};

/// The model fields a config leaves to the data, each `true` where [`resolve_model_config`]
/// fills it in: `model.vocab_size` when left out; for `qk_norm: l2` without
/// `qk_norm_init_scale` or `qk_norm_length`, the QK-norm length; for `logn_attention` without
/// `logn_length`, the log-n length (on a text corpus; a translation corpus leaves it unset).
///
/// A planned config and the config a run directory holds differ in these fields only because
/// the data filled them: [`DataFilled::fill_from`] copies them over before the two are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataFilled {
    pub vocab_size: bool,
    pub qk_norm_length: bool,
    pub logn_length: bool,
}

impl DataFilled {
    /// The fields `model` leaves to the data.
    pub fn of(model: &ModelConfig) -> Self {
        Self {
            vocab_size: model.vocab_size.is_none(),
            qk_norm_length: model.qk_norm == QkNorm::L2
                && model.qk_norm_init_scale.is_none()
                && model.qk_norm_length.is_none(),
            logn_length: model.logn_attention && model.logn_length.is_none(),
        }
    }

    /// Fills the fields `model` leaves to the data with those of `resolved` (the same config
    /// completed from its data), so that what still differs is what the configs themselves say.
    pub fn fill_from(model: &mut ModelConfig, resolved: &ModelConfig) {
        let open = Self::of(model);
        if open.vocab_size {
            model.vocab_size = resolved.vocab_size;
        }
        if open.qk_norm_length {
            model.qk_norm_length = resolved.qk_norm_length;
        }
        if open.logn_length {
            model.logn_length = resolved.logn_length;
        }
    }
}

/// Fills in what the config leaves to the data ([`DataFilled`]): the vocabulary size; for
/// `qk_norm: l2`, the length L of g₀ = log2(L² − L) (the 97.5th-percentile training length, as
/// Henry et al.); and for `logn_attention` on a text corpus, the training length m =
/// `train.block_size`.
pub fn resolve_model_config(cfg: &mut RunConfig, data: &Dataset) -> Result<()> {
    let open = DataFilled::of(&cfg.model);
    let vocab = data.tokenizer.vocab_size();
    match cfg.model.vocab_size {
        None => cfg.model.vocab_size = Some(vocab),
        // A pretrained model's embedding may have rows no token uses (Qwen3 pads its 151,669
        // tokens to 151,936); an id past its rows would have no embedding at all.
        Some(v) if data.tokenizer.kind() == TokenizerKind::Pretrained => {
            if v < vocab {
                bail!(
                    "model.vocab_size is {v}, but the tokenizer has {vocab} tokens: ids from {v} on \
                     would have no embedding; the tokenizer is not the model's own"
                )
            }
        }
        Some(v) if v != vocab => bail!(
            "model.vocab_size is {v} but the tokenizer has {vocab} tokens; remove model.vocab_size \
                        to take it from the tokenizer"
        ),
        Some(_) => {}
    }
    let text_length = cfg.text_training_length();
    let m = &mut cfg.model;
    if open.qk_norm_length {
        let length = match &data.splits {
            // +1: the decoder sees bos + target, the loss target + eos.
            Splits::Translation(s) => s
                .train
                .stats
                .p975_source_len
                .max(s.train.stats.p975_target_len + 1),
            Splits::Text(_) => text_length,
        };
        m.qk_norm_length = Some(length.max(2));
    }
    if open.logn_length {
        if let Splits::Text(_) = &data.splits {
            m.logn_length = Some(text_length.max(2));
        }
    }
    m.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Checks the data against the model's positions and the batch shape at load, before any
/// training time is spent: over-long pairs by `data.too_long`, and a language model's
/// validation text long enough for one window.
pub(crate) fn check_data_fits(cfg: &RunConfig, data: &mut Dataset, notes: &mut Vec<String>) -> Result<()> {
    let report = ember_data::fit_to_positions(&mut data.splits, &cfg.data, cfg.model.max_seq_len)?;
    notes.extend(report.describe(cfg.model.max_seq_len));
    let (
        Splits::Text(s),
        Batching::Windows {
            block_size: block, ..
        },
    ) = (&data.splits, Batching::of(cfg)?)
    else {
        return Ok(());
    };
    for (split, len) in [("training", s.train.len()), ("validation", s.valid.len())] {
        if len <= block {
            let advice = match &cfg.data.corpus {
                ember_data::CorpusConfig::Text(t) if t.path.is_some() && split == "validation" => {
                    format!(
                        "raise data.corpus.val_fraction (now {}) so that more of the text is held out, \
                        or lower train.block_size",
                        t.val_fraction.unwrap_or(ember_data::DEFAULT_VAL_FRACTION)
                    )
                }
                ember_data::CorpusConfig::Text(t) if split == "validation" => format!(
                    "add text to data.corpus.val_files ({}), or lower train.block_size",
                    t.val_files
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => "add training text, or lower train.block_size".to_string(),
            };
            bail!(
                "the {split} text has {len} tokens, but one window needs train.block_size + 1 = {} \
                        (the inputs and the next-token targets); {advice}",
                block + 1
            );
        }
    }
    Ok(())
}
