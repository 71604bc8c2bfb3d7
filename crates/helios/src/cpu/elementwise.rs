//! Element-wise ops (unary, binary, tensor–scalar) and their tolerances.

use helios_kernels::{BinaryOp, UnaryOp};

/// `op(x)` for one element.
pub fn unary_f32(op: UnaryOp, x: f32) -> f32 {
    let x = x as f64;
    let r = match op {
        UnaryOp::Copy => x,
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        UnaryOp::GeluTanh => {
            let z = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            0.5 * x * (1.0 + z.tanh())
        }
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
    };
    r as f32
}

/// `op(a, b)` for one pair of elements.
pub fn binary_f32(op: BinaryOp, a: f32, b: f32) -> f32 {
    let (x, y) = (a as f64, b as f64);
    let r = match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Max if x.is_nan() || y.is_nan() => f64::NAN,
        BinaryOp::Max => x.max(y),
        BinaryOp::Min if x.is_nan() || y.is_nan() => f64::NAN,
        BinaryOp::Min => x.min(y),
        BinaryOp::Pow => x.powf(y),
        _ if x.is_nan() || y.is_nan() => f64::NAN,
        BinaryOp::ReluBackward => {
            if x > 0.0 {
                y
            } else {
                0.0
            }
        }
        BinaryOp::SiluBackward => y * silu_grad(x),
        BinaryOp::GeluTanhBackward => y * gelu_tanh_grad(x),
    };
    r as f32
}

/// d/dx x·sigmoid(x) = s·(1 + x·(1 − s)); 1 and 0 at ±∞.
fn silu_grad(x: f64) -> f64 {
    if x.is_infinite() {
        return if x > 0.0 { 1.0 } else { 0.0 };
    }
    let s = 1.0 / (1.0 + (-x).exp());
    s * (1.0 + x * (1.0 - s))
}

/// d/dx 0.5·x·(1 + tanh z), z = √(2/π)·(x + 0.044715x³):
/// 0.5·(1 + tanh z) + 0.5·x·(1 − tanh² z)·√(2/π)·(1 + 3·0.044715x²); 1 and 0 at ±∞.
pub(crate) fn gelu_tanh_grad(x: f64) -> f64 {
    if x.is_infinite() {
        return if x > 0.0 { 1.0 } else { 0.0 };
    }
    let k0 = (2.0 / std::f64::consts::PI).sqrt();
    let c = 0.044715;
    let t = (k0 * (x + c * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k0 * (1.0 + 3.0 * c * x * x)
}

/// `op(x)` element by element.
pub fn unary(op: UnaryOp, x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| unary_f32(op, v)).collect()
}

/// `op(a, b)` element by element; `a` and `b` have one length.
pub fn binary(op: BinaryOp, a: &[f32], b: &[f32]) -> Vec<f32> {
    assert_eq!(a.len(), b.len(), "cpu::binary operands differ in length");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| binary_f32(op, x, y))
        .collect()
}

/// `op(x, s)`, or `op(s, x)` when `scalar_first`.
pub fn scalar(op: BinaryOp, x: &[f32], s: f32, scalar_first: bool) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            if scalar_first {
                binary_f32(op, s, v)
            } else {
                binary_f32(op, v, s)
            }
        })
        .collect()
}

/// How close a GPU result must be to the reference, per op (f32 storage and arithmetic).
///
/// An element passes when `|got − want| ≤ atol + rtol·|want|`, or both are NaN, or both are
/// the same infinity. Exactly rounded ops (add, sub, mul, neg, abs, relu, max, min) must match
/// to the last bit; division and square roots get the few ulp Vulkan allows; transcendental
/// functions get the error of a GPU's exp/log units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rtol: f32,
    pub atol: f32,
}

impl Tolerance {
    pub const EXACT: Tolerance = Tolerance {
        rtol: 0.0,
        atol: 0.0,
    };

