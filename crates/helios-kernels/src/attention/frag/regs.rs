//! Score tiles kept in registers: the pieces of the cooperative-matrix kernels `reg_fwd` and
//! `reg_bwd` (f16/bf16 inputs, f32 accumulation), for devices whose fragment layout
//! [`FragMap`] recognises.
//!
//! This is FlashAttention-2 as it is written for CUDA's `mma.sync`: a subgroup owns 16 rows
//! of the score tile, and everything element-wise happens on the accumulator fragments the
//! matrix unit wrote. Row maxima and sums are per-invocation reductions over the elements of
//! a row slot plus `subgroupShuffleXor` over the map's row lanes; the online-softmax
//! rescale is a fragment of per-row factors multiplied into the O accumulators; P (and dS
//! in the backward) becomes the next product's A operand by moving elements between
//! fragments in the map's permutation. Nothing but the staged K, V (and Q, dO) tiles touches
//! shared memory in the loops; the kernels in `coop_fwd` and `coop_bwd` store every score tile to
//! shared memory and back instead, and remain for devices without a recognised layout.
//!
//! The scale must be positive (the forward takes row maxima of the raw scores and folds
//! the scale into the exponent's fma); the host keeps the other kernels for any other.
//!
//! The forward runs software-pipelined where two K/V buffers fit in shared memory
//! (`AttentionKernel::pipelined`): block j + 1's scores are multiplied before block j's
//! softmax, whose dependent chain (max, shuffles, exp, sum) otherwise left the matrix unit
//! idle (bench/results/source-comment-history.md). The same for Dq, whose chain has no
//! reductions, gained nothing, nor did three buffers with one barrier per block.
//!
//! Each invocation learns the row and column of its elements at start-up from a coordinate
//! fragment (r·16 + c, loaded from shared memory), so the only thing compiled in is the
//! structure, not the layout itself. Masks run only on key blocks that need them (a branch
//! per block, uniform in the subgroup).

use helios_spirv::{
    CoopLayout, CoopMat, CoopTy, CoopUse, CoopVar, KernelBuilder, Scalar, Shared, Ty, Val,
};

use super::{OutRows, FRAG, SUBGROUP, WORD};
use crate::attention::layout::{frag_scalar, FragMap, LEN};
use crate::attention::signature::{AttentionKernel, AttnStage};

/// Words (16 bytes) of the coordinate tile (16×16 f32).
const TILE_WORDS: u32 = FRAG * FRAG / 4;

/// Accumulator fragments a subgroup's epilogue tile holds side by side: 16 rows × 32 f32.
const EPI_FRAGS: u32 = 2;

/// Words per row of the epilogue tile, padded by one against bank conflicts.
const EPI_ROW: u32 = EPI_FRAGS * FRAG / 4 + 1;

/// Words of one subgroup's epilogue tile.
pub(crate) const EPI_WORDS: u32 = FRAG * EPI_ROW;

