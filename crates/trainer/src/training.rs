//! A run's model, optimizer, data and schedule, and the step that trains them: what
//! `ember train` runs in its loop and `ember bench` times, set up once for both.
//!
//! [`crate::setup::TrainingRun`] builds a [`Training`] in a run directory (fresh or resumed);
//! [`Training::in_memory`] builds one with nothing written, for the benchmark.

use std::time::Instant;

use anyhow::Result;
use candle_core::{DType, Device};
use ember_data::{Batch, Batcher, Dataset};
use ember_model::{init_model, Model, ParamStore};

use crate::config::RunConfig;
use crate::data_parallel::DataParallel;
use crate::optim::{AdamW, LrSchedule};
use crate::resolve::resolve_model_config;
use crate::setup::{device, make_batcher, set_threads};
use crate::step::{micro_batches, StepOutput};
use crate::update::{Outcome, Updater};

/// Everything a training step needs, ready for the next step.
pub(crate) struct Training {
    /// The config completed from the data.
    pub cfg: RunConfig,
    pub device: Device,
    pub data: Dataset,
    pub model: Model,
    pub params: ParamStore,
    pub opt: AdamW,
    /// Where each step's update is judged: the host, or the device (CUDA).
    pub updater: Updater,
    pub schedule: LrSchedule,
    pub batcher: Box<dyn Batcher>,
    pub total_steps: u64,
}

/// What one step did.
pub(crate) struct Stepped {
    /// The step's micro-batches.
    pub batches: Vec<Batch>,
    /// Its losses and gradients, reduced over the shares and the ranks.
    pub out: StepOutput,
    /// Some rank's stop signal, agreed by all: every rank stops after this step.
    pub stop: Option<i32>,
    /// The learning rate the update was given.
    pub lr: f64,
    pub outcome: Outcome,
    /// When the forward pass began (the micro-batches drawn) and when the update did.
    pub began: Instant,
    pub update_began: Instant,
}

impl Training {
    /// A fresh run of `total_steps` steps on `cfg` with nothing written anywhere (the data is
    /// prepared without a run directory), set up as [`crate::setup::TrainingRun`] sets up a
    /// fresh run: for `ember bench`, as one rank of `dp`'s job.
    pub fn in_memory(mut cfg: RunConfig, total_steps: u64, dp: &DataParallel) -> Result<Self> {
        set_threads(&cfg)?;
        let device = device(&cfg.device)?;
        let mut data = Dataset::prepare(&cfg.data, None)?;
        resolve_model_config(&mut cfg, &data)?;
        ember_data::fit_to_positions(&mut data.splits, &cfg.data, cfg.model.max_seq_len)?;
        crate::limits::check_memory(&cfg, &data)?;
        let (model, params) = initial_model(&cfg, &device)?;
        let batcher = make_batcher(&cfg, &data)?;
        let opt = AdamW::new(params.vars(), &cfg.train)?;
        let schedule = LrSchedule::new(&cfg.train, total_steps);
        let updater = Updater::new(&device, &opt, 0, !dp.world().is_launched())?;
        Ok(Self {
            cfg,
            device,
            data,
            model,
            params,
            opt,
            updater,
            schedule,
            batcher,
            total_steps,
        })
    }

    /// Trains step `step` (counted from 1): draws its `train.accumulation` micro-batches, runs
    /// forward and backward over them as this rank's shares of `dp`'s job, and applies the
    /// update at the schedule's learning rate, judged where the updater judges it (the host,
    /// or the device). `telemetry` measures attention statistics in the forward pass (which
    /// changes no value); `spike_loss` is the loss above which an update counts as a spike;
    /// `local_stop` is this process's stop signal, agreed with the other ranks in the step.
    pub fn step(
        &mut self,
        dp: &DataParallel,
        step: u64,
        telemetry: bool,
        spike_loss: Option<f64>,
        local_stop: Option<i32>,
    ) -> Result<Stepped> {
        let batches = micro_batches(self.batcher.as_mut(), self.cfg.train.accumulation);
        let began = Instant::now();
        let reduced = dp.forward_backward(
            &self.model,
            self.opt.params(),
            &batches,
            &self.cfg.train,
            &self.device,
            step,
            telemetry,
            local_stop,
        )?;
        let lr = self.schedule.at(step);
        let update_began = Instant::now();
        let outcome =
            self.updater
                .update(&mut self.opt, &reduced.out, lr, step, spike_loss, &self.cfg.train)?;
        Ok(Stepped {
            batches,
            out: reduced.out,
            stop: reduced.stop,
            lr,
            outcome,
            began,
            update_began,
        })
    }
}

/// A fresh run's model: `model.init_from`'s weights, or initialised from `train.seed`.
pub(crate) fn initial_model(cfg: &RunConfig, device: &Device) -> Result<(Model, ParamStore)> {
    match cfg.model.init_from {
        Some(_) => crate::init_from::load_model(&cfg.model, device),
        None => Ok(init_model(&cfg.model, cfg.train.seed, DType::F32, device)?),
    }
}
