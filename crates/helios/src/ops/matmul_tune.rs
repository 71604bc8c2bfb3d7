//! Which matmul kernel runs: the one selection function of the family, the autotuner behind
//! it, its on-disk cache, and the cooperative-matrix peak microbenchmark.
//!
//! Order of precedence (`choose`): a variant forced by the caller (`MatmulOptions::variant`),
//! then `HELIOS_MATMUL_VARIANT=<name>`, then the tuned winner for the problem's shape class,
//! then (on GPUs, unless `HELIOS_MATMUL_TUNE=0`) tuning now, else the documented default
//! (`helios_kernels::matmul::default_variant`). Key decision: a candidate may win only after
//! it passed a correctness check against the f64 CPU reference on fresh random inputs; then
//! it is timed with GPU timestamps on the caller's own operands. Winners persist in
//! `<cache root>/matmul/<device uuid>-<driver version>-<features>.tsv` (one `variant  µs
//! class` line per class), so tuning happens once per device, driver and set of enabled
//! kernel features, and a new driver retunes.

use std::sync::Mutex;

use helios_kernels::matmul::{candidates, default_variant};
use helios_kernels::{MatmulCaps, MatmulKernel, MatmulVariant, Storage, WgSupport};
use helios_vk::DeviceType;
use rand::{Rng, SeedableRng};

use super::matmul::{Plan, Problem};
use crate::cpu::matmul::{matmul as reference, relative_error, tolerance, MatmulRef};
use crate::realize_lock::LockExt;
use crate::{DType, Device, Error, Result, Tensor};

/// How a kernel was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// `MatmulOptions::variant`.
    Forced,
    /// `HELIOS_MATMUL_VARIANT`.
    Env,
    /// A winner tuned earlier (this process or the cache file).
    Cached,
    /// Tuned just now.
    Tuned,
    /// `default_variant` (tuning off or not worth it on this device).
    Default,
}

impl Choice {
    pub const fn name(self) -> &'static str {
        match self {
            Choice::Forced => "forced",
            Choice::Env => "env",
            Choice::Cached => "cached",
            Choice::Tuned => "tuned",
            Choice::Default => "default",
        }
    }
}

/// The device properties matmul selection needs.
pub fn matmul_caps(device: &Device) -> MatmulCaps {
    let ctx = device.context();
    let caps = ctx.caps();
    let en = ctx.enabled();
    let fixed_subgroup = match (caps.subgroup.min_size, caps.subgroup.max_size) {
        (Some(lo), Some(hi)) => lo == hi,
        _ => true,
    };
    let coop_ok = en.cooperative_matrix && en.vulkan_memory_model && fixed_subgroup;
    let has = |t: &str| {
        caps.cooperative_matrix.iter().any(|s| {
            (s.m, s.n, s.k) == (16, 16, 16)
                && s.a == t
                && s.b == t
                && s.c == "f32"
                && s.result == "f32"
                && s.scope == "subgroup"
        })
    };
    let coop_f16 = coop_ok && en.shader_float16 && has("f16");
    let coop_bf16 = coop_ok && en.bfloat16_cooperative_matrix && has("bf16");
    let coop_wg = match &caps.cooperative_matrix2 {
        Some(c2) if en.cooperative_matrix_workgroup_scope => c2
            .flexible
            .iter()
            .filter(|s| s.scope == "workgroup" && s.a == s.b && s.c == "f32" && s.result == "f32")
            .filter_map(|s| {
                let input = match s.a.as_str() {
                    "f16" if coop_f16 => Storage::F16,
                    "bf16" if coop_bf16 => Storage::BF16,
                    _ => return None,
                };
                Some(WgSupport {
                    input,
                    invocations: s.workgroup_invocations,
                    granularity: [s.m_granularity, s.n_granularity, s.k_granularity],
                    max_dimension: c2.max_dimension,
                })
            })
            .collect(),
        _ => Vec::new(),
    };
    MatmulCaps {
        max_shared_bytes: caps.limits.max_compute_shared_memory,
        max_invocations: caps.limits.max_workgroup_invocations,
        subgroup: caps.subgroup.size,
        coop_f16,
        coop_bf16,
        coop_wg,
        coop_wg_tensor: en.cooperative_matrix_tensor_addressing,
        cpu_threads: (caps.device_type == DeviceType::Cpu).then(host_threads),
        native: device.native_target(),
    }
}

