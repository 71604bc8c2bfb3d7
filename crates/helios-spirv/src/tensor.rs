//! Tensor-addressed cooperative-matrix loads (SPV_NV_tensor_addressing with
//! SPV_NV_cooperative_matrix2): a workgroup-scope matrix is loaded as a slice of a 2-D tensor
//! described by its dimensions and strides, optionally through a transposing view, and the
//! driver plans the whole copy (how the NVIDIA compiler reaches its fast staging path).
//!
//! The one decision a reader must know: the rspirv in use predates these instructions, so
//! they are emitted as `OpNop` placeholders carrying the real operands, and `finish` rewrites
//! each placeholder's opcode (`builder::patch::placeholders`). A placeholder is recognised
//! by its result id, kept with the real opcode in `KernelBuilder::raw_ops`. Such modules
//! need SPIR-V 1.6.

use rspirv::dr::{Instruction, Operand};
use rspirv::spirv::{MemoryAccess, Op, StorageClass, Word};

use crate::builder::{id, Buffer, KernelBuilder};
use crate::coop::{CoopMat, CoopTy};
use crate::types::{Scalar, Ty, Val};

const OP_COOPERATIVE_MATRIX_LOAD_TENSOR_NV: u32 = 5367;
const OP_TYPE_TENSOR_LAYOUT_NV: u32 = 5370;
const OP_TYPE_TENSOR_VIEW_NV: u32 = 5371;
const OP_CREATE_TENSOR_LAYOUT_NV: u32 = 5372;
const OP_TENSOR_LAYOUT_SET_DIMENSION_NV: u32 = 5373;
const OP_TENSOR_LAYOUT_SET_STRIDE_NV: u32 = 5374;
const OP_TENSOR_LAYOUT_SLICE_NV: u32 = 5375;
const OP_CREATE_TENSOR_VIEW_NV: u32 = 5377;
const CAP_COOPERATIVE_MATRIX_TENSOR_ADDRESSING_NV: u32 = 5433;
const CAP_TENSOR_ADDRESSING_NV: u32 = 5439;
/// Tensor Addressing Operands bit: a tensor view follows.
const TENSOR_VIEW_OPERAND: u32 = 0x1;

/// A 2-D tensor layout value (dimensions, strides, and the slice a load reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorLayout {
    ty: Word,
    id: Word,
}

/// A view that swaps the two coordinates of a 2-D tensor (a transposed load).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorView {
    id: Word,
}

impl KernelBuilder {
    /// A placeholder for an instruction rspirv cannot name (see the module docs).
    fn raw_inst(&mut self, op: u32, result_ty: Option<Word>, operands: Vec<Operand>) -> Word {
        let rid = self.b.id();
        let inst = Instruction::new(Op::Nop, result_ty, Some(rid), operands);
        self.b
            .insert_into_block(rspirv::dr::InsertPoint::End, inst)
            .unwrap_or_else(|e| panic!("kernel {}: op {op} outside a block: {e}", self.name()));
        self.raw_ops.insert(rid, (op, result_ty.is_some()));
        rid
    }

    /// A placeholder type declaration (declared once per operand list).
    fn raw_type(&mut self, op: u32, operands: Vec<Operand>) -> Word {
        let found = self
            .b
            .module_ref()
            .types_global_values
            .iter()
            .find(|i| {
                i.class.opcode == Op::Nop
                    && i.operands == operands
                    && i.result_id
                        .is_some_and(|r| self.raw_ops.get(&r) == Some(&(op, false)))
            })
            .and_then(|i| i.result_id);
        if let Some(rid) = found {
            return rid;
        }
        let rid = self.b.id();
        let inst = Instruction::new(Op::Nop, None, Some(rid), operands);
        self.b
            .insert_types_global_values(rspirv::dr::InsertPoint::End, inst);
        self.raw_ops.insert(rid, (op, false));
        rid
    }

    fn tensor_caps(&mut self) {
        self.raw_capability(CAP_TENSOR_ADDRESSING_NV);
        self.raw_capability(CAP_COOPERATIVE_MATRIX_TENSOR_ADDRESSING_NV);
        self.extension("SPV_NV_tensor_addressing");
        self.extension("SPV_NV_cooperative_matrix2");
        self.spirv_1_6 = true;
    }

