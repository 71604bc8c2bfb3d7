//! Cross-entropy over the last axis of a logits tensor, forward and fused forward+backward.
//!
//! The one decision a reader must know: the whole op is three dispatches recorded back to
//! back (count the non-ignored rows → one workgroup per row → a deterministic mean), and
//! the gradient is written by the same workgroup that computed the row's statistics, so
//! forward+backward reads the logits twice and writes dlogits once (see
//! `helios_kernels::loss`). Where a head's input-gradient product would copy row-major
//! dlogits transposed (`ops::matmul::far_rows_shape`: GPT-2's 50304 columns on a device
//! with native kernels), the gradient is stored column-major instead, by a row-statistics
//! pass and a tiled gradient pass (four dispatches, the same two reads and one write, and
//! no transposing copy). Targets known on the host are range-checked before anything
//! is recorded; targets produced on the device that fall outside `[0, vocab)` give NaN loss
//! and gradient for their row.
//!
//! Rows are read at a stride (a push constant), so a padded vocabulary costs no copy:
//! `cross_entropy_padded` takes logits (…, Vp) and counts their first V columns only, and
//! its gradient is (…, Vp) with zeros past V, recorded against the padded tensor itself (the
//! head's product gets it with no narrow/pad pass). A view whose rows lie at one stride, as
//! `x.narrow(-1, 0, V)`, is read in place as well; its dlogits is the same view of a
//! zero-padded buffer (but autograd reaches the padded tensor through `narrow`'s backward, a
//! pad copy: train through `cross_entropy_padded`). Other views are made contiguous first.

use helios_kernels::reduce::MAX_ELEMENTS;
use helios_kernels::{
    CrossEntropyArgs, CrossEntropyKernel, CrossEntropySetup, CrossEntropyStage, Storage,
    CROSS_ENTROPY_WORKGROUP,
};
use helios_vk::Buffer;

use crate::device::KernelKey;
use crate::{DType, Device, Error, IndexTensor, Result, Tensor};

/// What `cross_entropy` returns.
#[derive(Clone, Debug)]
pub struct CrossEntropy {
    /// (1,) f32: the mean loss over rows whose target is not ignored; 0 when all are.
    pub loss: Tensor,
    /// (rows,) f32: each row's loss; 0 for ignored rows.
    pub row_loss: Tensor,
    /// The logits' shape and dtype: d(scale · loss)/d(logits); only from
    /// `cross_entropy_with_grad`.
    pub dlogits: Option<Tensor>,
}

/// How `cross_entropy_impl` lays out dlogits.
#[derive(Clone, Copy)]
enum DlogitsLayout {
    Rows,
    /// Column-major (`cross_entropy_with_grad_cols`).
    Cols,
    /// Column-major where the product that made the logits (a head) would otherwise copy
    /// them transposed for its input gradient (`ops::matmul::far_rows_shape`), else rows.
    ForHead,
}

impl Tensor {
    /// Cross-entropy of these logits (…, vocab) against `targets` (…), one class index per
    /// row: `loss = mean over non-ignored rows of logsumexp(row) − row[target]`. Rows whose
    /// target equals `ignore_index` count for nothing (loss 0, gradient 0, not in the mean);
    /// if every row is ignored the loss is 0 (PyTorch gives NaN). A view whose rows lie at a
    /// uniform stride (`narrow` of the last axis from 0) is read in place.
    pub fn cross_entropy(
        &self,
        targets: &IndexTensor,
        ignore_index: Option<u32>,
    ) -> Result<CrossEntropy> {
        self.cross_entropy_classes(targets, ignore_index, None)
    }

    /// `cross_entropy` of the first `classes` columns of these logits (…, n), n ≥ classes:
    /// the loss of `self.narrow(-1, 0, classes)` (targets below `classes`), for a vocabulary
    /// padded to n. The columns past `classes` are never read; the gradient, here and through
    /// autograd, is (…, n) with zeros there, so the product that made the padded logits gets
    /// it directly.
    pub fn cross_entropy_padded(
        &self,
        targets: &IndexTensor,
        ignore_index: Option<u32>,
        classes: usize,
    ) -> Result<CrossEntropy> {
        self.cross_entropy_classes(targets, ignore_index, Some(classes))
    }

