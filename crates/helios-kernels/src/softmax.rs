//! Softmax and log-softmax over the last axis, with an optional scale and causal mask, and
//! their backward passes.
//!
//! Key decisions a reader must know:
//! - One group of invocations per row (a workgroup for long rows, a subgroup or less for
//!   short ones), 16-byte slot loads aligned to the buffer (see `rows`).
//! - Two candidate kernels, kept side by side in [`SoftmaxVariant`] and chosen by one
//!   function, [`select`]: `Cached` keeps the row in registers between its two reductions, so
//!   every byte is read once and written once (the ideal); `Streaming` handles rows too long
//!   for registers (a vocabulary of 50257) with an online max-and-sum pass followed by an
//!   output pass: the input is read twice.
//! - Semantics: y = softmax(scale·x) with column j of row i masked (as if -inf) when
//!   `causal` and j > i (i = the row's index in its (…, T, L) matrix). A row with every entry
//!   -inf or masked gives zeros (softmax) or -inf (log-softmax), never NaN; a NaN anywhere in
//!   a row makes the whole row NaN. The backward passes take the forward's output y:
//!   softmax dx = scale·y·(dy − Σ y·dy); log-softmax dx = scale·(dy − exp(y)·Σ dy); masked
//!   columns get dx = 0.

use helios_spirv::{
    Access, Binding, Buffer, KernelBuilder, KernelModule, ReduceOp, Scalar, Ty, Val, Var,
};

use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::rows::{
    for_each_slot_by, hreduce, hsum, linear_workgroup, plan_row, row_slots, Groups, Reducer, Row,
    RowChoice, RowConfig, RowLaunch, RowPlan,
};
use crate::storage::{buffer_scalar, load_f32, store_f32, Storage};
use crate::KernelError;

/// The candidate kernels (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SoftmaxVariant {
    /// Each invocation keeps `slots` slots of its row in registers.
    Cached { slots: u8 },
    /// The row is streamed twice, `unroll` slots per invocation per loop step.
    Streaming { unroll: u8 },
}

impl SoftmaxVariant {
    /// A short tag ("cached6", "stream_u4") for kernel names and tables.
    pub fn tag(&self) -> String {
        match *self {
            SoftmaxVariant::Cached { slots } => format!("cached{slots}"),
            SoftmaxVariant::Streaming { unroll } => format!("stream_u{unroll}"),
        }
    }
}

/// Most slots per invocation the cached forward (one tensor in registers) and backward (two)
/// keep by default.
pub const SOFTMAX_CACHED_SLOTS: [u32; 2] = [8, 4];
/// Default workgroup size.
pub const SOFTMAX_WORKGROUP: u32 = 256;
/// Slots per invocation per loop step of a streamed row, every storage (`HELIOS_ROW_UNROLL`
/// overrides). With full slots walked unchecked (`Row::walk`) the f16/bf16 rows no longer
/// prefer 2 (the norms' [`stream_unroll`](crate::rows::stream_unroll)): 4 measured fastest
/// on an H100 (bench/results/source-comment-history.md).
pub const SOFTMAX_STREAM_UNROLL: u8 = 4;

