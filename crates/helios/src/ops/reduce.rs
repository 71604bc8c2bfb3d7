//! Reductions on tensors: sum, mean, max and min over one axis or over everything (in the
//! input's dtype, accumulated in f32), and argmax (u32 indices along the axis).
//!
//! The one decision a reader must know: the tensor is viewed as (outer, axis, inner) and
//! handed to the kernel family's plan (`helios_kernels::reduce::plan`), which returns one
//! dispatch or two (partials, then their combination); partials live in scratch buffers that
//! are dropped right after recording, and the pool hands their memory out again only after
//! the GPU is done with it. This file also holds the device facts every row family shares
//! (which reducer, which workgroup size, which storage).

use std::sync::Arc;

use helios_kernels::reduce::{self, ReduceSetup, ReduceStep, Reduction, REDUCE_WORKGROUP};
use helios_kernels::rows::Reducer;
use helios_kernels::{Geometry, Launch};
use helios_vk::{Access, Buffer, MemoryLocation};

use crate::device::{Compiled, KernelKey};
use crate::grad_rules::Saved;
use crate::{DType, Device, Error, IndexTensor, Result, Tensor};

impl Device {
    /// How this device's row kernels (reduce, softmax, norms) combine values across
    /// invocations: subgroup operations when the config allows them and the device has
    /// arithmetic and shuffles in compute shaders, else shared-memory trees. SPIR-V 1.5 modules
    /// run with the reported subgroup size (varying sizes need SPIR-V 1.6 or an opt-in flag),
    /// so blocks of that size are whole subgroups.
    pub(crate) fn reducer(&self) -> Reducer {
        let sg = &self.context().caps().subgroup;
        let has = |op: &str| sg.operations.iter().any(|o| o == op);
        let usable = sg.compute_stage
            && has("basic")
            && has("arithmetic")
            && has("shuffle")
            && sg.size.is_power_of_two()
            && sg.size >= 4;
        if self.config().subgroups && usable {
            Reducer::Subgroup {
                block: sg.size,
                whole: true,
            }
        } else {
            Reducer::SharedTree
        }
    }

    /// The workgroup size of a row kernel: `HELIOS_WG` or the family's `default`, within the
    /// device's limit.
    pub(crate) fn row_workgroup(&self, default: u32) -> u32 {
        self.config()
            .rows
            .workgroup
            .unwrap_or(default)
            .min(self.max_row_workgroup())
    }

    /// The largest power-of-two workgroup the device allows.
    pub(crate) fn max_row_workgroup(&self) -> u32 {
        let max = self
            .context()
            .caps()
            .limits
            .max_workgroup_invocations
            .max(1);
        1 << (31 - max.leading_zeros())
    }

    fn reduce_setup(&self) -> ReduceSetup {
        let rows = self.config().rows;
        ReduceSetup {
            reducer: self.reducer(),
            workgroup: self.row_workgroup(REDUCE_WORKGROUP),
            binding: self.binding(),
            unroll: rows.unroll(),
            target_groups: rows.target_groups,
        }
    }

    /// Compiles (once) and records one dispatch of a row-family kernel: `reads` then `writes`
    /// are its buffers in declaration order; `launch` packs its push constants.
    pub(crate) fn dispatch_rows(
        &self,
        key: KernelKey,
        build: impl FnOnce() -> helios_spirv::KernelModule,
        reads: &[&Buffer],
        writes: &[&Buffer],
        launch: impl FnOnce(&Compiled, Geometry, &[u64]) -> Result<Launch>,
    ) -> Result<()> {
        let compiled = self.kernel(key, build)?;
        let geometry = Geometry {
            workgroup: compiled.workgroup[0],
            max_groups_x: self.max_groups_x(),
        };
        // Inline: this runs for every library dispatch.
        let addrs: smallvec::SmallVec<[u64; 8]> = reads
            .iter()
            .chain(writes)
            .map(|b| b.device_address())
            .collect();
        let l = launch(&compiled, geometry, &addrs)?;
        if l.groups.contains(&0) {
            return Ok(());
        }
        let accesses: smallvec::SmallVec<[Access; 8]> = reads
            .iter()
            .map(|b| Access::read(b))
            .chain(writes.iter().map(|b| Access::write(b)))
            .collect();
        self.context()
            .dispatch(&compiled.pipeline, l.groups, &l.push, &accesses)?;
        Ok(())
    }

