//! Cooperative-matrix attention (f16/bf16 inputs, f32 accumulation, 16×16×16 subgroup
//! fragments, subgroups of 32).
//!
//! Forward: a workgroup owns `bq` query rows, one subgroup per 16. Q is staged once and kept
//! as A fragments; each key block's K and V tiles are staged by the whole workgroup into
//! shared memory (16-byte words, rows padded by one word against bank conflicts). A subgroup
//! computes its 16 × bk scores S = Q·Kᵀ on the matrix units, stores them to its f32 scratch,
//! and its 32 invocations (two per row) run the online softmax on them, writing P as halves
//! for the P·V product.
//!
//! The one decision a reader must know: KHR fragments do not say which invocation holds
//! which element, yet the online softmax must rescale each *row* of the O accumulators by
//! exp(m_old − m_new). Fragments of one type share one element mapping, so each row's factor
//! is written across a 16×16 f32 tile in shared memory, loaded as an accumulator fragment,
//! and multiplied into every O fragment element-wise (`OpFMul` on cooperative matrices):
//! a per-row scale without knowing the mapping, at the cost of one 1 KiB store and load per
//! key block. The final 1/l uses the same trick. Everything shared lives in one array of
//! `vec4<u32>` words, so the Q staging area is reused as the subgroups' scratch.
//!
//! Where a probe has learnt the device's fragment layout, `reg_fwd` and `reg_bwd` keep the
//! scores in registers instead, which measured much faster forward and backward
//! (bench/results/source-comment-history.md); these kernels are the ones for every other
//! device.

use helios_spirv::{
    BinOp, CoopLayout, CoopMat, CoopTy, CoopUse, CoopVar, KernelBuilder, KernelModule, Scalar,
    Shared, SharedLen, Ty, Val,
};

use super::frag::{pack2, remaining, row_limit, stage, FRAG, SUBGROUP, WORD};
use super::layout::frag_scalar;
use super::params::{block_coords, key_blocks, key_end, stat_index, Params, TileRows};
use super::signature::AttentionKernel;
use crate::storage::store_f32;

/// Word layout of the forward's shared array.
pub(crate) struct Layout {
    /// Words per staged K/V/Q row.
    row: u32,
    k: u32,
    v: u32,
    /// Start of the Q staging area, reused by the subgroups' scratch.
    region: u32,
    /// Words of one subgroup's scratch: S (f32, 16 × bk), P (halves, 16 × (bk + 8)), the
    /// row-factor tile (f32 16 × 16).
    per_sg: u32,
    s_off: u32,
    p_off: u32,
    c_off: u32,
    pub(crate) total: u32,
}

pub(crate) fn layout(kern: &AttentionKernel) -> Layout {
    let (bq, bk) = kern.variant.blocks();
    let row = kern.head_dim / WORD + 1;
    let k = 0;
    let v = bk * row;
    let region = 2 * bk * row;
    let s_words = FRAG * bk / 4;
    let p_row = bk / WORD + 1;
    let p_words = FRAG * p_row;
    let c_words = FRAG * FRAG / 4;
    let per_sg = s_words + p_words + c_words;
    let nsg = bq / FRAG;
    let total = region + (bq * row).max(nsg * per_sg);
    Layout {
        row,
        k,
        v,
        region,
        per_sg,
        s_off: 0,
        p_off: s_words,
        c_off: s_words + p_words,
        total,
    }
}

/// Writes `v` (one f32 per row) across the 16×16 f32 tile at word `at`: invocation (row r,
/// half h) fills its 8 columns.
fn row_tile(k: &mut KernelBuilder, smem: Shared, at: Val, r: Val, half: Val, v: Val) {
    let four = k.u32(4);
    let two = k.u32(2);
    let base = k.mul(r, four);
    let hh = k.mul(half, two);
    let base = k.add(base, hh);
    let base = k.add(base, at);
    let v4 = k.splat(v, 4);
    let w = k.bitcast(v4, Ty::vector(Scalar::U32, 4));
    k.shared_store(smem, base, w);
    let one = k.u32(1);
    let b1 = k.add(base, one);
    k.shared_store(smem, b1, w);
}

