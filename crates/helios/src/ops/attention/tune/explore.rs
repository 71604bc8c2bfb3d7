//! Attention tuning on real work (`explore`, the default on GPUs): see `Exploring`.

use helios_kernels::attention::{AttentionKernel, AttnStage, AttnVariant};

use super::{bound, cached, candidates, forced, free, mode, rows, store, Class, PROGRESS};
use crate::device::KernelKey;
use crate::ops::attention::select::{first_use_passed, unchecked};
use crate::ops::attention::{AttentionOptions, AttentionOutput};
use crate::ops::background::{self, Candidate};
use crate::ops::online::{
    compare, fenced, median, refund, spend, warm, RowSample, Verdict, FIRST_ESTIMATE_US,
};
use crate::ops::tuning_progress::{Progress, Standing};
use crate::ops::Tuning;
use crate::realize_lock::LockExt;
use crate::{DType, Result, Tensor};

/// Pairs per candidate and the slack past the best median ratio beyond which a candidate's
/// best ratio drops it (as for matmul's exploration).
pub(super) const SAMPLES: usize = 3;
const DROP_SLACK: f64 = 1.25;

/// One class being tuned on real work. An exploring call of the class runs, after the real
/// call, the default kernel's stage and one candidate's, each as a whole call with that
/// stage forced, into fresh outputs, fenced and timed in one command buffer: the candidate's
/// score is its median time over the default's in the same call (the GPU's clock cancels
/// out). A candidate's first run is also compared with the real call's outputs from bytes
/// copied aside. Nothing waits: results are collected on later calls, and the class settles
/// on the lowest median ratio as the exhaustive tuner would. Real calls keep the default
/// kernel until then. Its progress is saved at each milestone (`ops::tuning_progress`), and a
/// later process goes on from it.
struct Exploring {
    /// The default kernel's variant (the real calls').
    incumbent: AttnVariant,
    /// The other candidates.
    cands: Vec<Cand>,
    incumbent_us: Vec<f64>,
    pending: Vec<Pending>,
    calls: u64,
    /// `milestones()` when the progress was last saved (`save_if_moved`).
    saved: (usize, usize),
}

struct Cand {
    variant: AttnVariant,
    /// Its kernel, compiling on tuning's threads from the start of the exploration: a
    /// candidate is tried only once compiled, so that no submit waits for its compile.
    kernel: Option<AttentionKernel>,
    /// `None`: not yet compared; `Some(true)`: matched, its pairs count.
    checked: Option<bool>,
    ratios: Vec<f64>,
    busy: bool,
}

struct Pending {
    cand: usize,
    incumbent: helios_vk::GpuSpan,
    span: helios_vk::GpuSpan,
    /// What the exploration budget was charged for both runs, µs (`online::spend`).
    charged_us: f64,
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
    /// The exploration of `q`'s class of `stage` from `incumbent` (nothing is generated or
    /// waited for here: `resume_and_compile` queues the kernels); a variant that cannot run
    /// for this class is out from the start.
    fn new(
        (q, stage, packed): (&Tensor, AttnStage, bool),
        base: &AttentionOptions,
        incumbent: AttnVariant,
        variants: Vec<AttnVariant>,
    ) -> Exploring {
        let cands = variants
            .into_iter()
            .filter(|&v| v != incumbent)
            .map(|variant| {
                // The kernel the call records: a packed backward writes the slices of one
                // gradient.
                let kernel =
                    unchecked(|| q.attention_kernel_of(stage, &forced(base, stage, variant)))
                        .ok()
                        .flatten()
                        .map(|k| AttentionKernel { packed, ..k });
                Cand {
                    variant,
                    kernel,
                    checked: kernel.is_none().then_some(false),
                    ratios: Vec::new(),
                    busy: false,
                }
            })
            .collect::<Vec<Cand>>();
        Exploring {
            incumbent,
            cands,
            incumbent_us: Vec::new(),
            pending: Vec::new(),
            calls: 0,
            saved: (0, 0),
        }
    }

