//! The backward half of the norm family (see `norm` for the design): the row kernels' dx
//! and dgamma/dbeta partials, and [`NormParamKernel`], the column kernel that sums the
//! dgamma/dbeta partials of rows too long for the cached backward.

use helios_spirv::{
    Access, Binding, Buffer, KernelBuilder, KernelModule, ReduceOp, Scalar, Ty, Val, Var,
};

use crate::launch::{grid, pack_push, Arg, Args, Geometry, Launch};
use crate::norm::{
    BufferNames, Bufs, CachedWalk, Ctx, NormKernel, NormKind, OwnedColumns, RowStats,
};
use crate::rows::{for_each_slot_by, hsum, linear_workgroup, Groups, Row};
use crate::storage::{buffer_scalar, load_f32, store_f32, Storage};
use crate::KernelError;

/// One slot's x, dy and gamma: a streaming step loads every slot's before any arithmetic.
#[derive(Clone, Copy)]
struct SlotLoads {
    x: Val,
    dy: Val,
    gamma: Val,
}

impl NormKernel {
    /// Loads mean (0 for RMS) and rstd of row `unit` (every invocation of the group reads the
    /// same address).
    pub(crate) fn row_stats(
        &self,
        k: &mut KernelBuilder,
        b: &Bufs,
        unit: Val,
        valid: Val,
    ) -> RowStats {
        let zero = k.u32(0);
        let at = k.select(valid, unit, zero);
        let mean = match b.mean {
            Some(m) => k.load(m, at, 1),
            None => k.const_f32(0.0),
        };
        RowStats {
            mean,
            rstd: k.load(b.rstd, at, 1),
        }
    }

    /// (x̂, g = dy·γ) lanes of a slot; both 0 outside the row.
    fn xhat_g(
        &self,
        k: &mut KernelBuilder,
        c: &Ctx,
        slot: Val,
        v: SlotLoads,
        stats: RowStats,
    ) -> (Val, Val) {
        let m = k.splat(stats.mean, v.x.ty.lanes);
        let r = k.splat(stats.rstd, v.x.ty.lanes);
        let d = k.sub(v.x, m);
        let xh = k.mul(d, r);
        let xh = Self::masked(k, c, slot, xh);
        let g = k.mul(v.dy, v.gamma);
        (xh, g)
    }

    /// The row's two backward sums Σg and Σg·x̂ (RMS: only the second) from per-invocation
    /// partials, divided by N.
    pub(crate) fn bwd_sums(
        &self,
        k: &mut KernelBuilder,
        groups: &mut Groups,
        c: &Ctx,
        sg: Val,
        sgx: Val,
    ) -> (Val, Val) {
        if self.layer() {
            let v = k.vector(&[sg, sgx]);
            let t = groups.reduce(k, ReduceOp::Add, v);
            let a = k.extract(t, 0);
            let bb = k.extract(t, 1);
            (k.div(a, c.len_f), k.div(bb, c.len_f))
        } else {
            let t = groups.reduce(k, ReduceOp::Add, sgx);
            (k.const_f32(0.0), k.div(t, c.len_f))
        }
    }

    /// dx lanes from x̂, g and the row's means of g and g·x̂.
    pub(crate) fn dx(k: &mut KernelBuilder, xh: Val, g: Val, a: Val, bb: Val, rstd: Val) -> Val {
        let l = xh.ty.lanes;
        let (a, bb, r) = (k.splat(a, l), k.splat(bb, l), k.splat(rstd, l));
        let t = k.mul(xh, bb);
        let u = k.sub(g, a);
        let u = k.sub(u, t);
        k.mul(u, r)
    }

