//! Recording a native (PTX) matmul kernel on NVIDIA: the driver's JIT on first use, then a
//! launch in the same encoder as the SPIR-V dispatches.

use helios_kernels::{MatmulAddresses, MatmulKernel, MatmulShape};
use helios_vk::Access;

use super::invalid;
use crate::device::KernelKey;
use crate::Result;

/// Records a native (PTX) matmul kernel: the driver's JIT on first use, then a launch in
/// the same encoder as the SPIR-V dispatches.
pub(super) fn record_native(
    device: &crate::Device,
    kernel: &MatmulKernel,
    s: &MatmulShape,
    addr: &MatmulAddresses,
    alpha: f32,
    accesses: &[Access],
) -> Result<()> {
    let target = device.native_target().ok_or_else(|| {
        invalid(format!(
            "{} is a native NVIDIA kernel, and this device has none (VK_NVX_binary_import \
             with a Hopper GPU, HELIOS_NATIVE not 0)",
            kernel.variant.label()
        ))
    })?;
    let native = device.native_kernel(KernelKey::Matmul(*kernel), || {
        Ok(kernel.build_native(target)?)
    })?;
    let launch = kernel.native_launch(s, addr, alpha, device.context().caps().sm_count)?;
    let args: smallvec::SmallVec<[helios_vk::NativeArg; 24]> = launch
        .args
        .iter()
        .map(|a| match *a {
            helios_kernels::Arg::Address(v) => helios_vk::NativeArg::U64(v),
            helios_kernels::Arg::U32(v) => helios_vk::NativeArg::U32(v),
            helios_kernels::Arg::I32(v) => helios_vk::NativeArg::I32(v),
            helios_kernels::Arg::F32(v) => helios_vk::NativeArg::F32(v),
        })
        .collect();
    device
        .context()
        .launch_native(&native, launch.grid, launch.block, 0, &args, accesses)?;
    Ok(())
}
