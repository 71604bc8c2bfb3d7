//! The register kernels' walk over key blocks and their common start-up: K and V (or Q and
//! dO) tiles prefetched into registers one block ahead and staged in shared memory
//! ([`Movers`], [`KeyBlocks`], also software-pipelined), and [`start`] (builder, parameters,
//! shared array, fragment types).

use helios_spirv::{
    CoopMat, CoopTy, CoopVar, KernelBuilder, Scalar, Shared, SharedLen, Ty, Val, Var,
};

use super::regs::{layout, types, Layout, Tile, Types, EPI_WORDS};
use super::{FRAG, SUBGROUP, WORD};
use crate::attention::params::{block_coords, key_blocks, key_end, Params, View};
use crate::attention::signature::AttentionKernel;

/// A tile of `rows` staged rows of a strided view, loaded into registers ahead of its
/// shared-memory stores: a loop loads block i + 1 right after storing block i, so the global
/// loads overlap block i's products. (The SIMT kernels left this out for lavapipe's compile
/// time; these never run there, it has no cooperative matrices.)
pub(crate) struct Prefetch {
    pub(crate) view: View,
    /// Word offset of the tile in shared memory.
    pub(crate) base: u32,
    pub(crate) rows: u32,
    /// The values in flight, one 16-byte word per unit this invocation moves.
    pub(crate) vars: Vec<Var>,
}

/// Who moves what: this invocation (`tid` of `threads`), row words, (b, h).
#[derive(Clone, Copy)]
pub(crate) struct Movers {
    pub(crate) tid: Val,
    pub(crate) threads: u32,
    pub(crate) row: u32,
    pub(crate) bh: (Val, Val),
}

impl Movers {
    /// Units (16-byte words) of a `rows`-row tile and whether they divide among the
    /// invocations.
    pub(crate) fn units(&self, rows: u32) -> (u32, bool) {
        let units = rows * (self.row - 1);
        (units, units % self.threads == 0)
    }

    /// (row, word in row) of unit `j` of this invocation, clamped into the tile.
    pub(crate) fn unit(&self, k: &mut KernelBuilder, rows: u32, j: u32) -> (Val, Val, Val) {
        let (units, exact) = self.units(rows);
        let off = k.u32(j * self.threads);
        let idx = k.add(self.tid, off);
        let idx = if exact {
            idx
        } else {
            let last = k.u32(units - 1);
            k.min(idx, last)
        };
        let per = k.u32(self.row - 1);
        let r = k.div(idx, per);
        let w = k.rem(idx, per);
        (idx, r, w)
    }

    pub(crate) fn prefetch(
        &self,
        k: &mut KernelBuilder,
        view: View,
        base: u32,
        rows: u32,
    ) -> Prefetch {
        let (units, _) = self.units(rows);
        let vars = (0..units.div_ceil(self.threads))
            .map(|_| k.var(Ty::vector(Scalar::U32, 4)))
            .collect();
        Prefetch {
            view,
            base,
            rows,
            vars,
        }
    }

    /// Loads rows t0.. of the tile into its registers (rows at t >= tend read row 0; `store`
    /// zeroes them). Nothing here may consume the loaded values: the NVIDIA compiler waits
    /// for a load at its first use, and a select right after the load (as this had once)
    /// put the whole global latency back into every block.
    pub(crate) fn load(&self, k: &mut KernelBuilder, f: &Prefetch, t0: Val, tend: Val) {
        for (j, &v) in f.vars.iter().enumerate() {
            let (_, r, w) = self.unit(k, f.rows, j as u32);
            let t = k.add(t0, r);
            let ok = k.lt(t, tend);
            let zero = k.u32(0);
            let tc = k.select(ok, t, zero);
            let at = f.view.row(k, self.bh.0, tc, self.bh.1);
            let word = k.u32(WORD);
            let at = k.div(at, word);
            let at = k.add(at, w);
            let x = k.load(f.view.buf, at, 4);
            k.set(v, x);
        }
    }

    /// Stores the tile's registers (rows t0.. as loaded, zero words at t >= tend) into
    /// shared memory.
    pub(crate) fn store(
        &self,
        k: &mut KernelBuilder,
        smem: Shared,
        f: &Prefetch,
        t0: Val,
        tend: Val,
    ) {
        self.store_at(k, smem, f, (t0, tend), None);
    }

    /// `store`, to the tile's base plus `off` words (a ring buffer chosen at run time).
    pub(crate) fn store_at(
        &self,
        k: &mut KernelBuilder,
        smem: Shared,
        f: &Prefetch,
        (t0, tend): (Val, Val),
        off: Option<Val>,
    ) {
        let (units, exact) = self.units(f.rows);
        for (j, &v) in f.vars.iter().enumerate() {
            let (idx, r, w) = self.unit(k, f.rows, j as u32);
            let rc = k.u32(self.row);
            let at = k.mul(r, rc);
            let at = k.add(at, w);
            let bc = k.u32(f.base);
            let at = k.add(at, bc);
            let at = match off {
                Some(o) => k.add(at, o),
                None => at,
            };
            let x = k.get(v);
            let t = k.add(t0, r);
            let ok = k.lt(t, tend);
            let zero = k.u32(0);
            let z4 = k.splat(zero, 4);
            let ok4 = k.splat(ok, 4);
            let x = k.select(ok4, x, z4);
            if exact || (j as u32 + 1) * self.threads <= units {
                k.shared_store(smem, at, x);
            } else {
                // The clamped units repeat the last one: only its owner stores.
                let off = k.u32(j as u32 * self.threads);
                let raw = k.add(self.tid, off);
                let inside = k.eq(raw, idx);
                k.if_(inside, |k| k.shared_store(smem, at, x));
            }
        }
    }
}

