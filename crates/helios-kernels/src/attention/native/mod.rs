//! The attention forward on NVIDIA's native path: PTX with Hopper's `wgmma`, launched
//! through VK_NVX_binary_import (FlashAttention-3's structure within what the driver gives
//! these launches: 48 KiB of shared memory, one block per SM, no clusters).
//!
//! One block is `bq / 64` consumer warpgroups of 64 query rows each and one producer warp.
//! Blocks stay resident (one per SM) and walk work items — a query tile of one (batch, head),
//! the longest causal tiles first, dealt back and forth over the blocks
//! (`Block::for_each_item`) — so each builds its tensor maps once.
//!
//! - The producer builds one 4D tensor map per operand over the whole [B, T, H, D] view
//!   (boxes of `bk` keys × 64 channels of one head) and has the copy engine bring each key
//!   block's K and V into a ring of stages, completing on per-stage mbarriers; K and V have
//!   their own barriers, so the next K streams in while this block's P·V runs.
//! - Each consumer warpgroup keeps its Q rows in registers as `wgmma`'s A operand, computes
//!   S = Q·Kᵀ from the K stage, does the online softmax in registers (base 2, the scale
//!   folded in), rounds P into the A-operand fragment (the accumulator layout of S is the
//!   A layout of P·V, as in FlashAttention-3) and accumulates O += P·V from the V stage
//!   (N-major, read transposed by the descriptor). Scores never reach memory. With blocks
//!   of 64 keys, block j's S is issued with block j − 1's P·V and its softmax runs while
//!   that product does (FlashAttention-3's intra-warpgroup order), and the next item's Q
//!   loads while this one runs.
//! - The epilogue divides by the row sums and writes O and the log-sum-exp.
//!
//! Semantics are the family's (`super` module docs): key padding, causal masking, rows with
//! no key give O = 0 and L = −inf.

mod block;
mod consumer;
mod dkdv;
mod dq;
mod forward;
mod kernel;
mod producer;

use helios_ptx::{Module, Target};

use super::signature::{
    native_workgroup, AttentionKernel, AttnShape, AttnStage, AttnVariant, ViewStrides, WG_ROWS,
    WG_THREADS,
};
use crate::launch::{Arg, Args};
use crate::matmul::NativeLaunch;
use crate::storage::Storage;
use crate::KernelError;

/// Registers the producer warpgroup keeps after `setmaxnreg` (one thread issues copies).
const PRODUCER_REGS: u32 = 24;
/// Stages a ring may have: K's and V's "empty" named barriers take ids 1 to 12.
const MAX_STAGES: u32 = 6;
/// The split roles' named barriers after those: Pᵀ written (the dK warpgroup may read),
/// and Pᵀ read (the dV warpgroup may write the next).
pub(super) const P_FULL: u32 = 1 + 2 * MAX_STAGES;
pub(super) const P_EMPTY: u32 = P_FULL + 1;
/// The forward's turns between its warpgroups (`consumer::Turns`), one barrier each, on the
/// ids the split roles use in the backward.
pub(super) const TURN_BARS: u32 = P_FULL;
/// Channels of one copy box and one 128-byte swizzle row.
const PANEL: u32 = 64;
/// Bytes of the block's shared memory below which a second block could share its SM (and
/// its tensor-map slot): the stages are padded to it.
const ONE_BLOCK_BYTES: u32 = 32 * 1024;

/// Native candidates, the default first where it fits (`native_order` puts the causal
/// forward's first): 128 query rows (two consumer warpgroups) against blocks of 64 keys at
/// head dim 64; 192 rows against 32 keys at head dim 128 (whose stages are twice the size);
/// 128 × 32 beside it; and for the forward alone (`buildable`) 192 × 64 at head dim 64,
/// which copies K and V once for three warpgroups: the copies bound the forward
/// (bench/results/2026-12-01-session55-h200.md). 48-key blocks (three stages) lost
/// (`bench/results/2026-11-29-native-attention-h200.md`). Past head dim 128, whose stages
/// are larger still, 128 × 16 alone.
pub const NATIVE_VARIANTS: [AttnVariant; 5] = [
    native(128, 64),
    native(192, 32),
    native(128, 32),
    native(192, 64),
    native(128, 16),
];