    /// Sums the `rows` rows of the f32 partials `part` ((rows, len), row-major) into `out`,
    /// stored as `dtype`: the reduce family's deterministic column `Combine`, which reads f32
    /// and writes any storage, so a narrower result needs no cast pass (a norm's parameter
    /// gradients from their groups' partials, a split-K product from its k slices). With a
    /// second pair `(part2, out2)` of the same sizes, both sums run in one dispatch (a layer
    /// norm's dgamma and dbeta).
    pub(crate) fn sum_partial_rows(
        &self,
        part: &Buffer,
        out: &Buffer,
        second: Option<(&Buffer, &Buffer)>,
        (rows, len): (u32, u32),
        dtype: DType,
    ) -> Result<()> {
        let kernel = self.partial_rows_kernel(second.is_some(), len, dtype);
        let dims = reduce::Dims::Columns {
            outer: 1 + u32::from(second.is_some()),
            axis: rows,
            inner: len,
            splits: 1,
            chunk: rows,
            threads: reduce::combine_threads(rows.into(), kernel.unroll, kernel.workgroup),
        };
        let mut reads: smallvec::SmallVec<[&Buffer; 2]> = smallvec::smallvec![part];
        let mut writes: smallvec::SmallVec<[&Buffer; 2]> = smallvec::smallvec![out];
        if let Some((part2, out2)) = second {
            reads.push(part2);
            writes.push(out2);
        }
        self.dispatch_rows(
            KernelKey::Reduce(kernel.clone()),
            || kernel.build(),
            &reads,
            &writes,
            |c, g, a| Ok(kernel.launch(&c.module, g, dims, a, 1.0, (&[], &[]))?),
        )
    }

    /// The kernel `sum_partial_rows` runs (two outputs at once when `pair`).
    fn partial_rows_kernel(&self, pair: bool, len: u32, dtype: DType) -> reduce::ReduceKernel {
        reduce::ReduceKernel {
            op: Reduction::Sum,
            storage: dtype.storage(),
            stage: reduce::Stage::Combine,
            layout: reduce::Layout::Columns {
                vec: if len % 4 == 0 { 4 } else { 1 },
            },
            unroll: self.config().rows.unroll(),
            reducer: self.reducer(),
            workgroup: self.row_workgroup(REDUCE_WORKGROUP),
            binding: self.binding(),
            prologue: None,
            store_prologue: false,
            split_outer: pair,
        }
    }

    /// Whether `sum_partial_rows`'s kernel for `len` columns of `dtype` is compiled; when
    /// not, its compile is started (deferred: nothing waits). For tuning on real work, which
    /// tries a split product only once everything it launches is compiled.
    pub(crate) fn partial_rows_ready(&self, len: u32, dtype: DType) -> Result<bool> {
        let kernel = self.partial_rows_kernel(false, len, dtype);
        let key = KernelKey::Reduce(kernel.clone());
        if self.has_kernel(&key) {
            return Ok(true);
        }
        self.kernel(key, || kernel.build())?;
        Ok(false)
    }

    /// A device-local scratch buffer of `bytes` (at least 4).
    pub(crate) fn scratch(&self, bytes: u64) -> Result<Buffer> {
        Ok(self
            .context()
            .create_buffer(bytes.max(4), MemoryLocation::DeviceLocal)?)
    }
}

