//! Data-parallel training: every rank computes the gradient of its share of each batch, and the
//! ranks sum them.
//!
//! Every rank runs the same batcher, so each draws the step's whole micro-batches and keeps
//! share `rank` of `world` of each ([`Batch::share`]): the union over ranks is the batch one
//! process would take, and the token budget and learning rate mean the same at any world size.
//! Each rank divides its losses by the step's global target-token count (known to every rank:
//! it sees the whole batch), so the sum of the ranks' gradients is the step's gradient exactly as
//! one process accumulates it. The sum is one `MPI_Allreduce` per bucket of parameters
//! (`distributed.bucket_mib`), after the backward pass: candle's backward returns all gradients
//! at once, with no hook to start a bucket early. Clipping, the non-finite check and AdamW then
//! see the same gradients on every rank, so the weights stay identical; the ranks compare a
//! SHA-256 of them at every checkpoint and refuse to go on if they differ.
//!
//! The same split serves one process: `train.shares: S` splits every micro-batch into S shares
//! by rows, and the process computes them at once, one per worker of the kernels' pool (each
//! share's kernels then run on its own thread, other workers joining in only when idle), and sums
//! them in share order. Concurrent shares use two cores better than each op split over both
//! (1.2–1.4× per step at 2 threads, docs/performance.md): no hand-off between threads per op,
//! and candle's serial work (the autograd bookkeeping, its elementwise ops) runs on both cores
//! at once. In a job of W ranks each rank computes S shares of the W·S. One process with
//! `train.shares: 2` computes the same two shares as a 2-rank job, summed as the same two-term
//! sum, so the two agree bit for bit (tested).

use std::ops::Range;
use std::rc::Rc;
use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use ember_data::Batch;
use ember_distributed::World;
use ember_model::Model;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::TrainConfig;
use crate::optim::Param;
use crate::step::{forward_backward, gradient_sums, GradientSums, LossSums, Share, StepOutput};

/// How this process takes part in training: alone or as one rank of a job, its share of each
/// batch whole or split.
pub struct DataParallel {
    world: Rc<World>,
    /// The shares of each batch this process computes: rank r of W with S shares each computes
    /// r·S..(r+1)·S of the W·S.
    shares: Range<usize>,
    /// Shares per batch: ranks × `train.shares`.
    n_shares: usize,
    bucket_floats: usize,
    /// The NCCL communicator of a CUDA job, made at its first step.
    #[cfg(feature = "nccl")]
    nccl: std::cell::OnceCell<crate::nccl::NcclSum>,
}

/// A step's gradients summed over the ranks, and the stop signal any rank received during it.
pub struct ReducedStep {
    pub out: StepOutput,
    /// Some rank's stop signal (the highest number, if several): every rank stops after this step.
    pub stop: Option<i32>,
}

impl DataParallel {
    /// `shares`: `train.shares`, how many shares this process computes of each batch.
    pub fn new(world: Rc<World>, shares: usize, bucket_mib: f64) -> Self {
        let shares = shares.max(1);
        let rank = world.rank();
        Self {
            n_shares: world.size() * shares,
            shares: rank * shares..(rank + 1) * shares,
            world,
            bucket_floats: ((bucket_mib * 1024.0 * 1024.0 / 4.0) as usize).max(1),
            #[cfg(feature = "nccl")]
            nccl: std::cell::OnceCell::new(),
        }
    }

    pub fn world(&self) -> &World {
        &self.world
    }

    /// Whether this process writes the run directory and prints: rank 0, or a lone process.
    pub fn is_leader(&self) -> bool {
        self.world.is_leader()
    }

    /// Shares per batch when a step is split (a job, or `train.shares` > 1): what a checkpoint
    /// records.
    pub fn shares_per_batch(&self) -> Option<usize> {
        self.is_sharded().then_some(self.n_shares)
    }

    /// Whether a step goes through shares and the sum over ranks: in a job (even of one rank,
    /// so that `mpirun -np 1` runs a rank's whole code path) or with `train.shares` > 1.
    pub fn is_sharded(&self) -> bool {
        self.n_shares > 1 || self.world.is_launched()
    }

