//! Fused scaled-dot-product attention, flash style: forward and backward kernels whose
//! scores never reach memory.
//!
//! Semantics (the CPU reference, `helios::cpu::attention`, is the definition): for batch b,
//! head h, query i, O[i] = Σ_j softmax_j(scale·Q[i]·K[j]) V[j] over the keys j kept by the
//! mask: j < len[b] (key padding; `len` = T without it) and, when causal, j ≤ i. The forward
//! also writes the row's log-sum-exp L[i] = log Σ_j exp(scale·Q[i]·K[j]) (−inf, with O = 0,
//! for a row with no key). Backward follows FlashAttention-2: a `Prep` pass writes
//! Dsum[i] = Σ_d dO[i,d]·O[i,d], then `DkDv` walks query blocks per key block and `Dq` key
//! blocks per query block, each recomputing P = exp(S − L); no atomics, so every gradient is
//! deterministic. The register-resident `Dq` computes Dsum itself from the dO rows it stages
//! and O, writes it, and runs before `DkDv` (`AttentionKernel::own_dsum`): the Prep pass
//! cost 8.8 µs at 8×12×512×64 and 13.7 at T = 1024 (H100), its Dsum 2–3 µs inside Dq.
//! The SIMT Dq computing Dsum the same way measured slower (session 27, H100, f32
//! fwd+bwd 4×4×128×32 48.1 µs against 36.1, 1×4×64×32 30.0 against 25.8; lavapipe no
//! different): on grids that small, DkDv and Dq running side by side after the short Prep
//! pass is worth more than the dispatch saved.
//!
//! Why dQ is not summed with atomics from the DkDv kernel, as FlashAttention-2 does (two
//! products fewer): measured on an H100 (session 23, patch in `bench/results/2026-11-27-
//! attention-dkdvq-session23.patch`), bf16 8×12×1024×64, that kernel took 295 µs against
//! DkDv's 130 plus Dq's 95. Its dQ products and ~54 M f32 atomic adds (one per query row,
//! head dim and visited 64-key block) cost 90–110 µs, as much as the separate Dq kernel,
//! and Vulkan has no vector float atomics or bulk reductions to make them cheaper. With
//! 128-key blocks (half the adds) and the adds coalesced per row through shared memory, the
//! whole fwd+bwd was still 10 µs slower (332 against 322, profiled).
//!
//! What to compare against (session 31, H200, `bench attention --compare torch`): PyTorch
//! 2.11's SDPA runs cuDNN's sm90 kernels on wgmma, which Vulkan's cooperative matrices do not
//! reach on NVIDIA's driver (it emits mma.sync, about two thirds of wgmma's rate). On the same
//! instructions, FlashAttention-2 (SDPA with that backend forced) takes 312 µs fwd+bwd at bf16
//! 8×12×1024×64 and 127 at T = 512, against our 303 and 105; cuDNN takes 196 and 82. The
//! bench prints both.
//!
//! Where the register kernels' time goes at 8×12×512×64 bf16 (H100, session 24, ablations
//! in `bench/results/2026-11-27-session24-h100.txt`): of forward 27.6 µs, Dq 35.4 and DkDv
//! 42.5, a workgroup's start and end alone (no key or query loop) take 11.2, 12.9 and
//! 16.3, of which the output stores 5.2, 4.6 and 9.3; the diagonal blocks 6, 5 and 7; the
//! parts add up, so starts and ends hardly overlap other workgroups' loops. Tried there
//! and not kept (patches beside the figures): DkDv computing Dsum itself so that it and
//! Dq run side by side (DkDv 11% slower, no overlap gained); each subgroup of the forward
//! storing its rows after its last key block (forward +40%; its registers were not read,
//! and the shipped forward's 127 sit at the limit for two workgroups an SM); several tiles
//! per workgroup (every stage slower); a grid order pairing heavy and light blocks (slower
//! than heaviest first); Dq loading V late (registers unchanged).
//!
//! Key decisions a reader must know:
//! - Q, K, V, O (in backward) and dO are read through strides (push constants): the fused
//!   QKV projection's [B, T, 3, H, D] output is read in place. Outputs O, dQ, dK, dV are
//!   dense [B, T, H, D]; L and Dsum are f32 [B, H, T].
//! - Two families of variants, kept side by side in [`AttnVariant`]: `Simt` (f32 math,
//!   every device: `attention_simt`) and `Coop` (f16/bf16 on 16×16×16 cooperative matrices
//!   with f32 accumulation). A `Coop` kernel keeps its score tiles in registers
//!   (`attention_frag`, FlashAttention-2 style) when the kernel signature carries the
//!   device's probed fragment layout ([`crate::FragMap`]), else it does the element-wise
//!   work (mask, exp, dS) on score tiles in shared memory (`attention_coop` forward,
//!   `attention_coop_bwd` backward). Which runs is `helios`'s one selection function (a
//!   forced variant, the tuned one, else the first of [`default_order`] that fits the
//!   device).

