//! `Tensor::matmul`: batched, strided matrix products with a fused epilogue.
//!
//! `a` is `(..., m, k)` and `b` is `(..., k, n)`; the product is `(..., m, n)`, a fresh
//! row-major tensor. Batch dimensions must be equal, or one operand 2-D (broadcast with a zero
//! batch stride; a row-major `a` against a 2-D `b` folds its batch into m, as a linear layer
//! wants). Transposed views (`x.transpose(-2, -1)`) and any view whose matrix dimensions have
//! a unit stride are read in place; only other layouts are copied first.
//!
//! The one decision a reader must know: which kernel runs is decided in `tune`
//! (forced variant, `HELIOS_MATMUL_VARIANT`, the tuned and persisted winner for the shape
//! class, or the documented default), never here; this file only turns tensors into a
//! `MatmulShape` and records the dispatch. A product that a graph pass may still give an
//! element-wise tail (at most a bias and an activation, no forced kernel) becomes a pending
//! graph node instead, which `lazy::epilogue` records when something needs it.
//!
//! `options` holds what a caller asks (`MatmulOptions`, `MatmulOverrides`), `native` the
//! recording of NVIDIA's native kernels, `split` the split-K plans; the problem and the
//! SPIR-V recording stay here.

use helios_kernels::matmul::{vector_elems, Alignment};
use helios_kernels::{
    Activation, Epilogue, MatmulAddresses, MatmulKernel, MatmulShape, MatmulVariant, Triangle,
};
use helios_vk::Access;

mod native;
mod options;
mod split;
pub(crate) mod tune;

use native::record_native;
pub(crate) use options::MatmulSpec;
pub use options::{MatmulOptions, MatmulOverrides};

use crate::device::KernelKey;
use crate::layout::Dims;
use crate::{DType, Error, Result, Tensor};
use tune::Choice;

/// Largest product (FLOPs) into which `matmul_col_sums` folds the column sums. Below it
/// the products are small and the saved dispatch is host time (a 12-block step's bias
/// gradients: 48 dispatches); above it the sums' registers cost the kernel more than the
/// reduction pass they save (GPT-2's MLP block on an H100; figures in
/// bench/results/source-comment-history.md).
const COL_SUMS_MAX_FLOPS: f64 = (1u64 << 30) as f64;

/// How a matmul runs: a kernel and, when `splits` > 1, the k dimension cut into that many
/// products of one batched launch into an f32 workspace, then summed (split-K). Splitting
/// fills a GPU whose output tiles alone would leave multiprocessors idle (long k, few tiles:
/// the weight gradients of a linear layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub kernel: MatmulKernel,
    pub splits: u32,
}

/// One matmul, resolved: operands in readable layouts, sizes and strides, fused inputs.
pub(crate) struct Problem {
    pub a: Tensor,
    pub b: Tensor,
    pub bias: Option<Tensor>,
    pub residual: Option<Tensor>,
    /// The epilogue's row values (f32, one per row of every batch matrix; see `RowOp`).
    pub rows: Option<Tensor>,
    /// The second output of `Epilogue::store_pre`: the activation's input, dense, of the
    /// output's shape and dtype.
    pub pre: Option<Tensor>,
    /// The third output of `Epilogue::col_sums`: B's column sums, (n) in the output dtype.
    pub sums: Option<Tensor>,
    pub shape: MatmulShape,
    pub trans: (bool, bool),
    pub input: DType,
    pub out: DType,
    pub epilogue: Epilogue,
    pub alpha: f32,
    /// (..., m, n) of the result.
    pub out_shape: Dims,
    pub forced: Option<MatmulVariant>,
    pub forced_splits: Option<u32>,
    /// The triangle the kernel skips (`Full` for every user-facing product; see
    /// `Problem::strided`).
    pub triangle: Triangle,
}

fn invalid(detail: String) -> Error {
    Error::Invalid {
        op: "matmul",
        detail,
    }
}

