//! The native NVIDIA matmul kernels (PTX with `wgmma`, through VK_NVX_binary_import) against
//! the f64 CPU reference: every native variant in every transpose combination on shapes
//! whose tiles end inside the matrix, batched and strided, f16 and bf16 inputs, f32 and
//! narrow outputs, every epilogue. The figure checked is ‖out − ref‖ / ‖ref‖ against
//! `cpu::matmul::tolerance(out dtype)`. Runs where the device has native kernels (an
//! NVIDIA Hopper GPU); elsewhere it says it skipped, and checks that forcing a native
//! variant is a clear error. Run with `HELIOS_VALIDATION=1` like every test.

use helios::cpu::matmul::tolerance;
use helios::{
    matmul_caps, Activation, DType, MatmulOptions, MatmulOverrides, MatmulVariant, Tensor,
};
use helios_kernels::matmul::native_variants;

mod common;
use common::matmul::{Case, TRANS};
use common::{assert_no_validation_messages, device};

/// The shared `Case` for native variant `v` on `[batch, m, n, k]`.
fn case(v: MatmulVariant, dims: [usize; 4], trans: (bool, bool), input: DType) -> Case {
    let [batch, m, n, k] = dims;
    Case {
        trans,
        input,
        variant: Some(v),
        ..Case::new(batch, m, n, k)
    }
}

/// Whether the native kernel of `v` exists for these transposes (its tile's M/N-major
/// operands must come in whole swizzle atoms).
fn runs(
    v: MatmulVariant,
    trans: (bool, bool),
    input: DType,
    target: Option<helios_ptx::Target>,
) -> bool {
    helios_kernels::MatmulKernel {
        variant: v,
        input: input.storage(),
        out: input.storage(),
        trans_a: trans.0,
        trans_b: trans.1,
        vec_a: true,
        vec_b: true,
        vec_c: true,
        epilogue: helios_kernels::Epilogue::NONE,
        triangle: helios_kernels::Triangle::Full,
        subgroup: 0,
        exact_k: false,
    }
    .native_feasible(target)
}

/// Shapes whose contiguous extents are multiples of 8 (the 16-byte copies) for `trans`,
/// with every other extent odd where it may be, so tiles end inside the matrix; k both
/// under one k step and over several; and more output tiles than an H200 has SMs, so a
/// block walks several.
fn shapes(trans: (bool, bool)) -> [[usize; 4]; 4] {
    let m = if trans.0 { 200 } else { 197 };
    let n = if trans.1 { 197 } else { 264 };
    let big_m = if trans.0 { 2056 } else { 2051 };
    let big_n = if trans.1 { 2001 } else { 2008 };
    [
        [1, m, n, 136],
        [3, 72, 40, 24],
        [1, 264, 320, 520],
        [1, big_m, big_n, 40],
    ]
}

#[test]
fn native_variants_match_the_reference() {
    if matmul_caps(device()).native.is_none() {
        eprintln!(
            "SKIPPED native matmul: {} has no native kernels (VK_NVX_binary_import on a \
             Hopper GPU)",
            device().name()
        );
        let v = native_variants()[0];
        let a = Tensor::from_slice_as(device(), &[1.0; 64], &[8, 8], DType::BF16).unwrap();
        let err = a
            .matmul_overridden(
                &a,
                &MatmulOptions::default(),
                &MatmulOverrides {
                    variant: Some(v),
                    ..MatmulOverrides::default()
                },
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&v.label()) && err.contains("cannot run here"),
            "{err}"
        );
        assert_no_validation_messages();
        return;
    }
    let target = matmul_caps(device()).native;
    for (i, v) in native_variants().into_iter().enumerate() {
        for (j, trans) in TRANS.into_iter().enumerate() {
            let input = if (i + j) % 2 == 0 {
                DType::BF16
            } else {
                DType::F16
            };
            if !runs(v, trans, input, target) {
                eprintln!("{} has no {trans:?} form: skipped", v.label());
                continue;
            }
            for (s, dims) in shapes(trans).into_iter().enumerate() {
                // Stream-K takes one matrix (`native_stream_k_matches_the_reference`).
                if is_stream(v) && dims[0] > 1 {
                    continue;
                }
                let out = match s {
                    0 => DType::F32,
                    _ => input,
                };
                Case {
                    out,
                    alpha: if s == 1 { 0.5 } else { 1.0 },
                    ..case(v, dims, trans, input)
                }
                .check(1000 + (i * 16 + j * 4 + s) as u64);
            }
        }
    }
    assert_no_validation_messages();
}

fn is_stream(v: MatmulVariant) -> bool {
    matches!(v, MatmulVariant::Native(t) if t.stream)
}