pub(crate) fn forward(kern: &AttentionKernel) -> KernelModule {
    let (bq, bk) = kern.variant.blocks();
    let d = kern.head_dim;
    let lay = layout(kern);
    let nsg = bq / FRAG;
    let threads = nsg * SUBGROUP;
    let mut kb = KernelBuilder::new(kern.name(), kern.binding, [threads, 1, 1]);
    let k = &mut kb;
    let p: Params = kern.declare(k, true);
    let word = Ty::vector(Scalar::U32, 4);
    let smem = k.shared_array(word, SharedLen::Fixed(lay.total));
    let scalar = frag_scalar(kern.storage);
    let a_ty = CoopTy::new(scalar, FRAG, FRAG, CoopUse::A);
    let b_ty = CoopTy::new(scalar, FRAG, FRAG, CoopUse::B);
    let acc_ty = CoopTy::new(Scalar::F32, FRAG, FRAG, CoopUse::Accumulator);

    let (b, h, qb) = block_coords(k, &p, bq, kern.causal);
    let tid = k.local_index();
    let sg = k.subgroup_id();
    let lane = k.subgroup_invocation_id();
    let two = k.u32(2);
    let r = k.div(lane, two);
    let half = k.rem(lane, two);
    let bqc = k.u32(bq);
    let q0 = k.mul(qb, bqc);
    let sixteen = k.u32(FRAG);
    let sg_row = k.mul(sg, sixteen);
    let i = k.add(q0, sg_row);
    let i = k.add(i, r);
    let kend = key_end(k, &p, b);
    let (qv, kv, vv) = (p.views[0], p.views[1], p.views[2]);
    let rowc = k.u32(lay.row);

    // Q: staged once, kept as A fragments.
    let queries = TileRows {
        b,
        h,
        t0: q0,
        tend: p.t,
        count: bq,
    };
    stage(k, smem, (lay.region, lay.row), qv, &queries, (tid, threads));
    k.workgroup_barrier();
    let q_base = k.mul(sg_row, rowc);
    let regc = k.u32(lay.region);
    let q_base = k.add(q_base, regc);
    let qf: Vec<CoopMat> = (0..d / FRAG)
        .map(|dc| {
            let o = k.u32(dc * 2);
            let at = k.add(q_base, o);
            k.coop_load_shared(a_ty, smem, at, rowc, CoopLayout::RowMajor)
        })
        .collect();
    k.workgroup_barrier();

    // This subgroup's scratch.
    let per = k.u32(lay.per_sg);
    let mine = k.mul(sg, per);
    let mine = k.add(mine, regc);
    let so = k.u32(lay.s_off);
    let s_at = k.add(mine, so);
    let po = k.u32(lay.p_off);
    let p_at = k.add(mine, po);
    let co = k.u32(lay.c_off);
    let c_at = k.add(mine, co);

    let acc: Vec<CoopVar> = (0..d / FRAG)
        .map(|_| {
            let v = k.coop_var(acc_ty);
            let z = k.coop_zero(acc_ty);
            k.coop_set(v, z);
            v
        })
        .collect();
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let m = k.var_init(ninf);
    let zero = k.const_f32(0.0);
    let l = k.var_init(zero);
    let nkb = key_blocks(k, kern.causal, (q0, bq), kend, bk);
    let bkc = k.u32(bk);
    let (z, one) = (k.u32(0), k.u32(1));
    let s_row = bk / 4; // words per f32 score row
                        // Scores in base 2 (exp2 below), and the keys this invocation's row sees: j < lim.
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let scale2 = k.mul(p.scale, log2e);
    let lim = row_limit(k, kern.causal, i, kend);
    let p_row = bk / WORD + 1;
    k.for_range(z, nkb, one, |k, blk| {
        let k0 = k.mul(blk, bkc);
        k.workgroup_barrier();
        let keys = TileRows {
            b,
            h,
            t0: k0,
            tend: kend,
            count: bk,
        };
        stage(k, smem, (lay.k, lay.row), kv, &keys, (tid, threads));
        stage(k, smem, (lay.v, lay.row), vv, &keys, (tid, threads));
        k.workgroup_barrier();
        // S = Q·Kᵀ, 16 × bk, into the scratch.
        let src = k.u32(s_row);
        for kc in 0..bk / FRAG {
            let mut s = k.coop_zero(acc_ty);
            for (dc, &qa) in qf.iter().enumerate() {
                let at = k.u32(lay.k + kc * FRAG * lay.row + dc as u32 * 2);
                let kf = k.coop_load_shared(b_ty, smem, at, rowc, CoopLayout::ColumnMajor);
                s = k.coop_muladd(qa, kf, s);
            }
            let o = k.u32(kc * 4);
            let at = k.add(s_at, o);
            k.coop_store_shared(s, smem, at, src, CoopLayout::RowMajor);
        }
        k.subgroup_barrier();
        // Online softmax: invocation (r, half) owns bk/2 scores of row r.
        let words = bk / 8; // f32 words per half row
        let rs = k.u32(s_row);
        let base = k.mul(r, rs);
        let hw = k.u32(words);
        let ho = k.mul(half, hw);
        let base = k.add(base, ho);
        let base = k.add(base, s_at);
        let colh = k.u32(bk / 2);
        let col0 = k.mul(half, colh);
        let j0 = k.add(k0, col0);
        // Keys j0 + c are kept for c < rem = max(lim − j0, 0): one compare per score.
        let rem = remaining(k, lim, j0);
        let mut xs = Vec::new();
        for w in 0..words {
            let o = k.u32(w);
            let at = k.add(base, o);
            let raw = k.shared_load(smem, at);
            let v = k.bitcast(raw, Ty::vector(Scalar::F32, 4));
            for c in 0..4 {
                let x = k.extract(v, c);
                let x = k.mul(x, scale2);
                let o = k.u32(w * 4 + c);
                let kp = k.lt(o, rem);
                let ninf = k.const_f32(f32::NEG_INFINITY);
                xs.push(k.select(kp, x, ninf));
            }
        }
        let mut mx = xs[0];
        for &x in &xs[1..] {
            mx = k.max(mx, x);
        }
        let one_u = k.u32(1);
        let other = k.subgroup_shuffle_xor(mx, one_u);
        let mx = k.max(mx, other);
        let mold = k.get(m);
        let mnew = k.max(mold, mx);
        let ninf = k.const_f32(f32::NEG_INFINITY);
        let zero = k.const_f32(0.0);
        let none = k.eq(mnew, ninf);
        let safe = k.select(none, zero, mnew);
        let dm = k.sub(mold, safe);
        let corr = k.exp2(dm);
        let ps: Vec<Val> = xs
            .iter()
            .map(|&x| {
                let dd = k.sub(x, safe);
                k.exp2(dd)
            })
            .collect();
        let mut sum = ps[0];
        for &x in &ps[1..] {
            sum = k.add(sum, x);
        }
        let other = k.subgroup_shuffle_xor(sum, one_u);
        let sum = k.add(sum, other);
        let lv = k.get(l);
        let lv = k.fma(lv, corr, sum);
        k.set(l, lv);
        k.set(m, mnew);
        // P as halves, 8 per word.
        let pr = k.u32(p_row);
        let pb = k.mul(r, pr);
        let hw = k.u32(bk / 16);
        let ho = k.mul(half, hw);
        let pb = k.add(pb, ho);
        let pb = k.add(pb, p_at);
        for w in 0..bk / 16 {
            let pk: Vec<Val> = (0..4)
                .map(|q| {
                    let x = ps[(w * 8 + q * 2) as usize];
                    let y = ps[(w * 8 + q * 2 + 1) as usize];
                    pack2(k, kern.storage, x, y)
                })
                .collect();
            let wv = k.vector(&pk);
            let o = k.u32(w);
            let at = k.add(pb, o);
            k.shared_store(smem, at, wv);
        }
        row_tile(k, smem, c_at, r, half, corr);
        k.subgroup_barrier();
        // O = O ∘ corr + P·V.
        let four = k.u32(4);
        let cm = k.coop_load_shared(acc_ty, smem, c_at, four, CoopLayout::RowMajor);
        let pf: Vec<CoopMat> = (0..bk / FRAG)
            .map(|kc| {
                let o = k.u32(kc * 2);
                let at = k.add(p_at, o);
                k.coop_load_shared(a_ty, smem, at, pr, CoopLayout::RowMajor)
            })
            .collect();
        for (dc, &a) in acc.iter().enumerate() {
            let mut o = k.coop_get(a);
            o = k.coop_binary(BinOp::Mul, o, cm);
            for (kc, &pa) in pf.iter().enumerate() {
                let at = k.u32(lay.v + kc as u32 * FRAG * lay.row + dc as u32 * 2);
                let vf = k.coop_load_shared(b_ty, smem, at, rowc, CoopLayout::RowMajor);
                o = k.coop_muladd(pa, vf, o);
            }
            k.coop_set(a, o);
        }
        k.subgroup_barrier();
    });

    // O = O / l, through the scratch to memory with bounds checks; L = m + log l.
    let lv = k.get(l);
    let mv = k.get(m);
    let zero = k.const_f32(0.0);
    let empty = k.eq(lv, zero);
    let onef = k.const_f32(1.0);
    let inv = k.div(onef, lv);
    let inv = k.select(empty, zero, inv);
    row_tile(k, smem, c_at, r, half, inv);
    k.subgroup_barrier();
    let four = k.u32(4);
    let im = k.coop_load_shared(acc_ty, smem, c_at, four, CoopLayout::RowMajor);
    let inside = k.lt(i, p.t);
    let out = p.outs[0];
    let eight = k.u32(8);
    for (dc, &a) in acc.iter().enumerate() {
        let o = k.coop_get(a);
        let o = k.coop_binary(BinOp::Mul, o, im);
        k.coop_store_shared(o, smem, s_at, four, CoopLayout::RowMajor);
        k.subgroup_barrier();
        let rb = k.mul(r, four);
        let hb = k.mul(half, two);
        let at = k.add(rb, hb);
        let at = k.add(at, s_at);
        let storage = kern.storage;
        k.if_(inside, |k| {
            let base = out.row(k, b, i, h);
            let col = k.u32(dc as u32 * FRAG);
            let base = k.add(base, col);
            let hc = k.mul(half, eight);
            let base = k.add(base, hc);
            let base = k.div(base, four);
            for q in 0..2 {
                let o = k.u32(q);
                let w = k.add(at, o);
                let raw = k.shared_load(smem, w);
                let v = k.bitcast(raw, Ty::vector(Scalar::F32, 4));
                let dst = k.add(base, o);
                store_f32(k, out.buf, dst, v, storage);
            }
        });
        k.subgroup_barrier();
    }
    // m and l are in base 2: L = (m + log2 l)·ln 2.
    let lg = k.log2(lv);
    let lse = k.add(mv, lg);
    let ln2 = k.const_f32(std::f32::consts::LN_2);
    let lse = k.mul(lse, ln2);
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let lse = k.select(empty, ninf, lse);
    let z = k.u32(0);
    let first = k.eq(half, z);
    let w = k.and(inside, first);
    let lse_buf = p.lse.expect("forward writes lse");
    let at = stat_index(k, &p, b, h, i);
    k.if_(w, |k| k.store(lse_buf, at, lse));
    kb.finish()
}
