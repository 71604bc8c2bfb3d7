//! Element-wise self-check: every op on random inputs (and on IEEE special values) against
//! the CPU reference. `helios selfcheck` runs it on a new machine; the test suite runs the
//! same cases at the sizes its issue names.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cpu::{self, Tolerance};
use crate::{BinaryOp, DType, Device, ElementwiseOp, Result, Tensor, UnaryOp};

/// One element-wise computation to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Scalar { op: BinaryOp, scalar_first: bool },
}

impl Case {
    /// Every element-wise op and form.
    pub fn all() -> Vec<Case> {
        let mut cases: Vec<Case> = UnaryOp::ALL.iter().map(|&u| Case::Unary(u)).collect();
        for b in BinaryOp::ALL {
            cases.push(Case::Binary(b));
            if b.has_scalar_form() {
                for scalar_first in [false, true] {
                    cases.push(Case::Scalar {
                        op: b,
                        scalar_first,
                    });
                }
            }
        }
        cases
    }

    /// The element-wise op this case runs.
    pub fn op(&self) -> ElementwiseOp {
        match *self {
            Case::Unary(u) => ElementwiseOp::Unary(u),
            Case::Binary(b) => ElementwiseOp::Binary(b),
            Case::Scalar { op, scalar_first } => ElementwiseOp::Scalar { op, scalar_first },
        }
    }

    pub fn name(&self) -> String {
        match *self {
            Case::Unary(u) => u.name().to_string(),
            Case::Binary(b) => b.name().to_string(),
            Case::Scalar {
                op,
                scalar_first: false,
            } => format!("{}(x, s)", op.name()),
            Case::Scalar {
                op,
                scalar_first: true,
            } => format!("{}(s, x)", op.name()),
        }
    }

    fn tolerance(&self) -> Tolerance {
        match *self {
            Case::Unary(u) => Tolerance::unary(u),
            Case::Binary(op) | Case::Scalar { op, .. } => Tolerance::binary(op),
        }
    }
}

/// A random value for the first operand of `case`: never zero, and inside the domain where
/// the op is finite (logs and roots get positive inputs; NaN handling is checked separately).
fn sample(rng: &mut StdRng, case: Case, operand: usize) -> f32 {
    let nonzero = |v: f32| if v == 0.0 { 0.5 } else { v };
    match (case, operand) {
        (Case::Unary(UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt), _) => rng.gen_range(1e-3..1e3),
        (
            Case::Binary(BinaryOp::Pow)
            | Case::Scalar {
                op: BinaryOp::Pow, ..
            },
            0,
        ) => nonzero(rng.gen_range(-4.0..4.0)),
        (
            Case::Binary(BinaryOp::Pow)
            | Case::Scalar {
                op: BinaryOp::Pow, ..
            },
            _,
        ) => {
            // Half integers (odd/even exponents of negative bases), half fractions.
            if rng.gen_bool(0.5) {
                rng.gen_range(-4i32..=4) as f32
            } else {
                rng.gen_range(-3.0..3.0)
            }
        }
        _ => nonzero(rng.gen_range(-8.0..8.0)),
    }
}

fn random(rng: &mut StdRng, case: Case, operand: usize, n: usize) -> Vec<f32> {
    (0..n).map(|_| sample(rng, case, operand)).collect()
}

/// IEEE special values and their neighbours, for NaN/Inf semantics.
pub const SPECIALS: [f32; 12] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    1.0,
    -1.0,
    2.0,
    -2.0,
    0.5,
    1e30,
    -1e30,
];

/// Runs `case` on the given inputs stored as `dtype` and returns the first mismatch as a
/// message. The reference sees the inputs rounded to `dtype`, and its result is rounded too.
fn compare(
    device: &Device,
    case: Case,
    dtype: DType,
    a: &[f32],
    b: &[f32],
    s: f32,
) -> Result<Option<String>> {
    let shape = [a.len()];
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| dtype.round(x)).collect() };
    let (a, b) = (round(a), round(b));
    let ta = Tensor::from_slice_as(device, &a, &shape, dtype)?;
    let (got, want) = match case {
        Case::Unary(u) => (ta.unary(u)?.to_vec()?, cpu::unary(u, &a)),
        Case::Binary(op) => {
            let tb = Tensor::from_slice_as(device, &b, &shape, dtype)?;
            (ta.binary(op, &tb)?.to_vec()?, cpu::binary(op, &a, &b))
        }
        Case::Scalar { op, scalar_first } => {
            let t = if scalar_first {
                ta.scalar_first_op(op, s)?
            } else {
                ta.scalar_op(op, s)?
            };
            (t.to_vec()?, cpu::scalar(op, &a, s, scalar_first))
        }
    };
    let want = round(&want);
    let tol = case.tolerance().stored_as(dtype);
    Ok(tol.first_mismatch(&got, &want).map(|(i, g, w)| {
        let bi = b.get(i).copied().unwrap_or(s);
        format!(
            "{} {dtype} at n={}: element {i} (inputs {}, {bi}) = {g:e}, expected {w:e} (rtol {}, atol {})",
            case.name(),
            a.len(),
            a[i],
            tol.rtol,
            tol.atol
        )
    }))
}

/// Checks `case` on `n` random elements drawn from `seed`, stored as `dtype`.
pub fn check_random(
    device: &Device,
    case: Case,
    dtype: DType,
    n: usize,
    seed: u64,
) -> Result<Option<String>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let a = random(&mut rng, case, 0, n);
    let b = random(&mut rng, case, 1, n);
    let s = sample(&mut rng, case, 1);
    compare(device, case, dtype, &a, &b, s)
}

/// Checks `case` on every pair of special values (and every special value as the scalar).
pub fn check_specials(device: &Device, case: Case, dtype: DType) -> Result<Option<String>> {
    let mut a = Vec::new();
    let mut b = Vec::new();
    for &x in &SPECIALS {
        for &y in &SPECIALS {
            a.push(x);
            b.push(y);
        }
    }
    if let Case::Scalar { .. } = case {
        for &s in &SPECIALS {
            if let Some(m) = compare(device, case, dtype, &SPECIALS, &[], s)? {
                return Ok(Some(m));
            }
        }
        return Ok(None);
    }
    compare(device, case, dtype, &a, &b, 0.0)
}

/// One line of a self-check report.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub case: String,
    pub failure: Option<String>,
}

/// Every case, in every storage type, on random inputs at `sizes` and on the special values.
pub fn run(device: &Device, sizes: &[usize]) -> Result<Vec<Outcome>> {
    let mut out = Vec::new();
    for dtype in DType::ALL {
        for (i, case) in Case::all().into_iter().enumerate() {
            let mut failure = check_specials(device, case, dtype)?;
            for (j, &n) in sizes.iter().enumerate() {
                if failure.is_some() {
                    break;
                }
                failure = check_random(device, case, dtype, n, (i * 1000 + j) as u64)?;
            }
            out.push(Outcome {
                case: format!("{} {dtype}", case.name()),
                failure,
            });
        }
    }
    Ok(out)
}
