//! The tuner proper: a shape class's candidates, each checked and then timed, the split-K
//! variants of the fastest, and the report of every candidate.

use helios_kernels::matmul::candidates;
use helios_kernels::{MatmulCaps, MatmulKernel, MatmulVariant};

use super::cache::{class_key, store, winner_tag};
use super::caps::matmul_caps;
use super::check::check;
use super::timing::{sample, sample_plan, time_candidates, trace, Sampler};
use crate::cpu::matmul::tolerance;
use crate::ops::matmul::{Plan, Problem};
use crate::{Device, Result, Tensor};

/// One candidate's outcome.
#[derive(Clone, Debug)]
pub struct CandidateResult {
    pub variant: &'static str,
    /// k split into this many products (1: the plain kernel; see `MatmulOverrides::splits`).
    pub splits: u32,
    pub kernel: String,
    /// Relative error of the correctness check (NaN if it could not run).
    pub check_error: f64,
    pub passed: bool,
    /// Median GPU time on the problem, µs (only for candidates that passed).
    pub time_us: Option<f64>,
}

/// What tuning one shape class found.
#[derive(Clone, Debug)]
pub struct TuneReport {
    pub class: String,
    pub winner: Option<&'static str>,
    /// The winner's k split (1: none).
    pub winner_splits: u32,
    pub candidates: Vec<CandidateResult>,
}

impl Tensor {
    /// Tunes the matmul of `self · other` with `opts` now (even if a winner is cached), stores
    /// the winner, and reports every candidate.
    pub fn matmul_tune(
        &self,
        other: &Tensor,
        opts: &crate::ops::MatmulOptions,
    ) -> Result<TuneReport> {
        let p = Problem::new(self, other, &opts.into())?;
        tune(&p)
    }
}

pub(super) fn tune(p: &Problem) -> Result<TuneReport> {
    let device = p.a.device();
    let started = std::time::Instant::now();
    let compile_s = || device.context().pipeline_stats().total_create_seconds;
    let compile_start = compile_s();
    let caps = matmul_caps(device);
    let key = class_key(p);
    let mut rows = Vec::new();
    let kernels = timed_candidates(p);
    // Every candidate compiled up front, in parallel (the checks of aligned shapes mostly
    // run these same kernels).
    precompile(device, &kernels)?;
    let mut checked = Vec::new();
    for k in kernels {
        trace(format_args!("{key}: checking {}", k.name()));
        // A candidate that cannot run the check loses (NaN fails the tolerance); it does
        // not end the tuning.
        let check_error = check(
            p,
            &Plan {
                kernel: k,
                splits: 1,
            },
        )
        .unwrap_or(f64::NAN);
        let passed = check_error <= tolerance(p.out);
        checked.push((k, check_error, passed));
    }
    let checked_at = started.elapsed().as_secs_f64();
    let out = p.output()?;
    let samplers: Vec<Option<Sampler>> = checked
        .iter()
        .map(|&(k, _, passed)| {
            let out = &out;
            passed.then(|| Sampler {
                max_reps: 50,
                sample: Box::new(move |r| sample(p, &k, out, r)),
            })
        })
        .collect();
    let samples = time_candidates(device, &samplers)?;
    drop(samplers);
    for ((k, check_error, passed), time_us) in checked.into_iter().zip(samples) {
        rows.push(CandidateResult {
            variant: k.variant.name(),
            splits: 1,
            kernel: k.name(),
            check_error,
            passed,
            time_us,
        });
    }
    let best = |rows: &[CandidateResult]| {
        rows.iter()
            .filter_map(|r| r.time_us.map(|t| (r.variant, r.splits, t)))
            .min_by(|a, b| a.2.total_cmp(&b.2))
    };
    let mut ranked: Vec<(MatmulVariant, f64)> = rows
        .iter()
        .filter_map(|r| Some((MatmulVariant::by_name(r.variant)?, r.time_us?)))
        .collect();
    ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
    let splittable = split_candidates(p, &ranked);
    let split_kernels: Vec<MatmulKernel> = splittable.iter().map(|s| s.2).collect();
    precompile(device, &split_kernels)?;
    let mut split_rows = Vec::new();
    for (v, splits, k) in splittable {
        let plan = Plan {
            kernel: p.kernel(v, caps.subgroup),
            splits,
        };
        trace(format_args!("{key}: checking {} split {splits}", k.name()));
        let check_error = check(p, &plan).unwrap_or(f64::NAN);
        let passed = check_error <= tolerance(p.out);
        split_rows.push((plan, k.name(), check_error, passed));
    }
    // Timed like the plain kernels, after their own compiles and warm-up. A split plan
    // writes fresh tensors each run, as a caller's would: at most 8 runs per sample, since
    // each holds its own workspace until the GPU is done and the pool keeps what it held.
    let samplers: Vec<Option<Sampler>> = split_rows
        .iter()
        .map(|&(plan, _, _, passed)| {
            passed.then(|| Sampler {
                max_reps: 8,
                sample: Box::new(move |r| sample_plan(p, &plan, r)),
            })
        })
        .collect();
    let times = time_candidates(device, &samplers)?;
    drop(samplers);
    for ((plan, kernel, check_error, passed), time_us) in split_rows.into_iter().zip(times) {
        rows.push(CandidateResult {
            variant: plan.kernel.variant.name(),
            splits: plan.splits,
            kernel,
            check_error,
            passed,
            time_us,
        });
    }
    let winner = best(&rows);
    if crate::env::verbose() {
        // Where a class's tuning time goes (a fresh machine's first step is mostly this).
        eprintln!(
            "helios: matmul tuning {key}: {:.1} s in all, {:.1} s to the end of the checks, \
             {:.1} s creating pipelines",
            started.elapsed().as_secs_f64(),
            checked_at,
            compile_s() - compile_start
        );
        for r in &rows {
            let time = r
                .time_us
                .map_or("failed its check".into(), |t| format!("{t:.1} µs"));
            eprintln!(
                "helios: matmul tuning {key} ({}x{}x{}): {} {time} (error {:.1e})",
                p.shape.m,
                p.shape.n,
                p.shape.k,
                r.label(),
                r.check_error
            );
        }
    }
    if let Some((v, splits, t)) = winner {
        store(device, &key, &winner_tag(v, splits), t);
    }
    Ok(TuneReport {
        class: key,
        winner: winner.map(|w| w.0),
        winner_splits: winner.map_or(1, |w| w.1),
        candidates: rows,
    })
}

