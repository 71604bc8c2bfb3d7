//! Cooperative-matrix attention backward (f16/bf16, f32 accumulation): dK/dV per key block
//! and dQ per query block, FlashAttention-2 style with P recomputed from the saved L.
//!
//! The one decision a reader must know: every element-wise step (mask, P = exp(S·scale − L),
//! dS = P ∘ (dP − Dsum)) runs on f32 score tiles a subgroup stores to its scratch; its 32
//! invocations (two per row) read their half rows into registers, wait for the whole
//! subgroup, and write P and dS back as halves *over the same scratch* (the half tiles are
//! smaller), which then feed the matrix units as A fragments. DkDv works on transposed
//! scores (Sᵀ = K·Qᵀ), so P and dS come out as the Pᵀ and dSᵀ its products dV += Pᵀ·dO and
//! dK += dSᵀ·Q want, with no transpose pass. No accumulator needs a per-row rescale here.

use helios_spirv::{
    CoopLayout, CoopMat, CoopTy, CoopUse, CoopVar, KernelBuilder, KernelModule, Scalar, Shared,
    SharedLen, Ty, Val,
};

use super::frag::{
    pack2, remaining, row_frags, row_limit, stage, zero_accs, OutRows, FRAG, SUBGROUP, WORD,
};
use super::layout::frag_scalar;
use super::params::{block_coords, key_blocks, key_end, query_blocks, stat_index, TileRows};
use super::signature::{AttentionKernel, AttnStage};
use crate::storage::store_f32;

/// The first query offset c (from `i_base`) that sees key `j`: j − i_base when causal and
/// j > i_base, else 0; u32::MAX for a key at or past `kend` (no query sees it).
fn first_query(k: &mut KernelBuilder, causal: bool, j: Val, i_base: Val, kend: Val) -> Val {
    let zero = k.u32(0);
    let thr = if causal {
        let later = k.gt(j, i_base);
        let d = k.sub(j, i_base);
        k.select(later, d, zero)
    } else {
        zero
    };
    let exists = k.lt(j, kend);
    let none = k.u32(u32::MAX);
    k.select(exists, thr, none)
}

/// Word offsets of a backward kernel's shared array.
pub(crate) struct BwdLayout {
    row: u32,
    /// Resident tiles: DkDv K, V (bk rows); Dq K, V (bk rows).
    k: u32,
    v: u32,
    /// DkDv: Q, dO tiles (bq rows) restaged per query block; Dq: Q then dO staged once.
    q: u32,
    dout: u32,
    /// L and Dsum of the query block (DkDv; f32, bq each).
    stats: u32,
    /// Start of the subgroups' scratch (two f32 16 × n tiles each).
    scratch: u32,
    per_sg: u32,
    pub total: u32,
}

impl BwdLayout {
    /// The `n`-row tile staged at word `word`.
    fn staged(&self, word: u32, n: u32) -> Staged {
        Staged {
            word,
            row: self.row,
            n,
        }
    }
}

/// An `n`-row tile staged in shared memory from word `word`, `row` words per row: the
/// products' B operand (its rows are the score columns).
#[derive(Clone, Copy)]
struct Staged {
    word: u32,
    row: u32,
    n: u32,
}

pub(crate) fn layout(kern: &AttentionKernel) -> BwdLayout {
    let (bq, bk) = kern.variant.blocks();
    let row = kern.head_dim / WORD + 1;
    match kern.stage {
        AttnStage::DkDv => {
            let (k, v) = (0, bk * row);
            let q = 2 * bk * row;
            let dout = q + bq * row;
            let stats = dout + bq * row;
            let scratch = stats + 2 * bq / 4;
            let per_sg = 2 * FRAG * bq / 4;
            BwdLayout {
                row,
                k,
                v,
                q,
                dout,
                stats,
                scratch,
                per_sg,
                total: scratch + bk / FRAG * per_sg,
            }
        }
        _ => {
            let (k, v) = (0, bk * row);
            let scratch = 2 * bk * row;
            let per_sg = 2 * FRAG * bk / 4;
            let region = (bq * row).max(bq / FRAG * per_sg);
            BwdLayout {
                row,
                k,
                v,
                q: scratch,
                dout: scratch,
                stats: 0,
                scratch,
                per_sg,
                total: scratch + region,
            }
        }
    }
}

