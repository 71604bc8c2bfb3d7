//! Cooperative matrices (SPV_KHR_cooperative_matrix): subgroup-wide matrix fragments that the
//! hardware multiplies on its matrix units (tensor cores on NVIDIA).
//!
//! A fragment is a [`CoopMat`]: a result id and a [`CoopTy`] (component scalar, rows, columns,
//! use A/B/accumulator, and the scope: a subgroup, or with VK_NV_cooperative_matrix2 the
//! whole workgroup). It is loaded from a buffer (device
//! address or descriptor) or a workgroup-shared array, multiplied and accumulated, converted,
//! scaled, and stored back. Capabilities and extensions are added where the first fragment
//! type is declared, so a module without cooperative matrices never names them.
//!
//! The one decision a reader must know: loads and stores take a pointer to *any* scalar or
//! vector element and reinterpret the bytes as the fragment's component type, with the index
//! and stride counted in units of that element (the extension allows it). Kernels therefore
//! keep 16-bit operands in `u32`/`vec4<u32>` buffers and shared arrays (16-byte accesses,
//! one shared array for both staging stores and fragment loads), and bf16 needs no scalar
//! arithmetic type at all: [`Scalar::BF16`] exists only as a fragment component
//! (SPV_KHR_bfloat16) and the bits moved into one, never as a value a kernel computes with.
//!
//! The element-to-invocation mapping of a fragment is not defined by the KHR extension, so
//! per-element epilogues (bias by column, residual) go through shared memory; whole-fragment
//! operations (scale, add, convert) work on the fragment directly.

use rspirv::dr::{Instruction, Operand};
use rspirv::spirv::{Capability, MemoryAccess, MemorySemantics, Op, Scope, StorageClass, Word};

use crate::builder::{id, Buffer, KernelBuilder};
use crate::memory::Shared;
use crate::ops::BinOp;
use crate::types::{Kind, Scalar, Ty, Val};

/// Capability values SPV_KHR_bfloat16 added after the grammar rspirv 0.12 knows.
const CAP_BFLOAT16_TYPE: u32 = 5116;
const CAP_BFLOAT16_COOPERATIVE_MATRIX: u32 = 5118;
/// `OpTypeFloat 16 BFloat16KHR`: the FP-encoding operand value of bfloat16.
const FP_ENCODING_BFLOAT16: u32 = 0;

/// What a fragment is for in `OpCooperativeMatrixMulAddKHR`: `A` (M×K), `B` (K×N) or the
/// accumulator / result (M×N).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CoopUse {
    A,
    B,
    Accumulator,
}

impl CoopUse {
    const fn value(self) -> u32 {
        match self {
            CoopUse::A => 0,
            CoopUse::B => 1,
            CoopUse::Accumulator => 2,
        }
    }
}

/// Which invocations share a cooperative matrix: a subgroup (SPV_KHR_cooperative_matrix) or
/// the whole workgroup (Vulkan's VK_NV_cooperative_matrix2 `cooperativeMatrixWorkgroupScope`,
/// with flexible dimensions: the implementation stages the operands itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CoopScope {
    Subgroup,
    Workgroup,
}

/// The type of a cooperative matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopTy {
    pub scalar: Scalar,
    pub rows: u32,
    pub cols: u32,
    pub use_: CoopUse,
    pub scope: CoopScope,
}

impl CoopTy {
    /// A subgroup-scope fragment.
    pub const fn new(scalar: Scalar, rows: u32, cols: u32, use_: CoopUse) -> CoopTy {
        CoopTy {
            scalar,
            rows,
            cols,
            use_,
            scope: CoopScope::Subgroup,
        }
    }

    /// A workgroup-scope matrix: every invocation of the workgroup must reach each operation
    /// on it (uniform control flow).
    pub const fn workgroup(scalar: Scalar, rows: u32, cols: u32, use_: CoopUse) -> CoopTy {
        CoopTy {
            scope: CoopScope::Workgroup,
            ..CoopTy::new(scalar, rows, cols, use_)
        }
    }

    /// The same shape and use with another component type.
    pub const fn with_scalar(self, scalar: Scalar) -> CoopTy {
        CoopTy { scalar, ..self }
    }
}

impl std::fmt::Display for CoopTy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "coopmat<{}, {}x{}, {:?}{}>",
            self.scalar.name(),
            self.rows,
            self.cols,
            self.use_,
            match self.scope {
                CoopScope::Subgroup => "",
                CoopScope::Workgroup => ", workgroup",
            }
        )
    }
}

