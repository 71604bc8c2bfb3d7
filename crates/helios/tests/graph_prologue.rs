//! Reductions that compute a pending element-wise group in their loads (the lazy graph's
//! reduction prologue): each reduction gives the values of the same reduction over the
//! group realised first, in f32, f16 and bf16, including groups too large for one kernel's
//! push constants.

mod common;

use common::graph::{program, round};
use common::{assert_no_validation_messages, device, LockExt};
use helios::{graph_stats, DType, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Serialises the tests: the scheduler's counters are process-wide.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The reductions a prologue test runs on an (R, C) tensor, by name.
fn reductions(t: &Tensor) -> Vec<(&'static str, Tensor)> {
    vec![
        ("sum(0)", t.sum(0).unwrap()),
        ("sum(1)", t.sum(1).unwrap()),
        ("sum_all", t.sum_all().unwrap()),
        ("mean(1)", t.mean(1).unwrap()),
        ("max(0)", t.max(0).unwrap()),
        ("min_all", t.min_all().unwrap()),
    ]
}

/// `f()` reduced three ways: with the pending result as the reduction's prologue (no one
/// else holds it); again with a second handle on it, so that the reduction's first step
/// also stores it; and after realising it by its own kernel. A prologue computes the same
/// rounded values a store would hold and the plans are the same, so the three results agree
/// bit for bit, and so do the stored values and the realised ones. Each of the first two is
/// one prologue and no fused kernel; the third, a fused kernel and no prologue.
#[track_caller]
fn prologue_matches_stored(what: &str, f: &dyn Fn() -> Tensor) {
    let names: Vec<&str> = reductions(&f()).into_iter().map(|(n, _)| n).collect();
    let bits =
        |t: &Tensor| -> Vec<u32> { t.to_vec().unwrap().iter().map(|x| x.to_bits()).collect() };
    for (i, name) in names.iter().enumerate() {
        let count = |reduce: &dyn Fn() -> Tensor| {
            let before = graph_stats();
            let r = reduce();
            let after = graph_stats();
            (
                r,
                after.prologues - before.prologues,
                after.kernels - before.kernels,
            )
        };
        let (sole, sole_pro, sole_kernels) = count(&|| reductions_one(f(), i));
        let kept = std::cell::RefCell::new(None);
        let (held, held_pro, held_kernels) = count(&|| {
            let t = f();
            *kept.borrow_mut() = Some(t.clone());
            reductions_one(t, i)
        });
        let kept = kept.into_inner().expect("kept");
        let realised = f();
        realised.realize().unwrap();
        let (apart, apart_pro, _) = count(&|| reductions_one(realised.clone(), i));
        assert_eq!(
            (sole_pro, sole_kernels),
            (1, 0),
            "{what} {name}: sole prologue"
        );
        assert_eq!(
            (held_pro, held_kernels),
            (1, 0),
            "{what} {name}: held prologue"
        );
        assert_eq!(apart_pro, 0, "{what} {name}: a realised tensor is read");
        assert!(
            kept.is_realized(),
            "{what} {name}: the held result is stored"
        );
        assert_eq!(
            bits(&kept),
            bits(&realised),
            "{what} {name}: the stored values are the realised ones"
        );
        let (s, h, a) = (bits(&sole), bits(&held), bits(&apart));
        assert!(
            s == h && h == a,
            "{what} {name}: sole {:?} held {:?} apart {:?}",
            sole.to_vec().unwrap(),
            held.to_vec().unwrap(),
            apart.to_vec().unwrap()
        );
    }
}

fn reductions_one(t: Tensor, i: usize) -> Tensor {
    // Only this reduction may see `t` (the others would hold it).
    let pick = |t: &Tensor| match i {
        0 => t.sum(0),
        1 => t.sum(1),
        2 => t.sum_all(),
        3 => t.mean(1),
        4 => t.max(0),
        _ => t.min_all(),
    };
    let r = pick(&t).unwrap();
    drop(t);
    r
}

#[test]
fn reductions_compute_a_pending_group_in_their_loads() {
    let _l = LOCK.locked();
    // Random programs on 6×6 (one element per evaluation), every dtype, checked against
    // the CPU too.
    for dtype in DType::ALL {
        let tol = match dtype {
            DType::F32 => 1e-4,
            DType::F16 => 0.3,
            DType::BF16 => 0.6,
        };
        for seed in [3u64, 11, 17] {
            let ops = 8 + seed as usize;
            let last = || program(seed, dtype, ops, false).pop().unwrap();
            prologue_matches_stored(&format!("{dtype:?} seed {seed}"), &|| last().t);
            let v = last();
            let want: f64 = v.r.iter().map(|&x| round(x, dtype)).sum();
            let got = v.t.sum_all().unwrap().to_vec().unwrap()[0] as f64;
            assert!(
                (got - want).abs() <= tol,
                "{dtype:?} seed {seed}: sum {got}, CPU {want}"
            );
        }
    }
    // Vectorizable groups (a broadcast bias, rows a multiple of 4) in the row and column
    // layouts, and long enough to split into partials.
    let d = device();
    let data = |n: usize, seed: u64| -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
    };
    for (rows, cols) in [(64, 256), (1024, 1024), (4096, 64), (33, 12)] {
        let x = Tensor::from_slice(d, &data(rows * cols, 1), &[rows, cols]).unwrap();
        let b = Tensor::from_slice(d, &data(cols, 2), &[cols]).unwrap();
        let xb = x.to_dtype(DType::BF16).unwrap();
        xb.realize().unwrap();
        let f32_group = || {
            x.add(&b)
                .unwrap()
                .gelu_tanh()
                .unwrap()
                .mul(&x)
                .unwrap()
                .mul_scalar(0.5)
                .unwrap()
        };
        prologue_matches_stored(&format!("f32 {rows}x{cols}"), &f32_group);
        // A cast up and a square: the gradient-norm pattern.
        let square = || {
            let g = xb.to_dtype(DType::F32).unwrap();
            g.mul(&g).unwrap()
        };
        prologue_matches_stored(&format!("bf16 squares {rows}x{cols}"), &square);
        let xh = x.to_dtype(DType::F16).unwrap();
        xh.realize().unwrap();
        let square_h = || {
            let g = xh.to_dtype(DType::F32).unwrap();
            g.mul(&g).unwrap()
        };
        prologue_matches_stored(&format!("f16 squares {rows}x{cols}"), &square_h);
    }
    assert_no_validation_messages();
}

