//! Memory: buffer loads and stores (scalar or 2/4-lane vectors), workgroup-shared arrays,
//! barriers and atomics (integer add, and f32 add through SPV_EXT_shader_atomic_float_add).
//!
//! A buffer is declared with its scalar element type; a load or store names a vector width
//! and indexes in units of that width, so `load(buf, i, 4)` reads elements 4i..4i+3 as one
//! 16-byte access. With buffer device addresses every access carries an explicit alignment
//! (the access size), as SPIR-V requires for physical pointers.

use rspirv::dr::Operand;
use rspirv::spirv::{Capability, MemoryAccess, MemorySemantics, Op, Scope, StorageClass, Word};

use crate::builder::{id, Buffer, KernelBuilder};
use crate::types::{Scalar, Ty, Val};

/// A workgroup-shared array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shared {
    var: Word,
    pub elem: Ty,
}

/// The length of a shared array: fixed, or the workgroup size along x times a factor (a
/// specialization constant, so one SPIR-V module serves every workgroup size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedLen {
    Fixed(u32),
    WorkgroupX,
}

impl KernelBuilder {
    fn access_operands(&self, align: u32) -> Vec<Operand> {
        if self.binding() == crate::Binding::DeviceAddress {
            vec![
                Operand::MemoryAccess(MemoryAccess::ALIGNED),
                Operand::LiteralBit32(align),
            ]
        } else {
            Vec::new()
        }
    }

    /// Loads vector `index` (in units of `lanes` elements) of `buf`.
    #[track_caller]
    pub fn load(&mut self, buf: Buffer, index: Val, lanes: u8) -> Val {
        let (ptr, align) = self.element_pointer(buf, lanes, index);
        let ty = Ty::vector(buf.elem, lanes);
        let ty_id = self.ty(ty);
        let mut ops = vec![id(ptr)];
        ops.extend(self.access_operands(align));
        let rid = self.inst(Op::Load, Some(ty_id), ops);
        Val { id: rid, ty }
    }

    /// Stores `value` (scalar or 2/4-lane vector of the buffer's element type) at vector
    /// `index`.
    #[track_caller]
    pub fn store(&mut self, buf: Buffer, index: Val, value: Val) {
        self.assert_writable(buf);
        assert!(
            value.ty.scalar == buf.elem,
            "store of {} into a buffer of {}",
            value.ty,
            buf.elem.name()
        );
        let (ptr, align) = self.element_pointer(buf, value.ty.lanes, index);
        let mut ops = vec![id(ptr), value.into()];
        ops.extend(self.access_operands(align));
        self.inst_void(Op::Store, ops);
    }

    /// Atomically adds `value` (u32 or i32) to element `index` of `buf`; returns the old value.
    #[track_caller]
    pub fn atomic_add(&mut self, buf: Buffer, index: Val, value: Val) -> Val {
        self.assert_writable(buf);
        assert!(
            matches!(buf.elem, Scalar::U32 | Scalar::I32) && value.ty == Ty::scalar(buf.elem),
            "atomic_add needs a u32/i32 buffer and value"
        );
        self.atomic_rmw(Op::AtomicIAdd, buf, index, value)
    }

    /// Atomically adds `value` (f32) to element `index` of an f32 buffer (device scope,
    /// relaxed); returns the old value. Emits `OpAtomicFAddEXT`, so the device must have
    /// VK_EXT_shader_atomic_float's shaderBufferFloat32AtomicAdd enabled
    /// (`EnabledFeatures::shader_buffer_float32_atomic_add` in helios-vk). The order of
    /// concurrent adds is unspecified, so sums are exact only where every partial sum is.
    #[track_caller]
    pub fn atomic_fadd(&mut self, buf: Buffer, index: Val, value: Val) -> Val {
        self.assert_writable(buf);
        assert!(
            buf.elem == Scalar::F32 && value.ty == Ty::scalar(Scalar::F32),
            "atomic_fadd needs an f32 buffer and value, got {} into {}",
            value.ty,
            buf.elem.name()
        );
        self.capability(Capability::AtomicFloat32AddEXT);
        self.extension("SPV_EXT_shader_atomic_float_add");
        self.atomic_rmw(Op::AtomicFAddEXT, buf, index, value)
    }

    /// `op` (an atomic read-modify-write) of `value` on element `index` of `buf`, device
    /// scope, relaxed; returns the old value.
    fn atomic_rmw(&mut self, op: Op, buf: Buffer, index: Val, value: Val) -> Val {
        let (ptr, _) = self.element_pointer(buf, 1, index);
        let scope = self.device_scope();
        let sem = self.const_u32(MemorySemantics::RELAXED.bits());
        let ty = self.ty(value.ty);
        let rid = self.inst(
            op,
            Some(ty),
            vec![id(ptr), id(scope), id(sem), value.into()],
        );
        Val {
            id: rid,
            ty: value.ty,
        }
    }

