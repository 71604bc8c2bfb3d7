//! Matrix multiply: `C[b] = epilogue(alpha · op(A[b]) · op(B[b]))` for a batch of strided
//! matrices, with `op` the identity or a transpose read in place (no transpose pass).
//!
//! The kernel families share this file's signature, launch and epilogue code:
//! - `matmul_simt`: tiled FMA kernels for any storage (f32 math), the portable path;
//! - `matmul_coop`: cooperative-matrix kernels for f16/bf16 inputs with f32 accumulation,
//!   double-buffered through shared memory, where the device reports the fragment shapes;
//! - `matmul_wg`: workgroup-scope matrices (VK_NV_cooperative_matrix2);
//! - `matmul_native`: PTX with Hopper's `wgmma` for NVIDIA's native path (helios-ptx), built
//!   by `MatmulKernel::build_native` instead of `build`.
//!
//! The variant table (`VARIANTS`) names every tile configuration; `default_variant` is the one
//! documented selection rule used before (or without) the autotuner in `helios`, which times
//! the feasible candidates and persists the winner. Key decision: a kernel's signature holds
//! only what changes the SPIR-V (variant, storages, transposes, which operands may use
//! 16-byte vector accesses, epilogue); sizes, leading dimensions, batch strides and alpha are
//! push constants, so one pipeline serves every shape with the same alignment.

use helios_spirv::{Access, Buffer, KernelBuilder, KernelModule, Param, Scalar, Ty, Val, Var};

use crate::launch::{pack_push, Arg, Args, Launch};
use crate::storage::{buffer_scalar, load_f32, store_f32, Storage};
use crate::{math, KernelError};

/// Activation applied in the epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    None,
    Relu,
    /// GELU, tanh approximation (GPT-2).
    GeluTanh,
}

/// A softmax step folded into the epilogue, with one f32 value per output row (`rows`,
/// indexed batch · M + row): what attention's materialised backward uses instead of a
/// separate softmax pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowOp {
    None,
    /// `exp(v − rows[row])`: probabilities from the scores and their log-sum-exp.
    Exp,
    /// `residual[row, col] · (v − rows[row])`, the residual multiplying instead of adding:
    /// the softmax gradient from the probabilities (residual) and Σ P∘dP (rows).
    SoftmaxGrad,
}

/// What happens to `alpha · A·B` before it is stored, in this order: `+ bias[col]`, the row
/// op, the activation, `+ residual[row, col]` (unless the row op or `act_grad` multiplied by
/// it), then rounding to the output storage. Bias and residual are stored like the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Epilogue {
    pub bias: bool,
    pub act: Activation,
    pub residual: bool,
    pub row: RowOp,
    /// The product is the gradient reaching an activation's output, and what is stored is
    /// the gradient at its input: `act'(residual) · v`, the residual being the activation's
    /// input. Nothing else may be set but the residual. A linear layer's backward computes
    /// the GELU's backward this way inside the next layer's input-gradient product, instead
    /// of a pass over both tensors.
    pub act_grad: Activation,
    /// Also store the value the activation takes (after the bias) into a second output,
    /// `pre`, laid out like C: what the activation's backward reads, written by the product
    /// instead of read back by an activation pass.
    pub store_pre: bool,
    /// Also store the column sums of B, `sums[n] = Σ_k B[k, n]` (not scaled by alpha;
    /// rounded to C's storage), into a third output of N values: a linear layer's bias
    /// gradient from the product that computes its weight gradient (dW = Xᵀ·dY reads dY as
    /// B, and db is the sum of dY's rows), as cuBLASLt's BGRADB epilogue does, instead of a
    /// reduction pass re-reading dY. SIMT kernels only (they stage B's tiles in shared
    /// memory and every invocation reads its columns' values), a batch of one, the whole k
    /// range, and nothing else in the epilogue; the workgroups of the first tile row store
    /// it.
    pub col_sums: bool,
}

impl Epilogue {
    pub const NONE: Epilogue = Epilogue {
        bias: false,
        act: Activation::None,
        residual: false,
        row: RowOp::None,
        act_grad: Activation::None,
        store_pre: false,
        col_sums: false,
    };

    /// Whether anything beyond scaling and rounding happens.
    pub const fn is_plain(&self) -> bool {
        !self.bias
            && !self.residual
            && matches!(self.act, Activation::None)
            && matches!(self.row, RowOp::None)
            && matches!(self.act_grad, Activation::None)
            && !self.store_pre
            && !self.col_sums
    }

    /// Whether the parts fit together: a softmax gradient multiplies by the residual and
    /// nothing else follows a row op; an activation's gradient multiplies by the residual
    /// and comes alone.
    pub const fn is_valid(&self) -> bool {
        if self.col_sums {
            return !self.bias
                && !self.residual
                && !self.store_pre
                && matches!(self.act, Activation::None)
                && matches!(self.row, RowOp::None)
                && matches!(self.act_grad, Activation::None);
        }
        if self.store_pre
            && (matches!(self.act, Activation::None)
                || !matches!(self.act_grad, Activation::None)
                || !matches!(self.row, RowOp::None))
        {
            return false;
        }
        if !matches!(self.act_grad, Activation::None) {
            return self.residual
                && !self.bias
                && matches!(self.act, Activation::None)
                && matches!(self.row, RowOp::None);
        }
        match self.row {
            RowOp::None => true,
            RowOp::Exp => !self.residual && matches!(self.act, Activation::None),
            RowOp::SoftmaxGrad => self.residual && matches!(self.act, Activation::None),
        }
    }

    /// Whether the residual multiplies the value rather than being added to it.
    const fn residual_multiplies(&self) -> bool {
        matches!(self.row, RowOp::SoftmaxGrad) || !matches!(self.act_grad, Activation::None)
    }

    fn tag(&self) -> String {
        let mut s = String::new();
        if self.bias {
            s.push_str("_bias");
        }
        match self.row {
            RowOp::None => {}
            RowOp::Exp => s.push_str("_rowexp"),
            RowOp::SoftmaxGrad => s.push_str("_rowsmgrad"),
        }
        if self.store_pre {
            s.push_str("_pre");
        }
        match self.act {
            Activation::None => {}
            Activation::Relu => s.push_str("_relu"),
            Activation::GeluTanh => s.push_str("_gelu"),
        }
        match self.act_grad {
            Activation::None => {}
            Activation::Relu => s.push_str("_drelu"),
            Activation::GeluTanh => s.push_str("_dgelu"),
        }
        if self.residual && !self.residual_multiplies() {
            s.push_str("_res");
        }
        if self.col_sums {
            s.push_str("_colsum");
        }
        s
    }
}

/// What a product may take for granted about the triangles of a square operand or of its
/// result, so that causal attention's products skip the half that is zero or unwanted.
/// The diagonal is column = row of the batch's matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Triangle {
    /// Nothing: the whole product.
    Full,
    /// Only C on and below the diagonal is wanted: a workgroup whose tile lies wholly above
    /// it stores nothing (those outputs keep what they held).
    LowerC,
    /// A is read as zero above the diagonal, whatever is stored there: the k loop ends
    /// after the tile's last row, and the steps it runs mask A. SIMT kernels only.
    LowerA,
    /// A is read as zero below the diagonal: the k loop starts at the k step holding the
    /// tile's first row (masked as for `LowerA`). SIMT kernels only.
    UpperA,
}

impl Triangle {
    /// Whether A is masked to a triangle.
    pub const fn masks_a(self) -> bool {
        matches!(self, Triangle::LowerA | Triangle::UpperA)
    }

    fn tag(self) -> &'static str {
        match self {
            Triangle::Full => "",
            Triangle::LowerC => "_trilc",
            Triangle::LowerA => "_trila",
            Triangle::UpperA => "_triua",
        }
    }
}

/// A SIMT tile: `bm × bn` outputs per workgroup, `tm × tn` per invocation (in 4×4 blocks
/// spread over the tile so shared-memory reads are broadcast or conflict-free), k in steps of
/// `BK_SIMT`, global loads issued `depth` k steps ahead of their use (see `staged_k_loop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SimtTile {
    pub bm: u16,
    pub bn: u16,
    pub tm: u8,
    pub tn: u8,
    pub depth: u8,
}

impl SimtTile {
    /// k per unrolled step of the k loop: one `BK_SIMT` tile per register set (`depth` + a
    /// spare; see `staged_k_loop`).
    pub const fn k_step(self) -> u32 {
        let depth = if self.depth == 0 {
            1
        } else {
            self.depth as u32
        };
        BK_SIMT * (depth + 1)
    }
}

/// A cooperative-matrix tile: `bm × bn` outputs per workgroup, `wm × wn` subgroups each
/// computing `bm/wm × bn/wn` with 16×16×16 fragments, k staged `bk` at a time through
/// `stages` (1 or 2) shared-memory stages, global loads issued `depth` k steps ahead of
/// their use (see `staged_k_loop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopTile {
    pub bm: u16,
    pub bn: u16,
    pub bk: u16,
    pub wm: u8,
    pub wn: u8,
    pub depth: u8,
    pub stages: u8,
}

