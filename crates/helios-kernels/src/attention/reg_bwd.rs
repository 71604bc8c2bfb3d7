//! The backward with the scores in registers, on the fragment map as the forward (see
//! [`frag::regs`](super::frag::regs)): Dq, which with `own_dsum` computes Dsum itself, and
//! DkDv.

use helios_spirv::{CoopMat, CoopVar, KernelBuilder, KernelModule, Scalar, Shared, Ty, Val, Var};

use super::frag::blocks::{start, KeyBlocks, Movers, Prefetch, Start};
use super::frag::regs::{
    accumulate, elems, map_of, place, product_t, store_rows, to_a, Layout, Place, Tile, Types,
};
use super::frag::{row_frags, row_limit, zero_accs, OutRows, FRAG, WORD};
use super::layout::LEN;
use super::params::{block_coords, dense_row, key_end, query_blocks, stat_index, Params};
use super::signature::AttentionKernel;

/// L (as −L·log2 e, +∞ past T so that P = 0 there) and, unless the kernel computes it
/// itself, Dsum of query `i`.
fn row_stats(k: &mut KernelBuilder, p: &Params, (b, h): (Val, Val), i: Val) -> (Val, Option<Val>) {
    let inside = k.lt(i, p.t);
    let z = k.u32(0);
    let ic = k.select(inside, i, z);
    let at = stat_index(k, p, b, h, ic);
    let l = k.load(p.lse.expect("backward reads lse"), at, 1);
    let inf = k.const_f32(f32::INFINITY);
    let l = k.select(inside, l, inf);
    let nlog2e = k.const_f32(-std::f32::consts::LOG2_E);
    let l = k.mul(l, nlog2e);
    let ds = p.o.is_none().then(|| {
        let ds = k.load(p.dsum.expect("backward reads dsum"), at, 1);
        let zero = k.const_f32(0.0);
        k.select(inside, ds, zero)
    });
    (l, ds)
}

/// This invocation's half of an O row for [`own_dsum`], loaded early: lanes 2r and 2r + 1
/// of a subgroup take half of its row r each (query `qs + r` of head (b, h), staged dO row
/// `row0 + r`).
struct DsumRows {
    bh: (Val, Val),
    /// The subgroup's first row in the block.
    row0: Val,
    r: Val,
    half: Val,
    /// Query qs + r and whether it is below T.
    i: Val,
    inside: Val,
    /// The O words (16-byte loads of the dense output; row 0's past T).
    words: Vec<Val>,
}

fn dsum_loads(
    k: &mut KernelBuilder,
    kern: &AttentionKernel,
    p: &Params,
    (b, h): (Val, Val),
    (row0, qs): (Val, Val),
) -> DsumRows {
    let d = kern.head_dim;
    let half_words = d / WORD / 2;
    let lane = k.subgroup_invocation_id();
    let two = k.u32(2);
    let r = k.div(lane, two);
    let half = k.rem(lane, two);
    let i = k.add(qs, r);
    let inside = k.lt(i, p.t);
    let zero = k.u32(0);
    let ic = k.select(inside, i, zero);
    let eight = k.u32(WORD);
    let hw = k.u32(half_words);
    let first = k.mul(half, hw);
    let orow = dense_row(k, p, d, b, ic, h);
    let orow = k.div(orow, eight);
    let orow = k.add(orow, first);
    let o = p.o.expect("own_dsum reads O");
    let words = (0..half_words)
        .map(|j| {
            let jc = k.u32(j);
            let at = k.add(orow, jc);
            k.load(o, at, 4)
        })
        .collect();
    DsumRows {
        bh: (b, h),
        row0,
        r,
        half,
        i,
        inside,
        words,
    }
}

