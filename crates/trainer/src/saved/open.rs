//! Opening a trained model again, for evaluation and decoding: a run directory (its newest
//! checkpoint), one checkpoint inside it, or a model folder ([`crate::model_dir`]).
//!
//! Decoding needs the weights and the tokenizer only ([`open_model`]); evaluation also needs the
//! data the config names ([`open_run`]), which a released model folder may be used without.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::Device;
use ember_data::{Dataset, Tokenizer};
use ember_model::{Model, ParamStore};

use crate::checkpoint;
use crate::config::RunConfig;
use crate::model_dir::{self, is_model_dir};
use crate::precision;
use crate::run_dir::RUN_CONFIG;
use crate::setup::{device, set_threads};
use crate::tell;

/// A trained model opened for decoding: its config, tokenizer and weights.
pub struct OpenModel {
    pub cfg: RunConfig,
    pub tokenizer: Tokenizer,
    pub model: Model,
    /// The checkpoint's parameters, for rebuilding the model with another configuration.
    pub params: ParamStore,
    pub device: Device,
    /// The checkpoint directory or model folder the weights came from.
    pub checkpoint: PathBuf,
}

/// Opens a run (its newest checkpoint), one checkpoint or a model folder for decoding, on the
/// model's own device or on `device_override` (a run trained on a GPU, decoded on a CPU). The
/// corpus is not read.
pub fn open_model(path: &Path, device_override: Option<&str>) -> Result<OpenModel> {
    if is_model_dir(path) {
        // Checksums first: the config is read only once it is known to be the packaged one.
        model_dir::verify(path)?;
        let (cfg, device) = config_and_device(&path.join(RUN_CONFIG), device_override)?;
        let (tokenizer, params) = model_dir::read(path, &cfg, &device)?;
        let mut model = Model::new(&cfg.model, &params)?;
        set_run_precision(&cfg, &mut model);
        return Ok(OpenModel {
            cfg,
            tokenizer,
            model,
            params,
            device,
            checkpoint: path.to_path_buf(),
        });
    }
    let (run_dir, ckpt_dir) = checkpoint::run_and_checkpoint(path)?;
    let (cfg, device) = config_and_device(&run_dir.join(RUN_CONFIG), device_override)?;
    let tokenizer = model_dir::read_tokenizer(&run_dir, cfg.data.tokenizer.kind)?;
    model_dir::check_tokenizer_fits(&tokenizer, &run_dir, &cfg)?;
    let loaded = load_checkpoint(path, &run_dir, &ckpt_dir, &device)?;
    let model = build_model(&cfg, &run_dir, &loaded)?;
    let params = loaded.params;
    Ok(OpenModel {
        cfg,
        tokenizer,
        model,
        params,
        device,
        checkpoint: ckpt_dir,
    })
}

/// A trained model opened for evaluation: as [`OpenModel`], with the data its config names.
pub struct OpenRun {
    pub cfg: RunConfig,
    pub data: Dataset,
    pub model: Model,
    /// The checkpoint's parameters, for rebuilding the model with another configuration
    /// ([`OpenRun::rebuild`]).
    pub params: ParamStore,
    pub device: Device,
    pub checkpoint: PathBuf,
}

/// Opens a run, one checkpoint or a model folder for evaluation: the model as [`open_model`]
/// does, and the data its config names, tokenised with the model's own tokenizer (a run reuses
/// its token cache; a model folder is only read, so nothing is written into it).
pub fn open_run(path: &Path, device_override: Option<&str>) -> Result<OpenRun> {
    if is_model_dir(path) {
        let m = open_model(path, device_override)?;
        let data = Dataset::prepare_with_tokenizer(&m.cfg.data, m.tokenizer, None).with_context(|| {
            format!(
                "preparing the data that {} names (relative paths are read from the working \
                 directory, as in training)",
                path.join(RUN_CONFIG).display()
            )
        })?;
        return Ok(OpenRun {
            cfg: m.cfg,
            data,
            model: m.model,
            params: m.params,
            device: m.device,
            checkpoint: m.checkpoint,
        });
    }
    let (run_dir, ckpt_dir) = checkpoint::run_and_checkpoint(path)?;
    let (cfg, device) = config_and_device(&run_dir.join(RUN_CONFIG), device_override)?;
    let data = Dataset::prepare(&cfg.data, Some(&run_dir)).context("preparing the data")?;
    let loaded = load_checkpoint(path, &run_dir, &ckpt_dir, &device)?;
    let model = build_model(&cfg, &run_dir, &loaded)?;
    let params = loaded.params;
    Ok(OpenRun {
        cfg,
        data,
        model,
        params,
        device,
        checkpoint: ckpt_dir,
    })
}

