//! Cross-entropy on the Vulkan device present (lavapipe in CI) against the f64 CPU reference:
//! random shapes (vocabularies from 1 to past one workgroup's vec4 stride, odd sizes whose
//! rows are not vec4-aligned, many short rows per workgroup), both reducers, every storage
//! dtype, ignored rows, NaN rows, -inf logits, determinism bit for bit, and errors for bad
//! arguments; dlogits stored row-major and column-major (`cross_entropy_with_grad_cols`).
//! Run with `HELIOS_VALIDATION=1`; every test fails on any validation message.
//!
//! Tolerances (|got − want| ≤ atol + rtol·|want|): losses 2e-5 relative and absolute (f32
//! arithmetic on the same rounded inputs, whatever the logits' dtype); dlogits 2e-5 relative
//! plus 2e-6·scale/count absolute (the cancellation in p − 1 at the target), then widened by
//! one rounding to the storage dtype (`Tolerance::stored_as`).

use std::sync::OnceLock;

mod common;

use common::device_with;
use helios::cpu::{self, Tolerance};
use helios::{DType, Device, Error, IndexTensor, KernelConfig, RowConfig, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The ignore index these tests use (any value works; PyTorch's -100 has no u32 spelling).
const IGNORE: u32 = u32::MAX;
const IGNORE_INDEX: Option<u32> = Some(IGNORE);

/// Two devices in one process: subgroup reductions on (where the device has them) and off
/// (the shared-memory tree of `HELIOS_NO_SUBGROUP=1`).
fn devices() -> &'static [Device; 2] {
    static DEVICES: OnceLock<[Device; 2]> = OnceLock::new();
    DEVICES.get_or_init(|| {
        [true, false].map(|subgroups| device_with(|base| KernelConfig { subgroups, ..base }))
    })
}

fn device() -> &'static Device {
    &devices()[0]
}

#[track_caller]
fn assert_no_validation_messages() {
    for d in devices() {
        let messages = d.validation_messages();
        assert!(
            messages.is_empty(),
            "validation messages:\n{}",
            messages.join("\n")
        );
    }
}

const LOSS_TOL: Tolerance = Tolerance {
    rtol: 2e-5,
    atol: 2e-5,
};

/// Logits in ±[0.1, 4) (never zero), rounded to `dtype` as the device stores them.
fn random_logits(rng: &mut StdRng, n: usize, dtype: DType) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v: f32 = rng.gen_range(0.1..4.0);
            dtype.round(if rng.gen_bool(0.5) { v } else { -v })
        })
        .collect()
}

