//! LayerNorm and RMSNorm over the last axis: forward (saving mean and rstd in f32) and a fused
//! backward producing dx and the per-workgroup partial sums of dgamma and dbeta.
//!
//! Key decisions a reader must know:
//! - Same row machinery as softmax (`rows`): a group of invocations per row, candidates side
//!   by side in [`NormVariant`], one selection function [`select`]. `Cached` keeps the row in
//!   registers (one read, one write, exact two-pass statistics); `Streaming` handles long rows:
//!   a statistics pass (Welford/Chan merges of 4-element chunks, so no catastrophic
//!   cancellation) then an output pass.
//! - dgamma and dbeta are sums over rows, made deterministic by never using atomics: the
//!   cached backward walks a fixed set of columns per invocation over several rows (rows
//!   `unit, unit + G, ...`), accumulating both sums in registers, and writes one partial row
//!   per group; long rows use [`NormParamKernel`], a column kernel writing one partial row
//!   per chunk of rows. Either way a reduce `Combine` over the partial rows finishes the job.
//! - Formulas (N = row length, x̂ = (x − mean)·rstd; RMSNorm: mean = 0):
//!   y = x̂·γ + β; rstd = 1/√(var + eps) (LayerNorm, biased variance) or 1/√(mean(x²) + eps);
//!   dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·γ (RMSNorm without mean(g));
//!   dγ = Σ_rows dy·x̂; dβ = Σ_rows dy.

use std::ops::Range;

use helios_spirv::{
    Access, Binding, Buffer, KernelBuilder, KernelModule, ReduceOp, Scalar, Ty, Val,
};

use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::rows::{
    for_each_slot_by, hsum, linear_workgroup, plan_row, row_slots, Groups, Reducer, Row, RowChoice,
    RowConfig, RowLaunch, RowPlan,
};
use crate::storage::{buffer_scalar, load_f32, Storage};
use crate::KernelError;

pub use crate::norm_bwd::{param_splits, NormParamKernel, ParamSplits};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormKind {
    Layer,
    Rms,
}

/// A norm kernel's buffer names, inline (launches check their count on every dispatch).
pub type BufferNames = smallvec::SmallVec<[&'static str; 10]>;

/// The candidate kernels (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormVariant {
    /// Each invocation keeps `slots` slots of `vec` elements in registers (backward: `vec`
    /// is 1 unless rows are a multiple of 4 long, so columns stay fixed across rows).
    Cached { slots: u8, vec: u8 },
    /// Rows streamed once per pass, `unroll` slots per loop step.
    Streaming { unroll: u8 },
}

impl NormVariant {
    /// A short tag ("cached6v4", "stream_u4") for kernel names and tables.
    pub fn tag(&self) -> String {
        match *self {
            NormVariant::Cached { slots, vec } => format!("cached{slots}v{vec}"),
            NormVariant::Streaming { unroll } => format!("stream_u{unroll}"),
        }
    }
}

/// Most slots per invocation a cached forward or backward keeps by default. The backward
/// kept 4 until a GPT-2 step on an H200 measured 8 faster (fewer invocations per row:
/// bench/results/2026-11-30-session44-h200.md).
pub const NORM_CACHED_SLOTS: u32 = 8;
/// Default workgroup size.
pub const NORM_WORKGROUP: u32 = 256;
/// Elements one group of the cached backward covers, over all its rows, when
/// [`norm_bwd_rows`] picks its rows: each group writes one row of dgamma/dbeta partials that
/// a second pass sums, so more rows per group mean fewer partials to sum but a longer chain
/// of dependent rows in each group. Aiming at a fixed number of elements per group keeps
/// about 1024 × 768 / width groups (6 MiB of f32 partials) whatever the row count.
pub const NORM_BWD_ELEMENTS: u64 = 3 << 18;
/// Fewest rows one group of the cached backward walks.
pub const NORM_BWD_MIN_ROWS: u32 = 2;
/// Most rows one group of the cached backward walks.
pub const NORM_BWD_MAX_ROWS: u32 = 32;