/// A workgroup-scope cooperative-matrix tile (VK_NV_cooperative_matrix2): `bm × bn` outputs
/// per workgroup of `warps` subgroups, k in steps of `bk`; the driver stages the operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgTile {
    pub bm: u16,
    pub bn: u16,
    pub bk: u16,
    pub warps: u8,
    /// Loads of the next k step are issued before the current product.
    pub prefetch: bool,
    /// Operands are loaded as slices of tensor layouts (SPV_NV_tensor_addressing) rather than
    /// with plain cooperative-matrix loads; f16 inputs only.
    pub tensor: bool,
}

/// A tile of the native NVIDIA kernels (`matmul_native`, PTX with `wgmma`): `bm × bn` outputs
/// per block of `bm / 64` consumer warpgroups (each 64 rows × `bn`) and a producer
/// warpgroup, k staged `bk` at a time through `stages` shared-memory stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NativeTile {
    pub bm: u16,
    pub bn: u16,
    pub bk: u16,
    pub stages: u8,
}

impl NativeTile {
    /// Shared memory of the stages: both operands, 2-byte elements.
    pub const fn shared_bytes(self) -> u32 {
        self.stages as u32 * (self.bm as u32 + self.bn as u32) * self.bk as u32 * 2
    }
}

/// A kernel family and its tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    Simt(SimtTile),
    Coop(CoopTile),
    /// Workgroup-scope matrices (`matmul_wg`).
    Wg(WgTile),
    /// NVIDIA's native path: PTX through VK_NVX_binary_import (`matmul_native`).
    Native(NativeTile),
}

/// k step of the SIMT kernels: 8 keeps the transposing shared stores conflict-free.
pub const BK_SIMT: u32 = 8;
/// Fragment edge of the cooperative kernels (16×16×16 is reported by NVIDIA, AMD and Intel).
pub const FRAG: u32 = 16;

/// Every variant the tuner tries, by name (`HELIOS_MATMUL_VARIANT` takes these names, and
/// cooperative tiles outside the table in the same grammar: `Variant::parse`): tile,
/// subgroup arrangement (`w`), k step (`k`, cooperative), prefetch depth (`d`) or one
/// shared-memory stage (`s1`, depth 1).
pub const VARIANTS: &[(&str, Variant)] = &[
    ("simt128x128d1", simt(128, 128, 8, 8, 1)),
    ("simt128x128d2", simt(128, 128, 8, 8, 2)),
    ("simt128x64d2", simt(128, 64, 8, 8, 2)),
    ("simt128x64d1", simt(128, 64, 8, 8, 1)),
    // 8×16 per invocation (`t`), cuBLAS's SIMT shape: 128 invocations at ~235 registers.
    // On an H100 it won only 4096³ (3188 µs against 3289 for simt128x64d2); 8×16 on a
    // 128×64 tile spilled, and 16×8 or 256×128 tiles lost everywhere
    // (bench/results/2026-11-25-matmul-f32-h100-session11.txt).
    ("simt128x128t8x16d2", simt(128, 128, 8, 16, 2)),
    ("simt64x64d1", simt(64, 64, 4, 4, 1)),
    ("simt64x64d2", simt(64, 64, 4, 4, 2)),
    ("simt64x32d2", simt(64, 32, 4, 4, 2)),
    ("simt32x32d1", simt(32, 32, 4, 4, 1)),
    // Subgroup scope, as measured on an H100 (bench/results/2026-11-23-matmul-h100-
    // session6.md): one shared-memory stage with k48 (`s1`) and 2-stage k16/k32 tiles;
    // deeper register prefetch (`d2`) only where it still won.
    ("coop128x256w2x4k48s1", coop1(128, 256, 48, 2, 4)),
    ("coop256x128w4x2k48s1", coop1(256, 128, 48, 4, 2)),
    ("coop128x128w2x2k32s1", coop1(128, 128, 32, 2, 2)),
    // 6 and 16 subgroups of 64×32 (168 and 128 registers, one workgroup an SM): on an H100
    // they lose at 4096³ but fill the SMs better on GPT-2's n = 768 and 2304, e.g. bf16
    // qkv dx 70.7 µs against 87.9, fc dx 93–94 against 113, lm-head dx 2072 against 3182,
    // lm-head dw (2x8) 1837 against 1989 (unsplit, before the epilogue went through shared
    // memory everywhere; bench/results/2026-11-27-matmul-h100-session18-sweep.txt).
    ("coop128x192w2x6k48s1", coop1(128, 192, 48, 2, 6)),
    // k64 in one stage (47.5 and 35 KiB): the fewest barriers per product. On an H100
    // (bench/results/2026-11-27-matmul-h100-session19-ablation.txt, second sweep), bf16
    // 8192-row qkv dx 121.5 µs and fc fwd 172.0 for the first, against 138.4 and 212.6
    // for 128x128 at k48; the second ran 4096³ at 235 TFLOP/s against 191 at k48.
    ("coop128x192w2x6k64s1", coop1(128, 192, 64, 2, 6)),
    ("coop128x128w2x4k64s1", coop1(128, 128, 64, 2, 4)),
    ("coop192x128w6x2k48s1", coop1(192, 128, 48, 6, 2)),
    ("coop128x256w2x8k48s1", coop1(128, 256, 48, 2, 8)),
    ("coop128x128w2x2k16d2", coop(128, 128, 16, 2, 2, 2)),
    ("coop128x256w2x4k16d1", coop(128, 256, 16, 2, 4, 1)),
    ("coop256x128w4x2k16d1", coop(256, 128, 16, 4, 2, 1)),
    ("coop128x128w2x4k32d1", coop(128, 128, 32, 2, 4, 1)),
    ("coop128x128w4x4k32d2", coop(128, 128, 32, 4, 4, 2)),
    ("coop128x64w2x2k32d2", coop(128, 64, 32, 2, 2, 2)),
    ("coop64x128w2x2k32d2", coop(64, 128, 32, 2, 2, 2)),
    ("coop64x64w2x2k32d2", coop(64, 64, 32, 2, 2, 2)),
    ("coop64x64w2x2k64d2", coop(64, 64, 64, 2, 2, 2)),
    ("coop32x64w1x2k32d2", coop(32, 64, 32, 1, 2, 2)),
    // Workgroup scope, plain loads (`wg`) and tensor-addressed loads (`wgt`): the fastest of
    // ten tilings of each tried on an H100 (driver 580.159.04), 73–79 TFLOP/s at 2048³/4096³
    // f16 against 199–216 for coop128x256w2x4k16d1; kept so the tuner picks them up wherever
    // a driver makes this path fast (bench/results/2026-11-22-coopmat2-h100.md).
    ("wg128x128k16w4p", wg(128, 128, 16, 4, true)),
    ("wgt128x128k16w4", wgt(128, 128, 16, 4)),
    // NVIDIA native (wgmma through PTX): two consumer warpgroups of 64 rows and a producer
    // warpgroup, two k32 stages filling the 48 KiB. On the H200 it beat k16 × 4 stages and
    // 128×128 tiles on every shape tried (bench/results/2026-11-28-native-matmul-h200.md);
    // other tiles stay reachable by name (`Variant::parse`).
    ("nv128x256k32s2", native(128, 256, 32, 2)),
];

const fn native(bm: u16, bn: u16, bk: u16, stages: u8) -> Variant {
    Variant::Native(NativeTile { bm, bn, bk, stages })
}

/// Largest tile edges of the `Wg` variants: every M and N tile divides `WG_GRANULE[0]`, every
/// k step `WG_GRANULE[1]` (the tuner's shape classes keep exact divisibility up to these).
pub const WG_GRANULE: [u32; 2] = [256, 64];

/// The per-invocation block a SIMT tile name leaves implicit: 8×8 from 128 rows, 4×4 below.
const fn simt_block(bm: u16) -> (u8, u8) {
    if bm >= 128 {
        (8, 8)
    } else {
        (4, 4)
    }
}

/// A native tile written `<bm>x<bn>k<bk>s<stages>` (after `nv`).
fn parse_native(s: &str) -> Option<Variant> {
    let (bm, rest) = number(s)?;
    let (bn, rest) = number(rest.strip_prefix('x')?)?;
    let (bk, rest) = number(rest.strip_prefix('k')?)?;
    let (stages, rest) = number(rest.strip_prefix('s')?)?;
    let v = Variant::Native(NativeTile {
        bm: u16::try_from(bm).ok()?,
        bn: u16::try_from(bn).ok()?,
        bk: u16::try_from(bk).ok()?,
        stages: u8::try_from(stages).ok()?,
    });
    (rest.is_empty() && v.well_formed()).then_some(v)
}