/// Targets in [0, vocab), each ignored with probability `ignored`.
fn random_targets(rng: &mut StdRng, rows: usize, vocab: usize, ignored: f64) -> Vec<u32> {
    (0..rows)
        .map(|_| {
            if rng.gen_bool(ignored) {
                IGNORE
            } else {
                rng.gen_range(0..vocab as u32)
            }
        })
        .collect()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

fn ids(d: &Device, v: &[u32]) -> IndexTensor {
    IndexTensor::from_slice(d, v, &[v.len()]).unwrap()
}

#[track_caller]
fn check(what: &str, tol: Tolerance, got: &[f32], want: &[f32]) {
    if let Some((i, g, w)) = tol.first_mismatch(got, want) {
        panic!("{what}: element {i}: got {g}, want {w} (tolerance {tol:?})");
    }
}

/// Runs forward and forward+backward on `logits` and compares everything with the reference.
fn compare(
    d: &Device,
    rows: usize,
    vocab: usize,
    dtype: DType,
    logits: &[f32],
    targets: &[u32],
    scale: f32,
) {
    let what = format!("{rows}x{vocab} {dtype}");
    let x = Tensor::from_slice_as(d, logits, &[rows, vocab], dtype).unwrap();
    let t = ids(d, targets);
    let want = cpu::cross_entropy(logits, vocab, targets, IGNORE_INDEX, scale);

    let fwd = x.cross_entropy(&t, IGNORE_INDEX).unwrap();
    assert!(fwd.dlogits.is_none());
    let both = x.cross_entropy_with_grad(&t, IGNORE_INDEX, scale).unwrap();
    for (name, r) in [("forward", &fwd), ("fused", &both)] {
        let loss = r.loss.to_vec().unwrap();
        check(
            &format!("{what} {name} loss"),
            LOSS_TOL,
            &loss,
            &[want.loss],
        );
        let rl = r.row_loss.to_vec().unwrap();
        check(
            &format!("{what} {name} row loss"),
            LOSS_TOL,
            &rl,
            &want.row_loss,
        );
    }
    // Both paths run the same statistics code: the same bits.
    assert_eq!(
        bits(&fwd.row_loss),
        bits(&both.row_loss),
        "{what}: forward and fused row losses differ"
    );
    let dl = both.dlogits.as_ref().unwrap();
    assert_eq!(dl.shape(), &[rows, vocab]);
    assert_eq!(dl.dtype(), dtype);
    let count = targets.iter().filter(|&&t| t != IGNORE).count().max(1);
    let tol = Tolerance {
        rtol: 2e-5,
        atol: 2e-6 * scale.abs() / count as f32,
    }
    .stored_as(dtype);
    let want_d: Vec<f32> = want.dlogits.iter().map(|&v| dtype.round(v)).collect();
    check(
        &format!("{what} dlogits"),
        tol,
        &dl.to_vec().unwrap(),
        &want_d,
    );

    // Column-major: the same row statistics, the same gradient values, stored transposed.
    let cols = x
        .cross_entropy_with_grad_cols(&t, IGNORE_INDEX, scale)
        .unwrap();
    assert_eq!(
        bits(&cols.row_loss),
        bits(&fwd.row_loss),
        "{what}: cols row losses"
    );
    assert_eq!(bits(&cols.loss), bits(&both.loss), "{what}: cols loss");
    let dc = cols.dlogits.as_ref().unwrap();
    assert_eq!(dc.shape(), &[rows, vocab]);
    assert_eq!(dc.dtype(), dtype);
    assert!(
        rows < 2 || vocab < 2 || !dc.is_contiguous(),
        "{what}: a transposed view"
    );
    check(
        &format!("{what} dlogits by columns"),
        tol,
        &dc.to_vec().unwrap(),
        &want_d,
    );
}

#[test]
fn random_shapes_match_reference() {
    let mut rng = StdRng::seed_from_u64(11);
    // Vocabularies: tiny (row inside one vec4), odd, one below/above a vec4 multiple, and
    // longer than a 256-invocation workgroup's vec4 stride (1024).
    let vocabs = [1usize, 2, 3, 5, 8, 13, 255, 1031, 2053, 4099];
    for (i, &vocab) in vocabs.iter().enumerate() {
        for dtype in DType::ALL {
            let rows = rng.gen_range(1..=9);
            let logits = random_logits(&mut rng, rows * vocab, dtype);
            let targets = random_targets(&mut rng, rows, vocab, 0.2);
            let scale = if i % 2 == 0 { 1.0 } else { 0.37 };
            for d in devices() {
                compare(d, rows, vocab, dtype, &logits, &targets, scale);
            }
        }
    }
    assert_no_validation_messages();
}

#[test]
fn gpt2_vocabulary_rows() {
    let mut rng = StdRng::seed_from_u64(12);
    let (rows, vocab) = (3, 50257);
    for dtype in [DType::F32, DType::BF16] {
        let logits = random_logits(&mut rng, rows * vocab, dtype);
        let targets = vec![0, 50256, 31337];
        compare(device(), rows, vocab, dtype, &logits, &targets, 1.0);
    }
    assert_no_validation_messages();
}

/// Short rows: several rows per workgroup (a group of invocations each), rows spread over
/// several workgroups, and groups past the last row in the last workgroup.
#[test]
fn many_short_rows() {
    let mut rng = StdRng::seed_from_u64(16);
    for (rows, vocab) in [(600, 13), (70, 768), (33, 100)] {
        for d in devices() {
            let logits = random_logits(&mut rng, rows * vocab, DType::F32);
            let targets = random_targets(&mut rng, rows, vocab, 0.3);
            compare(d, rows, vocab, DType::F32, &logits, &targets, 1.0);
        }
    }
    assert_no_validation_messages();
}

/// Row kernels with other workgroups (`HELIOS_WG`): the column-major gradient keeps its
/// tile's 256 invocations, and everything still matches.
#[test]
fn other_row_workgroups() {
    let mut rng = StdRng::seed_from_u64(18);
    for wg in [64, 512] {
        let d = device_with(|base| KernelConfig {
            rows: RowConfig {
                workgroup: Some(wg),
                ..base.rows
            },
            ..base
        });
        for (rows, vocab) in [(5, 1031), (40, 77)] {
            let logits = random_logits(&mut rng, rows * vocab, DType::BF16);
            let targets = random_targets(&mut rng, rows, vocab, 0.2);
            compare(&d, rows, vocab, DType::BF16, &logits, &targets, 1.0);
        }
        let messages = d.validation_messages();
        assert!(messages.is_empty(), "{}", messages.join("\n"));
    }
}

#[test]
fn ignored_rows_and_all_ignored() {
    let mut rng = StdRng::seed_from_u64(13);
    let (rows, vocab) = (6, 37);
    let logits = random_logits(&mut rng, rows * vocab, DType::F32);
    // A custom ignore index that is also a valid class.
    let d = device();
    let x = Tensor::from_slice(d, &logits, &[2, 3, vocab]).unwrap();
    let targets = [5, 7, 5, 0, 36, 5];
    let t = IndexTensor::from_slice(d, &targets, &[2, 3]).unwrap();
    let r = x.cross_entropy_with_grad(&t, Some(5), 1.0).unwrap();
    let want = cpu::cross_entropy(&logits, vocab, &targets, Some(5), 1.0);
    check("loss", LOSS_TOL, &r.loss.to_vec().unwrap(), &[want.loss]);
    let rl = r.row_loss.to_vec().unwrap();
    assert_eq!([rl[0], rl[2], rl[5]], [0.0; 3], "ignored rows have loss 0");
    let g = r.dlogits.unwrap().to_vec().unwrap();
    for row in [0, 2, 5] {
        assert!(
            g[row * vocab..(row + 1) * vocab].iter().all(|&v| v == 0.0),
            "ignored row {row} has a zero gradient"
        );
    }

    // Every row ignored: loss 0 and a zero gradient (not NaN).
    let t = ids(d, &[IGNORE; 6]);
    let x = Tensor::from_slice(d, &logits, &[rows, vocab]).unwrap();
    let r = x.cross_entropy_with_grad(&t, IGNORE_INDEX, 1.0).unwrap();
    assert_eq!(r.loss.to_vec().unwrap(), [0.0]);
    assert!(r
        .dlogits
        .unwrap()
        .to_vec()
        .unwrap()
        .iter()
        .all(|&v| v == 0.0));

    // No rows at all.
    let x = Tensor::from_slice(d, &[], &[0, vocab]).unwrap();
    let t = ids(d, &[]);
    let r = x.cross_entropy_with_grad(&t, IGNORE_INDEX, 1.0).unwrap();
    assert_eq!(r.loss.to_vec().unwrap(), [0.0]);
    assert_eq!(r.dlogits.unwrap().len(), 0);
    let r = x
        .cross_entropy_with_grad_cols(&t, IGNORE_INDEX, 1.0)
        .unwrap();
    assert_eq!(r.loss.to_vec().unwrap(), [0.0]);
    assert_eq!(r.dlogits.unwrap().shape(), &[0, vocab]);
    assert_no_validation_messages();
}

#[test]
fn nan_and_infinite_logits() {
    let mut rng = StdRng::seed_from_u64(14);
    let (rows, vocab) = (4, 1031);
    for dtype in DType::ALL {
        let mut logits = random_logits(&mut rng, rows * vocab, dtype);
        logits[vocab + 17] = f32::NAN; // row 1: NaN
        logits[3 * vocab + 2] = f32::NEG_INFINITY; // row 3: a masked class
        logits[3 * vocab + 1000] = f32::NEG_INFINITY;
        let targets = [3, 4, IGNORE, 5];
        compare(device(), rows, vocab, dtype, &logits, &targets, 1.0);
        let d = device();
        let x = Tensor::from_slice_as(d, &logits, &[rows, vocab], dtype).unwrap();
        let t = ids(d, &targets);
        let r = x.cross_entropy_with_grad(&t, IGNORE_INDEX, 1.0).unwrap();
        assert!(r.loss.to_vec().unwrap()[0].is_nan(), "NaN in, NaN out");
        let rl = r.row_loss.to_vec().unwrap();
        assert!(rl[1].is_nan() && rl[0].is_finite() && rl[3].is_finite());
        let g = r.dlogits.unwrap().to_vec().unwrap();
        assert!(g[vocab..2 * vocab].iter().all(|v| v.is_nan()));
        assert_eq!(g[3 * vocab + 2], 0.0, "a -inf logit has zero gradient");
    }
    assert_no_validation_messages();
}

#[test]
fn deterministic_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(15);
    let (rows, vocab) = (64, 3001);
    let logits = random_logits(&mut rng, rows * vocab, DType::F32);
    let targets = random_targets(&mut rng, rows, vocab, 0.1);
    let d = device();
    let x = Tensor::from_slice(d, &logits, &[rows, vocab]).unwrap();
    let t = ids(d, &targets);
    let a = x.cross_entropy_with_grad(&t, IGNORE_INDEX, 1.0).unwrap();
    let b = x.cross_entropy_with_grad(&t, IGNORE_INDEX, 1.0).unwrap();
    assert_eq!(bits(&a.loss), bits(&b.loss));
    assert_eq!(bits(&a.row_loss), bits(&b.row_loss));
    assert_eq!(
        bits(a.dlogits.as_ref().unwrap()),
        bits(b.dlogits.as_ref().unwrap())
    );
    assert_no_validation_messages();
}

