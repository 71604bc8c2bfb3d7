//! Cross-entropy over the last axis, fused with the logits: per-row loss, the mean over the
//! rows whose target is not ignored, and (in the same pass over each row) dlogits.
//!
//! The one decision a reader must know: one group of invocations owns one row of `vocab`
//! logits (a whole workgroup for a vocabulary like 50257, fewer invocations and several rows
//! per workgroup for short rows) and makes at most two passes over it. Pass 1 reads the row once with vec4 loads and keeps an
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
//! - `Rows` (one group per row): `row_loss[r]`, and `dlogits` when `grad`;
//! - `Mean` (one workgroup): `loss[0] = Σ row_loss / count`, 0 when every row is ignored.
//!
//! Or four, count → stats → grad-cols → mean, for dlogits stored column-major: `Stats` is
//! `Rows` without the gradient, keeping each row's max and 1/Σexp, and `GradCols` writes
//! the same values as pass 2 (bit for bit) through 32×32 tiles in shared memory, as the
//! tiled transpose moves them. A product reading dlogits down its columns (the head's
//! input gradient, k = the vocabulary) then reads it as it is, where row-major dlogits
//! would first take a transposing copy: one more read and write of the logits' size.
//!
//! Rows lie `stride` elements apart (at least `vocab`, a push constant): the first `vocab`
//! of each are the classes, so a padded vocabulary's (rows, Vp) logits are read in place,
//! and the gradient's columns `vocab..stride` are written as zeros.
//!
//! Rows are walked with the shared row machinery (`rows`): 16-byte slots aligned to the
//! buffer (rows of an odd vocabulary need no padding), `unroll` slots in flight per
//! invocation, and group reductions over the whole workgroup (subgroups, or a shared-memory
//! tree under `HELIOS_NO_SUBGROUP=1`).
//!
//! A row whose target is `ignore_index` is not read: its loss and gradient are exactly 0. A
//! target outside `[0, vocab)` that is not ignored gives NaN loss and NaN gradient for its row
//! (the tensor layer rejects such targets first when it knows them on the host). Any NaN
//! logit in a row makes that row's loss and gradient NaN; the NaN test is explicit because
//! some `exp` implementations (llvmpipe's) clamp their argument and would hide it.

use helios_spirv::{Access, Binding, KernelBuilder, KernelModule, ReduceOp, Scalar, Ty, Val};

use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::rows::{
    for_each_slot_by, hreduce, hsum, linear_workgroup, row_slots, threads_for, Groups, Reducer, Row,
};
use crate::storage::{buffer_scalar, load_f32, store_f32, Storage};
use crate::transpose::{SharedTile, TRANSPOSE_TILE, TRANSPOSE_WORKGROUP};
use crate::KernelError;

/// Default workgroup size of the cross-entropy kernels.
pub const CROSS_ENTROPY_WORKGROUP: u32 = 256;
/// Edge of the square tile `GradCols` moves through shared memory (the tiled transpose's).
const COLS_TILE: u32 = TRANSPOSE_TILE;

/// Which of the cross-entropy kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrossEntropyStage {
    /// Counts the non-ignored rows: `stats = [scale / count, count]`.
    Count,
    /// One workgroup per row: the row's loss, and dlogits when `grad`.
    Rows { grad: bool },
    /// `Rows { grad: false }` that also stores each row's max and 1/Σexp for `GradCols` (NaN
    /// for a row whose gradient is NaN).
    Stats,
    /// dlogits column-major, (stride, rows) dense, from `Stats`' row statistics.
    GradCols,
    /// The mean of the row losses over the counted rows.
    Mean,
}

/// Device and tuning facts the kernels depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CrossEntropySetup {
    pub reducer: Reducer,
    /// Invocations per workgroup (a power of two).
    pub workgroup: u32,
    /// Slots (16-byte loads of f32, 8-byte of f16/bf16) per invocation per loop step.
    pub unroll: u8,
    pub binding: Binding,
}

