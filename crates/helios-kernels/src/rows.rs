//! Row machinery shared by the reduce, softmax and norm families: combining values across a
//! group of invocations, and walking one row of a tensor in 16-byte slots.
//!
//! Key decisions a reader must know:
//! - A row is processed by a *group* of `T` consecutive invocations (`T` a power of two that
//!   divides the workgroup size): a whole workgroup for long rows, a subgroup or less for short
//!   ones (several rows per workgroup). [`Groups::reduce`] combines one value per invocation
//!   over its group and hands the result to every member. With subgroups it uses shuffles (or
//!   one subgroup reduction where the subgroup size is fixed) inside blocks of the device's
//!   smallest subgroup size, then one round through shared memory between blocks; the
//!   fallback ([`Reducer::SharedTree`], `HELIOS_NO_SUBGROUP=1`) is a tree in shared memory.
//!   Blocks are runs of consecutive `LocalInvocationIndex` values, which is how every Vulkan
//!   implementation we know forms subgroups.
//! - Slots are aligned to the *buffer*, not to the row: slot `s` holds elements `[4s, 4s+4)`.
//!   A row that starts or ends mid-slot (any row whose length is not a multiple of 4, e.g. a
//!   vocabulary of 50257) still gets 16-byte loads for every slot it covers whole; only its
//!   two edge slots fall back to per-element accesses. Lanes outside the row get a fill value
//!   (the identity of what the kernel computes) and are never stored.

use helios_spirv::{
    Buffer, GroupMode, KernelBuilder, ReduceOp, Scalar, Shared, SharedLen, Ty, Val,
};

use crate::storage::{load_f32, store_f32, Storage};

/// How invocations combine values (the choice `HELIOS_NO_SUBGROUP=1` flips).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reducer {
    /// Subgroup operations. `block` is the smallest subgroup size the device may use (a power
    /// of two); `whole` says every subgroup has exactly `block` invocations, so a block
    /// reduces with one subgroup reduction instead of a shuffle butterfly.
    Subgroup { block: u32, whole: bool },
    /// Shared memory and workgroup barriers only.
    SharedTree,
}

impl Reducer {
    /// A short tag for kernel names ("sg8", "sg32w", "tree").
    pub fn tag(self) -> String {
        match self {
            Reducer::Subgroup { block, whole } => {
                format!("sg{block}{}", if whole { "w" } else { "" })
            }
            Reducer::SharedTree => "tree".to_owned(),
        }
    }
}

/// Which candidate a row family (softmax, norms) runs; `Auto` leaves it to the family's
/// selection function (`HELIOS_ROWS=cached|streaming` forces one, for tuning and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RowVariant {
    #[default]
    Auto,
    /// The row lives in registers between its reductions: one read, one write.
    Cached,
    /// The row is streamed once per pass (long rows).
    Streaming,
}

/// Tuning knobs of the row kernels (reduce, softmax, norms), read from the environment once
/// per device (see `helios::env`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowConfig {
    pub variant: RowVariant,
    /// Slots (16-byte loads) per invocation per loop step (`HELIOS_ROW_UNROLL`; default 4,
    /// and [`stream_unroll`] for streamed softmax/norm rows): see [`RowConfig::unroll`].
    pub unroll: Option<u8>,
    /// Most slots per invocation a cached variant keeps in registers
    /// (`HELIOS_ROW_SLOTS`; default: the family's own).
    pub cached_slots: Option<u32>,
    /// Workgroups a split reduction aims for (`HELIOS_SPLIT_GROUPS`, default 2048).
    pub target_groups: u32,
    /// Workgroup size for every row kernel (`HELIOS_WG`; default: the family's own).
    pub workgroup: Option<u32>,
    /// Rows each group of the cached norm backward walks, accumulating dgamma/dbeta
    /// (`HELIOS_NORM_ROWS`; default `norm::norm_bwd_rows`).
    pub norm_rows: Option<u32>,
    /// Softmax and norm rows a multiple of 4 long run kernels without per-slot checks
    /// ([`Row::whole`]; `HELIOS_ROW_WHOLE=0` turns that off, for measurements).
    pub whole_rows: bool,
}

