//! Views and copies: `reshape`, `transpose`, `permute`, `narrow`/`slice`, `broadcast_to`/
//! `expand`, `contiguous` and `to_dtype`.
//!
//! The one decision a reader must know: a view never copies; it is a new `Layout` over the
//! same buffer, and element-wise kernels read it in place. Copies happen only in
//! `contiguous()` (a strided gather), in `to_dtype` (a cast), and in `reshape` of a tensor
//! whose elements are not row-major, which copies first, as PyTorch's `reshape` does (so
//! `reshape` always succeeds when the element count matches; check `is_contiguous()` to know
//! whether it will copy).

use std::ops::Range;

use helios_kernels::{ElementwiseOp, UnaryOp};

use crate::autograd::record;
use crate::{DType, Error, Result, Tensor};

impl Tensor {
    fn view_error(&self, op: &'static str, detail: String) -> Error {
        Error::InvalidView {
            op,
            shape: self.shape().to_vec(),
            detail,
        }
    }

    /// The same elements in `shape` (same element count). A view when the tensor is
    /// row-major; otherwise a row-major copy first.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        if n != self.len() {
            return Err(self.view_error(
                "reshape",
                format!(
                    "{shape:?} holds {n} elements, the tensor {}; keep the product of the sizes",
                    self.len()
                ),
            ));
        }
        let out = match self.layout().reshape(shape) {
            Some(l) => self.with_layout(l),
            None => return self.contiguous()?.reshape(shape),
        };
        let back = self.shape().to_vec();
        Ok(record("reshape", &[self], out, move |g, _| {
            Ok(vec![Some(g.reshape(&back)?)])
        }))
    }

    /// Dimensions `a` and `b` swapped (a view).
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor> {
        let l = self
            .layout()
            .transpose(a, b)
            .map_err(|e| self.view_error("transpose", e))?;
        Ok(record(
            "transpose",
            &[self],
            self.with_layout(l),
            move |g, _| Ok(vec![Some(g.transpose(a, b)?)]),
        ))
    }

    /// Dimensions reordered: dimension `d` of the result is dimension `order[d]` (a view).
    pub fn permute(&self, order: &[usize]) -> Result<Tensor> {
        let l = self
            .layout()
            .permute(order)
            .map_err(|e| self.view_error("permute", e))?;
        let mut inverse = vec![0; order.len()];
        for (d, &o) in order.iter().enumerate() {
            inverse[o] = d;
        }
        Ok(record(
            "permute",
            &[self],
            self.with_layout(l),
            move |g, _| Ok(vec![Some(g.permute(&inverse)?)]),
        ))
    }

    /// Elements `start..start + len` along `dim` (a view).
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let l = self
            .layout()
            .narrow(dim, start, len)
            .map_err(|e| self.view_error("narrow", e))?;
        if crate::autograd::any_needs(&[self]) {
            return Err(self.view_error(
                "narrow",
                "narrow/slice of a tensor that requires a gradient has no backward rule yet; \
                 slice a detach()ed tensor, or use ops that take the whole tensor"
                    .into(),
            ));
        }
        Ok(self.with_layout(l))
    }

    /// Elements `range` along `dim` (a view; `narrow` with a range).
    pub fn slice(&self, dim: usize, range: Range<usize>) -> Result<Tensor> {
        if range.end < range.start {
            return Err(self.view_error("slice", format!("range {range:?} is reversed")));
        }
        self.narrow(dim, range.start, range.end - range.start)
    }

    /// This tensor repeated to `shape` by numpy broadcasting: new dimensions on the left,
    /// size-1 dimensions stretched (a view with stride 0; nothing is copied).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let l = self
            .layout()
            .broadcast_to(shape)
            .map_err(|e| self.view_error("broadcast_to", e))?;
        let back = self.shape().to_vec();
        Ok(record(
            "broadcast_to",
            &[self],
            self.with_layout(l),
            move |g, _| Ok(vec![Some(crate::autograd::reduce_to(g, &back)?)]),
        ))
    }

    /// PyTorch's name for `broadcast_to`.
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        self.broadcast_to(shape)
    }

    /// A row-major tensor starting its own buffer: this one when it already is, else a copy
    /// by the strided gather kernel. Kernels that assume row-major data call this first.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = self.elementwise(
            ElementwiseOp::Unary(UnaryOp::Copy),
            &[self],
            None,
            self.dtype(),
        )?;
        Ok(record("contiguous", &[self], out, |g, _| {
            Ok(vec![Some(g.clone())])
        }))
    }

    /// The values converted to `dtype` (round to nearest even; NaN stays NaN, overflow gives
    /// ±∞). This tensor when it already has `dtype`; otherwise a new dense tensor.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let out = self.elementwise(ElementwiseOp::Unary(UnaryOp::Copy), &[self], None, dtype)?;
        let back = self.dtype();
        Ok(record("to_dtype", &[self], out, move |g, _| {
            Ok(vec![Some(g.to_dtype(back)?)])
        }))
    }
}
