//! Hopper's tensor copies: the tensor map (the 128-byte descriptor `cp.async.bulk.tensor`
//! reads), built on the device, and the tiled copy of a box of it into shared memory.
//!
//! The map's bit layout is the driver's and undocumented; CUDA encodes maps on the host
//! (`cuTensorMapEncodeTiled`), which Vulkan does not offer. PTX can set every field of a
//! zeroed map with `tensormap.replace` in shared memory and publish it to global memory with
//! `tensormap.cp_fenceproxy`, so a kernel builds the maps it uses (Triton builds its device-
//! side descriptors the same way) and never needs the layout.

use crate::kernel::Kernel;
use crate::memory::Addr;
use crate::mma::Swizzle;
use crate::types::{Op, Reg, Ty};

/// Bytes of a tensor map, and the alignment it needs in global memory.
pub const TENSOR_MAP_BYTES: u32 = 128;

/// A two-dimensional tensor of 2-byte elements as a tensor map sees it: dimension 0 is
/// contiguous, rows (dimension 1) are `row_bytes` apart, and a copy moves a `box_dims`
/// box (elements) written to shared memory in the `swizzle` layout, zeros past the edges.
#[derive(Clone, Copy, Debug)]
pub struct TensorMap2d {
    /// Global address of element (0, 0) (u64, 16-byte aligned).
    pub base: Reg,
    /// Extent of each dimension in elements (u32 registers).
    pub dims: [Reg; 2],
    /// Bytes between rows (u64, a multiple of 16).
    pub row_bytes: Reg,
    /// Box extent in elements: `box_dims[0] · 2` bytes at most the swizzle's row (16 to 128,
    /// a multiple of 16), each at most 256.
    pub box_dims: [u32; 2],
    pub swizzle: Swizzle,
}

/// A tensor of 2-byte elements of any rank from 1 to 5 as a tensor map sees it: dimension 0
/// is contiguous, dimension `i + 1` is `strides[i]` bytes apart (u64 registers, multiples of
/// 16), and a copy moves a `box_dims` box. Boxes of extent 1 in the upper dimensions let one
/// map cover a strided [B, T, H, D] view whose (T, D) slices are copied as 2D boxes.
#[derive(Clone, Debug)]
pub struct TensorMap {
    pub base: Reg,
    pub dims: Vec<Reg>,
    pub strides: Vec<Reg>,
    pub box_dims: Vec<u32>,
    pub swizzle: Swizzle,
}

impl From<TensorMap2d> for TensorMap {
    fn from(t: TensorMap2d) -> TensorMap {
        TensorMap {
            base: t.base,
            dims: t.dims.to_vec(),
            strides: vec![t.row_bytes],
            box_dims: t.box_dims.to_vec(),
            swizzle: t.swizzle,
        }
    }
}

/// The map fields `tensormap.replace` writes, by their PTX names.
#[derive(Clone, Copy)]
enum Field {
    GlobalAddress,
    Rank,
    BoxDim(u32),
    GlobalDim(u32),
    GlobalStride(u32),
    ElementStride(u32),
    ElemType,
    SwizzleMode,
}

impl Field {
    fn text(self) -> String {
        match self {
            Field::GlobalAddress => "global_address".into(),
            Field::Rank => "rank".into(),
            Field::BoxDim(_) => "box_dim".into(),
            Field::GlobalDim(_) => "global_dim".into(),
            Field::GlobalStride(_) => "global_stride".into(),
            Field::ElementStride(_) => "element_stride".into(),
            Field::ElemType => "elemtype".into(),
            Field::SwizzleMode => "swizzle_mode".into(),
        }
    }

    const fn ordinal(self) -> Option<u32> {
        match self {
            Field::BoxDim(i)
            | Field::GlobalDim(i)
            | Field::GlobalStride(i)
            | Field::ElementStride(i) => Some(i),
            _ => None,
        }
    }
}

/// `swizzle_mode`'s values: none, 32, 64, 128 bytes.
const fn swizzle_mode(s: Swizzle) -> u32 {
    match s {
        Swizzle::None => 0,
        Swizzle::B32 => 1,
        Swizzle::B64 => 2,
        Swizzle::B128 => 3,
    }
}

