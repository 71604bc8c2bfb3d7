//! The SIMT backward: DkDv per key block and Dq per query block, P recomputed from L.

use helios_spirv::{KernelBuilder, KernelModule, Scalar, SharedLen, Ty, Val};

use super::{base2_scale, Ctx};
use crate::attention::params::{
    block_coords, key_blocks, key_end, query_blocks, stat_index, TileRows,
};
use crate::attention::signature::AttentionKernel;

/// L·log2 e and Dsum of query `i` (L = +inf, Dsum = 0 past T, so P = 0 there).
fn row_stats(k: &mut KernelBuilder, c: &Ctx, b: Val, h: Val, i: Val) -> (Val, Val) {
    let inside = k.lt(i, c.p.t);
    let z = k.u32(0);
    let ic = k.select(inside, i, z);
    let at = stat_index(k, &c.p, b, h, ic);
    let l = k.load(c.p.lse.expect("backward reads lse"), at, 1);
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let l = k.mul(l, log2e);
    let d = k.load(c.p.dsum.expect("backward reads dsum"), at, 1);
    let inf = k.const_f32(f32::INFINITY);
    let zero = k.const_f32(0.0);
    let l = k.select(inside, l, inf);
    let d = k.select(inside, d, zero);
    (l, d)
}

/// P = exp2(s − L) and dS = P·(dP − Dsum) (s and L in base 2).
fn p_ds(k: &mut KernelBuilder, s: Val, dp: Val, l: Val, dsum: Val) -> (Val, Val) {
    let x = k.sub(s, l);
    let p = k.exp2(x);
    let d = k.sub(dp, dsum);
    let ds = k.mul(p, d);
    (p, ds)
}

pub(crate) fn dkdv(kern: &AttentionKernel) -> KernelModule {
    let (mut kb, c) = Ctx::new(kern);
    let k = &mut kb;
    let (bq, bk) = (c.bq, c.bk);
    let sk = c.head_tile(k, bk);
    let sv = c.head_tile(k, bk);
    let sq = c.head_tile(k, bq);
    let sdo = c.head_tile(k, bq);
    let spt = c.score_tile(k, bk, bq);
    let sdst = c.score_tile(k, bk, bq);
    let f = Ty::scalar(Scalar::F32);
    let sl = k.shared_array(f, SharedLen::Fixed(bq));
    let sd = k.shared_array(f, SharedLen::Fixed(bq));
    let (b, h, kblk) = block_coords(k, &c.p, bk, false);
    let bkc = k.u32(bk);
    let k0 = k.mul(kblk, bkc);
    let kend = key_end(k, &c.p, b);
    let (qv, kv, vv, dov) = (c.p.views[0], c.p.views[1], c.p.views[2], c.p.views[3]);
    // K staged in base-2 score units: Sᵀ = K·Qᵀ comes out scaled.
    let s2 = base2_scale(k, &c);
    let keys = TileRows {
        b,
        h,
        t0: k0,
        tend: kend,
        count: bk,
    };
    c.load_tile(k, kv, &keys, sk, Some(s2));
    c.load_tile(k, vv, &keys, sv, None);
    let dk = c.zero_accs(k);
    let dvs = c.zero_accs(k);
    let (qstart, nqb) = query_blocks(k, &c.p, c.causal, k0, kend, bq);
    let bqc = k.u32(bq);
    let keys: Vec<Val> = c.rows.iter().map(|&r| k.add(k0, r)).collect();
    let one = k.u32(1);
    k.for_range(qstart, nqb, one, |k, qb| {
        let i0 = k.mul(qb, bqc);
        k.workgroup_barrier();
        let queries = TileRows {
            b,
            h,
            t0: i0,
            tend: c.p.t,
            count: bq,
        };
        c.load_tile(k, qv, &queries, sq, None);
        c.load_tile(k, dov, &queries, sdo, None);
        let step = k.u32(c.wg);
        k.for_range(c.tid, bqc, step, |k, idx| {
            let i = k.add(i0, idx);
            let (l, d) = row_stats(k, &c, b, h, i);
            k.shared_store(sl, idx, l);
            k.shared_store(sd, idx, d);
        });
        k.workgroup_barrier();
        let qs = c.cols(k, bq);
        let mut prods = c.dots(k, &[(sk, sq), (sv, sdo)], &qs);
        let dpt = prods.pop().expect("two products");
        let st = prods.pop().expect("two products");
        let stats: Vec<(Val, Val)> = qs
            .iter()
            .map(|&q| (k.shared_load(sl, q), k.shared_load(sd, q)))
            .collect();
        let mut p = Vec::new();
        let mut ds = Vec::new();
        for (srow, dprow) in st.iter().zip(&dpt) {
            let (mut pr, mut dr) = (Vec::new(), Vec::new());
            for (j, (&s, &dp)) in srow.iter().zip(dprow).enumerate() {
                let (x, y) = p_ds(k, s, dp, stats[j].0, stats[j].1);
                pr.push(x);
                dr.push(y);
            }
            p.push(pr);
            ds.push(dr);
        }
        let need = c.needs_mask(k, i0, k0, kend);
        let qk = |k: &mut KernelBuilder, i: usize, j: usize| (k.add(i0, qs[j]), keys[i]);
        let mut masked = c.mask(k, vec![p, ds], need, &qk, kend, 0.0);
        let ds = masked.pop().expect("two matrices");
        let p = masked.pop().expect("two matrices");
        c.store_scores(k, spt, &qs, &p);
        c.store_scores(k, sdst, &qs, &ds);
        k.workgroup_barrier();
        c.axpy(k, &[(&dvs, spt, sdo), (&dk, sdst, sq)], bq);
    });
    let onef = k.const_f32(1.0);
    let scale: Vec<Val> = c.rows.iter().map(|_| c.p.scale).collect();
    let ones: Vec<Val> = c.rows.iter().map(|_| onef).collect();
    c.store_rows(k, c.p.outs[0], &dk, (b, h), k0, &scale);
    c.store_rows(k, c.p.outs[1], &dvs, (b, h), k0, &ones);
    kb.finish()
}

