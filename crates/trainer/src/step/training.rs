//! A run's model, optimizer, data and schedule, and the step that trains them: what
//! `ember train` runs in its loop and `ember bench` times, set up once for both.
//!
//! `setup` builds a [`Training`]: in a run directory, fresh or resumed (`TrainingRun`), or in
//! memory with nothing written, for the benchmark (`Training::in_memory`).

use std::time::Instant;

use anyhow::Result;
use candle_core::Device;
use ember_data::{Batch, Batcher, Dataset};
use ember_model::{Model, ParamStore};

use crate::config::RunConfig;
use crate::data_parallel::DataParallel;
use crate::optim::{AdamW, LrSchedule};
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
