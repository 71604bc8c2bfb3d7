//! Which attention kernel runs: the family's one selection function (`choose`; the order is
//! in `attention`'s module docs), the cooperative-fragment layout probe it relies on, and
//! `HELIOS_ATTN_VARIANT`.

use helios_kernels::attention::{AttentionKernel, AttnStage, AttnVariant};
use helios_kernels::rows::Reducer;
use helios_kernels::Storage;

use super::{invalid, AttentionOptions, AttentionOutput, Dims};
use crate::realize_lock::LockExt;
use crate::{DType, Device, Result, Tensor};

/// The family's one selection function (see the module docs for the order). `aligned`:
/// every strided input's offset and strides are multiples of 8 elements (the cooperative
/// kernels' 16-byte loads).
pub(super) fn choose(
    q: &Tensor,
    stage: AttnStage,
    dims: Dims,
    opts: &AttentionOptions,
    aligned: bool,
) -> Result<AttentionKernel> {
    let device = q.device();
    let storage = q.dtype().storage();
    let caps = crate::ops::matmul_caps(device);
    let coop = coop_kernels(device, storage);
    // The register kernels fold the scale into their exponent and need it positive (every
    // attention's is; the others take any).
    let positive = opts.scale.map_or(true, |s| s > 0.0);
    let frag = if coop && positive {
        frag_map(device, storage)
    } else {
        None
    };
    // Native kernels need the device's native target, the copy engine's aligned rows and
    // a positive scale.
    let native = device.native_target();
    let can_run = |kern: &AttentionKernel| {
        kern.buildable()
            && kern.shared_bytes() <= caps.max_shared_bytes
            && kern.workgroup() <= caps.max_invocations
            && (!kern.variant.is_coop()
                || (coop && aligned && helios_kernels::attention::coop_supports(kern.stage)))
            && (!kern.variant.is_native() || (kern.native_feasible(native) && aligned && positive))
    };
    let fits = |kern: &AttentionKernel| can_run(kern) && first_use_passed(device, kern);
    // Prep shares each row among the lanes of a subgroup where the row kernels may use
    // subgroup operations (their `reducer`: shuffles in compute, a power-of-two size of 4
    // or more, not turned off by `HELIOS_NO_SUBGROUP`).
    let prep_subgroup = match device.reducer() {
        Reducer::Subgroup { block, .. } => block,
        Reducer::SharedTree => 0,
    };
    // The pipelined form where the kernel has one and its two K/V buffers fit.
    let make = |variant: AttnVariant| {
        let plain = AttentionKernel {
            stage,
            storage,
            head_dim: dims.d as u32,
            causal: opts.causal,
            padded: opts.key_lengths.is_some(),
            variant,
            binding: if variant.is_coop() {
                helios_spirv::Binding::DeviceAddress
            } else {
                device.binding()
            },
            subgroup: if stage == AttnStage::Prep {
                prep_subgroup
            } else if variant.is_coop() {
                caps.subgroup
            } else {
                0
            },
            frag: if variant.is_coop() { frag } else { None },
            pipelined: false,
            own_dsum: false,
            packed: false,
        };
        // The register and native Dq compute Dsum themselves (no Prep pass).
        let plain = AttentionKernel {
            own_dsum: stage == AttnStage::Dq && (plain.in_registers() || variant.is_native()),
            ..plain
        };
        plain.pipelining().filter(fits).unwrap_or(plain)
    };
    let stage_forced = opts
        .stage_variant
        .and_then(|(s, v)| (s == stage).then_some(v));
    let env_stage = match env_variant() {
        Some(Forced::Stages(per)) => per[stage_index(stage)],
        _ => None,
    };
    let stage_forced = stage_forced.or(env_stage);
    let forced = opts.variant.or(stage_forced).or(match env_variant() {
        Some(Forced::Variant(v)) => Some(v),
        _ => None,
    });
    // A forced cooperative or native variant applies to the stages that family has; one
    // forced for every stage, to the stages with a kernel of that tile (the native family
    // has no Prep, and some tiles no backward at head dim 128). Forced by stage, it must
    // run there.
    let by_stage = stage_forced.is_some() && opts.variant.is_none();
    let forced = forced.filter(|&v| {
        (!v.is_coop() || helios_kernels::attention::coop_supports(stage))
            && (!v.is_native() || by_stage || make(v).buildable())
    });
    if let Some(v) = forced {
        let kern = make(v);
        if !fits(&kern) {
            let why = if native_failed(device, &kern) {
                "its first-use check against the reference failed here (the warning above \
                 says by how much)"
                    .to_string()
            } else if !kern.buildable() {
                "the variant has no kernel for this stage, dtype and head dim".to_string()
            } else {
                format!(
                    "shared memory {} of {} bytes, cooperative matrices {}{}",
                    kern.shared_bytes(),
                    caps.max_shared_bytes,
                    if coop { "available" } else { "unavailable" },
                    match v.is_native() && native.is_none() {
                        true => ", no native kernels (an NVIDIA Hopper GPU has them)",
                        false => "",
                    }
                )
            };
            return Err(invalid(format!(
                "variant {} does not fit this device for {} ({why})",
                v.tag(),
                kern.name()
            )));
        }
        return Ok(kern);
    }
    if let Some(v) = super::tune::cached(
        device,
        super::tune::Class::of(storage, dims.d, dims.b * dims.t * dims.h, stage, opts),
    ) {
        let kern = make(v);
        if fits(&kern) {
            return Ok(kern);
        }
    }
    let coop_stage = coop && helios_kernels::attention::coop_supports(stage) && aligned;
    let mut candidates = Vec::new();
    // Where the device has native kernels, the native ones first (measured faster than the
    // cooperative ones at every tuned shape, forward and backward:
    // bench/results/2026-11-29-native-attention-h200.md).
    if coop_stage && stage != AttnStage::Prep && native.is_some() {
        candidates.extend(helios_kernels::attention::native_order(stage, opts.causal));
    }
    candidates.extend(helios_kernels::attention::default_order(
        stage,
        coop_stage,
        frag.is_some(),
    ));
    // Tuning online, a native kernel still being JIT-compiled is passed over for the next in
    // the order (its JIT asked for now, first in line): a cold driver JIT-compiles one module
    // at a time (bench/results/2026-11-30-session46-h200.md), and its first-use check would
    // hold the call until then.
    // Only the first native kernel that can run is asked for.
    let online = super::tune::mode(device) == crate::ops::Tuning::Online;
    let mut compiling = false;
    candidates
        .into_iter()
        .map(make)
        .find(|k| {
            if !can_run(k) {
                return false;
            }
            if online && k.variant.is_native() && (compiling || !jitted(device, k)) {
                compiling = true;
                return false;
            }
            first_use_passed(device, k)
        })
        .ok_or_else(|| {
            invalid(format!(
                "no attention kernel for head dim {} fits this device's {} bytes of shared memory",
                dims.d, caps.max_shared_bytes
            ))
        })
}

