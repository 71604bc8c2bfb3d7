//! Fused scaled-dot-product attention, flash style: forward and backward kernels whose
//! scores never reach memory.
//!
//! Semantics (the CPU reference, `helios::cpu::attention`, is the definition): for batch b,
//! head h, query i, `O[i] = Σ_j softmax_j(scale·Q[i]·K[j]) V[j]` over the keys j kept by the
//! mask: `j < len[b]` (key padding; `len` = T without it) and, when causal, j ≤ i. The
//! forward also writes the row's log-sum-exp `L[i] = log Σ_j exp(scale·Q[i]·K[j])` (−inf,
//! with O = 0, for a row with no key). Backward follows FlashAttention-2: a `Prep` pass
//! writes `Dsum[i] = Σ_d dO[i,d]·O[i,d]`, then `DkDv` walks query blocks per key block and
//! `Dq` key blocks per query block, each recomputing P = exp(S − L); no atomics, so every
//! gradient is deterministic. The register-resident and the native `Dq` compute Dsum
//! themselves from the dO rows they hold and O, write it, and run before `DkDv`
//! (`AttentionKernel::own_dsum`), saving the Prep pass; the SIMT Dq does not (on its small
//! grids DkDv and Dq side by side win). dQ is not summed with atomics from DkDv as in
//! FlashAttention-2: without vector float atomics in Vulkan the adds cost as much as the Dq
//! kernel, and the native DkDv's f32 atomics measured slower than the native Dq too. The
//! measurements behind these choices, the comparison with PyTorch's SDPA and where the
//! register kernels' time goes are in `bench/results/attention-design-history.md`.
//!
//! Key decisions a reader must know:
//! - Q, K, V, O (in backward) and dO are read through strides (push constants): the fused
//!   QKV projection's [B, T, 3, H, D] output is read in place. Outputs O, dQ, dK, dV are
//!   dense [B, T, H, D]; L and Dsum are f32 [B, H, T].
//! - Two families of variants, kept side by side in [`AttnVariant`]: `Simt` (f32 math,
//!   every device: `simt`) and `Coop` (f16/bf16 on 16×16×16 cooperative matrices
//!   with f32 accumulation). A `Coop` kernel keeps its score tiles in registers
//!   (`reg_fwd`, `reg_bwd`, FlashAttention-2 style) when the kernel signature carries the
//!   device's probed fragment layout ([`crate::FragMap`]), else it does the element-wise
//!   work (mask, exp, dS) on score tiles in shared memory (`coop_fwd` forward,
//!   `coop_bwd` backward). Which runs is `helios`'s one selection function (a
//!   forced variant, the tuned one, else the first of [`default_order`] that fits the
//!   device).
//! - A third family, `Native`, is the forward, Dq and DkDv (head dims 32 to 256) as PTX with
//!   Hopper's `wgmma` for NVIDIA's native path (`native/`: its own signature checks, launch
//!   and generators; Prep stays cooperative). Where the device has native kernels they come
//!   first and the tuners weigh them beside the cooperative tiles.
//!
//! How the files relate (each imports only files below it in this list; no stage file
//! imports another):
//! - this file: the build dispatch (stage × variant → generator), which kernels exist
//!   (`buildable`), shared-memory sizes, the launch, the validation samples;
//! - the stage generators: `prep` (Dsum, both families), `simt/` (`fwd`, `bwd` on the tiles
//!   of `simt/mod.rs`), `coop_fwd` and `coop_bwd` (scores in shared memory), `reg_fwd` and
//!   `reg_bwd` (scores in registers);
//! - `frag/`, what the cooperative stages share: `frag/blocks.rs` (the register kernels'
//!   key-block walk and start-up) over `frag/regs.rs` (score tiles on the fragment map) over
//!   `frag/mod.rs` (fragment sizes, staging, packing, fragment loads);
//! - `params`: the buffers and push constants a stage declares (`View`, `Params`), block
//!   coordinates, key ranges and masks;
//! - `signature`: the public signature ([`AttentionKernel`], [`AttnStage`], [`AttnVariant`],
//!   [`ViewStrides`], [`AttnShape`], the candidate lists and [`default_order`]);
//! - [`layout`]: the device's fragment layout ([`crate::FragMap`], the probe kernel; public
//!   as `helios_kernels::coop_layout` too);
//! - `native/`, apart from the SPIR-V files and over `signature` (which has its warpgroup
//!   sizes, as it has the SIMT tile's): `mod.rs` (which tiles exist, shared memory, the
//!   launch) over `kernel.rs` (parameters, the work walk, every stage's split into roles)
//!   over `producer.rs` (tensor maps, the copies) and the consumers: `dq.rs` and `dkdv.rs`
//!   over `consumer.rs` (the forward's products and softmax, and what the stages share);
//! - [`decode`], apart from the rest: one query per head over a key/value cache (decoding),
//!   with its own signature ([`decode::DecodeKernel`]); it shares only [`ViewStrides`].

