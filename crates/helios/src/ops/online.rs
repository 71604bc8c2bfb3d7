//! What both online tuners (matmul's `explore`, attention's) share: comparing a candidate's
//! results with the incumbent's from bytes copied aside on the GPU, and their statistics.

use helios_vk::{Context, GpuSpan};

use crate::realize_lock::LockExt;
use crate::{DType, Device, Result};
use std::sync::Mutex;

/// Runs `work` (which records GPU work) between two timestamps in one command buffer, fenced
/// off from what is recorded before and after so that neither overlaps it; the span is read later, when done
/// (`Context::gpu_elapsed_if_done`). `work`'s own error comes back inside.
pub(crate) fn fenced<T>(
    ctx: &Context,
    work: impl FnOnce() -> Result<T>,
) -> Result<(Result<T>, GpuSpan)> {
    let hold = ctx.hold_submits();
    ctx.full_barrier()?;
    let timer = ctx.start_gpu_timer()?;
    let out = work();
    let span = ctx.stop_gpu_timer(timer)?;
    ctx.full_barrier()?;
    drop(hold);
    Ok((out, span))
}

/// Which output row a compared stretch of bytes holds: its index within its matrix (for a
/// triangle the kernel leaves partly unwritten) and its length in elements.
#[derive(Clone, Copy)]
pub(crate) struct RowSample {
    pub(crate) row: u32,
    pub(crate) len: u32,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Match,
    Differ,
    Inconclusive,
}

/// Whether the candidate's values `b` match the incumbent's `a` (both `out` elements as
/// stored, `rows` after one another): their relative L2 distance within `bound`. Only the
/// first `row + 1` elements of a row count (above the diagonal of a lower-triangular product
/// neither kernel wrote anything; `u32::MAX` for whole rows).
pub(crate) fn compare(a: &[u8], b: &[u8], rows: &[RowSample], out: DType, bound: f64) -> Verdict {
    let (a, b) = (out.decode(a), out.decode(b));
    let (mut diff, mut norm, mut at) = (0f64, 0f64, 0usize);
    for r in rows {
        let len = r.len as usize;
        let kept = len.min(r.row.saturating_add(1) as usize);
        for i in at..at + kept {
            let (x, y) = (f64::from(a[i]), f64::from(b[i]));
            if !x.is_finite() {
                return Verdict::Inconclusive;
            }
            diff += (x - y) * (x - y);
            norm += x * x;
        }
        at += len;
    }
    let err = (diff / norm.max(f64::MIN_POSITIVE)).sqrt();
    if err.is_nan() || err > bound {
        Verdict::Differ
    } else {
        Verdict::Match
    }
}

/// Whether this device's GPU has been at work long enough for its clock to have risen
/// (`WARM_AFTER` since its first exploring call): NVIDIA's driver raises it only after
/// some tenths of a second of load (bench/results/2026-11-22-clocks-h200.md), and the
/// first steps of a program also wait for compiles. Timing before that ranks candidates by
/// when they ran. (On CPU devices there is no clock to wait for.)
pub(crate) fn warm(device: &Device) -> bool {
    if device.context().caps().device_type == helios_vk::DeviceType::Cpu {
        return true;
    }
    let mut first = FIRST.locked();
    let since = match first.iter().find(|f| f.0 == device.id()) {
        Some(f) => f.1,
        None => {
            first.push((device.id(), std::time::Instant::now()));
            return false;
        }
    };
    since.elapsed() >= WARM_AFTER
}

/// See `warm`.
const WARM_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// Per device: when its first exploring call came (`warm`).
static FIRST: Mutex<Vec<(usize, std::time::Instant)>> = Mutex::new(Vec::new());

/// Forgets the device with `id` (going away): a later device at its address starts cold.
pub(crate) fn forget_device(id: usize) {
    FIRST.locked().retain(|f| f.0 != id);
}

/// Per-device tuning for the unit tests, which share one process and its environment
/// (matmul's `tuning` and attention's `mode` read it first).
#[cfg(test)]
pub(crate) static TEST_TUNING: Mutex<Vec<(usize, crate::ops::Tuning)>> = Mutex::new(Vec::new());

#[cfg(test)]
pub(crate) fn test_tuning(device: &Device) -> Option<crate::ops::Tuning> {
    TEST_TUNING
        .locked()
        .iter()
        .find(|(id, _)| *id == device.id())
        .map(|t| t.1)
}

/// The median of `v` (the upper one of an even count), infinity when empty.
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::INFINITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[f32]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    /// Rows that agree within the dtype's bound match, rows off by more differ, a NaN in the
    /// candidate differs, and an infinity in the incumbent's proves nothing.
    #[test]
    fn comparison_bounds() {
        let rows = [RowSample {
            row: u32::MAX,
            len: 4,
        }];
        let a = [1.0f32, -2.0, 3.0, 0.5];
        let near: Vec<f32> = a.iter().map(|x| x * (1.0 + 1e-6)).collect();
        assert_eq!(
            compare(&bytes(&a), &bytes(&near), &rows, DType::F32, 1e-4),
            Verdict::Match
        );
        let far = [1.0f32, -2.0, 3.1, 0.5];
        assert_eq!(
            compare(&bytes(&a), &bytes(&far), &rows, DType::F32, 1e-4),
            Verdict::Differ
        );
        let nan = [1.0f32, f32::NAN, 3.0, 0.5];
        assert_eq!(
            compare(&bytes(&a), &bytes(&nan), &rows, DType::F32, 1e-4),
            Verdict::Differ
        );
        let inf = [1.0f32, f32::INFINITY, 3.0, 0.5];
        assert_eq!(
            compare(&bytes(&inf), &bytes(&a), &rows, DType::F32, 1e-4),
            Verdict::Inconclusive
        );
    }

    /// Above the diagonal of a `LowerC` product nothing is compared (neither kernel wrote it).
    #[test]
    fn lower_triangle_compares_its_part() {
        let rows = [RowSample { row: 0, len: 3 }, RowSample { row: 1, len: 3 }];
        let a = [1.0f32, 7.0, 7.0, 2.0, 3.0, 7.0];
        let b = [1.0f32, -9.0, 5.0, 2.0, 3.0, 0.0];
        assert_eq!(
            compare(&bytes(&a), &bytes(&b), &rows, DType::F32, 1e-4),
            Verdict::Match
        );
        let wrong = [1.0f32, -9.0, 5.0, 2.5, 3.0, 0.0];
        assert_eq!(
            compare(&bytes(&a), &bytes(&wrong), &rows, DType::F32, 1e-4),
            Verdict::Differ
        );
    }
}