    /// The `Device` scope constant, noting its use (`finish` adds the capability the Vulkan
    /// memory model needs for it).
    fn device_scope(&mut self) -> Word {
        self.device_scope = true;
        self.const_u32(Scope::Device as u32)
    }

    /// Declares a workgroup-shared array of `elem`.
    pub fn shared_array(&mut self, elem: Ty, len: SharedLen) -> Shared {
        self.arith_caps(elem.scalar);
        let elem_id = self.ty(elem);
        let len_id = match len {
            SharedLen::Fixed(n) => self.const_u32(n),
            SharedLen::WorkgroupX => self.workgroup_size_x().id,
        };
        let arr = self.b.type_array(elem_id, len_id);
        let ptr = self.b.type_pointer(None, StorageClass::Workgroup, arr);
        let var = self.global_variable(ptr, StorageClass::Workgroup);
        Shared { var, elem }
    }

    pub(crate) fn shared_ptr(&mut self, arr: Shared, index: Val) -> Word {
        assert!(
            index.ty.scalar.is_int() && index.ty.lanes == 1,
            "index must be an integer"
        );
        let ptr_ty = self.ptr_ty(StorageClass::Workgroup, arr.elem);
        self.inst(
            Op::AccessChain,
            Some(ptr_ty),
            vec![id(arr.var), index.into()],
        )
    }

    pub fn shared_load(&mut self, arr: Shared, index: Val) -> Val {
        let ptr = self.shared_ptr(arr, index);
        let ty = self.ty(arr.elem);
        let rid = self.inst(Op::Load, Some(ty), vec![id(ptr)]);
        Val {
            id: rid,
            ty: arr.elem,
        }
    }

    #[track_caller]
    pub fn shared_store(&mut self, arr: Shared, index: Val, value: Val) {
        assert!(
            value.ty == arr.elem,
            "store of {} into shared {}",
            value.ty,
            arr.elem
        );
        let ptr = self.shared_ptr(arr, index);
        self.inst_void(Op::Store, vec![id(ptr), value.into()]);
    }

    /// Stores scalar `value` into lane `lane` (a u32, may vary per invocation) of vector
    /// element `index` of `arr`: a transposing store into a vector-typed array; other lanes
    /// are untouched.
    #[track_caller]
    pub fn shared_store_lane(&mut self, arr: Shared, index: Val, lane: Val, value: Val) {
        assert!(
            arr.elem.lanes > 1 && value.ty == Ty::scalar(arr.elem.scalar),
            "lane store of {} into shared {}",
            value.ty,
            arr.elem
        );
        assert!(
            lane.ty == Ty::scalar(Scalar::U32),
            "lane index must be a u32"
        );
        let ptr_ty = self.ptr_ty(StorageClass::Workgroup, value.ty);
        let ptr = self.inst(
            Op::AccessChain,
            Some(ptr_ty),
            vec![id(arr.var), index.into(), lane.into()],
        );
        self.inst_void(Op::Store, vec![id(ptr), value.into()]);
    }

    /// Lane `lane` (a u32, may vary per invocation) of vector element `index` of `arr`.
    #[track_caller]
    pub fn shared_load_lane(&mut self, arr: Shared, index: Val, lane: Val) -> Val {
        assert!(arr.elem.lanes > 1, "lane load from shared {}", arr.elem);
        assert!(
            lane.ty == Ty::scalar(Scalar::U32),
            "lane index must be a u32"
        );
        let rty = Ty::scalar(arr.elem.scalar);
        let ptr_ty = self.ptr_ty(StorageClass::Workgroup, rty);
        let ptr = self.inst(
            Op::AccessChain,
            Some(ptr_ty),
            vec![id(arr.var), index.into(), lane.into()],
        );
        let ty = self.ty(rty);
        let rid = self.inst(Op::Load, Some(ty), vec![id(ptr)]);
        Val { id: rid, ty: rty }
    }

    /// `barrier()`: every invocation of the workgroup arrives, and workgroup-shared writes
    /// before it are visible after it.
    pub fn workgroup_barrier(&mut self) {
        let wg = self.const_u32(Scope::Workgroup as u32);
        let sem = self.const_u32(
            (MemorySemantics::ACQUIRE_RELEASE | MemorySemantics::WORKGROUP_MEMORY).bits(),
        );
        self.inst_void(Op::ControlBarrier, vec![id(wg), id(wg), id(sem)]);
    }

    /// A device-scope memory barrier on buffer memory (no execution barrier).
    pub fn buffer_memory_barrier(&mut self) {
        let scope = self.device_scope();
        let sem = self
            .const_u32((MemorySemantics::ACQUIRE_RELEASE | MemorySemantics::UNIFORM_MEMORY).bits());
        self.inst_void(Op::MemoryBarrier, vec![id(scope), id(sem)]);
    }
}