    pub fn unary(op: UnaryOp) -> Tolerance {
        match op {
            UnaryOp::Copy | UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => Tolerance::EXACT,
            UnaryOp::Sqrt | UnaryOp::Rsqrt => Tolerance {
                rtol: 1e-6,
                atol: 0.0,
            },
            UnaryOp::Exp | UnaryOp::Log => Tolerance {
                rtol: 2e-6,
                atol: 1e-7,
            },
            UnaryOp::Tanh | UnaryOp::Sigmoid | UnaryOp::GeluTanh | UnaryOp::Silu => Tolerance {
                rtol: 1e-5,
                atol: 1e-6,
            },
        }
    }

    pub fn binary(op: BinaryOp) -> Tolerance {
        match op {
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min => {
                Tolerance::EXACT
            }
            BinaryOp::Div => Tolerance {
                rtol: 1e-6,
                atol: 0.0,
            },
            BinaryOp::Pow => Tolerance {
                rtol: 2e-5,
                atol: 1e-6,
            },
            BinaryOp::ReluBackward => Tolerance::EXACT,
            // exp(−2z) carries the rounding of z times |2z| (≤ 50 for |x| ≤ 8), and the
            // derivative crosses zero near x = −0.75, so an absolute term is needed too.
            BinaryOp::SiluBackward | BinaryOp::GeluTanhBackward => Tolerance {
                rtol: 2e-5,
                atol: 4e-6,
            },
        }
    }

    /// The tolerance after storing results as `dtype`: one rounding to f16 adds half an f16
    /// ulp (2^-11 relative), and the reference and the GPU may round on either side of it.
    pub fn stored_as(self, dtype: crate::DType) -> Tolerance {
        match dtype {
            crate::DType::F32 => self,
            crate::DType::F16 => Tolerance {
                rtol: self.rtol.max(1e-3),
                atol: self.atol.max(1e-7),
            },
            // bf16 keeps 8 significant bits: half an ulp is 2^-9 relative.
            crate::DType::BF16 => Tolerance {
                rtol: self.rtol.max(8e-3),
                atol: self.atol.max(1e-7),
            },
        }
    }

    /// Whether `got` is acceptable for `want`.
    pub fn accepts(&self, got: f32, want: f32) -> bool {
        if want.is_nan() || got.is_nan() {
            return want.is_nan() && got.is_nan();
        }
        if want.is_infinite() || got.is_infinite() {
            return got == want;
        }
        (got - want).abs() <= self.atol + self.rtol * want.abs()
    }

    /// The first element (index, got, want) that fails, if any.
    pub fn first_mismatch(&self, got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
        if got.len() != want.len() {
            return Some((got.len().min(want.len()), f32::NAN, f32::NAN));
        }
        got.iter()
            .zip(want)
            .enumerate()
            .find(|(_, (&g, &w))| !self.accepts(g, w))
            .map(|(i, (&g, &w))| (i, g, w))
    }
}

/// The elements of the view `layout` of `data` (a whole buffer) in row-major order.
pub fn gather(data: &[f32], layout: &crate::Layout) -> Vec<f32> {
    layout.indices().into_iter().map(|i| data[i]).collect()
}

/// `op(a, b)` with numpy broadcasting: `a` and `b` are row-major of `a_shape` and `b_shape`.
/// Returns the result and its shape, or `None` when the shapes are incompatible.
pub fn broadcast_binary(
    op: BinaryOp,
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
) -> Option<(Vec<f32>, Vec<usize>)> {
    let shape = crate::layout::broadcast_shapes(a_shape, b_shape)?;
    let ia = crate::Layout::contiguous(a_shape)
        .broadcast_to(&shape)
        .ok()?
        .indices();
    let ib = crate::Layout::contiguous(b_shape)
        .broadcast_to(&shape)
        .ok()?
        .indices();
    let out = ia
        .into_iter()
        .zip(ib)
        .map(|(i, j)| binary_f32(op, a[i], b[j]))
        .collect();
    Some((out, shape))
}