/// A cooperative-matrix value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopMat {
    pub id: Word,
    pub ty: CoopTy,
}

/// How a fragment's rows sit in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CoopLayout {
    /// Element (r, c) at `index + r * stride + c`.
    RowMajor,
    /// Element (r, c) at `index + c * stride + r`.
    ColumnMajor,
}

/// A fragment's layout with its stride: together they place every element, so they go as one.
#[derive(Clone, Copy, Debug)]
pub struct CoopStride {
    pub stride: Val,
    pub layout: CoopLayout,
}

/// A function-local cooperative-matrix variable (accumulators that live across loop
/// iterations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopVar {
    ptr: Word,
    pub ty: CoopTy,
}

impl KernelBuilder {
    pub(crate) fn raw_capability(&mut self, cap: u32) {
        let have = self
            .b
            .module_ref()
            .capabilities
            .iter()
            .any(|i| matches!(i.operands.first(), Some(Operand::LiteralBit32(c)) if *c == cap));
        if !have {
            let inst =
                Instruction::new(Op::Capability, None, None, vec![Operand::LiteralBit32(cap)]);
            self.b.module_mut().capabilities.push(inst);
        }
    }

    /// The bfloat16 type `OpTypeFloat 16 BFloat16KHR` (only valid as a cooperative-matrix
    /// component: see the module docs).
    pub(crate) fn bf16_type(&mut self) -> Word {
        self.raw_capability(CAP_BFLOAT16_TYPE);
        self.extension("SPV_KHR_bfloat16");
        let ops = vec![
            Operand::LiteralBit32(16),
            Operand::LiteralBit32(FP_ENCODING_BFLOAT16),
        ];
        self.find_or_add_type(Op::TypeFloat, ops)
    }

    /// A type instruction with exactly these operands, declared once.
    fn find_or_add_type(&mut self, op: Op, operands: Vec<Operand>) -> Word {
        let found = self
            .b
            .module_ref()
            .types_global_values
            .iter()
            .find(|i| i.class.opcode == op && i.operands == operands)
            .and_then(|i| i.result_id);
        if let Some(id) = found {
            return id;
        }
        let rid = self.b.id();
        let inst = Instruction::new(op, None, Some(rid), operands);
        self.b
            .insert_types_global_values(rspirv::dr::InsertPoint::End, inst);
        rid
    }

    /// The SPIR-V type id of a cooperative-matrix type (declared once; adds the capability
    /// and extension).
    #[track_caller]
    pub fn coop_type(&mut self, ty: CoopTy) -> Word {
        assert!(
            matches!(
                ty.scalar,
                Scalar::F16 | Scalar::BF16 | Scalar::F32 | Scalar::U8 | Scalar::I32 | Scalar::U32
            ),
            "cooperative matrices of {} are not supported",
            ty.scalar.name()
        );
        self.capability(Capability::CooperativeMatrixKHR);
        // Required with CooperativeMatrixKHR; `finish` then declares the Vulkan memory model.
        self.capability(Capability::VulkanMemoryModel);
        self.extension("SPV_KHR_cooperative_matrix");
        if ty.scalar == Scalar::BF16 {
            self.raw_capability(CAP_BFLOAT16_COOPERATIVE_MATRIX);
        } else {
            self.arith_caps(ty.scalar);
        }
        let comp = self.ty(Ty::scalar(ty.scalar));
        let scope = match ty.scope {
            CoopScope::Subgroup => Scope::Subgroup,
            CoopScope::Workgroup => {
                // The workgroup-size builtin still overrides it; both say the same.
                self.literal_local_size = true;
                Scope::Workgroup
            }
        };
        let scope = self.const_u32(scope as u32);
        let rows = self.const_u32(ty.rows);
        let cols = self.const_u32(ty.cols);
        let use_ = self.const_u32(ty.use_.value());
        self.find_or_add_type(
            Op::TypeCooperativeMatrixKHR,
            vec![id(comp), id(scope), id(rows), id(cols), id(use_)],
        )
    }

