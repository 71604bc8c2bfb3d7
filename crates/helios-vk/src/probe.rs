//! Feature probing: one pass over a physical device that fills `Caps`.
//!
//! Vulkan spreads what a device can do over core structs per version (1.1, 1.2, 1.3) and
//! per-extension structs; a struct may only be chained when its version or extension is
//! there, so every chain entry below is guarded by that condition. Device creation
//! (`features.rs`) enables from `Caps::features` alone and never probes again.

use ash::vk;
use std::ffi::{c_void, CStr};

use crate::caps::{
    Caps, CooperativeMatrixShape, DeviceType, External, ExternalSupport, Features, Limits,
    MemoryHeap, MemoryType, QueueFamily, Subgroup,
};
use crate::conv;
use crate::error::{vk_err, Result};

pub(crate) const KHR_SHADER_BFLOAT16: &CStr = c"VK_KHR_shader_bfloat16";

/// `VkPhysicalDeviceShaderBfloat16FeaturesKHR`, which ash 0.38 (Vulkan 1.3.281) predates.
/// Layout and structure type follow the Vulkan registry.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct PhysicalDeviceShaderBfloat16FeaturesKHR {
    pub s_type: vk::StructureType,
    pub p_next: *mut c_void,
    pub shader_bfloat16_type: vk::Bool32,
    pub shader_bfloat16_dot_product: vk::Bool32,
    pub shader_bfloat16_cooperative_matrix: vk::Bool32,
}

impl PhysicalDeviceShaderBfloat16FeaturesKHR {
    /// VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR.
    pub const STRUCTURE_TYPE: vk::StructureType = vk::StructureType::from_raw(1_000_141_000);
}

impl Default for PhysicalDeviceShaderBfloat16FeaturesKHR {
    fn default() -> Self {
        PhysicalDeviceShaderBfloat16FeaturesKHR {
            s_type: Self::STRUCTURE_TYPE,
            p_next: std::ptr::null_mut(),
            shader_bfloat16_type: vk::FALSE,
            shader_bfloat16_dot_product: vk::FALSE,
            shader_bfloat16_cooperative_matrix: vk::FALSE,
        }
    }
}

// SAFETY: #[repr(C)] with sType/pNext first, as the registry defines it; the spec allows it
// in both VkPhysicalDeviceFeatures2 and VkDeviceCreateInfo chains.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for PhysicalDeviceShaderBfloat16FeaturesKHR {}
unsafe impl vk::ExtendsDeviceCreateInfo for PhysicalDeviceShaderBfloat16FeaturesKHR {}

