//! Matrix multiply on NVIDIA's native path: PTX with Hopper's `wgmma`, launched through
//! VK_NVX_binary_import (`helios_vk::NativeKernel`).
//!
//! One block computes a `bm × bn` tile with `bm / 64` warpgroups, each a 64 × `bn` strip in
//! registers. Both operands are staged through shared memory in the no-swizzle "core matrix"
//! layout `wgmma` reads through descriptors (8 rows × 16 bytes each, K-major or M/N-major as
//! the operand is stored, so transposes cost nothing), `stages` deep, filled by every thread
//! with 16-byte `cp.async` copies whose source size clamps the tile edges to zeros. The
//! driver gives these launches 48 KiB of shared memory and one such block per SM
//! (`../shared/NVX.md`), so the stages are the whole budget. The epilogue runs from the
//! accumulators: scale, bias, activation (and its gradient), residual, rounding.

use helios_ptx::{
    Addr, BuildError, Cmp, Kernel, MatrixDesc, MmaInput, Module, Reg, Space, Special, Swizzle,
    Target, Ty, WgmmaA,
};

use crate::launch::{Arg, Args};
use crate::matmul::{
    Activation, Alignment, MatmulAddresses, MatmulKernel, MatmulShape, NativeTile, RowOp, Triangle,
};
use crate::storage::Storage;
use crate::KernelError;

/// Rows of a warpgroup's strip (the `wgmma` M).
const WG_ROWS: u32 = 64;
const WG_THREADS: u32 = 128;

/// What a launch of a native kernel needs besides the kernel: grid, block and the
/// arguments in parameter order (buffers as device addresses).
#[derive(Clone, Debug, PartialEq)]
pub struct NativeLaunch {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub args: Args,
}

/// Whether the native kernel of `t` can run `kern` on a device whose native target is
/// `target`: `wgmma` (Hopper's `sm_90a`), 16-bit inputs whose rows start 16-byte aligned
/// (the `cp.async` copies), and an epilogue without the attention-only row ops, column sums
/// or triangles.
pub(crate) fn feasible(kern: &MatmulKernel, t: NativeTile, target: Option<Target>) -> bool {
    let e = &kern.epilogue;
    target.is_some_and(|t| t.has_wgmma())
        && matches!(kern.input, Storage::F16 | Storage::BF16)
        && kern.vec_a
        && kern.vec_b
        && kern.triangle == Triangle::Full
        && e.row == RowOp::None
        && !e.col_sums
        && t.shared_bytes() <= 48 * 1024
}

/// Byte layout of one operand's stage in shared memory.
#[derive(Clone, Copy, Debug)]
struct Stage {
    /// Rows of the operand tile along M (A) or N (B).
    rows: u32,
    bk: u32,
    /// Stored with K contiguous (A not transposed, B transposed).
    k_major: bool,
}

impl Stage {
    fn bytes(self) -> u32 {
        self.rows * self.bk * 2
    }

    /// Core matrices adjacent along K are `lbo` apart, 8-row groups along M/N `sbo` apart.
    /// K-major: a row group's K run is contiguous (lbo 128); M/N-major: the M/N run of a
    /// k group is (sbo 128).
    fn desc(self) -> MatrixDesc {
        let (lbo, sbo) = if self.k_major {
            (128, self.bk * 16)
        } else {
            (self.rows * 16, 128)
        };
        MatrixDesc {
            swizzle: Swizzle::None,
            lbo,
            sbo,
        }
    }

    /// Byte offset of the k16 step `s` (two core matrices along K).
    fn k_step(self, s: u32) -> u32 {
        2 * s * self.desc().lbo
    }

    /// Byte offset of row group `row / 8` (a warpgroup's first row).
    fn row_offset(self, row: u32) -> u32 {
        (row / 8) * self.desc().sbo
    }

    /// 16-byte chunks a stage holds.
    fn chunks(self) -> u32 {
        self.rows * self.bk / 8
    }
}

