//! Random element-wise programs with their f64 reference, for the lazy graph's tests.

use helios::{Compare, DType, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::device;

pub const N: usize = 6;

/// A value of the program: its tensor and its f64 reference (N × N, row-major).
#[derive(Clone)]
pub struct Val {
    pub t: Tensor,
    pub r: Vec<f64>,
}

pub fn map(v: &Val, t: Tensor, f: impl Fn(f64) -> f64) -> Val {
    Val {
        t,
        r: v.r.iter().map(|&x| f(x)).collect(),
    }
}

pub fn zip(a: &Val, b: &Val, t: Tensor, f: impl Fn(f64, f64) -> f64) -> Val {
    Val {
        t,
        r: a.r.iter().zip(&b.r).map(|(&x, &y)| f(x, y)).collect(),
    }
}

pub fn round(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::BF16 => half::bf16::from_f64(x).to_f64(),
    }
}

/// One random program; `eager` realises every op as it is built.
pub fn program(seed: u64, dtype: DType, ops: usize, eager: bool) -> Vec<Val> {
    let d = device();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut leaf = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let t = Tensor::from_slice_as(d, &v, shape, dtype).unwrap();
        let stored: Vec<f64> = v.iter().map(|&x| round(x as f64, dtype)).collect();
        (t, stored)
    };
    let (a, ar) = leaf(&[N, N]);
    let (row, rr) = leaf(&[N]);
    let (col, cr) = leaf(&[N, 1]);
    let (tr, trr) = leaf(&[N, N]);
    let full = |f: &dyn Fn(usize, usize) -> f64| -> Vec<f64> {
        (0..N * N).map(|i| f(i / N, i % N)).collect()
    };
    let mut vals = vec![
        Val { t: a, r: ar },
        Val {
            t: row.broadcast_to(&[N, N]).unwrap(),
            r: full(&|_, j| rr[j]),
        },
        Val {
            t: col.broadcast_to(&[N, N]).unwrap(),
            r: full(&|i, _| cr[i]),
        },
        Val {
            t: tr.transpose(0, 1).unwrap(),
            r: full(&|i, j| trr[j * N + i]),
        },
    ];
    let mut rng = StdRng::seed_from_u64(seed ^ 0xabcdef);
    for _ in 0..ops {
        let x = vals[rng.gen_range(0..vals.len())].clone();
        let y = vals[rng.gen_range(0..vals.len())].clone();
        let v = match rng.gen_range(0..11) {
            0 => zip(
                &x,
                &y,
                x.t.add(&y.t).unwrap().mul_scalar(0.5).unwrap(),
                |a, b| (a + b) * 0.5,
            ),
            1 => zip(
                &x,
                &y,
                x.t.sub(&y.t).unwrap().mul_scalar(0.5).unwrap(),
                |a, b| (a - b) * 0.5,
            ),
            2 => zip(&x, &y, x.t.mul(&y.t).unwrap(), |a, b| a * b),
            3 => zip(&x, &y, x.t.maximum(&y.t).unwrap(), f64::max),
            4 => map(&x, x.t.tanh().unwrap(), f64::tanh),
            5 => map(&x, x.t.sigmoid().unwrap(), |a| 1.0 / (1.0 + (-a).exp())),
            6 => map(&x, x.t.neg().unwrap(), |a| -a),
            7 => map(&x, x.t.relu().unwrap(), |a| a.max(0.0)),
            8 => {
                let c = x.t.compare_scalar(Compare::Gt, 0.0).unwrap();
                let r: Vec<f64> =
                    x.r.iter()
                        .zip(&y.r)
                        .map(|(&a, &b)| if a > 0.0 { b } else { -b })
                        .collect();
                Val {
                    t: y.t.where_(&c, &y.t.neg().unwrap()).unwrap(),
                    r,
                }
            }
            // A transposed view of an intermediate: realised before its reader's group.
            9 => Val {
                t: x.t.transpose(0, 1).unwrap(),
                r: full(&|i, j| x.r[j * N + i]),
            },
            _ => {
                // A cast down and back: rounds exactly where the CPU does.
                let narrow = match dtype {
                    DType::F32 => DType::BF16,
                    other => other,
                };
                let t =
                    x.t.to_dtype(DType::F32)
                        .unwrap()
                        .to_dtype(narrow)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap();
                map(&x, t, |a| round(round(a, narrow), dtype))
            }
        };
        if eager {
            v.t.realize().unwrap();
        }
        vals.push(v);
    }
    vals
}
