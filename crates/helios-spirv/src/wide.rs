//! Wide integer arithmetic: the full product, add with carry and subtract with borrow
//! (`OpUMulExtended`, `OpIAddCarry`, `OpISubBorrow`), for multi-limb big-integer kernels.
//!
//! The one decision a reader must know: these SPIR-V instructions return a two-member struct,
//! which the IR has no type for, so each method extracts both members at once and hands back
//! a pair of ordinary values. The struct type is shared per member type and is never one of
//! the module's decorated (Block) structs, which it would otherwise be de-duplicated into.

use rspirv::dr::Operand;
use rspirv::spirv::{Op, Word};

use crate::builder::{id, KernelBuilder};
use crate::types::{Kind, Ty, Val};

impl KernelBuilder {
    /// `(lo, hi)`: the low and high halves of the full unsigned product `a * b`.
    #[track_caller]
    pub fn umul_extended(&mut self, a: Val, b: Val) -> (Val, Val) {
        self.wide_pair(Op::UMulExtended, a, b)
    }

    /// `(a + b mod 2^w, carry)` with `carry` 0 or 1 in the operands' type.
    #[track_caller]
    pub fn iadd_carry(&mut self, a: Val, b: Val) -> (Val, Val) {
        self.wide_pair(Op::IAddCarry, a, b)
    }

    /// `(a - b mod 2^w, borrow)` with `borrow` 0 or 1 (1 when `b > a`) in the operands' type.
    #[track_caller]
    pub fn isub_borrow(&mut self, a: Val, b: Val) -> (Val, Val) {
        self.wide_pair(Op::ISubBorrow, a, b)
    }

    #[track_caller]
    fn wide_pair(&mut self, op: Op, a: Val, b: Val) -> (Val, Val) {
        assert!(
            a.ty == b.ty && a.ty.scalar.kind() == Kind::Unsigned,
            "kernel {}: {op:?} needs two unsigned operands of one type, got {} and {}",
            self.name(),
            a.ty,
            b.ty
        );
        self.arith_caps(a.ty.scalar);
        let member = self.ty(a.ty);
        let st = self.pair_struct(member);
        let pair = self.inst(op, Some(st), vec![a.into(), b.into()]);
        (self.member(pair, 0, a.ty), self.member(pair, 1, a.ty))
    }

    fn member(&mut self, pair: Word, index: u32, ty: Ty) -> Val {
        let ty_id = self.ty(ty);
        let rid = self.inst(
            Op::CompositeExtract,
            Some(ty_id),
            vec![id(pair), Operand::LiteralBit32(index)],
        );
        Val { id: rid, ty }
    }

    /// `struct { T; T; }` without decorations, created once per member type.
    fn pair_struct(&mut self, member: Word) -> Word {
        let module = self.b.module_ref();
        let decorated = |target: Word| {
            module.annotations.iter().any(|a| {
                matches!(a.class.opcode, Op::Decorate | Op::MemberDecorate)
                    && a.operands.first() == Some(&Operand::IdRef(target))
            })
        };
        let existing = module.types_global_values.iter().find_map(|t| {
            let rid = t.result_id?;
            (t.class.opcode == Op::TypeStruct
                && t.operands == [Operand::IdRef(member), Operand::IdRef(member)]
                && !decorated(rid))
            .then_some(rid)
        });
        if let Some(st) = existing {
            return st;
        }
        let fresh = self.b.id();
        self.b.type_struct_id(Some(fresh), [member, member])
    }
}

#[cfg(test)]
mod tests {
    use crate::{validate, Access, Binding, KernelBuilder, Scalar, TargetEnv, Ty};

    /// One kernel using all three instructions on u32 and u64, with a two-u32 push block
    /// (the Block struct the pair type must not be merged into).
    #[test]
    fn wide_ops_validate() {
        let mut k = KernelBuilder::new("wide_ops", Binding::DeviceAddress, [64, 1, 1]);
        let out = k.buffer("out", Scalar::U32, Access::Write);
        let x = k.param("x", Ty::scalar(Scalar::U32));
        let y = k.param("y", Ty::scalar(Scalar::U32));
        k.begin();
        let (x, y) = (k.load_param(x), k.load_param(y));
        let (lo, hi) = k.umul_extended(x, y);
        let (s, c) = k.iadd_carry(lo, hi);
        let (d, b) = k.isub_borrow(s, c);
        let r = k.add(d, b);
        let x64 = k.convert(x, Scalar::U64);
        let (lo64, hi64) = k.umul_extended(x64, x64);
        let (s64, _) = k.iadd_carry(lo64, hi64);
        let (d64, _) = k.isub_borrow(s64, x64);
        let low = k.convert(d64, Scalar::U32);
        let r = k.add(r, low);
        let zero = k.u32(0);
        k.store(out, zero, r);
        let m = k.finish();
        let text = m.disassemble();
        assert_eq!(text.matches("OpUMulExtended").count(), 2, "{text}");
        for env in [TargetEnv::Vulkan1_2, TargetEnv::Vulkan1_3] {
            validate(&m.name, &m.words, env).unwrap();
        }
    }
}