/// One 16-byte chunk of an operand's stage that a thread copies, fixed for the k loop.
struct Chunk {
    /// Global byte address of the chunk at k0 = 0 (u64).
    src: Reg,
    /// Byte offset in the stage (u32).
    soff: Reg,
    /// Its first k within the tile (u32).
    kin: Reg,
    /// Its row exists in the matrix and the chunk in the tile (pred).
    row_ok: Reg,
    /// Whether the chunk exists at all, where threads outnumber the last round of chunks.
    exists: Option<Reg>,
}

/// One thread's share of an operand's copies.
struct Copies {
    chunks: Vec<Chunk>,
    /// Bytes the global address moves per k tile (u64).
    step: Reg,
    /// A valid address for chunks that read nothing.
    safe: Reg,
}

/// The kernel's name for the signature (the SPIR-V family's naming with its own variant).
pub(crate) fn entry_name(kern: &MatmulKernel) -> String {
    kern.name()
}

/// Emits the PTX of `kern` with tile `t` for `target`.
pub(crate) fn build(
    kern: &MatmulKernel,
    t: NativeTile,
    target: Target,
) -> Result<Module, BuildError> {
    let name = entry_name(kern);
    let mut k = Kernel::new(&name, target);
    let (bm, bn, bk, stages) = (
        u32::from(t.bm),
        u32::from(t.bn),
        u32::from(t.bk),
        u32::from(t.stages),
    );
    let threads = bm / WG_ROWS * WG_THREADS;
    k.threads(threads);
    let e = kern.epilogue;
    let input = match kern.input {
        Storage::F16 => MmaInput::F16,
        _ => MmaInput::BF16,
    };

    // Parameters, in `native_launch` order.
    let pa = k.param("a", Ty::U64);
    let pb = k.param("b", Ty::U64);
    let pc = k.param("c", Ty::U64);
    let pbias = e.bias.then(|| k.param("bias", Ty::U64));
    let pres = e.residual.then(|| k.param("residual", Ty::U64));
    let ppre = e.store_pre.then(|| k.param("pre", Ty::U64));
    let names = [
        "m", "n", "k", "lda", "ldb", "ldc", "ldr", "stride_a", "stride_b", "stride_c", "stride_r",
        "inner", "inner_a", "inner_b", "inner_c", "inner_r",
    ];
    let sizes: Vec<_> = names.iter().map(|n| k.param(n, Ty::U32)).collect();
    let palpha = k.param("alpha", Ty::F32);

    let a_stage = Stage {
        rows: bm,
        bk,
        k_major: !kern.trans_a,
    };
    let b_stage = Stage {
        rows: bn,
        bk,
        k_major: kern.trans_b,
    };
    let stage_bytes = a_stage.bytes() + b_stage.bytes();
    let smem = k.shared("stages", 128, stages * stage_bytes);

    k.comment("block coordinates and batch offsets");
    let a = k.ld_param_global(pa);
    let b = k.ld_param_global(pb);
    let c = k.ld_param_global(pc);
    let v: Vec<Reg> = sizes.iter().map(|&p| k.ld_param(p)).collect();
    let [m, n, kk, lda, ldb, ldc, ldr, sa, sb, sc, sr, inner, ia, ib, ic, ir] =
        <[Reg; 16]>::try_from(v).expect("16 sizes");
    let alpha = k.ld_param(palpha);
    let tid = k.special(Special::TidX);
    let bx = k.special(Special::CtaIdX);
    let by = k.special(Special::CtaIdY);
    let bz = k.special(Special::CtaIdZ);
    let outer = k.div(bz, inner);
    let inr = k.rem(bz, inner);
    // Element offsets of this batch's matrices (u64: a batch may pass 2^32 elements).
    let offset = |k: &mut Kernel, stride: Reg, inner_stride: Reg| {
        let o = k.mul_wide(outer, stride);
        k.mad_wide(inr, inner_stride, o)
    };
    let off_a = offset(&mut k, sa, ia);
    let off_b = offset(&mut k, sb, ib);
    let off_c = offset(&mut k, sc, ic);
    let off_r = offset(&mut k, sr, ir);
    let m0 = k.mul(by, bm);
    let n0 = k.mul(bx, bn);
    let bytes_a = k.shl(off_a, 1u32);
    let a = k.add(a, bytes_a);
    let bytes_b = k.shl(off_b, 1u32);
    let b = k.add(b, bytes_b);

    k.comment("each thread's cp.async chunks");
    let ca = copies(&mut k, a_stage, a, lda, m0, m, tid, threads);
    let cb = copies(&mut k, b_stage, b, ldb, n0, n, tid, threads);

    let base = k.shared_address(smem);
    let tiles = {
        let t = k.add(kk, bk - 1);
        k.div(t, bk)
    };
    let load = |k: &mut Kernel, tile: Reg| {
        let slot = k.rem(tile, stages);
        let sbase = k.mad(slot, stage_bytes, base);
        let k0 = k.mul(tile, bk);
        let kmax = k.sub(kk, k0);
        issue(k, &ca, sbase, tile, kmax);
        let bbase = k.add(sbase, a_stage.bytes());
        issue(k, &cb, bbase, tile, kmax);
    };

    // With one wgmma group kept in flight, the stage it reads is not refilled until the
    // next iteration: one stage fewer ahead.
    let keep = u32::from(t.overlap);
    let ahead = stages - 1 - keep;
    k.comment("prologue: the first stages in flight");
    for s in 0..ahead {
        let tile = k.mov(Ty::U32, s);
        let live = k.setp(Cmp::Lt, tile, tiles);
        k.if_(live, |k| load(k, tile));
        k.cp_async_commit();
    }

    k.comment("accumulators and descriptors");
    let acc = k.regs(Ty::F32, (bn / 2) as usize);
    for &r in &acc {
        k.assign(r, 0.0f32);
    }
    let wg = k.shr(tid, 7u32);
    let desc_a0 = k.wgmma_desc(base, &a_stage.desc());
    let desc_b0 = {
        let d = k.wgmma_desc(base, &b_stage.desc());
        k.desc_offset(d, a_stage.bytes())
    };
    // This warpgroup's rows of A.
    let wg_a = k.mul(wg, a_stage.row_offset(WG_ROWS) >> 4);
    let wg_a = k.cvt(Ty::U64, wg_a);
    let desc_a0 = k.add(desc_a0, wg_a);
    let zero = k.mov(Ty::U32, 0u32);
    let scale_d = k.setp(Cmp::Eq, zero, 0u32);

    k.comment("main loop: wait for a stage, refill the oldest, multiply");
    k.for_range(0u32, tiles, 1, |k, tile| {
        k.cp_async_wait(ahead - 1);
        // cp.async writes are the generic proxy's; wgmma reads through the async proxy.
        k.fence_proxy_async();
        k.bar_sync(0);
        let next = k.add(tile, ahead);
        let live = k.setp(Cmp::Lt, next, tiles);
        k.if_(live, |k| load(k, next));
        k.cp_async_commit();
        let slot = k.rem(tile, stages);
        let units = k.mul(slot, stage_bytes >> 4);
        let units = k.cvt(Ty::U64, units);
        let da = k.add(desc_a0, units);
        let db = k.add(desc_b0, units);
        k.wgmma_fence();
        for s in 0..bk / 16 {
            let das = k.desc_offset(da, a_stage.k_step(s));
            let dbs = k.desc_offset(db, b_stage.k_step(s));
            k.wgmma(
                input,
                &acc,
                WgmmaA::Shared {
                    desc: das,
                    transpose: !a_stage.k_major,
                },
                dbs,
                !b_stage.k_major,
                scale_d,
            );
        }
        k.wgmma_commit();
        k.wgmma_wait(keep);
    });
    k.wgmma_wait(0);
    k.cp_async_wait(0);

    k.comment("epilogue from the accumulators");
    let out = Out {
        c,
        off_c,
        ldc,
        bias: pbias.map(|p| k.ld_param_global(p)),
        residual: pres.map(|p| k.ld_param_global(p)),
        off_r,
        ldr,
        pre: ppre.map(|p| k.ld_param_global(p)),
    };
    epilogue(&mut k, kern, &acc, &out, alpha, (m, n), (m0, n0), tid, bn);
    k.finish()
}

