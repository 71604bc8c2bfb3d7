//! The family's selection function: the steps (one `Direct`, or `Partial` then `Combine`)
//! that reduce a tensor, with their layouts and dimensions.

use super::signature::{
    Dims, Layout, ReduceKernel, ReduceSetup, ReduceStep, Reduction, Stage, MAX_ELEMENTS,
};
use crate::fused::FusedKernel;
use crate::rows::{row_slots, threads_for};
use crate::storage::Storage;
use crate::KernelError;
use std::sync::Arc;

/// Fewest ways a column reduction's rows are split into partial sums (see `plan`).
const MIN_COLUMN_SPLITS: u64 = 8;

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
/// each load in turn (slow for GPT-2's bias and norm-weight gradients; the figure is in
/// bench/results/source-comment-history.md).
pub fn combine_threads(partials: u64, unroll: u8, workgroup: u32) -> u32 {
    threads_for(partials, unroll.max(1).into(), workgroup)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::Reducer;
    use helios_spirv::Binding;

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
}