/// Rows each group of the cached backward walks (`HELIOS_NORM_ROWS` overrides): the power of
/// two at or above `rows · width / NORM_BWD_ELEMENTS`, between [`NORM_BWD_MIN_ROWS`] and
/// [`NORM_BWD_MAX_ROWS`]. On an H100 the rule picked the fastest of 2–32 rows at every shape
/// measured in bf16 (f32 within a few percent), and beat the `rows / 256` rule it replaced
/// (the table is in bench/results/source-comment-history.md).
pub fn norm_bwd_rows(rows: u32, width: u32) -> u32 {
    let want = (u64::from(rows) * u64::from(width)).div_ceil(NORM_BWD_ELEMENTS);
    let r = want.next_power_of_two().min(u64::from(NORM_BWD_MAX_ROWS)) as u32;
    r.clamp(NORM_BWD_MIN_ROWS, NORM_BWD_MAX_ROWS)
}

/// The family's selection function: the variant and the invocations per row. Forward:
/// `Cached` (16-byte slots) when the row fits in a workgroup's registers at
/// `NORM_CACHED_SLOTS` slots each (or `HELIOS_ROW_SLOTS`), else `Streaming`. Backward: the
/// same, in slots of 4 when rows are a multiple of 4 long and of 1
/// otherwise. `HELIOS_ROWS=cached|streaming` forces a variant where it can run.
pub fn select(
    len: u64,
    backward: bool,
    storage: Storage,
    cfg: &RowConfig,
    max_workgroup: u32,
) -> RowChoice<NormVariant> {
    let vec: u8 = if !backward || len % 4 == 0 { 4 } else { 1 };
    let slots = row_slots(len, vec);
    let per = cfg.cached_slots.unwrap_or(NORM_CACHED_SLOTS);
    plan_row(
        slots,
        row_slots(len, 4),
        per,
        cfg,
        NORM_WORKGROUP,
        max_workgroup,
        cfg.stream_unroll(storage),
    )
    .map(|plan| match plan {
        RowPlan::Cached { slots } => NormVariant::Cached { slots, vec },
        RowPlan::Streaming { unroll } => NormVariant::Streaming { unroll },
    })
}

/// The signature of a norm kernel (forward or backward).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NormKernel {
    pub kind: NormKind,
    pub backward: bool,
    /// Storage of x, y, dy, dx.
    pub storage: Storage,
    /// Storage of gamma and beta.
    pub params: Storage,
    pub variant: NormVariant,
    pub reducer: Reducer,
    pub workgroup: u32,
    pub binding: Binding,
    /// Built for rows a multiple of 4 long ([`Row::whole`]): no per-slot bounds checks.
    /// [`whole_rows`](crate::rows::whole_rows) says when a launch may use it.
    pub whole: bool,
    /// Backward: dx also adds `dx_in`, a gradient already summed for x (x's shape and
    /// storage), so that autograd's sum of the two is not a pass of its own.
    pub accumulate: bool,
}

/// Per-row values shared by the kernel's parts.
pub(crate) struct Ctx {
    pub(crate) row: Row,
    pub(crate) lane: Val,
    pub(crate) threads: Val,
    pub(crate) len_f: Val,
    /// The row's index and whether it is one of the launch's rows.
    pub(crate) unit: Val,
    pub(crate) valid: Val,
}

/// A row's mean (0 for RMSNorm) and rstd, together because every x̂ needs both.
#[derive(Clone, Copy)]
pub(crate) struct RowStats {
    pub(crate) mean: Val,
    pub(crate) rstd: Val,
}

/// The rows the cached backward walks: rows of `len` (`len_f` as f32), this group's from
/// `unit` every `stride` (G) rows, while its workgroup's first (`wg_base`) is in range.
pub(crate) struct CachedWalk {
    pub(crate) rows: Val,
    pub(crate) len: Val,
    pub(crate) len_f: Val,
    pub(crate) stride: Val,
    pub(crate) wg_base: Val,
    pub(crate) unit: Val,
}

/// The column slots an invocation of the cached backward owns in every row: `lane + j·threads`
/// for j < `slots`, each of `vec` elements.
pub(crate) struct OwnedColumns {
    pub(crate) lane: Val,
    pub(crate) threads: Val,
    pub(crate) slots: u8,
    pub(crate) vec: u8,
}