/// Works out this thread's chunks of an operand's stage: chunk `tid + j·threads` of
/// `stage.chunks()`. K-major: chunk → (row, 8 k's), consecutive threads along k then rows,
/// so a warp reads whole sectors and writes whole core matrices. M/N-major: chunk → (8
/// rows of one k, k), consecutive threads along k within a core matrix first (its 8 rows are
/// 16 bytes apart in shared memory: writes without bank conflicts), then along M/N.
#[allow(clippy::too_many_arguments)]
fn copies(
    k: &mut Kernel,
    stage: Stage,
    ptr: Reg,
    ld: Reg,
    r0: Reg,
    rows: Reg,
    tid: Reg,
    threads: u32,
) -> Copies {
    let total = stage.chunks();
    let ld_bytes = k.mul_wide(ld, 2u32);
    let step = if stage.k_major {
        k.mov(Ty::U64, i64::from(stage.bk * 2))
    } else {
        k.mul(ld_bytes, stage.bk)
    };
    let chunks = (0..total.div_ceil(threads))
        .map(|j| {
            let c = k.add(tid, j * threads);
            let exists = ((j + 1) * threads > total).then(|| k.setp(Cmp::Lt, c, total));
            let (row, kin, soff) = if stage.k_major {
                let per_row = stage.bk / 8;
                let row = k.div(c, per_row);
                let kc = k.rem(c, per_row);
                let kin = k.mul(kc, 8u32);
                // (row / 8)·sbo + kc·128 + (row % 8)·16
                let g = k.shr(row, 3u32);
                let s = k.mul(g, stage.desc().sbo);
                let s = k.mad(kc, 128u32, s);
                let r8 = k.and(row, 7u32).retype(Ty::U32);
                (row, kin, k.mad(r8, 16u32, s))
            } else {
                let groups = stage.rows / 8;
                let k8 = k.and(c, 7u32).retype(Ty::U32);
                let rest = k.shr(c, 3u32);
                let mc = k.rem(rest, groups);
                let kg = k.div(rest, groups);
                let row = k.mul(mc, 8u32);
                let kin = k.mad(kg, 8u32, k8);
                // mc·128 + kg·lbo + k8·16
                let s = k.mul(mc, 128u32);
                let s = k.mad(kg, stage.desc().lbo, s);
                (row, kin, k.mad(k8, 16u32, s))
            };
            let grow = k.add(r0, row);
            let row_ok = k.setp(Cmp::Lt, grow, rows);
            let row_ok = match exists {
                Some(e) => k.and_pred(row_ok, e),
                None => row_ok,
            };
            // Element offset of the chunk at k0 = 0, then bytes.
            let (major, minor) = if stage.k_major {
                (grow, kin)
            } else {
                (kin, grow)
            };
            let o = k.mul_wide(major, ld);
            let w = k.cvt(Ty::U64, minor);
            let o = k.add(o, w);
            let o = k.shl(o, 1u32);
            let src = k.add(ptr, o);
            Chunk {
                src,
                soff,
                kin,
                row_ok,
                exists,
            }
        })
        .collect();
    Copies {
        chunks,
        step,
        safe: ptr,
    }
}

