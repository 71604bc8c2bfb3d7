//! Cooperative-matrix attention with the scores kept in registers (f16/bf16 inputs, f32
//! accumulation), for devices whose fragment layout [`FragMap`] recognises.
//!
//! This is FlashAttention-2 as it is written for CUDA's `mma.sync`: a subgroup owns 16 rows
//! of the score tile, and everything element-wise happens on the accumulator fragments the
//! matrix unit wrote. Row maxima and sums are per-invocation reductions over the elements of
//! a row slot plus `subgroupShuffleXor` over the map's row lanes; the online-softmax
//! rescale is a fragment of per-row factors multiplied into the O accumulators; P (and dS
//! in the backward) becomes the next product's A operand by moving elements between
//! fragments in the map's permutation. Nothing but the staged K, V (and Q, dO) tiles touches
//! shared memory in the loops; the kernels in `attention_coop` store every score tile to
//! shared memory and back instead, and remain for devices without a recognised layout.
//!
//! The scale must be positive (the forward takes row maxima of the raw scores and folds
//! the scale into the exponent's fma); the host keeps the other kernels for any other.
//!
//! The forward runs software-pipelined where two K/V buffers fit in shared memory
//! (`AttentionKernel::pipelined`): block j + 1's scores are multiplied before block j's
//! softmax, whose dependent chain (max, shuffles, exp, sum) otherwise left the matrix unit
//! idle; 106 → 93 µs for bf16 at 8×12×1024×64 on an H100. The same for Dq, whose chain
//! has no reductions, gained nothing, nor did three buffers with one barrier per block.
//!
//! Each invocation learns the row and column of its elements at start-up from a coordinate
//! fragment (r·16 + c, loaded from shared memory), so the only thing compiled in is the
//! structure, not the layout itself. Masks run only on key blocks that need them (a branch
//! per block, uniform in the subgroup).

use helios_spirv::{
    CoopLayout, CoopMat, CoopTy, CoopUse, CoopVar, KernelBuilder, KernelModule, Scalar, Shared,
    SharedLen, Ty, Val, Var,
};

use crate::attention::{
    block_coords, key_blocks, key_end, query_blocks, stat_index, AttentionKernel, AttnStage,
    Params, View,
};
use crate::attention_coop::{frag_scalar, row_limit, FRAG, SUBGROUP, WORD};
use crate::attention_coop_bwd::{row_frags, zero_accs};
use crate::coop_layout::{FragMap, LEN};

/// Words (16 bytes) of the coordinate tile (16×16 f32).
const TILE_WORDS: u32 = FRAG * FRAG / 4;

/// Accumulator fragments a subgroup's epilogue tile holds side by side: 16 rows × 32 f32.
const EPI_FRAGS: u32 = 2;

/// Words per row of the epilogue tile, padded by one against bank conflicts.
const EPI_ROW: u32 = EPI_FRAGS * FRAG / 4 + 1;

/// Words of one subgroup's epilogue tile.
const EPI_WORDS: u32 = FRAG * EPI_ROW;

/// Word layout of a kernel's shared array.
pub(crate) struct Layout {
    /// Words per staged row of D halves (padded by one word against bank conflicts).
    row: u32,
    /// Forward/Dq: the K and V tiles of a key block. DkDv: the Q and dO tiles of a query
    /// block, then L and Dsum (f32, bq each).
    a: u32,
    b: u32,
    /// Pipelined forward: words from one K/V buffer pair to the other (0 otherwise).
    ring: u32,
    stats: u32,
    /// Start-up staging (coordinates, then the owned rows) and, at the end, the epilogue.
    region: u32,
    pub total: u32,
}