/// How many threads lavapipe runs workgroups on: one per core unless `LP_NUM_THREADS` says
/// otherwise. Read once per process: `matmul_caps` is asked per op (attention's selection),
/// and finding the core count reads cgroup files on Linux.
fn host_threads() -> u32 {
    static THREADS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::env::var("LP_NUM_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32))
    })
}

fn invalid(detail: String) -> Error {
    Error::Invalid {
        op: "matmul",
        detail,
    }
}

/// `HELIOS_MATMUL_VARIANT`: a variant name from `helios_kernels::matmul::VARIANTS`, or a
/// cooperative tile outside it in the same grammar (`MatmulVariant::parse`).
fn env_variant() -> Result<Option<MatmulVariant>> {
    // Read once per process (it is asked on every matmul).
    static NAME: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let Some(name) = NAME.get_or_init(|| std::env::var("HELIOS_MATMUL_VARIANT").ok()) else {
        return Ok(None);
    };
    let name = name.trim();
    if name.is_empty() {
        return Ok(None);
    }
    MatmulVariant::parse(name).map(Some).ok_or_else(|| {
        let names: Vec<&str> = helios_kernels::matmul::VARIANTS
            .iter()
            .map(|(n, _)| *n)
            .collect();
        invalid(format!(
            "HELIOS_MATMUL_VARIANT={name:?} names no variant; use one of {}, or a \
             cooperative tile {}",
            names.join(", "),
            MatmulVariant::COOP_GRAMMAR
        ))
    })
}

/// Whether `choose` may tune: on GPUs by default (`HELIOS_MATMUL_TUNE=0` turns it off,
/// `=1` on for CPU devices too, where timing is slow and means little).
fn tuning_enabled(device: &Device) -> bool {
    match std::env::var("HELIOS_MATMUL_TUNE")
        .as_deref()
        .map(str::trim)
    {
        Ok("0") => false,
        Ok("1") => true,
        _ => device.context().caps().device_type != DeviceType::Cpu,
    }
}

/// The family's one selection function (see the module docs for the order).
pub(crate) fn choose(p: &Problem) -> Result<(Plan, Choice)> {
    let device = p.a.device();
    let forced = match p.forced {
        Some(v) => Some((v, Choice::Forced)),
        None => env_variant()?.map(|v| (v, Choice::Env)),
    };
    if forced.is_some() {
        return choose_uncached(p, forced);
    }
    // A training loop asks the same few hundred questions every step: remember the answers
    // (the class key is a formatted string, the store a locked map of strings).
    let key: MemoKey = (
        device.id(),
        device.binding(),
        p.input,
        p.out,
        p.trans,
        p.shape,
        p.epilogue,
        p.triangle,
    );
    if let Some(&hit) = memo().locked().get(&key) {
        return Ok(hit);
    }
    let chosen = choose_uncached(p, None)?;
    memo().locked().insert(key, chosen);
    Ok(chosen)
}

/// (device, binding, input, output, transposes, shape, epilogue, triangle) of a matmul
/// problem.
type MemoKey = (
    usize,
    helios_spirv::Binding,
    DType,
    DType,
    (bool, bool),
    helios_kernels::MatmulShape,
    helios_kernels::Epilogue,
    helios_kernels::Triangle,
);

fn memo() -> &'static Mutex<rustc_hash::FxHashMap<MemoKey, (Plan, Choice)>> {
    static MEMO: std::sync::OnceLock<Mutex<rustc_hash::FxHashMap<MemoKey, (Plan, Choice)>>> =
        std::sync::OnceLock::new();
    MEMO.get_or_init(Default::default)
}

/// Drops the remembered choices of the device with `id` (it is going away).
pub(crate) fn forget_device(id: usize) {
    memo().locked().retain(|k, _| k.0 != id);
}

