//! Matmul on the Vulkan device present (lavapipe in CI) against the f64 CPU reference: odd and
//! aligned sizes, every transpose combination read in place, batches (strided, broadcast,
//! attention-style permuted views), tiny k and skinny shapes, every fused epilogue, f16/bf16
//! storage, every SIMT variant, the tuner, and errors for bad operands. The figure checked is
//! ‖out − ref‖ / ‖ref‖ against `cpu::matmul::tolerance(out dtype)`. Cooperative-matrix
//! kernels run only where the device has them and say so when skipped. Run with
//! `HELIOS_VALIDATION=1`; every test fails on any validation message.

use helios::cpu::matmul::{matmul as reference, relative_error, tolerance, MatmulRef};
use helios::{
    matmul_caps, Activation, DType, Error, MatmulOptions, MatmulOverrides, MatmulVariant, Tensor,
};

mod common;
use common::matmul::{operand, random, Case, TRANS};
use common::{assert_no_validation_messages, device};

/// A forced variant the device cannot run, or a tile put together by hand that the kernel
/// generators cannot build, is an error that names it, not a panic; a cooperative tile
/// outside the table is named as `HELIOS_MATMUL_VARIANT` would take it.
#[test]
fn unrunnable_variants_are_errors() {
    use helios_kernels::matmul::{CoopTile, SimtTile};
    let a = Tensor::from_slice(device(), &random(8 * 16, DType::F32, 3), &[8, 16]).unwrap();
    let b = Tensor::from_slice(device(), &random(16 * 8, DType::F32, 4), &[16, 8]).unwrap();
    let odd_simt = MatmulVariant::Simt(SimtTile {
        bm: 64,
        bn: 64,
        tm: 3,
        tn: 4,
        depth: 1,
    });
    let no_subgroups = MatmulVariant::Coop(CoopTile {
        bm: 128,
        bn: 128,
        bk: 32,
        wm: 0,
        wn: 2,
        depth: 1,
        stages: 2,
    });
    let custom = MatmulVariant::parse("coop128x256w2x8k32s1").expect("a cooperative tile");
    for (v, name) in [
        (odd_simt, "simt64x64t3x4d1"),
        (no_subgroups, "coop128x128w0x2k32d1"),
        // f32 operands never run on cooperative matrices.
        (custom, "coop128x256w2x8k32s1"),
    ] {
        let opts = MatmulOverrides {
            variant: Some(v),
            ..Default::default()
        };
        let err = a
            .matmul_overridden(&b, &MatmulOptions::default(), &opts)
            .unwrap_err()
            .to_string();
        assert!(err.contains(name) && err.contains("cannot run"), "{err}");
    }
    assert_no_validation_messages();
}

/// Split-K (k cut into 2, 3 or 4 products in one batched launch, summed after): every
/// transpose combination, narrow inputs and outputs, a scale, a folded batch; and the
/// products it cannot split are refused with a message.
#[test]
fn split_k_matches_reference() {
    let v = MatmulVariant::by_name("simt64x64d2").expect("a SIMT variant");
    for (i, trans) in TRANS.into_iter().enumerate() {
        for (j, splits) in [2u32, 3, 4].into_iter().enumerate() {
            let (input, out) = [
                (DType::F32, DType::F32),
                (DType::BF16, DType::BF16),
                (DType::F16, DType::F32),
            ][(i + j) % 3];
            Case {
                trans,
                input,
                out,
                alpha: 0.75,
                variant: Some(v),
                splits: Some(splits),
                ..Case::new(1, 70, 45, 24 * 8)
            }
            .check(700 + (i * 3 + j) as u64);
        }
    }
    // An output a multiple of 4 long: the k slices are summed 4 columns at a time, straight
    // into the narrow dtype.
    for (trans, out) in [(TRANS[0], DType::BF16), (TRANS[3], DType::F16)] {
        Case {
            trans,
            input: out,
            out,
            alpha: 1.0,
            variant: Some(v),
            splits: Some(4),
            ..Case::new(1, 128, 96, 256)
        }
        .check(777);
    }
    // A row-major stack against one matrix folds into one tall product: still splittable.
    let a = Tensor::from_slice(device(), &random(3 * 5 * 64, DType::F32, 7), &[3, 5, 64]).unwrap();
    let b = Tensor::from_slice(device(), &random(64 * 9, DType::F32, 8), &[64, 9]).unwrap();
    let split = MatmulOverrides {
        variant: Some(v),
        splits: Some(2),
        ..Default::default()
    };
    let got = a
        .matmul_overridden(&b, &MatmulOptions::default(), &split)
        .unwrap();
    let want = a.matmul(&b).unwrap();
    assert_eq!(got.shape(), [3, 5, 9]);
    let want: Vec<f64> = want
        .to_vec()
        .unwrap()
        .iter()
        .map(|&x| f64::from(x))
        .collect();
    assert!(relative_error(&got.to_vec().unwrap(), &want) < 1e-6);
    // Refused: an epilogue, and a k that does not cut into equal multiples of 8.
    let bias = Tensor::from_slice(device(), &[0.5; 9], &[9]).unwrap();
    let with_bias = MatmulOptions {
        bias: Some(&bias),
        ..Default::default()
    };
    for (opts, k) in [(with_bias, 64), (MatmulOptions::default(), 40)] {
        let a = Tensor::from_slice(device(), &random(5 * k, DType::F32, 9), &[5, k]).unwrap();
        let b = Tensor::from_slice(device(), &random(k * 9, DType::F32, 10), &[k, 9]).unwrap();
        let err = a
            .matmul_overridden(&b, &opts, &split)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot be split 2 ways"), "{err}");
    }
    assert_no_validation_messages();
}

