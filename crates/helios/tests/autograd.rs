//! Autograd: every backward rule against central finite differences of an f64 CPU forward,
//! on random inputs (never zeros) and non-contiguous views; the graph's release after
//! backward; gradient accumulation; a training loop whose memory reaches a steady state.
//!
//! Each check computes `loss = Σ f(inputs) · w` for a random weight `w` (so the upstream
//! gradient is random too), runs `backward()`, and compares every input's gradient with
//! `(L(x + h) − L(x − h)) / 2h` of the CPU forward in f64. f32 tolerance: |got − want| ≤
//! 2e-3 · (|want| + scale), where scale is the gradient's largest magnitude / 10.

mod common;

use common::{assert_no_validation_messages, device, LockExt};
use helios::{graph_stats, no_grad, Compare, DType, IndexTensor, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Serialises the tests: live-node counts and memory statistics are process- and
/// device-wide.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn random(rng: &mut StdRng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let v: f64 = rng.gen_range(lo..hi);
            if v.abs() < 0.05 {
                0.05f64.copysign(v)
            } else {
                v
            }
        })
        .collect()
}

fn up(v: &[f64], shape: &[usize]) -> Tensor {
    let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    Tensor::from_slice(device(), &f, shape).unwrap()
}

/// Checks the gradients of `gpu` against finite differences of `cpu` at `inputs`.
#[track_caller]
fn check(
    name: &str,
    inputs: &[(Vec<f64>, Vec<usize>)],
    gpu: impl Fn(&[Tensor]) -> Tensor,
    cpu: impl Fn(&[Vec<f64>]) -> Vec<f64>,
) {
    let _l = LOCK.locked();
    let mut rng = StdRng::seed_from_u64(name.len() as u64 * 7919);
    let xs: Vec<Tensor> = inputs
        .iter()
        .map(|(v, s)| up(v, s).requires_grad_())
        .collect();
    let y = gpu(&xs);
    let w = random(&mut rng, y.len(), -1.0, 1.0);
    let loss = y.mul(&up(&w, y.shape())).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    let host: Vec<Vec<f64>> = inputs.iter().map(|(v, _)| v.clone()).collect();
    let l = |h: &[Vec<f64>]| -> f64 { cpu(h).iter().zip(&w).map(|(a, b)| a * b).sum() };
    // The forward itself first.
    let got_y = y.to_vec().unwrap();
    let want_y = cpu(&host);
    assert_eq!(got_y.len(), want_y.len(), "{name}: output length");
    for (i, (g, w)) in got_y.iter().zip(&want_y).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= 2e-4 * (w.abs() + 1.0),
            "{name}: output {i} = {g}, expected {w}"
        );
    }
    for (k, x) in xs.iter().enumerate() {
        let got = x
            .grad()
            .expect("a gradient reached the input")
            .to_vec()
            .unwrap();
        let mut want = Vec::with_capacity(got.len());
        for i in 0..host[k].len() {
            let h = 1e-6 * host[k][i].abs().max(1.0);
            let mut p = host.clone();
            p[k][i] += h;
            let mut m = host.clone();
            m[k][i] -= h;
            want.push((l(&p) - l(&m)) / (2.0 * h));
        }
        let scale = want.iter().fold(0.0f64, |a, b| a.max(b.abs())) / 10.0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (*g as f64 - w).abs() <= 2e-3 * (w.abs() + scale) + 1e-6,
                "{name}: d/dinput{k}[{i}] = {g}, finite differences give {w}"
            );
        }
    }
    assert_no_validation_messages();
}

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

fn matmul_cpu(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    out
}