fn choose_uncached(p: &Problem, forced: Option<(MatmulVariant, Choice)>) -> Result<(Plan, Choice)> {
    let unsplit = |kernel: MatmulKernel| Plan { kernel, splits: 1 };
    let device = p.a.device();
    let caps = matmul_caps(device);
    if let Some((v, how)) = forced {
        let k = p.kernel(v, caps.subgroup);
        if !k.feasible(&caps) {
            return Err(invalid(format!(
                "variant {} cannot run here ({} inputs, {} on {}): it needs more shared \
                 memory or invocations than the device has, or cooperative-matrix support",
                v.label(),
                p.input,
                if p.trans.0 || p.trans.1 {
                    "transposed operands"
                } else {
                    "row-major operands"
                },
                device.name()
            )));
        }
        if !k.fits(&p.shape) {
            return Err(invalid(format!(
                "variant {} needs M, N and K to be multiples of its tile ({:?}); \
                 this product is {}x{}x{}: pick another variant or pad the operands",
                v.label(),
                v,
                p.shape.m,
                p.shape.n,
                p.shape.k
            )));
        }
        let splits = match (how, p.forced_splits) {
            (Choice::Forced, Some(s)) if s > 1 => {
                if p.split(v, s, caps.subgroup).is_none() {
                    return Err(invalid(format!(
                        "this product cannot be split {s} ways: split-K needs one unbatched \
                         product without bias, activation or residual, and k ({}) cut into \
                         {s} equal multiples of 8 that the variant's tile divides",
                        p.shape.k
                    )));
                }
                s
            }
            _ => 1,
        };
        return Ok((Plan { kernel: k, splits }, how));
    }
    let key = class_key(p);
    if let Some((v, splits)) = cached(device, &key) {
        let k = p.kernel(v, caps.subgroup);
        let split_ok = splits == 1 || p.split(v, splits, caps.subgroup).is_some();
        if k.feasible(&caps) && k.fits(&p.shape) && split_ok {
            return Ok((Plan { kernel: k, splits }, Choice::Cached));
        }
    }
    let default = || {
        let d = default_variant(
            p.input.storage(),
            p.out.storage(),
            p.trans,
            &p.shape,
            p.epilogue,
            &caps,
        );
        p.kernel(d.variant, caps.subgroup)
    };
    let s = &p.shape;
    // Nothing to tune where there is no product to time.
    if !tuning_enabled(device) || s.m == 0 || s.n == 0 || s.k == 0 || s.batch == 0 {
        return Ok((unsplit(default()), Choice::Default));
    }
    let report = tune(p)?;
    match report.winner.and_then(MatmulVariant::by_name) {
        Some(v) => Ok((
            Plan {
                kernel: p.kernel(v, caps.subgroup),
                splits: report.winner_splits,
            },
            Choice::Tuned,
        )),
        None => Ok((unsplit(default()), Choice::Default)),
    }
}

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
        p.epilogue.bias as u8,
        p.epilogue.act,
        p.epilogue.residual as u8,
    ) + match p.epilogue.row {
        // (Classes without a row op keep the keys stored before row ops existed.)
        helios_kernels::RowOp::None => "",
        helios_kernels::RowOp::Exp => " rexp",
        helios_kernels::RowOp::SoftmaxGrad => " rsmgrad",
    }
}

// ------------------------------------------------------------------ the tuner

/// One candidate's outcome.
#[derive(Clone, Debug)]
pub struct CandidateResult {
    pub variant: &'static str,
    /// k split into this many products (1: the plain kernel; see `MatmulOptions::splits`).
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
    pub fn matmul_tune(&self, other: &Tensor, opts: &super::MatmulOptions) -> Result<TuneReport> {
        let p = Problem::new(self, other, opts)?;
        tune(&p)
    }
}

/// `HELIOS_TUNE_TRACE=1`: each step of a class's tuning as it starts (where a tuning stalls).
fn trace(what: std::fmt::Arguments) {
    if std::env::var_os("HELIOS_TUNE_TRACE").is_some() {
        eprintln!("helios: matmul tuning: {what}");
    }
}

