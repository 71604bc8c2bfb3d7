//! The portable attention kernels: f32 math on any Vulkan device (lavapipe included), f32,
//! f16 or bf16 storage.
//!
//! The one decision a reader must know: a workgroup owns a block of rows (query rows for
//! Forward and Dq, key rows for DkDv), [`SIMT_TPR`] invocations per row, each holding a
//! quarter of the row's D columns (every fourth vec4) as its accumulator. Tiles are staged in
//! shared memory as vec4s; score tiles (S, P, dS) go through shared memory too, so each
//! invocation computes scores for its row against every fourth key (or query) and the
//! row's invocations then all read the whole row back. Per-row softmax statistics are
//! recomputed by each of the row's invocations instead of being reduced across them: no
//! subgroup operations, so the kernels run wherever Vulkan does.

use helios_spirv::{KernelBuilder, KernelModule, Scalar, Shared, SharedLen, Ty, Val, Var};

use crate::attention::{
    block_coords, build_prep, dense_row, keep, key_end, stat_index, AttentionKernel, AttnStage,
    Params, View, SIMT_TPR,
};
use crate::storage::{load_f32, store_f32, Storage};

/// Shared bytes of a SIMT kernel.
pub(crate) fn shared_bytes(kern: &AttentionKernel) -> u32 {
    let (bq, bk) = kern.variant.blocks();
    let row = kern.head_dim * 4;
    match kern.stage {
        AttnStage::Forward => (bq + 2 * bk) * row + bq * bk * 4,
        AttnStage::Prep => 0,
        AttnStage::DkDv => (2 * bq + 2 * bk) * row + 2 * bq * bk * 4 + 2 * bq * 4,
        AttnStage::Dq => (2 * bq + 2 * bk) * row + bq * bk * 4,
    }
}

pub(crate) fn build(kern: &AttentionKernel) -> KernelModule {
    match kern.stage {
        AttnStage::Prep => build_prep(kern),
        AttnStage::Forward => forward(kern),
        AttnStage::DkDv => dkdv(kern),
        AttnStage::Dq => dq(kern),
    }
}

/// What every SIMT stage knows once its parameters are loaded (the builder is passed
/// alongside, so loop closures can borrow both).
struct Ctx {
    p: Params,
    storage: Storage,
    causal: bool,
    bq: u32,
    bk: u32,
    /// vec4s per row.
    dv: u32,
    wg: u32,
    tid: Val,
    /// The owned row in the block and this invocation's part of it.
    r: Val,
    part: Val,
    ov: u32,
}

fn v4() -> Ty {
    Ty::vector(Scalar::F32, 4)
}

impl Ctx {
    fn new(kern: &AttentionKernel) -> (KernelBuilder, Ctx) {
        let wg = kern.workgroup();
        let mut k = KernelBuilder::new(kern.name(), kern.binding, [wg, 1, 1]);
        let p = kern.declare(&mut k, false);
        let (bq, bk) = kern.variant.blocks();
        assert!(bq % SIMT_TPR == 0 && bk % SIMT_TPR == 0, "blocks of 4 rows");
        let tid = k.local_index();
        let tpr = k.u32(SIMT_TPR);
        let r = k.div(tid, tpr);
        let part = k.rem(tid, tpr);
        let dv = kern.head_dim / 4;
        let c = Ctx {
            p,
            storage: kern.storage,
            causal: kern.causal,
            bq,
            bk,
            dv,
            wg,
            tid,
            r,
            part,
            ov: dv / SIMT_TPR,
        };
        (k, c)
    }

    fn tile(&self, k: &mut KernelBuilder, rows: u32) -> Shared {
        k.shared_array(v4(), SharedLen::Fixed(rows * self.dv))
    }

    fn zero_accs(&self, k: &mut KernelBuilder) -> Vec<Var> {
        (0..self.ov)
            .map(|_| {
                let z = k.const_float(v4(), 0.0);
                k.var_init(z)
            })
            .collect()
    }

