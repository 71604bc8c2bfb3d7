//! The family's one selection function, `choose`, and its per-process memo (the order of
//! precedence is in the module docs of `matmul_tune`).

use std::sync::Mutex;

use helios_kernels::matmul::default_variant;
use helios_kernels::{MatmulKernel, MatmulVariant};
use helios_vk::DeviceType;

use super::cache::{cached, class_key};
use super::caps::matmul_caps;
use super::tune::tune;
use crate::ops::matmul::{Plan, Problem};
use crate::realize_lock::LockExt;
use crate::{DType, Device, Error, Result};

/// How a kernel was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// `MatmulOverrides::variant`.
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

fn invalid(detail: String) -> Error {
    Error::Invalid {
        op: "matmul",
        detail,
    }
}

/// `HELIOS_MATMUL_VARIANT`: a variant name from `helios_kernels::matmul::VARIANTS`, or a
/// cooperative tile outside it in the same grammar (`MatmulVariant::parse`).
fn env_variant() -> Result<Option<MatmulVariant>> {
    let Some(name) = crate::env::matmul_variant() else {
        return Ok(None);
    };
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
    crate::env::matmul_tune()
        .unwrap_or_else(|| device.context().caps().device_type != DeviceType::Cpu)
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
