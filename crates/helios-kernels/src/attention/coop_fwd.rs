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
    Shared, SharedLen, Ty, Val, Var,
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

/// What the forward's phases share: the kernel, its shared array and fragment types, and
/// this invocation's place (row r of its subgroup's 16, the half of that row it owns).
struct Fwd<'a> {
    kern: &'a AttentionKernel,
    lay: Layout,
    p: Params,
    smem: Shared,
    a_ty: CoopTy,
    b_ty: CoopTy,
    acc_ty: CoopTy,
    b: Val,
    h: Val,
    tid: Val,
    threads: u32,
    sg: Val,
    r: Val,
    half: Val,
    /// The block's first query and this subgroup's first row in it.
    q0: Val,
    sg_row: Val,
    /// This invocation's query row.
    i: Val,
    kend: Val,
    /// Words per staged row, as a value (the fragments' stride).
    rowc: Val,
}

/// Word addresses of this subgroup's scratch: S, P and the row-factor tile.
struct Scratch {
    s: Val,
    p: Val,
    c: Val,
}

/// The state carried across key blocks: the O accumulators, and the running max and sum
/// of this invocation's row in base 2.
struct Running {
    acc: Vec<CoopVar>,
    m: Var,
    l: Var,
}

/// Builds the forward: Q staged once, then per key block the scores, the online softmax and
/// the O update, then O / l and L.
pub(crate) fn forward(kern: &AttentionKernel) -> KernelModule {
    let (mut kb, f) = setup(kern);
    let k = &mut kb;
    let qf = load_q(k, &f);
    let sc = scratch(k, &f);
    let run = running(k, &f);
    key_loop(k, &f, &qf, &sc, &run);
    let t = totals(k, &run);
    let inside = store_o(k, &f, &sc, &run, &t);
    store_lse(k, &f, inside, &t);
    kb.finish()
}

/// Begins the kernel: builder, parameters, shared array, fragment types, and this
/// invocation's coordinates (head, query row, key end).
fn setup(kern: &AttentionKernel) -> (KernelBuilder, Fwd<'_>) {
    let (bq, _) = kern.variant.blocks();
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
    let rowc = k.u32(lay.row);
    let f = Fwd {
        kern,
        lay,
        p,
        smem,
        a_ty,
        b_ty,
        acc_ty,
        b,
        h,
        tid,
        threads,
        sg,
        r,
        half,
        q0,
        sg_row,
        i,
        kend,
        rowc,
    };
    (kb, f)
}

/// Q: staged once by the workgroup, kept as this subgroup's A fragments.
fn load_q(k: &mut KernelBuilder, f: &Fwd) -> Vec<CoopMat> {
    let (bq, _) = f.kern.variant.blocks();
    let (lay, smem, rowc) = (&f.lay, f.smem, f.rowc);
    let queries = TileRows {
        b: f.b,
        h: f.h,
        t0: f.q0,
        tend: f.p.t,
        count: bq,
    };
    let (qv, us) = (f.p.views[0], (f.tid, f.threads));
    stage(k, smem, (lay.region, lay.row), qv, &queries, us);
    k.workgroup_barrier();
    let q_base = k.mul(f.sg_row, rowc);
    let regc = k.u32(lay.region);
    let q_base = k.add(q_base, regc);
    let qf = (0..f.kern.head_dim / FRAG)
        .map(|dc| {
            let o = k.u32(dc * 2);
            let at = k.add(q_base, o);
            k.coop_load_shared(f.a_ty, smem, at, rowc, CoopLayout::RowMajor)
        })
        .collect();
    k.workgroup_barrier();
    qf
}

/// This subgroup's scratch, over the Q staging area.
fn scratch(k: &mut KernelBuilder, f: &Fwd) -> Scratch {
    let lay = &f.lay;
    let regc = k.u32(lay.region);
    let per = k.u32(lay.per_sg);
    let mine = k.mul(f.sg, per);
    let mine = k.add(mine, regc);
    let so = k.u32(lay.s_off);
    let s = k.add(mine, so);
    let po = k.u32(lay.p_off);
    let p = k.add(mine, po);
    let co = k.u32(lay.c_off);
    let c = k.add(mine, co);
    Scratch { s, p, c }
}

/// Zero O accumulators, m = −∞ and l = 0.
fn running(k: &mut KernelBuilder, f: &Fwd) -> Running {
    let acc = (0..f.kern.head_dim / FRAG)
        .map(|_| {
            let v = k.coop_var(f.acc_ty);
            let z = k.coop_zero(f.acc_ty);
            k.coop_set(v, z);
            v
        })
        .collect();
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let m = k.var_init(ninf);
    let zero = k.const_f32(0.0);
    let l = k.var_init(zero);
    Running { acc, m, l }
}

