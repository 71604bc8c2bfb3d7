//! The signature of a fused kernel (everything that changes its SPIR-V): the expression's
//! instructions, its inputs' views and windows, its outputs; with the name and the checks
//! a signature must pass.

use helios_spirv::{Binding, CmpOp};

use crate::elementwise::{BinaryOp, UnaryOp};
use crate::storage::Storage;
use crate::KernelError;

/// A comparison giving 1.0 where true and 0.0 where false (NaN compares unequal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compare {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl Compare {
    pub const ALL: [Compare; 6] = [
        Compare::Lt,
        Compare::Le,
        Compare::Gt,
        Compare::Ge,
        Compare::Eq,
        Compare::Ne,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Compare::Lt => "lt",
            Compare::Le => "le",
            Compare::Gt => "gt",
            Compare::Ge => "ge",
            Compare::Eq => "eq",
            Compare::Ne => "ne",
        }
    }

    /// The comparison on f64 values (the CPU reference).
    pub fn eval(self, a: f64, b: f64) -> bool {
        match self {
            Compare::Lt => a < b,
            Compare::Le => a <= b,
            Compare::Gt => a > b,
            Compare::Ge => a >= b,
            Compare::Eq => a == b,
            Compare::Ne => a != b,
        }
    }

    pub(super) fn op(self) -> CmpOp {
        match self {
            Compare::Lt => CmpOp::Lt,
            Compare::Le => CmpOp::Le,
            Compare::Gt => CmpOp::Gt,
            Compare::Ge => CmpOp::Ge,
            Compare::Eq => CmpOp::Eq,
            Compare::Ne => CmpOp::Ne,
        }
    }
}

/// One instruction of a fused expression. Operands are indices of earlier instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Instr {
    /// Input `i`'s element, widened to f32.
    Input(u16),
    /// Scalar parameter `i` (a push constant: the same kernel serves every value, and no
    /// compiler folds `x · 0` to 0 for a NaN `x`).
    Scalar(u16),
    Unary(UnaryOp, u32),
    /// `op(a, b)`. A `Max` or `Min` with one `Scalar` operand takes that scalar to be a
    /// number (three instructions instead of six: only the other operand's NaN is tested);
    /// `launch` refuses a NaN there. `max(x, NaN)` is NaN for every `x`, so it is written
    /// `Add` (`x + NaN`).
    Binary(BinaryOp, u32, u32),
    /// 1.0 where `a op b`, else 0.0.
    Compare(Compare, u32, u32),
    /// `c != 0 ? a : b` (c, a, b).
    Where(u32, u32, u32),
    /// The value rounded to a storage format's precision (a cast inside the expression).
    Round(Storage, u32),
}

impl Instr {
    pub fn name(&self) -> &'static str {
        match self {
            Instr::Input(_) => "input",
            Instr::Scalar(_) => "scalar",
            Instr::Unary(u, _) => u.name(),
            Instr::Binary(b, ..) => b.name(),
            Instr::Compare(c, ..) => c.name(),
            Instr::Where(..) => "where",
            Instr::Round(..) => "cast",
        }
    }

    fn operands(&self) -> impl Iterator<Item = u32> {
        let (a, b, c) = match *self {
            Instr::Input(_) | Instr::Scalar(_) => (None, None, None),
            Instr::Unary(_, a) | Instr::Round(_, a) => (Some(a), None, None),
            Instr::Binary(_, a, b) | Instr::Compare(_, a, b) => (Some(a), Some(b), None),
            Instr::Where(c, a, b) => (Some(c), Some(a), Some(b)),
        };
        a.into_iter().chain(b).chain(c)
    }
}

/// Sizes or strides of a fused input, inline up to `MAX_DIMS`.
pub type Dims = smallvec::SmallVec<[u32; crate::MAX_DIMS]>;

/// One input of a fused kernel, read as a view of the output's elements: output element `e`
/// reads the input at the coordinates of `e` in `shape`, through `strides`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FusedInput {
    pub dtype: Storage,
    /// (dims) the view's shape, outermost first, dimensions contiguous in both the view and
    /// the input merged; its product is the kernel's element count. Inline: the scheduler
    /// builds a signature per realisation to look its kernel up, without allocating.
    pub shape: Dims,
    /// (dims) element strides along `shape`; 0 where broadcast.
    pub strides: Dims,
    /// Whether the address passed for this input is 16-byte aligned for vec4 loads (its
    /// first element sits a multiple of 4 elements into a buffer).
    pub aligned: bool,
    /// A zero-padded read: only coordinates `start..start + len` along `dim` of `shape` hold
    /// input elements (at coordinate − start); elsewhere the value is 0. The vector form
    /// keeps it only where every vec4 lies wholly inside or outside (see
    /// [`Window::keeps_vec4s`]).
    pub window: Option<Window>,
}