/// The native candidates for `stage` in the order a device without a tuned choice tries
/// them: `NATIVE_VARIANTS`, but the causal forward takes 192 × 64 first where it builds.
/// Its tiles end at T, so their shortest is the partial one, and it copies K and V once
/// for three warpgroups: it won at T = 1024 and 2048
/// (bench/results/2026-12-01-session56-h200.md). Unmeasured without the mask, where the
/// partial tile is as long as the others.
pub fn native_order(stage: AttnStage, causal: bool) -> [AttnVariant; 5] {
    let [wide, narrow_tall, narrow, tall, short] = NATIVE_VARIANTS;
    if stage == AttnStage::Forward && causal {
        [tall, wide, narrow_tall, narrow, short]
    } else {
        NATIVE_VARIANTS
    }
}

const fn native(bq: u8, bk: u8) -> AttnVariant {
    AttnVariant::Native { bq, bk }
}

/// Bytes of one stage of K or V (`bk` keys × the channels of `d`'s whole panels).
const fn stage_bytes(bk: u32, d: u32) -> u32 {
    bk * panel_width(d) * 2
}

/// Channels the kernels lay out and multiply for head dim `d`: whole 64-channel panels, one
/// 128-byte swizzle row each. A head dim between (a multiple of 16) is padded: the copy
/// engine fills the channels past D with zeros, the products over D stop at D, and the
/// stores skip the columns past it.
pub(super) const fn panel_width(d: u32) -> u32 {
    d.div_ceil(PANEL) * PANEL
}

/// Stages of the K and V rings: as many as 48 KiB holds beside the maps and barriers
/// (the copies are latency-bound: bytes in flight are what matter).
pub(super) fn stages(bk: u32, d: u32) -> u32 {
    let room = 48 * 1024 - 2 * helios_ptx::TENSOR_MAP_BYTES - 16 * MAX_STAGES;
    (room / (2 * stage_bytes(bk, d))).min(MAX_STAGES)
}

/// Stages of a kernel's two rings (K and V; DkDv's Q and dO): `stages` each, and one more
/// where 48 KiB holds it in the ring whose stage is held longest, which the copies' round
/// trip bounds most: K's for Dq, held through two products (S and dS·K), V's for the
/// forward, held from its block's softmax to the next block's P·V
/// (bench/results/2026-12-01-session54-h200.md, 2026-12-01-session55-h200.md).
pub(super) fn ring_stages(kern: &AttentionKernel) -> [u32; 2] {
    let AttnVariant::Native { bk, .. } = kern.variant else {
        return [0, 0];
    };
    let n = stages(u32::from(bk), kern.head_dim);
    let more = match kern.stage {
        AttnStage::Dq => [n + 1, n],
        AttnStage::Forward => [n, n + 1],
        _ => return [n, n],
    };
    if n < MAX_STAGES && bytes_with(kern, more) <= 48 * 1024 {
        more
    } else {
        [n, n]
    }
}

/// Bytes of the rings' stages, padded to keep one block per SM.
pub(super) fn ring_bytes(kern: &AttentionKernel) -> u32 {
    rings_with(kern, ring_stages(kern))
}

/// Shared memory of a native kernel: both rings, padded to keep one block per SM, a full
/// mbarrier a stage, the two maps being built, the split roles' exchange and DkDv's query
/// statistics.
pub(super) fn shared_bytes(kern: &AttentionKernel) -> u32 {
    bytes_with(kern, ring_stages(kern))
}

/// `ring_bytes` with `stages` in the rings.
fn rings_with(kern: &AttentionKernel, [a, b]: [u32; 2]) -> u32 {
    let AttnVariant::Native { bk, .. } = kern.variant else {
        return 0;
    };
    ((a + b) * stage_bytes(u32::from(bk), kern.head_dim)).max(ONE_BLOCK_BYTES)
}