/// Dsum = Σ_d dO·O of the subgroup's 16 rows (staged dO rows `row0..` in the region, O's
/// from [`dsum_loads`]), for a Dq with `own_dsum`: each lane pair sums its row, the even
/// lane stores it for DkDv (rows below T), and every invocation gets its row slots' sums by
/// shuffles. Rows past T have dO staged as zeros, so their sum is 0, as Prep's.
fn own_dsum(
    k: &mut KernelBuilder,
    kern: &AttentionKernel,
    p: &Params,
    lay: &Layout,
    smem: Shared,
    pl: &Place,
    rows: DsumRows,
) -> Vec<Val> {
    let DsumRows {
        bh: (b, h),
        row0,
        r,
        half,
        i,
        inside,
        words,
    } = rows;
    let hw = k.u32(kern.head_dim / WORD / 2);
    let first = k.mul(half, hw);
    let srow = k.add(row0, r);
    let rowc = k.u32(lay.row);
    let srow = k.mul(srow, rowc);
    let reg = k.u32(lay.region);
    let srow = k.add(srow, reg);
    let srow = k.add(srow, first);
    let mut sum = k.const_f32(0.0);
    for (j, x) in words.into_iter().enumerate() {
        let jc = k.u32(j as u32);
        let at = k.add(srow, jc);
        let a = k.shared_load(smem, at);
        let prod = dot_halves(k, a, x, kern.storage);
        sum = k.add(sum, prod);
    }
    let one = k.u32(1);
    let other = k.subgroup_shuffle_xor(sum, one);
    let sum = k.add(sum, other);
    let zero = k.u32(0);
    let two = k.u32(2);
    let even = k.eq(half, zero);
    let store = k.and(even, inside);
    k.if_(store, |k| {
        let at = stat_index(k, p, b, h, i);
        k.store(p.dsum.expect("own_dsum writes Dsum"), at, sum);
    });
    pl.row
        .iter()
        .map(|&row| {
            let src = k.mul(row, two);
            k.subgroup_shuffle(sum, src)
        })
        .collect()
}

/// Σ of the products of the 8 halves (f16 or bf16) in two 16-byte words, in f32.
fn dot_halves(k: &mut KernelBuilder, a: Val, b: Val, storage: crate::Storage) -> Val {
    let f4 = Ty::vector(Scalar::F32, 4);
    match storage {
        crate::Storage::BF16 => {
            // Element 2w is the low half of word w, 2w + 1 the high half.
            let sixteen = k.u32(16);
            let sixteen = k.splat(sixteen, 4);
            let mask = k.u32(0xffff_0000);
            let mask = k.splat(mask, 4);
            let widen = |k: &mut KernelBuilder, w: Val| {
                let lo = k.shl(w, sixteen);
                let hi = k.and(w, mask);
                (k.bitcast(lo, f4), k.bitcast(hi, f4))
            };
            let (alo, ahi) = widen(k, a);
            let (blo, bhi) = widen(k, b);
            let lo = k.dot(alo, blo);
            let hi = k.dot(ahi, bhi);
            k.add(lo, hi)
        }
        _ => {
            let h2 = Ty::vector(Scalar::F16, 2);
            let mut sum = k.const_f32(0.0);
            for w in 0..4 {
                let x = k.extract(a, w);
                let y = k.extract(b, w);
                let x = k.bitcast(x, h2);
                let y = k.bitcast(y, h2);
                let x = k.convert(x, Scalar::F32);
                let y = k.convert(y, Scalar::F32);
                let dd = k.dot(x, y);
                sum = k.add(sum, dd);
            }
            sum
        }
    }
}

