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
/// Registers a thread may use (`.maxnreg`): 384 threads × 168 fill the SM's 64 Ki with
/// one block per SM, enough for a consumer's 128 accumulators and the producer's slab.
const MAX_REGS: u32 = 168;

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
        && matches!(t.bk, 16 | 32)
        && loadable(u32::from(t.bm), !kern.trans_a)
        && loadable(u32::from(t.bn), kern.trans_b)
}

/// The producer loads k in slabs of `SLAB` (a 128-byte line of each K-major row) and stores
/// each slab into `SLAB / bk` stages.
const SLAB: u32 = 64;

/// Byte layout of one operand's stage (`rows` × `bk`) in shared memory.
///
/// - K-major (A not transposed, B transposed): rows of `bk` k (32 or 64 bytes) with the 32-
///   or 64-byte swizzle (16-byte chunks XORed with the row's bits above the atom's row
///   width), 8-row groups `8 · row bytes` apart (SBO). (The no-swizzle layout of 8 × 16-byte
///   core matrices ran wgmma at half speed.)
/// - M/N-major: the 128-byte swizzle, atoms of 64 rows (128 bytes) × 8 k whose 16-byte
///   chunks are XORed with the k row, so that a warp storing one k row's 512 bytes hits
///   every bank once; atoms along K 1 KiB apart (SBO), along M/N `bk / 8` KiB (LBO).
///
/// Either way a warpgroup's 64 rows of A start `bk · 128` bytes apart.
#[derive(Clone, Copy, Debug)]
struct Stage {
    /// Rows of the operand tile along M (A) or N (B).
    rows: u32,
    bk: u32,
    k_major: bool,
}

impl Stage {
    const fn bytes(self) -> u32 {
        self.rows * self.bk * 2
    }

    const fn row_bytes(self) -> u32 {
        self.bk * 2
    }

    fn desc(self) -> MatrixDesc {
        if self.k_major {
            MatrixDesc {
                swizzle: if self.bk == 16 {
                    Swizzle::B32
                } else {
                    Swizzle::B64
                },
                lbo: 16,
                sbo: 8 * self.row_bytes(),
            }
        } else {
            MatrixDesc {
                swizzle: Swizzle::B128,
                lbo: self.bk / 8 * 1024,
                sbo: 1024,
            }
        }
    }

    /// Where the k16 step `s` of the stage starts: 32 bytes along K-major rows, two 8-k
    /// atoms on in M/N-major ones.
    const fn k_step(self, s: u32) -> u32 {
        if self.k_major {
            32 * s
        } else {
            2048 * s
        }
    }

    /// Where a warpgroup's 64 rows start.
    const fn wg_offset(self) -> u32 {
        self.bk * 128
    }

    /// The row bits a K-major row's chunk index is XORed with: the swizzle's period is 128
    /// bytes of rows.
    const fn flip_shift(self) -> u32 {
        if self.bk == 16 {
            2
        } else {
            1
        }
    }
}

/// Whether an operand of `rows` rows stored this way has a stage layout and a load plan:
/// M/N-major rows come in whole swizzle atoms, and a k row's 16-byte chunks divide the
/// producer's threads.
const fn loadable(rows: u32, k_major: bool) -> bool {
    if k_major {
        rows % 16 == 0
    } else {
        rows == 128 || rows == 256
    }
}

/// One producer thread's share of an operand's slab: which 16-byte chunks it loads into
/// registers and where each goes in its stage. K-major: 8 threads a row (one 128-byte line
/// of 64 k), rows `t/8 + 16i`; M/N-major: `rows/8` threads a k row (contiguous along M/N),
/// k rows `t·8/rows + i·1024/rows`. A warp's load touches 4 lines either way.
struct Loader {
    stage: Stage,
    /// Chunks a thread loads per slab.
    count: u32,
    /// Address of this thread's first chunk in the first slab (u64), and the distance
    /// between its chunks (u64) and between slabs (u64).
    src: Reg,
    chunk_step: Reg,
    slab_step: Reg,
    /// Chunk `i` is a row of the matrix (along M/N) that exists (pred, per distinct row).
    row_ok: Vec<Reg>,
    /// K-major: k of this thread's chunks within the slab (u32); M/N-major: k row of the
    /// first chunk within the slab.
    k_first: Reg,
    /// Byte offset of chunk `i` in its stage (u32), per distinct offset.
    soff: Vec<Reg>,
    /// K-major: which k16 stage of the slab this thread's chunks go to (u32).
    sub: Option<Reg>,
}

