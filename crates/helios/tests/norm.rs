//! LayerNorm and RMSNorm, forward and backward, on the Vulkan device present against the f64
//! CPU reference: property tests over random shapes (odd lengths, rows longer than a
//! workgroup's registers), offsets far from zero, dtypes of x and of the parameters, on four
//! device configurations (subgroups on and off, each variant forced); rows of 50257; NaN
//! rows; bad operands. Inputs are random and never zero. Every test fails on any validation
//! message.

use std::sync::OnceLock;

mod common;

use common::{assert_clean, device_with, row_lengths};
use helios::cpu::norm as reference;
use helios::cpu::softmax::accepts;
use helios::{DType, Device, Error, KernelConfig, RowConfig, RowVariant, Tensor};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CONFIGS: [(bool, RowVariant); 4] = [
    (true, RowVariant::Auto),
    (false, RowVariant::Auto),
    (true, RowVariant::Streaming),
    (false, RowVariant::Cached),
];

fn devices() -> &'static [Device; 4] {
    static DEVICES: OnceLock<[Device; 4]> = OnceLock::new();
    DEVICES.get_or_init(|| {
        CONFIGS.map(|(subgroups, variant)| {
            device_with(|base| KernelConfig {
                subgroups,
                rows: RowConfig {
                    variant,
                    // The default walks one row per group below 512 rows: keep several rows
                    // per group (and a last group short of rows) under test here.
                    norm_rows: if variant == RowVariant::Cached {
                        Some(3)
                    } else {
                        base.rows.norm_rows
                    },
                    ..base.rows
                },
                ..base
            })
        })
    })
}

/// `offset` plus random values in ±[lo, hi), never zero, rounded to `dtype`.
fn random(n: usize, seed: u64, lo: f32, hi: f32, offset: f32, dtype: DType) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let m: f32 = rng.gen_range(lo..hi);
            dtype.round(offset + if rng.gen_bool(0.5) { m } else { -m })
        })
        .collect()
}

/// Forward and backward of rms (else layer) norm against the f64 reference: x of shape
/// [rows, len] in `dtype` (random values around `offset`, from `seed`), parameters in
/// `pdtype`.
fn check(
    d: &Device,
    [rows, len]: [usize; 2],
    rms: bool,
    dtype: DType,
    pdtype: DType,
    offset: f32,
    seed: u64,
) -> Result<(), String> {
    let what = format!(
        "{} x {dtype} params {pdtype} [{rows}, {len}] offset {offset}",
        if rms { "rms_norm" } else { "layer_norm" }
    );
    let err = |e: helios::Error| format!("{what}: {e}");
    let n = rows * len;
    let eps = 1e-5;
    let x = random(n, seed, 0.1, 2.0, offset, dtype);
    let gamma = random(len, seed + 1, 0.5, 1.5, 0.0, pdtype);
    let beta = random(len, seed + 2, 0.1, 1.0, 0.0, pdtype);
    let xt = Tensor::from_slice_as(d, &x, &[rows, len], dtype).map_err(err)?;
    let gt = Tensor::from_slice_as(d, &gamma, &[len], pdtype).map_err(err)?;
    let bt = Tensor::from_slice_as(d, &beta, &[len], pdtype).map_err(err)?;
    let out = if rms {
        xt.rms_norm(&gt, eps)
    } else {
        xt.layer_norm(&gt, &bt, eps)
    }
    .map_err(err)?;
    let beta_ref = (!rms).then_some(&beta[..]);
    let (want, mean, rstd) = reference::norm_forward(&x, &gamma, beta_ref, len, eps, rms);
    let tol = reference::norm_tolerance(dtype);
    let got = out.y.to_vec().map_err(err)?;
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        // |x̂·γ| + |β| + 1: x̂ carries the f32 error of the statistics.
        let mag = (w.abs() as f64) + 4.0;
        if !accepts(g, w, mag, tol) {
            return Err(format!("{what}: y[{i}]: got {g}, want {w}"));
        }
    }
    let f32_tol = reference::norm_tolerance(DType::F32);
    let got_rstd = out.rstd.to_vec().map_err(err)?;
    for (i, (&g, &w)) in got_rstd.iter().zip(&rstd).enumerate() {
        if !accepts(g, w, 10.0 * w.abs() as f64, f32_tol) {
            return Err(format!("{what}: rstd[{i}]: got {g}, want {w}"));
        }
    }
    if let Some(m) = &out.mean {
        for (i, (&g, &w)) in m.to_vec().map_err(err)?.iter().zip(&mean).enumerate() {
            if !accepts(g, w, offset.abs() as f64 + 2.0, f32_tol) {
                return Err(format!("{what}: mean[{i}]: got {g}, want {w}"));
            }
        }
    }

    // Backward from the reference statistics.
    let dy = random(n, seed + 3, 0.1, 1.0, 0.0, dtype);
    let dyt = Tensor::from_slice_as(d, &dy, &[rows, len], dtype).map_err(err)?;
    let rt = Tensor::from_slice(d, &rstd, &[rows]).map_err(err)?;
    let grads = if rms {
        xt.rms_norm_backward(&gt, &rt, &dyt)
    } else {
        let mt = Tensor::from_slice(d, &mean, &[rows]).map_err(err)?;
        xt.layer_norm_backward(&gt, &mt, &rt, &dyt)
    }
    .map_err(err)?;
    let mean_ref = (!rms).then_some(&mean[..]);
    let r = reference::norm_backward(&x, &gamma, mean_ref, &rstd, &dy, len);
    let got = grads.dx.to_vec().map_err(err)?;
    for (i, ((&g, &w), &m)) in got.iter().zip(&r.dx).zip(&r.dx_scale).enumerate() {
        if !accepts(g, w, m * (1.0 + offset.abs() as f64), tol) {
            return Err(format!("{what}: dx[{i}]: got {g}, want {w} (scale {m})"));
        }
    }
    let ptol = reference::norm_tolerance(pdtype);
    let sums = [
        ("dgamma", Some(&grads.dgamma), &r.dgamma, &r.dgamma_scale),
        ("dbeta", grads.dbeta.as_ref(), &r.dbeta, &r.dbeta_scale),
    ];
    for (name, t, want, scale) in sums {
        let Some(t) = t else { continue };
        let got = t.to_vec().map_err(err)?;
        for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(scale).enumerate() {
            if !accepts(g, w, m * (1.0 + offset.abs() as f64), ptol) {
                return Err(format!(
                    "{what}: {name}[{i}]: got {g}, want {w} (scale {m})"
                ));
            }
        }
    }
    if rms != grads.dbeta.is_none() {
        return Err(format!("{what}: dbeta presence"));
    }
    Ok(())
}

