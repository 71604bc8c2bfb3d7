//! Cooperative-matrix matmul: f16/bf16 inputs, f32 accumulation on the matrix units.
//!
//! A workgroup of `wm × wn` subgroups computes a `bm × bn` tile; each subgroup holds
//! `(bm/wm/16) × (bn/wn/16)` accumulator fragments. k advances `bk` at a time through two
//! shared-memory stages of 16-byte `vec4<u32>` words (8 halves): while the matrix units work on
//! one stage, each invocation has already issued the global loads of the next tile into
//! registers, and stores them into the other stage afterwards, so there is one barrier per
//! k step. Operands are staged exactly as they lie in memory (rows padded by one word, which
//! spreads the 8 rows a fragment load reads over distinct banks); a transposed operand is
//! read back as a column-major fragment, so the four transpose combinations cost the same.
//!
//! The epilogue: each subgroup stores a fragment as f32 into its own slice of the (then
//! idle) stages, and every invocation applies the scale, bias, activation and residual to
//! four known (row, column) elements at a time and stores them together, with bounds checks.
//! KHR fragments do not say which invocation holds which element, so per-element work has
//! to go through memory. Whole tiles with a plain epilogue used to store each fragment
//! straight to memory instead (`OpCooperativeMatrixStoreKHR`): on an H100 that became one
//! 16-bit store per element, measurably slower on GPT-2's products
//! (bench/results/2026-11-27-matmul-h100-session18-epilogue-ab.txt).

use helios_spirv::{
    Access, Binding, CoopLayout, CoopStride, CoopTy, CoopUse, CoopVar, KernelBuilder, KernelModule,
    Scalar, Shared, SharedLen, Ty, Val,
};

use super::epilogue::store_quad;
use super::kloop::{
    k_span, last_tile, mask, skip_upper_tile, staged_k_loop, tile_k0, unit_index, Pipeline,
};
use super::params::{declare, tile_origin, Dims};
use super::{CoopTile, MatmulKernel, FRAG};
use crate::storage::{buffer_scalar, Storage};

/// Halves per staged word.
const WORD: u32 = 8;

/// `vec4<u32>` words of one stage of A and of B.
pub(crate) fn stage_vec4s(t: CoopTile, trans_a: bool, trans_b: bool) -> (u32, u32) {
    let (bm, bn, bk) = (u32::from(t.bm), u32::from(t.bn), u32::from(t.bk));
    let a = if trans_a {
        bk * (bm / WORD + 1)
    } else {
        bm * (bk / WORD + 1)
    };
    let b = if trans_b {
        bn * (bk / WORD + 1)
    } else {
        bk * (bn / WORD + 1)
    };
    (a, b)
}

/// Which stages hold every subgroup's 16×16 f32 epilogue scratch (64 words): A's where they
/// are large enough, else B's (many subgroups over a short A tile); `None` where neither is.
pub(crate) fn scratch(t: CoopTile, trans_a: bool, trans_b: bool, subgroup: u32) -> Option<Scratch> {
    let (a, b) = stage_vec4s(t, trans_a, trans_b);
    let need = 64 * u32::from(t.wm) * u32::from(t.wn);
    let stages = u32::from(t.stages);
    if subgroup == 0 || 64 % subgroup != 0 {
        None
    } else if need <= stages * a {
        Some(Scratch::A)
    } else if need <= stages * b {
        Some(Scratch::B)
    } else {
        None
    }
}

/// The stage array the epilogue's scratch lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scratch {
    A,
    B,
}

fn frag_scalar(s: Storage) -> Scalar {
    match s {
        Storage::F16 => Scalar::F16,
        Storage::BF16 => Scalar::BF16,
        Storage::F32 => panic!("cooperative matmul needs f16 or bf16 inputs"),
    }
}

/// One operand's staging geometry.
struct Operand {
    /// Rows (A) or columns (B) of the tile.
    outer: u32,
    bk: u32,
    /// k is contiguous in memory (A not transposed, B transposed): staged `[outer][bk]`,
    /// else `[bk][outer]`.
    k_contiguous: bool,
    /// 16-byte loads allowed.
    vec: bool,
    buf: helios_spirv::Buffer,
    ld: Val,
    off: Val,
    base: Val,
    extent: Val,
}