    pub(crate) fn backward_streaming(
        &self,
        k: &mut KernelBuilder,
        groups: &mut Groups,
        c: &Ctx,
        b: &Bufs,
        unroll: u8,
    ) {
        let first = c.row.first_slot(k);
        let end_slot = c.row.end_slot(k);
        let stats = self.row_stats(k, b, c.unit, c.valid);
        let zero = k.const_f32(0.0);
        let sg = k.var_init(zero);
        let sgx = k.var_init(zero);
        let dyb = b.dy.expect("dy");
        let st = self.storage;
        let load = |k: &mut KernelBuilder, s: Val| {
            let x = c.row.load(k, b.x, st, s, 0.0);
            let dy = c.row.load(k, dyb, st, s, 0.0);
            let gamma = self.param(k, c, b.gamma, s);
            SlotLoads { x, dy, gamma }
        };
        for_each_slot_by(
            k,
            first,
            end_slot,
            c.lane,
            c.threads,
            u32::from(unroll),
            |k, slots| {
                let v: Vec<_> = slots.iter().map(|&s| load(k, s)).collect();
                for (&s, v) in slots.iter().zip(v) {
                    let (xh, g) = self.xhat_g(k, c, s, v, stats);
                    let h = hsum(k, g);
                    let gx = k.mul(g, xh);
                    let h2 = hsum(k, gx);
                    let (a, bb) = (k.get(sg), k.get(sgx));
                    let a = k.add(a, h);
                    let bb = k.add(bb, h2);
                    k.set(sg, a);
                    k.set(sgx, bb);
                }
            },
        );
        let (a0, b0) = (k.get(sg), k.get(sgx));
        let (a, bb) = self.bwd_sums(k, groups, c, a0, b0);
        for_each_slot_by(
            k,
            first,
            end_slot,
            c.lane,
            c.threads,
            u32::from(unroll),
            |k, slots| {
                let v: Vec<_> = slots.iter().map(|&s| load(k, s)).collect();
                let acc: Vec<Option<Val>> = slots
                    .iter()
                    .map(|&s| b.dx_in.map(|d| c.row.load(k, d, st, s, 0.0)))
                    .collect();
                for ((&s, v), acc) in slots.iter().zip(v).zip(acc) {
                    let (xh, g) = self.xhat_g(k, c, s, v, stats);
                    let dx = Self::dx(k, xh, g, a, bb, stats.rstd);
                    let dx = match acc {
                        Some(a) => k.add(dx, a),
                        None => dx,
                    };
                    c.row.store(k, b.y, st, s, dx);
                }
            },
        );
    }

