//! The scheduler's fold of element-wise ops into a matrix product's epilogue
//! (`lazy::epilogue`): a product waits in the graph until something needs it, and a fused
//! group reading it gives the kernel its scale, bias, activation (or an activation's
//! gradient), residual and cast.
//!
//! Each case builds a product and a tail from plain tensor ops, on random inputs, in f32,
//! f16 and bf16, unbatched and batched, and checks the result against the f64 CPU
//! reference from the same rounded inputs (relative L2 error ≤ f32 1e-5, f16 3e-3, bf16
//! 2e-2), and how many products took a tail and how many fused kernels ran, which says
//! what was folded. Cases that must not fold (a product read twice, or held elsewhere and
//! not by an activation) check that nothing is lost.

mod common;

use common::{assert_no_validation_messages, device, LockExt};
use helios::{graph_stats, DType, MatmulOptions, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Serialises the tests: the scheduler's counters are process-wide.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 3e-3,
        DType::BF16 => 2e-2,
    }
}

fn gelu(z: f64) -> f64 {
    0.5 * z * (1.0 + (0.797_884_560_802_865_4 * (z + 0.044715 * z.powi(3))).tanh())
}

fn dgelu(z: f64) -> f64 {
    let c = 0.797_884_560_802_865_4;
    let t = (c * (z + 0.044715 * z.powi(3))).tanh();
    0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * z * z)
}

/// A tensor of `shape` from random values, and the values it holds.
fn leaf(rng: &mut StdRng, shape: &[usize], dtype: DType) -> (Tensor, Vec<f64>) {
    let len = shape.iter().product();
    let v: Vec<f32> = (0..len).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let t = Tensor::from_slice_as(device(), &v, shape, dtype).unwrap();
    let seen = t.to_vec().unwrap().iter().map(|&x| x.into()).collect();
    (t, seen)
}

/// The operands of one case: x (batch, m, k) or (m, k); w (k, n) or (batch, k, n); a second
/// product's x2 and w2; a bias (n); r and z of the output's shape.
struct Operands {
    x: Tensor,
    w: Tensor,
    x2: Tensor,
    w2: Tensor,
    b: Tensor,
    r: Tensor,
    z: Tensor,
}

/// The operands' values, and the reference products x·w and x2·w2.
struct Values {
    n: usize,
    b: Vec<f64>,
    r: Vec<f64>,
    z: Vec<f64>,
    p: Vec<f64>,
    p2: Vec<f64>,
}

/// `a (batch, m, k) · b (k, n)`, or a batch of `b`s when `b_batched`.
fn matmul_cpu(
    a: &[f64],
    b: &[f64],
    (batch, m, k, n): (usize, usize, usize, usize),
    b_batched: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; batch * m * n];
    for bi in 0..batch {
        let bb = if b_batched { bi * k * n } else { 0 };
        for i in 0..m {
            for j in 0..n {
                out[(bi * m + i) * n + j] = (0..k)
                    .map(|l| a[(bi * m + i) * k + l] * b[bb + l * n + j])
                    .sum();
            }
        }
    }
    out
}

fn operands(seed: u64, dtype: DType, batch: usize, b_batched: bool) -> (Operands, Values) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (m, k, n) = (
        rng.gen_range(5..40),
        rng.gen_range(3..50),
        rng.gen_range(5..40),
    );
    let lead = |rest: &[usize]| -> Vec<usize> {
        match batch {
            1 => rest.to_vec(),
            _ => [&[batch][..], rest].concat(),
        }
    };
    let (x, xv) = leaf(&mut rng, &lead(&[m, k]), dtype);
    let w_shape = match b_batched {
        true => vec![batch, k, n],
        false => vec![k, n],
    };
    let (w, wv) = leaf(&mut rng, &w_shape, dtype);
    let (x2, x2v) = leaf(&mut rng, &lead(&[m, k]), dtype);
    let (w2, w2v) = leaf(&mut rng, &w_shape, dtype);
    let (b, bv) = leaf(&mut rng, &[n], dtype);
    let (r, rv) = leaf(&mut rng, &lead(&[m, n]), dtype);
    let (z, zv) = leaf(&mut rng, &lead(&[m, n]), dtype);
    let dims = (batch, m, k, n);
    let values = Values {
        n,
        b: bv,
        r: rv,
        z: zv,
        p: matmul_cpu(&xv, &wv, dims, b_batched),
        p2: matmul_cpu(&x2v, &w2v, dims, b_batched),
    };
    (
        Operands {
            x,
            w,
            x2,
            w2,
            b,
            r,
            z,
        },
        values,
    )
}

