//! LayerNorm and RMSNorm over the last axis on tensors: forward (saving per-row mean and rstd
//! in f32) and backward (dx, dgamma, dbeta).
//!
//! The one decision a reader must know: dgamma and dbeta are finished by a deterministic
//! second pass. The backward row kernel (or, for long rows, a column kernel) writes partial
//! sums, one row per group of rows, to scratch memory, and the reduce family's `Combine`
//! kernel sums those rows column by column: no atomics, the same bits on every run.

use helios_kernels::norm::{
    self, param_splits, NormKernel, NormKind, NormParamKernel, NormVariant,
};
use helios_kernels::reduce::REDUCE_WORKGROUP;
use helios_kernels::rows::RowLaunch;
use helios_vk::Buffer;

use crate::device::KernelKey;
use crate::ops::softmax::same_operands;
use crate::{DType, Error, Result, Tensor};

/// What a norm's forward returns: the output (x's shape and dtype) and the per-row
/// statistics the backward needs, f32 of x's shape without its last axis.
#[derive(Clone, Debug)]
pub struct NormOutput {
    pub y: Tensor,
    /// LayerNorm only.
    pub mean: Option<Tensor>,
    /// 1/√(var + eps) (LayerNorm) or 1/√(mean(x²) + eps) (RMSNorm).
    pub rstd: Tensor,
}

/// What a norm's backward returns: dx (x's shape and dtype) and the parameter gradients
/// (gamma's shape and dtype).
#[derive(Clone, Debug)]
pub struct NormGrads {
    pub dx: Tensor,
    pub dgamma: Tensor,
    /// LayerNorm only.
    pub dbeta: Option<Tensor>,
}

/// (rows, len) of a norm over the last axis of `x`, after checking the parameters.
fn norm_dims(op: &'static str, x: &Tensor, params: &[&Tensor]) -> Result<(u32, u32)> {
    let invalid = |detail: String| Error::Invalid { op, detail };
    let Some(&len) = x.shape().last() else {
        return Err(invalid(
            "needs at least one dimension (the normalized axis)".into(),
        ));
    };
    let n = x.len();
    if n as u64 > helios_kernels::reduce::MAX_ELEMENTS {
        return Err(invalid(format!(
            "{n} elements exceed the kernels' 2^31 − 1; split the tensor"
        )));
    }
    let rows: usize = x.shape()[..x.shape().len() - 1].iter().product();
    if len == 0 && rows > 0 {
        return Err(Error::EmptyReduction {
            op,
            shape: x.shape().to_vec(),
        });
    }
    for p in params {
        if p.shape() != [len] {
            return Err(invalid(format!(
                "parameters must have shape [{len}] (the last axis of {:?}); got {:?}",
                x.shape(),
                p.shape()
            )));
        }
        if !p.device().same(x.device()) {
            return Err(Error::DeviceMismatch { op });
        }
        if p.dtype() != params[0].dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: params[0].dtype(),
                rhs: p.dtype(),
            });
        }
    }
    Ok((rows as u32, len as u32))
}

/// Per-row statistics must be f32 of x's shape without its last axis.
fn check_stats(op: &'static str, x: &Tensor, stats: &[&Tensor]) -> Result<()> {
    let want = &x.shape()[..x.shape().len().saturating_sub(1)];
    for s in stats {
        if s.shape() != want || s.dtype() != DType::F32 {
            return Err(Error::Invalid {
                op,
                detail: format!(
                    "mean/rstd must be f32 of shape {want:?} (from the forward); got {} {:?}",
                    s.dtype(),
                    s.shape()
                ),
            });
        }
        if !s.device().same(x.device()) {
            return Err(Error::DeviceMismatch { op });
        }
    }
    Ok(())
}

impl Tensor {
    /// LayerNorm over the last axis: (x − mean)/√(var + eps)·gamma + beta, biased variance.
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<NormOutput> {
        let out = self.layer_norm_raw(gamma, beta, eps)?;
        Ok(crate::autograd_ops::layer_norm(
            self,
            gamma,
            Some(beta),
            out,
        ))
    }

