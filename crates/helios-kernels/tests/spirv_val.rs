//! Every kernel the library can emit passes `spirv-val` for Vulkan 1.2 and 1.3.

use helios_kernels::{ElementwiseKernel, ELEMENTWISE_DTYPES};
use helios_spirv::{validate, Binding, TargetEnv};

#[test]
fn every_elementwise_kernel_validates() {
    let mut count = 0;
    for (binding, dtype) in [Binding::DeviceAddress, Binding::Descriptor]
        .into_iter()
        .flat_map(|b| ELEMENTWISE_DTYPES.map(|d| (b, d)))
    {
        for kernel in ElementwiseKernel::all(dtype, binding) {
            let m = kernel.build();
            for env in [TargetEnv::Vulkan1_2, TargetEnv::Vulkan1_3] {
                if let Err(e) = validate(&m.name, &m.words, env) {
                    panic!("{e}\n{}", m.disassemble());
                }
            }
            count += 1;
        }
    }
    assert_eq!(count, 2 * 3 * 3 * (12 + 3 * 7));
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
