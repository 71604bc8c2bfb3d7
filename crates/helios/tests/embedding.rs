//! Embedding lookup and its backward on the Vulkan device present (lavapipe in CI) against
//! the f64 CPU reference: random shapes (odd widths use scalar accesses, widths divisible by
//! 4 use vec4), every storage dtype, heavy duplicates, one id everywhere, NaN gradients,
//! ids made on the device, determinism bit for bit, and errors for bad arguments. Run with
//! `HELIOS_VALIDATION=1`; every test fails on any validation message.
//!
//! Tolerances: the forward is a copy and must match bit for bit. The backward sums k terms
//! in f32 in a fixed order: |got − want| ≤ k·2^-23·Σ|terms| (the classic bound), plus one
//! rounding of the result to the storage dtype (2^-11 relative for f16, 2^-8 for bf16) and
//! 1e-7 absolute for f16 subnormals.

use helios::{cpu, DType, Error, IndexTensor, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::{assert_no_validation_messages, device};

/// Values in ±[0.1, 2) (never zero), rounded to `dtype`.
fn random(rng: &mut StdRng, n: usize, dtype: DType) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v: f32 = rng.gen_range(0.1..2.0);
            dtype.round(if rng.gen_bool(0.5) { v } else { -v })
        })
        .collect()
}

fn ids(v: &[u32]) -> IndexTensor {
    IndexTensor::from_slice(device(), v, &[v.len()]).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Checks a backward result against the reference with the bound of the module docs.
#[track_caller]
fn check_backward(
    what: &str,
    dtype: DType,
    got: &[f32],
    dout: &[f32],
    dim: usize,
    id: &[u32],
    vocab: usize,
) {
    let (want, abs) = cpu::embedding_backward(dout, dim, id, vocab);
    let mut k = vec![0usize; vocab];
    for &i in id {
        if (i as usize) < vocab {
            k[i as usize] += 1;
        }
    }
    let stored = match dtype {
        DType::F32 => 0.0,
        DType::F16 => 1.0 / 2048.0,
        DType::BF16 => 1.0 / 256.0,
    };
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (e, ((&g, &w), &a)) in got.iter().zip(&want).zip(&abs).enumerate() {
        let row = e / dim.max(1);
        let bound = k[row] as f32 * f32::EPSILON * a + stored * w.abs() + 1e-7;
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= bound;
        assert!(
            ok,
            "{what}: element {e} (row {row}, {} terms): got {g}, want {w}",
            k[row]
        );
    }
}

#[test]
fn forward_is_an_exact_gather() {
    let mut rng = StdRng::seed_from_u64(21);
    for &(vocab, dim) in &[
        (1usize, 1usize),
        (7, 3),
        (50, 4),
        (33, 12),
        (300, 65),
        (20, 768),
    ] {
        for dtype in DType::ALL {
            let n = rng.gen_range(1..40);
            let table = random(&mut rng, vocab * dim, dtype);
            let id: Vec<u32> = (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect();
            let t = Tensor::from_slice_as(device(), &table, &[vocab, dim], dtype).unwrap();
            // Ids of shape (2, n) as a batch of sequences.
            let both: Vec<u32> = id.iter().chain(&id).cloned().collect();
            let x = IndexTensor::from_slice(device(), &both, &[2, n]).unwrap();
            let out = t.embedding(&x).unwrap();
            assert_eq!(out.shape(), &[2, n, dim]);
            assert_eq!(out.dtype(), dtype);
            let want = cpu::embedding(&table, dim, &both);
            assert_eq!(
                bits(&out.to_vec().unwrap()),
                bits(&want),
                "{vocab}x{dim} {dtype}"
            );
        }
    }
    assert_no_validation_messages();
}

#[test]
fn backward_matches_reference() {
    let mut rng = StdRng::seed_from_u64(22);
    for &(vocab, dim, n) in &[
        (1usize, 1usize, 5usize),
        (5, 3, 17),
        (64, 4, 300),
        (100, 12, 257),
        (1000, 33, 100),
        (50, 768, 64),
        // Several blocks of the scan.
        (3000, 5, 400),
    ] {
        for dtype in DType::ALL {
            // Ids from a small range: many duplicates; some vocabulary rows unused.
            let used = rng.gen_range(1..=vocab) as u32;
            let id: Vec<u32> = (0..n).map(|_| rng.gen_range(0..used)).collect();
            let dout = random(&mut rng, n * dim, dtype);
            let g = Tensor::from_slice_as(device(), &dout, &[n, dim], dtype).unwrap();
            let dt = g.embedding_backward(&ids(&id), vocab).unwrap();
            assert_eq!(dt.shape(), &[vocab, dim]);
            assert_eq!(dt.dtype(), dtype);
            let what = format!("{vocab}x{dim} n={n} {dtype}");
            check_backward(&what, dtype, &dt.to_vec().unwrap(), &dout, dim, &id, vocab);
        }
    }
    assert_no_validation_messages();
}

#[test]
fn backward_is_deterministic_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(23);
    let (vocab, dim, n) = (97, 20, 3000);
    // Zipf-like: a few ids take most positions, as in natural text.
    let id: Vec<u32> = (0..n)
        .map(|_| {
            let r: f64 = rng.gen_range(0.0..1.0);
            ((r * r * r) * vocab as f64) as u32
        })
        .collect();
    let dout = random(&mut rng, n * dim, DType::F32);
    let g = Tensor::from_slice(device(), &dout, &[n, dim]).unwrap();
    let x = ids(&id);
    let a = g.embedding_backward(&x, vocab).unwrap().to_vec().unwrap();
    let b = g.embedding_backward(&x, vocab).unwrap().to_vec().unwrap();
    assert_eq!(bits(&a), bits(&b));
    check_backward("zipf", DType::F32, &a, &dout, dim, &id, vocab);

    // One id at every position: a single list of n entries.
    let same = vec![5u32; n];
    let a = g
        .embedding_backward(&ids(&same), vocab)
        .unwrap()
        .to_vec()
        .unwrap();
    let b = g
        .embedding_backward(&ids(&same), vocab)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(bits(&a), bits(&b));
    check_backward("one id", DType::F32, &a, &dout, dim, &same, vocab);
    // f32 summation in position order, exactly as the host does it.
    for c in 0..dim {
        let seq = (0..n).fold(0.0f32, |acc, i| acc + dout[i * dim + c]);
        assert_eq!(a[5 * dim + c].to_bits(), seq.to_bits(), "column {c}");
    }
    assert_no_validation_messages();
}

/// Every row of f32 sums, in position order, one f32 addition at a time from 0.
fn sequential(dout: &[f32], dim: usize, id: &[u32], vocab: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; vocab * dim];
    for (i, &v) in id.iter().enumerate() {
        for c in 0..dim {
            out[v as usize * dim + c] += dout[i * dim + c];
        }
    }
    out
}