/// `elemtype`'s value for 16-bit elements (`.u16`: a copy moves bits, f16 and bf16 alike).
const ELEMTYPE_U16: u32 = 1;

impl Kernel {
    /// One `tensormap.replace`; `value` is a register, or an immediate (which the mode
    /// fields require) written as a b32.
    fn tensormap_replace(&mut self, map: Reg, field: Field, value: impl Into<Op>) {
        let ord = field
            .ordinal()
            .map(|i| format!(", {i}"))
            .unwrap_or_default();
        let value = value.into();
        let ty = match value {
            Op::Reg(r) if r.ty().bytes() == 8 => "b64",
            _ => "b32",
        };
        self.emit(format_args!(
            "tensormap.replace.tile.{}.shared::cta.b1024.{ty} [{map}]{ord}, {value}",
            field.text()
        ));
    }

    /// Writes the fields of `t` into the zeroed 128-byte tensor map at shared address `map`
    /// (u32, 128-byte aligned). One thread runs it; the map's other fields stay zero (no
    /// interleave, zero fill, 16-byte swizzle atoms).
    pub fn tensormap_build(&mut self, map: Reg, t: &TensorMap2d) {
        self.tensormap_build_nd(map, &TensorMap::from(*t));
    }

    /// [`tensormap_build`](Kernel::tensormap_build) for a map of any rank from 1 to 5.
    pub fn tensormap_build_nd(&mut self, map: Reg, t: &TensorMap) {
        if !self.require(self.target.has_tensormap(), "tensormap.replace") {
            return;
        }
        let rank = t.dims.len();
        if !(1..=5).contains(&rank) || t.box_dims.len() != rank || t.strides.len() + 1 != rank {
            self.fail(format!(
                "tensor map of {rank} dims, {} box dims and {} strides",
                t.box_dims.len(),
                t.strides.len()
            ));
            return;
        }
        let b0 = t.box_dims[0];
        let inner = b0 * 2;
        let swizzle_fits = t.swizzle == Swizzle::None || inner <= t.swizzle.row_bytes();
        let boxes_fit = t.box_dims[1..].iter().all(|b| (1..=256).contains(b));
        if inner % 16 != 0 || b0 > 256 || !boxes_fit || !swizzle_fits {
            self.fail(format!(
                "tensor map box {:?} with {:?}",
                t.box_dims, t.swizzle
            ));
            return;
        }
        let base = t.base.retype(Ty::B64);
        self.tensormap_replace(map, Field::GlobalAddress, base);
        // The rank field holds the rank less one.
        self.tensormap_replace(map, Field::Rank, rank as u32 - 1);
        for (i, (&dim, &bx)) in t.dims.iter().zip(&t.box_dims).enumerate() {
            let i = i as u32;
            self.tensormap_replace(map, Field::GlobalDim(i), dim.retype(Ty::B32));
            self.tensormap_replace(map, Field::BoxDim(i), bx);
            self.tensormap_replace(map, Field::ElementStride(i), 1u32);
        }
        // Strides of the dimensions above the first, in bytes.
        for (i, &s) in t.strides.iter().enumerate() {
            self.tensormap_replace(map, Field::GlobalStride(i as u32), s.retype(Ty::B64));
        }
        self.tensormap_replace(map, Field::ElemType, ELEMTYPE_U16);
        self.tensormap_replace(map, Field::SwizzleMode, swizzle_mode(t.swizzle));
    }

    /// Copies the tensor map at shared `src` to global `dst` (u64, 128-byte aligned) and
    /// releases it to the tensor-map proxy. The whole warp runs it (`.sync.aligned`).
    pub fn tensormap_publish(&mut self, dst: Reg, src: Reg) {
        if self.require(self.target.has_tensormap(), "tensormap.cp_fenceproxy") {
            self.emit(format_args!(
                "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [{dst}], [{src}], {TENSOR_MAP_BYTES}"
            ));
        }
    }

    /// Acquires the tensor map at global `map` in the tensor-map proxy: needed once by a
    /// block before its copies read a map written in this kernel.
    pub fn tensormap_acquire(&mut self, map: Reg) {
        if !self.require(self.target.has_tensormap(), "fence.proxy.tensormap") {
            return;
        }
        self.emit(format_args!(
            "fence.proxy.tensormap::generic.acquire.gpu [{map}], {TENSOR_MAP_BYTES}"
        ));
        // An empty bulk group waited on after the fence: ptxas has been seen to drop the
        // fence's ordering without one (Triton works around it the same way).
        self.bulk_commit();
        self.bulk_wait(0);
    }

