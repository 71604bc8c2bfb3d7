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
    /// The device's `maxComputeWorkGroupCount[0]`.
    pub max_groups_x: u32,
}

/// Workgroups along y every Vulkan device accepts (the spec's minimum for
/// maxComputeWorkGroupCount).
pub const MIN_GROUPS_LIMIT: u32 = 65535;

/// A grid of at least `groups` workgroups, `max_x` at most along x (the device's
/// `maxComputeWorkGroupCount[0]`: 65535 on many devices, 2^31−1 on NVIDIA). Rows are balanced
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

    fn param(name: &str, slot: ParamSlot) -> ParamInfo {
        ParamInfo {
            name: name.into(),
            slot,
            access: None,
        }
    }

    /// Arguments land at their parameters' offsets, little-endian, descriptors skipped; a
    /// wrong count, a wrong type or an offset past the block is an error, not a panic.
    #[test]
    fn push_constants_pack_at_their_offsets() {
        let params = [
            param("a", ParamSlot::Address { offset: 0 }),
            param("d", ParamSlot::Descriptor { binding: 0 }),
            param(
                "n",
                ParamSlot::Value {
                    offset: 8,
                    ty: Ty::scalar(Scalar::U32),
                },
            ),
            param(
                "s",
                ParamSlot::Value {
                    offset: 12,
                    ty: Ty::scalar(Scalar::F32),
                },
            ),
            param(
                "i",
                ParamSlot::Value {
                    offset: 16,
                    ty: Ty::scalar(Scalar::I32),
                },
            ),
        ];
        let args = [
            Arg::Address(0x0102_0304_0506_0708),
            Arg::U32(7),
            Arg::F32(1.5),
            Arg::I32(-2),
        ];
        let out = pack_push("k", &params, 24, &args).unwrap();
        let mut want = vec![0u8; 24];
        want[..8].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        want[8..12].copy_from_slice(&7u32.to_le_bytes());
        want[12..16].copy_from_slice(&1.5f32.to_le_bytes());
        want[16..20].copy_from_slice(&(-2i32).to_le_bytes());
        assert_eq!(out.as_slice(), want.as_slice());
        // A block larger than the inline capacity.
        let big = pack_push("k", &params, 300, &args).unwrap();
        assert_eq!(&big[..24], want.as_slice());
        assert_eq!(big.len(), 300);
        let refused = |r: Result<PushBytes, KernelError>| {
            assert!(matches!(r, Err(KernelError::Arguments { .. })), "{r:?}");
        };
        refused(pack_push("k", &params, 24, &args[..3]));
        let mut more = args.to_vec();
        more.push(Arg::U32(1));
        refused(pack_push("k", &params, 24, &more));
        let mut wrong = args;
        wrong[1] = Arg::F32(7.0);
        refused(pack_push("k", &params, 24, &wrong));
        refused(pack_push("k", &params, 18, &args));
    }

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
///
/// This runs for every dispatch recorded, so it writes each argument with a copy of a
/// constant size (a copy of a run-time length was a `memcpy` call per argument) into a
/// zeroed inline block.
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
    let count_mismatch = || {
        let expected = params
            .iter()
            .filter(|p| !matches!(p.slot, ParamSlot::Descriptor { .. }))
            .count();
        mismatch(format!(
            "expects {expected} push-constant arguments, got {}",
            args.len()
        ))
    };
    let size = size as usize;
    let mut out: PushBytes = match size <= 256 {
        true => PushBytes::from_buf_and_len([0; 256], size),
        false => PushBytes::from_vec(vec![0; size]),
    };
    let u32_ty = Ty::scalar(Scalar::U32);
    let i32_ty = Ty::scalar(Scalar::I32);
    let f32_ty = Ty::scalar(Scalar::F32);
    let mut next = args.iter();
    for p in params {
        if matches!(p.slot, ParamSlot::Descriptor { .. }) {
            continue;
        }
        let Some(a) = next.next() else {
            return Err(count_mismatch());
        };
        let written = match (&p.slot, a) {
            (ParamSlot::Address { offset }, Arg::Address(v)) => {
                put(&mut out, *offset, v.to_le_bytes())
            }
            (ParamSlot::Value { offset, ty }, Arg::U32(v)) if *ty == u32_ty => {
                put(&mut out, *offset, v.to_le_bytes())
            }
            (ParamSlot::Value { offset, ty }, Arg::I32(v)) if *ty == i32_ty => {
                put(&mut out, *offset, v.to_le_bytes())
            }
            (ParamSlot::Value { offset, ty }, Arg::F32(v)) if *ty == f32_ty => {
                put(&mut out, *offset, v.to_le_bytes())
            }
            _ => false,
        };
        if !written {
            return Err(mismatch(format!(
                "parameter `{}` ({:?}) cannot take {a:?} in a {size}-byte block",
                p.name, p.slot
            )));
        }
    }
    if next.next().is_some() {
        return Err(count_mismatch());
    }
    Ok(out)
}

/// Writes `bytes` at byte `offset` of `out` (a copy of constant size); false where they do
/// not fit.
fn put<const N: usize>(out: &mut [u8], offset: u32, bytes: [u8; N]) -> bool {
    match out
        .get_mut(offset as usize..)
        .and_then(|rest| rest.first_chunk_mut::<N>())
    {
        Some(to) => {
            *to = bytes;
            true
        }
        None => false,
    }
}