/// `shared_bytes` with `stages` in the rings.
fn bytes_with(kern: &AttentionKernel, stages: [u32; 2]) -> u32 {
    let AttnVariant::Native { bq, bk } = kern.variant else {
        return 0;
    };
    let (bq, bk) = (u32::from(bq), u32::from(bk));
    rings_with(kern, stages)
        + 8 * (stages[0] + stages[1])
        + 2 * helios_ptx::TENSOR_MAP_BYTES
        + exchange_bytes(kern, bk)
        + stats_bytes(kern, bq, bk)
}

/// Bytes of DkDv's query statistics: each consumer warp's copy of L and Dsum for one block
/// of `bk` queries (f32), which its lanes load together once instead of each lane loading
/// the 2 · `bk` / 4 values of its own columns.
pub(super) fn stats_bytes(kern: &AttentionKernel, bq: u32, bk: u32) -> u32 {
    if kern.stage == AttnStage::DkDv {
        bq / WG_ROWS * (WG_THREADS / 32) * 2 * bk * 4
    } else {
        0
    }
}

/// Bytes of the split roles' exchange: Pᵀ of one block of queries (64 keys × `bk`, f32),
/// which the dV warpgroup computes and the dK warpgroup reads.
pub(super) fn exchange_bytes(kern: &AttentionKernel, bk: u32) -> u32 {
    if split_roles(kern) {
        WG_ROWS * bk * 4
    } else {
        0
    }
}

/// Whether a native kernel exists for `kern`: the forward, Dq or DkDv of f16/bf16 inputs,
/// head dims 32 to 256 (multiples of 16, laid out in whole panels: `panel_width`), query
/// tiles of whole warpgroups, key blocks that are whole `wgmma` k steps, and stages within
/// 48 KiB.
pub(super) fn buildable(kern: &AttentionKernel) -> bool {
    let AttnVariant::Native { bq, bk } = kern.variant else {
        return false;
    };
    let (bq, bk, d) = (u32::from(bq), u32::from(bk), kern.head_dim);
    let dp = panel_width(d);
    kern.stage != AttnStage::Prep
        && matches!(kern.storage, Storage::F16 | Storage::BF16)
        && d % 16 == 0
        && (32..=256).contains(&d)
        && bq % WG_ROWS == 0
        && (WG_ROWS..=3 * WG_ROWS).contains(&bq)
        && bk % 16 == 0
        && (16..=128).contains(&bk)
        && (!kern.packed || kern.stage != AttnStage::Forward)
        // DkDv keeps K, V, dK and dV in registers; past one panel two warpgroups split
        // them over one tile of 64 keys (`split_roles`).
        && (kern.stage != AttnStage::DkDv || dp == 64 || bq == 2 * WG_ROWS)
        // Dsum from O and dO: Dq's, which holds dO's rows.
        && (!kern.own_dsum || kern.stage == AttnStage::Dq)
        // Dq keeps Q, dO and dQ in registers: past one panel three warpgroups spill.
        && (kern.stage == AttnStage::Forward || dp == 64 || bq <= 2 * WG_ROWS)
        // Past two panels, 16-key blocks, the only ones that leave two stages in 48 KiB
        // (and only there, where nothing larger fits).
        && (bk > 16) == (dp <= 128)
        // Three warpgroups against 64-row blocks: the forward's alone (the backward's were
        // never checked on a GPU).
        && (kern.stage == AttnStage::Forward || bq * bk < 3 * WG_ROWS * 64)
        && stages(bk, d) >= 2
        && shared_bytes(kern) <= 48 * 1024
}

/// Whether the two consumer warpgroups of `kern` share one tile of 64 keys, one
/// accumulating dV and the other dK: DkDv past one panel, where one warpgroup holding K, V,
/// dK and dV would need ~256 registers a thread at head dim 128 (see `dkdv`).
pub(super) fn split_roles(kern: &AttentionKernel) -> bool {
    kern.stage == AttnStage::DkDv && panel_width(kern.head_dim) > 64
}