/// The walk over the key blocks: each block's K and V staged, its scores, the online
/// softmax on them, and O rescaled and advanced by P·V.
fn key_loop(k: &mut KernelBuilder, f: &Fwd, qf: &[CoopMat], sc: &Scratch, run: &Running) {
    let (bq, bk) = f.kern.variant.blocks();
    let nkb = key_blocks(k, f.kern.causal, (f.q0, bq), f.kend, bk);
    let bkc = k.u32(bk);
    let (z, one) = (k.u32(0), k.u32(1));
    // Scores in base 2 (exp2 below), and the keys this invocation's row sees: j < lim.
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let scale2 = k.mul(f.p.scale, log2e);
    let lim = row_limit(k, f.kern.causal, f.i, f.kend);
    k.for_range(z, nkb, one, |k, blk| {
        let k0 = k.mul(blk, bkc);
        stage_kv(k, f, k0);
        scores(k, f, qf, sc);
        let xs = read_scores(k, f, sc, k0, lim, scale2);
        let (ps, corr) = softmax_update(k, run, &xs);
        store_p(k, f, sc, &ps, corr);
        update_o(k, f, sc, run);
    });
}

/// Stages the K and V tiles of the key block at k0, barriers around.
fn stage_kv(k: &mut KernelBuilder, f: &Fwd, k0: Val) {
    let (_, bk) = f.kern.variant.blocks();
    let (lay, smem) = (&f.lay, f.smem);
    let (kv, vv) = (f.p.views[1], f.p.views[2]);
    k.workgroup_barrier();
    let keys = TileRows {
        b: f.b,
        h: f.h,
        t0: k0,
        tend: f.kend,
        count: bk,
    };
    stage(k, smem, (lay.k, lay.row), kv, &keys, (f.tid, f.threads));
    stage(k, smem, (lay.v, lay.row), vv, &keys, (f.tid, f.threads));
    k.workgroup_barrier();
}

/// S = Q·Kᵀ, 16 × bk, into the scratch.
fn scores(k: &mut KernelBuilder, f: &Fwd, qf: &[CoopMat], sc: &Scratch) {
    let (_, bk) = f.kern.variant.blocks();
    let lay = &f.lay;
    let s_row = bk / 4; // words per f32 score row
    let src = k.u32(s_row);
    for kc in 0..bk / FRAG {
        let mut s = k.coop_zero(f.acc_ty);
        for (dc, &qa) in qf.iter().enumerate() {
            let at = k.u32(lay.k + kc * FRAG * lay.row + dc as u32 * 2);
            let kf = k.coop_load_shared(f.b_ty, f.smem, at, f.rowc, CoopLayout::ColumnMajor);
            s = k.coop_muladd(qa, kf, s);
        }
        let o = k.u32(kc * 4);
        let at = k.add(sc.s, o);
        k.coop_store_shared(s, f.smem, at, src, CoopLayout::RowMajor);
    }
    k.subgroup_barrier();
}