/// The signature of a cross-entropy kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CrossEntropyKernel {
    pub stage: CrossEntropyStage,
    /// Storage of logits and dlogits (losses are always f32). `F32` for `Count` and `Mean`,
    /// which never touch logits.
    pub storage: Storage,
    pub setup: CrossEntropySetup,
}

/// One cross-entropy problem: `rows` rows of `vocab` logits, each row starting `stride`
/// elements after the one before, and the device addresses of its buffers (ignored where the
/// binding model passes descriptors instead).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyArgs {
    pub rows: u32,
    pub vocab: u32,
    /// Elements from one row's start to the next's, at least `vocab` (`vocab` for dense
    /// logits; a padded vocabulary's `Vp` for the first `vocab` columns of (rows, Vp)).
    pub stride: u32,
    /// Rows whose target equals this contribute nothing.
    pub ignore_index: Option<u32>,
    /// Upstream gradient of the mean loss (1 for a loss that is the objective itself).
    pub scale: f32,
    /// (rows, stride) in the kernel's storage, of which the first `vocab` of each row are read.
    pub logits: u64,
    /// (rows,) u32.
    pub targets: u64,
    /// (2,) f32: [scale / count, count].
    pub stats: u64,
    /// (rows,) f32.
    pub row_loss: u64,
    /// (rows, 2) f32: each row's max and 1/Σexp; only for `Stats` and `GradCols`.
    pub row_stats: u64,
    /// (rows, stride) in the kernel's storage, columns `vocab..stride` written as zeros;
    /// only for `Rows { grad: true }`. `GradCols` writes its transpose, (stride, rows).
    pub dlogits: u64,
    /// (1,) f32.
    pub loss: u64,
}

impl CrossEntropyKernel {
    /// The kernel of `stage` (the storage only matters to the stages that read logits).
    pub fn new(stage: CrossEntropyStage, storage: Storage, setup: CrossEntropySetup) -> Self {
        let storage = match stage {
            CrossEntropyStage::Count | CrossEntropyStage::Mean => Storage::F32,
            _ => storage,
        };
        CrossEntropyKernel {
            stage,
            storage,
            setup,
        }
    }

    /// Every cross-entropy kernel for `binding` (with both reducers), for validation.
    pub fn all(binding: Binding) -> Vec<CrossEntropyKernel> {
        let mut out = Vec::new();
        for reducer in [
            Reducer::Subgroup {
                block: 32,
                whole: true,
            },
            Reducer::SharedTree,
        ] {
            let setup = CrossEntropySetup {
                reducer,
                workgroup: CROSS_ENTROPY_WORKGROUP,
                unroll: 4,
                binding,
            };
            out.push(Self::new(CrossEntropyStage::Count, Storage::F32, setup));
            out.push(Self::new(CrossEntropyStage::Mean, Storage::F32, setup));
            for s in Storage::ALL {
                for stage in [
                    CrossEntropyStage::Rows { grad: false },
                    CrossEntropyStage::Rows { grad: true },
                    CrossEntropyStage::Stats,
                    CrossEntropyStage::GradCols,
                ] {
                    out.push(Self::new(stage, s, setup));
                }
            }
        }
        out
    }

    pub fn name(&self) -> String {
        let tag = format!("{}_w{}", self.setup.reducer.tag(), self.setup.workgroup);
        match self.stage {
            CrossEntropyStage::Count => format!("ce_count_{tag}"),
            CrossEntropyStage::Mean => format!("ce_mean_{tag}"),
            CrossEntropyStage::Rows { grad } => format!(
                "ce_rows{}_{}_{tag}_u{}",
                if grad { "_grad" } else { "" },
                self.storage.name(),
                self.setup.unroll
            ),
            CrossEntropyStage::Stats => format!(
                "ce_stats_{}_{tag}_u{}",
                self.storage.name(),
                self.setup.unroll
            ),
            CrossEntropyStage::GradCols => {
                format!("ce_grad_cols_{}_t{COLS_TILE}", self.storage.name())
            }
        }
    }

