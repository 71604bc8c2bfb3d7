//! The consumer warpgroups of the native DkDv: per tile of keys, K and V in registers
//! (each warpgroup 64 keys), then per block of queries — Q and dO from the rings —
//! Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, Pᵀ = exp(Sᵀ − L), dSᵀ = Pᵀ ∘ (dPᵀ − Dsum), dV += Pᵀ·dO and
//! dK += dSᵀ·Q on `wgmma`; then dK · scale and dV. Computing the transposes directly puts
//! Pᵀ and dSᵀ in the accumulator layout that is the A layout of the next products, as
//! FlashAttention-3 does. Sᵀ's exponentials run while dPᵀ's product does, and dSᵀ while
//! dV's. No atomics: each tile owns its dK and dV rows. The queries' L and
//! Dsum reach each warp through shared memory, a block ahead (`Stats`).
//!
//! Past one panel one warpgroup cannot hold K, V, dK and dV (~256 registers a thread at 128):
//! there the two warpgroups share one tile of 64 keys (`split_roles`). One holds K and
//! computes Sᵀ, Pᵀ and dV; the other holds V and computes dPᵀ, dSᵀ and dK, with the first's
//! Pᵀ handed over in shared memory (two named barriers): two products each.

use helios_ptx::{Addr, Cmp, Kernel, Reg, Space, Ty};

use super::block::{Block, Item, Params};
use super::consumer::{lse_base2, pack, store_rows, Consumer, Fragments, Lanes};
use super::{AttentionKernel, P_EMPTY, P_FULL, WG_ROWS, WG_THREADS};

/// What a consumer warpgroup accumulates.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Both,
    Dv,
    Dk,
}

/// DkDv's consumer warpgroups (see the module docs): each does both, or with split roles
/// warpgroup 0 dV and warpgroup 1 dK (two code paths, so that each has its own registers).
pub(super) fn consumer(k: &mut Kernel, kern: &AttentionKernel, blk: &Block, p: &Params) {
    let lanes = Lanes::new(k, kern, blk, p);
    if !blk.split {
        return roles(k, kern, (blk, p, &lanes), Role::Both);
    }
    let (dk_role, done) = (k.label(), k.label());
    let second = k.setp(Cmp::Ne, lanes.wg, 0u32);
    k.bra_if(second, false, dk_role);
    roles(k, kern, (blk, p, &lanes), Role::Dv);
    k.bra(done);
    k.place(dk_role);
    roles(k, kern, (blk, p, &lanes), Role::Dk);
    k.place(done);
}