/// The family's selection function: the variant and the invocations per row (a run-time
/// parameter). `Cached` when a row fits in `workgroup` invocations' registers (at most
/// `SOFTMAX_CACHED_SLOTS` slots each, or `HELIOS_ROW_SLOTS`), with the fewest invocations per
/// row that do; else `Streaming` with a whole workgroup per row. `HELIOS_ROWS=cached|streaming`
/// forces a variant (cached only where a row fits in 16 slots per invocation).
pub fn select(
    len: u64,
    backward: bool,
    cfg: &RowConfig,
    max_workgroup: u32,
) -> RowChoice<SoftmaxVariant> {
    let slots = row_slots(len, 4);
    let per = cfg
        .cached_slots
        .unwrap_or(SOFTMAX_CACHED_SLOTS[usize::from(backward)]);
    plan_row(
        slots,
        slots,
        per,
        cfg,
        SOFTMAX_WORKGROUP,
        max_workgroup,
        cfg.unroll.unwrap_or(SOFTMAX_STREAM_UNROLL),
    )
    .map(|plan| match plan {
        // Slots rounded up to a power of two (the extra ones masked): rows that grow by one
        // element at a time, as a decoder's scores do when it attends with matmul and
        // softmax (`attention_decode` does not), then need 4 kernels (1, 2, 4, 8 slots)
        // instead of 8, each a compile a cold token waits for.
        RowPlan::Cached { slots } => SoftmaxVariant::Cached {
            slots: slots.next_power_of_two(),
        },
        RowPlan::Streaming { unroll } => SoftmaxVariant::Streaming { unroll },
    })
}

/// The signature of a softmax kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SoftmaxKernel {
    /// Log-softmax instead of softmax.
    pub log: bool,
    pub backward: bool,
    pub causal: bool,
    /// Storage of every tensor the kernel reads and writes.
    pub storage: Storage,
    pub variant: SoftmaxVariant,
    pub reducer: Reducer,
    pub workgroup: u32,
    pub binding: Binding,
    /// Built for rows a multiple of 4 long ([`Row::whole`]): no per-slot bounds checks.
    /// [`whole_rows`](crate::rows::whole_rows) says when a launch may use it.
    pub whole: bool,
    /// Softmax forward only: also writes each row's log-sum-exp, ln Σ exp(scale·x) over its
    /// unmasked columns (−inf for a fully masked row), to an f32 buffer `lse` of one value
    /// per row (what attention's backward takes).
    pub lse: bool,
    /// Causal only: a row i stops at its diagonal, so columns j > i are neither read nor
    /// written (what they hold stays), for consumers that ignore them (attention's
    /// triangular products). Forward and backward alike.
    pub prefix: bool,
}

/// What the output pass applies to each shifted input, computed once per row from its max
/// and sum: softmax `exp(xs − shift) · factor`, log-softmax `xs − shift`.
struct RowStats {
    /// softmax: the max (0 for a fully masked row); log-softmax: max + ln Σ (0 when masked).
    shift: Val,
    /// softmax: 1 / Σ exp(x − max), 0 for a fully masked row.
    factor: Val,
}

impl SoftmaxKernel {
    pub fn name(&self) -> String {
        let v = self.variant.tag();
        format!(
            "{}softmax{}{}{}{}_{v}{}_{}_{}_wg{}",
            if self.log { "log_" } else { "" },
            if self.backward { "_bwd" } else { "" },
            if self.causal { "_causal" } else { "" },
            if self.lse { "_lse" } else { "" },
            if self.prefix { "_prefix" } else { "" },
            if self.whole { "w" } else { "" },
            self.storage.name(),
            self.reducer.tag(),
            self.workgroup
        )
    }