impl NormKernel {
    pub fn name(&self) -> String {
        let v = self.variant.tag();
        format!(
            "{}norm{}{}_{v}{}_{}_{}_{}_wg{}",
            if self.kind == NormKind::Layer {
                "layer_"
            } else {
                "rms_"
            },
            if self.backward { "_bwd" } else { "" },
            if self.accumulate { "_acc" } else { "" },
            if self.whole { "w" } else { "" },
            self.storage.name(),
            self.params.name(),
            self.reducer.tag(),
            self.workgroup
        )
    }

    pub(crate) fn layer(&self) -> bool {
        self.kind == NormKind::Layer
    }

    /// Whether this backward writes dgamma/dbeta partials (the cached one does).
    pub fn writes_partials(&self) -> bool {
        self.backward && matches!(self.variant, NormVariant::Cached { .. })
    }

    /// Buffer names in declaration order. Forward: x, gamma, \[beta], y, \[mean], rstd.
    /// Backward: x, gamma, \[mean], rstd, dy, \[dx_in], dx, \[dgamma_part, \[dbeta_part]].
    pub fn buffer_names(&self) -> BufferNames {
        let l = self.layer();
        let mut v = BufferNames::new();
        v.extend(["x", "gamma"]);
        if self.backward {
            if l {
                v.push("mean");
            }
            v.extend(["rstd", "dy"]);
            if self.accumulate {
                v.push("dx_in");
            }
            v.push("dx");
            if self.writes_partials() {
                v.push("dgamma_part");
                if l {
                    v.push("dbeta_part");
                }
            }
        } else {
            if l {
                v.push("beta");
            }
            v.push("y");
            if l {
                v.push("mean");
            }
            v.push("rstd");
        }
        v
    }

    /// Emits the kernel. Push constants after the buffers: rows, len, group_shift,
    /// groups_total (the cached backward's G), eps.
    pub fn build(&self) -> KernelModule {
        let mut k = KernelBuilder::new(self.name(), self.binding, [self.workgroup, 1, 1]);
        let names = self.buffer_names();
        let bufs: Vec<Buffer> = names
            .iter()
            .map(|&n| {
                let (elem, access) = match n {
                    "x" | "dy" | "dx_in" => (buffer_scalar(self.storage), Access::Read),
                    "y" | "dx" => (buffer_scalar(self.storage), Access::Write),
                    "gamma" | "beta" => (buffer_scalar(self.params), Access::Read),
                    "mean" | "rstd" if self.backward => (Scalar::F32, Access::Read),
                    _ => (Scalar::F32, Access::Write),
                };
                k.buffer(n, elem, access)
            })
            .collect();
        let buf = |n: &str| names.iter().position(|&m| m == n).map(|i| bufs[i]);
        let u32_ty = Ty::scalar(Scalar::U32);
        let params = ["rows", "len", "group_shift", "groups_total"].map(|n| k.param(n, u32_ty));
        let eps = k.param("eps", Ty::scalar(Scalar::F32));
        k.begin();
        let [rows, len, shift, total] = params.map(|p| k.load_param(p));
        let eps = k.load_param(eps);
        let mut groups = Groups::runtime(&mut k, self.reducer, shift);
        let threads = groups.size();
        let lane = groups.lane(&mut k);
        let len_f = k.convert(len, Scalar::F32);
        let b = Bufs {
            x: bufs[0],
            gamma: bufs[1],
            beta: buf("beta"),
            y: buf(if self.backward { "dx" } else { "y" }).expect("output"),
            mean: buf("mean"),
            rstd: buf("rstd").expect("rstd"),
            dy: buf("dy"),
            dx_in: buf("dx_in"),
            dgamma: buf("dgamma_part"),
            dbeta: buf("dbeta_part"),
        };
        let mk = |k: &mut KernelBuilder, unit: Val, vec: u8| {
            let (row, valid) = Row::nth(k, unit, rows, len, vec, self.whole && vec == 4);
            Ctx {
                row,
                lane,
                threads,
                len_f,
                unit,
                valid,
            }
        };
        let g = linear_workgroup(&mut k);
        let per = groups.per_workgroup(&mut k);
        let gi = groups.group(&mut k);
        let base = k.mul(g, per);
        let unit = k.add(base, gi);
        match (self.backward, self.variant) {
            (false, _) => {
                let c = mk(&mut k, unit, 4);
                self.forward(&mut k, &mut groups, &c, &b, eps);
            }
            (true, NormVariant::Streaming { unroll }) => {
                let c = mk(&mut k, unit, 4);
                self.backward_streaming(&mut k, &mut groups, &c, &b, unroll);
            }
            (true, NormVariant::Cached { slots, vec }) => {
                let walk = CachedWalk {
                    rows,
                    len,
                    len_f,
                    stride: total,
                    wg_base: base,
                    unit,
                };
                let cols = OwnedColumns {
                    lane,
                    threads,
                    slots,
                    vec,
                };
                self.backward_cached(&mut k, &mut groups, &b, &walk, &cols);
            }
        }
        k.finish()
    }

