//! The consumer warpgroups of the native forward: Q in registers, then per key block
//! S = Q·Kᵀ, the online softmax and O += P·V on `wgmma`, software-pipelined; then O / l
//! and the log-sum-exp.

use helios_ptx::{Addr, Cmp, Kernel, Reg, Space, Ty};

use super::block::{Block, Params};
use super::consumer::{
    hand_back, live_blocks, pack, store_rows, unmasked_blocks, Consumer, Fragments, Lanes, Turns,
};
use super::{AttentionKernel, WG_THREADS};

/// The consumer warpgroups: per item, Q into registers, then per key block S = Q·Kᵀ, the
/// online softmax, O += P·V; then O / l and the log-sum-exp.
pub(super) fn consumer(k: &mut Kernel, kern: &AttentionKernel, blk: &Block, p: &Params) {
    let lanes = Lanes::new(k, kern, blk, p);
    let Lanes {
        wg,
        warp_row,
        tq,
        zero,
        ..
    } = lanes;
    let (bk, d) = (blk.bk, blk.d);
    let s_acc = k.regs(Ty::F32, (bk / 2) as usize);
    let o_acc = k.regs(Ty::F32, (blk.width() / 2) as usize);
    let p_regs = k.regs(lanes.half2, (bk / 4) as usize);
    let m = [k.reg(Ty::F32), k.reg(Ty::F32)];
    let l = [k.reg(Ty::F32), k.reg(Ty::F32)];
    let step = k.mov(Ty::U32, 0u32);
    let q = Fragments::new(k, d);
    let q_view = (p.q, p.offs[0], p.strides);
    // Blocks of 64 keys run in FlashAttention-3's order (`Softmax::pipelined`) and load
    // the next item's Q while this one runs. Blocks of 32 keys (the 192-row tile at head
    // dim 128) measured slower in that order: their softmax is short, little to hide.
    let pipelined = bk >= 64;
    let fetched = k.mov(Ty::U32, 0u32);
    // Turns between three warpgroups won 0.5-1 % (T = 1024 and 2048); between two they
    // lost 3 % (bench/results/2026-12-02-session58-h200.md).
    let groups = blk.consumers / WG_THREADS;
    let turns = (pipelined && groups >= 3).then(|| Turns::new(k, wg, groups));

    blk.for_each_item(k, |k, it| {
        let (rows, ok) = lanes.rows(k, blk, it.row0);
        let first_row = k.add(it.row0, warp_row);
        k.comment("Q rows in registers: wgmma's A fragments");
        if pipelined {
            let cold = k.setp(Cmp::Eq, fetched, 0u32);
            k.if_(cold, |k| {
                q.fetch(k, (&lanes, blk), q_view, (it.b, it.h, it.row0))
            });
            q.keep(k);
            let more = k.setp(Cmp::Lt, it.next, blk.items);
            k.if_(more, |k| {
                let (b, h, row0) = blk.coords(k, it.next);
                q.fetch(k, (&lanes, blk), q_view, (b, h, row0));
            });
            k.assign(fetched, 1u32);
        } else {
            q.load(k, (&lanes, blk), q_view, (it.b, it.h, it.row0));
        }
        for &r in &o_acc {
            k.assign(r, 0.0f32);
        }
        for h in 0..2 {
            k.assign(m[h], f32::NEG_INFINITY);
            k.assign(l[h], 0.0f32);
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
        let f = Softmax {
            qf: &q.kept,
            o_acc: &o_acc,
            p_regs: &p_regs,
            m,
            l,
            half2: lanes.half2,
        };
        k.comment("key blocks: S = Q K^T, online softmax, O += P V");
        if pipelined {
            let free = unmasked_blocks(k, blk, it, wg, live);
            f.pipelined(&c, k, step, (live, free), turns.as_ref());
        } else {
            k.for_range(0u32, live, 1, |k, _| {
                let (alpha, probs) = f.scores_alone(&c, k, step, None);
                f.rescale_o(k, &alpha);
                f.pack_p(k, &probs);
                f.product_issue(&c, k, step);
                k.wgmma_wait(0);
                c.release(k, step, true);
                k.update("add", step, step, 1u32);
            });
        }
        hand_back(
            k,
            &c,
            step,
            (live, it.blocks),
            [false, true],
            turns.as_ref(),
        );

        k.comment("epilogue: O / l, the log-sum-exp");
        let mut inv = [zero; 2];
        for h in 0..2 {
            let mut s = l[h];
            for x in [1u32, 2] {
                let o = k.shfl("bfly", s, x, 31);
                s = k.add(s, o);
            }
            let empty = k.setp(Cmp::Eq, s, 0.0f32);
            let r = k.rcp_exact(s);
            inv[h] = k.selp(empty, 0.0f32, r, Ty::F32);
            // L = ln 2 · (m + log2 l): −inf for a row with no key.
            let lg = k.lg2(s);
            let ln = k.add(m[h], lg);
            let lse = k.mul(ln, std::f32::consts::LN_2);
            let quad0 = k.setp(Cmp::Eq, tq, 0u32);
            let write = k.and_pred(quad0, ok[h]);
            let bh = k.mad(it.b, blk.heads, it.h);
            let idx = k.mad(bh, blk.t, rows[h]);
            let at = k.mad_wide(idx, 4u32, p.lse);
            k.st_if(write, Space::Global, Addr::new(at), lse);
        }
        // O is dense [B, T, H, D].
        let place = (&lanes, blk, it);
        store_rows(k, place, (rows, ok), (&o_acc, inv), (p.o, blk.heads, 0));
    });
}

/// The forward's own state beside `Consumer`: Q's fragments, O, the online softmax's row
/// maxima and sums, and P for the next product.
struct Softmax<'a> {
    qf: &'a [Reg],
    o_acc: &'a [Reg],
    /// P of the block whose P·V is next, as `wgmma`'s A fragments.
    p_regs: &'a [Reg],
    m: [Reg; 2],
    l: [Reg; 2],
    half2: Ty,
}

