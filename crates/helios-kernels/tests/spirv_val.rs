//! Every kernel the library can emit passes `spirv-val` for Vulkan 1.2 and 1.3.

use helios_kernels::{ElementwiseKernel, ELEMENTWISE_DTYPES};
use helios_spirv::{validate, Binding, TargetEnv};

/// Element-wise kernels of one binding model (two tests, so the harness runs them in
/// parallel): 3 storages × (36 ops and forms + 2 casts) × (6 vec4 + 6 strided variants).
fn elementwise_kernels_validate(binding: Binding) {
    let n: usize = ELEMENTWISE_DTYPES
        .into_iter()
        .map(|d| validate_all(ElementwiseKernel::all(d, binding).iter().map(|k| k.build())))
        .sum();
    let ops = 12 + 10 + 2 * 7;
    assert_eq!(n, 3 * (ops + 2) * (3 * 2 + 6));
}

#[test]
fn every_elementwise_kernel_validates_with_addresses() {
    elementwise_kernels_validate(Binding::DeviceAddress);
}

#[test]
fn every_elementwise_kernel_validates_with_descriptors() {
    elementwise_kernels_validate(Binding::Descriptor);
}

/// Validates every module of `modules` for Vulkan 1.2 and 1.3; returns how many.
fn validate_all(modules: impl IntoIterator<Item = helios_spirv::KernelModule>) -> usize {
    let mut count = 0;
    for m in modules {
        for env in [TargetEnv::Vulkan1_2, TargetEnv::Vulkan1_3] {
            if let Err(e) = validate(&m.name, &m.words, env) {
                panic!("{e}\n{}", m.disassemble());
            }
        }
        count += 1;
    }
    count
}

#[test]
fn every_cross_entropy_kernel_validates() {
    let n: usize = [Binding::DeviceAddress, Binding::Descriptor]
        .into_iter()
        .map(|b| {
            validate_all(
                helios_kernels::CrossEntropyKernel::all(b)
                    .iter()
                    .map(|k| k.build()),
            )
        })
        .sum();
    assert_eq!(n, 2 * 2 * (2 + 3 * 4));
}

#[test]
fn every_reduce_kernel_validates() {
    let n: usize = [Binding::DeviceAddress, Binding::Descriptor]
        .into_iter()
        .map(|b| {
            validate_all(
                helios_kernels::reduce::ReduceKernel::samples(b)
                    .iter()
                    .map(|k| k.build()),
            )
        })
        .sum();
    // Per binding: 4 ops × 3 stages × 4 layouts, 2 two-output combines, and 2 prologues ×
    // 2 stages × 2 layouts, each stored or not.
    assert_eq!(n, 2 * (4 * 3 * 4 + 2 + 2 * 2 * 2 * 2));
}

#[test]
fn every_embedding_kernel_validates() {
    let n: usize = [Binding::DeviceAddress, Binding::Descriptor]
        .into_iter()
        .map(|b| {
            validate_all(
                helios_kernels::EmbeddingKernel::all(b)
                    .iter()
                    .map(|k| k.build()),
            )
        })
        .sum();
    assert_eq!(n, 2 * (3 * (2 + 5 + 3 * 3) + 5));
}

#[test]
fn every_adamw_kernel_validates() {
    let n: usize = [Binding::DeviceAddress, Binding::Descriptor]
        .into_iter()
        .map(|b| {
            validate_all(
                helios_kernels::AdamWKernel::all(b)
                    .iter()
                    .map(|k| k.build()),
            )
        })
        .sum();
    assert_eq!(n, 2 * 3 * 3 * 2);
}

/// The multi-tensor sum of squares: addresses read from a table become pointers.
#[test]
fn every_sum_squares_kernel_validates() {
    let kernels = helios_kernels::SumSquaresKernel::samples();
    assert_eq!(validate_all(kernels.iter().map(|k| k.build())), 3 * 2);
}

/// The multi-tensor copy: two addresses a table entry.
#[test]
fn every_copy_many_kernel_validates() {
    let kernels = helios_kernels::CopyManyKernel::samples();
    assert_eq!(validate_all(kernels.iter().map(|k| k.build())), 3);
}

/// The tiled transpose, every storage, both binding models.
#[test]
fn every_transpose_kernel_validates() {
    let kernels = helios_kernels::TransposeKernel::samples();
    assert_eq!(validate_all(kernels.iter().map(|k| k.build())), 2 * 3);
}

mod matmul {
    use helios_kernels::matmul::{
        Activation, Epilogue, MatmulKernel, RowOp, Triangle, Variant, VARIANTS,
    };
    use helios_kernels::{CoopPeakKernel, Storage};
    use helios_spirv::{validate, TargetEnv};

    const FULL: Epilogue = Epilogue::forward(true, Activation::GeluTanh, true);

    /// A linear layer's forward under autograd: the GELU and its input, both stored.
    const SAVING_PRE: Epilogue = Epilogue::Forward {
        bias: true,
        act: Activation::GeluTanh,
        residual: false,
        store_pre: true,
    };

