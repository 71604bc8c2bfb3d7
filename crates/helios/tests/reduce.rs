//! Reductions on the Vulkan device present (lavapipe in CI) against the f64 CPU reference:
//! property tests over random shapes, axes, ops and dtypes, on both the subgroup and the
//! shared-memory paths; the two-phase (split) plans; NaN and infinity semantics; empty axes
//! and bad axes as errors. Inputs are random and never zero. Every test fails on any
//! validation message (run with `HELIOS_VALIDATION=1`).

use std::sync::OnceLock;

mod common;

use common::{assert_clean, device_with};
use helios::{cpu, DType, Device, Error, KernelConfig, Reduction, Tensor};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Two devices in one process: subgroup operations on (where the device has them) and off.
fn devices() -> &'static [Device; 2] {
    static DEVICES: OnceLock<[Device; 2]> = OnceLock::new();
    DEVICES.get_or_init(|| {
        [true, false].map(|subgroups| device_with(|base| KernelConfig { subgroups, ..base }))
    })
}

/// Random values in ±[0.1, 2), never zero, rounded to `dtype`.
fn random(n: usize, seed: u64, dtype: DType) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let m: f32 = rng.gen_range(0.1..2.0);
            let v = if rng.gen_bool(0.5) { m } else { -m };
            dtype.round(v)
        })
        .collect()
}

/// Runs `op` on the GPU and compares with the reference; Err describes the first mismatch.
fn check(
    d: &Device,
    op: Reduction,
    dtype: DType,
    x: &[f32],
    shape: &[usize],
    axis: Option<usize>,
) -> Result<(), String> {
    let t = Tensor::from_slice_as(d, x, shape, dtype).map_err(|e| e.to_string())?;
    let (want, want_idx) = cpu::reduce::reduce(op, x, shape, axis);
    let ax = axis.map(|a| a as isize);
    let what = format!("{op:?} {dtype} shape {shape:?} axis {axis:?}");
    if op == Reduction::ArgMax {
        let got = match ax {
            Some(a) => t.argmax(a),
            None => t.argmax_all(),
        }
        .and_then(|i| i.to_vec())
        .map_err(|e| format!("{what}: {e}"))?;
        if got != want_idx {
            let i = got
                .iter()
                .zip(&want_idx)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(format!(
                "{what}: index {i}: got {:?}, want {:?}",
                got.get(i),
                want_idx.get(i)
            ));
        }
        return Ok(());
    }
    let got = t
        .reduce(op, ax)
        .and_then(|y| y.to_vec())
        .map_err(|e| format!("{what}: {e}"))?;
    let sums = cpu::reduce::abs_sums(x, shape, axis);
    let n = match axis {
        Some(a) => shape[a],
        None => x.len(),
    };
    for (i, ((&g, &w), &s)) in got.iter().zip(&want).zip(&sums).enumerate() {
        if !cpu::reduce::reduce_accepts(op, dtype, g, w, s, n) {
            return Err(format!("{what}: output {i}: got {g}, want {w}"));
        }
    }
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} outputs, want {}",
            got.len(),
            want.len()
        ));
    }
    Ok(())
}

const OPS: [Reduction; 5] = Reduction::ALL;

proptest! {
    // A fixed seed: the same cases (and kernels, cached after the first run) every time.
    #![proptest_config(ProptestConfig {
        cases: 48,
        rng_seed: RngSeed::Fixed(0x4ed0),
        ..ProptestConfig::default()
    })]

    /// Random shapes of 1 to 3 dimensions (odd sizes included), every axis and the whole
    /// tensor, every op and dtype, both reducers.
    #[test]
    fn random_shapes_match_reference(
        dims in prop::collection::vec(1usize..70, 1..4),
        axis_pick in 0usize..4,
        op in 0usize..5,
        dtype in 0usize..3,
        path in 0usize..2,
        seed in any::<u64>(),
    ) {
        let d = &devices()[path];
        let dtype = DType::ALL[dtype];
        let axis = (axis_pick < dims.len()).then_some(axis_pick);
        let n: usize = dims.iter().product();
        let x = random(n, seed, dtype);
        if let Err(e) = check(d, OPS[op], dtype, &x, &dims, axis) {
            prop_assert!(false, "{}", e);
        }
        assert_clean(d);
    }
}

/// Rows longer than a workgroup's worth of loads, few rows (split into chunks, then
/// combined), a long middle axis over 3 columns (split), and the full reduction of a few
/// million elements, on both reducers.
#[test]
fn split_plans_match_reference() {
    let cases: [(&[usize], Option<usize>); 5] = [
        (&[3, 70_001], Some(1)),
        (&[2, 50_001, 3], Some(1)),
        (&[2, 4099, 8], Some(1)),
        (&[400_009], None),
        (&[517, 1031], None),
    ];
    for (p, d) in devices().iter().enumerate() {
        for (i, &(shape, axis)) in cases.iter().enumerate() {
            let n: usize = shape.iter().product();
            let dtype = DType::ALL[(i + p) % 3];
            let x = random(n, 100 + i as u64, dtype);
            for op in OPS {
                check(d, op, dtype, &x, shape, axis).unwrap();
            }
        }
        assert_clean(d);
    }
}