/// The subgroup's part of a workgroup.
struct Sg {
    tid: Val,
    /// 16·subgroup id.
    row0: Val,
    /// Row (r) and half (h) of the invocation in its subgroup's 16-row tiles.
    r: Val,
    half: Val,
    /// This subgroup's two scratch tiles (word offsets).
    s_at: Val,
    d_at: Val,
}

fn subgroup(k: &mut KernelBuilder, lay: &BwdLayout, n: u32) -> Sg {
    let tid = k.local_index();
    let sg = k.subgroup_id();
    let lane = k.subgroup_invocation_id();
    let two = k.u32(2);
    let r = k.div(lane, two);
    let half = k.rem(lane, two);
    let sixteen = k.u32(FRAG);
    let row0 = k.mul(sg, sixteen);
    let per = k.u32(lay.per_sg);
    let mine = k.mul(sg, per);
    let sc = k.u32(lay.scratch);
    let s_at = k.add(mine, sc);
    let tile = k.u32(FRAG * n / 4);
    let d_at = k.add(s_at, tile);
    Sg {
        tid,
        row0,
        r,
        half,
        s_at,
        d_at,
    }
}

/// The `n / 2` f32 values of half row (r, half) of the 16 × n f32 tile at `at`.
fn read_half(k: &mut KernelBuilder, smem: Shared, at: Val, g: &Sg, n: u32) -> Vec<Val> {
    let rw = k.u32(n / 4);
    let base = k.mul(g.r, rw);
    let hw = k.u32(n / 8);
    let ho = k.mul(g.half, hw);
    let base = k.add(base, ho);
    let base = k.add(base, at);
    let mut out = Vec::new();
    for w in 0..n / 8 {
        let o = k.u32(w);
        let a = k.add(base, o);
        let raw = k.shared_load(smem, a);
        let v = k.bitcast(raw, Ty::vector(Scalar::F32, 4));
        for c in 0..4 {
            out.push(k.extract(v, c));
        }
    }
    out
}

/// Writes `vals` (n/2 f32) as halves into half row (r, half) of the 16 × n half tile at
/// `at` (rows of n/8 + 1 words).
fn write_half(
    k: &mut KernelBuilder,
    smem: Shared,
    at: Val,
    g: &Sg,
    n: u32,
    vals: &[Val],
    s: crate::Storage,
) {
    let rw = k.u32(n / WORD + 1);
    let base = k.mul(g.r, rw);
    let hw = k.u32(n / 16);
    let ho = k.mul(g.half, hw);
    let base = k.add(base, ho);
    let base = k.add(base, at);
    for w in 0..n / 16 {
        let pk: Vec<Val> = (0..4)
            .map(|q| {
                let i = (w * 8 + q * 2) as usize;
                pack2(k, s, vals[i], vals[i + 1])
            })
            .collect();
        let wv = k.vector(&pk);
        let o = k.u32(w);
        let a = k.add(base, o);
        k.shared_store(smem, a, wv);
    }
}