    /// A linear layer's GELU backward in the next layer's input-gradient product.
    const ACT_GRAD: Epilogue = Epilogue::ActGrad(Activation::GeluTanh);

    /// A linear layer's weight gradient with its bias gradient (SIMT only).
    const COL_SUMS: Epilogue = Epilogue::ColSums;

    /// Attention's softmax steps (see `RowOp`).
    const ROW_OPS: [Epilogue; 2] = [
        Epilogue::Row {
            op: RowOp::Exp,
            bias: false,
        },
        Epilogue::Row {
            op: RowOp::SoftmaxGrad,
            bias: false,
        },
    ];

    fn kernel(
        variant: Variant,
        input: Storage,
        out: Storage,
        trans: (bool, bool),
        vec: bool,
        epilogue: Epilogue,
    ) -> MatmulKernel {
        MatmulKernel {
            variant,
            input,
            out,
            trans_a: trans.0,
            trans_b: trans.1,
            vec_a: vec,
            vec_b: vec,
            vec_c: vec,
            epilogue,
            triangle: Triangle::Full,
            subgroup: if variant.is_coop() { 32 } else { 0 },
            exact_k: false,
        }
    }

    /// Each skipped triangle (causal attention's products).
    const TRIANGLES: [Triangle; 3] = [Triangle::LowerC, Triangle::LowerA, Triangle::UpperA];

    fn check(k: &MatmulKernel) {
        let m = k.build();
        for env in [TargetEnv::Vulkan1_2, TargetEnv::Vulkan1_3] {
            if let Err(e) = validate(&m.name, &m.words, env) {
                panic!("{e}\n{}", m.disassemble());
            }
        }
    }

    const TRANS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

