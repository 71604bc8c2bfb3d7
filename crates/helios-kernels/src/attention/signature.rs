//! The signature of an attention kernel (what `helios` keys its compiled kernels on and its
//! tuner chooses among): the stage, the variant and the candidate lists, [`AttentionKernel`],
//! and what follows from the signature alone (name, forms, workgroup size).

use helios_spirv::Binding;

use crate::storage::Storage;

/// Invocations per workgroup of the `Prep` kernel: 64 rows of [`PREP_LANES`].
pub const PREP_WORKGROUP: u32 = 256;

/// Invocations per row of the `Prep` kernel where subgroup shuffles combine them (see
/// `build_prep`). Four lanes of vec4s cover 16 elements, a
/// 32-byte sector of halves, per load; every head dim (a multiple of 16) divides among them
/// evenly; and every device whose subgroups the row kernels use (power-of-two sizes of 4 or
/// more: lavapipe's are 4, 8 or 16 with the host's vector width) holds a row in one
/// subgroup, so the kernel does not depend on the size. Fewer lanes than D/8 also leave
/// more loads in flight per lane (D/16 of each input).
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
    /// f32 math, SIMT register tiles of 4 owned rows per invocation (`simt`).
    Simt { bq: u8, bk: u8 },
    /// Cooperative matrices: one subgroup per 16 owned rows.
    Coop { bq: u8, bk: u8 },
    /// Cooperative matrices, the forward with the scores in registers only: one subgroup per
    /// 32 query rows, two 16-row tiles sharing every K and V fragment it loads (half the
    /// shared-memory reads per product).
    CoopPair { bq: u8, bk: u8 },
    /// NVIDIA's native path (PTX, `wgmma`; the forward, Dq and DkDv): `bq / 64` consumer
    /// warpgroups against blocks of `bk` keys (`native`; written `nv<bq>x<bk>`).
    Native { bq: u8, bk: u8 },
}

impl AttnVariant {
    /// "simt16x16", "coop64x64".
    pub fn tag(&self) -> String {
        match *self {
            AttnVariant::Simt { bq, bk } => format!("simt{bq}x{bk}"),
            AttnVariant::Coop { bq, bk } => format!("coop{bq}x{bk}"),
            AttnVariant::CoopPair { bq, bk } => format!("coop{bq}x{bk}p"),
            AttnVariant::Native { bq, bk } => format!("nv{bq}x{bk}"),
        }
    }

    pub fn blocks(&self) -> (u32, u32) {
        match *self {
            AttnVariant::Simt { bq, bk }
            | AttnVariant::Coop { bq, bk }
            | AttnVariant::CoopPair { bq, bk }
            | AttnVariant::Native { bq, bk } => (u32::from(bq), u32::from(bk)),
        }
    }

    pub fn is_coop(&self) -> bool {
        matches!(
            self,
            AttnVariant::Coop { .. } | AttnVariant::CoopPair { .. }
        )
    }

    /// Whether this is a native (PTX) kernel, which only NVIDIA's native path runs.
    pub fn is_native(&self) -> bool {
        matches!(self, AttnVariant::Native { .. })
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
        if let Some(r) = s.strip_prefix("nv") {
            let (a, b) = r.split_once('x')?;
            let (bq, bk) = (a.parse().ok()?, b.parse().ok()?);
            return Some(AttnVariant::Native { bq, bk });
        }
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
/// Cooperative orders as measured on an H100 (figures in
/// bench/results/source-comment-history.md): with the scores in `registers` (forward
/// 128×32 first, then 128×64; DkDv keeps 32-query blocks) or in shared memory (the backward
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
    /// registers (`reg_fwd`, `reg_bwd`); `None` stages them in shared memory (`coop_fwd`,
    /// `coop_bwd`).
    pub frag: Option<crate::FragMap>,
    /// The forward with the scores in registers: software-pipelined over two K/V buffers
    /// (block j + 1's products issued before block j's softmax). Needs twice the K/V shared
    /// memory.
    pub pipelined: bool,
    /// Dq computes Dsum itself (from dO and O, O dense) and writes it for DkDv, which then
    /// runs after it: no Prep pass. The register-resident cooperative Dq and the native Dq.
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

/// (B, T, H) of one launch, the push constants t, heads and batch (D is the kernel's
/// `head_dim`): the kernel covers batch × t × heads rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub batch: u32,
    pub t: u32,
    pub heads: u32,
}

/// Rows of a tile each invocation of a SIMT kernel owns.
pub const SIMT_ROWS: u32 = 4;
/// Invocations across a SIMT tile's columns (score columns, or vec4 chunks of D).
pub const SIMT_COLS: u32 = 8;
/// Query rows of a native kernel's consumer warpgroup (the `wgmma` M).
pub const WG_ROWS: u32 = 64;
/// Threads of a native kernel's warpgroup.
pub const WG_THREADS: u32 = 128;

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
            AttnVariant::Simt { .. } => simt_workgroup(owned),
            AttnVariant::Coop { .. } | AttnVariant::CoopPair { .. } => {
                owned / (16 * self.variant.row_tiles()) * self.subgroup
            }
            AttnVariant::Native { bq, .. } => native_workgroup(u32::from(bq)),
        }
    }
}

/// Invocations per workgroup of a SIMT kernel that owns `owned` rows.
fn simt_workgroup(owned: u32) -> u32 {
    owned / SIMT_ROWS * SIMT_COLS
}

/// Threads of a native block of `bq` query rows: the consumer warpgroups, then the
/// producer's.
pub fn native_workgroup(bq: u32) -> u32 {
    bq / WG_ROWS * WG_THREADS + WG_THREADS
}
