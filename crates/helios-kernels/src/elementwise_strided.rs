//! The strided element-wise variant: inputs of any layout (broadcast, transposed, sliced,
//! offset), output contiguous.
//!
//! The one decision a reader must know: the layout is data, not code. Sizes and strides
//! travel in push constants (`dims` of each, outermost first), so one kernel per dimension
//! count serves every shape; each invocation turns its output index into coordinates with
//! `dims − 1` divisions and into each input's element offset with multiply-adds. The host
//! merges dimensions that are contiguous in every operand first, so a transposed matrix
//! needs 2 dimensions whatever its rank, and a plain contiguous tensor with an offset needs 1.

use helios_spirv::{KernelBuilder, Param, Scalar, Ty, Val};

use crate::launch::{Arg, Args};

/// Sizes and strides (in elements) of a strided launch, every list `dims` long and ordered
/// outermost first; the output is contiguous in `shape`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strides {
    /// (dims) the output's shape.
    pub shape: Vec<u32>,
    /// Per input: (dims) strides, 0 along broadcast dimensions, and the element offset.
    pub inputs: Vec<(Vec<u32>, u32)>,
}

/// The push-constant parameters of a strided kernel.
pub(crate) struct StridedParams {
    /// (dims) output sizes.
    shape: Vec<Param>,
    /// Per input: (dims) strides.
    strides: Vec<Vec<Param>>,
    /// Per input: element offset.
    offsets: Vec<Param>,
}

/// Declares the sizes, then each input's strides and offset (after the family's own params).
pub(crate) fn declare(k: &mut KernelBuilder, dims: usize, inputs: usize) -> StridedParams {
    let u32_ty = Ty::scalar(Scalar::U32);
    let shape = (0..dims)
        .map(|d| k.param(&format!("size{d}"), u32_ty))
        .collect();
    let mut strides = Vec::with_capacity(inputs);
    let mut offsets = Vec::with_capacity(inputs);
    for i in 0..inputs {
        let name = ["a", "b"][i];
        strides.push(
            (0..dims)
                .map(|d| k.param(&format!("{name}_stride{d}"), u32_ty))
                .collect(),
        );
        offsets.push(k.param(&format!("{name}_offset"), u32_ty));
    }
    StridedParams {
        shape,
        strides,
        offsets,
    }
}

/// Each input's element offset for output element `i`: its coordinates, from `dims − 1`
/// divisions, against the input's strides.
pub(crate) fn offsets(k: &mut KernelBuilder, i: Val, p: &StridedParams) -> Vec<Val> {
    let dims = p.shape.len();
    let mut offsets: Vec<Val> = p.offsets.iter().map(|&o| k.load_param(o)).collect();
    let mut rest = i;
    for d in (0..dims).rev() {
        // The outermost coordinate is what is left: no division needed.
        let c = if d == 0 {
            rest
        } else {
            let size = k.load_param(p.shape[d]);
            let c = k.rem(rest, size);
            rest = k.div(rest, size);
            c
        };
        for (off, strides) in offsets.iter_mut().zip(&p.strides) {
            let stride = k.load_param(strides[d]);
            let step = k.mul(c, stride);
            *off = k.add(*off, step);
        }
    }
    offsets
}

/// Appends the strided arguments in declaration order, checking their lengths and that no
/// offset overflows the kernel's 32-bit index arithmetic.
pub(crate) fn push_args(dims: usize, n: u64, st: &Strides, args: &mut Args) -> Result<(), String> {
    if st.shape.len() != dims || st.inputs.iter().any(|(s, _)| s.len() != dims) {
        return Err(format!("expects {dims} sizes and strides per input"));
    }
    let count: u64 = st.shape.iter().map(|&s| u64::from(s)).product();
    if count != n {
        return Err(format!(
            "shape {:?} holds {count} elements, not {n}",
            st.shape
        ));
    }
    args.extend(st.shape.iter().map(|&s| Arg::U32(s)));
    for (strides, offset) in &st.inputs {
        let last: u64 = u64::from(*offset)
            + st.shape
                .iter()
                .zip(strides)
                .map(|(&s, &t)| u64::from(s.saturating_sub(1)) * u64::from(t))
                .sum::<u64>();
        if last > u64::from(u32::MAX) {
            return Err(format!(
                "element offset {last} exceeds 32 bits; make the tensor contiguous first"
            ));
        }
        args.extend(strides.iter().map(|&s| Arg::U32(s)));
        args.push(Arg::U32(*offset));
    }
    Ok(())
}
