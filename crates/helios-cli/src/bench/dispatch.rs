// `helios bench dispatch`: host overhead of tiny ops (1024 f32 elements), where the kernel
// itself is negligible and what is measured is recording, barriers, submission and waiting.
//
// Cases: `roundtrip` (one op and its read-back, per iteration), `chain_batched` (dependent ops
// in one batch), `chain_per_op_submit` (the same chain, one submit per op) and `independent`
// (ops on one input whose outputs are all kept alive, so the encoder needs no barrier).
// Every op is realised as it is built (`Tensor::realize`): this suite measures the engine
// node by node; `helios bench graph` measures the lazy graph's fused path.
// Key decision: each chain/independent sample is host wall time from the first op to the end
// of `synchronize`, divided by the op count, and the time until the last op *returned* is
// reported beside it as the recording cost, so one run shows whether the host keeps ahead of
// the GPU. Encoder counters (barriers, batches per sample) are recorded too: they prove the
// case measured what it claims (a chain has one barrier per op, independent ops none).

use std::hint::black_box;
use std::time::Instant;

use helios::{BinaryOp, Device, Tensor};
use serde::Serialize;

use super::stats::Summary;
use super::{gpu_mean_us, profile_start, random_values, summarize, BenchResult, CaseResult};

/// Elements per tensor: small enough that every kernel is a single short wave.
pub const ELEMENTS: usize = 1024;

/// The kernels the cases run (their names in HELIOS_PROFILE tables and the variant column):
/// one-node groups of the lazy graph.
fn kernel_name(_device: &Device, op: BinaryOp) -> String {
    format!("fused1_{}", op.name())
}

/// `op` realised at once (recorded, not waited for).
fn now(t: helios::Result<Tensor>) -> BenchResult<Tensor> {
    let t = t?;
    t.realize()?;
    Ok(t)
}

/// How much to run.
#[derive(Clone, Debug, Serialize)]
pub struct DispatchPlan {
    /// Ops per chain / independent sample.
    pub ops: usize,
    /// Samples of each chain / independent case.
    pub samples: usize,
    /// Iterations of the round trip (each one sample).
    pub roundtrip_iters: usize,
    /// Untimed repetitions before each case.
    pub warmup: usize,
}

/// Runs every dispatch case on `device`. The caller restores the batch limit.
pub fn run(device: &Device, plan: &DispatchPlan) -> BenchResult<Vec<CaseResult>> {
    let x = Tensor::from_slice(device, &random_values(ELEMENTS, 1), &[ELEMENTS])?;
    // One batch must hold a whole sample, with room to spare so that reaching the limit
    // never submits in the middle of the timed loop.
    let one_batch = u32::try_from(plan.ops + 64).unwrap_or(u32::MAX);
    Ok(vec![
        roundtrip(device, &x, plan)?,
        chain(device, &x, plan, "chain_batched", one_batch)?,
        chain(device, &x, plan, "chain_per_op_submit", 1)?,
        independent(device, &x, plan, one_batch)?,
    ])
}

/// `x.add_scalar(1)` then `to_vec()`: the latency a host sees for one small op.
fn roundtrip(device: &Device, x: &Tensor, plan: &DispatchPlan) -> BenchResult<CaseResult> {
    device.synchronize()?;
    for _ in 0..plan.warmup.max(1) * 10 {
        black_box(x.add_scalar(1.0)?.to_vec()?);
    }
    profile_start(device)?;
    let before = device.encoder_stats();
    let mut times = Vec::with_capacity(plan.roundtrip_iters);
    for _ in 0..plan.roundtrip_iters {
        let t0 = Instant::now();
        let v = x.add_scalar(1.0)?.to_vec()?;
        times.push(t0.elapsed().as_secs_f64() * 1e6);
        black_box(v);
    }
    let mut r = case(
        "roundtrip",
        format!(
            "{} + to_vec, batch<={}",
            kernel_name(device, BinaryOp::Add),
            batch_limit(device)
        ),
        1,
        summarize(&times, "roundtrip")?,
    );
    counters(&mut r, device, before, plan.roundtrip_iters);
    r.gpu_us = gpu_mean_us(device, &kernel_name(device, BinaryOp::Add))?;
    Ok(r)
}

/// `plan.ops` dependent `t = t * 1.0001`, submitted in batches of at most `limit`.
fn chain(
    device: &Device,
    x: &Tensor,
    plan: &DispatchPlan,
    name: &str,
    limit: u32,
) -> BenchResult<CaseResult> {
    device.set_batch_limit(limit);
    let sample = || -> BenchResult<(f64, f64)> {
        device.synchronize()?;
        let t0 = Instant::now();
        let mut t = x.clone();
        for _ in 0..plan.ops {
            t = now(t.mul_scalar(1.0001))?;
        }
        let recorded = t0.elapsed();
        device.synchronize()?;
        let total = t0.elapsed();
        drop(t);
        Ok((total.as_secs_f64(), recorded.as_secs_f64()))
    };
    for _ in 0..plan.warmup {
        sample()?;
    }
    profile_start(device)?;
    let before = device.encoder_stats();
    let (mut totals, mut records) = (Vec::new(), Vec::new());
    for _ in 0..plan.samples {
        let (total, recorded) = sample()?;
        totals.push(total * 1e6 / plan.ops as f64);
        records.push(recorded * 1e6 / plan.ops as f64);
    }
    let mut r = case(
        name,
        format!(
            "{} x{}, batch<={limit}",
            kernel_name(device, BinaryOp::Mul),
            plan.ops
        ),
        plan.ops,
        summarize(&totals, name)?,
    );
    r.record_us = Some(summarize(&records, name)?);
    counters(&mut r, device, before, plan.samples);
    r.gpu_us = gpu_mean_us(device, &kernel_name(device, BinaryOp::Mul))?;
    if r.gpu_us.is_none() && limit as usize >= plan.ops {
        r.gpu_us = Some(gpu_execution(device, plan, |_| {
            let mut t = x.clone();
            for _ in 0..plan.ops {
                t = now(t.mul_scalar(1.0001))?;
            }
            Ok(vec![t])
        })?);
    }
    Ok(r)
}

