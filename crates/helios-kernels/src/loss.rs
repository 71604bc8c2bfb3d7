//! Cross-entropy over the last axis, fused with the logits: per-row loss, the mean over the
//! rows whose target is not ignored, and (in the same pass over each row) dlogits.
//!
//! The one decision a reader must know: one workgroup owns one row of `vocab` logits and
//! makes at most two passes over it. Pass 1 reads the row once with vec4 loads and keeps an
//! online max / sum-of-exponentials per invocation (`m`, `s`, rescaled when `m` grows), which
//! are combined across the workgroup; pass 2 (only with the gradient) reads the row again and
//! writes `dlogits = (softmax − onehot) · scale / count`. Logits are never materialised as
//! probabilities or log-probabilities, so forward+backward moves 2 reads + 1 write of the
//! logits (PyTorch's log_softmax → nll → backward chain moves about 6). The mean is
//! deterministic: rows write their losses, and one workgroup sums them in a fixed order (no
//! float atomics anywhere).
//!
//! Three kernels, always dispatched as count → rows → mean:
//! - `Count` (one workgroup): `stats = [scale / count, count]`, count = rows whose target is
//!   not `ignore_index` (`scale / count` is 0 when every row is ignored);
//! - `Rows` (one workgroup per row): `row_loss[r]`, and `dlogits` when `grad`;
//! - `Mean` (one workgroup): `loss[0] = Σ row_loss / count`, 0 when every row is ignored.
//!
//! A row whose target is `ignore_index` is not read: its loss and gradient are exactly 0. A
//! target outside `[0, vocab)` that is not ignored gives NaN loss and NaN gradient for its row
//! (the tensor layer rejects such targets first when it knows them on the host). Any NaN
//! logit in a row makes that row's loss and gradient NaN; the NaN test is explicit because
//! some `exp` implementations (llvmpipe's) clamp their argument and would hide it.

use helios_spirv::{
    Access, Binding, GroupMode, KernelBuilder, KernelModule, ReduceOp, Scalar, Shared, SharedLen,
    Ty, Val,
};

use crate::launch::{grid, pack_push, Arg, Geometry, Launch};
use crate::storage::{buffer_scalar, load_f32, store_f32, Storage};
use crate::KernelError;

/// Default workgroup size of the cross-entropy kernels.
pub const CROSS_ENTROPY_WORKGROUP: u32 = 256;

/// Which of the three cross-entropy kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrossEntropyStage {
    /// Counts the non-ignored rows: `stats = [scale / count, count]`.
    Count,
    /// One workgroup per row: the row's loss, and dlogits when `grad`.
    Rows { grad: bool },
    /// The mean of the row losses over the counted rows.
    Mean,
}

/// The signature of a cross-entropy kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CrossEntropyKernel {
    pub stage: CrossEntropyStage,
    /// Storage of logits and dlogits (losses are always f32). `F32` for `Count` and `Mean`,
    /// which never touch logits.
    pub storage: Storage,
    pub binding: Binding,
}

/// One cross-entropy problem: `rows` rows of `vocab` logits, and the device addresses of its
/// buffers (ignored where the binding model passes descriptors instead).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyArgs {
    pub rows: u32,
    pub vocab: u32,
    pub ignore_index: i32,
    /// Upstream gradient of the mean loss (1 for a loss that is the objective itself).
    pub scale: f32,
    /// (rows, vocab) in the kernel's storage.
    pub logits: u64,
    /// (rows,) i32.
    pub targets: u64,
    /// (2,) f32: [scale / count, count].
    pub stats: u64,
    /// (rows,) f32.
    pub row_loss: u64,
    /// (rows, vocab) in the kernel's storage; only for `Rows { grad: true }`.
    pub dlogits: u64,
    /// (1,) f32.
    pub loss: u64,
}

impl CrossEntropyKernel {
    /// The kernel of `stage` (the storage only matters to `Rows`).
    pub fn new(stage: CrossEntropyStage, storage: Storage, binding: Binding) -> Self {
        let storage = match stage {
            CrossEntropyStage::Rows { .. } => storage,
            _ => Storage::F32,
        };
        CrossEntropyKernel {
            stage,
            storage,
            binding,
        }
    }

