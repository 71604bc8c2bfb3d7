//! Launch geometry and push-constant packing shared by every kernel family.
//!
//! Kernels index work linearly; the grid is folded into two dimensions so that any size fits
//! under `maxComputeWorkGroupCount[0]` (65535 on many devices, lavapipe included).

use helios_spirv::{ParamInfo, ParamSlot, Scalar, Ty};

use crate::KernelError;

/// What a dispatch needs besides the pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub groups: [u32; 3],
    pub push: Vec<u8>,
}

/// Workgroups along x before the grid wraps into y.
pub const MAX_GROUPS_X: u32 = 65535;

/// A 2-D grid holding at least `groups` workgroups.
pub fn grid(groups: u64) -> Result<[u32; 3], KernelError> {
    if groups == 0 {
        return Ok([0, 1, 1]);
    }
    let x = groups.min(MAX_GROUPS_X as u64);
    let y = groups.div_ceil(x);
    if y > MAX_GROUPS_X as u64 {
        return Err(KernelError::TooLarge {
            what: "grid",
            size: groups,
        });
    }
    Ok([x as u32, y as u32, 1])
}

/// One push-constant argument, in declaration order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A buffer's device address.
    Address(u64),
    U32(u32),
    I32(i32),
    F32(f32),
}

/// Packs `args` into the push-constant block described by `params`, checking that each
/// argument matches its parameter.
pub fn pack_push(
    kernel: &str,
    params: &[ParamInfo],
    size: u32,
    args: &[Arg],
) -> Result<Vec<u8>, KernelError> {
    let mismatch = |detail: String| KernelError::Arguments {
        kernel: kernel.to_string(),
        detail,
    };
    let slots = params
        .iter()
        .filter(|p| !matches!(p.slot, ParamSlot::Descriptor { .. }));
    let expected = slots.clone().count();
    if expected != args.len() {
        return Err(mismatch(format!(
            "expects {expected} push-constant arguments, got {}",
            args.len()
        )));
    }
    // One allocation per launch: this runs for every op.
    let mut out = vec![0u8; size as usize];
    let mut put = |offset: u32, bytes: &[u8]| {
        let at = offset as usize;
        out[at..at + bytes.len()].copy_from_slice(bytes);
    };
    let u32_ty = Ty::scalar(Scalar::U32);
    let i32_ty = Ty::scalar(Scalar::I32);
    let f32_ty = Ty::scalar(Scalar::F32);
    for (p, a) in slots.zip(args) {
        match (&p.slot, a) {
            (ParamSlot::Address { offset }, Arg::Address(v)) => put(*offset, &v.to_le_bytes()),
            (ParamSlot::Value { offset, ty }, Arg::U32(v)) if *ty == u32_ty => {
                put(*offset, &v.to_le_bytes())
            }
            (ParamSlot::Value { offset, ty }, Arg::I32(v)) if *ty == i32_ty => {
                put(*offset, &v.to_le_bytes())
            }
            (ParamSlot::Value { offset, ty }, Arg::F32(v)) if *ty == f32_ty => {
                put(*offset, &v.to_le_bytes())
            }
            _ => {
                return Err(mismatch(format!(
                    "parameter `{}` ({:?}) cannot take {a:?}",
                    p.name, p.slot
                )))
            }
        }
    }
    Ok(out)
}
