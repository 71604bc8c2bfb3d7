//! Reductions: sum, mean, max, min and argmax along one axis of a contiguous tensor viewed as
//! (outer, axis, inner), or over everything (outer = inner = 1).
//!
//! Key decisions a reader must know:
//! - Two layouts. `Rows` (inner = 1: the last axis, or everything): a group of invocations per
//!   row, 16-byte slot loads, a group reduction at the end (see `rows`). `Columns` (inner > 1):
//!   each invocation owns `vec` adjacent columns and walks the axis, so neighbouring
//!   invocations read neighbouring addresses; no cross-invocation reduction at all.
//! - Two phases when one pass would leave the GPU idle (a long row, a long axis over few
//!   columns): `Partial` splits the axis into chunks, writes one partial per (row, chunk),
//!   and `Combine` reduces the partials with the same kernel code. Sums accumulate in f32.
//! - max, min and argmax compare *order keys*: the f32 bits mapped to a u32 that sorts like
//!   the float, NaN canonicalised to the top (max, argmax) or bottom (min). Integer max/min
//!   then propagate NaN exactly and deterministically on every device (GLSL's FMax does not
//!   promise either), and argmax needs only two integer group reductions: the largest key,
//!   then the smallest index holding it (the first index of the max, NaN counting as the
//!   max, as in PyTorch). Partials of these ops are keys, so an empty chunk is harmless.
//! - Output: sum, mean, max and min in the input's storage type (as PyTorch); argmax as u32
//!   indices along the axis.

use helios_spirv::{
    Access, Binding, Buffer, KernelBuilder, KernelModule, ReduceOp, Scalar, Ty, Val,
};

use crate::fused::FusedKernel;
use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::rows::{
    for_each_slot_by, hreduce, hsum, key_value, linear_workgroup, order_key, row_slots,
    threads_for, Groups, Reducer, Row,
};
use crate::storage::{buffer_scalar, store_f32, Storage};
use crate::KernelError;
use std::sync::Arc;

/// What a reduction computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduction {
    Sum,
    /// The sum times 1/len (the kernel is the sum's, with a scale).
    Mean,
    Max,
    Min,
    /// Index of the first maximum along the axis (NaN is the maximum).
    ArgMax,
}

impl Reduction {
    pub const ALL: [Reduction; 5] = [
        Reduction::Sum,
        Reduction::Mean,
        Reduction::Max,
        Reduction::Min,
        Reduction::ArgMax,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Reduction::Sum => "sum",
            Reduction::Mean => "mean",
            Reduction::Max => "max",
            Reduction::Min => "min",
            Reduction::ArgMax => "argmax",
        }
    }

    /// The kernel that computes it (mean is a scaled sum).
    pub const fn kernel_op(self) -> Reduction {
        match self {
            Reduction::Mean => Reduction::Sum,
            r => r,
        }
    }

    /// Whether the op compares order keys (and its partials are u32 keys).
    const fn keyed(self) -> bool {
        matches!(self, Reduction::Max | Reduction::Min | Reduction::ArgMax)
    }
}

/// Where a reduction kernel reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The tensor in, the result out.
    Direct,
    /// The tensor in, one partial per (row, chunk) out: f32 sums or u32 keys, plus u32
    /// indices for argmax.
    Partial,
    /// Partials in, the result out.
    Combine,
}

/// How invocations map onto the (outer, axis, inner) view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// inner = 1: a group of invocations per row (its size is a launch parameter).
    Rows,
    /// inner > 1: each invocation owns `vec` adjacent columns (4 when inner % 4 == 0).
    Columns { vec: u8 },
}

/// The signature of a reduction kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReduceKernel {
    /// Sum, Max, Min or ArgMax (Mean runs the Sum kernel).
    pub op: Reduction,
    /// Storage of the tensor read (Direct, Partial) and of the result (Direct, Combine).
    pub storage: Storage,
    pub stage: Stage,
    pub layout: Layout,
    /// Slots each invocation loads per loop step.
    pub unroll: u8,
    pub reducer: Reducer,
    pub workgroup: u32,
    pub binding: Binding,
    /// Direct and Partial stages: an element-wise expression (output 0 of a fused kernel
    /// over the same elements) computed where the tensor would be loaded, so the lazy graph
    /// never stores it. Its inputs take the tensor's place among the buffers and its scalars
    /// follow the kernel's own push constants.
    pub prologue: Option<Arc<FusedKernel>>,
    /// With a prologue: the step also stores every output of it where it computes them
    /// (each dense, in its own buffer after the kernel's others). A pending group that
    /// something else still reads is then stored and reduced in one pass over its inputs,
    /// where it would otherwise be stored by its own kernel and read back.
    pub store_prologue: bool,
    /// Combine over columns with `outer` = 2 (a sum) whose two halves are separate buffers:
    /// partial rows `x` → `y` and `x2` → `y2`, each from its start. A layer norm's dgamma
    /// and dbeta in one dispatch.
    pub split_outer: bool,
}

/// The problem a launch covers, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dims {
    /// `rows` rows of `len`, each cut into `splits` chunks of `chunk` slots, `threads`
    /// invocations (a power of two up to the workgroup) per chunk.
    Rows {
        rows: u32,
        len: u32,
        splits: u32,
        chunk: u32,
        threads: u32,
    },
    /// (outer, axis, inner) with the axis cut into `splits` chunks of `chunk` elements.
    /// `threads`: invocations per group of `vec` columns, a power of two up to the
    /// workgroup. 1 for `Direct` and `Partial`, whose invocations each walk a chunk alone;
    /// a `Combine` group walks the partial rows together and reduces across its lanes.
    Columns {
        outer: u32,
        axis: u32,
        inner: u32,
        splits: u32,
        chunk: u32,
        threads: u32,
    },
}

