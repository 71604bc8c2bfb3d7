//! The consumer warpgroups of the native forward: Q in registers, then per key block
//! S = Q·Kᵀ, the online softmax and O += P·V on `wgmma`, software-pipelined; then O / l
//! and the log-sum-exp.

use helios_ptx::{
    AccThread, Addr, Cmp, Kernel, MatrixDesc, MmaInput, Reg, Space, Swizzle, Ty, WgmmaA,
};

use super::block::{Block, Item, Params};
use super::{AttentionKernel, Storage, WG_ROWS};

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
    let o_acc = k.regs(Ty::F32, (d / 2) as usize);
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
            f.pipelined(&c, k, step, (live, free));
        } else {
            k.for_range(0u32, live, 1, |k, _| {
                f.scores_alone(&c, k, step);
                f.product_issue(&c, k, step);
                k.wgmma_wait(0);
                c.release(k, step, true);
                k.update("add", step, step, 1u32);
            });
        }
        hand_back(k, &c, step, (live, it.blocks), [false, true]);

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

/// What one consumer warpgroup's key-block steps share in every native kernel (see
/// `consumer`, `dq`, `dkdv`): the rings, the score accumulators and their mask.
pub(super) struct Consumer<'a> {
    pub(super) lanes: &'a Lanes,
    pub(super) blk: &'a Block,
    /// S (or Sᵀ): 64 rows × the block's columns.
    pub(super) s_acc: &'a [Reg],
    /// This thread's two rows of the tile, its warp's first, and the batch row's keys.
    pub(super) rows: [Reg; 2],
    pub(super) first_row: Reg,
    pub(super) len: Reg,
    /// The k step of the item's first key block.
    pub(super) step0: Reg,
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

impl Consumer<'_> {
    /// The ring slot of k step `step`, its mbarrier parity, and its offset in descriptor
    /// units.
    pub(super) fn slot(&self, k: &mut Kernel, step: Reg, v: bool) -> (Reg, Reg, Reg) {
        let n = self.blk.stages_of(v);
        let slot = k.rem(step, n);
        let round = k.div(step, n);
        let parity = k.and(round, 1u32);
        let units = k.mul(slot, self.blk.stage_bytes() >> 4);
        (slot, parity, k.cvt(Ty::U64, units))
    }

    pub(super) fn wait_full(&self, k: &mut Kernel, step: Reg, v: bool) {
        let (slot, parity, _) = self.slot(k, step, v);
        let bar = self.blk.full_bar(k, slot, v);
        k.mbarrier_wait(bar, parity);
    }

    /// Hands K's or V's stage of `step` back to the producer.
    pub(super) fn release(&self, k: &mut Kernel, step: Reg, v: bool) {
        let slot = k.rem(step, self.blk.stages_of(v));
        let id = self.blk.empty_id(k, slot, v);
        k.bar_arrive_reg(id, self.blk.consumers + 32);
    }

    /// Issues `acc` = A·Xᵀ once the stage of `step` of ring X (K, or V with `v`) has landed:
    /// A is 64 rows × D as fragments (`a`, a k16 step of D each four registers), X the
    /// stage's keys × D read K-major; `acc` is 64 rows × the block's keys.
    pub(super) fn issue_by_keys(&self, k: &mut Kernel, step: Reg, a: &[Reg], v: bool, acc: &[Reg]) {
        self.wait_full(k, step, v);
        let (_, _, units) = self.slot(k, step, v);
        let kd = k.add(self.lanes.by_rows[usize::from(v)], units);
        k.wgmma_fence();
        for s in 0..self.blk.d / 16 {
            let off = (s / 4) * self.blk.bk * 128 + (s % 4) * 32;
            let desc = k.desc_offset(kd, off);
            let a = &a[(4 * s) as usize..(4 * s + 4) as usize];
            k.wgmma(
                self.lanes.input,
                acc,
                WgmmaA::Registers(a),
                desc,
                false,
                if s == 0 {
                    self.lanes.no
                } else {
                    self.lanes.yes
                },
            );
        }
        k.wgmma_commit();
    }

    /// Issues `acc` += A·X once the stage of `step` of ring X (K, or V with `v`) has landed:
    /// A is 64 rows × the block's keys as fragments (`a`, in the accumulator order of
    /// `issue_by_keys`' output), X the stage's keys × D read N-major (transposed by the
    /// descriptor); `acc` is 64 rows × D.
    pub(super) fn issue_over_keys(
        &self,
        k: &mut Kernel,
        step: Reg,
        a: &[Reg],
        v: bool,
        acc: &[Reg],
    ) {
        self.wait_full(k, step, v);
        let (_, _, units) = self.slot(k, step, v);
        let vd = k.add(self.lanes.over_rows[usize::from(v)], units);
        k.wgmma_fence();
        for s in 0..self.blk.bk / 16 {
            let desc = k.desc_offset(vd, 2048 * s);
            let a = &a[(4 * s) as usize..(4 * s + 4) as usize];
            k.wgmma(
                self.lanes.input,
                acc,
                WgmmaA::Registers(a),
                desc,
                true,
                self.lanes.yes,
            );
        }
        k.wgmma_commit();
    }

    /// Sets S to −inf where the block of `step` has keys past the row's length or, causal,
    /// after the row (only in blocks that reach past the warp's first row or the length).
    pub(super) fn mask(&self, k: &mut Kernel, step: Reg) {
        let (bk, blk) = (self.blk.bk, self.blk);
        // The block's first key: the item's blocks are its steps from `step0` on.
        let j = k.sub(step, self.step0);
        let key0 = k.mul(j, bk);
        let key_end = k.add(key0, bk);
        let past_len = k.setp(Cmp::Gt, key_end, self.len);
        let need = if blk.causal {
            let past_row = k.setp(Cmp::Gt, key_end, self.first_row);
            k.or_pred(past_len, past_row)
        } else {
            past_len
        };
        k.if_(need, |k| {
            let key_t = k.add(key0, self.lanes.col2);
            for (i, &r) in self.s_acc.iter().enumerate() {
                let i = i as u32;
                let key = k.add(key_t, 8 * (i / 4) + (i % 2));
                let row = self.rows[((i / 2) % 2) as usize];
                let out = k.setp(Cmp::Ge, key, self.len);
                let bad = if blk.causal {
                    let after = k.setp(Cmp::Gt, key, row);
                    k.or_pred(out, after)
                } else {
                    out
                };
                let v = k.selp(bad, f32::NEG_INFINITY, r, Ty::F32);
                k.assign(r, v);
            }
        });
    }
}