use helios_spirv::{Access, Binding, Buffer, KernelBuilder, KernelModule, Param, Scalar, Ty, Val};

use crate::launch::{grid, pack_push, Arg, Args, Launch};
use crate::storage::{buffer_scalar, Storage};
use crate::KernelError;

/// Invocations per workgroup of the `Prep` kernel: 64 rows of [`PREP_LANES`].
pub const PREP_WORKGROUP: u32 = 256;

/// Invocations per row of the `Prep` kernel where subgroup shuffles combine them (see
/// [`build_prep`]). Four lanes of vec4s cover 16 elements, a 32-byte sector of halves, per
/// load; every head dim (a multiple of 16) divides among them evenly; and every device whose
/// subgroups the row kernels use (power-of-two sizes of 4 or more: lavapipe's are 4, 8 or
/// 16 with the host's vector width) holds a row in one subgroup, so the kernel does not
/// depend on the size. Fewer lanes than D/8 also leave more loads in flight per lane
/// (D/16 of each input).
pub const PREP_LANES: u32 = 4;

/// Which kernel of the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnStage {
    /// O and L from Q, K, V.
    Forward,
    /// Dsum = rowsum(dO ∘ O).
    Prep,
    /// dK and dV, one key block per workgroup.
    DkDv,
    /// dQ, one query block per workgroup.
    Dq,
}

impl AttnStage {
    pub const ALL: [AttnStage; 4] = [
        AttnStage::Forward,
        AttnStage::Prep,
        AttnStage::DkDv,
        AttnStage::Dq,
    ];

    fn tag(self) -> &'static str {
        match self {
            AttnStage::Forward => "fwd",
            AttnStage::Prep => "prep",
            AttnStage::DkDv => "dkdv",
            AttnStage::Dq => "dq",
        }
    }
}

/// The candidate kernels: block sizes are query rows (`bq`) and key rows (`bk`) per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttnVariant {
    /// f32 math, SIMT register tiles of 4 owned rows per invocation (`attention_simt`).
    Simt { bq: u8, bk: u8 },
    /// Cooperative matrices: one subgroup per 16 owned rows.
    Coop { bq: u8, bk: u8 },
    /// Cooperative matrices, the forward with the scores in registers only: one subgroup per
    /// 32 query rows, two 16-row tiles sharing every K and V fragment it loads (half the
    /// shared-memory reads per product).
    CoopPair { bq: u8, bk: u8 },
}

impl AttnVariant {
    /// "simt16x16", "coop64x64".
    pub fn tag(&self) -> String {
        match *self {
            AttnVariant::Simt { bq, bk } => format!("simt{bq}x{bk}"),
            AttnVariant::Coop { bq, bk } => format!("coop{bq}x{bk}"),
            AttnVariant::CoopPair { bq, bk } => format!("coop{bq}x{bk}p"),
        }
    }

    pub fn blocks(&self) -> (u32, u32) {
        match *self {
            AttnVariant::Simt { bq, bk }
            | AttnVariant::Coop { bq, bk }
            | AttnVariant::CoopPair { bq, bk } => (u32::from(bq), u32::from(bk)),
        }
    }

    pub fn is_coop(&self) -> bool {
        matches!(
            self,
            AttnVariant::Coop { .. } | AttnVariant::CoopPair { .. }
        )
    }

    /// 16-row tiles per subgroup (cooperative variants).
    pub fn row_tiles(&self) -> u32 {
        match self {
            AttnVariant::CoopPair { .. } => 2,
            _ => 1,
        }
    }

    /// Parses a tag (`HELIOS_ATTN_VARIANT`).
    pub fn by_name(s: &str) -> Option<AttnVariant> {
        let (coop, rest) = if let Some(r) = s.strip_prefix("simt") {
            (false, r)
        } else {
            (true, s.strip_prefix("coop")?)
        };
        let (rest, pair) = match rest.strip_suffix('p') {
            Some(r) if coop => (r, true),
            _ => (rest, false),
        };
        let (a, b) = rest.split_once('x')?;
        let (bq, bk) = (a.parse().ok()?, b.parse().ok()?);
        Some(match (coop, pair) {
            (true, true) => AttnVariant::CoopPair { bq, bk },
            (true, false) => AttnVariant::Coop { bq, bk },
            _ => AttnVariant::Simt { bq, bk },
        })
    }
}

const fn simt(bq: u8, bk: u8) -> AttnVariant {
    AttnVariant::Simt { bq, bk }
}

