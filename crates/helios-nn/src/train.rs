//! The training loop: AdamW (decay on matrices), warm-up + cosine learning rate, global-norm
//! clipping, gradient accumulation, validation loss, atomic checkpoints and exact resume.
//!
//! The design decision a reader must know: a run is a pure function of its inputs (initial
//! weights, data, seed, hyperparameters). Batches come from `BatchSampler` (a function of
//! seed and step), the learning rate from `LrSchedule` (a function of the step), and every
//! kernel is deterministic, so a checkpoint's f32 weights, AdamW moments, step and sampler
//! state are enough for a resumed run to continue bit for bit. A loss or gradient norm that
//! is NaN or infinite stops the run before anything is saved: the last checkpoint on disk is
//! the last good one. In f16 an overflowing gradient is expected now and then: that step's
//! update is skipped and the loss scale halves (`LossScaler`, saved with the checkpoint).

use std::path::{Path, PathBuf};
use std::time::Instant;

use helios::{no_grad, DType, Device, IndexTensor, Tensor};
use helios_dist::{Collective, Shards, Single};
use serde::{Deserialize, Serialize};

use crate::checkpoint::TRAINER_FORMAT;
use crate::checkpoint::{save_checkpoint, Checkpoint, OptimizerState, TrainerState};
use crate::model::{self, GptParams};
use crate::optim::{upload_with_master_of, AdamW};
use crate::parallel::{self, agree_on_run, broadcast_store, broadcast_tensors, shard_of};
use crate::params::ParamStore;
use crate::phase::{total_ms, Phase};
use crate::sampler::{Batch, BatchSampler, EvalBatches};
use crate::schedule::{AdamWHyper, LrSchedule};
use crate::{Error, Result, Tokens};

/// How to train.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Rows per micro-batch (B), on each rank of a data-parallel run.
    pub batch: usize,
    /// Tokens per row (T), at most the model's block size.
    pub seq: usize,
    /// Micro-batches whose gradients are summed into one optimizer step.
    pub accum: usize,
    /// Optimizer steps of the whole run (the schedule ends there).
    pub steps: u64,
    pub schedule: LrSchedule,
    pub adamw: AdamWHyper,
    /// F32; BF16 (bf16 weights and activations, f32 master weights and moments); or F16
    /// (the same in f16, with dynamic loss scaling: see `LossScaler`).
    pub precision: DType,
    /// Seeds the batch order (and, in the CLI, the initial weights).
    pub seed: u64,
    /// Validation loss every this many steps and at the end (0: never).
    pub eval_every: u64,
    /// Validation batches per evaluation (at most).
    pub eval_batches: usize,
    /// Checkpoint every this many steps (0: only at the end).
    pub save_every: u64,
    /// Where checkpoints go (`None`: nowhere).
    pub checkpoint_dir: Option<PathBuf>,
    /// ZeRO-1: each rank of a data-parallel run keeps the AdamW moments (and f32 masters) of
    /// its shard of the parameters only, and updates only those (see `parallel`). The same
    /// run either way, within rounding; nothing changes in a run of one.
    pub zero: bool,
}

impl TrainConfig {
    /// Steps to time or probe: micro-batches of `batch`×`seq` in `precision`, a constant
    /// learning rate of 1e-4, default AdamW, no accumulation, evaluation or checkpoints.
    pub fn steps_only(batch: usize, seq: usize, steps: u64, precision: DType) -> TrainConfig {
        TrainConfig {
            batch,
            seq,
            accum: 1,
            steps,
            schedule: LrSchedule::constant(1e-4),
            adamw: AdamWHyper::default(),
            precision,
            seed: 1,
            eval_every: 0,
            eval_batches: 0,
            save_every: 0,
            checkpoint_dir: None,
            zero: false,
        }
    }

    /// What every rank of a data-parallel run must agree on, starting at `step`, as text
    /// (`parallel::agree_on_run`).
    fn agreement(&self, step: u64) -> String {
        format!(
            "{} {} {} {} {:?} {:?} {} {} {} {} {step}",
            self.batch,
            self.seq,
            self.accum,
            self.steps,
            self.schedule,
            self.adamw,
            self.precision.name(),
            self.seed,
            self.eval_every,
            self.zero,
        )
    }
}