proptest! {
    // A fixed seed: the same cases (and kernels, cached after the first run) every time.
    #![proptest_config(ProptestConfig {
        cases: 40,
        rng_seed: RngSeed::Fixed(0x0e0f),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_rows_match_reference(
        rows in 1usize..9,
        len in row_lengths(),
        rms in any::<bool>(),
        dtype in 0usize..3,
        f32_params in any::<bool>(),
        offset in prop_oneof![Just(0.0f32), -50.0f32..50.0],
        config in 0usize..4,
        seed in any::<u64>(),
    ) {
        let dtype = DType::ALL[dtype];
        let pdtype = if f32_params { DType::F32 } else { dtype };
        let d = &devices()[config];
        if let Err(e) = check(d, [rows, len], rms, dtype, pdtype, offset, seed) {
            prop_assert!(false, "{}", e);
        }
        assert_clean(d);
    }
}

/// GPT-2's vocabulary length (odd, far longer than a workgroup's registers) and its model
/// width over more rows than one pass of groups covers.
#[test]
fn long_rows_and_many_rows() {
    for (i, d) in devices().iter().enumerate() {
        let dtype = DType::ALL[i % 3];
        check(d, [3, 50257], i % 2 == 1, dtype, DType::F32, 1.0, 10).unwrap();
        check(d, [301, 768], i % 2 == 0, dtype, dtype, -3.0, 11).unwrap();
        assert_clean(d);
    }
}

