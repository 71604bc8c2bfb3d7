//! The exhaustive attention tuner (`HELIOS_MATMUL_TUNE=full`, `Tensor::attention_tune`): a
//! class's candidates run and are checked against the default's outputs, then timed back to
//! back, before the call that asked returns.

use helios_kernels::attention::{AttnStage, AttnVariant};

use super::{bound, candidates, forced, rows, start_compile, store, Class};
use crate::cpu::attention::relative_error;
use crate::ops::attention::{AttentionGrads, AttentionOptions, AttentionOutput};
use crate::{Device, Result, Tensor};

/// Median per-call GPU µs of `run` (2 calls a sample, 3 samples; the correctness run
/// before it compiled the kernels).
fn time(device: &Device, run: &dyn Fn() -> Result<()>) -> Result<f64> {
    let ctx = device.context();
    let mut v = Vec::new();
    for _ in 0..3 {
        device.synchronize()?;
        let timer = ctx.start_gpu_timer()?;
        for _ in 0..2 {
            run()?;
        }
        let span = ctx.stop_gpu_timer(timer)?;
        v.push(ctx.gpu_elapsed(span)?.as_secs_f64() * 1e6 / 2.0);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[1])
}

/// Tunes `stage`: `run(opts)` records the call and returns the outputs the stage decides.
fn tune(
    q: &Tensor,
    stage: AttnStage,
    base: &AttentionOptions,
    run: &dyn Fn(&AttentionOptions) -> Result<Vec<Tensor>>,
) -> Result<()> {
    let device = q.device();
    let d = *q.shape().last().unwrap_or(&0);
    let class = Class::of(q.dtype().storage(), d, rows(q, d), stage, base);
    let key = class.name();
    let mut reference: Option<Vec<Vec<f32>>> = None;
    // The default's family: cooperative, or native (beside the cooperative Prep), else SIMT.
    let coop = q
        .attention_kernel_of(stage, base)?
        .is_some_and(|k| k.variant.is_coop() || k.variant.is_native());
    let forced: Vec<(AttnVariant, AttentionOptions)> = candidates(device, stage, coop)
        .into_iter()
        .map(|v| (v, forced(base, stage, v)))
        .collect();
    // The candidates' pipelines first, several at once (`Device::precompile`; native ones
    // through the driver's deferred JIT); one that cannot be chosen here is left to the
    // loop below, which skips it.
    let kernels: Vec<helios_kernels::attention::AttentionKernel> = forced
        .iter()
        .filter_map(|(_, o)| q.attention_kernel_of(stage, o).ok().flatten())
        .collect();
    for &k in kernels.iter().filter(|k| k.variant.is_native()) {
        start_compile(device, k, false)?;
    }
    device.precompile(
        kernels
            .into_iter()
            .filter(|k| !k.variant.is_native())
            .map(|k| (crate::device::KernelKey::Attention(k), move || k.build()))
            .collect(),
    )?;
    // First every candidate once (checking it against the first), then, with the GPU's
    // clock raised, the timings back to back: compiles leave the GPU idle long enough for
    // NVIDIA's driver to drop the clock, which once inflated some classes' times 5× and
    // could have picked a winner by when it ran rather than how fast.
    let mut valid: Vec<(AttnVariant, AttentionOptions)> = Vec::new();
    for (v, o) in forced {
        // A variant that cannot run here (shared memory, no cooperative matrices) is skipped.
        let Ok(outs) = run(&o) else { continue };
        let got: Vec<Vec<f32>> = outs.iter().map(|t| t.to_vec()).collect::<Result<_>>()?;
        match &reference {
            None => reference = Some(got),
            Some(r) => {
                let err = r
                    .iter()
                    .zip(&got)
                    .map(|(a, b)| relative_error(b, a))
                    .fold(0.0, f64::max);
                if err.is_nan() || err > bound(q.dtype()) {
                    if crate::env::verbose() {
                        eprintln!(
                            "helios: attention tuning {key}: {} rejected (error {err:.2e})",
                            v.tag()
                        );
                    }
                    continue;
                }
            }
        }
        valid.push((v, o));
    }
    let mut best: Option<(AttnVariant, f64)> = None;
    if let Some((_, o)) = valid.first() {
        // Several calls per wait: sustained load is what raises the clock.
        device.warm_up(|| {
            for _ in 0..4 {
                run(o)?;
            }
            device.synchronize()
        })?;
    }
    // Three rounds that take every candidate in turn, each candidate's time its median: a
    // clock change during one candidate's samples cannot crown it.
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(3); valid.len()];
    for _ in 0..3 {
        for ((_, o), s) in valid.iter().zip(&mut samples) {
            s.push(time(device, &|| run(o).map(drop))?);
        }
    }
    for ((v, _), mut s) in valid.iter().zip(samples) {
        s.sort_by(f64::total_cmp);
        let us = s[1];
        if crate::env::verbose() {
            eprintln!("helios: attention tuning {key}: {} {us:.1} µs", v.tag());
        }
        if best.map_or(true, |(_, b)| us < b) {
            best = Some((*v, us));
        }
    }
    if let Some((v, us)) = best {
        store(device, class, &v.tag(), us);
    }
    Ok(())
}

pub(crate) fn tune_forward(q: &Tensor, k: &Tensor, v: &Tensor, o: &AttentionOptions) -> Result<()> {
    tune(q, AttnStage::Forward, o, &|o| {
        let f = q.attention(k, v, o)?;
        Ok(vec![f.out, f.lse])
    })
}

pub(crate) fn tune_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    fwd: &AttentionOutput,
    dout: &Tensor,
    o: &AttentionOptions,
) -> Result<()> {
    let grads = |o: &AttentionOptions| -> Result<AttentionGrads> {
        q.attention_backward(k, v, fwd, dout, o)
    };
    tune(q, AttnStage::DkDv, o, &|o| {
        let g = grads(o)?;
        Ok(vec![g.dk, g.dv])
    })?;
    tune(q, AttnStage::Dq, o, &|o| Ok(vec![grads(o)?.dq]))
}
