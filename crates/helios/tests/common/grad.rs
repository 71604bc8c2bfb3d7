//! Gradient checks shared by the autograd tests: every backward rule against central finite
//! differences of an f64 CPU forward, on random inputs (never zeros).
//!
//! Each check computes `loss = Σ f(inputs) · w` for a random weight `w` (so the upstream
//! gradient is random too), runs `backward()`, and compares every input's gradient with
//! `(L(x + h) − L(x − h)) / 2h` of the CPU forward in f64. f32 tolerance: |got − want| ≤
//! 2e-3 · (|want| + scale), where scale is the gradient's largest magnitude / 10.

use helios::Tensor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{assert_no_validation_messages, device, LockExt};

/// Serialises the tests: live-node counts and memory statistics are process- and
/// device-wide.
pub static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn random(rng: &mut StdRng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
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

pub fn up(v: &[f64], shape: &[usize]) -> Tensor {
    let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    Tensor::from_slice(device(), &f, shape).unwrap()
}

/// Checks the gradients of `gpu` against finite differences of `cpu` at `inputs`.
#[track_caller]
pub fn check(
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
