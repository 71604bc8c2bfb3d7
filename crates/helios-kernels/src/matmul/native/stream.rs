//! Stream-K order: a grid of one block per SM takes equal shares of all the k steps of all
//! the output tiles, so a product of fewer tiles than SMs (a weight gradient: 24 to 96
//! tiles on 132 SMs) keeps every SM busy.
//!
//! Block `b` of `G` runs iterations `[b·W/G, (b+1)·W/G)` of the `W = tiles · KT` k steps,
//! tile after tile (`KT` k steps a tile), so a tile's k range may be split between
//! consecutive blocks. Their parts are added in a fixed order, highest block first, so a
//! product's result does not depend on timing: the block holding a tile's last k steps
//! (the tail) stores its part in f32 to a slot of the workspace and raises the tile's flag;
//! each block below it waits until the flag counts the blocks above it, adds the slot to
//! its accumulators and, unless it holds the tile's first k steps (the head), stores the
//! sum back and raises the flag. The head's block runs the epilogue and clears the flag
//! for the next launch. A block waits only at its last piece of work, and only for blocks
//! above it, which never wait at their first: there is no cycle to deadlock on, and a block
//! not yet resident only delays those below it.
//!
//! The slot and flag of a split tile are those of its head's block, the only one that
//! holds that tile's head. A slot keeps each consumer thread's accumulators 16 bytes at a
//! time, interleaved across threads so that a warp's access is 512 contiguous bytes.

use helios_ptx::{Addr, Cmp, Kernel, Reg, Special, Ty};

use crate::native_maps::{STREAM_FLAGS_BYTES, STREAM_SLOT_BYTES};

/// One piece of a block's work: `count` k tiles from `first` of output tile `tile`, whose
/// first row and column are `m0`, `n0`.
#[derive(Clone, Copy)]
pub(super) struct Piece {
    pub(super) m0: Reg,
    pub(super) n0: Reg,
    pub(super) tile: Reg,
    pub(super) first: Reg,
    pub(super) count: Reg,
}

/// What the block's pieces need: the grid, the iteration space and the workspace.
pub(super) struct Stream {
    /// This block and the grid's blocks (u32).
    block: Reg,
    blocks: Reg,
    /// k tiles a tile, and in all (u32).
    kt: Reg,
    total: Reg,
    /// Workspace addresses of the flags and the slots (u64).
    flags: Reg,
    slots: Reg,
}

impl Stream {
    /// The block's share of the `tiles` output tiles of `kt` k tiles each; `workspace` is
    /// the native workspace's address (`native_maps`).
    pub(super) fn new(k: &mut Kernel, tiles: Reg, kt: Reg, workspace: Reg) -> Stream {
        let block = k.special(Special::CtaIdX);
        let blocks = k.special(Special::NCtaIdX);
        let total = k.mul(tiles, kt);
        let flags = k.add(workspace, crate::native_maps::NATIVE_MAPS_BYTES as i64);
        let slots = k.add(flags, STREAM_FLAGS_BYTES as i64);
        Stream {
            block,
            blocks,
            kt,
            total,
            flags,
            slots,
        }
    }

    /// The first iteration of block `b` (a u32 register), `b·W/G`.
    fn start_of(&self, k: &mut Kernel, b: Reg) -> Reg {
        let x = k.mul_wide(b, self.total);
        let g = k.cvt(Ty::U64, self.blocks);
        let x = k.div(x, g);
        k.cvt(Ty::U32, x)
    }

    /// The block whose share holds iteration `i`: the largest b with b·W/G ≤ i, that is
    /// ((i + 1)·G − 1) / W.
    fn block_of(&self, k: &mut Kernel, i: Reg) -> Reg {
        let next = k.add(i, 1u32);
        let x = k.mul_wide(next, self.blocks);
        let x = k.sub(x, 1i64);
        let w = k.cvt(Ty::U64, self.total);
        let x = k.div(x, w);
        k.cvt(Ty::U32, x)
    }