/// Issues one operand's copies of k tile `tile` into the stage at shared address `sbase`;
/// `kmax` is K − k0. A chunk whose row or k lies outside the matrix reads nothing and
/// zero-fills its 16 bytes (k is a multiple of 8, so a chunk is wholly in or out).
fn issue(k: &mut Kernel, copies: &Copies, sbase: Reg, tile: Reg, kmax: Reg) {
    let t64 = k.cvt(Ty::U64, tile);
    let delta = k.mul(t64, copies.step);
    for ch in &copies.chunks {
        let k_ok = k.setp(Cmp::Lt, ch.kin, kmax);
        let ok = k.and_pred(k_ok, ch.row_ok);
        let src = k.add(ch.src, delta);
        let src = k.selp(ok, src, copies.safe, Ty::U64);
        let bytes = k.selp(ok, 16u32, 0u32, Ty::U32);
        let dst = k.add(sbase, ch.soff);
        match ch.exists {
            Some(e) => k.if_(e, |k| {
                k.cp_async(Addr::new(dst), Addr::new(src), 16, Some(bytes))
            }),
            None => k.cp_async(Addr::new(dst), Addr::new(src), 16, Some(bytes)),
        }
    }
}

/// Where the epilogue writes and what it reads.
struct Out {
    c: Reg,
    off_c: Reg,
    ldc: Reg,
    bias: Option<Reg>,
    residual: Option<Reg>,
    off_r: Reg,
    ldr: Reg,
    pre: Option<Reg>,
}

