//! Every native (PTX) kernel the matmul family can emit goes through `ptxas` for the target
//! it is built for, as every SPIR-V module goes through `spirv-val`: each variant in every
//! transpose, storage and epilogue, and the attention forward in every storage, head dim
//! and mask, without register spills.

use helios_kernels::attention::{AttentionKernel, AttnStage, NATIVE_EXPERIMENTS, NATIVE_VARIANTS};
use helios_kernels::matmul::native_variants;
use helios_kernels::{
    Activation, Epilogue, MatmulKernel, MatmulVariant as Variant, Storage, Triangle,
};
use helios_ptx::{ptxas, Target};

const FULL: Epilogue = Epilogue::forward(true, Activation::GeluTanh, true);

const SAVING_PRE: Epilogue = Epilogue::Forward {
    bias: true,
    act: Activation::GeluTanh,
    residual: false,
    store_pre: true,
};

const ACT_GRAD: Epilogue = Epilogue::ActGrad(Activation::GeluTanh);

const RELU: Epilogue = Epilogue::forward(true, Activation::Relu, false);

const TRANS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

fn kernel(
    variant: Variant,
    input: Storage,
    out: Storage,
    trans: (bool, bool),
    vec_c: bool,
    epilogue: Epilogue,
) -> MatmulKernel {
    MatmulKernel {
        variant,
        input,
        out,
        trans_a: trans.0,
        trans_b: trans.1,
        vec_a: true,
        vec_b: true,
        vec_c,
        epilogue,
        triangle: Triangle::Full,
        subgroup: 0,
        exact_k: false,
    }
}

fn check(k: &MatmulKernel) {
    if !k.native_feasible(Some(Target::SM90A)) {
        return;
    }
    let m = k
        .build_native(Target::SM90A)
        .unwrap_or_else(|e| panic!("{e}"));
    assemble(&m);
}

fn assemble(m: &helios_ptx::Module) {
    let report = ptxas(&m.name, &m.text, &Target::SM90A.name()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (report.spill_stores, report.spill_loads),
        (0, 0),
        "{} spills ({} registers):\n{:?}",
        m.name,
        report.registers,
        report.warnings
    );
    assert!(
        report.warnings.is_empty(),
        "{}: {:?}",
        m.name,
        report.warnings
    );
}

/// Every native variant in every transpose; the first also in every storage and epilogue.
#[test]
fn native_matmul_kernels_assemble() {
    let variants = native_variants();
    assert!(!variants.is_empty());
    for (i, &v) in variants.iter().enumerate() {
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
            if i == 0 {
                // Every epilogue into every output storage, the inputs and the output's
                // vector stores alternating (each module costs ptxas a few tenths of a second).
                let mut n = j;
                for out in Storage::ALL {
                    for ep in [Epilogue::NONE, FULL, ACT_GRAD, SAVING_PRE, RELU] {
                        let input = [Storage::F16, Storage::BF16][n % 2];
                        check(&kernel(v, input, out, trans, n % 3 != 0, ep));
                        n += 1;
                    }
                }
            }
        }
    }
}

/// A target without Hopper's architecture-specific instructions (`wgmma`, `setmaxnreg`) gets
/// an error naming the instruction, not a module its driver would reject.
#[test]
fn native_matmul_needs_wgmma() {
    let k = kernel(
        native_variants()[0],
        Storage::BF16,
        Storage::BF16,
        (false, true),
        true,
        Epilogue::NONE,
    );
    let err = k.build_native(Target::SM90).unwrap_err().to_string();
    assert!(
        (err.contains("wgmma") || err.contains("setmaxnreg")) && err.contains("which sm_90 does"),
        "{err}"
    );
}

/// Every native attention kernel that exists (forward, Dq, DkDv): each tile at the head
/// dims it takes, f16 and bf16, causal or not, with and without key padding, the backward's
/// packed outputs.
#[test]
fn native_attention_kernels_assemble() {
    let mut built = 0;
    for variant in NATIVE_VARIANTS.into_iter().chain(NATIVE_EXPERIMENTS) {
        for head_dim in [64, 128] {
            for (i, storage) in [Storage::BF16, Storage::F16].into_iter().enumerate() {
                for (causal, stage) in [true, false].into_iter().flat_map(|c| {
                    [AttnStage::Forward, AttnStage::Dq, AttnStage::DkDv].map(|s| (c, s))
                }) {
                    let k = AttentionKernel {
                        stage,
                        storage,
                        head_dim,
                        causal,
                        padded: causal == (i == 0),
                        variant,
                        binding: helios_spirv::Binding::DeviceAddress,
                        subgroup: 0,
                        frag: None,
                        pipelined: false,
                        own_dsum: false,
                        packed: stage != AttnStage::Forward && causal,
                    };
                    if !k.native_feasible(Some(Target::SM90A)) {
                        continue;
                    }
                    let m = k
                        .build_native(Target::SM90A)
                        .unwrap_or_else(|e| panic!("{e}"));
                    assemble(&m);
                    built += 1;
                }
            }
        }
    }
    assert!(built >= 8, "{built} native attention kernels");
}
