//! Block-size tuning of the attention kernels per (device, dtype, head dim, stage, mask,
//! size: the query rows B·T·H to a power of two, which sets how the grid fills the GPU).
//!
//! The one decision a reader must know: tuning times whole calls on the caller's own
//! operands, forcing one stage's variant at a time (`AttentionOptions::stage_variant`); the
//! other stages run their usual kernels, a constant that cannot change the winner. On GPUs a
//! class is tuned on real work (`explore`): after each real call, the default's stage and
//! one candidate's run side by side, timed in pairs and checked against the real outputs,
//! until the class settles; real calls keep the default meanwhile. With
//! `HELIOS_MATMUL_TUNE=full` the first call of a class tunes exhaustively instead (`exhaustive`): a
//! candidate may win only if its outputs agree with the default kernel's within four times
//! the tests' bound for the dtype. `HELIOS_ATTN_TUNE=0` turns tuning off (`=1` on for CPU
//! devices too). Winners persist in `<cache root>/attention/<device uuid>-<driver>-<features>
//! .tsv`, one `variant  µs  class` line each, as the matmul tuner's do.

use helios_kernels::attention::{
    default_order, AttentionKernel, AttnStage, AttnVariant, COOP_VARIANTS, NATIVE_VARIANTS,
    SIMT_VARIANTS,
};
use helios_kernels::Storage;
use helios_vk::DeviceType;

mod exhaustive;
mod explore;

pub(crate) use exhaustive::{tune_backward, tune_forward};
pub(crate) use explore::{explore_backward, explore_forward, exploring_count, forget_device};

use super::AttentionOptions;
use crate::ops::Tuning;
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

/// How attention classes tune: `HELIOS_ATTN_TUNE=0` off, `=1` online also on CPU devices, by
/// default online on GPUs; exhaustive before their first call with `HELIOS_MATMUL_TUNE=full`,
/// or where online and `set_exhaustive_tuning` asks.
pub(crate) fn mode(device: &Device) -> Tuning {
    #[cfg(test)]
    if let Some(t) = crate::ops::online::test_tuning(device) {
        return t;
    }
    if crate::env::matmul_tune() == Some(Tuning::Exhaustive) {
        return Tuning::Exhaustive;
    }
    crate::ops::matmul::tune::upgraded(match crate::env::attention_tune() {
        Some(false) => Tuning::Off,
        Some(true) => Tuning::Online,
        None if device.context().caps().device_type == DeviceType::Cpu => Tuning::Off,
        None => Tuning::Online,
    })
}

/// Whether a call is free to tune: nothing forced.
fn free(o: &AttentionOptions) -> bool {
    o.variant.is_none() && o.stage_variant.is_none() && !super::forced_by_env()
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

/// `base` with `stage` forced to `variant` (how both tuners run a candidate).
fn forced(base: &AttentionOptions, stage: AttnStage, variant: AttnVariant) -> AttentionOptions {
    AttentionOptions {
        stage_variant: Some((stage, variant)),
        ..base.clone()
    }
}

/// The variants worth trying for `stage`, the default order first: the cooperative family
/// where the default is cooperative (SIMT tiles are far slower there), else SIMT; the native
/// tiles second where the device has native kernels (a variant that cannot run a class is
/// skipped there).
fn candidates(device: &Device, stage: AttnStage, coop: bool) -> Vec<AttnVariant> {
    let mut v: Vec<AttnVariant> = default_order(stage, coop, false)
        .into_iter()
        .filter(|x| x.is_coop() == coop)
        .collect();
    // After the first, which the exhaustive tuner checks the others against.
    if coop && stage != AttnStage::Prep && device.native_target().is_some() {
        let at = v.len().min(1);
        v.splice(at..at, NATIVE_VARIANTS);
    }
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

/// Starts compiling `k` without waiting: SPIR-V on the compile pool, a native kernel through
/// the driver's deferred JIT (`Device::has_kernel` says when either is ready), before the
/// candidates' when `urgent` (the program's own next kernels).
pub(crate) fn start_compile(device: &Device, k: AttentionKernel, urgent: bool) -> Result<()> {
    ask(device, k, urgent, false)
}

/// Compiles candidate `k` and returns once it is ready (tuning's background threads:
/// `ops::background`).
pub(crate) fn compile_and_wait(device: &Device, k: AttentionKernel) -> Result<()> {
    ask(device, k, false, true)
}

fn ask(device: &Device, k: AttentionKernel, urgent: bool, wait: bool) -> Result<()> {
    let key = crate::device::KernelKey::Attention(k);
    if k.variant.is_native() {
        let target = crate::ops::native::target(device, &k.name())?;
        let kernel = device.native_kernel(key, || Ok(k.build_native(target)?), urgent)?;
        if wait {
            kernel.wait()?;
        }
    } else {
        let kernel = device.kernel(key, move || k.build())?;
        if wait {
            kernel.pipeline.wait()?;
        }
    }
    Ok(())
}

fn bound(dtype: DType) -> f64 {
    4.0 * match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 6e-3,
        DType::BF16 => 4e-2,
    }
}

// ------------------------------------------------------------------ the cache

/// Attention winners per device (`<cache root>/attention/<device>.tsv`). Version 2: the
/// forward is software-pipelined where it fits, and row-tile pairs joined its candidates.
static STORE: crate::ops::tuning_store::TuningStore =
    crate::ops::tuning_store::TuningStore::new("attention", STORE_VERSION, |v| {
        AttnVariant::by_name(v).is_some()
    });

/// The winners' store version (above), which unsettled classes' progress follows.
const STORE_VERSION: u32 = 2;

/// Unsettled classes' exploration (`<cache root>/attention-progress/<device>.tsv`).
static PROGRESS: crate::ops::tuning_progress::ProgressStore =
    crate::ops::tuning_progress::ProgressStore::new("attention-progress", STORE_VERSION, |t| {
        AttnVariant::by_name(t).is_some()
    });

/// The stored winners looked up so far, per (device id, class): `None` where none is stored.
type Winners = rustc_hash::FxHashMap<(usize, Class), Option<AttnVariant>>;

fn winners() -> &'static std::sync::Mutex<Winners> {
    static WINNERS: std::sync::OnceLock<std::sync::Mutex<Winners>> = std::sync::OnceLock::new();
    WINNERS.get_or_init(Default::default)
}

