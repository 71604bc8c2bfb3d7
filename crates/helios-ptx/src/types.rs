//! PTX value types, registers and targets.

use std::fmt;

/// A PTX register type. Integer registers of one width share a class (`.b32` holds u32, s32
/// and packed halves alike), as PTX allows; floats get their own class so the text reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ty {
    Pred,
    B16,
    B32,
    B64,
    U32,
    S32,
    U64,
    S64,
    F16,
    BF16,
    F32,
    F64,
    /// Two f16 in one 32-bit register.
    F16x2,
    /// Two bf16 in one 32-bit register.
    BF16x2,
}

impl Ty {
    /// The type as an instruction suffix (`.u32`, `.bf16x2`, ...).
    pub const fn suffix(self) -> &'static str {
        match self {
            Ty::Pred => ".pred",
            Ty::B16 => ".b16",
            Ty::B32 => ".b32",
            Ty::B64 => ".b64",
            Ty::U32 => ".u32",
            Ty::S32 => ".s32",
            Ty::U64 => ".u64",
            Ty::S64 => ".s64",
            Ty::F16 => ".f16",
            Ty::BF16 => ".bf16",
            Ty::F32 => ".f32",
            Ty::F64 => ".f64",
            Ty::F16x2 => ".f16x2",
            Ty::BF16x2 => ".bf16x2",
        }
    }

    /// Size in bytes (a predicate counts as 0: it has no memory form).
    pub const fn bytes(self) -> u32 {
        match self {
            Ty::Pred => 0,
            Ty::B16 | Ty::F16 | Ty::BF16 => 2,
            Ty::B32 | Ty::U32 | Ty::S32 | Ty::F32 | Ty::F16x2 | Ty::BF16x2 => 4,
            Ty::B64 | Ty::U64 | Ty::S64 | Ty::F64 => 8,
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(
            self,
            Ty::F16 | Ty::BF16 | Ty::F32 | Ty::F64 | Ty::F16x2 | Ty::BF16x2
        )
    }

    /// The register class this type lives in.
    pub(crate) const fn class(self) -> Class {
        match self {
            Ty::Pred => Class::Pred,
            Ty::B16 | Ty::F16 | Ty::BF16 => Class::B16,
            Ty::B32 | Ty::U32 | Ty::S32 | Ty::F16x2 | Ty::BF16x2 => Class::B32,
            Ty::B64 | Ty::U64 | Ty::S64 => Class::B64,
            Ty::F32 => Class::F32,
            Ty::F64 => Class::F64,
        }
    }
}

/// A register class: one `.reg` declaration each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Class {
    Pred,
    B16,
    B32,
    B64,
    F32,
    F64,
}

impl Class {
    pub(crate) const ALL: [Class; 6] = [
        Class::Pred,
        Class::B16,
        Class::B32,
        Class::B64,
        Class::F32,
        Class::F64,
    ];

    pub(crate) const fn prefix(self) -> &'static str {
        match self {
            Class::Pred => "p",
            Class::B16 => "h",
            Class::B32 => "r",
            Class::B64 => "rd",
            Class::F32 => "f",
            Class::F64 => "fd",
        }
    }

    pub(crate) const fn decl(self) -> &'static str {
        match self {
            Class::Pred => ".pred",
            Class::B16 => ".b16",
            Class::B32 => ".b32",
            Class::B64 => ".b64",
            Class::F32 => ".f32",
            Class::F64 => ".f64",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// A virtual register of a known type. The driver's JIT (or `ptxas`) allocates the real ones,
/// so a kernel may use as many as it likes; reuse one (`Kernel::assign`) only for loop state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reg {
    pub(crate) ty: Ty,
    pub(crate) n: u32,
}

impl Reg {
    pub const fn ty(self) -> Ty {
        self.ty
    }

    /// The same register read as another type of its class (a u32 as s32, two halves as
    /// one b32). Panics on a class change: that is a builder bug, not an input.
    #[track_caller]
    pub fn retype(self, ty: Ty) -> Reg {
        assert_eq!(
            self.ty.class(),
            ty.class(),
            "{:?} cannot be read as {:?}",
            self.ty,
            ty
        );
        Reg { ty, n: self.n }
    }
}

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}{}", self.ty.class().prefix(), self.n)
    }
}

/// An instruction operand: a register or an immediate of the instruction's type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Reg(Reg),
    Imm(i64),
    /// An f32 immediate, written as its exact bit pattern (`0f3F800000`).
    F32(f32),
}

impl From<Reg> for Op {
    fn from(r: Reg) -> Op {
        Op::Reg(r)
    }
}

impl From<i64> for Op {
    fn from(v: i64) -> Op {
        Op::Imm(v)
    }
}

impl From<u32> for Op {
    fn from(v: u32) -> Op {
        Op::Imm(i64::from(v))
    }
}

impl From<i32> for Op {
    fn from(v: i32) -> Op {
        Op::Imm(i64::from(v))
    }
}

impl From<f32> for Op {
    fn from(v: f32) -> Op {
        Op::F32(v)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Reg(r) => r.fmt(f),
            Op::Imm(v) => v.fmt(f),
            Op::F32(v) => write!(f, "0f{:08X}", v.to_bits()),
        }
    }
}

/// The GPU a module is built for: `sm_<major><minor>` and whether it may use the
/// architecture-specific instructions of exactly that chip (`sm_90a`: `wgmma`, `setmaxnreg`).
/// Code for an `a` target runs on that architecture only, so the device decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Compute capability × 10 (90 for Hopper, 80 for the A100).
    pub sm: u32,
    pub arch_specific: bool,
}

impl Target {
    pub const SM80: Target = Target {
        sm: 80,
        arch_specific: false,
    };
    pub const SM90: Target = Target {
        sm: 90,
        arch_specific: false,
    };
    pub const SM90A: Target = Target {
        sm: 90,
        arch_specific: true,
    };

    /// `sm_90a`, as `.target` and `ptxas -arch` write it.
    pub fn name(self) -> String {
        format!(
            "sm_{}{}",
            self.sm,
            if self.arch_specific { "a" } else { "" }
        )
    }

    /// The PTX ISA version a module for this target declares: the oldest that knows it.
    pub const fn isa(self) -> &'static str {
        if self.sm >= 90 {
            // 8.7: `tensormap.replace` takes global strides in bytes (before 8.6 ptxas read
            // them in 16-byte units).
            "8.7"
        } else {
            "7.0"
        }
    }

    /// `cp.async` (Ampere's asynchronous 4–16-byte copies), `ldmatrix`, bf16 `mma.sync`.
    pub const fn has_cp_async(self) -> bool {
        self.sm >= 80
    }

    /// `mbarrier` transaction counts, `cp.async.bulk`, `stmatrix`, `fence.proxy.async`.
    pub const fn has_bulk(self) -> bool {
        self.sm >= 90
    }

    /// `tensormap.replace` and `tensormap.cp_fenceproxy` (tensor maps built on the device):
    /// Hopper's architecture-specific target only.
    pub const fn has_tensormap(self) -> bool {
        self.has_wgmma()
    }

    /// `wgmma` and `setmaxnreg`: Hopper's architecture-specific target only.
    pub const fn has_wgmma(self) -> bool {
        self.sm == 90 && self.arch_specific
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