/// SIMT candidates (the tuner times those that fit). The owned block (bq, or bk for DkDv)
/// is a multiple of 4, the other a multiple of 8.
pub const SIMT_VARIANTS: [AttnVariant; 8] = [
    simt(64, 32),
    simt(64, 16),
    simt(32, 32),
    simt(32, 16),
    simt(16, 32),
    simt(16, 16),
    simt(8, 16),
    simt(16, 8),
];
/// Cooperative-matrix candidates (the 128-row tiles fit 48 KiB only with the scores in
/// registers; the pairs are the register forward's).
pub const COOP_VARIANTS: [AttnVariant; 10] = [
    AttnVariant::Coop { bq: 64, bk: 64 },
    AttnVariant::Coop { bq: 64, bk: 32 },
    AttnVariant::Coop { bq: 32, bk: 64 },
    AttnVariant::Coop { bq: 32, bk: 32 },
    AttnVariant::Coop { bq: 128, bk: 64 },
    AttnVariant::Coop { bq: 128, bk: 32 },
    AttnVariant::Coop { bq: 64, bk: 128 },
    AttnVariant::CoopPair { bq: 128, bk: 32 },
    AttnVariant::CoopPair { bq: 128, bk: 64 },
    AttnVariant::CoopPair { bq: 64, bk: 32 },
];

/// Candidates for `stage` in the order the selection function tries them without a tuned
/// choice (the first that fits the device's shared memory and workgroup limits wins).
/// Cooperative orders as measured on an H100: with the scores in `registers` (bf16, each
/// tile forced, pipelined: forward 128×32 26.0 µs at 8×12×512×64 and 72.2 at T = 1024,
/// 128×64 28.8 and 79.1; DkDv keeps 32-query blocks) or in shared memory (the backward
/// kernels keep half a score row of S, dP, L and Dsum per invocation: DkDv prefers
/// 32-query blocks).
pub fn default_order(stage: AttnStage, coop: bool, registers: bool) -> Vec<AttnVariant> {
    let c = |bq, bk| AttnVariant::Coop { bq, bk };
    let mut out = Vec::new();
    if coop {
        out.extend(match (stage, registers) {
            (AttnStage::DkDv, _) => vec![c(32, 64), c(32, 32), c(64, 32), c(64, 64)],
            (AttnStage::Dq, false) => vec![c(64, 32), c(32, 32), c(64, 64), c(32, 64)],
            (AttnStage::Dq, true) => vec![c(64, 32), c(128, 64), c(32, 32), c(64, 64)],
            (_, true) => vec![c(128, 32), c(128, 64), c(64, 32), c(64, 64), c(32, 32)],
            _ => vec![c(64, 64), c(64, 32), c(32, 64), c(32, 32)],
        });
        let rest: Vec<AttnVariant> = COOP_VARIANTS
            .into_iter()
            .filter(|v| !out.contains(v))
            .collect();
        out.extend(rest);
    }
    // The largest tiles first: 128 invocations of 4×8 register tiles where they fit 48 KiB
    // at D = 64, down to what fits lavapipe's 32 KiB at D = 128.
    out.extend(match stage {
        AttnStage::DkDv => [simt(32, 32), simt(16, 32), simt(16, 16), simt(16, 8)],
        AttnStage::Dq => [simt(64, 16), simt(32, 32), simt(32, 16), simt(8, 16)],
        _ => [simt(64, 32), simt(32, 32), simt(16, 32), simt(16, 16)],
    });
    out
}

/// Whether the cooperative family has a kernel for `stage` (the others run SIMT kernels).
pub fn coop_supports(stage: AttnStage) -> bool {
    crate::attention_coop::supports(stage)
}

/// The signature of an attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionKernel {
    pub stage: AttnStage,
    /// Storage of Q, K, V, O, dO and the gradients (L and Dsum are always f32).
    pub storage: Storage,
    pub head_dim: u32,
    pub causal: bool,
    /// Reads key-padding lengths (u32 per batch row).
    pub padded: bool,
    pub variant: AttnVariant,
    pub binding: Binding,
    /// Subgroup size the cooperative variants are built for (0 for SIMT). `Prep` (either
    /// family) takes the size of the subgroups it may shuffle in, a power of two, or 0
    /// where the device has no subgroup shuffles (see [`AttentionKernel::prep_lanes`]).
    pub subgroup: u32,
    /// The device's fragment layout, for cooperative variants that keep scores in
    /// registers (`attention_frag`); `None` stages them in shared memory (`attention_coop`).
    pub frag: Option<crate::FragMap>,
    /// The forward with the scores in registers: software-pipelined over two K/V buffers
    /// (block j + 1's products issued before block j's softmax). Needs twice the K/V shared
    /// memory.
    pub pipelined: bool,
    /// Dq computes Dsum itself (from dO and O, O dense) and writes it for DkDv, which then
    /// runs after it: no Prep pass. Register-resident cooperative Dq only.
    pub own_dsum: bool,
    /// Dq and DkDv write into the slices of one dense [B, T, 3, H, D] gradient (whose buffer
    /// the host passes for each output) instead of dense [B, T, H, D] tensors.
    pub packed: bool,
}

