//! The one error type of helios-vk.
//!
//! Every failure a caller cannot rule out in advance (no driver, no device, out of memory, a
//! lost device, a bad argument from user input) is a value of `Error` whose message says what
//! to do next. Raw `vk::Result`s are wrapped with the name of the call that produced them, and
//! the two results a user can act on (out of memory, device lost) get their own variants.

use ash::vk;

/// `Result` with helios-vk's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

const INSTALL_HINT: &str = "install the Vulkan loader and a driver: on Debian/Ubuntu \
     `apt-get install libvulkan1`, plus `mesa-vulkan-drivers` on a machine without a GPU \
     (it provides lavapipe, a CPU Vulkan driver)";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the Vulkan loader (libvulkan.so.1) could not be loaded ({detail}); {}",
        INSTALL_HINT
    )]
    LoaderMissing { detail: String },

    #[error("no Vulkan device found; {}", INSTALL_HINT)]
    NoDevice,

    #[error(
        "{what} supports Vulkan {found} but Helios needs at least Vulkan {needed}; \
         update the Vulkan loader and GPU driver (on Debian/Ubuntu: libvulkan1, mesa-vulkan-drivers)"
    )]
    VersionTooOld {
        what: &'static str,
        found: String,
        needed: &'static str,
    },

    #[error(
        "HELIOS_VALIDATION=1 needs the layer VK_LAYER_KHRONOS_validation, which is not installed; \
         install it (Debian/Ubuntu: `apt-get install vulkan-validationlayers`) or unset HELIOS_VALIDATION"
    )]
    ValidationLayerMissing,

    #[error(
        "HELIOS_VALIDATION=1 needs instance extension {0}, which the loader does not offer; \
         update libvulkan1 and vulkan-validationlayers or unset HELIOS_VALIDATION"
    )]
    ValidationExtensionMissing(&'static str),

    #[error("environment variable {name}={value:?} is not valid: {expected}")]
    BadEnvVar {
        name: &'static str,
        value: String,
        expected: &'static str,
    },

    #[error("no Vulkan device matches HELIOS_DEVICE={selector:?}; available devices:\n{available}\nset HELIOS_DEVICE to an index or a part of a name above")]
    NoMatchingDevice { selector: String, available: String },

    #[error("device {device:?} cannot run Helios: it lacks {missing}; pick another device with HELIOS_DEVICE or update its driver")]
    DeviceUnsupported { device: String, missing: String },

    #[error("the adapter passed to Context::new was enumerated from a different Instance; use an adapter from the same Instance")]
    ForeignAdapter,

    #[error("{what} was created on a different Context; use objects of one Context together")]
    ForeignObject { what: &'static str },

    #[error(
        "out of {kind} memory allocating {requested} bytes for a {location} buffer; \
         free buffers that are no longer needed or use smaller sizes"
    )]
    OutOfMemory {
        kind: &'static str,
        requested: u64,
        location: &'static str,
    },

    #[error(
        "out of {kind} memory: {requested} bytes asked for a {location} buffer while Helios holds \
         {held} bytes ({in_use} in live buffers) after returning its cache to the driver; \
         drop tensors that are no longer needed or use smaller sizes"
    )]
    PoolOutOfMemory {
        kind: &'static str,
        requested: u64,
        location: &'static str,
        held: u64,
        in_use: u64,
    },

    #[error("a Context method was called from inside a recording closure on the same thread; record only through the Recorder there")]
    Reentrant,

    #[error("buffer of {requested} bytes exceeds the device limit of {limit} bytes ({limit_name}); split the data over several buffers")]
    BufferTooLarge {
        requested: u64,
        limit: u64,
        limit_name: &'static str,
    },

    #[error("no memory type on this device suits a {location} buffer")]
    NoMemoryType { location: &'static str },

    #[error("{what}: range [{offset}, {offset}+{len}) is outside a buffer of {size} bytes")]
    OutOfRange {
        what: &'static str,
        offset: u64,
        len: u64,
        size: u64,
    },

    #[error("copy_buffer: source and destination ranges overlap in the same buffer; copy through a second buffer")]
    OverlappingCopy,

    #[error("pipeline {pipeline:?}: {detail}")]
    InvalidPipeline { pipeline: String, detail: String },

    #[error("dispatch of {pipeline:?}: {detail}")]
    InvalidDispatch { pipeline: String, detail: String },

    #[error("native kernels are unavailable on {device:?}: {reason}; use SPIR-V kernels there")]
    NativeUnavailable { device: String, reason: String },

    #[error(
        "native kernel {kernel:?}: the driver rejected the PTX ({call} returned {result}, \
         and the driver gives no diagnostics); run `ptxas` on the module (e.g. \
         `ptxas -arch=sm_90 {kernel}.ptx`) to see why, and check that it defines `.entry {entry}`"
    )]
    NativeRejected {
        kernel: String,
        entry: String,
        call: &'static str,
        result: vk::Result,
    },

    #[error("native launch of {kernel:?}: {detail}")]
    InvalidLaunch { kernel: String, detail: String },

    #[error(
        "{what} cannot be shared on {device:?}: {reason}; share through the host instead, or \
         use a device whose driver offers it (NVIDIA's does)"
    )]
    ExportUnsupported {
        what: &'static str,
        device: String,
        reason: String,
    },

    #[error("{what}: offset {offset} is not a multiple of {align} bytes; place regions at aligned offsets")]
    Misaligned {
        what: &'static str,
        offset: u64,
        align: u64,
    },

    #[error(
        "{what} {value} on an external timeline already at (or promised) {current}: timeline \
         values only increase; use a larger value"
    )]
    TimelineValue {
        what: &'static str,
        value: u64,
        current: u64,
    },

    #[error("wait for timeline value {value}, but only {last_submitted} has been submitted; wait for a value returned by submit()")]
    WaitOnUnsubmitted { value: u64, last_submitted: u64 },

    #[error(
        "could not write the pipeline cache file {}: {source}; make that directory writable, \
         point HELIOS_CACHE_DIR elsewhere, or set HELIOS_PIPELINE_CACHE=0",
        path.display()
    )]
    PipelineCacheIo {
        path: std::path::PathBuf,
        source: std::io::Error,
    },

    #[error("the Vulkan device was lost (driver crash, GPU reset or a kernel that ran too long); restart the process")]
    DeviceLost,

    #[error("{call} failed: {result}")]
    Vk {
        call: &'static str,
        result: vk::Result,
    },
}

impl Error {
    /// Wraps a failed call, mapping the results a user can act on to their own variants.
    pub(crate) fn vk(call: &'static str, result: vk::Result) -> Self {
        match result {
            vk::Result::ERROR_DEVICE_LOST => Error::DeviceLost,
            _ => Error::Vk { call, result },
        }
    }
}

/// `map_err` helper: `.map_err(vk_err("vkCreateBuffer"))`.
pub(crate) fn vk_err(call: &'static str) -> impl Fn(vk::Result) -> Error {
    move |result| Error::vk(call, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_errors_name_the_packages() {
        for e in [
            Error::LoaderMissing {
                detail: "libvulkan.so.1: cannot open shared object file".into(),
            },
            Error::NoDevice,
        ] {
            let text = e.to_string();
            assert!(text.contains("libvulkan1"), "{text}");
            assert!(text.contains("mesa-vulkan-drivers"), "{text}");
        }
        assert!(Error::ValidationLayerMissing
            .to_string()
            .contains("vulkan-validationlayers"));
        assert!(matches!(
            Error::vk("x", vk::Result::ERROR_DEVICE_LOST),
            Error::DeviceLost
        ));
    }
}