/// Stream-K (`nv…sk`): tiles whose k steps are shared by dozens of blocks (4 tiles of 512 k
/// steps on the H200's 132 SMs), by two (187 tiles of 3), and fewer k steps than blocks
/// (k < one step); f32 and narrow outputs with every epilogue, which the block holding a
/// tile's first k steps applies to the sum of all parts. The parts are added in a fixed
/// order: the same product twice is the same bits.
#[test]
fn native_stream_k_matches_the_reference() {
    if matmul_caps(device()).native.is_none() {
        eprintln!("SKIPPED native stream-K: no native kernels on this device");
        return;
    }
    let target = matmul_caps(device()).native;
    let streams: Vec<MatmulVariant> = native_variants()
        .into_iter()
        .filter(|&v| is_stream(v))
        .collect();
    assert!(!streams.is_empty(), "the table has stream-K tiles");
    for (i, &v) in streams.iter().enumerate() {
        for (j, (trans, dims)) in [
            ((true, false), [1, 200, 264, 8192]),
            ((false, true), [1, 2051, 2001, 40]),
            ((false, false), [1, 197, 264, 8]),
            ((true, true), [1, 520, 776, 1000]),
        ]
        .into_iter()
        .enumerate()
        {
            let input = [DType::BF16, DType::F16][(i + j) % 2];
            if !runs(v, trans, input, target) {
                continue;
            }
            for (e, out) in [DType::F32, input].into_iter().enumerate() {
                let base = Case {
                    out,
                    ..case(v, dims, trans, input)
                };
                let seed = 5000 + (i * 100 + j * 10 + e) as u64;
                let tol = match (out, dims[3]) {
                    // As for the far rows: the tensor cores' f32 sums over k = 8192.
                    (DType::F32, k) if k > 4096 => 1e-4,
                    _ => tolerance(out),
                };
                base.check_within(seed, tol);
                Case {
                    bias: true,
                    act: Activation::GeluTanh,
                    residual: true,
                    alpha: 0.5,
                    ..base
                }
                .check_within(seed + 1, tol.max(tolerance(out)));
                Case {
                    residual: true,
                    act_grad: Activation::GeluTanh,
                    ..base
                }
                .check_within(seed + 2, tol.max(tolerance(out)));
            }
        }
        // The same product twice: the same bits.
        let a = Tensor::from_slice_as(
            device(),
            &common::matmul::random(200 * 8192, DType::BF16, 77),
            &[200, 8192],
            DType::BF16,
        )
        .unwrap();
        let b = Tensor::from_slice_as(
            device(),
            &common::matmul::random(8192 * 264, DType::BF16, 78),
            &[8192, 264],
            DType::BF16,
        )
        .unwrap();
        let forced = MatmulOverrides {
            variant: Some(v),
            ..MatmulOverrides::default()
        };
        let opts = MatmulOptions {
            out: Some(DType::F32),
            ..MatmulOptions::default()
        };
        let first = a
            .matmul_overridden(&b, &opts, &forced)
            .unwrap()
            .to_vec()
            .unwrap();
        for _ in 0..3 {
            let again = a
                .matmul_overridden(&b, &opts, &forced)
                .unwrap()
                .to_vec()
                .unwrap();
            assert!(
                first
                    .iter()
                    .zip(&again)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{}: two runs of one product differ",
                v.label()
            );
        }
    }
    assert_no_validation_messages();
}

/// Every epilogue (bias, GELU and ReLU, residual, an activation's gradient), on the first
/// variant in two transposes, f32 and narrow outputs.
#[test]
fn native_epilogues_match_the_reference() {
    if matmul_caps(device()).native.is_none() {
        eprintln!("SKIPPED native matmul epilogues: no native kernels on this device");
        return;
    }
    let v = native_variants()[0];
    for (j, trans) in [(false, true), (true, false)].into_iter().enumerate() {
        for input in [DType::BF16, DType::F16] {
            for out in [DType::F32, input] {
                let dims = [2, 136, 264, 200];
                let base = Case {
                    out,
                    ..case(v, dims, trans, input)
                };
                let seed = 2000 + j as u64 * 100;
                Case {
                    bias: true,
                    act: Activation::GeluTanh,
                    residual: true,
                    ..base
                }
                .check(seed);
                Case {
                    bias: true,
                    act: Activation::Relu,
                    ..base
                }
                .check(seed + 10);
                Case {
                    residual: true,
                    act_grad: Activation::GeluTanh,
                    ..base
                }
                .check(seed + 20);
                Case {
                    residual: true,
                    act_grad: Activation::Relu,
                    alpha: 0.25,
                    ..base
                }
                .check(seed + 30);
            }
        }
    }
    assert_no_validation_messages();
}

