//! VK_NV_cooperative_matrix2: workgroup-scope cooperative matrices of flexible size.
//!
//! With it a whole workgroup owns one large matrix (say 128×128) and the driver decides how
//! the operands are staged through shared memory and split over the matrix units, instead of
//! every subgroup holding its own 16×16 fragments. Helios uses two of its features,
//! `cooperativeMatrixWorkgroupScope` and `cooperativeMatrixFlexibleDimensions`; the others
//! (reductions, per-element operations, tensor addressing) need SPIR-V opcodes the rspirv in
//! use does not know.
//!
//! ash 0.38 (Vulkan 1.3.281) predates the extension, so its three structures and its one
//! command are declared here, laid out as the Vulkan registry defines them.

use ash::vk;
use serde::Serialize;
use std::ffi::{c_void, CStr};

use crate::conv;
use crate::error::{vk_err, Result};

pub(crate) const NAME: &CStr = c"VK_NV_cooperative_matrix2";
/// Header version that introduced the extension (older validation layers reject its structs).
pub(crate) const HEADER: u32 = vk::make_api_version(0, 1, 3, 300);

/// What a device reports for VK_NV_cooperative_matrix2.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CooperativeMatrix2 {
    pub workgroup_scope: bool,
    pub flexible_dimensions: bool,
    /// Loads and stores through tensor layouts and views (SPV_NV_tensor_addressing).
    pub tensor_addressing: bool,
    /// Most invocations in a workgroup that uses workgroup-scope matrices.
    pub max_workgroup_size: u32,
    /// Largest dimension of a flexible-size matrix.
    pub max_dimension: u32,
    /// Shared memory the implementation keeps for itself in such a workgroup (bytes).
    pub reserved_shared_memory: u32,
    /// vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV.
    pub flexible: Vec<FlexibleShape>,
}

/// One supported combination of flexible-size matrices: M, N and K may be any multiple of
/// their granularity (up to `max_dimension`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FlexibleShape {
    pub m_granularity: u32,
    pub n_granularity: u32,
    pub k_granularity: u32,
    /// "f16", "bf16", "f32", ... as in `CooperativeMatrixShape`.
    pub a: String,
    pub b: String,
    pub c: String,
    pub result: String,
    pub saturating_accumulation: bool,
    /// "workgroup" or "subgroup".
    pub scope: String,
    /// Invocations per workgroup the shape needs (workgroup scope; 0 otherwise).
    pub workgroup_invocations: u32,
}

impl CooperativeMatrix2 {
    /// Whether an `m × n × k` product of `input` matrices into f32 at workgroup scope runs in a
    /// workgroup of `invocations`.
    pub fn supports(&self, input: &str, m: u32, n: u32, k: u32, invocations: u32) -> bool {
        self.workgroup_scope
            && self.flexible_dimensions
            && invocations <= self.max_workgroup_size
            && m.max(n).max(k) <= self.max_dimension
            && self.flexible.iter().any(|s| {
                s.scope == "workgroup"
                    && s.a == input
                    && s.b == input
                    && s.c == "f32"
                    && s.result == "f32"
                    && s.workgroup_invocations == invocations
                    && m % s.m_granularity.max(1) == 0
                    && n % s.n_granularity.max(1) == 0
                    && k % s.k_granularity.max(1) == 0
            })
    }
}

/// `VkPhysicalDeviceCooperativeMatrix2FeaturesNV`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Features {
    pub s_type: vk::StructureType,
    pub p_next: *mut c_void,
    pub workgroup_scope: vk::Bool32,
    pub flexible_dimensions: vk::Bool32,
    pub reductions: vk::Bool32,
    pub conversions: vk::Bool32,
    pub per_element_operations: vk::Bool32,
    pub tensor_addressing: vk::Bool32,
    pub block_loads: vk::Bool32,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            // VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV
            s_type: vk::StructureType::from_raw(1_000_593_000),
            p_next: std::ptr::null_mut(),
            workgroup_scope: vk::FALSE,
            flexible_dimensions: vk::FALSE,
            reductions: vk::FALSE,
            conversions: vk::FALSE,
            per_element_operations: vk::FALSE,
            tensor_addressing: vk::FALSE,
            block_loads: vk::FALSE,
        }
    }
}

// SAFETY: #[repr(C)] with sType/pNext first, as the registry defines it; the spec allows it
// in both VkPhysicalDeviceFeatures2 and VkDeviceCreateInfo chains.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for Features {}
unsafe impl vk::ExtendsDeviceCreateInfo for Features {}

/// `VkPhysicalDeviceCooperativeMatrix2PropertiesNV`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Properties {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    max_workgroup_size: u32,
    max_dimension: u32,
    reserved_shared_memory: u32,
}

impl Default for Properties {
    fn default() -> Self {
        Properties {
            // VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_PROPERTIES_NV
            s_type: vk::StructureType::from_raw(1_000_593_002),
            p_next: std::ptr::null_mut(),
            max_workgroup_size: 0,
            max_dimension: 0,
            reserved_shared_memory: 0,
        }
    }
}

// SAFETY: as for `Features`; the spec allows it in VkPhysicalDeviceProperties2 chains.
unsafe impl vk::ExtendsPhysicalDeviceProperties2 for Properties {}

