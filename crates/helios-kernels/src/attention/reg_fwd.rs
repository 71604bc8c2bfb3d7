//! The forward with the scores in registers: FlashAttention-2 on the accumulator fragments
//! (see [`frag::regs`](super::frag::regs)), one subgroup per 16 query rows, or 32 as two row
//! tiles sharing every K and V fragment (`CoopPair`); software-pipelined where two K/V
//! buffers fit in shared memory.

use helios_spirv::{CoopMat, CoopVar, KernelBuilder, KernelModule, Shared, Val, Var};

use super::frag::blocks::{start, KeyBlocks, Prefetch, Start};
use super::frag::regs::{
    accumulate_tiles, elems, map_of, place, products_t, row_frag, row_reduce, store_rows, to_a,
    Place, Tile, Types,
};
use super::frag::{row_frags, row_limit, zero_accs, OutRows, FRAG};
use super::params::{stat_index, Params};
use super::signature::AttentionKernel;

/// One 16-row tile of the rows a subgroup owns in the forward: its first row, Q fragments,
/// per row slot the keys its row sees (j < lim), running max and (this invocation's part of
/// the) sum in base 2, and its O accumulators.
struct RowTile {
    qs: Val,
    qf: Vec<CoopMat>,
    lims: Vec<Val>,
    ms: Vec<Var>,
    ls: Vec<Var>,
    acc: Vec<CoopVar>,
}

/// What the forward's phases share after the start-up: the kernel, its parameters, shared
/// array and fragment types, this invocation's place in the fragments, the row tiles, and
/// the softmax scale in base 2 (scale·log2 e).
struct Fwd<'a> {
    kern: &'a AttentionKernel,
    p: Params,
    smem: Shared,
    ty: Types,
    pl: Place,
    tiles: Vec<RowTile>,
    scale2: Val,
    bh: (Val, Val),
}

/// Per row slot of a row tile, after the block's maxima: −m_new (0 while the maximum is
/// still −∞), the O factor exp2(m_old − m_new); and whether some row's maximum grew.
struct Maxima {
    neg_safe: Vec<Val>,
    corr: Vec<Val>,
    grew: Val,
}

/// Builds the forward: the start-up loads, the row tiles, the walk over the key blocks
/// (pipelined or not), then O / l and L.
pub(crate) fn forward(kern: &AttentionKernel) -> KernelModule {
    let (bq, _) = kern.variant.blocks();
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
    let (first, pl) = start_up(k, &walk, &p, ty);
    let tiles = row_tiles(k, &walk, &pl, ty, row0);
    k.workgroup_barrier();
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let scale2 = k.mul(p.scale, log2e);
    let f = Fwd {
        kern,
        p,
        smem,
        ty,
        pl,
        tiles,
        scale2,
        bh: walk.movers.bh,
    };
    key_walk(k, &f, &walk, first);
    epilogue(k, &f, epi);
    kb.finish()
}

/// The start-up's global loads all in flight at once (Q, key block 0), under the coordinate
/// tile's barriers: one memory latency per workgroup, not one per tile. Returns key block
/// 0's loads and this invocation's place in the fragments; Q ends staged in the region.
fn start_up(
    k: &mut KernelBuilder,
    walk: &KeyBlocks,
    p: &Params,
    ty: Types,
) -> ((Prefetch, Prefetch), Place) {
    let (bq, _) = walk.kern.variant.blocks();
    let (movers, q0, lay, smem) = (walk.movers, walk.q0, walk.lay, walk.smem);
    let qv = p.views[0];
    let qp = movers.prefetch(k, qv, lay.region, bq);
    movers.load(k, &qp, q0, p.t);
    let first = walk.first_loads(k);
    let (tid, threads) = (movers.tid, movers.threads);
    let pl = place(k, smem, map_of(walk.kern), ty.acc, lay.region, tid, threads);
    movers.store(k, smem, &qp, q0, p.t);
    k.workgroup_barrier();
    (first, pl)
}

