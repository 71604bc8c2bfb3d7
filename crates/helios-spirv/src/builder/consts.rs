//! SPIR-V types and constants, declared once each, and instruction emission.

use rspirv::dr::{self, Operand};
use rspirv::spirv::{Capability, Op, StorageClass, Word};

use super::*;
use crate::types::{Scalar, Ty, Val};

impl KernelBuilder {
    /// Adds a capability to the module (idempotent).
    pub fn capability(&mut self, cap: Capability) {
        self.caps.insert(cap as u32);
    }

    /// Adds an extension to the module (idempotent).
    pub fn extension(&mut self, ext: &'static str) {
        self.exts.insert(ext);
    }

    /// The SPIR-V type id of `ty` (non-aggregate types are de-duplicated by rspirv).
    pub fn ty(&mut self, ty: Ty) -> Word {
        let s = match ty.scalar {
            Scalar::Bool => self.b.type_bool(),
            Scalar::F16 => self.b.type_float(16),
            Scalar::F32 => self.b.type_float(32),
            Scalar::F64 => self.b.type_float(64),
            Scalar::BF16 => self.bf16_type(),
            Scalar::U8 => self.b.type_int(8, 0),
            Scalar::U16 => self.b.type_int(16, 0),
            Scalar::I32 => self.b.type_int(32, 1),
            Scalar::U32 => self.b.type_int(32, 0),
            Scalar::I64 => self.b.type_int(64, 1),
            Scalar::U64 => self.b.type_int(64, 0),
        };
        if ty.lanes == 1 {
            s
        } else {
            self.b.type_vector(s, ty.lanes as u32)
        }
    }

    pub(crate) fn ptr_ty(&mut self, class: StorageClass, ty: Ty) -> Word {
        let t = self.ty(ty);
        self.b.type_pointer(None, class, t)
    }

    /// Marks that arithmetic on `s` happens in the kernel: 8/16/64-bit types need a
    /// capability beyond storage.
    pub(crate) fn arith_caps(&mut self, s: Scalar) {
        match s {
            Scalar::F16 => self.capability(Capability::Float16),
            Scalar::U16 => self.capability(Capability::Int16),
            Scalar::U8 => self.capability(Capability::Int8),
            Scalar::I64 | Scalar::U64 => self.capability(Capability::Int64),
            Scalar::F64 => self.capability(Capability::Float64),
            _ => {}
        }
    }

    /// A constant of type `ty` whose every lane holds the bit pattern `bits`.
    pub fn constant_bits(&mut self, ty: Ty, bits: u64) -> Val {
        if let Some(&id) = self.consts.get(&(ty, bits)) {
            return Val { id, ty };
        }
        self.arith_caps(ty.scalar);
        let id = if ty.lanes > 1 {
            let lane = self.constant_bits(Ty::scalar(ty.scalar), bits).id;
            let ty_id = self.ty(ty);
            self.b
                .constant_composite(ty_id, vec![lane; ty.lanes as usize])
        } else {
            let ty_id = self.ty(ty);
            match ty.scalar {
                Scalar::Bool if bits != 0 => self.b.constant_true(ty_id),
                Scalar::Bool => self.b.constant_false(ty_id),
                Scalar::F64 | Scalar::I64 | Scalar::U64 => self.b.constant_bit64(ty_id, bits),
                _ => self.b.constant_bit32(ty_id, bits as u32),
            }
        };
        self.consts.insert((ty, bits), id);
        Val { id, ty }
    }

    pub fn const_f32(&mut self, v: f32) -> Val {
        self.constant_bits(Ty::scalar(Scalar::F32), v.to_bits() as u64)
    }
    pub fn const_u32(&mut self, v: u32) -> Word {
        self.constant_bits(Ty::scalar(Scalar::U32), v as u64).id
    }
    pub fn u32(&mut self, v: u32) -> Val {
        self.constant_bits(Ty::scalar(Scalar::U32), v as u64)
    }
    pub fn i32(&mut self, v: i32) -> Val {
        self.constant_bits(Ty::scalar(Scalar::I32), v as u32 as u64)
    }
    pub fn u64(&mut self, v: u64) -> Val {
        self.constant_bits(Ty::scalar(Scalar::U64), v)
    }
    pub fn i64(&mut self, v: i64) -> Val {
        self.constant_bits(Ty::scalar(Scalar::I64), v as u64)
    }
    pub fn f64(&mut self, v: f64) -> Val {
        self.constant_bits(Ty::scalar(Scalar::F64), v.to_bits())
    }
    pub fn bool(&mut self, v: bool) -> Val {
        self.constant_bits(Ty::scalar(Scalar::Bool), v as u64)
    }
    /// An f16 constant from its IEEE binary16 bit pattern.
    pub fn f16_bits(&mut self, bits: u16) -> Val {
        self.constant_bits(Ty::scalar(Scalar::F16), bits as u64)
    }
    /// A float constant of the given float type (f32 or f16, rounded to nearest).
    #[track_caller]
    pub fn const_float(&mut self, ty: Ty, v: f32) -> Val {
        let bits = match ty.scalar {
            Scalar::F32 => v.to_bits() as u64,
            Scalar::F16 => half::f16::from_f32(v).to_bits() as u64,
            Scalar::F64 => f64::from(v).to_bits(),
            s => panic!("const_float of non-float type {}", s.name()),
        };
        self.constant_bits(ty, bits)
    }
    /// An integer constant of the given integer type.
    #[track_caller]
    pub fn const_int(&mut self, ty: Ty, v: i64) -> Val {
        assert!(ty.scalar.is_int(), "const_int of non-integer type {ty}");
        let mask = if ty.scalar.bits() == 64 {
            u64::MAX
        } else {
            (1u64 << ty.scalar.bits()) - 1
        };
        self.constant_bits(ty, v as u64 & mask)
    }

    pub(crate) fn glsl(&mut self) -> Word {
        match self.glsl {
            Some(id) => id,
            None => {
                let id = self.b.ext_inst_import("GLSL.std.450");
                self.glsl = Some(id);
                id
            }
        }
    }

    /// A module-scope variable, listed in the entry point's interface (SPIR-V 1.4+ wants every
    /// global the entry point touches there). rspirv's `variable` would put it in the open block.
    pub(crate) fn global_variable(&mut self, ptr_ty: Word, class: StorageClass) -> Word {
        let var = self.b.id();
        let inst = dr::Instruction::new(
            Op::Variable,
            Some(ptr_ty),
            Some(var),
            vec![Operand::StorageClass(class)],
        );
        self.b
            .insert_types_global_values(dr::InsertPoint::End, inst);
        self.interface.push(var);
        var
    }

    /// Emits one instruction into the current block and returns its result id.
    pub(crate) fn inst(&mut self, op: Op, result_ty: Option<Word>, operands: Vec<Operand>) -> Word {
        let id = result_ty.map(|_| self.b.id());
        let inst = dr::Instruction::new(op, result_ty, id, operands);
        self.b
            .insert_into_block(dr::InsertPoint::End, inst)
            .unwrap_or_else(|e| panic!("kernel {}: {op:?} outside a block: {e}", self.name));
        id.unwrap_or(0)
    }

    /// Emits an instruction without a result.
    pub(crate) fn inst_void(&mut self, op: Op, operands: Vec<Operand>) {
        let inst = dr::Instruction::new(op, None, None, operands);
        self.b
            .insert_into_block(dr::InsertPoint::End, inst)
            .unwrap_or_else(|e| panic!("kernel {}: {op:?} outside a block: {e}", self.name));
    }
}