#[test]
fn matmul_rules() {
    let mut rng = StdRng::seed_from_u64(5);
    let (bt, m, k, n) = (2, 5, 7, 3);
    let a = random(&mut rng, bt * m * k, -1.0, 1.0);
    let w = random(&mut rng, k * n, -1.0, 1.0);
    let bias = random(&mut rng, n, -1.0, 1.0);
    // A linear layer over a batch, (2, 5, 7) · (7, 3) + bias: with a GELU; with a scale and a
    // residual, which the kernel's epilogue takes under autograd too; and with a scale, a GELU
    // and the residual added after it. Gradients reach every input.
    let res = random(&mut rng, bt * m * n, -1.0, 1.0);
    let gelu =
        |z: f64| 0.5 * z * (1.0 + (0.797_884_560_802_865_4 * (z + 0.044715 * z * z * z)).tanh());
    for (alpha, act, with_res) in [
        (1.0, helios::Activation::GeluTanh, false),
        (1.0, helios::Activation::Relu, false),
        (0.75, helios::Activation::None, true),
        (0.75, helios::Activation::GeluTanh, true),
    ] {
        let mut inputs = vec![
            (a.clone(), vec![bt, m, k]),
            (w.clone(), vec![k, n]),
            (bias.clone(), vec![n]),
        ];
        if with_res {
            inputs.push((res.clone(), vec![bt, m, n]));
        }
        check(
            &format!("linear {alpha} {act:?} residual {with_res}"),
            &inputs,
            move |t| {
                let opts = helios::MatmulOptions {
                    alpha,
                    bias: Some(&t[2]),
                    act,
                    residual: t.get(3),
                    ..Default::default()
                };
                t[0].matmul_opts(&t[1], &opts).unwrap()
            },
            move |h| {
                let mut out = Vec::new();
                for b in 0..bt {
                    let y = matmul_cpu(&h[0][b * m * k..(b + 1) * m * k], &h[1], m, k, n);
                    for (i, v) in y.iter().enumerate() {
                        let z = f64::from(alpha) * v + h[2][i % n];
                        let z = match act {
                            helios::Activation::GeluTanh => gelu(z),
                            helios::Activation::Relu => z.max(0.0),
                            helios::Activation::None => z,
                        };
                        out.push(z + h.get(3).map_or(0.0, |r| r[b * m * n + i]));
                    }
                }
                out
            },
        );
    }
    // Two linear layers, the second reading the first's GELU: its input gradient comes out
    // of the second product's epilogue at the GELU's input. Then the GELU's output also
    // feeds an element-wise consumer, whose share of the gradient takes the GELU's own rule
    // (the two parts add at the GELU's input).
    let n2 = 4;
    let w2 = random(&mut rng, n * n2, -1.0, 1.0);
    let w3 = random(&mut rng, n * n, -1.0, 1.0);
    let mlp = move |h: &[Vec<f64>], second: &[f64], n2: usize, skip: bool| {
        let mut out = Vec::new();
        for b in 0..bt {
            let z = matmul_cpu(&h[0][b * m * k..(b + 1) * m * k], &h[1], m, k, n);
            let g: Vec<f64> = z
                .iter()
                .enumerate()
                .map(|(i, v)| gelu(v + h[2][i % n]))
                .collect();
            let y = matmul_cpu(&g, second, m, n, n2);
            match skip {
                true => out.extend(y.iter().zip(&g).map(|(y, g)| y + g * g)),
                false => out.extend(y),
            }
        }
        out
    };
    let layers = [
        (a.clone(), vec![bt, m, k]),
        (w.clone(), vec![k, n]),
        (bias.clone(), vec![n]),
    ];
    let fc = |t: &[Tensor]| {
        let opts = helios::MatmulOptions {
            bias: Some(&t[2]),
            act: helios::Activation::GeluTanh,
            ..Default::default()
        };
        t[0].matmul_opts(&t[1], &opts).unwrap()
    };
    check(
        "linear gelu linear",
        &[layers.to_vec(), vec![(w2, vec![n, n2])]].concat(),
        move |t| fc(t).matmul(&t[3]).unwrap(),
        move |h| mlp(h, &h[3], n2, false),
    );
    let w4 = random(&mut rng, n * n, -1.0, 1.0);
    check(
        "linear gelu, two linear layers reading it",
        &[
            layers.to_vec(),
            vec![(w4, vec![n, n]), (w3.clone(), vec![n, n])],
        ]
        .concat(),
        move |t| {
            let h = fc(t);
            h.matmul(&t[3])
                .unwrap()
                .add(&h.matmul(&t[4]).unwrap())
                .unwrap()
        },
        move |h| {
            let (a, b) = (mlp(h, &h[3], n, false), mlp(h, &h[4], n, false));
            a.iter().zip(&b).map(|(a, b)| a + b).collect()
        },
    );
    check(
        "linear gelu linear, gelu also squared",
        &[layers.to_vec(), vec![(w3, vec![n, n])]].concat(),
        move |t| {
            let h = fc(t);
            h.matmul(&t[3]).unwrap().add(&h.mul(&h).unwrap()).unwrap()
        },
        move |h| mlp(h, &h[3], n, true),
    );
    // Batched, both operands per batch, b read through a transposed view.
    let b2 = random(&mut rng, bt * n * k, -1.0, 1.0);
    check(
        "bmm transposed",
        &[(a, vec![bt, m, k]), (b2, vec![bt, n, k])],
        |t| t[0].matmul(&t[1].transpose(1, 2).unwrap()).unwrap(),
        move |h| {
            let mut out = Vec::new();
            for b in 0..bt {
                for i in 0..m {
                    for j in 0..n {
                        out.push(
                            (0..k)
                                .map(|p| h[0][(b * m + i) * k + p] * h[1][(b * n + j) * k + p])
                                .sum(),
                        );
                    }
                }
            }
            out
        },
    );
}