/// Workgroup of a streamed softmax/norm row: long rows (a 50257 vocabulary) go through one
/// workgroup each, and a larger one keeps fewer rows in flight per SM, so the second pass
/// over a row finds it in L2. Measured on the H200 at 4096×50257 against 256: softmax f32
/// 507–580 µs vs 640, bf16 392 vs 421; layernorm forward f32 631 vs 717, bf16 467 vs 585;
/// layernorm forward+backward f32 1974 vs 2173 (bench/results/2026-11-22-ops-h200-warm.md).
pub const STREAM_WORKGROUP: u32 = 1024;
/// Slots per invocation per loop step of a streamed row of `storage` (at
/// [`STREAM_WORKGROUP`]): 4 for f32, 2 for f16/bf16. Measured on the H200 at 4096×50257 (u4
/// vs u2): f32 softmax 506 vs 583 µs, layernorm fwd 588 vs 624, fwd+bwd 1991 vs 2045; bf16
/// softmax 416 vs 389, fwd 632 vs 465, fwd+bwd 1853 vs 1685. 8 made the norm backward spill
/// (6.4 ms instead of 2.0).
pub const fn stream_unroll(storage: Storage) -> u8 {
    if storage.bytes() >= 4 {
        4
    } else {
        2
    }
}

impl RowConfig {
    /// Slots per loop step of the reductions (`HELIOS_ROW_UNROLL`, else 4).
    pub fn unroll(&self) -> u8 {
        self.unroll.unwrap_or(4)
    }

    /// Slots per loop step of a streamed softmax/norm row of `storage` (`HELIOS_ROW_UNROLL`,
    /// else [`stream_unroll`]).
    pub fn stream_unroll(&self, storage: Storage) -> u8 {
        self.unroll.unwrap_or(stream_unroll(storage))
    }
}

/// A softmax/norm family's choice for one row length: the variant, invocations per row and
/// the workgroup size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowChoice<V> {
    pub variant: V,
    pub threads: u32,
    pub workgroup: u32,
}

impl<V> RowChoice<V> {
    /// The same layout with the variant turned into a family's own.
    pub fn map<W>(self, f: impl FnOnce(V) -> W) -> RowChoice<W> {
        RowChoice {
            variant: f(self.variant),
            threads: self.threads,
            workgroup: self.workgroup,
        }
    }
}

impl Default for RowConfig {
    fn default() -> Self {
        RowConfig {
            variant: RowVariant::Auto,
            unroll: None,
            cached_slots: None,
            target_groups: 2048,
            workgroup: None,
            norm_rows: None,
            whole_rows: true,
        }
    }
}

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

/// The workgroup's linear index in a (possibly 2-D) grid.
pub fn linear_workgroup(k: &mut KernelBuilder) -> Val {
    let wid = k.workgroup_id();
    let nwg = k.num_workgroups();
    let (gx, gy, nx) = (k.extract(wid, 0), k.extract(wid, 1), k.extract(nwg, 0));
    let row = k.mul(gy, nx);
    k.add(row, gx)
}

/// Elements `[start, end)` of a buffer, walked in slots of `vec` elements (1 or 4) aligned to
/// the buffer.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub start: Val,
    pub end: Val,
    pub vec: u8,
    /// Known when the kernel is built: every slot touching the row lies inside it (rows a
    /// multiple of 4 long, back to back, so each starts on a slot boundary). Loads, stores and
    /// lane masks then need no checks.
    pub whole: bool,
}

impl Row {
    /// Row `unit` of `rows` rows of `len` elements lying back to back (`unit`, `rows`, `len`
    /// u32 values), and whether it exists: a unit past the last row gets the empty row
    /// `[0, 0)`, so every access it makes is skipped.
    pub fn nth(
        k: &mut KernelBuilder,
        unit: Val,
        rows: Val,
        len: Val,
        vec: u8,
        whole: bool,
    ) -> (Row, Val) {
        let valid = k.lt(unit, rows);
        let zero = k.u32(0);
        let start = k.mul(unit, len);
        let start = k.select(valid, start, zero);
        let end = k.add(start, len);
        let end = k.select(valid, end, zero);
        let row = Row {
            start,
            end,
            vec,
            whole,
        };
        (row, valid)
    }

    /// The first slot touching the row.
    pub fn first_slot(&self, k: &mut KernelBuilder) -> Val {
        if self.vec == 1 {
            return self.start;
        }
        let s = k.u32(2);
        k.shr(self.start, s)
    }

    /// One past the last slot touching the row.
    pub fn end_slot(&self, k: &mut KernelBuilder) -> Val {
        if self.vec == 1 {
            return self.end;
        }
        let three = k.u32(3);
        let e = k.add(self.end, three);
        let s = k.u32(2);
        k.shr(e, s)
    }