/// The accumulator layout of `wgmma` m64nN (f32): in warp `w` of the warpgroup, lane
/// `4g + q` holds, for each 8-column block `j`, rows `16w + g` and `16w + g + 8` at columns
/// `8j + 2q` and `8j + 2q + 1`: registers `4j + 2h + {0, 1}` for row half `h`.
#[allow(clippy::too_many_arguments)]
fn epilogue(
    k: &mut Kernel,
    kern: &MatmulKernel,
    acc: &[Reg],
    out: &Out,
    alpha: Reg,
    (m, n): (Reg, Reg),
    (m0, n0): (Reg, Reg),
    tid: Reg,
    bn: u32,
) {
    let e = kern.epilogue;
    let size = kern.out.bytes();
    let wg = k.shr(tid, 7u32);
    let warp = {
        let t = k.and(tid, 127u32).retype(Ty::U32);
        k.shr(t, 5u32)
    };
    let lane = k.and(tid, 31u32).retype(Ty::U32);
    let g = k.shr(lane, 2u32);
    let q = k.and(lane, 3u32).retype(Ty::U32);
    let row = k.mad(wg, WG_ROWS, m0);
    let row = k.mad(warp, 16u32, row);
    let row = k.add(row, g);
    let col0 = k.mad(q, 2u32, n0);
    // Columns left from this thread's first: compared against each block's 8j (+1).
    let left = k.sub(n.retype(Ty::S32), col0.retype(Ty::S32));
    let col64 = k.cvt(Ty::U64, col0);
    let bias = out.bias.map(|b| {
        let o = k.mul(col64, size);
        k.add(b, o)
    });
    for h in 0..2u32 {
        let r = if h == 0 { row } else { k.add(row, 8u32) };
        let row_ok = k.setp(Cmp::Lt, r, m);
        // Element (r, col0) of a row-major matrix at `base` with leading dimension `ld`.
        let at = |k: &mut Kernel, base: Reg, off: Reg, ld: Reg| {
            let o = k.mad_wide(r, ld, off);
            let o = k.add(o, col64);
            let o = k.mul(o, size);
            k.add(base, o)
        };
        let cptr = at(k, out.c, out.off_c, out.ldc);
        let rptr = out.residual.map(|p| at(k, p, out.off_r, out.ldr));
        let pptr = out.pre.map(|p| at(k, p, out.off_c, out.ldc));
        for j in 0..bn / 8 {
            let off = i64::from(8 * j * size);
            let oks: Vec<Reg> = (0..2)
                .map(|i| {
                    let c_ok = k.setp(Cmp::Gt, left, (8 * j + i) as i32);
                    k.and_pred(c_ok, row_ok)
                })
                .collect();
            let mut v: Vec<Reg> = (0..2)
                .map(|i| k.mul(acc[(4 * j + 2 * h + i) as usize], alpha))
                .collect();
            if let Some(b) = bias {
                let bv = load_pair(k, kern, Addr::at(b, off), &oks);
                for i in 0..2 {
                    v[i] = k.add(v[i], bv[i]);
                }
            }
            if let Some(p) = pptr {
                store_pair(k, kern, Addr::at(p, off), &v, &oks);
            }
            for x in v.iter_mut() {
                *x = activation(k, e.act, *x);
            }
            if let Some(rp) = rptr {
                let rv = load_pair(k, kern, Addr::at(rp, off), &oks);
                for i in 0..2 {
                    v[i] = match e.act_grad {
                        Activation::None => k.add(v[i], rv[i]),
                        act => activation_grad(k, act, rv[i], v[i]),
                    };
                }
            }
            store_pair(k, kern, Addr::at(cptr, off), &v, &oks);
        }
    }
}