/// One warpgroup's walk over its tiles of keys, accumulating what `role` says.
fn roles(
    k: &mut Kernel,
    kern: &AttentionKernel,
    (blk, p, lanes): (&Block, &Params, &Lanes),
    role: Role,
) {
    let grad = p.grad.as_ref().expect("DkDv's parameters");
    let dv_out = grad.dv.expect("DkDv's dV");
    let w = Warpgroup::new(k, (blk, p, lanes), role);
    let k_view = (p.k, p.offs[1], p.strides);
    let v_view = (p.v, p.offs[2], p.strides);

    blk.for_each_item(k, |k, it| {
        // This thread's two key rows.
        let (rows, ok) = lanes.rows(k, blk, it.row0);
        let bh = k.mad(it.b, blk.heads, it.h);
        let row_base = k.mul(bh, blk.t);
        let any = k.setp(Cmp::Gt, it.blocks, 0u32);
        let first = w.stats.fetch(k, row_base, it.first, any);
        k.comment("K and V rows in registers: wgmma's A fragments");
        let at = (it.b, it.h, it.row0);
        if let Some(kf) = &w.kf {
            kf.load(k, (lanes, blk), k_view, at);
        }
        if let Some(vf) = &w.vf {
            vf.load(k, (lanes, blk), v_view, at);
        }
        for &r in w.dk_acc.iter().chain(&w.dv_acc) {
            k.assign(r, 0.0f32);
        }
        w.stats.stage(k, &first);
        // The warp's last key: blocks of queries before it need the causal mask.
        let warp_last = k.add(it.row0, lanes.warp_row);
        let warp_last = k.add(warp_last, 15u32);
        let tile_end = k.add(it.row0, blk.bq);
        let past_len = k.setp(Cmp::Gt, tile_end, it.len);
        let c = Consumer {
            lanes,
            blk,
            s_acc: &w.st_acc,
            rows,
            first_row: warp_last,
            len: it.len,
            step0: k.mov(Ty::U32, w.step),
        };
        let keys = Keys {
            it,
            row_base,
            past_len,
        };

        k.comment("query blocks: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q");
        if w.pipelined {
            // The blocks no key of this warpgroup masks run without the mask: with it, or
            // any branch, inside the loop ptxas waits for dPᵀ before the exponentials.
            let (head, tail) = unmasked(k, blk, it, lanes.wg);
            k.for_range(0u32, head, 1, |k, j| w.block(k, (&c, &keys), j, true));
            k.for_range(head, tail, 1, |k, j| w.block(k, (&c, &keys), j, false));
            k.for_range(tail, it.blocks, 1, |k, j| w.block(k, (&c, &keys), j, true));
        } else {
            k.for_range(0u32, it.blocks, 1, |k, j| w.block(k, (&c, &keys), j, true));
        }

        k.comment("epilogue: dK scaled, dV, rounded, stored");
        // Dense [B, T, H, D], or the second and third slices of a packed [B, T, 3, H, D].
        let row_heads = if kern.packed {
            k.mul(blk.heads, 3u32)
        } else {
            k.mov(Ty::U32, blk.heads)
        };
        let one = k.mov(Ty::F32, 1.0f32);
        let place = (lanes, blk, it);
        for (n, (acc, out, factor)) in [(&w.dk_acc, p.o, p.scale), (&w.dv_acc, dv_out, one)]
            .into_iter()
            .enumerate()
            .filter(|(_, (acc, ..))| !acc.is_empty())
        {
            let slice = if kern.packed { n as u32 + 1 } else { 0 };
            let to = (out, row_heads, slice);
            store_rows(k, place, (rows, ok), (acc, [factor; 2]), to);
        }
    });
    if let (Some(_), Role::Dv) = (w.exchange, role) {
        // The dK warpgroup read the last Pᵀ too: take its arrival, leaving no barrier
        // half met when the block exits.
        let any = k.setp(Cmp::Gt, w.step, 0u32);
        k.if_(any, |k| k.bar_sync_n(P_EMPTY, 2 * WG_THREADS));
    }
}

/// One consumer warpgroup of DkDv: its role, its accumulators and operands, and its k step.
struct Warpgroup<'a> {
    blk: &'a Block,
    lanes: &'a Lanes,
    role: Role,
    /// One warpgroup doing both runs FlashAttention-3's order inside a block (Sᵀ's
    /// exponentials beside dPᵀ, dSᵀ beside dV's product); split roles stay in order.
    pipelined: bool,
    /// Sᵀ and dPᵀ (keys × the block's queries), dK and dV (keys × D): each empty where the
    /// role does not compute it.
    st_acc: Vec<Reg>,
    dpt_acc: Vec<Reg>,
    dk_acc: Vec<Reg>,
    dv_acc: Vec<Reg>,
    /// K's rows (the dV role's), V's (the dK role's).
    kf: Option<Fragments>,
    vf: Option<Fragments>,
    /// Split roles: this thread's Pᵀ values in the exchange, register i at i · 128 threads.
    exchange: Option<Reg>,
    stats: Stats,
    step: Reg,
}

/// What a block of queries needs of its item: the item, its [B, H, T] row base, and
/// whether its tile reaches past the batch row's length.
struct Keys<'a> {
    it: &'a Item,
    row_base: Reg,
    past_len: Reg,
}