impl Operand {
    /// Words per staged row.
    fn row(&self) -> u32 {
        if self.k_contiguous {
            self.bk / WORD + 1
        } else {
            self.outer / WORD + 1
        }
    }

    fn units(&self) -> u32 {
        self.outer * self.bk / WORD
    }

    fn stage(&self) -> u32 {
        if self.k_contiguous {
            self.outer * self.row()
        } else {
            self.bk * self.row()
        }
    }
}

pub(crate) fn build(kern: &MatmulKernel, t: CoopTile) -> KernelModule {
    let sg = kern.subgroup;
    let (bm, bn, bk) = (u32::from(t.bm), u32::from(t.bn), u32::from(t.bk));
    let (wm, wn) = (u32::from(t.wm), u32::from(t.wn));
    let (fm, fnn) = (bm / wm / FRAG, bn / wn / FRAG);
    let threads = sg * wm * wn;
    let mut k = KernelBuilder::new(kern.name(), Binding::DeviceAddress, [threads, 1, 1]);
    let elem = |vec: bool| if vec { Scalar::U32 } else { Scalar::U16 };
    let p = declare(&mut k, kern, elem(kern.vec_a), elem(kern.vec_b));
    k.begin();

    let (d, m0, n0) = tile_origin(&mut k, &p, bm, bn);
    skip_upper_tile(&mut k, kern, m0, n0, bm);
    let span = k_span(&mut k, kern, &d, m0, bm, bk);
    let tid = k.local_index();
    let sg_id = k.subgroup_id();
    let wn_v = k.u32(wn);
    let warp_m = k.div(sg_id, wn_v);
    let warp_n = k.rem(sg_id, wn_v);

    let a = Operand {
        outer: bm,
        bk,
        k_contiguous: !kern.trans_a,
        vec: kern.vec_a,
        buf: p.a,
        ld: d.lda,
        off: d.off_a,
        base: m0,
        extent: d.m,
    };
    let b = Operand {
        outer: bn,
        bk,
        k_contiguous: kern.trans_b,
        vec: kern.vec_b,
        buf: p.b,
        ld: d.ldb,
        off: d.off_b,
        base: n0,
        extent: d.n,
    };
    let word = Ty::vector(Scalar::U32, 4);
    let stages = u32::from(t.stages);
    let sa = k.shared_array(word, SharedLen::Fixed(stages * a.stage()));
    let sb = k.shared_array(word, SharedLen::Fixed(stages * b.stage()));

    let scalar = frag_scalar(kern.input);
    let a_ty = CoopTy::new(scalar, FRAG, FRAG, CoopUse::A);
    let b_ty = CoopTy::new(scalar, FRAG, FRAG, CoopUse::B);
    let acc_ty = CoopTy::new(Scalar::F32, FRAG, FRAG, CoopUse::Accumulator);
    let acc: Vec<CoopVar> = (0..fm * fnn)
        .map(|_| {
            let v = k.coop_var(acc_ty);
            let z = k.coop_zero(acc_ty);
            k.coop_set(v, z);
            v
        })
        .collect();

    // This subgroup's corner of the tile.
    let wrow = k.u32(bm / wm);
    let wcol = k.u32(bn / wn);
    let warp_row = k.mul(warp_m, wrow);
    let warp_col = k.mul(warp_n, wcol);
    let last = last_tile(&mut k, kern, &d, bk);
    let exact = last.is_some();
    let src_a = a
        .vec
        .then(|| Source::new(&mut k, &a, &d, tid, threads, exact));
    let src_b = b
        .vec
        .then(|| Source::new(&mut k, &b, &d, tid, threads, exact));
    // The staged k loop (see `staged_k_loop`), running the fragments of the stage at
    // (base_a, base_b).
    staged_k_loop(
        &mut k,
        span,
        &Pipeline {
            bk,
            depth: t.depth,
            stages: t.stages,
            spare_set: false,
            stage: [a.stage(), b.stage()],
        },
        |k, k0| {
            let k0 = tile_k0(k, last, k0);
            let ra = load_tile(k, &a, src_a.as_ref(), &d, tid, threads, k0);
            let rb = load_tile(k, &b, src_b.as_ref(), &d, tid, threads, k0);
            (ra, rb)
        },
        |k, base_a, base_b, ra, rb, k0| {
            let step = TileStep {
                d: &d,
                tid,
                threads,
                k0,
            };
            store_tile(k, &a, src_a.as_ref(), &step, sa, base_a, ra);
            store_tile(k, &b, src_b.as_ref(), &step, sb, base_b, rb);
        },
        |k, base_a, base_b| {
            let mut sums: Vec<_> = acc.iter().map(|&v| k.coop_get(v)).collect();
            let frags = |k: &mut KernelBuilder, kk: u32| {
                let af: Vec<_> = (0..fm)
                    .map(|i| {
                        let r = k.u32(i * FRAG);
                        let r = k.add(warp_row, r);
                        frag_load(k, &a, a_ty, sa, base_a, r, kk)
                    })
                    .collect();
                let bf: Vec<_> = (0..fnn)
                    .map(|j| {
                        let c = k.u32(j * FRAG);
                        let c = k.add(warp_col, c);
                        frag_load(k, &b, b_ty, sb, base_b, c, kk)
                    })
                    .collect();
                (af, bf)
            };
            // The fragments of k slice kk + 16 are read before the products of slice kk (in
            // program order; NVIDIA's compiler schedules them itself: no measured change).
            let mut next = Some(frags(k, 0));
            for kk in (0..bk).step_by(FRAG as usize) {
                let (af, bf) = next.take().expect("fragments of this slice");
                if kk + FRAG < bk {
                    next = Some(frags(k, kk + FRAG));
                }
                for (i, x) in af.iter().enumerate() {
                    for (j, y) in bf.iter().enumerate() {
                        let s = &mut sums[i * fnn as usize + j];
                        *s = k.coop_muladd(*x, *y, *s);
                    }
                }
            }
            for (v, s) in acc.iter().zip(sums) {
                k.coop_set(*v, s);
            }
        },
    );

    let frag_origin = |k: &mut KernelBuilder, i: u32, j: u32| {
        let r = k.u32(i * FRAG);
        let r = k.add(warp_row, r);
        let row = k.add(m0, r);
        let c = k.u32(j * FRAG);
        let c = k.add(warp_col, c);
        let col = k.add(n0, c);
        (row, col)
    };
    let scratch_array = match scratch(t, kern.trans_a, kern.trans_b, sg) {
        Some(Scratch::B) => sb,
        _ => sa,
    };
    // Every subgroup is done reading the stages before any reuses them as scratch.
    k.workgroup_barrier();
    let lane = k.subgroup_invocation_id();
    let sixty_four = k.u32(64);
    let scratch = k.mul(sg_id, sixty_four);
    let four = k.u32(4);
    for i in 0..fm {
        for j in 0..fnn {
            let m = k.coop_get(acc[(i * fnn + j) as usize]);
            k.coop_store_shared(m, scratch_array, scratch, four, CoopLayout::RowMajor);
            k.subgroup_barrier();
            let (row0, col0) = frag_origin(&mut k, i, j);
            for q in 0..64 / sg {
                let qo = k.u32(q * sg);
                let qi = k.add(lane, qo);
                let at = k.add(scratch, qi);
                let w = k.shared_load(scratch_array, at);
                let v = k.bitcast(w, Ty::vector(Scalar::F32, 4));
                let r = k.div(qi, four);
                let c = k.rem(qi, four);
                let c = k.mul(c, four);
                let row = k.add(row0, r);
                let col = k.add(col0, c);
                store_quad(&mut k, kern, &p, &d, row, col, v);
            }
            k.subgroup_barrier();
        }
    }
    k.finish()
}