/// Whether native kernel `kern` is JIT-compiled, dense or packed; if neither was asked for,
/// its JIT is started: a backward's in the packed form, which training runs
/// (`attention_qkv`).
fn jitted(device: &Device, kern: &AttentionKernel) -> bool {
    use crate::device::KernelKey;
    let form = |packed| AttentionKernel { packed, ..*kern };
    let forms = [false, true].map(|packed| KernelKey::Attention(form(packed)));
    if forms.iter().any(|k| device.has_kernel(k)) {
        return true;
    }
    if !forms.iter().any(|k| device.native_requested(k)) {
        let packed = kern.stage != AttnStage::Forward;
        let _ = super::tune::start_compile(device, form(packed), true);
    }
    false
}

/// Whether the cooperative-matrix attention kernels can take `storage` inputs on `device`:
/// its matrix units take them, its subgroups are 32 wide, and `HELIOS_ATTN_VARIANT` does not
/// force the SIMT kernels.
pub(crate) fn coop_kernels(device: &Device, storage: Storage) -> bool {
    let caps = crate::ops::matmul_caps(device);
    let units = match storage {
        Storage::F16 => caps.coop_f16,
        Storage::BF16 => caps.coop_bf16,
        Storage::F32 => false,
    };
    units && caps.subgroup == 32 && env_variant() != Some(Forced::Simt)
}

