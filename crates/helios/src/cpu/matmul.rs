//! Reference matrix multiply (f64 accumulation) with the epilogue the kernels fuse, and the
//! error measure the tests and benchmarks judge them by.
//!
//! Operands are logical row-major arrays: A `(batch_a, m, k)`, B `(batch_b, k, n)`, where a
//! batch count of 1 broadcasts over the batch. The result is f64: callers round it to the
//! output dtype (or compare against it directly). `relative_error` is ‖out − ref‖₂ / ‖ref‖₂,
//! the figure every matmul test and benchmark reports: a NaN anywhere makes it NaN.

use helios_kernels::Activation;

/// The fused epilogue's inputs: `act(alpha·A·B + bias[col]) + residual[b, row, col]`.
#[derive(Clone, Copy, Debug)]
pub struct MatmulRef<'a> {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    /// (n) values.
    pub bias: Option<&'a [f32]>,
    pub act: Activation,
    /// (batch, m, n) values.
    pub residual: Option<&'a [f32]>,
    /// Instead of adding the residual, multiply by this activation's derivative at it.
    pub act_grad: Activation,
}

impl<'a> MatmulRef<'a> {
    pub fn plain(batch: usize, m: usize, n: usize, k: usize) -> MatmulRef<'a> {
        MatmulRef {
            batch,
            m,
            n,
            k,
            alpha: 1.0,
            bias: None,
            act: Activation::None,
            residual: None,
            act_grad: Activation::None,
        }
    }
}

/// GELU, tanh approximation, in f64.
pub fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

/// d/dx of `act` at `x`.
fn activate_grad(act: Activation, x: f64) -> f64 {
    match act {
        Activation::None => 1.0,
        Activation::Relu => f64::from(u8::from(x > 0.0)),
        Activation::GeluTanh => super::elementwise::gelu_tanh_grad(x),
    }
}

fn activate(act: Activation, v: f64) -> f64 {
    match act {
        Activation::None => v,
        Activation::Relu => v.max(0.0),
        Activation::GeluTanh => gelu_tanh(v),
    }
}

/// The full (batch, m, n) reference.
pub fn matmul(a: &[f32], b: &[f32], p: &MatmulRef) -> Vec<f64> {
    let rows: Vec<(usize, usize)> = (0..p.batch)
        .flat_map(|bi| (0..p.m).map(move |r| (bi, r)))
        .collect();
    let cols: Vec<usize> = (0..p.n).collect();
    matmul_at(a, b, p, &rows, &cols)
}

/// The reference at the given (batch, row) pairs and columns only: `rows.len() × cols.len()`
/// values, row-major (what benchmarks check on large shapes).
pub fn matmul_at(
    a: &[f32],
    b: &[f32],
    p: &MatmulRef,
    rows: &[(usize, usize)],
    cols: &[usize],
) -> Vec<f64> {
    let (m, n, k) = (p.m, p.n, p.k);
    let a_batches = a.len() / (m * k).max(1);
    let b_batches = b.len() / (k * n).max(1);
    let mut out = Vec::with_capacity(rows.len() * cols.len());
    let mut arow = vec![0f64; k];
    for &(bi, r) in rows {
        let ab = if a_batches == 1 { 0 } else { bi };
        let bb = if b_batches == 1 { 0 } else { bi };
        for (kk, x) in arow.iter_mut().enumerate() {
            *x = f64::from(a[(ab * m + r) * k + kk]);
        }
        let bbase = bb * k * n;
        for &c in cols {
            let mut s = 0f64;
            for (kk, x) in arow.iter().enumerate() {
                s += x * f64::from(b[bbase + kk * n + c]);
            }
            let mut v = f64::from(p.alpha) * s;
            if let Some(bias) = p.bias {
                v += f64::from(bias[c]);
            }
            v = activate(p.act, v);
            if let Some(res) = p.residual {
                let x = f64::from(res[(bi * m + r) * n + c]);
                match p.act_grad {
                    Activation::None => v += x,
                    act => v *= activate_grad(act, x),
                }
            }
            out.push(v);
        }
    }
    out
}

/// ‖got − want‖₂ / ‖want‖₂ (the absolute norm when `want` is all zeros); NaN if any value is
/// NaN or the lengths differ.
pub fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::NAN;
    }
    let mut diff = 0f64;
    let mut norm = 0f64;
    for (&g, &w) in got.iter().zip(want) {
        let g = f64::from(g);
        if g.is_nan() || w.is_nan() {
            return f64::NAN;
        }
        diff += (g - w) * (g - w);
        norm += w * w;
    }
    if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

/// The largest relative error a matmul with these storages may show against the f64
/// reference on random inputs in [-1, 1): f32 math accumulates rounding ~√k·2⁻²⁴; narrow
/// outputs add their own rounding (2⁻¹¹ for f16, 2⁻⁸ for bf16), narrow inputs are already
/// rounded before the reference sees them.
pub fn tolerance(out: crate::DType) -> f64 {
    match out {
        crate::DType::F32 => 1e-5,
        crate::DType::F16 => 2e-3,
        crate::DType::BF16 => 1e-2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_product_with_epilogue() {
        // A = [[1, 2], [3, 4]], B = [[5, 6], [7, 8]]: A·B = [[19, 22], [43, 50]].
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [5.0, 6.0, 7.0, 8.0];
        let p = MatmulRef::plain(1, 2, 2, 2);
        assert_eq!(matmul(&a, &b, &p), vec![19.0, 22.0, 43.0, 50.0]);
        let bias = [1.0, -100.0];
        let res = [0.5, 0.5, 0.5, 0.5];
        let p = MatmulRef {
            alpha: 0.5,
            bias: Some(&bias),
            act: Activation::Relu,
            residual: Some(&res),
            ..p
        };
        assert_eq!(matmul(&a, &b, &p), vec![11.0, 0.5, 23.0, 0.5]);
        assert_eq!(
            matmul_at(&a, &b, &p, &[(0, 1)], &[0]),
            vec![23.0],
            "sampled entry"
        );
    }

    #[test]
    fn batch_broadcast_and_errors() {
        let a = [1.0, 2.0]; // two batches of 1×1
        let b = [3.0]; // one 1×1, broadcast
        let p = MatmulRef::plain(2, 1, 1, 1);
        assert_eq!(matmul(&a, &b, &p), vec![3.0, 6.0]);
        assert_eq!(relative_error(&[3.0, 6.0], &[3.0, 6.0]), 0.0);
        assert!(relative_error(&[f32::NAN, 6.0], &[3.0, 6.0]).is_nan());
        assert!((relative_error(&[3.0, 0.0], &[3.0, 4.0]) - 0.8).abs() < 1e-12);
        assert!((gelu_tanh(1.0) - 0.841_191_990_8).abs() < 1e-9);
    }
}
