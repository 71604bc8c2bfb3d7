//! Which device features Helios turns on, and the VkDevice creation that does it.
//!
//! Deciding (`plan`) is a pure function of `Caps`, separate from the pNext plumbing
//! (`create_device`), so the policy is unit-tested and kernels can trust `EnabledFeatures`:
//! a feature is listed there only if it was both supported and requested at creation.
//! Required: Vulkan 1.2, bufferDeviceAddress (buffers travel as addresses in push constants)
//! and timelineSemaphore (the whole submission model). Everything else is optional.

use ash::vk;
use serde::Serialize;
use std::ffi::CStr;

use crate::caps::Caps;
use crate::error::{vk_err, Error, Result};
use crate::instance::MIN_API_VERSION;
use crate::probe::{PhysicalDeviceShaderBfloat16FeaturesKHR, KHR_SHADER_BFLOAT16};

/// Features enabled on the logical device (what kernels may use).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EnabledFeatures {
    /// Always true: required.
    pub buffer_device_address: bool,
    /// Always true: required.
    pub timeline_semaphore: bool,
    pub shader_int64: bool,
    /// f64 arithmetic (helios-field's FP64 multiplier layouts).
    pub shader_float64: bool,
    pub shader_int16: bool,
    pub shader_float16: bool,
    pub shader_int8: bool,
    pub storage_buffer_16bit: bool,
    pub storage_buffer_8bit: bool,
    pub vulkan_memory_model: bool,
    pub vulkan_memory_model_device_scope: bool,
    pub subgroup_size_control: bool,
    pub compute_full_subgroups: bool,
    pub maintenance4: bool,
    pub synchronization2: bool,
    /// VK_KHR_push_descriptor (the fallback binding model).
    pub push_descriptor: bool,
    /// VK_KHR_cooperative_matrix.
    pub cooperative_matrix: bool,
    /// VK_KHR_shader_bfloat16 shaderBFloat16Type.
    pub bfloat16: bool,
    pub bfloat16_dot_product: bool,
    pub bfloat16_cooperative_matrix: bool,
    /// VK_NV_cooperative_matrix2 with `cooperativeMatrixWorkgroupScope` and
    /// `cooperativeMatrixFlexibleDimensions` (workgroup-scope matrices of flexible size);
    /// `HELIOS_COOPMAT2=0` leaves it off.
    pub cooperative_matrix_workgroup_scope: bool,
    /// `cooperativeMatrixTensorAddressing` of the same extension (with workgroup scope).
    pub cooperative_matrix_tensor_addressing: bool,
    /// VK_KHR_pipeline_executable_properties pipelineExecutableInfo: only when asked for
    /// (`HELIOS_PIPELINE_STATS`), since capturing statistics may slow pipeline creation.
    pub pipeline_executable_info: bool,
    /// VK_EXT_shader_atomic_float shaderBufferFloat32AtomicAdd (f32 atomic add on storage
    /// buffers).
    pub shader_buffer_float32_atomic_add: bool,
    /// VK_NVX_binary_import with bufferDeviceAddress: native CUDA kernels from PTX
    /// (`Context::create_native_kernel`); `HELIOS_NATIVE=0` leaves it off.
    pub native_kernels: bool,
    /// VK_KHR_external_memory_fd, where the driver exports Helios's buffers as opaque fds:
    /// `Context::export_memory` works.
    pub export_memory: bool,
    /// VK_KHR_external_semaphore_fd, where the driver exports timeline semaphores as opaque
    /// fds: `Context::export_timeline` works.
    pub export_timeline: bool,
}

/// Refuses devices Helios cannot run on, naming everything that is missing at once.
pub(crate) fn check_required(caps: &Caps) -> Result<()> {
    if caps.api_version_raw < MIN_API_VERSION {
        return Err(Error::DeviceUnsupported {
            device: caps.name.clone(),
            missing: format!("Vulkan 1.2 (it has {})", caps.api_version),
        });
    }
    let mut missing = Vec::new();
    if !caps.features.buffer_device_address {
        missing.push("bufferDeviceAddress");
    }
    if !caps.features.timeline_semaphore {
        missing.push("timelineSemaphore");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::DeviceUnsupported {
            device: caps.name.clone(),
            missing: missing.join(" and "),
        })
    }
}