impl Loader {
    #[allow(clippy::too_many_arguments)]
    fn new(
        k: &mut Kernel,
        stage: Stage,
        ptr: Reg,
        ld: Reg,
        r0: Reg,
        rows_total: Reg,
        t: Reg,
    ) -> Loader {
        let rows = stage.rows;
        let ld_bytes = k.mul_wide(ld, 2u32);
        if stage.k_major {
            // Row t/8 + 16i, k chunk t % 8 (of the slab's 8).
            let count = rows / 16;
            let per_row = stage.bk / 8;
            let row = k.shr(t, 3u32);
            let kc = k.and(t, 7u32).retype(Ty::U32);
            let k_first = k.mul(kc, 8u32);
            let grow = k.add(r0, row);
            let o = k.mul_wide(grow, ld);
            let kc64 = k.cvt(Ty::U64, k_first);
            let o = k.add(o, kc64);
            let o = k.shl(o, 1u32);
            let src = k.add(ptr, o);
            let chunk_step = k.mul(ld_bytes, 16u32);
            let slab_step = k.mov(Ty::U64, i64::from(SLAB * 2));
            let row_ok = (0..count)
                .map(|i| {
                    let r = k.add(grow, 16 * i);
                    k.setp(Cmp::Lt, r, rows_total)
                })
                .collect();
            // Row·row bytes + 16·((kc % per_row) ^ (row >> flip) % per_row): the swizzle;
            // chunk i is 16 rows on.
            let within = k.rem(kc, per_row);
            let flip = k.shr(row, stage.flip_shift());
            let flip = k.rem(flip, per_row);
            let c = k.xor(within, flip).retype(Ty::U32);
            let s0 = k.mul(row, stage.row_bytes());
            let s0 = k.mad(c, 16u32, s0);
            let sub = k.div(kc, per_row);
            Loader {
                stage,
                count,
                src,
                chunk_step,
                slab_step,
                row_ok,
                k_first,
                soff: vec![s0],
                sub: Some(sub),
            }
        } else {
            // k row t / (rows/8) + i·(128 / (rows/8)), chunk t % (rows/8) along M/N.
            let per_row = rows / 8;
            let rows_per_pass = WG_THREADS / per_row;
            let count = SLAB / rows_per_pass;
            let mc = k.rem(t, per_row);
            let kr = k.div(t, per_row);
            let col = k.mad(mc, 8u32, r0);
            let o = k.mul_wide(kr, ld);
            let c64 = k.cvt(Ty::U64, col);
            let o = k.add(o, c64);
            let o = k.shl(o, 1u32);
            let src = k.add(ptr, o);
            let chunk_step = k.mul(ld_bytes, rows_per_pass);
            let slab_step = k.mul(ld_bytes, SLAB);
            let ok = k.setp(Cmp::Lt, col, rows_total);
            // Chunk i's k row within its stage: (kr + i·rows_per_pass) % bk; its swizzled
            // offset: atom (mc / 8)·lbo + (k / 8)·1024 + (k % 8)·128 + ((mc % 8) ^ (k % 8))·16.
            let per_stage = stage.bk / rows_per_pass;
            let atom = k.shr(mc, 3u32);
            let a_off = k.mul(atom, stage.desc().lbo);
            let ch = k.and(mc, 7u32).retype(Ty::U32);
            let soff = (0..per_stage)
                .map(|i| {
                    let kk = k.add(kr, i * rows_per_pass);
                    let g = k.shr(kk, 3u32);
                    let r = k.and(kk, 7u32).retype(Ty::U32);
                    let x = k.xor(ch, r).retype(Ty::U32);
                    let o = k.mad(g, 1024u32, a_off);
                    let o = k.mad(r, 128u32, o);
                    k.mad(x, 16u32, o)
                })
                .collect();
            Loader {
                stage,
                count,
                src,
                chunk_step,
                slab_step,
                row_ok: vec![ok],
                k_first: kr,
                soff,
                sub: None,
            }
        }
    }