    /// gamma (or beta) at the columns of `slot`'s lanes, 0 outside the row: one 16-byte load
    /// where the row starts aligned and the slot is whole.
    pub(crate) fn param(&self, k: &mut KernelBuilder, c: &Ctx, buf: Buffer, slot: Val) -> Val {
        let row = c.row;
        if row.vec == 1 {
            let col = k.sub(slot, row.start);
            return load_f32(k, buf, col, 1, self.params);
        }
        if row.whole {
            let two = k.u32(2);
            let s0 = k.shr(row.start, two);
            let idx = k.sub(slot, s0);
            return load_f32(k, buf, idx, 4, self.params);
        }
        let v4 = Ty::vector(Scalar::F32, 4);
        let out = k.var(v4);
        let three = k.u32(3);
        let mis = k.and(row.start, three);
        let zero = k.u32(0);
        let aligned = k.eq(mis, zero);
        let full = row.full(k, slot);
        let fast = k.and(aligned, full);
        let ps = self.params;
        k.if_else(
            fast,
            |k| {
                let two = k.u32(2);
                let s0 = k.shr(row.start, two);
                let idx = k.sub(slot, s0);
                let v = load_f32(k, buf, idx, 4, ps);
                k.set(out, v);
            },
            |k| {
                // A gather from L1: each lane at its column, clamped into the row (lanes
                // outside it are never stored), without per-lane branches.
                let cols = row.cols(k, slot);
                let one = k.u32(1);
                let len = k.sub(row.end, row.start);
                let last = k.sub(len, one);
                let lanes: Vec<Val> = (0..4)
                    .map(|lane| {
                        let c = k.extract(cols, lane);
                        let c = k.min(c, last);
                        load_f32(k, buf, c, 1, ps)
                    })
                    .collect();
                let v = k.vector(&lanes);
                k.set(out, v);
            },
        );
        k.get(out)
    }

    /// `v` with lanes outside the row zeroed.
    pub(crate) fn masked(k: &mut KernelBuilder, c: &Ctx, slot: Val, v: Val) -> Val {
        if c.row.vec == 1 {
            return v;
        }
        if c.row.whole {
            let inside = c.row.slot_inside(k, slot);
            let inside = k.splat(inside, v.ty.lanes);
            let z = k.const_float(v.ty, 0.0);
            return k.select(inside, v, z);
        }
        let cols = c.row.cols(k, slot);
        let ok = c.row.valid(k, cols);
        let z = k.const_float(v.ty, 0.0);
        k.select(ok, v, z)
    }

    /// The normalized output lanes of a slot from x and the row's statistics.
    fn normalize(
        &self,
        k: &mut KernelBuilder,
        c: &Ctx,
        b: &Bufs,
        slot: Val,
        x: Val,
        stats: RowStats,
    ) -> Val {
        let m = k.splat(stats.mean, 4);
        let r = k.splat(stats.rstd, 4);
        let d = k.sub(x, m);
        let xh = k.mul(d, r);
        let gm = self.param(k, c, b.gamma, slot);
        match b.beta {
            Some(beta) => {
                let bt = self.param(k, c, beta, slot);
                k.fma(xh, gm, bt)
            }
            None => k.mul(xh, gm),
        }
    }

