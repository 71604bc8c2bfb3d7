//! Combining values: across a group of invocations that owns a row (`Groups`, with subgroup
//! shuffles or a tree in shared memory), across a vector's lanes (`hsum`, `hreduce`), and as
//! order keys, the u32 form of an f32 that max, min and argmax combine as integers.

use helios_spirv::{GroupMode, KernelBuilder, ReduceOp, Scalar, Shared, SharedLen, Ty, Val};

use super::config::Reducer;

/// `combine(a, b)` for a reduction operator on values of any type.
pub fn combine(k: &mut KernelBuilder, op: ReduceOp, a: Val, b: Val) -> Val {
    match op {
        ReduceOp::Add => k.add(a, b),
        ReduceOp::Mul => k.mul(a, b),
        ReduceOp::Max => k.max(a, b),
        ReduceOp::Min => k.min(a, b),
    }
}

/// The identity of `op` on values of type `ty` (floats: 0, 1, -inf, +inf; unsigned: 0, 1,
/// 0, MAX).
pub fn identity(k: &mut KernelBuilder, op: ReduceOp, ty: Ty) -> Val {
    if ty.scalar.is_float() {
        let v = match op {
            ReduceOp::Add => 0.0,
            ReduceOp::Mul => 1.0,
            ReduceOp::Max => f32::NEG_INFINITY,
            ReduceOp::Min => f32::INFINITY,
        };
        k.const_float(ty, v)
    } else {
        let v = match op {
            ReduceOp::Add | ReduceOp::Max => 0,
            ReduceOp::Mul => 1,
            ReduceOp::Min => u32::MAX as i64,
        };
        k.const_int(ty, v)
    }
}

/// Groups of `2^shift` consecutive invocations that each own one row (see the module docs).
/// The group size is a run-time value (a push constant, uniform over the dispatch), so one
/// pipeline serves every row length.
pub struct Groups {
    pub reducer: Reducer,
    /// log2 of the invocations per group (a power of two dividing the workgroup size).
    shift: Val,
    /// Invocations per group.
    size: Val,
    lid: Val,
    scratch: Vec<(Ty, Shared)>,
}

impl Groups {
    /// Groups of `threads` invocations (a power of two dividing the workgroup size), fixed
    /// when the kernel is built.
    #[track_caller]
    pub fn new(k: &mut KernelBuilder, reducer: Reducer, threads: u32) -> Groups {
        assert!(threads.is_power_of_two(), "group of {threads} invocations");
        let shift = k.u32(threads.trailing_zeros());
        Groups::runtime(k, reducer, shift)
    }

    /// Groups of `2^shift` invocations (`shift` a u32 value uniform over the dispatch).
    pub fn runtime(k: &mut KernelBuilder, reducer: Reducer, shift: Val) -> Groups {
        let lid = k.local_index();
        let one = k.u32(1);
        let size = k.shl(one, shift);
        Groups {
            reducer,
            shift,
            size,
            lid,
            scratch: Vec::new(),
        }
    }

    /// Invocations per group.
    pub fn size(&self) -> Val {
        self.size
    }

    /// This invocation's index inside its group.
    pub fn lane(&self, k: &mut KernelBuilder) -> Val {
        let one = k.u32(1);
        let m = k.sub(self.size, one);
        k.and(self.lid, m)
    }

    /// This invocation's group inside the workgroup.
    pub fn group(&self, k: &mut KernelBuilder) -> Val {
        k.shr(self.lid, self.shift)
    }

    /// Groups per workgroup (the workgroup size is a specialization constant).
    pub fn per_workgroup(&self, k: &mut KernelBuilder) -> Val {
        let w = k.workgroup_size_x();
        k.shr(w, self.shift)
    }

    fn scratch(&mut self, k: &mut KernelBuilder, ty: Ty) -> Shared {
        if let Some(&(_, s)) = self.scratch.iter().find(|(t, _)| *t == ty) {
            return s;
        }
        let s = k.shared_array(ty, SharedLen::WorkgroupX);
        self.scratch.push((ty, s));
        s
    }

    /// `op` over `v` of every invocation of the group, returned to all of them. Must be
    /// reached by every invocation of the workgroup (it may contain barriers).
    pub fn reduce(&mut self, k: &mut KernelBuilder, op: ReduceOp, v: Val) -> Val {
        match self.reducer {
            Reducer::Subgroup { block, whole } => self.reduce_subgroup(k, op, v, block, whole),
            Reducer::SharedTree => self.reduce_tree(k, op, v),
        }
    }

