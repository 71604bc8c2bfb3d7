//! What a Vulkan device can do, as plain data read once at start-up.
//!
//! `Caps` is the single description kernels, the autotuner and `helios info` consult; it is
//! filled by `probe.rs` and never queried again, so code above this crate can branch on it
//! freely. Everything is owned, serialisable data (names as strings, versions as
//! "major.minor.patch") so that it prints and round-trips through JSON without Vulkan types.

use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceType {
    DiscreteGpu,
    IntegratedGpu,
    VirtualGpu,
    Cpu,
    #[default]
    Other,
}

impl DeviceType {
    /// Default preference when no `HELIOS_DEVICE` is given: lower is preferred.
    pub fn preference(self) -> u8 {
        match self {
            DeviceType::DiscreteGpu => 0,
            DeviceType::IntegratedGpu => 1,
            DeviceType::VirtualGpu => 2,
            DeviceType::Cpu => 3,
            DeviceType::Other => 4,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::DiscreteGpu => "discrete_gpu",
            DeviceType::IntegratedGpu => "integrated_gpu",
            DeviceType::VirtualGpu => "virtual_gpu",
            DeviceType::Cpu => "cpu",
            DeviceType::Other => "other",
        }
    }
}

impl std::fmt::Display for DeviceType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Caps {
    pub name: String,
    pub vendor_id: u32,
    pub vendor: String,
    pub device_id: u32,
    pub device_type: DeviceType,
    /// Device Vulkan version, "1.3.239".
    pub api_version: String,
    pub driver_name: String,
    pub driver_info: String,
    /// Decoded per vendor (NVIDIA "580.159.4.0", others "major.minor.patch").
    pub driver_version: String,
    /// Hex, 32 characters.
    pub device_uuid: String,
    /// `device_uuid` as the driver gives it (VkPhysicalDeviceIDProperties::deviceUUID):
    /// what CUDA's `cuDeviceGetUuid` returns for the same GPU.
    #[serde(skip)]
    pub device_uuid_bytes: [u8; 16],
    /// Streaming multiprocessors (VK_NV_shader_sm_builtins), where the driver says.
    pub sm_count: Option<u32>,
    /// Hex, 32 characters; keys the persisted pipeline cache.
    pub pipeline_cache_uuid: String,
    pub memory_heaps: Vec<MemoryHeap>,
    pub memory_types: Vec<MemoryType>,
    /// CPU and integrated devices share memory with the host (no staging needed).
    pub unified_memory: bool,
    /// Some memory type is both DEVICE_LOCAL and HOST_VISIBLE (ReBAR, unified memory).
    pub host_visible_device_local: bool,
    pub subgroup: Subgroup,
    pub limits: Limits,
    pub queue_families: Vec<QueueFamily>,
    pub features: Features,
    /// Shapes from vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR; empty without the
    /// extension.
    pub cooperative_matrix: Vec<CooperativeMatrixShape>,
    /// VK_NV_cooperative_matrix2 is listed.
    pub nv_cooperative_matrix2: bool,
    /// What VK_NV_cooperative_matrix2 offers, where it is listed.
    pub cooperative_matrix2: Option<crate::CooperativeMatrix2>,
    /// Memory and timeline semaphores shareable with other APIs (CUDA) through POSIX fds.
    pub external: External,
    /// Every device extension name, sorted.
    pub extensions: Vec<String>,
    /// `api_version` as Vulkan encodes it, for comparisons.
    #[serde(skip)]
    pub api_version_raw: u32,
}