    /// Runs `body` for each piece of this block's share, in order; `origin` gives a tile's
    /// first row and column.
    pub(super) fn for_each_piece(
        &self,
        k: &mut Kernel,
        origin: impl Fn(&mut Kernel, Reg) -> (Reg, Reg),
        mut body: impl FnMut(&mut Kernel, Piece),
    ) {
        let it = self.start_of(k, self.block);
        let next = k.add(self.block, 1u32);
        let end = self.start_of(k, next);
        let (top, done) = (k.label(), k.label());
        k.place(top);
        let over = k.setp(Cmp::Ge, it, end);
        k.bra_if(over, false, done);
        let tile = k.div(it, self.kt);
        let first = k.rem(it, self.kt);
        let left = k.sub(end, it);
        let rest = k.sub(self.kt, first);
        let count = k.min(left, rest);
        let (m0, n0) = origin(k, tile);
        body(
            k,
            Piece {
                m0,
                n0,
                tile,
                first,
                count,
            },
        );
        k.update("add", it, it, count);
        k.bra(top);
        k.place(done);
    }

    /// After a piece's k loop: combines the accumulators `acc` with the other blocks' parts
    /// of the tile as the module docs say, and runs `epilogue` where this block holds the
    /// tile's head. `tid` is the consumer thread (of `consumers`), `sync` a named barrier
    /// the consumers alone may use.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish(
        &self,
        k: &mut Kernel,
        p: Piece,
        acc: &[Reg],
        tid: Reg,
        consumers: u32,
        sync: u32,
        epilogue: impl FnOnce(&mut Kernel),
    ) {
        let head = k.setp(Cmp::Eq, p.first, 0u32);
        let end = k.add(p.first, p.count);
        let tail = k.setp(Cmp::Eq, end, self.kt);
        let t0 = k.mul(p.tile, self.kt);
        let owner = self.block_of(k, t0);
        let last_it = k.add(t0, self.kt);
        let last_it = k.sub(last_it, 1u32);
        let last = self.block_of(k, last_it);
        let flag = {
            let o = k.mul_wide(owner, 4u32);
            Addr::new(k.add(self.flags, o))
        };
        // This thread's first 16 bytes of the slot; chunk c follows at c · consumers · 16.
        let at = {
            let o = k.mul_wide(owner, STREAM_SLOT_BYTES as u32);
            let base = k.add(self.slots, o);
            let t = k.mul_wide(tid, 16u32);
            k.add(base, t)
        };
        let stride = i64::from(consumers * 16);
        let lead = k.setp(Cmp::Eq, tid, 0u32);

        k.comment("stream-K: add the parts of the blocks above, in order");
        let skip_wait = k.label();
        k.bra_if(tail, false, skip_wait);
        k.if_(lead, |k| {
            // Each block above this one adds one to the flag once its part is in the slot.
            let above = k.sub(last, self.block);
            let spin = k.label();
            k.place(spin);
            let seen = k.ld_acquire_gpu(flag);
            let ready = k.setp(Cmp::Eq, seen, above);
            k.bra_if(ready, true, spin);
        });
        k.bar_sync_n(sync, consumers);
        k.fence_gpu();
        for (c, chunk) in acc.chunks(4).enumerate() {
            let v = k.ld_v_global_cg(Ty::F32, 4, Addr::at(at, c as i64 * stride));
            for (&a, &x) in chunk.iter().zip(&v) {
                k.update("add", a, a, x);
            }
        }
        k.place(skip_wait);

        let not_head = k.label();
        let done = k.label();
        k.bra_if(head, true, not_head);
        epilogue(k);
        // The tile is done: its flag back to zero for the next launch (no block of this one
        // reads it again).
        let split = k.not_pred(tail);
        let clear = k.and_pred(split, lead);
        k.if_(clear, |k| k.st_relaxed_gpu(flag, 0u32));
        k.bra(done);

        k.place(not_head);
        k.comment("stream-K: hand the sum so far to the block below");
        for (c, chunk) in acc.chunks(4).enumerate() {
            k.st_v(
                helios_ptx::Space::Global,
                Addr::at(at, c as i64 * stride),
                chunk,
                None,
            );
        }
        k.fence_gpu();
        k.bar_sync_n(sync, consumers);
        k.if_(lead, |k| {
            k.fence_gpu();
            k.red_add_gpu(flag, 1u32);
        });
        k.place(done);
    }
}