/// The subgroup's row tiles: Q fragments from the staged rows, each row slot's key limit,
/// m = −∞, l = 0 and zero O accumulators.
fn row_tiles(
    k: &mut KernelBuilder,
    walk: &KeyBlocks,
    pl: &Place,
    ty: Types,
    row0: Val,
) -> Vec<RowTile> {
    let kern = walk.kern;
    let d = kern.head_dim;
    let (lay, smem, qs, kend) = (walk.lay, walk.smem, walk.qs, walk.kend);
    let nslot = pl.row.len();
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let zero = k.const_f32(0.0);
    (0..kern.variant.row_tiles())
        .map(|t| {
            let off = k.u32(t * FRAG);
            let first = k.add(row0, off);
            let qf = row_frags(k, smem, ty.a, lay.region, lay.row, first, d);
            let qs = k.add(qs, off);
            let lims = pl
                .row
                .iter()
                .map(|&r| {
                    let i = k.add(qs, r);
                    row_limit(k, kern.causal, i, kend)
                })
                .collect();
            RowTile {
                qs,
                qf,
                lims,
                ms: (0..nslot).map(|_| k.var_init(ninf)).collect(),
                ls: (0..nslot).map(|_| k.var_init(zero)).collect(),
                acc: zero_accs(k, ty.acc, d / FRAG),
            }
        })
        .collect()
}

/// The walk over the key blocks: software-pipelined (scores of the next block ahead, the
/// rescale always) or plain (the rescale only where some row's maximum grew).
fn key_walk(k: &mut KernelBuilder, f: &Fwd, walk: &KeyBlocks, first: (Prefetch, Prefetch)) {
    let lay = walk.lay;
    let kt = Tile::fixed((lay.a, lay.row));
    let vt = Tile::fixed((lay.b, lay.row));
    if f.kern.pipelined {
        walk.run_pipelined(
            k,
            first,
            f.ty.acc,
            &|k, kt| scores(k, f, kt),
            &|k, s, k0, masked, vt| finish(k, f, s, k0, masked, vt, false),
        );
    } else {
        walk.run(k, first, &|k, k0, masked| {
            let s = scores(k, f, kt);
            finish(k, f, s, k0, masked, vt, true);
        });
    }
}

/// S = Q·Kᵀ of every row tile for the keys at `kt` (raw: the scale, positive, is folded
/// into the exponent), tile-major.
fn scores(k: &mut KernelBuilder, f: &Fwd, kt: Tile) -> Vec<CoopMat> {
    let (_, bk) = f.kern.variant.blocks();
    let qfs: Vec<&[CoopMat]> = f.tiles.iter().map(|t| &t.qf[..]).collect();
    let per_c: Vec<Vec<CoopMat>> = (0..bk / FRAG)
        .map(|c| products_t(k, f.smem, f.ty, &qfs, kt, c))
        .collect();
    (0..f.tiles.len())
        .flat_map(|t| per_c.iter().map(move |v| v[t]))
        .collect()
}

/// The block at k0 from its scores: each tile's softmax, then O += P·V for all tiles.
fn finish(
    k: &mut KernelBuilder,
    f: &Fwd,
    s: Vec<CoopMat>,
    k0: Val,
    masked: bool,
    vt: Tile,
    lazy_rescale: bool,
) {
    let (_, bk) = f.kern.variant.blocks();
    let per_tile = (bk / FRAG) as usize;
    let pa: Vec<Vec<CoopMat>> = f
        .tiles
        .iter()
        .zip(s.chunks(per_tile))
        .map(|(rt, s)| {
            let xs = s.iter().map(|&m| elems(k, m)).collect();
            softmax(k, f, rt, xs, k0, masked, lazy_rescale)
        })
        .collect();
    let accs: Vec<&[CoopVar]> = f.tiles.iter().map(|t| &t.acc[..]).collect();
    let pas: Vec<&[CoopMat]> = pa.iter().map(|p| &p[..]).collect();
    accumulate_tiles(k, f.smem, f.ty, &accs, &pas, vt);
}