/// (x − mean)², pending. The deviations are dropped before the caller reduces the squares,
/// so no handle but the product's holds them: a reduction takes a pending result as its
/// prologue only when nothing else holds any of it (a live `d` in `d.mul(&d)?.mean(..)`
/// made the deviations and the squares one fused kernel storing both, read back by the
/// mean).
fn squared_deviations(x: &Tensor, mean: &Tensor) -> Result<Tensor> {
    let d = x.sub(mean)?;
    d.mul(&d)
}

/// `axis` as an index into `ndim` dimensions (negative values count from the end).
pub(crate) fn resolve_axis(op: &'static str, axis: isize, ndim: usize) -> Result<usize> {
    let a = if axis < 0 { axis + ndim as isize } else { axis };
    if a < 0 || a as usize >= ndim {
        return Err(Error::Axis { op, axis, ndim });
    }
    Ok(a as usize)
}

/// The (outer, axis, inner) view and result shape of reducing `shape` over `axis` (`None`:
/// everything, giving a 0-d result).
fn view(shape: &[usize], axis: Option<usize>) -> ((u64, u64, u64), Vec<usize>) {
    match axis {
        None => ((1, shape.iter().product::<usize>() as u64, 1), Vec::new()),
        Some(a) => {
            let outer: usize = shape[..a].iter().product();
            let inner: usize = shape[a + 1..].iter().product();
            let mut out = shape.to_vec();
            out.remove(a);
            ((outer as u64, shape[a] as u64, inner as u64), out)
        }
    }
}

impl Tensor {
    /// Sum over `axis` (negative counts from the end), dropping it; f32 accumulation, result
    /// in this tensor's dtype.
    pub fn sum(&self, axis: isize) -> Result<Tensor> {
        self.reduce(Reduction::Sum, Some(axis))
    }