    /// Cached backward: each group walks rows `unit, unit + G, ...` (G = groups in the grid) over
    /// fixed columns, keeping gamma and the dgamma/dbeta sums of its columns in registers,
    /// then writes its partial row of each. The loop runs while the workgroup's first row is in
    /// range, so every group of a workgroup meets the same barriers.
    pub(crate) fn backward_cached(
        &self,
        k: &mut KernelBuilder,
        groups: &mut Groups,
        b: &Bufs,
        walk: &CachedWalk,
        cols: &OwnedColumns,
    ) {
        let CachedWalk {
            rows,
            len,
            len_f,
            stride,
            wg_base,
            unit,
        } = *walk;
        let OwnedColumns {
            lane,
            threads,
            slots,
            vec,
        } = *cols;
        let ty = Ty::vector(Scalar::F32, vec);
        let vshift = k.u32(u32::from(vec).trailing_zeros());
        let vm1 = k.u32(u32::from(vec) - 1);
        let lv = k.add(len, vm1);
        let ncols = k.shr(lv, vshift); // column slots per row
                                       // Spare workgroups of a padded grid (past G groups) do nothing.
        let live_wg = k.lt(wg_base, stride);
        // Column slots of this invocation and gamma there (fixed for every row).
        let mut cols: Vec<(Val, Val, Val, Var, Var)> = Vec::new();
        for j in 0..u32::from(slots) {
            let jv = k.u32(j);
            let off = k.mul(threads, jv);
            let cs = k.add(lane, off);
            let inside = k.lt(cs, ncols);
            let (gb, ps) = (b.gamma, self.params);
            let gm = k.if_value(
                inside,
                ty,
                |k| load_f32(k, gb, cs, vec, ps),
                |k| k.const_float(ty, 0.0),
            );
            let z = k.const_float(ty, 0.0);
            let dg = k.var_init(z);
            let db = k.var_init(z);
            cols.push((cs, inside, gm, dg, db));
        }
        let i = k.var_init(unit);
        let wfirst = k.var_init(wg_base);
        let dyb = b.dy.expect("dy");
        let st = self.storage;
        let whole = self.whole && vec == 4;
        // Row `r`'s statistics and this invocation's x and dy slots (zeros outside the row
        // or past the last row). The loop issues row r + G's loads before it reduces row r:
        // the reductions' latency (shuffles, barriers) then covers the loads' instead of
        // adding to it, one row after another.
        let fetch = |k: &mut KernelBuilder, r: Val| {
            let (row, valid) = Row::nth(k, r, rows, len, vec, whole);
            let RowStats { mean, rstd } = self.row_stats(k, b, r, valid);
            let s0 = k.shr(row.start, vshift);
            let slots: Vec<[Val; 3]> = cols
                .iter()
                .map(|&(cs, inside, _, _, _)| {
                    let slot = k.add(s0, cs);
                    let live = k.and(inside, valid);
                    let load = |k: &mut KernelBuilder, buf| {
                        k.if_value(
                            live,
                            ty,
                            |k| load_f32(k, buf, slot, vec, st),
                            |k| k.const_float(ty, 0.0),
                        )
                    };
                    let x = load(k, b.x);
                    let dy = load(k, dyb);
                    // The gradient dx adds (zeros when the kernel does not accumulate).
                    let acc = match b.dx_in {
                        Some(d) => load(k, d),
                        None => k.const_float(ty, 0.0),
                    };
                    [x, dy, acc]
                })
                .collect();
            (mean, rstd, slots)
        };
        let (mean0, rstd0, first) = fetch(k, unit);
        let next_mean = k.var_init(mean0);
        let next_rstd = k.var_init(rstd0);
        let next: Vec<[Var; 3]> = first
            .into_iter()
            .map(|vals| vals.map(|v| k.var_init(v)))
            .collect();
        k.while_(
            |k| {
                let w = k.get(wfirst);
                let more = k.lt(w, rows);
                k.and(more, live_wg)
            },
            |k| {
                let r = k.get(i);
                let (row, valid) = Row::nth(k, r, rows, len, vec, whole);
                let c = Ctx {
                    row,
                    lane,
                    threads,
                    len_f,
                    unit: r,
                    valid,
                };
                let (mean, rstd) = (k.get(next_mean), k.get(next_rstd));
                let current: Vec<[Val; 3]> =
                    next.iter().map(|vars| vars.map(|v| k.get(v))).collect();
                let rn = k.add(r, stride);
                let (mean_n, rstd_n, ahead) = fetch(k, rn);
                k.set(next_mean, mean_n);
                k.set(next_rstd, rstd_n);
                for (vars, vals) in next.iter().zip(ahead) {
                    for (&v, x) in vars.iter().zip(vals) {
                        k.set(v, x);
                    }
                }
                let s0 = k.shr(c.row.start, vshift);
                let mut held = Vec::new();
                let (mut a, mut bb) = (k.const_f32(0.0), k.const_f32(0.0));
                for (&(cs, inside, gm, _, _), [x, dy, acc]) in cols.iter().zip(current) {
                    let slot = k.add(s0, cs);
                    let live = k.and(inside, valid);
                    let m = k.splat(mean, vec);
                    let rs = k.splat(rstd, vec);
                    let d = k.sub(x, m);
                    let xh = k.mul(d, rs);
                    let z = k.const_float(ty, 0.0);
                    let xh = k.select(live, xh, z);
                    let g = k.mul(dy, gm);
                    let h = hsum(k, g);
                    a = k.add(a, h);
                    let gx = k.mul(g, xh);
                    let h2 = hsum(k, gx);
                    bb = k.add(bb, h2);
                    held.push((slot, live, xh, g, dy, acc));
                }
                let (ma, mb) = self.bwd_sums(k, groups, &c, a, bb);
                for (&(_, _, _, dg, db), (slot, live, xh, g, dy, acc)) in cols.iter().zip(held) {
                    let dx = Self::dx(k, xh, g, ma, mb, rstd);
                    let dx = match b.dx_in {
                        Some(_) => k.add(dx, acc),
                        None => dx,
                    };
                    let yb = b.y;
                    k.if_(live, |k| store_f32(k, yb, slot, dx, st));
                    let cur = k.get(dg);
                    let t = k.fma(dy, xh, cur);
                    k.set(dg, t);
                    let cur = k.get(db);
                    let t = k.add(cur, dy);
                    k.set(db, t);
                }
            },
            |k| {
                let r = k.get(i);
                let n = k.add(r, stride);
                k.set(i, n);
                let w = k.get(wfirst);
                let n = k.add(w, stride);
                k.set(wfirst, n);
            },
        );
        // Partial rows: (G, len) each, this group's at row `unit`.
        let base = k.mul(unit, ncols);
        let mine = k.lt(unit, stride);
        for &(cs, inside, _, dg, db) in &cols {
            let at = k.add(base, cs);
            let (dgv, dbv) = (k.get(dg), k.get(db));
            let (pg, pb) = (b.dgamma, b.dbeta);
            let store = k.and(inside, mine);
            k.if_(store, |k| {
                if let Some(p) = pg {
                    k.store(p, at, dgv);
                }
                if let Some(p) = pb {
                    k.store(p, at, dbv);
                }
            });
        }
    }
}