    /// Every cross-entropy kernel for `binding`, for validation and warm-up.
    pub fn all(binding: Binding) -> Vec<CrossEntropyKernel> {
        let mut out = vec![
            Self::new(CrossEntropyStage::Count, Storage::F32, binding),
            Self::new(CrossEntropyStage::Mean, Storage::F32, binding),
        ];
        for s in Storage::ALL {
            for grad in [false, true] {
                out.push(Self::new(CrossEntropyStage::Rows { grad }, s, binding));
            }
        }
        out
    }

    pub fn name(&self) -> String {
        match self.stage {
            CrossEntropyStage::Count => "ce_count".into(),
            CrossEntropyStage::Mean => "ce_mean".into(),
            CrossEntropyStage::Rows { grad: false } => format!("ce_rows_{}", self.storage.name()),
            CrossEntropyStage::Rows { grad: true } => {
                format!("ce_rows_grad_{}", self.storage.name())
            }
        }
    }

    /// Emits the kernel (buffers and push constants in the order `launch` packs them).
    pub fn build(&self) -> KernelModule {
        let mut k = KernelBuilder::new(self.name(), self.binding, [CROSS_ENTROPY_WORKGROUP, 1, 1]);
        match self.stage {
            CrossEntropyStage::Count => build_count(&mut k),
            CrossEntropyStage::Rows { grad } => build_rows(&mut k, self.storage, grad),
            CrossEntropyStage::Mean => build_mean(&mut k),
        }
        k.finish()
    }

    /// Grid and push constants for `args`.
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        a: &CrossEntropyArgs,
    ) -> Result<Launch, KernelError> {
        let address = self.binding == Binding::DeviceAddress;
        let mut args = Vec::with_capacity(9);
        let addr = |args: &mut Vec<Arg>, v: u64| {
            if address {
                args.push(Arg::Address(v));
            }
        };
        let groups = match self.stage {
            CrossEntropyStage::Count => {
                addr(&mut args, a.targets);
                addr(&mut args, a.stats);
                args.extend([
                    Arg::U32(a.rows),
                    Arg::I32(a.ignore_index),
                    Arg::F32(a.scale),
                ]);
                [1, 1, 1]
            }
            CrossEntropyStage::Rows { grad } => {
                addr(&mut args, a.logits);
                addr(&mut args, a.targets);
                if grad {
                    addr(&mut args, a.stats);
                }
                addr(&mut args, a.row_loss);
                if grad {
                    addr(&mut args, a.dlogits);
                }
                args.extend([
                    Arg::U32(a.rows),
                    Arg::U32(a.vocab),
                    Arg::I32(a.ignore_index),
                ]);
                grid(u64::from(a.rows), geometry.max_groups_x)?
            }
            CrossEntropyStage::Mean => {
                addr(&mut args, a.row_loss);
                addr(&mut args, a.stats);
                addr(&mut args, a.loss);
                args.push(Arg::U32(a.rows));
                [1, 1, 1]
            }
        };
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }
}

// ------------------------------------------------------------------ shared building blocks

/// The linear index of this workgroup in a grid folded into rows (see `launch::grid`).
pub(crate) fn group_index(k: &mut KernelBuilder) -> Val {
    let wid = k.workgroup_id();
    let nwg = k.num_workgroups();
    let (gx, gy, nx) = (k.extract(wid, 0), k.extract(wid, 1), k.extract(nwg, 0));
    let row = k.mul(gy, nx);
    k.add(row, gx)
}

/// Combines `v` over the whole workgroup and gives every invocation the result: a subgroup
/// reduction, then each invocation folds the per-subgroup partials of `scratch` (one slot
/// per invocation is enough for any subgroup size) in subgroup order. Deterministic: the
/// same pipeline on the same device combines in the same order every time. Must be reached
/// by every invocation (workgroup-uniform control flow).
pub(crate) fn workgroup_reduce(
    k: &mut KernelBuilder,
    op: ReduceOp,
    v: Val,
    scratch: Shared,
) -> Val {
    let r = k.subgroup_reduce(op, GroupMode::Reduce, v);
    let sid = k.subgroup_id();
    let lane = k.subgroup_invocation_id();
    let zero = k.u32(0);
    let first = k.eq(lane, zero);
    k.if_(first, |k| k.shared_store(scratch, sid, r));
    k.workgroup_barrier();
    let acc = k.shared_load(scratch, zero);
    let acc = k.var_init(acc);
    let nsg = k.num_subgroups();
    let one = k.u32(1);
    k.for_range(one, nsg, one, |k, i| {
        let p = k.shared_load(scratch, i);
        let a = k.get(acc);
        let c = match op {
            ReduceOp::Add => k.add(a, p),
            ReduceOp::Mul => k.mul(a, p),
            ReduceOp::Min => k.min(a, p),
            ReduceOp::Max => k.max(a, p),
        };
        k.set(acc, c);
    });
    // Nobody may overwrite `scratch` (a next reduction) before everyone has read it.
    k.workgroup_barrier();
    k.get(acc)
}

