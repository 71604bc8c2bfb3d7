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
    assert_eq!(n, 2 * (2 + 3 * 2));
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
    assert_eq!(n, 2 * 4 * 3 * 4);
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
    assert_eq!(n, 2 * (2 * 3 * 2 + 5));
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
    assert_eq!(n, 2 * 3 * 3);
}