    /// Emits the kernel. Buffers: forward x, y (and lse); backward y, dy, dx. Push constants after
    /// them: rows, len, causal_rows (T of the (…, T, L) view; row i of a matrix is
    /// `row % causal_rows`), group_shift (log2 of the invocations per row), scale.
    pub fn build(&self) -> KernelModule {
        let mut k = KernelBuilder::new(self.name(), self.binding, [self.workgroup, 1, 1]);
        let elem = buffer_scalar(self.storage);
        let ins: Vec<Buffer> = if self.backward {
            vec![
                k.buffer("y", elem, Access::Read),
                k.buffer("dy", elem, Access::Read),
            ]
        } else {
            vec![k.buffer("x", elem, Access::Read)]
        };
        let out = k.buffer(if self.backward { "dx" } else { "y" }, elem, Access::Write);
        assert!(
            !self.lse || !(self.log || self.backward),
            "lse is an output of the softmax forward"
        );
        let lse = self
            .lse
            .then(|| k.buffer("lse", Scalar::F32, Access::Write));
        let u32_ty = Ty::scalar(Scalar::U32);
        let params = ["rows", "len", "causal_rows", "group_shift"].map(|n| k.param(n, u32_ty));
        let scale = k.param("scale", Ty::scalar(Scalar::F32));
        k.begin();
        let [rows, len, causal_rows, shift] = params.map(|p| k.load_param(p));
        let scale = k.load_param(scale);

        let mut groups = Groups::runtime(&mut k, self.reducer, shift);
        let threads = groups.size();
        let g = linear_workgroup(&mut k);
        let per = groups.per_workgroup(&mut k);
        let gi = groups.group(&mut k);
        let lane = groups.lane(&mut k);
        let base = k.mul(g, per);
        let unit = k.add(base, gi);
        assert!(
            !self.prefix || self.causal,
            "a prefix row needs the causal mask"
        );
        let (mut row, valid) = Row::nth(&mut k, unit, rows, len, 4, self.whole && !self.prefix);
        let causal_i = self.causal.then(|| k.rem(unit, causal_rows));
        if let (true, Some(i)) = (self.prefix, causal_i) {
            // Row i ends after column i (an empty row stays empty).
            let one = k.u32(1);
            let seen = k.add(i, one);
            let end = k.add(row.start, seen);
            row.end = k.min(row.end, end);
        }
        let ctx = Ctx {
            row,
            lane,
            threads,
            causal_i,
            scale,
            unit,
            valid,
        };
        if self.backward {
            self.backward_body(&mut k, &mut groups, &ctx, ins[0], ins[1], out);
        } else {
            self.forward_body(&mut k, &mut groups, &ctx, ins[0], out, lse);
        }
        k.finish()
    }

    /// Lanes of `slot` inside the row and not masked.
    fn keep(&self, k: &mut KernelBuilder, c: &Ctx, slot: Val) -> Val {
        let cols = c.row.cols(k, slot);
        let inside = c.row.valid(k, cols);
        match c.causal_i {
            Some(i) => {
                let iv = k.splat(i, 4);
                let seen = k.le(cols, iv);
                k.and(inside, seen)
            }
            None => inside,
        }
    }

    /// scale·x where kept, -inf elsewhere.
    fn scaled(&self, k: &mut KernelBuilder, c: &Ctx, slot: Val, x: Val) -> Val {
        let keep = self.keep(k, c, slot);
        let s = k.splat(c.scale, 4);
        let xs = k.mul(x, s);
        let ninf = k.const_float(x.ty, f32::NEG_INFINITY);
        k.select(keep, xs, ninf)
    }

    /// The row's output constants from its shift `safe` and `sum` = Σ exp(x − safe). A fully
    /// masked row has sum 0 and every input -inf, so shift 0 and factor 0 give it zeros
    /// (softmax) and -inf (log-softmax) without a test per slot.
    fn stats(&self, k: &mut KernelBuilder, safe: Val, sum: Val) -> RowStats {
        let zero = k.const_f32(0.0);
        let empty = k.eq(sum, zero);
        if self.log {
            let l = k.log(sum);
            let lse = k.add(safe, l);
            let shift = k.select(empty, zero, lse);
            RowStats {
                shift,
                factor: zero,
            }
        } else {
            let one = k.const_f32(1.0);
            let inv = k.div(one, sum);
            let factor = k.select(empty, zero, inv);
            RowStats {
                shift: safe,
                factor,
            }
        }
    }

    /// The output lanes of a slot from its scaled inputs.
    fn output(&self, k: &mut KernelBuilder, xs: Val, st: &RowStats) -> Val {
        let shift = k.splat(st.shift, 4);
        let d = k.sub(xs, shift);
        if self.log {
            d
        } else {
            let e = k.exp(d);
            let f = k.splat(st.factor, 4);
            k.mul(e, f)
        }
    }