/// The device's cooperative-matrix fragment layout for `storage` inputs when the
/// register-resident kernels can use it (probed once per device; see
/// `helios_kernels::coop_layout`). A probe that fails leaves the kernels that stage scores
/// in shared memory in place and says why under `HELIOS_DEBUG`.
pub(crate) fn frag_map(device: &Device, storage: Storage) -> Option<helios_kernels::FragMap> {
    let bf16 = match storage {
        Storage::F16 => false,
        Storage::BF16 => true,
        Storage::F32 => return None,
    };
    *device
        .frag_map_cell(bf16)
        .get_or_init(|| match probe(device, storage) {
            Ok(map) => Some(map),
            Err(why) => {
                if crate::env::debug() {
                    eprintln!(
                        "helios: attention keeps scores in shared memory on this device: {why}"
                    );
                }
                None
            }
        })
}

/// Runs the fragment-layout probe and recognises its result.
fn probe(
    device: &Device,
    storage: Storage,
) -> std::result::Result<helios_kernels::FragMap, String> {
    use helios_kernels::CoopProbeKernel;
    let kernel = CoopProbeKernel {
        input: storage,
        subgroup: crate::ops::matmul_caps(device).subgroup,
    };
    if kernel.subgroup != 32 {
        return Err(format!("subgroups of {}", kernel.subgroup));
    }
    let run = || -> Result<Vec<f32>> {
        let coords: Vec<f32> = (0..256).map(|x| x as f32).collect();
        let dtype = match storage {
            Storage::BF16 => DType::BF16,
            _ => DType::F16,
        };
        let h = Tensor::from_slice_as(device, &coords, &[256], dtype)?;
        let f = Tensor::from_slice(device, &coords, &[256])?;
        let out = Tensor::from_slice(
            device,
            &vec![f32::from_bits(u32::MAX); CoopProbeKernel::OUT_WORDS],
            &[CoopProbeKernel::OUT_WORDS],
        )?;
        let compiled = device.kernel(crate::device::KernelKey::CoopProbe(kernel), || {
            kernel.build()
        })?;
        let push = helios_kernels::pack_push(
            &compiled.module.name,
            &compiled.module.params,
            compiled.module.push_size,
            &[
                helios_kernels::Arg::Address(h.address()?),
                helios_kernels::Arg::Address(f.address()?),
                helios_kernels::Arg::Address(out.address()?),
            ],
        )?;
        device.context().dispatch(
            &compiled.pipeline,
            [1, 1, 1],
            &push,
            &[
                helios_vk::Access::read(h.buffer()?),
                helios_vk::Access::read(f.buffer()?),
                helios_vk::Access::write(out.buffer()?),
            ],
        )?;
        out.to_vec()
    };
    let words: Vec<u32> = run()
        .map_err(|e| format!("the probe failed: {e}"))?
        .into_iter()
        .map(f32::to_bits)
        .collect();
    let (a, acc) = CoopProbeKernel::parse(&words)?;
    helios_kernels::FragMap::recognise(&acc, &a)
}

/// What `HELIOS_ATTN_VARIANT` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Forced {
    /// `simt`: the SIMT family (its default tile) even where cooperative matrices exist.
    Simt,
    /// A variant tag (`simt16x16`, `coop64x64`, ...).
    Variant(AttnVariant),
    /// Variants by stage (`fwd=nv128x64,dq=nv128x64,dkdv=coop32x64`), in
    /// [`stage_index`] order; the stages not named choose as usual.
    Stages([Option<AttnVariant>; 4]),
}

/// A stage's place in [`Forced::Stages`].
fn stage_index(stage: AttnStage) -> usize {
    match stage {
        AttnStage::Forward => 0,
        AttnStage::Prep => 1,
        AttnStage::DkDv => 2,
        AttnStage::Dq => 3,
    }
}

/// `fwd=<tag>,dq=<tag>,...`: variants by stage (`fwd`, `prep`, `dkdv`, `dq`).
fn parse_stages(s: &str) -> Option<[Option<AttnVariant>; 4]> {
    let mut per = [None; 4];
    for part in s.split(',') {
        let (stage, tag) = part.split_once('=')?;
        let stage = match stage.trim() {
            "fwd" => AttnStage::Forward,
            "prep" => AttnStage::Prep,
            "dkdv" => AttnStage::DkDv,
            "dq" => AttnStage::Dq,
            _ => return None,
        };
        per[stage_index(stage)] = Some(AttnVariant::by_name(tag.trim())?);
    }
    Some(per)
}