#[test]
fn bad_arguments_are_errors() {
    let d = device();
    let x = Tensor::from_slice(d, &[0.5; 12], &[3, 4]).unwrap();
    // A target out of range is reported before anything runs.
    let t = ids(d, &[0, 4, 1]);
    match x.cross_entropy(&t, IGNORE_INDEX) {
        Err(Error::IndexOutOfRange {
            at: 1,
            value: 4,
            bound: 4,
            ..
        }) => {}
        other => panic!("expected an out-of-range error, got {other:?}"),
    }
    // The ignore index is the only value outside [0, vocab) allowed, and only when given.
    let t = ids(d, &[0, IGNORE, 1]);
    assert!(x.cross_entropy_with_grad(&t, IGNORE_INDEX, 1.0).is_ok());
    assert!(matches!(
        x.cross_entropy_with_grad(&t, None, 1.0),
        Err(Error::IndexOutOfRange { at: 1, .. })
    ));
    // One target per row.
    let t = ids(d, &[0, 1]);
    let e = x.cross_entropy(&t, IGNORE_INDEX).unwrap_err();
    assert!(e.to_string().contains("one target per row"), "{e}");
    // No classes.
    let empty = Tensor::from_slice(d, &[], &[3, 0]).unwrap();
    let t = ids(d, &[0, 0, 0]);
    assert!(matches!(
        empty.cross_entropy(&t, IGNORE_INDEX),
        Err(Error::Invalid { .. })
    ));
    assert_no_validation_messages();
}

