//! Block-size tuning of the attention kernels per (device, dtype, head dim, stage, mask,
//! size: the query rows B·T·H to a power of two, which sets how the grid fills the GPU).
//!
//! The one decision a reader must know: tuning times whole calls on the caller's own
//! operands, forcing one stage's variant at a time (`AttentionOptions::stage_variant`); the
//! other stages run their usual kernels, a constant that cannot change the winner. On GPUs a
//! class is tuned on real work (`explore`): after each real call, the default's stage and
//! one candidate's run side by side, timed in pairs and checked against the real outputs,
//! until the class settles; real calls keep the default meanwhile. With
//! `HELIOS_MATMUL_TUNE=full` the first call of a class tunes exhaustively instead (`tune`): a
//! candidate may win only if its outputs agree with the default kernel's within four times
//! the tests' bound for the dtype. `HELIOS_ATTN_TUNE=0` turns tuning off (`=1` on for CPU
//! devices too). Winners persist in `<cache root>/attention/<device uuid>-<driver>-<features>
//! .tsv`, one `variant  µs  class` line each, as the matmul tuner's do.

use helios_kernels::attention::{
    default_order, AttnStage, AttnVariant, COOP_VARIANTS, SIMT_VARIANTS,
};
use helios_kernels::Storage;
use helios_vk::DeviceType;

use super::attention::{AttentionGrads, AttentionOptions, AttentionOutput};
use super::online::{compare, fenced, median, warm, RowSample, Verdict};
use super::Tuning;
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

/// How attention classes tune: exhaustively before their first call where matmul's do
/// (`HELIOS_MATMUL_TUNE=full`, `set_exhaustive_tuning`), else `HELIOS_ATTN_TUNE=0` off, `=1`
/// online also on CPU devices, by default online on GPUs.
fn mode(device: &Device) -> Tuning {
    #[cfg(test)]
    if let Some(t) = super::online::test_tuning(device) {
        return t;
    }
    if super::matmul_tune::exhaustive() {
        return Tuning::Exhaustive;
    }
    match crate::env::attention_tune() {
        Some(false) => Tuning::Off,
        Some(true) => Tuning::Online,
        None if device.context().caps().device_type == DeviceType::Cpu => Tuning::Off,
        None => Tuning::Online,
    }
}

/// Whether a call is free to tune: nothing forced.
fn free(o: &AttentionOptions) -> bool {
    o.variant.is_none() && o.stage_variant.is_none() && !super::attention::forced_by_env()
}

/// Whether a call should tune `stages` exhaustively first: that mode, nothing forced, some
/// stage's class without a winner.
pub(crate) fn wanted(q: &Tensor, d: usize, stages: &[AttnStage], o: &AttentionOptions) -> bool {
    let dev = q.device();
    free(o)
        && mode(dev) == Tuning::Exhaustive
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

// ------------------------------------------------------------------ on real work

/// Pairs per candidate and the slack past the best median ratio beyond which a candidate's
/// best ratio drops it (as for matmul's exploration).
const SAMPLES: usize = 3;
const DROP_SLACK: f64 = 1.25;

/// One class being tuned on real work. An exploring call of the class runs, after the real
/// call, the default kernel's stage and one candidate's, each as a whole call with that
/// stage forced, into fresh outputs, fenced and timed in one command buffer: the candidate's
/// score is its median time over the default's in the same call (the GPU's clock cancels
/// out). A candidate's first run is also compared with the real call's outputs from bytes
/// copied aside. Nothing waits: results are collected on later calls, and the class settles
/// on the lowest median ratio as the exhaustive tuner would. Real calls keep the default
/// kernel until then.
struct Exploring {
    /// The default kernel's variant (the real calls').
    incumbent: AttnVariant,
    /// The other candidates.
    cands: Vec<Cand>,
    incumbent_us: Vec<f64>,
    pending: Vec<Pending>,
    calls: u64,
}

struct Cand {
    variant: AttnVariant,
    /// `None`: not yet compared; `Some(true)`: matched, its pairs count.
    checked: Option<bool>,
    ratios: Vec<f64>,
    busy: bool,
}

struct Pending {
    cand: usize,
    incumbent: helios_vk::GpuSpan,
    span: helios_vk::GpuSpan,
    /// (real, shadow, dtype, stretches) for a first run.
    compared: Vec<(
        helios_vk::Snapshot,
        helios_vk::Snapshot,
        DType,
        Vec<RowSample>,
    )>,
}

type ExploreKey = (usize, Class);
type ExploreMap = rustc_hash::FxHashMap<ExploreKey, Exploring>;

fn exploring() -> &'static std::sync::Mutex<ExploreMap> {
    static MAP: std::sync::OnceLock<std::sync::Mutex<ExploreMap>> = std::sync::OnceLock::new();
    MAP.get_or_init(Default::default)
}

