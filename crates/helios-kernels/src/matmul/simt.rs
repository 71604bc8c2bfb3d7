//! Tiled SIMT matmul: the portable path (any storage, f32 math, every Vulkan device).
//!
//! A workgroup computes a `bm × bn` tile of C; each invocation a `tm × tn` block made of 4×4
//! pieces spread `bm/(tm/4)` rows (`bn/(tn/4)` columns) apart, so that in every k step a
//! subgroup reads A from shared memory as broadcasts and B as consecutive 16-byte vectors,
//! with lanes placed so that both reads run at twice the single-address rate (`lane_grid`).
//! Both operands are staged k-major (`As[k][m]`, `Bs[k][n]`, rows padded by one vec4): an
//! operand whose contiguous dimension is k (A not transposed, B transposed) is transposed on
//! the way in with lane stores, which with k steps of 8 land in 32 distinct banks; the other
//! operand is copied as whole vectors. Two shared buffers and a register prefetch give one
//! barrier per k step: the next tile's global loads are issued before the current tile's
//! FMAs. Out-of-range rows, columns and k are read as zeros from clamped addresses (no
//! branches in the main loop); only the final stores are guarded. A triangular A
//! (`Triangle::LowerA`/`UpperA`) is masked where it is stored into shared memory.

use helios_spirv::{Binding, KernelBuilder, KernelModule, Scalar, Shared, SharedLen, Ty, Val, Var};

use super::epilogue::store_quad;
use super::kloop::{
    k_span, last_tile, mask, skip_upper_tile, staged_k_loop, tile_k0, unit_index, Pipeline,
};
use super::params::{declare, tile_origin, Dims};
use super::{MatmulKernel, SimtTile, Triangle, BK_SIMT};
use crate::storage::{buffer_scalar, load_f32, store_f32};

/// One operand's staging geometry.
struct Operand {
    /// Rows (A) or columns (B) of the tile: `bm` or `bn`.
    outer: u32,
    /// Whether k is the contiguous dimension in memory (A not transposed, B transposed).
    k_contiguous: bool,
    /// Vector loads allowed (see `Alignment`).
    vec: bool,
    /// vec4s per staged k row (`outer / 4 + 1`, one vec4 of padding).
    row: u32,
    /// A only, under `Triangle::LowerA`/`UpperA`: the tile's first row, and whether the
    /// lower triangle is kept (else the upper one).
    triangle: Option<(Val, bool)>,
}

impl Operand {
    /// vec4 units one tile holds.
    fn units(&self) -> u32 {
        self.outer * BK_SIMT / 4
    }
}

