//! Trainable parameters: creation with a reproducible per-name initialisation, lookup, and
//! safetensors I/O.
//!
//! Every parameter's initial values come from a random stream derived from `(seed, name)` alone.
//! Two models built from the same seed therefore share the initial value of every parameter
//! they have in common, whatever else they contain: adding QK-norm gains to one of them shifts
//! nothing in the other. Paired ablations rely on this.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};

use ember_rng::SplitMix64;

/// The model's parameters by name, shared by every `VarBuilder` built from it.
#[derive(Clone)]
pub struct ParamStore {
    inner: Arc<Inner>,
}

struct Inner {
    vars: Mutex<BTreeMap<String, Var>>,
    seed: u64,
    /// When loaded from a checkpoint, a parameter the model asks for but the file lacks is an
    /// error rather than a fresh initialisation.
    strict: bool,
    device: Device,
    dtype: DType,
}

impl ParamStore {
    /// An empty store; parameters are created on first request, initialised from `(seed, name)`.
    pub fn new(seed: u64, dtype: DType, device: &Device) -> Self {
        Self::with(BTreeMap::new(), seed, false, dtype, device)
    }

    /// A store holding the tensors of a safetensors file; asking for any other name fails.
    pub fn load(path: &Path, dtype: DType, device: &Device) -> Result<Self> {
        let tensors = candle_core::safetensors::load(path, device)
            .map_err(|e| e.context(format!("reading parameters from {}", path.display())))?;
        Self::from_tensors(tensors, dtype, device)
    }

    /// A store holding the given tensors; asking for any other name fails.
    pub fn from_tensors(
        tensors: impl IntoIterator<Item = (String, Tensor)>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut vars = BTreeMap::new();
        for (name, t) in tensors {
            vars.insert(name, Var::from_tensor(&t.to_dtype(dtype)?.to_device(device)?)?);
        }
        Ok(Self::with(vars, 0, true, dtype, device))
    }

    fn with(vars: BTreeMap<String, Var>, seed: u64, strict: bool, dtype: DType, device: &Device) -> Self {
        Self {
            inner: Arc::new(Inner {
                vars: Mutex::new(vars),
                seed,
                strict,
                device: device.clone(),
                dtype,
            }),
        }
    }

    /// A `VarBuilder` over this store, for the model constructors.
    pub fn var_builder(&self) -> VarBuilder<'static> {
        VarBuilder::from_backend(
            Box::new(self.clone()),
            self.inner.dtype,
            self.inner.device.clone(),
        )
    }

    pub fn device(&self) -> &Device {
        &self.inner.device
    }
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Var>> {
        // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
        self.inner.vars.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// All parameters, sorted by name.
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.lock().iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    pub fn get(&self, name: &str) -> Option<Var> {
        self.lock().get(name).cloned()
    }

    /// Total number of scalar parameters (a tied embedding counts once).
    pub fn num_params(&self) -> usize {
        self.lock().values().map(|v| v.elem_count()).sum()
    }

    /// Writes every parameter to a safetensors file, under the names the model gave them.
    pub fn save(&self, path: &Path) -> Result<()> {
        let tensors: std::collections::HashMap<String, Tensor> = self
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect();
        candle_core::safetensors::save(&tensors, path)
    }

    /// Overwrites the values of existing parameters (same names and shapes) from `other`.
    pub fn copy_from(&self, other: &ParamStore) -> Result<()> {
        let mine = self.lock();
        let theirs = other.lock();
        for (name, var) in mine.iter() {
            let src = theirs.get(name).ok_or_else(|| {
                candle_core::Error::Msg(format!("parameter {name} is missing from the source"))
            })?;
            var.set(&src.as_tensor().to_dtype(var.dtype())?.to_device(var.device())?)?;
        }
        Ok(())
    }

    /// Names present in the store that the model never asked for (a checkpoint of a different
    /// architecture, typically). Call after building the model from a loaded store.
    pub fn unused(&self, used: &[String]) -> Vec<String> {
        self.lock()
            .keys()
            .filter(|k| !used.contains(k))
            .cloned()
            .collect()
    }
}

impl SimpleBackend for ParamStore {
    fn get(&self, shape: Shape, name: &str, init: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        let mut vars = self.lock();
        if let Some(var) = vars.get(name) {
            if var.shape() != &shape {
                candle_core::bail!(
                    "parameter {name} has shape {:?}, but the model configuration needs {:?}",
                    var.shape(),
                    shape
                );
            }
            return Ok(var.as_tensor().clone());
        }
        if self.inner.strict {
            candle_core::bail!("parameter {name} is missing from the checkpoint");
        }
        let values = init_values(&shape, init, self.inner.seed, name);
        let t = Tensor::from_vec(values, shape, dev)?.to_dtype(dtype)?;
        let var = Var::from_tensor(&t)?;
        let out = var.as_tensor().clone();
        vars.insert(name.to_string(), var);
        Ok(out)
    }

    fn get_unchecked(&self, name: &str, _dtype: DType, _dev: &Device) -> Result<Tensor> {
        match self.lock().get(name) {
            Some(v) => Ok(v.as_tensor().clone()),
            None => candle_core::bail!("parameter {name} does not exist"),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.lock().contains_key(name)
    }
}

/// Draws the initial values of one parameter from its own `(seed, name)` stream, in f64 so the
/// values do not depend on the dtype the model trains in beyond the final rounding.
fn init_values(shape: &Shape, init: Init, seed: u64, name: &str) -> Vec<f64> {
    let n = shape.elem_count();
    let mut rng = SplitMix64::for_stream(seed, name);
    match init {
        Init::Const(c) => vec![c; n],
        Init::Randn { mean, stdev } => (0..n).map(|_| mean + stdev * rng.normal()).collect(),
        Init::Uniform { lo, up } => (0..n).map(|_| lo + (up - lo) * rng.uniform()).collect(),
        Init::Kaiming { .. } => {
            // Not used by Ember's layers; fall back to a fan-in scaled normal.
            let fan_in = shape.dims().last().copied().unwrap_or(1).max(1) as f64;
            (0..n).map(|_| rng.normal() / fan_in.sqrt()).collect()
        }
    }
}