/// Header version that introduced VK_KHR_cooperative_matrix.
const COOPERATIVE_MATRIX_HEADER: u32 = vk::make_api_version(0, 1, 3, 255);
/// Header version that introduced VK_KHR_shader_bfloat16.
const BFLOAT16_HEADER: u32 = vk::make_api_version(0, 1, 4, 311);
/// Header version that introduced VK_NVX_binary_import (April 2021).
const NATIVE_HEADER: u32 = vk::make_api_version(0, 1, 2, 175);

/// Everything supported that Helios can use; NV cooperative_matrix2 is not wanted yet.
///
/// A validation layer older than an extension rejects that extension's structs at
/// vkCreateDevice (VUID-VkDeviceCreateInfo-pNext-pNext), which would fail every validated
/// run; such extensions are left off while that layer is in use, and listed in the result's
/// second element so the caller can say so.
///
/// `pipeline_stats`: pipelineExecutableInfo was asked for (`ContextOptions::pipeline_stats`);
/// it is enabled only then, and only where the device supports it. `coopmat2`: workgroup-scope
/// cooperative matrices are wanted (`ContextOptions::cooperative_matrix2`). `native`: native
/// kernels are wanted (`ContextOptions::native_kernels`).
pub(crate) fn plan(
    caps: &Caps,
    validation_layer: Option<u32>,
    pipeline_stats: bool,
    coopmat2: bool,
    native: bool,
) -> (EnabledFeatures, Vec<&'static str>) {
    let f = &caps.features;
    let layer_knows = |header: u32| validation_layer.map_or(true, |v| v >= header);
    let mut withheld = Vec::new();
    let coop_ok = layer_knows(COOPERATIVE_MATRIX_HEADER);
    if f.cooperative_matrix && !coop_ok {
        withheld.push("VK_KHR_cooperative_matrix");
    }
    let bf16_ok = layer_knows(BFLOAT16_HEADER);
    if f.bfloat16 && !bf16_ok {
        withheld.push("VK_KHR_shader_bfloat16");
    }
    let cooperative_matrix = f.cooperative_matrix && coop_ok;
    let wg_supported = caps
        .cooperative_matrix2
        .as_ref()
        .is_some_and(|c| c.workgroup_scope && c.flexible_dimensions);
    let coopmat2_ok = layer_knows(crate::coopmat2::HEADER);
    if coopmat2 && cooperative_matrix && wg_supported && !coopmat2_ok {
        withheld.push("VK_NV_cooperative_matrix2");
    }
    let cooperative_matrix_workgroup_scope =
        coopmat2 && cooperative_matrix && wg_supported && coopmat2_ok;
    let bfloat16 = f.bfloat16 && bf16_ok;
    // Kernels take buffers as device addresses, so the extension is useless without them.
    let native_wanted = native && f.native_kernels && f.buffer_device_address;
    let native_ok = layer_knows(NATIVE_HEADER);
    if native_wanted && !native_ok {
        withheld.push("VK_NVX_binary_import");
    }
    let enabled = EnabledFeatures {
        buffer_device_address: true,
        timeline_semaphore: true,
        shader_int64: f.shader_int64,
        shader_float64: f.shader_float64,
        shader_int16: f.shader_int16,
        shader_float16: f.shader_float16,
        shader_int8: f.shader_int8,
        storage_buffer_16bit: f.storage_buffer_16bit,
        storage_buffer_8bit: f.storage_buffer_8bit,
        vulkan_memory_model: f.vulkan_memory_model,
        vulkan_memory_model_device_scope: f.vulkan_memory_model
            && f.vulkan_memory_model_device_scope,
        subgroup_size_control: f.subgroup_size_control,
        compute_full_subgroups: f.subgroup_size_control && f.compute_full_subgroups,
        maintenance4: f.maintenance4,
        synchronization2: f.synchronization2,
        push_descriptor: f.push_descriptor,
        cooperative_matrix,
        bfloat16,
        bfloat16_dot_product: bfloat16 && f.bfloat16_dot_product,
        // The bf16 cooperative-matrix bit is only valid together with cooperativeMatrix.
        bfloat16_cooperative_matrix: bfloat16
            && f.bfloat16_cooperative_matrix
            && cooperative_matrix,
        cooperative_matrix_workgroup_scope,
        cooperative_matrix_tensor_addressing: cooperative_matrix_workgroup_scope
            && caps
                .cooperative_matrix2
                .as_ref()
                .is_some_and(|c| c.tensor_addressing),
        pipeline_executable_info: pipeline_stats && f.pipeline_executable_info,
        shader_buffer_float32_atomic_add: f.shader_buffer_float32_atomic_add,
        native_kernels: native_wanted && native_ok,
        // Both extensions date from 2017, older than any validation layer that knows
        // Vulkan 1.2, so no layer withholds them.
        export_memory: caps.external.memory_fd && caps.external.memory.exportable,
        export_timeline: caps.external.semaphore_fd && caps.external.timeline.exportable,
    };
    (enabled, withheld)
}