/// How one operand's matrix is laid out: transposed or not, leading dimension, batch stride,
/// batch dimensions. `None` when it must be copied to be read.
fn matrix_layout(t: &Tensor) -> Option<(bool, usize, usize)> {
    let l = t.layout();
    let nd = l.ndim();
    let (rows, cols) = (l.shape()[nd - 2], l.shape()[nd - 1]);
    let (sr, sc) = (l.strides()[nd - 2], l.strides()[nd - 1]);
    let (trans, ld) = if cols == 1 || sc == 1 {
        (false, if rows == 1 { cols } else { sr })
    } else if rows == 1 || sr == 1 {
        (true, sc)
    } else {
        return None;
    };
    // Batch dimensions must collapse to one stride.
    let mut stride = None;
    let mut expect = None;
    for (&d, &s) in l.shape()[..nd - 2].iter().zip(l.strides()).rev() {
        if d == 1 {
            continue;
        }
        match expect {
            None => stride = Some(s),
            Some(e) if e != s => return None,
            _ => {}
        }
        expect = Some(s * d);
    }
    Some((trans, ld, stride.unwrap_or(0)))
}

/// `t` readable in place (row- or column-major matrices, one batch stride) and the layout.
fn readable(t: &Tensor) -> Result<(Tensor, bool, usize, usize)> {
    if let Some((trans, ld, stride)) = matrix_layout(t) {
        return Ok((t.clone(), trans, ld, stride));
    }
    let c = t.contiguous()?;
    let (trans, ld, stride) = matrix_layout(&c).expect("row-major is readable");
    Ok((c, trans, ld, stride))
}

/// Row stride from which a row-major A is copied transposed before a native product.
const FAR_ROWS_BYTES: usize = 64 << 10;

/// Whether A (`m` × `k`, one matrix, dense rows, `m` in whole 16-byte pieces) is better
/// copied transposed first. The native kernels read a row-major A 32 bytes a row per stage,
/// and rows this far apart defeat the memory system: the lm head's input gradient
/// (8192 × 768 × 50304, the logits' gradient as A, rows 100 KB apart) took 2719 µs, and
/// 1126 µs from a column-major A; with the copy, 1837 µs. At k = 8192 the two layouts ran
/// within 5% (bench/results/2026-11-29-lmhead-h200.md). A pending product keeps the copy
/// as its A (`Problem::pending`), so the scheduler's recording (`product_now`, under its
/// lock, where nothing may be realised) finds A column-major and never copies.
fn far_rows(a: &Tensor, ta: bool, lda: usize, batch: usize, m: usize, k: usize) -> bool {
    !ta && batch == 1 && lda == k && far_rows_shape(a.device(), m, k, a.dtype())
}

/// Whether a row-major `m` × `k` A of `dtype` would be copied transposed before a product
/// (`far_rows`): what the cross-entropy asks before it writes the logits' gradient, which
/// it then stores column-major instead (`Tensor::cross_entropy_with_grad_cols`).
pub(crate) fn far_rows_shape(device: &crate::Device, m: usize, k: usize, dtype: DType) -> bool {
    m >= 256
        && m % 8 == 0
        && dtype.size() == 2
        && k * dtype.size() >= FAR_ROWS_BYTES
        && device.native_target().is_some()
}

fn to_u32(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        invalid(format!(
            "{what} of {v} elements exceeds the 2^32 - 1 a kernel indexes; split the product"
        ))
    })
}

