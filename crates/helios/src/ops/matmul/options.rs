//! What a caller asks of a product: the options a user sets (`MatmulOptions`), the overrides
//! of benchmarks, tests and backward rules (`MatmulOverrides`), and both together as the
//! crate passes them around (`MatmulSpec`).

use helios_kernels::{Activation, MatmulVariant};

use crate::{DType, Tensor};

/// What to fuse into a matmul. `Default`: plain `a·b` in `a`'s dtype.
#[derive(Clone, Copy, Debug)]
pub struct MatmulOptions<'a> {
    /// Scales the product before anything else.
    pub alpha: f32,
    /// (n) added to every row; converted to the output dtype if needed.
    pub bias: Option<&'a Tensor>,
    pub act: Activation,
    /// Added last; the output's shape, converted to the output dtype if needed.
    pub residual: Option<&'a Tensor>,
    /// Output dtype (default: the inputs').
    pub out: Option<DType>,
}

impl Default for MatmulOptions<'_> {
    fn default() -> Self {
        MatmulOptions {
            alpha: 1.0,
            bias: None,
            act: Activation::None,
            residual: None,
            out: None,
        }
    }
}

/// What benchmarks, tests and backward rules set beside [`MatmulOptions`]
/// ([`Tensor::matmul_overridden`]): a backward-only epilogue and a forced kernel. A user's
/// product needs none of it.
#[derive(Clone, Copy, Debug)]
pub struct MatmulOverrides {
    /// The product is the gradient at an activation's output and the residual holds that
    /// activation's input: the result is `act_grad'(residual) · alpha·A·B` (the residual
    /// multiplies instead of adding). Only with a residual, and no bias or `act`; records no
    /// gradient.
    pub act_grad: Activation,
    /// Run this variant instead of the chosen one; an error if the device cannot run it.
    pub variant: Option<MatmulVariant>,
    /// With `variant`: split k into this many products summed afterwards (see
    /// `Problem::split_shape` for when that is possible); without `variant` it is ignored.
    pub splits: Option<u32>,
}

impl Default for MatmulOverrides {
    fn default() -> Self {
        MatmulOverrides {
            act_grad: Activation::None,
            variant: None,
            splits: None,
        }
    }
}

/// A product's options and overrides together: what the crate passes around inside.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatmulSpec<'a> {
    pub alpha: f32,
    pub bias: Option<&'a Tensor>,
    pub act: Activation,
    pub residual: Option<&'a Tensor>,
    pub act_grad: Activation,
    pub out: Option<DType>,
    pub variant: Option<MatmulVariant>,
    pub splits: Option<u32>,
}

impl Default for MatmulSpec<'_> {
    fn default() -> Self {
        MatmulSpec::new(&MatmulOptions::default(), &MatmulOverrides::default())
    }
}

impl<'a> MatmulSpec<'a> {
    pub(crate) fn new(o: &MatmulOptions<'a>, v: &MatmulOverrides) -> MatmulSpec<'a> {
        MatmulSpec {
            alpha: o.alpha,
            bias: o.bias,
            act: o.act,
            residual: o.residual,
            act_grad: v.act_grad,
            out: o.out,
            variant: v.variant,
            splits: v.splits,
        }
    }
}

impl<'a> From<&MatmulOptions<'a>> for MatmulSpec<'a> {
    fn from(o: &MatmulOptions<'a>) -> MatmulSpec<'a> {
        MatmulSpec::new(o, &MatmulOverrides::default())
    }
}