/// `lid == 0`.
fn is_first(k: &mut KernelBuilder) -> Val {
    let lid = k.local_index();
    let zero = k.u32(0);
    k.eq(lid, zero)
}

// ------------------------------------------------------------------ count and mean

fn build_count(k: &mut KernelBuilder) {
    let u32t = Ty::scalar(Scalar::U32);
    let targets = k.buffer("targets", Scalar::I32, Access::Read);
    let stats = k.buffer("stats", Scalar::F32, Access::Write);
    let rows = k.param("rows", u32t);
    let ignore = k.param("ignore_index", Ty::scalar(Scalar::I32));
    let scale = k.param("scale", Ty::scalar(Scalar::F32));
    k.begin();
    let scratch = k.shared_array(u32t, SharedLen::WorkgroupX);
    let (rows, ignore, scale) = (
        k.load_param(rows),
        k.load_param(ignore),
        k.load_param(scale),
    );
    let lid = k.local_index();
    let wg = k.workgroup_size_x();
    let zero = k.u32(0);
    let acc = k.var_init(zero);
    k.for_range(lid, rows, wg, |k, i| {
        let t = k.load(targets, i, 1);
        let counted = k.ne(t, ignore);
        let (one, zero) = (k.u32(1), k.u32(0));
        let inc = k.select(counted, one, zero);
        let a = k.get(acc);
        let a = k.add(a, inc);
        k.set(acc, a);
    });
    let mine = k.get(acc);
    let total = workgroup_reduce(k, ReduceOp::Add, mine, scratch);
    let first = is_first(k);
    k.if_(first, |k| {
        let count = k.convert(total, Scalar::F32);
        let some = k.gt(total, zero);
        let ratio = k.div(scale, count);
        let fzero = k.const_f32(0.0);
        let norm = k.select(some, ratio, fzero);
        let (i0, i1) = (k.u32(0), k.u32(1));
        k.store(stats, i0, norm);
        k.store(stats, i1, count);
    });
}

fn build_mean(k: &mut KernelBuilder) {
    let f32t = Ty::scalar(Scalar::F32);
    let row_loss = k.buffer("row_loss", Scalar::F32, Access::Read);
    let stats = k.buffer("stats", Scalar::F32, Access::Read);
    let loss = k.buffer("loss", Scalar::F32, Access::Write);
    let rows = k.param("rows", Ty::scalar(Scalar::U32));
    k.begin();
    let scratch = k.shared_array(f32t, SharedLen::WorkgroupX);
    let rows = k.load_param(rows);
    let lid = k.local_index();
    let wg = k.workgroup_size_x();
    let fzero = k.const_f32(0.0);
    let acc = k.var_init(fzero);
    // Each invocation sums a fixed strided subset in order; the workgroup then combines the
    // partial sums in a fixed order: the same bits every run.
    k.for_range(lid, rows, wg, |k, i| {
        let l = k.load(row_loss, i, 1);
        let a = k.get(acc);
        let a = k.add(a, l);
        k.set(acc, a);
    });
    let mine = k.get(acc);
    let total = workgroup_reduce(k, ReduceOp::Add, mine, scratch);
    let first = is_first(k);
    k.if_(first, |k| {
        let i1 = k.u32(1);
        let count = k.load(stats, i1, 1);
        let some = k.gt(count, fzero);
        let mean = k.div(total, count);
        let mean = k.select(some, mean, fzero);
        let i0 = k.u32(0);
        k.store(loss, i0, mean);
    });
}

// ------------------------------------------------------------------ rows