pub(crate) fn layout(kern: &AttentionKernel) -> Layout {
    let (bq, bk) = kern.variant.blocks();
    let row = kern.head_dim / WORD + 1;
    let (owned, streamed) = match kern.stage {
        AttnStage::DkDv => (bk, bq),
        _ => (bq, bk),
    };
    let nsg = owned / (FRAG * kern.variant.row_tiles());
    let (a, b) = (0, streamed * row);
    let stats = 2 * streamed * row;
    let stats_words = if kern.stage == AttnStage::DkDv {
        streamed / 2
    } else {
        0
    };
    // Start-up: the owned rows (Q and dO, or K and V) one tile at a time.
    let staged = owned * row;
    let region_words = staged.max(TILE_WORDS).max(nsg * EPI_WORDS);
    if kern.pipelined {
        // Two K/V buffers; the start-up and epilogue region lies over them (it is used
        // only before the first K/V store and after the last K/V read, barriers between).
        let ring = 2 * streamed * row;
        return Layout {
            row,
            a,
            b,
            ring,
            stats: 2 * ring,
            region: 0,
            total: (2 * ring).max(region_words),
        };
    }
    let region = stats + stats_words;
    Layout {
        row,
        a,
        b,
        ring: 0,
        stats,
        region,
        total: region + region_words,
    }
}

/// Fragment types of a kernel.
#[derive(Clone, Copy)]
struct Types {
    a: CoopTy,
    b: CoopTy,
    acc: CoopTy,
    /// The accumulator with 16-bit components (P on its way to an A fragment).
    narrow: CoopTy,
}

fn types(kern: &AttentionKernel) -> Types {
    let s = frag_scalar(kern.storage);
    let acc = CoopTy::new(Scalar::F32, FRAG, FRAG, CoopUse::Accumulator);
    Types {
        a: CoopTy::new(s, FRAG, FRAG, CoopUse::A),
        b: CoopTy::new(s, FRAG, FRAG, CoopUse::B),
        acc,
        narrow: acc.with_scalar(s),
    }
}

/// What an invocation knows about its place in the subgroup's fragments.
struct Place {
    map: FragMap,
    lane: Val,
    /// Row (0..16) of each row slot.
    row: Vec<Val>,
    /// Column (0..16) of each column slot.
    col: Vec<Val>,
}

impl Place {
    fn col_of(&self, e: usize) -> Val {
        self.col[self.map.col_slot[e] as usize]
    }
}

/// Learns the rows and columns of this invocation's elements: the workgroup writes the
/// coordinate tile (r·16 + c as f32) at word `at`, each subgroup loads it as an accumulator
/// and reads its elements. Ends with a workgroup barrier (the tile may be overwritten).
fn place(
    k: &mut KernelBuilder,
    smem: Shared,
    map: FragMap,
    acc_ty: CoopTy,
    at: u32,
    tid: Val,
    threads: u32,
) -> Place {
    let words = k.u32(TILE_WORDS);
    let step = k.u32(threads);
    k.for_range(tid, words, step, |k, w| {
        let four = k.u32(4);
        let first = k.mul(w, four);
        let lanes: Vec<Val> = (0..4)
            .map(|c| {
                let o = k.u32(c);
                let x = k.add(first, o);
                let x = k.convert(x, Scalar::F32);
                k.bitcast(x, Ty::scalar(Scalar::U32))
            })
            .collect();
        let v = k.vector(&lanes);
        let base = k.u32(at);
        let wi = k.add(w, base);
        k.shared_store(smem, wi, v);
    });
    k.workgroup_barrier();
    let base = k.u32(at);
    let four = k.u32(4);
    let m = k.coop_load_shared(acc_ty, smem, base, four, CoopLayout::RowMajor);
    let sixteen = k.u32(FRAG);
    let coord = |k: &mut KernelBuilder, e: usize, row: bool| {
        let x = k.coop_extract(m, e as u32);
        let x = k.convert(x, Scalar::U32);
        if row {
            k.div(x, sixteen)
        } else {
            k.rem(x, sixteen)
        }
    };
    let row = (0..map.row_slots)
        .map(|s| coord(k, map.row_rep(s), true))
        .collect();
    let col = (0..map.col_slots)
        .map(|s| coord(k, map.col_rep(s), false))
        .collect();
    k.workgroup_barrier();
    let lane = k.subgroup_invocation_id();
    Place {
        map,
        lane,
        row,
        col,
    }
}