fn tune(p: &Problem) -> Result<TuneReport> {
    let device = p.a.device();
    let started = std::time::Instant::now();
    let compile_s = || device.context().pipeline_stats().total_create_seconds;
    let compile_start = compile_s();
    let caps = matmul_caps(device);
    let key = class_key(p);
    let mut rows = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let all = candidates_of(p, &caps);
    // FMA kernels cannot beat the matrix units on large products: where cooperative
    // candidates exist, timing SIMT ones there would only lengthen tuning.
    let large = p.shape.flops() >= f64::from(1u32 << 30);
    let has_coop = all.iter().any(|k| k.variant.is_coop());
    let kernels: Vec<MatmulKernel> = all
        .into_iter()
        .filter(|k| k.variant.is_coop() || !(has_coop && large))
        .map(|cand| p.kernel(cand.variant, caps.subgroup))
        .filter(|k| k.feasible(&caps) && seen.insert(*k))
        .collect();
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
    // Split-K with the plain kernels within `SPLIT_BASE_SLACK` of the best (at most
    // `SPLIT_BASES`), where k is long enough for each part to keep the kernel's pipeline busy
    // (≥ 512), the product is large enough to be worth a second pass over an M×N f32
    // workspace per part, and that workspace stays small. Not the best alone: that is often
    // a small tile that fills the GPU, and a larger tile split over k can beat it (on an
    // H100, gpt2_fc_dw: simt64x32d2 582 µs, simt128x64d2 644, simt128x64d2 in four parts
    // 469).
    let mut ranked: Vec<(&'static str, f64)> = rows
        .iter()
        .filter_map(|r| r.time_us.map(|t| (r.variant, t)))
        .collect();
    ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
    let fastest = ranked.first().map_or(0.0, |r| r.1);
    let splittable: Vec<(MatmulVariant, u32, MatmulKernel)> = ranked
        .iter()
        .take_while(|r| r.1 <= fastest * SPLIT_BASE_SLACK)
        .take(SPLIT_BASES)
        .map(|&(v, _)| MatmulVariant::by_name(v).expect("a table variant"))
        .flat_map(|v| SPLITS.iter().map(move |&splits| (v, splits)))
        .filter_map(|(v, splits)| {
            let (sub, k) = p.split(v, splits, caps.subgroup)?;
            let workspace = 4 * u64::from(splits) * u64::from(sub.m) * u64::from(sub.n);
            let worth = sub.k >= 512
                && k.feasible(&caps)
                && p.shape.flops() >= 1e9
                && workspace <= MAX_SPLIT_WORKSPACE;
            worth.then_some((v, splits, k))
        })
        .collect();
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
    if std::env::var("HELIOS_VERBOSE").as_deref() == Ok("1") {
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
fn precompile(device: &Device, kernels: &[MatmulKernel]) -> Result<()> {
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

/// The k splits the tuner tries after the plain kernels.
const SPLITS: [u32; 3] = [2, 3, 4];

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
fn parse_tag(tag: &str) -> Option<(MatmulVariant, u32)> {
    let (name, splits) = match tag.split_once("/k") {
        Some((name, s)) => (name, s.parse().ok().filter(|&s| s > 1)?),
        None => (tag, 1),
    };
    Some((MatmulVariant::by_name(name)?, splits))
}

/// Runs `kernel` on a small problem of the same form (dtypes, transposes, epilogue, batch
/// handling; sizes capped at 160×160×96 and 2 batches, which keeps every alignment the
/// kernel assumes; a kernel that needs whole tiles gets whole tiles, at least one) with fresh
/// random inputs and returns its relative error.
fn check(p: &Problem, plan: &Plan) -> Result<f64> {
    // A row op (attention's softmax steps) reads buffers this check does not make: it checks
    // the tile's product alone, which is what candidates differ in.
    let epilogue = match p.epilogue.row {
        helios_kernels::RowOp::None => p.epilogue,
        _ => helios_kernels::Epilogue::NONE,
    };
    let kernel = &MatmulKernel {
        epilogue,
        ..plan.kernel
    };
    let device = p.a.device();
    let s = &p.shape;
    let batch = s.batch.min(2) as usize;
    let tiles = match kernel.variant {
        MatmulVariant::Wg(t) => Some([u32::from(t.bm), u32::from(t.bn), u32::from(t.bk)]),
        _ => None,
    };
    let size = |i: usize, full: u32, cap: u32| -> usize {
        let v = match tiles {
            // `full` is a multiple of the tile (the kernel fits the problem).
            Some(t) => t[i] * (full / t[i]).clamp(1, (cap / t[i]).max(1)),
            None => full.min(cap),
        };
        v as usize
    };
    let (m, n, kk) = (size(0, s.m, 160), size(1, s.n, 160), size(2, s.k, 96));
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6d61_746d ^ (m * 7919 + n * 31 + kk) as u64);
    let mut rand_vec = |len: usize, dt: DType| -> Vec<f32> {
        (0..len)
            .map(|_| dt.round(rng.gen_range(-1.0f32..1.0)))
            .collect()
    };
    let a_host = rand_vec(batch * m * kk, p.input);
    let b_batches = if s.stride_b == 0 { 1 } else { batch };
    let b_host = rand_vec(b_batches * kk * n, p.input);
    let bias_host = epilogue.bias.then(|| rand_vec(n, p.out));
    let res_host = epilogue.residual.then(|| rand_vec(batch * m * n, p.out));

    // Upload in the stored orientation, then view as the logical operand.
    let a_t = upload_operand(device, &a_host, Some(batch), m, kk, p.trans.0, p.input)?;
    // A single B matrix is passed 2-D (broadcast over the batch), as the caller's was.
    let b_dims = (b_batches > 1 || batch == 1).then_some(b_batches);
    let b_t = upload_operand(device, &b_host, b_dims, kk, n, p.trans.1, p.input)?;
    let bias_t = match &bias_host {
        Some(h) => Some(Tensor::from_slice_as(device, h, &[n], p.out)?),
        None => None,
    };
    let res_t = match &res_host {
        Some(h) => Some(Tensor::from_slice_as(device, h, &[batch, m, n], p.out)?),
        None => None,
    };
    let opts = super::MatmulOptions {
        alpha: p.alpha,
        bias: bias_t.as_ref(),
        act: epilogue.act,
        residual: res_t.as_ref(),
        act_grad: epilogue.act_grad,
        out: Some(p.out),
        variant: Some(kernel.variant),
        splits: None,
    };
    let mut small = Problem::new(&a_t, &b_t, &opts)?;
    if kernel.epilogue.store_pre {
        small.pre = Some(small.output()?);
    }
    let mut k = *kernel;
    // The check's operands are dense and full: it checks the tile's arithmetic, and a
    // triangle's skipped parts would not match the full reference.
    k.triangle = helios_kernels::Triangle::Full;
    // The small problem's views are dense: any vector access the kernel assumes is valid.
    k.vec_a &= small.kernel(k.variant, k.subgroup).vec_a;
    k.vec_b &= small.kernel(k.variant, k.subgroup).vec_b;
    k.vec_c &= small.kernel(k.variant, k.subgroup).vec_c;
    k.exact_k &= small.kernel(k.variant, k.subgroup).exact_k;
    let out = small.run(&Plan {
        kernel: k,
        splits: plan.splits,
    })?;
    let got = out.to_vec()?;
    let want = reference(
        &a_host,
        &b_host,
        &MatmulRef {
            batch,
            m,
            n,
            k: kk,
            alpha: p.alpha,
            bias: bias_host.as_deref(),
            act: epilogue.act,
            residual: res_host.as_deref(),
            act_grad: epilogue.act_grad,
        },
    );
    Ok(relative_error(&got, &want))
}

/// A `(batch, rows, cols)` operand (`(rows, cols)` when `batch` is `None`) from row-major
/// host values, stored transposed (and viewed back) when `trans`.
fn upload_operand(
    device: &Device,
    host: &[f32],
    batch: Option<usize>,
    rows: usize,
    cols: usize,
    trans: bool,
    dtype: DType,
) -> Result<Tensor> {
    let lead: Vec<usize> = batch.into_iter().collect();
    let nd = lead.len();
    let batch = batch.unwrap_or(1);
    if !trans {
        return Tensor::from_slice_as(device, host, &[&lead[..], &[rows, cols]].concat(), dtype);
    }
    let mut t = vec![0f32; host.len()];
    for b in 0..batch {
        for r in 0..rows {
            for c in 0..cols {
                t[(b * cols + c) * rows + r] = host[(b * rows + r) * cols + c];
            }
        }
    }
    Tensor::from_slice_as(device, &t, &[&lead[..], &[cols, rows]].concat(), dtype)?
        .transpose(nd, nd + 1)
}

/// Per-run GPU time of `reps` back-to-back runs of `kernel` into `out`, µs.
fn sample(p: &Problem, kernel: &MatmulKernel, out: &Tensor, reps: u32) -> Result<f64> {
    let ctx = p.a.device().context();
    let t = ctx.start_gpu_timer()?;
    for _ in 0..reps {
        p.record(kernel, out)?;
    }
    let span = ctx.stop_gpu_timer(t)?;
    Ok(ctx.gpu_elapsed(span)?.as_secs_f64() * 1e6 / f64::from(reps))
}

/// One run of `plan` per rep (a split plan's sum pass included), µs per run.
fn sample_plan(p: &Problem, plan: &Plan, reps: u32) -> Result<f64> {
    let ctx = p.a.device().context();
    let t = ctx.start_gpu_timer()?;
    for _ in 0..reps {
        p.run(plan)?.realize()?;
    }
    let span = ctx.stop_gpu_timer(t)?;
    Ok(ctx.gpu_elapsed(span)?.as_secs_f64() * 1e6 / f64::from(reps))
}

/// A candidate to time: `sample(reps)` records `reps` back-to-back runs and returns the GPU
/// time per run in µs.
struct Sampler<'a> {
    max_reps: u32,
    sample: Box<dyn Fn(u32) -> Result<f64> + 'a>,
}

/// Each candidate's median time per run, µs, in `candidates`' order (`None` where there is
/// no candidate: one that failed its check).
///
/// In this order:
/// 1. One run of every candidate, which compiles it. The correctness check does not always
///    compile the kernel that is timed (exact k follows the shape), and with a cold driver
///    cache a class's compiles took 3 s, long enough for the GPU's clock to fall.
/// 2. A warm-up ([`Device::warm_up`]) with the first candidate, to raise the clock.
/// 3. Back-to-back runs per sample so that a sample lasts ~2 ms (at most `max_reps`).
/// 4. Three rounds that take every candidate in turn; a candidate's time is its median. A
///    clock dip during one candidate's samples then cannot crown it (on an H100 a bias
///    product once went to simt64x64d2 at 1079 µs over simt128x64d2, which runs it in 798).
///
/// Before step 1 came first, a cold-cache tuning timed a GPT-2 class at 345 MHz and gave
/// its forward product to coop32x64 (259 µs) over coop128x256 (152).
fn time_candidates(device: &Device, candidates: &[Option<Sampler>]) -> Result<Vec<Option<f64>>> {
    let live = || candidates.iter().flatten();
    let Some(first) = live().next() else {
        return Ok(vec![None; candidates.len()]);
    };
    for (i, c) in live().enumerate() {
        trace(format_args!("first run of timed candidate {i}"));
        (c.sample)(1)?;
    }
    trace(format_args!("warm-up"));
    device.warm_up(|| (first.sample)(4.min(first.max_reps)).map(drop))?;
    let mut reps = Vec::with_capacity(candidates.len());
    for c in live() {
        let once = (c.sample)(1)?;
        reps.push(if once > 0.0 {
            (2000.0 / once).ceil().clamp(1.0, f64::from(c.max_reps)) as u32
        } else {
            c.max_reps
        });
    }
    trace(format_args!("reps {reps:?}"));
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(3); reps.len()];
    for round in 0..3 {
        trace(format_args!("round {round}"));
        for ((c, &r), s) in live().zip(&reps).zip(&mut samples) {
            s.push((c.sample)(r)?);
        }
    }
    let mut medians = samples.into_iter().map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[1]
    });
    Ok(candidates
        .iter()
        .map(|c| c.as_ref().and_then(|_| medians.next()))
        .collect())
}