    fn layer_norm_raw(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<NormOutput> {
        self.contiguous()?.norm_forward(
            NormKind::Layer,
            &gamma.contiguous()?,
            Some(&beta.contiguous()?),
            eps,
        )
    }

    /// RMSNorm over the last axis: x/√(mean(x²) + eps)·gamma.
    pub fn rms_norm(&self, gamma: &Tensor, eps: f32) -> Result<NormOutput> {
        let out =
            self.contiguous()?
                .norm_forward(NormKind::Rms, &gamma.contiguous()?, None, eps)?;
        Ok(crate::autograd_ops::layer_norm(self, gamma, None, out))
    }

    /// Gradients of `layer_norm` at input `self`, from the forward's `mean` and `rstd` and
    /// the output gradient `dy`.
    pub fn layer_norm_backward(
        &self,
        gamma: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        dy: &Tensor,
    ) -> Result<NormGrads> {
        self.norm_backward_adding(gamma, Some(mean), rstd, dy, None)
    }

    /// Gradients of `rms_norm` at input `self`, from the forward's `rstd` and `dy`.
    pub fn rms_norm_backward(
        &self,
        gamma: &Tensor,
        rstd: &Tensor,
        dy: &Tensor,
    ) -> Result<NormGrads> {
        self.norm_backward_adding(gamma, None, rstd, dy, None)
    }

    /// The layer norm's (`mean` given) or RMS norm's backward whose dx also adds `add` (x's
    /// shape and dtype) inside the kernel: autograd's sum of x's gradients from the norm and
    /// from x's other consumers (a residual stream's) without a pass of its own.
    pub(crate) fn norm_backward_adding(
        &self,
        gamma: &Tensor,
        mean: Option<&Tensor>,
        rstd: &Tensor,
        dy: &Tensor,
        add: Option<&Tensor>,
    ) -> Result<NormGrads> {
        self.contiguous()?.norm_backward(
            &gamma.contiguous()?,
            mean.map(Tensor::contiguous).transpose()?.as_ref(),
            &rstd.contiguous()?,
            &dy.contiguous()?,
            add.map(Tensor::contiguous).transpose()?.as_ref(),
        )
    }

    /// The norm kernel for rows of `len` of this tensor (`norm::select`'s choice on this
    /// device) and its invocations per row.
    fn norm_kernel(
        &self,
        kind: NormKind,
        backward: bool,
        gamma: &Tensor,
        len: u32,
    ) -> (NormKernel, u32) {
        let device = self.device();
        let storage = self.dtype().storage();
        let choice = norm::select(
            u64::from(len),
            backward,
            storage,
            &device.config().rows,
            device.max_row_workgroup(),
        );
        let kernel = NormKernel {
            kind,
            backward,
            storage,
            params: gamma.dtype().storage(),
            variant: choice.variant,
            reducer: device.reducer(),
            workgroup: choice.workgroup,
            binding: device.binding(),
            whole: helios_kernels::rows::whole_rows(u64::from(len), &device.config().rows),
            accumulate: false,
        };
        (kernel, choice.threads)
    }

    fn norm_forward(
        &self,
        kind: NormKind,
        gamma: &Tensor,
        beta: Option<&Tensor>,
        eps: f32,
    ) -> Result<NormOutput> {
        let op = if kind == NormKind::Layer {
            "layer_norm"
        } else {
            "rms_norm"
        };
        let params: Vec<&Tensor> = std::iter::once(gamma).chain(beta).collect();
        let (rows, len) = norm_dims(op, self, &params)?;
        let device = self.device();
        let stat_shape = self.shape()[..self.shape().len() - 1].to_vec();
        let y = Tensor::empty(device, self.shape(), self.dtype())?;
        let mean = match kind {
            NormKind::Layer => Some(Tensor::empty(device, &stat_shape, DType::F32)?),
            NormKind::Rms => None,
        };
        let rstd = Tensor::empty(device, &stat_shape, DType::F32)?;
        if rows > 0 {
            let (kernel, threads) = self.norm_kernel(kind, false, gamma, len);
            let layout = RowLaunch { rows, len, threads };
            let reads: Vec<&Buffer> = std::iter::once(self.buffer()?)
                .chain(
                    params
                        .iter()
                        .map(|p| p.buffer())
                        .collect::<Result<Vec<_>>>()?,
                )
                .collect();
            let writes: Vec<&Buffer> = std::iter::once(y.buffer()?)
                .chain(mean.as_ref().map(|m| m.buffer()).transpose()?)
                .chain(std::iter::once(rstd.buffer()?))
                .collect();
            device.dispatch_rows(
                KernelKey::Norm(kernel),
                || kernel.build(),
                &reads,
                &writes,
                |c, g, a| Ok(kernel.launch(&c.module, g, layout, 0, eps, a)?),
            )?;
        }
        Ok(NormOutput { y, mean, rstd })
    }

    /// `norm_backward_adding` on row-major operands.
    fn norm_backward(
        &self,
        gamma: &Tensor,
        mean: Option<&Tensor>,
        rstd: &Tensor,
        dy: &Tensor,
        add: Option<&Tensor>,
    ) -> Result<NormGrads> {
        let kind = match mean {
            Some(_) => NormKind::Layer,
            None => NormKind::Rms,
        };
        let op = if kind == NormKind::Layer {
            "layer_norm_backward"
        } else {
            "rms_norm_backward"
        };
        let (rows, len) = norm_dims(op, self, &[gamma])?;
        same_operands(op, self, dy)?;
        if let Some(a) = add {
            same_operands(op, self, a)?;
        }
        let stats: Vec<&Tensor> = mean.into_iter().chain(std::iter::once(rstd)).collect();
        check_stats(op, self, &stats)?;
        let device = self.device();
        let dx = Tensor::empty(device, self.shape(), self.dtype())?;
        let dgamma = Tensor::empty(device, &[len as usize], gamma.dtype())?;
        let dbeta = match kind {
            NormKind::Layer => Some(Tensor::empty(device, &[len as usize], gamma.dtype())?),
            NormKind::Rms => None,
        };
        let param_outs: Vec<&Buffer> = std::iter::once(dgamma.buffer()?)
            .chain(dbeta.as_ref().map(|t| t.buffer()).transpose()?)
            .collect();
        if rows == 0 {
            // No rows: the parameter gradients are zero.
            for p in [Some(&dgamma), dbeta.as_ref()].into_iter().flatten() {
                device.context().upload(
                    p.buffer()?,
                    0,
                    &gamma.dtype().encode(&vec![0.0; len as usize]),
                )?;
            }
            return Ok(NormGrads { dx, dgamma, dbeta });
        }
        let cfg = device.config().rows;
        let (kernel, threads) = self.norm_kernel(kind, true, gamma, len);
        let layout = RowLaunch { rows, len, threads };
        let kernel = NormKernel {
            accumulate: add.is_some(),
            ..kernel
        };
        let inputs: Vec<&Buffer> = [
            Some(self.buffer()?),
            Some(gamma.buffer()?),
            mean.map(|m| m.buffer()).transpose()?,
            Some(rstd.buffer()?),
            Some(dy.buffer()?),
            add.map(|a| a.buffer()).transpose()?,
        ]
        .into_iter()
        .flatten()
        .collect();
        let parts = usize::from(kind == NormKind::Layer) + 1;
        let vec = if len % 4 == 0 { 4u8 } else { 1 };
        // `n` f32 partial rows of dgamma (and of dbeta).
        let partial_scratch = |n: u32| {
            (0..parts)
                .map(|_| device.scratch(u64::from(n) * u64::from(len) * 4))
                .collect::<Result<Vec<_>>>()
        };
        // Partial rows of dgamma (and dbeta): how many, and the scratch holding them.
        let (partial_rows, scratch) = match kernel.variant {
            NormVariant::Cached { .. } => {
                let g = NormKernel::backward_groups(
                    rows,
                    kernel.workgroup,
                    threads,
                    cfg.norm_rows
                        .unwrap_or_else(|| norm::norm_bwd_rows(rows, len)),
                );
                let bufs = partial_scratch(g)?;
                let mut writes = vec![dx.buffer()?];
                writes.extend(bufs.iter());
                device.dispatch_rows(
                    KernelKey::Norm(kernel),
                    || kernel.build(),
                    &inputs,
                    &writes,
                    |c, gm, a| Ok(kernel.launch(&c.module, gm, layout, g, 0.0, a)?),
                )?;
                (g, bufs)
            }
            NormVariant::Streaming { unroll } => {
                device.dispatch_rows(
                    KernelKey::Norm(kernel),
                    || kernel.build(),
                    &inputs,
                    &[dx.buffer()?],
                    |c, gm, a| Ok(kernel.launch(&c.module, gm, layout, 0, 0.0, a)?),
                )?;
                let pk = NormParamKernel {
                    kind,
                    storage: self.dtype().storage(),
                    vec,
                    unroll,
                    workgroup: device.row_workgroup(REDUCE_WORKGROUP),
                    binding: device.binding(),
                };
                let target = u64::from(cfg.target_groups) * u64::from(pk.workgroup);
                let split = param_splits(rows, len, vec, target);
                let bufs = partial_scratch(split.splits)?;
                let reads: Vec<&Buffer> = [
                    Some(self.buffer()?),
                    mean.map(|m| m.buffer()).transpose()?,
                    Some(rstd.buffer()?),
                    Some(dy.buffer()?),
                ]
                .into_iter()
                .flatten()
                .collect();
                let writes: Vec<&Buffer> = bufs.iter().collect();
                device.dispatch_rows(
                    KernelKey::NormParam(pk),
                    || pk.build(),
                    &reads,
                    &writes,
                    |c, gm, a| Ok(pk.launch(&c.module, gm, rows, len, split, a)?),
                )?;
                (split.splits, bufs)
            }
        };
        // dgamma and dbeta (a layer norm's) in one dispatch.
        let second = scratch.get(1).zip(param_outs.get(1).copied());
        device.sum_partial_rows(
            &scratch[0],
            param_outs[0],
            second,
            (partial_rows, len),
            gamma.dtype(),
        )?;
        Ok(NormGrads { dx, dgamma, dbeta })
    }
}