/// A decimal number (at most 4 digits) at the start of `s`, and what follows it.
fn number(s: &str) -> Option<(u32, &str)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 4 {
        return None;
    }
    Some((s[..digits].parse().ok()?, &s[digits..]))
}

const fn simt(bm: u16, bn: u16, tm: u8, tn: u8, depth: u8) -> Variant {
    Variant::Simt(SimtTile {
        bm,
        bn,
        tm,
        tn,
        depth,
    })
}

const fn wg(bm: u16, bn: u16, bk: u16, warps: u8, prefetch: bool) -> Variant {
    Variant::Wg(WgTile {
        bm,
        bn,
        bk,
        warps,
        prefetch,
        tensor: false,
    })
}

const fn wgt(bm: u16, bn: u16, bk: u16, warps: u8) -> Variant {
    Variant::Wg(WgTile {
        bm,
        bn,
        bk,
        warps,
        prefetch: false,
        tensor: true,
    })
}

const fn coop(bm: u16, bn: u16, bk: u16, wm: u8, wn: u8, depth: u8) -> Variant {
    coop_tile(bm, bn, bk, wm, wn, depth, 2)
}

/// A cooperative tile with one shared-memory stage (`s1`): half the shared memory of `coop`,
/// so twice the k step fits, for a second barrier per step.
const fn coop1(bm: u16, bn: u16, bk: u16, wm: u8, wn: u8) -> Variant {
    coop_tile(bm, bn, bk, wm, wn, 1, 1)
}

const fn coop_tile(bm: u16, bn: u16, bk: u16, wm: u8, wn: u8, depth: u8, stages: u8) -> Variant {
    Variant::Coop(CoopTile {
        bm,
        bn,
        bk,
        wm,
        wn,
        depth,
        stages,
    })
}

impl Variant {
    /// The table name of a variant.
    pub fn name(self) -> &'static str {
        VARIANTS
            .iter()
            .find(|(_, v)| *v == self)
            .map_or("custom", |(n, _)| n)
    }

    /// How a cooperative tile outside the table is written (`parse`), for messages that say
    /// what a name may be.
    pub const COOP_GRAMMAR: &str =
        "coop<bm>x<bn>w<wm>x<wn>k<bk> then d<1-3> or s1, or nv<bm>x<bn>k<16|32>s<stages>";

    /// The variant called `name` in the table.
    pub fn by_name(name: &str) -> Option<Variant> {
        VARIANTS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    /// The name of any variant, in the table's grammar: for a table variant its table name.
    /// SIMT tiles name their per-invocation block (`t<tm>x<tn>`) only where it is not the
    /// default for the tile height (8×8 from 128 rows, 4×4 below).
    pub fn label(self) -> String {
        match self {
            Variant::Simt(t) => {
                let block = match (t.tm, t.tn) == simt_block(t.bm) {
                    true => String::new(),
                    false => format!("t{}x{}", t.tm, t.tn),
                };
                format!("simt{}x{}{block}d{}", t.bm, t.bn, t.depth)
            }
            Variant::Coop(t) => {
                let pipeline = match t.stages {
                    1 => "s1".to_string(),
                    _ => format!("d{}", t.depth),
                };
                format!("coop{}x{}w{}x{}k{}{pipeline}", t.bm, t.bn, t.wm, t.wn, t.bk)
            }
            Variant::Wg(t) => format!(
                "{}{}x{}k{}w{}{}",
                if t.tensor { "wgt" } else { "wg" },
                t.bm,
                t.bn,
                t.bk,
                t.warps,
                if t.prefetch { "p" } else { "" }
            ),
            Variant::Native(t) => format!("nv{}x{}k{}s{}", t.bm, t.bn, t.bk, t.stages),
        }
    }

    /// The variant `name` names: a table name, or a cooperative tile outside the table
    /// written in its grammar, `coop<bm>x<bn>w<wm>x<wn>k<bk>` then `d<depth>` (two
    /// shared-memory stages, loads `depth` steps ahead, 1 to 3) or `s1` (one stage), for
    /// trying tiles side by side (`helios bench matmul --variants`) without editing the
    /// table. Edges are multiples of 16 (each subgroup's share too) up to 512, k steps up to
    /// 128, at most 32 subgroups; whether a device runs the tile (shared memory, workgroup
    /// size) is checked where it is chosen.
    pub fn parse(name: &str) -> Option<Variant> {
        if let Some(v) = Variant::by_name(name) {
            return Some(v);
        }
        if let Some(rest) = name.strip_prefix("nv") {
            return parse_native(rest);
        }
        let rest = name.strip_prefix("coop")?;
        let (bm, rest) = number(rest)?;
        let (bn, rest) = number(rest.strip_prefix('x')?)?;
        let (wm, rest) = number(rest.strip_prefix('w')?)?;
        let (wn, rest) = number(rest.strip_prefix('x')?)?;
        let (bk, rest) = number(rest.strip_prefix('k')?)?;
        let (depth, stages) = match rest {
            "s1" => (1, 1),
            _ => (
                number(rest.strip_prefix('d')?)
                    .filter(|(_, r)| r.is_empty())?
                    .0,
                2,
            ),
        };
        let v = Variant::Coop(CoopTile {
            bm: u16::try_from(bm).ok()?,
            bn: u16::try_from(bn).ok()?,
            bk: u16::try_from(bk).ok()?,
            wm: u8::try_from(wm).ok()?,
            wn: u8::try_from(wn).ok()?,
            depth: u8::try_from(depth).ok()?,
            stages,
        });
        let sized = bm <= 512 && bn <= 512 && bk <= 128 && wm * wn <= 32;
        (sized && v.well_formed()).then_some(v)
    }

    /// Whether the tile is one the kernel generators build: every table variant and every
    /// name `parse` accepts is; a tile put together by hand (the fields are public) may not
    /// be, and is then never feasible, rather than a panic or an invalid module.
    pub fn well_formed(self) -> bool {
        match self {
            Variant::Simt(t) => {
                let (bm, bn, tm, tn) = (t.bm, t.bn, u16::from(t.tm), u16::from(t.tn));
                tm >= 4
                    && tn >= 4
                    && tm % 4 == 0
                    && tn % 4 == 0
                    && bm % tm == 0
                    && bn % tn == 0
                    && bm > 0
                    && bn > 0
                    && t.depth <= 3
            }
            Variant::Coop(t) => {
                let edge = |e: u16, parts: u8| {
                    parts > 0 && e > 0 && e % (u16::from(parts) * FRAG as u16) == 0
                };
                edge(t.bm, t.wm)
                    && edge(t.bn, t.wn)
                    && t.bk > 0
                    && t.bk % FRAG as u16 == 0
                    && (1..=3).contains(&t.depth)
                    && (t.stages == 2 || (t.stages == 1 && t.depth == 1))
            }
            Variant::Wg(t) => t.bm > 0 && t.bn > 0 && t.bk > 0 && t.warps > 0,
            Variant::Native(t) => {
                t.bm % 64 == 0
                    && (64..=192).contains(&t.bm)
                    && t.bn % 16 == 0
                    && (16..=256).contains(&t.bn)
                    && t.bk % 16 == 0
                    && (16..=64).contains(&t.bk)
                    && t.stages >= 2
            }
        }
    }

    /// A native NVIDIA kernel (PTX through VK_NVX_binary_import), not a SPIR-V pipeline.
    pub const fn is_native(self) -> bool {
        matches!(self, Variant::Native(_))
    }

    /// Runs on the matrix units (subgroup or workgroup scope).
    pub const fn is_coop(self) -> bool {
        matches!(self, Variant::Coop(_) | Variant::Wg(_))
    }

    /// Output tile (rows, columns) of one workgroup.
    pub const fn tile(self) -> (u32, u32) {
        match self {
            Variant::Simt(t) => (t.bm as u32, t.bn as u32),
            Variant::Coop(t) => (t.bm as u32, t.bn as u32),
            Variant::Wg(t) => (t.bm as u32, t.bn as u32),
            Variant::Native(t) => (t.bm as u32, t.bn as u32),
        }
    }

    /// Invocations per workgroup (`subgroup` is the device's subgroup size; SIMT ignores it).
    pub const fn threads(self, subgroup: u32) -> u32 {
        match self {
            Variant::Simt(t) => (t.bm as u32 / t.tm as u32) * (t.bn as u32 / t.tn as u32),
            Variant::Coop(t) => subgroup * t.wm as u32 * t.wn as u32,
            Variant::Wg(t) => subgroup * t.warps as u32,
            // A consumer warpgroup (128 threads) per 64 rows and a producer.
            Variant::Native(t) => 2 * t.bm as u32 + 128,
        }
    }

    /// Bytes of workgroup-shared memory the variant declares for these transposes.
    pub fn shared_bytes(self, trans_a: bool, trans_b: bool) -> u32 {
        match self {
            Variant::Simt(t) => {
                let (bm, bn) = (t.bm as u32, t.bn as u32);
                2 * BK_SIMT * ((bm + 4) + (bn + 4)) * 4
            }
            Variant::Coop(t) => {
                let (a, b) = crate::matmul_coop::stage_vec4s(t, trans_a, trans_b);
                u32::from(t.stages) * (a + b) * 16
            }
            // The driver's own staging lives in its reserved shared memory.
            Variant::Wg(_) => 0,
            Variant::Native(t) => t.shared_bytes(),
        }
    }
}