    /// Sum of every element, as a 0-d tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reduce(Reduction::Sum, None)
    }

    /// Mean over `axis`; the mean of an empty axis is NaN.
    pub fn mean(&self, axis: isize) -> Result<Tensor> {
        self.reduce(Reduction::Mean, Some(axis))
    }

    /// Mean of every element, as a 0-d tensor.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.reduce(Reduction::Mean, None)
    }

    /// Maximum over `axis` (NaN if the axis holds a NaN).
    pub fn max(&self, axis: isize) -> Result<Tensor> {
        self.reduce(Reduction::Max, Some(axis))
    }

    /// Maximum of every element (NaN if any is NaN), as a 0-d tensor.
    pub fn max_all(&self) -> Result<Tensor> {
        self.reduce(Reduction::Max, None)
    }

    /// Minimum over `axis` (NaN if the axis holds a NaN).
    pub fn min(&self, axis: isize) -> Result<Tensor> {
        self.reduce(Reduction::Min, Some(axis))
    }

    /// Minimum of every element, as a 0-d tensor.
    pub fn min_all(&self) -> Result<Tensor> {
        self.reduce(Reduction::Min, None)
    }

    /// Biased variance over `axis` (the mean of squared deviations, as layer norm uses),
    /// dropping it; differentiable (built from mean, sub and mul). Without autograd the
    /// deviations and their squares are computed in the second mean's loads (its prologue).
    pub fn var(&self, axis: isize) -> Result<Tensor> {
        let a = resolve_axis("var", axis, self.shape().len())?;
        let mut kept = self.shape().to_vec();
        kept[a] = 1;
        let mean = self.mean(axis)?.reshape(&kept)?;
        squared_deviations(self, &mean)?.mean(axis)
    }

    /// Biased variance of every element, as a 0-d tensor.
    pub fn var_all(&self) -> Result<Tensor> {
        squared_deviations(self, &self.mean_all()?)?.mean_all()
    }

    /// Index of the first maximum along `axis` (a NaN counts as the maximum, as in PyTorch).
    pub fn argmax(&self, axis: isize) -> Result<IndexTensor> {
        let a = resolve_axis("argmax", axis, self.shape().len())?;
        self.argmax_over(Some(a))
    }

    /// Flat index of the first maximum of the whole tensor, as a 0-d index tensor.
    pub fn argmax_all(&self) -> Result<IndexTensor> {
        self.argmax_over(None)
    }

    /// `op` over `axis` (`None`: every element). Argmax returns indices: use `argmax`.
    pub fn reduce(&self, op: Reduction, axis: Option<isize>) -> Result<Tensor> {
        let y = self.reduce_raw(op, axis)?;
        if !crate::autograd::any_needs(&[self]) {
            return Ok(y);
        }
        let axis = axis
            .map(|a| resolve_axis(op.name(), a, self.shape().len()))
            .transpose()?;
        // A sum or mean's gradient needs only the shape; max and min compare x with y.
        let extreme = matches!(op, Reduction::Max | Reduction::Min);
        let (x, yd) = (Saved::new(self, extreme), Saved::new(&y, extreme));
        Ok(crate::autograd::record(
            op.name(),
            &[self],
            y,
            move |g, _| {
                Ok(smallvec::smallvec![Some(
                    crate::autograd_ops::reduce_backward(op, axis, &x, &yd, g,)?
                )])
            },
        ))
    }

    fn reduce_raw(&self, op: Reduction, axis: Option<isize>) -> Result<Tensor> {
        if op == Reduction::ArgMax {
            return Err(Error::Invalid {
                op: "reduce",
                detail: "argmax returns indices; call Tensor::argmax".into(),
            });
        }
        let axis = axis
            .map(|a| resolve_axis(op.name(), a, self.shape().len()))
            .transpose()?;
        let ((outer, len, inner), out_shape) = view(self.shape(), axis);
        let out_len: usize = out_shape.iter().product();
        if out_len > 0 && len == 0 {
            return match op {
                Reduction::Sum => Tensor::from_slice_as(
                    self.device(),
                    &vec![0.0; out_len],
                    &out_shape,
                    self.dtype(),
                ),
                Reduction::Mean => Tensor::from_slice_as(
                    self.device(),
                    &vec![f32::NAN; out_len],
                    &out_shape,
                    self.dtype(),
                ),
                _ => Err(Error::EmptyReduction {
                    op: op.name(),
                    shape: self.shape().to_vec(),
                }),
            };
        }
        let out = Tensor::empty(self.device(), &out_shape, self.dtype())?;
        if out_len > 0 {
            self.record_reduce(op, (outer, len, inner), Some(out.buffer()?), None)?;
        }
        Ok(out)
    }

    fn argmax_over(&self, axis: Option<usize>) -> Result<IndexTensor> {
        let ((outer, len, inner), out_shape) = view(self.shape(), axis);
        let out_len: usize = out_shape.iter().product();
        if out_len > 0 && len == 0 {
            return Err(Error::EmptyReduction {
                op: "argmax",
                shape: self.shape().to_vec(),
            });
        }
        let out = IndexTensor::empty(self.device(), out_shape)?;
        if out_len > 0 {
            self.record_reduce(
                Reduction::ArgMax,
                (outer, len, inner),
                None,
                Some(out.buffer()),
            )?;
        }
        Ok(out)
    }

    /// Records the plan's dispatches: values into `y`, indices into `yi` (argmax). A pending
    /// element-wise result is computed inside the first step (a prologue) rather than stored
    /// and read back; that step also stores the values something else holds.
    fn record_reduce(
        &self,
        op: Reduction,
        dims: (u64, u64, u64),
        y: Option<&Buffer>,
        yi: Option<&Buffer>,
    ) -> Result<()> {
        if op != Reduction::ArgMax {
            let recorded = self.with_prologue(|lowered, stored| {
                let empty = crate::lazy::Lowered::default().kernel;
                let prologue = Prologue {
                    kernel: Arc::new(std::mem::replace(&mut lowered.kernel, empty)),
                    leaves: std::mem::take(&mut lowered.leaves),
                    scalars: std::mem::take(&mut lowered.scalars),
                    stored,
                };
                self.record_steps(op, dims, y, yi, Some(prologue))
            })?;
            if recorded.is_some() {
                return Ok(());
            }
        }
        self.record_steps(op, dims, y, yi, None)
    }

    /// The reduction's dispatches: from this tensor's buffer, or computing its elements in
    /// the first step's loads (`prologue`).
    fn record_steps(
        &self,
        op: Reduction,
        (outer, len, inner): (u64, u64, u64),
        y: Option<&Buffer>,
        yi: Option<&Buffer>,
        prologue: Option<Prologue<'_>>,
    ) -> Result<()> {
        let device = self.device();
        let (kernel, leaves, scalars, stored) = match prologue {
            Some(p) => (Some(p.kernel), p.leaves, p.scalars, p.stored),
            None => (None, Vec::new(), Vec::new(), &[][..]),
        };
        let offsets = crate::lazy::element_offsets(&leaves)?;
        // Kernels read row-major data from the start of the buffer: views are gathered first.
        let x = match kernel {
            Some(_) => None,
            None => Some(self.contiguous()?),
        };
        let mut steps = reduce::plan(
            op,
            self.dtype().storage(),
            outer,
            len,
            inner,
            &device.reduce_setup(),
            kernel.clone(),
        )?;
        // The first step computes the prologue; it stores the group's held members too.
        steps[0].kernel.store_prologue = !stored.is_empty();
        let scale = match op {
            Reduction::Mean => (1.0 / len as f64) as f32,
            _ => 1.0,
        };
        // What the first step reads: the tensor's buffer, or the prologue's leaves at their
        // element offsets.
        // Inline lists: this runs for every reduction (bias gradients, losses, norms).
        let source: smallvec::SmallVec<[(&Buffer, u64); 4]> = match &x {
            Some(x) => smallvec::smallvec![(x.buffer()?, 0)],
            None => leaves
                .iter()
                .map(|(n, off)| Ok((n.buffer()?, (off * n.dtype.size()) as u64)))
                .collect::<Result<_>>()?,
        };
        if crate::env::debug() {
            if let Some(p) = &kernel {
                eprintln!(
                    "helios: {} {} computes {} ({} inputs) in its loads{}",
                    op.name(),
                    steps[0].kernel.name(),
                    p.name(),
                    leaves.len(),
                    match stored.len() {
                        0 => String::new(),
                        n => format!(", storing {n} of its values"),
                    }
                );
            }
        }
        let outputs: smallvec::SmallVec<[(&Buffer, u64); 2]> =
            y.into_iter().chain(yi).map(|b| (b, 0)).collect();
        // The first step's writes, then the prologue's stored values (its last buffers).
        fn first_writes<'b>(
            writes: &[(&'b Buffer, u64)],
            stored: &'b [Buffer],
        ) -> smallvec::SmallVec<[(&'b Buffer, u64); 6]> {
            let mut all: smallvec::SmallVec<[(&Buffer, u64); 6]> = writes.iter().copied().collect();
            all.extend(stored.iter().map(|b| (b, 0)));
            all
        }
        match steps.as_slice() {
            [step] => run_step(
                device,
                step,
                &source,
                &first_writes(&outputs, stored),
                scale,
                (&scalars, &offsets),
            ),
            [partial, combine] => {
                let n = partial.partials();
                let values = device.scratch(n * 4)?;
                let indices = match op {
                    Reduction::ArgMax => Some(device.scratch(n * 4)?),
                    _ => None,
                };
                let mid: smallvec::SmallVec<[(&Buffer, u64); 2]> = std::iter::once(&values)
                    .chain(indices.as_ref())
                    .map(|b| (b, 0))
                    .collect();
                run_step(
                    device,
                    partial,
                    &source,
                    &first_writes(&mid, stored),
                    scale,
                    (&scalars, &offsets),
                )?;
                run_step(device, combine, &mid, &outputs, scale, (&[], &[]))
            }
            _ => unreachable!("reduce plans have one or two steps"),
        }
    }
}

/// A pending group computed in a reduction's loads (`Tensor::with_prologue`).
struct Prologue<'a> {
    kernel: Arc<helios_kernels::FusedKernel>,
    /// Per kernel input: the node read and the element its read starts at.
    leaves: Vec<(Arc<crate::lazy::Node>, usize)>,
    scalars: Vec<f32>,
    /// Buffers for the kernel's outputs, which the first step stores (none: it stores none).
    stored: &'a [Buffer],
}