/// A two-layer MLP with biases and a GELU between, in f16 and bf16, where the GELU and its
/// backward are element-wise passes (the products' epilogues take them only in f32): every
/// gradient against the f64 CPU reference computed from the same rounded inputs. Each
/// layer's output gradient reaches its matmul rule still pending (the GELU's backward, and
/// the loss's cast), so the bias gradient's reduction computes it in its loads and stores
/// it for the products: two stored prologues in the backward.
#[test]
fn low_precision_mlp_gradients() {
    let _l = LOCK.locked();
    let mut rng = StdRng::seed_from_u64(12);
    let (m, k, h, n) = (24, 16, 20, 12);
    let gelu =
        |z: f64| 0.5 * z * (1.0 + (0.797_884_560_802_865_4 * (z + 0.044715 * z.powi(3))).tanh());
    let dgelu = |z: f64| {
        let c = 0.797_884_560_802_865_4;
        let t = (c * (z + 0.044715 * z.powi(3))).tanh();
        0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * z * z)
    };
    for (dtype, tol) in [(DType::F16, 4e-3), (DType::BF16, 3e-2)] {
        let leaf = |v: Vec<f64>, shape: &[usize]| {
            let t = up(&v, shape).to_dtype(dtype).unwrap();
            // The values the GPU sees, for the reference.
            let seen: Vec<f64> = t.to_vec().unwrap().iter().map(|&x| x.into()).collect();
            (t.requires_grad_(), seen)
        };
        let (x, xv) = leaf(random(&mut rng, m * k, -1.0, 1.0), &[m, k]);
        let (w1, w1v) = leaf(random(&mut rng, k * h, -0.5, 0.5), &[k, h]);
        let (b1, b1v) = leaf(random(&mut rng, h, -0.5, 0.5), &[h]);
        let (w2, w2v) = leaf(random(&mut rng, h * n, -0.5, 0.5), &[h, n]);
        let (b2, _) = leaf(random(&mut rng, n, -0.5, 0.5), &[n]);
        let r = random(&mut rng, m * n, -1.0, 1.0);
        let fc = helios::MatmulOptions {
            bias: Some(&b1),
            act: helios::Activation::GeluTanh,
            ..Default::default()
        };
        let proj = helios::MatmulOptions {
            bias: Some(&b2),
            ..Default::default()
        };
        let y = x
            .matmul_opts(&w1, &fc)
            .unwrap()
            .matmul_opts(&w2, &proj)
            .unwrap();
        let loss = y
            .to_dtype(DType::F32)
            .unwrap()
            .mul(&up(&r, &[m, n]))
            .unwrap()
            .sum_all()
            .unwrap();
        let before = graph_stats();
        loss.backward().unwrap();
        let grads: Vec<Vec<f64>> = [&x, &w1, &b1, &w2, &b2]
            .iter()
            .map(|t| {
                t.grad()
                    .unwrap()
                    .to_vec()
                    .unwrap()
                    .iter()
                    .map(|&v| v.into())
                    .collect()
            })
            .collect();
        assert_eq!(
            graph_stats().prologues - before.prologues,
            2,
            "{dtype:?}: both bias gradients compute their layer's output gradient"
        );
        // The reference, in f64 from the rounded inputs.
        let z1: Vec<f64> = matmul_cpu(&xv, &w1v, m, k, h)
            .iter()
            .enumerate()
            .map(|(i, v)| v + b1v[i % h])
            .collect();
        let hv: Vec<f64> = z1.iter().map(|&z| gelu(z)).collect();
        let dh = matmul_cpu(&r, &transpose(&w2v, h, n), m, n, h);
        let dz1: Vec<f64> = dh.iter().zip(&z1).map(|(g, &z)| g * dgelu(z)).collect();
        let col_sums = |g: &[f64], cols: usize| -> Vec<f64> {
            (0..cols)
                .map(|j| (0..m).map(|i| g[i * cols + j]).sum())
                .collect()
        };
        let want = [
            matmul_cpu(&dz1, &transpose(&w1v, k, h), m, h, k),
            matmul_cpu(&transpose(&xv, m, k), &dz1, k, m, h),
            col_sums(&dz1, h),
            matmul_cpu(&transpose(&hv, m, h), &r, h, m, n),
            col_sums(&r, n),
        ];
        for (i, (got, want)) in grads.iter().zip(&want).enumerate() {
            let err: f64 = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).powi(2))
                .sum::<f64>()
                .sqrt();
            let norm: f64 = want.iter().map(|b| b * b).sum::<f64>().sqrt();
            assert!(
                err <= tol * norm,
                "{dtype:?} gradient {i} (x, w1, b1, w2, b2): relative error {}",
                err / norm
            );
        }
    }
    assert_no_validation_messages();
}

/// `v` (rows × cols, row-major) transposed.
fn transpose(v: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..cols * rows)
        .map(|i| v[(i % rows) * cols + i / rows])
        .collect()
}

