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
//!
//! Files (each imports only files below it; the generators do not import each other): this
//! one dispatches `build` (layout and stage → generator), launches and lists the validation
//! samples; the generators `by_rows` (a group per row) and `by_columns` (an invocation per
//! `vec` columns, or a group in `Combine`) build on `emit` (the buffers, the
//! accumulator and its folds, the result's store, a prologue's values); `plan` is the
//! selection function (`plan`, `combine_threads`); `signature` holds the public signature
//! (`ReduceKernel`, `Reduction`, `Stage`, `Layout`, `Dims`, ...), its name and buffer count.

mod by_columns;
mod by_rows;
mod emit;
mod plan;
mod signature;

pub use plan::{combine_threads, plan};
pub use signature::{
    Dims, Layout, ReduceKernel, ReduceSetup, ReduceStep, Reduction, Stage, MAX_ELEMENTS,
    REDUCE_TARGET_GROUPS, REDUCE_UNROLL, REDUCE_WORKGROUP,
};

use helios_spirv::{Binding, KernelBuilder, KernelModule, Scalar, Ty, Val};

use crate::fused::FusedKernel;
use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::rows::Reducer;
use crate::storage::Storage;
use crate::KernelError;
use std::sync::Arc;

impl ReduceKernel {
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

    /// Grid and push constants. `buffers` are the device addresses in declaration order:
    /// x (or the prologue's inputs), \[x_index], \[y], \[y_index] (see `buffer_count`), and
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

    #[test]
    fn buffer_counts() {
        for k in ReduceKernel::samples(Binding::DeviceAddress) {
            let m = k.build();
            let buffers = m.params.iter().filter(|p| p.access.is_some()).count();
            assert_eq!(buffers, k.buffer_count(), "{}", k.name());
        }
    }
}