/// Byte ranges of a dense tensor to compare: up to four stretches of at most 64K elements,
/// spread over it.
fn stretches(t: &Tensor) -> (Vec<(u64, u64)>, Vec<RowSample>) {
    let size = t.dtype().size() as u64;
    let len = t.len() as u64;
    let chunk = len.min(1 << 16);
    let count = (len / chunk.max(1)).clamp(1, 4);
    let starts: Vec<u64> = (0..count)
        .map(|i| match count {
            1 => 0,
            _ => i * (len - chunk) / (count - 1),
        })
        .collect();
    let regions = starts.iter().map(|&s| (s * size, chunk * size)).collect();
    let rows = starts
        .iter()
        .map(|_| RowSample {
            row: u32::MAX,
            len: chunk as u32,
        })
        .collect();
    (regions, rows)
}

impl Exploring {
    fn new(incumbent: AttnVariant, variants: Vec<AttnVariant>) -> Exploring {
        Exploring {
            incumbent,
            cands: variants
                .into_iter()
                .filter(|&v| v != incumbent)
                .map(|variant| Cand {
                    variant,
                    checked: None,
                    ratios: Vec::new(),
                    busy: false,
                })
                .collect(),
            incumbent_us: Vec::new(),
            pending: Vec::new(),
            calls: 0,
        }
    }

    fn live(c: &Cand) -> bool {
        c.checked == Some(true)
    }