    /// Loads this thread's chunks of slab `slab` into registers (zeros where the chunk
    /// lies outside the matrix); `kmax` is K − 64·slab.
    fn load(&self, k: &mut Kernel, slab: Reg, kmax: Reg) -> Vec<[Reg; 4]> {
        let s64 = k.cvt(Ty::U64, slab);
        let off = k.mul(s64, self.slab_step);
        let mut at = k.add(self.src, off);
        let rows_per_pass = if self.stage.k_major {
            0
        } else {
            WG_THREADS / (self.stage.rows / 8)
        };
        (0..self.count)
            .map(|i| {
                let ok = if self.stage.k_major {
                    let k_ok = k.setp(Cmp::Lt, self.k_first, kmax);
                    k.and_pred(k_ok, self.row_ok[i as usize])
                } else {
                    let kk = k.add(self.k_first, i * rows_per_pass);
                    let k_ok = k.setp(Cmp::Lt, kk, kmax);
                    k.and_pred(k_ok, self.row_ok[0])
                };
                let regs = [0; 4].map(|_| k.mov(Ty::B32, 0u32));
                k.ld_v_if(ok, Space::Global, &regs, Addr::new(at));
                if i + 1 < self.count {
                    at = k.add(at, self.chunk_step);
                }
                regs
            })
            .collect()
    }

    /// Stores the chunks of `data` that belong to stage `sub` of the slab into the
    /// stage at shared address `sbase`.
    fn store(&self, k: &mut Kernel, data: &[[Reg; 4]], sub: u32, sbase: Reg) {
        if let Some(mine) = self.sub {
            // K-major: all of a thread's chunks belong to one stage (its k chunk / 2).
            let p = k.setp(Cmp::Eq, mine, sub);
            let at = k.add(sbase, self.soff[0]);
            for (i, regs) in data.iter().enumerate() {
                let step = 16 * self.stage.row_bytes() as usize;
                k.st_v(
                    Space::Shared,
                    Addr::at(at, (step * i) as i64),
                    regs,
                    Some(p),
                );
            }
        } else {
            let per_stage = self.soff.len();
            for (j, &soff) in self.soff.iter().enumerate() {
                let at = k.add(sbase, soff);
                k.st_v(
                    Space::Shared,
                    Addr::new(at),
                    &data[sub as usize * per_stage + j],
                    None,
                );
            }
        }
    }
}