/// One case: the graph, its reference, and (products that took a tail, fused kernels) in
/// f32 and in f16/bf16, where activations stay out of the epilogue.
struct Case {
    name: &'static str,
    build: fn(&Operands) -> helios::Result<Tensor>,
    want: fn(&Values) -> Vec<f64>,
    f32_counts: (u64, u64),
    low_counts: (u64, u64),
}

fn bias_of(v: &Values, i: usize) -> f64 {
    v.b[i % v.n]
}

const CASES: &[Case] = &[
    Case {
        name: "p + bias",
        build: |o| o.x.matmul(&o.w)?.add(&o.b),
        want: |v| {
            v.p.iter()
                .enumerate()
                .map(|(i, p)| p + bias_of(v, i))
                .collect()
        },
        f32_counts: (1, 0),
        low_counts: (1, 0),
    },
    Case {
        name: "0.5 p + bias",
        build: |o| o.x.matmul(&o.w)?.mul_scalar(0.5)?.add(&o.b),
        want: |v| {
            v.p.iter()
                .enumerate()
                .map(|(i, p)| 0.5 * p + bias_of(v, i))
                .collect()
        },
        f32_counts: (1, 0),
        low_counts: (1, 0),
    },
    Case {
        name: "p / 3 + bias",
        build: |o| o.x.matmul(&o.w)?.div_scalar(3.0)?.add(&o.b),
        want: |v| {
            v.p.iter()
                .enumerate()
                .map(|(i, p)| p / 3.0 + bias_of(v, i))
                .collect()
        },
        f32_counts: (1, 0),
        low_counts: (1, 0),
    },
    Case {
        name: "gelu(p + bias)",
        build: |o| o.x.matmul(&o.w)?.add(&o.b)?.gelu_tanh(),
        want: |v| {
            v.p.iter()
                .enumerate()
                .map(|(i, p)| gelu(p + bias_of(v, i)))
                .collect()
        },
        f32_counts: (1, 0),
        low_counts: (1, 1),
    },
    Case {
        name: "relu(p + bias) + r",
        build: |o| o.x.matmul(&o.w)?.add(&o.b)?.relu()?.add(&o.r),
        want: |v| {
            let f = |(i, p): (usize, &f64)| (p + bias_of(v, i)).max(0.0) + v.r[i];
            v.p.iter().enumerate().map(f).collect()
        },
        f32_counts: (1, 0),
        low_counts: (1, 1),
    },
    Case {
        name: "r + p",
        build: |o| o.r.add(&o.x.matmul(&o.w)?),
        want: |v| v.p.iter().zip(&v.r).map(|(p, r)| p + r).collect(),
        f32_counts: (1, 0),
        low_counts: (1, 0),
    },
    Case {
        name: "p + p2 (the second product is the residual)",
        build: |o| o.x.matmul(&o.w)?.add(&o.x2.matmul(&o.w2)?),
        want: |v| v.p.iter().zip(&v.p2).map(|(p, q)| p + q).collect(),
        f32_counts: (1, 0),
        low_counts: (1, 0),
    },
    Case {
        name: "gelu_backward(z, p)",
        build: |o| o.z.gelu_tanh_backward(&o.x.matmul(&o.w)?),
        want: |v| v.p.iter().zip(&v.z).map(|(p, z)| p * dgelu(*z)).collect(),
        f32_counts: (1, 0),
        low_counts: (0, 1),
    },
    Case {
        name: "exp(p + bias): the tail stops before exp",
        build: |o| o.x.matmul(&o.w)?.add(&o.b)?.mul_scalar(0.25)?.exp(),
        want: |v| {
            let f = |(i, p): (usize, &f64)| ((p + bias_of(v, i)) * 0.25).exp();
            v.p.iter().enumerate().map(f).collect()
        },
        f32_counts: (1, 1),
        low_counts: (1, 1),
    },
    Case {
        name: "p + 2p (read twice: not folded)",
        build: |o| {
            let p = o.x.matmul(&o.w)?;
            p.add(&p.mul_scalar(2.0)?)
        },
        want: |v| v.p.iter().map(|p| 3.0 * p).collect(),
        f32_counts: (0, 1),
        low_counts: (0, 1),
    },
];