/// Two adjacent elements of a buffer stored like the output, as f32 (0 where not ok).
fn load_pair(k: &mut Kernel, kern: &MatmulKernel, at: Addr, oks: &[Reg]) -> [Reg; 2] {
    match kern.out {
        Storage::F32 => [0, 1].map(|i| {
            k.ld_if(
                oks[i],
                Space::Global,
                Ty::F32,
                at.plus(4 * i as i64),
                0.0f32,
            )
        }),
        s => [0, 1].map(|i| {
            let h = k.ld_if(oks[i], Space::Global, Ty::B16, at.plus(2 * i as i64), 0u32);
            half_to_f32(k, s, h)
        }),
    }
}

/// A 16-bit float (bits in a b16 register) as f32.
fn half_to_f32(k: &mut Kernel, s: Storage, h: Reg) -> Reg {
    match s {
        Storage::F16 => k.widen(h.retype(Ty::F16)),
        _ => {
            // bf16 is the high half of an f32.
            let zero = k.mov(Ty::B16, 0u32);
            let w = k.pack_halves(zero, h);
            k.bits_to_f32(w)
        }
    }
}

/// Stores two adjacent f32 values rounded to the output storage: one vector store where
/// the row allows it, else one predicated store each.
fn store_pair(k: &mut Kernel, kern: &MatmulKernel, at: Addr, v: &[Reg], oks: &[Reg]) {
    match (kern.out, kern.vec_c) {
        (Storage::F32, true) => k.st_v(Space::Global, at, v, Some(oks[0])),
        (Storage::F32, false) => {
            for i in 0..2 {
                k.st_if(oks[i], Space::Global, at.plus(4 * i as i64), v[i]);
            }
        }
        (s, true) => {
            let ty = if s == Storage::F16 {
                Ty::F16x2
            } else {
                Ty::BF16x2
            };
            let packed = k.cvt_pack(ty, v[1], v[0]);
            k.st_if(oks[0], Space::Global, at, packed.retype(Ty::B32));
        }
        (s, false) => {
            let ty = if s == Storage::F16 { Ty::F16 } else { Ty::BF16 };
            for i in 0..2 {
                let h = k.cvt(ty, v[i]);
                k.st_if(oks[i], Space::Global, at.plus(2 * i as i64), h);
            }
        }
    }
}

/// `act(x)`: ReLU propagating NaN; GELU (tanh form) as x / (1 + exp(−2z)), without the
/// cancellation of 1 + tanh(z) for x < 0.
fn activation(k: &mut Kernel, act: Activation, x: Reg) -> Reg {
    match act {
        Activation::None => x,
        Activation::Relu => k.max_nan(x, 0.0f32),
        Activation::GeluTanh => {
            let x2 = k.mul(x, x);
            let inner = k.fma(x2, 0.044_715f32, 1.0f32);
            let z = k.mul(x, inner);
            // exp(−2·√(2/π)·z) = 2^(z·(−2·√(2/π)·log2 e))
            let t = k.mul(z, -2.0 * 0.797_884_6 * std::f32::consts::LOG2_E);
            let ex = k.ex2(t);
            let den = k.add(ex, 1.0f32);
            k.div(x, den)
        }
    }
}

