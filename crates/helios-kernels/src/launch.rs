//! Launch geometry and push-constant packing shared by every kernel family.
//!
//! Kernels index work linearly; the grid is folded into two dimensions so that any size fits
//! under `maxComputeWorkGroupCount[0]` (65535 on many devices, lavapipe included).

use helios_spirv::{ParamInfo, ParamSlot, Scalar, Ty};

use crate::KernelError;

/// A packed push-constant block, inline up to 256 bytes (what NVIDIA, AMD and lavapipe
/// offer): packing runs for every dispatch recorded, and a heap block per dispatch was a
/// malloc and a free on the recording thread.
pub type PushBytes = smallvec::SmallVec<[u8; 256]>;

/// The arguments of one launch, inline up to 24 (a matmul with every epilogue buffer has 23).
pub type Args = smallvec::SmallVec<[Arg; 24]>;

/// What a dispatch needs besides the pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub groups: [u32; 3],
    pub push: PushBytes,
}

/// How a kernel's invocations are grouped on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Invocations per workgroup (along x).
    pub workgroup: u32,
    /// The device's maxComputeWorkGroupCount[0].
    pub max_groups_x: u32,
}

/// Workgroups along y every Vulkan device accepts (the spec's minimum for
/// maxComputeWorkGroupCount).
pub const MIN_GROUPS_LIMIT: u32 = 65535;

/// A grid of at least `groups` workgroups, `max_x` at most along x (the device's
/// maxComputeWorkGroupCount[0]: 65535 on many devices, 2^31−1 on NVIDIA). Rows are balanced
/// so that at most `rows − 1` workgroups are spare: a naive 65535 × 2 grid for 65536 groups
/// would launch twice the work.
pub fn grid(groups: u64, max_x: u32) -> Result<[u32; 3], KernelError> {
    if groups == 0 {
        return Ok([0, 1, 1]);
    }
    let max_x = u64::from(max_x.max(1));
    let rows = groups.div_ceil(max_x);
    if rows > u64::from(MIN_GROUPS_LIMIT) {
        return Err(KernelError::TooLarge {
            what: "grid",
            size: groups,
        });
    }
    let x = groups.div_ceil(rows);
    Ok([x as u32, rows as u32, 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_are_balanced() {
        assert_eq!(grid(0, 65535).unwrap(), [0, 1, 1]);
        assert_eq!(grid(7, 65535).unwrap(), [7, 1, 1]);
        assert_eq!(grid(65536, 65535).unwrap(), [32768, 2, 1]);
        assert_eq!(grid(65536, u32::MAX >> 1).unwrap(), [65536, 1, 1]);
        let [x, y, _] = grid(1_000_003, 65535).unwrap();
        assert!(u64::from(x) * u64::from(y) >= 1_000_003);
        assert!(u64::from(x) * u64::from(y) - 1_000_003 < u64::from(y));
        assert!(grid(65535 * 65536, 65535).is_err());
    }
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
) -> Result<PushBytes, KernelError> {
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
    let mut out: PushBytes = smallvec::smallvec![0u8; size as usize];
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