/// Vector width (elements) of a 16-byte access for a variant's operands: SIMT kernels load
/// vec4 of the storage type, cooperative kernels 8 halves.
pub const fn vector_elems(v: Variant) -> u32 {
    match v {
        Variant::Simt(_) => 4,
        Variant::Coop(_) | Variant::Wg(_) | Variant::Native(_) => 8,
    }
}

/// The signature of a matmul kernel: everything that changes the emitted SPIR-V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulKernel {
    pub variant: Variant,
    /// Storage of A and B.
    pub input: Storage,
    /// Storage of C (and of bias and residual).
    pub out: Storage,
    /// A is stored K×M (read as its transpose).
    pub trans_a: bool,
    /// B is stored N×K.
    pub trans_b: bool,
    /// A, B, C (and residual) may use vector accesses along their contiguous dimension
    /// (see `Alignment::of`).
    pub vec_a: bool,
    pub vec_b: bool,
    pub vec_c: bool,
    pub epilogue: Epilogue,
    /// Which triangle the product skips (`Triangle::Full` for every ordinary product).
    pub triangle: Triangle,
    /// Subgroup size the cooperative kernels are built for (0 for SIMT).
    pub subgroup: u32,
    /// k is a whole number of the k loop's unrolled steps (see [`exact_k`]) and the whole of
    /// k is run, so no tile the loop computes passes the end: its loads need no per-element
    /// k clamp and its shared-memory stores no mask. On an H100 this made the f32 GPT-2
    /// products 2–5% faster (bench/results/2026-11-25-matmul-f32-h100-session14.md).
    pub exact_k: bool,
}

/// Whether `variant` may run `shape` with [`MatmulKernel::exact_k`]: k a multiple of the
/// loop's unrolled step (SIMT [`SimtTile::k_step`], cooperative `bk` × prefetch depth;
/// workgroup scope never). The triangle forms, whose k range varies per tile, never do
/// (`Problem::kernel`).
pub fn exact_k(variant: Variant, shape: &MatmulShape) -> bool {
    let step = match variant {
        Variant::Simt(t) => t.k_step(),
        Variant::Coop(t) => u32::from(t.bk) * u32::from(t.depth.max(1)),
        Variant::Wg(_) | Variant::Native(_) => return false,
    };
    shape.k > 0 && shape.k % step == 0
}

/// The index of this invocation's `j`-th unit of a staged tile of `units` units loaded by
/// `threads` invocations, and, when `units` is not a multiple of `threads`, whether that
/// unit exists.
///
/// An invocation without a unit gets the tile's last one: the loads are unguarded, and with
/// exact k nothing clamps k either, so an index past the tile would read k rows past the end
/// of the matrix. (It did: simt64x64d1, 256 invocations for 128 units, read up to 7 rows
/// past A's last one, and on an H100 a fresh-cache tuning of a 768×3072×8192 TN product
/// hung there.) Callers skip the stores of units that do not exist.
pub(crate) fn unit_index(
    k: &mut KernelBuilder,
    units: u32,
    tid: Val,
    threads: u32,
    j: u32,
) -> (Val, Option<Val>) {
    let off = k.u32(j * threads);
    let idx = k.add(tid, off);
    if units % threads == 0 {
        return (idx, None);
    }
    let n = k.u32(units);
    let valid = k.lt(idx, n);
    let last = k.u32(units - 1);
    (k.min(idx, last), Some(valid))
}

/// Where a kernel built with `exact_k` reads the tiles its loop prefetches past the end: the
/// k of the last tile inside k (`K − bk`), so one clamp a tile keeps every load in bounds
/// and no tile the loop computes needs a mask. `None` (clamp and mask per element) for other
/// kernels and for triangles.
pub(crate) fn last_tile(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    d: &Dims,
    bk: u32,
) -> Option<Val> {
    (kern.exact_k && kern.triangle == Triangle::Full).then(|| {
        let bk = k.u32(bk);
        let kk = k.max(d.k, bk);
        k.sub(kk, bk)
    })
}

/// A tile's k for its loads: `k0`, held at `last` (see [`last_tile`]).
pub(crate) fn tile_k0(k: &mut KernelBuilder, last: Option<Val>, k0: Val) -> Val {
    match last {
        Some(last) => k.min(k0, last),
        None => k0,
    }
}

/// Sizes and strides of one launch (all in elements). A is `m × k` (stored `k × m` when
/// transposed) with leading dimension `lda`; B is `k × n` (`n × k`) with `ldb`; C and the
/// residual are `m × n` row-major with `ldc`/`ldr`. The batch may have two levels, as the
/// (B, H) heads of attention viewed in place do: batch `i` is (`i / inner`, `i % inner`) and
/// starts at `(i / inner) · stride_* + (i % inner) · inner_*` (`inner` 1: `i · stride_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulShape {
    pub batch: u32,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub lda: u32,
    pub ldb: u32,
    pub ldc: u32,
    pub ldr: u32,
    pub stride_a: u32,
    pub stride_b: u32,
    pub stride_c: u32,
    pub stride_r: u32,
    /// Inner batch count (1: one level); it divides `batch`.
    pub inner: u32,
    pub inner_a: u32,
    pub inner_b: u32,
    pub inner_c: u32,
    pub inner_r: u32,
}

impl MatmulShape {
    /// Packed (contiguous) operands for these transposes.
    pub fn packed(batch: u32, m: u32, n: u32, k: u32, trans_a: bool, trans_b: bool) -> Self {
        MatmulShape {
            batch,
            m,
            n,
            k,
            lda: if trans_a { m } else { k },
            ldb: if trans_b { k } else { n },
            ldc: n,
            ldr: n,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
            stride_r: m * n,
            inner: 1,
            inner_a: 0,
            inner_b: 0,
            inner_c: 0,
            inner_r: 0,
        }
    }

    /// Multiply-adds × 2.
    pub fn flops(&self) -> f64 {
        2.0 * f64::from(self.batch) * f64::from(self.m) * f64::from(self.n) * f64::from(self.k)
    }
}

/// Which operands allow vector accesses of `width` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alignment {
    pub a: bool,
    pub b: bool,
    pub c: bool,
}

impl Alignment {
    /// An operand may use `width`-element vectors when its contiguous extent, its leading
    /// dimension and its batch strides are multiples of `width` (then a vector never
    /// straddles a row, and every row starts aligned).
    pub fn of(s: &MatmulShape, trans_a: bool, trans_b: bool, width: u32) -> Alignment {
        let ok = |extent: u32, ld: u32, stride: u32, inner: u32| {
            extent % width == 0
                && ld % width == 0
                && (s.batch <= 1 || stride % width == 0)
                && (s.inner <= 1 || inner % width == 0)
        };
        Alignment {
            a: ok(
                if trans_a { s.m } else { s.k },
                s.lda,
                s.stride_a,
                s.inner_a,
            ),
            b: ok(
                if trans_b { s.k } else { s.n },
                s.ldb,
                s.stride_b,
                s.inner_b,
            ),
            c: ok(s.n, s.ldc, s.stride_c, s.inner_c) && ok(s.n, s.ldr, s.stride_r, s.inner_r),
        }
    }
}

/// Device properties the selection and the generators need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatmulCaps {
    pub max_shared_bytes: u32,
    pub max_invocations: u32,
    pub subgroup: u32,
    /// 16×16×16 f16×f16→f32 fragments (subgroup scope) are reported and enabled.
    pub coop_f16: bool,
    /// 16×16×16 bf16×bf16→f32 fragments are reported and enabled.
    pub coop_bf16: bool,
    /// Workgroup-scope matrices (VK_NV_cooperative_matrix2) the device runs, per input type.
    pub coop_wg: Vec<WgSupport>,
    /// Tensor-addressed loads of such matrices (`cooperativeMatrixTensorAddressing`).
    pub coop_wg_tensor: bool,
    /// On a CPU device (lavapipe), how many host threads run workgroups at once; `None` on
    /// GPUs.
    pub cpu_threads: Option<u32>,
    /// The PTX target of the device's native kernels (VK_NVX_binary_import), if it has them.
    pub native: Option<helios_ptx::Target>,
}

/// One input type's workgroup-scope support: `m × n × k` products of f32-accumulated
/// matrices whose dimensions are multiples of `granularity` (at most `max_dimension`), in
/// workgroups of exactly `invocations`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgSupport {
    pub input: Storage,
    pub invocations: u32,
    pub granularity: [u32; 3],
    pub max_dimension: u32,
}