/// `act'(x) · dy`. GELU: with p = sigmoid(2z), gelu' = p + 2x·p·(1 − p)·√(2/π)·(1 +
/// 3·0.044715x²); past |x| > 10 the limit (0 or 1), where the formula would overflow.
fn activation_grad(k: &mut Kernel, act: Activation, x: Reg, dy: Reg) -> Reg {
    match act {
        Activation::None => dy,
        Activation::Relu => {
            let pos = k.setp(Cmp::Gt, x, 0.0f32);
            k.selp(pos, dy, 0.0f32, Ty::F32)
        }
        Activation::GeluTanh => {
            let k0 = 0.797_884_6f32;
            let x2 = k.mul(x, x);
            let inner = k.fma(x2, 0.044_715f32, 1.0f32);
            let z = k.mul(x, inner);
            let t = k.mul(z, -2.0 * k0 * std::f32::consts::LOG2_E);
            let ex = k.ex2(t);
            let den = k.add(ex, 1.0f32);
            let p = k.rcp_exact(den);
            let q = k.mul(ex, p);
            let slope = k.fma(x2, 3.0 * 0.044_715f32, 1.0f32);
            let slope = k.mul(slope, k0);
            let pq = k.mul(p, q);
            let x2p = k.mul(x, 2.0f32);
            let tt = k.mul(x2p, pq);
            let d = k.fma(tt, slope, p);
            let ax = k.abs(x);
            let far = k.setp(Cmp::Gt, ax, 10.0f32);
            let pos = k.setp(Cmp::Gt, x, 0.0f32);
            let limit = k.selp(pos, 1.0f32, 0.0f32, Ty::F32);
            let d = k.selp(far, limit, d, Ty::F32);
            k.mul(dy, d)
        }
    }
}

impl MatmulKernel {
    /// Emits the native kernel (PTX) of a `Native` variant for `target`.
    pub fn build_native(&self, target: Target) -> Result<Module, KernelError> {
        let crate::matmul::Variant::Native(t) = self.variant else {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: "not a native variant".into(),
            });
        };
        build(self, t, target).map_err(|e| KernelError::Arguments {
            kernel: self.name(),
            detail: e.to_string(),
        })
    }

    /// Grid, block and arguments of a native kernel's launch over `shape`.
    pub fn native_launch(
        &self,
        shape: &MatmulShape,
        addr: &MatmulAddresses,
        alpha: f32,
    ) -> Result<NativeLaunch, KernelError> {
        let bad = |detail: String| KernelError::Arguments {
            kernel: self.name(),
            detail,
        };
        let crate::matmul::Variant::Native(t) = self.variant else {
            return Err(bad("not a native variant".into()));
        };
        let al = Alignment::of(shape, self.trans_a, self.trans_b, 8);
        if (self.vec_a && !al.a) || (self.vec_b && !al.b) || (self.vec_c && !al.c) {
            return Err(bad(format!(
                "built for 16-byte rows the shape does not have: {shape:?}"
            )));
        }
        let e = &self.epilogue;
        if e.bias != addr.bias.is_some()
            || e.residual != addr.residual.is_some()
            || e.store_pre != addr.pre.is_some()
            || addr.rows.is_some()
            || addr.sums.is_some()
        {
            return Err(bad(
                "bias/residual/pre buffers do not match the epilogue".into()
            ));
        }
        if shape.inner == 0 || shape.batch % shape.inner != 0 {
            return Err(bad(format!(
                "inner batch count {} does not divide the batch {}",
                shape.inner, shape.batch
            )));
        }
        let gx = shape.n.div_ceil(u32::from(t.bn));
        let gy = shape.m.div_ceil(u32::from(t.bm));
        if gy > 65535 || shape.batch > 65535 {
            return Err(KernelError::TooLarge {
                what: "matmul grid",
                size: u64::from(gx) * u64::from(gy) * u64::from(shape.batch),
            });
        }
        let mut args = Args::new();
        args.extend([
            Arg::Address(addr.a),
            Arg::Address(addr.b),
            Arg::Address(addr.c),
        ]);
        args.extend(addr.bias.map(Arg::Address));
        args.extend(addr.residual.map(Arg::Address));
        args.extend(addr.pre.map(Arg::Address));
        for v in [
            shape.m,
            shape.n,
            shape.k,
            shape.lda,
            shape.ldb,
            shape.ldc,
            shape.ldr,
            shape.stride_a,
            shape.stride_b,
            shape.stride_c,
            shape.stride_r,
            shape.inner,
            shape.inner_a,
            shape.inner_b,
            shape.inner_c,
            shape.inner_r,
        ] {
            args.push(Arg::U32(v));
        }
        args.push(Arg::F32(alpha));
        Ok(NativeLaunch {
            grid: [gx, gy, shape.batch],
            block: [2 * u32::from(t.bm), 1, 1],
            args,
        })
    }
}