#[test]
fn softmax_norm_rules() {
    let mut rng = StdRng::seed_from_u64(6);
    let (r, c) = (3, 8);
    let x = random(&mut rng, r * c, -2.0, 2.0);
    let softmax = |row: &[f64]| -> Vec<f64> {
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        row.iter().map(|v| (v - m).exp() / s).collect()
    };
    check(
        "softmax",
        &[(x.clone(), vec![r, c])],
        |t| t[0].softmax().unwrap(),
        move |h| h[0].chunks(c).flat_map(softmax).collect(),
    );
    check(
        "log_softmax",
        &[(x.clone(), vec![r, c])],
        |t| t[0].log_softmax().unwrap(),
        move |h| {
            h[0].chunks(c)
                .flat_map(|row| softmax(row).into_iter().map(f64::ln).collect::<Vec<_>>())
                .collect()
        },
    );
    let gamma = random(&mut rng, c, 0.5, 1.5);
    let beta = random(&mut rng, c, -0.5, 0.5);
    check(
        "layer_norm",
        &[
            (x.clone(), vec![r, c]),
            (gamma.clone(), vec![c]),
            (beta, vec![c]),
        ],
        |t| t[0].layer_norm(&t[1], &t[2], 1e-5).unwrap().y,
        move |h| {
            let mut out = Vec::new();
            for row in h[0].chunks(c) {
                let mean = row.iter().sum::<f64>() / c as f64;
                let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / c as f64;
                let rstd = 1.0 / (var + 1e-5).sqrt();
                out.extend(
                    row.iter()
                        .enumerate()
                        .map(|(j, v)| (v - mean) * rstd * h[1][j] + h[2][j]),
                );
            }
            out
        },
    );
    check(
        "rms_norm",
        &[(x, vec![r, c]), (gamma, vec![c])],
        |t| t[0].rms_norm(&t[1], 1e-5).unwrap().y,
        move |h| {
            let mut out = Vec::new();
            for row in h[0].chunks(c) {
                let ms = row.iter().map(|v| v * v).sum::<f64>() / c as f64;
                let rstd = 1.0 / (ms + 1e-5).sqrt();
                out.extend(row.iter().enumerate().map(|(j, v)| v * rstd * h[1][j]));
            }
            out
        },
    );
}

/// `h + norm(h)` with `h = 1.5·x` (not a leaf) for rows of `c`, checked against finite
/// differences: a layer norm with `beta`, else an RMS norm.
fn check_residual_norm(name: &str, rows: usize, c: usize, beta: bool, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut inputs = vec![
        (random(&mut rng, rows * c, -2.0, 2.0), vec![rows, c]),
        (random(&mut rng, c, 0.5, 1.5), vec![c]),
    ];
    if beta {
        inputs.push((random(&mut rng, c, -0.5, 0.5), vec![c]));
    }
    check(
        name,
        &inputs,
        |t| {
            let h = t[0].mul_scalar(1.5).unwrap();
            let y = match t.get(2) {
                Some(b) => h.layer_norm(&t[1], b, 1e-5).unwrap().y,
                None => h.rms_norm(&t[1], 1e-5).unwrap().y,
            };
            h.add(&y).unwrap()
        },
        move |h| {
            let mut out = Vec::new();
            for row in h[0].chunks(c) {
                let hs: Vec<f64> = row.iter().map(|v| 1.5 * v).collect();
                let n = c as f64;
                let m = if beta {
                    hs.iter().sum::<f64>() / n
                } else {
                    0.0
                };
                let var = hs.iter().map(|v| (v - m).powi(2)).sum::<f64>() / n;
                let rstd = 1.0 / (var + 1e-5).sqrt();
                out.extend((0..c).map(|j| {
                    let shift = if beta { h[2][j] } else { 0.0 };
                    (hs[j] - m) * rstd * h[1][j] + shift + hs[j]
                }));
            }
            out
        },
    );
}

/// A checkpointed norm inside a residual stream: the checkpoint's backward runs a backward
/// of its own, which must not disturb the gradient the engine offered the checkpoint's rule
/// (the residual's, for h).
#[test]
fn checkpoint_in_a_residual_stream_keeps_the_offered_gradient() {
    let mut rng = StdRng::seed_from_u64(29);
    let (r, c) = (4, 10);
    let x = random(&mut rng, r * c, -2.0, 2.0);
    let gamma = random(&mut rng, c, 0.5, 1.5);
    let beta = random(&mut rng, c, -0.5, 0.5);
    check(
        "checkpointed layer_norm in a residual stream",
        &[(x, vec![r, c]), (gamma, vec![c]), (beta, vec![c])],
        |t| {
            let h = t[0].mul_scalar(1.5).unwrap();
            let y = helios::checkpoint(&[&h, &t[1], &t[2]], |u| {
                Ok(u[0].layer_norm(&u[1], &u[2], 1e-5)?.y)
            })
            .unwrap();
            h.add(&y).unwrap()
        },
        move |h| {
            let mut out = Vec::new();
            for row in h[0].chunks(c) {
                let hs: Vec<f64> = row.iter().map(|v| 1.5 * v).collect();
                let m = hs.iter().sum::<f64>() / c as f64;
                let var = hs.iter().map(|v| (v - m).powi(2)).sum::<f64>() / c as f64;
                let rstd = 1.0 / (var + 1e-5).sqrt();
                out.extend((0..c).map(|j| (hs[j] - m) * rstd * h[1][j] + h[2][j] + hs[j]));
            }
            out
        },
    );
}

