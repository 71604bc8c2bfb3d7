//! The tensor layer's error type: every failure a user can cause or meet, with a message that
//! says what to do.

use helios_kernels::KernelError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Vulkan(#[from] helios_vk::Error),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("{op}: shapes {lhs:?} and {rhs:?} cannot be broadcast together (aligned from the right, sizes must be equal or 1); reshape or narrow an operand")]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },
    #[error("shape {shape:?} holds {expected} elements, but {got} values were given")]
    DataLength {
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },
    #[error("{op}: dtypes {lhs} and {rhs} differ; convert one operand first")]
    DTypeMismatch {
        op: &'static str,
        lhs: crate::DType,
        rhs: crate::DType,
    },
    #[error("{op}: the tensors live on different devices; move one with to_vec/from_slice")]
    DeviceMismatch { op: &'static str },
    #[error("{op} on shape {shape:?}: {detail}")]
    InvalidView {
        op: &'static str,
        shape: Vec<usize>,
        detail: String,
    },
    #[error("{op}: the operands need {dims} strided dimensions after merging contiguous ones, at most {max} are supported; call contiguous() on an operand first")]
    TooManyDims {
        op: &'static str,
        dims: usize,
        max: usize,
    },
    #[error("{op}: axis {axis} is out of range for a tensor of {ndim} dimensions; use 0..{ndim} (or -1 for the last)")]
    Axis {
        op: &'static str,
        axis: isize,
        ndim: usize,
    },
    #[error(
        "{op} of an empty axis is undefined (shape {shape:?}); reduce a non-empty axis or use sum"
    )]
    EmptyReduction { op: &'static str, shape: Vec<usize> },
    #[error("{op}: {detail}")]
    Invalid { op: &'static str, detail: String },
    #[error("{op}: index {value} at position {at} is outside [0, {bound}); fix the indices (or pass that value as the op's ignore index where it has one)")]
    IndexOutOfRange {
        op: &'static str,
        at: usize,
        value: u32,
        bound: usize,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
