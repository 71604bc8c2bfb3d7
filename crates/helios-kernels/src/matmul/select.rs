//! Which kernel runs a product when nothing was tuned (`default_variant`), and which ones the
//! autotuner in `helios` times (`candidates`).

use super::variant::simt;
use super::{Epilogue, MatmulCaps, MatmulKernel, MatmulShape, Variant, VARIANTS};
use crate::storage::Storage;

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
        // (lavapipe; bench/results/source-comment-history.md). Take the largest such tile
        // that still gives every thread a workgroup.
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

/// Every feasible kernel for this problem, in table order (the autotuner's candidates). The
/// few-row tiles only where the product has 16 rows or fewer and a tile of theirs covers at
/// least half of them (each row tile reads all of B); on such products no tile of 128 rows
/// or more (it computes 8× the rows there are or more: none won any of GPT-2's decode
/// classes on the H200, and their compiles and trials slowed a fresh process's first tokens:
/// bench/results/2026-11-30-session47-h200.md).
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
        .filter(|k| match k.variant {
            Variant::Rows(t) => shape.m <= 16 && shape.m.div_ceil(u32::from(t.bm)) <= 2,
            v => shape.m > 16 || v.tile().0 < 128,
        })
        .collect()
}