#[test]
fn nan_and_infinities() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    for d in devices() {
        let x = Tensor::from_slice(
            d,
            &[
                1.0, nan, 3.0, nan, -inf, -inf, -inf, -inf, 2.0, 5.0, 5.0, -1.0,
            ],
            &[3, 4],
        )
        .unwrap();
        let max = x.max(-1).unwrap().to_vec().unwrap();
        assert!(
            max[0].is_nan() && max[1] == -inf && max[2] == 5.0,
            "{max:?}"
        );
        let min = x.min(1).unwrap().to_vec().unwrap();
        assert!(
            min[0].is_nan() && min[1] == -inf && min[2] == -1.0,
            "{min:?}"
        );
        let sum = x.sum(1).unwrap().to_vec().unwrap();
        assert!(
            sum[0].is_nan() && sum[1] == -inf && sum[2] == 11.0,
            "{sum:?}"
        );
        // First NaN index; all -inf gives index 0; ties give the first maximum.
        assert_eq!(x.argmax(-1).unwrap().to_vec().unwrap(), vec![1, 0, 1]);
        assert!(x.max_all().unwrap().to_vec().unwrap()[0].is_nan());
        assert_eq!(x.argmax_all().unwrap().to_vec().unwrap(), vec![1]);
        let y = Tensor::from_slice(d, &[inf, -inf, 1.0], &[3]).unwrap();
        assert!(
            y.sum_all().unwrap().to_vec().unwrap()[0].is_nan(),
            "inf + -inf is NaN"
        );
        assert_eq!(y.max_all().unwrap().to_vec().unwrap(), vec![inf]);
        // A NaN far into a long row, past the first chunk of a split.
        let mut long = random(300_001, 9, DType::F32);
        long[250_000] = nan;
        let t = Tensor::from_slice(d, &long, &[long.len()]).unwrap();
        assert!(t.sum_all().unwrap().to_vec().unwrap()[0].is_nan());
        assert!(t.min_all().unwrap().to_vec().unwrap()[0].is_nan());
        assert_eq!(t.argmax_all().unwrap().to_vec().unwrap(), vec![250_000]);
        assert_clean(d);
    }
}

#[test]
fn shapes_empty_axes_and_errors() {
    let d = &devices()[0];
    let x = Tensor::from_slice(d, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let s = x.sum(0).unwrap();
    assert_eq!(s.shape(), &[3]);
    assert_eq!(s.to_vec().unwrap(), vec![5.0, 7.0, 9.0]);
    assert_eq!(x.mean(-1).unwrap().to_vec().unwrap(), vec![2.0, 5.0]);
    let all = x.sum_all().unwrap();
    assert_eq!(all.shape(), &[] as &[usize]);
    assert_eq!(all.to_vec().unwrap(), vec![21.0]);
    assert_eq!(x.argmax(0).unwrap().shape(), &[3]);
    assert!(matches!(
        x.sum(2),
        Err(Error::Axis {
            axis: 2,
            ndim: 2,
            ..
        })
    ));
    assert!(matches!(x.max(-3), Err(Error::Axis { .. })));
    assert!(matches!(
        x.reduce(Reduction::ArgMax, None),
        Err(Error::Invalid { .. })
    ));
    // An empty axis: sum 0, mean NaN, max an error; an empty result needs no work.
    let e = Tensor::from_slice(d, &[], &[2, 0]).unwrap();
    assert_eq!(e.sum(1).unwrap().to_vec().unwrap(), vec![0.0, 0.0]);
    assert!(e
        .mean(1)
        .unwrap()
        .to_vec()
        .unwrap()
        .iter()
        .all(|v| v.is_nan()));
    assert!(matches!(e.max(1), Err(Error::EmptyReduction { .. })));
    assert!(matches!(e.argmax(1), Err(Error::EmptyReduction { .. })));
    assert_eq!(e.sum(0).unwrap().shape(), &[0]);
    assert_clean(d);
}

/// Views (transposed, narrowed) are reduced as the values they show.
#[test]
fn views_reduce_as_their_values() {
    let d = &devices()[0];
    let host = random(4 * 6, 77, DType::F32);
    let x = Tensor::from_slice(d, &host, &[4, 6]).unwrap();
    let t = x.transpose(0, 1).unwrap(); // (6, 4)
    let th: Vec<f32> = (0..6)
        .flat_map(|i| (0..4).map(move |j| (i, j)))
        .map(|(i, j)| host[j * 6 + i])
        .collect();
    check(d, Reduction::Sum, DType::F32, &th, &[6, 4], Some(1)).unwrap();
    let got = t.sum(-1).unwrap().to_vec().unwrap();
    let (want, _) = cpu::reduce::reduce(Reduction::Sum, &th, &[6, 4], Some(1));
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
    }
    let am = t.argmax(0).unwrap().to_vec().unwrap();
    assert_eq!(
        am,
        cpu::reduce::reduce(Reduction::ArgMax, &th, &[6, 4], Some(0)).1
    );
    let n = x.narrow(1, 2, 3).unwrap(); // (4, 3), offset 2
    let nh: Vec<f32> = (0..4)
        .flat_map(|r| host[r * 6 + 2..r * 6 + 5].to_vec())
        .collect();
    let mx = n.max_all().unwrap().to_vec().unwrap();
    assert_eq!(mx[0], nh.iter().cloned().fold(f32::NEG_INFINITY, f32::max));
    assert_clean(d);
}
