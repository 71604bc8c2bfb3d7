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

use helios_kernels::{ElementwiseOp, TransposeArgs, TransposeKernel, UnaryOp};

use crate::autograd::record;
use crate::device::KernelKey;
use crate::layout::Dims;
use crate::{DType, Error, Result, Tensor};

/// Elements from which `contiguous()` copies a transposed matrix through shared-memory
/// tiles instead of the element-wise copy (which smaller ones keep: it fuses with the
/// element-wise ops around it, and their strided reads cost little).
const TILED_TRANSPOSE_MIN: usize = 1 << 16;

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
        // Inline (a view op runs several times per layer): no allocation for the shape.
        let back = Dims::from_slice(self.shape());
        Ok(record("reshape", &[self], out, move |g, _| {
            Ok(smallvec::smallvec![Some(g.reshape(&back)?)])
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
            move |g, _| Ok(smallvec::smallvec![Some(g.transpose(a, b)?)]),
        ))
    }

    /// Dimensions reordered: dimension `d` of the result is dimension `order[d]` (a view).
    pub fn permute(&self, order: &[usize]) -> Result<Tensor> {
        let l = self
            .layout()
            .permute(order)
            .map_err(|e| self.view_error("permute", e))?;
        let mut inverse: Dims = smallvec::smallvec![0; order.len()];
        for (d, &o) in order.iter().enumerate() {
            inverse[o] = d;
        }
        Ok(record(
            "permute",
            &[self],
            self.with_layout(l),
            move |g, _| Ok(smallvec::smallvec![Some(g.permute(&inverse)?)]),
        ))
    }

    /// Elements `start..start + len` along `dim` (a view).
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let l = self
            .layout()
            .narrow(dim, start, len)
            .map_err(|e| self.view_error("narrow", e))?;
        let full = self.shape()[dim];
        Ok(record(
            "narrow",
            &[self],
            self.with_layout(l),
            move |g, _| Ok(smallvec::smallvec![Some(g.pad(dim, start, full)?)]),
        ))
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
        let back = Dims::from_slice(self.shape());
        Ok(record(
            "broadcast_to",
            &[self],
            self.with_layout(l),
            move |g, _| {
                Ok(smallvec::smallvec![Some(crate::autograd::reduce_to(
                    g, &back
                )?)])
            },
        ))
    }

    /// PyTorch's name for `broadcast_to`.
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        self.broadcast_to(shape)
    }

    /// A row-major tensor starting its own buffer: this one when it already is, else a copy
    /// by the strided gather kernel, or, for a large transposed matrix (a batch of them),
    /// by the tiled transpose. Kernels that assume row-major data call this first.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = match self.transposed_matrices() {
            Some(t) if self.len() >= TILED_TRANSPOSE_MIN => self.transpose_tiled(&t)?,
            _ => self.elementwise(
                ElementwiseOp::Unary(UnaryOp::Copy),
                &[self],
                None,
                self.dtype(),
            )?,
        };
        Ok(record("contiguous", &[self], out, |g, _| {
            Ok(smallvec::smallvec![Some(g.clone())])
        }))
    }

    /// Whether this view is a transposed matrix, or a batch of them: read row-major, its
    /// last axis is strided and the one before has stride 1 (size-1 axes dropped, axes
    /// contiguous in memory merged). `x.transpose(0, 1)` of a row-major `x` is one.
    pub(crate) fn transposed_matrices(&self) -> Option<TransposeArgs> {
        let l = self.layout();
        let (shape, strides) = crate::layout::merge_dims_one(l.shape(), l.strides());
        let u = |v: usize| u32::try_from(v).ok();
        let (batch, batch_stride, rows, cols, col_stride) = match (&shape[..], &strides[..]) {
            (&[r, c], &[1, sc]) => (1, 0, r, c, sc),
            (&[b, r, c], &[sb, 1, sc]) => (b, sb, r, c, sc),
            _ => return None,
        };
        // Every index the kernel forms must fit its u32 arithmetic.
        let last = l.offset() + (batch - 1) * batch_stride + (rows - 1) + (cols - 1) * col_stride;
        u(last)?;
        u(self.len())?;
        Some(TransposeArgs {
            batch: u(batch)?,
            rows: u(rows)?,
            cols: u(cols)?,
            offset: u(l.offset())?,
            batch_stride: u(batch_stride)?,
            col_stride: u(col_stride)?,
            ..TransposeArgs::default()
        })
    }

    /// A dense copy of a view `transposed_matrices` described as `t`, by the tiled
    /// transpose (`helios_kernels::transpose`): both the reads and the writes move whole
    /// memory sectors, where the element-wise copy's reads each use 2 or 4 bytes of one.
    fn transpose_tiled(&self, t: &TransposeArgs) -> Result<Tensor> {
        let device = self.device();
        let out = Tensor::empty(device, self.shape(), self.dtype())?;
        let src = self.buffer()?;
        let dst = out.buffer()?;
        let kern = transpose_kernel(device, self.dtype(), t);
        device.dispatch_rows(
            KernelKey::Transpose(kern),
            || kern.build(),
            &[src],
            &[dst],
            |c, g, a| {
                let args = TransposeArgs {
                    src: a[0],
                    dst: a[1],
                    ..*t
                };
                Ok(kern.launch(&c.module, g, &args)?)
            },
        )?;
        Ok(out)
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
            Ok(smallvec::smallvec![Some(g.to_dtype(back)?)])
        }))
    }
}