/// GPU time per op of `record`'s ops pre-recorded into one batch (early submits off), from
/// timestamps around them: the execution cost alone, without host recording (the figure
/// the raw-Vulkan probe of ANCHORS.md reports for independent dispatches). Median over the
/// samples.
fn gpu_execution(
    device: &Device,
    plan: &DispatchPlan,
    record: impl Fn(usize) -> BenchResult<Vec<Tensor>>,
) -> BenchResult<f64> {
    device.set_early_submit(false);
    let ctx = device.context();
    let mut per_op = Vec::with_capacity(plan.samples);
    let result = (|| -> BenchResult<()> {
        for i in 0..plan.samples + plan.warmup {
            device.synchronize()?;
            let timer = ctx.start_gpu_timer()?;
            let keep = record(i)?;
            let span = ctx.stop_gpu_timer(timer)?;
            let elapsed = ctx.gpu_elapsed(span)?;
            drop(keep);
            if i >= plan.warmup {
                per_op.push(elapsed.as_secs_f64() * 1e6 / plan.ops as f64);
            }
        }
        Ok(())
    })();
    device.set_early_submit(true);
    result?;
    Ok(summarize(&per_op, "gpu execution")?.median)
}

/// `plan.ops` independent `x + i`, every output kept until the sample ends (no reuse, so no
/// barrier), in one batch.
fn independent(
    device: &Device,
    x: &Tensor,
    plan: &DispatchPlan,
    limit: u32,
) -> BenchResult<CaseResult> {
    device.set_batch_limit(limit);
    let mut outs: Vec<Tensor> = Vec::with_capacity(plan.ops);
    let mut sample = || -> BenchResult<(f64, f64)> {
        device.synchronize()?;
        let t0 = Instant::now();
        for i in 0..plan.ops {
            outs.push(now(x.add_scalar(i as f32))?);
        }
        let recorded = t0.elapsed();
        device.synchronize()?;
        let total = t0.elapsed();
        // Freed after the batch completed: the next sample reuses this memory without a
        // hazard inside its own batch.
        outs.clear();
        Ok((total.as_secs_f64(), recorded.as_secs_f64()))
    };
    for _ in 0..plan.warmup {
        sample()?;
    }
    profile_start(device)?;
    let before = device.encoder_stats();
    let (mut totals, mut records) = (Vec::new(), Vec::new());
    for _ in 0..plan.samples {
        let (total, recorded) = sample()?;
        totals.push(total * 1e6 / plan.ops as f64);
        records.push(recorded * 1e6 / plan.ops as f64);
    }
    let mut r = case(
        "independent",
        format!(
            "{} x{}, outputs kept, batch<={limit}",
            kernel_name(device, BinaryOp::Add),
            plan.ops
        ),
        plan.ops,
        summarize(&totals, "independent")?,
    );
    r.record_us = Some(summarize(&records, "independent")?);
    counters(&mut r, device, before, plan.samples);
    r.gpu_us = gpu_mean_us(device, &kernel_name(device, BinaryOp::Add))?;
    if r.gpu_us.is_none() && limit as usize >= plan.ops {
        r.gpu_us = Some(gpu_execution(device, plan, |_| {
            (0..plan.ops).map(|i| now(x.add_scalar(i as f32))).collect()
        })?);
    }
    Ok(r)
}

fn case(name: &str, variant: String, ops_per_sample: usize, time: Summary) -> CaseResult {
    CaseResult::new(
        "dispatch",
        name,
        variant,
        "f32",
        ELEMENTS,
        ops_per_sample,
        time,
    )
}

fn batch_limit(device: &Device) -> u32 {
    device.context().batch_limit()
}

/// Fills the per-op barrier and per-sample batch counts from the encoder counters since
/// `before` (everything was synchronized, so all of it is counted).
fn counters(r: &mut CaseResult, device: &Device, before: helios_vk::EncoderStats, samples: usize) {
    let after = device.encoder_stats();
    let dispatches = after.dispatches.saturating_sub(before.dispatches);
    if dispatches > 0 {
        let barriers = after.barriers.saturating_sub(before.barriers);
        r.barriers_per_op = Some(barriers as f64 / dispatches as f64);
    }
    if samples > 0 {
        let batches = after.batches.saturating_sub(before.batches);
        r.batches_per_sample = Some(batches as f64 / samples as f64);
    }
}
