//! How a fused kernel reads one stored input: the whole node element for element, a view
//! broadcast to the reading op's shape with its dimensions merged, or a padded input's
//! window. Pure functions of the input and the op (no group, no kernel being built).

use helios_kernels::{FusedDims, FusedInput, Window};

use super::Input;
use crate::layout::{is_contiguous, merge_dims_one, Dims};
use crate::{Error, Result};

/// How an op of `len` elements over `op_inputs` reads its stored input `i`: the kernel
/// input, and the element of `i`'s node where the read starts. The whole node, dense,
/// element for element (however it is shaped), or its view broadcast to the op's shape
/// (`shape`, computed on first need), dimensions merged.
pub(super) fn read(
    i: &Input,
    len: usize,
    op_inputs: &[Input],
    shape: &mut Option<Dims>,
) -> Result<(FusedInput, usize)> {
    let dtype = i.node.dtype.storage();
    let whole = || -> Result<(FusedInput, usize)> {
        let input = FusedInput {
            dtype,
            shape: FusedDims::from_slice(&[to_u32(i.node.len)?]),
            strides: FusedDims::from_slice(&[1]),
            aligned: true,
            window: None,
        };
        Ok((input, 0))
    };
    let Some(layout) = &i.view else {
        return whole();
    };
    let shape = shape.get_or_insert_with(|| out_shape(op_inputs));
    let strides = layout
        .broadcast_strides(shape)
        .expect("shapes were checked when the node was built");
    if layout.offset() == 0 && len == i.node.len && is_contiguous(shape, &strides) {
        return whole();
    }
    let (shape, strides) = merge_dims_one(shape, &strides);
    let input = FusedInput {
        dtype,
        shape: shape.iter().map(|&v| to_u32(v)).collect::<Result<_>>()?,
        strides: strides.iter().map(|&v| to_u32(v)).collect::<Result<_>>()?,
        aligned: layout.offset() % 4 == 0,
        window: None,
    };
    Ok((input, layout.offset()))
}

/// How `ElemOp::Pad { dim, start, full }` reads its input `i`: the view in a window at
/// `start..` along `dim` of the padded shape (zeros elsewhere), and the element where the
/// read starts.
pub(super) fn read_padded(
    i: &Input,
    dim: usize,
    start: usize,
    full: usize,
) -> Result<(FusedInput, usize)> {
    let view = i.view.as_ref().expect("a padded input keeps its view");
    let padded = |d: usize| if d == dim { full } else { view.shape()[d] };
    let input = FusedInput {
        dtype: i.node.dtype.storage(),
        shape: (0..view.ndim())
            .map(|d| to_u32(padded(d)))
            .collect::<Result<_>>()?,
        strides: view
            .strides()
            .iter()
            .map(|&v| to_u32(v))
            .collect::<Result<_>>()?,
        aligned: false,
        window: Some(Window {
            dim: dim as u8,
            start: to_u32(start)?,
            len: to_u32(view.shape()[dim])?,
        }),
    };
    Ok((input, view.offset()))
}

/// A size, stride or offset as the kernels' 32-bit index arithmetic takes it.
pub(super) fn to_u32(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::Kernel(helios_kernels::KernelError::TooLarge {
            what: "stride or size",
            size: v as u64,
        })
    })
}

/// The broadcast shape of an op's inputs.
pub(super) fn out_shape(inputs: &[Input]) -> Dims {
    let mut views = inputs.iter().map(|i| {
        i.view
            .as_ref()
            .expect("an op's inputs all have views, or none")
    });
    let mut shape = Dims::from_slice(views.next().expect("ops have inputs").shape());
    for view in views {
        // Usually the shape already: a broadcast operand read beside a full one.
        if view.broadcast_strides(&shape).is_none() {
            let wider = crate::layout::broadcast_shapes(&shape, view.shape())
                .expect("shapes were checked when the node was built");
            shape = Dims::from_vec(wider);
        }
    }
    shape
}