    /// A fragment with every element `value` (a scalar of the fragment's component type;
    /// for bf16 fragments give an f32 and it is converted with the fragment).
    #[track_caller]
    pub fn coop_fill(&mut self, ty: CoopTy, value: Val) -> CoopMat {
        assert!(
            value.ty == Ty::scalar(ty.scalar),
            "coop_fill of {ty} with {}",
            value.ty
        );
        let t = self.coop_type(ty);
        let rid = self.inst(Op::CompositeConstruct, Some(t), vec![value.into()]);
        CoopMat { id: rid, ty }
    }

    /// A zero fragment.
    pub fn coop_zero(&mut self, ty: CoopTy) -> CoopMat {
        if ty.scalar == Scalar::BF16 {
            // No bf16 scalar constants in the IR: build f32 zeros and convert.
            let z = self.coop_zero(ty.with_scalar(Scalar::F32));
            return self.coop_convert(z, Scalar::BF16);
        }
        let zero = self.constant_bits(Ty::scalar(ty.scalar), 0);
        self.coop_fill(ty, zero)
    }

    fn layout_operands(&mut self, stride: Val, layout: CoopLayout) -> [Operand; 2] {
        assert!(
            stride.ty == Ty::scalar(Scalar::U32),
            "cooperative-matrix stride must be a u32"
        );
        let l = self.const_u32(match layout {
            CoopLayout::RowMajor => 0,
            CoopLayout::ColumnMajor => 1,
        });
        [id(l), stride.into()]
    }

    /// Loads a fragment from `buf` starting at element `index` of a `lanes`-wide view of the
    /// buffer (index and stride count such vectors); `align` is the byte alignment of the
    /// first element the whole subgroup may assume (device-address buffers only).
    #[track_caller]
    pub fn coop_load(
        &mut self,
        ty: CoopTy,
        buf: Buffer,
        lanes: u8,
        index: Val,
        CoopStride { stride, layout }: CoopStride,
        align: u32,
    ) -> CoopMat {
        // spirv-val (2025) looks through the push-constant block's buffer pointers and wants
        // the 16-bit arithmetic capability for 16-bit buffers a fragment reinterprets.
        self.arith_caps(buf.elem);
        let (ptr, _) = self.element_pointer(buf, lanes, index);
        let t = self.coop_type(ty);
        let mut ops = vec![id(ptr)];
        ops.extend(self.layout_operands(stride, layout));
        ops.extend(self.coop_access(align));
        let rid = self.inst(Op::CooperativeMatrixLoadKHR, Some(t), ops);
        CoopMat { id: rid, ty }
    }

    /// Stores fragment `m` into `buf` (see `coop_load` for index, stride and alignment).
    #[track_caller]
    pub fn coop_store(
        &mut self,
        m: CoopMat,
        buf: Buffer,
        lanes: u8,
        index: Val,
        CoopStride { stride, layout }: CoopStride,
        align: u32,
    ) {
        self.assert_writable(buf);
        // spirv-val (2025) looks through the push-constant block's buffer pointers and wants
        // the 16-bit arithmetic capability for 16-bit buffers a fragment reinterprets.
        self.arith_caps(buf.elem);
        let (ptr, _) = self.element_pointer(buf, lanes, index);
        let mut ops = vec![id(ptr), id(m.id)];
        ops.extend(self.layout_operands(stride, layout));
        ops.extend(self.coop_access(align));
        self.inst_void(Op::CooperativeMatrixStoreKHR, ops);
    }

    fn coop_access(&self, align: u32) -> Vec<Operand> {
        if self.binding() == crate::Binding::DeviceAddress {
            assert!(align.is_power_of_two(), "alignment {align}");
            vec![
                Operand::MemoryAccess(MemoryAccess::ALIGNED),
                Operand::LiteralBit32(align),
            ]
        } else {
            Vec::new()
        }
    }

    /// Loads a fragment from workgroup-shared `arr` starting at element `index` (index and
    /// stride count the array's elements, e.g. `vec4<u32>` = 8 halves).
    #[track_caller]
    pub fn coop_load_shared(
        &mut self,
        ty: CoopTy,
        arr: Shared,
        index: Val,
        stride: Val,
        layout: CoopLayout,
    ) -> CoopMat {
        let ptr = self.shared_ptr(arr, index);
        let t = self.coop_type(ty);
        let mut ops = vec![id(ptr)];
        ops.extend(self.layout_operands(stride, layout));
        let rid = self.inst(Op::CooperativeMatrixLoadKHR, Some(t), ops);
        CoopMat { id: rid, ty }
    }

