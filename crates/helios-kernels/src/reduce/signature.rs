//! The signature of a reduction kernel (what it computes, where it reads and writes, how
//! invocations map onto the tensor), the problem a launch covers, a plan's steps and the
//! facts a plan depends on; with the kernel's name and buffer count.

use helios_spirv::Binding;

use crate::fused::FusedKernel;
use crate::rows::Reducer;
use crate::storage::Storage;
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
    pub(super) const fn keyed(self) -> bool {
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

/// Largest element count the kernels index (SPIR-V access-chain indices are signed 32-bit).
pub const MAX_ELEMENTS: u64 = (1 << 31) - 1;

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

    /// Buffers the kernel takes: x (or the prologue's inputs), \[x_index], \[y], \[y_index],
    /// \[the prologue's stored outputs].
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
}