impl WgSupport {
    fn runs(&self, input: Storage, t: WgTile, invocations: u32) -> bool {
        let dims = [u32::from(t.bm), u32::from(t.bn), u32::from(t.bk)];
        self.input == input
            && self.invocations == invocations
            && dims
                .iter()
                .zip(self.granularity)
                .all(|(&d, g)| d % g.max(1) == 0 && d <= self.max_dimension)
    }
}

impl MatmulKernel {
    /// The kernel for `variant` on this problem: vector flags from the shape's alignment.
    pub fn new(
        variant: Variant,
        input: Storage,
        out: Storage,
        trans: (bool, bool),
        shape: &MatmulShape,
        epilogue: Epilogue,
        subgroup: u32,
    ) -> MatmulKernel {
        let al = Alignment::of(shape, trans.0, trans.1, vector_elems(variant));
        MatmulKernel {
            variant,
            input,
            out,
            trans_a: trans.0,
            trans_b: trans.1,
            vec_a: al.a,
            vec_b: al.b,
            vec_c: al.c,
            epilogue,
            triangle: Triangle::Full,
            subgroup: if variant.is_coop() { subgroup } else { 0 },
            exact_k: exact_k(variant, shape),
        }
    }

    /// Whether this kernel can run on a device with `caps` (shared memory, workgroup size,
    /// fragment support for the input storage).
    pub fn feasible(&self, caps: &MatmulCaps) -> bool {
        let v = self.variant;
        if !v.well_formed()
            || v.shared_bytes(self.trans_a, self.trans_b) > caps.max_shared_bytes
            || v.threads(caps.subgroup) > caps.max_invocations
            || !self.epilogue.is_valid()
        {
            return false;
        }
        match v {
            Variant::Simt(_) => !self.epilogue.col_sums || self.triangle == Triangle::Full,
            Variant::Native(t) => crate::matmul_native::feasible(self, t, caps.native),
            _ if self.triangle.masks_a() || self.epilogue.col_sums => false,
            Variant::Wg(t) => {
                (!t.tensor || (self.input == Storage::F16 && caps.coop_wg_tensor))
                    && self.epilogue.is_plain()
                    && self.triangle == Triangle::Full
                    && self.vec_a
                    && self.vec_b
                    && self.vec_c
                    && self.subgroup == caps.subgroup
                    && caps
                        .coop_wg
                        .iter()
                        .any(|s| s.runs(self.input, t, v.threads(caps.subgroup)))
            }
            Variant::Coop(t) => {
                let frags = match self.input {
                    Storage::F16 => caps.coop_f16,
                    Storage::BF16 => caps.coop_bf16,
                    Storage::F32 => false,
                };
                // Fragment-multiple shares and k steps: `well_formed`, checked above.
                frags
                    && caps.subgroup == self.subgroup
                    && crate::matmul_coop::scratch(t, self.trans_a, self.trans_b, caps.subgroup)
                        .is_some()
            }
        }
    }

    /// Whether the kernel handles every size of `shape`: the `Wg` variants load whole tiles
    /// unchecked, so their tile must divide M, N and K exactly; the others take any shape.
    pub fn fits(&self, shape: &MatmulShape) -> bool {
        match self.variant {
            Variant::Wg(t) => {
                shape.m % u32::from(t.bm) == 0
                    && shape.n % u32::from(t.bn) == 0
                    && shape.k % u32::from(t.bk) == 0
            }
            _ => true,
        }
    }

    /// `mm_<variant>_<in>_<out>_<nn|nt|tn|tt>[_v<abc>][_<epilogue>][_tri<lc|la|ua>]`.
    pub fn name(&self) -> String {
        let t = |x: bool| if x { 't' } else { 'n' };
        let mut vec = String::new();
        for (flag, c) in [(self.vec_a, 'a'), (self.vec_b, 'b'), (self.vec_c, 'c')] {
            if flag {
                vec.push(c);
            }
        }
        format!(
            "mm_{}_{}_{}_{}{}{}{}{}",
            self.variant.label(),
            self.input.name(),
            self.out.name(),
            t(self.trans_a),
            t(self.trans_b),
            if vec.is_empty() {
                String::new()
            } else {
                format!("_v{vec}")
            },
            self.epilogue.tag(),
            self.triangle.tag()
        ) + if self.exact_k { "_xk" } else { "" }
    }

    /// Emits the kernel.
    pub fn build(&self) -> KernelModule {
        match self.variant {
            Variant::Simt(t) => crate::matmul_simt::build(self, t),
            Variant::Coop(t) => crate::matmul_coop::build(self, t),
            Variant::Wg(t) => crate::matmul_wg::build(self, t),
            // Native kernels are PTX (`build_native`); callers branch on `is_native` first.
            Variant::Native(_) => {
                unreachable!("{} is a native kernel: use build_native", self.name())
            }
        }
    }

    /// Workgroups and push constants for `shape` with buffers at `addr`.
    pub fn launch(
        &self,
        module: &KernelModule,
        shape: &MatmulShape,
        addr: &MatmulAddresses,
        alpha: f32,
    ) -> Result<Launch, KernelError> {
        let bad = |detail: String| KernelError::Arguments {
            kernel: module.name.clone(),
            detail,
        };
        let al = Alignment::of(
            shape,
            self.trans_a,
            self.trans_b,
            vector_elems(self.variant),
        );
        if (self.vec_a && !al.a) || (self.vec_b && !al.b) || (self.vec_c && !al.c) {
            return Err(bad(format!(
                "built for vector accesses the shape does not allow: {shape:?}"
            )));
        }
        if !self.fits(shape) {
            return Err(bad(format!("its tile does not divide the shape {shape:?}")));
        }
        if self.exact_k && (self.triangle != Triangle::Full || !exact_k(self.variant, shape)) {
            return Err(bad(format!(
                "built for a k that is a whole number of loop steps; k = {} is not",
                shape.k
            )));
        }
        if self.epilogue.bias != addr.bias.is_some()
            || self.epilogue.residual != addr.residual.is_some()
            || (self.epilogue.row != RowOp::None) != addr.rows.is_some()
            || self.epilogue.store_pre != addr.pre.is_some()
            || self.epilogue.col_sums != addr.sums.is_some()
        {
            return Err(bad(
                "bias/residual/row/pre/sums buffers do not match the epilogue".into(),
            ));
        }
        if self.epilogue.col_sums
            && (!matches!(self.variant, Variant::Simt(_))
                || shape.batch != 1
                || self.triangle != Triangle::Full)
        {
            return Err(bad(format!(
                "column sums need a SIMT tile, a batch of one and the whole k range; got {} \
                 with a batch of {}",
                self.variant.label(),
                shape.batch
            )));
        }
        let (bm, bn) = self.variant.tile();
        let gx = shape.n.div_ceil(bn);
        let gy = shape.m.div_ceil(bm);
        if shape.inner == 0 || shape.batch % shape.inner != 0 {
            return Err(bad(format!(
                "inner batch count {} does not divide the batch {}",
                shape.inner, shape.batch
            )));
        }
        if gy > 65535 || shape.batch > 65535 || gx > 65535 {
            return Err(KernelError::TooLarge {
                what: "matmul grid",
                size: u64::from(gx) * u64::from(gy) * u64::from(shape.batch),
            });
        }
        // Inline: this runs for every product recorded.
        let mut args = Args::new();
        args.extend([
            Arg::Address(addr.a),
            Arg::Address(addr.b),
            Arg::Address(addr.c),
        ]);
        if let Some(b) = addr.bias {
            args.push(Arg::Address(b));
        }
        if let Some(r) = addr.residual {
            args.push(Arg::Address(r));
        }
        if let Some(r) = addr.rows {
            args.push(Arg::Address(r));
        }
        if let Some(r) = addr.pre {
            args.push(Arg::Address(r));
        }
        if let Some(r) = addr.sums {
            args.push(Arg::Address(r));
        }
        for v in [
            shape.m,
            shape.n,
            shape.k,
            shape.lda,
            shape.ldb,
            shape.ldc,
            shape.ldr,
            shape.stride_a,
            shape.stride_b,
            shape.stride_c,
            shape.stride_r,
            shape.inner,
            shape.inner_a,
            shape.inner_b,
            shape.inner_c,
            shape.inner_r,
        ] {
            args.push(Arg::U32(v));
        }
        args.push(Arg::F32(alpha));
        let push = pack_push(&module.name, &module.params, module.push_size, &args)?;
        Ok(Launch {
            groups: [gx, gy, shape.batch],
            push,
        })
    }
}

/// Device addresses of a launch's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulAddresses {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub bias: Option<u64>,
    pub residual: Option<u64>,
    /// The row op's values (f32), when the epilogue has one.
    pub rows: Option<u64>,
    /// The second output (`Epilogue::store_pre`).
    pub pre: Option<u64>,
    /// B's column sums (`Epilogue::col_sums`).
    pub sums: Option<u64>,
}

