//! What the cooperative-matrix stages share, both those with the scores in shared memory
//! (`coop_fwd`, `coop_bwd`) and those with the scores in registers (`reg_fwd`, `reg_bwd`):
//! the fragment and word sizes, rows staged into shared memory, halves packed, row limits,
//! fragments loaded and accumulators zeroed. The register kernels' own pieces build on these:
//! [`regs`] (score tiles on the device's fragment map) and, on both, [`blocks`] (the walk
//! over key blocks and the kernels' start-up).

pub(crate) mod blocks;
pub(crate) mod regs;

use helios_spirv::{CoopLayout, CoopMat, CoopTy, CoopVar, KernelBuilder, Scalar, Shared, Ty, Val};

use super::params::{Params, TileRows, View};
use crate::storage::Storage;

/// Fragment side.
pub(crate) const FRAG: u32 = 16;

/// Halves per shared word.
pub(crate) const WORD: u32 = 8;

/// Invocations per subgroup the kernels are written for.
pub(crate) const SUBGROUP: u32 = 32;

/// Keys below `lim` a query sees: min(kend, i + 1) when causal, else kend.
pub(crate) fn row_limit(k: &mut KernelBuilder, causal: bool, i: Val, kend: Val) -> Val {
    if !causal {
        return kend;
    }
    let one = k.u32(1);
    let i1 = k.add(i, one);
    k.min(kend, i1)
}

/// max(lim − j0, 0) in u32.
pub(crate) fn remaining(k: &mut KernelBuilder, lim: Val, j0: Val) -> Val {
    let more = k.gt(lim, j0);
    let d = k.sub(lim, j0);
    let z = k.u32(0);
    k.select(more, d, z)
}

/// Two f32 values as one u32 of halves in `s` (low half first). bf16 rounds half away from
/// zero on the bits (ties are the only difference from round-to-nearest-even, and P and dS
/// tiles are never NaN unless an input is): 2.5 operations per value instead of ~6.
pub(crate) fn pack2(k: &mut KernelBuilder, s: Storage, a: Val, b: Val) -> Val {
    let v = k.vector(&[a, b]);
    match s {
        Storage::F16 => {
            let h = k.convert(v, Scalar::F16);
            k.bitcast(h, Ty::scalar(Scalar::U32))
        }
        _ => {
            let bits = k.bitcast(v, Ty::vector(Scalar::U32, 2));
            let half = k.u32(0x8000);
            let half = k.splat(half, 2);
            let r = k.add(bits, half);
            let lo = k.extract(r, 0);
            let hi = k.extract(r, 1);
            let sixteen = k.u32(16);
            let lo = k.shr(lo, sixteen);
            let top = k.u32(0xffff_0000);
            let hi = k.and(hi, top);
            k.or(lo, hi)
        }
    }
}

/// Stages `rows` of `view` (zero words at t >= tend) into `smem` at word `base`, `row` words
/// per row, invocation `tid` of `threads` moving its share: 16-byte loads (the host checked
/// that offsets and strides are multiples of 8 elements).
pub(crate) fn stage(
    k: &mut KernelBuilder,
    smem: Shared,
    (base, row): (u32, u32),
    view: View,
    rows: &TileRows,
    (tid, threads): (Val, u32),
) {
    let TileRows {
        b,
        h,
        t0,
        tend,
        count: rows,
    } = *rows;
    let per = row - 1;
    let units = rows * per;
    for j in 0..units.div_ceil(threads) {
        let off = k.u32(j * threads);
        let idx = k.add(tid, off);
        let body = |k: &mut KernelBuilder| {
            let pc = k.u32(per);
            let r = k.div(idx, pc);
            let w = k.rem(idx, pc);
            let t = k.add(t0, r);
            let ok = k.lt(t, tend);
            let zero = k.u32(0);
            let tc = k.select(ok, t, zero);
            let at = view.row(k, b, tc, h);
            let word = k.u32(WORD);
            let at = k.div(at, word);
            let at = k.add(at, w);
            let x = k.load(view.buf, at, 4);
            let z4 = k.splat(zero, 4);
            let x = k.select_vec(ok, x, z4);
            let rc = k.u32(row);
            let s = k.mul(r, rc);
            let s = k.add(s, w);
            let bc = k.u32(base);
            let s = k.add(s, bc);
            k.shared_store(smem, s, x);
        };
        if units % threads == 0 {
            body(k);
        } else {
            let n = k.u32(units);
            let inside = k.lt(idx, n);
            k.if_(inside, body);
        }
    }
}

/// Where accumulator rows go: rows from `t0` of head (b, h) of the dense output `view`, of
/// which those below `tend` (T) are written.
#[derive(Clone, Copy)]
pub(crate) struct OutRows {
    pub(crate) view: View,
    pub(crate) b: Val,
    pub(crate) h: Val,
    pub(crate) t0: Val,
    pub(crate) tend: Val,
}

impl OutRows {
    /// Rows from `t0` of head (b, h) of the stage's output `which` (`p.outs`), below T.
    pub(crate) fn of(p: &Params, which: usize, (b, h): (Val, Val), t0: Val) -> OutRows {
        OutRows {
            view: p.outs[which],
            b,
            h,
            t0,
            tend: p.t,
        }
    }
}

trait SelectVec {
    fn select_vec(&mut self, cond: Val, a: Val, b: Val) -> Val;
}

impl SelectVec for KernelBuilder {
    /// `select` of vectors by one scalar condition.
    fn select_vec(&mut self, cond: Val, a: Val, b: Val) -> Val {
        let c = self.splat(cond, a.ty.lanes);
        self.select(c, a, b)
    }
}

pub(crate) fn zero_accs(k: &mut KernelBuilder, ty: CoopTy, n: u32) -> Vec<CoopVar> {
    (0..n)
        .map(|_| {
            let v = k.coop_var(ty);
            let z = k.coop_zero(ty);
            k.coop_set(v, z);
            v
        })
        .collect()
}

/// A fragments (16 × 16, row-major) of the 16 × `d` rows starting at row `row0` of the tile
/// at word `tile` (`row` words per row).
pub(crate) fn row_frags(
    k: &mut KernelBuilder,
    smem: Shared,
    ty: CoopTy,
    tile: u32,
    row: u32,
    row0: Val,
    d: u32,
) -> Vec<CoopMat> {
    let rowc = k.u32(row);
    let base = k.mul(row0, rowc);
    let t = k.u32(tile);
    let base = k.add(base, t);
    (0..d / FRAG)
        .map(|dc| {
            let o = k.u32(dc * 2);
            let at = k.add(base, o);
            k.coop_load_shared(ty, smem, at, rowc, CoopLayout::RowMajor)
        })
        .collect()
}
