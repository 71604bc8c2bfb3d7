//! AdamW over many parameter tensors: one fused read-modify-write pass per tensor, all
//! recorded into the open batch with no barriers between them.
//!
//! The one decision a reader must know: the update is in place. Parameters and moments are
//! the optimizer's state, so `adamw_step` writes `param`, `m`, `v` (and `copy`) where they
//! are, and every clone of those tensors sees the new values; the encoder orders the writes
//! after earlier reads of the same buffers. One dispatch per tensor rather than one over an
//! address table is explained in `helios_kernels::optim` (about 4% over GPT-2 124M's 148
//! tensors; a flat parameter buffer is one dispatch).

use helios_kernels::{AdamWArgs, AdamWKernel, AdamWStep, KernelError};

use crate::device::KernelKey;
use crate::{DType, Error, Result, Tensor};

/// AdamW hyper-parameters shared by every tensor of a step (PyTorch's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

/// One parameter tensor's update: the f32 master weights, their gradient, the f32 moments,
/// and optionally a narrow copy of the updated weights (e.g. bf16 for the next forward
/// pass) written in the same pass. All of one shape, each starting its own buffer.
#[derive(Clone, Copy, Debug)]
pub struct AdamWParam<'a> {
    /// f32, updated in place.
    pub param: &'a Tensor,
    /// Any float dtype.
    pub grad: &'a Tensor,
    /// f32 first moment, updated in place (zeros before step 1).
    pub m: &'a Tensor,
    /// f32 second moment, updated in place (zeros before step 1).
    pub v: &'a Tensor,
    /// Receives the updated parameter rounded to its dtype.
    pub copy: Option<&'a Tensor>,
    /// Decoupled weight decay for this tensor (PyTorch's default is 1e-2; 0 for biases and
    /// norms in GPT-2 training).
    pub weight_decay: f32,
}

/// One AdamW step `step` (1-based: the bias corrections use it) over every tensor in
/// `params`, in place. NaN in a gradient propagates to that element's m, v and parameter.
/// Everything is checked before anything is recorded.
pub fn adamw_step(params: &[AdamWParam<'_>], config: &AdamWConfig, step: u32) -> Result<()> {
    adamw_step_scaled(params, config, step, None)
}

/// `adamw_step` with every gradient multiplied by `grad_scale` (an f32 tensor of one
/// element, e.g. a clipping coefficient computed on the device) inside the update: no
/// scaled copy of the gradients is written and nothing is read back.
pub fn adamw_step_scaled(
    params: &[AdamWParam<'_>],
    config: &AdamWConfig,
    step: u32,
    grad_scale: Option<&Tensor>,
) -> Result<()> {
    const OP: &str = "adamw_step";
    // The update writes parameters in place: whatever was recorded before reads them first.
    crate::lazy::realize_all()?;
    let invalid = |detail: String| Error::Invalid { op: OP, detail };
    if step == 0 {
        return Err(invalid(
            "steps count from 1 (the bias corrections divide by 1 − β^step)".into(),
        ));
    }
    let Some(first) = params.first() else {
        return Ok(());
    };
    let device = first.param.device();
    if let Some(s) = grad_scale {
        if !s.device().same(device) {
            return Err(Error::DeviceMismatch { op: OP });
        }
        if s.len() != 1 || s.dtype() != DType::F32 {
            return Err(invalid(format!(
                "the gradient scale must be one f32 element, got {} of shape {:?}",
                s.dtype(),
                s.shape()
            )));
        }
    }
    // Dense, so its address is element 0 (the kernel reads that one element).
    let scale = grad_scale.map(|s| s.contiguous()).transpose()?;
    // Buffers each step writes, then (below) the gradients' buffers.
    let mut buffers: Vec<u64> = Vec::new();
    for (i, p) in params.iter().enumerate() {
        let mut tensors = vec![("param", p.param), ("grad", p.grad), ("m", p.m), ("v", p.v)];
        if let Some(c) = p.copy {
            tensors.push(("copy", c));
        }
        for &(name, t) in &tensors {
            if !t.device().same(device) {
                return Err(Error::DeviceMismatch { op: OP });
            }
            if t.shape() != p.param.shape() {
                return Err(invalid(format!(
                    "tensor {i}: {name} has shape {:?}, param {:?}; all must have one shape",
                    t.shape(),
                    p.param.shape()
                )));
            }
            if name != "grad" && name != "copy" && t.dtype() != DType::F32 {
                return Err(invalid(format!(
                    "tensor {i}: {name} is {}; master weights and moments are f32",
                    t.dtype()
                )));
            }
            if name != "grad" {
                if !t.is_contiguous() {
                    return Err(invalid(format!(
                        "tensor {i}: {name} is a strided or offset view; updates are in place, so pass whole dense tensors"
                    )));
                }
                buffers.push(t.buffer()?.device_address());
            }
        }
        if p.param.len() as u64 > u64::from(u32::MAX) {
            return Err(KernelError::TooLarge {
                what: "AdamW tensor element count",
                size: p.param.len() as u64,
            }
            .into());
        }
    }
    // A buffer written twice (or written and read as a gradient) would race.
    for p in params {
        buffers.push(p.grad.buffer()?.device_address());
    }
    buffers.sort_unstable();
    if buffers.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid(
            "a tensor appears twice (as two params, moments or copies, or as a param and a gradient); each update needs its own buffers".into(),
        ));
    }

    for p in params {
        let n = p.param.len();
        if n == 0 {
            continue;
        }
        // A strided gradient is gathered first (the kernel reads dense arrays).
        let grad = p.grad.contiguous()?;
        let kernel = AdamWKernel {
            grad: grad.dtype().storage(),
            copy: p.copy.map(|c| c.dtype().storage()),
            scaled: scale.is_some(),
            binding: device.binding(),
        };
        let args = AdamWArgs {
            n: n as u32,
            param: p.param.address()?,
            grad: grad.address()?,
            m: p.m.address()?,
            v: p.v.address()?,
            copy: p.copy.map(|c| c.address()).transpose()?.unwrap_or(0),
            scale: scale
                .as_ref()
                .map(|s| s.address())
                .transpose()?
                .unwrap_or(0),
            step: AdamWStep::new(
                f64::from(config.lr),
                f64::from(config.beta1),
                f64::from(config.beta2),
                f64::from(config.eps),
                f64::from(p.weight_decay),
                step,
            ),
        };
        let mut writes = vec![p.param.buffer()?, p.m.buffer()?, p.v.buffer()?];
        if let Some(c) = p.copy {
            writes.push(c.buffer()?);
        }
        let mut reads = vec![grad.buffer()?];
        if let Some(s) = &scale {
            reads.push(s.buffer()?);
        }
        device.dispatch_rows(
            KernelKey::AdamW(kernel),
            || kernel.build(),
            &reads,
            &writes,
            |c, g, _| Ok(kernel.launch(&c.module, g, &args)?),
        )?;
    }
    Ok(())
}