    /// Every SIMT variant in every transpose combination; the first one also in every
    /// storage, alignment and epilogue.
    #[test]
    fn simt_kernels_validate() {
        let simt: Vec<Variant> = VARIANTS
            .iter()
            .map(|(_, v)| *v)
            .filter(|v| matches!(v, Variant::Simt(_)))
            .collect();
        for (i, &v) in simt.iter().enumerate() {
            for (j, trans) in TRANS.into_iter().enumerate() {
                check(&kernel(v, Storage::F32, Storage::F32, trans, true, FULL));
                check(&kernel(
                    v,
                    Storage::F32,
                    Storage::F32,
                    trans,
                    j % 2 == 0,
                    COL_SUMS,
                ));
                // Whole loop steps in k (no k clamps or masks), aligned and not.
                let mut exact = kernel(v, Storage::F32, Storage::F32, trans, j % 2 == 0, FULL);
                exact.exact_k = true;
                check(&exact);
                let mut tri = kernel(
                    v,
                    Storage::F32,
                    Storage::F32,
                    trans,
                    j % 2 == 0,
                    ROW_OPS[(i + j) % 2],
                );
                tri.triangle = TRIANGLES[(i + j) % 3];
                check(&tri);
                if i == 0 {
                    for input in Storage::ALL {
                        for out in Storage::ALL {
                            for vec in [false, true] {
                                for ep in [Epilogue::NONE, FULL, ACT_GRAD, SAVING_PRE, COL_SUMS] {
                                    check(&kernel(v, input, out, trans, vec, ep));
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every few-row variant in every transpose, storage, alignment and epilogue they take
    /// (no triangles, no column sums).
    #[test]
    fn rows_kernels_validate() {
        let rows = VARIANTS
            .iter()
            .map(|(_, v)| *v)
            .filter(|v| matches!(v, Variant::Rows(_)));
        for v in rows {
            for trans in TRANS {
                for input in Storage::ALL {
                    for vec in [false, true] {
                        for ep in [Epilogue::NONE, FULL, ACT_GRAD, SAVING_PRE, ROW_OPS[1]] {
                            check(&kernel(v, input, Storage::BF16, trans, vec, ep));
                        }
                        check(&kernel(v, input, Storage::F32, trans, vec, FULL));
                    }
                }
            }
        }
    }

    /// Every cooperative variant (f16 and bf16 fragments) and the peak kernel.
    #[test]
    fn coop_kernels_validate() {
        let coop: Vec<Variant> = VARIANTS
            .iter()
            .map(|(_, v)| *v)
            .filter(|v| v.is_coop())
            .collect();
        for (i, &v) in coop.iter().enumerate() {
            if matches!(v, Variant::Wg(_)) {
                // Workgroup scope: aligned operands and the plain epilogue only, every
                // storage.
                let tensor = matches!(v, Variant::Wg(t) if t.tensor);
                let inputs: &[Storage] = if tensor {
                    &[Storage::F16]
                } else {
                    &[Storage::F16, Storage::BF16]
                };
                for trans in TRANS {
                    for &input in inputs {
                        for out in Storage::ALL {
                            let k = kernel(v, input, out, trans, true, Epilogue::NONE);
                            if tensor {
                                // SPIR-V 1.6: Vulkan 1.3 only.
                                let m = k.build();
                                if let Err(e) = validate(&m.name, &m.words, TargetEnv::Vulkan1_3) {
                                    panic!("{e}");
                                }
                            } else {
                                check(&k);
                            }
                        }
                    }
                }
                continue;
            }
            for (j, trans) in TRANS.into_iter().enumerate() {
                let mut k = kernel(v, Storage::F16, Storage::F16, trans, true, Epilogue::NONE);
                check(&k);
                let mut exact = kernel(v, Storage::BF16, Storage::F32, trans, j % 2 == 0, FULL);
                exact.exact_k = true;
                check(&exact);
                // Cooperative tiles take no triangular A (they do not mask it).
                k.triangle = Triangle::LowerC;
                k.epilogue = ROW_OPS[i % 2];
                check(&k);
                if i == 0 {
                    for input in [Storage::F16, Storage::BF16] {
                        for out in Storage::ALL {
                            for vec in [false, true] {
                                for ep in [Epilogue::NONE, FULL, ACT_GRAD, SAVING_PRE] {
                                    check(&kernel(v, input, out, trans, vec, ep));
                                }
                            }
                        }
                    }
                }
            }
        }
        // Tiles outside the table (`Variant::parse`), with 12 and 16 subgroups: the epilogue
        // scratch of some lives in the B stages.
        for name in [
            "coop128x256w2x8k32s1",
            "coop256x128w4x4k16d1",
            "coop128x192w2x6k32d1",
        ] {
            let v = Variant::parse(name).expect("a cooperative tile");
            for (j, trans) in TRANS.into_iter().enumerate() {
                check(&kernel(
                    v,
                    Storage::BF16,
                    Storage::BF16,
                    trans,
                    true,
                    Epilogue::NONE,
                ));
                check(&kernel(
                    v,
                    Storage::F16,
                    Storage::F32,
                    trans,
                    j % 2 == 0,
                    FULL,
                ));
            }
        }
        for input in [Storage::F16, Storage::BF16] {
            let k = CoopPeakKernel {
                input,
                frags: 4,
                subgroups: 4,
                subgroup: 32,
            };
            let m = k.build();
            if let Err(e) = validate(&m.name, &m.words, TargetEnv::Vulkan1_3) {
                panic!("{e}");
            }
        }
    }
}

#[test]
fn every_softmax_kernel_validates() {
    let n: usize = [Binding::DeviceAddress, Binding::Descriptor]
        .into_iter()
        .map(|b| {
            validate_all(
                helios_kernels::softmax::SoftmaxKernel::samples(b)
                    .iter()
                    .map(|k| k.build()),
            )
        })
        .sum();
    assert_eq!(n, 2 * 3 * 4);
}

#[test]
fn every_norm_kernel_validates() {
    use helios_kernels::norm::{NormKernel, NormParamKernel};
    let n: usize = [Binding::DeviceAddress, Binding::Descriptor]
        .into_iter()
        .map(|b| {
            validate_all(NormKernel::samples(b).iter().map(|k| k.build()))
                + validate_all(NormParamKernel::samples(b).iter().map(|k| k.build()))
        })
        .sum();
    assert_eq!(n, 2 * (3 * 2 * 2 + 2));
}

/// Every attention stage, storage and head dim of the SIMT family, both binding models;
/// `Prep` also with subgroup shuffles.
#[test]
fn every_attention_kernel_validates() {
    let n: usize = [Binding::DeviceAddress, Binding::Descriptor]
        .into_iter()
        .map(|b| {
            validate_all(
                helios_kernels::AttentionKernel::samples(b)
                    .iter()
                    .map(|k| k.build()),
            )
        })
        .sum();
    // Every stage, Prep with shuffles too, Dq and DkDv writing a packed gradient too.
    assert_eq!(n, 2 * 5 * 3 * (4 + 1 + 2));
}

/// Decoding attention: every stage and storage, both binding models, `Split` for head dims
/// 16 to 256, two of them no multiple of 4.
#[test]
fn every_decode_attention_kernel_validates() {
    let kernels = helios_kernels::DecodeKernel::samples();
    assert_eq!(
        validate_all(kernels.iter().map(|k| k.build())),
        2 * 3 * (7 + 2)
    );
}

/// The cooperative attention kernels (f16 and bf16 fragments; scores in shared memory and in
/// registers), for Vulkan 1.3.
#[test]
fn every_coop_attention_kernel_validates() {
    let mut n = 0;
    for kern in helios_kernels::AttentionKernel::coop_samples() {
        let m = kern.build();
        if let Err(e) = validate(&m.name, &m.words, TargetEnv::Vulkan1_3) {
            panic!("{e}\n{}", m.disassemble());
        }
        n += 1;
    }
    // Every stage of both families, the register forward pipelined and with row-tile pairs
    // (plain and pipelined), the register Dq computing Dsum itself, and both families' Dq and
    // DkDv writing a packed gradient.
    assert_eq!(n, 5 * 2 * (4 * 2 + 3 + 1 + 4));
}
