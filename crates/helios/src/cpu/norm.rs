//! Reference LayerNorm and RMSNorm (f64), forward and backward, with the error scales the
//! tests compare against.
//!
//! Formulas (N = row length, x̂ = (x − mean)·rstd; RMSNorm: mean = 0):
//! LayerNorm rstd = 1/√(biased var + eps), RMSNorm rstd = 1/√(mean(x²) + eps);
//! y = x̂·γ + β; dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·γ (RMSNorm: no mean(g));
//! dγ = Σ_rows dy·x̂; dβ = Σ_rows dy.

use crate::DType;

/// Forward of every row of `len`: (y, mean, rstd); `beta = None` with `rms` for RMSNorm.
pub fn norm_forward(
    x: &[f32],
    gamma: &[f32],
    beta: Option<&[f32]>,
    len: usize,
    eps: f32,
    rms: bool,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut y, mut means, mut rstds) = (Vec::new(), Vec::new(), Vec::new());
    for row in x.chunks(len.max(1)) {
        let n = row.len() as f64;
        let mean = if rms {
            0.0
        } else {
            row.iter().map(|&v| v as f64).sum::<f64>() / n
        };
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        let rstd = 1.0 / (var + eps as f64).sqrt();
        for (j, &v) in row.iter().enumerate() {
            let xh = (v as f64 - mean) * rstd;
            let b = beta.map_or(0.0, |b| b[j] as f64);
            y.push((xh * gamma[j] as f64 + b) as f32);
        }
        means.push(mean as f32);
        rstds.push(rstd as f32);
    }
    (y, means, rstds)
}

/// Reference gradients and their error scales.
pub struct NormBackward {
    pub dx: Vec<f32>,
    pub dgamma: Vec<f32>,
    pub dbeta: Vec<f32>,
    /// Per element of dx: the magnitude of the terms that cancel in it.
    pub dx_scale: Vec<f64>,
    /// Per column: Σ|dy·x̂| and Σ|dy|.
    pub dgamma_scale: Vec<f64>,
    pub dbeta_scale: Vec<f64>,
}

/// Backward from x, γ, the forward's per-row `mean` (`None`: RMSNorm) and `rstd`, and dy.
pub fn norm_backward(
    x: &[f32],
    gamma: &[f32],
    mean: Option<&[f32]>,
    rstd: &[f32],
    dy: &[f32],
    len: usize,
) -> NormBackward {
    let mut o = NormBackward {
        dx: Vec::with_capacity(x.len()),
        dgamma: vec![0.0; len],
        dbeta: vec![0.0; len],
        dx_scale: Vec::with_capacity(x.len()),
        dgamma_scale: vec![0.0; len],
        dbeta_scale: vec![0.0; len],
    };
    let (mut dg, mut db) = (vec![0.0f64; len], vec![0.0f64; len]);
    let n = len as f64;
    for (r, (xr, dyr)) in x.chunks(len.max(1)).zip(dy.chunks(len.max(1))).enumerate() {
        let m = mean.map_or(0.0, |m| m[r] as f64);
        let rs = rstd[r] as f64;
        let xh: Vec<f64> = xr.iter().map(|&v| (v as f64 - m) * rs).collect();
        let g: Vec<f64> = dyr
            .iter()
            .zip(gamma)
            .map(|(&d, &w)| d as f64 * w as f64)
            .collect();
        let a = if mean.is_some() {
            g.iter().sum::<f64>() / n
        } else {
            0.0
        };
        let b = g.iter().zip(&xh).map(|(g, x)| g * x).sum::<f64>() / n;
        let aa = if mean.is_some() {
            g.iter().map(|v| v.abs()).sum::<f64>() / n
        } else {
            0.0
        };
        let ab = g.iter().zip(&xh).map(|(g, x)| (g * x).abs()).sum::<f64>() / n;
        for j in 0..xr.len() {
            o.dx.push((rs * (g[j] - a - xh[j] * b)) as f32);
            o.dx_scale.push(rs * (g[j].abs() + aa + xh[j].abs() * ab));
            let d = dyr[j] as f64;
            dg[j] += d * xh[j];
            db[j] += d;
            o.dgamma_scale[j] += (d * xh[j]).abs();
            o.dbeta_scale[j] += d.abs();
        }
    }
    o.dgamma = dg.iter().map(|&v| v as f32).collect();
    o.dbeta = db.iter().map(|&v| v as f32).collect();
    o
}

/// (rtol, atol) for norm outputs stored as `dtype`, relative to an error scale: f32 allows
/// the rounding of f32 statistics and sums; f16/bf16 add half an ulp of the storage.
pub fn norm_tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-6),
        DType::F16 => (2e-3, 1e-4),
        DType::BF16 => (1.6e-2, 1e-3),
    }
}