/// The dgamma/dbeta partials of rows too long for the cached backward: each invocation owns
/// `vec` adjacent columns and sums dy·x̂ and dy over one chunk of rows, writing partial row
/// `chunk` of (splits, len). Neighbouring invocations read neighbouring columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NormParamKernel {
    pub kind: NormKind,
    /// Storage of x and dy.
    pub storage: Storage,
    /// Columns per invocation: 4 when rows are a multiple of 4 long, else 1.
    pub vec: u8,
    pub unroll: u8,
    pub workgroup: u32,
    pub binding: Binding,
}

impl NormParamKernel {
    pub fn name(&self) -> String {
        format!(
            "{}norm_param_grad_v{}_{}_u{}_wg{}",
            if self.kind == NormKind::Layer {
                "layer_"
            } else {
                "rms_"
            },
            self.vec,
            self.storage.name(),
            self.unroll,
            self.workgroup
        )
    }

    /// Buffers: x, \[mean], rstd, dy, dgamma_part, \[dbeta_part].
    pub fn buffer_names(&self) -> BufferNames {
        match self.kind {
            NormKind::Layer => {
                BufferNames::from_slice(&["x", "mean", "rstd", "dy", "dgamma_part", "dbeta_part"])
            }
            NormKind::Rms => BufferNames::from_slice(&["x", "rstd", "dy", "dgamma_part"]),
        }
    }

    /// Emits the kernel. Push constants after the buffers: rows, len, splits, chunk (rows
    /// per split).
    pub fn build(&self) -> KernelModule {
        let mut k = KernelBuilder::new(self.name(), self.binding, [self.workgroup, 1, 1]);
        let names = self.buffer_names();
        let bufs: Vec<Buffer> = names
            .iter()
            .map(|&n| match n {
                "x" | "dy" => k.buffer(n, buffer_scalar(self.storage), Access::Read),
                "mean" | "rstd" => k.buffer(n, Scalar::F32, Access::Read),
                _ => k.buffer(n, Scalar::F32, Access::Write),
            })
            .collect();
        let buf = |n: &str| names.iter().position(|&m| m == n).map(|i| bufs[i]);
        let u32_ty = Ty::scalar(Scalar::U32);
        let params = ["rows", "len", "splits", "chunk"].map(|n| k.param(n, u32_ty));
        k.begin();
        let [rows, len, splits, chunk] = params.map(|p| k.load_param(p));
        let vec = self.vec;
        let ty = Ty::vector(Scalar::F32, vec);
        let g = linear_workgroup(&mut k);
        let w = k.workgroup_size_x();
        let lid = k.local_index();
        let gb = k.mul(g, w);
        let unit = k.add(gb, lid);
        let vshift = k.u32(u32::from(vec).trailing_zeros());
        let ncols = k.shr(len, vshift);
        let total = k.mul(splits, ncols);
        let valid = k.lt(unit, total);
        let ic = k.rem(unit, ncols);
        let s = k.div(unit, ncols);
        let r0 = k.mul(s, chunk);
        let r1 = k.add(r0, chunk);
        let r1 = k.min(r1, rows);
        let zero = k.u32(0);
        let r0 = k.select(valid, r0, zero);
        let r1 = k.select(valid, r1, zero);
        let col = k.shl(ic, vshift);
        let z = k.const_float(ty, 0.0);
        let dg = k.var_init(z);
        let db = k.var_init(z);
        let (x, dy, rstd) = (bufs[0], buf("dy").expect("dy"), buf("rstd").expect("rstd"));
        let mean = buf("mean");
        let st = self.storage;
        let one = k.u32(1);
        for_each_slot_by(
            &mut k,
            r0,
            r1,
            zero,
            one,
            u32::from(self.unroll),
            |k, rs| {
                let loaded: Vec<_> = rs
                    .iter()
                    .map(|&r| {
                        let e = k.mul(r, len);
                        let e = k.add(e, col);
                        let slot = k.shr(e, vshift);
                        let xv = load_f32(k, x, slot, vec, st);
                        let dyv = load_f32(k, dy, slot, vec, st);
                        let m = match mean {
                            Some(m) => k.load(m, r, 1),
                            None => k.const_f32(0.0),
                        };
                        let rs = k.load(rstd, r, 1);
                        (xv, dyv, m, rs)
                    })
                    .collect();
                for (xv, dyv, m, rs) in loaded {
                    let m = k.splat(m, vec);
                    let rs = k.splat(rs, vec);
                    let d = k.sub(xv, m);
                    let xh = k.mul(d, rs);
                    let cur = k.get(dg);
                    let n = k.fma(dyv, xh, cur);
                    k.set(dg, n);
                    let cur = k.get(db);
                    let n = k.add(cur, dyv);
                    k.set(db, n);
                }
            },
        );
        let row = k.mul(s, len);
        let e = k.add(row, col);
        let at = k.shr(e, vshift);
        let (pg, pb) = (buf("dgamma_part"), buf("dbeta_part"));
        k.if_(valid, |k| {
            let v = k.get(dg);
            k.store(pg.expect("dgamma_part"), at, v);
            if let Some(p) = pb {
                let v = k.get(db);
                k.store(p, at, v);
            }
        });
        k.finish()
    }