mod coop_bwd;
mod coop_fwd;
pub mod decode;
mod frag;
pub mod layout;
mod native;
mod params;
mod prep;
mod reg_bwd;
mod reg_fwd;
mod signature;
mod simt;

pub use native::{native_order, NATIVE_VARIANTS};
pub use params::stride_groups;
pub use signature::{
    default_order, AttentionKernel, AttnShape, AttnStage, AttnVariant, ViewStrides, COOP_VARIANTS,
    PREP_LANES, PREP_WORKGROUP, SIMT_VARIANTS,
};

use helios_spirv::{Binding, KernelModule};

use crate::launch::{grid, pack_push, Arg, Args, Launch};
use crate::storage::Storage;
use crate::KernelError;
use prep::build_prep;

/// Whether the cooperative family has a kernel for `stage` (the others run SIMT kernels).
pub fn coop_supports(stage: AttnStage) -> bool {
    let _ = stage;
    true
}

impl AttentionKernel {
    /// Whether this stage's family has the variant: pairs are the register forward's,
    /// `own_dsum` the register Dq's (and the native Dq's), and `native` says which native
    /// kernels exist.
    pub fn buildable(&self) -> bool {
        if self.variant.is_native() {
            return native::buildable(self);
        }
        (!matches!(self.variant, AttnVariant::CoopPair { .. })
            || (self.in_registers() && self.stage == AttnStage::Forward))
            && (!self.own_dsum || (self.in_registers() && self.stage == AttnStage::Dq))
    }

    /// Bytes of workgroup-shared memory the kernel declares.
    pub fn shared_bytes(&self) -> u32 {
        match self.variant {
            AttnVariant::Simt { .. } => simt::shared_bytes(self),
            AttnVariant::Coop { .. } if self.in_registers() => frag::regs::layout(self).total * 16,
            AttnVariant::Coop { .. } => coop_shared_bytes(self),
            // Only the register forward has pairs (see `buildable`).
            AttnVariant::CoopPair { .. } => frag::regs::layout(self).total * 16,
            AttnVariant::Native { .. } => native::shared_bytes(self),
        }
    }

    /// Emits the kernel. Buffers, in order: Forward q, k, v, \[lens], o, lse; Prep o, do,
    /// dsum; DkDv q, k, v, do, lse, dsum, \[lens], dk, dv; Dq the same with dq, or with
    /// `own_dsum` q, k, v, do, lse, o, \[lens], dsum, dq. Push constants
    /// after them: t, heads, batch, scale, then per [`stride_groups`] group the offset of
    /// each member and the group's batch, seq and head strides (Forward (q, k, v); Prep (o),
    /// (do); backward (q, k, v), (do)).
    pub fn build(&self) -> KernelModule {
        assert!(
            self.head_dim % 16 == 0 && self.head_dim > 0,
            "head dim {} is not a multiple of 16",
            self.head_dim
        );
        assert!(
            !self.pipelined || self.pipelining().is_some(),
            "{} has no pipelined form",
            self.name()
        );
        assert!(self.buildable(), "{} has no kernel", self.name());
        match self.variant {
            AttnVariant::Simt { .. } => build_simt(self),
            AttnVariant::Coop { .. } if self.in_registers() => match self.stage {
                AttnStage::Forward => reg_fwd::forward(self),
                AttnStage::DkDv => reg_bwd::dkdv(self),
                AttnStage::Dq => reg_bwd::dq(self),
                AttnStage::Prep => unreachable!("Prep is never in registers"),
            },
            AttnVariant::Coop { .. } => build_coop(self),
            AttnVariant::CoopPair { .. } => reg_fwd::forward(self),
            AttnVariant::Native { .. } => {
                panic!("{} is a native kernel: build_native", self.name())
            }
        }
    }

