//! AdamW for GPT-2 on the device: f32 moments per parameter, decay on the matrices
//! only, global-norm gradient clipping computed on the device, and f32 master weights when
//! the model runs in bf16 (the update writes the bf16 copy in the same pass).
//!
//! The one decision a reader must know: the clip coefficient min(1, clip / (‖g‖ + 1e-6))
//! stays a device tensor that scales every gradient, so clipping never waits for the host;
//! the norm is handed back for logging, and reading it is the caller's choice.

use helios::{adamw_step_scaled, AdamWConfig, AdamWParam, DType, Tensor};

use crate::checkpoint::OptimizerState;
use crate::model::{device_rows, to_host, upload_rows, GptParams};
use crate::params::ParamStore;
use crate::schedule::AdamWHyper;
use crate::{Error, Result};

/// AdamW's state on the device, one entry per parameter (`GptConfig::param_specs` order).
pub struct AdamW {
    pub hyper: AdamWHyper,
    /// Steps taken (the next is `step + 1`).
    pub step: u64,
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
        let config = params.config();
        state.validate(config)?;
        let device = params.tensors()[0].device().clone();
        let specs = config.param_specs();
        // The host moments have Hugging Face's shapes; on the device they take the shape of
        // their parameter (zero rows for wte's padding).
        let upload = |map: &std::collections::BTreeMap<String, crate::HostTensor>| {
            specs
                .iter()
                .zip(params.tensors())
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
        })
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
        self.step_inner(params, lr, None)
    }

    /// `step` for gradients of a loss multiplied by a loss scale S (f16 training): the
    /// update multiplies them by `unscale` = 1/S, the norm returned (and clipped to) is the
    /// unscaled one, and when any gradient overflowed (a NaN or infinite norm) nothing is
    /// written: parameters, moments and the narrow copy keep their values, decided on the
    /// device. The step still counts (`step` and the bias corrections advance), so a
    /// skipped step is an ordinary step of the schedule that changed nothing.
    pub fn step_loss_scaled(
        &mut self,
        params: &GptParams,
        lr: f64,
        unscale: f32,
    ) -> Result<Tensor> {
        self.step_inner(params, lr, Some(unscale))
    }

    fn step_inner(&mut self, params: &GptParams, lr: f64, unscale: Option<f32>) -> Result<Tensor> {
        let grads = params
            .tensors()
            .iter()
            .map(|t| {
                t.grad().ok_or_else(|| {
                    Error::Params("a parameter got no gradient; call backward() first".into())
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = AdamW::grad_norm(params)?.expect("every parameter has a gradient");
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
                let model = &params.tensors()[i];
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
    if dtype == DType::F32 {
        return Ok((GptParams::upload(store, device, DType::F32)?, None));
    }
    let master = store
        .iter()
        .map(|(s, t)| upload_rows(t, device_rows(&s), device, DType::F32))
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
