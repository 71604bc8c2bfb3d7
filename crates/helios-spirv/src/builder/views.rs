//! Buffers as the kernel sees them: views, their element pointers, loads and stores.

use rspirv::dr::Operand;
use rspirv::spirv::{Capability, Decoration, Op, StorageClass, Word};

use super::*;
use crate::types::{Scalar, Ty, Val};

/// `Buffer::index` of buffers at computed addresses (`buffer_at`, `buffer_at_mut`): no
/// binding of their own.
const AT_READ_ONLY: usize = usize::MAX;
const AT_WRITABLE: usize = usize::MAX - 1;

impl KernelBuilder {
    /// The pointer type (PhysicalStorageBuffer) to a block holding a run-time array of `elem`.
    /// The PhysicalStorageBuffer pointer type to `elem`'s view struct, and the runtime-array
    /// type that struct holds.
    pub(crate) fn view_pointer_and_array(&mut self, elem: Ty) -> (Word, Word) {
        let st = self.view_struct(elem, false);
        let array = self
            .b
            .module_ref()
            .types_global_values
            .iter()
            .find(|i| i.result_id == Some(st))
            .and_then(|i| match i.operands.first() {
                Some(Operand::IdRef(a)) => Some(*a),
                _ => None,
            })
            .expect("a view struct holds its runtime array");
        (self.view_pointer_type(elem, false), array)
    }

    /// The device address of `buf` (device-address binding) as a pointer to its scalar view.
    pub(crate) fn buffer_base(&mut self, buf: Buffer) -> Word {
        let member = self.buffers[buf.index].slot;
        let var = self.push_var.expect("push block declared");
        let readonly = self.read_only(buf.index);
        let scalar_view = self.view_pointer_type(Ty::scalar(buf.elem), readonly);
        let pc_ptr = self
            .b
            .type_pointer(None, StorageClass::PushConstant, scalar_view);
        let m = self.const_u32(member);
        let slot = self.inst(Op::AccessChain, Some(pc_ptr), vec![id(var), id(m)]);
        self.inst(Op::Load, Some(scalar_view), vec![id(slot)])
    }

    /// Whether buffer `index` is only read (its device-address views are `NonWritable`).
    pub(super) fn read_only(&self, index: usize) -> bool {
        self.buffers[index].access == Access::Read
    }

    pub(super) fn view_pointer_type(&mut self, elem: Ty, readonly: bool) -> Word {
        let st = self.view_struct(elem, readonly);
        self.b
            .type_pointer(None, StorageClass::PhysicalStorageBuffer, st)
    }

    /// `struct { elem data[]; }` decorated as a Block with an explicit stride, its member
    /// `NonWritable` when `readonly` (device-address views of buffers the kernel only reads,
    /// which lets the driver use its read-only load path). One type per (element, read-only)
    /// so decorations are emitted exactly once.
    fn view_struct(&mut self, elem: Ty, readonly: bool) -> Word {
        // Descriptor and device-address views share one struct type: the layout is the same.
        if let Some(&id) = self.views.get(&(elem, readonly)) {
            return id;
        }
        self.storage_caps(elem.scalar);
        let elem_id = self.ty(elem);
        let fresh = self.b.id();
        let arr = self.b.type_runtime_array_id(Some(fresh), elem_id);
        self.b.decorate(
            arr,
            Decoration::ArrayStride,
            [Operand::LiteralBit32(elem.bytes())],
        );
        let fresh = self.b.id();
        let st = self.b.type_struct_id(Some(fresh), [arr]);
        self.b.decorate(st, Decoration::Block, []);
        self.b
            .member_decorate(st, 0, Decoration::Offset, [Operand::LiteralBit32(0)]);
        if readonly {
            self.b.member_decorate(st, 0, Decoration::NonWritable, []);
        }
        self.views.insert((elem, readonly), st);
        st
    }

    fn storage_caps(&mut self, s: Scalar) {
        match s.bytes() {
            2 => {
                self.capability(Capability::StorageBuffer16BitAccess);
            }
            1 => {
                self.capability(Capability::StorageBuffer8BitAccess);
            }
            _ => {}
        }
    }