    /// Emits the kernel (buffers and push constants in the order `launch` packs them).
    pub fn build(&self) -> KernelModule {
        // The tiled gradient's workgroup is its tile's, whatever the rows' workgroup.
        let w = match self.stage {
            CrossEntropyStage::GradCols => TRANSPOSE_WORKGROUP,
            _ => self.setup.workgroup,
        };
        let mut k = KernelBuilder::new(self.name(), self.setup.binding, [w, 1, 1]);
        let groups = |k: &mut KernelBuilder| Groups::new(k, self.setup.reducer, w);
        match self.stage {
            CrossEntropyStage::Count => build_count(&mut k, groups),
            CrossEntropyStage::Rows { grad } => build_rows(&mut k, self, Out::rows(grad)),
            CrossEntropyStage::Stats => build_rows(&mut k, self, Out::Stats),
            CrossEntropyStage::GradCols => build_grad_cols(&mut k, self.storage),
            CrossEntropyStage::Mean => build_mean(&mut k, groups),
        }
        k.finish()
    }

    /// The family's selection function: invocations per row (a power of two up to the
    /// workgroup) so that each has about `4·unroll` slots of its row, as the streaming softmax.
    pub fn threads_per_row(&self, vocab: u32, workgroup: u32) -> u32 {
        let per = 4 * u32::from(self.setup.unroll.max(1));
        threads_for(row_slots(u64::from(vocab), 4), per, workgroup)
    }

    /// Grid and push constants for `args`.
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        a: &CrossEntropyArgs,
    ) -> Result<Launch, KernelError> {
        let address = self.setup.binding == Binding::DeviceAddress;
        let bufs: &[u64] = match self.stage {
            CrossEntropyStage::Count => &[a.targets, a.stats],
            CrossEntropyStage::Rows { grad: false } => &[a.logits, a.targets, a.row_loss],
            CrossEntropyStage::Rows { grad: true } => {
                &[a.logits, a.targets, a.stats, a.row_loss, a.dlogits]
            }
            CrossEntropyStage::Stats => &[a.logits, a.targets, a.row_loss, a.row_stats],
            CrossEntropyStage::GradCols => &[a.logits, a.targets, a.stats, a.row_stats, a.dlogits],
            CrossEntropyStage::Mean => &[a.row_loss, a.stats, a.loss],
        };
        let mut args = Args::new();
        if address {
            args.extend(bufs.iter().map(|&b| Arg::Address(b)));
        }
        let (ignoring, ignore) = match a.ignore_index {
            Some(i) => (1, i),
            None => (0, 0),
        };
        let groups = match self.stage {
            CrossEntropyStage::Count => {
                args.extend([Arg::U32(a.rows), Arg::U32(ignore), Arg::U32(ignoring)]);
                args.push(Arg::F32(a.scale));
                [1, 1, 1]
            }
            CrossEntropyStage::Rows { .. } | CrossEntropyStage::Stats => {
                let threads = self.threads_per_row(a.vocab, geometry.workgroup);
                let shift = threads.trailing_zeros();
                args.extend([a.rows, a.vocab, a.stride, ignore, ignoring, shift].map(Arg::U32));
                let per = u64::from(geometry.workgroup / threads);
                grid(u64::from(a.rows).div_ceil(per), geometry.max_groups_x)?
            }
            CrossEntropyStage::GradCols => {
                args.extend([a.rows, a.vocab, a.stride, ignore, ignoring].map(Arg::U32));
                let t = u64::from(COLS_TILE);
                let tiles = u64::from(a.rows).div_ceil(t) * u64::from(a.stride).div_ceil(t);
                grid(tiles, geometry.max_groups_x)?
            }
            CrossEntropyStage::Mean => {
                args.push(Arg::U32(a.rows));
                [1, 1, 1]
            }
        };
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }
}

/// `lid == 0`.
fn is_first(k: &mut KernelBuilder) -> Val {
    let lid = k.local_index();
    let zero = k.u32(0);
    k.eq(lid, zero)
}