#[test]
fn transposes_odd_and_aligned_sizes() {
    for (i, trans) in TRANS.into_iter().enumerate() {
        for (m, n, k) in [(37, 45, 29), (64, 96, 40), (130, 67, 133)] {
            Case {
                trans,
                ..Case::new(1, m, n, k)
            }
            .check(100 + i as u64);
        }
    }
    assert_no_validation_messages();
}

#[test]
fn every_simt_variant() {
    let simt = helios_kernels_variants(simt);
    for (i, v) in simt.into_iter().enumerate() {
        for (j, trans) in [(false, false), (true, true)].into_iter().enumerate() {
            Case {
                trans,
                variant: Some(v),
                ..Case::new(1, 71, 133, 35)
            }
            .check(200 + (i * 4 + j) as u64);
        }
        // Aligned: vec4 loads and stores; NN and TT between them stage each operand both
        // ways. k = 48 is a whole number of the loop's steps (16 or 24: the kernels without k
        // clamps or masks, `_xk`), 40 is not.
        for (j, trans) in [(false, false), (true, true)].into_iter().enumerate() {
            for (k, exact) in [(48, true), (40, false)] {
                let c = Case {
                    trans,
                    variant: Some(v),
                    ..Case::new(1, 128, 64, k)
                };
                let a = operand(
                    &random(128 * k, DType::F32, 1),
                    [1, 128, k],
                    trans.0,
                    DType::F32,
                );
                let b = operand(
                    &random(k * 64, DType::F32, 2),
                    [1, k, 64],
                    trans.1,
                    DType::F32,
                );
                let opts = MatmulOverrides {
                    variant: Some(v),
                    ..Default::default()
                };
                let name = a
                    .matmul_choice_overridden(&b, &MatmulOptions::default(), &opts)
                    .unwrap()
                    .kernel;
                assert_eq!(name.ends_with("_xk"), exact, "{name} at k = {k}");
                c.check(300 + (i * 8 + j * 2) as u64 + u64::from(exact));
            }
        }
    }
    assert_no_validation_messages();
}

