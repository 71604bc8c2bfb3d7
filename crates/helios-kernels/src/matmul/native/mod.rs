//! Matrix multiply on NVIDIA's native path: PTX with Hopper's `wgmma`, launched through
//! VK_NVX_binary_import (`helios_vk::NativeKernel`).
//!
//! One block computes a `bm × bn` tile: `bm / 64` consumer warpgroups, each a 64 × `bn` strip
//! of f32 accumulators, and one producer warpgroup. The driver gives these launches 48 KiB of
//! shared memory and one such block per SM (`../shared/NVX.md`), so the stages are the whole
//! budget and no byte of it is left for mbarriers: the stages are handed over by named
//! barriers (`bar.arrive` / `bar.sync` counting the block).
//!
//! - The producer loads each k tile of both operands into registers with 16-byte loads
//!   (predicated: zeros past the matrix's edges), a few tiles ahead, and stores a tile into a
//!   stage once the consumers released it, in the swizzled layouts `wgmma` reads through
//!   descriptors (K-major or M/N-major as the operand is stored, so transposes cost nothing),
//!   then fences the async proxy and signals the stage full.
//! - The consumers run `wgmma` from the stage, keep one group in flight, and release the
//!   stage before it.
//! - The epilogue runs from the accumulators: scale, bias, activation (and its gradient), the
//!   pre-activation output, residual, rounding to the output storage.
//!
//! Measured designs and figures: `bench/results/2026-11-28-native-matmul-h200.md`.

use helios_ptx::{BuildError, Cmp, Kernel, MmaInput, Module, Reg, Special, Target, Ty, WgmmaA};

use crate::launch::{Arg, Args};
use crate::matmul::{
    Alignment, MatmulAddresses, MatmulKernel, MatmulShape, NativeTile, RowOp, Triangle,
};
use crate::storage::Storage;
use crate::KernelError;

/// Rows of a warpgroup's strip (the `wgmma` M).
const WG_ROWS: u32 = 64;
const WG_THREADS: u32 = 128;
/// Registers a thread may use at entry (`.maxnreg`): 384 threads × 168 fill the SM's 64 Ki
/// with one block per SM. Then `setmaxnreg` moves some from the consumers (128 accumulators
/// and their addressing fit 160) to the producer, whose register buffers hold the k tiles
/// in flight. The block's total cannot grow: 256·160 + 128·184 = 384·168 (asking for more
/// waits forever).
const MAX_REGS: u32 = 168;
const CONSUMER_REGS: u32 = 160;
const PRODUCER_REGS: u32 = 184;
/// Registers of the producer's budget its tile buffers may take.
const BUFFER_REGS: u32 = 150;

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

/// Whether a native kernel exists for `kern` with tile `t`, whatever the target: 16-bit inputs
/// whose rows start 16-byte aligned (the 16-byte loads), an epilogue without the
/// attention-only row ops, column sums or triangles, and stages that fit 48 KiB in a layout
/// the producer can fill.
fn buildable(kern: &MatmulKernel, t: NativeTile) -> bool {
    let e = &kern.epilogue;
    matches!(kern.input, Storage::F16 | Storage::BF16)
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

mod epilogue;
mod stage;

use epilogue::{epilogue, Out};
use stage::{loadable, Loader, Stage};

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
        k.comment("producer: k tiles loaded into registers ahead, stored as stages free");
        k.setmaxnreg(true, PRODUCER_REGS);
        let ptid = k.sub(tid, consumers);
        let bytes_a = k.shl(off_a, 1u32);
        let a = k.add(a, bytes_a);
        let bytes_b = k.shl(off_b, 1u32);
        let b = k.add(b, bytes_b);
        let la = Loader::new(&mut k, a_stage, a, lda, m0, m, ptid);
        let lb = Loader::new(&mut k, b_stage, b, ldb, n0, n, ptid);
        // Register buffers in rotation: tile t is stored while the next `prefetch` load, as
        // many as the producer's registers hold (up to three).
        let per_buffer = 4 * (la.count + lb.count);
        let prefetch = (BUFFER_REGS / per_buffer).clamp(2, 3) - 1;
        let bufs: Vec<_> = (0..=prefetch)
            .map(|_| (la.buffer(&mut k), lb.buffer(&mut k)))
            .collect();
        let load = |k: &mut Kernel, buf: &(Vec<[Reg; 4]>, Vec<[Reg; 4]>), tile: Reg| {
            let live = k.setp(Cmp::Lt, tile, tiles);
            k.if_(live, |k| {
                let k0 = k.mul(tile, bk);
                let kmax = k.sub(kk, k0);
                la.load(k, &buf.0, tile, kmax);
                lb.load(k, &buf.1, tile, kmax);
            });
        };
        for (p, buf) in bufs.iter().enumerate().take(prefetch as usize) {
            let tile = k.mov(Ty::U32, p as u32);
            load(&mut k, buf, tile);
        }
        k.for_range(0u32, tiles, prefetch + 1, |k, t0| {
            for (u, buf) in bufs.iter().enumerate() {
                let tile = k.add(t0, u as u32);
                let ahead = k.add(tile, prefetch);
                load(k, &bufs[(u + prefetch as usize) % bufs.len()], ahead);
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
                    la.store(k, &buf.0, sbase);
                    let bbase = k.add(sbase, a_stage.bytes());
                    lb.store(k, &buf.1, bbase);
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
    k.setmaxnreg(false, CONSUMER_REGS);

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
        args.extend(shape.launch_values().map(Arg::U32));
        args.push(Arg::F32(alpha));
        Ok(NativeLaunch {
            grid: [gx, gy, shape.batch],
            block: [2 * u32::from(t.bm) + WG_THREADS, 1, 1],
            args,
        })
    }
}