/// One dispatch of a reduction plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReduceStep {
    pub kernel: ReduceKernel,
    pub dims: Dims,
}

impl ReduceStep {
    /// Partials a `Partial` step writes (elements of its value and index buffers).
    pub fn partials(&self) -> u64 {
        match self.dims {
            Dims::Rows { rows, splits, .. } => u64::from(rows) * u64::from(splits),
            Dims::Columns {
                outer,
                inner,
                splits,
                ..
            } => u64::from(outer) * u64::from(splits) * u64::from(inner),
        }
    }
}

/// Device and tuning facts a plan depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReduceSetup {
    pub reducer: Reducer,
    pub workgroup: u32,
    pub binding: Binding,
    /// Slots per invocation per loop step (default 4).
    pub unroll: u8,
    /// Workgroups a split reduction aims for (enough to fill the GPU; default 2048).
    pub target_groups: u32,
}

/// Default slots per loop step: four 16-byte loads in flight per invocation.
pub const REDUCE_UNROLL: u8 = 4;
/// Default workgroup count a split reduction aims for.
pub const REDUCE_TARGET_GROUPS: u32 = 2048;
/// Default workgroup size.
pub const REDUCE_WORKGROUP: u32 = 256;

/// Fewest ways a column reduction's rows are split into partial sums (see `plan`).
const MIN_COLUMN_SPLITS: u64 = 8;

/// Largest element count the kernels index (SPIR-V access-chain indices are signed 32-bit).
pub const MAX_ELEMENTS: u64 = (1 << 31) - 1;

/// The family's selection function: the dispatches that reduce a contiguous tensor viewed as
/// (outer, axis, inner) over its axis. One `Direct` step when there is enough parallelism,
/// else `Partial` (chunks of the axis spread over `target_groups` workgroups) then `Combine`.
/// With a `prologue` (see [`ReduceKernel::prologue`]), its first step computes the tensor.
pub fn plan(
    op: Reduction,
    storage: Storage,
    outer: u64,
    axis: u64,
    inner: u64,
    setup: &ReduceSetup,
    prologue: Option<Arc<FusedKernel>>,
) -> Result<Vec<ReduceStep>, KernelError> {
    if let Some(p) = &prologue {
        if op == Reduction::ArgMax || u64::from(p.len) != outer * axis * inner {
            return Err(KernelError::Arguments {
                kernel: format!("reduce_{}", op.name()),
                detail: format!(
                    "a prologue of {} elements over ({outer}, {axis}, {inner})",
                    p.len
                ),
            });
        }
    }
    let total = outer.saturating_mul(axis).saturating_mul(inner);
    if total > MAX_ELEMENTS || axis == 0 || outer == 0 || inner == 0 {
        return Err(KernelError::TooLarge {
            what: "reduction of elements",
            size: total,
        });
    }
    let op = op.kernel_op();
    let w = setup.workgroup;
    let u = u64::from(setup.unroll.max(1));
    let kernel = |stage, layout| ReduceKernel {
        op,
        storage,
        stage,
        layout,
        unroll: setup.unroll.max(1),
        reducer: setup.reducer,
        workgroup: w,
        binding: setup.binding,
        prologue: (stage != Stage::Combine)
            .then(|| prologue.clone())
            .flatten(),
        store_prologue: false,
        split_outer: false,
    };
    let target = u64::from(setup.target_groups.max(1));
    if inner == 1 {
        let slots = row_slots(axis, 4);
        let threads = threads_for(slots, setup.unroll.max(1).into(), w);
        // Split long rows over more workgroups when the rows alone cannot fill the GPU; each
        // chunk keeps at least four loop steps per invocation.
        let mut splits = 1;
        if threads == w && outer < target {
            let max_splits = (slots / (u64::from(w) * u * 4)).max(1);
            splits = target.div_ceil(outer).min(max_splits);
        }
        let chunk = slots.div_ceil(splits);
        let splits = slots.div_ceil(chunk);
        let rows = Dims::Rows {
            rows: outer as u32,
            len: axis as u32,
            splits: splits as u32,
            chunk: chunk as u32,
            threads,
        };
        if splits == 1 {
            return Ok(vec![ReduceStep {
                kernel: kernel(Stage::Direct, Layout::Rows),
                dims: rows,
            }]);
        }
        let combine_threads = threads_for(splits, setup.unroll.max(1).into(), w);
        Ok(vec![
            ReduceStep {
                kernel: kernel(Stage::Partial, Layout::Rows),
                dims: rows,
            },
            ReduceStep {
                kernel: kernel(Stage::Combine, Layout::Rows),
                dims: Dims::Rows {
                    rows: outer as u32,
                    len: splits as u32,
                    splits: 1,
                    chunk: splits as u32,
                    threads: combine_threads,
                },
            },
        ])
    } else {
        let vec = if inner % 4 == 0 { 4u8 } else { 1 };
        let units = outer * inner / u64::from(vec);
        let want = target * u64::from(w);
        // Split the columns' rows over more invocations when the columns alone cannot fill
        // the GPU, each chunk keeping four loop steps; but only where the rows divide at
        // least MIN_COLUMN_SPLITS ways: fewer save less GPU time than the combine's own
        // dispatch and barrier cost (host12's bias gradients: 64 rows, 4 ways).
        let mut splits = 1;
        let max_splits = (axis / (u * 4)).max(1);
        if units < want && max_splits >= MIN_COLUMN_SPLITS {
            splits = want.div_ceil(units).min(max_splits);
        }
        let chunk = axis.div_ceil(splits);
        let splits = axis.div_ceil(chunk);
        let dims = Dims::Columns {
            outer: outer as u32,
            axis: axis as u32,
            inner: inner as u32,
            splits: splits as u32,
            chunk: chunk as u32,
            threads: 1,
        };
        let layout = Layout::Columns { vec };
        if splits == 1 {
            return Ok(vec![ReduceStep {
                kernel: kernel(Stage::Direct, layout),
                dims,
            }]);
        }
        Ok(vec![
            ReduceStep {
                kernel: kernel(Stage::Partial, layout),
                dims,
            },
            ReduceStep {
                kernel: kernel(Stage::Combine, layout),
                dims: Dims::Columns {
                    outer: outer as u32,
                    axis: splits as u32,
                    inner: inner as u32,
                    splits: 1,
                    chunk: splits as u32,
                    threads: combine_threads(splits, setup.unroll, w),
                },
            },
        ])
    }
}

