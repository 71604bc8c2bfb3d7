//! What the native attention kernel's roles share: the block's sizes, work walk and stages
//! (`Block`, `Item`), and its parameters (`Params`). The kernel (`kernel`) builds them; the
//! producer and the consumers (`producer`, `forward`, `dq`, `dkdv`) read them.

use helios_ptx::{Addr, Cmp, Kernel, Reg, Space, Special, Ty};

use super::{panel_width, stage_bytes};

/// What the producer and the consumers share: sizes, the work walk and the stages.
pub(super) struct Block {
    pub(super) t: Reg,
    pub(super) heads: Reg,
    pub(super) bh: Reg,
    /// Tiles per (batch, head) and work items in all.
    pub(super) tiles: Reg,
    pub(super) items: Reg,
    /// Key lengths (u64 address) with key padding.
    pub(super) lens: Option<Reg>,
    pub(super) causal: bool,
    /// DkDv's walk: a tile is `bq` keys and its blocks are `bk` queries (the forward's
    /// and Dq's: `bq` queries against blocks of `bk` keys).
    pub(super) dkdv: bool,
    /// Rows of a tile (see `tile_rows`), and whether the consumers split their roles over
    /// it (`split_roles`).
    pub(super) bq: u32,
    pub(super) split: bool,
    pub(super) bk: u32,
    /// The head dim (the channels loaded, stored and reduced over; `width` those laid out).
    pub(super) d: u32,
    /// Parts of D that a tile's work items split (`column_parts`): Dq's at head dims past
    /// 192, each item computing dQ for its part of the channels.
    pub(super) parts: u32,
    /// Stages of each ring (`ring_stages`).
    pub(super) stages: [u32; 2],
    pub(super) tid: Reg,
    /// Shared addresses of the first stages of the two rings — K and V; DkDv's Q and dO —
    /// and of the mbarriers (the first ring's full ones, then the second's).
    pub(super) k_base: Reg,
    pub(super) v_base: Reg,
    pub(super) bars: Reg,
    pub(super) consumers: u32,
    /// The split roles' exchange of Pᵀ (`exchange_bytes`).
    pub(super) exchange: Option<Reg>,
    /// DkDv's per-warp copies of L and Dsum (`stats_bytes`).
    pub(super) stats: Option<Reg>,
    /// The causal forward's tiles end at T rather than start at 0: they start `shift` rows
    /// before 0 (whole warpgroups), so that the partial tile is the first, the shortest,
    /// instead of the last, the longest. Its rows before 0 are dead warpgroups.
    pub(super) shift: Option<Reg>,
}

/// One work item: a tile of one (batch, head) — queries, or DkDv's keys — and the blocks
/// of the other side it meets.
pub(super) struct Item {
    pub(super) b: Reg,
    pub(super) h: Reg,
    /// The tile's first row.
    pub(super) row0: Reg,
    /// Keys of this batch row (key padding, at most T).
    pub(super) len: Reg,
    /// The first block the tile meets (0 but for causal DkDv), and how many.
    pub(super) first: Reg,
    pub(super) blocks: Reg,
    /// The index of this block's next item (at or past `Block::items` after the last).
    pub(super) next: Reg,
    /// The item's first channel where items split D (`Block::parts`).
    pub(super) cols: Option<Reg>,
}

impl Block {
    /// Batch row, head and first row of work item `item` (see `for_each_item`).
    pub(super) fn coords(&self, k: &mut Kernel, item: Reg) -> (Reg, Reg, Reg) {
        // A tile's parts are consecutive items.
        let item = match self.parts {
            1 => item,
            n => k.div(item, n),
        };
        let back = k.div(item, self.bh);
        let tile = if self.dkdv {
            back
        } else {
            let last = k.sub(self.tiles, 1u32);
            k.sub(last, back)
        };
        let r = k.rem(item, self.bh);
        let b = k.div(r, self.heads);
        let h = k.rem(r, self.heads);
        let row0 = k.mul(tile, self.bq);
        // Rows before 0 wrap around: every test on them (`rows < t`) fails.
        let row0 = match self.shift {
            Some(shift) if !self.dkdv => k.sub(row0, shift),
            _ => row0,
        };
        (b, h, row0)
    }