/// Masks, online softmax and the O rescale of one row tile for the key block at k0, whose
/// raw scores are `xs` (one element list per 16 keys): P as A fragments. The rescale runs
/// under a branch when `lazy_rescale`.
fn softmax(
    k: &mut KernelBuilder,
    f: &Fwd,
    rt: &RowTile,
    mut xs: Vec<Vec<Val>>,
    k0: Val,
    masked: bool,
    lazy_rescale: bool,
) -> Vec<CoopMat> {
    if masked {
        mask(k, f, rt, &mut xs, k0);
    }
    let mx = maxima(k, f, rt, &xs);
    let pa = probabilities(k, f, rt, &xs, &mx);
    rescale(k, f, rt, &mx, lazy_rescale);
    pa
}

/// −∞ at the scores of keys a row does not see (j ≥ its limit).
fn mask(k: &mut KernelBuilder, f: &Fwd, rt: &RowTile, xs: &mut [Vec<Val>], k0: Val) {
    let pl = &f.pl;
    for (c, v) in xs.iter_mut().enumerate() {
        let jc = k.u32(c as u32 * FRAG);
        let jb = k.add(k0, jc);
        for (e, x) in v.iter_mut().enumerate() {
            let j = k.add(jb, pl.col_of(e));
            let lim = rt.lims[pl.map.row_slot[e] as usize];
            let keep = k.lt(j, lim);
            let ninf = k.const_f32(f32::NEG_INFINITY);
            *x = k.select(keep, *x, ninf);
        }
    }
}

/// Online softmax's new maxima per row slot, in base 2 (m is max(S)·scale·log2 e): m
/// updated, the O factors, and whether any grew.
fn maxima(k: &mut KernelBuilder, f: &Fwd, rt: &RowTile, xs: &[Vec<Val>]) -> Maxima {
    let pl = &f.pl;
    let mut neg_safe = Vec::new();
    let mut corr = Vec::new();
    let mut grew = k.bool(false);
    for (s, &mvar) in rt.ms.iter().enumerate() {
        let mut mx = k.const_f32(f32::NEG_INFINITY);
        for v in xs {
            for (e, &x) in v.iter().enumerate() {
                if pl.map.row_slot[e] as usize == s {
                    mx = k.max(mx, x);
                }
            }
        }
        let mx = row_reduce(k, pl, mx, true);
        let mx = k.mul(mx, f.scale2);
        let mold = k.get(mvar);
        let mnew = k.max(mold, mx);
        let up = k.gt(mnew, mold);
        grew = k.or(grew, up);
        let ninf = k.const_f32(f32::NEG_INFINITY);
        let zero = k.const_f32(0.0);
        let none = k.eq(mnew, ninf);
        let sf = k.select(none, zero, mnew);
        let dm = k.sub(mold, sf);
        corr.push(k.exp2(dm));
        k.set(mvar, mnew);
        neg_safe.push(k.neg(sf));
    }
    Maxima {
        neg_safe,
        corr,
        grew,
    }
}

/// P = exp2(S·scale·log2 e − m) as A fragments, its row sums added into l (l·corr + Σ P).
fn probabilities(
    k: &mut KernelBuilder,
    f: &Fwd,
    rt: &RowTile,
    xs: &[Vec<Val>],
    mx: &Maxima,
) -> Vec<CoopMat> {
    let pl = &f.pl;
    let nslot = pl.row.len();
    let mut sums: Vec<Val> = (0..nslot).map(|_| k.const_f32(0.0)).collect();
    let pa: Vec<CoopMat> = xs
        .iter()
        .map(|v| {
            let ps: Vec<Val> = v
                .iter()
                .enumerate()
                .map(|(e, &x)| {
                    let s = pl.map.row_slot[e] as usize;
                    let dd = k.fma(x, f.scale2, mx.neg_safe[s]);
                    let p = k.exp2(dd);
                    sums[s] = k.add(sums[s], p);
                    p
                })
                .collect();
            to_a(k, pl, f.ty, &ps)
        })
        .collect();
    for ((&lvar, &corr), &sum) in rt.ls.iter().zip(&mx.corr).zip(&sums) {
        let l = k.get(lvar);
        let l = k.fma(l, corr, sum);
        k.set(lvar, l);
    }
    pa
}

