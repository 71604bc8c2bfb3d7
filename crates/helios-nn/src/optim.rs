//! AdamW for GPT-2 on the device: f32 moments per parameter, decay on the matrices
//! only, global-norm gradient clipping computed on the device, and f32 master weights when
//! the model runs in bf16 (the update writes the bf16 copy in the same pass).
//!
//! The one decision a reader must know: the clip coefficient min(1, clip / (‖g‖ + 1e-6))
//! stays a device tensor that scales every gradient, so clipping never waits for the host;
//! the norm is handed back for logging, and reading it is the caller's choice.
//!
//! Under ZeRO-1 (`parallel`) an `AdamW` owns a shard of the parameters: it keeps moments
//! (and masters) for those alone and updates them alone, with the norm of the whole gradient
//! that the caller sums over the ranks.

use std::ops::Range;

use helios::{adamw_step_scaled, AdamWConfig, AdamWParam, DType, Tensor};

use crate::checkpoint::OptimizerState;
use crate::model::{device_rows, to_host, upload_rows, GptParams};
use crate::params::ParamStore;
use crate::schedule::AdamWHyper;
use crate::{Error, Result};

/// AdamW's state on the device, one entry per owned parameter (`GptConfig::param_specs`
/// order).
pub struct AdamW {
    pub hyper: AdamWHyper,
    /// Steps taken (the next is `step + 1`).
    pub step: u64,
    /// The parameters this optimizer updates (`param_specs` indices): all of them, or under
    /// ZeRO-1 this rank's shard. The vectors below hold these parameters' entries.
    owned: Range<usize>,
    /// f32 first and second moments, the device parameters' shapes (wte's padded rows too,
    /// which stay zero: their gradient is zero).
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// f32 master weights when the model's tensors are narrower (bf16); `None` in fp32.
    master: Option<Vec<Tensor>>,
    /// Whether each parameter decays.
    decay: Vec<bool>,
}

impl AdamW {
    /// The optimizer of `params` continuing from `state` (zeros for a new run). `master`
    /// holds the f32 weights when `params` is bf16 (see `upload_with_master`).
    pub fn new(
        params: &GptParams,
        state: &OptimizerState,
        hyper: AdamWHyper,
        master: Option<Vec<Tensor>>,
    ) -> Result<AdamW> {
        AdamW::for_shard(params, state, hyper, master, 0..params.tensors().len())
    }

    /// `new` for the parameters `owned` alone (ZeRO-1): only their moments come from
    /// `state` to the device, and `master` holds only their f32 weights (see
    /// `upload_with_master_of`).
    pub fn for_shard(
        params: &GptParams,
        state: &OptimizerState,
        hyper: AdamWHyper,
        master: Option<Vec<Tensor>>,
        owned: Range<usize>,
    ) -> Result<AdamW> {
        let config = params.config();
        state.validate(config)?;
        let n = params.tensors().len();
        if owned.start > owned.end || owned.end > n {
            return Err(Error::Params(format!(
                "the optimizer's shard {owned:?} is not a range of the {n} parameters"
            )));
        }
        if master.as_ref().is_some_and(|m| m.len() != owned.len()) {
            return Err(Error::Params(format!(
                "{} master weights for a shard of {} parameters",
                master.map_or(0, |m| m.len()),
                owned.len()
            )));
        }
        let device = params.tensors()[0].device().clone();
        let specs = &config.param_specs()[owned.clone()];
        let tensors = &params.tensors()[owned.clone()];
        // The host moments have Hugging Face's shapes; on the device they take the shape of
        // their parameter (zero rows for wte's padding).
        let upload = |map: &std::collections::BTreeMap<String, crate::HostTensor>| {
            specs
                .iter()
                .zip(tensors)
                .map(|(s, p)| upload_rows(&map[&s.name], p.shape()[0], &device, DType::F32))
                .collect::<Result<Vec<_>>>()
        };
        Ok(AdamW {
            hyper,
            step: state.step,
            m: upload(&state.m)?,
            v: upload(&state.v)?,
            master,
            decay: specs.iter().map(|s| s.weight_decay).collect(),
            owned,
        })
    }

    /// The parameters this optimizer updates (`param_specs` indices).
    pub fn owned(&self) -> Range<usize> {
        self.owned.clone()
    }

    fn owns_all(&self, params: &GptParams) -> bool {
        self.owned == (0..params.tensors().len())
    }