impl Softmax<'_> {
    /// Issues S = Q·Kᵀ for the key block of `step` once its K has landed (one commit group).
    fn scores_issue(&self, c: &Consumer, k: &mut Kernel, step: Reg) {
        c.issue_by_keys(k, step, self.qf, false, c.s_acc);
    }

    /// Issues O += P·V for the key block of `step` once its V has landed.
    fn product_issue(&self, c: &Consumer, k: &mut Kernel, step: Reg) {
        c.issue_over_keys(k, step, self.p_regs, (true, None), self.o_acc);
    }

    /// S of the key block of `step` with no product beside it: issued, waited for, K handed
    /// back, masked; then its softmax (`probabilities`: the rows' factors and P).
    fn scores_alone(
        &self,
        c: &Consumer,
        k: &mut Kernel,
        step: Reg,
        turns: Option<&Turns>,
    ) -> ([Reg; 2], Vec<Reg>) {
        in_turn(c, k, step, turns, |k| self.scores_issue(c, k, step));
        k.wgmma_wait(0);
        c.release(k, step, false);
        c.mask(k, step);
        self.probabilities(c, k)
    }

    /// The `live` key blocks from `step` on in FlashAttention-3's intra-warpgroup order:
    /// block j's S is issued first, O is rescaled by block j − 1's factors while it runs,
    /// then block j − 1's P·V is issued, and block j's softmax runs while that product
    /// does. S issued before the rescale keeps the tensor cores busy through the rescale's
    /// multiplies (bench/results/2026-12-01-session55-h200.md). P is packed only after the
    /// product's wait: packed before it, ptxas writes the new P into the registers the
    /// running `wgmma` reads and then serializes every `wgmma` of the kernel (C7513).
    /// With `turns`, each block's S and the product beside it are issued in this
    /// warpgroup's turn.
    fn pipelined(
        &self,
        c: &Consumer,
        k: &mut Kernel,
        step: Reg,
        (live, free): (Reg, Reg),
        turns: Option<&Turns>,
    ) {
        let any = k.setp(Cmp::Gt, live, 0u32);
        // The rows' factors from one block's softmax to the next block's rescale.
        let alpha = [k.reg(Ty::F32), k.reg(Ty::F32)];
        let keep = |k: &mut Kernel, a: [Reg; 2]| {
            for (&r, v) in alpha.iter().zip(a) {
                k.assign(r, v);
            }
        };
        k.if_(any, |k| {
            let (a, probs) = self.scores_alone(c, k, step, turns);
            keep(k, a);
            self.pack_p(k, &probs);
            k.update("add", step, step, 1u32);
            let block = |k: &mut Kernel, masked: bool| {
                let prev = k.sub(step, 1u32);
                in_turn(c, k, step, turns, |k| {
                    self.scores_issue(c, k, step);
                    self.rescale_o(k, &alpha);
                    self.product_issue(c, k, prev);
                });
                k.wgmma_wait(1);
                c.release(k, step, false);
                if masked {
                    c.mask(k, step);
                }
                let (a, probs) = self.probabilities(c, k);
                keep(k, a);
                k.wgmma_wait(0);
                c.release(k, prev, true);
                self.pack_p(k, &probs);
                k.update("add", step, step, 1u32);
            };
            // The blocks no row masks run without the mask's branch: with it inside the
            // loop, ptxas waits for the product before the softmax (no overlap).
            let split = k.max(free, 1u32);
            k.for_range(1u32, split, 1, |k, _| block(k, false));
            k.for_range(split, live, 1, |k, _| block(k, true));
            let prev = k.sub(step, 1u32);
            self.rescale_o(k, &alpha);
            self.product_issue(c, k, prev);
            k.wgmma_wait(0);
            c.release(k, prev, true);
        });
    }

    /// Updates the row maxima and sums from S (masked) and returns the rows' rescale
    /// factors and the new P (f32, in accumulator order). Neither O nor P's fragments are
    /// touched: a product reading and writing them may still run.
    fn probabilities(&self, c: &Consumer, k: &mut Kernel) -> ([Reg; 2], Vec<Reg>) {
        // Online softmax, base 2, two rows a thread; a row's four threads are a quad.
        let zero = k.mov(Ty::F32, 0.0f32);
        let mut alpha = [zero; 2];
        let mut neg_m = [zero; 2];
        for h in 0..2usize {
            // A balanced tree (depth 4 for 16 values), not a chain: ptxas does not
            // reassociate the chain, whose latency sat before every exponential.
            let row: Vec<Reg> = (c.s_acc.iter().enumerate())
                .filter(|(i, _)| (i / 2) % 2 == h)
                .map(|(_, &r)| r)
                .collect();
            let mut mx = max_tree(k, &row);
            for x in [1u32, 2] {
                let o = k.shfl("bfly", mx, x, 31);
                mx = k.max(mx, o);
            }
            let mx = k.mul(mx, c.lanes.scale2);
            // The maximum moves only when the block's is more than 2^8 above it: P stays
            // at most 256 (bf16 and f16 round it as they would 1), and alpha is then
            // exactly 1 for almost every block, which lets `rescale_o` skip O.
            let bound = k.add(self.m[h], GROWTH_LOG2);
            let grows = k.setp(Cmp::Gt, mx, bound);
            let m_new = k.selp(grows, mx, self.m[h], Ty::F32);
            // A row with no key yet keeps m = −inf; its exponentials use 0 (all zero).
            let none = k.setp(Cmp::Eq, m_new, f32::NEG_INFINITY);
            let m_use = k.selp(none, 0.0f32, m_new, Ty::F32);
            let diff = k.sub(self.m[h], m_use);
            let factor = k.ex2(diff);
            alpha[h] = k.selp(grows, factor, 1.0f32, Ty::F32);
            neg_m[h] = k.neg(m_use);
            k.assign(self.m[h], m_new);
        }
        let mut sums = [k.mov(Ty::F32, 0.0f32), k.mov(Ty::F32, 0.0f32)];
        let mut probs = Vec::with_capacity(c.s_acc.len());
        for (i, &r) in c.s_acc.iter().enumerate() {
            let h = (i / 2) % 2;
            let x = k.fma(r, c.lanes.scale2, neg_m[h]);
            let e = k.ex2(x);
            sums[h] = k.add(sums[h], e);
            probs.push(e);
        }
        for h in 0..2 {
            let scaled = k.mul(self.l[h], alpha[h]);
            let v = k.add(scaled, sums[h]);
            k.assign(self.l[h], v);
        }
        (alpha, probs)
    }

    /// O scaled by the rows' factors (no product into O may be running), skipped by a
    /// warp none of whose rows' maxima moved.
    fn rescale_o(&self, k: &mut Kernel, alpha: &[Reg; 2]) {
        let moved = alpha.map(|a| k.setp(Cmp::Ne, a, 1.0f32));
        let moved = k.or_pred(moved[0], moved[1]);
        let any = k.vote_any(moved);
        k.if_(any, |k| {
            for (i, &r) in self.o_acc.iter().enumerate() {
                let v = k.mul(r, alpha[(i / 2) % 2]);
                k.assign(r, v);
            }
        });
    }

    /// P rounded into the next product's A fragments (no product may be reading them).
    fn pack_p(&self, k: &mut Kernel, probs: &[Reg]) {
        // S's accumulator layout is P·V's A layout: registers 8s..8s+7 are k step s.
        let packed = pack(k, self.half2, probs);
        for (&r, &p) in self.p_regs.iter().zip(&packed) {
            k.assign(r, p);
        }
    }
}

/// Runs `issue`, the products of the key block of `step`, in this warpgroup's turn where
/// the warpgroups take turns: once the block's K has landed, so that a turn is not held
/// waiting for the copy.
fn in_turn(
    c: &Consumer,
    k: &mut Kernel,
    step: Reg,
    turns: Option<&Turns>,
    issue: impl FnOnce(&mut Kernel),
) {
    match turns {
        Some(t) => {
            c.wait_full(k, step, false);
            t.take(k);
            issue(k);
            t.pass(k);
        }
        None => issue(k),
    }
}

/// How far (log2) a block's row maximum may exceed the running one before the running one
/// moves (FlashAttention-4's lazy rescaling).
const GROWTH_LOG2: f32 = 8.0;

/// The maximum of `vals` (at least one) by pairs, a balanced tree.
fn max_tree(k: &mut Kernel, vals: &[Reg]) -> Reg {
    let mut level = vals.to_vec();
    while level.len() > 1 {
        level = (level.chunks(2))
            .map(|p| match *p {
                [a, b] => k.max(a, b),
                [a] => a,
                _ => unreachable!("chunks of two"),
            })
            .collect();
    }
    level[0]
}