/// Invocations that combine one group of columns' `partials` rows together (as a row combine
/// reads a row's partials): one invocation walking hundreds of partial rows alone waits on
/// each load in turn (27.6 µs a call for GPT-2's bias and norm-weight gradients on an H100).
pub fn combine_threads(partials: u64, unroll: u8, workgroup: u32) -> u32 {
    threads_for(partials, unroll.max(1).into(), workgroup)
}

/// Where a column kernel's unit (one of outer × splits × inner/vec) reads.
struct ColumnUnit {
    /// Whether the unit exists (the grid rounds up).
    valid: Val,
    /// Its chunk of the axis.
    s: Val,
    /// Its outer index.
    o: Val,
    /// Its first column.
    col: Val,
    /// The element of (o, axis 0, col).
    base: Val,
    /// log2(vec): element index → slot.
    vshift: Val,
}

/// `unit`'s place among (outer, splits, inner/vec) units, outer slowest.
fn column_unit(k: &mut KernelBuilder, unit: Val, vec: u8, dims: [Val; 4]) -> ColumnUnit {
    let [outer, axis, inner, splits] = dims;
    let vshift = k.u32(u32::from(vec).trailing_zeros());
    let ncols = k.shr(inner, vshift);
    let os = k.mul(outer, splits);
    let total = k.mul(os, ncols);
    let valid = k.lt(unit, total);
    let ic = k.rem(unit, ncols);
    let rest = k.div(unit, ncols);
    let s = k.rem(rest, splits);
    let o = k.div(rest, splits);
    let oa = k.mul(o, axis);
    let oai = k.mul(oa, inner);
    let col = k.shl(ic, vshift);
    let base = k.add(oai, col);
    ColumnUnit {
        valid,
        s,
        o,
        col,
        base,
        vshift,
    }
}

/// Buffers of a reduction kernel, in declaration order.
struct Bufs {
    /// The tensor, or the partials (Combine); unused with a prologue.
    x: Buffer,
    /// The prologue's inputs (declared in place of `x`) and parameters.
    pro: Vec<Buffer>,
    pro_params: Vec<Val>,
    xi: Option<Buffer>,
    /// `split_outer`'s second input and output.
    x2: Option<Buffer>,
    y: Option<Buffer>,
    y2: Option<Buffer>,
    yi: Option<Buffer>,
    /// `store_prologue`: one buffer per prologue output, with its storage.
    pro_out: Vec<(Buffer, Storage)>,
}

/// Per-invocation accumulator.
struct Acc {
    /// Sum: f32 lanes; keyed ops: u32 key lanes (argmax in Rows: one scalar).
    value: helios_spirv::Var,
    /// ArgMax: index of the best key.
    index: Option<helios_spirv::Var>,
}

/// The prologue's root value at element `at` (`lanes` 1) or vec4 `at` (`lanes` 4), for the
/// reduction to fold; with `store_prologue`, every output of the prologue is stored there
/// first. Both layouts evaluate each element exactly once (a row's edge elements one by
/// one, inside the row only), so each stored element is written once.
fn prologue_value(k: &mut KernelBuilder, pro: &FusedKernel, b: &Bufs, at: Val, lanes: u8) -> Val {
    let n = pro.outputs.len();
    // The stored outputs (all of them, `pro_out` being one per output), or the root alone.
    let first = if b.pro_out.is_empty() { n - 1 } else { 0 };
    let vals = pro.outputs_at(k, &b.pro, &b.pro_params, at, lanes, first..n);
    for (&v, &(buf, s)) in vals.iter().zip(&b.pro_out) {
        store_f32(k, buf, at, v, s);
    }
    vals[vals.len() - 1]
}

impl ReduceKernel {
    /// A name that identifies the kernel in profiles and dumps.
    pub fn name(&self) -> String {
        let stage = match self.stage {
            Stage::Direct => "direct",
            Stage::Partial => "partial",
            Stage::Combine => "combine",
        };
        let layout = match self.layout {
            Layout::Rows => "rows".to_owned(),
            Layout::Columns { vec } => format!("cols{vec}"),
        };
        let of = self
            .prologue
            .as_ref()
            .map_or(String::new(), |p| format!("_of_{}", p.name()));
        let split = if self.split_outer { "_2out" } else { "" };
        let stored = if self.store_prologue { "_stored" } else { "" };
        format!(
            "reduce_{}{of}{stored}_{stage}_{layout}{split}_{}_{}_u{}_wg{}",
            self.op.name(),
            self.storage.name(),
            self.reducer.tag(),
            self.unroll,
            self.workgroup
        )
    }

