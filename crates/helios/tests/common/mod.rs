//! Shared by the integration tests: one device per test binary, and the validation check
//! every test ends with.

#![allow(dead_code)] // each test binary uses its own subset

pub mod grad;
pub mod graph;
pub mod matmul;

use std::sync::{Mutex, MutexGuard, OnceLock};

use helios::{Device, KernelConfig};
use proptest::prelude::*;

/// `lock` that recovers the guard of a poisoned mutex. The tests' locks only serialise
/// tests (they guard `()`), so a test that panicked while holding one poisoned nothing it
/// protects, and recovering keeps one failure from failing every later test of the binary.
pub trait LockExt<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The device the environment selects (lavapipe in CI), shared by a binary's tests.
pub fn device() -> &'static Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE.get_or_init(|| {
        let device = Device::from_env().expect("a Vulkan device (install mesa-vulkan-drivers)");
        skip_teardown_at_exit();
        device
    })
}

/// Has the process end, once the harness exits, without running the exit handlers and
/// static destructors registered before the first call, which follows the first device's
/// creation (glibc's `on_exit`; elsewhere nothing).
///
/// Why: the shared test device is never destroyed, so lavapipe's threads outlive the tests.
/// The teardown then destroyed the validation layer's statics while such a thread was
/// still freeing an LLVM JIT, and `helios --test matmul` crashed after its tests passed in
/// a few runs in twenty (session 29's core dumps). Registered after the device (and so
/// after the layer's destructors), this handler runs before them and leaves with the
/// harness's exit status, its output flushed.
fn skip_teardown_at_exit() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::ffi::{c_int, c_void};
        extern "C" {
            fn on_exit(f: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
            fn _exit(status: c_int) -> !;
        }
        extern "C" fn leave(status: c_int, _: *mut c_void) {
            use std::io::Write;
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            // SAFETY: ends the process at once; nothing runs after it.
            unsafe { _exit(status) }
        }
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a handler glibc calls once, at exit, with the exit status.
        ONCE.call_once(|| unsafe {
            on_exit(leave, std::ptr::null_mut());
        });
    }
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
    skip_teardown_at_exit();
    let config = f(Device::new(ctx.clone()).config());
    Device::with_config(ctx, config)
}

/// Row lengths for the row-kernel property tests: short rows (several per workgroup), rows
/// around a workgroup's width, and rows past 2048 and 8192 elements.
pub fn row_lengths() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..40, 40usize..1100, 2040usize..2100, 8190usize..8300]
}