/// `matmul_col_sums`: the product and its right operand's column sums (a linear layer's
/// weight and bias gradients). Every SIMT variant folds the sums into the product's launch;
/// checked in all four transposes at odd sizes (several tile rows and columns, a k tail, no
/// vector accesses) and aligned ones, and in f16/bf16. The default choice (cooperative
/// fragments on a GPU) and products past 2^30 FLOPs sum in a reduction after the product.
/// Operands that need a gradient or are not 2-D are errors.
#[test]
fn products_with_column_sums() {
    let check = |m: usize, n: usize, k: usize, trans: (bool, bool), dtype: DType, v, seed| {
        let a_host = random(m * k, dtype, seed);
        let b_host = random(k * n, dtype, seed + 1);
        let a = operand(&a_host, [1, m, k], trans.0, dtype)
            .reshape(&[m, k])
            .unwrap();
        let b = operand(&b_host, [1, k, n], trans.1, dtype)
            .reshape(&[k, n])
            .unwrap();
        let (c, sums) = a.matmul_col_sums(&b, v).unwrap();
        assert_eq!((c.shape(), sums.shape()), (&[m, n][..], &[n][..]));
        assert_eq!((c.dtype(), sums.dtype()), (dtype, dtype));
        let want = reference(&a_host, &b_host, &MatmulRef::plain(1, m, n, k));
        let want_sums: Vec<f64> = (0..n)
            .map(|j| (0..k).map(|r| f64::from(b_host[r * n + j])).sum())
            .collect();
        let what = format!(
            "{m}x{n}x{k} trans {trans:?} {dtype} variant {:?}",
            v.map(|v| v.name())
        );
        let tol = tolerance(dtype);
        let err = relative_error(&c.to_vec().unwrap(), &want);
        assert!(
            err <= tol,
            "{what}: product relative error {err:e} > {tol:e}"
        );
        let err = relative_error(&sums.to_vec().unwrap(), &want_sums);
        assert!(
            err <= tol,
            "{what}: column sums relative error {err:e} > {tol:e}"
        );
    };
    for (i, v) in helios_kernels_variants(simt).into_iter().enumerate() {
        let seed = 700 + 10 * i as u64;
        for (j, trans) in TRANS.into_iter().enumerate() {
            check(133, 45, 37, trans, DType::F32, Some(v), seed + j as u64);
        }
        check(256, 128, 48, (true, false), DType::F32, Some(v), seed + 4);
        check(70, 64, 40, (true, false), DType::F32, Some(v), seed + 5);
    }
    for dtype in [DType::F16, DType::BF16] {
        check(96, 72, 50, (true, false), dtype, None, 790);
    }
    check(200, 96, 130, (true, false), DType::F32, None, 791);
    // Past `COL_SUMS_MAX_FLOPS` (2^30) the sums come from a reduction after the product.
    check(512, 512, 2048, (true, false), DType::F32, None, 793);

    let a = Tensor::from_slice(device(), &random(12, DType::F32, 1), &[3, 4]).unwrap();
    let b = Tensor::from_slice(device(), &random(8, DType::F32, 2), &[4, 2]).unwrap();
    let batched = a.reshape(&[1, 3, 4]).unwrap();
    assert!(matches!(
        batched.matmul_col_sums(&b, None),
        Err(Error::Invalid { .. })
    ));
    let leaf = b.requires_grad_();
    assert!(matches!(
        a.matmul_col_sums(&leaf, None),
        Err(Error::Invalid { .. })
    ));
    let (c, sums) = helios::no_grad(|| a.matmul_col_sums(&leaf, None)).unwrap();
    assert_eq!((c.shape(), sums.shape()), (&[3, 2][..], &[2][..]));
    assert_no_validation_messages();
}

/// The table's variants of one family: SIMT (`Simt`), subgroup-scope fragments (`Coop`) or
/// workgroup-scope matrices (`Wg`).
fn helios_kernels_variants(family: fn(&MatmulVariant) -> bool) -> Vec<MatmulVariant> {
    helios_kernels::matmul::VARIANTS
        .iter()
        .map(|(_, v)| *v)
        .filter(family)
        .collect()
}

fn simt(v: &MatmulVariant) -> bool {
    matches!(v, MatmulVariant::Simt(_))
}

fn subgroup_coop(v: &MatmulVariant) -> bool {
    matches!(v, MatmulVariant::Coop(_))
}

fn workgroup_coop(v: &MatmulVariant) -> bool {
    matches!(v, MatmulVariant::Wg(_))
}