    fn group_op(&self) -> ReduceOp {
        match self.op {
            Reduction::Min => ReduceOp::Min,
            Reduction::Sum | Reduction::Mean => ReduceOp::Add,
            Reduction::Max | Reduction::ArgMax => ReduceOp::Max,
        }
    }

    fn declare(&self, k: &mut KernelBuilder) -> Bufs {
        let keyed = self.op.keyed();
        let partial_scalar = if keyed { Scalar::U32 } else { Scalar::F32 };
        let x_elem = match self.stage {
            Stage::Combine => partial_scalar,
            _ => buffer_scalar(self.storage),
        };
        let (x, pro) = match &self.prologue {
            Some(p) => {
                let pro = p.declare_inputs(k);
                (pro[0], pro)
            }
            None => (k.buffer("x", x_elem, Access::Read), Vec::new()),
        };
        let argmax = self.op == Reduction::ArgMax;
        let xi = (argmax && self.stage == Stage::Combine)
            .then(|| k.buffer("x_index", Scalar::U32, Access::Read));
        let x2 = self
            .split_outer
            .then(|| k.buffer("x2", partial_scalar, Access::Read));
        let y = match (self.stage, argmax) {
            (Stage::Partial, _) => Some(k.buffer("y", partial_scalar, Access::Write)),
            (_, false) => Some(k.buffer("y", buffer_scalar(self.storage), Access::Write)),
            (_, true) => None,
        };
        let y2 = self
            .split_outer
            .then(|| k.buffer("y2", buffer_scalar(self.storage), Access::Write));
        let yi = argmax.then(|| k.buffer("y_index", Scalar::U32, Access::Write));
        let pro_out = match (&self.prologue, self.store_prologue) {
            (Some(p), true) => p
                .outputs
                .iter()
                .enumerate()
                .map(|(i, &(_, s))| {
                    let name = format!("stored{i}");
                    (k.buffer(&name, buffer_scalar(s), Access::Write), s)
                })
                .collect(),
            _ => Vec::new(),
        };
        Bufs {
            x,
            pro,
            pro_params: Vec::new(),
            xi,
            x2,
            y,
            y2,
            yi,
            pro_out,
        }
    }

    /// Emits the kernel.
    pub fn build(&self) -> KernelModule {
        let mut k = KernelBuilder::new(self.name(), self.binding, [self.workgroup, 1, 1]);
        let bufs = self.declare(&mut k);
        let u32_ty = Ty::scalar(Scalar::U32);
        let names: &[&str] = match self.layout {
            Layout::Rows => &["rows", "len", "splits", "chunk", "group_shift"],
            Layout::Columns { .. } => &["outer", "axis", "inner", "splits", "chunk", "group_shift"],
        };
        let params: Vec<_> = names.iter().map(|n| k.param(n, u32_ty)).collect();
        let scale = k.param("scale", Ty::scalar(Scalar::F32));
        let pro_params = self
            .prologue
            .as_ref()
            .map_or(Vec::new(), |p| p.declare_params(&mut k));
        k.begin();
        let p: Vec<Val> = params.iter().map(|&q| k.load_param(q)).collect();
        let scale = k.load_param(scale);
        let mut bufs = bufs;
        bufs.pro_params = pro_params.into_iter().map(|q| k.load_param(q)).collect();
        match self.layout {
            Layout::Rows => self.build_rows(&mut k, &bufs, &p, scale),
            Layout::Columns { vec } if self.stage == Stage::Combine => {
                self.build_columns_combine(&mut k, &bufs, vec, &p, scale)
            }
            Layout::Columns { vec } => self.build_columns(&mut k, &bufs, vec, &p, scale),
        }
        k.finish()
    }

    /// Fresh accumulators holding the identity, `lanes` wide.
    fn acc(&self, k: &mut KernelBuilder, lanes: u8) -> Acc {
        let (ty, init) = match self.op {
            Reduction::Sum | Reduction::Mean => (Ty::vector(Scalar::F32, lanes), 0u64),
            Reduction::Min => (Ty::vector(Scalar::U32, lanes), u64::from(u32::MAX)),
            Reduction::Max | Reduction::ArgMax => (Ty::vector(Scalar::U32, lanes), 0),
        };
        let init = k.constant_bits(ty, init);
        let value = k.var_init(init);
        let index = (self.op == Reduction::ArgMax).then(|| {
            let none = k.constant_bits(Ty::vector(Scalar::U32, lanes), u64::from(u32::MAX));
            k.var_init(none)
        });
        Acc { value, index }
    }

    /// The fill of lanes outside a row (the op's identity as a float).
    fn fill(&self) -> f32 {
        match self.op {
            Reduction::Sum | Reduction::Mean => 0.0,
            Reduction::Min => f32::INFINITY,
            Reduction::Max | Reduction::ArgMax => f32::NEG_INFINITY,
        }
    }

