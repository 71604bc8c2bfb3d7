//! Stream-K order: a grid of one block per SM takes equal shares of all the k steps of all
//! the output tiles, so a product of fewer tiles than SMs (a weight gradient: 24 to 96
//! tiles on 132 SMs) keeps every SM busy.
//!
//! Block `b` of `G` runs iterations `[b·W/G, (b+1)·W/G)` of the `W = tiles · KT` k steps,
//! tile after tile (`KT` k steps a tile), so a tile's k range may be split between
//! consecutive blocks. The block holding the tile's first k steps (the head; its last piece
//! of work) runs the epilogue; each block holding a later part (its first piece) stores
//! the part in f32 to its own slot of the workspace and adds one to the tile's flag. The
//! parts are added in a fixed order, so a product's result does not depend on timing:
//! - **chained**, where the tile spans few blocks: each block below the one holding the
//!   tile's last k steps first waits until the flag counts the blocks above it and adds
//!   the next block's slot (the sum of all above) to its part; the head then adds one slot;
//! - **direct**, where it spans [`DIRECT_ABOVE`] blocks or more above the head: the others
//!   store their parts without waiting, and the head adds every slot, nearest first. A
//!   chain there is one slot's round trip per block after another, several times the k
//!   steps' own time (bench/results/2026-11-30-session46-h200.md).
//!
//! A block waits only at its last piece (a chained middle block has one piece), and only
//! for blocks above it, which never wait at their first: there is no cycle to deadlock on,
//! and a block not yet resident only delays those below it. The head clears the flag for
//! the next launch.
//!
//! The flag of a split tile is its head block's, the only one that holds that tile's head;
//! the slot of a part is its block's, which holds at most one part that is not a head. A
//! slot keeps each consumer thread's accumulators 16 bytes at a time, interleaved across
//! threads so that a warp's access is 512 contiguous bytes.

use helios_ptx::{Addr, Cmp, Kernel, Param, Reg, Special, Ty};

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
    /// The native workspace's parameter: the flags and slots are found from it where used,
    /// so that no register holds their addresses through the k loop.
    workspace: Param,
}

impl Stream {
    /// The block's share of the `tiles` output tiles of `kt` k tiles each; `workspace` is
    /// the parameter of the native workspace's address (`native_maps`).
    pub(super) fn new(k: &mut Kernel, tiles: Reg, kt: Reg, workspace: Param) -> Stream {
        let block = k.special(Special::CtaIdX);
        let blocks = k.special(Special::NCtaIdX);
        let total = k.mul(tiles, kt);
        Stream {
            block,
            blocks,
            kt,
            total,
            workspace,
        }
    }

    /// The first iteration of block `b` (a u32 register), `b·W/G`. The launch keeps W·G
    /// under 2^32 (`native_launch`), so this and `block_of` divide in 32 bits: a 64-bit
    /// division is a long subroutine, and `finish` runs them between a part's store and its
    /// flag.
    fn start_of(&self, k: &mut Kernel, b: Reg) -> Reg {
        let x = k.mul(b, self.total);
        k.div(x, self.blocks)
    }

