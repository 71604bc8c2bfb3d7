//! Operands the matmul tests share: random values rounded to a dtype (never zeros), and a
//! matrix stored transposed and viewed back, so a kernel reads a column-major operand in
//! place.

use helios::{DType, Tensor};
use rand::{Rng, SeedableRng};

use super::device;

/// `n` values uniform in [-1, 1), rounded to `dtype`.
pub fn random(n: usize, dtype: DType, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| dtype.round(rng.gen_range(-1.0f32..1.0)))
        .collect()
}

/// A `(batch, rows, cols)` tensor holding row-major `host`, stored transposed and viewed back
/// when `trans`.
pub fn operand(host: &[f32], dims: [usize; 3], trans: bool, dtype: DType) -> Tensor {
    let [b, r, c] = dims;
    if !trans {
        return Tensor::from_slice_as(device(), host, &dims, dtype).unwrap();
    }
    let mut t = vec![0f32; host.len()];
    for bi in 0..b {
        for ri in 0..r {
            for ci in 0..c {
                t[(bi * c + ci) * r + ri] = host[(bi * r + ri) * c + ci];
            }
        }
    }
    Tensor::from_slice_as(device(), &t, &[b, c, r], dtype)
        .unwrap()
        .transpose(1, 2)
        .unwrap()
}