/// `HELIOS_ATTN_VARIANT`, read once per process (every attention call asks; ignored with a
/// note when it names nothing).
fn env_variant() -> Option<Forced> {
    static FORCED: std::sync::OnceLock<Option<Forced>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        let s = crate::env::attention_variant()?;
        let s = s.as_str();
        if s == "simt" {
            return Some(Forced::Simt);
        }
        let v = match s.contains('=') {
            true => parse_stages(s).map(Forced::Stages),
            false => AttnVariant::by_name(s).map(Forced::Variant),
        };
        if v.is_none() {
            eprintln!(
                "helios: HELIOS_ATTN_VARIANT={s:?} names no variant (simt, simt16x16, \
                 coop64x64, nv128x64, or by stage: fwd=nv128x64,dq=nv128x64,dkdv=nv128x64); \
                 ignored"
            );
        }
        v
    })
}

/// Whether `HELIOS_ATTN_VARIANT` forces the kernels (the tuner then stays off).
pub(crate) fn forced_by_env() -> bool {
    env_variant().is_some()
}

thread_local! {
    /// Set while this thread runs a native kernel's first-use check (its own calls pass).
    static CHECKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Devices on which the unit tests check every kernel but Prep on first use, f32 too: how
/// the check, and the tuner that calls it, run where no native kernel exists.
#[cfg(test)]
static CHECK_EVERY: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// Whether `kern` must pass its first-use check before it is chosen: the native kernels.
fn checked_on_first_use(device: &Device, kern: &AttentionKernel) -> bool {
    #[cfg(test)]
    if kern.stage != AttnStage::Prep && CHECK_EVERY.locked().contains(&device.id()) {
        return true;
    }
    let _ = device;
    kern.variant.is_native()
}

/// Whether native attention kernel `kern` gave the reference's results on this device:
/// each is checked on its first use, per device and kernel, against the f64 CPU reference
/// on a small random problem (a driver's compiler once reused registers a kernel still
/// needed and gave wrong results: bench/results/2026-11-29-native-attention-h200.md). A
/// kernel that fails is not chosen again, and a warning says so.
fn native_verified(device: &Device, kern: &AttentionKernel) -> bool {
    if CHECKING.with(|c| c.get()) {
        return true;
    }
    let key = (device.id(), *kern);
    let verdicts = verdicts();
    if let Some(&v) = verdicts.locked().get(&key) {
        return v;
    }
    let ok = match check_native(device, kern) {
        Ok(None) => true,
        Ok(Some(why)) | Err(why) => {
            eprintln!(
                "helios: warning: the native attention kernel {} is not used on this device: \
                 {why}",
                kern.name()
            );
            false
        }
    };
    verdicts.locked().insert(key, ok);
    ok
}

/// The first-use checks' verdicts, per (device, kernel).
fn verdicts() -> &'static std::sync::Mutex<std::collections::HashMap<(usize, AttentionKernel), bool>>
{
    static VERDICTS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<(usize, AttentionKernel), bool>>,
    > = std::sync::OnceLock::new();
    VERDICTS.get_or_init(Default::default)
}

/// Whether `kern` failed its first-use check on `device` (see `native_verified`).
fn native_failed(device: &Device, kern: &AttentionKernel) -> bool {
    let key = (device.id(), *kern);
    verdicts().locked().get(&key) == Some(&false)
}

/// Runs `kern` (a native kernel) on a random 1 × 200 × 2 × D problem with its masks and
/// compares what it writes (O for the forward, dQ for Dq, dK and dV for DkDv) with the f64
/// reference: `Ok(None)` when within the bound, else why not. While the checked kernel
/// runs, the other stages' native kernels pass unchecked (they write nothing compared).
fn check_native(
    device: &Device,
    kern: &AttentionKernel,
) -> std::result::Result<Option<String>, String> {
    use crate::cpu::attention::{self as reference, AttnDims, AttnMask};
    use rand::{Rng, SeedableRng};
    let dtype = match kern.storage {
        Storage::F16 => DType::F16,
        Storage::BF16 => DType::BF16,
        Storage::F32 => DType::F32,
    };
    // Several key blocks and a partial last one; the bound is ~4x the errors measured
    // (forward bf16 4.2e-3, f16 4e-4; backward bf16 4.7e-3, f16 4.7e-4) and well under a
    // wrong kernel's (0.04-0.4). f32 (the unit tests' SIMT kernels) errs near 1e-6.
    let bound = match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 3e-3,
        _ => 1.5e-2,
    };
    let dims = AttnDims {
        b: 1,
        t: 200,
        h: 2,
        d: kern.head_dim as usize,
    };
    let n = dims.b * dims.t * dims.h * dims.d;
    let mut rng = rand::rngs::StdRng::seed_from_u64(36);
    let mut random = || -> Vec<f32> {
        (0..n)
            .map(|_| dtype.round(rng.gen_range(-1.0f32..1.0)))
            .collect()
    };
    let (q, k, v, dout) = (random(), random(), random(), random());
    let lens = [dims.t as u32 - 13];
    let mask = AttnMask {
        causal: kern.causal,
        lens: kern.padded.then_some(&lens[..]),
    };
    let scale = 1.0 / (dims.d as f32).sqrt();
    // A backward kernel starts from the reference's forward: no other kernel is involved,
    // and no call is left free to tune (the check may run inside the tuner's own choice).
    let want_fwd = reference::attention(&q, &k, &v, dims, mask, scale);
    let run = || -> Result<Vec<Vec<f32>>> {
        let shape = [dims.b, dims.t, dims.h, dims.d];
        let up = |x: &[f32]| Tensor::from_slice_as(device, x, &shape, dtype);
        let opts = AttentionOptions {
            causal: kern.causal,
            key_lengths: match kern.padded {
                true => Some(crate::IndexTensor::from_slice(device, &lens, &[1])?),
                false => None,
            },
            ..AttentionOptions::causal()
        };
        let checked = AttentionOptions {
            stage_variant: Some((kern.stage, kern.variant)),
            ..opts.clone()
        };
        let (q, k, v) = (up(&q)?, up(&k)?, up(&v)?);
        crate::no_grad(|| {
            if kern.stage == AttnStage::Forward {
                return Ok(vec![unchecked(|| q.attention(&k, &v, &checked))?
                    .out
                    .to_vec()?]);
            }
            let fwd = AttentionOutput {
                out: up(&want_fwd.0)?,
                lse: Tensor::from_slice(device, &want_fwd.1, &[dims.b, dims.h, dims.t])?,
            };
            // The packed form, which training runs (`attention_qkv`): its JIT is under way
            // by then (`prepare_backward`); the dense one differs in its stores alone.
            let [g, ..] = unchecked(|| q.backward_impl(&k, &v, &fwd, &up(&dout)?, &checked, true))?;
            let [dq, dk, dv] = g.split_qkv()?;
            match kern.stage {
                AttnStage::Dq => Ok(vec![dq.to_vec()?]),
                _ => Ok(vec![dk.to_vec()?, dv.to_vec()?]),
            }
        })
    };
    let got = run().map_err(|e| format!("its check failed to run: {e}"))?;
    let want = match kern.stage {
        AttnStage::Forward => vec![want_fwd.0],
        _ => {
            let [dq, dk, dv] = reference::attention_backward(&q, &k, &v, &dout, dims, mask, scale);
            match kern.stage {
                AttnStage::Dq => vec![dq],
                _ => vec![dk, dv],
            }
        }
    };
    let err = got
        .iter()
        .zip(&want)
        .map(|(g, w)| reference::relative_error(g, w))
        .fold(0.0f64, |a, e| {
            if a.is_nan() || e.is_nan() {
                f64::NAN
            } else {
                a.max(e)
            }
        });
    Ok((err.is_nan() || err > bound)
        .then(|| format!("its output differs from the reference by {err:.2e} (bound {bound:.0e})")))
}