    /// Runs `body` for each work item of this block. Item i is tile `tiles − 1 − i / bh` of
    /// (batch, head) `i % bh`, or with DkDv tile `i / bh`: either way the longest causal
    /// tiles first (i counts whole tiles where items split D). The items go out in rows of
    /// `nctaid.x`, block b taking the b-th of an even row and the b-th from the end of an
    /// odd one: the blocks handed a row's longest tiles get the next row's shortest, which
    /// evens out the blocks' total work.
    pub(super) fn for_each_item(&self, k: &mut Kernel, mut body: impl FnMut(&mut Kernel, &Item)) {
        let ahead = k.special(Special::CtaIdX);
        let step = k.special(Special::NCtaIdX);
        let last = k.sub(step, 1u32);
        let behind = k.sub(last, ahead);
        // The first item of this row, and the rows before it.
        let row = k.mov(Ty::U32, 0u32);
        let rows = k.mov(Ty::U32, 0u32);
        let (top, done) = (k.label(), k.label());
        k.place(top);
        let odd = k.and(rows, 1u32);
        let reversed = k.setp(Cmp::Ne, odd, 0u32);
        let at = k.selp(reversed, behind, ahead, Ty::U32);
        let item = k.add(row, at);
        let over = k.setp(Cmp::Ge, item, self.items);
        k.bra_if(over, false, done);
        let (b, h, row0) = self.coords(k, item);
        let len = match self.lens {
            Some(lens) => {
                let at = k.mad_wide(b, 4u32, lens);
                let l = k.ld(Space::Global, Ty::U32, Addr::new(at));
                k.min(l, self.t)
            }
            None => k.mov(Ty::U32, self.t),
        };
        let (first, blocks) = if self.dkdv {
            // Every query row meets these keys (from the first at or after them, causal);
            // a tile of keys past the length meets none.
            let first = if self.causal {
                k.div(row0, self.bk)
            } else {
                k.mov(Ty::U32, 0u32)
            };
            let e = k.add(self.t, self.bk - 1);
            let all = k.div(e, self.bk);
            let n = k.sub(all, first);
            let dead = k.setp(Cmp::Ge, row0, len);
            (first, k.selp(dead, 0u32, n, Ty::U32))
        } else {
            let end = if self.causal {
                let e = k.add(row0, self.bq);
                k.min(e, len)
            } else {
                len
            };
            let e = k.add(end, self.bk - 1);
            (k.mov(Ty::U32, 0u32), k.div(e, self.bk))
        };
        let next_at = k.selp(reversed, ahead, behind, Ty::U32);
        let next_row = k.add(row, step);
        let next = k.add(next_row, next_at);
        let cols = (self.parts > 1).then(|| {
            let part = k.rem(item, self.parts);
            k.mul(part, self.width() / self.parts)
        });
        body(
            k,
            &Item {
                b,
                h,
                row0,
                len,
                first,
                blocks,
                next,
                cols,
            },
        );
        k.update("add", row, row, step);
        k.update("add", rows, rows, 1u32);
        k.bra(top);
        k.place(done);
    }

    pub(super) fn stage_bytes(&self) -> u32 {
        stage_bytes(self.bk, self.d)
    }

    /// Channels of the stages and of the accumulators over D (`panel_width`).
    pub(super) fn width(&self) -> u32 {
        panel_width(self.d)
    }

    /// Stages of K's ring, or V's with `v`.
    pub(super) fn stages_of(&self, v: bool) -> u32 {
        self.stages[usize::from(v)]
    }

    /// Named barrier ids of the stages' "empty" signals: K's, then V's (0 is the block's).
    pub(super) fn empty_id(&self, k: &mut Kernel, slot: Reg, v: bool) -> Reg {
        let first = 1 + if v { self.stages[0] } else { 0 };
        k.add(slot, first)
    }

    /// The full mbarrier of `slot` of K's or V's ring.
    pub(super) fn full_bar(&self, k: &mut Kernel, slot: Reg, v: bool) -> Addr {
        let at = k.mad(slot, 8u32, self.bars);
        Addr::at(at, if v { i64::from(8 * self.stages[0]) } else { 0 })
    }
}

/// The value `kern` was declared with, in launch order.
pub(super) struct Params {
    pub(super) q: Reg,
    pub(super) k: Reg,
    pub(super) v: Reg,
    /// The forward's O and L (written); Dq's dQ (written) and L (read).
    pub(super) o: Reg,
    pub(super) lse: Reg,
    /// Element offsets of Q, K, V and their shared batch, seq and head strides.
    pub(super) offs: [Reg; 3],
    pub(super) strides: [Reg; 3],
    pub(super) scale: Reg,
    pub(super) maps: Reg,
    /// Dq's other inputs.
    pub(super) grad: Option<Grad>,
}

/// What Dq reads beside the forward's inputs: dO (its own strides) and Dsum.
pub(super) struct Grad {
    pub(super) d_o: Reg,
    pub(super) off_do: Reg,
    pub(super) strides_do: [Reg; 3],
    pub(super) dsum: Reg,
    /// O, dense [B, T, H, D], where Dq computes Dsum itself (`own_dsum`: then written).
    pub(super) o: Option<Reg>,
    /// DkDv's second output, dV (its first, dK, is `Params::o`).
    pub(super) dv: Option<Reg>,
}
