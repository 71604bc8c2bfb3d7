//! Reference softmax, log-softmax and their backward passes (f64), and their tolerances.
//!
//! Semantics the kernels promise: y = softmax(scale·x) over rows of `len`; with a causal mask
//! (`causal_rows = Some(T)`), column j of row r is masked when j > r mod T. A row with every
//! entry -inf or masked gives zeros (softmax) or -inf (log-softmax); a NaN anywhere in a row
//! makes the whole row NaN (through the shifted exponentials, exactly as the kernels compute).
//! Backward: softmax dx = scale·y·(dy − Σ y·dy), log-softmax dx = scale·(dy − exp(y)·Σ dy),
//! sums over unmasked columns, dx = 0 in masked columns.

use crate::DType;

fn masked(r: usize, j: usize, causal_rows: Option<usize>) -> bool {
    causal_rows.is_some_and(|t| j > r % t.max(1))
}

/// Softmax (or log-softmax) of every row of `len` in `x`.
pub fn softmax(
    x: &[f32],
    len: usize,
    causal_rows: Option<usize>,
    scale: f32,
    log: bool,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for (r, row) in x.chunks(len.max(1)).enumerate() {
        let xs: Vec<f64> = row
            .iter()
            .enumerate()
            .map(|(j, &v)| {
                if masked(r, j, causal_rows) {
                    f64::NEG_INFINITY
                } else {
                    v as f64 * scale as f64
                }
            })
            .collect();
        // A NaN makes the max NaN here; the kernels may skip it in the max but then get NaN
        // from its exponential: the row is NaN either way.
        let m = xs.iter().fold(f64::NEG_INFINITY, |a, &b| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        });
        let safe = if m == f64::NEG_INFINITY { 0.0 } else { m };
        let sum: f64 = xs.iter().map(|&v| (v - safe).exp()).sum();
        for &v in &xs {
            let y = if log {
                if sum == 0.0 {
                    f64::NEG_INFINITY
                } else {
                    v - safe - sum.ln()
                }
            } else if sum == 0.0 {
                0.0
            } else {
                (v - safe).exp() / sum
            };
            out.push(y as f32);
        }
    }
    out
}

/// dx of `softmax` (or log-softmax) from its output `y` and the output gradient `dy`, with a
/// per-element error scale for `accepts` (the magnitude of the terms that cancel).
pub fn softmax_backward(
    y: &[f32],
    dy: &[f32],
    len: usize,
    causal_rows: Option<usize>,
    scale: f32,
    log: bool,
) -> (Vec<f32>, Vec<f64>) {
    let mut dx = Vec::with_capacity(y.len());
    let mut mag = Vec::with_capacity(y.len());
    let s = scale as f64;
    for (r, (yr, dyr)) in y.chunks(len.max(1)).zip(dy.chunks(len.max(1))).enumerate() {
        let keep = |j: usize| !masked(r, j, causal_rows);
        let (mut total, mut abs) = (0.0f64, 0.0f64);
        for j in 0..yr.len() {
            if keep(j) {
                let t = if log {
                    dyr[j] as f64
                } else {
                    yr[j] as f64 * dyr[j] as f64
                };
                total += t;
                abs += t.abs();
            }
        }
        for j in 0..yr.len() {
            let (yv, g) = (yr[j] as f64, dyr[j] as f64);
            if !keep(j) {
                dx.push(0.0);
                mag.push(0.0);
                continue;
            }
            let (v, m) = if log {
                let e = yv.exp();
                (g - e * total, g.abs() + e * abs)
            } else {
                (yv * (g - total), yv.abs() * (g.abs() + abs))
            };
            dx.push((s * v) as f32);
            mag.push(s.abs() * m);
        }
    }
    (dx, mag)
}

/// Relative and absolute tolerance of softmax outputs stored as `dtype` (f32: the error of
/// GPU exp/log on a few terms; f16/bf16: half an ulp of the storage plus the error of the
/// rounded inputs' exponentials).
pub fn softmax_tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (2e-5, 2e-6),
        DType::F16 => (3e-3, 2e-4),
        DType::BF16 => (2e-2, 2e-3),
    }
}

/// Whether `got` is acceptable for `want` with tolerance `(rtol, atol)` and error scale `mag`
/// (|want| for forward outputs; the cancelling terms' magnitude for gradients).
pub fn accepts(got: f32, want: f32, mag: f64, (rtol, atol): (f64, f64)) -> bool {
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return got == want;
    }
    (got as f64 - want as f64).abs() <= atol + rtol * mag
}