    /// Stores fragment `m` into workgroup-shared `arr` (see `coop_load_shared`).
    #[track_caller]
    pub fn coop_store_shared(
        &mut self,
        m: CoopMat,
        arr: Shared,
        index: Val,
        stride: Val,
        layout: CoopLayout,
    ) {
        let ptr = self.shared_ptr(arr, index);
        let mut ops = vec![id(ptr), id(m.id)];
        ops.extend(self.layout_operands(stride, layout));
        self.inst_void(Op::CooperativeMatrixStoreKHR, ops);
    }

    /// `a × b + c` on the matrix units; the result has `c`'s type.
    #[track_caller]
    pub fn coop_muladd(&mut self, a: CoopMat, b: CoopMat, c: CoopMat) -> CoopMat {
        assert!(
            a.ty.use_ == CoopUse::A && b.ty.use_ == CoopUse::B && c.ty.use_ == CoopUse::Accumulator,
            "coop_muladd wants A, B and accumulator fragments"
        );
        assert!(
            a.ty.rows == c.ty.rows
                && b.ty.cols == c.ty.cols
                && a.ty.cols == b.ty.rows
                && a.ty.scalar == b.ty.scalar,
            "coop_muladd shapes disagree: {} × {} + {}",
            a.ty,
            b.ty,
            c.ty
        );
        let t = self.coop_type(c.ty);
        let mut ops = vec![id(a.id), id(b.id), id(c.id)];
        // Signedness only matters for integer fragments.
        let mut signed = rspirv::spirv::CooperativeMatrixOperands::NONE_KHR;
        if a.ty.scalar.kind() == Kind::Signed {
            signed |= rspirv::spirv::CooperativeMatrixOperands::MATRIX_A_SIGNED_COMPONENTS_KHR
                | rspirv::spirv::CooperativeMatrixOperands::MATRIX_B_SIGNED_COMPONENTS_KHR;
        }
        if c.ty.scalar.kind() == Kind::Signed {
            signed |= rspirv::spirv::CooperativeMatrixOperands::MATRIX_C_SIGNED_COMPONENTS_KHR
                | rspirv::spirv::CooperativeMatrixOperands::MATRIX_RESULT_SIGNED_COMPONENTS_KHR;
        }
        if !signed.is_empty() {
            ops.push(Operand::CooperativeMatrixOperands(signed));
        }
        let rid = self.inst(Op::CooperativeMatrixMulAddKHR, Some(t), ops);
        CoopMat { id: rid, ty: c.ty }
    }

    /// Converts every element to `to` (float ↔ float, e.g. an f32 accumulator to f16/bf16
    /// for the output), keeping shape and use.
    #[track_caller]
    pub fn coop_convert(&mut self, m: CoopMat, to: Scalar) -> CoopMat {
        if m.ty.scalar == to {
            return m;
        }
        assert!(
            m.ty.scalar.is_float() && to.is_float(),
            "coop_convert between {} and {}",
            m.ty,
            to.name()
        );
        let rty = m.ty.with_scalar(to);
        let t = self.coop_type(rty);
        let rid = self.inst(Op::FConvert, Some(t), vec![id(m.id)]);
        CoopMat { id: rid, ty: rty }
    }

    /// Element-wise `op` of two fragments of one type (float add, sub, mul, div).
    #[track_caller]
    pub fn coop_binary(&mut self, op: BinOp, a: CoopMat, b: CoopMat) -> CoopMat {
        assert!(a.ty == b.ty, "coop_binary of {} and {}", a.ty, b.ty);
        assert!(a.ty.scalar.is_float(), "coop_binary on {}", a.ty);
        let code = match op {
            BinOp::Add => Op::FAdd,
            BinOp::Sub => Op::FSub,
            BinOp::Mul => Op::FMul,
            BinOp::Div => Op::FDiv,
            _ => panic!("coop_binary: {op:?} is not defined on cooperative matrices"),
        };
        let t = self.coop_type(a.ty);
        let rid = self.inst(code, Some(t), vec![id(a.id), id(b.id)]);
        CoopMat { id: rid, ty: a.ty }
    }

