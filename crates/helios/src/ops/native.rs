//! Recording a native (PTX) kernel on NVIDIA, whatever its family: the driver's JIT on
//! first use (cached per kernel key), then a launch in the same encoder as the SPIR-V
//! dispatches, ordered by the same hazard tracking.

use helios_kernels::NativeLaunch;
use helios_vk::Access;

use crate::device::KernelKey;
use crate::{Error, Result};

/// The device's native target, or an error naming `what` that says what it needs.
pub(crate) fn target(device: &crate::Device, what: &str) -> Result<helios_ptx::Target> {
    device.native_target().ok_or_else(|| Error::Invalid {
        op: "native kernel",
        detail: format!(
            "{what} is a native NVIDIA kernel, and this device has none (VK_NVX_binary_import \
             with a Hopper GPU, HELIOS_NATIVE not 0)"
        ),
    })
}

/// Builds (once per `key`) and launches a native kernel.
pub(crate) fn record(
    device: &crate::Device,
    key: KernelKey,
    build: impl FnOnce() -> Result<helios_ptx::Module>,
    launch: &NativeLaunch,
    accesses: &[Access],
) -> Result<()> {
    let native = device.native_kernel(key, build, true)?;
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