pub(crate) fn build(kern: &MatmulKernel, t: SimtTile) -> KernelModule {
    let (bm, bn, tm, tn) = (
        u32::from(t.bm),
        u32::from(t.bn),
        u32::from(t.tm),
        u32::from(t.tn),
    );
    assert!(tm % 4 == 0 && tn % 4 == 0 && bm % tm == 0 && bn % tn == 0);
    let threads_x = bn / tn;
    let threads = threads_x * (bm / tm);
    let mut k = KernelBuilder::new(kern.name(), Binding::DeviceAddress, [threads, 1, 1]);
    let elem = buffer_scalar(kern.input);
    let p = declare(&mut k, kern, elem, elem);
    k.begin();

    let (d, m0, n0) = tile_origin(&mut k, &p, bm, bn);
    skip_upper_tile(&mut k, kern, m0, n0, bm);
    let span = k_span(&mut k, kern, &d, m0, bm, BK_SIMT);
    let tid = k.local_index();
    let (tx, ty) = lane_grid(&mut k, tid, threads_x, bm / tm);
    let last = last_tile(&mut k, kern, &d, BK_SIMT);
    let exact = last.is_some();

    let a_op = Operand {
        outer: bm,
        k_contiguous: !kern.trans_a,
        vec: kern.vec_a,
        row: bm / 4 + 1,
        triangle: match kern.triangle {
            Triangle::LowerA => Some((m0, true)),
            Triangle::UpperA => Some((m0, false)),
            Triangle::Full | Triangle::LowerC => None,
        },
    };
    let b_op = Operand {
        outer: bn,
        k_contiguous: kern.trans_b,
        vec: kern.vec_b,
        row: bn / 4 + 1,
        triangle: None,
    };
    let vec4 = Ty::vector(Scalar::F32, 4);
    let a_len = BK_SIMT * a_op.row;
    let b_len = BK_SIMT * b_op.row;
    let sa = k.shared_array(vec4, SharedLen::Fixed(2 * a_len));
    let sb = k.shared_array(vec4, SharedLen::Fixed(2 * b_len));

    let (gm, gn) = (tm / 4, tn / 4);
    let zero4 = k.constant_bits(vec4, 0);
    let acc: Vec<Var> = (0..tm * gn).map(|_| k.var_init(zero4)).collect();
    // `Epilogue::col_sums`: the invocations of the first tile row's workgroups (a uniform
    // branch; the others would only repeat the sums) add up the B values they read, their
    // `gn` column quads over all of k (invocations of one `tx` hold the same sums).
    let col_sums: Vec<Var> = match kern.epilogue.col_sums() {
        true => (0..gn).map(|_| k.var_init(zero4)).collect(),
        false => Vec::new(),
    };
    let zero = k.u32(0);
    let first_row = k.eq(m0, zero);

    let a_src = Source {
        buf: p.a,
        ld: d.lda,
        off: d.off_a,
        base: m0,
        extent: d.m,
    };
    let b_src = Source {
        buf: p.b,
        ld: d.ldb,
        off: d.off_b,
        base: n0,
        extent: d.n,
    };

    let step = |k0| TileStep {
        d: &d,
        tid,
        threads,
        k0,
        exact,
    };
    // The staged k loop (see `staged_k_loop`), computing on the stage at (base_a, base_b).
    staged_k_loop(
        &mut k,
        span,
        &Pipeline {
            bk: BK_SIMT,
            depth: t.depth,
            stages: 2,
            spare_set: true,
            stage: [a_len, b_len],
        },
        |k, k0| {
            let k0 = tile_k0(k, last, k0);
            let step = step(k0);
            let ra = load_tile(k, kern, &a_op, &a_src, &step);
            let rb = load_tile(k, kern, &b_op, &b_src, &step);
            (ra, rb)
        },
        |k, base_a, base_b, ra, rb, k0| {
            let step = step(k0);
            store_tile(k, &a_op, &step, sa, base_a, ra);
            store_tile(k, &b_op, &step, sb, base_b, rb);
        },
        |k, base_a, base_b| {
            let mut sums: Vec<Val> = acc.iter().map(|&v| k.get(v)).collect();
            for kk in 0..BK_SIMT {
                let a: Vec<Val> = (0..gm)
                    .map(|g| {
                        let at = k.u32(kk * a_op.row + g * (bm / gm / 4));
                        let at = k.add(at, base_a);
                        let at = k.add(at, ty);
                        k.shared_load(sa, at)
                    })
                    .collect();
                let b: Vec<Val> = (0..gn)
                    .map(|g| {
                        let at = k.u32(kk * b_op.row + g * (bn / gn / 4));
                        let at = k.add(at, base_b);
                        let at = k.add(at, tx);
                        k.shared_load(sb, at)
                    })
                    .collect();
                for (gi, av) in a.iter().enumerate() {
                    for i in 0..4 {
                        let s = k.extract(*av, i);
                        let s = k.splat(s, 4);
                        for (gj, bv) in b.iter().enumerate() {
                            let r = (gi as u32 * 4 + i) * gn + gj as u32;
                            let slot = &mut sums[r as usize];
                            *slot = k.fma(s, *bv, *slot);
                        }
                    }
                }
            }
            for (v, s) in acc.iter().zip(sums) {
                k.set(*v, s);
            }
            if !col_sums.is_empty() {
                k.if_(first_row, |k| {
                    let mut sums: Vec<Val> = col_sums.iter().map(|&v| k.get(v)).collect();
                    for kk in 0..BK_SIMT {
                        for (g, sum) in sums.iter_mut().enumerate() {
                            let at = k.u32(kk * b_op.row + g as u32 * (bn / gn / 4));
                            let at = k.add(at, base_b);
                            let at = k.add(at, tx);
                            let b = k.shared_load(sb, at);
                            *sum = k.add(*sum, b);
                        }
                    }
                    for (v, s) in col_sums.iter().zip(sums) {
                        k.set(*v, s);
                    }
                });
            }
        },
    );

    // Epilogue: row (gi, i) is m0 + gi·bm/gm + 4·ty + i, column group gj starts at
    // n0 + gj·bn/gn + 4·tx.
    let four = k.u32(4);
    let ty4 = k.mul(ty, four);
    let tx4 = k.mul(tx, four);
    for gi in 0..gm {
        for i in 0..4 {
            let r = k.u32(gi * (bm / gm) + i);
            let r = k.add(r, ty4);
            let row = k.add(m0, r);
            for gj in 0..gn {
                let c = k.u32(gj * (bn / gn));
                let c = k.add(c, tx4);
                let col = k.add(n0, c);
                let v = k.get(acc[((gi * 4 + i) * gn + gj) as usize]);
                store_quad(&mut k, kern, &p, &d, row, col, v);
            }
        }
    }
    if let Some(out) = p.sums {
        // The first tile row's invocations of the first row of blocks store their sums.
        let first_block = k.eq(ty, zero);
        let storing = k.and(first_row, first_block);
        k.if_(storing, |k| {
            for (gj, &v) in col_sums.iter().enumerate() {
                let c = k.u32(gj as u32 * (bn / gn));
                let c = k.add(c, tx4);
                let col = k.add(n0, c);
                let v = k.get(v);
                for lane in 0..4 {
                    let off = k.u32(lane);
                    let c = k.add(col, off);
                    let ok = k.lt(c, d.n);
                    let x = k.extract(v, lane);
                    k.if_(ok, |k| store_f32(k, out, c, x, kern.out));
                }
            }
        });
    }
    k.finish()
}