impl<'a> Warpgroup<'a> {
    fn new(
        k: &mut Kernel,
        (blk, p, lanes): (&'a Block, &Params, &'a Lanes),
        role: Role,
    ) -> Warpgroup<'a> {
        let (dv_role, dk_role) = (role != Role::Dk, role != Role::Dv);
        let (bk, d) = (blk.bk, blk.d);
        let regs =
            |k: &mut Kernel, on: bool, n: u32| k.regs(Ty::F32, if on { n as usize } else { 0 });
        Warpgroup {
            blk,
            lanes,
            role,
            pipelined: role == Role::Both,
            st_acc: regs(k, dv_role, bk / 2),
            dpt_acc: regs(k, dk_role, bk / 2),
            dk_acc: regs(k, dk_role, blk.width() / 2),
            dv_acc: regs(k, dv_role, blk.width() / 2),
            kf: dv_role.then(|| Fragments::new(k, d)),
            vf: dk_role.then(|| Fragments::new(k, d)),
            exchange: blk.exchange.map(|x| {
                let t = k.and(blk.tid, 127u32).retype(Ty::U32);
                k.mad(t, 4u32, x)
            }),
            step: k.mov(Ty::U32, 0u32),
            stats: Stats::new(k, (blk, p), lanes),
        }
    }

    /// Block `j` of the item's blocks of queries: Sᵀ and dPᵀ, Pᵀ (masked where `masked`)
    /// and dSᵀ, then dV += Pᵀ·dO and dK += dSᵀ·Q; its stages go back at the end.
    fn block(&self, k: &mut Kernel, (c, keys): (&Consumer, &Keys), j: Reg, masked: bool) {
        let (blk, lanes, it, step) = (self.blk, self.lanes, keys.it, self.step);
        let (dv_role, dk_role) = (self.role != Role::Dk, self.role != Role::Dv);
        let bk = blk.bk;
        let block = k.add(it.first, j);
        let q0 = k.mul(block, bk);
        let col0 = k.add(q0, lanes.col2);
        let (lse2, dsum) = self.stats.read(k);
        // The next block's, on their way while this one's products run.
        let after = k.add(j, 1u32);
        let more = k.setp(Cmp::Lt, after, it.blocks);
        let next = k.add(block, 1u32);
        let next = self.stats.fetch(k, keys.row_base, next, more);
        if let Some(kf) = &self.kf {
            c.issue_by_keys(k, step, &kf.kept, false, &self.st_acc);
        }
        if let Some(vf) = &self.vf {
            c.issue_by_keys(k, step, &vf.kept, true, &self.dpt_acc);
        }
        // In order, both products are waited for here; pipelined, only Sᵀ, and the
        // exponentials run beside dPᵀ.
        k.wgmma_wait(if self.pipelined { 1 } else { 0 });
        if masked {
            // (Empty in the dK warpgroup of split roles: its Pᵀ comes masked.) In order,
            // only where this warp meets a masked pair; pipelined, without a branch.
            let need = (!self.pipelined).then(|| {
                let q_end = k.add(q0, bk);
                let past_t = k.setp(Cmp::Gt, q_end, blk.t);
                let need = k.or_pred(past_t, keys.past_len);
                if blk.causal {
                    let early = k.setp(Cmp::Lt, q0, c.first_row);
                    k.or_pred(need, early)
                } else {
                    need
                }
            });
            mask(k, &self.st_acc, need, (col0, c.rows, it.len, blk));
        }
        // The dK warpgroup's Pᵀ is the dV warpgroup's.
        let received = match (self.exchange, self.role) {
            (Some(x), Role::Dk) => Some(receive(k, x, (bk / 2) as usize)),
            _ => None,
        };
        // Column i of the accumulator layout: register i is query 8(i / 4) + 2q + i % 2
        // of the block, the (i / 4 · 2 + i % 2)-th this thread holds.
        let col = |i: usize| (i / 4) * 2 + i % 2;
        let pt: Vec<Reg> = match received {
            Some(pt) => pt,
            None if dv_role => (0..(bk / 2) as usize)
                .map(|i| {
                    let x = k.mul(self.st_acc[i], lanes.scale2);
                    let x = k.sub(x, lse2[col(i)]);
                    k.ex2(x)
                })
                .collect(),
            None => Vec::new(),
        };
        if let (Some(x), Role::Dv) = (self.exchange, self.role) {
            send(k, x, &pt, step);
        }
        if self.pipelined {
            // dV's product runs while dSᵀ is computed.
            let pf = pack(k, lanes.half2, &pt);
            c.issue_over_keys(k, step, &pf, (true, None), &self.dv_acc);
            k.wgmma_wait(1);
        }
        let dst: Vec<Reg> = if dk_role {
            (0..(bk / 2) as usize)
                .map(|i| {
                    let diff = k.sub(self.dpt_acc[i], dsum[col(i)]);
                    k.mul(pt[i], diff)
                })
                .collect()
        } else {
            Vec::new()
        };
        if !self.pipelined && dv_role {
            let pf = pack(k, lanes.half2, &pt);
            c.issue_over_keys(k, step, &pf, (true, None), &self.dv_acc);
        }
        if dk_role {
            let dsf = pack(k, lanes.half2, &dst);
            c.issue_over_keys(k, step, &dsf, (false, None), &self.dk_acc);
        }
        k.wgmma_wait(0);
        c.release(k, step, false);
        c.release(k, step, true);
        self.stats.stage(k, &next);
        k.update("add", step, step, 1u32);
    }
}