/// Records one step: `reads` then `writes` as (buffer, byte offset of the first element),
/// and the prologue's (scalars, element offsets of its inputs).
fn run_step(
    device: &Device,
    step: &ReduceStep,
    reads: &[(&Buffer, u64)],
    writes: &[(&Buffer, u64)],
    scale: f32,
    (scalars, offsets): (&[f32], &[u32]),
) -> Result<()> {
    let kernel = &step.kernel;
    let addrs: smallvec::SmallVec<[u64; 8]> = reads
        .iter()
        .chain(writes)
        .map(|(b, off)| b.device_address() + off)
        .collect();
    let reads: smallvec::SmallVec<[&Buffer; 8]> = reads.iter().map(|(b, _)| *b).collect();
    let writes: smallvec::SmallVec<[&Buffer; 2]> = writes.iter().map(|(b, _)| *b).collect();
    device.dispatch_rows(
        KernelKey::Reduce(kernel.clone()),
        || kernel.build(),
        &reads,
        &writes,
        |c, g, _| Ok(kernel.launch(&c.module, g, step.dims, &addrs, scale, (scalars, offsets))?),
    )
}

/// A row-family op, for [`Device::describe_row_op`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOp {
    /// A reduction over the last axis (`all`: over everything).
    Reduce {
        all: bool,
    },
    Softmax {
        backward: bool,
    },
    Norm {
        backward: bool,
    },
}