/// Stores accumulators `acc` (16 × D of this subgroup's rows; `dest.t0` is the invocation's
/// row, written when below T) times `mul` (a scalar, or a fragment multiplied element-wise)
/// to the dense output, fragment by fragment through the subgroup's first 16×16 f32 scratch
/// tile: the invocation writes half `half` (8 columns) of row `r` of it.
fn store_rows(
    k: &mut KernelBuilder,
    smem: Shared,
    kern: &AttentionKernel,
    g: &Sg,
    acc: &[CoopVar],
    dest: &OutRows,
    mul: Result<CoopMat, Val>,
) {
    let (r, half, tile) = (g.r, g.half, g.s_at);
    let OutRows {
        view: out,
        b,
        h,
        t0: t,
        tend,
    } = *dest;
    let four = k.u32(4);
    let two = k.u32(2);
    let eight = k.u32(8);
    let inside = k.lt(t, tend);
    for (dc, &a) in acc.iter().enumerate() {
        let o = k.coop_get(a);
        let o = match mul {
            Ok(f) => k.coop_binary(helios_spirv::BinOp::Mul, o, f),
            Err(s) => k.coop_scale(o, s),
        };
        k.coop_store_shared(o, smem, tile, four, CoopLayout::RowMajor);
        k.subgroup_barrier();
        let rb = k.mul(r, four);
        let hb = k.mul(half, two);
        let at = k.add(rb, hb);
        let at = k.add(at, tile);
        k.if_(inside, |k| {
            let base = out.row(k, b, t, h);
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
                store_f32(k, out.buf, dst, v, kern.storage);
            }
        });
        k.subgroup_barrier();
    }
}

/// 16 × n scores into the f32 tile at `at`: Σ_dc A[dc]·B(dc, block), B fragments read
/// column-major from the staged `n`-row tile (its rows are the score columns).
fn scores(k: &mut KernelBuilder, smem: Shared, ty: &Types, a: &[CoopMat], staged: Staged, at: Val) {
    let Staged { word: tile, row, n } = staged;
    let (b_ty, acc_ty) = (ty.b, ty.acc);
    let rowc = k.u32(row);
    let stride = k.u32(n / 4);
    for c in 0..n / FRAG {
        let mut s = k.coop_zero(acc_ty);
        for (dc, &x) in a.iter().enumerate() {
            let w = k.u32(tile + c * FRAG * row + dc as u32 * 2);
            let y = k.coop_load_shared(b_ty, smem, w, rowc, CoopLayout::ColumnMajor);
            s = k.coop_muladd(x, y, s);
        }
        let o = k.u32(c * 4);
        let w = k.add(at, o);
        k.coop_store_shared(s, smem, w, stride, CoopLayout::RowMajor);
    }
}

/// acc[dc] += Σ_c A(c)·tile(c, dc): A fragments from the 16 × n half tile at `at`, B
/// fragments row-major from the staged `n`-row tile.
fn accumulate(
    k: &mut KernelBuilder,
    smem: Shared,
    ty: &Types,
    acc: &[CoopVar],
    at: Val,
    staged: Staged,
) {
    let Staged { word: tile, row, n } = staged;
    let (a_ty, b_ty) = (ty.a, ty.b);
    let hr = k.u32(n / WORD + 1);
    let af: Vec<CoopMat> = (0..n / FRAG)
        .map(|c| {
            let o = k.u32(c * 2);
            let w = k.add(at, o);
            k.coop_load_shared(a_ty, smem, w, hr, CoopLayout::RowMajor)
        })
        .collect();
    let rowc = k.u32(row);
    for (dc, &v) in acc.iter().enumerate() {
        let mut o = k.coop_get(v);
        for (c, &x) in af.iter().enumerate() {
            let w = k.u32(tile + c as u32 * FRAG * row + dc as u32 * 2);
            let y = k.coop_load_shared(b_ty, smem, w, rowc, CoopLayout::RowMajor);
            o = k.coop_muladd(x, y, o);
        }
        k.coop_set(v, o);
    }
}

struct Types {
    a: CoopTy,
    b: CoopTy,
    acc: CoopTy,
}

fn types(kern: &AttentionKernel) -> Types {
    let s = frag_scalar(kern.storage);
    Types {
        a: CoopTy::new(s, FRAG, FRAG, CoopUse::A),
        b: CoopTy::new(s, FRAG, FRAG, CoopUse::B),
        acc: CoopTy::new(Scalar::F32, FRAG, FRAG, CoopUse::Accumulator),
    }
}