/// Sets Sᵀ to −inf where the query (column) is past T, the key (row) past the length or,
/// causal, after the query: where `need` holds, or everywhere without it.
fn mask(
    k: &mut Kernel,
    st_acc: &[Reg],
    need: Option<Reg>,
    (col0, rows, len, blk): (Reg, [Reg; 2], Reg, &Block),
) {
    let apply = |k: &mut Kernel| {
        for (i, &r) in st_acc.iter().enumerate() {
            let i = i as u32;
            let q = k.add(col0, 8 * (i / 4) + (i % 2));
            let key = rows[((i / 2) % 2) as usize];
            let out = k.setp(Cmp::Ge, q, blk.t);
            let gone = k.setp(Cmp::Ge, key, len);
            let bad = k.or_pred(out, gone);
            let bad = if blk.causal {
                let after = k.setp(Cmp::Gt, key, q);
                k.or_pred(bad, after)
            } else {
                bad
            };
            let v = k.selp(bad, f32::NEG_INFINITY, r, Ty::F32);
            k.assign(r, v);
        }
    };
    match need {
        Some(need) => k.if_(need, apply),
        None => apply(k),
    }
}

/// The item's blocks of queries that no key of warpgroup `wg` masks, as the range
/// `head..tail` of its `blocks`: none if the tile reaches past the length; else, causal,
/// from the first block that starts at or after the warpgroup's last key, up to a last block
/// that reaches past T.
fn unmasked(k: &mut Kernel, blk: &Block, it: &Item, wg: Reg) -> (Reg, Reg) {
    let head = if blk.causal {
        let key0 = k.mad(wg, WG_ROWS, it.row0);
        // Blocks starting before the last key, 63 past the first.
        let e = k.add(key0, WG_ROWS - 1 + blk.bk - 1);
        let before = k.div(e, blk.bk);
        let n = k.max(before, it.first);
        let n = k.sub(n, it.first);
        k.min(n, it.blocks)
    } else {
        k.mov(Ty::U32, 0u32)
    };
    let tile_end = k.add(it.row0, blk.bq);
    let past_len = k.setp(Cmp::Gt, tile_end, it.len);
    let head = k.selp(past_len, it.blocks, head, Ty::U32);
    // A last block past T is masked.
    let rem = k.rem(blk.t, blk.bk);
    let ragged = k.setp(Cmp::Ne, rem, 0u32);
    let partial = k.selp(ragged, 1u32, 0u32, Ty::U32);
    // (An item with no blocks has no partial one either.)
    let partial = k.min(partial, it.blocks);
    let tail = k.sub(it.blocks, partial);
    let tail = k.max(tail, head);
    (head, tail)
}

/// The dV warpgroup's side of the exchange: waits until the dK warpgroup has read the
/// previous block's Pᵀ (none before the first), writes this one's, and signals it.
fn send(k: &mut Kernel, at: Reg, pt: &[Reg], step: Reg) {
    k.comment("P^T to the dK warpgroup");
    let any = k.setp(Cmp::Gt, step, 0u32);
    k.if_(any, |k| k.bar_sync_n(P_EMPTY, 2 * WG_THREADS));
    for (i, &v) in pt.iter().enumerate() {
        k.st(Space::Shared, Addr::at(at, 512 * i as i64), v);
    }
    k.bar_arrive_n(P_FULL, 2 * WG_THREADS);
}

/// The dK warpgroup's side: waits for the dV warpgroup's Pᵀ of this block, reads its `n`
/// values, and frees the exchange.
fn receive(k: &mut Kernel, at: Reg, n: usize) -> Vec<Reg> {
    k.comment("P^T from the dV warpgroup");
    k.bar_sync_n(P_FULL, 2 * WG_THREADS);
    let pt = (0..n)
        .map(|i| k.ld(Space::Shared, Ty::F32, Addr::at(at, 512 * i as i64)))
        .collect();
    k.bar_arrive_n(P_EMPTY, 2 * WG_THREADS);
    pt
}

