//! The shape classes tuned winners apply to, and the on-disk store of the winners.

use helios_kernels::MatmulVariant;

use crate::ops::matmul::Problem;
use crate::Device;

/// The shape class a tuned winner applies to: dtypes, transposes, epilogue, which operands
/// allow 16-byte accesses (for SIMT and cooperative widths), each size rounded up to a
/// power of two, and the largest power of two up to `WG_GRANULE` dividing M, N and K (so
/// every shape of a class fits the same workgroup-scope tiles).
pub(crate) fn class_key(p: &Problem) -> String {
    let s = &p.shape;
    let flags = |w: u32| {
        let a = p.alignment(w);
        format!("{}{}{}", a.a as u8, a.b as u8, a.c as u8)
    };
    let t = |x: bool| if x { 't' } else { 'n' };
    let [mn_granule, k_granule] = helios_kernels::matmul::WG_GRANULE;
    let divides = |x: u32, cap: u32| (1u32 << x.trailing_zeros().min(31)).min(cap);
    format!(
        "{}>{} {}{} m{} n{} k{} b{} v{}/{} x{}.{}.{} e{}{:?}{}",
        p.input,
        p.out,
        t(p.trans.0),
        t(p.trans.1),
        s.m.max(1).next_power_of_two(),
        s.n.max(1).next_power_of_two(),
        s.k.max(1).next_power_of_two(),
        s.batch.max(1).next_power_of_two(),
        flags(4), // SIMT vec4
        flags(8), // cooperative 16-byte words
        divides(s.m, mn_granule),
        divides(s.n, mn_granule),
        divides(s.k, k_granule),
        p.epilogue.bias() as u8,
        p.epilogue.act(),
        p.epilogue.residual() as u8,
    ) + match p.epilogue.row() {
        // (Classes without a row op keep the keys stored before row ops existed.)
        helios_kernels::RowOp::None => "",
        helios_kernels::RowOp::Exp => " rexp",
        helios_kernels::RowOp::SoftmaxGrad => " rsmgrad",
    }
}

/// Matmul winners per device (`<cache root>/matmul/<device>.tsv`). Version 2: the
/// cooperative kernels' loads changed (unmasked, read-only path) and one-stage tiles came in.
/// Version 3: the tuner compiles every candidate before its warm-up; earlier stores can hold
/// winners timed at the idle clock. Version 4: every cooperative tile's epilogue goes through
/// shared memory (faster on GPT-2's shapes:
/// bench/results/2026-11-27-matmul-h100-session18-epilogue-ab.txt) and three tiles joined
/// the table; earlier winners were ranked under the old epilogue and never saw the new tiles.
/// Version 5: the native kernels release each stage once its products are done, the
/// 256 × 192 native tile joined the table and native kernels split k in any number of parts
/// (bench/results/2026-11-29-native-release-h200.md); earlier winners never saw them.
static STORE: crate::ops::tuning_store::TuningStore =
    crate::ops::tuning_store::TuningStore::new("matmul", STORE_VERSION, |v| parse_tag(v).is_some());

/// The winners' store version (above), which unsettled classes' progress follows.
const STORE_VERSION: u32 = 5;

/// Unsettled classes' exploration (`<cache root>/matmul-progress/<device>.tsv`), in the
/// stored tags (`winner_tag`).
pub(super) static PROGRESS: crate::ops::tuning_progress::ProgressStore =
    crate::ops::tuning_progress::ProgressStore::new("matmul-progress", STORE_VERSION, |t| {
        parse_tag(t).is_some()
    });

pub(super) fn cached(device: &Device, key: &str) -> Option<(MatmulVariant, u32)> {
    STORE.get(device, key).and_then(|v| parse_tag(&v))
}

/// The winner of `key` stored for this device under another driver: the first choice after
/// a driver update, checked again on real work.
pub(super) fn earlier(device: &Device, key: &str) -> Option<(MatmulVariant, u32)> {
    STORE.earlier(device, key).and_then(|v| parse_tag(&v))
}

/// Forgets a class's stored winner and exploration progress (tests).
#[cfg(test)]
pub(super) fn forget(device: &Device, key: &str) {
    STORE.remove(device, key);
    PROGRESS.forget(device, key);
}

/// Records a winner (and rewrites the file).
pub(super) fn store(device: &Device, key: &str, variant: &str, us: f64) {
    STORE.put(device, key, variant, us)
}

/// A winner as stored (and as reports print it): the variant's name, with `/k<splits>` when
/// split.
pub(crate) fn winner_tag(variant: &str, splits: u32) -> String {
    if splits > 1 {
        format!("{variant}/k{splits}")
    } else {
        variant.to_owned()
    }
}

/// The (variant, splits) a stored tag names.
pub(super) fn parse_tag(tag: &str) -> Option<(MatmulVariant, u32)> {
    let (name, splits) = match tag.split_once("/k") {
        Some((name, s)) => (name, s.parse().ok().filter(|&s| s > 1)?),
        None => (tag, 1),
    };
    Some((MatmulVariant::by_name(name)?, splits))
}
