//! Walking one row of a tensor in 16-byte slots aligned to the buffer (`Row`: its slots,
//! edges, loads and stores), the loop that visits a group's share of them, and the linear
//! index of a workgroup in a 2-D grid.

use helios_spirv::{Buffer, KernelBuilder, Scalar, Ty, Val};

use crate::storage::{load_f32, store_f32, Storage};

/// The workgroup's linear index in a (possibly 2-D) grid.
pub fn linear_workgroup(k: &mut KernelBuilder) -> Val {
    let wid = k.workgroup_id();
    let nwg = k.num_workgroups();
    let (gx, gy, nx) = (k.extract(wid, 0), k.extract(wid, 1), k.extract(nwg, 0));
    let row = k.mul(gy, nx);
    k.add(row, gx)
}

/// This invocation's index over a (possibly 2-D, folded) grid of workgroups of `workgroup`
/// invocations.
pub fn global_index(k: &mut KernelBuilder, workgroup: Val) -> Val {
    let g = linear_workgroup(k);
    let base = k.mul(g, workgroup);
    let lid = k.local_index();
    k.add(base, lid)
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