/// Long lists (natural text's frequent tokens) in rows of one to several walks, and GPT-2's
/// vocabulary for the scan: each row is the position-order f32 sum, bit for bit, however the
/// kernels batch their loads.
#[test]
fn backward_of_long_lists_sums_in_position_order() {
    let mut rng = StdRng::seed_from_u64(24);
    for &(vocab, dim, n) in &[
        (50257usize, 8usize, 5000usize),
        (300, 768, 700),
        (40, 1028, 300),
        (25, 1101, 260),
        (9, 4100, 60),
    ] {
        let id: Vec<u32> = (0..n)
            .map(|_| {
                let r: f64 = rng.gen_range(0.0..1.0);
                ((r * r * r * r) * vocab as f64) as u32
            })
            .collect();
        let dout = random(&mut rng, n * dim, DType::F32);
        let g = Tensor::from_slice(device(), &dout, &[n, dim]).unwrap();
        let got = g
            .embedding_backward(&ids(&id), vocab)
            .unwrap()
            .to_vec()
            .unwrap();
        let want = sequential(&dout, dim, &id, vocab);
        assert_eq!(bits(&got), bits(&want), "{vocab}x{dim} n={n}");
        // The same rows in 16-bit storage, within the stated bound.
        for dtype in [DType::BF16, DType::F16] {
            let g = Tensor::from_slice_as(device(), &dout, &[n, dim], dtype).unwrap();
            let stored = g.to_vec().unwrap();
            let got = g
                .embedding_backward(&ids(&id), vocab)
                .unwrap()
                .to_vec()
                .unwrap();
            let what = format!("{vocab}x{dim} n={n} {dtype}");
            check_backward(&what, dtype, &got, &stored, dim, &id, vocab);
        }
    }
    assert_no_validation_messages();
}

#[test]
fn nan_gradients_and_device_ids() {
    let d = device();
    let (vocab, dim) = (6, 4);
    let id = [1u32, 3, 1, 4];
    let mut dout = vec![0.5f32; id.len() * dim];
    dout[2 * dim + 1] = f32::NAN; // position 2 (id 1), column 1
    let g = Tensor::from_slice(d, &dout, &[id.len(), dim]).unwrap();
    let dt = g
        .embedding_backward(&ids(&id), vocab)
        .unwrap()
        .to_vec()
        .unwrap();
    for (e, v) in dt.iter().enumerate() {
        let nan = e == dim + 1;
        assert_eq!(v.is_nan(), nan, "element {e}: {v}");
    }

    // Ids made on the device (argmax over 8 classes) against a 5-row table: ids 5..8 give NaN
    // rows forward and nothing backward.
    let scores: Vec<f32> = (0..8 * 8).map(|i| ((i * 37) % 64) as f32 + 0.5).collect();
    let s = Tensor::from_slice(d, &scores, &[8, 8]).unwrap();
    let dev_ids = s.argmax(1).unwrap();
    let host_ids = dev_ids.to_vec().unwrap();
    assert!(host_ids.iter().any(|&i| i >= 5) && host_ids.iter().any(|&i| i < 5));
    let table: Vec<f32> = (0..5 * dim).map(|i| i as f32 + 1.0).collect();
    let t = Tensor::from_slice(d, &table, &[5, dim]).unwrap();
    let out = t.embedding(&dev_ids).unwrap().to_vec().unwrap();
    assert_eq!(bits(&out), bits(&cpu::embedding(&table, dim, &host_ids)));
    let g = Tensor::from_slice(d, &vec![1.0; 8 * dim], &[8, dim]).unwrap();
    let dt = g.embedding_backward(&dev_ids, 5).unwrap().to_vec().unwrap();
    let (want, _) = cpu::embedding_backward(&vec![1.0; 8 * dim], dim, &host_ids, 5);
    assert_eq!(dt, want);
    assert_no_validation_messages();
}