/// Parts of D whose dQ separate work items compute: two for Dq past head dim 192, where
/// Q, dO (64 registers a thread each) and all of dQ's accumulators (128) would spill; each
/// part recomputes S and dP over all of D, and accumulates dQ for half its channels.
pub(super) fn column_parts(kern: &AttentionKernel) -> u32 {
    if kern.stage == AttnStage::Dq && panel_width(kern.head_dim) > 192 {
        2
    } else {
        1
    }
}

/// Rows of a work item's tile: `bq` (queries; DkDv's keys), or one warpgroup's 64 keys
/// where the warpgroups split their roles.
pub(super) fn tile_rows(kern: &AttentionKernel, bq: u32) -> u32 {
    if split_roles(kern) {
        WG_ROWS
    } else {
        bq
    }
}

impl AttentionKernel {
    /// Whether this native kernel can run on a device whose native target is `target`.
    pub fn native_feasible(&self, target: Option<Target>) -> bool {
        target.is_some_and(|t| t.has_wgmma()) && buildable(self)
    }

    /// Emits the native kernel (PTX) of a `Native` variant for `target`.
    pub fn build_native(&self, target: Target) -> Result<Module, KernelError> {
        if !buildable(self) {
            return Err(KernelError::Arguments {
                kernel: self.name(),
                detail: "no native attention kernel for this stage, storage, head dim and tile"
                    .into(),
            });
        }
        kernel::build(self, target).map_err(|e| KernelError::Arguments {
            kernel: self.name(),
            detail: e.to_string(),
        })
    }