    /// The column (index inside the row) of each lane of `slot`; lanes before the row wrap
    /// to huge values, so `col < len` is the validity test.
    pub fn cols(&self, k: &mut KernelBuilder, slot: Val) -> Val {
        if self.vec == 1 {
            return k.sub(slot, self.start);
        }
        let two = k.u32(2);
        let e0 = k.shl(slot, two);
        let e0 = k.sub(e0, self.start);
        let e = k.splat(e0, 4);
        let lanes: Vec<Val> = (0..4).map(|i| k.u32(i)).collect();
        let offs = k.vector(&lanes);
        k.add(e, offs)
    }

    /// Lanes of `cols` inside the row (bool, `vec` lanes).
    pub fn valid(&self, k: &mut KernelBuilder, cols: Val) -> Val {
        let len = k.sub(self.end, self.start);
        let len = k.splat(len, self.vec);
        k.lt(cols, len)
    }

    /// Whether slot `slot` of a [`Row::whole`] row lies inside it (then so do all its lanes):
    /// one scalar test instead of `valid`'s per-lane ones.
    pub fn slot_inside(&self, k: &mut KernelBuilder, slot: Val) -> Val {
        assert!(self.whole, "slot_inside needs whole slots");
        let two = k.u32(2);
        let e0 = k.shl(slot, two);
        let a = k.ge(e0, self.start);
        let b = k.lt(e0, self.end);
        k.and(a, b)
    }

    /// Whether all lanes of `slot` lie inside the row (any slot touching a
    /// [`Row::whole`] row does).
    pub fn full(&self, k: &mut KernelBuilder, slot: Val) -> Val {
        if self.whole {
            return k.bool(true);
        }
        let two = k.u32(2);
        let e0 = k.shl(slot, two);
        let four = k.u32(4);
        let e1 = k.add(e0, four);
        let a = k.ge(e0, self.start);
        let b = k.le(e1, self.end);
        k.and(a, b)
    }

    /// Slot `slot` of `buf` as f32 (`vec` lanes), `fill` in lanes outside the row. The slot
    /// must touch the row (first_slot <= slot < end_slot).
    pub fn load(
        &self,
        k: &mut KernelBuilder,
        buf: Buffer,
        s: Storage,
        slot: Val,
        fill: f32,
    ) -> Val {
        self.load_with(k, slot, fill, |k, at, lanes| load_f32(k, buf, at, lanes, s))
    }

    /// `load` of values that `value(k, at, lanes)` produces: element `at` (lanes 1) or the
    /// four elements of slot `at` (lanes 4).
    pub fn load_with(
        &self,
        k: &mut KernelBuilder,
        slot: Val,
        fill: f32,
        value: impl Fn(&mut KernelBuilder, Val, u8) -> Val,
    ) -> Val {
        if self.vec == 1 {
            return value(k, slot, 1);
        }
        if self.whole {
            return value(k, slot, 4);
        }
        let ty = Ty::vector(Scalar::F32, 4);
        let out = k.var(ty);
        let full = self.full(k, slot);
        let (start, end) = (self.start, self.end);
        k.if_else(
            full,
            |k| {
                let v = value(k, slot, 4);
                k.set(out, v);
            },
            |k| {
                let f = k.const_float(ty, fill);
                k.set(out, f);
                let two = k.u32(2);
                let e0 = k.shl(slot, two);
                for lane in 0..4 {
                    let off = k.u32(lane);
                    let e = k.add(e0, off);
                    let a = k.ge(e, start);
                    let b = k.lt(e, end);
                    let inside = k.and(a, b);
                    k.if_(inside, |k| {
                        let x = value(k, e, 1);
                        let cur = k.get(out);
                        let v = k.insert(cur, x, lane);
                        k.set(out, v);
                    });
                }
            },
        );
        k.get(out)
    }