/// The capabilities of `pd`, a device of the instance `raw` loaded through `entry`.
pub(crate) fn probe(
    entry: &ash::Entry,
    raw: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> Result<Caps> {
    // SAFETY: `pd` was enumerated from `raw`, which is alive; all chained structs are locals.
    let props = unsafe { raw.get_physical_device_properties(pd) };
    let api = props.api_version;
    let at_least = |major, minor| api >= vk::make_api_version(0, major, minor, 0);

    let mut extensions: Vec<String> = unsafe { raw.enumerate_device_extension_properties(pd) }
        .map_err(vk_err("vkEnumerateDeviceExtensionProperties"))?
        .iter()
        .filter_map(|e| e.extension_name_as_c_str().ok())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    extensions.sort();
    extensions.dedup();
    let has = |name: &CStr| {
        let name = name.to_str().unwrap_or_default();
        extensions
            .binary_search_by(|e| e.as_str().cmp(name))
            .is_ok()
    };

    // ---- properties ------------------------------------------------------------------
    let mut id = vk::PhysicalDeviceIDProperties::default();
    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let mut maint3 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut driver = vk::PhysicalDeviceDriverProperties::default();
    let mut p13 = vk::PhysicalDeviceVulkan13Properties::default();
    let mut sgc_props = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
    let mut m4_props = vk::PhysicalDeviceMaintenance4Properties::default();
    let mut sm_props = vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV::default();
    let has_sm_props = has(ash::nv::shader_sm_builtins::NAME);
    let has_driver_props = at_least(1, 2) || has(ash::khr::driver_properties::NAME);
    let has_sgc = at_least(1, 3) || has(ash::ext::subgroup_size_control::NAME);
    let has_m4 = at_least(1, 3) || has(ash::khr::maintenance4::NAME);
    if at_least(1, 1) {
        let mut p2 = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut id)
            .push_next(&mut subgroup)
            .push_next(&mut maint3);
        if has_driver_props {
            p2 = p2.push_next(&mut driver);
        }
        if has_sm_props {
            p2 = p2.push_next(&mut sm_props);
        }
        if at_least(1, 3) {
            p2 = p2.push_next(&mut p13);
        } else {
            if has_sgc {
                p2 = p2.push_next(&mut sgc_props);
            }
            if has_m4 {
                p2 = p2.push_next(&mut m4_props);
            }
        }
        unsafe { raw.get_physical_device_properties2(pd, &mut p2) };
    }
    let (min_subgroup, max_subgroup, max_buffer_size) = if at_least(1, 3) {
        (
            Some(p13.min_subgroup_size),
            Some(p13.max_subgroup_size),
            Some(p13.max_buffer_size),
        )
    } else {
        (
            has_sgc.then_some(sgc_props.min_subgroup_size),
            has_sgc.then_some(sgc_props.max_subgroup_size),
            has_m4.then_some(m4_props.max_buffer_size),
        )
    };

    // ---- features --------------------------------------------------------------------
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
    let mut sgc_feat = vk::PhysicalDeviceSubgroupSizeControlFeatures::default();
    let mut m4_feat = vk::PhysicalDeviceMaintenance4Features::default();
    let mut coop_feat = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut bf16_feat = PhysicalDeviceShaderBfloat16FeaturesKHR::default();
    let mut pexec_feat = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    let mut atomic_float_feat = vk::PhysicalDeviceShaderAtomicFloatFeaturesEXT::default();
    let has_pexec = has(ash::khr::pipeline_executable_properties::NAME);
    let has_coop = has(ash::khr::cooperative_matrix::NAME);
    let has_bf16 = has(KHR_SHADER_BFLOAT16);
    let has_atomic_float = has(ash::ext::shader_atomic_float::NAME);
    let base = if at_least(1, 1) {
        let mut f2 = vk::PhysicalDeviceFeatures2::default();
        if at_least(1, 2) {
            f2 = f2.push_next(&mut f11).push_next(&mut f12);
        }
        if at_least(1, 3) {
            f2 = f2.push_next(&mut f13);
        } else {
            if has_sgc {
                f2 = f2.push_next(&mut sgc_feat);
            }
            if has_m4 {
                f2 = f2.push_next(&mut m4_feat);
            }
        }
        if has_coop {
            f2 = f2.push_next(&mut coop_feat);
        }
        if has_bf16 {
            f2 = f2.push_next(&mut bf16_feat);
        }
        if has_pexec {
            f2 = f2.push_next(&mut pexec_feat);
        }
        if has_atomic_float {
            f2 = f2.push_next(&mut atomic_float_feat);
        }
        unsafe { raw.get_physical_device_features2(pd, &mut f2) };
        f2.features
    } else {
        unsafe { raw.get_physical_device_features(pd) }
    };
    let on = |b: vk::Bool32| b == vk::TRUE;
    let (sgc_on, full_on, m4_on, sync2_on) = if at_least(1, 3) {
        (
            on(f13.subgroup_size_control),
            on(f13.compute_full_subgroups),
            on(f13.maintenance4),
            on(f13.synchronization2),
        )
    } else {
        (
            on(sgc_feat.subgroup_size_control),
            on(sgc_feat.compute_full_subgroups),
            on(m4_feat.maintenance4),
            false,
        )
    };
    let features = Features {
        shader_float16: on(f12.shader_float16),
        shader_int8: on(f12.shader_int8),
        shader_int16: on(base.shader_int16),
        shader_int64: on(base.shader_int64),
        shader_float64: on(base.shader_float64),
        storage_buffer_16bit: on(f11.storage_buffer16_bit_access),
        storage_buffer_8bit: on(f12.storage_buffer8_bit_access),
        bfloat16: on(bf16_feat.shader_bfloat16_type),
        bfloat16_dot_product: on(bf16_feat.shader_bfloat16_dot_product),
        bfloat16_cooperative_matrix: on(bf16_feat.shader_bfloat16_cooperative_matrix),
        timeline_semaphore: on(f12.timeline_semaphore),
        buffer_device_address: on(f12.buffer_device_address),
        vulkan_memory_model: on(f12.vulkan_memory_model),
        vulkan_memory_model_device_scope: on(f12.vulkan_memory_model_device_scope),
        push_descriptor: has(ash::khr::push_descriptor::NAME),
        subgroup_size_control: sgc_on,
        compute_full_subgroups: full_on,
        maintenance4: m4_on,
        synchronization2: sync2_on,
        cooperative_matrix: has_coop && on(coop_feat.cooperative_matrix),
        shader_buffer_float32_atomic_add: has_atomic_float
            && on(atomic_float_feat.shader_buffer_float32_atomic_add),
        pipeline_executable_info: has_pexec && on(pexec_feat.pipeline_executable_info),
        native_kernels: has(ash::nvx::binary_import::NAME),
    };

    // ---- memory and queues -----------------------------------------------------------
    let mem = unsafe { raw.get_physical_device_memory_properties(pd) };
    let memory_heaps: Vec<MemoryHeap> = mem
        .memory_heaps_as_slice()
        .iter()
        .enumerate()
        .map(|(i, h)| MemoryHeap {
            index: i as u32,
            size: h.size,
            device_local: h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL),
        })
        .collect();
    let memory_types: Vec<MemoryType> = mem
        .memory_types_as_slice()
        .iter()
        .enumerate()
        .map(|(i, t)| MemoryType {
            index: i as u32,
            flags: conv::memory_property_names(t.property_flags),
            heap_index: t.heap_index,
        })
        .collect();
    let dl_hv = vk::MemoryPropertyFlags::DEVICE_LOCAL | vk::MemoryPropertyFlags::HOST_VISIBLE;
    let host_visible_device_local = mem
        .memory_types_as_slice()
        .iter()
        .any(|t| t.property_flags.contains(dl_hv));
    let queue_families = unsafe { raw.get_physical_device_queue_family_properties(pd) }
        .iter()
        .enumerate()
        .map(|(i, q)| QueueFamily {
            index: i as u32,
            flags: conv::queue_flag_names(q.queue_flags),
            queue_count: q.queue_count,
            timestamp_valid_bits: q.timestamp_valid_bits,
        })
        .collect();

    let cooperative_matrix = if has_coop {
        let loader = ash::khr::cooperative_matrix::Instance::new(entry, raw);
        unsafe { loader.get_physical_device_cooperative_matrix_properties(pd) }
            .map_err(vk_err("vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"))?
            .iter()
            .map(|p| CooperativeMatrixShape {
                m: p.m_size,
                n: p.n_size,
                k: p.k_size,
                a: conv::component_type_name(p.a_type),
                b: conv::component_type_name(p.b_type),
                c: conv::component_type_name(p.c_type),
                result: conv::component_type_name(p.result_type),
                scope: conv::scope_name(p.scope),
                saturating_accumulation: on(p.saturating_accumulation),
            })
            .collect()
    } else {
        Vec::new()
    };

    let cooperative_matrix2 = if has_coop && has(crate::coopmat2::NAME) && at_least(1, 1) {
        Some(crate::coopmat2::probe(entry, raw, pd)?)
    } else {
        None
    };

    let external = if at_least(1, 1) {
        probe_external(raw, pd, &has)
    } else {
        External::default()
    };

    let device_type = conv::device_type(props.device_type);
    let l = &props.limits;
    Ok(Caps {
        name: conv::c_chars(&props.device_name),
        vendor_id: props.vendor_id,
        vendor: conv::vendor_name(props.vendor_id),
        device_id: props.device_id,
        device_type,
        api_version: conv::api_version(api),
        driver_name: conv::c_chars(&driver.driver_name),
        driver_info: conv::c_chars(&driver.driver_info),
        driver_version: conv::driver_version(props.vendor_id, props.driver_version),
        device_uuid: conv::hex(&id.device_uuid),
        device_uuid_bytes: id.device_uuid,
        sm_count: (has_sm_props && at_least(1, 1) && sm_props.shader_sm_count > 0)
            .then_some(sm_props.shader_sm_count),
        pipeline_cache_uuid: conv::hex(&props.pipeline_cache_uuid),
        memory_heaps,
        memory_types,
        unified_memory: matches!(device_type, DeviceType::IntegratedGpu | DeviceType::Cpu),
        host_visible_device_local,
        subgroup: Subgroup {
            size: subgroup.subgroup_size,
            operations: conv::subgroup_op_names(subgroup.supported_operations),
            compute_stage: subgroup
                .supported_stages
                .contains(vk::ShaderStageFlags::COMPUTE),
            min_size: min_subgroup,
            max_size: max_subgroup,
        },
        limits: Limits {
            max_compute_shared_memory: l.max_compute_shared_memory_size,
            max_push_constants_size: l.max_push_constants_size,
            max_workgroup_size: l.max_compute_work_group_size,
            max_workgroup_invocations: l.max_compute_work_group_invocations,
            max_workgroup_count: l.max_compute_work_group_count,
            max_storage_buffer_range: l.max_storage_buffer_range,
            min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
            max_memory_allocation_size: maint3.max_memory_allocation_size,
            max_buffer_size,
            non_coherent_atom_size: l.non_coherent_atom_size,
            timestamp_period: l.timestamp_period,
        },
        queue_families,
        features,
        cooperative_matrix,
        nv_cooperative_matrix2: has(crate::coopmat2::NAME),
        cooperative_matrix2,
        external,
        extensions,
        api_version_raw: api,
    })
}

