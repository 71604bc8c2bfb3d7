//! Matrix multiply on NVIDIA's native path: PTX with Hopper's `wgmma`, launched through
//! VK_NVX_binary_import (`helios_vk::NativeKernel`).
//!
//! One block computes a `bm × bn` tile: consumer warpgroups, each one or two 64 × `bn` strips
//! of f32 accumulators, and one producer warpgroup. The driver gives these launches 48 KiB of
//! shared memory and one such block per SM (`../shared/NVX.md`), so the stages take almost
//! all of it.
//!
//! - The producer (`tma`): one warp builds the block's tensor maps, then one thread has the
//!   copy engine bring each k tile of both operands into a free stage
//!   (`cp.async.bulk.tensor`), in the swizzled layouts `wgmma` reads through descriptors
//!   (K-major or M/N-major as the operand is stored, so transposes cost nothing), with zeros
//!   past the matrices' edges. The copies complete on the stage's mbarrier.
//! - The consumers wait on that mbarrier, run `wgmma` from the stage and release it through
//!   a named barrier the producer waits on as soon as the products are done.
//! - The epilogue runs from the accumulators: scale, bias, activation (and its gradient), the
//!   pre-activation output, residual, rounding to the output storage.
//! - Where the device's SM count is known, the grid is one block per SM and each block walks
//!   its share of the output tiles: the maps are built once, and the producer fills the
//!   stages of the next tile while the consumers store the last.
//!
//! Measured designs and figures: `bench/results/2026-11-28-native-matmul-h200.md` (the
//! register producer this replaced), `bench/results/2026-11-29-native-tma-h200.md`.

use helios_ptx::{
    Addr, BuildError, Cmp, Kernel, MmaInput, Module, Reg, Special, Target, Ty, WgmmaA,
};

use crate::launch::{Arg, Args};
use crate::matmul::{
    Alignment, MatmulAddresses, MatmulKernel, MatmulShape, NativeTile, RowOp, Triangle,
};
use crate::storage::Storage;
use crate::KernelError;

/// Rows of a warpgroup's strip (the `wgmma` M).
const WG_ROWS: u32 = 64;
const WG_THREADS: u32 = 128;
/// The producer's registers after `setmaxnreg` (one thread issues copies): the fewest
/// allowed, the rest go to the consumers' accumulators.
const PRODUCER_REGS: u32 = 24;

/// What a launch of a native kernel needs besides the kernel: grid, block and the
/// arguments in parameter order (buffers as device addresses).
#[derive(Clone, Debug, PartialEq)]
pub struct NativeLaunch {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub args: Args,
}

/// Whether the native kernel of `t` can run `kern` on a device whose native target is
/// `target`: one with `wgmma` (Hopper's `sm_90a`), and a kernel that [`buildable`] allows.
pub(crate) fn feasible(kern: &MatmulKernel, t: NativeTile, target: Option<Target>) -> bool {
    target.is_some_and(|t| t.has_wgmma()) && buildable(kern, t)
}

/// Whether a native kernel exists for `kern` with tile `t`, whatever the target: a well-formed
/// tile (a hand-made one may not be), 16-bit inputs whose rows start 16-byte aligned (tensor
/// maps take 16-byte row strides), an epilogue without the attention-only row ops, column
/// sums or triangles, and stages that fit 48 KiB in a layout the copy engine can fill.
fn buildable(kern: &MatmulKernel, t: NativeTile) -> bool {
    let e = &kern.epilogue;
    crate::matmul::Variant::Native(t).well_formed()
        && matches!(kern.input, Storage::F16 | Storage::BF16)
        && kern.vec_a
        && kern.vec_b
        && kern.triangle == Triangle::Full
        && e.row() == RowOp::None
        && !e.col_sums()
        && t.shared_bytes() <= 48 * 1024
        && (!t.stream
            || u64::from(t.bm) * u64::from(t.bn) * 4 <= crate::native_maps::STREAM_SLOT_BYTES)
        && matches!(t.bk, 16 | 32)
        && loadable(u32::from(t.bm), !kern.trans_a)
        && loadable(u32::from(t.bn), kern.trans_b)
}