pub(crate) fn dq(kern: &AttentionKernel) -> KernelModule {
    let (bq, bk) = kern.variant.blocks();
    let d = kern.head_dim;
    let Start {
        mut kb,
        p,
        smem,
        ty,
        lay,
        tid,
        row0,
        threads,
        epi,
    } = start(kern, bq);
    let k = &mut kb;
    let walk = KeyBlocks::of_query_block(k, kern, &p, &lay, smem, (tid, threads), row0);
    let (movers, q0, qs, kend) = (walk.movers, walk.q0, walk.qs, walk.kend);
    let (b, h) = movers.bh;
    let (qv, dov) = (p.views[0], p.views[3]);
    // The start-up's global loads all in flight at once (Q, dO, O's rows for Dsum, key
    // block 0), under the coordinate tile's barriers; Q and dO then pass through the
    // region one after the other.
    let qp = movers.prefetch(k, qv, lay.region, bq);
    movers.load(k, &qp, q0, p.t);
    let op = movers.prefetch(k, dov, lay.region, bq);
    movers.load(k, &op, q0, p.t);
    let o_rows = kern
        .own_dsum
        .then(|| dsum_loads(k, kern, &p, (b, h), (row0, qs)));
    let first = walk.first_loads(k);
    let pl = place(k, smem, map_of(kern), ty.acc, lay.region, tid, threads);
    let tile = (lay.region, lay.row);
    movers.store(k, smem, &qp, q0, p.t);
    k.workgroup_barrier();
    let qf = row_frags(k, smem, ty.a, tile.0, tile.1, row0, d);
    k.workgroup_barrier();
    movers.store(k, smem, &op, q0, p.t);
    k.workgroup_barrier();
    let of = row_frags(k, smem, ty.a, tile.0, tile.1, row0, d);
    k.workgroup_barrier();
    // The region keeps dO until the epilogue: with `own_dsum`, each row's Dsum from it.
    let own = o_rows.map(|rows| own_dsum(k, kern, &p, &lay, smem, &pl, rows));
    let mut lims = Vec::new();
    let mut nl2 = Vec::new();
    let mut dsums = Vec::new();
    for (slot, &r) in pl.row.iter().enumerate() {
        let i = k.add(qs, r);
        lims.push(row_limit(k, kern.causal, i, kend));
        let (l, ds) = row_stats(k, &p, (b, h), i);
        nl2.push(l);
        dsums.push(match &own {
            Some(v) => v[slot],
            None => ds.expect("Dsum from Prep"),
        });
    }
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let scale2 = k.mul(p.scale, log2e);
    let acc = zero_accs(k, ty.acc, d / FRAG);
    let kt = Tile::fixed((lay.a, lay.row));
    let vt = Tile::fixed((lay.b, lay.row));
    walk.run(k, first, &|k, k0, masked| {
        // dS = P ∘ (dP − Dsum), P = exp2(S·scale·log2 e − L·log2 e), per 16 keys.
        let da: Vec<CoopMat> = (0..bk / FRAG)
            .map(|c| {
                let s = product_t(k, smem, ty, &qf, kt, c);
                let dp = product_t(k, smem, ty, &of, vt, c);
                let s = elems(k, s);
                let dp = elems(k, dp);
                let jc = k.u32(c * FRAG);
                let jb = k.add(k0, jc);
                let ds: Vec<Val> = (0..LEN)
                    .map(|e| {
                        let slot = pl.map.row_slot[e] as usize;
                        let x = k.fma(s[e], scale2, nl2[slot]);
                        let mut pr = k.exp2(x);
                        if masked {
                            let j = k.add(jb, pl.col_of(e));
                            let keep = k.lt(j, lims[slot]);
                            let zero = k.const_f32(0.0);
                            pr = k.select(keep, pr, zero);
                        }
                        let dd = k.sub(dp[e], dsums[slot]);
                        k.mul(pr, dd)
                    })
                    .collect();
                to_a(k, &pl, ty, &ds)
            })
            .collect();
        accumulate(k, smem, ty, &acc, &da, kt);
    });
    k.workgroup_barrier();
    let dq_rows = OutRows::of(&p, 0, (b, h), qs);
    store_rows(k, smem, kern, &acc, Err(p.scale), &dq_rows, epi);
    kb.finish()
}