fn elems(k: &mut KernelBuilder, m: CoopMat) -> Vec<Val> {
    (0..LEN as u32).map(|e| k.coop_extract(m, e)).collect()
}

fn from_elems(k: &mut KernelBuilder, ty: CoopTy, vals: &[Val]) -> CoopMat {
    let mut m = k.coop_undef(ty);
    for (e, &v) in vals.iter().enumerate() {
        m = k.coop_insert(m, v, e as u32);
    }
    m
}

/// A fragment whose element e is `per_slot[row slot of e]`.
fn row_frag(k: &mut KernelBuilder, pl: &Place, ty: CoopTy, per_slot: &[Val]) -> CoopMat {
    let vals: Vec<Val> = (0..LEN)
        .map(|e| per_slot[pl.map.row_slot[e] as usize])
        .collect();
    from_elems(k, ty, &vals)
}

/// The f32 accumulator values `vals` as the A operand of the next product (rounded to the
/// inputs' 16-bit type), moved in registers by the map's permutation.
fn to_a(k: &mut KernelBuilder, pl: &Place, ty: Types, vals: &[Val]) -> CoopMat {
    if ty.narrow.scalar == Scalar::BF16 {
        return to_a_bf16(k, pl, ty, vals);
    }
    let wide = from_elems(k, ty.acc, vals);
    let narrow = k.coop_convert(wide, ty.narrow.scalar);
    let mut a = k.coop_undef(ty.a);
    for e in 0..LEN {
        let x = k.coop_extract(narrow, u32::from(pl.map.a_from_acc[e]));
        a = k.coop_insert(a, x, e as u32);
    }
    a
}

/// [`to_a`] for bf16 operands: each f32 value's high half, as it lies in its register, so
/// P and dS round towards zero.
///
/// That is the rounding NVIDIA's driver (580) already gave the cooperative-matrix
/// `OpFConvert` f32 → bf16 in these loops, as a shift per element and a permute per pair
/// (`SHF.R.U32.HI` + `PRMT`; there is no `F2FP.BF16` in its code). Written as high halves, the
/// driver packs a pair with one `PRMT`, as f16 gets one `F2FP.PACK_AB`: the DkDv loop fell
/// from 681 to 617 instructions, the same as f16's, and DkDv at bf16 8×12×1024×64 from 126.6
/// to 124.8 µs (H200, session 31). Rounding to nearest instead (a min against NaNs carrying
/// into the sign, an add, a pack: 3–4 instructions a pair) was more accurate (worst relative
/// error 3.9e-3 against 7.5e-3 on the GPU test's shapes) and 3–14% slower in every kernel
/// (`bench/results/2026-11-28-session31-h200.txt`). A driver whose `OpFConvert` rounds to
/// nearest would give that accuracy up here. The outputs (O, dQ, dK, dV) round to nearest
/// even in `store_rows`.
fn to_a_bf16(k: &mut KernelBuilder, pl: &Place, ty: Types, vals: &[Val]) -> CoopMat {
    let halves = Ty::vector(Scalar::BF16, 2);
    let mut a = k.coop_undef(ty.a);
    for (e, &from) in pl.map.a_from_acc.iter().enumerate() {
        let two = k.bitcast(vals[usize::from(from)], halves);
        let high = k.extract(two, 1);
        a = k.coop_insert(a, high, e as u32);
    }
    a
}