    fn forward(&self, k: &mut KernelBuilder, groups: &mut Groups, c: &Ctx, b: &Bufs, eps: Val) {
        let first = c.row.first_slot(k);
        let end_slot = c.row.end_slot(k);
        let v4 = Ty::vector(Scalar::F32, 4);
        let (mean, rstd, held) = match self.variant {
            NormVariant::Cached { slots, .. } => {
                let mut held = Vec::new();
                for j in 0..u32::from(slots) {
                    let jv = k.u32(j);
                    let off = k.mul(c.threads, jv);
                    let s0 = k.add(first, c.lane);
                    let slot = k.add(s0, off);
                    let inside = k.lt(slot, end_slot);
                    let (row, st, x) = (c.row, self.storage, b.x);
                    let v = k.if_value(
                        inside,
                        v4,
                        |k| row.load(k, x, st, slot, 0.0),
                        |k| k.const_float(v4, 0.0),
                    );
                    held.push((slot, inside, v));
                }
                let mean = if self.layer() {
                    let mut s = k.const_f32(0.0);
                    for &(_, _, v) in &held {
                        let h = hsum(k, v);
                        s = k.add(s, h);
                    }
                    let total = groups.reduce(k, ReduceOp::Add, s);
                    k.div(total, c.len_f)
                } else {
                    k.const_f32(0.0)
                };
                let mut q = k.const_f32(0.0);
                let mv = k.splat(mean, 4);
                for &(slot, _, v) in &held {
                    let d = k.sub(v, mv);
                    let d = Self::masked(k, c, slot, d);
                    let d2 = k.mul(d, d);
                    let h = hsum(k, d2);
                    q = k.add(q, h);
                }
                let total = groups.reduce(k, ReduceOp::Add, q);
                let var = k.div(total, c.len_f);
                let ve = k.add(var, eps);
                let rstd = k.rsqrt(ve);
                (mean, rstd, Some(held))
            }
            NormVariant::Streaming { unroll } => {
                let (mean, var) = self.streaming_stats(k, groups, c, b, first..end_slot, unroll);
                let ve = k.add(var, eps);
                let rstd = k.rsqrt(ve);
                (mean, rstd, None)
            }
        };
        let stats = RowStats { mean, rstd };
        match held {
            Some(held) => {
                for (slot, inside, x) in held {
                    // Inside the branch: gamma and beta are read only for slots of the row.
                    let (row, st, yb) = (c.row, self.storage, b.y);
                    k.if_(inside, |k| {
                        let y = self.normalize(k, c, b, slot, x, stats);
                        row.store(k, yb, st, slot, y);
                    });
                }
            }
            None => {
                let NormVariant::Streaming { unroll } = self.variant else {
                    unreachable!()
                };
                for_each_slot_by(
                    k,
                    first,
                    end_slot,
                    c.lane,
                    c.threads,
                    u32::from(unroll),
                    |k, slots| {
                        let xs: Vec<Val> = slots
                            .iter()
                            .map(|&s| c.row.load(k, b.x, self.storage, s, 0.0))
                            .collect();
                        for (&s, x) in slots.iter().zip(xs) {
                            let y = self.normalize(k, c, b, s, x, stats);
                            c.row.store(k, b.y, self.storage, s, y);
                        }
                    },
                );
            }
        }
        let zero = k.u32(0);
        let first_lane = k.eq(c.lane, zero);
        let store = k.and(c.valid, first_lane);
        k.if_(store, |k| {
            if let Some(m) = b.mean {
                k.store(m, c.unit, mean);
            }
            k.store(b.rstd, c.unit, rstd);
        });
    }