/// What DkDv's phases share: the kernel, its parameters, shared array, fragment types and
/// layout, who moves what, and the key block's coordinates.
struct DkDv<'a> {
    kern: &'a AttentionKernel,
    p: Params,
    smem: Shared,
    ty: Types,
    lay: Layout,
    mv: Movers,
    /// The block's first key, the subgroup's first row in the block, and its first key
    /// (k0 + row0).
    k0: Val,
    row0: Val,
    js: Val,
    kend: Val,
    /// The query blocks the key block visits: [qstart, nqb).
    qstart: Val,
    nqb: Val,
    /// bq, as a value.
    bqc: Val,
    /// The streamed Q and dO tiles in shared memory.
    qt: Tile,
    ot: Tile,
    /// The subgroup's epilogue tile.
    epi: Val,
}

/// The start-up's prefetched tiles: the block's K and V (loaded), a query block's Q and dO.
struct Stream {
    kpre: Prefetch,
    vpre: Prefetch,
    qp: Prefetch,
    op: Prefetch,
}

/// L and Dsum of a query block's queries, prefetched like the tiles: invocation tid moves
/// queries tid, tid + threads, ... below bq, each as (offset in the block, L, Dsum).
struct Stats {
    vars: Vec<(Val, Var, Var)>,
}

/// The subgroup's own key rows through the walk: its place in the fragments, K and V as A
/// fragments, each row slot's key j (kept while j < kend), and the dK and dV accumulators.
struct Owned {
    pl: Place,
    kf: Vec<CoopMat>,
    vf: Vec<CoopMat>,
    keys: Vec<Val>,
    dk: Vec<CoopVar>,
    dv: Vec<CoopVar>,
}

/// One query block's products as `block` builds them: its first query, the scale in base
/// 2, and whether the block masks.
#[derive(Clone, Copy)]
struct Pass {
    i0: Val,
    scale2: Val,
    masked: bool,
}

/// Builds DkDv: the start-up loads, the block's K and V as fragments, the walk over the
/// query blocks it sees, then dK and dV.
pub(crate) fn dkdv(kern: &AttentionKernel) -> KernelModule {
    let (mut kb, f) = setup(kern);
    let k = &mut kb;
    // The start-up's global loads all in flight at once (K, V, the first query block's Q,
    // dO, L and Dsum), under the coordinate tile's barriers; K and V then pass through the
    // region into A fragments one after the other.
    let stream = prefetch(k, &f);
    let stats = Stats::new(k, &f);
    first_query_loads(k, &f, &stream, &stats);
    let o = own_rows(k, &f, &stream);
    query_walk(k, &f, &o, &stream, &stats);
    epilogue(k, &f, &o);
    kb.finish()
}

/// Begins the kernel (see [`start`]) and finds the key block's coordinates and the query
/// blocks it visits.
fn setup(kern: &AttentionKernel) -> (KernelBuilder, DkDv<'_>) {
    let (bq, bk) = kern.variant.blocks();
    let Start {
        mut kb,
        p,
        smem,
        ty,
        lay,
        tid,
        row0,
        threads,
        epi,
    } = start(kern, bk);
    let k = &mut kb;
    let (b, h, kblk) = block_coords(k, &p, bk, false);
    let bkc = k.u32(bk);
    let k0 = k.mul(kblk, bkc);
    let js = k.add(k0, row0);
    let kend = key_end(k, &p, b);
    let (qstart, nqb) = query_blocks(k, &p, kern.causal, k0, kend, bq);
    let bqc = k.u32(bq);
    let mv = Movers {
        tid,
        threads,
        row: lay.row,
        bh: (b, h),
    };
    let f = DkDv {
        kern,
        p,
        smem,
        ty,
        mv,
        k0,
        row0,
        js,
        kend,
        qstart,
        nqb,
        bqc,
        qt: Tile::fixed((lay.a, lay.row)),
        ot: Tile::fixed((lay.b, lay.row)),
        lay,
        epi,
    };
    (kb, f)
}

