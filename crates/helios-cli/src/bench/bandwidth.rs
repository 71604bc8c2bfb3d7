// `helios bench bandwidth`: memory-bound element-wise kernels against the compute-shader copy,
// the ceiling any of them can reach on a device.
//
// Methodology: warm up, then pick K (ops per sample) so a sample lasts about the target time;
// every sample records K back-to-back ops in one batch, dropping each output at once so its
// memory is reused by the next op (as a training step does), then synchronizes; the per-op
// time is wall / K. Inputs are random (never zeros) and rotate over enough distinct tensors
// (`ROTATE_BYTES` of inputs in all) that the L2 cache cannot serve small cases from a
// previous op; `bench/torch_reference.py` rotates the same way.
// Effective bandwidth counts bytes read plus bytes written: 2·n·size for copy and exp, 3·n·size
// for add; "% copy" compares with the copy of the same dtype and size measured in this run.

use helios::{DType, Device, Tensor};
use serde::Serialize;

use super::{gpu_mean_us, profile_start, random_values, summarize, BenchResult, CaseResult};

/// Input bytes the rotation spans: several times the L2 of current GPUs (50 MiB on an H200).
pub const ROTATE_BYTES: usize = 256 << 20;
/// At most this many input sets, whatever the size.
const MAX_ROTATION: usize = 32;

/// How much to run.
#[derive(Clone, Debug, Serialize)]
pub struct BandwidthPlan {
    /// Elements per tensor, one group of cases per size.
    pub sizes: Vec<usize>,
    pub dtypes: Vec<&'static str>,
    /// Timed samples per case.
    pub samples: usize,
    /// Wall time one sample aims for, in µs (K is chosen from a calibration run).
    pub target_sample_us: f64,
    /// Upper bound on K.
    pub max_ops_per_sample: usize,
}

/// The operations measured, in the order they run (copy first: the others are compared
/// with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Copy,
    Add,
    Exp,
}

impl Op {
    pub const ALL: [Op; 3] = [Op::Copy, Op::Add, Op::Exp];

    pub const fn name(self) -> &'static str {
        match self {
            Op::Copy => "copy",
            Op::Add => "add",
            Op::Exp => "exp",
        }
    }

    const fn inputs(self) -> usize {
        match self {
            Op::Add => 2,
            Op::Copy | Op::Exp => 1,
        }
    }

    /// The element-wise operation this case runs.
    /// Bytes moved per element: inputs read plus the output written.
    const fn bytes_per_element(self, dtype: DType) -> usize {
        (self.inputs() + 1) * dtype.size()
    }

    /// The op, recorded at once (a one-node group of the lazy graph).
    fn apply(self, inputs: &[Tensor]) -> helios::Result<Tensor> {
        let t = match self {
            Op::Copy => inputs[0].copy(),
            Op::Add => inputs[0].add(&inputs[1]),
            Op::Exp => inputs[0].exp(),
        }?;
        t.realize()?;
        Ok(t)
    }
}

pub fn parse_dtype(name: &str) -> Option<DType> {
    match name {
        "f32" => Some(DType::F32),
        "f16" => Some(DType::F16),
        "bf16" => Some(DType::BF16),
        _ => None,
    }
}

/// Runs every (size, dtype, op) case on `device`. The caller restores the batch limit.
pub fn run(device: &Device, plan: &BandwidthPlan) -> BenchResult<Vec<CaseResult>> {
    let mut results = Vec::new();
    for &n in &plan.sizes {
        for &dtype_name in &plan.dtypes {
            let dtype = parse_dtype(dtype_name)
                .ok_or_else(|| format!("unknown dtype {dtype_name:?}; use f32, f16 or bf16"))?;
            let mut copy_gbps = None;
            for op in Op::ALL {
                eprintln!("bench: bandwidth {} {dtype} n={n}", op.name());
                let mut r = run_case(device, plan, op, dtype, n)?;
                if op == Op::Copy {
                    copy_gbps = r.gbps;
                }
                r.pct_of_copy = match (r.gbps, copy_gbps) {
                    (Some(g), Some(c)) if c > 0.0 => Some(100.0 * g / c),
                    _ => None,
                };
                results.push(r);
            }
        }
    }
    Ok(results)
}

