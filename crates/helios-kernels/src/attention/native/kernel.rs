//! The native forward's kernel: parameters, shared memory, the work walk both roles share,
//! and the split into the producer warp (`producer`) and the consumer warpgroups
//! (`consumer`).

use helios_ptx::{Addr, BuildError, Cmp, Kernel, Module, Reg, Space, Special, Target, Ty};

use super::{
    consumer, dkdv, dq, producer, stage_bytes, stages, AttentionKernel, AttnStage, AttnVariant,
    ONE_BLOCK_BYTES, PRODUCER_REGS, WG_ROWS, WG_THREADS,
};

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
    pub(super) d: u32,
    /// Stages of each ring.
    pub(super) stages: u32,
    pub(super) tid: Reg,
    /// Shared addresses of the first stages of the two rings — K and V; DkDv's Q and dO —
    /// and of the mbarriers (the first ring's full ones, then the second's).
    pub(super) k_base: Reg,
    pub(super) v_base: Reg,
    pub(super) bars: Reg,
    pub(super) consumers: u32,
    /// The split roles' exchange of Pᵀ (`exchange_bytes`).
    pub(super) exchange: Option<Reg>,
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
}

impl Block {
    /// Batch row, head and first row of work item `item` (see `for_each_item`).
    pub(super) fn coords(&self, k: &mut Kernel, item: Reg) -> (Reg, Reg, Reg) {
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
        (b, h, k.mul(tile, self.bq))
    }

    /// Runs `body` for each work item of this block: items `ctaid.x`, `+ nctaid.x`, ...;
    /// item i is tile `tiles − 1 − i / bh` of (batch, head) `i % bh`, or with DkDv tile
    /// `i / bh`: either way the longest causal tiles first.
    pub(super) fn for_each_item(&self, k: &mut Kernel, mut body: impl FnMut(&mut Kernel, &Item)) {
        let item = k.special(Special::CtaIdX);
        let step = k.special(Special::NCtaIdX);
        let (top, done) = (k.label(), k.label());
        k.place(top);
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
        body(
            k,
            &Item {
                b,
                h,
                row0,
                len,
                first,
                blocks,
            },
        );
        k.update("add", item, item, step);
        k.bra(top);
        k.place(done);
    }

    pub(super) fn stage_bytes(&self) -> u32 {
        stage_bytes(self.bk, self.d)
    }

    /// Named barrier ids of the stages' "empty" signals: K's, then V's (0 is the block's).
    pub(super) fn empty_id(&self, k: &mut Kernel, slot: Reg, v: bool) -> Reg {
        let first = 1 + if v { self.stages } else { 0 };
        k.add(slot, first)
    }

    /// The full mbarrier of `slot` of K's or V's ring.
    pub(super) fn full_bar(&self, k: &mut Kernel, slot: Reg, v: bool) -> Addr {
        let at = k.mad(slot, 8u32, self.bars);
        Addr::at(at, if v { i64::from(8 * self.stages) } else { 0 })
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
    /// DkDv's second output, dV (its first, dK, is `Params::o`).
    pub(super) dv: Option<Reg>,
}

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
    // Forward: q, k, v, [lens], o, lse. Dq: q, k, v, do, lse, dsum, [lens], dq. DkDv the
    // same with dk, dv. (`dq` below: either backward stage.)
    let pq = k.param("q", Ty::U64);
    let pk = k.param("k", Ty::U64);
    let pv = k.param("v", Ty::U64);
    let pgrad = dq.then(|| {
        [
            k.param("do", Ty::U64),
            k.param("lse", Ty::U64),
            k.param("dsum", Ty::U64),
        ]
    });
    let plens = kern.padded.then(|| k.param("lens", Ty::U64));
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

    let n_stages = stages(bk, d);
    let ring = stage_bytes(bk, d) * n_stages;
    let rings = (2 * ring).max(ONE_BLOCK_BYTES);
    let smem = k.shared("stages", 1024, rings);
    let maps_arr = k.shared("map_build", 128, 2 * helios_ptx::TENSOR_MAP_BYTES);
    let bars_arr = k.shared("full", 8, 16 * n_stages);
    let exchange =
        super::split_roles(kern).then(|| k.shared("exchange", 16, super::exchange_bytes(kern, bk)));

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
        grad: pgrad.zip(pdo).map(|([d_o, _, dsum], (off, st))| Grad {
            d_o: k.ld_param_global(d_o),
            off_do: k.ld_param(off),
            strides_do: st.map(|p| k.ld_param(p)),
            dsum: k.ld_param_global(dsum),
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
    let base = k.shared_address(smem);
    let blk = Block {
        t,
        heads,
        bh,
        tiles,
        items: k.mul(tiles, bh),
        lens,
        causal: kern.causal,
        dkdv,
        bq: tile,
        split: super::split_roles(kern),
        bk,
        d,
        stages: n_stages,
        tid,
        k_base: base,
        v_base: k.add(base, ring),
        bars: k.shared_address(bars_arr),
        consumers,
        exchange: exchange.map(|x| k.shared_address(x)),
    };

    let first = k.setp(Cmp::Eq, tid, consumers);
    k.if_(first, |k| {
        for s in 0..2 * n_stages {
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
        consumer::consumer(&mut k, kern, &blk, &p);
    }
    k.finish()
}