/// Runs `f` with this thread's native kernels passing unchecked: inside a check (see
/// `check_native`), and where the online tuner runs its candidates, whose outputs it
/// compares with the default's and whose winner it checks before keeping it.
pub(super) fn unchecked<T>(f: impl FnOnce() -> T) -> T {
    let was = CHECKING.with(|c| c.replace(true));
    let out = f();
    CHECKING.with(|c| c.set(was));
    out
}

/// Whether `kern` may be chosen on `device` as far as its first-use check goes (run now
/// if it has not run; see `native_verified`).
pub(super) fn first_use_passed(device: &Device, kern: &AttentionKernel) -> bool {
    !checked_on_first_use(device, kern) || native_verified(device, kern)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Variants by stage parse into their stages' places; a bad stage or tag is nothing.
    #[test]
    fn variants_by_stage() {
        let nv = AttnVariant::by_name("nv128x64").unwrap();
        let coop = AttnVariant::by_name("coop32x64").unwrap();
        let per = parse_stages("fwd=nv128x64, dkdv=coop32x64").unwrap();
        assert_eq!(per[stage_index(AttnStage::Forward)], Some(nv));
        assert_eq!(per[stage_index(AttnStage::DkDv)], Some(coop));
        assert_eq!(per[stage_index(AttnStage::Dq)], None);
        assert_eq!(parse_stages("bwd=nv128x64"), None);
        assert_eq!(parse_stages("dq=nv12"), None);
        assert_eq!(parse_stages("dq"), None);
    }

    /// The first-use check runs where calls choose as usual (the defaults, forward and
    /// backward) and where the online tuner settles a class (holding its exploring lock,
    /// on the winner it ran unchecked): every kernel checked passes, and nothing waits for
    /// itself (a backward check once ran a forward free to tune, inside the tuner's lock).
    /// A deadlock fails the test after ten minutes.
    #[test]
    fn first_use_checks_run_inside_the_tuner() {
        use crate::ops::attention::tune::{cached, forget, Class};
        use crate::ops::online::TEST_TUNING;
        use crate::realize_lock::LockExt;
        type Outcome = (
            Vec<(AttentionKernel, bool)>,
            Vec<(AttnStage, String, String)>,
        );
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let run = || -> Result<Outcome> {
                let device = Device::from_env()?;
                TEST_TUNING
                    .locked()
                    .push((device.id(), crate::ops::Tuning::Online));
                CHECK_EVERY.locked().push(device.id());
                let shape = [1, 40, 2, 16];
                let n = shape.iter().product::<usize>();
                let random = |seed: u32| -> Vec<f32> {
                    (0..n as u32)
                        .map(|i| ((i ^ seed).wrapping_mul(2_654_435_761) >> 8) as f32 / 1.6e7 - 0.5)
                        .collect()
                };
                let up = |seed| Tensor::from_slice(&device, &random(seed), &shape);
                let (q, k, v, dout) = (up(1)?, up(2)?, up(3)?, up(4)?);
                let opts = AttentionOptions::causal();
                let stages = [AttnStage::Forward, AttnStage::Dq, AttnStage::DkDv];
                let defaults = stages.map(|s| q.attention_kernel(s, &opts));
                let class = |s| Class::of(q.dtype().storage(), 16, 80, s, &opts);
                for s in stages {
                    forget(&device, class(s));
                }
                for _ in 0..400 {
                    if stages.iter().all(|&s| cached(&device, class(s)).is_some()) {
                        break;
                    }
                    let fwd = q.attention(&k, &v, &opts)?;
                    q.attention_backward(&k, &v, &fwd, &dout, &opts)?
                        .dq
                        .to_vec()?;
                }
                let mut settled = Vec::new();
                for (s, default) in stages.into_iter().zip(defaults) {
                    let won = cached(&device, class(s)).map_or("unsettled".into(), |v| v.tag());
                    settled.push((s, default?, won));
                }
                let verdicts = verdicts()
                    .locked()
                    .iter()
                    .filter(|((id, _), _)| *id == device.id())
                    .map(|((_, kern), &ok)| (*kern, ok))
                    .collect();
                Ok((verdicts, settled))
            };
            let _ = tx.send(run().map_err(|e| e.to_string()));
        });
        let (verdicts, settled) = rx
            .recv_timeout(std::time::Duration::from_secs(600))
            .expect("the calls finished (no deadlock)")
            .expect("the calls ran");
        let checked = |stage, tag: &str| {
            verdicts
                .iter()
                .any(|(k, _)| k.stage == stage && k.variant.tag() == tag)
        };
        for (stage, default, won) in &settled {
            assert!(won != "unsettled", "{stage:?} settled: {settled:?}");
            assert!(
                verdicts.iter().any(|(k, _)| &k.name() == default),
                "{stage:?}: the default {default} was checked ({verdicts:?})"
            );
            assert!(
                checked(*stage, won),
                "{stage:?}: the winner {won} was checked"
            );
        }
        let failed: Vec<String> = verdicts
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(k, _)| k.name())
            .collect();
        assert!(failed.is_empty(), "failed their check: {failed:?}");
    }
}