/// Emits the PTX of `kern` with tile `t` for `target`.
pub(crate) fn build(
    kern: &MatmulKernel,
    t: NativeTile,
    target: Target,
) -> Result<Module, BuildError> {
    let name = kern.name();
    let mut k = Kernel::new(&name, target);
    let (bm, bn, bk, stages) = (
        u32::from(t.bm),
        u32::from(t.bn),
        u32::from(t.bk),
        u32::from(t.stages),
    );
    // Consumer warpgroups (64 rows each), then one producer warpgroup.
    let consumers = bm / WG_ROWS * WG_THREADS;
    k.threads(consumers + WG_THREADS);
    k.max_registers(MAX_REGS);
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
    // 1 KiB alignment: the 128-byte swizzle is a function of the address.
    let smem = k.shared("stages", 1024, stages * stage_bytes);

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

    let base = k.shared_address(smem);
    let tiles = {
        let t = k.add(kk, bk - 1);
        k.div(t, bk)
    };
    // Named barriers hand the stages over (no shared memory, which the stages fill): stage
    // s is `full` at barrier 1 + s (the producer arrives, the consumers wait) and `empty` at
    // 1 + stages + s (the other way round), each counting the whole block.
    let all = consumers + WG_THREADS;
    let full = |s: Reg, k: &mut Kernel| k.add(s, 1u32);
    let empty = |s: Reg, k: &mut Kernel| k.add(s, 1 + stages);

    let is_producer = k.setp(Cmp::Ge, tid, consumers);
    let consume = k.label();
    k.bra_if(is_producer, true, consume);
    {
        k.comment("producer: load a 64-k slab into registers, store it into 4 stages as they free");
        let ptid = k.sub(tid, consumers);
        let bytes_a = k.shl(off_a, 1u32);
        let a = k.add(a, bytes_a);
        let bytes_b = k.shl(off_b, 1u32);
        let b = k.add(b, bytes_b);
        let la = Loader::new(&mut k, a_stage, a, lda, m0, m, ptid);
        let lb = Loader::new(&mut k, b_stage, b, ldb, n0, n, ptid);
        let slabs = {
            let t = k.add(kk, SLAB - 1);
            k.div(t, SLAB)
        };
        k.for_range(0u32, slabs, 1, |k, slab| {
            let k0 = k.mul(slab, SLAB);
            let kmax = k.sub(kk, k0);
            let da = la.load(k, slab, kmax);
            let db = lb.load(k, slab, kmax);
            for sub in 0..SLAB / bk {
                let tile = k.mad(slab, SLAB / bk, sub);
                let live = k.setp(Cmp::Lt, tile, tiles);
                k.if_(live, |k| {
                    let slot = k.rem(tile, stages);
                    // From the second round on, wait until the consumers released the stage.
                    let reuse = k.setp(Cmp::Ge, tile, stages);
                    k.if_(reuse, |k| {
                        let id = empty(slot, k);
                        k.bar_sync_reg(id, all);
                    });
                    let sbase = k.mad(slot, stage_bytes, base);
                    la.store(k, &da, sub, sbase);
                    let bbase = k.add(sbase, a_stage.bytes());
                    lb.store(k, &db, sub, bbase);
                    // Ordinary stores, read next by wgmma through the async proxy.
                    k.fence_proxy_async();
                    let id = full(slot, k);
                    k.bar_arrive_reg(id, all);
                });
            }
        });
        k.ret();
    }
    k.place(consume);

    k.comment("consumers: accumulators and descriptors");
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
    // This warpgroup's 64 rows of A.
    let wg_a = k.mul(wg, a_stage.wg_offset() >> 4);
    let wg_a = k.cvt(Ty::U64, wg_a);
    let desc_a0 = k.add(desc_a0, wg_a);
    let zero = k.mov(Ty::U32, 0u32);
    let scale_d = k.setp(Cmp::Eq, zero, 0u32);

    k.comment("main loop: wait for a full stage, multiply, release the one before");
    k.for_range(0u32, tiles, 1, |k, tile| {
        let slot = k.rem(tile, stages);
        let id = full(slot, k);
        k.bar_sync_reg(id, all);
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
        // The previous tile's product is done: its stage goes back to the producer.
        k.wgmma_wait(1);
        let some = k.setp(Cmp::Gt, tile, 0u32);
        k.if_(some, |k| {
            let prev = k.add(tile, stages - 1);
            let prev = k.rem(prev, stages);
            let id = empty(prev, k);
            k.bar_arrive_reg(id, all);
        });
    });
    k.wgmma_wait(0);

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
    /// Whether this native kernel can run on a device whose native target is `target`
    /// (its part of `feasible`, without the device's shared-memory limits).
    pub fn native_feasible(&self, target: Option<Target>) -> bool {
        match self.variant {
            crate::matmul::Variant::Native(t) => feasible(self, t, target),
            _ => false,
        }
    }

    /// Emits the native kernel (PTX) of a `Native` variant for `target`.
    pub fn build_native(&self, target: Target) -> Result<Module, KernelError> {
        let crate::matmul::Variant::Native(t) = self.variant else {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: "not a native variant".into(),
            });
        };
        if !feasible(self, t, Some(Target::SM90A)) {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: "no native kernel for this tile, storage, layout and epilogue".into(),
            });
        }
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
            block: [2 * u32::from(t.bm) + WG_THREADS, 1, 1],
            args,
        })
    }
}