/// Issues the loads of the block's K and V and declares the query blocks' Q and dO tiles.
fn prefetch(k: &mut KernelBuilder, f: &DkDv) -> Stream {
    let (bq, bk) = f.kern.variant.blocks();
    let (mv, lay, p) = (&f.mv, &f.lay, &f.p);
    let (qv, kv, vv, dov) = (p.views[0], p.views[1], p.views[2], p.views[3]);
    let kpre = mv.prefetch(k, kv, lay.region, bk);
    mv.load(k, &kpre, f.k0, f.kend);
    let vpre = mv.prefetch(k, vv, lay.region, bk);
    mv.load(k, &vpre, f.k0, f.kend);
    let qp = mv.prefetch(k, qv, lay.a, bq);
    let op = mv.prefetch(k, dov, lay.b, bq);
    Stream { kpre, vpre, qp, op }
}

impl Stats {
    /// This invocation's queries in a block and the registers of their L and Dsum.
    fn new(k: &mut KernelBuilder, f: &DkDv) -> Stats {
        let (bq, _) = f.kern.variant.blocks();
        let threads = f.mv.threads;
        let vars = (0..bq.div_ceil(threads))
            .map(|j| {
                let o = k.u32(j * threads);
                let idx = k.add(f.mv.tid, o);
                let f = Ty::scalar(Scalar::F32);
                (idx, k.var(f), k.var(f))
            })
            .collect();
        Stats { vars }
    }

    /// Loads L and Dsum of the block at query i0 (raw; `store` transforms them).
    fn load(&self, k: &mut KernelBuilder, f: &DkDv, i0: Val) {
        let (b, h) = f.mv.bh;
        let lse_buf = f.p.lse.expect("backward reads lse");
        let dsum_buf = f.p.dsum.expect("backward reads dsum");
        for &(idx, lv, dv) in &self.vars {
            let i = k.add(i0, idx);
            let inside = k.lt(i, f.p.t);
            let z = k.u32(0);
            let ic = k.select(inside, i, z);
            let at = stat_index(k, &f.p, b, h, ic);
            let l = k.load(lse_buf, at, 1);
            let ds = k.load(dsum_buf, at, 1);
            k.set(lv, l);
            k.set(dv, ds);
        }
    }

    /// Stores −L·log2 e (+∞ past T, so that P = 0 there) and Dsum (0 past T) of the block
    /// at query i0 into the stats area.
    fn store(&self, k: &mut KernelBuilder, f: &DkDv, i0: Val) {
        let (bq, _) = f.kern.variant.blocks();
        for &(idx, lv, dv) in &self.vars {
            let body = |k: &mut KernelBuilder| {
                let i = k.add(i0, idx);
                let inside = k.lt(i, f.p.t);
                let l = k.get(lv);
                let ds = k.get(dv);
                let inf = k.const_f32(f32::INFINITY);
                let zero = k.const_f32(0.0);
                let l = k.select(inside, l, inf);
                let nlog2e = k.const_f32(-std::f32::consts::LOG2_E);
                let l = k.mul(l, nlog2e);
                let ds = k.select(inside, ds, zero);
                let four = k.u32(4);
                let w = k.div(idx, four);
                let lane = k.rem(idx, four);
                let st = k.u32(f.lay.stats);
                let wl = k.add(st, w);
                let u = Ty::scalar(Scalar::U32);
                let lb = k.bitcast(l, u);
                k.shared_store_lane(f.smem, wl, lane, lb);
                let off = k.u32(bq / 4);
                let wd = k.add(wl, off);
                let db = k.bitcast(ds, u);
                k.shared_store_lane(f.smem, wd, lane, db);
            };
            let mine = k.lt(idx, f.bqc);
            k.if_(mine, body);
        }
    }
}