    fn reduce_subgroup(
        &mut self,
        k: &mut KernelBuilder,
        op: ReduceOp,
        v: Val,
        block: u32,
        whole: bool,
    ) -> Val {
        let out = k.var(v.ty);
        let bv = k.u32(block);
        let small = k.le(self.size, bv);
        let size = self.size;
        // Groups inside one subgroup: a butterfly over the group's lanes.
        k.if_(small, |k| {
            let r = butterfly(k, op, v, block, size);
            k.set(out, r);
        });
        let big = k.not(small);
        let lid = self.lid;
        let scratch = self.scratch(k, v.ty);
        let shift = self.shift;
        k.if_(big, |k| {
            // Whole subgroups: one subgroup reduction (or a full butterfly), then block
            // leaders publish and every block reads its group's partials (lane i takes i,
            // i + block, ...) and reduces them again.
            let r = if whole {
                k.subgroup_reduce(op, GroupMode::Reduce, v)
            } else {
                butterfly(k, op, v, block, bv)
            };
            let bm = k.u32(block - 1);
            let lane = k.and(lid, bm);
            let zero = k.u32(0);
            let leader = k.eq(lane, zero);
            let bs = k.u32(block.trailing_zeros());
            let slot = k.shr(lid, bs);
            k.if_(leader, |k| k.shared_store(scratch, slot, r));
            k.workgroup_barrier();
            let per = k.shr(size, bs); // blocks per group
            let g = k.shr(lid, shift);
            let gbase = k.mul(g, per);
            let id = identity(k, op, v.ty);
            let acc = k.var_init(id);
            let step = k.u32(block);
            k.for_range(lane, per, step, |k, j| {
                let at = k.add(gbase, j);
                let x = k.shared_load(scratch, at);
                let a = k.get(acc);
                let c = combine(k, op, a, x);
                k.set(acc, c);
            });
            let a = k.get(acc);
            let r = if whole {
                k.subgroup_reduce(op, GroupMode::Reduce, a)
            } else {
                butterfly(k, op, a, block, bv)
            };
            k.set(out, r);
            k.workgroup_barrier();
        });
        k.get(out)
    }

    fn reduce_tree(&mut self, k: &mut KernelBuilder, op: ReduceOp, v: Val) -> Val {
        let scratch = self.scratch(k, v.ty);
        let lane = self.lane(k);
        let lid = self.lid;
        k.shared_store(scratch, lid, v);
        k.workgroup_barrier();
        let one = k.u32(1);
        let half = k.shr(self.size, one);
        let s = k.var_init(half);
        let zero = k.u32(0);
        k.while_(
            |k| {
                let sv = k.get(s);
                k.gt(sv, zero)
            },
            |k| {
                let sv = k.get(s);
                let active = k.lt(lane, sv);
                k.if_(active, |k| {
                    let a = k.shared_load(scratch, lid);
                    let other = k.add(lid, sv);
                    let b = k.shared_load(scratch, other);
                    let c = combine(k, op, a, b);
                    k.shared_store(scratch, lid, c);
                });
                k.workgroup_barrier();
            },
            |k| {
                let sv = k.get(s);
                let n = k.shr(sv, one);
                k.set(s, n);
            },
        );
        let base = k.sub(lid, lane);
        let r = k.shared_load(scratch, base);
        k.workgroup_barrier();
        r
    }
}

/// `op` over aligned blocks of `n` invocations (`n` a run-time power of two up to `block`, the
/// subgroup size): shuffles at distances `block/2 .. 1`, each kept only below `n`.
fn butterfly(k: &mut KernelBuilder, op: ReduceOp, v: Val, block: u32, n: Val) -> Val {
    let mut r = v;
    let mut m = block / 2;
    while m >= 1 {
        let mask = k.u32(m);
        let other = k.subgroup_shuffle_xor(r, mask);
        let c = combine(k, op, r, other);
        let inside = k.lt(mask, n);
        r = k.select(inside, c, r);
        m /= 2;
    }
    r
}

/// The f32 bits of `x` as a u32 that orders like the float (vector or scalar); NaN becomes
/// the largest key when `nan_high`, else the smallest.
pub fn order_key(k: &mut KernelBuilder, x: Val, nan_high: bool) -> Val {
    let uty = x.ty.with_scalar(Scalar::U32);
    let canon = if nan_high {
        0x7fc0_0000u64
    } else {
        0xffc0_0000
    };
    let nan = k.constant_bits(uty, canon);
    let bits = k.bitcast(x, uty);
    let is_nan = k.is_nan(x);
    let bits = k.select(is_nan, nan, bits);
    let s31 = k.constant_bits(uty, 31);
    let sign = k.shr(bits, s31);
    let zero = k.constant_bits(uty, 0);
    let neg = k.sub(zero, sign);
    let top = k.constant_bits(uty, 0x8000_0000);
    let mask = k.or(neg, top);
    k.xor(bits, mask)
}

/// The f32 whose order key is `key` (inverse of `order_key`).
pub fn key_value(k: &mut KernelBuilder, key: Val) -> Val {
    let uty = key.ty;
    let s31 = k.constant_bits(uty, 31);
    let top_bit = k.shr(key, s31);
    let one = k.constant_bits(uty, 1);
    let m = k.sub(top_bit, one);
    let top = k.constant_bits(uty, 0x8000_0000);
    let mask = k.or(m, top);
    let bits = k.xor(key, mask);
    k.bitcast(bits, uty.with_scalar(Scalar::F32))
}

/// Sum of the lanes of a float vector.
pub fn hsum(k: &mut KernelBuilder, v: Val) -> Val {
    let mut acc = k.extract(v, 0);
    for i in 1..v.ty.lanes as u32 {
        let x = k.extract(v, i);
        acc = k.add(acc, x);
    }
    acc
}

/// `op` over the lanes of a vector.
pub fn hreduce(k: &mut KernelBuilder, op: ReduceOp, v: Val) -> Val {
    let mut acc = k.extract(v, 0);
    for i in 1..v.ty.lanes as u32 {
        let x = k.extract(v, i);
        acc = combine(k, op, acc, x);
    }
    acc
}