/// Device extensions to enable for `enabled` on a device of `caps`.
pub(crate) fn extensions(caps: &Caps, enabled: &EnabledFeatures) -> Vec<&'static CStr> {
    let core13 = caps.api_version_raw >= vk::API_VERSION_1_3;
    let mut exts = Vec::new();
    if enabled.subgroup_size_control && !core13 {
        exts.push(ash::ext::subgroup_size_control::NAME);
    }
    if enabled.maintenance4 && !core13 {
        exts.push(ash::khr::maintenance4::NAME);
    }
    if enabled.push_descriptor {
        exts.push(ash::khr::push_descriptor::NAME);
    }
    if enabled.cooperative_matrix {
        exts.push(ash::khr::cooperative_matrix::NAME);
    }
    if enabled.bfloat16 {
        exts.push(KHR_SHADER_BFLOAT16);
    }
    if enabled.cooperative_matrix_workgroup_scope {
        exts.push(crate::coopmat2::NAME);
    }
    if enabled.pipeline_executable_info {
        exts.push(ash::khr::pipeline_executable_properties::NAME);
    }
    if enabled.shader_buffer_float32_atomic_add {
        exts.push(ash::ext::shader_atomic_float::NAME);
    }
    if enabled.native_kernels {
        exts.push(ash::nvx::binary_import::NAME);
    }
    if enabled.export_memory {
        exts.push(ash::khr::external_memory_fd::NAME);
    }
    if enabled.export_timeline {
        exts.push(ash::khr::external_semaphore_fd::NAME);
    }
    // The spec requires enabling it wherever it is listed (MoltenVK and similar).
    if caps.has_extension("VK_KHR_portability_subset") {
        exts.push(ash::khr::portability_subset::NAME);
    }
    exts
}

