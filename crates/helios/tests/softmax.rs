//! Softmax, log-softmax and their backward passes on the Vulkan device present against the
//! f64 CPU reference: property tests over random shapes (odd lengths, rows longer than a
//! workgroup), scales, causal masks and dtypes, on four device configurations (subgroups on
//! and off, each variant forced), rows of 50257, NaN rows and fully masked rows, and errors.
//! Inputs are random and never zero. Every test fails on any validation message.

use std::sync::OnceLock;

mod common;

use common::{assert_clean, device_with, row_lengths};
use helios::cpu::softmax as reference;
use helios::{DType, Device, Error, KernelConfig, RowConfig, RowVariant, SoftmaxOptions, Tensor};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Device configurations: (subgroups, variant).
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
                    ..base.rows
                },
                ..base
            })
        })
    })
}

/// Random values in ±[0.1, 4), never zero, rounded to `dtype`.
fn random(n: usize, seed: u64, dtype: DType) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let m: f32 = rng.gen_range(0.1..4.0);
            dtype.round(if rng.gen_bool(0.5) { m } else { -m })
        })
        .collect()
}

/// Forward and backward of one case on the GPU against the reference.
fn check(
    d: &Device,
    shape: &[usize],
    log: bool,
    opts: SoftmaxOptions,
    dtype: DType,
    seed: u64,
) -> Result<(), String> {
    let len = *shape.last().unwrap();
    let n: usize = shape.iter().product();
    let causal = opts.causal.then(|| shape[shape.len() - 2]);
    let x = random(n, seed, dtype);
    let what = format!(
        "{} {dtype} {shape:?} {opts:?}",
        if log { "log_softmax" } else { "softmax" }
    );
    let tol = reference::softmax_tolerance(dtype);
    let xt = Tensor::from_slice_as(d, &x, shape, dtype).map_err(|e| e.to_string())?;
    let y = if log {
        xt.log_softmax_with(opts)
    } else {
        xt.softmax_with(opts)
    }
    .map_err(|e| format!("{what}: {e}"))?;
    let got = y.to_vec().map_err(|e| e.to_string())?;
    let want = reference::softmax(&x, len, causal, opts.scale, log);
    // Log-softmax errs by the rounding of the terms it subtracts (x·scale and the row's
    // log-sum-exp, below max|x·scale| + ln(len) + 1).
    let lse = 4.0 * opts.scale.abs() as f64 + (len as f64).ln() + 1.0;
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let mag = if log {
            w.abs() as f64 + 2.0 * lse
        } else {
            w.abs() as f64
        };
        if !reference::accepts(g, w, mag, tol) {
            return Err(format!("{what}: forward {i}: got {g}, want {w}"));
        }
    }
    // Backward from the reference output (rounded to the dtype) and a random gradient.
    let yr: Vec<f32> = want.iter().map(|&v| dtype.round(v)).collect();
    let dy = random(n, seed ^ 0x5eed, dtype);
    let yt = Tensor::from_slice_as(d, &yr, shape, dtype).map_err(|e| e.to_string())?;
    let dyt = Tensor::from_slice_as(d, &dy, shape, dtype).map_err(|e| e.to_string())?;
    let dx = if log {
        yt.log_softmax_backward(&dyt, opts)
    } else {
        yt.softmax_backward(&dyt, opts)
    }
    .and_then(|t| t.to_vec())
    .map_err(|e| format!("{what}: {e}"))?;
    let (want, mag) = reference::softmax_backward(&yr, &dy, len, causal, opts.scale, log);
    for (i, ((&g, &w), &m)) in dx.iter().zip(&want).zip(&mag).enumerate() {
        if !reference::accepts(g, w, m.max(w.abs() as f64), tol) {
            return Err(format!(
                "{what}: backward {i}: got {g}, want {w} (scale {m})"
            ));
        }
    }
    Ok(())
}

proptest! {
    // A fixed seed: the same cases (and kernels, cached after the first run) every time.
    #![proptest_config(ProptestConfig {
        cases: 40,
        rng_seed: RngSeed::Fixed(0x5e11),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_rows_match_reference(
        rows in 1usize..6,
        len in row_lengths(),
        log in any::<bool>(),
        causal in any::<bool>(),
        scale in prop_oneof![Just(1.0f32), 0.05f32..2.0],
        dtype in 0usize..3,
        config in 0usize..4,
        seed in any::<u64>(),
    ) {
        let d = &devices()[config];
        // Causal scores are (B, T, L): two blocks of `rows` rows.
        let shape = if causal { vec![2, rows, len] } else { vec![rows, len] };
        let opts = SoftmaxOptions { scale, causal };
        if let Err(e) = check(d, &shape, log, opts, DType::ALL[dtype], seed) {
            prop_assert!(false, "{}", e);
        }
        assert_clean(d);
    }
}

/// GPT-2's vocabulary: rows of 50257 (odd, far longer than a workgroup), and square causal
/// attention scores.
#[test]
fn long_rows_and_attention_scores() {
    for (i, d) in devices().iter().enumerate() {
        let dtype = DType::ALL[i % 3];
        check(
            d,
            &[3, 50257],
            i % 2 == 1,
            SoftmaxOptions::default(),
            dtype,
            1,
        )
        .unwrap();
        check(
            d,
            &[2, 3, 67, 67],
            i % 2 == 0,
            SoftmaxOptions::causal(0.125),
            dtype,
            2,
        )
        .unwrap();
        assert_clean(d);
    }
}

