//! Element-wise ops on the Vulkan device present (lavapipe in CI) against the CPU reference:
//! random inputs (never zeros) at the sizes that exercise the vec4 body and scalar tail, IEEE
//! special values, and errors for mismatched operands. Run with `HELIOS_VALIDATION=1`; every
//! test fails on any validation message.

use helios::selfcheck::{check_random, check_specials, Case};
use helios::{
    BinaryOp, DType, Device, Error, KernelConfig, OperandLayout, Readback, Tensor, UnaryOp,
};

mod common;
use common::{assert_no_validation_messages, device};

/// The sizes the foundation issue names: empty, tiny, tail-only, one vec4, odd, a power of
/// two (a whole number of tiles: the exact variant), and large with a 3-element tail. The
/// large size runs for one op of each form (`large_sizes_match_reference`): the walk over
/// elements does not depend on the op, and it is the slowest case on lavapipe.
const SIZES: [usize; 6] = [0, 1, 3, 4, 1023, 65536];
const LARGE: usize = (1 << 20) + 3;

/// f16 and bf16 storage at sizes around the vec4 body and tail.
const NARROW_SIZES: [usize; 3] = [3, 1023, 65536 + 5];

fn check_sizes(case: Case, sizes: &[usize]) {
    for (i, &n) in sizes.iter().enumerate() {
        if let Some(failure) = check_random(device(), case, DType::F32, n, 7 + i as u64).unwrap() {
            panic!("{failure}");
        }
    }
}

fn check_all_sizes(case: Case) {
    check_sizes(case, &SIZES);
    for (i, &n) in NARROW_SIZES.iter().enumerate() {
        for dtype in [DType::F16, DType::BF16] {
            if let Some(failure) = check_random(device(), case, dtype, n, 70 + i as u64).unwrap() {
                panic!("{failure}");
            }
        }
    }
    for dtype in DType::ALL {
        if let Some(failure) = check_specials(device(), case, dtype).unwrap() {
            panic!("special values: {failure}");
        }
    }
    assert_no_validation_messages();
}

#[test]
fn large_sizes_match_reference() {
    for case in [
        Case::Unary(UnaryOp::GeluTanh),
        Case::Binary(BinaryOp::Div),
        Case::Binary(BinaryOp::GeluTanhBackward),
        Case::Scalar {
            op: BinaryOp::Pow,
            scalar_first: true,
        },
    ] {
        check_sizes(case, &[LARGE]);
    }
    assert_no_validation_messages();
}

#[test]
fn unary_ops_match_reference() {
    for op in UnaryOp::ALL {
        check_all_sizes(Case::Unary(op));
    }
}

#[test]
fn binary_ops_match_reference() {
    for op in BinaryOp::ALL {
        check_all_sizes(Case::Binary(op));
    }
}

#[test]
fn scalar_ops_match_reference() {
    for op in BinaryOp::ARITHMETIC {
        check_all_sizes(Case::Scalar {
            op,
            scalar_first: false,
        });
        check_all_sizes(Case::Scalar {
            op,
            scalar_first: true,
        });
    }
}

/// The 1-, 2- and 4-vec4-per-invocation variants, whatever the per-dtype default (whole
/// tiles, partial tiles and the tail), at sizes around their tile edges, for a few ops of
/// each form.
#[test]
fn wider_variants_match_reference() {
    for vecs in [1u8, 2, 4] {
        let ctx = helios_vk::Context::from_env().unwrap();
        let binding = device().binding();
        // Read back through the copy kernel too (the default on discrete GPUs).
        let config = KernelConfig {
            binding,
            elementwise_vecs: Some(vecs),
            readback: Readback::Kernel,
            ..KernelConfig::default()
        };
        let d = Device::with_config(ctx, config);
        let cases = [
            Case::Unary(UnaryOp::Exp),
            Case::Binary(BinaryOp::Mul),
            Case::Scalar {
                op: BinaryOp::Sub,
                scalar_first: true,
            },
        ];
        // A whole number of tiles runs the exact variant (no bounds checks, no tail).
        let exact = 3 * 4 * 256 * vecs as usize;
        let operands = OperandLayout::Contiguous { len: exact };
        let kernel = d.elementwise_kernel(cases[1].op(), DType::F32, DType::F32, operands);
        assert!(kernel.name().ends_with("_exact"), "{}", kernel.name());
        for case in cases {
            for (i, n) in [1usize, 7, 1024 * 4 * vecs as usize + 3, 65536 + 1, exact]
                .into_iter()
                .enumerate()
            {
                for dtype in DType::ALL {
                    if let Some(f) = check_random(&d, case, dtype, n, 300 + i as u64).unwrap() {
                        panic!("vecs {vecs}: {f}");
                    }
                }
            }
        }
        let messages = d.validation_messages();
        assert!(
            messages.is_empty(),
            "validation messages:\n{}",
            messages.join("\n")
        );
    }
}