/// Where the elements of one row lie: `[base, head_end)` before the first whole vec4,
/// vec4s `[vstart, vend)`, and `[tail_start, end)` after the last one (head and tail hold at
/// most 3 elements each; row starts are not vec4-aligned when `vocab % 4 != 0`).
struct RowSpan {
    vstart: Val,
    vend: Val,
    /// This invocation's head or tail element (invocations 0-2: head, 3-5: tail) and whether
    /// it exists.
    extra: Val,
    has_extra: Val,
}

fn row_span(k: &mut KernelBuilder, base: Val, vocab: Val) -> RowSpan {
    let end = k.add(base, vocab);
    let (two, three) = (k.u32(2), k.u32(3));
    let b3 = k.add(base, three);
    let vstart = k.shr(b3, two);
    let vend = k.shr(end, two);
    let vend = k.max(vend, vstart);
    let vs4 = k.shl(vstart, two);
    let head_end = k.min(vs4, end);
    let ve4 = k.shl(vend, two);
    let tail_start = k.max(ve4, head_end);
    let lid = k.local_index();
    let is_head = k.lt(lid, three);
    let e_head = k.add(base, lid);
    let l3 = k.sub(lid, three); // wraps for the head invocations, whose lane is not used
    let e_tail = k.add(tail_start, l3);
    let extra = k.select(is_head, e_head, e_tail);
    let limit = k.select(is_head, head_end, end);
    let six = k.u32(6);
    let lt6 = k.lt(lid, six);
    let inside = k.lt(extra, limit);
    let has_extra = k.and(lt6, inside);
    RowSpan {
        vstart,
        vend,
        extra,
        has_extra,
    }
}

/// Runs `f(k, index, lanes)` over every element of the row: this invocation's head/tail
/// element (lanes 1) and its vec4s (lanes 4, coalesced across the workgroup).
fn for_row(k: &mut KernelBuilder, span: &RowSpan, mut f: impl FnMut(&mut KernelBuilder, Val, u8)) {
    k.if_(span.has_extra, |k| f(k, span.extra, 1));
    let lid = k.local_index();
    let wg = k.workgroup_size_x();
    let first = k.add(span.vstart, lid);
    k.for_range(first, span.vend, wg, |k, v| f(k, v, 4));
}

/// Sum of the lanes of a float value.
fn lane_sum(k: &mut KernelBuilder, x: Val) -> Val {
    if x.ty.lanes == 1 {
        return x;
    }
    let one = k.const_float(x.ty, 1.0);
    k.dot(x, one)
}

/// Maximum of the lanes (NaN handling is the caller's: see the module docs).
fn lane_max(k: &mut KernelBuilder, x: Val) -> Val {
    let mut m = k.extract(x, 0);
    for i in 1..u32::from(x.ty.lanes) {
        let l = k.extract(x, i);
        m = k.max(m, l);
    }
    m
}