    /// Walks the slots of the row that `lane` of the row's `threads` invocations owns (a
    /// 4-element row): the full slots (every lane inside the row), `unroll` at a time, go to
    /// `full`, which needs no bounds checks or fills; the at most two partial edge slots go to
    /// `edge`, the first by lane 0 and the last by lane `threads - 1`. Every slot touching the
    /// row is visited exactly once (a row inside one slot is one edge).
    #[allow(clippy::too_many_arguments)]
    pub fn walk(
        &self,
        k: &mut KernelBuilder,
        lane: Val,
        threads: Val,
        unroll: u32,
        full: impl FnMut(&mut KernelBuilder, &[Val]),
        mut edge: impl FnMut(&mut KernelBuilder, Val),
    ) {
        assert_eq!(
            self.vec, 4,
            "Row::walk on a row of {}-element slots",
            self.vec
        );
        let (two, three, zero) = (k.u32(2), k.u32(3), k.u32(0));
        let s3 = k.add(self.start, three);
        let first_full = k.shr(s3, two);
        let end_full = k.shr(self.end, two);
        for_each_slot_by(k, first_full, end_full, lane, threads, unroll, full);
        let nonempty = k.lt(self.start, self.end);
        let head_off = k.and(self.start, three);
        let head_part = k.ne(head_off, zero);
        let head = k.and(nonempty, head_part);
        let head_slot = k.shr(self.start, two);
        let tail_off = k.and(self.end, three);
        let tail_part = k.ne(tail_off, zero);
        let tail = k.and(nonempty, tail_part);
        // A row inside one slot has its head there too: that slot is the head's.
        let same = k.eq(end_full, head_slot);
        let shared = k.and(head, same);
        let alone = k.not(shared);
        let tail = k.and(tail, alone);
        let first_lane = k.eq(lane, zero);
        let one = k.u32(1);
        let last = k.sub(threads, one);
        let last_lane = k.eq(lane, last);
        let mine = k.and(head, first_lane);
        k.if_(mine, |k| edge(k, head_slot));
        let mine = k.and(tail, last_lane);
        k.if_(mine, |k| edge(k, end_full));
    }

    /// Stores the lanes of `value` (f32, `vec` lanes) that lie inside the row at `slot`.
    pub fn store(&self, k: &mut KernelBuilder, buf: Buffer, s: Storage, slot: Val, value: Val) {
        if self.vec == 1 || self.whole {
            store_f32(k, buf, slot, value, s);
            return;
        }
        let full = self.full(k, slot);
        let (start, end) = (self.start, self.end);
        k.if_else(
            full,
            |k| store_f32(k, buf, slot, value, s),
            |k| {
                let two = k.u32(2);
                let e0 = k.shl(slot, two);
                for lane in 0..4 {
                    let off = k.u32(lane);
                    let e = k.add(e0, off);
                    let a = k.ge(e, start);
                    let b = k.lt(e, end);
                    let inside = k.and(a, b);
                    k.if_(inside, |k| {
                        let x = k.extract(value, lane);
                        store_f32(k, buf, e, x, s);
                    });
                }
            },
        );
    }
}

/// Visits indices `first + lane, first + lane + stride, ...` below `end`: `unroll` at a time
/// (all loads of a step issued before its arithmetic, which keeps bytes in flight) while
/// whole steps remain, then one at a time.
pub fn for_each_slot(
    k: &mut KernelBuilder,
    first: Val,
    end: Val,
    lane: Val,
    stride: u32,
    unroll: u32,
    body: impl FnMut(&mut KernelBuilder, &[Val]),
) {
    let stride = k.u32(stride);
    for_each_slot_by(k, first, end, lane, stride, unroll, body)
}

/// `for_each_slot` with a run-time `stride` (a u32 value).
pub fn for_each_slot_by(
    k: &mut KernelBuilder,
    first: Val,
    end: Val,
    lane: Val,
    stride: Val,
    unroll: u32,
    mut body: impl FnMut(&mut KernelBuilder, &[Val]),
) {
    let start = k.add(first, lane);
    let i = k.var_init(start);
    if unroll > 1 {
        let um1 = k.u32(unroll - 1);
        let span = k.mul(stride, um1);
        let u = k.u32(unroll);
        let step = k.mul(stride, u);
        let offsets: Vec<Val> = (1..unroll)
            .map(|j| {
                let jv = k.u32(j);
                k.mul(stride, jv)
            })
            .collect();
        k.while_(
            |k| {
                let iv = k.get(i);
                let last = k.add(iv, span);
                k.lt(last, end)
            },
            |k| {
                let iv = k.get(i);
                let mut slots = vec![iv];
                for &o in &offsets {
                    slots.push(k.add(iv, o));
                }
                body(k, &slots);
            },
            |k| {
                let iv = k.get(i);
                let n = k.add(iv, step);
                k.set(i, n);
            },
        );
    }
    k.while_(
        |k| {
            let iv = k.get(i);
            k.lt(iv, end)
        },
        |k| {
            let iv = k.get(i);
            body(k, &[iv]);
        },
        |k| {
            let iv = k.get(i);
            let n = k.add(iv, stride);
            k.set(i, n);
        },
    );
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

/// Threads per row for a row of `slots` slots, `per_thread` slots per invocation, in a
/// workgroup of `workgroup`: the smallest power of two giving each at most `per_thread`,
/// capped at the workgroup.
pub fn threads_for(slots: u64, per_thread: u32, workgroup: u32) -> u32 {
    let want = slots.div_ceil(u64::from(per_thread.max(1))).max(1);
    let t = want.next_power_of_two().min(u64::from(workgroup));
    t as u32
}

/// How a softmax or norm row is laid over invocations (with the threads per row and the
/// workgroup in the [`RowChoice`] around it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowPlan {
    /// The row kept in registers: `slots` slots per invocation.
    Cached { slots: u8 },
    /// The row streamed (read more than once), `unroll` slots per invocation per step.
    Streaming { unroll: u8 },
}

