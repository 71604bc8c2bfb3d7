//! `Layout::Rows`: a group of invocations per row (or per chunk of a row, `Partial`), 16-byte
//! slot loads, one group reduction at the end.

use helios_spirv::{KernelBuilder, ReduceOp, Val};

use super::emit::{prologue_value, Bufs, Reduced};
use super::signature::{ReduceKernel, Reduction, Stage};
use crate::rows::{for_each_slot_by, hreduce, hsum, linear_workgroup, order_key, Groups, Row};

impl ReduceKernel {
    pub(super) fn build_rows(&self, k: &mut KernelBuilder, b: &Bufs, p: &[Val], scale: Val) {
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
        let r = Reduced {
            value: result,
            index,
        };
        self.store_result(k, (b.y, b.yi), store, out_at, r, scale);
    }
}