/// Push-constant strides of a [B, T, H, D] view (elements; d has stride 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ViewStrides {
    pub offset: u32,
    pub batch: u32,
    pub seq: u32,
    pub head: u32,
}

/// A strided view inside a kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View {
    pub buf: Buffer,
    off: Val,
    sb: Val,
    st: Val,
    sh: Val,
}

impl View {
    /// Element index of (b, t, h, 0).
    pub fn row(&self, k: &mut KernelBuilder, b: Val, t: Val, h: Val) -> Val {
        let x = k.mul(b, self.sb);
        let y = k.mul(t, self.st);
        let z = k.mul(h, self.sh);
        let x = k.add(x, y);
        let x = k.add(x, z);
        k.add(x, self.off)
    }

    /// Whether every row starts on a multiple of 4 elements (offset and strides are).
    pub fn vec4_aligned(&self, k: &mut KernelBuilder) -> Val {
        let x = k.or(self.off, self.sb);
        let y = k.or(self.st, self.sh);
        let x = k.or(x, y);
        let three = k.u32(3);
        let x = k.and(x, three);
        let zero = k.u32(0);
        k.eq(x, zero)
    }
}

/// A kernel's parameters, loaded.
#[derive(Clone)]
pub(crate) struct Params {
    /// Strided inputs in declaration order: Forward q, k, v; Prep o, do; backward q, k, v, do.
    pub views: Vec<View>,
    /// L (Forward: written; backward: read).
    pub lse: Option<Buffer>,
    /// Dsum (Prep and a Dq with `own_dsum`: written; backward: read).
    pub dsum: Option<Buffer>,
    /// O, dense [B, T, H, D] (a Dq with `own_dsum`).
    pub o: Option<Buffer>,
    pub lens: Option<Buffer>,
    /// Outputs: Forward o; DkDv dk, dv; Dq dq. Dense [B, T, H, D], or with `packed` the
    /// slices of one [B, T, 3, H, D] tensor (offsets 0, HD, 2HD, row stride 3HD).
    pub outs: Vec<View>,
    pub t: Val,
    pub heads: Val,
    pub batch: Val,
    pub scale: Val,
}

impl AttentionKernel {
    pub fn name(&self) -> String {
        format!(
            "attn_{}_{}_d{}{}{}_{}{}{}",
            self.stage.tag(),
            self.storage.name(),
            self.head_dim,
            if self.causal { "_causal" } else { "" },
            if self.padded { "_pad" } else { "" },
            self.variant.tag(),
            if self.in_registers() { "_reg" } else { "" },
            if self.pipelined { "_pipe" } else { "" }
        ) + if self.stage == AttnStage::Prep && self.prep_lanes() > 1 {
            "_sg"
        } else {
            ""
        } + if self.own_dsum { "_dsum" } else { "" }
            + if self.packed { "_packed" } else { "" }
    }

    /// Invocations that share a row of `Prep`: [`PREP_LANES`] where the kernel may shuffle
    /// within subgroups that large, else 1.
    pub fn prep_lanes(&self) -> u32 {
        if self.subgroup >= PREP_LANES {
            PREP_LANES
        } else {
            1
        }
    }

    /// This kernel software-pipelined, where its family has that form (the forward with
    /// the scores in registers).
    pub fn pipelining(self) -> Option<AttentionKernel> {
        (self.in_registers() && self.stage == AttnStage::Forward).then_some(AttentionKernel {
            pipelined: true,
            ..self
        })
    }

    /// Whether this is a cooperative kernel that keeps its scores in registers.
    pub fn in_registers(&self) -> bool {
        self.variant.is_coop() && self.frag.is_some() && self.stage != AttnStage::Prep
    }

    /// Invocations per workgroup.
    pub fn workgroup(&self) -> u32 {
        let (bq, bk) = self.variant.blocks();
        let owned = match self.stage {
            AttnStage::Prep => return PREP_WORKGROUP,
            AttnStage::DkDv => bk,
            _ => bq,
        };
        match self.variant {
            AttnVariant::Simt { .. } => crate::attention_simt::workgroup(owned),
            AttnVariant::Coop { .. } | AttnVariant::CoopPair { .. } => {
                owned / (16 * self.variant.row_tiles()) * self.subgroup
            }
        }
    }

    /// Bytes of workgroup-shared memory the kernel declares.
    pub fn shared_bytes(&self) -> u32 {
        match self.variant {
            AttnVariant::Simt { .. } => crate::attention_simt::shared_bytes(self),
            AttnVariant::Coop { .. } if self.in_registers() => {
                crate::attention_frag::layout(self).total * 16
            }
            AttnVariant::Coop { .. } => crate::attention_coop::shared_bytes(self),
            // Only the register forward has pairs (see `buildable`).
            AttnVariant::CoopPair { .. } => crate::attention_frag::layout(self).total * 16,
        }
    }