pub(crate) fn dkdv(kern: &AttentionKernel) -> KernelModule {
    let (bq, bk) = kern.variant.blocks();
    let d = kern.head_dim;
    let lay = layout(kern);
    let threads = bk / FRAG * SUBGROUP;
    let mut kb = KernelBuilder::new(kern.name(), kern.binding, [threads, 1, 1]);
    let k = &mut kb;
    let p = kern.declare(k, true);
    let smem = k.shared_array(Ty::vector(Scalar::U32, 4), SharedLen::Fixed(lay.total));
    let ty = types(kern);
    let g = subgroup(k, &lay, bq);
    let (b, h, kblk) = block_coords(k, &p, bk, false);
    let bkc = k.u32(bk);
    let k0 = k.mul(kblk, bkc);
    let j = k.add(k0, g.row0);
    let j = k.add(j, g.r);
    let kend = key_end(k, &p, b);
    let (qv, kv, vv, dov) = (p.views[0], p.views[1], p.views[2], p.views[3]);
    let keys = TileRows {
        b,
        h,
        t0: k0,
        tend: kend,
        count: bk,
    };
    stage(k, smem, (lay.k, lay.row), kv, &keys, (g.tid, threads));
    stage(k, smem, (lay.v, lay.row), vv, &keys, (g.tid, threads));
    k.workgroup_barrier();
    let kf = row_frags(k, smem, ty.a, lay.k, lay.row, g.row0, d);
    let vf = row_frags(k, smem, ty.a, lay.v, lay.row, g.row0, d);
    let dk = zero_accs(k, ty.acc, d / FRAG);
    let dv = zero_accs(k, ty.acc, d / FRAG);
    let (qstart, nqb) = query_blocks(k, &p, kern.causal, k0, kend, bq);
    let bqc = k.u32(bq);
    let one = k.u32(1);
    let lse = p.lse.expect("backward reads lse");
    let dsum = p.dsum.expect("backward reads dsum");
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let scale2 = k.mul(p.scale, log2e);
    k.for_range(qstart, nqb, one, |k, qb| {
        let i0 = k.mul(qb, bqc);
        k.workgroup_barrier();
        let queries = TileRows {
            b,
            h,
            t0: i0,
            tend: p.t,
            count: bq,
        };
        stage(k, smem, (lay.q, lay.row), qv, &queries, (g.tid, threads));
        stage(
            k,
            smem,
            (lay.dout, lay.row),
            dov,
            &queries,
            (g.tid, threads),
        );
        // L (+inf past T, so P = 0 there) and Dsum of the block's queries.
        let step = k.u32(threads);
        k.for_range(g.tid, bqc, step, |k, idx| {
            let i = k.add(i0, idx);
            let inside = k.lt(i, p.t);
            let z = k.u32(0);
            let ic = k.select(inside, i, z);
            let at = stat_index(k, &p, b, h, ic);
            let l = k.load(lse, at, 1);
            let ds = k.load(dsum, at, 1);
            let inf = k.const_f32(f32::INFINITY);
            let zero = k.const_f32(0.0);
            let l = k.select(inside, l, inf);
            // −L in base 2, for exp2(S·scale·log2 e − L·log2 e) as one fma.
            let log2e = k.const_f32(-std::f32::consts::LOG2_E);
            let l = k.mul(l, log2e);
            let ds = k.select(inside, ds, zero);
            let four = k.u32(4);
            let w = k.div(idx, four);
            let lane = k.rem(idx, four);
            let u = Ty::scalar(Scalar::U32);
            let st = k.u32(lay.stats);
            let wl = k.add(st, w);
            let lb = k.bitcast(l, u);
            k.shared_store_lane(smem, wl, lane, lb);
            let off = k.u32(bq / 4);
            let wd = k.add(wl, off);
            let db = k.bitcast(ds, u);
            k.shared_store_lane(smem, wd, lane, db);
        });
        k.workgroup_barrier();
        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (16 keys × bq queries).
        scores(k, smem, &ty, &kf, lay.staged(lay.q, bq), g.s_at);
        scores(k, smem, &ty, &vf, lay.staged(lay.dout, bq), g.d_at);
        k.subgroup_barrier();
        let s = read_half(k, smem, g.s_at, &g, bq);
        let dp = read_half(k, smem, g.d_at, &g, bq);
        // The half row's L and Dsum: words of the stats area.
        let colh = k.u32(bq / 2);
        let c0 = k.mul(g.half, colh);
        let four = k.u32(4);
        let w0 = k.div(c0, four);
        let st = k.u32(lay.stats);
        let w0 = k.add(w0, st);
        let mut ls = Vec::new();
        let mut dss = Vec::new();
        for w in 0..bq / 8 {
            let o = k.u32(w);
            let a = k.add(w0, o);
            let raw = k.shared_load(smem, a);
            let lv = k.bitcast(raw, Ty::vector(Scalar::F32, 4));
            let o2 = k.u32(bq / 4);
            let a2 = k.add(a, o2);
            let raw = k.shared_load(smem, a2);
            let dv4 = k.bitcast(raw, Ty::vector(Scalar::F32, 4));
            for c in 0..4 {
                ls.push(k.extract(lv, c));
                dss.push(k.extract(dv4, c));
            }
        }
        let i_base = k.add(i0, c0);
        // Query i_base + c sees key j when c >= thr (thr = ∞ for a key past kend).
        let thr = first_query(k, kern.causal, j, i_base, kend);
        let mut pv = Vec::new();
        let mut dsv = Vec::new();
        for c in 0..(bq / 2) as usize {
            let o = k.u32(c as u32);
            let kp = k.le(thr, o);
            let x = k.fma(s[c], scale2, ls[c]);
            let e = k.exp2(x);
            let zero = k.const_f32(0.0);
            let pr = k.select(kp, e, zero);
            let dd = k.sub(dp[c], dss[c]);
            dsv.push(k.mul(pr, dd));
            pv.push(pr);
        }
        k.subgroup_barrier();
        write_half(k, smem, g.s_at, &g, bq, &pv, kern.storage);
        write_half(k, smem, g.d_at, &g, bq, &dsv, kern.storage);
        k.subgroup_barrier();
        // dV += Pᵀ·dO, dK += dSᵀ·Q.
        accumulate(k, smem, &ty, &dv, g.s_at, lay.staged(lay.dout, bq));
        accumulate(k, smem, &ty, &dk, g.d_at, lay.staged(lay.q, bq));
    });
    k.workgroup_barrier();
    let onef = k.const_f32(1.0);
    let dk_rows = OutRows::of(&p, 0, (b, h), j);
    let dv_rows = OutRows::of(&p, 1, (b, h), j);
    store_rows(k, smem, kern, &g, &dk, &dk_rows, Err(p.scale));
    store_rows(k, smem, kern, &g, &dv, &dv_rows, Err(onef));
    kb.finish()
}