#[test]
fn bad_arguments_are_errors() {
    let d = device();
    let t = Tensor::from_slice(d, &[1.0; 12], &[3, 4]).unwrap();
    match t.embedding(&ids(&[0, 3, 1])) {
        Err(Error::IndexOutOfRange {
            at: 1,
            value: 3,
            bound: 3,
            ..
        }) => {}
        other => panic!("expected an out-of-range error, got {other:?}"),
    }
    let flat = Tensor::from_slice(d, &[1.0; 12], &[12]).unwrap();
    assert!(matches!(
        flat.embedding(&ids(&[0])),
        Err(Error::Invalid { .. })
    ));
    let g = Tensor::from_slice(d, &[1.0; 8], &[2, 4]).unwrap();
    assert!(matches!(
        g.embedding_backward(&ids(&[0, 1, 2]), 5),
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        g.embedding_backward(&ids(&[0, 9]), 5),
        Err(Error::IndexOutOfRange { value: 9, .. })
    ));
    // Empty cases are not errors.
    let none = t.embedding(&ids(&[])).unwrap();
    assert_eq!(none.shape(), &[0, 4]);
    let e = Tensor::from_slice(d, &[], &[0, 4]).unwrap();
    let z = e.embedding_backward(&ids(&[]), 3).unwrap();
    assert_eq!(z.to_vec().unwrap(), vec![0.0; 12]);
    assert_no_validation_messages();
}

/// `embedding_backward_add`: each used row is the base row (as f32) plus the `dout` rows in
/// position order, one f32 addition at a time, rounded once to the base's dtype; unused rows
/// keep the base's bits. A base that is the only reference to its array is updated in
/// place; one that is shared is left as it was, and the result has the same bits.
#[test]
fn backward_adds_into_a_base_with_the_same_bits_in_place_or_not() {
    let mut rng = StdRng::seed_from_u64(25);
    for &(vocab, dim, n) in &[(50usize, 12usize, 90usize), (300, 768, 700), (9, 1101, 60)] {
        for (dd, bd) in [
            (DType::F32, DType::F32),
            (DType::BF16, DType::F32),
            (DType::BF16, DType::BF16),
            (DType::F16, DType::F16),
        ] {
            let id: Vec<u32> = (0..n)
                .map(|_| {
                    let r: f64 = rng.gen_range(0.0..1.0);
                    ((r * r * r) * vocab as f64) as u32
                })
                .collect();
            let dout = random(&mut rng, n * dim, dd);
            let base = random(&mut rng, vocab * dim, bd);
            let mut want = base.clone();
            let mut used = vec![false; vocab];
            for (i, &v) in id.iter().enumerate() {
                used[v as usize] = true;
                for c in 0..dim {
                    want[v as usize * dim + c] += dout[i * dim + c];
                }
            }
            let want: Vec<f32> = want.iter().map(|&x| bd.round(x)).collect();
            let what = format!("{vocab}x{dim} n={n} dout {dd} base {bd}");
            let g = Tensor::from_slice_as(device(), &dout, &[n, dim], dd).unwrap();
            let x = ids(&id);

            let own = Tensor::from_slice_as(device(), &base, &[vocab, dim], bd).unwrap();
            let in_place = g.embedding_backward_add(&x, own).unwrap();
            assert_eq!(in_place.dtype(), bd, "{what}");
            let in_place = in_place.to_vec().unwrap();

            let shared = Tensor::from_slice_as(device(), &base, &[vocab, dim], bd).unwrap();
            let out = g.embedding_backward_add(&x, shared.clone()).unwrap();
            assert_eq!(
                bits(&shared.to_vec().unwrap()),
                bits(&base),
                "{what}: base kept"
            );
            assert_eq!(
                bits(&out.to_vec().unwrap()),
                bits(&in_place),
                "{what}: same bits"
            );

            for (e, (&got, &w)) in in_place.iter().zip(&want).enumerate() {
                let row = e / dim;
                let ok = match (used[row], bd) {
                    (false, _) => got.to_bits() == base[e].to_bits(),
                    // f16 narrowing is the driver's: within one rounding of the f32 sum.
                    (true, DType::F16) => (got - w).abs() <= w.abs() / 2048.0,
                    (true, _) => got.to_bits() == w.to_bits(),
                };
                assert!(ok, "{what}: element {e} (row {row}): got {got}, want {w}");
            }
        }
    }
    assert_no_validation_messages();
}