impl Tensor {
    /// This tensor placed at `start..start + len` along `dim` of a zero-filled tensor whose
    /// size along `dim` is `full` (the gradient of `narrow`).
    pub fn pad(&self, dim: usize, start: usize, full: usize) -> Result<Tensor> {
        let shape = self.shape();
        if dim >= shape.len() || start + shape[dim] > full {
            return Err(self.view_error(
                "pad",
                format!("cannot place dimension {dim} at {start} in a size of {full}"),
            ));
        }
        if shape.len() > 8 {
            return Err(self.view_error("pad", "pads tensors of at most 8 dimensions".into()));
        }
        let op = crate::lazy::ElemOp::Pad { dim, start, full };
        let out = self.lazy(op, &[self], self.dtype())?;
        let len = self.shape()[dim];
        Ok(record("pad", &[self], out, move |g, _| {
            Ok(smallvec::smallvec![Some(g.narrow(dim, start, len)?)])
        }))
    }

    /// `tensors` joined along `dim` (every other size equal): one fused kernel of padded
    /// reads; the gradient of each part is a view of the result's gradient.
    pub fn cat(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(Error::Invalid {
                op: "cat",
                detail: "needs at least one tensor".into(),
            });
        };
        let shape = first.shape();
        if dim >= shape.len() {
            return Err(first.view_error("cat", format!("no dimension {dim}")));
        }
        for t in tensors {
            let same = t.shape().len() == shape.len()
                && t.shape()
                    .iter()
                    .zip(shape)
                    .enumerate()
                    .all(|(d, (a, b))| d == dim || a == b);
            if !same {
                return Err(Error::ShapeMismatch {
                    op: "cat",
                    lhs: shape.to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            first.same_dtype("cat", t)?;
        }
        let full: usize = tensors.iter().map(|t| t.shape()[dim]).sum();
        let mut start = 0;
        let mut out: Option<Tensor> = None;
        for t in tensors {
            let part = t.pad(dim, start, full)?;
            start += t.shape()[dim];
            out = Some(match out {
                None => part,
                Some(acc) => acc.add(&part)?,
            });
        }
        Ok(out.expect("at least one tensor"))
    }

    /// `tensors` (one shape) stacked along a new dimension `dim`.
    pub fn stack(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        let parts: Vec<Tensor> = tensors
            .iter()
            .map(|t| {
                let mut s = t.shape().to_vec();
                if dim > s.len() {
                    return Err(t.view_error("stack", format!("no dimension {dim}")));
                }
                s.insert(dim, 1);
                t.reshape(&s)
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        Tensor::cat(&refs, dim)
    }

    /// Views of consecutive pieces of `sizes` along `dim` (their sum must be the size).
    pub fn split(&self, sizes: &[usize], dim: usize) -> Result<Vec<Tensor>> {
        let total: usize = sizes.iter().sum();
        if dim >= self.shape().len() || total != self.shape()[dim] {
            return Err(self.view_error(
                "split",
                format!("sizes {sizes:?} do not add up to dimension {dim}"),
            ));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&n| {
                let v = self.narrow(dim, start, n);
                start += n;
                v
            })
            .collect()
    }

    /// `chunks` views of equal size along `dim` (the last one smaller if it does not divide).
    pub fn chunk(&self, chunks: usize, dim: usize) -> Result<Vec<Tensor>> {
        let Some(&size) = self.shape().get(dim) else {
            return Err(self.view_error("chunk", format!("no dimension {dim}")));
        };
        if chunks == 0 {
            return Err(self.view_error("chunk", "needs at least one chunk".into()));
        }
        let each = size.div_ceil(chunks).max(1);
        let mut sizes = vec![each; size / each];
        if size % each != 0 {
            sizes.push(size % each);
        }
        self.split(&sizes, dim)
    }

    /// The slices at `ids` along `dim`: shape with `dim` replaced by `ids`'s length. Through
    /// the embedding kernels (a gather of rows), so the gradient sums repeated ids.
    pub fn index_select(&self, dim: usize, ids: &crate::IndexTensor) -> Result<Tensor> {
        let shape = self.shape().to_vec();
        if dim >= shape.len() {
            return Err(self.view_error("index_select", format!("no dimension {dim}")));
        }
        // Bring `dim` to the front, rows of everything else.
        let mut order: Vec<usize> = (0..shape.len()).collect();
        order.remove(dim);
        order.insert(0, dim);
        let front = self.permute(&order)?;
        let rest: usize = shape
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != dim)
            .map(|(_, &s)| s)
            .product();
        let table = front.reshape(&[shape[dim], rest])?;
        let rows = table.embedding(ids)?; // (n, rest)
        let mut out_shape: Vec<usize> = order.iter().map(|&d| shape[d]).collect();
        out_shape[0] = ids.len();
        let picked = rows.reshape(&out_shape)?;
        // Undo the permutation.
        let mut inverse: Dims = smallvec::smallvec![0; order.len()];
        for (i, &o) in order.iter().enumerate() {
            inverse[o] = i;
        }
        picked.permute(&inverse)
    }
}

/// The tiled transpose kernel for the copy `t` of `dtype` elements on `device`.
fn transpose_kernel(device: &crate::Device, dtype: DType, _t: &TransposeArgs) -> TransposeKernel {
    TransposeKernel {
        storage: dtype.storage(),
        binding: device.binding(),
    }
}

impl crate::Device {
    /// The kernel `x.transpose(0, 1).contiguous()` runs for a row-major (`rows`, `cols`)
    /// matrix `x` of `dtype`, for benchmark tables.
    pub fn describe_transpose(&self, dtype: DType, rows: usize, cols: usize) -> String {
        let t = TransposeArgs {
            batch: 1,
            rows: cols as u32,
            cols: rows as u32,
            col_stride: cols as u32,
            ..TransposeArgs::default()
        };
        transpose_kernel(self, dtype, &t).name()
    }
}