fn run_case(
    device: &Device,
    plan: &BandwidthPlan,
    op: Op,
    dtype: DType,
    n: usize,
) -> BenchResult<CaseResult> {
    let sets = input_sets(device, op, dtype, n)?;
    let bytes = (op.bytes_per_element(dtype) * n) as u64;

    // Warm-up compiles the kernel and fills the pool; calibration then sizes K twice, since
    // the first, short probe overstates the per-op time by the submit-and-wait latency.
    sample(device, op, &sets, 2)?;
    let mut k = 4.min(plan.max_ops_per_sample).max(1);
    for _ in 0..2 {
        let per_op_us = sample(device, op, &sets, k)?;
        k = if per_op_us > 0.0 {
            (plan.target_sample_us / per_op_us).ceil() as usize
        } else {
            plan.max_ops_per_sample
        }
        .clamp(1, plan.max_ops_per_sample.max(1));
    }

    device.warm_up(|| sample(device, op, &sets, k).map(drop))?;
    profile_start(device)?;
    let before = device.encoder_stats();
    let mut times = Vec::with_capacity(plan.samples);
    for _ in 0..plan.samples {
        times.push(sample(device, op, &sets, k)?);
    }
    let after = device.encoder_stats();

    let name = op.name();
    // A one-node group of the lazy graph.
    let kernel = format!("fused1_{name}");
    let gpu_us = gpu_mean_us(device, &kernel)?;
    let time = summarize(&times, name)?;
    let mut r = CaseResult::new(
        "bandwidth",
        name,
        format!("{kernel}, K={k}, {} input sets", sets.len()),
        dtype.name(),
        n,
        k,
        time,
    );
    r.bytes_per_op = Some(bytes);
    r.gpu_us = gpu_us;
    r.gbps = (time.median > 0.0).then(|| bytes as f64 / (time.median * 1e-6) / 1e9);
    let dispatches = after.dispatches.saturating_sub(before.dispatches);
    if dispatches > 0 {
        r.barriers_per_op =
            Some(after.barriers.saturating_sub(before.barriers) as f64 / dispatches as f64);
    }
    if plan.samples > 0 {
        r.batches_per_sample =
            Some(after.batches.saturating_sub(before.batches) as f64 / plan.samples as f64);
    }
    Ok(r)
}

/// Distinct random input tensors, `op.inputs()` per set, enough sets to span `ROTATE_BYTES`.
/// One host array per input position is uploaded into every set: contents repeat, but each
/// set is its own memory, which is what defeats the cache.
fn input_sets(device: &Device, op: Op, dtype: DType, n: usize) -> BenchResult<Vec<Vec<Tensor>>> {
    let set_bytes = (op.inputs() * n * dtype.size()).max(1);
    let count = ROTATE_BYTES.div_ceil(set_bytes).clamp(1, MAX_ROTATION);
    let host: Vec<Vec<f32>> = (0..op.inputs())
        .map(|i| random_values(n, 0x5eed + i as u64))
        .collect();
    let mut sets = Vec::with_capacity(count);
    for _ in 0..count {
        let set = host
            .iter()
            .map(|h| Tensor::from_slice_as(device, h, &[n], dtype))
            .collect::<helios::Result<Vec<_>>>()?;
        sets.push(set);
    }
    device.synchronize()?;
    Ok(sets)
}

/// `k` ops back to back in one batch; returns µs per op (host wall over the whole sample).
/// Per-op time of `k` back-to-back ops, from GPU timestamps around them (what CUDA events
/// measure for the PyTorch figures: first op's start to last op's end, without the host's
/// submit and wake-up latency).
fn sample(device: &Device, op: Op, sets: &[Vec<Tensor>], k: usize) -> BenchResult<f64> {
    device.set_batch_limit(u32::try_from(k + 64).unwrap_or(u32::MAX));
    device.synchronize()?;
    let ctx = device.context();
    let timer = ctx.start_gpu_timer()?;
    for i in 0..k {
        // The output is dropped here, so the next op writes the same memory: one barrier per
        // op, as in a training step that frees activations as it goes.
        drop(op.apply(&sets[i % sets.len()])?);
    }
    let span = ctx.stop_gpu_timer(timer)?;
    let elapsed = ctx.gpu_elapsed(span)?;
    Ok(elapsed.as_secs_f64() * 1e6 / k as f64)
}