/// The kernels a class times for `p`: the table's that fit and can run here, each once.
/// FMA kernels cannot beat the matrix units on large products: where cooperative
/// candidates exist, timing SIMT ones there would only lengthen tuning. (Native kernels run
/// on the matrix units too: they stay.)
pub(super) fn timed_candidates(p: &Problem) -> Vec<MatmulKernel> {
    let caps = matmul_caps(p.a.device());
    let all = candidates_of(p, &caps);
    let large = p.shape.flops() >= f64::from(1u32 << 30);
    let has_coop = all.iter().any(|k| k.variant.is_coop());
    let fma = |v: MatmulVariant| matches!(v, MatmulVariant::Simt(_));
    let mut seen = std::collections::HashSet::new();
    all.into_iter()
        .filter(|k| !(fma(k.variant) && has_coop && large))
        .map(|cand| p.kernel(cand.variant, caps.subgroup))
        .filter(|k| k.feasible(&caps) && seen.insert(*k))
        .collect()
}

/// The split-K plans worth timing after the plain kernels `ranked` (variant, µs; fastest
/// first): those within `SPLIT_BASE_SLACK` of the fastest (at most `SPLIT_BASES`) and every
/// native one, split
/// where k is long enough for each part to keep the kernel's pipeline busy (≥ 512), the
/// product is large enough to be worth a second pass over an M×N f32 workspace per part,
/// and that workspace stays small. Not the fastest alone: that is often a small tile that
/// fills the GPU, and a larger tile split over k can beat it (an H100 example in
/// bench/results/source-comment-history.md).
pub(super) fn split_candidates(
    p: &Problem,
    ranked: &[(MatmulVariant, f64)],
) -> Vec<(MatmulVariant, u32, MatmulKernel)> {
    let caps = matmul_caps(p.a.device());
    let fastest = ranked.first().map_or(0.0, |r| r.1);
    let mut bases: Vec<MatmulVariant> = ranked
        .iter()
        .take_while(|r| r.1 <= fastest * SPLIT_BASE_SLACK)
        .take(SPLIT_BASES)
        .map(|r| r.0)
        .collect();
    // Native kernels whatever their plain time: too few output tiles is what makes them
    // slow, and what their split fixes (768 × 768 × 8192: 24 tiles on 132 SMs).
    for &(v, _) in ranked {
        if v.is_native() && !bases.contains(&v) {
            bases.push(v);
        }
    }
    bases
        .into_iter()
        .flat_map(|v| {
            let filling = filling_split(p, v);
            SPLITS
                .iter()
                .copied()
                .chain(filling.filter(|s| !SPLITS.contains(s)))
                .map(move |splits| (v, splits))
        })
        .filter_map(|(v, splits)| {
            let (sub, k) = p.split(v, splits, caps.subgroup)?;
            let workspace = 4 * u64::from(splits) * u64::from(sub.m) * u64::from(sub.n);
            let worth = sub.k / sub.k_parts >= 512
                && k.feasible(&caps)
                && p.shape.flops() >= 1e9
                && workspace <= MAX_SPLIT_WORKSPACE;
            worth.then_some((v, splits, k))
        })
        .collect()
}

/// The table's kernels that fit `p` on a device with `caps`.
fn candidates_of(p: &Problem, caps: &MatmulCaps) -> Vec<MatmulKernel> {
    candidates(
        p.input.storage(),
        p.out.storage(),
        p.trans,
        &p.shape,
        p.epilogue,
        caps,
    )
}