    /// Folds values (f32 lanes, or u32 keys when `is_key`) at indices `idx` into `acc`,
    /// lane-wise (`acc` as wide as the values).
    fn fold_lanes(&self, k: &mut KernelBuilder, acc: &Acc, v: Val, is_key: bool, idx: Option<Val>) {
        let cur = k.get(acc.value);
        match self.op {
            Reduction::Sum | Reduction::Mean => {
                let n = k.add(cur, v);
                k.set(acc.value, n);
            }
            Reduction::Max | Reduction::Min => {
                let key = if is_key {
                    v
                } else {
                    order_key(k, v, self.op == Reduction::Max)
                };
                let n = if self.op == Reduction::Max {
                    k.max(cur, key)
                } else {
                    k.min(cur, key)
                };
                k.set(acc.value, n);
            }
            Reduction::ArgMax => {
                let key = if is_key { v } else { order_key(k, v, true) };
                let var = acc.index.expect("argmax keeps an index");
                let best = k.get(var);
                let gt = k.gt(key, cur);
                let nv = k.select(gt, key, cur);
                let ni = k.select(gt, idx.expect("argmax index"), best);
                k.set(acc.value, nv);
                k.set(var, ni);
            }
        }
    }

    fn build_rows(&self, k: &mut KernelBuilder, b: &Bufs, p: &[Val], scale: Val) {
        let (rows, len, splits, chunk) = (p[0], p[1], p[2], p[3]);
        let mut groups = Groups::runtime(k, self.reducer, p[4]);
        let threads = groups.size();
        let g = linear_workgroup(k);
        let per = groups.per_workgroup(k);
        let gi = groups.group(k);
        let lane = groups.lane(k);
        let base = k.mul(g, per);
        let unit = k.add(base, gi);
        let total = k.mul(rows, splits);
        let valid = k.lt(unit, total);
        let row = k.div(unit, splits);
        let split = k.rem(unit, splits);
        let start = k.mul(row, len);
        let end = k.add(start, len);
        let combine = self.stage == Stage::Combine;
        let vec = if combine { 1 } else { 4 };
        let r = Row {
            start,
            end,
            vec,
            whole: false,
        };
        let first = r.first_slot(k);
        let end_slot = r.end_slot(k);
        let off = k.mul(split, chunk);
        let c0 = k.add(first, off);
        let c1 = k.add(c0, chunk);
        let c1 = k.min(c1, end_slot);
        let zero = k.u32(0);
        let c0 = k.select(valid, c0, zero);
        let c1 = k.select(valid, c1, zero);

        // Argmax folds lane by lane in index order, into scalars; the others fold whole slots.
        let argmax = self.op == Reduction::ArgMax;
        let acc = self.acc(k, if argmax { 1 } else { vec });
        let unroll = u32::from(self.unroll);
        for_each_slot_by(k, c0, c1, lane, threads, unroll, |k, slots| {
            let loaded: Vec<(Val, Option<Val>)> = slots
                .iter()
                .map(|&s| {
                    if combine {
                        let v = k.load(b.x, s, 1);
                        let i = b.xi.map(|xi| k.load(xi, s, 1));
                        (v, i)
                    } else if let Some(pro) = &self.prologue {
                        let value = |k: &mut KernelBuilder, at: Val, lanes: u8| {
                            prologue_value(k, pro, b, at, lanes)
                        };
                        (r.load_with(k, s, self.fill(), value), None)
                    } else {
                        (r.load(k, b.x, self.storage, s, self.fill()), None)
                    }
                })
                .collect();
            for (&s, (v, i)) in slots.iter().zip(loaded) {
                if !argmax {
                    self.fold_lanes(k, &acc, v, combine, None);
                } else if combine {
                    self.fold_lanes(k, &acc, v, true, i);
                } else {
                    let cols = r.cols(k, s);
                    let ok = r.valid(k, cols);
                    let keys = order_key(k, v, true);
                    let none = k.constant_bits(keys.ty, 0);
                    let keys = k.select(ok, keys, none);
                    for lane in 0..vec as u32 {
                        let kl = k.extract(keys, lane);
                        let il = k.extract(cols, lane);
                        self.fold_lanes(k, &acc, kl, true, Some(il));
                    }
                }
            }
        });

        // One value per group, then lane 0 of each valid group stores.
        let gop = self.group_op();
        let own = k.get(acc.value);
        let own = match self.op {
            Reduction::Sum | Reduction::Mean => hsum(k, own),
            _ => hreduce(k, gop, own),
        };
        let result = groups.reduce(k, gop, own);
        let index = acc.index.map(|var| {
            let mine = k.get(var);
            let is_best = k.eq(own, result);
            let none = k.u32(u32::MAX);
            let cand = k.select(is_best, mine, none);
            groups.reduce(k, ReduceOp::Min, cand)
        });
        let first_lane = k.eq(lane, zero);
        let store = k.and(valid, first_lane);
        let out_at = if self.stage == Stage::Partial {
            unit
        } else {
            row
        };
        self.store_result(k, (b.y, b.yi), store, out_at, result, index, scale);
    }

    /// Lane 0's store of a group's (or invocation's) result at element `at` of the outputs
    /// `(y, y_index)`.
    #[allow(clippy::too_many_arguments)]
    fn store_result(
        &self,
        k: &mut KernelBuilder,
        (y, yi): (Option<Buffer>, Option<Buffer>),
        cond: Val,
        at: Val,
        result: Val,
        index: Option<Val>,
        scale: Val,
    ) {
        k.if_(cond, |k| {
            if let (Some(yi), Some(i)) = (yi, index) {
                k.store(yi, at, i);
            }
            let Some(y) = y else { return };
            match (self.stage, self.op) {
                (Stage::Partial, _) => k.store(y, at, result),
                (_, Reduction::Sum | Reduction::Mean) => {
                    let s = k.splat(scale, result.ty.lanes);
                    let v = k.mul(result, s);
                    store_f32(k, y, at, v, self.storage);
                }
                (_, _) => {
                    let v = key_value(k, result);
                    store_f32(k, y, at, v, self.storage);
                }
            }
        });
    }