    /// (mean, biased variance) of a streamed row: per invocation, Chan's merge of 4-element
    /// chunks into (count, mean, M2) over `slots`; then two group sums (RMSNorm: one sum of
    /// squares).
    fn streaming_stats(
        &self,
        k: &mut KernelBuilder,
        groups: &mut Groups,
        c: &Ctx,
        b: &Bufs,
        slots: Range<Val>,
        unroll: u8,
    ) -> (Val, Val) {
        let zero = k.const_f32(0.0);
        let n = k.var_init(zero);
        let mean = k.var_init(zero);
        let m2 = k.var_init(zero);
        let layer = self.layer();
        for_each_slot_by(
            k,
            slots.start,
            slots.end,
            c.lane,
            c.threads,
            u32::from(unroll),
            |k, slots| {
                let xs: Vec<Val> = slots
                    .iter()
                    .map(|&s| c.row.load(k, b.x, self.storage, s, 0.0))
                    .collect();
                for (&s, x) in slots.iter().zip(xs) {
                    if !layer {
                        let x2 = k.mul(x, x);
                        let h = hsum(k, x2);
                        let cur = k.get(m2);
                        let nv = k.add(cur, h);
                        k.set(m2, nv);
                        continue;
                    }
                    // Chunk statistics over the valid lanes, then Chan's merge.
                    let cols = c.row.cols(k, s);
                    let ok = c.row.valid(k, cols);
                    let one4 = k.const_float(x.ty, 1.0);
                    let zero4 = k.const_float(x.ty, 0.0);
                    let w = k.select(ok, one4, zero4);
                    let cnt = hsum(k, w);
                    let sum = hsum(k, x); // invalid lanes were loaded as 0
                    let cm = k.div(sum, cnt);
                    let cmv = k.splat(cm, 4);
                    let d = k.sub(x, cmv);
                    let d = k.mul(d, w);
                    let d2 = k.mul(d, d);
                    let cm2 = hsum(k, d2);
                    let (nv, mv, m2v) = (k.get(n), k.get(mean), k.get(m2));
                    let nn = k.add(nv, cnt);
                    let delta = k.sub(cm, mv);
                    let frac = k.div(cnt, nn);
                    let nm = k.fma(delta, frac, mv);
                    let dd = k.mul(delta, delta);
                    let t = k.mul(dd, nv);
                    let t = k.mul(t, frac);
                    let nm2 = k.add(m2v, cm2);
                    let nm2 = k.add(nm2, t);
                    k.set(n, nn);
                    k.set(mean, nm);
                    k.set(m2, nm2);
                }
            },
        );
        if !layer {
            let q = k.get(m2);
            let total = groups.reduce(k, ReduceOp::Add, q);
            let zero = k.const_f32(0.0);
            return (zero, k.div(total, c.len_f));
        }
        let (nv, mv, m2v) = (k.get(n), k.get(mean), k.get(m2));
        let nm = k.mul(nv, mv);
        let total = groups.reduce(k, ReduceOp::Add, nm);
        let row_mean = k.div(total, c.len_f);
        let d = k.sub(mv, row_mean);
        let dd = k.mul(d, d);
        let q = k.fma(dd, nv, m2v);
        let total = groups.reduce(k, ReduceOp::Add, q);
        (row_mean, k.div(total, c.len_f))
    }

    /// Grid and push constants for `layout`. `buffers` are the device addresses in
    /// `buffer_names` order. The cached backward runs `partial_rows` groups in all (from
    /// `backward_groups`: the partial rows it writes); other kernels one group per row.
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        layout: RowLaunch,
        partial_rows: u32,
        eps: f32,
        buffers: &[u64],
    ) -> Result<Launch, KernelError> {
        let RowLaunch { rows, len, threads } = layout;
        let names = self.buffer_names();
        let bad = |detail: String| KernelError::Arguments {
            kernel: self.name(),
            detail,
        };
        if buffers.len() != names.len() {
            return Err(bad(format!(
                "expects {} buffers, got {}",
                names.len(),
                buffers.len()
            )));
        }
        if !threads.is_power_of_two() || threads > geometry.workgroup {
            return Err(bad(format!(
                "{threads} invocations per row in a workgroup of {}",
                geometry.workgroup
            )));
        }
        let mut args = Args::new();
        if self.binding == Binding::DeviceAddress {
            args.extend(buffers.iter().map(|&a| Arg::Address(a)));
        }
        let per = u64::from((geometry.workgroup / threads).max(1));
        let units = if self.writes_partials() {
            if u64::from(partial_rows) % per != 0 {
                return Err(bad(format!(
                    "{partial_rows} partial rows are not whole workgroups of {per} rows"
                )));
            }
            u64::from(partial_rows)
        } else {
            u64::from(rows)
        };
        args.extend([rows, len, threads.trailing_zeros(), partial_rows].map(Arg::U32));
        args.push(Arg::F32(eps));
        let groups = grid(units.div_ceil(per), geometry.max_groups_x)?;
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }

    /// Groups (partial rows) the cached backward runs: about `rows / rows_per_group`, a whole
    /// number of workgroups.
    pub fn backward_groups(rows: u32, workgroup: u32, threads: u32, rows_per_group: u32) -> u32 {
        let per = (workgroup / threads.max(1)).max(1);
        let want = rows.div_ceil(rows_per_group.max(1)).max(1);
        want.div_ceil(per) * per
    }
}