    /// `scaled` for a slot wholly inside the row: only the causal mask can apply.
    fn scaled_full(&self, k: &mut KernelBuilder, c: &Ctx, slot: Val, x: Val) -> Val {
        if self.causal {
            return self.scaled(k, c, slot, x);
        }
        let s = k.splat(c.scale, 4);
        k.mul(x, s)
    }

    /// Full slots of `x` (see `Row::walk`), all loads issued first, scaled and masked.
    fn load_full(&self, k: &mut KernelBuilder, c: &Ctx, x: Buffer, slots: &[Val]) -> Vec<Val> {
        let xs: Vec<Val> = slots
            .iter()
            .map(|&sl| load_f32(k, x, sl, 4, self.storage))
            .collect();
        slots
            .iter()
            .zip(xs)
            .map(|(&sl, v)| self.scaled_full(k, c, sl, v))
            .collect()
    }

    /// An edge slot of `x`, -inf outside the row, scaled and masked.
    fn load_edge(&self, k: &mut KernelBuilder, c: &Ctx, x: Buffer, slot: Val) -> Val {
        let v = c.row.load(k, x, self.storage, slot, f32::NEG_INFINITY);
        self.scaled(k, c, slot, v)
    }

    /// Folds scaled slots into the running max `m` and the sum `s` of exp(x − max) of an
    /// online softmax.
    fn absorb(k: &mut KernelBuilder, m: Var, s: Var, xs: &[Val]) {
        let mut cm = k.get(m);
        let old = cm;
        for &v in xs {
            let h = hreduce(k, ReduceOp::Max, v);
            cm = k.max(cm, h);
        }
        let safe = Self::safe(k, cm);
        let d = k.sub(old, safe);
        let r = k.exp(d);
        let sv = k.get(s);
        let mut acc = k.mul(sv, r);
        let safe4 = k.splat(safe, 4);
        for &v in xs {
            let d = k.sub(v, safe4);
            let e = k.exp(d);
            let h = hsum(k, e);
            acc = k.add(acc, h);
        }
        k.set(s, acc);
        k.set(m, cm);
    }

    /// `m == -inf ? 0 : m`: the shift that keeps a fully masked row finite.
    fn safe(k: &mut KernelBuilder, m: Val) -> Val {
        let ninf = k.const_f32(f32::NEG_INFINITY);
        let zero = k.const_f32(0.0);
        let none = k.eq(m, ninf);
        k.select(none, zero, m)
    }

    /// Writes the row's log-sum-exp (`safe` + ln `sum`) from its first lane.
    fn store_lse(k: &mut KernelBuilder, c: &Ctx, lse: Option<Buffer>, safe: Val, sum: Val) {
        let Some(lse) = lse else { return };
        let l = k.log(sum);
        let v = k.add(safe, l);
        let zero = k.u32(0);
        let first = k.eq(c.lane, zero);
        let mine = k.and(first, c.valid);
        k.if_(mine, |k| k.store(lse, c.unit, v));
    }