/// Creates the logical device with one queue from `queue_family` and `enabled` turned on.
pub(crate) fn create_device(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    caps: &Caps,
    queue_families: &[u32],
    enabled: &EnabledFeatures,
) -> Result<ash::Device> {
    let b = |x: bool| if x { vk::TRUE } else { vk::FALSE };
    let e = enabled;
    let core13 = caps.api_version_raw >= vk::API_VERSION_1_3;

    let base = vk::PhysicalDeviceFeatures::default()
        .shader_int64(e.shader_int64)
        .shader_float64(e.shader_float64)
        .shader_int16(e.shader_int16);
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default()
        .storage_buffer16_bit_access(e.storage_buffer_16bit);
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
        .buffer_device_address(true)
        .timeline_semaphore(true)
        .shader_float16(e.shader_float16)
        .shader_int8(e.shader_int8)
        .storage_buffer8_bit_access(e.storage_buffer_8bit)
        .vulkan_memory_model(e.vulkan_memory_model)
        .vulkan_memory_model_device_scope(e.vulkan_memory_model_device_scope);
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default()
        .subgroup_size_control(e.subgroup_size_control)
        .compute_full_subgroups(e.compute_full_subgroups)
        .maintenance4(e.maintenance4)
        .synchronization2(e.synchronization2);
    let mut sgc = vk::PhysicalDeviceSubgroupSizeControlFeatures::default()
        .subgroup_size_control(e.subgroup_size_control)
        .compute_full_subgroups(e.compute_full_subgroups);
    let mut m4 = vk::PhysicalDeviceMaintenance4Features::default().maintenance4(e.maintenance4);
    let mut coop =
        vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
    let mut bf16 = PhysicalDeviceShaderBfloat16FeaturesKHR {
        shader_bfloat16_type: b(e.bfloat16),
        shader_bfloat16_dot_product: b(e.bfloat16_dot_product),
        shader_bfloat16_cooperative_matrix: b(e.bfloat16_cooperative_matrix),
        ..Default::default()
    };
    let mut coop2 = crate::coopmat2::Features {
        workgroup_scope: vk::TRUE,
        flexible_dimensions: vk::TRUE,
        tensor_addressing: b(e.cooperative_matrix_tensor_addressing),
        ..Default::default()
    };
    let mut pexec = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
        .pipeline_executable_info(true);
    let mut atomic_float = vk::PhysicalDeviceShaderAtomicFloatFeaturesEXT::default()
        .shader_buffer_float32_atomic_add(true);

    let mut features2 = vk::PhysicalDeviceFeatures2::default()
        .features(base)
        .push_next(&mut f11)
        .push_next(&mut f12);
    if core13 {
        features2 = features2.push_next(&mut f13);
    } else {
        if e.subgroup_size_control {
            features2 = features2.push_next(&mut sgc);
        }
        if e.maintenance4 {
            features2 = features2.push_next(&mut m4);
        }
    }
    if e.cooperative_matrix {
        features2 = features2.push_next(&mut coop);
    }
    if e.bfloat16 {
        features2 = features2.push_next(&mut bf16);
    }
    if e.cooperative_matrix_workgroup_scope {
        features2 = features2.push_next(&mut coop2);
    }
    if e.pipeline_executable_info {
        features2 = features2.push_next(&mut pexec);
    }
    if e.shader_buffer_float32_atomic_add {
        features2 = features2.push_next(&mut atomic_float);
    }

    let ext_ptrs: Vec<_> = extensions(caps, e).iter().map(|n| n.as_ptr()).collect();
    let priorities = [1.0f32];
    let queue_info: Vec<vk::DeviceQueueCreateInfo> = queue_families
        .iter()
        .map(|&f| {
            vk::DeviceQueueCreateInfo::default()
                .queue_family_index(f)
                .queue_priorities(&priorities)
        })
        .collect();
    let info = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queue_info)
        .enabled_extension_names(&ext_ptrs)
        .push_next(&mut features2);
    // SAFETY: `pd` belongs to `instance`; every chained struct is a local that outlives the
    // call, and each one is chained only under the version/extension that allows it.
    unsafe { instance.create_device(pd, &info, None) }.map_err(vk_err("vkCreateDevice"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(api: u32) -> Caps {
        let mut c = Caps {
            name: "test".into(),
            api_version_raw: api,
            ..Default::default()
        };
        c.features.buffer_device_address = true;
        c.features.timeline_semaphore = true;
        c
    }

    #[test]
    fn required() {
        assert!(check_required(&caps(vk::API_VERSION_1_2)).is_ok());
        let err = check_required(&caps(vk::API_VERSION_1_1)).unwrap_err();
        assert!(err.to_string().contains("Vulkan 1.2"), "{err}");
        let mut c = caps(vk::API_VERSION_1_3);
        c.features.buffer_device_address = false;
        c.features.timeline_semaphore = false;
        let err = check_required(&c).unwrap_err().to_string();
        assert!(
            err.contains("bufferDeviceAddress and timelineSemaphore"),
            "{err}"
        );
    }

    #[test]
    fn dependent_bits_need_their_parent() {
        let mut c = caps(vk::API_VERSION_1_3);
        c.features.compute_full_subgroups = true;
        c.features.bfloat16_cooperative_matrix = true;
        c.features.bfloat16 = true;
        let (e, withheld) = plan(&c, None, false, true, true);
        assert!(withheld.is_empty());
        assert!(!e.compute_full_subgroups);
        assert!(!e.bfloat16_cooperative_matrix);
        assert!(e.bfloat16);
        assert_eq!(extensions(&c, &e), [KHR_SHADER_BFLOAT16]);
    }

    #[test]
    fn pre_13_devices_use_extensions() {
        let mut c = caps(vk::API_VERSION_1_2);
        c.features.subgroup_size_control = true;
        c.features.maintenance4 = true;
        c.features.push_descriptor = true;
        let (e, _) = plan(&c, None, false, true, true);
        assert_eq!(
            extensions(&c, &e),
            [
                ash::ext::subgroup_size_control::NAME,
                ash::khr::maintenance4::NAME,
                ash::khr::push_descriptor::NAME
            ]
        );
    }

    #[test]
    fn old_validation_layer_withholds_newer_extensions() {
        let mut c = caps(vk::API_VERSION_1_3);
        c.features.cooperative_matrix = true;
        c.features.bfloat16 = true;
        c.features.bfloat16_cooperative_matrix = true;
        let (e, withheld) = plan(
            &c,
            Some(vk::make_api_version(0, 1, 3, 239)),
            false,
            true,
            true,
        );
        assert!(!e.cooperative_matrix && !e.bfloat16 && !e.bfloat16_cooperative_matrix);
        assert_eq!(
            withheld,
            ["VK_KHR_cooperative_matrix", "VK_KHR_shader_bfloat16"]
        );
        let (e, withheld) = plan(
            &c,
            Some(vk::make_api_version(0, 1, 3, 280)),
            false,
            true,
            true,
        );
        assert!(e.cooperative_matrix && !e.bfloat16);
        assert_eq!(withheld, ["VK_KHR_shader_bfloat16"]);
        let (e, withheld) = plan(&c, None, false, true, true);
        assert!(e.cooperative_matrix && e.bfloat16 && e.bfloat16_cooperative_matrix);
        assert!(withheld.is_empty());
    }

    #[test]
    fn pipeline_executable_info_only_on_request() {
        let mut c = caps(vk::API_VERSION_1_3);
        let name = ash::khr::pipeline_executable_properties::NAME;
        // Requested but not supported: off, no extension.
        let (e, withheld) = plan(&c, None, true, true, true);
        assert!(!e.pipeline_executable_info && withheld.is_empty());
        assert!(extensions(&c, &e).is_empty());
        c.features.pipeline_executable_info = true;
        // Supported but not requested: off (capturing statistics costs compile time).
        let (e, _) = plan(&c, None, false, true, true);
        assert!(!e.pipeline_executable_info);
        assert!(extensions(&c, &e).is_empty());
        // Both: on, with its extension; the 1.3.239 layer knows this 2019 extension.
        let (e, withheld) = plan(
            &c,
            Some(vk::make_api_version(0, 1, 3, 239)),
            true,
            true,
            true,
        );
        assert!(e.pipeline_executable_info && withheld.is_empty());
        assert_eq!(extensions(&c, &e), [name]);
    }

    #[test]
    fn float32_atomic_add_when_supported() {
        let name = ash::ext::shader_atomic_float::NAME;
        for api in [vk::API_VERSION_1_2, vk::API_VERSION_1_3] {
            let mut c = caps(api);
            // Not supported: off, no extension.
            let (e, withheld) = plan(&c, None, false, true, true);
            assert!(!e.shader_buffer_float32_atomic_add && withheld.is_empty());
            assert!(!extensions(&c, &e).contains(&name));
            // Supported: on, with its extension; the 1.3.239 layer knows this 2020 extension.
            c.features.shader_buffer_float32_atomic_add = true;
            for layer in [None, Some(vk::make_api_version(0, 1, 3, 239))] {
                let (e, withheld) = plan(&c, layer, false, true, true);
                assert!(e.shader_buffer_float32_atomic_add && withheld.is_empty());
                assert_eq!(extensions(&c, &e), [name]);
            }
        }
    }

    #[test]
    fn native_kernels_when_offered_wanted_and_addressable() {
        let name = ash::nvx::binary_import::NAME;
        let mut c = caps(vk::API_VERSION_1_3);
        // Not offered (lavapipe): off, no extension.
        let (e, withheld) = plan(&c, None, false, true, true);
        assert!(!e.native_kernels && withheld.is_empty());
        assert!(!extensions(&c, &e).contains(&name));
        c.features.native_kernels = true;
        // Offered: on, with its extension; the 1.3.239 layer knows this 2021 extension.
        for layer in [None, Some(vk::make_api_version(0, 1, 3, 239))] {
            let (e, withheld) = plan(&c, layer, false, true, true);
            assert!(e.native_kernels && withheld.is_empty());
            assert_eq!(extensions(&c, &e), [name]);
        }
        // A layer older than the extension: left off and said.
        let (e, withheld) = plan(
            &c,
            Some(vk::make_api_version(0, 1, 2, 170)),
            false,
            true,
            true,
        );
        assert!(!e.native_kernels);
        assert_eq!(withheld, ["VK_NVX_binary_import"]);
        // HELIOS_NATIVE=0: off, and nothing to say.
        let (e, withheld) = plan(&c, None, false, true, false);
        assert!(!e.native_kernels && withheld.is_empty());
        assert!(extensions(&c, &e).is_empty());
        // Without device addresses kernels could not reach buffers.
        c.features.buffer_device_address = false;
        assert!(!plan(&c, None, false, true, true).0.native_kernels);
    }

    #[test]
    fn fd_exports_when_listed_and_exportable() {
        let (mem, sem) = (
            ash::khr::external_memory_fd::NAME,
            ash::khr::external_semaphore_fd::NAME,
        );
        let mut c = caps(vk::API_VERSION_1_3);
        // Listed, but the driver cannot export our buffers or timelines: off.
        c.external.memory_fd = true;
        c.external.semaphore_fd = true;
        let (e, _) = plan(&c, None, false, true, true);
        assert!(!e.export_memory && !e.export_timeline);
        assert!(extensions(&c, &e).is_empty());
        // Memory exportable (lavapipe 22.3 lists no semaphore fd): memory only.
        c.external.memory.exportable = true;
        c.external.semaphore_fd = false;
        c.external.timeline.exportable = true;
        let (e, withheld) = plan(
            &c,
            Some(vk::make_api_version(0, 1, 3, 239)),
            false,
            true,
            true,
        );
        assert!(e.export_memory && !e.export_timeline && withheld.is_empty());
        assert_eq!(extensions(&c, &e), [mem]);
        c.external.semaphore_fd = true;
        let (e, _) = plan(&c, None, false, true, true);
        assert!(e.export_memory && e.export_timeline);
        assert_eq!(extensions(&c, &e), [mem, sem]);
    }

    #[test]
    fn workgroup_scope_matrices_need_both_features_khr_coop_and_a_recent_layer() {
        let mut c = caps(vk::API_VERSION_1_3);
        c.features.cooperative_matrix = true;
        let c2 = crate::CooperativeMatrix2 {
            workgroup_scope: true,
            flexible_dimensions: true,
            tensor_addressing: true,
            max_workgroup_size: 256,
            max_dimension: 1024,
            reserved_shared_memory: 8192,
            flexible: Vec::new(),
        };
        c.cooperative_matrix2 = Some(c2.clone());
        let (e, withheld) = plan(&c, None, false, true, true);
        assert!(e.cooperative_matrix_workgroup_scope && withheld.is_empty());
        assert!(extensions(&c, &e).contains(&crate::coopmat2::NAME));
        // HELIOS_COOPMAT2=0.
        let (e, _) = plan(&c, None, false, false, true);
        assert!(!e.cooperative_matrix_workgroup_scope);
        assert!(!extensions(&c, &e).contains(&crate::coopmat2::NAME));
        // A layer from before the extension: left off and said.
        let (e, withheld) = plan(
            &c,
            Some(vk::make_api_version(0, 1, 3, 280)),
            false,
            true,
            true,
        );
        assert!(!e.cooperative_matrix_workgroup_scope);
        assert_eq!(withheld, ["VK_NV_cooperative_matrix2"]);
        // Without flexible dimensions, or without KHR cooperative matrices: off.
        c.cooperative_matrix2 = Some(crate::CooperativeMatrix2 {
            flexible_dimensions: false,
            ..c2
        });
        assert!(
            !plan(&c, None, false, true, true)
                .0
                .cooperative_matrix_workgroup_scope
        );
        c.cooperative_matrix2 = Some(crate::CooperativeMatrix2 {
            flexible_dimensions: true,
            ..c.cooperative_matrix2.clone().unwrap()
        });
        c.features.cooperative_matrix = false;
        assert!(
            !plan(&c, None, false, true, true)
                .0
                .cooperative_matrix_workgroup_scope
        );
    }
}