/// `op` over the invocations sharing each row (the map's row lanes).
fn row_reduce(k: &mut KernelBuilder, pl: &Place, mut v: Val, max: bool) -> Val {
    for bit in 0..5 {
        if pl.map.row_lanes & (1 << bit) != 0 {
            let m = k.u32(1 << bit);
            let o = k.subgroup_shuffle_xor(v, m);
            v = if max { k.max(v, o) } else { k.add(v, o) };
        }
    }
    v
}

/// A staged tile in shared memory: its first word (`word`, plus `off` where the tile is one
/// of a ring of buffers chosen at run time) and its words per row.
#[derive(Clone, Copy)]
struct Tile {
    word: u32,
    row: u32,
    off: Option<Val>,
}

impl Tile {
    fn fixed((word, row): (u32, u32)) -> Tile {
        Tile {
            word,
            row,
            off: None,
        }
    }

    /// Word `word + extra` of the tile.
    fn at(&self, k: &mut KernelBuilder, extra: u32) -> Val {
        let w = k.u32(self.word + extra);
        match self.off {
            Some(o) => k.add(o, w),
            None => w,
        }
    }
}

/// Σ_dc A[dc]·Bᵀ(c, dc) for the 16 columns c·16.. of an `n`-row staged tile (its rows are
/// the product's columns, so B is read column-major): one 16×16 f32 tile.
fn product_t(
    k: &mut KernelBuilder,
    smem: Shared,
    ty: Types,
    a: &[CoopMat],
    tile: Tile,
    c: u32,
) -> CoopMat {
    products_t(k, smem, ty, &[a], tile, c)[0]
}

/// acc[dc] += Σ_c A[c]·tile(c·16.., dc·16..), B read row-major.
fn accumulate(
    k: &mut KernelBuilder,
    smem: Shared,
    ty: Types,
    acc: &[CoopVar],
    a: &[CoopMat],
    tile: Tile,
) {
    accumulate_tiles(k, smem, ty, &[acc], &[a], tile);
}

/// Stores the subgroup's accumulators (16 rows × D: rows `t0..t0+16`, those below T) times
/// `mul` (a per-element fragment or a scalar) to the dense output, through its epilogue
/// tile at word `at`, [`EPI_FRAGS`] fragments at a time: the fragments go to the tile, then
/// consecutive invocations write consecutive 4-element pieces of a row, so every store
/// instruction fills whole 32-byte sectors (a row's 16 columns per fragment were two
/// invocations' 8-byte halves before, each instruction half-filling 16 sectors).
#[allow(clippy::too_many_arguments)]
fn store_rows(
    k: &mut KernelBuilder,
    smem: Shared,
    kern: &AttentionKernel,
    p: &Params,
    acc: &[CoopVar],
    mul: Result<CoopMat, Val>,
    (b, h, t0): (Val, Val, Val),
    out: crate::attention::View,
    at: Val,
) {
    let lane = k.subgroup_invocation_id();
    let rowc = k.u32(EPI_ROW);
    for (round, frags) in acc.chunks(EPI_FRAGS as usize).enumerate() {
        // The tile's previous readers (an earlier round or output) are done.
        k.subgroup_barrier();
        for (f, &a) in frags.iter().enumerate() {
            let o = k.coop_get(a);
            let o = match mul {
                Ok(m) => k.coop_binary(helios_spirv::BinOp::Mul, o, m),
                Err(s) => k.coop_scale(o, s),
            };
            let w = k.u32(f as u32 * FRAG / 4);
            let w = k.add(at, w);
            k.coop_store_shared(o, smem, w, rowc, CoopLayout::RowMajor);
        }
        k.subgroup_barrier();
        // Pieces of 4 columns, `per_row` a row: 64 a fragment, so every invocation of the
        // subgroup (32) moves the same number.
        let per_row = frags.len() as u32 * FRAG / 4;
        let units = FRAG * per_row;
        let col0 = round as u32 * EPI_FRAGS * FRAG;
        for j in 0..units / SUBGROUP {
            let off = k.u32(j * SUBGROUP);
            let u = k.add(lane, off);
            let prc = k.u32(per_row);
            let r = k.div(u, prc);
            let c = k.rem(u, prc);
            let t = k.add(t0, r);
            let inside = k.lt(t, p.t);
            k.if_(inside, |k| {
                let w = k.mul(r, rowc);
                let w = k.add(w, c);
                let w = k.add(w, at);
                let raw = k.shared_load(smem, w);
                let v = k.bitcast(raw, Ty::vector(Scalar::F32, 4));
                let base = out.row(k, b, t, h);
                let cc = k.u32(col0);
                let base = k.add(base, cc);
                let four = k.u32(4);
                let base = k.div(base, four);
                let dst = k.add(base, c);
                crate::storage::store_f32(k, out.buf, dst, v, kern.storage);
            });
        }
    }
}

