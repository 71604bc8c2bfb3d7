//! `Layout::Columns`: each invocation owns `vec` adjacent columns and walks its chunk of the
//! axis alone (`Direct`, `Partial`); a `Combine` group walks the partial rows of its columns
//! together and reduces across its lanes.

use helios_spirv::{Buffer, KernelBuilder, ReduceOp, Val};

use super::emit::{prologue_value, Bufs, Reduced};
use super::signature::{ReduceKernel, Reduction, Stage};
use crate::rows::{for_each_slot_by, linear_workgroup, Groups};

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

impl ReduceKernel {
    /// Direct and Partial over columns: each invocation walks its chunk of the axis alone.
    pub(super) fn build_columns(
        &self,
        k: &mut KernelBuilder,
        b: &Bufs,
        vec: u8,
        p: &[Val],
        scale: Val,
    ) {
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

        let r = Reduced {
            value: k.get(acc.value),
            index: acc.index.map(|v| k.get(v)),
        };
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
        self.store_result(k, (b.y, b.yi), valid, at, r, scale);
    }

    /// Combine over columns: a group of invocations per `vec` columns walks the partial rows
    /// (lane i takes rows i, i + group, ...), then reduces across the group.
    pub(super) fn build_columns_combine(
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
        let r = Reduced {
            value: result,
            index,
        };
        let first_lane = k.eq(lane, zero);
        let store = k.and(valid, first_lane);
        match b.y2 {
            // Row o of the result from the start of output o.
            Some(y2) => {
                let at = k.shr(col, vshift);
                let first = k.eq(o, zero);
                let to_y = k.and(store, first);
                self.store_result(k, (b.y, b.yi), to_y, at, r, scale);
                let second = k.not(first);
                let to_y2 = k.and(store, second);
                self.store_result(k, (Some(y2), None), to_y2, at, r, scale);
            }
            None => {
                let orow = k.mul(o, inner);
                let oe = k.add(orow, col);
                let at = k.shr(oe, vshift);
                self.store_result(k, (b.y, b.yi), store, at, r, scale);
            }
        }
    }
}