    /// Stages rows t0..t0+rows of `view` (zeros at t >= tend) into `dst`, times `mul`.
    #[allow(clippy::too_many_arguments)]
    fn load_tile(
        &self,
        k: &mut KernelBuilder,
        view: View,
        (b, h): (Val, Val),
        t0: Val,
        tend: Val,
        rows: u32,
        dst: Shared,
        mul: Option<Val>,
    ) {
        let d = self.dv * 4;
        let s = self.storage;
        let end = k.u32(rows * d);
        let step = k.u32(self.wg);
        let dv = self.dv;
        k.for_range(self.tid, end, step, |k, idx| {
            let dc = k.u32(d);
            let row = k.div(idx, dc);
            let col = k.rem(idx, dc);
            let t = k.add(t0, row);
            let ok = k.lt(t, tend);
            let zero_u = k.u32(0);
            let tc = k.select(ok, t, zero_u);
            let at = view.row(k, b, tc, h);
            let at = k.add(at, col);
            let x = load_f32(k, view.buf, at, 1, s);
            let zero = k.const_f32(0.0);
            let x = k.select(ok, x, zero);
            let x = match mul {
                Some(m) => k.mul(x, m),
                None => x,
            };
            let dvc = k.u32(dv);
            let slot = k.mul(row, dvc);
            let four = k.u32(4);
            let q = k.div(col, four);
            let slot = k.add(slot, q);
            let lane = k.rem(col, four);
            k.shared_store_lane(dst, slot, lane, x);
        });
    }

    /// For each pair (tile a, row of a, tile b) and each row `rows[jj]` of b: Σ a·b over
    /// the row's vec4s.
    fn dots(
        &self,
        k: &mut KernelBuilder,
        pairs: &[(Shared, Val, Shared)],
        rows: &[Val],
    ) -> Vec<Vec<Val>> {
        let accs: Vec<Vec<Var>> = pairs
            .iter()
            .map(|_| {
                rows.iter()
                    .map(|_| {
                        let z = k.const_f32(0.0);
                        k.var_init(z)
                    })
                    .collect()
            })
            .collect();
        let dvc = k.u32(self.dv);
        let a_base: Vec<Val> = pairs.iter().map(|&(_, ra, _)| k.mul(ra, dvc)).collect();
        let b_base: Vec<Val> = rows.iter().map(|&rb| k.mul(rb, dvc)).collect();
        let zero = k.u32(0);
        let one = k.u32(1);
        k.for_range(zero, dvc, one, |k, v| {
            for (x, &(ta, _, tb)) in pairs.iter().enumerate() {
                let ai = k.add(a_base[x], v);
                let av = k.shared_load(ta, ai);
                for (jj, &bb) in b_base.iter().enumerate() {
                    let bi = k.add(bb, v);
                    let bv = k.shared_load(tb, bi);
                    let d = k.dot(av, bv);
                    let cur = k.get(accs[x][jj]);
                    let n = k.add(cur, d);
                    k.set(accs[x][jj], n);
                }
            }
        });
        accs.iter()
            .map(|row| row.iter().map(|&v| k.get(v)).collect())
            .collect()
    }

    /// acc[o] += w · tile[row·dv + part + 4·o] for each owned vec4.
    fn axpy(&self, k: &mut KernelBuilder, acc: &[Var], w: Val, tile: Shared, row: Val) {
        let dvc = k.u32(self.dv);
        let base = k.mul(row, dvc);
        let base = k.add(base, self.part);
        let wv = k.splat(w, 4);
        for (o, &a) in acc.iter().enumerate() {
            let off = k.u32(o as u32 * SIMT_TPR);
            let at = k.add(base, off);
            let x = k.shared_load(tile, at);
            let cur = k.get(a);
            let n = k.fma(wv, x, cur);
            k.set(a, n);
        }
    }

    /// Stores the owned vec4s of dense row (b, t, h) of `buf`, times `mul`, when t < T.
    #[allow(clippy::too_many_arguments)]
    fn store_row(
        &self,
        k: &mut KernelBuilder,
        buf: helios_spirv::Buffer,
        acc: &[Var],
        (b, h): (Val, Val),
        t: Val,
        mul: Val,
    ) {
        let inside = k.lt(t, self.p.t);
        k.if_(inside, |k| {
            let base = dense_row(k, &self.p, self.dv * 4, b, t, h);
            let four = k.u32(4);
            let base = k.div(base, four);
            let base = k.add(base, self.part);
            let m = k.splat(mul, 4);
            for (o, &a) in acc.iter().enumerate() {
                let off = k.u32(o as u32 * SIMT_TPR);
                let at = k.add(base, off);
                let x = k.get(a);
                let x = k.mul(x, m);
                store_f32(k, buf, at, x, self.storage);
            }
        });
    }

    /// The `n` columns this invocation computes scores for: part, part + 4, ...
    fn my_cols(&self, k: &mut KernelBuilder, n: u32) -> Vec<Val> {
        (0..n / SIMT_TPR)
            .map(|jj| {
                let o = k.u32(jj * SIMT_TPR);
                k.add(self.part, o)
            })
            .collect()
    }

