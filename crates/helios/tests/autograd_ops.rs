//! Autograd of element-wise, reduction and view ops: every backward rule against central
//! finite differences of an f64 CPU forward (`common/grad.rs`), on random inputs (never
//! zeros) and non-contiguous views.

mod common;

use common::device;
use common::grad::{check, random, up};
use helios::{Compare, DType, IndexTensor, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn un(name: &str, lo: f64, hi: f64, gpu: fn(&Tensor) -> Tensor, cpu: fn(f64) -> f64) {
    let mut rng = StdRng::seed_from_u64(1);
    // A transposed view: the rule must see through the layout.
    let x = random(&mut rng, 6 * 5, lo, hi);
    check(
        name,
        &[(x, vec![6, 5])],
        |t| gpu(&t[0].transpose(0, 1).unwrap()),
        |h| {
            let mut out = Vec::with_capacity(30);
            for c in 0..5 {
                for r in 0..6 {
                    out.push(cpu(h[0][r * 5 + c]));
                }
            }
            out
        },
    );
}

#[test]
fn unary_rules() {
    let gelu =
        |x: f64| 0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh());
    un("neg", -2.0, 2.0, |t| t.neg().unwrap(), |x| -x);
    un("abs", -2.0, 2.0, |t| t.abs().unwrap(), f64::abs);
    un("exp", -2.0, 2.0, |t| t.exp().unwrap(), f64::exp);
    un("log", 0.2, 3.0, |t| t.log().unwrap(), f64::ln);
    un("sqrt", 0.2, 3.0, |t| t.sqrt().unwrap(), f64::sqrt);
    un(
        "rsqrt",
        0.2,
        3.0,
        |t| t.rsqrt().unwrap(),
        |x| 1.0 / x.sqrt(),
    );
    un("tanh", -2.0, 2.0, |t| t.tanh().unwrap(), f64::tanh);
    un(
        "sigmoid",
        -3.0,
        3.0,
        |t| t.sigmoid().unwrap(),
        |x| 1.0 / (1.0 + (-x).exp()),
    );
    un("relu", -2.0, 2.0, |t| t.relu().unwrap(), |x| x.max(0.0));
    un("gelu_tanh", -3.0, 3.0, |t| t.gelu_tanh().unwrap(), gelu);
    un(
        "silu",
        -3.0,
        3.0,
        |t| t.silu().unwrap(),
        |x| x / (1.0 + (-x).exp()),
    );
    un(
        "mul_scalar",
        -2.0,
        2.0,
        |t| t.mul_scalar(-1.5).unwrap(),
        |x| -1.5 * x,
    );
    un(
        "div_scalar",
        -2.0,
        2.0,
        |t| t.div_scalar(4.0).unwrap(),
        |x| x / 4.0,
    );
    un(
        "sub_scalar",
        -2.0,
        2.0,
        |t| t.sub_scalar(0.3).unwrap(),
        |x| x - 0.3,
    );
    un(
        "pow_scalar",
        0.2,
        2.0,
        |t| t.pow_scalar(2.5).unwrap(),
        |x| x.powf(2.5),
    );
    un(
        "rdiv",
        0.2,
        2.0,
        |t| t.scalar_first_op(helios::BinaryOp::Div, 2.0).unwrap(),
        |x| 2.0 / x,
    );
    un(
        "rsub",
        -2.0,
        2.0,
        |t| t.scalar_first_op(helios::BinaryOp::Sub, 1.0).unwrap(),
        |x| 1.0 - x,
    );
    un(
        "max_scalar",
        -2.0,
        2.0,
        |t| t.maximum_scalar(0.25).unwrap(),
        |x| x.max(0.25),
    );
    un(
        "to_bf16_and_back",
        -2.0,
        2.0,
        |t| t.to_dtype(DType::F32).unwrap().contiguous().unwrap(),
        |x| x,
    );
}

/// Binary ops with broadcasting: a (4, 3) against b (3,) — b's gradient sums over rows.
fn bin(
    name: &str,
    lo: f64,
    hi: f64,
    gpu: fn(&Tensor, &Tensor) -> Tensor,
    cpu: fn(f64, f64) -> f64,
) {
    let mut rng = StdRng::seed_from_u64(2);
    let a = random(&mut rng, 12, lo, hi);
    let b = random(&mut rng, 3, lo, hi);
    check(
        name,
        &[(a, vec![4, 3]), (b, vec![3])],
        |t| gpu(&t[0], &t[1]),
        |h| (0..12).map(|i| cpu(h[0][i], h[1][i % 3])).collect(),
    );
}

