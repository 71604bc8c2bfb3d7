//! The tiles of the kernel families, the `Variant` that names one, and the table of every
//! variant the tuner tries (with the grammar of names outside it): what a kernel's shape of
//! work is, apart from the problem it runs.

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

/// A tile of the native NVIDIA kernels (`native`, PTX with `wgmma`): `bm × bn` outputs
/// per block of `wgs` consumer warpgroups (each `bm / wgs` rows × `bn`, in 64-row `wgmma`
/// strips) and a producer warpgroup, k staged `bk` at a time through `stages`
/// shared-memory stages. `stream`: one block per SM takes an equal share of all the k
/// steps of all the output tiles (stream-K), so products of few tiles fill the GPU; the
/// blocks sharing a tile add their parts in a fixed order (`native::stream`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NativeTile {
    pub bm: u16,
    pub bn: u16,
    pub bk: u16,
    pub stages: u8,
    pub wgs: u8,
    pub stream: bool,
}

impl NativeTile {
    /// 64-row strips of each consumer warpgroup.
    pub const fn strips(self) -> u32 {
        self.bm as u32 / 64 / self.wgs as u32
    }

    /// Shared memory: the stages (both operands, 2-byte elements), an mbarrier a stage and
    /// the two tensor maps being built.
    pub const fn shared_bytes(self) -> u32 {
        let stages = self.stages as u32 * (self.bm as u32 + self.bn as u32) * self.bk as u32 * 2;
        stages + 8 * self.stages as u32 + 2 * 128
    }
}

/// A few-row tile (`rows`): `bm` rows (1 to 8) × `bn` columns of the output per workgroup
/// of [`ROWS_THREADS`] invocations, which split the whole k range between them and add their
/// parts at the end. For decoding's products (a token or a few against a weight matrix),
/// whose time is the weights' bytes: every invocation keeps its loads in flight at once,
/// where a tiled kernel walks k one step after another (bench/results/2026-11-30-session47-
/// h200.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowsTile {
    pub bm: u8,
    pub bn: u8,
}

/// Invocations of a `rows` workgroup.
pub const ROWS_THREADS: u32 = 256;

/// A kernel family and its tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    Simt(SimtTile),
    Coop(CoopTile),
    /// Workgroup-scope matrices (`wg`).
    Wg(WgTile),
    /// NVIDIA's native path: PTX through VK_NVX_binary_import (`native`).
    Native(NativeTile),
    /// Few-row products (`rows`).
    Rows(RowsTile),
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
    // 8×16 per invocation (`t`), cuBLAS's SIMT shape: 128 invocations at ~235 registers. It
    // won only the largest square; 8×16 on a 128×64 tile spilled, and 16×8 or 256×128 tiles
    // lost everywhere (bench/results/2026-11-25-matmul-f32-h100-session11.txt).
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
    // they lose at 4096³ but fill the SMs better on GPT-2's n = 768 and 2304
    // (bench/results/2026-11-27-matmul-h100-session18-sweep.txt).
    ("coop128x192w2x6k48s1", coop1(128, 192, 48, 2, 6)),
    // k64 in one stage (47.5 and 35 KiB): the fewest barriers per product. On an H100
    // both beat k48 (bench/results/2026-11-27-matmul-h100-session19-ablation.txt, second
    // sweep).
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
    // ten tilings of each tried on an H100, under half the subgroup-scope kernels' rate; kept
    // so the tuner picks them up wherever a driver makes this path fast
    // (bench/results/2026-11-22-coopmat2-h100.md).
    ("wg128x128k16w4p", wg(128, 128, 16, 4, true)),
    ("wgt128x128k16w4", wgt(128, 128, 16, 4)),
    // NVIDIA native (wgmma through PTX, stages filled by the copy engine). The copies bound
    // them, so the 256 × 192 tile (two warpgroups of two 64-row strips: the most products
    // per byte copied that the registers hold) wins wherever its tiles fill the SMs, and
    // 128 × 192 with a stage more in flight where they do not (the weight gradients) (H200:
    // bench/results/2026-11-29-native-release-h200.md).
    ("nv256x192k16s3w2", native_strips(256, 192, 16, 3, 2)),
    ("nv128x192k16s4", native(128, 192, 16, 4)),
    // The same tiles in stream-K order: what products of fewer tiles than SMs take (the
    // weight gradients: 24 to 96 tiles on 132 SMs).
    (
        "nv256x192k16s3w2sk",
        native_stream(native_strips(256, 192, 16, 3, 2)),
    ),
    ("nv128x192k16s4sk", native_stream(native(128, 192, 16, 4))),
    // Few rows (decoding): each invocation reads 32 contiguous bytes of B per k row (8 f32
    // or 16 halves) or 16-32 bytes more, for one token (`rows1`) or a batch (`rows8`).
    ("rows1x8", rows(1, 8)),
    ("rows1x16", rows(1, 16)),
    ("rows1x32", rows(1, 32)),
    ("rows8x8", rows(8, 8)),
    ("rows8x16", rows(8, 16)),
];