/// This invocation's place `(tx, ty)` in the `threads_x × threads_y` grid of `tm × tn`
/// blocks. A k step reads A at an address that depends on `ty` only and B on `tx` only, and
/// shared memory returns one register per lane and cycle: a 16-byte load costs a subgroup
/// four cycles, but two when lanes n and n^1, or n and n^2, read the same address (NVIDIA's
/// uniform-pair rule). So lane bit 0 picks `tx` and bit 1 `ty`: A's loads pair lanes n^1 and
/// B's pair n^2. Row-major lanes (`tx = tid % threads_x`) pair only A's: this placement made
/// NT products faster and NN ones no slower (bench/results/source-comment-history.md).
fn lane_grid(k: &mut KernelBuilder, tid: Val, threads_x: u32, threads_y: u32) -> (Val, Val) {
    let interleave = threads_x >= 2
        && threads_y >= 2
        && threads_x.is_power_of_two()
        && threads_y.is_power_of_two();
    if !interleave {
        let tx_n = k.u32(threads_x);
        return (k.rem(tid, tx_n), k.div(tid, tx_n));
    }
    let bits_x = threads_x.trailing_zeros();
    let one = k.u32(1);
    let two = k.u32(2);
    // tid = … ty_hi | tx_hi (bits_x − 1 bits) | ty_0 | tx_0
    let tx0 = k.and(tid, one);
    let tx_hi = k.shr(tid, two);
    let tx_mask = k.u32(threads_x / 2 - 1);
    let tx_hi = k.and(tx_hi, tx_mask);
    let tx_hi = k.shl(tx_hi, one);
    let tx = k.or(tx0, tx_hi);
    let ty0 = k.shr(tid, one);
    let ty0 = k.and(ty0, one);
    let ty_shift = k.u32(bits_x + 1);
    let ty_hi = k.shr(tid, ty_shift);
    let ty_hi = k.shl(ty_hi, one);
    let ty = k.or(ty0, ty_hi);
    (tx, ty)
}

/// Where an operand's tile comes from: element (outer `o`, k) of the tile is at
/// `off + (base + o)·ld + k` when k is contiguous, else `off + k·ld + base + o`.
struct Source {
    buf: helios_spirv::Buffer,
    ld: Val,
    off: Val,
    base: Val,
    /// M or N: rows (columns) past it read as zeros.
    extent: Val,
}

/// The (outer, k) coordinates within the tile of this invocation's `j`-th vec4 unit, and
/// whether the unit exists (see [`unit_index`]).
fn unit_coords(
    k: &mut KernelBuilder,
    op: &Operand,
    tid: Val,
    threads: u32,
    j: u32,
) -> (Val, Val, Option<Val>) {
    let (idx, valid) = unit_index(k, op.units(), tid, threads, j);
    if op.k_contiguous {
        // BK/4 units per outer row: unit = (o, kq), k = 4·kq.
        let per = k.u32(BK_SIMT / 4);
        let o = k.div(idx, per);
        let kq = k.rem(idx, per);
        let four = k.u32(4);
        let kk = k.mul(kq, four);
        (o, kk, valid)
    } else {
        // outer/4 units per k row: unit = (k, q), o = 4·q.
        let per = k.u32(op.outer / 4);
        let kk = k.div(idx, per);
        let q = k.rem(idx, per);
        let four = k.u32(4);
        let o = k.mul(q, four);
        (o, kk, valid)
    }
}

/// What one k step's tile loads and stores all share: sizes, invocation, k0 and exactness.
#[derive(Clone, Copy)]
struct TileStep<'a> {
    d: &'a Dims,
    tid: Val,
    threads: u32,
    k0: Val,
    exact: bool,
}