/// Loads the fragment at tile row/column `outer` and k offset `kk` (a constant) from the
/// stage at word `base`.
fn frag_load(
    k: &mut KernelBuilder,
    op: &Operand,
    ty: CoopTy,
    s: Shared,
    base: Val,
    outer: Val,
    kk: u32,
) -> helios_spirv::CoopMat {
    let row = k.u32(op.row());
    // A is M×K and B is K×N: A with k contiguous and B with n contiguous are row-major.
    let row_major = op.k_contiguous == (ty.use_ == CoopUse::A);
    let at = if op.k_contiguous {
        let at = k.mul(outer, row);
        let kq = k.u32(kk / WORD);
        k.add(at, kq)
    } else {
        let at = k.u32(kk * op.row());
        let word = k.u32(WORD);
        let oq = k.div(outer, word);
        k.add(at, oq)
    };
    let at = k.add(at, base);
    let layout = if row_major {
        CoopLayout::RowMajor
    } else {
        CoopLayout::ColumnMajor
    };
    k.coop_load_shared(ty, s, at, row, layout)
}

/// (outer, k) tile coordinates of this invocation's `j`-th word and whether it exists (see
/// [`unit_index`]).
fn unit_coords(
    k: &mut KernelBuilder,
    op: &Operand,
    tid: Val,
    threads: u32,
    j: u32,
) -> (Val, Val, Option<Val>) {
    let (idx, valid) = unit_index(k, op.units(), tid, threads, j);
    let word = k.u32(WORD);
    if op.k_contiguous {
        let per = k.u32(op.bk / WORD);
        let o = k.div(idx, per);
        let kq = k.rem(idx, per);
        let kk = k.mul(kq, word);
        (o, kk, valid)
    } else {
        let per = k.u32(op.outer / WORD);
        let kk = k.div(idx, per);
        let q = k.rem(idx, per);
        let o = k.mul(q, word);
        (o, kk, valid)
    }
}

