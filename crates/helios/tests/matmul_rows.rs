//! The few-row kernels (`rows`, decoding's products) on the Vulkan device present (lavapipe
//! in CI) against the f64 CPU reference: every tile of the table in every transpose, rows
//! from one to more than a tile's, odd and aligned columns, k past one pass of the
//! workgroup's invocations (the unrolled loop's tail) and not a multiple of a chunk, each
//! input storage, batches, and the fused epilogues. The figure checked is ‖out − ref‖ /
//! ‖ref‖ against `cpu::matmul::tolerance(out dtype)`. Run with `HELIOS_VALIDATION=1`; every
//! test fails on any validation message.

use helios::{matmul_caps, Activation, DType, MatmulOptions, MatmulOverrides, MatmulVariant};

mod common;
use common::matmul::{operand, random, Case, TRANS};
use common::{assert_no_validation_messages, device};

fn rows_variants() -> Vec<MatmulVariant> {
    helios_kernels::matmul::VARIANTS
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| matches!(v, MatmulVariant::Rows(_)))
        .collect()
}

/// Whether the device runs them (subgroup arithmetic); says so when not.
fn runs_rows() -> bool {
    let ok = matmul_caps(device()).subgroup_add;
    if !ok {
        eprintln!(
            "SKIPPED few-row matmul: {} has no subgroup arithmetic in compute shaders",
            device().name()
        );
    }
    ok
}

#[test]
fn every_rows_tile_and_transpose() {
    if !runs_rows() {
        return;
    }
    for (i, v) in rows_variants().into_iter().enumerate() {
        for (j, trans) in TRANS.into_iter().enumerate() {
            // Odd everything (scalar loads, a k tail in a chunk), then aligned (vector loads)
            // with k past one pass of 256 invocations' unrolled loads.
            for &(m, n, k) in &[(1, 37, 29), (3, 70, 133), (9, 64, 1100), (2, 40, 4200)] {
                Case {
                    trans,
                    variant: Some(v),
                    ..Case::new(1, m, n, k)
                }
                .check(1500 + (i * 16 + j * 4) as u64 + k as u64);
            }
        }
    }
    assert_no_validation_messages();
}

/// f16 and bf16 inputs (32 bytes a load are 16 elements) into each output storage, batched
/// strides, and the epilogues decoding uses (bias, GELU, residual) and a backward's.
#[test]
fn rows_storages_batches_and_epilogues() {
    if !runs_rows() {
        return;
    }
    for (i, v) in rows_variants().into_iter().enumerate() {
        for (j, input) in [DType::F16, DType::BF16, DType::F32]
            .into_iter()
            .enumerate()
        {
            let trans = TRANS[(i + j) % 4];
            Case {
                input,
                out: DType::ALL[(i + j) % 3],
                trans,
                variant: Some(v),
                ..Case::new(2, 5, 96, 520)
            }
            .check(1700 + (i * 3 + j) as u64);
            Case {
                input,
                out: input,
                bias: true,
                act: Activation::GeluTanh,
                residual: true,
                alpha: 0.75,
                trans,
                variant: Some(v),
                ..Case::new(1, 8, 72, 200)
            }
            .check(1750 + (i * 3 + j) as u64);
        }
        Case {
            residual: true,
            act_grad: Activation::GeluTanh,
            variant: Some(v),
            ..Case::new(1, 4, 33, 77)
        }
        .check(1790 + i as u64);
    }
    assert_no_validation_messages();
}

/// A forced few-row tile runs as itself (the kernel's name says so), and the tuner's
/// candidates hold the few-row tiles only for products of few rows.
#[test]
fn rows_tiles_run_as_named_and_only_for_few_rows() {
    if !runs_rows() {
        return;
    }
    let v = MatmulVariant::parse("rows1x8").expect("a rows tile");
    let a = operand(&random(300, DType::F32, 1), [1, 1, 300], false, DType::F32);
    let b = operand(
        &random(300 * 40, DType::F32, 2),
        [1, 300, 40],
        false,
        DType::F32,
    );
    let opts = MatmulOverrides {
        variant: Some(v),
        ..Default::default()
    };
    let choice = a
        .matmul_choice_overridden(&b, &MatmulOptions::default(), &opts)
        .unwrap();
    assert!(
        choice.kernel.starts_with("mm_rows1x8_"),
        "{}",
        choice.kernel
    );
    let caps = matmul_caps(device());
    let candidates = |m: u32| {
        let shape = helios_kernels::MatmulShape::packed(1, m, 512, 512, false, false);
        helios_kernels::matmul::candidates(
            helios_kernels::Storage::F32,
            helios_kernels::Storage::F32,
            (false, false),
            &shape,
            helios_kernels::Epilogue::NONE,
            &caps,
        )
    };
    let names = |m: u32| {
        candidates(m)
            .into_iter()
            .filter(|k| matches!(k.variant, MatmulVariant::Rows(_)))
            .map(|k| k.variant.label())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(1).len(), rows_variants().len(), "{:?}", names(1));
    assert_eq!(names(16), ["rows8x8", "rows8x16"]);
    assert!(names(17).is_empty(), "{:?}", names(17));
    // Tiles of 128 rows are candidates only past 16 rows.
    let tall = |m: u32| candidates(m).iter().any(|k| k.variant.tile().0 >= 128);
    assert!(!tall(16) && tall(17));
    assert_no_validation_messages();
}