/// The key blocks of a query block (Forward, Dq): K and V tiles prefetched into registers
/// one block ahead and staged in shared memory at `lay.a` and `lay.b`, then `body(k, k0,
/// masked)` for the block at key k0, built twice under a branch: with masks where a key past
/// the end or past some row's diagonal is in the block, without elsewhere.
pub(crate) struct KeyBlocks<'a> {
    pub(crate) kern: &'a AttentionKernel,
    pub(crate) smem: Shared,
    pub(crate) lay: &'a Layout,
    pub(crate) movers: Movers,
    pub(crate) kv: (View, View),
    pub(crate) q0: Val,
    /// The subgroup's first query row.
    pub(crate) qs: Val,
    pub(crate) kend: Val,
}

impl<'a> KeyBlocks<'a> {
    /// The walk of this workgroup's query block (Forward, Dq: from [`block_coords`], the
    /// longest causal blocks first), its subgroup's first row at `row0` of the block.
    pub(crate) fn of_query_block(
        k: &mut KernelBuilder,
        kern: &'a AttentionKernel,
        p: &Params,
        lay: &'a Layout,
        smem: Shared,
        (tid, threads): (Val, u32),
        row0: Val,
    ) -> KeyBlocks<'a> {
        let (bq, _) = kern.variant.blocks();
        let (b, h, qb) = block_coords(k, p, bq, kern.causal);
        let bqc = k.u32(bq);
        let q0 = k.mul(qb, bqc);
        let qs = k.add(q0, row0);
        let kend = key_end(k, p, b);
        KeyBlocks {
            kern,
            smem,
            lay,
            movers: Movers {
                tid,
                threads,
                row: lay.row,
                bh: (b, h),
            },
            kv: (p.views[1], p.views[2]),
            q0,
            qs,
            kend,
        }
    }

    /// Issues the loads of key block 0's K and V tiles into registers, for `run` or
    /// `run_pipelined`: a kernel calls this first thing, so that their latency overlaps its
    /// start-up (the owned rows' loads, the coordinate tile) instead of following it.
    pub(crate) fn first_loads(&self, k: &mut KernelBuilder) -> (Prefetch, Prefetch) {
        let (_, bk) = self.kern.variant.blocks();
        let mv = &self.movers;
        let kp = mv.prefetch(k, self.kv.0, self.lay.a, bk);
        let vp = mv.prefetch(k, self.kv.1, self.lay.b, bk);
        let z = k.u32(0);
        mv.load(k, &kp, z, self.kend);
        mv.load(k, &vp, z, self.kend);
        (kp, vp)
    }

    pub(crate) fn run(
        &self,
        k: &mut KernelBuilder,
        (kp, vp): (Prefetch, Prefetch),
        body: &dyn Fn(&mut KernelBuilder, Val, bool),
    ) {
        let (bq, bk) = self.kern.variant.blocks();
        let (mv, kend) = (&self.movers, self.kend);
        let nkb = key_blocks(k, self.kern.causal, (self.q0, bq), kend, bk);
        let bkc = k.u32(bk);
        let (z, one) = (k.u32(0), k.u32(1));
        k.for_range(z, nkb, one, |k, blk| {
            let k0 = k.mul(blk, bkc);
            k.workgroup_barrier();
            mv.store(k, self.smem, &kp, k0, kend);
            mv.store(k, self.smem, &vp, k0, kend);
            k.workgroup_barrier();
            let next = k.add(k0, bkc);
            mv.load(k, &kp, next, kend);
            mv.load(k, &vp, next, kend);
            let needs = self.needs_mask(k, next);
            self.unless_past_rows(k, k0, &|k| {
                k.if_else(needs, |k| body(k, k0, true), |k| body(k, k0, false))
            });
        });
    }

    /// Whether the block ending before key `next` has a key past the end or past some of
    /// the subgroup's rows' diagonals.
    pub(crate) fn needs_mask(&self, k: &mut KernelBuilder, next: Val) -> Val {
        let past_end = k.gt(next, self.kend);
        if self.kern.causal {
            let one = k.u32(1);
            let diag = k.add(self.qs, one);
            let over = k.gt(next, diag);
            k.or(past_end, over)
        } else {
            past_end
        }
    }

    /// The forward's walk software-pipelined: block j + 1's K and V are stored into the
    /// other of two buffers and its scores (`ahead(k, K tile)`) multiplied before block j is
    /// finished (`finish(k, its scores, k0, masked, V tile)`), so that the matrix unit has
    /// work while the softmax's dependent chain runs.
    #[allow(clippy::type_complexity)]
    pub(crate) fn run_pipelined(
        &self,
        k: &mut KernelBuilder,
        (kp, vp): (Prefetch, Prefetch),
        acc_ty: CoopTy,
        ahead: &dyn Fn(&mut KernelBuilder, Tile) -> Vec<CoopMat>,
        finish: &dyn Fn(&mut KernelBuilder, Vec<CoopMat>, Val, bool, Tile),
    ) {
        let (bq, bk) = self.kern.variant.blocks();
        let (mv, kend, smem, lay) = (&self.movers, self.kend, self.smem, self.lay);
        let nkb = key_blocks(k, self.kern.causal, (self.q0, bq), kend, bk);
        let bkc = k.u32(bk);
        let (z, one) = (k.u32(0), k.u32(1));
        // Block 0 (loaded by `first_loads`) into buffer 0, block 1 into registers, block
        // 0's products.
        mv.store(k, smem, &kp, z, kend);
        mv.store(k, smem, &vp, z, kend);
        k.workgroup_barrier();
        mv.load(k, &kp, bkc, kend);
        mv.load(k, &vp, bkc, kend);
        let kt = Tile::fixed((lay.a, lay.row));
        let vt = Tile::fixed((lay.b, lay.row));
        let held: Vec<CoopVar> = ahead(k, kt)
            .into_iter()
            .map(|m| {
                let v = k.coop_var(acc_ty);
                k.coop_set(v, m);
                v
            })
            .collect();
        let ring = k.u32(lay.ring);
        k.for_range(z, nkb, one, |k, blk| {
            let k0 = k.mul(blk, bkc);
            let parity = k.and(blk, one);
            let cur = k.mul(parity, ring);
            let nxt = k.sub(ring, cur);
            let next = k.add(k0, bkc);
            // Everyone is done with block j − 1's buffer (the next one's): fill it. Past
            // the last block this stores zeros, whose products are never used.
            k.workgroup_barrier();
            mv.store_at(k, smem, &kp, (next, kend), Some(nxt));
            mv.store_at(k, smem, &vp, (next, kend), Some(nxt));
            k.workgroup_barrier();
            let after = k.add(next, bkc);
            mv.load(k, &kp, after, kend);
            mv.load(k, &vp, after, kend);
            let needs = self.needs_mask(k, next);
            let at = |t: Tile, off: Val| Tile {
                off: Some(off),
                ..t
            };
            self.unless_past_rows(k, k0, &|k| {
                let body = |k: &mut KernelBuilder, masked: bool| {
                    let products = ahead(k, at(kt, nxt));
                    let mine = held.iter().map(|&v| k.coop_get(v)).collect();
                    finish(k, mine, k0, masked, at(vt, cur));
                    for (&v, m) in held.iter().zip(products) {
                        k.coop_set(v, m);
                    }
                };
                k.if_else(needs, |k| body(k, true), |k| body(k, false));
            });
        });
    }

    /// `body`, unless the block at k0 lies past all of the subgroup's rows (causal): such a
    /// block adds nothing, nor do the later ones. The subgroup still stages its share.
    pub(crate) fn unless_past_rows(
        &self,
        k: &mut KernelBuilder,
        k0: Val,
        body: &dyn Fn(&mut KernelBuilder),
    ) {
        if self.kern.causal {
            let last = k.u32(FRAG * self.kern.variant.row_tiles() - 1);
            let last = k.add(self.qs, last);
            let live = k.le(k0, last);
            k.if_(live, body);
        } else {
            body(k);
        }
    }
}