    /// Grid, block and arguments of a native launch over `shape`: `buffers` are the device
    /// addresses in declaration order (q, k, v, lens with key padding, o, lse), `views` Q's, K's and V's
    /// strides (one set, offsets apart), `maps` the tensor-map workspace. With the SM count
    /// the grid is one block per SM walking the work items, else a block per item.
    pub fn native_launch(
        &self,
        shape: AttnShape,
        scale: f32,
        views: &[ViewStrides],
        buffers: &[u64],
        maps: u64,
        sms: Option<u32>,
    ) -> Result<NativeLaunch, KernelError> {
        let bad = |detail: String| KernelError::Arguments {
            kernel: self.name(),
            detail,
        };
        let AttnVariant::Native { bq, .. } = self.variant else {
            return Err(bad("not a native variant".into()));
        };
        // Forward: q, k, v, [lens], o, lse and the views of q, k, v. Dq: q, k, v, do, lse,
        // dsum, [lens], dq and the views of q, k, v, do (with `own_dsum`: o in dsum's place,
        // dsum written after [lens]); DkDv the same as Dq with dk, dv.
        let (want, n_views) = match self.stage {
            AttnStage::Dq => (7 + usize::from(self.padded) + usize::from(self.own_dsum), 4),
            AttnStage::DkDv => (8 + usize::from(self.padded), 4),
            _ => (5 + usize::from(self.padded), 3),
        };
        if buffers.len() != want || views.len() != n_views {
            return Err(bad(format!(
                "{} buffers and {} views, expected {want} and {n_views}",
                buffers.len(),
                views.len()
            )));
        }
        let v0 = views[0];
        if views[..3]
            .iter()
            .any(|v| (v.batch, v.seq, v.head) != (v0.batch, v0.seq, v0.head))
        {
            return Err(bad(format!("Q, K and V strides differ: {views:?}")));
        }
        // The copy engine reads 16-byte aligned rows from 16-byte aligned addresses, and the
        // fragment loads 4-byte pairs.
        let misaligned = views.iter().any(|v| {
            [v.offset, v.batch, v.seq, v.head]
                .iter()
                .any(|x| x % 8 != 0)
        }) || buffers[..3].iter().any(|a| a % 16 != 0);
        if misaligned {
            return Err(bad(format!(
                "native attention needs 16-byte aligned views: {views:?}"
            )));
        }
        if scale.is_nan() || scale <= 0.0 {
            return Err(bad(format!(
                "scale {scale}: the kernel needs a positive one"
            )));
        }
        let AttnShape { batch, t, heads } = shape;
        let tiles = u64::from(t.div_ceil(tile_rows(self, u32::from(bq))));
        let items = tiles * u64::from(batch) * u64::from(heads) * u64::from(column_parts(self));
        if items > u64::from(u32::MAX) {
            return Err(KernelError::TooLarge {
                what: "attention work items",
                size: items,
            });
        }
        let mut args = Args::new();
        args.extend(buffers.iter().map(|&a| Arg::Address(a)));
        args.extend([t, heads, batch].map(Arg::U32));
        args.push(Arg::F32(scale));
        args.extend(views[..3].iter().map(|v| Arg::U32(v.offset)));
        args.extend([v0.batch, v0.seq, v0.head].map(Arg::U32));
        if let Some(d) = views.get(3) {
            args.extend([d.offset, d.batch, d.seq, d.head].map(Arg::U32));
        }
        args.push(Arg::Address(maps));
        let items = items as u32;
        let blocks = sms.map_or(items, |s| s.min(items)).max(1);
        Ok(NativeLaunch {
            grid: [blocks, 1, 1],
            block: [native_workgroup(u32::from(bq)), 1, 1],
            args,
        })
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use helios_spirv::Binding;

    fn kernel(d: u32, variant: AttnVariant, causal: bool, padded: bool) -> AttentionKernel {
        AttentionKernel {
            stage: AttnStage::Forward,
            storage: Storage::BF16,
            head_dim: d,
            causal,
            padded,
            variant,
            binding: Binding::DeviceAddress,
            subgroup: 0,
            frag: None,
            pipelined: false,
            own_dsum: false,
            packed: false,
        }
    }

    /// Which kernels exist: the forward and the backward of 16-bit inputs at head dims 32 to
    /// 256 (multiples of 16) in 48 KiB.
    #[test]
    fn native_kernels_exist_where_their_stages_fit() {
        let [wide, _, narrow, tall, _] = NATIVE_VARIANTS;
        assert!(buildable(&kernel(64, wide, true, false)));
        assert!(buildable(&kernel(128, narrow, false, true)));
        // Head dim 128 with 64-key blocks needs 64 KiB of stages.
        assert!(!buildable(&kernel(128, wide, true, false)));
        // Head dims between panels are padded; past 128, 16-key blocks alone.
        let short = NATIVE_VARIANTS[4];
        assert!(buildable(&kernel(80, narrow, true, false)));
        assert!(buildable(&kernel(32, tall, true, false)));
        assert!(!buildable(&kernel(80, short, true, false)));
        assert!(!buildable(&kernel(72, narrow, true, false)));
        assert!(!buildable(&kernel(16, wide, true, false)));
        assert!(!buildable(&kernel(272, short, true, false)));
        assert!(!buildable(&kernel(192, narrow, true, false)));
        let f32k = AttentionKernel {
            storage: Storage::F32,
            ..kernel(64, wide, true, false)
        };
        assert!(!buildable(&f32k));
        // The backward: Dq and DkDv (head dim 64, and 128 with two warpgroups), not Prep,
        // not Dq computing Dsum itself.
        let stage = |stage, d, variant| AttentionKernel {
            stage,
            ..kernel(d, variant, true, false)
        };
        assert!(buildable(&stage(AttnStage::Dq, 64, narrow)));
        assert!(buildable(&stage(AttnStage::Dq, 128, narrow)));
        assert!(buildable(&stage(AttnStage::DkDv, 64, narrow)));
        assert!(buildable(&stage(AttnStage::DkDv, 128, narrow)));
        assert!(!buildable(&stage(AttnStage::DkDv, 128, NATIVE_VARIANTS[1])));
        assert!(!buildable(&stage(AttnStage::Prep, 64, narrow)));
        for d in [144, 256] {
            assert!(buildable(&stage(AttnStage::Dq, d, short)));
            assert!(buildable(&stage(AttnStage::DkDv, d, short)));
        }
        // Dq splits D past 192 (registers), and only there.
        assert_eq!(column_parts(&stage(AttnStage::Dq, 256, short)), 2);
        assert_eq!(column_parts(&stage(AttnStage::Dq, 192, short)), 1);
        assert_eq!(column_parts(&stage(AttnStage::DkDv, 256, short)), 1);
        assert_eq!(panel_width(80), 128);
        assert_eq!(panel_width(32), 64);
        // 192 × 64: the forward's at head dim 64 alone.
        assert!(buildable(&stage(AttnStage::Forward, 64, tall)));
        assert!(!buildable(&stage(AttnStage::Forward, 128, tall)));
        assert!(!buildable(&stage(AttnStage::Dq, 64, tall)));
        assert!(!buildable(&stage(AttnStage::DkDv, 64, tall)));
        // Which the causal forward tries first, and nothing else.
        assert_eq!(native_order(AttnStage::Forward, true)[0], tall);
        assert_eq!(native_order(AttnStage::Forward, false), NATIVE_VARIANTS);
        assert_eq!(native_order(AttnStage::Dq, true), NATIVE_VARIANTS);
        // Dsum from O and dO: Dq's alone.
        let own = AttentionKernel {
            own_dsum: true,
            ..stage(AttnStage::Dq, 64, narrow)
        };
        assert!(buildable(&own));
        assert!(!buildable(&AttentionKernel {
            stage: AttnStage::DkDv,
            ..own
        }));
        // Dq's K ring and the forward's V ring take a third stage where it fits; DkDv's
        // rings keep two.
        assert_eq!(ring_stages(&stage(AttnStage::Dq, 64, wide)), [3, 2]);
        assert_eq!(ring_stages(&stage(AttnStage::Dq, 128, narrow)), [3, 2]);
        assert_eq!(ring_stages(&stage(AttnStage::Forward, 64, wide)), [2, 3]);
        assert_eq!(ring_stages(&stage(AttnStage::Forward, 128, narrow)), [2, 3]);
        assert_eq!(ring_stages(&stage(AttnStage::DkDv, 64, wide)), [2, 2]);
        for kern in [
            stage(AttnStage::Dq, 64, wide),
            stage(AttnStage::Dq, 128, narrow),
            stage(AttnStage::Forward, 64, wide),
            stage(AttnStage::Forward, 128, narrow),
        ] {
            assert!(buildable(&kern) && shared_bytes(&kern) <= 48 * 1024);
        }
        assert!(!kernel(64, wide, true, false).native_feasible(Some(Target::SM90)));
        assert!(kernel(64, wide, true, false).native_feasible(Some(Target::SM90A)));
    }

    /// The grid is one block per SM (or per item when there are fewer), and misaligned
    /// views are refused with an error, not launched.
    #[test]
    fn launches_walk_items_and_refuse_misaligned_views() {
        let k = kernel(64, NATIVE_VARIANTS[0], true, false);
        let shape = AttnShape {
            batch: 8,
            t: 1024,
            heads: 12,
        };
        let v = ViewStrides {
            offset: 0,
            batch: 1024 * 2304,
            seq: 2304,
            head: 64,
        };
        let views = [
            v,
            ViewStrides { offset: 768, ..v },
            ViewStrides { offset: 1536, ..v },
        ];
        let bufs = [0x1000, 0x1000, 0x1000, 0x8000, 0x9000];
        let l = k
            .native_launch(shape, 0.125, &views, &bufs, 0x4000, Some(132))
            .unwrap();
        assert_eq!(l.grid, [132, 1, 1]);
        assert_eq!(l.block, [384, 1, 1]);
        let small = AttnShape {
            batch: 1,
            t: 200,
            heads: 2,
        };
        let l = k
            .native_launch(small, 0.125, &views, &bufs, 0x4000, Some(132))
            .unwrap();
        assert_eq!(l.grid, [4, 1, 1]);
        let odd = [v, ViewStrides { offset: 3, ..v }, v];
        let err = k
            .native_launch(shape, 0.125, &odd, &bufs, 0x4000, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("aligned"), "{err}");
    }
}