/// Streamed rows walk full slots unchecked and their partial edge slots apart: rows of every
/// length up to 13 back to back start at every offset within a slot, including rows inside a
/// single slot and rows of one full slot plus two edges.
#[test]
fn streamed_rows_at_every_alignment() {
    let d = &devices()[2];
    for len in 1..=13 {
        for (i, dtype) in DType::ALL.into_iter().enumerate() {
            for log in [false, true] {
                let opts = if len % 3 == 0 {
                    SoftmaxOptions::causal(0.5)
                } else {
                    SoftmaxOptions::default()
                };
                check(d, &[2, 5, len], log, opts, dtype, (len * 7 + i) as u64).unwrap();
            }
        }
    }
    assert_clean(d);
}

#[test]
fn nan_rows_and_fully_masked_rows() {
    let nan = f32::NAN;
    let ninf = f32::NEG_INFINITY;
    for d in devices() {
        for len in [5usize, 9000] {
            let mut x = vec![0.5f32; 3 * len];
            x[len / 2] = nan; // row 0 holds a NaN
            for v in &mut x[len..2 * len] {
                *v = ninf; // row 1 is fully masked
            }
            x[2 * len + 1] = ninf; // row 2: one -inf entry
            let t = Tensor::from_slice(d, &x, &[3, len]).unwrap();
            let y = t.softmax().unwrap().to_vec().unwrap();
            assert!(y[..len].iter().all(|v| v.is_nan()), "NaN in, NaN out");
            assert!(
                y[len..2 * len].iter().all(|&v| v == 0.0),
                "fully masked row gives zeros"
            );
            assert_eq!(y[2 * len + 1], 0.0);
            let expect = 1.0 / (len - 1) as f32;
            assert!((y[2 * len] - expect).abs() < 1e-6);
            let l = t.log_softmax().unwrap().to_vec().unwrap();
            assert!(l[..len].iter().all(|v| v.is_nan()));
            assert!(l[len..2 * len].iter().all(|&v| v == ninf));
            assert_eq!(l[2 * len + 1], ninf);
            // Gradients of a fully masked softmax row are zero, not NaN.
            let y = t.softmax().unwrap();
            let dy = Tensor::from_slice(d, &vec![1.0; 3 * len], &[3, len]).unwrap();
            let dx = y
                .softmax_backward(&dy, SoftmaxOptions::default())
                .unwrap()
                .to_vec()
                .unwrap();
            assert!(dx[len..2 * len].iter().all(|&v| v == 0.0));
        }
        // Causal: row 0 of each matrix sees column 0 only.
        let t = Tensor::from_slice(d, &[1.0; 8], &[2, 2, 2]).unwrap();
        let y = t
            .softmax_with(SoftmaxOptions::causal(1.0))
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(y, vec![1.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.5, 0.5]);
        assert_clean(d);
    }
}

#[test]
fn bad_operands_are_errors() {
    let d = &devices()[0];
    let v = Tensor::from_slice(d, &[1.0, 2.0, 3.0], &[3]).unwrap();
    assert!(matches!(
        v.softmax_with(SoftmaxOptions::causal(1.0)),
        Err(Error::Invalid { .. })
    ));
    let s = Tensor::from_slice(d, &[1.0], &[]).unwrap();
    assert!(matches!(s.softmax(), Err(Error::Invalid { .. })));
    let w = Tensor::from_slice(d, &[1.0, 2.0], &[2]).unwrap();
    assert!(matches!(
        v.softmax_backward(&w, SoftmaxOptions::default()),
        Err(Error::ShapeMismatch { .. })
    ));
    let h = Tensor::from_slice_as(d, &[1.0, 2.0, 3.0], &[3], DType::F16).unwrap();
    assert!(matches!(
        v.log_softmax_backward(&h, SoftmaxOptions::default()),
        Err(Error::DTypeMismatch { .. })
    ));
    // Empty tensors need no work.
    let e = Tensor::from_slice(d, &[], &[0, 4]).unwrap();
    assert_eq!(e.softmax().unwrap().shape(), &[0, 4]);
    assert_clean(d);
}

/// A narrowed, offset view is normalized as the values it shows.
#[test]
fn views_are_normalized_as_their_values() {
    let d = &devices()[0];
    let host = random(3 * 8, 5, DType::F32);
    let x = Tensor::from_slice(d, &host, &[3, 8]).unwrap();
    let v = x.narrow(1, 3, 5).unwrap(); // (3, 5), offset 3
    let vh: Vec<f32> = (0..3)
        .flat_map(|r| host[r * 8 + 3..r * 8 + 8].to_vec())
        .collect();
    let got = v.softmax().unwrap().to_vec().unwrap();
    let want = reference::softmax(&vh, 5, None, 1.0, false);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
    let dy = x.narrow(1, 0, 5).unwrap();
    let dyh: Vec<f32> = (0..3)
        .flat_map(|r| host[r * 8..r * 8 + 5].to_vec())
        .collect();
    let y = Tensor::from_slice(d, &want, &[3, 5]).unwrap();
    let dx = y
        .softmax_backward(&dy, SoftmaxOptions::default())
        .unwrap()
        .to_vec()
        .unwrap();
    let (wdx, _) = reference::softmax_backward(&want, &dyh, 5, None, 1.0, false);
    for (g, w) in dx.iter().zip(&wdx) {
        assert!((g - w).abs() < 1e-5, "{dx:?} vs {wdx:?}");
    }
    assert_clean(d);
}