    /// Whether this stage's family has the variant: pairs are the register forward's, and
    /// `own_dsum` the register Dq's.
    pub fn buildable(&self) -> bool {
        (!matches!(self.variant, AttnVariant::CoopPair { .. })
            || (self.in_registers() && self.stage == AttnStage::Forward))
            && (!self.own_dsum || (self.in_registers() && self.stage == AttnStage::Dq))
    }

    /// Emits the kernel. Buffers, in order: Forward q, k, v, [lens], o, lse; Prep o, do,
    /// dsum; DkDv q, k, v, do, lse, dsum, [lens], dk, dv; Dq the same with dq, or with
    /// `own_dsum` q, k, v, do, lse, o, [lens], dsum, dq. Push constants
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
            AttnVariant::Simt { .. } => crate::attention_simt::build(self),
            AttnVariant::Coop { .. } if self.in_registers() => match self.stage {
                AttnStage::Forward => crate::attention_frag::forward(self),
                AttnStage::DkDv => crate::attention_frag::dkdv(self),
                AttnStage::Dq => crate::attention_frag::dq(self),
                AttnStage::Prep => unreachable!("Prep is never in registers"),
            },
            AttnVariant::Coop { .. } => crate::attention_coop::build(self),
            AttnVariant::CoopPair { .. } => crate::attention_frag::forward(self),
        }
    }

    /// Declares the buffers and push constants (see `build`), then begins the body; with
    /// `words` the strided inputs are u32 buffers (16-byte loads of 8 halves).
    pub(crate) fn declare(&self, k: &mut KernelBuilder, words: bool) -> Params {
        let elem = if words {
            Scalar::U32
        } else {
            buffer_scalar(self.storage)
        };
        let f32s = Scalar::F32;
        let names: &[&str] = match self.stage {
            AttnStage::Forward => &["q", "k", "v"],
            AttnStage::Prep => &["o", "do"],
            _ => &["q", "k", "v", "do"],
        };
        let ins: Vec<Buffer> = names
            .iter()
            .map(|n| k.buffer(n, elem, Access::Read))
            .collect();
        let backward = matches!(self.stage, AttnStage::DkDv | AttnStage::Dq);
        let mut lse = None;
        let mut dsum = None;
        let mut o = None;
        if backward {
            lse = Some(k.buffer("lse", f32s, Access::Read));
            if self.own_dsum {
                o = Some(k.buffer("o", elem, Access::Read));
            } else {
                dsum = Some(k.buffer("dsum", f32s, Access::Read));
            }
        }
        let lens = (self.padded && self.stage != AttnStage::Prep)
            .then(|| k.buffer("lens", Scalar::U32, Access::Read));
        let out_elem = buffer_scalar(self.storage);
        let outs: Vec<Buffer> = match self.stage {
            AttnStage::Forward => {
                let o = k.buffer("o", out_elem, Access::Write);
                lse = Some(k.buffer("lse", f32s, Access::Write));
                vec![o]
            }
            AttnStage::Prep => {
                dsum = Some(k.buffer("dsum", f32s, Access::Write));
                vec![]
            }
            AttnStage::DkDv => vec![
                k.buffer("dk", out_elem, Access::Write),
                k.buffer("dv", out_elem, Access::Write),
            ],
            AttnStage::Dq => {
                if self.own_dsum {
                    dsum = Some(k.buffer("dsum", f32s, Access::Write));
                }
                vec![k.buffer("dq", out_elem, Access::Write)]
            }
        };
        let u = Ty::scalar(Scalar::U32);
        let [t, heads, batch] = ["t", "heads", "batch"].map(|n| k.param(n, u));
        let scale = k.param("scale", Ty::scalar(Scalar::F32));
        // Per group of inputs sharing strides: each member's offset, then the strides.
        let groups: Vec<(Vec<Param>, [Param; 3])> = stride_groups(self.stage)
            .iter()
            .map(|g| {
                let offs = g
                    .iter()
                    .map(|&i| k.param(&format!("{}_off", names[i]), u))
                    .collect();
                let st = ["sb", "st", "sh"].map(|s| k.param(&format!("{}_{s}", names[g[0]]), u));
                (offs, st)
            })
            .collect();
        k.begin();
        let (t, heads) = (k.load_param(t), k.load_param(heads));
        // The outputs: dense [B, T, H, D], or (`packed`) the slices of one [B, T, 3, H, D]
        // tensor that the host passes for each: dq at 0, dk at HD, dv at 2HD, rows 3HD apart.
        let dh = k.u32(self.head_dim);
        let hd = k.mul(heads, dh);
        let zero = k.u32(0);
        let (st, offs) = match (self.packed, self.stage) {
            (true, stage) => {
                let (two, three) = (k.u32(2), k.u32(3));
                let st = k.mul(hd, three);
                match stage {
                    AttnStage::DkDv => (st, vec![hd, k.mul(hd, two)]),
                    _ => (st, vec![zero]),
                }
            }
            (false, _) => (hd, vec![zero; outs.len()]),
        };
        let sb = k.mul(t, st);
        let out_views: Vec<View> = outs
            .iter()
            .zip(offs)
            .map(|(&buf, off)| View {
                buf,
                off,
                sb,
                st,
                sh: dh,
            })
            .collect();
        let mut views: Vec<Option<View>> = vec![None; ins.len()];
        for (g, (offs, st)) in stride_groups(self.stage).iter().zip(&groups) {
            let [sb, st, sh] = st.map(|p| k.load_param(p));
            for (&i, &o) in g.iter().zip(offs) {
                let off = k.load_param(o);
                views[i] = Some(View {
                    buf: ins[i],
                    off,
                    sb,
                    st,
                    sh,
                });
            }
        }
        let views = views
            .into_iter()
            .map(|v| v.expect("every input in a group"))
            .collect();
        Params {
            views,
            lse,
            dsum,
            o,
            lens,
            outs: out_views,
            t,
            heads,
            batch: k.load_param(batch),
            scale: k.load_param(scale),
        }
    }

    /// The launch of this kernel for `batch × t × heads` rows. `buffers`: device addresses
    /// in declaration order (ignored with descriptors); `views`: the strided inputs' strides.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        module: &KernelModule,
        max_groups_x: u32,
        batch: u32,
        t: u32,
        heads: u32,
        scale: f32,
        views: &[ViewStrides],
        buffers: &[u64],
    ) -> Result<Launch, KernelError> {
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

// ------------------------------------------------------------------ shared helpers

/// Strided inputs that share one set of strides (push constants are 128 bytes on some
/// devices): Q, K and V (separate tensors of one shape, or views of one fused QKV), and
/// dO or O alone. Indices into the stage's strided inputs.
pub fn stride_groups(stage: AttnStage) -> &'static [&'static [usize]] {
    match stage {
        AttnStage::Forward => &[&[0, 1, 2]],
        AttnStage::Prep => &[&[0], &[1]],
        AttnStage::DkDv | AttnStage::Dq => &[&[0, 1, 2], &[3]],
    }
}