/// The buffers of a norm kernel.
pub(crate) struct Bufs {
    pub(crate) x: Buffer,
    pub(crate) gamma: Buffer,
    pub(crate) beta: Option<Buffer>,
    /// y (forward) or dx (backward).
    pub(crate) y: Buffer,
    pub(crate) mean: Option<Buffer>,
    pub(crate) rstd: Buffer,
    pub(crate) dy: Option<Buffer>,
    /// Backward with `accumulate`: the gradient dx adds.
    pub(crate) dx_in: Option<Buffer>,
    pub(crate) dgamma: Option<Buffer>,
    pub(crate) dbeta: Option<Buffer>,
}

impl NormKernel {
    /// A representative set of kernels for validation.
    pub fn samples(binding: Binding) -> Vec<NormKernel> {
        let mut out = Vec::new();
        let variants = [
            NormVariant::Cached { slots: 6, vec: 4 },
            NormVariant::Cached { slots: 3, vec: 1 },
            NormVariant::Streaming { unroll: 4 },
        ];
        for (i, variant) in variants.into_iter().enumerate() {
            for kind in [NormKind::Layer, NormKind::Rms] {
                for backward in [false, true] {
                    out.push(NormKernel {
                        kind,
                        backward,
                        storage: Storage::ALL[i % 3],
                        params: Storage::ALL[(i + 1) % 3],
                        variant,
                        reducer: if backward {
                            Reducer::SharedTree
                        } else {
                            Reducer::Subgroup {
                                block: 32,
                                whole: true,
                            }
                        },
                        workgroup: 256,
                        binding,
                        whole: kind == NormKind::Layer && i != 1,
                        accumulate: backward && kind == NormKind::Layer,
                    });
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
    fn backward_rows_per_group() {
        assert_eq!(norm_bwd_rows(1, 768), NORM_BWD_MIN_ROWS);
        assert_eq!(norm_bwd_rows(4096, 768), 4);
        assert_eq!(norm_bwd_rows(8192, 768), 8);
        assert_eq!(norm_bwd_rows(8192, 1024), 16); // 10.7 → 16
        assert_eq!(norm_bwd_rows(8192, 3072), 32);
        assert_eq!(norm_bwd_rows(1 << 20, 768), NORM_BWD_MAX_ROWS);
    }

    #[test]
    fn selection() {
        let cfg = RowConfig::default();
        let cached = |slots, vec| NormVariant::Cached { slots, vec };
        let pick = |len, bwd, max| {
            let c = select(len, bwd, Storage::F32, &cfg, max);
            (c.variant, c.threads, c.workgroup)
        };
        assert_eq!(pick(768, false, 1024), (cached(6, 4), 32, 256));
        assert_eq!(pick(768, true, 1024), (cached(6, 4), 32, 256));
        assert_eq!(pick(1023, true, 1024), (cached(8, 1), 128, 256));
        let streamed = NormVariant::Streaming { unroll: 4 };
        assert_eq!(pick(50257, false, 1024), (streamed, 1024, 1024));
        // A device that allows only 256 invocations keeps streaming rows at 256.
        assert_eq!(pick(50257, true, 256), (streamed, 256, 256));
        let wg512 = RowConfig {
            workgroup: Some(512),
            ..cfg
        };
        assert_eq!(
            select(50257, false, Storage::F32, &wg512, 1024).workgroup,
            512
        );
        let bf16 = select(50257, false, Storage::BF16, &cfg, 1024);
        assert_eq!(bf16.variant, NormVariant::Streaming { unroll: 2 });
        assert_eq!(NormKernel::backward_groups(4096, 256, 64, 4), 1024);
        assert_eq!(NormKernel::backward_groups(5, 256, 64, 4), 4);
        let split = param_splits(4096, 50257, 1, 1 << 19);
        assert_eq!((split.splits, split.chunk), (11, 373));
    }
}