/// Native tiles measured beside the table's on the H200 and reachable by name
/// (`Variant::parse`); the tests build and run them too.
const NATIVE_MEASURED: [&str; 4] = [
    "nv128x192k32s2",
    "nv192x192k16s3",
    "nv128x256k16s3",
    "nv128x128k32s2",
];

/// Every native tile worth building: the table's, then `NATIVE_MEASURED`.
pub fn native_variants() -> Vec<Variant> {
    VARIANTS
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| v.is_native())
        .chain(
            NATIVE_MEASURED
                .iter()
                .map(|name| Variant::parse(name).expect("a native tile")),
        )
        .collect()
}

/// A native tile of one 64-row strip per consumer warpgroup.
const fn native(bm: u16, bn: u16, bk: u16, stages: u8) -> Variant {
    native_strips(bm, bn, bk, stages, (bm / 64) as u8)
}

/// A native tile of `wgs` consumer warpgroups.
const fn native_strips(bm: u16, bn: u16, bk: u16, stages: u8, wgs: u8) -> Variant {
    Variant::Native(NativeTile {
        bm,
        bn,
        bk,
        stages,
        wgs,
        stream: false,
    })
}

/// `v`, a native tile, in stream-K order.
const fn native_stream(v: Variant) -> Variant {
    match v {
        Variant::Native(t) => Variant::Native(NativeTile { stream: true, ..t }),
        other => other,
    }
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

/// A native tile written `<bm>x<bn>k<bk>s<stages>` (after `nv`), then `w<wgs>` where the
/// consumer warpgroups are fewer than one per 64 rows, then `sk` in stream-K order.
fn parse_native(s: &str) -> Option<Variant> {
    let (bm, rest) = number(s)?;
    let (bn, rest) = number(rest.strip_prefix('x')?)?;
    let (bk, rest) = number(rest.strip_prefix('k')?)?;
    let (stages, rest) = number(rest.strip_prefix('s')?)?;
    let (wgs, rest) = match rest.strip_prefix('w') {
        Some(w) => number(w)?,
        None => (bm / 64, rest),
    };
    let (stream, rest) = match rest.strip_prefix("sk") {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let v = Variant::Native(NativeTile {
        bm: u16::try_from(bm).ok()?,
        bn: u16::try_from(bn).ok()?,
        bk: u16::try_from(bk).ok()?,
        stages: u8::try_from(stages).ok()?,
        wgs: u8::try_from(wgs).ok()?,
        stream,
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

const fn rows(bm: u8, bn: u8) -> Variant {
    Variant::Rows(RowsTile { bm, bn })
}

pub(super) const fn simt(bm: u16, bn: u16, tm: u8, tn: u8, depth: u8) -> Variant {
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
    pub const COOP_GRAMMAR: &str = "coop<bm>x<bn>w<wm>x<wn>k<bk> then d<1-3> or s1, or \
         nv<bm>x<bn>k<16|32>s<stages>, or rows<1-8>x<4-32>";

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
            Variant::Native(t) => {
                let wgs = if u32::from(t.wgs) == u32::from(t.bm) / 64 {
                    String::new()
                } else {
                    format!("w{}", t.wgs)
                };
                let sk = if t.stream { "sk" } else { "" };
                format!("nv{}x{}k{}s{}{wgs}{sk}", t.bm, t.bn, t.bk, t.stages)
            }
            Variant::Rows(t) => format!("rows{}x{}", t.bm, t.bn),
        }
    }

    /// The variant `name` names: a table name, or a cooperative tile outside the table
    /// written in its grammar, `coop<bm>x<bn>w<wm>x<wn>k<bk>` then `d<depth>` (two
    /// shared-memory stages, loads `depth` steps ahead, 1 to 3) or `s1` (one stage), for
    /// trying tiles side by side (`helios bench matmul --variants`) without editing the
    /// table. Edges are multiples of 16 (each subgroup's share too) up to 512, k steps up to
    /// 128, at most 32 subgroups; whether a device runs the tile (shared memory, workgroup
    /// size) is checked where it is chosen. Native tiles parse from `nv…` (`parse_native`),
    /// few-row tiles from `rows<bm>x<bn>`.
    pub fn parse(name: &str) -> Option<Variant> {
        if let Some(v) = Variant::by_name(name) {
            return Some(v);
        }
        if let Some(rest) = name.strip_prefix("nv") {
            return parse_native(rest);
        }
        if let Some(rest) = name.strip_prefix("rows") {
            let (bm, rest) = number(rest)?;
            let (bn, rest) = number(rest.strip_prefix('x')?)?;
            let v = rows(u8::try_from(bm).ok()?, u8::try_from(bn).ok()?);
            return (rest.is_empty() && v.well_formed()).then_some(v);
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
                    && (64..=256).contains(&t.bm)
                    && t.bn % 16 == 0
                    && (16..=256).contains(&t.bn)
                    && t.bk % 16 == 0
                    && (16..=64).contains(&t.bk)
                    && t.stages >= 2
                    && t.wgs > 0
                    && (t.bm / 64) % u16::from(t.wgs) == 0
                    // A thread's accumulators: 192 compile without spills beside the
                    // loop's registers, 256 cannot.
                    && t.strips() * t.bn as u32 / 2 <= 192
            }
            // Accumulators: bm × bn a thread (128 at most), in 4-column groups.
            Variant::Rows(t) => {
                (1..=8).contains(&t.bm)
                    && t.bn % 4 == 0
                    && (4..=32).contains(&t.bn)
                    && u32::from(t.bm) * u32::from(t.bn) <= 128
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
            Variant::Rows(t) => (t.bm as u32, t.bn as u32),
        }
    }

    /// Invocations per workgroup (`subgroup` is the device's subgroup size; SIMT ignores it).
    pub const fn threads(self, subgroup: u32) -> u32 {
        match self {
            Variant::Simt(t) => (t.bm as u32 / t.tm as u32) * (t.bn as u32 / t.tn as u32),
            Variant::Coop(t) => subgroup * t.wm as u32 * t.wn as u32,
            Variant::Wg(t) => subgroup * t.warps as u32,
            // The consumer warpgroups (128 threads each) and a producer.
            Variant::Native(t) => 128 * t.wgs as u32 + 128,
            Variant::Rows(_) => ROWS_THREADS,
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
                let (a, b) = super::coop::stage_vec4s(t, trans_a, trans_b);
                u32::from(t.stages) * (a + b) * 16
            }
            // The driver's own staging lives in its reserved shared memory.
            Variant::Wg(_) => 0,
            Variant::Native(t) => t.shared_bytes(),
            // A 16-byte sum per 4 outputs and subgroup, for subgroups of 4 or more (the
            // generator sizes it for the device's smallest subgroup).
            Variant::Rows(t) => (ROWS_THREADS / 4) * u32::from(t.bm) * u32::from(t.bn) * 4,
        }
    }
}

/// Vector width (elements) of a 16-byte access for a variant's operands: SIMT kernels load
/// vec4 of the storage type, cooperative kernels 8 halves.
pub const fn vector_elems(v: Variant) -> u32 {
    match v {
        Variant::Simt(_) | Variant::Rows(_) => 4,
        Variant::Coop(_) | Variant::Wg(_) | Variant::Native(_) => 8,
    }
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
            ("nv128x256k16s3", native(128, 256, 16, 3)),
            ("nv128x128k16s4w1", native_strips(128, 128, 16, 4, 1)),
            ("rows2x8", rows(2, 8)),
            ("rows4x32", rows(4, 32)),
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
            "nv128x192k32s2p2",
            "nv192x192k16s3w2",
            "nv256x192k16s3w0",
            "nv256x192k16s3w",
            "nv128x256k16s3w1",
            "rows0x8",
            "rows9x8",
            "rows1x6",
            "rows8x32",
            "rows1x8x",
        ] {
            assert_eq!(Variant::parse(bad), None, "{bad:?}");
        }
    }
}