/// The cached-or-streaming decision the row families share. `slots`: slots a row touches in
/// the cached layout; `stream_slots`: in the streaming one; `per`: the most slots per
/// invocation the cached variant keeps by default; `workgroup`: the family's own size;
/// `max_workgroup`: the device's largest power of two. `Cached` when the row fits in a
/// workgroup at `per` slots each (with the fewest invocations that do), else `Streaming` in a
/// workgroup of [`STREAM_WORKGROUP`] with `stream_unroll` slots of 4 per step;
/// `cfg.variant` forces one (cached only where a row fits in 16 slots per invocation) and
/// `cfg.workgroup` (`HELIOS_WG`) fixes the workgroup of both.
pub fn plan_row(
    slots: u64,
    stream_slots: u64,
    per: u32,
    cfg: &RowConfig,
    workgroup: u32,
    max_workgroup: u32,
    stream_unroll: u8,
) -> RowChoice<RowPlan> {
    let cached_wg = cfg.workgroup.unwrap_or(workgroup).min(max_workgroup);
    let w = u64::from(cached_wg);
    let streaming = || {
        let wg = cfg.workgroup.unwrap_or(STREAM_WORKGROUP).min(max_workgroup);
        let per = u32::from(stream_unroll) * 4;
        RowChoice {
            variant: RowPlan::Streaming {
                unroll: stream_unroll,
            },
            threads: threads_for(stream_slots, per, wg),
            workgroup: wg,
        }
    };
    let cached = |per: u32| {
        let threads = threads_for(slots, per, cached_wg);
        let slots = slots.div_ceil(u64::from(threads)).max(1) as u8;
        RowChoice {
            variant: RowPlan::Cached { slots },
            threads,
            workgroup: cached_wg,
        }
    };
    match cfg.variant {
        RowVariant::Streaming => streaming(),
        RowVariant::Cached if slots <= w * 16 => cached(per.max(slots.div_ceil(w) as u32)),
        _ if slots <= w * u64::from(per) => cached(per),
        _ => streaming(),
    }
}

/// Whether rows of `len` elements, back to back, cover whole 16-byte slots of 4 elements
/// (kernels built with [`Row::whole`] may then run), unless `cfg` turns that off.
pub fn whole_rows(len: u64, cfg: &RowConfig) -> bool {
    cfg.whole_rows && len % 4 == 0
}

/// Slots a row of `len` elements touches at most, walked `vec` elements per slot, when rows
/// lie back to back (rows of a multiple of 4 are all aligned; others may touch one more).
pub fn row_slots(len: u64, vec: u8) -> u64 {
    if vec == 1 || len % 4 == 0 {
        len.div_ceil(u64::from(vec))
    } else {
        len / 4 + 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_per_row() {
        assert_eq!(threads_for(193, 4, 256), 64);
        assert_eq!(threads_for(192, 6, 256), 32);
        assert_eq!(threads_for(12566, 4, 256), 256);
        assert_eq!(threads_for(2, 4, 256), 1);
        assert_eq!(threads_for(0, 4, 256), 1);
        assert_eq!(row_slots(768, 4), 192);
        assert_eq!(row_slots(50257, 4), 12566);
        assert_eq!(row_slots(5, 4), 3);
        assert_eq!(row_slots(7, 1), 7);
    }
}