/// Runs every case in `dtype`, batched as given, checking values and counts.
fn run_cases(dtype: DType, batch: usize, b_batched: bool, seed: u64) {
    for (c, case) in CASES.iter().enumerate() {
        let (o, v) = operands(seed + c as u64, dtype, batch, b_batched);
        let before = graph_stats();
        let y = (case.build)(&o).unwrap();
        let got: Vec<f64> = y.to_vec().unwrap().iter().map(|&x| x.into()).collect();
        let after = graph_stats();
        let counts = (
            after.epilogues - before.epilogues,
            after.kernels - before.kernels,
        );
        let what = format!(
            "{} in {dtype:?}, batch {batch} (b batched: {b_batched})",
            case.name
        );
        let want_counts = match dtype {
            DType::F32 => case.f32_counts,
            _ => case.low_counts,
        };
        assert_eq!(counts, want_counts, "{what}: (tails folded, fused kernels)");
        let want = (case.want)(&v);
        assert_eq!(got.len(), want.len(), "{what}");
        let err = rel_l2(&got, &want);
        assert!(err <= tolerance(dtype), "{what}: relative error {err:.2e}");
    }
}

fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    let diff: f64 = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
    let norm: f64 = want.iter().map(|b| b * b).sum();
    (diff / norm.max(1e-30)).sqrt()
}

#[test]
fn element_wise_tails_fold_into_the_products_epilogue() {
    let _l = LOCK.locked();
    for (i, dtype) in [DType::F32, DType::F16, DType::BF16]
        .into_iter()
        .enumerate()
    {
        let seed = 100 * i as u64;
        run_cases(dtype, 1, false, seed);
        run_cases(dtype, 3, false, seed + 30);
        run_cases(dtype, 2, true, seed + 60);
    }
    assert_no_validation_messages();
}

#[test]
fn a_cast_folds_where_nothing_else_is_read() {
    let _l = LOCK.locked();
    for (from, to) in [
        (DType::F32, DType::BF16),
        (DType::BF16, DType::F32),
        (DType::F16, DType::F32),
    ] {
        let (o, v) = operands(7, from, 1, false);
        let before = graph_stats();
        let y = o.x.matmul(&o.w).unwrap().to_dtype(to).unwrap();
        assert_eq!(y.dtype(), to);
        let got: Vec<f64> = y.to_vec().unwrap().iter().map(|&x| x.into()).collect();
        let after = graph_stats();
        assert_eq!(after.epilogues - before.epilogues, 1, "{from:?} → {to:?}");
        assert_eq!(after.kernels, before.kernels, "{from:?} → {to:?}");
        let tol = tolerance(from).max(tolerance(to));
        let err = rel_l2(&got, &v.p);
        assert!(err <= tol, "{from:?} → {to:?}: relative error {err:.2e}");
        // With a bias the cast is left to a fused kernel (the bias would be converted).
        let before = graph_stats();
        let y =
            o.x.matmul(&o.w)
                .unwrap()
                .add(&o.b)
                .unwrap()
                .to_dtype(to)
                .unwrap();
        let got: Vec<f64> = y.to_vec().unwrap().iter().map(|&x| x.into()).collect();
        let after = graph_stats();
        let counts = (
            after.epilogues - before.epilogues,
            after.kernels - before.kernels,
        );
        assert_eq!(counts, (1, 1), "{from:?} → {to:?} after a bias");
        let want: Vec<f64> =
            v.p.iter()
                .enumerate()
                .map(|(i, p)| p + bias_of(&v, i))
                .collect();
        let err = rel_l2(&got, &want);
        assert!(
            err <= tol,
            "{from:?} → {to:?} after a bias: relative error {err:.2e}"
        );
    }
    assert_no_validation_messages();
}