    /// Keys a query block starting at `q0` sees: min(kend, q0 + bq) when causal.
    fn key_limit(&self, k: &mut KernelBuilder, q0: Val, kend: Val) -> Val {
        if !self.causal {
            return kend;
        }
        let bq = k.u32(self.bq);
        let e = k.add(q0, bq);
        k.min(kend, e)
    }
}

/// Blocks of `block` rows covering 0..end.
fn blocks(k: &mut KernelBuilder, end: Val, block: u32) -> Val {
    let bm = k.u32(block - 1);
    let e = k.add(end, bm);
    let b = k.u32(block);
    k.div(e, b)
}

/// `m == -inf ? 0 : m`: the shift that keeps a row with no key yet finite.
fn safe_max(k: &mut KernelBuilder, m: Val) -> Val {
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let zero = k.const_f32(0.0);
    let none = k.eq(m, ninf);
    k.select(none, zero, m)
}

/// P = exp(s·scale − L) where kept (0 elsewhere) and dS = P·(dP − Dsum).
#[allow(clippy::too_many_arguments)]
fn p_ds(
    k: &mut KernelBuilder,
    c: &Ctx,
    s: Val,
    dp: Val,
    kp: Val,
    lse: Val,
    dsum: Val,
) -> (Val, Val) {
    let x = k.mul(s, c.p.scale);
    let x = k.sub(x, lse);
    let e = k.exp(x);
    let zero = k.const_f32(0.0);
    let p = k.select(kp, e, zero);
    let d = k.sub(dp, dsum);
    let ds = k.mul(p, d);
    (p, ds)
}

fn forward(kern: &AttentionKernel) -> KernelModule {
    let (mut kb, c) = Ctx::new(kern);
    let k = &mut kb;
    let (bq, bk) = (c.bq, c.bk);
    let sq = c.tile(k, bq);
    let sk = c.tile(k, bk);
    let sv = c.tile(k, bk);
    let ss = k.shared_array(Ty::scalar(Scalar::F32), SharedLen::Fixed(bq * bk));
    let (b, h, qb) = block_coords(k, &c.p, bq, c.causal);
    let bqc = k.u32(bq);
    let q0 = k.mul(qb, bqc);
    let i = k.add(q0, c.r);
    let kend = key_end(k, &c.p, b);
    let (qv, kv, vv) = (c.p.views[0], c.p.views[1], c.p.views[2]);
    c.load_tile(k, qv, (b, h), q0, c.p.t, bq, sq, Some(c.p.scale));
    let kmax = c.key_limit(k, q0, kend);
    let nkb = blocks(k, kmax, bk);
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let m = k.var_init(ninf);
    let zero = k.const_f32(0.0);
    let l = k.var_init(zero);
    let acc = c.zero_accs(k);
    let (z, one) = (k.u32(0), k.u32(1));
    k.for_range(z, nkb, one, |k, kb| {
        let bkc = k.u32(bk);
        let k0 = k.mul(kb, bkc);
        k.workgroup_barrier();
        c.load_tile(k, kv, (b, h), k0, kend, bk, sk, None);
        c.load_tile(k, vv, (b, h), k0, kend, bk, sv, None);
        k.workgroup_barrier();
        let cols = c.my_cols(k, bk);
        let dots = c.dots(k, &[(sq, c.r, sk)], &cols);
        let rowbase = k.mul(c.r, bkc);
        for (jj, &col) in cols.iter().enumerate() {
            let j = k.add(k0, col);
            let kp = keep(k, c.causal, i, j, kend);
            let ninf = k.const_f32(f32::NEG_INFINITY);
            let v = k.select(kp, dots[0][jj], ninf);
            let at = k.add(rowbase, col);
            k.shared_store(ss, at, v);
        }
        k.workgroup_barrier();
        // Online softmax over the block's scores of the row.
        let ninf = k.const_f32(f32::NEG_INFINITY);
        let mx = k.var_init(ninf);
        let (z, one) = (k.u32(0), k.u32(1));
        k.for_range(z, bkc, one, |k, col| {
            let at = k.add(rowbase, col);
            let x = k.shared_load(ss, at);
            let cur = k.get(mx);
            let n = k.max(cur, x);
            k.set(mx, n);
        });
        let mold = k.get(m);
        let mxv = k.get(mx);
        let mnew = k.max(mold, mxv);
        let safe = safe_max(k, mnew);
        let d = k.sub(mold, safe);
        let corr = k.exp(d);
        let lv = k.get(l);
        let lv = k.mul(lv, corr);
        k.set(l, lv);
        let cv = k.splat(corr, 4);
        for &a in &acc {
            let x = k.get(a);
            let x = k.mul(x, cv);
            k.set(a, x);
        }
        k.set(m, mnew);
        k.for_range(z, bkc, one, |k, col| {
            let at = k.add(rowbase, col);
            let x = k.shared_load(ss, at);
            let dd = k.sub(x, safe);
            let pc = k.exp(dd);
            let lv = k.get(l);
            let lv = k.add(lv, pc);
            k.set(l, lv);
            c.axpy(k, &acc, pc, sv, col);
        });
    });
    // Normalise and store O; L = m + log l (−inf for a row with no key).
    let lv = k.get(l);
    let mv = k.get(m);
    let zero = k.const_f32(0.0);
    let empty = k.eq(lv, zero);
    let onef = k.const_f32(1.0);
    let inv = k.div(onef, lv);
    let inv = k.select(empty, zero, inv);
    let lg = k.log(lv);
    let lse = k.add(mv, lg);
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let lse = k.select(empty, ninf, lse);
    c.store_row(k, c.p.outs[0], &acc, (b, h), i, inv);
    let inside = k.lt(i, c.p.t);
    let z = k.u32(0);
    let first = k.eq(c.part, z);
    let w = k.and(inside, first);
    let lse_buf = c.p.lse.expect("forward writes lse");
    let at = stat_index(k, &c.p, b, h, i);
    k.if_(w, |k| k.store(lse_buf, at, lse));
    kb.finish()
}