/// Compiles `kernels` several at once ([`Device::precompile`], and the driver's JIT for
/// the native ones).
pub(super) fn precompile(device: &Device, kernels: &[MatmulKernel]) -> Result<()> {
    use crate::device::KernelKey;
    let (native, spirv): (Vec<MatmulKernel>, Vec<MatmulKernel>) =
        kernels.iter().partition(|k| k.variant.is_native());
    device.precompile(
        spirv
            .into_iter()
            .map(|k| (KernelKey::Matmul(k), move || k.build()))
            .collect(),
    )?;
    if let Some(target) = device.native_target() {
        device.precompile_native(
            native
                .into_iter()
                .map(|k| {
                    let build = move || Ok(k.build_native(target)?);
                    (KernelKey::Matmul(k), build)
                })
                .collect(),
        )?;
    }
    Ok(())
}

/// The k splits the tuner tries after the plain kernels (and, for native kernels, the one of
/// `filling_split`).
const SPLITS: [u32; 3] = [2, 3, 4];

/// For a native kernel, which splits k in any number of parts: the fewest parts (2 to 16)
/// whose tiles fill at least 95% of the last round over the device's SMs, where the known
/// splits leave rounds part idle (GPT-2's weight gradients: 36 to 96 output tiles on 132
/// SMs). `None` for other kernels or where the SM count is unknown.
pub(crate) fn filling_split(p: &Problem, v: MatmulVariant) -> Option<u32> {
    let sms = p.a.device().context().caps().sm_count.filter(|&n| n > 0)?;
    if !v.is_native() {
        return None;
    }
    let (bm, bn) = v.tile();
    let s = &p.shape;
    let tiles = u64::from(s.m.div_ceil(bm)) * u64::from(s.n.div_ceil(bn));
    fill_parts(tiles, u64::from(sms))
}

/// The fewest parts, 2 to 16, that make `tiles · parts` at least 95% of whole rounds over
/// `sms`.
fn fill_parts(tiles: u64, sms: u64) -> Option<u32> {
    (2..=16u32).find(|&parts| {
        let work = tiles * u64::from(parts);
        let rounds = work.div_ceil(sms);
        100 * work >= 95 * rounds * sms
    })
}

/// The plain kernels the tuner also tries split over k: at most this many of the fastest,
/// each within `SPLIT_BASE_SLACK` times the fastest one's time.
const SPLIT_BASES: usize = 4;
const SPLIT_BASE_SLACK: f64 = 1.25;

/// Largest f32 workspace (bytes) a split product may use: the sum pass costs a read of it,
/// and the tuner holds up to 8 at once while timing.
const MAX_SPLIT_WORKSPACE: u64 = 256 << 20;

impl CandidateResult {
    /// The variant's name, with `/k<splits>` when k is split.
    pub fn label(&self) -> String {
        winner_tag(self.variant, self.splits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2's weight gradients on 132 SMs: 36 tiles (256 × 192) take 7 parts (252 of 264
    /// slots), 72 (128 × 192) take 7 too, 96 take 4; a product that fills the SMs anyway
    /// takes 2 (its rounds stay whole), and a tiny one none within 16.
    #[test]
    fn the_filling_split_fills_the_last_round() {
        assert_eq!(fill_parts(36, 132), Some(7));
        assert_eq!(fill_parts(72, 132), Some(7));
        assert_eq!(fill_parts(96, 132), Some(4));
        assert_eq!(fill_parts(264, 132), Some(2));
        assert_eq!(fill_parts(1, 132), None);
    }

    /// `precompile` creates each distinct kernel's pipeline once, on several threads, and
    /// the `kernel` lookups that follow find them (no build, no further pipeline).
    #[test]
    fn precompiled_kernels_are_found_afterwards() {
        let device = Device::from_env().expect("a Vulkan device");
        let a = Tensor::from_slice(&device, &[0.5f32; 96 * 80], &[96, 80]).expect("a");
        let b = Tensor::from_slice(&device, &[0.25f32; 80 * 72], &[80, 72]).expect("b");
        let p = Problem::new(&a, &b, &crate::ops::MatmulSpec::default()).expect("problem");
        let caps = matmul_caps(&device);
        let mut kernels: Vec<MatmulKernel> = candidates_of(&p, &caps)
            .into_iter()
            .map(|c| p.kernel(c.variant, caps.subgroup))
            .filter(|k| k.feasible(&caps))
            .take(4)
            .collect();
        assert!(kernels.len() >= 2, "lavapipe has SIMT candidates");
        let distinct = kernels
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len() as u64;
        kernels.push(kernels[0]);
        let created = || device.context().pipeline_stats().pipelines_created;
        let before = created();
        precompile(&device, &kernels).expect("compiled");
        assert_eq!(
            created() - before,
            distinct,
            "one pipeline per distinct kernel"
        );
        for k in &kernels {
            device
                .kernel(crate::device::KernelKey::Matmul(*k), || {
                    panic!("{} was not precompiled", k.name())
                })
                .expect("cached");
        }
        assert_eq!(created() - before, distinct, "nothing compiled twice");
        let messages = device.validation_messages();
        assert!(messages.is_empty(), "validation: {messages:?}");
    }
}