/// Loads this invocation's vec4 units of the tile starting at k = `k0` (f32, zeros outside
/// the matrix; with `exact`, the tile lies inside k and its k is not clamped).
fn load_tile(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    op: &Operand,
    src: &Source,
    step: &TileStep,
) -> Vec<Val> {
    let TileStep {
        d,
        tid,
        threads,
        k0,
        exact,
    } = *step;
    let count = op.units().div_ceil(threads);
    (0..count)
        .map(|j| {
            let (o, kk, _) = unit_coords(k, op, tid, threads, j);
            let go = k.add(src.base, o);
            let gk = k.add(k0, kk);
            // Four consecutive elements along the contiguous dimension.
            let (row, col, row_n, col_n) = if op.k_contiguous {
                (go, gk, src.extent, d.k)
            } else {
                (gk, go, d.k, src.extent)
            };
            if op.vec {
                // Clamped into the matrix instead of masked: rows and columns past M or N
                // only feed outputs never stored, and the words past K are zeroed by
                // `store_tile` (a select here would make the compiler wait for the load).
                // The contiguous extent is a multiple of 4 (`Alignment::of`).
                let four = k.u32(4);
                let one = k.u32(1);
                let last = |k: &mut KernelBuilder, n: Val, w: Val| {
                    let n = k.max(n, w);
                    k.sub(n, w)
                };
                // The outer coordinate is clamped (loop-invariant); k (the column when k is
                // contiguous, else the row) only where the tile may pass the end.
                let row = if exact && !op.k_contiguous {
                    row
                } else {
                    let row_last = last(k, row_n, one);
                    k.min(row, row_last)
                };
                let col = if exact && op.k_contiguous {
                    col
                } else {
                    let col_last = last(k, col_n, four);
                    k.min(col, col_last)
                };
                let start = k.mul(row, src.ld);
                let start = k.add(start, src.off);
                let at = k.add(start, col);
                let vi = k.div(at, four);
                load_f32(k, src.buf, vi, 4, kern.input)
            } else {
                let row_ok = k.lt(row, row_n);
                let start = k.mul(row, src.ld);
                let start = k.add(start, src.off);
                let lanes: Vec<Val> = (0..4)
                    .map(|l| {
                        let lo = k.u32(l);
                        let c = k.add(col, lo);
                        let ok = k.lt(c, col_n);
                        let ok = k.and(ok, row_ok);
                        let at = k.add(start, c);
                        let zero = k.u32(0);
                        let at = k.select(ok, at, zero);
                        let v = load_f32(k, src.buf, at, 1, kern.input);
                        mask(k, ok, v)
                    })
                    .collect();
                k.vector(&lanes)
            }
        })
        .collect()
}

/// Stores the units loaded at k = `k0` into the k-major staging buffer at vec4 offset
/// `base`; vector-loaded units past K are zeroed here (see `load_tile`; with `exact` no tile
/// the loop computes has any), and so are the entries of a triangular A outside its
/// triangle.
fn store_tile(
    k: &mut KernelBuilder,
    op: &Operand,
    step: &TileStep,
    s: Shared,
    base: Val,
    regs: &[Val],
) {
    let TileStep {
        d,
        tid,
        threads,
        k0,
        exact,
    } = *step;
    for (j, &v) in regs.iter().enumerate() {
        let (o, kk, valid) = unit_coords(k, op, tid, threads, j as u32);
        let v = if op.vec && !exact {
            let gk = k.add(k0, kk);
            let ok = k.lt(gk, d.k);
            mask(k, ok, v)
        } else {
            v
        };
        let v = match op.triangle {
            None => v,
            Some((m0, lower)) => {
                // Row and k of each lane: four k along a row, or four rows at one k.
                let lanes: Vec<Val> = (0..4).map(|l| k.u32(l)).collect();
                let lanes = k.vector(&lanes);
                let row = k.add(m0, o);
                let row = k.splat(row, 4);
                let gk = k.add(k0, kk);
                let gk = k.splat(gk, 4);
                let (row, gk) = if op.k_contiguous {
                    (row, k.add(gk, lanes))
                } else {
                    (k.add(row, lanes), gk)
                };
                let keep = if lower { k.le(gk, row) } else { k.ge(gk, row) };
                let zero = k.constant_bits(v.ty, 0);
                k.select(keep, v, zero)
            }
        };
        let store = |k: &mut KernelBuilder| {
            let row = k.u32(op.row);
            let four = k.u32(4);
            let oq = k.div(o, four);
            if op.k_contiguous {
                // Lanes are k..k+3 of outer index o: one lane into each of four k rows.
                let lane = k.rem(o, four);
                for l in 0..4 {
                    let lo = k.u32(l);
                    let kr = k.add(kk, lo);
                    let at = k.mul(kr, row);
                    let at = k.add(at, oq);
                    let at = k.add(at, base);
                    let x = k.extract(v, l);
                    k.shared_store_lane(s, at, lane, x);
                }
            } else {
                let at = k.mul(kk, row);
                let at = k.add(at, oq);
                let at = k.add(at, base);
                k.shared_store(s, at, v);
            }
        };
        match valid {
            Some(ok) => k.if_(ok, store),
            None => store(k),
        }
    }
}