mod epilogue;
mod stage;
mod stream;
mod tma;

use epilogue::{epilogue, Out};
use stage::{loadable, Stage};
use stream::{Piece, Stream};

/// What the producer and the consumers of one block share: operands, sizes, the block's
/// tile and its stages.
struct Block {
    /// Byte addresses of this batch's A and B (u64).
    a: Reg,
    b: Reg,
    lda: Reg,
    ldb: Reg,
    m: Reg,
    n: Reg,
    k: Reg,
    /// Output tiles along N, and in all (u32).
    tiles_n: Reg,
    tiles_mn: Reg,
    /// The parameters M and `m_fastest` (nonzero: consecutive tiles walk M, else N; the
    /// launch's choice, `native_launch`). Read where a tile starts, so that no register
    /// holds them through the k loop (the 256 × 192 tile has none to spare).
    m_param: helios_ptx::Param,
    order: helios_ptx::Param,
    bm: u32,
    bn: u32,
    /// k tiles of this batch's part of the product, and the first of them.
    tiles: Reg,
    k_first: Reg,
    tid: Reg,
    /// Shared address of the first stage (u32).
    base: Reg,
    a_stage: Stage,
    b_stage: Stage,
    stages: u32,
    /// Consumer threads (the producer warpgroup follows them).
    consumers: u32,
    /// 64-row strips of each consumer warpgroup.
    strips: u32,
    /// Stream-K order (`stream`), or whole tiles.
    stream: Option<Stream>,
}

impl Block {
    const fn stage_bytes(&self) -> u32 {
        self.a_stage.bytes() + self.b_stage.bytes()
    }

    /// The first row and column (u32) of output tile `tile`, tiles numbered along N first
    /// or along M first (`m_fastest`).
    fn origin(&self, k: &mut Kernel, tile: Reg) -> (Reg, Reg) {
        let order = k.ld_param(self.order);
        let m_fastest = k.setp(Cmp::Ne, order, 0u32);
        let m = k.ld_param(self.m_param);
        let m = k.add(m, self.bm - 1);
        let tiles_m = k.div(m, self.bm);
        // Tiles along the dimension walked first.
        let fast = k.selp(m_fastest, tiles_m, self.tiles_n, Ty::U32);
        let slow = k.div(tile, fast);
        let near = k.rem(tile, fast);
        let row = k.selp(m_fastest, near, slow, Ty::U32);
        let col = k.selp(m_fastest, slow, near, Ty::U32);
        (k.mul(row, self.bm), k.mul(col, self.bn))
    }