/// Issues the loads of the first query block's Q, dO, L and Dsum.
fn first_query_loads(k: &mut KernelBuilder, f: &DkDv, stream: &Stream, stats: &Stats) {
    let first = k.mul(f.qstart, f.bqc);
    f.mv.load(k, &stream.qp, first, f.p.t);
    f.mv.load(k, &stream.op, first, f.p.t);
    stats.load(k, f, first);
}

/// This invocation's place in the fragments (from the coordinate tile), then K and V
/// through the region into A fragments, one after the other; each row slot's key, and zero
/// dK and dV accumulators.
fn own_rows(k: &mut KernelBuilder, f: &DkDv, stream: &Stream) -> Owned {
    let d = f.kern.head_dim;
    let (mv, smem, ty) = (&f.mv, f.smem, f.ty);
    let pl = place(
        k,
        smem,
        map_of(f.kern),
        ty.acc,
        f.lay.region,
        mv.tid,
        mv.threads,
    );
    let tile = (f.lay.region, f.lay.row);
    mv.store(k, smem, &stream.kpre, f.k0, f.kend);
    k.workgroup_barrier();
    let kf = row_frags(k, smem, ty.a, tile.0, tile.1, f.row0, d);
    k.workgroup_barrier();
    mv.store(k, smem, &stream.vpre, f.k0, f.kend);
    k.workgroup_barrier();
    let vf = row_frags(k, smem, ty.a, tile.0, tile.1, f.row0, d);
    k.workgroup_barrier();
    let keys: Vec<Val> = pl.row.iter().map(|&r| k.add(f.js, r)).collect();
    let dk = zero_accs(k, ty.acc, d / FRAG);
    let dv = zero_accs(k, ty.acc, d / FRAG);
    Owned {
        pl,
        kf,
        vf,
        keys,
        dk,
        dv,
    }
}

/// The walk over the query blocks: each block's Q, dO and stats staged while the next
/// block's load, then its products, with masks only where a key is past the end or some
/// query of the block precedes a key.
fn query_walk(k: &mut KernelBuilder, f: &DkDv, o: &Owned, stream: &Stream, stats: &Stats) {
    let (mv, p, bqc) = (&f.mv, &f.p, f.bqc);
    let one = k.u32(1);
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let scale2 = k.mul(p.scale, log2e);
    let sixteen = k.u32(FRAG);
    let js_end = k.add(f.js, sixteen);
    let keys_past_end = k.gt(js_end, f.kend);
    k.for_range(f.qstart, f.nqb, one, |k, qb| {
        let i0 = k.mul(qb, bqc);
        k.workgroup_barrier();
        mv.store(k, f.smem, &stream.qp, i0, p.t);
        mv.store(k, f.smem, &stream.op, i0, p.t);
        stats.store(k, f, i0);
        let next = k.add(i0, bqc);
        mv.load(k, &stream.qp, next, p.t);
        mv.load(k, &stream.op, next, p.t);
        stats.load(k, f, next);
        k.workgroup_barrier();
        let needs = if f.kern.causal {
            let fifteen = k.u32(FRAG - 1);
            let last_key = k.add(f.js, fifteen);
            let before = k.gt(last_key, i0);
            k.or(keys_past_end, before)
        } else {
            keys_past_end
        };
        let pass = |masked| Pass { i0, scale2, masked };
        k.if_else(
            needs,
            |k| block(k, f, o, pass(true)),
            |k| block(k, f, o, pass(false)),
        );
    });
}

