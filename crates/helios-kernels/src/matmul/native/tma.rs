//! The producer when the copy engine fills the stages: one warp builds the block's two
//! tensor maps, then one thread issues a `cp.async.bulk.tensor` per operand box and stage,
//! completing on the stage's mbarrier. The copies write the swizzled layouts `Stage`
//! describes, and zeros past the matrices' edges.
//! The maps go to this SM's slot of the workspace (`crate::native_maps`).

use helios_ptx::{Addr, Cmp, Kernel, Reg, Swizzle, TensorMap2d, Ty};

use super::stage::Stage;
use super::Block;

/// The tensor map of an operand's stage: K-major operands as (k, rows) with one box of
/// `bk × rows`, M/N-major ones as (rows, k) with boxes of 64 rows × `bk`, one per 128-byte
/// swizzle atom column.
fn map_of(k: &mut Kernel, stage: Stage, base: Reg, ld: Reg, rows: Reg, depth: Reg) -> TensorMap2d {
    let row_bytes = k.mul_wide(ld, 2u32);
    if stage.k_major {
        TensorMap2d {
            base,
            dims: [depth, rows],
            row_bytes,
            box_dims: [stage.bk, stage.rows],
            swizzle: stage.desc().swizzle,
        }
    } else {
        TensorMap2d {
            base,
            dims: [rows, depth],
            row_bytes,
            box_dims: [64, stage.bk],
            swizzle: Swizzle::B128,
        }
    }
}

/// Issues the copies of one operand's k tile `k0` into its stage at shared `dst`, rows from
/// `r0`.
fn load(k: &mut Kernel, stage: Stage, map: Reg, dst: Reg, r0: Reg, k0: Reg, bar: Addr) {
    if stage.k_major {
        k.tensor_load_2d(Addr::new(dst), map, [k0, r0], bar);
    } else {
        let lbo = stage.desc().lbo;
        for j in 0..stage.rows / 64 {
            let r = k.add(r0, 64 * j);
            k.tensor_load_2d(Addr::at(dst, i64::from(j * lbo)), map, [r, k0], bar);
        }
    }
}

/// The producer warpgroup's part (after `setmaxnreg`): `bars` are the stages' full
/// mbarriers, `maps_smem` 256 bytes where the maps are built, `maps_global` the workspace.
pub(super) fn producer(k: &mut Kernel, blk: &Block, bars: Reg, maps_smem: Reg, maps_global: Reg) {
    k.comment("producer: one warp builds the tensor maps, one thread issues the copies");
    let ptid = k.sub(blk.tid, blk.consumers);
    let spare = k.setp(Cmp::Ge, ptid, 32u32);
    let done = k.label();
    k.bra_if(spare, false, done);

    let map_a = map_of(k, blk.a_stage, blk.a, blk.lda, blk.m, blk.k).into();
    let map_b = map_of(k, blk.b_stage, blk.b, blk.ldb, blk.n, blk.k).into();
    let [ga, gb] = crate::native_maps::publish(k, ptid, maps_smem, maps_global, [&map_a, &map_b]);
    let lane0 = k.setp(Cmp::Eq, ptid, 0u32);

    k.comment("producer loop: wait for an empty stage, announce its bytes, copy");
    let (stages, bk) = (blk.stages, blk.a_stage.bk);
    let empty_count = blk.consumers + 32;
    // k steps issued so far over this block's tiles: they pick the stage.
    let step = k.mov(Ty::U32, 0u32);
    blk.for_each_piece(k, |k, p| {
        let (m0, n0) = (p.m0, p.n0);
        k.for_range(0u32, p.count, 1, |k, tile| {
            let slot = k.rem(step, stages);
            let reuse = k.setp(Cmp::Ge, step, stages);
            k.if_(reuse, |k| {
                let id = k.add(slot, 1u32);
                k.bar_sync_reg(id, empty_count);
            });
            k.if_(lane0, |k| {
                let bar = k.mad(slot, 8u32, bars);
                let bar = Addr::new(bar);
                k.mbarrier_arrive_expect_tx(bar, blk.stage_bytes());
                let dst = k.mad(slot, blk.stage_bytes(), blk.base);
                let k0 = k.add(p.first, tile);
                let k0 = k.mul(k0, bk);
                load(k, blk.a_stage, ga, dst, m0, k0, bar);
                let dst_b = k.add(dst, blk.a_stage.bytes());
                load(k, blk.b_stage, gb, dst_b, n0, k0, bar);
            });
            k.update("add", step, step, 1u32);
        });
    });
    k.place(done);
}
