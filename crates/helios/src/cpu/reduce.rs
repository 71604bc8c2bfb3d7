//! Reference reductions (f64 accumulation) and their tolerances.
//!
//! Semantics the kernels promise: sum and mean propagate NaN and infinities as IEEE addition
//! does; max and min are NaN when the axis holds a NaN; argmax is the first index of the
//! maximum, a NaN counting as the maximum (the first NaN wins), as in PyTorch.

use crate::{DType, Reduction};

/// `op` over `axis` of a row-major `shape` (`None`: every element). Returns the values (sum,
/// mean, max, min; rounded to f32) or, for argmax, the indices as f32-free u32s in `.1`.
pub fn reduce(
    op: Reduction,
    x: &[f32],
    shape: &[usize],
    axis: Option<usize>,
) -> (Vec<f32>, Vec<u32>) {
    let (outer, len, inner) = match axis {
        None => (1, x.len(), 1),
        Some(a) => (
            shape[..a].iter().product(),
            shape[a],
            shape[a + 1..].iter().product(),
        ),
    };
    let mut values = Vec::new();
    let mut indices = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| x[(o * len + j) * inner + i] as f64;
            match op {
                Reduction::Sum | Reduction::Mean => {
                    let s: f64 = (0..len).map(at).sum();
                    let v = if op == Reduction::Mean {
                        s / len as f64
                    } else {
                        s
                    };
                    values.push(v as f32);
                }
                Reduction::Max | Reduction::Min => {
                    let mut best = if op == Reduction::Max {
                        f64::NEG_INFINITY
                    } else {
                        f64::INFINITY
                    };
                    for j in 0..len {
                        let v = at(j);
                        if v.is_nan() {
                            best = f64::NAN;
                            break;
                        }
                        best = if op == Reduction::Max {
                            best.max(v)
                        } else {
                            best.min(v)
                        };
                    }
                    values.push(best as f32);
                }
                Reduction::ArgMax => {
                    let mut best = 0usize;
                    for j in 0..len {
                        let (v, b) = (at(j), at(best));
                        if v.is_nan() {
                            best = j;
                            break;
                        }
                        if v > b {
                            best = j;
                        }
                    }
                    indices.push(best as u32);
                }
            }
        }
    }
    (values, indices)
}

/// Whether `got` is acceptable for a reduction whose exact value is `want`, given the sum of
/// absolute values `abs_sum` and the count `n` of the reduced elements.
///
/// Max, min: exact. Sum: f32 accumulation in any order errs by at most a few ulp of the
/// partial sums, bounded here by `1e-6·log2(n)+2e-7·√n` of `abs_sum` (generous on the
/// worst case, tight enough to catch a lost or doubled element of typical size), plus one
/// rounding of the result to the storage dtype. Mean: the sum's bound divided by `n`.
pub fn reduce_accepts(
    op: Reduction,
    dtype: DType,
    got: f32,
    want: f32,
    abs_sum: f64,
    n: usize,
) -> bool {
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return got == want;
    }
    let storage_rtol = match dtype {
        DType::F32 => 0.0,
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
    };
    let diff = (got as f64 - want as f64).abs();
    match op {
        Reduction::Max | Reduction::Min | Reduction::ArgMax => diff == 0.0,
        Reduction::Sum | Reduction::Mean => {
            let nf = n.max(1) as f64;
            let mut atol = abs_sum * (1e-6 * nf.log2().max(1.0) + 2e-7 * nf.sqrt());
            if op == Reduction::Mean {
                atol /= nf;
            }
            diff <= atol + storage_rtol * (want as f64).abs() + 1e-30
        }
    }
}

/// Sum of |x| over the same elements `reduce` combines, per output (for `reduce_accepts`).
pub fn abs_sums(x: &[f32], shape: &[usize], axis: Option<usize>) -> Vec<f64> {
    let (outer, len, inner) = match axis {
        None => (1, x.len(), 1),
        Some(a) => (
            shape[..a].iter().product::<usize>(),
            shape[a],
            shape[a + 1..].iter().product::<usize>(),
        ),
    };
    let mut out = vec![0.0f64; outer * inner];
    for o in 0..outer {
        for j in 0..len {
            let row = &x[(o * len + j) * inner..(o * len + j + 1) * inner];
            for (acc, v) in out[o * inner..(o + 1) * inner].iter_mut().zip(row) {
                *acc += v.abs() as f64;
            }
        }
    }
    out
}