/// A norm inside a residual stream: the norm's backward adds the gradient the residual
/// already gave h inside its own kernel (`folded_gradient_sums` counts it), and the sum is
/// right, for layer and RMS norms and for rows too long for the cached kernel (not a
/// multiple of 4: the streaming one).
#[test]
fn norm_in_a_residual_stream_adds_in_its_kernel() {
    for (name, rows, c, beta) in [
        ("layer_norm in a residual stream", 5, 12, true),
        ("rms_norm in a residual stream", 5, 12, false),
        (
            "layer_norm of long rows in a residual stream",
            2,
            4102,
            true,
        ),
    ] {
        let before = helios::folded_gradient_sums();
        check_residual_norm(name, rows, c, beta, 23);
        assert!(
            helios::folded_gradient_sums() > before,
            "{name}: the norm's backward did not add the residual's gradient"
        );
    }
}

/// `loss.backward()` hands cross-entropy's saved gradient on as it is (its seed is 1); any
/// other upstream gradient still scales it.
#[test]
fn cross_entropy_gradient_under_each_seed() {
    let _l = LOCK.locked();
    let mut rng = StdRng::seed_from_u64(11);
    let (rows, vocab) = (5, 7);
    let targets: Vec<u32> = (0..rows).map(|_| rng.gen_range(0..vocab as u32)).collect();
    let ids = IndexTensor::from_slice(device(), &targets, &[rows]).unwrap();
    let logits = random(&mut rng, rows * vocab, -2.0, 2.0);
    let mut want = Vec::new();
    for (r, row) in logits.chunks(vocab).enumerate() {
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = row.iter().map(|v| (v - m).exp()).sum();
        for (j, v) in row.iter().enumerate() {
            let onehot = if j == targets[r] as usize { 1.0 } else { 0.0 };
            want.push(((v - m).exp() / z - onehot) / rows as f64);
        }
    }
    let seeds: [(&str, f64); 4] = [("backward", 1.0), ("ones", 1.0), ("x3", 3.0), ("view", 1.0)];
    for (how, factor) in seeds {
        let x = up(&logits, &[rows, vocab]).requires_grad_();
        let loss = x.cross_entropy(&ids, None).unwrap().loss;
        match how {
            "backward" => loss.backward().unwrap(),
            "ones" => {
                let one = Tensor::full(device(), loss.shape(), 1.0, DType::F32).unwrap();
                loss.backward_with(&one).unwrap()
            }
            "x3" => loss.mul_scalar(3.0).unwrap().backward().unwrap(),
            _ => loss.reshape(&[1, 1]).unwrap().backward().unwrap(),
        }
        let got = x.grad().unwrap().to_vec().unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let w = factor * w;
            assert!(
                (f64::from(*g) - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                "{how} {i}: {g} vs {w}"
            );
        }
    }
    assert_no_validation_messages();
}

#[test]
fn cross_entropy_and_embedding() {
    let mut rng = StdRng::seed_from_u64(7);
    let (rows, vocab, dim) = (4, 6, 5);
    let targets: Vec<u32> = (0..rows).map(|_| rng.gen_range(0..vocab as u32)).collect();
    let ids = IndexTensor::from_slice(device(), &targets, &[rows]).unwrap();
    let logits = random(&mut rng, rows * vocab, -2.0, 2.0);
    let t2 = targets.clone();
    let ids2 = ids.clone();
    check(
        "cross_entropy",
        &[(logits, vec![rows, vocab])],
        move |t| {
            t[0].cross_entropy(&ids2, None)
                .unwrap()
                .loss
                .mul_scalar(3.0)
                .unwrap()
        },
        move |h| {
            let mut total = 0.0;
            for (r, row) in h[0].chunks(vocab).enumerate() {
                let m = row.iter().cloned().fold(f64::MIN, f64::max);
                let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                total += lse - row[t2[r] as usize];
            }
            vec![3.0 * total / rows as f64]
        },
    );
    let table = random(&mut rng, vocab * dim, -1.0, 1.0);
    check(
        "embedding",
        &[(table, vec![vocab, dim])],
        move |t| t[0].embedding(&ids).unwrap(),
        move |h| {
            targets
                .iter()
                .flat_map(|&i| h[0][i as usize * dim..(i as usize + 1) * dim].to_vec())
                .collect()
        },
    );
}