/// Bytes of the streamed tensors of one (b, h) (K and V, or Q and dO) that
/// [`head_group`] keeps within, so that the heads running at once share L2. Session 27
/// (H100, bf16 and f16 fwd+bwd at 8×12×512×64 and 8×12×1024×64, two rounds) measured 2, 4,
/// 8 and 32 MiB beside it: 2–8 MiB were 3–20% slower, 32 MiB within noise.
const GROUP_BYTES: u64 = 16 << 20;

/// Heads (b·H + h) per dispatch group: the largest divisor of `bh` whose streamed tensors
/// fit [`GROUP_BYTES`] (1 at least).
///
/// The grid is (heads in the group, blocks, groups), and the GPU starts workgroups x
/// fastest: within a group every head runs its block 0 (with [`block_coords`], the one with
/// the most work when causal) before any runs its block 1, so the last workgroups to start
/// are the shortest (longest processing time first). Before this order, blocks ran in x
/// and the heavy blocks of the last heads started last: on an H100, bf16 8×12×1024×64
/// took 88.6 µs forward and 350 forward+backward against 74–75 and 304 now. Grouping keeps
/// the heads in flight few enough to share their streamed tensors in L2: all 64 heads of
/// 4×16×2048×128 at once made the backward 6% slower.
fn head_group(bh: u32, t: u32, head_dim: u32, storage: Storage) -> u32 {
    let per_head = 2 * u64::from(t) * u64::from(head_dim) * u64::from(storage.bytes());
    let fit = (GROUP_BYTES / per_head.max(1)).clamp(1, u64::from(bh)) as u32;
    (1..=fit).rev().find(|g| bh % g == 0).unwrap_or(1)
}

/// (b, h, block index) of this workgroup: grid (heads of a [`head_group`], blocks, groups);
/// the block reversed when `reverse` (causal query blocks near the end have the most
/// keys, so they start first).
pub(crate) fn block_coords(
    k: &mut KernelBuilder,
    p: &Params,
    block: u32,
    reverse: bool,
) -> (Val, Val, Val) {
    let wid = k.workgroup_id();
    let nwg = k.num_workgroups();
    let (gx, x, gz) = (k.extract(wid, 0), k.extract(wid, 1), k.extract(wid, 2));
    let per_group = k.extract(nwg, 0);
    let first = k.mul(gz, per_group);
    let bh = k.add(first, gx);
    let b = k.div(bh, p.heads);
    let h = k.rem(bh, p.heads);
    let idx = if reverse {
        let bv = k.u32(block - 1);
        let tb = k.add(p.t, bv);
        let bv = k.u32(block);
        let n = k.div(tb, bv);
        let one = k.u32(1);
        let last = k.sub(n, one);
        k.sub(last, x)
    } else {
        x
    };
    (b, h, idx)
}

