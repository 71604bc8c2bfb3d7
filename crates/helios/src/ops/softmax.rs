//! Softmax and log-softmax over the last axis (optional scale and causal mask) and their
//! backward passes, on tensors.
//!
//! The one decision a reader must know: the backward passes take the forward's *output* y
//! (not its input), as PyTorch's do: softmax dx = scale·y·(dy − Σ y·dy), log-softmax
//! dx = scale·(dy − exp(y)·Σ dy). Semantics (masking, fully masked rows, NaN) are those of
//! `helios_kernels::softmax`.

use helios_kernels::rows::RowLaunch;
use helios_kernels::softmax::{self, SoftmaxKernel};

use crate::device::KernelKey;
use crate::{Error, Result, Tensor};

/// How a softmax is applied: y = softmax(scale·x) over the last axis; with `causal`, column j
/// of row i of each trailing (T, L) matrix is masked when j > i (attention scores).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftmaxOptions {
    pub scale: f32,
    pub causal: bool,
}

impl Default for SoftmaxOptions {
    fn default() -> Self {
        SoftmaxOptions {
            scale: 1.0,
            causal: false,
        }
    }
}

impl SoftmaxOptions {
    /// Scaled, causal: what attention over (…, T, T) scores uses.
    pub fn causal(scale: f32) -> SoftmaxOptions {
        SoftmaxOptions {
            scale,
            causal: true,
        }
    }
}

impl Tensor {
    /// Softmax over the last axis.
    pub fn softmax(&self) -> Result<Tensor> {
        self.softmax_with(SoftmaxOptions::default())
    }

    /// Softmax over the last axis with a scale and optional causal mask.
    pub fn softmax_with(&self, opts: SoftmaxOptions) -> Result<Tensor> {
        crate::autograd_ops::softmax(self, false, opts)
    }

    /// Log-softmax over the last axis.
    pub fn log_softmax(&self) -> Result<Tensor> {
        self.log_softmax_with(SoftmaxOptions::default())
    }

    /// Log-softmax over the last axis with a scale and optional causal mask.
    pub fn log_softmax_with(&self, opts: SoftmaxOptions) -> Result<Tensor> {
        crate::autograd_ops::softmax(self, true, opts)
    }

    /// The gradient of the input of `softmax_with(opts)` from its output `self` and the
    /// output's gradient `dy`.
    pub fn softmax_backward(&self, dy: &Tensor, opts: SoftmaxOptions) -> Result<Tensor> {
        self.contiguous()?
            .softmax_bwd(false, &dy.contiguous()?, opts)
    }

    /// The gradient of the input of `log_softmax_with(opts)` from its output `self` and `dy`.
    pub fn log_softmax_backward(&self, dy: &Tensor, opts: SoftmaxOptions) -> Result<Tensor> {
        self.contiguous()?
            .softmax_bwd(true, &dy.contiguous()?, opts)
    }

    /// (Inputs are contiguous from here on: kernels read row-major data from the start of
    /// the buffer.)
    pub(crate) fn softmax_op(&self, log: bool, opts: SoftmaxOptions) -> Result<Tensor> {
        let op = if log { "log_softmax" } else { "softmax" };
        let geo = softmax_geometry(op, self.shape(), opts)?;
        let out = Tensor::empty(self.device(), self.shape(), self.dtype())?;
        let how = Record {
            log,
            backward: false,
            prefix: false,
        };
        self.record_softmax(how, opts, geo, &[self], &out, None)?;
        Ok(out)
    }

    /// Softmax of a contiguous tensor and each row's log-sum-exp, ln Σ exp(scale·x) over the
    /// unmasked columns (f32, the shape without its last axis; −inf for a fully masked row),
    /// in one kernel, for attention's materialised form (no autograd). Causal rows stop at
    /// the diagonal: the output's columns past it are left unwritten, for consumers that
    /// ignore them.
    pub(crate) fn softmax_lse(&self, opts: SoftmaxOptions) -> Result<(Tensor, Tensor)> {
        let geo = softmax_geometry("softmax", self.shape(), opts)?;
        let out = Tensor::empty(self.device(), self.shape(), self.dtype())?;
        let rows = &self.shape()[..self.shape().len() - 1];
        let lse = Tensor::empty(self.device(), rows, crate::DType::F32)?;
        let how = Record {
            log: false,
            backward: false,
            prefix: opts.causal,
        };
        self.record_softmax(how, opts, geo, &[self], &out, Some(&lse))?;
        Ok((out, lse))
    }