/// This invocation's bk/2 scores of row r from the scratch, scaled into base 2, −∞ at keys
/// its row does not see.
fn read_scores(
    k: &mut KernelBuilder,
    f: &Fwd,
    sc: &Scratch,
    k0: Val,
    lim: Val,
    scale2: Val,
) -> Vec<Val> {
    let (_, bk) = f.kern.variant.blocks();
    let (r, half) = (f.r, f.half);
    let s_row = bk / 4; // words per f32 score row
    let words = bk / 8; // f32 words per half row
    let rs = k.u32(s_row);
    let base = k.mul(r, rs);
    let hw = k.u32(words);
    let ho = k.mul(half, hw);
    let base = k.add(base, ho);
    let base = k.add(base, sc.s);
    let colh = k.u32(bk / 2);
    let col0 = k.mul(half, colh);
    let j0 = k.add(k0, col0);
    // Keys j0 + c are kept for c < rem = max(lim − j0, 0): one compare per score.
    let rem = remaining(k, lim, j0);
    let mut xs = Vec::new();
    for w in 0..words {
        let o = k.u32(w);
        let at = k.add(base, o);
        let raw = k.shared_load(f.smem, at);
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
    xs
}

/// Online softmax on the scores `xs`, the invocation pair of a row combining by a shuffle:
/// m and l updated; returns P = exp2(x − m) and the O factor exp2(m_old − m_new).
fn softmax_update(k: &mut KernelBuilder, run: &Running, xs: &[Val]) -> (Vec<Val>, Val) {
    let mut mx = xs[0];
    for &x in &xs[1..] {
        mx = k.max(mx, x);
    }
    let one_u = k.u32(1);
    let other = k.subgroup_shuffle_xor(mx, one_u);
    let mx = k.max(mx, other);
    let mold = k.get(run.m);
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
    let lv = k.get(run.l);
    let lv = k.fma(lv, corr, sum);
    k.set(run.l, lv);
    k.set(run.m, mnew);
    (ps, corr)
}

/// Writes P as halves (8 per word) and the row factor `corr` across the factor tile.
fn store_p(k: &mut KernelBuilder, f: &Fwd, sc: &Scratch, ps: &[Val], corr: Val) {
    let (_, bk) = f.kern.variant.blocks();
    let (r, half) = (f.r, f.half);
    let p_row = bk / WORD + 1;
    let pr = k.u32(p_row);
    let pb = k.mul(r, pr);
    let hw = k.u32(bk / 16);
    let ho = k.mul(half, hw);
    let pb = k.add(pb, ho);
    let pb = k.add(pb, sc.p);
    for w in 0..bk / 16 {
        let pk: Vec<Val> = (0..4)
            .map(|q| {
                let x = ps[(w * 8 + q * 2) as usize];
                let y = ps[(w * 8 + q * 2 + 1) as usize];
                pack2(k, f.kern.storage, x, y)
            })
            .collect();
        let wv = k.vector(&pk);
        let o = k.u32(w);
        let at = k.add(pb, o);
        k.shared_store(f.smem, at, wv);
    }
    row_tile(k, f.smem, sc.c, r, half, corr);
    k.subgroup_barrier();
}

/// O = O ∘ corr + P·V, P and the factor tile from the scratch.
fn update_o(k: &mut KernelBuilder, f: &Fwd, sc: &Scratch, run: &Running) {
    let (_, bk) = f.kern.variant.blocks();
    let (lay, smem) = (&f.lay, f.smem);
    let pr = k.u32(bk / WORD + 1);
    let four = k.u32(4);
    let cm = k.coop_load_shared(f.acc_ty, smem, sc.c, four, CoopLayout::RowMajor);
    let pf: Vec<CoopMat> = (0..bk / FRAG)
        .map(|kc| {
            let o = k.u32(kc * 2);
            let at = k.add(sc.p, o);
            k.coop_load_shared(f.a_ty, smem, at, pr, CoopLayout::RowMajor)
        })
        .collect();
    for (dc, &a) in run.acc.iter().enumerate() {
        let mut o = k.coop_get(a);
        o = k.coop_binary(BinOp::Mul, o, cm);
        for (kc, &pa) in pf.iter().enumerate() {
            let at = k.u32(lay.v + kc as u32 * FRAG * lay.row + dc as u32 * 2);
            let vf = k.coop_load_shared(f.b_ty, smem, at, f.rowc, CoopLayout::RowMajor);
            o = k.coop_muladd(pa, vf, o);
        }
        k.coop_set(a, o);
    }
    k.subgroup_barrier();
}

/// The row's l and m after the last key block, and whether it saw no key (l = 0).
struct Totals {
    l: Val,
    m: Val,
    empty: Val,
}

/// Reads the row's totals after the key walk.
fn totals(k: &mut KernelBuilder, run: &Running) -> Totals {
    let l = k.get(run.l);
    let m = k.get(run.m);
    let zero = k.const_f32(0.0);
    let empty = k.eq(l, zero);
    Totals { l, m, empty }
}

/// O = O / l, through the scratch to memory with bounds checks; returns whether the row is
/// below T.
fn store_o(k: &mut KernelBuilder, f: &Fwd, sc: &Scratch, run: &Running, t: &Totals) -> Val {
    let (smem, r, half) = (f.smem, f.r, f.half);
    let zero = k.const_f32(0.0);
    let onef = k.const_f32(1.0);
    let inv = k.div(onef, t.l);
    let inv = k.select(t.empty, zero, inv);
    row_tile(k, smem, sc.c, r, half, inv);
    k.subgroup_barrier();
    let four = k.u32(4);
    let im = k.coop_load_shared(f.acc_ty, smem, sc.c, four, CoopLayout::RowMajor);
    let inside = k.lt(f.i, f.p.t);
    let out = f.p.outs[0];
    let eight = k.u32(8);
    let two = k.u32(2);
    for (dc, &a) in run.acc.iter().enumerate() {
        let o = k.coop_get(a);
        let o = k.coop_binary(BinOp::Mul, o, im);
        k.coop_store_shared(o, smem, sc.s, four, CoopLayout::RowMajor);
        k.subgroup_barrier();
        let rb = k.mul(r, four);
        let hb = k.mul(half, two);
        let at = k.add(rb, hb);
        let at = k.add(at, sc.s);
        let storage = f.kern.storage;
        k.if_(inside, |k| {
            let base = out.row(k, f.b, f.i, f.h);
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
    inside
}

/// L = m + log l of the row, written by its first invocation; m and l are in base 2:
/// L = (m + log2 l)·ln 2, −∞ for a row that saw no key.
fn store_lse(k: &mut KernelBuilder, f: &Fwd, inside: Val, t: &Totals) {
    let lg = k.log2(t.l);
    let lse = k.add(t.m, lg);
    let ln2 = k.const_f32(std::f32::consts::LN_2);
    let lse = k.mul(lse, ln2);
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let lse = k.select(t.empty, ninf, lse);
    let z = k.u32(0);
    let first = k.eq(f.half, z);
    let w = k.and(inside, first);
    let lse_buf = f.p.lse.expect("forward writes lse");
    let at = stat_index(k, &f.p, f.b, f.h, f.i);
    k.if_(w, |k| k.store(lse_buf, at, lse));
}