    /// Every element times the scalar `s` (of the component type).
    #[track_caller]
    pub fn coop_scale(&mut self, m: CoopMat, s: Val) -> CoopMat {
        assert!(
            s.ty == Ty::scalar(m.ty.scalar) && m.ty.scalar.is_float(),
            "coop_scale of {} by {}",
            m.ty,
            s.ty
        );
        let t = self.coop_type(m.ty);
        let rid = self.inst(Op::MatrixTimesScalar, Some(t), vec![id(m.id), s.into()]);
        CoopMat { id: rid, ty: m.ty }
    }

    /// The number of elements of a fragment of type `ty` each invocation holds
    /// (`OpCooperativeMatrixLengthKHR`: an implementation property, known only at run time).
    pub fn coop_length(&mut self, ty: CoopTy) -> Val {
        let t = self.coop_type(ty);
        let u = Ty::scalar(Scalar::U32);
        let ut = self.ty(u);
        let rid = self.inst(Op::CooperativeMatrixLengthKHR, Some(ut), vec![id(t)]);
        Val { id: rid, ty: u }
    }

    /// Element `index` of this invocation's part of `m` (which element of the matrix that is
    /// the extension leaves to the implementation: see `helios_kernels::coop_layout`).
    #[track_caller]
    pub fn coop_extract(&mut self, m: CoopMat, index: u32) -> Val {
        let rty = Ty::scalar(m.ty.scalar);
        let t = self.ty(rty);
        let rid = self.inst(
            Op::CompositeExtract,
            Some(t),
            vec![id(m.id), Operand::LiteralBit32(index)],
        );
        Val { id: rid, ty: rty }
    }

    /// `m` with this invocation's element `index` replaced by `x` (of the component type).
    #[track_caller]
    pub fn coop_insert(&mut self, m: CoopMat, x: Val, index: u32) -> CoopMat {
        assert!(
            x.ty == Ty::scalar(m.ty.scalar),
            "coop_insert of {} into {}",
            x.ty,
            m.ty
        );
        let t = self.coop_type(m.ty);
        let rid = self.inst(
            Op::CompositeInsert,
            Some(t),
            vec![x.into(), id(m.id), Operand::LiteralBit32(index)],
        );
        CoopMat { id: rid, ty: m.ty }
    }

    /// A fragment whose elements are all about to be replaced (`OpUndef`).
    pub fn coop_undef(&mut self, ty: CoopTy) -> CoopMat {
        let t = self.coop_type(ty);
        let rid = self.inst(Op::Undef, Some(t), vec![]);
        CoopMat { id: rid, ty }
    }

    /// A function-local variable holding a fragment.
    pub fn coop_var(&mut self, ty: CoopTy) -> CoopVar {
        let t = self.coop_type(ty);
        let ptr_ty = self.b.type_pointer(None, StorageClass::Function, t);
        let ptr = self.b.id();
        let inst = Instruction::new(
            Op::Variable,
            Some(ptr_ty),
            Some(ptr),
            vec![Operand::StorageClass(StorageClass::Function)],
        );
        // Vulkan requires function variables at the top of the entry block.
        let current = self.b.selected_block();
        self.b.select_block(Some(0)).expect("entry block exists");
        self.b
            .insert_into_block(rspirv::dr::InsertPoint::Begin, inst)
            .expect("entry block");
        self.b.select_block(current).expect("restore block");
        CoopVar { ptr, ty }
    }

    pub fn coop_get(&mut self, v: CoopVar) -> CoopMat {
        let t = self.coop_type(v.ty);
        let rid = self.inst(Op::Load, Some(t), vec![id(v.ptr)]);
        CoopMat { id: rid, ty: v.ty }
    }

    #[track_caller]
    pub fn coop_set(&mut self, v: CoopVar, m: CoopMat) {
        assert!(v.ty == m.ty, "store of {} into a {} variable", m.ty, v.ty);
        self.inst_void(Op::Store, vec![id(v.ptr), id(m.id)]);
    }