/// A row-major A with rows 64 KiB apart or more is copied transposed before the product
/// (`far_rows` in ops/matmul): the lm head's input gradient. Both inputs, f32 and narrow
/// outputs, with and without a k split.
#[test]
fn native_far_rows_match_the_reference() {
    if matmul_caps(device()).native.is_none() {
        eprintln!("SKIPPED native far rows: no native kernels on this device");
        return;
    }
    let v = native_variants()[0];
    for (i, (input, out, splits)) in [
        (DType::BF16, DType::F32, None),
        (DType::F16, DType::F16, None),
        (DType::BF16, DType::BF16, Some(3)),
    ]
    .into_iter()
    .enumerate()
    {
        // k = 33000 (rows 64 KiB apart): the tensor cores' f32 sums lose more than
        // `tolerance`'s √k·2⁻²⁴ allows at this length (3.7e-5 on the H200), so f32 outputs
        // take 1e-4; a misread layout is off by O(1).
        let tol = match out {
            DType::F32 => 1e-4,
            _ => tolerance(out),
        };
        Case {
            out,
            splits,
            ..case(v, [1, 304, 72, 33000], (false, false), input)
        }
        .check_within(4000 + i as u64, tol);
    }
    assert_no_validation_messages();
}

/// k split inside the launch (`MatmulShape::k_parts`): part counts that do not divide the k
/// tiles, as many parts as tiles, and the parts summed into f32 and narrow outputs.
#[test]
fn native_split_k_matches_the_reference() {
    if matmul_caps(device()).native.is_none() {
        eprintln!("SKIPPED native split-K: no native kernels on this device");
        return;
    }
    for (i, v) in native_variants().into_iter().take(2).enumerate() {
        for (j, trans) in [(true, false), (false, true)].into_iter().enumerate() {
            // k = 1000: 63 k tiles in 7 or 3 parts; k = 40: 3 tiles in 3 parts.
            for (s, (k, splits)) in [(1000, 7), (1000, 3), (40, 3)].into_iter().enumerate() {
                let input = if s % 2 == 0 { DType::BF16 } else { DType::F16 };
                let out = if j == 0 { DType::F32 } else { input };
                Case {
                    out,
                    splits: Some(splits),
                    ..case(v, [1, 264, 200, k], trans, input)
                }
                .check(3000 + (i * 16 + j * 4 + s) as u64);
            }
        }
    }
    assert_no_validation_messages();
}

/// A class whose first choice is a native kernel answers at once while the driver
/// JIT-compiles it, with a SPIR-V stand-in, then runs the native kernel: every product along
/// the way matches the f64 reference, and the choice, once native, stays native. (Whether a
/// stand-in is seen depends on how fast the JIT is; the test says which it saw.)
#[test]
fn native_first_choices_stand_in_until_compiled() {
    use helios::cpu::matmul::{matmul as reference, relative_error, MatmulRef};
    let dev = device();
    if matmul_caps(dev).native.is_none() || helios::tuning(dev) != helios::Tuning::Online {
        eprintln!("SKIPPED native stand-ins: no native kernels here, or tuning is not online");
        return;
    }
    // A shape no other test of the binary runs, so that its class starts here.
    let (m, n, k) = (1096, 1032, 520);
    let a_host = common::matmul::random(m * k, DType::BF16, 91);
    let b_host = common::matmul::random(k * n, DType::BF16, 92);
    let a = Tensor::from_slice_as(dev, &a_host, &[m, k], DType::BF16).unwrap();
    let b = Tensor::from_slice_as(dev, &b_host, &[k, n], DType::BF16).unwrap();
    let want = reference(&a_host, &b_host, &MatmulRef::plain(1, m, n, k));
    let opts = MatmulOptions::default();
    let mut seen = Vec::new();
    let started = std::time::Instant::now();
    loop {
        let choice = a.matmul_choice(&b, &opts).unwrap();
        let c = a.matmul(&b).unwrap();
        let err = relative_error(&c.to_vec().unwrap(), &want);
        assert!(
            err < tolerance(DType::BF16),
            "{}: error {err:.2e} over {:.1e}",
            choice.kernel,
            tolerance(DType::BF16)
        );
        let native = choice.variant.is_native();
        if seen.last().map(|(_, was): &(String, bool)| *was) == Some(true) {
            assert!(
                native,
                "the choice went back from native to {}",
                choice.kernel
            );
        }
        if seen.last().map(|(name, _)| name) != Some(&choice.kernel) {
            eprintln!(
                "{:?} after {:.3} s: {}",
                choice.how,
                started.elapsed().as_secs_f64(),
                choice.kernel
            );
            seen.push((choice.kernel.clone(), native));
        }
        if native {
            break;
        }
        assert!(
            started.elapsed().as_secs() < 120,
            "no native kernel after two minutes: {seen:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_no_validation_messages();
}