#[test]
fn epilogues_and_output_storage() {
    let acts = [Activation::None, Activation::Relu, Activation::GeluTanh];
    for (i, act) in acts.into_iter().enumerate() {
        for (j, out) in DType::ALL.into_iter().enumerate() {
            Case {
                bias: true,
                residual: i != 1,
                act,
                alpha: 0.75,
                out,
                trans: TRANS[(i + j) % 4],
                ..Case::new(2, 33, 70, 24)
            }
            .check(400 + (i * 3 + j) as u64);
        }
    }
    // Aligned output: vector epilogue.
    Case {
        bias: true,
        residual: true,
        act: Activation::GeluTanh,
        ..Case::new(1, 64, 64, 16)
    }
    .check(420);
    // An activation's gradient at the residual (a linear layer's backward), scalar and
    // vector stores, in each output storage.
    for (i, act_grad) in [Activation::Relu, Activation::GeluTanh]
        .into_iter()
        .enumerate()
    {
        for (j, out) in DType::ALL.into_iter().enumerate() {
            let (m, n) = if j == 0 { (64, 64) } else { (33, 70) };
            Case {
                residual: true,
                act_grad,
                alpha: 0.5,
                out,
                trans: TRANS[(i + 2 * j) % 4],
                ..Case::new(2, m, n, 24)
            }
            .check(430 + (i * 3 + j) as u64);
        }
    }
    // It needs the residual (the activation's input) and nothing else.
    let x = Tensor::from_slice(device(), &[1.0; 4], &[2, 2]).unwrap();
    let bad = MatmulOptions {
        bias: Some(&x),
        residual: Some(&x),
        ..Default::default()
    };
    let act_grad = MatmulOverrides {
        act_grad: Activation::GeluTanh,
        ..Default::default()
    };
    let err = x
        .matmul_overridden(&x, &bad, &act_grad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("act_grad"), "{err}");
    assert_no_validation_messages();
}

#[test]
fn narrow_inputs() {
    for (i, input) in [DType::F16, DType::BF16].into_iter().enumerate() {
        for (j, trans) in TRANS.into_iter().enumerate() {
            Case {
                input,
                out: DType::F32,
                trans,
                ..Case::new(1, 50, 72, 40)
            }
            .check(500 + (i * 4 + j) as u64);
        }
        Case {
            input,
            out: input,
            ..Case::new(2, 64, 64, 64)
        }
        .check(510 + i as u64);
    }
    assert_no_validation_messages();
}