    fn forward_body(
        &self,
        k: &mut KernelBuilder,
        groups: &mut Groups,
        c: &Ctx,
        x: Buffer,
        y: Buffer,
        lse: Option<Buffer>,
    ) {
        let first = c.row.first_slot(k);
        let end_slot = c.row.end_slot(k);
        let v4 = Ty::vector(Scalar::F32, 4);
        match self.variant {
            SoftmaxVariant::Cached { slots } => {
                let mut held = Vec::new();
                for j in 0..u32::from(slots) {
                    let jv = k.u32(j);
                    let off = k.mul(c.threads, jv);
                    let s0 = k.add(first, c.lane);
                    let slot = k.add(s0, off);
                    let inside = k.lt(slot, end_slot);
                    let st = self.storage;
                    let row = c.row;
                    let v = k.if_value(
                        inside,
                        v4,
                        |k| row.load(k, x, st, slot, f32::NEG_INFINITY),
                        |k| k.const_float(v4, f32::NEG_INFINITY),
                    );
                    let xs = self.scaled(k, c, slot, v);
                    held.push((slot, inside, xs));
                }
                let mut m = k.const_f32(f32::NEG_INFINITY);
                for &(_, _, xs) in &held {
                    let h = hreduce(k, ReduceOp::Max, xs);
                    m = k.max(m, h);
                }
                let mx = groups.reduce(k, ReduceOp::Max, m);
                let safe = Self::safe(k, mx);
                let sv = k.splat(safe, 4);
                let mut s = k.const_f32(0.0);
                for &(_, _, xs) in &held {
                    let d = k.sub(xs, sv);
                    let e = k.exp(d);
                    let h = hsum(k, e);
                    s = k.add(s, h);
                }
                let sum = groups.reduce(k, ReduceOp::Add, s);
                Self::store_lse(k, c, lse, safe, sum);
                let st = self.stats(k, safe, sum);
                for (slot, inside, xs) in held {
                    let out = self.output(k, xs, &st);
                    let row = c.row;
                    let storage = self.storage;
                    k.if_(inside, |k| row.store(k, y, storage, slot, out));
                }
            }
            SoftmaxVariant::Streaming { unroll } => {
                // Pass 1: online max and sum per invocation; full slots skip the bounds checks.
                let ninf = k.const_f32(f32::NEG_INFINITY);
                let m = k.var_init(ninf);
                let zero = k.const_f32(0.0);
                let s = k.var_init(zero);
                let (unroll, st) = (u32::from(unroll), self.storage);
                c.row.walk(
                    k,
                    c.lane,
                    c.threads,
                    unroll,
                    |k, slots| {
                        let xs = self.load_full(k, c, x, slots);
                        Self::absorb(k, m, s, &xs);
                    },
                    |k, sl| {
                        let xs = self.load_edge(k, c, x, sl);
                        Self::absorb(k, m, s, &[xs]);
                    },
                );
                let mv = k.get(m);
                let mx = groups.reduce(k, ReduceOp::Max, mv);
                let safe = Self::safe(k, mx);
                let d = k.sub(mv, safe);
                let r = k.exp(d);
                let sv = k.get(s);
                let mine = k.mul(sv, r);
                let sum = groups.reduce(k, ReduceOp::Add, mine);
                Self::store_lse(k, c, lse, safe, sum);
                let stats = self.stats(k, safe, sum);
                // Pass 2: the output.
                c.row.walk(
                    k,
                    c.lane,
                    c.threads,
                    unroll,
                    |k, slots| {
                        let xs = self.load_full(k, c, x, slots);
                        for (&sl, xs) in slots.iter().zip(xs) {
                            let out = self.output(k, xs, &stats);
                            store_f32(k, y, sl, out, st);
                        }
                    },
                    |k, sl| {
                        let xs = self.load_edge(k, c, x, sl);
                        let out = self.output(k, xs, &stats);
                        c.row.store(k, y, st, sl, out);
                    },
                );
            }
        }
    }

    /// The per-slot term of the backward sum (dy masked; times y for softmax).
    fn bwd_term(&self, k: &mut KernelBuilder, c: &Ctx, slot: Val, y: Val, dy: Val) -> Val {
        let keep = self.keep(k, c, slot);
        let zero = k.const_float(dy.ty, 0.0);
        let dy = k.select(keep, dy, zero);
        let t = if self.log { dy } else { k.mul(y, dy) };
        hsum(k, t)
    }

    /// dx lanes of a slot given the row's sum.
    fn bwd_out(
        &self,
        k: &mut KernelBuilder,
        c: &Ctx,
        slot: Val,
        y: Val,
        dy: Val,
        total: Val,
    ) -> Val {
        let keep = self.keep(k, c, slot);
        let t = k.splat(total, 4);
        let g = if self.log {
            let e = k.exp(y);
            let et = k.mul(e, t);
            k.sub(dy, et)
        } else {
            let d = k.sub(dy, t);
            k.mul(y, d)
        };
        let s = k.splat(c.scale, 4);
        let g = k.mul(g, s);
        let zero = k.const_float(g.ty, 0.0);
        k.select(keep, g, zero)
    }

