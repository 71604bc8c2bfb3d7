//! The SIMT forward: online softmax over the key blocks on register tiles of [`Ctx`].

use helios_spirv::{KernelBuilder, KernelModule, Scalar, SharedLen, Ty, Val, Var};

use super::{base2_scale, safe_max, Ctx};
use crate::attention::params::{block_coords, key_blocks, key_end, stat_index, TileRows};
use crate::attention::signature::{AttentionKernel, SIMT_COLS};

pub(crate) fn forward(kern: &AttentionKernel) -> KernelModule {
    let (mut kb, c) = Ctx::new(kern);
    let k = &mut kb;
    let (bq, bk) = (c.bq, c.bk);
    let sq = c.head_tile(k, bq);
    let sk = c.head_tile(k, bk);
    let sv = c.head_tile(k, bk);
    let sp = c.score_tile(k, bq, bk);
    let f = Ty::scalar(Scalar::F32);
    let red = k.shared_array(f, SharedLen::Fixed(bq * SIMT_COLS));
    let (b, h, qb) = block_coords(k, &c.p, bq, c.causal);
    let bqc = k.u32(bq);
    let q0 = k.mul(qb, bqc);
    let kend = key_end(k, &c.p, b);
    let qv = c.p.views[0];
    let s2 = base2_scale(k, &c);
    let rows = TileRows {
        b,
        h,
        t0: q0,
        tend: c.p.t,
        count: bq,
    };
    c.load_tile(k, qv, &rows, sq, Some(s2));
    let nkb = key_blocks(k, c.causal, (q0, bq), kend, bk);
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let zero = k.const_f32(0.0);
    let m: Vec<Var> = c.rows.iter().map(|_| k.var_init(ninf)).collect();
    let l: Vec<Var> = c.rows.iter().map(|_| k.var_init(zero)).collect();
    let acc = c.zero_accs(k);
    let colsc = k.u32(SIMT_COLS);
    let red_base: Vec<Val> = c.rows.iter().map(|&r| k.mul(r, colsc)).collect();
    let queries: Vec<Val> = c.rows.iter().map(|&r| k.add(q0, r)).collect();
    c.over_key_blocks(k, (b, h), nkb, kend, (sk, sv), |k, k0| {
        let cols = c.cols(k, bk);
        let s = c.dots(k, &[(sq, sk)], &cols).remove(0);
        let need = c.needs_mask(k, q0, k0, kend);
        let qk = |k: &mut KernelBuilder, i: usize, j: usize| (queries[i], k.add(k0, cols[j]));
        let s = c
            .mask(k, vec![s], need, &qk, kend, f32::NEG_INFINITY)
            .remove(0);
        // The block's row maxima, through `red`.
        for (i, row) in s.iter().enumerate() {
            let mut mx = row[0];
            for &x in &row[1..] {
                mx = k.max(mx, x);
            }
            let at = k.add(red_base[i], c.tc);
            k.shared_store(red, at, mx);
        }
        k.workgroup_barrier();
        let mut p = Vec::with_capacity(s.len());
        for (i, row) in s.iter().enumerate() {
            let mut mx = k.get(m[i]);
            let mold = mx;
            for t in 0..SIMT_COLS {
                let o = k.u32(t);
                let at = k.add(red_base[i], o);
                let x = k.shared_load(red, at);
                mx = k.max(mx, x);
            }
            let safe = safe_max(k, mx);
            let d = k.sub(mold, safe);
            let corr = k.exp2(d);
            let lv = k.get(l[i]);
            let mut lv = k.mul(lv, corr);
            let cv = k.splat(corr, 4);
            for &a in &acc[i] {
                let x = k.get(a);
                let x = k.mul(x, cv);
                k.set(a, x);
            }
            k.set(m[i], mx);
            let pr: Vec<Val> = row
                .iter()
                .map(|&x| {
                    let d = k.sub(x, safe);
                    k.exp2(d)
                })
                .collect();
            for &x in &pr {
                lv = k.add(lv, x);
            }
            k.set(l[i], lv);
            p.push(pr);
        }
        c.store_scores(k, sp, &cols, &p);
        k.workgroup_barrier();
        c.axpy(k, &[(&acc, sp, sv)], bk);
    });
    // Each invocation summed its own columns: the row sums, through `red`.
    for (i, &li) in l.iter().enumerate() {
        let at = k.add(red_base[i], c.tc);
        let x = k.get(li);
        k.shared_store(red, at, x);
    }
    k.workgroup_barrier();
    let ln2 = k.const_f32(std::f32::consts::LN_2);
    let mut inv = Vec::new();
    let mut lse = Vec::new();
    for i in 0..c.rows.len() {
        let mut sum = k.const_f32(0.0);
        for t in 0..SIMT_COLS {
            let o = k.u32(t);
            let at = k.add(red_base[i], o);
            let x = k.shared_load(red, at);
            sum = k.add(sum, x);
        }
        let zero = k.const_f32(0.0);
        let empty = k.eq(sum, zero);
        let onef = k.const_f32(1.0);
        let r = k.div(onef, sum);
        inv.push(k.select(empty, zero, r));
        // L = m·ln 2 + ln l (m is in base 2); −inf for a row with no key.
        let mv = k.get(m[i]);
        let mv = k.mul(mv, ln2);
        let lg = k.log(sum);
        let x = k.add(mv, lg);
        let ninf = k.const_f32(f32::NEG_INFINITY);
        lse.push(k.select(empty, ninf, x));
    }
    c.store_rows(k, c.p.outs[0], &acc, (b, h), q0, &inv);
    let z = k.u32(0);
    let first = k.eq(c.tc, z);
    let lse_buf = c.p.lse.expect("forward writes lse");
    for (i, &q) in queries.iter().enumerate() {
        let inside = k.lt(q, c.p.t);
        let w = k.and(inside, first);
        let at = stat_index(k, &c.p, b, h, q);
        k.if_(w, |k| k.store(lse_buf, at, lse[i]));
    }
    kb.finish()
}