/// `VkCooperativeMatrixFlexibleDimensionsPropertiesNV`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct FlexibleDimensionsProperties {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    m_granularity: u32,
    n_granularity: u32,
    k_granularity: u32,
    a_type: vk::ComponentTypeKHR,
    b_type: vk::ComponentTypeKHR,
    c_type: vk::ComponentTypeKHR,
    result_type: vk::ComponentTypeKHR,
    saturating_accumulation: vk::Bool32,
    scope: vk::ScopeKHR,
    workgroup_invocations: u32,
}

impl Default for FlexibleDimensionsProperties {
    fn default() -> Self {
        FlexibleDimensionsProperties {
            // VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_FLEXIBLE_DIMENSIONS_PROPERTIES_NV
            s_type: vk::StructureType::from_raw(1_000_593_001),
            p_next: std::ptr::null_mut(),
            m_granularity: 0,
            n_granularity: 0,
            k_granularity: 0,
            a_type: vk::ComponentTypeKHR::FLOAT16,
            b_type: vk::ComponentTypeKHR::FLOAT16,
            c_type: vk::ComponentTypeKHR::FLOAT16,
            result_type: vk::ComponentTypeKHR::FLOAT16,
            saturating_accumulation: vk::FALSE,
            scope: vk::ScopeKHR::SUBGROUP,
            workgroup_invocations: 0,
        }
    }
}

/// `vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV`.
type GetFlexibleDimensions = unsafe extern "system" fn(
    vk::PhysicalDevice,
    *mut u32,
    *mut FlexibleDimensionsProperties,
) -> vk::Result;

/// Queries the extension on `pd`, which lists it (Vulkan 1.1 or later).
pub(crate) fn probe(
    entry: &ash::Entry,
    raw: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> Result<CooperativeMatrix2> {
    let mut features = Features::default();
    let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut features);
    // SAFETY: `pd` belongs to `raw`; the chain holds locals only.
    unsafe { raw.get_physical_device_features2(pd, &mut f2) };
    let mut props = Properties::default();
    let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut props);
    // SAFETY: as above.
    unsafe { raw.get_physical_device_properties2(pd, &mut p2) };

    let name = c"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV";
    // SAFETY: a valid instance and a NUL-terminated command name.
    let pfn = unsafe { entry.get_instance_proc_addr(raw.handle(), name.as_ptr()) };
    let mut flexible = Vec::new();
    if let Some(pfn) = pfn {
        // SAFETY: the loader returned this command's entry point, whose signature is
        // `GetFlexibleDimensions` in the registry.
        let get: GetFlexibleDimensions = unsafe { std::mem::transmute(pfn) };
        let mut count = 0u32;
        // SAFETY: the usual two-call enumeration with a count and then a sized array.
        unsafe { get(pd, &mut count, std::ptr::null_mut()) }
            .result()
            .map_err(vk_err(
                "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV",
            ))?;
        let mut list = vec![FlexibleDimensionsProperties::default(); count as usize];
        unsafe { get(pd, &mut count, list.as_mut_ptr()) }
            .result()
            .map_err(vk_err(
                "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV",
            ))?;
        list.truncate(count as usize);
        flexible = list
            .iter()
            .map(|p| FlexibleShape {
                m_granularity: p.m_granularity,
                n_granularity: p.n_granularity,
                k_granularity: p.k_granularity,
                a: conv::component_type_name(p.a_type),
                b: conv::component_type_name(p.b_type),
                c: conv::component_type_name(p.c_type),
                result: conv::component_type_name(p.result_type),
                saturating_accumulation: p.saturating_accumulation == vk::TRUE,
                scope: conv::scope_name(p.scope),
                workgroup_invocations: p.workgroup_invocations,
            })
            .collect();
    }
    Ok(CooperativeMatrix2 {
        workgroup_scope: features.workgroup_scope == vk::TRUE,
        flexible_dimensions: features.flexible_dimensions == vk::TRUE,
        tensor_addressing: features.tensor_addressing == vk::TRUE,
        max_workgroup_size: props.max_workgroup_size,
        max_dimension: props.max_dimension,
        reserved_shared_memory: props.reserved_shared_memory,
        flexible,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> CooperativeMatrix2 {
        let shape = |a: &str, scope: &str, inv: u32| FlexibleShape {
            m_granularity: 16,
            n_granularity: 16,
            k_granularity: 16,
            a: a.into(),
            b: a.into(),
            c: "f32".into(),
            result: "f32".into(),
            saturating_accumulation: false,
            scope: scope.into(),
            workgroup_invocations: inv,
        };
        CooperativeMatrix2 {
            workgroup_scope: true,
            flexible_dimensions: true,
            tensor_addressing: true,
            max_workgroup_size: 256,
            max_dimension: 256,
            reserved_shared_memory: 0,
            flexible: vec![shape("f16", "workgroup", 128), shape("f16", "subgroup", 0)],
        }
    }

    #[test]
    fn supports_matches_type_scope_granularity_and_limits() {
        let c = caps();
        assert!(c.supports("f16", 128, 128, 32, 128));
        assert!(!c.supports("bf16", 128, 128, 32, 128), "no bf16 entry");
        assert!(
            !c.supports("f16", 128, 128, 32, 256),
            "no 256-invocation entry"
        );
        assert!(
            !c.supports("f16", 120, 128, 32, 128),
            "M off the granularity"
        );
        assert!(
            !c.supports("f16", 512, 128, 32, 128),
            "beyond max_dimension"
        );
        let off = CooperativeMatrix2 {
            flexible_dimensions: false,
            ..c
        };
        assert!(!off.supports("f16", 128, 128, 32, 128));
    }
}
