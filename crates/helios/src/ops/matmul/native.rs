//! Recording a native (PTX) matmul kernel on NVIDIA (`ops::native` does the launch).

use helios_kernels::{MatmulAddresses, MatmulKernel, MatmulShape};
use helios_vk::Access;

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
    let target = crate::ops::native::target(device, &kernel.variant.label())?;
    let launch = kernel.native_launch(s, addr, alpha, device.context().caps().sm_count)?;
    crate::ops::native::record(
        device,
        KernelKey::Matmul(*kernel),
        || Ok(kernel.build_native(target)?),
        &launch,
        accesses,
    )
}