/// Forgets what `cached` remembered for the device with `id` (going away).
pub(crate) fn forget_winners(id: usize) {
    winners().locked().retain(|k, _| k.0 != id);
}

/// The tuned variant for `class` on this device, if any. Every attention call asks, so the
/// answer is remembered per device until a winner is stored.
pub(crate) fn cached(device: &Device, class: Class) -> Option<AttnVariant> {
    let key = (device.id(), class);
    if let Some(&v) = winners().locked().get(&key) {
        return v;
    }
    let v = STORE
        .get(device, &class.name())
        .and_then(|v| AttnVariant::by_name(&v));
    winners().locked().insert(key, v);
    v
}

/// Every winner known for this device: (class, variant, µs), sorted.
pub fn attention_tuning(device: &Device) -> Vec<(String, String, f64)> {
    STORE.all(device)
}

/// Forgets `class`'s winner on this device, stored and remembered (tests that tune).
#[cfg(test)]
pub(crate) fn forget(device: &Device, class: Class) {
    STORE.remove(device, &class.name());
    PROGRESS.forget(device, &class.name());
    winners().locked().remove(&(device.id(), class));
}

fn store(device: &Device, class: Class, variant: &str, us: f64) {
    STORE.put(device, &class.name(), variant, us);
    winners().locked().remove(&(device.id(), class));
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

    /// Random q, k, v of `[b, t, h, d]` (f32), and the causal forward's class.
    fn qkv(device: &Device, (b, t, h, d): (usize, usize, usize, usize)) -> [Tensor; 3] {
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
        [0, 1, 2].map(|_| Tensor::from_slice(device, &random(n), &shape).expect("upload"))
    }

    fn forward_class(q: &Tensor, opts: &AttentionOptions) -> Class {
        let d = *q.shape().last().expect("4-d");
        Class::of(q.dtype().storage(), d, rows(q, d), AttnStage::Forward, opts)
    }

    /// A forward class explores on real calls (every output the same as the default
    /// kernel's, bit for bit), settles, and its winner is stored.
    #[test]
    fn a_forward_class_explores_and_settles() {
        let device = Device::from_env().expect("a Vulkan device");
        TEST_TUNING.locked().push((device.id(), Tuning::Online));
        let [q, k, v] = qkv(&device, (1, 24, 2, 16));
        let opts = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let class = forward_class(&q, &opts);
        forget(&device, class);
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

    /// A forward class that has not settled when its process ends goes on where it stood in
    /// the next one (what was saved at its last milestone), then settles.
    #[test]
    fn an_unsettled_forward_class_goes_on_in_the_next_process() {
        use crate::ops::tuning_progress::Standing;
        let device = Device::from_env().expect("a Vulkan device");
        TEST_TUNING.locked().push((device.id(), Tuning::Online));
        let [q, k, v] = qkv(&device, (1, 24, 2, 32));
        let opts = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let class = forward_class(&q, &opts);
        forget(&device, class);
        let incumbent = q
            .attention_kernel_of(AttnStage::Forward, &opts)
            .expect("kernel")
            .expect("a kernel")
            .variant
            .tag();
        let finished = |s: &Standing| match s {
            Standing::Out => true,
            Standing::Ratios(r) => r.len() >= explore::SAMPLES,
            Standing::New => false,
        };
        let mut saved = None;
        for _ in 0..200 {
            q.attention(&k, &v, &opts).expect("forward");
            device.synchronize().expect("idle");
            crate::ops::background::wait_idle();
            saved = PROGRESS
                .load(&device, &class.name(), &incumbent)
                .filter(|s| s.cands.iter().any(|c| finished(&c.1)));
            if saved.is_some() {
                break;
            }
        }
        let saved = saved.expect("a milestone within 200 calls");
        assert!(
            cached(&device, class).is_none(),
            "settled before a second process"
        );
        // A new process: no exploration in memory.
        device.synchronize().expect("idle");
        explore::forget_class(&device, class);
        q.attention(&k, &v, &opts).expect("forward");
        let resumed = explore::progress_of(&device, class).expect("exploring again");
        for (cand, standing) in saved.cands.iter().filter(|c| finished(&c.1)) {
            let now = resumed.cands.iter().find(|c| c.0 == *cand).map(|c| &c.1);
            assert_eq!(now, Some(standing), "{cand} resumed as it was saved");
        }
        for _ in 0..400 {
            if cached(&device, class).is_some() {
                break;
            }
            q.attention(&k, &v, &opts).expect("forward");
            device.synchronize().expect("idle");
            crate::ops::background::wait_idle();
        }
        assert!(
            cached(&device, class).is_some(),
            "settled after resuming: {:?}",
            explore::progress_of(&device, class)
        );
        forget(&device, class);
        let messages = device.validation_messages();
        assert!(messages.is_empty(), "validation: {messages:?}");
    }
}
