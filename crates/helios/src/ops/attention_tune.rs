//! Block-size autotuning of the attention kernels per (device, dtype, head dim, stage, mask,
//! size: the query rows B·T·H to a power of two, which sets how the grid fills the GPU).
//!
//! The one decision a reader must know: tuning times whole calls on the caller's own
//! operands, forcing one stage's variant at a time (`AttentionOptions::stage_variant`); the
//! other stages run their usual kernels, a constant that cannot change the winner. A
//! candidate may win only if its outputs agree with the default kernel's within four times
//! the tests' bound for the dtype. It runs on the first forward (Forward stage) or backward
//! (DkDv and Dq) of a class on a GPU, unless `HELIOS_ATTN_TUNE=0` (`=1` tunes on CPU devices
//! too). Winners persist in `<cache root>/attention/<device uuid>-<driver>-<features>.tsv`, one
//! `variant  µs  class` line each, as the matmul tuner's do.

use helios_kernels::attention::{
    default_order, AttnStage, AttnVariant, COOP_VARIANTS, SIMT_VARIANTS,
};
use helios_kernels::Storage;
use helios_vk::DeviceType;

use super::attention::{AttentionGrads, AttentionOptions, AttentionOutput};
use crate::cpu::attention::relative_error;
use crate::realize_lock::LockExt;
use crate::{DType, Device, Result, Tensor};

/// The class a winner applies to: (storage, head dim, stage, causal, key lengths, size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Class {
    storage: Storage,
    d: usize,
    stage: AttnStage,
    causal: bool,
    padded: bool,
    /// log2 of the query rows (B·T·H) rounded up to a power of two: the grid's size, which
    /// decides how many waves of workgroups a tile makes (GPT-2's 8×12 heads at T = 512
    /// fill 1.45 waves of an H100 with 128-row tiles).
    rows: u32,
}

impl Class {
    /// The class of a call with `rows` query rows (B·T·H) of head dim `d`.
    pub(crate) fn of(
        storage: Storage,
        d: usize,
        rows: usize,
        stage: AttnStage,
        o: &AttentionOptions,
    ) -> Class {
        Class {
            storage,
            d,
            stage,
            causal: o.causal,
            padded: o.key_lengths.is_some(),
            rows: rows.max(1).next_power_of_two().trailing_zeros(),
        }
    }

    /// As the store's files name it: "bf16 d64 Forward causal1 pad0 rows2^16".
    fn name(&self) -> String {
        format!(
            "{} d{} {:?} causal{} pad{} rows2^{}",
            self.storage.name(),
            self.d,
            self.stage,
            self.causal as u8,
            self.padded as u8,
            self.rows
        )
    }
}

/// The query rows (B·T·H) of `q`, a (B, T, H, D) view.
fn rows(q: &Tensor, d: usize) -> usize {
    q.len() / d.max(1)
}

/// Whether attention tuning is on: `HELIOS_ATTN_TUNE`, else on GPUs.
fn enabled(device: &Device) -> bool {
    crate::env::attention_tune()
        .unwrap_or_else(|| device.context().caps().device_type != DeviceType::Cpu)
}

/// Whether a call should tune `stages` first: tuning on, nothing forced, some stage's class
/// without a winner.
pub(crate) fn wanted(q: &Tensor, d: usize, stages: &[AttnStage], o: &AttentionOptions) -> bool {
    let dev = q.device();
    o.variant.is_none()
        && o.stage_variant.is_none()
        && !super::attention::forced_by_env()
        && enabled(dev)
        && stages
            .iter()
            .any(|&s| cached(dev, Class::of(q.dtype().storage(), d, rows(q, d), s, o)).is_none())
}

/// The variants worth trying for `stage`, the default order first: the cooperative family
/// where the default is cooperative (SIMT tiles are far slower there), else SIMT.
fn candidates(stage: AttnStage, coop: bool) -> Vec<AttnVariant> {
    let mut v: Vec<AttnVariant> = default_order(stage, coop, false)
        .into_iter()
        .filter(|x| x.is_coop() == coop)
        .collect();
    let family = if coop {
        &COOP_VARIANTS[..]
    } else {
        &SIMT_VARIANTS[..]
    };
    for &x in family {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

fn bound(dtype: DType) -> f64 {
    4.0 * match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 6e-3,
        DType::BF16 => 4e-2,
    }
}

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
    let coop = q.attention_kernel(stage, base)?.contains("coop");
    let forced: Vec<(AttnVariant, AttentionOptions)> = candidates(stage, coop)
        .into_iter()
        .map(|v| {
            let o = AttentionOptions {
                stage_variant: Some((stage, v)),
                ..base.clone()
            };
            (v, o)
        })
        .collect();
    // The candidates' pipelines first, several at once (`Device::precompile`); one that
    // cannot be chosen here is left to the loop below, which skips it.
    device.precompile(
        forced
            .iter()
            .filter_map(|(_, o)| q.attention_kernel_of(stage, o).ok().flatten())
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

// ------------------------------------------------------------------ the cache

/// Attention winners per device (`<cache root>/attention/<device>.tsv`). Version 2: the
/// forward is software-pipelined where it fits, and row-tile pairs joined its candidates.
static STORE: super::tuning_store::TuningStore =
    super::tuning_store::TuningStore::new("attention", 2, |v| AttnVariant::by_name(v).is_some());

/// The tuned variant for `class` on this device, if any. Every attention call asks, so the
/// answer is remembered per device (`Device::attention_winners`) until a winner is stored.
pub(crate) fn cached(device: &Device, class: Class) -> Option<AttnVariant> {
    let memo = device.attention_winners();
    if let Some(&v) = memo.locked().get(&class) {
        return v;
    }
    let v = STORE
        .get(device, &class.name())
        .and_then(|v| AttnVariant::by_name(&v));
    memo.locked().insert(class, v);
    v
}

/// Every winner known for this device: (class, variant, µs), sorted.
pub fn attention_tuning(device: &Device) -> Vec<(String, String, f64)> {
    STORE.all(device)
}

fn store(device: &Device, class: Class, variant: &str, us: f64) {
    STORE.put(device, &class.name(), variant, us);
    device.attention_winners().locked().remove(&class);
}

impl Tensor {
    /// Tunes every stage of attention of queries `self` with `k`, `v` (and `dout` for the
    /// backward stages) now, even where winners are cached or tuning is off, and stores the
    /// winners (see [`attention_tuning`]).
    pub fn attention_tune(
        &self,
        k: &Tensor,
        v: &Tensor,
        dout: &Tensor,
        opts: &AttentionOptions,
    ) -> Result<()> {
        tune_forward(self, k, v, opts)?;
        let fwd = self.attention(k, v, opts)?;
        tune_backward(self, k, v, &fwd, dout, opts)
    }
}