#[test]
fn graph_is_released_and_gradients_accumulate() {
    let _l = LOCK.locked();
    let d = device();
    let w = Tensor::from_slice(d, &[0.5, -1.0, 2.0], &[3])
        .unwrap()
        .requires_grad_();
    let x = Tensor::from_slice(d, &[1.0, 2.0, 3.0], &[3]).unwrap();
    let before = graph_stats();
    {
        // A forward without backward keeps nothing.
        let y = x.mul(&w).unwrap().tanh().unwrap().sum_all().unwrap();
        assert!(graph_stats().live_grad_nodes > before.live_grad_nodes);
        drop(y);
    }
    assert_eq!(graph_stats().live_grad_nodes, before.live_grad_nodes);
    assert_eq!(graph_stats().live_nodes, before.live_nodes);
    for step in 1..=2 {
        let loss = x.mul(&w).unwrap().sum_all().unwrap();
        loss.backward().unwrap();
        // A second backward through the same graph is an error that says why.
        let again = loss.backward().unwrap_err().to_string();
        assert!(again.contains("already used"), "{again}");
        drop(loss);
        assert_eq!(
            graph_stats().live_grad_nodes,
            before.live_grad_nodes,
            "graph released"
        );
        let g = w.grad().unwrap().to_vec().unwrap();
        assert_eq!(
            g,
            vec![step as f32, 2.0 * step as f32, 3.0 * step as f32],
            "accumulates"
        );
    }
    w.zero_grad();
    assert!(w.grad().is_none());
    // no_grad records nothing; detach cuts the graph.
    let y = no_grad(|| x.mul(&w).unwrap());
    assert!(!y.requires_grad());
    assert!(!w.detach().requires_grad());
    assert_no_validation_messages();
}