pub(crate) fn dq(kern: &AttentionKernel) -> KernelModule {
    let (bq, bk) = kern.variant.blocks();
    let d = kern.head_dim;
    let lay = layout(kern);
    let threads = bq / FRAG * SUBGROUP;
    let mut kb = KernelBuilder::new(kern.name(), kern.binding, [threads, 1, 1]);
    let k = &mut kb;
    let p = kern.declare(k, true);
    let smem = k.shared_array(Ty::vector(Scalar::U32, 4), SharedLen::Fixed(lay.total));
    let ty = types(kern);
    let g = subgroup(k, &lay, bk);
    let (b, h, qb) = block_coords(k, &p, bq, kern.causal);
    let bqc = k.u32(bq);
    let q0 = k.mul(qb, bqc);
    let i = k.add(q0, g.row0);
    let i = k.add(i, g.r);
    let kend = key_end(k, &p, b);
    let (qv, kv, vv, dov) = (p.views[0], p.views[1], p.views[2], p.views[3]);
    // Q, then dO, through the scratch region into A fragments.
    let queries = TileRows {
        b,
        h,
        t0: q0,
        tend: p.t,
        count: bq,
    };
    stage(k, smem, (lay.q, lay.row), qv, &queries, (g.tid, threads));
    k.workgroup_barrier();
    let qf = row_frags(k, smem, ty.a, lay.q, lay.row, g.row0, d);
    k.workgroup_barrier();
    stage(
        k,
        smem,
        (lay.dout, lay.row),
        dov,
        &queries,
        (g.tid, threads),
    );
    k.workgroup_barrier();
    let of = row_frags(k, smem, ty.a, lay.dout, lay.row, g.row0, d);
    k.workgroup_barrier();
    // L (+inf past T) and Dsum of the invocation's query.
    let inside = k.lt(i, p.t);
    let z = k.u32(0);
    let ic = k.select(inside, i, z);
    let at = stat_index(k, &p, b, h, ic);
    let l = k.load(p.lse.expect("backward reads lse"), at, 1);
    let dsum = k.load(p.dsum.expect("backward reads dsum"), at, 1);
    let inf = k.const_f32(f32::INFINITY);
    let zero = k.const_f32(0.0);
    let l = k.select(inside, l, inf);
    let dsum = k.select(inside, dsum, zero);
    // Base 2: P = exp2(S·scale·log2 e − L·log2 e).
    let nlog2e = k.const_f32(-std::f32::consts::LOG2_E);
    let nl2 = k.mul(l, nlog2e);
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let scale2 = k.mul(p.scale, log2e);
    let lim = row_limit(k, kern.causal, i, kend);
    let acc = zero_accs(k, ty.acc, d / FRAG);
    let nkb = key_blocks(k, kern.causal, (q0, bq), kend, bk);
    let bkc = k.u32(bk);
    let (z, one) = (k.u32(0), k.u32(1));
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
        stage(k, smem, (lay.k, lay.row), kv, &keys, (g.tid, threads));
        stage(k, smem, (lay.v, lay.row), vv, &keys, (g.tid, threads));
        k.workgroup_barrier();
        // S = Q·Kᵀ, dP = dO·Vᵀ (16 queries × bk keys).
        scores(k, smem, &ty, &qf, lay.staged(lay.k, bk), g.s_at);
        scores(k, smem, &ty, &of, lay.staged(lay.v, bk), g.d_at);
        k.subgroup_barrier();
        let s = read_half(k, smem, g.s_at, &g, bk);
        let dp = read_half(k, smem, g.d_at, &g, bk);
        let colh = k.u32(bk / 2);
        let c0 = k.mul(g.half, colh);
        let j_base = k.add(k0, c0);
        let rem = remaining(k, lim, j_base);
        let dsv: Vec<Val> = (0..(bk / 2) as usize)
            .map(|c| {
                let o = k.u32(c as u32);
                let kp = k.lt(o, rem);
                let x = k.fma(s[c], scale2, nl2);
                let e = k.exp2(x);
                let zero = k.const_f32(0.0);
                let pr = k.select(kp, e, zero);
                let dd = k.sub(dp[c], dsum);
                k.mul(pr, dd)
            })
            .collect();
        k.subgroup_barrier();
        write_half(k, smem, g.s_at, &g, bk, &dsv, kern.storage);
        k.subgroup_barrier();
        // dQ += dS·K.
        accumulate(k, smem, &ty, &acc, g.s_at, lay.staged(lay.k, bk));
    });
    k.workgroup_barrier();
    let dq_rows = OutRows::of(&p, 0, (b, h), i);
    store_rows(k, smem, kern, &g, &acc, &dq_rows, Err(p.scale));
    kb.finish()
}