    /// A row-major 2-D tensor of `rows × cols` elements, `row_stride` elements apart (u32
    /// values); loads read slices of it ([`KernelBuilder::tensor_slice`]).
    pub fn tensor_layout_2d(&mut self, rows: Val, cols: Val, row_stride: Val) -> TensorLayout {
        self.tensor_caps();
        let (two, clamp_undefined) = (self.const_u32(2), self.const_u32(0));
        let ty = self.raw_type(OP_TYPE_TENSOR_LAYOUT_NV, vec![id(two), id(clamp_undefined)]);
        let l = self.raw_inst(OP_CREATE_TENSOR_LAYOUT_NV, Some(ty), vec![]);
        let l = self.raw_inst(
            OP_TENSOR_LAYOUT_SET_DIMENSION_NV,
            Some(ty),
            vec![id(l), rows.into(), cols.into()],
        );
        let one = self.const_u32(1);
        let l = self.raw_inst(
            OP_TENSOR_LAYOUT_SET_STRIDE_NV,
            Some(ty),
            vec![id(l), row_stride.into(), id(one)],
        );
        TensorLayout { ty, id: l }
    }

    /// The `rows × cols` block of `layout` starting at (`row0`, `col0`).
    pub fn tensor_slice(
        &mut self,
        layout: TensorLayout,
        row0: Val,
        rows: u32,
        col0: Val,
        cols: u32,
    ) -> TensorLayout {
        let (r, c) = (self.const_u32(rows), self.const_u32(cols));
        let l = self.raw_inst(
            OP_TENSOR_LAYOUT_SLICE_NV,
            Some(layout.ty),
            vec![id(layout.id), row0.into(), id(r), col0.into(), id(c)],
        );
        TensorLayout {
            ty: layout.ty,
            id: l,
        }
    }

    /// A view reading a 2-D layout with its coordinates swapped: a matrix loaded through it
    /// is the transpose of the slice.
    pub fn tensor_view_transpose(&mut self) -> TensorView {
        self.tensor_caps();
        let two = self.const_u32(2);
        let bool_ty = self.ty(Ty::scalar(Scalar::Bool));
        let no_dims = self.b.constant_false(bool_ty);
        let (p0, p1) = (self.const_u32(1), self.const_u32(0));
        let ty = self.raw_type(
            OP_TYPE_TENSOR_VIEW_NV,
            vec![id(two), id(no_dims), id(p0), id(p1)],
        );
        let v = self.raw_inst(OP_CREATE_TENSOR_VIEW_NV, Some(ty), vec![]);
        TensorView { id: v }
    }

    /// Loads a cooperative matrix of type `ty` (component = the buffer's element type) from
    /// the slice `layout` of the tensor whose element (0, 0) is element `offset` of `buf`,
    /// through `view` if given.
    #[track_caller]
    pub fn coop_load_tensor(
        &mut self,
        ty: CoopTy,
        buf: Buffer,
        offset: Val,
        layout: TensorLayout,
        view: Option<TensorView>,
    ) -> CoopMat {
        assert_eq!(
            buf.elem, ty.scalar,
            "tensor loads read the buffer's own element type"
        );
        self.arith_caps(buf.elem);
        let array = self.array_pointer(buf, offset);
        let t = self.coop_type(ty);
        // The value of elements outside the tensor (none here: slices stay inside).
        let fill = self.coop_zero(ty);
        let mut ops = vec![
            id(array),
            id(fill.id),
            id(layout.id),
            Operand::MemoryAccess(MemoryAccess::ALIGNED),
            Operand::LiteralBit32(16),
        ];
        match view {
            Some(v) => ops.extend([Operand::LiteralBit32(TENSOR_VIEW_OPERAND), id(v.id)]),
            None => ops.push(Operand::LiteralBit32(0)),
        }
        let rid = self.raw_inst(OP_COOPERATIVE_MATRIX_LOAD_TENSOR_NV, Some(t), ops);
        CoopMat { id: rid, ty }
    }