    fn cross_entropy_classes(
        &self,
        targets: &IndexTensor,
        ignore_index: Option<u32>,
        classes: Option<usize>,
    ) -> Result<CrossEntropy> {
        if crate::autograd::any_needs(&[self]) {
            // The gradient comes out of the same pass over the logits; backward scales it.
            let ce = self.cross_entropy_impl(
                targets,
                ignore_index,
                Some(1.0),
                classes,
                DlogitsLayout::ForHead,
            )?;
            return Ok(crate::autograd_ops::cross_entropy(self, ce));
        }
        self.cross_entropy_impl(targets, ignore_index, None, classes, DlogitsLayout::Rows)
    }

    /// Cross-entropy and its gradient in one pass over each row: `dlogits = (softmax − onehot)
    /// · scale / count` (0 for ignored rows), where `scale` is the upstream gradient of the
    /// mean loss (1.0 when the loss is what is minimised). Moves 2 reads and 1 write of the
    /// logits.
    pub fn cross_entropy_with_grad(
        &self,
        targets: &IndexTensor,
        ignore_index: Option<u32>,
        scale: f32,
    ) -> Result<CrossEntropy> {
        self.cross_entropy_impl(
            targets,
            ignore_index,
            Some(scale),
            None,
            DlogitsLayout::Rows,
        )
    }

    /// `cross_entropy_with_grad` with dlogits stored column-major: the same values, as a
    /// transposed view (of the logits' shape) of a dense (stride, rows) tensor. A product
    /// reading dlogits down its columns (a head's input gradient, whose k is the
    /// vocabulary) takes it as it is, where a row-major one is first copied transposed.
    /// Moves what the row-major form moves, in a row-statistics pass and a tiled gradient
    /// pass.
    pub fn cross_entropy_with_grad_cols(
        &self,
        targets: &IndexTensor,
        ignore_index: Option<u32>,
        scale: f32,
    ) -> Result<CrossEntropy> {
        self.cross_entropy_impl(
            targets,
            ignore_index,
            Some(scale),
            None,
            DlogitsLayout::Cols,
        )
    }

