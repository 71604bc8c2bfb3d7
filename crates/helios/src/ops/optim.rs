//! AdamW over many parameter tensors: one fused read-modify-write pass per tensor, all
//! recorded into the open batch with no barriers between them; and `sum_squares`, the
//! global-norm clipping's Σ g² over all of them in one dispatch.
//!
//! The one decision a reader must know: the update is in place. Parameters and moments are
//! the optimizer's state, so `adamw_step` writes `param`, `m`, `v` (and `copy`) where they
//! are, and every clone of those tensors sees the new values; the encoder orders the writes
//! after earlier reads of the same buffers. One dispatch per tensor rather than one over an
//! address table is explained in `helios_kernels::optim` (a few percent of GPT-2 124M's
//! update; a flat parameter buffer is one dispatch).

use helios_kernels::multi_tensor::SUM_SQUARES_ENTRY;
use helios_kernels::{
    sum_squares_table, AdamWArgs, AdamWKernel, AdamWStep, KernelError, SumSquaresKernel,
};

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

/// Σ x² over every element of every tensor in `tensors` (any dtypes, accumulated in f32): a
/// (1,) f32 tensor, computed on the device and never read back (global-norm clipping).
///
/// With device addresses one dispatch per dtype walks all the tensors through a table of
/// their addresses (`helios_kernels::multi_tensor`), then one reduction sums its partials;
/// with descriptors, one reduction per tensor.
pub fn sum_squares(tensors: &[&Tensor]) -> Result<Tensor> {
    const OP: &str = "sum_squares";
    let Some(first) = tensors.first() else {
        return Err(Error::Invalid {
            op: OP,
            detail: "needs at least one tensor".into(),
        });
    };
    let device = first.device();
    if tensors.iter().any(|t| !t.device().same(device)) {
        return Err(Error::DeviceMismatch { op: OP });
    }
    let mut total: Option<Tensor> = None;
    let mut add = |s: Tensor| -> Result<()> {
        total = Some(match total.take() {
            None => s,
            Some(t) => t.add(&s)?,
        });
        Ok(())
    };
    if device.binding() != helios_spirv::Binding::DeviceAddress {
        for t in tensors {
            // The cast and the square are the sum's prologue once the block drops them.
            let squares = {
                let x = t.to_dtype(DType::F32)?;
                x.mul(&x)?
            };
            add(squares.sum_all()?.reshape(&[1])?)?;
        }
        return Ok(total.expect("at least one tensor"));
    }
    for dtype in DType::ALL {
        // Dense, starting on a multiple of four elements: the kernel reads whole vec4s.
        let group: Vec<Tensor> = tensors
            .iter()
            .filter(|t| t.dtype() == dtype && !t.is_empty())
            .map(|t| {
                let t = t.contiguous()?;
                if t.layout().offset() % 4 == 0 {
                    Ok(t)
                } else {
                    t.copy()
                }
            })
            .collect::<Result<_>>()?;
        if group.is_empty() {
            continue;
        }
        let spans = group
            .iter()
            .map(|t| {
                // The table counts elements in u32.
                if t.len() as u64 > u64::from(u32::MAX) {
                    return Err(KernelError::TooLarge {
                        what: "sum_squares tensor element count",
                        size: t.len() as u64,
                    }
                    .into());
                }
                Ok((t.address()?, t.len() as u64))
            })
            .collect::<Result<Vec<_>>>()?;
        let table = sum_squares_table(&spans);
        let chunks = table.len() / SUM_SQUARES_ENTRY;
        let table = crate::IndexTensor::from_slice(device, &table, &[table.len()])?;
        let partials = Tensor::empty(device, &[chunks], DType::F32)?;
        let kernel = SumSquaresKernel {
            storage: dtype.storage(),
            reducer: device.reducer(),
        };
        let mut reads = group
            .iter()
            .map(|t| t.buffer())
            .collect::<Result<Vec<_>>>()?;
        reads.push(table.buffer());
        let (table_at, partials_at) = (table.buffer().device_address(), partials.address()?);
        device.dispatch_rows(
            KernelKey::SumSquares(kernel),
            || kernel.build(),
            &reads,
            &[partials.buffer()?],
            |c, g, _| Ok(kernel.launch(&c.module, g, chunks as u32, table_at, partials_at)?),
        )?;
        add(partials.sum_all()?.reshape(&[1])?)?;
    }
    match total {
        Some(t) => Ok(t),
        // Every tensor was empty.
        None => Tensor::zeros(device, &[1], DType::F32),
    }
}
