//! The native attention kernel: its parameters and shared memory, then the split into the
//! producer warp (`producer`) and the consumer warpgroups (`forward`, `dq`, `dkdv`, on the
//! machinery in `consumer`), which share a `Block` (`block`).

use helios_ptx::{Addr, BuildError, Cmp, Kernel, Module, Special, Target, Ty};

use super::block::{Block, Grad, Params};
use super::{
    dkdv, dq, forward, producer, stage_bytes, AttentionKernel, AttnStage, AttnVariant,
    PRODUCER_REGS, WG_ROWS, WG_THREADS,
};

/// Emits the native kernel of `kern` (its forward, Dq or DkDv) for `target`.
pub(super) fn build(kern: &AttentionKernel, target: Target) -> Result<Module, BuildError> {
    let AttnVariant::Native { bq, bk } = kern.variant else {
        unreachable!("the native kernel of a native variant");
    };
    let dkdv = kern.stage == AttnStage::DkDv;
    let dq = kern.stage == AttnStage::Dq || dkdv;
    let (bq, bk, d) = (u32::from(bq), u32::from(bk), kern.head_dim);
    let mut k = Kernel::new(&kern.name(), target);
    let consumers = bq / WG_ROWS * WG_THREADS;
    let threads = consumers + WG_THREADS;
    k.threads(threads);
    let entry = (65536 / threads).min(255) / 8 * 8;
    k.max_registers(entry);
    let consumer_regs =
        ((entry * threads - PRODUCER_REGS * WG_THREADS) / consumers / 8 * 8).min(256);

    // Parameters, in `native_launch` order: the buffers as the SPIR-V kernel declares them,
    // then its push constants, then the maps' workspace.
    // Forward: q, k, v, [lens], o, lse. Dq: q, k, v, do, lse, dsum, [lens], dq; with
    // `own_dsum` q, k, v, do, lse, o, [lens], dsum, dq. DkDv: Dq's with dk, dv. (`dq`
    // below: either backward stage.)
    let pq = k.param("q", Ty::U64);
    let pk = k.param("k", Ty::U64);
    let pv = k.param("v", Ty::U64);
    let pgrad = dq.then(|| {
        [
            k.param("do", Ty::U64),
            k.param("lse", Ty::U64),
            k.param(if kern.own_dsum { "o" } else { "dsum" }, Ty::U64),
        ]
    });
    let plens = kern.padded.then(|| k.param("lens", Ty::U64));
    let pown = kern.own_dsum.then(|| k.param("dsum", Ty::U64));
    let (po, plse) = match pgrad {
        Some([_, lse, _]) if dkdv => (k.param("dk", Ty::U64), lse),
        Some([_, lse, _]) => (k.param("dq", Ty::U64), lse),
        None => (k.param("o", Ty::U64), k.param("lse", Ty::U64)),
    };
    let pdv = dkdv.then(|| k.param("dv", Ty::U64));
    let pt = k.param("t", Ty::U32);
    let pheads = k.param("heads", Ty::U32);
    let pbatch = k.param("batch", Ty::U32);
    let pscale = k.param("scale", Ty::F32);
    let poffs = ["off_q", "off_k", "off_v"].map(|n| k.param(n, Ty::U32));
    let pstrides = ["stride_b", "stride_t", "stride_h"].map(|n| k.param(n, Ty::U32));
    let pdo = dq.then(|| {
        (
            k.param("off_do", Ty::U32),
            ["do_b", "do_t", "do_h"].map(|n| k.param(n, Ty::U32)),
        )
    });
    let pmaps = k.param("maps", Ty::U64);

    let ring_stages = super::ring_stages(kern);
    let smem = k.shared("stages", 1024, super::ring_bytes(kern));
    let maps_arr = k.shared("map_build", 128, 2 * helios_ptx::TENSOR_MAP_BYTES);
    let bars_arr = k.shared("full", 8, 8 * (ring_stages[0] + ring_stages[1]));
    let exchange =
        super::split_roles(kern).then(|| k.shared("exchange", 16, super::exchange_bytes(kern, bk)));
    let stats = dkdv.then(|| k.shared("stats", 16, super::stats_bytes(kern, bq, bk)));

    let p = Params {
        q: k.ld_param_global(pq),
        k: k.ld_param_global(pk),
        v: k.ld_param_global(pv),
        o: k.ld_param_global(po),
        lse: k.ld_param_global(plse),
        offs: poffs.map(|p| k.ld_param(p)),
        strides: pstrides.map(|p| k.ld_param(p)),
        scale: k.ld_param(pscale),
        maps: k.ld_param_global(pmaps),
        grad: pgrad.zip(pdo).map(|([d_o, _, third], (off, st))| Grad {
            d_o: k.ld_param_global(d_o),
            off_do: k.ld_param(off),
            strides_do: st.map(|p| k.ld_param(p)),
            o: pown.is_some().then(|| k.ld_param_global(third)),
            dsum: k.ld_param_global(pown.unwrap_or(third)),
            dv: pdv.map(|p| k.ld_param_global(p)),
        }),
    };
    let t = k.ld_param(pt);
    let heads = k.ld_param(pheads);
    let batch = k.ld_param(pbatch);
    let lens = plens.map(|p| k.ld_param_global(p));
    let tid = k.special(Special::TidX);
    let bh = k.mul(batch, heads);
    let tile = super::tile_rows(kern, bq);
    let tiles = {
        let e = k.add(t, tile - 1);
        k.div(e, tile)
    };
    let shift = (kern.stage == AttnStage::Forward && kern.causal).then(|| {
        // The rows past T in the last tile, down to whole warpgroups.
        let all = k.mul(tiles, tile);
        let over = k.sub(all, t);
        let groups = k.div(over, WG_ROWS);
        k.mul(groups, WG_ROWS)
    });
    let parts = super::column_parts(kern);
    let base = k.shared_address(smem);
    let blk = Block {
        t,
        heads,
        bh,
        tiles,
        items: {
            let tiles = k.mul(tiles, bh);
            if parts > 1 {
                k.mul(tiles, parts)
            } else {
                tiles
            }
        },
        lens,
        causal: kern.causal,
        dkdv,
        bq: tile,
        split: super::split_roles(kern),
        parts,
        bk,
        d,
        stages: ring_stages,
        tid,
        k_base: base,
        v_base: k.add(base, stage_bytes(bk, d) * ring_stages[0]),
        bars: k.shared_address(bars_arr),
        consumers,
        exchange: exchange.map(|x| k.shared_address(x)),
        stats: stats.map(|x| k.shared_address(x)),
        shift,
    };

    let first = k.setp(Cmp::Eq, tid, consumers);
    k.if_(first, |k| {
        for s in 0..ring_stages[0] + ring_stages[1] {
            k.mbarrier_init(Addr::at(blk.bars, i64::from(8 * s)), 1);
        }
        k.fence_mbarrier_init();
    });
    k.bar_sync(0);
    let is_producer = k.setp(Cmp::Ge, tid, consumers);
    let consume = k.label();
    k.bra_if(is_producer, true, consume);
    k.setmaxnreg(false, PRODUCER_REGS);
    let maps_smem = k.shared_address(maps_arr);
    producer::producer(&mut k, &blk, &p, maps_smem);
    k.ret();
    k.place(consume);
    k.setmaxnreg(true, consumer_regs);
    if dkdv {
        dkdv::consumer(&mut k, kern, &blk, &p);
    } else if dq {
        dq::consumer(&mut k, kern, &blk, &p);
    } else {
        forward::consumer(&mut k, kern, &blk, &p);
    }
    k.finish()
}