#[test]
fn nan_rows_and_bad_operands() {
    for d in devices() {
        for len in [6usize, 9001] {
            let mut x = vec![0.5f32; 2 * len];
            x[1] = f32::NAN;
            x[len + 1] = 2.0;
            let t = Tensor::from_slice(d, &x, &[2, len]).unwrap();
            let g = Tensor::from_slice(d, &vec![1.0; len], &[len]).unwrap();
            let b = Tensor::from_slice(d, &vec![0.0; len], &[len]).unwrap();
            let out = t.layer_norm(&g, &b, 1e-5).unwrap();
            let y = out.y.to_vec().unwrap();
            assert!(y[..len].iter().all(|v| v.is_nan()), "NaN in, NaN out");
            assert!(y[len..].iter().all(|v| v.is_finite()));
            assert!(out.mean.unwrap().to_vec().unwrap()[0].is_nan());
            let r = t.rms_norm(&g, 1e-5).unwrap();
            assert!(r.y.to_vec().unwrap()[..len].iter().all(|v| v.is_nan()));
        }
        assert_clean(d);
    }
    let d = &devices()[0];
    let x = Tensor::from_slice(d, &[1.0; 6], &[2, 3]).unwrap();
    let g = Tensor::from_slice(d, &[1.0; 3], &[3]).unwrap();
    let g2 = Tensor::from_slice(d, &[1.0; 2], &[2]).unwrap();
    let gh = Tensor::from_slice_as(d, &[1.0; 3], &[3], DType::F16).unwrap();
    assert!(matches!(
        x.layer_norm(&g2, &g, 1e-5),
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        x.layer_norm(&g, &gh, 1e-5),
        Err(Error::DTypeMismatch { .. })
    ));
    let out = x.layer_norm(&g, &g, 1e-5).unwrap();
    let mean = out.mean.unwrap();
    // rstd where mean belongs is fine (same shape); a wrong shape or dtype is an error.
    let wrong = Tensor::from_slice(d, &[1.0; 3], &[3]).unwrap();
    assert!(matches!(
        x.layer_norm_backward(&g, &wrong, &out.rstd, &x),
        Err(Error::Invalid { .. })
    ));
    let half = Tensor::from_slice_as(d, &[1.0; 2], &[2], DType::F16).unwrap();
    assert!(matches!(
        x.rms_norm_backward(&g, &half, &x),
        Err(Error::Invalid { .. })
    ));
    let dy = Tensor::from_slice(d, &[1.0; 4], &[2, 2]).unwrap();
    assert!(matches!(
        x.layer_norm_backward(&g, &mean, &out.rstd, &dy),
        Err(Error::ShapeMismatch { .. })
    ));
    let e = Tensor::from_slice(d, &[], &[2, 0]).unwrap();
    let g0 = Tensor::from_slice(d, &[], &[0]).unwrap();
    assert!(matches!(
        e.rms_norm(&g0, 1e-5),
        Err(Error::EmptyReduction { .. })
    ));
    // No rows: empty outputs and zero parameter gradients.
    let z = Tensor::from_slice(d, &[], &[0, 3]).unwrap();
    let out = z.layer_norm(&g, &g, 1e-5).unwrap();
    assert_eq!(out.y.shape(), &[0, 3]);
    let grads = z
        .layer_norm_backward(&g, out.mean.as_ref().unwrap(), &out.rstd, &z)
        .unwrap();
    assert_eq!(grads.dgamma.to_vec().unwrap(), vec![0.0; 3]);
    assert_clean(d);
}

/// A transposed view is normalized as the values it shows (forward and backward).
#[test]
fn views_are_normalized_as_their_values() {
    let d = &devices()[0];
    let host = random(5 * 7, 21, 0.1, 2.0, 0.0, DType::F32);
    let x = Tensor::from_slice(d, &host, &[5, 7]).unwrap();
    let t = x.transpose(0, 1).unwrap(); // (7, 5)
    let th: Vec<f32> = (0..7)
        .flat_map(|i| (0..5).map(move |j| (i, j)))
        .map(|(i, j)| host[j * 7 + i])
        .collect();
    let g = Tensor::from_slice(d, &[1.0, 0.5, 2.0, 1.5, 1.0], &[5]).unwrap();
    let b = Tensor::from_slice(d, &[0.1, 0.2, 0.3, 0.4, 0.5], &[5]).unwrap();
    let out = t.layer_norm(&g, &b, 1e-5).unwrap();
    let (want, mean, rstd) = reference::norm_forward(
        &th,
        &[1.0, 0.5, 2.0, 1.5, 1.0],
        Some(&[0.1, 0.2, 0.3, 0.4, 0.5]),
        5,
        1e-5,
        false,
    );
    for (gv, w) in out.y.to_vec().unwrap().iter().zip(&want) {
        assert!((gv - w).abs() < 1e-5);
    }
    let grads = t
        .layer_norm_backward(&g, out.mean.as_ref().unwrap(), &out.rstd, &t)
        .unwrap();
    let r = reference::norm_backward(&th, &[1.0, 0.5, 2.0, 1.5, 1.0], Some(&mean), &rstd, &th, 5);
    for (gv, w) in grads.dgamma.to_vec().unwrap().iter().zip(&r.dgamma) {
        assert!((gv - w).abs() < 1e-4, "{gv} vs {w}");
    }
    assert_clean(d);
}