    /// The launch of this kernel for the `batch × t × heads` rows of `shape`. `buffers`:
    /// device addresses in declaration order (ignored with descriptors); `views`: the strided
    /// inputs' strides.
    pub fn launch(
        &self,
        module: &KernelModule,
        max_groups_x: u32,
        shape: AttnShape,
        scale: f32,
        views: &[ViewStrides],
        buffers: &[u64],
    ) -> Result<Launch, KernelError> {
        let AttnShape { batch, t, heads } = shape;
        let mut args = Args::new();
        if self.binding == Binding::DeviceAddress {
            args.extend(buffers.iter().map(|&a| Arg::Address(a)));
        }
        args.extend([t, heads, batch].map(Arg::U32));
        args.push(Arg::F32(scale));
        for g in stride_groups(self.stage) {
            let first = views.get(g[0]).copied().unwrap_or_default();
            for &i in g.iter() {
                let v = views.get(i).copied().unwrap_or_default();
                if (v.batch, v.seq, v.head) != (first.batch, first.seq, first.head) {
                    return Err(KernelError::Arguments {
                        kernel: self.name(),
                        detail: format!(
                            "inputs {} and {i} of one stride group differ: {first:?} vs {v:?}",
                            g[0]
                        ),
                    });
                }
                args.push(Arg::U32(v.offset));
            }
            args.extend([first.batch, first.seq, first.head].map(Arg::U32));
        }
        let (bq, bk) = self.variant.blocks();
        let bh = u64::from(batch) * u64::from(heads);
        let groups = match self.stage {
            AttnStage::Prep => grid(
                (bh * u64::from(t)).div_ceil(u64::from(PREP_WORKGROUP / self.prep_lanes())),
                max_groups_x,
            )?,
            stage => {
                let block = if stage == AttnStage::DkDv { bk } else { bq };
                let blocks = u64::from(t.div_ceil(block));
                for (what, size) in [("batch × heads", bh), ("sequence blocks", blocks)] {
                    if size > u64::from(crate::launch::MIN_GROUPS_LIMIT) {
                        return Err(KernelError::TooLarge { what, size });
                    }
                }
                let g = head_group(bh as u32, t, self.head_dim, self.storage);
                [g, blocks as u32, bh as u32 / g]
            }
        };
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch { groups, push })
    }

    /// A representative set of kernels for validation: every stage, storage and head dim
    /// of the SIMT family (causal/padded alternating), in `binding`; `Prep` both with
    /// subgroup shuffles and without.
    pub fn samples(binding: Binding) -> Vec<AttentionKernel> {
        let mut out = Vec::new();
        for (i, &head_dim) in [32u32, 64, 80, 96, 128].iter().enumerate() {
            for storage in Storage::ALL {
                for stage in AttnStage::ALL {
                    let kern = AttentionKernel {
                        stage,
                        storage,
                        head_dim,
                        causal: i % 2 == 0,
                        padded: i % 3 == 1,
                        variant: SIMT_VARIANTS[i % SIMT_VARIANTS.len()],
                        binding,
                        subgroup: 0,
                        frag: None,
                        pipelined: false,
                        own_dsum: false,
                        packed: false,
                    };
                    out.push(kern);
                    if stage == AttnStage::Prep {
                        out.push(AttentionKernel {
                            subgroup: [4, 32][i % 2],
                            ..kern
                        });
                    }
                    if matches!(stage, AttnStage::Dq | AttnStage::DkDv) {
                        out.push(AttentionKernel {
                            packed: true,
                            ..kern
                        });
                    }
                }
            }
        }
        out
    }

    /// Cooperative-matrix kernels for validation (Vulkan 1.3, device addresses): both
    /// families, the register one with NVIDIA's fragment map.
    pub fn coop_samples() -> Vec<AttentionKernel> {
        let (acc, a) = crate::FragMap::nvidia_probe();
        let map = crate::FragMap::recognise(&acc, &a).expect("NVIDIA's layout is recognised");
        let mut out = Vec::new();
        for (i, &head_dim) in [32u32, 64, 80, 96, 128].iter().enumerate() {
            for storage in [Storage::F16, Storage::BF16] {
                for stage in AttnStage::ALL.into_iter().filter(|&s| coop_supports(s)) {
                    for frag in [None, Some(map)] {
                        let kern = AttentionKernel {
                            stage,
                            storage,
                            head_dim,
                            causal: i % 2 == 0,
                            padded: i % 3 == 1,
                            variant: COOP_VARIANTS[i % COOP_VARIANTS.len()],
                            binding: Binding::DeviceAddress,
                            subgroup: 32,
                            frag,
                            pipelined: false,
                            own_dsum: false,
                            packed: false,
                        };
                        out.push(kern);
                        out.extend(kern.pipelining());
                        if frag.is_some() && stage == AttnStage::Dq {
                            out.push(AttentionKernel {
                                own_dsum: true,
                                ..kern
                            });
                        }
                        if matches!(stage, AttnStage::Dq | AttnStage::DkDv) {
                            out.push(AttentionKernel {
                                packed: true,
                                own_dsum: frag.is_some() && stage == AttnStage::Dq,
                                ..kern
                            });
                        }
                        if frag.is_some() && stage == AttnStage::Forward {
                            let pair = AttentionKernel {
                                variant: AttnVariant::CoopPair { bq: 128, bk: 32 },
                                ..kern
                            };
                            out.push(pair);
                            out.extend(pair.pipelining());
                        }
                    }
                }
            }
        }
        out
    }
}