/// O = O ∘ corr (+ P·V after this); with `lazy`, only when some row's maximum grew (after
/// the first blocks it rarely does).
fn rescale(k: &mut KernelBuilder, f: &Fwd, rt: &RowTile, mx: &Maxima, lazy: bool) {
    let grew = k.subgroup_any(mx.grew);
    let cf = row_frag(k, &f.pl, f.ty.acc, &mx.corr);
    let rescale = |k: &mut KernelBuilder| {
        for &a in &rt.acc {
            let o = k.coop_get(a);
            let o = k.coop_binary(helios_spirv::BinOp::Mul, o, cf);
            k.coop_set(a, o);
        }
    };
    if lazy {
        k.if_(grew, rescale);
    } else {
        rescale(k);
    }
}

/// O / l and L = (m + log2 l)·ln 2 per row, tile by tile through the epilogue tile at
/// `epi`.
fn epilogue(k: &mut KernelBuilder, f: &Fwd, epi: Val) {
    k.workgroup_barrier();
    for rt in &f.tiles {
        let (invs, lses) = totals(k, f, rt);
        let inv = row_frag(k, &f.pl, f.ty.acc, &invs);
        let out = OutRows::of(&f.p, 0, f.bh, rt.qs);
        store_rows(k, f.smem, f.kern, &rt.acc, Ok(inv), &out, epi);
        store_lse(k, f, rt, &lses);
    }
}

/// Per row slot of a row tile: 1/l (0 for a row that saw no key) and L (−∞ there), l
/// summed across the row's invocations.
fn totals(k: &mut KernelBuilder, f: &Fwd, rt: &RowTile) -> (Vec<Val>, Vec<Val>) {
    let mut invs = Vec::new();
    let mut lses = Vec::new();
    for s in 0..f.pl.row.len() {
        let l = k.get(rt.ls[s]);
        let l = row_reduce(k, &f.pl, l, false);
        let m = k.get(rt.ms[s]);
        let zero = k.const_f32(0.0);
        let empty = k.eq(l, zero);
        let onef = k.const_f32(1.0);
        let inv = k.div(onef, l);
        invs.push(k.select(empty, zero, inv));
        let lg = k.log2(l);
        let lse = k.add(m, lg);
        let ln2 = k.const_f32(std::f32::consts::LN_2);
        let lse = k.mul(lse, ln2);
        let ninf = k.const_f32(f32::NEG_INFINITY);
        lses.push(k.select(empty, ninf, lse));
    }
    (invs, lses)
}

/// Writes L of a row tile's rows below T, one invocation per row.
fn store_lse(k: &mut KernelBuilder, f: &Fwd, rt: &RowTile, lses: &[Val]) {
    let (b, h) = f.bh;
    let lse_buf = f.p.lse.expect("forward writes lse");
    let rl = k.u32(u32::from(f.pl.map.row_lanes));
    let mine = k.and(f.pl.lane, rl);
    let z = k.u32(0);
    let first = k.eq(mine, z);
    for (s, &r) in f.pl.row.iter().enumerate() {
        let i = k.add(rt.qs, r);
        let inside = k.lt(i, f.p.t);
        let w = k.and(inside, first);
        let at = stat_index(k, &f.p, b, h, i);
        let v = lses[s];
        k.if_(w, |k| k.store(lse_buf, at, v));
    }
}