    /// Takes in finished pairs and comparisons (never waits: a pair shares its batch with
    /// its copies).
    fn collect(&mut self, ctx: &helios_vk::Context) -> Result<()> {
        let mut still = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            let mut read = Vec::new();
            for (real, shadow, dtype, rows) in &p.compared {
                match (ctx.read_snapshot(real)?, ctx.read_snapshot(shadow)?) {
                    (Some(a), Some(b)) => read.push(compare(&a, &b, rows, *dtype, bound(*dtype))),
                    _ => break,
                }
            }
            if read.len() < p.compared.len() {
                still.push(p);
                continue;
            }
            let incumbent = match ctx.gpu_elapsed_if_done(p.incumbent)? {
                Ok(t) => t.as_secs_f64() * 1e6,
                Err(span) => {
                    still.push(Pending {
                        incumbent: span,
                        ..p
                    });
                    continue;
                }
            };
            let us = ctx.gpu_elapsed(p.span)?.as_secs_f64() * 1e6;
            self.incumbent_us.push(incumbent);
            let c = &mut self.cands[p.cand];
            c.busy = false;
            if !p.compared.is_empty() {
                c.checked = match () {
                    _ if read.contains(&Verdict::Differ) => Some(false),
                    _ if read.contains(&Verdict::Inconclusive) => None,
                    _ => Some(true),
                };
            }
            if Self::live(c) && incumbent > 0.0 {
                c.ratios.push(us / incumbent);
            }
        }
        self.pending = still;
        Ok(())
    }

    /// Drops candidates well behind the best; the winner (variant, its median ratio) once
    /// every candidate is measured.
    fn settle(&mut self) -> Option<(AttnVariant, f64)> {
        let best = self
            .cands
            .iter()
            .filter(|c| Self::live(c) && !c.ratios.is_empty())
            .map(|c| median(&c.ratios))
            .fold(1.0, f64::min);
        for c in &mut self.cands {
            let fastest = c.ratios.iter().copied().fold(f64::INFINITY, f64::min);
            // Judged on two pairs at least.
            if Self::live(c) && c.ratios.len() >= 2 && fastest > best * DROP_SLACK {
                c.checked = Some(false);
            }
        }
        let done = self.pending.is_empty()
            && self.cands.iter().all(|c| match c.checked {
                None => false,
                Some(true) => c.ratios.len() >= SAMPLES,
                Some(false) => true,
            });
        if !done {
            return None;
        }
        let challenger = self
            .cands
            .iter()
            .filter(|c| Self::live(c))
            .map(|c| (c.variant, median(&c.ratios)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        Some(match challenger {
            Some((v, r)) if r < 1.0 => (v, r),
            _ => (self.incumbent, 1.0),
        })
    }

    /// The candidate this call runs beside the default, and whether it is its first run
    /// (compared): the next unchecked one, else the live one with the fewest pairs.
    fn pick(&mut self) -> Option<(usize, AttnVariant, bool)> {
        let i = self
            .cands
            .iter()
            .position(|c| !c.busy && c.checked.is_none())
            .map(|i| (i, true))
            .or_else(|| {
                (0..self.cands.len())
                    .filter(|&i| {
                        let c = &self.cands[i];
                        !c.busy && Self::live(c) && c.ratios.len() < SAMPLES
                    })
                    .min_by_key(|&i| self.cands[i].ratios.len())
                    .map(|i| (i, false))
            })?;
        self.cands[i.0].busy = true;
        Some((i.0, self.cands[i.0].variant, i.1))
    }
}

/// After a real call of `stage` whose outputs are `real`: one step of the class's tuning on
/// real work (see `Exploring`), when tuning is online, nothing is forced and the class has
/// no winner yet. `run(opts)` records the call again with `opts`.
fn explore(
    q: &Tensor,
    stage: AttnStage,
    base: &AttentionOptions,
    real: &[&Tensor],
    run: &dyn Fn(&AttentionOptions) -> Result<Vec<Tensor>>,
) -> Result<()> {
    let device = q.device();
    if !free(base) || mode(device) != Tuning::Online || !warm(device) {
        return Ok(());
    }
    let d = *q.shape().last().unwrap_or(&0);
    let class = Class::of(q.dtype().storage(), d, rows(q, d), stage, base);
    if cached(device, class).is_some() {
        return Ok(());
    }
    let ctx = device.context();
    let key = (device.id(), class);
    let picked = {
        let mut map = exploring().locked();
        let e = match map.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let Some(k) = q.attention_kernel_of(stage, base)? else {
                    return Ok(());
                };
                let coop = k.variant.is_coop();
                e.insert(Exploring::new(k.variant, candidates(stage, coop)))
            }
        };
        e.calls += 1;
        e.collect(ctx)?;
        if let Some((v, ratio)) = e.settle() {
            let us = median(&e.incumbent_us) * ratio;
            if crate::env::verbose() {
                eprintln!(
                    "helios: attention tuned {} on real work: {} {us:.1} µs, {ratio:.2}x the \
                     default ({} candidates, {} calls)",
                    class.name(),
                    v.tag(),
                    e.cands.len() + 1,
                    e.calls
                );
            }
            map.remove(&key);
            drop(map);
            store(device, class, &v.tag(), us);
            return Ok(());
        }
        e.pick().map(|p| (p, e.incumbent))
    };
    let Some(((cand, variant, first), incumbent)) = picked else {
        return Ok(());
    };
    let forced = |v: AttnVariant| AttentionOptions {
        stage_variant: Some((stage, v)),
        ..base.clone()
    };
    // One batch for both spans and the copies: collecting the pair never waits.
    let _hold = ctx.hold_submits();
    let (ran, incumbent) = fenced(ctx, || run(&forced(incumbent)))?;
    ran?;
    let (outs, span) = fenced(ctx, || run(&forced(variant)))?;
    let compared = match (&outs, first) {
        (Ok(outs), true) => {
            let mut v = Vec::new();
            for (r, s) in real.iter().zip(outs) {
                let (regions, rows) = stretches(r);
                v.push((
                    ctx.snapshot(r.buffer()?, &regions)?,
                    ctx.snapshot(s.buffer()?, &regions)?,
                    r.dtype(),
                    rows,
                ));
            }
            v
        }
        _ => Vec::new(),
    };
    let mut map = exploring().locked();
    if let Some(e) = map.get_mut(&key) {
        if outs.is_err() {
            // It cannot run here (shared memory, cooperative matrices): out.
            e.cands[cand].checked = Some(false);
        }
        e.pending.push(Pending {
            cand,
            incumbent,
            span,
            compared,
        });
    }
    Ok(())
}

