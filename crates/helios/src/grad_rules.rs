//! Backward rules of the element-wise ops, written as tensor ops (so they fuse). Each takes
//! the op's saved values (detached) and the output gradient `g`, and returns the inputs'
//! gradients, reduced to the inputs' shapes where the op broadcast them.

use helios_kernels::{BinaryOp, Compare, UnaryOp};

use crate::autograd::reduce_to;
use crate::{Result, Tensor};

/// d op(x) given x, y = op(x) and g.
pub(crate) fn unary(op: UnaryOp, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
    match op {
        UnaryOp::Copy => Ok(g.clone()),
        UnaryOp::Neg => g.neg(),
        UnaryOp::Abs => {
            let sign = x
                .compare_scalar(Compare::Gt, 0.0)?
                .sub(&x.compare_scalar(Compare::Lt, 0.0)?)?;
            g.mul(&sign)
        }
        UnaryOp::Exp => g.mul(y),
        UnaryOp::Log => g.div(x),
        UnaryOp::Sqrt => g.div(y)?.mul_scalar(0.5),
        // d x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
        UnaryOp::Rsqrt => g.mul(&y.mul(y)?.mul(y)?)?.mul_scalar(-0.5),
        UnaryOp::Tanh => g.mul(&y.mul(y)?.scalar_first_op(BinaryOp::Sub, 1.0)?),
        UnaryOp::Sigmoid => g.mul(&y.mul(&y.scalar_first_op(BinaryOp::Sub, 1.0)?)?),
        UnaryOp::Relu => x.relu_backward(g),
        UnaryOp::GeluTanh => x.gelu_tanh_backward(g),
        UnaryOp::Silu => x.silu_backward(g),
    }
}

/// (da, db) of y = op(a, b) (broadcast), given a, b, y and g.
pub(crate) fn binary(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    y: &Tensor,
    g: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (da, db) = match op {
        BinaryOp::Add => (g.clone(), g.clone()),
        BinaryOp::Sub => (g.clone(), g.neg()?),
        BinaryOp::Mul => (g.mul(b)?, g.mul(a)?),
        BinaryOp::Div => {
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
            let pick_a = a.compare(cmp, b)?;
            let da = g.mul(&pick_a)?;
            let db = g.sub(&da)?;
            (da, db)
        }
        BinaryOp::Pow => {
            // d a^b = b a^(b-1) da + a^b ln(a) db
            let da = g.mul(b)?.mul(&a.pow(&b.sub_scalar(1.0)?)?)?;
            let db = g.mul(y)?.mul(&a.log()?)?;
            (da, db)
        }
        BinaryOp::ReluBackward | BinaryOp::SiluBackward | BinaryOp::GeluTanhBackward => {
            unreachable!("activation gradients record no backward")
        }
    };
    Ok((reduce_to(&da, a.shape())?, reduce_to(&db, b.shape())?))
}

/// d op(x, s) (or op(s, x) when `scalar_first`), given x, y and g.
pub(crate) fn scalar(
    op: BinaryOp,
    s: f32,
    scalar_first: bool,
    x: &Tensor,
    y: &Tensor,
    g: &Tensor,
) -> Result<Tensor> {
    match (op, scalar_first) {
        (BinaryOp::Add, _) | (BinaryOp::Sub, false) => Ok(g.clone()),
        (BinaryOp::Sub, true) => g.neg(),
        (BinaryOp::Mul, _) => g.mul_scalar(s),
        (BinaryOp::Div, false) => g.div_scalar(s),
        // d s/x = -s / x²
        (BinaryOp::Div, true) => g.div(x)?.div(x)?.mul_scalar(-s),
        // d x^s = s x^(s-1)
        (BinaryOp::Pow, false) => g.mul(&x.pow_scalar(s - 1.0)?)?.mul_scalar(s),
        // d s^x = s^x ln s
        (BinaryOp::Pow, true) => g.mul(y)?.mul_scalar(s.ln()),
        (BinaryOp::Max, _) => g.mul(&x.compare_scalar(Compare::Ge, s)?),
        (BinaryOp::Min, _) => g.mul(&x.compare_scalar(Compare::Le, s)?),
        (BinaryOp::ReluBackward | BinaryOp::SiluBackward | BinaryOp::GeluTanhBackward, _) => {
            unreachable!("activation gradients have no scalar form")
        }
    }
}