/// A tile of `rows` staged rows of a strided view, loaded into registers ahead of its
/// shared-memory stores: a loop loads block i + 1 right after storing block i, so the global
/// loads overlap block i's products. (The SIMT kernels left this out for lavapipe's compile
/// time; these never run there, it has no cooperative matrices.)
struct Prefetch {
    view: View,
    /// Word offset of the tile in shared memory.
    base: u32,
    rows: u32,
    /// The values in flight, one 16-byte word per unit this invocation moves.
    vars: Vec<Var>,
}

/// Who moves what: this invocation (`tid` of `threads`), row words, (b, h).
#[derive(Clone, Copy)]
struct Movers {
    tid: Val,
    threads: u32,
    row: u32,
    bh: (Val, Val),
}

impl Movers {
    /// Units (16-byte words) of a `rows`-row tile and whether they divide among the
    /// invocations.
    fn units(&self, rows: u32) -> (u32, bool) {
        let units = rows * (self.row - 1);
        (units, units % self.threads == 0)
    }

    /// (row, word in row) of unit `j` of this invocation, clamped into the tile.
    fn unit(&self, k: &mut KernelBuilder, rows: u32, j: u32) -> (Val, Val, Val) {
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

    fn prefetch(&self, k: &mut KernelBuilder, view: View, base: u32, rows: u32) -> Prefetch {
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
    fn load(&self, k: &mut KernelBuilder, f: &Prefetch, t0: Val, tend: Val) {
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
    fn store(&self, k: &mut KernelBuilder, smem: Shared, f: &Prefetch, t0: Val, tend: Val) {
        self.store_at(k, smem, f, (t0, tend), None);
    }

    /// `store`, to the tile's base plus `off` words (a ring buffer chosen at run time).
    fn store_at(
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
struct KeyBlocks<'a> {
    kern: &'a AttentionKernel,
    smem: Shared,
    lay: &'a Layout,
    movers: Movers,
    kv: (View, View),
    q0: Val,
    /// The subgroup's first query row.
    qs: Val,
    kend: Val,
}

impl<'a> KeyBlocks<'a> {
    /// The walk of this workgroup's query block (Forward, Dq: from [`block_coords`], the
    /// longest causal blocks first), its subgroup's first row at `row0` of the block.
    fn of_query_block(
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
    fn first_loads(&self, k: &mut KernelBuilder) -> (Prefetch, Prefetch) {
        let (_, bk) = self.kern.variant.blocks();
        let mv = &self.movers;
        let kp = mv.prefetch(k, self.kv.0, self.lay.a, bk);
        let vp = mv.prefetch(k, self.kv.1, self.lay.b, bk);
        let z = k.u32(0);
        mv.load(k, &kp, z, self.kend);
        mv.load(k, &vp, z, self.kend);
        (kp, vp)
    }

    fn run(
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
    fn needs_mask(&self, k: &mut KernelBuilder, next: Val) -> Val {
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
    fn run_pipelined(
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
    fn unless_past_rows(&self, k: &mut KernelBuilder, k0: Val, body: &dyn Fn(&mut KernelBuilder)) {
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
struct Start {
    kb: KernelBuilder,
    p: Params,
    smem: Shared,
    ty: Types,
    lay: Layout,
    tid: Val,
    /// The subgroup's first owned row in the block (16 or 32 rows per subgroup).
    row0: Val,
    threads: u32,
    /// The subgroup's epilogue tile.
    epi: Val,
}

fn start(kern: &AttentionKernel, owned: u32) -> Start {
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

fn map_of(kern: &AttentionKernel) -> FragMap {
    kern.frag
        .expect("register-resident attention needs the device's fragment map")
}

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

/// `product_t` for several A operands (one per row tile): each B fragment is loaded once
/// for all of them.
fn products_t(
    k: &mut KernelBuilder,
    smem: Shared,
    ty: Types,
    a: &[&[CoopMat]],
    tile: Tile,
    c: u32,
) -> Vec<CoopMat> {
    let rowc = k.u32(tile.row);
    let mut s: Vec<CoopMat> = a.iter().map(|_| k.coop_zero(ty.acc)).collect();
    for dc in 0..a[0].len() {
        let w = tile.at(k, c * FRAG * tile.row + dc as u32 * 2);
        let y = k.coop_load_shared(ty.b, smem, w, rowc, CoopLayout::ColumnMajor);
        for (st, at) in s.iter_mut().zip(a) {
            *st = k.coop_muladd(at[dc], y, *st);
        }
    }
    s
}

/// `accumulate` for several accumulator sets and their A operands (one per row tile): each
/// B fragment is loaded once for all of them.
fn accumulate_tiles(
    k: &mut KernelBuilder,
    smem: Shared,
    ty: Types,
    accs: &[&[CoopVar]],
    a: &[&[CoopMat]],
    tile: Tile,
) {
    let rowc = k.u32(tile.row);
    for dc in 0..accs[0].len() {
        let mut o: Vec<CoopMat> = accs.iter().map(|acc| k.coop_get(acc[dc])).collect();
        for c in 0..a[0].len() {
            let w = tile.at(k, c as u32 * FRAG * tile.row + dc as u32 * 2);
            let y = k.coop_load_shared(ty.b, smem, w, rowc, CoopLayout::RowMajor);
            for (ot, at) in o.iter_mut().zip(a) {
                *ot = k.coop_muladd(at[c], y, *ot);
            }
        }
        for (acc, o) in accs.iter().zip(o) {
            k.coop_set(acc[dc], o);
        }
    }
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
        store_rows(
            k,
            smem,
            kern,
            &p,
            &rt.acc,
            Ok(inv),
            (b, h, rt.qs),
            p.outs[0],
            epi,
        );
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
/// of a subgroup take half of its row r each (query `qs + r`).
struct DsumRows {
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
    qs: Val,
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
    let orow = crate::attention::dense_row(k, p, d, b, ic, h);
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
#[allow(clippy::too_many_arguments)]
fn own_dsum(
    k: &mut KernelBuilder,
    kern: &AttentionKernel,
    p: &Params,
    lay: &Layout,
    smem: Shared,
    pl: &Place,
    (b, h): (Val, Val),
    row0: Val,
    rows: DsumRows,
) -> Vec<Val> {
    let DsumRows {
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
    let o_rows = kern.own_dsum.then(|| dsum_loads(k, kern, &p, (b, h), qs));
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
    let own = o_rows.map(|rows| own_dsum(k, kern, &p, &lay, smem, &pl, (b, h), row0, rows));
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
    store_rows(
        k,
        smem,
        kern,
        &p,
        &acc,
        Err(p.scale),
        (b, h, qs),
        p.outs[0],
        epi,
    );
    kb.finish()
}

pub(crate) fn dkdv(kern: &AttentionKernel) -> KernelModule {
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
    } = start(kern, bk);
    let k = &mut kb;
    let (b, h, kblk) = block_coords(k, &p, bk, false);
    let bkc = k.u32(bk);
    let k0 = k.mul(kblk, bkc);
    let js = k.add(k0, row0);
    let kend = key_end(k, &p, b);
    let (qv, kv, vv, dov) = (p.views[0], p.views[1], p.views[2], p.views[3]);
    let (qstart, nqb) = query_blocks(k, &p, kern.causal, k0, kend, bq);
    let bqc = k.u32(bq);
    let mv = Movers {
        tid,
        threads,
        row: lay.row,
        bh: (b, h),
    };
    // The start-up's global loads all in flight at once (K, V, the first query block's Q,
    // dO, L and Dsum), under the coordinate tile's barriers; K and V then pass through the
    // region into A fragments one after the other.
    let kpre = mv.prefetch(k, kv, lay.region, bk);
    mv.load(k, &kpre, k0, kend);
    let vpre = mv.prefetch(k, vv, lay.region, bk);
    mv.load(k, &vpre, k0, kend);
    let qp = mv.prefetch(k, qv, lay.a, bq);
    let op = mv.prefetch(k, dov, lay.b, bq);
    // L and Dsum of the block's queries, prefetched like the tiles: invocation tid moves
    // queries tid, tid + threads, ... below bq (raw loads; `store_stats` transforms them).
    let lse_buf = p.lse.expect("backward reads lse");
    let dsum_buf = p.dsum.expect("backward reads dsum");
    let stat_vars: Vec<(Val, Var, Var)> = (0..bq.div_ceil(threads))
        .map(|j| {
            let o = k.u32(j * threads);
            let idx = k.add(tid, o);
            let f = Ty::scalar(Scalar::F32);
            (idx, k.var(f), k.var(f))
        })
        .collect();
    let load_stats = |k: &mut KernelBuilder, i0: Val| {
        for &(idx, lv, dv) in &stat_vars {
            let i = k.add(i0, idx);
            let inside = k.lt(i, p.t);
            let z = k.u32(0);
            let ic = k.select(inside, i, z);
            let at = stat_index(k, &p, b, h, ic);
            let l = k.load(lse_buf, at, 1);
            let ds = k.load(dsum_buf, at, 1);
            k.set(lv, l);
            k.set(dv, ds);
        }
    };
    // Stores −L·log2 e (+∞ past T, so that P = 0 there) and Dsum (0 past T).
    let store_stats = |k: &mut KernelBuilder, i0: Val| {
        for &(idx, lv, dv) in &stat_vars {
            let body = |k: &mut KernelBuilder| {
                let i = k.add(i0, idx);
                let inside = k.lt(i, p.t);
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
                let st = k.u32(lay.stats);
                let wl = k.add(st, w);
                let u = Ty::scalar(Scalar::U32);
                let lb = k.bitcast(l, u);
                k.shared_store_lane(smem, wl, lane, lb);
                let off = k.u32(bq / 4);
                let wd = k.add(wl, off);
                let db = k.bitcast(ds, u);
                k.shared_store_lane(smem, wd, lane, db);
            };
            let mine = k.lt(idx, bqc);
            k.if_(mine, body);
        }
    };
    let first = k.mul(qstart, bqc);
    mv.load(k, &qp, first, p.t);
    mv.load(k, &op, first, p.t);
    load_stats(k, first);
    let pl = place(k, smem, map_of(kern), ty.acc, lay.region, tid, threads);
    let tile = (lay.region, lay.row);
    mv.store(k, smem, &kpre, k0, kend);
    k.workgroup_barrier();
    let kf = row_frags(k, smem, ty.a, tile.0, tile.1, row0, d);
    k.workgroup_barrier();
    mv.store(k, smem, &vpre, k0, kend);
    k.workgroup_barrier();
    let vf = row_frags(k, smem, ty.a, tile.0, tile.1, row0, d);
    k.workgroup_barrier();
    // The keys of each row slot: j (kept while j < kend).
    let keys: Vec<Val> = pl.row.iter().map(|&r| k.add(js, r)).collect();
    let dk = zero_accs(k, ty.acc, d / FRAG);
    let dv = zero_accs(k, ty.acc, d / FRAG);
    let one = k.u32(1);
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let scale2 = k.mul(p.scale, log2e);
    let qt = Tile::fixed((lay.a, lay.row));
    let ot = Tile::fixed((lay.b, lay.row));
    let sixteen = k.u32(FRAG);
    let js_end = k.add(js, sixteen);
    let keys_past_end = k.gt(js_end, kend);
    k.for_range(qstart, nqb, one, |k, qb| {
        let i0 = k.mul(qb, bqc);
        k.workgroup_barrier();
        mv.store(k, smem, &qp, i0, p.t);
        mv.store(k, smem, &op, i0, p.t);
        store_stats(k, i0);
        let next = k.add(i0, bqc);
        mv.load(k, &qp, next, p.t);
        mv.load(k, &op, next, p.t);
        load_stats(k, next);
        k.workgroup_barrier();
        // Masks where a key is past the end or some query of the block precedes a key.
        let needs = if kern.causal {
            let fifteen = k.u32(FRAG - 1);
            let last_key = k.add(js, fifteen);
            let before = k.gt(last_key, i0);
            k.or(keys_past_end, before)
        } else {
            keys_past_end
        };
        let body = |k: &mut KernelBuilder, masked: bool| {
            let mut pa = Vec::new();
            let mut da = Vec::new();
            for c in 0..bq / FRAG {
                // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: 16 keys × 16 queries.
                let s = product_t(k, smem, ty, &kf, qt, c);
                let dp = product_t(k, smem, ty, &vf, ot, c);
                let s = elems(k, s);
                let dp = elems(k, dp);
                // Each column slot's query: its L and Dsum from the stats area.
                let mut stat = Vec::new();
                for &col in &pl.col {
                    let cc = k.u32(c * FRAG);
                    let q = k.add(cc, col);
                    let four = k.u32(4);
                    let w = k.div(q, four);
                    let lane = k.rem(q, four);
                    let st = k.u32(lay.stats);
                    let wl = k.add(w, st);
                    let l = k.shared_load_lane(smem, wl, lane);
                    let off = k.u32(bq / 4);
                    let wd = k.add(wl, off);
                    let ds = k.shared_load_lane(smem, wd, lane);
                    let f = Ty::scalar(Scalar::F32);
                    let qi = k.add(i0, q);
                    stat.push((k.bitcast(l, f), k.bitcast(ds, f), qi));
                }
                let mut ps = Vec::new();
                let mut dss = Vec::new();
                for e in 0..LEN {
                    let (nl2, dsum, i) = stat[pl.map.col_slot[e] as usize];
                    let x = k.fma(s[e], scale2, nl2);
                    let mut pr = k.exp2(x);
                    if masked {
                        let j = keys[pl.map.row_slot[e] as usize];
                        let mut keep = k.lt(j, kend);
                        if kern.causal {
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
                pa.push(to_a(k, &pl, ty, &ps));
                da.push(to_a(k, &pl, ty, &dss));
            }
            // dV += Pᵀ·dO, dK += dSᵀ·Q.
            accumulate(k, smem, ty, &dv, &pa, ot);
            accumulate(k, smem, ty, &dk, &da, qt);
        };
        k.if_else(needs, |k| body(k, true), |k| body(k, false));
    });
    k.workgroup_barrier();
    let onef = k.const_f32(1.0);
    store_rows(
        k,
        smem,
        kern,
        &p,
        &dk,
        Err(p.scale),
        (b, h, js),
        p.outs[0],
        epi,
    );
    store_rows(
        k,
        smem,
        kern,
        &p,
        &dv,
        Err(onef),
        (b, h, js),
        p.outs[1],
        epi,
    );
    kb.finish()
}