    /// Runs `body` for each piece of work of this block: in stream-K order its share of
    /// the k steps (`Stream::for_each_piece`), else whole tiles `ctaid.x`, `ctaid.x +
    /// nctaid.x`, ..., so a grid of one block per SM walks all of them and a larger grid
    /// gives each block one.
    fn for_each_piece(&self, k: &mut Kernel, mut body: impl FnMut(&mut Kernel, Piece)) {
        if let Some(s) = &self.stream {
            s.for_each_piece(k, |k, t| self.origin(k, t), body);
            return;
        }
        let tile = k.special(Special::CtaIdX);
        let step = k.special(Special::NCtaIdX);
        let (top, done) = (k.label(), k.label());
        k.place(top);
        let over = k.setp(Cmp::Ge, tile, self.tiles_mn);
        k.bra_if(over, false, done);
        let (m0, n0) = self.origin(k, tile);
        body(
            k,
            Piece {
                m0,
                n0,
                tile,
                first: self.k_first,
                count: self.tiles,
            },
        );
        k.update("add", tile, tile, step);
        k.bra(top);
        k.place(done);
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
    // Consumer warpgroups (`t.strips()` 64-row strips each), then one producer warpgroup.
    let consumers = u32::from(t.wgs) * WG_THREADS;
    let threads = consumers + WG_THREADS;
    k.threads(threads);
    let regs = Registers::of(threads);
    k.max_registers(regs.entry);
    let e = kern.epilogue;

    // Parameters, in `native_launch` order.
    let pa = k.param("a", Ty::U64);
    let pb = k.param("b", Ty::U64);
    let pc = k.param("c", Ty::U64);
    let pbias = e.bias().then(|| k.param("bias", Ty::U64));
    let pres = e.residual().then(|| k.param("residual", Ty::U64));
    let ppre = e.store_pre().then(|| k.param("pre", Ty::U64));
    let names = [
        "m", "n", "k", "lda", "ldb", "ldc", "ldr", "stride_a", "stride_b", "stride_c", "stride_r",
        "inner", "inner_a", "inner_b", "inner_c", "inner_r", "k_parts",
    ];
    let sizes: Vec<_> = names.iter().map(|n| k.param(n, Ty::U32)).collect();
    let porder = k.param("m_fastest", Ty::U32);
    let palpha = k.param("alpha", Ty::F32);
    let pmaps = k.param("maps", Ty::U64);

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
    // 1 KiB alignment: the 128-byte swizzle is a function of the address.
    let smem = k.shared("stages", 1024, stages * (a_stage.bytes() + b_stage.bytes()));
    // Then the maps being built and the mbarriers: no padding between the three.
    let maps = k.shared("map_build", 128, 2 * helios_ptx::TENSOR_MAP_BYTES);
    let full = k.shared("full", 8, 8 * stages);

    k.comment("block coordinates and batch offsets");
    let a = k.ld_param_global(pa);
    let b = k.ld_param_global(pb);
    let c = k.ld_param_global(pc);
    let v: Vec<Reg> = sizes.iter().map(|&p| k.ld_param(p)).collect();
    let [m, n, kk, lda, ldb, ldc, ldr, sa, sb, sc, sr, inner, ia, ib, ic, ir, parts] =
        <[Reg; 17]>::try_from(v).expect("17 sizes");
    let alpha = k.ld_param(palpha);
    let tid = k.special(Special::TidX);
    let bz = k.special(Special::CtaIdZ);
    let outer = k.div(bz, inner);
    let inr = k.rem(bz, inner);
    // Element offsets of this batch's matrices (u64: a batch may pass 2^32 elements).
    // Stream-K launches one matrix (`native_launch`): its offsets are constants, which
    // frees the registers a 256 × 192 tile's epilogue would otherwise keep through the loop.
    let offset = |k: &mut Kernel, stride: Reg, inner_stride: Reg| {
        if t.stream {
            return k.mov(Ty::U64, 0u32);
        }
        let o = k.mul_wide(outer, stride);
        k.mad_wide(inr, inner_stride, o)
    };
    let off_a = offset(&mut k, sa, ia);
    let off_b = offset(&mut k, sb, ib);
    let off_c = offset(&mut k, sc, ic);
    let off_r = offset(&mut k, sr, ir);
    let byte_address = |k: &mut Kernel, p: Reg, off: Reg| {
        let bytes = k.shl(off, 1u32);
        k.add(p, bytes)
    };
    let ceil_div = |k: &mut Kernel, x: Reg, d: u32| {
        let t = k.add(x, d - 1);
        k.div(t, d)
    };
    let tiles_n = ceil_div(&mut k, n, bn);
    // This batch's part of the k tiles: [part · T / parts, (part + 1) · T / parts).
    let (k_first, k_tiles) = {
        let all = ceil_div(&mut k, kk, bk);
        let part = k.rem(bz, parts);
        let bound = |k: &mut Kernel, p: Reg| {
            let x = k.mul_wide(p, all);
            let parts = k.cvt(Ty::U64, parts);
            let x = k.div(x, parts);
            k.cvt(Ty::U32, x)
        };
        let first = bound(&mut k, part);
        let next = k.add(part, 1u32);
        let last = bound(&mut k, next);
        (first, k.sub(last, first))
    };
    let blk = Block {
        a: byte_address(&mut k, a, off_a),
        b: byte_address(&mut k, b, off_b),
        lda,
        ldb,
        m,
        n,
        k: kk,
        tiles_n,
        tiles_mn: {
            let tiles_m = ceil_div(&mut k, m, bm);
            k.mul(tiles_n, tiles_m)
        },
        m_param: sizes[0],
        order: porder,
        bm,
        bn,
        tiles: k_tiles,
        k_first,
        tid,
        base: k.shared_address(smem),
        a_stage,
        b_stage,
        stages,
        consumers,
        strips: t.strips(),
        stream: None,
    };
    let maps_global = k.ld_param_global(pmaps);
    let blk = Block {
        stream: t
            .stream
            .then(|| Stream::new(&mut k, blk.tiles_mn, blk.tiles, pmaps)),
        ..blk
    };

    // Stage s is handed over full by its mbarrier, completed by the copy engine's
    // transactions, and back empty by named barrier 1 + s (the consumers arrive, the
    // producer's warp waits).
    let bars = k.shared_address(full);
    let maps_smem = k.shared_address(maps);
    let first = k.setp(Cmp::Eq, tid, consumers);
    k.if_(first, |k| {
        for s in 0..stages {
            k.mbarrier_init(Addr::at(bars, i64::from(8 * s)), 1);
        }
        k.fence_mbarrier_init();
    });
    k.bar_sync(0);
    let is_producer = k.setp(Cmp::Ge, tid, consumers);
    let consume_label = k.label();
    k.bra_if(is_producer, true, consume_label);
    k.setmaxnreg(false, regs.producer);
    tma::producer(&mut k, &blk, bars, maps_smem, maps_global);
    k.ret();
    k.place(consume_label);
    k.setmaxnreg(true, regs.consumer);
    let out = Out {
        alpha,
        m,
        n,
        bn,
        tid,
        c,
        off_c,
        ldc,
        bias: pbias.map(|p| k.ld_param_global(p)),
        residual: pres.map(|p| k.ld_param_global(p)),
        off_r,
        ldr,
        pre: ppre.map(|p| k.ld_param_global(p)),
    };
    // A strip's accumulators after another's.
    let acc = k.regs(Ty::F32, (t.strips() * bn / 2) as usize);
    // k steps consumed so far, over all this block's tiles: they pick the stage and its
    // mbarrier's phase.
    let step = k.mov(Ty::U32, 0u32);
    blk.for_each_piece(&mut k, |k, p| {
        consume(k, kern, &blk, bars, &acc, step, p);
        let store = |k: &mut Kernel| {
            k.comment("epilogue from the accumulators");
            // Warpgroup w's strip j holds rows 64 (w · strips + j) of the tile: the
            // epilogue puts warpgroup w at 64 w, so each strip starts 64 (w (strips - 1) +
            // j) further.
            if t.strips() == 1 {
                epilogue(k, kern, &acc, &out, (p.m0, p.n0));
            } else {
                let wg = k.shr(tid, 7u32);
                let skip = k.mul(wg, WG_ROWS * (t.strips() - 1));
                let m_wg = k.add(p.m0, skip);
                for (j, acc) in acc.chunks((bn / 2) as usize).enumerate() {
                    let m_strip = k.add(m_wg, WG_ROWS * j as u32);
                    epilogue(k, kern, acc, &out, (m_strip, p.n0));
                }
            }
        };
        match &blk.stream {
            // The named barriers after the stages' are free for the consumers alone.
            Some(s) => s.finish(k, p, &acc, tid, consumers, stages + 1, store),
            None => store(k),
        }
    });
    k.finish()
}

/// Register budgets: at entry (`.maxnreg`: the block's threads share the SM's 64 Ki, one
/// block per SM, which ptxas also holds the consumers' code to), then per role after
/// `setmaxnreg`. A block's total cannot grow (asking for more waits forever), so what the
/// producer gives the consumers take.
struct Registers {
    entry: u32,
    consumer: u32,
    producer: u32,
}

impl Registers {
    fn of(threads: u32) -> Registers {
        let entry = (65536 / threads).min(255) / 8 * 8;
        let consumers = threads - WG_THREADS;
        let consumer =
            ((entry * threads - PRODUCER_REGS * WG_THREADS) / consumers / 8 * 8).min(256);
        Registers {
            entry,
            consumer,
            producer: PRODUCER_REGS,
        }
    }
}

/// The consumers' main loop over one output tile: wait for a full stage (the mbarriers at
/// shared `bars`, 8 bytes a stage), multiply it with `wgmma` and release it once the
/// products are done. `step` counts the k steps of earlier tiles and advances past this
/// one's.
fn consume(
    k: &mut Kernel,
    kern: &MatmulKernel,
    blk: &Block,
    bars: Reg,
    acc: &[Reg],
    step: Reg,
    p: Piece,
) {
    let (a_stage, b_stage, stages) = (blk.a_stage, blk.b_stage, blk.stages);
    let input = match kern.input {
        Storage::F16 => MmaInput::F16,
        _ => MmaInput::BF16,
    };
    // The empty barriers count the consumers and the producer's one warp.
    let empty_count = blk.consumers + 32;
    let release = |k: &mut Kernel, step: Reg| {
        let slot = k.rem(step, stages);
        let id = k.add(slot, 1u32);
        k.bar_arrive_reg(id, empty_count);
    };
    k.comment("consumers: accumulators and descriptors");
    for &r in acc {
        k.assign(r, 0.0f32);
    }
    let wg = k.shr(blk.tid, 7u32);
    let desc_a0 = k.wgmma_desc(blk.base, &a_stage.desc());
    let desc_b0 = {
        let d = k.wgmma_desc(blk.base, &b_stage.desc());
        k.desc_offset(d, a_stage.bytes())
    };
    // This warpgroup's first 64 rows of A; its other strips follow.
    let strips = blk.strips;
    let wg_a = k.mul(wg, (strips * a_stage.wg_offset()) >> 4);
    let wg_a = k.cvt(Ty::U64, wg_a);
    let desc_a0 = k.add(desc_a0, wg_a);
    let zero = k.mov(Ty::U32, 0u32);
    let scale_d = k.setp(Cmp::Eq, zero, 0u32);

    k.comment("main loop: wait for a full stage, multiply, release it");
    k.for_range(0u32, p.count, 1, |k, _| {
        let slot = k.rem(step, stages);
        // The stage's mbarrier completes a phase per round of the stages.
        let round = k.div(step, stages);
        let parity = k.and(round, 1u32);
        let bar = k.mad(slot, 8u32, bars);
        k.mbarrier_wait(Addr::new(bar), parity);
        let units = k.mul(slot, blk.stage_bytes() >> 4);
        let units = k.cvt(Ty::U64, units);
        let da = k.add(desc_a0, units);
        let db = k.add(desc_b0, units);
        k.wgmma_fence();
        for s in 0..a_stage.bk / 16 {
            let das: Vec<Reg> = (0..strips)
                .map(|j| k.desc_offset(da, a_stage.k_step(s) + j * a_stage.wg_offset()))
                .collect();
            let dbs = k.desc_offset(db, b_stage.k_step(s));
            for (&das, acc) in das.iter().zip(acc.chunks((blk.bn / 2) as usize)) {
                k.wgmma(
                    input,
                    acc,
                    WgmmaA::Shared {
                        desc: das,
                        transpose: !a_stage.k_major,
                    },
                    dbs,
                    !b_stage.k_major,
                    scale_d,
                );
            }
        }
        k.wgmma_commit();
        // Back to the producer as soon as its product is done: the copies, not the
        // products, bound these kernels, so a stage is worth more in flight than a second
        // group of products is (bench/results/2026-11-29-native-release-h200.md).
        k.wgmma_wait(0);
        release(k, step);
        k.update("add", step, step, 1u32);
    });
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
        // A target without wgmma is refused by the builder, naming the instruction.
        if !buildable(self, t) {
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
    ///
    /// `sms`, the device's SM count where known, bounds the grid to one resident block per
    /// SM, each walking its share of the output tiles (the producer then fills the stages of
    /// a block's next tile while its consumers store the last); without it every tile gets
    /// a block.
    pub fn native_launch(
        &self,
        shape: &MatmulShape,
        addr: &MatmulAddresses,
        alpha: f32,
        sms: Option<u32>,
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
        // The copy engine reads from 16-byte aligned global addresses only.
        if addr.a % 16 != 0 || addr.b % 16 != 0 {
            return Err(bad(format!(
                "operands at {:#x} and {:#x}: native kernels need 16-byte aligned ones",
                addr.a, addr.b
            )));
        }
        let e = &self.epilogue;
        if e.bias() != addr.bias.is_some()
            || e.residual() != addr.residual.is_some()
            || e.store_pre() != addr.pre.is_some()
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
        args.extend(shape.launch_values().map(Arg::U32));
        args.push(Arg::U32(shape.k_parts.max(1)));
        // Consecutive tiles share an operand block the L2 keeps; the other operand is read
        // once per tile row (or column). Walking M first rereads A (m × k) instead of B (k ×
        // n): the smaller one where n > m (the lm head's 50304 columns: its weights, 77 MB,
        // outgrow the L2 and were read from memory once per 256 rows).
        args.push(Arg::U32(u32::from(shape.n > shape.m)));
        args.push(Arg::F32(alpha));
        let maps = addr
            .maps
            .ok_or_else(|| bad("native kernels need a tensor-map workspace".into()))?;
        args.push(Arg::Address(maps));
        let tiles = gx * gy;
        let blocks = match (t.stream, sms) {
            // Stream-K: one block per SM (at most one per k step), each with its flag and
            // slot in the workspace.
            (true, Some(sms)) if shape.batch <= 1 && shape.k_parts <= 1 && shape.k > 0 => {
                let steps = u64::from(tiles) * u64::from(shape.k.div_ceil(u32::from(t.bk)));
                u32::try_from(steps).map_err(|_| KernelError::TooLarge {
                    what: "stream-K k steps",
                    size: steps,
                })?;
                // The kernel's block arithmetic needs steps · blocks < 2^32 (`Stream`); steps
                // fit 32 bits (above), so at least one block does.
                let most = (u64::from(u32::MAX) / steps.max(1)) as u32;
                sms.min(crate::native_maps::MAP_SLOTS)
                    .min(steps as u32)
                    .min(most)
                    .max(1)
            }
            (true, _) => {
                return Err(bad(format!(
                    "stream-K runs one matrix with k > 0 on a device of known SM count: \
                     {shape:?}, SMs {sms:?}"
                )))
            }
            (false, Some(sms)) => (sms / shape.batch.max(1)).clamp(1, tiles),
            (false, None) => tiles,
        };
        Ok(NativeLaunch {
            grid: [blocks, 1, shape.batch],
            block: [self.variant.threads(0), 1, 1],
            args,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::{Epilogue, Variant};

    fn kernel() -> MatmulKernel {
        MatmulKernel {
            variant: Variant::parse("nv128x192k16s4").expect("a native tile"),
            input: Storage::BF16,
            out: Storage::BF16,
            trans_a: false,
            trans_b: true,
            vec_a: true,
            vec_b: true,
            vec_c: true,
            epilogue: Epilogue::NONE,
            triangle: Triangle::Full,
            subgroup: 0,
            exact_k: false,
        }
    }

    fn addresses(a: u64, maps: Option<u64>) -> MatmulAddresses {
        MatmulAddresses {
            a,
            b: 0x2000,
            c: 0x3000,
            bias: None,
            residual: None,
            rows: None,
            pre: None,
            sums: None,
            maps,
        }
    }

    /// With the SM count, one block per SM (per batch) walks the tiles; without it, or with
    /// fewer tiles than SMs, every tile gets a block.
    #[test]
    fn the_grid_is_a_block_per_sm_where_the_count_is_known() {
        let k = kernel();
        let addr = addresses(0x1000, Some(0x4000));
        let grid = |batch, m, n, sms| {
            let s = MatmulShape::packed(batch, m, n, 768, false, true);
            k.native_launch(&s, &addr, 1.0, sms).expect("a launch").grid
        };
        // 4096 × 4096 in 128 × 192 tiles: 32 × 22 = 704.
        assert_eq!(grid(1, 4096, 4096, Some(132)), [132, 1, 1]);
        assert_eq!(grid(1, 4096, 4096, None), [704, 1, 1]);
        assert_eq!(grid(3, 4096, 4096, Some(132)), [44, 1, 3]);
        assert_eq!(grid(1, 256, 384, Some(132)), [4, 1, 1]);
        assert_eq!(grid(200, 128, 192, Some(132)), [1, 1, 200]);
    }

    /// Stream-K keeps k steps × blocks under 2^32, so that the kernel's block arithmetic
    /// divides in 32 bits: a product of ~33 million k steps gets fewer blocks than SMs.
    #[test]
    fn stream_k_grids_keep_their_arithmetic_in_32_bits() {
        let k = MatmulKernel {
            variant: Variant::parse("nv128x192k16s4sk").expect("a native tile"),
            ..kernel()
        };
        let addr = addresses(0x1000, Some(0x4000));
        let grid = |m, n, kk| {
            let s = MatmulShape::packed(1, m, n, kk, false, true);
            k.native_launch(&s, &addr, 1.0, Some(132))
                .expect("a launch")
                .grid
        };
        assert_eq!(grid(768, 768, 4096), [132, 1, 1]);
        // 400 × 400 tiles of 204 k steps (every matrix under 2^32 elements): 32.6 million
        // steps, 131 blocks.
        let steps = 400u64 * 400 * 204;
        assert_eq!(grid(128 * 400, 192 * 400, 16 * 204), [131, 1, 1]);
        assert!(steps * 131 <= u64::from(u32::MAX) && steps * 132 > u64::from(u32::MAX));
    }

    /// A hand-made tile the generator cannot build (no consumer warpgroup, more
    /// accumulators than registers) is an error, not a panic.
    #[test]
    fn ill_formed_tiles_are_refused() {
        for wgs in [0, 1] {
            let k = MatmulKernel {
                variant: Variant::Native(crate::matmul::NativeTile {
                    bm: 128,
                    bn: 256,
                    bk: 16,
                    stages: 3,
                    wgs,
                    stream: false,
                }),
                ..kernel()
            };
            assert!(!k.native_feasible(Some(Target::SM90A)));
            let err = k.build_native(Target::SM90A).unwrap_err().to_string();
            assert!(err.contains("no native kernel"), "{err}");
        }
    }

    /// The tensor maps' workspace and 16-byte aligned operands are required, and a missing
    /// one is an error that names it, not a launch.
    #[test]
    fn launches_need_the_maps_and_aligned_operands() {
        let k = kernel();
        let s = MatmulShape::packed(1, 256, 384, 768, false, true);
        let err = k
            .native_launch(&s, &addresses(0x1000, None), 1.0, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("tensor-map workspace"), "{err}");
        let err = k
            .native_launch(&s, &addresses(0x1008, Some(0x4000)), 1.0, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("16-byte aligned"), "{err}");
    }
}