// ------------------------------------------------------------------ the cache

/// Matmul winners per device (`<cache root>/matmul/<device>.tsv`). Version 2: the
/// cooperative kernels' loads changed (unmasked, read-only path) and one-stage tiles came in.
/// Version 3: the tuner compiles every candidate before its warm-up; earlier stores can hold
/// winners timed at the idle clock. Version 4: every cooperative tile's epilogue goes through
/// shared memory (11–31% faster on GPT-2's shapes on an H100) and three tiles joined the
/// table; earlier winners were ranked under the old epilogue and never saw the new tiles.
static STORE: super::tuning_store::TuningStore =
    super::tuning_store::TuningStore::new("matmul", 4, |v| parse_tag(v).is_some());

fn cached(device: &Device, key: &str) -> Option<(MatmulVariant, u32)> {
    STORE.get(device, key).and_then(|v| parse_tag(&v))
}

/// Records a winner (and rewrites the file).
fn store(device: &Device, key: &str, variant: &str, us: f64) {
    STORE.put(device, key, variant, us)
}

// ------------------------------------------------------------------ peak microbenchmark

/// The cooperative-matrix instruction's throughput alone.
#[derive(Clone, Debug)]
pub struct CoopPeak {
    pub kernel: String,
    pub tflops: f64,
    pub time_us: f64,
}