    /// Direct and Partial over columns: each invocation walks its chunk of the axis alone.
    fn build_columns(&self, k: &mut KernelBuilder, b: &Bufs, vec: u8, p: &[Val], scale: Val) {
        let (outer, axis, inner, splits, chunk) = (p[0], p[1], p[2], p[3], p[4]);
        let g = linear_workgroup(k);
        let w = k.workgroup_size_x();
        let lid = k.local_index();
        let gbase = k.mul(g, w);
        let unit = k.add(gbase, lid);
        let ColumnUnit {
            valid,
            s,
            o,
            col,
            base,
            vshift,
        } = column_unit(k, unit, vec, [outer, axis, inner, splits]);
        let a0 = k.mul(s, chunk);
        let a1 = k.add(a0, chunk);
        let a1 = k.min(a1, axis);
        let zero = k.u32(0);
        let a0 = k.select(valid, a0, zero);
        let a1 = k.select(valid, a1, zero);

        let acc = self.acc(k, vec);
        let unroll = u32::from(self.unroll);
        let one = k.u32(1);
        for_each_slot_by(k, a0, a1, zero, one, unroll, |k, idx| {
            let loaded: Vec<Val> = idx
                .iter()
                .map(|&a| {
                    let off = k.mul(a, inner);
                    let e = k.add(base, off);
                    let slot = k.shr(e, vshift);
                    match &self.prologue {
                        // Element `e` alone, or the vec4 `slot` starting there.
                        Some(pro) => {
                            let at = if vec == 1 { e } else { slot };
                            prologue_value(k, pro, b, at, vec)
                        }
                        None => crate::storage::load_f32(k, b.x, slot, vec, self.storage),
                    }
                })
                .collect();
            for (&a, v) in idx.iter().zip(loaded) {
                let i = (self.op == Reduction::ArgMax).then(|| k.splat(a, vec));
                self.fold_lanes(k, &acc, v, false, i);
            }
        });

        let result = k.get(acc.value);
        let index = acc.index.map(|v| k.get(v));
        // Partial layout (outer, splits, inner); result layout (outer, inner).
        let out_row = if self.stage == Stage::Partial {
            k.mul(o, splits)
        } else {
            o
        };
        let out_row = if self.stage == Stage::Partial {
            k.add(out_row, s)
        } else {
            out_row
        };
        let orow = k.mul(out_row, inner);
        let oe = k.add(orow, col);
        let at = k.shr(oe, vshift);
        self.store_result(k, (b.y, b.yi), valid, at, result, index, scale);
    }

    /// Combine over columns: a group of invocations per `vec` columns walks the partial rows
    /// (lane i takes rows i, i + group, ...), then reduces across the group.
    fn build_columns_combine(
        &self,
        k: &mut KernelBuilder,
        b: &Bufs,
        vec: u8,
        p: &[Val],
        scale: Val,
    ) {
        let (outer, axis, inner) = (p[0], p[1], p[2]);
        let mut groups = Groups::runtime(k, self.reducer, p[5]);
        let threads = groups.size();
        let g = linear_workgroup(k);
        let per = groups.per_workgroup(k);
        let gi = groups.group(k);
        let lane = groups.lane(k);
        let gbase = k.mul(g, per);
        let unit = k.add(gbase, gi);
        let one = k.u32(1);
        let ColumnUnit {
            valid,
            o,
            col,
            base,
            vshift,
            ..
        } = column_unit(k, unit, vec, [outer, axis, inner, one]);
        let zero = k.u32(0);
        let end = k.select(valid, axis, zero);

        let acc = self.acc(k, vec);
        let unroll = u32::from(self.unroll);
        let walk = |k: &mut KernelBuilder, x: Buffer, base: Val| {
            for_each_slot_by(k, zero, end, lane, threads, unroll, |k, idx| {
                let loaded: Vec<(Val, Option<Val>)> = idx
                    .iter()
                    .map(|&a| {
                        let off = k.mul(a, inner);
                        let e = k.add(base, off);
                        let slot = k.shr(e, vshift);
                        let v = k.load(x, slot, vec);
                        let i = b.xi.map(|xi| k.load(xi, slot, vec));
                        (v, i)
                    })
                    .collect();
                for (v, i) in loaded {
                    self.fold_lanes(k, &acc, v, true, i);
                }
            });
        };
        match b.x2 {
            // Row o of the partials from the start of input o (its columns only).
            Some(x2) => {
                let first = k.eq(o, zero);
                k.if_(first, |k| walk(k, b.x, col));
                let second = k.not(first);
                k.if_(second, |k| walk(k, x2, col));
            }
            None => walk(k, b.x, base),
        }

        // Column-wise across the group (lanes of `vec` stay apart), then lane 0 stores.
        let gop = self.group_op();
        let own = k.get(acc.value);
        let result = groups.reduce(k, gop, own);
        let index = acc.index.map(|var| {
            let mine = k.get(var);
            let is_best = k.eq(own, result);
            let none = k.constant_bits(mine.ty, u64::from(u32::MAX));
            let cand = k.select(is_best, mine, none);
            groups.reduce(k, ReduceOp::Min, cand)
        });
        let first_lane = k.eq(lane, zero);
        let store = k.and(valid, first_lane);
        match b.y2 {
            // Row o of the result from the start of output o.
            Some(y2) => {
                let at = k.shr(col, vshift);
                let first = k.eq(o, zero);
                let to_y = k.and(store, first);
                self.store_result(k, (b.y, b.yi), to_y, at, result, index, scale);
                let second = k.not(first);
                let to_y2 = k.and(store, second);
                self.store_result(k, (Some(y2), None), to_y2, at, result, index, scale);
            }
            None => {
                let orow = k.mul(o, inner);
                let oe = k.add(orow, col);
                let at = k.shr(oe, vshift);
                self.store_result(k, (b.y, b.yi), store, at, result, index, scale);
            }
        }
    }