/// The documented default choice (used where no tuned winner exists, e.g. on CPU devices):
/// on a CPU device, SIMT tiles of 8×8 per invocation wherever every host thread still gets a
/// workgroup; else cooperative fragments for f16/bf16 inputs where the device has them
/// (128×128 tiles when the output has at least 64 such tiles' worth of elements, else
/// 64×64), otherwise SIMT tiles sized so that the grid still has work for many workgroups.
/// Always feasible.
pub fn default_variant(
    input: Storage,
    out: Storage,
    trans: (bool, bool),
    shape: &MatmulShape,
    epilogue: Epilogue,
    caps: &MatmulCaps,
) -> MatmulKernel {
    let outputs = u64::from(shape.m) * u64::from(shape.n) * u64::from(shape.batch);
    let order: &[&str] = if outputs >= 64 * 128 * 128 {
        &[
            "coop128x128w2x2k32s1",
            "coop64x64w2x2k32d2",
            "simt64x64d2",
            "simt32x32d1",
        ]
    } else if outputs >= 64 * 64 * 64 {
        &["coop64x64w2x2k32d2", "simt64x64d2", "simt32x32d1"]
    } else {
        &["coop64x64w2x2k32d2", "simt32x32d1"]
    };
    let feasible = candidates(input, out, trans, shape, epilogue, caps);
    if let Some(threads) = caps.cpu_threads {
        // On a CPU an invocation's 8×8 block runs about twice the FMAs a second of a 4×4 one
        // (lavapipe, 2 threads, the tiny preset's lm-head products at a vocabulary of 8192:
        // simt128x128d1 369–410 ms, simt128x64d1 392–407, simt32x32d1 814–838, simt64x64d2
        // 794–915). Take the largest such tile that still gives every thread a workgroup.
        let grid = |k: &MatmulKernel| {
            let (bm, bn) = k.variant.tile();
            u64::from(shape.m.div_ceil(bm))
                * u64::from(shape.n.div_ceil(bn))
                * u64::from(shape.batch)
        };
        let wide = ["simt128x128d1", "simt128x64d1"].iter().find_map(|name| {
            feasible
                .iter()
                .find(|k| k.variant.name() == *name && grid(k) >= u64::from(threads))
        });
        if let Some(k) = wide {
            return *k;
        }
    }
    order
        .iter()
        .find_map(|name| feasible.iter().find(|k| k.variant.name() == *name).copied())
        .unwrap_or_else(|| {
            // simt32x32 needs 64 invocations and 9 KiB: every Vulkan device has that.
            MatmulKernel::new(
                simt(32, 32, 4, 4, 1),
                input,
                out,
                trans,
                shape,
                epilogue,
                caps.subgroup,
            )
        })
}

/// Every feasible kernel for this problem, in table order (the autotuner's candidates).
pub fn candidates(
    input: Storage,
    out: Storage,
    trans: (bool, bool),
    shape: &MatmulShape,
    epilogue: Epilogue,
    caps: &MatmulCaps,
) -> Vec<MatmulKernel> {
    VARIANTS
        .iter()
        .map(|&(_, v)| MatmulKernel::new(v, input, out, trans, shape, epilogue, caps.subgroup))
        .filter(|k| k.feasible(caps) && k.fits(shape))
        .collect()
}

// ------------------------------------------------------------------ shared kernel pieces

/// The buffers and push constants every matmul kernel declares, in launch order.
pub(crate) struct Params {
    pub a: Buffer,
    pub b: Buffer,
    pub c: Buffer,
    pub bias: Option<Buffer>,
    pub residual: Option<Buffer>,
    pub rows: Option<Buffer>,
    pub pre: Option<Buffer>,
    pub sums: Option<Buffer>,
    pub m: Param,
    pub n: Param,
    pub k: Param,
    pub lda: Param,
    pub ldb: Param,
    pub ldc: Param,
    pub ldr: Param,
    pub stride_a: Param,
    pub stride_b: Param,
    pub stride_c: Param,
    pub stride_r: Param,
    pub inner: [Param; 5],
    pub alpha: Param,
}

/// Declares the parameters; A and B are declared with `a_elem`/`b_elem` (the SIMT kernels use
/// the storage's scalar, the cooperative ones `u32`/`u16` words they reinterpret).
pub(crate) fn declare(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    a_elem: Scalar,
    b_elem: Scalar,
) -> Params {
    let out = buffer_scalar(kern.out);
    let a = k.buffer("a", a_elem, Access::Read);
    let b = k.buffer("b", b_elem, Access::Read);
    let c = k.buffer("c", out, Access::Write);
    let bias = kern
        .epilogue
        .bias
        .then(|| k.buffer("bias", out, Access::Read));
    let residual = kern
        .epilogue
        .residual
        .then(|| k.buffer("residual", out, Access::Read));
    let rows =
        (kern.epilogue.row != RowOp::None).then(|| k.buffer("rows", Scalar::F32, Access::Read));
    let pre = kern
        .epilogue
        .store_pre
        .then(|| k.buffer("pre", out, Access::Write));
    let sums = kern
        .epilogue
        .col_sums
        .then(|| k.buffer("sums", out, Access::Write));
    let u = Ty::scalar(Scalar::U32);
    let mut p = |name: &str| k.param(name, u);
    let (m, n, kk) = (p("m"), p("n"), p("k"));
    let (lda, ldb, ldc, ldr) = (p("lda"), p("ldb"), p("ldc"), p("ldr"));
    let (stride_a, stride_b, stride_c, stride_r) =
        (p("stride_a"), p("stride_b"), p("stride_c"), p("stride_r"));
    let inner = ["inner", "inner_a", "inner_b", "inner_c", "inner_r"].map(&mut p);
    let alpha = k.param("alpha", Ty::scalar(Scalar::F32));
    Params {
        a,
        b,
        c,
        bias,
        residual,
        rows,
        pre,
        sums,
        m,
        n,
        k: kk,
        lda,
        ldb,
        ldc,
        ldr,
        stride_a,
        stride_b,
        stride_c,
        stride_r,
        inner,
        alpha,
    }
}

/// Push-constant values loaded once at the top of a kernel.
#[derive(Clone, Copy)]
pub(crate) struct Dims {
    pub m: Val,
    pub n: Val,
    pub k: Val,
    pub lda: Val,
    pub ldb: Val,
    pub ldc: Val,
    pub ldr: Val,
    pub alpha: Val,
    /// This workgroup's (flat) batch index.
    pub batch: Val,
    /// Element offsets of this workgroup's batch in A, B, C and the residual.
    pub off_a: Val,
    pub off_b: Val,
    pub off_c: Val,
    pub off_r: Val,
}

fn load_dims(k: &mut KernelBuilder, p: &Params, batch: Val) -> Dims {
    let ld = |k: &mut KernelBuilder, q: Param| k.load_param(q);
    let (m, n, kk) = (ld(k, p.m), ld(k, p.n), ld(k, p.k));
    let (lda, ldb, ldc, ldr) = (ld(k, p.lda), ld(k, p.ldb), ld(k, p.ldc), ld(k, p.ldr));
    let alpha = ld(k, p.alpha);
    // Batch `batch` is (outer, inner) = (batch / inner, batch % inner).
    let inner = ld(k, p.inner[0]);
    let outer_i = k.div(batch, inner);
    let inner_i = k.rem(batch, inner);
    let off = |k: &mut KernelBuilder, q: Param, qi: Param| {
        let s = k.load_param(q);
        let si = k.load_param(qi);
        let o = k.mul(outer_i, s);
        let i = k.mul(inner_i, si);
        k.add(o, i)
    };
    let off_a = off(k, p.stride_a, p.inner[1]);
    let off_b = off(k, p.stride_b, p.inner[2]);
    let off_c = off(k, p.stride_c, p.inner[3]);
    let off_r = off(k, p.stride_r, p.inner[4]);
    Dims {
        m,
        n,
        k: kk,
        lda,
        ldb,
        ldc,
        ldr,
        alpha,
        batch,
        off_a,
        off_b,
        off_c,
        off_r,
    }
}