/// The window of a zero-padded input (see [`FusedInput::window`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub dim: u8,
    pub start: u32,
    pub len: u32,
}

impl Window {
    /// Whether the four elements of every vec4 of a view of `dims` dimensions lie on the same
    /// side of the window: it cuts an outer dimension (a concatenation along it: the
    /// gradient of q, k and v assembled into one of a fused QKV), or the innermost one at
    /// multiples of 4.
    pub fn keeps_vec4s(&self, dims: usize) -> bool {
        usize::from(self.dim) + 1 < dims || (self.start % 4 == 0 && self.len % 4 == 0)
    }
}

/// The signature of a fused kernel: everything that changes the emitted SPIR-V.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FusedKernel {
    pub binding: Binding,
    /// Elements of every output (each dense).
    pub len: u32,
    pub inputs: Vec<FusedInput>,
    pub code: Vec<Instr>,
    /// (instruction, storage) of each output.
    pub outputs: Vec<(u32, Storage)>,
    /// Scalar parameters (`Instr::Scalar`), pushed after the addresses.
    pub scalars: u16,
    /// vec4s per invocation in the vector form (1, 2 or 4).
    pub vecs: u8,
}

impl FusedKernel {
    /// Whether invocations handle vec4s: the element count and every input view's innermost
    /// dimension are multiples of 4, so four consecutive elements share a row of each input,
    /// and every window keeps vec4s whole.
    pub fn vectorized(&self) -> bool {
        self.len % 4 == 0
            && self.inputs.iter().all(|i| {
                i.shape.last().is_some_and(|&s| s % 4 == 0)
                    && i.window.map_or(true, |w| w.keeps_vec4s(i.shape.len()))
            })
    }

    /// Bytes of push constants a kernel needs: an address per input and output, 4 bytes per
    /// scalar.
    pub fn push_bytes(inputs: usize, outputs: usize, scalars: usize) -> u32 {
        (8 * (inputs + outputs) + 4 * scalars) as u32
    }

    /// `fused<n>_<first op>_<last op>`: enough to recognise a group in a profile.
    pub fn name(&self) -> String {
        let ops: Vec<&str> = self
            .code
            .iter()
            .filter(|i| !matches!(i, Instr::Input(_) | Instr::Scalar(_)))
            .map(Instr::name)
            .collect();
        match (ops.first(), ops.last()) {
            (Some(a), Some(b)) if ops.len() > 1 => format!("fused{}_{a}_{b}", ops.len()),
            (Some(a), _) => format!("fused1_{a}"),
            _ => "fused0_copy".to_string(),
        }
    }

    /// Checks operands refer to earlier instructions, inputs exist and shapes agree.
    pub fn check(&self) -> Result<(), KernelError> {
        let bad = |detail: String| KernelError::Arguments {
            kernel: self.name(),
            detail,
        };
        for (i, ins) in self.code.iter().enumerate() {
            if ins.operands().any(|o| o as usize >= i) {
                return Err(bad(format!("instruction {i} reads a later value")));
            }
            match ins {
                Instr::Input(x) if usize::from(*x) >= self.inputs.len() => {
                    return Err(bad(format!("instruction {i} reads missing input {x}")));
                }
                Instr::Scalar(x) if *x >= self.scalars => {
                    return Err(bad(format!("instruction {i} reads missing scalar {x}")));
                }
                _ => {}
            }
        }
        for inp in &self.inputs {
            let n: u64 = inp.shape.iter().map(|&s| u64::from(s)).product();
            if inp.strides.len() != inp.shape.len() || n != u64::from(self.len) {
                return Err(bad(format!(
                    "input view {:?} (strides {:?}) does not hold {} elements",
                    inp.shape, inp.strides, self.len
                )));
            }
        }
        if self.outputs.is_empty()
            || self
                .outputs
                .iter()
                .any(|&(o, _)| o as usize >= self.code.len())
        {
            return Err(bad("outputs must name instructions".into()));
        }
        Ok(())
    }
}