    /// Grid and push constants: `rows` rows of `len` summed in `split`'s chunks; `buffers` in
    /// `buffer_names` order.
    pub fn launch(
        &self,
        module: &KernelModule,
        geometry: Geometry,
        rows: u32,
        len: u32,
        split: ParamSplits,
        buffers: &[u64],
    ) -> Result<Launch, KernelError> {
        let ParamSplits { splits, chunk } = split;
        let names = self.buffer_names();
        if buffers.len() != names.len() || len % u32::from(self.vec) != 0 {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: format!(
                    "expects {} buffers and rows a multiple of {} long",
                    names.len(),
                    self.vec
                ),
            });
        }
        let mut args = Args::new();
        if self.binding == Binding::DeviceAddress {
            args.extend(buffers.iter().map(|&a| Arg::Address(a)));
        }
        args.extend([rows, len, splits, chunk].map(Arg::U32));
        let units = u64::from(splits) * u64::from(len / u32::from(self.vec));
        let groups = grid(
            units.div_ceil(u64::from(geometry.workgroup)),
            geometry.max_groups_x,
        )?;
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }
}

/// How `NormParamKernel` cuts the rows: `splits` chunks of `chunk` rows (the last may be
/// shorter), what `param_splits` picks and `launch` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamSplits {
    pub splits: u32,
    pub chunk: u32,
}

/// The splits for `NormParamKernel` over `rows` rows of `len` columns (`vec` per
/// invocation): enough chunks for about `target_invocations`, each at least 16 rows.
pub fn param_splits(rows: u32, len: u32, vec: u8, target_invocations: u64) -> ParamSplits {
    let cols = u64::from((len / u32::from(vec)).max(1));
    let want = target_invocations.div_ceil(cols).max(1);
    let most = u64::from(rows.div_ceil(16)).max(1);
    let splits = want.min(most);
    let chunk = u64::from(rows).div_ceil(splits).max(1);
    let splits = u64::from(rows).div_ceil(chunk).max(1);
    ParamSplits {
        splits: splits as u32,
        chunk: chunk as u32,
    }
}

impl NormParamKernel {
    /// A representative set of kernels for validation.
    pub fn samples(binding: Binding) -> Vec<NormParamKernel> {
        [(NormKind::Layer, 4u8), (NormKind::Rms, 1)]
            .into_iter()
            .enumerate()
            .map(|(i, (kind, vec))| NormParamKernel {
                kind,
                storage: Storage::ALL[i + 1],
                vec,
                unroll: 4,
                workgroup: 256,
                binding,
            })
            .collect()
    }
}
