//! The consumer warpgroups of the native Dq: per query tile, Q and dO in registers, then
//! per key block S = Q·Kᵀ and dP = dO·Vᵀ, P = exp(S − L), dS = P ∘ (dP − Dsum) and
//! dQ += dS·K on `wgmma`; then dQ · scale. The producer and the work walk are the forward's
//! (the same K and V rings, K's with a third stage where it fits); V's stage goes back once
//! dP is done, K's after dS·K. P's exponentials run while dP's product does.
//!
//! No atomics: each query tile owns its dQ rows (deterministic, as the SPIR-V Dq). Dsum
//! comes from the Prep pass, or (`own_dsum`) Dq computes it from O and the dO rows it
//! holds and writes it for DkDv, which then runs after it.

use helios_ptx::{Addr, Cmp, Kernel, Reg, Space, Ty};

use super::block::{Block, Params};
use super::consumer::{
    hand_back, live_blocks, load_fragments, pack, query_lse, query_stats, store_rows,
    unmasked_blocks, Consumer, Fragments, Lanes,
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
    // dQ's channels: all of D's, or the item's part (`Block::parts`).
    let dq_acc = k.regs(Ty::F32, (blk.width() / blk.parts / 2) as usize);
    let (q, d_o) = (Fragments::new(k, d), Fragments::new(k, d));
    // With `own_dsum`, O's rows in dO's fragment layout, for Dsum = rowsum(dO ∘ O).
    let o_rows = k.regs(
        Ty::B32,
        if grad.o.is_some() {
            (d / 4) as usize
        } else {
            0
        },
    );
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
            match grad.o {
                Some(_) => lse2[h] = query_lse(k, p.lse, idx, ok[h]),
                None => (lse2[h], dsum[h]) = query_stats(k, (p.lse, grad.dsum), idx, ok[h]),
            }
        }
        if let Some(o) = grad.o {
            let out = (o, &o_rows[..], grad.dsum);
            dsum = own_dsum(k, (&lanes, blk, &d_o), out, at, (rows, ok), bh);
        }
        for &r in &dq_acc {
            k.assign(r, 0.0f32);
        }
        let neg_dsum = dsum.map(|x| k.neg(x));
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
        // P's exponentials run beside dP's product.
        let block = |k: &mut Kernel, masked: bool| {
            c.issue_by_keys(k, step, &q.kept, false, &s_acc);
            c.issue_by_keys(k, step, &d_o.kept, true, &dp_acc);
            k.wgmma_wait(1);
            if masked {
                c.mask(k, step);
            }
            // dS = P · dP − P · Dsum: the second product is ready before dP is, which gives
            // ptxas work beside the exponentials and keeps its wait for dP after them.
            let probs: Vec<Reg> = s_acc
                .iter()
                .enumerate()
                .map(|(i, &s)| {
                    let x = k.mul(s, lanes.scale2);
                    let x = k.sub(x, lse2[(i / 2) % 2]);
                    k.ex2(x)
                })
                .collect();
            let shifts: Vec<Reg> = probs
                .iter()
                .enumerate()
                .map(|(i, &prob)| k.mul(prob, neg_dsum[(i / 2) % 2]))
                .collect();
            k.wgmma_wait(0);
            c.release(k, step, true);
            let ds: Vec<Reg> = probs
                .iter()
                .zip(&dp_acc)
                .zip(&shifts)
                .map(|((&prob, &dp), &shift)| k.fma(prob, dp, shift))
                .collect();
            // S's accumulator layout is the A layout of dS·K.
            let frags = pack(k, half2, &ds);
            c.issue_over_keys(k, step, &frags, (false, it.cols), &dq_acc);
            k.wgmma_wait(0);
            c.release(k, step, false);
            k.update("add", step, step, 1u32);
        };
        // The blocks no row masks run without the mask's branch: with it inside the loop,
        // ptxas waits for dP before the exponentials.
        let free = unmasked_blocks(k, blk, it, wg, live);
        k.for_range(0u32, free, 1, |k, _| block(k, false));
        k.for_range(free, live, 1, |k, _| block(k, true));
        hand_back(k, &c, step, (live, it.blocks), [true, false], None);

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

/// Dsum = rowsum(dO ∘ O) of this thread's two rows (0 past T), from dO's A fragments and
/// O's rows loaded in the same layout (`o_rows`, O dense [B, T, H, D]); each row's four
/// lanes add their parts, and the first writes it to the [B, H, T] Dsum (`dsum_out`) for
/// DkDv.
fn own_dsum(
    k: &mut Kernel,
    (lanes, blk, d_o): (&Lanes, &Block, &Fragments),
    (o, o_rows, dsum_out): (Reg, &[Reg], Reg),
    (b, h, row0): (Reg, Reg, Reg),
    (rows, ok): ([Reg; 2], [Reg; 2]),
    bh: Reg,
) -> [Reg; 2] {
    k.comment("Dsum = rowsum(dO o O), written for DkDv");
    let hd = k.mul(blk.heads, blk.d);
    let zero = k.mov(Ty::U32, 0u32);
    let view = (o, zero, [k.mul(hd, blk.t), hd, k.mov(Ty::U32, blk.d)]);
    let me = (lanes.own_row, lanes.col_bytes);
    load_fragments(k, me, view, (b, h, row0), (blk.t, blk.d), o_rows);
    let half = if lanes.half2 == Ty::F16x2 {
        Ty::F16
    } else {
        Ty::BF16
    };
    [0, 1].map(|r| {
        let mut acc = k.mov(Ty::F32, 0.0f32);
        // Register 4s + i + r holds row half r: two values of dO and O each.
        for (&x, &y) in d_o.kept.iter().zip(o_rows).skip(r).step_by(2) {
            let (xl, xh) = k.unpack_halves(x, half);
            let (yl, yh) = k.unpack_halves(y, half);
            for (a, c) in [(xl, yl), (xh, yh)] {
                let a = k.widen(a);
                let c = k.widen(c);
                acc = k.fma(a, c, acc);
            }
        }
        for x in [1u32, 2] {
            let other = k.shfl("bfly", acc, x, 31);
            acc = k.add(acc, other);
        }
        let first = k.setp(Cmp::Eq, lanes.tq, 0u32);
        let write = k.and_pred(first, ok[r]);
        let idx = k.mad(bh, blk.t, rows[r]);
        let at = k.mad_wide(idx, 4u32, dsum_out);
        k.st_if(write, Space::Global, Addr::new(at), acc);
        acc
    })
}