#[test]
fn tiny_k_skinny_and_empty() {
    for (i, (m, n, k)) in [
        (17, 19, 1),
        (9, 33, 3),
        (1, 257, 64),
        (300, 1, 64),
        (1, 1, 1000),
        (5, 1, 1),
    ]
    .into_iter()
    .enumerate()
    {
        Case::new(1, m, n, k).check(600 + i as u64);
    }
    // k = 0: the product is zero, the epilogue still applies.
    let a = Tensor::from_slice(device(), &[], &[3, 0]).unwrap();
    let b = Tensor::from_slice(device(), &[], &[0, 2]).unwrap();
    let bias = Tensor::from_slice(device(), &[1.0, -2.0], &[2]).unwrap();
    let c = a
        .matmul_opts(
            &b,
            &MatmulOptions {
                bias: Some(&bias),
                act: Activation::Relu,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(c.to_vec().unwrap(), [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
    // A preallocated output; a wrong one is an error.
    let a = Tensor::from_slice(device(), &random(6 * 5, DType::F32, 650), &[6, 5]).unwrap();
    let b = Tensor::from_slice(device(), &random(5 * 7, DType::F32, 651), &[5, 7]).unwrap();
    let out = a.matmul(&b).unwrap();
    let again = Tensor::from_slice(device(), &[0.0; 42], &[6, 7]).unwrap();
    a.matmul_into(&b, &again, &MatmulOptions::default())
        .unwrap();
    assert_eq!(again.to_vec().unwrap(), out.to_vec().unwrap());
    let wrong = Tensor::from_slice(device(), &[0.0; 42], &[7, 6]).unwrap();
    assert!(a
        .matmul_into(&b, &wrong, &MatmulOptions::default())
        .is_err());
    // m = 0: an empty result, no dispatch.
    let a = Tensor::from_slice(device(), &[], &[0, 4]).unwrap();
    let b = Tensor::from_slice(device(), &[0.0; 8], &[4, 2]).unwrap();
    assert_eq!(a.matmul(&b).unwrap().shape(), [0, 2]);
    assert_no_validation_messages();
}

#[test]
fn batches_broadcasts_and_views() {
    let (bt, m, n, k) = (3, 21, 18, 13);
    let a_host = random(bt * m * k, DType::F32, 700);
    let w_host = random(k * n, DType::F32, 701);
    let a = Tensor::from_slice(device(), &a_host, &[bt, m, k]).unwrap();
    let w = Tensor::from_slice(device(), &w_host, &[k, n]).unwrap();
    // (3, m, k) · (k, n): folded into one tall product.
    let got = a.matmul(&w).unwrap();
    assert_eq!(got.shape(), [bt, m, n]);
    let want = reference(&a_host, &w_host, &MatmulRef::plain(bt, m, n, k));
    assert!(relative_error(&got.to_vec().unwrap(), &want) < 1e-5);
    // (m, k) · (3, k, n): A broadcast over the batch.
    let a2_host = random(m * k, DType::F32, 702);
    let b3_host = random(bt * k * n, DType::F32, 703);
    let a2 = Tensor::from_slice(device(), &a2_host, &[m, k]).unwrap();
    let b3 = Tensor::from_slice(device(), &b3_host, &[bt, k, n]).unwrap();
    let got = a2.matmul(&b3).unwrap();
    assert_eq!(got.shape(), [bt, m, n]);
    let want = reference(&a2_host, &b3_host, &MatmulRef::plain(bt, m, n, k));
    assert!(relative_error(&got.to_vec().unwrap(), &want) < 1e-5);
    // (3, m, k) column-major, its matrices side by side down the columns (a (k, 3·m)
    // tensor transposed and split, as column-major dlogits): one tall column-major product.
    let at_host: Vec<f32> = (0..k * bt * m)
        .map(|i| a_host[(i % (bt * m)) * k + i / (bt * m)])
        .collect();
    let a_cols = Tensor::from_slice(device(), &at_host, &[k, bt * m])
        .unwrap()
        .transpose(0, 1)
        .unwrap()
        .reshape(&[bt, m, k])
        .unwrap();
    assert_eq!(a_cols.layout().strides(), &[m, 1, bt * m]);
    let got = a_cols.matmul(&w).unwrap();
    let want = reference(&a_host, &w_host, &MatmulRef::plain(bt, m, n, k));
    assert!(relative_error(&got.to_vec().unwrap(), &want) < 1e-5);

    // Attention: q, k as (B, T, H, D) read per head as (B, H, T, D) views; scores = q·kᵀ/√D.
    let (b, t, h, d) = (2, 19, 3, 8);
    let q_host = random(b * t * h * d, DType::F32, 704);
    let k_host = random(b * t * h * d, DType::F32, 705);
    let q = Tensor::from_slice(device(), &q_host, &[b, t, h, d])
        .unwrap()
        .permute(&[0, 2, 1, 3])
        .unwrap();
    let kt = Tensor::from_slice(device(), &k_host, &[b, t, h, d])
        .unwrap()
        .permute(&[0, 2, 3, 1])
        .unwrap();
    let scale = 1.0 / (d as f32).sqrt();
    let s = q
        .matmul_opts(
            &kt,
            &MatmulOptions {
                alpha: scale,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(s.shape(), [b, h, t, t]);
    // Reference on host-permuted copies.
    let perm = |x: &[f32]| {
        let mut o = vec![0f32; x.len()];
        for bi in 0..b {
            for ti in 0..t {
                for hi in 0..h {
                    for di in 0..d {
                        o[((bi * h + hi) * t + ti) * d + di] = x[((bi * t + ti) * h + hi) * d + di];
                    }
                }
            }
        }
        o
    };
    let (qp, kp) = (perm(&q_host), perm(&k_host));
    let mut ktp = vec![0f32; kp.len()];
    for bh in 0..b * h {
        for ti in 0..t {
            for di in 0..d {
                ktp[(bh * d + di) * t + ti] = kp[(bh * t + ti) * d + di];
            }
        }
    }
    let want = reference(
        &qp,
        &ktp,
        &MatmulRef {
            alpha: scale,
            ..MatmulRef::plain(b * h, t, t, d)
        },
    );
    let err = relative_error(&s.to_vec().unwrap(), &want);
    assert!(err < 1e-5, "attention scores: {err:e}");
    assert_no_validation_messages();
}

#[test]
fn bad_operands_are_errors() {
    let dev = device();
    let a = Tensor::from_slice(dev, &[0.5; 6], &[2, 3]).unwrap();
    let b = Tensor::from_slice(dev, &[0.5; 8], &[4, 2]).unwrap();
    assert!(matches!(a.matmul(&b), Err(Error::ShapeMismatch { .. })));
    let v = Tensor::from_slice(dev, &[0.5; 3], &[3]).unwrap();
    assert!(matches!(v.matmul(&b), Err(Error::Invalid { .. })));
    let h = Tensor::from_slice_as(dev, &[0.5; 6], &[3, 2], DType::F16).unwrap();
    assert!(matches!(a.matmul(&h), Err(Error::DTypeMismatch { .. })));
    let ok = Tensor::from_slice(dev, &[0.5; 6], &[3, 2]).unwrap();
    let bad_bias = Tensor::from_slice(dev, &[0.5; 3], &[3]).unwrap();
    let e = a
        .matmul_opts(
            &ok,
            &MatmulOptions {
                bias: Some(&bad_bias),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("bias"), "{e}");
    let x = Tensor::from_slice(dev, &[0.5; 12], &[2, 2, 3]).unwrap();
    let y = Tensor::from_slice(dev, &[0.5; 18], &[3, 3, 2]).unwrap();
    assert!(x.matmul(&y).unwrap_err().to_string().contains("batch"));
    // Variants this device cannot run are refused, saying so.
    let caps = matmul_caps(dev);
    for (name, missing) in [
        ("coop64x64w2x2k32d2", !caps.coop_f16),
        ("wg128x128k16w4p", caps.coop_wg.is_empty()),
    ] {
        if !missing {
            continue;
        }
        let v = MatmulVariant::by_name(name).unwrap();
        let opts = MatmulOverrides {
            variant: Some(v),
            ..Default::default()
        };
        let e = a
            .matmul_overridden(&ok, &MatmulOptions::default(), &opts)
            .unwrap_err();
        assert!(e.to_string().contains("cannot run here"), "{name}: {e}");
    }
    assert_no_validation_messages();
}

#[test]
fn tuner_checks_times_and_keeps_a_winner() {
    let (m, n, k) = (96, 80, 64);
    let a = Tensor::from_slice(device(), &random(m * k, DType::F32, 800), &[m, k]).unwrap();
    let b = Tensor::from_slice(device(), &random(k * n, DType::F32, 801), &[k, n]).unwrap();
    let report = a.matmul_tune(&b, &MatmulOptions::default()).unwrap();
    assert!(report.candidates.len() >= 3, "{report:?}");
    for c in &report.candidates {
        assert!(c.passed, "{c:?}");
        assert!(c.time_us.is_some_and(|t| t > 0.0), "{c:?}");
    }
    let winner = report.winner.expect("a winner");
    // The winner is now what matmul runs for this class.
    let choice = a.matmul_choice(&b, &MatmulOptions::default()).unwrap();
    assert_eq!(choice.variant.name(), winner);
    assert_eq!(choice.how, helios::Choice::Cached);

    // A transposed batch against one broadcast B: candidates are checked in that form.
    let at = Tensor::from_slice(device(), &random(2 * k * m, DType::F32, 802), &[2, k, m])
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    let report = at.matmul_tune(&b, &MatmulOptions::default()).unwrap();
    assert!(report.candidates.iter().all(|c| c.passed), "{report:?}");
    assert_no_validation_messages();
}

#[test]
fn cooperative_matrix_variants() {
    let caps = matmul_caps(device());
    for (d, input) in [DType::F16, DType::BF16].into_iter().enumerate() {
        let have = match input {
            DType::F16 => caps.coop_f16,
            _ => caps.coop_bf16,
        };
        if !have {
            eprintln!(
                "SKIPPED cooperative-matrix matmul ({input}): {} has no 16x16x16 {input} \
                 fragments with f32 accumulation",
                device().name()
            );
            continue;
        }
        // Every variant on an odd shape and on one whose k is a whole number of every
        // variant's loop steps (384: the kernels without k clamps or masks), in every
        // transpose combination; the first two also on aligned and tiny shapes and with the
        // full epilogue (each distinct kernel costs a pipeline compile, which dominates on a
        // GPU). Then two tiles outside the table with 16 subgroups, whose epilogue scratch
        // lives in the B stages. Past the first
        // two, each variant runs in one input type, f16 and bf16 in turn: with 18 variants
        // both types took more than 230 s on an H100 (session 18).
        let custom = ["coop128x256w2x8k32s1", "coop256x128w4x4k16d1"]
            .map(|name| MatmulVariant::parse(name).expect("a cooperative tile"));
        for (i, v) in helios_kernels_variants(subgroup_coop)
            .into_iter()
            .chain(custom)
            .enumerate()
        {
            if i >= 2 && (i + d) % 2 == 1 {
                continue;
            }
            let shapes: &[(usize, usize, usize)] = if i < 2 {
                &[(256, 256, 128), (77, 133, 72), (96, 136, 384), (50, 45, 37)]
            } else {
                &[(77, 133, 72), (96, 136, 384)]
            };
            for (j, trans) in TRANS.into_iter().enumerate() {
                for &(m, n, k) in shapes {
                    Case {
                        input,
                        out: if j % 2 == 0 { DType::F32 } else { input },
                        trans,
                        variant: Some(v),
                        ..Case::new(1, m, n, k)
                    }
                    .check(900 + (i * 4 + j) as u64);
                }
            }
            if i < 2 {
                Case {
                    input,
                    bias: true,
                    act: Activation::GeluTanh,
                    residual: true,
                    variant: Some(v),
                    ..Case::new(2, 128, 192, 96)
                }
                .check(990 + i as u64);
                Case {
                    input,
                    out: input,
                    residual: true,
                    act_grad: Activation::GeluTanh,
                    variant: Some(v),
                    ..Case::new(2, 128, 192, 96)
                }
                .check(995 + i as u64);
            }
        }
    }
    assert_no_validation_messages();
}

/// Workgroup-scope variants (VK_NV_cooperative_matrix2) on shapes their tiles divide, every
/// transpose combination, batched, scaled, f32 and narrow outputs; a shape the tile does not
/// divide is refused with an error that says so.
#[test]
fn workgroup_scope_variants() {
    let dev = device();
    let caps = matmul_caps(dev);
    for input in [DType::F16, DType::BF16] {
        let storage = input.storage();
        if !caps.coop_wg.iter().any(|s| s.input == storage) {
            eprintln!(
                "SKIPPED workgroup-scope matmul ({input}): {} has no workgroup-scope {input} \
                 matrices (VK_NV_cooperative_matrix2 with flexible dimensions)",
                dev.name()
            );
            continue;
        }
        for (i, v) in helios_kernels_variants(workgroup_coop)
            .into_iter()
            .enumerate()
        {
            let MatmulVariant::Wg(t) = v else {
                unreachable!()
            };
            if t.tensor && (input != DType::F16 || !caps.coop_wg_tensor) {
                eprintln!(
                    "SKIPPED {} ({input}): tensor-addressed loads are f16 only",
                    v.name()
                );
                continue;
            }
            let (bm, bn, bk) = (usize::from(t.bm), usize::from(t.bn), usize::from(t.bk));
            for (j, trans) in TRANS.into_iter().enumerate() {
                Case {
                    input,
                    out: if j % 2 == 0 { DType::F32 } else { input },
                    trans,
                    alpha: if j == 3 { 0.5 } else { 1.0 },
                    variant: Some(v),
                    ..Case::new(1 + j % 2, 2 * bm, 3 * bn, 4 * bk)
                }
                .check(1100 + (i * 4 + j) as u64);
            }
            let odd =
                Tensor::from_slice_as(dev, &random(bm * 40, input, 7), &[bm, 40], input).unwrap();
            let b =
                Tensor::from_slice_as(dev, &random(40 * bn, input, 8), &[40, bn], input).unwrap();
            let e = odd
                .matmul_overridden(
                    &b,
                    &MatmulOptions::default(),
                    &MatmulOverrides {
                        variant: Some(v),
                        ..Default::default()
                    },
                )
                .unwrap_err();
            assert!(e.to_string().contains("multiples of its tile"), "{e}");
        }
    }
    assert_no_validation_messages();
}
