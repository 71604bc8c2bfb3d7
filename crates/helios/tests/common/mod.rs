//! Shared by the integration tests: one device per test binary, and the validation check
//! every test ends with.

#![allow(dead_code)] // each test binary uses its own subset

use std::sync::OnceLock;

use helios::{Device, KernelConfig};
use proptest::prelude::*;

/// The device the environment selects (lavapipe in CI), shared by a binary's tests.
pub fn device() -> &'static Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE
        .get_or_init(|| Device::from_env().expect("a Vulkan device (install mesa-vulkan-drivers)"))
}

/// Fails on any validation message `d` has collected.
#[track_caller]
pub fn assert_clean(d: &Device) {
    let m = d.validation_messages();
    assert!(m.is_empty(), "validation messages:\n{}", m.join("\n"));
}

/// Fails on any validation message of the shared device.
#[track_caller]
pub fn assert_no_validation_messages() {
    assert_clean(device());
}

/// Another device on the environment's Vulkan device, its kernel configuration `f` of the
/// default one (the same cases with subgroups off, a row variant forced, ...).
pub fn device_with(f: impl FnOnce(KernelConfig) -> KernelConfig) -> Device {
    let ctx =
        helios_vk::Context::from_env().expect("a Vulkan device (install mesa-vulkan-drivers)");
    let config = f(Device::new(ctx.clone()).config());
    Device::with_config(ctx, config)
}

/// Row lengths for the row-kernel property tests: short rows (several per workgroup), rows
/// around a workgroup's width, and rows past 2048 and 8192 elements.
pub fn row_lengths() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..40, 40usize..1100, 2040usize..2100, 8190usize..8300]
}