/// Measures `CoopPeakKernel` for `dtype` (f16 or bf16): `None` where the device has no such
/// fragments. Launches enough workgroups to fill any GPU several times over.
pub fn coop_peak(device: &Device, dtype: DType) -> Result<Option<CoopPeak>> {
    let caps = matmul_caps(device);
    let ok = match dtype {
        DType::F16 => caps.coop_f16,
        DType::BF16 => caps.coop_bf16,
        DType::F32 => false,
    };
    if !ok {
        return Ok(None);
    }
    let kernel = helios_kernels::CoopPeakKernel {
        input: dtype.storage(),
        frags: 4,
        subgroups: 4,
        subgroup: caps.subgroup,
    };
    let groups = 132 * 16;
    let iters = 4096u32;
    let a = Tensor::from_slice_as(
        device,
        &(0..2 * 4 * 256)
            .map(|i| (i % 7) as f32 * 0.125)
            .collect::<Vec<_>>(),
        &[2 * 4 * 256],
        dtype,
    )?;
    let c = Tensor::empty(
        device,
        &[(groups * kernel.subgroups * 16 * 256) as usize],
        DType::F32,
    )?;
    let compiled = device.kernel(crate::device::KernelKey::CoopPeak(kernel), || {
        kernel.build()
    })?;
    let push = helios_kernels::pack_push(
        &compiled.module.name,
        &compiled.module.params,
        compiled.module.push_size,
        &[
            helios_kernels::Arg::Address(a.address()?),
            helios_kernels::Arg::Address(c.address()?),
            helios_kernels::Arg::U32(iters),
        ],
    )?;
    let ctx = device.context();
    let run = || -> Result<()> {
        ctx.dispatch(
            &compiled.pipeline,
            [groups, 1, 1],
            &push,
            &[
                helios_vk::Access::read(a.buffer()?),
                helios_vk::Access::write(c.buffer()?),
            ],
        )?;
        Ok(())
    };
    run()?;
    device.warm_up(|| {
        run()?;
        device.synchronize()
    })?;
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = ctx.start_gpu_timer()?;
        run()?;
        let span = ctx.stop_gpu_timer(t)?;
        times.push(ctx.gpu_elapsed(span)?.as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let secs = times[2];
    Ok(Some(CoopPeak {
        kernel: kernel.name(),
        tflops: kernel.flops(groups, iters) / secs / 1e12,
        time_us: secs * 1e6,
    }))
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// `precompile` creates each distinct kernel's pipeline once, on several threads, and
    /// the `kernel` lookups that follow find them (no build, no further pipeline).
    #[test]
    fn precompiled_kernels_are_found_afterwards() {
        let device = Device::from_env().expect("a Vulkan device");
        let a = Tensor::from_slice(&device, &[0.5f32; 96 * 80], &[96, 80]).expect("a");
        let b = Tensor::from_slice(&device, &[0.25f32; 80 * 72], &[80, 72]).expect("b");
        let p = Problem::new(&a, &b, &super::super::MatmulOptions::default()).expect("problem");
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

    /// Every candidate runs once (its compile) before any is timed, the reps per sample
    /// follow each one's time, and a candidate that failed its check keeps its place.
    #[test]
    fn candidates_compile_first_and_keep_their_places() {
        let device = Device::from_env().expect("a Vulkan device");
        let calls = RefCell::new(Vec::new());
        let sampler = |id: u32, us: f64| {
            let calls = &calls;
            Some(Sampler {
                max_reps: 4,
                sample: Box::new(move |reps| {
                    calls.borrow_mut().push((id, reps));
                    Ok(us)
                }),
            })
        };
        let candidates = [None, sampler(1, 5.0), None, sampler(3, 3000.0)];
        let times = time_candidates(&device, &candidates).expect("timed");
        assert_eq!(times, [None, Some(5.0), None, Some(3000.0)]);
        let warm = calls.borrow().len() - 10;
        let calls = calls.borrow();
        assert_eq!(calls[..2], [(1, 1), (3, 1)], "compiles first");
        assert!(calls[2..2 + warm].iter().all(|&c| c == (1, 4)), "warm-up");
        let timed = &calls[2 + warm..];
        assert_eq!(
            timed[..2],
            [(1, 1), (3, 1)],
            "one run each to size the samples"
        );
        // 5 µs runs fill a 2 ms sample only at 400 reps (capped at 4); 3 ms ones need 1.
        assert_eq!(timed[2..], [(1, 4), (3, 1), (1, 4), (3, 1), (1, 4), (3, 1)]);
    }
}
