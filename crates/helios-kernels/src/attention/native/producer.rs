//! The producer warp of the native forward: tensor maps built on the device, then the
//! copy engine filling the K and V rings.

use helios_ptx::{Addr, Cmp, Kernel, Reg, Swizzle, TensorMap, Ty};

use super::kernel::{Block, Params};
use super::PANEL;

/// The producer warp: builds K's and V's maps into its SM's slot, then walks the items and
/// brings each key block into the next free stage of each ring.
pub(super) fn producer(k: &mut Kernel, blk: &Block, p: &Params, maps_smem: Reg) {
    k.comment("producer: one warp builds the tensor maps, one thread issues the copies");
    let ptid = k.sub(blk.tid, blk.consumers);
    let spare = k.setp(Cmp::Ge, ptid, 32u32);
    let done = k.label();
    k.bra_if(spare, false, done);

    // [B, T, H, D] as (D, H, T, B): boxes of 64 channels × 1 head × bk keys × 1 batch row.
    let bytes = |k: &mut Kernel, s: Reg| k.mul_wide(s, 2u32);
    let [sb, st, sh] = p.strides;
    let strides = vec![bytes(k, sh), bytes(k, st), bytes(k, sb)];
    let d = k.mov(Ty::U32, blk.d);
    let batch = k.div(blk.bh, blk.heads);
    let map_of = |k: &mut Kernel, ptr: Reg, off: Reg| {
        let o = k.mul_wide(off, 2u32);
        TensorMap {
            base: k.add(ptr, o),
            dims: vec![d, blk.heads, blk.t, batch],
            strides: strides.clone(),
            box_dims: vec![PANEL, 1, blk.bk, 1],
            swizzle: Swizzle::B128,
        }
    };
    let map_k = map_of(k, p.k, p.offs[1]);
    let map_v = map_of(k, p.v, p.offs[2]);
    let [gk, gv] = crate::native_maps::publish(k, ptid, maps_smem, p.maps, [&map_k, &map_v]);
    let lane0 = k.setp(Cmp::Eq, ptid, 0u32);

    k.comment("producer loop: wait for a free stage, announce its bytes, copy");
    let empty_count = blk.consumers + 32;
    let step = k.mov(Ty::U32, 0u32);
    blk.for_each_item(k, |k, it| {
        k.for_range(0u32, it.blocks, 1, |k, j| {
            let slot = k.rem(step, blk.stages);
            let reuse = k.setp(Cmp::Ge, step, blk.stages);
            let key0 = k.mul(j, blk.bk);
            for (v, map, ring) in [(false, gk, blk.k_base), (true, gv, blk.v_base)] {
                k.if_(reuse, |k| {
                    let id = blk.empty_id(k, slot, v);
                    k.bar_sync_reg(id, empty_count);
                });
                k.if_(lane0, |k| {
                    let bar = blk.full_bar(k, slot, v);
                    k.mbarrier_arrive_expect_tx(bar, blk.stage_bytes());
                    let dst = k.mad(slot, blk.stage_bytes(), ring);
                    for panel in 0..blk.d / PANEL {
                        let c = k.mov(Ty::U32, panel * PANEL);
                        let at = Addr::at(dst, i64::from(panel * blk.bk * 128));
                        k.tensor_load(at, map, &[c, it.h, key0, it.b], bar);
                    }
                });
            }
            k.update("add", step, step, 1u32);
        });
    });
    k.place(done);
}