    /// Takes up the class's exploration where an earlier process left it
    /// (`ops::tuning_progress`), then queues the kernels of the candidates still to measure
    /// for tuning's threads (generated and compiled there, never here: `ops::background`).
    fn resume_and_compile(&mut self, device: &crate::Device, class: Class) {
        if let Some(saved) = PROGRESS.load(device, &class.name(), &self.incumbent.tag()) {
            self.resume(saved);
        }
        self.saved = self.milestones();
        background::compile_candidates(
            device,
            self.cands
                .iter()
                .filter(|c| c.checked.is_none() || (Self::live(c) && c.ratios.len() < SAMPLES))
                .filter_map(|c| c.kernel.map(Candidate::Attention))
                .collect(),
        );
    }

    fn resume(&mut self, saved: Progress) {
        for (tag, standing) in saved.cands {
            // A candidate that cannot run here stays out whatever was saved.
            let Some(c) = self
                .cands
                .iter_mut()
                .find(|c| c.variant.tag() == tag && c.kernel.is_some())
            else {
                continue;
            };
            (c.checked, c.ratios) = match standing {
                Standing::New => (None, Vec::new()),
                Standing::Out => (Some(false), Vec::new()),
                // Checked against the real outputs again unless fully measured.
                Standing::Ratios(r) if r.len() >= SAMPLES => (Some(true), r),
                Standing::Ratios(r) => (None, r),
            };
        }
        if saved.incumbent_us > 0.0 {
            self.incumbent_us.push(saved.incumbent_us);
        }
    }

    /// Candidates out and candidates fully measured: what a save records progress at.
    fn milestones(&self) -> (usize, usize) {
        let out = self
            .cands
            .iter()
            .filter(|c| c.checked == Some(false))
            .count();
        let done = self
            .cands
            .iter()
            .filter(|c| Self::live(c) && c.ratios.len() >= SAMPLES)
            .count();
        (out, done)
    }

    /// Saves the exploration when a milestone moved since the last save.
    fn save_if_moved(&mut self, device: &crate::Device, class: Class) {
        let now = self.milestones();
        if now == self.saved {
            return;
        }
        self.saved = now;
        PROGRESS.save(device, &class.name(), &self.progress());
    }

    /// The exploration as `ops::tuning_progress` saves it.
    fn progress(&self) -> Progress {
        let standing = |c: &Cand| match c.checked {
            Some(false) => Standing::Out,
            _ if c.ratios.is_empty() => Standing::New,
            _ => Standing::Ratios(c.ratios.clone()),
        };
        Progress {
            incumbent: self.incumbent.tag(),
            incumbent_us: match self.incumbent_us.is_empty() {
                true => 0.0,
                false => median(&self.incumbent_us),
            },
            cands: self
                .cands
                .iter()
                .map(|c| (c.variant.tag(), standing(c)))
                .collect(),
        }
    }

    fn live(c: &Cand) -> bool {
        c.checked == Some(true)
    }