/// Keys of batch row `b` that exist: min(T, lens[b]) with padding, else T.
pub(crate) fn key_end(k: &mut KernelBuilder, p: &Params, b: Val) -> Val {
    match p.lens {
        Some(lens) => {
            let l = k.load(lens, b, 1);
            k.min(l, p.t)
        }
        None => p.t,
    }
}

/// Key blocks of `bk` a query block of `bq` rows at `q0` visits: the keys below `kend`,
/// and when causal only those up to its last row.
pub(crate) fn key_blocks(
    k: &mut KernelBuilder,
    causal: bool,
    (q0, bq): (Val, u32),
    kend: Val,
    bk: u32,
) -> Val {
    let kmax = if causal {
        let bqc = k.u32(bq);
        let e = k.add(q0, bqc);
        k.min(kend, e)
    } else {
        kend
    };
    let bkm = k.u32(bk - 1);
    let e = k.add(kmax, bkm);
    let bkc = k.u32(bk);
    k.div(e, bkc)
}

/// The query blocks of `bq` a key block at `k0` visits, as the range [first, end): none
/// when the block starts at or past `kend`, and when causal none before the one holding k0.
pub(crate) fn query_blocks(
    k: &mut KernelBuilder,
    p: &Params,
    causal: bool,
    k0: Val,
    kend: Val,
    bq: u32,
) -> (Val, Val) {
    let bqc = k.u32(bq);
    let bqm = k.u32(bq - 1);
    let e = k.add(p.t, bqm);
    let end = k.div(e, bqc);
    let first = if causal { k.div(k0, bqc) } else { k.u32(0) };
    let live = k.lt(k0, kend);
    let z = k.u32(0);
    (first, k.select(live, end, z))
}

/// Index of (b, h, t) in an f32 [B, H, T] row-statistics buffer.
pub(crate) fn stat_index(k: &mut KernelBuilder, p: &Params, b: Val, h: Val, t: Val) -> Val {
    let bh = k.mul(b, p.heads);
    let bh = k.add(bh, h);
    let x = k.mul(bh, p.t);
    k.add(x, t)
}

/// Element index of (b, t, h, 0) in a dense [B, T, H, D] tensor (the forward's O, which a Dq
/// with `own_dsum` reads).
pub(crate) fn dense_row(k: &mut KernelBuilder, p: &Params, d: u32, b: Val, t: Val, h: Val) -> Val {
    let bt = k.mul(b, p.t);
    let bt = k.add(bt, t);
    let x = k.mul(bt, p.heads);
    let x = k.add(x, h);
    let dv = k.u32(d);
    k.mul(x, dv)
}

/// Whether key `j` of query `i` is kept: j < kend and, when causal, j ≤ i.
pub(crate) fn keep(k: &mut KernelBuilder, causal: bool, i: Val, j: Val, kend: Val) -> Val {
    let inside = k.lt(j, kend);
    if causal {
        let seen = k.le(j, i);
        k.and(inside, seen)
    } else {
        inside
    }
}

