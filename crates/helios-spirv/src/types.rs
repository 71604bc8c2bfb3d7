//! The IR's value types: scalars, short vectors, and the typed values a kernel computes with.
//!
//! Every value carries its type, so the builder picks the right SPIR-V opcode (`OpFAdd` vs
//! `OpIAdd`, `OpFOrdLessThan` vs `OpULessThan`, ...) and checks operand agreement itself.
//! A kernel author never spells an opcode.

use rspirv::spirv::Word;

/// A scalar type the IR knows. bfloat16 is a storage format, not an arithmetic type: kernels
/// keep it in `U16` and widen it to f32 with a shift, which works on every device. `BF16`
/// exists as the component of a cooperative matrix (SPV_KHR_bfloat16, see `coop`) and as the
/// bits moved into one (a bitcast and an extract); scalar arithmetic on it is not valid
/// SPIR-V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scalar {
    Bool,
    U8,
    U16,
    F16,
    F32,
    /// IEEE binary64 (needs `shaderFloat64`; exact-integer arithmetic in helios-field).
    F64,
    /// bfloat16: cooperative-matrix components and the bits moved into them only.
    BF16,
    I32,
    U32,
    I64,
    U64,
}

/// How a scalar behaves in arithmetic; picks the opcode family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Float,
    Signed,
    Unsigned,
}

impl Scalar {
    pub const fn kind(self) -> Kind {
        match self {
            Scalar::Bool => Kind::Bool,
            Scalar::F16 | Scalar::BF16 | Scalar::F32 | Scalar::F64 => Kind::Float,
            Scalar::I32 | Scalar::I64 => Kind::Signed,
            Scalar::U8 | Scalar::U16 | Scalar::U32 | Scalar::U64 => Kind::Unsigned,
        }
    }

    /// Size in bytes as laid out in a buffer or push-constant block (Bool has no layout).
    pub const fn bytes(self) -> u32 {
        match self {
            Scalar::Bool => 0,
            Scalar::U8 => 1,
            Scalar::U16 | Scalar::F16 | Scalar::BF16 => 2,
            Scalar::F32 | Scalar::I32 | Scalar::U32 => 4,
            Scalar::F64 | Scalar::I64 | Scalar::U64 => 8,
        }
    }

    pub const fn bits(self) -> u32 {
        self.bytes() * 8
    }

    pub const fn is_float(self) -> bool {
        matches!(self.kind(), Kind::Float)
    }

    pub const fn is_int(self) -> bool {
        matches!(self.kind(), Kind::Signed | Kind::Unsigned)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Scalar::Bool => "bool",
            Scalar::U8 => "u8",
            Scalar::U16 => "u16",
            Scalar::F16 => "f16",
            Scalar::F32 => "f32",
            Scalar::F64 => "f64",
            Scalar::BF16 => "bf16",
            Scalar::I32 => "i32",
            Scalar::U32 => "u32",
            Scalar::I64 => "i64",
            Scalar::U64 => "u64",
        }
    }
}

/// A scalar or a vector of 2 to 4 lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ty {
    pub scalar: Scalar,
    pub lanes: u8,
}

impl Ty {
    pub const fn scalar(scalar: Scalar) -> Ty {
        Ty { scalar, lanes: 1 }
    }

    #[track_caller]
    pub fn vector(scalar: Scalar, lanes: u8) -> Ty {
        assert!(
            (1..=4).contains(&lanes),
            "vectors have 1 to 4 lanes, got {lanes}"
        );
        Ty { scalar, lanes }
    }

    pub const fn is_vector(self) -> bool {
        self.lanes > 1
    }

    /// The same shape with another scalar (e.g. the bool vector a comparison yields).
    pub fn with_scalar(self, scalar: Scalar) -> Ty {
        Ty {
            scalar,
            lanes: self.lanes,
        }
    }

    /// Bytes this type occupies in a buffer or push-constant block.
    pub const fn bytes(self) -> u32 {
        self.scalar.bytes() * self.lanes as u32
    }
}

impl std::fmt::Display for Ty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.lanes == 1 {
            f.write_str(self.scalar.name())
        } else {
            write!(f, "vec{}<{}>", self.lanes, self.scalar.name())
        }
    }
}

/// A value computed by the kernel: an SPIR-V result id and its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Val {
    pub id: Word,
    pub ty: Ty,
}

impl Val {
    pub const fn scalar(&self) -> Scalar {
        self.ty.scalar
    }
}