/// Word layout of a kernel's shared array.
pub(crate) struct Layout {
    /// Words per staged row of D halves (padded by one word against bank conflicts).
    pub(crate) row: u32,
    /// Forward/Dq: the K and V tiles of a key block. DkDv: the Q and dO tiles of a query
    /// block, then L and Dsum (f32, bq each).
    pub(crate) a: u32,
    pub(crate) b: u32,
    /// Pipelined forward: words from one K/V buffer pair to the other (0 otherwise).
    pub(crate) ring: u32,
    pub(crate) stats: u32,
    /// Start-up staging (coordinates, then the owned rows) and, at the end, the epilogue.
    pub(crate) region: u32,
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
pub(crate) struct Types {
    pub(crate) a: CoopTy,
    pub(crate) b: CoopTy,
    pub(crate) acc: CoopTy,
    /// The accumulator with 16-bit components (P on its way to an A fragment).
    pub(crate) narrow: CoopTy,
}

pub(crate) fn types(kern: &AttentionKernel) -> Types {
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
pub(crate) struct Place {
    pub(crate) map: FragMap,
    pub(crate) lane: Val,
    /// Row (0..16) of each row slot.
    pub(crate) row: Vec<Val>,
    /// Column (0..16) of each column slot.
    pub(crate) col: Vec<Val>,
}

impl Place {
    pub(crate) fn col_of(&self, e: usize) -> Val {
        self.col[self.map.col_slot[e] as usize]
    }
}

/// Learns the rows and columns of this invocation's elements: the workgroup writes the
/// coordinate tile (r·16 + c as f32) at word `at`, each subgroup loads it as an accumulator
/// and reads its elements. Ends with a workgroup barrier (the tile may be overwritten).
pub(crate) fn place(
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

pub(crate) fn elems(k: &mut KernelBuilder, m: CoopMat) -> Vec<Val> {
    (0..LEN as u32).map(|e| k.coop_extract(m, e)).collect()
}

pub(crate) fn from_elems(k: &mut KernelBuilder, ty: CoopTy, vals: &[Val]) -> CoopMat {
    let mut m = k.coop_undef(ty);
    for (e, &v) in vals.iter().enumerate() {
        m = k.coop_insert(m, v, e as u32);
    }
    m
}

/// A fragment whose element e is `per_slot[row slot of e]`.
pub(crate) fn row_frag(k: &mut KernelBuilder, pl: &Place, ty: CoopTy, per_slot: &[Val]) -> CoopMat {
    let vals: Vec<Val> = (0..LEN)
        .map(|e| per_slot[pl.map.row_slot[e] as usize])
        .collect();
    from_elems(k, ty, &vals)
}

/// The f32 accumulator values `vals` as the A operand of the next product (rounded to the
/// inputs' 16-bit type), moved in registers by the map's permutation.
pub(crate) fn to_a(k: &mut KernelBuilder, pl: &Place, ty: Types, vals: &[Val]) -> CoopMat {
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
/// driver packs a pair with one `PRMT`, as f16 gets one `F2FP.PACK_AB`: the DkDv loop has
/// f16's instruction count and ran slightly faster. Rounding to nearest instead (a min
/// against NaNs carrying into the sign, an add, a pack: 3–4 instructions a pair) was more
/// accurate and slower in every kernel (`bench/results/2026-11-28-session31-h200.txt`;
/// figures in bench/results/source-comment-history.md). A driver whose `OpFConvert` rounds to
/// nearest would give that accuracy up here. The outputs (O, dQ, dK, dV) round to nearest
/// even in `store_rows`.
pub(crate) fn to_a_bf16(k: &mut KernelBuilder, pl: &Place, ty: Types, vals: &[Val]) -> CoopMat {
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
pub(crate) fn row_reduce(k: &mut KernelBuilder, pl: &Place, mut v: Val, max: bool) -> Val {
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
pub(crate) struct Tile {
    pub(crate) word: u32,
    pub(crate) row: u32,
    pub(crate) off: Option<Val>,
}

impl Tile {
    pub(crate) fn fixed((word, row): (u32, u32)) -> Tile {
        Tile {
            word,
            row,
            off: None,
        }
    }

    /// Word `word + extra` of the tile.
    pub(crate) fn at(&self, k: &mut KernelBuilder, extra: u32) -> Val {
        let w = k.u32(self.word + extra);
        match self.off {
            Some(o) => k.add(o, w),
            None => w,
        }
    }
}

/// Σ_dc A[dc]·Bᵀ(c, dc) for the 16 columns c·16.. of an `n`-row staged tile (its rows are
/// the product's columns, so B is read column-major): one 16×16 f32 tile.
pub(crate) fn product_t(
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
pub(crate) fn accumulate(
    k: &mut KernelBuilder,
    smem: Shared,
    ty: Types,
    acc: &[CoopVar],
    a: &[CoopMat],
    tile: Tile,
) {
    accumulate_tiles(k, smem, ty, &[acc], &[a], tile);
}

/// Stores the subgroup's accumulators (16 rows × D: `dest`'s rows t0..t0+16, those below T)
/// times `mul` (a per-element fragment or a scalar) to the dense output, through its epilogue
/// tile at word `at`, [`EPI_FRAGS`] fragments at a time: the fragments go to the tile, then
/// consecutive invocations write consecutive 4-element pieces of a row, so every store
/// instruction fills whole 32-byte sectors (a row's 16 columns per fragment were two
/// invocations' 8-byte halves before, each instruction half-filling 16 sectors).
pub(crate) fn store_rows(
    k: &mut KernelBuilder,
    smem: Shared,
    kern: &AttentionKernel,
    acc: &[CoopVar],
    mul: Result<CoopMat, Val>,
    dest: &OutRows,
    at: Val,
) {
    let OutRows {
        view: out,
        b,
        h,
        t0,
        tend,
    } = *dest;
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
            let inside = k.lt(t, tend);
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

pub(crate) fn map_of(kern: &AttentionKernel) -> FragMap {
    kern.frag
        .expect("register-resident attention needs the device's fragment map")
}

/// `product_t` for several A operands (one per row tile): each B fragment is loaded once
/// for all of them.
pub(crate) fn products_t(
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
pub(crate) fn accumulate_tiles(
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