/// Whether target `t` is ignored: `ignoring != 0 && t == ignore`.
fn ignored(k: &mut KernelBuilder, t: Val, ignore: Val, ignoring: Val) -> Val {
    let zero = k.u32(0);
    let on = k.ne(ignoring, zero);
    let same = k.eq(t, ignore);
    k.and(on, same)
}

// ------------------------------------------------------------------ count and mean

fn build_count(k: &mut KernelBuilder, groups: impl FnOnce(&mut KernelBuilder) -> Groups) {
    let u32t = Ty::scalar(Scalar::U32);
    let targets = k.buffer("targets", Scalar::U32, Access::Read);
    let stats = k.buffer("stats", Scalar::F32, Access::Write);
    let rows = k.param("rows", u32t);
    let ignore = k.param("ignore_index", u32t);
    let ignoring = k.param("ignoring", u32t);
    let scale = k.param("scale", Ty::scalar(Scalar::F32));
    k.begin();
    let mut g = groups(k);
    let (rows, scale) = (k.load_param(rows), k.load_param(scale));
    let (ignore, ignoring) = (k.load_param(ignore), k.load_param(ignoring));
    let lid = k.local_index();
    let wg = k.workgroup_size_x();
    let zero = k.u32(0);
    let acc = k.var_init(zero);
    k.for_range(lid, rows, wg, |k, i| {
        let t = k.load(targets, i, 1);
        let skip = ignored(k, t, ignore, ignoring);
        let (one, zero) = (k.u32(1), k.u32(0));
        let inc = k.select(skip, zero, one);
        let a = k.get(acc);
        let a = k.add(a, inc);
        k.set(acc, a);
    });
    let mine = k.get(acc);
    let total = g.reduce(k, ReduceOp::Add, mine);
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

fn build_mean(k: &mut KernelBuilder, groups: impl FnOnce(&mut KernelBuilder) -> Groups) {
    let row_loss = k.buffer("row_loss", Scalar::F32, Access::Read);
    let stats = k.buffer("stats", Scalar::F32, Access::Read);
    let loss = k.buffer("loss", Scalar::F32, Access::Write);
    let rows = k.param("rows", Ty::scalar(Scalar::U32));
    k.begin();
    let mut g = groups(k);
    let rows = k.load_param(rows);
    let lid = k.local_index();
    let wg = k.workgroup_size_x();
    let fzero = k.const_f32(0.0);
    let acc = k.var_init(fzero);
    // Each invocation sums a fixed strided subset in order, and the group reduction combines
    // the partial sums in a fixed order: the same bits every run.
    k.for_range(lid, rows, wg, |k, i| {
        let l = k.load(row_loss, i, 1);
        let a = k.get(acc);
        let a = k.add(a, l);
        k.set(acc, a);
    });
    let mine = k.get(acc);
    let total = g.reduce(k, ReduceOp::Add, mine);
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

/// What a row kernel stores besides each row's loss.
#[derive(Clone, Copy, PartialEq)]
enum Out {
    Loss,
    /// dlogits, row-major.
    Grad,
    /// Each row's max and 1/Σexp (`GradCols` computes dlogits from them).
    Stats,
}

impl Out {
    fn rows(grad: bool) -> Self {
        if grad {
            Out::Grad
        } else {
            Out::Loss
        }
    }
}

fn build_rows(k: &mut KernelBuilder, kernel: &CrossEntropyKernel, out: Out) {
    let grad = out == Out::Grad;
    let s = kernel.storage;
    let unroll = u32::from(kernel.setup.unroll.max(1));
    let f32t = Ty::scalar(Scalar::F32);
    let u32t = Ty::scalar(Scalar::U32);
    let logits = k.buffer("logits", buffer_scalar(s), Access::Read);
    let targets = k.buffer("targets", Scalar::U32, Access::Read);
    let stats = grad.then(|| k.buffer("stats", Scalar::F32, Access::Read));
    let row_loss = k.buffer("row_loss", Scalar::F32, Access::Write);
    let dlogits = grad.then(|| k.buffer("dlogits", buffer_scalar(s), Access::Write));
    let row_stats = (out == Out::Stats).then(|| k.buffer("row_stats", Scalar::F32, Access::Write));
    let params = [
        "rows",
        "vocab",
        "stride",
        "ignore_index",
        "ignoring",
        "group_shift",
    ];
    let params = params.map(|n| k.param(n, u32t));
    k.begin();
    let [rows, vocab, stride, ignore, ignoring, shift] = params.map(|p| k.load_param(p));
    let mut g = Groups::runtime(k, kernel.setup.reducer, shift);
    let threads = g.size();
    let lane = g.lane(k);
    let per = g.per_workgroup(k);
    let gi = g.group(k);
    let wg = linear_workgroup(k);
    let unit = k.mul(wg, per);
    let unit = k.add(unit, gi);
    // Groups past the last row still take part in the reductions (their barriers need the
    // whole workgroup) on row 0, and store nothing.
    let in_grid = k.lt(unit, rows);
    let zero = k.u32(0);
    let r = k.select(in_grid, unit, zero);
    let t = k.load(targets, r, 1);
    let skip = ignored(k, t, ignore, ignoring);
    let outside = k.not(in_grid);
    let skip = k.or(skip, outside);
    let valid = k.lt(t, vocab);
    let base = k.mul(r, stride);
    let end = k.add(base, vocab);
    let row = Row {
        whole: false,
        start: base,
        end,
        vec: 4,
    };
    let (first, last) = (row.first_slot(k), row.end_slot(k));
    // The whole stride of the row, which the gradient covers (zeros past `vocab`).
    let padded_end = k.add(base, stride);
    let padded = Row {
        end: padded_end,
        ..row
    };
    let padded_last = padded.end_slot(k);
    let fzero = k.const_f32(0.0);
    let nan = k.const_f32(f32::NAN);
    let v4 = Ty::vector(Scalar::F32, 4);
    let is_lane0 = k.eq(lane, zero);

    // Pass 1: online max and sum of exp(x − max), per invocation, rescaled once per loop
    // step. An ignored row is not read (an empty range).
    let lowest = k.const_f32(-f32::MAX);
    let m = k.var_init(lowest);
    let sum = k.var_init(fzero);
    let no = k.bool(false);
    let bad = k.var_init(no);
    let last1 = k.select(skip, first, last);
    for_each_slot_by(k, first, last1, lane, threads, unroll, |k, slots| {
        let xs: Vec<Val> = slots
            .iter()
            .map(|&slot| row.load(k, logits, s, slot, f32::NEG_INFINITY))
            .collect();
        let mut mx = hreduce(k, ReduceOp::Max, xs[0]);
        let mut nan_here = {
            let n = k.is_nan(xs[0]);
            k.any(n)
        };
        for &x in &xs[1..] {
            let h = hreduce(k, ReduceOp::Max, x);
            mx = k.max(mx, h);
            let n = k.is_nan(x);
            let n = k.any(n);
            nan_here = k.or(nan_here, n);
        }
        let mold = k.get(m);
        let mnew = k.max(mold, mx);
        let dm = k.sub(mold, mnew);
        let f = k.exp(dm);
        let ms = k.splat(mnew, 4);
        let mut es = fzero;
        for &x in &xs {
            let d = k.sub(x, ms);
            let e = k.exp(d);
            let h = hsum(k, e);
            es = k.add(es, h);
        }
        let so = k.get(sum);
        let sn = k.fma(so, f, es);
        k.set(sum, sn);
        k.set(m, mnew);
        let b = k.get(bad);
        let b = k.or(b, nan_here);
        k.set(bad, b);
    });
    let (mi, si, bi) = (k.get(m), k.get(sum), k.get(bad));
    let si = k.select(bi, nan, si);
    let mmax = g.reduce(k, ReduceOp::Max, mi);
    let dm = k.sub(mi, mmax);
    let f = k.exp(dm);
    let sc = k.mul(si, f);
    let ssum = g.reduce(k, ReduceOp::Add, sc);
    let sn = k.is_nan(ssum);
    let mn = k.is_nan(mmax);
    let row_bad = k.or(sn, mn);
    let ok = k.not(row_bad);
    let ok = k.and(ok, valid);

    let store_loss = k.and(is_lane0, in_grid);
    k.if_(store_loss, |k| {
        let read = k.not(skip);
        let read = k.and(read, valid);
        let xt = k.if_value(
            read,
            f32t,
            |k| {
                let at = k.add(base, t);
                crate::storage::load_f32(k, logits, at, 1, s)
            },
            |_| nan,
        );
        let lse = k.log(ssum);
        let d = k.sub(mmax, xt);
        let l = k.add(lse, d);
        let l = k.select(ok, l, nan);
        let l = k.select(skip, fzero, l);
        k.store(row_loss, r, l);
        if let Some(rs) = row_stats {
            // What pass 2 would use: the max, and 1/Σexp (NaN where the row's is NaN).
            let one = k.const_f32(1.0);
            let inv = k.div(one, ssum);
            let inv = k.select(ok, inv, nan);
            let two = k.u32(2);
            let at = k.mul(r, two);
            k.store(rs, at, mmax);
            let one_u = k.u32(1);
            let at = k.add(at, one_u);
            k.store(rs, at, inv);
        }
    });

    // Pass 2 (no barriers): dlogits = (exp(x − max) / sum − onehot) · norm over the row's
    // `vocab` columns, zeros past them up to the stride and for an ignored row.
    if let (Some(stats), Some(d)) = (stats, dlogits) {
        let i0 = k.u32(0);
        let norm = k.load(stats, i0, 1);
        let norm = k.select(ok, norm, nan);
        let ns = k.splat(norm, 4);
        let one = k.const_f32(1.0);
        let inv = k.div(one, ssum);
        let invs = k.splat(inv, 4);
        let ms = k.splat(mmax, 4);
        let ts = k.splat(t, 4);
        let vs = k.splat(vocab, 4);
        let (o, z) = (k.const_float(v4, 1.0), k.const_float(v4, 0.0));
        let terms = GradTerms {
            max: ms,
            inv: invs,
            target: ts,
            norm: ns,
            one: o,
            zero: z,
        };
        k.if_(in_grid, |k| {
            k.if_else(
                skip,
                |k| {
                    for_each_slot_by(k, first, padded_last, lane, threads, unroll, |k, slots| {
                        for &slot in slots {
                            padded.store(k, d, s, slot, z);
                        }
                    });
                },
                |k| {
                    for_each_slot_by(k, first, padded_last, lane, threads, unroll, |k, slots| {
                        let xs: Vec<Val> = slots
                            .iter()
                            .map(|&slot| row.load(k, logits, s, slot, 0.0))
                            .collect();
                        for (&slot, &x) in slots.iter().zip(&xs) {
                            let cols = row.cols(k, slot);
                            // Lanes past `vocab` loaded 0, not a logit: their gradient is 0.
                            let inside = k.lt(cols, vs);
                            let gr = terms.dlogit(k, x, cols, inside);
                            padded.store(k, d, s, slot, gr);
                        }
                    });
                },
            );
        });
    }
}

/// What the gradient of one logit needs beside the logit (scalars, or 4-lane vectors for
/// lanes of a row): its row's max and 1/Σexp, the target, `scale / count`, and 1 and 0.
struct GradTerms {
    max: Val,
    inv: Val,
    target: Val,
    norm: Val,
    one: Val,
    zero: Val,
}

impl GradTerms {
    /// dlogits at column `col` for logit `x`: (exp(x − max)·inv − [col = target])·norm, 0
    /// where `inside` fails. Both layouts' kernels compute it here, so they agree bit for bit.
    fn dlogit(&self, k: &mut KernelBuilder, x: Val, col: Val, inside: Val) -> Val {
        let d = k.sub(x, self.max);
        let e = k.exp(d);
        let p = k.mul(e, self.inv);
        let hit = k.eq(col, self.target);
        let oh = k.select(hit, self.one, self.zero);
        let gr = k.sub(p, oh);
        let gr = k.mul(gr, self.norm);
        k.select(inside, gr, self.zero)
    }
}

// ------------------------------------------------------------------ gradient by columns

/// `GradCols`: dlogits written column-major, `dt[v·rows + r]` = pass 2's value at (r, v).
/// A workgroup moves one 32×32 tile: it reads the logits along the rows (consecutive
/// invocations, consecutive columns), computes the gradient from the row's statistics, and
/// writes the tile down the columns through shared memory (consecutive invocations,
/// consecutive rows), so both sides move whole sectors.
fn build_grad_cols(k: &mut KernelBuilder, s: Storage) {
    let t = COLS_TILE;
    let u32t = Ty::scalar(Scalar::U32);
    let logits = k.buffer("logits", buffer_scalar(s), Access::Read);
    let targets = k.buffer("targets", Scalar::U32, Access::Read);
    let stats = k.buffer("stats", Scalar::F32, Access::Read);
    let row_stats = k.buffer("row_stats", Scalar::F32, Access::Read);
    let dt = k.buffer("dlogits", buffer_scalar(s), Access::Write);
    let params = ["rows", "vocab", "stride", "ignore_index", "ignoring"].map(|n| k.param(n, u32t));
    k.begin();
    let [rows, vocab, stride, ignore, ignoring] = params.map(|p| k.load_param(p));
    let tile = SharedTile::new(k);

    // Which tile: consecutive workgroups walk down the rows, so that the column segments
    // they write lie side by side.
    let g = linear_workgroup(k);
    let tc = k.u32(t);
    let tiles_r = SharedTile::along(k, rows);
    let tiles_c = SharedTile::along(k, stride);
    let tiles = k.mul(tiles_r, tiles_c);
    // A workgroup past the last tile (a folded grid's spares) stores nothing, but still
    // reaches the barrier.
    let live = k.lt(g, tiles);
    let tr = k.rem(g, tiles_r);
    let tcol = k.div(g, tiles_r);
    let r0 = k.mul(tr, tc);
    let v0 = k.mul(tcol, tc);
    let zero = k.u32(0);
    let norm = k.load(stats, zero, 1);
    let (fzero, one) = (k.const_f32(0.0), k.const_f32(1.0));

    // Along the rows: invocation tx reads column v0 + tx of rows r0 + ty + 8q.
    let v = k.add(v0, tile.tx);
    let inside_v = k.lt(v, vocab);
    tile.fill(k, |k, rr| {
        let r = k.add(r0, rr);
        let r_in = k.lt(r, rows);
        let r_in = k.and(r_in, live);
        let r = k.select(r_in, r, zero);
        let target = k.load(targets, r, 1);
        let skip = ignored(k, target, ignore, ignoring);
        let two = k.u32(2);
        let at = k.mul(r, two);
        let m = k.load(row_stats, at, 1);
        let i1 = k.u32(1);
        let at = k.add(at, i1);
        let inv = k.load(row_stats, at, 1);
        let read = k.and(r_in, inside_v);
        let at = k.mul(r, stride);
        let at = k.add(at, v);
        let at = k.select(read, at, zero);
        let x = load_f32(k, logits, at, 1, s);
        // Pass 2's arithmetic: the same values.
        let terms = GradTerms {
            max: m,
            inv,
            target,
            norm,
            one,
            zero: fzero,
        };
        let gr = terms.dlogit(k, x, v, inside_v);
        k.select(skip, fzero, gr)
    });
    k.workgroup_barrier();
    // Down the columns: invocation tx writes row r0 + tx of columns v0 + ty + 8q.
    let r = k.add(r0, tile.tx);
    let r_in = k.lt(r, rows);
    let r_in = k.and(r_in, live);
    tile.drain(k, |k, vv, val| {
        let v = k.add(v0, vv);
        let v_in = k.lt(v, stride);
        let inside = k.and(r_in, v_in);
        k.if_(inside, |k| {
            let at = k.mul(v, rows);
            let at = k.add(at, r);
            store_f32(k, dt, at, val, s);
        });
    });
}
