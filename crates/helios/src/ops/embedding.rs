//! Embedding lookup on tensors and its deterministic backward.
//!
//! The one decision a reader must know: the backward never adds floats concurrently. It
//! groups the positions of each id with a counting sort (exact u32 atomics), orders each group
//! by position, and sums every vocabulary row's `dout` rows in that order, one workgroup per
//! row (see `helios_kernels::embedding`): the same bits on every run, each `dout` row read
//! once, each `dtable` row written once. A table that already has a gradient (a tied output
//! head's) takes the sums in place (`embedding_backward_add`): only the rows some id uses are
//! touched, where writing a separate gradient and summing the two moved four tables of bytes.
//! Ids from the host are range-checked before anything is recorded; ids made on the device
//! that fall outside `[0, vocab)` give NaN rows in the forward output and are skipped by the
//! backward.

use helios_kernels::reduce::MAX_ELEMENTS;
use helios_kernels::{EmbeddingArgs, EmbeddingKernel, EmbeddingStage, KernelError};
use helios_vk::Buffer;

use crate::device::KernelKey;
use crate::{Error, IndexTensor, Result, Tensor};

impl Tensor {
    /// Rows of this table (vocab, dim) picked by `ids` (…): a tensor (…, dim) of the table's
    /// dtype with `out[i, :] = table[ids[i], :]`.
    pub fn embedding(&self, ids: &IndexTensor) -> Result<Tensor> {
        let out = self.embedding_raw(ids)?;
        let (ids, vocab) = (ids.clone(), self.shape()[0]);
        let shape = [vocab, self.shape()[1]];
        // The table's gradient so far (a tied output head's), when offered, takes the sums
        // in place: no table-sized sum of the two, and no zero rows written.
        Ok(crate::autograd::record_taking_pending(
            "embedding",
            &[self],
            out,
            move |g, _| {
                let grad = match crate::autograd::take_pending(0, |t| t.shape() == shape) {
                    Some(base) => g.embedding_backward_add(&ids, base)?,
                    None => g.embedding_backward(&ids, vocab)?,
                };
                Ok(smallvec::smallvec![Some(grad)])
            },
        ))
    }

    fn embedding_raw(&self, ids: &IndexTensor) -> Result<Tensor> {
        const OP: &str = "embedding";
        let table = self.contiguous()?;
        let (vocab, dim) = table_dims(OP, &table, ids)?;
        check_size(ids.len(), dim)?;
        check_size(vocab, dim)?;
        ids.check_range(OP, vocab, None)?;
        let mut shape = ids.shape().to_vec();
        shape.push(dim);
        let out = Tensor::empty(self.device(), &shape, table.dtype())?;
        let args = EmbeddingArgs {
            n: ids.len() as u32,
            dim: dim as u32,
            vocab: vocab as u32,
            ids: ids.buffer().device_address(),
            table: table.address()?,
            out: out.address()?,
            ..EmbeddingArgs::default()
        };
        let kernel = EmbeddingKernel::new(
            EmbeddingStage::Forward,
            table.dtype().storage(),
            dim,
            self.device().binding(),
        );
        table.embedding_kernel(
            kernel,
            &args,
            &[ids.buffer(), table.buffer()?],
            &[out.buffer()?],
        )?;
        Ok(out)
    }

    /// The gradient of `table.embedding(ids)` with respect to a table of `vocab` rows, given
    /// this upstream gradient `dout` (…, dim): `dtable[v, :] = Σ_{i: ids[i] = v} dout[i, :]`
    /// (vocab, dim) in `dout`'s dtype, summed in f32 in increasing position order, so equal
    /// inputs give equal bits. Rows no id uses are 0.
    pub fn embedding_backward(&self, ids: &IndexTensor, vocab: usize) -> Result<Tensor> {
        const OP: &str = "embedding_backward";
        let (dout, dim) = self.embedding_dout(OP, ids)?;
        check_size(vocab, dim)?;
        ids.check_range(OP, vocab, None)?;
        let dtable = Tensor::empty(self.device(), &[vocab, dim], dout.dtype())?;
        if vocab == 0 || dim == 0 {
            return Ok(dtable);
        }
        let kernel = EmbeddingKernel::new(
            EmbeddingStage::Sum,
            dout.dtype().storage(),
            dim,
            self.device().binding(),
        );
        dout.embedding_sum(kernel, ids, &dtable)?;
        Ok(dtable)
    }

    /// `base + dout.embedding_backward(ids, rows)` for a `base` of (rows, dim) in any dtype,
    /// the result in `base`'s dtype: each row's sum starts from `base`'s row in f32 and adds
    /// the `dout` rows in increasing position order. When `base` is the only reference to its
    /// array (a gradient accumulated so far, as a tied embedding's output head leaves it), the
    /// sums are added in place and only the rows some id uses are read and written; otherwise
    /// `base` is copied first. The bits are the same either way.
    pub fn embedding_backward_add(&self, ids: &IndexTensor, base: Tensor) -> Result<Tensor> {
        const OP: &str = "embedding_backward_add";
        let (dout, dim) = self.embedding_dout(OP, ids)?;
        let vocab = match *base.shape() {
            [vocab, d] if d == dim => vocab,
            ref s => {
                return Err(Error::Invalid {
                    op: OP,
                    detail: format!(
                        "the base must be (rows, {dim}), the gradient of a table as wide as \
                         dout's rows; got shape {s:?}"
                    ),
                })
            }
        };
        if !base.device().same(self.device()) {
            return Err(Error::DeviceMismatch { op: OP });
        }
        check_size(vocab, dim)?;
        ids.check_range(OP, vocab, None)?;
        if vocab == 0 || dim == 0 {
            return Ok(base);
        }
        let table = match base.is_contiguous() && base.owns_array() {
            true => base,
            false => base.copy()?,
        };
        table.buffer()?;
        let kernel = EmbeddingKernel::sum_into(
            dout.dtype().storage(),
            table.dtype().storage(),
            dim,
            self.device().binding(),
        );
        dout.embedding_sum(kernel, ids, &table)?;
        Ok(table)
    }