/// The `Prep` kernel (shared by both families): Dsum[b, h, t] = Σ_d dO·O in f32 for every
/// (b, t, h) row, rows in that order (a dense [B, T, H, D] view's rows follow one another in
/// memory, so a workgroup streams one contiguous stretch of each input).
///
/// [`AttentionKernel::prep_lanes`] invocations share a row, adjacent in one subgroup: lane ℓ
/// reads pieces ℓ, ℓ + lanes, ... (vec4s, or single elements for views that are not
/// 4-aligned), so each load instruction of a subgroup covers whole 32-byte sectors of
/// several rows, and the lanes' partial sums combine with shuffles (no shared memory, no
/// barrier). Each invocation finds its (b, t, h) once, not once per piece: the divisions by
/// `heads` and `t` (push constants) cost more than the loads' issue. The design before this
/// (64 invocations, every vec4 piece's product through shared memory, (b, t, h) per piece)
/// took 8.4 µs for GPT-2's 8×12×512 bf16 rows on an H100, 1.1 TB/s.
///
/// Loads are vec4s of the storage type (8 bytes of halves), not 16-byte words of 8 halves:
/// the element-at-a-time path reads the same buffers, and four lanes' 8-byte loads already
/// fill whole sectors. Without subgroup shuffles (`HELIOS_NO_SUBGROUP`, or a device without
/// them) one invocation takes a row: correct, but then a load instruction touches a sector
/// per invocation (2.5× the bytes' time on an H100 when that was the only design).
pub(crate) fn build_prep(kern: &AttentionKernel) -> KernelModule {
    let mut k = KernelBuilder::new(kern.name(), kern.binding, [PREP_WORKGROUP, 1, 1]);
    let p = kern.declare(&mut k, false);
    let lanes = kern.prep_lanes();
    let (o, dout) = (p.views[0], p.views[1]);
    let dsum = p.dsum.expect("prep writes dsum");
    let s = kern.storage;
    let d = kern.head_dim;
    // This invocation's place in the workgroup, numbered so that the `lanes` of a row sit
    // in one subgroup: by subgroup id and lane, not `LocalInvocationIndex` (Vulkan does not
    // tie the two together). Subgroups of a power-of-two size ≥ `lanes` dividing the
    // workgroup (what `prep_lanes` asks of the device) number 0..PREP_WORKGROUP exactly.
    let slot = if lanes > 1 {
        let sg = k.subgroup_id();
        let size = k.subgroup_size();
        let id = k.subgroup_invocation_id();
        let base = k.mul(sg, size);
        k.add(base, id)
    } else {
        k.local_index()
    };
    let shift = k.u32(lanes.trailing_zeros());
    let local = k.shr(slot, shift);
    let mask = k.u32(lanes - 1);
    let lane = k.and(slot, mask);
    let g = crate::rows::linear_workgroup(&mut k);
    let per_group = k.u32(PREP_WORKGROUP / lanes);
    let first = k.mul(g, per_group);
    let row = k.add(first, local);
    let bt = k.mul(p.batch, p.t);
    let rows = k.mul(bt, p.heads);
    let inside = k.lt(row, rows);
    // Rows past the end (the last workgroup's) read row 0 and store nothing: every lane
    // stays active for the shuffles.
    let zero_u = k.u32(0);
    let row = k.select(inside, row, zero_u);
    let h = k.rem(row, p.heads);
    let bt = k.div(row, p.heads);
    let b = k.div(bt, p.t);
    let t = k.rem(bt, p.t);
    let ro = o.row(&mut k, b, t, h);
    let rd = dout.row(&mut k, b, t, h);
    let a4 = o.vec4_aligned(&mut k);
    let b4 = dout.vec4_aligned(&mut k);
    let wide = k.and(a4, b4);
    let zero = k.const_f32(0.0);
    let acc = k.var_init(zero);
    k.if_else(
        wide,
        |k| {
            // All of a lane's loads first, then the products: d / (4·lanes) independent
            // loads of each input in flight per invocation.
            let two = k.u32(2);
            let vo = k.shr(ro, two);
            let vo = k.add(vo, lane);
            let vd = k.shr(rd, two);
            let vd = k.add(vd, lane);
            let pieces = d / 4 / lanes;
            let mut xs = Vec::new();
            for j in 0..pieces {
                let step = k.u32(j * lanes);
                let ao = k.add(vo, step);
                let ad = k.add(vd, step);
                let x = crate::storage::load_f32(k, o.buf, ao, 4, s);
                let y = crate::storage::load_f32(k, dout.buf, ad, 4, s);
                xs.push((x, y));
            }
            let mut sum = k.dot(xs[0].0, xs[0].1);
            for &(x, y) in &xs[1..] {
                let v = k.dot(x, y);
                sum = k.add(sum, v);
            }
            k.set(acc, sum);
        },
        // Views at odd offsets (a fused QKV's, say) are read one element at a time.
        |k| {
            let ao = k.add(ro, lane);
            let ad = k.add(rd, lane);
            let step = k.u32(lanes);
            let end = k.u32(d);
            k.for_range(zero_u, end, step, |k, i| {
                let a = k.add(ao, i);
                let x = crate::storage::load_f32(k, o.buf, a, 1, s);
                let a = k.add(ad, i);
                let y = crate::storage::load_f32(k, dout.buf, a, 1, s);
                let cur = k.get(acc);
                let v = k.fma(x, y, cur);
                k.set(acc, v);
            });
        },
    );
    let mut sum = k.get(acc);
    let mut m = 1;
    while m < lanes {
        let mv = k.u32(m);
        let other = k.subgroup_shuffle_xor(sum, mv);
        sum = k.add(sum, other);
        m *= 2;
    }
    let lead = k.eq(lane, zero_u);
    let store = k.and(inside, lead);
    k.if_(store, |k| {
        let at = stat_index(k, &p, b, h, t);
        k.store(dsum, at, sum);
    });
    k.finish()
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
        for v in SIMT_VARIANTS.into_iter().chain(COOP_VARIANTS) {
            assert_eq!(AttnVariant::by_name(&v.tag()), Some(v));
        }
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