/// The SIMT family's kernel for the stage.
fn build_simt(kern: &AttentionKernel) -> KernelModule {
    match kern.stage {
        AttnStage::Prep => build_prep(kern),
        AttnStage::Forward => simt::fwd::forward(kern),
        AttnStage::DkDv => simt::bwd::dkdv(kern),
        AttnStage::Dq => simt::bwd::dq(kern),
    }
}

/// Shared bytes of a cooperative kernel with its scores in shared memory.
fn coop_shared_bytes(kern: &AttentionKernel) -> u32 {
    match kern.stage {
        AttnStage::Forward => coop_fwd::layout(kern).total * 16,
        AttnStage::Prep => 0,
        _ => coop_bwd::layout(kern).total * 16,
    }
}

/// A cooperative kernel with its scores in shared memory (and the Prep kernel).
fn build_coop(kern: &AttentionKernel) -> KernelModule {
    assert!(
        kern.storage != Storage::F32,
        "cooperative attention needs f16 or bf16"
    );
    match kern.stage {
        AttnStage::Prep => build_prep(kern),
        AttnStage::Forward => coop_fwd::forward(kern),
        AttnStage::DkDv => coop_bwd::dkdv(kern),
        AttnStage::Dq => coop_bwd::dq(kern),
    }
}

/// Bytes of the streamed tensors of one (b, h) (K and V, or Q and dO) that
/// [`head_group`] keeps within, so that the heads running at once share L2. Smaller groups
/// measured slower and larger ones no faster (bench/results/source-comment-history.md).
const GROUP_BYTES: u64 = 16 << 20;

