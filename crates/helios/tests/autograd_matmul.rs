//! Autograd of matrix products: the matmul rules against finite differences of an f64 CPU
//! forward (`common/grad.rs`), low-precision MLP gradients, transposed weights and attention
//! through a fused QKV projection.

mod common;

use common::grad::{check, random, up, LOCK};
use common::{assert_no_validation_messages, device, LockExt};
use helios::{graph_stats, DType, IndexTensor, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