/// Loads L and Dsum of query `i` (L = +inf, Dsum = 0 past T, so P = 0 there).
fn row_stats(k: &mut KernelBuilder, c: &Ctx, b: Val, h: Val, i: Val) -> (Val, Val) {
    let inside = k.lt(i, c.p.t);
    let z = k.u32(0);
    let ic = k.select(inside, i, z);
    let at = stat_index(k, &c.p, b, h, ic);
    let l = k.load(c.p.lse.expect("backward reads lse"), at, 1);
    let d = k.load(c.p.dsum.expect("backward reads dsum"), at, 1);
    let inf = k.const_f32(f32::INFINITY);
    let zero = k.const_f32(0.0);
    let l = k.select(inside, l, inf);
    let d = k.select(inside, d, zero);
    (l, d)
}

fn dkdv(kern: &AttentionKernel) -> KernelModule {
    let (mut kb, c) = Ctx::new(kern);
    let k = &mut kb;
    let (bq, bk) = (c.bq, c.bk);
    let sk = c.tile(k, bk);
    let sv = c.tile(k, bk);
    let sq = c.tile(k, bq);
    let sdo = c.tile(k, bq);
    let f = Ty::scalar(Scalar::F32);
    let sp = k.shared_array(f, SharedLen::Fixed(bq * bk));
    let sds = k.shared_array(f, SharedLen::Fixed(bq * bk));
    let sl = k.shared_array(f, SharedLen::Fixed(bq));
    let sd = k.shared_array(f, SharedLen::Fixed(bq));
    let (b, h, kblk) = block_coords(k, &c.p, bk, false);
    let bkc = k.u32(bk);
    let k0 = k.mul(kblk, bkc);
    let j = k.add(k0, c.r);
    let kend = key_end(k, &c.p, b);
    let (qv, kv, vv, dov) = (c.p.views[0], c.p.views[1], c.p.views[2], c.p.views[3]);
    c.load_tile(k, kv, (b, h), k0, kend, bk, sk, None);
    c.load_tile(k, vv, (b, h), k0, kend, bk, sv, None);
    let dk = c.zero_accs(k);
    let dvs = c.zero_accs(k);
    let nqb = blocks(k, c.p.t, bq);
    let bqc = k.u32(bq);
    let qstart = if c.causal { k.div(k0, bqc) } else { k.u32(0) };
    // No key of this block exists: nothing to accumulate.
    let live = k.lt(k0, kend);
    let z = k.u32(0);
    let nqb = k.select(live, nqb, z);
    let one = k.u32(1);
    k.for_range(qstart, nqb, one, |k, qb| {
        let i0 = k.mul(qb, bqc);
        k.workgroup_barrier();
        c.load_tile(k, qv, (b, h), i0, c.p.t, bq, sq, None);
        c.load_tile(k, dov, (b, h), i0, c.p.t, bq, sdo, None);
        let step = k.u32(c.wg);
        k.for_range(c.tid, bqc, step, |k, idx| {
            let i = k.add(i0, idx);
            let (l, d) = row_stats(k, &c, b, h, i);
            k.shared_store(sl, idx, l);
            k.shared_store(sd, idx, d);
        });
        k.workgroup_barrier();
        let qs = c.my_cols(k, bq);
        let dots = c.dots(k, &[(sk, c.r, sq), (sv, c.r, sdo)], &qs);
        for (jj, &qi) in qs.iter().enumerate() {
            let i = k.add(i0, qi);
            let kp = keep(k, c.causal, i, j, kend);
            let l = k.shared_load(sl, qi);
            let d = k.shared_load(sd, qi);
            let (p, ds) = p_ds(k, &c, dots[0][jj], dots[1][jj], kp, l, d);
            let at = k.mul(qi, bkc);
            let at = k.add(at, c.r);
            k.shared_store(sp, at, p);
            k.shared_store(sds, at, ds);
        }
        k.workgroup_barrier();
        let (z, one) = (k.u32(0), k.u32(1));
        k.for_range(z, bqc, one, |k, qi| {
            let at = k.mul(qi, bkc);
            let at = k.add(at, c.r);
            let p = k.shared_load(sp, at);
            let ds = k.shared_load(sds, at);
            c.axpy(k, &dvs, p, sdo, qi);
            c.axpy(k, &dk, ds, sq, qi);
        });
    });
    let onef = k.const_f32(1.0);
    c.store_row(k, c.p.outs[0], &dk, (b, h), j, c.p.scale);
    c.store_row(k, c.p.outs[1], &dvs, (b, h), j, onef);
    kb.finish()
}