/// The usage of every Helios buffer (memory.rs), which an exported allocation's buffer has
/// too: the driver's answer to an export query depends on it.
pub const BUFFER_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw()
        | vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS.as_raw(),
);

/// Whether buffers and timeline semaphores can be exported (and imported) as opaque fds.
/// Both queries are core in Vulkan 1.1; the fd extensions are what makes the handles
/// reachable, so without them the answers are not asked for.
fn probe_external(
    raw: &ash::Instance,
    pd: vk::PhysicalDevice,
    has: &dyn Fn(&CStr) -> bool,
) -> External {
    let opaque = vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD;
    let memory_fd = has(ash::khr::external_memory_fd::NAME);
    let semaphore_fd = has(ash::khr::external_semaphore_fd::NAME);
    let memory = if memory_fd {
        let info = vk::PhysicalDeviceExternalBufferInfo::default()
            .usage(BUFFER_USAGE)
            .handle_type(opaque);
        let mut props = vk::ExternalBufferProperties::default();
        // SAFETY: `pd` belongs to `raw`; Vulkan 1.1 is checked by the caller.
        unsafe { raw.get_physical_device_external_buffer_properties(pd, &info, &mut props) };
        let f = props.external_memory_properties.external_memory_features;
        let compatible = props
            .external_memory_properties
            .compatible_handle_types
            .contains(opaque);
        use vk::ExternalMemoryFeatureFlags as M;
        ExternalSupport {
            exportable: compatible && f.contains(M::EXPORTABLE),
            importable: compatible && f.contains(M::IMPORTABLE),
            dedicated_only: f.contains(M::DEDICATED_ONLY),
        }
    } else {
        ExternalSupport::default()
    };
    let timeline = if semaphore_fd {
        let mut type_info =
            vk::SemaphoreTypeCreateInfo::default().semaphore_type(vk::SemaphoreType::TIMELINE);
        let info = vk::PhysicalDeviceExternalSemaphoreInfo::default()
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD)
            .push_next(&mut type_info);
        let mut props = vk::ExternalSemaphoreProperties::default();
        // SAFETY: as above; the chained struct is a local.
        unsafe { raw.get_physical_device_external_semaphore_properties(pd, &info, &mut props) };
        use vk::ExternalSemaphoreFeatureFlags as S;
        let f = props.external_semaphore_features;
        let compatible = props
            .compatible_handle_types
            .contains(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        ExternalSupport {
            exportable: compatible && f.contains(S::EXPORTABLE),
            importable: compatible && f.contains(S::IMPORTABLE),
            dedicated_only: false,
        }
    } else {
        ExternalSupport::default()
    };
    External {
        memory_fd,
        semaphore_fd,
        memory,
        timeline,
    }
}