impl Problem {
    pub(crate) fn new(a: &Tensor, b: &Tensor, o: &MatmulSpec) -> Result<Problem> {
        if !a.device().same(b.device()) {
            return Err(Error::DeviceMismatch { op: "matmul" });
        }
        if a.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op: "matmul",
                lhs: a.dtype(),
                rhs: b.dtype(),
            });
        }
        let (sa, sb) = (a.shape(), b.shape());
        if sa.len() < 2 || sb.len() < 2 {
            return Err(invalid(format!(
                "operands must have at least 2 dimensions, got {sa:?} and {sb:?}; reshape a \
                 vector to (1, n) or (n, 1)"
            )));
        }
        let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        if k != k2 {
            return Err(Error::ShapeMismatch {
                op: "matmul",
                lhs: sa.to_vec(),
                rhs: sb.to_vec(),
            });
        }
        let (ba, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
        let batch_dims: &[usize] = if ba == bb || bb.is_empty() {
            ba
        } else if ba.is_empty() {
            bb
        } else {
            return Err(invalid(format!(
                "batch dimensions {ba:?} and {bb:?} differ; make them equal or pass one \
                 operand as a 2-D matrix"
            )));
        };
        let batch: usize = batch_dims.iter().product();
        let mut out_shape = Dims::from_slice(batch_dims);
        out_shape.extend([m, n]);

        let (at, ta, lda, mut stride_a) = readable(a)?;
        let (bt, tb, ldb, stride_b) = readable(b)?;
        let (mut m_eff, mut batch_eff) = (m, batch);
        let tall = match ta {
            // A row-major stack of matrices against one B is one tall matrix.
            false => stride_a == m * lda,
            // So is a column-major one whose matrices lie side by side down the columns
            // (the rows of a column-major (B·T, V) viewed as (B, T, V)).
            true => stride_a == m && lda >= m * batch,
        };
        if bb.is_empty() && batch > 1 && tall {
            m_eff = m * batch;
            batch_eff = 1;
            stride_a = 0;
        }
        let stride_b = if bb.is_empty() { 0 } else { stride_b };
        let (at, ta, lda) = match far_rows(a, ta, lda, batch_eff, m_eff, k) {
            // Still (m, k), now column-major: a transposed view of a row-major (k, m) copy.
            true => {
                let t = at.reshape(&[m_eff, k])?.transpose(0, 1)?.contiguous()?;
                (t.transpose(0, 1)?, true, m_eff)
            }
            false => (at, ta, lda),
        };

        let out = o.out.unwrap_or(a.dtype());
        if o.act_grad != Activation::None
            && (o.residual.is_none() || o.bias.is_some() || o.act != Activation::None)
        {
            return Err(invalid(
                "act_grad multiplies by the activation's gradient at the residual: pass the \
                 activation's input as `residual`, and no bias or `act`"
                    .into(),
            ));
        }
        let bias = match o.bias {
            None => None,
            Some(t) => {
                if t.shape() != [n] {
                    return Err(invalid(format!(
                        "bias has shape {:?}; it must be ({n}) for an output with {n} columns",
                        t.shape()
                    )));
                }
                Some(t.to_dtype(out)?.contiguous()?)
            }
        };
        let residual = match o.residual {
            None => None,
            Some(t) => {
                if t.shape() != out_shape.as_slice() {
                    return Err(invalid(format!(
                        "residual has shape {:?}; it must be the output's {out_shape:?}",
                        t.shape()
                    )));
                }
                Some(t.to_dtype(out)?.contiguous()?)
            }
        };
        for (t, name) in [(&at, "a"), (&bt, "b")] {
            let l = t.layout();
            to_u32(name, l.span().saturating_sub(l.offset()))?;
        }
        to_u32("the output", batch * m * n)?;
        let shape = MatmulShape {
            batch: to_u32("batch", batch_eff)?,
            m: to_u32("m", m_eff)?,
            n: to_u32("n", n)?,
            k: to_u32("k", k)?,
            lda: to_u32("lda", lda)?,
            ldb: to_u32("ldb", ldb)?,
            ldc: n as u32,
            ldr: n as u32,
            stride_a: to_u32("batch stride of a", stride_a)?,
            stride_b: to_u32("batch stride of b", stride_b)?,
            stride_c: (m * n) as u32,
            stride_r: (m * n) as u32,
            inner: 1,
            inner_a: 0,
            inner_b: 0,
            inner_c: 0,
            inner_r: 0,
            k_parts: 1,
        };
        Ok(Problem {
            a: at,
            b: bt,
            bias,
            residual,
            rows: None,
            pre: None,
            sums: None,
            shape,
            trans: (ta, tb),
            input: a.dtype(),
            out,
            // (`act_grad` was checked above to come with a residual and alone.)
            epilogue: match o.act_grad {
                Activation::None => {
                    Epilogue::forward(o.bias.is_some(), o.act, o.residual.is_some())
                }
                act => Epilogue::ActGrad(act),
            },
            alpha: o.alpha,
            out_shape,
            forced: o.variant,
            forced_splits: o.splits,
            triangle: Triangle::Full,
        })
    }

    /// A product over explicit sizes and strides, for ops that index their operands in place
    /// (attention's (B, H) heads as a two-level batch): `shape` addresses the buffers of `a`
    /// and `b` from their views' offsets, and the output, a tensor of `out_shape` (the whole
    /// tensor `record` writes into, in `a`'s dtype), from its own. It starts with no
    /// epilogue; a caller that folds one in sets `epilogue` with its `residual` and `rows`.
    /// The caller vouches that every access stays inside the views' buffers.
    pub(crate) fn strided(
        a: &Tensor,
        b: &Tensor,
        shape: MatmulShape,
        trans: (bool, bool),
        triangle: Triangle,
        alpha: f32,
        out_shape: &[usize],
    ) -> Problem {
        Problem {
            a: a.clone(),
            b: b.clone(),
            bias: None,
            residual: None,
            rows: None,
            pre: None,
            sums: None,
            shape,
            trans,
            input: a.dtype(),
            out: a.dtype(),
            epilogue: Epilogue::NONE,
            alpha,
            out_shape: Dims::from_slice(out_shape),
            forced: None,
            forced_splits: None,
            triangle,
        }
    }

    /// Runs `plan` into a fresh output tensor.
    pub(crate) fn run(&self, plan: &Plan) -> Result<Tensor> {
        let out = self.output()?;
        self.run_into(plan, &out)?;
        Ok(out)
    }

    /// Runs `plan` into `out`, a dense tensor of the output's shape and dtype.
    pub(crate) fn run_into(&self, plan: &Plan, out: &Tensor) -> Result<()> {
        if plan.splits <= 1 {
            return self.record(&plan.kernel, out);
        }
        self.run_split(plan, out)
    }

    /// Whether the product may wait in the lazy graph (`Tensor::matmul_raw`): fusion is on,
    /// the kernel is not forced, the output is not empty, and the epilogue leaves room for
    /// what a graph pass can fold in after it (nothing past the bias and the activation).
    fn can_wait(&self, o: &MatmulSpec) -> bool {
        crate::env::fusion()
            && o.variant.is_none()
            && o.residual.is_none()
            && o.act_grad == Activation::None
            && self.out_shape.iter().all(|&d| d > 0)
    }

    /// The product as a pending graph node (`lazy::ElemOp::Product`). Its operands are
    /// realised now, as a recorded product's would be, so that recording it later, under
    /// the scheduler's lock, builds and realises nothing (`Tensor::product_now`).
    fn pending(&self) -> Result<Tensor> {
        let mut inputs = smallvec::SmallVec::new();
        for t in [&self.a, &self.b].into_iter().chain(&self.bias) {
            t.buffer()?;
            inputs.push(t.input());
        }
        let op = crate::lazy::ElemOp::Product {
            alpha: self.alpha,
            act: self.epilogue.act(),
            bias: self.bias.is_some(),
        };
        let layout = crate::Layout::contiguous(&self.out_shape);
        let node =
            crate::lazy::Node::pending(self.a.device().clone(), self.out, &layout, op, inputs)?;
        Ok(Tensor::from_parts(node, None))
    }

    /// `variant`'s kernel for this problem: vector accesses where the shape and the views'
    /// offsets allow them.
    pub(crate) fn kernel(&self, variant: MatmulVariant, subgroup: u32) -> MatmulKernel {
        let mut k = MatmulKernel::new(
            variant,
            self.input.storage(),
            self.out.storage(),
            self.trans,
            &self.shape,
            self.epilogue,
            subgroup,
        );
        k.triangle = self.triangle;
        k.exact_k &= self.triangle == Triangle::Full;
        let w = vector_elems(variant) as usize;
        k.vec_a &= self.a.layout().offset() % w == 0;
        k.vec_b &= self.b.layout().offset() % w == 0;
        k.vec_c &= !self
            .residual
            .as_ref()
            .is_some_and(|r| r.layout().offset() % w != 0);
        k
    }

    /// Whether the shape (ignoring offsets) allows vectors of `width` for A, B and C.
    pub(crate) fn alignment(&self, width: u32) -> Alignment {
        Alignment::of(&self.shape, self.trans.0, self.trans.1, width)
    }

    /// Records `kernel` writing `out` (a dense tensor of `out_shape` and dtype `out`).
    pub(crate) fn record(&self, kernel: &MatmulKernel, out: &Tensor) -> Result<()> {
        self.record_shape(kernel, &self.shape, out)
    }

    /// Records `kernel` over the operands with sizes and strides `s` (the problem's own, or
    /// a split launch's) writing `out`.
    fn record_shape(&self, kernel: &MatmulKernel, s: &MatmulShape, out: &Tensor) -> Result<()> {
        if s.m == 0 || s.n == 0 || s.batch == 0 {
            return Ok(());
        }
        // Vector accesses to C (`vec_c`) need its first element aligned as its rows are: an
        // output view starting elsewhere takes the kernel's element-wise form.
        let narrow;
        let kernel = match out.layout().offset() % vector_elems(kernel.variant) as usize {
            0 => kernel,
            _ => {
                narrow = MatmulKernel {
                    vec_c: false,
                    ..*kernel
                };
                &narrow
            }
        };
        let device = self.a.device();
        // Native kernels write their tensor maps into the device's workspace.
        let maps = match kernel.variant.is_native() {
            true => Some(device.native_maps()?),
            false => None,
        };
        let addr = MatmulAddresses {
            a: self.a.address()?,
            b: self.b.address()?,
            c: out.address()?,
            bias: self.bias.as_ref().map(|t| t.address()).transpose()?,
            residual: self.residual.as_ref().map(|t| t.address()).transpose()?,
            rows: self.rows.as_ref().map(|t| t.address()).transpose()?,
            pre: self.pre.as_ref().map(|t| t.address()).transpose()?,
            sums: self.sums.as_ref().map(|t| t.address()).transpose()?,
            maps: maps.map(|b| b.device_address()),
        };
        let mut accesses: smallvec::SmallVec<[Access; 6]> = smallvec::SmallVec::new();
        accesses.extend([
            Access::read(self.a.buffer()?),
            Access::read(self.b.buffer()?),
        ]);
        for t in self.bias.iter().chain(&self.residual).chain(&self.rows) {
            accesses.push(Access::read(t.buffer()?));
        }
        accesses.push(Access::write(out.buffer()?));
        for t in self.pre.iter().chain(&self.sums) {
            accesses.push(Access::write(t.buffer()?));
        }
        accesses.extend(maps.map(Access::write));
        if kernel.variant.is_native() {
            return record_native(device, kernel, s, &addr, self.alpha, &accesses);
        }
        let compiled = device.kernel(KernelKey::Matmul(*kernel), || kernel.build())?;
        let launch = kernel.launch(&compiled.module, s, &addr, self.alpha)?;
        device
            .context()
            .dispatch(&compiled.pipeline, launch.groups, &launch.push, &accesses)?;
        Ok(())
    }

    /// A fresh output tensor.
    pub(crate) fn output(&self) -> Result<Tensor> {
        Tensor::empty(self.a.device(), &self.out_shape, self.out)
    }
}