    /// Parameter `i`'s moments (m, v) and f32 master (bf16 runs), when this optimizer owns it.
    pub(crate) fn state_of(&self, i: usize) -> Option<(&Tensor, &Tensor, Option<&Tensor>)> {
        let k = i
            .checked_sub(self.owned.start)
            .filter(|_| self.owned.contains(&i))?;
        Some((&self.m[k], &self.v[k], self.master.as_ref().map(|m| &m[k])))
    }

    /// Errors unless this optimizer holds the whole state (`what` needs it).
    fn whole(&self, params: &GptParams, what: &str) -> Result<()> {
        match self.owns_all(params) {
            true => Ok(()),
            false => Err(Error::Params(format!(
                "{what} needs every parameter's optimizer state, but this rank holds only its \
                 shard (parameters {:?}, ZeRO-1): gather the state over the ranks first \
                 (Trainer::save and Trainer::gather_weights do)",
                self.owned
            ))),
        }
    }

    /// The global L2 norm of every gradient of `params`, a (1,) device tensor; `None` when
    /// no gradient has been accumulated.
    pub fn grad_norm(params: &GptParams) -> Result<Option<Tensor>> {
        let grads: Vec<Tensor> = params.tensors().iter().filter_map(|t| t.grad()).collect();
        if grads.is_empty() {
            return Ok(None);
        }
        // One dispatch over every gradient (helios::sum_squares), not one reduction each.
        let refs: Vec<&Tensor> = grads.iter().collect();
        Ok(Some(helios::sum_squares(&refs)?.sqrt()?))
    }

    /// One step at learning rate `lr` on the gradients accumulated in `params` (clipped to
    /// the global norm `hyper.grad_clip` first), then forgets them. Returns the gradient
    /// norm before clipping, a (1,) device tensor. Every parameter must have a gradient.
    pub fn step(&mut self, params: &GptParams, lr: f64) -> Result<Tensor> {
        self.step_inner(params, lr, None, None)
    }

    /// `step` for gradients of a loss multiplied by a loss scale S (f16 training), or summed
    /// over N ranks (data parallel): the update multiplies them by `unscale` = 1/(S·N), the
    /// norm returned (and clipped to) is the unscaled one, and when any gradient overflowed
    /// (a NaN or infinite norm) nothing is written: parameters, moments and the narrow copy
    /// keep their values, decided on the device. The step still counts (`step` and the bias
    /// corrections advance), so a skipped step is an ordinary step of the schedule that
    /// changed nothing.
    pub fn step_loss_scaled(
        &mut self,
        params: &GptParams,
        lr: f64,
        unscale: f32,
    ) -> Result<Tensor> {
        self.step_inner(params, lr, Some(unscale), None)
    }

    /// The sum of the squares of the owned parameters' gradients, a (1,) f32 device tensor
    /// (`None` when this optimizer owns no parameter): this rank's share of the squared norm
    /// under ZeRO-1. Every owned parameter must have a gradient.
    pub fn owned_sum_squares(&self, params: &GptParams) -> Result<Option<Tensor>> {
        let grads = self.owned_grads(params)?;
        if grads.is_empty() {
            return Ok(None);
        }
        let refs: Vec<&Tensor> = grads.iter().collect();
        Ok(Some(helios::sum_squares(&refs)?))
    }

    /// `step` (`unscale` None) or `step_loss_scaled` (`unscale` 1/(S·N)) of the owned
    /// parameters alone, clipped with `norm`: the whole gradient's norm, summed by the caller
    /// over every rank's `owned_sum_squares`, as a (1,) device tensor (of the scaled gradient
    /// in f16, and of the gradient summed over the ranks).
    /// Given the same gradients and norm, each owned parameter's update is `step`'s.
    pub fn step_owned(
        &mut self,
        params: &GptParams,
        lr: f64,
        unscale: Option<f32>,
        norm: Tensor,
    ) -> Result<Tensor> {
        self.step_inner(params, lr, unscale, Some(norm))
    }

    fn owned_grads(&self, params: &GptParams) -> Result<Vec<Tensor>> {
        params.tensors()[self.owned.clone()]
            .iter()
            .map(|t| {
                t.grad().ok_or_else(|| {
                    Error::Params("a parameter got no gradient; call backward() first".into())
                })
            })
            .collect()
    }