    fn backward_body(
        &self,
        k: &mut KernelBuilder,
        groups: &mut Groups,
        c: &Ctx,
        yb: Buffer,
        dyb: Buffer,
        dxb: Buffer,
    ) {
        let first = c.row.first_slot(k);
        let end_slot = c.row.end_slot(k);
        let v4 = Ty::vector(Scalar::F32, 4);
        let st = self.storage;
        match self.variant {
            SoftmaxVariant::Cached { slots } => {
                let mut held = Vec::new();
                let mut acc = k.const_f32(0.0);
                for j in 0..u32::from(slots) {
                    let jv = k.u32(j);
                    let off = k.mul(c.threads, jv);
                    let s0 = k.add(first, c.lane);
                    let slot = k.add(s0, off);
                    let inside = k.lt(slot, end_slot);
                    let row = c.row;
                    let load = |k: &mut KernelBuilder, b: Buffer| {
                        k.if_value(
                            inside,
                            v4,
                            |k| row.load(k, b, st, slot, 0.0),
                            |k| k.const_float(v4, 0.0),
                        )
                    };
                    let y = load(k, yb);
                    let dy = load(k, dyb);
                    let t = self.bwd_term(k, c, slot, y, dy);
                    acc = k.add(acc, t);
                    held.push((slot, inside, y, dy));
                }
                let total = groups.reduce(k, ReduceOp::Add, acc);
                for (slot, inside, y, dy) in held {
                    let dx = self.bwd_out(k, c, slot, y, dy, total);
                    let row = c.row;
                    k.if_(inside, |k| row.store(k, dxb, st, slot, dx));
                }
            }
            SoftmaxVariant::Streaming { unroll } => {
                let zero = k.const_f32(0.0);
                let acc = k.var_init(zero);
                let unroll = u32::from(unroll);
                // (y, dy) of a slot, 0 outside the row.
                let load = |k: &mut KernelBuilder, sl: Val| {
                    let y = c.row.load(k, yb, st, sl, 0.0);
                    let dy = c.row.load(k, dyb, st, sl, 0.0);
                    (y, dy)
                };
                for_each_slot_by(k, first, end_slot, c.lane, c.threads, unroll, |k, slots| {
                    let loaded: Vec<(Val, Val)> = slots.iter().map(|&sl| load(k, sl)).collect();
                    let mut a = k.get(acc);
                    for (&sl, (y, dy)) in slots.iter().zip(loaded) {
                        let t = self.bwd_term(k, c, sl, y, dy);
                        a = k.add(a, t);
                    }
                    k.set(acc, a);
                });
                let mine = k.get(acc);
                let total = groups.reduce(k, ReduceOp::Add, mine);
                for_each_slot_by(k, first, end_slot, c.lane, c.threads, unroll, |k, slots| {
                    let loaded: Vec<(Val, Val)> = slots.iter().map(|&sl| load(k, sl)).collect();
                    for (&sl, (y, dy)) in slots.iter().zip(loaded) {
                        let dx = self.bwd_out(k, c, sl, y, dy, total);
                        c.row.store(k, dxb, st, sl, dx);
                    }
                });
            }
        }
    }