impl Softmax<'_> {
    /// Issues S = Q·Kᵀ for the key block of `step` once its K has landed (one commit group).
    fn scores_issue(&self, c: &Consumer, k: &mut Kernel, step: Reg) {
        c.issue_by_keys(k, step, self.qf, false, c.s_acc);
    }

    /// Issues O += P·V for the key block of `step` once its V has landed.
    fn product_issue(&self, c: &Consumer, k: &mut Kernel, step: Reg) {
        c.issue_over_keys(k, step, self.p_regs, true, self.o_acc);
    }

    /// S of the key block of `step` with no product beside it: issued, waited for, K handed
    /// back, masked; then its softmax, with O rescaled and P in place for its product.
    fn scores_alone(&self, c: &Consumer, k: &mut Kernel, step: Reg) {
        self.scores_issue(c, k, step);
        k.wgmma_wait(0);
        c.release(k, step, false);
        c.mask(k, step);
        let (alpha, probs) = self.probabilities(c, k);
        self.rescale(k, &alpha, &probs);
    }

    /// The `live` key blocks from `step` on in FlashAttention-3's intra-warpgroup order:
    /// block j's S is issued with block j − 1's P·V, and its softmax runs while that
    /// product does. P is packed only after the product's wait: packed before it, ptxas
    /// writes the new P into the registers the running `wgmma` reads and then serializes
    /// every `wgmma` of the kernel (C7513).
    fn pipelined(&self, c: &Consumer, k: &mut Kernel, step: Reg, (live, free): (Reg, Reg)) {
        let any = k.setp(Cmp::Gt, live, 0u32);
        k.if_(any, |k| {
            self.scores_alone(c, k, step);
            k.update("add", step, step, 1u32);
            let block = |k: &mut Kernel, masked: bool| {
                let prev = k.sub(step, 1u32);
                self.scores_issue(c, k, step);
                self.product_issue(c, k, prev);
                k.wgmma_wait(1);
                c.release(k, step, false);
                if masked {
                    c.mask(k, step);
                }
                let (alpha, probs) = self.probabilities(c, k);
                k.wgmma_wait(0);
                c.release(k, prev, true);
                self.rescale(k, &alpha, &probs);
                k.update("add", step, step, 1u32);
            };
            // The blocks no row masks run without the mask's branch: with it inside the
            // loop, ptxas waits for the product before the softmax (no overlap).
            let split = k.max(free, 1u32);
            k.for_range(1u32, split, 1, |k, _| block(k, false));
            k.for_range(split, live, 1, |k, _| block(k, true));
            let prev = k.sub(step, 1u32);
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
            let mut mx = k.mov(Ty::F32, f32::NEG_INFINITY);
            for (i, &r) in c.s_acc.iter().enumerate() {
                if (i / 2) % 2 == h {
                    mx = k.max(mx, r);
                }
            }
            for x in [1u32, 2] {
                let o = k.shfl("bfly", mx, x, 31);
                mx = k.max(mx, o);
            }
            let mx = k.mul(mx, c.lanes.scale2);
            let m_new = k.max(self.m[h], mx);
            // A row with no key yet keeps m = −inf; its exponentials use 0 (all zero).
            let none = k.setp(Cmp::Eq, m_new, f32::NEG_INFINITY);
            let m_use = k.selp(none, 0.0f32, m_new, Ty::F32);
            let diff = k.sub(self.m[h], m_use);
            alpha[h] = k.ex2(diff);
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

    /// Once the last product into O is done: O scaled by the rows' factors, the new P
    /// rounded into place for the next product.
    fn rescale(&self, k: &mut Kernel, alpha: &[Reg; 2], probs: &[Reg]) {
        for (i, &r) in self.o_acc.iter().enumerate() {
            let v = k.mul(r, alpha[(i / 2) % 2]);
            k.assign(r, v);
        }
        // S's accumulator layout is P·V's A layout: registers 8s..8s+7 are k step s.
        let packed = pack(k, self.half2, probs);
        for (&r, &p) in self.p_regs.iter().zip(&packed) {
            k.assign(r, p);
        }
    }
}

/// A 64-row × D operand that stays in registers as `wgmma`'s A fragments for a whole work
/// item (Q; Dq's dO; DkDv's K and V): loaded into `staged`, then copied into `kept`, the
/// registers `wgmma` reads. The forward loads the next item's rows into `staged` while
/// this one runs. (An earlier form of that prefetch made the compiler reuse `kept`'s
/// registers for scratch inside the block loop: wrong results on the H200. The ptxas test
/// checks the SASS for it: bench/results/2026-11-29-native-attention-h200.md.)
pub(super) struct Fragments {
    pub(super) kept: Vec<Reg>,
    staged: Vec<Reg>,
}

impl Fragments {
    pub(super) fn new(k: &mut Kernel, d: u32) -> Fragments {
        Fragments {
            kept: k.regs(Ty::B32, (d / 4) as usize),
            staged: k.regs(Ty::B32, (d / 4) as usize),
        }
    }

    /// This thread's rows (`load_fragments`) of the item at (b, h, row0) of `view`.
    pub(super) fn load(
        &self,
        k: &mut Kernel,
        (lanes, blk): (&Lanes, &Block),
        view: (Reg, Reg, [Reg; 3]),
        at: (Reg, Reg, Reg),
    ) {
        self.fetch(k, (lanes, blk), view, at);
        self.keep(k);
    }

    /// Starts loading the rows of the item at `at` into `staged`.
    fn fetch(
        &self,
        k: &mut Kernel,
        (lanes, blk): (&Lanes, &Block),
        view: (Reg, Reg, [Reg; 3]),
        at: (Reg, Reg, Reg),
    ) {
        let me = (lanes.own_row, lanes.col_bytes);
        load_fragments(k, me, view, at, (blk.t, blk.d), &self.staged);
    }

    /// Copies `staged` into `kept`.
    fn keep(&self, k: &mut Kernel) {
        for (&r, &l) in self.kept.iter().zip(&self.staged) {
            k.assign(r, l);
        }
    }
}

/// A query's L in base 2 and its Dsum, the backward's per-query values, at index `idx` of
/// their [B, H, T] rows (0 where `live` fails): L = −inf (a query with no key) becomes
/// +inf, so that its P = exp2(S · scale − L) is 0.
pub(super) fn query_stats(
    k: &mut Kernel,
    (lse, dsum): (Reg, Reg),
    idx: Reg,
    live: Reg,
) -> (Reg, Reg) {
    let d_at = k.mad_wide(idx, 4u32, dsum);
    (
        query_lse(k, lse, idx, live),
        k.ld_if(live, Space::Global, Ty::F32, Addr::new(d_at), 0.0f32),
    )
}

/// `query_stats`' L alone.
pub(super) fn query_lse(k: &mut Kernel, lse: Reg, idx: Reg, live: Reg) -> Reg {
    let l_at = k.mad_wide(idx, 4u32, lse);
    let l = k.ld_if(live, Space::Global, Ty::F32, Addr::new(l_at), 0.0f32);
    lse_base2(k, l)
}

/// A query's L as the backward uses it: in base 2, +inf where it is −inf (see
/// `query_stats`).
pub(super) fn lse_base2(k: &mut Kernel, l: Reg) -> Reg {
    let none = k.setp(Cmp::Eq, l, f32::NEG_INFINITY);
    let l2 = k.mul(l, std::f32::consts::LOG2_E);
    k.selp(none, f32::INFINITY, l2, Ty::F32)
}

/// Pairs of f32 values in accumulator order, rounded into `half2` registers: the A
/// fragments of the next product (registers 8s..8s+7 are its k step s).
pub(super) fn pack(k: &mut Kernel, half2: Ty, values: &[Reg]) -> Vec<Reg> {
    values
        .chunks(2)
        .map(|c| k.cvt_pack(half2, c[1], c[0]))
        .collect()
}

/// Loads rows q0 + `own_row` and q0 + `own_row` + 8 (at most `t`; zeros past it) of one
/// (b, h) of a strided 16-bit view — (address, element offset, [batch, seq, head] strides) —
/// into `dst` as `wgmma`'s A fragments: four registers a k16 step of the `d` channels, this
/// thread's two columns of each 8 (`col_bytes` in).
pub(super) fn load_fragments(
    k: &mut Kernel,
    (own_row, col_bytes): (Reg, Reg),
    (ptr, off, [sb, st, sh]): (Reg, Reg, [Reg; 3]),
    (b, h, q0): (Reg, Reg, Reg),
    (t, d): (Reg, u32),
    dst: &[Reg],
) {
    for half in 0..2u32 {
        let row = k.add(q0, own_row);
        let row = k.add(row, 8 * half);
        let ok = k.setp(Cmp::Lt, row, t);
        let e = k.cvt(Ty::U64, off);
        let e = k.mad_wide(h, sh, e);
        let e = k.mad_wide(b, sb, e);
        let e = k.mad_wide(row, st, e);
        let bytes = k.shl(e, 1u32);
        let at = k.add(ptr, bytes);
        let at = k.add(at, col_bytes);
        for s in 0..d / 16 {
            for (i, col) in [(0u32, 0u32), (2, 8)] {
                let r = dst[(4 * s + i + half) as usize];
                k.assign(r, 0u32);
                let a = Addr::at(at, i64::from((16 * s + col) * 2));
                k.ld_into_if(ok, Space::Global, r, a);
            }
        }
    }
}

/// What every consumer thread of the native kernels computes once: its operand types, its
/// place in `wgmma`'s accumulator layout (warpgroup, rows, columns), the scale in base 2,
/// two predicates and the rings' descriptors.
pub(super) struct Lanes {
    pub(super) input: MmaInput,
    pub(super) half2: Ty,
    pub(super) wg: Reg,
    /// The warp's first row within a tile, and this thread's (`g`: lane / 4).
    pub(super) warp_row: Reg,
    pub(super) own_row: Reg,
    /// Lane % 4, its first column of each 8 (2 · lane % 4), and that in bytes (u64).
    pub(super) tq: Reg,
    pub(super) col2: Reg,
    pub(super) col_bytes: Reg,
    pub(super) scale2: Reg,
    pub(super) zero: Reg,
    pub(super) yes: Reg,
    pub(super) no: Reg,
    /// Each ring's first stage (K, V; DkDv's Q, dO) read K-major (its rows × D as the B
    /// of A·Xᵀ) and N-major (as the B of A·X).
    pub(super) by_rows: [Reg; 2],
    pub(super) over_rows: [Reg; 2],
}

impl Lanes {
    /// This thread's two rows of the tile at `row0`, and whether each is inside T.
    pub(super) fn rows(&self, k: &mut Kernel, blk: &Block, row0: Reg) -> ([Reg; 2], [Reg; 2]) {
        let rows = [k.add(row0, self.own_row), k.add(row0, self.own_row)];
        k.update("add", rows[1], rows[1], 8u32);
        let ok = [
            k.setp(Cmp::Lt, rows[0], blk.t),
            k.setp(Cmp::Lt, rows[1], blk.t),
        ];
        (rows, ok)
    }

    pub(super) fn new(k: &mut Kernel, kern: &AttentionKernel, blk: &Block, p: &Params) -> Lanes {
        let (input, half2) = match kern.storage {
            Storage::F16 => (MmaInput::F16, Ty::F16x2),
            _ => (MmaInput::BF16, Ty::BF16x2),
        };
        let AccThread {
            warpgroup: wg,
            warp,
            row: g,
            pair: tq,
        } = k.wgmma_thread(blk.tid);
        // Warpgroups own 64 rows each, or all the same 64 where they split roles.
        let warp_row = if blk.split {
            k.mul(warp, 16u32)
        } else {
            let r = k.mul(wg, WG_ROWS);
            k.mad(warp, 16u32, r)
        };
        let own_row = k.add(warp_row, g);
        let col2 = k.shl(tq, 1u32);
        let col_bytes = {
            let c = k.cvt(Ty::U64, col2);
            k.shl(c, 1u32)
        };
        let scale2 = k.mul(p.scale, std::f32::consts::LOG2_E);
        let zero = k.mov(Ty::U32, 0u32);
        let yes = k.setp(Cmp::Eq, zero, 0u32);
        let no = k.setp(Cmp::Ne, zero, 0u32);
        let by = MatrixDesc {
            swizzle: Swizzle::B128,
            lbo: 16,
            sbo: 1024,
        };
        let over = MatrixDesc {
            swizzle: Swizzle::B128,
            lbo: blk.bk * 128,
            sbo: 1024,
        };
        let by_rows = [blk.k_base, blk.v_base].map(|b| k.wgmma_desc(b, &by));
        let over_rows = [blk.k_base, blk.v_base].map(|b| k.wgmma_desc(b, &over));
        Lanes {
            input,
            half2,
            wg,
            warp_row,
            own_row,
            tq,
            col2,
            col_bytes,
            scale2,
            zero,
            yes,
            no,
            by_rows,
            over_rows,
        }
    }
}

/// Key blocks of item `it` that warpgroup `wg` computes: a causal warpgroup needs those up
/// to its last row, the rest of the tile's it only hands back.
pub(super) fn live_blocks(k: &mut Kernel, blk: &Block, it: &Item, wg: Reg) -> Reg {
    let own = if blk.causal {
        let r = k.mad(wg, WG_ROWS, it.row0);
        let e = k.add(r, WG_ROWS);
        let e = k.min(e, it.len);
        let e = k.add(e, blk.bk - 1);
        k.div(e, blk.bk)
    } else {
        it.blocks
    };
    k.min(own, it.blocks)
}

/// The leading key blocks of item `it` (of its `live`) that no row of warpgroup `wg`
/// masks: those before the batch row's length and, causal, before the warpgroup's first
/// row (`Consumer::mask`).
pub(super) fn unmasked_blocks(k: &mut Kernel, blk: &Block, it: &Item, wg: Reg, live: Reg) -> Reg {
    let end = if blk.causal {
        let first = k.mad(wg, WG_ROWS, it.row0);
        k.min(first, it.len)
    } else {
        it.len
    };
    let n = k.div(end, blk.bk);
    k.min(n, live)
}

/// Stores this thread's two rows of the 64 × D accumulators `acc`, each times its row's
/// `factor`, rounded to the input type, into the [B, T, ·, H, D] output at `out`: rows
/// `row_heads` heads apart (H dense, 3H for the packed gradient), `slice` · H · D into a
/// row (the packed gradient's part; 0 dense). Rows past T are not stored.
pub(super) fn store_rows(
    k: &mut Kernel,
    (lanes, blk, it): (&Lanes, &Block, &Item),
    (rows, ok): ([Reg; 2], [Reg; 2]),
    (acc, factor): (&[Reg], [Reg; 2]),
    (out, row_heads, slice): (Reg, Reg, u32),
) {
    for h in 0..2usize {
        let bt = k.mad(it.b, blk.t, rows[h]);
        let bth = k.mad(bt, row_heads, it.h);
        let bth = match slice {
            0 => bth,
            s => k.mad(blk.heads, s, bth),
        };
        let e = k.mul_wide(bth, blk.d);
        let c = k.cvt(Ty::U64, lanes.col2);
        let e = k.add(e, c);
        let bytes = k.shl(e, 1u32);
        let at = k.add(out, bytes);
        for jb in 0..blk.d / 8 {
            let i = (4 * jb) as usize + 2 * h;
            let lo = k.mul(acc[i], factor[h]);
            let hi = k.mul(acc[i + 1], factor[h]);
            let v = k.cvt_pack(lanes.half2, hi, lo);
            k.st_if(ok[h], Space::Global, Addr::at(at, i64::from(16 * jb)), v);
        }
    }
}

/// Hands back, unread, the blocks `from..to` of an item that this warpgroup does not
/// compute: both rings' stages released, in `order` (false: the first ring).
pub(super) fn hand_back(
    k: &mut Kernel,
    c: &Consumer,
    step: Reg,
    (from, to): (Reg, Reg),
    order: [bool; 2],
) {
    k.comment("blocks past this warpgroup's rows: handed back unread");
    k.for_range(from, to, 1, |k, _| {
        for v in order {
            c.wait_full(k, step, v);
            c.release(k, step, v);
        }
        k.update("add", step, step, 1u32);
    });
}