#[test]
fn a_product_held_elsewhere_is_stored_whole() {
    let _l = LOCK.locked();
    let (o, v) = operands(9, DType::F32, 1, false);
    // Held and then added to: the product is stored as it is, the add fused apart.
    let p = o.x.matmul(&o.w).unwrap();
    let before = graph_stats();
    let y = p.add(&o.b).unwrap();
    let got: Vec<f64> = y.to_vec().unwrap().iter().map(|&x| x.into()).collect();
    let after = graph_stats();
    assert_eq!(after.epilogues - before.epilogues, 0);
    assert_eq!(after.kernels - before.kernels, 1);
    let want: Vec<f64> =
        v.p.iter()
            .enumerate()
            .map(|(i, p)| p + bias_of(&v, i))
            .collect();
    assert!(rel_l2(&got, &want) <= 1e-5);
    let pv: Vec<f64> = p.to_vec().unwrap().iter().map(|&x| x.into()).collect();
    assert!(rel_l2(&pv, &v.p) <= 1e-5);
    // Held and read by an activation: the kernel stores the activation's input beside it.
    let p = o.x.matmul(&o.w).unwrap();
    let before = graph_stats();
    let y = p.relu().unwrap();
    y.realize().unwrap();
    assert!(p.is_realized(), "stored as the activation's input");
    let after = graph_stats();
    assert_eq!(after.epilogues - before.epilogues, 1);
    assert_eq!(after.kernels - before.kernels, 0);
    let got: Vec<f64> = y.to_vec().unwrap().iter().map(|&x| x.into()).collect();
    let want: Vec<f64> = v.p.iter().map(|p| p.max(0.0)).collect();
    assert!(rel_l2(&got, &want) <= 1e-5);
    let pv: Vec<f64> = p.to_vec().unwrap().iter().map(|&x| x.into()).collect();
    assert!(rel_l2(&pv, &v.p) <= 1e-5);
    assert_no_validation_messages();
}

/// A two-layer MLP with biases and a GELU, `loss = Σ (mlp(x) + x) · r`, written with plain
/// ops and with `matmul_opts` (what `helios_nn` writes): its forward without autograd
/// records the same number of kernels, and its loss and gradients (with autograd) agree.
#[test]
fn a_plain_op_mlp_runs_like_the_hand_fused_one() {
    let _l = LOCK.locked();
    let d = device();
    let mut rng = StdRng::seed_from_u64(31);
    let (m, c, h) = (24, 16, 40);
    let mut param = |shape: &[usize], scale: f32| {
        let len = shape.iter().product();
        let v: Vec<f32> = (0..len)
            .map(|_| scale * rng.gen_range(-1.0f32..1.0))
            .collect();
        Tensor::from_slice(d, &v, shape).unwrap().requires_grad_()
    };
    let x = param(&[m, c], 1.0);
    let w1 = param(&[c, h], 0.3);
    let b1 = param(&[h], 0.1);
    let w2 = param(&[h, c], 0.3);
    let b2 = param(&[c], 0.1);
    let r = param(&[m, c], 1.0).detach();
    let plain = || -> helios::Result<Tensor> {
        let a = x.matmul(&w1)?.add(&b1)?.gelu_tanh()?;
        a.matmul(&w2)?.add(&b2)?.add(&x)
    };
    let fused = || -> helios::Result<Tensor> {
        let fc = MatmulOptions {
            bias: Some(&b1),
            act: helios::Activation::GeluTanh,
            ..Default::default()
        };
        let proj = MatmulOptions {
            bias: Some(&b2),
            residual: Some(&x),
            ..Default::default()
        };
        x.matmul_opts(&w1, &fc)?.matmul_opts(&w2, &proj)
    };
    let dispatches = |f: &dyn Fn() -> helios::Result<Tensor>| {
        d.synchronize().unwrap();
        let before = d.encoder_stats().dispatches;
        helios::no_grad(|| f().unwrap().realize().unwrap());
        d.synchronize().unwrap();
        d.encoder_stats().dispatches - before
    };
    // Once each first: on a GPU the first run tunes its products' kernels.
    dispatches(&plain);
    dispatches(&fused);
    assert_eq!(dispatches(&plain), dispatches(&fused), "forward kernels");
    assert_eq!(dispatches(&plain), 2, "one kernel per layer");
    let params = [&x, &w1, &b1, &w2, &b2];
    let run = |f: &dyn Fn() -> helios::Result<Tensor>| -> Vec<Vec<f32>> {
        let loss = f().unwrap().mul(&r).unwrap().sum_all().unwrap();
        loss.backward().unwrap();
        // A weight's gradient, a product, is recorded as backward hands it to the leaf.
        for w in [&w1, &w2] {
            assert!(
                w.grad().unwrap().is_realized(),
                "a weight's gradient is recorded"
            );
        }
        let mut out = vec![loss.to_vec().unwrap()];
        for p in params {
            out.push(p.grad().expect("backward reached it").to_vec().unwrap());
            p.zero_grad();
        }
        out
    };
    let (a, b) = (run(&plain), run(&fused));
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        let a: Vec<f64> = a.iter().map(|&v| v.into()).collect();
        let b: Vec<f64> = b.iter().map(|&v| v.into()).collect();
        let err = rel_l2(&a, &b);
        assert!(
            err <= 1e-5,
            "value {i} (loss, then x, w1, b1, w2, b2): {err:.2e}"
        );
    }
    assert_no_validation_messages();
}