/// Where an invocation's 16-byte words of a vector-loaded operand come from, computed once
/// before the k loop. The outer coordinate (row of A, column of B) is clamped into the
/// matrix: words past its edge only feed outputs that are never stored, so they need no
/// check. The k coordinate is clamped at each load (so every load is in bounds) and the words
/// past K are zeroed when stored (`store_tile`), never when loaded: a select on the loaded
/// value would make the compiler wait for the load right there.
struct Source {
    /// Per word: element offset of its row (k contiguous) or column (k outer) at k = 0.
    start: Vec<Val>,
    /// Per word: its k offset inside the tile.
    kk: Vec<Val>,
    /// Largest k a load may start at: `K − 8` (k contiguous) or `K − 1`; `None` where the
    /// tiles loaded lie inside k (`exact_k`).
    k_last: Option<Val>,
}

impl Source {
    fn new(
        k: &mut KernelBuilder,
        op: &Operand,
        d: &Dims,
        tid: Val,
        threads: u32,
        exact: bool,
    ) -> Source {
        let count = op.units().div_ceil(threads);
        let (mut start, mut kks) = (Vec::new(), Vec::new());
        // A vector operand's contiguous extent is a multiple of 8 (`Alignment::of`).
        let last = k.u32(if op.k_contiguous { WORD } else { 1 });
        // (K = 0 clamps to k = 0: launched all the same, with every word masked.)
        let k_last = k.max(d.k, last);
        let k_last = k.sub(k_last, last);
        let outer_last = k.u32(if op.k_contiguous { 1 } else { WORD });
        let outer_last = k.sub(op.extent, outer_last);
        for j in 0..count {
            let (o, kk, _) = unit_coords(k, op, tid, threads, j);
            let go = k.add(op.base, o);
            let go = k.min(go, outer_last);
            let at = if op.k_contiguous {
                k.mul(go, op.ld)
            } else {
                go
            };
            start.push(k.add(at, op.off));
            kks.push(kk);
        }
        Source {
            start,
            kk: kks,
            k_last: (!exact).then_some(k_last),
        }
    }

    /// The vector loads of the tile at k = `k0`, unmasked.
    fn load(&self, k: &mut KernelBuilder, op: &Operand, k0: Val) -> Vec<Val> {
        let word = k.u32(WORD);
        self.start
            .iter()
            .zip(&self.kk)
            .map(|(&start, &kk)| {
                let gk = k.add(k0, kk);
                let gk = match self.k_last {
                    Some(last) => k.min(gk, last),
                    None => gk,
                };
                let at = if op.k_contiguous {
                    k.add(start, gk)
                } else {
                    let row = k.mul(gk, op.ld);
                    k.add(row, start)
                };
                let wi = k.div(at, word);
                k.load(op.buf, wi, 4)
            })
            .collect()
    }
}

