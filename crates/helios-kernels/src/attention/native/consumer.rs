//! What every consumer warpgroup of the native kernels shares (the forward's in `forward`,
//! Dq's in `dq`, DkDv's in `dkdv`): its place in `wgmma`'s layouts (`Lanes`), its key-block
//! steps over the rings (`Consumer`), operands kept in registers (`Fragments`), and the
//! loads, stores and block counts around them.

use helios_ptx::{
    AccThread, Addr, Cmp, Kernel, MatrixDesc, MmaInput, Reg, Space, Swizzle, Ty, WgmmaA,
};

use super::block::{Block, Item, Params};
use super::{AttentionKernel, Storage, TURN_BARS, WG_ROWS, WG_THREADS};

/// What one consumer warpgroup's key-block steps share in every native kernel (see
/// `forward`, `dq`, `dkdv`): the rings, the score accumulators and their mask.
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
    /// descriptor); `acc` is 64 rows × D (`Block::width`), or from channel `cols` on (a
    /// multiple of 64) as many as it holds.
    pub(super) fn issue_over_keys(
        &self,
        k: &mut Kernel,
        step: Reg,
        a: &[Reg],
        (v, cols): (bool, Option<Reg>),
        acc: &[Reg],
    ) {
        self.wait_full(k, step, v);
        let (_, _, units) = self.slot(k, step, v);
        let vd = k.add(self.lanes.over_rows[usize::from(v)], units);
        // Panel c / 64 starts c / 64 · bk · 128 bytes into the stage: c · bk / 8 units.
        let vd = match cols {
            Some(c) => {
                let u = k.mul(c, self.blk.bk / 8);
                let u = k.cvt(Ty::U64, u);
                k.add(vd, u)
            }
            None => vd,
        };
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
    pub(super) fn fetch(
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
    pub(super) fn keep(&self, k: &mut Kernel) {
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
        let n = {
            let e = k.min(e, it.len);
            let e = k.add(e, blk.bk - 1);
            k.div(e, blk.bk)
        };
        match blk.shift {
            // A warpgroup whose rows all lie before 0 (`Block::shift`) computes nothing.
            Some(_) => {
                let dead = k.setp(Cmp::Le, e.retype(Ty::S32), 0i32);
                k.selp(dead, 0u32, n, Ty::U32)
            }
            None => n,
        }
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
/// row (the packed gradient's part; 0 dense). Rows past T and channels past D are not
/// stored. Where the item splits D (`Item::cols`), `acc` holds its part's channels.
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
        let c = match it.cols {
            Some(c0) => k.add(lanes.col2, c0),
            None => lanes.col2,
        };
        let c = k.cvt(Ty::U64, c);
        let e = k.add(e, c);
        let bytes = k.shl(e, 1u32);
        let at = k.add(out, bytes);
        let groups = match it.cols {
            Some(_) => acc.len() as u32 / 4,
            None => blk.d / 8,
        };
        for jb in 0..groups {
            let i = (4 * jb) as usize + 2 * h;
            let lo = k.mul(acc[i], factor[h]);
            let hi = k.mul(acc[i + 1], factor[h]);
            let v = k.cvt_pack(lanes.half2, hi, lo);
            // Where the item's part of D is known only at run time, so is its end.
            let store = match it.cols {
                Some(c0) => {
                    let col = k.add(c0, 8 * jb);
                    let inside = k.setp(Cmp::Lt, col, blk.d);
                    k.and_pred(inside, ok[h])
                }
                None => ok[h],
            };
            k.st_if(store, Space::Global, Addr::at(at, i64::from(16 * jb)), v);
        }
    }
}

/// Hands back, unread, the blocks `from..to` of an item that this warpgroup does not
/// compute: both rings' stages released, in `order` (false: the first ring), each block's
/// turn taken and passed on where the warpgroups take turns.
pub(super) fn hand_back(
    k: &mut Kernel,
    c: &Consumer,
    step: Reg,
    (from, to): (Reg, Reg),
    order: [bool; 2],
    turns: Option<&Turns>,
) {
    k.comment("blocks past this warpgroup's rows: handed back unread");
    k.for_range(from, to, 1, |k, _| {
        if let Some(t) = turns {
            t.take(k);
            t.pass(k);
        }
        for v in order {
            c.wait_full(k, step, v);
            c.release(k, step, v);
        }
        k.update("add", step, step, 1u32);
    });
}

/// FlashAttention-3's ping-pong: the warpgroups issue their key blocks' products in turns,
/// in a fixed cycle, so that one's softmax runs while the others' products do instead of
/// all three at once. Warpgroup w waits at named barrier `TURN_BARS + w` until every other
/// has passed its previous turn (`take`), issues, then arrives at the others' (`pass`).
/// Every warpgroup takes one turn a key block of every item, computed or handed back, so
/// the cycle never loses a step.
pub(super) struct Turns {
    own: Reg,
    others: Vec<Reg>,
    threads: u32,
}

impl Turns {
    /// The turns of `groups` warpgroups, warpgroup 0's first: each warpgroup arrives once
    /// at the barriers of those before it.
    pub(super) fn new(k: &mut Kernel, wg: Reg, groups: u32) -> Turns {
        let own = k.add(wg, TURN_BARS);
        let others = (1..groups)
            .map(|i| {
                let w = k.add(wg, i);
                let w = k.rem(w, groups);
                k.add(w, TURN_BARS)
            })
            .collect();
        let threads = groups * WG_THREADS;
        debug_assert!(TURN_BARS + groups <= 16, "named barriers run out at 16");
        for before in 0..groups - 1 {
            let after = k.setp(Cmp::Gt, wg, before);
            k.if_(after, |k| k.bar_arrive_n(TURN_BARS + before, threads));
        }
        Turns {
            own,
            others,
            threads,
        }
    }

    pub(super) fn take(&self, k: &mut Kernel) {
        k.bar_sync_reg(self.own, self.threads);
    }

    pub(super) fn pass(&self, k: &mut Kernel) {
        for &id in &self.others {
            k.bar_arrive_reg(id, self.threads);
        }
    }
}
