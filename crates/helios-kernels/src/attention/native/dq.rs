//! The consumer warpgroups of the native Dq: per query tile, Q and dO in registers, then
//! per key block S = Q·Kᵀ and dP = dO·Vᵀ, P = exp(S − L), dS = P ∘ (dP − Dsum) and
//! dQ += dS·K on `wgmma`; then dQ · scale. The producer and the work walk are the forward's
//! (the same K and V rings); V's stage goes back once dP is done, K's after dS·K.
//!
//! No atomics: each query tile owns its dQ rows (deterministic, as the SPIR-V Dq). Dsum
//! comes from the Prep pass.

use helios_ptx::{Kernel, Ty};

use super::block::{Block, Params};
use super::consumer::{
    hand_back, live_blocks, pack, query_stats, store_rows, Consumer, Fragments, Lanes,
};
use super::AttentionKernel;

/// Dq's consumer warpgroups (see the module docs).
pub(super) fn consumer(k: &mut Kernel, kern: &AttentionKernel, blk: &Block, p: &Params) {
    let grad = p.grad.as_ref().expect("Dq's parameters");
    let lanes = Lanes::new(k, kern, blk, p);
    let Lanes {
        wg,
        warp_row,
        zero,
        half2,
        ..
    } = lanes;
    let (bk, d) = (blk.bk, blk.d);

    let s_acc = k.regs(Ty::F32, (bk / 2) as usize);
    let dp_acc = k.regs(Ty::F32, (bk / 2) as usize);
    let dq_acc = k.regs(Ty::F32, (d / 2) as usize);
    let (q, d_o) = (Fragments::new(k, d), Fragments::new(k, d));
    let step = k.mov(Ty::U32, 0u32);
    let q_view = (p.q, p.offs[0], p.strides);
    let do_view = (grad.d_o, grad.off_do, grad.strides_do);

    blk.for_each_item(k, |k, it| {
        let (rows, ok) = lanes.rows(k, blk, it.row0);
        let first_row = k.add(it.row0, warp_row);
        k.comment("Q and dO rows in registers: wgmma's A fragments");
        let at = (it.b, it.h, it.row0);
        q.load(k, (&lanes, blk), q_view, at);
        d_o.load(k, (&lanes, blk), do_view, at);
        let bh = k.mad(it.b, blk.heads, it.h);
        let mut lse2 = [zero; 2];
        let mut dsum = [zero; 2];
        for h in 0..2 {
            let idx = k.mad(bh, blk.t, rows[h]);
            (lse2[h], dsum[h]) = query_stats(k, (p.lse, grad.dsum), idx, ok[h]);
        }
        for &r in &dq_acc {
            k.assign(r, 0.0f32);
        }
        let live = live_blocks(k, blk, it, wg);
        let c = Consumer {
            lanes: &lanes,
            blk,
            s_acc: &s_acc,
            rows,
            first_row,
            len: it.len,
            step0: k.mov(Ty::U32, step),
        };

        k.comment("key blocks: S = Q K^T, dP = dO V^T, dS = P (dP - Dsum), dQ += dS K");
        k.for_range(0u32, live, 1, |k, _| {
            c.issue_by_keys(k, step, &q.kept, false, &s_acc);
            c.issue_by_keys(k, step, &d_o.kept, true, &dp_acc);
            k.wgmma_wait(0);
            c.release(k, step, true);
            c.mask(k, step);
            let mut ds = Vec::with_capacity(s_acc.len());
            for (i, (&s, &dp)) in s_acc.iter().zip(&dp_acc).enumerate() {
                let h = (i / 2) % 2;
                let x = k.mul(s, lanes.scale2);
                let x = k.sub(x, lse2[h]);
                let prob = k.ex2(x);
                let diff = k.sub(dp, dsum[h]);
                ds.push(k.mul(prob, diff));
            }
            // S's accumulator layout is the A layout of dS·K.
            let frags = pack(k, half2, &ds);
            c.issue_over_keys(k, step, &frags, false, &dq_acc);
            k.wgmma_wait(0);
            c.release(k, step, false);
            k.update("add", step, step, 1u32);
        });
        hand_back(k, &c, step, (live, it.blocks), [true, false]);

        k.comment("epilogue: dQ scaled, rounded, stored");
        // dQ is dense [B, T, H, D], or the first slice of a packed [B, T, 3, H, D].
        let row_heads = if kern.packed {
            k.mul(blk.heads, 3u32)
        } else {
            k.mov(Ty::U32, blk.heads)
        };
        let place = (&lanes, blk, it);
        let scale = [p.scale; 2];
        store_rows(k, place, (rows, ok), (&dq_acc, scale), (p.o, row_heads, 0));
    });
}