/// An op saves only what its backward rule reads: in `exp(x·2 + b)` the scale and the add
/// read nothing back and the exponential reads its output, so the forward's one fused
/// kernel stores one array (before, every intermediate was held for backward and stored),
/// and the gradients still match the CPU.
#[test]
fn forward_stores_only_what_backward_reads() {
    let _l = LOCK.locked();
    let mut rng = StdRng::seed_from_u64(21);
    let (xv, bv) = (
        random(&mut rng, 24, -1.0, 1.0),
        random(&mut rng, 6, -1.0, 1.0),
    );
    let x = up(&xv, &[4, 6]).requires_grad_();
    let b = up(&bv, &[6]).requires_grad_();
    let before = graph_stats();
    let y = {
        // The chain's temporaries end with this statement, so the sum (which realises its
        // input at once) finds `e` held by this binding and by exp's backward only.
        let e = x.mul_scalar(2.0).unwrap().add(&b).unwrap().exp().unwrap();
        e.sum_all().unwrap()
    };
    y.realize().unwrap();
    let after = graph_stats();
    assert_eq!(
        after.kernels - before.kernels,
        1,
        "one fused forward kernel"
    );
    assert_eq!(
        after.outputs - before.outputs,
        1,
        "only exp's output is stored"
    );
    y.backward().unwrap();
    let (gx, gb) = (
        x.grad().unwrap().to_vec().unwrap(),
        b.grad().unwrap().to_vec().unwrap(),
    );
    let mut want_b = [0.0f64; 6];
    for (i, &g) in gx.iter().enumerate() {
        let e = (2.0 * xv[i] + bv[i % 6]).exp();
        assert!(
            (f64::from(g) - 2.0 * e).abs() <= 1e-5 * (1.0 + 2.0 * e),
            "dx[{i}]"
        );
        want_b[i % 6] += e;
    }
    for (j, (&g, w)) in gb.iter().zip(want_b).enumerate() {
        assert!((f64::from(g) - w).abs() <= 1e-5 * (1.0 + w), "db[{j}]");
    }
    assert_no_validation_messages();
}
#[test]
fn training_loop_reaches_a_memory_steady_state() {
    let _l = LOCK.locked();
    let d = device();
    let mut rng = StdRng::seed_from_u64(8);
    let (n, i, h, o) = (16, 8, 16, 4);
    let mut param = |shape: &[usize]| {
        let len: usize = shape.iter().product();
        let v: Vec<f32> = (0..len).map(|_| rng.gen_range(-0.3f32..0.3)).collect();
        Tensor::from_slice(d, &v, shape).unwrap().requires_grad_()
    };
    let (w1, b1, w2, b2) = (param(&[i, h]), param(&[h]), param(&[h, o]), param(&[o]));
    let params = [&w1, &b1, &w2, &b2];
    let zeros = |p: &Tensor| Tensor::zeros(d, p.shape(), DType::F32).unwrap();
    let moments: Vec<(Tensor, Tensor)> = params.iter().map(|p| (zeros(p), zeros(p))).collect();
    let x = Tensor::from_slice(d, &vec![0.5; n * i], &[n, i]).unwrap();
    let targets = IndexTensor::from_slice(d, &vec![1; n], &[n]).unwrap();
    let cfg = helios::AdamWConfig::default();
    let mut at_10 = None;
    let mut allocs_at_2 = 0;
    let mut first_loss = 0.0;
    let mut last_loss = 0.0;
    for step in 1..=1000u32 {
        let loss = {
            // The bias and GELU in the product's epilogue (in f32 the kernel also stores the
            // GELU's input, and the second product's input gradient comes out through it).
            let fc = helios::MatmulOptions {
                bias: Some(&b1),
                act: helios::Activation::GeluTanh,
                ..Default::default()
            };
            let hid = x.matmul_opts(&w1, &fc).unwrap();
            let logits = hid.matmul(&w2).unwrap().add(&b2).unwrap();
            logits.cross_entropy(&targets, None).unwrap().loss
        };
        loss.backward().unwrap();
        let grads: Vec<Tensor> = params.iter().map(|p| p.grad().unwrap()).collect();
        let list: Vec<helios::AdamWParam> = params
            .iter()
            .zip(&grads)
            .zip(&moments)
            .map(|((p, g), (m, v))| helios::AdamWParam {
                param: p,
                grad: g,
                m,
                v,
                copy: None,
                weight_decay: 0.0,
            })
            .collect();
        helios::adamw_step(&list, &cfg, step).unwrap();
        params.iter().for_each(|p| p.zero_grad());
        if step == 1 || step == 1000 {
            let l = loss.to_vec().unwrap()[0];
            if step == 1 {
                first_loss = l;
            } else {
                last_loss = l;
            }
        }
        drop(list);
        drop((loss, grads));
        if step == 2 {
            d.synchronize().unwrap();
            allocs_at_2 = d.memory_stats().driver_allocations;
        }
        if step == 10 {
            d.synchronize().unwrap();
            at_10 = Some((d.memory_stats().bytes_in_use, graph_stats().live_nodes));
        }
    }
    d.synchronize().unwrap();
    let (bytes_10, nodes_10) = at_10.unwrap();
    assert_eq!(
        d.memory_stats().bytes_in_use,
        bytes_10,
        "device bytes in use at step 1000 = step 10"
    );
    assert_eq!(
        graph_stats().live_nodes,
        nodes_10,
        "live graph nodes at step 1000 = step 10"
    );
    assert_eq!(
        d.memory_stats().driver_allocations,
        allocs_at_2,
        "no driver allocation after step 2"
    );
    assert!(
        last_loss < 0.1 * first_loss,
        "the MLP learns: {first_loss} → {last_loss}"
    );
    assert_no_validation_messages();
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

#[test]
fn attention_through_fused_qkv() {
    let mut rng = StdRng::seed_from_u64(10);
    let (b, t, h, d) = (1, 5, 2, 16);
    let qkv = random(&mut rng, b * t * 3 * h * d, -1.0, 1.0);
    check(
        "attention",
        &[(qkv, vec![b, t, 3, h, d])],
        |x| {
            // `split_qkv`'s [B, T, 1, H, D] views, read in place: their gradients come back in
            // that shape and sum into the fused tensor's.
            let [q, k, v] = x[0].split_qkv().unwrap();
            q.attention(&k, &v, &helios::AttentionOptions::causal())
                .unwrap()
                .out
        },
        move |hs| {
            let at = |ti: usize, which: usize, hi: usize, di: usize| {
                hs[0][(((ti * 3) + which) * h + hi) * d + di]
            };
            let scale = 1.0 / (d as f64).sqrt();
            let mut out = vec![0.0; t * h * d];
            for hi in 0..h {
                for i in 0..t {
                    let s: Vec<f64> = (0..=i)
                        .map(|j| {
                            scale
                                * (0..d)
                                    .map(|e| at(i, 0, hi, e) * at(j, 1, hi, e))
                                    .sum::<f64>()
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                    for e in 0..d {
                        out[(i * h + hi) * d + e] = (0..=i)
                            .map(|j| (s[j] - m).exp() / z * at(j, 2, hi, e))
                            .sum();
                    }
                }
            }
            out
        },
    );
}

/// `checkpoint` keeps one graph node and the inputs instead of the function's graph, and its
/// gradients equal the recorded graph's bit for bit (the recomputation runs the same
/// kernels); an input that needs no gradient gets none.
#[test]
fn checkpoint_recomputes_the_same_gradients() {
    let _l = LOCK.locked();
    let mut rng = StdRng::seed_from_u64(12);
    let (m, k, n) = (9, 7, 5);
    let a = random(&mut rng, m * k, -1.0, 1.0);
    let b = random(&mut rng, k * n, -1.0, 1.0);
    let c = random(&mut rng, m * n, -1.0, 1.0);
    let w = up(&random(&mut rng, m * n, -1.0, 1.0), &[m, n]);
    let f = |x: &[Tensor]| -> helios::Result<Tensor> {
        x[0].matmul(&x[1])?
            .add(&x[2])?
            .tanh()?
            .softmax()?
            .mul(&x[2])
    };
    let run = |checkpointed: bool| {
        let a = up(&a, &[m, k]).requires_grad_();
        let b = up(&b, &[k, n]).requires_grad_();
        let c = up(&c, &[m, n]); // no gradient
        let before = graph_stats().live_grad_nodes;
        let y = match checkpointed {
            true => helios::checkpoint(&[&a, &b, &c], f).unwrap(),
            false => f(&[a.clone(), b.clone(), c.clone()]).unwrap(),
        };
        let nodes = graph_stats().live_grad_nodes - before;
        let loss = y.mul(&w).unwrap().sum_all().unwrap();
        loss.backward().unwrap();
        let grads = (
            a.grad().unwrap().to_vec().unwrap(),
            b.grad().unwrap().to_vec().unwrap(),
        );
        (y.to_vec().unwrap(), grads, nodes, c.grad().is_none())
    };
    let (y0, g0, nodes0, _) = run(false);
    let (y1, g1, nodes1, c_none) = run(true);
    assert_eq!(y0, y1, "forward");
    assert_eq!(g0, g1, "gradients of a and b");
    assert!(c_none, "c needs no gradient");
    assert_eq!(nodes1, 1, "one node for the checkpointed function");
    assert!(
        nodes0 > 1,
        "the recorded graph has a node per op ({nodes0})"
    );
    assert_eq!(graph_stats().live_grad_nodes, 0, "released after backward");
    assert_no_validation_messages();
}

/// A table used, transposed, as a product's weight (an output head) gets a row-major
/// gradient (copied through the tiled transpose), not a strided view for the optimizer to
/// gather element by element; tied to an embedding as GPT-2's wte, the accumulated
/// gradient matches the f64 reference.
#[test]
fn transposed_weight_gradients_are_row_major_and_right() {
    let _l = LOCK.locked();
    let (vocab, dim, n) = (260usize, 256usize, 5usize);
    let mut rng = StdRng::seed_from_u64(77);
    let wv = random(&mut rng, vocab * dim, -1.0, 1.0);
    let rv = random(&mut rng, n * vocab, -1.0, 1.0);
    let ids: Vec<u32> = (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect();
    let w = up(&wv, &[vocab, dim]).requires_grad_();
    // The head alone: rᵀ·x, row-major.
    let xv = random(&mut rng, n * dim, -1.0, 1.0);
    let head = up(&xv, &[n, dim])
        .matmul(&w.transpose(0, 1).unwrap())
        .unwrap();
    let loss = head.mul(&up(&rv, &[n, vocab])).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    let g = w.grad().expect("backward reached the head");
    assert!(g.is_contiguous(), "strides {:?}", g.layout().strides());
    let got = g.to_vec().unwrap();
    for v in [0, 17, vocab - 1] {
        for c in [0, 100, dim - 1] {
            let want: f64 = (0..n).map(|i| rv[i * vocab + v] * xv[i * dim + c]).sum();
            let gv = got[v * dim + c] as f64;
            assert!(
                (gv - want).abs() <= 1e-4 * (want.abs() + 1.0),
                "head ({v}, {c})"
            );
        }
    }
    w.zero_grad();
    // Tied: the embedding's gradient and the head's, accumulated.
    let idx = IndexTensor::from_slice(device(), &ids, &[n]).unwrap();
    let e = w.embedding(&idx).unwrap();
    let logits = e.matmul(&w.transpose(0, 1).unwrap()).unwrap();
    let loss = logits
        .mul(&up(&rv, &[n, vocab]))
        .unwrap()
        .sum_all()
        .unwrap();
    loss.backward().unwrap();
    let g = w.grad().expect("backward reached the table");
    assert!(g.is_contiguous(), "strides {:?}", g.layout().strides());
    // d logits = r: the head's part is rᵀ·e, the embedding's adds (r·w)[i] to row ids[i].
    let mut want = vec![0.0f64; vocab * dim];
    for i in 0..n {
        let row = ids[i] as usize;
        for v in 0..vocab {
            let r = rv[i * vocab + v];
            for c in 0..dim {
                want[v * dim + c] += r * wv[row * dim + c];
                want[row * dim + c] += r * wv[v * dim + c];
            }
        }
    }
    let got = g.to_vec().unwrap();
    for (k, (&gv, &wv)) in got.iter().zip(&want).enumerate() {
        assert!(
            (gv as f64 - wv).abs() <= 1e-4 * (wv.abs() + 1.0),
            "element {k}: {gv}, expected {wv}"
        );
    }
    assert_no_validation_messages();
}