/// Heads (b·H + h) per dispatch group: the largest divisor of `bh` whose streamed tensors
/// fit [`GROUP_BYTES`] (1 at least).
///
/// The grid is (heads in the group, blocks, groups), and the GPU starts workgroups x
/// fastest: within a group every head runs its block 0 (with
/// [`block_coords`](params::block_coords), the one with the most work when causal) before
/// any runs its block 1, so the last workgroups to start are the shortest (longest
/// processing time first). Before this order, blocks ran in x and the heavy blocks of the
/// last heads started last, which measured slower. Grouping keeps the heads in flight few
/// enough to share their streamed tensors in L2: all heads at once slowed the backward
/// (both in bench/results/source-comment-history.md).
fn head_group(bh: u32, t: u32, head_dim: u32, storage: Storage) -> u32 {
    let per_head = 2 * u64::from(t) * u64::from(head_dim) * u64::from(storage.bytes());
    let fit = (GROUP_BYTES / per_head.max(1)).clamp(1, u64::from(bh)) as u32;
    (1..=fit).rev().find(|g| bh % g == 0).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pipelined form and the row-tile pairs exist only for the forward with the scores
    /// in registers; the pipelined layout holds two K/V buffer pairs with the start-up
    /// region over them.
    #[test]
    fn pairs_and_pipelining_belong_to_the_register_forward() {
        let (acc, a) = crate::FragMap::nvidia_probe();
        let map = crate::FragMap::recognise(&acc, &a).expect("NVIDIA's layout");
        let base = AttentionKernel {
            stage: AttnStage::Forward,
            storage: Storage::BF16,
            head_dim: 64,
            causal: true,
            padded: false,
            variant: AttnVariant::Coop { bq: 128, bk: 32 },
            binding: Binding::DeviceAddress,
            subgroup: 32,
            frag: Some(map),
            pipelined: false,
            own_dsum: false,
            packed: false,
        };
        let piped = base.pipelining().expect("the register forward pipelines");
        assert!(
            piped.name().ends_with("coop128x32_reg_pipe"),
            "{}",
            piped.name()
        );
        // Rows of 64 halves take 8 words plus one of padding. Two pairs of 32-row K and V
        // tiles (1152 words) hold the 128 staged Q rows (1152) too.
        assert_eq!(piped.shared_bytes(), 1152 * 16);
        let wide = AttentionKernel {
            variant: AttnVariant::Coop { bq: 128, bk: 64 },
            ..piped
        };
        assert_eq!(wide.shared_bytes(), 2 * 2 * 64 * 9 * 16);
        for stage in [AttnStage::DkDv, AttnStage::Dq, AttnStage::Prep] {
            assert!(AttentionKernel { stage, ..base }.pipelining().is_none());
        }
        assert!(AttentionKernel { frag: None, ..base }
            .pipelining()
            .is_none());

        let pair = AttentionKernel {
            variant: AttnVariant::CoopPair { bq: 128, bk: 32 },
            ..base
        };
        assert!(pair.buildable());
        assert_eq!(pair.workgroup(), 4 * 32, "32 query rows per subgroup");
        for stage in [AttnStage::DkDv, AttnStage::Dq] {
            assert!(!AttentionKernel { stage, ..pair }.buildable());
        }
        assert!(!AttentionKernel { frag: None, ..pair }.buildable());
        assert_eq!(AttnVariant::by_name("simt16x16p"), None);
    }

    /// Only the register Dq computes Dsum itself (it stages dO rows and knows the fragment
    /// layout to hand each row's sum to its invocations).
    #[test]
    fn own_dsum_belongs_to_the_register_dq() {
        let (acc, a) = crate::FragMap::nvidia_probe();
        let map = crate::FragMap::recognise(&acc, &a).expect("NVIDIA's layout");
        let dq = AttentionKernel {
            stage: AttnStage::Dq,
            storage: Storage::F16,
            head_dim: 80,
            causal: true,
            padded: true,
            variant: AttnVariant::Coop { bq: 64, bk: 32 },
            binding: Binding::DeviceAddress,
            subgroup: 32,
            frag: Some(map),
            pipelined: false,
            own_dsum: true,
            packed: false,
        };
        assert!(dq.buildable());
        assert!(dq.name().ends_with("_reg_dsum"), "{}", dq.name());
        assert!(!AttentionKernel { frag: None, ..dq }.buildable());
        for stage in [AttnStage::Forward, AttnStage::Prep, AttnStage::DkDv] {
            assert!(!AttentionKernel { stage, ..dq }.buildable());
        }
        let simt = AttentionKernel {
            variant: AttnVariant::Simt { bq: 32, bk: 16 },
            frag: None,
            subgroup: 0,
            ..dq
        };
        assert!(!simt.buildable());
    }

    #[test]
    fn head_groups_divide_the_heads_and_fit_l2() {
        // GPT-2 at T = 512 (128 KiB a head): all 96 heads; at 1024 (256 KiB): 48 of them.
        assert_eq!(head_group(96, 512, 64, Storage::BF16), 96);
        assert_eq!(head_group(96, 1024, 64, Storage::BF16), 48);
        // 1 MiB a head: 16 of 64.
        assert_eq!(head_group(64, 2048, 128, Storage::F16), 16);
        // A prime count of heads too large for one group runs them one at a time.
        assert_eq!(head_group(97, 8192, 128, Storage::F32), 1);
        assert_eq!(head_group(1, 1 << 20, 256, Storage::F32), 1);
    }

    #[test]
    fn variant_tags_round_trip() {
        for v in SIMT_VARIANTS
            .into_iter()
            .chain(COOP_VARIANTS)
            .chain(NATIVE_VARIANTS)
        {
            assert_eq!(AttnVariant::by_name(&v.tag()), Some(v));
        }
        assert_eq!(AttnVariant::by_name("nv128x32pp"), None);
        assert_eq!(AttnVariant::by_name("simt"), None);
        assert_eq!(AttnVariant::by_name("coop64"), None);
    }

    /// Every stage of the default order has a tile that fits lavapipe's 32 KiB (SIMT) and
    /// one that fits 48 KiB (cooperative), for every head dim the issue names.
    #[test]
    fn default_tiles_fit_the_devices() {
        for d in [32, 64, 80, 96, 128] {
            for stage in AttnStage::ALL {
                for (coop, limit, storage) in [
                    (false, 32 << 10, Storage::F32),
                    (true, 48 << 10, Storage::BF16),
                ] {
                    let fits = default_order(stage, coop, false)
                        .into_iter()
                        .filter(|v| v.is_coop() == coop)
                        .any(|variant| {
                            let k = AttentionKernel {
                                stage,
                                storage,
                                head_dim: d,
                                causal: true,
                                padded: false,
                                variant,
                                binding: Binding::DeviceAddress,
                                subgroup: if coop { 32 } else { 0 },
                                frag: None,
                                pipelined: false,
                                own_dsum: false,
                                packed: false,
                            };
                            k.shared_bytes() <= limit
                        });
                    assert!(fits, "{stage:?} d{d} coop {coop}");
                }
            }
        }
    }
}