    /// Takes in finished pairs and comparisons (never waits: a pair shares its batch with
    /// its copies).
    fn collect(&mut self, device: &crate::Device) -> Result<()> {
        let ctx = device.context();
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
            refund(device, p.charged_us, incumbent + us);
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
    /// every candidate is measured and a native winner has passed its first-use check
    /// (candidates run unchecked: one that fails is out, and the next call settles again).
    fn settle(&mut self, device: &crate::Device) -> Option<(AttnVariant, f64)> {
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
        let challenger = (0..self.cands.len())
            .filter(|&i| Self::live(&self.cands[i]))
            .map(|i| (i, median(&self.cands[i].ratios)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        match challenger {
            Some((i, r)) if r < 1.0 => {
                let c = &mut self.cands[i];
                // The kernel `choose` will look up (dense: the check writes dense gradients).
                let dense = c.kernel.map(|k| AttentionKernel { packed: false, ..k });
                if dense.is_some_and(|k| !first_use_passed(device, &k)) {
                    c.checked = Some(false);
                    return None;
                }
                Some((c.variant, r))
            }
            _ => Some((self.incumbent, 1.0)),
        }
    }

    /// The candidate this call runs beside the default, and whether it is its first run
    /// (compared): the next unchecked one compiled, else the live one with the fewest pairs.
    fn pick(&mut self, device: &crate::Device) -> Option<(usize, AttnVariant, bool)> {
        let ready = |c: &Cand| {
            !c.busy
                && c.kernel
                    .is_some_and(|k| device.has_kernel(&KernelKey::Attention(k)))
        };
        let i = self
            .cands
            .iter()
            .position(|c| ready(c) && c.checked.is_none())
            .map(|i| (i, true))
            .or_else(|| {
                (0..self.cands.len())
                    .filter(|&i| {
                        let c = &self.cands[i];
                        ready(c) && Self::live(c) && c.ratios.len() < SAMPLES
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
    (q, stage, packed): (&Tensor, AttnStage, bool),
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
                let coop = k.variant.is_coop() || k.variant.is_native();
                let mut fresh = Exploring::new(
                    (q, stage, packed),
                    base,
                    k.variant,
                    candidates(device, stage, coop),
                );
                fresh.resume_and_compile(device, class);
                e.insert(fresh)
            }
        };
        e.calls += 1;
        e.collect(device)?;
        if let Some((v, ratio)) = e.settle(device) {
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
        e.save_if_moved(device, class);
        // A pair runs the incumbent again and a candidate that costs about as much.
        let charged_us = 2.0
            * match e.incumbent_us.is_empty() {
                true => FIRST_ESTIMATE_US,
                false => median(&e.incumbent_us),
            };
        if !spend(device, charged_us) {
            return Ok(());
        }
        let picked = e.pick(device).map(|p| (p, e.incumbent, charged_us));
        if picked.is_none() {
            refund(device, charged_us, 0.0);
        }
        picked
    };
    let Some(((cand, variant, first), incumbent, charged_us)) = picked else {
        return Ok(());
    };
    // One batch for both spans and the copies: collecting the pair never waits.
    let _hold = ctx.hold_submits();
    let (ran, incumbent) = fenced(ctx, || run(&forced(base, stage, incumbent)))?;
    if let Err(e) = ran {
        // The timer is released before the error goes up (a flush and a wait: a rare path).
        let _ = ctx.gpu_elapsed(incumbent);
        return Err(e);
    }
    let (outs, span) = fenced(ctx, || unchecked(|| run(&forced(base, stage, variant))))?;
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
            charged_us,
            compared,
        });
    }
    Ok(())
}

/// Forgets `class`'s exploration on `device` in this process only, as a new process would
/// start it (tests: the disk keeps its progress); the device must be idle.
#[cfg(test)]
pub(super) fn forget_class(device: &crate::Device, class: Class) {
    if let Some(e) = exploring().locked().remove(&(device.id(), class)) {
        for p in e.pending {
            let _ = device.context().gpu_elapsed(p.incumbent);
            let _ = device.context().gpu_elapsed(p.span);
        }
    }
}

/// `class`'s exploration on `device` as it would be saved, if it is exploring (tests).
#[cfg(test)]
pub(super) fn progress_of(device: &crate::Device, class: Class) -> Option<Progress> {
    exploring()
        .locked()
        .get(&(device.id(), class))
        .map(|e| e.progress())
}

/// How many attention classes of `device` are being tuned on real work.
pub(crate) fn exploring_count(device: &crate::Device) -> usize {
    exploring()
        .locked()
        .keys()
        .filter(|k| k.0 == device.id())
        .count()
}

/// Drops the explorations and remembered winners of the device with `id` (going away; `ctx`
/// is its context, idle) and releases the timers of their pairs never collected.
pub(crate) fn forget_device(id: usize, ctx: &helios_vk::Context) {
    super::forget_winners(id);
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
    explore(
        (q, AttnStage::Forward, false),
        o,
        &[&real.out, &real.lse],
        &|o| {
            let f = q.attention(k, v, o)?;
            Ok(vec![f.out, f.lse])
        },
    )
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
    explore(
        (q, AttnStage::DkDv, packed),
        o,
        &[&real[1], &real[2]],
        &|o| {
            let [_, dk, dv] = grads(o)?;
            Ok(vec![dk, dv])
        },
    )?;
    explore((q, AttnStage::Dq, packed), o, &[&real[0]], &|o| {
        let [dq, _, _] = grads(o)?;
        Ok(vec![dq])
    })
}