fn build_rows(k: &mut KernelBuilder, s: Storage, grad: bool) {
    let f32t = Ty::scalar(Scalar::F32);
    let u32t = Ty::scalar(Scalar::U32);
    let logits = k.buffer("logits", buffer_scalar(s), Access::Read);
    let targets = k.buffer("targets", Scalar::I32, Access::Read);
    let stats = grad.then(|| k.buffer("stats", Scalar::F32, Access::Read));
    let row_loss = k.buffer("row_loss", Scalar::F32, Access::Write);
    let dlogits = grad.then(|| k.buffer("dlogits", buffer_scalar(s), Access::Write));
    let rows = k.param("rows", u32t);
    let vocab = k.param("vocab", u32t);
    let ignore = k.param("ignore_index", Ty::scalar(Scalar::I32));
    k.begin();
    let scratch = k.shared_array(f32t, SharedLen::WorkgroupX);
    let (rows, vocab, ignore) = (
        k.load_param(rows),
        k.load_param(vocab),
        k.load_param(ignore),
    );
    let row = group_index(k);
    let in_grid = k.lt(row, rows);
    // Workgroup-uniform branches only: the reductions inside need every invocation.
    k.if_(in_grid, |k| {
        let t = k.load(targets, row, 1);
        let ignored = k.eq(t, ignore);
        let tu = k.bitcast(t, u32t);
        let valid = k.lt(tu, vocab);
        let base = k.mul(row, vocab);
        let span = row_span(k, base, vocab);
        let fzero = k.const_f32(0.0);
        let nan = k.const_f32(f32::NAN);
        k.if_else(
            ignored,
            |k| {
                let first = is_first(k);
                k.if_(first, |k| k.store(row_loss, row, fzero));
                if let Some(d) = dlogits {
                    for_row(k, &span, |k, i, lanes| {
                        let z = k.const_float(Ty::vector(Scalar::F32, lanes), 0.0);
                        store_f32(k, d, i, z, s);
                    });
                }
            },
            |k| {
                // Pass 1: online max and sum of exp(x − max), per invocation.
                let lowest = k.const_f32(-f32::MAX);
                let m = k.var_init(lowest);
                let sum = k.var_init(fzero);
                let no = k.bool(false);
                let bad = k.var_init(no);
                for_row(k, &span, |k, i, lanes| {
                    let x = load_f32(k, logits, i, lanes, s);
                    let mold = k.get(m);
                    let mx = lane_max(k, x);
                    let mnew = k.max(mold, mx);
                    let dm = k.sub(mold, mnew);
                    let f = k.exp(dm);
                    let ms = k.splat(mnew, lanes);
                    let d = k.sub(x, ms);
                    let e = k.exp(d);
                    let es = lane_sum(k, e);
                    let so = k.get(sum);
                    let sn = k.fma(so, f, es);
                    k.set(sum, sn);
                    k.set(m, mnew);
                    let xn = k.is_nan(x);
                    let xn = k.any(xn);
                    let b = k.get(bad);
                    let b = k.or(b, xn);
                    k.set(bad, b);
                });
                let (mi, si, bi) = (k.get(m), k.get(sum), k.get(bad));
                let si = k.select(bi, nan, si);
                let mmax = workgroup_reduce(k, ReduceOp::Max, mi, scratch);
                let dm = k.sub(mi, mmax);
                let f = k.exp(dm);
                let sc = k.mul(si, f);
                let ssum = workgroup_reduce(k, ReduceOp::Add, sc, scratch);
                let sn = k.is_nan(ssum);
                let mn = k.is_nan(mmax);
                let row_bad = k.or(sn, mn);
                let first = is_first(k);
                k.if_(first, |k| {
                    let xt = k.if_value(
                        valid,
                        f32t,
                        |k| {
                            let at = k.add(base, tu);
                            load_f32(k, logits, at, 1, s)
                        },
                        |_| nan,
                    );
                    let lse = k.log(ssum);
                    let d = k.sub(mmax, xt);
                    let l = k.add(lse, d);
                    let ok = k.not(row_bad);
                    let ok = k.and(ok, valid);
                    let l = k.select(ok, l, nan);
                    k.store(row_loss, row, l);
                });
                // Pass 2: dlogits = (exp(x − max) / sum − onehot) · norm.
                if let (Some(stats), Some(d)) = (stats, dlogits) {
                    let i0 = k.u32(0);
                    let norm = k.load(stats, i0, 1);
                    let ok = k.not(row_bad);
                    let ok = k.and(ok, valid);
                    let norm = k.select(ok, norm, nan);
                    let one = k.const_f32(1.0);
                    let inv = k.div(one, ssum);
                    let target = k.add(base, tu);
                    let two = k.u32(2);
                    let lane_ids = [0u32, 1, 2, 3].map(|l| k.u32(l));
                    for_row(k, &span, |k, i, lanes| {
                        let x = load_f32(k, logits, i, lanes, s);
                        let ms = k.splat(mmax, lanes);
                        let dx = k.sub(x, ms);
                        let e = k.exp(dx);
                        let invs = k.splat(inv, lanes);
                        let p = k.mul(e, invs);
                        // Element indices of these lanes, compared with the target's.
                        let idx = if lanes == 1 {
                            i
                        } else {
                            let first = k.shl(i, two);
                            let parts: Vec<Val> = lane_ids[..lanes as usize]
                                .iter()
                                .map(|&l| k.add(first, l))
                                .collect();
                            k.vector(&parts)
                        };
                        let ts = k.splat(target, lanes);
                        let hit = k.eq(idx, ts);
                        let vty = Ty::vector(Scalar::F32, lanes);
                        let (o, z) = (k.const_float(vty, 1.0), k.const_float(vty, 0.0));
                        let oh = k.select(hit, o, z);
                        let g = k.sub(p, oh);
                        let ns = k.splat(norm, lanes);
                        let g = k.mul(g, ns);
                        store_f32(k, d, i, g, s);
                    });
                }
            },
        );
    });
}