fn dq(kern: &AttentionKernel) -> KernelModule {
    let (mut kb, c) = Ctx::new(kern);
    let k = &mut kb;
    let (bq, bk) = (c.bq, c.bk);
    let sq = c.tile(k, bq);
    let sdo = c.tile(k, bq);
    let sk = c.tile(k, bk);
    let sv = c.tile(k, bk);
    let sds = k.shared_array(Ty::scalar(Scalar::F32), SharedLen::Fixed(bq * bk));
    let (b, h, qb) = block_coords(k, &c.p, bq, c.causal);
    let bqc = k.u32(bq);
    let q0 = k.mul(qb, bqc);
    let i = k.add(q0, c.r);
    let kend = key_end(k, &c.p, b);
    let (qv, kv, vv, dov) = (c.p.views[0], c.p.views[1], c.p.views[2], c.p.views[3]);
    c.load_tile(k, qv, (b, h), q0, c.p.t, bq, sq, None);
    c.load_tile(k, dov, (b, h), q0, c.p.t, bq, sdo, None);
    let (l, d) = row_stats(k, &c, b, h, i);
    let kmax = c.key_limit(k, q0, kend);
    let nkb = blocks(k, kmax, bk);
    let acc = c.zero_accs(k);
    let (z, one) = (k.u32(0), k.u32(1));
    k.for_range(z, nkb, one, |k, kb| {
        let bkc = k.u32(bk);
        let k0 = k.mul(kb, bkc);
        k.workgroup_barrier();
        c.load_tile(k, kv, (b, h), k0, kend, bk, sk, None);
        c.load_tile(k, vv, (b, h), k0, kend, bk, sv, None);
        k.workgroup_barrier();
        let cols = c.my_cols(k, bk);
        let dots = c.dots(k, &[(sq, c.r, sk), (sdo, c.r, sv)], &cols);
        let rowbase = k.mul(c.r, bkc);
        for (jj, &col) in cols.iter().enumerate() {
            let j = k.add(k0, col);
            let kp = keep(k, c.causal, i, j, kend);
            let (_, ds) = p_ds(k, &c, dots[0][jj], dots[1][jj], kp, l, d);
            let at = k.add(rowbase, col);
            k.shared_store(sds, at, ds);
        }
        k.workgroup_barrier();
        let (z, one) = (k.u32(0), k.u32(1));
        k.for_range(z, bkc, one, |k, col| {
            let at = k.add(rowbase, col);
            let ds = k.shared_load(sds, at);
            c.axpy(k, &acc, ds, sk, col);
        });
    });
    c.store_row(k, c.p.outs[0], &acc, (b, h), i, c.p.scale);
    kb.finish()
}