/// One optimizer step, as the loop reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepLog {
    /// 1-based: the number of optimizer steps done after this one.
    pub step: u64,
    /// Mean training loss over the step's micro-batches.
    pub loss: f32,
    pub lr: f64,
    /// Global gradient norm before clipping (NaN or infinite on a skipped f16 step: JSON
    /// writes those as null, read back as NaN).
    #[serde(deserialize_with = "nan_from_null")]
    pub grad_norm: f32,
    /// GPU time of the forward passes (timestamps around the work, like CUDA events; host
    /// time where the queue has no timestamps), as for the next three.
    pub fwd_ms: f64,
    pub bwd_ms: f64,
    /// The optimizer, with the clipping norm.
    pub opt_ms: f64,
    /// Data parallel: averaging the gradients over the ranks, or under ZeRO-1 reducing them
    /// and sharing the updated parameters (about 0 for one process).
    #[serde(default)]
    pub comm_ms: f64,
    /// Wall time of the whole step, as the host saw it.
    #[serde(default)]
    pub step_ms: f64,
    /// Host time spent recording the step, up to its one wait (the rest of `step_ms` is
    /// waiting for the GPU): a step whose recording takes as long as it is host-bound.
    #[serde(default, skip_serializing)]
    pub record_ms: f64,
    /// Tokens this step trained on, over all ranks (B·T·accum·ranks).
    pub tokens: usize,
    /// f16: the loss scale the step's backward ran with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f32>,
    /// f16: a gradient overflowed at that scale, so the update changed nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
}

fn nan_from_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f32, D::Error> {
    Ok(Option::<f32>::deserialize(d)?.unwrap_or(f32::NAN))
}

/// Dynamic loss scaling for f16 training, as PyTorch's `GradScaler` does it: the loss is
/// multiplied by `scale` before backward so small gradients survive f16; the update divides
/// it out. A step whose gradients overflowed changes nothing and halves the scale; after
/// `GROWTH_INTERVAL` good steps in a row the scale doubles.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    pub scale: f32,
    /// Good steps since the last change of scale.
    pub good: u32,
    /// `GROWTH_INTERVAL` (tests shorten it).
    #[serde(skip, default = "growth_interval")]
    pub(crate) interval: u32,
}

/// The first scale (PyTorch's default).
pub const INITIAL_LOSS_SCALE: f32 = 65536.0;
/// Good steps before the scale doubles (PyTorch's default).
pub const GROWTH_INTERVAL: u32 = 2000;

fn growth_interval() -> u32 {
    GROWTH_INTERVAL
}

impl Default for LossScaler {
    fn default() -> Self {
        LossScaler {
            scale: INITIAL_LOSS_SCALE,
            good: 0,
            interval: GROWTH_INTERVAL,
        }
    }
}

impl LossScaler {
    /// Updates the scale after a step whose gradient norm was `norm`; true when the step
    /// was skipped (the norm is not finite).
    fn update(&mut self, norm: f32) -> bool {
        if !norm.is_finite() {
            self.scale = (self.scale * 0.5).max(f32::MIN_POSITIVE);
            self.good = 0;
            return true;
        }
        self.good += 1;
        if self.good >= self.interval {
            self.scale = (self.scale * 2.0).min(f32::MAX / 2.0);
            self.good = 0;
        }
        false
    }
}

/// A validation loss after `step` optimizer steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalLog {
    pub step: u64,
    pub loss: f32,
}

/// Everything a run has logged; a checkpoint carries it so a resumed run's log is whole.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    pub train: Vec<StepLog>,
    pub val: Vec<EvalLog>,
}

/// The trainer's part of a checkpoint (`TrainerState::extra`): the run's log and f16 loss
/// scale, which a resume takes back, and for the record the precision and accumulation it
/// ran with. Typed: a malformed or unknown entry is an error on resume, never a silent
/// default; an empty one (an export, a hand-made state) is a run with no history.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrainerExtras {
    /// The dtype's name (`DType::name`).
    #[serde(default)]
    precision: Option<String>,
    #[serde(default)]
    accum: Option<usize>,
    #[serde(default)]
    history: History,
    #[serde(default)]
    loss_scaler: Option<LossScaler>,
}