    /// A pointer to the runtime array of `buf`'s elements that starts at element `offset`
    /// (device-address binding).
    fn array_pointer(&mut self, buf: Buffer, offset: Val) -> Word {
        assert_eq!(
            self.binding(),
            crate::Binding::DeviceAddress,
            "tensor loads need device-address buffers"
        );
        let elem = Ty::scalar(buf.elem);
        let base = self.buffer_base(buf);
        let u64_ty = Ty::scalar(Scalar::U64);
        let u64_id = self.ty(u64_ty);
        let addr = self.inst(Op::ConvertPtrToU, Some(u64_id), vec![id(base)]);
        let addr = Val {
            id: addr,
            ty: u64_ty,
        };
        let off = self.convert(offset, Scalar::U64);
        let bytes = self.constant_bits(u64_ty, u64::from(elem.bytes()));
        let off = self.mul(off, bytes);
        let addr = self.add(addr, off);
        let (view_ptr, array_ty) = self.view_pointer_and_array(elem);
        let ptr = self.inst(Op::ConvertUToPtr, Some(view_ptr), vec![addr.into()]);
        let array_ptr = self
            .b
            .type_pointer(None, StorageClass::PhysicalStorageBuffer, array_ty);
        let zero = self.const_u32(0);
        self.inst(Op::AccessChain, Some(array_ptr), vec![id(ptr), id(zero)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{validate, Access, Binding, CoopUse, TargetEnv};

    /// Every placeholder becomes its tensor instruction, no operand-carrying `OpNop` is left,
    /// and the module validates.
    #[test]
    fn placeholders_become_tensor_instructions() {
        let mut k = KernelBuilder::new("tensor_load", Binding::DeviceAddress, [128, 1, 1]);
        let a = k.buffer("a", Scalar::F16, Access::Read);
        let out = k.buffer("out", Scalar::F32, Access::Write);
        let n = k.param("n", Ty::scalar(Scalar::U32));
        k.begin();
        let n = k.load_param(n);
        let layout = k.tensor_layout_2d(n, n, n);
        let zero = k.u32(0);
        let slice = k.tensor_slice(layout, zero, 32, zero, 16);
        let view = k.tensor_view_transpose();
        let ta = CoopTy::workgroup(Scalar::F16, 32, 16, CoopUse::A);
        let tb = CoopTy::workgroup(Scalar::F16, 16, 32, CoopUse::B);
        let tc = CoopTy::workgroup(Scalar::F32, 32, 32, CoopUse::Accumulator);
        let x = k.coop_load_tensor(ta, a, zero, slice, None);
        let y = k.coop_load_tensor(tb, a, zero, slice, Some(view));
        let c = k.coop_zero(tc);
        let c = k.coop_muladd(x, y, c);
        k.coop_store(
            c,
            out,
            1,
            zero,
            crate::CoopStride {
                stride: n,
                layout: crate::CoopLayout::RowMajor,
            },
            16,
        );
        let m = k.finish();
        let mut ops = Vec::new();
        let mut at = 5;
        while at < m.words.len() {
            let (count, op) = ((m.words[at] >> 16) as usize, m.words[at] & 0xffff);
            assert!(
                op != Op::Nop as u32 || count == 1,
                "placeholder left at {at}"
            );
            ops.push(op);
            at += count;
        }
        let count = |op: u32| ops.iter().filter(|&&o| o == op).count();
        assert_eq!(count(OP_TYPE_TENSOR_LAYOUT_NV), 1);
        assert_eq!(count(OP_TYPE_TENSOR_VIEW_NV), 1);
        assert_eq!(count(OP_CREATE_TENSOR_LAYOUT_NV), 1);
        assert_eq!(count(OP_TENSOR_LAYOUT_SET_DIMENSION_NV), 1);
        assert_eq!(count(OP_TENSOR_LAYOUT_SET_STRIDE_NV), 1);
        assert_eq!(count(OP_TENSOR_LAYOUT_SLICE_NV), 1);
        assert_eq!(count(OP_CREATE_TENSOR_VIEW_NV), 1);
        assert_eq!(count(OP_COOPERATIVE_MATRIX_LOAD_TENSOR_NV), 2);
        assert_eq!(m.words[1], 0x0001_0600, "SPIR-V 1.6");
        validate(&m.name, &m.words, TargetEnv::Vulkan1_3).unwrap_or_else(|e| panic!("{e}"));
    }
}