pub(crate) fn dq(kern: &AttentionKernel) -> KernelModule {
    let (mut kb, c) = Ctx::new(kern);
    let k = &mut kb;
    let (bq, bk) = (c.bq, c.bk);
    let sq = c.head_tile(k, bq);
    let sdo = c.head_tile(k, bq);
    let sk = c.head_tile(k, bk);
    let sv = c.head_tile(k, bk);
    let sds = c.score_tile(k, bq, bk);
    let (b, h, qb) = block_coords(k, &c.p, bq, c.causal);
    let bqc = k.u32(bq);
    let q0 = k.mul(qb, bqc);
    let kend = key_end(k, &c.p, b);
    let (qv, dov) = (c.p.views[0], c.p.views[3]);
    // Q staged in base-2 score units; dQ = scale·dS·K does not involve it.
    let s2 = base2_scale(k, &c);
    let rows = TileRows {
        b,
        h,
        t0: q0,
        tend: c.p.t,
        count: bq,
    };
    c.load_tile(k, qv, &rows, sq, Some(s2));
    c.load_tile(k, dov, &rows, sdo, None);
    let queries: Vec<Val> = c.rows.iter().map(|&r| k.add(q0, r)).collect();
    let stats: Vec<(Val, Val)> = queries.iter().map(|&i| row_stats(k, &c, b, h, i)).collect();
    let nkb = key_blocks(k, c.causal, (q0, bq), kend, bk);
    let acc = c.zero_accs(k);
    c.over_key_blocks(k, (b, h), nkb, kend, (sk, sv), |k, k0| {
        let cols = c.cols(k, bk);
        let mut prods = c.dots(k, &[(sq, sk), (sdo, sv)], &cols);
        let dp = prods.pop().expect("two products");
        let s = prods.pop().expect("two products");
        let ds: Vec<Vec<Val>> = s
            .iter()
            .zip(&dp)
            .enumerate()
            .map(|(i, (srow, dprow))| {
                srow.iter()
                    .zip(dprow)
                    .map(|(&s, &dp)| p_ds(k, s, dp, stats[i].0, stats[i].1).1)
                    .collect()
            })
            .collect();
        let need = c.needs_mask(k, q0, k0, kend);
        let qk = |k: &mut KernelBuilder, i: usize, j: usize| (queries[i], k.add(k0, cols[j]));
        let ds = c.mask(k, vec![ds], need, &qk, kend, 0.0).remove(0);
        c.store_scores(k, sds, &cols, &ds);
        k.workgroup_barrier();
        c.axpy(k, &[(&acc, sds, sk)], bk);
    });
    let scale: Vec<Val> = c.rows.iter().map(|_| c.p.scale).collect();
    c.store_rows(k, c.p.outs[0], &acc, (b, h), q0, &scale);
    kb.finish()
}