#[test]
fn binary_rules_broadcast() {
    bin("add", -2.0, 2.0, |a, b| a.add(b).unwrap(), |a, b| a + b);
    bin("sub", -2.0, 2.0, |a, b| a.sub(b).unwrap(), |a, b| a - b);
    bin("mul", -2.0, 2.0, |a, b| a.mul(b).unwrap(), |a, b| a * b);
    bin("div", 0.3, 2.0, |a, b| a.div(b).unwrap(), |a, b| a / b);
    bin("pow", 0.3, 2.0, |a, b| a.pow(b).unwrap(), f64::powf);
    bin("maximum", -2.0, 2.0, |a, b| a.maximum(b).unwrap(), f64::max);
    bin("minimum", -2.0, 2.0, |a, b| a.minimum(b).unwrap(), f64::min);
}

/// A (4) operand broadcast over (2, 3, 4): its gradient sums two leading dimensions, in one
/// reduction when the incoming gradient is dense and one at a time when it is a transposed
/// view (the output read back through `transpose`).
#[test]
fn broadcast_gradients_over_several_leading_dims() {
    let mut rng = StdRng::seed_from_u64(4);
    let a = random(&mut rng, 24, -2.0, 2.0);
    let b = random(&mut rng, 4, -2.0, 2.0);
    let inputs = [(a, vec![2, 3, 4]), (b, vec![4])];
    check(
        "mul over (2, 3)",
        &inputs,
        |t| t[0].mul(&t[1]).unwrap(),
        |h| (0..24).map(|i| h[0][i] * h[1][i % 4]).collect(),
    );
    check(
        "mul over (2, 3), transposed after",
        &inputs,
        |t| t[0].mul(&t[1]).unwrap().transpose(0, 1).unwrap(),
        |h| {
            // (3, 2, 4): element (j, i, k) is (i, j, k) of the product.
            let mut out = Vec::new();
            for j in 0..3 {
                for i in 0..2 {
                    for k in 0..4 {
                        let at = (i * 3 + j) * 4 + k;
                        out.push(h[0][at] * h[1][k]);
                    }
                }
            }
            out
        },
    );
}

#[test]
fn where_and_masked_fill() {
    let mut rng = StdRng::seed_from_u64(3);
    let a = random(&mut rng, 12, -2.0, 2.0);
    let b = random(&mut rng, 12, -2.0, 2.0);
    let c: Vec<f64> = random(&mut rng, 12, -1.0, 1.0);
    let cond = up(&c, &[4, 3]).compare_scalar(Compare::Gt, 0.0).unwrap();
    let cpu_c = c.clone();
    check(
        "where",
        &[(a, vec![4, 3]), (b, vec![4, 3])],
        move |t| t[0].where_(&cond, &t[1]).unwrap(),
        move |h| {
            (0..12)
                .map(|i| if cpu_c[i] > 0.0 { h[0][i] } else { h[1][i] })
                .collect()
        },
    );
    let x = random(&mut rng, 12, -2.0, 2.0);
    let mask = up(&c, &[4, 3]).compare_scalar(Compare::Lt, 0.0).unwrap();
    check(
        "masked_fill",
        &[(x, vec![4, 3])],
        move |t| {
            t[0].mul_scalar(2.0)
                .unwrap()
                .masked_fill(&mask, -3.0)
                .unwrap()
        },
        move |h| {
            (0..12)
                .map(|i| if c[i] < 0.0 { -3.0 } else { 2.0 * h[0][i] })
                .collect()
        },
    );
}