/// This invocation's words of the tile at k = `k0`: 8 halves each. With a `Source` (vector
/// loads) they are raw and `store_tile` zeroes those past K; without, every half is checked
/// here and the words hold zeros outside the matrix.
fn load_tile(
    k: &mut KernelBuilder,
    op: &Operand,
    src: Option<&Source>,
    d: &Dims,
    tid: Val,
    threads: u32,
    k0: Val,
) -> Vec<Val> {
    if let Some(src) = src {
        return src.load(k, op, k0);
    }
    let count = op.units().div_ceil(threads);
    (0..count)
        .map(|j| {
            let (o, kk, _) = unit_coords(k, op, tid, threads, j);
            let go = k.add(op.base, o);
            let gk = k.add(k0, kk);
            let (row, col, row_n, col_n) = if op.k_contiguous {
                (go, gk, op.extent, d.k)
            } else {
                (gk, go, d.k, op.extent)
            };
            let row_ok = k.lt(row, row_n);
            let start = k.mul(row, op.ld);
            let start = k.add(start, op.off);
            let zero = k.u32(0);
            if op.vec {
                let ok = k.lt(col, col_n);
                let ok = k.and(ok, row_ok);
                let at = k.add(start, col);
                let at = k.select(ok, at, zero);
                let word = k.u32(WORD);
                let wi = k.div(at, word);
                let w = k.load(op.buf, wi, 4);
                mask(k, ok, w)
            } else {
                let halves: Vec<Val> = (0..WORD)
                    .map(|l| {
                        let lo = k.u32(l);
                        let c = k.add(col, lo);
                        let ok = k.lt(c, col_n);
                        let ok = k.and(ok, row_ok);
                        let at = k.add(start, c);
                        let at = k.select(ok, at, zero);
                        let h = k.load(op.buf, at, 1);
                        let h = mask(k, ok, h);
                        k.convert(h, Scalar::U32)
                    })
                    .collect();
                let sixteen = k.u32(16);
                let words: Vec<Val> = halves
                    .chunks(2)
                    .map(|p| {
                        let hi = k.shl(p[1], sixteen);
                        k.or(p[0], hi)
                    })
                    .collect();
                k.vector(&words)
            }
        })
        .collect()
}

/// What one k step's tile stores all share: the sizes, this invocation and the k offset.
#[derive(Clone, Copy)]
struct TileStep<'a> {
    d: &'a Dims,
    tid: Val,
    threads: u32,
    k0: Val,
}

/// Stores the words loaded at k = `k0` into the stage at word offset `base`, zeroing those
/// past K when they came from a `Source`.
fn store_tile(
    k: &mut KernelBuilder,
    op: &Operand,
    src: Option<&Source>,
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
    } = *step;
    for (j, &w) in regs.iter().enumerate() {
        let w = match src {
            // Exact: every word of a tile the loop computes lies inside k.
            Some(src) if src.k_last.is_none() => w,
            Some(src) => {
                let gk = k.add(k0, src.kk[j]);
                let ok = k.lt(gk, d.k);
                mask(k, ok, w)
            }
            None => w,
        };
        let (o, kk, valid) = unit_coords(k, op, tid, threads, j as u32);
        let store = |k: &mut KernelBuilder| {
            let row = k.u32(op.row());
            let word = k.u32(WORD);
            let at = if op.k_contiguous {
                let at = k.mul(o, row);
                let kq = k.div(kk, word);
                k.add(at, kq)
            } else {
                let at = k.mul(kk, row);
                let oq = k.div(o, word);
                k.add(at, oq)
            };
            let at = k.add(at, base);
            k.shared_store(s, at, w);
        };
        match valid {
            Some(ok) => k.if_(ok, store),
            None => store(k),
        }
    }
}

// ------------------------------------------------------------------ peak microbenchmark