#[test]
fn ieee_arithmetic_on_special_values() {
    let d = device();
    let a = Tensor::from_vec1(
        d,
        &[1.0, -1.0, 0.0, f32::INFINITY, f32::INFINITY, f32::NAN, 3.0],
    )
    .unwrap();
    let b = Tensor::from_vec1(
        d,
        &[
            0.0,
            0.0,
            0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.0,
            f32::NAN,
        ],
    )
    .unwrap();
    let div = a.div(&b).unwrap().to_vec().unwrap();
    assert_eq!(div[0], f32::INFINITY);
    assert_eq!(div[1], f32::NEG_INFINITY);
    assert!(div[2].is_nan(), "0/0 is NaN");
    assert!(div[3].is_nan(), "inf/inf is NaN");
    assert!(
        div[5].is_nan() && div[6].is_nan(),
        "NaN propagates through division"
    );
    let add = a.add(&b).unwrap().to_vec().unwrap();
    assert_eq!(add[3], f32::INFINITY);
    assert!(add[4].is_nan(), "inf + -inf is NaN");
    let max = a.maximum(&b).unwrap().to_vec().unwrap();
    assert!(max[5].is_nan() && max[6].is_nan(), "max propagates NaN");
    let exp = a.exp().unwrap().to_vec().unwrap();
    assert_eq!(exp[3], f32::INFINITY);
    let neg_inf = Tensor::from_vec1(d, &[f32::NEG_INFINITY, -0.0]).unwrap();
    assert_eq!(neg_inf.exp().unwrap().to_vec().unwrap()[0], 0.0);
    assert_eq!(
        neg_inf.neg().unwrap().to_vec().unwrap()[1].to_bits(),
        0.0f32.to_bits()
    );
    assert_no_validation_messages();
}

#[test]
fn mismatched_shapes_are_errors() {
    let d = device();
    let a = Tensor::from_vec1(d, &[1.0, 2.0, 3.0]).unwrap();
    let b = Tensor::from_vec1(d, &[1.0, 2.0]).unwrap();
    for op in BinaryOp::ALL {
        match a.binary(op, &b) {
            Err(Error::ShapeMismatch { lhs, rhs, .. }) => {
                assert_eq!((lhs, rhs), (vec![3], vec![2]));
            }
            other => panic!("{op:?} on mismatched shapes gave {other:?}"),
        }
    }
    let c = Tensor::from_slice(d, &[1.0; 6], &[2, 3]).unwrap();
    let e = Tensor::from_slice(d, &[1.0; 6], &[3, 2]).unwrap();
    assert!(matches!(c.add(&e), Err(Error::ShapeMismatch { .. })));
    let h = Tensor::from_slice_as(d, &[1.0; 6], &[2, 3], DType::F16).unwrap();
    assert!(matches!(c.add(&h), Err(Error::DTypeMismatch { .. })));
    assert!(matches!(
        Tensor::from_slice(d, &[1.0; 5], &[2, 3]),
        Err(Error::DataLength {
            expected: 6,
            got: 5,
            ..
        })
    ));
    assert_no_validation_messages();
}

#[test]
fn chained_ops_and_shapes_round_trip() {
    let d = device();
    let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 3.0).collect();
    let x = Tensor::from_slice(d, &data, &[2, 3, 4]).unwrap();
    let y = x.mul_scalar(2.0).unwrap().add(&x).unwrap().relu().unwrap();
    assert_eq!(y.shape(), &[2, 3, 4]);
    let want: Vec<f32> = data.iter().map(|v| (v * 3.0).max(0.0)).collect();
    assert_eq!(y.to_vec().unwrap(), want);
    assert_no_validation_messages();
}

/// The activation gradients at points with known values, at their limits, and with NaN.
#[test]
fn activation_gradients_at_known_points() {
    let d = device();
    let x = Tensor::from_vec1(
        d,
        &[
            0.0,
            1.0,
            -1.0,
            30.0,
            -30.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            2.0,
        ],
    )
    .unwrap();
    let dy = Tensor::from_vec1(d, &[2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, f32::NAN]).unwrap();
    let relu = x.relu_backward(&dy).unwrap().to_vec().unwrap();
    assert_eq!(relu[..7], [0.0, 2.0, 0.0, 2.0, 0.0, 2.0, 0.0]);
    assert!(relu[7].is_nan() && relu[8].is_nan(), "NaN in, NaN out");
    let silu = x.silu_backward(&dy).unwrap().to_vec().unwrap();
    // silu'(0) = 1/2; silu'(1) = s(1 + 1 − s) with s = sigmoid(1).
    let s1 = 1.0 / (1.0 + (-1.0f64).exp());
    assert_eq!(silu[0], 1.0);
    assert!((f64::from(silu[1]) - 2.0 * s1 * (2.0 - s1)).abs() < 1e-6);
    // silu'(−30) = s(1 − 30(1 − s)) ≈ −29·e^−30: tiny and negative.
    let s30 = 1.0 / (1.0 + 30.0f64.exp());
    let want = 2.0 * s30 * (1.0 - 30.0 * (1.0 - s30));
    assert!(
        (f64::from(silu[4]) - want).abs() < 1e-17,
        "{} vs {want}",
        silu[4]
    );
    assert_eq!([silu[3], silu[5], silu[6]], [2.0, 2.0, 0.0]);
    assert!(silu[7].is_nan() && silu[8].is_nan(), "NaN in, NaN out");
    let gelu = x.gelu_tanh_backward(&dy).unwrap().to_vec().unwrap();
    assert_eq!(gelu[0], 1.0);
    assert!((gelu[1] - 2.0 * 1.082_964).abs() < 1e-5, "{}", gelu[1]);
    assert!((gelu[2] - 2.0 * -0.082_964).abs() < 1e-5, "{}", gelu[2]);
    assert_eq!(gelu[3..7], [2.0, 0.0, 2.0, 0.0]);
    assert!(gelu[7].is_nan() && gelu[8].is_nan(), "NaN in, NaN out");
    // dy broadcasts like any binary operand.
    let one = Tensor::from_slice(d, &[1.0], &[1]).unwrap();
    assert_eq!(x.relu_backward(&one).unwrap().to_vec().unwrap()[1], 1.0);
    assert_no_validation_messages();
}