    /// Grid and push constants for `layout` (its `threads` from `select`); `buffers` are the
    /// device addresses in declaration order (forward: x, y and lse when built with it;
    /// backward: y, dy, dx).
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        layout: RowLaunch,
        causal_rows: u32,
        scale: f32,
        buffers: &[u64],
    ) -> Result<Launch, KernelError> {
        let RowLaunch { rows, len, threads } = layout;
        if !threads.is_power_of_two() || threads > geometry.workgroup {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: format!(
                    "{threads} invocations per row in a workgroup of {}",
                    geometry.workgroup
                ),
            });
        }
        let want = if self.backward {
            3
        } else {
            2 + usize::from(self.lse)
        };
        if buffers.len() != want {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: format!("expects {want} buffers, got {}", buffers.len()),
            });
        }
        let mut args = Args::new();
        if self.binding == Binding::DeviceAddress {
            args.extend(buffers.iter().map(|&a| Arg::Address(a)));
        }
        args.extend([rows, len, causal_rows.max(1), threads.trailing_zeros()].map(Arg::U32));
        args.push(Arg::F32(scale));
        let per = (geometry.workgroup / threads).max(1);
        let groups = grid(
            u64::from(rows).div_ceil(u64::from(per)),
            geometry.max_groups_x,
        )?;
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }

    /// A representative set of kernels for validation.
    pub fn samples(binding: Binding) -> Vec<SoftmaxKernel> {
        let variants = [
            SoftmaxVariant::Cached { slots: 6 },
            SoftmaxVariant::Cached { slots: 2 },
            SoftmaxVariant::Streaming { unroll: 4 },
        ];
        let reducers = [
            Reducer::Subgroup {
                block: 32,
                whole: true,
            },
            Reducer::SharedTree,
        ];
        let mut out = Vec::new();
        for (i, variant) in variants.into_iter().enumerate() {
            for log in [false, true] {
                for backward in [false, true] {
                    out.push(SoftmaxKernel {
                        log,
                        backward,
                        causal: (i + usize::from(log)) % 2 == 0,
                        storage: Storage::ALL[(i + usize::from(backward)) % 3],
                        variant,
                        reducer: reducers[(i + usize::from(backward)) % 2],
                        workgroup: 256,
                        binding,
                        whole: log,
                        lse: !log && !backward && i != 1,
                        prefix: !log && (i + usize::from(log)) % 2 == 0,
                    });
                }
            }
        }
        out
    }
}

/// Per-row values every part of the kernel uses.
struct Ctx {
    row: Row,
    lane: Val,
    threads: Val,
    causal_i: Option<Val>,
    scale: Val,
    /// The row's index and whether it is one of the launch's rows.
    unit: Val,
    valid: Val,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::RowVariant;

    #[test]
    fn selection() {
        let cfg = RowConfig::default();
        let cached = |slots| SoftmaxVariant::Cached { slots };
        let pick = |len, bwd, cfg: &RowConfig| {
            let c = select(len, bwd, cfg, 1024);
            (c.variant, c.threads, c.workgroup)
        };
        // 6 slots a thread cover a row of 768 (and of 3072): rounded up to 8.
        assert_eq!(pick(768, false, &cfg), (cached(8), 32, 256));
        assert_eq!(pick(3072, false, &cfg), (cached(8), 128, 256));
        assert_eq!(pick(1024, false, &cfg), (cached(8), 32, 256));
        // Rows growing one element at a time take four cached kernels in all.
        let mut kinds: Vec<u8> = (1..=4096)
            .map(|len| match pick(len, false, &cfg).0 {
                SoftmaxVariant::Cached { slots } => slots,
                SoftmaxVariant::Streaming { .. } => 0,
            })
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        assert_eq!(kinds, [1, 2, 4, 8]);
        assert_eq!(pick(3, true, &cfg), (cached(2), 1, 256));
        let streamed = SoftmaxVariant::Streaming { unroll: 4 };
        assert_eq!(pick(50257, false, &cfg), (streamed, 1024, 1024));
        let forced = RowConfig {
            variant: RowVariant::Streaming,
            unroll: Some(4),
            ..cfg
        };
        let c = select(768, false, &forced, 1024);
        assert_eq!(c.variant, SoftmaxVariant::Streaming { unroll: 4 });
        assert_eq!(c.threads, 16);
    }
}