    /// One step's gradient: this process's shares of `batches`, summed over the ranks.
    /// `stop`: a stop signal this rank received, agreed on by all ranks in the same collective.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward(
        &self,
        model: &Model,
        params: &[Param],
        batches: &[Batch],
        cfg: &TrainConfig,
        device: &Device,
        step: u64,
        telemetry: bool,
        stop: Option<i32>,
    ) -> Result<ReducedStep> {
        if !self.is_sharded() {
            let out = forward_backward(model, params, batches, cfg, device, step, telemetry)?;
            return Ok(ReducedStep { out, stop });
        }
        let total_tokens: usize = batches.iter().map(Batch::target_tokens).sum();
        let n_shares = self.n_shares;
        // Attention telemetry is measured on one share, by the process that reports it: its
        // first share with rows (its first may have none when a batch has fewer rows than there
        // are shares).
        let measured = if self.is_leader() {
            self.shares
                .clone()
                .find(|&s| batches.iter().any(|b| !b.share_rows(s, n_shares).is_empty()))
        } else {
            None
        };
        let one_share = move |share: usize| -> Result<GradientSums> {
            let parts: Vec<(usize, Batch)> = batches
                .iter()
                .enumerate()
                .filter_map(|(i, b)| b.share(share, n_shares).map(|s| (i, s)))
                .collect();
            let parts: Vec<(usize, &Batch)> = parts.iter().map(|(i, b)| (*i, b)).collect();
            gradient_sums(
                model,
                params,
                &parts,
                total_tokens,
                cfg,
                device,
                step,
                telemetry && Some(share) == measured,
                Share::Of {
                    share,
                    shares: n_shares,
                },
            )
        };
        let tasks: Vec<Box<dyn FnOnce() -> Result<GradientSums> + Send + '_>> = self
            .shares
            .clone()
            .map(|share| Box::new(move || one_share(share)) as Box<dyn FnOnce() -> _ + Send>)
            .collect();
        // On a GPU the shares would only queue on the same stream from several threads: in turn.
        let results = if device.is_cuda() {
            tasks.into_iter().map(|task| task()).collect()
        } else {
            ember_kernels::par::join_all(tasks)
        };
        let results = results.into_iter().collect::<Result<Vec<_>>>()?;
        let mut sums = GradientSums::total(results, params.len(), device)?;
        let (stop, wait_secs, comm_secs) = self.reduce(&mut sums, params, device, step, stop)?;
        let mut out = sums.into_output(total_tokens);
        out.wait_secs = wait_secs;
        out.comm_secs = comm_secs;
        Ok(ReducedStep { out, stop })
    }

    /// Sums the gradients and losses over the ranks (nothing to do in one process), and agrees
    /// on a stop signal. Also returns the seconds spent waiting for the slowest rank (the first,
    /// small collective ends when the last rank arrives) and then summing the gradients.
    fn reduce(
        &self,
        sums: &mut GradientSums,
        params: &[Param],
        device: &Device,
        step: u64,
        stop: Option<i32>,
    ) -> Result<(Option<i32>, f64, f64)> {
        let world = &self.world;
        if !world.is_launched() {
            return Ok((stop, 0.0, 0.0));
        }
        let t0 = Instant::now();
        // Losses, and which parameters have a gradient on any rank (a rank whose shares were all
        // empty has none).
        let (objective, nll) = sums.losses.to_host()?;
        let mut scalars = vec![objective, nll];
        scalars.extend(sums.grads.iter().map(|g| g.is_some() as u8 as f64));
        world.all_reduce_sum_f64(&mut scalars, &format!("the losses of step {step}"));
        sums.losses = LossSums::Host {
            objective: scalars[0],
            nll: scalars[1],
        };
        let present: Vec<bool> = scalars[2..].iter().map(|&n| n > 0.0).collect();

        let mut signal = [stop.map_or(0, i64::from)];
        world.all_reduce_max_i64(&mut signal, &format!("the stop check of step {step}"));
        let t1 = Instant::now();

        self.sum_buckets(sums, params, device, step, &present)?;
        let stop = (signal[0] > 0).then_some(signal[0] as i32);
        Ok((stop, (t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64()))
    }

    /// Sums the gradients over the ranks, one collective per bucket of consecutive parameters
    /// (a parameter no rank has a gradient for stays without one).
    fn sum_buckets(
        &self,
        sums: &mut GradientSums,
        params: &[Param],
        device: &Device,
        step: u64,
        present: &[bool],
    ) -> Result<()> {
        let buckets = buckets(params, self.bucket_floats);
        for (b, range) in buckets.iter().enumerate() {
            let parts = range
                .clone()
                .map(|i| match &sums.grads[i] {
                    Some(g) => g.flatten_all(),
                    None => Tensor::zeros(params[i].var.elem_count(), DType::F32, device),
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            let what = format!(
                "the gradients of step {step} (bucket {} of {})",
                b + 1,
                buckets.len()
            );
            let summed = self.sum_bucket(&Tensor::cat(&parts, 0)?, device, &what)?;
            let mut offset = 0;
            for i in range.clone() {
                let n = params[i].var.elem_count();
                sums.grads[i] = if present[i] {
                    Some(summed.narrow(0, offset, n)?.reshape(params[i].var.dims())?)
                } else {
                    None
                };
                offset += n;
            }
        }
        Ok(())
    }

    /// One bucket (a 1-D f32 tensor) summed over the ranks: on the device with NCCL for a CUDA
    /// job built with `nccl` (the communicator is set up at the first step, which every rank
    /// reaches together), else through host memory with MPI.
    fn sum_bucket(&self, flat: &Tensor, device: &Device, what: &str) -> Result<Tensor> {
        #[cfg(feature = "nccl")]
        if device.is_cuda() {
            let nccl = match self.nccl.get() {
                Some(n) => n,
                None => {
                    let n = crate::nccl::NcclSum::new(&self.world, device)?;
                    self.nccl.get_or_init(|| n)
                }
            };
            let summed = nccl.sum(flat)?;
            self.world.watch(what, || device.synchronize())?;
            return Ok(summed);
        }
        let mut host = flat.to_vec1::<f32>()?;
        self.world.all_reduce_sum_f32(&mut host, what);
        Ok(Tensor::from_vec(host, flat.elem_count(), device)?)
    }

    /// Sums per-share partial results (`(nll, tokens)`) of an evaluation in share order, then
    /// over the ranks. `partial(share, shares)` evaluates one share.
    pub fn evaluate(
        &self,
        what: &str,
        mut partial: impl FnMut(usize, usize) -> Result<(f64, u64)>,
    ) -> Result<(f64, u64)> {
        let (nll, tokens) = sum_shares(self.shares.clone(), |share| partial(share, self.n_shares))?;
        let mut sums = [nll, tokens as f64];
        self.world.all_reduce_sum_f64(&mut sums, what);
        Ok((sums[0], sums[1] as u64))
    }

    /// `f(share, shares)` for every share of the job, in share order, on every rank: each rank
    /// computes its own shares and the ranks exchange the results (serialised as JSON).
    pub fn gather_shares<T: Serialize + DeserializeOwned>(
        &self,
        what: &str,
        mut f: impl FnMut(usize, usize) -> T,
    ) -> Result<Vec<T>> {
        let mine: Vec<T> = self.shares.clone().map(|share| f(share, self.n_shares)).collect();
        if self.world.size() == 1 {
            return Ok(mine);
        }
        let bytes = serde_json::to_vec(&mine)?;
        let mut all = Vec::with_capacity(self.n_shares);
        for (rank, theirs) in self.world.all_gather_bytes(&bytes, what).iter().enumerate() {
            let theirs: Vec<T> = serde_json::from_slice(theirs)
                .map_err(|e| anyhow::anyhow!("{what}: rank {rank} sent what this rank cannot read ({e})"))?;
            all.extend(theirs);
        }
        Ok(all)
    }

    /// SHA-256 of all weights, checked to be the same on every rank. An error names the ranks
    /// whose weights differ from rank 0's.
    pub fn agreed_weights_sha256(&self, params: &[Param], step: u64) -> Result<String> {
        let digest = weights_sha256(params)?;
        let mut head = [0u8; 8];
        head.copy_from_slice(&digest[..8]);
        let mine = u64::from_le_bytes(head);
        let all = self
            .world
            .all_gather_u64(mine, &format!("the weight check of step {step}"));
        let differ: Vec<usize> = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
        if !differ.is_empty() {
            bail!(
                "after step {step} the weights of rank(s) {differ:?} differ from rank 0's: the ranks no longer \
                 train the same model (a rank read another checkpoint or config?). Nothing of this step was \
                 saved; resume from the newest checkpoint with the same config on every rank."
            );
        }
        Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// SHA-256 over every parameter's f32 values in order.
pub fn weights_sha256(params: &[Param]) -> Result<[u8; 32]> {
    let mut h = Sha256::new();
    for p in params {
        let values = p.var.flatten_all()?.to_vec1::<f32>()?;
        h.update(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
    }
    Ok(h.finalize().into())
}

/// Consecutive parameter ranges of about `floats` values each: one all-reduce per range. A
/// tensor is never split; one larger than a bucket gets a bucket of its own.
pub fn buckets(params: &[Param], floats: usize) -> Vec<Range<usize>> {
    let mut out = vec![];
    let (mut start, mut filled) = (0, 0usize);
    for (i, p) in params.iter().enumerate() {
        let n = p.var.elem_count();
        if filled > 0 && filled + n > floats {
            out.push(start..i);
            (start, filled) = (i, 0);
        }
        filled += n;
    }
    if start < params.len() {
        out.push(start..params.len());
    }
    out
}

/// `(nll, tokens)` of `shares`, evaluated one after another and summed in share order: one
/// order for `ember eval` and for training's validation, so both give the same bits.
pub fn sum_shares(
    shares: std::ops::Range<usize>,
    mut partial: impl FnMut(usize) -> Result<(f64, u64)>,
) -> Result<(f64, u64)> {
    let (mut nll, mut tokens) = (0f64, 0u64);
    for share in shares {
        let (n, t) = partial(share)?;
        nll += n;
        tokens += t;
    }
    Ok((nll, tokens))
}