impl Device {
    /// The kernel variant this device runs for `op` on `rows` rows of `len` (what the family's
    /// selection function picks, with the reducer and workgroup size): for benchmark tables
    /// and logs.
    pub fn describe_row_op(&self, op: RowOp, dtype: DType, rows: usize, len: usize) -> String {
        let cfg = self.config().rows;
        let tag = self.reducer().tag();
        let max_wg = self.max_row_workgroup();
        match op {
            RowOp::Reduce { all } => {
                let (outer, axis) = if all { (1, rows * len) } else { (rows, len) };
                let setup = self.reduce_setup();
                match reduce::plan(
                    Reduction::Sum,
                    helios_kernels::Storage::F32,
                    outer as u64,
                    axis as u64,
                    1,
                    &setup,
                    None,
                ) {
                    Ok(steps) => {
                        let parts: Vec<String> = steps
                            .iter()
                            .map(|s| match s.dims {
                                reduce::Dims::Rows {
                                    splits, threads, ..
                                } if splits > 1 => {
                                    format!("{threads}/row x{splits} chunks")
                                }
                                reduce::Dims::Rows { threads, .. } => format!("{threads}/row"),
                                reduce::Dims::Columns { splits, .. } => format!("cols x{splits}"),
                            })
                            .collect();
                        format!(
                            "{} {tag} wg{} u{}",
                            parts.join(" + "),
                            setup.workgroup,
                            setup.unroll
                        )
                    }
                    Err(e) => e.to_string(),
                }
            }
            RowOp::Softmax { backward } => {
                let c = helios_kernels::softmax::select(len as u64, backward, &cfg, max_wg);
                format!(
                    "{} {}/row {tag} wg{}",
                    c.variant.tag(),
                    c.threads,
                    c.workgroup
                )
            }
            RowOp::Norm { backward } => {
                let c = helios_kernels::norm::select(
                    len as u64,
                    backward,
                    dtype.storage(),
                    &cfg,
                    max_wg,
                );
                format!(
                    "{} {}/row {tag} wg{}",
                    c.variant.tag(),
                    c.threads,
                    c.workgroup
                )
            }
        }
    }
}