    /// A read-only buffer at a device address the kernel computed: a vec2 of u32, low word
    /// first, as a table of tensors stores addresses (SPIR-V bitcasts such a vector to a
    /// physical pointer, so no 64-bit integers are needed). For kernels that walk many
    /// tensors in one dispatch; device-address binding only, loads only.
    #[track_caller]
    pub fn buffer_at(&mut self, address: Val, elem: Scalar) -> Buffer {
        self.computed_buffer(address, elem, AT_READ_ONLY)
    }

    /// `buffer_at` that the kernel also writes (a table-driven copy's destinations).
    #[track_caller]
    pub fn buffer_at_mut(&mut self, address: Val, elem: Scalar) -> Buffer {
        self.computed_buffer(address, elem, AT_WRITABLE)
    }

    #[track_caller]
    fn computed_buffer(&mut self, address: Val, elem: Scalar, index: usize) -> Buffer {
        assert!(
            self.binding == Binding::DeviceAddress,
            "buffer_at needs device addresses"
        );
        assert!(
            address.ty == Ty::vector(Scalar::U32, 2),
            "a device address is a vec2<u32>, got {}",
            address.ty
        );
        Buffer {
            index,
            elem,
            address: Some(address.id),
        }
    }

    /// Panics on a write to a `buffer_at` buffer (its views are `NonWritable`).
    #[track_caller]
    pub(crate) fn assert_writable(&self, buf: Buffer) {
        assert!(
            buf.address.is_none() || buf.index == AT_WRITABLE,
            "buffers at computed addresses are read-only (buffer_at_mut writes)"
        );
    }

    /// A pointer to element `index` of `buf` viewed as an array of `lanes`-wide vectors,
    /// with the alignment the access may assume.
    pub(crate) fn element_pointer(&mut self, buf: Buffer, lanes: u8, index: Val) -> (Word, u32) {
        assert!(
            matches!(lanes, 1 | 2 | 4),
            "buffer access is 1, 2 or 4 lanes wide, got {lanes}"
        );
        assert!(
            index.ty.scalar.is_int() && index.ty.lanes == 1,
            "index must be an integer"
        );
        let elem = Ty::vector(buf.elem, lanes);
        let zero = self.const_u32(0);
        match self.binding {
            Binding::DeviceAddress => {
                let base = match buf.address {
                    // A computed address: straight to the view of the access.
                    Some(address) => {
                        let view = self.view_pointer_type(elem, buf.index != AT_WRITABLE);
                        self.inst(Op::Bitcast, Some(view), vec![id(address)])
                    }
                    None if lanes == 1 => self.buffer_base(buf),
                    None => {
                        let base = self.buffer_base(buf);
                        let readonly = self.read_only(buf.index);
                        let view = self.view_pointer_type(elem, readonly);
                        self.inst(Op::Bitcast, Some(view), vec![id(base)])
                    }
                };
                let ptr_ty = self.ptr_ty(StorageClass::PhysicalStorageBuffer, elem);
                let ptr = self.inst(
                    Op::AccessChain,
                    Some(ptr_ty),
                    vec![id(base), id(zero), id(index.id)],
                );
                (ptr, elem.bytes())
            }
            Binding::Descriptor => {
                let var = self.descriptor_view(buf.index, lanes);
                let ptr_ty = self.ptr_ty(StorageClass::StorageBuffer, elem);
                let ptr = self.inst(
                    Op::AccessChain,
                    Some(ptr_ty),
                    vec![id(var), id(zero), id(index.id)],
                );
                (ptr, elem.bytes())
            }
        }
    }

    fn descriptor_view(&mut self, index: usize, lanes: u8) -> Word {
        if let Some(&var) = self.buffers[index].views.get(&lanes) {
            return var;
        }
        let (elem, binding, access) = {
            let d = &self.buffers[index];
            (Ty::vector(d.elem, lanes), d.slot, d.access)
        };
        let st = self.view_struct(elem, false);
        let ptr = self.b.type_pointer(None, StorageClass::StorageBuffer, st);
        let var = self.global_variable(ptr, StorageClass::StorageBuffer);
        self.b
            .decorate(var, Decoration::DescriptorSet, [Operand::LiteralBit32(0)]);
        self.b
            .decorate(var, Decoration::Binding, [Operand::LiteralBit32(binding)]);
        if access == Access::Read {
            self.b.decorate(var, Decoration::NonWritable, []);
        }
        self.buffers[index].views.insert(lanes, var);
        var
    }
}