/// Logits whose rows lie at a stride past the vocabulary (`narrow` of the last axis from 0,
/// as a padded vocabulary's head gives them) are read in place: the loss, the row losses and
/// dlogits (the same view) match the reference over the first `vocab` columns, and the
/// gradient reaching the whole (rows, stride) tensor through autograd is zero past `vocab`.
/// The padding columns hold NaN, so any read of them would show. Tolerances as `compare`:
/// losses 2e-5; dlogits 2e-5 relative + 2e-6·scale/count, widened by one rounding to f16
/// (1e-3 relative) or bf16 (8e-3 relative).
#[test]
fn row_strided_view_matches_reference() {
    let mut rng = StdRng::seed_from_u64(17);
    // (rows as (B, T), vocab, stride): an odd vocabulary padded to a multiple of 128 as the
    // model pads GPT-2's; a stride that is not a multiple of 4; one row per workgroup.
    let cases = [((2, 5), 1000, 1024), ((3, 7), 13, 19), ((1, 3), 2053, 2176)];
    for ((b, t), vocab, stride) in cases {
        let rows = b * t;
        for dtype in DType::ALL {
            let mut padded = random_logits(&mut rng, rows * stride, dtype);
            for row in padded.chunks_exact_mut(stride) {
                row[vocab..].fill(f32::NAN);
            }
            let targets = random_targets(&mut rng, rows, vocab, 0.2);
            // A power of two: the autograd path's product by the scale is exact in every dtype.
            let scale = 0.5;
            let want =
                cpu::cross_entropy_strided(&padded, vocab, stride, &targets, IGNORE_INDEX, scale);
            let what = format!("{b}x{t}x{vocab} at stride {stride} {dtype}");
            for d in devices() {
                let full = Tensor::from_slice_as(d, &padded, &[b, t, stride], dtype).unwrap();
                let x = full.narrow(2, 0, vocab).unwrap();
                assert!(!x.is_contiguous());
                let tg = IndexTensor::from_slice(d, &targets, &[b, t]).unwrap();
                let r = x.cross_entropy_with_grad(&tg, IGNORE_INDEX, scale).unwrap();
                check(
                    &format!("{what} loss"),
                    LOSS_TOL,
                    &r.loss.to_vec().unwrap(),
                    &[want.loss],
                );
                check(
                    &format!("{what} row loss"),
                    LOSS_TOL,
                    &r.row_loss.to_vec().unwrap(),
                    &want.row_loss,
                );
                let count = targets.iter().filter(|&&t| t != IGNORE).count().max(1);
                let tol = Tolerance {
                    rtol: 2e-5,
                    atol: 2e-6 * scale / count as f32,
                }
                .stored_as(dtype);
                let want_d: Vec<f32> = want.dlogits.iter().map(|&v| dtype.round(v)).collect();
                let dl = r.dlogits.as_ref().unwrap();
                assert_eq!(dl.shape(), &[b, t, vocab]);
                assert_eq!(dl.layout().strides(), x.layout().strides());
                let unpadded: Vec<f32> = want_d
                    .chunks_exact(stride)
                    .flat_map(|row| &row[..vocab])
                    .copied()
                    .collect();
                check(
                    &format!("{what} dlogits"),
                    tol,
                    &dl.to_vec().unwrap(),
                    &unpadded,
                );
                // Column-major: (stride, rows) with zeros past `vocab`, viewed the same way.
                let c = x
                    .cross_entropy_with_grad_cols(&tg, IGNORE_INDEX, scale)
                    .unwrap();
                let dc = c.dlogits.as_ref().unwrap();
                assert_eq!(dc.shape(), &[b, t, vocab]);
                assert_eq!(dc.layout().strides(), &[t, 1, rows]);
                check(
                    &format!("{what} dlogits by columns"),
                    tol,
                    &dc.to_vec().unwrap(),
                    &unpadded,
                );

                // Through autograd, d(scale · loss)/d(full), zero past `vocab`: the view's
                // cross-entropy (reaching `full` through narrow's backward), and
                // `cross_entropy_padded` of `full` itself.
                for padded_op in [false, true] {
                    let leaf = full.detach().requires_grad_();
                    let ce = match padded_op {
                        false => leaf
                            .narrow(2, 0, vocab)
                            .unwrap()
                            .cross_entropy(&tg, IGNORE_INDEX),
                        true => leaf.cross_entropy_padded(&tg, IGNORE_INDEX, vocab),
                    };
                    let loss = ce.unwrap().loss;
                    let what = format!("{what} autograd (padded op: {padded_op})");
                    check(
                        &format!("{what} loss"),
                        LOSS_TOL,
                        &loss.to_vec().unwrap(),
                        &[want.loss],
                    );
                    loss.mul_scalar(scale).unwrap().backward().unwrap();
                    let g = leaf.grad().unwrap();
                    assert_eq!(g.shape(), &[b, t, stride]);
                    let g = g.to_vec().unwrap();
                    check(&format!("{what} dlogits"), tol, &g, &want_d);
                    assert!(
                        g.chunks_exact(stride)
                            .all(|row| row[vocab..].iter().all(|&v| v == 0.0)),
                        "{what}: the padding columns get a zero gradient"
                    );
                }
                // Without autograd the padded op gives the same statistics bit for bit.
                let p = full.cross_entropy_padded(&tg, IGNORE_INDEX, vocab).unwrap();
                assert_eq!(bits(&p.row_loss), bits(&r.row_loss), "{what}");
                assert!(full
                    .cross_entropy_padded(&tg, IGNORE_INDEX, stride + 1)
                    .is_err());
            }
        }
    }
    assert_no_validation_messages();
}

