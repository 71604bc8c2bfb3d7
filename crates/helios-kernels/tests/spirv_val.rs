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