    /// The kernels over the first `classes` (all when `None`) columns of each row; with a
    /// `scale`, dlogits laid out as `layout` says.
    fn cross_entropy_impl(
        &self,
        targets: &IndexTensor,
        ignore_index: Option<u32>,
        scale: Option<f32>,
        classes: Option<usize>,
        layout: DlogitsLayout,
    ) -> Result<CrossEntropy> {
        const OP: &str = "cross_entropy";
        let device = self.device();
        if !device.same(targets.device()) {
            return Err(Error::DeviceMismatch { op: OP });
        }
        let invalid = |detail: String| Error::Invalid { op: OP, detail };
        let (x, stride) = match row_stride(self) {
            Some(stride) => (self.clone(), stride),
            None => {
                let x = self.contiguous()?;
                let n = x.shape().last().copied().unwrap_or(0);
                (x, n)
            }
        };
        let Some((&n, lead)) = x.shape().split_last() else {
            return Err(invalid(
                "logits must have at least one axis (the classes)".into(),
            ));
        };
        let vocab = classes.unwrap_or(n);
        if vocab == 0 {
            return Err(invalid(
                "logits have 0 classes; the last axis must not be empty".into(),
            ));
        }
        if vocab > n {
            return Err(invalid(format!(
                "{vocab} classes asked of logits {:?}; at most the last axis' {n}",
                x.shape()
            )));
        }
        let rows: usize = lead.iter().product();
        let cols = match layout {
            DlogitsLayout::Rows => false,
            DlogitsLayout::Cols => true,
            DlogitsLayout::ForHead => {
                crate::ops::matmul::far_rows_shape(device, rows, stride, x.dtype())
            }
        };
        if targets.len() != rows {
            return Err(invalid(format!(
                "logits {:?} have {rows} rows but targets {:?} hold {} indices; pass one target per row",
                x.shape(),
                targets.shape(),
                targets.len()
            )));
        }
        let elements = rows as u64 * stride as u64;
        if elements > MAX_ELEMENTS {
            return Err(helios_kernels::KernelError::TooLarge {
                what: "cross-entropy logits element count",
                size: elements,
            }
            .into());
        }
        targets.check_range(OP, vocab, ignore_index)?;

        let stats = Tensor::empty(device, &[2], DType::F32)?;
        let row_loss = Tensor::empty(device, &[rows], DType::F32)?;
        let loss = Tensor::empty(device, &[1], DType::F32)?;
        // (…, stride), viewed as (…, n) in the logits' layout; column-major: a (stride, rows)
        // tensor, and (rows, 2) row statistics for its kernel.
        let dlogits_rows = match scale {
            Some(_) if cols => Some(Tensor::empty(device, &[stride, rows], x.dtype())?),
            Some(_) => {
                let mut shape = x.shape().to_vec();
                *shape.last_mut().expect("checked above") = stride;
                Some(Tensor::empty(device, &shape, x.dtype())?)
            }
            None => None,
        };
        let row_stats = match dlogits_rows.is_some() && cols {
            true => Some(Tensor::empty(device, &[rows, 2], DType::F32)?),
            false => None,
        };
        let args = CrossEntropyArgs {
            rows: rows as u32,
            vocab: vocab as u32,
            stride: stride as u32,
            ignore_index,
            scale: scale.unwrap_or(1.0),
            logits: x.address()?,
            targets: targets.buffer().device_address(),
            stats: stats.address()?,
            row_loss: row_loss.address()?,
            row_stats: row_stats
                .as_ref()
                .map(|r| r.address())
                .transpose()?
                .unwrap_or(0),
            dlogits: dlogits_rows
                .as_ref()
                .map(|d| d.address())
                .transpose()?
                .unwrap_or(0),
            loss: loss.address()?,
        };
        let t = targets.buffer();
        x.ce_dispatch(CrossEntropyStage::Count, &args, &[t], &[stats.buffer()?])?;
        match (&dlogits_rows, &row_stats) {
            (Some(d), Some(rs)) => {
                let (rs, d) = (rs.buffer()?, d.buffer()?);
                let (x_buf, l) = (x.buffer()?, row_loss.buffer()?);
                x.ce_dispatch(CrossEntropyStage::Stats, &args, &[x_buf, t], &[l, rs])?;
                let reads = [x_buf, t, stats.buffer()?, rs];
                x.ce_dispatch(CrossEntropyStage::GradCols, &args, &reads, &[d])?;
            }
            _ => {
                let mut reads = vec![x.buffer()?, t];
                let mut writes = vec![row_loss.buffer()?];
                if let Some(d) = &dlogits_rows {
                    reads.push(stats.buffer()?);
                    writes.push(d.buffer()?);
                }
                let grad = dlogits_rows.is_some();
                x.ce_dispatch(CrossEntropyStage::Rows { grad }, &args, &reads, &writes)?;
            }
        }
        x.ce_dispatch(
            CrossEntropyStage::Mean,
            &args,
            &[row_loss.buffer()?, stats.buffer()?],
            &[loss.buffer()?],
        )?;
        let last = x.shape().len() - 1;
        let dlogits = match dlogits_rows {
            Some(d) if cols => {
                let mut shape = x.shape().to_vec();
                shape[last] = stride;
                Some(d.transpose(0, 1)?.reshape(&shape)?)
            }
            d => d,
        };
        let dlogits = match dlogits {
            Some(d) if stride != n => Some(d.narrow(last, 0, n)?),
            d => d,
        };
        Ok(CrossEntropy {
            loss,
            row_loss,
            dlogits,
        })
    }

    /// Records one cross-entropy kernel: `reads` then `writes` in declaration order.
    fn ce_dispatch(
        &self,
        stage: CrossEntropyStage,
        args: &CrossEntropyArgs,
        reads: &[&Buffer],
        writes: &[&Buffer],
    ) -> Result<()> {
        let d = self.device();
        let kernel =
            CrossEntropyKernel::new(stage, self.dtype().storage(), d.cross_entropy_setup());
        d.dispatch_rows(
            KernelKey::CrossEntropy(kernel),
            || kernel.build(),
            reads,
            writes,
            |c, g, _| Ok(kernel.launch(&c.module, g, args)?),
        )
    }
}