/// L and Dsum of a block of queries, as this warp's lanes need them. Every lane needs the
/// 2 · `bk` / 4 values of its own query columns; instead of loading those (32 loads a lane a
/// block at `bk` = 64, which cost a fifth of DkDv's time), the warp's lanes load the block's
/// values once between them, a block ahead, and read their columns from the warp's copy in
/// shared memory.
struct Stats {
    bk: u32,
    /// T, and the [B, H, T] rows of L and Dsum.
    t: Reg,
    lse: Reg,
    dsum: Reg,
    lane: Reg,
    /// This warp's copy: L (base 2) at 4 · q, Dsum at 4 · (`bk` + q), q the block's query.
    area: Reg,
    /// This thread's first pair of columns (2 · lane % 4) in `area`.
    reader: Reg,
}

impl Stats {
    fn new(k: &mut Kernel, (blk, p): (&Block, &Params), lanes: &Lanes) -> Stats {
        let bk = blk.bk;
        let grad = p.grad.as_ref().expect("DkDv's parameters");
        let lane = k.and(blk.tid, 31u32).retype(Ty::U32);
        let warp = k.shr(blk.tid, 5u32);
        let base = blk.stats.expect("DkDv's statistics area");
        let area = k.mad(warp, 8 * bk, base);
        let reader = k.mad(lanes.tq, 8u32, area);
        Stats {
            bk,
            t: blk.t,
            lse: p.lse,
            dsum: grad.dsum,
            lane,
            area,
            reader,
        }
    }

    /// Starts loading this lane's share of query block `block`'s L and Dsum (queries
    /// 32e + lane of the block, rows from `row_base` on) where `valid` holds and the query is
    /// inside T, 0 elsewhere. (A block of 16 queries has lanes with none: `stage` skips them.)
    fn fetch(&self, k: &mut Kernel, row_base: Reg, block: Reg, valid: Reg) -> Vec<[Reg; 2]> {
        let q0 = k.mad(block, self.bk, self.lane);
        (0..self.bk.div_ceil(32))
            .map(|e| {
                let q = k.add(q0, 32 * e);
                let inside = k.setp(Cmp::Lt, q, self.t);
                let live = k.and_pred(inside, valid);
                let idx = k.add(row_base, q);
                [self.lse, self.dsum].map(|from| {
                    let at = k.mad_wide(idx, 4u32, from);
                    k.ld_if(live, Space::Global, Ty::F32, Addr::new(at), 0.0f32)
                })
            })
            .collect()
    }

    /// Writes fetched values into the warp's copy, once every lane has read the last.
    fn stage(&self, k: &mut Kernel, fetched: &[[Reg; 2]]) {
        k.warp_sync();
        let mine = k.mad(self.lane, 4u32, self.area);
        let owner = (self.bk < 32).then(|| k.setp(Cmp::Lt, self.lane, self.bk));
        let store = |k: &mut Kernel, at: i64, v: Reg| match owner {
            Some(p) => k.st_if(p, Space::Shared, Addr::at(mine, at), v),
            None => k.st(Space::Shared, Addr::at(mine, at), v),
        };
        for (e, &[l, dsum]) in fetched.iter().enumerate() {
            let l2 = lse_base2(k, l);
            let at = 128 * e as i64;
            store(k, at, l2);
            store(k, at + 4 * i64::from(self.bk), dsum);
        }
        k.warp_sync();
    }

    /// This thread's L and Dsum, in the order of its accumulator columns: query
    /// 8(c / 2) + 2 · lane % 4 + c % 2 at index c.
    fn read(&self, k: &mut Kernel) -> (Vec<Reg>, Vec<Reg>) {
        let mut lse2 = Vec::with_capacity((self.bk / 4) as usize);
        let mut dsum = Vec::with_capacity((self.bk / 4) as usize);
        for m in 0..i64::from(self.bk / 8) {
            let l = k.ld_v(Space::Shared, Ty::F32, 2, Addr::at(self.reader, 32 * m));
            let at = Addr::at(self.reader, 32 * m + 4 * i64::from(self.bk));
            let d = k.ld_v(Space::Shared, Ty::F32, 2, at);
            lse2.extend(l);
            dsum.extend(d);
        }
        (lse2, dsum)
    }
}
