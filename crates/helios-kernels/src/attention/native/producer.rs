//! The producer warp of the native kernels: tensor maps built on the device, then the copy
//! engine filling the two rings (K and V; DkDv's Q and dO).

use helios_ptx::{Addr, Cmp, Kernel, Reg, Swizzle, TensorMap, Ty};

use super::block::{Block, Params};
use super::PANEL;

/// The producer warp: builds K's and V's maps into its SM's slot, then walks the items and
/// brings each key block into the next free stage of each ring.
pub(super) fn producer(k: &mut Kernel, blk: &Block, p: &Params, maps_smem: Reg) {
    k.comment("producer: one warp builds the tensor maps, one thread issues the copies");
    let ptid = k.sub(blk.tid, blk.consumers);
    let spare = k.setp(Cmp::Ge, ptid, 32u32);
    let done = k.label();
    k.bra_if(spare, false, done);

    // [B, T, H, D] as (D, H, T, B): boxes of 64 channels × 1 head × bk rows × 1 batch row
    // (the channels past D of a padded head dim, `panel_width`, are filled with zeros).
    let d = k.mov(Ty::U32, blk.d);
    let batch = k.div(blk.bh, blk.heads);
    let map_of = |k: &mut Kernel, ptr: Reg, off: Reg, [sb, st, sh]: [Reg; 3]| {
        let o = k.mul_wide(off, 2u32);
        let strides = [sh, st, sb].map(|s| k.mul_wide(s, 2u32)).to_vec();
        TensorMap {
            base: k.add(ptr, o),
            dims: vec![d, blk.heads, blk.t, batch],
            strides,
            box_dims: vec![PANEL, 1, blk.bk, 1],
            swizzle: Swizzle::B128,
        }
    };
    // The rings carry K and V, or DkDv's Q and dO.
    let (map_k, map_v) = match (&p.grad, blk.dkdv) {
        (Some(g), true) => (
            map_of(k, p.q, p.offs[0], p.strides),
            map_of(k, g.d_o, g.off_do, g.strides_do),
        ),
        _ => (
            map_of(k, p.k, p.offs[1], p.strides),
            map_of(k, p.v, p.offs[2], p.strides),
        ),
    };
    let [gk, gv] = crate::native_maps::publish(k, ptid, maps_smem, p.maps, [&map_k, &map_v]);
    let lane0 = k.setp(Cmp::Eq, ptid, 0u32);

    k.comment("producer loop: wait for a free stage, announce its bytes, copy");
    let empty_count = blk.consumers + 32;
    let step = k.mov(Ty::U32, 0u32);
    blk.for_each_item(k, |k, it| {
        k.for_range(0u32, it.blocks, 1, |k, j| {
            let block = k.add(it.first, j);
            let key0 = k.mul(block, blk.bk);
            for (v, map, ring) in [(false, gk, blk.k_base), (true, gv, blk.v_base)] {
                let slot = k.rem(step, blk.stages_of(v));
                let reuse = k.setp(Cmp::Ge, step, blk.stages_of(v));
                k.if_(reuse, |k| {
                    let id = blk.empty_id(k, slot, v);
                    k.bar_sync_reg(id, empty_count);
                });
                k.if_(lane0, |k| {
                    let bar = blk.full_bar(k, slot, v);
                    k.mbarrier_arrive_expect_tx(bar, blk.stage_bytes());
                    let dst = k.mad(slot, blk.stage_bytes(), ring);
                    for panel in 0..blk.width() / PANEL {
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