/// The cooperative-matrix instruction alone: each subgroup loads `frags × frags` fragments
/// once and chains `iters` mul-adds into `frags²` independent accumulators, then stores
/// them (so nothing is optimised away). FLOPs per launch:
/// `groups · subgroups · iters · frags² · 2 · 16³`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopPeakKernel {
    pub input: Storage,
    /// Fragments per side of a subgroup's accumulator block.
    pub frags: u32,
    /// Subgroups per workgroup.
    pub subgroups: u32,
    pub subgroup: u32,
}

impl CoopPeakKernel {
    pub fn name(&self) -> String {
        format!(
            "mm_peak_{}_{}x{}_w{}",
            self.input.name(),
            self.frags,
            self.frags,
            self.subgroups
        )
    }

    /// Parameters: `a` (u32 words, at least `2·frags·128`), `c` (f32, one 16×16 block per
    /// accumulator of every subgroup launched), `iters` (u32).
    pub fn build(&self) -> KernelModule {
        let threads = self.subgroup * self.subgroups;
        let mut k = KernelBuilder::new(self.name(), Binding::DeviceAddress, [threads, 1, 1]);
        let a = k.buffer("a", Scalar::U32, Access::Read);
        let c = k.buffer("c", buffer_scalar(Storage::F32), Access::Write);
        let iters = k.param("iters", Ty::scalar(Scalar::U32));
        k.begin();
        let scalar = frag_scalar(self.input);
        let a_ty = CoopTy::new(scalar, FRAG, FRAG, CoopUse::A);
        let b_ty = CoopTy::new(scalar, FRAG, FRAG, CoopUse::B);
        let acc_ty = CoopTy::new(Scalar::F32, FRAG, FRAG, CoopUse::Accumulator);
        let stride = k.u32(FRAG / 2); // u32 words per 16-half row
        let n = self.frags;
        let af: Vec<_> = (0..n)
            .map(|i| {
                let at = k.u32(i * 128);
                k.coop_load(
                    a_ty,
                    a,
                    1,
                    at,
                    CoopStride {
                        stride,
                        layout: CoopLayout::RowMajor,
                    },
                    16,
                )
            })
            .collect();
        let bf: Vec<_> = (0..n)
            .map(|j| {
                let at = k.u32((n + j) * 128);
                k.coop_load(
                    b_ty,
                    a,
                    1,
                    at,
                    CoopStride {
                        stride,
                        layout: CoopLayout::RowMajor,
                    },
                    16,
                )
            })
            .collect();
        let acc: Vec<CoopVar> = (0..n * n)
            .map(|_| {
                let v = k.coop_var(acc_ty);
                let z = k.coop_zero(acc_ty);
                k.coop_set(v, z);
                v
            })
            .collect();
        let count = k.load_param(iters);
        let zero = k.u32(0);
        let one = k.u32(1);
        k.for_range(zero, count, one, |k, _| {
            for i in 0..n {
                for j in 0..n {
                    let v = acc[(i * n + j) as usize];
                    let s = k.coop_get(v);
                    let s = k.coop_muladd(af[i as usize], bf[j as usize], s);
                    k.coop_set(v, s);
                }
            }
        });
        let wid = k.workgroup_id();
        let wx = k.extract(wid, 0);
        let sgs = k.u32(self.subgroups);
        let sg_id = k.subgroup_id();
        let w = k.mul(wx, sgs);
        let w = k.add(w, sg_id);
        let per = k.u32(n * n * 256);
        let base = k.mul(w, per);
        let sixteen = k.u32(16);
        for (i, v) in acc.iter().enumerate() {
            let s = k.coop_get(*v);
            let off = k.u32(i as u32 * 256);
            let at = k.add(base, off);
            k.coop_store(
                s,
                c,
                1,
                at,
                CoopStride {
                    stride: sixteen,
                    layout: CoopLayout::RowMajor,
                },
                16,
            );
        }
        k.finish()
    }

    /// FLOPs of one launch of `groups` workgroups.
    pub fn flops(&self, groups: u32, iters: u32) -> f64 {
        f64::from(groups)
            * f64::from(self.subgroups)
            * f64::from(iters)
            * f64::from(self.frags * self.frags)
            * 2.0
            * f64::from(FRAG * FRAG * FRAG)
    }
}