impl TrainerExtras {
    fn read(extra: &serde_json::Value) -> Result<TrainerExtras> {
        let bad = |detail: String| {
            Error::Data(format!(
                "the checkpoint's trainer state has a bad `extra` ({detail}): it was not \
                 written by this version of Helios, or it is damaged; resume from another \
                 checkpoint, or start a new run from its weights with --init"
            ))
        };
        if extra.is_null() {
            return Ok(TrainerExtras::default());
        }
        let extras = TrainerExtras::deserialize(extra).map_err(|e| bad(e.to_string()))?;
        if let Some(p) = &extras.precision {
            if !DType::ALL.iter().any(|d| d.name() == p) {
                return Err(bad(format!("precision `{p}` is not a dtype")));
            }
        }
        Ok(extras)
    }

    fn value(&self) -> Result<serde_json::Value> {
        serde_json::to_value(self)
            .map_err(|e| Error::Data(format!("the trainer state cannot be written: {e}")))
    }
}

/// What `Trainer::run` reports as it goes.
#[derive(Debug)]
pub enum Event<'a> {
    Step(&'a StepLog),
    Eval(&'a EvalLog),
    Saved { step: u64, dir: &'a Path },
}

/// Where a run starts: the optimizer's state, and the log and last checkpoint of the run it
/// continues (none for a new run).
struct Start<'a> {
    opt: &'a OptimizerState,
    history: History,
    last_saved: Option<u64>,
}

/// A training run in progress: the model and optimizer on the device, the data, the log.
pub struct Trainer {
    device: Device,
    params: GptParams,
    opt: AdamW,
    sampler: BatchSampler,
    val: Option<Tokens>,
    cfg: TrainConfig,
    history: History,
    /// The step of the last checkpoint written (or resumed from).
    last_saved: Option<u64>,
    /// f16 only.
    scaler: Option<LossScaler>,
    /// The other ranks of a data-parallel run (`Single` for one process).
    comm: Box<dyn Collective>,
    /// ZeRO-1: which rank owns which parameters' optimizer state (`cfg.zero`).
    shards: Option<Shards>,
}

impl Trainer {
    /// A new run from `init` (step 0).
    pub fn new(
        device: &Device,
        init: &ParamStore,
        train: Tokens,
        val: Option<Tokens>,
        cfg: TrainConfig,
    ) -> Result<Trainer> {
        Trainer::new_with(device, init, train, val, cfg, Box::new(Single))
    }

    /// A new run as one rank of a data-parallel run over `comm`: the model one process
    /// would train with batches of `cfg.batch` × ranks rows. Every rank must call it with
    /// the same arguments (checked); the weights come from rank 0.
    pub fn new_with(
        device: &Device,
        init: &ParamStore,
        train: Tokens,
        val: Option<Tokens>,
        cfg: TrainConfig,
        mut comm: Box<dyn Collective>,
    ) -> Result<Trainer> {
        let shard = shard_of(comm.as_ref());
        check_run(init, &train, val.as_ref(), &cfg, shard.ranks)?;
        agree_on_run(comm.as_mut(), init, &train, cfg.agreement(0))?;
        let init = &*broadcast_store(comm.as_mut(), init)?;
        let sampler =
            BatchSampler::new(train, cfg.batch * shard.ranks, cfg.seq, cfg.seed)?.shard(shard)?;
        let state = OptimizerState::zeros(init.config());
        let start = Start {
            opt: &state,
            history: History::default(),
            last_saved: None,
        };
        Trainer::build(device, init, start, sampler, val, cfg, comm)
    }

    /// Continues the run saved in `ckpt` (from `load_checkpoint`) on the same data, batch
    /// and sequence length; the checkpoint's schedule, AdamW constants and seed apply.
    pub fn resume(
        device: &Device,
        ckpt: &Checkpoint,
        train: Tokens,
        val: Option<Tokens>,
        cfg: TrainConfig,
    ) -> Result<Trainer> {
        Trainer::resume_with(device, ckpt, train, val, cfg, Box::new(Single))
    }

    /// `resume` as one rank of a data-parallel run (see `new_with`). The checkpoint's batch
    /// is the whole run's, so any number of ranks that divides it can continue it; weights
    /// and moments come from rank 0's copy.
    pub fn resume_with(
        device: &Device,
        ckpt: &Checkpoint,
        train: Tokens,
        val: Option<Tokens>,
        mut cfg: TrainConfig,
        mut comm: Box<dyn Collective>,
    ) -> Result<Trainer> {
        let (Some(opt), Some(state)) = (&ckpt.optimizer, &ckpt.trainer) else {
            return Err(Error::Data(
                "this directory holds weights but no optimizer or trainer state, so it cannot \
                 be resumed; start a new run from it with --init instead"
                    .into(),
            ));
        };
        cfg.schedule = state.schedule;
        cfg.adamw = state.adamw;
        cfg.seed = state.seed;
        let shard = shard_of(comm.as_ref());
        check_run(&ckpt.params, &train, val.as_ref(), &cfg, shard.ranks)?;
        agree_on_run(
            comm.as_mut(),
            &ckpt.params,
            &train,
            cfg.agreement(state.step),
        )?;
        let params = broadcast_store(comm.as_mut(), &ckpt.params)?;
        let broadcast;
        let opt = match comm.rank().world {
            1 => opt,
            _ => {
                broadcast = OptimizerState {
                    step: opt.step,
                    m: broadcast_tensors(comm.as_mut(), &opt.m)?,
                    v: broadcast_tensors(comm.as_mut(), &opt.v)?,
                };
                &broadcast
            }
        };
        let sampler =
            BatchSampler::resume_checked(train, state.sampler, cfg.batch * shard.ranks, cfg.seq)?
                .shard(shard)?;
        let extras = TrainerExtras::read(&state.extra)?;
        let (history, scaler) = (extras.history, extras.loss_scaler);
        let start = Start {
            opt,
            history,
            last_saved: Some(state.step),
        };
        let mut t = Trainer::build(device, &params, start, sampler, val, cfg, comm)?;
        if let (Some(mine), Some(saved)) = (t.scaler.as_mut(), scaler) {
            (mine.scale, mine.good) = (saved.scale, saved.good);
        }
        Ok(t)
    }

    fn build(
        device: &Device,
        init: &ParamStore,
        start: Start<'_>,
        sampler: BatchSampler,
        val: Option<Tokens>,
        cfg: TrainConfig,
        comm: Box<dyn Collective>,
    ) -> Result<Trainer> {
        let Start {
            opt: state,
            history,
            last_saved,
        } = start;
        let rank = comm.rank();
        let shards = match cfg.zero {
            true => Some(parallel::zero_shards(init.config(), rank.world)?),
            false => None,
        };
        let owned = match &shards {
            Some(s) => s.range(rank.rank),
            None => 0..init.config().param_specs().len(),
        };
        // Attention's one-time probe runs now, not behind the first step's queued work.
        helios::prepare_attention(device, cfg.precision);
        let (params, master) = upload_with_master_of(init, device, cfg.precision, owned.clone())?;
        let opt = AdamW::for_shard(&params, state, cfg.adamw, master, owned)?;
        let scaler = (cfg.precision == DType::F16).then(LossScaler::default);
        Ok(Trainer {
            device: device.clone(),
            params,
            opt,
            sampler,
            val,
            cfg,
            history,
            last_saved,
            scaler,
            comm,
            shards,
        })
    }

    /// f16: the loss scaler's state.
    pub fn loss_scaler(&self) -> Option<&LossScaler> {
        self.scaler.as_ref()
    }

    /// Tests: the scaler's scale (when given) and growth interval (not saved: set it again
    /// after a resume).
    #[doc(hidden)]
    pub fn set_loss_scaler(&mut self, scale: Option<f32>, interval: u32) {
        if let Some(s) = self.scaler.as_mut() {
            s.scale = scale.unwrap_or(s.scale);
            s.interval = interval.max(1);
        }
    }

    /// Optimizer steps done.
    pub fn step_count(&self) -> u64 {
        self.opt.step
    }

    pub fn params(&self) -> &GptParams {
        &self.params
    }

    pub fn history(&self) -> &History {
        &self.history
    }

    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// The batch the next step trains on first (the sampler does not move).
    pub fn peek_batch(&self) -> Batch {
        self.sampler.batch_at(self.sampler.state().step)
    }

    /// The f32 weights as a host store. Under ZeRO-1 with narrow weights (bf16, f16) the
    /// f32 masters are spread over the ranks, and this fails: use `gather_weights`.
    pub fn weights(&self) -> Result<ParamStore> {
        self.opt.weights(&self.params)
    }

    /// The f32 weights on rank 0 (`None` on the other ranks). Under ZeRO-1 a collective:
    /// every rank calls it, and each shard's owner sends its part.
    pub fn gather_weights(&mut self) -> Result<Option<ParamStore>> {
        match &self.shards {
            Some(shards) => {
                let got =
                    parallel::gather(&self.opt, &self.params, &mut *self.comm, shards, false)?;
                Ok(got.map(|(weights, _)| weights))
            }
            None if self.comm.rank().is_first() => Ok(Some(self.weights()?)),
            None => Ok(None),
        }
    }

    /// Device index tensors for a batch: ids (B, T), positions (T), targets (B, T).
    fn upload(&self, b: &Batch) -> Result<(IndexTensor, IndexTensor, IndexTensor)> {
        let cfg = self.params.config();
        let (idx, pos) = model::inputs(cfg, &self.device, &b.inputs, b.batch, b.seq_len)?;
        let targets = IndexTensor::from_slice(&self.device, &b.targets, &[b.batch, b.seq_len])?;
        Ok((idx, pos, targets))
    }

    /// One optimizer step over `accum` micro-batches. Fails, leaving the checkpoints on
    /// disk alone, if the loss is not finite, or the gradient norm outside f16 (where an
    /// overflow skips the update and lowers the loss scale instead).
    ///
    /// The host records the whole step and then waits once, for the loss and the norm: it
    /// never stops the GPU in between, and in data parallel runs the ranks meet on the GPU
    /// (in the all-reduce) rather than on the host.
    pub fn train_step(&mut self) -> Result<StepLog> {
        let started = Instant::now();
        let step = self.opt.step; // 0-based index of this step
        let loss_scale = self.scaler.map(|s| s.scale);
        let accum = self.cfg.accum.max(1);
        let dev = &self.device;
        let (mut fwd, mut bwd, mut losses) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..accum {
            let batch = self.sampler.next_batch();
            let (idx, pos, targets) = self.upload(&batch)?;
            let t = Phase::start(dev);
            let loss = model::forward_loss(&self.params, &idx, &pos, &targets)?; // (1)
            loss.realize()?;
            fwd.push(t.stop(dev)?);
            let t = Phase::start(dev);
            let factor = loss_scale.unwrap_or(1.0) / accum as f32;
            let scaled = match factor != 1.0 {
                true => loss.mul_scalar(factor)?,
                false => loss.clone(),
            };
            scaled.backward()?;
            bwd.push(t.stop(dev)?);
            losses.push(loss);
        }
        // Every rank sees the run's loss, so a non-finite one stops all of them: it travels
        // with the gradients (summed over the ranks), and the host waits once, below.
        let mut local = losses[0].clone();
        for loss in &losses[1..] {
            local = local.add(loss)?;
        }
        // The collectives sum the gradients over the ranks; the optimizer divides by their
        // number (and by the loss scale) as it reads them.
        let ranks = self.comm.rank().world;
        let unscale = match (loss_scale, ranks) {
            (None, 1) => None,
            (s, n) => Some(1.0 / (s.unwrap_or(1.0) * n as f32)),
        };
        // Also in a world of one: a backend other than `Single` runs its whole path there.
        let lr = self.cfg.schedule.lr_at(step);
        let (norm, total, comm, opt) = match &self.shards {
            Some(shards) => {
                let (opt, params, comm) = (&mut self.opt, &self.params, &mut *self.comm);
                parallel::sharded_step(opt, params, comm, shards, lr, unscale, &local)?
            }
            None => {
                let t = Phase::start(dev);
                let total = self.comm.sum_gradients(self.params.tensors(), &local)?;
                let comm = t.stop(dev)?;
                let t = Phase::start(dev);
                let norm = match unscale {
                    Some(u) => self.opt.step_loss_scaled(&self.params, lr, u)?,
                    None => self.opt.step(&self.params, lr)?,
                };
                (norm, total, vec![comm], vec![t.stop(dev)?])
            }
        };
        let record_ms = ms(started);
        let grad_norm = norm.to_vec()?[0]; // the step's one wait
        let mean = f64::from(total.to_vec()?[0]) / (accum * ranks) as f64;
        if !mean.is_finite() {
            return Err(self.non_finite(step + 1, "loss", mean as f32));
        }
        let skipped = match self.scaler.as_mut() {
            Some(scaler) => scaler.update(grad_norm),
            None if !grad_norm.is_finite() => {
                return Err(self.non_finite(step + 1, "gradient norm", grad_norm));
            }
            None => false,
        };
        let log = StepLog {
            step: step + 1,
            loss: mean as f32,
            lr,
            grad_norm,
            fwd_ms: total_ms(dev, fwd)?,
            bwd_ms: total_ms(dev, bwd)?,
            opt_ms: total_ms(dev, opt)?,
            comm_ms: total_ms(dev, comm)?,
            step_ms: ms(started),
            record_ms,
            tokens: self.cfg.batch * self.cfg.seq * accum * self.comm.rank().world,
            loss_scale,
            skipped,
        };
        self.history.train.push(log.clone());
        Ok(log)
    }

    fn non_finite(&self, step: u64, what: &'static str, value: f32) -> Error {
        Error::NonFinite {
            step,
            what,
            value,
            checkpoint: self
                .last_saved
                .zip(self.cfg.checkpoint_dir.clone())
                .map(|(s, d)| (d, s)),
        }
    }

    /// The mean loss over (at most `eval_batches`) validation batches, without gradients.
    pub fn evaluate(&mut self) -> Result<Option<f32>> {
        let Some(val) = &self.val else {
            return Ok(None);
        };
        let shard = shard_of(self.comm.as_ref());
        let batches = EvalBatches::new(val.clone(), self.cfg.batch * shard.ranks, self.cfg.seq)?
            .take_at_most(self.cfg.eval_batches.max(1))
            .shard(shard)?;
        let n = batches.num_batches();
        let total = no_grad(|| -> Result<Tensor> {
            let mut total: Option<Tensor> = None;
            for b in batches {
                let (idx, pos, targets) = self.upload(&b)?;
                let loss = model::forward_loss(&self.params, &idx, &pos, &targets)?; // (1)
                total = Some(match total {
                    None => loss,
                    Some(t) => t.add(&loss)?,
                });
            }
            Ok(total.expect("at least one validation batch"))
        })?;
        let mut mean = [f64::from(total.to_vec()?[0]) / n as f64];
        self.comm.mean(&mut mean)?;
        let loss = mean[0] as f32;
        let log = EvalLog {
            step: self.opt.step,
            loss,
        };
        self.history.val.push(log);
        Ok(Some(loss))
    }

    /// Writes a resumable checkpoint to `dir` (atomically: a crash keeps the previous one).
    /// In a data-parallel run only rank 0 writes: every rank holds the same state, or under
    /// ZeRO-1 sends its shard's to rank 0 first (then every rank must call `save`).
    pub fn save(&mut self, dir: &Path) -> Result<()> {
        let whole = match &self.shards {
            Some(shards) => {
                parallel::gather(&self.opt, &self.params, &mut *self.comm, shards, true)?
                    .and_then(|(weights, state)| Some((weights, state?)))
            }
            None if self.comm.rank().is_first() => {
                Some((self.weights()?, self.opt.state(&self.params)?))
            }
            None => None,
        };
        let Some((params, opt)) = whole else {
            self.last_saved = Some(self.opt.step);
            return Ok(());
        };
        let state = TrainerState {
            format: TRAINER_FORMAT,
            step: self.opt.step,
            seed: self.cfg.seed,
            sampler: self.sampler.state(),
            schedule: self.cfg.schedule,
            adamw: self.cfg.adamw,
            model: params.config().clone(),
            extra: TrainerExtras {
                precision: Some(self.cfg.precision.name().into()),
                accum: Some(self.cfg.accum),
                history: self.history.clone(),
                loss_scaler: self.scaler,
            }
            .value()?,
        };
        save_checkpoint(dir, &params, &opt, &state)?;
        self.last_saved = Some(self.opt.step);
        Ok(())
    }

    /// Ends a data-parallel run in step with the other ranks (see `Collective::finish`);
    /// nothing for a run of one.
    pub fn finish(&mut self) -> Result<()> {
        Ok(self.comm.finish()?)
    }

    /// Trains until `cfg.steps` optimizer steps are done (at most `until` when given),
    /// evaluating and saving as configured, and saving at the end.
    pub fn run(&mut self, until: Option<u64>, mut on: impl FnMut(Event)) -> Result<()> {
        let end = until.unwrap_or(self.cfg.steps).min(self.cfg.steps);
        // The untrained model's validation loss: where the curve starts.
        if self.opt.step == 0 && self.cfg.eval_every > 0 && self.history.val.is_empty() {
            if let Some(loss) = self.evaluate()? {
                on(Event::Eval(&EvalLog { step: 0, loss }));
            }
        }
        while self.opt.step < end {
            let log = self.train_step()?;
            on(Event::Step(&log));
            let s = self.opt.step;
            let every = |n: u64| n > 0 && s % n == 0;
            if every(self.cfg.eval_every) || (s == end && self.cfg.eval_every > 0) {
                if let Some(loss) = self.evaluate()? {
                    on(Event::Eval(&EvalLog { step: s, loss }));
                }
            }
            if let Some(dir) = self.cfg.checkpoint_dir.clone() {
                if every(self.cfg.save_every) || s == end {
                    self.save(&dir)?;
                    on(Event::Saved { step: s, dir: &dir });
                }
            }
        }
        Ok(())
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Checks a run's inputs against each other before anything is uploaded.
fn check_run(
    init: &ParamStore,
    train: &Tokens,
    val: Option<&Tokens>,
    cfg: &TrainConfig,
    ranks: usize,
) -> Result<()> {
    let model = init.config();
    if cfg.seq == 0 || cfg.seq > model.block_size {
        return Err(Error::Config(format!(
            "sequence length {} must be between 1 and the model's block size {}",
            cfg.seq, model.block_size
        )));
    }

    cfg.schedule.validate()?;
    train.check_vocab(model.vocab_size)?;
    if let Some(v) = val {
        v.check_vocab(model.vocab_size)?;
        // Fail now rather than at the first evaluation.
        if cfg.eval_every > 0 {
            EvalBatches::new(v.clone(), cfg.batch * ranks, cfg.seq)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trainer_extras_round_trip_and_refuse_what_they_do_not_know() {
        let extras = TrainerExtras {
            precision: Some("bf16".into()),
            accum: Some(2),
            history: History {
                train: Vec::new(),
                val: vec![EvalLog {
                    step: 10,
                    loss: 3.25,
                }],
            },
            loss_scaler: Some(LossScaler::default()),
        };
        let value = extras.value().unwrap();
        assert_eq!(TrainerExtras::read(&value).unwrap(), extras);
        // An export or a hand-made state has none: a run with no history.
        let none = TrainerExtras::read(&serde_json::Value::Null).unwrap();
        assert_eq!(none, TrainerExtras::default());
        // Malformed, unknown or out-of-range entries are errors, not defaults.
        for bad in [
            serde_json::json!({"history": "lost"}),
            serde_json::json!({"loss_scaler": {"scale": "big"}}),
            serde_json::json!({"precision": "f8"}),
            serde_json::json!({"history": {"train": [], "val": []}, "data": "x.txt"}),
            serde_json::json!([1, 2]),
        ] {
            let err = TrainerExtras::read(&bad).unwrap_err().to_string();
            assert!(
                err.contains("bad `extra`") && err.contains("--init"),
                "{err}"
            );
        }
    }
}
