//! The device core: the logical device and what was fixed when it was made (extension entry
//! points, enabled features, queue families, memory types), with the pipeline cache, the
//! profiler and the debug names. The parts of a Context take this instead of the Context.

use ash::vk;
use std::sync::Arc;

use crate::adapter::Adapter;
use crate::caps::Caps;
use crate::executable::ExecutableCapture;
use crate::features::EnabledFeatures;
use crate::instance::Instance;
use crate::pipeline_cache::PipelineCache;
use crate::profile::Profiler;

/// Built and torn down by the Context that holds it (context.rs), which destroys the device.
pub(crate) struct Core {
    pub(crate) instance: Arc<Instance>,
    pub(crate) adapter: Adapter,
    pub(crate) device: ash::Device,
    /// Names objects for validation messages when validation is on.
    pub(crate) debug_utils: Option<ash::ext::debug_utils::Device>,
    /// VK_KHR_push_descriptor entry points, when enabled (the descriptor binding model).
    pub(crate) push_descriptor: Option<ash::khr::push_descriptor::Device>,
    /// VK_KHR_pipeline_executable_properties entry points, when statistics are captured.
    pub(crate) pipeline_executable: Option<ash::khr::pipeline_executable_properties::Device>,
    /// What compute pipelines capture (`Off` unless asked for and supported; executable.rs).
    pub(crate) capture: ExecutableCapture,
    /// VK_NVX_binary_import entry points, when native kernels are enabled (native.rs).
    pub(crate) native: Option<ash::nvx::binary_import::Device>,
    /// Why native kernels are off, for `create_native_kernel`'s error.
    pub(crate) native_off: Option<String>,
    /// VK_KHR_external_memory_fd entry points, where exports are enabled (external.rs).
    pub(crate) external_memory_fd: Option<ash::khr::external_memory_fd::Device>,
    /// VK_KHR_external_semaphore_fd entry points, likewise.
    pub(crate) external_semaphore_fd: Option<ash::khr::external_semaphore_fd::Device>,
    pub(crate) queue_family: u32,
    /// The family of the dedicated transfer queue, where the Context has one (copy_queue.rs).
    pub(crate) transfer_family: Option<u32>,
    /// Whether device-local memory may come from a full-BAR host-visible type.
    pub(crate) bar: bool,
    /// The VkPipelineCache, persisted under the user cache dir (pipeline_cache.rs).
    pub(crate) pipeline_cache: PipelineCache,
    /// GPU timestamps around dispatches, when profiling is on (profile.rs).
    pub(crate) profiler: Option<Profiler>,
    pub(crate) memory: vk::PhysicalDeviceMemoryProperties,
    pub(crate) enabled: EnabledFeatures,
}

impl Core {
    pub(crate) fn caps(&self) -> &Caps {
        self.adapter.caps()
    }

    /// Features actually enabled on this device.
    pub(crate) fn enabled(&self) -> &EnabledFeatures {
        &self.enabled
    }

    pub(crate) fn device(&self) -> &ash::Device {
        &self.device
    }

    /// The queue families Helios submits to: compute, and the transfer family if in use.
    pub(crate) fn queue_families(&self) -> Vec<u32> {
        std::iter::once(self.queue_family)
            .chain(self.transfer_family)
            .collect()
    }

    /// Whether device-local buffers may use the full-BAR host-visible memory type.
    pub(crate) fn use_bar(&self) -> bool {
        self.bar
    }

    pub(crate) fn memory_properties(&self) -> &vk::PhysicalDeviceMemoryProperties {
        &self.memory
    }

    pub(crate) fn pipeline_cache(&self) -> vk::PipelineCache {
        self.pipeline_cache.raw()
    }

    /// Gives a Vulkan object a name that validation messages will show (no-op otherwise).
    pub(crate) fn set_name<H: vk::Handle>(&self, handle: H, name: &str) {
        let Some(du) = &self.debug_utils else { return };
        let Ok(name) = std::ffi::CString::new(name) else {
            return;
        };
        let info = vk::DebugUtilsObjectNameInfoEXT::default()
            .object_handle(handle)
            .object_name(&name);
        // SAFETY: the handle belongs to this device. A failure only loses a debug name.
        let _ = unsafe { du.set_debug_utils_object_name(&info) };
    }
}
