//! What the generators share: the buffers a kernel declares, the per-invocation accumulator
//! and how values fold into it, the store of a result, and a prologue's values.

use helios_spirv::{Access, Buffer, KernelBuilder, ReduceOp, Scalar, Ty, Val};

use super::signature::{ReduceKernel, Reduction, Stage};
use crate::fused::FusedKernel;
use crate::rows::{key_value, order_key};
use crate::storage::{buffer_scalar, store_f32, Storage};

/// Buffers of a reduction kernel, in declaration order.
pub(super) struct Bufs {
    /// The tensor, or the partials (Combine); unused with a prologue.
    pub(super) x: Buffer,
    /// The prologue's inputs (declared in place of `x`) and parameters.
    pub(super) pro: Vec<Buffer>,
    pub(super) pro_params: Vec<Val>,
    pub(super) xi: Option<Buffer>,
    /// `split_outer`'s second input and output.
    pub(super) x2: Option<Buffer>,
    pub(super) y: Option<Buffer>,
    pub(super) y2: Option<Buffer>,
    pub(super) yi: Option<Buffer>,
    /// `store_prologue`: one buffer per prologue output, with its storage.
    pub(super) pro_out: Vec<(Buffer, Storage)>,
}

/// Per-invocation accumulator.
pub(super) struct Acc {
    /// Sum: f32 lanes; keyed ops: u32 key lanes (argmax in Rows: one scalar).
    pub(super) value: helios_spirv::Var,
    /// ArgMax: index of the best key.
    pub(super) index: Option<helios_spirv::Var>,
}

/// A group's reduced value and, for argmax, the index it came from: what `store_result`
/// writes, kept together because argmax needs both.
#[derive(Clone, Copy)]
pub(super) struct Reduced {
    pub(super) value: Val,
    pub(super) index: Option<Val>,
}

/// The prologue's root value at element `at` (`lanes` 1) or vec4 `at` (`lanes` 4), for the
/// reduction to fold; with `store_prologue`, every output of the prologue is stored there
/// first. Both layouts evaluate each element exactly once (a row's edge elements one by
/// one, inside the row only), so each stored element is written once.
pub(super) fn prologue_value(
    k: &mut KernelBuilder,
    pro: &FusedKernel,
    b: &Bufs,
    at: Val,
    lanes: u8,
) -> Val {
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
    pub(super) fn group_op(&self) -> ReduceOp {
        match self.op {
            Reduction::Min => ReduceOp::Min,
            Reduction::Sum | Reduction::Mean => ReduceOp::Add,
            Reduction::Max | Reduction::ArgMax => ReduceOp::Max,
        }
    }

    pub(super) fn declare(&self, k: &mut KernelBuilder) -> Bufs {
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

    /// Fresh accumulators holding the identity, `lanes` wide.
    pub(super) fn acc(&self, k: &mut KernelBuilder, lanes: u8) -> Acc {
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
    pub(super) fn fill(&self) -> f32 {
        match self.op {
            Reduction::Sum | Reduction::Mean => 0.0,
            Reduction::Min => f32::INFINITY,
            Reduction::Max | Reduction::ArgMax => f32::NEG_INFINITY,
        }
    }

    /// Folds values (f32 lanes, or u32 keys when `is_key`) at indices `idx` into `acc`,
    /// lane-wise (`acc` as wide as the values).
    pub(super) fn fold_lanes(
        &self,
        k: &mut KernelBuilder,
        acc: &Acc,
        v: Val,
        is_key: bool,
        idx: Option<Val>,
    ) {
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

    /// Lane 0's store of a group's (or invocation's) result `r` at element `at` of the outputs
    /// `(y, y_index)`.
    pub(super) fn store_result(
        &self,
        k: &mut KernelBuilder,
        (y, yi): (Option<Buffer>, Option<Buffer>),
        cond: Val,
        at: Val,
        r: Reduced,
        scale: Val,
    ) {
        k.if_(cond, |k| {
            if let (Some(yi), Some(i)) = (yi, r.index) {
                k.store(yi, at, i);
            }
            let Some(y) = y else { return };
            match (self.stage, self.op) {
                (Stage::Partial, _) => k.store(y, at, r.value),
                (_, Reduction::Sum | Reduction::Mean) => {
                    let s = k.splat(scale, r.value.ty.lanes);
                    let v = k.mul(r.value, s);
                    store_f32(k, y, at, v, self.storage);
                }
                (_, _) => {
                    let v = key_value(k, r.value);
                    store_f32(k, y, at, v, self.storage);
                }
            }
        });
    }
}