impl Tensor {
    /// The matrix product `self · other` over the last two dimensions (see the module docs
    /// for batches and layouts).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.matmul_opts(other, &MatmulOptions::default())
    }

    /// `act(alpha · self · other + bias) + residual`, stored as `opts.out`, in one kernel.
    pub fn matmul_opts(&self, other: &Tensor, opts: &MatmulOptions) -> Result<Tensor> {
        crate::autograd_ops::matmul(self, other, &opts.into())
    }

    /// `matmul_opts` with a forced kernel or a backward-only epilogue: for benchmarks and
    /// tests.
    pub fn matmul_overridden(
        &self,
        other: &Tensor,
        opts: &MatmulOptions,
        overrides: &MatmulOverrides,
    ) -> Result<Tensor> {
        crate::autograd_ops::matmul(self, other, &MatmulSpec::new(opts, overrides))
    }

    /// `matmul_opts` without autograd: one kernel, recorded now, or, where a graph pass may
    /// still fold element-wise ops into its epilogue (`Problem::can_wait`), when something
    /// first needs the result (`lazy::epilogue`).
    pub(crate) fn matmul_raw(&self, other: &Tensor, opts: &MatmulSpec) -> Result<Tensor> {
        let p = Problem::new(self, other, opts)?;
        if p.can_wait(opts) {
            return p.pending();
        }
        tune::run(&p)
    }

    /// The scheduler's recording of a pending product (`lazy::epilogue`), with the epilogue
    /// it settled on: `self · other` with `opts` (no forced variant), into a fresh tensor in
    /// `location`, and with `store_pre` also the activation's input (of the output's dtype).
    /// Returns the output, that input, and the kernel's name.
    ///
    /// It runs under the scheduler's lock, so it must not realise or build a graph node:
    /// the operands are realised, readable in place, and the bias and residual dense and of
    /// the output's dtype (what `lazy::epilogue` admits), which `Problem::new` then takes
    /// as they are.
    pub(crate) fn product_now(
        &self,
        other: &Tensor,
        opts: &MatmulSpec,
        store_pre: bool,
        location: helios_vk::MemoryLocation,
    ) -> Result<(Tensor, Option<Tensor>, String)> {
        let mut p = Problem::new(self, other, opts)?;
        if store_pre {
            p.epilogue = p.epilogue.saving_pre().ok_or_else(|| {
                invalid("saving the activation's input needs an activation".into())
            })?;
            p.pre = Some(p.output()?);
        }
        let out = Tensor::empty_in(self.device(), &p.out_shape, p.out, location)?;
        tune::run_into(&p, &out)?;
        let name = match crate::env::debug() {
            true => tune::choose(&p)?.0.kernel.name(),
            false => String::new(),
        };
        Ok((out, p.pre.take(), name))
    }

    /// `matmul_raw` with an activation (`opts.act`), also returning the activation's input
    /// (the product after the bias), which the kernel stores beside the output: `(act(z), z)`.
    pub(crate) fn matmul_saving_pre(
        &self,
        other: &Tensor,
        opts: &MatmulSpec,
    ) -> Result<(Tensor, Tensor)> {
        if opts.act == Activation::None || opts.residual.is_some() {
            return Err(invalid(
                "saving the activation's input needs an activation and no residual".into(),
            ));
        }
        let location = helios_vk::MemoryLocation::DeviceLocal;
        let (y, pre, _) = self.product_now(other, opts, true, location)?;
        Ok((y, pre.expect("product_now stores the input it is asked to")))
    }

    /// `(self · other, Σ_k other[k, ·])` for 2-D operands: a product and the column sums
    /// of its right operand, in the output dtype. Where the kernel chosen for the product
    /// can fold the sums in (`Epilogue::col_sums`: a SIMT tile, k not split) and the
    /// product is small (`COL_SUMS_MAX_FLOPS`), one launch computes both, else a reduction
    /// follows. This is a linear layer's weight and bias gradients (dW = Xᵀ·dY, db = Σ rows
    /// of dY), which the matmul backward rule takes from here. `variant` forces the
    /// product's kernel as `MatmulOverrides::variant` does. Records no gradient: an error for
    /// operands that need one (call it under `no_grad`).
    pub fn matmul_col_sums(
        &self,
        other: &Tensor,
        variant: Option<MatmulVariant>,
    ) -> Result<(Tensor, Tensor)> {
        if self.shape().len() != 2 || other.shape().len() != 2 {
            return Err(invalid(format!(
                "matmul_col_sums takes 2-D operands, got {:?} and {:?}; reshape a batch of \
                 rows into one matrix",
                self.shape(),
                other.shape()
            )));
        }
        if crate::autograd::any_needs(&[self, other]) {
            return Err(invalid(
                "matmul_col_sums records no gradient; call it under no_grad or on tensors \
                 that need none"
                    .into(),
            ));
        }
        let opts = MatmulSpec {
            variant,
            ..Default::default()
        };
        let mut p = Problem::new(self, other, &opts)?;
        let (plan, _) = tune::choose(&p)?;
        let s = &p.shape;
        let foldable = plan.splits <= 1
            && matches!(plan.kernel.variant, MatmulVariant::Simt(_))
            && s.flops() < COL_SUMS_MAX_FLOPS
            && s.m > 0
            && s.n > 0;
        if !foldable {
            // `other` is in the output dtype (no `out` option here).
            return Ok((tune::run(&p)?, other.sum(0)?));
        }
        // (The product's own epilogue is plain: `p` has no options.)
        let kernel = MatmulKernel {
            epilogue: Epilogue::ColSums,
            ..plan.kernel
        };
        let sums = Tensor::empty(self.device(), &[s.n as usize], p.out)?;
        p.sums = Some(sums.clone());
        let out = p.output()?;
        p.record(&kernel, &out)?;
        Ok((out, sums))
    }

    /// `matmul_opts` writing into `out`, a dense tensor of the result's shape and dtype
    /// (preallocated outputs: training loops, benchmarks).
    pub fn matmul_into(&self, other: &Tensor, out: &Tensor, opts: &MatmulOptions) -> Result<()> {
        self.matmul_into_overridden(other, out, opts, &MatmulOverrides::default())
    }

    /// `matmul_into` with a forced kernel or a backward-only epilogue: for benchmarks and
    /// tests.
    pub fn matmul_into_overridden(
        &self,
        other: &Tensor,
        out: &Tensor,
        opts: &MatmulOptions,
        overrides: &MatmulOverrides,
    ) -> Result<()> {
        let p = Problem::new(self, other, &MatmulSpec::new(opts, overrides))?;
        if !out.device().same(self.device()) {
            return Err(Error::DeviceMismatch { op: "matmul" });
        }
        if out.shape() != p.out_shape.as_slice() || out.dtype() != p.out || !out.is_contiguous() {
            return Err(invalid(format!(
                "the output must be a dense {} tensor of shape {:?}; got a {} tensor of shape \
                 {:?}{}",
                p.out,
                p.out_shape,
                out.dtype(),
                out.shape(),
                if out.is_contiguous() {
                    ""
                } else {
                    " (a strided view)"
                }
            )));
        }
        // Into a given tensor the product runs unsplit: the split form's sum lands in a
        // fresh one.
        let (plan, _) = tune::choose(&p)?;
        p.record(&plan.kernel, out)
    }

    /// Which kernel `matmul_opts` runs for these operands and why (tuning it first if that is
    /// what `matmul_opts` would do).
    pub fn matmul_choice(&self, other: &Tensor, opts: &MatmulOptions) -> Result<MatmulChoice> {
        self.matmul_choice_overridden(other, opts, &MatmulOverrides::default())
    }

    /// `matmul_choice` under overrides (a forced variant is reported as forced).
    pub fn matmul_choice_overridden(
        &self,
        other: &Tensor,
        opts: &MatmulOptions,
        overrides: &MatmulOverrides,
    ) -> Result<MatmulChoice> {
        let p = Problem::new(self, other, &MatmulSpec::new(opts, overrides))?;
        let (plan, how) = tune::choose(&p)?;
        Ok(MatmulChoice {
            kernel: plan.kernel.name(),
            variant: plan.kernel.variant,
            splits: plan.splits,
            how,
        })
    }
}

/// What `Tensor::matmul_choice` reports.
#[derive(Clone, Debug)]
pub struct MatmulChoice {
    /// The kernel's full name (variant, storages, transposes, vector flags, epilogue).
    pub kernel: String,
    pub variant: MatmulVariant,
    /// k split into this many products summed afterwards (1: not split).
    pub splits: u32,
    pub how: Choice,
}

impl MatmulChoice {
    /// The variant's name, with `/k<splits>` when k is split.
    pub fn label(&self) -> String {
        tune::winner_tag(&self.variant.label(), self.splits)
    }
}