    /// Grid and push constants. `buffers` are the device addresses in declaration order:
    /// x (or the prologue's inputs), [x_index], [y], [y_index] (see `buffer_count`), and
    /// `(scalars, offsets)` the prologue's (see `FusedKernel::launch`; empty without one).
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        dims: Dims,
        buffers: &[u64],
        scale: f32,
        (scalars, offsets): (&[f32], &[u32]),
    ) -> Result<Launch, KernelError> {
        match &self.prologue {
            Some(p) => p.check_scalars(scalars)?,
            None if !scalars.is_empty() => {
                return Err(KernelError::Arguments {
                    kernel: self.name(),
                    detail: format!("expects no scalars, got {}", scalars.len()),
                });
            }
            None => {}
        }
        if buffers.len() != self.buffer_count() {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: format!(
                    "expects {} buffers, got {}",
                    self.buffer_count(),
                    buffers.len()
                ),
            });
        }
        let mut args = Args::new();
        if self.binding == Binding::DeviceAddress {
            args.extend(buffers.iter().map(|&a| Arg::Address(a)));
        }
        let w = u64::from(geometry.workgroup);
        let groups = match (dims, self.layout) {
            (
                Dims::Rows {
                    rows,
                    len,
                    splits,
                    chunk,
                    threads,
                },
                Layout::Rows,
            ) => {
                if !threads.is_power_of_two() || u64::from(threads) > w {
                    return Err(KernelError::Arguments {
                        kernel: self.name(),
                        detail: format!("{threads} invocations per row in a workgroup of {w}"),
                    });
                }
                let shift = threads.trailing_zeros();
                args.extend([rows, len, splits, chunk, shift].map(Arg::U32));
                let per = (w / u64::from(threads)).max(1);
                (u64::from(rows) * u64::from(splits)).div_ceil(per)
            }
            (
                Dims::Columns {
                    outer,
                    axis,
                    inner,
                    splits,
                    chunk,
                    threads,
                },
                Layout::Columns { vec },
            ) => {
                let grouped = self.stage == Stage::Combine;
                if self.split_outer && !(grouped && outer == 2 && self.op == Reduction::Sum) {
                    return Err(KernelError::Arguments {
                        kernel: self.name(),
                        detail: format!("two outputs take a sum's combine of 2 rows, not {outer}"),
                    });
                }
                if !threads.is_power_of_two()
                    || u64::from(threads) > w
                    || (!grouped && threads != 1)
                    || (grouped && splits != 1)
                {
                    return Err(KernelError::Arguments {
                        kernel: self.name(),
                        detail: format!(
                            "{threads} invocations per column group and {splits} splits"
                        ),
                    });
                }
                let shift = threads.trailing_zeros();
                args.extend([outer, axis, inner, splits, chunk, shift].map(Arg::U32));
                let units =
                    u64::from(outer) * u64::from(splits) * u64::from(inner) / u64::from(vec);
                (units * u64::from(threads)).div_ceil(w)
            }
            _ => {
                return Err(KernelError::Arguments {
                    kernel: self.name(),
                    detail: format!("dimensions {dims:?} do not fit the layout"),
                })
            }
        };
        args.push(Arg::F32(scale));
        args.extend(scalars.iter().map(|&s| Arg::F32(s)));
        if let Some(p) = &self.prologue {
            p.offset_args(offsets, &mut args)?;
        }
        let groups = grid(groups, geometry.max_groups_x)?;
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }

    /// Buffers the kernel takes: x (or the prologue's inputs), [x_index], [y], [y_index],
    /// [the prologue's stored outputs].
    pub fn buffer_count(&self) -> usize {
        let argmax = self.op == Reduction::ArgMax;
        let xi = argmax && self.stage == Stage::Combine;
        let y = self.stage == Stage::Partial || !argmax;
        let x = self.prologue.as_ref().map_or(1, |p| p.inputs.len());
        let stored = match (&self.prologue, self.store_prologue) {
            (Some(p), true) => p.outputs.len(),
            _ => 0,
        };
        x + usize::from(xi)
            + usize::from(y)
            + 2 * usize::from(self.split_outer)
            + usize::from(argmax)
            + stored
    }

    /// A representative set of kernels (every op, stage and layout) for validation.
    pub fn samples(binding: Binding) -> Vec<ReduceKernel> {
        let mut out = Vec::new();
        let reducers = [
            Reducer::Subgroup {
                block: 8,
                whole: true,
            },
            Reducer::Subgroup {
                block: 32,
                whole: false,
            },
            Reducer::SharedTree,
        ];
        for op in [
            Reduction::Sum,
            Reduction::Max,
            Reduction::Min,
            Reduction::ArgMax,
        ] {
            for stage in [Stage::Direct, Stage::Partial, Stage::Combine] {
                for (i, layout) in [
                    Layout::Rows,
                    Layout::Rows,
                    Layout::Columns { vec: 4 },
                    Layout::Columns { vec: 1 },
                ]
                .into_iter()
                .enumerate()
                {
                    out.push(ReduceKernel {
                        op,
                        storage: Storage::ALL[i % 3],
                        stage,
                        layout,
                        unroll: 4,
                        reducer: reducers[i % 3],
                        workgroup: 256,
                        binding,
                        prologue: None,
                        store_prologue: false,
                        split_outer: false,
                    });
                }
            }
        }
        // Two outputs: dgamma and dbeta, each from its own buffer of partials.
        for (i, vec) in [4u8, 1].into_iter().enumerate() {
            out.push(ReduceKernel {
                op: Reduction::Sum,
                storage: Storage::ALL[i + 1],
                stage: Stage::Combine,
                layout: Layout::Columns { vec },
                unroll: 4,
                reducer: reducers[i],
                workgroup: 256,
                binding,
                prologue: None,
                store_prologue: false,
                split_outer: true,
            });
        }
        // Prologues: a vectorizable one (a dense f32 times a broadcast bf16 row) and one that
        // is not (a 3-wide row, f16), in each layout and stage that reads the tensor, each also
        // storing its outputs.
        let pro = |n: u32, inner: u32, dtype: Storage| {
            let input = |strides: [u32; 2], dtype| crate::fused::FusedInput {
                dtype,
                shape: crate::fused::Dims::from_slice(&[n / inner, inner]),
                strides: crate::fused::Dims::from_slice(&strides),
                aligned: true,
                window: None,
            };
            Arc::new(FusedKernel {
                binding,
                len: n,
                inputs: vec![input([inner, 1], Storage::F32), input([0, 1], dtype)],
                code: vec![
                    crate::fused::Instr::Input(0),
                    crate::fused::Instr::Input(1),
                    crate::fused::Instr::Binary(crate::elementwise::BinaryOp::Mul, 0, 1),
                    crate::fused::Instr::Scalar(0),
                    crate::fused::Instr::Binary(crate::elementwise::BinaryOp::Add, 2, 3),
                ],
                outputs: vec![(4, dtype)],
                scalars: 1,
                vecs: 1,
            })
        };
        for (i, p) in [pro(4096, 64, Storage::BF16), pro(4095, 3, Storage::F16)]
            .into_iter()
            .enumerate()
        {
            for stage in [Stage::Direct, Stage::Partial] {
                for layout in [
                    Layout::Rows,
                    Layout::Columns {
                        vec: 4 - 3 * i as u8,
                    },
                ] {
                    for store_prologue in [false, true] {
                        // Stored, the product (a member) is an output besides the root.
                        let mut p = (*p).clone();
                        if store_prologue {
                            p.outputs.insert(0, (2, Storage::F32));
                        }
                        out.push(ReduceKernel {
                            op: Reduction::ALL[i * 2],
                            storage: p.outputs[p.outputs.len() - 1].1,
                            stage,
                            layout,
                            unroll: 4,
                            reducer: reducers[i],
                            workgroup: 256,
                            binding,
                            prologue: Some(Arc::new(p)),
                            store_prologue,
                            split_outer: false,
                        });
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> ReduceSetup {
        ReduceSetup {
            reducer: Reducer::SharedTree,
            workgroup: 256,
            binding: Binding::DeviceAddress,
            unroll: 4,
            target_groups: 2048,
        }
    }

    #[test]
    fn plans() {
        let s = setup();
        // The full sum of 4096×50257: split over the target, then one combining workgroup.
        let p = plan(Reduction::Sum, Storage::F32, 1, 4096 * 50257, 1, &s, None).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].kernel.stage, Stage::Partial);
        assert!(matches!(p[0].dims, Dims::Rows { splits: 2048, .. }));
        // Many rows: one pass, small groups for short rows.
        let p = plan(Reduction::Max, Storage::F32, 4096, 768, 1, &s, None).unwrap();
        assert_eq!(p.len(), 1);
        assert!(matches!(p[0].dims, Dims::Rows { threads: 64, .. }));
        // A long middle axis over few columns splits.
        let p = plan(Reduction::ArgMax, Storage::F16, 2, 100_000, 3, &s, None).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].kernel.layout, Layout::Columns { vec: 1 });
        // A bias gradient over 64 rows is one pass (four ways would not pay for a combine);
        // over 128 rows it splits eight ways.
        let p = plan(Reduction::Sum, Storage::F32, 1, 64, 512, &s, None).unwrap();
        assert_eq!(p.len(), 1);
        assert!(matches!(p[0].dims, Dims::Columns { splits: 1, .. }));
        let p = plan(Reduction::Sum, Storage::F32, 1, 128, 512, &s, None).unwrap();
        assert!(matches!(p[0].dims, Dims::Columns { splits: 8, .. }));
        assert!(plan(Reduction::Sum, Storage::F32, 1, 0, 1, &s, None).is_err());
        assert!(plan(Reduction::Sum, Storage::F32, 1 << 16, 1 << 16, 1, &s, None).is_err());
    }

    #[test]
    fn buffer_counts() {
        for k in ReduceKernel::samples(Binding::DeviceAddress) {
            let m = k.build();
            let buffers = m.params.iter().filter(|p| p.access.is_some()).count();
            assert_eq!(buffers, k.buffer_count(), "{}", k.name());
        }
    }
}