    /// `subgroupBarrier()`: every invocation of the subgroup arrives, and its workgroup-memory
    /// writes before are visible after (orders a fragment stored to shared memory before
    /// per-invocation reads of it, within one subgroup).
    pub fn subgroup_barrier(&mut self) {
        let sg = self.const_u32(Scope::Subgroup as u32);
        let sem = self.const_u32(
            (MemorySemantics::ACQUIRE_RELEASE | MemorySemantics::WORKGROUP_MEMORY).bits(),
        );
        self.inst_void(Op::ControlBarrier, vec![id(sg), id(sg), id(sem)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{validate, Access, Binding, SharedLen, TargetEnv};

    /// Every fragment operation in one kernel: buffer and shared loads (reinterpreting
    /// `u32`/`vec4<u32>` elements), mul-add, convert, scale, add, variables, stores, for f16
    /// and bf16 inputs, in both binding models.
    fn kernel(scalar: Scalar, binding: Binding) -> crate::KernelModule {
        let name = format!("coop_{}_{binding:?}", scalar.name());
        let mut k = KernelBuilder::new(name, binding, [64, 1, 1]);
        let a_buf = k.buffer("a", Scalar::U32, Access::Read);
        let c_buf = k.buffer("c", Scalar::F32, Access::Write);
        let h_buf = k.buffer("h", Scalar::U16, Access::Write);
        k.begin();
        let shared = k.shared_array(Ty::vector(Scalar::U32, 4), SharedLen::Fixed(512));
        let i = k.local_index();
        let v = k.load(a_buf, i, 4);
        k.shared_store(shared, i, v);
        k.workgroup_barrier();
        let zero = k.u32(0);
        let s8 = k.u32(8);
        let s2 = k.u32(2);
        let a_ty = CoopTy::new(scalar, 16, 16, CoopUse::A);
        let b_ty = CoopTy::new(scalar, 16, 16, CoopUse::B);
        let acc_ty = CoopTy::new(Scalar::F32, 16, 16, CoopUse::Accumulator);
        let a = k.coop_load(
            a_ty,
            a_buf,
            4,
            zero,
            CoopStride {
                stride: s2,
                layout: CoopLayout::RowMajor,
            },
            16,
        );
        let b = k.coop_load_shared(b_ty, shared, zero, s2, CoopLayout::ColumnMajor);
        let acc = k.coop_var(acc_ty);
        let z = k.coop_zero(acc_ty);
        k.coop_set(acc, z);
        let c = k.coop_get(acc);
        let d = k.coop_muladd(a, b, c);
        let half = k.const_f32(0.5);
        let d = k.coop_scale(d, half);
        let d = k.coop_binary(BinOp::Add, d, c);
        k.coop_set(acc, d);
        let d = k.coop_get(acc);
        k.coop_store(
            d,
            c_buf,
            1,
            zero,
            CoopStride {
                stride: s8,
                layout: CoopLayout::RowMajor,
            },
            4,
        );
        k.coop_store_shared(d, shared, zero, s8, CoopLayout::RowMajor);
        k.subgroup_barrier();
        let narrow = k.coop_convert(d, scalar);
        k.coop_store(
            narrow,
            h_buf,
            1,
            zero,
            CoopStride {
                stride: s8,
                layout: CoopLayout::RowMajor,
            },
            2,
        );
        // Element access: an accumulator element moved into an A fragment, as the
        // attention kernels do with P.
        let x = k.coop_extract(narrow, 1);
        let u = k.coop_undef(a_ty);
        let u = k.coop_insert(u, x, 0);
        let n = k.coop_length(a_ty);
        let y = k.coop_extract(d, 0);
        let y = k.coop_insert(d, y, 1);
        let e = k.coop_muladd(u, b, y);
        k.coop_store(
            e,
            c_buf,
            1,
            n,
            CoopStride {
                stride: s8,
                layout: CoopLayout::RowMajor,
            },
            4,
        );
        k.finish()
    }

    #[test]
    fn fragments_validate() {
        for scalar in [Scalar::F16, Scalar::BF16] {
            for binding in [Binding::DeviceAddress, Binding::Descriptor] {
                let m = kernel(scalar, binding);
                if let Err(e) = validate(&m.name, &m.words, TargetEnv::Vulkan1_3) {
                    panic!("{e}\n{}", m.disassemble());
                }
            }
        }
    }

    #[test]
    fn types_are_declared_once() {
        let mut k = KernelBuilder::new("t", Binding::DeviceAddress, [32, 1, 1]);
        k.begin();
        let ty = CoopTy::new(Scalar::F16, 16, 16, CoopUse::A);
        assert_eq!(k.coop_type(ty), k.coop_type(ty));
        assert_ne!(
            k.coop_type(ty),
            k.coop_type(CoopTy::new(Scalar::F16, 16, 16, CoopUse::B))
        );
        assert_eq!(k.bf16_type(), k.bf16_type());
        assert_ne!(k.bf16_type(), k.ty(Ty::scalar(Scalar::F16)));
    }
}
