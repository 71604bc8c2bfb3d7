//! Tensor maps of the native (PTX) kernels: a block's producer warp builds its two maps in
//! shared memory and publishes them to its SM's slot of a device workspace, which the copy
//! engine reads them from.
//!
//! A map must sit in global memory. Each block writes to the slot of the SM it runs on
//! (`%smid`): a native block fills its SM's registers and most of its shared memory, so no
//! two blocks of a launch share an SM at a time, and native launches never overlap (each
//! declares a write to the workspace).

use helios_ptx::{Addr, Cmp, Kernel, Reg, Space, Special, TensorMap, Ty};

/// Slots in the workspace, one per SM id, and their size: two 128-byte maps.
pub(crate) const MAP_SLOTS: u32 = 1024;
pub(crate) const MAP_SLOT_BYTES: u32 = 256;

/// Bytes of the tensor maps' part of the workspace native launches pass (`maps`).
pub const NATIVE_MAPS_BYTES: u64 = MAP_SLOTS as u64 * MAP_SLOT_BYTES as u64;

/// Stream-K matmuls (`matmul::native::stream`) use the rest: after the maps a u32 flag per
/// block (zero between launches), then each block's f32 partial tile (up to the largest
/// stream tile's).
pub(crate) const STREAM_FLAGS_BYTES: u64 = MAP_SLOTS as u64 * 4;
pub(crate) const STREAM_SLOT_BYTES: u64 = 256 * 192 * 4;

/// Bytes of the whole workspace on a device of `sms` SMs, to be zeroed once when made.
pub fn native_workspace_bytes(sms: u32) -> u64 {
    NATIVE_MAPS_BYTES + STREAM_FLAGS_BYTES + u64::from(sms.min(MAP_SLOTS)) * STREAM_SLOT_BYTES
}

/// Run by the 32 lanes of the producer warp (`lane` its lane id): zeroes the 256 bytes at
/// shared `smem`, has lane 0 write `maps` into them, publishes them to this SM's slot of the
/// workspace at `workspace` and acquires them for the copies; returns their global addresses.
pub(crate) fn publish(
    k: &mut Kernel,
    lane: Reg,
    smem: Reg,
    workspace: Reg,
    maps: [&TensorMap; 2],
) -> [Reg; 2] {
    let word = k.shl(lane, 2u32);
    let at = k.add(smem, word);
    let zero = k.mov(Ty::U32, 0u32);
    k.st(Space::Shared, Addr::new(at), zero);
    k.st(Space::Shared, Addr::at(at, 128), zero);
    k.warp_sync();
    let lane0 = k.setp(Cmp::Eq, lane, 0u32);
    let second = k.add(smem, 128u32);
    k.if_(lane0, |k| {
        k.tensormap_build_nd(smem, maps[0]);
        k.tensormap_build_nd(second, maps[1]);
    });
    k.warp_sync();
    let sm = k.special(Special::SmId);
    let slot = k.rem(sm, MAP_SLOTS);
    let off = k.mul_wide(slot, MAP_SLOT_BYTES);
    let first = k.add(workspace, off);
    let other = k.add(first, 128u32);
    k.tensormap_publish(first, smem);
    k.tensormap_publish(other, second);
    k.tensormap_acquire(first);
    k.tensormap_acquire(other);
    [first, other]
}