/// The k loop both tiled generators (SIMT and cooperative) share: `stages` (1 or 2)
/// shared-memory stages of `stage` words for A and B, and `depth` tiles of global loads in
/// flight in `depth` register sets, or `depth + 1` with `spare_set`.
///
/// With one stage, step t instead computes on the stage, waits at a barrier, stores tile
/// t+1 into it, refills a set and ends with a second barrier: the loads of a tile are in
/// flight during one step's product either way (NVIDIA's compiler waits for all global
/// loads in flight at the first use of any of them, so `depth` > 1 buys no more).
///
/// Prologue: tile 0 goes into stage 0, tile j (1..=depth) into register set j % sets. Step
/// t then stores tile t+1 (loaded `depth` steps earlier) into stage (t+1) % 2, loads tile
/// t+1+depth into its set, runs `compute(base_a, base_b)` on stage t % 2 and ends with a
/// barrier. The loop is unrolled once per set so set indices are static, and twice where
/// two stages meet one set, so the stage index is too; steps past the last tile see zeros
/// (the loads clamp and mask) and add nothing.
///
/// The spare set: without it, a refill overwrites the set whose old tile the same step
/// stores. NVIDIA's compiler moves the loads of the unrolled body together late in it, so it
/// then loads into fresh registers and copies them into the set at the end of the body,
/// where the copies wait for the loads (on an H100, 49–77 MOVs a body behind the last
/// barrier). With a spare set, the refill goes into the set stored a step earlier. It took
/// the SIMT kernels' gpt2_fc_dx from 476 to 456 µs; the cooperative kernels, short of
/// registers, lost with it (a bf16 GPT-2 step 50.4 → 51.2 ms, DistilGPT-2 17.4 → 18.6).
///
/// Tiles run from k = `k_begin` (a multiple of `bk`) to `k_end` (see `k_span`). `load(k0)`
/// reads the A and B tiles at k offset `k0` into registers; `store(base_a, base_b, a, b,
/// k0)` writes the tile loaded at `k0` into a stage. A kernel that masks the k edge should
/// do it in `store`: a select on the loaded words at load time makes the compiler wait for
/// them there, which turns `depth` steps of latency hiding into one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn staged_k_loop(
    k: &mut KernelBuilder,
    (k_begin, k_end): (Val, Val),
    bk: u32,
    depth: u8,
    stages: u8,
    spare_set: bool,
    stage: [u32; 2],
    load: impl Fn(&mut KernelBuilder, Val) -> (Vec<Val>, Vec<Val>),
    store: impl Fn(&mut KernelBuilder, Val, Val, &[Val], &[Val], Val),
    mut compute: impl FnMut(&mut KernelBuilder, Val, Val),
) {
    let depth = u32::from(depth.max(1));
    // Tile j lives in set j % sets; the loop is unrolled once per set, so that set indices
    // are static.
    let sets = depth + u32::from(spare_set);
    let zero = k.u32(0);
    let bk_v = k.u32(bk);
    // The k offset of tile `t` (counted from `k_begin`).
    let tile_k = |k: &mut KernelBuilder, t: Val| {
        let off = k.mul(t, bk_v);
        k.add(k_begin, off)
    };
    let vars = |k: &mut KernelBuilder, (ra, rb): (Vec<Val>, Vec<Val>)| {
        let va: Vec<Var> = ra.into_iter().map(|v| k.var_init(v)).collect();
        let vb: Vec<Var> = rb.into_iter().map(|v| k.var_init(v)).collect();
        (va, vb)
    };
    let (ra, rb) = load(k, k_begin);
    store(k, zero, zero, &ra, &rb, k_begin);
    let mut slots: Vec<Option<(Vec<Var>, Vec<Var>)>> = vec![None; sets as usize];
    if spare_set {
        // Set 0 would hold tile 0, which is in stage 0 already: it starts out free.
        slots[0] = Some(vars(k, (ra, rb)));
    }
    for j in 1..=depth {
        let tile = k.u32(j);
        let k0 = tile_k(k, tile);
        let loaded = load(k, k0);
        slots[(j % sets) as usize] = Some(vars(k, loaded));
    }
    let slots: Vec<(Vec<Var>, Vec<Var>)> = slots
        .into_iter()
        .map(|s| s.expect("every set filled"))
        .collect();
    k.workgroup_barrier();

    let bk_m1 = k.u32(bk - 1);
    let span = k.sub(k_end, k_begin);
    let kpad = k.add(span, bk_m1);
    let tiles = k.div(kpad, bk_v);
    // Two stages and one set: unrolled twice, so that the stage of step u is u % 2. With
    // an odd number of sets above one (the SIMT kernels' two sets and a spare), unrolling
    // to an even count lost 12–31% (an H200: simt128x64d2 at GPT-2's f32 dW shapes), so
    // there the stage stays an index computed each step.
    let unroll = if stages == 2 && sets == 1 { 2 } else { sets };
    let static_stage = unroll % 2 == 0;
    let dv = k.u32(unroll);
    let dm1 = k.u32(unroll - 1);
    let tiles = k.add(tiles, dm1);
    let tiles = k.div(tiles, dv);
    let tiles = k.mul(tiles, dv);
    let one = k.u32(1);
    let a_stage = k.u32(stage[0]);
    let b_stage = k.u32(stage[1]);
    let single = stages == 1;
    // The product on the stage at index `cur`.
    let mut product = |k: &mut KernelBuilder, cur: Val| {
        let base_a = k.mul(cur, a_stage);
        let base_b = k.mul(cur, b_stage);
        compute(k, base_a, base_b);
    };
    k.for_range(zero, tiles, dv, |k, t0| {
        for u in 0..unroll {
            let off = k.u32(u);
            let kt = k.add(t0, off);
            // With an even unroll t0 is even, so tile kt's stage is u's.
            let (cur, other) = if single {
                (zero, zero)
            } else if static_stage {
                (k.u32(u % 2), k.u32((u + 1) % 2))
            } else {
                let cur = k.and(kt, one);
                (cur, k.xor(cur, one))
            };
            if single {
                // One stage: every invocation is done reading it before it is refilled.
                product(k, cur);
                k.workgroup_barrier();
            }
            let (va, vb) = &slots[((u + 1) % sets) as usize];
            let ra: Vec<Val> = va.iter().map(|&v| k.get(v)).collect();
            let rb: Vec<Val> = vb.iter().map(|&v| k.get(v)).collect();
            let nbase_a = k.mul(other, a_stage);
            let nbase_b = k.mul(other, b_stage);
            let next = k.add(kt, one);
            let next_k0 = tile_k(k, next);
            store(k, nbase_a, nbase_b, &ra, &rb, next_k0);
            // Tile t+1+depth: into the set just stored, or with a spare set, into the set of
            // tile t, stored a step ago.
            let (da, db) = &slots[((u + 1 + depth) % sets) as usize];
            let ahead = k.u32(1 + depth);
            let tile = k.add(kt, ahead);
            let k0 = tile_k(k, tile);
            let (ra, rb) = load(k, k0);
            for (v, x) in da.iter().zip(ra) {
                k.set(*v, x);
            }
            for (v, x) in db.iter().zip(rb) {
                k.set(*v, x);
            }
            if !single {
                product(k, cur);
            }
            k.workgroup_barrier();
        }
    });
}

/// This workgroup's problem: the launch's dimensions (with its batch's offsets) and the
/// first row and column of its `bm × bn` output tile.
pub(crate) fn tile_origin(k: &mut KernelBuilder, p: &Params, bm: u32, bn: u32) -> (Dims, Val, Val) {
    let (tile_m, tile_n, batch) = tile_coords(k);
    let d = load_dims(k, p, batch);
    let bm_v = k.u32(bm);
    let bn_v = k.u32(bn);
    let m0 = k.mul(tile_m, bm_v);
    let n0 = k.mul(tile_n, bn_v);
    (d, m0, n0)
}

/// The k range `[begin, end)` a workgroup whose tile starts at row `m0` runs (`begin` a
/// multiple of `bk`): all of k, or the part `kern.triangle` leaves (see `Triangle`).
pub(crate) fn k_span(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    d: &Dims,
    m0: Val,
    bm: u32,
    bk: u32,
) -> (Val, Val) {
    let zero = k.u32(0);
    match kern.triangle {
        Triangle::Full | Triangle::LowerC => (zero, d.k),
        Triangle::LowerA => {
            let bm_v = k.u32(bm);
            let end = k.add(m0, bm_v);
            (zero, k.min(end, d.k))
        }
        Triangle::UpperA => {
            let bk_v = k.u32(bk);
            let steps = k.div(m0, bk_v);
            let begin = k.mul(steps, bk_v);
            (k.min(begin, d.k), d.k)
        }
    }
}

/// Ends the workgroup when `kern.triangle` is `LowerC` and its tile (rows from `m0`, `bm` of
/// them; columns from `n0`) lies wholly above the diagonal. Uniform over the workgroup, so
/// it may precede barriers.
pub(crate) fn skip_upper_tile(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    m0: Val,
    n0: Val,
    bm: u32,
) {
    if kern.triangle == Triangle::LowerC {
        let last = k.u32(bm - 1);
        let last = k.add(m0, last);
        let above = k.gt(n0, last);
        k.return_if(above);
    }
}

/// Workgroup tile coordinates (row tile, column tile) with grouped rasterization: runs of
/// `GROUP` row tiles are walked column by column, so workgroups running together share A
/// row panels and B column panels in L2.
fn tile_coords(k: &mut KernelBuilder) -> (Val, Val, Val) {
    const GROUP: u32 = 8;
    let wid = k.workgroup_id();
    let nwg = k.num_workgroups();
    let (x, y, z) = (k.extract(wid, 0), k.extract(wid, 1), k.extract(wid, 2));
    let (gx, gy) = (k.extract(nwg, 0), k.extract(nwg, 1));
    let row_len = k.mul(y, gx);
    let pid = k.add(row_len, x);
    let g = k.u32(GROUP);
    let per_group = k.mul(g, gx);
    let group = k.div(pid, per_group);
    let first = k.mul(group, g);
    let left = k.sub(gy, first);
    let size = k.min(left, g);
    let in_group = k.rem(pid, per_group);
    let r = k.rem(in_group, size);
    let tile_m = k.add(first, r);
    let tile_n = k.div(in_group, size);
    (tile_m, tile_n, z)
}