/// Views the kernels cannot read in place (rows not at one stride, not starting the buffer)
/// are made contiguous first and give the same results as their dense copy.
#[test]
fn other_views_are_made_contiguous() {
    let mut rng = StdRng::seed_from_u64(18);
    let d = device();
    let (rows, vocab) = (6, 37);
    let values = random_logits(&mut rng, rows * (vocab + 5), DType::F32);
    let full = Tensor::from_slice(d, &values, &[rows, vocab + 5]).unwrap();
    let targets = random_targets(&mut rng, rows, vocab, 0.0);
    let t = ids(d, &targets);
    // Columns 5.. of each row (an offset), and the transpose of a (vocab, rows) tensor.
    let shifted = full.narrow(1, 5, vocab).unwrap();
    let transposed = Tensor::from_slice(d, &values[..rows * vocab], &[vocab, rows])
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    for x in [shifted, transposed] {
        let dense = x.contiguous().unwrap();
        let want = cpu::cross_entropy(&dense.to_vec().unwrap(), vocab, &targets, None, 1.0);
        let r = x.cross_entropy_with_grad(&t, None, 1.0).unwrap();
        check("loss", LOSS_TOL, &r.loss.to_vec().unwrap(), &[want.loss]);
        let tol = Tolerance {
            rtol: 2e-5,
            atol: 2e-6 / rows as f32,
        };
        check(
            "dlogits",
            tol,
            &r.dlogits.unwrap().to_vec().unwrap(),
            &want.dlogits,
        );
    }
    assert_no_validation_messages();
}