/// The row stride of logits `x` (…, vocab) that the kernels can read in place: `vocab` when
/// `x` is dense; the stride of a view that starts its buffer, keeps the last axis dense and
/// lays its rows out at one stride at least `vocab` (a `narrow` of the last axis from 0).
/// `None` for any other view, which is made contiguous first.
fn row_stride(x: &Tensor) -> Option<usize> {
    let layout = x.layout();
    let (&vocab, lead) = layout.shape().split_last()?;
    if layout.is_dense() {
        return Some(vocab);
    }
    let (&inner, lead_strides) = layout.strides().split_last()?;
    if layout.offset() != 0 || (vocab > 1 && inner != 1) {
        return None;
    }
    // Row-major over the leading axes, counted in rows of `stride` elements.
    let mut stride = None;
    let mut rows_inside = 1;
    for (&size, &st) in lead.iter().zip(lead_strides).rev() {
        if size != 1 {
            let s = *stride.get_or_insert(st);
            if st != s * rows_inside {
                return None;
            }
        }
        rows_inside *= size;
    }
    stride.filter(|&s| s >= vocab && s <= u32::MAX as usize)
}

impl Device {
    /// The cross-entropy kernels' reducer, workgroup and unroll on this device (the row
    /// families' settings: `HELIOS_NO_SUBGROUP`, `HELIOS_WG`, `HELIOS_ROW_UNROLL`).
    fn cross_entropy_setup(&self) -> CrossEntropySetup {
        CrossEntropySetup {
            reducer: self.reducer(),
            workgroup: self.row_workgroup(CROSS_ENTROPY_WORKGROUP),
            unroll: self.config().rows.unroll(),
            binding: self.binding(),
        }
    }

    /// The cross-entropy kernels this device runs for `rows` rows of `vocab` logits, for
    /// benchmark tables and logs.
    pub fn describe_cross_entropy(&self, rows: usize, vocab: usize) -> String {
        let setup = self.cross_entropy_setup();
        let k =
            CrossEntropyKernel::new(CrossEntropyStage::Rows { grad: true }, Storage::F32, setup);
        let threads = k.threads_per_row(vocab as u32, setup.workgroup);
        format!(
            "count | rows {threads}/row {} wg{} u{}, logits read 2x ({} groups) | mean",
            setup.reducer.tag(),
            setup.workgroup,
            setup.unroll,
            rows.div_ceil((setup.workgroup / threads) as usize)
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, IndexTensor, Tensor};

    /// The column-major gradient through autograd, under a loss factor (accumulation and f16
    /// loss scaling multiply the loss before backward), equals the row-major one. (Autograd
    /// picks it only on native devices; a leaf stores its gradient row-major either way.)
    #[test]
    fn column_major_gradient_through_autograd() {
        let device = Device::from_env().expect("a Vulkan device");
        let (b, t, v) = (2, 3, 37);
        let host: Vec<f32> = (0..b * t * v)
            .map(|i| ((i * 7919 % 113) as f32 / 113.0 - 0.5) * 4.0)
            .collect();
        let targets: Vec<u32> = (0..b * t).map(|i| (i * 11 % v) as u32).collect();
        let tg = IndexTensor::from_slice(&device, &targets, &[b, t]).unwrap();
        let mut grads = Vec::new();
        for layout in [super::DlogitsLayout::Rows, super::DlogitsLayout::Cols] {
            let leaf = Tensor::from_slice_as(&device, &host, &[b, t, v], DType::BF16)
                .unwrap()
                .requires_grad_();
            let ce = leaf
                .detach()
                .cross_entropy_impl(&tg, None, Some(1.0), None, layout)
                .unwrap();
            let ce = crate::autograd_ops::cross_entropy(&leaf, ce);
            ce.loss.mul_scalar(0.25).unwrap().backward().unwrap();
            grads.push(leaf.grad().expect("a gradient").to_vec().unwrap());
        }
        for (i, (a, b)) in grads[0].iter().zip(&grads[1]).enumerate() {
            assert!((a - b).abs() <= 1e-4 + 1e-2 * b.abs(), "{i}: {a} vs {b}");
        }
        assert!(grads[0].iter().any(|&g| g != 0.0));
    }
}