/// The staged query block's products, 16 queries at a time: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ,
/// then P and dS, then dV += Pᵀ·dO and dK += dSᵀ·Q.
fn block(k: &mut KernelBuilder, f: &DkDv, o: &Owned, pass: Pass) {
    let (bq, _) = f.kern.variant.blocks();
    let (smem, ty) = (f.smem, f.ty);
    let mut pa = Vec::new();
    let mut da = Vec::new();
    for c in 0..bq / FRAG {
        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: 16 keys × 16 queries.
        let s = product_t(k, smem, ty, &o.kf, f.qt, c);
        let dp = product_t(k, smem, ty, &o.vf, f.ot, c);
        let s = elems(k, s);
        let dp = elems(k, dp);
        let stat = column_stats(k, f, &o.pl, c, pass.i0);
        let (ps, dss) = p_and_ds(k, f, o, (&s, &dp), &stat, pass);
        pa.push(to_a(k, &o.pl, ty, &ps));
        da.push(to_a(k, &o.pl, ty, &dss));
    }
    // dV += Pᵀ·dO, dK += dSᵀ·Q.
    accumulate(k, smem, ty, &o.dv, &pa, f.ot);
    accumulate(k, smem, ty, &o.dk, &da, f.qt);
}

/// Each column slot's query of the 16 at c·16 in the block at i0: its −L·log2 e and Dsum
/// from the stats area, and the query.
fn column_stats(
    k: &mut KernelBuilder,
    f: &DkDv,
    pl: &Place,
    c: u32,
    i0: Val,
) -> Vec<(Val, Val, Val)> {
    let (bq, _) = f.kern.variant.blocks();
    let mut stat = Vec::new();
    for &col in &pl.col {
        let cc = k.u32(c * FRAG);
        let q = k.add(cc, col);
        let four = k.u32(4);
        let w = k.div(q, four);
        let lane = k.rem(q, four);
        let st = k.u32(f.lay.stats);
        let wl = k.add(w, st);
        let l = k.shared_load_lane(f.smem, wl, lane);
        let off = k.u32(bq / 4);
        let wd = k.add(wl, off);
        let ds = k.shared_load_lane(f.smem, wd, lane);
        let ft = Ty::scalar(Scalar::F32);
        let qi = k.add(i0, q);
        stat.push((k.bitcast(l, ft), k.bitcast(ds, ft), qi));
    }
    stat
}

/// P = exp2(S·scale·log2 e − L·log2 e) (0 where masked: a key past the end or, causal,
/// after the query) and dS = P ∘ (dP − Dsum), per element of the 16 × 16 tile.
fn p_and_ds(
    k: &mut KernelBuilder,
    f: &DkDv,
    o: &Owned,
    (s, dp): (&[Val], &[Val]),
    stat: &[(Val, Val, Val)],
    pass: Pass,
) -> (Vec<Val>, Vec<Val>) {
    let pl = &o.pl;
    let causal = f.kern.causal;
    let mut ps = Vec::new();
    let mut dss = Vec::new();
    for e in 0..LEN {
        let (nl2, dsum, i) = stat[pl.map.col_slot[e] as usize];
        let x = k.fma(s[e], pass.scale2, nl2);
        let mut pr = k.exp2(x);
        if pass.masked {
            let j = o.keys[pl.map.row_slot[e] as usize];
            let mut keep = k.lt(j, f.kend);
            if causal {
                let seen = k.le(j, i);
                keep = k.and(keep, seen);
            }
            let zero = k.const_f32(0.0);
            pr = k.select(keep, pr, zero);
        }
        let dd = k.sub(dp[e], dsum);
        dss.push(k.mul(pr, dd));
        ps.push(pr);
    }
    (ps, dss)
}

/// dK (times the scale) and dV to memory through the epilogue tile.
fn epilogue(k: &mut KernelBuilder, f: &DkDv, o: &Owned) {
    k.workgroup_barrier();
    let onef = k.const_f32(1.0);
    let dk_rows = OutRows::of(&f.p, 0, f.mv.bh, f.js);
    let dv_rows = OutRows::of(&f.p, 1, f.mv.bh, f.js);
    store_rows(k, f.smem, f.kern, &o.dk, Err(f.p.scale), &dk_rows, f.epi);
    store_rows(k, f.smem, f.kern, &o.dv, Err(onef), &dv_rows, f.epi);
}