/// `var` and `var_all` of a stored tensor compute the deviations and their squares in the
/// second mean's loads: one prologue each and no fused kernel (while `var` held the
/// deviations in a local, they and the squares were one fused kernel storing both), and
/// the values match the f64 CPU reference (f32, |got − want| ≤ 1e-5 relative).
#[test]
fn variance_squares_its_deviations_in_the_means_loads() {
    let _l = LOCK.locked();
    let d = device();
    let (rows, cols) = (37, 300);
    let mut rng = StdRng::seed_from_u64(29);
    let v: Vec<f32> = (0..rows * cols)
        .map(|_| rng.gen_range(-2.0f32..3.0))
        .collect();
    let x = Tensor::from_slice(d, &v, &[rows, cols]).unwrap();
    x.realize().unwrap();
    let var = |xs: &mut dyn Iterator<Item = f64>| {
        let xs: Vec<f64> = xs.collect();
        let m = xs.iter().sum::<f64>() / xs.len() as f64;
        xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64
    };
    let at = |i: usize, j: usize| f64::from(v[i * cols + j]);
    let cases = [
        (
            "var(1)",
            (0..rows)
                .map(|i| var(&mut (0..cols).map(|j| at(i, j))))
                .collect::<Vec<_>>(),
        ),
        (
            "var(0)",
            (0..cols)
                .map(|j| var(&mut (0..rows).map(|i| at(i, j))))
                .collect(),
        ),
        ("var_all", vec![var(&mut v.iter().map(|&a| f64::from(a)))]),
    ];
    for (name, want) in cases {
        let before = graph_stats();
        let got = match name {
            "var(1)" => x.var(1),
            "var(0)" => x.var(0),
            _ => x.var_all(),
        }
        .unwrap();
        let after = graph_stats();
        assert_eq!(
            after.prologues - before.prologues,
            1,
            "{name}: one prologue"
        );
        assert_eq!(after.kernels, before.kernels, "{name}: no fused kernel");
        let got = got.to_vec().unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let err = (f64::from(g) - w).abs() / w.abs().max(1e-6);
            assert!(
                err <= 1e-5,
                "{name}[{k}]: {g}, CPU {w} (relative error {err:.2e})"
            );
        }
    }
    assert_no_validation_messages();
}

/// A reduction whose pending group reads more tensors than the reduction's push constants
/// can address (8 bytes each, 40 here) still gives the exact sum: the group is realised
/// apart first.
#[test]
fn a_reduction_of_a_group_with_many_inputs() {
    let _l = LOCK.locked();
    let d = device();
    let n = 40;
    let parts: Vec<Tensor> = (0..n)
        .map(|i| Tensor::from_slice(d, &[i as f32, 1.0, 2.0, 0.5], &[4]).unwrap())
        .collect();
    let mut sum = parts[0].clone();
    for p in &parts[1..] {
        sum = sum.add(p).unwrap();
    }
    let total = sum.sum_all().unwrap().to_vec().unwrap()[0];
    let want = (0..n).map(|i| i as f32 + 3.5).sum::<f32>();
    assert_eq!(total, want);
    assert_no_validation_messages();
}
