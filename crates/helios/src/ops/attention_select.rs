//! Which attention kernel runs: the family's one selection function (`choose`; the order is
//! in `attention`'s module docs), the cooperative-fragment layout probe it relies on, and
//! `HELIOS_ATTN_VARIANT`.

use helios_kernels::attention::{AttentionKernel, AttnStage, AttnVariant};
use helios_kernels::rows::Reducer;
use helios_kernels::Storage;

use super::attention::{invalid, AttentionOptions, Dims};
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
    let coop = match storage {
        Storage::F16 => caps.coop_f16,
        Storage::BF16 => caps.coop_bf16,
        Storage::F32 => false,
    } && caps.subgroup == 32
        && env_variant() != Some(Forced::Simt);
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
    let fits = |kern: &AttentionKernel| {
        kern.buildable()
            && kern.shared_bytes() <= caps.max_shared_bytes
            && kern.workgroup() <= caps.max_invocations
            && (!kern.variant.is_coop()
                || (coop && aligned && helios_kernels::attention::coop_supports(kern.stage)))
            && (!kern.variant.is_native()
                || (kern.native_feasible(native)
                    && aligned
                    && positive
                    && native_verified(device, kern)))
    };
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
        // The register Dq computes Dsum itself (no Prep pass).
        let plain = AttentionKernel {
            own_dsum: stage == AttnStage::Dq && plain.in_registers(),
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
    // A forced cooperative or native variant applies to the stages that family has. A
    // native one forced for every stage applies to the forward; its backward kernels (not
    // measured yet) run only where asked for by stage.
    let by_stage = stage_forced.is_some() && opts.variant.is_none();
    let forced = forced.filter(|v| {
        (!v.is_coop() || helios_kernels::attention::coop_supports(stage))
            && (!v.is_native() || stage == AttnStage::Forward || by_stage)
    });
    if let Some(v) = forced {
        let kern = make(v);
        if !fits(&kern) {
            let why = match native_failed(device, &kern) {
                true => "its first-use check against the reference failed here (the warning \
                         above says by how much)"
                    .to_string(),
                false => format!(
                    "shared memory {} of {} bytes, cooperative matrices {}",
                    kern.shared_bytes(),
                    caps.max_shared_bytes,
                    if coop { "available" } else { "unavailable" }
                ),
            };
            return Err(invalid(format!(
                "variant {} does not fit this device for {} ({why})",
                v.tag(),
                kern.name()
            )));
        }
        return Ok(kern);
    }
    if let Some(v) = super::attention_tune::cached(
        device,
        super::attention_tune::Class::of(storage, dims.d, dims.b * dims.t * dims.h, stage, opts),
    ) {
        let kern = make(v);
        if fits(&kern) {
            return Ok(kern);
        }
    }
    let coop_stage = coop && helios_kernels::attention::coop_supports(stage) && aligned;
    let mut candidates = Vec::new();
    // Where the device has native kernels, the native forward first (measured faster than
    // the cooperative one at every tuned shape: bench/results/2026-11-29-native-attention-h200.md).
    if coop_stage && stage == AttnStage::Forward && native.is_some() {
        candidates.extend(helios_kernels::attention::NATIVE_VARIANTS);
    }
    candidates.extend(helios_kernels::attention::default_order(
        stage,
        coop_stage,
        frag.is_some(),
    ));
    candidates
        .into_iter()
        .map(make)
        .find(|k| fits(k))
        .ok_or_else(|| {
            invalid(format!(
                "no attention kernel for head dim {} fits this device's {} bytes of shared memory",
                dims.d, caps.max_shared_bytes
            ))
        })
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
}

thread_local! {
    /// Set while this thread runs a native kernel's first-use check (its own calls pass).
    static CHECKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether native attention kernel `kern` gave the reference's results on this device: the
/// forward is checked on its first use, per device and kernel, against the f64 CPU
/// reference on a small random problem (a driver's compiler once reused registers a kernel
/// still needed and gave wrong results: bench/results/2026-11-29-native-attention-h200.md).
/// A kernel that fails is not chosen again, and a warning says so. The backward kernels,
/// reached only when forced by stage, are not checked.
fn native_verified(device: &Device, kern: &AttentionKernel) -> bool {
    if kern.stage != AttnStage::Forward || CHECKING.with(|c| c.get()) {
        return true;
    }
    let key = (device.id(), *kern);
    let verdicts = verdicts();
    if let Some(&v) = verdicts.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return v;
    }
    CHECKING.with(|c| c.set(true));
    let checked = check_native_forward(device, kern);
    CHECKING.with(|c| c.set(false));
    let ok = match checked {
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
    verdicts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, ok);
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
    verdicts()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        == Some(&false)
}

/// Runs `kern` (a native forward) on a random 1 × 200 × 2 × D problem with its masks and
/// compares O with the f64 reference: `Ok(None)` when within the bound, else why not.
fn check_native_forward(
    device: &Device,
    kern: &AttentionKernel,
) -> std::result::Result<Option<String>, String> {
    use crate::cpu::attention::{self as reference, AttnDims, AttnMask};
    use rand::{Rng, SeedableRng};
    let dtype = match kern.storage {
        Storage::F16 => DType::F16,
        Storage::BF16 => DType::BF16,
        Storage::F32 => return Ok(Some("an f32 native kernel".into())),
    };
    // Several key blocks and a partial last one; the bound is ~4x the errors measured
    // (bf16 4.2e-3, f16 4e-4) and well under a wrong kernel's (0.04-0.4).
    let bound = match dtype {
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
    let (q, k, v) = (random(), random(), random());
    let lens = [dims.t as u32 - 13];
    let run = || -> Result<Vec<f32>> {
        let shape = [dims.b, dims.t, dims.h, dims.d];
        let up = |x: &[f32]| Tensor::from_slice_as(device, x, &shape, dtype);
        let opts = AttentionOptions {
            causal: kern.causal,
            key_lengths: match kern.padded {
                true => Some(crate::IndexTensor::from_slice(device, &lens, &[1])?),
                false => None,
            },
            stage_variant: Some((AttnStage::Forward, kern.variant)),
            ..AttentionOptions::causal()
        };
        crate::no_grad(|| up(&q)?.attention(&up(&k)?, &up(&v)?, &opts)?.out.to_vec())
    };
    let got = run().map_err(|e| format!("its check failed to run: {e}"))?;
    let mask = AttnMask {
        causal: kern.causal,
        lens: kern.padded.then_some(&lens[..]),
    };
    let scale = 1.0 / (dims.d as f32).sqrt();
    let (want, _) = reference::attention(&q, &k, &v, dims, mask, scale);
    let err = reference::relative_error(&got, &want);
    Ok((err.is_nan() || err > bound)
        .then(|| format!("its output differs from the reference by {err:.2e} (bound {bound:.0e})")))
}
