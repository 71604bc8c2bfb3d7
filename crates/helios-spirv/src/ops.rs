//! Value operations: arithmetic, bit operations, comparisons, select, GLSL.std.450 math,
//! conversions and vector construction.
//!
//! Each method looks at its operands' type and picks the opcode (`add` is `OpFAdd` on floats,
//! `OpIAdd` on integers). Operands must agree in type; use `splat` to widen a scalar.

use rspirv::dr::Operand;
use rspirv::spirv::{Decoration, GLOp, Op, Word};

use crate::builder::{id, KernelBuilder};
use crate::types::{Kind, Scalar, Ty, Val};

/// Binary arithmetic and bit operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    /// Remainder with the sign of the dividend (C's `%`, `fmod`).
    Rem,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    /// Logical shift for unsigned, arithmetic for signed types.
    Shr,
}

/// Comparisons; float comparisons are ordered (false when a NaN is involved) except `Ne`,
/// which is true when a NaN is involved, as in IEEE 754 and C.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl KernelBuilder {
    #[track_caller]
    fn same_ty(&self, what: &str, a: Val, b: Val) {
        assert!(
            a.ty == b.ty,
            "kernel {}: {what} operands disagree: {} vs {}",
            self.name(),
            a.ty,
            b.ty
        );
    }

    /// Applies a binary operation to two values of one type.
    #[track_caller]
    pub fn binary(&mut self, op: BinOp, a: Val, b: Val) -> Val {
        let kind = a.ty.scalar.kind();
        let op_code = match (op, kind) {
            (BinOp::Shl | BinOp::Shr, Kind::Signed | Kind::Unsigned) => {
                // Shift amounts may be any integer type; the result has the base's type.
                assert!(
                    b.ty.scalar.is_int() && b.ty.lanes == a.ty.lanes,
                    "shift amount type"
                );
                match (op, kind) {
                    (BinOp::Shl, _) => Op::ShiftLeftLogical,
                    (_, Kind::Signed) => Op::ShiftRightArithmetic,
                    _ => Op::ShiftRightLogical,
                }
            }
            _ => {
                self.same_ty("binary", a, b);
                match (op, kind) {
                    (BinOp::Add, Kind::Float) => Op::FAdd,
                    (BinOp::Add, Kind::Signed | Kind::Unsigned) => Op::IAdd,
                    (BinOp::Sub, Kind::Float) => Op::FSub,
                    (BinOp::Sub, Kind::Signed | Kind::Unsigned) => Op::ISub,
                    (BinOp::Mul, Kind::Float) => Op::FMul,
                    (BinOp::Mul, Kind::Signed | Kind::Unsigned) => Op::IMul,
                    (BinOp::Div, Kind::Float) => Op::FDiv,
                    (BinOp::Div, Kind::Signed) => Op::SDiv,
                    (BinOp::Div, Kind::Unsigned) => Op::UDiv,
                    (BinOp::Rem, Kind::Float) => Op::FRem,
                    (BinOp::Rem, Kind::Signed) => Op::SRem,
                    (BinOp::Rem, Kind::Unsigned) => Op::UMod,
                    (BinOp::BitAnd, Kind::Bool) => Op::LogicalAnd,
                    (BinOp::BitOr, Kind::Bool) => Op::LogicalOr,
                    (BinOp::BitXor, Kind::Bool) => Op::LogicalNotEqual,
                    (BinOp::BitAnd, Kind::Signed | Kind::Unsigned) => Op::BitwiseAnd,
                    (BinOp::BitOr, Kind::Signed | Kind::Unsigned) => Op::BitwiseOr,
                    (BinOp::BitXor, Kind::Signed | Kind::Unsigned) => Op::BitwiseXor,
                    _ => panic!("kernel {}: {op:?} is not defined on {}", self.name(), a.ty),
                }
            }
        };
        self.arith_caps(a.ty.scalar);
        let ty = self.ty(a.ty);
        let rid = self.inst(op_code, Some(ty), vec![a.into(), b.into()]);
        if self.exact_arithmetic && matches!(op_code, Op::FAdd | Op::FSub | Op::FMul | Op::FDiv) {
            self.b.decorate(rid, Decoration::NoContraction, []);
        }
        Val { id: rid, ty: a.ty }
    }

    pub fn add(&mut self, a: Val, b: Val) -> Val {
        self.binary(BinOp::Add, a, b)
    }
    pub fn sub(&mut self, a: Val, b: Val) -> Val {
        self.binary(BinOp::Sub, a, b)
    }
    pub fn mul(&mut self, a: Val, b: Val) -> Val {
        self.binary(BinOp::Mul, a, b)
    }
    pub fn div(&mut self, a: Val, b: Val) -> Val {
        self.binary(BinOp::Div, a, b)
    }
    pub fn rem(&mut self, a: Val, b: Val) -> Val {
        self.binary(BinOp::Rem, a, b)
    }
    pub fn and(&mut self, a: Val, b: Val) -> Val {
        self.binary(BinOp::BitAnd, a, b)
    }
    pub fn or(&mut self, a: Val, b: Val) -> Val {
        self.binary(BinOp::BitOr, a, b)
    }
    pub fn xor(&mut self, a: Val, b: Val) -> Val {
        self.binary(BinOp::BitXor, a, b)
    }
    pub fn shl(&mut self, a: Val, b: Val) -> Val {
        self.binary(BinOp::Shl, a, b)
    }
    pub fn shr(&mut self, a: Val, b: Val) -> Val {
        self.binary(BinOp::Shr, a, b)
    }

    /// Negation (`OpFNegate` flips the sign bit, so -NaN and -0.0 behave as in IEEE).
    #[track_caller]
    pub fn neg(&mut self, a: Val) -> Val {
        let op = match a.ty.scalar.kind() {
            Kind::Float => Op::FNegate,
            Kind::Signed | Kind::Unsigned => Op::SNegate,
            Kind::Bool => Op::LogicalNot,
        };
        self.arith_caps(a.ty.scalar);
        let ty = self.ty(a.ty);
        let rid = self.inst(op, Some(ty), vec![a.into()]);
        Val { id: rid, ty: a.ty }
    }

    /// Bitwise not on integers, logical not on bools.
    pub fn not(&mut self, a: Val) -> Val {
        let op = if a.ty.scalar == Scalar::Bool {
            Op::LogicalNot
        } else {
            Op::Not
        };
        let ty = self.ty(a.ty);
        let rid = self.inst(op, Some(ty), vec![a.into()]);
        Val { id: rid, ty: a.ty }
    }

    /// A comparison; the result is a bool with the operands' lane count.
    #[track_caller]
    pub fn cmp(&mut self, op: CmpOp, a: Val, b: Val) -> Val {
        self.same_ty("comparison", a, b);
        let kind = a.ty.scalar.kind();
        let code = match (op, kind) {
            (CmpOp::Eq, Kind::Float) => Op::FOrdEqual,
            (CmpOp::Ne, Kind::Float) => Op::FUnordNotEqual,
            (CmpOp::Lt, Kind::Float) => Op::FOrdLessThan,
            (CmpOp::Le, Kind::Float) => Op::FOrdLessThanEqual,
            (CmpOp::Gt, Kind::Float) => Op::FOrdGreaterThan,
            (CmpOp::Ge, Kind::Float) => Op::FOrdGreaterThanEqual,
            (CmpOp::Eq, Kind::Bool) => Op::LogicalEqual,
            (CmpOp::Ne, Kind::Bool) => Op::LogicalNotEqual,
            (CmpOp::Eq, _) => Op::IEqual,
            (CmpOp::Ne, _) => Op::INotEqual,
            (CmpOp::Lt, Kind::Signed) => Op::SLessThan,
            (CmpOp::Le, Kind::Signed) => Op::SLessThanEqual,
            (CmpOp::Gt, Kind::Signed) => Op::SGreaterThan,
            (CmpOp::Ge, Kind::Signed) => Op::SGreaterThanEqual,
            (CmpOp::Lt, Kind::Unsigned) => Op::ULessThan,
            (CmpOp::Le, Kind::Unsigned) => Op::ULessThanEqual,
            (CmpOp::Gt, Kind::Unsigned) => Op::UGreaterThan,
            (CmpOp::Ge, Kind::Unsigned) => Op::UGreaterThanEqual,
            (_, Kind::Bool) => panic!("kernel {}: {op:?} is not defined on bool", self.name()),
        };
        self.arith_caps(a.ty.scalar);
        let rty = a.ty.with_scalar(Scalar::Bool);
        let ty = self.ty(rty);
        let rid = self.inst(code, Some(ty), vec![a.into(), b.into()]);
        Val { id: rid, ty: rty }
    }

    pub fn lt(&mut self, a: Val, b: Val) -> Val {
        self.cmp(CmpOp::Lt, a, b)
    }
    pub fn le(&mut self, a: Val, b: Val) -> Val {
        self.cmp(CmpOp::Le, a, b)
    }
    pub fn gt(&mut self, a: Val, b: Val) -> Val {
        self.cmp(CmpOp::Gt, a, b)
    }
    pub fn ge(&mut self, a: Val, b: Val) -> Val {
        self.cmp(CmpOp::Ge, a, b)
    }
    pub fn eq(&mut self, a: Val, b: Val) -> Val {
        self.cmp(CmpOp::Eq, a, b)
    }
    pub fn ne(&mut self, a: Val, b: Val) -> Val {
        self.cmp(CmpOp::Ne, a, b)
    }

    /// True where `a` is NaN.
    #[track_caller]
    pub fn is_nan(&mut self, a: Val) -> Val {
        assert!(a.ty.scalar.is_float(), "is_nan on {}", a.ty);
        let rty = a.ty.with_scalar(Scalar::Bool);
        let ty = self.ty(rty);
        let rid = self.inst(Op::IsNan, Some(ty), vec![a.into()]);
        Val { id: rid, ty: rty }
    }

    /// True where `a` is ±infinity.
    #[track_caller]
    pub fn is_inf(&mut self, a: Val) -> Val {
        assert!(a.ty.scalar.is_float(), "is_inf on {}", a.ty);
        let rty = a.ty.with_scalar(Scalar::Bool);
        let ty = self.ty(rty);
        let rid = self.inst(Op::IsInf, Some(ty), vec![a.into()]);
        Val { id: rid, ty: rty }
    }

    /// `cond ? a : b`, lane-wise when `cond` is a vector; a scalar `cond` picks whole values.
    #[track_caller]
    pub fn select(&mut self, cond: Val, a: Val, b: Val) -> Val {
        self.same_ty("select", a, b);
        assert!(
            cond.ty.scalar == Scalar::Bool,
            "select condition must be bool"
        );
        assert!(
            cond.ty.lanes == 1 || cond.ty.lanes == a.ty.lanes,
            "select condition has {} lanes, values {}",
            cond.ty.lanes,
            a.ty.lanes
        );
        let ty = self.ty(a.ty);
        let rid = self.inst(Op::Select, Some(ty), vec![cond.into(), a.into(), b.into()]);
        Val { id: rid, ty: a.ty }
    }

    /// Any (any lane true) and all (all lanes true) of a bool vector.
    pub fn any(&mut self, cond: Val) -> Val {
        self.reduce_bool(Op::Any, cond)
    }
    pub fn all(&mut self, cond: Val) -> Val {
        self.reduce_bool(Op::All, cond)
    }
    fn reduce_bool(&mut self, op: Op, cond: Val) -> Val {
        if cond.ty.lanes == 1 {
            return cond;
        }
        let ty = self.ty(Ty::scalar(Scalar::Bool));
        let rid = self.inst(op, Some(ty), vec![cond.into()]);
        Val {
            id: rid,
            ty: Ty::scalar(Scalar::Bool),
        }
    }

    // ------------------------------------------------------------ GLSL.std.450 math

    /// Calls a GLSL.std.450 instruction whose result has the type of its first operand.
    #[track_caller]
    pub fn glsl_op(&mut self, op: GLOp, args: &[Val]) -> Val {
        let first = args[0];
        for a in &args[1..] {
            self.same_ty("GLSL.std.450", first, *a);
        }
        self.arith_caps(first.ty.scalar);
        let set = self.glsl();
        let ty = self.ty(first.ty);
        let mut operands = vec![id(set), Operand::LiteralExtInstInteger(op as u32)];
        operands.extend(args.iter().map(|a| Operand::IdRef(a.id)));
        let rid = self.inst(Op::ExtInst, Some(ty), operands);
        Val {
            id: rid,
            ty: first.ty,
        }
    }

    pub fn exp(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::Exp, &[a])
    }
    pub fn exp2(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::Exp2, &[a])
    }
    pub fn log(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::Log, &[a])
    }
    pub fn log2(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::Log2, &[a])
    }
    pub fn sqrt(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::Sqrt, &[a])
    }
    pub fn rsqrt(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::InverseSqrt, &[a])
    }
    pub fn tanh(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::Tanh, &[a])
    }
    pub fn sin(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::Sin, &[a])
    }
    pub fn cos(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::Cos, &[a])
    }
    pub fn floor(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::Floor, &[a])
    }
    pub fn ceil(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::Ceil, &[a])
    }
    pub fn trunc(&mut self, a: Val) -> Val {
        self.glsl_op(GLOp::Trunc, &[a])
    }
    /// GLSL `pow`: defined for x > 0 only; see helios-kernels for the IEEE-complete power.
    pub fn pow(&mut self, a: Val, b: Val) -> Val {
        self.glsl_op(GLOp::Pow, &[a, b])
    }
    /// Fused multiply-add `a * b + c` with one rounding.
    pub fn fma(&mut self, a: Val, b: Val, c: Val) -> Val {
        self.glsl_op(GLOp::Fma, &[a, b, c])
    }

    /// Absolute value of a float or signed integer.
    #[track_caller]
    pub fn abs(&mut self, a: Val) -> Val {
        match a.ty.scalar.kind() {
            Kind::Float => self.glsl_op(GLOp::FAbs, &[a]),
            Kind::Signed => self.glsl_op(GLOp::SAbs, &[a]),
            Kind::Unsigned => a,
            Kind::Bool => panic!("abs of bool"),
        }
    }

    /// Minimum. On floats this is GLSL `FMin`: which operand a NaN yields is undefined, so
    /// kernels that promise NaN propagation check `is_nan` themselves.
    #[track_caller]
    pub fn min(&mut self, a: Val, b: Val) -> Val {
        let op = match a.ty.scalar.kind() {
            Kind::Float => GLOp::FMin,
            Kind::Signed => GLOp::SMin,
            Kind::Unsigned => GLOp::UMin,
            Kind::Bool => panic!("min of bool"),
        };
        self.glsl_op(op, &[a, b])
    }

    /// Maximum; see `min` for NaN.
    #[track_caller]
    pub fn max(&mut self, a: Val, b: Val) -> Val {
        let op = match a.ty.scalar.kind() {
            Kind::Float => GLOp::FMax,
            Kind::Signed => GLOp::SMax,
            Kind::Unsigned => GLOp::UMax,
            Kind::Bool => panic!("max of bool"),
        };
        self.glsl_op(op, &[a, b])
    }

    /// Clamp to [lo, hi].
    #[track_caller]
    pub fn clamp(&mut self, a: Val, lo: Val, hi: Val) -> Val {
        let op = match a.ty.scalar.kind() {
            Kind::Float => GLOp::FClamp,
            Kind::Signed => GLOp::SClamp,
            Kind::Unsigned => GLOp::UClamp,
            Kind::Bool => panic!("clamp of bool"),
        };
        self.glsl_op(op, &[a, lo, hi])
    }

    // ------------------------------------------------------------ conversions

    /// Converts numerically to another scalar type, lane-wise (float↔int rounds toward zero,
    /// int↔int wraps or extends by the source's signedness).
    #[track_caller]
    pub fn convert(&mut self, a: Val, to: Scalar) -> Val {
        let from = a.ty.scalar;
        if from == to {
            return a;
        }
        let rty = a.ty.with_scalar(to);
        let op = match (from.kind(), to.kind()) {
            (Kind::Float, Kind::Float) => Op::FConvert,
            (Kind::Float, Kind::Signed) => Op::ConvertFToS,
            (Kind::Float, Kind::Unsigned) => Op::ConvertFToU,
            (Kind::Signed, Kind::Float) => Op::ConvertSToF,
            (Kind::Unsigned, Kind::Float) => Op::ConvertUToF,
            (Kind::Signed | Kind::Unsigned, Kind::Signed | Kind::Unsigned)
                if from.bits() == to.bits() =>
            {
                Op::Bitcast
            }
            // SConvert/UConvert extend by the *source's* signedness whatever the result's.
            (Kind::Signed, Kind::Signed | Kind::Unsigned) => Op::SConvert,
            (Kind::Unsigned, Kind::Signed | Kind::Unsigned) => Op::UConvert,
            (Kind::Bool, _) | (_, Kind::Bool) => {
                panic!("convert between bool and {}: use select", a.ty)
            }
        };
        self.convert_raw(op, a, rty.scalar)
    }

    fn convert_raw(&mut self, op: Op, a: Val, to: Scalar) -> Val {
        if a.ty.scalar == to {
            return a;
        }
        // Conversions of 16-bit values read from storage need no arithmetic capability, but
        // the validator wants Float16/Int16 for most other uses: be generous.
        self.arith_caps(to);
        self.arith_caps(a.ty.scalar);
        let rty = a.ty.with_scalar(to);
        let ty = self.ty(rty);
        let rid = self.inst(op, Some(ty), vec![a.into()]);
        Val { id: rid, ty: rty }
    }

    /// Reinterprets the bits as another type of the same total size (may change the lane
    /// count, e.g. `u64` ↔ `vec2<u32>`).
    #[track_caller]
    pub fn bitcast(&mut self, a: Val, to: Ty) -> Val {
        assert_eq!(
            a.ty.bytes(),
            to.bytes(),
            "bitcast between {} and {}",
            a.ty,
            to
        );
        if a.ty == to {
            return a;
        }
        self.arith_caps(to.scalar);
        let ty = self.ty(to);
        let rid = self.inst(Op::Bitcast, Some(ty), vec![a.into()]);
        Val { id: rid, ty: to }
    }

    // ------------------------------------------------------------ vectors

    /// A vector with `a` in every lane.
    pub fn splat(&mut self, a: Val, lanes: u8) -> Val {
        if lanes == 1 {
            return a;
        }
        assert!(a.ty.lanes == 1, "splat of a vector");
        let rty = Ty::vector(a.ty.scalar, lanes);
        let ty = self.ty(rty);
        let rid = self.inst(
            Op::CompositeConstruct,
            Some(ty),
            vec![Operand::IdRef(a.id); lanes as usize],
        );
        Val { id: rid, ty: rty }
    }

    /// A vector from scalars of one type.
    #[track_caller]
    pub fn vector(&mut self, parts: &[Val]) -> Val {
        assert!((2..=4).contains(&parts.len()), "vectors have 2 to 4 lanes");
        for p in parts {
            assert!(
                p.ty == Ty::scalar(parts[0].ty.scalar),
                "vector parts must be scalars of one type"
            );
        }
        let rty = Ty::vector(parts[0].ty.scalar, parts.len() as u8);
        let ty = self.ty(rty);
        let rid = self.inst(
            Op::CompositeConstruct,
            Some(ty),
            parts.iter().map(|p| Operand::IdRef(p.id)).collect(),
        );
        Val { id: rid, ty: rty }
    }

    /// Lane `i` of a vector.
    #[track_caller]
    pub fn extract(&mut self, v: Val, i: u32) -> Val {
        assert!(i < v.ty.lanes as u32, "lane {i} of {}", v.ty);
        if v.ty.lanes == 1 {
            return v;
        }
        let rty = Ty::scalar(v.ty.scalar);
        let ty = self.ty(rty);
        let rid = self.inst(
            Op::CompositeExtract,
            Some(ty),
            vec![v.into(), Operand::LiteralBit32(i)],
        );
        Val { id: rid, ty: rty }
    }

    /// `v` with lane `i` replaced by `x`.
    #[track_caller]
    pub fn insert(&mut self, v: Val, x: Val, i: u32) -> Val {
        assert!(
            i < v.ty.lanes as u32 && x.ty == Ty::scalar(v.ty.scalar),
            "insert {} into {}",
            x.ty,
            v.ty
        );
        let ty = self.ty(v.ty);
        let rid = self.inst(
            Op::CompositeInsert,
            Some(ty),
            vec![x.into(), v.into(), Operand::LiteralBit32(i)],
        );
        Val { id: rid, ty: v.ty }
    }

    /// Dot product of two float vectors.
    pub fn dot(&mut self, a: Val, b: Val) -> Val {
        self.same_ty("dot", a, b);
        let rty = Ty::scalar(a.ty.scalar);
        let ty = self.ty(rty);
        let rid = self.inst(Op::Dot, Some(ty), vec![a.into(), b.into()]);
        Val { id: rid, ty: rty }
    }

    /// Wraps a raw result id (for callers that emit their own instructions).
    pub fn val(&self, id: Word, ty: Ty) -> Val {
        Val { id, ty }
    }
}
