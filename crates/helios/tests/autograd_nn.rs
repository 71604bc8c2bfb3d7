//! Autograd of softmax, norms and losses: their rules against finite differences of an f64
//! CPU forward (`common/grad.rs`), norms inside a residual stream, cross-entropy under each
//! seed, and embeddings.

mod common;

use common::grad::{check, random, up, LOCK};
use common::{assert_no_validation_messages, device, LockExt};
use helios::{DType, IndexTensor, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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

/// A table tied to an output head (GPT-2's wte): the head's gradient reaches the leaf first,
/// and the embedding's backward adds its sums into it in place (`folded_gradient_sums`
/// counts the offer taken). The gradient is right, and a gradient a caller still holds from
/// an earlier `backward()` is not overwritten when the next one accumulates onto it.
#[test]
fn tied_embedding_adds_into_the_heads_gradient() {
    let mut rng = StdRng::seed_from_u64(12);
    let (rows, vocab, dim) = (7, 9, 6);
    let tokens: Vec<u32> = (0..rows).map(|_| rng.gen_range(0..4)).collect();
    let ids = IndexTensor::from_slice(device(), &tokens, &[rows]).unwrap();
    let table = random(&mut rng, vocab * dim, -1.0, 1.0);
    let before = helios::folded_gradient_sums();
    // A layer between the two uses, as in a model: the head's transpose then runs right
    // after the head, before the embedding's rule.
    let head = |t: &Tensor, ids: &IndexTensor| -> Tensor {
        let h = t.embedding(ids).unwrap().mul_scalar(1.5).unwrap();
        h.matmul(&t.transpose(0, 1).unwrap()).unwrap()
    };
    let ids2 = ids.clone();
    check(
        "tied embedding and head",
        &[(table.clone(), vec![vocab, dim])],
        move |t| head(&t[0], &ids2),
        move |h| {
            let t = &h[0];
            let mut out = Vec::with_capacity(rows * vocab);
            for &i in &tokens {
                let e = &t[i as usize * dim..(i as usize + 1) * dim];
                for v in 0..vocab {
                    let w = &t[v * dim..(v + 1) * dim];
                    out.push(1.5 * e.iter().zip(w).map(|(a, b)| a * b).sum::<f64>());
                }
            }
            out
        },
    );
    assert!(
        helios::folded_gradient_sums() > before,
        "the embedding's backward did not take the head's gradient"
    );

    let _l = LOCK.locked();
    let t = up(&table, &[vocab, dim]).requires_grad_();
    head(&t, &ids).sum_all().unwrap().backward().unwrap();
    let first = t.grad().unwrap();
    let once = first.to_vec().unwrap();
    head(&t, &ids).sum_all().unwrap().backward().unwrap();
    assert_eq!(first.to_vec().unwrap(), once, "the held gradient changed");
    let twice = t.grad().unwrap().to_vec().unwrap();
    for (e, (a, b)) in twice.iter().zip(&once).enumerate() {
        assert!(
            (a - 2.0 * b).abs() <= 1e-5 * (b.abs() + 1.0),
            "element {e}: {a} vs 2 × {b}"
        );
    }
    assert_no_validation_messages();
}
