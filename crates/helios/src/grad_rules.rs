//! Backward rules of the element-wise ops, written as tensor ops (so they fuse). Each takes
//! the op's saved values (detached) and the output gradient `g`, and returns the inputs'
//! gradients, reduced to the inputs' shapes where the op broadcast them.
//!
//! The one decision a reader must know: an op saves only the values its rule reads (the
//! `*_saves` functions say which). A saved value stays alive until backward and, inside a
//! fused group, is written to memory; `(x + b).gelu_tanh()` saves `x + b` for the GELU but
//! nothing for the add, so its input `x` is neither kept nor stored.

use helios_kernels::{BinaryOp, Compare, UnaryOp};

use crate::autograd::reduce_to;
use crate::layout::Dims;
use crate::{Result, Tensor};

/// An operand or result as a backward rule sees it: its shape always, its values only when
/// the rule reads them.
pub(crate) struct Saved {
    shape: Dims,
    value: Option<Tensor>,
}

impl Saved {
    /// `t`'s shape, and its values (detached) when `keep`.
    pub(crate) fn new(t: &Tensor, keep: bool) -> Saved {
        Saved {
            shape: t.shape().iter().copied().collect(),
            value: keep.then(|| t.detach()),
        }
    }

    pub(crate) fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The saved values; a rule reads only what its `*_saves` function declares.
    #[track_caller]
    pub(crate) fn get(&self) -> &Tensor {
        self.value
            .as_ref()
            .expect("a backward rule read a value its op did not save")
    }
}

/// Whether the backward of `op` reads (x, y).
pub(crate) fn unary_saves(op: UnaryOp) -> (bool, bool) {
    match op {
        UnaryOp::Copy | UnaryOp::Neg => (false, false),
        UnaryOp::Abs | UnaryOp::Log | UnaryOp::Relu | UnaryOp::GeluTanh | UnaryOp::Silu => {
            (true, false)
        }
        UnaryOp::Exp | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Tanh | UnaryOp::Sigmoid => {
            (false, true)
        }
    }
}

/// Whether the backward of `op` reads (a, b, y).
pub(crate) fn binary_saves(op: BinaryOp) -> (bool, bool, bool) {
    match op {
        BinaryOp::Add | BinaryOp::Sub => (false, false, false),
        BinaryOp::Pow => (true, true, true),
        _ => (true, true, false),
    }
}

/// Whether the backward of the scalar form of `op` reads (x, y).
pub(crate) fn scalar_saves(op: BinaryOp, scalar_first: bool) -> (bool, bool) {
    match (op, scalar_first) {
        (BinaryOp::Div, true) | (BinaryOp::Pow, false) | (BinaryOp::Max | BinaryOp::Min, _) => {
            (true, false)
        }
        (BinaryOp::Pow, true) => (false, true),
        _ => (false, false),
    }
}

/// d op(x) given x, y = op(x) and g.
pub(crate) fn unary(op: UnaryOp, x: &Saved, y: &Saved, g: &Tensor) -> Result<Tensor> {
    match op {
        UnaryOp::Copy => Ok(g.clone()),
        UnaryOp::Neg => g.neg(),
        UnaryOp::Abs => {
            let x = x.get();
            let sign = x
                .compare_scalar(Compare::Gt, 0.0)?
                .sub(&x.compare_scalar(Compare::Lt, 0.0)?)?;
            g.mul(&sign)
        }
        UnaryOp::Exp => g.mul(y.get()),
        UnaryOp::Log => g.div(x.get()),
        UnaryOp::Sqrt => g.div(y.get())?.mul_scalar(0.5),
        // d x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
        UnaryOp::Rsqrt => {
            let y = y.get();
            g.mul(&y.mul(y)?.mul(y)?)?.mul_scalar(-0.5)
        }
        UnaryOp::Tanh => {
            let y = y.get();
            g.mul(&y.mul(y)?.scalar_first_op(BinaryOp::Sub, 1.0)?)
        }
        UnaryOp::Sigmoid => {
            let y = y.get();
            g.mul(&y.mul(&y.scalar_first_op(BinaryOp::Sub, 1.0)?)?)
        }
        UnaryOp::Relu => x.get().relu_backward(g),
        UnaryOp::GeluTanh => x.get().gelu_tanh_backward(g),
        UnaryOp::Silu => x.get().silu_backward(g),
    }
}

/// (da, db) of y = op(a, b) (broadcast), given a, b, y and g.
pub(crate) fn binary(
    op: BinaryOp,
    a: &Saved,
    b: &Saved,
    y: &Saved,
    g: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (a_shape, b_shape) = (a.shape(), b.shape());
    let (da, db) = match op {
        BinaryOp::Add => (g.clone(), g.clone()),
        BinaryOp::Sub => (g.clone(), g.neg()?),
        BinaryOp::Mul => (g.mul(b.get())?, g.mul(a.get())?),
        BinaryOp::Div => {
            let (a, b) = (a.get(), b.get());
            let da = g.div(b)?;
            // -g a / b² = -da · y... written from a and b to stay exact where y rounds.
            let db = da.mul(a)?.div(b)?.neg()?;
            (da, db)
        }
        BinaryOp::Max | BinaryOp::Min => {
            // Ties send the gradient to `a`.
            let cmp = if op == BinaryOp::Max {
                Compare::Ge
            } else {
                Compare::Le
            };
            let pick_a = a.get().compare(cmp, b.get())?;
            let da = g.mul(&pick_a)?;
            let db = g.sub(&da)?;
            (da, db)
        }
        BinaryOp::Pow => {
            // d a^b = b a^(b-1) da + a^b ln(a) db
            let (a, b) = (a.get(), b.get());
            let da = g.mul(b)?.mul(&a.pow(&b.sub_scalar(1.0)?)?)?;
            let db = g.mul(y.get())?.mul(&a.log()?)?;
            (da, db)
        }
        BinaryOp::ReluBackward | BinaryOp::SiluBackward | BinaryOp::GeluTanhBackward => {
            unreachable!("activation gradients record no backward")
        }
    };
    Ok((reduce_to(&da, a_shape)?, reduce_to(&db, b_shape)?))
}

/// d op(x, s) (or op(s, x) when `scalar_first`), given x, y and g.
pub(crate) fn scalar(
    op: BinaryOp,
    s: f32,
    scalar_first: bool,
    x: &Saved,
    y: &Saved,
    g: &Tensor,
) -> Result<Tensor> {
    match (op, scalar_first) {
        (BinaryOp::Add, _) | (BinaryOp::Sub, false) => Ok(g.clone()),
        (BinaryOp::Sub, true) => g.neg(),
        (BinaryOp::Mul, _) => g.mul_scalar(s),
        (BinaryOp::Div, false) => g.div_scalar(s),
        // d s/x = -s / x²
        (BinaryOp::Div, true) => g.div(x.get())?.div(x.get())?.mul_scalar(-s),
        // d x^s = s x^(s-1)
        (BinaryOp::Pow, false) => g.mul(&x.get().pow_scalar(s - 1.0)?)?.mul_scalar(s),
        // d s^x = s^x ln s
        (BinaryOp::Pow, true) => g.mul(y.get())?.mul_scalar(s.ln()),
        (BinaryOp::Max, _) => g.mul(&x.get().compare_scalar(Compare::Ge, s)?),
        (BinaryOp::Min, _) => g.mul(&x.get().compare_scalar(Compare::Le, s)?),
        (BinaryOp::ReluBackward | BinaryOp::SiluBackward | BinaryOp::GeluTanhBackward, _) => {
            unreachable!("activation gradients have no scalar form")
        }
    }
}