/// The common start of a kernel: builder, parameters, shared array, types.
pub(crate) struct Start {
    pub(crate) kb: KernelBuilder,
    pub(crate) p: Params,
    pub(crate) smem: Shared,
    pub(crate) ty: Types,
    pub(crate) lay: Layout,
    pub(crate) tid: Val,
    /// The subgroup's first owned row in the block (16 or 32 rows per subgroup).
    pub(crate) row0: Val,
    pub(crate) threads: u32,
    /// The subgroup's epilogue tile.
    pub(crate) epi: Val,
}

pub(crate) fn start(kern: &AttentionKernel, owned: u32) -> Start {
    let lay = layout(kern);
    let rows = FRAG * kern.variant.row_tiles();
    let threads = owned / rows * SUBGROUP;
    let mut kb = KernelBuilder::new(kern.name(), kern.binding, [threads, 1, 1]);
    let p = kern.declare(&mut kb, true);
    let k = &mut kb;
    let smem = k.shared_array(Ty::vector(Scalar::U32, 4), SharedLen::Fixed(lay.total));
    let tid = k.local_index();
    let sg = k.subgroup_id();
    let rows = k.u32(rows);
    let row0 = k.mul(sg, rows);
    let tw = k.u32(EPI_WORDS);
    let epi = k.mul(sg, tw);
    let reg = k.u32(lay.region);
    let epi = k.add(epi, reg);
    Start {
        ty: types(kern),
        kb,
        p,
        smem,
        lay,
        tid,
        row0,
        threads,
        epi,
    }
}