    /// One step of the owned parameters; `norm` is the whole gradient's norm, or `None` to
    /// compute it here (only when this optimizer owns every parameter).
    fn step_inner(
        &mut self,
        params: &GptParams,
        lr: f64,
        unscale: Option<f32>,
        norm: Option<Tensor>,
    ) -> Result<Tensor> {
        let grads = self.owned_grads(params)?;
        let norm = match norm {
            Some(n) => n,
            None => {
                self.whole(params, "a step without the whole gradient's norm")?;
                AdamW::grad_norm(params)?.expect("every parameter has a gradient")
            }
        };
        let norm = match unscale {
            Some(u) => norm.mul_scalar(u)?,
            None => norm,
        };
        // coef = min(1, clip / (norm + 1e-6)), (1): the update multiplies each gradient by
        // it as it reads it (no scaled copies, no read-back).
        let coef = match self.hyper.grad_clip {
            None => None,
            Some(clip) => Some(
                norm.add_scalar(1e-6)?
                    .scalar_first_op(helios::BinaryOp::Div, clip as f32)?
                    .minimum_scalar(1.0)?,
            ),
        };
        let coef = match unscale {
            None => coef,
            Some(u) => {
                // coef/S divided by (norm < ∞): 1, or 0 when a gradient overflowed, which
                // makes the multiplier NaN or infinite and the update write nothing. (Not
                // norm − norm: a compiler may fold that to 0.)
                let finite = norm.compare_scalar(helios::Compare::Lt, f32::INFINITY)?;
                let base = match coef {
                    Some(c) => c.mul_scalar(u)?,
                    None => finite.mul_scalar(0.0)?.add_scalar(u)?,
                };
                Some(base.div(&finite)?)
            }
        };
        let config = AdamWConfig {
            lr: lr as f32,
            beta1: self.hyper.beta1 as f32,
            beta2: self.hyper.beta2 as f32,
            eps: self.hyper.eps as f32,
        };
        let wd = self.hyper.weight_decay as f32;
        let list: Vec<AdamWParam> = (0..grads.len())
            .map(|i| {
                let model = &params.tensors()[self.owned.start + i];
                let (param, copy) = match &self.master {
                    Some(master) => (&master[i], Some(model)),
                    None => (model, None),
                };
                AdamWParam {
                    param,
                    grad: &grads[i],
                    m: &self.m[i],
                    v: &self.v[i],
                    copy,
                    weight_decay: if self.decay[i] { wd } else { 0.0 },
                }
            })
            .collect();
        let step = u32::try_from(self.step + 1)
            .map_err(|_| Error::Params("more than 2^32 optimizer steps".into()))?;
        adamw_step_scaled(&list, &config, step, coef.as_ref())?;
        self.step += 1;
        params.zero_grad();
        Ok(norm)
    }

    /// The moments on the host (Hugging Face names and shapes: no padded rows), for a
    /// checkpoint.
    pub fn state(&self, params: &GptParams) -> Result<OptimizerState> {
        self.whole(params, "the optimizer state")?;
        let config = params.config();
        Ok(OptimizerState {
            step: self.step,
            m: to_host(config, &self.m)?,
            v: to_host(config, &self.v)?,
        })
    }

    /// The f32 weights (Hugging Face shapes): the masters in bf16, else the model's own
    /// tensors.
    pub fn weights(&self, params: &GptParams) -> Result<ParamStore> {
        match &self.master {
            None => params.download(),
            Some(master) => {
                self.whole(params, "the f32 master weights")?;
                ParamStore::from_tensors(params.config(), to_host(params.config(), master)?)
            }
        }
    }
}

/// The model's tensors in `dtype` and, when that is narrower than f32, their f32 masters:
/// `(params, master)` ready for `AdamW::new`. Both have the device's shapes (wte padded).
pub fn upload_with_master(
    store: &ParamStore,
    device: &helios::Device,
    dtype: DType,
) -> Result<(GptParams, Option<Vec<Tensor>>)> {
    let all = 0..store.config().param_specs().len();
    upload_with_master_of(store, device, dtype, all)
}

/// `upload_with_master` with f32 masters for the parameters `owned` alone (a ZeRO-1 shard:
/// the others' masters live on their owners), ready for `AdamW::for_shard`.
pub fn upload_with_master_of(
    store: &ParamStore,
    device: &helios::Device,
    dtype: DType,
    owned: Range<usize>,
) -> Result<(GptParams, Option<Vec<Tensor>>)> {
    if dtype == DType::F32 {
        return Ok((GptParams::upload(store, device, DType::F32)?, None));
    }
    let master = store
        .iter()
        .enumerate()
        .filter(|(i, _)| owned.contains(i))
        .map(|(_, (s, t))| upload_rows(t, device_rows(&s), device, DType::F32))
        .collect::<Result<Vec<_>>>()?;
    let narrow = store
        .iter()
        .map(|(s, t)| upload_rows(t, device_rows(&s), device, dtype))
        .collect::<Result<Vec<_>>>()?;
    Ok((
        GptParams::from_tensors(store.config(), narrow)?,
        Some(master),
    ))
}