    /// The block whose share holds iteration `i`: the largest b with b·W/G ≤ i, that is
    /// ((i + 1)·G − 1) / W.
    fn block_of(&self, k: &mut Kernel, i: Reg) -> Reg {
        let next = k.add(i, 1u32);
        let x = k.mul(next, self.blocks);
        let x = k.sub(x, 1u32);
        k.div(x, self.total)
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
        // The blocks holding the tile's first and last k steps (u32).
        let ends = |k: &mut Kernel| {
            let t0 = k.mul(p.tile, self.kt);
            let owner = self.block_of(k, t0);
            let last_it = k.add(t0, self.kt);
            let last_it = k.sub(last_it, 1u32);
            (owner, self.block_of(k, last_it))
        };
        // The tile's flag is its head block's; flags and slots are found where used (a
        // 256 × 192 tile has no registers to keep them).
        let flag_of = |k: &mut Kernel, b: Reg| {
            let o = k.mul_wide(b, 4u32);
            let w = k.ld_param_global(self.workspace);
            let flags = k.add(w, crate::native_maps::NATIVE_MAPS_BYTES as i64);
            Addr::new(k.add(flags, o))
        };
        let lead = k.setp(Cmp::Eq, tid, 0u32);
        // Waits until the flag of block `owner` counts `count` blocks.
        let wait = |k: &mut Kernel, owner: Reg, count: Reg| {
            k.if_(lead, |k| {
                let flag = flag_of(k, owner);
                let spin = k.label();
                k.place(spin);
                let seen = k.ld_acquire_gpu(flag);
                let ready = k.setp(Cmp::Eq, seen, count);
                k.bra_if(ready, true, spin);
            });
            k.bar_sync_n(sync, consumers);
            k.fence_gpu();
        };
        // Adds block `b`'s slot to the accumulators: this thread's 16-byte pieces, chunk c
        // at c · consumers · 16 from the first, interleaved across the threads.
        let add_slot = |k: &mut Kernel, b: Reg| {
            let at = slot_at(k, self.workspace, b, tid);
            for (c, chunk) in acc.chunks(4).enumerate() {
                let at = Addr::at(at, i64::from(c as u32 * consumers * 16));
                let v = k.ld_v_global_cg(Ty::F32, 4, at);
                for (&a, &x) in chunk.iter().zip(&v) {
                    k.update("add", a, a, x);
                }
            }
        };

        let not_head = k.label();
        let done = k.label();
        k.bra_if(head, true, not_head);
        let whole = k.label();
        k.bra_if(tail, false, whole);
        k.comment("stream-K: the head adds the parts of the blocks above");
        let (_, last) = ends(k);
        let above = k.sub(last, self.block);
        wait(k, self.block, above);
        // Chained, the next block's slot holds the sum of all above; direct, each its own.
        let direct = k.setp(Cmp::Ge, above, DIRECT_ABOVE);
        let slots = k.selp(direct, above, 1u32, Ty::U32);
        let b = k.mov(Ty::U32, self.block);
        let stop = k.add(self.block, slots);
        let (top, added) = (k.label(), k.label());
        k.place(top);
        let over = k.setp(Cmp::Ge, b, stop);
        k.bra_if(over, false, added);
        k.update("add", b, b, 1u32);
        add_slot(k, b);
        k.bra(top);
        k.place(added);
        // The tile is done: its flag back to zero for the next launch (no block of this one
        // reads it again).
        k.if_(lead, |k| {
            let flag = flag_of(k, self.block);
            k.st_relaxed_gpu(flag, 0u32);
        });
        k.place(whole);
        epilogue(k);
        k.bra(done);

        k.place(not_head);
        k.comment("stream-K: a later part of the tile, to this block's slot");
        let (owner, last) = ends(k);
        let span = k.sub(last, owner);
        let chained = k.setp(Cmp::Lt, span, DIRECT_ABOVE);
        let middle = k.setp(Cmp::Ne, self.block, last);
        let relay = k.and_pred(chained, middle);
        k.if_(relay, |k| {
            // Chained: first the sum of the blocks above, from the next one's slot.
            let above = k.sub(last, self.block);
            wait(k, owner, above);
            let next = k.add(self.block, 1u32);
            add_slot(k, next);
        });
        let at = slot_at(k, self.workspace, self.block, tid);
        for (c, chunk) in acc.chunks(4).enumerate() {
            let at = Addr::at(at, i64::from(c as u32 * consumers * 16));
            k.st_v(helios_ptx::Space::Global, at, chunk, None);
        }
        k.fence_gpu();
        k.bar_sync_n(sync, consumers);
        k.if_(lead, |k| {
            let (owner, _) = ends(k);
            let flag = flag_of(k, owner);
            k.fence_gpu();
            k.red_add_gpu(flag, 1u32);
        });
        k.place(done);
    }
}

/// Blocks above a tile's head from which its parts are added directly, each from its own
/// slot; below that they are chained, each block adding the sum above it to its part
/// (nearly as fast where the blocks finish at different times, and one slot for the head
/// to read): H200, bench/results/2026-11-30-session45-h200.md.
const DIRECT_ABOVE: u32 = 3;

/// This thread's first 16 bytes of block `b`'s slot in the workspace of parameter
/// `workspace` (u64).
fn slot_at(k: &mut Kernel, workspace: Param, b: Reg, tid: Reg) -> Reg {
    let o = k.mul_wide(b, STREAM_SLOT_BYTES as u32);
    let w = k.ld_param_global(workspace);
    let slots = k.add(
        w,
        (crate::native_maps::NATIVE_MAPS_BYTES + STREAM_FLAGS_BYTES) as i64,
    );
    let base = k.add(slots, o);
    let t = k.mul_wide(tid, 16u32);
    k.add(base, t)
}