#[test]
fn reductions_and_views() {
    let mut rng = StdRng::seed_from_u64(4);
    let x = random(&mut rng, 2 * 3 * 4, -2.0, 2.0);
    let sum_axis = |h: &[Vec<f64>], axis_len: usize, inner: usize| -> Vec<f64> {
        let outer = h[0].len() / (axis_len * inner);
        let mut out = vec![0.0; outer * inner];
        for o in 0..outer {
            for a in 0..axis_len {
                for i in 0..inner {
                    out[o * inner + i] += h[0][(o * axis_len + a) * inner + i];
                }
            }
        }
        out
    };
    check(
        "sum axis 1",
        &[(x.clone(), vec![2, 3, 4])],
        |t| t[0].sum(1).unwrap(),
        move |h| sum_axis(h, 3, 4),
    );
    check(
        "mean axis -1",
        &[(x.clone(), vec![2, 3, 4])],
        |t| t[0].mean(-1).unwrap(),
        move |h| sum_axis(h, 4, 1).iter().map(|v| v / 4.0).collect(),
    );
    check(
        "sum_all",
        &[(x.clone(), vec![2, 3, 4])],
        |t| t[0].sum_all().unwrap(),
        |h| vec![h[0].iter().sum()],
    );
    check(
        "var axis 1",
        &[(x.clone(), vec![2, 3, 4])],
        |t| t[0].var(1).unwrap(),
        move |h| {
            let mut out = Vec::new();
            for o in 0..2 {
                for i in 0..4 {
                    let v: Vec<f64> = (0..3).map(|a| h[0][(o * 3 + a) * 4 + i]).collect();
                    let m = v.iter().sum::<f64>() / 3.0;
                    out.push(v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / 3.0);
                }
            }
            out
        },
    );
    check(
        "max axis 0",
        &[(x.clone(), vec![2, 12])],
        |t| t[0].max(0).unwrap(),
        |h| (0..12).map(|i| h[0][i].max(h[0][12 + i])).collect(),
    );
    // permute → reshape (a copy) → broadcast: every view's rule in one chain.
    check(
        "permute reshape expand",
        &[(x, vec![2, 3, 4])],
        |t| {
            let p = t[0].permute(&[2, 0, 1]).unwrap().reshape(&[4, 6]).unwrap();
            p.reshape(&[4, 1, 6])
                .unwrap()
                .expand(&[4, 2, 6])
                .unwrap()
                .mul_scalar(0.5)
                .unwrap()
        },
        |h| {
            let mut out = Vec::new();
            for k in 0..4 {
                for _rep in 0..2 {
                    for i in 0..2 {
                        for j in 0..3 {
                            out.push(0.5 * h[0][(i * 3 + j) * 4 + k]);
                        }
                    }
                }
            }
            out
        },
    );
}

#[test]
fn narrow_cat_stack_split_index_select() {
    let mut rng = StdRng::seed_from_u64(9);
    let x = random(&mut rng, 4 * 6, -2.0, 2.0);
    // A [B, T, 3C]-style split: three narrows of one tensor, recombined differently.
    check(
        "narrow",
        &[(x.clone(), vec![4, 6])],
        |t| {
            let a = t[0].narrow(1, 0, 2).unwrap();
            let b = t[0].narrow(1, 2, 2).unwrap();
            let c = t[0].slice(1, 4..6).unwrap();
            a.mul(&b).unwrap().add(&c.mul_scalar(3.0).unwrap()).unwrap()
        },
        |h| {
            (0..4)
                .flat_map(|r| {
                    let row = &h[0][r * 6..r * 6 + 6];
                    (0..2).map(move |j| row[j] * row[2 + j] + 3.0 * row[4 + j])
                })
                .collect()
        },
    );
    let y = random(&mut rng, 4 * 3, -2.0, 2.0);
    check(
        "cat dim 1",
        &[(x.clone(), vec![4, 6]), (y.clone(), vec![4, 3])],
        |t| Tensor::cat(&[&t[0], &t[1].exp().unwrap()], 1).unwrap(),
        |h| {
            (0..4)
                .flat_map(|r| {
                    let mut row = h[0][r * 6..r * 6 + 6].to_vec();
                    row.extend(h[1][r * 3..r * 3 + 3].iter().map(|v| v.exp()));
                    row
                })
                .collect()
        },
    );
    let z = random(&mut rng, 4 * 3, -2.0, 2.0);
    check(
        "stack dim 0 + split",
        &[(y.clone(), vec![4, 3]), (z, vec![4, 3])],
        |t| {
            let s = Tensor::stack(&[&t[0], &t[1]], 0).unwrap(); // (2, 4, 3)
            let parts = s.split(&[1, 2], 2).unwrap();
            parts[1].mul(&parts[0]).unwrap() // (2, 4, 2)
        },
        |h| {
            let mut out = Vec::new();
            for src in [&h[0], &h[1]] {
                for r in 0..4 {
                    out.push(src[r * 3 + 1] * src[r * 3]);
                    out.push(src[r * 3 + 2] * src[r * 3]);
                }
            }
            out
        },
    );
    let ids = [2u32, 0, 2, 5];
    let it = IndexTensor::from_slice(device(), &ids, &[4]).unwrap();
    check(
        "index_select dim 1",
        &[(x, vec![4, 6])],
        move |t| t[0].index_select(1, &it).unwrap(),
        move |h| {
            (0..4)
                .flat_map(|r| ids.iter().map(move |&i| (r, i as usize)))
                .map(|(r, i)| h[0][r * 6 + i])
                .collect()
        },
    );
}