/// Applies the epilogue to `v` (f32, 1 or 4 lanes: columns `col..col+lanes` of `row`, all in
/// bounds) and stores it into C.
pub(crate) fn epilogue_store(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    p: &Params,
    d: &Dims,
    row: Val,
    col: Val,
    v: Val,
) {
    let lanes = v.ty.lanes;
    let alpha = k.splat(d.alpha, lanes);
    let mut v = k.mul(v, alpha);
    let vidx = |k: &mut KernelBuilder, base: Val| {
        if lanes == 1 {
            base
        } else {
            let l = k.u32(lanes as u32);
            k.div(base, l)
        }
    };
    if let Some(bias) = p.bias {
        let i = vidx(k, col);
        let b = load_f32(k, bias, i, lanes, kern.out);
        v = k.add(v, b);
    }
    // The residual at (row, col), for adding or for the softmax gradient's product.
    let residual = |k: &mut KernelBuilder, res: Buffer| {
        let at = k.mul(row, d.ldr);
        let at = k.add(at, col);
        let at = k.add(at, d.off_r);
        let i = vidx(k, at);
        load_f32(k, res, i, lanes, kern.out)
    };
    if let Some(rows) = p.rows {
        let at = k.mul(d.batch, d.m);
        let at = k.add(at, row);
        let r = load_f32(k, rows, at, 1, Storage::F32);
        let r = k.splat(r, lanes);
        v = k.sub(v, r);
        v = match kern.epilogue.row {
            RowOp::Exp => k.exp(v),
            RowOp::SoftmaxGrad => {
                let res = p.residual.expect("a softmax gradient reads the residual");
                let y = residual(k, res);
                k.mul(y, v)
            }
            RowOp::None => unreachable!("no rows buffer without a row op"),
        };
    }
    // Where C's value goes (and the activation's input, which is laid out like C).
    let at = k.mul(row, d.ldc);
    let at = k.add(at, col);
    let at = k.add(at, d.off_c);
    let c_index = vidx(k, at);
    if let Some(pre) = p.pre {
        store_f32(k, pre, c_index, v, kern.out);
    }
    v = match kern.epilogue.act {
        Activation::None => v,
        Activation::Relu => math::relu(k, v),
        Activation::GeluTanh => math::gelu_tanh(k, v),
    };
    let act_grad = kern.epilogue.act_grad;
    if act_grad != Activation::None {
        let res = p
            .residual
            .expect("an activation's gradient reads the residual");
        let x = residual(k, res);
        v = match act_grad {
            Activation::Relu => math::relu_backward(k, x, v),
            Activation::GeluTanh => math::gelu_tanh_backward(k, x, v),
            Activation::None => unreachable!("checked above"),
        };
    } else if let (Some(res), false) = (p.residual, kern.epilogue.row == RowOp::SoftmaxGrad) {
        let r = residual(k, res);
        v = k.add(v, r);
    }
    store_f32(k, p.c, c_index, v, kern.out);
}

/// Stores a 4-column group `v` (vec4 f32) at (`row`, `col..col+4`): one vector store when
/// `vec_c` (N a multiple of 4: the group is all in or all out), else per-column checks.
pub(crate) fn store_quad(
    k: &mut KernelBuilder,
    kern: &MatmulKernel,
    p: &Params,
    d: &Dims,
    row: Val,
    col: Val,
    v: Val,
) {
    let row_ok = k.lt(row, d.m);
    if kern.vec_c {
        let col_ok = k.lt(col, d.n);
        let ok = k.and(row_ok, col_ok);
        k.if_(ok, |k| epilogue_store(k, kern, p, d, row, col, v));
    } else {
        for lane in 0..4 {
            let off = k.u32(lane);
            let c = k.add(col, off);
            let col_ok = k.lt(c, d.n);
            let ok = k.and(row_ok, col_ok);
            let x = k.extract(v, lane);
            k.if_(ok, |k| epilogue_store(k, kern, p, d, row, c, x));
        }
    }
}

/// `if cond { a } else { b }` without branching, for in-bounds masking.
pub(crate) fn mask(k: &mut KernelBuilder, cond: Val, v: Val) -> Val {
    let zero = k.constant_bits(v.ty, 0);
    k.select(cond, v, zero)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every table variant's label is its table name and parses back to it; tiles outside
    /// the table parse from the same grammar, and malformed or impossible ones do not.
    #[test]
    fn variant_names_round_trip() {
        for &(name, v) in VARIANTS {
            assert_eq!(v.label(), name);
            assert_eq!(Variant::parse(name), Some(v), "{name}");
        }
        let custom = [
            ("coop128x256w2x8k32s1", coop1(128, 256, 32, 2, 8)),
            ("coop128x192w2x6k32d1", coop(128, 192, 32, 2, 6, 1)),
            ("coop256x128w4x4k16d3", coop(256, 128, 16, 4, 4, 3)),
        ];
        for (name, v) in custom {
            assert!(v.well_formed(), "{name}");
            assert_eq!(Variant::by_name(name), None, "{name} is in the table");
            assert_eq!(Variant::parse(name), Some(v), "{name}");
            assert_eq!(v.label(), name);
        }
        // Every name the grammar takes is well formed, and hand-made tiles that the
        // generators cannot build are not.
        assert!(VARIANTS.iter().all(|(_, v)| v.well_formed()));
        for bad in [
            simt(128, 128, 3, 8, 1),
            simt(128, 100, 8, 8, 1),
            simt(0, 64, 4, 4, 1),
            coop(128, 128, 32, 0, 2, 1),
            coop(128, 128, 24, 2, 2, 1),
            coop(96, 128, 32, 4, 2, 1),
            coop(128, 128, 32, 2, 2, 0),
            coop_tile(128, 128, 32, 2, 2, 2, 1),
            coop_tile(128, 128, 32, 2, 2, 1, 3),
            wg(128, 128, 16, 0, false),
        ] {
            assert!(!bad.well_formed(), "{bad:?}");
        }
        for bad in [
            "",
            "coop",
            "coop128x256w2x8k32",
            "coop128x256w2x8k32s2",
            "coop128x256w2x8k32d0",
            "coop128x256w2x8k32d4",
            "coop128x256w2x8k32d1x",
            "coop120x256w2x8k32d1",
            "coop128x256w3x8k32d1",
            "coop128x256w2x8k24d1",
            "coop1024x256w2x8k32d1",
            "coop128x256w8x8k32d1",
            "coop128x256w0x8k32d1",
            "coop00128x256w2x8k32d1",
            "simt128x128t4x4d1",
            "wg128x128k16w8p",
        ] {
            assert_eq!(Variant::parse(bad), None, "{bad:?}");
        }
    }

    /// `exact_k` holds exactly where k is a whole number of the loop's unrolled steps:
    /// SIMT 8 × (depth + 1) (the spare register set), cooperative bk × depth, never for
    /// workgroup scope or k = 0.
    #[test]
    fn exact_k_follows_the_loop_step() {
        let shape = |k: u32| MatmulShape::packed(1, 64, 64, k, false, false);
        let v = |name: &str| Variant::by_name(name).expect("a variant of the table");
        for (name, step) in [
            ("simt128x64d1", 16),
            ("simt64x64d2", 24),
            ("coop128x256w2x4k48s1", 48),
            ("coop128x128w4x4k32d2", 64),
            ("coop128x256w2x4k16d1", 16),
        ] {
            for k in [step, 2 * step, 768, 3072, 8192, step + 8, 0] {
                let want = k > 0 && k % step == 0;
                assert_eq!(exact_k(v(name), &shape(k)), want, "{name} k = {k}");
            }
        }
        assert!(!exact_k(v("wg128x128k16w4p"), &shape(1024)));
        // The constructor sets it from the shape; launch refuses a shape it does not fit.
        let kern = MatmulKernel::new(
            v("simt128x64d1"),
            Storage::F32,
            Storage::F32,
            (false, false),
            &shape(48),
            Epilogue::NONE,
            0,
        );
        assert!(kern.exact_k && kern.name().ends_with("_xk"));
        let module = kern.build();
        let addr = MatmulAddresses {
            a: 0,
            b: 0,
            c: 0,
            bias: None,
            residual: None,
            rows: None,
            pre: None,
            sums: None,
        };
        assert!(kern.launch(&module, &shape(48), &addr, 1.0).is_ok());
        assert!(kern.launch(&module, &shape(40), &addr, 1.0).is_err());
    }
}