impl OpenRun {
    /// Rebuilds the model from the same parameters under `model` (e.g. rotary tables past the
    /// training length, log-n scaling switched); `model` must name the same parameters.
    pub fn rebuild(&mut self, model: ember_model::ModelConfig) -> Result<()> {
        let precision = self.model.precision();
        self.model = Model::new(&model, &self.params)?;
        self.model.set_precision(precision);
        self.cfg.model = model;
        Ok(())
    }
}

/// The config at `config` with the device override applied, the thread pools sized from it and
/// the device opened.
fn config_and_device(config: &Path, device_override: Option<&str>) -> Result<(RunConfig, Device)> {
    let mut cfg = RunConfig::load(config, &[])?;
    if let Some(d) = device_override {
        cfg.device = d.to_string();
    }
    set_threads(&cfg)?;
    let device = device(&cfg.device)?;
    Ok((cfg, device))
}

/// The model the run's `config.yaml` describes, from the checkpoint `loaded`, in the run's
/// precision. A config edited since the checkpoint was saved (another `d_model`, say) is named
/// with the keys that differ, instead of leaving a tensor's shape to speak for it.
fn build_model(cfg: &RunConfig, run_dir: &Path, loaded: &checkpoint::Loaded) -> Result<Model> {
    let mut model = Model::new(&cfg.model, &loaded.params).map_err(|e| {
        let differences = checkpoint::config_differences(&loaded.state.model_config, &cfg.model);
        if differences.is_empty() {
            return e.into();
        }
        anyhow::anyhow!(
            "{} does not describe the model of the checkpoint {} ({}): it was edited after \
             training. Restore it; the checkpoint keeps the config it was trained with, {}",
            run_dir.join(RUN_CONFIG).display(),
            loaded.dir.display(),
            differences.join("; "),
            loaded.dir.join(RUN_CONFIG).display()
        )
    })?;
    set_run_precision(cfg, &mut model);
    Ok(model)
}

/// Gives `model` the products' precision of the run `cfg` where this machine runs it (else f32,
/// saying so).
fn set_run_precision(cfg: &RunConfig, model: &mut Model) {
    let (precision, note) = precision::for_inference(cfg);
    if let Some(note) = note {
        tell!("note: {note}");
    }
    model.set_precision(precision);
}

/// The weights of `ckpt_dir`, verified; a corrupt newest checkpoint names an older one to use.
fn load_checkpoint(
    given: &Path,
    run_dir: &Path,
    ckpt_dir: &Path,
    device: &Device,
) -> Result<checkpoint::Loaded> {
    let loaded = checkpoint::load(ckpt_dir, device).map_err(|e| {
        // Given a run, the newest checkpoint was chosen: an older intact one can be named.
        let older = checkpoint::list(run_dir)
            .into_iter()
            .rev()
            .map(|(_, dir)| dir)
            .find(|dir| dir != ckpt_dir);
        match older {
            Some(dir) if ckpt_dir != given => e.context(format!(
                "the run's newest checkpoint {} cannot be used; to use an earlier one, give its \
                 folder in place of the run (e.g. {})",
                ckpt_dir.display(),
                dir.display()
            )),
            _ => e,
        }
    })?;
    Ok(loaded)
}