/// Drops the explorations of the device with `id` (going away; `ctx` is its context, idle)
/// and releases the timers of their pairs never collected.
pub(crate) fn forget_device(id: usize, ctx: &helios_vk::Context) {
    let gone: Vec<Exploring> = {
        let mut map = exploring().locked();
        let keys: Vec<ExploreKey> = map.keys().filter(|k| k.0 == id).copied().collect();
        keys.iter().filter_map(|k| map.remove(k)).collect()
    };
    for e in gone {
        for p in e.pending {
            let _ = ctx.gpu_elapsed(p.incumbent);
            let _ = ctx.gpu_elapsed(p.span);
        }
    }
}

/// `explore` after a real forward.
pub(crate) fn explore_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &AttentionOptions,
    real: &AttentionOutput,
) -> Result<()> {
    explore(q, AttnStage::Forward, o, &[&real.out, &real.lse], &|o| {
        let f = q.attention(k, v, o)?;
        Ok(vec![f.out, f.lse])
    })
}

/// `explore` of both backward stages after a real backward whose gradients (dq, dk, dv;
/// three handles of one packed tensor when `packed`) are `real`.
pub(crate) fn explore_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    fwd: &AttentionOutput,
    dout: &Tensor,
    o: &AttentionOptions,
    (real, packed): (&[Tensor; 3], bool),
) -> Result<()> {
    let grads = |o: &AttentionOptions| q.backward_impl(k, v, fwd, dout, o, packed);
    explore(q, AttnStage::DkDv, o, &[&real[1], &real[2]], &|o| {
        let [_, dk, dv] = grads(o)?;
        Ok(vec![dk, dv])
    })?;
    explore(q, AttnStage::Dq, o, &[&real[0]], &|o| {
        let [dq, _, _] = grads(o)?;
        Ok(vec![dq])
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::online::TEST_TUNING;

    /// A forward class explores on real calls (every output the same as the default
    /// kernel's, bit for bit), settles, and its winner is stored.
    #[test]
    fn a_forward_class_explores_and_settles() {
        let device = Device::from_env().expect("a Vulkan device");
        TEST_TUNING.locked().push((device.id(), Tuning::Online));
        let (b, t, h, d) = (1, 24, 2, 16);
        let mut seed = 7u32;
        let mut random = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                })
                .collect()
        };
        let shape = [b, t, h, d];
        let n = b * t * h * d;
        let q = Tensor::from_slice(&device, &random(n), &shape).expect("q");
        let k = Tensor::from_slice(&device, &random(n), &shape).expect("k");
        let v = Tensor::from_slice(&device, &random(n), &shape).expect("v");
        let opts = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let class = Class::of(
            q.dtype().storage(),
            d,
            rows(&q, d),
            AttnStage::Forward,
            &opts,
        );
        STORE.remove(&device, &class.name());
        device.attention_winners().locked().remove(&class);
        let default = q
            .attention_kernel(AttnStage::Forward, &opts)
            .expect("kernel");
        let want = q
            .attention(&k, &v, &opts)
            .expect("forward")
            .out
            .to_vec()
            .expect("read");
        let mut settled = None;
        for call in 1..=200 {
            let got = q.attention(&k, &v, &opts).expect("forward");
            if settled.is_none() {
                assert_eq!(
                    got.out.to_vec().expect("read"),
                    want,
                    "call {call}: the default's"
                );
            }
            if cached(&device, class).is_some() && settled.is_none() {
                settled = Some(call);
            }
        }
        let call = settled.expect("the class settled within 200 calls");
        assert!(
            call > 3,
            "settled after {call} calls: nothing was explored ({default})"
        );
        assert!(STORE.get(&device, &class.name()).is_some(), "stored");
        STORE.remove(&device, &class.name());
        let messages = device.validation_messages();
        assert!(messages.is_empty(), "validation: {messages:?}");
    }
}
