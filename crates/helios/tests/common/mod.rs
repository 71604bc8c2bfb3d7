//! Shared by the integration tests: one device per test binary, and the validation check
//! every test ends with.

#![allow(dead_code)] // each test binary uses its own subset

use std::sync::OnceLock;

use helios::Device;

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