impl Caps {
    pub fn has_extension(&self, name: &str) -> bool {
        self.extensions
            .binary_search_by(|e| e.as_str().cmp(name))
            .is_ok()
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct MemoryHeap {
    pub index: u32,
    pub size: u64,
    pub device_local: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemoryType {
    pub index: u32,
    /// "device_local", "host_visible", "host_coherent", "host_cached", ...
    pub flags: Vec<String>,
    pub heap_index: u32,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Subgroup {
    /// Default subgroup size (VkPhysicalDeviceSubgroupProperties).
    pub size: u32,
    /// "basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered",
    /// "quad".
    pub operations: Vec<String>,
    /// Subgroup operations are available in compute shaders.
    pub compute_stage: bool,
    /// From subgroup size control (Vulkan 1.3 or VK_EXT_subgroup_size_control).
    pub min_size: Option<u32>,
    pub max_size: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Limits {
    /// Bytes of workgroup-shared memory per workgroup.
    pub max_compute_shared_memory: u32,
    pub max_push_constants_size: u32,
    pub max_workgroup_size: [u32; 3],
    pub max_workgroup_invocations: u32,
    pub max_workgroup_count: [u32; 3],
    /// Only limits descriptor-bound buffers; buffer device addresses reach further.
    pub max_storage_buffer_range: u32,
    pub min_storage_buffer_offset_alignment: u64,
    /// Largest single vkAllocateMemory (Vulkan 1.1 maintenance3).
    pub max_memory_allocation_size: u64,
    /// Largest VkBuffer (Vulkan 1.3 maintenance4); `None` where the device does not say.
    pub max_buffer_size: Option<u64>,
    pub non_coherent_atom_size: u64,
    /// Nanoseconds per timestamp tick.
    pub timestamp_period: f32,
}

#[derive(Clone, Debug, Serialize)]
pub struct QueueFamily {
    pub index: u32,
    /// "graphics", "compute", "transfer", "sparse_binding", ...
    pub flags: Vec<String>,
    pub queue_count: u32,
    pub timestamp_valid_bits: u32,
}

impl QueueFamily {
    pub fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

/// Feature bits the device supports (not necessarily enabled: see `EnabledFeatures`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Features {
    pub shader_float16: bool,
    pub shader_int8: bool,
    pub shader_int16: bool,
    pub shader_int64: bool,
    pub shader_float64: bool,
    pub storage_buffer_16bit: bool,
    pub storage_buffer_8bit: bool,
    /// VK_KHR_shader_bfloat16 shaderBFloat16Type.
    pub bfloat16: bool,
    pub bfloat16_dot_product: bool,
    pub bfloat16_cooperative_matrix: bool,
    pub timeline_semaphore: bool,
    pub buffer_device_address: bool,
    pub vulkan_memory_model: bool,
    pub vulkan_memory_model_device_scope: bool,
    /// VK_KHR_push_descriptor is listed.
    pub push_descriptor: bool,
    pub subgroup_size_control: bool,
    pub compute_full_subgroups: bool,
    pub maintenance4: bool,
    pub synchronization2: bool,
    /// VK_KHR_cooperative_matrix feature bit.
    pub cooperative_matrix: bool,
    /// VK_EXT_shader_atomic_float shaderBufferFloat32AtomicAdd (f32 atomic add on storage
    /// buffers).
    pub shader_buffer_float32_atomic_add: bool,
    /// VK_KHR_pipeline_executable_properties pipelineExecutableInfo: the driver reports
    /// compiler statistics of pipelines (enabled only on request, `HELIOS_PIPELINE_STATS`).
    pub pipeline_executable_info: bool,
    /// VK_NVX_binary_import is listed: the driver runs CUDA kernels (PTX or cubin) inside
    /// Vulkan command buffers (native.rs).
    pub native_kernels: bool,
}

/// What the driver says about sharing memory and timeline semaphores as opaque POSIX fds
/// (the handle type CUDA imports on Linux).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct External {
    /// VK_KHR_external_memory_fd is listed.
    pub memory_fd: bool,
    /// VK_KHR_external_semaphore_fd is listed.
    pub semaphore_fd: bool,
    /// vkGetPhysicalDeviceExternalBufferProperties for an opaque fd and the usage Helios's
    /// buffers have (storage, transfer source and destination, device address).
    pub memory: ExternalSupport,
    /// vkGetPhysicalDeviceExternalSemaphoreProperties for an opaque fd of a timeline
    /// semaphore.
    pub timeline: ExternalSupport,
}

/// One handle type's answer from the driver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExternalSupport {
    pub exportable: bool,
    pub importable: bool,
    /// Memory only: an export must be a dedicated allocation (Helios always makes one).
    pub dedicated_only: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CooperativeMatrixShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// "f16", "f32", "bf16", "u8", "s8", "u32", "s32", ...
    pub a: String,
    pub b: String,
    pub c: String,
    pub result: String,
    /// "subgroup", "workgroup", ...
    pub scope: String,
    pub saturating_accumulation: bool,
}
