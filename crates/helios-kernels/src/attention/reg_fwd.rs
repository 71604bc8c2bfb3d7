//! The forward with the scores in registers: FlashAttention-2 on the accumulator fragments
//! (see [`frag::regs`](super::frag::regs)), one subgroup per 16 query rows, or 32 as two row
//! tiles sharing every K and V fragment (`CoopPair`); software-pipelined where two K/V
//! buffers fit in shared memory.

use helios_spirv::{CoopMat, CoopVar, KernelBuilder, KernelModule, Val, Var};

use super::frag::blocks::{start, KeyBlocks, Start};
use super::frag::regs::{
    accumulate_tiles, elems, map_of, place, products_t, row_frag, row_reduce, store_rows, to_a,
    Tile,
};
use super::frag::{row_frags, row_limit, zero_accs, OutRows, FRAG};
use super::params::stat_index;
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

pub(crate) fn forward(kern: &AttentionKernel) -> KernelModule {
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
    let qv = p.views[0];
    // The start-up's global loads all in flight at once (Q, key block 0), under the
    // coordinate tile's barriers: one memory latency per workgroup, not one per tile.
    let qp = movers.prefetch(k, qv, lay.region, bq);
    movers.load(k, &qp, q0, p.t);
    let first = walk.first_loads(k);
    let pl = place(k, smem, map_of(kern), ty.acc, lay.region, tid, threads);
    let nslot = pl.row.len();
    movers.store(k, smem, &qp, q0, p.t);
    k.workgroup_barrier();
    let ninf = k.const_f32(f32::NEG_INFINITY);
    let zero = k.const_f32(0.0);
    let tiles: Vec<RowTile> = (0..kern.variant.row_tiles())
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
        .collect();
    k.workgroup_barrier();
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let scale2 = k.mul(p.scale, log2e);
    let kt = Tile::fixed((lay.a, lay.row));
    let vt = Tile::fixed((lay.b, lay.row));
    // Masks, online softmax and the O rescale of one row tile for the key block at k0,
    // whose raw scores are `xs` (one element list per 16 keys): P as A fragments. The
    // rescale runs under a branch when `lazy_rescale`.
    let softmax = |k: &mut KernelBuilder,
                   rt: &RowTile,
                   mut xs: Vec<Vec<Val>>,
                   k0: Val,
                   masked: bool,
                   lazy_rescale: bool|
     -> Vec<CoopMat> {
        if masked {
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
        // Online softmax per row slot, in base 2: m is max(S)·scale·log2 e.
        let mut neg_safe = Vec::new();
        let mut corr = Vec::new();
        let mut grew = k.bool(false);
        for (s, &mvar) in rt.ms.iter().enumerate() {
            let mut mx = k.const_f32(f32::NEG_INFINITY);
            for v in &xs {
                for (e, &x) in v.iter().enumerate() {
                    if pl.map.row_slot[e] as usize == s {
                        mx = k.max(mx, x);
                    }
                }
            }
            let mx = row_reduce(k, &pl, mx, true);
            let mx = k.mul(mx, scale2);
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
        let mut sums: Vec<Val> = (0..nslot).map(|_| k.const_f32(0.0)).collect();
        let pa: Vec<CoopMat> = xs
            .iter()
            .map(|v| {
                let ps: Vec<Val> = v
                    .iter()
                    .enumerate()
                    .map(|(e, &x)| {
                        let s = pl.map.row_slot[e] as usize;
                        let dd = k.fma(x, scale2, neg_safe[s]);
                        let p = k.exp2(dd);
                        sums[s] = k.add(sums[s], p);
                        p
                    })
                    .collect();
                to_a(k, &pl, ty, &ps)
            })
            .collect();
        for s in 0..nslot {
            let l = k.get(rt.ls[s]);
            let l = k.fma(l, corr[s], sums[s]);
            k.set(rt.ls[s], l);
        }
        // O = O ∘ corr (+ P·V after this), the rescale only when some row's maximum grew
        // (after the first blocks it rarely does).
        let grew = k.subgroup_any(grew);
        let cf = row_frag(k, &pl, ty.acc, &corr);
        let rescale = |k: &mut KernelBuilder| {
            for &a in &rt.acc {
                let o = k.coop_get(a);
                let o = k.coop_binary(helios_spirv::BinOp::Mul, o, cf);
                k.coop_set(a, o);
            }
        };
        if lazy_rescale {
            k.if_(grew, rescale);
        } else {
            rescale(k);
        }
        pa
    };
    // S = Q·Kᵀ of every row tile for the keys at `kt` (raw: the scale, positive, is folded
    // into the exponent), tile-major.
    let scores = |k: &mut KernelBuilder, kt: Tile| -> Vec<CoopMat> {
        let qfs: Vec<&[CoopMat]> = tiles.iter().map(|t| &t.qf[..]).collect();
        let per_c: Vec<Vec<CoopMat>> = (0..bk / FRAG)
            .map(|c| products_t(k, smem, ty, &qfs, kt, c))
            .collect();
        (0..tiles.len())
            .flat_map(|t| per_c.iter().map(move |v| v[t]))
            .collect()
    };
    // The block at k0 from its scores: each tile's softmax, then O += P·V for all tiles.
    let finish = |k: &mut KernelBuilder,
                  s: Vec<CoopMat>,
                  k0: Val,
                  masked: bool,
                  vt: Tile,
                  lazy_rescale: bool| {
        let per_tile = (bk / FRAG) as usize;
        let pa: Vec<Vec<CoopMat>> = tiles
            .iter()
            .zip(s.chunks(per_tile))
            .map(|(rt, s)| {
                let xs = s.iter().map(|&m| elems(k, m)).collect();
                softmax(k, rt, xs, k0, masked, lazy_rescale)
            })
            .collect();
        let accs: Vec<&[CoopVar]> = tiles.iter().map(|t| &t.acc[..]).collect();
        let pas: Vec<&[CoopMat]> = pa.iter().map(|p| &p[..]).collect();
        accumulate_tiles(k, smem, ty, &accs, &pas, vt);
    };
    if kern.pipelined {
        walk.run_pipelined(
            k,
            first,
            ty.acc,
            &|k, kt| scores(k, kt),
            &|k, s, k0, masked, vt| finish(k, s, k0, masked, vt, false),
        );
    } else {
        walk.run(k, first, &|k, k0, masked| {
            let s = scores(k, kt);
            finish(k, s, k0, masked, vt, true);
        });
    }

    // O / l and L = (m + log2 l)·ln 2 per row.
    k.workgroup_barrier();
    let lse_buf = p.lse.expect("forward writes lse");
    for rt in &tiles {
        let mut invs = Vec::new();
        let mut lses = Vec::new();
        for s in 0..nslot {
            let l = k.get(rt.ls[s]);
            let l = row_reduce(k, &pl, l, false);
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
        let inv = row_frag(k, &pl, ty.acc, &invs);
        let out = OutRows::of(&p, 0, (b, h), rt.qs);
        store_rows(k, smem, kern, &rt.acc, Ok(inv), &out, epi);
        // One invocation per row writes L.
        let rl = k.u32(u32::from(pl.map.row_lanes));
        let mine = k.and(pl.lane, rl);
        let z = k.u32(0);
        let first = k.eq(mine, z);
        for (s, &r) in pl.row.iter().enumerate() {
            let i = k.add(rt.qs, r);
            let inside = k.lt(i, p.t);
            let w = k.and(inside, first);
            let at = stat_index(k, &p, b, h, i);
            let v = lses[s];
            k.if_(w, |k| k.store(lse_buf, at, v));
        }
    }
    kb.finish()
}
