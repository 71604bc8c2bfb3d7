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

/// Whether `device` is past `warm`'s wait (its classes explore), without starting the wait.
pub(crate) fn exploring(device: &Device) -> bool {
    FIRST
        .locked()
        .iter()
        .any(|f| f.0 == device.id() && f.1.elapsed() >= WARM_AFTER)
}

/// See `warm`.
const WARM_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// Per device: when its first exploring call came (`warm`).
static FIRST: Mutex<Vec<(usize, std::time::Instant)>> = Mutex::new(Vec::new());

/// Forgets the device with `id` (going away): a later device at its address starts cold.
pub(crate) fn forget_device(id: usize) {
    FIRST.locked().retain(|f| f.0 != id);
    BUCKETS.locked().retain(|b| b.device != id);
}

/// Exploration's share of a device's time: the extra GPU work of exploring calls (shadows,
/// and attention's second incumbent run, and `PAIR_US` a pair) is paid from a bucket that
/// fills at this fraction of wall time, so that tuning on real work costs a bounded few
/// percent of a step however many classes explore at once; classes then settle over more
/// steps. 3% keeps a fresh GPT-2 run's first hundred steps within #46's 5% of settled ones
/// (bench/results/2026-11-30-session48-h200.md).
const BUDGET: f64 = 0.03;

/// What a pair costs beyond its runs' measured GPU time, µs, charged with each: fences drain
/// the GPU before and after both runs, and the real run loses its overlap with its
/// neighbours. Charging the runs alone let exploring cost well past the budget (same file).
const PAIR_US: f64 = 300.0;

/// The bucket's size, µs (and what it holds at first): enough for a few dozen pairs of
/// GPT-2's products at once, so that the first candidates are tried without delay.
const BURST_US: f64 = 20_000.0;

/// What a pair is guessed to cost before its class has measured one, µs.
pub(crate) const FIRST_ESTIMATE_US: f64 = 200.0;

struct Bucket {
    device: usize,
    tokens_us: f64,
    at: std::time::Instant,
}

/// Per device: exploration's time budget (`spend`).
static BUCKETS: Mutex<Vec<Bucket>> = Mutex::new(Vec::new());

/// Whether exploring on `device` may add about `estimate_us` of GPU work now; if so the
/// estimate is charged (`refund` corrects it once the work is measured).
pub(crate) fn spend(device: &Device, estimate_us: f64) -> bool {
    // CPU devices tune on real work only when asked (`HELIOS_MATMUL_TUNE=1`, the tests),
    // and then to converge, not to keep a step's time.
    if device.context().caps().device_type == helios_vk::DeviceType::Cpu {
        return true;
    }
    spend_at(
        device.id(),
        std::time::Instant::now(),
        estimate_us + PAIR_US,
    )
}

/// `spend` for the device with `id` at time `now`.
fn spend_at(id: usize, now: std::time::Instant, estimate_us: f64) -> bool {
    let mut buckets = BUCKETS.locked();
    let i = match buckets.iter().position(|b| b.device == id) {
        Some(i) => i,
        None => {
            buckets.push(Bucket {
                device: id,
                tokens_us: BURST_US,
                at: now,
            });
            buckets.len() - 1
        }
    };
    let b = &mut buckets[i];
    let earned = BUDGET * now.duration_since(b.at).as_secs_f64() * 1e6;
    b.tokens_us = (b.tokens_us + earned).min(BURST_US);
    b.at = now;
    if b.tokens_us < estimate_us.min(BURST_US) {
        return false;
    }
    b.tokens_us -= estimate_us;
    true
}

/// Gives back what `spend` charged beyond the measured cost (or charges the excess); an
/// `actual_us` of 0 means nothing ran, and the whole charge comes back.
pub(crate) fn refund(device: &Device, charged_us: f64, actual_us: f64) {
    if actual_us > 0.0 {
        let mut spent = SPENT.locked();
        spent.0 += 1;
        spent.1 += actual_us;
    }
    let overhead = if actual_us > 0.0 { PAIR_US } else { 0.0 };
    refund_id(device.id(), charged_us + PAIR_US, actual_us + overhead)
}

/// Pairs collected so far, all devices, and the GPU time their exploring runs measured, µs
/// (`exploration_spent`).
static SPENT: Mutex<(u64, f64)> = Mutex::new((0, 0.0));

/// Exploring pairs collected so far in this process and the GPU time their extra runs
/// measured, µs (the shadows, and attention's second incumbent run; the budget is charged
/// that and `PAIR_US` a pair).
pub fn exploration_spent() -> (u64, f64) {
    *SPENT.locked()
}

fn refund_id(id: usize, charged_us: f64, actual_us: f64) {
    if let Some(b) = BUCKETS.locked().iter_mut().find(|b| b.device == id) {
        b.tokens_us = (b.tokens_us + charged_us - actual_us).min(BURST_US);
    }
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

    /// Exploration spends its burst, then what 3% of wall time earns, corrected by what
    /// the work measured; a device has its own bucket.
    #[test]
    fn the_budget_bounds_exploration_to_a_share_of_wall_time() {
        let (id, other) = (usize::MAX - 7, usize::MAX - 8);
        let t0 = std::time::Instant::now();
        let granted = (0..1000).take_while(|_| spend_at(id, t0, 200.0)).count();
        assert_eq!(granted, (BURST_US / 200.0) as usize);
        assert!(
            spend_at(other, t0, 200.0),
            "another device has its own bucket"
        );
        // 0.1 s earns 3 ms: fifteen more pairs of 200 µs.
        let t1 = t0 + std::time::Duration::from_millis(100);
        let granted = (0..1000).take_while(|_| spend_at(id, t1, 200.0)).count();
        assert_eq!(granted, 15);
        // Those pairs measured 100 µs each: half comes back.
        for _ in 0..15 {
            refund_id(id, 200.0, 100.0);
        }
        let granted = (0..1000).take_while(|_| spend_at(id, t1, 200.0)).count();
        assert_eq!(granted, 7);
        // An hour idle fills the bucket, no more.
        let t2 = t1 + std::time::Duration::from_secs(3600);
        let granted = (0..1000).take_while(|_| spend_at(id, t2, 200.0)).count();
        assert_eq!(granted, (BURST_US / 200.0) as usize);
        forget_device(id);
        forget_device(other);
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