    /// `cp.async.bulk.tensor` of the box at element coordinates `coords` (s32: dimension 0,
    /// then 1) of the map at global `map` into shared `dst` (128-byte aligned; 1024 for the
    /// 128-byte swizzle), completing as transactions of the box's full size on `bar`.
    pub fn tensor_load_2d(&mut self, dst: Addr, map: Reg, coords: [Reg; 2], bar: Addr) {
        self.tensor_load(dst, map, &coords, bar);
    }

    /// [`tensor_load_2d`](Kernel::tensor_load_2d) for a map of any rank (one coordinate per
    /// dimension).
    pub fn tensor_load(&mut self, dst: Addr, map: Reg, coords: &[Reg], bar: Addr) {
        if !(1..=5).contains(&coords.len()) {
            self.fail(format!("a tensor copy with {} coordinates", coords.len()));
            return;
        }
        if self.require(self.target.has_bulk(), "cp.async.bulk.tensor") {
            let c: Vec<String> = coords
                .iter()
                .map(|c| c.retype(Ty::S32).to_string())
                .collect();
            self.emit(format_args!(
                "cp.async.bulk.tensor.{}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes {dst}, [{map}, {{{}}}], {bar}",
                coords.len(),
                c.join(", ")
            ));
        }
    }

    /// Makes this thread's `mbarrier.init`s visible to the other threads and to the async
    /// proxy (bulk copies completing on them) before a barrier publishes them.
    pub fn fence_mbarrier_init(&mut self) {
        if self.require(self.target.has_bulk(), "fence.mbarrier_init") {
            self.emit(format_args!("fence.mbarrier_init.release.cluster"));
        }
    }

    /// Synchronises the threads of this warp (and orders their shared-memory accesses).
    pub fn warp_sync(&mut self) {
        self.emit(format_args!("bar.warp.sync -1"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Special;
    use crate::types::Target;

    fn map(k: &mut Kernel, box_dims: [u32; 2], swizzle: Swizzle) -> (Reg, TensorMap2d) {
        let smem = k.mov(Ty::U32, 0u32);
        let base = k.mov(Ty::U64, 0u32);
        let d0 = k.special(Special::NTidX);
        let row_bytes = k.mov(Ty::U64, 4096u32);
        let t = TensorMap2d {
            base,
            dims: [d0, d0],
            row_bytes,
            box_dims,
            swizzle,
        };
        (smem, t)
    }

    #[test]
    fn a_map_sets_every_field_a_copy_reads() {
        let mut k = Kernel::new("maps", Target::SM90A);
        let (smem, t) = map(&mut k, [32, 128], Swizzle::B64);
        k.tensormap_build(smem, &t);
        let text = k.finish().unwrap().text;
        for field in [
            "global_address.shared::cta.b1024.b64",
            "rank.shared::cta.b1024.b32 [%r0], 1;",
            "box_dim.shared::cta.b1024.b32 [%r0], 0, 32;",
            "box_dim.shared::cta.b1024.b32 [%r0], 1, 128;",
            "global_stride.shared::cta.b1024.b64 [%r0], 0,",
            "elemtype.shared::cta.b1024.b32 [%r0], 1;",
            "swizzle_mode.shared::cta.b1024.b32 [%r0], 2;",
        ] {
            assert!(text.contains(field), "{field} missing:\n{text}");
        }
    }

    #[test]
    fn maps_need_hopper_and_boxes_must_fit_the_swizzle() {
        let mut k = Kernel::new("maps", Target::SM90);
        let (smem, t) = map(&mut k, [32, 128], Swizzle::B64);
        k.tensormap_build(smem, &t);
        assert!(k.finish().unwrap_err().to_string().contains("tensormap"));
        // 64 bf16 per row are 128 bytes: wider than the 64-byte swizzle's rows.
        let mut k = Kernel::new("maps", Target::SM90A);
        let (smem, t) = map(&mut k, [64, 128], Swizzle::B64);
        k.tensormap_build(smem, &t);
        assert!(k.finish().is_err());
    }
}