    fn softmax_bwd(&self, log: bool, dy: &Tensor, opts: SoftmaxOptions) -> Result<Tensor> {
        let op = if log {
            "log_softmax_backward"
        } else {
            "softmax_backward"
        };
        same_operands(op, self, dy)?;
        let geo = softmax_geometry(op, self.shape(), opts)?;
        let out = Tensor::empty(self.device(), self.shape(), self.dtype())?;
        let how = Record {
            log,
            backward: true,
            prefix: false,
        };
        self.record_softmax(how, opts, geo, &[self, dy], &out, None)?;
        Ok(out)
    }

    fn record_softmax(
        &self,
        Record {
            log,
            backward,
            prefix,
        }: Record,
        opts: SoftmaxOptions,
        (rows, len, causal_rows): (u32, u32, u32),
        inputs: &[&Tensor],
        out: &Tensor,
        lse: Option<&Tensor>,
    ) -> Result<()> {
        if rows == 0 || len == 0 {
            return Ok(());
        }
        let device = self.device();
        let cfg = device.config().rows;
        let choice = softmax::select(u64::from(len), backward, &cfg, device.max_row_workgroup());
        let (variant, threads, workgroup) = (choice.variant, choice.threads, choice.workgroup);
        let kernel = SoftmaxKernel {
            log,
            backward,
            causal: opts.causal,
            storage: self.dtype().storage(),
            variant,
            reducer: device.reducer(),
            workgroup,
            binding: device.binding(),
            whole: helios_kernels::rows::whole_rows(u64::from(len), &cfg),
            lse: lse.is_some(),
            prefix,
        };
        let reads: Vec<_> = inputs.iter().map(|t| t.buffer()).collect::<Result<_>>()?;
        let mut writes = vec![out.buffer()?];
        if let Some(l) = lse {
            writes.push(l.buffer()?);
        }
        device.dispatch_rows(
            KernelKey::Softmax(kernel),
            || kernel.build(),
            &reads,
            &writes,
            |c, g, addrs| {
                let l = kernel.launch(
                    &c.module,
                    g,
                    RowLaunch { rows, len, threads },
                    causal_rows,
                    opts.scale,
                    addrs,
                )?;
                Ok(l)
            },
        )
    }
}

/// Which softmax kernel `record_softmax` runs (see `SoftmaxKernel`).
#[derive(Clone, Copy)]
struct Record {
    log: bool,
    backward: bool,
    /// Causal rows stop at the diagonal.
    prefix: bool,
}

/// (rows, row length, T of the causal (…, T, L) view) of a softmax over the last axis.
fn softmax_geometry(
    op: &'static str,
    shape: &[usize],
    opts: SoftmaxOptions,
) -> Result<(u32, u32, u32)> {
    let invalid = |detail: String| Error::Invalid { op, detail };
    let Some(&len) = shape.last() else {
        return Err(invalid(
            "needs at least one dimension (the axis it normalizes)".into(),
        ));
    };
    if opts.causal && shape.len() < 2 {
        return Err(invalid(format!(
            "a causal mask needs (…, T, L) scores; shape {shape:?} has one dimension"
        )));
    }
    let n: usize = shape.iter().product();
    if n as u64 > helios_kernels::reduce::MAX_ELEMENTS {
        return Err(invalid(format!(
            "{n} elements exceed the kernels' 2^31 − 1; split the tensor"
        )));
    }
    let rows = n.checked_div(len).unwrap_or(0);
    let causal_rows = if opts.causal {
        shape[shape.len() - 2]
    } else {
        1
    };
    Ok((rows as u32, len as u32, causal_rows as u32))
}

/// `a` and `b` must agree in shape, dtype and device.
pub(crate) fn same_operands(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    if !a.device().same(b.device()) {
        return Err(Error::DeviceMismatch { op });
    }
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    Ok(())
}