    /// `dout` dense, and its rows' width, checked against `ids`.
    fn embedding_dout(&self, op: &'static str, ids: &IndexTensor) -> Result<(Tensor, usize)> {
        if !self.device().same(ids.device()) {
            return Err(Error::DeviceMismatch { op });
        }
        let dout = self.contiguous()?;
        let dim = match dout.shape().split_last() {
            Some((&dim, lead)) if lead == ids.shape() => dim,
            _ => {
                return Err(Error::Invalid {
                    op,
                    detail: format!(
                        "dout {:?} must be the ids' shape {:?} plus one axis (the embedding width)",
                        dout.shape(),
                        ids.shape()
                    ),
                })
            }
        };
        check_size(ids.len(), dim)?;
        Ok((dout, dim))
    }

    /// Groups the positions of `ids` by id (stages `Zero` to `Rank`), then runs `sum` (a
    /// `Sum` kernel) from this dense `dout` into `dtable` (vocab, dim).
    fn embedding_sum(
        &self,
        sum: EmbeddingKernel,
        ids: &IndexTensor,
        dtable: &Tensor,
    ) -> Result<()> {
        let device = self.device();
        let (vocab, dim) = (dtable.shape()[0], dtable.shape()[1]);
        let n = ids.len();
        let counts = device.scratch(helios_kernels::embedding::counts_len(vocab as u64) * 4)?;
        let offsets = device.scratch(helios_kernels::embedding::count_slots(vocab as u64) * 4)?;
        let pos = device.scratch(n as u64 * 4)?;
        let sorted = device.scratch(n as u64 * 4)?;
        let args = EmbeddingArgs {
            n: n as u32,
            dim: dim as u32,
            vocab: vocab as u32,
            ids: ids.buffer().device_address(),
            dout: self.address()?,
            dtable: dtable.address()?,
            counts: counts.device_address(),
            offsets: offsets.device_address(),
            pos: pos.device_address(),
            sorted: sorted.device_address(),
            ..EmbeddingArgs::default()
        };
        let i = ids.buffer();
        for stage in EmbeddingStage::BACKWARD {
            let (reads, writes): (Vec<&Buffer>, Vec<&Buffer>) = match stage {
                EmbeddingStage::Zero => (vec![], vec![&counts]),
                EmbeddingStage::Count => (vec![i], vec![&counts]),
                EmbeddingStage::Scan => (vec![], vec![&counts, &offsets]),
                EmbeddingStage::Place => (vec![i, &offsets], vec![&counts, &pos]),
                EmbeddingStage::Rank => (vec![i, &offsets, &pos], vec![&sorted]),
                EmbeddingStage::Sum => (
                    vec![&offsets, &sorted, self.buffer()?],
                    vec![dtable.buffer()?],
                ),
                EmbeddingStage::Forward => unreachable!("not a backward stage"),
            };
            let kernel = match stage {
                EmbeddingStage::Sum => sum,
                _ => EmbeddingKernel::new(stage, self.dtype().storage(), dim, device.binding()),
            };
            self.embedding_kernel(kernel, &args, &reads, &writes)?;
        }
        Ok(())
    }

    /// Records one embedding kernel: `reads` then `writes` in declaration order.
    fn embedding_kernel(
        &self,
        kernel: EmbeddingKernel,
        args: &EmbeddingArgs,
        reads: &[&Buffer],
        writes: &[&Buffer],
    ) -> Result<()> {
        self.device().dispatch_rows(
            KernelKey::Embedding(kernel),
            || kernel.build(),
            reads,
            writes,
            |c, g, _| Ok(kernel.launch(&c.module, g, args)?),
        )
    }
}

/// (vocab, dim) of a 2-D table on the ids' device.
fn table_dims(op: &'static str, table: &Tensor, ids: &IndexTensor) -> Result<(usize, usize)> {
    if !table.device().same(ids.device()) {
        return Err(Error::DeviceMismatch { op });
    }
    match *table.shape() {
        [vocab, dim] => Ok((vocab, dim)),
        ref s => Err(Error::Invalid {
            op,
            detail: format!("the table must be 2-D (vocab, dim), got shape {s:?}"),
        }),
    }
}

/// Fails when `rows × dim` elements are more than the kernels index.
fn check_size(rows: usize, dim: usize) -> Result<()> {
    let n = rows as u64 * dim as u64;
    if n > MAX_ELEMENTS {
        return Err(KernelError::TooLarge {
            what: "embedding element count",
            size: n,
        }
        .into());
    }
    Ok(())
}
